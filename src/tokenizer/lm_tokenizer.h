/* lm_tokenizer.h - text <-> token ids, matching Hugging Face `tokenizers`.
 *
 * A tokenizer is loaded from a Hugging Face tokenizer.json (plus the
 * tokenizer_config.json beside it), from a model folder holding those, or
 * from a GGUF file's tokenizer.ggml.* metadata. Encoding runs the same
 * pipeline as the Rust `tokenizers` crate: added tokens are split out of the
 * raw text, the rest is normalised, pre-tokenised, split into BPE tokens, and
 * the post-processor adds special tokens. Decoding runs the decoder chain.
 *
 * Threads: a loaded tokenizer is read-only except for an internal word cache
 * guarded by a mutex; encode and decode may be called from several threads
 * at once (a caller that finds the cache busy encodes without it).
 *
 * Input bytes that are not valid UTF-8 are replaced, as Rust's
 * String::from_utf8_lossy does, before encoding. Ids out of range are
 * skipped when decoding (as Hugging Face does).
 *
 * Supported (tokenizer.json): model BPE (byte-level or not, byte_fallback,
 * unk/fuse_unk, ignore_merges, continuing_subword_prefix/end_of_word_suffix,
 * merges as "a b" or ["a","b"]); normalizers NFC, NFD, NFKC, NFKD,
 * Lowercase, Prepend, Replace, Strip, StripAccents, BertNormalizer,
 * ByteLevel, Sequence; pre-tokenizers Split, ByteLevel, Metaspace,
 * Whitespace, WhitespaceSplit, Punctuation, Digits, BertPreTokenizer,
 * CharDelimiterSplit, Sequence; post-processors TemplateProcessing,
 * ByteLevel, BertProcessing, RobertaProcessing, Sequence; decoders
 * ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, WordPiece,
 * BPEDecoder, Sequence; added tokens with all five flags. Anything else
 * (Unigram/WordPiece/WordLevel models, Precompiled, UnicodeScripts, CTC)
 * fails to load with a message naming it. Truncation and padding settings
 * are ignored: encode never cuts or pads. Regexes and character classes
 * follow Unicode 16, as HF's Oniguruma does; normalisers follow HF's older
 * tables (characters after Unicode 10 pass through the normal forms). */
#ifndef LM_TOKENIZER_H
#define LM_TOKENIZER_H

#include "../base/lm_base.h"

struct lm_gguf;
struct lm_source;
typedef struct lm_tokenizer lm_tokenizer;

/* A growable array of token ids (caller frees ids, or uses lm_tok_ids_free). */
typedef struct lm_tok_ids {
    int32_t *ids;
    size_t n, cap;
} lm_tok_ids;

/* A growable byte string, always NUL-terminated after a call that fills it. */
typedef struct lm_tok_str {
    char *s;
    size_t len, cap;
} lm_tok_str;

void lm_tok_ids_free(lm_tok_ids *v);
void lm_tok_str_free(lm_tok_str *s);

/* ---- loading ---- */

/* From an opened source (format/lm_source.h): a GGUF file's metadata, a
 * folder's tokenizer.json, or a tokenizer.json file; beside the json,
 * tokenizer_config.json and chat_template.jinja when present. Everything is
 * copied: the source may be released after. */
int lm_tokenizer_load_from(lm_tokenizer **out, const struct lm_source *src, lm_err *e);
/* The same on a source opened from path (a tokenizer.json file, a folder
 * with tokenizer.json, or a .gguf file) and released after. */
int lm_tokenizer_load(lm_tokenizer **out, const char *path, lm_err *e);
/* From memory: json is a tokenizer.json document; config (may be NULL) a
 * tokenizer_config.json one. label names the source in errors. */
int lm_tokenizer_load_json(lm_tokenizer **out, const char *json, size_t len,
                           const char *config, size_t config_len, const char *label, lm_err *e);
/* From an open GGUF file's tokenizer.ggml.* keys (the file may be closed after). */
int lm_tokenizer_load_gguf(lm_tokenizer **out, const struct lm_gguf *g, lm_err *e);
void lm_tokenizer_free(lm_tokenizer *t);

/* ---- encode / decode ---- */

/* Appends the ids of text[0..len) to out. add_special: run the
 * post-processor's special tokens (e.g. <bos>). Returns 0, or -1 on a
 * failure the tokenizer cannot recover from (message in e). */
int lm_tokenizer_encode(lm_tokenizer *t, const char *text, size_t len, bool add_special,
                        lm_tok_ids *out, lm_err *e);
/* A byte range [start, end) of a text. */
typedef struct lm_tok_span {
    size_t start, end;
} lm_tok_span;
/* lm_tokenizer_encode where the n_lit ranges lit (sorted, not overlapping)
 * are literal text: a special added token (<|im_end|>, ...) is not matched
 * inside them, so text a user wrote can never become a control token; the
 * rest tokenizes exactly as lm_tokenizer_encode does. */
int lm_tokenizer_encode_lit(lm_tokenizer *t, const char *text, size_t len, bool add_special,
                            const lm_tok_span *lit, size_t n_lit, lm_tok_ids *out, lm_err *e);
/* The length of the special added token whose text starts at s[i] (the one
 * lm_tokenizer_encode would match there), or 0. */
size_t lm_tokenizer_special_at(const lm_tokenizer *t, const char *s, size_t n, size_t i);
/* Replaces out's contents with the decoded text. skip_special drops tokens
 * marked special. */
int lm_tokenizer_decode(const lm_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                        lm_tok_str *out);

/* ---- streaming detokenizer ----
 * Push ids one at a time; each push appends to out only whole UTF-8
 * characters, and what all pushes plus finish append is exactly
 * lm_tokenizer_decode of all the ids. */
typedef struct lm_detok lm_detok;
lm_detok *lm_detok_create(const lm_tokenizer *t, bool skip_special);
void lm_detok_push(lm_detok *d, int32_t id, lm_tok_str *out);
/* Flushes what was held back (end of generation); the stream may then be reused. */
void lm_detok_finish(lm_detok *d, lm_tok_str *out);
void lm_detok_free(lm_detok *d);

/* ---- vocabulary ---- */

/* Number of ids (one past the largest id of the vocabulary or added tokens). */
int32_t lm_tokenizer_n_vocab(const lm_tokenizer *t);
/* -1 when s is neither a vocabulary token nor an added token. */
int32_t lm_tokenizer_token_to_id(const lm_tokenizer *t, const char *s, size_t len);
/* The token's string (not NUL-terminated; *len set), or NULL for an unused id. */
const char *lm_tokenizer_id_to_token(const lm_tokenizer *t, int32_t id, size_t *len);
bool lm_tokenizer_is_special(const lm_tokenizer *t, int32_t id);
/* The bytes token id adds to the text in the middle of a sequence (added
 * tokens: their content; byte-level BPE: the unmapped bytes; byte fallback
 * <0xXX>: that byte; metaspace: U+2581 as a space), raw, not made valid
 * UTF-8: what a grammar matches token by token. Replaces out's contents;
 * false for an unused id. */
bool lm_tokenizer_token_bytes(const lm_tokenizer *t, int32_t id, lm_tok_str *out);
/* Added tokens (the special ones and the others), in file order. */
int lm_tokenizer_n_added(const lm_tokenizer *t);
/* i-th added token: its id, content (NUL-terminated) and special flag. */
int32_t lm_tokenizer_added(const lm_tokenizer *t, int i, const char **content, bool *special);

/* ---- special tokens and tokenizer_config.json ----
 * Ids are -1 when the model defines none. bos/eos/pad/unk come from
 * tokenizer_config.json's bos_token/eos_token/pad_token/unk_token (or the
 * GGUF ids); eos is the generation stop token the config names. */
int32_t lm_tokenizer_bos(const lm_tokenizer *t);
int32_t lm_tokenizer_eos(const lm_tokenizer *t);
int32_t lm_tokenizer_pad(const lm_tokenizer *t);
int32_t lm_tokenizer_unk(const lm_tokenizer *t);
/* NULL when absent. chat_template: tokenizer_config.json's (the "default"
 * one of a list), else DIR/chat_template.jinja, else GGUF
 * tokenizer.chat_template. */
const char *lm_tokenizer_chat_template(const lm_tokenizer *t);
const char *lm_tokenizer_bos_token(const lm_tokenizer *t);
const char *lm_tokenizer_eos_token(const lm_tokenizer *t);
const char *lm_tokenizer_pad_token(const lm_tokenizer *t);
/* Whether encode(add_special=true) adds a bos / eos token. */
bool lm_tokenizer_adds_bos(const lm_tokenizer *t);
bool lm_tokenizer_adds_eos(const lm_tokenizer *t);

#endif
