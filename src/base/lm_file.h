/* lm_file.h - read-only memory-mapped files and small whole-file reads. */
#ifndef LM_FILE_H
#define LM_FILE_H

#include "lm_base.h"

typedef struct lm_mmap {
    const uint8_t *data; /* NULL for an empty file */
    size_t size;
    char *path;
} lm_mmap;

/* Maps path read-only. On failure fills e with "PATH: reason" and returns -1. */
int lm_mmap_open(lm_mmap *m, const char *path, lm_err *e);
void lm_mmap_close(lm_mmap *m);
/* A mapping of path registered with the SIGBUS guard (mmap_guard.c): a
 * fault in it, the file having shrunk underneath, exits with a message
 * naming the file. lm_mmap_open and lm_mmap_close do this themselves. */
void lm_mmap_guard_add(const void *addr, size_t size, const char *path);
void lm_mmap_guard_remove(const void *addr);

/* Reads a whole (small) file into a NUL-terminated buffer; *len excludes the NUL. */
char *lm_read_file(const char *path, size_t *len, lm_err *e);

bool lm_file_exists(const char *path);
bool lm_is_dir(const char *path);

/* Joins dir and name with one '/', into a new string. */
char *lm_path_join(const char *dir, const char *name);

#endif
