/* test_cpu_qgemm.c - the int8 GEMM (prefill) on quantised weights.
 *
 * Through the backend's matmul with enough tokens to take the GEMM, for
 * every type lm_qblock_types lists, on 1-3 threads, with token counts around
 * the tile edges (4-token tiles, units of up to 512 tokens), row counts
 * around the 32-row panels and 128-row units, and inner sizes that cut the
 * 512-value k-slices unevenly. Two references in double, from the plain
 * dequantised weights (lm_dequant_row):
 *   - "int8": w . (q * d), the activation rounded to q8x as the kernel sees
 *     it. Only f32 rounding separates them: |err| <= 1e-5 * sum|w x| + 1e-6.
 *     The f32 path would miss this bound by the int8 rounding (~3e-3), so it
 *     also shows that the int8 GEMM ran.
 *   - "f32": w . x, the exact path; int8 is held within 6 sigma of its
 *     rounding (as test_cpu_qdot.c), exact mode within the f32 bound.
 * End to end, the llama-g256 GGUF fixtures: a prompt prefilled at once
 * (int8 GEMM) and token by token (int8 GEMV) must give the same greedy ids
 * wherever the top-2 margin is safe, and near-identical distributions. */
#include "lm_test.h"

#include "backend/cpu/cpu_kern.h"
#include "backend/cpu/cpu_qblock.h"
#include "backend/lm_backend.h"
#include "engine/lm_runner.h"
#include "model/lm_model.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float qg_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void qg_put_f16(uint8_t *p, float v) {
    uint16_t h = lm_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Where each type keeps its f16 scales, and their size: random code bits
 * with these scales give weights of similar magnitude in every block. A type
 * added to lm_qblock_types needs a row here (the test fails without one). */
typedef struct qg_scales {
    lm_dtype t;
    int at[2];
    float v[2];
} qg_scales;
static const qg_scales qg_scale_table[] = {
    { LM_Q8_0, { 0, -1 }, { 0.01f, 0 } },       { LM_Q4_0, { 0, -1 }, { 0.1f, 0 } },
    { LM_Q4_K, { 0, 2 }, { 0.002f, 0.001f } },  { LM_Q5_K, { 0, 2 }, { 0.002f, 0.001f } },
    { LM_Q6_K, { 208, -1 }, { 0.0003f, 0 } },   { LM_IQ4_XS, { 0, -1 }, { 0.0003f, 0 } },
    { LM_Q4_1, { 0, 2 }, { 0.1f, 0.05f } },     { LM_Q5_0, { 0, -1 }, { 0.05f, 0 } },
    { LM_Q5_1, { 0, 2 }, { 0.05f, 0.05f } },    { LM_IQ4_NL, { 0, -1 }, { 0.01f, 0 } },
    { LM_Q2_K, { 80, 82 }, { 0.02f, 0.01f } },  { LM_Q3_K, { 108, -1 }, { 0.001f, 0 } },
};

static const qg_scales *qg_scales_of(lm_dtype t) {
    for (size_t i = 0; i < LM_COUNT(qg_scale_table); i++)
        if (qg_scale_table[i].t == t) return &qg_scale_table[i];
    return NULL;
}

/* The instruction sets with an int8 GEMM tile on this CPU: the best one
 * and, on an AVX-512 machine, AVX2's as well (so that both tiles are
 * tested wherever the suite runs on AVX-512). Returns how many. */
static int qg_gemm_isas(lm_cpu_isa isa[2]) {
    int n = 0;
    lm_cpu_isa best = lm_cpu_isa_detect();
    if (lm_cpu_qkern_for(best)->qgemm) isa[n++] = best;
    if (best > LM_ISA_AVX2 && lm_cpu_qkern_for(LM_ISA_AVX2)->qgemm) isa[n++] = LM_ISA_AVX2;
    return n;
}

static const char *qg_isa_name(lm_cpu_isa isa) {
    return lm_cpu_qkern_for(isa)->name;
}

static uint8_t *qg_weight(const qg_scales *sc, int64_t O, int64_t I, uint64_t *s) {
    size_t rb = lm_dtype_row_bytes(sc->t, I), bb = (size_t)lm_dtype_block_bytes(sc->t), n = rb * (size_t)O;
    uint8_t *w = malloc(n);
    for (size_t i = 0; i < n; i++) w[i] = (uint8_t)(qg_rnd(s) * 128.0f + 128.0f);
    for (size_t b = 0; b < n / bb; b++)
        for (int k = 0; k < 2; k++)
            if (sc->at[k] >= 0) qg_put_f16(w + b * bb + sc->at[k], sc->v[k] * (0.5f + 0.5f * qg_rnd(s)));
    return w;
}

/* Activations: uniform in each 32-block, block magnitudes spread over 1e-2..1. */
static float *qg_x(int64_t n, uint64_t *s) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t b = 0; b < n / 32; b++) {
        float amp = powf(10.0f, -1.0f - qg_rnd(s));
        for (int i = 0; i < 32; i++) x[b * 32 + i] = amp * qg_rnd(s);
    }
    return x;
}

typedef struct qg_case {
    int O, T, i_blocks; /* inner size: i_blocks 32-value blocks, rounded up to the type's block */
} qg_case;
static const qg_case qg_cases[] = {
    { 1, 16, 8 },  { 31, 17, 37 }, { 33, 19, 40 }, { 95, 33, 8 },
    { 130, 70, 24 }, { 7, 131, 16 }, { 64, 21, 56 },
};

/* Runs one matmul and checks every output; returns the outputs off. */
static int qg_check_case(lm_backend *be, bool exact, lm_dtype t, const qg_case *c, int threads, uint64_t seed,
                         double *worst_int8, double *worst_sig) {
    const qg_scales *sc = qg_scales_of(t);
    int64_t blk = lm_dtype_block(t), I = (c->i_blocks * 32 + blk - 1) / blk * blk;
    uint64_t s = seed;
    uint8_t *w = qg_weight(sc, c->O, I, &s);
    float *x = qg_x(I * c->T, &s), *wd = malloc((size_t)(c->O * I) * sizeof *wd);
    float *y = malloc((size_t)(c->O * c->T) * sizeof *y), *bias = malloc((size_t)c->O * sizeof *bias);
    size_t rb = lm_dtype_row_bytes(t, I), ldq = lm_q8x_row_bytes(I);
    for (int o = 0; o < c->O; o++) {
        lm_dequant_row(t, w + (size_t)o * rb, wd + o * I, I);
        bias[o] = qg_rnd(&s);
    }
    bool with_bias = c->O % 2 == 1;
    lm_err e = { { 0 } };
    lm_tensor wt = { .type = t, .rows = c->O, .cols = I };
    lm_tensor bt = { .type = LM_F32, .rows = 1, .cols = c->O, .data = bias };
    lm_tensor xt = { .type = LM_F32, .rows = c->T, .cols = I, .data = x };
    lm_tensor yt = { .type = LM_F32, .rows = c->T, .cols = c->O, .data = y };
    if (be->ops->upload_weight(be, &wt, w, &e) != 0) abort();
    for (int i = 0; i < c->O * c->T; i++) y[i] = NAN;
    be->ops->matmul(be, &yt, &xt, &wt, with_bias ? &bt : NULL);
    int8_t *q = lm_xaligned(ldq);
    int bad = 0;
    for (int tk = 0; tk < c->T; tk++) {
        lm_q8x_quantize(x + tk * I, I, q);
        const float *d = lm_q8x_d(q, I);
        for (int o = 0; o < c->O; o++) {
            const float *wr = wd + (int64_t)o * I;
            double ref = with_bias ? bias[o] : 0.0, refq = ref, mag = 0, var = 0;
            for (int64_t i = 0; i < I; i++) {
                double xv = x[tk * I + i], dq = d[i / 32];
                ref += wr[i] * xv;
                refq += wr[i] * (q[i] * dq);
                mag += fabs(wr[i] * xv);
                var += (double)wr[i] * wr[i] * dq * dq / 12.0;
            }
            double got = y[tk * c->O + o], tol = 1e-5 * mag + 1e-6, sig = sqrt(var);
            double e_int8 = fabs(got - refq), e_f32 = fabs(got - ref);
            bool ok = exact ? e_f32 <= tol : e_int8 <= tol && e_f32 <= 6.0 * sig + tol;
            if (!exact) {
                *worst_int8 = fmax(*worst_int8, e_int8 / mag);
                *worst_sig = fmax(*worst_sig, e_f32 / sig);
            }
            if (!ok && bad++ < 3)
                fprintf(stderr, "  %s %s threads=%d O=%d T=%d I=%lld: y[%d][%d] = %.9g, int8 ref %.9g, f32 ref %.9g\n",
                        exact ? "exact" : "int8", lm_dtype_name(t), threads, c->O, c->T, (long long)I, tk, o, got,
                        refq, ref);
        }
    }
    lm_afree(q);
    free(w), free(wd), free(x), free(y), free(bias);
    return bad;
}

LM_TEST(cpu_qgemm_matmul) {
    lm_cpu_isa isas[2];
    const int n_isa = qg_gemm_isas(isas);
    if (!n_isa) printf("  no int8 GEMM on this CPU (no AVX2): the widening path is checked only\n");
    const int threads[] = { 1, 2, 3 };
    for (int t = 0; t < LM_DTYPE_COUNT; t++) {
        if (!lm_qblock_types[t].pack) continue;
        LM_CHECK_MSG(qg_scales_of((lm_dtype)t) != NULL, "%s: no row in qg_scale_table", lm_dtype_name((lm_dtype)t));
        if (!qg_scales_of((lm_dtype)t)) continue;
        /* runs 0 .. n_isa-1: the int8 GEMM of each ISA that takes the type
         * (codes within its tile's reach); the last: exact mode */
        for (int run = 0; run <= n_isa; run++) {
            const bool exact = run == n_isa;
            if (!exact && lm_qblock_types[t].max_code > lm_cpu_qkern_for(isas[run])->qgemm_max_code) {
                printf("  %-6s int8 GEMM (%s): not taken (codes up to %d), prefill widens to f32\n",
                       lm_dtype_name((lm_dtype)t), qg_isa_name(isas[run]), lm_qblock_types[t].max_code);
                continue;
            }
            double worst_int8 = 0, worst_sig = 0;
            for (size_t th = 0; th < LM_COUNT(threads); th++) {
                lm_err e = { { 0 } };
                lm_backend *be = lm_cpu_backend_create(threads[th], exact ? LM_ISA_AUTO : isas[run], &e);
                LM_REQUIRE(be != NULL);
                lm_cpu_backend_quant_exact(be, exact);
                for (size_t ci = 0; ci < LM_COUNT(qg_cases); ci++) {
                    int bad = qg_check_case(be, exact, (lm_dtype)t, &qg_cases[ci], threads[th],
                                            77 + 13 * (uint64_t)ci + (uint64_t)t, &worst_int8, &worst_sig);
                    LM_CHECK_MSG(bad == 0, "%s %s threads=%d case %zu: %d outputs off",
                                 exact ? "exact" : qg_isa_name(isas[run]), lm_dtype_name((lm_dtype)t), threads[th], ci,
                                 bad);
                }
                lm_backend_destroy(be);
            }
            if (!exact)
                printf("  %-6s int8 GEMM (%s): max err %.2g of sum|wx| against the int8 reference, %.2g sigma "
                       "against f32\n",
                       lm_dtype_name((lm_dtype)t), qg_isa_name(isas[run]), worst_int8, worst_sig);
        }
    }
}

/* y = x . w^T on a fresh backend (threads, isa) in int8 mode; the caller frees y. */
static float *qg_matmul_on(int threads, lm_cpu_isa isa, lm_dtype t, const uint8_t *w, int O, int64_t I, float *x,
                           int T) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(threads, isa, &e);
    if (!be) abort();
    lm_cpu_backend_quant_exact(be, false);
    float *y = malloc((size_t)O * T * sizeof(float));
    for (int i = 0; i < O * T; i++) y[i] = NAN;
    lm_tensor wt = { .type = t, .rows = O, .cols = I };
    lm_tensor xt = { .type = LM_F32, .rows = T, .cols = I, .data = x };
    lm_tensor yt = { .type = LM_F32, .rows = T, .cols = O, .data = y };
    if (be->ops->upload_weight(be, &wt, w, &e) != 0) abort();
    be->ops->matmul(be, &yt, &xt, &wt, NULL);
    lm_backend_destroy(be);
    return y;
}

static int qg_bits_differ(const float *a, const float *b, int n) {
    int diff = 0;
    for (int i = 0; i < n; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return diff;
}

/* The packers never write a code above the type's max_code: the AVX2 tile
 * adds its 16-bit products up to that bound (cpu_qgemm_avx2.c), so a code
 * beyond it could saturate. Random bytes make every code pattern occur;
 * each bound is also reached. */
LM_TEST(cpu_qgemm_codes_within_bound) {
    uint8_t *panel = lm_xaligned(8 * LM_QP_BLOCK_BYTES);
    for (int t = 0; t < LM_DTYPE_COUNT; t++) {
        if (!lm_qblock_types[t].pack) continue;
        const int64_t I = 256;
        const size_t ldw = lm_dtype_row_bytes((lm_dtype)t, I);
        uint8_t *w = malloc(ldw * LM_QP_ROWS);
        uint64_t st = 3 + (uint64_t)t;
        for (size_t i = 0; i < ldw * LM_QP_ROWS; i++) w[i] = (uint8_t)(qg_rnd(&st) * 128.0f + 128.0f);
        lm_qpanel_pack((lm_dtype)t, w, ldw, LM_QP_ROWS, 0, 8, panel);
        int top = 0;
        for (int b = 0; b < 8; b++)
            for (int i = 0; i < LM_QP_CODES; i++) top = LM_MAX(top, panel[(size_t)b * LM_QP_BLOCK_BYTES + i]);
        LM_CHECK_MSG(top <= lm_qblock_types[t].max_code, "%s: code %d above max_code %d",
                     lm_dtype_name((lm_dtype)t), top, lm_qblock_types[t].max_code);
        LM_CHECK_MSG(top >= lm_qblock_types[t].max_code * 9 / 10, "%s: codes reach %d of max_code %d (too loose)",
                     lm_dtype_name((lm_dtype)t), top, lm_qblock_types[t].max_code);
        free(w);
    }
    lm_afree(panel);
}

/* For the types the AVX2 tile takes (codes that fit its 16-bit sums: all
 * but Q8_0 and the IQ4s), it forms the VNNI tile's integers and then its
 * f32 steps: the two ISAs' matmuls give the same bits. */
LM_TEST(cpu_qgemm_avx2_same_bits_as_vnni) {
    if (!lm_cpu_has_avx512_vnni()) LM_SKIP("no AVX-512 VNNI on this CPU: one tile only");
    const int O = 70, T = 45;
    const int64_t I = 1024;
    for (int t = 0; t < LM_DTYPE_COUNT; t++) {
        if (!lm_qblock_types[t].pack || lm_qblock_types[t].max_code > LM_QGEMM_AVX2_MAX_CODE) continue;
        uint64_t st = 17 + (uint64_t)t;
        uint8_t *w = qg_weight(qg_scales_of((lm_dtype)t), O, I, &st);
        float *x = qg_x(I * T, &st), *y[2];
        for (int k = 0; k < 2; k++) y[k] = qg_matmul_on(2, k ? LM_ISA_AVX2 : LM_ISA_AVX512, (lm_dtype)t, w, O, I, x, T);
        int diff = qg_bits_differ(y[0], y[1], O * T);
        LM_CHECK_MSG(diff == 0, "%s: %d of %d outputs differ between the VNNI and AVX2 tiles",
                     lm_dtype_name((lm_dtype)t), diff, O * T);
        free(w), free(x), free(y[0]), free(y[1]);
    }
}

/* The same int8 GEMM on 1 and 16 threads gives the same bits: the units
 * (tokens x outputs a unit, lm_mm_gemm) change with the thread count, and
 * every output must still come out once, with each token's sums in k order.
 * Shapes of a k/v projection (512 outputs: units cut to one 32-row panel
 * before the tokens are) and of an odd one (400: a partial panel). */
LM_TEST(cpu_qgemm_threads_same_bits) {
    lm_cpu_isa isas[2];
    const int n_isa = qg_gemm_isas(isas);
    if (!n_isa) LM_SKIP("no int8 GEMM on this CPU (no AVX2)");
    const int Os[] = { 512, 400 };
    for (int ii = 0; ii < n_isa; ii++)
    for (size_t oi = 0; oi < LM_COUNT(Os); oi++) {
        const int O = Os[oi], T = 300;
        const int64_t I = 1024;
        const qg_scales *sc = qg_scales_of(LM_Q4_K);
        uint64_t s = 41 + oi;
        uint8_t *w = qg_weight(sc, O, I, &s);
        float *x = qg_x(I * T, &s), *y[2];
        for (int k = 0; k < 2; k++) y[k] = qg_matmul_on(k ? 16 : 1, isas[ii], LM_Q4_K, w, O, I, x, T);
        int diff = qg_bits_differ(y[0], y[1], O * T);
        LM_CHECK_MSG(diff == 0, "%s O=%d: %d of %d outputs differ between 1 and 16 threads", qg_isa_name(isas[ii]), O,
                     diff, O * T);
        free(w), free(x), free(y[0]), free(y[1]);
    }
}

/* matmul_n (q, k, v as one set of units) gives each weight the bits of its
 * own matmul: a Q6_K weight between Q4_K ones (the Q4_K_M mix), widths that
 * leave partial panels, 1, 3 and 16 threads; and matmul_glu the composed
 * gate, up and SiLU. */
static void qg_matmul_n_case(lm_test_ctx *lm_t_, lm_cpu_isa isa, int T);

LM_TEST(cpu_qgemm_matmul_n_same_bits) {
    lm_cpu_isa isas[2];
    const int n_isa = qg_gemm_isas(isas);
    if (!n_isa) LM_SKIP("no int8 GEMM on this CPU (no AVX2)");
    for (int ii = 0; ii < n_isa; ii++) {
        qg_matmul_n_case(lm_t_, isas[ii], 150); /* the GEMM */
        qg_matmul_n_case(lm_t_, isas[ii], 5);   /* the GEMV (decode) */
    }
}

static void qg_matmul_n_case(lm_test_ctx *lm_t_, lm_cpu_isa isa, int T) {
    enum { N = 3 };
    const int64_t I = 512;
    const lm_dtype types[N] = { LM_Q4_K, LM_Q4_K, LM_Q6_K };
    const int Os[N] = { 512, 96, 80 };
    uint64_t st = 99;
    uint8_t *wb[N];
    lm_tensor wt[N];
    for (int i = 0; i < N; i++) {
        wb[i] = qg_weight(qg_scales_of(types[i]), Os[i], I, &st);
        wt[i] = (lm_tensor){ .type = types[i], .rows = Os[i], .cols = I };
    }
    float *x = qg_x(I * T, &st);
    lm_tensor xt = { .type = LM_F32, .rows = T, .cols = I, .data = x };
    const int threads[] = { 1, 3, 16 };
    for (size_t th = 0; th < LM_COUNT(threads); th++) {
        lm_err e = { { 0 } };
        lm_backend *be = lm_cpu_backend_create(threads[th], isa, &e);
        LM_REQUIRE(be != NULL && be->ops->matmul_n && be->ops->matmul_glu);
        lm_cpu_backend_quant_exact(be, false);
        float *y1[N], *yn[N];
        lm_tensor t1[N], tn[N];
        lm_tensor *pn[N];
        const lm_tensor *pw[N];
        for (int i = 0; i < N; i++) {
            LM_REQUIRE(be->ops->upload_weight(be, &wt[i], wb[i], &e) == 0);
            y1[i] = malloc((size_t)Os[i] * T * sizeof(float)), yn[i] = malloc((size_t)Os[i] * T * sizeof(float));
            t1[i] = (lm_tensor){ .type = LM_F32, .rows = T, .cols = Os[i], .data = y1[i] };
            tn[i] = (lm_tensor){ .type = LM_F32, .rows = T, .cols = Os[i], .data = yn[i] };
            pn[i] = &tn[i], pw[i] = &wt[i];
            for (int k = 0; k < Os[i] * T; k++) yn[i][k] = NAN;
            be->ops->matmul(be, &t1[i], &xt, &wt[i], NULL);
        }
        be->ops->matmul_n(be, N, pn, &xt, pw, NULL);
        for (int i = 0; i < N; i++) {
            int diff = 0;
            for (int k = 0; k < Os[i] * T; k++) diff += memcmp(&y1[i][k], &yn[i][k], sizeof(float)) != 0;
            LM_CHECK_MSG(diff == 0, "T=%d threads=%d weight %d (%s): %d of %d outputs differ from its own matmul", T,
                         threads[th], i, lm_dtype_name(types[i]), diff, Os[i] * T);
        }
        /* gate = weight 1, up = weight 2 (96 and 80 wide: use the first 80) */
        lm_tensor g80 = wt[1], y80 = { .type = LM_F32, .rows = T, .cols = 80 };
        g80.rows = 80;
        float *yg = malloc((size_t)80 * T * sizeof(float)), *ref = malloc((size_t)80 * T * sizeof(float));
        float *gw = malloc((size_t)80 * T * sizeof(float)), *uw = malloc((size_t)80 * T * sizeof(float));
        lm_tensor gws = { .type = LM_F32, .rows = T, .cols = 80, .data = gw }, uws = gws;
        uws.data = uw;
        y80.data = yg;
        be->ops->matmul_glu(be, &y80, &xt, &g80, &wt[2], LM_GLU_SILU, &gws, &uws);
        lm_tensor rt = y80;
        rt.data = ref;
        be->ops->matmul(be, &gws, &xt, &g80, NULL);
        be->ops->matmul(be, &uws, &xt, &wt[2], NULL);
        be->ops->silu_mul(be, &rt, &gws, &uws);
        int gd = 0;
        for (int k = 0; k < 80 * T; k++) gd += memcmp(&yg[k], &ref[k], sizeof(float)) != 0;
        LM_CHECK_MSG(gd == 0, "T=%d threads=%d: matmul_glu differs from gate, up and silu_mul in %d outputs", T,
                     threads[th], gd);
        free(yg), free(ref), free(gw), free(uw);
        for (int i = 0; i < N; i++) free(y1[i]), free(yn[i]);
        lm_backend_destroy(be);
    }
    for (int i = 0; i < N; i++) free(wb[i]);
    free(x);
}

/* The AVX-512 panel packer writes the portable packer's bytes: every type
 * (the ones it does not take go through the portable one), full and
 * partial panels (rows past nv zero), runs that start and end inside a
 * super-block. Random bytes make every code and scale bit pattern occur. */
LM_TEST(cpu_qgemm_panel_pack_avx512_same_bytes) {
    if (lm_cpu_isa_detect() != LM_ISA_AVX512) LM_SKIP("no AVX-512 on this CPU: the packer cannot run");
    const int nvs[] = { 32, 31, 17, 16, 9, 1 };
    const struct { int b0, nb; } runs[] = { { 0, 16 }, { 3, 5 }, { 8, 1 }, { 5, 16 } };
    const size_t bytes = 16 * LM_QP_BLOCK_BYTES;
    uint8_t *a = lm_xaligned(bytes), *b = lm_xaligned(bytes);
    int cases = 0;
    for (int t = 0; t < LM_DTYPE_COUNT; t++) {
        if (!lm_qblock_types[t].pack) continue;
        const int64_t I = 32 * 32 * 8; /* 32 blocks of 256: room for every run */
        const size_t ldw = lm_dtype_row_bytes((lm_dtype)t, I);
        uint8_t *w = malloc(ldw * LM_QP_ROWS);
        uint64_t st = 7 + (uint64_t)t;
        for (size_t i = 0; i < ldw * LM_QP_ROWS; i++) w[i] = (uint8_t)(qg_rnd(&st) * 128.0f + 128.0f);
        /* Q8_0's scale is its factor as is: a NaN f16 there keeps its payload
         * through the portable conversion but comes out quieted from
         * vcvtph2ps. Scales are finite in real files (and a NaN factor gives
         * NaN outputs either way), so Q8_0's exponents are kept below 31. */
        if (t == LM_Q8_0)
            for (size_t i = 0; i + 34 <= ldw * LM_QP_ROWS; i += 34) w[i + 1] &= 0xbb;
        for (size_t ni = 0; ni < LM_COUNT(nvs); ni++)
            for (size_t ri = 0; ri < LM_COUNT(runs); ri++) {
                memset(a, 0xa5, bytes), memset(b, 0x5a, bytes);
                lm_qpanel_pack((lm_dtype)t, w, ldw, nvs[ni], runs[ri].b0, runs[ri].nb, a);
                lm_qpanel_pack_avx512((lm_dtype)t, w, ldw, nvs[ni], runs[ri].b0, runs[ri].nb, b);
                size_t n = (size_t)runs[ri].nb * LM_QP_BLOCK_BYTES, diff = 0;
                for (size_t i = 0; i < n; i++) diff += a[i] != b[i];
                LM_CHECK_MSG(diff == 0, "%s nv=%d blocks %d+%d: %zu panel bytes differ", lm_dtype_name((lm_dtype)t),
                             nvs[ni], runs[ri].b0, runs[ri].nb, diff);
                cases++;
            }
        free(w);
    }
    printf("  %d panels byte for byte\n", cases);
    lm_afree(a), lm_afree(b);
}

/* The ISA's q8x rounding must give the portable bytes exactly (the GEMV
 * and GEMM tests hold the kernels to the integers of the portable one):
 * random blocks, a zero block, and ties (amax 127, so x * id = x exactly). */
LM_TEST(cpu_qgemm_q8x_quantize_bitexact) {
    lm_cpu_isa best = lm_cpu_isa_detect();
    const lm_cpu_qkern *tables[2] = { lm_cpu_qkern_for(best), best > LM_ISA_AVX2 ? lm_cpu_qkern_for(LM_ISA_AVX2) : NULL };
    if (!tables[0]->q8x_quantize) LM_SKIP("no ISA-specific q8x rounding on this CPU (table %s)", tables[0]->name);
    enum { N = 32 * 40 };
    uint64_t s = 5;
    float *x = qg_x(N, &s);
    for (int i = 0; i < 32; i++) x[32 + i] = 0.0f;
    for (int i = 0; i < 32; i++) x[64 + i] = i == 0 ? 127.0f : (float)(i % 8) - 3.5f; /* ties both ways */
    for (int i = 0; i < 32; i++) x[96 + i] = i == 5 ? -2.0f : (float)i / 40.0f;     /* amax from a negative value */
    size_t bytes = lm_q8x_row_bytes(N);
    uint8_t *a = lm_xaligned(bytes), *b = lm_xaligned(bytes);
    memset(a, 0, bytes);
    lm_q8x_quantize(x, N, a);
    for (int k = 0; k < 2; k++) {
        const lm_cpu_qkern *qk = tables[k];
        if (!qk || !qk->q8x_quantize) continue;
        memset(b, 0, bytes);
        qk->q8x_quantize(x, N, b);
        size_t diff = 0;
        for (size_t i = 0; i < bytes; i++) diff += a[i] != b[i];
        LM_CHECK_MSG(diff == 0, "%s: %zu bytes of the q8x row differ from the portable rounding", qk->name, diff);
    }
    LM_CHECK(((const int8_t *)a)[64 + 1] == -2 && ((const int8_t *)a)[64 + 2] == -2); /* -2.5 -> -2, -1.5 -> -2 */
    lm_afree(a), lm_afree(b);
    free(x);
}

/* ---- end to end: batch prefill (GEMM) against token by token (GEMV) -------- */

static const char *const qg_fixtures[] = { "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS",
                                            "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K" };
/* Whether this CPU's int8 GEMM takes the fixture's main type: a file
 * named after one type (Q8_0, IQ4_XS, ...) holds mostly that type, the
 * K-quant mixes (Q4_K_M ...) only narrow codes. A type the tile does not
 * take (AVX2's: codes up to 255) is prefilled through the f32 GEMM. */
static bool qg_fixture_in_int8_gemm(const char *name) {
    const int reach = lm_cpu_qkern_for(lm_cpu_isa_detect())->qgemm_max_code;
    for (int t = 0; t < LM_DTYPE_COUNT; t++)
        if (lm_qblock_types[t].pack && !strcmp(lm_dtype_name((lm_dtype)t), name))
            return lm_qblock_types[t].max_code <= reach;
    return true;
}

/* Prefills ids (at once or one token at a time), then decodes n_gen steps;
 * forced: feed these ids (else greedy ones, written to it). The logits of the
 * last prompt position and of each step go to lg [n_gen][V]. */
static int qg_decode(lm_model *m, const int32_t *ids, int n, bool stepwise, int n_gen, float *lg, int32_t *gen,
                     bool forced) {
    lm_err e = { { 0 } };
    lm_runner *r = NULL;
    const int V = (int)m->cfg.vocab;
    if (lm_runner_create(&r, m, n + n_gen + 1, 0, &e) != 0) return -1;
    int rc = 0;
    if (stepwise)
        for (int i = 0; i < n && !rc; i++) rc = lm_runner_eval(r, ids + i, 1, false, lg, &e);
    else rc = lm_runner_eval(r, ids, n, false, lg, &e);
    for (int s = 0; s < n_gen && !rc; s++) {
        if (!forced) gen[s] = lm_argmax(lg + (int64_t)s * V, V);
        if (s + 1 < n_gen) rc = lm_runner_eval(r, &gen[s], 1, false, lg + (int64_t)(s + 1) * V, &e);
    }
    lm_runner_free(r);
    return rc;
}

static double qg_kl(const float *p_logits, const float *q_logits, int V) {
    double mp = p_logits[lm_argmax(p_logits, V)], mq = q_logits[lm_argmax(q_logits, V)], zp = 0, zq = 0, kl = 0;
    for (int i = 0; i < V; i++) zp += exp(p_logits[i] - mp), zq += exp(q_logits[i] - mq);
    for (int i = 0; i < V; i++) {
        double lp = p_logits[i] - mp - log(zp), lq = q_logits[i] - mq - log(zq);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

/* Mean KL(stepwise || batch) measured 1e-5 .. 5e-5 (the int8 codes of the
 * two runs part where f32 noise of ~4e-6 crosses a rounding boundary); the
 * f32 GEMM batch against the int8 GEMV gave 3e-4. */
#define QG_KL_MAX 1.5e-4
LM_TEST(cpu_qgemm_gguf_batch_vs_stepwise) {
    if (lm_cpu_qkern_for(lm_cpu_isa_detect())->qgemm == NULL) LM_SKIP("no int8 GEMM on this CPU (needs AVX2)");
    enum { N_PROMPT = 90, N_GEN = 24 };
    int32_t ids[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (int32_t)((i * 37 + 11) % 97);
    for (size_t f = 0; f < LM_COUNT(qg_fixtures); f++) {
        char *path = lm_tu_g256_file(qg_fixtures[f], "model.%s.gguf");
        if (!path) LM_SKIP("gguf/llama-g256/model.%s.gguf: %s", qg_fixtures[f], lm_test_fixtures_why());
        lm_err e = { { 0 } };
        lm_backend *be = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
        LM_REQUIRE(be != NULL);
        lm_model *m = NULL;
        LM_REQUIRE(lm_model_load(&m, path, be, &e) == 0);
        const int V = (int)m->cfg.vocab;
        float *lg[2];
        int32_t gen[N_GEN];
        for (int sw = 0; sw < 2; sw++) {
            lg[sw] = malloc((size_t)N_GEN * V * sizeof(float));
            LM_REQUIRE(qg_decode(m, ids, N_PROMPT, sw == 1, N_GEN, lg[sw], gen, sw == 1) == 0);
        }
        /* the stepwise run is fed the batch run's greedy ids */
        int checked = 0, equal = 0;
        double d_max = 0, kl_sum = 0;
        for (int s = 0; s < N_GEN; s++) {
            const float *a = lg[0] + (int64_t)s * V, *b = lg[1] + (int64_t)s * V;
            double d = 0;
            for (int i = 0; i < V; i++) d = fmax(d, fabs((double)a[i] - b[i]));
            d_max = fmax(d_max, d);
            kl_sum += qg_kl(b, a, V);
            equal += lm_argmax(b, V) == gen[s];
            if (lm_tu_top2_margin(b, V) > 2 * d) {
                checked++;
                LM_CHECK_MSG(lm_argmax(b, V) == gen[s], "%s step %d: batch %d, stepwise %d", qg_fixtures[f], s,
                             gen[s], lm_argmax(b, V));
            }
        }
        printf("  %-6s batch vs stepwise prefill: greedy equal %d/%d (%d with a safe margin), "
               "max |d logit| %.3g, mean KL %.2g\n", qg_fixtures[f], equal, N_GEN, checked, d_max, kl_sum / N_GEN);
        if (!qg_fixture_in_int8_gemm(qg_fixtures[f]))
            printf("  %-6s prefilled by the f32 GEMM on this CPU: the KL bound is for the int8 one\n", qg_fixtures[f]);
        else LM_CHECK_MSG(kl_sum / N_GEN < QG_KL_MAX, "%s: mean KL %.3g", qg_fixtures[f], kl_sum / N_GEN);
        LM_CHECK(checked >= N_GEN / 2);
        free(lg[0]), free(lg[1]);
        lm_model_free(m);
        lm_backend_destroy(be);
        free(path);
    }
}
