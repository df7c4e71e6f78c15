/* test_convert_hybrid.c - `lumen convert` of the Qwen3.5 hybrid beyond the
 * byte-for-byte check against llama.cpp's converter (test_convert.c):
 * the demo model's MTP head goes into the GGUF as llama.cpp's nextn layer
 * and comes back out of it (the same guesses as from the folder, at every
 * step of a speculative run), the converted file runs in llama.cpp with
 * lumen's greedy tokens, and a multimodal checkpoint's text model
 * (model.language_model.*, text_config, a vision tower) converts to the
 * same bytes as the text-only checkpoint (its special token ids at the top
 * level of config.json, where they are read). */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/lm_convert.h"
#include "engine/lm_engine.h"
#include "format/safetensors.h"
#include "hf_quant_gen.h"
#include "lm_test.h"
#include "model/lm_arch.h"
#include "model/lm_model.h"
#include "test_util.h"

#define DEMO LUMEN_SOURCE_DIR "/models/demo"
#define HY_GEN LM_TU_MTP_GEN

/* models/demo converted to BF16 in the tmpdir (malloc'd path), or NULL. */
static char *convert_demo(lm_test_ctx *lm_t_) {
    char out[512];
    snprintf(out, sizeof out, "%s/demo-hybrid.bf16.gguf", lm_test_tmpdir());
    lm_err e = { { 0 } };
    lm_quantize_report rep;
    int rc = lm_convert_hf(DEMO, out, lm_quant_mix_find("BF16"), 2, &rep, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    return rc == 0 ? strdup(out) : NULL;
}

/* The demo's MTP head survives the round trip: the GGUF has it, and a
 * speculative run guesses, accepts and hands out exactly what the folder's
 * does (a guess differing anywhere would change the counts). */
LM_TEST(convert_hybrid_keeps_the_mtp_head) {
    char *gguf = convert_demo(lm_t_);
    LM_REQUIRE(gguf != NULL);
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    lm_model *hf = NULL, *gg = NULL;
    if (!be || lm_model_load(&hf, DEMO, be, &e) || lm_model_load(&gg, gguf, be, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        goto done;
    }
    LM_CHECK(lm_model_draft(hf) != NULL && lm_model_draft(gg) != NULL);
    LM_CHECK(gg->cfg.n_layers == hf->cfg.n_layers);
    static const int32_t prompt[] = { 1, 334, 1017, 12, 305, 44, 280, 1203, 59, 377, 39, 2001, 14, 90, 612, 31 };
    lm_tu_mtp_out a, b;
    lm_tu_mtp_run(lm_t_, hf, prompt, (int)LM_COUNT(prompt), &a);
    lm_tu_mtp_run(lm_t_, gg, prompt, (int)LM_COUNT(prompt), &b);
    printf("  folder: %llu verifies, %llu of %llu guesses accepted; GGUF: %llu, %llu of %llu\n",
           (unsigned long long)a.st.spec_verifies, (unsigned long long)a.st.spec_accepted,
           (unsigned long long)a.st.spec_drafted, (unsigned long long)b.st.spec_verifies,
           (unsigned long long)b.st.spec_accepted, (unsigned long long)b.st.spec_drafted);
    LM_CHECK(a.n == HY_GEN && b.n == a.n && !memcmp(a.toks, b.toks, sizeof a.toks));
    LM_CHECK(a.st.spec_drafted > 0 && a.st.spec_accepted > 0);
    LM_CHECK(a.st.spec_drafted == b.st.spec_drafted && a.st.spec_accepted == b.st.spec_accepted);
    for (int i = 0; i < 3; i++) LM_CHECK(a.st.spec_pos_accepted[i] == b.st.spec_pos_accepted[i]);
done:
    lm_model_free(hf);
    lm_model_free(gg);
    if (be) lm_backend_destroy(be);
    free(gguf);
}

/* llama.cpp loads the conversion, nextn layer and all, and its greedy
 * tokens are lumen's. */
LM_TEST(convert_hybrid_runs_in_llamacpp) {
    const char *why = lm_tu_llamacpp_missing();
    if (why) LM_SKIP("%s", why);
    char *gguf = convert_demo(lm_t_);
    LM_REQUIRE(gguf != NULL);
    static const int32_t prompt[] = { 1, 334, 1017, 12, 305, 44, 280, 1203 };
    char *out = lm_tu_llamacpp_answer(lm_t_, gguf, prompt, (int)LM_COUNT(prompt), 8);
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    json_t *ids = json_object_get(j, "greedy_ids");
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    lm_model *m = NULL;
    int32_t ours[8];
    if (be && lm_model_load(&m, gguf, be, &e) == 0 && lm_tu_greedy_alone(m, prompt, (int)LM_COUNT(prompt), 8, ours) == 0) {
        LM_CHECK(json_array_size(ids) == 8);
        int same = 0;
        for (size_t i = 0; i < json_array_size(ids) && i < 8; i++) same += json_integer_value(json_array_get(ids, i)) == ours[i];
        printf("  llama.cpp on lumen's conversion: %d of 8 greedy tokens as lumen's\n", same);
        LM_CHECK(same == 8);
    } else {
        LM_CHECK_MSG(0, "%s", e.msg);
    }
    lm_model_free(m);
    if (be) lm_backend_destroy(be);
    json_decref(j);
    free(out), free(gguf);
}

/* Copies file name from src to dst; 0 on success. */
static int copy_file(const char *src, const char *dst, const char *name) {
    char a[2100], b[2100];
    snprintf(a, sizeof a, "%s/%s", src, name);
    snprintf(b, sizeof b, "%s/%s", dst, name);
    size_t n;
    char *d = lm_tu_read(a, &n);
    int rc = d ? lm_tu_write(b, d, n) : -1;
    free(d);
    return rc;
}

/* The qwen3.5-g256 fixture as a multimodal checkpoint: model_type qwen3_5
 * with its config under text_config, tensors under model.language_model.,
 * and a vision tensor; in a folder of the same name, so general.name is
 * the same. Returns the folder (malloc'd) or NULL. */
static char *make_multimodal(lm_test_ctx *lm_t_, const char *src) {
    char *root = lm_tu_mkdir("convert-mm"), dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/qwen3.5-g256", root);
    free(root);
    if (mkdir(dir, 0755) && errno != EEXIST) return NULL;
    lm_err e = { { 0 } };
    lm_safetensors st;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    if (lm_safetensors_open(&st, path, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return NULL;
    }
    hqg_tensor *t = calloc((size_t)st.n_tensors + 1, sizeof *t);
    static const uint16_t vis[4] = { 0x3f80, 0x4000, 0x4040, 0x4080 };
    int n = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const lm_file_tensor *s = &st.tensors[i];
        const char *name = s->name;
        if (!strncmp(name, "model.", 6)) snprintf(t[n].name, sizeof t[n].name, "model.language_model.%s", name + 6);
        else snprintf(t[n].name, sizeof t[n].name, "%s", name);
        t[n].dtype = s->type == LM_F32 ? "F32" : "BF16";
        t[n].n_dims = s->n_dims;
        for (int d = 0; d < s->n_dims && d < 3; d++) t[n].shape[d] = s->shape[d];
        t[n].data = s->data, t[n].nbytes = s->nbytes;
        n++;
    }
    snprintf(t[n].name, sizeof t[n].name, "model.visual.patch_embed.proj.weight");
    t[n].dtype = "BF16", t[n].n_dims = 2, t[n].shape[0] = 2, t[n].shape[1] = 2, t[n].data = vis, t[n].nbytes = 8;
    n++;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = hqg_write_safetensors(path, t, n);
    free(t);
    lm_safetensors_close(&st);
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *text = json_load_file(path, 0, NULL), *cfg = json_object();
    json_object_set_new(cfg, "architectures", json_pack("[s]", "Qwen3_5ForConditionalGeneration"));
    json_object_set_new(cfg, "model_type", json_string("qwen3_5"));
    json_object_set(cfg, "text_config", text);
    /* the special ids are read from the top level (llama.cpp's SpecialVocab reads config.json so) */
    json_object_set(cfg, "eos_token_id", json_object_get(text, "eos_token_id"));
    json_object_set(cfg, "pad_token_id", json_object_get(text, "pad_token_id"));
    json_object_set_new(cfg, "vision_config", json_pack("{s:i}", "depth", 1));
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc |= !text || json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg), json_decref(text);
    static const char *const side[] = { "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                        "chat_template.jinja" };
    for (size_t i = 0; i < LM_COUNT(side); i++) {
        snprintf(path, sizeof path, "%s/%s", src, side[i]);
        if (access(path, R_OK) == 0) rc |= copy_file(src, dir, side[i]);
    }
    LM_CHECK_MSG(rc == 0, "could not write the multimodal copy in %s", dir);
    return rc == 0 ? strdup(dir) : NULL;
}

LM_TEST(convert_hybrid_multimodal_text_model) {
    char *src = lm_test_fixture_path("gguf/qwen3.5-g256"), *theirs = lm_test_fixture_path("gguf/qwen3.5-g256/model.bf16.gguf");
    if (!src || !theirs) {
        free(src), free(theirs);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    char *dir = make_multimodal(lm_t_, src), out[1200];
    if (dir) {
        snprintf(out, sizeof out, "%s/out.gguf", dir);
        lm_err e = { { 0 } };
        lm_quantize_report rep;
        LM_CHECK_MSG(lm_convert_hf(dir, out, lm_quant_mix_find("BF16"), 2, &rep, &e) == 0, "%s", e.msg);
        size_t na = 0, nb = 0;
        char *a = lm_tu_read(out, &na), *b = lm_tu_read(theirs, &nb);
        LM_CHECK_MSG(a && b && na == nb && !memcmp(a, b, na), "%zu bytes against the text-only conversion's %zu", na,
                     nb);
        free(a), free(b);
    }
    free(dir), free(src), free(theirs);
}
