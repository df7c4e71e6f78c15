/* cpu_delta.c - the Gated DeltaNet ops of the CPU backend (Qwen3.5 and
 * Qwen3-Next linear attention): conv1d_state, delta_gates, gated_delta,
 * rms_norm_gated and sigmoid_mul. Semantics are in lm_backend.h.
 *
 * Sequences. The recurrent ops walk each sequence's tokens in batch order
 * (asserting consecutive positions) and keep its state in its slot of the
 * pool. Work items are (sequence, channel block) for the convolution and
 * (sequence, value head) for the delta rule, dealt out by
 * lm_cpu_parallel_for; an item finds its sequence's tokens by scanning the
 * batch, which costs O(T) per item and needs no allocation. Every item owns
 * disjoint state and output, so results do not depend on the thread count.
 *
 * The delta rule has two forms. A sequence with one token in the batch
 * (decoding) takes the recurrent step: with alpha = exp(g),
 *   u = beta (v - alpha S^T k);  o = alpha S^T q + (q.k) u;  S = alpha S + k u^T
 * (two passes over S: one read, one read-write). Several tokens (a prefill
 * chunk, a verify forward) go through the chunked form, LM_DELTA_CHUNK tokens at a time:
 * with G_i the cumulative log decay inside the chunk and S0 its initial
 * state, every token's update u_i solves the unit lower-triangular system
 *   u_i + sum_{j<i} beta_i e^{G_i-G_j} (k_i.k_j) u_j = beta_i v_i - beta_i e^{G_i} S0^T k_i
 * so u = W_v - W_k S0 with W_v, W_k found by forward substitution; then
 *   o_i = e^{G_i} S0^T q_i + sum_{j<=i} e^{G_i-G_j} (q_i.k_j) u_j
 *   S   = e^{G_n} S0 + sum_j e^{G_n-G_j} k_j u_j^T.
 * Both forms are the same sums in another order; decay ratios are always
 * exponents of differences (<= 0), so nothing overflows however strong the
 * decay. Sums of squares and cumulative decays are double; the rest is f32
 * with f32 accumulation, the inner loops in the ISA's attention kernels
 * (cpu_kern.h: dot products with a run of rows, o += sum_j p[j] row_j). */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

#define LM_DELTA_CHUNK 64  /* tokens per chunk of the chunked form */
#define LM_CONV_MAX_K 16   /* conv kernel bound (on-stack window) */
#define LM_CONV_BLOCK 64   /* channels per convolution work item */

/* ---- sequences and their state -------------------------------------------- */

/* The first token of sequence s at or after index `from` (T if none). */
static int lm_seq_next(const lm_attn_batch *b, int s, int from) {
    for (int t = from; t < b->n_tokens; t++)
        if (b->seq[t] == s) return t;
    return b->n_tokens;
}

static float *lm_slot_at(const lm_kv_pool *kv, lm_state_ref r, int32_t slot) {
    LM_ASSERT(slot >= 0 && slot < kv->n_state_slots);
    return kv->state[r.index] + (int64_t)slot * kv->state_floats[r.index] + r.offset;
}

static float *lm_state_at(const lm_kv_pool *kv, lm_state_ref r, const lm_attn_batch *b, int s) {
    return lm_slot_at(kv, r, b->state_slot[s]);
}

/* The slot that receives the state after token t (lm_attn_batch.state_out), -1: none. */
static int32_t lm_state_out(const lm_attn_batch *b, int t) { return b->state_out ? b->state_out[t] : -1; }

/* ---- silu ---------------------------------------------------------------------- */

/* y = x * sigmoid(x) on n values, with the ISA's exp of non-positive
 * arguments (attn_exp, m = 0): e = exp(-|x|), sigmoid(x) = 1 / (1 + e) for
 * x >= 0 and e / (1 + e) below, so no exponent is positive (and e is 0
 * below LM_ATT_EXP_CUT: silu(x) is 0 for x < -64). tmp holds n floats; y
 * may be x. */
static void lm_silu_vec(const lm_cpu_kern *k, float *y, const float *x, int n, float *tmp) {
    for (int i = 0; i < n; i++) tmp[i] = -fabsf(x[i]);
    k->attn_exp(tmp, n, 0.0f);
    for (int i = 0; i < n; i++) {
        float e = tmp[i], s = (x[i] >= 0.0f ? 1.0f : e) / (1.0f + e);
        y[i] = x[i] * s;
    }
}

/* ---- conv1d_state ------------------------------------------------------------ */

typedef struct lm_conv_ctx {
    const lm_cpu_kern *k;
    float *y;
    const float *x, *w; /* [T][C], [C][K] */
    int64_t C, n_blk;
    int K;
    const lm_kv_pool *kv;
    lm_state_ref st;
    const lm_attn_batch *b;
    bool silu;
} lm_conv_ctx;

/* Channels [c0, c0+nc) of one sequence. The last K-1 inputs live on the
 * stack in a ring (oldest at `head`), seeded from the state and written back
 * oldest first after the sequence's last token. Rows are LM_CONV_BLOCK wide
 * whatever nc is (zero-padded), so the loops have a constant trip count and
 * vectorise. */
static void lm_conv_item(const lm_conv_ctx *c, int s, int64_t c0, int64_t nc) {
    enum { BW = LM_CONV_BLOCK };
    const lm_attn_batch *b = c->b;
    const int K = c->K, W = K - 1, T = b->n_tokens;
    int t = lm_seq_next(b, s, 0);
    if (t == T) return;
    float *st = lm_state_at(c->kv, c->st, b, s) + c0;
    float win[LM_CONV_MAX_K][BW], wt[LM_CONV_MAX_K][BW], xb[BW], acc[BW], tmp[BW];
    memset(wt, 0, sizeof wt);
    memset(win, 0, sizeof win);
    memset(xb, 0, sizeof xb);
    for (int j = 0; j < K; j++)
        for (int64_t i = 0; i < nc; i++) wt[j][i] = c->w[(c0 + i) * K + j];
    if (b->pos[t] > 0)
        for (int j = 0; j < W; j++) memcpy(win[j], st + j * c->C, (size_t)nc * sizeof(float));
    int head = 0;
    int32_t prev = b->pos[t] - 1;
    for (; t < T; t = lm_seq_next(b, s, t + 1)) {
        LM_ASSERT(b->pos[t] == prev + 1);
        prev = b->pos[t];
        memcpy(xb, c->x + t * c->C + c0, (size_t)nc * sizeof(float));
        for (int i = 0; i < BW; i++) acc[i] = wt[K - 1][i] * xb[i];
        for (int j = 0; j < W; j++) {
            const float *wr = wt[j], *hr = win[(head + j) % W];
            for (int i = 0; i < BW; i++) acc[i] += wr[i] * hr[i];
        }
        if (c->silu) lm_silu_vec(c->k, acc, acc, BW, tmp); /* padded lanes: silu(0) */
        memcpy(c->y + t * c->C + c0, acc, (size_t)nc * sizeof(float));
        if (W > 0) {
            memcpy(win[head], xb, sizeof xb);
            head = (head + 1) % W;
        }
        const int32_t out = lm_state_out(b, t);
        if (out >= 0) { /* the window after t, oldest first, as the state holds it */
            float *o = lm_slot_at(c->kv, c->st, out) + c0;
            for (int j = 0; j < W; j++) memcpy(o + j * c->C, win[(head + j) % W], (size_t)nc * sizeof(float));
        }
    }
    for (int j = 0; j < W; j++) memcpy(st + j * c->C, win[(head + j) % W], (size_t)nc * sizeof(float));
}

static void lm_conv_range(void *v, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const lm_conv_ctx *c = v;
    for (int64_t i = i0; i < i1; i++) {
        int64_t c0 = (i % c->n_blk) * LM_CONV_BLOCK;
        lm_conv_item(c, (int)(i / c->n_blk), c0, LM_MIN(LM_CONV_BLOCK, c->C - c0));
    }
}

void lm_cpu_conv1d_state(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w,
                         lm_kv_pool *kv, lm_state_ref state, const lm_attn_batch *b, bool silu) {
    const int64_t C = x->cols;
    const int K = (int)w->cols;
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && w->type == LM_F32);
    LM_ASSERT(x->rows == b->n_tokens && y->rows == x->rows && y->cols == C && w->rows == C);
    LM_ASSERT(K >= 1 && K <= LM_CONV_MAX_K && y->data != x->data);
    lm_check_state_ref(kv, state, b, (int64_t)(K - 1) * C);
    lm_cpu *cpu = lm_cpu_get(be);
    lm_conv_ctx c = { cpu->k, y->data, x->data, w->data, C, (C + LM_CONV_BLOCK - 1) / LM_CONV_BLOCK, K, kv, state, b,
                      silu };
    int64_t per_item = (int64_t)(b->n_tokens / LM_MAX(b->n_seqs, 1) + 1) * LM_CONV_BLOCK * (K + 8);
    lm_cpu_parallel_for(cpu, (int64_t)b->n_seqs * c.n_blk, per_item, lm_conv_range, &c);
}

/* ---- delta_gates --------------------------------------------------------------- */

typedef struct lm_gates_ctx {
    float *g, *beta;
    const float *a_log, *dt_bias;
    int64_t H;
} lm_gates_ctx;

/* softplus as torch computes it (threshold 20: linear above). */
static double lm_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

static void lm_gates_range(void *v, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const lm_gates_ctx *c = v;
    for (int64_t i = i0; i < i1; i++) {
        int64_t h = i % c->H;
        c->g[i] = (float)(-exp((double)c->a_log[h]) * lm_softplus((double)c->g[i] + c->dt_bias[h]));
        c->beta[i] = (float)(1.0 / (1.0 + exp(-(double)c->beta[i])));
    }
}

void lm_cpu_delta_gates(lm_backend *be, lm_tensor *g, lm_tensor *beta, const lm_tensor *a_log,
                        const lm_tensor *dt_bias) {
    LM_ASSERT(g->type == LM_F32 && beta->type == LM_F32 && a_log->type == LM_F32 && dt_bias->type == LM_F32);
    LM_ASSERT(beta->rows == g->rows && beta->cols == g->cols);
    LM_ASSERT(a_log->rows * a_log->cols == g->cols && dt_bias->rows * dt_bias->cols == g->cols);
    lm_gates_ctx c = { g->data, beta->data, a_log->data, dt_bias->data, g->cols };
    lm_cpu_parallel_for(lm_cpu_get(be), g->rows * g->cols, 60, lm_gates_range, &c);
}

/* ---- gated_delta ----------------------------------------------------------------- */

typedef struct lm_delta_ctx {
    const lm_cpu_kern *k;
    float *out;
    const float *qkv, *g, *beta;
    int64_t qkv_cols, out_cols;
    const lm_kv_pool *kv;
    const lm_attn_batch *b;
    const lm_delta_params *p;
    float *const *scratch; /* per thread */
} lm_delta_ctx;

/* dst = src / sqrt(sum src^2 + 1e-6) * scale (FLA's l2norm, then q's 1/sqrt(Dk)). */
static void lm_l2norm(float *dst, const float *src, int n, double scale) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)src[i] * src[i];
    float f = (float)(scale / sqrt(ss + 1e-6));
    for (int i = 0; i < n; i++) dst[i] = src[i] * f;
}

/* Column offsets of head h's q, k and v in a qkv row. */
static void lm_delta_cols(const lm_delta_params *p, int h, int64_t *qo, int64_t *ko, int64_t *vo) {
    int hk = p->v_tiled ? h % p->n_k_heads : h / (p->n_v_heads / p->n_k_heads);
    *qo = (int64_t)hk * p->k_dim;
    *ko = (int64_t)p->n_k_heads * p->k_dim + *qo;
    *vo = 2 * (int64_t)p->n_k_heads * p->k_dim + (int64_t)h * p->v_dim;
}

/* The inner loops use the ISA's kernel table: dot products of one vector
 * with a run of rows (attn_scores, scale 1) and o += sum_j p[j] row_j
 * (attn_accum), so S^T x, the forward substitution and the rank updates
 * all stream rows of S or of the chunk's matrices through registers. */

/* One token of head h: the recurrent form. S [Dk][Dv]. */
static void lm_delta_step(const lm_delta_ctx *c, float *S, int t, int h, float *work) {
    const lm_delta_params *p = c->p;
    const lm_cpu_kern *k = c->k;
    const int Dk = p->k_dim, Dv = p->v_dim;
    int64_t qo, ko, vo;
    lm_delta_cols(p, h, &qo, &ko, &vo);
    const float *row = c->qkv + (int64_t)t * c->qkv_cols;
    float *q = work, *kk = q + Dk, *sk = kk + Dk, *sq = sk + Dv;
    lm_l2norm(q, row + qo, Dk, 1.0 / sqrt((double)Dk));
    lm_l2norm(kk, row + ko, Dk, 1.0);
    const int64_t gi = (int64_t)t * p->n_v_heads + h;
    const float alpha = (float)exp((double)c->g[gi]), beta = c->beta[gi];
    memset(sk, 0, 2 * (size_t)Dv * sizeof(float));
    k->attn_accum(sk, kk, S, Dv, Dk, Dv); /* S^T k */
    k->attn_accum(sq, q, S, Dv, Dk, Dv);  /* S^T q */
    float qk;
    k->attn_scores(q, kk, 0, 1, Dk, 1.0f, &qk);
    const float *vt = row + vo;
    float *o = c->out + (int64_t)t * c->out_cols + (int64_t)h * Dv;
    for (int v = 0; v < Dv; v++) {
        float u = beta * (vt[v] - alpha * sk[v]);
        sk[v] = u;
        o[v] = alpha * sq[v] + qk * u;
    }
    k->scal(S, alpha, (int64_t)Dk * Dv);
    for (int d = 0; d < Dk; d++) k->attn_accum(S + (int64_t)d * Dv, &kk[d], sk, 0, 1, Dv);
}

/* Scratch floats one thread needs for the chunked form. */
static size_t lm_delta_scratch(int Dk, int Dv) {
    const size_t CH = LM_DELTA_CHUNK;
    return CH * (4 * (size_t)Dk + 2 * (size_t)Dv) + 2 * CH * CH + 4 * CH + 2 * ((size_t)Dk + Dv) + 64;
}

/* n <= LM_DELTA_CHUNK tokens idx[] of one sequence, head h: the chunked form.
 * The strictly lower system is kept negated (An = -A) and so is W_k
 * (Wn = -W_k), so that every update is an accumulation. */
static void lm_delta_chunk(const lm_delta_ctx *c, float *S, const int *idx, int n, int h, float *work) {
    const lm_delta_params *p = c->p;
    const lm_cpu_kern *k = c->k;
    const int Dk = p->k_dim, Dv = p->v_dim, CH = LM_DELTA_CHUNK;
    int64_t qo, ko, vo;
    lm_delta_cols(p, h, &qo, &ko, &vo);
    float *Q = work, *K = Q + CH * Dk, *Wn = K + CH * Dk; /* [CH][Dk] each */
    float *KT = Wn + CH * Dk;                             /* [Dk][CH] decayed keys, transposed */
    float *U = KT + (size_t)Dk * CH, *O = U + CH * Dv;    /* [CH][Dv] each */
    float *An = O + CH * Dv, *Aqk = An + CH * CH;         /* [CH][CH] each */
    float *beta = Aqk + CH * CH, *eg = beta + CH, *dn = eg + CH, *qe = dn + CH; /* qe [Dk] */
    double G[LM_DELTA_CHUNK];
    const double qscale = 1.0 / sqrt((double)Dk);
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        const float *row = c->qkv + (int64_t)idx[i] * c->qkv_cols;
        lm_l2norm(Q + i * Dk, row + qo, Dk, qscale);
        lm_l2norm(K + i * Dk, row + ko, Dk, 1.0);
        const int64_t gi = (int64_t)idx[i] * p->n_v_heads + h;
        beta[i] = c->beta[gi];
        cum += c->g[gi];
        G[i] = cum;
        eg[i] = (float)exp(cum);
    }
    for (int j = 0; j < n; j++) dn[j] = (float)exp(G[n - 1] - G[j]);
    /* An: minus the strictly lower system; Aqk: decayed q.k, lower with the diagonal */
    for (int i = 0; i < n; i++) {
        float *ai = An + i * CH, *qi = Aqk + i * CH;
        k->attn_scores(K + i * Dk, K, Dk, i, Dk, 1.0f, ai);
        k->attn_scores(Q + i * Dk, K, Dk, i + 1, Dk, 1.0f, qi);
        for (int j = 0; j <= i; j++) {
            float decay = (float)exp(G[i] - G[j]);
            if (j < i) ai[j] *= -beta[i] * decay;
            qi[j] *= decay;
        }
    }
    /* forward substitution: U = W_v = (I + A)^-1 beta v, Wn = -W_k = -(I + A)^-1 beta e^G k */
    for (int i = 0; i < n; i++) {
        const float *vt = c->qkv + (int64_t)idx[i] * c->qkv_cols + vo;
        float *ui = U + i * Dv, *wi = Wn + i * Dk;
        const float bk = -beta[i] * eg[i];
        for (int v = 0; v < Dv; v++) ui[v] = beta[i] * vt[v];
        for (int d = 0; d < Dk; d++) wi[d] = bk * K[i * Dk + d];
        k->attn_accum(ui, An + i * CH, U, Dv, i, Dv);
        k->attn_accum(wi, An + i * CH, Wn, Dk, i, Dk);
    }
    /* with S0: u_i = W_v,i - S0^T W_k,i and o_i = e^{G_i} S0^T q_i + sum_{j<=i} Aqk_ij u_j */
    for (int i = 0; i < n; i++) {
        float *ui = U + i * Dv, *oi = O + i * Dv;
        k->attn_accum(ui, Wn + i * Dk, S, Dv, Dk, Dv);
        for (int d = 0; d < Dk; d++) qe[d] = eg[i] * Q[i * Dk + d];
        memset(oi, 0, (size_t)Dv * sizeof(float));
        k->attn_accum(oi, qe, S, Dv, Dk, Dv);
    }
    for (int i = 0; i < n; i++) {
        float *oi = O + i * Dv;
        k->attn_accum(oi, Aqk + i * CH, U, Dv, i + 1, Dv);
        memcpy(c->out + (int64_t)idx[i] * c->out_cols + (int64_t)h * Dv, oi, (size_t)Dv * sizeof(float));
    }
    /* the state after the chunk: S = e^{G_n} S0 + sum_j e^{G_n - G_j} k_j u_j^T */
    for (int d = 0; d < Dk; d++)
        for (int j = 0; j < n; j++) KT[d * CH + j] = dn[j] * K[j * Dk + d];
    k->scal(S, eg[n - 1], (int64_t)Dk * Dv);
    for (int d = 0; d < Dk; d++) k->attn_accum(S + (int64_t)d * Dv, KT + d * CH, U, Dv, n, Dv);
}

/* Sequence s, value head h: all of its tokens in this batch. */
static void lm_delta_item(const lm_delta_ctx *c, int s, int h, float *work) {
    const lm_attn_batch *b = c->b;
    const lm_delta_params *p = c->p;
    const int T = b->n_tokens;
    int t = lm_seq_next(b, s, 0);
    if (t == T) return;
    const int64_t hs = (int64_t)p->k_dim * p->v_dim;
    float *S = lm_state_at(c->kv, p->state, b, s) + h * hs;
    if (b->pos[t] == 0) memset(S, 0, (size_t)hs * sizeof(float));
    int32_t prev = b->pos[t] - 1;
    if (lm_seq_next(b, s, t + 1) == T) { /* decoding: one token */
        lm_delta_step(c, S, t, h, work);
        return;
    }
    /* A chunk ends at a token whose state is asked for (state_out), which
     * is then copied out; a chunk of one token takes the recurrent step, so
     * a verify forward that asks after every token computes what decoding
     * one token at a time would. */
    bool emits = false;
    for (int u = t; u < T && !emits; u = lm_seq_next(b, s, u + 1)) emits = lm_state_out(b, u) >= 0;
    int idx[LM_DELTA_CHUNK];
    while (t < T) {
        int n = 0;
        int32_t out = -1;
        for (; t < T && n < LM_DELTA_CHUNK && out < 0; t = lm_seq_next(b, s, t + 1)) {
            LM_ASSERT(b->pos[t] == prev + 1);
            prev = b->pos[t];
            idx[n++] = t;
            out = lm_state_out(b, t);
        }
        if (n == 1 && emits) lm_delta_step(c, S, idx[0], h, work);
        else lm_delta_chunk(c, S, idx, n, h, work);
        if (out >= 0) memcpy(lm_slot_at(c->kv, p->state, out) + h * hs, S, (size_t)hs * sizeof(float));
    }
}

static void lm_delta_range(void *v, int64_t i0, int64_t i1, int ith) {
    const lm_delta_ctx *c = v;
    const int Hv = c->p->n_v_heads;
    for (int64_t i = i0; i < i1; i++) lm_delta_item(c, (int)(i / Hv), (int)(i % Hv), c->scratch[ith]);
}

void lm_cpu_gated_delta(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g,
                        const lm_tensor *beta, lm_kv_pool *kv, const lm_attn_batch *b,
                        const lm_delta_params *p) {
    lm_cpu *c = lm_cpu_get(be);
    const int Hv = p->n_v_heads, Dk = p->k_dim, Dv = p->v_dim;
    lm_check_gated_delta(out, qkv, g, beta, kv, b, p);
    lm_cpu_reserve(c, lm_delta_scratch(Dk, Dv) * sizeof(float));
    lm_delta_ctx d = { c->k, out->data, qkv->data, g->data, beta->data, qkv->cols, out->cols, kv, b, p, c->scratch };
    int64_t per_item = (int64_t)(b->n_tokens / LM_MAX(b->n_seqs, 1) + 1) * 4 * Dk * Dv;
    lm_cpu_parallel_for(c, (int64_t)b->n_seqs * Hv, per_item, lm_delta_range, &d);
}

/* ---- rms_norm_gated, sigmoid_mul ------------------------------------------------- */

typedef struct lm_gnorm_ctx {
    const lm_cpu_kern *k;
    float *y;
    const float *x, *z, *w;
    int64_t n;
    double eps;
} lm_gnorm_ctx;

#define LM_GNORM_MAX 4096 /* row width bound (on-stack silu buffers) */

static void lm_gnorm_range(void *v, int64_t r0, int64_t r1, int ith) {
    (void)ith;
    const lm_gnorm_ctx *c = v;
    float sz[LM_GNORM_MAX], tmp[LM_GNORM_MAX];
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = c->x + r * c->n, *zr = c->z + r * c->n;
        float *yr = c->y + r * c->n;
        double ss = 0.0;
        for (int64_t i = 0; i < c->n; i++) ss += (double)xr[i] * xr[i];
        double s = 1.0 / sqrt(ss / (double)c->n + c->eps);
        lm_silu_vec(c->k, sz, zr, (int)c->n, tmp);
        for (int64_t i = 0; i < c->n; i++) yr[i] = (float)((double)xr[i] * s * c->w[i]) * sz[i];
    }
}

void lm_cpu_rms_norm_gated(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *z,
                           const lm_tensor *w, float eps) {
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && z->type == LM_F32 && w->type == LM_F32);
    LM_ASSERT(w->rows == 1 && w->cols > 0 && w->cols <= LM_GNORM_MAX && x->cols % w->cols == 0);
    LM_ASSERT(y->rows == x->rows && y->cols == x->cols && z->rows == x->rows && z->cols == x->cols);
    lm_cpu *cpu = lm_cpu_get(be);
    lm_gnorm_ctx c = { cpu->k, y->data, x->data, z->data, w->data, w->cols, eps };
    lm_cpu_parallel_for(cpu, x->rows * (x->cols / w->cols), 30 * w->cols, lm_gnorm_range, &c);
}

typedef struct lm_sigmul_ctx {
    float *y;
    const float *x, *gate;
    int64_t cols, gcols;
} lm_sigmul_ctx;

static void lm_sigmul_range(void *v, int64_t r0, int64_t r1, int ith) {
    (void)ith;
    const lm_sigmul_ctx *c = v;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = c->x + r * c->cols, *gr = c->gate + r * c->gcols;
        float *yr = c->y + r * c->cols;
        if (c->gcols == 1) {
            float s = 1.0f / (1.0f + expf(-gr[0]));
            for (int64_t i = 0; i < c->cols; i++) yr[i] = xr[i] * s;
        } else {
            for (int64_t i = 0; i < c->cols; i++) yr[i] = xr[i] / (1.0f + expf(-gr[i]));
        }
    }
}

void lm_cpu_sigmoid_mul(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *gate) {
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && gate->type == LM_F32);
    LM_ASSERT(y->rows == x->rows && y->cols == x->cols && gate->rows == x->rows);
    LM_ASSERT(gate->cols == 1 || gate->cols == x->cols);
    lm_sigmul_ctx c = { y->data, x->data, gate->data, x->cols, gate->cols };
    lm_cpu_parallel_for(lm_cpu_get(be), x->rows, 20 * x->cols, lm_sigmul_range, &c);
}
