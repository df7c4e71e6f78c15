/* test_server_output.c - the server's request parsing, chat rendering and
 * output pipeline, in process (no HTTP, no engine): token events built from
 * the fixture tokenizer go through srv_out and come out as OpenAI JSON/SSE. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "server_fixture.h"

typedef srv_fx fx;

static int parse(fx *f, srv_kind kind, const char *body, srv_req *r, srv_err *e) {
    memset(e, 0, sizeof *e);
    return srv_req_parse(&f->s, kind, body, strlen(body), r, e);
}

/* Feeds text as the model's tokens (one event per token, then a final event
 * carrying eos). Returns the number of events after which srv_out asked to
 * cancel (0 = never). */
static int feed(fx *f, srv_out *o, const char *text, lm_finish finish) {
    lm_tok_ids ids = { 0 };
    lm_err e = { { 0 } };
    LM_ASSERT(lm_tokenizer_encode(f->tok, text, strlen(text), false, &ids, &e) == 0);
    int cancel_at = 0;
    for (size_t i = 0; i < ids.n; i++) {
        lm_token_event ev = { .token = ids.ids[i], .has_token = true, .logprob = -0.5f, .n_top = 2 };
        ev.top_ids[0] = ids.ids[i];
        ev.top_logprobs[0] = -0.5f;
        ev.top_ids[1] = 7;
        ev.top_logprobs[1] = -2.0f;
        if (srv_out_event(o, &ev) && !cancel_at) cancel_at = (int)i + 1;
        if (cancel_at) break; /* the engine stops after a cancel */
    }
    lm_token_event fin = { .done = true, .finish = cancel_at ? LM_FINISH_CANCELLED : finish, .n_prompt = 10,
                           .n_cached = 3, .n_generated = (int)ids.n };
    if (!cancel_at && finish == LM_FINISH_STOP) {
        fin.has_token = true;
        fin.token = 2;
        fin.n_generated++;
    }
    srv_out_event(o, &fin);
    lm_tok_ids_free(&ids);
    return cancel_at;
}

/* The JSON payloads of an SSE stream ("data: X\n\n"); [DONE] counted apart. */
static json_t *sse_events(const char *sse, size_t n, int *n_done) {
    json_t *arr = json_array();
    *n_done = 0;
    const char *p = sse, *end = sse + n;
    while (p < end) {
        const char *nl = strstr(p, "\n\n");
        if (!nl) break;
        if (!strncmp(p, "data: [DONE]", 12)) (*n_done)++;
        else if (!strncmp(p, "data: ", 6)) json_array_append_new(arr, json_loadb(p + 6, (size_t)(nl - p - 6), JSON_ALLOW_NUL, NULL));
        p = nl + 2;
    }
    return arr;
}

static const char *k_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";

static const char *k_answer =
    "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n\n<tool_call>\n{\"name\": \"get_weather\", "
    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

LM_TEST(server_out_chat_reasoning_and_tool_call) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    char body[1024];
    snprintf(body, sizeof body, "{\"model\":\"qwen3\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":%s}",
             k_tools);
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, SRV_CHAT, body, &r, &e) == 0);
    srv_out o;
    lm_chat_prompt p = { 0 };
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, &p, NULL, 0, &e) == 0);
    feed(&f, &o, k_answer, LM_FINISH_STOP);
    LM_CHECK(o.done);
    json_t *res = srv_out_response(&o);
    json_t *choice = json_array_get(json_object_get(res, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    LM_CHECK(lm_streq(json_string_value(json_object_get(res, "object")), "chat.completion"));
    LM_CHECK(!strncmp(json_string_value(json_object_get(res, "id")), "chatcmpl-", 9));
    LM_CHECK_MSG(json_string_value(json_object_get(msg, "content")) &&
                     lm_streq(json_string_value(json_object_get(msg, "content")), "Let me check."),
                 "content %s", json_dumps(msg, 0));
    LM_CHECK(lm_streq(json_string_value(json_object_get(msg, "reasoning_content")), "The user wants weather."));
    json_t *calls = json_object_get(msg, "tool_calls");
    LM_CHECK(json_array_size(calls) == 1);
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    LM_CHECK(lm_streq(json_string_value(json_object_get(fn, "name")), "get_weather"));
    json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
    LM_CHECK(lm_streq(json_string_value(json_object_get(args, "city")), "Paris"));
    json_decref(args);
    LM_CHECK(lm_streq(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls"));
    json_t *usage = json_object_get(res, "usage");
    LM_CHECK(json_integer_value(json_object_get(usage, "prompt_tokens")) == 10);
    LM_CHECK(json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens")) == 3);
    LM_CHECK(json_integer_value(json_object_get(json_object_get(usage, "completion_tokens_details"), "reasoning_tokens")) > 0);
    json_decref(res);
    srv_out_free(&o);
    srv_req_free(&r);
    srv_fx_close(&f);
}

LM_TEST(server_out_chat_stream_matches_non_stream) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    char body[1024];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":%s,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             k_tools);
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, SRV_CHAT, body, &r, &e) == 0);
    srv_out o;
    lm_chat_prompt p = { 0 };
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, &p, NULL, 0, &e) == 0);
    feed(&f, &o, k_answer, LM_FINISH_STOP);
    int n_done;
    json_t *ev = sse_events(o.sse.s, o.sse.len, &n_done);
    LM_CHECK(n_done == 1);
    LM_REQUIRE(json_array_size(ev) >= 4);
    /* first chunk: the role */
    json_t *d0 = json_object_get(json_array_get(json_object_get(json_array_get(ev, 0), "choices"), 0), "delta");
    LM_CHECK(lm_streq(json_string_value(json_object_get(d0, "role")), "assistant"));
    char content[256] = "", reasoning[256] = "", args[256] = "", name[64] = "";
    const char *finish = NULL;
    size_t n = json_array_size(ev);
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(ev, i);
        LM_CHECK(lm_streq(json_string_value(json_object_get(c, "object")), "chat.completion.chunk"));
        LM_CHECK(json_object_get(c, "usage") != NULL); /* null on all but the last */
        json_t *choices = json_object_get(c, "choices");
        if (i == n - 1) {
            LM_CHECK(json_array_size(choices) == 0);
            LM_CHECK(json_integer_value(json_object_get(json_object_get(c, "usage"), "completion_tokens")) > 0);
            continue;
        }
        LM_CHECK(json_is_null(json_object_get(c, "usage")));
        json_t *ch = json_array_get(choices, 0), *d = json_object_get(ch, "delta");
        if (json_is_string(json_object_get(ch, "finish_reason"))) finish = json_string_value(json_object_get(ch, "finish_reason"));
        if (json_is_string(json_object_get(d, "content"))) strncat(content, json_string_value(json_object_get(d, "content")), 100);
        if (json_is_string(json_object_get(d, "reasoning_content")))
            strncat(reasoning, json_string_value(json_object_get(d, "reasoning_content")), 100);
        json_t *tc = json_array_get(json_object_get(d, "tool_calls"), 0);
        if (tc) {
            LM_CHECK(json_integer_value(json_object_get(tc, "index")) == 0);
            json_t *fn = json_object_get(tc, "function");
            if (json_is_string(json_object_get(fn, "name"))) snprintf(name, sizeof name, "%s", json_string_value(json_object_get(fn, "name")));
            if (json_is_string(json_object_get(fn, "arguments"))) strncat(args, json_string_value(json_object_get(fn, "arguments")), 100);
        }
    }
    LM_CHECK_MSG(!strcmp(content, "Let me check."), "content '%s'", content);
    LM_CHECK(!strcmp(reasoning, "The user wants weather."));
    LM_CHECK(!strcmp(name, "get_weather"));
    json_t *a = json_loads(args, 0, NULL);
    LM_CHECK_MSG(a && lm_streq(json_string_value(json_object_get(a, "city")), "Paris"), "args '%s'", args);
    json_decref(a);
    LM_CHECK(finish && !strcmp(finish, "tool_calls"));
    json_decref(ev);
    srv_out_free(&o);
    srv_req_free(&r);
    srv_fx_close(&f);
}

LM_TEST(server_out_stop_string_across_tokens) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    for (int stream = 0; stream < 2; stream++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"stop\":[\"END\",\"zz\"],\"stream\":%s}", stream ? "true" : "false");
        srv_req r;
        srv_err e;
        LM_REQUIRE(parse(&f, SRV_COMPLETION, body, &r, &e) == 0);
        srv_out o;
        LM_REQUIRE(srv_out_init(&o, &f.s, &r, NULL, NULL, 0, &e) == 0);
        int at = feed(&f, &o, "hello world, the END is near", LM_FINISH_LENGTH);
        LM_CHECK(at > 0);
        LM_CHECK(o.stopped);
        const char *want = "hello world, the ";
        if (!stream) {
            json_t *res = srv_out_response(&o);
            json_t *ch = json_array_get(json_object_get(res, "choices"), 0);
            LM_CHECK_MSG(lm_streq(json_string_value(json_object_get(ch, "text")), want), "text '%s'",
                         json_string_value(json_object_get(ch, "text")));
            LM_CHECK(lm_streq(json_string_value(json_object_get(ch, "finish_reason")), "stop"));
            LM_CHECK(lm_streq(json_string_value(json_object_get(res, "object")), "text_completion"));
            json_decref(res);
        } else {
            int n_done;
            json_t *ev = sse_events(o.sse.s, o.sse.len, &n_done);
            char text[256] = "";
            for (size_t i = 0; i < json_array_size(ev); i++) {
                json_t *ch = json_array_get(json_object_get(json_array_get(ev, i), "choices"), 0);
                strncat(text, json_string_value(json_object_get(ch, "text")), 100);
                LM_CHECK(strstr(text, "EN") == NULL); /* never a partial stop string */
            }
            LM_CHECK(!strcmp(text, want));
            LM_CHECK(n_done == 1);
            json_decref(ev);
        }
        srv_out_free(&o);
        srv_req_free(&r);
    }
    srv_fx_close(&f);
}

LM_TEST(server_out_hides_specials_and_eos) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, SRV_COMPLETION, "{\"prompt\":\"x\"}", &r, &e) == 0);
    srv_out o;
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, NULL, NULL, 0, &e) == 0);
    feed(&f, &o, "a<|im_start|>b<|endoftext|>c", LM_FINISH_STOP);
    LM_CHECK_MSG(o.content.len == 3 && !memcmp(o.content.s, "abc", 3), "got '%s'", o.content.s);
    srv_out_free(&o);
    srv_req_free(&r);
    srv_fx_close(&f);
}

LM_TEST(server_out_completion_echo_and_logprobs) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, SRV_COMPLETION, "{\"prompt\":\"Say:\",\"logprobs\":2}", &r, &e) == 0);
    LM_CHECK(r.gp.logprobs && r.gp.top_logprobs == 2);
    srv_out o;
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, NULL, NULL, 0, &e) == 0);
    feed(&f, &o, " hi there", LM_FINISH_LENGTH);
    json_t *res = srv_out_response(&o);
    json_t *ch = json_array_get(json_object_get(res, "choices"), 0);
    json_t *lp = json_object_get(ch, "logprobs");
    size_t n = json_array_size(json_object_get(lp, "tokens"));
    LM_CHECK(n >= 2);
    LM_CHECK(json_array_size(json_object_get(lp, "token_logprobs")) == n);
    LM_CHECK(json_array_size(json_object_get(lp, "text_offset")) == n);
    LM_CHECK(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)) == 2);
    LM_CHECK(lm_streq(json_string_value(json_object_get(ch, "finish_reason")), "length"));
    json_decref(res);
    srv_out_free(&o);
    srv_req_free(&r);

    LM_REQUIRE(parse(&f, SRV_COMPLETION, "{\"prompt\":\"Say:\",\"echo\":true}", &r, &e) == 0);
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, NULL, "Say:", 4, &e) == 0);
    feed(&f, &o, " ok", LM_FINISH_STOP);
    LM_CHECK(o.content.len == 7 && !memcmp(o.content.s, "Say: ok", 7));
    srv_out_free(&o);
    srv_req_free(&r);
    srv_fx_close(&f);
}

LM_TEST(server_out_chat_logprobs_shape) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":2}",
                     &r, &e) == 0);
    srv_out o;
    lm_chat_prompt p = { 0 };
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, &p, NULL, 0, &e) == 0);
    feed(&f, &o, "ok then", LM_FINISH_STOP);
    json_t *res = srv_out_response(&o);
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(res, "choices"), 0), "logprobs"), "content");
    LM_CHECK(json_array_size(content) >= 2);
    json_t *e0 = json_array_get(content, 0);
    LM_CHECK(json_is_string(json_object_get(e0, "token")));
    LM_CHECK(json_is_real(json_object_get(e0, "logprob")));
    LM_CHECK(json_is_array(json_object_get(e0, "bytes")));
    LM_CHECK(json_array_size(json_object_get(e0, "top_logprobs")) == 2);
    json_decref(res);
    srv_out_free(&o);
    srv_req_free(&r);
    srv_fx_close(&f);
}

static void expect_error(lm_test_ctx *lm_t_, fx *f, srv_kind kind, const char *body, int status, const char *param) {
    srv_req r;
    srv_err e;
    int rc = parse(f, kind, body, &r, &e);
    LM_CHECK_MSG(rc == -1 && e.status == status && (!param || !strcmp(e.param, param)),
                 "%s -> rc %d status %d param '%s' msg '%s'", body, rc, e.status, e.param, e.msg);
    json_t *j = srv_error_json(&e);
    json_t *in = json_object_get(j, "error");
    LM_CHECK(json_is_string(json_object_get(in, "message")) && json_is_string(json_object_get(in, "type")));
    LM_CHECK(json_object_get(in, "param") && json_object_get(in, "code"));
    json_decref(j);
    srv_req_free(&r);
}

LM_TEST(server_request_validation) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    const char *M = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char b[512];
    expect_error(lm_t_, &f, SRV_CHAT, "{not json", 400, NULL);
    expect_error(lm_t_, &f, SRV_CHAT, "[1,2]", 400, NULL);
    {
        srv_req r;
        srv_err e;
        /* U+0000 is valid JSON: accepted, kept in the string (issue #27) */
        LM_CHECK(parse(&f, SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", &r, &e) == 0);
        const json_t *c = json_object_get(json_array_get(r.messages, 0), "content");
        LM_CHECK(json_string_length(c) == 3 && !memcmp(json_string_value(c), "a\0b", 3));
        srv_req_free(&r);
    }
    expect_error(lm_t_, &f, SRV_CHAT, "{}", 400, "messages");
    expect_error(lm_t_, &f, SRV_CHAT, "{\"messages\":[]}", 400, "messages");
    expect_error(lm_t_, &f, SRV_CHAT, "{\"messages\":\"hi\"}", 400, "messages");
    expect_error(lm_t_, &f, SRV_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role");
    expect_error(lm_t_, &f, SRV_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content");
    expect_error(lm_t_, &f, SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
                 "messages[0].content");
    snprintf(b, sizeof b, "{%s,\"model\":\"gpt-9\"}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 404, "model");
    snprintf(b, sizeof b, "{%s,\"temperature\":\"hot\"}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "temperature");
    snprintf(b, sizeof b, "{%s,\"temperature\":3}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "temperature");
    snprintf(b, sizeof b, "{%s,\"max_tokens\":0}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "max_tokens");
    snprintf(b, sizeof b, "{%s,\"max_tokens\":100000}", M); /* a cap: cut to the room later, not refused */
    {
        srv_req r;
        srv_err e;
        LM_CHECK(parse(&f, SRV_CHAT, b, &r, &e) == 0 && r.max_tokens_set && r.gp.max_tokens == 100000);
        srv_req_free(&r);
    }
    snprintf(b, sizeof b, "{%s,\"max_tokens\":1.5}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "max_tokens");
    snprintf(b, sizeof b, "{%s,\"n\":17}", M); /* n up to 16 (SRV_MAX_CHOICES) */
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "n");
    snprintf(b, sizeof b, "{%s,\"n\":0}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "n");
    snprintf(b, sizeof b, "{%s,\"stop\":[1]}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "stop");
    snprintf(b, sizeof b, "{%s,\"top_logprobs\":3}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "top_logprobs");
    snprintf(b, sizeof b, "{%s,\"logprobs\":true,\"top_logprobs\":21}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "top_logprobs");
    snprintf(b, sizeof b, "{%s,\"logit_bias\":{\"abc\":1}}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "logit_bias");
    snprintf(b, sizeof b, "{%s,\"logit_bias\":{\"5\":101}}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "logit_bias");
    snprintf(b, sizeof b, "{%s,\"stream_options\":{\"include_usage\":true}}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "stream_options");
    snprintf(b, sizeof b, "{%s,\"tool_choice\":\"required\"}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "tool_choice");
    snprintf(b, sizeof b, "{%s,\"tools\":%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}", M, k_tools);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "tool_choice");
    snprintf(b, sizeof b, "{%s,\"response_format\":{\"type\":\"json_schema\"}}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "response_format");
    expect_error(lm_t_, &f, SRV_COMPLETION, "{}", 400, "prompt");
    expect_error(lm_t_, &f, SRV_COMPLETION, "{\"prompt\":\"\"}", 400, "prompt");
    expect_error(lm_t_, &f, SRV_COMPLETION, "{\"prompt\":[1,99999]}", 400, "prompt");
    expect_error(lm_t_, &f, SRV_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt");
    expect_error(lm_t_, &f, SRV_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":6}", 400, "logprobs");

    /* accepted: OpenAI defaults and extensions */
    srv_req r;
    srv_err e;
    snprintf(b, sizeof b, "{%s,\"model\":\"qwen3\",\"temperature\":0,\"seed\":7,\"top_k\":5,\"min_p\":0.1,"
                          "\"max_completion_tokens\":9,\"stop\":\"x\",\"logit_bias\":{\"5\":-100},\"tool_choice\":\"none\","
                          "\"tools\":%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}", M, k_tools);
    LM_CHECK_MSG(parse(&f, SRV_CHAT, b, &r, &e) == 0, "%s", e.msg);
    LM_CHECK(r.gp.sampling.temperature == 0 && r.gp.sampling.seed == 7 && r.gp.sampling.top_k == 5);
    LM_CHECK(r.gp.max_tokens == 9 && r.max_tokens_set && r.include_usage && r.stream);
    LM_CHECK(r.gp.n_logit_bias == 1 && r.gp.logit_bias[0].token == 5 && r.gp.logit_bias[0].bias == -100);
    LM_CHECK(r.tools == NULL); /* tool_choice none: no tools to the template or the parser */
    LM_CHECK(r.gp.n_stop_tokens == 1 && r.gp.stop_tokens[0] == 2);
    srv_req_free(&r);
    /* ignore_eos: no stop tokens, so generation runs to max_tokens */
    snprintf(b, sizeof b, "{%s,\"ignore_eos\":true}", M);
    LM_CHECK_MSG(parse(&f, SRV_CHAT, b, &r, &e) == 0, "%s", e.msg);
    LM_CHECK(r.gp.n_stop_tokens == 0);
    srv_req_free(&r);
    snprintf(b, sizeof b, "{%s,\"ignore_eos\":1}", M);
    expect_error(lm_t_, &f, SRV_CHAT, b, 400, "ignore_eos");
    srv_fx_close(&f);
}

LM_TEST(server_chat_render_context) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    char b[2048];
    snprintf(b, sizeof b,
             "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
             "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"hm\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
             "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}],"
             "\"tools\":%s,\"chat_template_kwargs\":{\"enable_thinking\":false}}",
             k_tools);
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, SRV_CHAT, b, &r, &e) == 0);
    const lm_chat_req cr = srv_chat_req(&r);
    json_t *ctx = lm_chat_context(f.s.chat, &cr);
    json_t *msgs = json_object_get(ctx, "messages");
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_array_get(msgs, 0), "role")), "system"));
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_array_get(msgs, 1), "content")), "a\nb"));
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(json_array_get(msgs, 2), "tool_calls"), 0), "function"), "arguments");
    LM_CHECK(json_is_object(args) && lm_streq(json_string_value(json_object_get(args, "city")), "Oslo"));
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_array_get(msgs, 2), "reasoning_content")), "hm"));
    LM_CHECK(json_is_true(json_object_get(ctx, "add_generation_prompt")));
    LM_CHECK(json_is_false(json_object_get(ctx, "enable_thinking")));
    LM_CHECK(json_is_array(json_object_get(ctx, "tools")));
    LM_CHECK(lm_streq(json_string_value(json_object_get(ctx, "eos_token")), "<|im_end|>"));
    json_decref(ctx);
    lm_chat_prompt p;
    LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
    LM_CHECK(strstr(p.text, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>") != NULL);
    LM_CHECK(strstr(p.text, "<tool_response>\nsunny\n</tool_response>") != NULL);
    LM_CHECK(strstr(p.text, "# Tools") != NULL);
    size_t n = strlen(p.text);
    const char *tail = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    LM_CHECK(n > strlen(tail) && !strcmp(p.text + n - strlen(tail), tail));
    LM_CHECK(!p.start_in_reasoning);
    LM_CHECK(p.prefill == NULL);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);

    /* a named tool_choice prefills the call's opening and the parser sees it */
    snprintf(b, sizeof b,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":%s,"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}", k_tools);
    LM_REQUIRE(parse(&f, SRV_CHAT, b, &r, &e) == 0);
    LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
    LM_CHECK(p.prefill && !strcmp(p.prefill, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "));
    n = strlen(p.text);
    LM_CHECK(n > strlen(p.prefill) && !strcmp(p.text + n - strlen(p.prefill), p.prefill));
    srv_out o;
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, &p, NULL, 0, &e) == 0);
    feed(&f, &o, "{\"city\": \"Rome\"}}\n</tool_call>", LM_FINISH_STOP);
    json_t *res = srv_out_response(&o);
    json_t *calls = json_object_get(json_object_get(json_array_get(json_object_get(res, "choices"), 0), "message"), "tool_calls");
    LM_CHECK(json_array_size(calls) == 1);
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments")),
                     "{\"city\": \"Rome\"}"));
    json_decref(res);
    srv_out_free(&o);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);
    srv_fx_close(&f);
}

LM_TEST(server_ends_in_think) {
    LM_CHECK(lm_reasoning_prompt_open("x<|im_start|>assistant\n<think>\n", 31, "<think>", "</think>"));
    LM_CHECK(!lm_reasoning_prompt_open("<think>\n\n</think>\n\n", 19, "<think>", "</think>"));
    LM_CHECK(!lm_reasoning_prompt_open("<think>a</think> then <think>b", 30, "<think>", "</think>"));
    LM_CHECK(!lm_reasoning_prompt_open("plain", 5, "<think>", "</think>"));
    const char *s = "<think>a</think> <think> \n";
    LM_CHECK(lm_reasoning_prompt_open(s, strlen(s), "<think>", "</think>"));
}

/* The Qwen3.8 template (fixtures/templates/qwen38): XML tool calls and a think
 * block the prompt opens. The fixture tokenizer stands in for the model's. */
static bool use_template(fx *f, const char *rel) {
    char *path = lm_test_fixture_path(rel);
    if (!path) return false;
    char *src = NULL;
    size_t len = 0;
    lm_err e = { { 0 } };
    int rc = lm_template_load_source(path, &src, &len, &e);
    free(path);
    if (rc) return false;
    lm_chat_free(f->s.chat);
    rc = lm_chat_create(&f->s.chat, f->tok, src, &e);
    free(src);
    return rc == 0;
}

static const char *k_tools2 =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}}]";

LM_TEST(server_qwen38_xml_tools_and_open_think) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    if (!use_template(&f, "templates/qwen38/qwen38_chat_template.jinja")) {
        srv_fx_close(&f);
        LM_SKIP("../shared/fixtures/templates/qwen38 not found");
    }
    LM_CHECK(f.s.chat->xml_tools && f.s.chat->think);
    char b[2048];
    snprintf(b, sizeof b,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
             "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"Look it up.\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
             "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\", \\\"days\\\": 2}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"},"
             "{\"role\":\"user\",\"content\":\"And Paris?\"}],\"tools\":%s}",
             k_tools2);
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, SRV_CHAT, b, &r, &e) == 0);
    lm_chat_prompt p;
    int rrc = srv_chat_render(&f.s, &r, &p, &e);
    if (rrc) fprintf(stderr, "  render: %s\n", e.msg);
    LM_REQUIRE(rrc == 0);
    /* the history's call is rendered back in the XML form, arguments as parameters */
    LM_CHECK_MSG(strstr(p.text, "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>") != NULL,
                 "%s", p.text);
    LM_CHECK(strstr(p.text, "<tool_response>\nsunny\n</tool_response>") != NULL);
    LM_CHECK(p.start_in_reasoning); /* "<|im_start|>assistant\n<think>\n" */
    srv_out o;
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, &p, NULL, 0, &e) == 0);
    feed(&f, &o,
         "The user asks about Paris.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
         LM_FINISH_STOP);
    json_t *res = srv_out_response(&o);
    json_t *choice = json_array_get(json_object_get(res, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    LM_CHECK(lm_streq(json_string_value(json_object_get(msg, "reasoning_content")) ?: "", "The user asks about Paris."));
    LM_CHECK(json_is_null(json_object_get(msg, "content")));
    json_t *calls = json_object_get(msg, "tool_calls");
    LM_CHECK(json_array_size(calls) == 1);
    json_t *args = json_loads(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments")) ?: "",
                              0, NULL);
    LM_CHECK(lm_streq(json_string_value(json_object_get(args, "city")) ?: "", "Paris"));
    LM_CHECK(json_integer_value(json_object_get(args, "days")) == 3); /* converted by the schema's type */
    json_decref(args);
    LM_CHECK(lm_streq(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls"));
    json_decref(res);
    srv_out_free(&o);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);

    /* a named tool_choice closes the open think block and opens the call */
    snprintf(b, sizeof b,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Rome?\"}],\"tools\":%s,\"stream\":true,"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}", k_tools2);
    LM_REQUIRE(parse(&f, SRV_CHAT, b, &r, &e) == 0);
    LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
    LM_CHECK(p.prefill && !strcmp(p.prefill, "\n</think>\n\n<tool_call>\n<function=get_weather>\n"));
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, &p, NULL, 0, &e) == 0);
    feed(&f, &o, "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>", LM_FINISH_STOP);
    int n_done;
    json_t *ev = sse_events(o.sse.s, o.sse.len, &n_done);
    char args_s[128] = "", name[64] = "";
    int reasoning_chunks = 0;
    const char *finish = NULL;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *ch = json_array_get(json_object_get(json_array_get(ev, i), "choices"), 0);
        json_t *d = json_object_get(ch, "delta");
        reasoning_chunks += json_object_get(d, "reasoning_content") != NULL;
        if (json_is_string(json_object_get(ch, "finish_reason"))) finish = json_string_value(json_object_get(ch, "finish_reason"));
        json_t *fn = json_object_get(json_array_get(json_object_get(d, "tool_calls"), 0), "function");
        if (json_is_string(json_object_get(fn, "name"))) snprintf(name, sizeof name, "%s", json_string_value(json_object_get(fn, "name")));
        if (json_is_string(json_object_get(fn, "arguments"))) strncat(args_s, json_string_value(json_object_get(fn, "arguments")), 60);
    }
    LM_CHECK(reasoning_chunks == 0);
    LM_CHECK(!strcmp(name, "get_weather"));
    LM_CHECK_MSG(!strcmp(args_s, "{\"city\": \"Rome\"}"), "args '%s'", args_s);
    LM_CHECK(finish && !strcmp(finish, "tool_calls"));
    LM_CHECK(n_done == 1);
    json_decref(ev);
    srv_out_free(&o);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);
    srv_fx_close(&f);
}

/* A trace line from a made-up engine trace: spans in ms, decode-step sizes
 * summarised, and for a divergence the text of both prompts around it. */
LM_TEST(server_trace_line_divergence_text) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("%s", lm_test_fixtures_why());
    const char *a = "The quick brown fox jumps over the lazy dog. Alpha beta gamma";
    const char *b = "The quick brown fox jumps over the lazy dog. Omega delta";
    lm_tok_ids ia = { 0 }, ib = { 0 };
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_tokenizer_encode(f.tok, a, strlen(a), false, &ia, &e) == 0);
    LM_REQUIRE(lm_tokenizer_encode(f.tok, b, strlen(b), false, &ib, &e) == 0);
    int dp = 0;
    while (dp < (int)ia.n && dp < (int)ib.n && ia.ids[dp] == ib.ids[dp]) dp++;
    LM_REQUIRE(dp > 4 && dp < (int)ib.n);
    int32_t steps[40];
    for (int i = 0; i < 40; i++) steps[i] = 1 + i % 4;
    lm_request_trace tr = { .t_submit = 10.0, .t_admit = 10.25, .t_first = 10.5, .t_done = 11.0, .lookup_s = 0.001,
                            .restore_s = 0.002, .n_cached = 0, .n_shared = dp, .miss = LM_MISS_DIVERGED,
                            .diverge_pos = dp, .prev_start = dp - 2, .n_prefill_chunks = 1, .n_steps = 40,
                            .step_batch = steps };
    for (int i = 0; i < LM_TRACE_WINDOW && tr.prev_start + i < (int)ia.n; i++) tr.prev_window[tr.n_prev++] = ia.ids[tr.prev_start + i];
    srv_trace_rec r = { .id = "x1", .route = "/v1/completions", .finish = "length", .status = 200,
                        .n_prompt = (int)ib.n, .n_generated = 41, .t_arrive = 9.999, .t_first = 10.5, .t_last = 11.0,
                        .t_end = 11.001, .tr = &tr, .prompt = ib.ids, .n_prompt_ids = (int)ib.n };
    json_t *j = srv_trace_json(&f.s, &r);
    json_t *ms = json_object_get(j, "ms");
    LM_CHECK(json_real_value(json_object_get(ms, "queue")) == 250.0);
    LM_CHECK(json_real_value(json_object_get(ms, "prefill")) == 250.0);
    LM_CHECK(json_real_value(json_object_get(ms, "decode")) == 500.0);
    LM_CHECK(json_real_value(json_object_get(ms, "cache_lookup")) == 1.0);
    LM_CHECK(json_real_value(json_object_get(ms, "cache_restore")) == 2.0);
    LM_CHECK(json_real_value(json_object_get(ms, "total")) == 1002.0);
    json_t *d = json_object_get(j, "decode_steps");
    LM_CHECK(json_integer_value(json_object_get(d, "n")) == 40 && json_integer_value(json_object_get(d, "min")) == 1 &&
             json_integer_value(json_object_get(d, "max")) == 4 && json_real_value(json_object_get(d, "mean")) == 2.5);
    LM_CHECK(json_object_get(d, "sizes") == NULL); /* 40 steps: summarised only */
    json_t *c = json_object_get(j, "cache");
    LM_CHECK(lm_streq(json_string_value(json_object_get(c, "miss")), "diverged"));
    LM_CHECK(json_integer_value(json_object_get(c, "diverge_pos")) == dp);
    const char *before = json_string_value(json_object_get(c, "before"));
    const char *p = json_string_value(json_object_get(c, "prompt"));
    LM_CHECK_MSG(before && strstr(b, before) && strstr(a, before), "before '%s'", before ?: "");
    LM_CHECK_MSG(p && strstr(p, "mega") && !strstr(p, "lpha"), "prompt side '%s'", p ?: "");
    /* the earlier request's side may be another user's text: never in this line */
    char *line = json_dumps(j, JSON_COMPACT);
    LM_CHECK_MSG(!strstr(line, "lpha") && !json_object_get(c, "prev") && !json_object_get(c, "prev_ids"), "%s", line);
    free(line);
    json_decref(j);
    /* no engine trace: what the server knows */
    r.tr = NULL;
    r.queue_s = 0.25;
    j = srv_trace_json(&f.s, &r);
    LM_CHECK(json_is_false(json_object_get(j, "engine_trace")) && !json_object_get(j, "cache"));
    LM_CHECK(json_real_value(json_object_get(json_object_get(j, "ms"), "queue")) == 250.0);
    json_decref(j);
    lm_tok_ids_free(&ia);
    lm_tok_ids_free(&ib);
    srv_fx_close(&f);
}

/* --debug-tool-call: a user's turn that offers the tool is answered with the
 * whole call, prefilled in the template's format; the model's own tokens are
 * dropped (the first event cancels); other turns are left to the model. */
LM_TEST(server_debug_tool_call) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 256)) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err le = { { 0 } };
    static const char *const bad[] = { "get_weather", "={}", "get_weather=[1]", "get_weather={", "get_weather=" };
    for (size_t i = 0; i < LM_COUNT(bad); i++) {
        LM_CHECK_MSG(srv_debug_call_parse(&f.s, bad[i], &le) == -1, "'%s' was accepted", bad[i]);
        LM_CHECK(f.s.debug_call_name == NULL && strstr(le.msg, "--debug-tool-call"));
    }
    LM_REQUIRE(srv_debug_call_parse(&f.s, "get_weather={\"city\": \"Oslo\"}", &le) == 0);
    LM_CHECK(lm_streq(f.s.debug_call_name, "get_weather"));

    char b[2048];
    srv_req r;
    srv_err e;
    lm_chat_prompt p;
    snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":%s,\"stream\":true}", k_tools);
    LM_REQUIRE(parse(&f, SRV_CHAT, b, &r, &e) == 0);
    LM_CHECK(r.tool_args == f.s.debug_call_args);
    LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
    const char *want = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>";
    LM_CHECK_MSG(p.prefill && !strcmp(p.prefill, want), "prefill '%s'", p.prefill ? p.prefill : "(null)");
    LM_CHECK(p.call_complete);
    size_t n = strlen(p.text);
    LM_CHECK(n > strlen(want) && !strcmp(p.text + n - strlen(want), want));
    srv_out o;
    LM_REQUIRE(srv_out_init(&o, &f.s, &r, &p, NULL, 0, &e) == 0);
    LM_CHECK(feed(&f, &o, "Some words <tool_call>", LM_FINISH_STOP) == 1); /* the first token cancels */
    int n_done;
    json_t *ev = sse_events(o.sse.s, o.sse.len, &n_done);
    char name[64] = "", args[128] = "";
    const char *finish = NULL;
    bool content = false;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *ch = json_array_get(json_object_get(json_array_get(ev, i), "choices"), 0);
        json_t *d = json_object_get(ch, "delta");
        const char *c = json_string_value(json_object_get(d, "content"));
        content |= c && *c;
        if (json_is_string(json_object_get(ch, "finish_reason"))) finish = json_string_value(json_object_get(ch, "finish_reason"));
        json_t *fn = json_object_get(json_array_get(json_object_get(d, "tool_calls"), 0), "function");
        if (json_is_string(json_object_get(fn, "name"))) snprintf(name, sizeof name, "%s", json_string_value(json_object_get(fn, "name")));
        if (json_is_string(json_object_get(fn, "arguments"))) strncat(args, json_string_value(json_object_get(fn, "arguments")), 100);
    }
    LM_CHECK(!content); /* the model's "Some words" never shows */
    LM_CHECK(!strcmp(name, "get_weather"));
    json_t *aj = json_loads(args, 0, NULL);
    LM_CHECK_MSG(lm_streq(json_string_value(json_object_get(aj, "city")), "Oslo"), "args '%s'", args);
    json_decref(aj);
    LM_CHECK(finish && !strcmp(finish, "tool_calls"));
    LM_CHECK(n_done == 1);
    json_decref(ev);
    srv_out_free(&o);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);

    /* left to the model: the answer to a tool result, tool_choice none or
     * named, a request without that tool */
    static const char *const other[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
        "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}],\"tools\":%s}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"}],\"tools\":%s,\"tool_choice\":\"none\"}",
        ("{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"}],\"tools\":%s,"
         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}"),
        "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"x\"}}]%.0s}",
    };
    for (size_t i = 0; i < LM_COUNT(other); i++) {
        snprintf(b, sizeof b, other[i], k_tools);
        LM_REQUIRE(parse(&f, SRV_CHAT, b, &r, &e) == 0);
        LM_CHECK_MSG(r.tool_args == NULL, "case %zu", i);
        LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
        LM_CHECK(!p.call_complete);
        lm_chat_prompt_free(&p);
        srv_req_free(&r);
    }

    /* the Qwen3.5 XML format, after closing the think block the prompt opens */
    if (use_template(&f, "templates/qwen38/qwen38_chat_template.jinja")) {
        LM_REQUIRE(srv_debug_call_parse(&f.s, "get_weather={\"city\": \"Rome\", \"days\": 2}", &le) == 0);
        snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"Rome?\"}],\"tools\":%s}", k_tools2);
        LM_REQUIRE(parse(&f, SRV_CHAT, b, &r, &e) == 0);
        LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
        LM_CHECK_MSG(p.prefill && !strcmp(p.prefill, "\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n"
                                                     "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"),
                     "prefill '%s'", p.prefill ? p.prefill : "(null)");
        LM_REQUIRE(srv_out_init(&o, &f.s, &r, &p, NULL, 0, &e) == 0);
        feed(&f, &o, "more", LM_FINISH_STOP);
        json_t *res = srv_out_response(&o);
        json_t *choice = json_array_get(json_object_get(res, "choices"), 0);
        json_t *calls = json_object_get(json_object_get(choice, "message"), "tool_calls");
        LM_CHECK(json_array_size(calls) == 1);
        json_t *a = json_loads(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments")) ?: "",
                               0, NULL);
        LM_CHECK(lm_streq(json_string_value(json_object_get(a, "city")), "Rome") && json_integer_value(json_object_get(a, "days")) == 2);
        json_decref(a);
        LM_CHECK(lm_streq(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls"));
        json_decref(res);
        srv_out_free(&o);
        lm_chat_prompt_free(&p);
        srv_req_free(&r);
    }
    free(f.s.debug_call_name);
    json_decref(f.s.debug_call_args);
    srv_fx_close(&f);
}
