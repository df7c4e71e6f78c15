/* convert_check.c - a conversion against llama.cpp's file (convert_check.h). */
#include "convert_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/lm_convert.h"
#include "format/gguf.h"
#include "quant/lm_quant.h"

/* Each quantiser's value is within about half its own step of the weight,
 * and lumen's scale search may take a scale a little larger than amax /
 * 127: measured 1.13 steps apart at most; an expert stacked out of place
 * would be tens of steps off. */
#define QS_STEPS 2.0

/* Whether kv (of file a) has the same type and value as kv b. */
static bool same_kv(const lm_gguf_kv *a, const lm_gguf_kv *b) {
    if (a->type != b->type) return false;
    if (a->type == LM_GGUF_STRING) return a->str.len == b->str.len && !memcmp(a->str.ptr, b->str.ptr, a->str.len);
    if (a->type == LM_GGUF_ARRAY) {
        if (a->arr_type != b->arr_type || a->arr_count != b->arr_count) return false;
        if (a->arr_type == LM_GGUF_STRING) {
            for (uint64_t i = 0; i < a->arr_count; i++)
                if (a->arr_strs[i].len != b->arr_strs[i].len ||
                    memcmp(a->arr_strs[i].ptr, b->arr_strs[i].ptr, a->arr_strs[i].len))
                    return false;
            return true;
        }
        return !memcmp(a->arr_data, b->arr_data, a->arr_count * (uint64_t)lm_gguf_scalar_bytes(a->arr_type));
    }
    return !memcmp(&a->v, &b->v, sizeof a->v);
}

/* Whether key is one of skip (NULL-terminated; skip may be NULL). */
static bool skipped(const char *key, const char *const *skip) {
    for (int i = 0; skip && skip[i]; i++)
        if (!strcmp(key, skip[i])) return true;
    return false;
}

static int count_kv(const lm_gguf *g, const char *const *skip) {
    int n = 0;
    for (int i = 0; i < g->n_kv; i++) n += !skipped(g->kv[i].key, skip);
    return n;
}

void lm_cc_compare(lm_test_ctx *lm_t_, const char *label, const char *ours, const char *theirs, int want_stacks,
                   const char *const *skip_keys) {
    lm_err e = { { 0 } };
    lm_gguf a = { 0 }, b = { 0 };
    if (lm_gguf_open(&a, ours, &e) || lm_gguf_open(&b, theirs, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        goto done;
    }
    const int na = count_kv(&a, skip_keys), nb = count_kv(&b, skip_keys);
    LM_CHECK_MSG(na == nb, "%d keys against llama.cpp's %d", na, nb);
    for (int i = 0; i < a.n_kv; i++) {
        if (skipped(a.kv[i].key, skip_keys)) continue;
        const lm_gguf_kv *kb = lm_gguf_find_kv(&b, a.kv[i].key);
        LM_CHECK_MSG(kb && same_kv(&a.kv[i], kb), "key %s: %s", a.kv[i].key, kb ? "another value" : "not in llama.cpp's");
    }
    LM_CHECK_MSG(a.n_tensors == b.n_tensors, "%d tensors against llama.cpp's %d", a.n_tensors, b.n_tensors);
    int stacks = 0;
    double steps = 0; /* the largest difference from llama.cpp's values, in its Q8_0 steps */
    for (int i = 0; i < a.n_tensors; i++) {
        const lm_file_tensor *ta = &a.tensors[i], *tb = lm_gguf_find_tensor(&b, ta->name);
        if (!tb) {
            LM_CHECK_MSG(0, "%s: not in llama.cpp's file", ta->name);
            continue;
        }
        bool shape = ta->n_dims == tb->n_dims;
        for (int d = 0; shape && d < ta->n_dims; d++) shape = ta->shape[d] == tb->shape[d];
        LM_CHECK_MSG(ta->type == tb->type && shape, "%s: type %s / %s, or another shape", ta->name, ta->type_name,
                     tb->type_name);
        if (ta->type != tb->type || !shape) continue;
        stacks += ta->n_dims == 3;
        if (ta->type == LM_F32) { /* bit for bit; ssm_a (-exp(A_log)) within an ulp: torch's f32 exp is not
                                    * correctly rounded, lumen's (in double) is, and they differ in one value */
            const bool decay = strstr(ta->name, "ssm_a") != NULL;
            int64_t off = 0;
            for (size_t k = 0; ta->nbytes == tb->nbytes && k < ta->nbytes / 4; k++) {
                int32_t x, y;
                memcpy(&x, ta->data + 4 * k, 4), memcpy(&y, tb->data + 4 * k, 4);
                off += x != y && !(decay && (x - y == 1 || y - x == 1));
            }
            LM_CHECK_MSG(ta->nbytes == tb->nbytes && off == 0, "%s: %lld f32 values differ", ta->name, (long long)off);
            continue;
        }
        if (!lm_dtype_is_quant(ta->type)) { /* bf16 / f16: the same rounding of the same weights */
            LM_CHECK_MSG(ta->nbytes == tb->nbytes && !memcmp(ta->data, tb->data, ta->nbytes), "%s: %s values differ",
                         ta->name, ta->type_name);
            continue;
        }
        /* quantised: each value within QS_STEPS steps of its block in llama.cpp's file */
        const int64_t n = lm_file_tensor_numel(ta);
        float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
        lm_dequant_row(ta->type, ta->data, x, n);
        lm_dequant_row(tb->type, tb->data, y, n);
        for (int64_t k0 = 0; k0 < n; k0 += 32) {
            float amax = 0;
            for (int64_t k = k0; k < k0 + 32 && k < n; k++) amax = fmaxf(amax, fabsf(y[k]));
            for (int64_t k = k0; amax > 0 && k < k0 + 32 && k < n; k++)
                steps = fmax(steps, fabsf(x[k] - y[k]) / (amax / 127.0f));
        }
        free(x), free(y);
    }
    printf("  %s: %d keys, %d tensors (%d expert stacks) as %s; quantised values within %.2f of its steps\n", label,
           na, a.n_tensors, stacks, theirs + (strrchr(theirs, '/') ? strrchr(theirs, '/') - theirs + 1 : 0), steps);
    LM_CHECK(stacks == want_stacks && steps <= QS_STEPS);
done:
    lm_gguf_close(&a);
    lm_gguf_close(&b);
}

void lm_cc_same_as_llamacpp_file(lm_test_ctx *lm_t_, const char *name, const char *mix, const char *file,
                                 int want_stacks) {
    char rel[128], theirs[1024], out[1024];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    snprintf(out, sizeof out, "%s/conv-%s.%s.gguf", lm_test_tmpdir(), name, mix);
    snprintf(theirs, sizeof theirs, "%s/tests/data/gguf/%s/%s", LUMEN_SOURCE_DIR, name, file);
    lm_err e = { { 0 } };
    lm_quantize_report rep;
    if (lm_convert_hf(dir, out, lm_quant_mix_find(mix), 2, &rep, &e)) LM_CHECK_MSG(0, "%s", e.msg);
    else lm_cc_compare(lm_t_, name, out, theirs, want_stacks, NULL);
    free(dir);
}
