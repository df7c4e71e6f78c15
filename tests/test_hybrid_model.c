/* test_hybrid_model.c - the Qwen3.5 / Qwen3-Next hybrids beyond plain parity:
 * a prompt fed in chunks of any size gives the logits of one chunk (the
 * recurrent state carries across), the engine's batches give every request
 * its tokens alone, the multimodal checkpoint layout (model.language_model.*)
 * and the MTP head load, and broken checkpoints fail with one line naming
 * the file. Variants of the fixtures are written here: a safetensors file
 * re-made from the fixture's tensors, renamed, dropped or added. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/lm_file.h"
#include "engine/lm_engine.h"
#include "engine/lm_parity.h"
#include "engine/lm_runner.h"
#include "lm_test.h"
#include "model/lm_qwen35.h"
#include "format/safetensors.h"
#include "test_util.h"

/* ---- fixture variants --------------------------------------------------- */

/* A tensor of the new file: its name and where its bytes come from. */
typedef struct hv_tensor {
    char name[160];
    const lm_file_tensor *src;
} hv_tensor;

static int hv_write_safetensors(const char *path, const hv_tensor *t, int n) {
    size_t cap = 1 << 20, k = 0, off = 0;
    char *h = malloc(cap);
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        const lm_file_tensor *s = t[i].src;
        k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, s->type_name);
        for (int d = 0; d < s->n_dims; d++) k += (size_t)snprintf(h + k, cap - k, "%s%lld", d ? "," : "", (long long)s->shape[d]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%zu,%zu]}", off, off + s->nbytes);
        off += s->nbytes;
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    while ((8 + k) % 8) h[k++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(h);
        return -1;
    }
    uint64_t len = k;
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(len >> (8 * i));
    int ok = fwrite(le, 1, 8, f) == 8 && fwrite(h, 1, k, f) == k;
    for (int i = 0; i < n && ok; i++) ok = fwrite(t[i].src->data, 1, t[i].src->nbytes, f) == t[i].src->nbytes;
    ok &= fclose(f) == 0;
    free(h);
    return ok ? 0 : -1;
}

/* Replaces the first occurrence of `from` in s with `to` (new string). */
static char *hv_replace(const char *s, const char *from, const char *to) {
    const char *at = strstr(s, from);
    if (!at) return strdup(s);
    size_t n = strlen(s) - strlen(from) + strlen(to) + 1;
    char *r = malloc(n);
    snprintf(r, n, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    return r;
}

/* How a variant changes the fixture's tensors: each is renamed (prefix
 * from -> to), dropped (drop, exact name), and extra ones are appended as
 * copies of existing ones (extra[i][0] new name, extra[i][1] source). */
typedef struct hv_edit {
    const char *from, *to;
    const char *drop;
    const char *const (*extra)[2];
    int n_extra;
} hv_edit;

/* A folder holding fixture `name` with config text `config` (NULL: the
 * original), the tensors edited by ed, and the reference outputs. */
static char *hv_variant(const char *name, const char *tag, const char *config, const hv_edit *ed) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *src = lm_test_fixture_path(rel);
    if (!src) return NULL;
    char *dir = lm_tu_mkdir(tag);
    char *p = lm_path_join(src, "model.safetensors");
    lm_safetensors st;
    LM_ASSERT(lm_safetensors_open(&st, p, NULL) == 0);
    free(p);
    hv_tensor *t = calloc((size_t)st.n_tensors + 64, sizeof *t);
    int n = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const char *nm = st.tensors[i].name;
        if (ed && ed->drop && !strcmp(nm, ed->drop)) continue;
        if (ed && ed->from && !strncmp(nm, ed->from, strlen(ed->from)))
            snprintf(t[n].name, sizeof t[n].name, "%s%s", ed->to, nm + strlen(ed->from));
        else snprintf(t[n].name, sizeof t[n].name, "%s", nm);
        t[n++].src = &st.tensors[i];
    }
    for (int i = 0; ed && i < ed->n_extra; i++) {
        snprintf(t[n].name, sizeof t[n].name, "%s", ed->extra[i][0]);
        t[n].src = lm_safetensors_find(&st, ed->extra[i][1]);
        LM_ASSERT(t[n++].src);
    }
    p = lm_path_join(dir, "model.safetensors");
    LM_ASSERT(hv_write_safetensors(p, t, n) == 0);
    free(p);
    free(t);
    lm_safetensors_close(&st);
    const char *files[] = { "config.json", "reference.safetensors" };
    for (int i = 0; i < 2; i++) {
        char *a = lm_path_join(src, files[i]), *b = lm_path_join(dir, files[i]);
        size_t len;
        char *data = lm_tu_read(a, &len);
        if (i == 0 && config) lm_tu_write(b, config, strlen(config));
        else lm_tu_write(b, data, len);
        free(data);
        free(a);
        free(b);
    }
    free(src);
    return dir;
}

static char *hv_config(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s/config.json", name);
    char *p = lm_test_fixture_path(rel);
    char *c = p ? lm_tu_read(p, NULL) : NULL;
    free(p);
    return c;
}

static void hv_expect_error(lm_test_ctx *lm_t_, const char *dir, const char *needle1, const char *needle2) {
    lm_backend *be = lm_cpu_backend_create(1, LM_ISA_AUTO, NULL);
    lm_model *m = NULL;
    lm_err e = { { 0 } };
    int rc = lm_model_load(&m, dir, be, &e);
    LM_CHECK_MSG(rc == -1 && m == NULL, "loading %s should fail", dir);
    LM_CHECK_MSG(strstr(e.msg, needle1) != NULL, "message \"%s\" lacks \"%s\"", e.msg, needle1);
    if (needle2) LM_CHECK_MSG(strstr(e.msg, needle2) != NULL, "message \"%s\" lacks \"%s\"", e.msg, needle2);
    LM_CHECK_MSG(strchr(e.msg, '\n') == NULL, "message is not one line: %s", e.msg);
    lm_model_free(m);
    lm_backend_destroy(be);
}

/* Parity of a folder against its reference (the fixtures' standard). */
static void hv_parity(lm_test_ctx *lm_t_, const char *dir, lm_backend *be) {
    lm_parity_result res;
    lm_err e = { { 0 } };
    int rc = lm_parity_run(dir, be, 1e-3, &res, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    char *js = lm_parity_json(dir, be, &res);
    printf("  %s\n", js);
    free(js);
    LM_CHECK(res.ok && res.max_abs_err <= 1e-3 && res.cache_vs_full <= 1e-4);
    for (int i = 0; i < res.n_prompts; i++) LM_CHECK(res.prompts[i].greedy_mismatch == 0);
}

/* ---- bad input ------------------------------------------------------------------ */

LM_TEST(hybrid_load_errors_name_the_file) {
    char *cfg = hv_config("qwen3.5"), *cfg_next = hv_config("qwen3-next");
    if (!cfg || !cfg_next) LM_SKIP("%s", lm_test_fixtures_why());
    /* a missing tensor */
    hv_edit drop = { .drop = "model.layers.1.linear_attn.A_log" };
    char *dir = hv_variant("qwen3.5", "hyb-missing", NULL, &drop);
    hv_expect_error(lm_t_, dir, "model.safetensors", "missing tensor \"model.layers.1.linear_attn.A_log\"");
    free(dir);
    /* shapes that do not match the config */
    char *bad = hv_replace(cfg, "\"linear_num_value_heads\": 4", "\"linear_num_value_heads\": 8");
    dir = hv_variant("qwen3.5", "hyb-shape", bad, NULL);
    hv_expect_error(lm_t_, dir, "model.safetensors", "in_proj_qkv.weight\" has shape [128, 64], expected [192, 64]");
    free(bad), free(dir);
    bad = hv_replace(cfg, "\"linear_conv_kernel_dim\": 4", "\"linear_conv_kernel_dim\": 5");
    dir = hv_variant("qwen3.5", "hyb-conv", bad, NULL);
    hv_expect_error(lm_t_, dir, "model.safetensors", "conv1d.weight\" has shape [128, 1, 4], expected 640 elements");
    free(bad), free(dir);
    bad = hv_replace(cfg_next, "\"linear_value_head_dim\": 16", "\"linear_value_head_dim\": 8");
    dir = hv_variant("qwen3-next", "hyb-qkvz", bad, NULL);
    hv_expect_error(lm_t_, dir, "model.safetensors", "in_proj_qkvz.weight\" has shape [192, 64], expected [128, 64]");
    free(bad), free(dir);
    /* a missing expert of Qwen3-Next */
    hv_edit drop_expert = { .drop = "model.layers.2.mlp.experts.5.up_proj.weight" };
    dir = hv_variant("qwen3-next", "hyb-expert", NULL, &drop_expert);
    hv_expect_error(lm_t_, dir, "model.safetensors", "missing tensor \"model.layers.2.mlp.experts.5.up_proj.weight\"");
    free(dir);
    /* config errors name config.json */
    bad = hv_replace(cfg, "\"full_attention\"", "\"mamba\"");
    dir = hv_variant("qwen3.5", "hyb-types", bad, NULL);
    hv_expect_error(lm_t_, dir, "config.json", "layer_types[3] is \"mamba\"");
    free(bad), free(dir);
    bad = hv_replace(cfg, "\"linear_num_value_heads\": 4", "\"linear_num_value_heads\": 3");
    dir = hv_variant("qwen3.5", "hyb-heads", bad, NULL);
    hv_expect_error(lm_t_, dir, "config.json", "must be a positive multiple of linear_num_key_heads 2");
    free(bad), free(dir);
    free(cfg), free(cfg_next);
}

/* ---- checkpoint layouts ---------------------------------------------------------- */

/* Multimodal Qwen3.5: text weights under model.language_model.*, a vision
 * tower to ignore, the text config under text_config. Same logits. Tying
 * is read from the top level. */
LM_TEST(hybrid_multimodal_layout) {
    char *cfg = hv_config("qwen3.5");
    if (!cfg) LM_SKIP("%s", lm_test_fixtures_why());
    size_t n = strlen(cfg) + 512;
    char *mm = malloc(n);
    snprintf(mm, n, "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\", "
                    "\"tie_word_embeddings\": false, \"vision_config\": {\"depth\": 1}, \"text_config\": %s}", cfg);
    static const char *const vis[][2] = { { "model.visual.blocks.0.attn.qkv.weight", "model.layers.0.mlp.up_proj.weight" } };
    hv_edit ed = { .from = "model.", .to = "model.language_model.", .extra = vis, .n_extra = 1 };
    char *dir = hv_variant("qwen3.5", "hyb-mm", mm, &ed);
    lm_backend *be = lm_tu_model_backend(2, NULL);
    hv_parity(lm_t_, dir, be);
    free(dir);
    /* top-level tying wins over text_config, and then no lm_head is needed */
    char *tied = hv_replace(mm, "\"tie_word_embeddings\": false, \"vision", "\"tie_word_embeddings\": true, \"vision");
    hv_edit ed2 = { .from = "model.", .to = "model.language_model.", .drop = "lm_head.weight" };
    dir = hv_variant("qwen3.5", "hyb-mm-tied", tied, &ed2);
    lm_model *m = NULL;
    lm_err e = { { 0 } };
    LM_CHECK_MSG(lm_model_load(&m, dir, be, &e) == 0, "%s", e.msg);
    if (m) LM_CHECK(m->cfg.tie_embeddings && m->lm_head.data == m->embed.data && !strcmp(m->cfg.model_type, "qwen3_5_text"));
    lm_model_free(m);
    free(dir), free(tied), free(mm), free(cfg);
    lm_backend_destroy(be);
}

/* The MTP head is bound when present, exposed, and changes nothing else. */
static void mtp_case(lm_test_ctx *lm_t_, const char *fixture, bool sparse) {
    char *cfg = hv_config(fixture);
    if (!cfg) LM_SKIP("%s", lm_test_fixtures_why());
    /* layer 3 (full attention in both fixtures) stands in for the MTP layer */
    static const char *const layer3[] = {
        "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "self_attn.q_norm.weight", "self_attn.k_norm.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
        "mlp.gate.weight", "mlp.shared_expert_gate.weight", "mlp.shared_expert.gate_proj.weight",
        "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight",
    };
    char names[64][2][96];
    int k = 0;
    const char *fixed[][2] = {
        { "mtp.fc.weight", "model.layers.3.self_attn.o_proj.weight" }, /* [64][128] = [D][2D] */
        { "mtp.pre_fc_norm_embedding.weight", "model.norm.weight" },
        { "mtp.pre_fc_norm_hidden.weight", "model.norm.weight" },
        { "mtp.norm.weight", "model.norm.weight" },
    };
    for (size_t i = 0; i < LM_COUNT(fixed); i++, k++) {
        snprintf(names[k][0], 96, "%s", fixed[i][0]);
        snprintf(names[k][1], 96, "%s", fixed[i][1]);
    }
    for (size_t i = 0; i < LM_COUNT(layer3); i++) {
        bool moe_part = strstr(layer3[i], "mlp.gate.") || strstr(layer3[i], "shared_expert");
        bool dense_part = !moe_part && strstr(layer3[i], "mlp.");
        if ((sparse && dense_part) || (!sparse && moe_part)) continue;
        snprintf(names[k][0], 96, "mtp.layers.0.%s", layer3[i]);
        snprintf(names[k++][1], 96, "model.layers.3.%s", layer3[i]);
    }
    for (int x = 0; sparse && x < 8; x++) {
        const char *w[] = { "gate_proj", "up_proj", "down_proj" };
        for (int j = 0; j < 3; j++, k++) {
            snprintf(names[k][0], 96, "mtp.layers.0.mlp.experts.%d.%s.weight", x, w[j]);
            snprintf(names[k][1], 96, "model.layers.3.mlp.experts.%d.%s.weight", x, w[j]);
        }
    }
    const char *(*extra)[2] = calloc((size_t)k, sizeof *extra);
    for (int i = 0; i < k; i++) extra[i][0] = names[i][0], extra[i][1] = names[i][1];
    hv_edit ed = { .extra = (const char *const (*)[2])extra, .n_extra = k };
    char *with_n = hv_replace(cfg, "\"model_type\"", "\"mtp_num_hidden_layers\": 1, \"model_type\"");
    char *dir = hv_variant(fixture, "hyb-mtp", with_n, &ed);
    char *plain = hv_variant(fixture, "hyb-nomtp", NULL, NULL);
    lm_backend *be = lm_tu_model_backend(2, NULL);
    lm_model *m = NULL, *p = NULL;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_model_load(&m, dir, be, &e) == 0 && lm_model_load(&p, plain, be, &e) == 0);
    const lm_qwen35_mtp *h = lm_qwen35_mtp_head(m);
    LM_CHECK(h && h->n_layers == 1 && h->fc_emb.rows == 64 && h->fc_emb.cols == 64 && h->fc_hidden.cols == 64);
    LM_CHECK(h && !h->layers[0].linear && h->layers[0].moe == sparse && h->layers[0].attn.wgate.data);
    LM_CHECK(lm_qwen35_mtp_head(p) == NULL);
    /* a decode step does not read the MTP weights */
    LM_CHECK(lm_model_weight_bytes(m) == lm_model_weight_bytes(p));
    lm_model_free(m);
    lm_model_free(p);
    hv_parity(lm_t_, dir, be);
    lm_backend_destroy(be);
    free(extra), free(with_n), free(dir), free(plain), free(cfg);
}

/* A CPU backend whose weight uploads are counted (bytes a backend is asked
 * to hold: on the GPU, device memory). */
typedef struct hv_counting {
    lm_backend be;
    struct lm_backend_ops ops;
    lm_backend *cpu;
    size_t bytes;
} hv_counting;

static size_t hv_matrix_bytes(const lm_tensor *t) { return lm_dtype_row_bytes(t->type, t->cols) * (size_t)t->rows; }

static int hv_count_one(lm_backend *be, lm_tensor *t, const void *host, lm_err *e) {
    hv_counting *c = (hv_counting *)be;
    c->bytes += hv_matrix_bytes(t);
    return c->cpu->ops->upload_weight(be, t, host, e);
}

static int hv_count_group(lm_backend *be, int n, lm_tensor *const *t, const void *const *host, lm_err *e) {
    for (int i = 0; i < n; i++)
        if (hv_count_one(be, t[i], host[i], e)) return -1;
    return 0;
}

/* Every stored matrix reaches the backend exactly once: the re-laid-out
 * ones (the gated q_proj, Qwen3-Next's in_proj_qkvz / in_proj_ba, the MTP
 * fc) only as their parts, not also whole (they once went up both ways:
 * 2 GB of GPU memory on a Qwen3.5-27B). Uploads are counted against the
 * bytes of the checkpoint's 2-D tensors (the conv weights are 3-D and go
 * up as f32 copies, like the norms). */
static void uploads_case(lm_test_ctx *lm_t_, const char *fixture) {
    char *cfg = hv_config(fixture);
    if (!cfg) LM_SKIP("%s", lm_test_fixtures_why());
    /* an MTP head copied from layer 3, as mtp_case does, for its fc */
    hv_edit ed = { .extra = (const char *const[][2]){ { "mtp.fc.weight", "model.layers.3.self_attn.o_proj.weight" },
                                                      { "mtp.pre_fc_norm_embedding.weight", "model.norm.weight" },
                                                      { "mtp.pre_fc_norm_hidden.weight", "model.norm.weight" },
                                                      { "mtp.norm.weight", "model.norm.weight" } },
                   .n_extra = 4 };
    char *dir = hv_variant(fixture, "hyb-uploads", NULL, &ed);
    lm_err e = { { 0 } };
    hv_counting c = { 0 };
    c.cpu = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
    LM_REQUIRE(c.cpu);
    c.ops = *c.cpu->ops;
    c.ops.upload_weight = hv_count_one, c.ops.upload_weights = hv_count_group;
    c.be = *c.cpu;
    c.be.ops = &c.ops;
    lm_model *m = NULL;
    LM_REQUIRE(lm_model_load(&m, dir, &c.be, &e) == 0);
    size_t matrices = 0;
    for (int f = 0; f < m->weights->n_files; f++)
        for (int i = 0; i < m->weights->st[f].n_tensors; i++)
            if (m->weights->st[f].tensors[i].n_dims == 2) matrices += m->weights->st[f].tensors[i].nbytes;
    printf("  %s: %zu bytes uploaded, %zu bytes of 2-D tensors stored\n", fixture, c.bytes, matrices);
    LM_CHECK_MSG(c.bytes > 0 && c.bytes == matrices, "%zu bytes uploaded for %zu stored", c.bytes, matrices);
    LM_CHECK(lm_qwen35_mtp_head(m) != NULL);
    lm_model_free(m);
    lm_backend_destroy(c.cpu);
    free(dir), free(cfg);
}

LM_TEST(hybrid_uploads_each_matrix_once_qwen35) { uploads_case(lm_t_, "qwen3.5"); }
LM_TEST(hybrid_uploads_each_matrix_once_qwen3_next) { uploads_case(lm_t_, "qwen3-next"); }

LM_TEST(hybrid_mtp_head_qwen35) { mtp_case(lm_t_, "qwen3.5", false); }
LM_TEST(hybrid_mtp_head_qwen3_next) { mtp_case(lm_t_, "qwen3-next", true); }

/* ---- exactness ---------------------------------------------------------------------- */

/* prompt2 (300 tokens) fed in chunks of 1, 7, 64, 65 and 100 tokens gives the
 * logits of one 300-token forward at every position. */
static void chunks_case(lm_test_ctx *lm_t_, const char *fixture) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", fixture);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char *refp = lm_path_join(dir, "reference.safetensors");
    lm_backend *be = lm_tu_model_backend(2, NULL);
    lm_model *m = NULL;
    lm_safetensors ref;
    LM_REQUIRE(lm_model_load(&m, dir, be, NULL) == 0 && lm_safetensors_open(&ref, refp, NULL) == 0);
    const lm_file_tensor *ids_t = lm_safetensors_find(&ref, "prompt2.ids");
    LM_REQUIRE(ids_t && ids_t->shape[0] == 300);
    enum { N = 300 };
    int32_t ids[N];
    memcpy(ids, ids_t->data, sizeof ids);
    const int V = m->cfg.vocab;
    float *whole = malloc(sizeof(float) * N * V), *part = malloc(sizeof(float) * N * V);
    lm_runner *r = NULL;
    LM_REQUIRE(lm_runner_create(&r, m, N, 512, NULL) == 0);
    LM_REQUIRE(lm_runner_eval(r, ids, N, true, whole, NULL) == 0);
    lm_runner_free(r);
    const int chunks[] = { 1, 7, 64, 65, 100 };
    for (size_t c = 0; c < LM_COUNT(chunks); c++) {
        LM_REQUIRE(lm_runner_create(&r, m, N, chunks[c], NULL) == 0);
        LM_REQUIRE(lm_runner_eval(r, ids, N, true, part, NULL) == 0);
        double err = 0;
        for (size_t i = 0; i < (size_t)N * V; i++) err = fmax(err, fabs(whole[i] - part[i]));
        LM_CHECK_MSG(err <= 1e-4, "%s, chunks of %d: logits differ by %g", fixture, chunks[c], err);
        lm_runner_free(r);
    }
    free(whole), free(part), free(refp), free(dir);
    lm_safetensors_close(&ref);
    lm_model_free(m);
    lm_backend_destroy(be);
}

LM_TEST(hybrid_chunked_prefill_qwen35) { chunks_case(lm_t_, "qwen3.5"); }
LM_TEST(hybrid_chunked_prefill_qwen3_next) { chunks_case(lm_t_, "qwen3-next"); }

/* Six requests of different lengths at once (more than the engine runs in
 * parallel, so state slots are reused), prompts cut by the step budget:
 * each gets exactly its greedy tokens alone. */
static void engine_case(lm_test_ctx *lm_t_, const char *fixture, int step_tokens) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", fixture);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_tu_engine_concurrent_equals_alone(lm_t_, dir, step_tokens, 2, 20);
    free(dir);
}

LM_TEST(hybrid_engine_concurrent_equals_alone_qwen35) { engine_case(lm_t_, "qwen3.5", 512); }
LM_TEST(hybrid_engine_concurrent_equals_alone_qwen35_chunked) { engine_case(lm_t_, "qwen3.5", 24); }
LM_TEST(hybrid_engine_concurrent_equals_alone_qwen35_tiny_steps) { engine_case(lm_t_, "qwen3.5", 5); }
LM_TEST(hybrid_engine_concurrent_equals_alone_qwen3_next) { engine_case(lm_t_, "qwen3-next", 24); }
