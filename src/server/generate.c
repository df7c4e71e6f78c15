/* generate.c - POST /v1/chat/completions and /v1/completions: the handler
 * behind both (route_table.c routes to it), and behind the generation
 * endpoints of other APIs (an srv_api: Anthropic's /v1/messages).
 *
 * A generation request: parse and validate the body, build the prompt
 * (chat template, or the raw prompt), tokenize, check it against the context,
 * submit to the engine, then either wait for the final event in this
 * connection thread (non-stream) or hand MHD a content reader that blocks
 * for each SSE chunk (stream).
 *
 * The engine's callback runs on the engine thread and only copies the event
 * into the job's mailbox and signals an eventfd; all text work (detokenizing,
 * parsers, JSON) happens on the connection thread in srv_out.
 *
 * n > 1: each choice is its own request in the engine (batched with the
 * others; choice i samples with seed + i) with its own srv_out; their
 * events share the mailbox, tagged with the choice. A stream interleaves
 * their chunks (each with its index) and ends with one usage chunk and
 * [DONE]; a plain answer lists the choices, usage summed. A request through
 * an srv_api has exactly one choice (those APIs have no n), ch[0], whose
 * output the api sets up with its sink. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server_internal.h"

#ifndef POLLRDHUP
#define POLLRDHUP 0x2000
#endif

/* A stream sends ": keep-alive" after this much silence (ms); below every
 * idle timeout a client or lumen itself uses. */
#define SRV_HEARTBEAT_MS 10000

/* ---- the job ------------------------------------------------------------------------------ */

/* Engine thread: copy the event, wake the connection. Never blocks for long. */
static void on_token(void *user, const lm_token_event *ev) {
    srv_choice *ch = user;
    srv_job *j = ch->job;
    pthread_mutex_lock(&j->mu);
    if (j->qn == j->qcap) {
        j->qcap = j->qcap ? j->qcap * 2 : 16;
        j->q = lm_xrealloc(j->q, j->qcap * sizeof *j->q);
    }
    srv_job_ev *qe = &j->q[j->qn++];
    qe->choice = ch->index;
    lm_token_event *dst = &qe->ev;
    *dst = *ev;
    dst->trace = NULL;
    if (ev->done && ev->error) {
        snprintf(ch->err, sizeof ch->err, "%s", ev->error);
        dst->error = ch->err;
    } else {
        dst->error = NULL;
    }
    if (ev->has_token) {
        double now = lm_now();
        if (j->t_first == 0) j->t_first = now;
        j->t_last = now;
    }
    if (ev->done && ev->trace && j->s->trace && ch->index == 0) { /* valid only during this call */
        j->trace = *ev->trace;
        int n = ev->trace->step_batch ? LM_MAX(ev->trace->n_steps, 0) : 0;
        j->steps = n ? lm_xmalloc((size_t)n * sizeof *j->steps) : NULL;
        if (n) memcpy(j->steps, ev->trace->step_batch, (size_t)n * sizeof *j->steps);
        j->trace.step_batch = j->steps;
        j->trace.n_steps = n ? ev->trace->n_steps : 0;
        j->has_trace = true;
    }
    pthread_mutex_unlock(&j->mu);
    uint64_t one = 1;
    ssize_t w = write(j->efd, &one, sizeof one);
    (void)w;
}

/* n empty choices (before anything is submitted). */
static void job_set_choices(srv_job *j, int n) {
    free(j->ch);
    j->n_ch = n;
    j->ch = lm_xcalloc((size_t)n, sizeof *j->ch);
    for (int i = 0; i < n; i++) j->ch[i].job = j, j->ch[i].index = i;
}

static srv_job *job_create(srv *s, srv_conn *cc, struct MHD_Connection *c) {
    srv_job *j = lm_xcalloc(1, sizeof *j);
    j->s = s;
    j->route = cc->route;
    memcpy(j->method, cc->method, sizeof j->method);
    memcpy(j->url, cc->url, sizeof j->url);
    j->t0 = cc->t0;
    memcpy(j->rid, cc->rid, sizeof j->rid);
    pthread_mutex_init(&j->mu, NULL);
    j->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    job_set_choices(j, 1);
    return j;
}

void srv_job_cancel(srv_job *j) {
    for (int i = 0; i < j->n_ch; i++)
        if (j->ch[i].req) lm_request_cancel(j->ch[i].req);
}

/* Whether every choice has had its final event. */
static bool job_done(const srv_job *j) {
    for (int i = 0; i < j->n_ch; i++)
        if (!j->ch[i].out.done) return false;
    return true;
}

/* The choices' outputs in order, for srv_usage_json_n and srv_out_tail. */
static const srv_out *const *job_outs(const srv_job *j, const srv_out **buf) {
    for (int i = 0; i < j->n_ch; i++) buf[i] = &j->ch[i].out;
    return buf;
}

/* n > 1 stream: once every choice has ended and its chunks are sent, the
 * shared tail (into choice 0's empty buffer). */
static void job_tail(srv_job *j) {
    if (j->n_ch < 2 || !j->r.stream || j->tail_sent || !job_done(j)) return;
    const srv_out *buf[SRV_MAX_CHOICES];
    srv_out_tail(&j->ch[0].out, job_outs(j, buf), j->n_ch);
    j->tail_sent = true;
}

/* Processes queued events; returns how many. Cancels the request when a stop
 * string matched. */
static size_t job_pump(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    size_t n = j->qn;
    if (n) {
        if (j->wcap < n) {
            j->wcap = n;
            j->work = lm_xrealloc(j->work, n * sizeof *j->work);
        }
        memcpy(j->work, j->q, n * sizeof *j->q);
        j->qn = 0;
    }
    pthread_mutex_unlock(&j->mu);
    for (size_t i = 0; i < n; i++) {
        srv_choice *ch = &j->ch[j->work[i].choice];
        if (srv_out_event(&ch->out, &j->work[i].ev)) lm_request_cancel(ch->req);
    }
    return n;
}

/* Waits for events (1), silence for timeout_ms (0), or the client closing its
 * end of the connection (-1). timeout_ms < 0 waits without limit.
 *
 * The end of the client's data (POLLRDHUP) is either a close or a
 * half-close (shutdown(SHUT_WR) after the request), which TCP does not tell
 * apart until the server writes. A stream writes (tokens, and a keep-alive
 * at least every SRV_HEARTBEAT_MS), and a write to a closed socket fails
 * (POLLERR/POLLHUP, or MHD's send): so a stream takes POLLRDHUP for a
 * half-close and keeps going. A plain answer writes nothing until the end,
 * so there POLLRDHUP cancels, as nginx's client-abort check does: a client
 * that left must not hold the engine for a whole answer. */
static int job_wait(srv_job *j, int timeout_ms) {
    struct pollfd p[2] = { { .fd = j->efd, .events = POLLIN },
                           { .fd = j->fd, .events = j->half_closed ? 0 : POLLRDHUP } };
    int np = j->fd >= 0 ? 2 : 1;
    for (;;) {
        int r = poll(p, (nfds_t)np, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 0;
        if (np == 2 && (p[1].revents & (POLLHUP | POLLERR | POLLNVAL))) return -1;
        if (np == 2 && (p[1].revents & POLLRDHUP)) {
            if (!j->streaming) return -1;
            j->half_closed = true; /* watched no more for input; errors still show */
            p[1].events = 0;
            if (!(p[0].revents & POLLIN)) continue;
        }
        uint64_t v;
        ssize_t rd = read(j->efd, &v, sizeof v);
        (void)rd;
        return 1;
    }
}

/* Takes the job out of the engine and frees it; records metrics and logs. */
static void job_finish(srv_job *j) {
    srv *s = j->s;
    if (j->in_list) {
        pthread_mutex_lock(&s->jobs_mu);
        if (j->prev) j->prev->next = j->next;
        else s->jobs = j->next;
        if (j->next) j->next->prev = j->prev;
        pthread_mutex_unlock(&s->jobs_mu);
    }
    const bool submitted = j->ch[0].req != NULL;
    int n_gen = 0;
    for (int i = 0; i < j->n_ch; i++) {
        if (j->ch[i].req) lm_request_release(j->ch[i].req); /* no callback after this */
        if (j->ch[i].req && !j->ch[i].out.done) j->gone = true; /* MHD dropped the connection mid-answer */
        n_gen += j->ch[i].out.n_generated;
    }
    srv_out *o = &j->ch[0].out;
    double now = lm_now();
    srv_metrics *m = &s->metrics;
    if (job_done(j) && !j->gone) {
        pthread_mutex_lock(&m->mu);
        m->prompt_tokens += (uint64_t)o->n_prompt;
        m->cached_tokens += (uint64_t)o->n_cached;
        m->completion_tokens += (uint64_t)n_gen;
        pthread_mutex_unlock(&m->mu);
        if (j->t_first > 0) srv_metrics_observe(&m->ttft, m, j->t_first - j->t0);
        srv_metrics_observe(&m->duration, m, now - j->t0);
        srv_metrics_observe(&m->queue, m, o->queue_s);
        if (n_gen > 1 && j->t_last > j->t_first)
            srv_metrics_observe(&m->per_token, m, (j->t_last - j->t_first) / (n_gen - 1));
    }
    if (j->gone) {
        pthread_mutex_lock(&m->mu);
        m->disconnects++;
        pthread_mutex_unlock(&m->mu);
    }
    if (j->streaming) {
        pthread_mutex_lock(&m->mu);
        m->streams--;
        pthread_mutex_unlock(&m->mu);
    }
    int status = j->gone ? 499 : j->status;
    if (submitted) srv_metrics_request(m, j->route, status);
    if (submitted && s->opts.log_requests)
        fprintf(stderr, "lumen: %s %s %d%s prompt %d (cached %d) gen %d finish %s ttft %.3fs total %.3fs id %s\n",
                j->method, j->url, status, j->gone ? " (client gone)" : "", o->n_prompt, o->n_cached, n_gen,
                o->done ? srv_out_finish_reason(o) : "-", j->t_first > 0 ? j->t_first - j->t0 : 0.0, now - j->t0,
                j->rid);
    if (submitted && s->trace) {
        srv_trace_rec tr = {
            .id = j->rid, .route = j->url, .status = status,
            .finish = o->done ? (j->gone ? "cancelled" : srv_out_finish_reason(o)) : "cancelled",
            .n_prompt = o->done ? o->n_prompt : j->n_ids, .n_cached = o->n_cached, .n_generated = n_gen,
            .t_arrive = j->t0, .t_first = j->t_first, .t_last = j->t_last, .t_end = now,
            .queue_s = o->queue_s, .prefill_s = o->prefill_s,
            .tr = j->has_trace ? &j->trace : NULL, .prompt = j->ids, .n_prompt_ids = j->n_ids,
        };
        srv_trace_write(s, &tr);
    }
    if (j->api) j->api->finish(j);
    for (int i = 0; i < j->n_ch; i++) srv_out_free(&j->ch[i].out);
    free(j->ch);
    lm_chat_prompt_free(&j->prompt);
    srv_req_free(&j->r);
    if (j->efd >= 0) close(j->efd);
    pthread_mutex_destroy(&j->mu);
    free(j->q);
    free(j->work);
    free(j->steps);
    free(j->ids);
    free(j);
}

/* ---- streaming --------------------------------------------------------------------------- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_job *j = cls;
    for (;;) {
        for (int i = 0; i < j->n_ch; i++) { /* choices' chunks as they come; each ends whole */
            srv_out *o = &j->ch[i].out;
            size_t avail = o->sse.len - o->sse_off;
            if (!avail) continue;
            size_t n = LM_MIN(avail, max);
            memcpy(buf, o->sse.s + o->sse_off, n);
            o->sse_off += n;
            if (o->sse_off == o->sse.len) o->sse.len = o->sse_off = 0;
            return (ssize_t)n;
        }
        if (job_done(j) && (j->n_ch == 1 || j->tail_sent)) return MHD_CONTENT_READER_END_OF_STREAM;
        if (job_done(j)) { /* every choice's chunks are out: the shared tail last */
            job_tail(j);
            continue;
        }
        if (j->gone) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (job_pump(j)) continue;
        int w = job_wait(j, SRV_HEARTBEAT_MS);
        if (w < 0) {
            j->gone = true;
            srv_job_cancel(j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (w == 0) { /* an SSE comment; clients skip it */
            static const char k_ping[] = ": keep-alive\n\n";
            size_t n = LM_MIN(max, sizeof k_ping - 1);
            memcpy(buf, k_ping, n);
            return (ssize_t)n;
        }
    }
}

static void stream_free(void *cls) { job_finish(cls); }

/* ---- the endpoint -------------------------------------------------------------------------- */

static int context_error(srv_err *e, const srv *s, int n_prompt, const char *what) {
    return srv_fail(e, 400, "invalid_request_error", "context_length_exceeded", what,
                    "This model's maximum context length is %d tokens. However, your %s resulted in %d tokens. "
                    "Please reduce the length of the %s.",
                    s->ctx, what, n_prompt, what);
}

/* kind: chat or completions; api: another API's request and answer (its
 * requests are chat requests), or NULL. */
static enum MHD_Result generate(srv *s, struct MHD_Connection *c, srv_conn *cc, srv_kind kind, const srv_api *api) {
    srv_err e = { 0 };
    srv_job *j = job_create(s, cc, c);
    j->api = api;
    lm_tok_ids ids = { 0 };
    int32_t *marks = NULL; /* where the chat messages end, in tokens (the engine copies them) */
    char *echo = NULL;
    size_t echo_len = 0;
    const char *what = api ? api->what : kind == SRV_CHAT ? "messages" : "prompt";
    if (j->efd < 0) {
        srv_fail(&e, 500, "server_error", NULL, NULL, "eventfd: %s", strerror(errno));
        goto fail;
    }
    const char *body = cc->body ? cc->body : "";
    if (api ? api->parse(j, body, cc->body_len, &e) : srv_req_parse(s, kind, body, cc->body_len, &j->r, &e))
        goto fail;
    lm_err le = { { 0 } };
    if (kind == SRV_CHAT) {
        if (srv_chat_render(s, &j->r, &j->prompt, &e)) {
            if (!strcmp(e.param, "messages")) snprintf(e.param, sizeof e.param, "%s", what);
            goto fail;
        }
        srv_chat_marks(s, &j->r, &j->prompt);
        if (srv_constrain(s, &j->r, &j->prompt, &e)) goto fail;
        if (lm_chat_encode(s->tok, &j->prompt, &ids, &le)) {
            srv_bad(&e, what, "%s", le.msg);
            goto fail;
        }
        j->r.gp.n_prompt_marks = lm_chat_mark_tokens(s->tok, &j->prompt, ids.ids, (int)ids.n, &marks);
        j->r.gp.prompt_marks = marks;
    } else if (j->r.prompt_ids) {
        ids.ids = lm_xmalloc((size_t)j->r.n_prompt_ids * sizeof *ids.ids);
        memcpy(ids.ids, j->r.prompt_ids, (size_t)j->r.n_prompt_ids * sizeof *ids.ids);
        ids.n = ids.cap = (size_t)j->r.n_prompt_ids;
        if (j->r.echo) {
            lm_tok_str t = { 0 };
            lm_tokenizer_decode(s->tok, ids.ids, ids.n, false, &t);
            echo = t.s;
            echo_len = t.len;
        }
    } else {
        if (lm_tokenizer_encode(s->tok, j->r.prompt_text, j->r.prompt_len, true, &ids, &le)) {
            srv_bad(&e, "prompt", "%s", le.msg);
            goto fail;
        }
        if (j->r.echo) {
            echo = lm_xmalloc(j->r.prompt_len + 1);
            memcpy(echo, j->r.prompt_text, j->r.prompt_len + 1);
            echo_len = j->r.prompt_len;
        }
    }
    if (ids.n == 0) {
        srv_bad(&e, what, "The %s produced no tokens.", what);
        goto fail;
    }
    if (kind != SRV_CHAT && srv_constrain(s, &j->r, NULL, &e)) goto fail;
    lm_gen_params *gp = &j->r.gp;
    j->r.n_prompt_tokens = (int)ids.n;
    if (ids.n >= (size_t)s->ctx) {
        context_error(&e, s, (int)ids.n, what);
        goto fail;
    }
    /* max_tokens is an upper bound on every route: past the room the prompt
     * leaves it is cut to that room (finish_reason "length"), as
     * llama-server does; agents send 8000 or 13107 whatever the context */
    if (!j->r.max_tokens_set || (long)ids.n + gp->max_tokens > s->ctx) gp->max_tokens = s->ctx - (int)ids.n;
    /* another API's request has one choice (n is not part of it), whose
     * output the api sets up with its sink */
    job_set_choices(j, api ? 1 : LM_MAX(j->r.n, 1));
    if (api) {
        if (api->start(j, &e)) goto fail;
    } else {
        for (int i = 0; i < j->n_ch; i++)
            if (srv_out_init_choice(&j->ch[i].out, s, &j->r, kind == SRV_CHAT ? &j->prompt : NULL, echo, echo_len, i,
                                    j->n_ch, i ? &j->ch[0].out : NULL, &e))
                goto fail;
    }
    free(echo);
    echo = NULL;

    pthread_mutex_lock(&s->jobs_mu);
    if (s->shutting_down) {
        pthread_mutex_unlock(&s->jobs_mu);
        srv_shutdown_error(&e);
        goto fail;
    }
    int rc = LM_ENGINE_OK;
    const uint64_t seed = gp->sampling.seed;
    for (int i = 0; i < j->n_ch && rc == LM_ENGINE_OK; i++) {
        gp->sampling.seed = seed + (uint64_t)i; /* reproducible, and different per choice */
        rc = lm_engine_submit(s->en, ids.ids, (int)ids.n, gp, on_token, &j->ch[i], &j->ch[i].req, &le);
    }
    gp->sampling.seed = seed;
    gp->prompt_marks = NULL, gp->n_prompt_marks = 0;
    free(marks);
    marks = NULL;
    if (rc != LM_ENGINE_OK) /* the choices already in are dropped: the request fails whole */
        for (int i = 0; i < j->n_ch; i++) {
            if (j->ch[i].req) lm_request_release(j->ch[i].req);
            j->ch[i].req = NULL;
        }
    if (rc == LM_ENGINE_OK) {
        j->next = s->jobs;
        if (s->jobs) s->jobs->prev = j;
        s->jobs = j;
        j->in_list = true;
    }
    pthread_mutex_unlock(&s->jobs_mu);
    if (rc == LM_ENGINE_BUSY) {
        srv_fail(&e, 503, "server_error", "overloaded", NULL, "The server is overloaded (%s); retry later.", le.msg);
        goto fail;
    }
    if (rc != LM_ENGINE_OK) {
        srv_bad(&e, what, "%s", le.msg);
        goto fail;
    }
    if (s->trace) { /* the trace decodes the text around a cache divergence */
        j->ids = ids.ids;
        j->n_ids = (int)ids.n;
        ids.ids = NULL;
    }
    lm_tok_ids_free(&ids);
    cc->job_logged = true;
    j->status = 200;

    if (j->r.stream) {
        struct MHD_Response *res =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, j, stream_free);
        if (!res) {
            job_finish(j);
            return MHD_NO;
        }
        j->streaming = true;
        pthread_mutex_lock(&s->metrics.mu);
        s->metrics.streams++;
        pthread_mutex_unlock(&s->metrics.mu);
        MHD_add_response_header(res, "Content-Type", "text/event-stream; charset=utf-8");
        MHD_add_response_header(res, "Cache-Control", "no-cache");
        MHD_add_response_header(res, "X-Accel-Buffering", "no");
        MHD_add_response_header(res, "X-Request-Id", j->rid);
        enum MHD_Result ok = MHD_queue_response(c, 200, res);
        MHD_destroy_response(res); /* the job is freed by stream_free when MHD is done */
        cc->status = 200;
        return ok;
    }

    while (!job_done(j)) {
        if (job_pump(j)) continue;
        if (job_wait(j, -1) < 0) {
            j->gone = true;
            srv_job_cancel(j);
            job_finish(j);
            return MHD_NO;
        }
    }
    for (int i = 0; i < j->n_ch; i++) {
        srv_out *o = &j->ch[i].out;
        if (!o->stopped && (o->finish == LM_FINISH_ERROR || o->finish == LM_FINISH_CANCELLED)) {
            if (o->finish == LM_FINISH_ERROR) srv_fail(&e, 500, "server_error", NULL, NULL, "%s", o->error);
            else srv_shutdown_error(&e);
            j->status = e.status;
            enum MHD_Result ok = srv_respond_error(cc, c, &e);
            job_finish(j);
            return ok;
        }
    }
    if (api) {
        enum MHD_Result ok = srv_respond_json(cc, c, 200, api->response(j));
        job_finish(j);
        return ok;
    }
    json_t *res = srv_out_response(&j->ch[0].out);
    if (j->n_ch > 1) { /* the other choices after the first, usage summed */
        json_t *choices = json_object_get(res, "choices");
        for (int i = 1; i < j->n_ch; i++) {
            json_t *ri = srv_out_response(&j->ch[i].out);
            json_array_append(choices, json_array_get(json_object_get(ri, "choices"), 0));
            json_decref(ri);
        }
        const srv_out *buf[SRV_MAX_CHOICES];
        json_object_set_new(res, "usage", srv_usage_json_n(job_outs(j, buf), j->n_ch));
    }
    enum MHD_Result ok = srv_respond_json(cc, c, 200, res);
    job_finish(j);
    return ok;

fail:
    if (s->trace) {
        srv_trace_rec tr = { .id = j->rid, .route = j->url, .status = e.status, .error = e.msg,
                             .n_prompt = (int)ids.n, .t_arrive = j->t0, .t_end = lm_now() };
        srv_trace_write(s, &tr);
    }
    free(echo);
    free(marks);
    lm_tok_ids_free(&ids);
    cc->job_logged = false;
    job_finish(j);
    return srv_respond_error(cc, c, &e);
}

enum MHD_Result srv_handle_generate(srv *s, struct MHD_Connection *c, srv_conn *cc, srv_kind kind) {
    return generate(s, c, cc, kind, NULL);
}

enum MHD_Result srv_handle_api(srv *s, struct MHD_Connection *c, srv_conn *cc, const srv_api *api) {
    return generate(s, c, cc, SRV_CHAT, api);
}
