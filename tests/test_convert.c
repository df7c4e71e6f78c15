/* test_convert.c - `lumen convert` against llama.cpp's convert_hf_to_gguf.py.
 *
 * The gguf fixtures' model.bf16.gguf were written by llama.cpp's converter
 * from the Hugging Face folder beside them: lumen converting the same folder
 * must write the same bytes (metadata keys, values and order, tokenizer,
 * chat template, tensor names, order, q/k permutation, alignment). A
 * converted model folder gives the folder's logits: the weights are the same
 * bf16 values, but lumen runs a llama GGUF's permuted q/k with interleaved
 * rope (model/gguf_config.c) instead of undoing the permutation, so each
 * attention score sums its products in another order and logits differ in
 * the last bits (CONVERT_LOGIT_TOL is 10x the worst difference measured).
 * Quantising a folder is quantising its conversion. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/lm_convert.h"
#include "engine/lm_runner.h"
#include "format/safetensors.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "test_util.h"

#define CONVERT_LOGIT_TOL 1e-5 /* measured 1.07e-6 on models/llama */

/* lumen convert of the fixture folder rel under mix into the tmpdir; malloc'd path or NULL. */
static char *convert_fixture(lm_test_ctx *lm_t_, const char *dir, const char *mix, lm_err *e) {
    char out[512];
    snprintf(out, sizeof out, "%s/conv-%s-%s.gguf", lm_test_tmpdir(), strrchr(dir, '/') + 1, mix);
    lm_quantize_report rep;
    int rc = lm_convert_hf(dir, out, lm_quant_mix_find(mix), 2, &rep, e);
    LM_CHECK_MSG(rc == 0, "%s", e->msg);
    return rc == 0 ? strdup(out) : NULL;
}

static void check_same_bytes(lm_test_ctx *lm_t_, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "gguf/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    snprintf(rel, sizeof rel, "gguf/%s/model.bf16.gguf", name);
    char *theirs = lm_test_fixture_path(rel);
    lm_err e = { { 0 } };
    char *ours = convert_fixture(lm_t_, dir, "BF16", &e);
    LM_REQUIRE(ours && theirs);
    size_t na, nb;
    char *a = lm_tu_read(ours, &na), *b = lm_tu_read(theirs, &nb);
    size_t first = 0;
    while (a && b && first < na && first < nb && a[first] == b[first]) first++;
    LM_CHECK_MSG(a && b && na == nb && first == na, "%s: %zu vs %zu bytes, first difference at %zu", name, na, nb,
                 first);
    printf("  %s: lumen convert wrote llama.cpp's %zu bytes exactly\n", name, nb);
    free(a);
    free(b);
    free(ours);
    free(theirs);
    free(dir);
}

LM_TEST(convert_llama_matches_llamacpp_converter) { check_same_bytes(lm_t_, "llama-g256"); }
LM_TEST(convert_qwen3_matches_llamacpp_converter) { check_same_bytes(lm_t_, "qwen3-g256"); }
/* the hybrid: +1 norms, -exp(A_log), value heads re-ordered to tiled, conv1d squeezed */
LM_TEST(convert_qwen35_matches_llamacpp_converter) { check_same_bytes(lm_t_, "qwen3.5-g256"); }

/* Logits of every position of prompt1 through a runner. */
static float *all_logits(lm_test_ctx *lm_t_, lm_model *m, const int32_t *ids, int n) {
    lm_err e = { { 0 } };
    lm_runner *r = NULL;
    float *out = malloc((size_t)n * m->cfg.vocab * sizeof *out);
    LM_CHECK(lm_runner_create(&r, m, n + 1, 0, &e) == 0 && lm_runner_eval(r, ids, n, true, out, &e) == 0);
    lm_runner_free(r);
    return out;
}

static void check_same_logits_dir(lm_test_ctx *lm_t_, const char *name, char *dir) {
    lm_err e = { { 0 } };
    char *gguf = convert_fixture(lm_t_, dir, "BF16", &e);
    LM_REQUIRE(gguf != NULL);
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    lm_safetensors st;
    LM_REQUIRE(lm_safetensors_open(&st, path, &e) == 0);
    const lm_file_tensor *ti = lm_safetensors_find(&st, "prompt1.ids");
    LM_REQUIRE(ti && ti->type == LM_I32);
    int n = (int)ti->shape[0];
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    memcpy(ids, ti->data, (size_t)n * sizeof *ids);
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_model *hf = NULL, *gg = NULL;
    LM_REQUIRE(lm_model_load(&hf, dir, be, &e) == 0);
    if (lm_model_load(&gg, gguf, be, &e) != 0) {
        lm_model_free(hf);
        lm_backend_destroy(be);
        lm_safetensors_close(&st);
        free(ids);
        free(gguf);
        free(dir);
        LM_REQUIRE(strstr(e.msg, "unsupported GGUF architecture"));
        LM_SKIP("lumen cannot load this architecture's GGUF yet: %s", e.msg);
    }
    LM_REQUIRE(hf->cfg.vocab == gg->cfg.vocab);
    float *a = all_logits(lm_t_, hf, ids, n), *b = all_logits(lm_t_, gg, ids, n);
    size_t count = (size_t)n * hf->cfg.vocab, same = 0;
    double worst = 0;
    for (size_t i = 0; i < count; i++) {
        same += a[i] == b[i];
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    }
    printf("  %s: %zu of %zu logits identical (folder vs its conversion), max |diff| %.3g\n", name, same, count,
           worst);
    LM_CHECK(worst <= CONVERT_LOGIT_TOL);
    free(a);
    free(b);
    free(ids);
    lm_model_free(hf);
    lm_model_free(gg);
    lm_backend_destroy(be);
    lm_safetensors_close(&st);
    free(gguf);
    free(dir);
}

static void check_same_logits(lm_test_ctx *lm_t_, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    check_same_logits_dir(lm_t_, name, dir);
}

LM_TEST(convert_llama_same_logits_as_folder) { check_same_logits(lm_t_, "llama"); }
LM_TEST(convert_qwen3_same_logits_as_folder) { check_same_logits(lm_t_, "qwen3"); }
LM_TEST(convert_qwen35_same_logits_as_folder) { check_same_logits(lm_t_, "qwen3.5"); }
LM_TEST(convert_qwen3moe_same_logits_as_folder) { check_same_logits(lm_t_, "qwen3-moe"); }
LM_TEST(convert_qwen3next_same_logits_as_folder) { check_same_logits(lm_t_, "qwen3-next"); }
/* 1 + w norms undone by the GGUF loader; sliding windows */
LM_TEST(convert_gemma3_same_logits_as_folder) { check_same_logits(lm_t_, "gemma3"); }
/* per-layer inputs, per-layer head widths, the proportional rope as rope_freqs */
LM_TEST(convert_gemma4_same_logits_as_folder) { check_same_logits(lm_t_, "gemma4"); }
/* Llama 3 rope scaling becomes rope_freqs.weight; tied embeddings, MQA */
LM_TEST(convert_llama3_rope_same_logits_as_folder) { check_same_logits(lm_t_, "llama3-rope-mqa"); }

/* The same folder with its config in the Hub's layout (rope_theta at the
 * top, the scaling under rope_scaling), as most released checkpoints have. */
LM_TEST(convert_llama3_rope_hub_config) {
    char *src = lm_test_fixture_path("models/llama3-rope-mqa");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = lm_tu_mkdir("llama3-hub");
    static const char *const files[] = { "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                         "reference.safetensors", "chat_template.jinja", "generation_config.json" };
    char a[1024], b[1024];
    for (size_t i = 0; i < LM_COUNT(files); i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (access(a, F_OK) == 0) LM_CHECK(symlink(a, b) == 0);
    }
    snprintf(a, sizeof a, "%s/config.json", src);
    json_t *cfg = json_load_file(a, 0, NULL);
    LM_REQUIRE(cfg != NULL);
    json_t *rp = json_deep_copy(json_object_get(cfg, "rope_parameters"));
    LM_REQUIRE(json_is_object(rp));
    json_object_set(cfg, "rope_theta", json_object_get(rp, "rope_theta"));
    json_object_del(rp, "rope_theta");
    json_object_set_new(cfg, "rope_scaling", rp);
    json_object_del(cfg, "rope_parameters");
    snprintf(b, sizeof b, "%s/config.json", dir);
    LM_REQUIRE(json_dump_file(cfg, b, JSON_INDENT(2)) == 0);
    json_decref(cfg);
    free(src);
    check_same_logits_dir(lm_t_, "llama3-rope-mqa (Hub config)", dir);
}

/* lumen quantize of a folder writes what quantising its conversion writes
 * (one thread against three: the thread count changes nothing);
 * what convert cannot do yet is refused with a message saying what. */
LM_TEST(convert_quantize_folder_and_refusals) {
    char *dir = lm_test_fixture_path("gguf/llama-g256");
    char *bf16 = lm_test_fixture_path("gguf/llama-g256/model.bf16.gguf");
    if (!dir || !bf16) LM_SKIP("%s", lm_test_fixtures_why());
    char *gem = lm_tu_mkdir("phi3");
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/from-folder.gguf", lm_test_tmpdir());
    snprintf(b, sizeof b, "%s/from-gguf.gguf", lm_test_tmpdir());
    lm_err e = { { 0 } };
    lm_quantize_report rep;
    LM_REQUIRE(lm_convert_hf(dir, a, lm_quant_mix_find("Q4_K_M"), 1, &rep, &e) == 0);
    LM_REQUIRE(lm_quantize_gguf(bf16, b, lm_quant_mix_find("Q4_K_M"), 3, &rep, &e) == 0);
    size_t na, nb;
    char *da = lm_tu_read(a, &na), *db = lm_tu_read(b, &nb);
    LM_CHECK(da && db && na == nb && !memcmp(da, db, na));
    free(da);
    free(db);
    /* an architecture convert does not know: its model_type, and the list */
    snprintf(b, sizeof b, "%s/config.json", gem);
    LM_REQUIRE(lm_tu_write(b, "{\"model_type\": \"phi3\"}", 22) == 0);
    LM_CHECK(lm_convert_hf(gem, a, lm_quant_mix_find("BF16"), 0, &rep, &e) != 0 && strstr(e.msg, "\"phi3\"") &&
             strstr(e.msg, "gemma4"));
    printf("  %s\n", e.msg);
    free(dir);
    free(bf16);
    free(gem);
}
