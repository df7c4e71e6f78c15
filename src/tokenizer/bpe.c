/* bpe.c - the BPE model: one pre-token in, token ids out.
 *
 * Written by hand (no library does HF-exact BPE): split the word into
 * initial symbols (one per character; byte-level words one per byte),
 * with HF's unk / fuse_unk / byte_fallback / continuing_subword_prefix /
 * end_of_word_suffix rules, then repeatedly merge the adjacent pair of
 * lowest merge rank, leftmost first, until no pair merges.
 *
 * Symbols are a doubly linked list over an array. Words up to 48 symbols
 * scan the list for the best pair (cheap and cache-friendly); longer words
 * (Gemma's whole-paragraph pre-tokens) use a binary heap of candidate pairs
 * whose stale entries are skipped when popped. Results are memoised per word
 * (raw bytes -> ids) in the workspace cache. */
#include <string.h>

#include "tok_internal.h"

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves,
 * the other 68 bytes to U+0100.. in byte order. */
const uint16_t tok_byte_to_cp[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271,
    272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287,
    288, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79,
    80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
    96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 289,
    290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305,
    306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321,
    322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175,
    176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207,
    208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223,
    224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
    240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255,
};

int tok_cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp > 323) return -1;
    uint32_t k = cp - 256; /* the 68 remapped bytes, in byte order: 0-32, 127-160, 173 */
    return k < 33 ? (int)k : k < 67 ? (int)(127 + k - 33) : 173;
}

typedef struct tok_sym { int32_t id, prev, next; } tok_sym;
typedef struct tok_heap_ent { uint32_t rank; int32_t pos, id; } tok_heap_ent;

#define LINEAR_MAX 48

static bool heap_less(tok_heap_ent a, tok_heap_ent b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(tok_work *w, size_t *n, tok_heap_ent e) {
    if (*n == w->heap_cap) {
        w->heap_cap = w->heap_cap ? w->heap_cap * 2 : 256;
        w->heap = lm_xrealloc(w->heap, w->heap_cap * sizeof *w->heap);
    }
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(e, w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = e;
}

static tok_heap_ent heap_pop(tok_work *w, size_t *n) {
    tok_heap_ent top = w->heap[0], last = w->heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(w->heap[c + 1], w->heap[c])) c++;
        if (!heap_less(w->heap[c], last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (*n) w->heap[i] = last;
    return top;
}

static void merge_heap(const tok_merges *m, tok_work *w, tok_sym *s, int32_t n) {
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < n; i++) {
        const tok_merge *mg = tok_merges_get(m, s[i].id, s[i + 1].id);
        if (mg) heap_push(w, &hn, (tok_heap_ent){ mg->rank, i, mg->id });
    }
    while (hn) {
        tok_heap_ent top = heap_pop(w, &hn);
        tok_sym *a = &s[top.pos];
        if (a->id < 0 || a->next < 0) continue;
        tok_sym *b = &s[a->next];
        const tok_merge *mg = tok_merges_get(m, a->id, b->id);
        if (!mg || mg->id != top.id) continue; /* stale entry */
        a->id = top.id;
        b->id = -1;
        a->next = b->next;
        if (b->next >= 0) s[b->next].prev = top.pos;
        if (a->prev >= 0) {
            const tok_merge *p = tok_merges_get(m, s[a->prev].id, a->id);
            if (p) heap_push(w, &hn, (tok_heap_ent){ p->rank, a->prev, p->id });
        }
        if (a->next >= 0) {
            const tok_merge *q = tok_merges_get(m, a->id, s[a->next].id);
            if (q) heap_push(w, &hn, (tok_heap_ent){ q->rank, top.pos, q->id });
        }
    }
}

static void merge_linear(const tok_merges *m, tok_sym *s, int32_t n) {
    uint32_t rank[LINEAR_MAX];
    int32_t nid[LINEAR_MAX];
    for (int32_t i = 0; i < n; i++) {
        const tok_merge *mg = i + 1 < n ? tok_merges_get(m, s[i].id, s[i + 1].id) : NULL;
        rank[i] = mg ? mg->rank : UINT32_MAX;
        nid[i] = mg ? mg->id : -1;
    }
    for (;;) {
        int32_t best = -1;
        uint32_t br = UINT32_MAX;
        for (int32_t i = 0; i >= 0; i = s[i].next)
            if (rank[i] < br) br = rank[i], best = i;
        if (best < 0) break;
        tok_sym *a = &s[best];
        int32_t j = a->next;
        a->id = nid[best];
        s[j].id = -1;
        a->next = s[j].next;
        if (a->next >= 0) s[a->next].prev = best;
        const tok_merge *mg = a->next >= 0 ? tok_merges_get(m, a->id, s[a->next].id) : NULL;
        rank[best] = mg ? mg->rank : UINT32_MAX;
        nid[best] = mg ? mg->id : -1;
        if (a->prev >= 0) {
            mg = tok_merges_get(m, s[a->prev].id, a->id);
            rank[a->prev] = mg ? mg->rank : UINT32_MAX;
            nid[a->prev] = mg ? mg->id : -1;
        }
    }
}

static tok_sym *syms(tok_work *w, size_t n) {
    if (n > w->syms_cap) {
        w->syms_cap = n + n / 2 + 16;
        w->syms = lm_xrealloc(w->syms, w->syms_cap * sizeof *w->syms);
    }
    return w->syms;
}

static int32_t model_id(const lm_tokenizer *t, const char *s, size_t n) {
    return tok_vocab_get(&t->vocab, s, n);
}

/* Builds the initial symbols of word s (already byte-level mapped when the
 * model is byte-level) per HF's BPE::merge_word. Returns the count. */
static int32_t initial_symbols(const lm_tokenizer *t, tok_work *w, const char *s, size_t n) {
    const tok_bpe *m = &t->bpe;
    int32_t k = 0;
    int32_t unk_pending = -1;
    lm_tok_str *tmp = &w->ntmp;
    /* at most one symbol per byte of each (prefixed, suffixed) character */
    tok_sym *sy = syms(w, n * (1 + m->prefix_len + m->suffix_len) + 4);
    for (size_t i = 0; i < n;) {
        size_t cl = (size_t)tok_utf8_len((uint8_t)s[i]);
        if (i + cl > n) cl = n - i;
        bool last = i + cl == n;
        const char *str = s + i;
        size_t len = cl;
        if ((i > 0 && m->prefix_len) || (last && m->suffix_len)) {
            tmp->len = 0;
            if (i > 0) tok_str_append(tmp, m->prefix, m->prefix_len);
            tok_str_append(tmp, s + i, cl);
            if (last) tok_str_append(tmp, m->suffix, m->suffix_len);
            str = tmp->s, len = tmp->len;
        }
        i += cl;
        int32_t id = model_id(t, str, len);
        if (id >= 0) {
            if (unk_pending >= 0) sy[k++].id = unk_pending, unk_pending = -1;
            sy[k++].id = id;
            continue;
        }
        if (m->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < len; j++)
                if (m->fallback_ids[(uint8_t)str[j]] < 0) all = false;
            if (all) { /* HF adds these without flushing a pending unk */
                for (size_t j = 0; j < len; j++) sy[k++].id = m->fallback_ids[(uint8_t)str[j]];
                continue;
            }
        }
        if (m->unk >= 0) {
            if (unk_pending >= 0 && !m->fuse_unk) sy[k++].id = unk_pending;
            unk_pending = m->unk;
        }
    }
    if (unk_pending >= 0) sy[k++].id = unk_pending;
    for (int32_t i = 0; i < k; i++) sy[i].prev = i - 1, sy[i].next = i + 1 < k ? i + 1 : -1;
    return k;
}

static bool bytes_known(const tok_bpe *m, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (m->byte_ids[(uint8_t)s[i]] < 0) return false;
    return true;
}

/* The uncached path: ids of word s (raw bytes when byte-level). */
static void encode_word(const lm_tokenizer *t, tok_work *w, const char *s, size_t n, lm_tok_ids *out) {
    const tok_bpe *m = &t->bpe;
    int32_t k;
    if (m->byte_level) {
        bool simple = !m->prefix_len && !m->suffix_len && bytes_known(m, s, n);
        if (m->ignore_merges || !simple) {
            w->word.len = 0;
            tok_str_reserve(&w->word, n * 2);
            for (size_t i = 0; i < n; i++) {
                char b[4];
                tok_str_append(&w->word, b, (size_t)tok_utf8_put(tok_byte_to_cp[(uint8_t)s[i]], b));
            }
            if (m->ignore_merges) {
                int32_t id = model_id(t, w->word.s, w->word.len);
                if (id >= 0) {
                    tok_ids_push(out, id);
                    return;
                }
            }
        }
        if (simple) { /* one symbol per byte straight from the table */
            tok_sym *sy = syms(w, n);
            for (size_t i = 0; i < n; i++)
                sy[i] = (tok_sym){ m->byte_ids[(uint8_t)s[i]], (int32_t)i - 1,
                                   i + 1 < n ? (int32_t)i + 1 : -1 };
            k = (int32_t)n;
            goto merge;
        }
        s = w->word.s, n = w->word.len;
    } else if (m->ignore_merges) {
        int32_t id = model_id(t, s, n);
        if (id >= 0) {
            tok_ids_push(out, id);
            return;
        }
    }
    k = initial_symbols(t, w, s, n);
merge:;
    tok_sym *sy = w->syms;
    if (k <= 1) {
    } else if (k <= LINEAR_MAX) merge_linear(&m->merges, sy, k);
    else merge_heap(&m->merges, w, sy, k);
    for (int32_t i = 0; k > 0 && i >= 0; i = sy[i].next) tok_ids_push(out, sy[i].id);
}

/* ---- the word cache ---- */

#define CACHE_MAX_WORD 256
#define CACHE_MAX_ENTRIES (1u << 18)

static void cache_reset(tok_work *w) {
    size_t cap = 1u << 12;
    free(w->cache);
    w->cache = lm_xcalloc(cap, sizeof *w->cache);
    w->cache_mask = cap - 1;
    w->cache_n = 0;
    w->cache_keys.len = 0;
    w->cache_ids.n = 0;
}

static void cache_grow(tok_work *w) {
    size_t cap = (w->cache_mask + 1) * 2;
    tok_cache_ent *c = lm_xcalloc(cap, sizeof *c);
    for (size_t i = 0; i <= w->cache_mask; i++) {
        tok_cache_ent e = w->cache[i];
        if (!e.key_len) continue;
        size_t j = (size_t)e.h & (cap - 1);
        while (c[j].key_len) j = (j + 1) & (cap - 1);
        c[j] = e;
    }
    free(w->cache);
    w->cache = c;
    w->cache_mask = cap - 1;
}

void tok_bpe_word(const lm_tokenizer *t, tok_work *w, const char *s, size_t n, lm_tok_ids *out) {
    if (!n) return;
    if (!w->use_cache || n > CACHE_MAX_WORD) {
        encode_word(t, w, s, n, out);
        return;
    }
    if (!w->cache) cache_reset(w);
    uint64_t h = tok_hash(s, n);
    size_t i = (size_t)h & w->cache_mask;
    for (;;) {
        tok_cache_ent *e = &w->cache[i];
        if (!e->key_len) break;
        if (e->h == h && e->key_len == n && !memcmp(w->cache_keys.s + e->key_off, s, n)) {
            for (uint32_t j = 0; j < e->ids_len; j++) tok_ids_push(out, w->cache_ids.ids[e->ids_off + j]);
            return;
        }
        i = (i + 1) & w->cache_mask;
    }
    size_t before = out->n;
    encode_word(t, w, s, n, out);
    if (w->cache_n >= CACHE_MAX_ENTRIES) {
        cache_reset(w);
        i = (size_t)h & w->cache_mask;
    } else if ((w->cache_n + 1) * 2 > w->cache_mask + 1) {
        cache_grow(w);
        i = (size_t)h & w->cache_mask;
        while (w->cache[i].key_len) i = (i + 1) & w->cache_mask;
    }
    tok_cache_ent e = { h, (uint32_t)w->cache_keys.len, (uint32_t)n, (uint32_t)w->cache_ids.n,
                        (uint32_t)(out->n - before) };
    tok_str_append(&w->cache_keys, s, n);
    for (size_t j = before; j < out->n; j++) tok_ids_push(&w->cache_ids, out->ids[j]);
    w->cache[i] = e;
    w->cache_n++;
}

void tok_work_init(tok_work *w, bool use_cache) {
    *w = (tok_work){ 0 };
    w->use_cache = use_cache;
}

void tok_work_free(tok_work *w) {
    lm_tok_str_free(&w->clean);
    lm_tok_str_free(&w->norm);
    lm_tok_str_free(&w->ntmp);
    lm_tok_str_free(&w->word);
    lm_tok_str_free(&w->pieces.buf);
    free(w->pieces.v);
    lm_tok_str_free(&w->ptmp.buf);
    free(w->ptmp.v);
    free(w->spans.v);
    free(w->segs.v);
    free(w->nsegs.v);
    if (w->rs.md) pcre2_match_data_free(w->rs.md);
    free(w->syms);
    free(w->heap);
    free(w->cache);
    lm_tok_str_free(&w->cache_keys);
    lm_tok_ids_free(&w->cache_ids);
    *w = (tok_work){ 0 };
}
