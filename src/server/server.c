/* server.c - HTTP wiring of `lumen serve` on libmicrohttpd.
 *
 * Design note
 * -----------
 * libmicrohttpd runs a thread per connection (MHD_USE_THREAD_PER_CONNECTION):
 * a connection's thread may block, so a request simply waits for its tokens
 * where it is, and a stream is a content-reader callback that blocks until
 * the next chunk exists. That keeps every request's code straight-line, which
 * matters more here than saving threads: the engine, not HTTP, is the
 * bottleneck, and 1,000 mostly idle threads cost little.
 *
 * While it waits, a connection thread polls two descriptors: its request's
 * eventfd (the engine callback pushes events into a mailbox and signals it)
 * and the client socket for POLLRDHUP. A client that closes its end is seen
 * at once; its generation is cancelled and the engine frees its cache before
 * the next step.
 *
 * Limits: bodies over max_body get 413 (checked against Content-Length
 * before reading; a chunked body that grows past it closes the connection);
 * a connection idle for timeout_s while sending its request is dropped; at
 * most max_connections are open. A stream that produces nothing for a while
 * sends an SSE comment (": keep-alive") so that neither side's idle timer
 * fires while a request waits in the queue.
 *
 * Shutdown: SIGINT/SIGTERM are blocked in every thread and taken by sigwait
 * in lm_server_run, which stops accepting, gives running requests a few
 * seconds, cancels the rest and tears down daemon, engine and model. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "responses.h"
#include "server_internal.h"

/* ---- responses -------------------------------------------------------------------------- */

enum MHD_Result srv_respond_text(srv_conn *cc, struct MHD_Connection *c, int status, char *body, size_t len,
                                 const char *type) {
    struct MHD_Response *res = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!res) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(res, "Content-Type", type);
    if (cc && cc->rid[0]) MHD_add_response_header(res, "X-Request-Id", cc->rid);
    if (status == 401) MHD_add_response_header(res, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, res);
    MHD_destroy_response(res);
    if (cc) cc->status = status;
    return ok;
}

enum MHD_Result srv_respond_json(srv_conn *cc, struct MHD_Connection *c, int status, json_t *j) {
    size_t len;
    char *body = srv_dump(j, true, &len);
    json_decref(j);
    return srv_respond_text(cc, c, status, body, len, "application/json");
}

enum MHD_Result srv_respond_error(srv_conn *cc, struct MHD_Connection *c, const srv_err *e) {
    bool anthropic = cc && srv_routes[cc->route].anthropic;
    return srv_respond_json(cc, c, e->status, anthropic ? srv_anth_error_json(e) : srv_error_json(e));
}

/* ---- the access handler ----------------------------------------------------------------------- */

/* Compares in time independent of where the strings differ. */
static bool same_secret(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < na; i++) d |= (unsigned char)(a[i] ^ b[nb ? i % nb : 0]);
    return d == 0;
}

/* Authorization: Bearer KEY; on the Anthropic routes also x-api-key: KEY
 * (what Anthropic's clients send). */
static bool authorized(const srv *s, struct MHD_Connection *c, const srv_route *rt) {
    if (!s->opts.api_key) return true;
    const char *x = rt->anthropic ? MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key") : NULL;
    if (x && same_secret(x, s->opts.api_key)) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    return same_secret(h, s->opts.api_key);
}

static enum MHD_Result fail(srv_conn *cc, struct MHD_Connection *c, int status, const char *type, const char *code,
                            const char *msg) {
    srv_err e;
    srv_fail(&e, status, type, code, NULL, "%s", msg);
    return srv_respond_error(cc, c, &e);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv *s = cls;
    srv_conn *cc = *con_cls;
    bool post = !strcmp(method, "POST");
    if (!cc) {
        cc = lm_xcalloc(1, sizeof *cc);
        cc->t0 = lm_now();
        cc->route = srv_route_of(url);
        snprintf(cc->method, sizeof cc->method, "%s", method);
        snprintf(cc->url, sizeof cc->url, "%s", url);
        srv_request_id(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id"), cc->rid, sizeof cc->rid);
        *con_cls = cc;
        const srv_route *rt = &srv_routes[cc->route];
        if (!rt->handler) return fail(cc, c, 404, "invalid_request_error", "not_found", "Unknown endpoint.");
        if (!rt->open && !authorized(s, c, rt))
            return fail(cc, c, 401, "invalid_request_error", "invalid_api_key",
                        rt->anthropic ? "Incorrect or missing API key: send 'x-api-key: KEY' or 'Authorization: Bearer KEY'."
                                      : "Incorrect or missing API key: send 'Authorization: Bearer KEY'.");
        if (rt->post != post || (!post && strcmp(method, "GET") && strcmp(method, "HEAD")))
            return fail(cc, c, 405, "invalid_request_error", "method_not_allowed",
                        rt->post ? "This endpoint accepts POST only." : "This endpoint accepts GET only.");
        if (post) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
            if (cl && strtoull(cl, NULL, 10) > s->opts.max_body) {
                char msg[128];
                snprintf(msg, sizeof msg, "The request body is larger than the limit of %zu bytes.", s->opts.max_body);
                return fail(cc, c, 413, "invalid_request_error", "request_too_large", msg);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (cc->body_len + *upload_size > s->opts.max_body) return MHD_NO; /* chunked and too big: drop */
        if (cc->body_len + *upload_size + 1 > cc->body_cap) {
            size_t cap = LM_MAX(cc->body_cap * 2, cc->body_len + *upload_size + 1);
            cc->body = lm_xrealloc(cc->body, cap);
            cc->body_cap = cap;
        }
        memcpy(cc->body + cc->body_len, upload, *upload_size);
        cc->body_len += *upload_size;
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->status) return MHD_YES; /* already answered (the unknown URLs among them) */
    return srv_routes[cc->route].handler(s, c, cc, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c;
    (void)toe;
    srv *s = cls;
    srv_conn *cc = *con_cls;
    if (!cc) return;
    *con_cls = NULL;
    if (!cc->job_logged) {
        srv_metrics_request(&s->metrics, cc->route, cc->status ? cc->status : 500);
        if (s->opts.log_requests && !srv_routes[cc->route].quiet)
            fprintf(stderr, "lumen: %s %s %d %.3fs id %s\n", cc->method, cc->url, cc->status, lm_now() - cc->t0,
                    cc->rid);
    }
    free(cc->body);
    free(cc);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx, enum MHD_ConnectionNotificationCode code) {
    (void)c;
    (void)socket_ctx;
    srv *s = cls;
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.connections += code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
    pthread_mutex_unlock(&s->metrics.mu);
}

/* ---- startup and shutdown ---------------------------------------------------------------------- */

static char *basename_of(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    char *out = lm_xmalloc(n - b + 1);
    memcpy(out, path + b, n - b);
    out[n - b] = 0;
    return out;
}

static void add_stop_id(srv *s, int32_t id) {
    if (id < 0 || id >= s->n_vocab) return;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == id) return;
    if (s->n_stop_ids < (int)LM_COUNT(s->stop_ids)) s->stop_ids[s->n_stop_ids++] = id;
}

void srv_init_text(srv *s, lm_tokenizer *tok, int n_vocab, const int *eos_ids, int n_eos) {
    s->tok = tok;
    s->n_vocab = n_vocab;
    add_stop_id(s, lm_tokenizer_eos(tok));
    for (int i = 0; i < n_eos; i++) add_stop_id(s, eos_ids[i]);
    if (s->n_stop_ids == 0) fprintf(stderr, "lumen: warning: the model defines no end-of-sequence token\n");
    s->hidden = lm_xcalloc((size_t)n_vocab, 1);
    static const char *const k_tags[] = { "<think>", "</think>", "<tool_call>", "</tool_call>" };
    for (int i = 0; i < lm_tokenizer_n_added(tok); i++) {
        const char *content;
        bool special;
        int32_t id = lm_tokenizer_added(tok, i, &content, &special);
        if (!special || id < 0 || id >= n_vocab) continue;
        bool tag = false;
        for (size_t k = 0; k < LM_COUNT(k_tags); k++) tag |= !strcmp(content, k_tags[k]);
        s->hidden[id] = !tag;
    }
    lm_err ce = { { 0 } };
    if (lm_chat_create(&s->chat, tok, s->opts.chat_template, &ce))
        fprintf(stderr, "lumen: warning: %s; /v1/chat/completions is off\n", ce.msg);
    const char *tpl = s->opts.chat_template ? s->opts.chat_template : lm_tokenizer_chat_template(tok);
    s->chat_tools = s->chat && tpl && strstr(tpl, "tools"); /* the template renders tool definitions */
    if (!s->model_name) s->model_name = lm_xstrdup("model");
    if (!s->fingerprint[0]) snprintf(s->fingerprint, sizeof s->fingerprint, "fp_lumen");
}

void srv_free_text(srv *s) {
    lm_chat_free(s->chat);
    free(s->hidden);
    s->chat = NULL;
    s->hidden = NULL;
}

static int bind_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, bool *v6, lm_err *e) {
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc || !ai) return lm_errf(e, "cannot resolve --host %s: %s", host, gai_strerror(rc));
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    *v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    return 0;
}

static void cancel_all(srv *s) {
    pthread_mutex_lock(&s->jobs_mu);
    for (srv_job *j = s->jobs; j; j = j->next) srv_job_cancel(j);
    pthread_mutex_unlock(&s->jobs_mu);
}

static int jobs_running(srv *s) {
    pthread_mutex_lock(&s->jobs_mu);
    int n = 0;
    for (srv_job *j = s->jobs; j; j = j->next) n++;
    pthread_mutex_unlock(&s->jobs_mu);
    return n;
}

int lm_server_run(const lm_server_opts *o, lm_source *model, lm_backend *be, lm_err *e) {
    srv *s = lm_xcalloc(1, sizeof *s);
    s->opts = *o;
    if (!s->opts.host) s->opts.host = "127.0.0.1";
    if (!s->opts.max_body) s->opts.max_body = 8u << 20;
    if (!s->opts.timeout_s) s->opts.timeout_s = 30;
    if (!s->opts.max_connections) s->opts.max_connections = 1024;
    s->created = (int64_t)time(NULL);
    snprintf(s->fingerprint, sizeof s->fingerprint, "fp_lumen");
    srv_metrics_init(&s->metrics);
    s->metrics.cache_ram = o->engine.cache_ram;
    pthread_mutex_init(&s->jobs_mu, NULL);
    s->model_name = o->alias ? lm_xstrdup(o->alias) : basename_of(o->model_path);
    int rc = -1;
    struct MHD_Daemon *d = NULL;
    MHD_socket lfd = MHD_INVALID_SOCKET;

    /* every thread started from here on inherits the blocked signals */
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    signal(SIGPIPE, SIG_IGN);

    struct sockaddr_storage ss;
    socklen_t sslen = 0;
    bool v6 = false;
    if (srv_trace_open(s, o->trace_path, e)) goto done;
    if (o->debug_tool_call) {
        if (srv_debug_call_parse(s, o->debug_tool_call, e)) goto done;
        fprintf(stderr, "lumen: --debug-tool-call: a user's turn that offers '%s' is answered with that call, not by the model\n",
                s->debug_call_name);
    }
    if (bind_addr(s->opts.host, o->port, &ss, &sslen, &v6, e)) goto done;
    if (lm_model_load_told(&s->model, model, be, o->progress, e)) goto done;
    lm_tokenizer *tok = NULL;
    if (lm_tokenizer_load_from(&tok, model, e)) {
        lm_err_prefix(e, "tokenizer");
        goto done;
    }
    srv_init_text(s, tok, s->model->cfg.vocab, s->model->cfg.eos_ids, s->model->cfg.n_eos);
    if (o->progress && o->progress->stage) o->progress->stage(o->progress->user, "warming up");
    s->resp_store = srv_resp_store_create(SRV_RESP_STORE_COUNT, SRV_RESP_STORE_BYTES);
    if (lm_engine_create(&s->en, s->model, &o->engine, e)) goto done;
    if (o->progress && o->progress->stage) o->progress->stage(o->progress->user, NULL);
    s->ctx = lm_engine_ctx(s->en);

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_access, s,
                         MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opts.timeout_s,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->opts.max_connections,
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                         MHD_OPTION_THREAD_STACK_SIZE, (size_t)(2u << 20),
                         MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
                         MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                         MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                         MHD_OPTION_END);
    if (!d) {
        lm_errf(e, "cannot listen on %s port %d (%s)", s->opts.host, o->port,
                errno ? strerror(errno) : "libmicrohttpd failed to start");
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : o->port;
    char cache[64] = "prefix cache off";
    if (o->engine.cache_ram)
        snprintf(cache, sizeof cache, "prefix cache %.0f MiB", (double)o->engine.cache_ram / (1 << 20));
    char kv[128];
    fprintf(stderr, "lumen: serving %s on http://%s%s%s:%d (ctx %d, vocab %d, %s, %s%s)\n", s->model_name,
            v6 ? "[" : "", s->opts.host, v6 ? "]" : "", port, s->ctx, s->n_vocab,
            lm_engine_kv_summary(s->en, kv, sizeof kv), cache, s->opts.api_key ? ", API key required" : "");
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "lumen: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    lfd = MHD_quiesce_daemon(d); /* closed after MHD_stop_daemon, as its docs ask */
    pthread_mutex_lock(&s->jobs_mu);
    s->shutting_down = true;
    pthread_mutex_unlock(&s->jobs_mu);
    for (int i = 0; i < 100 && jobs_running(s) > 0; i++) usleep(50 * 1000);
    cancel_all(s);
    rc = 0;
done:
    if (d) MHD_stop_daemon(d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    lm_engine_free(s->en);
    srv_free_text(s);
    srv_resp_store_free(s->resp_store);
    lm_tokenizer_free(s->tok);
    lm_model_free(s->model);
    free(s->model_name);
    free(s->debug_call_name);
    json_decref(s->debug_call_args);
    srv_metrics_free(&s->metrics);
    srv_trace_close(s);
    pthread_mutex_destroy(&s->jobs_mu);
    free(s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
