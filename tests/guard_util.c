/* guard_util.c - see guard_util.h.
 *
 * The server is a child of the test binary (PR_SET_PDEATHSIG: it dies with
 * it), remembered so that a test stopped by a failed LM_REQUIRE does not leave
 * it running. The reference reader parses safetensors itself (an 8-byte
 * header length, a JSON header, raw little-endian data) so that it does not
 * depend on where the library's own reader lives. */
#define _GNU_SOURCE
#include "guard_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "test_util.h"

/* ---- time ---- */

double gu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void gu_msleep(int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

/* ---- the server process ---- */

static pid_t g_children[32];

static void remember(pid_t pid, bool add) {
    for (size_t i = 0; i < sizeof g_children / sizeof *g_children; i++)
        if (add ? g_children[i] == 0 : g_children[i] == pid) {
            g_children[i] = add ? pid : 0;
            return;
        }
}

__attribute__((destructor)) static void kill_children(void) {
    for (size_t i = 0; i < sizeof g_children / sizeof *g_children; i++)
        if (g_children[i] > 0) {
            kill(g_children[i], SIGKILL);
            waitpid(g_children[i], NULL, 0);
        }
}

const char *gu_demo_dir(void) { return LUMEN_SOURCE_DIR "/models/demo"; }

int gu_server_start(gu_server *s, const char *model_dir, const char *extra) {
    memset(s, 0, sizeof *s);
    static int counter;
    snprintf(s->log, sizeof s->log, "%s/guard-serve%d.log", lm_test_tmpdir(), counter++);
    char cmd[4096];
    /* stdout into the log too: a server left behind must not hold the
     * runner's output pipe open */
    snprintf(cmd, sizeof cmd, "exec '%s' serve -m '%s' --port 0 %s 2>'%s' 1>&2", lm_test_lumen_bin(), model_dir,
             extra ? extra : "", s->log);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->pid = pid;
    remember(pid, true);
    for (int i = 0; i < 600; i++) { /* 30 s: sanitizer builds start slowly */
        char *log = lm_tu_read(s->log, NULL);
        const char *p = log ? strstr(log, "http://127.0.0.1:") : NULL;
        char *end = NULL;
        long port = p ? strtol(p + strlen("http://127.0.0.1:"), &end, 10) : 0;
        if (end && *end == ' ') s->port = (int)port; /* the whole number: the line may be half written */
        free(log);
        if (s->port > 0) return 0;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            remember(pid, false);
            s->pid = 0;
            return -1;
        }
        gu_msleep(50);
    }
    return -1;
}

int gu_server_stop(gu_server *s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 400; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            remember(s->pid, false);
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        gu_msleep(50);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    remember(s->pid, false);
    s->pid = 0;
    return -2;
}

void gu_server_dump_log(const gu_server *s) {
    char *log = lm_tu_read(s->log, NULL);
    fprintf(stderr, "  --- server log (%s) ---\n%s  ---\n", s->log, log ? log : "(none)");
    free(log);
}

/* ---- HTTP ---- */

void gu_resp_free(gu_resp *r) {
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof *r);
}

int gu_dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

int gu_send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int gu_send(int fd, const char *method, const char *path, const char *body, const char *hdrs) {
    size_t blen = body ? strlen(body) : 0;
    char head[2048];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%sContent-Length: %zu\r\n\r\n", method,
                     path, hdrs ? hdrs : "", body ? "Content-Type: application/json\r\n" : "", blen);
    if (n < 0 || (size_t)n >= sizeof head) return -1;
    if (gu_send_all(fd, head, (size_t)n)) return -1;
    return body ? gu_send_all(fd, body, blen) : 0;
}

int gu_read(int fd, gu_resp *r) {
    memset(r, 0, sizeof *r);
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t got = recv(fd, buf + n, cap - n - 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
    }
    buf[n] = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        free(buf);
        return -1;
    }
    *sep = 0;
    r->headers = strdup(buf);
    const char *p = sep + 4, *end = buf + n;
    r->body = malloc((size_t)(end - p) + 1);
    if (strcasestr(r->headers, "Transfer-Encoding: chunked")) {
        while (p < end) {
            char *e;
            unsigned long len = strtoul(p, &e, 16);
            const char *data = strstr(e, "\r\n");
            if (!data || len == 0) break;
            data += 2;
            if (data + len > end) len = (unsigned long)(end - data);
            memcpy(r->body + r->body_len, data, len);
            r->body_len += len;
            p = data + len + 2;
        }
    } else {
        memcpy(r->body, p, (size_t)(end - p));
        r->body_len = (size_t)(end - p);
    }
    r->body[r->body_len] = 0;
    free(buf);
    return 0;
}

int gu_http(int port, const char *method, const char *path, const char *body, const char *hdrs, gu_resp *r) {
    memset(r, 0, sizeof *r);
    int fd = gu_dial(port);
    if (fd < 0) return -1;
    gu_send(fd, method, path, body, hdrs); /* an early answer (413) can still be read */
    int rc = gu_read(fd, r);
    close(fd);
    return rc;
}

json_t *gu_json(const gu_resp *r) { return json_loadb(r->body ? r->body : "", r->body_len, JSON_ALLOW_NUL, NULL); }

json_t *gu_sse_chunks(const gu_resp *r, int *n_done, int *n_bad) {
    json_t *out = json_array();
    *n_done = *n_bad = 0;
    const char *p = r->body, *end = r->body + r->body_len;
    while (p && p < end) {
        const char *nl = strstr(p, "\n\n");
        if (!nl) break;
        if (!strncmp(p, "data: [DONE]", 12)) {
            (*n_done)++;
        } else if (!strncmp(p, "data: ", 6)) {
            json_t *c = json_loadb(p + 6, (size_t)(nl - p - 6), JSON_ALLOW_NUL, NULL);
            if (c) json_array_append_new(out, c);
            else (*n_bad)++;
        }
        p = nl + 2;
    }
    return out;
}

double gu_metric(int port, const char *name) {
    gu_resp r;
    if (gu_http(port, "GET", "/metrics", NULL, NULL, &r)) return -1;
    double v = -1;
    char key[256];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = r.status == 200 ? strstr(r.body, key) : NULL;
    if (p) v = atof(p + strlen(key));
    gu_resp_free(&r);
    return v;
}

/* ---- reference tensors ---- */

/* A copy of tensor name of st when it has type_name and rank 1 or 2, else
 * NULL; *n the element count, shape its dimensions (4-byte elements). */
static void *ref_copy(const lm_safetensors *st, const char *name, const char *type_name, size_t *n,
                      int64_t shape[2], int *rank) {
    const lm_file_tensor *t = lm_safetensors_find(st, name);
    if (!t || strcmp(t->type_name, type_name) || t->n_dims < 1 || t->n_dims > 2) return NULL;
    *rank = t->n_dims;
    for (int i = 0; i < t->n_dims; i++) shape[i] = t->shape[i];
    *n = (size_t)lm_file_tensor_numel(t);
    void *out = malloc(t->nbytes);
    if (out) memcpy(out, t->data, t->nbytes);
    return out;
}

int gu_ref_load(const char *dir, int prompt, gu_ref *r, char *why, size_t why_len) {
    memset(r, 0, sizeof *r);
    char path[1024], name[64];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    lm_safetensors st = { 0 };
    lm_err e = { { 0 } };
    if (lm_safetensors_open(&st, path, &e)) {
        snprintf(why, why_len, "%s", e.msg);
        return -1;
    }
    int rc = -1, rank;
    int64_t shape[2];
    size_t n;
    snprintf(name, sizeof name, "prompt%d.ids", prompt);
    if (!(r->ids = ref_copy(&st, name, "I32", &n, shape, &rank))) {
        snprintf(why, why_len, "%s: no I32 %s", path, name);
        goto done;
    }
    r->n_ids = (int)n;
    snprintf(name, sizeof name, "prompt%d.greedy_ids", prompt);
    if (!(r->greedy = ref_copy(&st, name, "I32", &n, shape, &rank))) {
        snprintf(why, why_len, "%s: no I32 %s", path, name);
        goto done;
    }
    r->n_greedy = (int)n;
    snprintf(name, sizeof name, "prompt%d.greedy_logits", prompt);
    if (!(r->greedy_logits = ref_copy(&st, name, "F32", &n, shape, &rank)) || rank != 2 ||
        shape[0] != r->n_greedy) {
        snprintf(why, why_len, "%s: no F32 [%d, V] %s", path, r->n_greedy, name);
        goto done;
    }
    r->vocab = (int)shape[1];
    rc = 0;
done:
    lm_safetensors_close(&st);
    if (rc) gu_ref_free(r);
    return rc;
}

void gu_ref_free(gu_ref *r) {
    free(r->ids);
    free(r->greedy);
    free(r->greedy_logits);
    memset(r, 0, sizeof *r);
}

void gu_log_softmax(const float *x, int n, double *out) {
    double mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = (double)x[i] - lse;
}
