/* convert_vocab.c - tokenizer metadata from a Hugging Face folder, as
 * llama.cpp's converter (gguf-py SpecialVocab, _set_vocab_gpt2) writes it.
 *
 * tokenizer.json's BPE vocabulary and added tokens give tokenizer.ggml.tokens
 * (ids missing from both become "[PADn]", type UNUSED) and token_type (added
 * special tokens and ones that look special, "<|...|>", are CONTROL, other
 * added tokens USER_DEFINED, the rest NORMAL); its merges (either JSON form)
 * become "a b" strings. tokenizer.ggml.pre names the pre-tokenizer, which
 * llama.cpp recognises by hashing a test encoding: here it is recognised by
 * its split regex, for the families lumen converts. Special token ids come
 * from tokenizer_config.json (matched against the added tokens), then
 * config.json's *_token_id; add_bos / add_eos from the post-processor's
 * template and tokenizer_config.json; the chat template from
 * chat_template.jinja, chat_template.json or tokenizer_config.json.
 *
 * A SentencePiece-style tokenizer.json (BPE over "▁"-escaped text with byte
 * fallback: Gemma, Mistral, Llama 2) is written as llama.cpp reads such a
 * vocabulary: for a gemma4 model as its "gemma4" vocabulary (tokens, types,
 * scores of -1000 and the merges, as Gemma4Model writes them), else as
 * "llama" (SentencePiece), where merges are not stored and each token's
 * score is minus the rank of the merge that makes it (lowest rank first,
 * which is the order SentencePiece's BPE scores give), byte pieces <0xXX>
 * typed BYTE and the unknown token UNKNOWN. llama.cpp's converter reads a
 * SentencePiece model's own scores from tokenizer.model, which lumen does
 * not parse (a protobuf); the ranks give the same merge order. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_file.h"
#include "lm_convert.h"

/* Both set and equal (a JSON string may be missing). */
static bool lm_streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

enum { TT_NORMAL = 1, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE };

/* The split regexes of the pre-tokenizers lumen recognises, and llama.cpp's names. */
static const struct { const char *regex, *pre; } k_pre[] = {
    { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      "qwen2" },
    { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      "llama-bpe" },
    { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+",
      "qwen35" }, /* Qwen3.5: letters with their combining marks */
};

/* DIR/NAME parsed, or NULL (an error in e only when required). Integers
 * too big for 64 bits (tokenizer_config.json's model_max_length is often
 * 1e30 written out) are read as reals instead of failing the file. */
static json_t *load_json(const char *dir, const char *name, bool required, lm_err *e) {
    char *path = lm_path_join(dir, name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j && strstr(je.text, "too big integer")) j = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!j && required) lm_errf(e, "%s: %s", path, je.text);
    free(path);
    return j;
}

/* The pre-tokenizer's name: from the first Split regex anywhere in pre. */
static const char *find_pre(json_t *pre) {
    if (!json_is_object(pre)) return NULL;
    json_t *pat = json_object_get(json_object_get(pre, "pattern"), "Regex");
    if (json_is_string(pat)) {
        for (size_t i = 0; i < LM_COUNT(k_pre); i++) {
            if (!strcmp(json_string_value(pat), k_pre[i].regex)) return k_pre[i].pre;
        }
        return NULL;
    }
    json_t *seq = json_object_get(pre, "pretokenizers"), *v;
    size_t i;
    json_array_foreach(seq, i, v) {
        const char *p = find_pre(v);
        if (p) return p;
    }
    return NULL;
}

/* llama.cpp's does_token_look_special: "<|...|>", <pad>, <mask>. */
static bool looks_special(const char *t) {
    size_t n = strlen(t);
    return (n >= 4 && !strncmp(t, "<|", 2) && !strcmp(t + n - 2, "|>")) || !strcmp(t, "<pad>") || !strcmp(t, "<mask>");
}

/* Gemma 4's tokens that llama.cpp's converter makes USER_DEFINED, so that
 * they are always rendered and its chat parser reads them. */
static const char *const k_gemma4_visible[] = { "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                                                "<|tool_response>", "<tool_response|>", "<|\"|>" };

static bool is_byte_piece(const char *t) {
    return strlen(t) == 6 && !strncmp(t, "<0x", 3) && t[5] == '>' && strspn(t + 3, "0123456789ABCDEF") == 2;
}

/* Tokens and types; spm: a SentencePiece-style vocabulary (byte pieces
 * BYTE, the unknown token UNKNOWN; gemma4's visible tokens USER_DEFINED);
 * -1 with e set. */
static int put_tokens(lm_gguf_writer *w, json_t *tok, int V, bool spm, bool gemma4, lm_err *e) {
    const char **tokens = lm_xcalloc((size_t)V, sizeof *tokens);
    int32_t *types = lm_xcalloc((size_t)V, sizeof *types);
    char **pads = lm_xcalloc((size_t)V, sizeof *pads);
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab"), *v, *at;
    const char *key;
    size_t i;
    int rc = 0;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= V) {
            rc = lm_errf(e, "tokenizer.json: token \"%s\" has id %lld outside the vocabulary of %d", key, (long long)id, V);
            break;
        }
        tokens[id] = key;
        types[id] = spm && is_byte_piece(key) ? TT_BYTE : TT_NORMAL;
    }
    const char *unk = json_string_value(json_object_get(json_object_get(tok, "model"), "unk_token"));
    json_array_foreach(json_object_get(tok, "added_tokens"), i, at) {
        json_int_t id = json_integer_value(json_object_get(at, "id"));
        const char *content = json_string_value(json_object_get(at, "content"));
        if (rc || !content || id < 0 || id >= V) continue;
        tokens[id] = content;
        types[id] = json_is_true(json_object_get(at, "special")) || looks_special(content) ? TT_CONTROL : TT_USER_DEFINED;
    }
    for (int k = 0; spm && rc == 0 && k < V; k++) {
        if (tokens[k] && unk && !strcmp(tokens[k], unk)) types[k] = TT_UNKNOWN;
        for (size_t j = 0; gemma4 && tokens[k] && j < LM_COUNT(k_gemma4_visible); j++)
            if (!strcmp(tokens[k], k_gemma4_visible[j])) types[k] = TT_USER_DEFINED;
    }
    for (int k = 0; rc == 0 && k < V; k++) {
        if (tokens[k]) continue;
        pads[k] = lm_xmalloc(32);
        snprintf(pads[k], 32, "[PAD%d]", k);
        tokens[k] = pads[k];
        types[k] = TT_UNUSED;
    }
    if (rc == 0) {
        lm_gguf_set_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, (uint64_t)V);
        lm_gguf_set_arr(w, "tokenizer.ggml.token_type", LM_GGUF_I32, types, (uint64_t)V);
    }
    for (int k = 0; k < V; k++) free(pads[k]);
    free(pads);
    free(tokens);
    free(types);
    return rc;
}

/* A space inside a merge part is written as U+0120 + 256 (llama.cpp's escape). */
static void append_part(char **buf, size_t *len, size_t *cap, const char *s) {
    for (; *s; s++) {
        if (*len + 4 > *cap) *buf = lm_xrealloc(*buf, *cap = 2 * *cap + 64);
        if (*s == ' ') { /* chr(ord(' ') + 256) = U+0120, UTF-8 C4 A0 */
            (*buf)[(*len)++] = (char)0xc4;
            (*buf)[(*len)++] = (char)0xa0;
        } else {
            (*buf)[(*len)++] = *s;
        }
    }
}

/* tokenizer.ggml.merges from either JSON form of model.merges. */
static void put_merges(lm_gguf_writer *w, json_t *tok) {
    json_t *merges = json_object_get(json_object_get(tok, "model"), "merges"), *m;
    size_t n = json_array_size(merges), i;
    if (n == 0) return;
    char **strs = lm_xcalloc(n, sizeof *strs);
    json_array_foreach(merges, i, m) {
        if (json_is_string(m)) {
            strs[i] = lm_xstrdup(json_string_value(m));
            continue;
        }
        size_t len = 0, cap = 64;
        char *buf = lm_xmalloc(cap);
        append_part(&buf, &len, &cap, json_string_value(json_array_get(m, 0)) ? json_string_value(json_array_get(m, 0)) : "");
        buf[len++] = ' ';
        append_part(&buf, &len, &cap, json_string_value(json_array_get(m, 1)) ? json_string_value(json_array_get(m, 1)) : "");
        buf[len] = 0;
        strs[i] = buf;
    }
    lm_gguf_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)strs, NULL, n);
    for (i = 0; i < n; i++) free(strs[i]);
    free(strs);
}

/* tokenizer.ggml.scores: -1000 for every token (gemma4), or minus the rank
 * of the lowest-ranked merge that makes each token, -1e9 for the others
 * (single characters, byte pieces, added tokens: never a merge's result). */
static void put_scores(lm_gguf_writer *w, json_t *tok, int V, bool gemma4) {
    float *sc = lm_xmalloc((size_t)V * sizeof *sc);
    for (int k = 0; k < V; k++) sc[k] = gemma4 ? -1000.0f : -1e9f;
    json_t *model = json_object_get(tok, "model"), *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    for (size_t r = json_array_size(merges); !gemma4 && r-- > 0;) { /* backwards: the lowest rank is written last */
        json_t *m = json_array_get(merges, r);
        const char *a, *b, *sp = NULL;
        char *joined;
        if (json_is_string(m)) {
            a = json_string_value(m);
            sp = strchr(a, ' ');
            if (!sp) continue;
            joined = lm_xmalloc(strlen(a));
            memcpy(joined, a, (size_t)(sp - a));
            strcpy(joined + (sp - a), sp + 1);
        } else {
            a = json_string_value(json_array_get(m, 0)), b = json_string_value(json_array_get(m, 1));
            if (!a || !b) continue;
            joined = lm_xmalloc(strlen(a) + strlen(b) + 1);
            strcpy(joined, a);
            strcat(joined, b);
        }
        json_t *id = json_object_get(vocab, joined);
        if (json_is_integer(id) && json_integer_value(id) >= 0 && json_integer_value(id) < V)
            sc[json_integer_value(id)] = -(float)r;
        free(joined);
    }
    lm_gguf_set_arr(w, "tokenizer.ggml.scores", LM_GGUF_F32, sc, (uint64_t)V);
    free(sc);
}

/* Whether a SentencePiece-style tokenizer puts "▁" before the text (a
 * Prepend normaliser, or a Metaspace pre-tokenizer that prepends): llama.cpp's
 * add_space_prefix. */
static bool prepends_space(json_t *tok) {
    json_t *n = json_object_get(tok, "normalizer"), *parts = json_object_get(n, "normalizers"), *v;
    size_t i;
    if (lm_streq(json_string_value(json_object_get(n, "type")), "Prepend")) return true;
    json_array_foreach(parts, i, v) if (lm_streq(json_string_value(json_object_get(v, "type")), "Prepend")) return true;
    json_t *pre = json_object_get(tok, "pre_tokenizer");
    const char *scheme = json_string_value(json_object_get(pre, "prepend_scheme"));
    return lm_streq(json_string_value(json_object_get(pre, "type")), "Metaspace") && scheme && strcmp(scheme, "never");
}

/* The id of an added token with this content, or -1. */
static int added_id(json_t *tok, const char *content) {
    json_t *at;
    size_t i;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, at) {
        const char *c = json_string_value(json_object_get(at, "content"));
        if (c && !strcmp(c, content)) return (int)json_integer_value(json_object_get(at, "id"));
    }
    return -1;
}

/* The special token kinds in SpecialVocab's order, with their keys. */
static const struct { const char *typ, *key; } k_special[] = {
    { "bos", "tokenizer.ggml.bos_token_id" },     { "eos", "tokenizer.ggml.eos_token_id" },
    { "unk", "tokenizer.ggml.unknown_token_id" }, { "sep", "tokenizer.ggml.seperator_token_id" },
    { "pad", "tokenizer.ggml.padding_token_id" }, { "cls", "tokenizer.ggml.cls_token_id" },
    { "mask", "tokenizer.ggml.mask_token_id" },
};

/* tokenizer_config's X_token as text (a string or {"content": ...}), or NULL. */
static const char *config_token(json_t *tc, const char *typ) {
    char k[32];
    snprintf(k, sizeof k, "%s_token", typ);
    json_t *v = json_object_get(tc, k);
    return json_is_object(v) ? json_string_value(json_object_get(v, "content")) : json_string_value(v);
}

/* Special ids: tokenizer_config.json first, then config.json, first found
 * wins; written in the order they were found. */
static void put_special_ids(lm_gguf_writer *w, json_t *tok, json_t *tc, json_t *cfg, int V) {
    int id[LM_COUNT(k_special)], order[2 * LM_COUNT(k_special)], n = 0;
    for (size_t k = 0; k < LM_COUNT(k_special); k++) {
        const char *content = config_token(tc, k_special[k].typ);
        id[k] = content ? added_id(tok, content) : -1;
        if (id[k] >= 0 && id[k] < V) order[n++] = (int)k;
        else id[k] = -1;
    }
    for (size_t k = 0; k < LM_COUNT(k_special); k++) {
        char key[32];
        snprintf(key, sizeof key, "%s_token_id", k_special[k].typ);
        json_t *v = json_object_get(cfg, key);
        if (id[k] >= 0 || !json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= V) continue;
        id[k] = (int)json_integer_value(v);
        order[n++] = (int)k;
    }
    for (int i = 0; i < n; i++) lm_gguf_set_int(w, k_special[order[i]].key, LM_GGUF_U32, id[order[i]]);
}

/* add_bos / add_eos: the post-processor's single template (a special token
 * first / last), then tokenizer_config.json's add_*_token booleans. */
static void put_add_flags(lm_gguf_writer *w, json_t *tok, json_t *tc) {
    int add_bos = -1, add_eos = -1;
    json_t *pp = json_object_get(tok, "post_processor");
    json_t *single = json_object_get(pp, "single");
    if (lm_streq(json_string_value(json_object_get(pp, "type")), "TemplateProcessing") && json_array_size(single) > 1) {
        const char *bos = config_token(tc, "bos"), *eos = config_token(tc, "eos");
        const char *first = json_string_value(json_object_get(json_object_get(json_array_get(single, 0), "SpecialToken"), "id"));
        const char *last = json_string_value(
            json_object_get(json_object_get(json_array_get(single, json_array_size(single) - 1), "SpecialToken"), "id"));
        if (first) add_bos = bos && !strcmp(first, bos);
        if (last) add_eos = eos && !strcmp(last, eos);
    }
    if (json_is_boolean(json_object_get(tc, "add_bos_token"))) add_bos = json_is_true(json_object_get(tc, "add_bos_token"));
    if (json_is_boolean(json_object_get(tc, "add_eos_token"))) add_eos = json_is_true(json_object_get(tc, "add_eos_token"));
    if (add_bos >= 0) lm_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (add_eos >= 0) lm_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", add_eos);
}

/* The chat template: tokenizer_config.json's, else chat_template.jinja, else
 * chat_template.json's. */
static void put_chat_template(lm_gguf_writer *w, const char *dir, json_t *tc) {
    const char *s = json_string_value(json_object_get(tc, "chat_template"));
    if (s) {
        lm_gguf_set_str(w, "tokenizer.chat_template", s, strlen(s));
        return;
    }
    char *path = lm_path_join(dir, "chat_template.jinja");
    size_t len;
    lm_err ignored;
    char *text = lm_read_file(path, &len, &ignored);
    free(path);
    if (text) {
        lm_gguf_set_str(w, "tokenizer.chat_template", text, len);
        free(text);
        return;
    }
    json_t *ct = load_json(dir, "chat_template.json", false, NULL);
    s = json_string_value(json_object_get(ct, "chat_template"));
    if (s) lm_gguf_set_str(w, "tokenizer.chat_template", s, strlen(s));
    json_decref(ct);
}

int lm_convert_vocab(lm_gguf_writer *w, const char *dir, const char *arch, int vocab_size, lm_err *e) {
    json_t *tok = load_json(dir, "tokenizer.json", true, e);
    if (!tok) return -1;
    json_t *tc = load_json(dir, "tokenizer_config.json", false, NULL);
    json_t *cfg = load_json(dir, "config.json", false, NULL);
    int rc = 0;
    json_t *model = json_object_get(tok, "model");
    const char *pre = find_pre(json_object_get(tok, "pre_tokenizer"));
    const bool bpe = lm_streq(json_string_value(json_object_get(model, "type")), "BPE");
    const bool spm = bpe && json_is_true(json_object_get(model, "byte_fallback")), gemma4 = spm && lm_streq(arch, "gemma4");
    if (!bpe) {
        rc = lm_errf(e, "%s/tokenizer.json: a %s model; lumen convert writes BPE tokenizers only (byte-level, or "
                     "SentencePiece-style with byte fallback)", dir, json_string_value(json_object_get(model, "type"))
                     ? json_string_value(json_object_get(model, "type")) : "typeless");
    } else if (spm) {
        lm_gguf_set_str(w, "tokenizer.ggml.model", gemma4 ? "gemma4" : "llama", gemma4 ? 6 : 5);
        rc = put_tokens(w, tok, vocab_size, true, gemma4, e);
        if (rc == 0) put_scores(w, tok, vocab_size, gemma4);
    } else if (!pre) {
        rc = lm_errf(e, "%s/tokenizer.json: a pre-tokenizer lumen convert does not recognise (known: qwen2, qwen35, llama-bpe)",
                     dir);
    } else {
        lm_gguf_set_str(w, "tokenizer.ggml.model", "gpt2", 4);
        lm_gguf_set_str(w, "tokenizer.ggml.pre", pre, strlen(pre));
        rc = put_tokens(w, tok, vocab_size, false, false, e);
    }
    if (rc == 0) {
        if (!spm || gemma4) put_merges(w, tok);
        put_special_ids(w, tok, tc, cfg, vocab_size);
        if (spm) lm_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", !gemma4 && prepends_space(tok));
        /* llama.cpp's Gemma 4 vocabulary always starts with BOS */
        if (gemma4) lm_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
        else put_add_flags(w, tok, tc);
        put_chat_template(w, dir, tc);
    }
    json_decref(tok);
    json_decref(tc);
    json_decref(cfg);
    return rc;
}
