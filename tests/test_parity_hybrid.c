/* test_parity_hybrid.c - Qwen3.5 / Qwen3-Next hybrids against transformers'
 * logits: the shared fixtures (auto ISA and the scalar path) and three
 * configurations made for lumen in tests/data/hybrid (other layer patterns,
 * head layouts, kernel sizes, rotary fractions, routing; see its README). */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_parity.h"
#include "lm_test.h"
#include "test_util.h"

/* The repository's own data: no fixtures folder needed. */
static void hybrid_parity_data(lm_test_ctx *lm_t_, const char *model, lm_cpu_isa isa, int threads) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s/tests/data/hybrid/%s", LUMEN_SOURCE_DIR, model);
    lm_tu_parity(lm_t_, buf, isa, threads, 3, NULL);
}

LM_TEST(hybrid_parity_qwen35) { lm_tu_parity_fixture(lm_t_, "qwen3.5", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_qwen35_scalar) { lm_tu_parity_fixture(lm_t_, "qwen3.5", LM_ISA_SCALAR, 3); }
LM_TEST(hybrid_parity_qwen3_next) { lm_tu_parity_fixture(lm_t_, "qwen3-next", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_qwen3_next_scalar) { lm_tu_parity_fixture(lm_t_, "qwen3-next", LM_ISA_SCALAR, 1); }
LM_TEST(hybrid_parity_data_qwen35_var) { hybrid_parity_data(lm_t_, "qwen3.5-var", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_data_qwen35_full_first) { hybrid_parity_data(lm_t_, "qwen3.5-full-first", LM_ISA_AUTO, 3); }
LM_TEST(hybrid_parity_data_qwen3_next_var) { hybrid_parity_data(lm_t_, "qwen3-next-var", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_data_qwen3_next_var_scalar) { hybrid_parity_data(lm_t_, "qwen3-next-var", LM_ISA_SCALAR, 1); }
