/* test_eval.c - lumen eval's measures (engine/eval.c).
 *
 * The negative log-likelihood must equal the one computed from transformers'
 * own logits on the same tokens (reference.safetensors); a model against
 * itself has KL 0 and full agreement; a Q8_0 quantisation against its bf16
 * original has a small but non-zero KL; windows cut the tokens as said. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_eval.h"
#include "engine/lm_runner.h"
#include "format/safetensors.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "test_util.h"

static lm_model *load(lm_test_ctx *lm_t_, const char *path, lm_backend *be) {
    lm_err e = { { 0 } };
    lm_model *m = NULL;
    LM_CHECK_MSG(lm_model_load(&m, path, be, &e) == 0, "%s", e.msg);
    return m;
}

/* prompt2 of models/llama: 300 ids and transformers' logits at every one. */
LM_TEST(eval_nll_matches_transformers) {
    char *dir = lm_test_fixture_path("models/llama");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    lm_err e = { { 0 } };
    lm_safetensors st;
    LM_REQUIRE(lm_safetensors_open(&st, path, &e) == 0);
    const lm_file_tensor *ti = lm_safetensors_find(&st, "prompt2.ids"), *tl = lm_safetensors_find(&st, "prompt2.logits");
    LM_REQUIRE(ti && tl && ti->type == LM_I32 && tl->type == LM_F32 && tl->n_dims == 2);
    int n = (int)ti->shape[0], V = (int)tl->shape[1];
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    memcpy(ids, ti->data, (size_t)n * sizeof *ids);
    float *row = malloc((size_t)V * sizeof *row);
    double want = 0;
    for (int i = 0; i + 1 < n; i++) {
        lm_dequant_row(LM_F32, tl->data + (size_t)i * V * 4, row, V);
        double mx = row[lm_argmax(row, V)], sum = 0;
        for (int k = 0; k < V; k++) sum += exp((double)row[k] - mx);
        want -= (double)row[ids[i + 1]] - mx - log(sum);
    }
    want /= n - 1;
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = load(lm_t_, dir, be);
    LM_REQUIRE(m != NULL);
    lm_eval_result r;
    LM_REQUIRE(lm_eval_run(m, NULL, ids, n, 512, (lm_kv_types){ 0 }, &r, &e) == 0);
    printf("  nll %.6f, transformers %.6f, ppl %.3f\n", r.nll, want, r.ppl);
    LM_CHECK(r.n_windows == 1 && r.n_scored == n - 1 && !r.has_ref);
    LM_CHECK_NEAR(r.nll, want, 1e-4);
    LM_CHECK_NEAR(r.ppl, exp(want), 1e-4 * exp(want));
    /* windows of 128: 128 + 128 + 44 tokens, 127 + 127 + 43 predictions */
    LM_REQUIRE(lm_eval_run(m, NULL, ids, n, 128, (lm_kv_types){ 0 }, &r, &e) == 0);
    LM_CHECK(r.n_windows == 3 && r.n_scored == n - 3);
    LM_CHECK(lm_eval_run(m, NULL, ids, 1, 128, (lm_kv_types){ 0 }, &r, &e) != 0 && strstr(e.msg, "nothing to predict"));
    lm_model_free(m);
    lm_backend_destroy(be);
    lm_safetensors_close(&st);
    free(ids);
    free(row);
    free(dir);
}

/* n reproducible ids below V. */
static int32_t *some_ids(int n, int V) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    unsigned s = 12345;
    for (int i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        ids[i] = (int32_t)((s >> 8) % (unsigned)V);
    }
    return ids;
}

LM_TEST(eval_against_reference) {
    char *bf16 = lm_test_fixture_path("gguf/llama-g256/model.bf16.gguf");
    char *q8 = lm_test_fixture_path("gguf/llama-g256/model.Q8_0.gguf");
    if (!bf16 || !q8) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_model *a = load(lm_t_, bf16, be), *b = load(lm_t_, bf16, be), *q = load(lm_t_, q8, be);
    LM_REQUIRE(a && b && q);
    int n = 400;
    int32_t *ids = some_ids(n, a->cfg.vocab);
    lm_eval_result r;
    LM_REQUIRE(lm_eval_run(a, b, ids, n, 200, (lm_kv_types){ 0 }, &r, &e) == 0);
    printf("  bf16 vs bf16: KL %.3g, top-1 %.4f, ppl %.3f / %.3f\n", r.kl_mean, r.top1, r.ppl, r.ref_ppl);
    LM_CHECK(r.has_ref && r.kl_mean == 0 && r.kl_max == 0 && r.top1 == 1 && r.nll == r.ref_nll);
    LM_REQUIRE(lm_eval_run(q, a, ids, n, 200, (lm_kv_types){ 0 }, &r, &e) == 0);
    printf("  Q8_0 vs bf16: KL mean %.3g p99 %.3g max %.3g, top-1 %.4f, ppl %.3f / %.3f\n", r.kl_mean, r.kl_p99,
           r.kl_max, r.top1, r.ppl, r.ref_ppl);
    LM_CHECK(r.kl_mean > 1e-6 && r.kl_mean < 1e-2);
    LM_CHECK(r.kl_mean <= r.kl_p99 && r.kl_p99 <= r.kl_max);
    LM_CHECK(r.top1 > 0.8 && r.top1 < 1.0);
    LM_CHECK(fabs(r.nll - r.ref_nll) < 0.01 && r.nll != r.ref_nll);
    /* KL(bf16 || Q8_0) of one window, computed here from the two runners' logits */
    LM_REQUIRE(lm_eval_run(q, a, ids, 200, 200, (lm_kv_types){ 0 }, &r, &e) == 0);
    int V = a->cfg.vocab;
    float *la = malloc((size_t)199 * V * sizeof *la), *lq = malloc((size_t)199 * V * sizeof *lq);
    lm_runner *ra = NULL, *rq = NULL;
    LM_REQUIRE(lm_runner_create(&ra, a, 200, LM_EVAL_CHUNK, &e) == 0 &&
               lm_runner_create(&rq, q, 200, LM_EVAL_CHUNK, &e) == 0);
    LM_REQUIRE(lm_runner_eval(ra, ids, 199, true, la, &e) == 0 && lm_runner_eval(rq, ids, 199, true, lq, &e) == 0);
    double kl = 0;
    for (int i = 0; i < 199; i++) {
        const float *x = la + (size_t)i * V, *y = lq + (size_t)i * V;
        double mx = x[lm_argmax(x, V)], my = y[lm_argmax(y, V)], sx = 0, sy = 0;
        for (int k = 0; k < V; k++) sx += exp(x[k] - mx), sy += exp(y[k] - my);
        for (int k = 0; k < V; k++) {
            double px = x[k] - mx - log(sx), py = y[k] - my - log(sy);
            kl += exp(px) * (px - py);
        }
    }
    LM_CHECK_NEAR(r.kl_mean, kl / 199, 1e-12);
    lm_runner_free(ra);
    lm_runner_free(rq);
    free(la);
    free(lq);
    lm_model_free(a);
    lm_model_free(b);
    lm_model_free(q);
    lm_backend_destroy(be);
    free(ids);
    free(bf16);
    free(q8);
}

/* The command: one JSON line, a model against itself agrees fully. */
LM_TEST(eval_cli_json) {
    char *bf16 = lm_test_fixture_path("gguf/llama-g256/model.bf16.gguf");
    if (!bf16) LM_SKIP("%s", lm_test_fixtures_why());
    char text[512], cmd[2048];
    snprintf(text, sizeof text, "%s/eval.txt", lm_test_tmpdir());
    const char *body = "def f(x):\n    return [x * i for i in range(10)]\n\nprint(f(3))\n";
    LM_REQUIRE(lm_tu_write(text, body, strlen(body)) == 0);
    snprintf(cmd, sizeof cmd, "%s eval -m %s --reference %s --text %s --ctx 16 --threads 1", lm_test_lumen_bin(), bf16,
             bf16, text);
    char *out = NULL, *err = NULL;
    int rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK_MSG(rc == 0, "%s", err ? err : "");
    LM_CHECK(out && strstr(out, "\"kl_mean\":0.0,") && strstr(out, "\"top1\":1.0") && strstr(out, "\"ctx\":16"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s eval --help", lm_test_lumen_bin());
    rc = lm_tu_run(cmd, &out, NULL);
    LM_CHECK(rc == 0 && out && strstr(out, "--reference") && strstr(out, "--ctx") && strstr(out, "KL(reference"));
    free(out);
    free(bf16);
}
