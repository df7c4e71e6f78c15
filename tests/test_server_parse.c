/* test_server_parse.c - stop strings and reasoning blocks (src/chat).
 *
 * Unit tests pin the exact hold-back (what may and may not be emitted yet),
 * then a corpus of model outputs, written after the public Qwen3 / DeepSeek-R1
 * style examples, goes through the chunking harness (whole, byte by byte,
 * every two-chunk split, random chunkings). Tool calls are in
 * test_server_parse_toolcall.c. */
#include "test_server_parse.h"

#include "chat/lm_parse.h"

#include <stdlib.h>
#include <string.h>

/* ---- stop strings: unit tests ------------------------------------------------- */

static lm_stop_matcher *stops2(const char *a, const char *b) {
    const char *s[] = { a, b };
    return lm_stop_matcher_create(s, NULL, b ? 2 : 1);
}

#define FEED_STOP(m, str, r) lm_stop_matcher_feed((m), (str), strlen(str), (r))
#define OUT_IS(r, str) ((r).len == strlen(str) && memcmp((r).text, (str), (r).len) == 0)

LM_TEST(parse_stop_holds_only_a_possible_prefix) {
    lm_stop_matcher *m = stops2("world", NULL);
    lm_stop_result r;
    FEED_STOP(m, "Hello wor", &r);
    LM_CHECK(OUT_IS(r, "Hello ") && !r.stopped);
    FEED_STOP(m, "k, wo", &r); /* "work" is not "world": released */
    LM_CHECK(OUT_IS(r, "work, ") && !r.stopped);
    FEED_STOP(m, "", &r);
    LM_CHECK(OUT_IS(r, "") && !r.stopped);
    FEED_STOP(m, "rld and more", &r);
    LM_CHECK(OUT_IS(r, "") && r.stopped && r.which == 0);
    FEED_STOP(m, "ignored", &r); /* after a stop nothing more comes out */
    LM_CHECK(OUT_IS(r, "") && r.stopped);
    lm_stop_matcher_finish(m, &r);
    LM_CHECK(OUT_IS(r, "") && r.stopped);
    lm_stop_matcher_free(m);

    m = stops2("world", NULL);
    FEED_STOP(m, "Hello wor", &r);
    lm_stop_matcher_finish(m, &r); /* generation ended: the held prefix is text */
    LM_CHECK(OUT_IS(r, "wor") && !r.stopped && r.which == -1);
    lm_stop_matcher_free(m);
}

LM_TEST(parse_stop_earliest_end_wins) {
    lm_stop_result r;
    /* "bc" is complete before "abcd" could be: a server checking after every
     * token stops there, whatever the chunking */
    lm_stop_matcher *m = stops2("abcd", "bc");
    FEED_STOP(m, "xxabcd", &r);
    LM_CHECK(OUT_IS(r, "xxa") && r.stopped && r.which == 1);
    lm_stop_matcher_free(m);
    m = stops2("abcd", "bc");
    FEED_STOP(m, "xxab", &r);
    LM_CHECK(OUT_IS(r, "xx"));
    FEED_STOP(m, "cd", &r);
    LM_CHECK(OUT_IS(r, "a") && r.stopped && r.which == 1);
    lm_stop_matcher_free(m);
    /* same end: the longer (earlier-starting) one cuts more */
    m = stops2("b", "ab");
    FEED_STOP(m, "xab", &r);
    LM_CHECK(OUT_IS(r, "x") && r.stopped && r.which == 1);
    lm_stop_matcher_free(m);
}

LM_TEST(parse_stop_utf8_and_bytes) {
    lm_stop_result r;
    /* an unfinished UTF-8 character is held so that every delta is valid */
    lm_stop_matcher *m = lm_stop_matcher_create(NULL, NULL, 0);
    lm_stop_matcher_feed(m, "a\xE4\xBD", 3, &r);
    LM_CHECK(OUT_IS(r, "a"));
    lm_stop_matcher_feed(m, "\xA0", 1, &r);
    LM_CHECK(OUT_IS(r, "\xE4\xBD\xA0"));
    lm_stop_matcher_free(m);
    /* a stop string made of a multi-byte character */
    m = stops2("\xE3\x80\x82", NULL); /* "。" */
    const char *t = "第一句。第二句。";
    for (size_t i = 0; i < strlen(t) && !r.stopped; i++) lm_stop_matcher_feed(m, t + i, 1, &r);
    LM_CHECK(r.stopped);
    lm_stop_matcher_free(m);
    /* any bytes, NUL included; empty strings never match */
    const char *s[] = { "", "x\0y" };
    size_t lens[] = { 0, 3 };
    m = lm_stop_matcher_create(s, lens, 2);
    lm_stop_matcher_feed(m, "ax\0", 3, &r);
    LM_CHECK(r.len == 1 && r.text[0] == 'a' && !r.stopped);
    lm_stop_matcher_feed(m, "yz", 2, &r);
    LM_CHECK(r.len == 0 && r.stopped && r.which == 1);
    lm_stop_matcher_free(m);
}

LM_TEST(parse_stop_from_json) {
    lm_err err = { { 0 } };
    json_t *j = json_loads("[\"\\nUser:\", \"<|im_end|>\", \"###\", \"STOP\", \"END\"]", 0, NULL);
    lm_stop_matcher *m = lm_stop_matcher_create_json(j, &err);
    LM_REQUIRE(m);
    lm_stop_result r;
    FEED_STOP(m, "done.\nUser", &r);
    LM_CHECK(OUT_IS(r, "done."));
    FEED_STOP(m, ": hi", &r);
    LM_CHECK(OUT_IS(r, "") && r.stopped && r.which == 0);
    lm_stop_matcher_free(m);
    json_decref(j);

    j = json_string("</s>");
    m = lm_stop_matcher_create_json(j, &err);
    LM_CHECK(m != NULL);
    lm_stop_matcher_free(m);
    json_decref(j);
    m = lm_stop_matcher_create_json(NULL, &err);
    LM_CHECK(m != NULL);
    lm_stop_matcher_free(m);

    j = json_integer(3);
    LM_CHECK(lm_stop_matcher_create_json(j, &err) == NULL && strstr(err.msg, "stop"));
    json_decref(j);
    j = json_loads("[\"a\", 1]", 0, NULL);
    LM_CHECK(lm_stop_matcher_create_json(j, &err) == NULL && strstr(err.msg, "[1]"));
    json_decref(j);
}

/* ---- reasoning: unit tests ------------------------------------------------------ */

typedef struct rsplit {
    char r[256], c[256];
} rsplit;

static void rfeed(lm_reasoning_parser *p, const char *s, rsplit *o) {
    lm_reasoning_delta d;
    lm_reasoning_parser_feed(p, s, strlen(s), &d);
    snprintf(o->r, sizeof o->r, "%s", d.reasoning);
    snprintf(o->c, sizeof o->c, "%s", d.content);
}

LM_TEST(parse_reasoning_minimal_holdback) {
    lm_reasoning_parser *p = lm_reasoning_parser_create(NULL, NULL);
    rsplit o;
    rfeed(p, "abc<thi", &o);
    LM_CHECK(strcmp(o.c, "abc") == 0 && o.r[0] == 0);
    rfeed(p, "s is not a tag <", &o); /* "<this" is not "<think>": all released but the last "<" */
    LM_CHECK(strcmp(o.c, "<this is not a tag ") == 0);
    rfeed(p, "think>\n\nStep one.\n", &o);
    LM_CHECK(o.c[0] == 0 && strcmp(o.r, "Step one.") == 0); /* newlines: framing or not, not known yet */
    LM_CHECK(lm_reasoning_parser_in_reasoning(p));
    rfeed(p, "\nStep two.\n</th", &o);
    LM_CHECK(strcmp(o.r, "\n\nStep two.") == 0);
    rfeed(p, "ink>\n\nAnswer", &o);
    LM_CHECK(o.r[0] == 0 && strcmp(o.c, "Answer") == 0);
    LM_CHECK(!lm_reasoning_parser_in_reasoning(p));
    lm_reasoning_delta d;
    lm_reasoning_parser_finish(p, &d);
    LM_CHECK(d.reasoning_len == 0 && d.content_len == 0);
    lm_reasoning_parser_free(p);
}

LM_TEST(parse_reasoning_implicit_end) {
    /* two end tags of different length: a complete match waits while the
     * other may still complete earlier */
    lm_reasoning_opts o = { .open_tag = "<t>", .close_tag = "<e>", .start_in_reasoning = true, .implicit_end_tag = "<end-of-long>" };
    lm_reasoning_parser *p = lm_reasoning_parser_create(&o, NULL);
    rsplit s;
    rfeed(p, "abc <end-of-lo", &s);
    LM_CHECK(strcmp(s.r, "abc ") == 0 && s.c[0] == 0);
    rfeed(p, "ng> after", &s);
    LM_CHECK(s.r[0] == 0 && strcmp(s.c, "<end-of-long> after") == 0);
    lm_reasoning_parser_free(p);
    /* "b>" is complete in "xab>" but "ab>c" may still start earlier */
    lm_reasoning_opts o2 = { .close_tag = "b>", .start_in_reasoning = true, .implicit_end_tag = "ab>c" };
    p = lm_reasoning_parser_create(&o2, NULL);
    rfeed(p, "xab>", &s);
    LM_CHECK(strcmp(s.r, "x") == 0 && s.c[0] == 0);
    rfeed(p, "c!", &s);
    LM_CHECK(s.r[0] == 0 && strcmp(s.c, "ab>c!") == 0);
    lm_reasoning_parser_free(p);
    p = lm_reasoning_parser_create(&o2, NULL);
    rfeed(p, "xab>", &s);
    rfeed(p, "\n\nd", &s); /* not the implicit end: the close tag and its framing go */
    LM_CHECK(strcmp(s.r, "a") == 0 && strcmp(s.c, "d") == 0);
    lm_reasoning_parser_free(p);
}

LM_TEST(parse_reasoning_options) {
    lm_err err = { { 0 } };
    lm_reasoning_opts bad = { .open_tag = "" };
    LM_CHECK(lm_reasoning_parser_create(&bad, &err) == NULL && strstr(err.msg, "empty"));

    lm_reasoning_opts o = { .start_in_reasoning = true };
    lm_reasoning_parser *p = lm_reasoning_parser_create(&o, &err);
    LM_REQUIRE(p);
    LM_CHECK(lm_reasoning_parser_in_reasoning(p));
    rsplit s;
    rfeed(p, "\n<", &s); /* could be a repeated "<think>" (dropped) or text */
    LM_CHECK(s.r[0] == 0 && s.c[0] == 0);
    rfeed(p, "b>x</b> done</think>ok", &s);
    LM_CHECK(strcmp(s.r, "<b>x</b> done") == 0 && strcmp(s.c, "ok") == 0);
    lm_reasoning_parser_free(p);
}

/* ---- the corpus ------------------------------------------------------------------ */

static const char *const STOP_USER[] = { "\nUser:", "<|im_end|>", NULL };
static const char *const STOP_THINK_END[] = { "</think>", NULL };
static const char *const STOP_OBS[] = { "<|im_end|>", "Observation:", NULL };
static const char *const STOP_CJK[] = { "\xE3\x80\x82", NULL }; /* "。" */
static const char *const STOP_OVERLAP[] = { "<thinking>", "</think>x", NULL };

static const pp_case TEXT_CASES[] = {
    {
        .name = "plain text",
        .text = "The capital of France is Paris. It has been the capital since 987 AD.",
        .think = true, .tools = true,
        .content = "The capital of France is Paris. It has been the capital since 987 AD.",
    },
    {
        .name = "plain text with angle brackets",
        .text = "Use `a < b` or <b>bold</b>; a <thinking> cap is not a tag, nor is </thinker> or <tool_calls>.\n"
                "Markdown:\n\n```html\n<div class=\"x\">&lt;</div>\n```\n",
        .think = true, .tools = true,
        .content = "Use `a < b` or <b>bold</b>; a <thinking> cap is not a tag, nor is </thinker> or <tool_calls>.\n"
                   "Markdown:\n\n```html\n<div class=\"x\">&lt;</div>\n```\n",
    },
    {
        .name = "qwen3 think then answer",
        .text = "<think>\nOkay, the user is asking for 17 * 23. 17 * 20 = 340 and 17 * 3 = 51, so 391.\n</think>\n\n"
                "17 × 23 = **391**.",
        .think = true, .tools = true,
        .reasoning = "Okay, the user is asking for 17 * 23. 17 * 20 = 340 and 17 * 3 = 51, so 391.",
        .content = "17 × 23 = **391**.",
    },
    {
        .name = "think opened in the prompt",
        .text = "The user wants the first primes.\n\nSmallest is 2, then 3, 5, 7.\n</think>\n\n"
                "The first four primes are 2, 3, 5 and 7.",
        .think = true, .think_open = true, .tools = true,
        .reasoning = "The user wants the first primes.\n\nSmallest is 2, then 3, 5, 7.",
        .content = "The first four primes are 2, 3, 5 and 7.",
    },
    {
        .name = "think opened in the prompt and repeated by the model",
        .text = "<think>\nHmm, a greeting.\n</think>\n\nHello! How can I help you today?",
        .think = true, .think_open = true,
        .reasoning = "Hmm, a greeting.",
        .content = "Hello! How can I help you today?",
    },
    {
        .name = "empty think block",
        .text = "<think>\n\n</think>\n\nHello there.",
        .think = true, .tools = true,
        .content = "Hello there.",
    },
    {
        .name = "think never closed (max_tokens)",
        .text = "<think>\nStep 1: read the question.\nStep 2: 12 apples minus 5\n",
        .think = true, .tools = true,
        .reasoning = "Step 1: read the question.\nStep 2: 12 apples minus 5",
    },
    {
        .name = "newlines inside reasoning and after the answer",
        .text = "<think>\n\nFirst.\n\n\nSecond.\n\n</think>\n\n\nDone.\n\n",
        .think = true,
        .reasoning = "First.\n\n\nSecond.",
        .content = "Done.\n\n",
    },
    {
        .name = "utf8 reasoning and content",
        .text = "<think>\n用户在问北京的天气。我应该直接回答。\n</think>\n\n"
                "今天北京晴，气温 25°C ☀️。Ça va? 🙂 Ünïcödé ok.",
        .think = true, .tools = true,
        .reasoning = "用户在问北京的天气。我应该直接回答。",
        .content = "今天北京晴，气温 25°C ☀️。Ça va? 🙂 Ünïcödé ok.",
    },
    {
        .name = "custom reasoning tags",
        .text = "<|begin_of_thought|>\nCheck parity of 7.\n<|end_of_thought|>\n\n7 is odd. <think> stays text here.",
        .think = true, .think_tags = { "<|begin_of_thought|>", "<|end_of_thought|>" },
        .reasoning = "Check parity of 7.",
        .content = "7 is odd. <think> stays text here.",
        .tags_in_content = true,
    },
    {
        .name = "two think blocks",
        .text = "<think>\nA\n</think>\n\nPart one. <think>B</think>Part two.",
        .think = true,
        .reasoning = "AB",
        .content = "Part one. Part two.",
    },
    {
        .name = "stop string",
        .text = "Sure, here is the summary.\nUser: and now translate it",
        .stops = STOP_USER, .think = true, .tools = true,
        .content = "Sure, here is the summary.",
        .stopped = true,
    },
    {
        .name = "stop string equal to the close tag",
        .text = "<think>\nabc\n</think>\n\nanswer",
        .stops = STOP_THINK_END, .think = true,
        .reasoning = "abc",
        .stopped = true,
    },
    {
        .name = "stop prefixes that do not complete",
        .text = "Obs: see <|im_start|> and Observ-ation, <|im_en d|>. Observation: the tool said 42",
        .stops = STOP_OBS, .think = true, .tools = true,
        .content = "Obs: see <|im_start|> and Observ-ation, <|im_en d|>. ",
        .stopped = true,
    },
    {
        .name = "stop string overlapping the think tag",
        .text = "<think>\nplan\n</think>\n\nThe <thinking> word ends it",
        .stops = STOP_OVERLAP, .think = true,
        .reasoning = "plan",
        .content = "The ",
        .stopped = true,
    },
    {
        .name = "utf8 stop string",
        .text = "第一句话很短。第二句不会出现。",
        .stops = STOP_CJK, .think = true,
        .content = "第一句话很短",
        .stopped = true,
    },
};

LM_TEST(parse_text_and_reasoning_corpus) {
    for (size_t i = 0; i < LM_COUNT(TEXT_CASES); i++) PP_CHECK_CASE(&TEXT_CASES[i]);
}
