/* embeddings.c - POST /v1/embeddings: text or token ids in, one pooled
 * vector per input out (OpenAI's shape).
 *
 * Every input becomes its own embedding request in the engine
 * (lm_engine_submit_embed), so a list is prefilled in batches alongside
 * whatever else runs; the connection thread waits for all of them on one
 * condition variable. The model's pooling (lm_pooling.h) has already
 * normalised the vectors where the checkpoint asks for it; `dimensions`
 * truncates them (Matryoshka) and normalises the rest again. Vectors go out
 * as JSON numbers or, with encoding_format "base64", as the base64 of their
 * little-endian float32 bytes (what the openai SDK asks for by default). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

/* Most inputs in one request (OpenAI's limit). */
#define SRV_EMBED_MAX_INPUTS 2048
/* Inputs in the engine at once (at most half of --max-queue): a long list
 * goes in windows, so that it neither fills the engine's queue (a 503 for
 * everyone) nor starves others. */
#define SRV_EMBED_WINDOW 32

typedef struct emb_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;          /* requests without their final event */
    int64_t D;
    float *vecs;          /* [n][D] */
    bool failed;
    char err[LM_ERR_MAX];
} emb_wait;

typedef struct emb_slot {
    emb_wait *w;
    int index;
} emb_slot;

/* Engine thread: the final event's vector into its row. */
static void on_embedding(void *user, const lm_token_event *ev) {
    if (!ev->done) return;
    emb_slot *sl = user;
    emb_wait *w = sl->w;
    pthread_mutex_lock(&w->mu);
    if (ev->finish == LM_FINISH_STOP && ev->embedding && ev->n_embedding == w->D) {
        memcpy(w->vecs + (size_t)sl->index * (size_t)w->D, ev->embedding, (size_t)w->D * sizeof(float));
    } else if (!w->failed) {
        w->failed = true;
        snprintf(w->err, sizeof w->err, "%s",
                 ev->error ? ev->error : "the request was cancelled (the server is shutting down)");
    }
    w->pending--;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* ---- the body ------------------------------------------------------------------------ */

typedef struct emb_req {
    json_t *body;
    int n;                /* inputs */
    lm_tok_ids *ids;      /* [n] */
    bool base64;
    int64_t dims;         /* 0: the model's width */
    int n_tokens;
} emb_req;

static void emb_req_free(emb_req *r) {
    for (int i = 0; r->ids && i < r->n; i++) lm_tok_ids_free(&r->ids[i]);
    free(r->ids);
    json_decref(r->body);
}

/* Input i (a string or an array of token ids) into r->ids[i]. */
static int parse_input(const srv *s, const json_t *v, int i, bool list, emb_req *r, srv_err *e) {
    char param[32];
    snprintf(param, sizeof param, list ? "input[%d]" : "input", i);
    lm_tok_ids *ids = &r->ids[i];
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return srv_bad(e, param, "Invalid '%s': empty string.", param);
        lm_err le = { { 0 } };
        if (lm_tokenizer_encode(s->tok, json_string_value(v), json_string_length(v), true, ids, &le))
            return srv_bad(e, param, "%s", le.msg);
    } else if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if (n == 0) return srv_bad(e, param, "Invalid '%s': empty array of token ids.", param);
        if (n > (size_t)s->ctx) n = (size_t)s->ctx + 1; /* over the context either way: said below */
        ids->ids = lm_xmalloc(n * sizeof *ids->ids);
        ids->cap = n;
        for (size_t k = 0; k < n; k++) {
            const json_t *t = json_array_get(v, k);
            json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
            if (!json_is_integer(t) || id < 0 || id >= s->n_vocab)
                return srv_bad(e, param, "Invalid '%s': element %zu is not a token id in [0, %d).", param, k,
                               s->n_vocab);
            ids->ids[ids->n++] = (int32_t)id;
        }
    } else {
        return srv_bad(e, param, "Invalid type for '%s': expected a string or an array of token ids.", param);
    }
    if (ids->n == 0) return srv_bad(e, param, "Invalid '%s': it produced no tokens.", param);
    if (ids->n > (size_t)s->ctx)
        return srv_fail(e, 400, "invalid_request_error", "context_length_exceeded", param,
                        "This model's maximum context length is %d tokens, however '%s' has %s%zu tokens.", s->ctx,
                        param, json_is_array(v) && json_array_size(v) > ids->n ? "more than " : "", ids->n);
    r->n_tokens += (int)ids->n;
    return 0;
}

static int parse_body(const srv *s, const char *body, size_t len, emb_req *r, srv_err *e) {
    if (!(r->body = srv_json_body(body, len, e))) return -1;
    const json_t *model = json_object_get(r->body, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return srv_bad(e, "model", "Invalid type for 'model': expected a string.");
        if (strcmp(json_string_value(model), s->model_name) != 0)
            return srv_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                            "The model '%.200s' does not exist; this server serves '%.200s'.",
                            json_string_value(model), s->model_name);
    }
    const json_t *fmt = json_object_get(r->body, "encoding_format");
    if (fmt && !json_is_null(fmt)) {
        const char *f = json_string_value(fmt);
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            return srv_bad(e, "encoding_format", "Invalid 'encoding_format': expected 'float' or 'base64'.");
        r->base64 = !strcmp(f, "base64");
    }
    const int64_t D = s->model->cfg.d_model;
    const json_t *dims = json_object_get(r->body, "dimensions");
    if (dims && !json_is_null(dims)) {
        if (!json_is_integer(dims)) return srv_bad(e, "dimensions", "Invalid type for 'dimensions': expected an integer.");
        json_int_t d = json_integer_value(dims);
        if (d < 1 || d > D)
            return srv_bad(e, "dimensions", "Invalid 'dimensions': %lld is not in [1, %lld] (the model's width).",
                           (long long)d, (long long)D);
        r->dims = d;
    }
    const json_t *user = json_object_get(r->body, "user");
    if (user && !json_is_null(user) && !json_is_string(user))
        return srv_bad(e, "user", "Invalid type for 'user': expected a string.");
    const json_t *in = json_object_get(r->body, "input");
    if (!in || json_is_null(in)) return srv_bad(e, "input", "Missing required parameter: 'input'.");
    /* one input: a string or one array of ids; else a list of those */
    bool list = json_is_array(in) && json_array_size(in) > 0 && !json_is_integer(json_array_get(in, 0));
    if (json_is_array(in) && json_array_size(in) == 0) return srv_bad(e, "input", "Invalid 'input': empty array.");
    r->n = list ? (int)LM_MIN(json_array_size(in), (size_t)SRV_EMBED_MAX_INPUTS + 1) : 1;
    if (r->n > SRV_EMBED_MAX_INPUTS)
        return srv_bad(e, "input", "Invalid 'input': more than %d inputs.", SRV_EMBED_MAX_INPUTS);
    r->ids = lm_xcalloc((size_t)r->n, sizeof *r->ids);
    for (int i = 0; i < r->n; i++)
        if (parse_input(s, list ? json_array_get(in, (size_t)i) : in, i, list, r, e)) return -1;
    return 0;
}

/* ---- the answer ---------------------------------------------------------------------- */

static json_t *base64_json(const float *v, int64_t n) {
    static const char k_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t nb = (size_t)n * 4;
    uint8_t *b = lm_xmalloc(nb);
    for (int64_t i = 0; i < n; i++) { /* little-endian whatever the host */
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) b[i * 4 + k] = (uint8_t)(u >> (8 * k));
    }
    char *out = lm_xmalloc((nb + 2) / 3 * 4 + 1);
    size_t o = 0;
    for (size_t i = 0; i < nb; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < nb ? b[i + 2] : 0);
        out[o++] = k_b64[x >> 18 & 63];
        out[o++] = k_b64[x >> 12 & 63];
        out[o++] = i + 1 < nb ? k_b64[x >> 6 & 63] : '=';
        out[o++] = i + 2 < nb ? k_b64[x & 63] : '=';
    }
    json_t *j = json_stringn(out, o);
    free(out);
    free(b);
    return j;
}

static json_t *vector_json(float *v, int64_t D, const emb_req *r, bool normalized) {
    int64_t n = r->dims ? r->dims : D;
    if (n < D && normalized) lm_l2_normalize(v, n); /* Matryoshka: the truncated vector normalised again */
    if (r->base64) return base64_json(v, n);
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

static json_t *response_json(const srv *s, const emb_req *r, float *vecs, int64_t D) {
    json_t *data = json_array();
    for (int i = 0; i < r->n; i++) {
        json_t *d = json_object();
        json_object_set_new(d, "object", json_string("embedding"));
        json_object_set_new(d, "index", json_integer(i));
        json_object_set_new(d, "embedding", vector_json(vecs + (size_t)i * (size_t)D, D, r, s->model->pooling.normalize));
        json_array_append_new(data, d);
    }
    return json_pack("{s:s, s:o, s:s, s:{s:i, s:i}}", "object", "list", "data", data, "model", s->model_name, "usage",
                     "prompt_tokens", r->n_tokens, "total_tokens", r->n_tokens);
}

/* ---- the endpoint -------------------------------------------------------------------- */

/* Submits inputs [i0, i1) and waits for them; -1 with e on a refusal or
 * failure (what was submitted is cancelled and waited for first). */
static int run_window(srv *s, const emb_req *r, int i0, int i1, emb_wait *w, srv_err *e) {
    emb_slot *slots = lm_xcalloc((size_t)r->n, sizeof *slots);
    lm_request **reqs = lm_xcalloc((size_t)r->n, sizeof *reqs);
    int rc = LM_ENGINE_OK, n_sub = i0;
    lm_err le = { { 0 } };
    for (; n_sub < i1; n_sub++) {
        slots[n_sub] = (emb_slot){ w, n_sub };
        pthread_mutex_lock(&w->mu);
        w->pending++;
        pthread_mutex_unlock(&w->mu);
        rc = lm_engine_submit_embed(s->en, r->ids[n_sub].ids, (int)r->ids[n_sub].n, on_embedding, &slots[n_sub],
                                    &reqs[n_sub], &le);
        if (rc != LM_ENGINE_OK) {
            pthread_mutex_lock(&w->mu);
            w->pending--;
            pthread_mutex_unlock(&w->mu);
            break;
        }
    }
    if (rc != LM_ENGINE_OK)
        for (int i = i0; i < n_sub; i++) lm_request_cancel(reqs[i]);
    pthread_mutex_lock(&w->mu);
    while (w->pending > 0) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    for (int i = i0; i < n_sub; i++) lm_request_release(reqs[i]);
    free(reqs);
    free(slots);
    if (rc == LM_ENGINE_BUSY)
        return srv_fail(e, 503, "server_error", "overloaded", NULL, "The server is overloaded (%s); retry later.", le.msg);
    if (rc != LM_ENGINE_OK) return srv_bad(e, "input", "%s", le.msg);
    if (w->failed) return srv_fail(e, 500, "server_error", NULL, NULL, "%s", w->err);
    return 0;
}

static int run_all(srv *s, const emb_req *r, emb_wait *w, srv_err *e) {
    const int q = s->opts.engine.max_queue, win = q > 0 ? LM_MIN(SRV_EMBED_WINDOW, LM_MAX(q / 2, 1)) : SRV_EMBED_WINDOW;
    for (int i = 0; i < r->n; i += win)
        if (run_window(s, r, i, LM_MIN(r->n, i + win), w, e)) return -1;
    return 0;
}

enum MHD_Result srv_handle_embeddings(srv *s, struct MHD_Connection *c, srv_conn *cc) {
    srv_err e = { 0 };
    emb_req r = { 0 };
    if (parse_body(s, cc->body ? cc->body : "", cc->body_len, &r, &e)) {
        emb_req_free(&r);
        return srv_respond_error(cc, c, &e);
    }
    if (s->model->pooling.mode == LM_POOL_NONE) {
        srv_bad(&e, NULL, "The model '%s' gives no embeddings: %s.", s->model_name, s->model->pooling.source);
        emb_req_free(&r);
        return srv_respond_error(cc, c, &e);
    }
    const int64_t D = s->model->cfg.d_model;
    emb_wait w = { .D = D, .vecs = lm_xmalloc((size_t)r.n * (size_t)D * sizeof(float)) };
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    int rc = run_all(s, &r, &w, &e);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    enum MHD_Result ok;
    if (rc) {
        ok = srv_respond_error(cc, c, &e);
    } else {
        pthread_mutex_lock(&s->metrics.mu);
        s->metrics.prompt_tokens += (uint64_t)r.n_tokens;
        pthread_mutex_unlock(&s->metrics.mu);
        ok = srv_respond_json(cc, c, 200, response_json(s, &r, w.vecs, D));
    }
    free(w.vecs);
    emb_req_free(&r);
    return ok;
}
