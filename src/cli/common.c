/* common.c - option parsing shared by the subcommands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char *lm_cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "lumen: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool lm_cli_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool lm_cli_float(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

int lm_cli_common(lm_common_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
        const char *v = lm_cli_value(argc, argv, i);
        long n;
        if (!v || !lm_cli_int(v, 0, 1024, &n)) {
            fprintf(stderr, "lumen: --threads needs a number from 0 to 1024\n");
            return -1;
        }
        o->threads = (int)n;
        return 1;
    }
    if (!strcmp(a, "--isa")) {
        const char *v = lm_cli_value(argc, argv, i);
        if (!v) return -1;
        if (!strcmp(v, "auto")) o->isa = LM_ISA_AUTO;
        else if (!strcmp(v, "scalar")) o->isa = LM_ISA_SCALAR;
        else if (!strcmp(v, "avx2")) o->isa = LM_ISA_AVX2;
        else if (!strcmp(v, "avx512")) o->isa = LM_ISA_AVX512;
        else {
            fprintf(stderr, "lumen: --isa must be auto, scalar, avx2 or avx512\n");
            return -1;
        }
        return 1;
    }
    return 0;
}

lm_backend *lm_cli_backend(const lm_common_opts *o) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(o->threads, o->isa, &e);
    if (!be) fprintf(stderr, "lumen: %s\n", e.msg);
    return be;
}

const char *lm_cli_default_model(void) {
    const char *env = getenv("LUMEN_MODEL");
    const char *path = env && *env ? env : LUMEN_DEFAULT_MODEL;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    FILE *f = fopen(cfg, "r");
    if (!f) {
        fprintf(stderr, "lumen: no -m MODEL given and the default model %s is missing\n", path);
        return NULL;
    }
    fclose(f);
    return path;
}
