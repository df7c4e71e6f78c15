/* test_parity.c - the llama-family fixtures against transformers' logits,
 * on every CPU code path this machine has (the scalar one included). */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_parity.h"
#include "lm_test.h"
#include "test_util.h"

LM_TEST(parity_llama) { lm_tu_parity_fixture(lm_t_, "llama", LM_ISA_AUTO, 2); }
LM_TEST(parity_llama3_rope_mqa) { lm_tu_parity_fixture(lm_t_, "llama3-rope-mqa", LM_ISA_AUTO, 2); }
LM_TEST(parity_qwen3) { lm_tu_parity_fixture(lm_t_, "qwen3", LM_ISA_AUTO, 2); }
LM_TEST(parity_llama_scalar) { lm_tu_parity_fixture(lm_t_, "llama", LM_ISA_SCALAR, 1); }
LM_TEST(parity_qwen3_scalar) { lm_tu_parity_fixture(lm_t_, "qwen3", LM_ISA_SCALAR, 3); }
LM_TEST(parity_llama3_avx2) { lm_tu_parity_fixture(lm_t_, "llama3-rope-mqa", LM_ISA_AVX2, 2); }
LM_TEST(parity_qwen3_avx512) { lm_tu_parity_fixture(lm_t_, "qwen3", LM_ISA_AVX512, 2); }
