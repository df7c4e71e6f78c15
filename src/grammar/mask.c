/* mask.c - the vocabulary as a byte trie, and the next-token mask.
 *
 * The trie is stored in preorder: node k has a byte, a depth, the first
 * token whose bytes end there, and next[k], the node after its subtree. The
 * mask walks it once, keeping the stack set of every depth on the current
 * path; a byte no stack takes skips the whole subtree (next[k]). Nodes the
 * walk makes are dropped afterwards (and per sibling as it goes).
 *
 * Most of a big mask is tokens of "ordinary" characters (inside a JSON
 * string) that all take the sets down one path: the walk first builds
 * that path (the chain, below) and then allows whole subtrees of such
 * characters, or reuses the chain's set, without stepping the stacks.
 *
 * Masks are cached per grammar under a 128-bit hash of the stack set (the
 * element positions of every stack, top to bottom, in a canonical order):
 * equal stacks allow equal tokens, wherever they were reached from.
 *
 * A set the cache lacks is built from per-element tables. A stack's top
 * elements (the top, and those below it for as long as what is above can
 * match nothing) decide alone every token whose bytes stay inside them:
 * the context-independent tokens. The table of such a key walks the trie
 * once from those elements over a sentinel parent that takes any byte and
 * marks the stack as having left: it holds the tokens allowed without
 * leaving, and the trie nodes where a path left. A mask is the union of
 * its stacks' tables plus a walk with the whole stacks restricted to the
 * subtrees of those nodes, so a JSON value's body is one table however
 * many keys or nesting levels lead to it. */
#define _GNU_SOURCE /* qsort_r */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

/* The cache of one grammar holds at most this many bytes of masks. */
#define G_CACHE_BYTES (64u << 20)
/* ... and at most this many (a small vocabulary must not get a huge table). */
#define G_CACHE_MAX 4096

struct lm_grammar_vocab {
    int n_vocab;
    /* token bytes */
    uint32_t *off, *len;    /* [n_vocab]; len 0: never produced */
    char *arena;
    uint8_t *is_end;        /* [n_vocab] */
    int32_t *end_ids;
    int n_end;
    /* the trie, preorder */
    int n_tn, max_depth;
    uint8_t *tn_byte;
    int32_t *tn_depth, *tn_next, *tn_tok;
    int32_t *tok_next;      /* [n_vocab] next token with the same bytes, -1 */
    /* the self-loop shortcut (walk): per node, the ASCII bytes below it (bit
     * c of sub_ascii[2k + c / 64]) and whether any byte below is not ASCII;
     * its subtree's tokens are order[tn_lo[k], tn_lo[tn_next[k]]) */
    uint64_t *sub_ascii;    /* [2 n_tn] */
    uint8_t *sub_high;      /* [n_tn] */
    /* the most characters on a path of k's subtree read from k's byte as
     * a character's first (a token may end inside one: it counts), or 0
     * when some path there is not UTF-8 */
    uint8_t *u8_chars;      /* [n_tn] */
    uint8_t *ord_chars;     /* [n_order] characters of token order[i] (a partial one counts), 255: not UTF-8 */
    int32_t *tn_lo;         /* [n_tn + 1] */
    int32_t *order;         /* [n_order] token ids in byte order (= trie preorder) */
    int n_order;
};

bool gv_is_end(const lm_grammar_vocab *v, int32_t id) { return id >= 0 && id < v->n_vocab && v->is_end[id]; }

const char *gv_bytes(const lm_grammar_vocab *v, int32_t id, size_t *n) {
    if (id < 0 || id >= v->n_vocab || !v->len[id]) return NULL;
    *n = v->len[id];
    return v->arena + v->off[id];
}

int lm_grammar_vocab_size(const lm_grammar_vocab *v) { return v->n_vocab; }

/* UTF-8 as a DFA: where a byte leads from each position in a character
 * (-1: not UTF-8). */
enum { U_START, U_CONT1, U_CONT2, U_CONT3, U_E0, U_ED, U_F0, U_F4, U_STATES };

static int utf8_next(int s, uint8_t b) {
    switch (s) {
    case U_START:
        if (b < 0x80) return U_START;
        if (b >= 0xC2 && b <= 0xDF) return U_CONT1;
        if (b == 0xE0) return U_E0;
        if (b == 0xED) return U_ED;
        if (b >= 0xE1 && b <= 0xEF) return U_CONT2;
        if (b == 0xF0) return U_F0;
        if (b == 0xF4) return U_F4;
        if (b >= 0xF1 && b <= 0xF3) return U_CONT3;
        return -1;
    case U_CONT1: return b >= 0x80 && b <= 0xBF ? U_START : -1;
    case U_CONT2: return b >= 0x80 && b <= 0xBF ? U_CONT1 : -1;
    case U_CONT3: return b >= 0x80 && b <= 0xBF ? U_CONT2 : -1;
    case U_E0: return b >= 0xA0 && b <= 0xBF ? U_CONT1 : -1;
    case U_ED: return b >= 0x80 && b <= 0x9F ? U_CONT1 : -1;
    case U_F0: return b >= 0x90 && b <= 0xBF ? U_CONT2 : -1;
    default: return b >= 0x80 && b <= 0x8F ? U_CONT2 : -1; /* U_F4 */
    }
}

/* u8_chars, bottom up for every DFA state (children come after their
 * parent; only the start state's count is kept). */
static void utf8_counts(lm_grammar_vocab *v) {
    int16_t (*cnt)[U_STATES] = lm_xmalloc(((size_t)v->n_tn + 1) * sizeof *cnt); /* -1: not UTF-8 */
    v->u8_chars = lm_xmalloc((size_t)v->n_tn + 1);
    for (int x = v->n_tn - 1; x >= 0; x--) {
        for (int s = 0; s < U_STATES; s++) {
            const int s2 = utf8_next(s, v->tn_byte[x]);
            int best = 0;
            for (int c = x + 1; c < v->tn_next[x] && s2 >= 0 && best >= 0; c = v->tn_next[c])
                best = cnt[c][s2] < 0 ? -1 : LM_MAX(best, cnt[c][s2]);
            cnt[x][s] = (int16_t)(s2 < 0 || best < 0 ? -1 : best + (s == U_START));
        }
        v->u8_chars[x] = (uint8_t)LM_MIN(LM_MAX(cnt[x][U_START], 0), 255);
    }
    free(cnt);
}

static int by_bytes(const void *a, const void *b, void *ctx) {
    const lm_grammar_vocab *sort_v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_v->len[x], ly = sort_v->len[y];
    int c = memcmp(sort_v->arena + sort_v->off[x], sort_v->arena + sort_v->off[y], LM_MIN(lx, ly));
    if (c) return c;
    return lx != ly ? (lx < ly ? -1 : 1) : (x < y ? -1 : 1);
}

lm_grammar_vocab *lm_grammar_vocab_create(int n_vocab, const char *const *bytes, const size_t *lens,
                                          const int32_t *end_ids, int n_end) {
    lm_grammar_vocab *v = lm_xcalloc(1, sizeof *v);
    v->n_vocab = n_vocab;
    v->off = lm_xcalloc((size_t)n_vocab, sizeof *v->off);
    v->len = lm_xcalloc((size_t)n_vocab, sizeof *v->len);
    v->is_end = lm_xcalloc((size_t)n_vocab, 1);
    v->tok_next = lm_xmalloc((size_t)n_vocab * sizeof *v->tok_next);
    v->end_ids = lm_xmalloc((size_t)(n_end + 1) * sizeof *v->end_ids);
    for (int i = 0; i < n_end; i++)
        if (end_ids[i] >= 0 && end_ids[i] < n_vocab && !v->is_end[end_ids[i]]) {
            v->is_end[end_ids[i]] = 1;
            v->end_ids[v->n_end++] = end_ids[i];
        }
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++)
        if (bytes[i] && !v->is_end[i]) total += lens[i];
    v->arena = lm_xmalloc(total + 1);
    int32_t *order = lm_xmalloc((size_t)n_vocab * sizeof *order);
    int n = 0;
    size_t k = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->tok_next[i] = -1;
        if (!bytes[i] || !lens[i] || v->is_end[i]) continue;
        memcpy(v->arena + k, bytes[i], lens[i]);
        v->off[i] = (uint32_t)k;
        v->len[i] = (uint32_t)lens[i];
        k += lens[i];
        order[n++] = i;
    }
    qsort_r(order, (size_t)n, sizeof *order, by_bytes, v);
    /* preorder trie: at most one node per token byte */
    v->tn_byte = lm_xmalloc(total + 1);
    v->tn_depth = lm_xmalloc((total + 1) * sizeof *v->tn_depth);
    v->tn_next = lm_xmalloc((total + 1) * sizeof *v->tn_next);
    v->tn_tok = lm_xmalloc((total + 1) * sizeof *v->tn_tok);
    int32_t *path = NULL;
    int open = 0, cap_path = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (int t = 0; t < n; t++) {
        int32_t id = order[t];
        const char *s = v->arena + v->off[id];
        uint32_t len = v->len[id], l = 0;
        while (prev && l < len && l < prev_len && s[l] == prev[l]) l++;
        for (; open > (int)l; open--) v->tn_next[path[open - 1]] = v->n_tn; /* subtrees that end */
        if ((int)len > cap_path) {
            cap_path = (int)len * 2;
            path = lm_xrealloc(path, (size_t)cap_path * sizeof *path);
        }
        for (uint32_t d = l; d < len; d++) {
            int32_t x = v->n_tn++;
            v->tn_byte[x] = (uint8_t)s[d];
            v->tn_depth[x] = (int32_t)d + 1;
            v->tn_tok[x] = -1;
            path[open++] = x;
        }
        v->max_depth = LM_MAX(v->max_depth, (int)len);
        int32_t at = path[len - 1];
        v->tok_next[id] = v->tn_tok[at];
        v->tn_tok[at] = id;
        prev = s, prev_len = len;
    }
    for (; open > 0; open--) v->tn_next[path[open - 1]] = v->n_tn;
    free(path);
    /* subtree byte sets, bottom up (children come after their parent) */
    v->sub_ascii = lm_xcalloc(2 * (size_t)v->n_tn + 2, sizeof *v->sub_ascii);
    v->sub_high = lm_xcalloc((size_t)v->n_tn + 1, 1);
    v->tn_lo = lm_xmalloc(((size_t)v->n_tn + 1) * sizeof *v->tn_lo);
    for (int x = v->n_tn - 1; x >= 0; x--) {
        for (int c = x + 1; c < v->tn_next[x]; c = v->tn_next[c]) {
            uint8_t b = v->tn_byte[c];
            if (b < 128) v->sub_ascii[2 * x + b / 64] |= 1ull << (b & 63);
            else v->sub_high[x] = 1;
            v->sub_ascii[2 * x] |= v->sub_ascii[2 * c], v->sub_ascii[2 * x + 1] |= v->sub_ascii[2 * c + 1];
            v->sub_high[x] |= v->sub_high[c];
        }
    }
    utf8_counts(v);
    int t = 0;
    for (int x = 0; x < v->n_tn; x++) { /* the first token at or after node x, in order */
        v->tn_lo[x] = t;
        for (int32_t id = v->tn_tok[x]; id >= 0; id = v->tok_next[id]) t++;
    }
    v->tn_lo[v->n_tn] = t;
    /* order[] must list ids exactly as the preorder meets them */
    v->n_order = 0;
    for (int x = 0; x < v->n_tn; x++)
        for (int32_t id = v->tn_tok[x]; id >= 0; id = v->tok_next[id]) order[v->n_order++] = id;
    v->order = order;
    v->ord_chars = lm_xmalloc((size_t)v->n_order + 1);
    for (int i = 0; i < v->n_order; i++) {
        const uint8_t *b = (const uint8_t *)v->arena + v->off[order[i]];
        int st = U_START, nc = 0;
        for (uint32_t j = 0; j < v->len[order[i]] && st >= 0; j++) nc += st == U_START, st = utf8_next(st, b[j]);
        v->ord_chars[i] = (uint8_t)(st < 0 ? 255 : LM_MIN(nc, 254));
    }
    return v;
}

void lm_grammar_vocab_free(lm_grammar_vocab *v) {
    if (!v) return;
    free(v->off), free(v->len), free(v->arena), free(v->is_end), free(v->end_ids), free(v->tok_next);
    free(v->tn_byte), free(v->tn_depth), free(v->tn_next), free(v->tn_tok);
    free(v->sub_ascii), free(v->sub_high), free(v->u8_chars), free(v->ord_chars), free(v->tn_lo), free(v->order);
    free(v);
}

/* ---- the walk ---- */

/* Sets token id's bit; [*lo, *hi) grows to hold its word. */
static inline void allow(uint32_t *mask, int32_t id, int *lo, int *hi) {
    mask[id >> 5] |= 1u << (id & 31);
    *lo = LM_MIN(*lo, id >> 5), *hi = LM_MAX(*hi, (id >> 5) + 1);
}

static int allow_tokens(const lm_grammar_vocab *v, int32_t id, uint32_t *mask, int *lo, int *hi) {
    int n = 0;
    for (; id >= 0; id = v->tok_next[id], n++) allow(mask, id, lo, hi);
    return n;
}

/* Whether stacks x and y hold the same elements all the way down. */
static bool same_stack(const lm_grammar_matcher *m, int32_t x, int32_t y) {
    while (x != y) {
        if (x < 0 || y < 0 || m->nodes[x].pos != m->nodes[y].pos) return false;
        x = m->nodes[x].parent, y = m->nodes[y].parent;
    }
    return true;
}

/* Past this many stacks a chain set is not kept (the walk advances as usual). */
#define G_CHAIN_STACKS 64

/* What a walk starts from and what it leaves out. */
typedef struct g_walk {
    const int32_t *start; /* the set at depth 0 */
    int n_start;
    /* >= 0 (a table's walk): a stack whose top is element esc has left the
     * rule (the sentinel took a byte): the node goes to deps and its
     * subtree is not walked */
    int32_t esc;
    g_ids *deps;
    /* non-NULL: only subtrees that hold one of these nodes (sorted) */
    const int32_t *roots;
    int n_roots;
    int lo, hi; /* out: the mask words the walk set bits in */
} g_walk;

/* Whether a stack of ids[0, n) has its top at element pos. */
static bool has_top(const lm_grammar_matcher *m, const int32_t *ids, int n, int32_t pos) {
    for (int i = 0; i < n; i++)
        if (m->nodes[ids[i]].pos == pos) return true;
    return false;
}

/* The chain: most of a mask is tokens of "ordinary" bytes (the characters
 * of a JSON string), each of which takes the set down the same path. C[0]
 * is the current set and C[d + 1] the set after byte r from C[d]; while
 * stepping r, step() reports (probing) the ASCII bytes that every byte set
 * it tests holds exactly when it holds r: those take the very same path,
 * so k[d], the ones that did so at every depth up to d, lead from C[0]
 * along any path of length d + 1 to C[d + 1]. The walk then allows a trie
 * subtree of k bytes whole, or reuses C[d] without stepping. A string
 * with maxLength is such a chain (each character count its own set); a
 * string without is one whose sets repeat (C[1] = C[0]), and then every
 * depth reuses it without stepping again. */
static void chain(lm_grammar_matcher *m, int max_depth, const g_walk *w) {
    g_ids *C = &m->ch;
    C->n = C->base = 0;
    m->ch_len = 0;
    memset(m->ch_dead, 0, sizeof m->ch_dead);
    m->ch_off[0] = 0, m->ch_n[0] = w->n_start;
    memset(m->ch_u8, -1, (size_t)max_depth + 1);
    for (int i = 0; i < w->n_start; i++) g_ids_push(C, w->start[i]);
    static const char reps[] = "e0a \"{";
    uint8_t r = 0;
    uint64_t k[2] = { ~0ull, ~0ull };
    for (int d = 0; d < max_depth; d++) {
        const int off = m->ch_off[d], n = m->ch_n[d];
        if (n == 0 || n > G_CHAIN_STACKS) return;
        for (int t = d ? -1 : 0; d ? t < 0 : reps[t]; t++) {
            if (!d) r = (uint8_t)reps[t];
            C->n = C->base = off + n;
            m->probing = true, memset(m->probe, 0xFF, sizeof m->probe);
            gm_advance(m, off, n, r, C);
            m->probing = false;
            if (C->n > C->base) break;
        }
        const int n2 = C->n - C->base;
        if (n2 == 0) { /* the chain ends here for every byte like r */
            memcpy(m->ch_dead, m->probe, sizeof m->ch_dead);
            return;
        }
        if (w->esc >= 0 && has_top(m, C->v + C->base, n2, w->esc)) { /* a table's: stop before leaving the rule */
            C->n = C->base;
            return;
        }
        k[0] &= m->probe[0], k[1] &= m->probe[1];
        m->ch_k[d][0] = k[0], m->ch_k[d][1] = k[1];
        m->ch_off[d + 1] = C->base, m->ch_n[d + 1] = n2, m->ch_len = d + 1;
        bool same = n2 == n;
        for (int i = 0; i < n && same; i++) same = same_stack(m, C->v[off + i], C->v[C->base + i]);
        if (same) { /* the set repeats: so does everything after it */
            C->n = C->base;
            for (int e = d; e < max_depth; e++) {
                m->ch_k[e][0] = k[0], m->ch_k[e][1] = k[1];
                m->ch_off[e + 1] = off, m->ch_n[e + 1] = n;
            }
            m->ch_len = max_depth;
            return;
        }
    }
}

static void walk_alloc(lm_grammar_matcher *m, int depth) {
    if (m->lvl_cap >= depth + 1) return;
    m->lvl_cap = depth + 1;
    m->lvl_start = lm_xrealloc(m->lvl_start, (size_t)m->lvl_cap * sizeof *m->lvl_start);
    m->lvl_n = lm_xrealloc(m->lvl_n, (size_t)m->lvl_cap * sizeof *m->lvl_n);
    m->lvl_nodes = lm_xrealloc(m->lvl_nodes, (size_t)m->lvl_cap * sizeof *m->lvl_nodes);
    m->lvl_chain = lm_xrealloc(m->lvl_chain, (size_t)m->lvl_cap * sizeof *m->lvl_chain);
    m->ch_u8 = lm_xrealloc(m->ch_u8, (size_t)m->lvl_cap);
    m->ch_off = lm_xrealloc(m->ch_off, (size_t)m->lvl_cap * sizeof *m->ch_off);
    m->ch_n = lm_xrealloc(m->ch_n, (size_t)m->lvl_cap * sizeof *m->ch_n);
    m->ch_k = lm_xrealloc(m->ch_k, (size_t)m->lvl_cap * sizeof *m->ch_k);
}

static bool in_k(const uint64_t k[2], uint8_t b) { return b < 128 && ((k[b >> 6] >> (b & 63)) & 1); }

/* Whether sets x[0, n) and y[0, n) hold the same stacks. */
static bool same_set(const lm_grammar_matcher *m, const int32_t *x, const int32_t *y, int n) {
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (int j = 0; j < n && !found; j++) found = same_stack(m, x[i], y[j]);
        if (!found) return false;
    }
    return true;
}

/* Whether every UTF-8 character (not only the ASCII ones of the chain's
 * class) takes C[i] to C[i + 1]: each shape of character stepped once
 * with probing, which must find every byte of the shape's range at each
 * position taking the stepped byte's path. Memoised per i. */
static bool chain_utf8(lm_grammar_matcher *m, int i) {
    static const uint8_t shapes[][4][2] = {
        { { 0xC2, 0xDF }, { 0x80, 0xBF } },
        { { 0xE0, 0xE0 }, { 0xA0, 0xBF }, { 0x80, 0xBF } },
        { { 0xE1, 0xEC }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xED, 0xED }, { 0x80, 0x9F }, { 0x80, 0xBF } },
        { { 0xEE, 0xEF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xF0, 0xF0 }, { 0x90, 0xBF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xF1, 0xF3 }, { 0x80, 0xBF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xF4, 0xF4 }, { 0x80, 0x8F }, { 0x80, 0xBF }, { 0x80, 0xBF } },
    };
    if (m->ch_u8[i] >= 0) return m->ch_u8[i] > 0;
    if (i > 0 && m->ch_off[i] == m->ch_off[i - 1] && m->ch_off[i + 1] == m->ch_off[i] && m->ch_u8[i - 1] >= 0)
        return (m->ch_u8[i] = m->ch_u8[i - 1]) > 0; /* a repeating set */
    const int mark = m->n_nodes;
    g_ids *t = &m->tmp;
    bool ok = true;
    for (size_t s = 0; s < LM_COUNT(shapes) && ok; s++) {
        t->n = 0;
        for (int j = 0; j < m->ch_n[i]; j++) g_ids_push(t, m->ch.v[m->ch_off[i] + j]);
        int off = 0, n = m->ch_n[i];
        for (int p = 0; p < 4 && shapes[s][p][0] && ok; p++) {
            const uint8_t lo = shapes[s][p][0], hi = shapes[s][p][1];
            t->base = t->n;
            m->probing = true, memset(m->probe, 0xFF, sizeof m->probe);
            gm_advance(m, off, n, lo, t);
            m->probing = false;
            off = t->base, n = t->n - t->base;
            ok = n > 0;
            for (int c = lo; c <= hi && ok; c++) ok = (m->probe[c >> 6] >> (c & 63)) & 1;
        }
        ok = ok && n == m->ch_n[i + 1] && same_set(m, t->v + off, m->ch.v + m->ch_off[i + 1], n);
    }
    m->n_nodes = mark;
    t->n = t->base = 0;
    m->ch_u8[i] = ok;
    return ok;
}

/* How the chain decides the trie subtree at k, entered from C[j] (j bytes
 * in): its paths are characters the chain takes, so a token there is
 * allowed when it stays within the nonempty sets. 0: it does not decide
 * (walk on); 1: every token is allowed; 2: those of at most ch_len
 * characters are (its deepest ones are too long). */
static int chain_subtree(lm_grammar_matcher *m, int k, int j) {
    const lm_grammar_vocab *v = m->v;
    const int n = LM_MIN(v->u8_chars[k], m->ch_len - j);
    const uint8_t b = v->tn_byte[k];
    if (n <= 0) return 0;
    const uint64_t *K = m->ch_k[j + n - 1];
    if ((b < 128 && !in_k(K, b)) || (v->sub_ascii[2 * k] & ~K[0]) || (v->sub_ascii[2 * k + 1] & ~K[1])) return 0;
    const bool high = b >= 128 || v->sub_high[k];
    if (n < v->u8_chars[k]) { /* the longer tokens must end the chain, not go on past it */
        const uint64_t *D = m->ch_dead;
        if ((b < 128 && !in_k(D, b)) || (v->sub_ascii[2 * k] & ~D[0]) || (v->sub_ascii[2 * k + 1] & ~D[1]) ||
            (high && ~(D[2] & D[3])))
            return 0;
    }
    if (high)
        for (int i = j; i < j + n; i++)
            if (!chain_utf8(m, i)) return 0;
    return n == v->u8_chars[k] ? 1 : 2;
}

static int walk(lm_grammar_matcher *m, g_walk *w, uint32_t *mask) {
    const lm_grammar_vocab *v = m->v;
    walk_alloc(m, v->max_depth);
    const int mark0 = m->n_nodes;
    chain(m, v->max_depth, w);
    const int mark = m->n_nodes; /* the chain's nodes stay until the walk ends */
    g_ids *L = &m->lvl;
    L->n = 0;
    for (int i = 0; i < w->n_start; i++) g_ids_push(L, w->start[i]);
    m->lvl_start[0] = 0, m->lvl_n[0] = L->n, m->lvl_nodes[0] = mark, m->lvl_chain[0] = 0;
    int allowed = 0, ri = 0, inside = 0; /* restricted: the next root; the end of the root's subtree we are in */
    int lo = INT32_MAX, hi = 0;
    for (int k = 0; k < v->n_tn;) {
        if (w->roots && k >= inside) {
            while (ri < w->n_roots && w->roots[ri] < k) ri++;
            if (ri == w->n_roots || w->roots[ri] >= v->tn_next[k]) { /* no root below */
                k = v->tn_next[k];
                continue;
            }
            if (w->roots[ri] == k) inside = v->tn_next[k];
        }
        const int d = v->tn_depth[k], j = m->lvl_chain[d - 1];
        const uint8_t b = v->tn_byte[k];
        const int how = j >= 0 ? chain_subtree(m, k, j) : 0;
        if (how) { /* j == d - 1 ASCII characters lead here: a token's count is its own */
            for (int i = v->tn_lo[k]; i < v->tn_lo[v->tn_next[k]]; i++)
                if (how == 1 || v->ord_chars[i] <= m->ch_len) {
                    allow(mask, v->order[i], &lo, &hi);
                    allowed++;
                }
            k = v->tn_next[k];
            continue;
        }
        m->n_nodes = m->lvl_nodes[d - 1]; /* the previous sibling's nodes are garbage */
        L->n = L->base = m->lvl_start[d] = LM_MAX(m->lvl_start[d - 1] + m->lvl_n[d - 1], m->lvl_n[0]);
        if (j >= 0 && j < m->ch_len && in_k(m->ch_k[j], b)) { /* the set here is C[j + 1]: no step */
            for (int i = 0; i < m->ch_n[j + 1]; i++) g_ids_push(L, m->ch.v[m->ch_off[j + 1] + i]);
            m->lvl_chain[d] = j + 1;
        } else {
            gm_advance(m, m->lvl_start[d - 1], m->lvl_n[d - 1], b, L);
            m->lvl_chain[d] = -1;
        }
        m->lvl_n[d] = L->n - m->lvl_start[d];
        m->lvl_nodes[d] = m->n_nodes;
        if (w->esc >= 0 && has_top(m, L->v + m->lvl_start[d], m->lvl_n[d], w->esc)) { /* left the rule */
            g_ids_push(w->deps, k);
            k = v->tn_next[k];
            continue;
        }
        if (m->lvl_n[d] > 0) allowed += allow_tokens(v, v->tn_tok[k], mask, &lo, &hi);
        k = m->lvl_n[d] > 0 ? k + 1 : v->tn_next[k];
    }
    m->n_nodes = mark0;
    L->base = 0;
    w->lo = LM_MIN(lo, hi), w->hi = hi;
    return allowed;
}

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
}

/* Adds element pos to a stack's two hashes (top to bottom). */
static void hash_pos(uint64_t *a, uint64_t *b, int32_t pos) {
    *a = mix(*a, (uint64_t)pos);
    *b = mix(*b ^ 0xA5A5A5A5u, (uint64_t)pos * 0x9E3779B1u);
}

/* ---- per-element tables ---- */

/* Past this many stacks a mask is walked with the whole set instead. */
#define G_TABLE_STACKS 16
/* The tables of one grammar hold at most this many bytes (beside the
 * cache's 64 MB; the server keeps 64 grammars). A table is mostly a short
 * id list; one over most of a 151k vocabulary is ~19 KB. */
#define G_TABLE_BYTES (32u << 20)
/* A key holds at most this many elements (a stack's top ones). */
#define G_TABLE_DEPTH 8

/* The tokens a stack's top elements allow without leaving the lowest of
 * them (ids when few, else mask words [lo, hi)), and the trie nodes where
 * a path leaves it. */
typedef struct g_table {
    int32_t *ids;
    int n_ids;       /* -1: words */
    uint32_t *words;
    int lo, hi, n_allowed;
    int32_t *deps;
    int n_deps;
} g_table;

struct g_table_ent {
    uint64_t k1, k2; /* 0, 0: empty */
    g_table *t;
};

static void table_free(g_table *t) {
    if (!t) return;
    free(t->ids), free(t->words), free(t->deps), free(t);
}

void g_tables_free(lm_grammar *g) {
    for (int i = 0; i < g->tab_cap; i++) table_free(g->tab[i].t);
    free(g->tab);
    g->tab = NULL;
    g->tab_cap = g->tab_n = 0;
    g->tab_bytes = 0;
}

void lm_grammar_set_tables(lm_grammar *g, bool on) {
    pthread_mutex_lock(&g->mu);
    g->tables_off = !on;
    pthread_mutex_unlock(&g->mu);
}

/* Stack id's key: its top element, and the ones below for as long as
 * what is above can match nothing (a stack whose top may pop at once
 * depends on its parent from the first byte on). */
static int table_key(const lm_grammar_matcher *m, int32_t id, int32_t *pos, uint64_t *k1, uint64_t *k2) {
    int n = 0;
    uint64_t a = 5, b = 0x2545F4914F6CDD1Dull;
    for (; id >= 0 && n < G_TABLE_DEPTH; id = m->nodes[id].parent) {
        pos[n++] = m->nodes[id].pos;
        hash_pos(&a, &b, m->nodes[id].pos);
        if (!m->g->nullable[m->nodes[id].pos]) break;
    }
    *k1 = a | 1, *k2 = b;
    return n;
}

static g_table_ent *table_find(lm_grammar *g, uint64_t k1, uint64_t k2) {
    if (!g->tab_cap) return NULL;
    for (int i = (int)(k1 & (uint64_t)(g->tab_cap - 1));; i = (i + 1) & (g->tab_cap - 1)) {
        g_table_ent *c = &g->tab[i];
        if (!c->k1 || (c->k1 == k1 && c->k2 == k2)) return c;
    }
}

/* Bits set in mask[0, words): with the popcnt instruction where the CPU
 * has it (the baseline x86-64 build calls a library routine instead). */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("popcnt"))) static int count_bits_popcnt(const uint32_t *mask, int words) {
    int c = 0;
    for (int i = 0; i < words; i++) c += __builtin_popcount(mask[i]);
    return c;
}
#endif

static int count_bits(const uint32_t *mask, int words) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("popcnt")) return count_bits_popcnt(mask, words);
#endif
    int c = 0;
    for (int i = 0; i < words; i++) c += __builtin_popcount(mask[i]);
    return c;
}

/* The table of the stack's top elements pos[0, n) (pos[0] the top): a
 * walk from them over the sentinel; scratch [words] is left zero. */
static g_table *table_make(lm_grammar_matcher *m, const int32_t *pos, int n, uint32_t *scratch) {
    const int mark = m->n_nodes;
    int32_t top = gm_node_new(m, m->g->ctx, -1);
    for (int i = n - 1; i >= 0; i--) top = gm_node_new(m, pos[i], top);
    g_ids deps = { 0 };
    g_table *t = lm_xcalloc(1, sizeof *t);
    g_walk w = { .start = &top, .n_start = 1, .esc = m->g->ctx + 1, .deps = &deps };
    t->n_allowed = walk(m, &w, scratch);
    m->n_nodes = mark;
    t->deps = deps.v, t->n_deps = deps.n;
    const int lo = w.lo, hi = w.hi;
    if (t->n_allowed <= (hi - lo) * 2) { /* few: as ids */
        t->ids = lm_xmalloc((size_t)(t->n_allowed + 1) * sizeof *t->ids);
        for (int i = lo; i < hi; i++)
            for (uint32_t x = scratch[i]; x; x &= x - 1) t->ids[t->n_ids++] = i * 32 + __builtin_ctz(x);
    } else {
        t->n_ids = -1;
        t->lo = lo, t->hi = hi;
        t->words = lm_xmalloc((size_t)(hi - lo) * sizeof *t->words);
        memcpy(t->words, scratch + lo, (size_t)(hi - lo) * sizeof *t->words);
    }
    memset(scratch + lo, 0, (size_t)(hi - lo) * sizeof *scratch);
    return t;
}

static size_t table_bytes(const g_table *t) {
    return sizeof *t + (size_t)LM_MAX(t->n_ids, 0) * 4 + (size_t)(t->n_ids < 0 ? t->hi - t->lo : 0) * 4 +
           (size_t)t->n_deps * 4;
}

/* Adds t's tokens to mask and its nodes to m->roots. */
static void table_use(lm_grammar_matcher *m, const g_table *t, uint32_t *mask) {
    if (t->n_ids >= 0)
        for (int i = 0; i < t->n_ids; i++) mask[t->ids[i] >> 5] |= 1u << (t->ids[i] & 31);
    else
        for (int i = t->lo; i < t->hi; i++) mask[i] |= t->words[i - t->lo];
    for (int i = 0; i < t->n_deps; i++) g_ids_push(&m->roots, t->deps[i]);
}

/* Keeps t under key (k1, k2) (the caller holds g->mu); false when another
 * thread was first (t is then the caller's to free). */
static bool table_put(lm_grammar *g, uint64_t k1, uint64_t k2, g_table *t) {
    const size_t bytes = table_bytes(t);
    g_table_ent *c = table_find(g, k1, k2);
    if (c && c->k1) return false;
    if (g->tab_bytes + bytes > G_TABLE_BYTES || 2 * (g->tab_n + 1) > g->tab_cap) {
        if (g->tab_bytes + bytes > G_TABLE_BYTES || g->tab_cap >= (1 << 20)) { /* full: start over */
            const int cap = g->tab_cap;
            g_tables_free(g);
            g->tab_cap = cap;
        } else { /* grow */
            g_table_ent *old = g->tab;
            const int cap = g->tab_cap;
            g->tab_cap = cap ? cap * 2 : 256;
            g->tab = lm_xcalloc((size_t)g->tab_cap, sizeof *g->tab);
            for (int i = 0; i < cap; i++)
                if (old[i].k1) *table_find(g, old[i].k1, old[i].k2) = old[i];
            free(old);
        }
        if (!g->tab) g->tab = lm_xcalloc((size_t)g->tab_cap, sizeof *g->tab);
    }
    c = table_find(g, k1, k2);
    c->k1 = k1, c->k2 = k2, c->t = t;
    g->tab_n++;
    g->tab_bytes += bytes;
    g->st.tables++;
    return true;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The mask of the current set from its stacks' tables, then a walk of the
 * nodes where they leave their keys; returns how many are allowed. */
static int mask_by_tables(lm_grammar_matcher *m, uint32_t *mask, int words) {
    lm_grammar *g = m->g;
    m->roots.n = 0;
    int used = 0, last_n = 0;
    for (int i = 0; i < m->cur.n; i++) {
        const int32_t id = m->cur.v[i], top = m->nodes[id].pos;
        if (g->el[top].type == G_END || g->el[top].type == G_ALT) continue; /* the grammar has ended: no byte */
        int32_t pos[G_TABLE_DEPTH];
        uint64_t k1, k2;
        const int n = table_key(m, id, pos, &k1, &k2);
        pthread_mutex_lock(&g->mu);
        const g_table_ent *c = table_find(g, k1, k2);
        const bool have = c && c->k1;
        if (have) table_use(m, c->t, mask), g->st.table_uses++, last_n = c->t->n_allowed;
        pthread_mutex_unlock(&g->mu);
        used++;
        if (have) continue;
        if (m->scratch_words < words) {
            free(m->scratch);
            m->scratch = lm_xcalloc((size_t)words, sizeof *m->scratch);
            m->scratch_words = words;
        }
        g_table *t = table_make(m, pos, n, m->scratch);
        table_use(m, t, mask);
        last_n = t->n_allowed;
        pthread_mutex_lock(&g->mu);
        const bool kept = table_put(g, k1, k2, t);
        pthread_mutex_unlock(&g->mu);
        if (!kept) table_free(t);
    }
    g_ids *r = &m->roots;
    if (!r->n && used <= 1) return used ? last_n : 0;
    if (r->n) {
        qsort(r->v, (size_t)r->n, sizeof *r->v, cmp_i32);
        int n = 1;
        for (int i = 1; i < r->n; i++)
            if (r->v[i] != r->v[n - 1]) r->v[n++] = r->v[i];
        r->n = n;
        walk(m, &(g_walk){ .start = m->cur.v, .n_start = m->cur.n, .esc = -1, .roots = r->v, .n_roots = r->n },
             mask);
    }
    return count_bits(mask, words);
}

/* ---- strict fill ---- */

/* The longest token spelling a prefix of s[0, n) (-1: none), its length. */
static int32_t longest_token(const lm_grammar_vocab *v, const char *s, size_t n, size_t *len) {
    int32_t best = -1;
    int k = 0, end = v->n_tn; /* the children of the current node: k .. end, by next[] */
    for (size_t d = 0; d < n && k < end; d++) {
        while (k < end && v->tn_byte[k] != (uint8_t)s[d]) k = v->tn_next[k];
        if (k >= end) break;
        if (v->tn_tok[k] >= 0) best = v->tn_tok[k], *len = d + 1;
        end = v->tn_next[k];
        k++;
    }
    return best;
}

int lm_grammar_fill(lm_grammar_matcher *m, int32_t *ids, int cap) {
    char buf[256];
    size_t n = lm_grammar_forced(m, buf, sizeof buf), at = 0;
    int k = 0;
    while (k < cap && at < n) {
        size_t len = 0;
        int32_t id = longest_token(m->v, buf + at, n - at, &len);
        if (id < 0 || at + len >= n) break;
        bool ok = lm_grammar_accept(m, id);
        LM_ASSERT(ok); /* its bytes are forced */
        ids[k++] = id;
        at += len;
    }
    return k;
}

/* ---- the cache ---- */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The set's key: each stack hashed twice (two seeds), each list sorted. */
static void set_key(const lm_grammar_matcher *m, uint64_t *k1, uint64_t *k2) {
    int n = m->cur.n;
    uint64_t *h = lm_xmalloc((size_t)(2 * n + 1) * sizeof *h);
    for (int i = 0; i < n; i++) {
        uint64_t a = 1, b = 0x51ED270B27DD4DE5ull;
        for (int32_t x = m->cur.v[i]; x >= 0; x = m->nodes[x].parent) hash_pos(&a, &b, m->nodes[x].pos);
        h[i] = a, h[n + i] = b;
    }
    qsort(h, (size_t)n, sizeof *h, cmp_u64);
    qsort(h + n, (size_t)n, sizeof *h, cmp_u64);
    uint64_t a = mix(2, (uint64_t)m->cur.accepting), b = mix(3, (uint64_t)m->cur.accepting + 7);
    for (int i = 0; i < n; i++) a = mix(a, h[i]), b = mix(b, h[n + i]);
    free(h);
    *k1 = a | 1; /* never 0: an empty slot */
    *k2 = b;
}

static g_cache_ent *cache_find(lm_grammar *g, uint64_t k1, uint64_t k2) {
    if (!g->cache_cap) return NULL;
    for (int i = (int)(k1 & (uint64_t)(g->cache_cap - 1));; i = (i + 1) & (g->cache_cap - 1)) {
        g_cache_ent *c = &g->cache[i];
        if (!c->k1 || (c->k1 == k1 && c->k2 == k2)) return c;
    }
}

static void cache_put(lm_grammar *g, int words, uint64_t k1, uint64_t k2, const uint32_t *mask, int n_allowed) {
    size_t bytes = (size_t)words * 4;
    int most = (int)LM_MAX(LM_MIN(G_CACHE_BYTES / bytes, G_CACHE_MAX), 16);
    if (!g->cache_cap) {
        int cap = 16;
        while (cap < 2 * most) cap *= 2;
        g->cache_cap = cap;
        g->cache = lm_xcalloc((size_t)cap, sizeof *g->cache);
    }
    if (g->cache_n >= most) { /* full: start over (the states that matter come back at once) */
        for (int i = 0; i < g->cache_cap; i++) free(g->cache[i].mask);
        memset(g->cache, 0, (size_t)g->cache_cap * sizeof *g->cache);
        g->cache_n = 0;
    }
    g_cache_ent *c = cache_find(g, k1, k2);
    if (c->k1) return;
    c->k1 = k1, c->k2 = k2;
    c->mask = lm_xmalloc(bytes);
    memcpy(c->mask, mask, bytes);
    c->n_allowed = n_allowed;
    g->cache_n++;
}

int lm_grammar_mask(lm_grammar_matcher *m, uint32_t *mask) {
    const double t0 = lm_now();
    const lm_grammar_vocab *v = m->v;
    const int words = lm_grammar_mask_words(v->n_vocab);
    lm_grammar *g = m->g;
    if (m->ended) {
        memset(mask, 0, (size_t)words * 4);
        return 0;
    }
    uint64_t k1, k2;
    set_key(m, &k1, &k2);
    pthread_mutex_lock(&g->mu);
    if (!g->cache_vocab) g->cache_vocab = v;
    const bool cacheable = g->cache_vocab == v;
    const bool tables = cacheable && !g->tables_off && m->cur.n <= G_TABLE_STACKS;
    g_cache_ent *c = cacheable ? cache_find(g, k1, k2) : NULL;
    if (c && c->k1) {
        memcpy(mask, c->mask, (size_t)words * 4);
        int n = c->n_allowed;
        g->st.masks++, g->st.mask_hits++;
        g->st.mask_s += lm_now() - t0;
        pthread_mutex_unlock(&g->mu);
        return n;
    }
    pthread_mutex_unlock(&g->mu);
    memset(mask, 0, (size_t)words * 4);
    int n = tables ? mask_by_tables(m, mask, words)
                   : walk(m, &(g_walk){ .start = m->cur.v, .n_start = m->cur.n, .esc = -1 }, mask);
    if (m->cur.accepting)
        for (int i = 0; i < v->n_end; i++, n++) mask[v->end_ids[i] >> 5] |= 1u << (v->end_ids[i] & 31);
    pthread_mutex_lock(&g->mu);
    if (cacheable) cache_put(g, words, k1, k2, mask, n);
    g->st.masks++;
    g->st.mask_s += lm_now() - t0;
    pthread_mutex_unlock(&g->mu);
    return n;
}
