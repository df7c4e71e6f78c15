/* tokenizer_json.c - reads a Hugging Face tokenizer.json (and
 * tokenizer_config.json) into the component structs of tok_internal.h.
 *
 * Syntax errors report jansson's line, column and byte offset; semantic
 * errors name the JSON path ("pre_tokenizer.pretokenizers[1].pattern").
 * Every id is range-checked before it sizes anything. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "tok_internal.h"

#define MAX_ID (1 << 24) /* ids size tables: 16M is far past any real vocabulary */

typedef struct jctx {
    const char *label;
    lm_err *e;
} jctx;

/* Messages are one line: control bytes from the file (a token, jansson's
 * "near" excerpt) become '?'. */
static int one_line(lm_err *e) {
    if (e)
        for (char *p = e->msg; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    return -1;
}

static int fail(jctx *c, const char *path, const char *fmt, const char *arg) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    lm_errf(c->e, "%s: %s: %s", c->label, path, msg);
    return one_line(c->e);
}

static char *sub_path(const char *path, const char *key, int idx) {
    char buf[256];
    if (idx >= 0) snprintf(buf, sizeof buf, "%s.%s[%d]", path, key, idx);
    else snprintf(buf, sizeof buf, "%s%s%s", path, *path ? "." : "", key);
    return lm_xstrdup(buf);
}

static const char *jstr(json_t *o, const char *key, size_t *len) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return NULL;
    if (len) *len = json_string_length(v);
    return json_string_value(v);
}

static bool jbool(json_t *o, const char *key, bool dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static char *dupn(const char *s, size_t n) {
    char *p = lm_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* A single code point from a string field (Metaspace replacement, Strip content). */
static int one_char(jctx *c, const char *path, json_t *o, const char *key, uint32_t dflt, uint32_t *out) {
    size_t n;
    const char *s = jstr(o, key, &n);
    if (!s) { *out = dflt; return 0; }
    int l;
    if (!n || (*out = tok_utf8_cp(s, n, &l), (size_t)l != n))
        return fail(c, path, "\"%s\" must be one character", key);
    return 0;
}

/* {"String": "..."} or {"Regex": "..."} */
static int parse_pattern(jctx *c, const char *path, json_t *o, tok_pattern *p) {
    json_t *pat = json_object_get(o, "pattern");
    size_t n;
    const char *s;
    if (json_is_object(pat) && (s = jstr(pat, "String", &n))) p->kind = TOK_PAT_STRING;
    else if (json_is_object(pat) && (s = jstr(pat, "Regex", &n))) p->kind = TOK_PAT_REGEX;
    else return fail(c, path, "pattern must be {\"String\": ...} or {\"Regex\": ...}%s", NULL);
    p->str = dupn(s, n);
    p->len = n;
    if (tok_pattern_compile(p, c->e)) return lm_err_prefix(c->e, "%s: %s", c->label, path), one_line(c->e);
    return 0;
}

static int parse_behavior(jctx *c, const char *path, json_t *o, tok_split_behavior *b) {
    static const char *const names[] = { "Removed", "Isolated", "MergedWithPrevious",
                                         "MergedWithNext", "Contiguous" };
    const char *s = jstr(o, "behavior", NULL);
    if (!s) { *b = TOK_SPLIT_ISOLATED; return 0; }
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) { *b = (tok_split_behavior)i; return 0; }
    return fail(c, path, "unknown split behavior \"%s\"", s);
}

/* ---- normalizers ---- */

static int parse_normalizer(jctx *c, const char *path, json_t *o, tok_normalizer *nz) {
    const char *type = jstr(o, "type", NULL);
    if (!json_is_object(o) || !type) return fail(c, path, "expected an object with a \"type\"%s", NULL);
    static const struct { const char *name; tok_norm_kind k; } simple[] = {
        { "NFC", TOK_NORM_NFC }, { "NFD", TOK_NORM_NFD }, { "NFKC", TOK_NORM_NFKC },
        { "NFKD", TOK_NORM_NFKD }, { "Lowercase", TOK_NORM_LOWERCASE },
        { "StripAccents", TOK_NORM_STRIP_ACCENTS }, { "ByteLevel", TOK_NORM_BYTELEVEL },
    };
    for (size_t i = 0; i < LM_COUNT(simple); i++)
        if (!strcmp(type, simple[i].name)) { nz->kind = simple[i].k; return 0; }
    size_t n;
    const char *s;
    if (!strcmp(type, "Prepend")) {
        nz->kind = TOK_NORM_PREPEND;
        if (!(s = jstr(o, "prepend", &n))) return fail(c, path, "Prepend needs \"prepend\"%s", NULL);
        nz->content = dupn(s, n), nz->content_len = n;
    } else if (!strcmp(type, "Replace")) {
        nz->kind = TOK_NORM_REPLACE;
        if (!(s = jstr(o, "content", &n))) return fail(c, path, "Replace needs \"content\"%s", NULL);
        nz->content = dupn(s, n), nz->content_len = n;
        return parse_pattern(c, path, o, &nz->pat);
    } else if (!strcmp(type, "Strip")) {
        nz->kind = TOK_NORM_STRIP;
        nz->left = jbool(o, "strip_left", true);
        nz->right = jbool(o, "strip_right", true);
    } else if (!strcmp(type, "BertNormalizer")) {
        nz->kind = TOK_NORM_BERT;
        nz->clean_text = jbool(o, "clean_text", true);
        nz->handle_chinese = jbool(o, "handle_chinese_chars", true);
        nz->lowercase = jbool(o, "lowercase", true);
        nz->strip_accents = jbool(o, "strip_accents", nz->lowercase);
    } else if (!strcmp(type, "Sequence")) {
        nz->kind = TOK_NORM_SEQUENCE;
        json_t *a = json_object_get(o, "normalizers");
        if (!json_is_array(a)) return fail(c, path, "Sequence needs \"normalizers\"%s", NULL);
        nz->n_sub = (int)json_array_size(a);
        nz->sub = lm_xcalloc((size_t)nz->n_sub + 1, sizeof *nz->sub);
        for (int i = 0; i < nz->n_sub; i++) {
            char *p = sub_path(path, "normalizers", i);
            int r = parse_normalizer(c, p, json_array_get(a, (size_t)i), &nz->sub[i]);
            free(p);
            if (r) return r;
        }
    } else {
        return fail(c, path, "unsupported normalizer type \"%s\"", type);
    }
    return 0;
}

/* ---- pre-tokenizers ---- */

static int parse_prepend(jctx *c, const char *path, json_t *o, tok_prepend *p) {
    const char *s = jstr(o, "prepend_scheme", NULL);
    if (!s) { /* legacy add_prefix_space */
        *p = jbool(o, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        return 0;
    }
    if (!strcmp(s, "always")) *p = TOK_PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *p = TOK_PREPEND_FIRST;
    else if (!strcmp(s, "never")) *p = TOK_PREPEND_NEVER;
    else return fail(c, path, "unknown prepend_scheme \"%s\"", s);
    return 0;
}

static int parse_pretok(jctx *c, const char *path, json_t *o, tok_pretok *pt) {
    const char *type = jstr(o, "type", NULL);
    if (!json_is_object(o) || !type) return fail(c, path, "expected an object with a \"type\"%s", NULL);
    if (!strcmp(type, "Split")) {
        pt->kind = TOK_PRE_SPLIT;
        pt->invert = jbool(o, "invert", false);
        if (parse_behavior(c, path, o, &pt->behavior)) return -1;
        return parse_pattern(c, path, o, &pt->pat);
    } else if (!strcmp(type, "ByteLevel")) {
        pt->kind = TOK_PRE_BYTELEVEL;
        pt->add_prefix_space = jbool(o, "add_prefix_space", true);
        pt->use_regex = jbool(o, "use_regex", true);
        if (pt->use_regex && tok_pretok_builtin_regex(pt, c->e)) return -1;
    } else if (!strcmp(type, "Metaspace")) {
        pt->kind = TOK_PRE_METASPACE;
        pt->split = jbool(o, "split", true);
        if (one_char(c, path, o, "replacement", 0x2581, &pt->replacement)) return -1;
        return parse_prepend(c, path, o, &pt->prepend);
    } else if (!strcmp(type, "Whitespace")) {
        pt->kind = TOK_PRE_WHITESPACE;
        return tok_pretok_builtin_regex(pt, c->e);
    } else if (!strcmp(type, "WhitespaceSplit")) {
        pt->kind = TOK_PRE_WHITESPACE_SPLIT;
    } else if (!strcmp(type, "Punctuation")) {
        pt->kind = TOK_PRE_PUNCTUATION;
        return parse_behavior(c, path, o, &pt->behavior);
    } else if (!strcmp(type, "Digits")) {
        pt->kind = TOK_PRE_DIGITS;
        pt->individual_digits = jbool(o, "individual_digits", false);
    } else if (!strcmp(type, "BertPreTokenizer")) {
        pt->kind = TOK_PRE_BERT;
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        pt->kind = TOK_PRE_CHAR_DELIM;
        return one_char(c, path, o, "delimiter", ' ', &pt->replacement);
    } else if (!strcmp(type, "Sequence")) {
        pt->kind = TOK_PRE_SEQUENCE;
        json_t *a = json_object_get(o, "pretokenizers");
        if (!json_is_array(a)) return fail(c, path, "Sequence needs \"pretokenizers\"%s", NULL);
        pt->n_sub = (int)json_array_size(a);
        pt->sub = lm_xcalloc((size_t)pt->n_sub + 1, sizeof *pt->sub);
        for (int i = 0; i < pt->n_sub; i++) {
            char *p = sub_path(path, "pretokenizers", i);
            int r = parse_pretok(c, p, json_array_get(a, (size_t)i), &pt->sub[i]);
            free(p);
            if (r) return r;
        }
    } else {
        return fail(c, path, "unsupported pre_tokenizer type \"%s\"", type);
    }
    return 0;
}

/* ---- decoders ---- */

static int parse_decoder(jctx *c, const char *path, json_t *o, tok_decoder *d) {
    const char *type = jstr(o, "type", NULL);
    if (!json_is_object(o) || !type) return fail(c, path, "expected an object with a \"type\"%s", NULL);
    size_t n;
    const char *s;
    if (!strcmp(type, "ByteLevel")) d->kind = TOK_DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d->kind = TOK_DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d->kind = TOK_DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->kind = TOK_DEC_METASPACE;
        tok_prepend p;
        if (one_char(c, path, o, "replacement", 0x2581, &d->strip_char) || parse_prepend(c, path, o, &p))
            return -1;
        d->prepend_never = p == TOK_PREPEND_NEVER;
    } else if (!strcmp(type, "Replace")) {
        d->kind = TOK_DEC_REPLACE;
        if (!(s = jstr(o, "content", &n))) return fail(c, path, "Replace needs \"content\"%s", NULL);
        d->content = dupn(s, n), d->content_len = n;
        return parse_pattern(c, path, o, &d->pat);
    } else if (!strcmp(type, "Strip")) {
        d->kind = TOK_DEC_STRIP;
        json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
        if (one_char(c, path, o, "content", ' ', &d->strip_char)) return -1;
        json_int_t x = json_is_integer(a) ? json_integer_value(a) : 0;
        json_int_t y = json_is_integer(b) ? json_integer_value(b) : 0;
        if (x < 0 || y < 0 || x > 1 << 20 || y > 1 << 20)
            return fail(c, path, "Strip start/stop out of range%s", NULL);
        d->strip_start = (int)x, d->strip_stop = (int)y;
    } else if (!strcmp(type, "WordPiece")) {
        d->kind = TOK_DEC_WORDPIECE;
        s = jstr(o, "prefix", &n);
        if (!s) s = "##", n = 2;
        d->content = dupn(s, n), d->content_len = n;
        d->cleanup = jbool(o, "cleanup", true);
    } else if (!strcmp(type, "BPEDecoder")) {
        d->kind = TOK_DEC_BPE;
        s = jstr(o, "suffix", &n);
        if (!s) s = "</w>", n = 4;
        d->content = dupn(s, n), d->content_len = n;
    } else if (!strcmp(type, "Sequence")) {
        d->kind = TOK_DEC_SEQUENCE;
        json_t *a = json_object_get(o, "decoders");
        if (!json_is_array(a)) return fail(c, path, "Sequence needs \"decoders\"%s", NULL);
        d->n_sub = (int)json_array_size(a);
        d->sub = lm_xcalloc((size_t)d->n_sub + 1, sizeof *d->sub);
        for (int i = 0; i < d->n_sub; i++) {
            char *p = sub_path(path, "decoders", i);
            int r = parse_decoder(c, p, json_array_get(a, (size_t)i), &d->sub[i]);
            free(p);
            if (r) return r;
        }
    } else {
        return fail(c, path, "unsupported decoder type \"%s\"", type);
    }
    return 0;
}

/* ---- post-processors ---- */

static void push_id(int32_t **v, int *n, int32_t id) {
    *v = lm_xrealloc(*v, (size_t)(*n + 1) * sizeof **v);
    (*v)[(*n)++] = id;
}

/* [ "token", id ] as Bert/Roberta store cls and sep. */
static int pair_id(jctx *c, const char *path, json_t *o, const char *key, int32_t *id) {
    json_t *a = json_object_get(o, key);
    json_t *v = json_array_get(a, 1);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
        return fail(c, path, "\"%s\" must be [token, id]", key);
    *id = (int32_t)json_integer_value(v);
    return 0;
}

static int parse_post(jctx *c, const char *path, json_t *o, tok_post *p) {
    const char *type = jstr(o, "type", NULL);
    if (!json_is_object(o) || !type) return fail(c, path, "expected an object with a \"type\"%s", NULL);
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        int32_t cls, sep;
        if (pair_id(c, path, o, "cls", &cls) || pair_id(c, path, o, "sep", &sep)) return -1;
        push_id(&p->pre, &p->n_pre, cls);
        push_id(&p->post, &p->n_post, sep);
        return 0;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *a = json_object_get(o, "processors");
        if (!json_is_array(a)) return fail(c, path, "Sequence needs \"processors\"%s", NULL);
        for (size_t i = 0; i < json_array_size(a); i++) {
            char *sp = sub_path(path, "processors", (int)i);
            int r = parse_post(c, sp, json_array_get(a, i), p);
            free(sp);
            if (r) return r;
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing")) return fail(c, path, "unsupported post_processor type \"%s\"", type);
    json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single)) return fail(c, path, "TemplateProcessing needs \"single\"%s", NULL);
    bool seen_seq = false;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *it = json_array_get(single, i);
        if (json_object_get(it, "Sequence")) { seen_seq = true; continue; }
        json_t *st = json_object_get(it, "SpecialToken");
        const char *name = jstr(st, "id", NULL);
        if (!name) return fail(c, path, "single: each item is a Sequence or a SpecialToken%s", NULL);
        json_t *tok = json_object_get(specials, name);
        json_t *ids = json_object_get(tok, "ids");
        if (!json_is_array(ids)) return fail(c, path, "special_tokens has no ids for \"%s\"", name);
        for (size_t j = 0; j < json_array_size(ids); j++) {
            json_t *v = json_array_get(ids, j);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
                return fail(c, path, "special_tokens[\"%s\"].ids: bad id", name);
            int32_t id = (int32_t)json_integer_value(v);
            if (seen_seq) push_id(&p->post, &p->n_post, id);
            else push_id(&p->pre, &p->n_pre, id);
        }
    }
    return 0;
}

/* ---- the model ---- */

static int parse_merge(jctx *c, json_t *m, size_t i, const char **a, size_t *an, const char **b,
                       size_t *bn) {
    char path[64];
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) {
            snprintf(path, sizeof path, "model.merges[%zu]", i);
            return fail(c, path, "a merge string must be two tokens separated by one space%s", NULL);
        }
        *a = s, *an = (size_t)(sp - s), *b = sp + 1, *bn = n - *an - 1;
        return 0;
    }
    json_t *x = json_array_get(m, 0), *y = json_array_get(m, 1);
    if (!json_is_array(m) || json_array_size(m) != 2 || !json_is_string(x) || !json_is_string(y)) {
        snprintf(path, sizeof path, "model.merges[%zu]", i);
        return fail(c, path, "a merge must be \"a b\" or [\"a\", \"b\"]%s", NULL);
    }
    *a = json_string_value(x), *an = json_string_length(x);
    *b = json_string_value(y), *bn = json_string_length(y);
    return 0;
}

static int parse_model(jctx *c, lm_tokenizer *t, json_t *m) {
    const char *type = jstr(m, "type", NULL);
    if (!json_is_object(m)) return fail(c, "model", "missing or not an object%s", NULL);
    if (type && strcmp(type, "BPE")) return fail(c, "model", "unsupported model type \"%s\" (BPE only)", type);
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!json_is_object(vocab)) return fail(c, "model.vocab", "missing or not an object%s", NULL);
    if (merges && !json_is_array(merges)) return fail(c, "model.merges", "not an array%s", NULL);
    tok_vocab_init(&t->vocab, json_object_size(vocab));
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach(vocab, key, key_len, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_ID)
            return fail(c, "model.vocab", "bad id for token \"%.60s\"", key);
        if (!tok_vocab_set(&t->vocab, (int32_t)json_integer_value(val), key, key_len))
            return fail(c, "model.vocab", "two tokens share the id of \"%.60s\"", key);
    }
    tok_bpe *b = &t->bpe;
    size_t n;
    const char *s;
    if ((s = jstr(m, "continuing_subword_prefix", &n)) && n) b->prefix = dupn(s, n), b->prefix_len = n;
    if ((s = jstr(m, "end_of_word_suffix", &n)) && n) b->suffix = dupn(s, n), b->suffix_len = n;
    b->fuse_unk = jbool(m, "fuse_unk", false);
    b->byte_fallback = jbool(m, "byte_fallback", false);
    b->ignore_merges = jbool(m, "ignore_merges", false);
    b->unk = -1;
    if ((s = jstr(m, "unk_token", &n))) b->unk = tok_vocab_get(&t->vocab, s, n);
    size_t nm = merges ? json_array_size(merges) : 0;
    tok_merges_init(&b->merges, nm);
    lm_tok_str tmp = { 0 };
    uint32_t rank = 0;
    for (size_t i = 0; i < nm; i++) {
        const char *x = NULL, *y = NULL;
        size_t xn = 0, yn = 0;
        json_t *mi = json_array_get(merges, i);
        if (json_is_string(mi) && !strncmp(json_string_value(mi), "#version", 8)) continue;
        if (parse_merge(c, mi, i, &x, &xn, &y, &yn)) goto bad;
        int32_t ia = tok_vocab_get(&t->vocab, x, xn), ib = tok_vocab_get(&t->vocab, y, yn);
        char path[64] = "";
        if (ia < 0 || ib < 0) {
            snprintf(path, sizeof path, "model.merges[%zu]", i);
            char tk[64];
            snprintf(tk, sizeof tk, "%.*s", (int)LM_MIN(ia < 0 ? xn : yn, 60), ia < 0 ? x : y);
            fail(c, path, "token \"%s\" is not in the vocabulary", tk);
            goto bad;
        }
        if (b->prefix_len && yn >= b->prefix_len && !memcmp(y, b->prefix, b->prefix_len))
            y += b->prefix_len, yn -= b->prefix_len;
        tmp.len = 0;
        tok_str_append(&tmp, x, xn);
        tok_str_append(&tmp, y, yn);
        int32_t id = tok_vocab_get(&t->vocab, tmp.s, tmp.len);
        if (id < 0) {
            snprintf(path, sizeof path, "model.merges[%zu]", i);
            fail(c, path, "merged token \"%.60s\" is not in the vocabulary", tmp.s);
            goto bad;
        }
        tok_merges_put(&b->merges, ia, ib, rank++, id);
    }
    lm_tok_str_free(&tmp);
    return 0;
bad:
    lm_tok_str_free(&tmp);
    return -1;
}

/* Added tokens get their ids as HF's AddedVocabulary::add_tokens gives them
 * (the "id" in the file is only checked by HF, with a warning): a token in
 * the model vocabulary takes that id; a new one takes the vocabulary size
 * (its entry count) or, once added ids reach past it, the largest so far + 1.
 * Empty and repeated contents are skipped. Real files agree with this; a
 * hand-edited one with gaps is renumbered exactly as HF renumbers it. */
static int parse_added(jctx *c, lm_tokenizer *t, json_t *a) {
    if (!a) return 0;
    if (!json_is_array(a)) return fail(c, "added_tokens", "not an array%s", NULL);
    size_t n = json_array_size(a);
    t->added = lm_xcalloc(n + 1, sizeof *t->added);
    tok_vocab seen;
    tok_vocab_init(&seen, n);
    int64_t vocab_size = (int64_t)t->vocab.n_used, max_id = -1;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(a, i);
        json_t *id = json_object_get(o, "id");
        size_t len;
        const char *s = jstr(o, "content", &len);
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        if (!s || !json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_ID) {
            tok_vocab_free(&seen);
            return fail(c, path, "needs \"id\" and \"content\"%s", NULL);
        }
        if (!len || tok_vocab_get(&seen, s, len) >= 0) continue;
        int32_t vid = tok_vocab_get(&t->vocab, s, len);
        int64_t nid = vid >= 0 ? vid : max_id < 0 ? vocab_size
                    : (max_id >= vocab_size || vocab_size == 0) ? max_id + 1 : vocab_size;
        if (nid >= MAX_ID) {
            tok_vocab_free(&seen);
            return fail(c, path, "too many added tokens%s", NULL);
        }
        tok_vocab_set(&seen, t->n_added, s, len);
        max_id = LM_MAX(max_id, nid);
        tok_added *ad = &t->added[t->n_added++];
        ad->id = (int32_t)nid;
        ad->content = dupn(s, len), ad->len = len;
        ad->special = jbool(o, "special", false);
        ad->lstrip = jbool(o, "lstrip", false);
        ad->rstrip = jbool(o, "rstrip", false);
        ad->single_word = jbool(o, "single_word", false);
        ad->normalized = jbool(o, "normalized", !ad->special);
    }
    tok_vocab_free(&seen);
    return 0;
}

static bool is_null(json_t *v) { return !v || json_is_null(v); }

int tok_parse_json(lm_tokenizer *t, const char *json, size_t len, const char *label, lm_err *e) {
    jctx c = { label, e };
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    if (!root) {
        lm_errf(e, "%s: malformed JSON at line %d, column %d (byte %d): %s", label, je.line,
                je.column, je.position, je.text);
        return one_line(e);
    }
    int r = -1;
    if (!json_is_object(root)) {
        fail(&c, "(root)", "expected an object%s", NULL);
        goto out;
    }
    if (parse_model(&c, t, json_object_get(root, "model"))) goto out;
    if (parse_added(&c, t, json_object_get(root, "added_tokens"))) goto out;
    json_t *v;
    if (!is_null(v = json_object_get(root, "normalizer"))) {
        t->normalizer = lm_xcalloc(1, sizeof *t->normalizer);
        if (parse_normalizer(&c, "normalizer", v, t->normalizer)) goto out;
    }
    if (!is_null(v = json_object_get(root, "pre_tokenizer"))) {
        t->pretok = lm_xcalloc(1, sizeof *t->pretok);
        if (parse_pretok(&c, "pre_tokenizer", v, t->pretok)) goto out;
    }
    if (!is_null(v = json_object_get(root, "post_processor")) && parse_post(&c, "post_processor", v, &t->post))
        goto out;
    if (!is_null(v = json_object_get(root, "decoder"))) {
        t->decoder = lm_xcalloc(1, sizeof *t->decoder);
        if (parse_decoder(&c, "decoder", v, t->decoder)) goto out;
    }
    r = 0;
out:
    json_decref(root);
    return r;
}

/* "<s>" or {"content": "<s>", ...} */
static char *token_field(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? dupn(json_string_value(v), json_string_length(v)) : NULL;
}

int tok_parse_config(lm_tokenizer *t, const char *json, size_t len, const char *label, lm_err *e) {
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (!root) {
        lm_errf(e, "%s: malformed JSON at line %d, column %d (byte %d): %s", label, je.line,
                je.column, je.position, je.text);
        return one_line(e);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return lm_errf(e, "%s: expected an object", label);
    }
    t->bos_token = token_field(root, "bos_token");
    t->eos_token = token_field(root, "eos_token");
    t->pad_token = token_field(root, "pad_token");
    t->unk_token = token_field(root, "unk_token");
    json_t *ct = json_object_get(root, "chat_template");
    if (json_is_string(ct)) {
        t->chat_template = dupn(json_string_value(ct), json_string_length(ct));
    } else if (json_is_array(ct)) { /* [{"name": ..., "template": ...}]: take "default" */
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *it = json_array_get(ct, i);
            const char *name = jstr(it, "name", NULL);
            size_t n;
            const char *tpl = jstr(it, "template", &n);
            if (tpl && name && !strcmp(name, "default")) {
                free(t->chat_template);
                t->chat_template = dupn(tpl, n);
            }
        }
    }
    json_decref(root);
    return 0;
}
