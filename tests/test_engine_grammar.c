/* test_engine_grammar.c - requests with a grammar in the engine (issue
 * #32): every token they get is one the grammar allows, and greedy results
 * are the same alone, batched with plain greedy requests under the
 * look-ahead, again from the prefix cache, and speculating (issue #30:
 * drafts the grammar refuses are cut before the verify). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_internal.h"
#include "engine/lm_engine.h"
#include "grammar/lm_grammar.h"
#include "lm_test.h"
#include "test_util.h"
#include "tokenizer/lm_tokenizer.h"

enum { MAXT = 96 };

/* Runs the requests (grammar[i] NULL: plain greedy) in one engine, all
 * submitted at once, `rounds` times one after the other (a later round
 * finds the earlier's blocks in the prefix cache); out[round * n + i]. */
static float run_temperature; /* 0: greedy; else sampled with request i's seed i + 1 */
static int32_t run_trigger;   /* > 0: the grammar requests' grammar_trigger */

static void run_all(lm_model *m, const lm_engine_opts *o, int n, lm_grammar *const *grammar,
                    const lm_grammar_vocab *v, const int32_t *stop, lm_tu_collect *all, int rounds,
                    lm_engine_stats *st) {
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    if (lm_engine_create(&en, m, o, &e)) {
        fprintf(stderr, "  engine: %s\n", e.msg);
        return;
    }
    lm_request *r[8];
    int32_t prompt[24];
    for (int i = 0; i < 24; i++) prompt[i] = (i * 131 + 7) % 3000 + 20;
    for (int round = 0; round < rounds; round++) {
    lm_tu_collect *out = all + round * n;
    for (int i = 0; i < n; i++) {
        lm_tu_collect_init(&out[i]);
        lm_gen_params p = { .sampling = { .temperature = run_temperature, .seed = (uint64_t)i + 1 },
                            .repetition_penalty = 1, .max_tokens = MAXT,
                            .stop_tokens = stop, .n_stop_tokens = 1, .grammar = grammar[i], .grammar_vocab = v,
                            .grammar_trigger = grammar[i] ? run_trigger : 0 };
        if (lm_engine_submit(en, prompt, 24, &p, lm_tu_collect_on_token, &out[i], &r[i], &e) != LM_ENGINE_OK) {
            fprintf(stderr, "  submit: %s\n", e.msg);
            r[i] = NULL;
        }
    }
    for (int i = 0; i < n; i++) {
        if (r[i]) {
            lm_tu_collect_wait(&out[i]);
            lm_request_release(r[i]);
        }
        lm_tu_collect_destroy(&out[i]);
    }
    }
    for (int i = 0; st && i < 2000; i++) { /* stats are published after each step */
        lm_engine_get_stats(en, st);
        if (st->running == 0 && st->queued == 0) break;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    lm_engine_free(en);
}

/* Speculation's proposer for the test: the continuation of whichever
 * expected answer the tokens so far follow, with `bad` in place of the
 * draft token at position calls % (max + 1) (none when that is past the
 * draft), or at position 0 every time (always_bad). */
typedef struct g_oracle {
    const lm_tu_collect *want[2];
    int32_t bad;
    bool always_bad;
    int calls;
} g_oracle;

static int g_propose(void *user, const int32_t *tokens, int n_tokens, int n_prompt, int32_t *draft, int max) {
    g_oracle *o = user;
    const int g = n_tokens - n_prompt;
    for (int w = 0; w < 2; w++) {
        const lm_tu_collect *ref = o->want[w];
        if (!ref || g > ref->n || memcmp(tokens + n_prompt, ref->toks, (size_t)g * sizeof(int32_t))) continue;
        int k = LM_MIN(max, ref->n - g);
        if (k <= 0) return 0;
        memcpy(draft, ref->toks + g, (size_t)k * sizeof(int32_t));
        int bad = o->always_bad ? 0 : o->calls++ % (max + 1);
        if (bad < k) draft[bad] = o->bad;
        return k;
    }
    return 0;
}

/* The demo model, its vocabulary for grammars, and a small object schema. */
typedef struct eg_fix {
    lm_tokenizer *tok;
    lm_backend *be;
    lm_model *m;
    const char **bytes;
    size_t *lens;
    lm_grammar_vocab *v;
    lm_grammar *g;
    int32_t stop;
} eg_fix;

static bool eg_open(eg_fix *f) {
    lm_err e = { { 0 } };
    *f = (eg_fix){ 0 };
    if (lm_tokenizer_load(&f->tok, LUMEN_SOURCE_DIR "/models/demo", &e) || !(f->be = lm_tu_model_backend(2, &e)) ||
        lm_model_load(&f->m, LUMEN_SOURCE_DIR "/models/demo", f->be, &e)) {
        fprintf(stderr, "  demo model: %s\n", e.msg);
        return false;
    }
    const int V = f->m->cfg.vocab;
    f->bytes = calloc((size_t)V, sizeof *f->bytes);
    f->lens = calloc((size_t)V, sizeof *f->lens);
    lm_tok_str t = { 0 };
    for (int id = 0; id < V && id < lm_tokenizer_n_vocab(f->tok); id++) {
        if (lm_tokenizer_is_special(f->tok, id) || !lm_tokenizer_token_bytes(f->tok, id, &t)) continue;
        char *c = malloc(t.len + 1);
        memcpy(c, t.s, t.len);
        f->bytes[id] = c, f->lens[id] = t.len;
    }
    lm_tok_str_free(&t);
    f->stop = lm_tokenizer_token_to_id(f->tok, "<|im_end|>", 10);
    f->v = lm_grammar_vocab_create(V, f->bytes, f->lens, &f->stop, 1);
    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                                "\"n\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},\"ok\":{\"type\":\"boolean\"}},"
                                "\"required\":[\"name\",\"n\",\"ok\"],\"additionalProperties\":false}", 0, NULL);
    int rc = lm_grammar_from_schema(&f->g, schema, &e);
    json_decref(schema);
    return rc == 0;
}

static void eg_close(eg_fix *f) {
    for (int id = 0; f->m && id < f->m->cfg.vocab; id++) free((char *)f->bytes[id]);
    free(f->bytes), free(f->lens);
    lm_grammar_unref(f->g);
    lm_grammar_vocab_free(f->v);
    lm_model_free(f->m);
    lm_backend_destroy(f->be);
    lm_tokenizer_free(f->tok);
}

static bool same(const lm_tu_collect *a, const lm_tu_collect *b) {
    return a->n == b->n && !memcmp(a->toks, b->toks, (size_t)a->n * sizeof(int32_t));
}

LM_TEST(engine_grammar_tokens_allowed_and_greedy_stable) {
    eg_fix f;
    LM_REQUIRE(eg_open(&f));
    lm_model *m = f.m;
    lm_tokenizer *tok = f.tok;
    lm_grammar_vocab *v = f.v;
    lm_grammar *g = f.g;
    int32_t stop = f.stop;

    /* alone, no look-ahead, no cache */
    lm_tu_collect solo[1];
    lm_grammar *only[1] = { g };
    run_all(m, &(lm_engine_opts){ .ctx = 256, .parallel = 1, .look_ahead = -1 }, 1, only, v, &stop, solo, 1, NULL);
    LM_CHECK(solo[0].done && solo[0].n > 0);
    /* the tokens spell a sentence of the grammar */
    lm_grammar_matcher *gm = lm_grammar_matcher_create(g, v);
    for (int i = 0; i < solo[0].n; i++) LM_CHECK_MSG(lm_grammar_accept(gm, solo[0].toks[i]), "token %d", i);
    LM_CHECK(solo[0].finish != LM_FINISH_STOP || lm_grammar_done(gm));
    lm_grammar_matcher_free(gm);

    /* batched with plain greedy requests, look-ahead on, prefix cache on,
     * twice (the second round from the cache) */
    lm_grammar *mix[4] = { NULL, g, NULL, g };
    lm_engine_opts o = { .ctx = 256, .parallel = 4, .look_ahead = 1, .cache_ram = 8u << 20 };
    lm_tu_collect plain[1];
    lm_grammar *none[1] = { NULL };
    run_all(m, &(lm_engine_opts){ .ctx = 256, .parallel = 1, .look_ahead = -1 }, 1, none, v, &stop, plain, 1, NULL);
    lm_tu_collect res[8];
    run_all(m, &o, 4, mix, v, &stop, res, 2, NULL);
    for (int i = 0; i < 8; i++) {
        const lm_tu_collect *want = mix[i % 4] ? &solo[0] : &plain[0];
        LM_CHECK_MSG(res[i].n == want->n && !memcmp(res[i].toks, want->toks, (size_t)want->n * sizeof(int32_t)),
                     "round %d request %d: %d tokens vs %d", i / 4, i % 4, res[i].n, want->n);
    }

    /* speculating, the same mix: drafts of the right answers with a token
     * the grammar never allows (a special token) at every position in turn;
     * per-position rollback and copy-and-replay */
    const int32_t special = lm_tokenizer_token_to_id(tok, "<|im_start|>", 12);
    LM_REQUIRE(special >= 0);
    for (int replay = 0; replay < 2; replay++) {
        g_oracle orc = { { &solo[0], &plain[0] }, special, false, 0 };
        lm_engine_opts so = { .ctx = 256, .parallel = 4, .cache_ram = 8u << 20, .spec = LM_SPEC_CALLBACK,
                              .spec_draft = 3, .spec_fixed = true, .spec_replay = replay, .spec_cb = g_propose,
                              .spec_user = &orc };
        lm_engine_stats st = { 0 };
        run_all(m, &so, 4, mix, v, &stop, res, 2, &st);
        for (int i = 0; i < 8; i++) {
            const lm_tu_collect *want = mix[i % 4] ? &solo[0] : &plain[0];
            LM_CHECK_MSG(res[i].n == want->n && !memcmp(res[i].toks, want->toks, (size_t)want->n * sizeof(int32_t)),
                         "speculating (replay %d), round %d request %d: %d tokens vs %d", replay, i / 4, i % 4,
                         res[i].n, want->n);
        }
        LM_CHECK(st.spec_verifies > 0 && st.spec_accepted > 0);
    }
    /* a draft model (the demo itself, so its guesses are the unconstrained
     * greedy tokens): a grammar request's guesses are cut where its grammar
     * refuses them, the rest verified; the same tokens */
    {
        lm_engine_opts dm = { .ctx = 256, .parallel = 4, .cache_ram = 8u << 20, .spec = LM_SPEC_DRAFT,
                              .spec_model = LUMEN_SOURCE_DIR "/models/demo", .spec_draft = 3, .spec_fixed = true };
        lm_engine_stats st = { 0 };
        run_all(m, &dm, 4, mix, v, &stop, res, 2, &st);
        for (int i = 0; i < 8; i++) {
            const lm_tu_collect *want = mix[i % 4] ? &solo[0] : &plain[0];
            LM_CHECK_MSG(same(&res[i], want), "a draft model, round %d request %d: %d tokens vs %d", i / 4, i % 4,
                         res[i].n, want->n);
        }
        LM_CHECK(st.spec_verifies > 0 && st.spec_accepted > 0 && st.spec_model_tokens > 0);
    }
    /* grammar requests alone, every draft starting with the refused token:
     * none reaches a verify */
    g_oracle refuse = { { &solo[0], NULL }, special, true, 0 };
    lm_engine_opts ro = { .ctx = 256, .parallel = 2, .spec = LM_SPEC_CALLBACK, .spec_draft = 3, .spec_fixed = true,
                          .spec_cb = g_propose, .spec_user = &refuse };
    lm_grammar *two[2] = { g, g };
    lm_engine_stats rst = { 0 };
    run_all(m, &ro, 2, two, v, &stop, res, 1, &rst);
    for (int i = 0; i < 2; i++)
        LM_CHECK(res[i].n == solo[0].n && !memcmp(res[i].toks, solo[0].toks, (size_t)solo[0].n * sizeof(int32_t)));
    LM_CHECK_MSG(rst.spec_drafted == 0, "%llu refused draft tokens verified", (unsigned long long)rst.spec_drafted);
    eg_close(&f);
}

/* Masks computed while the forward runs (lm_engine_opts.mask_ahead) give
 * the same tokens as masks computed after it, greedy and sampled, batched
 * with plain requests under the look-ahead, from the prefix cache, with
 * strict fill on and off, and speculating (a draft's rows get theirs from
 * the matcher after the draft tokens before them); with it on every mask
 * the hand-out applies came from the helper. */
LM_TEST(engine_grammar_masks_ahead_exact) {
    eg_fix f;
    LM_REQUIRE(eg_open(&f));
    const int32_t special = lm_tokenizer_token_to_id(f.tok, "<|im_start|>", 12);
    LM_REQUIRE(special >= 0);
    lm_grammar *mix[4] = { NULL, f.g, NULL, f.g }, *all4[4] = { f.g, f.g, f.g, f.g };
    lm_tu_collect greedy[8], ref[8], got[8];
    for (int c = 0; c < 5; c++) {
        /* 0: mixed greedy batch, look-ahead, cache, two rounds; 1: the same,
         * strict fill off; 2: sampled, all four constrained; 3, 4:
         * speculating on the right answers with a refused token at every
         * position in turn, per-position rollback and replay */
        lm_engine_opts o = { .ctx = 256, .parallel = 4, .look_ahead = 1, .cache_ram = 8u << 20,
                             .strict_fill = c == 1 ? -1 : 0 };
        lm_grammar *const *gr = c == 2 ? all4 : mix;
        run_temperature = c == 2 ? 0.9f : 0;
        g_oracle orc = { { &greedy[1], &greedy[0] }, special, false, 0 };
        if (c >= 3) {
            o.look_ahead = 0;
            o.spec = LM_SPEC_CALLBACK, o.spec_draft = 3, o.spec_fixed = true, o.spec_replay = c == 4;
            o.spec_cb = g_propose, o.spec_user = &orc;
        }
        lm_engine_stats st_off = { 0 }, st_on = { 0 };
        o.mask_ahead = -1;
        /* speculating: against the greedy results of case 0 */
        if (c < 3) run_all(f.m, &o, 4, gr, f.v, &f.stop, ref, 2, &st_off);
        else memcpy(ref, greedy, sizeof ref);
        orc.calls = 0;
        o.mask_ahead = 1;
        run_all(f.m, &o, 4, gr, f.v, &f.stop, got, 2, &st_on);
        for (int i = 0; i < 8; i++)
            LM_CHECK_MSG(ref[i].done && same(&got[i], &ref[i]), "case %d, round %d request %d: %d tokens vs %d", c,
                         i / 4, i % 4, got[i].n, ref[i].n);
        /* greedy under the look-ahead, later masks are computed while the
         * next forward runs (grammar_masks_chained), the helper or not */
        if (c < 3) LM_CHECK_MSG(st_off.grammar_masks > 0 && st_off.grammar_masks_ahead == 0, "case %d off: %llu of %llu",
                                c, (unsigned long long)st_off.grammar_masks_ahead,
                                (unsigned long long)st_off.grammar_masks);
        LM_CHECK_MSG(st_on.grammar_masks > 0 && st_on.grammar_masks_ahead > 0 &&
                         st_on.grammar_masks_ahead + st_on.grammar_masks_chained == st_on.grammar_masks,
                     "case %d on: %llu + %llu of %llu masks from the helper and the look-ahead", c,
                     (unsigned long long)st_on.grammar_masks_ahead, (unsigned long long)st_on.grammar_masks_chained,
                     (unsigned long long)st_on.grammar_masks);
        const bool chained = c < 2; /* greedy, look-ahead on */
        LM_CHECK_MSG((st_on.grammar_masks_chained > 0) == chained && (st_off.grammar_masks_chained > 0) == chained,
                     "case %d: %llu / %llu masks in look-ahead chains", c,
                     (unsigned long long)st_off.grammar_masks_chained, (unsigned long long)st_on.grammar_masks_chained);
        if (c >= 3) LM_CHECK(st_on.spec_verifies > 0 && st_on.spec_accepted > 0);
        if (c == 0) memcpy(greedy, ref, sizeof greedy);
    }
    run_temperature = 0;
    eg_close(&f);
}

/* Greedy requests under a grammar in look-ahead chains (their masks
 * computed while the next forward runs, the argmax under them on the
 * backend) give the tokens of steps that wait for the host: all four
 * constrained, with strict fill (whose tokens end a chain: the queued
 * step's row is not handed out) and without, and a grammar that wakes at a
 * trigger token mid-answer. */
LM_TEST(engine_grammar_look_ahead_chains_exact) {
    eg_fix f;
    LM_REQUIRE(eg_open(&f));
    lm_grammar *all4[4] = { f.g, f.g, f.g, f.g }, *mix[4] = { f.g, NULL, f.g, f.g };
    lm_tu_collect ref[8], got[8], plain[1];
    lm_grammar *none[1] = { NULL };
    const lm_engine_opts solo = { .ctx = 256, .parallel = 1, .look_ahead = -1 };
    run_all(f.m, &solo, 1, none, f.v, &f.stop, plain, 1, NULL);
    LM_REQUIRE(plain[0].n > 8);
    int at = 2; /* the trigger: a token of the free answer not seen before it */
    while (at < plain[0].n) {
        bool seen = false;
        for (int i = 0; i < at; i++) seen |= plain[0].toks[i] == plain[0].toks[at];
        if (!seen) break;
        at++;
    }
    LM_REQUIRE(at < plain[0].n);
    for (int c = 0; c < 4; c++) {
        /* 0: strict fill; 1: without; 2: a plain greedy request among them; 3: a trigger */
        lm_engine_opts o = { .ctx = 256, .parallel = 4, .cache_ram = 8u << 20, .strict_fill = c == 1 ? -1 : 0,
                             .mask_ahead = -1 };
        lm_grammar *const *gr = c == 2 ? mix : all4;
        run_trigger = c == 3 ? plain[0].toks[at] : 0;
        lm_engine_stats st_off = { 0 }, st_on = { 0 };
        o.look_ahead = -1;
        run_all(f.m, &o, 4, gr, f.v, &f.stop, ref, 2, &st_off);
        o.look_ahead = 1;
        run_all(f.m, &o, 4, gr, f.v, &f.stop, got, 2, &st_on);
        for (int i = 0; i < 8; i++)
            LM_CHECK_MSG(ref[i].done && ref[i].n > 0 && same(&got[i], &ref[i]),
                         "case %d, round %d request %d: %d tokens vs %d", c, i / 4, i % 4, got[i].n, ref[i].n);
        LM_CHECK_MSG(st_off.ahead_steps == 0 && st_on.ahead_steps > 20 && st_on.grammar_masks_chained > 20,
                     "case %d: %llu steps queued ahead, %llu masks chained", c, (unsigned long long)st_on.ahead_steps,
                     (unsigned long long)st_on.grammar_masks_chained);
        if (c == 3) /* the free start, then the grammar */
            for (int i = 0; i < 8; i++)
                LM_CHECK(got[i].n > at + 1 && !memcmp(got[i].toks, plain[0].toks, (size_t)(at + 1) * 4) &&
                         got[i].toks[at + 1] != plain[0].toks[at + 1]);
        LM_CHECK_MSG((st_on.grammar_fill_tokens > 0) == (c != 1) &&
                         st_on.grammar_fill_tokens == st_off.grammar_fill_tokens,
                     "case %d: %llu / %llu tokens filled", c, (unsigned long long)st_off.grammar_fill_tokens,
                     (unsigned long long)st_on.grammar_fill_tokens);
    }
    run_trigger = 0;
    eg_close(&f);
}

/* The engine stopped while a constrained step waits in the look-ahead's
 * chain (its forward issued, its masked argmax not yet): the queued step
 * is abandoned cleanly (its argmax issued, so the model takes forwards
 * again: a new engine on it answers as before) and the requests end
 * cancelled. */
LM_TEST(engine_grammar_look_ahead_stop_mid_chain) {
    eg_fix f;
    LM_REQUIRE(eg_open(&f));
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_engine_create(&en, f.m, &(lm_engine_opts){ .ctx = 256, .parallel = 2, .look_ahead = 1 }, &e) == 0);
    int32_t prompt[24];
    for (int i = 0; i < 24; i++) prompt[i] = (i * 131 + 7) % 3000 + 20;
    lm_tu_collect c[2];
    lm_request *r[2];
    for (int i = 0; i < 2; i++) {
        lm_tu_collect_init(&c[i]);
        lm_gen_params p = { .repetition_penalty = 1, .max_tokens = 200, .grammar = f.g, .grammar_vocab = f.v };
        LM_REQUIRE(lm_engine_submit(en, prompt, 24, &p, lm_tu_collect_on_token, &c[i], &r[i], &e) == LM_ENGINE_OK);
    }
    lm_engine_stats st;
    for (int i = 0; i < 5000; i++) { /* until the chain runs (a strict fill at the start breaks it once) */
        lm_engine_get_stats(en, &st);
        if (st.ahead_steps >= 2) break;
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
    }
    lm_engine_free(en); /* mid-answer: a queued masked step is abandoned */
    LM_CHECK(st.ahead_steps > 0);
    for (int i = 0; i < 2; i++) {
        lm_tu_collect_wait(&c[i]);
        LM_CHECK_MSG(c[i].finish == LM_FINISH_CANCELLED || c[i].finish == LM_FINISH_STOP, "request %d: finish %d", i,
                     (int)c[i].finish);
        lm_request_release(r[i]);
        lm_tu_collect_destroy(&c[i]);
    }
    lm_tu_collect again[1], ref[1];
    lm_grammar *one[1] = { f.g };
    run_all(f.m, &(lm_engine_opts){ .ctx = 256, .parallel = 1, .look_ahead = -1 }, 1, one, f.v, &f.stop, again, 1,
            NULL);
    LM_CHECK_MSG(again[0].done && again[0].n > 0, "the model after the stop: %d tokens", again[0].n);
    eg_close(&f);
    LM_REQUIRE(eg_open(&f)); /* a fresh model's answer */
    one[0] = f.g;
    run_all(f.m, &(lm_engine_opts){ .ctx = 256, .parallel = 1, .look_ahead = -1 }, 1, one, f.v, &f.stop, ref, 1, NULL);
    LM_CHECK(same(&again[0], &ref[0]));
    eg_close(&f);
}

/* The first token mask allows, or -1. */
static int32_t first_allowed(const uint32_t *mask, int V, int32_t not) {
    for (int id = 0; id < V; id++)
        if ((mask[id / 32] >> (id % 32) & 1) && id != not) return id;
    return -1;
}

static bool mask_eq(const uint32_t *a, const uint32_t *b, int V) {
    return !memcmp(a, b, (size_t)lm_grammar_mask_words(V) * sizeof *a);
}

/* The helper's masks one by one: a draft's rows get the masks after the
 * draft tokens before them; a request that moved elsewhere since the post
 * (another token handed out, or the grammar stepped on without a token, as
 * a strict fill does) or a mask of an older post is not taken. */
LM_TEST(engine_grammar_mask_ahead_rows) {
    eg_fix f;
    LM_REQUIRE(eg_open(&f));
    const int V = f.m->cfg.vocab, W = lm_grammar_mask_words(V);
    lm_grammar_matcher *gm = lm_grammar_matcher_create(f.g, f.v);
    uint32_t *want[3];
    int32_t d[3];
    LM_REQUIRE(lm_grammar_accept_bytes(gm, "{\"name\": \"", 10));
    for (int i = 0; i < 3; i++) { /* the inline masks along a path of allowed tokens */
        want[i] = malloc((size_t)W * 4);
        LM_REQUIRE(lm_grammar_mask(gm, want[i]) > 1);
        d[i] = first_allowed(want[i], V, -1);
        LM_REQUIRE(d[i] >= 0 && lm_grammar_accept(gm, d[i]));
    }
    lm_grammar_rollback(gm, 3);
    int32_t toks[16] = { 7 };
    lm_request r = { .gm = gm, .gm_live = true, .state = LM_REQ_RUNNING, .tokens = toks, .n_tokens = 1, .cap = 16 };
    lm_batch_builder *bb = lm_batch_builder_create(8, 1, 3, false);
    int32_t table[1] = { 0 };
    lm_request *rows[3] = { &r, &r, &r };
    lm_step st = { .n_out = 3, .row_req = rows };
    lm_mask_ahead *ma = lm_mask_ahead_create(V, 3);
    LM_REQUIRE(ma);
    /* post: t0 then the draft d0 d1 (rows 0, 1, 2) */
    lm_batch_add_seq(bb, table, -1);
    int32_t fed[3] = { 7, d[0], d[1] };
    int last = lm_batch_add_tokens(bb, 0, fed, 0, 3);
    for (int i = 0; i < 3; i++) lm_batch_add_out(bb, last - 2 + i);
    double mask_s;
    LM_CHECK(lm_mask_ahead_start(ma, &st, bb) == 1);
    lm_mask_ahead_wait(ma, &mask_s);
    LM_CHECK(lm_grammar_steps(gm) == 1); /* the helper rolled back what it accepted */
    int n = 0;
    for (int i = 0; i < 3; i++) {
        const uint32_t *got = lm_mask_ahead_take(ma, &r, &n);
        LM_CHECK_MSG(got && mask_eq(got, want[i], V), "row %d", i);
        LM_REQUIRE(lm_grammar_accept(gm, d[i]));
        toks[r.n_tokens++] = d[i];
    }
    LM_CHECK(lm_mask_ahead_take(ma, &r, &n) == NULL); /* past the post's rows */
    lm_grammar_rollback(gm, 3);
    r.n_tokens = 1;
    /* another token than the draft's at row 0: row 1 is not its mask */
    LM_CHECK(lm_mask_ahead_start(ma, &st, bb) == 1);
    lm_mask_ahead_wait(ma, &mask_s);
    LM_CHECK(lm_mask_ahead_take(ma, &r, &n) != NULL);
    const int32_t other = first_allowed(want[0], V, d[0]);
    LM_REQUIRE(other >= 0 && lm_grammar_accept(gm, other));
    toks[r.n_tokens++] = other;
    LM_CHECK(lm_mask_ahead_take(ma, &r, &n) == NULL);
    lm_grammar_rollback(gm, 1);
    r.n_tokens = 1;
    /* the draft's token, then the grammar stepped on without one */
    LM_CHECK(lm_mask_ahead_start(ma, &st, bb) == 1);
    lm_mask_ahead_wait(ma, &mask_s);
    LM_CHECK(lm_mask_ahead_take(ma, &r, &n) != NULL);
    LM_REQUIRE(lm_grammar_accept(gm, d[0]));
    toks[r.n_tokens++] = d[0];
    LM_REQUIRE(lm_grammar_accept(gm, d[1]));
    LM_CHECK(lm_mask_ahead_take(ma, &r, &n) == NULL);
    lm_grammar_rollback(gm, 2);
    r.n_tokens = 1;
    /* an older post's masks */
    LM_CHECK(lm_mask_ahead_start(ma, &st, bb) == 1);
    lm_mask_ahead_wait(ma, &mask_s);
    lm_request *none[3] = { NULL, NULL, NULL };
    lm_request plain = { .state = LM_REQ_RUNNING };
    none[0] = none[1] = none[2] = &plain;
    lm_step other_st = { .n_out = 3, .row_req = none };
    LM_CHECK(lm_mask_ahead_start(ma, &other_st, bb) == 0);
    LM_CHECK(lm_mask_ahead_take(ma, &r, &n) == NULL);
    lm_mask_ahead_free(ma);
    lm_batch_builder_free(bb);
    for (int i = 0; i < 3; i++) free(want[i]);
    lm_grammar_matcher_free(gm);
    eg_close(&f);
}
