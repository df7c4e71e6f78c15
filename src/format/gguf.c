/* gguf.c - GGUF v2/v3 parser.
 *
 * Design: a bounds-checked cursor (lm_gguf_rd) walks the header once. Every
 * read asks the cursor for n bytes first, so nothing is ever dereferenced past
 * the end of the buffer, and every length or count taken from the file is
 * compared with the bytes that remain before it is used; sizes are computed
 * with overflow-checked multiplication. Memory grows with what has actually
 * been parsed (arrays are grown by doubling, string arrays are bounded by the
 * bytes that remain), so a hostile count cannot cause a huge allocation.
 * Nested arrays are skipped recursively with a fixed depth limit.
 *
 * Metadata keys and tensor names are copied (NUL-terminated); strings and
 * tensor data point into the buffer, which must outlive the lm_gguf. Tensor
 * shapes are reversed from GGUF's innermost-first ne[] into the outermost-first
 * order lumen uses. Errors are one line, "LABEL: problem". */
#include "gguf.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LM_GGUF_MAX_DIMS 4
#define LM_GGUF_MAX_DEPTH 8            /* nesting limit for arrays of arrays */
#define LM_GGUF_DEFAULT_ALIGNMENT 32
#define LM_GGUF_MAX_KEY 65535          /* the spec's limit on key length */
#define LM_GGUF_MIN_KV_BYTES 13        /* key length + type + 1-byte value */
#define LM_GGUF_MIN_TENSOR_BYTES 32    /* name length + n_dims + 1 dim + type + offset */

/* ---- the cursor --------------------------------------------------------- */

typedef struct lm_gguf_rd {
    const uint8_t *data;
    size_t size, pos;
    const char *label;
    lm_err *e;
} lm_gguf_rd;

static size_t lm_gguf_left(const lm_gguf_rd *r) { return r->size - r->pos; }

/* Returns a pointer to the next n bytes and advances, or NULL (error set). */
static const uint8_t *lm_gguf_take(lm_gguf_rd *r, size_t n, const char *what) {
    if (n > lm_gguf_left(r)) {
        lm_errf(r->e, "%s: file truncated at offset %zu while reading %s (%zu bytes needed, %zu left)",
                r->label, r->pos, what, n, lm_gguf_left(r));
        return NULL;
    }
    const uint8_t *p = r->data + r->pos;
    r->pos += n;
    return p;
}

static uint16_t lm_gguf_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t lm_gguf_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t lm_gguf_le64(const uint8_t *p) {
    return (uint64_t)lm_gguf_le32(p) | ((uint64_t)lm_gguf_le32(p + 4) << 32);
}

static int lm_gguf_u32(lm_gguf_rd *r, uint32_t *out, const char *what) {
    const uint8_t *p = lm_gguf_take(r, 4, what);
    if (!p) return -1;
    *out = lm_gguf_le32(p);
    return 0;
}

static int lm_gguf_u64(lm_gguf_rd *r, uint64_t *out, const char *what) {
    const uint8_t *p = lm_gguf_take(r, 8, what);
    if (!p) return -1;
    *out = lm_gguf_le64(p);
    return 0;
}

static int lm_gguf_string(lm_gguf_rd *r, lm_gguf_str *s, const char *what) {
    uint64_t len;
    if (lm_gguf_u64(r, &len, what) != 0) return -1;
    if (len > lm_gguf_left(r)) {
        return lm_errf(r->e, "%s: %s at offset %zu has length %llu but only %zu bytes are left",
                       r->label, what, r->pos - 8, (unsigned long long)len, lm_gguf_left(r));
    }
    s->len = len;
    s->ptr = (const char *)lm_gguf_take(r, (size_t)len, what);
    return 0;
}

/* A printable, bounded copy of a name from the file, for error messages
 * (hostile names may hold newlines or be huge). */
static const char *lm_gguf_printable(const char *s, size_t len, char out[64]) {
    size_t n = 0;
    for (size_t i = 0; i < len && n < 60; i++) out[n++] = (s[i] >= 32 && s[i] < 127) ? s[i] : '?';
    if (len > 60) out[n++] = '.', out[n++] = '.', out[n++] = '.';
    out[n] = 0;
    return out;
}

/* A NUL-terminated copy of a key or tensor name; embedded NULs are refused
 * because the copy would silently name something else. */
static char *lm_gguf_name_copy(lm_gguf_rd *r, lm_gguf_str s, const char *what) {
    if (memchr(s.ptr, 0, (size_t)s.len)) {
        char buf[64];
        lm_errf(r->e, "%s: %s \"%s\" contains a NUL byte", r->label, what,
                lm_gguf_printable(s.ptr, (size_t)s.len, buf));
        return NULL;
    }
    char *c = lm_xmalloc((size_t)s.len + 1);
    memcpy(c, s.ptr, (size_t)s.len);
    c[s.len] = 0;
    return c;
}

/* ---- value types -------------------------------------------------------- */

static const char *const lm_gguf_type_names[LM_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

/* Bytes of a scalar value; 0 for string and array. */
static const uint8_t lm_gguf_scalar_size[LM_GGUF_TYPE_COUNT] = {
    1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8,
};

const char *lm_gguf_type_name(lm_gguf_type t) {
    return (unsigned)t < LM_GGUF_TYPE_COUNT ? lm_gguf_type_names[t] : "?";
}

int lm_gguf_scalar_bytes(lm_gguf_type t) {
    return (unsigned)t < LM_GGUF_TYPE_COUNT ? lm_gguf_scalar_size[t] : 0;
}

static bool lm_gguf_is_scalar(lm_gguf_type t) {
    return (unsigned)t < LM_GGUF_TYPE_COUNT && lm_gguf_scalar_size[t] != 0;
}

typedef union lm_gguf_val {
    uint64_t u;
    int64_t i;
    double f;
    bool b;
} lm_gguf_val;

/* Decodes a scalar of type t at p (which holds lm_gguf_scalar_size[t] bytes). */
static lm_gguf_val lm_gguf_decode(lm_gguf_type t, const uint8_t *p) {
    lm_gguf_val v = { 0 };
    switch (t) {
    case LM_GGUF_U8: v.u = p[0]; break;
    case LM_GGUF_I8: v.i = (int8_t)p[0]; break;
    case LM_GGUF_U16: v.u = lm_gguf_le16(p); break;
    case LM_GGUF_I16: v.i = (int16_t)lm_gguf_le16(p); break;
    case LM_GGUF_U32: v.u = lm_gguf_le32(p); break;
    case LM_GGUF_I32: v.i = (int32_t)lm_gguf_le32(p); break;
    case LM_GGUF_U64: v.u = lm_gguf_le64(p); break;
    case LM_GGUF_I64: v.i = (int64_t)lm_gguf_le64(p); break;
    case LM_GGUF_BOOL: v.b = p[0] != 0; break;
    case LM_GGUF_F32: {
        uint32_t u = lm_gguf_le32(p);
        float f;
        memcpy(&f, &u, sizeof f);
        v.f = f;
        break;
    }
    case LM_GGUF_F64: {
        uint64_t u = lm_gguf_le64(p);
        memcpy(&v.f, &u, sizeof v.f);
        break;
    }
    default: LM_ASSERT(!"not a scalar type"); break;
    }
    return v;
}

static bool lm_gguf_val_int(lm_gguf_type t, lm_gguf_val v, int64_t *out) {
    switch (t) {
    case LM_GGUF_U8: case LM_GGUF_U16: case LM_GGUF_U32: case LM_GGUF_U64:
        if (v.u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v.u;
        return true;
    case LM_GGUF_I8: case LM_GGUF_I16: case LM_GGUF_I32: case LM_GGUF_I64:
        *out = v.i;
        return true;
    default: return false;
    }
}

static bool lm_gguf_val_float(lm_gguf_type t, lm_gguf_val v, double *out) {
    if (t != LM_GGUF_F32 && t != LM_GGUF_F64) return false;
    *out = v.f;
    return true;
}

/* ---- metadata ----------------------------------------------------------- */

static int lm_gguf_value_type(lm_gguf_rd *r, lm_gguf_type *t, const char *key) {
    uint32_t raw;
    if (lm_gguf_u32(r, &raw, "a value type") != 0) return -1;
    if (raw >= LM_GGUF_TYPE_COUNT) {
        return lm_errf(r->e, "%s: metadata key \"%s\": unknown value type %u", r->label, key, raw);
    }
    *t = (lm_gguf_type)raw;
    return 0;
}

/* Checks that count elements of at least min_bytes each can fit. */
static int lm_gguf_check_count(lm_gguf_rd *r, uint64_t count, size_t min_bytes, const char *key) {
    if (count > lm_gguf_left(r) / min_bytes) {
        return lm_errf(r->e, "%s: metadata key \"%s\": array of %llu elements does not fit in the %zu bytes left",
                       r->label, key, (unsigned long long)count, lm_gguf_left(r));
    }
    return 0;
}

/* Skips the elements of an array (type t, count n) without storing them. */
static int lm_gguf_skip_elems(lm_gguf_rd *r, lm_gguf_type t, uint64_t n, int depth, const char *key);

/* Skips one nested array: its element type, count and elements. */
static int lm_gguf_skip_array(lm_gguf_rd *r, int depth, const char *key) {
    if (depth > LM_GGUF_MAX_DEPTH) {
        return lm_errf(r->e, "%s: metadata key \"%s\": arrays nested more than %d deep", r->label, key,
                       LM_GGUF_MAX_DEPTH);
    }
    lm_gguf_type t = LM_GGUF_U8;
    uint64_t n = 0;
    if (lm_gguf_value_type(r, &t, key) != 0 || lm_gguf_u64(r, &n, "an array length") != 0) return -1;
    return lm_gguf_skip_elems(r, t, n, depth, key);
}

static int lm_gguf_skip_elems(lm_gguf_rd *r, lm_gguf_type t, uint64_t n, int depth, const char *key) {
    if (lm_gguf_is_scalar(t)) {
        if (lm_gguf_check_count(r, n, lm_gguf_scalar_size[t], key) != 0) return -1;
        r->pos += (size_t)n * lm_gguf_scalar_size[t];
        return 0;
    }
    /* Strings take at least 8 bytes, arrays at least 12: the loop is bounded
     * by the file size whatever n says. */
    if (lm_gguf_check_count(r, n, t == LM_GGUF_STRING ? 8 : 12, key) != 0) return -1;
    for (uint64_t i = 0; i < n; i++) {
        lm_gguf_str s;
        int rc = t == LM_GGUF_STRING ? lm_gguf_string(r, &s, "an array string")
                                     : lm_gguf_skip_array(r, depth + 1, key);
        if (rc != 0) return -1;
    }
    return 0;
}

/* key: the printable key, for messages. */
static int lm_gguf_parse_array(lm_gguf_rd *r, lm_gguf_kv *kv, const char *key) {
    if (lm_gguf_value_type(r, &kv->arr_type, key) != 0) return -1;
    if (lm_gguf_u64(r, &kv->arr_count, "an array length") != 0) return -1;
    kv->arr_data = r->data + r->pos;
    if (kv->arr_type != LM_GGUF_STRING) return lm_gguf_skip_elems(r, kv->arr_type, kv->arr_count, 1, key);
    if (lm_gguf_check_count(r, kv->arr_count, 8, key) != 0) return -1;
    if (kv->arr_count == 0) return 0;
    kv->arr_strs = lm_xcalloc((size_t)kv->arr_count, sizeof *kv->arr_strs);
    for (uint64_t i = 0; i < kv->arr_count; i++) {
        if (lm_gguf_string(r, &kv->arr_strs[i], "an array string") != 0) return -1;
    }
    return 0;
}

static int lm_gguf_parse_value(lm_gguf_rd *r, lm_gguf_kv *kv, const char *key) {
    if (kv->type == LM_GGUF_STRING) return lm_gguf_string(r, &kv->str, "a string value");
    if (kv->type == LM_GGUF_ARRAY) return lm_gguf_parse_array(r, kv, key);
    const uint8_t *p = lm_gguf_take(r, lm_gguf_scalar_size[kv->type], "a metadata value");
    if (!p) return -1;
    lm_gguf_val v = lm_gguf_decode(kv->type, p);
    memcpy(&kv->v, &v, sizeof kv->v);
    return 0;
}

/* Parses one key/value into kv (zeroed by the caller; kv->key is owned by
 * kv as soon as it is set, so the caller frees on failure). */
static int lm_gguf_parse_kv(lm_gguf_rd *r, lm_gguf_kv *kv) {
    lm_gguf_str k;
    if (lm_gguf_string(r, &k, "a metadata key") != 0) return -1;
    if (k.len > LM_GGUF_MAX_KEY) {
        return lm_errf(r->e, "%s: metadata key at offset %zu is %llu bytes long (limit %d)", r->label,
                       (size_t)((const uint8_t *)k.ptr - r->data), (unsigned long long)k.len, LM_GGUF_MAX_KEY);
    }
    kv->key = lm_gguf_name_copy(r, k, "metadata key");
    if (!kv->key) return -1;
    char key[64];
    lm_gguf_printable(k.ptr, (size_t)k.len, key);
    if (lm_gguf_value_type(r, &kv->type, key) != 0) return -1;
    return lm_gguf_parse_value(r, kv, key);
}

/* ---- ggml tensor types ---------------------------------------------------- */

typedef struct lm_ggml_type {
    const char *name; /* NULL: not a (current) ggml type */
    int block;        /* values per block */
    int bytes;        /* bytes per block */
    lm_dtype dt;      /* LM_DTYPE_COUNT when lumen does not compute with it */
} lm_ggml_type;

#define LM_GT(n, b, s, d) { n, b, s, d }
#define LM_GT_OTHER(n, b, s) { n, b, s, LM_DTYPE_COUNT }

/* Indexed by ggml type id. Ids 4, 5, 31-33 and 36-38 were removed from ggml
 * and are rejected like unknown ids. */
static const lm_ggml_type lm_ggml_types[] = {
    [0] = LM_GT("F32", 1, 4, LM_F32),
    [1] = LM_GT("F16", 1, 2, LM_F16),
    [2] = LM_GT("Q4_0", 32, 18, LM_Q4_0),
    [3] = LM_GT("Q4_1", 32, 20, LM_Q4_1),
    [6] = LM_GT("Q5_0", 32, 22, LM_Q5_0),
    [7] = LM_GT("Q5_1", 32, 24, LM_Q5_1),
    [8] = LM_GT("Q8_0", 32, 34, LM_Q8_0),
    [9] = LM_GT_OTHER("Q8_1", 32, 36),
    [10] = LM_GT("Q2_K", 256, 84, LM_Q2_K),
    [11] = LM_GT("Q3_K", 256, 110, LM_Q3_K),
    [12] = LM_GT("Q4_K", 256, 144, LM_Q4_K),
    [13] = LM_GT("Q5_K", 256, 176, LM_Q5_K),
    [14] = LM_GT("Q6_K", 256, 210, LM_Q6_K),
    [15] = LM_GT_OTHER("Q8_K", 256, 292),
    [16] = LM_GT_OTHER("IQ2_XXS", 256, 66),
    [17] = LM_GT_OTHER("IQ2_XS", 256, 74),
    [18] = LM_GT_OTHER("IQ3_XXS", 256, 98),
    [19] = LM_GT_OTHER("IQ1_S", 256, 50),
    [20] = LM_GT("IQ4_NL", 32, 18, LM_IQ4_NL),
    [21] = LM_GT_OTHER("IQ3_S", 256, 110),
    [22] = LM_GT_OTHER("IQ2_S", 256, 82),
    [23] = LM_GT("IQ4_XS", 256, 136, LM_IQ4_XS),
    [24] = LM_GT_OTHER("I8", 1, 1),
    [25] = LM_GT_OTHER("I16", 1, 2),
    [26] = LM_GT("I32", 1, 4, LM_I32),
    [27] = LM_GT_OTHER("I64", 1, 8),
    [28] = LM_GT_OTHER("F64", 1, 8),
    [29] = LM_GT_OTHER("IQ1_M", 256, 56),
    [30] = LM_GT("BF16", 1, 2, LM_BF16),
    [34] = LM_GT_OTHER("TQ1_0", 256, 54),
    [35] = LM_GT_OTHER("TQ2_0", 256, 66),
    [39] = LM_GT_OTHER("MXFP4", 32, 17),
};

static const lm_ggml_type *lm_ggml_type_get(uint32_t id) {
    if (id >= LM_COUNT(lm_ggml_types) || !lm_ggml_types[id].name) return NULL;
    return &lm_ggml_types[id];
}

int lm_gguf_ggml_id(lm_dtype t) {
    for (size_t id = 0; id < LM_COUNT(lm_ggml_types); id++) {
        if (lm_ggml_types[id].name && lm_ggml_types[id].dt == t && t != LM_DTYPE_COUNT) return (int)id;
    }
    return -1;
}

/* ---- tensor infos --------------------------------------------------------- */

/* Sets t->shape (outermost first), t->nbytes and the type fields from the
 * file's ne[] (innermost first) and type; name is printable, for messages. */
static int lm_gguf_tensor_layout(lm_gguf_rd *r, lm_file_tensor *t, const uint64_t *ne,
                                 const lm_ggml_type *gt, const char *name) {
    /* The product of the non-zero dimensions must fit: a zero dimension must
     * not hide an overflow from code that multiplies in another order. */
    int64_t numel = 1;
    for (int d = 0; d < t->n_dims; d++) {
        int64_t f = ne[d] ? (int64_t)ne[d] : 1;
        if (ne[d] > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, f, &numel)) {
            return lm_errf(r->e, "%s: tensor \"%s\": dimensions overflow", r->label, name);
        }
        t->shape[t->n_dims - 1 - d] = (int64_t)ne[d];
    }
    if (ne[0] % (uint64_t)gt->block != 0) {
        return lm_errf(r->e, "%s: tensor \"%s\": row of %llu values is not a multiple of the %s block (%d)",
                       r->label, name, (unsigned long long)ne[0], gt->name, gt->block);
    }
    uint64_t nbytes = ne[0] / (uint64_t)gt->block;
    bool ovf = __builtin_mul_overflow(nbytes, (uint64_t)gt->bytes, &nbytes);
    for (int d = 1; d < t->n_dims; d++) ovf = ovf || __builtin_mul_overflow(nbytes, ne[d], &nbytes);
    if (ovf || nbytes > SIZE_MAX) return lm_errf(r->e, "%s: tensor \"%s\": byte size overflows", r->label, name);
    t->nbytes = (size_t)nbytes;
    t->type = gt->dt;
    snprintf(t->type_name, sizeof t->type_name, "%s", gt->name);
    return 0;
}

/* Parses one tensor info into t (zeroed by caller; t->name owned by t once
 * set). The data offset is returned in *offset, resolved later. */
static int lm_gguf_parse_tensor_info(lm_gguf_rd *r, lm_file_tensor *t, uint64_t *offset) {
    lm_gguf_str s;
    char pname[64];
    if (lm_gguf_string(r, &s, "a tensor name") != 0) return -1;
    t->name = lm_gguf_name_copy(r, s, "tensor name");
    if (!t->name) return -1;
    lm_gguf_printable(s.ptr, (size_t)s.len, pname);
    uint32_t n_dims, type_id;
    if (lm_gguf_u32(r, &n_dims, "a tensor's dimension count") != 0) return -1;
    if (n_dims < 1 || n_dims > LM_GGUF_MAX_DIMS) {
        return lm_errf(r->e, "%s: tensor \"%s\": %u dimensions (must be 1 to %d)", r->label, pname, n_dims,
                       LM_GGUF_MAX_DIMS);
    }
    t->n_dims = (int)n_dims;
    uint64_t ne[LM_GGUF_MAX_DIMS];
    for (uint32_t d = 0; d < n_dims; d++) {
        if (lm_gguf_u64(r, &ne[d], "a tensor dimension") != 0) return -1;
    }
    if (lm_gguf_u32(r, &type_id, "a tensor type") != 0) return -1;
    if (lm_gguf_u64(r, offset, "a tensor offset") != 0) return -1;
    const lm_ggml_type *gt = lm_ggml_type_get(type_id);
    if (!gt) return lm_errf(r->e, "%s: tensor \"%s\": unknown ggml type %u", r->label, pname, type_id);
    return lm_gguf_tensor_layout(r, t, ne, gt, pname);
}

/* Points t->data at its bytes, checking alignment and bounds. */
static int lm_gguf_place_tensor(lm_gguf_rd *r, lm_file_tensor *t, size_t data_start, uint64_t offset,
                                uint32_t alignment) {
    char pname[64];
    lm_gguf_printable(t->name, strlen(t->name), pname);
    if (offset % alignment != 0) {
        return lm_errf(r->e, "%s: tensor \"%s\": data offset %llu is not a multiple of the alignment %u",
                       r->label, pname, (unsigned long long)offset, alignment);
    }
    uint64_t begin, end;
    if (__builtin_add_overflow((uint64_t)data_start, offset, &begin) ||
        __builtin_add_overflow(begin, (uint64_t)t->nbytes, &end) || end > r->size) {
        return lm_errf(r->e, "%s: tensor \"%s\" (%s): data (offset %llu, %zu bytes) lies outside the file (%zu bytes)",
                       r->label, pname, t->type_name, (unsigned long long)offset, t->nbytes, r->size);
    }
    t->data = r->data + begin;
    return 0;
}

/* ---- whole-file parse ------------------------------------------------------ */

static int lm_gguf_cmp_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Returns a name that occurs twice in names[n] (sorted in place), or NULL. */
static const char *lm_gguf_find_dup(const char **names, int n) {
    qsort(names, (size_t)n, sizeof *names, lm_gguf_cmp_names);
    for (int i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) return names[i];
    }
    return NULL;
}

static int lm_gguf_check_dups(lm_gguf_rd *r, lm_gguf *g) {
    int n = LM_MAX(g->n_kv, g->n_tensors);
    const char **names = lm_xmalloc((size_t)n * sizeof *names + 1);
    char buf[64];
    const char *dup;
    int rc = 0;
    for (int i = 0; i < g->n_kv; i++) names[i] = g->kv[i].key;
    if ((dup = lm_gguf_find_dup(names, g->n_kv)) != NULL) {
        rc = lm_errf(r->e, "%s: duplicate metadata key \"%s\"", r->label, lm_gguf_printable(dup, strlen(dup), buf));
    }
    for (int i = 0; rc == 0 && i < g->n_tensors; i++) names[i] = g->tensors[i].name;
    if (rc == 0 && (dup = lm_gguf_find_dup(names, g->n_tensors)) != NULL) {
        rc = lm_errf(r->e, "%s: duplicate tensor name \"%s\"", r->label, lm_gguf_printable(dup, strlen(dup), buf));
    }
    free(names);
    return rc;
}

static int lm_gguf_header(lm_gguf_rd *r, lm_gguf *g, uint64_t *n_tensors, uint64_t *n_kv) {
    const uint8_t *magic = lm_gguf_take(r, 4, "the magic");
    if (!magic) return -1;
    if (memcmp(magic, "GGUF", 4) != 0) return lm_errf(r->e, "%s: not a GGUF file (bad magic)", r->label);
    if (lm_gguf_u32(r, &g->version, "the version") != 0) return -1;
    if (g->version == 1) {
        return lm_errf(r->e, "%s: GGUF version 1 is not supported (only versions 2 and 3)", r->label);
    }
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && g->version != 0) {
            return lm_errf(r->e, "%s: big-endian GGUF files are not supported", r->label);
        }
        return lm_errf(r->e, "%s: unsupported GGUF version %u (only 2 and 3)", r->label, g->version);
    }
    if (lm_gguf_u64(r, n_tensors, "the tensor count") != 0) return -1;
    if (lm_gguf_u64(r, n_kv, "the metadata count") != 0) return -1;
    if (*n_kv > lm_gguf_left(r) / LM_GGUF_MIN_KV_BYTES || *n_kv > INT_MAX) {
        return lm_errf(r->e, "%s: metadata count %llu is more than the file can hold", r->label,
                       (unsigned long long)*n_kv);
    }
    if (*n_tensors > lm_gguf_left(r) / LM_GGUF_MIN_TENSOR_BYTES || *n_tensors > INT_MAX) {
        return lm_errf(r->e, "%s: tensor count %llu is more than the file can hold", r->label,
                       (unsigned long long)*n_tensors);
    }
    return 0;
}

static int lm_gguf_parse_kvs(lm_gguf_rd *r, lm_gguf *g, uint64_t n) {
    int cap = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (g->n_kv == cap) {
            cap = cap ? cap * 2 : 16;
            g->kv = lm_xrealloc(g->kv, (size_t)cap * sizeof *g->kv);
        }
        lm_gguf_kv *kv = &g->kv[g->n_kv++];
        memset(kv, 0, sizeof *kv);
        if (lm_gguf_parse_kv(r, kv) != 0) return -1;
    }
    return 0;
}

static int lm_gguf_alignment(lm_gguf_rd *r, lm_gguf *g) {
    g->alignment = LM_GGUF_DEFAULT_ALIGNMENT;
    const lm_gguf_kv *kv = lm_gguf_find_kv(g, "general.alignment");
    if (!kv) return 0;
    int64_t a;
    if (!lm_gguf_get_int(g, "general.alignment", &a)) {
        return lm_errf(r->e, "%s: general.alignment has type %s, not an integer", r->label,
                       lm_gguf_type_name(kv->type));
    }
    if (a <= 0 || a > (int64_t)1 << 30 || (a & (a - 1)) != 0) {
        return lm_errf(r->e, "%s: general.alignment %lld is not a power of two (1 to 2^30)", r->label, (long long)a);
    }
    g->alignment = (uint32_t)a;
    return 0;
}

static int lm_gguf_parse_tensors(lm_gguf_rd *r, lm_gguf *g, uint64_t n) {
    int cap = 0;
    uint64_t *offsets = NULL;
    int rc = 0;
    for (uint64_t i = 0; rc == 0 && i < n; i++) {
        if (g->n_tensors == cap) {
            cap = cap ? cap * 2 : 16;
            g->tensors = lm_xrealloc(g->tensors, (size_t)cap * sizeof *g->tensors);
            offsets = lm_xrealloc(offsets, (size_t)cap * sizeof *offsets);
        }
        lm_file_tensor *t = &g->tensors[g->n_tensors++];
        memset(t, 0, sizeof *t);
        rc = lm_gguf_parse_tensor_info(r, t, &offsets[i]);
    }
    /* Data starts at the end of the infos, rounded up to the alignment. */
    size_t data_start = r->pos;
    size_t rem = data_start % g->alignment;
    if (rc == 0 && rem && __builtin_add_overflow(data_start, g->alignment - rem, &data_start)) {
        rc = lm_errf(r->e, "%s: data section offset overflows", r->label);
    }
    for (int i = 0; rc == 0 && i < g->n_tensors; i++) {
        rc = lm_gguf_place_tensor(r, &g->tensors[i], data_start, offsets[i], g->alignment);
    }
    free(offsets);
    return rc;
}

/* Frees what parsing allocated (g->file is left alone). */
static void lm_gguf_free_parsed(lm_gguf *g) {
    for (int i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].arr_strs);
    }
    free(g->kv);
    for (int i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->tensors);
    g->kv = NULL;
    g->tensors = NULL;
    g->n_kv = g->n_tensors = 0;
}

int lm_gguf_parse(lm_gguf *g, const uint8_t *data, size_t size, const char *label, lm_err *e) {
    memset(g, 0, sizeof *g);
    lm_gguf_rd r = { data, data ? size : 0, 0, label ? label : "gguf", e };
    uint64_t n_tensors, n_kv;
    int rc = lm_gguf_header(&r, g, &n_tensors, &n_kv);
    if (rc == 0) rc = lm_gguf_parse_kvs(&r, g, n_kv);
    if (rc == 0) rc = lm_gguf_alignment(&r, g);
    if (rc == 0) rc = lm_gguf_parse_tensors(&r, g, n_tensors);
    if (rc == 0) rc = lm_gguf_check_dups(&r, g);
    if (rc != 0) lm_gguf_free_parsed(g);
    return rc;
}

int lm_gguf_open(lm_gguf *g, const char *path, lm_err *e) {
    lm_mmap m;
    memset(g, 0, sizeof *g);
    if (lm_mmap_open(&m, path, e) != 0) return -1;
    if (lm_gguf_parse(g, m.data, m.size, path, e) != 0) {
        lm_mmap_close(&m);
        return -1;
    }
    g->file = m;
    return 0;
}

void lm_gguf_close(lm_gguf *g) {
    lm_gguf_free_parsed(g);
    lm_mmap_close(&g->file);
    memset(g, 0, sizeof *g);
}

/* ---- getters ---------------------------------------------------------------- */

const lm_gguf_kv *lm_gguf_find_kv(const lm_gguf *g, const char *key) {
    for (int i = 0; i < g->n_kv; i++) {
        if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    }
    return NULL;
}

/* The scalar value of kv in the decoder's union (kv->v has the same shape). */
static lm_gguf_val lm_gguf_kv_val(const lm_gguf_kv *kv) {
    lm_gguf_val v;
    memcpy(&v, &kv->v, sizeof v);
    return v;
}

bool lm_gguf_get_int(const lm_gguf *g, const char *key, int64_t *out) {
    const lm_gguf_kv *kv = lm_gguf_find_kv(g, key);
    return kv && lm_gguf_val_int(kv->type, lm_gguf_kv_val(kv), out);
}

bool lm_gguf_get_float(const lm_gguf *g, const char *key, double *out) {
    const lm_gguf_kv *kv = lm_gguf_find_kv(g, key);
    return kv && lm_gguf_val_float(kv->type, lm_gguf_kv_val(kv), out);
}

bool lm_gguf_get_bool(const lm_gguf *g, const char *key, bool *out) {
    const lm_gguf_kv *kv = lm_gguf_find_kv(g, key);
    if (!kv || kv->type != LM_GGUF_BOOL) return false;
    *out = kv->v.b;
    return true;
}

char *lm_gguf_get_str(const lm_gguf *g, const char *key) {
    const lm_gguf_kv *kv = lm_gguf_find_kv(g, key);
    if (!kv || kv->type != LM_GGUF_STRING) return NULL;
    char *s = lm_xmalloc((size_t)kv->str.len + 1);
    if (kv->str.len) memcpy(s, kv->str.ptr, (size_t)kv->str.len);
    s[kv->str.len] = 0;
    return s;
}

const lm_file_tensor *lm_gguf_find_tensor(const lm_gguf *g, const char *name) {
    for (int i = 0; i < g->n_tensors; i++) {
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    }
    return NULL;
}

lm_gguf_str lm_gguf_arr_str(const lm_gguf_kv *kv, uint64_t i) {
    LM_ASSERT(kv->type == LM_GGUF_ARRAY && kv->arr_type == LM_GGUF_STRING && i < kv->arr_count);
    return kv->arr_strs[i];
}

/* Decodes scalar element i of an array kv; false for non-scalar elements. */
static bool lm_gguf_arr_elem(const lm_gguf_kv *kv, uint64_t i, lm_gguf_val *v) {
    LM_ASSERT(kv->type == LM_GGUF_ARRAY && i < kv->arr_count);
    if (!lm_gguf_is_scalar(kv->arr_type)) return false;
    *v = lm_gguf_decode(kv->arr_type, kv->arr_data + i * lm_gguf_scalar_size[kv->arr_type]);
    return true;
}

bool lm_gguf_arr_int(const lm_gguf_kv *kv, uint64_t i, int64_t *out) {
    lm_gguf_val v;
    return lm_gguf_arr_elem(kv, i, &v) && lm_gguf_val_int(kv->arr_type, v, out);
}

bool lm_gguf_arr_float(const lm_gguf_kv *kv, uint64_t i, double *out) {
    lm_gguf_val v;
    return lm_gguf_arr_elem(kv, i, &v) && lm_gguf_val_float(kv->arr_type, v, out);
}
