/* test_engine_spec.c - speculative decoding (lm_spec.h) never changes what a
 * request gets: greedy tokens and finish reasons equal plain decoding's
 * with each proposer, alone and beside requests that do not speculate, with
 * limits, stop tokens, a waiting request and a prefix-cache hit; drafts are
 * rejected at every position along the way; a seeded sampled request gives
 * the same tokens; and sampled tokens keep their distribution (chi-square
 * over many seeds, different seeds on the two sides). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_engine.h"
#include "engine/lm_spec.h"
#include "model/lm_arch.h"
#include "lm_test.h"
#include "test_util.h"

#define SP_N 6
#define SP_MAX 48

typedef struct sp_result {
    int32_t toks[SP_N][SP_MAX];
    int n[SP_N];
    lm_finish finish[SP_N];
    lm_engine_stats st;
} sp_result;

/* The oracle proposer: the plain run's answer of the request whose prompt
 * has this length, with one token changed at a position that cycles
 * through 0 .. max (max: nothing changed), so that every position is
 * rejected and everything is accepted now and then. */
typedef struct oracle {
    const sp_result *ref;
    int n_prompt[SP_N];
    int calls;
} oracle;

static int oracle_propose(void *user, const int32_t *tokens, int n_tokens, int n_prompt, int32_t *draft, int max) {
    (void)tokens;
    oracle *o = user;
    int i = 0;
    while (i < SP_N && o->n_prompt[i] != n_prompt) i++;
    if (i == SP_N) return 0;
    int g = n_tokens - n_prompt, k = LM_MIN(max, o->ref->n[i] - g);
    if (k <= 0) return 0;
    memcpy(draft, o->ref->toks[i] + g, (size_t)k * sizeof *draft);
    int bad = o->calls++ % (max + 1);
    if (bad < k) draft[bad] ^= 1;
    return k;
}

typedef struct sp_opts {
    lm_spec_mode mode;
    int draft;
    bool fixed;
    bool mixed;      /* requests 1 and 3 opt out (no_spec) */
    bool replay;     /* lm_engine_opts.spec_replay */
    bool ahead;      /* lm_engine_opts.look_ahead on (else the default: off on the CPU) */
    oracle *orc;
    const char *draft_model; /* LM_SPEC_DRAFT's model */
} sp_opts;

/* SP_N greedy requests through one engine (a prefix cache, 4 at a time, so
 * the fifth waits): limits 1, 2, 3, 17, 40, 40, stop tokens as given
 * (stops[i] < 0: none); the sixth, submitted after the rest are done,
 * repeats request 4's prompt and answer and goes on (a prefix-cache hit on
 * what request 4 generated, on a hybrid its state checkpoint). The prompt
 * is the model's reference prompt twice, so that lookup finds n-grams. */
static void sp_run(lm_test_ctx *lm_t_, lm_model *m, const sp_opts *so, const int32_t *prompt, int n_prompt,
                   const int32_t stops[SP_N], sp_result *out) {
    static const int max_tokens[SP_N] = { 1, 2, 3, 17, 40, 40 };
    memset(out, 0, sizeof *out);
    lm_err e = { { 0 } };
    lm_engine *en = NULL;
    lm_engine_opts o = { .ctx = 320, .parallel = 4, .step_tokens = 64, .cache_ram = (size_t)64 << 20,
                         .spec = so->mode, .spec_draft = so->draft, .spec_fixed = so->fixed,
                         .spec_replay = so->replay, .spec_cb = so->orc ? oracle_propose : NULL, .spec_user = so->orc,
                         .spec_model = so->draft_model,
                         .look_ahead = so->ahead ? 1 : 0 };
    if (!(lm_engine_create(&en, m, &o, &e) == 0)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return;
    }
    lm_tu_collect c[SP_N];
    lm_request *r[SP_N] = { 0 };
    int32_t again[320];
    for (int i = 0; i < SP_N; i++) {
        lm_tu_collect_init(&c[i]);
        lm_gen_params p = { .sampling = { .top_p = 1 }, .repetition_penalty = 1, .max_tokens = max_tokens[i] };
        p.stop_tokens = &stops[i];
        p.n_stop_tokens = stops[i] >= 0;
        p.no_spec = so->mixed && (i == 1 || i == 3);
        const int32_t *ids = prompt + i;
        int n = n_prompt - 8 - i;
        if (i == SP_N - 1) {
            for (int k = 0; k < SP_N - 1; k++) lm_tu_collect_wait(&c[k]);
            n = 0;
            for (int k = 0; k < n_prompt - 8 - 4; k++) again[n++] = prompt[4 + k];
            for (int k = 0; k < c[4].n; k++) again[n++] = c[4].toks[k];
            for (int k = 0; k < 5; k++) again[n++] = prompt[k];
            ids = again;
        }
        if (so->orc) so->orc->n_prompt[i] = n;
        LM_REQUIRE(lm_engine_submit(en, ids, n, &p, lm_tu_collect_on_token, &c[i], &r[i], &e) == LM_ENGINE_OK);
    }
    for (int i = 0; i < SP_N; i++) {
        lm_tu_collect_wait(&c[i]);
        out->n[i] = c[i].n;
        memcpy(out->toks[i], c[i].toks, (size_t)c[i].n * sizeof(int32_t));
        out->finish[i] = c[i].finish;
        lm_request_release(r[i]);
        lm_tu_collect_destroy(&c[i]);
    }
    lm_tu_engine_settled(en, &out->st);
    LM_CHECK(out->st.kv_blocks_free == out->st.kv_blocks_total - out->st.cache_blocks);
    lm_engine_free(en);
}

static void sp_same(lm_test_ctx *lm_t_, const char *what, const sp_result *off, const sp_result *on) {
    for (int i = 0; i < SP_N; i++) {
        LM_CHECK_MSG(off->n[i] == on->n[i] && memcmp(off->toks[i], on->toks[i], (size_t)on->n[i] * sizeof(int32_t)) == 0,
                     "%s, request %d: %d tokens with speculation, %d without, or they differ", what, i, on->n[i],
                     off->n[i]);
        LM_CHECK_MSG(off->finish[i] == on->finish[i], "%s, request %d: finish %d vs %d", what, i, on->finish[i],
                     off->finish[i]);
    }
}

static void sp_print(const char *dir, const char *what, const lm_engine_stats *s) {
    printf("  %s %s: %llu verifies, %llu drafted, %llu accepted, %llu replayed, accepted by position:", dir, what,
           (unsigned long long)s->spec_verifies, (unsigned long long)s->spec_drafted,
           (unsigned long long)s->spec_accepted, (unsigned long long)s->spec_replayed);
    for (int i = 0; i < 4; i++)
        printf(" %llu/%llu", (unsigned long long)s->spec_pos_accepted[i], (unsigned long long)s->spec_pos_drafted[i]);
    printf("\n");
}

static bool load_prompt(lm_test_ctx *lm_t_, const char *dir, int32_t *prompt, int *n_prompt) {
    lm_err e = { { 0 } };
    const int n = lm_tu_ref_ids(dir, "prompt1.ids", prompt, 48, &e);
    const bool ok = n >= 40;
    LM_CHECK_MSG(ok, "%d ids: %s", n, e.msg);
    if (ok) { /* twice: lookup finds the second copy's n-grams in the first */
        memcpy(prompt + n, prompt, (size_t)n * sizeof(int32_t));
        *n_prompt = 2 * n;
    }
    return ok;
}

/* The model in dir on the test backend with this many threads; false (the
 * failure counted, nothing left to free) when the backend or the model
 * does not come up. */
static bool sp_load(lm_test_ctx *lm_t_, const char *dir, int threads, lm_backend **be, lm_model **m) {
    lm_err e = { { 0 } };
    *m = NULL;
    *be = lm_tu_model_backend(threads, &e);
    LM_CHECK_MSG(*be != NULL, "%s", e.msg);
    if (!*be) return false;
    if (lm_model_load(m, dir, *be, &e) == 0) return true;
    LM_CHECK_MSG(0, "%s", e.msg);
    lm_backend_destroy(*be);
    return false;
}

/* A separate draft model against plain decoding: the model itself as its
 * own draft (each guess is the model's next token unless batch shapes
 * round a near tie the other way: nearly all accepted, the draft's cache
 * kept in step), and, where given, another architecture with the same
 * tokenizer (guesses rejected at every position, so the draft's own
 * rollback runs: rows rewritten, or its recurrent state's snapshot), at a
 * fixed depth beside requests that opt out and adaptive. */
static void spec_draft_model(lm_test_ctx *lm_t_, lm_model *m, const char *dir, const char *other,
                             const int32_t *prompt, int n_prompt, const int32_t *stops, const sp_result *off,
                             sp_result *on) {
    sp_opts self = { .mode = LM_SPEC_DRAFT, .draft = 3, .fixed = true, .draft_model = dir };
    sp_run(lm_t_, m, &self, prompt, n_prompt, stops, on);
    sp_same(lm_t_, "draft model (itself)", off, on);
    sp_print(dir, "draft model (itself)", &on->st);
    LM_CHECK_MSG(on->st.spec_verifies > 0 && on->st.spec_accepted * 10 >= on->st.spec_drafted * 9,
                 "itself as its draft: %llu of %llu guesses accepted", (unsigned long long)on->st.spec_accepted,
                 (unsigned long long)on->st.spec_drafted);
    LM_CHECK(on->st.spec_model_tokens > 0);
    if (!other) return;
    sp_opts od = { .mode = LM_SPEC_DRAFT, .draft = 3, .fixed = true, .mixed = true, .draft_model = other };
    sp_run(lm_t_, m, &od, prompt, n_prompt, stops, on);
    sp_same(lm_t_, "another draft model, mixed", off, on);
    sp_print(other, "as the draft, mixed", &on->st);
    LM_CHECK_MSG(on->st.spec_verifies > 0 && on->st.spec_accepted < on->st.spec_drafted,
                 "another draft: %llu of %llu guesses accepted", (unsigned long long)on->st.spec_accepted,
                 (unsigned long long)on->st.spec_drafted);
    sp_opts ad = { .mode = LM_SPEC_DRAFT, .draft_model = other };
    sp_run(lm_t_, m, &ad, prompt, n_prompt, stops, on);
    sp_same(lm_t_, "another draft model, adaptive", off, on);
    if (lm_model_look_ahead(m)) { /* plain steps queued ahead while no sequence would draft */
        sp_opts la = { .mode = LM_SPEC_DRAFT, .ahead = true, .draft_model = other };
        sp_run(lm_t_, m, &la, prompt, n_prompt, stops, on);
        sp_same(lm_t_, "another draft model, adaptive, look-ahead", off, on);
        sp_opts las = { .mode = LM_SPEC_DRAFT, .ahead = true, .mixed = true, .draft_model = dir };
        sp_run(lm_t_, m, &las, prompt, n_prompt, stops, on);
        sp_same(lm_t_, "draft model (itself), adaptive beside opt-outs, look-ahead", off, on);
        printf("  %s: itself as the draft with the look-ahead: %llu look-ahead steps, %llu verifies\n", dir,
               (unsigned long long)on->st.ahead_steps, (unsigned long long)on->st.spec_verifies);
    }
}

/* Plain decoding against: lookup (fixed length 4, and adaptive), the
 * oracle with a rejection at every position (fixed length 3, alone and
 * beside requests that opt out; on a model with recurrent state with both
 * rollbacks, the state kept per position where the backend offers it and
 * the copy-and-replay), a draft model (spec_draft_model; other: a second
 * one, or NULL). */
static void spec_same(lm_test_ctx *lm_t_, const char *dir, const char *other) {
    lm_backend *be = NULL;
    lm_model *m = NULL;
    if (!sp_load(lm_t_, dir, 2, &be, &m)) return;
    lm_err e = { { 0 } };
    int32_t prompt[96];
    int n_prompt = 0;
    if (!load_prompt(lm_t_, dir, prompt, &n_prompt)) goto done;
    int32_t none[SP_N] = { -1, -1, -1, -1, -1, -1 }, stops[SP_N] = { -1, -1, -1, -1, -1, -1 };
    sp_result *probe = malloc(sizeof *probe), *off = malloc(sizeof *off), *on = malloc(sizeof *on);
    sp_opts plain = { .mode = LM_SPEC_OFF };
    sp_run(lm_t_, m, &plain, prompt, n_prompt, none, probe);
    LM_REQUIRE(probe->n[3] == 17 && probe->n[4] == 40);
    stops[3] = probe->toks[3][5]; /* request 3 stops at its first occurrence */
    sp_run(lm_t_, m, &plain, prompt, n_prompt, stops, off);

    sp_opts lookup = { .mode = LM_SPEC_LOOKUP, .draft = 4, .fixed = true };
    sp_run(lm_t_, m, &lookup, prompt, n_prompt, stops, on);
    sp_same(lm_t_, "lookup", off, on);
    sp_print(dir, "lookup", &on->st);
    /* the demo model copies text; a random fixture drafts only where its
     * answer happens to repeat itself */
    if (strstr(dir, "models/demo"))
        LM_CHECK(on->st.spec_verifies > 0 && on->st.spec_accepted * 2 >= on->st.spec_drafted);
    LM_CHECK(on->st.cache_hit_tokens > 0);

    sp_opts adaptive = { .mode = LM_SPEC_LOOKUP };
    sp_run(lm_t_, m, &adaptive, prompt, n_prompt, stops, on);
    sp_same(lm_t_, "lookup adaptive", off, on);

    if (lm_model_look_ahead(m)) {
        /* the look-ahead beside lookup: it queues plain steps while no
         * sequence would draft, and never while every step drafts (fixed) */
        sp_opts la = { .mode = LM_SPEC_LOOKUP, .ahead = true };
        sp_run(lm_t_, m, &la, prompt, n_prompt, stops, on);
        sp_same(lm_t_, "lookup adaptive, look-ahead", off, on);
        LM_CHECK_MSG(on->st.ahead_steps > 0, "%llu look-ahead steps", (unsigned long long)on->st.ahead_steps);
        sp_opts laf = { .mode = LM_SPEC_LOOKUP, .draft = 4, .fixed = true, .ahead = true };
        sp_run(lm_t_, m, &laf, prompt, n_prompt, stops, on);
        sp_same(lm_t_, "lookup fixed, look-ahead", off, on);
        LM_CHECK_MSG(on->st.ahead_steps == 0, "fixed lookup: %llu look-ahead steps",
                     (unsigned long long)on->st.ahead_steps);
        if (strstr(dir, "models/demo")) LM_CHECK(on->st.spec_verifies > 0);
    }

    if (lm_model_draft(m)) { /* the model's MTP head: fixed depth 3, adaptive, and mixed with lookup */
        sp_opts mtp = { .mode = LM_SPEC_MTP, .draft = 3, .fixed = true };
        sp_run(lm_t_, m, &mtp, prompt, n_prompt, stops, on);
        sp_same(lm_t_, "mtp", off, on);
        sp_print(dir, "mtp", &on->st);
        /* the demo's head: about two thirds of first guesses are the model's */
        LM_CHECK(on->st.spec_pos_accepted[0] * 2 > on->st.spec_pos_drafted[0] && on->st.spec_pos_drafted[2] > 0);
        sp_opts mtp_ad = { .mode = LM_SPEC_MTP };
        sp_run(lm_t_, m, &mtp_ad, prompt, n_prompt, stops, on);
        sp_same(lm_t_, "mtp adaptive", off, on);
        if (lm_model_look_ahead(m)) { /* queued steps only while no running sequence has the head on */
            sp_opts mla = { .mode = LM_SPEC_MTP, .mixed = true, .ahead = true };
            sp_run(lm_t_, m, &mla, prompt, n_prompt, stops, on);
            sp_same(lm_t_, "mtp adaptive beside opt-outs, look-ahead", off, on);
            printf("  %s: mtp with the look-ahead: %llu look-ahead steps\n", dir,
                   (unsigned long long)on->st.ahead_steps);
            sp_opts ala = { .mode = LM_SPEC_AUTO, .ahead = true };
            sp_run(lm_t_, m, &ala, prompt, n_prompt, stops, on);
            sp_same(lm_t_, "auto adaptive, look-ahead", off, on);
        }
        sp_opts autom = { .mode = LM_SPEC_AUTO, .draft = 3, .fixed = true, .mixed = true };
        sp_run(lm_t_, m, &autom, prompt, n_prompt, stops, on);
        sp_same(lm_t_, "auto, mixed", off, on);
        sp_print(dir, "auto, mixed", &on->st);
        LM_CHECK(on->st.spec_verifies > 0);
    } else { /* no head: --spec mtp is refused, auto is lookup */
        lm_engine *en = NULL;
        lm_engine_opts o = { .ctx = 128, .spec = LM_SPEC_MTP };
        LM_CHECK(lm_engine_create(&en, m, &o, &e) != 0 && strstr(e.msg, "no MTP head"));
        sp_opts autom = { .mode = LM_SPEC_AUTO, .draft = 3, .fixed = true, .mixed = true };
        sp_run(lm_t_, m, &autom, prompt, n_prompt, stops, on);
        sp_same(lm_t_, "auto, mixed", off, on);
    }

    spec_draft_model(lm_t_, m, dir, other, prompt, n_prompt, stops, off, on);

    const bool per_pos = lm_model_state_out(m); /* a hybrid on the CPU */
    for (int run = 0; run < (per_pos ? 4 : 2); run++) {
        const bool mixed = run & 1, replay = run >= 2;
        oracle orc = { .ref = off };
        sp_opts os = { .mode = LM_SPEC_CALLBACK, .draft = 3, .fixed = true, .mixed = mixed, .replay = replay,
                       .orc = &orc };
        const char *what = mixed ? (replay ? "oracle, mixed, replay" : "oracle, mixed")
                                 : (replay ? "oracle, replay" : "oracle");
        sp_run(lm_t_, m, &os, prompt, n_prompt, stops, on);
        sp_same(lm_t_, what, off, on);
        sp_print(dir, what, &on->st);
        /* a rejection feeds tokens again only where the state is not kept per position */
        if (per_pos) LM_CHECK(replay ? on->st.spec_replayed > 0 : on->st.spec_replayed == 0);
        for (int i = 0; i < 3; i++) /* rejected at every position, accepted at every position */
            LM_CHECK_MSG(on->st.spec_pos_accepted[i] > 0 && on->st.spec_pos_accepted[i] < on->st.spec_pos_drafted[i],
                         "position %d: %llu of %llu accepted", i + 1,
                         (unsigned long long)on->st.spec_pos_accepted[i],
                         (unsigned long long)on->st.spec_pos_drafted[i]);
        LM_CHECK(on->st.spec_verifies > 0 && on->st.steps < off->st.steps);
    }
    free(probe), free(off), free(on);
done:
    lm_model_free(m);
    lm_backend_destroy(be);
}

LM_TEST(engine_spec_same_tokens_demo_hybrid) { spec_same(lm_t_, LUMEN_SOURCE_DIR "/models/demo", NULL); }

/* Fixture name, its other draft (the fixtures share one tokenizer): each
 * kind of draft cache once at least, attention rows, recurrent state, rings. */
static void spec_same_fixture(lm_test_ctx *lm_t_, const char *name, const char *draft) {
    char rel[128], rel2[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    snprintf(rel2, sizeof rel2, "models/%s", draft);
    char *dir = lm_test_fixture_path(rel), *other = lm_test_fixture_path(rel2);
    if (!dir || !other) {
        free(dir), free(other);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    spec_same(lm_t_, dir, other);
    free(dir), free(other);
}

LM_TEST(engine_spec_same_tokens_llama) { spec_same_fixture(lm_t_, "llama", "qwen3.5"); }
LM_TEST(engine_spec_same_tokens_llama3_mqa) { spec_same_fixture(lm_t_, "llama3-rope-mqa", "gemma3"); }
LM_TEST(engine_spec_same_tokens_qwen3) { spec_same_fixture(lm_t_, "qwen3", "llama"); }
LM_TEST(engine_spec_same_tokens_qwen3_moe) { spec_same_fixture(lm_t_, "qwen3-moe", "qwen3"); }
LM_TEST(engine_spec_same_tokens_qwen3_5) { spec_same_fixture(lm_t_, "qwen3.5", "qwen3-next"); }
LM_TEST(engine_spec_same_tokens_qwen3_next) { spec_same_fixture(lm_t_, "qwen3-next", "llama"); }
LM_TEST(engine_spec_same_tokens_gemma3) { spec_same_fixture(lm_t_, "gemma3", "gemma4"); }
LM_TEST(engine_spec_same_tokens_gemma4) { spec_same_fixture(lm_t_, "gemma4", "qwen3.5"); }

/* Memory fitting counts what speculation adds to the caches (the MTP
 * head's K/V pool, spare state slots: per position or snapshots), so that a
 * GPU's budget is checked against what is allocated: on the demo (a hybrid
 * with a head) and a plain transformer, with and without a prefix cache. */
static void fit_case(lm_test_ctx *lm_t_, const char *dir) {
    lm_backend *be = NULL;
    lm_model *m = NULL;
    if (!sp_load(lm_t_, dir, 1, &be, &m)) return;
    lm_err e = { { 0 } };
    static const lm_spec_mode modes[] = { LM_SPEC_OFF, LM_SPEC_LOOKUP, LM_SPEC_MTP, LM_SPEC_AUTO };
    size_t base = 0;
    for (int i = 0; i < 4 * 2 * 2; i++) {
        lm_spec_mode mode = modes[i / 4];
        if (mode == LM_SPEC_MTP && !lm_model_draft(m)) continue;
        lm_engine_opts o = { .ctx = 256, .parallel = 3, .spec = mode, .spec_replay = i & 1,
                             .cache_ram = i & 2 ? (size_t)8 << 20 : 0, .warmup = -1 };
        lm_engine *en = NULL;
        if (!(lm_engine_create(&en, m, &o, &e) == 0)) {
            LM_CHECK_MSG(0, "%s", e.msg);
            continue;
        }
        size_t counted = 0, held = lm_engine_cache_bytes(en, &counted);
        LM_CHECK_MSG(counted == held, "%s, spec %d, replay %d, cache %d: fitting counted %zu bytes, the caches hold %zu",
                     dir, (int)mode, i & 1, (i & 2) != 0, counted, held);
        if (i == 0) base = held;
        else if (mode != LM_SPEC_OFF && !(i & 2) && (lm_model_draft(m) || lm_model_state_out(m)))
            LM_CHECK(held > base); /* the head's pool or spare slots */
        lm_engine_free(en);
    }
    lm_model_free(m);
    lm_backend_destroy(be);
}

LM_TEST(engine_spec_fit_counts_its_memory) {
    fit_case(lm_t_, LUMEN_SOURCE_DIR "/models/demo");
    char *dir = lm_test_fixture_path("models/llama");
    if (dir) fit_case(lm_t_, dir);
    free(dir);
}

/* The lookup proposer: the tokens after the latest earlier occurrence of
 * the longest matching n-gram (4 down to 2), as many as asked and known. */
LM_TEST(engine_spec_lookup_drafts) {
    lm_spec_req q = { 0 };
    int32_t d[8];
    /* 5 6 7 8 9 | 1 2 3 4 | 5 6 7 | 2 3 4 | 5 6: "5 6" last followed by 7 at 10..11 */
    const int32_t t[] = { 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 2, 3, 4, 5, 6 };
    const int n = (int)(sizeof t / sizeof *t);
    int k = lm_lookup_propose(&q, t, n, 64, d, 8);
    /* the 4-gram "3 4 5 6" occurred at 7..10, followed by 7 2 3 4 5 6 */
    LM_CHECK(k == 6 && d[0] == 7 && d[1] == 2 && d[2] == 3 && d[5] == 6);
    LM_CHECK(lm_lookup_propose(&q, t, n, 64, d, 2) == 2 && d[0] == 7 && d[1] == 2);
    /* extend incrementally: "6 1" never occurred, "1" alone is too short: no draft */
    int32_t u[32];
    memcpy(u, t, sizeof t);
    u[n] = 1;
    LM_CHECK(lm_lookup_propose(&q, u, n + 1, 64, d, 8) == 0);
    /* "1 2" occurred at 5..6 (followed by 3 4 5 6 7 ...) */
    u[n + 1] = 2;
    k = lm_lookup_propose(&q, u, n + 2, 64, d, 3);
    LM_CHECK(k == 3 && d[0] == 3 && d[1] == 4 && d[2] == 5);
    /* too short a history: nothing */
    lm_spec_req q2 = { 0 };
    LM_CHECK(lm_lookup_propose(&q2, t, 2, 64, d, 8) == 0);
    lm_spec_req_free(&q);
    lm_spec_req_free(&q2);
}

/* ---- sampled requests ---- */

#define CH_SEEDS 400
#define CH_TOKENS 4

/* One sampled request per seed (temperature 1, top_k 8) through one engine,
 * 8 at a time; the tokens of each into toks[seed][CH_TOKENS]. */
static void sample_run(lm_test_ctx *lm_t_, lm_model *m, lm_spec_mode mode, oracle *orc, const int32_t *prompt,
                       int n_prompt, uint64_t seed0, int32_t (*toks)[CH_TOKENS]) {
    lm_err e = { { 0 } };
    lm_engine *en = NULL;
    lm_engine_opts o = { .ctx = 128, .parallel = 8, .max_queue = CH_SEEDS + 1, .step_tokens = 128, .spec = mode, .spec_draft = 3,
                         .spec_fixed = true, .spec_cb = orc ? oracle_propose : NULL, .spec_user = orc };
    LM_REQUIRE(lm_engine_create(&en, m, &o, &e) == 0);
    lm_tu_collect *c = calloc(CH_SEEDS, sizeof *c);
    lm_request **r = calloc(CH_SEEDS, sizeof *r);
    for (int i = 0; i < CH_SEEDS; i++) {
        lm_tu_collect_init(&c[i]);
        lm_gen_params p = { .sampling = { .temperature = 1, .top_k = 8, .top_p = 1, .seed = seed0 + (uint64_t)i },
                            .repetition_penalty = 1, .max_tokens = CH_TOKENS };
        int rc = LM_ENGINE_BUSY;
        while (rc == LM_ENGINE_BUSY) {
            rc = lm_engine_submit(en, prompt, n_prompt, &p, lm_tu_collect_on_token, &c[i], &r[i], &e);
            if (rc == LM_ENGINE_BUSY) lm_tu_collect_wait(&c[i - 1]);
        }
        LM_REQUIRE(rc == LM_ENGINE_OK);
    }
    for (int i = 0; i < CH_SEEDS; i++) {
        lm_tu_collect_wait(&c[i]);
        LM_CHECK(c[i].n == CH_TOKENS);
        memcpy(toks[i], c[i].toks, sizeof toks[i]);
        lm_request_release(r[i]);
        lm_tu_collect_destroy(&c[i]);
    }
    free(c), free(r);
    lm_engine_free(en);
}

/* The upper tail of chi-square with df degrees of freedom at x
 * (Wilson-Hilferty: accurate to a few per cent at the tails used here). */
static double chi2_tail(double x, int df) {
    double k = df, z = (cbrt(x / k) - (1 - 2 / (9 * k))) / sqrt(2 / (9 * k));
    return 0.5 * erfc(z / sqrt(2));
}

/* A two-sample chi-square test of the last token's distribution: p-value. */
static double chi2_two_sample(const int32_t (*a)[CH_TOKENS], const int32_t (*b)[CH_TOKENS], int pos, int *df) {
    int32_t ids[2 * CH_SEEDS];
    int ca[2 * CH_SEEDS] = { 0 }, cb[2 * CH_SEEDS] = { 0 }, n = 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < CH_SEEDS; i++) {
            int32_t t = (s ? b : a)[i][pos];
            int j = 0;
            while (j < n && ids[j] != t) j++;
            if (j == n) ids[n++] = t;
            (s ? cb : ca)[j]++;
        }
    /* categories with fewer than 10 draws in both samples together go into one */
    int oa = 0, ob = 0, k = 0;
    double x = 0;
    for (int j = 0; j < n; j++) {
        if (ca[j] + cb[j] < 10) {
            oa += ca[j], ob += cb[j];
            continue;
        }
        double e = (ca[j] + cb[j]) / 2.0;
        x += (ca[j] - e) * (ca[j] - e) / e + (cb[j] - e) * (cb[j] - e) / e;
        k++;
    }
    if (oa + ob > 0) {
        double e = (oa + ob) / 2.0;
        x += (oa - e) * (oa - e) / e + (ob - e) * (ob - e) / e;
        k++;
    }
    *df = LM_MAX(k - 1, 1);
    return chi2_tail(x, *df);
}

/* Sampling: a seeded request gives the same tokens with drafts (the
 * oracle's: the greedy answer, so that rows are accepted and rejected);
 * and with other seeds the tokens at every position keep plain decoding's
 * distribution (two-sample chi-square, p > 0.001 at each position). */
LM_TEST(engine_spec_sampling_keeps_distribution) {
    char *dir = lm_test_fixture_path("models/llama");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    LM_REQUIRE(lm_model_load(&m, dir, be, &e) == 0);
    free(dir);
    const int32_t prompt[6] = { 1, 17, 400, 23, 99, 5 };
    int32_t(*plain)[CH_TOKENS] = calloc(CH_SEEDS, sizeof *plain);
    int32_t(*same)[CH_TOKENS] = calloc(CH_SEEDS, sizeof *same);
    int32_t(*other)[CH_TOKENS] = calloc(CH_SEEDS, sizeof *other);
    /* the greedy answer, the oracle's draft (one token of it changed now and then) */
    sp_result *ref = calloc(1, sizeof *ref);
    {
        lm_engine *en = NULL;
        lm_engine_opts o = { .ctx = 128, .parallel = 1 };
        LM_REQUIRE(lm_engine_create(&en, m, &o, &e) == 0);
        lm_tu_collect c;
        lm_tu_collect_init(&c);
        lm_gen_params p = { .sampling = { .top_p = 1 }, .repetition_penalty = 1, .max_tokens = CH_TOKENS };
        lm_request *r = NULL;
        LM_REQUIRE(lm_engine_submit(en, prompt, 6, &p, lm_tu_collect_on_token, &c, &r, &e) == LM_ENGINE_OK);
        lm_tu_collect_wait(&c);
        for (int i = 0; i < SP_N; i++) ref->n[i] = c.n, memcpy(ref->toks[i], c.toks, sizeof ref->toks[i]);
        lm_request_release(r);
        lm_tu_collect_destroy(&c);
        lm_engine_free(en);
    }
    oracle orc = { .ref = ref, .n_prompt = { 6, 6, 6, 6, 6, 6 } };
    sample_run(lm_t_, m, LM_SPEC_OFF, NULL, prompt, 6, 1000, plain);
    sample_run(lm_t_, m, LM_SPEC_CALLBACK, &orc, prompt, 6, 1000, same);
    LM_CHECK(memcmp(plain, same, CH_SEEDS * sizeof *plain) == 0);
    sample_run(lm_t_, m, LM_SPEC_CALLBACK, &orc, prompt, 6, 50000, other);
    for (int pos = 0; pos < CH_TOKENS; pos++) {
        int df;
        double p = chi2_two_sample(plain, other, pos, &df);
        printf("  token %d: chi-square p = %.4f (%d degrees of freedom)\n", pos, p, df);
        LM_CHECK(p > 0.001);
    }
    free(plain), free(same), free(other), free(ref);
    lm_model_free(m);
    lm_backend_destroy(be);
}
