/* test_convert_moe.c - `lumen convert` of the MoE checkpoints (qwen3_moe,
 * and the qwen3_next hybrid: one tensor per expert in the folder, stacked
 * [experts][rows][cols] in the GGUF, the routers kept f32) against
 * llama.cpp's files of the same folders (tests/data/gguf/<name>: its
 * converter, then llama-quantize to Q8_0), as convert_check.h compares
 * them. Logits against the folder are test_convert.c's. */
#include "convert_check.h"

LM_TEST(convert_qwen3moe_matches_llamacpp_file) {
    lm_cc_same_as_llamacpp_file(lm_t_, "qwen3-moe", "Q8_0", "model.Q8_0.gguf", 6);
}
/* the hybrid MoE: qkvz split, ba fused, shared expert and its gate, no tiling */
LM_TEST(convert_qwen3next_matches_llamacpp_file) {
    lm_cc_same_as_llamacpp_file(lm_t_, "qwen3-next", "Q8_0", "model.Q8_0.gguf", 12);
}
