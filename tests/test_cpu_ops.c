/* test_cpu_ops.c - every CPU backend op, on every ISA this machine has,
 * against plain double-precision references written here.
 *
 * Each op test runs once per ISA (scalar, avx2, avx512; LM_SKIP with the
 * reason where the CPU lacks one) and for 1, 2 and 3 threads (3 is more
 * than this machine's cores: late workers are part of the test). Shapes are
 * odd on purpose: widths that are not multiples of 8/16/32, T = 1, 3, 13, 17,
 * 65 (GEMV and GEMM paths) and 300 (several GEMM token blocks), inner sizes
 * that straddle the k-slices of every ISA (256, 512, 1024). Weights of every dtype are built
 * from random values (quant blocks: random bits with sane scales); the
 * reference widens them with lm_dequant_row, which is exact, so what is
 * tested is the arithmetic.
 *
 * Tolerances, stated per op:
 *   matmul     |y - ref| <= 1e-5 * sum_i |x_i w_i| + 1e-6  (f32 accumulation;
 *              the bound scales with the condition of each dot product)
 *   rms_norm, rope, silu_mul: 1e-6 relative (computed in double or exact f32)
 *   add, scale, get_rows, gather_rows, kv_write: exact
 *   attention  2e-6 absolute plus 1e-5 relative on outputs of size ~1 */
#include "lm_test.h"

#include "backend/lm_backend.h"
#include "backend/cpu/cpu_pool.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------- */

/* Deterministic pseudo-random floats in [-1, 1). */
static float co_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static uint32_t co_rnd_u32(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 32);
}

static void co_put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static const lm_cpu_isa co_isas[] = { LM_ISA_SCALAR, LM_ISA_AVX2, LM_ISA_AVX512 };
static const int co_threads[] = { 1, 2, 3 };

/* Creates a backend or explains why not; the caller LM_SKIPs on NULL. */
static lm_backend *co_backend(lm_cpu_isa isa, int n_threads, char *why, size_t why_n) {
    if (isa > lm_cpu_isa_detect()) {
        snprintf(why, why_n, "this CPU lacks %s (best: %s)", lm_cpu_isa_name(isa),
                 lm_cpu_isa_name(lm_cpu_isa_detect()));
        return NULL;
    }
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(n_threads, isa, &e);
    if (!be) snprintf(why, why_n, "backend creation failed: %.200s", e.msg);
    return be;
}

static lm_tensor co_host(float *data, int64_t rows, int64_t cols) {
    return (lm_tensor){ .type = LM_F32, .rows = rows, .cols = cols, .data = data };
}

static float *co_randv(uint64_t *s, int64_t n, float amp) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = amp * co_rnd(s);
    return v;
}

/* Random weight [O][I] of type t; *deq gets its exact f32 widening. */
static void *co_weight(lm_dtype t, int64_t O, int64_t I, uint64_t *s, float **deq) {
    size_t rb = lm_dtype_row_bytes(t, I);
    uint8_t *w = malloc(rb * (size_t)O + 1);
    if (t == LM_F32 || t == LM_F16 || t == LM_BF16) {
        for (int64_t i = 0; i < O * I; i++) {
            float v = co_rnd(s);
            if (t == LM_F32) memcpy(w + i * 4, &v, 4);
            else co_put16(w + i * 2, t == LM_F16 ? lm_f32_to_f16(v) : lm_f32_to_bf16(v));
        }
    } else {
        for (size_t i = 0; i < rb * (size_t)O; i++) w[i] = (uint8_t)co_rnd_u32(s);
        /* Random bits are valid quants except the f16 scales: make those sane. */
        int bb = lm_dtype_block_bytes(t);
        for (size_t b = 0; b < rb * (size_t)O / (size_t)bb; b++) {
            uint8_t *blk = w + b * (size_t)bb;
            float r = 0.5f + 0.5f * co_rnd(s);
            switch (t) {
            case LM_Q8_0: co_put16(blk, lm_f32_to_f16(0.01f * r)); break;
            case LM_Q4_0: co_put16(blk, lm_f32_to_f16(0.1f * r)); break;
            case LM_Q4_K:
            case LM_Q5_K:
                co_put16(blk, lm_f32_to_f16(0.002f * r));
                co_put16(blk + 2, lm_f32_to_f16(0.001f * r));
                break;
            case LM_Q6_K: co_put16(blk + 208, lm_f32_to_f16(0.0003f * r)); break;
            case LM_IQ4_XS: co_put16(blk, lm_f32_to_f16(0.0003f * r)); break;
            case LM_Q4_1:
            case LM_Q5_1:
                co_put16(blk, lm_f32_to_f16(0.05f * r));
                co_put16(blk + 2, lm_f32_to_f16(-0.4f * r));
                break;
            case LM_Q5_0: co_put16(blk, lm_f32_to_f16(0.05f * r)); break;
            case LM_IQ4_NL: co_put16(blk, lm_f32_to_f16(0.003f * r)); break;
            case LM_Q2_K:
                co_put16(blk + 80, lm_f32_to_f16(0.02f * r));
                co_put16(blk + 82, lm_f32_to_f16(0.01f * r));
                break;
            case LM_Q3_K: co_put16(blk + 108, lm_f32_to_f16(0.005f * r)); break;
            case LM_FP8_B128: {
                float d = 0.002f * r;
                memcpy(blk, &d, 4);
                for (int j = 4; j < bb; j++)
                    if ((blk[j] & 0x7f) == 0x7f) blk[j] = 0; /* the e4m3 NaN codes */
                break;
            }
            case LM_A4_BF16:
            case LM_A8_BF16:
                co_put16(blk, lm_f32_to_bf16((t == LM_A4_BF16 ? 0.01f : 0.001f) * r));
                co_put16(blk + 2, lm_f32_to_bf16(-0.1f * r));
                break;
            case LM_A4_F16:
            case LM_A8_F16:
                co_put16(blk, lm_f32_to_f16((t == LM_A4_F16 ? 0.01f : 0.001f) * r));
                co_put16(blk + 2, lm_f32_to_f16(-0.1f * r));
                break;
            default: break;
            }
        }
    }
    *deq = malloc((size_t)LM_MAX(O * I, 1) * sizeof **deq);
    for (int64_t o = 0; o < O; o++) lm_dequant_row(t, w + (size_t)o * rb, *deq + o * I, I);
    return w;
}

/* ---- matmul -------------------------------------------------------------- */

typedef struct co_shape {
    int T, O, I;
} co_shape;

static const co_shape co_plain_shapes[] = {
    { 1, 37, 17 }, { 3, 70, 300 },  { 17, 57, 531 }, { 65, 300, 100 },
    { 300, 40, 64 }, { 5, 1, 1 }, { 13, 33, 300 }, { 17, 40, 1100 },
};
static const co_shape co_q32_shapes[] = { { 1, 37, 32 }, { 3, 70, 288 }, { 17, 50, 544 }, { 65, 45, 96 } };
static const co_shape co_qk_shapes[] = {
    { 1, 37, 256 }, { 3, 21, 768 }, { 17, 57, 512 }, { 65, 40, 256 }, { 17, 21, 1280 },
};

static int co_matmul_case(lm_backend *be, lm_dtype t, co_shape sh, bool with_bias, uint64_t *s) {
    const int T = sh.T, O = sh.O, I = sh.I;
    float *deq;
    void *wd = co_weight(t, O, I, s, &deq);
    float *x = co_randv(s, (int64_t)T * I, 1.0f), *bias = co_randv(s, O, 1.0f);
    float *y = malloc((size_t)T * O * sizeof *y);
    for (int64_t i = 0; i < (int64_t)T * O; i++) y[i] = NAN; /* every output must be written */
    lm_tensor w = { .type = t, .rows = O, .cols = I };
    lm_err e = { { 0 } };
    int bad = 0;
    if (be->ops->upload_weight(be, &w, wd, &e)) {
        fprintf(stderr, "  upload: %s\n", e.msg);
        bad++;
    } else {
        lm_tensor xt = co_host(x, T, I), yt = co_host(y, T, O), bt = co_host(bias, 1, O);
        be->ops->matmul(be, &yt, &xt, &w, with_bias ? &bt : NULL);
        for (int tt = 0; tt < T; tt++)
            for (int o = 0; o < O; o++) {
                double ref = with_bias ? bias[o] : 0.0, mag = 0.0;
                for (int i = 0; i < I; i++) {
                    double p = (double)x[tt * I + i] * deq[(int64_t)o * I + i];
                    ref += p;
                    mag += fabs(p);
                }
                double got = y[(int64_t)tt * O + o];
                if (!(fabs(got - ref) <= 1e-5 * mag + 1e-6)) {
                    if (bad++ < 3)
                        fprintf(stderr, "  matmul %s T=%d O=%d I=%d bias=%d: y[%d][%d] = %.9g, ref %.9g\n",
                                lm_dtype_name(t), T, O, I, with_bias, tt, o, got, ref);
                }
            }
    }
    free(wd);
    free(deq);
    free(x);
    free(bias);
    free(y);
    return bad;
}

static void co_matmul(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    uint64_t s = 42;
    char why[256];
    for (size_t ti = 0; ti < LM_COUNT(co_threads); ti++) {
        lm_backend *be = co_backend(isa, co_threads[ti], why, sizeof why);
        if (!be) LM_SKIP("%s", why);
        /* the exact path; the int8 GEMV has its own test (test_cpu_qdot.c) */
        lm_cpu_backend_quant_exact(be, true);
        for (int t = 0; t < LM_I32; t++) {
            const co_shape *shapes = co_plain_shapes;
            size_t n = LM_COUNT(co_plain_shapes);
            if (lm_dtype_block((lm_dtype)t) == 32) shapes = co_q32_shapes, n = LM_COUNT(co_q32_shapes);
            if (lm_dtype_block((lm_dtype)t) > 32) shapes = co_qk_shapes, n = LM_COUNT(co_qk_shapes);
            for (size_t i = 0; i < n; i++) {
                int bad = co_matmul_case(be, (lm_dtype)t, shapes[i], (i + ti) % 2 == 0, &s);
                LM_CHECK_MSG(bad == 0, "%s threads=%d dtype=%s T=%d O=%d I=%d: %d outputs off",
                             lm_cpu_isa_name(isa), co_threads[ti], lm_dtype_name((lm_dtype)t),
                             shapes[i].T, shapes[i].O, shapes[i].I, bad);
            }
        }
        lm_backend_destroy(be);
    }
}

/* ---- rms_norm, rope, element-wise ----------------------------------------- */

static void co_rms_norm(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    uint64_t s = 7;
    char why[256];
    const int T = 17, H = 3, Dh = 37;
    for (size_t ti = 0; ti < LM_COUNT(co_threads); ti++) {
        lm_backend *be = co_backend(isa, co_threads[ti], why, sizeof why);
        if (!be) LM_SKIP("%s", why);
        for (int per_head = 0; per_head < 2; per_head++) {
            int n = per_head ? Dh : H * Dh; /* per-head rows, or whole rows */
            float off = per_head ? 1.0f : 0.0f, eps = 1e-5f;
            float *x = co_randv(&s, T * H * Dh, 3.0f), *w = co_randv(&s, n, 1.0f);
            float *y = malloc((size_t)T * H * Dh * sizeof *y);
            lm_tensor xt = co_host(x, T, H * Dh), yt = co_host(y, T, H * Dh), wt = co_host(w, 1, n);
            be->ops->rms_norm(be, &yt, &xt, &wt, eps, off);
            int bad = 0;
            for (int r = 0; r < T * H * Dh / n; r++) {
                double ss = 0;
                for (int i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
                double sc = 1.0 / sqrt(ss / n + eps);
                for (int i = 0; i < n; i++) {
                    double ref = x[r * n + i] * sc * ((double)w[i] + off);
                    if (!(fabs(y[r * n + i] - ref) <= 1e-6 * fmax(1.0, fabs(ref)))) bad++;
                }
            }
            LM_CHECK_MSG(bad == 0, "%s threads=%d per_head=%d: %d values off", lm_cpu_isa_name(isa),
                         co_threads[ti], per_head, bad);
            /* In place must work too (a row is reduced before it is written). */
            be->ops->rms_norm(be, &xt, &xt, &wt, eps, off);
            LM_CHECK(memcmp(x, y, (size_t)T * H * Dh * sizeof *y) == 0);
            free(x);
            free(w);
            free(y);
        }
        lm_backend_destroy(be);
    }
}

static void co_rope(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    uint64_t s = 9;
    char why[256];
    const int T = 65, H = 3, Dh = 24;
    int32_t pos[65];
    for (int t = 0; t < T; t++) pos[t] = t % 5 == 0 ? 4000 + t : t * 3;
    for (size_t ti = 0; ti < LM_COUNT(co_threads); ti++) {
        lm_backend *be = co_backend(isa, co_threads[ti], why, sizeof why);
        if (!be) LM_SKIP("%s", why);
        for (int mode = 0; mode < 4; mode++) {
            bool inter = mode & 1;
            int rot = (mode & 2) ? 16 : Dh; /* partial rotary */
            float inv[32];
            for (int i = 0; i < rot / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / rot);
            lm_rope_params p = { .n_heads = H, .head_dim = Dh, .rot_dim = rot, .interleaved = inter,
                                  .inv_freq = inv, .attn_factor = mode == 3 ? 0.7f : 1.0f };
            float *x = co_randv(&s, T * H * Dh, 1.0f), *x0 = malloc((size_t)T * H * Dh * sizeof *x0);
            memcpy(x0, x, (size_t)T * H * Dh * sizeof *x0);
            lm_tensor xt = co_host(x, T, H * Dh);
            be->ops->rope(be, &xt, pos, &p);
            int bad = 0;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    const float *a = x0 + (t * H + h) * Dh;
                    const float *g = x + (t * H + h) * Dh;
                    for (int d = 0; d < Dh; d++) {
                        double ref = a[d];
                        if (d < rot) {
                            int i = inter ? d / 2 : d % (rot / 2);
                            bool first = inter ? d % 2 == 0 : d < rot / 2;
                            int mate = inter ? (first ? d + 1 : d - 1) : (first ? d + rot / 2 : d - rot / 2);
                            /* the op's contract: the angle rounded to f32 as transformers does */
                            double ang = (double)((float)pos[t] * inv[i]);
                            double c = cos(ang) * p.attn_factor, sn = sin(ang) * p.attn_factor;
                            ref = first ? a[d] * c - a[mate] * sn : a[d] * c + a[mate] * sn;
                        }
                        if (!(fabs(g[d] - ref) <= 1e-6 * fmax(1.0, fabs(ref)))) bad++;
                    }
                }
            LM_CHECK_MSG(bad == 0, "%s threads=%d interleaved=%d rot=%d: %d values off",
                         lm_cpu_isa_name(isa), co_threads[ti], inter, rot, bad);
            free(x);
            free(x0);
        }
        lm_backend_destroy(be);
    }
}

static void co_elementwise(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    uint64_t s = 11;
    char why[256];
    for (size_t ti = 0; ti < LM_COUNT(co_threads); ti++) {
        lm_backend *be = co_backend(isa, co_threads[ti], why, sizeof why);
        if (!be) LM_SKIP("%s", why);
        /* 1 x 37 stays on the caller; 65 x 1001 goes through the pool. */
        const int shapes[2][2] = { { 1, 37 }, { 65, 1001 } };
        for (int k = 0; k < 2; k++) {
            int R = shapes[k][0], C = shapes[k][1], n = R * C;
            float *g = co_randv(&s, n, 12.0f), *u = co_randv(&s, n, 2.0f), *y = malloc((size_t)n * 4);
            lm_tensor gt = co_host(g, R, C), ut = co_host(u, R, C), yt = co_host(y, R, C);
            be->ops->silu_mul(be, &yt, &gt, &ut);
            int bad = 0;
            for (int i = 0; i < n; i++) {
                double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
                if (!(fabs(y[i] - ref) <= 1e-6 * fmax(1.0, fabs(ref)))) bad++;
            }
            LM_CHECK_MSG(bad == 0, "silu_mul %s threads=%d %dx%d: %d off", lm_cpu_isa_name(isa),
                         co_threads[ti], R, C, bad);
            memcpy(y, g, (size_t)n * 4);
            be->ops->add(be, &yt, &ut);
            bad = 0;
            for (int i = 0; i < n; i++) bad += y[i] != g[i] + u[i];
            be->ops->scale(be, &yt, -0.375f);
            for (int i = 0; i < n; i++) bad += y[i] != (g[i] + u[i]) * -0.375f;
            LM_CHECK_MSG(bad == 0, "add/scale %s threads=%d %dx%d: %d off", lm_cpu_isa_name(isa),
                         co_threads[ti], R, C, bad);
            free(g);
            free(u);
            free(y);
        }
        lm_backend_destroy(be);
    }
}

static void co_rows(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    uint64_t s = 13;
    char why[256];
    for (size_t ti = 0; ti < LM_COUNT(co_threads); ti++) {
        lm_backend *be = co_backend(isa, co_threads[ti], why, sizeof why);
        if (!be) LM_SKIP("%s", why);
        enum { N = 17, V = 50 };
        int32_t ids[N];
        for (int i = 0; i < N; i++) ids[i] = (int32_t)(co_rnd_u32(&s) % V);
        ids[0] = V - 1;
        for (int t = 0; t < LM_I32; t++) {
            int C = lm_dtype_is_quant((lm_dtype)t) ? 512 : 301;
            float *deq;
            void *tab = co_weight((lm_dtype)t, V, C, &s, &deq);
            lm_tensor tt = { .type = (lm_dtype)t, .rows = V, .cols = C };
            lm_err e;
            int rc = be->ops->upload_weight(be, &tt, tab, &e);
            LM_REQUIRE(rc == 0); /* LM_REQUIRE evaluates its argument twice */
            float *y = malloc((size_t)N * C * sizeof *y);
            lm_tensor yt = co_host(y, N, C);
            be->ops->get_rows(be, &yt, &tt, ids);
            int bad = 0;
            for (int i = 0; i < N; i++)
                bad += memcmp(y + (int64_t)i * C, deq + (int64_t)ids[i] * C, (size_t)C * 4) != 0;
            LM_CHECK_MSG(bad == 0, "get_rows %s threads=%d dtype=%s: %d rows differ",
                         lm_cpu_isa_name(isa), co_threads[ti], lm_dtype_name((lm_dtype)t), bad);
            /* gather_rows on the result: y2[i] = y[rows[i]] */
            int32_t rows[5] = { 16, 0, 3, 3, 9 };
            float *y2 = malloc((size_t)6 * C * sizeof *y2);
            lm_tensor y2t = co_host(y2, 6, C);
            be->ops->gather_rows(be, &y2t, &yt, rows, 5);
            for (int i = 0; i < 5; i++)
                LM_CHECK(memcmp(y2 + (int64_t)i * C, y + (int64_t)rows[i] * C, (size_t)C * 4) == 0);
            free(y2);
            free(y);
            free(tab);
            free(deq);
        }
        lm_backend_destroy(be);
    }
}

/* ---- kv_write + attention ----------------------------------------------------- */

typedef struct co_attn_cfg {
    int H, Hkv, Dh, window;
    float softcap, scale;
    int block_size;
} co_attn_cfg;

/* Three sequences of different lengths share one pool through shuffled
 * block tables. Their earlier positions are written first (a "history"
 * kv_write), then one batch mixes a decode token, a short continuation and a
 * long prefill chunk: kv_write + attention, checked against a reference that
 * reads the logical per-sequence K/V arrays directly. */
/* len[q]: total length of sequence q (MAXL at most); news[q]: how many of
 * its last positions are in the batch. out_copy: when not NULL, receives a
 * malloc'd copy of the output ([n][H][Dh]). */
static int co_attn_run(lm_backend *be, const co_attn_cfg *cf, uint64_t *s, const int len[3], const int news[3],
                       float **out_copy) {
    enum { S = 3, LAYERS = 2, LAYER = 1 };
    const int MAXL = LM_MAX(len[0], LM_MAX(len[1], len[2]));
    const int BS = cf->block_size;
    const int H = cf->H, Hkv = cf->Hkv, Dh = cf->Dh, KW = Hkv * Dh + 5; /* wider pool rows */
    int nb_seq[S], n_blocks = 0;
    for (int q = 0; q < S; q++) n_blocks += nb_seq[q] = (len[q] + BS - 1) / BS;
    n_blocks += 3; /* spare blocks nobody uses */
    int32_t *perm = malloc((size_t)n_blocks * sizeof *perm);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(co_rnd_u32(s) % (uint32_t)(i + 1));
        int32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    int32_t *tables[S];
    for (int q = 0, used = 0; q < S; q++) {
        tables[q] = malloc((size_t)nb_seq[q] * sizeof(int32_t));
        for (int i = 0; i < nb_seq[q]; i++) tables[q][i] = perm[used++];
    }
    lm_kv_pool kv = { .n_layers = LAYERS, .block_size = BS, .n_blocks = n_blocks, .kv_width = KW };
    void *kl[LAYERS], *vl[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        kl[l] = be->ops->alloc(be, (size_t)n_blocks * BS * KW * sizeof(float));
        vl[l] = be->ops->alloc(be, (size_t)n_blocks * BS * KW * sizeof(float));
    }
    kv.k = kl;
    kv.v = vl;
    /* Logical K/V per sequence: [S][MAXL][Hkv*Dh] */
    const int W = Hkv * Dh;
    float *K = co_randv(s, S * MAXL * W, 1.0f), *V = co_randv(s, S * MAXL * W, 1.0f);

    /* History: all positions not in the batch. Then the batch. */
    for (int pass = 0; pass < 2; pass++) {
        int n = 0;
        int32_t *pos = malloc(sizeof(int32_t) * S * (size_t)MAXL), *seq = malloc(sizeof(int32_t) * S * (size_t)MAXL);
        for (int q = 0; q < S; q++)
            for (int p = 0; p < len[q]; p++) {
                bool in_batch = p >= len[q] - news[q];
                if (in_batch == (pass == 1)) pos[n] = p, seq[n] = q, n++;
            }
        if (n == 0) {
            free(pos), free(seq);
            continue;
        }
        float *kb = malloc((size_t)n * W * 4), *vb = malloc((size_t)n * W * 4);
        for (int t = 0; t < n; t++) {
            memcpy(kb + t * W, K + (seq[t] * MAXL + pos[t]) * W, (size_t)W * 4);
            memcpy(vb + t * W, V + (seq[t] * MAXL + pos[t]) * W, (size_t)W * 4);
        }
        lm_attn_batch b = { .n_tokens = n, .pos = pos, .seq = seq, .n_seqs = S,
                            .block_tables = (const int32_t *const *)tables, .state_slot = NULL };
        lm_tensor kt = co_host(kb, n, W), vt = co_host(vb, n, W);
        be->ops->kv_write(be, &kv, LAYER, &kt, &vt, &b);
        free(kb);
        free(vb);
        if (pass == 0) {
            free(pos), free(seq);
            continue;
        }

        float *qd = co_randv(s, n * H * Dh, 1.0f), *out = malloc((size_t)n * H * Dh * 4);
        lm_tensor qt = co_host(qd, n, H * Dh), ot = co_host(out, n, H * Dh);
        lm_attn_params ap = { .n_heads = H, .n_kv_heads = Hkv, .head_dim = Dh, .scale = cf->scale,
                               .window = cf->window, .softcap = cf->softcap };
        be->ops->attention(be, &ot, &qt, &kv, LAYER, &b, &ap);
        int bad = 0;
        double *sc = malloc(sizeof(double) * MAXL);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < H; h++) {
                int g = h / (H / Hkv), lo = cf->window > 0 ? pos[t] - cf->window + 1 : 0;
                if (lo < 0) lo = 0;
                double mx = -INFINITY, sum = 0;
                for (int j = lo; j <= pos[t]; j++) {
                    double d = 0;
                    for (int i = 0; i < Dh; i++)
                        d += (double)qd[(t * H + h) * Dh + i] * K[(seq[t] * MAXL + j) * W + g * Dh + i];
                    d *= cf->scale;
                    if (cf->softcap > 0) d = cf->softcap * tanh(d / cf->softcap);
                    sc[j] = d;
                    mx = fmax(mx, d);
                }
                for (int j = lo; j <= pos[t]; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int i = 0; i < Dh; i++) {
                    double ref = 0;
                    for (int j = lo; j <= pos[t]; j++) ref += sc[j] * V[(seq[t] * MAXL + j) * W + g * Dh + i];
                    ref /= sum;
                    double got = out[(t * H + h) * Dh + i];
                    if (!(fabs(got - ref) <= 2e-6 + 1e-5 * fabs(ref))) {
                        if (bad++ < 3)
                            fprintf(stderr, "  attention t=%d (seq %d pos %d) h=%d i=%d: %.9g vs %.9g\n", t,
                                    seq[t], pos[t], h, i, got, ref);
                    }
                }
            }
        /* kv_write placed every batch row where the block table says. */
        for (int t = 0; t < n; t++) {
            int32_t blk = tables[seq[t]][pos[t] / BS];
            const float *row = (const float *)kl[LAYER] + ((int64_t)blk * BS + pos[t] % BS) * KW;
            bad += memcmp(row, K + (seq[t] * MAXL + pos[t]) * W, (size_t)W * 4) != 0;
        }
        free(sc);
        free(qd);
        if (out_copy) *out_copy = out;
        else free(out);
        free(pos), free(seq);
        for (int l = 0; l < LAYERS; l++) {
            be->ops->free(be, kl[l]);
            be->ops->free(be, vl[l]);
        }
        free(K);
        free(V);
        free(perm);
        for (int q = 0; q < S; q++) free(tables[q]);
        return bad;
    }
    LM_ASSERT(!"unreachable");
    return 1;
}

static int co_attn_case(lm_backend *be, const co_attn_cfg *cf, uint64_t *s) {
    const int len[3] = { 1, 23, 200 }, news[3] = { 1, 3, 65 };
    return co_attn_run(be, cf, s, len, news, NULL);
}

static void co_attention(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    uint64_t s = 17;
    char why[256];
    const co_attn_cfg cfgs[] = {
        /* H Hkv Dh window softcap scale block_size */
        { 8, 2, 64, 0, 0, 0.125f, 4 },    /* GQA 4:1 */
        { 4, 1, 40, 0, 0, 0.158f, 16 },   /* MQA, head width not a multiple of 16 */
        { 12, 2, 24, 0, 0, 0.2f, 7 },     /* GQA 6:1: a group of 4 heads and one of 2 */
        { 4, 4, 33, 16, 0, 0.174f, 4 },   /* MHA, sliding window */
        { 6, 2, 48, 0, 5.0f, 1.0f, 160 }, /* softcap with large logits; runs cut at 128 keys */
        { 4, 2, 16, 7, 3.0f, 0.8f, 5 },   /* window + softcap */
    };
    for (size_t ti = 0; ti < LM_COUNT(co_threads); ti++) {
        lm_backend *be = co_backend(isa, co_threads[ti], why, sizeof why);
        if (!be) LM_SKIP("%s", why);
        for (size_t c = 0; c < LM_COUNT(cfgs); c++) {
            int bad = co_attn_case(be, &cfgs[c], &s);
            LM_CHECK_MSG(bad == 0,
                         "%s threads=%d cfg %zu (H=%d Hkv=%d Dh=%d window=%d softcap=%g bs=%d): %d off",
                         lm_cpu_isa_name(isa), co_threads[ti], c, cfgs[c].H, cfgs[c].Hkv, cfgs[c].Dh,
                         cfgs[c].window, cfgs[c].softcap, cfgs[c].block_size, bad);
        }
        lm_backend_destroy(be);
    }
}

/* Contexts of several LM_ATT_SEG (512) key segments: a decode batch of
 * single tokens (which splits its segments over threads when it has fewer
 * items than threads) and a prefill whose tiles cross segment boundaries.
 * Checked against the reference, and bit for bit across 1, 2 and 3
 * threads: the split and the serial walk merge the same segments the same
 * way, so the thread count never changes an output. */
static void co_attention_long(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    char why[256];
    const co_attn_cfg cfgs[] = {
        /* H Hkv Dh window softcap scale block_size */
        { 4, 1, 64, 0, 0, 0.125f, 16 },  /* MQA: one item a token, so the decode splits */
        { 4, 1, 32, 700, 0, 0.17f, 16 }, /* a window that starts inside a segment */
        { 8, 2, 48, 0, 2.0f, 0.15f, 7 }, /* blocks that straddle segment ends, softcap */
    };
    const int len[3] = { 1, 1300, 1100 };
    const int news[2][3] = { { 1, 1, 1 }, { 1, 40, 300 } }; /* decode, prefill */
    for (size_t c = 0; c < LM_COUNT(cfgs); c++)
        for (int k = 0; k < 2; k++) {
            float *first = NULL;
            for (size_t ti = 0; ti < LM_COUNT(co_threads); ti++) {
                lm_backend *be = co_backend(isa, co_threads[ti], why, sizeof why);
                if (!be) LM_SKIP("%s", why);
                uint64_t s = 29; /* the same inputs for every thread count */
                float *out = NULL;
                int bad = co_attn_run(be, &cfgs[c], &s, len, news[k], &out);
                LM_CHECK_MSG(bad == 0, "%s cfg %zu %s threads=%d: %d off the reference", lm_cpu_isa_name(isa), c,
                             k ? "prefill" : "decode", co_threads[ti], bad);
                const int n = news[k][0] + news[k][1] + news[k][2];
                const size_t bytes = (size_t)n * (size_t)cfgs[c].H * (size_t)cfgs[c].Dh * sizeof(float);
                if (!first) first = out;
                else {
                    LM_CHECK_MSG(memcmp(first, out, bytes) == 0, "%s cfg %zu %s: threads=%d differs from 1 thread",
                                 lm_cpu_isa_name(isa), c, k ? "prefill" : "decode", co_threads[ti]);
                    free(out);
                }
                lm_backend_destroy(be);
            }
            free(first);
        }
}

/* ---- one test per (op, ISA) ------------------------------------------------- */

#define CO_ISA_TESTS(op)                                               \
    LM_TEST(cpu_##op##_scalar) { co_##op(lm_t_, LM_ISA_SCALAR); }      \
    LM_TEST(cpu_##op##_avx2) { co_##op(lm_t_, LM_ISA_AVX2); }          \
    LM_TEST(cpu_##op##_avx512) { co_##op(lm_t_, LM_ISA_AVX512); }

CO_ISA_TESTS(matmul)
CO_ISA_TESTS(rms_norm)
CO_ISA_TESTS(rope)
CO_ISA_TESTS(elementwise)
CO_ISA_TESTS(rows)
CO_ISA_TESTS(attention)
CO_ISA_TESTS(attention_long)

/* ---- backend plumbing ----------------------------------------------------------- */

LM_TEST(cpu_backend_create_args) {
    lm_err e = { { 0 } };
    LM_CHECK(lm_cpu_backend_create(1, (lm_cpu_isa)99, &e) == NULL && e.msg[0]);
    lm_backend *be = lm_cpu_backend_create(0, LM_ISA_AUTO, &e);
    LM_REQUIRE(be != NULL);
    LM_CHECK(lm_cpu_backend_threads(be) == (int)sysconf(_SC_NPROCESSORS_ONLN));
    LM_CHECK(strcmp(lm_cpu_isa_name(lm_cpu_isa_detect()), "?") != 0);
    lm_backend_destroy(be);
    for (size_t i = 0; i < LM_COUNT(co_isas); i++) {
        if (co_isas[i] <= lm_cpu_isa_detect()) continue;
        e.msg[0] = 0;
        LM_CHECK(lm_cpu_backend_create(1, co_isas[i], &e) == NULL && e.msg[0]);
    }
}

LM_TEST(cpu_alloc_zeroed_aligned) {
    lm_err e;
    lm_backend *be = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
    LM_REQUIRE(be != NULL);
    const size_t sizes[] = { 0, 1, 63, 4096, (size_t)1 << 20, ((size_t)3 << 20) + 7 };
    for (size_t i = 0; i < LM_COUNT(sizes); i++) {
        unsigned char *p = be->ops->alloc(be, sizes[i]);
        LM_REQUIRE(p != NULL);
        LM_CHECK(((uintptr_t)p & 63) == 0);
        size_t nz = 0;
        for (size_t j = 0; j < sizes[i]; j++) nz += p[j] != 0;
        LM_CHECK(nz == 0);
        if (sizes[i]) memset(p, 0xab, sizes[i]);
        be->ops->free(be, p);
    }
    be->ops->free(be, NULL);
    lm_tensor t;
    int rc = lm_tensor_alloc(be, &t, 5, 7);
    LM_REQUIRE(rc == 0);
    LM_CHECK(t.type == LM_F32 && t.rows == 5 && t.cols == 7 && t.data);
    float src[35], dst[35];
    for (int i = 0; i < 35; i++) src[i] = (float)i;
    be->ops->write(be, t.data, src, sizeof src);
    lm_tensor v = lm_tensor_rows(&t, 2, 3);
    LM_CHECK(v.rows == 3 && v.cols == 7 && ((float *)v.data)[0] == 14.0f);
    be->ops->read(be, dst, t.data, sizeof dst);
    LM_CHECK(memcmp(src, dst, sizeof src) == 0);
    lm_tensor_release(be, &t);
    LM_CHECK(t.data == NULL);
    LM_CHECK(lm_tensor_alloc(be, &t, INT64_MAX / 2, 16) != 0);
    lm_backend_destroy(be);
}

/* Many create/destroy cycles, with and without work in between, and work
 * after the workers have gone to sleep. */
LM_TEST(cpu_pool_create_destroy_cycles) {
    lm_err e;
    enum { N = 4096 };
    float *a = malloc(N * 4), *b = malloc(N * 4);
    for (int i = 0; i < N; i++) a[i] = (float)i;
    for (int cyc = 0; cyc < 300; cyc++) {
        int nt = 1 + cyc % 4;
        lm_backend *be = lm_cpu_backend_create(nt, LM_ISA_AUTO, &e);
        LM_REQUIRE(be != NULL);
        if (cyc % 3) {
            for (int i = 0; i < N; i++) b[i] = 1.0f;
            lm_tensor at = co_host(a, 64, N / 64), bt = co_host(b, 64, N / 64);
            be->ops->add(be, &bt, &at); /* 4096 * 1 flops: below the pool threshold */
            lm_tensor big = co_host(b, 1, N);
            be->ops->scale(be, &big, 1.0f); /* also inline; runs */
            float *yy = malloc(64 * 64 * 4);
            lm_tensor w = { .type = LM_F32, .rows = 64, .cols = 64 };
            int rc = be->ops->upload_weight(be, &w, a, &e);
            LM_REQUIRE(rc == 0);
            lm_tensor yt = co_host(yy, 64, 64), xt = co_host(b, 64, 64);
            be->ops->matmul(be, &yt, &xt, &w, NULL); /* GEMM through the pool */
            int bad = 0;
            for (int i = 0; i < N; i++) bad += b[i] != a[i] + 1.0f;
            LM_CHECK(bad == 0);
            free(yy);
        }
        if (cyc % 100 == 1) {
            usleep(2000); /* let the workers fall asleep, then wake them */
            lm_tensor w = { .type = LM_F32, .rows = 64, .cols = 64 };
            int rc = be->ops->upload_weight(be, &w, a, &e);
            LM_REQUIRE(rc == 0);
            float *yy = calloc(64 * 64, 4);
            lm_tensor yt = co_host(yy, 64, 64), xt = co_host(a, 64, 64);
            be->ops->matmul(be, &yt, &xt, &w, NULL);
            double ref = 0;
            for (int i = 0; i < 64; i++) ref += (double)a[5 * 64 + i] * a[7 * 64 + i];
            LM_CHECK_NEAR(yy[5 * 64 + 7], ref, 1e-5 * ref);
            free(yy);
        }
        lm_backend_destroy(be);
    }
    free(a);
    free(b);
}

/* The pool's contract (cpu_pool.h): fn runs on the caller and on the workers
 * that join in time, each ith at most once per run, and the shared counter
 * hands every item to exactly one of them. With more threads than cores many
 * workers arrive late and must skip runs without losing or repeating work. */
typedef struct co_pool_run {
    atomic_int next;
    atomic_int seen[100];
    atomic_uint ith_mask;
    atomic_int dup_ith;
} co_pool_run;

static void co_pool_fn(void *v, int ith, int nth) {
    co_pool_run *r = v;
    if (ith < 0 || ith >= nth || (atomic_fetch_or(&r->ith_mask, 1u << ith) >> ith) & 1u)
        atomic_fetch_add(&r->dup_ith, 1);
    for (int i; (i = atomic_fetch_add(&r->next, 1)) < 100;) atomic_fetch_add(&r->seen[i], 1);
}

LM_TEST(cpu_pool_oversubscribed_runs) {
    lm_err e;
    lm_pool *p = lm_pool_create(6, &e);
    LM_REQUIRE(p != NULL);
    int bad = 0;
    for (int run = 0; run < 3000; run++) {
        co_pool_run r;
        memset(&r, 0, sizeof r);
        lm_pool_run(p, co_pool_fn, &r);
        for (int i = 0; i < 100; i++) bad += atomic_load(&r.seen[i]) != 1;
        bad += atomic_load(&r.dup_ith) != 0 || !(atomic_load(&r.ith_mask) & 1u);
        if (run % 1000 == 999) usleep(1000); /* workers fall asleep */
    }
    LM_CHECK_MSG(bad == 0, "%d items lost, repeated or run twice on one thread", bad);
    lm_pool_free(p);
}
