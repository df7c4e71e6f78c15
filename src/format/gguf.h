/* gguf.h - parser for GGUF v2/v3 files (llama.cpp's single-file format).
 *
 * Layout: magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
 * metadata key/values (typed, arrays allowed), tensor infos (name, dims,
 * ne[] innermost first, ggml type, offset), padding to general.alignment
 * (default 32), tensor data. Every count, length and offset is checked
 * against the file before use. Tensor shapes are reported outermost first. */
#ifndef LM_GGUF_H
#define LM_GGUF_H

#include "../base/lm_file.h"
#include "lm_tensorfile.h"

typedef enum lm_gguf_type {
    LM_GGUF_U8 = 0, LM_GGUF_I8, LM_GGUF_U16, LM_GGUF_I16, LM_GGUF_U32, LM_GGUF_I32,
    LM_GGUF_F32, LM_GGUF_BOOL, LM_GGUF_STRING, LM_GGUF_ARRAY, LM_GGUF_U64, LM_GGUF_I64,
    LM_GGUF_F64, LM_GGUF_TYPE_COUNT
} lm_gguf_type;

typedef struct lm_gguf_str {
    const char *ptr; /* inside the file, NOT NUL-terminated */
    uint64_t len;
} lm_gguf_str;

typedef struct lm_gguf_kv {
    char *key;              /* NUL-terminated copy */
    lm_gguf_type type;
    /* scalars */
    union { uint64_t u; int64_t i; double f; bool b; } v;
    lm_gguf_str str;        /* type STRING */
    /* arrays: element type, count, and where the elements start in the file;
     * string arrays are walked with lm_gguf_arr_str */
    lm_gguf_type arr_type;
    uint64_t arr_count;
    const uint8_t *arr_data;
    lm_gguf_str *arr_strs;  /* for string arrays: [arr_count], parsed up front */
} lm_gguf_kv;

typedef struct lm_gguf {
    lm_mmap file;
    uint32_t version;
    uint32_t alignment;
    int n_kv;
    lm_gguf_kv *kv;
    int n_tensors;
    lm_file_tensor *tensors; /* in file order */
} lm_gguf;

int lm_gguf_open(lm_gguf *g, const char *path, lm_err *e);
int lm_gguf_parse(lm_gguf *g, const uint8_t *data, size_t size, const char *label, lm_err *e);
void lm_gguf_close(lm_gguf *g);

const lm_gguf_kv *lm_gguf_find_kv(const lm_gguf *g, const char *key);
/* Typed getters: false when absent or of an incompatible type. Integers of any
 * width convert to int64 (u64 values above INT64_MAX are rejected); floats of
 * either width to double. */
bool lm_gguf_get_int(const lm_gguf *g, const char *key, int64_t *out);
bool lm_gguf_get_float(const lm_gguf *g, const char *key, double *out);
bool lm_gguf_get_bool(const lm_gguf *g, const char *key, bool *out);
/* Returns a NUL-terminated copy (caller frees), or NULL. */
char *lm_gguf_get_str(const lm_gguf *g, const char *key);
const lm_file_tensor *lm_gguf_find_tensor(const lm_gguf *g, const char *name);

/* Array access. kv must be an array (and, for lm_gguf_arr_str, a string
 * array) with i < arr_count (asserted). The element getters convert as the
 * scalar getters do and return false when the element type does not. */
lm_gguf_str lm_gguf_arr_str(const lm_gguf_kv *kv, uint64_t i);
bool lm_gguf_arr_int(const lm_gguf_kv *kv, uint64_t i, int64_t *out);
bool lm_gguf_arr_float(const lm_gguf_kv *kv, uint64_t i, double *out);
/* Bytes of one scalar of type t; 0 for string, array and unknown types. */
int lm_gguf_scalar_bytes(lm_gguf_type t);
/* The ggml type id GGUF files use for t, or -1 when it has none. */
int lm_gguf_ggml_id(lm_dtype t);
/* "u32", "string", "array" ... for messages; "?" when out of range. */
const char *lm_gguf_type_name(lm_gguf_type t);

#endif
