/* test_server_anthropic_http.c - /v1/messages over real HTTP: `lumen serve`
 * on the qwen3 fixture with an API key, driven by guard_util.h's client.
 * Checks x-api-key (Anthropic routes only) and Bearer auth, Anthropic error bodies with the right
 * status on the Anthropic routes only, anthropic-version / anthropic-beta
 * headers, a plain and a streamed message, and count_tokens equal to the
 * prompt tokens the generation reports. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "guard_util.h"
#include "lm_test.h"

#define KEY "sk-test-anthropic"
#define HDRS "anthropic-version: 2023-06-01\r\nanthropic-beta: interleaved-thinking-2025-05-14\r\n"

static const char *str_at(const json_t *j, const char *k) { return json_string_value(json_object_get(j, k)); }

/* An Anthropic error body of this type, and nothing else. */
static bool is_anth_error(const gu_resp *r, const char *type) {
    json_t *j = gu_json(r);
    const json_t *e = json_object_get(j, "error");
    bool ok = lm_streq(str_at(j, "type"), "error") && lm_streq(str_at(e, "type"), type) && str_at(e, "message") &&
              json_object_size(j) == 2;
    json_decref(j);
    return ok;
}

static const char *k_body = "{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":8,\"system\":\"Be brief.\","
                            "\"messages\":[{\"role\":\"user\",\"content\":\"Hello there\"}],"
                            "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]}";

LM_TEST(server_anthropic_http) {
    char *dir = lm_test_fixture_path("models/qwen3");
    if (!dir) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    gu_server s;
    int rc = gu_server_start(&s, dir, "--threads 1 --ctx 256 --api-key " KEY);
    free(dir);
    LM_REQUIRE(rc == 0);
    gu_resp r = { 0 };

    /* auth: none, a wrong x-api-key, the right one, Bearer */
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages", k_body, HDRS, &r) == 0);
    LM_CHECK(r.status == 401 && is_anth_error(&r, "authentication_error"));
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages", k_body, HDRS "x-api-key: wrong\r\n", &r) == 0);
    LM_CHECK(r.status == 401 && is_anth_error(&r, "authentication_error"));
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages", k_body, HDRS "x-api-key: " KEY "\r\n", &r) == 0);
    LM_CHECK_MSG(r.status == 200, "%d %s", r.status, r.body);
    json_t *msg = gu_json(&r);
    gu_resp_free(&r);
    LM_CHECK(!strncmp(str_at(msg, "id") ? str_at(msg, "id") : "", "msg_", 4));
    LM_CHECK(lm_streq(str_at(msg, "type"), "message") && lm_streq(str_at(msg, "role"), "assistant"));
    LM_CHECK(lm_streq(str_at(msg, "model"), "qwen3"));
    LM_CHECK(json_is_array(json_object_get(msg, "content")));
    const char *sr = str_at(msg, "stop_reason");
    LM_CHECK(lm_streq(sr, "max_tokens") || lm_streq(sr, "end_turn") || lm_streq(sr, "tool_use"));
    const json_t *u = json_object_get(msg, "usage");
    json_int_t in = json_integer_value(json_object_get(u, "input_tokens")),
               cached = json_integer_value(json_object_get(u, "cache_read_input_tokens"));
    LM_CHECK(json_integer_value(json_object_get(u, "output_tokens")) >= 1);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages/count_tokens", k_body, "Authorization: Bearer " KEY "\r\n", &r) == 0);
    json_t *count = gu_json(&r);
    LM_CHECK(r.status == 200 && json_object_size(count) == 1);
    LM_CHECK_MSG(json_integer_value(json_object_get(count, "input_tokens")) == in + cached, "count %lld, usage %lld + %lld",
                 (long long)json_integer_value(json_object_get(count, "input_tokens")), (long long)in, (long long)cached);
    json_decref(count);
    json_decref(msg);
    gu_resp_free(&r);

    /* the same request again, streamed: the prefix cache now serves part of it */
    char *sbody = strdup(k_body);
    sbody[strlen(sbody) - 1] = 0;
    char stream_body[1024];
    snprintf(stream_body, sizeof stream_body, "%s,\"stream\":true}", sbody);
    free(sbody);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages", stream_body, HDRS "x-api-key: " KEY "\r\n", &r) == 0);
    LM_CHECK(r.status == 200 && strstr(r.headers, "text/event-stream"));
    LM_CHECK(!strncmp(r.body, "event: message_start\ndata: {", 28));
    const char *md = strstr(r.body, "event: message_delta\ndata: ");
    LM_REQUIRE(md);
    json_t *delta = json_loadb(md + 27, strcspn(md + 27, "\n"), 0, NULL);
    const json_t *du = json_object_get(delta, "usage");
    LM_CHECK(json_integer_value(json_object_get(du, "input_tokens")) +
                 json_integer_value(json_object_get(du, "cache_read_input_tokens")) == in + cached);
    json_decref(delta);
    static const char k_end[] = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    size_t bl = strlen(r.body);
    LM_CHECK(bl > sizeof k_end && !strcmp(r.body + bl - (sizeof k_end - 1), k_end));
    gu_resp_free(&r);

    /* max_tokens past the context (256) is cut to what the prompt leaves */
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages",
                       "{\"model\":\"m\",\"max_tokens\":32000,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
                       "x-api-key: " KEY "\r\n", &r) == 0);
    json_t *big = gu_json(&r);
    const json_t *bu = json_object_get(big, "usage");
    LM_CHECK_MSG(r.status == 200, "%d %s", r.status, r.body);
    LM_CHECK(json_integer_value(json_object_get(bu, "input_tokens")) + json_integer_value(json_object_get(bu, "cache_read_input_tokens")) +
                 json_integer_value(json_object_get(bu, "output_tokens")) <= 256);
    json_decref(big);
    gu_resp_free(&r);

    /* Anthropic errors on the Anthropic routes: 400, 405; OpenAI's elsewhere */
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages", "{\"model\":\"x\",\"messages\":[]}", "x-api-key: " KEY "\r\n", &r) == 0);
    LM_CHECK(r.status == 400 && is_anth_error(&r, "invalid_request_error"));
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "GET", "/v1/messages", NULL, "x-api-key: " KEY "\r\n", &r) == 0);
    LM_CHECK(r.status == 405 && is_anth_error(&r, "invalid_request_error"));
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages/count_tokens", "{}", NULL, &r) == 0);
    LM_CHECK(r.status == 401 && is_anth_error(&r, "authentication_error"));
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", "{}", NULL, &r) == 0);
    json_t *oe = gu_json(&r);
    LM_CHECK(r.status == 401 && json_is_object(json_object_get(oe, "error")) && !json_object_get(oe, "type"));
    json_decref(oe);
    gu_resp_free(&r);
    /* x-api-key is Anthropic's: the OpenAI routes keep Bearer only */
    LM_REQUIRE(gu_http(s.port, "GET", "/v1/models", NULL, "x-api-key: " KEY "\r\n", &r) == 0);
    LM_CHECK(r.status == 401);
    gu_resp_free(&r);

    if (lm_t_->failed) gu_server_dump_log(&s);
    LM_CHECK(gu_server_stop(&s) == 0);
}
