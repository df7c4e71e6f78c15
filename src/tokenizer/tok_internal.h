/* tok_internal.h - the tokenizer's pieces, shared by the files of src/tokenizer/.
 *
 * A tokenizer is data: a vocabulary (string <-> id hash map), a merge table,
 * added tokens with their matching trie, and the Hugging Face pipeline as
 * tagged component structs (normalizer, pre-tokenizer, post-processor,
 * decoder). tokenizer_json.c and gguf_vocab.c fill it; the other files run it. */
#ifndef LM_TOK_INTERNAL_H
#define LM_TOK_INTERNAL_H

#include <pthread.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "lm_tokenizer.h"

/* ---- growable buffers ---- */
void tok_str_reserve(lm_tok_str *s, size_t extra);
void tok_str_append(lm_tok_str *s, const void *p, size_t n);
void tok_ids_push(lm_tok_ids *v, int32_t id);

/* ---- UTF-8 and Unicode helpers (utf8.c) ---- */
/* Decodes the code point at s (valid UTF-8 assumed, n >= 1); sets *len. */
uint32_t tok_utf8_cp(const char *s, size_t n, int *len);
int tok_utf8_put(uint32_t cp, char *out); /* returns bytes written (1..4) */
int tok_utf8_len(uint8_t lead);           /* length from a lead byte; 1 for junk */
/* Appends src to out with invalid sequences replaced by U+FFFD exactly as
 * Rust's String::from_utf8_lossy does. Returns true if src was valid. */
bool tok_utf8_lossy(lm_tok_str *out, const char *src, size_t n);
bool tok_utf8_valid(const char *s, size_t n);
/* Incremental lossy decoder: feed bytes, get valid UTF-8 out; a trailing
 * incomplete sequence is held until more bytes or the end. */
typedef struct tok_utf8_stream {
    uint8_t pend[4];
    int npend;
} tok_utf8_stream;
void tok_utf8_stream_feed(tok_utf8_stream *u, const char *p, size_t n, lm_tok_str *out);
void tok_utf8_stream_end(tok_utf8_stream *u, lm_tok_str *out);
/* Code points newer than this machine's PCRE2/utf8proc tables know, with
 * their Unicode 16 general category (utf8proc's enum numbering); sorted. */
typedef struct tok_uni_range { uint32_t lo, hi; uint8_t cat; } tok_uni_range;
extern const tok_uni_range tok_uni_new[];
extern const int tok_uni_new_n;
/* Code points HF's (Unicode 10) normalisation tables do not know but
 * utf8proc would change: passed through by the normal forms. */
extern const tok_uni_range tok_uni_norm_new[];
extern const int tok_uni_norm_new_n;
bool tok_uni_in(const tok_uni_range *r, int n, uint32_t cp);
/* The general category (utf8proc numbering), Unicode 16. */
int tok_category(uint32_t cp);
bool tok_is_whitespace(uint32_t cp); /* Unicode White_Space (Rust char::is_whitespace) */
bool tok_is_alnum(uint32_t cp);      /* Rust char::is_alphanumeric */
bool tok_is_word(uint32_t cp);       /* Rust regex \w */
bool tok_is_numeric(uint32_t cp);    /* Rust char::is_numeric (Nd, Nl, No) */
bool tok_is_punct(uint32_t cp);      /* ASCII punctuation or Unicode P* */

/* ---- vocabulary: string -> id open-addressing map over an arena (vocab.c) ---- */
typedef struct tok_vocab {
    char *arena;
    size_t arena_len, arena_cap;
    uint32_t *off, *len;   /* [n_ids]: token bytes in arena; len UINT32_MAX = unused id */
    int32_t n_ids, id_cap;
    int32_t *slots;        /* id or -1 */
    size_t mask;
    size_t n_used;
} tok_vocab;

void tok_vocab_init(tok_vocab *v, size_t expect);
void tok_vocab_free(tok_vocab *v);
/* Sets id -> s. Returns false if the id already has a string (duplicates). */
bool tok_vocab_set(tok_vocab *v, int32_t id, const char *s, size_t n);
int32_t tok_vocab_get(const tok_vocab *v, const char *s, size_t n);
const char *tok_vocab_str(const tok_vocab *v, int32_t id, size_t *n);
uint64_t tok_hash(const void *p, size_t n);

/* Merge table: (left id, right id) -> (rank, merged id). */
typedef struct tok_merge { uint64_t key; uint32_t rank; int32_t id; } tok_merge;
typedef struct tok_merges {
    tok_merge *slots;   /* key UINT64_MAX = empty */
    size_t mask, n;
} tok_merges;
void tok_merges_init(tok_merges *m, size_t expect);
void tok_merges_free(tok_merges *m);
/* Later inserts of the same pair win, as a Rust HashMap collect does. */
void tok_merges_put(tok_merges *m, int32_t a, int32_t b, uint32_t rank, int32_t id);
static inline const tok_merge *tok_merges_get(const tok_merges *m, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & m->mask;
    for (;;) {
        const tok_merge *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & m->mask;
    }
}

/* ---- regex / literal patterns (pretokenize.c) ---- */
typedef enum tok_pat_kind { TOK_PAT_STRING, TOK_PAT_REGEX } tok_pat_kind;
typedef struct tok_pattern {
    tok_pat_kind kind;
    char *str;        /* the literal (STRING) or the source (REGEX) */
    size_t len;
    pcre2_code *re;   /* REGEX: compiled, JIT when available */
} tok_pattern;
/* Compiles p->str per kind; errors name the pattern and offset. */
int tok_pattern_compile(tok_pattern *p, lm_err *e);
void tok_pattern_free(tok_pattern *p);
/* A span list: [start, end) byte ranges with a "matched" flag. */
typedef struct tok_span { uint32_t start, end; uint8_t match; } tok_span;
typedef struct tok_spans { tok_span *v; size_t n, cap; } tok_spans;
void tok_spans_push(tok_spans *s, uint32_t start, uint32_t end, bool match);

/* Match data scratch for PCRE2 (per encode workspace). */
typedef struct tok_regex_scratch {
    pcre2_match_data *md;
} tok_regex_scratch;
/* HF Pattern::find_matches: spans covering s, flagged match / non-match. */
void tok_find_matches(const tok_pattern *p, const char *s, size_t n, tok_spans *out,
                      tok_regex_scratch *rs);

/* ---- normalizers (normalize.c) ---- */
typedef enum tok_norm_kind {
    TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_LOWERCASE,
    TOK_NORM_PREPEND, TOK_NORM_REPLACE, TOK_NORM_STRIP, TOK_NORM_STRIP_ACCENTS,
    TOK_NORM_BERT, TOK_NORM_BYTELEVEL, TOK_NORM_SEQUENCE
} tok_norm_kind;
typedef struct tok_normalizer {
    tok_norm_kind kind;
    char *content;            /* PREPEND: prepend; REPLACE: content */
    size_t content_len;
    tok_pattern pat;          /* REPLACE */
    bool left, right;         /* STRIP */
    /* BERT */
    bool clean_text, handle_chinese, strip_accents, lowercase;
    struct tok_normalizer *sub;  /* SEQUENCE */
    int n_sub;
} tok_normalizer;
/* Normalises in[0..n) into out (replacing its contents). */
void tok_normalize(const tok_normalizer *nz, const char *in, size_t n, lm_tok_str *out,
                   lm_tok_str *tmp, tok_regex_scratch *rs);
void tok_normalizer_free(tok_normalizer *nz);

/* ---- pre-tokenizers (pretokenize.c) ---- */
typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;
typedef enum tok_pre_kind {
    TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE, TOK_PRE_WHITESPACE,
    TOK_PRE_WHITESPACE_SPLIT, TOK_PRE_PUNCTUATION, TOK_PRE_DIGITS, TOK_PRE_BERT,
    TOK_PRE_CHAR_DELIM, TOK_PRE_SEQUENCE
} tok_pre_kind;
typedef enum tok_prepend { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend;
typedef struct tok_pretok {
    tok_pre_kind kind;
    tok_pattern pat;               /* SPLIT; WHITESPACE uses its own regex */
    tok_split_behavior behavior;   /* SPLIT, PUNCTUATION */
    bool invert;                   /* SPLIT */
    bool add_prefix_space, use_regex; /* BYTELEVEL */
    bool defer_map;                /* BYTELEVEL: bytes are mapped by the BPE model instead */
    uint32_t replacement;          /* METASPACE, CHAR_DELIM: the code point */
    tok_prepend prepend;           /* METASPACE */
    bool split;                    /* METASPACE */
    bool individual_digits;        /* DIGITS */
    struct tok_pretok *sub;        /* SEQUENCE */
    int n_sub;
} tok_pretok;
void tok_pretok_free(tok_pretok *p);
/* Compiles the regex that ByteLevel(use_regex) or Whitespace uses. */
int tok_pretok_builtin_regex(tok_pretok *p, lm_err *e);

/* Pieces of text during pre-tokenisation: ranges into a buffer. */
typedef struct tok_piece { uint32_t off, len; uint8_t first; } tok_piece;
typedef struct tok_pieces {
    lm_tok_str buf;
    tok_piece *v;
    size_t n, cap;
} tok_pieces;
void tok_pieces_push(tok_pieces *p, uint32_t off, uint32_t len, bool first);
/* Runs the pre-tokenizer over p in place; tmp is scratch of the same type. */
void tok_pretokenize(const tok_pretok *pt, tok_pieces *p, tok_pieces *tmp, tok_spans *spans,
                     tok_regex_scratch *rs);

/* ---- decoders (decode.c) ---- */
typedef enum tok_dec_kind {
    TOK_DEC_BYTELEVEL, TOK_DEC_METASPACE, TOK_DEC_REPLACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_FUSE,
    TOK_DEC_STRIP, TOK_DEC_WORDPIECE, TOK_DEC_BPE, TOK_DEC_SEQUENCE
} tok_dec_kind;
typedef struct tok_decoder {
    tok_dec_kind kind;
    tok_pattern pat;               /* REPLACE */
    char *content;                 /* REPLACE: content; WORDPIECE: prefix; BPE: suffix */
    size_t content_len;
    uint32_t strip_char;           /* STRIP content; METASPACE replacement */
    int strip_start, strip_stop;   /* STRIP */
    bool prepend_never;            /* METASPACE prepend_scheme == never */
    bool cleanup;                  /* WORDPIECE */
    struct tok_decoder *sub;       /* SEQUENCE */
    int n_sub;
} tok_decoder;
void tok_decoder_free(tok_decoder *d);

/* ---- added tokens ---- */
typedef struct tok_added {
    int32_t id;
    char *content;
    size_t len;
    bool special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* Byte trie for leftmost-longest matching of added tokens. */
typedef struct tok_trie_node {
    int32_t child, sibling; /* first child, next sibling; -1 = none */
    int32_t added;          /* index into tok->added, -1 = not a token end */
    uint8_t byte;
} tok_trie_node;
typedef struct tok_trie {
    tok_trie_node *nodes;
    int32_t n, cap;
    int32_t root[256];      /* child of the root for each first byte, -1 = none */
} tok_trie;

/* A segment of text: plain text (added -1) or an added token (its index
 * in lm_tokenizer.added). */
typedef struct tok_seg { uint32_t start, end; int32_t added; } tok_seg; /* added -1 = text */
typedef struct tok_segs { tok_seg *v; size_t n, cap; } tok_segs;

/* ---- post-processor ---- */
typedef struct tok_post {
    /* Ids added before and after the sequence for one input (TemplateProcessing
     * single, Bert/Roberta cls/sep); flattened at load. */
    int32_t *pre, *post;
    int n_pre, n_post;
} tok_post;

/* ---- BPE model ---- */
typedef struct tok_bpe {
    tok_merges merges;
    int32_t unk;             /* -1 none */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix;   /* continuing_subword_prefix / end_of_word_suffix, may be NULL */
    size_t prefix_len, suffix_len;
    bool byte_level;         /* pieces arrive as raw bytes; map with GPT-2's byte table */
    int32_t byte_ids[256];   /* byte-level: id of each byte's mapped character, -1 absent */
    int32_t fallback_ids[256]; /* byte fallback: id of "<0xXX>", -1 absent */
} tok_bpe;

/* ---- the encode workspace (scratch + word cache) ---- */
typedef struct tok_cache_ent { uint64_t h; uint32_t key_off, key_len, ids_off, ids_len; } tok_cache_ent;
typedef struct tok_work {
    lm_tok_str clean, norm, ntmp, word;
    tok_pieces pieces, ptmp;
    tok_spans spans;
    tok_segs segs, nsegs;
    tok_regex_scratch rs;
    /* BPE symbols and heap */
    struct tok_sym *syms;
    size_t syms_cap;
    struct tok_heap_ent *heap;
    size_t heap_cap;
    /* word -> ids cache */
    tok_cache_ent *cache;
    size_t cache_mask, cache_n;
    lm_tok_str cache_keys;
    lm_tok_ids cache_ids;
    bool use_cache;
} tok_work;
void tok_work_init(tok_work *w, bool use_cache);
void tok_work_free(tok_work *w);

/* ---- the tokenizer ---- */
struct lm_tokenizer {
    tok_vocab vocab;          /* the model's vocabulary (added tokens are apart) */
    tok_bpe bpe;
    tok_added *added;
    int n_added;
    uint8_t *special;         /* [n_ids]: 1 = special added token */
    int32_t *added_of_id;     /* [n_ids]: index into added, -1 */
    tok_vocab added_map;      /* content -> index into added */
    int32_t n_ids;            /* one past the largest model or added id */
    tok_trie trie_raw, trie_norm;
    tok_normalizer *normalizer;   /* NULL = none */
    tok_pretok *pretok;           /* NULL = none */
    tok_decoder *decoder;         /* NULL = join with " " */
    tok_post post;
    /* tokenizer_config.json & GGUF */
    char *chat_template, *bos_token, *eos_token, *pad_token, *unk_token;
    bool add_bos, add_eos;    /* post-processor adds these (derived at setup) */
    /* SentencePiece-style words without a pre-tokenizer can be whole
     * paragraphs; they are cut before a "▁" where no merge can cross (see
     * spm_cuts in tokenizer.c). cut_ok: enabled; no_cut: characters c for
     * which some token contains c + "▁". */
    bool cut_ok;
    uint32_t *no_cut;
    int n_no_cut;
    int32_t bos_id, eos_id, pad_id, unk_id;
    /* encode workspace with the word cache */
    pthread_mutex_t lock;
    tok_work work;
};

/* Builds the tries and per-id tables after added tokens are known. */
int tok_finish_setup(lm_tokenizer *t, lm_err *e);
lm_tokenizer *tok_alloc(void);

/* added.c */
void tok_trie_free(tok_trie *t);
void tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added);
void tok_trie_init(tok_trie *t);
/* Splits s into text segments and added-token segments per HF's rules
 * (leftmost-longest, single_word, lstrip, rstrip). */
void tok_split_added(const lm_tokenizer *t, const tok_trie *trie, const char *s, size_t n,
                     const lm_tok_span *lit, size_t n_lit, tok_segs *out);
/* Whether [a, b) overlaps one of the n_lit ranges lit. A special token
 * matched there is text (lm_tokenizer_encode_lit). */
bool tok_spans_overlap(const lm_tok_span *lit, size_t n_lit, size_t a, size_t b);

/* bpe.c: appends the ids of one pre-token. */
void tok_bpe_word(const lm_tokenizer *t, tok_work *w, const char *s, size_t n, lm_tok_ids *out);
/* GPT-2 byte <-> unicode table. */
extern const uint16_t tok_byte_to_cp[256];
int tok_cp_to_byte(uint32_t cp); /* -1 if not a mapped code point */

/* tokenizer_json.c */
int tok_parse_json(lm_tokenizer *t, const char *json, size_t len, const char *label, lm_err *e);
int tok_parse_config(lm_tokenizer *t, const char *json, size_t len, const char *label, lm_err *e);

/* gguf_vocab.c */
int tok_from_gguf(lm_tokenizer *t, const struct lm_gguf *g, lm_err *e);

#endif
