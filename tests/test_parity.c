/* test_parity.c - the llama-family fixtures against transformers' logits,
 * on every CPU code path this machine has (the scalar one included). */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_parity.h"
#include "lm_test.h"

static void run_parity(lm_test_ctx *lm_t_, const char *model, lm_cpu_isa isa, int threads) {
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
            /* the check must have teeth: most steps have a comfortable margin */
            LM_CHECK(res.prompts[i].greedy_checked >= 12);
        }
        LM_CHECK(res.ok);
    }
    lm_backend_destroy(be);
    free(dir);
}

LM_TEST(parity_llama) { run_parity(lm_t_, "llama", LM_ISA_AUTO, 2); }
LM_TEST(parity_llama3_rope_mqa) { run_parity(lm_t_, "llama3-rope-mqa", LM_ISA_AUTO, 2); }
LM_TEST(parity_qwen3) { run_parity(lm_t_, "qwen3", LM_ISA_AUTO, 2); }
LM_TEST(parity_llama_scalar) { run_parity(lm_t_, "llama", LM_ISA_SCALAR, 1); }
LM_TEST(parity_qwen3_scalar) { run_parity(lm_t_, "qwen3", LM_ISA_SCALAR, 3); }
LM_TEST(parity_llama3_avx2) { run_parity(lm_t_, "llama3-rope-mqa", LM_ISA_AVX2, 2); }
LM_TEST(parity_qwen3_avx512) { run_parity(lm_t_, "qwen3", LM_ISA_AVX512, 2); }
