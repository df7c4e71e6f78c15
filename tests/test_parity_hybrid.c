/* test_parity_hybrid.c - Qwen3.5 / Qwen3-Next hybrids against transformers'
 * logits: the shared fixtures (auto ISA and the scalar path) and three
 * configurations made for lumen in tests/data/hybrid (other layer patterns,
 * head layouts, kernel sizes, rotary fractions, routing; see its README). */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_parity.h"
#include "lm_test.h"

static void hybrid_parity_dir(lm_test_ctx *lm_t_, char *dir, lm_cpu_isa isa, int threads) {
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

static void hybrid_parity(lm_test_ctx *lm_t_, const char *model, lm_cpu_isa isa, int threads) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", model);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("../shared/fixtures not found (set LUMEN_FIXTURES)");
    hybrid_parity_dir(lm_t_, dir, isa, threads);
}

/* The repository's own data: no fixtures folder needed. */
static void hybrid_parity_data(lm_test_ctx *lm_t_, const char *model, lm_cpu_isa isa, int threads) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s/tests/data/hybrid/%s", LUMEN_SOURCE_DIR, model);
    hybrid_parity_dir(lm_t_, strdup(buf), isa, threads);
}

LM_TEST(hybrid_parity_qwen35) { hybrid_parity(lm_t_, "qwen3.5", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_qwen35_scalar) { hybrid_parity(lm_t_, "qwen3.5", LM_ISA_SCALAR, 3); }
LM_TEST(hybrid_parity_qwen3_next) { hybrid_parity(lm_t_, "qwen3-next", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_qwen3_next_scalar) { hybrid_parity(lm_t_, "qwen3-next", LM_ISA_SCALAR, 1); }
LM_TEST(hybrid_parity_data_qwen35_var) { hybrid_parity_data(lm_t_, "qwen3.5-var", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_data_qwen35_full_first) { hybrid_parity_data(lm_t_, "qwen3.5-full-first", LM_ISA_AUTO, 3); }
LM_TEST(hybrid_parity_data_qwen3_next_var) { hybrid_parity_data(lm_t_, "qwen3-next-var", LM_ISA_AUTO, 2); }
LM_TEST(hybrid_parity_data_qwen3_next_var_scalar) { hybrid_parity_data(lm_t_, "qwen3-next-var", LM_ISA_SCALAR, 1); }
