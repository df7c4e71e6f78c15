/* test_util.h - helpers shared by tests: files, commands, safetensors writing. */
#ifndef LM_TEST_UTIL_H
#define LM_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Writes bytes to path; returns 0 on success. */
int lm_tu_write(const char *path, const void *data, size_t n);
/* Reads a whole file (malloc'd), or NULL. */
char *lm_tu_read(const char *path, size_t *n);
/* Runs a shell command; stdout and stderr go to malloc'd strings (may be NULL
 * args). Returns the exit status, or -1 if it did not exit normally. */
int lm_tu_run(const char *cmd, char **out, char **err);
/* A new directory under the test tmpdir, named after tag (malloc'd path). */
char *lm_tu_mkdir(const char *tag);

#endif
