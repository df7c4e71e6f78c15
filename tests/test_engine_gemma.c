/* test_engine_gemma.c - sliding-window models stay exact however a prompt is
 * cut: gemma3 and gemma4 (window 16) fed their 300-token prompt in pieces
 * that end just before, at and just after multiples of the window give the
 * same greedy tokens and (within the cache tolerance) the same logits as one
 * forward; and concurrent requests through the engine, prefilled in steps of
 * 15, 16 and 17 tokens, give exactly the tokens each gives alone. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/lm_engine.h"
#include "engine/lm_runner.h"
#include "lm_test.h"
#include "test_util.h"
#include "format/safetensors.h"

enum { GEN = 24, WINDOW = 16 };

typedef struct gfix {
    lm_backend *be;
    lm_model *m;
    int32_t ids[300], ref_greedy[GEN];
    int n;
} gfix;

static bool gfix_open(gfix *f, const char *name) {
    memset(f, 0, sizeof *f);
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) return false;
    snprintf(rel, sizeof rel, "models/%s/reference.safetensors", name);
    char *ref = lm_test_fixture_path(rel);
    lm_safetensors st = { 0 };
    f->be = lm_tu_model_backend(2, NULL);
    bool ok = f->be && lm_model_load(&f->m, dir, f->be, NULL) == 0 && lm_safetensors_open(&st, ref, NULL) == 0;
    const lm_file_tensor *t = ok ? lm_safetensors_find(&st, "prompt2.ids") : NULL;
    const lm_file_tensor *g = ok ? lm_safetensors_find(&st, "prompt2.greedy_ids") : NULL;
    ok = t && g && t->shape[0] == 300 && g->shape[0] == GEN;
    if (ok) {
        f->n = 300;
        memcpy(f->ids, t->data, sizeof f->ids);
        memcpy(f->ref_greedy, g->data, sizeof f->ref_greedy);
    }
    if (st.tensors) lm_safetensors_close(&st);
    free(dir);
    free(ref);
    return ok;
}

static void gfix_close(gfix *f) {
    lm_model_free(f->m);
    lm_backend_destroy(f->be);
}

/* Feeds the prompt in pieces (cuts: ascending positions where a piece ends;
 * chunk: the runner's own limit per forward), then decodes GEN greedy tokens.
 * last: the prompt's last logits. */
static int run_cut(lm_model *m, const int32_t *ids, int n, const int *cuts, int n_cuts, int chunk, float *last,
                   int32_t *out) {
    lm_runner *r = NULL;
    if (lm_runner_create(&r, m, n + GEN + 1, chunk, NULL)) return -1;
    int V = m->cfg.vocab, at = 0, rc = 0;
    float *lg = malloc((size_t)V * sizeof(float));
    for (int i = 0; i <= n_cuts && rc == 0; i++) {
        int end = i < n_cuts ? cuts[i] : n;
        if (end > at) rc = lm_runner_eval(r, ids + at, end - at, false, lg, NULL);
        at = LM_MAX(at, end);
    }
    memcpy(last, lg, (size_t)V * sizeof(float));
    for (int i = 0; rc == 0 && i < GEN; i++) {
        out[i] = lm_argmax(lg, V);
        rc = lm_runner_eval(r, &out[i], 1, false, lg, NULL);
    }
    free(lg);
    lm_runner_free(r);
    return rc;
}

static void chunked_prefill_exact(lm_test_ctx *lm_t_, const char *model, bool check_reference) {
    gfix f;
    if (!gfix_open(&f, model)) {
        gfix_close(&f);
        LM_SKIP("fixture %s not available", model);
    }
    LM_REQUIRE(f.m->cfg.sliding_window == WINDOW);
    int V = f.m->cfg.vocab;
    float *base = malloc((size_t)V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    int32_t want[GEN], toks[GEN];
    LM_REQUIRE(run_cut(f.m, f.ids, f.n, NULL, 0, 512, base, want) == 0);
    if (check_reference)
        LM_CHECK_MSG(memcmp(want, f.ref_greedy, sizeof want) == 0, "%s: greedy tokens differ from transformers'",
                     model);
    /* pieces ending at w-1, w, w+1 for every multiple w of the window */
    int cuts[64], n_cuts = 0;
    for (int w = WINDOW; w < f.n && n_cuts + 3 <= 64; w += WINDOW)
        for (int d = -1; d <= 1; d++) cuts[n_cuts++] = w + d;
    struct { const int *cuts; int n_cuts, chunk; } plans[] = {
        { cuts, n_cuts, 512 }, /* 15, 1, 1, 14, 1, 1, ... */
        { NULL, 0, WINDOW - 1 }, { NULL, 0, WINDOW }, { NULL, 0, WINDOW + 1 },
        { NULL, 0, 2 * WINDOW + 1 }, { NULL, 0, 1 },
    };
    for (size_t p = 0; p < LM_COUNT(plans); p++) {
        LM_REQUIRE(run_cut(f.m, f.ids, f.n, plans[p].cuts, plans[p].n_cuts, plans[p].chunk, got, toks) == 0);
        double d = 0;
        for (int i = 0; i < V; i++) d = fmax(d, fabs((double)got[i] - base[i]));
        LM_CHECK_MSG(d <= 1e-4, "%s plan %zu (chunk %d): last logits differ by %g", model, p, plans[p].chunk, d);
        LM_CHECK_MSG(memcmp(toks, want, sizeof toks) == 0, "%s plan %zu (chunk %d): greedy tokens differ", model, p,
                     plans[p].chunk);
    }
    free(base);
    free(got);
    gfix_close(&f);
}

LM_TEST(gemma3_chunked_prefill_around_window_exact) { chunked_prefill_exact(lm_t_, "gemma3", true); }
LM_TEST(gemma4_chunked_prefill_around_window_exact) { chunked_prefill_exact(lm_t_, "gemma4", false); }

/* ---- concurrent requests through the engine --------------------------------- */

static void concurrent_equals_alone(lm_test_ctx *lm_t_, const char *model, int step_tokens) {
    gfix f;
    if (!gfix_open(&f, model)) {
        gfix_close(&f);
        LM_SKIP("fixture %s not available", model);
    }
    enum { N = 5 };
    /* lengths on both sides of the window and its multiples, different offsets */
    const int lens[N] = { WINDOW - 1, 300 - 4, WINDOW + 1, 2 * WINDOW, 97 };
    const int offs[N] = { 3, 4, 0, 11, 1 };
    int32_t solo[N][GEN];
    float *last = malloc((size_t)f.m->cfg.vocab * sizeof(float));
    for (int i = 0; i < N; i++) LM_REQUIRE(run_cut(f.m, f.ids + offs[i], lens[i], NULL, 0, 512, last, solo[i]) == 0);
    free(last);
    lm_engine_opts o = { .ctx = 512, .parallel = 3, .step_tokens = step_tokens };
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_engine_create(&en, f.m, &o, &e) == 0);
    lm_tu_collect c[N];
    lm_request *req[N];
    lm_gen_params p = { 0 };
    p.sampling.top_p = 1;
    p.repetition_penalty = 1;
    p.max_tokens = GEN;
    for (int i = 0; i < N; i++) {
        lm_tu_collect_init(&c[i]);
        LM_CHECK(lm_engine_submit(en, f.ids + offs[i], lens[i], &p, lm_tu_collect_on_token, &c[i], &req[i], &e) ==
                 LM_ENGINE_OK);
    }
    for (int i = 0; i < N; i++) {
        lm_tu_collect_wait(&c[i]);
        LM_CHECK_MSG(c[i].finish == LM_FINISH_LENGTH && c[i].n == GEN, "%s request %d: %d tokens", model, i, c[i].n);
        LM_CHECK_MSG(memcmp(c[i].toks, solo[i], sizeof solo[i]) == 0,
                     "%s request %d (len %d, steps of %d) differs from alone", model, i, lens[i], step_tokens);
    }
    /* Released once the engine is idle (before e5cb9df the engine read a
     * request after its final event; this keeps the test independent of it). */
    lm_engine_stats st;
    for (int i = 0; i < 5000; i++) {
        lm_engine_get_stats(en, &st);
        if (st.running == 0 && st.queued == 0) break;
        nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
    }
    for (int i = 0; i < N; i++) {
        lm_request_release(req[i]);
        lm_tu_collect_destroy(&c[i]);
    }
    lm_engine_free(en);
    gfix_close(&f);
}

LM_TEST(engine_gemma3_concurrent_steps_15) { concurrent_equals_alone(lm_t_, "gemma3", WINDOW - 1); }
LM_TEST(engine_gemma3_concurrent_steps_16) { concurrent_equals_alone(lm_t_, "gemma3", WINDOW); }
LM_TEST(engine_gemma4_concurrent_steps_17) { concurrent_equals_alone(lm_t_, "gemma4", WINDOW + 1); }
LM_TEST(engine_gemma4_concurrent_steps_16) { concurrent_equals_alone(lm_t_, "gemma4", WINDOW); }

/* Sliding-window layers that keep only their window (lm_kv_pool.ring_blocks):
 * gemma4's five sliding layers (window 16, KV rows of 16 values) fed 16
 * tokens a forward hold 3 blocks of a 325-token sequence, where its full
 * layer holds all 21 (and they held 21 before); the greedy tokens and last
 * logits equal the run that keeps every block. */
LM_TEST(gemma4_sliding_window_ring_blocks) {
    gfix f;
    if (!gfix_open(&f, "gemma4")) {
        gfix_close(&f);
        LM_SKIP("fixture gemma4 not available");
    }
    const int ctx = f.n + GEN + 1;
    LM_CHECK(lm_kv_ring_for(f.m, 16, ctx, WINDOW) == 3);   /* (15 + 16) / 16 rounded up, + 1 */
    LM_CHECK(lm_kv_ring_for(f.m, 16, ctx, 512) == 0);      /* a 512-token chunk: no smaller than the context */
    LM_CHECK(lm_kv_ring_for(f.m, 16, 48, WINDOW) == 0);     /* a context of three blocks: nothing to free */
    lm_runner *r = NULL;
    LM_REQUIRE(lm_runner_create(&r, f.m, ctx, WINDOW, NULL) == 0);
    const lm_kv_pool *p = &r->kv->pool;
    LM_REQUIRE(p->ring_blocks == 3 && p->layer_ring != NULL);
    int ring_layers = 0;
    for (int l = 0; l < p->n_layers; l++) ring_layers += p->layer_ring[l];
    LM_CHECK(ring_layers == 5 && !p->layer_ring[5] && p->n_state_slots == 1);
    /* the blocks of the pool serve the full layer only; each sliding layer has 3 */
    LM_CHECK(lm_kv_pool_bytes_per_token(p) == 2 * 512 * sizeof(float));
    LM_CHECK(lm_kv_pool_ring_bytes(p) == 5 * 2 * 16 * sizeof(float) * 3 * 16);
    LM_CHECK(lm_kv_state_bytes(r->kv) == lm_kv_pool_ring_bytes(p));
    int32_t next = 0;
    LM_REQUIRE(lm_runner_eval_greedy(r, f.ids, f.n, &next, NULL) == 0);
    for (int i = 0; i < GEN; i++) LM_REQUIRE(lm_runner_eval_greedy(r, &next, 1, &next, NULL) == 0);
    LM_CHECK_MSG(r->seq.n_blocks == 21 && r->kv->n_free == 0, "full layer: %d blocks, %d free", r->seq.n_blocks,
                 r->kv->n_free);
    lm_runner_free(r);

    int V = f.m->cfg.vocab;
    float *kept = malloc((size_t)V * sizeof(float)), *ring = malloc((size_t)V * sizeof(float));
    int32_t want[GEN], got[GEN];
    LM_REQUIRE(run_cut(f.m, f.ids, f.n, NULL, 0, 512, kept, want) == 0);
    LM_REQUIRE(run_cut(f.m, f.ids, f.n, NULL, 0, WINDOW, ring, got) == 0);
    double d = 0;
    for (int i = 0; i < V; i++) d = fmax(d, fabs((double)ring[i] - kept[i]));
    LM_CHECK_MSG(d <= 1e-4, "last logits differ by %g", d);
    LM_CHECK(memcmp(got, want, sizeof want) == 0);
    free(kept);
    free(ring);
    gfix_close(&f);
}
