/* test_engine_grammar.c - requests with a grammar in the engine (issue
 * #32): every token they get is one the grammar allows, and greedy results
 * are the same alone, batched with plain greedy requests under the
 * look-ahead, again from the prefix cache, and speculating (issue #30:
 * drafts the grammar refuses are cut before the verify). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/lm_engine.h"
#include "grammar/lm_grammar.h"
#include "lm_test.h"
#include "test_util.h"
#include "tokenizer/lm_tokenizer.h"

enum { MAXT = 96 };

/* Runs the requests (grammar[i] NULL: plain greedy) in one engine, all
 * submitted at once, `rounds` times one after the other (a later round
 * finds the earlier's blocks in the prefix cache); out[round * n + i]. */
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
        lm_gen_params p = { .sampling = { .temperature = 0 }, .repetition_penalty = 1, .max_tokens = MAXT,
                            .stop_tokens = stop, .n_stop_tokens = 1, .grammar = grammar[i], .grammar_vocab = v };
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

LM_TEST(engine_grammar_tokens_allowed_and_greedy_stable) {
    lm_err e = { { 0 } };
    lm_tokenizer *tok = NULL;
    LM_REQUIRE(lm_tokenizer_load(&tok, LUMEN_SOURCE_DIR "/models/demo", &e) == 0);
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    LM_REQUIRE(lm_model_load(&m, LUMEN_SOURCE_DIR "/models/demo", be, &e) == 0);
    const int V = m->cfg.vocab;
    const char **bytes = calloc((size_t)V, sizeof *bytes);
    size_t *lens = calloc((size_t)V, sizeof *lens);
    lm_tok_str t = { 0 };
    for (int id = 0; id < V && id < lm_tokenizer_n_vocab(tok); id++) {
        if (lm_tokenizer_is_special(tok, id) || !lm_tokenizer_token_bytes(tok, id, &t)) continue;
        char *c = malloc(t.len + 1);
        memcpy(c, t.s, t.len);
        bytes[id] = c, lens[id] = t.len;
    }
    int32_t stop = lm_tokenizer_token_to_id(tok, "<|im_end|>", 10);
    lm_grammar_vocab *v = lm_grammar_vocab_create(V, bytes, lens, &stop, 1);
    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                                "\"n\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},\"ok\":{\"type\":\"boolean\"}},"
                                "\"required\":[\"name\",\"n\",\"ok\"],\"additionalProperties\":false}", 0, NULL);
    lm_grammar *g = NULL;
    LM_REQUIRE(lm_grammar_from_schema(&g, schema, &e) == 0);
    json_decref(schema);

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
    for (int id = 0; id < V; id++) free((char *)bytes[id]);
    free(bytes), free(lens);
    lm_tok_str_free(&t);
    lm_grammar_unref(g);
    lm_grammar_vocab_free(v);
    lm_model_free(m);
    lm_backend_destroy(be);
    lm_tokenizer_free(tok);
}
