/* test_guard_logprobs.c - logprobs are log_softmax of the model's logits
 * (issue #25: a wrong log-sum-exp went unnoticed because no test compared the
 * values with anything but themselves).
 *
 * Design. The reference is transformers' own logits for each greedy step
 * (prompt{i}.greedy_logits of a model folder's reference.safetensors); its
 * log_softmax, computed here in double, is what the engine must report for
 * the chosen token and for its top 20 alternatives (ids by value: the k-th
 * reported alternative must have the k-th largest reference logprob, which
 * tolerates near-ties swapping places, never a wrong set).
 *
 *  - engine level: lm_engine_submit with logprobs and top_logprobs 20 on the
 *    CPU (the tolerance below is what the CPU paths achieve);
 *  - HTTP /v1/completions: the same prompt ids, logprobs 5, through the real
 *    server (demo model): token_logprobs and the values of top_logprobs;
 *  - HTTP /v1/chat/completions: its logprobs.content (token, logprob,
 *    top_logprobs) equal the completions route's for the same rendered
 *    prompt, so the chat formatting is checked against the verified numbers.
 *
 * Tolerance. Measured max |reported - reference| over the 24 greedy steps
 * (chosen token; top 20 alternatives), CPU: demo 1.9e-6; 1.1e-5 (AVX-512)
 * and 2.8e-6; 8.4e-6 (scalar); qwen3 6.0e-7; 7.4e-7; llama 6.0e-7; 8.5e-7;
 * the HTTP route 1.9e-6. LM_GUARD_LP_TOL is 1e-4: 9x the worst of these, and
 * thousands of times below what a log-sum-exp mistake
 * moves (0.5 log(sum) is ~3-4 nats on these vocabularies). */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_engine.h"
#include "guard_util.h"
#include "lm_test.h"
#include "model/lm_model.h"

#define LM_GUARD_LP_TOL 1e-4
#define GUARD_TOP 20

typedef struct lp_step {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[GUARD_TOP];
    float top_lp[GUARD_TOP];
} lp_step;

typedef struct lp_collect {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lp_step steps[64];
    int n;
    bool done;
    lm_finish finish;
} lp_collect;

static void lp_on_token(void *user, const lm_token_event *ev) {
    lp_collect *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->has_token && c->n < 64) {
        lp_step *s = &c->steps[c->n++];
        s->token = ev->token;
        s->logprob = ev->logprob;
        s->n_top = ev->n_top;
        for (int k = 0; k < ev->n_top && k < GUARD_TOP; k++) {
            s->top_ids[k] = ev->top_ids[k];
            s->top_lp[k] = ev->top_logprobs[k];
        }
    }
    if (ev->done) {
        c->done = true;
        c->finish = ev->finish;
    }
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int by_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

/* The k largest values of ls [n], descending, into top [k]. */
static void top_values(const double *ls, int n, int k, double *top) {
    double *tmp = malloc((size_t)n * sizeof *tmp);
    memcpy(tmp, ls, (size_t)n * sizeof *tmp);
    qsort(tmp, (size_t)n, sizeof *tmp, by_desc);
    memcpy(top, tmp, (size_t)k * sizeof *top);
    free(tmp);
}

static void engine_case(lm_test_ctx *lm_t_, const char *dir, lm_cpu_isa isa) {
    gu_ref ref;
    char why[900];
    if (gu_ref_load(dir, 1, &ref, why, sizeof why)) { /* the folder is there: a missing reference is a failure */
        LM_CHECK_MSG(false, "%s", why);
        return;
    }
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(2, isa, &e);
    if (!be) {
        gu_ref_free(&ref);
        LM_SKIP("%s backend unavailable: %s", lm_cpu_isa_name(isa), e.msg);
    }
    lm_model *m = NULL;
    lm_engine *en = NULL;
    if (lm_model_load(&m, dir, be, &e)) {
        LM_CHECK_MSG(false, "%s", e.msg);
        goto out;
    }
    LM_CHECK(m->cfg.vocab == ref.vocab);
    lm_engine_opts o = { .ctx = ref.n_ids + ref.n_greedy + 8, .parallel = 1, .warmup = -1 };
    LM_REQUIRE(lm_engine_create(&en, m, &o, &e) == 0);
    lp_collect c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    lm_gen_params p = { 0 };
    p.sampling.top_p = 1;
    p.repetition_penalty = 1;
    p.max_tokens = ref.n_greedy;
    p.logprobs = true;
    p.top_logprobs = GUARD_TOP;
    lm_request *req = NULL;
    LM_REQUIRE(lm_engine_submit(en, ref.ids, ref.n_ids, &p, lp_on_token, &c, &req, &e) == LM_ENGINE_OK);
    pthread_mutex_lock(&c.mu);
    while (!c.done) pthread_cond_wait(&c.cv, &c.mu);
    pthread_mutex_unlock(&c.mu);
    lm_request_release(req);

    int V = ref.vocab, compared = 0;
    double *ls = malloc((size_t)V * sizeof *ls), top[GUARD_TOP], err = 0, err_top = 0;
    for (int i = 0; i < c.n && i < ref.n_greedy; i++) {
        const lp_step *s = &c.steps[i];
        gu_log_softmax(ref.greedy_logits + (size_t)i * (size_t)V, V, ls);
        top_values(ls, V, GUARD_TOP, top);
        if (s->token != ref.greedy[i]) {
            /* a different greedy choice is only allowed on a near-tie */
            LM_CHECK_MSG(fabs(ls[s->token] - top[0]) <= LM_GUARD_LP_TOL, "step %d: token %d, reference %d (gap %.3g)", i,
                         s->token, ref.greedy[i], top[0] - ls[s->token]);
            break;
        }
        err = fmax(err, fabs(s->logprob - ls[s->token]));
        LM_CHECK_MSG(s->n_top == GUARD_TOP, "step %d: %d alternatives", i, s->n_top);
        for (int k = 0; k < s->n_top && k < GUARD_TOP; k++) {
            err_top = fmax(err_top, fabs(s->top_lp[k] - ls[s->top_ids[k]]));
            err_top = fmax(err_top, fabs(s->top_lp[k] - top[k])); /* the k-th largest, in order */
        }
        compared++;
    }
    printf("  %s (%s): %d steps; max |logprob - ref| %.3g, top-%d %.3g (tolerance %g)\n", dir, be->name, compared, err,
           GUARD_TOP, err_top, LM_GUARD_LP_TOL);
    LM_CHECK_MSG(compared >= 12, "only %d of %d steps compared", compared, ref.n_greedy);
    LM_CHECK(err <= LM_GUARD_LP_TOL);
    LM_CHECK(err_top <= LM_GUARD_LP_TOL);
    free(ls);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
out:
    lm_engine_free(en);
    lm_model_free(m);
    lm_backend_destroy(be);
    gu_ref_free(&ref);
}

static void fixture_case(lm_test_ctx *lm_t_, const char *name, lm_cpu_isa isa) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    engine_case(lm_t_, dir, isa);
    free(dir);
}

LM_TEST(guard_logprobs_engine_demo) { engine_case(lm_t_, gu_demo_dir(), LM_ISA_AUTO); }
LM_TEST(guard_logprobs_engine_demo_scalar) {
    if (GU_SANITIZED) LM_SKIP("sanitizer build: the scalar path's numbers are checked by the release build");
    engine_case(lm_t_, gu_demo_dir(), LM_ISA_SCALAR);
}
LM_TEST(guard_logprobs_engine_qwen3) { fixture_case(lm_t_, "qwen3", LM_ISA_AUTO); }
LM_TEST(guard_logprobs_engine_llama) { fixture_case(lm_t_, "llama", LM_ISA_AUTO); }

/* ---- through the server ---- */

/* Completions with the reference prompt ids: token_logprobs and the top-5
 * values against the reference; then chat against completions. */
LM_TEST(guard_logprobs_http_demo) {
    gu_ref ref;
    char why[900];
    if (gu_ref_load(gu_demo_dir(), 1, &ref, why, sizeof why)) {
        LM_CHECK_MSG(false, "%s", why);
        return;
    }
    gu_server s;
    /* an f32 KV cache: the reference's logprobs are f32's, to 1e-4 */
    if (gu_server_start(&s, gu_demo_dir(), "--threads 2 --cache-ram 0 --kv-type f32")) {
        gu_server_dump_log(&s);
        gu_ref_free(&ref);
        LM_REQUIRE(!"the demo server started");
    }
    json_t *ids = json_array();
    for (int i = 0; i < ref.n_ids; i++) json_array_append_new(ids, json_integer(ref.ids[i]));
    json_t *req = json_pack("{s:o,s:i,s:f,s:i}", "prompt", ids, "max_tokens", ref.n_greedy, "temperature", 0.0, "logprobs", 5);
    char *body = json_dumps(req, 0);
    gu_resp r;
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/completions", body, NULL, &r) == 0);
    LM_CHECK_MSG(r.status == 200, "%d %s", r.status, r.body);
    json_t *j = gu_json(&r);
    json_t *u = json_object_get(j, "usage");
    LM_CHECK_MSG(json_integer_value(json_object_get(u, "prompt_tokens")) == ref.n_ids &&
                     json_integer_value(json_object_get(u, "completion_tokens")) == ref.n_greedy &&
                     json_integer_value(json_object_get(u, "total_tokens")) == ref.n_ids + ref.n_greedy,
                 "usage %s", r.body);
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *tlp = json_object_get(lp, "token_logprobs"), *tops = json_object_get(lp, "top_logprobs");
    int n = (int)json_array_size(tlp), V = ref.vocab, compared = 0;
    LM_CHECK_MSG(n == ref.n_greedy && (int)json_array_size(tops) == n, "%d token logprobs, %zu top entries", n,
                 json_array_size(tops));
    double *ls = malloc((size_t)V * sizeof *ls), top[5], err = 0;
    for (int i = 0; i < n && i < ref.n_greedy; i++) {
        gu_log_softmax(ref.greedy_logits + (size_t)i * (size_t)V, V, ls);
        top_values(ls, V, 5, top);
        double got = json_number_value(json_array_get(tlp, (size_t)i));
        /* greedy: the chosen token is the top one (the reference's, up to near-ties) */
        err = fmax(err, fabs(got - top[0]));
        json_t *t = json_array_get(tops, (size_t)i);
        double vals[5];
        int nv = 0;
        const char *k;
        json_t *v;
        json_object_foreach(t, k, v) if (nv < 5) vals[nv++] = json_number_value(v);
        /* keys are token texts: two tokens with one text share a key, so
         * only the values present are compared, in order */
        qsort(vals, (size_t)nv, sizeof *vals, by_desc);
        LM_CHECK_MSG(nv >= 4, "step %d: %d alternatives", i, nv);
        for (int q = 0; q < nv; q++) {
            bool found = false;
            for (int w = 0; w < 5 && !found; w++) found = fabs(vals[q] - top[w]) <= LM_GUARD_LP_TOL;
            LM_CHECK_MSG(found, "step %d: alternative logprob %.6f is not among the reference's top 5 (%.6f .. %.6f)", i,
                         vals[q], top[0], top[4]);
        }
        compared++;
    }
    printf("  completions: %d steps, max |token logprob - ref| %.3g\n", compared, err);
    LM_CHECK(err <= LM_GUARD_LP_TOL);
    LM_CHECK(compared == ref.n_greedy);
    json_decref(j);
    gu_resp_free(&r);
    free(body);
    json_decref(req);

    /* chat: the same numbers as completions on the rendered prompt */
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Write a Python function `add`.\"}],"
                       "\"max_tokens\":10,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":3,"
                       "\"logit_bias\":{\"0\":-100,\"2\":-100}}";
    const char *cmpl = "{\"prompt\":\"<|im_start|>user\\nWrite a Python function `add`.<|im_end|>\\n<|im_start|>assistant\\n\","
                       "\"max_tokens\":10,\"temperature\":0,\"logprobs\":3,\"logit_bias\":{\"0\":-100,\"2\":-100}}";
    gu_resp rc, rp;
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", chat, NULL, &rc) == 0);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/completions", cmpl, NULL, &rp) == 0);
    LM_CHECK_MSG(rc.status == 200 && rp.status == 200, "%d %s / %d %s", rc.status, rc.body, rp.status, rp.body);
    json_t *jc = gu_json(&rc), *jp = gu_json(&rp);
    LM_CHECK(json_integer_value(json_object_get(json_object_get(jc, "usage"), "prompt_tokens")) ==
             json_integer_value(json_object_get(json_object_get(jp, "usage"), "prompt_tokens")));
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(jc, "choices"), 0), "logprobs"), "content");
    json_t *plp = json_object_get(json_array_get(json_object_get(jp, "choices"), 0), "logprobs");
    json_t *ptok = json_object_get(plp, "tokens"), *pval = json_object_get(plp, "token_logprobs");
    LM_CHECK_MSG(json_array_size(content) == 10 && json_array_size(pval) == 10, "chat %zu, completions %zu logprobs",
                 json_array_size(content), json_array_size(pval));
    for (size_t i = 0; i < json_array_size(content) && i < json_array_size(pval); i++) {
        json_t *ent = json_array_get(content, i);
        double a = json_number_value(json_object_get(ent, "logprob")), b = json_number_value(json_array_get(pval, i));
        LM_CHECK_MSG(fabs(a - b) <= 1e-6 && a <= 0, "token %zu: chat logprob %.7f, completions %.7f", i, a, b);
        LM_CHECK_MSG(lm_streq(json_string_value(json_object_get(ent, "token")), json_string_value(json_array_get(ptok, i))),
                     "token %zu: chat '%s', completions '%s'", i, json_string_value(json_object_get(ent, "token")),
                     json_string_value(json_array_get(ptok, i)));
        json_t *alts = json_object_get(ent, "top_logprobs");
        LM_CHECK(json_array_size(alts) == 3);
        /* the first alternative of a greedy step is the chosen token */
        LM_CHECK(fabs(json_number_value(json_object_get(json_array_get(alts, 0), "logprob")) - a) <= 1e-6);
        for (size_t q = 1; q < json_array_size(alts); q++)
            LM_CHECK(json_number_value(json_object_get(json_array_get(alts, q), "logprob")) <=
                     json_number_value(json_object_get(json_array_get(alts, q - 1), "logprob")));
    }
    json_decref(jc);
    json_decref(jp);
    gu_resp_free(&rc);
    gu_resp_free(&rp);
    free(ls);
    gu_ref_free(&ref);
    int rc_ = gu_server_stop(&s);
    LM_CHECK_MSG(rc_ == 0, "server exit status %d", rc_);
}
