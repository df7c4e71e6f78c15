/* test_qwen35_mlx.c - Qwen3.5 and Qwen3.5-MoE checkpoints as mlx-lm saves
 * them (mlx-community; mlx-bun runs these at 3 bits): the text model under
 * language_model.model. (Qwen3-Next: model.), its 1 + w norms stored
 * shifted, conv1d as [C][K][1], experts as switch_mlp stacks (q35moe_gen.c
 * writes that layout from the fixtures, following mlx-lm's qwen3_5,
 * qwen3_5_moe and qwen3_next sanitize).
 * Unquantised, such a folder is the fixture's model: lumen's parity run on
 * it must equal the fixture's bit for bit; quantised (3-bit MLX), it must
 * give its dequantised twin's logits exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_runner.h"
#include "hf_quant_gen.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "q35moe_gen.h"
#include "test_util.h"

/* Parity of the MLX-layout copy of src equals src's own, bit for bit. */
static void same_as(lm_test_ctx *lm_t_, const char *src, const char *mlx_src, bool language_model) {
    char *dst = lm_tu_mkdir("q35-mlx");
    LM_REQUIRE(q35_to_mlx(mlx_src, dst, language_model) == 0);
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(1, &e);
    lm_model *m = NULL;
    LM_REQUIRE(be != NULL);
    LM_CHECK_MSG(lm_model_load(&m, dst, be, &e) == 0, "%s", e.msg);
    lm_model_free(m);
    lm_backend_destroy(be);
    lm_parity_result a = { 0 }, b = { 0 };
    lm_tu_parity(lm_t_, src, LM_ISA_AUTO, 2, 3, &a);
    lm_tu_parity(lm_t_, dst, LM_ISA_AUTO, 2, 3, &b);
    LM_CHECK(a.max_abs_err > 0 && a.max_abs_err == b.max_abs_err && a.cache_vs_full == b.cache_vs_full);
    for (int i = 0; i < 3; i++) LM_CHECK(a.prompts[i].logits_max_abs == b.prompts[i].logits_max_abs);
    free(dst);
}

LM_TEST(qwen35_mlx_layout_matches_transformers) {
    char *src = lm_test_fixture_path("models/qwen3.5");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    same_as(lm_t_, src, src, true);
    free(src);
}

/* Qwen3.5-MoE: the qwen3-next fixture re-laid out (test_qwen35_moe.c), its
 * fused experts as switch_mlp stacks. */
LM_TEST(qwen35_moe_mlx_layout_matches_transformers) {
    char *src = lm_test_fixture_path("models/qwen3-next");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    char *moe = make_q35moe(src, "q35moe-for-mlx", false, false);
    LM_REQUIRE(moe != NULL);
    same_as(lm_t_, src, moe, true);
    free(moe), free(src);
}

/* Qwen3-Next as mlx-lm's qwen3_next keeps it: under model., its fused
 * in_proj_qkvz / in_proj_ba as they are; known by its conv1d's shape. */
LM_TEST(qwen3_next_mlx_layout_matches_transformers) {
    char *src = lm_test_fixture_path("models/qwen3-next");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    same_as(lm_t_, src, src, false);
    free(src);
}

/* All logits of a fixed prompt from the model in dir (malloc'd), or NULL:
 * on the CPU in exact mode, where quantised rows widen exactly (the GPU's
 * MLX products round activations; hf_quant's CUDA tests cover those). */
static float *mlx_logits(lm_test_ctx *lm_t_, const char *dir, int *V) {
    static const int32_t prompt[] = { 1, 334, 17, 12, 305, 44, 280, 903, 59, 377, 39, 201, 14, 90, 612, 31 };
    const int T = (int)LM_COUNT(prompt);
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
    if (be) lm_cpu_backend_quant_exact(be, true);
    lm_model *m = NULL;
    lm_runner *r = NULL;
    float *lg = NULL;
    if (be && lm_model_load(&m, dir, be, &e) == 0 && lm_runner_create(&r, m, 64, 64, &e) == 0) {
        *V = m->cfg.vocab;
        lg = malloc((size_t)T * (size_t)*V * sizeof(float));
        if (lm_runner_eval(r, prompt, T, true, lg, &e)) free(lg), lg = NULL;
    }
    LM_CHECK_MSG(lg != NULL, "%s: %s", dir, e.msg);
    lm_runner_free(r);
    lm_model_free(m);
    if (be) lm_backend_destroy(be);
    return lg;
}

/* 3-bit MLX quantisation of the MLX-layout Qwen3.5 (every matrix, the
 * embedding too) computes exactly what its dequantised twin does. */
LM_TEST(qwen35_mlx_3bit_equals_twin) {
    char *src = lm_test_fixture_path("models/qwen3.5");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    char *dst = lm_tu_mkdir("q35-mlx-src"), *q = lm_tu_mkdir("q35-mlx3"), *twin = lm_tu_mkdir("q35-mlx3-twin");
    char why[512] = "";
    LM_REQUIRE(q35_to_mlx(src, dst, true) == 0);
    LM_CHECK_MSG(hqg_convert(dst, HQG_MLX3_G64, q, twin, why, sizeof why) == 0, "%s", why);
    int V = 0, V2 = 0;
    float *a = mlx_logits(lm_t_, q, &V), *b = mlx_logits(lm_t_, twin, &V2);
    if (a && b && V == V2) {
        double gap = 0;
        for (size_t i = 0; i < 16 * (size_t)V; i++) gap = fmax(gap, fabs((double)a[i] - b[i]));
        printf("  3-bit MLX Qwen3.5 vs its dequantised twin: max |logit gap| %.3g\n", gap);
        LM_CHECK(gap == 0);
    }
    free(a), free(b), free(dst), free(q), free(twin), free(src);
}
