/* q35moe_gen.h - test checkpoints of the Qwen3.5 family written from the
 * fixtures (tests/test_qwen35_moe.c, test_qwen35_mlx.c). */
#ifndef LM_Q35MOE_GEN_H
#define LM_Q35MOE_GEN_H

#include <stdbool.h>

/* The qwen3-next fixture (src) as a Qwen3.5-MoE checkpoint in
 * <tmp>/<tag>/qwen3.5-moe (text-only, or multimodal: config under
 * text_config, weights under model.language_model., a vision tensor; with an
 * MTP head or without), with the fixture's reference and tokenizer.
 * Transformers builds Qwen3.5-MoE from Qwen3-Next's parts, so the fixture's
 * reference logits are this checkpoint's. Returns the folder (malloc'd), or
 * NULL. */
char *make_q35moe(const char *src, const char *tag, bool multimodal, bool mtp);

/* Copies file `name` from folder src to folder dst when src has it; 0 on
 * success (or when it has not). */
int q35_copy_file(const char *src, const char *dst, const char *name);

/* The Qwen3.5 / Qwen3.5-MoE / Qwen3-Next folder src as mlx-lm saves it, in
 * dst: the text model under language_model.model. and the head as
 * language_model.lm_head (mlx-lm's qwen3_5 and qwen3_5_moe; with
 * language_model false, under model. as its qwen3_next keeps them), the
 * 1 + w norms stored shifted (as F32, so that nothing rounds), conv1d as
 * [C][K][1], experts (per expert or fused) as switch_mlp stacks, the MTP
 * head left out; config, reference and tokenizer copied. 0 on success. */
int q35_to_mlx(const char *src, const char *dst, bool language_model);

#endif
