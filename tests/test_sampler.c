/* test_sampler.c - the sampler draws from the distribution it is given, its
 * filters cut what they should, and a seed fixes the draws. */
#include <math.h>
#include <string.h>

#include "backend/lm_backend.h"
#include "engine/lm_sampler.h"
#include "lm_test.h"

static void draw(const lm_sampler_params *p, int n, int counts[3]) {
    const float logits[3] = { 0.0f, logf(2.0f), logf(4.0f) }; /* probabilities 1/7, 2/7, 4/7 */
    lm_sampler *s = lm_sampler_create(p, 3);
    memset(counts, 0, 3 * sizeof(int));
    for (int i = 0; i < n; i++) counts[lm_sample(s, logits)]++;
    lm_sampler_free(s);
}

LM_TEST(sampler_frequencies_and_filters) {
    int c[3];
    lm_sampler_params p = { .temperature = 1.0f, .top_p = 1.0f, .seed = 11 };
    draw(&p, 70000, c);
    /* 10,000 / 20,000 / 40,000 expected; 5 % is over 10 standard deviations */
    LM_CHECK_NEAR(c[0], 10000, 500);
    LM_CHECK_NEAR(c[1], 20000, 1000);
    LM_CHECK_NEAR(c[2], 40000, 2000);
    /* the sorted path (a filter that keeps everything) draws the same distribution */
    p.top_k = 3;
    draw(&p, 70000, c);
    LM_CHECK_NEAR(c[0], 10000, 500);
    LM_CHECK_NEAR(c[2], 40000, 2000);
    p.top_k = 2; /* drops the least likely */
    draw(&p, 6000, c);
    LM_CHECK(c[0] == 0 && c[1] > 1500 && c[2] > 3500);
    p.top_k = 0;
    p.top_p = 0.5f; /* the top token alone holds 4/7 > 0.5 */
    draw(&p, 1000, c);
    LM_CHECK(c[2] == 1000);
    p.top_p = 1.0f;
    p.min_p = 0.4f; /* keeps tokens with p >= 0.4 * 4/7: drops 1/7 */
    draw(&p, 6000, c);
    LM_CHECK(c[0] == 0 && c[1] > 0 && c[2] > 0);
    p.min_p = 0;
    p.temperature = 0; /* greedy */
    draw(&p, 100, c);
    LM_CHECK(c[2] == 100);
}

LM_TEST(sampler_seed_repeats) {
    float logits[50];
    for (int i = 0; i < 50; i++) logits[i] = sinf((float)i);
    lm_sampler_params p = { .temperature = 0.9f, .top_p = 1.0f, .seed = 5 };
    lm_sampler *a = lm_sampler_create(&p, 50), *b = lm_sampler_create(&p, 50);
    p.seed = 6;
    lm_sampler *c = lm_sampler_create(&p, 50);
    int same = 1, differs = 0;
    for (int i = 0; i < 200; i++) {
        int x = lm_sample(a, logits), y = lm_sample(b, logits), z = lm_sample(c, logits);
        same &= x == y;
        differs |= x != z;
    }
    LM_CHECK(same && differs);
    lm_sampler_free(a);
    lm_sampler_free(b);
    lm_sampler_free(c);
}

/* lm_argmax: the first index of the largest value; NaN never wins (and NaN
 * at index 0 answers 0, as a plain "x[i] > x[best]" scan would); also
 * through the CPU backend's argmax_rows, the engine's greedy path. */
LM_TEST(argmax_first_max_nan_never_wins) {
    float a[21];
    for (int i = 0; i < 21; i++) a[i] = (float)(i % 7);
    LM_CHECK(lm_argmax(a, 21) == 6); /* 6 at 6, 13, 20: the first */
    a[3] = NAN;
    a[9] = 50.0f;
    LM_CHECK(lm_argmax(a, 21) == 9);
    a[0] = NAN;
    LM_CHECK(lm_argmax(a, 21) == 0);
    float inf[5] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    LM_CHECK(lm_argmax(inf, 5) == 0);
    float neg[3] = { -1.0f, -0.5f, -0.5f };
    LM_CHECK(lm_argmax(neg, 3) == 1);
    LM_CHECK(lm_argmax(neg, 1) == 0);
    lm_backend *be = lm_cpu_backend_create(1, LM_ISA_AUTO, NULL);
    LM_REQUIRE(be != NULL);
    float rows[2][3] = { { 1, 3, 3 }, { 9, -1, 2 } };
    lm_tensor t = { .type = LM_F32, .rows = 2, .cols = 3, .data = rows };
    int32_t ids[2] = { -1, -1 };
    be->ops->argmax_rows(be, ids, &t);
    LM_CHECK(ids[0] == 1 && ids[1] == 0);
    lm_backend_destroy(be);
}

/* Greedy under a grammar mask: the first allowed id of the largest logit,
 * never a refused one (even where every allowed logit is -inf or NaN), and
 * the same id whether the sampler takes the greedy shortcut or goes
 * through a logit bias of 0 (the copying path). */
LM_TEST(sampler_masked_greedy) {
    enum { V = 70 };
    float x[V];
    for (int v = 0; v < V; v++) x[v] = (float)(v % 10);
    uint32_t allow[3] = { 0, 0, 0 };
    const int ok[] = { 2, 13, 33, 39, 64, 69 }; /* logits 2, 3, 3, 9, 4, 9 */
    for (size_t i = 0; i < LM_COUNT(ok); i++) allow[ok[i] >> 5] |= 1u << (ok[i] & 31);
    lm_sampler_params p = { .temperature = 0, .top_p = 1 };
    lm_sampler *s = lm_sampler_create(&p, V), *b = lm_sampler_create(&p, V);
    lm_logit_bias zero = { .token = 0, .bias = 0 };
    lm_sampler_adjust(b, &(lm_logit_adjust){ .bias = &zero, .n_bias = 1, .repetition_penalty = 1 }, NULL, 0);
    LM_REQUIRE(lm_sampler_plain_greedy(s) && !lm_sampler_plain_greedy(b));
    float work[V];
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 39 && lm_sample_masked(b, x, work, allow) == 39);
    x[39] = NAN; /* NaN never wins: the next 9 */
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 69);
    for (size_t i = 0; i < LM_COUNT(ok); i++) x[ok[i]] = -INFINITY;
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 2); /* the first allowed, not id 0 */
    lm_sampler_free(s);
    lm_sampler_free(b);
}
