/* test_parity_moe.c - Qwen3-MoE against transformers' logits, and the MoE
 * loader's handling of checkpoints it must accept or refuse.
 *
 * Parity: the shared fixture (8 experts, top-2, normalised) on every CPU code
 * path, and configurations the code was not written against, made by
 * ../shared/tools/make_fixtures.py with transformers 5.17 and kept in
 * tests/data/moe (16 experts top-4 unnormalised with dense layers from
 * decoder_sparse_step = 2; 5 experts top-1 with attention biases, MQA and
 * an mlp_only layer; 32 experts top-8).
 *
 * Checkpoint variants are written from the fixture into the test's tmpdir:
 * the fused expert layout (transformers 5: gate_up_proj [E][2F][D],
 * down_proj [E][D][F]) must give exactly the per-expert model's outputs; a
 * missing or misshaped expert tensor, or an impossible MoE config, must be a
 * one-line error naming the file. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_parity.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "format/safetensors.h"
#include "test_util.h"

static void run_fixture(lm_test_ctx *lm_t_, lm_cpu_isa isa, int threads) {
    char *dir = lm_test_fixture_path("models/qwen3-moe");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_tu_parity(lm_t_, dir, isa, threads, 3, NULL);
    free(dir);
}

static void run_unseen(lm_test_ctx *lm_t_, const char *name, lm_cpu_isa isa, int threads) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/moe/%s", LUMEN_SOURCE_DIR, name);
    lm_tu_parity(lm_t_, dir, isa, threads, 3, NULL);
}

LM_TEST(parity_qwen3_moe) { run_fixture(lm_t_, LM_ISA_AUTO, 2); }
LM_TEST(parity_qwen3_moe_scalar) { run_fixture(lm_t_, LM_ISA_SCALAR, 1); }
LM_TEST(parity_qwen3_moe_avx2) { run_fixture(lm_t_, LM_ISA_AVX2, 3); }
LM_TEST(parity_qwen3_moe_e16_k4_step2) { run_unseen(lm_t_, "qwen3-moe-e16-k4-step2", LM_ISA_AUTO, 2); }
LM_TEST(parity_qwen3_moe_e5_k1_bias) { run_unseen(lm_t_, "qwen3-moe-e5-k1-bias", LM_ISA_AUTO, 3); }
LM_TEST(parity_qwen3_moe_e32_k8) { run_unseen(lm_t_, "qwen3-moe-e32-k8", LM_ISA_AUTO, 2); }
LM_TEST(parity_qwen3_moe_e32_k8_scalar) { run_unseen(lm_t_, "qwen3-moe-e32-k8", LM_ISA_SCALAR, 2); }

/* ---- checkpoint variants ------------------------------------------------ */

typedef struct st_entry {
    char name[128];
    const char *dtype;
    int n_dims;
    int64_t shape[4];
    const void *data;
    size_t nbytes;
} st_entry;

/* Writes a safetensors file (header padded to 8 bytes). */
static int st_write(const char *path, const st_entry *t, int n) {
    json_t *h = json_object();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *o = json_object(), *sh = json_array();
        for (int d = 0; d < t[i].n_dims; d++) json_array_append_new(sh, json_integer(t[i].shape[d]));
        json_object_set_new(o, "dtype", json_string(t[i].dtype));
        json_object_set_new(o, "shape", sh);
        json_object_set_new(o, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + t[i].nbytes)));
        json_object_set_new(h, t[i].name, o);
        off += t[i].nbytes;
    }
    char *hs = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    size_t hl = strlen(hs), pad = (8 - hl % 8) % 8;
    size_t total = 8 + hl + pad + off;
    uint8_t *buf = malloc(total);
    uint64_t n64 = hl + pad;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n64 >> (8 * i));
    memcpy(buf + 8, hs, hl);
    memset(buf + 8 + hl, ' ', pad);
    size_t at = 8 + hl + pad;
    for (int i = 0; i < n; i++) {
        memcpy(buf + at, t[i].data, t[i].nbytes);
        at += t[i].nbytes;
    }
    int rc = lm_tu_write(path, buf, total);
    free(buf);
    free(hs);
    return rc;
}

typedef struct variant {
    const char *tag;
    bool fused;               /* write experts as gate_up_proj / down_proj stacks */
    const char *drop;         /* leave this tensor out */
    const char *reshape;      /* declare this tensor with shape new_shape (same element count) */
    int new_dims;
    int64_t new_shape[4];
    const char *config_patch; /* JSON object merged into config.json */
} variant;

/* Writes the variant of the qwen3-moe fixture into a fresh directory (with
 * the fixture's reference) and returns its path (malloc'd), or NULL. */
static char *make_variant(const variant *v) {
    char *src = lm_test_fixture_path("models/qwen3-moe");
    if (!src) return NULL;
    char *dst = lm_tu_mkdir(v->tag);
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", src);
    size_t n = 0;
    char *ref = lm_tu_read(path, &n);
    snprintf(path, sizeof path, "%s/reference.safetensors", dst);
    if (!ref || lm_tu_write(path, ref, n)) goto fail;
    free(ref);
    ref = NULL;

    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (v->config_patch) {
        json_t *patch = json_loads(v->config_patch, 0, NULL);
        json_object_update(cfg, patch);
        json_decref(patch);
    }
    snprintf(path, sizeof path, "%s/config.json", dst);
    int rc = json_dump_file(cfg, path, JSON_INDENT(1));
    int E = (int)json_integer_value(json_object_get(cfg, "num_local_experts"));
    int L = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    json_decref(cfg);
    if (rc) goto fail;

    lm_safetensors st = { 0 };
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    if (lm_safetensors_open(&st, path, NULL)) goto fail;
    st_entry *ents = calloc((size_t)st.n_tensors + 2 * (size_t)L, sizeof *ents);
    uint8_t **bufs = calloc((size_t)L * 2, sizeof *bufs);
    int k = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const lm_file_tensor *t = &st.tensors[i];
        if (v->fused && strstr(t->name, ".mlp.experts.")) continue;
        st_entry *x = &ents[k++];
        snprintf(x->name, sizeof x->name, "%s", t->name);
        x->dtype = t->type_name;
        x->n_dims = t->n_dims;
        memcpy(x->shape, t->shape, sizeof x->shape);
        x->data = t->data;
        x->nbytes = t->nbytes;
    }
    for (int l = 0; v->fused && l < L; l++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.0.gate_proj.weight", l);
        const lm_file_tensor *g0 = lm_safetensors_find(&st, name);
        size_t mb = g0->nbytes; /* bytes of one [F][D] (or [D][F]) expert matrix */
        int64_t F = g0->shape[0], D = g0->shape[1];
        uint8_t *gu = malloc(2 * mb * (size_t)E), *dn = malloc(mb * (size_t)E);
        for (int x = 0; x < E; x++) {
            const char *parts[3] = { "gate_proj", "up_proj", "down_proj" };
            for (int p = 0; p < 3; p++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", l, x, parts[p]);
                const lm_file_tensor *t = lm_safetensors_find(&st, name);
                uint8_t *dstp = p == 2 ? dn + (size_t)x * mb : gu + ((size_t)x * 2 + (size_t)p) * mb;
                memcpy(dstp, t->data, mb);
            }
        }
        bufs[2 * l] = gu;
        bufs[2 * l + 1] = dn;
        st_entry *a = &ents[k++], *b = &ents[k++];
        *a = (st_entry){ .dtype = "BF16", .n_dims = 3, .shape = { E, 2 * F, D }, .data = gu, .nbytes = 2 * mb * E };
        snprintf(a->name, sizeof a->name, "model.layers.%d.mlp.experts.gate_up_proj", l);
        *b = (st_entry){ .dtype = "BF16", .n_dims = 3, .shape = { E, D, F }, .data = dn, .nbytes = mb * E };
        snprintf(b->name, sizeof b->name, "model.layers.%d.mlp.experts.down_proj", l);
    }
    for (int i = 0; v->drop && i < k; i++)
        if (!strcmp(ents[i].name, v->drop)) ents[i--] = ents[--k];
    for (int i = 0; v->reshape && i < k; i++)
        if (!strcmp(ents[i].name, v->reshape)) {
            ents[i].n_dims = v->new_dims;
            memcpy(ents[i].shape, v->new_shape, sizeof ents[i].shape);
        }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    rc = st_write(path, ents, k);
    for (int i = 0; i < 2 * L; i++) free(bufs[i]);
    free(bufs);
    free(ents);
    lm_safetensors_close(&st);
    free(src);
    if (rc) {
        free(dst);
        return NULL;
    }
    return dst;
fail:
    free(ref);
    free(src);
    free(dst);
    return NULL;
}

/* The fused layout gives exactly the per-expert model's logits. */
LM_TEST(qwen3_moe_fused_experts_equal_per_expert) {
    char *src = lm_test_fixture_path("models/qwen3-moe");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    variant v = { .tag = "moe-fused", .fused = true };
    char *dir = make_variant(&v);
    LM_REQUIRE(dir != NULL);
    lm_parity_result a = { 0 }, b = { 0 };
    lm_tu_parity(lm_t_, src, LM_ISA_AUTO, 2, 3, &a);
    lm_tu_parity(lm_t_, dir, LM_ISA_AUTO, 2, 3, &b);
    LM_CHECK(a.max_abs_err > 0 && a.max_abs_err == b.max_abs_err);
    LM_CHECK(a.cache_vs_full == b.cache_vs_full);
    for (int i = 0; i < 3; i++) LM_CHECK(a.prompts[i].logits_max_abs == b.prompts[i].logits_max_abs);
    free(dir);
    free(src);
}

/* Loads the variant and expects a one-line error naming the file and holding
 * every fragment in want (NULL-terminated). */
static void expect_load_error(lm_test_ctx *lm_t_, const variant *v, const char *const *want) {
    char *dir = make_variant(v);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(1, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    int rc = lm_model_load(&m, dir, be, &e);
    LM_CHECK_MSG(rc != 0, "variant %s loaded", v->tag);
    LM_CHECK(m == NULL);
    LM_CHECK_MSG(strstr(e.msg, dir) != NULL, "error does not name the file: %s", e.msg);
    LM_CHECK_MSG(strchr(e.msg, '\n') == NULL, "error spans lines: %s", e.msg);
    for (int i = 0; want[i]; i++) LM_CHECK_MSG(strstr(e.msg, want[i]) != NULL, "no \"%s\" in: %s", want[i], e.msg);
    printf("  %s: %s\n", v->tag, e.msg);
    lm_model_free(m);
    lm_backend_destroy(be);
    free(dir);
}

LM_TEST(qwen3_moe_bad_checkpoints) {
    if (!lm_test_have_fixture("models/qwen3-moe")) LM_SKIP("%s", lm_test_fixtures_why());
    {
        variant v = { .tag = "moe-missing", .drop = "model.layers.1.mlp.experts.5.up_proj.weight" };
        const char *want[] = { "missing tensor", "model.layers.1.mlp.experts.5.up_proj.weight", NULL };
        expect_load_error(lm_t_, &v, want);
    }
    {
        variant v = { .tag = "moe-misshaped", .reshape = "model.layers.0.mlp.experts.2.gate_proj.weight",
                      .new_dims = 2, .new_shape = { 64, 32 } };
        const char *want[] = { "model.layers.0.mlp.experts.2.gate_proj.weight", "[64, 32]", "expected [32, 64]", NULL };
        expect_load_error(lm_t_, &v, want);
    }
    {
        variant v = { .tag = "moe-router", .reshape = "model.layers.1.mlp.gate.weight", .new_dims = 2,
                      .new_shape = { 64, 8 } };
        const char *want[] = { "model.layers.1.mlp.gate.weight", "expected [8, 64]", NULL };
        expect_load_error(lm_t_, &v, want);
    }
    {
        variant v = { .tag = "moe-fused-misshaped", .fused = true, .reshape = "model.layers.1.mlp.experts.gate_up_proj",
                      .new_dims = 3, .new_shape = { 8, 32, 128 } };
        const char *want[] = { "gate_up_proj", "[8, 32, 128]", "expected [8, 64, 64]", NULL };
        expect_load_error(lm_t_, &v, want);
    }
    {
        variant v = { .tag = "moe-fused-half", .fused = true, .drop = "model.layers.0.mlp.experts.down_proj" };
        const char *want[] = { "gate_up_proj", "down_proj", NULL };
        expect_load_error(lm_t_, &v, want);
    }
    {
        /* a dense layer where the checkpoint has experts */
        variant v = { .tag = "moe-mlp-only", .config_patch = "{\"mlp_only_layers\": [1]}" };
        const char *want[] = { "missing tensor", "model.layers.1.mlp.gate_proj.weight", NULL };
        expect_load_error(lm_t_, &v, want);
    }
    {
        variant v = { .tag = "moe-topk", .config_patch = "{\"num_experts_per_tok\": 9}" };
        const char *want[] = { "config.json", "num_experts_per_tok", NULL };
        expect_load_error(lm_t_, &v, want);
    }
    {
        variant v = { .tag = "moe-only-range", .config_patch = "{\"mlp_only_layers\": [2]}" };
        const char *want[] = { "config.json", "mlp_only_layers", NULL };
        expect_load_error(lm_t_, &v, want);
    }
    {
        variant v = { .tag = "moe-no-size", .config_patch = "{\"moe_intermediate_size\": null}" };
        const char *want[] = { "config.json", "moe_intermediate_size", NULL };
        expect_load_error(lm_t_, &v, want);
    }
}

/* weight_bytes counts what a decoded token reads: top_k of E experts. With
 * k = 8 of 8 every expert counts; with k = 2, a quarter of them. */
LM_TEST(qwen3_moe_weight_bytes_count_active_experts) {
    char *src = lm_test_fixture_path("models/qwen3-moe");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    variant v = { .tag = "moe-k8", .config_patch = "{\"num_experts_per_tok\": 8}" };
    char *dir = make_variant(&v);
    LM_REQUIRE(dir != NULL);
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(1, &e);
    lm_model *m2 = NULL, *m8 = NULL;
    LM_REQUIRE(lm_model_load(&m2, src, be, &e) == 0);
    LM_REQUIRE(lm_model_load(&m8, dir, be, &e) == 0);
    lm_safetensors st;
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    LM_REQUIRE(lm_safetensors_open(&st, path, &e) == 0);
    size_t experts = 0;
    for (int i = 0; i < st.n_tensors; i++)
        if (strstr(st.tensors[i].name, ".mlp.experts.")) experts += st.tensors[i].nbytes;
    lm_safetensors_close(&st);
    LM_CHECK(experts > 0);
    LM_CHECK(lm_model_weight_bytes(m8) - lm_model_weight_bytes(m2) == experts - experts / 4);
    lm_model_free(m2);
    lm_model_free(m8);
    lm_backend_destroy(be);
    free(dir);
    free(src);
}
