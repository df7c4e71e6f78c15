/* sampler.c - greedy, temperature, top-k, top-p and min-p sampling. */
#define _GNU_SOURCE /* qsort_r */
#include "lm_sampler.h"

#include <math.h>
#include <stdlib.h>

struct lm_sampler {
    lm_sampler_params p;
    int vocab;
    uint64_t rng;
    int32_t *idx;  /* [vocab] candidate ids */
    float *prob;   /* [vocab] */
};

lm_sampler *lm_sampler_create(const lm_sampler_params *p, int vocab) {
    lm_sampler *s = lm_xcalloc(1, sizeof *s);
    s->p = *p;
    s->vocab = vocab;
    s->rng = p->seed ^ 0x9E3779B97F4A7C15ull;
    s->idx = lm_xmalloc((size_t)vocab * sizeof(int32_t));
    s->prob = lm_xmalloc((size_t)vocab * sizeof(float));
    return s;
}

void lm_sampler_free(lm_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->prob);
    free(s);
}


/* splitmix64: small, fast, and good enough for drawing one number per token. */
static double next_uniform(lm_sampler *s) {
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int by_prob_desc(const void *a, const void *b, void *ctx) {
    const float *p = ctx;
    float x = p[*(const int32_t *)a], y = p[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

bool lm_sampler_greedy(const lm_sampler *s) { return s->p.temperature <= 0; }

int lm_sample(lm_sampler *s, const float *logits) {
    if (s->p.temperature <= 0) return lm_argmax(logits, s->vocab);
    int n = s->vocab;
    float maxv = logits[lm_argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = expf((logits[i] - maxv) / s->p.temperature);
        sum += s->prob[i];
        s->idx[i] = i;
    }
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (s->p.top_k <= 0 && !(s->p.top_p > 0 && s->p.top_p < 1) && s->p.min_p <= 0) {
        /* no filter: draw from the whole distribution without sorting it */
        double r = next_uniform(s), c = 0;
        for (int i = 0; i < n; i++) {
            c += s->prob[i];
            if (r < c) return i;
        }
        return lm_argmax(s->prob, n);
    }
    qsort_r(s->idx, (size_t)n, sizeof(int32_t), by_prob_desc, s->prob);
    int keep = n;
    if (s->p.top_k > 0 && s->p.top_k < keep) keep = s->p.top_k;
    if (s->p.top_p > 0 && s->p.top_p < 1) {
        double c = 0;
        for (int i = 0; i < keep; i++) {
            c += s->prob[s->idx[i]];
            if (c >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0) {
        float floor_p = s->p.min_p * s->prob[s->idx[0]];
        int k = 1;
        while (k < keep && s->prob[s->idx[k]] >= floor_p) k++;
        keep = k;
    }
    double total = 0;
    for (int i = 0; i < keep; i++) total += s->prob[s->idx[i]];
    double r = next_uniform(s) * total, c = 0;
    for (int i = 0; i < keep; i++) {
        c += s->prob[s->idx[i]];
        if (r < c) return s->idx[i];
    }
    return s->idx[keep - 1];
}
