/* anthropic_stream.c - the objects and events of the Anthropic Messages API:
 * what output.c's text, reasoning and tool-call deltas become on
 * /v1/messages (srv_anth_wire), and Anthropic's error body.
 *
 * Shapes follow Anthropic's API reference and the @anthropic-ai/sdk types:
 *   message   {"id": "msg_...", "type": "message", "role": "assistant",
 *              "model", "content": [blocks], "stop_reason", "stop_sequence",
 *              "usage": {"input_tokens", "output_tokens",
 *              "cache_creation_input_tokens", "cache_read_input_tokens"}};
 *   blocks    {"type": "thinking", "thinking", "signature"},
 *             {"type": "text", "text"},
 *             {"type": "tool_use", "id": "toolu_...", "name", "input": {...}};
 *   stream    "event: NAME\ndata: JSON\n\n": message_start (the message with
 *             empty content), ping, then per block content_block_start,
 *             content_block_delta (text_delta, thinking_delta, signature_delta,
 *             input_json_delta), content_block_stop; message_delta (stop
 *             reason and usage), message_stop; a failure mid-stream is an
 *             `error` event instead of the last two;
 *   error     {"type": "error", "error": {"type", "message"}}.
 * Usage follows Anthropic's meaning: input_tokens are the prompt tokens not
 * read from lumen's prefix cache, cache_read_input_tokens the ones that were
 * (their sum is what count_tokens says); lumen writes no separate cache, so
 * cache_creation_input_tokens is 0. message_start cannot know the cache hit
 * yet: it counts the whole prompt as input, and message_delta carries the
 * final figures (the SDK overwrites them). Tool calls are emitted whole
 * (the parser's atomic mode), so a started tool_use block is never taken
 * back; its input arrives as one input_json_delta (always an object: {}
 * when the model wrote arguments that are not one). Thinking blocks carry a
 * fixed signature: lumen does not sign, and ignores signatures it is sent. */
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

#define ANTH_SIGNATURE "lumen-unsigned"

enum { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING, BLOCK_TOOL };

typedef struct anth_state {
    int next;          /* index of the next content block */
    int open;          /* BLOCK_* of the block being streamed */
    bool one_call;     /* tool_choice.disable_parallel_tool_use */
    bool omit;         /* thinking.display "omitted": thinking blocks without text */
    int n_prompt;      /* the prompt's tokens, for message_start */
    json_t *stops;     /* stop_sequences (a reference), or NULL */
} anth_state;

/* ---- SSE ------------------------------------------------------------------------- */

static void sse_put(srv_out *o, const char *p, size_t n) {
    lm_tok_str *s = &o->sse;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 1024;
        while (cap < s->len + n + 1) cap *= 2;
        s->s = lm_xrealloc(s->s, cap);
        s->cap = cap;
    }
    memcpy(s->s + s->len, p, n);
    s->len += n;
    s->s[s->len] = 0;
}

/* "event: NAME\ndata: {json}\n\n"; steals data. */
static void event(srv_out *o, const char *name, json_t *data) {
    size_t n;
    char *d = srv_dump(data, false, &n);
    json_decref(data);
    sse_put(o, "event: ", 7);
    sse_put(o, name, strlen(name));
    sse_put(o, "\ndata: ", 7);
    sse_put(o, d, n);
    sse_put(o, "\n\n", 2);
    free(d);
}

static json_t *typed(const char *type) {
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string(type));
    return j;
}

/* ---- pieces shared by the stream and the whole message -------------------------------- */

const char *srv_anth_stop_reason(const srv_out *o) {
    if (o->stopped) return o->n_tool_calls > 0 ? "tool_use" : "stop_sequence";
    if (o->finish == LM_FINISH_LENGTH) return "max_tokens";
    return o->n_tool_calls > 0 ? "tool_use" : "end_turn";
}

/* The stop sequence that ended the answer (a JSON string), or null. */
static json_t *stop_sequence(const srv_out *o) {
    const anth_state *st = o->wire_state;
    const json_t *s = o->stopped && o->n_tool_calls == 0 && st ? json_array_get(st->stops, (size_t)o->stop_which) : NULL;
    return s ? json_copy((json_t *)s) : json_null();
}

static json_t *usage(int n_prompt, int n_cached, int n_out) {
    json_t *u = json_object();
    json_object_set_new(u, "input_tokens", json_integer(n_prompt - n_cached));
    json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
    json_object_set_new(u, "cache_read_input_tokens", json_integer(n_cached));
    json_object_set_new(u, "output_tokens", json_integer(n_out));
    return u;
}

/* "call_XYZ" (the tool-call parser's ids) -> "toolu_XYZ". */
static json_t *tool_id(const char *id) {
    char buf[64];
    snprintf(buf, sizeof buf, "toolu_%s", strncmp(id, "call_", 5) ? id : id + 5);
    return json_string(buf);
}

/* The arguments' text as an object ({} when empty or not an object). */
static json_t *tool_input(const char *args, size_t n) {
    json_t *j = n ? json_loadb(args, n, 0, NULL) : NULL;
    if (json_is_object(j)) return j;
    json_decref(j);
    return json_object();
}

static json_t *message_base(const srv_out *o) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(o->id));
    json_object_set_new(m, "type", json_string("message"));
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "model", json_string(o->s->model_name));
    json_object_set_new(m, "content", json_array());
    return m;
}

/* ---- the stream ------------------------------------------------------------------------ */

static void block_stop(srv_out *o) {
    anth_state *st = o->wire_state;
    if (st->open == BLOCK_NONE) return;
    if (st->open == BLOCK_THINKING) {
        json_t *d = typed("content_block_delta");
        json_object_set_new(d, "index", json_integer(st->next - 1));
        json_t *sig = typed("signature_delta");
        json_object_set_new(sig, "signature", json_string(ANTH_SIGNATURE));
        json_object_set_new(d, "delta", sig);
        event(o, "content_block_delta", d);
    }
    json_t *e = typed("content_block_stop");
    json_object_set_new(e, "index", json_integer(st->next - 1));
    event(o, "content_block_stop", e);
    st->open = BLOCK_NONE;
}

/* Closes the open block and starts one (block is stolen). */
static void block_start(srv_out *o, json_t *block, int kind) {
    anth_state *st = o->wire_state;
    block_stop(o);
    json_t *e = typed("content_block_start");
    json_object_set_new(e, "index", json_integer(st->next++));
    json_object_set_new(e, "content_block", block);
    event(o, "content_block_start", e);
    st->open = kind;
}

static void block_delta(srv_out *o, json_t *delta) {
    anth_state *st = o->wire_state;
    json_t *e = typed("content_block_delta");
    json_object_set_new(e, "index", json_integer(st->next - 1));
    json_object_set_new(e, "delta", delta);
    event(o, "content_block_delta", e);
}

static void wire_open(srv_out *o, const srv_req *r) {
    anth_state *st = lm_xcalloc(1, sizeof *st);
    st->one_call = r->one_tool_call;
    st->omit = r->omit_thinking;
    st->n_prompt = r->n_prompt_tokens;
    st->stops = r->stop ? json_incref((json_t *)r->stop) : NULL;
    o->wire_state = st;
    srv_make_id(o->id, sizeof o->id, "msg_");
    if (!o->stream) return;
    json_t *m = message_base(o);
    json_object_set_new(m, "stop_reason", json_null());
    json_object_set_new(m, "stop_sequence", json_null());
    json_object_set_new(m, "usage", usage(st->n_prompt, 0, 0));
    json_t *e = typed("message_start");
    json_object_set_new(e, "message", m);
    event(o, "message_start", e);
    event(o, "ping", typed("ping"));
}

static void wire_reasoning(srv_out *o, const char *s, size_t n) {
    anth_state *st = o->wire_state;
    if (st->open != BLOCK_THINKING) {
        json_t *b = typed("thinking");
        json_object_set_new(b, "thinking", json_string(""));
        json_object_set_new(b, "signature", json_string(""));
        block_start(o, b, BLOCK_THINKING);
    }
    if (st->omit) return;
    json_t *d = typed("thinking_delta");
    json_object_set_new(d, "thinking", json_stringn_nocheck(s, n));
    block_delta(o, d);
}

static void wire_content(srv_out *o, const char *s, size_t n) {
    anth_state *st = o->wire_state;
    if (st->open != BLOCK_TEXT) {
        json_t *b = typed("text");
        json_object_set_new(b, "text", json_string(""));
        block_start(o, b, BLOCK_TEXT);
    }
    json_t *d = typed("text_delta");
    json_object_set_new(d, "text", json_stringn_nocheck(s, n));
    block_delta(o, d);
}

/* Each call arrives whole (atomic parser): a tool_use block, its input as
 * one input_json_delta, and its stop. */
static void wire_tool(srv_out *o, const lm_toolcall_out *t) {
    anth_state *st = o->wire_state;
    for (int i = 0; i < t->n_calls; i++) {
        const lm_toolcall_delta *c = &t->calls[i];
        if (!c->name || (st->one_call && c->index > 0)) continue;
        json_t *b = typed("tool_use");
        json_object_set_new(b, "id", tool_id(c->id ? c->id : ""));
        json_object_set_new(b, "name", json_string(c->name));
        json_object_set_new(b, "input", json_object());
        block_start(o, b, BLOCK_TOOL);
        /* the input as an object, as the whole message has it (a model may
         * write arguments that are not one: then {}) */
        json_t *input = tool_input(c->args, c->args_len);
        json_t *d = typed("input_json_delta");
        char *text = srv_dump(input, false, NULL);
        json_decref(input);
        json_object_set_new(d, "partial_json", json_string(text));
        free(text);
        block_delta(o, d);
        block_stop(o);
    }
}

static void wire_close(srv_out *o) {
    block_stop(o);
    if (!o->stopped && (o->finish == LM_FINISH_ERROR || o->finish == LM_FINISH_CANCELLED)) {
        srv_err e;
        srv_fail(&e, 500, "api_error", NULL, NULL, "%s",
                 o->finish == LM_FINISH_ERROR ? o->error : "The request was cancelled (the server is shutting down).");
        event(o, "error", srv_anth_error_json(&e));
        return;
    }
    json_t *d = json_object();
    json_object_set_new(d, "stop_reason", json_string(srv_anth_stop_reason(o)));
    json_object_set_new(d, "stop_sequence", stop_sequence(o));
    json_t *e = typed("message_delta");
    json_object_set_new(e, "delta", d);
    json_object_set_new(e, "usage", usage(o->n_prompt, o->n_cached, o->n_generated));
    event(o, "message_delta", e);
    event(o, "message_stop", typed("message_stop"));
}

/* ---- the whole message --------------------------------------------------------------- */

static json_t *wire_response(srv_out *o) {
    const anth_state *st = o->wire_state;
    json_t *m = message_base(o);
    json_t *content = json_object_get(m, "content");
    if (o->reasoning.len) {
        json_t *b = typed("thinking");
        json_object_set_new(b, "thinking", st->omit ? json_string("") : json_stringn_nocheck(o->reasoning.s, o->reasoning.len));
        json_object_set_new(b, "signature", json_string(ANTH_SIGNATURE));
        json_array_append_new(content, b);
    }
    if (o->content.len) {
        json_t *b = typed("text");
        json_object_set_new(b, "text", json_stringn_nocheck(o->content.s, o->content.len));
        json_array_append_new(content, b);
    }
    json_t *calls = o->tools ? lm_toolcall_parser_calls_json(o->tools) : NULL;
    for (size_t i = 0; i < json_array_size(calls) && !(st->one_call && i > 0); i++) {
        json_t *call = json_array_get(calls, i), *fn = json_object_get(call, "function");
        const json_t *args = json_object_get(fn, "arguments");
        json_t *b = typed("tool_use");
        json_object_set_new(b, "id", tool_id(json_string_value(json_object_get(call, "id"))));
        json_object_set(b, "name", json_object_get(fn, "name"));
        json_object_set_new(b, "input", tool_input(json_string_value(args), json_string_length(args)));
        json_array_append_new(content, b);
    }
    json_decref(calls);
    json_object_set_new(m, "stop_reason", json_string(srv_anth_stop_reason(o)));
    json_object_set_new(m, "stop_sequence", stop_sequence(o));
    json_object_set_new(m, "usage", usage(o->n_prompt, o->n_cached, o->n_generated));
    return m;
}

static void wire_free(srv_out *o) {
    anth_state *st = o->wire_state;
    if (!st) return;
    json_decref(st->stops);
    free(st);
    o->wire_state = NULL;
}

const srv_wire srv_anth_wire = {
    .open = wire_open,
    .reasoning = wire_reasoning,
    .content = wire_content,
    .tool = wire_tool,
    .close = wire_close,
    .response = wire_response,
    .free = wire_free,
    .atomic_tools = true,
};

/* ---- errors ---------------------------------------------------------------------------- */

const char *srv_anth_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

json_t *srv_anth_error_json(const srv_err *e) {
    json_t *in = json_object();
    json_object_set_new(in, "type", json_string(srv_anth_error_type(e->status)));
    json_object_set_new(in, "message", srv_lossy_string(e->msg[0] ? e->msg : "error"));
    json_t *o = typed("error");
    json_object_set_new(o, "error", in);
    return o;
}
