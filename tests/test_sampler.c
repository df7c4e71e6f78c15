/* test_sampler.c - the sampler draws from the distribution it is given, its
 * filters cut what they should, and a seed fixes the draws. */
#include <math.h>
#include <string.h>

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
