/* fuzz_tokenizer_gguf.c - libFuzzer harness: tokenizers from GGUF metadata.
 *
 * Structure-aware: the input is not a GGUF file (fuzz_gguf covers the
 * container) but the vocabulary inside one. Byte 0 holds flags (model
 * "llama" or "gpt2", add_bos, add_space_prefix, which pre-tokenizer, whether
 * to send scores/types/merges at all); the rest, split on '\n', is the token
 * list followed (gpt2) by "a b" merge lines; types and scores derive from
 * the bytes. The harness writes a valid GGUF around them, loads it as a
 * tokenizer and, if accepted, encodes texts made of its own tokens and
 * checks the decode invariants of fuzz_tokenizer_common.h. Rejections must
 * be one-line messages and leak nothing. */
#include "fuzz_tokenizer_common.h"
#include "format/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { T_U32 = 4, T_I32 = 5, T_F32 = 6, T_BOOL = 7, T_STRING = 8, T_ARRAY = 9 };

static void put(lm_tok_str *b, const void *p, size_t n) { tok_str_append(b, p, n); }
static void u32(lm_tok_str *b, uint32_t v) { put(b, &v, 4); }
static void u64(lm_tok_str *b, uint64_t v) { put(b, &v, 8); }
static void str(lm_tok_str *b, const char *s, size_t n) { u64(b, n); put(b, s, n); }
static void key(lm_tok_str *b, const char *k, uint32_t type) { str(b, k, strlen(k)); u32(b, type); }

typedef struct span { const char *p; size_t n; } span;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint8_t f = data[0];
    bool spm = f & 1, add_bos = f & 2, space = f & 4, with_types = !(f & 32), with_scores = !(f & 64);
    static const char *const pres[] = { "llama-bpe", "qwen2", "tekken", "default" };
    const char *pre = pres[(f >> 3) & 3];
    span lines[512];
    int nl = 0;
    const char *p = (const char *)data + 1, *end = (const char *)data + size;
    while (p <= end && nl < 512) {
        const char *q = memchr(p, '\n', (size_t)(end - p));
        if (!q) q = end;
        lines[nl++] = (span){ p, (size_t)(q - p) };
        p = q + 1;
    }
    int ntok = spm ? nl : (nl + 1) / 2, nmerge = nl - ntok;
    lm_tok_str g = { 0 };
    put(&g, "GGUF", 4);
    u32(&g, 3);
    u64(&g, 0);
    u64(&g, (uint64_t)(3 + with_types + (spm ? with_scores + 1 : 2) + 1));
    key(&g, "tokenizer.ggml.model", T_STRING);
    str(&g, spm ? "llama" : "gpt2", spm ? 5 : 4);
    key(&g, "tokenizer.ggml.tokens", T_ARRAY);
    u32(&g, T_STRING);
    u64(&g, (uint64_t)ntok);
    for (int i = 0; i < ntok; i++) str(&g, lines[i].p, lines[i].n);
    if (with_types) {
        key(&g, "tokenizer.ggml.token_type", T_ARRAY);
        u32(&g, T_I32);
        u64(&g, (uint64_t)ntok);
        for (int i = 0; i < ntok; i++) {
            int32_t ty = lines[i].n ? 1 + (uint8_t)lines[i].p[0] % 6 : 1;
            put(&g, &ty, 4);
        }
    }
    if (spm) {
        if (with_scores) {
            key(&g, "tokenizer.ggml.scores", T_ARRAY);
            u32(&g, T_F32);
            u64(&g, (uint64_t)ntok);
            for (int i = 0; i < ntok; i++) {
                float s = lines[i].n > 1 ? -(float)(uint8_t)lines[i].p[1] : (float)-i;
                put(&g, &s, 4);
            }
        }
        key(&g, "tokenizer.ggml.add_space_prefix", T_BOOL);
        uint8_t b = space;
        put(&g, &b, 1);
    } else {
        key(&g, "tokenizer.ggml.merges", T_ARRAY);
        u32(&g, T_STRING);
        u64(&g, (uint64_t)nmerge);
        for (int i = 0; i < nmerge; i++) str(&g, lines[ntok + i].p, lines[ntok + i].n);
        key(&g, "tokenizer.ggml.pre", T_STRING);
        str(&g, pre, strlen(pre));
    }
    key(&g, "tokenizer.ggml.add_bos_token", T_BOOL);
    uint8_t ab = add_bos;
    put(&g, &ab, 1);
    key(&g, "tokenizer.ggml.bos_token_id", T_U32);
    u32(&g, (uint32_t)(f >> 7));

    lm_gguf gg;
    lm_err e = { { 0 } };
    if (lm_gguf_parse(&gg, (const uint8_t *)g.s, g.len, "fuzz.gguf", &e) == 0) {
        lm_tokenizer *t = NULL;
        if (lm_tokenizer_load_gguf(&t, &gg, &e)) {
            LM_ASSERT(t == NULL && !strchr(e.msg, '\n'));
        } else {
            /* a text of its own tokens, spaces and a few others */
            lm_tok_str text = { 0 };
            for (int i = 0; i < ntok && i < 64; i++) {
                tok_str_append(&text, lines[i].p, lines[i].n);
                if (i % 3 == 0) tok_str_append(&text, " ", 1);
            }
            tok_str_append(&text, " hello \xC3\xA9\xF0\x9F\x98\x80 12", 16);
            lm_tok_ids ids = { 0 };
            LM_ASSERT(lm_tokenizer_encode(t, text.s, text.len, true, &ids, &e) == 0);
    for (size_t i = 0; i < ids.n; i++) LM_ASSERT(ids.ids[i] >= 0 && ids.ids[i] < lm_tokenizer_n_vocab(t));
            lm_tok_str out = { 0 };
            fz_check_decode(t, ids.ids, ids.n, false, &out);
            lm_tok_str_free(&out);
            lm_tok_ids_free(&ids);
            lm_tok_str_free(&text);
            lm_tokenizer_free(t);
        }
        lm_gguf_close(&gg);
    }
    lm_tok_str_free(&g);
    return 0;
}
