/* test_sampler.c - the sampler draws from the distribution it is given, its
 * filters cut what they should, and a seed fixes the draws. */
#include <math.h>
#include <stdlib.h>
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
    x[0] = x[40] = 100.0f; /* refused ids, whatever their logits */
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 39 && lm_sample_masked(b, x, work, allow) == 39);
    x[0] = 0.0f, x[40] = 0.0f;
    x[39] = NAN; /* NaN never wins: the next 9 */
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 69);
    x[39] = 9.0f, x[69] = NAN; /* nor as the last allowed id */
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 39);
    for (size_t i = 0; i < LM_COUNT(ok); i++) x[ok[i]] = -INFINITY;
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 2); /* the first allowed, not id 0 */
    /* words that allow all 32 ids are read as spans; a last word's bits
     * past the vocabulary are ignored */
    for (int v = 0; v < V; v++) x[v] = (float)(v % 10);
    allow[0] = allow[1] = ~0u, allow[2] = 1u << 5; /* ids 0-63 and 69 */
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 9 && lm_sample_masked(b, x, work, allow) == 9);
    x[9] = NAN;
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 19);
    x[40] = 50.0f;
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 40);
    x[63] = 55.0f; /* a span's last id */
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 63);
    allow[2] = ~0u; /* ids 64-95: only 64-69 exist */
    x[69] = 60.0f;
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 69);
    for (int v = 0; v < V; v++) x[v] = -INFINITY;
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 0);
    allow[0] = 0;
    LM_CHECK(lm_sample_masked(s, x, work, allow) == 32);
    lm_sampler_free(s);
    lm_sampler_free(b);
}

static const float *ref_prob;

static int ref_desc(const void *x, const void *y) {
    const int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    if (ref_prob[a] != ref_prob[b]) return ref_prob[a] > ref_prob[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* The reference the filters must equal: every id sorted by probability
 * (ties by id), then top_k, top_p and min_p on that order (id order when
 * nothing filters). */
static int ref_kept(const float *prob, int n, const lm_sampler_params *p, int32_t *ids) {
    for (int i = 0; i < n; i++) ids[i] = i;
    if (p->top_k <= 0 && !(p->top_p > 0 && p->top_p < 1) && p->min_p <= 0) return n; /* no filter: id order */
    ref_prob = prob;
    qsort(ids, (size_t)n, sizeof *ids, ref_desc);
    int keep = n;
    if (p->top_k > 0 && p->top_k < keep) keep = p->top_k;
    if (p->top_p > 0 && p->top_p < 1) {
        double c = 0;
        for (int i = 0; i < keep; i++)
            if ((c += prob[ids[i]]) >= p->top_p) {
                keep = i + 1;
                break;
            }
    }
    if (p->min_p > 0) {
        int k = 1;
        while (k < keep && prob[ids[k]] >= p->min_p * prob[ids[0]]) k++;
        keep = k;
    }
    return keep;
}

/* The filters sort only the head of the distribution (a heap for top_k, a
 * threshold lowered until the head holds the answer): the same ids in the
 * same order as sorting every id, over peaked, flat and tied logits and
 * every combination of the filters. */
LM_TEST(sampler_filters_match_full_sort) {
    enum { V = 3000 };
    static float x[V], p_got[V], prob[V];
    static int32_t got[V], want[V];
    uint64_t z = 7;
    const int top_ks[] = { 0, 1, 7, 40, 1500, 2999, 5000 };
    const float top_ps[] = { 1, 0.3f, 0.9f, 0.999f }, min_ps[] = { 0, 0.01f, 0.5f }, temps[] = { 0.3f, 1, 4 };
    int cases = 0, bad = 0;
    for (int shape = 0; shape < 3; shape++) {
        for (int v = 0; v < V; v++) {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            const double u = (double)(z >> 11) / 9007199254740992.0;
            x[v] = shape == 0 ? (float)(8 * u * u * u * u) /* peaked */
                 : shape == 1 ? (float)u                   /* flat */
                              : (float)((z >> 20) % 4);    /* four values: ties */
        }
        for (size_t a = 0; a < LM_COUNT(top_ks); a++)
            for (size_t b = 0; b < LM_COUNT(top_ps); b++)
                for (size_t c = 0; c < LM_COUNT(min_ps); c++)
                    for (size_t d = 0; d < LM_COUNT(temps); d++) {
                        lm_sampler_params p = { .temperature = temps[d], .top_k = top_ks[a], .top_p = top_ps[b],
                                                .min_p = min_ps[c] };
                        lm_sampler *s = lm_sampler_create(&p, V);
                        const int n = lm_sampler_kept(s, x, got, p_got);
                        lm_sampler_free(s);
                        /* the sampler's softmax (its sum in one chain here, four there: the same floats) */
                        float mx = x[lm_argmax(x, V)];
                        double sum = 0;
                        for (int v = 0; v < V; v++) sum += (prob[v] = expf((x[v] - mx) / p.temperature));
                        for (int v = 0; v < V; v++) prob[v] = (float)(prob[v] / sum);
                        const int m = ref_kept(prob, V, &p, want);
                        const bool same = n == m && !memcmp(got, want, (size_t)n * sizeof *got);
                        if (!same && bad++ < 3)
                            LM_CHECK_MSG(0, "shape %d top_k %d top_p %g min_p %g T %g: %d ids against %d", shape,
                                         p.top_k, (double)p.top_p, (double)p.min_p, (double)p.temperature, n, m);
                        cases++;
                    }
    }
    LM_CHECK(cases > 0 && bad == 0);
}
