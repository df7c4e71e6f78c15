/* responses_stream.c - the Responses API's output: output items and the
 * typed SSE events that build them, from srv_out's parsed deltas.
 *
 * Shapes follow the openai SDK's types (resources/responses) and the API
 * reference. An answer is a list of output items, each opened, filled and
 * closed in order; only one text item is open at a time:
 *   reasoning      {id "rs_", type, summary [], content [{type reasoning_text,
 *                   text}], status}: the model's think block, as text (no
 *                   encrypted_content). With reasoning.summary asked for,
 *                   summary is [{type summary_text, text}] with that same
 *                   text: lumen has no summariser, and Codex shows a
 *                   reasoning item only from its summary
 *   message        {id "msg_", type, status, role assistant, content
 *                   [{type output_text, text, annotations [], logprobs []}]}
 *   function_call  {id "fc_", type, status, arguments, call_id, name}
 * Events, each "event: TYPE\ndata: {type, sequence_number, ...}\n\n" with
 * sequence_number counting from 0:
 *   response.created, response.in_progress          the response, in_progress
 *   per text item: response.output_item.added, response.content_part.added,
 *     response.output_text.delta | response.reasoning_text.delta ...,
 *     response.output_text.done | response.reasoning_text.done,
 *     response.content_part.done, response.output_item.done
 *   a reasoning item with a summary adds, on summary_index 0:
 *     response.reasoning_summary_part.added after output_item.added, a
 *     response.reasoning_summary_text.delta before each reasoning_text.delta,
 *     response.reasoning_summary_text.done and
 *     response.reasoning_summary_part.done before reasoning_text.done
 *   per call: response.output_item.added, response.function_call_arguments
 *     .delta (the whole arguments: calls arrive complete), .done,
 *     response.output_item.done
 *   response.completed | response.incomplete (max_output_tokens; the open
 *     item closes as incomplete) | response.failed (an engine error; the
 *     response carries error {code, message})
 * A stream has no "[DONE]" line. The non-stream answer is the object of the
 * last event. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "responses.h"

typedef enum open_item { OPEN_NONE, OPEN_REASONING, OPEN_MESSAGE } open_item;

struct srv_resp_build {
    const srv *s;
    const srv_resp_req *q;
    char id[40];
    int64_t created_at;
    long seq;               /* the next event's sequence_number */
    bool started;           /* response.created sent */
    json_t *output;         /* closed items */
    open_item open;
    char item_id[40];       /* the open item's */
    lm_tok_str text;        /* the open item's text so far */
    const char *status;     /* after the end */
    json_t *error;          /* response.error when failed */
    json_t *usage;          /* after the end */
};

srv_resp_build *srv_resp_build_create(const srv *s, const srv_resp_req *q) {
    srv_resp_build *b = lm_xcalloc(1, sizeof *b);
    b->s = s;
    b->q = q;
    srv_make_id(b->id, sizeof b->id, "resp_");
    b->created_at = (int64_t)time(NULL);
    b->output = json_array();
    return b;
}

void srv_resp_build_free(srv_resp_build *b) {
    if (!b) return;
    json_decref(b->output);
    json_decref(b->error);
    json_decref(b->usage);
    lm_tok_str_free(&b->text);
    free(b);
}

const char *srv_resp_build_status(const srv_resp_build *b) { return b->status; }
const char *srv_resp_build_id(const srv_resp_build *b) { return b->id; }
const json_t *srv_resp_build_output(const srv_resp_build *b) { return b->output; }

json_t *srv_resp_build_response(srv_resp_build *b) {
    json_t *r = json_object();
    json_object_set_new(r, "id", json_string(b->id));
    json_object_set_new(r, "object", json_string("response"));
    json_object_set_new(r, "created_at", json_integer(b->created_at));
    const char *status = b->status ? b->status : "in_progress";
    json_object_set_new(r, "status", json_string(status));
    json_object_set_new(r, "background", json_false());
    if (!strcmp(status, "completed")) json_object_set_new(r, "completed_at", json_integer((json_int_t)time(NULL)));
    json_object_set_new(r, "error", b->error ? json_incref(b->error) : json_null());
    json_object_set_new(r, "incomplete_details", !strcmp(status, "incomplete")
                                                     ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                     : json_null());
    json_object_set_new(r, "model", json_string(b->s->model_name));
    json_object_set_new(r, "output", json_deep_copy(b->output));
    json_object_update(r, b->q->echo);
    json_object_set_new(r, "usage", b->usage ? json_incref(b->usage) : json_null());
    return r;
}

/* ---- events ------------------------------------------------------------------------ */

static json_t *event(const char *type) { return json_pack("{s:s}", "type", type); }

/* Numbers the event and writes it to the stream (stolen). */
static void emit(srv_resp_build *b, srv_out *o, json_t *ev) {
    json_object_set_new(ev, "sequence_number", json_integer(b->seq++));
    if (b->q->stream) srv_sse_event(o, json_string_value(json_object_get(ev, "type")), ev);
    else json_decref(ev);
}

static void emit_response(srv_resp_build *b, srv_out *o, const char *type) {
    json_t *ev = event(type);
    json_object_set_new(ev, "response", srv_resp_build_response(b));
    emit(b, o, ev);
}

void srv_resp_build_start(srv_resp_build *b, srv_out *o) {
    if (b->started) return;
    b->started = true;
    emit_response(b, o, "response.created");
    emit_response(b, o, "response.in_progress");
}

static int out_index(const srv_resp_build *b) { return (int)json_array_size(b->output); }

/* An item event: {type, item_id | item, output_index[, content_index]}. */
static json_t *item_event(const srv_resp_build *b, const char *type, bool content) {
    json_t *ev = event(type);
    json_object_set_new(ev, "item_id", json_string(b->item_id));
    json_object_set_new(ev, "output_index", json_integer(out_index(b)));
    if (content) json_object_set_new(ev, "content_index", json_integer(0));
    return ev;
}

/* A summary event: {type, item_id, output_index, summary_index}; the one
 * summary part is the whole reasoning text, so its index is 0. */
static json_t *summary_event(const srv_resp_build *b, const char *type) {
    json_t *ev = item_event(b, type, false);
    json_object_set_new(ev, "summary_index", json_integer(0));
    return ev;
}

static json_t *summary_part(const char *text, size_t n) {
    return json_pack("{s:s,s:o}", "type", "summary_text", "text", json_stringn_nocheck(text ? text : "", n));
}

/* Whether the open item is reasoning that carries a summary. */
static bool summarised(const srv_resp_build *b) { return b->open == OPEN_REASONING && b->q->summary; }

static json_t *text_part(const srv_resp_build *b, bool reasoning, const char *text, size_t n) {
    json_t *p = json_pack("{s:s}", "type", reasoning ? "reasoning_text" : "output_text");
    if (!reasoning) json_object_set_new(p, "annotations", json_array());
    if (!reasoning) json_object_set_new(p, "logprobs", json_array());
    json_object_set_new(p, "text", json_stringn_nocheck(text ? text : "", n));
    (void)b;
    return p;
}

/* The open item as an object, with status and its text so far. */
static json_t *open_item_json(const srv_resp_build *b, const char *status, bool with_text) {
    bool rs = b->open == OPEN_REASONING;
    json_t *it = json_object();
    json_object_set_new(it, "id", json_string(b->item_id));
    json_object_set_new(it, "type", json_string(rs ? "reasoning" : "message"));
    if (rs) {
        json_t *summary = json_array();
        if (with_text && summarised(b)) json_array_append_new(summary, summary_part(b->text.s, b->text.len));
        json_object_set_new(it, "summary", summary);
    }
    json_object_set_new(it, "status", json_string(status));
    if (!rs) json_object_set_new(it, "role", json_string("assistant"));
    json_t *content = json_array();
    if (with_text) json_array_append_new(content, text_part(b, rs, b->text.s, b->text.len));
    json_object_set_new(it, "content", content);
    return it;
}

static void close_item(srv_resp_build *b, srv_out *o, const char *status) {
    if (b->open == OPEN_NONE) return;
    bool rs = b->open == OPEN_REASONING;
    json_t *ev;
    if (summarised(b)) {
        ev = summary_event(b, "response.reasoning_summary_text.done");
        json_object_set_new(ev, "text", json_stringn_nocheck(b->text.s ? b->text.s : "", b->text.len));
        emit(b, o, ev);
        ev = summary_event(b, "response.reasoning_summary_part.done");
        json_object_set_new(ev, "part", summary_part(b->text.s, b->text.len));
        emit(b, o, ev);
    }
    ev = item_event(b, rs ? "response.reasoning_text.done" : "response.output_text.done", true);
    json_object_set_new(ev, "text", json_stringn_nocheck(b->text.s ? b->text.s : "", b->text.len));
    if (!rs) json_object_set_new(ev, "logprobs", json_array());
    emit(b, o, ev);
    ev = item_event(b, "response.content_part.done", true);
    json_object_set_new(ev, "part", text_part(b, rs, b->text.s, b->text.len));
    emit(b, o, ev);
    json_t *item = open_item_json(b, status, true);
    ev = event("response.output_item.done");
    json_object_set_new(ev, "output_index", json_integer(out_index(b)));
    json_object_set(ev, "item", item);
    emit(b, o, ev);
    json_array_append_new(b->output, item);
    b->open = OPEN_NONE;
    b->text.len = 0;
}

static void open_text_item(srv_resp_build *b, srv_out *o, open_item kind) {
    close_item(b, o, "completed");
    b->open = kind;
    srv_make_id(b->item_id, sizeof b->item_id, kind == OPEN_REASONING ? "rs_" : "msg_");
    json_t *ev = event("response.output_item.added");
    json_object_set_new(ev, "output_index", json_integer(out_index(b)));
    json_object_set_new(ev, "item", open_item_json(b, "in_progress", false));
    emit(b, o, ev);
    if (summarised(b)) {
        ev = summary_event(b, "response.reasoning_summary_part.added");
        json_object_set_new(ev, "part", summary_part("", 0));
        emit(b, o, ev);
    }
    ev = item_event(b, "response.content_part.added", true);
    json_object_set_new(ev, "part", text_part(b, kind == OPEN_REASONING, "", 0));
    emit(b, o, ev);
}

static void text_delta(srv_resp_build *b, srv_out *o, open_item kind, const char *s, size_t n) {
    srv_resp_build_start(b, o);
    if (b->open != kind) open_text_item(b, o, kind);
    if (b->text.len + n + 1 > b->text.cap) {
        b->text.cap = (b->text.len + n + 1) * 2;
        b->text.s = lm_xrealloc(b->text.s, b->text.cap);
    }
    memcpy(b->text.s + b->text.len, s, n);
    b->text.len += n;
    b->text.s[b->text.len] = 0;
    bool rs = kind == OPEN_REASONING;
    json_t *ev;
    if (summarised(b)) {
        ev = summary_event(b, "response.reasoning_summary_text.delta");
        json_object_set_new(ev, "delta", json_stringn_nocheck(s, n));
        emit(b, o, ev);
    }
    ev = item_event(b, rs ? "response.reasoning_text.delta" : "response.output_text.delta", true);
    json_object_set_new(ev, "delta", json_stringn_nocheck(s, n));
    if (!rs) json_object_set_new(ev, "logprobs", json_array());
    emit(b, o, ev);
}

static void sink_reasoning(srv_out *o, const char *s, size_t n) { text_delta(o->sink_user, o, OPEN_REASONING, s, n); }
static void sink_content(srv_out *o, const char *s, size_t n) { text_delta(o->sink_user, o, OPEN_MESSAGE, s, n); }

/* Complete calls (the parser runs atomic): each is added and done at once. */
static void sink_tool_calls(srv_out *o, const lm_toolcall_out *t) {
    srv_resp_build *b = o->sink_user;
    srv_resp_build_start(b, o);
    close_item(b, o, "completed");
    for (int i = 0; i < t->n_calls; i++) {
        const lm_toolcall_delta *d = &t->calls[i];
        if (!d->name) continue; /* atomic: a call's one delta carries its name */
        srv_make_id(b->item_id, sizeof b->item_id, "fc_");
        json_t *item = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", b->item_id, "type", "function_call", "status",
                                 "in_progress", "arguments", "", "call_id", d->id ? d->id : "", "name", d->name);
        json_t *ev = event("response.output_item.added");
        json_object_set_new(ev, "output_index", json_integer(out_index(b)));
        json_object_set(ev, "item", item);
        emit(b, o, ev);
        json_t *args = json_stringn_nocheck(d->args ? d->args : "", d->args_len);
        ev = item_event(b, "response.function_call_arguments.delta", false);
        json_object_set(ev, "delta", args);
        emit(b, o, ev);
        ev = item_event(b, "response.function_call_arguments.done", false);
        json_object_set_new(ev, "name", json_string(d->name));
        json_object_set(ev, "arguments", args);
        emit(b, o, ev);
        json_object_set_new(item, "status", json_string("completed"));
        json_object_set_new(item, "arguments", args);
        ev = event("response.output_item.done");
        json_object_set_new(ev, "output_index", json_integer(out_index(b)));
        json_object_set(ev, "item", item);
        emit(b, o, ev);
        json_array_append_new(b->output, item);
    }
}

static void sink_end(srv_out *o) {
    srv_resp_build *b = o->sink_user;
    srv_resp_build_start(b, o);
    bool failed = !o->stopped && (o->finish == LM_FINISH_ERROR || o->finish == LM_FINISH_CANCELLED);
    bool cut = !o->stopped && o->finish == LM_FINISH_LENGTH;
    close_item(b, o, cut || failed ? "incomplete" : "completed");
    b->usage = json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", o->n_prompt, "input_tokens_details",
                         "cached_tokens", o->n_cached, "output_tokens", o->n_generated, "output_tokens_details",
                         "reasoning_tokens", o->n_reasoning, "total_tokens", o->n_prompt + o->n_generated);
    if (failed) {
        b->status = "failed";
        const char *msg = o->finish == LM_FINISH_ERROR ? o->error
                                                       : "The request was cancelled (the server is shutting down).";
        b->error = json_pack("{s:s,s:o}", "code", "server_error", "message", srv_lossy_string(msg));
        emit_response(b, o, "response.failed");
    } else if (cut) {
        b->status = "incomplete";
        emit_response(b, o, "response.incomplete");
    } else {
        b->status = "completed";
        emit_response(b, o, "response.completed");
    }
}

const srv_out_sink srv_resp_sink = {
    .reasoning = sink_reasoning,
    .content = sink_content,
    .tool_calls = sink_tool_calls,
    .end = sink_end,
};
