/* reasoning.c - splits generated text into reasoning_content (inside
 * <think> ... </think>) and content, incrementally.
 *
 * Two states, CONTENT and REASONING; in each the parser looks for the one tag
 * that leaves it. Text before a tag goes through a small filter that removes
 * the tag-framing newlines described in lm_parse.h:
 *   - r_start: at the start of a reasoning block, '\n' is dropped (and an
 *     open tag is dropped too, see the header);
 *   - r_nl: a trailing run of '\n' in reasoning is counted, not emitted, until
 *     more reasoning text follows (then emitted) or the block ends (dropped);
 *   - c_strip: after a close tag, leading '\n' of the content is dropped.
 * An optional implicit end tag (Qwen3.5's "<tool_call>") also ends a block
 * but stays in the text, as the start of the content.
 * The filters act on text already known not to be a tag, so they see the same
 * byte stream whatever the chunking; only the timing of output changes. */
#include "chat/lm_parse.h"
#include "chat/parse_internal.h"

#include <stdlib.h>
#include <string.h>

struct lm_reasoning_parser {
    char *open, *close, *iend; /* iend: implicit end, or NULL */
    size_t open_len, close_len, iend_len;
    bool in_reasoning;
    bool r_start;   /* nothing but framing seen in this reasoning block yet */
    size_t r_nl;    /* trailing '\n' of the reasoning block, held back */
    bool c_strip;   /* content right after a close tag: drop leading '\n' */
    lm_pbuf held;   /* input not decided yet */
    lm_pbuf out_r, out_c;
};

lm_reasoning_parser *lm_reasoning_parser_create(const lm_reasoning_opts *opts, lm_err *err) {
    lm_reasoning_opts o = opts ? *opts : (lm_reasoning_opts){ 0 };
    const char *open = o.open_tag ? o.open_tag : "<think>";
    const char *close = o.close_tag ? o.close_tag : "</think>";
    if (!open[0] || !close[0]) {
        lm_errf(err, "reasoning tags must not be empty");
        return NULL;
    }
    lm_reasoning_parser *p = lm_xcalloc(1, sizeof *p);
    p->open = lm_xstrdup(open);
    p->close = lm_xstrdup(close);
    p->open_len = strlen(open);
    p->close_len = strlen(close);
    if (o.implicit_end_tag && o.implicit_end_tag[0]) {
        p->iend = lm_xstrdup(o.implicit_end_tag);
        p->iend_len = strlen(p->iend);
    }
    p->in_reasoning = o.start_in_reasoning;
    p->r_start = o.start_in_reasoning;
    return p;
}

/* ---- output filters ----------------------------------------------------------- */

static void emit_reasoning(lm_reasoning_parser *p, const char *s, size_t n) {
    if (p->r_start) {
        while (n && *s == '\n') s++, n--;
        if (!n) return;
    }
    size_t body = n;
    while (body && s[body - 1] == '\n') body--;
    if (body) {
        for (; p->r_nl; p->r_nl--) lm_pbuf_putc(&p->out_r, '\n');
        lm_pbuf_put(&p->out_r, s, body);
        p->r_start = false;
    }
    p->r_nl += n - body;
}

static void emit_content(lm_reasoning_parser *p, const char *s, size_t n) {
    if (p->c_strip) {
        while (n && *s == '\n') s++, n--;
        if (!n) return;
        p->c_strip = false;
    }
    lm_pbuf_put(&p->out_c, s, n);
}

/* ---- the scanner --------------------------------------------------------------- */

/* Consumes as much of `held` as can be decided; at_end decides everything. */
static void run(lm_reasoning_parser *p, bool at_end) {
    size_t i = 0; /* consumed */
    for (;;) {
        const char *s = p->held.p + i;
        size_t n = p->held.n - i;
        if (!p->in_reasoning) {
            size_t at = n ? lm_parse_find(s, n, p->open, p->open_len) : LM_PARSE_NPOS;
            if (at != LM_PARSE_NPOS) {
                emit_content(p, s, at);
                i += at + p->open_len;
                p->in_reasoning = true;
                p->r_start = true;
                p->r_nl = 0;
                continue;
            }
            size_t emit = n;
            if (!at_end) {
                emit -= lm_parse_partial(s, n, p->open, p->open_len);
                emit -= lm_parse_utf8_tail(s, emit);
            }
            emit_content(p, s, emit);
            i += emit;
            break;
        }
        if (p->r_start) {
            /* framing: newlines, and an open tag repeated by the model */
            size_t k = 0;
            while (k < n && s[k] == '\n') k++;
            i += k, s += k, n -= k;
            if (n >= p->open_len && memcmp(s, p->open, p->open_len) == 0) {
                i += p->open_len;
                continue;
            }
            if (n < p->open_len && !at_end && memcmp(s, p->open, n) == 0) break; /* undecided */
        }
        /* the close tag, or the implicit end (kept as content), whichever
         * starts first; a complete match waits while a partial match of the
         * other tag starts before it */
        size_t at = n ? lm_parse_find(s, n, p->close, p->close_len) : LM_PARSE_NPOS;
        size_t hold = at_end ? 0 : lm_parse_partial(s, n, p->close, p->close_len);
        bool implicit = false;
        if (p->iend) {
            size_t ai = n ? lm_parse_find(s, n, p->iend, p->iend_len) : LM_PARSE_NPOS;
            size_t hi = at_end ? 0 : lm_parse_partial(s, n, p->iend, p->iend_len);
            if (ai != LM_PARSE_NPOS && (at == LM_PARSE_NPOS || ai < at)) {
                at = ai;
                implicit = true;
                if (hold && n - hold < ai) at = LM_PARSE_NPOS;
            } else if (at != LM_PARSE_NPOS && hi && n - hi < at) {
                at = LM_PARSE_NPOS;
            }
            hold = LM_MAX(hold, hi);
        }
        if (at != LM_PARSE_NPOS) {
            emit_reasoning(p, s, at);
            i += at + (implicit ? 0 : p->close_len);
            p->in_reasoning = false;
            p->r_start = false;
            p->r_nl = 0;          /* newlines before the end are framing */
            p->c_strip = !implicit; /* after an implicit end the content starts with the tag */
            continue;
        }
        size_t emit = n - hold;
        if (!at_end) emit -= lm_parse_utf8_tail(s, emit);
        emit_reasoning(p, s, emit);
        i += emit;
        break;
    }
    lm_pbuf_drop(&p->held, i);
}

static void result(lm_reasoning_parser *p, lm_reasoning_delta *out) {
    out->reasoning = lm_pbuf_str(&p->out_r);
    out->reasoning_len = p->out_r.n;
    out->content = lm_pbuf_str(&p->out_c);
    out->content_len = p->out_c.n;
}

void lm_reasoning_parser_feed(lm_reasoning_parser *p, const char *text, size_t n,
                              lm_reasoning_delta *out) {
    lm_pbuf_clear(&p->out_r);
    lm_pbuf_clear(&p->out_c);
    lm_pbuf_put(&p->held, text, n);
    run(p, false);
    result(p, out);
}

void lm_reasoning_parser_finish(lm_reasoning_parser *p, lm_reasoning_delta *out) {
    lm_pbuf_clear(&p->out_r);
    lm_pbuf_clear(&p->out_c);
    run(p, true);
    LM_ASSERT(p->held.n == 0);
    p->r_nl = 0; /* a block cut off by the end of generation: its trailing '\n' are framing too */
    result(p, out);
}

bool lm_reasoning_parser_in_reasoning(const lm_reasoning_parser *p) { return p->in_reasoning; }

void lm_reasoning_parser_free(lm_reasoning_parser *p) {
    if (!p) return;
    free(p->open);
    free(p->close);
    free(p->iend);
    lm_pbuf_free(&p->held);
    lm_pbuf_free(&p->out_r);
    lm_pbuf_free(&p->out_c);
    free(p);
}

/* ---- prompts --------------------------------------------------------------- */

static bool prompt_all_space(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\n' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

/* Last occurrence of pat in s[0..n), or -1. */
static long prompt_last_of(const char *s, size_t n, const char *pat) {
    size_t m = strlen(pat);
    if (m > n) return -1;
    for (size_t i = n - m + 1; i-- > 0;)
        if (!memcmp(s + i, pat, m)) return (long)i;
    return -1;
}

bool lm_reasoning_prompt_open(const char *text, size_t len, const char *open, const char *close) {
    long o = prompt_last_of(text, len, open);
    if (o < 0) return false;
    long c = prompt_last_of(text, len, close);
    if (c > o) return false;
    size_t after = (size_t)o + strlen(open);
    return prompt_all_space(text + after, len - after);
}
