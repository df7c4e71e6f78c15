/* test_engine_spec_draft.c - speculation by a separate draft model
 * (spec_draft.c): with a quantised copy of the model as its draft (guesses
 * mostly right, rejected at every position now and then), greedy tokens
 * equal plain decoding's for an attention draft and a recurrent one, four
 * requests at a time, fixed depth and adaptive; a second request sharing a
 * prompt's cached blocks starts its draft past them; a draft with another
 * tokenizer is refused. The per-architecture exactness runs (the model as
 * its own draft, and another architecture) are in test_engine_spec.c. */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_engine.h"
#include "lm_test.h"
#include "test_util.h"

/* A fatal check that frees what the test holds first (leaks are errors under ASan). */
#define DR_REQUIRE(c, tofree, ...)         \
    do {                                   \
        if (!(c)) {                        \
            LM_CHECK_MSG(0, __VA_ARGS__);  \
            free(tofree);                  \
            return;                        \
        }                                  \
    } while (0)

#define DR_REQS 4
#define DR_GEN 40

/* prompt2.ids of dir's reference (up to max tokens) into ids; its count, 0 on failure. */
static int dr_prompt(lm_test_ctx *lm_t_, const char *dir, int32_t *ids, int max) {
    lm_err e = { { 0 } };
    const int n = lm_tu_ref_ids(dir, "prompt2.ids", ids, max, &e);
    LM_CHECK_MSG(n > 0, "%s", e.msg);
    return n;
}

typedef struct dr_result {
    int32_t toks[DR_REQS][DR_GEN];
    int n[DR_REQS];
    lm_engine_stats st;
} dr_result;

/* DR_REQS greedy requests at once, prompts cut at different places of
 * prompt (request 1 opts out of speculation); o's speculation. */
static void dr_run(lm_test_ctx *lm_t_, lm_model *m, const lm_engine_opts *o, const int32_t *prompt, int n_prompt,
                   dr_result *out) {
    memset(out, 0, sizeof *out);
    lm_err e = { { 0 } };
    lm_engine *en = NULL;
    if (lm_engine_create(&en, m, o, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return;
    }
    lm_tu_collect c[DR_REQS];
    lm_request *r[DR_REQS];
    for (int i = 0; i < DR_REQS; i++) {
        lm_tu_collect_init(&c[i]);
        lm_gen_params p = { .sampling = { .top_p = 1 }, .repetition_penalty = 1, .max_tokens = DR_GEN - 3 * i,
                            .no_spec = i == 1 };
        LM_REQUIRE(lm_engine_submit(en, prompt + 7 * i, n_prompt - 7 * i - 11 * (i & 1), &p, lm_tu_collect_on_token,
                                    &c[i], &r[i], &e) == LM_ENGINE_OK);
    }
    for (int i = 0; i < DR_REQS; i++) {
        lm_tu_collect_wait(&c[i]);
        out->n[i] = LM_MIN(c[i].n, DR_GEN);
        memcpy(out->toks[i], c[i].toks, (size_t)out->n[i] * sizeof(int32_t));
        lm_request_release(r[i]);
        lm_tu_collect_destroy(&c[i]);
    }
    lm_tu_engine_settled(en, &out->st);
    LM_CHECK(out->st.kv_blocks_free == out->st.kv_blocks_total - out->st.cache_blocks);
    lm_engine_free(en);
}

static void dr_same(lm_test_ctx *lm_t_, const char *what, const dr_result *a, const dr_result *b) {
    for (int i = 0; i < DR_REQS; i++)
        LM_CHECK_MSG(a->n[i] == b->n[i] && !memcmp(a->toks[i], b->toks[i], (size_t)a->n[i] * sizeof(int32_t)),
                     "%s, request %d: %d tokens against %d, or they differ", what, i, b->n[i], a->n[i]);
}

/* The fixture folder gguf/NAME when it holds the HF model and
 * model.TYPE.gguf, else NULL: a partial carry (a GPU run's) may hold only
 * some of a folder's files, and then the tests skip instead of failing. */
static char *dr_fixture_dir(const char *fixture, const char *type) {
    char draft[64];
    snprintf(draft, sizeof draft, "model.%s.gguf", type);
    const char *const need[] = { "config.json", "model.safetensors", "tokenizer.json", draft };
    char rel[256];
    for (size_t i = 0; i < LM_COUNT(need); i++) {
        snprintf(rel, sizeof rel, "gguf/%s/%s", fixture, need[i]);
        char *p = lm_test_fixture_path(rel); /* NULL only when absent from a partial set */
        if (!p) return NULL;
        free(p);
    }
    snprintf(rel, sizeof rel, "gguf/%s", fixture);
    return lm_test_fixture_path(rel);
}

/* The HF folder fdir (a gguf fixture's) against its own quantised GGUF as the draft. */
static void quantised_draft(lm_test_ctx *lm_t_, const char *fixture, const char *type) {
    char *dir = dr_fixture_dir(fixture, type);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char draft[1200];
    snprintf(draft, sizeof draft, "%s/model.%s.gguf", dir, type);
    lm_backend *be = NULL;
    lm_model *m = NULL;
    lm_err e = { { 0 } };
    be = lm_tu_model_backend(2, &e);
    DR_REQUIRE(be != NULL, dir, "%s", e.msg);
    if (lm_model_load(&m, dir, be, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        goto done;
    }
    int32_t prompt[160];
    const int n_prompt = dr_prompt(lm_t_, dir, prompt, 160);
    if (!n_prompt) goto done;
    dr_result *off = malloc(sizeof *off), *on = malloc(sizeof *on);
    lm_engine_opts o = { .ctx = 256, .parallel = DR_REQS, .step_tokens = 64, .cache_ram = (size_t)32 << 20 };
    dr_run(lm_t_, m, &o, prompt, n_prompt, off);
    LM_CHECK(off->n[0] == DR_GEN);
    o.spec = LM_SPEC_DRAFT, o.spec_model = draft, o.spec_draft = 4, o.spec_fixed = true;
    dr_run(lm_t_, m, &o, prompt, n_prompt, on);
    dr_same(lm_t_, "fixed depth 4", off, on);
    const lm_engine_stats *s = &on->st;
    printf("  %s with its %s draft: %llu verifies, %llu of %llu accepted, by position %llu/%llu %llu/%llu "
           "%llu/%llu %llu/%llu, %llu draft-model tokens\n",
           fixture, type, (unsigned long long)s->spec_verifies, (unsigned long long)s->spec_accepted,
           (unsigned long long)s->spec_drafted, (unsigned long long)s->spec_pos_accepted[0],
           (unsigned long long)s->spec_pos_drafted[0], (unsigned long long)s->spec_pos_accepted[1],
           (unsigned long long)s->spec_pos_drafted[1], (unsigned long long)s->spec_pos_accepted[2],
           (unsigned long long)s->spec_pos_drafted[2], (unsigned long long)s->spec_pos_accepted[3],
           (unsigned long long)s->spec_pos_drafted[3], (unsigned long long)s->spec_model_tokens);
    /* mostly right, and wrong somewhere after a kept guess: the chain's fed
     * guesses were kept in part, so the draft's rollback ran mid-chain */
    LM_CHECK(s->spec_accepted * 2 > s->spec_drafted);
    LM_CHECK(s->spec_pos_accepted[1] > 0 &&
             (s->spec_pos_accepted[1] < s->spec_pos_drafted[1] || s->spec_pos_accepted[2] < s->spec_pos_drafted[2]));
    LM_CHECK(s->steps < off->st.steps);
    o.spec_draft = 0, o.spec_fixed = false;
    dr_run(lm_t_, m, &o, prompt, n_prompt, on);
    dr_same(lm_t_, "adaptive", off, on);
    free(off), free(on);
done:
    lm_model_free(m);
    lm_backend_destroy(be);
    free(dir);
}

LM_TEST(engine_spec_draft_quantised_attention) { quantised_draft(lm_t_, "llama-g256", "Q6_K"); }
LM_TEST(engine_spec_draft_quantised_recurrent) { quantised_draft(lm_t_, "qwen3.5-g256", "Q8_0"); }

/* One request of prompt then the same again: the second's draft starts
 * past the blocks the first filled (their hash matches), so it feeds far
 * fewer tokens than its prompt. */
LM_TEST(engine_spec_draft_starts_past_shared_blocks) {
    char *dir = dr_fixture_dir("llama-g256", "Q6_K");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char draft[1200];
    snprintf(draft, sizeof draft, "%s/model.Q6_K.gguf", dir);
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    DR_REQUIRE(be != NULL, dir, "%s", e.msg);
    lm_model *m = NULL;
    lm_engine *en = NULL;
    int32_t prompt[300];
    int n_prompt = 0;
    if (lm_model_load(&m, dir, be, &e) || !(n_prompt = dr_prompt(lm_t_, dir, prompt, 200))) {
        LM_CHECK_MSG(0, "%s", e.msg);
        goto done;
    }
    lm_engine_opts o = { .ctx = 256, .parallel = 2, .step_tokens = 64, .cache_ram = (size_t)32 << 20,
                         .spec = LM_SPEC_DRAFT, .spec_model = draft, .spec_draft = 2, .spec_fixed = true };
    if (lm_engine_create(&en, m, &o, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        goto done;
    }
    uint64_t fed[2];
    int32_t first[8];
    for (int k = 0; k < 2; k++) {
        lm_tu_collect c;
        lm_tu_collect_init(&c);
        lm_request *r = NULL;
        lm_gen_params p = { .sampling = { .top_p = 1 }, .repetition_penalty = 1, .max_tokens = 8 };
        LM_REQUIRE(lm_engine_submit(en, prompt, n_prompt, &p, lm_tu_collect_on_token, &c, &r, &e) == LM_ENGINE_OK);
        lm_tu_collect_wait(&c);
        if (k == 0) memcpy(first, c.toks, sizeof first);
        else LM_CHECK(c.n == 8 && !memcmp(first, c.toks, sizeof first) && c.n_cached >= n_prompt - 16);
        lm_request_release(r);
        lm_tu_collect_destroy(&c);
        lm_engine_stats st;
        lm_tu_engine_settled(en, &st);
        fed[k] = st.spec_model_tokens;
    }
    printf("  the draft fed %llu tokens for the first request, %llu for the second (prompt %d)\n",
           (unsigned long long)fed[0], (unsigned long long)(fed[1] - fed[0]), n_prompt);
    LM_CHECK(fed[0] >= (uint64_t)n_prompt && fed[1] - fed[0] < (uint64_t)n_prompt / 4);
done:
    lm_engine_free(en);
    lm_model_free(m);
    lm_backend_destroy(be);
    free(dir);
}

/* A draft whose tokenizer is not the model's: refused, saying why. */
LM_TEST(engine_spec_draft_refuses_another_tokenizer) {
    char *dir = lm_test_fixture_path("models/llama");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    DR_REQUIRE(be != NULL, dir, "%s", e.msg);
    lm_model *m = NULL;
    lm_engine *en = NULL;
    if (lm_model_load(&m, dir, be, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        lm_backend_destroy(be);
        free(dir);
        return;
    }
    lm_engine_opts o = { .ctx = 128, .spec = LM_SPEC_DRAFT, .spec_model = LUMEN_SOURCE_DIR "/models/demo" };
    LM_CHECK(lm_engine_create(&en, m, &o, &e) != 0 && strstr(e.msg, "tokenizer") && strstr(e.msg, "models/demo"));
    printf("  %s\n", e.msg);
    lm_engine_opts none = { .ctx = 128, .spec = LM_SPEC_DRAFT, .spec_model = "/nonexistent/draft" };
    LM_CHECK(lm_engine_create(&en, m, &none, &e) != 0 && strstr(e.msg, "/nonexistent/draft"));
    printf("  %s\n", e.msg);
    lm_model_free(m);
    lm_backend_destroy(be);
    free(dir);
}

/* A draft that cannot pay (another architecture, twice the model's layers:
 * a guess costs more than a step and is never right) runs for one new
 * sequence in eight only, so that its acceptance stays measured; the rest
 * never feed it a token. Greedy tokens stay the plain ones. */
LM_TEST(engine_spec_draft_left_off_where_it_does_not_pay) {
    char *dir = lm_test_fixture_path("models/llama"), *draft = lm_test_fixture_path("models/qwen3.5");
    if (!dir || !draft) {
        free(dir), free(draft);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    lm_model *m = NULL;
    lm_engine *en = NULL;
    int32_t prompt[300];
    int n_prompt = 0;
    if (!be || lm_model_load(&m, dir, be, &e) || !(n_prompt = dr_prompt(lm_t_, dir, prompt, 200))) {
        LM_CHECK_MSG(0, "%s", e.msg);
        goto done;
    }
    lm_engine_opts o = { .ctx = 256, .parallel = 1, .step_tokens = 64, .spec = LM_SPEC_DRAFT, .spec_model = draft };
    if (lm_engine_create(&en, m, &o, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        goto done;
    }
    int prompt_tokens = 0;
    for (int k = 0; k < 8; k++) {
        lm_tu_collect c;
        lm_tu_collect_init(&c);
        lm_request *r = NULL;
        lm_gen_params p = { .sampling = { .top_p = 1 }, .repetition_penalty = 1, .max_tokens = 12 };
        const int n = 60 + 10 * k;
        int32_t alone[12];
        LM_REQUIRE(lm_engine_submit(en, prompt + k, n, &p, lm_tu_collect_on_token, &c, &r, &e) == LM_ENGINE_OK);
        lm_tu_collect_wait(&c);
        LM_CHECK(lm_tu_greedy_alone(m, prompt + k, n, 12, alone) == 0 && c.n == 12 &&
                 !memcmp(alone, c.toks, sizeof alone));
        prompt_tokens += n;
        lm_request_release(r);
        lm_tu_collect_destroy(&c);
    }
    lm_engine_stats st;
    lm_tu_engine_settled(en, &st);
    printf("  8 requests, %d prompt tokens: the draft fed %llu tokens, %llu verifies\n", prompt_tokens,
           (unsigned long long)st.spec_model_tokens, (unsigned long long)st.spec_verifies);
    LM_CHECK(st.spec_model_tokens > 0 && st.spec_model_tokens < (uint64_t)prompt_tokens / 4);
done:
    lm_engine_free(en);
    lm_model_free(m);
    if (be) lm_backend_destroy(be);
    free(dir), free(draft);
}
