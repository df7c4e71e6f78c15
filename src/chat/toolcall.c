/* toolcall.c - tool calls in generated content, as OpenAI tool_calls deltas:
 * the parser object, the calls it has found and the deltas it hands out,
 * and their JSON. Formats, content framing and failure rules are in
 * lm_parse.h; toolcall_scan.c reads the text (the state machine).
 *
 * A call's arguments are built in call->args (append-only); deltas hand out
 * the bytes not sent yet (never the first bytes of an unfinished UTF-8
 * character). Output of one feed is collected in `out_*` and handed out as
 * pointers at the end. */
#include "chat/lm_parse.h"
#include "chat/parse_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- calls and deltas ----------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static char *make_id(lm_toolcall_parser *p, int index) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t x = p->seed ^ ((uint64_t)index * 0xD1B54A32D192ED03ull);
    char *id = lm_xmalloc(5 + 24 + 1);
    memcpy(id, "call_", 5);
    uint64_t r = 0;
    for (int i = 0; i < 24; i++) {
        if (i % 8 == 0) r = splitmix64(&x);
        id[5 + i] = abc[r % 62];
        r /= 62;
    }
    id[29] = 0;
    return id;
}

static void call_free(tc_call *c) {
    if (!c) return;
    free(c->id);
    free(c->name);
    lm_pbuf_free(&c->args);
    free(c);
}

tc_call *lm_tc_call_new(lm_toolcall_parser *p) {
    LM_ASSERT(!p->cur);
    p->cur = lm_xcalloc(1, sizeof *p->cur);
    p->cur->index = -1;
    return p->cur;
}

static out_delta *od_new(lm_toolcall_parser *p, tc_call *c, bool first) {
    if (p->n_od == p->cap_od) {
        p->cap_od = p->cap_od ? p->cap_od * 2 : 4;
        p->od = lm_xrealloc(p->od, (size_t)p->cap_od * sizeof *p->od);
    }
    out_delta *d = &p->od[p->n_od++];
    *d = (out_delta){ c, first, p->out_args.n, 0 };
    lm_pbuf_putc(&p->out_args, 0);
    return d;
}

/* Appends an arguments fragment to this feed's delta for c (coalescing). */
static void od_args(lm_toolcall_parser *p, tc_call *c, const char *s, size_t n) {
    out_delta *d = p->n_od && p->od[p->n_od - 1].call == c ? &p->od[p->n_od - 1] : od_new(p, c, false);
    p->out_args.n--; /* the fragment's NUL; d is the last fragment */
    lm_pbuf_put(&p->out_args, s, n);
    lm_pbuf_putc(&p->out_args, 0);
    d->len += n;
}

/* Gives c its index and id and emits its first delta (name). */
static void call_start(lm_toolcall_parser *p, tc_call *c) {
    LM_ASSERT(c->index < 0 && c->name);
    c->index = p->n_index++;
    c->id = make_id(p, c->index);
    if (p->n_calls == p->cap_calls) {
        p->cap_calls = p->cap_calls ? p->cap_calls * 2 : 4;
        p->calls = lm_xrealloc(p->calls, (size_t)p->cap_calls * sizeof *p->calls);
    }
    p->calls[p->n_calls++] = c;
    od_new(p, c, true);
}

/* Emits the arguments not sent yet; unless `all`, keeps back an unfinished
 * UTF-8 character. */
static void call_flush(lm_toolcall_parser *p, tc_call *c, bool all) {
    if (c->index < 0) return;
    size_t end = c->args.n;
    if (!all) end -= lm_parse_utf8_tail(c->args.p, end);
    if (end <= c->args_sent) return;
    od_args(p, c, c->args.p + c->args_sent, end - c->args_sent);
    c->args_sent = end;
}

/* The current call's name is known: in streaming mode it starts now. */
void lm_tc_call_named(lm_toolcall_parser *p) {
    if (p->atomic) return;
    call_start(p, p->cur);
    call_flush(p, p->cur, false);
}

void lm_tc_args_changed(lm_toolcall_parser *p) {
    if (!p->atomic) call_flush(p, p->cur, false);
}

void lm_tc_call_commit(lm_toolcall_parser *p) {
    tc_call *c = p->cur;
    if (c->index < 0) call_start(p, c);
    call_flush(p, c, true);
    c->committed = true;
    p->n_committed++;
    p->cur = NULL;
    lm_pbuf_clear(&p->raw);
    p->state = ST_CLOSE;
}

void lm_tc_content(lm_toolcall_parser *p, const char *s, size_t n) { lm_pbuf_put(&p->out_content, s, n); }

/* The current attempt is not a tool call: its text becomes content and the
 * caller resumes scanning in CONTENT at the byte that failed. */
void lm_tc_call_abort(lm_toolcall_parser *p) {
    lm_tc_content(p, p->raw.p, p->raw.n);
    lm_pbuf_clear(&p->raw);
    if (p->cur && p->cur->index < 0) call_free(p->cur); /* never seen by anyone */
    p->cur = NULL;                                      /* else owned by calls[] */
    free(p->pname);
    p->pname = NULL;
    p->state = ST_CONTENT;
    p->after_call = false;
    p->pend_ws = 0;
}

/* ---- API ------------------------------------------------------------------------- */

lm_toolcall_parser *lm_toolcall_parser_create(const lm_toolcall_opts *opts, lm_err *err) {
    lm_toolcall_opts o = opts ? *opts : (lm_toolcall_opts){ 0 };
    const char *open = o.open_tag ? o.open_tag : "<tool_call>";
    const char *close = o.close_tag ? o.close_tag : "</tool_call>";
    if (!open[0] || !close[0] || lm_parse_is_ws((unsigned char)open[0]) || lm_parse_is_ws((unsigned char)close[0])) {
        lm_errf(err, "tool-call tags must be non-empty and not start with whitespace");
        return NULL;
    }
    if (o.tools && !json_is_array(o.tools)) {
        lm_errf(err, "`tools` must be an array");
        return NULL;
    }
    lm_toolcall_parser *p = lm_xcalloc(1, sizeof *p);
    p->tools = o.tools ? json_incref(o.tools) : NULL;
    p->open = lm_xstrdup(open);
    p->close = lm_xstrdup(close);
    p->open_len = strlen(open);
    p->close_len = strlen(close);
    p->seed = o.id_seed;
    p->atomic = o.atomic;
    p->state = ST_CONTENT;
    return p;
}

static void begin_output(lm_toolcall_parser *p) {
    lm_pbuf_clear(&p->out_content);
    lm_pbuf_clear(&p->out_args);
    p->n_od = 0;
}

static void end_output(lm_toolcall_parser *p, lm_toolcall_out *out) {
    if (p->n_od > p->cap_deltas) {
        p->cap_deltas = p->n_od;
        p->deltas = lm_xrealloc(p->deltas, (size_t)p->cap_deltas * sizeof *p->deltas);
    }
    for (int i = 0; i < p->n_od; i++) {
        const out_delta *d = &p->od[i];
        p->deltas[i] = (lm_toolcall_delta){
            .index = d->call->index,
            .id = d->first ? d->call->id : NULL,
            .name = d->first ? d->call->name : NULL,
            .args = p->out_args.p + d->off,
            .args_len = d->len,
        };
    }
    out->content = lm_pbuf_str(&p->out_content);
    out->content_len = p->out_content.n;
    out->calls = p->deltas;
    out->n_calls = p->n_od;
}

void lm_toolcall_parser_feed(lm_toolcall_parser *p, const char *text, size_t n, lm_toolcall_out *out) {
    begin_output(p);
    lm_pbuf_put(&p->pend, text, n);
    lm_tc_run(p, false);
    end_output(p, out);
}

int lm_toolcall_parser_finish(lm_toolcall_parser *p, lm_toolcall_out *out) {
    begin_output(p);
    lm_tc_run(p, true);
    end_output(p, out);
    return p->n_committed;
}

/* A JSON string from bytes that may not be valid UTF-8 (invalid bytes become
 * U+FFFD), so building a response never fails on odd model output. */
static json_t *json_str(const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    if (v) return v;
    lm_pbuf b = { 0 };
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        json_t *one = len && i + len <= n ? json_stringn(s + i, len) : NULL;
        if (one) {
            lm_pbuf_put(&b, s + i, len);
            json_decref(one);
            i += len;
        } else {
            lm_pbuf_puts(&b, "\xEF\xBF\xBD");
            i++;
        }
    }
    v = json_stringn(lm_pbuf_str(&b), b.n);
    lm_pbuf_free(&b);
    return v;
}

static json_t *call_json(int index, const char *id, const char *name, const char *args, size_t args_len) {
    json_t *fn = json_object();
    if (name) json_object_set_new(fn, "name", json_str(name, strlen(name)));
    json_object_set_new(fn, "arguments", json_str(args, args_len));
    json_t *c = json_object();
    if (index >= 0) json_object_set_new(c, "index", json_integer(index));
    if (id) {
        json_object_set_new(c, "id", json_string(id));
        json_object_set_new(c, "type", json_string("function"));
    }
    json_object_set_new(c, "function", fn);
    return c;
}

json_t *lm_toolcall_out_json(const lm_toolcall_out *out) {
    if (!out->n_calls) return NULL;
    json_t *arr = json_array();
    for (int i = 0; i < out->n_calls; i++) {
        const lm_toolcall_delta *d = &out->calls[i];
        json_array_append_new(arr, call_json(d->index, d->id, d->name, d->args, d->args_len));
    }
    return arr;
}

json_t *lm_toolcall_parser_calls_json(const lm_toolcall_parser *p) {
    json_t *arr = json_array();
    for (int i = 0; i < p->n_calls; i++) {
        const tc_call *c = p->calls[i];
        if (!c->committed) continue;
        json_array_append_new(arr, call_json(-1, c->id, c->name, lm_pbuf_str(&c->args), c->args.n));
    }
    return arr;
}

void lm_toolcall_parser_free(lm_toolcall_parser *p) {
    if (!p) return;
    for (int i = 0; i < p->n_calls; i++) call_free(p->calls[i]);
    if (p->cur && p->cur->index < 0) call_free(p->cur);
    free(p->calls);
    json_decref(p->tools);
    free(p->open);
    free(p->close);
    free(p->pname);
    lm_pbuf_free(&p->pend);
    lm_pbuf_free(&p->raw);
    lm_pbuf_free(&p->out_content);
    lm_pbuf_free(&p->out_args);
    free(p->od);
    free(p->deltas);
    free(p);
}