/* guard_util.h - what the guard tests (tests/test_guard_*.c, issue #25) share:
 * a `lumen serve` child process on any model folder, a blocking HTTP/1.1
 * client (Connection: close, chunked bodies decoded), /metrics values, SSE
 * bodies as parsed chunks, and reference tensors of a model folder.
 *
 * Design: the guard tests must fail when a feature breaks, so nothing here
 * hides a failure: a server that does not start, a body that does not parse
 * or a reference that is missing is reported to the caller, never replaced
 * by a default. Reference tensors are read with the project's safetensors
 * parser (format/safetensors.h). */
#ifndef LM_GUARD_UTIL_H
#define LM_GUARD_UTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lm_test.h"

/* Sanitizer builds (ASan, 5-10x slower) run the model-level guard tests on
 * the best CPU path only: they are there for memory errors, and the release
 * build checks the numbers of every path. */
#if defined(__SANITIZE_ADDRESS__)
#define GU_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GU_SANITIZED 1
#endif
#endif
#ifndef GU_SANITIZED
#define GU_SANITIZED 0
#endif

/* ---- a server process ---- */

typedef struct gu_server {
    pid_t pid;
    int port;
    char log[512];
} gu_server;

/* Starts `lumen serve -m DIR --port 0 EXTRA` (stderr into a log in the test
 * tmpdir) and waits for its address; 0 on success. */
int gu_server_start(gu_server *s, const char *model_dir, const char *extra);
/* SIGTERM, then the exit status (0 = clean); SIGKILL after 20 s. */
int gu_server_stop(gu_server *s);
/* Prints the server's log on stderr (after a failure). */
void gu_server_dump_log(const gu_server *s);
/* In a test: starts the server on DIR (a required check: the log is
 * printed if it does not start), and stops it checking a clean exit. */
#define GU_START(s, dir, extra)                                                  \
    do {                                                                         \
        if (gu_server_start(&(s), (dir), (extra))) {                             \
            gu_server_dump_log(&(s));                                            \
            LM_REQUIRE(!"server started");                                       \
        }                                                                        \
    } while (0)
#define GU_STOP(s)                                                               \
    do {                                                                         \
        int rc_ = gu_server_stop(&(s));                                          \
        if (rc_ != 0) gu_server_dump_log(&(s));                                  \
        LM_CHECK_MSG(rc_ == 0, "server exit status %d", rc_);                    \
    } while (0)

/* The bundled demo model (models/demo of this checkout). */
const char *gu_demo_dir(void);

/* ---- HTTP ---- */

typedef struct gu_resp {
    int status;
    char *headers;
    char *body;
    size_t body_len;
} gu_resp;

void gu_resp_free(gu_resp *r);
/* A connected socket to 127.0.0.1:port, or -1. */
int gu_dial(int port);
/* Sends n bytes (no SIGPIPE); 0, or -1 once the peer has gone. */
int gu_send_all(int fd, const char *p, size_t n);
/* Sends one request (Connection: close); hdrs are extra "Name: value\r\n" lines. */
int gu_send(int fd, const char *method, const char *path, const char *body, const char *hdrs);
/* Reads a whole response until the server closes. */
int gu_read(int fd, gu_resp *r);
/* One request and its response; 0 on success. */
int gu_http(int port, const char *method, const char *path, const char *body, const char *hdrs, gu_resp *r);
/* The body as JSON (NUL bytes allowed in strings), or NULL. */
json_t *gu_json(const gu_resp *r);
/* The `data:` events of an SSE body: a JSON array of the parsed chunks, in
 * order; *n_done counts "data: [DONE]" events, *n_bad events that are not
 * JSON. */
json_t *gu_sse_chunks(const gu_resp *r, int *n_done, int *n_bad);
/* The value of the metric line "NAME VALUE" on /metrics, or -1 when the
 * page or the line is missing. */
double gu_metric(int port, const char *name);

/* ---- time ---- */

double gu_now(void);
void gu_msleep(int ms);

/* ---- reference tensors (reference.safetensors of a model folder) ---- */

typedef struct gu_ref {
    int n_ids;
    int32_t *ids;      /* prompt{i}.ids */
    int n_greedy;
    int32_t *greedy;   /* prompt{i}.greedy_ids */
    float *greedy_logits; /* prompt{i}.greedy_logits [n_greedy][vocab] */
    int vocab;
} gu_ref;

/* Reads prompt i of DIR/reference.safetensors; 0 on success, else -1 with why. */
int gu_ref_load(const char *dir, int prompt, gu_ref *r, char *why, size_t why_len);
void gu_ref_free(gu_ref *r);
/* log_softmax(x)[i] in double for all i into out [n]. */
void gu_log_softmax(const float *x, int n, double *out);

#endif
