/* safetensors.h - parser for the safetensors format (one file).
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {...}}, then the data buffer; offsets are relative to it.
 * Every offset, size and shape is checked against the file before use. */
#ifndef LM_SAFETENSORS_H
#define LM_SAFETENSORS_H

#include "../base/lm_file.h"
#include "lm_tensorfile.h"

typedef struct lm_safetensors {
    lm_mmap file;             /* empty when parsed from memory */
    int n_tensors;
    lm_file_tensor *tensors;  /* sorted by name */
} lm_safetensors;

/* Maps and parses path. Errors read "PATH: problem". */
int lm_safetensors_open(lm_safetensors *st, const char *path, lm_err *e);
/* Parses a buffer that must outlive st (used by open and the fuzzer). */
int lm_safetensors_parse(lm_safetensors *st, const uint8_t *data, size_t size, const char *label,
                         lm_err *e);
void lm_safetensors_close(lm_safetensors *st);
/* NULL when absent (binary search). */
const lm_file_tensor *lm_safetensors_find(const lm_safetensors *st, const char *name);

#endif
