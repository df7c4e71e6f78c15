/* spec_lookup.c - the prompt-lookup proposer (lm_spec.h): drafts are the
 * tokens that followed the latest earlier occurrence of the sequence's last
 * n tokens, in its own prompt and output. No model runs; it pays where the
 * answer copies its input (editing a file that is in the prompt, quoting,
 * code that repeats names).
 *
 * Index: one open-addressing table per n-gram length n (LM_LOOKUP_NMIN ..
 * LM_LOOKUP_NMAX), keyed by a hash of n tokens, holding the position that
 * followed them. Positions are added as tokens arrive (each token once), a
 * newer occurrence replaces an older one of the same hash (recent text is
 * the better guess), and a hit is checked against the tokens themselves, so
 * a hash collision costs a miss, never a wrong claim (a wrong draft would
 * only cost time: the verifier decides). Tables are made at the request's
 * first proposal, two slots per token of its capacity. */
#include "engine_internal.h"

#include <stdlib.h>
#include <string.h>

#define NT (LM_LOOKUP_NMAX - LM_LOOKUP_NMIN + 1)

static uint32_t ngram_hash(const int32_t *t, int n) {
    uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return (uint32_t)h;
}

void lm_spec_req_free(lm_spec_req *q) {
    for (int i = 0; i < NT; i++) free(q->ngram[i]);
    free(q->hid);
    memset(q, 0, sizeof *q);
}

/* Slot of the n-gram tokens[p - n .. p - 1] in table i: its own, or the empty
 * one it would take (linear probing; the table is at most half full). */
static uint32_t probe(const lm_spec_req *q, int i, const int32_t *tokens, int p, int n) {
    const int32_t *tab = q->ngram[i];
    uint32_t h = ngram_hash(tokens + p - n, n) & q->ngram_mask;
    for (;;) {
        int32_t e = tab[h];
        if (e < 0 || memcmp(tokens + e - n, tokens + p - n, (size_t)n * sizeof *tokens) == 0) return h;
        h = (h + 1) & q->ngram_mask;
    }
}

/* Adds the positions [n_indexed, n_tokens) as followers of the n-grams before them. */
static void index_to(lm_spec_req *q, const int32_t *tokens, int n_tokens, int cap) {
    if (!q->ngram[0]) {
        uint32_t size = 16;
        while (size < 2u * (uint32_t)cap) size <<= 1;
        q->ngram_mask = size - 1;
        for (int i = 0; i < NT; i++) {
            q->ngram[i] = lm_xmalloc(size * sizeof(int32_t));
            memset(q->ngram[i], 0xff, size * sizeof(int32_t));
        }
    }
    for (int p = q->n_indexed; p < n_tokens; p++)
        for (int i = 0; i < NT; i++) {
            int n = LM_LOOKUP_NMIN + i;
            if (p < n) continue;
            q->ngram[i][probe(q, i, tokens, p, n)] = p;
        }
    q->n_indexed = LM_MAX(q->n_indexed, n_tokens);
}

int lm_lookup_propose(lm_spec_req *q, const int32_t *tokens, int n_tokens, int cap, int32_t *draft, int max) {
    if (max <= 0 || n_tokens < LM_LOOKUP_NMIN + 1) return 0;
    /* the last n-gram's own follower is not known yet: index up to it */
    index_to(q, tokens, n_tokens - 1, cap);
    for (int i = NT - 1; i >= 0; i--) {
        int n = LM_LOOKUP_NMIN + i;
        if (n_tokens < n + 1) continue;
        /* look up the n-gram ending at the last token as if it were followed at n_tokens */
        int32_t e = q->ngram[i][probe(q, i, tokens, n_tokens, n)];
        if (e < 0) continue;
        int k = LM_MIN(max, n_tokens - e);
        memcpy(draft, tokens + e, (size_t)k * sizeof *draft);
        return k;
    }
    return 0;
}
