/* parse_util.c - byte buffer, tag search, UTF-8 and JSON-string helpers for
 * the streaming parsers. */
#include "chat/parse_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- byte buffer ---------------------------------------------------------- */

static void pbuf_reserve(lm_pbuf *b, size_t extra) {
    LM_ASSERT(extra < SIZE_MAX / 4 && b->n < SIZE_MAX / 4);
    size_t need = b->n + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    b->p = lm_xrealloc(b->p, cap);
    b->cap = cap;
}

void lm_pbuf_put(lm_pbuf *b, const void *s, size_t n) {
    pbuf_reserve(b, n);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void lm_pbuf_putc(lm_pbuf *b, char c) {
    pbuf_reserve(b, 1);
    b->p[b->n++] = c;
    b->p[b->n] = 0;
}

void lm_pbuf_puts(lm_pbuf *b, const char *s) { lm_pbuf_put(b, s, strlen(s)); }

void lm_pbuf_clear(lm_pbuf *b) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

void lm_pbuf_drop(lm_pbuf *b, size_t n) {
    LM_ASSERT(n <= b->n);
    if (!n) return;
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    b->p[b->n] = 0;
}

const char *lm_pbuf_str(const lm_pbuf *b) { return b->p ? b->p : ""; }

void lm_pbuf_free(lm_pbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- text helpers ------------------------------------------------------------ */

size_t lm_parse_find(const char *s, size_t n, const char *pat, size_t m) {
    LM_ASSERT(m > 0);
    if (n < m) return LM_PARSE_NPOS;
    const char *end = s + (n - m) + 1; /* last possible start + 1 */
    const char *q = s;
    while (q < end) {
        q = memchr(q, (unsigned char)pat[0], (size_t)(end - q));
        if (!q) return LM_PARSE_NPOS;
        if (memcmp(q, pat, m) == 0) return (size_t)(q - s);
        q++;
    }
    return LM_PARSE_NPOS;
}

size_t lm_parse_partial(const char *s, size_t n, const char *pat, size_t m) {
    size_t k = LM_MIN(n, m ? m - 1 : 0);
    for (; k > 0; k--)
        if (memcmp(s + n - k, pat, k) == 0) return k;
    return 0;
}

size_t lm_parse_utf8_tail(const char *s, size_t n) {
    /* Walk back over continuation bytes to the lead byte (at most 3 back). */
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

bool lm_parse_is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void lm_parse_json_escape(lm_pbuf *b, const char *s, size_t n) {
    size_t from = 0; /* start of the run copied verbatim */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char hex[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (c < 0x20) {
                snprintf(hex, sizeof hex, "\\u%04X", c);
                esc = hex;
            }
        }
        if (!esc) continue;
        lm_pbuf_put(b, s + from, i - from);
        lm_pbuf_puts(b, esc);
        from = i + 1;
    }
    lm_pbuf_put(b, s + from, n - from);
}
