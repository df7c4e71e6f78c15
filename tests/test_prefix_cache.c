/* test_prefix_cache.c - the engine's prefix cache never changes a greedy
 * result, and it reports what it did.
 *
 * For every architecture (llama, qwen3, qwen3-moe, gemma3, gemma4 and the
 * qwen3.5 / qwen3-next / demo hybrids) one engine serves a conversation-like
 * series of requests: a cold prompt, the same prompt again (full-prompt hit),
 * a prompt leaving it mid-block (a copy-on-write hit for attention models, a
 * checkpoint hit for hybrids), the second turn (prompt + answer + new tokens:
 * a hit on generated tokens), and a prompt ending on a block boundary followed
 * by its extension. Each request must give exactly the tokens the plain runner
 * gives it alone, with the cached-token count the design promises. Then: a
 * cache too small for two prompts evicts and stays exact and says EVICTED;
 * miss diagnostics (diverged position, a hybrid's missing checkpoint);
 * concurrent requests sharing a prefix; and a cache-hit request cancelled in
 * the middle of its prefill leaves every block either free or cache-held. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/lm_engine.h"
#include "engine/lm_prefix_cache.h"
#include "lm_test.h"
#include "test_util.h"

#define PC_MAX 160
#define PC_GEN 12

typedef struct pc_collect {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[64];
    int n;
    bool done;
    lm_finish finish;
    int n_cached;
    lm_request_trace tr;
    bool steps_ok;
    /* stalls: on token stall_at[k] the callback sets stalled[k] and waits
     * until go[k] (the engine thread is held there meanwhile) */
    int stall_at[2];
    bool stalled[2], go[2];
} pc_collect;

static void pc_on_token(void *user, const lm_token_event *ev) {
    pc_collect *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->has_token && c->n < 64) c->toks[c->n++] = ev->token;
    if (ev->done) {
        c->done = true;
        c->finish = ev->finish;
        c->n_cached = ev->n_cached;
        c->steps_ok = ev->trace != NULL;
        if (ev->trace) {
            c->tr = *ev->trace;
            for (int i = 0; i < ev->trace->n_steps; i++) c->steps_ok &= ev->trace->step_batch[i] >= 1;
            c->tr.step_batch = NULL;
        }
    }
    pthread_cond_broadcast(&c->cv);
    for (int k = 0; k < 2; k++) {
        if (!(c->stall_at[k] > 0 && c->n == c->stall_at[k] && !ev->done)) continue;
        c->stalled[k] = true;
        pthread_cond_broadcast(&c->cv);
        while (!c->go[k]) pthread_cond_wait(&c->cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
}

static void pc_init(pc_collect *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

static void pc_wait(pc_collect *c) {
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void pc_destroy(pc_collect *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

static lm_gen_params pc_greedy(int max_tokens) {
    lm_gen_params p = { 0 };
    p.sampling.top_p = 1;
    p.repetition_penalty = 1;
    p.max_tokens = max_tokens;
    return p;
}

/* Submits one request and waits for its final event. */
static int pc_run(lm_engine *en, const int32_t *ids, int n, int gen, pc_collect *c) {
    pc_init(c);
    lm_request *r = NULL;
    lm_gen_params p = pc_greedy(gen);
    if (lm_engine_submit(en, ids, n, &p, pc_on_token, c, &r, NULL) != LM_ENGINE_OK) return -1;
    pc_wait(c);
    lm_request_release(r);
    return 0;
}

/* Stats are published after each step, a moment after the last final event:
 * waits until nothing runs and every block is free or held by the cache. */
static void pc_wait_idle(lm_engine *en, lm_engine_stats *st) {
    for (int i = 0; i < 5000; i++) {
        lm_engine_get_stats(en, st);
        if (st->running == 0 && st->queued == 0 && st->kv_blocks_free + st->cache_blocks == st->kv_blocks_total)
            return;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

typedef struct pc_model {
    lm_backend *be;
    lm_model *m;
    bool stateful;
    size_t block_bytes, state_bytes;
    lm_kv_types kvt; /* the KV format (zero: f32) */
} pc_model;

/* name: a fixture under ../shared/fixtures/models, or "demo" (models/demo). */
static bool pc_open(pc_model *pm, const char *name, char *why, size_t n_why) {
    memset(pm, 0, sizeof *pm);
    char *dir;
    if (strcmp(name, "demo") == 0) {
        size_t k = strlen(LUMEN_SOURCE_DIR) + 16;
        dir = malloc(k);
        snprintf(dir, k, "%s/models/demo", LUMEN_SOURCE_DIR);
    } else {
        char rel[128];
        snprintf(rel, sizeof rel, "models/%s", name);
        dir = lm_test_fixture_path(rel);
        if (!dir) {
            snprintf(why, n_why, "%s", lm_test_fixtures_why());
            return false;
        }
    }
    lm_err e = { { 0 } };
    pm->be = lm_tu_model_backend(2, &e);
    bool ok = pm->be && lm_model_load(&pm->m, dir, pm->be, &e) == 0;
    free(dir);
    if (!ok) {
        snprintf(why, n_why, "%s: %s", name, e.msg);
        return false;
    }
    int64_t floats[64];
    int ns = lm_model_state_spec(pm->m, floats, 64);
    for (int i = 0; i < ns; i++) pm->state_bytes += (size_t)floats[i] * sizeof(float);
    /* a sliding-window model keeps its window in rings, which are state, in
     * the conversation's engine (ctx 256, steps of 64) */
    pm->stateful = ns > 0 || lm_kv_ring_for(pm->m, 16, 256, 64) > 0;
    pm->block_bytes = (size_t)2 * (size_t)pm->m->n_kv_layers * 16 * (size_t)pm->m->kv_width * sizeof(float);
    return true;
}

static void pc_close(pc_model *pm) {
    lm_model_free(pm->m);
    lm_backend_destroy(pm->be);
}

/* Opens fixture `name` as pm, or skips the test saying why. */
#define PC_OPEN_OR_SKIP(pm, name)                           \
    pc_model pm;                                            \
    do {                                                    \
        char why_[600];                                     \
        if (!pc_open(&pm, name, why_, sizeof why_)) {       \
            pc_close(&pm);                                  \
            LM_SKIP("%s", why_);                            \
        }                                                   \
    } while (0)

/* Deterministic token ids in [3, V). */
static void pc_tokens(int32_t *out, int n, uint32_t seed, int V) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        out[i] = 3 + (int32_t)((seed >> 8) % (uint32_t)(V - 3));
    }
}

/* A token different from t. */
static int32_t pc_other(int32_t t, int V) { return t + 1 < V ? t + 1 : 3; }

typedef struct pc_case {
    int32_t ids[PC_MAX];
    int n, gen;
    int32_t want[PC_GEN];
    int want_cached;   /* -1: only checked to be at least min_cached */
    int min_cached;
} pc_case;

enum { C_A, C_REPEAT, C_MID, C_TURN2, C_EDGE, C_EDGE_EXT, C_N };

/* The conversation above, for a model: prompts, cold tokens, expected hits. */
static int pc_build(pc_model *pm, pc_case *c) {
    int V = pm->m->cfg.vocab;
    int32_t base[96], other[32];
    pc_tokens(base, 96, 7, V);
    pc_tokens(other, 32, 99, V);
    bool st = pm->stateful;
    /* A: 40 tokens (two full blocks and a partial one), 12 generated */
    c[C_A].n = 40;
    memcpy(c[C_A].ids, base, 40 * sizeof(int32_t));
    c[C_A].want_cached = 0;
    /* the same prompt: all but its last token (hybrid: the checkpoint at 32) */
    c[C_REPEAT] = c[C_A];
    c[C_REPEAT].want_cached = st ? 32 : 39;
    /* leaves A at 37, inside block 2: copy-on-write of 5 rows (hybrid: 32) */
    c[C_MID].n = 57;
    memcpy(c[C_MID].ids, base, 37 * sizeof(int32_t));
    memcpy(c[C_MID].ids + 37, other, 20 * sizeof(int32_t));
    c[C_MID].ids[37] = pc_other(base[37], V);
    c[C_MID].want_cached = st ? 32 : 37;
    /* edge: 64 tokens, a prompt ending on a block boundary; then extended */
    c[C_EDGE].n = 64;
    memcpy(c[C_EDGE].ids, base, 64 * sizeof(int32_t));
    c[C_EDGE].want_cached = st ? 32 : -1;
    c[C_EDGE].min_cached = 32;
    c[C_EDGE_EXT].n = 69;
    memcpy(c[C_EDGE_EXT].ids, base, 64 * sizeof(int32_t));
    memcpy(c[C_EDGE_EXT].ids + 64, other + 20, 5 * sizeof(int32_t));
    c[C_EDGE_EXT].want_cached = 64;
    for (int i = 0; i < C_N; i++) c[i].gen = PC_GEN;
    if (lm_tu_greedy_alone_kv(pm->m, pm->kvt, c[C_A].ids, c[C_A].n, PC_GEN, c[C_A].want)) return -1;
    /* turn 2: A's prompt + its answer + 10 new tokens; A's first 48 tokens
     * (prompt and answer) filled three blocks (hybrid: its generation checkpoint) */
    c[C_TURN2].n = 62;
    memcpy(c[C_TURN2].ids, base, 40 * sizeof(int32_t));
    memcpy(c[C_TURN2].ids + 40, c[C_A].want, PC_GEN * sizeof(int32_t));
    memcpy(c[C_TURN2].ids + 52, other + 22, 10 * sizeof(int32_t));
    c[C_TURN2].want_cached = 48;
    for (int i = 1; i < C_N; i++)
        if (lm_tu_greedy_alone_kv(pm->m, pm->kvt, c[i].ids, c[i].n, c[i].gen, c[i].want)) return -1;
    return 0;
}

static void pc_check_tokens(lm_test_ctx *lm_t_, const char *what, const pc_collect *got, const pc_case *c) {
    LM_CHECK_MSG(got->finish == LM_FINISH_LENGTH && got->n == c->gen, "%s: finish %d, %d tokens", what, got->finish,
                 got->n);
    LM_CHECK_MSG(memcmp(got->toks, c->want, (size_t)got->n * sizeof(int32_t)) == 0, "%s: differs from the cold run",
                 what);
}

/* kvt: the KV format of the cold runs and of the engine (a hit must give
 * the tokens a cold run gives in the same format). */
static void pc_conversation_kv(lm_test_ctx *lm_t_, const char *name, lm_kv_types kvt) {
    PC_OPEN_OR_SKIP(pm, name);
    pm.kvt = kvt;
    static pc_case c[C_N];
    LM_REQUIRE(pc_build(&pm, c) == 0);
    lm_engine *en = NULL;
    lm_engine_opts o = { .ctx = 256, .parallel = 2, .step_tokens = 64, .cache_ram = 64u << 20, .kv_type = kvt };
    LM_REQUIRE(lm_engine_create(&en, pm.m, &o, NULL) == 0);
    static const char *names[C_N] = { "cold", "repeat", "mid-block", "turn 2", "block edge", "edge extended" };
    uint64_t prompt_tokens = 0, hit_tokens = 0;
    for (int i = 0; i < C_N; i++) {
        pc_collect got;
        LM_REQUIRE(pc_run(en, c[i].ids, c[i].n, c[i].gen, &got) == 0);
        pc_check_tokens(lm_t_, names[i], &got, &c[i]);
        if (c[i].want_cached >= 0)
            LM_CHECK_MSG(got.n_cached == c[i].want_cached, "%s %s: %d cached, want %d", name, names[i], got.n_cached,
                         c[i].want_cached);
        else
            LM_CHECK_MSG(got.n_cached >= c[i].min_cached && got.n_cached < c[i].n, "%s %s: %d cached", name,
                         names[i], got.n_cached);
        LM_CHECK(got.tr.n_cached == got.n_cached && got.steps_ok && got.tr.n_steps == c[i].gen - 1);
        LM_CHECK(got.tr.t_submit > 0 && got.tr.t_admit >= got.tr.t_submit && got.tr.t_first >= got.tr.t_admit &&
                 got.tr.t_done >= got.tr.t_first && got.tr.n_prefill_chunks >= 1);
        if (i == C_REPEAT || i == C_TURN2)
            LM_CHECK_MSG(got.tr.miss == LM_MISS_NONE && got.tr.diverge_pos == -1, "%s: miss %d at %d", names[i],
                         got.tr.miss, got.tr.diverge_pos);
        if (i == C_TURN2) LM_CHECK(got.tr.n_shared == 40 + PC_GEN);
        if (i == C_MID)
            LM_CHECK_MSG(got.tr.miss == LM_MISS_DIVERGED && got.tr.diverge_pos == 37 && got.tr.n_shared == 37 &&
                             got.tr.n_prev > 0 && got.tr.prev_start <= 37 && got.tr.prev_start + got.tr.n_prev > 37 &&
                             got.tr.prev_window[37 - got.tr.prev_start] == c[C_A].ids[37],
                         "mid: miss %d diverge %d shared %d", got.tr.miss, got.tr.diverge_pos, got.tr.n_shared);
        prompt_tokens += (uint64_t)c[i].n;
        hit_tokens += (uint64_t)got.n_cached;
        pc_destroy(&got);
    }
    lm_engine_stats st;
    pc_wait_idle(en, &st);
    LM_CHECK(st.kv_blocks_free + st.cache_blocks == st.kv_blocks_total);
    LM_CHECK(st.cache_lookup_tokens == prompt_tokens && st.cache_hit_tokens == hit_tokens);
    LM_CHECK(st.cache_blocks > 0 && st.cache_bytes <= o.cache_ram && st.cache_evicted_blocks == 0);
    LM_CHECK(pm.stateful ? st.cache_checkpoints > 0 : st.cache_checkpoints == 0);
    uint64_t hist = 0;
    for (int i = 0; i < 8; i++) hist += st.batch_hist[i];
    LM_CHECK(hist == st.steps && st.batch_hist[0] > 0);
    lm_engine_free(en);
    pc_close(&pm);
}

static void pc_conversation(lm_test_ctx *lm_t_, const char *name) {
    pc_conversation_kv(lm_t_, name, (lm_kv_types){ LM_KV_F32, LM_KV_F32 });
}

LM_TEST(prefix_cache_exact_llama) { pc_conversation(lm_t_, "llama"); }
LM_TEST(prefix_cache_exact_llama_kv_bf16) { pc_conversation_kv(lm_t_, "llama", (lm_kv_types){ LM_KV_BF16, LM_KV_BF16 }); }
LM_TEST(prefix_cache_exact_llama_kv_q8) { pc_conversation_kv(lm_t_, "llama", (lm_kv_types){ LM_KV_Q8, LM_KV_Q8 }); }
LM_TEST(prefix_cache_exact_llama_kv_q4) { pc_conversation_kv(lm_t_, "llama", (lm_kv_types){ LM_KV_Q4, LM_KV_Q4 }); }
LM_TEST(prefix_cache_exact_llama_kv_k8v4r) { pc_conversation_kv(lm_t_, "llama", (lm_kv_types){ LM_KV_Q8, LM_KV_Q4R }); }
LM_TEST(prefix_cache_exact_qwen3_kv_q4r) { pc_conversation_kv(lm_t_, "qwen3", (lm_kv_types){ LM_KV_Q4R, LM_KV_Q4R }); }
LM_TEST(prefix_cache_exact_demo_hybrid_kv_q4r) { pc_conversation_kv(lm_t_, "demo", (lm_kv_types){ LM_KV_Q4R, LM_KV_Q4R }); }
LM_TEST(prefix_cache_exact_qwen3) { pc_conversation(lm_t_, "qwen3"); }
LM_TEST(prefix_cache_exact_qwen3_moe) { pc_conversation(lm_t_, "qwen3-moe"); }
LM_TEST(prefix_cache_exact_gemma3) { pc_conversation(lm_t_, "gemma3"); }
LM_TEST(prefix_cache_exact_gemma4) { pc_conversation(lm_t_, "gemma4"); }
LM_TEST(prefix_cache_exact_qwen35_hybrid) { pc_conversation(lm_t_, "qwen3.5"); }
LM_TEST(prefix_cache_exact_qwen3_next_hybrid) { pc_conversation(lm_t_, "qwen3-next"); }
LM_TEST(prefix_cache_exact_demo_hybrid) { pc_conversation(lm_t_, "demo"); }

/* A budget of three blocks (and one checkpoint): a second prompt evicts the
 * first one's blocks; the first prompt again is exact and says EVICTED. */
static void pc_eviction(lm_test_ctx *lm_t_, const char *name) {
    PC_OPEN_OR_SKIP(pm, name);
    int V = pm.m->cfg.vocab;
    int32_t a[40], g[40], want_a[4], want_g[4];
    pc_tokens(a, 40, 3, V);
    pc_tokens(g, 40, 5, V);
    g[0] = pc_other(a[0], V);
    LM_REQUIRE(lm_tu_greedy_alone(pm.m, a, 40, 4, want_a) == 0 && lm_tu_greedy_alone(pm.m, g, 40, 4, want_g) == 0);
    lm_engine_opts o = { .ctx = 128, .parallel = 1, .cache_ram = 3 * pm.block_bytes + pm.state_bytes };
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, pm.m, &o, NULL) == 0);
    const int32_t *seq[3] = { a, g, a }, *want[3] = { want_a, want_g, want_a };
    pc_collect got[3];
    for (int i = 0; i < 3; i++) {
        LM_REQUIRE(pc_run(en, seq[i], 40, 4, &got[i]) == 0);
        LM_CHECK_MSG(got[i].n == 4 && memcmp(got[i].toks, want[i], sizeof(int32_t) * 4) == 0, "request %d differs", i);
    }
    LM_CHECK_MSG(got[2].n_cached < 32 && got[2].tr.miss == LM_MISS_EVICTED && got[2].tr.n_shared == 40,
                 "cached %d miss %d shared %d", got[2].n_cached, got[2].tr.miss, got[2].tr.n_shared);
    lm_engine_stats st;
    pc_wait_idle(en, &st);
    LM_CHECK(st.kv_blocks_free + st.cache_blocks == st.kv_blocks_total);
    LM_CHECK(st.cache_evicted_blocks > 0 && st.cache_bytes <= o.cache_ram && st.cache_blocks <= 3);
    LM_CHECK(st.miss_evicted == 1);
    for (int i = 0; i < 3; i++) pc_destroy(&got[i]);
    lm_engine_free(en);
    pc_close(&pm);
}

LM_TEST(prefix_cache_eviction_exact_llama) { pc_eviction(lm_t_, "llama"); }
LM_TEST(prefix_cache_eviction_exact_qwen35) { pc_eviction(lm_t_, "qwen3.5"); }

/* Hybrid: a prompt sharing 50 tokens with a 100-token one finds its KV blocks
 * but no checkpoint at or below 48 (they sit at 96 and in the answer): STATE. */
LM_TEST(prefix_cache_miss_state_qwen35) {
    PC_OPEN_OR_SKIP(pm, "qwen3.5");
    int V = pm.m->cfg.vocab;
    int32_t a[100], b[60], want_b[4];
    pc_tokens(a, 100, 11, V);
    memcpy(b, a, 50 * sizeof(int32_t));
    pc_tokens(b + 50, 10, 12, V);
    b[50] = pc_other(a[50], V);
    LM_REQUIRE(lm_tu_greedy_alone(pm.m, b, 60, 4, want_b) == 0);
    lm_engine_opts o = { .ctx = 128, .parallel = 1, .cache_ram = 16u << 20 };
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, pm.m, &o, NULL) == 0);
    pc_collect ga, gb;
    LM_REQUIRE(pc_run(en, a, 100, 4, &ga) == 0 && pc_run(en, b, 60, 4, &gb) == 0);
    LM_CHECK(gb.n == 4 && memcmp(gb.toks, want_b, sizeof want_b) == 0);
    LM_CHECK_MSG(gb.n_cached == 0 && gb.tr.miss == LM_MISS_STATE && gb.tr.n_shared == 50 && gb.tr.diverge_pos == 50,
                 "cached %d miss %d shared %d diverge %d", gb.n_cached, gb.tr.miss, gb.tr.n_shared, gb.tr.diverge_pos);
    lm_engine_stats st;
    pc_wait_idle(en, &st);
    LM_CHECK(st.miss_state == 1 && st.miss_diverged == 0);
    pc_destroy(&ga);
    pc_destroy(&gb);
    lm_engine_free(en);
    pc_close(&pm);
}

/* cache_ram LM_CACHE_RAM_AUTO: on a backend with its own memory a quarter
 * of what it had free when the engine was made, else at most 1 GiB of the
 * host's; either way a cache that serves a repeated prompt. */
LM_TEST(prefix_cache_auto_budget) {
    PC_OPEN_OR_SKIP(pm, "llama");
    size_t free_b = 0, total_b = 0;
    lm_backend_mem_info(pm.be, &free_b, &total_b);
    lm_engine_opts o = { .ctx = 128, .parallel = 1, .cache_ram = LM_CACHE_RAM_AUTO };
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, pm.m, &o, NULL) == 0);
    const size_t got = lm_engine_cache_ram(en);
    if (total_b > 0) /* the device's free memory, read again by the engine before it allocates */
        LM_CHECK_MSG(got == free_b / 4, "%zu against %zu free", got, free_b);
    else
        LM_CHECK_MSG(got > 0 && got <= (size_t)1 << 30, "%zu", got);
    int32_t a[40];
    pc_tokens(a, 40, 5, pm.m->cfg.vocab);
    pc_collect c1, c2;
    LM_REQUIRE(pc_run(en, a, 40, 2, &c1) == 0 && pc_run(en, a, 40, 2, &c2) == 0);
    LM_CHECK_MSG(c2.n_cached == 32, "cached %d", c2.n_cached); /* its two full blocks */
    pc_destroy(&c1);
    pc_destroy(&c2);
    lm_engine_free(en);
    pc_close(&pm);
}

/* A hybrid prompt that departs from a long earlier one after position 1060
 * resumes from the periodic checkpoint at 1024 (not from nothing) and still
 * gives the cold run's tokens; the 32 shared tokens past the checkpoint are
 * a STATE miss (their KV is cached, the state there is not). */
LM_TEST(prefix_cache_periodic_checkpoint_demo) {
    PC_OPEN_OR_SKIP(pm, "demo");
    int V = pm.m->cfg.vocab;
    enum { NA = 1100, NB = 1080, SHARED = 1060 };
    int32_t *a = malloc(NA * sizeof *a), *b = malloc(NB * sizeof *b), want_b[4];
    pc_tokens(a, NA, 21, V);
    memcpy(b, a, SHARED * sizeof *b);
    pc_tokens(b + SHARED, NB - SHARED, 22, V);
    b[SHARED] = pc_other(a[SHARED], V);
    LM_REQUIRE(lm_tu_greedy_alone(pm.m, b, NB, 4, want_b) == 0);
    lm_engine_opts o = { .ctx = 2048, .parallel = 1, .cache_ram = 64u << 20 };
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, pm.m, &o, NULL) == 0);
    pc_collect ga, gb;
    LM_REQUIRE(pc_run(en, a, NA, 4, &ga) == 0 && pc_run(en, b, NB, 4, &gb) == 0);
    LM_CHECK(gb.n == 4 && memcmp(gb.toks, want_b, sizeof want_b) == 0);
    LM_CHECK_MSG(gb.n_cached == 1024 && gb.tr.diverge_pos == SHARED && gb.tr.miss == LM_MISS_STATE,
                 "cached %d diverge %d miss %d", gb.n_cached, gb.tr.diverge_pos, gb.tr.miss);
    lm_engine_stats st;
    pc_wait_idle(en, &st);
    LM_CHECK(st.kv_blocks_free + st.cache_blocks == st.kv_blocks_total);
    pc_destroy(&ga);
    pc_destroy(&gb);
    lm_engine_free(en);
    free(a);
    free(b);
    pc_close(&pm);
}

/* Requests sharing a 48-token prefix, submitted at once after a first one
 * cached it, each give their tokens alone (hits inside a batched step). */
static void pc_concurrent(lm_test_ctx *lm_t_, const char *name) {
    PC_OPEN_OR_SKIP(pm, name);
    enum { N = 4 };
    int V = pm.m->cfg.vocab, lens[N] = { 50, 64, 81, 49 };
    int32_t ids[N][96], want[N][8];
    pc_tokens(ids[0], 48, 21, V);
    for (int i = 0; i < N; i++) {
        memcpy(ids[i], ids[0], 48 * sizeof(int32_t));
        pc_tokens(ids[i] + 48, lens[i] - 48, 30 + (uint32_t)i, V);
        LM_REQUIRE(lm_tu_greedy_alone(pm.m, ids[i], lens[i], 8, want[i]) == 0);
    }
    lm_engine_opts o = { .ctx = 128, .parallel = N + 1, .step_tokens = 20, .cache_ram = 16u << 20 };
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, pm.m, &o, NULL) == 0);
    pc_collect first, c[N], hold;
    LM_REQUIRE(pc_run(en, ids[0], lens[0], 8, &first) == 0);
    LM_CHECK(first.n == 8 && memcmp(first.toks, want[0], sizeof want[0]) == 0);
    /* a one-token request holds the engine thread in its callback while the
     * N are submitted, so they are admitted together (submitting them to a
     * running engine raced: under load one could finish before the last came) */
    int32_t x[4];
    pc_tokens(x, 4, 29, V);
    pc_init(&hold);
    hold.stall_at[0] = 1;
    lm_request *rx, *r[N];
    lm_gen_params p = pc_greedy(8), px = pc_greedy(1);
    LM_REQUIRE(lm_engine_submit(en, x, 4, &px, pc_on_token, &hold, &rx, NULL) == LM_ENGINE_OK);
    pthread_mutex_lock(&hold.mu);
    while (!hold.stalled[0]) pthread_cond_wait(&hold.cv, &hold.mu);
    pthread_mutex_unlock(&hold.mu);
    for (int i = 0; i < N; i++) {
        pc_init(&c[i]);
        LM_REQUIRE(lm_engine_submit(en, ids[i], lens[i], &p, pc_on_token, &c[i], &r[i], NULL) == LM_ENGINE_OK);
    }
    pthread_mutex_lock(&hold.mu);
    hold.go[0] = true;
    pthread_cond_broadcast(&hold.cv);
    pthread_mutex_unlock(&hold.mu);
    pc_wait(&hold);
    lm_request_release(rx);
    pc_destroy(&hold);
    for (int i = 0; i < N; i++) {
        pc_wait(&c[i]);
        LM_CHECK_MSG(c[i].n == 8 && memcmp(c[i].toks, want[i], sizeof want[i]) == 0, "request %d differs", i);
        LM_CHECK_MSG(c[i].n_cached >= 48 || (pm.stateful && c[i].n_cached >= 32), "request %d: %d cached", i,
                     c[i].n_cached);
        lm_request_release(r[i]);
        pc_destroy(&c[i]);
    }
    lm_engine_stats st;
    pc_wait_idle(en, &st);
    LM_CHECK(st.kv_blocks_free + st.cache_blocks == st.kv_blocks_total);
    LM_CHECK(st.batch_hist[2] > 0); /* steps with 4 sequences */
    pc_destroy(&first);
    lm_engine_free(en);
    pc_close(&pm);
}

LM_TEST(prefix_cache_concurrent_hits_qwen3) { pc_concurrent(lm_t_, "qwen3"); }
LM_TEST(prefix_cache_concurrent_hits_qwen3_next) { pc_concurrent(lm_t_, "qwen3-next"); }

/* A request that hit the cache is cancelled in the middle of its prefill: the
 * engine is held inside another request's token callback while that happens,
 * so the cancel lands between two of its prefill chunks. Every block is then
 * free or cache-held, and the cache still serves the prompt exactly. */
static void pc_cancel(lm_test_ctx *lm_t_, const char *name) {
    PC_OPEN_OR_SKIP(pm, name);
    int V = pm.m->cfg.vocab;
    int32_t a[100], b[400], x[4], want_b[4];
    pc_tokens(a, 100, 41, V);
    memcpy(b, a, 100 * sizeof(int32_t));
    pc_tokens(b + 100, 300, 42, V);
    pc_tokens(x, 4, 43, V);
    LM_REQUIRE(lm_tu_greedy_alone(pm.m, b, 400, 4, want_b) == 0);
    lm_engine_opts o = { .ctx = 512, .parallel = 2, .step_tokens = 8, .cache_ram = 16u << 20 };
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, pm.m, &o, NULL) == 0);
    pc_collect ga, gx, gb;
    LM_REQUIRE(pc_run(en, a, 100, 4, &ga) == 0);
    /* x's first token holds the engine thread while b is submitted, so b is
     * admitted (a hit on a's 96 tokens) at the next step, beside x's decode;
     * x's third token holds it again two steps later, with b a couple of
     * 7-token chunks into its remaining 304, and b is cancelled there. */
    pc_init(&gx);
    pc_init(&gb);
    gx.stall_at[0] = 1;
    gx.stall_at[1] = 3;
    lm_request *rx, *rb;
    lm_gen_params px = pc_greedy(64), pb = pc_greedy(4);
    LM_REQUIRE(lm_engine_submit(en, x, 4, &px, pc_on_token, &gx, &rx, NULL) == LM_ENGINE_OK);
    pthread_mutex_lock(&gx.mu);
    while (!gx.stalled[0]) pthread_cond_wait(&gx.cv, &gx.mu);
    pthread_mutex_unlock(&gx.mu);
    LM_REQUIRE(lm_engine_submit(en, b, 400, &pb, pc_on_token, &gb, &rb, NULL) == LM_ENGINE_OK);
    pthread_mutex_lock(&gx.mu);
    gx.go[0] = true;
    pthread_cond_broadcast(&gx.cv);
    while (!gx.stalled[1]) pthread_cond_wait(&gx.cv, &gx.mu);
    pthread_mutex_unlock(&gx.mu);
    lm_request_cancel(rb);
    pthread_mutex_lock(&gx.mu);
    gx.go[1] = true;
    pthread_cond_broadcast(&gx.cv);
    pthread_mutex_unlock(&gx.mu);
    pc_wait(&gb);
    LM_CHECK_MSG(gb.finish == LM_FINISH_CANCELLED && gb.n == 0 && gb.n_cached > 0, "finish %d, %d tokens, %d cached",
                 gb.finish, gb.n, gb.n_cached);
    lm_request_release(rx);
    lm_request_release(rb);
    lm_engine_stats st;
    pc_wait_idle(en, &st);
    LM_CHECK(st.running == 0 && st.kv_blocks_free + st.cache_blocks == st.kv_blocks_total);
    /* the cache is still whole and right */
    pc_collect again;
    LM_REQUIRE(pc_run(en, b, 400, 4, &again) == 0);
    LM_CHECK(again.n == 4 && memcmp(again.toks, want_b, sizeof want_b) == 0 && again.n_cached >= gb.n_cached);
    pc_wait_idle(en, &st);
    LM_CHECK(st.kv_blocks_free + st.cache_blocks == st.kv_blocks_total);
    pc_destroy(&ga);
    pc_destroy(&gx);
    pc_destroy(&gb);
    pc_destroy(&again);
    lm_engine_free(en);
    pc_close(&pm);
}

LM_TEST(prefix_cache_cancel_mid_prefill_llama) { pc_cancel(lm_t_, "llama"); }
LM_TEST(prefix_cache_cancel_mid_prefill_qwen35) { pc_cancel(lm_t_, "qwen3.5"); }

/* ---- the cache's bookkeeping alone ---- */

/* Random sequences drawn from a few families of prompts (so that they share
 * prefixes and diverge mid-block) go through lookup, share, copy-on-write,
 * insert, checkpoint and release on a small pool with a budget of 12 blocks
 * and 3 checkpoints. Every row of K holds its token id, so a hit whose rows
 * differ from the prompt's tokens shows; the invariants hold after each
 * request, and at the end every block is free or held by the cache. */
LM_TEST(prefix_cache_bookkeeping_random) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(1, LM_ISA_AUTO, &e);
    LM_REQUIRE(be != NULL);
    enum { BS = 16, W = 4, NB = 40, MAXT = 96 };
    int64_t sfl[1] = { 8 };
    lm_state_spec spec = { 1, sfl, 1 + 3 };
    lm_kv_cache *kv = NULL;
    LM_REQUIRE(lm_kv_cache_create(&kv, be, 1, W, BS, NB, &spec, &e) == 0);
    size_t bb = lm_kv_block_bytes(kv), sb = lm_kv_state_bytes(kv);
    lm_prefix_cache *pc = lm_pcache_create(kv, 12 * bb + 3 * sb, 3, 1234);
    LM_REQUIRE(pc != NULL);
    int32_t fam[3][MAXT];
    for (int f = 0; f < 3; f++) pc_tokens(fam[f], MAXT, 100 + (uint32_t)f, 50);
    uint32_t rng = 1;
    int32_t blocks[MAXT / BS + 1];
    uint64_t hashes[MAXT / BS + 1];
    int hits = 0, cows = 0;
    for (int it = 0; it < 400; it++) {
        rng = rng * 1103515245u + 12345u;
        int f = (int)(rng >> 8) % 3, n = 2 + (int)((rng >> 12) % (MAXT - 2));
        int32_t toks[MAXT];
        memcpy(toks, fam[f], sizeof toks);
        if ((rng >> 20) % 2) toks[(rng >> 22) % (uint32_t)n] += 1; /* a divergence somewhere */
        bool stateful = (rng >> 28) % 2;
        for (int i = 0; i < n / BS; i++) hashes[i] = lm_pcache_hash(i ? hashes[i - 1] : lm_pcache_seed(pc), toks + i * BS, BS);
        lm_pcache_hit hit;
        lm_pcache_lookup(pc, toks, n, hashes, stateful, &hit, blocks);
        LM_CHECK(hit.n_tokens < n && hit.n_blocks * BS <= hit.n_tokens);
        if (stateful) LM_CHECK(hit.n_tokens % BS == 0 && (hit.n_tokens == 0) == (hit.ckpt < 0));
        int need = (n + BS - 1) / BS - hit.n_blocks;
        if (kv->n_free < need) LM_CHECK(lm_pcache_make_room(pc, need));
        lm_kv_seq seq = { 0 };
        lm_kv_seq_share(kv, &seq, blocks, hit.n_blocks);
        LM_REQUIRE(lm_kv_seq_reserve(kv, &seq, n, NULL) == 0);
        if (hit.cow_block >= 0) {
            lm_kv_block_copy_rows(kv, seq.blocks[hit.n_blocks], hit.cow_block, hit.n_tokens % BS);
            cows++;
        }
        lm_pcache_unpin(pc);
        hits += hit.n_tokens > 0;
        /* the restored rows hold the prompt's tokens */
        for (int p = 0; p < hit.n_tokens; p++) {
            float row[W];
            be->ops->read(be, row, (float *)kv->pool.k[0] + ((size_t)seq.blocks[p / BS] * BS + (size_t)(p % BS)) * W, sizeof row);
            if (row[0] != (float)toks[p]) {
                LM_CHECK_MSG(false, "iteration %d: row %d holds %g, want %d", it, p, row[0], toks[p]);
                break;
            }
        }
        /* "compute" the rest: write each row's token id */
        for (int p = hit.n_tokens; p < n; p++) {
            float row[W] = { (float)toks[p], 0, 0, 0 };
            be->ops->write(be, (float *)kv->pool.k[0] + ((size_t)seq.blocks[p / BS] * BS + (size_t)(p % BS)) * W, row, sizeof row);
        }
        for (int i = 0; i < n / BS; i++) {
            if (lm_pcache_insert(pc, hashes[i], i ? hashes[i - 1] : lm_pcache_seed(pc), toks + i * BS, seq.blocks[i]))
                break;
            if (stateful && (i == n / BS - 1 || i % 2 == 1)) {
                int32_t s = lm_kv_state_acquire(kv);
                LM_CHECK(lm_pcache_checkpoint(pc, hashes[i], s) >= 0);
                lm_kv_state_release(kv, s);
            }
        }
        lm_kv_seq_release(kv, &seq);
        LM_CHECK_MSG(lm_pcache_check(pc) == 0, "iteration %d: invariants broken", it);
        lm_pcache_stats ps;
        lm_pcache_get_stats(pc, &ps);
        LM_CHECK(kv->n_free + ps.blocks == NB && ps.blocks <= 12 && ps.checkpoints <= 3);
        if (lm_t_->failed) break;
    }
    LM_CHECK(hits > 50 && cows > 10);
    lm_pcache_free(pc);
    LM_CHECK(kv->n_free == NB && kv->n_free_slots == 4);
    lm_kv_cache_free(kv);
    lm_backend_destroy(be);
}
