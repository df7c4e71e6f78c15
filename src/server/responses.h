/* responses.h - the OpenAI Responses API (POST /v1/responses), as Codex and
 * the openai SDKs speak it, on the chat completions path.
 *
 * Design note
 * -----------
 * A Responses request is a chat request in other clothes: instructions and
 * input items become chat messages, flat function tools become chat tools,
 * reasoning.effort becomes the template's thinking switch. So the request is
 * translated into a chat completions body (responses_request.c) and parsed,
 * rendered, submitted and detokenized exactly as /v1/chat/completions is;
 * only the output differs: srv_out hands every parsed delta to a sink
 * (responses_stream.c) that builds the output items and the typed SSE
 * events (response.created ... response.completed), and the same builder
 * gives the non-stream response object, so the two cannot disagree.
 *
 *   body -> srv_resp_parse -> srv_resp_req (echo fields, conversation items)
 *                          -> srv_req (a chat request) -> generate.c
 *   token events -> srv_out -> srv_resp_sink -> events / response object
 *
 * previous_response_id: a response kept with store (the default) is held in
 * a bounded in-memory store (responses_store.c) as its conversation: the
 * input items it was given (after its own previous ones) and its output
 * items; a request naming it continues that list. Instructions are not
 * carried over, as in OpenAI's API. */
#ifndef LM_SERVER_RESPONSES_H
#define LM_SERVER_RESPONSES_H

#include "server_internal.h"

/* ---- the store (responses_store.c) ----------------------------------------------- */

/* Defaults for lumen serve: entries and bytes (of their JSON) kept. */
#define SRV_RESP_STORE_COUNT 512
#define SRV_RESP_STORE_BYTES ((size_t)64 << 20)

typedef struct srv_resp_store srv_resp_store;

srv_resp_store *srv_resp_store_create(int max_count, size_t max_bytes);
void srv_resp_store_free(srv_resp_store *st);
/* Keeps a copy of items (a JSON array) under id, replacing an entry of that
 * id; then drops least recently used entries while there are more than
 * max_count or their bytes pass max_bytes (an entry larger than max_bytes
 * is not kept at all). Thread-safe. */
void srv_resp_store_put(srv_resp_store *st, const char *id, const json_t *items);
/* A fresh copy of the items under id (new reference), or NULL; a hit makes
 * the entry the most recently used. */
json_t *srv_resp_store_get(srv_resp_store *st, const char *id);
/* Entries held, and their bytes into *bytes (may be NULL). */
int srv_resp_store_count(srv_resp_store *st, size_t *bytes);

/* ---- the request (responses_request.c) ------------------------------------------- */

typedef struct srv_resp_req {
    json_t *body;        /* the Responses body (owned) */
    json_t *items;       /* the conversation: the previous response's items, then
                            this request's input as items (owned) */
    json_t *echo;        /* the request fields a response object repeats (owned) */
    bool stream, store;
    bool summary;        /* reasoning.summary was asked for (any level) */
} srv_resp_req;

/* Parses and validates a Responses body, looks up previous_response_id in
 * s->resp_store (404 previous_response_not_found when it is not there),
 * translates it and parses the result as a chat request into r. On error
 * fills e (with the Responses field in e->param) and returns -1; free both
 * with srv_resp_req_free and srv_req_free either way. */
int srv_resp_parse(const srv *s, const char *body, size_t len, srv_resp_req *q, srv_req *r, srv_err *e);
void srv_resp_req_free(srv_resp_req *q);

/* ---- the output (responses_stream.c) --------------------------------------------- */

typedef struct srv_resp_build srv_resp_build;

/* The sink for srv_out_init_sink; its sink_user is an srv_resp_build. */
extern const srv_out_sink srv_resp_sink;

/* A builder for the answer to q (kept, not owned): id "resp_...", the
 * events go to the srv_out's SSE bytes when q->stream. */
srv_resp_build *srv_resp_build_create(const srv *s, const srv_resp_req *q);
void srv_resp_build_free(srv_resp_build *b);
/* Sends response.created and response.in_progress, once (the first delta
 * sends them when this was not called). o is the srv_out writing to b. */
void srv_resp_build_start(srv_resp_build *b, srv_out *o);
/* The response object (new reference): complete after the sink's end. */
json_t *srv_resp_build_response(srv_resp_build *b);
/* "completed", "incomplete" or "failed" after the end; NULL before. */
const char *srv_resp_build_status(const srv_resp_build *b);
const char *srv_resp_build_id(const srv_resp_build *b);
/* The output items so far (borrowed). */
const json_t *srv_resp_build_output(const srv_resp_build *b);

/* ---- the endpoint (responses.c) ---------------------------------------------------- */

/* POST /v1/responses for srv_handle_api. */
extern const srv_api srv_responses_api;

#endif
