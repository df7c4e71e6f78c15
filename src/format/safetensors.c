/* safetensors.c - safetensors parser.
 *
 * Design: the file is mapped (or handed in as a buffer) and never copied.
 * The JSON header is parsed by jansson in one go, bounded by the length
 * prefix, and then every entry is validated before anything points into the
 * data section:
 *   - the length prefix must fit inside the file (and a sane 100 MB cap);
 *   - the header must be one JSON object without duplicate keys;
 *   - each tensor needs a known dtype, a shape of at most LM_MAX_DIMS
 *     non-negative integers and data_offsets [begin, end] with
 *     begin <= end <= data size;
 *   - end - begin must equal numel * element size, computed with overflow
 *     checks, so a consumer can trust nbytes and shape together.
 * Only after all of that does a tensor get a data pointer, so no bad input
 * can make this code (or a caller trusting nbytes) read outside the buffer.
 * Tensors are sorted by name once, so lookups are a binary search.
 *
 * The data pointers are not guaranteed to be aligned: the format only puts
 * tensors at the byte offsets the header names (writers usually pad the
 * header to 8 bytes, but nothing requires it). */
#include "safetensors.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* A header above this is not a model file but an attack on the JSON parser's
 * memory; real headers are a few hundred KB at most. */
#define LM_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct lm_st_dtype {
    const char *name;
    lm_dtype type;   /* LM_DTYPE_COUNT: kept for inspection, not computed with */
    int elem_bytes;
} lm_st_dtype;

/* Every dtype of the safetensors format with a whole-byte element. Kept
 * even when lumen cannot compute with it, so tools can still list a file
 * that holds, say, an F64 tensor instead of refusing it. */
static const lm_st_dtype lm_st_dtypes[] = {
    { "F32", LM_F32, 4 },           { "F16", LM_F16, 2 },
    { "BF16", LM_BF16, 2 },         { "I32", LM_I32, 4 },
    { "F64", LM_DTYPE_COUNT, 8 },   { "I64", LM_DTYPE_COUNT, 8 },
    { "I16", LM_DTYPE_COUNT, 2 },   { "I8", LM_DTYPE_COUNT, 1 },
    { "U8", LM_DTYPE_COUNT, 1 },    { "BOOL", LM_DTYPE_COUNT, 1 },
    { "F8_E4M3", LM_DTYPE_COUNT, 1 }, { "F8_E5M2", LM_DTYPE_COUNT, 1 },
    { "U16", LM_DTYPE_COUNT, 2 },   { "U32", LM_DTYPE_COUNT, 4 },
    { "U64", LM_DTYPE_COUNT, 8 },
};

static const lm_st_dtype *lm_st_find_dtype(const char *name) {
    for (size_t i = 0; i < LM_COUNT(lm_st_dtypes); i++)
        if (strcmp(lm_st_dtypes[i].name, name) == 0) return &lm_st_dtypes[i];
    return NULL;
}

static void lm_st_free_tensors(lm_file_tensor *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
}

/* Room for a name quoted in an error message: 200 bytes and "...". */
#define LM_ST_SHOWN 204

/* Copies s for quoting in an error message. Names come from the file and
 * may hold any character JSON can escape; a newline would break the
 * one-line contract of lm_err, so control characters become '?', and a
 * long name is cut so the message keeps its tail (the actual problem). */
static const char *lm_st_shown(char out[LM_ST_SHOWN], const char *s) {
    size_t n = 0;
    for (; s[n] && n < LM_ST_SHOWN - 4; n++) {
        unsigned char c = (unsigned char)s[n];
        out[n] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (s[n]) memcpy(out + n, "...", 4);
    else out[n] = 0;
    return out;
}

/* Reads a JSON integer that must be in [0, INT64_MAX]. jansson already
 * rejects integers that do not fit json_int_t, so only the sign and the
 * kind (a real such as 2.0 is not an integer) need checking here. */
static bool lm_st_get_uint(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < 0) return false;
    *out = (uint64_t)x;
    return true;
}

/* Validates one header entry and fills t (except name). data/data_size
 * describe the data section. The caller prefixes errors with the tensor's
 * name and the label. */
static int lm_st_parse_entry(lm_file_tensor *t, const json_t *desc,
                             const uint8_t *data, uint64_t data_size, lm_err *e) {
    if (!json_is_object(desc)) return lm_errf(e, "entry is not a JSON object");

    const json_t *jdtype = json_object_get(desc, "dtype");
    if (!jdtype) return lm_errf(e, "missing dtype");
    if (!json_is_string(jdtype)) return lm_errf(e, "dtype is not a string");
    const char *dname = json_string_value(jdtype);
    const lm_st_dtype *dt = lm_st_find_dtype(dname);
    char shown[LM_ST_SHOWN];
    if (!dt) return lm_errf(e, "unknown dtype '%s'", lm_st_shown(shown, dname));
    t->type = dt->type;
    /* Table names are all shorter than type_name; assert rather than trust. */
    LM_ASSERT(strlen(dt->name) < sizeof t->type_name);
    memcpy(t->type_name, dt->name, strlen(dt->name) + 1);

    const json_t *jshape = json_object_get(desc, "shape");
    if (!jshape) return lm_errf(e, "missing shape");
    if (!json_is_array(jshape)) return lm_errf(e, "shape is not an array");
    size_t nd = json_array_size(jshape);
    if (nd > LM_MAX_DIMS)
        return lm_errf(e, "shape has %zu dimensions, at most %d supported", nd, LM_MAX_DIMS);
    t->n_dims = (int)nd;
    /* The product of the non-zero dimensions must fit in int64, even when
     * a zero dimension makes the tensor empty: lm_file_tensor_numel
     * multiplies in shape order without checks, and a prefix such as
     * [2^62, 4] of [2^62, 4, 0] would overflow before the zero. Bounding
     * the non-zero product bounds every prefix product. */
    bool has_zero = false;
    uint64_t nonzero = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!lm_st_get_uint(json_array_get(jshape, i), &d))
            return lm_errf(e, "shape[%zu] is not a non-negative integer", i);
        t->shape[i] = (int64_t)d;
        if (d == 0) {
            has_zero = true;
            continue;
        }
        if (nonzero > (uint64_t)INT64_MAX / d) return lm_errf(e, "shape element count overflows");
        nonzero *= d;
    }
    uint64_t numel = has_zero ? 0 : nonzero;
    if (numel > (uint64_t)INT64_MAX / (uint64_t)dt->elem_bytes)
        return lm_errf(e, "shape byte size overflows");
    uint64_t want = numel * (uint64_t)dt->elem_bytes;

    const json_t *joff = json_object_get(desc, "data_offsets");
    if (!joff) return lm_errf(e, "missing data_offsets");
    if (!json_is_array(joff) || json_array_size(joff) != 2)
        return lm_errf(e, "data_offsets is not an array [begin, end]");
    uint64_t begin, end;
    if (!lm_st_get_uint(json_array_get(joff, 0), &begin) ||
        !lm_st_get_uint(json_array_get(joff, 1), &end))
        return lm_errf(e, "data_offsets are not non-negative integers");
    if (end < begin)
        return lm_errf(e, "data_offsets [%llu, %llu] end before begin",
                       (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
        return lm_errf(e, "data_offsets [%llu, %llu] outside the %llu-byte data section",
                       (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)data_size);
    if (end - begin != want)
        return lm_errf(e, "%s shape needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
                       dt->name, (unsigned long long)want, (unsigned long long)begin,
                       (unsigned long long)end, (unsigned long long)(end - begin));
    /* end <= data_size <= the buffer size, so both casts and the pointer are in range. */
    t->data = data + (size_t)begin;
    t->nbytes = (size_t)want;
    return 0;
}

static int lm_st_by_name(const void *a, const void *b) {
    return strcmp(((const lm_file_tensor *)a)->name, ((const lm_file_tensor *)b)->name);
}

/* Parses the JSON header; on success st->tensors is filled and sorted. */
static int lm_st_parse_header(lm_safetensors *st, const char *hdr, size_t hdr_len,
                              const uint8_t *data, uint64_t data_size, lm_err *e) {
    json_error_t jerr;
    /* JSON_REJECT_DUPLICATES: two entries of one name would make the file
     * mean whatever the parser's tie-break says; refuse instead. NUL inside
     * strings is rejected by default, so every name is a proper C string. */
    json_t *root = json_loadb(hdr, hdr_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* jansson quotes the input near the error, raw bytes and all. */
        char shown[LM_ST_SHOWN];
        return lm_errf(e, "header is not valid JSON: %s (line %d, column %d)",
                       lm_st_shown(shown, jerr.text), jerr.line, jerr.column);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return lm_errf(e, "header is not a JSON object");
    }

    size_t n = json_object_size(root);
    lm_file_tensor *ts = lm_xcalloc(n ? n : 1, sizeof *ts);
    int count = 0;
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            /* The format defines metadata as a string-to-string map; anything
             * else means the file was not written by a conforming writer. */
            if (!json_is_object(val)) {
                rc = lm_errf(e, "__metadata__ is not a JSON object");
                break;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    char shown[LM_ST_SHOWN];
                    rc = lm_errf(e, "__metadata__ value '%s' is not a string", lm_st_shown(shown, mk));
                    break;
                }
            }
            if (rc) break;
            continue;
        }
        lm_file_tensor *t = &ts[count];
        if (lm_st_parse_entry(t, val, data, data_size, e) != 0) {
            char shown[LM_ST_SHOWN];
            rc = lm_err_prefix(e, "tensor '%s'", lm_st_shown(shown, key));
            break;
        }
        t->name = lm_xstrdup(key);
        count++;
    }
    json_decref(root);
    if (rc) {
        lm_st_free_tensors(ts, count);
        return -1;
    }
    if (count > 1) qsort(ts, (size_t)count, sizeof *ts, lm_st_by_name);
    st->n_tensors = count;
    st->tensors = ts;
    return 0;
}

int lm_safetensors_parse(lm_safetensors *st, const uint8_t *data, size_t size, const char *label,
                         lm_err *e) {
    memset(st, 0, sizeof *st);
    if (!label) label = "(safetensors)";
    if (size < 8 || !data)
        return lm_errf(e, "%s: file is %zu bytes, too short for the 8-byte header length", label,
                       size);
    uint64_t hlen = 0;
    /* Byte by byte: the format is little-endian whatever the host is. */
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    if (hlen > (uint64_t)(size - 8))
        return lm_errf(e, "%s: header length %llu runs past the end of the %zu-byte file", label,
                       (unsigned long long)hlen, size);
    if (hlen > LM_ST_MAX_HEADER)
        return lm_errf(e, "%s: header length %llu exceeds the %llu-byte limit", label,
                       (unsigned long long)hlen, (unsigned long long)LM_ST_MAX_HEADER);
    const uint8_t *body = data + 8 + (size_t)hlen;
    uint64_t body_size = (uint64_t)(size - 8 - (size_t)hlen);
    if (lm_st_parse_header(st, (const char *)data + 8, (size_t)hlen, body, body_size, e) != 0) {
        memset(st, 0, sizeof *st);
        return lm_err_prefix(e, "%s", label);
    }
    return 0;
}

int lm_safetensors_open(lm_safetensors *st, const char *path, lm_err *e) {
    memset(st, 0, sizeof *st);
    lm_mmap m;
    if (lm_mmap_open(&m, path, e) != 0) return -1; /* message already "PATH: why" */
    if (lm_safetensors_parse(st, m.data, m.size, path, e) != 0) {
        lm_mmap_close(&m);
        return -1;
    }
    st->file = m;
    return 0;
}

void lm_safetensors_close(lm_safetensors *st) {
    if (!st) return;
    lm_st_free_tensors(st->tensors, st->n_tensors);
    lm_mmap_close(&st->file); /* a no-op on the empty mapping of a parsed buffer */
    memset(st, 0, sizeof *st);
}

static int lm_st_key_cmp(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const lm_file_tensor *)elem)->name);
}

const lm_file_tensor *lm_safetensors_find(const lm_safetensors *st, const char *name) {
    if (!st || !name || st->n_tensors <= 0) return NULL;
    return bsearch(name, st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, lm_st_key_cmp);
}
