/* gguf_write.c - GGUF v3 writer (see gguf_write.h).
 *
 * Design: each metadata value is encoded when it is set (its type id and
 * little-endian bytes, exactly as they will appear in the file) into a byte
 * buffer of its own, so writing the header is a concatenation and setting a
 * key twice swaps one buffer. Tensor infos get their data offsets as they are
 * added (each padded to the alignment), so the header is complete before the
 * first tensor byte is written. The file is written to PATH.tmp and renamed
 * into place after an fsync. */
#include "gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LM_GGUF_VERSION 3
#define LM_GGUF_DEFAULT_ALIGN 32

/* ---- a growable byte buffer --------------------------------------------- */

typedef struct lm_wbuf {
    uint8_t *p;
    size_t n, cap;
} lm_wbuf;

/* Appends n bytes, growing the buffer by doubling. */
static void lm_wbuf_put(lm_wbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = LM_MAX(b->n + n, 2 * b->cap + 64);
        b->p = lm_xrealloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

/* Little-endian unsigned value of `bytes` bytes. */
static void lm_wbuf_le(lm_wbuf *b, uint64_t v, int bytes) {
    uint8_t t[8];
    for (int i = 0; i < bytes; i++) t[i] = (uint8_t)(v >> (8 * i));
    lm_wbuf_put(b, t, (size_t)bytes);
}

/* A GGUF string: u64 length, then the bytes (no NUL). */
static void lm_wbuf_str(lm_wbuf *b, const char *s, size_t len) {
    lm_wbuf_le(b, len, 8);
    lm_wbuf_put(b, s, len);
}

/* ---- the writer ----------------------------------------------------------- */

typedef struct lm_gguf_wkv {
    char *key;
    lm_wbuf val; /* type id + value bytes */
} lm_gguf_wkv;

typedef struct lm_gguf_wtensor {
    char *name;
    lm_dtype type;
    int n_dims;
    int64_t shape[LM_MAX_DIMS]; /* outermost first */
    uint64_t offset;            /* from the start of the data section */
    size_t nbytes;
} lm_gguf_wtensor;

struct lm_gguf_writer {
    uint32_t alignment;
    lm_gguf_wkv *kv;
    int n_kv, cap_kv;
    lm_gguf_wtensor *t;
    int n_t, cap_t;
    uint64_t data_size;  /* the data section so far, padded */
    /* streaming state */
    FILE *f;
    char *path, *tmp_path;
    int next;            /* the tensor put expects */
    uint64_t written;    /* bytes of the data section written */
};

lm_gguf_writer *lm_gguf_writer_create(uint32_t alignment) {
    LM_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0);
    lm_gguf_writer *w = lm_xcalloc(1, sizeof *w);
    w->alignment = alignment;
    return w;
}

void lm_gguf_writer_free(lm_gguf_writer *w) {
    if (!w) return;
    if (w->f) {
        fclose(w->f);
        remove(w->tmp_path); /* begun, not finished: nothing may be left */
    }
    for (int i = 0; i < w->n_kv; i++) free(w->kv[i].key), free(w->kv[i].val.p);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

/* ---- metadata --------------------------------------------------------------- */

/* The value buffer of key, emptied: an existing key keeps its place. */
static lm_wbuf *lm_gguf_slot(lm_gguf_writer *w, const char *key) {
    LM_ASSERT(!w->f); /* metadata is fixed once the header is written */
    for (int i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kv[i].key, key)) {
            w->kv[i].val.n = 0;
            return &w->kv[i].val;
        }
    }
    if (w->n_kv == w->cap_kv) {
        w->cap_kv = 2 * w->cap_kv + 16;
        w->kv = lm_xrealloc(w->kv, (size_t)w->cap_kv * sizeof *w->kv);
    }
    lm_gguf_wkv *kv = &w->kv[w->n_kv++];
    kv->key = lm_xstrdup(key);
    memset(&kv->val, 0, sizeof kv->val);
    return &kv->val;
}

void lm_gguf_del_kv(lm_gguf_writer *w, const char *key) {
    for (int i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key)) continue;
        free(w->kv[i].key);
        free(w->kv[i].val.p);
        memmove(&w->kv[i], &w->kv[i + 1], (size_t)(w->n_kv - i - 1) * sizeof *w->kv);
        w->n_kv--;
        return;
    }
}

/* Whether v fits the integer type t. */
static bool lm_gguf_int_fits(lm_gguf_type t, int64_t v) {
    switch (t) {
    case LM_GGUF_U8: return v >= 0 && v <= UINT8_MAX;
    case LM_GGUF_I8: return v >= INT8_MIN && v <= INT8_MAX;
    case LM_GGUF_U16: return v >= 0 && v <= UINT16_MAX;
    case LM_GGUF_I16: return v >= INT16_MIN && v <= INT16_MAX;
    case LM_GGUF_U32: return v >= 0 && v <= UINT32_MAX;
    case LM_GGUF_I32: return v >= INT32_MIN && v <= INT32_MAX;
    case LM_GGUF_U64: return v >= 0;
    case LM_GGUF_I64: return true;
    default: return false;
    }
}

void lm_gguf_set_int(lm_gguf_writer *w, const char *key, lm_gguf_type type, int64_t v) {
    LM_ASSERT(lm_gguf_int_fits(type, v));
    lm_wbuf *b = lm_gguf_slot(w, key);
    lm_wbuf_le(b, (uint64_t)type, 4);
    lm_wbuf_le(b, (uint64_t)v, lm_gguf_scalar_bytes(type));
}

void lm_gguf_set_uint64(lm_gguf_writer *w, const char *key, uint64_t v) {
    lm_wbuf *b = lm_gguf_slot(w, key);
    lm_wbuf_le(b, LM_GGUF_U64, 4);
    lm_wbuf_le(b, v, 8);
}

/* The bits of v as the float type t stores it. */
static uint64_t lm_gguf_float_bits(lm_gguf_type t, double v) {
    if (t == LM_GGUF_F64) {
        uint64_t u;
        memcpy(&u, &v, sizeof u);
        return u;
    }
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

void lm_gguf_set_float(lm_gguf_writer *w, const char *key, lm_gguf_type type, double v) {
    LM_ASSERT(type == LM_GGUF_F32 || type == LM_GGUF_F64);
    lm_wbuf *b = lm_gguf_slot(w, key);
    lm_wbuf_le(b, (uint64_t)type, 4);
    lm_wbuf_le(b, lm_gguf_float_bits(type, v), lm_gguf_scalar_bytes(type));
}

void lm_gguf_set_bool(lm_gguf_writer *w, const char *key, bool v) {
    lm_wbuf *b = lm_gguf_slot(w, key);
    lm_wbuf_le(b, LM_GGUF_BOOL, 4);
    lm_wbuf_le(b, v ? 1 : 0, 1);
}

void lm_gguf_set_str(lm_gguf_writer *w, const char *key, const char *s, size_t len) {
    lm_wbuf *b = lm_gguf_slot(w, key);
    lm_wbuf_le(b, LM_GGUF_STRING, 4);
    lm_wbuf_str(b, s, len);
}

void lm_gguf_set_arr(lm_gguf_writer *w, const char *key, lm_gguf_type elem_type, const void *elems,
                     uint64_t count) {
    int sz = lm_gguf_scalar_bytes(elem_type);
    LM_ASSERT(sz > 0);
    lm_wbuf *b = lm_gguf_slot(w, key);
    lm_wbuf_le(b, LM_GGUF_ARRAY, 4);
    lm_wbuf_le(b, (uint64_t)elem_type, 4);
    lm_wbuf_le(b, count, 8);
    lm_wbuf_put(b, elems, (size_t)count * (size_t)sz); /* callers hold little-endian values */
}

void lm_gguf_set_arr_str(lm_gguf_writer *w, const char *key, const char *const *strs, const size_t *lens,
                         uint64_t count) {
    lm_wbuf *b = lm_gguf_slot(w, key);
    lm_wbuf_le(b, LM_GGUF_ARRAY, 4);
    lm_wbuf_le(b, LM_GGUF_STRING, 4);
    lm_wbuf_le(b, count, 8);
    for (uint64_t i = 0; i < count; i++) lm_wbuf_str(b, strs[i], lens ? lens[i] : strlen(strs[i]));
}

int lm_gguf_copy_kv(lm_gguf_writer *w, const lm_gguf_kv *kv, lm_err *e) {
    switch (kv->type) {
    case LM_GGUF_STRING: lm_gguf_set_str(w, kv->key, kv->str.ptr, (size_t)kv->str.len); return 0;
    case LM_GGUF_BOOL: lm_gguf_set_bool(w, kv->key, kv->v.b); return 0;
    case LM_GGUF_F32: case LM_GGUF_F64: lm_gguf_set_float(w, kv->key, kv->type, kv->v.f); return 0;
    case LM_GGUF_U64: lm_gguf_set_uint64(w, kv->key, kv->v.u); return 0;
    case LM_GGUF_U8: case LM_GGUF_U16: case LM_GGUF_U32:
        lm_gguf_set_int(w, kv->key, kv->type, (int64_t)kv->v.u);
        return 0;
    case LM_GGUF_I8: case LM_GGUF_I16: case LM_GGUF_I32: case LM_GGUF_I64:
        lm_gguf_set_int(w, kv->key, kv->type, kv->v.i);
        return 0;
    case LM_GGUF_ARRAY: break;
    default: return lm_errf(e, "metadata key \"%s\": cannot copy a value of type %d", kv->key, (int)kv->type);
    }
    if (kv->arr_type == LM_GGUF_STRING) {
        lm_wbuf *b = lm_gguf_slot(w, kv->key);
        lm_wbuf_le(b, LM_GGUF_ARRAY, 4);
        lm_wbuf_le(b, LM_GGUF_STRING, 4);
        lm_wbuf_le(b, kv->arr_count, 8);
        for (uint64_t i = 0; i < kv->arr_count; i++) {
            lm_gguf_str s = lm_gguf_arr_str(kv, i);
            lm_wbuf_str(b, s.ptr, (size_t)s.len);
        }
        return 0;
    }
    if (lm_gguf_scalar_bytes(kv->arr_type) == 0) {
        return lm_errf(e, "metadata key \"%s\": arrays of arrays are not copied", kv->key);
    }
    /* The elements are the file's own little-endian bytes. */
    lm_gguf_set_arr(w, kv->key, kv->arr_type, kv->arr_data, kv->arr_count);
    return 0;
}

/* ---- the tensor table ------------------------------------------------------- */

static uint64_t lm_gguf_pad(uint64_t n, uint32_t align) { return (n + align - 1) / align * align; }

int lm_gguf_add_tensor(lm_gguf_writer *w, const char *name, lm_dtype type, int n_dims, const int64_t *shape,
                       lm_err *e) {
    LM_ASSERT(!w->f && n_dims >= 1 && n_dims <= 4);
    if (lm_gguf_ggml_id(type) < 0) {
        return lm_errf(e, "tensor \"%s\": type %s has no GGUF id", name, lm_dtype_name(type));
    }
    int64_t numel = 1;
    for (int d = 0; d < n_dims; d++) {
        LM_ASSERT(shape[d] >= 0);
        numel *= shape[d];
    }
    if (shape[n_dims - 1] % lm_dtype_block(type) != 0) {
        return lm_errf(e, "tensor \"%s\": rows of %lld values are not a multiple of the %s block (%d)", name,
                       (long long)shape[n_dims - 1], lm_dtype_name(type), lm_dtype_block(type));
    }
    if (w->n_t == w->cap_t) {
        w->cap_t = 2 * w->cap_t + 16;
        w->t = lm_xrealloc(w->t, (size_t)w->cap_t * sizeof *w->t);
    }
    lm_gguf_wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    t->name = lm_xstrdup(name);
    t->type = type;
    t->n_dims = n_dims;
    memcpy(t->shape, shape, (size_t)n_dims * sizeof *shape);
    t->nbytes = lm_dtype_row_bytes(type, numel);
    t->offset = w->data_size;
    w->data_size = lm_gguf_pad(w->data_size + t->nbytes, w->alignment);
    return 0;
}

int lm_gguf_writer_n_tensors(const lm_gguf_writer *w) { return w->n_t; }

size_t lm_gguf_writer_tensor_bytes(const lm_gguf_writer *w, int i) {
    LM_ASSERT(i >= 0 && i < w->n_t);
    return w->t[i].nbytes;
}

/* ---- writing ----------------------------------------------------------------- */

/* The header, metadata and tensor infos, padded to the alignment. */
static void lm_gguf_header_bytes(lm_gguf_writer *w, lm_wbuf *b) {
    lm_wbuf_put(b, "GGUF", 4);
    lm_wbuf_le(b, LM_GGUF_VERSION, 4);
    lm_wbuf_le(b, (uint64_t)w->n_t, 8);
    lm_wbuf_le(b, (uint64_t)w->n_kv, 8);
    for (int i = 0; i < w->n_kv; i++) {
        lm_wbuf_str(b, w->kv[i].key, strlen(w->kv[i].key));
        lm_wbuf_put(b, w->kv[i].val.p, w->kv[i].val.n);
    }
    for (int i = 0; i < w->n_t; i++) {
        const lm_gguf_wtensor *t = &w->t[i];
        lm_wbuf_str(b, t->name, strlen(t->name));
        lm_wbuf_le(b, (uint64_t)t->n_dims, 4);
        for (int d = t->n_dims - 1; d >= 0; d--) lm_wbuf_le(b, (uint64_t)t->shape[d], 8); /* innermost first */
        lm_wbuf_le(b, (uint64_t)lm_gguf_ggml_id(t->type), 4);
        lm_wbuf_le(b, t->offset, 8);
    }
    static const uint8_t zeros[64];
    while (b->n % w->alignment) lm_wbuf_put(b, zeros, LM_MIN(sizeof zeros, w->alignment - b->n % w->alignment));
}

/* "PATH.tmp: what: strerror", for every failed file operation. */
static int lm_gguf_io_err(lm_gguf_writer *w, lm_err *e, const char *what) {
    return lm_errf(e, "%s: %s: %s", w->tmp_path ? w->tmp_path : "gguf", what, strerror(errno));
}

int lm_gguf_writer_begin(lm_gguf_writer *w, const char *path, lm_err *e) {
    LM_ASSERT(!w->f && !w->path);
    if (w->alignment != LM_GGUF_DEFAULT_ALIGN) lm_gguf_set_int(w, "general.alignment", LM_GGUF_U32, w->alignment);
    w->path = lm_xstrdup(path);
    size_t n = strlen(path) + 5;
    w->tmp_path = lm_xmalloc(n);
    snprintf(w->tmp_path, n, "%s.tmp", path);
    w->f = fopen(w->tmp_path, "wb");
    if (!w->f) return lm_gguf_io_err(w, e, "cannot create");
    lm_wbuf b = { 0 };
    lm_gguf_header_bytes(w, &b);
    size_t put = fwrite(b.p, 1, b.n, w->f);
    free(b.p);
    if (put != b.n) return lm_gguf_io_err(w, e, "write failed");
    return 0;
}

int lm_gguf_writer_put(lm_gguf_writer *w, const void *data, size_t nbytes, lm_err *e) {
    LM_ASSERT(w->f && w->next < w->n_t);
    const lm_gguf_wtensor *t = &w->t[w->next];
    if (nbytes != t->nbytes) {
        return lm_errf(e, "tensor \"%s\": %zu bytes given, its table entry says %zu", t->name, nbytes, t->nbytes);
    }
    static const uint8_t zeros[64];
    uint64_t end = lm_gguf_pad(w->written + nbytes, w->alignment);
    if (fwrite(data, 1, nbytes, w->f) != nbytes) return lm_gguf_io_err(w, e, "write failed");
    for (uint64_t pad = end - w->written - nbytes; pad > 0;) {
        size_t k = (size_t)LM_MIN(pad, sizeof zeros);
        if (fwrite(zeros, 1, k, w->f) != k) return lm_gguf_io_err(w, e, "write failed");
        pad -= k;
    }
    w->written = end;
    w->next++;
    return 0;
}

int lm_gguf_writer_finish(lm_gguf_writer *w, lm_err *e) {
    LM_ASSERT(w->f);
    if (w->next != w->n_t) {
        return lm_errf(e, "%s: %d of %d tensors written", w->path, w->next, w->n_t);
    }
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) return lm_gguf_io_err(w, e, "flush failed");
    FILE *f = w->f;
    w->f = NULL;
    if (fclose(f) != 0) {
        remove(w->tmp_path);
        return lm_gguf_io_err(w, e, "close failed");
    }
    if (rename(w->tmp_path, w->path) != 0) {
        int rc = lm_gguf_io_err(w, e, "rename failed");
        remove(w->tmp_path);
        return rc;
    }
    return 0;
}
