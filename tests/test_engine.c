/* test_engine.c - the scheduler: continuous batching gives every request the
 * tokens it gets alone, cancellation frees the cache, limits are enforced. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/lm_engine.h"
#include "engine/engine_internal.h"
#include "engine/lm_runner.h"
#include "lm_test.h"
#include "test_util.h"
#include "format/safetensors.h"

typedef struct fixture {
    lm_backend *be;
    lm_model *m;
    lm_safetensors ref;
} fixture;

static bool fixture_open(fixture *f, const char *name) {
    memset(f, 0, sizeof *f);
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) return false;
    char *ref = lm_test_fixture_path(strcat(rel, "/reference.safetensors"));
    f->be = lm_tu_model_backend(2, NULL);
    bool ok = f->be && lm_model_load(&f->m, dir, f->be, NULL) == 0 && lm_safetensors_open(&f->ref, ref, NULL) == 0;
    free(dir);
    free(ref);
    return ok;
}

static void fixture_close(fixture *f) {
    lm_model_free(f->m);
    lm_backend_destroy(f->be);
    if (f->ref.tensors) lm_safetensors_close(&f->ref);
}

static int ref_ids(fixture *f, const char *name, int32_t *out, int max) {
    const lm_file_tensor *t = lm_safetensors_find(&f->ref, name);
    int n = t ? (int)LM_MIN(t->shape[0], max) : 0;
    if (n) memcpy(out, t->data, (size_t)n * sizeof(int32_t));
    return n;
}

/* Stats are published after each step, a moment after the last final event. */
static void wait_idle(lm_engine *en, lm_engine_stats *st) {
    for (int i = 0; i < 2000; i++) {
        lm_engine_get_stats(en, st);
        if (st->running == 0 && st->queued == 0 && st->kv_blocks_free == st->kv_blocks_total) return;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

static lm_gen_params greedy(int max_tokens) {
    lm_gen_params p = { 0 };
    p.sampling.top_p = 1;
    p.repetition_penalty = 1;
    p.max_tokens = max_tokens;
    return p;
}

/* Several requests of different lengths at once, with prompt chunks split by
 * a small step budget, each give exactly their tokens alone. */
static void concurrent_equals_alone(lm_test_ctx *lm_t_, const char *model, int step_tokens) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", model);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_tu_engine_concurrent_equals_alone(lm_t_, dir, step_tokens, 2, 20);
    free(dir);
}

LM_TEST(engine_concurrent_equals_alone_llama) { concurrent_equals_alone(lm_t_, "llama", 512); }

/* The same per KV format: batched and solo both in that format. */
static void concurrent_equals_alone_kv(lm_test_ctx *lm_t_, const char *model, int step_tokens, lm_kv_types kvt) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", model);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_tu_engine_concurrent_equals_alone_kv(lm_t_, dir, step_tokens, 2, 20, kvt);
    free(dir);
}
LM_TEST(engine_concurrent_equals_alone_llama_kv_bf16) {
    concurrent_equals_alone_kv(lm_t_, "llama", 24, (lm_kv_types){ LM_KV_BF16, LM_KV_BF16 });
}
LM_TEST(engine_concurrent_equals_alone_qwen3_kv_q8) {
    concurrent_equals_alone_kv(lm_t_, "qwen3", 24, (lm_kv_types){ LM_KV_Q8, LM_KV_Q8 });
}
LM_TEST(engine_concurrent_equals_alone_llama_kv_q4r) {
    concurrent_equals_alone_kv(lm_t_, "llama", 24, (lm_kv_types){ LM_KV_Q4R, LM_KV_Q4R });
}
LM_TEST(engine_concurrent_equals_alone_llama_kv_k4v8_tiny_steps) {
    concurrent_equals_alone_kv(lm_t_, "llama", 5, (lm_kv_types){ LM_KV_Q4, LM_KV_Q8 });
}

/* A format whose scale groups do not fit the model's rows is refused with
 * the reason, before anything is allocated. */
LM_TEST(engine_refuses_kv_format_that_does_not_fit) {
    fixture f;
    if (!fixture_open(&f, "llama3-rope-mqa")) {
        fixture_close(&f);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 64, .kv_type = { LM_KV_BF16, LM_KV_Q8 } };
    LM_CHECK(lm_engine_create(&en, f.m, &o, &e) != 0 && en == NULL && strstr(e.msg, "q8") && strstr(e.msg, "16"));
    o.kv_type = (lm_kv_types){ LM_KV_BF16, LM_KV_BF16 };
    LM_CHECK(lm_engine_create(&en, f.m, &o, &e) == 0 && en);
    lm_engine_free(en);
    fixture_close(&f);
}
LM_TEST(engine_concurrent_equals_alone_qwen3_chunked) { concurrent_equals_alone(lm_t_, "qwen3", 24); }
LM_TEST(engine_concurrent_equals_alone_mqa_tiny_steps) { concurrent_equals_alone(lm_t_, "llama3-rope-mqa", 5); }

/* The step budgets: a prompt with no stream decoding is prefilled in
 * chunks of prefill_tokens; once a stream decodes, every forward it is in
 * stays within step_tokens (a prompt arriving then comes in small chunks),
 * and neither changes a token. Without prefill_tokens on the CPU a prompt
 * alone takes step_tokens chunks. */
LM_TEST(engine_prefill_budget_only_while_no_stream_decodes) {
    fixture f;
    if (!fixture_open(&f, "llama")) {
        fixture_close(&f);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    int32_t prompt[2][100];
    for (int i = 0; i < 100; i++) prompt[0][i] = 3 + (i * 7) % 200, prompt[1][i] = 5 + (i * 11) % 190;
    int32_t alone[2][40];
    for (int pass = 0; pass < 3; pass++) {
        /* pass 0: each prompt alone; 1: both at once; 2: alone, prefill_tokens unset */
        lm_engine *en = NULL;
        lm_engine_opts o = { .ctx = 256, .parallel = 2, .step_tokens = 16, .prefill_tokens = pass == 2 ? 0 : 64 };
        LM_REQUIRE(lm_engine_create(&en, f.m, &o, NULL) == 0);
        lm_tu_collect c[2];
        lm_request *r[2];
        lm_gen_params p = greedy(40);
        for (int k = 0; k < 2; k++) {
            lm_tu_collect_init(&c[k]);
            LM_REQUIRE(lm_engine_submit(en, prompt[k], 100, &p, lm_tu_collect_on_token, &c[k], &r[k], NULL) ==
                       LM_ENGINE_OK);
            if (pass != 1) lm_tu_collect_wait(&c[k]);
        }
        int chunks[2];
        for (int k = 0; k < 2; k++) {
            lm_tu_collect_wait(&c[k]);
            LM_CHECK(c[k].n == 40 && c[k].max_step_batch >= 1 && c[k].max_step_batch <= 16);
            if (pass == 0) memcpy(alone[k], c[k].toks, sizeof alone[k]);
            else LM_CHECK(memcmp(alone[k], c[k].toks, sizeof alone[k]) == 0);
            chunks[k] = c[k].n_prefill_chunks;
            lm_request_release(r[k]);
            lm_tu_collect_destroy(&c[k]);
        }
        /* 100 tokens: 64 + 36 alone; in steps of 16 without prefill_tokens */
        if (pass == 0) LM_CHECK(chunks[0] == 2 && chunks[1] == 2);
        if (pass == 2) LM_CHECK(chunks[0] == 7 && chunks[1] == 7);
        /* both at once: the first prompt as alone; the second mostly in
         * chunks of 15 beside the first's token */
        if (pass == 1) LM_CHECK(chunks[0] == 2 && chunks[1] >= 6);
        lm_engine_free(en);
    }
    fixture_close(&f);
}

/* The GPU's prompt-only budget from two warm-ups' memory: 512 and 1,024
 * tokens took used1 and used2 bytes; half of what is left free is kept. */
LM_TEST(engine_fit_prefill_tokens_from_warm_ups) {
    const size_t M = (size_t)1 << 20;
    /* 1 MiB a token beyond 1,024 (512 MiB more for 512 more): 4,096 needs
     * 3,072 MiB more, which half of 8 GiB holds, half of 4 GiB does not */
    LM_CHECK(lm_fit_prefill_tokens(512, 4096, 600 * M, 1112 * M, 8192 * M) == 4096);
    LM_CHECK(lm_fit_prefill_tokens(512, 4096, 600 * M, 1112 * M, 4096 * M) == 3072);
    LM_CHECK(lm_fit_prefill_tokens(512, 4096, 600 * M, 1112 * M, 1300 * M) == 1536);
    /* nothing left: what the second warm-up ran */
    LM_CHECK(lm_fit_prefill_tokens(512, 4096, 600 * M, 1112 * M, 0) == 1024);
    /* no growth between the warm-ups: the second's bytes shared evenly
     * (0.68 MiB a token, 1,050 MiB of room: 1,536 more) */
    LM_CHECK(lm_fit_prefill_tokens(512, 4096, 700 * M, 700 * M, 2100 * M) == 2560);
    LM_CHECK(lm_fit_prefill_tokens(512, 4096, 0, 0, 0) == 4096);
    /* what the warm-ups ran needs no estimate */
    LM_CHECK(lm_fit_prefill_tokens(512, 1024, 600 * M, 1112 * M, 0) == 1024);
}

LM_TEST(engine_reference_greedy) {
    fixture f;
    if (!fixture_open(&f, "llama")) {
        fixture_close(&f);
        LM_SKIP("fixture llama not available");
    }
    int32_t ids[64], want[24];
    int n = ref_ids(&f, "prompt1.ids", ids, 64);
    LM_REQUIRE(n == 64 && ref_ids(&f, "prompt1.greedy_ids", want, 24) == 24);
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, f.m, &(lm_engine_opts){ .ctx = 128 }, NULL) == 0);
    lm_tu_collect c;
    lm_tu_collect_init(&c);
    lm_request *r;
    lm_gen_params p = greedy(24);
    p.logprobs = true;
    p.top_logprobs = 5;
    LM_REQUIRE(lm_engine_submit(en, ids, n, &p, lm_tu_collect_on_token, &c, &r, NULL) == LM_ENGINE_OK);
    lm_tu_collect_wait(&c);
    LM_CHECK(c.n == 24 && memcmp(c.toks, want, sizeof want) == 0);
    LM_CHECK(c.n_top0 == 5 && c.logprob0 < 0 && c.logprob0 > -20);
    lm_request_release(r);
    lm_tu_collect_destroy(&c);
    lm_engine_free(en);
    fixture_close(&f);
}

LM_TEST(engine_cancel_frees_cache) {
    fixture f;
    if (!fixture_open(&f, "qwen3")) {
        fixture_close(&f);
        LM_SKIP("fixture qwen3 not available");
    }
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, f.m, &(lm_engine_opts){ .ctx = 4096, .parallel = 1 }, NULL) == 0);
    int32_t ids[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    lm_tu_collect a, b;
    lm_tu_collect_init(&a);
    lm_tu_collect_init(&b);
    lm_request *ra, *rb;
    lm_gen_params p = greedy(4000);
    LM_REQUIRE(lm_engine_submit(en, ids, 8, &p, lm_tu_collect_on_token, &a, &ra, NULL) == LM_ENGINE_OK);
    /* b waits: parallel = 1 */
    LM_REQUIRE(lm_engine_submit(en, ids, 8, &p, lm_tu_collect_on_token, &b, &rb, NULL) == LM_ENGINE_OK);
    lm_tu_collect_wait_tokens(&a, 3);
    lm_request_cancel(ra);
    lm_tu_collect_wait(&a);
    LM_CHECK(a.finish == LM_FINISH_CANCELLED && a.n < 4000);
    lm_tu_collect_wait_tokens(&b, 2); /* b got admitted once a let go */
    LM_CHECK(b.n >= 2);
    lm_request_release(rb); /* release without waiting: cancels */
    lm_request_release(ra);
    lm_engine_stats st;
    wait_idle(en, &st); /* the engine finishes b asynchronously */
    LM_CHECK(st.running == 0 && st.kv_blocks_free == st.kv_blocks_total);
    lm_tu_collect_destroy(&a);
    lm_tu_collect_destroy(&b);
    lm_engine_free(en);
    fixture_close(&f);
}

LM_TEST(engine_limits_and_errors) {
    fixture f;
    if (!fixture_open(&f, "llama")) {
        fixture_close(&f);
        LM_SKIP("fixture llama not available");
    }
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, f.m, &(lm_engine_opts){ .ctx = 64, .parallel = 1, .max_queue = 2 }, NULL) == 0);
    int32_t ids[4] = { 1, 2, 3, 4 }, bad[2] = { 1, 99999 };
    lm_err e = { { 0 } };
    lm_request *r[5] = { 0 };
    lm_gen_params p = greedy(61);
    LM_CHECK(lm_engine_submit(en, ids, 4, &p, lm_tu_collect_on_token, NULL, &r[0], &e) == LM_ENGINE_ERROR &&
             strstr(e.msg, "exceed the context"));
    p.max_tokens = 10;
    LM_CHECK(lm_engine_submit(en, bad, 2, &p, lm_tu_collect_on_token, NULL, &r[0], &e) == LM_ENGINE_ERROR &&
             strstr(e.msg, "out of range"));
    LM_CHECK(lm_engine_submit(en, ids, 0, &p, lm_tu_collect_on_token, NULL, &r[0], &e) == LM_ENGINE_ERROR);
    /* stop tokens end generation with STOP: stop on whatever greedy emits first */
    int32_t first;
    LM_REQUIRE(lm_tu_greedy_alone(f.m, ids, 4, 1, &first) == 0);
    p.stop_tokens = &first;
    p.n_stop_tokens = 1;
    lm_tu_collect c;
    lm_tu_collect_init(&c);
    LM_REQUIRE(lm_engine_submit(en, ids, 4, &p, lm_tu_collect_on_token, &c, &r[0], &e) == LM_ENGINE_OK);
    lm_tu_collect_wait(&c);
    LM_CHECK(c.finish == LM_FINISH_STOP && c.n == 0);
    lm_request_release(r[0]);
    lm_tu_collect_destroy(&c);
    lm_engine_free(en);
    fixture_close(&f);
}

LM_TEST(engine_seeded_sampling_repeats) {
    fixture f;
    if (!fixture_open(&f, "llama")) {
        fixture_close(&f);
        LM_SKIP("fixture llama not available");
    }
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, f.m, &(lm_engine_opts){ .ctx = 128, .parallel = 3 }, NULL) == 0);
    int32_t ids[4] = { 5, 6, 7, 8 };
    lm_tu_collect c[3];
    lm_request *r[3];
    for (int i = 0; i < 3; i++) {
        lm_gen_params p = greedy(16);
        p.sampling.temperature = 1.3f;
        p.sampling.seed = i == 2 ? 99 : 42;
        p.frequency_penalty = 0.5f;
        lm_tu_collect_init(&c[i]);
        LM_REQUIRE(lm_engine_submit(en, ids, 4, &p, lm_tu_collect_on_token, &c[i], &r[i], NULL) == LM_ENGINE_OK);
    }
    for (int i = 0; i < 3; i++) lm_tu_collect_wait(&c[i]);
    LM_CHECK(c[0].n == 16 && c[1].n == 16 && memcmp(c[0].toks, c[1].toks, sizeof(int32_t) * 16) == 0);
    LM_CHECK(memcmp(c[0].toks, c[2].toks, sizeof(int32_t) * 16) != 0);
    for (int i = 0; i < 3; i++) {
        lm_request_release(r[i]);
        lm_tu_collect_destroy(&c[i]);
    }
    lm_engine_free(en);
    fixture_close(&f);
}

/* lm_engine_opts.warmup (on by default only on GPUs): the warm-up forward
 * runs on a scratch sequence of the hybrid demo model (KV blocks and a
 * state slot), leaves the pool whole, and changes no request's tokens. */
LM_TEST(engine_warmup_changes_nothing) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    LM_REQUIRE(lm_model_load(&m, LUMEN_SOURCE_DIR "/models/demo", be, &e) == 0);
    int32_t prompt[20], got[2][16];
    for (int i = 0; i < 20; i++) prompt[i] = (i * 97 + 13) % m->cfg.vocab;
    for (int w = 0; w < 2; w++) {
        lm_engine *en = NULL;
        lm_engine_opts o = { .ctx = 256, .parallel = 2, .step_tokens = 64, .warmup = w ? 1 : -1 };
        LM_REQUIRE(lm_engine_create(&en, m, &o, &e) == 0);
        lm_engine_stats st;
        wait_idle(en, &st);
        LM_CHECK_MSG(st.kv_blocks_free == st.kv_blocks_total, "warmup %d: %d of %d blocks free", o.warmup,
                     st.kv_blocks_free, st.kv_blocks_total);
        lm_tu_collect c;
        lm_tu_collect_init(&c);
        lm_request *r;
        lm_gen_params p = greedy(16);
        LM_REQUIRE(lm_engine_submit(en, prompt, 20, &p, lm_tu_collect_on_token, &c, &r, NULL) == LM_ENGINE_OK);
        lm_tu_collect_wait(&c);
        LM_CHECK(c.n == 16);
        memcpy(got[w], c.toks, sizeof got[w]);
        lm_request_release(r);
        lm_tu_collect_destroy(&c);
        lm_engine_free(en);
    }
    LM_CHECK(memcmp(got[0], got[1], sizeof got[0]) == 0);
    lm_model_free(m);
    lm_backend_destroy(be);
}

/* ---- greedy look-ahead ---- */

enum { LA_N = 6, LA_MAX = 48 };

typedef struct la_result {
    int32_t toks[LA_N][LA_MAX];
    int n[LA_N];
    lm_finish finish[LA_N];
    lm_engine_stats st;
} la_result;

/* Runs LA_N greedy requests through one engine (look_ahead as given, a
 * prefix cache, 4 at a time, so the fifth waits): limits of 1, 2, 3, 17, 40
 * and 40 tokens, stop tokens as given (stops[i] < 0: none), then the sixth -
 * submitted after the rest are done - repeats request 4's prompt and its 40
 * tokens and goes on: a prefix-cache hit at the block boundary that
 * request 4 reached last while generating (on a hybrid, the recurrent-state
 * checkpoint taken there). */
static void la_run(lm_test_ctx *lm_t_, lm_model *m, int look_ahead, const int32_t *prompt, int n_prompt,
                   const int32_t stops[LA_N], la_result *out) {
    static const int max_tokens[LA_N] = { 1, 2, 3, 17, 40, 40 };
    memset(out, 0, sizeof *out);
    lm_err e = { { 0 } };
    lm_engine *en = NULL;
    lm_engine_opts o = { .ctx = 256, .parallel = 4, .step_tokens = 64, .cache_ram = (size_t)64 << 20,
                         .look_ahead = look_ahead };
    if (!(lm_engine_create(&en, m, &o, &e) == 0)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return;
    }
    lm_tu_collect c[LA_N];
    lm_request *r[LA_N] = { 0 };
    int32_t again[256];
    for (int i = 0; i < LA_N; i++) {
        lm_tu_collect_init(&c[i]);
        lm_gen_params p = greedy(max_tokens[i]);
        p.stop_tokens = &stops[i];
        p.n_stop_tokens = stops[i] >= 0;
        const int32_t *ids = prompt + i;
        int n = n_prompt - 8 - i;
        if (i == LA_N - 1) { /* request 4's prompt and answer, then a few more prompt tokens */
            for (int k = 0; k < LA_N - 1; k++) lm_tu_collect_wait(&c[k]);
            n = 0;
            for (int k = 0; k < n_prompt - 8 - 4; k++) again[n++] = prompt[4 + k];
            for (int k = 0; k < c[4].n; k++) again[n++] = c[4].toks[k];
            for (int k = 0; k < 5; k++) again[n++] = prompt[k];
            ids = again;
        }
        LM_REQUIRE(lm_engine_submit(en, ids, n, &p, lm_tu_collect_on_token, &c[i], &r[i], &e) == LM_ENGINE_OK);
    }
    for (int i = 0; i < LA_N; i++) {
        lm_tu_collect_wait(&c[i]);
        out->n[i] = LM_MIN(c[i].n, LA_MAX);
        memcpy(out->toks[i], c[i].toks, (size_t)out->n[i] * sizeof(int32_t));
        out->finish[i] = c[i].finish;
        lm_request_release(r[i]);
        lm_tu_collect_destroy(&c[i]);
    }
    for (int i = 0; i < 2000; i++) { /* stats are published after each step */
        lm_engine_get_stats(en, &out->st);
        if (out->st.running == 0 && out->st.queued == 0) break;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    LM_CHECK(out->st.kv_blocks_free == out->st.kv_blocks_total - out->st.cache_blocks);
    lm_engine_free(en);
}

/* Look-ahead on (each decode step queued before the last one's ids are
 * read, its tokens fed forward by the backend) gives every request exactly
 * the tokens and finish reasons it gets with look-ahead off: limits met
 * exactly, stop tokens mid-stream (the step queued past them discarded),
 * waiting requests joining, a prefix-cache hit with a hybrid's state
 * checkpoint. On the CPU backend the look-ahead is offered but off by
 * default; the test turns it on. */
static void look_ahead_same(lm_test_ctx *lm_t_, const char *dir) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    if (!(be)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return;
    }
    lm_model *m = NULL;
    if (!(lm_model_load(&m, dir, be, &e) == 0)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return;
    }
    LM_REQUIRE(lm_model_look_ahead(m));
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    lm_safetensors ref = { 0 };
    if (!(lm_safetensors_open(&ref, path, &e) == 0)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return;
    }
    const lm_file_tensor *t = lm_safetensors_find(&ref, "prompt1.ids");
    LM_REQUIRE(t && t->shape[0] >= 40);
    int32_t prompt[64];
    const int n_prompt = (int)LM_MIN(t->shape[0], 64);
    memcpy(prompt, t->data, (size_t)n_prompt * sizeof(int32_t));
    lm_safetensors_close(&ref);
    /* a first run learns the answers; a stop token is then taken from them:
     * request 3's 6th (it stops at its first occurrence) */
    int32_t none[LA_N] = { -1, -1, -1, -1, -1, -1 }, stops[LA_N] = { -1, -1, -1, -1, -1, -1 };
    la_result *probe = malloc(sizeof *probe), *off = malloc(sizeof *off), *on = malloc(sizeof *on);
    la_run(lm_t_, m, -1, prompt, n_prompt, none, probe);
    LM_REQUIRE(probe->n[3] == 17 && probe->n[4] == 40);
    stops[3] = probe->toks[3][5];
    la_run(lm_t_, m, -1, prompt, n_prompt, stops, off);
    la_run(lm_t_, m, 1, prompt, n_prompt, stops, on);
    for (int i = 0; i < LA_N; i++) {
        LM_CHECK_MSG(off->n[i] == on->n[i] && memcmp(off->toks[i], on->toks[i], (size_t)on->n[i] * sizeof(int32_t)) == 0,
                     "request %d: %d tokens with look-ahead, %d without, or they differ", i, on->n[i], off->n[i]);
        LM_CHECK_MSG(off->finish[i] == on->finish[i], "request %d: finish %d vs %d", i, on->finish[i], off->finish[i]);
    }
    LM_CHECK(on->finish[3] == LM_FINISH_STOP && on->n[3] <= 6 && on->n[4] == 40 && on->st.cache_hit_tokens > 0);
    LM_CHECK(on->n[0] == 1 && on->n[1] == 2 && on->n[2] == 3);
    printf("  %s: look-ahead steps %llu of %llu, discarded rows %llu; without: %llu steps\n", dir,
           (unsigned long long)on->st.ahead_steps, (unsigned long long)on->st.steps,
           (unsigned long long)on->st.ahead_discarded, (unsigned long long)off->st.steps);
    LM_CHECK(off->st.ahead_steps == 0 && on->st.ahead_steps > 0 && on->st.ahead_discarded > 0);
    free(probe), free(off), free(on);
    lm_model_free(m);
    lm_backend_destroy(be);
}

LM_TEST(engine_look_ahead_same_tokens_demo_hybrid) { look_ahead_same(lm_t_, LUMEN_SOURCE_DIR "/models/demo"); }

LM_TEST(engine_look_ahead_same_tokens_llama) {
    char *dir = lm_test_fixture_path("models/llama");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    look_ahead_same(lm_t_, dir);
    free(dir);
}
