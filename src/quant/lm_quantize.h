/* lm_quantize.h - a whole model file into a quantised GGUF (lumen quantize). */
#ifndef LM_QUANTIZE_H
#define LM_QUANTIZE_H

#include "lm_quant_mix.h"

/* What a quantisation did, for the command's summary. */
typedef struct lm_quantize_report {
    int n_tensors;
    int n_requantised;           /* tensors whose type changed */
    size_t bytes_in, bytes_out;  /* tensor data */
    int count_by_type[LM_DTYPE_COUNT];
} lm_quantize_report;

/* Reads the GGUF at in (any type lumen dequantises), writes out with every
 * tensor in the type the mix gives it, all metadata kept and
 * general.file_type / general.quantization_version set; rows are converted
 * on up to `threads` threads (<= 0: every core). */
int lm_quantize_gguf(const char *in, const char *out, const lm_quant_mix *mix, int threads, lm_quantize_report *rep,
                     lm_err *e);

#endif
