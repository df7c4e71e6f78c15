/* gguf_vocab.c - a tokenizer from GGUF tokenizer.ggml.* metadata alone.
 *
 * GGUF stores the vocabulary, not the Hugging Face pipeline, so this file
 * rebuilds the pipeline that the HF conversion of the same model uses:
 *
 *   model "llama" (SentencePiece BPE: Llama 2, Mistral, Gemma): tokens with
 *     scores. Merges are derived as HF's converter does: a pair (l, r) merges
 *     when l+r is a token, and pairs rank by the merged token's score (higher
 *     first, ties by id). Normaliser: Prepend "▁" (when add_space_prefix) +
 *     Replace " " -> "▁"; byte fallback; decoder Replace, ByteFallback, Fuse,
 *     Strip(1 leading space when add_space_prefix).
 *   model "gpt2" (byte-level BPE: Llama 3, Qwen): tokens and "a b" merges;
 *     the split regex comes from tokenizer.ggml.pre.
 *   model "gemma4" (llama.cpp's Gemma 4 vocabulary): SentencePiece-style BPE
 *     with "a b" merges on raw UTF-8: normaliser Replace " " -> "▁" (no
 *     prefix), the text split into runs of newlines and runs of anything
 *     else (Gemma's merges never join the two, so this is the HF
 *     tokenizer's whole-text BPE, and keeps words short), byte fallback;
 *     decoder as "llama" without the strip. A BOS always leads, as
 *     llama.cpp forces for this vocabulary and Gemma 4's post-processor does.
 *
 * Token types: 2 (unknown) and 3 (control) become special added tokens, 4
 * (user-defined) plain added tokens, as in the HF files. */
#include <stdlib.h>
#include <string.h>

#include "../format/gguf.h"
#include "tok_internal.h"

static const char k_re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen3.5's: letters with their combining marks ([\p{L}\p{M}]) */
static const char k_re_qwen35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_tekken[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static char *dupn(const char *s, size_t n) {
    char *p = lm_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static const lm_gguf_kv *arr(const lm_gguf *g, const char *key, lm_gguf_type et) {
    const lm_gguf_kv *kv = lm_gguf_find_kv(g, key);
    if (!kv || kv->type != LM_GGUF_ARRAY) return NULL;
    if (et == LM_GGUF_STRING && kv->arr_type != LM_GGUF_STRING) return NULL;
    return kv;
}

static int32_t get_id(const lm_gguf *g, const char *key, int32_t n) {
    int64_t v;
    return lm_gguf_get_int(g, key, &v) && v >= 0 && v < n ? (int32_t)v : -1;
}

static bool get_bool(const lm_gguf *g, const char *key, bool dflt) {
    bool b;
    return lm_gguf_get_bool(g, key, &b) ? b : dflt;
}

typedef struct scored { float score; int32_t id; } scored;
static int by_score(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* SentencePiece merges from scores (see the file comment). */
static int spm_merges(lm_tokenizer *t, const lm_gguf_kv *scores, int32_t n, lm_err *e) {
    scored *order = lm_xmalloc((size_t)n * sizeof *order);
    for (int32_t i = 0; i < n; i++) {
        double s = 0;
        if (scores && !lm_gguf_arr_float(scores, (uint64_t)i, &s)) {
            free(order);
            return lm_errf(e, "tokenizer.ggml.scores[%d] is not a number", i);
        }
        order[i] = (scored){ (float)s, i };
    }
    qsort(order, (size_t)n, sizeof *order, by_score);
    tok_merges_init(&t->bpe.merges, (size_t)n * 2);
    for (int32_t r = 0; r < n; r++) {
        int32_t id = order[r].id;
        size_t len;
        const char *s = tok_vocab_str(&t->vocab, id, &len);
        if (!s) continue;
        for (size_t k = 1; k < len; k++) {
            if (((uint8_t)s[k] & 0xC0) == 0x80) continue; /* split at characters */
            int32_t a = tok_vocab_get(&t->vocab, s, k), b = tok_vocab_get(&t->vocab, s + k, len - k);
            if (a >= 0 && b >= 0) tok_merges_put(&t->bpe.merges, a, b, (uint32_t)r, id);
        }
    }
    free(order);
    return 0;
}

static int gpt2_merges(lm_tokenizer *t, const lm_gguf_kv *merges, lm_err *e) {
    uint64_t nm = merges ? merges->arr_count : 0;
    tok_merges_init(&t->bpe.merges, (size_t)nm);
    lm_tok_str tmp = { 0 };
    for (uint64_t i = 0; i < nm; i++) {
        lm_gguf_str m = lm_gguf_arr_str(merges, i);
        const char *sp = m.len ? memchr(m.ptr, ' ', m.len) : NULL;
        if (!sp) {
            lm_tok_str_free(&tmp);
            return lm_errf(e, "tokenizer.ggml.merges[%llu]: not \"a b\"", (unsigned long long)i);
        }
        size_t an = (size_t)(sp - m.ptr), bn = m.len - an - 1;
        int32_t a = tok_vocab_get(&t->vocab, m.ptr, an), b = tok_vocab_get(&t->vocab, sp + 1, bn);
        tmp.len = 0;
        tok_str_append(&tmp, m.ptr, an);
        tok_str_append(&tmp, sp + 1, bn);
        int32_t id = tok_vocab_get(&t->vocab, tmp.s, tmp.len);
        if (a < 0 || b < 0 || id < 0) {
            lm_tok_str_free(&tmp);
            return lm_errf(e, "tokenizer.ggml.merges[%llu]: a token is not in the vocabulary",
                           (unsigned long long)i);
        }
        tok_merges_put(&t->bpe.merges, a, b, (uint32_t)i, id);
    }
    lm_tok_str_free(&tmp);
    return 0;
}

static tok_pattern literal(const char *s) {
    return (tok_pattern){ TOK_PAT_STRING, lm_xstrdup(s), strlen(s), NULL };
}

/* Replace ▁ -> " ", ByteFallback, Fuse (and Strip of one leading space when strip). */
static tok_decoder *spm_decoder(bool strip) {
    tok_decoder *d = lm_xcalloc(1, sizeof *d);
    d->kind = TOK_DEC_SEQUENCE;
    d->sub = lm_xcalloc(4, sizeof *d->sub);
    d->sub[0] = (tok_decoder){ .kind = TOK_DEC_REPLACE, .pat = literal("\xE2\x96\x81"),
                               .content = lm_xstrdup(" "), .content_len = 1 };
    d->sub[1].kind = TOK_DEC_BYTEFALLBACK;
    d->sub[2].kind = TOK_DEC_FUSE;
    d->n_sub = 3;
    if (strip) d->sub[d->n_sub++] = (tok_decoder){ .kind = TOK_DEC_STRIP, .strip_char = ' ', .strip_start = 1 };
    return d;
}

static int setup_spm(lm_tokenizer *t, const lm_gguf *g, const lm_gguf_kv *scores, int32_t n, lm_err *e) {
    bool prefix = get_bool(g, "tokenizer.ggml.add_space_prefix", true);
    tok_normalizer *nz = t->normalizer = lm_xcalloc(1, sizeof *nz);
    nz->kind = TOK_NORM_SEQUENCE;
    nz->sub = lm_xcalloc(2, sizeof *nz->sub);
    if (prefix) {
        nz->sub[nz->n_sub].kind = TOK_NORM_PREPEND;
        nz->sub[nz->n_sub].content = lm_xstrdup("\xE2\x96\x81");
        nz->sub[nz->n_sub++].content_len = 3;
    }
    tok_normalizer *rep = &nz->sub[nz->n_sub++];
    rep->kind = TOK_NORM_REPLACE;
    rep->pat = literal(" ");
    rep->content = lm_xstrdup("\xE2\x96\x81");
    rep->content_len = 3;

    t->decoder = spm_decoder(prefix);
    t->bpe.byte_fallback = true;
    t->bpe.fuse_unk = true;
    return spm_merges(t, scores, n, e);
}

static int setup_gemma4(lm_tokenizer *t, const lm_gguf *g, lm_err *e) {
    tok_normalizer *nz = t->normalizer = lm_xcalloc(1, sizeof *nz);
    nz->kind = TOK_NORM_REPLACE;
    nz->pat = literal(" ");
    nz->content = lm_xstrdup("\xE2\x96\x81");
    nz->content_len = 3;
    static const char runs[] = "[^\n]+|\n+";
    tok_pretok *p = t->pretok = lm_xcalloc(1, sizeof *p);
    p->kind = TOK_PRE_SPLIT;
    p->behavior = TOK_SPLIT_ISOLATED;
    p->pat = (tok_pattern){ TOK_PAT_REGEX, lm_xstrdup(runs), strlen(runs), NULL };
    if (tok_pattern_compile(&p->pat, e)) return -1;
    t->decoder = spm_decoder(false);
    t->bpe.byte_fallback = true;
    t->bpe.fuse_unk = true;
    return gpt2_merges(t, arr(g, "tokenizer.ggml.merges", LM_GGUF_STRING), e);
}

/* tokenizer.ggml.pre: llama.cpp's names for the byte-level BPE splits of
 * the families lumen runs (as its llama-vocab.cpp maps them), the regex
 * each stands for (NULL: GPT-2's own, inside ByteLevel), whether merges
 * are skipped for whole-vocabulary words (Llama 3), and whether
 * the HF tokenizer normalises to NFC first (Qwen's do; llama.cpp does not,
 * and differs from the HF ids on decomposed accents). smollm splits digits
 * one by one before GPT-2's regex. */
static const struct {
    const char *name, *re;
    bool ignore_merges, nfc, digits;
} k_pre[] = {
    { "default", NULL, false, false, false },       { "gpt-2", NULL, false, false, false },
    { "llama3", k_re_llama3, true, false, false },   { "llama-v3", k_re_llama3, true, false, false },
    { "llama-bpe", k_re_llama3, true, false, false }, { "qwen2", k_re_qwen2, false, true, false },
    { "qwen3", k_re_qwen2, false, true, false },     { "deepseek-r1-qwen", k_re_qwen2, false, true, false },
    { "qwen35", k_re_qwen35, false, true, false },   { "tekken", k_re_tekken, false, false, false },
    { "smollm", NULL, false, false, true },
};

static int setup_gpt2(lm_tokenizer *t, const lm_gguf *g, lm_err *e) {
    char *pre = lm_gguf_get_str(g, "tokenizer.ggml.pre");
    int k = pre ? -1 : 0; /* none: llama.cpp's default, GPT-2's split */
    for (int i = 0; pre && k < 0 && i < (int)LM_COUNT(k_pre); i++)
        if (!strcmp(pre, k_pre[i].name)) k = i;
    if (k < 0) {
        lm_errf(e, "tokenizer.ggml.pre \"%.40s\" is not a pre-tokenizer lumen reads (default, gpt-2, llama3, "
                "llama-bpe, qwen2, deepseek-r1-qwen, qwen35, tekken, smollm)", pre);
        free(pre);
        return -1;
    }
    free(pre);
    const char *re = k_pre[k].re;
    const bool nfc = k_pre[k].nfc;
    t->bpe.ignore_merges = k_pre[k].ignore_merges; /* as Llama 3's tokenizer.json says */
    tok_pretok *p = t->pretok = lm_xcalloc(1, sizeof *p);
    if (re || k_pre[k].digits) {
        p->kind = TOK_PRE_SEQUENCE;
        p->sub = lm_xcalloc(2, sizeof *p->sub);
        p->n_sub = 2;
        p->sub[0].kind = TOK_PRE_SPLIT;
        p->sub[0].behavior = TOK_SPLIT_ISOLATED;
        const char *first = re ? re : "\\p{N}";
        p->sub[0].pat = (tok_pattern){ TOK_PAT_REGEX, lm_xstrdup(first), strlen(first), NULL };
        if (tok_pattern_compile(&p->sub[0].pat, e)) return -1;
        p->sub[1].kind = TOK_PRE_BYTELEVEL;
        if (!re) { /* digits split, then GPT-2's regex inside ByteLevel */
            p->sub[1].use_regex = true;
            if (tok_pretok_builtin_regex(&p->sub[1], e)) return -1;
        }
    } else { /* GPT-2's own regex, inside ByteLevel */
        p->kind = TOK_PRE_BYTELEVEL;
        p->use_regex = true;
        if (tok_pretok_builtin_regex(p, e)) return -1;
    }
    if (nfc) {
        t->normalizer = lm_xcalloc(1, sizeof *t->normalizer);
        t->normalizer->kind = TOK_NORM_NFC;
    }
    t->decoder = lm_xcalloc(1, sizeof *t->decoder);
    t->decoder->kind = TOK_DEC_BYTELEVEL;
    return gpt2_merges(t, arr(g, "tokenizer.ggml.merges", LM_GGUF_STRING), e);
}

int tok_from_gguf(lm_tokenizer *t, const lm_gguf *g, lm_err *e) {
    char *model = lm_gguf_get_str(g, "tokenizer.ggml.model");
    if (!model) return lm_errf(e, "no tokenizer.ggml.model key: the file carries no tokenizer");
    bool spm = !strcmp(model, "llama"), bpe = !strcmp(model, "gpt2"), gemma4 = !strcmp(model, "gemma4");
    if (!spm && !bpe && !gemma4) {
        lm_errf(e, "tokenizer.ggml.model \"%.40s\" is not supported (llama, gpt2, gemma4)", model);
        free(model);
        return -1;
    }
    free(model);
    const lm_gguf_kv *toks = arr(g, "tokenizer.ggml.tokens", LM_GGUF_STRING);
    if (!toks || !toks->arr_count || toks->arr_count > (1u << 26))
        return lm_errf(e, "tokenizer.ggml.tokens: missing, empty or too long");
    int32_t n = (int32_t)toks->arr_count;
    const lm_gguf_kv *types = arr(g, "tokenizer.ggml.token_type", LM_GGUF_I32);
    const lm_gguf_kv *scores = arr(g, "tokenizer.ggml.scores", LM_GGUF_F32);
    if (types && types->arr_count != (uint64_t)n) return lm_errf(e, "tokenizer.ggml.token_type: %llu entries for %d tokens", (unsigned long long)types->arr_count, n);
    if (scores && scores->arr_count != (uint64_t)n) return lm_errf(e, "tokenizer.ggml.scores: %llu entries for %d tokens", (unsigned long long)scores->arr_count, n);
    tok_vocab_init(&t->vocab, (size_t)n);
    t->added = lm_xcalloc((size_t)n + 1, sizeof *t->added);
    int32_t unk = -1;
    for (int32_t i = 0; i < n; i++) {
        lm_gguf_str s = lm_gguf_arr_str(toks, (uint64_t)i);
        if (!tok_vocab_set(&t->vocab, i, s.ptr, s.len)) return lm_errf(e, "tokenizer.ggml.tokens: duplicate id");
        if (tok_vocab_get(&t->vocab, s.ptr, s.len) != i) { /* a duplicate string: keep the first */ }
        int64_t ty = 1;
        if (types && !lm_gguf_arr_int(types, (uint64_t)i, &ty)) return lm_errf(e, "tokenizer.ggml.token_type[%d] is not an integer", i);
        if (ty == 2 && unk < 0) unk = i;
        if (ty == 2 || ty == 3 || ty == 4) {
            tok_added *a = &t->added[t->n_added++];
            a->id = i;
            a->content = dupn(s.ptr, s.len);
            a->len = s.len;
            a->special = ty != 4;
        }
    }
    int32_t u = get_id(g, "tokenizer.ggml.unknown_token_id", n);
    t->bpe.unk = u >= 0 ? u : unk;
    t->bos_id = get_id(g, "tokenizer.ggml.bos_token_id", n);
    t->eos_id = get_id(g, "tokenizer.ggml.eos_token_id", n);
    t->pad_id = get_id(g, "tokenizer.ggml.padding_token_id", n);
    t->unk_id = t->bpe.unk;
    t->chat_template = lm_gguf_get_str(g, "tokenizer.chat_template");
    if ((spm ? setup_spm(t, g, scores, n, e) : gemma4 ? setup_gemma4(t, g, e) : setup_gpt2(t, g, e))) return -1;
    if ((gemma4 || get_bool(g, "tokenizer.ggml.add_bos_token", spm)) && t->bos_id >= 0) {
        t->post.pre = lm_xmalloc(sizeof(int32_t));
        t->post.pre[t->post.n_pre++] = t->bos_id;
    }
    if (get_bool(g, "tokenizer.ggml.add_eos_token", false) && t->eos_id >= 0) {
        t->post.post = lm_xmalloc(sizeof(int32_t));
        t->post.post[t->post.n_post++] = t->eos_id;
    }
    size_t l;
    const char *s;
    if (t->bos_id >= 0 && (s = tok_vocab_str(&t->vocab, t->bos_id, &l))) t->bos_token = dupn(s, l);
    if (t->eos_id >= 0 && (s = tok_vocab_str(&t->vocab, t->eos_id, &l))) t->eos_token = dupn(s, l);
    if (t->pad_id >= 0 && (s = tok_vocab_str(&t->vocab, t->pad_id, &l))) t->pad_token = dupn(s, l);
    return 0;
}
