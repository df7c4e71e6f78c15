/* decode.c - the decoder chain as a streaming transducer, and decode().
 *
 * Hugging Face decoders map a list of token strings to a list of strings
 * (decode_chain), stage after stage, and join the result. Here every stage
 * is a small state machine fed chunks of text, each flagged as starting
 * and/or ending a token, so that the same code serves lm_tokenizer_decode
 * (push every id, then finish) and the streaming detokenizer (push ids as
 * they are generated): their outputs agree by construction.
 *
 * Stages that need a whole token (Replace, ByteFallback, ByteLevel,
 * WordPiece, BPE) buffer a token until it ends; chunks that arrive whole
 * pass straight through. Fuse turns everything after it into one token;
 * Strip holds back at most `stop` trailing characters; ByteLevel turns its
 * bytes into text with Rust's from_utf8_lossy rules, holding only an
 * incomplete trailing character. The sink runs one more lossy pass so the
 * output is always valid UTF-8 and never ends inside a character. */
#define _GNU_SOURCE /* memmem */
#include <string.h>

#include "tok_internal.h"

enum { CH_NEW = 1, CH_END = 2 };

typedef struct dec_state {
    lm_tok_str buf;        /* whole-token stages: the token so far */
    bool in_token;
    long index;            /* tokens seen by this stage */
    lm_tok_str group;      /* ByteFallback: pending byte tokens */
    tok_utf8_stream u;     /* ByteLevel */
    bool started;          /* ByteLevel, Fuse: emitted the first chunk */
    int stripped;          /* Strip: leading chars removed in this token */
    bool lead_done;
    lm_tok_str held;       /* Strip: trailing content chars held back; BPE: previous token */
    lm_tok_str scratch, scratch2; /* this stage's output before it is passed on */
    int n_held;
    bool has_prev;
} dec_state;

struct lm_detok {
    const lm_tokenizer *t;
    bool skip_special;
    const tok_decoder **stage;
    dec_state *st;
    int n;
    long n_tokens;         /* no decoder: join with " " */
    tok_utf8_stream sink;
    lm_tok_str *out;       /* where the current push writes */
};

static void emit(lm_detok *d, int k, const char *s, size_t n, int flags);

static void flatten(lm_detok *d, const tok_decoder *dec, int *cap) {
    if (dec->kind == TOK_DEC_SEQUENCE) {
        for (int i = 0; i < dec->n_sub; i++) flatten(d, &dec->sub[i], cap);
        return;
    }
    if (d->n == *cap) {
        *cap = *cap ? *cap * 2 : 8;
        d->stage = lm_xrealloc(d->stage, (size_t)*cap * sizeof *d->stage);
    }
    d->stage[d->n++] = dec;
}

lm_detok *lm_detok_create(const lm_tokenizer *t, bool skip_special) {
    lm_detok *d = lm_xcalloc(1, sizeof *d);
    d->t = t;
    d->skip_special = skip_special;
    int cap = 0;
    if (t->decoder) flatten(d, t->decoder, &cap);
    d->st = lm_xcalloc((size_t)d->n + 1, sizeof *d->st);
    return d;
}

void lm_detok_free(lm_detok *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        lm_tok_str_free(&d->st[i].buf);
        lm_tok_str_free(&d->st[i].group);
        lm_tok_str_free(&d->st[i].held);
        lm_tok_str_free(&d->st[i].scratch);
        lm_tok_str_free(&d->st[i].scratch2);
    }
    free(d->st);
    free(d->stage);
    free(d);
}

static bool is_byte_token(const char *s, size_t n, uint8_t *byte) {
    /* HF: len 6, "<0x" .. ">", u8::from_str_radix(two chars, 16) */
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return false;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (x < 0) {
            if (i == 3 && c == '+') { v = 0; continue; } /* Rust accepts a leading '+' */
            return false;
        }
        v = v * 16 + x;
    }
    *byte = (uint8_t)v;
    return true;
}

/* out = s with every match of p replaced by `with` (HF's replace). Literal
 * patterns (all that real decoders use) go without the span list. */
static void replace_all(const tok_pattern *p, const char *with, size_t wn, const char *s, size_t n,
                        lm_tok_str *out) {
    out->len = 0;
    tok_str_reserve(out, n);
    if (p->kind == TOK_PAT_STRING) {
        size_t i = 0;
        while (p->len && i + p->len <= n) {
            const char *hit = memmem(s + i, n - i, p->str, p->len);
            if (!hit) break;
            tok_str_append(out, s + i, (size_t)(hit - (s + i)));
            tok_str_append(out, with, wn);
            i = (size_t)(hit - s) + p->len;
        }
        tok_str_append(out, s + i, n - i);
        return;
    }
    tok_spans sp = { 0 };
    tok_regex_scratch rs = { 0 };
    tok_find_matches(p, s, n, &sp, &rs);
    for (size_t i = 0; i < sp.n; i++) {
        if (sp.v[i].match) tok_str_append(out, with, wn);
        else tok_str_append(out, s + sp.v[i].start, sp.v[i].end - sp.v[i].start);
    }
    free(sp.v);
    if (rs.md) pcre2_match_data_free(rs.md);
}

static void bf_flush(lm_detok *d, int k) {
    dec_state *st = &d->st[k];
    if (!st->group.len) return;
    if (tok_utf8_valid(st->group.s, st->group.len)) {
        emit(d, k + 1, st->group.s, st->group.len, CH_NEW | CH_END);
    } else {
        for (size_t i = 0; i < st->group.len; i++) emit(d, k + 1, "\xEF\xBF\xBD", 3, CH_NEW | CH_END);
    }
    st->group.len = 0;
}

static const char *const k_cleanup[][2] = {
    { " .", "." }, { " ?", "?" }, { " !", "!" }, { " ,", "," }, { " ' ", "'" }, { " n't", "n't" },
    { " 'm", "'m" }, { " do not", " don't" }, { " 's", "'s" }, { " 've", "'ve" }, { " 're", "'re" },
};

/* A whole token at a stage that needs one. */
static void whole_token(lm_detok *d, int k, const char *s, size_t n) {
    const tok_decoder *dec = d->stage[k];
    dec_state *st = &d->st[k];
    long i = st->index++;
    switch (dec->kind) {
    case TOK_DEC_REPLACE:
        replace_all(&dec->pat, dec->content, dec->content_len, s, n, &st->scratch);
        emit(d, k + 1, st->scratch.s, st->scratch.len, CH_NEW | CH_END);
        break;
    case TOK_DEC_BYTEFALLBACK: {
        uint8_t b;
        if (is_byte_token(s, n, &b)) {
            tok_str_append(&st->group, &b, 1);
        } else {
            bf_flush(d, k);
            emit(d, k + 1, s, n, CH_NEW | CH_END);
        }
        break;
    }
    case TOK_DEC_BYTELEVEL: {
        lm_tok_str *bytes = &st->scratch2, *o = &st->scratch;
        bytes->len = o->len = 0;
        tok_str_reserve(bytes, n);
        tok_str_reserve(o, n + 8);
        bool ok = true;
        for (size_t j = 0; j < n && ok;) {
            int l;
            int b = tok_cp_to_byte(tok_utf8_cp(s + j, n - j, &l));
            if (b < 0) ok = false;
            else bytes->s[bytes->len++] = (char)b;
            j += (size_t)l;
        }
        if (ok) tok_utf8_stream_feed(&st->u, bytes->s, bytes->len, o);
        else tok_utf8_stream_feed(&st->u, s, n, o);
        if (o->len || !st->started) emit(d, k + 1, o->s, o->len, st->started ? 0 : CH_NEW);
        st->started = true;
        break;
    }
    case TOK_DEC_WORDPIECE: {
        lm_tok_str o = { 0 };
        if (i != 0) {
            if (n >= dec->content_len && !memcmp(s, dec->content, dec->content_len))
                s += dec->content_len, n -= dec->content_len;
            else tok_str_append(&o, " ", 1);
        }
        tok_str_append(&o, s, n);
        if (dec->cleanup) {
            for (size_t r = 0; r < LM_COUNT(k_cleanup); r++) {
                tok_pattern p = { TOK_PAT_STRING, (char *)k_cleanup[r][0], strlen(k_cleanup[r][0]), NULL };
                lm_tok_str o2 = { 0 };
                replace_all(&p, k_cleanup[r][1], strlen(k_cleanup[r][1]), o.s, o.len, &o2);
                lm_tok_str_free(&o);
                o = o2;
            }
        }
        emit(d, k + 1, o.s ? o.s : "", o.len, CH_NEW | CH_END);
        lm_tok_str_free(&o);
        break;
    }
    case TOK_DEC_BPE: {
        if (st->has_prev) {
            tok_pattern p = { TOK_PAT_STRING, dec->content, dec->content_len, NULL };
            lm_tok_str o = { 0 };
            replace_all(&p, " ", 1, st->held.s, st->held.len, &o);
            emit(d, k + 1, o.s, o.len, CH_NEW | CH_END);
            lm_tok_str_free(&o);
        }
        st->held.len = 0;
        tok_str_append(&st->held, s, n);
        st->has_prev = true;
        break;
    }
    default: LM_ASSERT(0);
    }
}

static void strip_chunk(lm_detok *d, int k, const char *s, size_t n, int flags) {
    const tok_decoder *dec = d->stage[k];
    dec_state *st = &d->st[k];
    if (flags & CH_NEW) {
        st->stripped = 0, st->lead_done = false, st->held.len = 0, st->n_held = 0;
    }
    bool new_out = flags & CH_NEW;
    lm_tok_str *o = &st->scratch;
    o->len = 0;
    tok_str_reserve(o, n);
    for (size_t j = 0; j < n;) {
        int l;
        uint32_t c = tok_utf8_cp(s + j, n - j, &l);
        const char *cs = s + j;
        j += (size_t)l;
        if (!st->lead_done && st->stripped < dec->strip_start && c == dec->strip_char) {
            st->stripped++;
            continue;
        }
        st->lead_done = true;
        if (dec->strip_stop > 0 && c == dec->strip_char) {
            if (st->n_held == dec->strip_stop) { /* the oldest held char is kept after all */
                int hl = tok_utf8_len((uint8_t)st->held.s[0]);
                tok_str_append(o, st->held.s, (size_t)hl);
                memmove(st->held.s, st->held.s + hl, st->held.len - (size_t)hl);
                st->held.len -= (size_t)hl;
                st->n_held--;
            }
            tok_str_append(&st->held, cs, (size_t)l);
            st->n_held++;
            continue;
        }
        if (st->n_held) {
            tok_str_append(o, st->held.s, st->held.len);
            st->held.len = 0, st->n_held = 0;
        }
        tok_str_append(o, cs, (size_t)l);
    }
    if (flags & CH_END) st->held.len = 0, st->n_held = 0; /* trailing chars stripped */
    if (o->len || flags) emit(d, k + 1, o->s, o->len, (new_out ? CH_NEW : 0) | (flags & CH_END));
}

static void metaspace_chunk(lm_detok *d, int k, const char *s, size_t n, int flags) {
    const tok_decoder *dec = d->stage[k];
    dec_state *st = &d->st[k];
    if (flags & CH_NEW) st->index++;
    bool first = st->index == 1 && !dec->prepend_never;
    lm_tok_str *o = &st->scratch;
    o->len = 0;
    tok_str_reserve(o, n);
    for (size_t j = 0; j < n;) {
        int l;
        uint32_t c = tok_utf8_cp(s + j, n - j, &l);
        if (c == dec->strip_char) {
            if (!first) tok_str_append(o, " ", 1);
        } else tok_str_append(o, s + j, (size_t)l);
        j += (size_t)l;
    }
    emit(d, k + 1, o->s, o->len, flags);
}

/* A buffered token is complete: process it. The buffer is moved out first
 * because processing may emit into stages that come back here only via
 * their own state, never this buffer. */
static void flush_token(lm_detok *d, int k) {
    dec_state *st = &d->st[k];
    lm_tok_str b = st->buf;
    st->buf = (lm_tok_str){ 0 };
    st->in_token = false;
    tok_str_reserve(&b, 0);
    whole_token(d, k, b.s, b.len);
    b.len = 0;
    lm_tok_str_free(&st->buf);
    st->buf = b;
}

/* Feeds a chunk to stage k (k == n: the sink). */
static void emit(lm_detok *d, int k, const char *s, size_t n, int flags) {
    if (k == d->n) {
        if (!d->t->decoder && (flags & CH_NEW) && d->n_tokens++ > 0)
            tok_utf8_stream_feed(&d->sink, " ", 1, d->out);
        tok_utf8_stream_feed(&d->sink, s, n, d->out);
        return;
    }
    const tok_decoder *dec = d->stage[k];
    dec_state *st = &d->st[k];
    switch (dec->kind) {
    case TOK_DEC_FUSE:
        if (n || !st->started) emit(d, k + 1, s, n, st->started ? 0 : CH_NEW);
        st->started = true;
        return;
    case TOK_DEC_STRIP: strip_chunk(d, k, s, n, flags); return;
    case TOK_DEC_METASPACE: metaspace_chunk(d, k, s, n, flags); return;
    default: break;
    }
    /* whole-token stages */
    if ((flags & CH_NEW) && st->in_token) flush_token(d, k); /* the previous token ended unannounced */
    if ((flags & CH_NEW) && (flags & CH_END)) {
        whole_token(d, k, s, n);
        return;
    }
    if (flags & CH_NEW) st->buf.len = 0;
    tok_str_append(&st->buf, s, n);
    st->in_token = true;
    if (flags & CH_END) flush_token(d, k);
}

/* End of input at stage k: flush what it holds, then the stages after it. */
static void finish(lm_detok *d, int k) {
    if (k == d->n) {
        tok_utf8_stream_end(&d->sink, d->out);
        d->n_tokens = 0;
        return;
    }
    const tok_decoder *dec = d->stage[k];
    dec_state *st = &d->st[k];
    if (st->in_token) flush_token(d, k);
    switch (dec->kind) {
    case TOK_DEC_BYTEFALLBACK: bf_flush(d, k); break;
    case TOK_DEC_BYTELEVEL: {
        lm_tok_str *o = &st->scratch;
        o->len = 0;
        tok_str_reserve(o, 4);
        tok_utf8_stream_end(&st->u, o);
        if (o->len || !st->started) emit(d, k + 1, o->s, o->len, st->started ? 0 : CH_NEW);
        emit(d, k + 1, "", 0, CH_END);
        break;
    }
    case TOK_DEC_FUSE:
        if (st->started) emit(d, k + 1, "", 0, CH_END);
        break;
    case TOK_DEC_STRIP:
        st->held.len = 0, st->n_held = 0;
        break;
    case TOK_DEC_BPE:
        if (st->has_prev) {
            tok_pattern p = { TOK_PAT_STRING, dec->content, dec->content_len, NULL };
            lm_tok_str o = { 0 };
            replace_all(&p, "", 0, st->held.s, st->held.len, &o);
            emit(d, k + 1, o.s, o.len, CH_NEW | CH_END);
            lm_tok_str_free(&o);
        }
        break;
    default: break;
    }
    /* reset for reuse, keeping the buffers */
    lm_tok_str buf = st->buf, group = st->group, held = st->held, sc = st->scratch, sc2 = st->scratch2;
    buf.len = group.len = held.len = sc.len = sc2.len = 0;
    *st = (dec_state){ .buf = buf, .group = group, .held = held, .scratch = sc, .scratch2 = sc2 };
    finish(d, k + 1);
}

static const char *token_str(const lm_tokenizer *t, int32_t id, size_t *n) {
    return lm_tokenizer_id_to_token(t, id, n);
}

/* Whether the decoder chain has a stage of kind k. */
static bool has_stage(const tok_decoder *d, tok_dec_kind k) {
    if (!d) return false;
    if (d->kind == k) return true;
    for (int i = 0; d->kind == TOK_DEC_SEQUENCE && i < d->n_sub; i++)
        if (has_stage(&d->sub[i], k)) return true;
    return false;
}

bool lm_tokenizer_token_bytes(const lm_tokenizer *t, int32_t id, lm_tok_str *out) {
    size_t n;
    const char *s = token_str(t, id, &n);
    out->len = 0;
    tok_str_reserve(out, n + 1);
    if (!s) return false;
    bool added = id >= 0 && id < t->n_ids && t->added_of_id[id] >= 0;
    uint8_t byte;
    if (!added && has_stage(t->decoder, TOK_DEC_BYTELEVEL)) {
        for (size_t i = 0; i < n;) {
            int k;
            uint32_t cp = tok_utf8_cp(s + i, n - i, &k);
            int b = tok_cp_to_byte(cp);
            if (b < 0) { /* not a mapped character: keep it as it is */
                memcpy(out->s + out->len, s + i, (size_t)k);
                out->len += (size_t)k;
            } else {
                out->s[out->len++] = (char)b;
            }
            i += (size_t)k;
        }
    } else if (!added && has_stage(t->decoder, TOK_DEC_BYTEFALLBACK) && is_byte_token(s, n, &byte)) {
        out->s[out->len++] = (char)byte;
    } else if (!added && has_stage(t->decoder, TOK_DEC_METASPACE)) {
        for (size_t i = 0; i < n; i++) {
            if (n - i >= 3 && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                out->s[out->len++] = ' ';
                i += 2;
            } else {
                out->s[out->len++] = s[i];
            }
        }
    } else {
        memcpy(out->s, s, n);
        out->len = n;
    }
    out->s[out->len] = 0;
    return true;
}

void lm_detok_push(lm_detok *d, int32_t id, lm_tok_str *out) {
    size_t n;
    const char *s = token_str(d->t, id, &n);
    tok_str_reserve(out, 0);
    if (!s) return;
    if (d->skip_special && lm_tokenizer_is_special(d->t, id)) return;
    d->out = out;
    emit(d, 0, s, n, CH_NEW | CH_END);
    d->out = NULL;
}

void lm_detok_finish(lm_detok *d, lm_tok_str *out) {
    tok_str_reserve(out, 0);
    d->out = out;
    finish(d, 0);
    d->out = NULL;
}

int lm_tokenizer_decode(const lm_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                        lm_tok_str *out) {
    out->len = 0;
    tok_str_reserve(out, 0);
    out->s[0] = 0;
    lm_detok *d = lm_detok_create(t, skip_special);
    for (size_t i = 0; i < n; i++) lm_detok_push(d, ids[i], out);
    lm_detok_finish(d, out);
    lm_detok_free(d);
    return 0;
}

void tok_decoder_free(tok_decoder *d) {
    if (!d) return;
    for (int i = 0; i < d->n_sub; i++) tok_decoder_free(&d->sub[i]);
    free(d->sub);
    free(d->content);
    tok_pattern_free(&d->pat);
}
