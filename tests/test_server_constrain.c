/* test_server_constrain.c - structured output and forced tool calls through
 * the real server on the demo model (issue #32): response_format outputs
 * parse and validate (greedy and sampled, streamed and not), bad schemas
 * and grammars are 400s that name the construct, greedy outputs are the
 * same alone, batched and from the prefix cache, and forced tool calls in
 * both formats (Hermes JSON, Qwen3.5 XML) are parsed calls whose arguments
 * validate against the tool's parameters. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "guard_util.h"
#include "lm_test.h"
#include "schema_check.h"
#include "test_util.h"

static json_t *load_schema(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/schemas/%s.json", name);
    return json_load_file(path, 0, NULL);
}

/* POSTs body (a JSON object, stolen) to path; the response as JSON, status in *status. */
static json_t *post(int port, const char *path, json_t *body, int *status) {
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    gu_resp r = { 0 };
    json_t *out = NULL;
    *status = -1;
    if (!gu_http(port, "POST", path, text, "Content-Type: application/json\r\n", &r)) {
        *status = r.status;
        out = gu_json(&r);
    }
    gu_resp_free(&r);
    free(text);
    return out;
}

static json_t *chat_body(const char *user, int max_tokens, double temp, int seed) {
    return json_pack("{s:[{s:s,s:s}],s:i,s:f,s:i,s:{s:b}}", "messages", "role", "user", "content", user, "max_tokens",
                     max_tokens, "temperature", temp, "seed", seed, "chat_template_kwargs", "enable_thinking", 0);
}

static const char *msg_content(const json_t *resp) {
    return json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "message"), "content"));
}

static const char *finish_of(const json_t *resp, int i) {
    return json_string_value(json_object_get(json_array_get(json_object_get(resp, "choices"), i), "finish_reason"));
}

LM_TEST(server_structured_output_on_demo) {
    gu_server s;
    if (gu_server_start(&s, gu_demo_dir(), "--threads 1 --cache-ram 64M")) {
        gu_server_dump_log(&s);
        LM_REQUIRE(!"the demo server started");
    }
    static const char *names[] = { "weather_tool", "event_oneof", "agent_edit_tool", "github_issue" };
    int stopped = 0, runs = 0;
    for (size_t i = 0; i < LM_COUNT(names); i++) {
        json_t *schema = load_schema(names[i]);
        LM_REQUIRE(schema);
        for (int seed = 0; seed < 3; seed++) {
            json_t *b = chat_body("Answer in JSON.", 400, seed ? 1.0 : 0.0, seed);
            json_object_set_new(b, "response_format",
                                json_pack("{s:s,s:{s:s,s:O,s:b}}", "type", "json_schema", "json_schema", "name", names[i],
                                          "schema", schema, "strict", 1));
            int st;
            json_t *r = post(s.port, "/v1/chat/completions", b, &st);
            LM_CHECK_MSG(st == 200, "%s seed %d: status %d", names[i], seed, st);
            runs++;
            const char *c = msg_content(r);
            if (lm_streq(finish_of(r, 0), "stop")) {
                stopped++;
                json_t *v = c ? json_loads(c, 0, NULL) : NULL;
                LM_CHECK_MSG(v && schema_valid(schema, schema, v), "%s seed %d: not valid: %s", names[i], seed, c);
                json_decref(v);
            }
            json_decref(r);
        }
        json_decref(schema);
    }
    LM_CHECK_MSG(stopped * 2 >= runs, "only %d of %d runs ended before max_tokens", stopped, runs);

    /* json_object on /v1/completions; regex and grammar on chat */
    json_t *b = json_pack("{s:s,s:i,s:f,s:{s:s}}", "prompt", "def f(x):", "max_tokens", 300, "temperature", 0.0,
                          "response_format", "type", "json_object");
    int st;
    json_t *r = post(s.port, "/v1/completions", b, &st);
    const char *text = json_string_value(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "text"));
    json_t *v = text ? json_loads(text, 0, NULL) : NULL;
    LM_CHECK_MSG(st == 200 && (json_is_object(v) || !lm_streq(finish_of(r, 0), "stop")), "completions json_object: %s",
                 text);
    json_decref(v);
    json_decref(r);
    b = chat_body("Code?", 50, 1.0, 7);
    json_object_set_new(b, "response_format", json_pack("{s:s,s:s}", "type", "regex", "regex", "[A-Z]{2}-[0-9]{3,5}"));
    r = post(s.port, "/v1/chat/completions", b, &st);
    const char *c = msg_content(r);
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR) "^[A-Z]{2}-[0-9]{3,5}$", PCRE2_ZERO_TERMINATED, 0, &err, &off, NULL);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    LM_CHECK_MSG(st == 200 && c && pcre2_match(re, (PCRE2_SPTR)c, strlen(c), 0, 0, md, NULL) >= 0, "regex: %s", c);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    json_decref(r);
    b = chat_body("Yes or no?", 20, 1.0, 3);
    json_object_set_new(b, "response_format",
                        json_pack("{s:s,s:s}", "type", "grammar", "grammar", "root ::= (\"yes\" | \"no\") \"!\"\n"));
    r = post(s.port, "/v1/chat/completions", b, &st);
    c = msg_content(r);
    LM_CHECK_MSG(st == 200 && (lm_streq(c, "yes!") || lm_streq(c, "no!")), "grammar: %s", c);
    json_decref(r);

    /* properties come in the order the schema declares them, not sorted */
    b = chat_body("Flags as JSON.", 80, 0.0, 0);
    json_object_set_new(b, "response_format",
                        json_loads("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"o\",\"schema\":{\"type\":"
                                   "\"object\",\"properties\":{\"zeta\":{\"type\":\"boolean\"},\"alpha\":{\"enum\":"
                                   "[1,2]},\"mid\":{\"type\":\"boolean\"}},\"required\":[\"zeta\",\"alpha\",\"mid\"],"
                                   "\"additionalProperties\":false}}}", 0, NULL));
    r = post(s.port, "/v1/chat/completions", b, &st);
    c = msg_content(r);
    const char *kz = c ? strstr(c, "\"zeta\"") : NULL, *ka = c ? strstr(c, "\"alpha\"") : NULL;
    const char *km = c ? strstr(c, "\"mid\"") : NULL;
    LM_CHECK_MSG(st == 200 && kz && ka && km && kz < ka && ka < km, "declared order: %d %s", st, c);
    json_decref(r);

    /* the Responses API's text.format */
    json_t *ws = load_schema("weather_tool");
    b = json_pack("{s:s,s:i,s:f,s:{s:{s:s,s:s,s:O}},s:{s:s}}", "input", "Weather as JSON.", "max_output_tokens", 200,
                  "temperature", 0.0, "text", "format", "type", "json_schema", "name", "w", "schema", ws, "reasoning",
                  "effort", "none");
    r = post(s.port, "/v1/responses", b, &st);
    const char *out_text = NULL;
    const json_t *items = json_object_get(r, "output");
    for (size_t i = 0; i < json_array_size(items); i++) {
        const json_t *it = json_array_get(items, i);
        if (lm_streq(json_string_value(json_object_get(it, "type")), "message"))
            out_text = json_string_value(json_object_get(json_array_get(json_object_get(it, "content"), 0), "text"));
    }
    v = out_text ? json_loads(out_text, 0, NULL) : NULL;
    LM_CHECK_MSG(st == 200 && v && schema_valid(ws, ws, v), "responses text.format: %d %s", st, out_text);
    json_decref(v);
    json_decref(r);
    json_decref(ws);

    /* greedy: alone, three batched choices, again from the prefix cache,
     * and streamed: the same text */
    json_t *schema = load_schema("weather_tool");
    char *first = NULL;
    for (int k = 0; k < 4; k++) {
        b = chat_body("Weather as JSON.", 120, 0.0, 0);
        json_object_set_new(b, "response_format",
                            json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema", "json_schema", "name", "w", "schema", schema));
        if (k == 1) json_object_set_new(b, "n", json_integer(3));
        if (k == 3) json_object_set_new(b, "stream", json_true());
        if (k < 3) {
            r = post(s.port, "/v1/chat/completions", b, &st);
            for (int i = 0; i < (k == 1 ? 3 : 1); i++) {
                const json_t *m = json_object_get(json_array_get(json_object_get(r, "choices"), i), "message");
                const char *t = json_string_value(json_object_get(m, "content"));
                if (!first && t) first = strdup(t);
                LM_CHECK_MSG(lm_streq(t, first), "greedy run %d choice %d: '%s' vs '%s'", k, i, t, first);
            }
            json_decref(r);
        } else {
            char *body = json_dumps(b, JSON_COMPACT);
            json_decref(b);
            gu_resp sr = { 0 };
            LM_CHECK(!gu_http(s.port, "POST", "/v1/chat/completions", body, "Content-Type: application/json\r\n", &sr));
            int n_done = 0, n_bad = 0;
            json_t *chunks = gu_sse_chunks(&sr, &n_done, &n_bad);
            char joined[8192] = "";
            for (size_t i = 0; i < json_array_size(chunks); i++) {
                const json_t *d = json_object_get(json_array_get(json_object_get(json_array_get(chunks, i), "choices"), 0), "delta");
                const char *t = json_string_value(json_object_get(d, "content"));
                if (t) strncat(joined, t, sizeof joined - strlen(joined) - 1);
            }
            LM_CHECK_MSG(lm_streq(joined, first), "streamed '%s' vs '%s'", joined, first);
            json_decref(chunks);
            gu_resp_free(&sr);
            free(body);
        }
    }
    free(first);
    json_decref(schema);
    LM_CHECK(gu_metric(s.port, "lumen_grammar_masks_total") > 0);
    /* masks computed during the forwards (the helper's, and the look-ahead's
     * chains: on by default on a GPU only) are among the masks; without
     * them every mask's time is spent after the forwards */
    const double ahead = gu_metric(s.port, "lumen_grammar_masks_ahead_total"),
                 chained = gu_metric(s.port, "lumen_grammar_masks_chained_total");
    LM_CHECK(ahead >= 0 && chained >= 0 && ahead + chained <= gu_metric(s.port, "lumen_grammar_masks_total"));
    const double wait_s = gu_metric(s.port, "lumen_grammar_mask_wait_seconds_total");
    LM_CHECK(wait_s >= 0);
    if (ahead == 0 && chained == 0)
        LM_CHECK(fabs(wait_s - gu_metric(s.port, "lumen_grammar_mask_seconds_total")) <= 2e-6);
    LM_CHECK(gu_metric(s.port, "lumen_grammar_fill_tokens_total") > 0);
    LM_CHECK(gu_metric(s.port, "lumen_grammar_compiles_total") >= 4);
    LM_CHECK(gu_metric(s.port, "lumen_grammar_cache_hits_total") >= 3);
    int rc = gu_server_stop(&s);
    LM_CHECK_MSG(rc == 0, "server exit status %d", rc);
}

LM_TEST(server_structured_output_refusals) {
    gu_server s;
    if (gu_server_start(&s, gu_demo_dir(), "--threads 1")) {
        gu_server_dump_log(&s);
        LM_REQUIRE(!"the demo server started");
    }
    static const struct {
        const char *rf, *param, *says;
    } bad[] = {
        { "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\",\"not\":{}}}}", "response_format", "'not'" },
        { "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"string\",\"pattern\":\"(?=a)b\"}}}", "response_format", "lookaround" },
        { "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}", "response_format", "schema" },
        { "{\"type\":\"grammar\",\"grammar\":\"root ::= x\\n\"}", "response_format", "'x' is used but never defined" },
        { "{\"type\":\"regex\",\"regex\":\"(a)\\\\1\"}", "response_format", "backreferences" },
        { "{\"type\":\"xml\"}", "response_format", "'xml'" },
        { "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\","
          "\"minLength\":2}]}}}", "response_format", "oneOf branches 0 and 1 may both match" },
    };
    for (size_t i = 0; i < LM_COUNT(bad); i++) {
        json_t *b = chat_body("hi", 10, 0, 0);
        json_object_set_new(b, "response_format", json_loads(bad[i].rf, 0, NULL));
        int st;
        json_t *r = post(s.port, "/v1/chat/completions", b, &st);
        const json_t *err = json_object_get(r, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        LM_CHECK_MSG(st == 400 && lm_streq(json_string_value(json_object_get(err, "param")), bad[i].param) && msg &&
                         strstr(msg, bad[i].says),
                     "%s: %d %s", bad[i].rf, st, msg);
        json_decref(r);
    }
    json_t *b = chat_body("hi", 10, 0, 0);
    json_object_set_new(b, "tools", json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                                               "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                                               "\"format\":\"ipv6\"}}}}}]", 0, NULL));
    json_object_set_new(b, "tool_choice", json_string("required"));
    int st;
    json_t *r = post(s.port, "/v1/chat/completions", b, &st);
    const char *msg = json_string_value(json_object_get(json_object_get(r, "error"), "message"));
    LM_CHECK_MSG(st == 400 && msg && strstr(msg, "ipv6") && strstr(msg, "'f'"), "tools: %d %s", st, msg);
    json_decref(r);
    int rc = gu_server_stop(&s);
    LM_CHECK_MSG(rc == 0, "server exit status %d", rc);
}

/* ---- forced tool calls ---- */

static const char k_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\",\"maxLength\":24},\"unit\":{\"enum\":[\"c\",\"f\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,"
    "\"maximum\":7}},\"required\":[\"city\",\"days\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"number\"},\"exact\":{\"type\":\"boolean\"}},\"required\":[\"a\",\"b\"]}}}]";

/* Every way of forcing a call gives parsed calls whose arguments validate. */
static void forced_calls(lm_test_ctx *lm_t_, int port, const char *format) {
    json_t *tools = json_loads(k_tools, 0, NULL);
    static const char *choices[] = { "\"required\"", "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}",
                                     "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}" };
    for (size_t i = 0; i < LM_COUNT(choices); i++)
        for (int seed = 0; seed < 3; seed++) {
            json_t *b = chat_body("Weather in Paris, then add 2 and 3.", 300, seed ? 1.0 : 0.0, seed);
            json_object_set(b, "tools", tools);
            json_object_set_new(b, "tool_choice", json_loads(choices[i], JSON_DECODE_ANY, NULL));
            json_object_set_new(b, "parallel_tool_calls", json_false());
            int st;
            json_t *r = post(port, "/v1/chat/completions", b, &st);
            const json_t *m = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
            const json_t *calls = json_object_get(m, "tool_calls");
            LM_CHECK_MSG(st == 200 && json_array_size(calls) == 1 && lm_streq(finish_of(r, 0), "tool_calls"),
                         "%s %s seed %d: %d calls, finish %s, content %s", format, choices[i], seed,
                         (int)json_array_size(calls), finish_of(r, 0), json_string_value(json_object_get(m, "content")));
            const json_t *fn = json_object_get(json_array_get(calls, 0), "function");
            const char *name = json_string_value(json_object_get(fn, "name"));
            const char *args = json_string_value(json_object_get(fn, "arguments"));
            json_t *a = args ? json_loads(args, 0, NULL) : NULL;
            const json_t *params = NULL;
            for (size_t t = 0; t < json_array_size(tools); t++) {
                const json_t *f = json_object_get(json_array_get(tools, t), "function");
                if (lm_streq(json_string_value(json_object_get(f, "name")), name)) params = json_object_get(f, "parameters");
            }
            LM_CHECK_MSG(params && a && schema_valid(params, params, a), "%s %s seed %d: %s(%s)", format, choices[i], seed,
                         name, args);
            if (i > 0) LM_CHECK(lm_streq(name, i == 1 ? "add" : "get_weather"));
            json_decref(a);
            json_decref(r);
        }
    json_decref(tools);
}

LM_TEST(server_forced_tool_calls_hermes) {
    gu_server s;
    if (gu_server_start(&s, gu_demo_dir(), "--threads 1")) {
        gu_server_dump_log(&s);
        LM_REQUIRE(!"the demo server started");
    }
    forced_calls(lm_t_, s.port, "hermes");
    int rc = gu_server_stop(&s);
    LM_CHECK_MSG(rc == 0, "server exit status %d", rc);
}

/* A Qwen3.5-style template: calls as <function=...> blocks. */
static const char k_xml_template[] =
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}. Call one as "
    "<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "{%- endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n";

LM_TEST(server_forced_tool_calls_xml) {
    char *dir = lm_tu_mkdir("xml_template");
    LM_REQUIRE(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    free(dir);
    LM_REQUIRE(lm_tu_write(path, k_xml_template, strlen(k_xml_template)) == 0);
    char extra[700];
    snprintf(extra, sizeof extra, "--threads 1 --chat-template %s", path);
    gu_server s;
    if (gu_server_start(&s, gu_demo_dir(), extra)) {
        gu_server_dump_log(&s);
        LM_REQUIRE(!"the demo server started");
    }
    forced_calls(lm_t_, s.port, "xml");
    int rc = gu_server_stop(&s);
    LM_CHECK_MSG(rc == 0, "server exit status %d", rc);
}
