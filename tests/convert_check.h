/* convert_check.h - a `lumen convert` output against llama.cpp's own file
 * of the same folder (its converter, then llama-quantize). */
#ifndef LM_CONVERT_CHECK_H
#define LM_CONVERT_CHECK_H

#include "lm_test.h"

/* The fixture models/NAME converted with mix (Q8_0, BF16) against
 * LUMEN_SOURCE_DIR/tests/data/gguf/NAME/FILE: the same metadata (every key
 * and value; llama-quantize only moves general.file_type), the same tensor
 * names, types and shapes, f32 and 16-bit tensors bit for bit (Gated
 * DeltaNet's decay within an ulp), quantised values within two of
 * llama.cpp's Q8_0 steps; want_stacks: the 3-D tensors (expert stacks) it has. */
/* The comparison itself, of GGUF ours against theirs, the keys of skip_keys
 * (NULL-terminated, or NULL) left out; label names ours in the log. */
void lm_cc_compare(lm_test_ctx *lm_t_, const char *label, const char *ours, const char *theirs, int want_stacks,
                   const char *const *skip_keys);

void lm_cc_same_as_llamacpp_file(lm_test_ctx *lm_t_, const char *name, const char *mix, const char *file,
                                 int want_stacks);

#endif
