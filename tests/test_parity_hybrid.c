/* test_parity_hybrid.c - the Qwen3.5 / Qwen3-Next hybrid fixtures against
 * transformers' logits (auto ISA and the scalar path), and the engine's
 * exactness on a hybrid model: concurrent requests, prompts split at
 * arbitrary points by the step budget, give the tokens each gives alone. */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_parity.h"
#include "lm_test.h"

static void hybrid_parity(lm_test_ctx *lm_t_, const char *model, lm_cpu_isa isa, int threads) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", model);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("../shared/fixtures not found (set LUMEN_FIXTURES)");
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(threads, isa, &e);
    if (!be) {
        free(dir);
        LM_SKIP("%s backend unavailable here: %s", lm_cpu_isa_name(isa), e.msg);
    }
    lm_parity_result res;
    int rc = lm_parity_run(dir, be, 1e-3, &res, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc == 0) {
        char *js = lm_parity_json(dir, be, &res);
        printf("  %s\n", js);
        free(js);
        LM_CHECK(res.n_prompts == 3);
        LM_CHECK(res.max_abs_err <= 1e-3);
        LM_CHECK(res.cache_vs_full <= 1e-4);
        for (int i = 0; i < res.n_prompts; i++) {
            LM_CHECK(res.prompts[i].greedy_mismatch == 0);
            LM_CHECK(res.prompts[i].greedy_steps == 24);
            LM_CHECK(res.prompts[i].greedy_checked >= 12);
        }
        LM_CHECK(res.ok);
    }
    lm_backend_destroy(be);
    free(dir);
}

LM_TEST(hybrid_parity_qwen35) { hybrid_parity(lm_t_, "qwen3.5", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_qwen35_scalar) { hybrid_parity(lm_t_, "qwen3.5", LM_ISA_SCALAR, 3); }
LM_TEST(hybrid_parity_qwen3_next) { hybrid_parity(lm_t_, "qwen3-next", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_qwen3_next_scalar) { hybrid_parity(lm_t_, "qwen3-next", LM_ISA_SCALAR, 1); }
