/* cpu_moe.c - mixture-of-experts feed-forward on the CPU (the moe op).
 *
 * Three steps (semantics in lm_backend.h, lm_moe_params):
 *
 * 1. Route: per token, the top-k experts by router logit (ties: lowest index
 *    first) and their weights: the softmax over all E logits, in double,
 *    optionally renormalised over the k chosen, optionally scaled per expert.
 * 2. Group: a counting sort of the T*k (token, expert) pairs by expert, tokens
 *    in ascending order within each expert. A token picks an expert at most
 *    once, so one expert's tokens are distinct rows.
 * 3. Run: for each expert that has tokens, in ascending expert order, gather
 *    its tokens' rows, run the expert's three matmuls once over all of them
 *    (lm_cpu_matmul: GEMV for a few tokens, GEMM for many, any weight dtype),
 *    and add weight * output into the tokens' rows of y. Prefill of T tokens
 *    thus reads each expert's weights once, not once per token. The order of
 *    the sum for a token (zero, then its experts in ascending index) is
 *    transformers' (index_add_ per expert) and does not depend on which other
 *    tokens share the batch.
 *
 * Memory: one grow-only workspace on lm_cpu (routing arrays plus gathered
 * rows for at most T tokens), so steady-state decoding does not allocate.
 * The matmuls inside use the per-thread scratch as usual, which is why the
 * workspace is separate from it. */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

/* Grows the op workspace (caller thread only, outside parallel regions). */
static void *lm_moe_work(lm_cpu *c, size_t bytes) {
    if (bytes > c->work_bytes) {
        bytes = (bytes + 4095) & ~(size_t)4095;
        lm_afree(c->work);
        c->work = lm_xaligned(bytes);
        c->work_bytes = bytes;
    }
    return c->work;
}

/* ---- routing ------------------------------------------------------------- */

typedef struct lm_moe_route_ctx {
    const float *logits; /* [T][E] */
    const float *scale;  /* [E] or NULL */
    int E, k;
    bool norm;
    int32_t *sel; /* [T][k] expert ids, by descending logit */
    float *wsel;  /* [T][k] weights */
} lm_moe_route_ctx;

static void lm_moe_route_range(void *v, int64_t t0, int64_t t1, int ith) {
    (void)ith;
    const lm_moe_route_ctx *c = v;
    for (int64_t t = t0; t < t1; t++)
        lm_moe_route(c->logits + t * c->E, c->scale, c->E, c->k, c->norm, c->sel + t * c->k, c->wsel + t * c->k);
}

/* ---- scatter ------------------------------------------------------------- */

typedef struct lm_moe_add_ctx {
    float *y;         /* [T][D] */
    const float *o;   /* [n][D] expert outputs */
    const int32_t *tok;
    const float *w;
    int64_t D;
} lm_moe_add_ctx;

static void lm_moe_add_range(void *v, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const lm_moe_add_ctx *c = v;
    for (int64_t i = i0; i < i1; i++) {
        float *yr = c->y + (int64_t)c->tok[i] * c->D;
        const float *orow = c->o + i * c->D;
        float w = c->w[i];
        for (int64_t d = 0; d < c->D; d++) yr[d] += w * orow[d];
    }
}

/* ---- entry --------------------------------------------------------------- */

void lm_cpu_moe(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                const lm_moe_params *p) {
    lm_cpu *c = lm_cpu_get(be);
    const int64_t T = x->rows, D = x->cols;
    const int E = p->n_experts, k = p->top_k;
    lm_check_moe(y, x, router_logits, p);
    const int64_t F = p->gate[0].rows;
    if (T == 0) return;
    memset(y->data, 0, (size_t)T * (size_t)D * sizeof(float));

    /* Workspace: [T*k] sel, tok, wsel, wt; [E + 1] start; [T][D] xe, oe; [T][F] ge, ue. */
    const size_t TK = (size_t)T * (size_t)k;
    size_t ints = 2 * TK + (size_t)E + 1, floats = 2 * TK + 2 * (size_t)T * (size_t)(D + F);
    size_t ints_bytes = (ints * sizeof(int32_t) + 63) & ~(size_t)63;
    char *ws = lm_moe_work(c, ints_bytes + floats * sizeof(float));
    int32_t *sel = (int32_t *)ws, *tok = sel + TK, *start = tok + TK;
    float *wsel = (float *)(ws + ints_bytes), *wt = wsel + TK;
    float *xe = wt + TK, *oe = xe + T * D, *ge = oe + T * D, *ue = ge + T * F;

    lm_moe_route_ctx rc = { router_logits->data, p->expert_scale ? p->expert_scale->data : NULL,
                            E, k, p->norm_topk, sel, wsel };
    lm_cpu_parallel_for(c, T, 20 * (int64_t)E * k, lm_moe_route_range, &rc);

    /* Counting sort by expert; tokens stay ascending within an expert.
     * start[e] runs as the fill cursor and ends at the run's end. */
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (size_t i = 0; i < TK; i++) start[sel[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e = sel[t * k + j];
            int32_t at = start[e]++;
            tok[at] = (int32_t)t;
            wt[at] = wsel[t * k + j];
        }
    /* start[e] now holds the end of expert e's run; shift back. */
    for (int e = E; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;

    for (int e = 0; e < E; e++) {
        int32_t n = start[e + 1] - start[e];
        if (n == 0) continue;
        const int32_t *te = tok + start[e];
        lm_tensor xt = { .type = LM_F32, .rows = n, .cols = D, .data = xe };
        lm_tensor gt = { .type = LM_F32, .rows = n, .cols = F, .data = ge };
        lm_tensor ut = { .type = LM_F32, .rows = n, .cols = F, .data = ue };
        lm_tensor ot = { .type = LM_F32, .rows = n, .cols = D, .data = oe };
        lm_cpu_gather_rows(be, &xt, x, te, n);
        lm_cpu_matmul(be, &gt, &xt, &p->gate[e], NULL);
        lm_cpu_matmul(be, &ut, &xt, &p->up[e], NULL);
        if (p->act == LM_GLU_SILU) lm_cpu_silu_mul(be, &gt, &gt, &ut);
        else lm_cpu_gelu_mul(be, &gt, &gt, &ut, p->act == LM_GLU_GELU_TANH);
        lm_cpu_matmul(be, &ot, &gt, &p->down[e], NULL);
        lm_moe_add_ctx ac = { y->data, oe, te, wt + start[e], D };
        lm_cpu_parallel_for(c, n, 2 * D, lm_moe_add_range, &ac);
    }
}
