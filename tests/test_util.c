/* test_util.c - see test_util.h. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "lm_test.h"

int lm_tu_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

char *lm_tu_read(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len < cap) break;
        buf = realloc(buf, (cap *= 2) + 1);
    }
    fclose(f);
    buf[len] = 0;
    if (n) *n = len;
    return buf;
}

int lm_tu_run(const char *cmd, char **out, char **err) {
    static int counter;
    char o[512], e[512], full[8192];
    snprintf(o, sizeof o, "%s/cmd%d.out", lm_test_tmpdir(), counter);
    snprintf(e, sizeof e, "%s/cmd%d.err", lm_test_tmpdir(), counter++);
    snprintf(full, sizeof full, "( %s ) >'%s' 2>'%s' </dev/null", cmd, o, e);
    int st = system(full);
    if (out) *out = lm_tu_read(o, NULL);
    if (err) *err = lm_tu_read(e, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *lm_tu_mkdir(const char *tag) {
    static int counter;
    size_t n = strlen(lm_test_tmpdir()) + strlen(tag) + 32;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s-%d", lm_test_tmpdir(), tag, counter++);
    mkdir(p, 0755);
    return p;
}

void lm_tu_parity(lm_test_ctx *lm_t_, const char *dir, lm_cpu_isa isa, int threads, int n_prompts,
                  lm_parity_result *out) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(threads, isa, &e);
    if (!be) LM_SKIP("%s backend unavailable here: %s", lm_cpu_isa_name(isa), e.msg);
    lm_parity_result res;
    int rc = lm_parity_run(dir, be, 1e-3, &res, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc == 0) {
        char *js = lm_parity_json(dir, be, &res);
        printf("  %s\n", js);
        free(js);
        LM_CHECK(res.n_prompts == n_prompts);
        LM_CHECK(res.max_abs_err <= 1e-3);
        LM_CHECK(res.cache_vs_full <= 1e-4);
        for (int i = 0; i < res.n_prompts; i++) {
            LM_CHECK(res.prompts[i].greedy_mismatch == 0);
            LM_CHECK(res.prompts[i].greedy_steps == 24);
            /* the check must have teeth: most steps have a comfortable margin */
            LM_CHECK(res.prompts[i].greedy_checked >= 12);
        }
        LM_CHECK(res.ok);
        if (out) *out = res;
    }
    lm_backend_destroy(be);
}

void lm_tu_parity_fixture(lm_test_ctx *lm_t_, const char *name, lm_cpu_isa isa, int threads) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("../shared/fixtures not found (set LUMEN_FIXTURES)");
    lm_tu_parity(lm_t_, dir, isa, threads, 3, NULL);
    free(dir);
}
