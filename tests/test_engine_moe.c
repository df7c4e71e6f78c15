/* test_engine_moe.c - continuous batching on a mixture-of-experts model gives
 * every request the tokens it gets alone.
 *
 * MoE is where batching could leak between requests: the moe op groups the
 * batch's tokens by expert and runs each expert's matmuls over all of them,
 * so a token's experts see other requests' rows. Requests of different
 * lengths run at once, with prompts cut into chunks by small step budgets;
 * each must produce exactly its solo greedy tokens. Same pattern as
 * test_engine.c, on the qwen3-moe fixture and on the e16/k4 model with dense
 * and sparse layers (tests/data/moe). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_engine.h"
#include "engine/lm_runner.h"
#include "engine/lm_sampler.h"
#include "lm_test.h"
#include "model/safetensors.h"

typedef struct em_collect {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[64];
    int n;
    bool done;
    lm_finish finish;
} em_collect;

static void em_on_token(void *user, const lm_token_event *ev) {
    em_collect *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->has_token && c->n < 64) c->toks[c->n++] = ev->token;
    if (ev->done) {
        c->done = true;
        c->finish = ev->finish;
    }
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Greedy tokens of a prompt alone, through the plain runner. */
static int em_alone(lm_model *m, const int32_t *prompt, int n, int gen, int32_t *out) {
    lm_runner *r = NULL;
    if (lm_runner_create(&r, m, n + gen + 1, 0, NULL)) return -1;
    float *logits = malloc((size_t)m->cfg.vocab * sizeof(float));
    int rc = lm_runner_eval(r, prompt, n, false, logits, NULL);
    for (int i = 0; rc == 0 && i < gen; i++) {
        out[i] = lm_argmax(logits, m->cfg.vocab);
        rc = lm_runner_eval(r, &out[i], 1, false, logits, NULL);
    }
    free(logits);
    lm_runner_free(r);
    return rc;
}

static void em_concurrent_equals_alone(lm_test_ctx *lm_t_, const char *dir, int step_tokens, int threads) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    lm_err e = { { 0 } };
    lm_safetensors ref = { 0 };
    if (lm_safetensors_open(&ref, path, &e)) LM_SKIP("%s", e.msg);
    const lm_file_tensor *t = lm_safetensors_find(&ref, "prompt2.ids");
    LM_REQUIRE(t && t->shape[0] == 300);
    enum { N = 6, GEN = 16 };
    int32_t full[300], prompts[N][300], solo[N][GEN];
    memcpy(full, t->data, sizeof full);
    lm_safetensors_close(&ref);
    int cut[N] = { 7, 300, 64, 1, 129, 33 }, lens[N];
    for (int i = 0; i < N; i++) {
        int off = (i * 11) % 5;
        lens[i] = LM_MIN(cut[i], 300 - off);
        memcpy(prompts[i], full + off, (size_t)lens[i] * sizeof(int32_t));
    }
    lm_backend *be = lm_cpu_backend_create(threads, LM_ISA_AUTO, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    LM_REQUIRE(lm_model_load(&m, dir, be, &e) == 0);
    for (int i = 0; i < N; i++) LM_REQUIRE(em_alone(m, prompts[i], lens[i], GEN, solo[i]) == 0);

    lm_engine_opts o = { .ctx = 512, .parallel = 4, .step_tokens = step_tokens };
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, m, &o, &e) == 0);
    em_collect c[N];
    lm_request *req[N];
    lm_gen_params p = { 0 };
    p.sampling.top_p = 1;
    p.repetition_penalty = 1;
    p.max_tokens = GEN;
    for (int i = 0; i < N; i++) {
        memset(&c[i], 0, sizeof c[i]);
        pthread_mutex_init(&c[i].mu, NULL);
        pthread_cond_init(&c[i].cv, NULL);
        LM_CHECK(lm_engine_submit(en, prompts[i], lens[i], &p, em_on_token, &c[i], &req[i], &e) == LM_ENGINE_OK);
    }
    for (int i = 0; i < N; i++) {
        pthread_mutex_lock(&c[i].mu);
        while (!c[i].done) pthread_cond_wait(&c[i].cv, &c[i].mu);
        pthread_mutex_unlock(&c[i].mu);
        LM_CHECK_MSG(c[i].n == GEN || c[i].finish == LM_FINISH_STOP, "request %d: %d tokens", i, c[i].n);
        LM_CHECK_MSG(memcmp(c[i].toks, solo[i], (size_t)c[i].n * sizeof(int32_t)) == 0,
                     "request %d (len %d) differs from alone", i, lens[i]);
        lm_request_release(req[i]);
        pthread_mutex_destroy(&c[i].mu);
        pthread_cond_destroy(&c[i].cv);
    }
    lm_engine_free(en);
    lm_model_free(m);
    lm_backend_destroy(be);
}

LM_TEST(engine_moe_concurrent_equals_alone) {
    char *dir = lm_test_fixture_path("models/qwen3-moe");
    if (!dir) LM_SKIP("../shared/fixtures not found (set LUMEN_FIXTURES)");
    em_concurrent_equals_alone(lm_t_, dir, 24, 2);
    free(dir);
}

LM_TEST(engine_moe_dense_sparse_tiny_steps) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/moe/qwen3-moe-e16-k4-step2", LUMEN_SOURCE_DIR);
    em_concurrent_equals_alone(lm_t_, dir, 5, 3);
}
