/* server_internal.h - the pieces of the HTTP server shared between its files
 * (not public).
 *
 * A request goes through these stages, each in its own file:
 *
 *   server.c           HTTP: routing, auth, body limits, connection threads,
 *                      waiting for tokens, SSE via a blocking content reader
 *   openai_request.c   JSON body -> srv_req (validated, with lm_gen_params);
 *                      a chat request's prompt through the chat template
 *                      (chat/lm_chat.h)
 *   route_table.c      every endpoint: path, method, handler, metric name;
 *                      the small endpoints (health, models, metrics)
 *   generate.c         the generation endpoints: build the prompt, submit,
 *                      wait, answer
 *   embeddings.c       /v1/embeddings: inputs -> embedding requests -> vectors
 *   tokenize.c         /tokenize and /detokenize (llama-server's shapes)
 *   output.c           token events -> text -> stop/reasoning/tool parsers
 *                      (chat/lm_parse.h) ->
 *                      OpenAI deltas (srv_out); pure, tested without HTTP
 *   openai_stream.c    the JSON objects OpenAI sends (chunks, responses,
 *                      errors) and SSE framing
 *   anthropic_request.c an Anthropic Messages body -> srv_req (the same
 *                      chat request, translated)
 *   anthropic_stream.c Anthropic's message, events and errors, written
 *                      through an srv_out sink; anthropic.c its srv_api
 *   responses_request.c  POST /v1/responses: its body (input items, flat
 *                      tools, reasoning ...) -> a chat srv_req
 *   responses_stream.c the Responses API's output items and typed SSE
 *                      events, written through an srv_out sink
 *   responses_store.c  stored responses for previous_response_id (LRU)
 *   metrics.c          counters and histograms, Prometheus text
 *   trace.c            request ids (X-Request-Id) and the --trace JSON lines
 *   http_guard.c       strict framing, the Host/Origin allow-list, log-safe text
 *   deadlines.c        header and body deadlines (the reaper thread)
 *   web_page.c         GET / : the chat page of web/, compiled in (web_assets.h)
 */
#ifndef LM_SERVER_INTERNAL_H
#define LM_SERVER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <microhttpd.h>

#include "../chat/lm_chat.h"
#include "../engine/lm_engine.h"
#include "../tokenizer/lm_tokenizer.h"
#include "lm_server.h"

/* ---- errors -------------------------------------------------------------------- */

/* An OpenAI error: {"error": {"message", "type", "param", "code"}} with an
 * HTTP status. */
typedef struct srv_err {
    int status;           /* 400, 401, 404, 413, 500, 503 ... */
    const char *type;     /* "invalid_request_error", "server_error" ... */
    const char *code;     /* NULL or e.g. "model_not_found", "context_length_exceeded" */
    char param[64];       /* "" = null */
    char msg[LM_ERR_MAX];
} srv_err;

/* Fills e and returns -1. param and code may be NULL. */
int srv_fail(srv_err *e, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* "an object", "an array", "a string", ... for an error message (openai_request.c). */
const char *srv_json_type_name(const json_t *v);
/* 503 shutting_down: a request refused, or cancelled, because the server
 * is stopping (its clients may retry elsewhere or later). */
int srv_shutdown_error(srv_err *e);
/* 400 invalid_request_error. */
#define srv_bad(e, param, ...) srv_fail((e), 400, "invalid_request_error", NULL, (param), __VA_ARGS__)
/* {"error": {...}} (new reference). */
json_t *srv_error_json(const srv_err *e);

/* ---- metrics (metrics.c) -------------------------------------------------------- */

/* Entries of srv_routes (route_table.c); requests are counted by entry. */
#define SRV_N_ROUTES 13

#define SRV_HIST_BUCKETS 16

typedef struct srv_hist {
    double bounds[SRV_HIST_BUCKETS];     /* upper bounds, seconds; +Inf implied */
    int n_bounds;
    uint64_t counts[SRV_HIST_BUCKETS + 1];
    uint64_t total;
    double sum;
} srv_hist;

typedef struct srv_metrics {
    pthread_mutex_t mu;                  /* guards everything below */
    uint64_t requests[SRV_N_ROUTES][6];  /* by status class: 2xx, 400, 401, 404, other 4xx, 5xx */
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    uint64_t cancelled, disconnects;
    srv_hist ttft, duration, queue, per_token;
    int connections;                     /* open HTTP connections */
    int streams;                         /* running SSE streams */
    size_t cache_ram;                    /* the prefix cache's budget (set once at start) */
    uint64_t grammar_compiles, grammar_hits; /* structured output: compiled, found in the cache */
    double grammar_compile_s;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_free(srv_metrics *m);
/* route: an index into srv_routes. */
void srv_metrics_request(srv_metrics *m, int route, int status);
void srv_metrics_observe(srv_hist *h, srv_metrics *m, double v);
/* Prometheus text exposition (malloc'd). */
char *srv_metrics_text(srv_metrics *m, lm_engine *en);

/* ---- the server ------------------------------------------------------------------- */

typedef struct srv_job srv_job;

typedef struct srv {
    lm_server_opts opts;
    lm_model *model;
    lm_tokenizer *tok;
    lm_chat *chat;             /* NULL when the model has no usable chat template */
    bool chat_tools;           /* the chat template mentions tools (/v1/models capabilities) */
    lm_engine *en;
    char *model_name;
    int64_t created;           /* server start, epoch seconds */
    int ctx;                   /* tokens per sequence */
    int n_vocab;               /* ids the model can produce */
    int32_t stop_ids[2 * LM_MAX_EOS + 1];  /* tokenizer eos + generation_config eos */
    int n_stop_ids;
    uint8_t *hidden;           /* [n_vocab] 1: a special token whose text is never shown */
    char fingerprint[32];
    srv_metrics metrics;
    pthread_mutex_t jobs_mu;   /* guards the job list and shutting_down */
    srv_job *jobs;             /* requests in the engine (for shutdown) */
    bool shutting_down;
    atomic_bool draining;      /* SIGTERM taken: new generations get 503 */
    atomic_uint_fast64_t id_counter;
    char *debug_call_name;     /* --debug-tool-call: the function, or NULL */
    json_t *debug_call_args;   /* --debug-tool-call: its arguments (an object) */
    FILE *trace;               /* --trace: one JSON line per generation; NULL = off */
    bool trace_owned;          /* trace is a file we opened (not stderr) */
    pthread_mutex_t trace_mu;  /* one line at a time */
    bool trace_mu_init;
    uint64_t trace_lost;       /* lines that could not be written (under trace_mu) */
    struct srv_resp_store *resp_store; /* /v1/responses with store: true; NULL = none kept */
    bool check_host;           /* Host/Origin allow-list on (loopback bind or --allow-host) */
    /* open sockets and where each is in its request (deadlines.c) */
    pthread_mutex_t socks_mu;
    struct srv_sock *socks;
    int n_socks;
    pthread_t reaper;
    pthread_cond_t reaper_cv;
    bool reaper_on, reaper_stop;
    lm_grammar_vocab *gvocab;  /* the vocabulary as grammars see it (constrain.c) */
    struct srv_grammars *grammars; /* compiled grammars by source (constrain.c) */
} srv;

/* Fills the text side of s from a tokenizer: stop ids (the tokenizer's eos
 * plus eos_ids), hidden special tokens, the chat template (lm_chat: think and
 * tool-call formats). Used by lm_server_run and by tests (without a model). */
void srv_init_text(srv *s, lm_tokenizer *tok, int n_vocab, const int *eos_ids, int n_eos);
void srv_free_text(srv *s);

/* ---- what a request must pass before it is routed (http_guard.c) ------------------------ */

/* in as one log-safe line into out: bytes outside printable ASCII, and the backslash,
 * as \xNN; cut to fit cap (>= 5). */
void srv_log_text(const char *in, char *out, size_t cap);
/* Whether a Host header value (a name or address, with an optional :port)
 * names loopback, the bound address or one of --allow-host's names. */
bool srv_host_allowed(const srv *s, const char *host, size_t len);
/* Strict framing (400/501), then with s->check_host the Host/Origin
 * allow-list (403) and a browser's Content-Type (415): 0, or -1 with e. */
int srv_http_check(const srv *s, struct MHD_Connection *c, const char *version, bool post, srv_err *e);

/* ---- deadlines for slow clients (deadlines.c) ------------------------------------------- */

/* One open socket: which stage its current request is in, since when. */
typedef enum srv_sock_stage { SRV_SOCK_HEADERS, SRV_SOCK_BODY, SRV_SOCK_ANSWER } srv_sock_stage;
typedef struct srv_sock {
    int fd;
    srv_sock_stage stage;
    double since;              /* lm_now() when the stage began */
    bool served;               /* a request was answered: now a kept-alive connection */
    struct srv_sock *next, *prev;
} srv_sock;

/* A socket opened / closed (MHD's connection notifications). */
srv_sock *srv_sock_open(srv *s, int fd);
void srv_sock_close(srv *s, srv_sock *k);
/* k's request moved to stage (k may be NULL). */
void srv_sock_stage_set(srv *s, srv_sock *k, srv_sock_stage stage);
/* The thread that shuts sockets past their deadline down. */
int srv_reaper_start(srv *s, lm_err *e);
void srv_reaper_stop(srv *s);
/* The sockets past their deadline at now, shut down; how many (the reaper's
 * step, for tests). */
int srv_reap(srv *s, double now);

/* ---- request ids and trace lines (trace.c) ------------------------------------------ */

#define SRV_RID_MAX 64

/* The request's id into out (cap > SRV_RID_MAX): the X-Request-Id header
 * value with characters other than A-Z a-z 0-9 . _ : - dropped and cut to
 * SRV_RID_MAX, or "req-" + 24 random characters when that leaves nothing
 * (header NULL, empty or all junk). */
void srv_request_id(const char *header, char *out, size_t cap);

/* What one trace line says about a finished generation. */
typedef struct srv_trace_rec {
    const char *id, *route, *finish;
    int status;
    const char *error;                       /* a request refused before the engine, else NULL */
    int n_prompt, n_cached, n_generated;
    double t_arrive, t_first, t_last, t_end; /* server clock (lm_now); t_first 0 = no token */
    double queue_s, prefill_s;               /* the final event's (used without tr) */
    const lm_request_trace *tr;              /* the engine's, or NULL */
    const int32_t *prompt;                   /* the prompt's ids (for the divergence text), or NULL */
    int n_prompt_ids;
} srv_trace_rec;

/* Opens path for appending ("-" = stderr, NULL = tracing off). */
int srv_trace_open(srv *s, const char *path, lm_err *e);
void srv_trace_close(srv *s);
/* The trace object (new reference): id, route, status, finish, token counts,
 * spans in ms, prefill chunks, decode-step batch sizes, cache miss details. */
json_t *srv_trace_json(const srv *s, const srv_trace_rec *r);
/* Appends the line to s->trace (no-op when tracing is off). */
void srv_trace_write(srv *s, const srv_trace_rec *r);

/* ---- a parsed request (openai_request.c) -------------------------------------------- */

typedef enum srv_kind { SRV_CHAT, SRV_COMPLETION } srv_kind;
typedef enum srv_tool_choice { SRV_TOOLS_AUTO, SRV_TOOLS_NONE, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED } srv_tool_choice;

typedef struct srv_req {
    srv_kind kind;
    json_t *body;              /* owned */
    bool stream, include_usage;
    lm_gen_params gp;          /* stop_tokens point into the srv; logit_bias into bias */
    lm_logit_bias *bias;
    bool max_tokens_set;       /* else max_tokens = what the context leaves */
    const json_t *stop;        /* borrowed from body; NULL = none */
    /* chat */
    const json_t *messages;
    json_t *tools;             /* borrowed; NULL when absent, empty or tool_choice none */
    srv_tool_choice tool_choice;
    const char *tool_name;     /* SRV_TOOLS_NAMED, or the --debug-tool-call function */
    const json_t *tool_args;   /* --debug-tool-call applies: the whole call is prefilled */
    const json_t *template_kwargs; /* chat_template_kwargs object or NULL */
    /* completions */
    const char *prompt_text;   /* string prompt, or NULL */
    size_t prompt_len;
    int32_t *prompt_ids;       /* token-id prompt (owned), or NULL */
    int n_prompt_ids;
    bool echo;
    int n;                     /* choices (OpenAI's n), 1 .. SRV_MAX_CHOICES */
    /* Anthropic's Messages API (anthropic_request.c) */
    bool one_tool_call;        /* keep only the first tool call */
    bool omit_thinking;        /* thinking blocks without their text (display: omitted) */
    int n_prompt_tokens;       /* set by generate.c once the prompt is tokenized */
    lm_grammar *grammar;       /* owned: response_format or a forced call (constrain.c) */
} srv_req;

/* Most choices one request may ask for (n); each is a sequence in the engine. */
#define SRV_MAX_CHOICES 16

/* A request body as a JSON object (new reference; any valid JSON string,
 * U+0000 included), or NULL with a 400 in e. */
json_t *srv_json_body(const char *body, size_t len, srv_err *e);
/* --debug-tool-call NAME=JSON into s->debug_call_name and debug_call_args
 * (JSON must be an object). -1 with e set when spec is malformed. A chat
 * request that offers the tool NAME, leaves tool_choice auto or required and
 * ends with a user message is then answered with that call, prefilled whole
 * in the template's format (lm_chat.h): for driving agents end to end with a
 * model too small to choose tools. */
int srv_debug_call_parse(srv *s, const char *spec, lm_err *e);

/* Parses and validates a request body. kind picks the endpoint's schema.
 * On error fills e (status 400/404) and returns -1; srv_req_free is safe
 * either way. */
int srv_req_parse(const srv *s, srv_kind kind, const char *body, size_t len, srv_req *r, srv_err *e);
/* The same for a body already parsed (stolen, also on error): another API's
 * request translated into a chat or completions body. */
int srv_req_parse_json(const srv *s, srv_kind kind, json_t *body, srv_req *r, srv_err *e);
void srv_req_free(srv_req *r);

/* ---- structured output (constrain.c) ----------------------------------------------- */

/* The grammar vocabulary and cache of s (after the stop ids and hidden
 * tokens are known), and their end. */
void srv_constrain_init(srv *s);
void srv_constrain_free(srv *s);
/* response_format into r->grammar; a 400 for an unknown type or a schema /
 * grammar that cannot be honoured. */
int srv_parse_response_format(const srv *s, const json_t *rf, srv_req *r, srv_err *e);
/* After the prompt is rendered (p: NULL for completions): a forced tool
 * call's grammar, and r->gp set up for whichever grammar r has. */
int srv_constrain(const srv *s, srv_req *r, const lm_chat_prompt *p, srv_err *e);


/* A chat request as the chat layer takes it (pointers into r). */
lm_chat_req srv_chat_req(const srv_req *r);
/* The prompt of a chat request through the model's template; 400 errors
 * (no template, a render failure) name the messages. */
int srv_chat_render(const srv *s, const srv_req *r, lm_chat_prompt *p, srv_err *e);
/* Where p's messages end (p rendered from r): the engine's hint for hybrid
 * checkpoints (lm_chat_mark_messages). */
void srv_chat_marks(const srv *s, const srv_req *r, lm_chat_prompt *p);

/* ---- output (output.c) ------------------------------------------------------------------ */

typedef struct srv_out srv_out;

/* Where srv_out sends text when another API's shapes are wanted (the
 * Responses API: responses_stream.c): instead of chat chunks or the chat
 * answer, every delta that the parsers let out goes to these calls, in
 * order; end runs once after the final event, with the parsers flushed and
 * o->finish and the token counts set. Tool calls arrive whole (the parser
 * runs atomic), so a call cut by max_tokens comes back as content. */
typedef struct srv_out_sink {
    void (*reasoning)(srv_out *o, const char *s, size_t n);
    void (*content)(srv_out *o, const char *s, size_t n);
    void (*tool_calls)(srv_out *o, const lm_toolcall_out *t); /* t->calls only; its content went to content */
    void (*end)(srv_out *o);
} srv_out_sink;

/* Turns a request's token events into OpenAI output: SSE bytes (stream) or a
 * final response object (non-stream). */
struct srv_out {
    const srv *s;
    const srv_out_sink *sink;      /* NULL: chat/completions output */
    void *sink_user;               /* the sink's state */
    srv_kind kind;
    bool stream, include_usage;
    bool logprobs;
    int top_logprobs;
    char id[40];
    int64_t created;
    lm_detok *detok;
    lm_stop_matcher *stop;
    lm_reasoning_parser *reason;   /* chat with a thinking model, else NULL */
    lm_toolcall_parser *tools;     /* chat with tools, else NULL */
    lm_tok_str piece;              /* scratch: one token's text */
    /* what was produced (non-stream answer, and tests) */
    lm_tok_str content, reasoning;
    json_t *logprob_list;          /* chat: [{token, logprob, bytes, top_logprobs}] */
    json_t *lp_tokens, *lp_token_logprobs, *lp_top, *lp_offsets; /* completions form */
    size_t text_offset;
    json_t *pending_lp;            /* stream: entries not sent yet */
    /* state */
    bool role_sent;
    bool stopped;                  /* a stop string matched: cancel the request */
    bool done;                     /* the final event was processed */
    bool call_complete;            /* the prefill was a whole call: stop at the first event */
    lm_finish finish;
    char error[LM_ERR_MAX];        /* LM_FINISH_ERROR */
    int n_prompt, n_cached, n_generated, n_reasoning;
    int n_tool_calls;
    double queue_s, prefill_s;
    int stop_which;                /* the stop string that matched (index), when stopped */
    /* SSE bytes not yet handed to the connection */
    lm_tok_str sse;
    size_t sse_off;
    /* one of n > 1 choices: its index in choices[], and no_tail (the
     * stream's usage chunk and [DONE] come once, after every choice ended:
     * srv_out_tail) */
    int index;
    bool no_tail;
};

/* prompt_text/len: echoed first (completions, echo=true); may be NULL. */
int srv_out_init(srv_out *o, const srv *s, const srv_req *r, const lm_chat_prompt *chat,
                 const char *echo, size_t echo_len, srv_err *e);
/* A chat request whose output goes to sink (with sink_user) instead. */
int srv_out_init_sink(srv_out *o, const srv *s, const srv_req *r, const lm_chat_prompt *chat,
                      const srv_out_sink *sink, void *sink_user, srv_err *e);
/* Choice `index` of n_choices (n > 1: no stream tail, see srv_out_tail),
 * sharing the id and created time of `first` (choice 0's; NULL for it). */
int srv_out_init_choice(srv_out *o, const srv *s, const srv_req *r, const lm_chat_prompt *chat, const char *echo,
                        size_t echo_len, int index, int n_choices, const srv_out *first, srv_err *e);
void srv_out_free(srv_out *o);
/* Processes one event. Returns true when the request should be cancelled
 * (a stop string matched). */
bool srv_out_event(srv_out *o, const lm_token_event *ev);
/* The end of a stream of n choices into dst's SSE: the usage chunk of all
 * outs (when asked for) and [DONE]. */
void srv_out_tail(srv_out *dst, const srv_out *const *outs, int n);
/* The non-stream response object (new reference), after done. */
json_t *srv_out_response(srv_out *o);
/* finish_reason for the answer: "stop", "length", "tool_calls". */
const char *srv_out_finish_reason(const srv_out *o);

/* ---- the Anthropic Messages API (anthropic*.c) ------------------------------------------------ */

/* Parses and translates a /v1/messages body (counting: /v1/messages/count_tokens,
 * where max_tokens is optional and stream ignored). As srv_req_parse. */
int srv_anth_parse(const srv *s, const char *body, size_t len, bool counting, srv_req *r, srv_err *e);
/* The prompt tokens of a count_tokens body: 0, or -1 with e. */
int srv_anth_count_tokens(const srv *s, const char *body, size_t len, int *n, srv_err *e);
/* o set up for an Anthropic answer to r (srv_out_init_sink with the
 * Anthropic sink and its state; a stream's message_start written); the
 * state is freed by srv_anth_out_done, before srv_out_free. */
int srv_anth_out_init(srv_out *o, const srv *s, const srv_req *r, const lm_chat_prompt *p, srv_err *e);
void srv_anth_out_done(srv_out *o);
/* The whole message (new reference), after the final event. */
json_t *srv_anth_message(const srv_out *o);
/* end_turn, max_tokens, stop_sequence or tool_use. */
const char *srv_anth_stop_reason(const srv_out *o);
/* POST /v1/messages on generate.c (anthropic.c). */
extern const struct srv_api srv_anth_api;
/* Anthropic's error type for an HTTP status ("invalid_request_error" ...). */
const char *srv_anth_error_type(int status);
/* {"type": "error", "error": {"type", "message"}} (new reference). */
json_t *srv_anth_error_json(const srv_err *e);

/* ---- HTTP (server.c, route_table.c, generate.c) -------------------------------------------- */

/* One HTTP request (MHD's con_cls). */
typedef struct srv_conn {
    int route;             /* index into srv_routes */
    char method[16];
    char url[128];
    char *body;
    size_t body_len, body_cap;
    int status;            /* set once a response is queued */
    srv_sock *sock;        /* the socket's deadline entry, or NULL */
    bool too_big;          /* a chunked body past max_body: read, dropped, answered 413 */
    size_t dropped;        /* bytes of it dropped */
    bool close_after;      /* answered before the whole body was read: close the connection */
    bool job_logged;       /* a generation job logs and counts the request itself */
    double t0;
    char rid[SRV_RID_MAX + 8]; /* the request id (X-Request-Id) */
} srv_conn;

/* One choice of a generation (n > 1 gives several): its own sequence in the
 * engine and its own output pipeline. */
typedef struct srv_choice {
    srv_job *job;
    int index;
    lm_request *req;
    srv_out out;
    char err[LM_ERR_MAX];      /* copy of its final event's error text (under job->mu) */
} srv_choice;

/* An engine event in the job's mailbox, with the choice it belongs to. */
typedef struct srv_job_ev {
    lm_token_event ev;
    int choice;
} srv_job_ev;

/* A generation in the engine: the mailbox the engine callback fills, the
 * output pipelines, and what the connection waits on. */
struct srv_job {
    srv *s;
    int route;
    char method[16], url[128];
    pthread_mutex_t mu;        /* guards q, qn, the choices' err, t_first */
    srv_job_ev *q;             /* events not processed yet */
    size_t qn, qcap;
    srv_job_ev *work;          /* events being processed (connection thread only) */
    size_t wcap;
    int efd;                   /* eventfd: the callback signals new events */
    int fd;                    /* the client's socket */
    srv_req r;
    lm_chat_prompt prompt;
    int n_ch;                  /* choices: r.n */
    srv_choice *ch;            /* [n_ch]; ch[0].out holds the id and the usage totals' prompt */
    bool tail_sent;            /* n > 1 stream: the shared usage chunk and [DONE] */
    char rid[SRV_RID_MAX + 8];
    /* --trace: the engine's trace copied from the final event (its step
     * sizes into steps), and the prompt's ids */
    lm_request_trace trace;
    bool has_trace;
    int32_t *steps;
    int32_t *ids;
    int n_ids;
    bool in_list;
    bool gone;                 /* the client disconnected */
    bool half_closed;          /* a stream's client ended its data (shutdown(SHUT_WR)) */
    bool streaming;
    int status;
    double t0, t_first, t_last;
    srv_job *next, *prev;
    const struct srv_api *api; /* NULL: chat/completions */
    void *api_state;           /* the api's, freed by its finish */
};

/* An API whose request and answer have other shapes than chat completions'
 * (the Responses API, responses.c): it makes the job's chat request from the
 * body and writes the output through an srv_out sink; generate.c does the
 * rest (prompt, engine, waiting, streaming) as for chat, with exactly one
 * choice (these APIs have no n): its output is j->ch[0].out. */
typedef struct srv_api {
    const char *what;   /* the request field that holds the conversation ("input") */
    /* the body -> j->r (a chat request) and j->api_state; -1 fills e */
    int (*parse)(srv_job *j, const char *body, size_t len, srv_err *e);
    /* j->ch[0].out set up (srv_out_init_sink) once the prompt j->prompt is rendered */
    int (*start)(srv_job *j, srv_err *e);
    /* the non-stream answer (new reference), after the final event */
    json_t *(*response)(srv_job *j);
    /* the job ends, answered or not: keep what is kept, free api_state */
    void (*finish)(srv_job *j);
} srv_api;

/* Queues a response (body is freed), sets cc->status. */
enum MHD_Result srv_respond_text(srv_conn *cc, struct MHD_Connection *c, int status, char *body, size_t len,
                                 const char *type);
enum MHD_Result srv_respond_json(srv_conn *cc, struct MHD_Connection *c, int status, json_t *j);
enum MHD_Result srv_respond_error(srv_conn *cc, struct MHD_Connection *c, const srv_err *e);
/* POST /v1/chat/completions and /v1/completions (generate.c). */
enum MHD_Result srv_handle_generate(srv *s, struct MHD_Connection *c, srv_conn *cc, srv_kind kind);
/* A generation endpoint of another API (generate.c). */
enum MHD_Result srv_handle_api(srv *s, struct MHD_Connection *c, srv_conn *cc, const srv_api *api);
/* Cancels every choice of j in the engine (shutdown; any thread). */
void srv_job_cancel(srv_job *j);
/* POST /v1/embeddings (embeddings.c). */
enum MHD_Result srv_handle_embeddings(srv *s, struct MHD_Connection *c, srv_conn *cc);
/* POST /tokenize and /detokenize (tokenize.c). */
enum MHD_Result srv_handle_tokenize(srv *s, struct MHD_Connection *c, srv_conn *cc);
enum MHD_Result srv_handle_detokenize(srv *s, struct MHD_Connection *c, srv_conn *cc);
/* GET / and /assets/NAME: the chat page (web_page.c). */
enum MHD_Result srv_handle_page(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url);

/* ---- routes (route_table.c) ------------------------------------------------------------------ */

/* Answers a request whose body (if any) is in cc; url is the request's. */
typedef enum MHD_Result (*srv_handler)(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url);

typedef struct srv_route {
    const char *path;      /* NULL: the last entry, every other URL (404) */
    const char *alias;     /* the same endpoint under a second path, or NULL */
    bool subpaths;         /* path + "/..." too (/v1/models/ID) */
    bool post;             /* POST only; else GET (and HEAD) only */
    bool open;             /* answered without the API key */
    bool quiet;            /* no log line per request (probes, scrapes) */
    bool anthropic;        /* errors as Anthropic's bodies (srv_anth_error_json) */
    srv_handler handler;   /* NULL for the last entry */
    const char *metric;    /* route="..." in lumen_requests_total */
} srv_route;

extern const srv_route srv_routes[SRV_N_ROUTES];
/* The entry url goes to: an index into srv_routes, the last when none matches. */
int srv_route_of(const char *url);

/* ---- JSON and SSE (openai_stream.c) ---------------------------------------------------- */

/* "chatcmpl-..." / "cmpl-...": prefix + 24 random alphanumerics. */
void srv_make_id(char *out, size_t cap, const char *prefix);
/* An empty chunk skeleton {"id","object","created","model","system_fingerprint","choices":[]}. */
json_t *srv_chunk_base(const srv_out *o);
/* Appends "data: JSON\n\n" (compact) to o->sse; steals j. */
void srv_sse_put(srv_out *o, json_t *j);
/* "event: NAME\ndata: JSON\n\n" (the Responses API's typed events); steals j. */
void srv_sse_event(srv_out *o, const char *event, json_t *j);
void srv_sse_done(srv_out *o);
json_t *srv_usage_json(const srv_out *o);
/* The usage of n choices of one request (n > 1): the prompt once (from
 * outs[0]), completion and reasoning tokens summed. */
json_t *srv_usage_json_n(const srv_out *const *outs, int n);
/* Text of a token for logprobs (lossy UTF-8) into out. */
void srv_token_text(const srv *s, int32_t id, lm_tok_str *out);
/* {"token","logprob","bytes"[, "top_logprobs"]} for chat logprobs. */
json_t *srv_logprob_entry(const srv *s, int32_t id, float lp, lm_tok_str *scratch);
/* A JSON string of s; bytes that are not valid UTF-8 become '?'. */
json_t *srv_lossy_string(const char *s);
/* A compact dump of j (malloc'd), with a trailing newline when nl. */
char *srv_dump(const json_t *j, bool nl, size_t *len);

#endif
