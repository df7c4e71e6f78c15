/* chat_literal.c - text a user wrote stays text: no control tokens from
 * message content.
 *
 * Design note
 * -----------
 * A chat template pastes message content next to its own markup, and the
 * whole prompt is then tokenized with special tokens on (the markup needs
 * them). Content that says "<|im_end|><|im_start|>system" would so close
 * its turn and forge a system turn. The safe rendering tokenizes content
 * with specials off and the markup with them on; but the template decides
 * where content lands (and may trim, split or repeat it), so the rendered
 * text alone does not say which bytes came from whom.
 *
 * So before rendering, every special token's text inside the request's
 * strings (messages and tools, keys included) is swapped for a marker: one
 * private-use character U+F0000 + k, k indexing a table of the texts taken
 * out (characters of that plane already in the strings are swapped too, so
 * a marker is never forged). The template sees the markers as ordinary
 * characters. After rendering, each marker is put back and its range
 * recorded as literal; lm_tokenizer_encode_lit then matches no special token
 * there. A prompt without special-token text in its strings renders and
 * tokenizes byte for byte as before. */
#include <stdlib.h>
#include <string.h>

#include "lm_chat.h"

#define LIT_BASE 0xF0000u /* plane 15, private use */
#define LIT_MAX 0xFFFEu   /* markers U+F0000 .. U+FFFFD */

/* What was taken out of the strings, in marker order. */
typedef struct lit_tab {
    char **text;
    size_t *len;
    size_t n, cap;
    bool full;                   /* more than LIT_MAX: the request is refused */
} lit_tab;

/* Appends n bytes to o, keeping it NUL-terminated. */
static void app(lm_tok_str *o, const char *s, size_t n) {
    if (o->len + n + 1 > o->cap) {
        o->cap = LM_MAX(o->cap * 2, o->len + n + 1);
        o->s = lm_xrealloc(o->s, o->cap);
    }
    if (n) memcpy(o->s + o->len, s, n);
    o->len += n;
    o->s[o->len] = 0;
}

/* U+F0000 .. U+FFFFF: F3 B0..BF 80..BF 80..BF. */
static bool plane15_at(const char *s, size_t n, size_t i) {
    return i + 4 <= n && (uint8_t)s[i] == 0xF3 && (uint8_t)s[i + 1] >= 0xB0 && (uint8_t)s[i + 1] <= 0xBF;
}

static void put_marker(lm_tok_str *o, lit_tab *t, const char *s, size_t n) {
    if (t->n >= LIT_MAX) {
        t->full = true;
        return;
    }
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 8;
        t->text = lm_xrealloc(t->text, t->cap * sizeof *t->text);
        t->len = lm_xrealloc(t->len, t->cap * sizeof *t->len);
    }
    t->text[t->n] = lm_xmalloc(n + 1);
    memcpy(t->text[t->n], s, n);
    t->text[t->n][n] = 0;
    t->len[t->n] = n;
    uint32_t cp = LIT_BASE + (uint32_t)t->n++;
    char u[4] = { (char)(0xF0 | (cp >> 18)), (char)(0x80 | ((cp >> 12) & 0x3F)), (char)(0x80 | ((cp >> 6) & 0x3F)),
                  (char)(0x80 | (cp & 0x3F)) };
    app(o, u, 4);
}

/* The tags a model writes in its own answers, which clients send back in
 * assistant content and templates parse (split on '</think>', ...): markup,
 * never turn boundaries, so they stay as they are even where the tokenizer
 * marks them special. */
static bool answer_tag(const char *s, size_t n) {
    static const char *const k_tags[] = { "<think>", "</think>", "<tool_call>", "</tool_call>" };
    for (size_t i = 0; i < LM_COUNT(k_tags); i++)
        if (n == strlen(k_tags[i]) && !memcmp(s, k_tags[i], n)) return true;
    return false;
}

/* s with special-token texts (and plane-15 characters) swapped for markers;
 * NULL when there is nothing to swap. */
static char *defuse_str(const lm_tokenizer *tok, lit_tab *t, const char *s, size_t n, size_t *out_len) {
    lm_tok_str o = { 0 };
    size_t done = 0;
    for (size_t i = 0; i < n;) {
        size_t k = plane15_at(s, n, i) ? 4 : lm_tokenizer_special_at(tok, s, n, i);
        if (k && !plane15_at(s, n, i) && answer_tag(s + i, k)) k = 0;
        if (!k) {
            i++;
            continue;
        }
        app(&o, s + done, i - done);
        put_marker(&o, t, s + i, k);
        i += k;
        done = i;
    }
    if (!done) {
        free(o.s);
        return NULL;
    }
    app(&o, s + done, n - done);
    *out_len = o.len;
    return o.s ? o.s : lm_xstrdup("");
}

/* A deep copy of v with every string and key defused (new reference). */
static json_t *defuse(const lm_tokenizer *tok, lit_tab *t, const json_t *v) {
    size_t n;
    if (json_is_string(v)) {
        char *d = defuse_str(tok, t, json_string_value(v), json_string_length(v), &n);
        if (!d) return json_deep_copy(v);
        json_t *r = json_stringn_nocheck(d, n);
        free(d);
        return r;
    }
    if (json_is_array(v)) {
        json_t *a = json_array();
        for (size_t i = 0; i < json_array_size(v); i++) json_array_append_new(a, defuse(tok, t, json_array_get(v, i)));
        return a;
    }
    if (json_is_object(v)) {
        json_t *o = json_object();
        const char *k;
        size_t kn;
        json_t *x;
        json_object_keylen_foreach((json_t *)v, k, kn, x) {
            char *dk = defuse_str(tok, t, k, kn, &n);
            json_object_setn_new_nocheck(o, dk ? dk : k, dk ? n : kn, defuse(tok, t, x));
            free(dk);
        }
        return o;
    }
    return json_deep_copy(v);
}

void lm_chat_defuse(const lm_tokenizer *tok, json_t *ctx, lm_chat_lits *lits) {
    lit_tab *t = lm_xcalloc(1, sizeof *t);
    static const char *const k_keys[] = { "messages", "tools" };
    for (size_t i = 0; i < LM_COUNT(k_keys); i++) {
        json_t *v = json_object_get(ctx, k_keys[i]);
        if (v) json_object_set_new(ctx, k_keys[i], defuse(tok, t, v));
    }
    lits->tab = t;
}

int lm_chat_restore(lm_chat_lits *lits, char **text, size_t *len, lm_chat_prompt *p, lm_err *e) {
    lit_tab *t = lits->tab;
    if (t->full) return lm_errf(e, "the messages hold more than %u special-token texts", LIT_MAX);
    if (!t->n) return 0;
    const char *s = *text;
    size_t n = *len;
    lm_tok_str o = { 0 };
    size_t done = 0;
    for (size_t i = 0; i < n;) {
        if (!plane15_at(s, n, i)) {
            i++;
            continue;
        }
        uint32_t cp = ((uint32_t)(s[i] & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
                      ((uint32_t)(s[i + 2] & 0x3F) << 6) | (uint32_t)(s[i + 3] & 0x3F);
        size_t k = cp - LIT_BASE;
        if (cp < LIT_BASE || k >= t->n) { /* the template's own: kept as it is */
            i += 4;
            continue;
        }
        app(&o, s + done, i - done);
        lm_chat_prompt_add_literal(p, o.len, o.len + t->len[k]);
        app(&o, t->text[k], t->len[k]);
        i += 4;
        done = i;
    }
    app(&o, s + done, n - done);
    free(*text);
    *text = o.s;
    *len = o.len;
    return 0;
}

void lm_chat_lits_free(lm_chat_lits *lits) {
    lit_tab *t = lits->tab;
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) free(t->text[i]);
    free(t->text);
    free(t->len);
    free(t);
    lits->tab = NULL;
}

void lm_chat_prompt_add_literal(lm_chat_prompt *p, size_t start, size_t end) {
    if (end <= start) return;
    if (p->n_lit && p->lit[p->n_lit - 1].end == start) { /* adjacent: one range */
        p->lit[p->n_lit - 1].end = end;
        return;
    }
    if (p->n_lit == p->cap_lit) {
        p->cap_lit = p->cap_lit ? p->cap_lit * 2 : 8;
        p->lit = lm_xrealloc(p->lit, p->cap_lit * sizeof *p->lit);
    }
    p->lit[p->n_lit++] = (lm_tok_span){ start, end };
}

int lm_chat_encode(lm_tokenizer *tok, const lm_chat_prompt *p, lm_tok_ids *out, lm_err *e) {
    return lm_tokenizer_encode_lit(tok, p->text, p->len, false, p->lit, p->n_lit, out, e);
}
