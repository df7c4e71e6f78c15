/* test_server_anthropic.c - the Anthropic Messages request translation
 * (src/server/anthropic_request.c) in process, without HTTP: each content
 * block kind, system forms, tools and tool_choice, sampling fields, the
 * prompt they render to, bad inputs (status and Anthropic error body), and
 * count_tokens. */
#define _GNU_SOURCE /* memmem */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "server_fixture.h"

typedef srv_fx fx;

static int parse(fx *f, const char *body, srv_req *r, srv_err *e) {
    memset(e, 0, sizeof *e);
    return srv_anth_parse(&f->s, body, strlen(body), false, r, e);
}

static const char *str_at(const json_t *j, const char *k) { return json_string_value(json_object_get(j, k)); }

/* A conversation with every block kind Claude Code sends back. */
static const char *k_history =
    "{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":64,"
    "\"system\":[{\"type\":\"text\",\"text\":\"You are terse.\"},"
    "{\"type\":\"text\",\"text\":\"Use tools.\",\"cache_control\":{\"type\":\"ephemeral\"}}],"
    "\"messages\":["
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather in\"},{\"type\":\"text\",\"text\":\"Paris?\"}]},"
    "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"Need the tool.\",\"signature\":\"abc\"},"
    "{\"type\":\"redacted_thinking\",\"data\":\"xyz\"},{\"type\":\"text\",\"text\":\"Checking.\"},"
    "{\"type\":\"tool_use\",\"id\":\"toolu_01\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}},"
    "{\"type\":\"tool_use\",\"id\":\"toolu_02\",\"name\":\"get_time\",\"input\":{}}]},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_01\",\"content\":\"18 C\"},"
    "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_02\",\"is_error\":true,"
    "\"content\":[{\"type\":\"text\",\"text\":\"no clock\"}]},"
    "{\"type\":\"text\",\"text\":\"Thanks\",\"cache_control\":{\"type\":\"ephemeral\"}}]}],"
    "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather of a city\",\"input_schema\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}},"
    "{\"type\":\"custom\",\"name\":\"get_time\",\"input_schema\":{\"type\":\"object\"}}],"
    "\"metadata\":{\"user_id\":\"u1\"}}";

LM_TEST(server_anthropic_translates_blocks) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, k_history, &r, &e) == 0);
    LM_CHECK(r.kind == SRV_CHAT);
    const json_t *m = r.messages;
    LM_REQUIRE(json_array_size(m) == 6);
    static const char *const roles[] = { "system", "user", "assistant", "tool", "tool", "user" };
    for (size_t i = 0; i < 6; i++) LM_CHECK_MSG(lm_streq(str_at(json_array_get(m, i), "role"), roles[i]), "message %zu", i);
    LM_CHECK(lm_streq(str_at(json_array_get(m, 0), "content"), "You are terse.\nUse tools."));
    LM_CHECK(lm_streq(str_at(json_array_get(m, 1), "content"), "Weather in\nParis?"));
    const json_t *a = json_array_get(m, 2);
    LM_CHECK(lm_streq(str_at(a, "content"), "Checking."));
    LM_CHECK(lm_streq(str_at(a, "reasoning_content"), "Need the tool.")); /* redacted_thinking dropped */
    const json_t *calls = json_object_get(a, "tool_calls");
    LM_REQUIRE(json_array_size(calls) == 2);
    const json_t *c0 = json_array_get(calls, 0), *fn0 = json_object_get(c0, "function");
    LM_CHECK(lm_streq(str_at(c0, "id"), "toolu_01") && lm_streq(str_at(c0, "type"), "function"));
    LM_CHECK(lm_streq(str_at(fn0, "name"), "get_weather"));
    LM_CHECK(lm_streq(str_at(json_object_get(fn0, "arguments"), "city"), "Paris"));
    LM_CHECK(lm_streq(str_at(json_array_get(m, 3), "tool_call_id"), "toolu_01"));
    LM_CHECK(lm_streq(str_at(json_array_get(m, 3), "content"), "18 C"));
    LM_CHECK(lm_streq(str_at(json_array_get(m, 4), "tool_call_id"), "toolu_02"));
    LM_CHECK(lm_streq(str_at(json_array_get(m, 4), "content"), "Error: no clock"));
    LM_CHECK(lm_streq(str_at(json_array_get(m, 5), "content"), "Thanks"));
    /* tools in OpenAI's shape for the template and the tool-call parser */
    LM_REQUIRE(json_array_size(r.tools) == 2);
    const json_t *t0 = json_object_get(json_array_get(r.tools, 0), "function");
    LM_CHECK(lm_streq(str_at(json_array_get(r.tools, 0), "type"), "function"));
    LM_CHECK(lm_streq(str_at(t0, "name"), "get_weather") && lm_streq(str_at(t0, "description"), "Weather of a city"));
    LM_CHECK(json_is_object(json_object_get(json_object_get(t0, "parameters"), "properties")));
    LM_CHECK(r.tool_choice == SRV_TOOLS_AUTO && !r.one_tool_call);
    LM_CHECK(r.max_tokens_set && r.gp.max_tokens == 64 && !r.stream);

    /* the prompt the chat template renders holds every piece */
    lm_chat_prompt p;
    LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
    static const char *const pieces[] = { "You are terse.\nUse tools.", "Weather in\nParis?", "Checking.",
                                          "\"get_weather\"", "\"city\": \"Paris\"", "18 C", "Error: no clock",
                                          "Thanks", "Weather of a city" };
    for (size_t i = 0; i < LM_COUNT(pieces); i++)
        LM_CHECK_MSG(strstr(p.text, pieces[i]) != NULL, "'%s' not in the prompt:\n%s", pieces[i], p.text);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);

    /* content as a plain string; system as a string; a system message */
    LM_REQUIRE(parse(&f, "{\"model\":\"x\",\"max_tokens\":5,\"system\":\"S\",\"messages\":[{\"role\":\"user\","
                         "\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"},{\"role\":\"user\",\"content\":[]}]}",
                     &r, &e) == 0);
    LM_CHECK(json_array_size(r.messages) == 4);
    LM_CHECK(lm_streq(str_at(json_array_get(r.messages, 0), "content"), "S"));
    LM_CHECK(lm_streq(str_at(json_array_get(r.messages, 2), "content"), "yo"));
    LM_CHECK(lm_streq(str_at(json_array_get(r.messages, 3), "content"), ""));
    LM_CHECK(!r.tools);
    srv_req_free(&r);
    srv_fx_close(&f);
}

/* U+0000 is valid JSON: a text block, a tool_use input and a tool_result
 * that hold it keep it (with the text after it) through the translation and
 * into the prompt, as on the OpenAI routes. */
LM_TEST(server_anthropic_keeps_nul) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    static const char body[] =
        "{\"model\":\"x\",\"max_tokens\":8,\"system\":\"s\\u0000ys\",\"messages\":["
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\\u0000y\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\","
        "\"input\":{\"p\":\"a\\u0000b\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"r\\u0000z\"}]}],"
        "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]}";
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, body, &r, &e) == 0);
    const json_t *u = json_object_get(json_array_get(r.messages, 1), "content");
    LM_CHECK(json_string_length(u) == 3 && !memcmp(json_string_value(u), "x\0y", 3));
    const json_t *t = json_object_get(json_array_get(r.messages, 3), "content");
    LM_CHECK(json_string_length(t) == 3 && !memcmp(json_string_value(t), "r\0z", 3));
    lm_chat_prompt p;
    LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
    LM_CHECK(memmem(p.text, p.len, "x\0y", 3) != NULL && memmem(p.text, p.len, "r\0z", 3) != NULL);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);
    srv_fx_close(&f);
}

LM_TEST(server_anthropic_tool_choice_sampling_thinking) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    const char *tools = "\"tools\":[{\"name\":\"a\",\"input_schema\":{\"type\":\"object\"}},"
                        "{\"name\":\"b\",\"input_schema\":{\"type\":\"object\"}}]";
    static const struct {
        const char *choice;
        srv_tool_choice want;
        bool one, has_tools;
        const char *name;
    } k_cases[] = {
        { "{\"type\":\"auto\"}", SRV_TOOLS_AUTO, false, true, NULL },
        { "{\"type\":\"auto\",\"disable_parallel_tool_use\":true}", SRV_TOOLS_AUTO, true, true, NULL },
        { "{\"type\":\"any\"}", SRV_TOOLS_REQUIRED, false, true, NULL },
        { "{\"type\":\"tool\",\"name\":\"b\"}", SRV_TOOLS_NAMED, false, true, "b" },
        { "{\"type\":\"none\"}", SRV_TOOLS_NONE, false, false, NULL },
    };
    char body[1024];
    for (size_t i = 0; i < LM_COUNT(k_cases); i++) {
        snprintf(body, sizeof body,
                 "{\"model\":\"x\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s,"
                 "\"tool_choice\":%s}", tools, k_cases[i].choice);
        srv_req r;
        srv_err e;
        LM_REQUIRE(parse(&f, body, &r, &e) == 0);
        LM_CHECK_MSG(r.tool_choice == k_cases[i].want, "%s", k_cases[i].choice);
        LM_CHECK_MSG(r.one_tool_call == k_cases[i].one, "%s", k_cases[i].choice);
        LM_CHECK_MSG((r.tools != NULL) == k_cases[i].has_tools, "%s", k_cases[i].choice);
        LM_CHECK(!k_cases[i].name || lm_streq(r.tool_name, k_cases[i].name));
        lm_chat_req cr = srv_chat_req(&r);
        LM_CHECK(cr.force_call == (k_cases[i].want == SRV_TOOLS_REQUIRED || k_cases[i].want == SRV_TOOLS_NAMED));
        srv_req_free(&r);
    }

    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, "{\"model\":\"x\",\"max_tokens\":7,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                         "\"temperature\":0.25,\"top_p\":0.5,\"top_k\":40,\"stop_sequences\":[\"END\",\"##\"],"
                         "\"stream\":true,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048}}",
                     &r, &e) == 0);
    LM_CHECK_NEAR(r.gp.sampling.temperature, 0.25, 1e-6);
    LM_CHECK_NEAR(r.gp.sampling.top_p, 0.5, 1e-6);
    LM_CHECK(r.gp.sampling.top_k == 40 && r.gp.max_tokens == 7 && r.stream);
    LM_CHECK(json_array_size(r.stop) == 2 && lm_streq(json_string_value(json_array_get(r.stop, 1)), "##"));
    LM_CHECK(json_is_true(json_object_get(r.template_kwargs, "enable_thinking")));
    LM_CHECK(r.gp.stop_tokens == f.s.stop_ids && r.gp.n_stop_tokens == f.s.n_stop_ids);
    srv_req_free(&r);
    LM_REQUIRE(parse(&f, "{\"model\":\"x\",\"max_tokens\":7,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                         "\"thinking\":{\"type\":\"disabled\"}}", &r, &e) == 0);
    LM_CHECK(json_is_false(json_object_get(r.template_kwargs, "enable_thinking")));
    srv_req_free(&r);
    LM_REQUIRE(parse(&f, "{\"model\":\"x\",\"max_tokens\":7,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
                     &r, &e) == 0);
    LM_CHECK(r.template_kwargs == NULL); /* no thinking field: the template's default */
    LM_CHECK_NEAR(r.gp.sampling.temperature, 1.0, 1e-6);
    srv_req_free(&r);
    /* max_tokens over the context is a cap (Claude Code asks for 32000) */
    LM_REQUIRE(parse(&f, "{\"model\":\"x\",\"max_tokens\":99999,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
                     &r, &e) == 0);
    LM_CHECK(r.max_tokens_set && r.gp.max_tokens == f.s.ctx);
    srv_req_free(&r);
    srv_fx_close(&f);
}

LM_TEST(server_anthropic_bad_requests) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]"
    static const struct {
        const char *body, *says;
    } k_cases[] = {
        { "{\"model\":\"x\"," MSG "}", "max_tokens: Field required" },
        { "{\"model\":\"x\",\"max_tokens\":0," MSG "}", "max_tokens" },
        { "{\"max_tokens\":5," MSG "}", "model" },
        { "{\"model\":\"x\",\"max_tokens\":5}", "messages: Field required" },
        { "{\"model\":\"x\",\"max_tokens\":5,\"messages\":[]}", "at least one" },
        { "{\"model\":\"x\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
          "\"source\":{\"type\":\"base64\",\"media_type\":\"image/png\",\"data\":\"AA==\"}}]}]}",
          "images are not supported" },
        { "{\"model\":\"x\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
          "\"tool_use_id\":\"t\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}]}",
          "messages.0.content.0.content.0: images are not supported" },
        { "{\"model\":\"x\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
          "tool_use_id" },
        { "{\"model\":\"x\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
          "{\"role\":\"assistant\",\"content\":\"partial\"}]}", "prefill" },
        { "{\"model\":\"x\",\"max_tokens\":5,\"messages\":[{\"role\":\"tool\",\"content\":\"q\"}]}", "'tool' is not one of" },
        { "{\"model\":\"x\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages.0.content" },
        { "{\"model\":\"x\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"server_tool_use\"}]}]}",
          "type 'server_tool_use' are not supported" },
        { "{\"model\":\"x\",\"max_tokens\":5,\"system\":[{\"type\":\"image\"}]," MSG "}", "system.0" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"temperature\":1.5}", "temperature: 1.5 is not in [0, 1]" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"top_k\":-1}", "top_k" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]}",
          "server tools ('web_search_20250305') are not supported" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"tools\":[{\"name\":\"a\"}]}", "input_schema" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"tool_choice\":{\"type\":\"any\"}}", "requires 'tools'" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"tools\":[{\"name\":\"a\",\"input_schema\":{}}],"
          "\"tool_choice\":{\"type\":\"tool\",\"name\":\"b\"}}", "'b' is not in 'tools'" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"tool_choice\":{\"type\":\"sometimes\"}}", "tool_choice.type" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"stop_sequences\":\"END\"}", "stop_sequences" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"thinking\":{\"type\":\"maybe\"}}", "thinking.type" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG ",\"metadata\":[]}", "metadata" },
        { "{\"model\":\"x\",\"max_tokens\":5," MSG, "not valid JSON" },
        { "[1]", "JSON object" },
    };
#undef MSG
    for (size_t i = 0; i < LM_COUNT(k_cases); i++) {
        srv_req r;
        srv_err e;
        int rc = parse(&f, k_cases[i].body, &r, &e);
        LM_CHECK_MSG(rc == -1 && e.status == 400, "case %zu accepted: %s", i, k_cases[i].body);
        LM_CHECK_MSG(strstr(e.msg, k_cases[i].says) != NULL, "case %zu: '%s' does not say '%s'", i, e.msg,
                     k_cases[i].says);
        json_t *j = srv_anth_error_json(&e);
        LM_CHECK(lm_streq(str_at(j, "type"), "error"));
        LM_CHECK(lm_streq(str_at(json_object_get(j, "error"), "type"), "invalid_request_error"));
        LM_CHECK(lm_streq(str_at(json_object_get(j, "error"), "message"), e.msg));
        LM_CHECK(json_object_size(j) == 2 && json_object_size(json_object_get(j, "error")) == 2);
        json_decref(j);
        srv_req_free(&r);
    }
    /* the error types Anthropic's clients branch on, by status */
    static const struct {
        int status;
        const char *type;
    } k_types[] = { { 400, "invalid_request_error" }, { 401, "authentication_error" }, { 403, "permission_error" },
                    { 404, "not_found_error" },       { 413, "request_too_large" },     { 429, "rate_limit_error" },
                    { 500, "api_error" },             { 503, "overloaded_error" },      { 405, "invalid_request_error" } };
    for (size_t i = 0; i < LM_COUNT(k_types); i++)
        LM_CHECK_MSG(lm_streq(srv_anth_error_type(k_types[i].status), k_types[i].type), "%d", k_types[i].status);
    srv_fx_close(&f);
}

/* count_tokens: the same body (max_tokens optional), the tokens of the
 * prompt generation would submit. */
LM_TEST(server_anthropic_count_tokens) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    srv_err e;
    int n_hist = 0, n_plain = 0, n_sys = 0;
    LM_REQUIRE(srv_anth_count_tokens(&f.s, k_history, strlen(k_history), &n_hist, &e) == 0);
    const char *plain = "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"hello there\"}]}";
    const char *sys = "{\"model\":\"x\",\"system\":\"Be brief.\",\"messages\":[{\"role\":\"user\",\"content\":\"hello there\"}]}";
    LM_REQUIRE(srv_anth_count_tokens(&f.s, plain, strlen(plain), &n_plain, &e) == 0);
    LM_REQUIRE(srv_anth_count_tokens(&f.s, sys, strlen(sys), &n_sys, &e) == 0);
    LM_CHECK(n_plain > 2 && n_sys > n_plain && n_hist > n_sys);

    /* equal to what the generation path tokenizes for the same body */
    srv_req r;
    lm_chat_prompt p;
    lm_tok_ids ids = { 0 };
    lm_err le = { { 0 } };
    LM_REQUIRE(parse(&f, k_history, &r, &e) == 0);
    LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
    LM_REQUIRE(lm_tokenizer_encode(f.tok, p.text, p.len, false, &ids, &le) == 0);
    LM_CHECK_MSG((int)ids.n == n_hist, "%zu vs %d", ids.n, n_hist);
    lm_tok_ids_free(&ids);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);

    int n = -1;
    LM_CHECK(srv_anth_count_tokens(&f.s, "{\"model\":\"x\"}", 13, &n, &e) == -1 && e.status == 400 && n == 0);
    srv_fx_close(&f);
}
