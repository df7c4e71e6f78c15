/* cpu_ops.c - the small per-row ops of the CPU backend.
 *
 * rms_norm, rope, silu_mul, add, scale, get_rows and gather_rows are memory
 * bound and cheap next to matmul and attention, so they are portable C only
 * (the compiler vectorises them for the baseline ISA). Where a reduction or a
 * transcendental decides accuracy they work in double: the sum of squares of
 * rms_norm, and rope's cos/sin (of the f32 angle pos * inv_freq, rounded as
 * transformers rounds it, so positions in the thousands agree with the
 * reference rather than with exact arithmetic). Rows are split over the pool when there are
 * enough of them; each row is independent, so results do not depend on the
 * thread count. */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

#define LM_ROPE_MAX_HALF 512 /* rot_dim / 2 bound for the on-stack cos/sin table */

/* ---- rms_norm ------------------------------------------------------------ */

typedef struct lm_norm_ctx {
    float *y;
    const float *x, *w;
    int64_t n; /* row width (w->cols) */
    double eps, off;
} lm_norm_ctx;

static void lm_norm_range(void *v, int64_t r0, int64_t r1, int ith) {
    (void)ith;
    const lm_norm_ctx *c = v;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = c->x + r * c->n;
        float *yr = c->y + r * c->n;
        double ss = 0.0;
        for (int64_t i = 0; i < c->n; i++) ss += (double)xr[i] * xr[i];
        double s = 1.0 / sqrt(ss / (double)c->n + c->eps);
        for (int64_t i = 0; i < c->n; i++) yr[i] = (float)((double)xr[i] * s * ((double)c->w[i] + c->off));
    }
}

void lm_cpu_rms_norm(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, float eps,
                     float w_offset) {
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && w->type == LM_F32);
    LM_ASSERT(w->cols > 0 && x->cols % w->cols == 0 && w->rows == 1);
    LM_ASSERT(y->rows == x->rows && y->cols == x->cols);
    lm_norm_ctx c = { y->data, x->data, w->data, w->cols, eps, w_offset };
    int64_t rows = x->rows * (x->cols / w->cols);
    lm_cpu_parallel_for(lm_cpu_get(be), rows, 4 * w->cols, lm_norm_range, &c);
}

/* ---- rope ------------------------------------------------------------------ */

typedef struct lm_rope_ctx {
    float *x;
    int64_t cols;
    const int32_t *pos;
    const lm_rope_params *p;
} lm_rope_ctx;

static void lm_rope_range(void *v, int64_t t0, int64_t t1, int ith) {
    (void)ith;
    const lm_rope_ctx *c = v;
    const lm_rope_params *p = c->p;
    const int half = p->rot_dim / 2;
    double cs[LM_ROPE_MAX_HALF], sn[LM_ROPE_MAX_HALF];
    for (int64_t t = t0; t < t1; t++) {
        /* One cos/sin table per token, shared by its heads. */
        for (int i = 0; i < half; i++) {
            /* the angle rounded to f32 as transformers computes it (inv_freq @ positions
             * in float32, whatever the model dtype), then cos/sin in double */
            double a = (double)((float)c->pos[t] * p->inv_freq[i]);
            cs[i] = cos(a) * p->attn_factor;
            sn[i] = sin(a) * p->attn_factor;
        }
        for (int h = 0; h < p->n_heads; h++) {
            float *xh = c->x + t * c->cols + (int64_t)h * p->head_dim;
            for (int i = 0; i < half; i++) {
                int ia = p->interleaved ? 2 * i : i, ib = p->interleaved ? 2 * i + 1 : i + half;
                double a = xh[ia], b = xh[ib];
                xh[ia] = (float)(a * cs[i] - b * sn[i]);
                xh[ib] = (float)(a * sn[i] + b * cs[i]);
            }
        }
    }
}

void lm_cpu_rope(lm_backend *be, lm_tensor *x, const int32_t *pos, const lm_rope_params *p) {
    LM_ASSERT(x->type == LM_F32);
    LM_ASSERT(p->rot_dim >= 0 && p->rot_dim % 2 == 0 && p->rot_dim <= p->head_dim);
    LM_ASSERT(p->rot_dim / 2 <= LM_ROPE_MAX_HALF);
    LM_ASSERT((int64_t)p->n_heads * p->head_dim <= x->cols);
    if (p->rot_dim == 0) return;
    lm_rope_ctx c = { x->data, x->cols, pos, p };
    lm_cpu_parallel_for(lm_cpu_get(be), x->rows, 40 * p->rot_dim + 4 * p->n_heads * p->rot_dim,
                        lm_rope_range, &c);
}

/* ---- element-wise ----------------------------------------------------------- */

typedef struct lm_ew_ctx {
    float *y;
    const float *a, *b;
    float s;
    void (*silu)(float *y, const float *g, const float *u, int64_t n); /* the ISA's, or NULL */
} lm_ew_ctx;

static void lm_silu_range(void *v, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const lm_ew_ctx *c = v;
    if (c->silu) {
        c->silu(c->y + i0, c->a + i0, c->b + i0, i1 - i0);
        return;
    }
    for (int64_t i = i0; i < i1; i++) {
        float g = c->a[i];
        c->y[i] = g / (1.0f + expf(-g)) * c->b[i];
    }
}

static void lm_add_range(void *v, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const lm_ew_ctx *c = v;
    for (int64_t i = i0; i < i1; i++) c->y[i] += c->a[i];
}

static void lm_scale_range(void *v, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const lm_ew_ctx *c = v;
    for (int64_t i = i0; i < i1; i++) c->y[i] *= c->s;
}

static bool lm_same_shape(const lm_tensor *a, const lm_tensor *b) {
    return a->type == LM_F32 && b->type == LM_F32 && a->rows == b->rows && a->cols == b->cols;
}

void lm_cpu_silu_mul(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up) {
    LM_ASSERT(lm_same_shape(y, gate) && lm_same_shape(y, up));
    lm_cpu *cpu = lm_cpu_get(be);
    lm_ew_ctx c = { y->data, gate->data, up->data, 0, cpu->k->silu_mul };
    lm_cpu_parallel_for(cpu, y->rows * y->cols, 20, lm_silu_range, &c);
}

void lm_cpu_add(lm_backend *be, lm_tensor *y, const lm_tensor *x) {
    LM_ASSERT(lm_same_shape(y, x));
    lm_ew_ctx c = { y->data, x->data, NULL, 0, NULL };
    lm_cpu_parallel_for(lm_cpu_get(be), y->rows * y->cols, 1, lm_add_range, &c);
}

void lm_cpu_scale(lm_backend *be, lm_tensor *y, float s) {
    LM_ASSERT(y->type == LM_F32);
    lm_ew_ctx c = { y->data, NULL, NULL, s, NULL };
    lm_cpu_parallel_for(lm_cpu_get(be), y->rows * y->cols, 1, lm_scale_range, &c);
}

/* ---- row lookups ------------------------------------------------------------ */

typedef struct lm_rows_ctx {
    float *y;
    const char *src;
    lm_dtype t;
    size_t ld;     /* bytes per source row */
    int64_t cols;
    const int32_t *ids;
    const lm_cpu_kern *k;
} lm_rows_ctx;

static void lm_rows_range(void *v, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const lm_rows_ctx *c = v;
    for (int64_t i = i0; i < i1; i++) {
        const void *src = c->src + (size_t)c->ids[i] * c->ld;
        float *dst = c->y + i * c->cols;
        if (c->t == LM_F32) memcpy(dst, src, (size_t)c->cols * sizeof(float));
        else if (c->k->to_f32[c->t]) c->k->to_f32[c->t](src, dst, c->cols);
        else lm_dequant_row(c->t, src, dst, c->cols);
    }
}

void lm_cpu_get_rows(lm_backend *be, lm_tensor *y, const lm_tensor *table, const int32_t *ids) {
    lm_cpu *c = lm_cpu_get(be);
    LM_ASSERT(y->type == LM_F32 && y->cols == table->cols && table->type != LM_I32);
    for (int64_t i = 0; i < y->rows; i++) LM_ASSERT(ids[i] >= 0 && ids[i] < table->rows);
    lm_rows_ctx r = { y->data, table->data, table->type, lm_dtype_row_bytes(table->type, table->cols),
                      table->cols, ids, c->k };
    lm_cpu_parallel_for(c, y->rows, 4 * table->cols, lm_rows_range, &r);
}

void lm_cpu_gather_rows(lm_backend *be, lm_tensor *y, const lm_tensor *x, const int32_t *rows, int n) {
    lm_cpu *c = lm_cpu_get(be);
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && y->cols == x->cols && n >= 0 && n <= y->rows);
    LM_ASSERT(y->data != x->data || n == 0);
    for (int i = 0; i < n; i++) LM_ASSERT(rows[i] >= 0 && rows[i] < x->rows);
    lm_rows_ctx r = { y->data, x->data, LM_F32, (size_t)x->cols * sizeof(float), x->cols, rows, c->k };
    lm_cpu_parallel_for(c, n, x->cols, lm_rows_range, &r);
}
