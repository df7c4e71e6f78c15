/* cpu_matmul.c - y[T][O] = x[T][I] W[O][I]^T (+ bias) on the CPU.
 *
 * Two drivers, one kernel table (cpu_kern.h):
 *
 * GEMV, for few tokens (decode): the weight is streamed from memory exactly
 * once. Threads own contiguous ranges of output rows; each step takes
 * gemv_rows rows and runs them against the tokens in tiles of gemv_tokens, so
 * the rows are re-read from L1 rather than from memory. Dtypes without a
 * native GEMV kernel (all quants; bf16/f16 on the scalar path) are first
 * widened row by row into per-thread scratch with lm_dequant_row, then go
 * through the f32 kernel: exact widening, same f32 accumulation.
 *
 * GEMM, for many tokens (prefill): classic three-level blocking. The work is
 * cut into units of MC tokens x NC outputs, handed out through an atomic
 * counter so a preempted thread does not stall the others. Inside a unit, for
 * each KC-slice of the inner dimension, the activations are packed into
 * mr-token tiles [kc][mr] (L2-resident) and each nr-output panel of the weight
 * is widened to f32 and packed as [kc][nr] (L1-resident), then reused by every
 * token tile through the register-blocked micro-kernel. A weight value is
 * widened once per MC tokens, so its cost vanishes against the 2*MC flops it
 * feeds. KC is a multiple of 256, so quantised rows are cut on block
 * boundaries and packed through the same lm_dequant_row path. */
#include "cpu_impl.h"

#include <stdatomic.h>
#include <string.h>

#define LM_MM_MC 256 /* tokens per GEMM unit */
#define LM_MM_NC 256 /* outputs per GEMM unit */

typedef struct lm_mm {
    const lm_cpu_kern *k;
    lm_cpu *c;
    float *y;
    const float *x, *bias;
    const char *w;
    lm_dtype wt;
    size_t ldw; /* bytes per weight row */
    int64_t T, O, I;
    /* GEMM */
    int64_t n_tb, n_cb; /* token blocks, column blocks */
    atomic_llong next;
} lm_mm;

static void lm_mm_widen(const lm_cpu_kern *k, lm_dtype t, const void *src, float *dst, int64_t n) {
    if (k->to_f32[t]) k->to_f32[t](src, dst, n);
    else lm_dequant_row(t, src, dst, n);
}

/* ---- GEMV -------------------------------------------------------------- */

static void lm_mm_gemv_range(void *v, int64_t u0, int64_t u1, int ith) {
    const lm_mm *m = v;
    const lm_cpu_kern *k = m->k;
    const int R = k->gemv_rows, NT = k->gemv_tokens;
    const bool native = k->gemv[m->wt] != NULL;
    lm_gemv_fn fn = native ? k->gemv[m->wt] : k->gemv[LM_F32];
    float *rows = m->c->scratch[ith]; /* [R][I] widened rows when !native */
    for (int64_t u = u0; u < u1; u++) {
        int64_t r0 = u * R;
        int nr = (int)LM_MIN((int64_t)R, m->O - r0);
        const void *wp = m->w + (size_t)r0 * m->ldw;
        size_t ld = m->ldw;
        if (!native) {
            for (int r = 0; r < nr; r++)
                lm_mm_widen(k, m->wt, m->w + (size_t)(r0 + r) * m->ldw, rows + r * m->I, m->I);
            wp = rows;
            ld = (size_t)m->I * sizeof(float);
        }
        for (int64_t t0 = 0; t0 < m->T; t0 += NT) {
            int nt = (int)LM_MIN((int64_t)NT, m->T - t0);
            fn(wp, ld, nr, m->x + t0 * m->I, m->I, nt, m->I, m->bias ? m->bias + r0 : NULL,
               m->y + t0 * m->O + r0, m->O);
        }
    }
}

static void lm_mm_gemv(lm_mm *m) {
    const lm_cpu_kern *k = m->k;
    if (!k->gemv[m->wt]) lm_cpu_reserve(m->c, (size_t)k->gemv_rows * (size_t)m->I * sizeof(float));
    int64_t units = (m->O + k->gemv_rows - 1) / k->gemv_rows;
    lm_cpu_parallel_for(m->c, units, 2 * k->gemv_rows * m->I * m->T, lm_mm_gemv_range, m);
}

/* ---- GEMM -------------------------------------------------------------- */

/* xp[tile][kc][mr] <- x[t0 .. t0+mt)[k0 .. k0+kc), zero-padded to whole tiles. */
static void lm_mm_pack_x(const lm_mm *m, float *xp, int64_t t0, int64_t mt, int64_t k0, int64_t kc) {
    const int MR = m->k->mr;
    for (int64_t tile = 0; tile * MR < mt; tile++) {
        float *dst = xp + tile * kc * MR;
        for (int r = 0; r < MR; r++) {
            int64_t t = tile * MR + r;
            if (t < mt) {
                const float *src = m->x + (t0 + t) * m->I + k0;
                for (int64_t kk = 0; kk < kc; kk++) dst[kk * MR + r] = src[kk];
            } else {
                for (int64_t kk = 0; kk < kc; kk++) dst[kk * MR + r] = 0.0f;
            }
        }
    }
}

/* wp[kc][nr] <- W[o0 .. o0+nv)[k0 .. k0+kc) widened to f32, zero-padded. */
static void lm_mm_pack_w(const lm_mm *m, float *wp, float *tmp, int64_t o0, int nv, int64_t k0,
                         int64_t kc) {
    const int NR = m->k->nr;
    size_t koff = lm_dtype_row_bytes(m->wt, k0);
    for (int r = 0; r < NR; r++) {
        if (r < nv) {
            lm_mm_widen(m->k, m->wt, m->w + (size_t)(o0 + r) * m->ldw + koff, tmp, kc);
            for (int64_t kk = 0; kk < kc; kk++) wp[kk * NR + r] = tmp[kk];
        } else {
            for (int64_t kk = 0; kk < kc; kk++) wp[kk * NR + r] = 0.0f;
        }
    }
}

static size_t lm_mm_scratch_floats(const lm_cpu_kern *k) {
    size_t mc = (LM_MM_MC + (size_t)k->mr - 1) / (size_t)k->mr * (size_t)k->mr;
    /* x tiles + one weight panel + one widened row, each rounded to 64 B */
    return mc * (size_t)k->kc + (size_t)k->kc * (size_t)k->nr + (size_t)k->kc + 32;
}

static void lm_mm_gemm_worker(void *v, int ith, int nth) {
    (void)nth;
    lm_mm *m = v;
    const lm_cpu_kern *k = m->k;
    const int MR = k->mr, NR = k->nr;
    const int64_t KC = k->kc;
    size_t mc_pad = (LM_MM_MC + (size_t)MR - 1) / (size_t)MR * (size_t)MR;
    float *xp = m->c->scratch[ith];
    float *wp = xp + mc_pad * (size_t)KC;
    float *tmp = wp + (size_t)KC * (size_t)NR;
    const int64_t n_units = m->n_tb * m->n_cb;
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&m->next, 1, memory_order_relaxed);
        if (u >= n_units) break;
        /* Column blocks vary fastest, so concurrent units share x tiles in L3. */
        int64_t t0 = (u / m->n_cb) * LM_MM_MC, o0 = (u % m->n_cb) * LM_MM_NC;
        int64_t mt = LM_MIN((int64_t)LM_MM_MC, m->T - t0), nc = LM_MIN((int64_t)LM_MM_NC, m->O - o0);
        for (int64_t k0 = 0; k0 < m->I; k0 += KC) {
            int64_t kc = LM_MIN(KC, m->I - k0);
            lm_mm_pack_x(m, xp, t0, mt, k0, kc);
            for (int64_t p0 = 0; p0 < nc; p0 += NR) {
                int nv = (int)LM_MIN((int64_t)NR, nc - p0);
                lm_mm_pack_w(m, wp, tmp, o0 + p0, nv, k0, kc);
                const float *bias = m->bias ? m->bias + o0 + p0 : NULL;
                for (int64_t tt = 0; tt < mt; tt += MR) {
                    int mtt = (int)LM_MIN((int64_t)MR, mt - tt);
                    k->gemm(xp + tt * kc, wp, kc, m->y + (t0 + tt) * m->O + o0 + p0, m->O, mtt, nv,
                            bias, k0 == 0);
                }
            }
        }
    }
}

static void lm_mm_gemm(lm_mm *m) {
    lm_cpu_reserve(m->c, lm_mm_scratch_floats(m->k) * sizeof(float));
    m->n_tb = (m->T + LM_MM_MC - 1) / LM_MM_MC;
    m->n_cb = (m->O + LM_MM_NC - 1) / LM_MM_NC;
    atomic_init(&m->next, 0);
    if (m->c->n_threads == 1 || m->n_tb * m->n_cb == 1) lm_mm_gemm_worker(m, 0, 1);
    else lm_pool_run(m->c->pool, lm_mm_gemm_worker, m);
}

/* ---- entry ------------------------------------------------------------- */

void lm_cpu_matmul(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w,
                   const lm_tensor *bias) {
    lm_cpu *c = lm_cpu_get(be);
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32);
    LM_ASSERT((unsigned)w->type < LM_DTYPE_COUNT && w->type != LM_I32);
    LM_ASSERT(x->cols == w->cols && y->rows == x->rows && y->cols == w->rows);
    LM_ASSERT(!bias || (bias->type == LM_F32 && bias->rows * bias->cols == w->rows));
    LM_ASSERT(y->data != x->data || x->rows == 0);
    lm_mm m = {
        .k = c->k,
        .c = c,
        .y = y->data,
        .x = x->data,
        .bias = bias ? bias->data : NULL,
        .w = w->data,
        .wt = w->type,
        .ldw = lm_dtype_row_bytes(w->type, w->cols),
        .T = x->rows,
        .O = w->rows,
        .I = w->cols,
    };
    if (m.T == 0 || m.O == 0) return;
    if (m.I == 0) {
        for (int64_t t = 0; t < m.T; t++)
            for (int64_t o = 0; o < m.O; o++) m.y[t * m.O + o] = m.bias ? m.bias[o] : 0.0f;
        return;
    }
    if (m.T < c->k->gemm_min_tokens) lm_mm_gemv(&m);
    else lm_mm_gemm(&m);
}
