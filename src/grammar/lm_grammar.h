/* lm_grammar.h - constrained decoding: grammars as token masks.
 *
 * Design note
 * -----------
 * A grammar is compiled once into a flat byte-level context-free grammar:
 * rules of alternatives of elements, each element a set of bytes or a
 * reference to a rule. Three front ends compile into it:
 *   lm_grammar_from_gbnf    a GBNF-style grammar (the subset is in gbnf.c)
 *   lm_grammar_from_regex   a regular expression (regex.c), matched whole
 *   lm_grammar_from_schema  a JSON Schema (schema.c: it writes GBNF)
 * Characters outside ASCII become byte sequences at compile time (UTF-8
 * ranges split into byte ranges), so matching never decodes UTF-8.
 *
 * A matcher (one per request) holds the set of parse stacks that the bytes
 * accepted so far leave open; stacks are persistent lists in a node arena,
 * so a step shares everything below the top. The next token's mask walks
 * the vocabulary as a byte trie (lm_grammar_vocab) with the stacks, pruning
 * a whole subtree at the first byte no stack takes and allowing a whole
 * subtree of characters that provably take the stacks down one path (a
 * string's characters, counted or not: mask.c's chain). Masks are cached per
 * grammar by the stack set they were computed for: a JSON value revisits a
 * few states (inside a string, after a comma, ...) again and again, and
 * each is computed once. A set the cache lacks is put together from tables
 * of its stacks' top elements (the tokens that stay inside them, which no
 * stack below can change, computed once per grammar) and a walk of only
 * the trie nodes where a token leaves them: a nested document meets a new
 * stack set at every depth, but the same few tables. PCRE2 cannot drive
 * this (it matches a subject, it does not say which next bytes keep a
 * match possible), hence the automaton here.
 *
 * Accepting tokens: a token is allowed when every one of its bytes is; the
 * vocabulary's end tokens (eos) only when the grammar can end there. A
 * matcher remembers each accepted token so that lm_grammar_rollback can
 * undo drafted tokens (speculative decoding checks a draft by accepting it
 * token by token and rolling back from the first rejected one). */
#ifndef LM_GRAMMAR_H
#define LM_GRAMMAR_H

#include <jansson.h>

#include "../base/lm_base.h"

typedef struct lm_grammar lm_grammar;
typedef struct lm_grammar_vocab lm_grammar_vocab;
typedef struct lm_grammar_matcher lm_grammar_matcher;

/* ---- compiling ---- */

/* Each returns 0 and a grammar (one reference), or -1 with e naming what is
 * wrong or unsupported. */
int lm_grammar_from_gbnf(lm_grammar **out, const char *src, size_t len, lm_err *e);
int lm_grammar_from_regex(lm_grammar **out, const char *re, size_t len, lm_err *e);
int lm_grammar_from_schema(lm_grammar **out, const json_t *schema, lm_err *e);
/* The GBNF text lm_grammar_from_schema compiles (caller frees); NULL and e
 * when the schema uses something unsupported. */
char *lm_schema_to_gbnf(const json_t *schema, lm_err *e);
/* Appends to out the GBNF rules of schema under the rule name `prefix`
 * (other rules it needs get names starting with prefix too): for grammars
 * that embed several schemas (tool calls). -1 with e on an unsupported
 * schema. */
int lm_schema_append_gbnf(FILE *out, const json_t *schema, const char *prefix, lm_err *e);
/* Escapes n bytes of s as the inside of a GBNF string literal. */
void lm_gbnf_put_literal(FILE *out, const char *s, size_t n);

lm_grammar *lm_grammar_ref(lm_grammar *g);
void lm_grammar_unref(lm_grammar *g);

/* ---- the vocabulary ---- */

/* The tokens a grammar may produce: bytes[i] / lens[i] for id i (NULL or
 * length 0: never produced, e.g. hidden special tokens), and the end ids
 * (allowed only where the grammar can end). n_vocab is the model's: ids
 * past the tokenizer's are simply never allowed. */
lm_grammar_vocab *lm_grammar_vocab_create(int n_vocab, const char *const *bytes, const size_t *lens,
                                          const int32_t *end_ids, int n_end);
void lm_grammar_vocab_free(lm_grammar_vocab *v);
int lm_grammar_vocab_size(const lm_grammar_vocab *v);
/* Words of a mask: bit id % 32 of word id / 32 is set when id is allowed. */
static inline int lm_grammar_mask_words(int n_vocab) { return (n_vocab + 31) / 32; }

/* ---- matching ---- */

lm_grammar_matcher *lm_grammar_matcher_create(lm_grammar *g, const lm_grammar_vocab *v);
void lm_grammar_matcher_free(lm_grammar_matcher *m);
/* The allowed next tokens into mask [lm_grammar_mask_words(n_vocab)];
 * returns how many are allowed. */
int lm_grammar_mask(lm_grammar_matcher *m, uint32_t *mask);
/* Takes token id: false (nothing changes) when the grammar does not allow
 * it. An end token is allowed when the grammar can end; it ends it. */
bool lm_grammar_accept(lm_grammar_matcher *m, int32_t id);
/* Takes raw bytes (a prefill the caller wrote): false (nothing changes)
 * when not allowed. Counts as one step for rollback. */
bool lm_grammar_accept_bytes(lm_grammar_matcher *m, const char *s, size_t n);
/* Undoes the last n accepted steps (n <= lm_grammar_steps). */
void lm_grammar_rollback(lm_grammar_matcher *m, int n);
int lm_grammar_steps(const lm_grammar_matcher *m);
/* The grammar may end here (an end token is allowed). */
bool lm_grammar_can_end(const lm_grammar_matcher *m);
/* The grammar allows nothing more but its end. */
bool lm_grammar_done(const lm_grammar_matcher *m);
/* The bytes the grammar forces next (exactly one continuation each; stops
 * where there is a choice or the grammar may end), at most cap; returns
 * how many were written. For strict fill. */
size_t lm_grammar_forced(lm_grammar_matcher *m, char *buf, size_t cap);

/* Strict fill: the tokens that spell the bytes the grammar forces next
 * (longest vocabulary match first), accepted into m, at most cap; the
 * token that would reach the end of the forced bytes is left to the model
 * (it may prefer one that runs on past them). Returns how many. */
int lm_grammar_fill(lm_grammar_matcher *m, int32_t *ids, int cap);

/* ---- facts ---- */

typedef struct lm_grammar_stats {
    uint64_t masks, mask_hits;  /* masks computed, of which from the cache */
    uint64_t tables, table_uses; /* per-element tables made, and taken as made before */
    double mask_s;              /* seconds spent in lm_grammar_mask */
    double compile_s;           /* seconds the compile took */
    int rules, elements;
} lm_grammar_stats;
void lm_grammar_get_stats(lm_grammar *g, lm_grammar_stats *s);
/* Whether a mask the cache lacks is built from per-element tables (the
 * default) or by walking the vocabulary with the whole stacks; the masks
 * are the same. For tests and benchmarks. */
void lm_grammar_set_tables(lm_grammar *g, bool on);

#endif
