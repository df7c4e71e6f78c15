/* lm_server.h - the OpenAI-compatible HTTP server (`lumen serve`).
 *
 * One model, one engine, one HTTP daemon (libmicrohttpd, a thread per
 * connection). Routes:
 *   POST /v1/chat/completions   chat template, reasoning, tool calls, n choices, SSE
 *   POST /v1/completions        raw prompt (text or token ids), SSE
 *   POST /v1/messages           Anthropic's Messages API (the chat path; SSE events)
 *   POST /v1/messages/count_tokens
 *   POST /v1/responses          the Responses API (Codex): input items, typed SSE
 *                               events, previous_response_id (responses.h)
 *   POST /v1/embeddings         vectors pooled as the model's files say (float or base64)
 *   POST /tokenize, /detokenize llama-server's shapes
 *   GET  /v1/models[/ID]        the one served model (context, capabilities, pooling)
 *   GET  /health                {"status": "ok"} (never needs the API key)
 *   GET  /metrics               Prometheus text
 *   GET  /                      the chat page (web/, built into the binary)
 * server_internal.h lists the files and how a request flows through them. */
#ifndef LM_SERVER_H
#define LM_SERVER_H

#include "../backend/lm_backend.h"
#include "../engine/lm_engine.h"
#include "../format/lm_source.h"
#include "../model/lm_model.h"

typedef struct lm_server_opts {
    const char *model_path;  /* Hugging Face folder or .gguf, as opened for lm_server_run */
    const char *alias;       /* name in /v1/models and responses; NULL: the path's basename */
    const char *host;        /* IP literal or name to bind; NULL: 127.0.0.1 */
    int port;                /* 0: any free port (the chosen one is printed) */
    const char *api_key;     /* NULL: no authentication */
    lm_engine_opts engine;   /* ctx, parallel, queue ... (0 = engine defaults) */
    size_t max_body;         /* bytes of a request body (0: 8 MiB) */
    int timeout_s;           /* idle seconds before a slow client is dropped (0: 30) */
    int max_connections;     /* open connections at once (0: 4096); more get 503 */
    int max_client_connections; /* open connections from one IP address (0: no cap) */
    int header_timeout_s;    /* seconds for a request's headers to arrive (0: 10) */
    int body_timeout_s;      /* seconds for a request's body to arrive (0: 60) */
    int shutdown_timeout_s;  /* SIGTERM: seconds to drain before exit (0: 30) */
    bool special_in_content; /* special-token text in messages and tools becomes control
                                tokens (unsafe; the default tokenizes it as text) */
    const char *allow_hosts; /* Host/Origin names allowed besides loopback's, comma-separated
                                ("*" = any); NULL: loopback names only, checked when bound there */
    bool log_requests;       /* one line per request on stderr */
    const char *trace_path;  /* append a JSON line per generation; "-" = stderr; NULL = off */
    const char *chat_template; /* template text replacing the model's own; NULL: the model's */
    const lm_load_progress *progress; /* told of the load and warm-up; NULL: nobody */
    lm_rope_override rope;   /* --rope-* over the model's RoPE scaling (zeroes: the model's) */
    const char *debug_tool_call; /* "NAME=JSON": answer a user's turn that offers the tool NAME
                                    with that call (srv_debug_call_parse); NULL = off */
} lm_server_opts;

/* Loads the model and its tokenizer from model (o->model_path opened once,
 * format/lm_source.h; not owned) onto be (not owned), starts the engine and
 * the HTTP daemon, prints "lumen: serving NAME on http://HOST:PORT" on
 * stderr, and serves until SIGINT or SIGTERM; then stops accepting, lets
 * running requests finish for up to shutdown_timeout_s, ends the rest with
 * an error each client can read, and frees everything (a second signal
 * skips the wait). Returns 0, or -1 with e set when startup fails. */
int lm_server_run(const lm_server_opts *o, lm_source *model, lm_backend *be, lm_err *e);

#endif
