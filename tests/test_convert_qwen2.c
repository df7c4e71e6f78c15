/* test_convert_qwen2.c - lumen convert of a qwen2 folder, checked by
 * llama.cpp itself.
 *
 * No fixture is a qwen2 checkpoint, so the test makes one: models/llama's
 * tensors (the same HF names) plus q/k/v biases, with model_type qwen2.
 * lumen runs the folder; llama.cpp (tools/llamacpp/oracle.mjs) runs lumen's
 * conversion of it; the last position's log-probabilities must agree as
 * closely as on llama.cpp's own bf16 files (GUARD_KQ_WORST in
 * test_guard_kquant.c: 0.017, KL 1.1e-5; tolerances 3x). A wrong name, a
 * dropped bias or a permutation qwen2 must not have moves them far more.
 * Skipped, with the reason, without node-llama-cpp. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/lm_convert.h"
#include "engine/lm_runner.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "test_util.h"

#define QWEN2_LOGPROB_TOL 0.05
#define QWEN2_KL_TOL 3.3e-5

/* A bias of n bf16 values, reproducible, of size ~0.05. */
static uint16_t *make_bias(int n, unsigned seed) {
    uint16_t *b = malloc((size_t)n * sizeof *b);
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        b[i] = lm_f32_to_bf16(((float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f) * 0.1f);
    }
    return b;
}

/* Writes DIR/model.safetensors: src's tensors plus biases (names sorted). */
static int write_qwen2_weights(const lm_safetensors *src, const char *dir, int n_layer) {
    int n_bias = 3 * n_layer, n = src->n_tensors + n_bias;
    const char **names = calloc((size_t)n, sizeof *names);
    const void **data = calloc((size_t)n, sizeof *data);
    size_t *bytes = calloc((size_t)n, sizeof *bytes);
    int64_t *rows = calloc((size_t)n, sizeof *rows);
    char (*bias_names)[96] = calloc((size_t)n_bias, sizeof *bias_names);
    for (int i = 0; i < src->n_tensors; i++) {
        names[i] = src->tensors[i].name, data[i] = src->tensors[i].data, bytes[i] = src->tensors[i].nbytes;
        rows[i] = -1;
    }
    static const char *const proj[3] = { "q", "k", "v" };
    for (int l = 0, k = src->n_tensors; l < n_layer; l++) {
        for (int p = 0; p < 3; p++, k++) {
            char w[96];
            snprintf(w, sizeof w, "model.layers.%d.self_attn.%s_proj.weight", l, proj[p]);
            const lm_file_tensor *t = lm_safetensors_find(src, w);
            if (!t) return -1;
            snprintf(bias_names[k - src->n_tensors], 96, "model.layers.%d.self_attn.%s_proj.bias", l, proj[p]);
            names[k] = bias_names[k - src->n_tensors];
            rows[k] = t->shape[0];
            data[k] = make_bias((int)t->shape[0], (unsigned)(k * 7919));
            bytes[k] = (size_t)t->shape[0] * 2;
        }
    }
    /* sort by name (simple insertion: a few dozen tensors) */
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            const char *tn = names[j]; names[j] = names[j - 1]; names[j - 1] = tn;
            const void *td = data[j]; data[j] = data[j - 1]; data[j - 1] = td;
            size_t tb = bytes[j]; bytes[j] = bytes[j - 1]; bytes[j - 1] = tb;
            int64_t tr = rows[j]; rows[j] = rows[j - 1]; rows[j - 1] = tr;
        }
    }
    json_t *hdr = json_object();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const lm_file_tensor *t = rows[i] < 0 ? lm_safetensors_find(src, names[i]) : NULL;
        json_t *shape = json_array();
        if (t) {
            for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        } else {
            json_array_append_new(shape, json_integer(rows[i]));
        }
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", t ? t->type_name : "BF16", "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)(off + bytes[i]));
        json_object_set_new(hdr, names[i], e);
        off += bytes[i];
    }
    char *h = json_dumps(hdr, JSON_COMPACT);
    size_t hl = strlen(h), padded = (hl + 7) / 8 * 8;
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    uint64_t len = padded;
    int rc = f ? 0 : -1;
    if (f) {
        fwrite(&len, 8, 1, f);
        fwrite(h, 1, hl, f);
        for (size_t i = hl; i < padded; i++) fputc(' ', f);
        for (int i = 0; i < n; i++) fwrite(data[i], 1, bytes[i], f);
        rc = fclose(f);
    }
    for (int i = 0; i < n; i++) {
        if (rows[i] >= 0) free((void *)data[i]);
    }
    free(h);
    json_decref(hdr);
    free(names), free(data), free(bytes), free(rows), free(bias_names);
    return rc;
}

/* Makes the qwen2 folder from models/llama (malloc'd path; NULL on failure)
 * and converts it to DIR/qwen2.gguf; the prompt1 ids in ids / *n. */
static char *make_qwen2(lm_test_ctx *lm_t_, const char *src_dir, int32_t *ids, int *n_ids) {
    char *dir = lm_tu_mkdir("qwen2");
    char a[1024], b[1024];
    static const char *const files[] = { "tokenizer.json", "tokenizer_config.json", "chat_template.jinja" };
    for (size_t i = 0; i < LM_COUNT(files); i++) {
        snprintf(a, sizeof a, "%s/%s", src_dir, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (access(a, F_OK) == 0) LM_CHECK(symlink(a, b) == 0);
    }
    snprintf(a, sizeof a, "%s/config.json", src_dir);
    json_t *cfg = json_load_file(a, 0, NULL);
    if (!cfg) {
        LM_CHECK_MSG(cfg != NULL, "%s: not JSON", a);
        free(dir);
        return NULL;
    }
    json_object_set_new(cfg, "model_type", json_string("qwen2"));
    json_object_set_new(cfg, "architectures", json_pack("[s]", "Qwen2ForCausalLM"));
    json_object_del(cfg, "attention_bias");
    json_object_del(cfg, "mlp_bias");
    int n_layer = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    snprintf(b, sizeof b, "%s/config.json", dir);
    bool ok = json_dump_file(cfg, b, JSON_INDENT(2)) == 0;
    json_decref(cfg);
    lm_err e = { { 0 } };
    lm_safetensors st, ref;
    snprintf(a, sizeof a, "%s/model.safetensors", src_dir);
    ok = ok && lm_safetensors_open(&st, a, &e) == 0;
    if (ok) {
        ok = write_qwen2_weights(&st, dir, n_layer) == 0;
        lm_safetensors_close(&st);
    }
    /* the prompt: prompt1.ids of the llama fixture */
    snprintf(a, sizeof a, "%s/reference.safetensors", src_dir);
    if (ok && lm_safetensors_open(&ref, a, &e) == 0) {
        const lm_file_tensor *ti = lm_safetensors_find(&ref, "prompt1.ids");
        *n_ids = ti && ti->type == LM_I32 && ti->shape[0] <= 256 ? (int)ti->shape[0] : 0;
        if (*n_ids) memcpy(ids, ti->data, (size_t)*n_ids * sizeof *ids);
        lm_safetensors_close(&ref);
    }
    char gguf[1024];
    snprintf(gguf, sizeof gguf, "%s/qwen2.gguf", dir);
    lm_quantize_report rep;
    ok = ok && *n_ids > 0 && lm_convert_hf(dir, gguf, lm_quant_mix_find("BF16"), 2, &rep, &e) == 0;
    LM_CHECK_MSG(ok, "making and converting the qwen2 folder: %s", e.msg);
    LM_CHECK(!ok || rep.n_tensors == 3 + 12 * n_layer);
    if (!ok) {
        free(dir);
        return NULL;
    }
    return dir;
}

/* The conversion's tensors: biases under their GGUF names, q and k rows in
 * the HF order (qwen2's rope is NEOX: no permutation), qwen2 metadata. */
LM_TEST(convert_qwen2_tensors) {
    char *src_dir = lm_test_fixture_path("models/llama");
    if (!src_dir) LM_SKIP("%s", lm_test_fixtures_why());
    int32_t ids[256];
    int n = 0;
    char *dir = make_qwen2(lm_t_, src_dir, ids, &n);
    LM_REQUIRE(dir != NULL);
    char path[1024];
    snprintf(path, sizeof path, "%s/qwen2.gguf", dir);
    lm_err e = { { 0 } };
    lm_gguf g;
    lm_safetensors st;
    LM_REQUIRE(lm_gguf_open(&g, path, &e) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    LM_REQUIRE(lm_safetensors_open(&st, path, &e) == 0);
    char *arch = lm_gguf_get_str(&g, "general.architecture");
    int64_t heads = 0;
    LM_CHECK(lm_streq(arch, "qwen2") && lm_gguf_get_int(&g, "qwen2.attention.head_count", &heads) && heads == 4);
    free(arch);
    static const char *const pairs[][2] = {
        { "model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight" },
        { "model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight" },
        { "model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias" },
        { "model.layers.1.self_attn.k_proj.bias", "blk.1.attn_k.bias" },
        { "model.layers.1.self_attn.v_proj.bias", "blk.1.attn_v.bias" },
    };
    for (size_t i = 0; i < LM_COUNT(pairs); i++) {
        const lm_file_tensor *hf = lm_safetensors_find(&st, pairs[i][0]), *gg = lm_gguf_find_tensor(&g, pairs[i][1]);
        bool is_bias = strstr(pairs[i][1], ".bias") != NULL;
        LM_REQUIRE(hf && gg);
        if (is_bias) { /* 1-D: F32 in GGUF */
            LM_CHECK(gg->type == LM_F32 && gg->n_dims == 1 && gg->shape[0] == hf->shape[0]);
            for (int64_t k = 0; k < hf->shape[0]; k++) {
                float x, y;
                lm_dequant_row(LM_BF16, hf->data + 2 * k, &x, 1);
                lm_dequant_row(LM_F32, gg->data + 4 * k, &y, 1);
                LM_CHECK_MSG(x == y, "%s[%lld]", pairs[i][1], (long long)k);
                if (x != y) break;
            }
        } else {
            LM_CHECK_MSG(gg->nbytes == hf->nbytes && !memcmp(gg->data, hf->data, hf->nbytes), "%s", pairs[i][1]);
        }
    }
    lm_safetensors_close(&st);
    lm_gguf_close(&g);
    free(dir);
    free(src_dir);
}

LM_TEST(convert_qwen2_runs_in_llamacpp) {
    const char *why = lm_tu_llamacpp_missing();
    if (why) LM_SKIP("%s", why);
    char *src_dir = lm_test_fixture_path("models/llama");
    if (!src_dir) LM_SKIP("%s", lm_test_fixtures_why());
    int32_t ids[256];
    int n = 0;
    char *dir = make_qwen2(lm_t_, src_dir, ids, &n);
    LM_REQUIRE(dir != NULL);
    lm_err e = { { 0 } };
    char gguf[1024];
    snprintf(gguf, sizeof gguf, "%s/qwen2.gguf", dir);
    /* llama.cpp on the conversion */
    char *out = lm_tu_llamacpp_answer(lm_t_, gguf, ids, n, 1);
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    free(out);
    LM_REQUIRE(j != NULL);
    json_t *lp = json_object_get(j, "last_logprobs");
    /* lumen on the folder */
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    LM_REQUIRE(lm_model_load(&m, dir, be, &e) == 0);
    int V = m->cfg.vocab;
    LM_REQUIRE((int)json_array_size(lp) == V);
    lm_runner *r = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    LM_REQUIRE(lm_runner_create(&r, m, n + 1, 0, &e) == 0 && lm_runner_eval(r, ids, n, false, logits, &e) == 0);
    double mx = logits[lm_argmax(logits, V)], sum = 0, diff = 0, kl = 0;
    for (int i = 0; i < V; i++) sum += exp(logits[i] - mx);
    for (int i = 0; i < V; i++) {
        double ours = logits[i] - mx - log(sum), theirs = json_number_value(json_array_get(lp, (size_t)i));
        diff = fmax(diff, fabs(ours - theirs));
        kl += exp(theirs) * (theirs - ours);
    }
    printf("  qwen2 folder in lumen vs its conversion in llama.cpp: max |Δ logprob| %.4g, KL %.3g\n", diff, kl);
    LM_CHECK(diff <= QWEN2_LOGPROB_TOL && kl <= QWEN2_KL_TOL);
    free(logits);
    lm_runner_free(r);
    lm_model_free(m);
    lm_backend_destroy(be);
    json_decref(j);
    free(dir);
    free(src_dir);
}
