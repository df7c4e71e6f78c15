/* test_guard_sampling.c - sampling filters at their boundaries, temperature,
 * and the OpenAI / Hugging Face penalties against an independent reading of
 * their definitions (issue #25's mutation list: nothing checked a penalty's
 * sign or a filter's boundary).
 *
 * Design.
 *  - The sampler on tiny distributions whose probabilities are exact in
 *    float (equal logits): top_p keeps the smallest prefix whose mass
 *    reaches p (a tie at exactly p keeps one token, not two); temperature
 *    divides the logits (T = 2 turns probabilities 1:2:4 into 1:1.41:2);
 *    top_k renormalises what it keeps. Counts of 40,000 draws against the
 *    expected frequencies, 6 standard deviations wide.
 *  - Penalties: the demo model (CPU) through the engine, and the same prompt
 *    through lm_runner with the penalties applied here as the APIs define
 *    them: presence subtracts p once from every token generated so far,
 *    frequency subtracts f x its count (OpenAI); repetition divides positive
 *    and multiplies negative logits of every token in the prompt or
 *    generated (Hugging Face / CTRL). Greedy (a step where the expected top
 *    two are closer than 1e-3 ends the comparison, at least 16 of 32 must
 *    compare) and sampled at temperature 1.5 with the engine's sampler and
 *    seed (all 32 steps), the engine's tokens must be these. Each penalty
 *    must change the answer, and in the sampled runs the reference with the
 *    typical mistake (presence's sign, frequency without the count,
 *    repetition dividing negative logits) must give other tokens: the test
 *    provably tells them apart. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_engine.h"
#include "engine/lm_runner.h"
#include "engine/lm_sampler.h"
#include "guard_util.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "test_util.h"

/* ---- the sampler ---- */

static void draws(const lm_sampler_params *p, const float *logits, int n, int times, int *counts) {
    lm_sampler *s = lm_sampler_create(p, n);
    memset(counts, 0, (size_t)n * sizeof *counts);
    for (int i = 0; i < times; i++) counts[lm_sample(s, logits)]++;
    lm_sampler_free(s);
}

/* counts[i] within 6 sigma of times * want[i] */
static void expect_freq(lm_test_ctx *lm_t_, const char *what, const int *counts, const double *want, int n, int times) {
    for (int i = 0; i < n; i++) {
        double mu = want[i] * times, sd = sqrt(times * want[i] * (1 - want[i]));
        LM_CHECK_MSG(fabs(counts[i] - mu) <= 6 * sd + (want[i] == 0 ? 0 : 1), "%s: token %d drawn %d times, expected %.0f",
                     what, i, counts[i], mu);
    }
}

LM_TEST(guard_sampler_top_p_boundary_and_temperature) {
    enum { N = 40000 };
    int c[4];
    /* two equal tokens (0.5 each, exact): top_p 0.5 is reached by the first */
    const float two[4] = { 0, 0, -INFINITY, -INFINITY };
    lm_sampler_params p = { .temperature = 1, .top_p = 0.5f, .seed = 3 };
    draws(&p, two, 4, N, c);
    LM_CHECK_MSG(c[0] == N, "top_p 0.5 over {0.5, 0.5}: %d / %d", c[0], c[1]);
    /* four equal tokens: 0.75 is reached by three */
    const float four[4] = { 0, 0, 0, 0 };
    p.top_p = 0.75f;
    draws(&p, four, 4, N, c);
    expect_freq(lm_t_, "top_p 0.75 over 4 x 0.25", c, (const double[]){ 1 / 3.0, 1 / 3.0, 1 / 3.0, 0 }, 4, N);
    p.top_p = 0.76f;
    draws(&p, four, 4, N, c);
    expect_freq(lm_t_, "top_p 0.76 over 4 x 0.25", c, (const double[]){ 0.25, 0.25, 0.25, 0.25 }, 4, N);
    /* temperature 2 on probabilities 1:2:4 gives 1 : sqrt 2 : 2 */
    const float lg[4] = { 0, logf(2), logf(4), -INFINITY };
    p = (lm_sampler_params){ .temperature = 2, .top_p = 1, .seed = 4 };
    draws(&p, lg, 4, N, c);
    double z = 1 + sqrt(2.0) + 2;
    expect_freq(lm_t_, "temperature 2", c, (const double[]){ 1 / z, sqrt(2.0) / z, 2 / z, 0 }, 4, N);
    /* and 0.5 squares them: 1:4:16 */
    p.temperature = 0.5f;
    draws(&p, lg, 4, N, c);
    expect_freq(lm_t_, "temperature 0.5", c, (const double[]){ 1 / 21.0, 4 / 21.0, 16 / 21.0, 0 }, 4, N);
    /* top_k 2 keeps 2:4 and renormalises */
    p = (lm_sampler_params){ .temperature = 1, .top_k = 2, .top_p = 1, .seed = 5 };
    draws(&p, lg, 4, N, c);
    expect_freq(lm_t_, "top_k 2", c, (const double[]){ 0, 1 / 3.0, 2 / 3.0, 0 }, 4, N);
    /* min_p is relative to the top token: 0.3 x 4/7 keeps 2/7, drops 1/7 */
    p = (lm_sampler_params){ .temperature = 1, .top_p = 1, .min_p = 0.3f, .seed = 6 };
    draws(&p, lg, 4, N, c);
    expect_freq(lm_t_, "min_p 0.3", c, (const double[]){ 0, 1 / 3.0, 2 / 3.0, 0 }, 4, N);
}

/* ---- penalties through the engine ---- */

typedef struct pen {
    float presence, frequency, repetition;
} pen;

/* How the reference applies the penalties: as defined, or with one of the
 * mistakes the test must tell apart (to show that it can). */
enum { DEF, FREQ_ONCE, REP_NEG_DIVIDES, PRES_SIGN };

/* The tokens the definitions give for n steps, greedy (temperature 0) or
 * drawn with lm_sampler at the engine's temperature and seed (the engine
 * draws with the same sampler, so the draws are the same when the penalised
 * logits are). Greedy stops at the first near-tie (top two within 1e-3);
 * returns the number of steps to compare, -1 on error. Float arithmetic in
 * the engine's order: repetition first, then presence and frequency. */
static int expected_tokens(lm_model *m, const int32_t *prompt, int n_prompt, pen q, const lm_sampler_params *sp,
                           int variant, int n, int32_t *out) {
    const int V = m->cfg.vocab;
    lm_runner *r = NULL;
    if (lm_runner_create(&r, m, n_prompt + n + 1, 0, NULL)) return -1;
    float *lg = malloc((size_t)V * sizeof *lg);
    int *count = calloc((size_t)V, sizeof *count);
    char *seen = calloc((size_t)V, 1);
    lm_sampler *smp = lm_sampler_create(sp, V);
    for (int i = 0; i < n_prompt; i++) seen[prompt[i]] = 1;
    int safe = -1;
    if (lm_runner_eval(r, prompt, n_prompt, false, lg, NULL) == 0) {
        safe = 0;
        for (int s = 0; s < n; s++) {
            for (int v = 0; v < V; v++) {
                float x = lg[v], rp = q.repetition;
                if (rp != 1 && seen[v]) x = x > 0 || variant == REP_NEG_DIVIDES ? x / rp : x * rp;
                if (count[v]) {
                    float pres = variant == PRES_SIGN ? -q.presence : q.presence;
                    x -= pres + q.frequency * (variant == FREQ_ONCE ? 1.0f : (float)count[v]);
                }
                lg[v] = x;
            }
            int best;
            if (sp->temperature > 0) {
                best = lm_sample(smp, lg);
            } else {
                best = 0;
                for (int v = 1; v < V; v++)
                    if (lg[v] > lg[best]) best = v;
                float second = -INFINITY;
                for (int v = 0; v < V; v++)
                    if (v != best && lg[v] > second) second = lg[v];
                if (lg[best] - second < 1e-3f) break;
            }
            out[s] = best;
            safe = s + 1;
            count[best]++;
            seen[best] = 1;
            if (lm_runner_eval(r, &out[s], 1, false, lg, NULL)) break;
        }
    }
    lm_sampler_free(smp);
    free(lg);
    free(count);
    free(seen);
    lm_runner_free(r);
    return safe;
}

LM_TEST(guard_penalties_match_definitions) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    if (lm_model_load(&m, gu_demo_dir(), be, &e)) {
        lm_backend_destroy(be);
        LM_CHECK_MSG(false, "%s", e.msg);
        return;
    }
    /* the demo reference's 64-token code prompt: its answer repeats itself,
     * so every penalty changes it */
    gu_ref ref;
    char why[900];
    if (gu_ref_load(gu_demo_dir(), 1, &ref, why, sizeof why)) {
        LM_CHECK_MSG(false, "%s", why);
        lm_model_free(m);
        lm_backend_destroy(be);
        return;
    }
    const int32_t *prompt = ref.ids;
    const int n_prompt = ref.n_ids;
    enum { GEN = 32 };
    static const struct {
        pen q;
        int teeth; /* the mistake this case must be able to tell apart */
    } cases[] = {
        { { 0, 0, 1 }, DEF },          { { 1.5f, 0, 1 }, PRES_SIGN },   { { 0, 0.7f, 1 }, FREQ_ONCE },
        { { 0, 0, 1.3f }, REP_NEG_DIVIDES }, { { 0.4f, 0.3f, 1.2f }, PRES_SIGN }, { { -0.8f, 0, 1 }, PRES_SIGN },
    };
    lm_engine_opts o = { .ctx = 160, .parallel = 1, .warmup = -1 };
    for (int sampled = 0; sampled < 2; sampled++) {
        /* sampled at temperature 1.5: tokens far from the top (negative
         * logits, repeated low-probability ones) are drawn, so every detail
         * of a penalty moves the draws */
        lm_sampler_params sp = { .temperature = sampled ? 1.5f : 0, .top_p = 1, .seed = 1234 };
        int32_t plain[GEN] = { 0 };
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            int32_t want[GEN], wrong[GEN];
            int safe = expected_tokens(m, prompt, n_prompt, cases[k].q, &sp, DEF, GEN, want);
            lm_engine *en = NULL;
            LM_REQUIRE(lm_engine_create(&en, m, &o, &e) == 0);
            lm_tu_collect c;
            lm_tu_collect_init(&c);
            lm_gen_params p = { 0 };
            p.sampling = sp;
            p.presence_penalty = cases[k].q.presence;
            p.frequency_penalty = cases[k].q.frequency;
            p.repetition_penalty = cases[k].q.repetition;
            p.max_tokens = GEN;
            lm_request *req = NULL;
            LM_REQUIRE(lm_engine_submit(en, prompt, n_prompt, &p, lm_tu_collect_on_token, &c, &req, &e) ==
                       LM_ENGINE_OK);
            lm_tu_collect_wait(&c);
            lm_request_release(req);
            lm_engine_free(en);
            int same = 0;
            while (same < safe && same < c.n && c.toks[same] == want[same]) same++;
            printf("  %s presence %.1f frequency %.1f repetition %.1f: %d of %d steps as defined\n",
                   sampled ? "sampled" : "greedy ", cases[k].q.presence, cases[k].q.frequency, cases[k].q.repetition, same,
                   safe);
            LM_CHECK_MSG(safe >= (sampled ? GEN : 16), "only %d steps to compare", safe);
            LM_CHECK_MSG(same == safe, "case %zu: the engine departs from the definition at step %d (got %d, want %d)", k,
                         same, same < c.n ? c.toks[same] : -1, want[same < safe ? same : 0]);
            if (k == 0) {
                memcpy(plain, c.toks, sizeof plain);
            } else {
                LM_CHECK_MSG(memcmp(plain, c.toks, sizeof plain) != 0, "case %zu changes nothing: no teeth", k);
                if (sampled) { /* the reference itself tells the right rule from the wrong one */
                    int nw = expected_tokens(m, prompt, n_prompt, cases[k].q, &sp, cases[k].teeth, GEN, wrong);
                    LM_CHECK_MSG(nw == GEN && memcmp(want, wrong, sizeof want) != 0,
                                 "case %zu: the mistake %d gives the same tokens: no teeth", k, cases[k].teeth);
                }
            }
            lm_tu_collect_destroy(&c);
        }
    }
    gu_ref_free(&ref);
    lm_model_free(m);
    lm_backend_destroy(be);
}
