/* output.c - a request's token events -> OpenAI output.
 *
 * Every generated token goes through one pipeline:
 *
 *   token id -> (stop token or hidden special: no text) -> streaming
 *   detokenizer -> stop-string matcher -> [chat] reasoning parser ->
 *   reasoning_content | content -> [chat with tools] tool-call parser ->
 *   content | tool_calls
 *
 * and whatever comes out is emitted at once: as SSE chunks when streaming
 * (o->sse, drained by the connection), else collected for the final
 * response; or, for another API's shapes, handed to an srv_out_sink
 * (the Responses API's builder) that writes its own events and object.
 * Nothing here touches the network or the engine; the caller cancels the
 * request when srv_out_event says a stop string matched.
 *
 * Special tokens are hidden (what skip_special_tokens does) except the tags
 * the parsers need: <think>, </think>, <tool_call>, </tool_call> are special
 * in some tokenizers and must reach the parsers as text.
 *
 * Logprobs are per token, but a token's text may be held back by the parsers;
 * a token's entry therefore rides on the next chunk that is sent (or the
 * final one). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server_internal.h"

static void str_put(lm_tok_str *s, const char *p, size_t n) {
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1) cap *= 2;
        s->s = lm_xrealloc(s->s, cap);
        s->cap = cap;
    }
    if (n) memcpy(s->s + s->len, p, n);
    s->len += n;
    s->s[s->len] = 0;
}

/* ---- stream chunks ----------------------------------------------------------------- */

/* One chat chunk with the given delta (stolen); attaches pending logprobs. */
static void chat_chunk(srv_out *o, json_t *delta, const char *finish) {
    json_t *c = srv_chunk_base(o);
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(o->index));
    json_object_set_new(choice, "delta", delta);
    if (o->logprobs && json_array_size(o->pending_lp)) {
        json_t *lp = json_object();
        json_object_set_new(lp, "content", o->pending_lp);
        json_object_set_new(lp, "refusal", json_null());
        json_object_set_new(choice, "logprobs", lp);
        o->pending_lp = json_array();
    } else {
        json_object_set_new(choice, "logprobs", json_null());
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_array_append_new(json_object_get(c, "choices"), choice);
    srv_sse_put(o, c);
}

/* Completions logprobs of the tokens not sent yet: {tokens, token_logprobs,
 * top_logprobs, text_offset}, and a fresh set of arrays. */
static json_t *take_completion_lp(srv_out *o) {
    json_t *lp = json_object();
    json_object_set_new(lp, "tokens", o->lp_tokens);
    json_object_set_new(lp, "token_logprobs", o->lp_token_logprobs);
    json_object_set_new(lp, "top_logprobs", o->lp_top);
    json_object_set_new(lp, "text_offset", o->lp_offsets);
    o->lp_tokens = json_array();
    o->lp_token_logprobs = json_array();
    o->lp_top = json_array();
    o->lp_offsets = json_array();
    return lp;
}

static void completion_chunk(srv_out *o, const char *text, size_t n, const char *finish) {
    json_t *c = srv_chunk_base(o);
    json_t *choice = json_object();
    json_object_set_new(choice, "text", json_stringn_nocheck(text, n));
    json_object_set_new(choice, "index", json_integer(o->index));
    bool have_lp = o->logprobs && json_array_size(o->lp_tokens);
    json_object_set_new(choice, "logprobs", have_lp ? take_completion_lp(o) : json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_array_append_new(json_object_get(c, "choices"), choice);
    srv_sse_put(o, c);
}

/* ---- routing text to the output --------------------------------------------------- */

static void emit_reasoning(srv_out *o, const char *s, size_t n) {
    if (!n) return;
    if (o->sink) {
        o->sink->reasoning(o, s, n);
        return;
    }
    if (!o->stream) {
        str_put(&o->reasoning, s, n);
        return;
    }
    json_t *d = json_object();
    json_object_set_new(d, "reasoning_content", json_stringn_nocheck(s, n));
    chat_chunk(o, d, NULL);
}

static void emit_content(srv_out *o, const char *s, size_t n) {
    if (!n) return;
    if (o->sink) {
        o->sink->content(o, s, n);
        return;
    }
    if (!o->stream) {
        str_put(&o->content, s, n);
        return;
    }
    if (o->kind == SRV_COMPLETION) {
        completion_chunk(o, s, n, NULL);
        return;
    }
    json_t *d = json_object();
    json_object_set_new(d, "content", json_stringn_nocheck(s, n));
    chat_chunk(o, d, NULL);
}

static void emit_tool_out(srv_out *o, const lm_toolcall_out *t) {
    emit_content(o, t->content, t->content_len);
    if (o->sink) {
        if (t->n_calls) o->sink->tool_calls(o, t);
        return;
    }
    if (!o->stream) return; /* calls are read from the parser at the end */
    json_t *calls = lm_toolcall_out_json(t);
    if (!calls) return;
    json_t *d = json_object();
    json_object_set_new(d, "tool_calls", calls);
    chat_chunk(o, d, NULL);
}

/* Text after the stop matcher: to the parsers (chat) or straight out. */
static void route(srv_out *o, const char *s, size_t n) {
    if (o->kind == SRV_COMPLETION || (!o->reason && !o->tools)) {
        emit_content(o, s, n);
        return;
    }
    const char *content = s;
    size_t clen = n;
    if (o->reason) {
        lm_reasoning_delta d;
        lm_reasoning_parser_feed(o->reason, s, n, &d);
        emit_reasoning(o, d.reasoning, d.reasoning_len);
        content = d.content;
        clen = d.content_len;
    }
    if (o->tools) {
        lm_toolcall_out t;
        lm_toolcall_parser_feed(o->tools, content, clen, &t);
        emit_tool_out(o, &t);
    } else {
        emit_content(o, content, clen);
    }
}

/* Flushes the parsers at the end of generation. */
static void route_finish(srv_out *o) {
    if (o->kind == SRV_COMPLETION) return;
    if (o->reason) {
        lm_reasoning_delta d;
        lm_reasoning_parser_finish(o->reason, &d);
        emit_reasoning(o, d.reasoning, d.reasoning_len);
        if (o->tools) {
            lm_toolcall_out t;
            lm_toolcall_parser_feed(o->tools, d.content, d.content_len, &t);
            emit_tool_out(o, &t);
        } else {
            emit_content(o, d.content, d.content_len);
        }
    }
    if (o->tools) {
        lm_toolcall_out t;
        o->n_tool_calls = lm_toolcall_parser_finish(o->tools, &t);
        emit_tool_out(o, &t);
    }
}

/* Raw generated text: through the stop matcher, then routed. */
static void feed_text(srv_out *o, const char *s, size_t n) {
    if (o->stopped) return;
    lm_stop_result r;
    lm_stop_matcher_feed(o->stop, s, n, &r);
    route(o, r.text, r.len);
    if (r.stopped) {
        o->stopped = true;
        o->stop_which = r.which;
    }
}

static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static void record_logprobs(srv_out *o, const lm_token_event *ev) {
    const srv *s = o->s;
    lm_tok_str tmp = { 0 };
    if (o->kind == SRV_CHAT) {
        json_t *entry = srv_logprob_entry(s, ev->token, ev->logprob, &tmp);
        json_t *top = json_array();
        for (int i = 0; i < ev->n_top && i < o->top_logprobs; i++)
            json_array_append_new(top, srv_logprob_entry(s, ev->top_ids[i], ev->top_logprobs[i], &tmp));
        json_object_set_new(entry, "top_logprobs", top);
        json_array_append_new(o->stream ? o->pending_lp : o->logprob_list, entry);
    } else {
        srv_token_text(s, ev->token, &tmp);
        json_array_append_new(o->lp_tokens, json_stringn_nocheck(tmp.s ? tmp.s : "", tmp.len));
        json_array_append_new(o->lp_token_logprobs, json_real(ev->logprob));
        json_t *top = json_object();
        for (int i = 0; i < ev->n_top && i < o->top_logprobs; i++) {
            srv_token_text(s, ev->top_ids[i], &tmp);
            if (!json_object_get(top, tmp.s ? tmp.s : ""))
                json_object_set_new(top, tmp.s ? tmp.s : "", json_real(ev->top_logprobs[i]));
        }
        json_array_append_new(o->lp_top, top);
        json_array_append_new(o->lp_offsets, json_integer((json_int_t)o->text_offset));
    }
    lm_tok_str_free(&tmp);
}

static bool is_stop_token(const srv *s, int32_t id) {
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == id) return true;
    return false;
}

/* ---- public --------------------------------------------------------------------------- */

/* Choice `index` of n_choices sharing first's id (see srv_out_init_choice);
 * sink: another API's output (srv_out_init_sink), else NULL. */
static int out_init(srv_out *o, const srv *s, const srv_req *r, const lm_chat_prompt *chat, const char *echo,
                    size_t echo_len, int index, int n_choices, const srv_out *first, const srv_out_sink *sink,
                    void *sink_user, srv_err *e) {
    memset(o, 0, sizeof *o);
    o->s = s;
    o->sink = sink;
    o->sink_user = sink_user;
    o->kind = r->kind;
    o->stream = r->stream;
    o->include_usage = r->include_usage;
    o->logprobs = r->gp.logprobs;
    o->top_logprobs = r->gp.top_logprobs;
    o->index = index;
    o->no_tail = n_choices > 1;
    if (first) {
        memcpy(o->id, first->id, sizeof o->id);
        o->created = first->created;
    } else {
        srv_make_id(o->id, sizeof o->id, r->kind == SRV_CHAT ? "chatcmpl-" : "cmpl-");
        o->created = (int64_t)time(NULL);
    }
    o->detok = lm_detok_create(s->tok, false);
    lm_err le = { { 0 } };
    o->stop = lm_stop_matcher_create_json(r->stop, &le);
    if (!o->stop) return srv_bad(e, "stop", "%s", le.msg);
    o->logprob_list = json_array();
    o->pending_lp = json_array();
    o->lp_tokens = json_array();
    o->lp_token_logprobs = json_array();
    o->lp_top = json_array();
    o->lp_offsets = json_array();
    if (r->kind == SRV_CHAT) {
        if (s->chat && s->chat->think) {
            lm_reasoning_opts ro = { .start_in_reasoning = chat && chat->start_in_reasoning };
            o->reason = lm_reasoning_parser_create(&ro, &le);
            if (!o->reason) return srv_fail(e, 500, "server_error", NULL, NULL, "%s", le.msg);
        }
        if (r->tools) {
            uint64_t seed = r->gp.sampling.seed ^ (uint64_t)(lm_now() * 1e9);
            lm_toolcall_opts to = { .tools = r->tools, .id_seed = seed, .atomic = !r->stream || sink };
            o->tools = lm_toolcall_parser_create(&to, &le);
            if (!o->tools) return srv_fail(e, 500, "server_error", NULL, NULL, "%s", le.msg);
        }
        if (o->stream && !sink) {
            json_t *d = json_object();
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            chat_chunk(o, d, NULL);
        }
        if (chat && chat->prefill) route(o, chat->prefill, strlen(chat->prefill));
        o->call_complete = chat && chat->call_complete;
    } else if (echo && echo_len) {
        emit_content(o, echo, echo_len);
        o->text_offset = utf8_chars(echo, echo_len);
    }
    o->role_sent = true;
    return 0;
}

int srv_out_init(srv_out *o, const srv *s, const srv_req *r, const lm_chat_prompt *chat, const char *echo,
                 size_t echo_len, srv_err *e) {
    return out_init(o, s, r, chat, echo, echo_len, 0, 1, NULL, NULL, NULL, e);
}

int srv_out_init_choice(srv_out *o, const srv *s, const srv_req *r, const lm_chat_prompt *chat, const char *echo,
                        size_t echo_len, int index, int n_choices, const srv_out *first, srv_err *e) {
    return out_init(o, s, r, chat, echo, echo_len, index, n_choices, first, NULL, NULL, e);
}

int srv_out_init_sink(srv_out *o, const srv *s, const srv_req *r, const lm_chat_prompt *chat,
                      const srv_out_sink *sink, void *sink_user, srv_err *e) {
    LM_ASSERT(r->kind == SRV_CHAT && sink);
    return out_init(o, s, r, chat, NULL, 0, 0, 1, NULL, sink, sink_user, e);
}

void srv_out_free(srv_out *o) {
    lm_detok_free(o->detok);
    lm_stop_matcher_free(o->stop);
    lm_reasoning_parser_free(o->reason);
    lm_toolcall_parser_free(o->tools);
    lm_tok_str_free(&o->piece);
    lm_tok_str_free(&o->content);
    lm_tok_str_free(&o->reasoning);
    lm_tok_str_free(&o->sse);
    json_decref(o->logprob_list);
    json_decref(o->pending_lp);
    json_decref(o->lp_tokens);
    json_decref(o->lp_token_logprobs);
    json_decref(o->lp_top);
    json_decref(o->lp_offsets);
    memset(o, 0, sizeof *o);
}

const char *srv_out_finish_reason(const srv_out *o) {
    if (o->stopped) return o->n_tool_calls > 0 ? "tool_calls" : "stop";
    switch (o->finish) {
    case LM_FINISH_LENGTH: return "length";
    case LM_FINISH_STOP: return o->n_tool_calls > 0 ? "tool_calls" : "stop";
    default: return "stop";
    }
}

/* The last chunks of a stream: finish_reason, usage, [DONE]; or an error. */
static void stream_end(srv_out *o) {
    bool failed = !o->stopped && (o->finish == LM_FINISH_ERROR || o->finish == LM_FINISH_CANCELLED);
    if (failed) {
        srv_err e;
        if (o->finish == LM_FINISH_ERROR) srv_fail(&e, 500, "server_error", NULL, NULL, "%s", o->error);
        else srv_shutdown_error(&e);
        srv_sse_put(o, srv_error_json(&e));
        if (!o->no_tail) srv_sse_done(o);
        return;
    }
    const char *fr = srv_out_finish_reason(o);
    if (o->kind == SRV_CHAT) chat_chunk(o, json_object(), fr);
    else completion_chunk(o, "", 0, fr);
    if (!o->no_tail) srv_out_tail(o, (const srv_out *const[]){ o }, 1);
}

void srv_out_tail(srv_out *dst, const srv_out *const *outs, int n) {
    if (dst->include_usage) {
        json_t *c = srv_chunk_base(dst);
        json_object_set_new(c, "usage", srv_usage_json_n(outs, n));
        srv_sse_put(dst, c);
    }
    srv_sse_done(dst);
}

bool srv_out_event(srv_out *o, const lm_token_event *ev) {
    if (o->done) return false;
    const srv *s = o->s;
    bool was_stopped = o->stopped;
    if (o->call_complete) o->stopped = true; /* the prefill was the answer: drop what the model adds */
    if (ev->has_token && !o->stopped) {
        bool stop_tok = is_stop_token(s, ev->token);
        if (o->logprobs && !stop_tok) record_logprobs(o, ev);
        if (!stop_tok && ev->token >= 0 && ev->token < s->n_vocab && !s->hidden[ev->token]) {
            o->piece.len = 0;
            lm_detok_push(o->detok, ev->token, &o->piece);
            o->text_offset += utf8_chars(o->piece.s ? o->piece.s : "", o->piece.len);
            feed_text(o, o->piece.s, o->piece.len);
        }
        if (o->reason && lm_reasoning_parser_in_reasoning(o->reason)) o->n_reasoning++;
    }
    if (ev->done) {
        o->done = true;
        o->finish = ev->finish;
        o->n_prompt = ev->n_prompt;
        o->n_cached = ev->n_cached;
        o->n_generated = ev->n_generated;
        o->queue_s = ev->queue_s;
        o->prefill_s = ev->prefill_s;
        if (ev->finish == LM_FINISH_ERROR) snprintf(o->error, sizeof o->error, "%s", ev->error ? ev->error : "engine error");
        if (!o->stopped) {
            o->piece.len = 0;
            lm_detok_finish(o->detok, &o->piece);
            feed_text(o, o->piece.s, o->piece.len);
        }
        if (!o->stopped) {
            lm_stop_result r;
            lm_stop_matcher_finish(o->stop, &r);
            route(o, r.text, r.len);
        }
        route_finish(o);
        if (o->sink) o->sink->end(o);
        else if (o->stream) stream_end(o);
    }
    return o->stopped && !was_stopped;
}

json_t *srv_out_response(srv_out *o) {
    const srv *s = o->s;
    json_t *res = json_object();
    json_object_set_new(res, "id", json_string(o->id));
    json_object_set_new(res, "object", json_string(o->kind == SRV_CHAT ? "chat.completion" : "text_completion"));
    json_object_set_new(res, "created", json_integer(o->created));
    json_object_set_new(res, "model", json_string(s->model_name));
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(o->index));
    if (o->kind == SRV_CHAT) {
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        json_t *calls = o->tools ? lm_toolcall_parser_calls_json(o->tools) : NULL;
        bool has_calls = calls && json_array_size(calls) > 0;
        if (o->content.len || !has_calls)
            json_object_set_new(msg, "content", json_stringn_nocheck(o->content.s ? o->content.s : "", o->content.len));
        else
            json_object_set_new(msg, "content", json_null());
        if (o->reasoning.len)
            json_object_set_new(msg, "reasoning_content", json_stringn_nocheck(o->reasoning.s, o->reasoning.len));
        if (has_calls) json_object_set(msg, "tool_calls", calls);
        json_decref(calls);
        json_object_set_new(msg, "refusal", json_null());
        json_object_set_new(choice, "message", msg);
        if (o->logprobs) {
            json_t *lp = json_object();
            json_object_set(lp, "content", o->logprob_list);
            json_object_set_new(lp, "refusal", json_null());
            json_object_set_new(choice, "logprobs", lp);
        } else {
            json_object_set_new(choice, "logprobs", json_null());
        }
    } else {
        json_object_set_new(choice, "text", json_stringn_nocheck(o->content.s ? o->content.s : "", o->content.len));
        json_object_set_new(choice, "logprobs", o->logprobs ? take_completion_lp(o) : json_null());
    }
    json_object_set_new(choice, "finish_reason", json_string(srv_out_finish_reason(o)));
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_object_set_new(res, "choices", choices);
    json_object_set_new(res, "usage", srv_usage_json(o));
    json_object_set_new(res, "system_fingerprint", json_string(s->fingerprint));
    return res;
}
