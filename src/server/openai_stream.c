/* openai_stream.c - the JSON objects OpenAI's API sends, and SSE framing.
 *
 * Shapes follow the OpenAI API reference:
 *   chat.completion.chunk  {"id", "object", "created", "model",
 *                           "system_fingerprint", "choices": [{"index",
 *                           "delta", "logprobs", "finish_reason"}]}
 *                          plus "usage": null on every chunk when
 *                          stream_options.include_usage is set, and a last
 *                          chunk with "choices": [] and the usage;
 *   text_completion        the same with choices [{"text", "index",
 *                           "logprobs", "finish_reason"}];
 *   SSE                    "data: {json}\n\n" per chunk, "data: [DONE]\n\n"
 *                          at the end;
 *   error                  {"error": {"message", "type", "param", "code"}}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "server_internal.h"

void srv_make_id(char *out, size_t cap, const char *prefix) {
    static const char k_alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char rnd[24] = { 0 };
    ssize_t r = getrandom(rnd, sizeof rnd, 0);
    size_t got = r > 0 ? (size_t)r : 0;
    uint64_t x = (uint64_t)(lm_now() * 1e9) | 1;
    for (size_t i = got; i < sizeof rnd; i++) { /* fallback: xorshift from the clock */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        rnd[i] = (unsigned char)x;
    }
    size_t n = strlen(prefix);
    LM_ASSERT(cap > n + sizeof rnd);
    memcpy(out, prefix, n);
    for (size_t i = 0; i < sizeof rnd; i++) out[n + i] = k_alnum[rnd[i] % (sizeof k_alnum - 1)];
    out[n + sizeof rnd] = 0;
}

json_t *srv_chunk_base(const srv_out *o) {
    json_t *c = json_object();
    json_object_set_new(c, "id", json_string(o->id));
    json_object_set_new(c, "object", json_string(o->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion"));
    json_object_set_new(c, "created", json_integer(o->created));
    json_object_set_new(c, "model", json_string(o->s->model_name));
    json_object_set_new(c, "system_fingerprint", json_string(o->s->fingerprint));
    json_object_set_new(c, "choices", json_array());
    if (o->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

char *srv_dump(const json_t *j, bool nl, size_t *len) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    LM_ASSERT(s);
    size_t n = strlen(s);
    if (nl) {
        s = lm_xrealloc(s, n + 2);
        s[n++] = '\n';
        s[n] = 0;
    }
    if (len) *len = n;
    return s;
}

static void sse_append(srv_out *o, const char *p, size_t n) {
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

void srv_sse_put(srv_out *o, json_t *j) {
    size_t n;
    char *s = srv_dump(j, false, &n);
    json_decref(j);
    sse_append(o, "data: ", 6);
    sse_append(o, s, n);
    sse_append(o, "\n\n", 2);
    free(s);
}

void srv_sse_event(srv_out *o, const char *event, json_t *j) {
    sse_append(o, "event: ", 7);
    sse_append(o, event, strlen(event));
    sse_append(o, "\n", 1);
    srv_sse_put(o, j);
}

void srv_sse_done(srv_out *o) { sse_append(o, "data: [DONE]\n\n", 14); }

json_t *srv_usage_json(const srv_out *o) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(o->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(o->n_generated));
    json_object_set_new(u, "total_tokens", json_integer(o->n_prompt + o->n_generated));
    json_t *pd = json_object();
    json_object_set_new(pd, "cached_tokens", json_integer(o->n_cached));
    json_object_set_new(u, "prompt_tokens_details", pd);
    json_t *cd = json_object();
    json_object_set_new(cd, "reasoning_tokens", json_integer(o->n_reasoning));
    json_object_set_new(u, "completion_tokens_details", cd);
    return u;
}

void srv_token_text(const srv *s, int32_t id, lm_tok_str *out) {
    lm_tokenizer_decode(s->tok, &id, 1, false, out);
    if (!out->s) {
        out->s = lm_xmalloc(1);
        out->s[0] = 0;
        out->cap = 1;
        out->len = 0;
    }
}

json_t *srv_logprob_entry(const srv *s, int32_t id, float lp, lm_tok_str *scratch) {
    srv_token_text(s, id, scratch);
    json_t *e = json_object();
    json_object_set_new(e, "token", json_stringn_nocheck(scratch->s, scratch->len));
    json_object_set_new(e, "logprob", json_real(lp));
    json_t *bytes = json_array();
    for (size_t i = 0; i < scratch->len; i++) json_array_append_new(bytes, json_integer((unsigned char)scratch->s[i]));
    json_object_set_new(e, "bytes", bytes);
    return e;
}

/* A JSON string of s with bytes that are not valid UTF-8 replaced by '?'
 * (error messages quote request text cut at a byte count). */
json_t *srv_lossy_string(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    char *c = lm_xstrdup(s);
    for (size_t i = 0; c[i];) {
        unsigned char b = (unsigned char)c[i];
        size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        bool ok = n > 0;
        for (size_t k = 1; ok && k < n; k++) ok = ((unsigned char)c[i + k] & 0xC0) == 0x80;
        if (ok && n > 1) {
            json_t *t = json_stringn(c + i, n);
            ok = t != NULL;
            json_decref(t);
        }
        if (!ok) {
            c[i++] = '?';
            continue;
        }
        i += n;
    }
    j = json_string(c);
    free(c);
    return j ? j : json_string("error");
}

json_t *srv_error_json(const srv_err *e) {
    json_t *in = json_object();
    json_object_set_new(in, "message", srv_lossy_string(e->msg[0] ? e->msg : "error"));
    json_object_set_new(in, "type", json_string(e->type ? e->type : "server_error"));
    json_object_set_new(in, "param", e->param[0] ? srv_lossy_string(e->param) : json_null());
    json_object_set_new(in, "code", e->code ? json_string(e->code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", in);
    return o;
}
