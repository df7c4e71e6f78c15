/* test_guard_parity.c - parity against transformers with tolerances derived
 * from what each fixture achieves (issue #25: with the general 1e-3 / 1e-4
 * bounds, RMSNorm's epsilon x3 still passed on qwen3 (7e-4) and gemma3
 * (6e-4), where the real error is ~2e-6).
 *
 * Design. For every model folder with a reference (the shared fixtures, the
 * demo model, tests/data), GUARD_WORST holds the worst error measured over
 * the CPU code paths (AVX-512, AVX2, scalar; results do not depend on the
 * thread count): the logits of the full forward and of teacher-forced greedy
 * steps against transformers, and cached decoding against the full forward.
 * The tolerance is GUARD_PARITY_MARGIN (5) times that. Each test runs
 * lm_parity_run on every ISA this machine has (the demo model on the best
 * one only: its scalar run takes ~9 s; sanitizer builds on the best one
 * only, see guard_util.h) and also demands the greedy contract
 * of lm_tu_parity (no mismatch where the margin is safe, >= 12 checked).
 * When the numerics improve, lower the numbers; when a change makes them
 * worse, the test says by how much.
 *
 * Measured (max over ISAs, this tree, gcc 13): see the table. With epsilon
 * x3 the logit error becomes 1.2e-2 (llama), 7e-4 (qwen3), 0.17 (qwen3-moe),
 * 2.0 (qwen3-next), 2.2 (qwen3.5), 6e-4 (gemma3), 2.8e-2 (gemma4): 58x or
 * more above these tolerances. These are CPU bounds: the backends run here
 * are CPU ones even when LUMEN_TEST_DEVICE=cuda (the GPU keeps the general
 * bounds of lm_tu_parity). */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_parity.h"
#include "guard_util.h"
#include "lm_test.h"

#define GUARD_PARITY_MARGIN 5.0

typedef struct guard_worst {
    const char *name; /* "models/X" under the fixtures, or a path under the source tree */
    bool in_repo;
    int n_prompts;
    double logits, cache; /* worst measured over the ISAs */
} guard_worst;

static const guard_worst GUARD_WORST[] = {
    { "models/llama", false, 3, 1.43e-6, 1.43e-6 },
    { "models/llama3-rope-mqa", false, 3, 1.31e-6, 1.43e-6 },
    { "models/qwen3", false, 3, 2.38e-6, 1.98e-6 },
    { "models/qwen3-moe", false, 3, 1.70e-6, 1.19e-6 },
    { "models/qwen3-next", false, 3, 7.63e-6, 4.98e-6 },
    { "models/qwen3.5", false, 3, 1.18e-5, 8.34e-6 },
    { "models/gemma3", false, 3, 2.71e-6, 2.38e-6 },
    { "models/gemma4", false, 3, 4.16e-5, 4.57e-5 },
    { "models/demo", true, 3, 4.01e-5, 2.32e-5 },
    { "tests/data/hybrid/qwen3.5-var", true, 3, 1.80e-5, 1.39e-5 },
    { "tests/data/hybrid/qwen3.5-full-first", true, 3, 2.32e-6, 2.65e-6 },
    { "tests/data/hybrid/qwen3-next-var", true, 3, 1.44e-5, 1.52e-5 },
    { "tests/data/moe/qwen3-moe-e16-k4-step2", true, 3, 2.44e-6, 1.76e-6 },
    { "tests/data/moe/qwen3-moe-e32-k8", true, 3, 1.19e-6, 1.13e-6 },
    { "tests/data/moe/qwen3-moe-e5-k1-bias", true, 3, 1.64e-6, 1.55e-6 },
    { "tests/data/gemma/gemma3-x", true, 1, 1.12e-5, 3.40e-6 },
    { "tests/data/gemma/gemma4-x", true, 1, 5.04e-5, 6.24e-5 },
};

static void guard_parity(lm_test_ctx *lm_t_, const char *name, bool best_isa_only) {
    const guard_worst *w = NULL;
    for (size_t i = 0; i < sizeof GUARD_WORST / sizeof *GUARD_WORST; i++)
        if (!strcmp(GUARD_WORST[i].name, name)) w = &GUARD_WORST[i];
    LM_REQUIRE(w != NULL);
    char *dir = NULL;
    if (w->in_repo) {
        size_t n = strlen(LUMEN_SOURCE_DIR) + strlen(name) + 2;
        dir = malloc(n);
        snprintf(dir, n, "%s/%s", LUMEN_SOURCE_DIR, name);
    } else if (!(dir = lm_test_fixture_path(name))) {
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    const double tol = GUARD_PARITY_MARGIN * w->logits, tol_cache = GUARD_PARITY_MARGIN * w->cache;
    /* every CPU path this machine has, the best first; AUTO is one of them */
    lm_cpu_isa best = lm_cpu_isa_detect();
    const lm_cpu_isa all[3] = { LM_ISA_AVX512, LM_ISA_AVX2, LM_ISA_SCALAR };
    int ran = 0;
    for (int k = 0; k < 3; k++) {
        lm_cpu_isa isa = all[k];
        if (best_isa_only || GU_SANITIZED ? isa != best
                                          : (isa == LM_ISA_AVX512 && best != LM_ISA_AVX512) ||
                                                (isa == LM_ISA_AVX2 && best == LM_ISA_SCALAR))
            continue;
        lm_err e = { { 0 } };
        lm_backend *be = lm_cpu_backend_create(2, isa, &e);
        LM_CHECK_MSG(be != NULL, "%s: %s", lm_cpu_isa_name(isa), e.msg);
        if (!be) continue;
        lm_parity_result res;
        int rc = lm_parity_run(dir, be, tol, &res, &e);
        LM_CHECK_MSG(rc == 0, "%s", e.msg);
        if (rc == 0) {
            printf("  %-38s %-6s logits %.3g (tol %.2g, %.1fx below), cache %.3g (tol %.2g)\n", name, lm_cpu_isa_name(isa),
                   res.max_abs_err, tol, tol / (res.max_abs_err > 0 ? res.max_abs_err : 1e-30), res.cache_vs_full,
                   tol_cache);
            LM_CHECK_MSG(res.max_abs_err <= tol, "%s %s: max |logit - transformers| %.3g > %.3g (%g x the measured %.3g)",
                         name, lm_cpu_isa_name(isa), res.max_abs_err, tol, GUARD_PARITY_MARGIN, w->logits);
            LM_CHECK_MSG(res.cache_vs_full <= tol_cache, "%s %s: cached vs full forward %.3g > %.3g", name,
                         lm_cpu_isa_name(isa), res.cache_vs_full, tol_cache);
            LM_CHECK(res.n_prompts == w->n_prompts);
            for (int i = 0; i < res.n_prompts; i++) {
                LM_CHECK(res.prompts[i].greedy_mismatch == 0);
                LM_CHECK(res.prompts[i].greedy_steps == 24 && res.prompts[i].greedy_checked >= 12);
            }
            ran++;
        }
        lm_backend_destroy(be);
    }
    LM_CHECK(ran >= 1);
    free(dir);
}

LM_TEST(guard_parity_llama) { guard_parity(lm_t_, "models/llama", false); }
LM_TEST(guard_parity_llama3_rope_mqa) { guard_parity(lm_t_, "models/llama3-rope-mqa", false); }
LM_TEST(guard_parity_qwen3) { guard_parity(lm_t_, "models/qwen3", false); }
LM_TEST(guard_parity_qwen3_moe) { guard_parity(lm_t_, "models/qwen3-moe", false); }
LM_TEST(guard_parity_qwen3_next) { guard_parity(lm_t_, "models/qwen3-next", false); }
LM_TEST(guard_parity_qwen35) { guard_parity(lm_t_, "models/qwen3.5", false); }
LM_TEST(guard_parity_gemma3) { guard_parity(lm_t_, "models/gemma3", false); }
LM_TEST(guard_parity_gemma4) { guard_parity(lm_t_, "models/gemma4", false); } /* slow: ~2 s (scalar 1.5 s) */
LM_TEST(guard_parity_demo) { guard_parity(lm_t_, "models/demo", true); }       /* slow: ~2 s */
LM_TEST(guard_parity_data_qwen35_var) { guard_parity(lm_t_, "tests/data/hybrid/qwen3.5-var", false); }
LM_TEST(guard_parity_data_qwen35_full_first) { guard_parity(lm_t_, "tests/data/hybrid/qwen3.5-full-first", false); }
LM_TEST(guard_parity_data_qwen3_next_var) { guard_parity(lm_t_, "tests/data/hybrid/qwen3-next-var", false); }
LM_TEST(guard_parity_data_moe_e16_k4_step2) { guard_parity(lm_t_, "tests/data/moe/qwen3-moe-e16-k4-step2", false); }
LM_TEST(guard_parity_data_moe_e32_k8) { guard_parity(lm_t_, "tests/data/moe/qwen3-moe-e32-k8", false); }
LM_TEST(guard_parity_data_moe_e5_k1_bias) { guard_parity(lm_t_, "tests/data/moe/qwen3-moe-e5-k1-bias", false); }
LM_TEST(guard_parity_data_gemma3_x) { guard_parity(lm_t_, "tests/data/gemma/gemma3-x", false); }
LM_TEST(guard_parity_data_gemma4_x) { guard_parity(lm_t_, "tests/data/gemma/gemma4-x", false); }
