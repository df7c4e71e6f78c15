/* cpu_gemma.c - element-wise ops first needed by the gemma family.
 *
 * gelu_mul is GeGLU's gate (gelu(gate) * up), in the tanh approximation
 * gemma configs name gelu_pytorch_tanh or the exact erf form; softcap is the
 * tanh soft-capping of final logits (cap * tanh(x / cap)); copy_cols cuts a
 * block of columns out of each row (gemma4 packs every layer's per-layer
 * input into one [T][L*P] row). All three are memory bound and portable C,
 * split over the pool by rows or elements; every output element depends on
 * its inputs alone, so results do not depend on the thread count. The
 * transcendentals run in double: their cost is small next to the matmuls
 * around them, and it keeps these ops within an f32 rounding of the double
 * reference in tests/test_cpu_gemma_ops.c. */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

typedef struct lm_gemma_ew {
    float *y;
    const float *a, *b;
    double cap;
    bool tanh_approx;
} lm_gemma_ew;

/* gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static inline double gelu_tanh(double x) {
    const double k = 0.7978845608028654; /* sqrt(2 / pi) */
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

static inline double gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x * 0.7071067811865476)); }

static void lm_gelu_mul_range(void *v, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const lm_gemma_ew *c = v;
    if (c->tanh_approx)
        for (int64_t i = i0; i < i1; i++) c->y[i] = (float)(gelu_tanh(c->a[i]) * c->b[i]);
    else
        for (int64_t i = i0; i < i1; i++) c->y[i] = (float)(gelu_erf(c->a[i]) * c->b[i]);
}

static void lm_softcap_range(void *v, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const lm_gemma_ew *c = v;
    for (int64_t i = i0; i < i1; i++) c->y[i] = (float)(c->cap * tanh((double)c->y[i] / c->cap));
}

static bool same_f32_shape(const lm_tensor *a, const lm_tensor *b) {
    return a->type == LM_F32 && b->type == LM_F32 && a->rows == b->rows && a->cols == b->cols;
}

void lm_cpu_gelu_mul(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up, bool tanh_approx) {
    LM_ASSERT(same_f32_shape(y, gate) && same_f32_shape(y, up));
    lm_gemma_ew c = { y->data, gate->data, up->data, 0, tanh_approx };
    lm_cpu_parallel_for(lm_cpu_get(be), y->rows * y->cols, 40, lm_gelu_mul_range, &c);
}

void lm_cpu_softcap(lm_backend *be, lm_tensor *y, float cap) {
    LM_ASSERT(y->type == LM_F32 && cap > 0);
    lm_gemma_ew c = { y->data, NULL, NULL, cap, false };
    lm_cpu_parallel_for(lm_cpu_get(be), y->rows * y->cols, 30, lm_softcap_range, &c);
}

typedef struct lm_cols_ctx {
    float *y;
    const float *x;
    int64_t y_cols, x_cols, col0;
} lm_cols_ctx;

static void lm_cols_range(void *v, int64_t r0, int64_t r1, int ith) {
    (void)ith;
    const lm_cols_ctx *c = v;
    for (int64_t r = r0; r < r1; r++)
        memcpy(c->y + r * c->y_cols, c->x + r * c->x_cols + c->col0, (size_t)c->y_cols * sizeof(float));
}

void lm_cpu_copy_cols(lm_backend *be, lm_tensor *y, const lm_tensor *x, int64_t col0) {
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && y->rows == x->rows);
    LM_ASSERT(col0 >= 0 && y->cols >= 0 && col0 + y->cols <= x->cols && y->data != x->data);
    lm_cols_ctx c = { y->data, x->data, y->cols, x->cols, col0 };
    lm_cpu_parallel_for(lm_cpu_get(be), y->rows, y->cols, lm_cols_range, &c);
}
