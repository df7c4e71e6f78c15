/* test_cpu_delta.c - the Gated DeltaNet ops of the CPU backend against plain
 * double-precision references written here (the token-by-token recurrence
 * of lm_backend.h, the causal convolution as a sum).
 *
 * Batches mix sequences on purpose: interleaved tokens, slots out of order,
 * one sequence decoding a single token (the recurrent form), one crossing
 * two chunk boundaries (the chunked form), sequences that continue from a
 * saved state and sequences that start at position 0 in a slot full of
 * garbage (which must be ignored). Splitting one sequence into pieces of any
 * size must give what one forward gives. Every op runs on every ISA the
 * machine has (inner loops and silu's exp come from the kernel table).
 *
 * Tolerances: conv1d_state, delta_gates, rms_norm_gated and sigmoid_mul 1e-5
 * relative (f32 arithmetic on O(1) values); gated_delta 2e-6 absolute on
 * outputs and states of size O(1) against the double recurrence, and 2e-6
 * between the chunked and recurrent forms (observed: ~1e-7 for both). */
#include "lm_test.h"

#include "backend/lm_backend.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

static float dt_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void dt_fill(float *p, size_t n, uint64_t *s, float lo, float hi) {
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * 0.5f * (dt_rnd(s) + 1.0f);
}

static lm_tensor dt_tensor(lm_backend *be, int64_t rows, int64_t cols, const float *host) {
    lm_tensor t;
    LM_ASSERT(lm_tensor_alloc(be, &t, rows, cols) == 0);
    if (host) be->ops->write(be, t.data, host, (size_t)(rows * cols) * sizeof(float));
    return t;
}

static double dt_maxdiff(const float *a, const double *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* A state pool of one tensor with n_slots slots of `floats` each. */
typedef struct dt_pool {
    lm_kv_pool kv;
    int64_t floats;
    float *state;
} dt_pool;

static void dt_pool_init(dt_pool *p, lm_backend *be, int n_slots, int64_t floats) {
    memset(p, 0, sizeof *p);
    p->floats = floats;
    p->state = be->ops->alloc(be, (size_t)(n_slots * floats) * sizeof(float));
    p->kv.n_state = 1;
    p->kv.n_state_slots = n_slots;
    p->kv.state_floats = &p->floats;
    p->kv.state = &p->state;
}

/* A batch of sequences: sequence s has n[s] tokens from position pos0[s] in
 * slot slot[s]; tokens are dealt round-robin so sequences interleave. */
typedef struct dt_batch {
    int T, S;
    int32_t pos[1024], seq[1024], slot[8];
    lm_attn_batch b;
} dt_batch;

static void dt_batch_make(dt_batch *d, int S, const int *n, const int *pos0, const int *slot) {
    memset(d, 0, sizeof *d);
    d->S = S;
    int total = 0;
    for (int s = 0; s < S; s++) total += n[s];
    LM_ASSERT(S <= 8 && total <= 1024);
    d->T = lm_tu_round_robin(S, n, pos0, d->pos, d->seq);
    for (int s = 0; s < S; s++) d->slot[s] = slot[s];
    d->b = (lm_attn_batch){ .n_tokens = d->T, .pos = d->pos, .seq = d->seq, .n_seqs = S, .state_slot = d->slot };
}

/* ---- references ----------------------------------------------------------- */

/* One token of the gated delta rule, all heads, in double. S [Hv][Dk][Dv].
 * Value head h reads key head h / (Hv / Hk), or h % Hk when tiled. */
static void ref_delta_token(double *S, const float *qkv, const float *gv, const float *bv, int Hk, int Hv,
                            int Dk, int Dv, bool tiled, double *o) {
    for (int h = 0; h < Hv; h++) {
        int hk = tiled ? h % Hk : h / (Hv / Hk);
        const float *q = qkv + hk * Dk, *k = qkv + Hk * Dk + hk * Dk, *v = qkv + 2 * Hk * Dk + h * Dv;
        double qn = 0, kn = 0, qq[256], kk[256];
        for (int d = 0; d < Dk; d++) {
            qn += (double)q[d] * q[d];
            kn += (double)k[d] * k[d];
        }
        for (int d = 0; d < Dk; d++) {
            qq[d] = q[d] / sqrt(qn + 1e-6) / sqrt((double)Dk);
            kk[d] = k[d] / sqrt(kn + 1e-6);
        }
        double *Sh = S + (size_t)h * Dk * Dv, a = exp((double)gv[h]), beta = bv[h];
        for (int i = 0; i < Dk * Dv; i++) Sh[i] *= a;
        for (int e = 0; e < Dv; e++) {
            double mem = 0;
            for (int d = 0; d < Dk; d++) mem += Sh[d * Dv + e] * kk[d];
            double delta = (v[e] - mem) * beta;
            for (int d = 0; d < Dk; d++) Sh[d * Dv + e] += kk[d] * delta;
        }
        for (int e = 0; e < Dv; e++) {
            double acc = 0;
            for (int d = 0; d < Dk; d++) acc += Sh[d * Dv + e] * qq[d];
            o[h * Dv + e] = acc;
        }
    }
}

/* ---- gated_delta ----------------------------------------------------------- */

enum { HK = 2, HV = 4, DK = 12, DV = 10, QKV = 2 * HK * DK + HV * DV, OFF = 7 };
#define DT_HS ((int64_t)HV * DK * DV)

/* Runs the op on batch d with random inputs from seed (value heads grouped
 * or tiled); checks outputs and the final states against the double
 * recurrence started from the pool's content. Returns the worst error. */
static double check_delta_batch(lm_test_ctx *lm_t_, lm_backend *be, dt_pool *pool, dt_batch *d, uint64_t seed,
                                float g_lo, bool tiled) {
    const int T = d->T;
    float *qkv = malloc(sizeof(float) * T * QKV), *g = malloc(sizeof(float) * T * HV),
          *beta = malloc(sizeof(float) * T * HV), *out = malloc(sizeof(float) * T * HV * DV);
    dt_fill(qkv, (size_t)T * QKV, &seed, -1, 1);
    dt_fill(g, (size_t)T * HV, &seed, g_lo, 0);
    dt_fill(beta, (size_t)T * HV, &seed, 0, 1);
    /* reference states: copy of each sequence's slot (zero when it starts at 0) */
    double *rs = calloc((size_t)d->S * DT_HS, sizeof(double)), *ro = calloc((size_t)T * HV * DV, sizeof(double));
    for (int s = 0; s < d->S; s++) {
        int t0 = 0;
        while (d->seq[t0] != s) t0++;
        const float *slot = pool->state + d->slot[s] * pool->floats + OFF;
        for (int64_t i = 0; i < DT_HS; i++) rs[s * DT_HS + i] = d->pos[t0] == 0 ? 0.0 : slot[i];
    }
    for (int t = 0; t < T; t++)
        ref_delta_token(rs + d->seq[t] * DT_HS, qkv + t * QKV, g + t * HV, beta + t * HV, HK, HV, DK, DV, tiled,
                        ro + (size_t)t * HV * DV);
    lm_tensor tq = dt_tensor(be, T, QKV, qkv), tg = dt_tensor(be, T, HV, g), tb = dt_tensor(be, T, HV, beta);
    lm_tensor to = dt_tensor(be, T, HV * DV, NULL);
    lm_delta_params p = { HK, HV, DK, DV, { 0, OFF }, tiled };
    be->ops->gated_delta(be, &to, &tq, &tg, &tb, &pool->kv, &d->b, &p);
    be->ops->read(be, out, to.data, sizeof(float) * T * HV * DV);
    double err = dt_maxdiff(out, ro, (size_t)T * HV * DV);
    for (int s = 0; s < d->S; s++) {
        double e = dt_maxdiff(pool->state + d->slot[s] * pool->floats + OFF, rs + s * DT_HS, DT_HS);
        err = e > err ? e : err;
    }
    LM_CHECK_MSG(err <= 2e-6, "gated_delta (%s value heads) vs double recurrence: %g", tiled ? "tiled" : "grouped",
                 err);
    lm_tensor_release(be, &tq);
    lm_tensor_release(be, &tg);
    lm_tensor_release(be, &tb);
    lm_tensor_release(be, &to);
    free(qkv), free(g), free(beta), free(out), free(rs), free(ro);
    return err;
}

/* Every ISA this machine has (the op's inner loops are the kernel table's). */
static const lm_cpu_isa dt_isas[] = { LM_ISA_SCALAR, LM_ISA_AVX2, LM_ISA_AVX512 };

LM_TEST(hybrid_delta_mixed_batch_vs_reference) {
    for (size_t ii = 0; ii < LM_COUNT(dt_isas) * 3; ii++) {
        lm_cpu_isa isa = dt_isas[ii / 3];
        int threads = 1 + (int)(ii % 3);
        if (isa > lm_cpu_isa_detect()) continue; /* not on this CPU */
        lm_backend *be = lm_cpu_backend_create(threads, isa, NULL);
        LM_REQUIRE(be);
        dt_pool pool;
        dt_pool_init(&pool, be, 6, OFF + DT_HS + 3);
        uint64_t s = 99;
        float *host = malloc(sizeof(float) * 6 * pool.floats);
        dt_fill(host, 6 * (size_t)pool.floats, &s, -0.5f, 0.5f); /* saved states and garbage */
        be->ops->write(be, pool.state, host, sizeof(float) * 6 * pool.floats);
        /* decode 1 token (pos 40), a 150-token prefill from 0 (chunks 64+64+22),
         * 5 tokens continuing at 17, and 70 tokens continuing at 3 */
        int n[] = { 1, 150, 5, 70 }, pos0[] = { 40, 0, 17, 3 }, slot[] = { 3, 0, 5, 1 };
        dt_batch d;
        dt_batch_make(&d, 4, n, pos0, slot);
        check_delta_batch(lm_t_, be, &pool, &d, 7 + ii, -2.0f, false);
        /* strong decay (state mostly forgotten within a token): still finite and exact */
        check_delta_batch(lm_t_, be, &pool, &d, 11, -60.0f, false);
        /* value heads in GGUF's tiled order (lm_delta_params.v_tiled) */
        check_delta_batch(lm_t_, be, &pool, &d, 13 + ii, -2.0f, true);
        /* untouched slots keep their content */
        LM_CHECK(memcmp(pool.state + 2 * pool.floats, host + 2 * pool.floats, sizeof(float) * pool.floats) == 0);
        LM_CHECK(memcmp(pool.state + 4 * pool.floats, host + 4 * pool.floats, sizeof(float) * pool.floats) == 0);
        free(host);
        be->ops->free(be, pool.state);
        lm_backend_destroy(be);
    }
}

/* One sequence of 200 tokens fed as one forward, token by token, and in
 * uneven pieces: same outputs and same final state. */
static void split_case(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    enum { N = 200 };
    if (isa > lm_cpu_isa_detect()) return;
    lm_backend *be = lm_cpu_backend_create(2, isa, NULL);
    LM_REQUIRE(be);
    uint64_t s = 5;
    float *qkv = malloc(sizeof(float) * N * QKV), *g = malloc(sizeof(float) * N * HV), *beta = malloc(sizeof(float) * N * HV);
    dt_fill(qkv, (size_t)N * QKV, &s, -1, 1);
    dt_fill(g, (size_t)N * HV, &s, -1.5f, 0);
    dt_fill(beta, (size_t)N * HV, &s, 0, 1);
    const int splits[3][16] = {
        { N },
        { 0 }, /* token by token */
        { 1, 7, 64, 65, 3, 60 },
    };
    float *outs[3], *states[3];
    for (int k = 0; k < 3; k++) {
        dt_pool pool;
        dt_pool_init(&pool, be, 1, OFF + DT_HS);
        outs[k] = malloc(sizeof(float) * N * HV * DV);
        int done = 0;
        for (int piece = 0; done < N; piece++) {
            int n = k == 1 ? 1 : splits[k][piece];
            dt_batch d;
            int zero = 0;
            dt_batch_make(&d, 1, &n, &done, &zero);
            lm_tensor tq = dt_tensor(be, n, QKV, qkv + done * QKV), tg = dt_tensor(be, n, HV, g + done * HV);
            lm_tensor tb = dt_tensor(be, n, HV, beta + done * HV), to = dt_tensor(be, n, HV * DV, NULL);
            lm_delta_params p = { HK, HV, DK, DV, { 0, OFF }, false };
            be->ops->gated_delta(be, &to, &tq, &tg, &tb, &pool.kv, &d.b, &p);
            be->ops->read(be, outs[k] + done * HV * DV, to.data, sizeof(float) * n * HV * DV);
            lm_tensor_release(be, &tq);
            lm_tensor_release(be, &tg);
            lm_tensor_release(be, &tb);
            lm_tensor_release(be, &to);
            done += n;
        }
        states[k] = pool.state;
    }
    for (int k = 1; k < 3; k++) {
        double e = 0, es = 0;
        for (int i = 0; i < N * HV * DV; i++) e = fmax(e, fabs(outs[k][i] - outs[0][i]));
        for (int i = 0; i < DT_HS; i++) es = fmax(es, fabs(states[k][OFF + i] - states[0][OFF + i]));
        LM_CHECK_MSG(e <= 2e-6 && es <= 2e-6, "split %d: outputs differ by %g, states by %g", k, e, es);
    }
    for (int k = 0; k < 3; k++) {
        free(outs[k]);
        be->ops->free(be, states[k]);
    }
    free(qkv), free(g), free(beta);
    lm_backend_destroy(be);
}

LM_TEST(hybrid_delta_split_equals_whole) {
    for (size_t i = 0; i < LM_COUNT(dt_isas); i++) split_case(lm_t_, dt_isas[i]);
}

/* ---- conv1d_state -------------------------------------------------------------- */

LM_TEST(hybrid_conv1d_state_vs_reference) {
    enum { C = 150, K = 4 };
    for (size_t ii = 0; ii < LM_COUNT(dt_isas); ii++) {
        int threads = 1 + (int)ii;
        if (dt_isas[ii] > lm_cpu_isa_detect()) continue;
        lm_backend *be = lm_cpu_backend_create(threads, dt_isas[ii], NULL);
        LM_REQUIRE(be);
        dt_pool pool;
        const int64_t off = 5, sf = (K - 1) * C;
        dt_pool_init(&pool, be, 4, off + sf + 2);
        uint64_t s = 3 + threads;
        float *host = malloc(sizeof(float) * 4 * pool.floats);
        dt_fill(host, 4 * (size_t)pool.floats, &s, -1, 1);
        be->ops->write(be, pool.state, host, sizeof(float) * 4 * pool.floats);
        int n[] = { 1, 20, 2 }, pos0[] = { 9, 0, 1 }, slot[] = { 2, 3, 0 };
        dt_batch d;
        dt_batch_make(&d, 3, n, pos0, slot);
        const int T = d.T;
        float *x = malloc(sizeof(float) * T * C), *w = malloc(sizeof(float) * C * K), *y = malloc(sizeof(float) * T * C);
        dt_fill(x, (size_t)T * C, &s, -2, 2);
        dt_fill(w, (size_t)C * K, &s, -1, 1);
        lm_tensor tx = dt_tensor(be, T, C, x), tw = dt_tensor(be, C, K, w), ty = dt_tensor(be, T, C, NULL);
        for (int silu = 0; silu <= 1; silu++) {
            be->ops->write(be, pool.state, host, sizeof(float) * 4 * pool.floats);
            be->ops->conv1d_state(be, &ty, &tx, &tw, &pool.kv, (lm_state_ref){ 0, off }, &d.b, silu);
            be->ops->read(be, y, ty.data, sizeof(float) * T * C);
            double err = 0;
            for (int sq = 0; sq < 3; sq++) {
                /* the sequence's inputs, oldest first: K-1 from the state (or zeros), then its tokens */
                double hist[64][C];
                const float *st = host + slot[sq] * pool.floats + off;
                for (int j = 0; j < K - 1; j++)
                    for (int c = 0; c < C; c++) hist[j][c] = pos0[sq] == 0 ? 0.0 : st[j * C + c];
                int m = K - 1;
                for (int t = 0; t < T; t++) {
                    if (d.seq[t] != sq) continue;
                    for (int c = 0; c < C; c++) hist[m][c] = x[t * C + c];
                    m++;
                    for (int c = 0; c < C; c++) {
                        double acc = 0;
                        for (int j = 0; j < K; j++) acc += (double)w[c * K + j] * hist[m - K + j][c];
                        if (silu) acc = acc / (1 + exp(-acc));
                        err = fmax(err, fabs(acc - y[t * C + c]) / (1 + fabs(acc)));
                    }
                }
                const float *ns = pool.state + slot[sq] * pool.floats + off;
                for (int j = 0; j < K - 1; j++)
                    for (int c = 0; c < C; c++) err = fmax(err, fabs(ns[j * C + c] - hist[m - (K - 1) + j][c]));
            }
            LM_CHECK_MSG(err <= 1e-5, "conv1d_state (silu %d, %d threads): %g", silu, threads, err);
            /* the slot nobody uses is untouched */
            LM_CHECK(memcmp(pool.state + 1 * pool.floats, host + 1 * pool.floats, sizeof(float) * pool.floats) == 0);
        }
        lm_tensor_release(be, &tx);
        lm_tensor_release(be, &tw);
        lm_tensor_release(be, &ty);
        free(x), free(w), free(y), free(host);
        be->ops->free(be, pool.state);
        lm_backend_destroy(be);
    }
}

/* ---- element-wise ops ------------------------------------------------------------ */

static void gates_norm_sigmoid(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    enum { T = 17, H = 6, DV2 = 24 };
    if (isa > lm_cpu_isa_detect()) return;
    lm_backend *be = lm_cpu_backend_create(2, isa, NULL);
    LM_REQUIRE(be);
    uint64_t s = 1;
    float a[T * H], b[T * H], alog[H], dtb[H], r[T * H * DV2];
    dt_fill(a, T * H, &s, -30, 30); /* crosses softplus' threshold of 20 */
    dt_fill(b, T * H, &s, -8, 8);
    dt_fill(alog, H, &s, -3, 2.7f);
    dt_fill(dtb, H, &s, -1, 1);
    lm_tensor ta = dt_tensor(be, T, H, a), tb = dt_tensor(be, T, H, b), tl = dt_tensor(be, 1, H, alog),
              td = dt_tensor(be, 1, H, dtb);
    be->ops->delta_gates(be, &ta, &tb, &tl, &td);
    be->ops->read(be, r, ta.data, sizeof a);
    double err = 0;
    for (int i = 0; i < T * H; i++) {
        double x = (double)a[i] + dtb[i % H], sp = x > 20 ? x : log1p(exp(x));
        double want = -exp((double)alog[i % H]) * sp;
        err = fmax(err, fabs(r[i] - want) / (1 + fabs(want)));
    }
    be->ops->read(be, r, tb.data, sizeof b);
    for (int i = 0; i < T * H; i++) err = fmax(err, fabs(r[i] - 1 / (1 + exp(-(double)b[i]))));
    LM_CHECK_MSG(err <= 1e-6, "delta_gates: %g", err);

    /* rms_norm_gated over heads of width DV2 */
    float x[T * H * DV2], z[T * H * DV2], w[DV2], g1[T];
    dt_fill(x, T * H * DV2, &s, -3, 3);
    dt_fill(z, T * H * DV2, &s, -6, 6);
    dt_fill(w, DV2, &s, 0.5f, 1.5f);
    dt_fill(g1, T, &s, -5, 5);
    lm_tensor tx = dt_tensor(be, T, H * DV2, x), tz = dt_tensor(be, T, H * DV2, z), tw = dt_tensor(be, 1, DV2, w);
    lm_tensor ty = dt_tensor(be, T, H * DV2, NULL), tg1 = dt_tensor(be, T, 1, g1);
    be->ops->rms_norm_gated(be, &ty, &tx, &tz, &tw, 1e-6f);
    be->ops->read(be, r, ty.data, sizeof r);
    err = 0;
    for (int row = 0; row < T * H; row++) {
        double ss = 0;
        for (int i = 0; i < DV2; i++) ss += (double)x[row * DV2 + i] * x[row * DV2 + i];
        double sc = 1 / sqrt(ss / DV2 + 1e-6);
        for (int i = 0; i < DV2; i++) {
            double zz = z[row * DV2 + i], want = x[row * DV2 + i] * sc * w[i] * zz / (1 + exp(-zz));
            err = fmax(err, fabs(r[row * DV2 + i] - want) / (1 + fabs(want)));
        }
    }
    LM_CHECK_MSG(err <= 1e-5, "rms_norm_gated: %g", err);

    /* sigmoid_mul, per element and one gate per row, in place */
    be->ops->sigmoid_mul(be, &ty, &tx, &tz);
    be->ops->read(be, r, ty.data, sizeof r);
    err = 0;
    for (int i = 0; i < T * H * DV2; i++) err = fmax(err, fabs(r[i] - x[i] / (1 + exp(-(double)z[i]))));
    be->ops->sigmoid_mul(be, &tx, &tx, &tg1);
    be->ops->read(be, r, tx.data, sizeof r);
    for (int i = 0; i < T * H * DV2; i++) err = fmax(err, fabs(r[i] - x[i] / (1 + exp(-(double)g1[i / (H * DV2)]))));
    LM_CHECK_MSG(err <= 1e-5, "sigmoid_mul: %g", err);
    lm_tensor *all[] = { &ta, &tb, &tl, &td, &tx, &tz, &tw, &ty, &tg1 };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lm_tensor_release(be, all[i]);
    lm_backend_destroy(be);
}

LM_TEST(hybrid_delta_gates_norm_sigmoid) {
    for (size_t i = 0; i < LM_COUNT(dt_isas); i++) gates_norm_sigmoid(lm_t_, dt_isas[i]);
}
