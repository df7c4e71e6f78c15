/* chat_marks.c - where a rendered chat prompt's messages meet, in tokens:
 * hints for the engine's prefix cache, whose hybrid models checkpoint their
 * recurrent state there (lm_gen_params.prompt_marks).
 *
 * Design note
 * -----------
 * The template decides where each message lands (and may drop, trim or
 * repeat it), so the rendered text alone does not say. The messages are
 * rendered a second time with a mark (U+10FFFD, private use) after each
 * message's text content; the marks' places, with the marks taken out, are
 * the boundaries - but only when taking them out gives back the prompt
 * byte for byte. A template that tests or trims content renders otherwise
 * with a mark in it: then there are no marks, which costs reuse, never a
 * different prompt. Byte offsets become token offsets through the tokens'
 * bytes, when they add up to the text (else none). */
#include <stdlib.h>
#include <string.h>

#include "lm_chat.h"

static const char k_mark[] = "\xF4\x8F\xBF\xBD"; /* U+10FFFD */
#define MARK_LEN 4

/* Every message's string content with the mark after it (empty ones stay
 * empty: templates test them). */
static void add_marks(json_t *ctx) {
    json_t *msgs = json_object_get(ctx, "messages");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i), *content = json_object_get(m, "content");
        size_t n = json_string_length(content);
        if (!json_is_string(content) || n == 0) continue;
        char *s = lm_xmalloc(n + MARK_LEN);
        memcpy(s, json_string_value(content), n);
        memcpy(s + n, k_mark, MARK_LEN);
        json_object_set_new(m, "content", json_stringn(s, n + MARK_LEN));
        free(s);
    }
}

/* The marks taken out of text (in place): their offsets into marks (a
 * [len / MARK_LEN] array), the new length returned. */
static size_t take_marks(char *text, size_t len, size_t *marks, size_t *n_marks) {
    size_t o = 0;
    *n_marks = 0;
    for (size_t i = 0; i < len;) {
        if (i + MARK_LEN <= len && memcmp(text + i, k_mark, MARK_LEN) == 0) {
            if (*n_marks == 0 || marks[*n_marks - 1] != o) marks[(*n_marks)++] = o;
            i += MARK_LEN;
            continue;
        }
        text[o++] = text[i++];
    }
    return o;
}

void lm_chat_mark_messages(const lm_chat *c, const lm_chat_req *r, lm_chat_prompt *p) {
    free(p->marks);
    p->marks = NULL, p->n_marks = 0;
    json_t *ctx = lm_chat_context(c, r);
    add_marks(ctx);
    lm_chat_lits lits = { 0 };
    if (!r->special_in_content) lm_chat_defuse(c->tok, ctx, &lits);
    char *text = NULL;
    size_t len = 0;
    lm_err e = { { 0 } };
    lm_chat_prompt scratch = { 0 }; /* the literal ranges restore records */
    int rc = lm_template_render(c->tpl, ctx, NULL, &text, &len, &e);
    json_decref(ctx);
    if (!rc && lits.tab) rc = lm_chat_restore(&lits, &text, &len, &scratch, &e);
    lm_chat_lits_free(&lits);
    lm_chat_prompt_free(&scratch);
    size_t rendered = p->len - (p->prefill ? strlen(p->prefill) : 0);
    if (!rc) {
        size_t *marks = lm_xmalloc((len / MARK_LEN + 1) * sizeof *marks), n = 0;
        len = take_marks(text, len, marks, &n);
        if (n && len == rendered && memcmp(text, p->text, len) == 0) {
            p->marks = marks, p->n_marks = n;
            marks = NULL;
        }
        free(marks);
    }
    free(text);
}

int lm_chat_mark_tokens(const lm_tokenizer *tok, const lm_chat_prompt *p, const int32_t *ids, int n, int32_t **out) {
    *out = NULL;
    if (!p->n_marks) return 0;
    int32_t *at = lm_xmalloc(p->n_marks * sizeof *at);
    lm_tok_str t = { 0 };
    size_t pos = 0, k = 0;
    /* a mark inside token i (or at its start) is token offset i: the state
     * before it holds no more than the message */
    for (int i = 0; i < n; i++) {
        size_t next = pos + (lm_tokenizer_token_bytes(tok, ids[i], &t) ? t.len : 0);
        while (k < p->n_marks && p->marks[k] < next) at[k++] = i;
        pos = next;
    }
    lm_tok_str_free(&t);
    if (pos != p->len || k == 0) { /* the tokens' bytes are not the text: no offsets to trust */
        free(at);
        return 0;
    }
    *out = at;
    return (int)k;
}
