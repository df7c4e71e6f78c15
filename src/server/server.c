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
 * and the client socket for POLLRDHUP. A plain request's client that closes
 * its end is seen at once; its generation is cancelled and the engine frees
 * its cache before the next step. A stream takes the end of the client's
 * data for a half-close and sees a real close when it next writes
 * (generate.c, job_wait).
 *
 * Limits: bodies over max_body get 413 (checked against Content-Length
 * before reading; a chunked body that grows past it is read to its end and
 * dropped, since MHD answers only then, and cut off past twice the limit);
 * a request's headers and body must arrive by their deadlines (deadlines.c)
 * and a connection idle for timeout_s is dropped; framing and the
 * Host/Origin allow-list are checked first (http_guard.c). lumen binds the
 * listening socket itself, without SO_REUSEPORT, so a busy port is an
 * error. At most max_connections are open; a reserve beyond them answers
 * 503 with Retry-After rather than closing unanswered. A stream that
 * produces nothing for a while sends an SSE comment (": keep-alive") so
 * that neither side's idle timer fires while a request waits in the queue.
 *
 * Shutdown: SIGINT/SIGTERM are blocked in every thread and taken by sigwait
 * in lm_server_run: drain() stops accepting, lets running requests finish
 * until shutdown_timeout_s is nearly spent, cancels the rest (each ends
 * with a final error its client can read), waits for those answers to be
 * written and tears down daemon, engine and model. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
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
    if (status == 503) MHD_add_response_header(res, "Retry-After", "1"); /* full or draining: come back */
    /* an answer before the body was read (413, 400 ...) leaves the rest of it unread: close */
    if (status >= 400 && cc && cc->close_after) MHD_add_response_header(res, MHD_HTTP_HEADER_CONNECTION, "close");
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

/* A header's value; NULL when absent or when the length MHD reports is not
 * the C string's (a NUL inside: "KEY\0junk" must not be compared as KEY).
 * libmicrohttpd 0.9.75 itself ends a header line's value at a NUL before
 * lumen sees it, so there the junk never arrives at all. */
static const char *header_value(struct MHD_Connection *c, const char *name) {
    const char *v = NULL;
    size_t n = 0;
    if (MHD_lookup_connection_value_n(c, MHD_HEADER_KIND, name, strlen(name), &v, &n) != MHD_YES || !v) return NULL;
    return strlen(v) == n ? v : NULL;
}

/* Authorization: Bearer KEY; on the Anthropic routes also x-api-key: KEY
 * (what Anthropic's clients send). */
static bool authorized(const srv *s, struct MHD_Connection *c, const srv_route *rt) {
    if (!s->opts.api_key) return true;
    const char *x = rt->anthropic ? header_value(c, "x-api-key") : NULL;
    if (x && same_secret(x, s->opts.api_key)) return true;
    const char *h = header_value(c, "Authorization");
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

static enum MHD_Result too_large(const srv *s, srv_conn *cc, struct MHD_Connection *c) {
    char msg[128];
    snprintf(msg, sizeof msg, "The request body is larger than the limit of %zu bytes.", s->opts.max_body);
    return fail(cc, c, 413, "invalid_request_error", "request_too_large", msg);
}

static srv_sock *sock_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv *s = cls;
    srv_conn *cc = *con_cls;
    bool post = !strcmp(method, "POST");
    if (!cc) {
        cc = lm_xcalloc(1, sizeof *cc);
        cc->t0 = lm_now();
        cc->route = srv_route_of(url);
        srv_log_text(method, cc->method, sizeof cc->method);
        srv_log_text(url, cc->url, sizeof cc->url);
        srv_request_id(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id"), cc->rid, sizeof cc->rid);
        cc->sock = sock_of(c);
        cc->close_after = true; /* until the body is read (an answer before it closes) */
        *con_cls = cc;
        srv_sock_stage_set(s, cc->sock, SRV_SOCK_BODY);
        const srv_route *rt = &srv_routes[cc->route];
        srv_err e;
        if (srv_http_check(s, c, version, post, &e)) return srv_respond_error(cc, c, &e);
        pthread_mutex_lock(&s->socks_mu);
        bool full = s->n_socks > s->opts.max_connections;
        pthread_mutex_unlock(&s->socks_mu);
        if (full) return fail(cc, c, 503, "server_error", "too_many_connections", "The server has too many open connections; retry later.");
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
            if (cl && strtoull(cl, NULL, 10) > s->opts.max_body) return too_large(s, cc, c);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (cc->too_big || cc->body_len + *upload_size > s->opts.max_body) {
            /* chunked and too big: MHD answers only once the body is read, so
             * the rest is read and dropped, and 413 comes at its end; a body
             * that goes on past twice the limit is cut off */
            cc->dropped += *upload_size;
            *upload_size = 0;
            cc->too_big = true;
            return cc->dropped > 2 * s->opts.max_body ? MHD_NO : MHD_YES;
        }
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
    srv_sock_stage_set(s, cc->sock, SRV_SOCK_ANSWER);
    if (cc->status) return MHD_YES; /* already answered (the unknown URLs among them) */
    if (cc->too_big) return too_large(s, cc, c);
    cc->close_after = false;
    if (s->draining && srv_routes[cc->route].post) /* a kept-alive connection's next request */
        return fail(cc, c, 503, "server_error", "shutting_down", "The server is shutting down.");
    return srv_routes[cc->route].handler(s, c, cc, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    srv *s = cls;
    srv_conn *cc = *con_cls;
    if (!cc) return;
    *con_cls = NULL;
    srv_sock_stage_set(s, sock_of(c), SRV_SOCK_HEADERS); /* a kept-alive connection waits for the next */
    if (!cc->job_logged) {
        /* no answer queued: the client left mid-upload (499, as nginx logs it), not a server error */
        int status = cc->status ? cc->status : 499;
        srv_metrics_request(&s->metrics, cc->route, status);
        if (s->opts.log_requests && !srv_routes[cc->route].quiet)
            fprintf(stderr, "lumen: %s %s %d %.3fs id %s\n", cc->method, cc->url, status, lm_now() - cc->t0,
                    cc->rid);
    }
    free(cc->body);
    free(cc);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx, enum MHD_ConnectionNotificationCode code) {
    srv *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_ctx = srv_sock_open(s, ci ? ci->connect_fd : -1);
    } else {
        srv_sock_close(s, *socket_ctx);
        *socket_ctx = NULL;
    }
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
    srv_constrain_init(s);
}

void srv_free_text(srv *s) {
    srv_constrain_free(s);
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

static bool is_loopback(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
    return false;
}

/* The listening socket, bound here rather than by MHD so that a busy port is
 * an error with its reason: SO_REUSEADDR only (a restart may rebind over old
 * TIME_WAIT connections), never SO_REUSEPORT, with which a second server
 * would quietly take a share of this one's requests. */
static int listen_on(const srv *s, const struct sockaddr_storage *ss, socklen_t len, int port, lm_err *e) {
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return lm_errf(e, "socket: %s", strerror(errno)), -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss->ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (const struct sockaddr *)ss, len) || listen(fd, 1024)) {
        int err = errno;
        close(fd);
        lm_errf(e, "cannot listen on %s port %d: %s%s", s->opts.host, port, strerror(err),
                err == EADDRINUSE ? " (another server is using it; pick another --port)" : "");
        return -1;
    }
    return fd;
}

/* Every connection holds a descriptor (and a thread): the soft limit goes up
 * to the hard one, and the connection cap down to what that allows. */
static void fit_descriptors(srv *s, int reserve) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    const rlim_t spare = 64; /* model files, the trace, eventfds of streams in flight */
    rlim_t want = (rlim_t)s->opts.max_connections + (rlim_t)reserve + spare;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        int fit = rl.rlim_cur > (rlim_t)reserve + spare + 16 ? (int)(rl.rlim_cur - (rlim_t)reserve - spare) / 2 : 16;
        fprintf(stderr, "lumen: warning: %llu open files allowed (ulimit -n): at most %d connections, not %d\n",
                (unsigned long long)rl.rlim_cur, fit, s->opts.max_connections);
        s->opts.max_connections = fit;
    }
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

/* Waits up to ms for SIGINT/SIGTERM; true when one came. */
static bool signalled(const sigset_t *sigs, int ms) {
    struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    return sigtimedwait(sigs, NULL, &t) > 0;
}

/* The graceful stop (nginx's, Envoy's drain): stop accepting; requests in
 * the engine keep running until shutdown_timeout_s is nearly spent; then
 * those left are cancelled, and each ends with an error its client can read
 * (a stream's final error event and [DONE], a 503 body); lumen exits once
 * they are written or the timeout is up. A second signal cuts the wait. */
static void drain(srv *s, struct MHD_Daemon *d, const sigset_t *sigs) {
    int sig = 0;
    sigwait(sigs, &sig);
    fprintf(stderr, "lumen: %s: shutting down (draining for up to %d s; signal again to stop now)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", s->opts.shutdown_timeout_s);
    fflush(stderr);
    MHD_quiesce_daemon(d); /* no new connections; the caller closes the socket */
    atomic_store(&s->draining, true);
    pthread_mutex_lock(&s->jobs_mu);
    s->shutting_down = true;
    pthread_mutex_unlock(&s->jobs_mu);
    const double t0 = lm_now(), limit = s->opts.shutdown_timeout_s;
    const double cut = limit - LM_MIN(2.0, limit / 4); /* time left to write the final events */
    bool again = false;
    while (!again && jobs_running(s) > 0 && lm_now() - t0 < cut) again = signalled(sigs, 50);
    int left = jobs_running(s);
    if (left) {
        fprintf(stderr, "lumen: cancelling %d request%s still running\n", left, left == 1 ? "" : "s");
        cancel_all(s);
    }
    while (!again && jobs_running(s) > 0 && lm_now() - t0 < limit) again = signalled(sigs, 20);
}

int lm_server_run(const lm_server_opts *o, lm_source *model, lm_backend *be, lm_err *e) {
    srv *s = lm_xcalloc(1, sizeof *s);
    s->opts = *o;
    if (!s->opts.host) s->opts.host = "127.0.0.1";
    if (!s->opts.max_body) s->opts.max_body = 8u << 20;
    if (!s->opts.timeout_s) s->opts.timeout_s = 30;
    if (!s->opts.max_connections) s->opts.max_connections = 4096;
    if (!s->opts.header_timeout_s) s->opts.header_timeout_s = 10;
    if (!s->opts.body_timeout_s) s->opts.body_timeout_s = 60;
    if (!s->opts.shutdown_timeout_s) s->opts.shutdown_timeout_s = 30;
    s->created = (int64_t)time(NULL);
    snprintf(s->fingerprint, sizeof s->fingerprint, "fp_lumen");
    srv_metrics_init(&s->metrics);
    pthread_mutex_init(&s->jobs_mu, NULL);
    pthread_mutex_init(&s->socks_mu, NULL);
    pthread_cond_init(&s->reaper_cv, NULL);
    s->model_name = o->alias ? lm_xstrdup(o->alias) : basename_of(o->model_path);
    int rc = -1;
    struct MHD_Daemon *d = NULL;
    int lfd = -1;
    /* connections past max_connections still get an answer (503) from these */
    const int reserve = LM_MAX(16, s->opts.max_connections / 16);

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
    s->check_host = is_loopback(&ss) || (o->allow_hosts && strcmp(o->allow_hosts, "*"));
    if ((lfd = listen_on(s, &ss, sslen, o->port, e)) < 0) goto done;
    fit_descriptors(s, reserve);
    const lm_model_load_opts lo = { o->progress, o->rope };
    if (lm_model_load_with(&s->model, model, be, &lo, e)) goto done;
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
    s->metrics.cache_ram = lm_engine_cache_ram(s->en);

    if (srv_reaper_start(s, e)) goto done;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    d = MHD_start_daemon(flags, 0, NULL, NULL, on_access, s,
                         MHD_OPTION_LISTEN_SOCKET, (MHD_socket)lfd,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opts.timeout_s,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->opts.max_connections + reserve),
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)LM_MAX(s->opts.max_client_connections, 0),
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                         MHD_OPTION_THREAD_STACK_SIZE, (size_t)(2u << 20),
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                         MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                         MHD_OPTION_END);
    if (!d) {
        lm_errf(e, "cannot start the HTTP daemon on %s port %d (%s)", s->opts.host, o->port,
                errno ? strerror(errno) : "libmicrohttpd failed to start");
        goto done;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    int port = o->port;
    if (!getsockname(lfd, (struct sockaddr *)&bound, &blen))
        port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                 : ((struct sockaddr_in *)&bound)->sin_port);
    char cache[64] = "prefix cache off";
    if (s->metrics.cache_ram)
        snprintf(cache, sizeof cache, "prefix cache %.0f MiB", (double)s->metrics.cache_ram / (1 << 20));
    char kv[128], steps[80];
    fprintf(stderr, "lumen: serving %s on http://%s%s%s:%d (ctx %d, vocab %d, %s, %s, %s%s)\n", s->model_name,
            v6 ? "[" : "", s->opts.host, v6 ? "]" : "", port, s->ctx, s->n_vocab,
            lm_engine_kv_summary(s->en, kv, sizeof kv), lm_engine_step_summary(s->en, steps, sizeof steps), cache,
            s->opts.api_key ? ", API key required" : "");
    static const char *const spec_mode[] = { [LM_SPEC_LOOKUP] = "lookup", [LM_SPEC_MTP] = "the MTP head",
                                             [LM_SPEC_AUTO] = "lookup, else the MTP head",
                                             [LM_SPEC_CALLBACK] = "a callback", [LM_SPEC_DRAFT] = "the draft model " };
    if (o->engine.spec > LM_SPEC_OFF && o->engine.spec <= LM_SPEC_DRAFT)
        fprintf(stderr, "lumen: speculative decoding: %s%s (each sequence drafts only while it pays; "
                        "\"speculative\": false in a request opts out)\n",
                spec_mode[o->engine.spec], o->engine.spec == LM_SPEC_DRAFT ? o->engine.spec_model : "");
    lm_disk_cache *dc = lm_engine_disk_cache(s->en);
    if (dc) {
        lm_dc_stats ds;
        lm_engine_stats es;
        lm_dcache_get_stats(dc, &ds);
        lm_engine_get_stats(s->en, &es);
        fprintf(stderr,
                "lumen: disk cache %s: %d entries, %.1f of %.1f GiB, indexed in %.0f ms (skipped: %llu of another "
                "model or format, %llu corrupt, %llu interrupted writes); model identity hashed in %.0f ms%s\n",
                o->engine.cache_dir, ds.entries, (double)ds.bytes / (1 << 30), (double)ds.budget / (1 << 30),
                ds.open_s * 1e3, (unsigned long long)ds.foreign, (unsigned long long)ds.corrupt,
                (unsigned long long)ds.temp_cleaned, es.disk_identity_s * 1e3,
                es.disk_identity_sampled ? " (weights sampled: larger than 1 GiB)" : "");
    }
    fflush(stderr);

    drain(s, d, &sigs);
    rc = 0;
done:
    if (d) MHD_stop_daemon(d);
    if (lfd >= 0) close(lfd); /* MHD_quiesce_daemon gave it back (or MHD never took it) */
    srv_reaper_stop(s);
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
    pthread_mutex_destroy(&s->socks_mu);
    pthread_cond_destroy(&s->reaper_cv);
    free(s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
