/* deadlines.c - header and body deadlines: slow clients cannot hold sockets.
 *
 * Design note
 * -----------
 * libmicrohttpd's connection timeout is an idle timeout: a client that sends
 * one byte every few seconds (slowloris) keeps its socket, and its thread,
 * for ever. Like nginx's client_header_timeout and client_body_timeout, a
 * request here must deliver its headers within header_timeout_s of the
 * socket opening (or, on a kept-alive connection, of the previous answer plus
 * the idle timeout) and its body within body_timeout_s of its headers. A
 * reaper thread checks every open socket twice a second and shuts down
 * (shutdown(2), not close: the descriptor stays MHD's) those past their
 * deadline; MHD then sees the end of the stream and closes the connection.
 * Answers have no deadline here: a stream may run for minutes, and a
 * vanished client is seen by the poll on its socket (generate.c).
 *
 * MHD tells of a socket closing before it closes the descriptor, and both
 * that notification and the reaper hold socks_mu, so the reaper never shuts
 * down a descriptor number that has been reused. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server_internal.h"

srv_sock *srv_sock_open(srv *s, int fd) {
    srv_sock *k = lm_xcalloc(1, sizeof *k);
    k->fd = fd;
    k->stage = SRV_SOCK_HEADERS;
    k->since = lm_now();
    pthread_mutex_lock(&s->socks_mu);
    k->next = s->socks;
    if (s->socks) s->socks->prev = k;
    s->socks = k;
    s->n_socks++;
    pthread_mutex_unlock(&s->socks_mu);
    return k;
}

void srv_sock_close(srv *s, srv_sock *k) {
    if (!k) return;
    pthread_mutex_lock(&s->socks_mu);
    if (k->prev) k->prev->next = k->next;
    else s->socks = k->next;
    if (k->next) k->next->prev = k->prev;
    s->n_socks--;
    pthread_mutex_unlock(&s->socks_mu);
    free(k);
}

void srv_sock_stage_set(srv *s, srv_sock *k, srv_sock_stage stage) {
    if (!k) return;
    pthread_mutex_lock(&s->socks_mu);
    if (stage == SRV_SOCK_HEADERS && k->stage != SRV_SOCK_HEADERS) k->served = true;
    k->stage = stage;
    k->since = lm_now();
    pthread_mutex_unlock(&s->socks_mu);
}

int srv_reap(srv *s, double now) {
    const double head = s->opts.header_timeout_s, body = s->opts.body_timeout_s, idle = s->opts.timeout_s;
    int n = 0;
    pthread_mutex_lock(&s->socks_mu);
    for (srv_sock *k = s->socks; k; k = k->next) {
        double limit = k->stage == SRV_SOCK_HEADERS ? head + (k->served ? idle : 0)
                       : k->stage == SRV_SOCK_BODY  ? body
                                                    : -1;
        if (limit < 0 || k->fd < 0 || now - k->since <= limit) continue;
        shutdown(k->fd, SHUT_RDWR);
        k->fd = -1; /* once */
        n++;
    }
    pthread_mutex_unlock(&s->socks_mu);
    return n;
}

static void *reaper_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->socks_mu);
    while (!s->reaper_stop) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 500 * 1000 * 1000;
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->reaper_cv, &s->socks_mu, &t);
        if (s->reaper_stop) break;
        pthread_mutex_unlock(&s->socks_mu);
        srv_reap(s, lm_now());
        pthread_mutex_lock(&s->socks_mu);
    }
    pthread_mutex_unlock(&s->socks_mu);
    return NULL;
}

int srv_reaper_start(srv *s, lm_err *e) {
    int rc = pthread_create(&s->reaper, NULL, reaper_main, s);
    if (rc) return lm_errf(e, "cannot start the deadline thread: %s", strerror(rc));
    s->reaper_on = true;
    return 0;
}

void srv_reaper_stop(srv *s) {
    if (!s->reaper_on) return;
    pthread_mutex_lock(&s->socks_mu);
    s->reaper_stop = true;
    pthread_cond_signal(&s->reaper_cv);
    pthread_mutex_unlock(&s->socks_mu);
    pthread_join(s->reaper, NULL);
    s->reaper_on = false;
}
