/* test_guard_toolcall.c - streamed tool calls merge back into the right
 * calls the way clients merge them (issue #25: every streamed `index` being
 * 0 went unnoticed; only "is an integer" was checked and no stream test had
 * two calls).
 *
 * Design. Clients (the openai SDKs, LangChain, Vercel's ai) rebuild
 * `message.tool_calls` from `delta.tool_calls` by `index` alone: the entry
 * at that index gets the id, type and name of its first delta and the
 * concatenated `arguments` of all of them. This test does exactly that with
 * the JSON the server sends (lm_toolcall_out_json), for two and three calls
 * in one answer, in the Hermes JSON and the Qwen XML forms, fed whole, byte
 * by byte and in random chunks; the merged calls must equal the calls of the
 * non-streamed answer (lm_toolcall_parser_calls_json), with indices 0..n-1
 * in order, distinct ids, and arguments that parse to the expected objects. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "chat/lm_parse.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"tz\":{\"type\":\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"convert\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"amount\":{\"type\":\"number\"},\"to\":{\"type\":\"string\"}}}}}]";

typedef struct tc_case {
    const char *name, *text;
    int n;                  /* calls expected */
    const char *names[3];
    const char *args[3];    /* expected arguments (JSON objects) */
} tc_case;

static const tc_case k_cases[] = {
    { "json, two calls",
      "Checking both.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Lima\", \"tz\": \"America/Lima\"}}\n</tool_call>",
      2, { "get_weather", "get_time" }, { "{\"city\": \"Paris\", \"days\": 3}", "{\"city\": \"Lima\", \"tz\": \"America/Lima\"}" } },
    { "json, three calls, one block",
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Oslo\"}}\n"
      "{\"name\": \"convert\", \"arguments\": {\"amount\": 12.5, \"to\": \"NOK\"}}\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
      3, { "get_time", "convert", "get_weather" },
      { "{\"city\": \"Oslo\"}", "{\"amount\": 12.5, \"to\": \"NOK\"}", "{\"city\": \"Rome\"}" } },
    { "xml, two calls",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nKyiv\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=convert>\n<parameter=amount>\n7\n</parameter>\n"
      "<parameter=to>\nEUR\n</parameter>\n</function>\n</tool_call>",
      2, { "get_weather", "convert" }, { "{\"city\": \"Kyiv\", \"days\": 2}", "{\"amount\": 7, \"to\": \"EUR\"}" } },
};

/* Merges one `delta.tool_calls` array into calls, as clients do. */
static void merge(lm_test_ctx *lm_t_, json_t *calls, const json_t *delta) {
    size_t i;
    json_t *d;
    json_array_foreach(delta, i, d) {
        json_t *jidx = json_object_get(d, "index");
        LM_CHECK_MSG(json_is_integer(jidx), "a delta without an integer index");
        long idx = (long)json_integer_value(jidx);
        LM_CHECK_MSG(idx >= 0 && idx <= (long)json_array_size(calls), "index %ld after %zu calls", idx,
                     json_array_size(calls));
        if (idx < 0 || idx > (long)json_array_size(calls)) continue;
        json_t *fn = json_object_get(d, "function");
        if (idx == (long)json_array_size(calls)) { /* a new call: its first delta names it */
            LM_CHECK_MSG(json_is_string(json_object_get(d, "id")) && json_is_string(json_object_get(fn, "name")),
                         "the first delta of call %ld has no id or name", idx);
            json_array_append_new(calls, json_pack("{s:s,s:s,s:s}", "id", json_string_value(json_object_get(d, "id")) ?: "",
                                                   "name", json_string_value(json_object_get(fn, "name")) ?: "",
                                                   "arguments", ""));
        } else {
            LM_CHECK_MSG(!json_object_get(d, "id") && !json_object_get(fn, "name"), "call %ld named twice", idx);
        }
        json_t *c = json_array_get(calls, (size_t)idx);
        const char *frag = json_string_value(json_object_get(fn, "arguments"));
        if (frag && *frag) {
            const char *have = json_string_value(json_object_get(c, "arguments"));
            char *cat = malloc(strlen(have) + strlen(frag) + 1);
            strcpy(cat, have);
            strcat(cat, frag);
            json_object_set_new(c, "arguments", json_string(cat));
            free(cat);
        }
    }
}

static void collect(lm_test_ctx *lm_t_, json_t *calls, const lm_toolcall_out *out) {
    json_t *j = lm_toolcall_out_json(out);
    if (j) merge(lm_t_, calls, j);
    json_decref(j);
}

/* Feeds c in chunks of the sizes rng draws (0: whole; 1: byte by byte). */
static void run_case(lm_test_ctx *lm_t_, const tc_case *c, int mode, uint32_t seed) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    lm_toolcall_opts o = { .tools = tools, .id_seed = 99 };
    lm_toolcall_parser *p = lm_toolcall_parser_create(&o, NULL);
    json_decref(tools);
    LM_REQUIRE(p != NULL);
    json_t *calls = json_array();
    size_t n = strlen(c->text), at = 0;
    uint32_t rng = seed;
    lm_toolcall_out out;
    while (at < n) {
        size_t k = n - at;
        if (mode == 1) k = 1;
        if (mode == 2) {
            rng = rng * 1664525u + 1013904223u;
            k = 1 + (rng >> 24) % 9;
            if (k > n - at) k = n - at;
        }
        lm_toolcall_parser_feed(p, c->text + at, k, &out);
        collect(lm_t_, calls, &out);
        at += k;
    }
    int committed = lm_toolcall_parser_finish(p, &out);
    collect(lm_t_, calls, &out);
    json_t *final = lm_toolcall_parser_calls_json(p);
    LM_CHECK_MSG(committed == c->n && (int)json_array_size(calls) == c->n && (int)json_array_size(final) == c->n,
                 "%s (mode %d): %d committed, %zu merged from the stream, %zu in the message", c->name, mode, committed,
                 json_array_size(calls), json_array_size(final));
    for (int i = 0; i < c->n && i < (int)json_array_size(calls) && i < (int)json_array_size(final); i++) {
        json_t *m = json_array_get(calls, (size_t)i), *f = json_array_get(final, (size_t)i);
        const char *args = json_string_value(json_object_get(m, "arguments"));
        json_t *got = json_loads(args ? args : "", 0, NULL), *want = json_loads(c->args[i], 0, NULL);
        LM_CHECK_MSG(lm_streq(json_string_value(json_object_get(m, "name")), c->names[i]) && json_equal(got, want),
                     "%s (mode %d) call %d: %s(%s), want %s(%s)", c->name, mode, i,
                     json_string_value(json_object_get(m, "name")), args, c->names[i], c->args[i]);
        /* the stream and the plain message agree byte for byte */
        LM_CHECK(lm_streq(json_string_value(json_object_get(m, "id")), json_string_value(json_object_get(f, "id"))));
        LM_CHECK(lm_streq(args, json_string_value(json_object_get(json_object_get(f, "function"), "arguments"))));
        LM_CHECK(lm_streq(json_string_value(json_object_get(m, "name")),
                          json_string_value(json_object_get(json_object_get(f, "function"), "name"))));
        for (int k = 0; k < i; k++)
            LM_CHECK(!lm_streq(json_string_value(json_object_get(m, "id")),
                               json_string_value(json_object_get(json_array_get(calls, (size_t)k), "id"))));
        json_decref(got);
        json_decref(want);
    }
    json_decref(final);
    json_decref(calls);
    lm_toolcall_parser_free(p);
}

LM_TEST(guard_toolcall_stream_merges_by_index) {
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        run_case(lm_t_, &k_cases[i], 0, 0);
        run_case(lm_t_, &k_cases[i], 1, 0);
        for (uint32_t seed = 1; seed <= 20; seed++) run_case(lm_t_, &k_cases[i], 2, seed);
    }
}
