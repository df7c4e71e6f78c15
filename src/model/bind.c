/* bind.c - find, check and bind checkpoint tensors (see lm_arch.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_arch.h"

static void shape_str(char *buf, size_t n, const lm_file_tensor *t) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->n_dims && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* The file a reader would look in for a missing tensor. */
static const char *missing_where(const lm_model *m) {
    if (m->weights->gguf) return m->weights->gguf->file.path;
    if (m->weights->n_files == 1) return m->weights->st[0].file.path;
    return m->path;
}

/* Finds name; matrix (cols > 0): exactly [rows, cols]; f32 copy (cols == 0):
 * any shape of `rows` elements. The type must be one lumen computes with. */
static const lm_file_tensor *find_checked(lm_binder *b, const char *name, int64_t rows, int64_t cols,
                                          bool required) {
    if (b->failed) return NULL;
    const char *file = NULL;
    const lm_file_tensor *t = lm_weights_find(b->m->weights, name, &file);
    if (!t) {
        if (required) {
            lm_errf(b->e, "%s: missing tensor \"%s\"", missing_where(b->m), name);
            b->failed = 1;
        }
        return NULL;
    }
    /* a one-row matrix may be stored as a vector (llama-quantize writes
     * Qwen3-Next's [1][D] shared-expert gate as [D]) */
    bool ok = cols ? (t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols) ||
                         (rows == 1 && t->n_dims == 1 && t->shape[0] == cols)
                   : lm_file_tensor_numel(t) == rows;
    if (!ok) {
        char got[128];
        shape_str(got, sizeof got, t);
        if (cols)
            lm_errf(b->e, "%s: tensor \"%s\" has shape %s, expected [%lld, %lld]", file, name, got, (long long)rows,
                    (long long)cols);
        else
            lm_errf(b->e, "%s: tensor \"%s\" has shape %s, expected %lld elements", file, name, got, (long long)rows);
        b->failed = 1;
        return NULL;
    }
    if (t->type == LM_DTYPE_COUNT || t->type == LM_I32) {
        lm_errf(b->e, "%s: tensor \"%s\" has type %s, which lumen cannot compute with", file, name, t->type_name);
        b->failed = 1;
        return NULL;
    }
    int64_t width = cols ? cols : (t->n_dims ? t->shape[t->n_dims - 1] : 1);
    if (width % lm_dtype_block(t->type)) {
        lm_errf(b->e, "%s: tensor \"%s\" row of %lld is not a whole number of %s blocks", file, name, (long long)width,
                t->type_name);
        b->failed = 1;
        return NULL;
    }
    return t;
}

/* A weight of `bytes` checkpoint bytes is bound: tell whoever asked. */
static void bound(lm_model *m, size_t bytes) {
    m->bound_bytes += bytes;
    m->bound_tensors++;
    if (!m->progress || !m->progress->bytes) return;
    if (!m->bound_total) m->bound_total = lm_weights_bytes(m->weights); /* once: it walks every tensor */
    m->progress->bytes(m->progress->user, m->bound_bytes, m->bound_total, m->bound_tensors);
}

void lm_bind_matrix(lm_binder *b, lm_tensor *dst, const char *name, int64_t rows, int64_t cols, bool required,
                    bool counted) {
    const lm_file_tensor *t = find_checked(b, name, rows, cols, required);
    if (!t) return;
    *dst = (lm_tensor){ .type = t->type, .rows = rows, .cols = cols };
    if (b->m->be->ops->upload_weight(b->m->be, dst, t->data, b->e)) {
        lm_err_prefix(b->e, "%s", name);
        b->failed = 1;
        return;
    }
    b->m->weight_bytes += counted ? t->nbytes : lm_dtype_row_bytes(t->type, cols);
    bound(b->m, t->nbytes);
}

const lm_file_tensor *lm_bind_find_matrix(lm_binder *b, const char *name, int64_t rows, int64_t cols) {
    const lm_file_tensor *t = find_checked(b, name, rows, cols, true);
    if (t) b->m->weight_bytes += t->nbytes;
    if (t) bound(b->m, t->nbytes);
    return t;
}

void lm_bind_upload_group(lm_binder *b, int n, lm_tensor *const *dst, const void *const *host, const char *what) {
    if (b->failed) return;
    if (lm_backend_upload_weights(b->m->be, n, dst, host, b->e)) {
        lm_err_prefix(b->e, "%s", what);
        b->failed = 1;
    }
}

void lm_bind_matrix_group(lm_binder *b, int n, lm_tensor *const *dst, const char *const *names, const int64_t *rows,
                          int64_t cols) {
    LM_ASSERT(n >= 1 && n <= LM_BIND_GROUP_MAX);
    const void *host[LM_BIND_GROUP_MAX];
    for (int i = 0; i < n; i++) {
        const lm_file_tensor *t = lm_bind_find_matrix(b, names[i], rows[i], cols);
        if (!t) return;
        *dst[i] = (lm_tensor){ .type = t->type, .rows = rows[i], .cols = cols };
        host[i] = t->data;
    }
    lm_bind_upload_group(b, n, dst, host, names[0]);
}

void lm_bind_f32(lm_binder *b, lm_tensor *dst, const char *name, int64_t rows, int64_t n, bool required,
                 float offset) {
    const lm_file_tensor *t = find_checked(b, name, n, 0, required);
    if (!t) return;
    LM_ASSERT(rows > 0 && n % rows == 0);
    lm_model *m = b->m;
    float *host = lm_xmalloc((size_t)n * sizeof(float));
    /* dequantise row by row of the stored shape (quant blocks never span rows) */
    int64_t w = t->n_dims ? t->shape[t->n_dims - 1] : 1;
    size_t row_bytes = lm_dtype_row_bytes(t->type, w);
    for (int64_t r = 0; r < n / w; r++) lm_dequant_row(t->type, t->data + (size_t)r * row_bytes, host + r * w, w);
    for (int64_t i = 0; offset != 0 && i < n; i++) host[i] += offset;
    lm_tensor v = { .type = LM_F32, .rows = rows, .cols = n / rows };
    v.data = m->be->ops->alloc(m->be, (size_t)n * sizeof(float));
    if (!v.data) {
        free(host);
        lm_errf(b->e, "%s: out of memory for \"%s\"", m->path, name);
        b->failed = 1;
        return;
    }
    m->be->ops->write(m->be, v.data, host, (size_t)n * sizeof(float));
    free(host);
    m->owned = lm_xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = v.data;
    *dst = v;
    bound(m, t->nbytes);
}

const char *lm_bind_name(char *buf, size_t n, const char *pattern, int layer) {
    snprintf(buf, n, pattern, layer);
    return buf;
}

bool lm_bind_has(const lm_binder *b, const char *name) { return lm_weights_find(b->m->weights, name, NULL) != NULL; }
