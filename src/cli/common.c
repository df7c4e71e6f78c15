/* common.c - option parsing shared by the subcommands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/lm_model.h"
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

/* A byte size: a whole number with an optional suffix K, M, G or T (powers
 * of 1024, then an optional 'B' or 'iB', any case): "0", "512M", "4G",
 * "1536KiB". False for anything else, a fraction, or more than 2^60 bytes. */
bool lm_cli_size(const char *s, size_t *out) {
    char *end;
    if (*s < '0' || *s > '9') return false; /* no sign, no space */
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return false;
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end || v > (1ull << (60 - shift))) return false;
    *out = (size_t)(v << shift);
    return true;
}

int lm_cli_sampling(lm_sampler_params *p, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    long n;
    double f;
    if (!strcmp(a, "--temp")) {
        if (!(v = lm_cli_value(argc, argv, i)) || !lm_cli_float(v, &f) || f < 0) goto bad;
        p->temperature = (float)f;
    } else if (!strcmp(a, "--top-k")) {
        if (!(v = lm_cli_value(argc, argv, i)) || !lm_cli_int(v, 0, 1 << 24, &n)) goto bad;
        p->top_k = (int)n;
    } else if (!strcmp(a, "--top-p")) {
        if (!(v = lm_cli_value(argc, argv, i)) || !lm_cli_float(v, &f) || f <= 0 || f > 1) goto bad;
        p->top_p = (float)f;
    } else if (!strcmp(a, "--min-p")) {
        if (!(v = lm_cli_value(argc, argv, i)) || !lm_cli_float(v, &f) || f < 0 || f > 1) goto bad;
        p->min_p = (float)f;
    } else if (!strcmp(a, "--seed")) {
        if (!(v = lm_cli_value(argc, argv, i)) || !lm_cli_int(v, 0, INT64_MAX, &n)) goto bad;
        p->seed = (uint64_t)n;
    } else {
        return 0;
    }
    return 1;
bad:
    fprintf(stderr, "lumen: bad value for %s (--temp >= 0, --top-k >= 0, --top-p in (0, 1], --min-p in [0, 1], "
                    "--seed >= 0)\n", a);
    return -1;
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
    if (!strcmp(a, "--gpu-memory")) {
        const char *v = lm_cli_value(argc, argv, i);
        if (!v) return -1;
        if (!lm_cli_size(v, &o->gpu_memory) || o->gpu_memory == 0) {
            fprintf(stderr, "lumen: --gpu-memory '%s' is not a size: give bytes or a whole number with K, M, G or T "
                            "(e.g. 20G)\n", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--device")) {
        const char *v = lm_cli_value(argc, argv, i);
        long n = 0;
        if (!v) return -1;
        if (!strcmp(v, "auto")) o->device = LM_DEVICE_AUTO;
        else if (!strcmp(v, "cpu")) o->device = LM_DEVICE_CPU;
        else if (!strcmp(v, "cuda")) o->device = LM_DEVICE_CUDA, o->gpu = 0;
        else if (!strncmp(v, "cuda:", 5) && lm_cli_int(v + 5, 0, 1023, &n)) o->device = LM_DEVICE_CUDA, o->gpu = (int)n;
        else {
            fprintf(stderr, "lumen: --device must be auto, cpu, cuda or cuda:N\n");
            return -1;
        }
        return 1;
    }
    return 0;
}

static lm_backend *cpu_backend(const lm_common_opts *o) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(o->threads, o->isa, &e);
    if (!be) fprintf(stderr, "lumen: %s\n", e.msg);
    return be;
}

static lm_backend *choose_backend(const lm_common_opts *o, lm_source *model);

/* LUMEN_PROFILE=1 wraps the chosen backend in the op profiler. */
lm_backend *lm_cli_backend_for(const lm_common_opts *o, lm_source *model) {
    lm_backend *be = choose_backend(o, model);
    const char *prof = getenv("LUMEN_PROFILE");
    return be && prof && *prof && strcmp(prof, "0") ? lm_backend_profiled(be) : be;
}

static lm_backend *choose_backend(const lm_common_opts *o, lm_source *model) {
    lm_err e = { { 0 } };
    if (o->device == LM_DEVICE_CPU) return cpu_backend(o);
    if (o->device == LM_DEVICE_CUDA) {
        lm_backend *be = lm_cuda_backend_create(o->gpu, &e);
        if (!be) fprintf(stderr, "lumen: --device cuda: %s\n", e.msg);
        else if (o->gpu_memory) lm_backend_set_memory_limit(be, o->gpu_memory);
        return be;
    }
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) return cpu_backend(o);
    lm_backend *be = lm_cuda_backend_create(0, &e);
    if (!be) {
        fprintf(stderr, "lumen: GPU present but not usable (%s); running on the CPU\n", e.msg);
        return cpu_backend(o);
    }
    if (o->gpu_memory) lm_backend_set_memory_limit(be, o->gpu_memory);
    /* the loader's measure (a model it would refuse runs on the CPU); a
     * model that cannot be opened is left for the load to report. The
     * weight table stays open in the source for that load. */
    size_t free_b, total_b, need = 0;
    lm_err ignored = { { 0 } };
    if (model && lm_model_tensor_bytes(model, &need, &ignored)) need = 0;
    lm_backend_mem_info(be, &free_b, &total_b);
    if (need > 0 && !lm_model_fits(need, free_b)) {
        fprintf(stderr, "lumen: the model's %.1f GiB of weights do not fit in the GPU's %.1f GiB free; running on the CPU\n",
                need / 1073741824.0, free_b / 1073741824.0);
        lm_backend_destroy(be);
        return cpu_backend(o);
    }
    return be;
}

lm_backend *lm_cli_backend(const lm_common_opts *o) { return lm_cli_backend_for(o, NULL); }

lm_source *lm_cli_open_model(const char *path) {
    lm_err e = { { 0 } };
    lm_source *src;
    if (lm_source_open(&src, path, &e)) {
        fprintf(stderr, "lumen: %s\n", e.msg);
        return NULL;
    }
    return src;
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
