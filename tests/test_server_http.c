/* test_server_http.c - `lumen serve` as a client sees it: the real binary on a
 * free loopback port with the qwen3 fixture, driven by the small HTTP/1.1
 * client of guard_util.h (plain sockets; chunked bodies decoded). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lm_test.h"
#include "base/lm_file.h"
#include "guard_util.h"
#include "test_util.h"

#define LM_COUNT_(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the server process and the HTTP client (guard_util.h) ------------------------------ */

typedef gu_server server;
typedef gu_resp resp;

/* Starts lumen serve on the qwen3 fixture, one thread, with extra args; 0 on
 * success. */
static int server_start(server *s, const char *extra) {
    memset(s, 0, sizeof *s);
    char *dir = lm_test_fixture_path("models/qwen3");
    if (!dir) return -1;
    char args[1536];
    snprintf(args, sizeof args, "--threads 1 %s", extra ? extra : "");
    int rc = gu_server_start(s, dir, args);
    free(dir);
    return rc;
}

/* Server output is parsed with JSON_ALLOW_NUL: a random fixture model can
 * emit a <0x00> byte token, which the server (rightly) writes as \u0000,
 * and jansson refuses that by default (1-2 % of these tests' runs failed). */
static json_t *body_json(const resp *r) {
    return json_loadb(r->body ? r->body : "", r->body_len, JSON_ALLOW_NUL, NULL);
}

/* The text of a chat answer (non-stream). */
static char *chat_text(const resp *r) {
    json_t *j = body_json(r);
    const char *c = json_string_value(
        json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
    char *out = strdup(c ? c : "(none)");
    json_decref(j);
    return out;
}

/* Concatenated delta contents of an SSE body; counts chunks and [DONE]. */
static char *sse_text(const resp *r, int *n_chunks, int *n_done, json_t **usage, char *finish, size_t fcap) {
    size_t cap = r->body_len + 1, len = 0;
    char *out = calloc(1, cap);
    *n_chunks = *n_done = 0;
    if (usage) *usage = NULL;
    const char *p = r->body, *end = r->body + r->body_len;
    while (p && p < end) {
        const char *nl = strstr(p, "\n\n");
        if (!nl) break;
        if (!strncmp(p, "data: [DONE]", 12)) (*n_done)++;
        else if (!strncmp(p, "data: ", 6)) {
            json_t *c = json_loadb(p + 6, (size_t)(nl - p - 6), JSON_ALLOW_NUL, NULL);
            if (c) (*n_chunks)++;
            json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
            json_t *d = json_object_get(ch, "delta");
            const char *t = json_string_value(json_object_get(d ? d : ch, d ? "content" : "text"));
            if (t) {
                size_t tl = strlen(t);
                memcpy(out + len, t, (tl < cap - 1 - len ? tl : cap - 1 - len));
                len += (tl < cap - 1 - len ? tl : cap - 1 - len);
            }
            if (json_is_string(json_object_get(ch, "finish_reason")) && finish)
                snprintf(finish, fcap, "%s", json_string_value(json_object_get(ch, "finish_reason")));
            if (usage && json_is_object(json_object_get(c, "usage"))) {
                json_decref(*usage);
                *usage = json_incref(json_object_get(c, "usage"));
            }
            json_decref(c);
        }
        p = nl + 2;
    }
    return out;
}

#define START(s, extra)                                                         \
    do {                                                                        \
        if (!lm_test_have_fixture("models/qwen3")) LM_SKIP("%s", lm_test_fixtures_why());       \
        if (server_start(&(s), (extra))) {                                      \
            gu_server_dump_log(&(s));                                              \
            LM_REQUIRE(!"server started");                                      \
        }                                                                       \
    } while (0)

static const char *k_chat = "{\"model\":\"qwen3\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":12%s}";

static char *chat_body(const char *extra) {
    char *b = malloc(strlen(k_chat) + strlen(extra) + 1);
    sprintf(b, k_chat, extra);
    return b;
}

/* ---- tests ------------------------------------------------------------------------------------ */

LM_TEST(server_http_basic_routes) {
    server s;
    START(s, "");
    resp r;
    LM_REQUIRE(gu_http(s.port, "GET", "/health", NULL, NULL, &r) == 0);
    LM_CHECK(r.status == 200 && strstr(r.body, "\"ok\""));
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "GET", "/v1/models", NULL, NULL, &r) == 0);
    json_t *j = body_json(&r);
    LM_CHECK_MSG(r.status == 200 && lm_streq(json_string_value(json_object_get(j, "object")), "list"),
                 "status %d body %s", r.status, r.body);
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")), "qwen3"));
    json_decref(j);
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "GET", "/v1/models/qwen3", NULL, NULL, &r) == 0);
    LM_CHECK(r.status == 200);
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "GET", "/v1/models/other", NULL, NULL, &r) == 0);
    LM_CHECK(r.status == 404);
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "GET", "/nope", NULL, NULL, &r) == 0);
    LM_CHECK(r.status == 404 && strstr(r.body, "\"error\""));
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "GET", "/v1/chat/completions", NULL, NULL, &r) == 0);
    LM_CHECK(r.status == 405);
    gu_resp_free(&r);
    char *b = chat_body("");
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", b, NULL, &r) == 0);
    LM_CHECK_MSG(r.status == 200, "status %d body %s", r.status, r.body);
    j = body_json(&r);
    LM_CHECK_MSG(lm_streq(json_string_value(json_object_get(j, "object")), "chat.completion"), "headers %s body %s",
                 r.headers, r.body);
    json_t *u = json_object_get(j, "usage");
    LM_CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) > 0);
    LM_CHECK(json_is_integer(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")));
    json_decref(j);
    gu_resp_free(&r);
    free(b);
    LM_REQUIRE(gu_http(s.port, "GET", "/metrics", NULL, NULL, &r) == 0);
    LM_CHECK(r.status == 200 && strstr(r.headers, "text/plain"));
    LM_CHECK(strstr(r.body, "lumen_requests_total{route=\"chat_completions\",status=\"2xx\"} 1") != NULL);
    LM_CHECK(strstr(r.body, "# TYPE lumen_time_to_first_token_seconds histogram") != NULL);
    LM_CHECK(strstr(r.body, "lumen_queue_depth 0") != NULL);
    gu_resp_free(&r);
    GU_STOP(s);
}

LM_TEST(server_http_stream_and_completions) {
    server s;
    START(s, "");
    resp r;
    char *b = chat_body(",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"seed\":3");
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", b, NULL, &r) == 0);
    LM_CHECK(r.status == 200 && strcasestr(r.headers, "text/event-stream"));
    int n_chunks, n_done;
    json_t *usage;
    char finish[32] = "";
    char *text = sse_text(&r, &n_chunks, &n_done, &usage, finish, sizeof finish);
    LM_CHECK(n_done == 1 && n_chunks >= 3);
    LM_CHECK(usage && json_integer_value(json_object_get(usage, "completion_tokens")) > 0);
    LM_CHECK(!strcmp(finish, "stop") || !strcmp(finish, "length"));
    /* the same request without streaming gives the same text */
    char *b2 = chat_body(",\"seed\":3");
    resp r2;
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", b2, NULL, &r2) == 0);
    char *t2 = chat_text(&r2);
    LM_CHECK_MSG(!strcmp(text, t2), "stream '%s' vs '%s'", text, t2);
    free(t2);
    free(b2);
    gu_resp_free(&r2);
    json_decref(usage);
    free(text);
    gu_resp_free(&r);
    free(b);

    /* completions: token-id prompt, echo, logprobs */
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/completions",
                    "{\"model\":\"qwen3\",\"prompt\":\"The sky\",\"max_tokens\":5,\"temperature\":0,\"logprobs\":2,"
                    "\"logit_bias\":{\"2\":-100}}",
                    NULL, &r) == 0);
    LM_CHECK_MSG(r.status == 200, "%s", r.body);
    json_t *j = body_json(&r);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    LM_CHECK(lm_streq(json_string_value(json_object_get(j, "object")), "text_completion"));
    LM_CHECK(lm_streq(json_string_value(json_object_get(ch, "finish_reason")), "length"));
    LM_CHECK(json_array_size(json_object_get(json_object_get(ch, "logprobs"), "tokens")) == 5);
    LM_CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")) == 5);
    json_decref(j);
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/completions",
                    "{\"prompt\":[1,100,200],\"max_tokens\":3,\"echo\":true,\"stream\":true}", NULL, &r) == 0);
    LM_CHECK(r.status == 200);
    text = sse_text(&r, &n_chunks, &n_done, NULL, finish, sizeof finish);
    LM_CHECK(n_done == 1);
    LM_CHECK(!strncmp(text, "<|im_start|>", 12)); /* echo decodes the prompt ids */
    free(text);
    gu_resp_free(&r);
    GU_STOP(s);
}

LM_TEST(server_http_seed_and_stop) {
    server s;
    START(s, "");
    resp r;
    char *texts[3];
    const char *extra[3] = { ",\"temperature\":1,\"seed\":42,\"max_tokens\":24",
                             ",\"temperature\":1,\"seed\":42,\"max_tokens\":24",
                             ",\"temperature\":1,\"seed\":43,\"max_tokens\":24" };
    for (int i = 0; i < 3; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]%s,\"logit_bias\":{\"2\":-100}}",
                 extra[i]);
        LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", body, NULL, &r) == 0);
        texts[i] = chat_text(&r);
        gu_resp_free(&r);
    }
    LM_CHECK_MSG(!strcmp(texts[0], texts[1]), "same seed: '%s' vs '%s'", texts[0], texts[1]);
    LM_CHECK_MSG(strcmp(texts[0], texts[2]) != 0, "other seed gave the same 24 tokens: '%s'", texts[0]);
    /* a stop string taken from the middle of the known answer */
    size_t n = strlen(texts[0]);
    if (n >= 8) {
        char stop[8];
        memcpy(stop, texts[0] + n / 2, 3);
        stop[3] = 0;
        json_t *req = json_pack("{s:[{s:s,s:s}],s:f,s:i,s:i,s:{s:i},s:s}", "messages", "role", "user", "content", "Hello",
                                "temperature", 1.0, "seed", 42, "max_tokens", 24, "logit_bias", "2", -100, "stop", stop);
        char *body = json_dumps(req, 0);
        for (int stream = 0; stream < 2; stream++) {
            if (stream) {
                json_object_set_new(req, "stream", json_true());
                free(body);
                body = json_dumps(req, 0);
            }
            LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", body, NULL, &r) == 0);
            char finish[32] = "";
            int nc, nd;
            char *t = stream ? sse_text(&r, &nc, &nd, NULL, finish, sizeof finish) : chat_text(&r);
            const char *first = strstr(texts[0], stop);
            LM_CHECK(first != NULL);
            size_t want = first ? (size_t)(first - texts[0]) : 0;
            LM_CHECK_MSG(strlen(t) == want && !strncmp(t, texts[0], want), "stop '%s': got '%s' from '%s'", stop, t,
                         texts[0]);
            if (stream) LM_CHECK(!strcmp(finish, "stop"));
            free(t);
            gu_resp_free(&r);
        }
        free(body);
        json_decref(req);
    }
    for (int i = 0; i < 3; i++) free(texts[i]);
    GU_STOP(s);
}

static void expect_status(lm_test_ctx *lm_t_, int port, const char *path, const char *body, const char *hdrs, int status,
                          const char *code) {
    resp r;
    int hr = gu_http(port, "POST", path, body, hdrs, &r);
    LM_CHECK_MSG(hr == 0, "%.60s: no response", body);
    if (hr) return;
    json_t *j = body_json(&r);
    json_t *e = json_object_get(j, "error");
    LM_CHECK_MSG(r.status == status, "%.80s -> %d (want %d): %s", body, r.status, status, r.body);
    LM_CHECK_MSG(json_is_string(json_object_get(e, "message")) && json_is_string(json_object_get(e, "type")) &&
                     json_object_get(e, "param") && json_object_get(e, "code"),
                 "error shape: %s", r.body);
    if (code) LM_CHECK_MSG(lm_streq(json_string_value(json_object_get(e, "code")) ?: "", code), "code: %s", r.body);
    json_decref(j);
    gu_resp_free(&r);
}

/* max_tokens past the room the prompt leaves is cut to that room on every
 * route (finish_reason "length" when the model does not stop first), as
 * llama-server does: agents send 8000 or 13107 whatever the context. */
LM_TEST(server_http_max_tokens_clamped_to_room) {
    server s;
    START(s, "--ctx 64 --kv-type K8V4r --step-tokens 48 --prefill-tokens 96");
    /* the startup line names the KV format, its bytes a token, the tokens
     * it holds and the step budgets */
    size_t loglen = 0;
    char *log = lm_read_file(s.log, &loglen, NULL);
    LM_CHECK_MSG(log && strstr(log, "(ctx 64,") && strstr(log, "KV K=q8,V=q4r, ") && strstr(log, " KiB a token, ") &&
                     strstr(log, ", steps of 48 tokens, 96 for prompts alone, "),
                 "%s", log ? log : "(no log)");
    free(log);
    static const struct { const char *path, *body, *usage_in, *usage_out; } k[] = {
        { "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":8000}",
          "prompt_tokens", "completion_tokens" },
        { "/v1/completions", "{\"prompt\":\"once upon a time\",\"max_tokens\":13107}", "prompt_tokens",
          "completion_tokens" },
        { "/v1/responses", "{\"input\":\"x\",\"max_output_tokens\":100000}", "input_tokens", "output_tokens" },
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        resp r;
        LM_REQUIRE(gu_http(s.port, "POST", k[i].path, k[i].body, NULL, &r) == 0);
        json_t *j = gu_json(&r);
        const json_t *u = json_object_get(j, "usage");
        const long long in = json_integer_value(json_object_get(u, k[i].usage_in));
        const long long out = json_integer_value(json_object_get(u, k[i].usage_out));
        LM_CHECK_MSG(r.status == 200 && in > 0 && out > 0 && in + out <= 64, "%s: %d in %lld out %lld %.300s",
                     k[i].path, r.status, in, out, r.body);
        const json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
        if (fin) LM_CHECK_MSG(!strcmp(fin, "length") ? in + out == 64 : !strcmp(fin, "stop"), "%s: %s", k[i].path, fin);
        json_decref(j);
        gu_resp_free(&r);
    }
    GU_STOP(s);
}

LM_TEST(server_http_errors) {
    server s;
    START(s, "--ctx 64 --max-body-mb 1");
    const char *C = "/v1/chat/completions";
    expect_status(lm_t_, s.port, C, "{\"messages\": [", NULL, 400, NULL);
    expect_status(lm_t_, s.port, C, "{\"messages\": 5}", NULL, 400, NULL);
    expect_status(lm_t_, s.port, C, "{\"messages\": []}", NULL, 400, NULL);
    expect_status(lm_t_, s.port, C, "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", NULL, 404,
                  "model_not_found");
    char *big = malloc(4000);
    strcpy(big, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < 300; i++) strcat(big, "word ");
    strcat(big, "\"}]}");
    expect_status(lm_t_, s.port, C, big, NULL, 400, "context_length_exceeded");
    free(big);
    size_t n = (1u << 20) + 100;
    char *huge = malloc(n + 1);
    memset(huge, ' ', n);
    huge[0] = '{';
    huge[n - 1] = '}';
    huge[n] = 0;
    expect_status(lm_t_, s.port, C, huge, NULL, 413, NULL);
    free(huge);
    /* the server keeps serving */
    resp r;
    LM_REQUIRE(gu_http(s.port, "POST", C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":4}", NULL, &r) == 0);
    LM_CHECK(r.status == 200);
    gu_resp_free(&r);
    GU_STOP(s);

    START(s, "--api-key sekrit");
    expect_status(lm_t_, s.port, C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", NULL, 401, "invalid_api_key");
    expect_status(lm_t_, s.port, C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "Authorization: Bearer nope\r\n",
                  401, "invalid_api_key");
    LM_REQUIRE(gu_http(s.port, "POST", C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2}",
                    "Authorization: Bearer sekrit\r\n", &r) == 0);
    LM_CHECK(r.status == 200);
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "GET", "/health", NULL, NULL, &r) == 0);
    LM_CHECK(r.status == 200);
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "GET", "/v1/models", NULL, NULL, &r) == 0);
    LM_CHECK(r.status == 401);
    gu_resp_free(&r);
    GU_STOP(s);
}


LM_TEST(server_http_disconnect_cancels) {
    server s;
    START(s, "");
    int fd = gu_dial(s.port);
    LM_REQUIRE(fd >= 0);
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4000,\"stream\":true,"
                       "\"logit_bias\":{\"2\":-100,\"0\":-100}}";
    LM_REQUIRE(gu_send(fd, "POST", "/v1/chat/completions", body, NULL) == 0);
    char buf[4096];
    ssize_t got = recv(fd, buf, sizeof buf, 0); /* headers and the first chunks */
    LM_CHECK(got > 0);
    close(fd);
    double gone = 0, running = 1;
    for (int i = 0; i < 200 && (gone < 1 || running != 0); i++) {
        gu_msleep(25);
        gone = gu_metric(s.port, "lumen_client_disconnects_total");
        running = gu_metric(s.port, "lumen_requests_running");
    }
    LM_CHECK_MSG(gone == 1 && running == 0, "disconnects %g running %g", gone, running);
    /* That the hang-up stops the engine's steps (not only the stream) is
     * guard_disconnect_* in test_guard_server.c. */
    resp r;
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":3}",
                    NULL, &r) == 0);
    LM_CHECK(r.status == 200);
    gu_resp_free(&r);
    GU_STOP(s);
}

LM_TEST(server_http_slow_client_dropped) {
    server s;
    START(s, "--timeout 1");
    int fd = gu_dial(s.port);
    LM_REQUIRE(fd >= 0);
    const char *partial = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"mess";
    LM_REQUIRE(gu_send_all(fd, partial, strlen(partial)) == 0);
    struct pollfd p = { .fd = fd, .events = POLLIN };
    int r = poll(&p, 1, 5000); /* the server must close within ~1 s, not wait forever */
    char buf[256];
    LM_CHECK(r == 1 && recv(fd, buf, sizeof buf, 0) <= 0);
    close(fd);
    resp rr;
    LM_REQUIRE(gu_http(s.port, "GET", "/health", NULL, NULL, &rr) == 0);
    LM_CHECK(rr.status == 200);
    gu_resp_free(&rr);
    GU_STOP(s);
}

typedef struct worker {
    int port, ok;
} worker;

static void *stream_worker(void *arg) {
    worker *w = arg;
    resp r;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":16,\"stream\":true,"
                       "\"logit_bias\":{\"2\":-100}}";
    if (gu_http(w->port, "POST", "/v1/chat/completions", body, NULL, &r) == 0 && r.status == 200) {
        int nc, nd;
        char fin[32] = "";
        char *t = sse_text(&r, &nc, &nd, NULL, fin, sizeof fin);
        w->ok = nd == 1 && !strcmp(fin, "length");
        free(t);
    }
    gu_resp_free(&r);
    return NULL;
}

LM_TEST(server_http_concurrent_streams_and_shutdown) {
    server s;
    START(s, "--parallel 4");
    enum { N = 24 };
    pthread_t th[N];
    worker w[N];
    for (int i = 0; i < N; i++) {
        w[i] = (worker){ s.port, 0 };
        pthread_create(&th[i], NULL, stream_worker, &w[i]);
    }
    int ok = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        ok += w[i].ok;
    }
    LM_CHECK_MSG(ok == N, "%d of %d streams completed", ok, N);
    if (ok != N) gu_server_dump_log(&s);
    /* SIGTERM with a long stream in flight: it is ended and the process exits cleanly */
    int fd = gu_dial(s.port);
    LM_REQUIRE(fd >= 0);
    LM_REQUIRE(gu_send(fd, "POST", "/v1/completions",
                            "{\"prompt\":\"x\",\"max_tokens\":4000,\"stream\":true,\"logit_bias\":{\"2\":-100}}", NULL) == 0);
    char buf[512];
    LM_CHECK(recv(fd, buf, sizeof buf, 0) > 0);
    GU_STOP(s);
    close(fd);
}

/* One greedy chat stream: its text and finish reason. */
typedef struct la_worker {
    int port;
    char body[512];
    char *text;
    char finish[32];
} la_worker;

static void *la_stream(void *arg) {
    la_worker *w = arg;
    resp r;
    w->text = NULL;
    w->finish[0] = 0;
    if (gu_http(w->port, "POST", "/v1/chat/completions", w->body, NULL, &r) == 0 && r.status == 200) {
        int nc, nd;
        w->text = sse_text(&r, &nc, &nd, NULL, w->finish, sizeof w->finish);
    }
    gu_resp_free(&r);
    return NULL;
}

/* Greedy streams through a server with the look-ahead on give the text and
 * finish reason they get with it off: six at once (limits of 3 to 30
 * tokens, four running, two waiting), then a stop string taken from the
 * middle of one answer (the server cancels the request there, which the
 * look-ahead must survive). The look-ahead counter says it ran. */
LM_TEST(server_http_look_ahead_same_text) {
    enum { N = 6 };
    static const char *prompts[N] = { "Hi", "Hello there", "Tell me a story", "What is 2+2?", "Name a colour", "Bye" };
    static const int limits[N] = { 3, 8, 17, 30, 30, 24 };
    char *texts[2][N + 1] = { { 0 } }, fin[2][N + 1][32];
    double ahead[2] = { -1, -1 };
    char stop[8] = "";
    for (int mode = 0; mode < 2; mode++) {
        server s;
        START(s, mode ? "--parallel 4 --look-ahead on" : "--parallel 4 --look-ahead off");
        pthread_t th[N];
        la_worker w[N + 1];
        for (int i = 0; i < N; i++) {
            w[i].port = s.port;
            snprintf(w[i].body, sizeof w[i].body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"temperature\":0,\"max_tokens\":%d,"
                     "\"stream\":true}", prompts[i], limits[i]);
            pthread_create(&th[i], NULL, la_stream, &w[i]);
        }
        for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
        if (mode == 0 && w[3].text && strlen(w[3].text) >= 8) memcpy(stop, w[3].text + strlen(w[3].text) / 2, 3);
        w[N].port = s.port;
        snprintf(w[N].body, sizeof w[N].body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"temperature\":0,\"max_tokens\":30,"
                 "\"stream\":true,\"stop\":\"%s\"}", prompts[3], stop);
        la_stream(&w[N]);
        for (int i = 0; i <= N; i++) {
            texts[mode][i] = w[i].text;
            memcpy(fin[mode][i], w[i].finish, sizeof fin[mode][i]);
        }
        ahead[mode] = gu_metric(s.port, "lumen_engine_look_ahead_steps_total");
        GU_STOP(s);
    }
    for (int i = 0; i <= N; i++) {
        LM_CHECK_MSG(texts[0][i] && texts[1][i] && !strcmp(texts[0][i], texts[1][i]),
                     "request %d: '%s' with the look-ahead, '%s' without", i, texts[1][i] ? texts[1][i] : "(none)",
                     texts[0][i] ? texts[0][i] : "(none)");
        LM_CHECK_MSG(!strcmp(fin[0][i], fin[1][i]), "request %d: finish %s vs %s", i, fin[1][i], fin[0][i]);
        free(texts[0][i]), free(texts[1][i]);
    }
    LM_CHECK(stop[0] != 0 && !strcmp(fin[1][N], "stop"));
    printf("  look-ahead steps: %.0f with --look-ahead on, %.0f with off\n", ahead[1], ahead[0]);
    LM_CHECK(ahead[0] == 0 && ahead[1] > 0);
}

LM_TEST(server_http_queue_full_is_503) {
    server s;
    START(s, "--parallel 1 --max-queue 1");
    /* six long requests at once: one runs, one waits, the others find the queue full */
    enum { N = 6 };
    const char *body = "{\"prompt\":\"x\",\"max_tokens\":4000,\"logit_bias\":{\"2\":-100}}";
    int fd[N], n503 = 0, n200 = 0;
    for (int i = 0; i < N; i++) {
        fd[i] = gu_dial(s.port);
        LM_REQUIRE(fd[i] >= 0);
    }
    for (int i = 0; i < N; i++) LM_REQUIRE(gu_send(fd[i], "POST", "/v1/completions", body, NULL) == 0);
    for (int i = 0; i < N; i++) {
        resp r;
        if (gu_read(fd[i], &r) == 0) {
            n503 += r.status == 503 && strstr(r.body, "\"overloaded\"");
            n200 += r.status == 200;
            gu_resp_free(&r);
        }
        close(fd[i]);
    }
    LM_CHECK_MSG(n503 >= 1 && n200 >= 1 && n503 + n200 == N, "200: %d, 503: %d", n200, n503);
    GU_STOP(s);
}

/* ---- request ids, --trace, --cache-ram, the prefix cache ----------------------------------- */

/* The value of response header name (malloc'd), or NULL. */
static char *header(const resp *r, const char *name) {
    char key[128];
    snprintf(key, sizeof key, "\r\n%s: ", name);
    const char *p = strcasestr(r->headers, key);
    if (!p) return NULL;
    p += strlen(key);
    size_t n = strcspn(p, "\r\n");
    return strndup(p, n);
}

/* The trace lines of path as JSON objects (a line that does not parse is a
 * failed check); the one with id is returned in *found (borrowed from the array). */
static json_t *trace_lines(lm_test_ctx *lm_t_, const char *path) {
    json_t *all = json_array();
    char *text = lm_tu_read(path, NULL);
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        else next = line + strlen(line);
        json_error_t je;
        json_t *j = json_loads(line, JSON_ALLOW_NUL, &je);
        LM_CHECK_MSG(json_is_object(j), "trace line is not a JSON object (%s): %.200s", je.text, line);
        if (j) json_array_append_new(all, j);
    }
    free(text);
    return all;
}

static json_t *trace_find(json_t *lines, const char *id) {
    size_t i;
    json_t *j;
    json_array_foreach(lines, i, j) if (lm_streq(json_string_value(json_object_get(j, "id")) ?: "", id)) return j;
    return NULL;
}

LM_TEST(server_http_request_id_and_trace) {
    if (!lm_test_have_fixture("models/qwen3")) LM_SKIP("%s", lm_test_fixtures_why());
    char trace[600], extra[700];
    snprintf(trace, sizeof trace, "%s/trace-%d.jsonl", lm_test_tmpdir(), (int)getpid());
    unlink(trace);
    snprintf(extra, sizeof extra, "--trace '%s' --cache-ram 32M", trace);
    server s;
    START(s, extra);
    resp r;
    char *b = chat_body(",\"temperature\":0");
    /* the client's id, echoed */
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", b, "X-Request-Id: agent-7.turn:3_x\r\n", &r) == 0);
    char *h = header(&r, "X-Request-Id");
    LM_CHECK_MSG(r.status == 200 && h && !strcmp(h, "agent-7.turn:3_x"), "status %d id '%s'", r.status, h ?: "");
    free(h);
    gu_resp_free(&r);
    /* sanitised: only the safe characters survive, cut to 64 */
    char hdr[300];
    snprintf(hdr, sizeof hdr, "X-Request-Id: a b<c>\"d%%0a%s\r\n",
             "0123456789012345678901234567890123456789012345678901234567890123456789");
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", b, hdr, &r) == 0);
    h = header(&r, "X-Request-Id");
    LM_CHECK_MSG(h && strlen(h) == 64 && !strncmp(h, "abcd0a0123", 10), "sanitised id '%s'", h ?: "");
    free(h);
    gu_resp_free(&r);
    /* none sent: one is made, and a stream echoes it too */
    char *bs = chat_body(",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", bs, NULL, &r) == 0);
    char *made = header(&r, "X-Request-Id");
    LM_CHECK_MSG(made && !strncmp(made, "req-", 4) && strlen(made) == 28, "made id '%s'", made ?: "");
    gu_resp_free(&r);
    free(bs);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/completions", "{\"prompt\":\"The sky\",\"max_tokens\":3,\"temperature\":0}",
                    "X-Request-Id: cmpl-1\r\n", &r) == 0);
    LM_CHECK(r.status == 200);
    gu_resp_free(&r);
    /* a refused request is traced too, and the simple routes echo ids */
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":0}", "X-Request-Id: bad-1\r\n",
                    &r) == 0);
    LM_CHECK(r.status == 400);
    gu_resp_free(&r);
    LM_REQUIRE(gu_http(s.port, "GET", "/health", NULL, "X-Request-Id: hc\r\n", &r) == 0);
    h = header(&r, "X-Request-Id");
    LM_CHECK(h && !strcmp(h, "hc"));
    free(h);
    gu_resp_free(&r);
    /* /metrics: the prefix cache and batch series, next to the old ones */
    LM_REQUIRE(gu_http(s.port, "GET", "/metrics", NULL, NULL, &r) == 0);
    static const char *const k_series[] = {
        "\nlumen_prefix_cache_budget_bytes 33554432\n", "\nlumen_prefix_cache_hit_tokens_total ",
        "\nlumen_prefix_cache_lookup_tokens_total ", "\nlumen_prefix_cache_hit_ratio ", "\nlumen_prefix_cache_blocks ",
        "\nlumen_prefix_cache_bytes ", "\nlumen_prefix_cache_checkpoints ", "\nlumen_prefix_cache_evicted_blocks_total ",
        "\nlumen_prefix_cache_misses_total{reason=\"diverged\"} ", "\nlumen_prefix_cache_misses_total{reason=\"evicted\"} ",
        "\nlumen_prefix_cache_misses_total{reason=\"state\"} ", "# TYPE lumen_batch_size histogram\n",
        "\nlumen_batch_size_bucket{le=\"1\"} ", "\nlumen_batch_size_bucket{le=\"+Inf\"} ", "\nlumen_batch_size_count ",
        "\nlumen_queue_depth ", "\nlumen_requests_running ", "\nlumen_prompt_tokens_cached_total ",
        "# TYPE lumen_time_to_first_token_seconds histogram",
    };
    for (size_t i = 0; i < LM_COUNT_(k_series); i++)
        LM_CHECK_MSG(strstr(r.body, k_series[i]) != NULL, "/metrics lacks '%s'", k_series[i]);
    gu_resp_free(&r);
    GU_STOP(s);
    free(b);

    char *log = lm_tu_read(s.log, NULL);
    LM_CHECK_MSG(log && strstr(log, "id agent-7.turn:3_x\n"), "the access log names the id");
    free(log);
    json_t *lines = trace_lines(lm_t_, trace);
    LM_CHECK_MSG(json_array_size(lines) == 5, "%zu trace lines, want 5 (4 generations, 1 refused)",
                 json_array_size(lines));
    json_t *t = trace_find(lines, "agent-7.turn:3_x");
    LM_REQUIRE(t != NULL);
    LM_CHECK(lm_streq(json_string_value(json_object_get(t, "route")) ?: "", "/v1/chat/completions"));
    LM_CHECK(json_integer_value(json_object_get(t, "status")) == 200);
    LM_CHECK(lm_streq(json_string_value(json_object_get(t, "finish")) ?: "", "length"));
    LM_CHECK(json_integer_value(json_object_get(t, "n_prompt")) > 0);
    LM_CHECK(json_integer_value(json_object_get(t, "n_generated")) == 12);
    LM_CHECK(json_is_integer(json_object_get(t, "n_cached")));
    LM_CHECK(json_is_string(json_object_get(t, "ts")));
    json_t *ms = json_object_get(t, "ms");
    LM_CHECK(json_number_value(json_object_get(ms, "total")) > 0 && json_number_value(json_object_get(ms, "ttft")) > 0);
    LM_CHECK(json_is_number(json_object_get(ms, "queue")) && json_is_number(json_object_get(ms, "prefill")) &&
             json_is_number(json_object_get(ms, "decode")));
    if (json_is_true(json_object_get(t, "engine_trace"))) { /* the engine's spans and cache facts */
        LM_CHECK(json_is_number(json_object_get(ms, "cache_lookup")) && json_is_number(json_object_get(ms, "cache_restore")));
        LM_CHECK(json_integer_value(json_object_get(t, "prefill_chunks")) >= 1);
        json_t *d = json_object_get(t, "decode_steps");
        LM_CHECK(json_integer_value(json_object_get(d, "n")) == 11); /* 12 tokens: the first comes from prefill */
        LM_CHECK(json_integer_value(json_object_get(d, "min")) == 1 && json_array_size(json_object_get(d, "sizes")) == 11);
        LM_CHECK(json_is_string(json_object_get(json_object_get(t, "cache"), "miss")));
    }
    LM_CHECK(made && trace_find(lines, made) != NULL);
    json_t *bad = trace_find(lines, "bad-1");
    LM_CHECK(bad && json_integer_value(json_object_get(bad, "status")) == 400 &&
             strstr(json_string_value(json_object_get(bad, "error")) ?: "", "max_tokens"));
    LM_CHECK(trace_find(lines, "hc") == NULL); /* only generations are traced */
    json_decref(lines);
    free(made);
    unlink(trace);
}

LM_TEST(server_http_cache_ram_and_trace_flags) {
    if (!lm_test_have_fixture("models/qwen3")) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = lm_test_fixture_path("models/qwen3");
    static const char *const k_bad[] = { "1.5G", "-1", "G", "12X", "4GG", "", "99999999999T" };
    for (size_t i = 0; i < LM_COUNT_(k_bad); i++) {
        char cmd[1024], *err = NULL;
        snprintf(cmd, sizeof cmd, "'%s' serve -m '%s' --port 0 --cache-ram '%s'", lm_test_lumen_bin(), dir, k_bad[i]);
        int rc = lm_tu_run(cmd, NULL, &err);
        LM_CHECK_MSG(rc == 2 && err && strstr(err, "--cache-ram") && strstr(err, "is not a size"),
                     "--cache-ram '%s': exit %d, '%s'", k_bad[i], rc, err ?: "");
        free(err);
    }
    char cmd[1024], *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' serve -m '%s' --port 0 --trace /nonexistent-dir/x.jsonl", lm_test_lumen_bin(), dir);
    int rc = lm_tu_run(cmd, NULL, &err);
    LM_CHECK_MSG(rc == 1 && err && strstr(err, "--trace /nonexistent-dir/x.jsonl"), "exit %d, '%s'", rc, err ?: "");
    free(err);
    free(dir);
    static const struct { const char *arg; double bytes; } k_good[] = {
        { "--cache-ram 0", 0 }, { "--cache-ram 512M", 536870912.0 }, { "--cache-ram 1536KiB", 1572864.0 },
    };
    for (size_t i = 0; i < LM_COUNT_(k_good); i++) {
        server s;
        START(s, k_good[i].arg);
        double v = gu_metric(s.port, "lumen_prefix_cache_budget_bytes");
        LM_CHECK_MSG(v == k_good[i].bytes, "%s: budget %g", k_good[i].arg, v);
        resp r;
        LM_REQUIRE(gu_http(s.port, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2}", NULL, &r) == 0);
        LM_CHECK(r.status == 200);
        gu_resp_free(&r);
        GU_STOP(s);
    }
    server s; /* the default: some budget, at most 1 GiB */
    START(s, "");
    double v = gu_metric(s.port, "lumen_prefix_cache_budget_bytes");
    LM_CHECK_MSG(v > 0 && v <= 1073741824.0, "default budget %g", v);
    GU_STOP(s);
}

/* The prefix cache seen from a client: a repeated greedy prompt reports
 * cached_tokens (plain, streamed, completions) and gives the same text; a
 * prompt that departs from an earlier one has its divergence named in the
 * trace, with the text on both sides. */
LM_TEST(server_http_prefix_cache_reuse_and_divergence) {
    if (!lm_test_have_fixture("models/qwen3")) LM_SKIP("%s", lm_test_fixtures_why());
    char trace[600], extra[700];
    snprintf(trace, sizeof trace, "%s/trace-cache-%d.jsonl", lm_test_tmpdir(), (int)getpid());
    unlink(trace);
    snprintf(extra, sizeof extra, "--trace '%s' --cache-ram 64M --parallel 2", trace);
    server s;
    START(s, extra);
    const char *msg = "You are a careful assistant. Answer in one short sentence, and never use lists. "
                      "The question follows after this long preamble, which exists only to span several "
                      "cache blocks of sixteen tokens each: what colour is the sky on a clear day?";
    json_t *req = json_pack("{s:[{s:s,s:s}],s:i,s:f,s:{s:i}}", "messages", "role", "user", "content", msg, "max_tokens", 16,
                            "temperature", 0.0, "logit_bias", "2", -100);
    char *body = json_dumps(req, 0);
    resp r;
    char *texts[2];
    long cached[2];
    for (int i = 0; i < 2; i++) {
        LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", body, NULL, &r) == 0);
        LM_CHECK(r.status == 200);
        texts[i] = chat_text(&r);
        json_t *j = body_json(&r);
        cached[i] = (long)json_integer_value(
            json_object_get(json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens"));
        json_decref(j);
        gu_resp_free(&r);
    }
    /* the cache exists: a counter stuck at 0 is a failure, not a skip */
    double looked_up = gu_metric(s.port, "lumen_prefix_cache_lookup_tokens_total");
    LM_CHECK_MSG(looked_up > 0, "lumen_prefix_cache_lookup_tokens_total is %g after two requests", looked_up);
    LM_CHECK_MSG(cached[0] == 0 && cached[1] > 0, "cached_tokens %ld then %ld", cached[0], cached[1]);
    LM_CHECK_MSG(!strcmp(texts[0], texts[1]), "greedy text changed with the cache: '%s' vs '%s'", texts[0], texts[1]);
    /* streamed: the usage chunk reports it too */
    json_object_set_new(req, "stream", json_true());
    json_object_set_new(req, "stream_options", json_pack("{s:b}", "include_usage", 1));
    free(body);
    body = json_dumps(req, 0);
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions", body, NULL, &r) == 0);
    int nc, nd;
    json_t *usage = NULL;
    char fin[32] = "";
    char *st = sse_text(&r, &nc, &nd, &usage, fin, sizeof fin);
    LM_CHECK_MSG(!strcmp(st, texts[0]), "streamed '%s' vs '%s'", st, texts[0]);
    LM_CHECK(json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens")) > 0);
    json_decref(usage);
    free(st);
    gu_resp_free(&r);
    for (int i = 0; i < 2; i++) free(texts[i]);
    /* completions: a prompt, the same again, then one that departs in its last words */
    const char *common = "def parse_config(path):\n    \"\"\"Read the file at path and return its settings as a "
                         "dictionary of strings; blank lines and comments are skipped.\"\"\"\n    settings = {}\n";
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s    with open(path) as f: # Alpha version reads everything", common);
    snprintf(pb, sizeof pb, "%s    for line in Omega(path).splitlines():", common);
    const char *ids[3] = { "cmpl-a", "cmpl-a2", "cmpl-b" };
    const char *prompts[3] = { pa, pa, pb };
    long ccached[3];
    for (int i = 0; i < 3; i++) {
        json_t *cj = json_pack("{s:s,s:i,s:f}", "prompt", prompts[i], "max_tokens", 4, "temperature", 0.0);
        char *cb = json_dumps(cj, 0);
        char hdr[64];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", ids[i]);
        LM_REQUIRE(gu_http(s.port, "POST", "/v1/completions", cb, hdr, &r) == 0);
        LM_CHECK(r.status == 200);
        json_t *j = body_json(&r);
        ccached[i] = (long)json_integer_value(
            json_object_get(json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens"));
        json_decref(j);
        gu_resp_free(&r);
        free(cb);
        json_decref(cj);
    }
    LM_CHECK_MSG(ccached[1] > 0 && ccached[2] > 0, "completions cached_tokens: %ld %ld %ld", ccached[0], ccached[1],
                 ccached[2]);
    GU_STOP(s);
    free(body);
    json_decref(req);

    json_t *lines = trace_lines(lm_t_, trace);
    json_t *t = trace_find(lines, "cmpl-b");
    LM_REQUIRE(t != NULL);
    json_t *c = json_object_get(t, "cache");
    const char *miss = json_string_value(json_object_get(c, "miss")) ?: "";
    LM_CHECK_MSG(!strcmp(miss, "diverged"), "miss '%s' (trace: %s)", miss, json_dumps(t, JSON_COMPACT));
    long dp = (long)json_integer_value(json_object_get(c, "diverge_pos"));
    LM_CHECK_MSG(dp > 16 && dp >= ccached[2], "diverge_pos %ld, cached %ld", dp, ccached[2]);
    const char *p = json_string_value(json_object_get(c, "prompt")) ?: "";
    /* this prompt's side where the prompts differ ("for line in Omega"); the
     * earlier request's ("with open(path)") is another request's text: absent */
    char *line = json_dumps(t, JSON_COMPACT);
    LM_CHECK_MSG(strstr(p, "for") && !strstr(line, "with open") && !json_object_get(c, "prev"), "trace line %s", line);
    free(line);
    struct stat sb;
    LM_CHECK(stat(trace, &sb) == 0 && (sb.st_mode & 0777) == 0600); /* prompts are private */
    t = trace_find(lines, "cmpl-a2");
    LM_CHECK(t && json_integer_value(json_object_get(t, "n_cached")) == ccached[1]);
    json_decref(lines);
    unlink(trace);
}

/* A metric's value in a /metrics body (the first line naming it), -1 when absent. */
static double metric_value(const char *body, const char *name) {
    size_t n = strlen(name);
    for (const char *p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') return atof(p + n + 1);
    return -1;
}

static double metric_read(int port, const char *name) {
    resp r;
    if (gu_http(port, "GET", "/metrics", NULL, NULL, &r)) return -2;
    double v = metric_value(r.body ? r.body : "", name);
    gu_resp_free(&r);
    return v;
}

/* The engine publishes its counters after the step that answered: read
 * until two reads 20 ms apart agree. */
static double metric_now(int port, const char *name) {
    double v = metric_read(port, name);
    for (int i = 0; i < 50; i++) {
        struct timespec ts = { 0, 20000000 };
        nanosleep(&ts, NULL);
        double w = metric_read(port, name);
        if (w == v) break;
        v = w;
    }
    return v;
}

/* --spec lookup on the demo model: a completion that copies its prompt
 * speculates (the counters move) and gives the text of the same request
 * with "speculative": false (which moves no counter); a bad value is a 400. */
LM_TEST(server_http_speculation) {
    server s;
    if (gu_server_start(&s, LUMEN_SOURCE_DIR "/models/demo", "--threads 1 --spec lookup")) {
        gu_server_dump_log(&s);
        LM_REQUIRE(!"server started");
    }
    const char *code = "def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a - b\\n\\n\\n";
    char body[1024], *texts[2];
    for (int i = 0; i < 2; i++) {
        double before = metric_now(s.port, "lumen_spec_draft_tokens_total");
        snprintf(body, sizeof body, "{\"prompt\":\"%s%sdef add(a, b):\",\"max_tokens\":40,\"temperature\":0%s}", code,
                 code, i ? ",\"speculative\":false" : "");
        resp r;
        LM_REQUIRE(gu_http(s.port, "POST", "/v1/completions", body, NULL, &r) == 0);
        json_t *j = body_json(&r);
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        texts[i] = strdup(t ? t : "(none)");
        json_decref(j);
        gu_resp_free(&r);
        double after = metric_now(s.port, "lumen_spec_draft_tokens_total");
        LM_CHECK_MSG(i ? after == before : after > before, "request %d: draft tokens %g -> %g", i, before, after);
    }
    LM_CHECK_MSG(!strcmp(texts[0], texts[1]), "'%s' vs '%s'", texts[0], texts[1]);
    LM_CHECK(metric_now(s.port, "lumen_spec_verify_steps_total") > 0);
    free(texts[0]), free(texts[1]);
    expect_status(lm_t_, s.port, "/v1/completions", "{\"prompt\":\"x\",\"speculative\":\"no\"}", NULL, 400, NULL);
    /* the Anthropic route takes the same field; a greedy answer is the same with it off */
    const char *msg = "{\"model\":\"x\",\"max_tokens\":24,\"temperature\":0,\"messages\":[{\"role\":\"user\","
                      "\"content\":\"Write a Python function `sq`: Return x squared.\"}]%s}";
    char *ans[2];
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body, msg, i ? ",\"speculative\":false" : "");
        resp r;
        LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages", body, NULL, &r) == 0);
        LM_CHECK_MSG(r.status == 200, "%d: %s", r.status, r.body);
        ans[i] = strndup(r.body ? r.body : "", r.body_len);
        gu_resp_free(&r);
    }
    json_t *a0 = json_loads(ans[0], 0, NULL), *a1 = json_loads(ans[1], 0, NULL);
    LM_CHECK(a0 && a1 && json_equal(json_object_get(a0, "content"), json_object_get(a1, "content")));
    json_decref(a0), json_decref(a1), free(ans[0]), free(ans[1]);
    snprintf(body, sizeof body, msg, ",\"speculative\":1");
    resp r;
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/messages", body, NULL, &r) == 0);
    LM_CHECK_MSG(r.status == 400, "%d: %s", r.status, r.body);
    gu_resp_free(&r);
    GU_STOP(s);
}
