/* test_cpu_moe.c - the moe op on every CPU code path against a plain double
 * reference written here.
 *
 * The reference routes each token on its own (sort experts by logit
 * descending, index ascending on ties; softmax over all E in double;
 * optional renormalisation over the k chosen and per-expert scale), runs each
 * chosen expert's SiLU MLP in double on the exactly widened weights, and sums.
 * Cases cover T = 1 (decode, GEMV) to T = 300 (GEMM per expert), top-k 1, 2
 * and 8 (all experts), normalised or not, router logits with deliberate ties,
 * f32 / bf16 / q8_0 experts, and 1-3 threads on each ISA this CPU has.
 *
 * Tolerance: |y - ref| <= 2e-5 * M + 1e-6, M = sum over the chosen experts of
 * w * sum_f |act_f * Wdown[d][f]| (the magnitude of the terms summed in f32;
 * the activations themselves carry f32 rounding of dot products of similar
 * conditioning). A wrong expert or weight is an O(1) error. */
#include "lm_test.h"

#include "backend/lm_backend.h"

#include <stdlib.h>
#include <string.h>

static float cm_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void cm_put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* Random weight [O][I] of type t (f32, bf16 or q8_0) with amplitude amp;
 * deq gets its exact widening (double). */
static void *cm_weight(lm_dtype t, int64_t O, int64_t I, float amp, uint64_t *s, double *deq) {
    size_t rb = lm_dtype_row_bytes(t, I);
    uint8_t *w = malloc(rb * (size_t)O + 1);
    if (t == LM_Q8_0) {
        for (int64_t o = 0; o < O; o++)
            for (int64_t b = 0; b < I / 32; b++) {
                uint8_t *blk = w + (size_t)o * rb + (size_t)b * 34;
                cm_put16(blk, lm_f32_to_f16(amp / 127.0f * (0.5f + 0.5f * cm_rnd(s))));
                for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)(127.0f * cm_rnd(s));
            }
    } else {
        for (int64_t i = 0; i < O * I; i++) {
            float v = amp * cm_rnd(s);
            if (t == LM_F32) memcpy(w + i * 4, &v, 4);
            else cm_put16(w + i * 2, lm_f32_to_bf16(v));
        }
    }
    float *row = malloc((size_t)I * sizeof *row);
    for (int64_t o = 0; o < O; o++) {
        lm_dequant_row(t, w + (size_t)o * rb, row, I);
        for (int64_t i = 0; i < I; i++) deq[o * I + i] = row[i];
    }
    free(row);
    return w;
}

typedef struct cm_case {
    int T, E, k, D, F;
    bool norm, ties, scale;
    lm_dtype t;
    lm_glu act; /* the experts' gate activation */
} cm_case;

/* Reference routing of one token: ids and weights (double). */
static void cm_route(const float *l, int E, int k, bool norm, const float *scale, int *ids, double *w) {
    int order[64] = { 0 };
    for (int e = 0; e < E; e++) order[e] = e;
    for (int i = 1; i < E; i++) /* insertion sort: logit desc, index asc */
        for (int j = i; j > 0; j--) {
            int a = order[j - 1], b = order[j];
            if (l[b] > l[a] || (l[b] == l[a] && b < a)) {
                order[j - 1] = b;
                order[j] = a;
            } else {
                break;
            }
        }
    double m = l[order[0]], den = 0, chosen = 0;
    for (int e = 0; e < E; e++) den += exp(l[e] - m);
    for (int j = 0; j < k; j++) chosen += exp(l[order[j]] - m);
    for (int j = 0; j < k; j++) {
        ids[j] = order[j];
        w[j] = exp(l[order[j]] - m) / (norm ? chosen : den) * (scale ? scale[order[j]] : 1.0);
    }
}

/* Runs one case on be; returns the output (malloc'd) and counts failures. */
static float *cm_run(lm_test_ctx *lm_t_, lm_backend *be, cm_case c, uint64_t seed) {
    uint64_t s = seed;
    const int T = c.T, E = c.E, k = c.k, D = c.D, F = c.F;
    double **gd = malloc((size_t)E * sizeof *gd), **ud = malloc((size_t)E * sizeof *ud),
           **dd = malloc((size_t)E * sizeof *dd);
    void **raw = malloc((size_t)3 * E * sizeof *raw);
    lm_tensor *g = calloc((size_t)E, sizeof *g), *u = calloc((size_t)E, sizeof *u), *d = calloc((size_t)E, sizeof *d);
    lm_err e = { { 0 } };
    for (int x = 0; x < E; x++) {
        gd[x] = malloc((size_t)F * D * sizeof(double));
        ud[x] = malloc((size_t)F * D * sizeof(double));
        dd[x] = malloc((size_t)D * F * sizeof(double));
        raw[3 * x] = cm_weight(c.t, F, D, 0.2f, &s, gd[x]);
        raw[3 * x + 1] = cm_weight(c.t, F, D, 0.2f, &s, ud[x]);
        raw[3 * x + 2] = cm_weight(c.t, D, F, 0.2f, &s, dd[x]);
        g[x] = (lm_tensor){ .type = c.t, .rows = F, .cols = D };
        u[x] = (lm_tensor){ .type = c.t, .rows = F, .cols = D };
        d[x] = (lm_tensor){ .type = c.t, .rows = D, .cols = F };
        LM_CHECK(be->ops->upload_weight(be, &g[x], raw[3 * x], &e) == 0);
        LM_CHECK(be->ops->upload_weight(be, &u[x], raw[3 * x + 1], &e) == 0);
        LM_CHECK(be->ops->upload_weight(be, &d[x], raw[3 * x + 2], &e) == 0);
    }
    float *xs = malloc((size_t)T * D * sizeof *xs), *ls = malloc((size_t)T * E * sizeof *ls);
    float *ys = malloc((size_t)T * D * sizeof *ys), *sc = malloc((size_t)E * sizeof *sc);
    for (int i = 0; i < T * D; i++) xs[i] = cm_rnd(&s);
    for (int i = 0; i < T * E; i++) ls[i] = c.ties ? 0.5f * (float)(int)(4.0f * cm_rnd(&s)) : 3.0f * cm_rnd(&s);
    if (c.ties) for (int i = 0; i < E; i++) ls[i] = 1.0f; /* token 0: every logit equal */
    for (int i = 0; i < E; i++) sc[i] = 0.5f + cm_rnd(&s);
    for (int i = 0; i < T * D; i++) ys[i] = NAN; /* every output must be written */

    lm_tensor xt = { .type = LM_F32, .rows = T, .cols = D, .data = xs };
    lm_tensor lt = { .type = LM_F32, .rows = T, .cols = E, .data = ls };
    lm_tensor yt = { .type = LM_F32, .rows = T, .cols = D, .data = ys };
    lm_tensor st = { .type = LM_F32, .rows = 1, .cols = E, .data = sc };
    lm_moe_params p = { .n_experts = E, .top_k = k, .norm_topk = c.norm, .gate = g, .up = u, .down = d,
                        .expert_scale = c.scale ? &st : NULL, .act = c.act };
    be->ops->moe(be, &yt, &xt, &lt, &p);

    double *act = malloc((size_t)F * sizeof *act);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        int ids[64];
        double w[64];
        cm_route(ls + t * E, E, k, c.norm, c.scale ? sc : NULL, ids, w);
        double *ref = calloc((size_t)D, sizeof *ref), *mag = calloc((size_t)D, sizeof *mag);
        for (int j = 0; j < k; j++) {
            int x = ids[j];
            for (int f = 0; f < F; f++) {
                double a = 0, b = 0;
                for (int i = 0; i < D; i++) {
                    a += gd[x][f * D + i] * xs[t * D + i];
                    b += ud[x][f * D + i] * xs[t * D + i];
                }
                const double ga = c.act == LM_GLU_SILU        ? a / (1 + exp(-a))
                                 : c.act == LM_GLU_GELU_TANH ? 0.5 * a * (1 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
                                                             : 0.5 * a * (1 + erf(a * 0.7071067811865476));
                act[f] = ga * b;
            }
            for (int o = 0; o < D; o++)
                for (int f = 0; f < F; f++) {
                    ref[o] += w[j] * dd[x][o * F + f] * act[f];
                    mag[o] += fabs(w[j] * dd[x][o * F + f] * act[f]);
                }
        }
        for (int o = 0; o < D; o++) {
            double err = fabs(ys[t * D + o] - ref[o]);
            if (!(err <= 2e-5 * mag[o] + 1e-6)) {
                if (bad++ < 3)
                    fprintf(stderr, "  T=%d E=%d k=%d D=%d F=%d %s norm=%d: y[%d][%d] = %.9g, ref %.9g\n", T, E, k,
                            D, F, lm_dtype_name(c.t), c.norm, t, o, ys[t * D + o], ref[o]);
            }
        }
        free(ref);
        free(mag);
    }
    LM_CHECK(bad == 0);
    free(act);
    for (int x = 0; x < E; x++) {
        free(gd[x]);
        free(ud[x]);
        free(dd[x]);
        for (int j = 0; j < 3; j++) free(raw[3 * x + j]);
    }
    free(gd);
    free(ud);
    free(dd);
    free(raw);
    free(g);
    free(u);
    free(d);
    free(xs);
    free(ls);
    free(sc);
    return ys;
}

static const cm_case cm_cases[] = {
    { 1, 8, 2, 64, 32, true, false, false, LM_BF16, LM_GLU_SILU },
    { 1, 8, 8, 64, 32, false, false, false, LM_BF16, LM_GLU_SILU },
    { 1, 16, 1, 96, 64, true, false, true, LM_Q8_0, LM_GLU_SILU },
    { 7, 8, 2, 64, 32, true, true, false, LM_BF16, LM_GLU_SILU },
    { 37, 8, 1, 40, 24, false, true, false, LM_F32, LM_GLU_SILU },
    { 64, 8, 8, 64, 32, true, true, true, LM_BF16, LM_GLU_SILU },
    { 130, 16, 2, 128, 96, false, false, false, LM_Q8_0, LM_GLU_SILU },
    { 300, 8, 2, 72, 40, true, false, false, LM_BF16, LM_GLU_SILU },
    { 300, 6, 3, 33, 17, false, true, true, LM_F32, LM_GLU_SILU },
    /* GELU-gated experts (Gemma 4): decode, a batch, quantised */
    { 1, 8, 2, 64, 32, true, false, true, LM_BF16, LM_GLU_GELU_TANH },
    { 64, 8, 2, 64, 32, true, false, true, LM_F32, LM_GLU_GELU_TANH },
    { 37, 16, 2, 96, 64, true, false, true, LM_Q8_0, LM_GLU_GELU },
};

static const lm_cpu_isa cm_isas[] = { LM_ISA_SCALAR, LM_ISA_AVX2, LM_ISA_AVX512 };

/* Every case on every ISA with 1, 2 and 3 threads; outputs must not depend
 * on the thread count (each value is computed by one thread, in one order). */
LM_TEST(cpu_moe_matches_reference) {
    int ran = 0;
    for (size_t ii = 0; ii < LM_COUNT(cm_isas); ii++) {
        if (cm_isas[ii] > lm_cpu_isa_detect()) continue;
        for (size_t ci = 0; ci < LM_COUNT(cm_cases); ci++) {
            float *first = NULL;
            for (int th = 1; th <= 3; th++) {
                lm_err e = { { 0 } };
                lm_backend *be = lm_cpu_backend_create(th, cm_isas[ii], &e);
                LM_CHECK_MSG(be != NULL, "%s", e.msg);
                if (!be) continue;
                /* the reference widens exactly; test_cpu_qdot.c covers int8 */
                lm_cpu_backend_quant_exact(be, true);
                float *y = cm_run(lm_t_, be, cm_cases[ci], 1234 + ci);
                size_t n = (size_t)cm_cases[ci].T * cm_cases[ci].D;
                if (!first) first = y;
                else {
                    LM_CHECK(memcmp(first, y, n * sizeof *y) == 0);
                    free(y);
                }
                lm_backend_destroy(be);
                ran++;
            }
            free(first);
        }
    }
    LM_CHECK(ran > 0);
}

/* Routing corner cases through a model-free check: with every logit equal
 * the first k experts are chosen with weight 1/E (1/k normalised); a token
 * routed to one expert (k = 1, normalised) gets exactly that expert. */
LM_TEST(cpu_moe_ties_pick_lowest_index) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
    LM_CHECK_MSG(be != NULL, "%s", e.msg);
    if (!be) return;
    /* Expert x maps x to (x+1) * const through a 1-wide MLP: gate = up = 1
     * row of ones/sqrt-ish, down scales; outputs identify the expert. */
    enum { E = 6, D = 4, F = 1 };
    float gw[E][F][D], uw[E][F][D], dw[E][D][F];
    lm_tensor g[E], u[E], d[E];
    for (int x = 0; x < E; x++) {
        for (int i = 0; i < D; i++) {
            gw[x][0][i] = 1.0f;
            uw[x][0][i] = 1.0f;
            dw[x][i][0] = (float)(x + 1);
        }
        g[x] = (lm_tensor){ LM_F32, F, D, gw[x] };
        u[x] = (lm_tensor){ LM_F32, F, D, uw[x] };
        d[x] = (lm_tensor){ LM_F32, D, F, dw[x] };
    }
    float xs[D] = { 0.25f, 0.25f, 0.25f, 0.25f }; /* gate = up = 1: act = silu(1) */
    float ls[E] = { 2, 2, 2, 2, 2, 2 };
    float ys[D];
    lm_tensor xt = { LM_F32, 1, D, xs }, lt = { LM_F32, 1, E, ls }, yt = { LM_F32, 1, D, ys };
    double act = 1.0 / (1.0 + exp(-1.0));
    for (int k = 1; k <= 3; k++)
        for (int norm = 0; norm <= 1; norm++) {
            lm_moe_params p = { E, k, norm, g, u, d, NULL, LM_GLU_SILU };
            be->ops->moe(be, &yt, &xt, &lt, &p);
            double want = 0;
            for (int x = 0; x < k; x++) want += (norm ? 1.0 / k : 1.0 / E) * act * (x + 1);
            LM_CHECK_NEAR(ys[0], want, 1e-6);
        }
    /* A tie below the top: logits {5, 1, 3, 3, 0, 3}, k = 2 -> experts 0 and 2. */
    float l2[E] = { 5, 1, 3, 3, 0, 3 };
    lm_tensor lt2 = { LM_F32, 1, E, l2 };
    lm_moe_params p = { E, 2, true, g, u, d, NULL, LM_GLU_SILU };
    be->ops->moe(be, &yt, &xt, &lt2, &p);
    double w0 = 1.0 / (1.0 + exp(-2.0)), w2 = 1.0 - w0;
    LM_CHECK_NEAR(ys[2], act * (w0 * 1 + w2 * 3), 1e-6);
    lm_backend_destroy(be);
}
