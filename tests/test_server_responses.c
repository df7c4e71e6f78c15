/* test_server_responses.c - POST /v1/responses without HTTP or an engine:
 * the request translation (input items, tools, tool_choice, reasoning, bad
 * input with the field that is wrong), the events and the response object
 * built from token events (text, reasoning + text + a call, a length cut, an
 * engine error, reasoning summaries), the same answer however its text is split into tokens, and
 * the store behind previous_response_id (chaining and eviction).
 *
 * Token events are made from the qwen3 fixture's tokenizer, as
 * test_server_output.c does for chat completions. */
#define _GNU_SOURCE /* memmem */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "server/responses.h"
#include "server_fixture.h"

typedef srv_fx fx;

/* the shared fixture plus a small response store */
static bool fx_open(fx *f) {
    if (!srv_fx_open(f, "qwen3", 256)) return false;
    f->s.resp_store = srv_resp_store_create(8, 1 << 20);
    return true;
}

static void fx_close(fx *f) {
    srv_resp_store_free(f->s.resp_store);
    srv_fx_close(f);
}

#define SKIP_NO_FIXTURE() LM_SKIP("../shared/fixtures/models/qwen3 not found")

/* Opens the fixture as f, or skips the test: without the fixture, or when
 * its template does not think. */
#define FX_OPEN_THINKING(f)                                             \
    fx f;                                                               \
    do {                                                                \
        if (!fx_open(&f)) SKIP_NO_FIXTURE();                            \
        if (!f.s.chat || !f.s.chat->think) {                            \
            fx_close(&f);                                               \
            LM_SKIP("the qwen3 fixture's template does not think");     \
        }                                                               \
    } while (0)

static int parse(fx *f, const char *body, srv_resp_req *q, srv_req *r, srv_err *e) {
    memset(e, 0, sizeof *e);
    return srv_resp_parse(&f->s, body, strlen(body), q, r, e);
}

/* ---- request translation ---------------------------------------------------------------- */

static const char *msg_field(const srv_req *r, size_t i, const char *key) {
    return json_string_value(json_object_get(json_array_get(r->messages, i), key));
}

LM_TEST(server_responses_translate_input_items) {
    fx f;
    if (!fx_open(&f)) SKIP_NO_FIXTURE();
    srv_resp_req q;
    srv_req r;
    srv_err e;
    /* a string input: one user message; instructions: the system message */
    LM_REQUIRE(parse(&f, "{\"model\":\"qwen3\",\"instructions\":\"Be brief.\",\"input\":\"Hi\"}", &q, &r, &e) == 0);
    LM_CHECK(r.kind == SRV_CHAT && json_array_size(r.messages) == 2);
    LM_CHECK(lm_streq(msg_field(&r, 0, "role"), "system"));
    LM_CHECK(lm_streq(msg_field(&r, 1, "role"), "user") && lm_streq(msg_field(&r, 1, "content"), "Hi"));
    LM_CHECK(json_array_size(q.items) == 1 && q.store && !q.stream);
    LM_CHECK(lm_streq(json_string_value(json_object_get(q.echo, "instructions")), "Be brief."));
    srv_resp_req_free(&q);
    srv_req_free(&r);

    /* every item kind: developer messages join instructions; reasoning goes
     * to the next assistant message; a call joins the assistant message of
     * its turn; an output is a tool message */
    const char *body =
        "{\"instructions\":\"A\",\"stream\":true,\"input\":["
        "{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"B\"}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"u1\"},{\"type\":\"input_text\",\"text\":\"u2\"}]},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hmm\"}]},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Let me look.\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"get_time\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":[{\"type\":\"input_text\",\"text\":\"noon\"}]},"
        "{\"type\":\"reasoning\",\"id\":\"rs_2\",\"summary\":[],\"encrypted_content\":\"xyz\"},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":\"thanks\"}]}";
    LM_REQUIRE(parse(&f, body, &q, &r, &e) == 0);
    LM_CHECK(q.stream && r.stream);
    LM_REQUIRE(json_array_size(r.messages) == 6);
    json_t *sys = json_object_get(json_array_get(r.messages, 0), "content");
    LM_CHECK(json_array_size(sys) == 2 && lm_streq(json_string_value(json_object_get(json_array_get(sys, 1), "text")), "B"));
    LM_CHECK(json_array_size(json_object_get(json_array_get(r.messages, 1), "content")) == 2);
    json_t *asst = json_array_get(r.messages, 2);
    LM_CHECK(lm_streq(msg_field(&r, 2, "role"), "assistant"));
    LM_CHECK(lm_streq(msg_field(&r, 2, "reasoning_content"), "hmm"));
    json_t *calls = json_object_get(asst, "tool_calls");
    LM_REQUIRE(json_array_size(calls) == 2);
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_array_get(calls, 0), "id")), "call_1"));
    json_t *fn = json_object_get(json_array_get(calls, 1), "function");
    LM_CHECK(lm_streq(json_string_value(json_object_get(fn, "name")), "get_time"));
    LM_CHECK(lm_streq(msg_field(&r, 3, "role"), "tool") && lm_streq(msg_field(&r, 3, "tool_call_id"), "call_1"));
    LM_CHECK(lm_streq(msg_field(&r, 3, "content"), "sunny"));
    LM_CHECK(lm_streq(msg_field(&r, 4, "content"), "noon"));
    LM_CHECK(lm_streq(msg_field(&r, 5, "role"), "user") && !json_object_get(json_array_get(r.messages, 5), "reasoning_content"));
    /* the template renders it: the call and its output are in the prompt */
    lm_chat_prompt p;
    LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
    LM_CHECK(strstr(p.text, "get_weather") && strstr(p.text, "sunny") && strstr(p.text, "noon"));
    lm_chat_prompt_free(&p);
    srv_resp_req_free(&q);
    srv_req_free(&r);
    fx_close(&f);
}

/* U+0000 is valid JSON: instructions, input text, a call's arguments and a
 * call's output that hold it reach the prompt whole, as on the chat route. */
LM_TEST(server_responses_keeps_nul) {
    fx f;
    if (!fx_open(&f)) SKIP_NO_FIXTURE();
    srv_resp_req q;
    srv_req r;
    srv_err e;
    const char *body =
        "{\"instructions\":\"s\\u0000ys\",\"input\":["
        "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"x\\u0000y\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\",\"arguments\":\"{\\\"p\\\":\\\"a\\\\u0000b\\\"}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"r\\u0000z\"}]}";
    LM_REQUIRE(parse(&f, body, &q, &r, &e) == 0);
    lm_chat_prompt p;
    LM_REQUIRE(srv_chat_render(&f.s, &r, &p, &e) == 0);
    LM_CHECK_MSG(memmem(p.text, p.len, "s\0ys", 4) && memmem(p.text, p.len, "x\0y", 3) &&
                     memmem(p.text, p.len, "r\0z", 3),
                 "%.*s", (int)p.len, p.text);
    lm_chat_prompt_free(&p);
    srv_resp_req_free(&q);
    srv_req_free(&r);
    fx_close(&f);
}

LM_TEST(server_responses_translate_tools_and_options) {
    fx f;
    if (!fx_open(&f)) SKIP_NO_FIXTURE();
    srv_resp_req q;
    srv_req r;
    srv_err e;
    const char *body =
        "{\"input\":\"hi\",\"max_output_tokens\":33,\"temperature\":0.5,\"top_p\":0.9,\"store\":false,"
        "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"d\",\"strict\":true,"
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}},"
        "{\"type\":\"web_search\"},{\"type\":\"namespace\",\"name\":\"ns\",\"tools\":[]}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"get_weather\"},\"parallel_tool_calls\":false,"
        "\"reasoning\":{\"effort\":\"none\",\"summary\":\"auto\"},\"text\":{\"format\":{\"type\":\"text\"}},"
        "\"include\":[\"reasoning.encrypted_content\"],\"truncation\":\"auto\",\"user\":\"u\",\"metadata\":{\"k\":\"v\"},"
        "\"prompt_cache_key\":\"abc\"}";
    LM_REQUIRE(parse(&f, body, &q, &r, &e) == 0);
    LM_CHECK(!q.store);
    LM_CHECK(r.max_tokens_set && r.gp.max_tokens == 33);
    LM_CHECK_NEAR(r.gp.sampling.temperature, 0.5, 1e-6);
    LM_CHECK_NEAR(r.gp.sampling.top_p, 0.9, 1e-6);
    LM_REQUIRE(json_array_size(r.tools) == 1); /* web_search and namespace are left out */
    json_t *fn = json_object_get(json_array_get(r.tools, 0), "function");
    LM_CHECK(lm_streq(json_string_value(json_object_get(fn, "name")), "get_weather"));
    LM_CHECK(json_is_object(json_object_get(fn, "parameters")) && !json_object_get(fn, "strict"));
    LM_CHECK(r.tool_choice == SRV_TOOLS_NAMED && lm_streq(r.tool_name, "get_weather"));
    if (f.s.chat && f.s.chat->think) /* effort none: the thinking switch off */
        LM_CHECK(json_is_false(json_object_get(r.template_kwargs, "enable_thinking")));
    /* echoed as given */
    LM_CHECK(json_integer_value(json_object_get(q.echo, "max_output_tokens")) == 33);
    LM_CHECK(json_array_size(json_object_get(q.echo, "tools")) == 3);
    LM_CHECK(json_is_false(json_object_get(q.echo, "parallel_tool_calls")));
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_object_get(q.echo, "reasoning"), "effort")), "none"));
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_object_get(q.echo, "metadata"), "k")), "v"));
    srv_resp_req_free(&q);
    srv_req_free(&r);

    /* effort high leaves thinking on; tool_choice required and none */
    LM_REQUIRE(parse(&f, "{\"input\":\"hi\",\"reasoning\":{\"effort\":\"high\"},\"tool_choice\":\"required\","
                         "\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}", &q, &r, &e) == 0);
    LM_CHECK(r.tool_choice == SRV_TOOLS_REQUIRED);
    if (f.s.chat && f.s.chat->think) LM_CHECK(json_is_true(json_object_get(r.template_kwargs, "enable_thinking")));
    srv_resp_req_free(&q);
    srv_req_free(&r);
    LM_REQUIRE(parse(&f, "{\"input\":\"hi\",\"tool_choice\":\"none\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}",
                     &q, &r, &e) == 0);
    LM_CHECK(r.tools == NULL);
    srv_resp_req_free(&q);
    srv_req_free(&r);
    fx_close(&f);
}

static void expect_error(lm_test_ctx *lm_t_, fx *f, const char *body, int status, const char *param, const char *code) {
    srv_resp_req q;
    srv_req r;
    srv_err e;
    int rc = parse(f, body, &q, &r, &e);
    LM_CHECK_MSG(rc == -1 && e.status == status && lm_streq(e.param, param) && (!code || lm_streq(e.code, code)),
                 "%s -> rc %d status %d param '%s' code %s msg '%s'", body, rc, e.status, e.param,
                 e.code ? e.code : "null", e.msg);
    srv_resp_req_free(&q);
    srv_req_free(&r);
}

LM_TEST(server_responses_bad_requests) {
    fx f;
    if (!fx_open(&f)) SKIP_NO_FIXTURE();
    expect_error(lm_t_, &f, "{}", 400, "input", NULL);
    expect_error(lm_t_, &f, "{\"input\":[]}", 400, "input", NULL);
    expect_error(lm_t_, &f, "{\"input\":5}", 400, "input", NULL);
    expect_error(lm_t_, &f, "{\"input\":[{\"type\":\"message\",\"role\":\"user\",\"content\":\"a\"},{\"type\":\"web_search_call\"}]}",
                 400, "input[1].type", NULL);
    expect_error(lm_t_, &f, "{\"input\":[{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}",
                 400, "input[0].content[0]", NULL);
    expect_error(lm_t_, &f, "{\"input\":[{\"type\":\"message\",\"role\":\"robot\",\"content\":\"a\"}]}", 400,
                 "input[0].role", NULL);
    expect_error(lm_t_, &f, "{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}", 400,
                 "input[0].call_id", NULL);
    expect_error(lm_t_, &f, "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":7}]}", 400,
                 "input[0].output", NULL);
    expect_error(lm_t_, &f, "{\"input\":[\"x\"]}", 400, "input[0]", NULL);
    expect_error(lm_t_, &f, "{\"input\":[{\"role\":\"user\"}]}", 400, "input[0].content", NULL);
    expect_error(lm_t_, &f, "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", 400,
                 "input[0].output", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"tools\":[{\"type\":\"function\"}]}", 400, "tools[0].name", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"tools\":[{\"type\":\"web_search\"}],\"tool_choice\":{\"type\":\"web_search\"}}",
                 400, "tool_choice", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"tools\":[{\"type\":\"web_search\"}],\"tool_choice\":\"required\"}", 400,
                 "tool_choice", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
                            "\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}}", 400, "tool_choice", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"text\":{\"format\":{\"type\":\"grammar\"}}}", 400, "text.format", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\","
                            "\"schema\":{\"type\":\"object\",\"not\":{}}}}}", 400, "response_format", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"max_output_tokens\":0}", 400, "max_output_tokens", NULL);
    {   /* past the context is a cap, cut to the room when the prompt is known (generate.c) */
        srv_resp_req q;
        srv_req r;
        srv_err e;
        LM_CHECK(parse(&f, "{\"input\":\"a\",\"max_output_tokens\":100000}", &q, &r, &e) == 0);
        LM_CHECK(r.max_tokens_set && r.gp.max_tokens == 100000);
        srv_resp_req_free(&q);
        srv_req_free(&r);
    }
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"temperature\":3}", 400, "temperature", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"reasoning\":{\"effort\":\"huge\"}}", 400, "reasoning.effort", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"store\":\"yes\"}", 400, "store", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"background\":true}", 400, "background", NULL);
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"model\":\"gpt-5\"}", 404, "model", "model_not_found");
    expect_error(lm_t_, &f, "{\"input\":\"a\",\"previous_response_id\":\"resp_nope\"}", 404, "previous_response_id",
                 "previous_response_not_found");
    fx_close(&f);
}

/* ---- output: one answer through srv_out and the builder --------------------------------- */

/* An answer's events (each checked as it is read) and its response object. */
typedef struct run {
    json_t *events;   /* the data objects, in order */
    json_t *response; /* srv_resp_build_response after the end */
    srv_out o;
    srv_resp_req q;
    srv_req r;
    srv_resp_build *b;
} run;

static void run_free(run *u) {
    json_decref(u->events);
    json_decref(u->response);
    srv_resp_build_free(u->b);
    srv_out_free(&u->o);
    srv_resp_req_free(&u->q);
    srv_req_free(&u->r);
}

static void feed_token(srv_out *o, int32_t id) {
    lm_token_event ev = { .token = id, .has_token = true };
    srv_out_event(o, &ev);
}

/* Feeds the chunks (each tokenized on its own), then a final event. */
static void feed_chunks(fx *f, srv_out *o, const char *const *chunks, int n, lm_finish finish) {
    int n_gen = 0;
    for (int c = 0; c < n; c++) {
        lm_tok_ids ids = { 0 };
        lm_err e = { { 0 } };
        LM_ASSERT(lm_tokenizer_encode(f->tok, chunks[c], strlen(chunks[c]), false, &ids, &e) == 0);
        for (size_t i = 0; i < ids.n; i++) feed_token(o, ids.ids[i]);
        n_gen += (int)ids.n;
        lm_tok_ids_free(&ids);
    }
    lm_token_event fin = { .done = true, .finish = finish, .n_prompt = 10, .n_cached = 4, .n_generated = n_gen };
    if (finish == LM_FINISH_ERROR) fin.error = "the backend failed";
    srv_out_event(o, &fin);
}

/* The stream's "event: T\ndata: J\n\n" blocks as objects; checks that T is
 * J.type and that sequence numbers count from 0. */
static json_t *read_events(lm_test_ctx *lm_t_, const char *sse, size_t n) {
    json_t *arr = json_array();
    const char *p = sse, *end = sse + n;
    while (p < end) {
        const char *nl = strstr(p, "\n\n");
        LM_CHECK(nl != NULL);
        if (!nl) break;
        LM_CHECK(!strncmp(p, "event: ", 7));
        const char *eol = memchr(p, '\n', (size_t)(nl - p));
        LM_CHECK(eol && !strncmp(eol + 1, "data: ", 6));
        if (!eol) break;
        json_t *j = json_loadb(eol + 7, (size_t)(nl - eol - 7), 0, NULL);
        LM_CHECK(j != NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        LM_CHECK_MSG(type && strlen(type) == (size_t)(eol - p - 7) && !strncmp(p + 7, type, strlen(type)),
                     "event line and type differ at %.40s", p);
        LM_CHECK(json_integer_value(json_object_get(j, "sequence_number")) == (json_int_t)json_array_size(arr));
        json_array_append_new(arr, j);
        p = nl + 2;
    }
    return arr;
}

/* GPT-2's byte-level BPE writes byte b as one character: b itself where it
 * is printable, else 256 + its rank among the unprintable bytes. The token
 * of that character (-1 when the vocabulary lacks it). */
static bool printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static int32_t byte_token(const lm_tokenizer *t, unsigned char b) {
    int cp = b;
    if (!printable(b)) {
        cp = 256;
        for (int x = 0; x < b; x++) cp += !printable(x);
    }
    char u[3];
    size_t n = 1;
    if (cp < 0x80) u[0] = (char)cp;
    else u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    return lm_tokenizer_token_to_id(t, u, n);
}

/* bytes: chunks[0] fed one byte token at a time instead. */
static bool run_answer_as(lm_test_ctx *lm_t_, fx *f, run *u, const char *body, const char *const *chunks, int n,
                          lm_finish finish, bool bytes) {
    memset(u, 0, sizeof *u);
    srv_err e;
    if (parse(f, body, &u->q, &u->r, &e)) {
        LM_CHECK_MSG(0, "parse: %s", e.msg);
        return false;
    }
    u->b = srv_resp_build_create(&f->s, &u->q);
    lm_chat_prompt p = { 0 };
    LM_CHECK(srv_out_init_sink(&u->o, &f->s, &u->r, &p, &srv_resp_sink, u->b, &e) == 0);
    srv_resp_build_start(u->b, &u->o);
    if (bytes) {
        size_t len = strlen(chunks[0]);
        for (size_t i = 0; i < len; i++) {
            int32_t id = byte_token(f->tok, (unsigned char)chunks[0][i]);
            LM_CHECK_MSG(id >= 0, "no token for byte 0x%02x", (unsigned char)chunks[0][i]);
            if (id >= 0) feed_token(&u->o, id);
        }
        lm_token_event fin = { .done = true, .finish = finish, .n_prompt = 10, .n_generated = (int)len };
        srv_out_event(&u->o, &fin);
    } else {
        feed_chunks(f, &u->o, chunks, n, finish);
    }
    u->events = read_events(lm_t_, u->o.sse.s ? u->o.sse.s : "", u->o.sse.len);
    u->response = srv_resp_build_response(u->b);
    return true;
}

static bool run_answer(lm_test_ctx *lm_t_, fx *f, run *u, const char *body, const char *const *chunks, int n,
                       lm_finish finish) {
    return run_answer_as(lm_t_, f, u, body, chunks, n, finish, false);
}

static const char *ev_type(const json_t *ev) { return json_string_value(json_object_get(ev, "type")); }

/* Checks that the events build the response: items added and done in
 * order at their output_index, deltas adding up to each done text, ids
 * that agree, and the last event's response equal to the final object. */
static void check_sequence(lm_test_ctx *lm_t_, const run *u) {
    size_t n = json_array_size(u->events);
    LM_REQUIRE(n >= 3);
    LM_CHECK(lm_streq(ev_type(json_array_get(u->events, 0)), "response.created"));
    LM_CHECK(lm_streq(ev_type(json_array_get(u->events, 1)), "response.in_progress"));
    json_t *r0 = json_object_get(json_array_get(u->events, 0), "response");
    LM_CHECK(lm_streq(json_string_value(json_object_get(r0, "status")), "in_progress"));
    LM_CHECK(json_array_size(json_object_get(r0, "output")) == 0);
    json_t *output = json_object_get(u->response, "output");
    int open = -1;          /* the output_index of the open item */
    const char *item_id = NULL;
    char text[4096] = "", summary[4096] = ""; /* the open item's deltas: content, summary */
    size_t done_items = 0;
    for (size_t i = 2; i + 1 < n; i++) {
        json_t *ev = json_array_get(u->events, i);
        const char *t = ev_type(ev);
        int oi = (int)json_integer_value(json_object_get(ev, "output_index"));
        if (!strcmp(t, "response.output_item.added")) {
            LM_CHECK_MSG(open == -1 && oi == (int)done_items, "item added at %d, %zu done", oi, done_items);
            open = oi;
            item_id = json_string_value(json_object_get(json_object_get(ev, "item"), "id"));
            LM_CHECK(lm_streq(json_string_value(json_object_get(json_object_get(ev, "item"), "status")), "in_progress"));
            text[0] = summary[0] = 0;
            continue;
        }
        LM_CHECK_MSG(open == oi, "%s at output_index %d, open %d", t, oi, open);
        if (!strcmp(t, "response.output_item.done")) {
            json_t *item = json_object_get(ev, "item");
            LM_CHECK(lm_streq(json_string_value(json_object_get(item, "id")), item_id));
            LM_CHECK_MSG(json_equal(item, json_array_get(output, (size_t)oi)), "item %d differs from the response's", oi);
            open = -1;
            done_items++;
            continue;
        }
        LM_CHECK(lm_streq(json_string_value(json_object_get(ev, "item_id")), item_id));
        bool sum = strstr(t, "reasoning_summary_") != NULL;
        char *acc = sum ? summary : text;
        const char *delta = json_string_value(json_object_get(ev, "delta"));
        if (delta) {
            LM_CHECK(strlen(acc) + strlen(delta) < sizeof text);
            strncat(acc, delta, sizeof text - strlen(acc) - 1);
        }
        const char *full = json_string_value(json_object_get(ev, strstr(t, "arguments") ? "arguments" : "text"));
        if (strstr(t, ".done") && !strstr(t, "part.done"))
            LM_CHECK_MSG(lm_streq(full, acc), "%s: '%s' vs deltas '%s'", t, full ? full : "(null)", acc);
        if (strstr(t, "part.done")) /* a part's text is its deltas too */
            LM_CHECK(lm_streq(json_string_value(json_object_get(json_object_get(ev, "part"), "text")), acc));
        if (strstr(t, "content_part.")) LM_CHECK(json_integer_value(json_object_get(ev, "content_index")) == 0);
        if (sum) LM_CHECK(json_integer_value(json_object_get(ev, "summary_index")) == 0);
    }
    LM_CHECK(open == -1 && done_items == json_array_size(output));
    json_t *last = json_object_get(json_array_get(u->events, n - 1), "response");
    json_t *a = json_deep_copy(last), *b = json_deep_copy(u->response);
    json_object_del(a, "completed_at");
    json_object_del(b, "completed_at");
    LM_CHECK_MSG(json_equal(a, b), "the last event's response differs from the response object");
    json_decref(a);
    json_decref(b);
}

static const json_t *out_item(const run *u, size_t i) { return json_array_get(json_object_get(u->response, "output"), i); }
static const char *str_at(const json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

LM_TEST(server_responses_stream_text) {
    fx f;
    if (!fx_open(&f)) SKIP_NO_FIXTURE();
    run u;
    const char *chunks[] = { "Hello there, friend." };
    LM_REQUIRE(run_answer(lm_t_, &f, &u, "{\"input\":\"hi\",\"stream\":true,\"metadata\":{\"a\":\"b\"}}", chunks, 1,
                          LM_FINISH_STOP));
    check_sequence(lm_t_, &u);
    static const char *const want[] = { "response.created", "response.in_progress", "response.output_item.added",
                                        "response.content_part.added", "response.output_text.delta" };
    for (size_t i = 0; i < LM_COUNT(want); i++) LM_CHECK(lm_streq(ev_type(json_array_get(u.events, i)), want[i]));
    size_t n = json_array_size(u.events);
    static const char *const tail[] = { "response.output_text.done", "response.content_part.done",
                                        "response.output_item.done", "response.completed" };
    for (size_t i = 0; i < LM_COUNT(tail); i++) LM_CHECK(lm_streq(ev_type(json_array_get(u.events, n - 4 + i)), tail[i]));
    json_t *res = u.response;
    LM_CHECK(!strncmp(str_at(res, "id"), "resp_", 5));
    LM_CHECK(lm_streq(str_at(res, "object"), "response") && lm_streq(str_at(res, "status"), "completed"));
    LM_CHECK(lm_streq(str_at(res, "model"), "qwen3"));
    LM_CHECK(json_is_null(json_object_get(res, "error")) && json_is_null(json_object_get(res, "incomplete_details")));
    LM_CHECK(json_array_size(json_object_get(res, "output")) == 1);
    const json_t *msg = out_item(&u, 0);
    LM_CHECK(lm_streq(str_at(msg, "type"), "message") && lm_streq(str_at(msg, "role"), "assistant"));
    LM_CHECK(!strncmp(str_at(msg, "id"), "msg_", 4) && lm_streq(str_at(msg, "status"), "completed"));
    json_t *part = json_array_get(json_object_get(msg, "content"), 0);
    LM_CHECK(lm_streq(str_at(part, "type"), "output_text") && lm_streq(str_at(part, "text"), "Hello there, friend."));
    LM_CHECK(json_array_size(json_object_get(part, "annotations")) == 0);
    json_t *usage = json_object_get(res, "usage");
    LM_CHECK(json_integer_value(json_object_get(usage, "input_tokens")) == 10);
    LM_CHECK(json_integer_value(json_object_get(json_object_get(usage, "input_tokens_details"), "cached_tokens")) == 4);
    LM_CHECK(json_integer_value(json_object_get(usage, "output_tokens")) > 0);
    LM_CHECK(json_integer_value(json_object_get(usage, "total_tokens")) ==
             10 + json_integer_value(json_object_get(usage, "output_tokens")));
    LM_CHECK(lm_streq(str_at(json_object_get(res, "metadata"), "a"), "b"));
    LM_CHECK(json_is_true(json_object_get(res, "store")) && lm_streq(str_at(res, "tool_choice"), "auto"));
    LM_CHECK(!strstr(u.o.sse.s, "[DONE]"));
    run_free(&u);

    /* not streamed: the same object, and no SSE bytes */
    LM_REQUIRE(run_answer(lm_t_, &f, &u, "{\"input\":\"hi\"}", chunks, 1, LM_FINISH_STOP));
    LM_CHECK(u.o.sse.len == 0);
    LM_CHECK(lm_streq(str_at(json_array_get(json_object_get(out_item(&u, 0), "content"), 0), "text"), "Hello there, friend."));
    run_free(&u);
    fx_close(&f);
}

static const char *k_tools_body =
    "{\"input\":\"weather?\",\"stream\":true,\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}]}";

static const char *k_answer =
    "<think>\nThe user wants weather.\n</think>\n\nLet me check \xc3\xa9t\xc3\xa9.\n\n<tool_call>\n{\"name\": "
    "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

LM_TEST(server_responses_stream_reasoning_text_call) {
    FX_OPEN_THINKING(f);
    run u;
    LM_REQUIRE(run_answer(lm_t_, &f, &u, k_tools_body, &k_answer, 1, LM_FINISH_STOP));
    check_sequence(lm_t_, &u);
    LM_REQUIRE(json_array_size(json_object_get(u.response, "output")) == 3);
    const json_t *rs = out_item(&u, 0), *msg = out_item(&u, 1), *fc = out_item(&u, 2);
    LM_CHECK(lm_streq(str_at(rs, "type"), "reasoning") && !strncmp(str_at(rs, "id"), "rs_", 3));
    LM_CHECK(json_array_size(json_object_get(rs, "summary")) == 0);
    json_t *rc = json_array_get(json_object_get(rs, "content"), 0);
    LM_CHECK(lm_streq(str_at(rc, "type"), "reasoning_text") && lm_streq(str_at(rc, "text"), "The user wants weather."));
    LM_CHECK(lm_streq(str_at(json_array_get(json_object_get(msg, "content"), 0), "text"), "Let me check \xc3\xa9t\xc3\xa9."));
    LM_CHECK(lm_streq(str_at(fc, "type"), "function_call") && !strncmp(str_at(fc, "id"), "fc_", 3));
    LM_CHECK(!strncmp(str_at(fc, "call_id"), "call_", 5) && lm_streq(str_at(fc, "name"), "get_weather"));
    LM_CHECK(lm_streq(str_at(fc, "status"), "completed"));
    json_t *args = json_loads(str_at(fc, "arguments"), 0, NULL);
    LM_CHECK(lm_streq(str_at(args, "city"), "Paris"));
    json_decref(args);
    LM_CHECK(lm_streq(str_at(u.response, "status"), "completed"));
    json_t *usage = json_object_get(u.response, "usage");
    LM_CHECK(json_integer_value(json_object_get(json_object_get(usage, "output_tokens_details"), "reasoning_tokens")) > 0);
    /* the reasoning item streams as reasoning_text, the call's arguments in one delta */
    bool saw_rs = false, saw_args = false;
    for (size_t i = 0; i < json_array_size(u.events); i++) {
        const char *t = ev_type(json_array_get(u.events, i));
        saw_rs |= lm_streq(t, "response.reasoning_text.delta");
        saw_args |= lm_streq(t, "response.function_call_arguments.delta");
    }
    LM_CHECK(saw_rs && saw_args);
    run_free(&u);
    fx_close(&f);
}

/* What Codex got when the demo model thought until its end of sequence
 * (tools offered, tool_choice auto): the whole answer is one completed
 * reasoning item, its held-back tail (a partial close tag) included, and no
 * message item; every token counts as reasoning. */
LM_TEST(server_responses_stream_unclosed_think) {
    FX_OPEN_THINKING(f);
    run u;
    const char *chunks[] = { "<think>\nThe user wants code.\n\nMaybe a <tool_call> later. </thi" };
    LM_REQUIRE(run_answer(lm_t_, &f, &u, k_tools_body, chunks, 1, LM_FINISH_STOP));
    check_sequence(lm_t_, &u);
    LM_CHECK(lm_streq(str_at(u.response, "status"), "completed"));
    LM_REQUIRE(json_array_size(json_object_get(u.response, "output")) == 1);
    const json_t *rs = out_item(&u, 0);
    LM_CHECK(lm_streq(str_at(rs, "type"), "reasoning") && lm_streq(str_at(rs, "status"), "completed"));
    json_t *rc = json_array_get(json_object_get(rs, "content"), 0);
    LM_CHECK_MSG(lm_streq(str_at(rc, "text"), "The user wants code.\n\nMaybe a <tool_call> later. </thi"), "text '%s'",
                 str_at(rc, "text"));
    json_t *usage = json_object_get(u.response, "usage");
    json_int_t out = json_integer_value(json_object_get(usage, "output_tokens"));
    LM_CHECK(out > 0 &&
             json_integer_value(json_object_get(json_object_get(usage, "output_tokens_details"), "reasoning_tokens")) == out);
    run_free(&u);
    fx_close(&f);
}

/* ---- reasoning.summary: the reasoning text as the item's summary ---------------------- */

static const char *k_summary_body =
    "{\"input\":\"weather?\",\"stream\":true,\"reasoning\":{\"summary\":\"auto\"},\"tools\":[{\"type\":\"function\","
    "\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}]}";

static size_t count_summary_events(const run *u) {
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(u->events); i++)
        n += strstr(ev_type(json_array_get(u->events, i)), "reasoning_summary") != NULL;
    return n;
}

/* The first item's events as short names, each summary delta checked to be
 * followed by the reasoning_text delta of the same text and the pairs
 * written once as "deltas". */
static void first_item_outline(lm_test_ctx *lm_t_, const run *u, char *out, size_t cap) {
    out[0] = 0;
    bool in_deltas = false;
    for (size_t i = 2; i < json_array_size(u->events); i++) {
        const json_t *ev = json_array_get(u->events, i);
        const char *t = ev_type(ev) + strlen("response.");
        if (!strcmp(t, "reasoning_summary_text.delta")) {
            const json_t *next = json_array_get(u->events, ++i);
            LM_CHECK_MSG(lm_streq(ev_type(next), "response.reasoning_text.delta") &&
                             json_equal(json_object_get(ev, "delta"), json_object_get(next, "delta")),
                         "summary delta %zu is not followed by the same reasoning_text delta", i - 1);
            if (!in_deltas) strncat(out, "deltas ", cap - strlen(out) - 1);
            in_deltas = true;
            continue;
        }
        in_deltas = false;
        strncat(out, t, cap - strlen(out) - 1);
        strncat(out, " ", cap - strlen(out) - 1);
        if (!strcmp(t, "output_item.done")) return;
    }
}

/* With reasoning.summary (what Codex sends: "auto"), the reasoning item's
 * summary is its text, streamed with the summary events around the
 * reasoning_text ones; the message and the call carry no summary. */
LM_TEST(server_responses_stream_reasoning_summary) {
    FX_OPEN_THINKING(f);
    run u;
    LM_REQUIRE(run_answer(lm_t_, &f, &u, k_summary_body, &k_answer, 1, LM_FINISH_STOP));
    check_sequence(lm_t_, &u);
    LM_REQUIRE(json_array_size(json_object_get(u.response, "output")) == 3);
    const json_t *rs = out_item(&u, 0);
    LM_REQUIRE(json_array_size(json_object_get(rs, "summary")) == 1);
    json_t *sp = json_array_get(json_object_get(rs, "summary"), 0);
    LM_CHECK(lm_streq(str_at(sp, "type"), "summary_text"));
    LM_CHECK_MSG(lm_streq(str_at(sp, "text"), "The user wants weather."), "summary '%s'", str_at(sp, "text"));
    LM_CHECK(lm_streq(str_at(json_array_get(json_object_get(rs, "content"), 0), "text"), "The user wants weather."));
    LM_CHECK(!json_object_get(out_item(&u, 1), "summary") && !json_object_get(out_item(&u, 2), "summary"));
    LM_CHECK(lm_streq(str_at(json_object_get(u.response, "reasoning"), "summary"), "auto"));
    char outline[1024];
    first_item_outline(lm_t_, &u, outline, sizeof outline);
    LM_CHECK_MSG(lm_streq(outline, "output_item.added reasoning_summary_part.added content_part.added deltas "
                                   "reasoning_summary_text.done reasoning_summary_part.done reasoning_text.done "
                                   "content_part.done output_item.done "),
                 "outline: %s", outline);
    /* the summary events are the reasoning item's only */
    size_t n_sum = 0;
    for (size_t i = 0; i < json_array_size(u.events); i++) {
        const json_t *ev = json_array_get(u.events, i);
        if (!strstr(ev_type(ev), "reasoning_summary")) continue;
        n_sum++;
        LM_CHECK(lm_streq(str_at(ev, "item_id"), str_at(rs, "id")));
        LM_CHECK(json_integer_value(json_object_get(ev, "output_index")) == 0);
    }
    LM_CHECK(n_sum >= 5 && n_sum == count_summary_events(&u));
    const json_t *added = json_array_get(u.events, 2);
    LM_CHECK(json_array_size(json_object_get(json_object_get(added, "item"), "summary")) == 0);
    run_free(&u);

    /* without reasoning.summary: no summary events, summary [] */
    LM_REQUIRE(run_answer(lm_t_, &f, &u, k_tools_body, &k_answer, 1, LM_FINISH_STOP));
    check_sequence(lm_t_, &u);
    LM_CHECK(count_summary_events(&u) == 0);
    LM_CHECK(json_is_array(json_object_get(out_item(&u, 0), "summary")) &&
             json_array_size(json_object_get(out_item(&u, 0), "summary")) == 0);
    run_free(&u);
    fx_close(&f);
}

/* Not streamed, the item in output carries the summary; stored and sent
 * back through previous_response_id, its text becomes the reasoning once
 * (content and summary hold the same text). */
LM_TEST(server_responses_summary_not_streamed_and_stored) {
    FX_OPEN_THINKING(f);
    run u;
    const char *chunks[] = { "<think>\nPondering.\n</think>\n\nHi." };
    LM_REQUIRE(run_answer(lm_t_, &f, &u, "{\"input\":\"hi\",\"reasoning\":{\"summary\":\"detailed\"}}", chunks, 1,
                          LM_FINISH_STOP));
    LM_CHECK(json_array_size(u.events) == 0); /* not streamed: no bytes */
    LM_REQUIRE(json_array_size(json_object_get(u.response, "output")) == 2);
    const json_t *rs = out_item(&u, 0);
    json_t *sp = json_array_get(json_object_get(rs, "summary"), 0);
    LM_CHECK(json_array_size(json_object_get(rs, "summary")) == 1 && lm_streq(str_at(sp, "type"), "summary_text"));
    LM_CHECK_MSG(lm_streq(str_at(sp, "text"), "Pondering."), "summary '%s'", str_at(sp, "text"));
    LM_CHECK(lm_streq(str_at(json_object_get(u.response, "reasoning"), "summary"), "detailed"));
    json_t *items = json_copy(u.q.items);
    json_array_extend(items, (json_t *)srv_resp_build_output(u.b));
    char id[48];
    snprintf(id, sizeof id, "%s", srv_resp_build_id(u.b));
    srv_resp_store_put(f.s.resp_store, id, items);
    json_decref(items);
    run_free(&u);

    char body[256];
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"More?\"}", id);
    srv_resp_req q;
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, body, &q, &r, &e) == 0);
    LM_REQUIRE(json_array_size(r.messages) == 3);
    LM_CHECK_MSG(lm_streq(msg_field(&r, 1, "reasoning_content"), "Pondering."), "reasoning_content '%s'",
                 msg_field(&r, 1, "reasoning_content"));
    LM_CHECK(!q.summary); /* this request asked for none */
    srv_resp_req_free(&q);
    srv_req_free(&r);
    /* a reasoning item the client sends back with its summary only */
    LM_REQUIRE(parse(&f, "{\"input\":[{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"S.\"}]},"
                         "{\"role\":\"assistant\",\"content\":\"A.\"},{\"role\":\"user\",\"content\":\"B\"}]}",
                     &q, &r, &e) == 0);
    LM_CHECK(lm_streq(msg_field(&r, 0, "reasoning_content"), "S."));
    srv_resp_req_free(&q);
    srv_req_free(&r);
    fx_close(&f);
}

/* The unclosed think block of server_responses_stream_unclosed_think, with
 * a summary: it holds the whole text, the held-back tail included. */
LM_TEST(server_responses_stream_unclosed_think_summary) {
    FX_OPEN_THINKING(f);
    run u;
    const char *chunks[] = { "<think>\nThe user wants code.\n\nMaybe a <tool_call> later. </thi" };
    LM_REQUIRE(run_answer(lm_t_, &f, &u, k_summary_body, chunks, 1, LM_FINISH_STOP));
    check_sequence(lm_t_, &u);
    LM_REQUIRE(json_array_size(json_object_get(u.response, "output")) == 1);
    const json_t *rs = out_item(&u, 0);
    LM_CHECK(lm_streq(str_at(rs, "status"), "completed"));
    json_t *sp = json_array_get(json_object_get(rs, "summary"), 0);
    LM_CHECK_MSG(lm_streq(str_at(sp, "text"), "The user wants code.\n\nMaybe a <tool_call> later. </thi"),
                 "summary '%s'", str_at(sp, "text"));
    size_t n = json_array_size(u.events);
    LM_CHECK(lm_streq(ev_type(json_array_get(u.events, n - 1)), "response.completed"));
    char outline[1024];
    first_item_outline(lm_t_, &u, outline, sizeof outline);
    LM_CHECK_MSG(lm_streq(outline, "output_item.added reasoning_summary_part.added content_part.added deltas "
                                   "reasoning_summary_text.done reasoning_summary_part.done reasoning_text.done "
                                   "content_part.done output_item.done "),
                 "outline: %s", outline);
    run_free(&u);
    fx_close(&f);
}

LM_TEST(server_responses_length_cut_and_failure) {
    fx f;
    if (!fx_open(&f)) SKIP_NO_FIXTURE();
    run u;
    const char *chunks[] = { "A long answer that is cut" };
    LM_REQUIRE(run_answer(lm_t_, &f, &u, "{\"input\":\"hi\",\"stream\":true,\"max_output_tokens\":5}", chunks, 1,
                          LM_FINISH_LENGTH));
    check_sequence(lm_t_, &u);
    size_t n = json_array_size(u.events);
    LM_CHECK(lm_streq(ev_type(json_array_get(u.events, n - 1)), "response.incomplete"));
    LM_CHECK(lm_streq(str_at(u.response, "status"), "incomplete"));
    LM_CHECK(lm_streq(str_at(json_object_get(u.response, "incomplete_details"), "reason"), "max_output_tokens"));
    LM_CHECK(lm_streq(str_at(out_item(&u, 0), "status"), "incomplete"));
    LM_CHECK(json_integer_value(json_object_get(u.response, "max_output_tokens")) == 5);
    run_free(&u);

    LM_REQUIRE(run_answer(lm_t_, &f, &u, "{\"input\":\"hi\",\"stream\":true}", chunks, 1, LM_FINISH_ERROR));
    check_sequence(lm_t_, &u);
    n = json_array_size(u.events);
    LM_CHECK(lm_streq(ev_type(json_array_get(u.events, n - 1)), "response.failed"));
    LM_CHECK(lm_streq(str_at(u.response, "status"), "failed"));
    json_t *err = json_object_get(u.response, "error");
    LM_CHECK(lm_streq(str_at(err, "code"), "server_error") && strstr(str_at(err, "message"), "backend failed"));
    run_free(&u);
    fx_close(&f);
}

/* ---- the same answer however the text arrives ---------------------------------------- */

/* The response with its per-run ids and times removed, dumped. */
static char *normalised(const json_t *res) {
    json_t *c = json_deep_copy(res);
    json_object_del(c, "id");
    json_object_del(c, "created_at");
    json_object_del(c, "completed_at");
    json_object_del(c, "usage"); /* token counts depend on the split */
    json_t *item;
    size_t i;
    json_array_foreach(json_object_get(c, "output"), i, item) {
        json_object_del(item, "id");
        json_object_del(item, "call_id");
    }
    char *s = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(c);
    return s;
}

/* Event types with runs of the same delta type collapsed into one. */
static char *type_outline(const json_t *events) {
    size_t cap = 8192, len = 0;
    char *s = lm_xcalloc(cap, 1);
    const char *prev = "";
    for (size_t i = 0; i < json_array_size(events); i++) {
        const char *t = ev_type(json_array_get(events, i));
        if (strstr(t, ".delta") && !strcmp(t, prev)) continue;
        size_t n = strlen(t);
        if (len + n + 2 > cap) break;
        memcpy(s + len, t, n);
        len += n;
        s[len++] = ' ';
        prev = t;
    }
    return s;
}

LM_TEST(server_responses_every_split_point) {
    FX_OPEN_THINKING(f);
    run u;
    LM_REQUIRE(run_answer(lm_t_, &f, &u, k_tools_body, &k_answer, 1, LM_FINISH_STOP));
    char *want = normalised(u.response), *want_outline = type_outline(u.events);
    run_free(&u);
    size_t len = strlen(k_answer);
    char a[512], b[512];
    int bad = 0;
    for (size_t k = 1; k < len && bad < 3; k++) {
        if (((unsigned char)k_answer[k] & 0xC0) == 0x80) continue; /* inside a character: not a string */
        memcpy(a, k_answer, k);
        a[k] = 0;
        snprintf(b, sizeof b, "%s", k_answer + k);
        const char *chunks[] = { a, b };
        LM_REQUIRE(run_answer(lm_t_, &f, &u, k_tools_body, chunks, 2, LM_FINISH_STOP));
        check_sequence(lm_t_, &u);
        char *got = normalised(u.response), *outline = type_outline(u.events);
        if (strcmp(got, want) || strcmp(outline, want_outline)) {
            bad++;
            LM_CHECK_MSG(0, "split at %zu:\n  %s\n  %s\nvs\n  %s\n  %s", k, got, outline, want, want_outline);
        }
        free(got);
        free(outline);
        run_free(&u);
    }
    /* one byte per token: a character's bytes and every tag arrive one by one */
    LM_REQUIRE(run_answer_as(lm_t_, &f, &u, k_tools_body, &k_answer, 1, LM_FINISH_STOP, true));
    check_sequence(lm_t_, &u);
    char *got = normalised(u.response), *outline = type_outline(u.events);
    LM_CHECK_MSG(!strcmp(got, want), "one byte at a time:\n  %s\nvs\n  %s", got, want);
    LM_CHECK_MSG(!strcmp(outline, want_outline), "one byte at a time:\n  %s\nvs\n  %s", outline, want_outline);
    free(got);
    free(outline);
    run_free(&u);
    free(want);
    free(want_outline);
    fx_close(&f);
}

/* ---- previous_response_id -------------------------------------------------------------- */

LM_TEST(server_responses_store_lru) {
    srv_resp_store *st = srv_resp_store_create(2, 1 << 20);
    json_t *one = json_pack("[{s:s}]", "type", "message");
    srv_resp_store_put(st, "resp_a", one);
    srv_resp_store_put(st, "resp_b", one);
    json_t *got = srv_resp_store_get(st, "resp_a"); /* a is now the most recent */
    LM_CHECK(json_equal(got, one));
    json_decref(got);
    srv_resp_store_put(st, "resp_c", one); /* over the count: b, the least recent, goes */
    LM_CHECK(srv_resp_store_count(st, NULL) == 2);
    got = srv_resp_store_get(st, "resp_b");
    LM_CHECK(got == NULL);
    json_decref(got);
    got = srv_resp_store_get(st, "resp_a");
    LM_CHECK(got != NULL);
    json_decref(got);
    srv_resp_store_put(st, "resp_a", one); /* replacing keeps one entry */
    LM_CHECK(srv_resp_store_count(st, NULL) == 2);
    srv_resp_store_free(st);

    /* by bytes: each entry ~ its JSON plus its id and bookkeeping */
    st = srv_resp_store_create(100, 600);
    json_t *big = json_pack("[{s:s}]", "text", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                                                 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
    char id[16];
    for (int i = 0; i < 10; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        srv_resp_store_put(st, id, big);
    }
    size_t bytes;
    int count = srv_resp_store_count(st, &bytes);
    LM_CHECK_MSG(count >= 1 && count < 10 && bytes <= 600, "count %d bytes %zu", count, bytes);
    got = srv_resp_store_get(st, "resp_9"); /* the newest stays */
    LM_CHECK(got != NULL);
    json_decref(got);
    got = srv_resp_store_get(st, "resp_0");
    LM_CHECK(got == NULL);
    json_decref(got);
    json_t *huge = json_array();
    for (int i = 0; i < 20; i++) json_array_append(huge, big);
    srv_resp_store_put(st, "resp_huge", huge); /* larger than the budget: not kept */
    got = srv_resp_store_get(st, "resp_huge");
    LM_CHECK(got == NULL);
    json_decref(got);
    json_decref(huge);
    json_decref(big);
    json_decref(one);
    srv_resp_store_free(st);
}

LM_TEST(server_responses_previous_response_id) {
    fx f;
    if (!fx_open(&f)) SKIP_NO_FIXTURE();
    run u;
    const char *chunks[] = { "Paris is sunny." };
    LM_REQUIRE(run_answer(lm_t_, &f, &u, "{\"instructions\":\"first\",\"input\":\"Weather in Paris?\"}", chunks, 1,
                          LM_FINISH_STOP));
    /* what responses.c keeps when the job ends */
    json_t *items = json_copy(u.q.items);
    json_array_extend(items, (json_t *)srv_resp_build_output(u.b));
    char id[48];
    snprintf(id, sizeof id, "%s", srv_resp_build_id(u.b));
    srv_resp_store_put(f.s.resp_store, id, items);
    json_decref(items);
    run_free(&u);

    char body[256];
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"And tomorrow?\"}", id);
    srv_resp_req q;
    srv_req r;
    srv_err e;
    LM_REQUIRE(parse(&f, body, &q, &r, &e) == 0);
    /* the earlier turn, then the new one; the earlier instructions are not carried over */
    LM_REQUIRE(json_array_size(r.messages) == 3);
    LM_CHECK(lm_streq(msg_field(&r, 0, "content"), "Weather in Paris?"));
    json_t *asst = json_array_get(r.messages, 1);
    LM_CHECK(lm_streq(msg_field(&r, 1, "role"), "assistant"));
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_array_get(json_object_get(asst, "content"), 0), "text")),
                      "Paris is sunny."));
    LM_CHECK(lm_streq(msg_field(&r, 2, "content"), "And tomorrow?"));
    LM_CHECK(json_array_size(q.items) == 3);
    LM_CHECK(lm_streq(json_string_value(json_object_get(q.echo, "previous_response_id")), id));
    /* an error in the new input names its own index */
    srv_resp_req_free(&q);
    srv_req_free(&r);
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":[{\"type\":\"bogus\"}]}", id);
    expect_error(lm_t_, &f, body, 400, "input[0].type", NULL);
    fx_close(&f);
}

/* ---- hostile bodies ---------------------------------------------------------------------- */

/* Every value of body replaced by each of a few values of other types, and
 * every key removed, one at a time (depth first over objects and arrays):
 * each is answered, never crashes, and a refusal is a 400 or 404 with a
 * message. */
static int g_variants;

static void try_body(lm_test_ctx *lm_t_, fx *f, const json_t *root) {
    char *text = json_dumps(root, JSON_COMPACT);
    srv_resp_req q;
    srv_req r;
    srv_err e;
    int rc = parse(f, text, &q, &r, &e);
    LM_CHECK_MSG(rc == 0 || ((e.status == 400 || e.status == 404) && e.msg[0]), "%s -> rc %d status %d", text, rc,
                 e.status);
    if (rc == 0) {
        lm_chat_prompt p;
        srv_err re;
        if (srv_chat_render(&f->s, &r, &p, &re) == 0) LM_CHECK(p.text != NULL);
        lm_chat_prompt_free(&p);
    }
    srv_resp_req_free(&q);
    srv_req_free(&r);
    free(text);
    g_variants++;
}

static void mutate_walk(lm_test_ctx *lm_t_, fx *f, json_t *root, json_t *node) {
    json_t *repl[] = { json_null(), json_integer(-1), json_string(""), json_array(), json_object(), json_true() };
    /* the keys (or indices) first: the node changes under the loop */
    json_t *keys = json_array();
    if (json_is_object(node)) {
        const char *key;
        json_t *v;
        json_object_foreach(node, key, v) json_array_append_new(keys, json_string(key));
    }
    size_t n = json_is_object(node) ? json_array_size(keys) : json_is_array(node) ? json_array_size(node) : 0;
    for (size_t i = 0; i < n; i++) {
        const char *key = json_is_object(node) ? json_string_value(json_array_get(keys, i)) : NULL;
        json_t *child = json_incref(key ? json_object_get(node, key) : json_array_get(node, i));
        for (size_t k = 0; k < LM_COUNT(repl); k++) {
            if (key) json_object_set(node, key, repl[k]);
            else json_array_set(node, i, repl[k]);
            try_body(lm_t_, f, root);
        }
        if (key) {
            json_object_del(node, key);
            try_body(lm_t_, f, root);
            json_object_set(node, key, child);
        } else {
            json_array_set(node, i, child);
        }
        mutate_walk(lm_t_, f, root, child);
        json_decref(child);
    }
    json_decref(keys);
    for (size_t k = 0; k < LM_COUNT(repl); k++) json_decref(repl[k]);
}

LM_TEST(server_responses_hostile_bodies) {
    fx f;
    if (!fx_open(&f)) SKIP_NO_FIXTURE();
    const char *body =
        "{\"model\":\"qwen3\",\"instructions\":\"A\",\"stream\":true,\"max_output_tokens\":9,\"store\":false,"
        "\"reasoning\":{\"effort\":\"low\",\"summary\":\"auto\"},\"text\":{\"format\":{\"type\":\"text\"}},"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},\"input\":["
        "{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"B\"}]},"
        "{\"role\":\"user\",\"content\":\"u\"},"
        "{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"s\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":[{\"type\":\"input_text\",\"text\":\"o\"}]}]}";
    json_t *root = json_loads(body, 0, NULL);
    LM_REQUIRE(root != NULL);
    g_variants = 0;
    try_body(lm_t_, &f, root);
    mutate_walk(lm_t_, &f, root, root);
    LM_CHECK(g_variants > 200);
    json_decref(root);
    /* every prefix of the text: a JSON error (400), never a crash */
    size_t len = strlen(body);
    for (size_t k = 0; k < len; k++) {
        srv_resp_req q;
        srv_req r;
        srv_err e;
        memset(&e, 0, sizeof e);
        int rc = srv_resp_parse(&f.s, body, k, &q, &r, &e);
        LM_CHECK(rc == -1 && e.status == 400);
        srv_resp_req_free(&q);
        srv_req_free(&r);
    }
    fx_close(&f);
}
