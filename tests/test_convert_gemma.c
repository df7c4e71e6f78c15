/* test_convert_gemma.c - `lumen convert` of Gemma 3 and Gemma 4 folders
 * against llama.cpp's files of the same fixtures (tests/data/gguf/gemma3,
 * gemma4: its converter, then llama-quantize), and a Gemma 3 checkpoint as
 * the Hub ships the multimodal ones (language_model.model.* beside vision
 * tensors, a flat config with linear rope scaling, a padded vocabulary).
 * Logits of the plain fixtures against their folders are test_convert.c's. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/lm_convert.h"
#include "convert_check.h"
#include "engine/lm_runner.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "hf_quant_gen.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "q35moe_gen.h"
#include "quant/lm_quant.h"
#include "test_util.h"

/* 1 + w norms, the sliding layers' rope base and window */
LM_TEST(convert_gemma3_matches_llamacpp_file) {
    lm_cc_same_as_llamacpp_file(lm_t_, "gemma3", "Q8_0", "model.Q8_0.gguf", 0);
}
/* per-layer inputs and head widths, the layer pattern, rope_freqs of the
 * proportional rope: llama.cpp's bf16 conversion bit for bit, and its Q8_0 */
LM_TEST(convert_gemma4_matches_llamacpp_file) {
    lm_cc_same_as_llamacpp_file(lm_t_, "gemma4", "BF16", "model.bf16.gguf", 0);
    lm_cc_same_as_llamacpp_file(lm_t_, "gemma4", "Q8_0", "model.Q8_0.gguf", 0);
}

#define PAD_ROWS 16 /* rows of the padded vocabulary the tokenizer has no token for */

/* The gemma3 fixture as google/gemma-3-*-it ships: config {model_type
 * gemma3, text_config (flat rope: rope_theta, rope_local_base_freq,
 * rope_scaling linear x8; vocab_size + PAD_ROWS), vision_config}, tensors
 * language_model.model.* (embed_tokens with PAD_ROWS more rows) and two
 * vision ones; in a new folder (malloc'd path), or NULL. */
static char *make_hub_gemma3(const char *src) {
    char *dir = lm_tu_mkdir("gemma3-hub"), p[1200];
    snprintf(p, sizeof p, "%s/config.json", src);
    json_t *tc = json_load_file(p, 0, NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    lm_safetensors st;
    lm_err e = { { 0 } };
    if (!tc || lm_safetensors_open(&st, p, &e)) return NULL;
    json_object_del(tc, "rope_parameters");
    json_object_set_new(tc, "rope_theta", json_real(1e6));
    json_object_set_new(tc, "rope_local_base_freq", json_real(1e4));
    json_object_set_new(tc, "rope_scaling", json_pack("{s:s, s:f}", "rope_type", "linear", "factor", 8.0));
    const int64_t V = json_integer_value(json_object_get(tc, "vocab_size"));
    json_object_set_new(tc, "vocab_size", json_integer(V + PAD_ROWS));
    json_t *cfg = json_pack("{s:s, s:[s], s:o, s:{s:s, s:i}}", "model_type", "gemma3", "architectures",
                            "Gemma3ForConditionalGeneration", "text_config", tc, "vision_config", "model_type",
                            "siglip_vision_model", "hidden_size", 8);
    snprintf(p, sizeof p, "%s/config.json", dir);
    int rc = json_dump_file(cfg, p, JSON_INDENT(2));
    json_decref(cfg);
    hqg_tensor *t = calloc((size_t)st.n_tensors + 2, sizeof *t);
    uint8_t *embed = NULL;
    static const uint16_t vision[4] = { 0x3f80, 0xbf80, 0x4000, 0x3f00 };
    int n = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const lm_file_tensor *s = &st.tensors[i];
        hqg_tensor *x = &t[n++];
        snprintf(x->name, sizeof x->name, "language_model.%s", s->name);
        x->dtype = "BF16";
        x->n_dims = s->n_dims;
        for (int d = 0; d < s->n_dims; d++) x->shape[d] = s->shape[d];
        x->data = s->data, x->nbytes = s->nbytes;
        if (!strcmp(s->name, "model.embed_tokens.weight")) { /* padded with rows of 1.0 */
            const size_t row = (size_t)s->shape[1] * 2;
            embed = malloc(s->nbytes + PAD_ROWS * row);
            memcpy(embed, s->data, s->nbytes);
            for (size_t k = 0; k < PAD_ROWS * row / 2; k++) ((uint16_t *)(embed + s->nbytes))[k] = 0x3f80;
            x->shape[0] += PAD_ROWS, x->data = embed, x->nbytes += PAD_ROWS * row;
        }
    }
    t[n++] = (hqg_tensor){ "vision_tower.vision_model.embeddings.patch_embedding.weight", "BF16", 2, { 2, 2 }, vision, 8 };
    t[n++] = (hqg_tensor){ "multi_modal_projector.mm_input_projection_weight", "BF16", 2, { 2, 2 }, vision, 8 };
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    rc |= hqg_write_safetensors(p, t, n);
    free(embed);
    free(t);
    lm_safetensors_close(&st);
    static const char *const side[] = { "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                        "reference.safetensors" };
    for (size_t i = 0; i < LM_COUNT(side) && !rc; i++) rc = q35_copy_file(src, dir, side[i]);
    if (rc) free(dir);
    return rc ? NULL : dir;
}

/* The converted file keeps the text model and the padded vocabulary (the
 * ids past the tokenizer's as [PADn] tokens), writes the linear scaling and
 * both rope bases, and gives the folder's logits. */
LM_TEST(convert_gemma3_hub_multimodal_checkpoint) {
    char *src = lm_test_fixture_path("models/gemma3");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = make_hub_gemma3(src);
    LM_REQUIRE(dir != NULL);
    char out[1200];
    snprintf(out, sizeof out, "%s/gemma3-hub.gguf", lm_test_tmpdir());
    lm_err e = { { 0 } };
    lm_quantize_report rep;
    lm_gguf g = { 0 };
    if (lm_convert_hf(dir, out, lm_quant_mix_find("BF16"), 2, &rep, &e) || lm_gguf_open(&g, out, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return;
    }
    const lm_file_tensor *emb = lm_gguf_find_tensor(&g, "token_embd.weight");
    const lm_gguf_kv *tokens = lm_gguf_find_kv(&g, "tokenizer.ggml.tokens");
    LM_CHECK(emb && emb->shape[0] == 1024 + PAD_ROWS && tokens && tokens->arr_count == 1024 + PAD_ROWS &&
             tokens->arr_strs[1024].len == 9 && !memcmp(tokens->arr_strs[1024].ptr, "[PAD1024]", 9));
    int vision = 0;
    for (int i = 0; i < g.n_tensors; i++) vision += strstr(g.tensors[i].name, "vision") || strstr(g.tensors[i].name, "mm_");
    LM_CHECK_MSG(vision == 0 && g.n_tensors == 80, "%d tensors, %d of a tower", g.n_tensors, vision);
    char *type = lm_gguf_get_str(&g, "gemma3.rope.scaling.type");
    double factor = 0, base = 0, swa = 0;
    lm_gguf_get_float(&g, "gemma3.rope.scaling.factor", &factor);
    lm_gguf_get_float(&g, "gemma3.rope.freq_base", &base);
    lm_gguf_get_float(&g, "gemma3.rope.freq_base_swa", &swa);
    LM_CHECK_MSG(type && !strcmp(type, "linear") && factor == 8 && base == 1e6 && swa == 1e4,
                 "rope %s x%g, bases %g / %g", type ? type : "(none)", factor, base, swa);
    free(type);
    lm_gguf_close(&g);

    /* the folder's logits over the real tokens, position by position */
    int32_t ids[64];
    const int n = lm_tu_ref_ids(dir, "prompt1.ids", ids, 64, &e);
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(n > 0 && be != NULL);
    lm_model *hf = NULL, *gg = NULL;
    if (lm_model_load(&hf, dir, be, &e) || lm_model_load(&gg, out, be, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return;
    }
    LM_REQUIRE(hf->cfg.vocab == 1024 + PAD_ROWS && gg->cfg.vocab == 1024 + PAD_ROWS);
    float *a = malloc((size_t)hf->cfg.vocab * sizeof *a), *b = malloc((size_t)gg->cfg.vocab * sizeof *b);
    lm_runner *ra = NULL, *rb = NULL;
    LM_REQUIRE(lm_runner_create(&ra, hf, n + 1, 0, &e) == 0 && lm_runner_create(&rb, gg, n + 1, 0, &e) == 0);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        LM_REQUIRE(lm_runner_eval(ra, ids + i, 1, false, a, &e) == 0 && lm_runner_eval(rb, ids + i, 1, false, b, &e) == 0);
        for (int v = 0; v < 1024 + PAD_ROWS; v++) worst = fmax(worst, fabs((double)a[v] - b[v]));
    }
    printf("  a Hub-layout Gemma 3 (multimodal, linear rope x8, %d padded rows): max |logit diff| %.3g over %d "
           "positions\n", PAD_ROWS, worst, n);
    LM_CHECK(worst <= 1e-5); /* the same bf16 weights and f32 norms: measured 0 */
    lm_runner_free(ra);
    lm_runner_free(rb);
    free(a);
    free(b);
    lm_model_free(hf);
    lm_model_free(gg);
    lm_backend_destroy(be);
    free(dir);
    free(src);
}
