/* grammar_internal.h - what src/grammar's files share.
 *
 *   grammar.c   the builder every front end writes into, UTF-8 classes as
 *               byte rules, the checks, the compiled grammar
 *   gbnf.c      GBNF text -> builder
 *   regex.c     regular expression -> builder
 *   schema.c    JSON Schema -> GBNF text
 *   matcher.c   parse stacks: accept, rollback, forced bytes
 *   mask.c      the vocabulary trie and the token mask (with its cache)
 *
 * A compiled grammar is one flat element array: rule r starts at
 * el[rule_start[r]]; its alternatives are separated by G_ALT and the rule
 * ends with G_END. */
#ifndef LM_GRAMMAR_INTERNAL_H
#define LM_GRAMMAR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "lm_grammar.h"

enum { G_END = 0, G_ALT, G_BYTES, G_REF };

typedef struct g_elem {
    uint8_t type;
    int32_t arg; /* G_BYTES: index into sets; G_REF: rule */
} g_elem;

typedef struct g_set {
    uint64_t w[4];
} g_set;

static inline bool g_set_has(const g_set *s, uint8_t b) { return (s->w[b >> 6] >> (b & 63)) & 1; }
static inline void g_set_add(g_set *s, uint8_t b) { s->w[b >> 6] |= 1ull << (b & 63); }

/* ---- the builder ---- */

typedef struct g_seq {
    g_elem *v;
    int n, cap;
} g_seq;

typedef struct g_rule {
    char *name;     /* NULL for a rule made for a group or repetition */
    g_seq body;     /* alternatives separated by G_ALT, no trailing G_END */
    bool defined;
} g_rule;

typedef struct g_builder {
    g_rule *rules;
    int n_rules, cap_rules;
    g_set *sets;
    int n_sets, cap_sets;
    int32_t *names;     /* open addressing: rule ids of named rules, -1 empty */
    int name_cap, n_names;
    bool json_string;   /* classes leave out what a JSON string must escape */
    bool json_bad;      /* a literal such character was asked for */
} g_builder;

void gb_init(g_builder *b);
void gb_free(g_builder *b);
/* The rule named name (created undefined when new). */
int gb_named(g_builder *b, const char *name, size_t n);
int gb_anon(g_builder *b);
void gb_push(g_builder *b, int rule, uint8_t type, int32_t arg);
/* A byte set element appended to rule. */
void gb_bytes(g_builder *b, int rule, const g_set *s);
void gb_byte(g_builder *b, int rule, uint8_t c);
/* Code point ranges lo[i]..hi[i] (inclusive; negate: their complement in
 * U+0000..U+10FFFF without surrogates) as one element of rule: a byte set
 * when all are ASCII, else a reference to a rule of UTF-8 byte sequences. */
void gb_class(g_builder *b, int rule, const uint32_t *lo, const uint32_t *hi, int n, bool negate);
/* UTF-8 of code point cp as byte elements of rule. */
void gb_codepoint(g_builder *b, int rule, uint32_t cp);
/* Elements [from, n) of rule's body, repeated min..max times (max < 0:
 * unbounded), put back as elements. -1 with e when the bounds are too big. */
int gb_repeat(g_builder *b, int rule, int from, int min, int max, lm_err *e);
/* Checks (every named rule defined, no repetition of what can match
 * nothing, no left recursion) and flattens into a grammar rooted at root. */
int gb_finish(g_builder *b, int root, lm_grammar **out, lm_err *e);
/* The expression re as a new rule (regex.c); json_string: as the inside of
 * a JSON string (no quote, backslash or control character is ever
 * produced; a literal one is an error). */
int lm_regex_rule(g_builder *b, const char *re, size_t len, bool json_string, int *rule, lm_err *e);

/* ---- the compiled grammar ---- */

typedef struct g_table_ent g_table_ent;

typedef struct g_cache_ent {
    uint64_t k1, k2;  /* 0, 0: empty */
    uint32_t *mask;   /* [mask words] */
    int n_allowed;
} g_cache_ent;

struct lm_grammar {
    atomic_int refs;
    g_elem *el;
    int n_el;
    int32_t *rule_start;
    int n_rules;
    g_set *sets;
    int n_sets;
    int root;
    int32_t start;       /* the element that references root: the first stack's top */
    int32_t ctx;         /* the context sentinel (mask.c's tables): a set of every byte, then G_END */
    /* per element p: the bytes that can come first from p to the end of its
     * alternative, and whether that rest can match nothing */
    g_set *first;        /* [n_el] */
    uint8_t *nullable;   /* [n_el] */
    /* the mask cache (mask.c); for one vocabulary, the first one masked */
    pthread_mutex_t mu;
    const lm_grammar_vocab *cache_vocab;
    g_cache_ent *cache;
    int cache_cap, cache_n;
    /* per-element tables (mask.c), by the key of a stack's top elements */
    struct g_table_ent *tab;
    int tab_cap, tab_n;
    size_t tab_bytes;
    bool tables_off;
    lm_grammar_stats st;
};

/* ---- matcher ---- */

typedef struct g_node {
    int32_t pos;    /* the next element to match; below the top, where a rule returns to */
    int32_t parent; /* -1: the bottom */
} g_node;

/* A set of stacks (node ids) being built: entries before base belong to
 * other sets (duplicates are looked for from base on). */
typedef struct g_ids {
    int32_t *v;
    int n, cap, base;
    bool accepting; /* some path ended the whole grammar */
} g_ids;

static inline void g_ids_push(g_ids *s, int32_t id) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = lm_xrealloc(s->v, (size_t)s->cap * sizeof *s->v);
    }
    s->v[s->n++] = id;
}

struct lm_grammar_matcher {
    lm_grammar *g;
    const lm_grammar_vocab *v;
    g_node *nodes;
    int n_nodes, cap_nodes;
    g_ids cur;           /* the stack set; cur.accepting: the bytes so far are a whole sentence */
    bool ended;          /* an end token was accepted */
    /* history for rollback: per step, the set before it (in hist_ids) */
    struct g_step {
        int n_nodes, ids_off, n_ids;
        bool accepting, ended;
    } *hist;
    int n_hist, cap_hist;
    g_ids hist_ids;
    g_ids tmp;           /* run_bytes, forced */
    g_ids roots;         /* the mask from tables (mask.c): trie nodes that need the whole stacks */
    uint32_t *scratch;   /* a table's mask while it is made, kept zero */
    int scratch_words;
    /* the mask walk (mask.c): sets by trie depth */
    g_ids lvl;
    int *lvl_start, *lvl_n, *lvl_nodes;
    int32_t *lvl_chain;  /* the set at this depth is the chain's C[lvl_chain], or -1 */
    int lvl_cap;
    /* the chain (mask.c): ch[off[d], off[d] + n[d]) is the set after d
     * bytes of class k[d - 1]; ch_len: the last nonempty one */
    g_ids ch;
    int *ch_off, *ch_n, ch_len;
    uint64_t (*ch_k)[2];
    uint64_t ch_dead[4]; /* bytes that take C[ch_len] to nothing (0: not known) */
    int8_t *ch_u8;       /* every UTF-8 character takes C[i] to C[i + 1]: 1 yes, 0 no, -1 not known yet */
    /* while probing, step() narrows probe to the bytes that every byte set
     * it tests holds exactly when it holds the byte stepped */
    bool probing;
    uint64_t probe[4];
};

/* A new node (the arena grows; truncate m->n_nodes to drop it). */
int32_t gm_node_new(lm_grammar_matcher *m, int32_t pos, int32_t parent);
/* Appends to out (deduplicated from out->base) the stacks of the set
 * out->v[in_off, in_off + n) after byte c. */
void gm_advance(lm_grammar_matcher *m, int in_off, int n, uint8_t c, g_ids *out);
/* Whether some stack of out->v[off, off + n) can end the grammar here. */
bool gm_accepting(const lm_grammar_matcher *m, const int32_t *ids, int n);

/* ---- vocabulary and tables (mask.c) ---- */

void g_tables_free(lm_grammar *g);

bool gv_is_end(const lm_grammar_vocab *v, int32_t id);
/* Token id's bytes, or NULL when the grammar never produces it. */
const char *gv_bytes(const lm_grammar_vocab *v, int32_t id, size_t *n);

#endif
