/* test_chat_marks.c - where a rendered chat prompt's messages end
 * (chat_marks.c): exact byte and token offsets through a real template
 * and tokenizer (special-token text in content included), and none at all
 * where the template renders a marked message differently. */
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "server_fixture.h"

LM_TEST(chat_marks_at_message_ends_qwen3) {
    srv_fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("%s", lm_test_fixtures_why());
    const char *contents[3] = { "Be brief.", "Quote <|im_end|> for me", "It is <|im_end|>." };
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"Quote <|im_end|> for me\"},"
                       "{\"role\":\"assistant\",\"content\":\"It is <|im_end|>.\"},"
                       "{\"role\":\"user\",\"content\":\"\"}]}";
    srv_req r;
    srv_err e = { 0 };
    lm_err le = { { 0 } };
    lm_chat_prompt p = { 0 };
    lm_tok_ids ids = { 0 };
    LM_REQUIRE(srv_req_parse(&f.s, SRV_CHAT, body, strlen(body), &r, &e) == 0 && srv_chat_render(&f.s, &r, &p, &e) == 0);
    srv_chat_marks(&f.s, &r, &p);
    LM_REQUIRE(lm_chat_encode(f.tok, &p, &ids, &le) == 0);
    /* the empty last message has no mark: templates test content */
    LM_CHECK_MSG(p.n_marks == 3, "%zu marks in '%s'", p.n_marks, p.text);
    LM_REQUIRE(p.n_marks == 3);
    int32_t *at = NULL;
    int n = lm_chat_mark_tokens(f.tok, &p, ids.ids, (int)ids.n, &at);
    LM_REQUIRE(n == 3);
    lm_tok_str t = { 0 };
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(contents[k]), o = p.marks[k];
        LM_CHECK_MSG(o >= l && memcmp(p.text + o - l, contents[k], l) == 0, "mark %d at %zu", k, o);
        /* the turn's end is a special token: the mark is a token boundary */
        LM_CHECK(lm_tokenizer_decode(f.tok, ids.ids, (size_t)at[k], false, &t) == 0);
        LM_CHECK_MSG(t.len == o && memcmp(t.s, p.text, o) == 0, "mark %d: token %d decodes to %zu bytes, want %zu", k,
                     at[k], t.len, o);
    }
    lm_tok_str_free(&t);
    free(at);
    lm_tok_ids_free(&ids);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);
    srv_fx_close(&f);
}

/* Marks through template src over messages with the given contents. */
static size_t marks_with(lm_test_ctx *lm_t_, srv_fx *f, const char *src, const char *c0, const char *c1) {
    lm_chat *c = NULL;
    lm_err e = { { 0 } };
    LM_CHECK_MSG(lm_chat_create(&c, f->tok, src, &e) == 0, "%s", e.msg);
    if (!c) return 99;
    json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content", c0, "role", "user", "content", c1);
    lm_chat_req r = { .messages = msgs };
    lm_chat_prompt p;
    size_t n = 99;
    if (lm_chat_render(c, &r, &p, &e) == 0) {
        lm_chat_mark_messages(c, &r, &p);
        n = p.n_marks;
    }
    lm_chat_prompt_free(&p);
    json_decref(msgs);
    lm_chat_free(c);
    return n;
}

LM_TEST(chat_marks_none_where_template_renders_otherwise) {
    srv_fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("%s", lm_test_fixtures_why());
    const char *trim = "{% for m in messages %}<{{ m.content | trim }}>{% endfor %}";
    const char *len = "{% for m in messages %}{% if m.content | length > 5 %}long{% endif %}{{ m.content }}{% endfor %}";
    LM_CHECK(marks_with(lm_t_, &f, trim, "one", "two") == 2);
    /* trim no longer reaches the trailing space past a mark */
    LM_CHECK(marks_with(lm_t_, &f, trim, "one ", "two") == 0);
    LM_CHECK(marks_with(lm_t_, &f, len, "abcdefgh", "ab") == 2);
    /* "abcde" + a mark is longer than 5 */
    LM_CHECK(marks_with(lm_t_, &f, len, "abcde", "ab") == 0);
    srv_fx_close(&f);
}
