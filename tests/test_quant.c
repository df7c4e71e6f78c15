/* test_quant.c - the row quantisers (src/quant) against lumen's reference
 * dequantisers and against llama.cpp's quantiser on the same rows.
 *
 * For every tensor llama.cpp's llama-quantize stored as type T in the
 * llama-g256 fixtures, lumen quantises the bf16 original to T too; both are
 * dequantised and their RMSE against the original compared. lumen must not
 * be more than 2 % worse than llama.cpp for any type (it is better for all
 * of them: its search minimises the error the test measures). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "lm_test.h"
#include "quant/lm_quant.h"
#include "test_util.h"

/* Sum of squared differences of quantising x (n values) to t and back. */
static double quant_sse(lm_dtype t, const float *x, int64_t n, float *y) {
    uint8_t *buf = malloc(lm_dtype_row_bytes(t, n));
    lm_quant_row(t, x, buf, n, NULL);
    lm_dequant_row(t, buf, y, n);
    free(buf);
    double e = 0;
    for (int64_t i = 0; i < n; i++) e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    return e;
}

/* A reproducible row: Gaussian-like values with a few outliers. */
static void make_row(float *x, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        float u = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
        seed = seed * 1664525u + 1013904223u;
        float v = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
        x[i] = (u + v) * 0.1f * (i % 97 == 5 ? 8.0f : 1.0f);
    }
}

/* Relative RMSE of each type on synthetic rows stays within what its bits
 * allow, and exactly representable rows come back exactly. */
LM_TEST(quant_round_trip_synthetic) {
    static const struct { lm_dtype t; double max_rel; } cases[] = {
        /* measured: 0.0083, 0.025, 0.044, 0.089, 0.134, 0.104, 0.0016, 0.0002 */
        { LM_Q8_0, 0.01 }, { LM_Q6_K, 0.03 }, { LM_Q5_K, 0.053 }, { LM_Q4_K, 0.107 },
        { LM_Q4_0, 0.16 }, { LM_IQ4_XS, 0.125 }, { LM_BF16, 0.002 }, { LM_F16, 0.0003 },
        /* measured: 0.086, 0.067, 0.040, 0.101 */
        { LM_Q4_1, 0.104 }, { LM_Q5_0, 0.081 }, { LM_Q5_1, 0.049 }, { LM_IQ4_NL, 0.122 },
    };
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *z = malloc(N * sizeof *z);
    make_row(x, N, 7);
    double ss = 0;
    for (int i = 0; i < N; i++) ss += (double)x[i] * x[i];
    for (size_t k = 0; k < LM_COUNT(cases); k++) {
        double rel = sqrt(quant_sse(cases[k].t, x, N, y) / ss);
        printf("  %-7s relative RMSE %.5f\n", lm_dtype_name(cases[k].t), rel);
        LM_CHECK_MSG(rel > 0 && rel < cases[k].max_rel, "%s: %g", lm_dtype_name(cases[k].t), rel);
        /* y is representable: quantising it again must give it back (nearly). */
        double again = quant_sse(cases[k].t, y, N, z), first = quant_sse(cases[k].t, x, N, z);
        printf("  %-7s requantised: %.2g of the first error\n", lm_dtype_name(cases[k].t), again / first);
        /* exact for all but Q5_K, whose trial scales miss a few sub-blocks (0.45 %) */
        LM_CHECK_MSG(again <= 0.01 * first, "%s: requantised error %g",
                     lm_dtype_name(cases[k].t), again);
    }
    /* Zero rows and rows of one constant are stored exactly. */
    memset(x, 0, N * sizeof *x);
    for (size_t k = 0; k < LM_COUNT(cases); k++) LM_CHECK(quant_sse(cases[k].t, x, 256, y) == 0);
    free(x);
    free(y);
    free(z);
}

/* The bf16 original of a tensor, as f32 (malloc'd). */
static float *tensor_f32(const lm_file_tensor *t) {
    int64_t n = lm_file_tensor_numel(t);
    float *x = malloc((size_t)n * sizeof *x);
    lm_dequant_row(t->type, t->data, x, n);
    return x;
}

LM_TEST(quant_rmse_against_llamacpp) {
    static const char *const files[] = { "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS" };
    static const lm_dtype types[] = { LM_Q8_0, LM_Q4_0, LM_Q4_K, LM_Q5_K, LM_Q6_K, LM_IQ4_XS };
    char *bf16_path = lm_test_fixture_path("gguf/llama-g256/model.bf16.gguf");
    if (!bf16_path) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    lm_gguf src;
    LM_REQUIRE(lm_gguf_open(&src, bf16_path, &e) == 0);
    double sse_l[LM_COUNT(types)] = { 0 }, sse_g[LM_COUNT(types)] = { 0 }, cnt[LM_COUNT(types)] = { 0 };
    for (size_t f = 0; f < LM_COUNT(files); f++) {
        char rel[128];
        snprintf(rel, sizeof rel, "gguf/llama-g256/model.%s.gguf", files[f]);
        char *path = lm_test_fixture_path(rel);
        lm_gguf q;
        LM_REQUIRE(path && lm_gguf_open(&q, path, &e) == 0);
        for (int i = 0; i < q.n_tensors; i++) {
            const lm_file_tensor *tq = &q.tensors[i], *to = lm_gguf_find_tensor(&src, tq->name);
            size_t k = 0;
            while (k < LM_COUNT(types) && types[k] != tq->type) k++;
            if (k == LM_COUNT(types) || !to) continue;
            int64_t n = lm_file_tensor_numel(to);
            float *x = tensor_f32(to), *yg = malloc((size_t)n * sizeof *yg), *yl = malloc((size_t)n * sizeof *yl);
            lm_dequant_row(tq->type, tq->data, yg, n);
            sse_l[k] += quant_sse(tq->type, x, n, yl);
            for (int64_t j = 0; j < n; j++) sse_g[k] += ((double)x[j] - yg[j]) * ((double)x[j] - yg[j]);
            cnt[k] += (double)n;
            free(x);
            free(yg);
            free(yl);
        }
        lm_gguf_close(&q);
        free(path);
    }
    printf("  type     values   RMSE lumen   RMSE llama.cpp   ratio\n");
    for (size_t k = 0; k < LM_COUNT(types); k++) {
        LM_REQUIRE(cnt[k] > 0);
        double rl = sqrt(sse_l[k] / cnt[k]), rg = sqrt(sse_g[k] / cnt[k]);
        printf("  %-7s %8.0f   %.6f     %.6f         %.3f\n", lm_dtype_name(types[k]), cnt[k], rl, rg, rl / rg);
        LM_CHECK_MSG(rl <= 1.02 * rg, "%s: lumen RMSE %g vs llama.cpp %g", lm_dtype_name(types[k]), rl, rg);
    }
    lm_gguf_close(&src);
    free(bf16_path);
}

/* The 32-value types the fixtures do not hold (Q4_1, Q5_0, Q5_1): lumen's
 * fit is better than the plain formulas of ggml's reference quantisers
 * (Q4_1 / Q5_1: d = (max - min) / nmax, m = min; Q5_0: d = the largest
 * magnitude, signed, / -16), each rounded as f16 and applied with
 * round-to-nearest, on the same rows. */
static double plain_sse(lm_dtype t, const float *x, int64_t n) {
    double e = 0;
    for (int64_t b = 0; b < n; b += 32) {
        const float *v = x + b;
        float lo = v[0], hi = v[0], amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            lo = fminf(lo, v[j]), hi = fmaxf(hi, v[j]);
            if (fabsf(v[j]) > amax) amax = fabsf(v[j]), max = v[j];
        }
        bool affine = t != LM_Q5_0;
        int nmax = t == LM_Q4_1 ? 15 : 31;
        float d = lm_f16_to_f32(lm_f32_to_f16(affine ? (hi - lo) / (float)nmax : max / -16.0f));
        float m = affine ? lm_f16_to_f32(lm_f32_to_f16(lo)) : 0;
        for (int j = 0; j < 32; j++) {
            float q = d != 0 ? nearbyintf((v[j] - m) / d) : 0;
            if (affine) q = fminf(fmaxf(q, 0), (float)nmax);
            else q = fminf(fmaxf(q, -16), 15);
            double r = (double)d * q + m - v[j];
            e += r * r;
        }
    }
    return e;
}

LM_TEST(quant_legacy_beats_plain_formulas) {
    static const lm_dtype types[] = { LM_Q4_1, LM_Q5_0, LM_Q5_1 };
    enum { N = 8192 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    for (int shifted = 0; shifted < 2; shifted++) {
        make_row(x, N, 11);
        if (shifted) { /* blocks of positive values only: their minimum is above 0 */
            for (int i = 0; i < N; i++) x[i] = fabsf(x[i]) + 0.5f;
        }
        for (size_t k = 0; k < LM_COUNT(types); k++) {
            double ours = quant_sse(types[k], x, N, y), plain = plain_sse(types[k], x, N);
            printf("  %-6s%s RMSE lumen %.6f, plain formula %.6f\n", lm_dtype_name(types[k]),
                   shifted ? " (positive)" : "", sqrt(ours / N), sqrt(plain / N));
            LM_CHECK_MSG(ours < plain, "%s: %g >= %g", lm_dtype_name(types[k]), ours, plain);
        }
    }
    free(x);
    free(y);
}
