/* lm_tensorfile.h - what a weight file says about one tensor, whatever the
 * format. Shapes are row-major, outermost first (safetensors order; GGUF's
 * ne[] is reversed into this order), so a [out][in] matrix has
 * shape = {out, in} in both formats. */
#ifndef LM_TENSORFILE_H
#define LM_TENSORFILE_H

#include "../backend/lm_dtype.h"

#define LM_MAX_DIMS 8

typedef struct lm_file_tensor {
    char *name;
    lm_dtype type;          /* LM_DTYPE_COUNT when the file's type is not one lumen computes with */
    char type_name[16];     /* the file's own name for the type ("BF16", "Q4_K", "F64" ...) */
    int n_dims;
    int64_t shape[LM_MAX_DIMS];
    const uint8_t *data;    /* inside the mapped file, bounds-checked by the parser */
    size_t nbytes;
} lm_file_tensor;

static inline int64_t lm_file_tensor_numel(const lm_file_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

#endif
