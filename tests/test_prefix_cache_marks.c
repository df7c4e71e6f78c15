/* test_prefix_cache_marks.c - a hybrid model reuses all but a few tokens of
 * a prompt that departs from a cached one, when the caller marked where the
 * chat messages end (lm_gen_params.prompt_marks).
 *
 * A hybrid's recurrent state exists only where it was checkpointed. The
 * cached prompt A (300 tokens, messages ending at 40, 130, 200 and 296)
 * is checkpointed at the block end below each message end and every 64
 * tokens inside its last message (200-296); without the marks its only
 * checkpoint is at 288. A prompt departing inside A's last message (at
 * 261) resumes at 256, one departing at a message boundary (130) at 128:
 * fewer than 64 tokens recomputed, and exactly the tokens of a cold run
 * (greedy). The same after a restart, the checkpoints read from the disk
 * tier. Runs on the demo and the qwen3.5 and qwen3-next fixtures. And the
 * checkpoints share the byte budget with the blocks. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_engine.h"
#include "lm_test.h"
#include "test_util.h"

#define MK_N 300
#define MK_GEN 6

static const int32_t mk_marks[] = { 40, 130, 200, 296 };

/* One greedy request with the first n_marks of mk_marks, to its end. */
static int mk_generate(lm_engine *en, const int32_t *ids, int n, int n_marks, lm_tu_collect *c) {
    lm_tu_collect_init(c);
    lm_gen_params p = { 0 };
    p.sampling.top_p = 1;
    p.repetition_penalty = 1;
    p.max_tokens = MK_GEN;
    p.prompt_marks = mk_marks;
    p.n_prompt_marks = n_marks;
    lm_request *r = NULL;
    int rc = lm_engine_submit(en, ids, n, &p, lm_tu_collect_on_token, c, &r, NULL) == LM_ENGINE_OK ? 0 : -1;
    if (!rc) {
        lm_tu_collect_wait(c);
        lm_request_release(r);
    }
    lm_tu_collect_destroy(c);
    return rc;
}

typedef struct mk_fix {
    lm_backend *be;
    lm_model *m;
    int32_t a[MK_N], in_last[MK_N], at_bound[MK_N];
    int32_t cold_in[MK_GEN], cold_at[MK_GEN];
} mk_fix;

static void mk_tokens(int32_t *out, int n, uint32_t s, int V) {
    for (int i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        out[i] = 3 + (int32_t)((s >> 8) % (uint32_t)(V - 3));
    }
}

/* name: a fixture model, or "demo"; false (why filled) when missing. */
static bool mk_open(mk_fix *f, const char *name, char *why, size_t n_why) {
    memset(f, 0, sizeof *f);
    if (!lm_tu_load_named(name, &f->be, &f->m, why, n_why)) return false;
    int V = f->m->cfg.vocab;
    mk_tokens(f->a, MK_N, 5, V);
    /* departs inside the last message, at 261; at the boundary 130 */
    memcpy(f->in_last, f->a, sizeof f->a);
    mk_tokens(f->in_last + 261, MK_N - 261, 6, V);
    f->in_last[261] = f->a[261] + 1 < V ? f->a[261] + 1 : 3;
    memcpy(f->at_bound, f->a, sizeof f->a);
    mk_tokens(f->at_bound + 130, MK_N - 130, 7, V);
    f->at_bound[130] = f->a[130] + 1 < V ? f->a[130] + 1 : 3;
    return lm_tu_greedy_alone(f->m, f->in_last, MK_N, MK_GEN, f->cold_in) == 0 &&
           lm_tu_greedy_alone(f->m, f->at_bound, MK_N, MK_GEN, f->cold_at) == 0;
}

static void mk_close(mk_fix *f) {
    lm_model_free(f->m);
    lm_backend_destroy(f->be);
}

#define MK_OPEN_OR_SKIP(f, name)                   \
    mk_fix f;                                      \
    do {                                           \
        char why_[600] = "";                       \
        if (!mk_open(&f, name, why_, sizeof why_)) { \
            mk_close(&f);                          \
            LM_SKIP("%s", why_);                   \
        }                                          \
    } while (0)

static lm_engine *mk_engine(lm_test_ctx *lm_t_, mk_fix *f, const char *cache_dir) {
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 512, .parallel = 1, .step_tokens = 128, .cache_ram = 32u << 20,
                         .cache_dir = cache_dir, .cache_disk = cache_dir ? 64u << 20 : 0 };
    LM_CHECK_MSG(lm_engine_create(&en, f->m, &o, &e) == 0, "%s", e.msg);
    return en;
}

/* r served `want` cached tokens (from disk when disk) and the cold tokens. */
static void mk_expect(lm_test_ctx *lm_t_, const char *name, const char *what, const lm_tu_collect *r, int want,
                      const int32_t *cold, bool disk) {
    LM_CHECK_MSG(r->n == MK_GEN && memcmp(r->toks, cold, MK_GEN * sizeof(int32_t)) == 0,
                 "%s, %s: the tokens differ from a cold run", name, what);
    LM_CHECK_MSG(r->n_cached == want && r->n_shared - r->n_cached < 64, "%s, %s: %d cached of %d shared (want %d)", name,
                 what, r->n_cached, r->n_shared, want);
    if (disk) LM_CHECK_MSG(r->n_cached_disk == want, "%s, %s: %d from disk", name, what, r->n_cached_disk);
}

/* In RAM: A, then each departing prompt (each after A again, so that the
 * second does not hit the first's checkpoints). */
static void mk_ram(lm_test_ctx *lm_t_, const char *name) {
    MK_OPEN_OR_SKIP(f, name);
    lm_engine *en = mk_engine(lm_t_, &f, NULL);
    LM_REQUIRE(en);
    lm_tu_collect r;
    LM_REQUIRE(mk_generate(en, f.a, MK_N, 4, &r) == 0);
    LM_CHECK(r.n_cached == 0);
    LM_REQUIRE(mk_generate(en, f.in_last, MK_N, 4, &r) == 0);
    mk_expect(lm_t_, name, "inside the last message", &r, 256, f.cold_in, false);
    LM_REQUIRE(mk_generate(en, f.at_bound, MK_N, 2, &r) == 0);
    mk_expect(lm_t_, name, "at a message boundary", &r, 128, f.cold_at, false);
    lm_engine_stats st;
    lm_engine_get_stats(en, &st);
    LM_CHECK_MSG(st.cache_checkpoints >= 4, "%d checkpoints", st.cache_checkpoints);
    lm_engine_free(en);
    mk_close(&f);
}

/* Across restarts: A fills the disk; each departing prompt goes to a new
 * engine on the same directory, so RAM holds nothing of A. */
static void mk_disk(lm_test_ctx *lm_t_, const char *name, const char *tag) {
    MK_OPEN_OR_SKIP(f, name);
    char *dir = lm_tu_mkdir(tag);
    lm_engine *en = mk_engine(lm_t_, &f, dir);
    LM_REQUIRE(en);
    lm_tu_collect r;
    LM_CHECK(mk_generate(en, f.a, MK_N, 4, &r) == 0 && r.n_cached == 0);
    lm_engine_free(en); /* writes what is queued */
    en = mk_engine(lm_t_, &f, dir);
    LM_REQUIRE(en);
    LM_CHECK(mk_generate(en, f.in_last, MK_N, 4, &r) == 0);
    mk_expect(lm_t_, name, "inside the last message, after a restart", &r, 256, f.cold_in, true);
    lm_engine_free(en);
    en = mk_engine(lm_t_, &f, dir);
    LM_REQUIRE(en);
    LM_CHECK(mk_generate(en, f.at_bound, MK_N, 2, &r) == 0);
    mk_expect(lm_t_, name, "at a message boundary, after a restart", &r, 128, f.cold_at, true);
    lm_engine_free(en);
    free(dir);
    mk_close(&f);
}

LM_TEST(prefix_cache_marks_exact_demo) { mk_ram(lm_t_, "demo"); }
LM_TEST(prefix_cache_marks_exact_qwen35) { mk_ram(lm_t_, "qwen3.5"); }
LM_TEST(prefix_cache_marks_exact_qwen3_next) { mk_ram(lm_t_, "qwen3-next"); }
LM_TEST(disk_cache_marks_restart_exact_demo) { mk_disk(lm_t_, "demo", "mk_demo"); }
LM_TEST(disk_cache_marks_restart_exact_qwen35) { mk_disk(lm_t_, "qwen3.5", "mk_qwen35"); }
LM_TEST(disk_cache_marks_restart_exact_qwen3_next) { mk_disk(lm_t_, "qwen3-next", "mk_qwen3_next"); }

/* Checkpoints share the byte budget with blocks: with room for a fraction
 * of A's blocks and checkpoints, the cache stays within --cache-ram (the
 * oldest blocks and checkpoints go), and answers stay exact. */
LM_TEST(prefix_cache_marks_within_budget_demo) {
    MK_OPEN_OR_SKIP(f, "demo");
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    const size_t budget = 1u << 20; /* a checkpoint of the demo is ~420 KiB, a block 32 KiB */
    lm_engine_opts o = { .ctx = 512, .parallel = 1, .step_tokens = 128, .cache_ram = budget };
    LM_REQUIRE(lm_engine_create(&en, f.m, &o, &e) == 0);
    lm_tu_collect r;
    LM_REQUIRE(mk_generate(en, f.a, MK_N, 4, &r) == 0);
    LM_REQUIRE(mk_generate(en, f.in_last, MK_N, 4, &r) == 0);
    LM_CHECK_MSG(r.n == MK_GEN && memcmp(r.toks, f.cold_in, sizeof f.cold_in) == 0, "tokens differ from a cold run");
    lm_engine_stats st;
    lm_engine_get_stats(en, &st);
    /* counted here from the model's shapes, not from the cache's own sum */
    int64_t fl[64];
    size_t sb = 0, bb = (size_t)2 * (size_t)f.m->n_kv_layers * 16 * (size_t)f.m->kv_width * sizeof(float);
    for (int i = 0, ns = lm_model_state_spec(f.m, fl, 64); i < ns; i++) sb += (size_t)fl[i] * sizeof(float);
    size_t held = (size_t)st.cache_blocks * bb + (size_t)st.cache_checkpoints * sb;
    LM_CHECK_MSG(held <= budget && st.cache_checkpoints >= 1 && st.cache_evicted_blocks > 0,
                 "%d blocks and %d checkpoints: %zu bytes of %zu, %llu evicted", st.cache_blocks,
                 st.cache_checkpoints, held, budget, (unsigned long long)st.cache_evicted_blocks);
    lm_engine_free(en);
    mk_close(&f);
}
