/* test_server_anthropic_stream.c - what /v1/messages answers, in process
 * (no HTTP, no engine): token events built from the qwen3 fixture tokenizer
 * go through srv_out with the Anthropic sink and come out as Anthropic SSE
 * events or a message object. Checks the event sequence for text,
 * thinking + text and tool_use, max_tokens and stop_sequence, a failure
 * mid-stream, that the events are the same however the model's text is
 * split into tokens, and that an SSE reader gets the same events whether
 * the bytes arrive whole or one by one. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "server_fixture.h"

typedef srv_fx fx;

static const char *str_at(const json_t *j, const char *k) { return json_string_value(json_object_get(j, k)); }

static const char *k_tools = "\"tools\":[{\"name\":\"get_weather\",\"input_schema\":{\"type\":\"object\","
                             "\"properties\":{\"city\":{\"type\":\"string\"}}}}]";

/* ---- driving srv_out --------------------------------------------------------------- */

typedef struct run {
    srv_req r;
    srv_out o;
} run;

static bool run_start(fx *f, run *x, const char *extra, bool stream) {
    char body[2048];
    snprintf(body, sizeof body, "{\"model\":\"claude-x\",\"max_tokens\":100,\"stream\":%s,"
                                "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s%s}",
             stream ? "true" : "false", extra ? "," : "", extra ? extra : "");
    srv_err e;
    if (srv_anth_parse(&f->s, body, strlen(body), false, &x->r, &e)) {
        fprintf(stderr, "  parse: %s\n", e.msg);
        return false;
    }
    x->r.n_prompt_tokens = 10;
    lm_chat_prompt p = { 0 };
    return srv_anth_out_init(&x->o, &f->s, &x->r, &p, &e) == 0;
}

static void run_end(run *x) {
    srv_anth_out_done(&x->o);
    srv_out_free(&x->o);
    srv_req_free(&x->r);
}

/* Feeds token ids as the engine would, then the final event (eos for
 * LM_FINISH_STOP). Stops feeding when srv_out asks to cancel. */
static void feed_ids(srv_out *o, const int32_t *ids, size_t n, lm_finish finish) {
    size_t i = 0;
    bool cancel = false;
    for (; i < n && !cancel; i++) {
        lm_token_event ev = { .token = ids[i], .has_token = true };
        cancel = srv_out_event(o, &ev);
    }
    lm_token_event fin = { .done = true, .finish = cancel ? LM_FINISH_CANCELLED : finish, .n_prompt = 10,
                           .n_cached = 3, .n_generated = (int)i };
    if (!cancel && finish == LM_FINISH_STOP) {
        fin.has_token = true;
        fin.token = 2;
        fin.n_generated++;
    }
    if (finish == LM_FINISH_ERROR) fin.error = "the GPU fell off";
    srv_out_event(o, &fin);
}

static void encode_into(fx *f, const char *s, size_t n, lm_tok_ids *ids) {
    lm_err e = { { 0 } };
    lm_tok_ids part = { 0 };
    LM_ASSERT(lm_tokenizer_encode(f->tok, s, n, false, &part, &e) == 0);
    for (size_t i = 0; i < part.n; i++) {
        if (ids->n == ids->cap) {
            ids->cap = ids->cap ? ids->cap * 2 : 64;
            ids->ids = lm_xrealloc(ids->ids, ids->cap * sizeof *ids->ids);
        }
        ids->ids[ids->n++] = part.ids[i];
    }
    lm_tok_ids_free(&part);
}

/* text as tokens cut at the byte offsets cuts[0..n_cuts) (each piece
 * tokenized on its own), then fed. */
static void feed_cut(fx *f, srv_out *o, const char *text, const size_t *cuts, int n_cuts, lm_finish finish) {
    lm_tok_ids ids = { 0 };
    size_t at = 0, len = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        if (end > at) encode_into(f, text + at, end - at, &ids);
        at = end;
    }
    feed_ids(o, ids.ids, ids.n, finish);
    lm_tok_ids_free(&ids);
}

static void feed_text(fx *f, srv_out *o, const char *text, lm_finish finish) { feed_cut(f, o, text, NULL, 0, finish); }

/* ---- an SSE reader, fed any chunking ------------------------------------------------ */

typedef struct sse_reader {
    char line[1 << 16];
    size_t n;
    char event[64];
    char *data;
    size_t data_len;
    json_t *events; /* [{"event": NAME, "data": {...}}] */
    int bad;
} sse_reader;

static void sse_line(sse_reader *rd) {
    rd->line[rd->n] = 0;
    if (rd->n == 0) { /* blank line: dispatch */
        if (rd->data) {
            json_t *d = json_loadb(rd->data, rd->data_len, JSON_ALLOW_NUL, NULL);
            if (!d) rd->bad++;
            json_t *ev = json_object();
            json_object_set_new(ev, "event", json_string(rd->event));
            json_object_set_new(ev, "data", d ? d : json_null());
            json_array_append_new(rd->events, ev);
        }
        free(rd->data);
        rd->data = NULL;
        rd->data_len = 0;
        rd->event[0] = 0;
    } else if (!strncmp(rd->line, "event: ", 7)) {
        snprintf(rd->event, sizeof rd->event, "%s", rd->line + 7);
    } else if (!strncmp(rd->line, "data: ", 6)) {
        size_t n = rd->n - 6;
        rd->data = lm_xrealloc(rd->data, rd->data_len + n + 1);
        memcpy(rd->data + rd->data_len, rd->line + 6, n);
        rd->data_len += n;
    } else if (rd->line[0] != ':') {
        rd->bad++;
    }
    rd->n = 0;
}

static void sse_feed(sse_reader *rd, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') sse_line(rd);
        else if (rd->n + 1 < sizeof rd->line) rd->line[rd->n++] = p[i];
    }
}

/* The events of an SSE body read in chunks of `step` bytes (0: whole). */
static json_t *sse_read(const char *p, size_t n, size_t step, int *bad) {
    sse_reader *rd = lm_xcalloc(1, sizeof *rd);
    rd->events = json_array();
    for (size_t at = 0; at < n;) {
        size_t k = step ? LM_MIN(step, n - at) : n;
        sse_feed(rd, p + at, k);
        at += k;
    }
    json_t *ev = rd->events;
    *bad = rd->bad + (rd->n != 0 || rd->data != NULL); /* an unterminated event */
    free(rd->data);
    free(rd);
    return ev;
}

static json_t *events_of(const srv_out *o) {
    int bad = 0;
    json_t *ev = sse_read(o->sse.s ? o->sse.s : "", o->sse.len, 0, &bad);
    return bad ? (json_decref(ev), NULL) : ev;
}

/* The events with consecutive deltas of one block merged (text, thinking,
 * partial_json concatenated): what a client builds, independent of how
 * the text was split. Event names must equal their data's type. */
static json_t *merged(const json_t *events, int *mismatch) {
    json_t *out = json_array();
    *mismatch = 0;
    for (size_t i = 0; i < json_array_size(events); i++) {
        const json_t *ev = json_array_get(events, i), *d = json_object_get(ev, "data");
        if (!lm_streq(str_at(ev, "event"), str_at(d, "type"))) (*mismatch)++;
        json_t *last = json_array_get(out, json_array_size(out) - 1);
        const json_t *ld = json_object_get(last, "data");
        if (lm_streq(str_at(d, "type"), "content_block_delta") && lm_streq(str_at(ld, "type"), "content_block_delta") &&
            json_equal(json_object_get(d, "index"), json_object_get(ld, "index")) &&
            lm_streq(str_at(json_object_get(d, "delta"), "type"), str_at(json_object_get(ld, "delta"), "type"))) {
            json_t *dl = json_object_get(ld, "delta");
            const json_t *dd = json_object_get(d, "delta");
            const char *keys[] = { "text", "thinking", "partial_json" };
            for (size_t k = 0; k < 3; k++) {
                const json_t *a = json_object_get(dl, keys[k]), *b = json_object_get(dd, keys[k]);
                if (!a || !b) continue;
                size_t la = json_string_length(a), lb = json_string_length(b);
                char *s = lm_xmalloc(la + lb + 1);
                memcpy(s, json_string_value(a), la);
                memcpy(s + la, json_string_value(b), lb);
                json_object_set_new(dl, keys[k], json_stringn(s, la + lb));
                free(s);
            }
            continue;
        }
        json_array_append_new(out, json_deep_copy(ev));
    }
    return out;
}

/* "message_start ping content_block_start:text content_block_delta:text_delta ..." */
static char *sequence(const json_t *m) {
    size_t cap = 4096, len = 0;
    char *s = lm_xcalloc(1, cap);
    for (size_t i = 0; i < json_array_size(m); i++) {
        const json_t *d = json_object_get(json_array_get(m, i), "data");
        const char *t = str_at(d, "type");
        const char *sub = str_at(json_object_get(d, "content_block"), "type");
        if (!sub) sub = str_at(json_object_get(d, "delta"), "type");
        len += (size_t)snprintf(s + len, cap - len, "%s%s%s%s", i ? " " : "", t ? t : "?", sub ? ":" : "", sub ? sub : "");
        if (len >= cap) break;
    }
    return s;
}

/* The merged events of a stream and the message a non-stream run gives, for
 * one answer text. */
static json_t *stream_of(fx *f, const char *extra, const char *text, lm_finish finish) {
    run x;
    if (!run_start(f, &x, extra, true)) return NULL;
    feed_text(f, &x.o, text, finish);
    json_t *ev = events_of(&x.o);
    run_end(&x);
    int mm = 0;
    json_t *m = ev ? merged(ev, &mm) : NULL;
    json_decref(ev);
    if (mm) {
        json_decref(m);
        return NULL;
    }
    return m;
}

static json_t *message_of(fx *f, const char *extra, const char *text, lm_finish finish) {
    run x;
    if (!run_start(f, &x, extra, false)) return NULL;
    feed_text(f, &x.o, text, finish);
    json_t *m = x.o.done ? srv_anth_message(&x.o) : NULL;
    run_end(&x);
    return m;
}

static const json_t *ev_data(const json_t *m, size_t i) { return json_object_get(json_array_get(m, i), "data"); }

/* ---- tests ----------------------------------------------------------------------------- */

LM_TEST(server_anthropic_stream_text) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    const char *text = "Hello there, friend.";
    json_t *m = stream_of(&f, "\"thinking\":{\"type\":\"disabled\"}", text, LM_FINISH_STOP);
    LM_REQUIRE(m);
    char *seq = sequence(m);
    LM_CHECK_MSG(lm_streq(seq, "message_start ping content_block_start:text content_block_delta:text_delta "
                               "content_block_stop message_delta message_stop"), "%s", seq);
    free(seq);
    const json_t *start = json_object_get(ev_data(m, 0), "message");
    LM_CHECK(!strncmp(str_at(start, "id"), "msg_", 4) && lm_streq(str_at(start, "type"), "message"));
    LM_CHECK(lm_streq(str_at(start, "role"), "assistant") && lm_streq(str_at(start, "model"), "qwen3"));
    LM_CHECK(json_array_size(json_object_get(start, "content")) == 0);
    LM_CHECK(json_is_null(json_object_get(start, "stop_reason")));
    LM_CHECK(json_integer_value(json_object_get(json_object_get(start, "usage"), "input_tokens")) == 10);
    LM_CHECK(json_integer_value(json_object_get(ev_data(m, 2), "index")) == 0);
    LM_CHECK(lm_streq(str_at(json_object_get(ev_data(m, 3), "delta"), "text"), text));
    const json_t *md = ev_data(m, 5), *u = json_object_get(md, "usage");
    LM_CHECK(lm_streq(str_at(json_object_get(md, "delta"), "stop_reason"), "end_turn"));
    LM_CHECK(json_is_null(json_object_get(json_object_get(md, "delta"), "stop_sequence")));
    LM_CHECK(json_integer_value(json_object_get(u, "input_tokens")) == 7); /* 10 prompt, 3 from the cache */
    LM_CHECK(json_integer_value(json_object_get(u, "cache_read_input_tokens")) == 3);
    LM_CHECK(json_integer_value(json_object_get(u, "cache_creation_input_tokens")) == 0);
    LM_CHECK(json_integer_value(json_object_get(u, "output_tokens")) > 1);
    json_decref(m);

    /* the same answer as one message */
    json_t *msg = message_of(&f, "\"thinking\":{\"type\":\"disabled\"}", text, LM_FINISH_STOP);
    LM_REQUIRE(msg);
    LM_CHECK(!strncmp(str_at(msg, "id"), "msg_", 4) && lm_streq(str_at(msg, "type"), "message"));
    const json_t *content = json_object_get(msg, "content");
    LM_CHECK(json_array_size(content) == 1);
    LM_CHECK(lm_streq(str_at(json_array_get(content, 0), "type"), "text"));
    LM_CHECK(lm_streq(str_at(json_array_get(content, 0), "text"), text));
    LM_CHECK(lm_streq(str_at(msg, "stop_reason"), "end_turn") && json_is_null(json_object_get(msg, "stop_sequence")));
    LM_CHECK(json_integer_value(json_object_get(json_object_get(msg, "usage"), "cache_read_input_tokens")) == 3);
    json_decref(msg);
    srv_fx_close(&f);
}

LM_TEST(server_anthropic_stream_thinking_then_text) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    const char *text = "<think>\nThe user greets.\n</think>\n\nHi! How can I help?";
    json_t *m = stream_of(&f, NULL, text, LM_FINISH_STOP);
    LM_REQUIRE(m);
    char *seq = sequence(m);
    LM_CHECK_MSG(lm_streq(seq, "message_start ping content_block_start:thinking content_block_delta:thinking_delta "
                               "content_block_delta:signature_delta content_block_stop content_block_start:text "
                               "content_block_delta:text_delta content_block_stop message_delta message_stop"),
                 "%s", seq);
    free(seq);
    LM_CHECK(lm_streq(str_at(json_object_get(ev_data(m, 2), "content_block"), "thinking"), ""));
    LM_CHECK(lm_streq(str_at(json_object_get(ev_data(m, 3), "delta"), "thinking"), "The user greets."));
    LM_CHECK(str_at(json_object_get(ev_data(m, 4), "delta"), "signature")[0] != 0);
    LM_CHECK(json_integer_value(json_object_get(ev_data(m, 6), "index")) == 1);
    LM_CHECK(lm_streq(str_at(json_object_get(ev_data(m, 7), "delta"), "text"), "Hi! How can I help?"));
    json_decref(m);

    /* display "omitted" (Claude Code's choice): the blocks without their text */
    const char *omit = "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024,\"display\":\"omitted\"}";
    m = stream_of(&f, omit, text, LM_FINISH_STOP);
    LM_REQUIRE(m);
    seq = sequence(m);
    LM_CHECK_MSG(lm_streq(seq, "message_start ping content_block_start:thinking content_block_delta:signature_delta "
                               "content_block_stop content_block_start:text content_block_delta:text_delta "
                               "content_block_stop message_delta message_stop"), "%s", seq);
    free(seq);
    json_decref(m);
    json_t *om = message_of(&f, omit, text, LM_FINISH_STOP);
    LM_REQUIRE(om);
    LM_CHECK(lm_streq(str_at(json_array_get(json_object_get(om, "content"), 0), "thinking"), ""));
    LM_CHECK(lm_streq(str_at(json_array_get(json_object_get(om, "content"), 1), "text"), "Hi! How can I help?"));
    json_decref(om);

    json_t *msg = message_of(&f, NULL, text, LM_FINISH_STOP);
    LM_REQUIRE(msg);
    const json_t *c = json_object_get(msg, "content");
    LM_REQUIRE(json_array_size(c) == 2);
    LM_CHECK(lm_streq(str_at(json_array_get(c, 0), "type"), "thinking"));
    LM_CHECK(lm_streq(str_at(json_array_get(c, 0), "thinking"), "The user greets."));
    LM_CHECK(str_at(json_array_get(c, 0), "signature") && str_at(json_array_get(c, 0), "signature")[0]);
    LM_CHECK(lm_streq(str_at(json_array_get(c, 1), "text"), "Hi! How can I help?"));
    json_decref(msg);
    srv_fx_close(&f);
}

static const char *k_call_answer =
    "<think>\nNeed weather.\n</think>\n\nLet me check.\n\n<tool_call>\n{\"name\": \"get_weather\", "
    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

LM_TEST(server_anthropic_stream_tool_use) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    json_t *m = stream_of(&f, k_tools, k_call_answer, LM_FINISH_STOP);
    LM_REQUIRE(m);
    char *seq = sequence(m);
    LM_CHECK_MSG(lm_streq(seq, "message_start ping content_block_start:thinking content_block_delta:thinking_delta "
                               "content_block_delta:signature_delta content_block_stop content_block_start:text "
                               "content_block_delta:text_delta content_block_stop content_block_start:tool_use "
                               "content_block_delta:input_json_delta content_block_stop message_delta message_stop"),
                 "%s", seq);
    free(seq);
    LM_CHECK(lm_streq(str_at(json_object_get(ev_data(m, 7), "delta"), "text"), "Let me check."));
    const json_t *tb = json_object_get(ev_data(m, 9), "content_block");
    LM_CHECK(json_integer_value(json_object_get(ev_data(m, 9), "index")) == 2);
    LM_CHECK(!strncmp(str_at(tb, "id"), "toolu_", 6) && strlen(str_at(tb, "id")) > 10);
    LM_CHECK(lm_streq(str_at(tb, "name"), "get_weather"));
    LM_CHECK(json_is_object(json_object_get(tb, "input")) && json_object_size(json_object_get(tb, "input")) == 0);
    /* the input_json_delta pieces, concatenated, are the input */
    json_t *input = json_loads(str_at(json_object_get(ev_data(m, 10), "delta"), "partial_json"), 0, NULL);
    LM_CHECK(lm_streq(str_at(input, "city"), "Paris") && json_object_size(input) == 1);
    json_decref(input);
    LM_CHECK(lm_streq(str_at(json_object_get(ev_data(m, 12), "delta"), "stop_reason"), "tool_use"));
    json_decref(m);

    json_t *msg = message_of(&f, k_tools, k_call_answer, LM_FINISH_STOP);
    LM_REQUIRE(msg);
    const json_t *c = json_object_get(msg, "content");
    LM_REQUIRE(json_array_size(c) == 3);
    const json_t *tu = json_array_get(c, 2);
    LM_CHECK(lm_streq(str_at(tu, "type"), "tool_use") && !strncmp(str_at(tu, "id"), "toolu_", 6));
    LM_CHECK(lm_streq(str_at(json_object_get(tu, "input"), "city"), "Paris"));
    LM_CHECK(lm_streq(str_at(msg, "stop_reason"), "tool_use"));
    json_decref(msg);

    /* two calls; disable_parallel_tool_use keeps the first */
    char two[512];
    snprintf(two, sizeof two, "%s\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
             k_call_answer);
    char extra[512];
    snprintf(extra, sizeof extra, "%s,\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true}", k_tools);
    for (int one = 0; one < 2; one++) {
        json_t *s = stream_of(&f, one ? extra : k_tools, two, LM_FINISH_STOP);
        json_t *w = message_of(&f, one ? extra : k_tools, two, LM_FINISH_STOP);
        LM_REQUIRE(s && w);
        int n_stream = 0;
        for (size_t i = 0; i < json_array_size(s); i++)
            n_stream += lm_streq(str_at(json_object_get(ev_data(s, i), "content_block"), "type"), "tool_use");
        LM_CHECK_MSG(n_stream == (one ? 1 : 2), "one %d: %d tool_use blocks", one, n_stream);
        LM_CHECK(json_array_size(json_object_get(w, "content")) == (size_t)(one ? 3 : 4));
        json_decref(s);
        json_decref(w);
    }
    srv_fx_close(&f);
}

LM_TEST(server_anthropic_stream_max_tokens_and_stop_sequence) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    const char *off = "\"thinking\":{\"type\":\"disabled\"}";
    json_t *m = stream_of(&f, off, "cut off in the mid", LM_FINISH_LENGTH);
    LM_REQUIRE(m);
    const json_t *md = ev_data(m, json_array_size(m) - 2);
    LM_CHECK(lm_streq(str_at(md, "type"), "message_delta"));
    LM_CHECK(lm_streq(str_at(json_object_get(md, "delta"), "stop_reason"), "max_tokens"));
    json_decref(m);
    json_t *w = message_of(&f, off, "cut off in the mid", LM_FINISH_LENGTH);
    LM_REQUIRE(w);
    LM_CHECK(lm_streq(str_at(w, "stop_reason"), "max_tokens"));
    json_decref(w);

    char extra[256];
    snprintf(extra, sizeof extra, "%s,\"stop_sequences\":[\"NEVER\",\"END\"]", off);
    m = stream_of(&f, extra, "alpha beta END gamma", LM_FINISH_STOP);
    LM_REQUIRE(m);
    md = ev_data(m, json_array_size(m) - 2);
    LM_CHECK(lm_streq(str_at(json_object_get(md, "delta"), "stop_reason"), "stop_sequence"));
    LM_CHECK(lm_streq(str_at(json_object_get(md, "delta"), "stop_sequence"), "END"));
    LM_CHECK(lm_streq(str_at(json_object_get(ev_data(m, 3), "delta"), "text"), "alpha beta "));
    json_decref(m);
    w = message_of(&f, extra, "alpha beta END gamma", LM_FINISH_STOP);
    LM_REQUIRE(w);
    LM_CHECK(lm_streq(str_at(w, "stop_reason"), "stop_sequence") && lm_streq(str_at(w, "stop_sequence"), "END"));
    LM_CHECK(lm_streq(str_at(json_array_get(json_object_get(w, "content"), 0), "text"), "alpha beta "));
    json_decref(w);
    srv_fx_close(&f);
}

LM_TEST(server_anthropic_stream_error_event) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    json_t *m = stream_of(&f, "\"thinking\":{\"type\":\"disabled\"}", "partial answ", LM_FINISH_ERROR);
    LM_REQUIRE(m);
    char *seq = sequence(m);
    LM_CHECK_MSG(lm_streq(seq, "message_start ping content_block_start:text content_block_delta:text_delta "
                               "content_block_stop error"), "%s", seq);
    free(seq);
    const json_t *err = ev_data(m, json_array_size(m) - 1);
    LM_CHECK(lm_streq(str_at(json_object_get(err, "error"), "type"), "api_error"));
    LM_CHECK(strstr(str_at(json_object_get(err, "error"), "message"), "the GPU fell off") != NULL);
    json_decref(m);
    srv_fx_close(&f);
}

/* The same events however the text is split into tokens (every split point
 * into two pieces, and one token per byte), and however the SSE bytes are
 * read (whole, one by one, in 7-byte pieces). */
LM_TEST(server_anthropic_stream_split_points) {
    fx f;
    if (!srv_fx_open(&f, "qwen3", 4096)) LM_SKIP("../shared/fixtures/models/qwen3 not found");
    const char *text = k_call_answer;
    size_t len = strlen(text);
    json_t *ref = stream_of(&f, k_tools, text, LM_FINISH_STOP);
    LM_REQUIRE(ref);
    /* message ids differ per run: compare without them */
    json_object_del(json_object_get(ev_data(ref, 0), "message"), "id");
    json_t *ref_blocks = json_deep_copy(ref);
    for (size_t i = 0; i < json_array_size(ref_blocks); i++) /* tool ids too */
        json_object_del(json_object_get(json_object_get(json_array_get(ref_blocks, i), "data"), "content_block"), "id");
    int fails = 0;
    size_t *cuts = lm_xmalloc(len * sizeof *cuts);
    for (size_t k = 0; k <= len; k++) {
        int n_cuts;
        if (k < len) {
            cuts[0] = k;
            n_cuts = 1;
        } else { /* one token per byte */
            for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
            n_cuts = (int)len - 1;
        }
        run x;
        LM_REQUIRE(run_start(&f, &x, k_tools, true));
        feed_cut(&f, &x.o, text, cuts, n_cuts, LM_FINISH_STOP);
        size_t steps[] = { 0, 1, 7 };
        json_t *first = NULL;
        for (size_t s = 0; s < LM_COUNT(steps) && (k == len || s == 0 || k % 16 == 0); s++) {
            int bad = 0;
            json_t *ev = sse_read(x.o.sse.s, x.o.sse.len, steps[s], &bad);
            if (bad) fails++;
            if (!first) first = json_incref(ev);
            else if (!json_equal(first, ev)) fails++;
            json_decref(ev);
        }
        int mm = 0;
        json_t *m = merged(first, &mm);
        json_decref(first);
        json_object_del(json_object_get(ev_data(m, 0), "message"), "id");
        for (size_t i = 0; i < json_array_size(m); i++)
            json_object_del(json_object_get(json_object_get(json_array_get(m, i), "data"), "content_block"), "id");
        /* output_tokens counts tokens, which the split changes */
        json_t *fixed_usage = json_object_get(ev_data(ref_blocks, json_array_size(ref_blocks) - 2), "usage");
        json_t *u = json_object_get(json_object_get(json_array_get(m, json_array_size(m) - 2), "data"), "usage");
        if (u && fixed_usage) json_object_set(u, "output_tokens", json_object_get(fixed_usage, "output_tokens"));
        if (mm || !json_equal(m, ref_blocks)) {
            if (fails < 3) {
                char *a = json_dumps(m, JSON_COMPACT), *b = json_dumps(ref_blocks, JSON_COMPACT);
                fprintf(stderr, "  split %zu:\n    got  %s\n    want %s\n", k, a, b);
                free(a);
                free(b);
            }
            fails++;
        }
        json_decref(m);
        run_end(&x);
    }
    free(cuts);
    LM_CHECK_MSG(fails == 0, "%d splittings differ", fails);
    json_decref(ref);
    json_decref(ref_blocks);
    srv_fx_close(&f);
}
