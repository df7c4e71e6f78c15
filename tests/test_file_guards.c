/* test_file_guards.c - model files that change or cannot be read are clear
 * errors (issue #28): a mapped file truncated underneath (SIGBUS) and a
 * chat template that is there but unreadable. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/lm_file.h"
#include "lm_test.h"
#include "test_util.h"
#include "tokenizer/lm_tokenizer.h"

/* A child reads a mapped file after it was truncated: it exits 1 with a
 * message that names the file, not by SIGBUS. */
LM_TEST(mmap_truncated_file_is_a_clear_error) {
    char path[512], logp[512];
    snprintf(path, sizeof path, "%s/shrinks.bin", lm_test_tmpdir());
    snprintf(logp, sizeof logp, "%s/shrinks.log", lm_test_tmpdir());
    FILE *f = fopen(path, "wb");
    LM_REQUIRE(f != NULL);
    static char page[1 << 16];
    memset(page, 7, sizeof page);
    LM_REQUIRE(fwrite(page, 1, sizeof page, f) == sizeof page);
    fclose(f);
    lm_mmap m;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_mmap_open(&m, path, &e) == 0);
    LM_REQUIRE(truncate(path, 0) == 0);
    fflush(NULL);
    pid_t pid = fork();
    LM_REQUIRE(pid >= 0);
    if (pid == 0) {
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) dup2(fd, 2);
        volatile const char *p = (const char *)m.data;
        _exit(p[sizeof page / 2] == 7 ? 0 : 3); /* faults: the page is gone */
    }
    int st = 0;
    LM_REQUIRE(waitpid(pid, &st, 0) == pid);
    char *log = lm_tu_read(logp, NULL);
    LM_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 1, "child %s %d", WIFEXITED(st) ? "exited" : "killed by signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    LM_CHECK_MSG(log && strstr(log, "shrinks.bin changed while lumen was using it"), "stderr: %s", log ? log : "");
    free(log);
    lm_mmap_close(&m);
    unlink(path);
    unlink(logp);
}

/* A chat_template.jinja that exists but cannot be read fails the load with
 * its reason; the model does not quietly lose its template. */
LM_TEST(tokenizer_unreadable_chat_template_is_an_error) {
    char *src = lm_test_fixture_path("models/qwen3");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    char dir[512], cmd[4096];
    snprintf(dir, sizeof dir, "%s/tpl-unreadable", lm_test_tmpdir());
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/chat_template.jinja' && cp '%s/tokenizer.json' '%s/' && "
             "cp '%s/tokenizer_config.json' '%s/'", dir, dir, src, dir, src, dir);
    free(src);
    LM_REQUIRE(system(cmd) == 0);
    lm_tokenizer *t = NULL;
    lm_err e = { { 0 } };
    int rc = lm_tokenizer_load(&t, dir, &e);
    LM_CHECK_MSG(rc != 0 && strstr(e.msg, "chat_template.jinja") && strstr(e.msg, "cannot read"), "rc %d: %s", rc, e.msg);
    lm_tokenizer_free(t);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    LM_CHECK(system(cmd) == 0);
}
