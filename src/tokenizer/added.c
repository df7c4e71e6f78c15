/* added.c - finding added tokens in text (HF's AddedVocabulary::find_matches).
 *
 * A byte trie gives leftmost-longest matches, which is what the Aho-Corasick
 * automaton in Hugging Face (MatchKind::LeftmostLongest) returns: at each
 * position, take the longest token starting there; if none, move on one
 * byte. Tokens are few (tens to a few thousand) and text positions whose
 * first byte starts no token cost one table lookup. Then the per-token flags
 * apply: single_word rejects matches inside words, lstrip / rstrip swallow
 * the whitespace beside the token. Written here because the flag semantics
 * are HF's own. */
#include <string.h>

#include "tok_internal.h"

void tok_trie_init(tok_trie *t) {
    *t = (tok_trie){ 0 };
    memset(t->root, 0xff, sizeof t->root);
}

void tok_trie_free(tok_trie *t) {
    free(t->nodes);
    tok_trie_init(t);
}

static int32_t new_node(tok_trie *t, uint8_t byte) {
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 256;
        t->nodes = lm_xrealloc(t->nodes, (size_t)t->cap * sizeof *t->nodes);
    }
    t->nodes[t->n] = (tok_trie_node){ -1, -1, -1, byte };
    return t->n++;
}

void tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added) {
    if (!n) return;
    uint8_t b0 = (uint8_t)s[0];
    if (t->root[b0] < 0) t->root[b0] = new_node(t, b0);
    int32_t cur = t->root[b0];
    for (size_t i = 1; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = t->nodes[cur].child;
        while (c >= 0 && t->nodes[c].byte != b) c = t->nodes[c].sibling;
        if (c < 0) {
            c = new_node(t, b);
            t->nodes[c].sibling = t->nodes[cur].child;
            t->nodes[cur].child = c;
        }
        cur = c;
    }
    if (t->nodes[cur].added < 0) t->nodes[cur].added = added; /* first one wins */
}

static bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

/* Longest token starting at s[i] and ending on a character boundary (a
 * GGUF token need not be valid UTF-8; text pieces must stay valid); returns
 * its length (0 none), sets *added. */
static size_t longest_at(const tok_trie *t, const char *s, size_t n, size_t i, int32_t *added) {
    int32_t cur = t->root[(uint8_t)s[i]];
    size_t best = 0;
    for (size_t j = i + 1; cur >= 0; j++) {
        if (t->nodes[cur].added >= 0 && (j == n || !is_cont((uint8_t)s[j]))) {
            best = j - i;
            *added = t->nodes[cur].added;
        }
        if (j >= n) break;
        uint8_t b = (uint8_t)s[j];
        int32_t c = t->nodes[cur].child;
        while (c >= 0 && t->nodes[c].byte != b) c = t->nodes[c].sibling;
        cur = c;
    }
    return best;
}

static uint32_t last_cp(const char *s, size_t end) {
    size_t j = end - 1;
    while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80) j--;
    int l;
    return tok_utf8_cp(s + j, end - j, &l);
}

static void push_seg(tok_segs *o, size_t a, size_t b, int32_t added) {
    if (a >= b) return; /* HF drops empty splits */
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 32;
        o->v = lm_xrealloc(o->v, o->cap * sizeof *o->v);
    }
    o->v[o->n++] = (tok_seg){ (uint32_t)a, (uint32_t)b, added };
}

bool tok_spans_overlap(const lm_tok_span *lit, size_t n_lit, size_t a, size_t b) {
    for (size_t k = 0; k < n_lit; k++)
        if (a < lit[k].end && lit[k].start < b) return true;
    return false;
}

void tok_split_added(const lm_tokenizer *t, const tok_trie *trie, const char *s, size_t n,
                     const lm_tok_span *lit, size_t n_lit, tok_segs *out) {
    out->n = 0;
    size_t start_offset = 0;
    if (!trie->n) {
        push_seg(out, 0, n, -1);
        return;
    }
    for (size_t i = 0; i < n;) {
        if (trie->root[(uint8_t)s[i]] < 0 || is_cont((uint8_t)s[i])) { i++; continue; }
        int32_t ai = -1;
        size_t len = longest_at(trie, s, n, i, &ai);
        if (!len) { i++; continue; }
        const tok_added *a = &t->added[ai];
        if (a->special && tok_spans_overlap(lit, n_lit, i, i + len)) { i++; continue; } /* literal text: no control token */
        size_t start = i, stop = i + len;
        i = stop;
        if (a->single_word) {
            bool start_space = start == 0 || !tok_is_word(last_cp(s, start));
            int l;
            bool stop_space = stop == n || !tok_is_word(tok_utf8_cp(s + stop, n - stop, &l));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t j = ns - 1;
                while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80) j--;
                int l;
                if (!tok_is_whitespace(tok_utf8_cp(s + j, ns - j, &l))) break;
                ns = j;
            }
            start = LM_MAX(ns, start_offset);
        }
        if (a->rstrip) {
            while (stop < n) {
                int l;
                if (!tok_is_whitespace(tok_utf8_cp(s + stop, n - stop, &l))) break;
                stop += (size_t)l;
            }
        }
        if (start < start_offset) start = start_offset; /* overlap with an rstrip before */
        push_seg(out, start_offset, start, -1);
        push_seg(out, start, stop, ai);
        start_offset = stop;
        i = stop; /* HF resumes at the match end; after rstrip, past the spaces */
    }
    push_seg(out, start_offset, n, -1);
}

size_t lm_tokenizer_special_at(const lm_tokenizer *t, const char *s, size_t n, size_t i) {
    const tok_trie *trie = &t->trie_raw;
    if (!trie->n || i >= n || is_cont((uint8_t)s[i]) || trie->root[(uint8_t)s[i]] < 0) return 0;
    int32_t ai = -1;
    size_t len = longest_at(trie, s, n, i, &ai);
    return len && t->added[ai].special ? len : 0; /* the longest match is what encode would take */
}
