/* tensor.c - backend-independent helpers: f32 activation tensors, weight uploads.
 *
 * Activations are dense row-major f32 in backend memory, so a run of rows is
 * just an offset pointer: lm_tensor_rows makes such views (no copy, no
 * ownership) which is how models run a batch of T tokens on buffers sized for
 * the largest batch. */
#include "lm_backend.h"

int lm_backend_upload_weights(lm_backend *be, int n, lm_tensor *const *t, const void *const *host_data, lm_err *e) {
    if (be->ops->upload_weights) return be->ops->upload_weights(be, n, t, host_data, e);
    for (int i = 0; i < n; i++)
        if (be->ops->upload_weight(be, t[i], host_data[i], e)) return -1;
    return 0;
}

int lm_tensor_alloc(lm_backend *be, lm_tensor *t, int64_t rows, int64_t cols) {
    *t = (lm_tensor){ .type = LM_F32, .rows = rows, .cols = cols, .data = NULL };
    if (rows < 0 || cols < 0) return -1;
    if (cols > 0 && (uint64_t)rows > SIZE_MAX / sizeof(float) / (uint64_t)cols) return -1;
    t->data = be->ops->alloc(be, (size_t)rows * (size_t)cols * sizeof(float));
    return t->data ? 0 : -1;
}

void lm_tensor_release(lm_backend *be, lm_tensor *t) {
    if (!t) return;
    if (t->data) be->ops->free(be, t->data);
    t->data = NULL;
    t->rows = t->cols = 0;
}

lm_tensor lm_tensor_rows(const lm_tensor *t, int64_t r0, int64_t n) {
    LM_ASSERT(t->type == LM_F32);
    LM_ASSERT(r0 >= 0 && n >= 0 && r0 + n <= t->rows);
    return (lm_tensor){ .type = LM_F32, .rows = n, .cols = t->cols,
                        .data = t->data ? (float *)t->data + r0 * t->cols : NULL };
}
