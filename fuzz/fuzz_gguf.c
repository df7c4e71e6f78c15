/* fuzz_gguf.c - libFuzzer harness for the GGUF parser.
 *
 * Design: parse the input as a whole file, then exercise everything a caller
 * can reach from an accepted file: every metadata key through find_kv and
 * all typed getters, every array element through the array accessors (string
 * bytes are read), every tensor through find_tensor, its first and last data
 * byte, and a dequantised first row for the types lumen computes with.
 * libFuzzer passes an exact-size heap buffer, so with ASan any pointer or
 * length that escapes it is reported at once. The parser's promises are
 * checked with LM_ASSERT (an abort is a finding): failures carry one line
 * starting with the label and leave nothing allocated; accepted tensors lie
 * inside the buffer, are aligned, and their size agrees with shape and type. */
#include "format/gguf.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void lm_fuzz_touch_kv(const lm_gguf *g, const lm_gguf_kv *kv, volatile uint8_t *sink) {
    LM_ASSERT(lm_gguf_find_kv(g, kv->key) == kv); /* duplicates are rejected */
    int64_t i;
    double f;
    bool b;
    *sink ^= (uint8_t)lm_gguf_get_int(g, kv->key, &i);
    *sink ^= (uint8_t)lm_gguf_get_float(g, kv->key, &f);
    *sink ^= (uint8_t)lm_gguf_get_bool(g, kv->key, &b);
    char *s = lm_gguf_get_str(g, kv->key);
    LM_ASSERT((s != NULL) == (kv->type == LM_GGUF_STRING));
    free(s);
    *sink ^= (uint8_t)lm_gguf_type_name(kv->type)[0];
    if (kv->type != LM_GGUF_ARRAY) return;
    for (uint64_t k = 0; k < kv->arr_count; k++) {
        if (kv->arr_type == LM_GGUF_STRING) {
            lm_gguf_str str = lm_gguf_arr_str(kv, k);
            if (str.len) *sink ^= (uint8_t)(str.ptr[0] ^ str.ptr[str.len - 1]);
        } else {
            *sink ^= (uint8_t)lm_gguf_arr_int(kv, k, &i);
            *sink ^= (uint8_t)lm_gguf_arr_float(kv, k, &f);
        }
    }
}

static void lm_fuzz_touch_tensor(const lm_gguf *g, const lm_file_tensor *t, const uint8_t *data, size_t size,
                                 volatile uint8_t *sink) {
    LM_ASSERT(lm_gguf_find_tensor(g, t->name) == t);
    LM_ASSERT(t->n_dims >= 1 && t->n_dims <= 4);
    LM_ASSERT(t->data >= data && (size_t)(t->data - data) <= size && t->nbytes <= size - (size_t)(t->data - data));
    LM_ASSERT(t->type_name[0] != 0);
    if (t->nbytes > 0) *sink ^= (uint8_t)(t->data[0] ^ t->data[t->nbytes - 1]);
    int64_t numel = lm_file_tensor_numel(t);
    if (t->type == LM_DTYPE_COUNT || numel == 0) return;
    int64_t cols = t->shape[t->n_dims - 1];
    LM_ASSERT(t->nbytes == lm_dtype_row_bytes(t->type, cols) * (size_t)(numel / cols));
    float *row = lm_xmalloc(sizeof(float) * (size_t)cols);
    lm_dequant_row(t->type, t->data, row, cols);
    *sink ^= (uint8_t)(row[0] == row[cols - 1]);
    free(row);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char label[] = "fuzz.gguf";
    lm_gguf g;
    lm_err e = { { 0 } };
    if (lm_gguf_parse(&g, data, size, label, &e) != 0) {
        /* The error contract: one line, naming the file; nothing left over. */
        LM_ASSERT(strncmp(e.msg, label, sizeof label - 1) == 0 && e.msg[sizeof label - 1] == ':');
        LM_ASSERT(strchr(e.msg, '\n') == NULL);
        LM_ASSERT(g.n_kv == 0 && g.kv == NULL && g.n_tensors == 0 && g.tensors == NULL);
        return 0;
    }
    LM_ASSERT(g.version == 2 || g.version == 3);
    LM_ASSERT(g.alignment != 0 && (g.alignment & (g.alignment - 1)) == 0);
    /* volatile: keeps the reads from being optimised away. */
    volatile uint8_t sink = 0;
    for (int i = 0; i < g.n_kv; i++) lm_fuzz_touch_kv(&g, &g.kv[i], &sink);
    for (int i = 0; i < g.n_tensors; i++) lm_fuzz_touch_tensor(&g, &g.tensors[i], data, size, &sink);
    (void)sink;
    lm_gguf_close(&g);
    return 0;
}
