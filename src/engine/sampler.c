/* sampler.c - greedy, temperature, top-k, top-p and min-p sampling; a
 * request's logit bias and penalties; logprobs.
 *
 * The bias and penalties are applied to a copy of the logits in scratch the
 * caller owns (the engine has one [V] row for all its requests), so a
 * request costs two [V] arrays only when it uses penalties. */
#define _GNU_SOURCE /* qsort_r */
#include "lm_sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct lm_sampler {
    lm_sampler_params p;
    int vocab;
    uint64_t rng;
    int32_t *idx;  /* [vocab] candidate ids */
    int32_t *tmp;  /* [vocab] sort_by_prob's second buffer, made when first needed */
    float *prob;   /* [vocab] */
    int32_t top;   /* after probs(): an id of the largest probability */
    /* lm_sampler_adjust */
    lm_logit_adjust adj;   /* adj.bias: the owned copy below */
    lm_logit_bias *bias;   /* [n_bias] */
    int32_t *counts;       /* [vocab] accepted-token counts, only with penalties */
    uint8_t *seen;         /* [vocab] prompt + accepted tokens, only with penalties */
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
    free(s->tmp);
    free(s->prob);
    free(s->bias);
    free(s->counts);
    free(s->seen);
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

/* Whether id a comes before id b in by_prob_desc's order. */
static inline bool before(const float *p, int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

/* idx[0, k): the k first ids of by_prob_desc's order over n, sorted: a
 * heap of the best so far (its root the worst of them), one compare for
 * most ids. */
static void top_ids(const float *p, int n, int k, int32_t *idx) {
    int h = 0;
    for (int32_t i = 0; i < n; i++) {
        if (h == k && !before(p, i, idx[0])) continue;
        int at;
        if (h < k) { /* sift up from the end */
            for (at = h++; at > 0 && before(p, idx[(at - 1) / 2], i); at = (at - 1) / 2) idx[at] = idx[(at - 1) / 2];
        } else { /* replace the root, sift down */
            at = 0;
            for (;;) {
                int c = 2 * at + 1;
                if (c >= k) break;
                if (c + 1 < k && before(p, idx[c], idx[c + 1])) c++;
                if (!before(p, i, idx[c])) break;
                idx[at] = idx[c], at = c;
            }
        }
        idx[at] = i;
    }
    qsort_r(idx, (size_t)h, sizeof(int32_t), by_prob_desc, (void *)p);
}

/* s->idx[0, m) (ids in ascending order) into by_prob_desc's order. Many ids
 * (a top_p over a flat distribution keeps most of a 150k vocabulary: a
 * comparison sort took ~10 ms) go through a radix sort of the
 * probabilities' bits (non-negative floats order as their bits): three
 * stable passes of 11, 11 and 10 bits, each bucket placed from the largest
 * digit down, so ties keep the ids' ascending order. */
static void sort_by_prob(lm_sampler *s, int m) {
    if (m < 512) {
        qsort_r(s->idx, (size_t)m, sizeof(int32_t), by_prob_desc, s->prob);
        return;
    }
    if (!s->tmp) s->tmp = lm_xmalloc((size_t)s->vocab * sizeof(int32_t));
    int32_t *a = s->idx, *b = s->tmp;
    static const int shift[3] = { 0, 11, 22 };
    for (int pass = 0; pass < 3; pass++) {
        int32_t count[2048] = { 0 };
        const int sh = shift[pass];
        for (int i = 0; i < m; i++) {
            uint32_t u;
            memcpy(&u, &s->prob[a[i]], 4);
            count[(u >> sh) & 2047u]++;
        }
        int32_t at = 0; /* the start of each digit's run, largest digit first */
        for (int d = 2047; d >= 0; d--) {
            const int32_t c = count[d];
            count[d] = at, at += c;
        }
        for (int i = 0; i < m; i++) {
            uint32_t u;
            memcpy(&u, &s->prob[a[i]], 4);
            b[count[(u >> sh) & 2047u]++] = a[i];
        }
        int32_t *t = a;
        a = b, b = t;
    }
    if (a != s->idx) memcpy(s->idx, a, (size_t)m * sizeof(int32_t)); /* three passes end in tmp */
}

/* s->prob: the softmax of logits at the sampler's temperature. The sum
 * runs in four chains and the rows are scaled by its inverse: one chain of
 * double adds and a double division an id took ~0.4 ms of a 151k
 * vocabulary's ~0.9 (the probabilities agree to double precision before
 * their rounding to float). */
static void probs(lm_sampler *s, const float *logits) {
    const int n = s->vocab;
    s->top = lm_argmax(logits, n);
    const float maxv = logits[s->top];
    double sum[4] = { 0, 0, 0, 0 };
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) {
            s->prob[i + k] = expf((logits[i + k] - maxv) / s->p.temperature);
            sum[k] += s->prob[i + k];
        }
    for (; i < n; i++) {
        s->prob[i] = expf((logits[i] - maxv) / s->p.temperature);
        sum[0] += s->prob[i];
    }
    const double inv = 1.0 / ((sum[0] + sum[1]) + (sum[2] + sum[3]));
    for (i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] * inv);
}

static bool filtered(const lm_sampler *s) {
    return s->p.top_k > 0 || (s->p.top_p > 0 && s->p.top_p < 1) || s->p.min_p > 0;
}

/* The filters keep a prefix of the ids sorted by probability (by_prob_desc):
 * s->idx[0, keep), returns keep. Sorting a 150k vocabulary took ~20 ms a
 * token: a top_k up to 1024 is taken by a heap, otherwise only the ids at
 * or above a threshold are sorted (every other id is below all of them,
 * so their order is the full order's head), the threshold lowered until
 * that head holds the answer. */
static int filter_ids(lm_sampler *s) {
    const int n = s->vocab;
    const bool top_p = s->p.top_p > 0 && s->p.top_p < 1;
    int keep;
    if (s->p.top_k > 0 && s->p.top_k <= 1024 && s->p.top_k < n) { /* the k best; the rest is cut */
        top_ids(s->prob, n, s->p.top_k, s->idx);
        keep = s->p.top_k;
    } else {
        const float pmax = s->prob[s->top]; /* the largest logit's */
        for (float t = s->p.min_p > 0 ? s->p.min_p * pmax : pmax * 0.1f;; t = t > 1e-30f ? t * 0.1f : 0) {
            int m = 0;
            for (int i = 0; i < n; i++)
                if (t == 0 || s->prob[i] >= t) s->idx[m++] = i;
            sort_by_prob(s, m);
            keep = m;
            bool whole = m == n || (s->p.min_p > 0 && t <= s->p.min_p * pmax); /* min_p cuts all the rest */
            if (s->p.top_k > 0 && s->p.top_k <= keep) keep = s->p.top_k, whole = true;
            double c = 0;
            for (int i = 0; top_p && !whole && i < keep; i++) whole = (c += s->prob[s->idx[i]]) >= s->p.top_p;
            if (whole) break;
        }
    }
    if (top_p) {
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
    return keep;
}

int lm_sampler_kept(lm_sampler *s, const float *logits, int32_t *ids, float *p) {
    probs(s, logits);
    const int n = s->vocab, keep = filtered(s) ? filter_ids(s) : n;
    for (int i = 0; i < keep; i++) ids[i] = filtered(s) ? s->idx[i] : i, p[i] = s->prob[ids[i]];
    return keep;
}

int lm_sample(lm_sampler *s, const float *logits) {
    if (s->p.temperature <= 0) return lm_argmax(logits, s->vocab);
    const int n = s->vocab;
    probs(s, logits);
    if (!filtered(s)) {
        /* no filter: draw from the whole distribution without sorting it */
        double r = next_uniform(s), c = 0;
        for (int i = 0; i < n; i++) {
            c += s->prob[i];
            if (r < c) return i;
        }
        return s->top;
    }
    const int keep = filter_ids(s);
    double total = 0;
    for (int i = 0; i < keep; i++) total += s->prob[s->idx[i]];
    double r = next_uniform(s) * total, c = 0;
    for (int i = 0; i < keep; i++) {
        c += s->prob[s->idx[i]];
        if (r < c) return s->idx[i];
    }
    return s->idx[keep - 1];
}

/* ---- logit bias and penalties ---- */

static bool uses_penalties(const lm_logit_adjust *a) {
    return a->presence_penalty != 0 || a->frequency_penalty != 0 ||
           (a->repetition_penalty != 1 && a->repetition_penalty > 0);
}

void lm_sampler_adjust(lm_sampler *s, const lm_logit_adjust *a, const int32_t *prompt, int n_prompt) {
    LM_ASSERT(!s->bias && !s->counts);
    s->adj = *a;
    s->bias = lm_xmalloc((size_t)(a->n_bias + 1) * sizeof *s->bias);
    if (a->n_bias) memcpy(s->bias, a->bias, (size_t)a->n_bias * sizeof *s->bias);
    s->adj.bias = s->bias;
    if (uses_penalties(a)) {
        s->counts = lm_xcalloc((size_t)s->vocab, sizeof *s->counts);
        s->seen = lm_xcalloc((size_t)s->vocab, 1);
        for (int i = 0; i < n_prompt; i++) s->seen[prompt[i]] = 1;
    }
}

bool lm_sampler_plain_greedy(const lm_sampler *s) {
    return s->p.temperature <= 0 && s->adj.n_bias == 0 && !s->counts;
}

/* logits -> work with the bias and penalties applied; logits when none. */
static const float *adjusted(const lm_sampler *s, const float *logits, float *work) {
    if (s->adj.n_bias == 0 && !s->counts) return logits;
    memcpy(work, logits, (size_t)s->vocab * sizeof(float));
    for (int i = 0; i < s->adj.n_bias; i++) work[s->bias[i].token] += s->bias[i].bias;
    if (s->counts) {
        const float rp = s->adj.repetition_penalty;
        for (int v = 0; v < s->vocab; v++) {
            if (s->seen[v] && rp > 0 && rp != 1) work[v] = work[v] > 0 ? work[v] / rp : work[v] * rp;
            if (s->counts[v]) work[v] -= s->adj.presence_penalty + s->adj.frequency_penalty * (float)s->counts[v];
        }
    }
    return work;
}

int lm_sample_adjusted(lm_sampler *s, const float *logits, float *work) {
    return lm_sample(s, adjusted(s, logits, work));
}

int lm_sample_masked(lm_sampler *s, const float *logits, float *work, const uint32_t *allow) {
    if (lm_sampler_plain_greedy(s)) return lm_argmax_masked(logits, s->vocab, allow);
    const float *x = adjusted(s, logits, work);
    if (x != work) memcpy(work, logits, (size_t)s->vocab * sizeof(float));
    for (int v = 0; v < s->vocab; v++)
        if (!((allow[v >> 5] >> (v & 31)) & 1)) work[v] = -INFINITY;
    return lm_sample(s, work);
}

void lm_sampler_accept(lm_sampler *s, int32_t tok) {
    if (!s->counts) return;
    s->counts[tok]++;
    s->seen[tok] = 1;
}

/* ---- logprobs ---- */

float lm_logprobs(const float *logits, int vocab, int32_t tok, int n_top, int32_t *top_ids, float *top_logprobs) {
    const int V = vocab;
    float mx = logits[0];
    for (int v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)logits[v] - mx);
    float lse = mx + (float)log(sum);
    /* top n by repeated selection: n <= 20, so O(n V) is fine next to a forward */
    for (int k = 0; k < n_top; k++) {
        int best = -1;
        for (int v = 0; v < V; v++) {
            bool taken = false;
            for (int j = 0; j < k && !taken; j++) taken = top_ids[j] == v;
            if (!taken && (best < 0 || logits[v] > logits[best])) best = v;
        }
        top_ids[k] = best;
        top_logprobs[k] = logits[best] - lse;
    }
    return logits[tok] - lse;
}
