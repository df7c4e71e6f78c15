/* tokenizer.c - loading entry points, setup, the encode pipeline, lookups.
 *
 * encode(text) runs HF's Tokenizer::encode for one sequence:
 *   1. split out added tokens that match the raw text (normalized: false);
 *   2. normalise each remaining segment, then split out the added tokens
 *      whose normalised form matches (normalized: true);
 *   3. pre-tokenise each text piece, 4. BPE each pre-token (cached);
 *   5. with add_special, wrap in the post-processor's special ids. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../base/lm_file.h"
#include "../format/lm_source.h"
#include "tok_internal.h"

static const char k_meta[] = "\xE2\x96\x81"; /* ▁ U+2581 */

lm_tokenizer *tok_alloc(void) {
    lm_tokenizer *t = lm_xcalloc(1, sizeof *t);
    t->bos_id = t->eos_id = t->pad_id = t->unk_id = -1;
    t->bpe.unk = -1;
    for (int i = 0; i < 256; i++) t->bpe.byte_ids[i] = t->bpe.fallback_ids[i] = -1;
    tok_trie_init(&t->trie_raw);
    tok_trie_init(&t->trie_norm);
    pthread_mutex_init(&t->lock, NULL);
    tok_work_init(&t->work, true);
    return t;
}

void lm_tokenizer_free(lm_tokenizer *t) {
    if (!t) return;
    tok_vocab_free(&t->vocab);
    tok_vocab_free(&t->added_map);
    tok_merges_free(&t->bpe.merges);
    free(t->bpe.prefix);
    free(t->bpe.suffix);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->special);
    free(t->added_of_id);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    tok_normalizer_free(t->normalizer);
    free(t->normalizer);
    tok_pretok_free(t->pretok);
    free(t->pretok);
    tok_decoder_free(t->decoder);
    free(t->decoder);
    free(t->post.pre);
    free(t->post.post);
    free(t->no_cut);
    free(t->chat_template);
    free(t->bos_token);
    free(t->eos_token);
    free(t->pad_token);
    free(t->unk_token);
    pthread_mutex_destroy(&t->lock);
    tok_work_free(&t->work);
    free(t);
}

/* The ByteLevel step that ends pre-tokenisation, if any: its byte mapping
 * can move into the BPE model, which then caches words by raw bytes. */
static tok_pretok *final_bytelevel(tok_pretok *p) {
    while (p && p->kind == TOK_PRE_SEQUENCE) p = p->n_sub ? &p->sub[p->n_sub - 1] : NULL;
    return p && p->kind == TOK_PRE_BYTELEVEL ? p : NULL;
}

static int32_t id_of(const lm_tokenizer *t, const char *s) {
    return s ? lm_tokenizer_token_to_id(t, s, strlen(s)) : -1;
}

int tok_finish_setup(lm_tokenizer *t, lm_err *e) {
    int32_t n = t->vocab.n_ids;
    for (int i = 0; i < t->n_added; i++) n = LM_MAX(n, t->added[i].id + 1);
    t->n_ids = n;
    t->special = lm_xcalloc((size_t)n + 1, 1);
    t->added_of_id = lm_xmalloc(((size_t)n + 1) * sizeof *t->added_of_id);
    for (int32_t i = 0; i <= n; i++) t->added_of_id[i] = -1;
    tok_vocab_init(&t->added_map, (size_t)t->n_added);
    lm_tok_str norm = { 0 }, tmp = { 0 };
    tok_regex_scratch rs = { 0 };
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (t->added_of_id[a->id] < 0) t->added_of_id[a->id] = i;
        if (a->special) t->special[a->id] = 1;
        tok_vocab_set(&t->added_map, i, a->content, a->len);
        if (!a->normalized || !t->normalizer) {
            tok_trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->content, a->len, i);
        } else {
            tok_normalize(t->normalizer, a->content, a->len, &norm, &tmp, &rs);
            tok_trie_add(&t->trie_norm, norm.s, norm.len, i);
        }
    }
    lm_tok_str_free(&norm);
    lm_tok_str_free(&tmp);
    if (rs.md) pcre2_match_data_free(rs.md);

    tok_pretok *bl = final_bytelevel(t->pretok);
    if (bl) {
        bl->defer_map = true;
        t->bpe.byte_level = true;
        for (int b = 0; b < 256; b++) {
            char s[4];
            int l = tok_utf8_put(tok_byte_to_cp[b], s);
            t->bpe.byte_ids[b] = tok_vocab_get(&t->vocab, s, (size_t)l);
        }
    }
    if (t->bpe.byte_fallback)
        for (int b = 0; b < 256; b++) {
            char s[8];
            snprintf(s, sizeof s, "<0x%02X>", b);
            t->bpe.fallback_ids[b] = tok_vocab_get(&t->vocab, s, 6);
        }
    if (!t->pretok && !t->bpe.byte_level && !t->bpe.prefix_len && !t->bpe.suffix_len &&
        tok_vocab_get(&t->vocab, k_meta, 3) >= 0) {
        t->cut_ok = true;
        for (int32_t id = 0; t->cut_ok && id < t->vocab.n_ids; id++) {
            size_t l;
            const char *s = tok_vocab_str(&t->vocab, id, &l);
            for (size_t j = 1; s && j + 3 <= l; j++) {
                if (memcmp(s + j, k_meta, 3) || (j >= 3 && !memcmp(s + j - 3, k_meta, 3))) continue;
                size_t k = j - 1;
                while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
                int cl;
                uint32_t c = tok_utf8_cp(s + k, j - k, &cl);
                bool seen = false;
                for (int q = 0; q < t->n_no_cut; q++) seen |= t->no_cut[q] == c;
                if (seen) continue;
                if (t->n_no_cut == 64) { t->cut_ok = false; break; } /* too irregular: never cut */
                t->no_cut = lm_xrealloc(t->no_cut, (size_t)(t->n_no_cut + 1) * sizeof *t->no_cut);
                t->no_cut[t->n_no_cut++] = c;
            }
        }
    }
    for (int i = 0; i < t->post.n_pre + t->post.n_post; i++) {
        int32_t id = i < t->post.n_pre ? t->post.pre[i] : t->post.post[i - t->post.n_pre];
        if (id >= t->n_ids) return lm_errf(e, "post_processor: special token id %d is outside the vocabulary", id);
    }
    /* special ids: the config's strings win; else what the post-processor adds */
    if (t->bos_id < 0) t->bos_id = id_of(t, t->bos_token);
    if (t->eos_id < 0) t->eos_id = id_of(t, t->eos_token);
    if (t->pad_id < 0) t->pad_id = id_of(t, t->pad_token);
    if (t->unk_id < 0) t->unk_id = t->unk_token ? id_of(t, t->unk_token) : t->bpe.unk;
    if (t->bos_id < 0 && t->post.n_pre) t->bos_id = t->post.pre[0];
    t->add_bos = t->post.n_pre > 0 && t->post.pre[0] == t->bos_id;
    t->add_eos = t->post.n_post > 0 && t->post.post[t->post.n_post - 1] == t->eos_id;
    if (!t->bos_token && t->bos_id >= 0) {
        size_t l;
        const char *s = lm_tokenizer_id_to_token(t, t->bos_id, &l);
        if (s) t->bos_token = strndup(s, l);
    }
    return 0;
}

/* ---- loading ---- */

/* Errors are one line even when they quote the file (tokens, regexes). */
static int one_line(lm_err *e) {
    if (e)
        for (char *p = e->msg; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    return -1;
}

int lm_tokenizer_load_json(lm_tokenizer **out, const char *json, size_t len, const char *config,
                           size_t config_len, const char *label, lm_err *e) {
    *out = NULL;
    lm_tokenizer *t = tok_alloc();
    if (tok_parse_json(t, json, len, label, e)) goto bad;
    if (config && tok_parse_config(t, config, config_len, "tokenizer_config.json", e)) goto bad;
    if (tok_finish_setup(t, e)) {
        lm_err_prefix(e, "%s", label); /* the checks across sections name the file too */
        goto bad;
    }
    *out = t;
    return 0;
bad:
    lm_tokenizer_free(t);
    return one_line(e);
}

int lm_tokenizer_load_gguf(lm_tokenizer **out, const lm_gguf *g, lm_err *e) {
    *out = NULL;
    lm_tokenizer *t = tok_alloc();
    if (tok_from_gguf(t, g, e) || tok_finish_setup(t, e)) {
        lm_tokenizer_free(t);
        return one_line(e);
    }
    *out = t;
    return 0;
}

int lm_tokenizer_load_from(lm_tokenizer **out, const lm_source *src, lm_err *e) {
    *out = NULL;
    const char *path = lm_source_path(src);
    if (lm_source_gguf(src)) {
        int r = lm_tokenizer_load_gguf(out, lm_source_gguf(src), e);
        return r ? lm_err_prefix(e, "%s", path) : 0;
    }
    const char *dir = lm_source_folder(src);
    char *json_path = lm_source_kind_of(src) == LM_SOURCE_HF ? lm_path_join(path, "tokenizer.json") : lm_xstrdup(path);
    char *cfg_path = lm_path_join(dir, "tokenizer_config.json");
    char *jinja_path = lm_path_join(dir, "chat_template.jinja");
    char *cfg = NULL, *jinja = NULL;
    size_t cfg_len = 0, jinja_len = 0;
    lm_mmap m = { 0 };
    int r = -1;
    if (lm_mmap_open(&m, json_path, e)) goto out;
    if (lm_file_exists(cfg_path) && !(cfg = lm_read_file(cfg_path, &cfg_len, e))) goto out;
    if (lm_tokenizer_load_json(out, m.data ? (const char *)m.data : "", m.size, cfg, cfg_len, json_path, e)) {
        if (cfg && strstr(e->msg, "tokenizer_config.json") == e->msg) lm_err_prefix(e, "%s", dir);
        goto out;
    }
    /* a template that is there but cannot be read is an error, not "no template" */
    if (access(jinja_path, F_OK) == 0 && !(jinja = lm_read_file(jinja_path, &jinja_len, e))) goto out;
    if (jinja) {
        free((*out)->chat_template);
        (*out)->chat_template = jinja;
        jinja = NULL;
    }
    r = 0;
out:
    lm_mmap_close(&m);
    free(cfg);
    free(jinja);
    free(json_path);
    free(cfg_path);
    free(jinja_path);
    return r;
}

int lm_tokenizer_load(lm_tokenizer **out, const char *path, lm_err *e) {
    lm_source *src;
    *out = NULL;
    if (lm_source_open(&src, path, e)) return -1;
    int r = lm_tokenizer_load_from(out, src, e);
    lm_source_unref(src);
    return r;
}

/* ---- encode ---- */

/* Cuts a SentencePiece-style word before each "▁" that follows a character
 * c, when c is a token by itself and no token contains c + "▁": every
 * symbol left of the cut then ends with c, every one right of it starts with
 * "▁", and a merge across would make a token containing c + "▁" - which does
 * not exist. So the cut changes no result; it lets long texts (Llama 2,
 * Mistral, Gemma have no pre-tokenizer) use the word cache and short merges. */
static void spm_cuts(const lm_tokenizer *t, tok_pieces *p) {
    const char *s = p->buf.s;
    uint32_t n = p->v[0].len, start = 0;
    bool first = p->v[0].first;
    p->n = 0;
    for (uint32_t i = 1; i + 3 <= n; i++) {
        if (memcmp(s + i, k_meta, 3)) continue;
        uint32_t k = i - 1; /* start of the character before */
        while (k > start && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
        if (i - k == 3 && !memcmp(s + k, k_meta, 3)) continue; /* inside a run of ▁ */
        int cl;
        uint32_t c = tok_utf8_cp(s + k, i - k, &cl);
        bool bad = tok_vocab_get(&t->vocab, s + k, i - k) < 0;
        for (int q = 0; q < t->n_no_cut && !bad; q++) bad = t->no_cut[q] == c;
        if (bad) continue;
        tok_pieces_push(p, start, i - start, first && start == 0);
        start = i;
    }
    tok_pieces_push(p, start, n - start, first && start == 0);
}

static void encode_text(lm_tokenizer *t, tok_work *w, const char *s, size_t n, bool first,
                        lm_tok_ids *out) {
    tok_pieces *p = &w->pieces;
    p->buf.len = 0;
    p->n = 0;
    tok_str_append(&p->buf, s, n);
    tok_pieces_push(p, 0, (uint32_t)n, first);
    if (t->pretok) tok_pretokenize(t->pretok, p, &w->ptmp, &w->spans, &w->rs);
    else if (t->cut_ok && n > 16) spm_cuts(t, p);
    for (size_t i = 0; i < p->n; i++) tok_bpe_word(t, w, p->buf.s + p->v[i].off, p->v[i].len, out);
}

static void encode_with(lm_tokenizer *t, tok_work *w, const char *text, size_t len, bool add_special,
                        const lm_tok_span *lit, size_t n_lit, lm_tok_ids *out) {
    if (!tok_utf8_valid(text, len)) {
        w->clean.len = 0;
        tok_utf8_lossy(&w->clean, text, len);
        text = w->clean.s, len = w->clean.len;
    }
    if (add_special)
        for (int i = 0; i < t->post.n_pre; i++) tok_ids_push(out, t->post.pre[i]);
    tok_split_added(t, &t->trie_raw, text, len, lit, n_lit, &w->segs);
    for (size_t i = 0; i < w->segs.n; i++) {
        tok_seg sg = w->segs.v[i];
        if (sg.added >= 0) {
            tok_ids_push(out, t->added[sg.added].id);
            continue;
        }
        const char *s = text + sg.start;
        size_t n = sg.end - sg.start;
        if (t->normalizer) {
            tok_normalize(t->normalizer, s, n, &w->norm, &w->ntmp, &w->rs);
            s = w->norm.s, n = w->norm.len;
        }
        /* normalizing moves offsets: a segment that touches literal text is literal whole */
        const lm_tok_span all = { 0, n };
        const bool in_lit = lit && tok_spans_overlap(lit, n_lit, sg.start, sg.end);
        tok_split_added(t, &t->trie_norm, s, n, in_lit ? &all : NULL, in_lit, &w->nsegs);
        for (size_t j = 0; j < w->nsegs.n; j++) {
            tok_seg ns = w->nsegs.v[j];
            if (ns.added >= 0) tok_ids_push(out, t->added[ns.added].id);
            else encode_text(t, w, s + ns.start, ns.end - ns.start, sg.start == 0 && ns.start == 0, out);
        }
    }
    if (add_special)
        for (int i = 0; i < t->post.n_post; i++) tok_ids_push(out, t->post.post[i]);
}

int lm_tokenizer_encode(lm_tokenizer *t, const char *text, size_t len, bool add_special,
                        lm_tok_ids *out, lm_err *e) {
    return lm_tokenizer_encode_lit(t, text, len, add_special, NULL, 0, out, e);
}

int lm_tokenizer_encode_lit(lm_tokenizer *t, const char *text, size_t len, bool add_special,
                            const lm_tok_span *lit, size_t n_lit, lm_tok_ids *out, lm_err *e) {
    if (len && !text) return lm_errf(e, "encode: NULL text");
    if (len > (size_t)UINT32_MAX / 4) return lm_errf(e, "encode: text of %zu bytes is too long", len);
    if (!len) text = "";
    if (n_lit && !tok_utf8_valid(text, len)) /* the lossy repair would move the literal ranges */
        return lm_errf(e, "encode: a prompt with literal text must be valid UTF-8");
    if (pthread_mutex_trylock(&t->lock) == 0) {
        encode_with(t, &t->work, text, len, add_special, lit, n_lit, out);
        pthread_mutex_unlock(&t->lock);
    } else { /* another thread holds the cache: work without one */
        tok_work w;
        tok_work_init(&w, false);
        encode_with(t, &w, text, len, add_special, lit, n_lit, out);
        tok_work_free(&w);
    }
    return 0;
}

/* ---- lookups ---- */

int32_t lm_tokenizer_n_vocab(const lm_tokenizer *t) { return t->n_ids; }

int32_t lm_tokenizer_token_to_id(const lm_tokenizer *t, const char *s, size_t len) {
    int32_t a = t->added_map.slots ? tok_vocab_get(&t->added_map, s, len) : -1;
    if (a >= 0) return t->added[a].id;
    return tok_vocab_get(&t->vocab, s, len);
}

const char *lm_tokenizer_id_to_token(const lm_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids) return NULL;
    int32_t a = t->added_of_id[id];
    if (a >= 0) {
        *len = t->added[a].len;
        return t->added[a].content;
    }
    return tok_vocab_str(&t->vocab, id, len);
}

bool lm_tokenizer_is_special(const lm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->special[id];
}

int lm_tokenizer_n_added(const lm_tokenizer *t) { return t->n_added; }

int32_t lm_tokenizer_added(const lm_tokenizer *t, int i, const char **content, bool *special) {
    LM_ASSERT(i >= 0 && i < t->n_added);
    if (content) *content = t->added[i].content;
    if (special) *special = t->added[i].special;
    return t->added[i].id;
}

int32_t lm_tokenizer_bos(const lm_tokenizer *t) { return t->bos_id; }
int32_t lm_tokenizer_eos(const lm_tokenizer *t) { return t->eos_id; }
int32_t lm_tokenizer_pad(const lm_tokenizer *t) { return t->pad_id; }
int32_t lm_tokenizer_unk(const lm_tokenizer *t) { return t->unk_id; }
const char *lm_tokenizer_chat_template(const lm_tokenizer *t) { return t->chat_template; }
const char *lm_tokenizer_bos_token(const lm_tokenizer *t) { return t->bos_token; }
const char *lm_tokenizer_eos_token(const lm_tokenizer *t) { return t->eos_token; }
const char *lm_tokenizer_pad_token(const lm_tokenizer *t) { return t->pad_token; }
bool lm_tokenizer_adds_bos(const lm_tokenizer *t) { return t->add_bos; }
bool lm_tokenizer_adds_eos(const lm_tokenizer *t) { return t->add_eos; }
