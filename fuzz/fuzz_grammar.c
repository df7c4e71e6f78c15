/* fuzz_grammar.c - libFuzzer harness for the grammar front ends and the
 * matcher (src/grammar): request bodies carry GBNF, regular expressions and
 * JSON schemas from anyone.
 *
 * Design: the first byte picks the front end (GBNF, regex, JSON Schema),
 * the rest is its text. A grammar that compiles is then driven: over a
 * vocabulary of every single byte plus a few multi-byte tokens, up to 64
 * steps of mask, accept of the first allowed token, forced bytes and
 * strict fill, with a rollback now and then. Promises checked with
 * LM_ASSERT: a failure has a message; every token in a mask is accepted;
 * rollback returns to the step count it was asked for. */
#include "grammar/lm_grammar.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lm_grammar_vocab *fuzz_vocab(void) {
    static const char *multi[] = { "{\"", "\":", "\",", "true", "null", "  ", "\xc3\xa9", "</" };
    enum { N = 1 + 256 + (int)(sizeof multi / sizeof *multi) };
    static char bytes[256];
    const char *b[N];
    size_t l[N];
    b[0] = NULL, l[0] = 0; /* id 0: the end token */
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, b[1 + i] = &bytes[i], l[1 + i] = 1;
    for (size_t i = 0; i < sizeof multi / sizeof *multi; i++) b[257 + i] = multi[i], l[257 + i] = strlen(multi[i]);
    int32_t end = 0;
    return lm_grammar_vocab_create(N, b, l, &end, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    lm_grammar *g = NULL;
    lm_err e = { { 0 } };
    int rc;
    if (data[0] % 3 == 0) {
        rc = lm_grammar_from_gbnf(&g, text, n, &e);
    } else if (data[0] % 3 == 1) {
        rc = lm_grammar_from_regex(&g, text, n, &e);
    } else {
        json_t *s = json_loadb(text, n, JSON_DECODE_ANY, NULL);
        rc = s ? lm_grammar_from_schema(&g, s, &e) : -1;
        if (!s) e.msg[0] = 'x';
        json_decref(s);
    }
    if (rc) {
        LM_ASSERT(!g && e.msg[0]);
        return 0;
    }
    lm_grammar_vocab *v = fuzz_vocab();
    int nv = lm_grammar_vocab_size(v);
    uint32_t *mask = malloc((size_t)lm_grammar_mask_words(nv) * 4);
    lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
    for (int step = 0; step < 64; step++) {
        int allowed = lm_grammar_mask(m, mask);
        if (!allowed) break;
        int32_t pick = -1, k = step % allowed; /* the k-th allowed token */
        for (int id = 0; id < nv && pick < 0; id++)
            if (((mask[id >> 5] >> (id & 31)) & 1) && k-- == 0) pick = id;
        LM_ASSERT(pick >= 0);
        int before = lm_grammar_steps(m);
        LM_ASSERT(lm_grammar_accept(m, pick));
        if (step % 7 == 3) {
            lm_grammar_rollback(m, 1);
            LM_ASSERT(lm_grammar_steps(m) == before);
            LM_ASSERT(lm_grammar_accept(m, pick));
        }
        char forced[64];
        (void)lm_grammar_forced(m, forced, sizeof forced);
        int32_t ids[8];
        (void)lm_grammar_fill(m, ids, 8);
        if (pick == 0) break; /* ended */
    }
    lm_grammar_matcher_free(m);
    free(mask);
    lm_grammar_vocab_free(v);
    lm_grammar_unref(g);
    return 0;
}
