/* responses.c - POST /v1/responses on generate.c: the srv_api that ties the
 * request translation (responses_request.c), the output builder
 * (responses_stream.c) and the store (responses_store.c) to a generation
 * job. See responses.h for the design. */
#include <stdlib.h>
#include <string.h>

#include "responses.h"

/* What a Responses job holds beside the chat request. */
typedef struct resp_job {
    srv_resp_req q;
    srv_resp_build *b;
} resp_job;

static int resp_parse(srv_job *j, const char *body, size_t len, srv_err *e) {
    resp_job *rj = lm_xcalloc(1, sizeof *rj);
    j->api_state = rj;
    return srv_resp_parse(j->s, body, len, &rj->q, &j->r, e);
}

static int resp_start(srv_job *j, srv_err *e) {
    resp_job *rj = j->api_state;
    rj->b = srv_resp_build_create(j->s, &rj->q);
    if (srv_out_init_sink(&j->ch[0].out, j->s, &j->r, &j->prompt, &srv_resp_sink, rj->b, e)) return -1;
    srv_resp_build_start(rj->b, &j->ch[0].out);
    return 0;
}

static json_t *resp_response(srv_job *j) {
    resp_job *rj = j->api_state;
    return srv_resp_build_response(rj->b);
}

/* A finished answer with store is kept as its conversation: the items it
 * was given and the items it produced. */
static void resp_finish(srv_job *j) {
    resp_job *rj = j->api_state;
    if (!rj) return;
    const char *status = rj->b ? srv_resp_build_status(rj->b) : NULL;
    if (status && strcmp(status, "failed") && rj->q.store && j->s->resp_store && !j->gone) {
        json_t *items = json_copy(rj->q.items);
        json_array_extend(items, (json_t *)srv_resp_build_output(rj->b));
        srv_resp_store_put(j->s->resp_store, srv_resp_build_id(rj->b), items);
        json_decref(items);
    }
    srv_resp_build_free(rj->b);
    srv_resp_req_free(&rj->q);
    free(rj);
    j->api_state = NULL;
}

const srv_api srv_responses_api = {
    .what = "input",
    .parse = resp_parse,
    .start = resp_start,
    .response = resp_response,
    .finish = resp_finish,
};
