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
 * through the f32 kernel: exact widening, same f32 accumulation. Unless the
 * backend is in exact mode, quants with an int8 kernel (lm_cpu_qkern) instead
 * have their activation rows rounded once per call to q8x blocks, on the
 * caller's thread into grow-only scratch, and every thread dots its rows
 * against those in integers: the weight bytes are read as stored, and the
 * loop is bound by memory, not by widening. Default on: same as llama.cpp's
 * CPU path, ~0.3% relative error per dot, greedy output unchanged on the
 * GGUF fixtures (tests/test_cpu_qdot.c measures both).
 *
 * GEMM, for many tokens (prefill): cache blocking around a register-blocked
 * micro-kernel. The work is cut into units of MC tokens x NC outputs, handed
 * out through an atomic counter so that a preempted thread does not stall
 * the others. Inside a unit, for each KC-slice of the inner dimension, each
 * nr-output panel of the weight is widened to f32 and packed as [kc][nr]
 * (64 KB, vectorised transposes in the ISA files), then swept over all MC
 * tokens of the unit in mr-token tiles that read the activations in place;
 * panel and x slice stay in L2 (a larger kc measured faster than an
 * L1-sized panel: fewer passes over y). A weight value is widened once per MC
 * tokens, so its cost vanishes against the 2*MC flops it feeds. KC is a
 * multiple of 256, so quantised rows are cut on block boundaries: they are
 * widened with lm_dequant_row into scratch and packed by the f32 packer.
 *
 * int8 GEMM, for many tokens on quant weights with an int8 tile (not in
 * exact mode): the same units, but the activation rows are rounded to q8x
 * once per call (spread over the threads, with each block's scale and code
 * sums as the tile's f32 factors), each 32-row panel of a 512-value k-slice
 * is unpacked to u8 codes with per-block scales and offsets (cpu_qblock.c,
 * 24 KB, stays in L1) and swept by the integer tile over the unit's
 * tokens: a weight block is decoded once per up to 512 tokens and read
 * from L1 by every tile of tokens. The products are those of the int8
 * GEMV (same q8x integers), so a batch prefill and a token-by-token one
 * differ only by f32 rounding before the q8x rounding.
 *
 * matmul_n (q, k, v; gate and up for matmul_glu): on the int8 paths x is
 * rounded once and the units of all the weights go through one hand-out
 * (one counter for the GEMM, one parallel loop for the GEMV), so a narrow
 * weight shares the threads with a wide one instead of being cut into
 * short units alone; each output is computed as by its own matmul. */
#include "cpu_impl.h"
#include "cpu_qblock.h"

#include <stdatomic.h>
#include <string.h>

#ifndef LM_MM_MC
#define LM_MM_MC 512 /* tokens per GEMM unit (at most) */
#endif
#ifndef LM_MM_NC
#define LM_MM_NC 128 /* outputs per GEMM unit */
#endif
#ifndef LM_MM_QKC
#define LM_MM_QKC 512 /* int8 GEMM k-slice: a 32 x 512 panel is 24 KB (L1) */
#endif

typedef struct lm_mm lm_mm;
/* Where the next panel of a unit lies (nv 0: none), to be prefetched. */
typedef struct lm_mm_next {
    int64_t o0, k0, kc;
    int nv;
} lm_mm_next;

/* One panel of a GEMM unit: packs outputs o0 .. o0+nv of the k-slice
 * [k0, k0+kc) and sweeps the unit's tokens t0 .. t0+mt over it, after
 * asking for the next panel's weights. */
typedef void (*lm_mm_panel_fn)(const lm_mm *m, int ith, int64_t t0, int64_t mt, int64_t o0, int nv,
                               lm_mm_next next, int64_t k0, int64_t kc);

struct lm_mm {
    const lm_cpu_kern *k;
    lm_cpu *c;
    float *y;
    const float *x, *bias;
    const char *w;
    lm_dtype wt;
    size_t ldw; /* bytes per weight row */
    int64_t T, O, I;
    /* GEMM */
    lm_mm_panel_fn panel;
    int mr, nr;         /* register tile: tokens, outputs (the panel width) */
    int64_t kc;         /* k-slice */
    size_t ldq;         /* int8 path: bytes per q8x row; block factors follow the rows */
    const float *xf;
    int64_t mc, nc;     /* tokens, outputs per unit */
    int64_t n_tb, n_cb; /* token blocks, column blocks */
    atomic_llong next;
};

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

/* ---- int8-activation GEMV ---------------------------------------------- */

/* Row units [u0, u1) of m (LM_GEMV_MAX_ROWS rows each) against the q8x rows. */
static void lm_mm_qgemv_units(const lm_mm *m, int64_t u0, int64_t u1) {
    const int R = LM_GEMV_MAX_ROWS, NT = LM_GEMV_MAX_TOKENS;
    lm_qgemv_fn fn = m->c->qk->qgemv[m->wt];
    size_t ldq = lm_q8x_row_bytes(m->I);
    for (int64_t u = u0; u < u1; u++) {
        int64_t r0 = u * R;
        int nr = (int)LM_MIN((int64_t)R, m->O - r0);
        const void *wp = m->w + (size_t)r0 * m->ldw;
        for (int64_t t0 = 0; t0 < m->T; t0 += NT) {
            int nt = (int)LM_MIN((int64_t)NT, m->T - t0);
            fn(wp, m->ldw, nr, (const char *)m->c->qx + (size_t)t0 * ldq, ldq, nt, m->I,
               m->bias ? m->bias + r0 : NULL, m->y + t0 * m->O + r0, m->O);
        }
    }
}

static void lm_mm_qgemv_range(void *v, int64_t u0, int64_t u1, int ith) {
    (void)ith;
    lm_mm_qgemv_units(v, u0, u1);
}

/* Makes the grow-only q8x buffer at least `need` bytes. Caller thread. */
static void lm_mm_qx_reserve(lm_cpu *c, size_t need) {
    if (need > c->qx_bytes) {
        lm_afree(c->qx);
        c->qx_bytes = (need + 4095) & ~(size_t)4095;
        c->qx = lm_xaligned(c->qx_bytes);
    }
}

/* One activation row to q8x, by the ISA's routine where the int8 table has
 * one (bit-exact with the portable lm_q8x_quantize). */
static void lm_mm_q8x(const lm_cpu *c, const float *x, int64_t n, void *dst) {
    if (c->qk->q8x_quantize) c->qk->q8x_quantize(x, n, dst);
    else lm_q8x_quantize(x, n, dst);
}

/* x's rows to q8x into c->qx (the int8 GEMV's activations). */
static void lm_mm_qgemv_round(lm_mm *m) {
    lm_cpu *c = m->c;
    size_t ldq = lm_q8x_row_bytes(m->I);
    lm_mm_qx_reserve(c, ldq * (size_t)m->T);
    for (int64_t t = 0; t < m->T; t++) lm_mm_q8x(c, m->x + t * m->I, m->I, (char *)c->qx + (size_t)t * ldq);
}

static void lm_mm_qgemv(lm_mm *m) {
    lm_mm_qgemv_round(m);
    int64_t units = (m->O + LM_GEMV_MAX_ROWS - 1) / LM_GEMV_MAX_ROWS;
    lm_cpu_parallel_for(m->c, units, 2 * LM_GEMV_MAX_ROWS * m->I * m->T, lm_mm_qgemv_range, m);
}

static void lm_mm_gemv(lm_mm *m) {
    const lm_cpu_kern *k = m->k;
    if (m->c->qk && m->c->qk->qgemv[m->wt]) {
        lm_mm_qgemv(m);
        return;
    }
    if (!k->gemv[m->wt]) lm_cpu_reserve(m->c, (size_t)k->gemv_rows * (size_t)m->I * sizeof(float));
    int64_t units = (m->O + k->gemv_rows - 1) / k->gemv_rows;
    lm_cpu_parallel_for(m->c, units, 2 * k->gemv_rows * m->I * m->T, lm_mm_gemv_range, m);
}

/* ---- GEMM -------------------------------------------------------------- */

/* wp[kc][nr] <- W[o0 .. o0+nv)[k0 .. k0+kc) as f32, zero-padded; dtypes
 * without a packer are widened into tmp ([nr][KC]) first. */
static void lm_mm_pack_w(const lm_mm *m, float *wp, float *tmp, int64_t o0, int nv, int64_t k0,
                         int64_t kc) {
    const lm_cpu_kern *k = m->k;
    const char *src = m->w + (size_t)o0 * m->ldw + lm_dtype_row_bytes(m->wt, k0);
    if (k->pack[m->wt]) {
        k->pack[m->wt](src, m->ldw, nv, kc, wp);
        return;
    }
    for (int r = 0; r < nv; r++) lm_mm_widen(k, m->wt, src + (size_t)r * m->ldw, tmp + r * kc, kc);
    k->pack[LM_F32](tmp, (size_t)kc * sizeof(float), nv, kc, wp);
}

/* Asks for the next panel's weight slice while this one is packed and used:
 * a slice is nr short runs (kc values each), too short for the hardware
 * prefetchers to pick up, so without this small batches wait on DRAM (and
 * the packing of a unit's next k-slice did, when a unit is one panel wide). */
static void lm_mm_prefetch_w(const lm_mm *m, lm_mm_next n) {
    const char *src = m->w + (size_t)n.o0 * m->ldw + lm_dtype_row_bytes(m->wt, n.k0);
    size_t bytes = lm_dtype_row_bytes(m->wt, n.kc);
    for (int r = 0; r < n.nv; r++)
        for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(src + (size_t)r * m->ldw + b, 0, 2);
}

/* f32 panel: widen and pack the weights, then the f32 micro-kernel. */
static void lm_mm_panel_f32(const lm_mm *m, int ith, int64_t t0, int64_t mt, int64_t o0, int nv,
                            lm_mm_next next, int64_t k0, int64_t kc) {
    const lm_cpu_kern *k = m->k;
    float *wp = m->c->scratch[ith];
    float *tmp = wp + (size_t)k->kc * (size_t)k->nr;
    if (next.nv) lm_mm_prefetch_w(m, next);
    lm_mm_pack_w(m, wp, tmp, o0, nv, k0, kc);
    const float *bias = m->bias ? m->bias + o0 : NULL;
    for (int64_t tt = 0; tt < mt; tt += m->mr) {
        int mtt = (int)LM_MIN((int64_t)m->mr, mt - tt);
        k->gemm(m->x + (t0 + tt) * m->I + k0, m->I, wp, kc, m->y + (t0 + tt) * m->O + o0, m->O, mtt, nv,
                bias, k0 == 0);
    }
}

/* int8 panel: unpack the weight blocks once (cpu_qblock.c), then the int8
 * tile over the tokens' q8x rows. */
static void lm_mm_panel_q8(const lm_mm *m, int ith, int64_t t0, int64_t mt, int64_t o0, int nv,
                           lm_mm_next next, int64_t k0, int64_t kc) {
    const lm_cpu_qkern *qk = m->c->qk;
    uint8_t *panel = (uint8_t *)m->c->scratch[ith];
    int64_t b0 = k0 / LM_Q8X_BLOCK;
    int nb = (int)(kc / LM_Q8X_BLOCK);
    const int64_t ldf = 4 * (m->I / LM_Q8X_BLOCK);
    if (next.nv) lm_mm_prefetch_w(m, next);
    (qk->qpanel_pack ? qk->qpanel_pack : lm_qpanel_pack)(m->wt, m->w + (size_t)o0 * m->ldw, m->ldw, nv, b0, nb,
                                                         panel);
    const lm_qblock_type *qt = &lm_qblock_types[m->wt];
    const float *bias = m->bias ? m->bias + o0 : NULL;
    const int8_t *xq = m->c->qx;
    for (int64_t tt = 0; tt < mt; tt += m->mr) {
        int mtt = (int)LM_MIN((int64_t)m->mr, mt - tt);
        int64_t t = t0 + tt;
        qk->qgemm(panel, nb, qt, xq + (size_t)t * m->ldq + k0, m->ldq, m->xf + t * ldf + 4 * b0, ldf, mtt,
                  nv, m->y + t * m->O + o0, m->O, bias, k0 == 0);
    }
}

/* Unit (token block tb, column block cb) of m: every k-slice of its panels. */
static void lm_mm_unit(const lm_mm *m, int ith, int64_t tb, int64_t cb) {
    const int NR = m->nr;
    int64_t t0 = tb * m->mc, o0 = cb * m->nc;
    int64_t mt = LM_MIN(m->mc, m->T - t0), nc = LM_MIN(m->nc, m->O - o0);
    for (int64_t k0 = 0; k0 < m->I; k0 += m->kc) {
        int64_t kc = LM_MIN(m->kc, m->I - k0);
        for (int64_t p0 = 0; p0 < nc; p0 += NR) {
            int nv = (int)LM_MIN((int64_t)NR, nc - p0);
            /* the next panel: the next outputs of this k-slice, else the
             * first of the next k-slice */
            lm_mm_next next = { 0, 0, 0, 0 };
            if (p0 + NR < nc) next = (lm_mm_next){ o0 + p0 + NR, k0, kc, (int)LM_MIN((int64_t)NR, nc - p0 - NR) };
            else if (k0 + kc < m->I)
                next = (lm_mm_next){ o0, k0 + kc, LM_MIN(m->kc, m->I - k0 - kc), (int)LM_MIN((int64_t)NR, nc) };
            m->panel(m, ith, t0, mt, o0 + p0, nv, next, k0, kc);
        }
    }
}

static void lm_mm_gemm_worker(void *v, int ith, int nth) {
    (void)nth;
    lm_mm *m = v;
    const int64_t n_units = m->n_tb * m->n_cb;
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&m->next, 1, memory_order_relaxed);
        if (u >= n_units) break;
        /* Column blocks vary fastest, so concurrent units share x rows in L3. */
        lm_mm_unit(m, ith, u / m->n_cb, u % m->n_cb);
    }
}

/* Rounds rows [t0, t1) to q8x and writes their block factors (the int8
 * tile's xf: d, d * s0, d * s1, d * (s0 + s1) per block). */
static void lm_mm_q8_rows(void *v, int64_t t0, int64_t t1, int ith) {
    (void)ith;
    const lm_mm *m = v;
    const int64_t nb = m->I / LM_Q8X_BLOCK;
    for (int64_t t = t0; t < t1; t++) {
        void *row = (char *)m->c->qx + (size_t)t * m->ldq;
        lm_mm_q8x(m->c, m->x + t * m->I, m->I, row);
        const float *d = lm_q8x_d(row, m->I);
        const int16_t *s = lm_q8x_s(row, m->I);
        float *f = (float *)m->xf + t * 4 * nb;
        for (int64_t b = 0; b < nb; b++) {
            f[4 * b] = d[b];
            f[4 * b + 1] = d[b] * (float)s[2 * b];
            f[4 * b + 2] = d[b] * (float)s[2 * b + 1];
            f[4 * b + 3] = d[b] * (float)(s[2 * b] + s[2 * b + 1]);
        }
    }
}

/* Whether the int8 GEMM takes weights of type t: a tile, a packer, and
 * codes within the tile's reach. */
static bool lm_mm_int8_gemm(const lm_cpu *c, lm_dtype t) {
    return c->qk && c->qk->qgemm && lm_qblock_types[t].pack && lm_qblock_types[t].max_code <= c->qk->qgemm_max_code;
}

/* The panel kind of m's GEMM and its scratch; on the int8 path the
 * activations rounded to q8x (c->qx, shared by every weight on this x). */
static void lm_mm_gemm_prepare(lm_mm *m) {
    lm_cpu *c = m->c;
    if (lm_mm_int8_gemm(c, m->wt)) {
        m->panel = lm_mm_panel_q8;
        m->mr = c->qk->qgemm_mr;
        m->nr = LM_QP_ROWS;
        m->kc = LM_MM_QKC;
        m->ldq = lm_q8x_row_bytes(m->I);
        size_t rows = m->ldq * (size_t)m->T, xf = (size_t)m->T * (size_t)(m->I / LM_Q8X_BLOCK) * 4 * sizeof(float);
        lm_mm_qx_reserve(c, rows + xf);
        m->xf = (const float *)((char *)c->qx + rows);
        lm_cpu_reserve(c, (size_t)(LM_MM_QKC / LM_Q8X_BLOCK) * LM_QP_BLOCK_BYTES);
        lm_cpu_parallel_for(c, m->T, 4 * m->I, lm_mm_q8_rows, m);
    } else {
        m->panel = lm_mm_panel_f32;
        m->mr = m->k->mr;
        m->nr = m->k->nr;
        m->kc = m->k->kc;
        lm_cpu_reserve(c, 2 * (size_t)m->k->kc * (size_t)m->k->nr * sizeof(float)); /* panel + widened rows */
    }
}

/* Outputs (nc) and tokens (mc) a unit for the n weights of O[i] outputs
 * that share m's x and panel kind: until every thread has a few units to
 * take, fewer outputs a unit (int8 path, down to one panel), then fewer
 * tokens. A unit unpacks each of its panels once for its tokens, so cutting
 * the tokens repeats the unpacking: at 16 threads a 2,048-wide projection
 * had gone to 128-token units (4 unpackings a panel) and the k/v ones to 32
 * (16). Sets m's nc, mc, n_tb and n_cb (the column blocks of all n). */
static void lm_mm_shape(lm_mm *m, const int64_t *O, int n) {
    const int64_t want = 4 * (int64_t)m->c->n_threads;
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += O[i];
    m->nc = LM_MM_NC;
    m->mc = LM_MM_MC;
    for (;;) {
        int64_t n_cb = 0;
        for (int i = 0; i < n; i++) n_cb += (O[i] + m->nc - 1) / m->nc;
        m->n_tb = (m->T + m->mc - 1) / m->mc;
        m->n_cb = n_cb;
        if (n_cb * m->n_tb >= want) break;
        if (m->panel == lm_mm_panel_q8 && m->nc / 2 >= m->nr && (m->nc / 2) % m->nr == 0 && n_cb < total / m->nr)
            m->nc /= 2;
        else if (m->mc > 4 * m->mr) m->mc /= 2;
        else break;
    }
}

static void lm_mm_gemm(lm_mm *m) {
    lm_cpu *c = m->c;
    lm_mm_gemm_prepare(m);
    lm_mm_shape(m, &m->O, 1);
    atomic_init(&m->next, 0);
    if (c->n_threads == 1 || m->n_tb * m->n_cb == 1) lm_mm_gemm_worker(m, 0, 1);
    else lm_pool_run(c->pool, lm_mm_gemm_worker, m);
}

/* ---- several weights on one input (q, k, v; gate, up) ------------------ */

/* The weights' units in one count, column blocks of weight 0 first: one
 * rounding of x and one hand-out, so that a narrow weight (k, v) shares
 * the threads with a wide one instead of being cut into short units. */
#define LM_MM_SET_MAX 4
typedef struct lm_mm_set {
    lm_mm *mm;
    int n;
    int64_t cb0[LM_MM_SET_MAX + 1]; /* first column block of each weight */
    int64_t n_tb, n_cb;
    atomic_llong next;
} lm_mm_set;

static void lm_mm_set_worker(void *v, int ith, int nth) {
    (void)nth;
    lm_mm_set *st = v;
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&st->next, 1, memory_order_relaxed);
        if (u >= st->n_tb * st->n_cb) break;
        int64_t cb = u % st->n_cb;
        int i = 0;
        while (cb >= st->cb0[i + 1]) i++;
        lm_mm_unit(&st->mm[i], ith, u / st->n_cb, cb - st->cb0[i]);
    }
}

static void lm_mm_qgemv_set_range(void *v, int64_t u0, int64_t u1, int ith) {
    (void)ith;
    const lm_mm_set *st = v;
    for (int i = 0; i < st->n && u0 < u1; i++) { /* the part of [u0, u1) in weight i */
        int64_t a = LM_MAX(u0, st->cb0[i]), b = LM_MIN(u1, st->cb0[i + 1]);
        if (a < b) lm_mm_qgemv_units(&st->mm[i], a - st->cb0[i], b - st->cb0[i]);
    }
}

/* Decode: x rounded once, the weights' row units in one parallel loop. */
static void lm_mm_qgemv_set(lm_mm *mm, int n) {
    lm_mm_qgemv_round(&mm[0]);
    lm_mm_set st = { .mm = mm, .n = n };
    st.cb0[0] = 0;
    for (int i = 0; i < n; i++) st.cb0[i + 1] = st.cb0[i] + (mm[i].O + LM_GEMV_MAX_ROWS - 1) / LM_GEMV_MAX_ROWS;
    lm_cpu_parallel_for(mm[0].c, st.cb0[n], 2 * LM_GEMV_MAX_ROWS * mm[0].I * mm[0].T, lm_mm_qgemv_set_range, &st);
}

static void lm_mm_gemm_set(lm_mm *mm, int n) {
    lm_cpu *c = mm[0].c;
    lm_mm_gemm_prepare(&mm[0]);
    int64_t O[LM_MM_SET_MAX];
    for (int i = 0; i < n; i++) O[i] = mm[i].O;
    lm_mm_shape(&mm[0], O, n);
    lm_mm_set st = { .mm = mm, .n = n, .n_tb = mm[0].n_tb, .n_cb = mm[0].n_cb };
    st.cb0[0] = 0;
    for (int i = 0; i < n; i++) {
        lm_mm *m = &mm[i];
        if (i > 0) { /* x's rounding and the unit shape are weight 0's (lm_mm_unit reads them) */
            m->panel = mm[0].panel, m->mr = mm[0].mr, m->nr = mm[0].nr, m->kc = mm[0].kc;
            m->ldq = mm[0].ldq, m->xf = mm[0].xf, m->nc = mm[0].nc, m->mc = mm[0].mc;
        }
        st.cb0[i + 1] = st.cb0[i] + (m->O + m->nc - 1) / m->nc;
    }
    LM_ASSERT(st.cb0[n] == st.n_cb);
    atomic_init(&st.next, 0);
    if (c->n_threads == 1) lm_mm_set_worker(&st, 0, 1);
    else lm_pool_run(c->pool, lm_mm_set_worker, &st);
}

/* ---- entry ------------------------------------------------------------- */

static lm_mm lm_mm_make(lm_cpu *c, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias) {
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32);
    LM_ASSERT((unsigned)w->type < LM_DTYPE_COUNT && w->type != LM_I32);
    LM_ASSERT(x->cols == w->cols && y->rows == x->rows && y->cols == w->rows);
    LM_ASSERT(!bias || (bias->type == LM_F32 && bias->rows * bias->cols == w->rows));
    LM_ASSERT(y->data != x->data || x->rows == 0);
    return (lm_mm){
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
}

void lm_cpu_matmul(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w,
                   const lm_tensor *bias) {
    lm_cpu *c = lm_cpu_get(be);
    lm_mm m = lm_mm_make(c, y, x, w, bias);
    if (m.T == 0 || m.O == 0) return;
    if (m.I == 0) {
        for (int64_t t = 0; t < m.T; t++)
            for (int64_t o = 0; o < m.O; o++) m.y[t * m.O + o] = m.bias ? m.bias[o] : 0.0f;
        return;
    }
    if (m.T < c->k->gemm_min_tokens) lm_mm_gemv(&m);
    else lm_mm_gemm(&m);
}

/* As n matmuls; on weights the int8 GEMM (prefill) or GEMV (decode) takes,
 * x is rounded once and the weights' units go through one hand-out (the
 * same products, so the same bits as one by one). */
void lm_cpu_matmul_n(lm_backend *be, int n, lm_tensor *const *y, const lm_tensor *x, const lm_tensor *const *w,
                     const lm_tensor *const *bias) {
    lm_cpu *c = lm_cpu_get(be);
    const bool gemm = x->rows >= c->k->gemm_min_tokens;
    bool set = n >= 2 && n <= LM_MM_SET_MAX && x->rows > 0 && x->cols > 0 && c->qk;
    for (int i = 0; set && i < n; i++)
        set = w[i]->rows > 0 && (gemm ? lm_mm_int8_gemm(c, w[i]->type) : c->qk->qgemv[w[i]->type] != NULL);
    if (!set) {
        for (int i = 0; i < n; i++) lm_cpu_matmul(be, y[i], x, w[i], bias ? bias[i] : NULL);
        return;
    }
    lm_mm mm[LM_MM_SET_MAX];
    for (int i = 0; i < n; i++) mm[i] = lm_mm_make(c, y[i], x, w[i], bias ? bias[i] : NULL);
    if (gemm) lm_mm_gemm_set(mm, n);
    else lm_mm_qgemv_set(mm, n);
}

/* gate and up as one set, then the activation (as lm_op_matmul_glu composes it). */
void lm_cpu_matmul_glu(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *wg, const lm_tensor *wu,
                       lm_glu act, lm_tensor *gate_ws, lm_tensor *up_ws) {
    lm_tensor *ys[2] = { gate_ws, up_ws };
    const lm_tensor *ws[2] = { wg, wu };
    lm_cpu_matmul_n(be, 2, ys, x, ws, NULL);
    if (act == LM_GLU_SILU) be->ops->silu_mul(be, y, gate_ws, up_ws);
    else be->ops->gelu_mul(be, y, gate_ws, up_ws, act == LM_GLU_GELU_TANH);
}
