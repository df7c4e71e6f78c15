/* anthropic_stream.c - the objects and events of the Anthropic Messages API:
 * what output.c's text, reasoning and tool-call deltas become on
 * /v1/messages (an srv_out sink), and Anthropic's error body.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

#define ANTH_SIGNATURE "lumen-unsigned"

enum { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING, BLOCK_TOOL };

/* The sink's state: the blocks so far (the whole message is built from
 * them; a stream also writes them as events). */
typedef struct anth_state {
    json_t *blocks;    /* the message's content blocks, in order */
    int open;          /* BLOCK_* of the last block while it can still grow */
    bool one_call;     /* tool_choice.disable_parallel_tool_use */
    bool omit;         /* thinking.display "omitted": thinking blocks without text */
    int n_prompt;      /* the prompt's tokens, for message_start */
    json_t *stops;     /* stop_sequences (a reference), or NULL */
    char *text;        /* the open text or thinking block's text so far */
    size_t text_len, text_cap;
    char id[40];       /* "msg_..." */
    bool started;      /* a stream's message_start is out */
} anth_state;

static json_t *typed(const char *type) {
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string(type));
    return j;
}

/* "event: TYPE\ndata: {json}\n\n" (the event is named by its type); steals d. */
static void event(srv_out *o, json_t *d) {
    char name[32];
    snprintf(name, sizeof name, "%s", json_string_value(json_object_get(d, "type")));
    srv_sse_event(o, name, d);
}

/* ---- pieces shared by the stream and the whole message -------------------------------- */

const char *srv_anth_stop_reason(const srv_out *o) {
    if (o->stopped) return o->n_tool_calls > 0 ? "tool_use" : "stop_sequence";
    if (o->finish == LM_FINISH_LENGTH) return "max_tokens";
    return o->n_tool_calls > 0 ? "tool_use" : "end_turn";
}

/* The stop sequence that ended the answer (a JSON string), or null. */
static json_t *stop_sequence(const srv_out *o) {
    const anth_state *st = o->sink_user;
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
    json_t *j = n ? json_loadb(args, n, JSON_ALLOW_NUL, NULL) : NULL;
    if (json_is_object(j)) return j;
    json_decref(j);
    return json_object();
}

static json_t *message_base(const srv_out *o) {
    const anth_state *st = o->sink_user;
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(st->id));
    json_object_set_new(m, "type", json_string("message"));
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "model", json_string(o->s->model_name));
    return m;
}

/* ---- blocks, and their events when streaming ------------------------------------------- */

/* A stream's first events, before any block (also when srv_out_init_sink
 * routes a forced call's prefill before srv_anth_out_init returns). */
static void stream_start(srv_out *o) {
    anth_state *st = o->sink_user;
    if (!o->stream || st->started) return;
    st->started = true;
    json_t *m = message_base(o);
    json_object_set_new(m, "content", json_array());
    json_object_set_new(m, "stop_reason", json_null());
    json_object_set_new(m, "stop_sequence", json_null());
    json_object_set_new(m, "usage", usage(st->n_prompt, 0, 0));
    json_t *ev = typed("message_start");
    json_object_set_new(ev, "message", m);
    event(o, ev);
    event(o, typed("ping"));
}

static int last_index(const anth_state *st) { return (int)json_array_size(st->blocks) - 1; }

static void block_stop(srv_out *o) {
    anth_state *st = o->sink_user;
    if (st->open == BLOCK_NONE) return;
    json_t *last = json_array_get(st->blocks, (size_t)last_index(st));
    if (st->open == BLOCK_TEXT || st->open == BLOCK_THINKING) { /* its text, once */
        const char *key = st->open == BLOCK_TEXT ? "text" : "thinking";
        json_object_set_new(last, key, json_stringn_nocheck(st->text ? st->text : "", st->text_len));
        st->text_len = 0;
    }
    if (st->open == BLOCK_THINKING) {
        json_object_set_new(last, "signature", json_string(ANTH_SIGNATURE));
        if (o->stream) {
            json_t *d = typed("content_block_delta");
            json_object_set_new(d, "index", json_integer(last_index(st)));
            json_t *sig = typed("signature_delta");
            json_object_set_new(sig, "signature", json_string(ANTH_SIGNATURE));
            json_object_set_new(d, "delta", sig);
            event(o, d);
        }
    }
    if (o->stream) {
        json_t *e = typed("content_block_stop");
        json_object_set_new(e, "index", json_integer(last_index(st)));
        event(o, e);
    }
    st->open = BLOCK_NONE;
}

/* Closes the open block and starts block (stolen; as it starts, empty). */
static void block_start(srv_out *o, json_t *block, int kind) {
    anth_state *st = o->sink_user;
    stream_start(o);
    block_stop(o);
    json_array_append_new(st->blocks, block);
    if (o->stream) {
        json_t *e = typed("content_block_start");
        json_object_set_new(e, "index", json_integer(last_index(st)));
        json_object_set_new(e, "content_block", json_deep_copy(block));
        event(o, e);
    }
    st->open = kind;
}

/* Appends text to the open block (kept apart until block_stop, so that a long
 * answer is not copied per delta) and streams it as a delta of type dtype. */
static void block_grow(srv_out *o, const char *key, const char *dtype, const char *s, size_t n) {
    anth_state *st = o->sink_user;
    if (st->text_len + n + 1 > st->text_cap) {
        st->text_cap = LM_MAX(st->text_cap * 2, st->text_len + n + 1);
        st->text = lm_xrealloc(st->text, st->text_cap);
    }
    memcpy(st->text + st->text_len, s, n);
    st->text_len += n;
    if (!o->stream) return;
    json_t *d = typed(dtype);
    json_object_set_new(d, key, json_stringn_nocheck(s, n));
    json_t *e = typed("content_block_delta");
    json_object_set_new(e, "index", json_integer(last_index(st)));
    json_object_set_new(e, "delta", d);
    event(o, e);
}

/* ---- the sink --------------------------------------------------------------------------- */

static void sink_reasoning(srv_out *o, const char *s, size_t n) {
    anth_state *st = o->sink_user;
    if (st->open != BLOCK_THINKING) {
        json_t *b = typed("thinking");
        json_object_set_new(b, "thinking", json_string(""));
        json_object_set_new(b, "signature", json_string(""));
        block_start(o, b, BLOCK_THINKING);
    }
    if (!st->omit) block_grow(o, "thinking", "thinking_delta", s, n);
}

static void sink_content(srv_out *o, const char *s, size_t n) {
    anth_state *st = o->sink_user;
    if (st->open != BLOCK_TEXT) {
        json_t *b = typed("text");
        json_object_set_new(b, "text", json_string(""));
        block_start(o, b, BLOCK_TEXT);
    }
    block_grow(o, "text", "text_delta", s, n);
}

/* Each call arrives whole (atomic parser): a tool_use block, its input as
 * one input_json_delta (always an object: {} when the model wrote
 * arguments that are not one), and its stop. */
static void sink_tool_calls(srv_out *o, const lm_toolcall_out *t) {
    anth_state *st = o->sink_user;
    for (int i = 0; i < t->n_calls; i++) {
        const lm_toolcall_delta *c = &t->calls[i];
        if (!c->name || (st->one_call && c->index > 0)) continue;
        json_t *b = typed("tool_use");
        json_object_set_new(b, "id", tool_id(c->id ? c->id : ""));
        json_object_set_new(b, "name", json_string(c->name));
        json_object_set_new(b, "input", json_object());
        block_start(o, b, BLOCK_TOOL);
        json_t *input = tool_input(c->args, c->args_len);
        if (o->stream) {
            char *text = srv_dump(input, false, NULL);
            json_t *d = typed("input_json_delta");
            json_object_set_new(d, "partial_json", json_string(text));
            free(text);
            json_t *e = typed("content_block_delta");
            json_object_set_new(e, "index", json_integer(last_index(st)));
            json_object_set_new(e, "delta", d);
            event(o, e);
        }
        json_object_set_new(json_array_get(st->blocks, (size_t)last_index(st)), "input", input);
        block_stop(o);
    }
}

/* After the final event: the last block closes; a stream ends with
 * message_delta and message_stop, or an error event. */
static void sink_end(srv_out *o) {
    stream_start(o);
    block_stop(o);
    if (!o->stream) return;
    if (!o->stopped && (o->finish == LM_FINISH_ERROR || o->finish == LM_FINISH_CANCELLED)) {
        srv_err e;
        if (o->finish == LM_FINISH_ERROR) srv_fail(&e, 500, "api_error", NULL, NULL, "%s", o->error);
        else srv_shutdown_error(&e);
        event(o, srv_anth_error_json(&e));
        return;
    }
    json_t *d = json_object();
    json_object_set_new(d, "stop_reason", json_string(srv_anth_stop_reason(o)));
    json_object_set_new(d, "stop_sequence", stop_sequence(o));
    json_t *e = typed("message_delta");
    json_object_set_new(e, "delta", d);
    json_object_set_new(e, "usage", usage(o->n_prompt, o->n_cached, o->n_generated));
    event(o, e);
    event(o, typed("message_stop"));
}

static const srv_out_sink k_sink = {
    .reasoning = sink_reasoning,
    .content = sink_content,
    .tool_calls = sink_tool_calls,
    .end = sink_end,
};

/* ---- public ------------------------------------------------------------------------------ */

int srv_anth_out_init(srv_out *o, const srv *s, const srv_req *r, const lm_chat_prompt *p, srv_err *e) {
    anth_state *st = lm_xcalloc(1, sizeof *st);
    st->blocks = json_array();
    st->one_call = r->one_tool_call;
    st->omit = r->omit_thinking;
    st->n_prompt = r->n_prompt_tokens;
    st->stops = r->stop ? json_incref((json_t *)r->stop) : NULL;
    srv_make_id(st->id, sizeof st->id, "msg_");
    int rc = srv_out_init_sink(o, s, r, p, &k_sink, st, e);
    o->sink_user = st; /* also after a failure: srv_anth_out_done frees it */
    if (!rc) stream_start(o);
    return rc;
}

void srv_anth_out_done(srv_out *o) {
    anth_state *st = o->sink_user;
    if (!st) return;
    json_decref(st->blocks);
    json_decref(st->stops);
    free(st->text);
    free(st);
    o->sink_user = NULL;
}

json_t *srv_anth_message(const srv_out *o) {
    const anth_state *st = o->sink_user;
    json_t *m = message_base(o);
    json_object_set_new(m, "content", json_deep_copy(st->blocks));
    json_object_set_new(m, "stop_reason", json_string(srv_anth_stop_reason(o)));
    json_object_set_new(m, "stop_sequence", stop_sequence(o));
    json_object_set_new(m, "usage", usage(o->n_prompt, o->n_cached, o->n_generated));
    return m;
}

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
