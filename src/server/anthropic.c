/* anthropic.c - POST /v1/messages on generate.c: the srv_api that ties the
 * request translation (anthropic_request.c) and the message and event
 * builder (anthropic_stream.c, an srv_out sink) to a generation job.
 * /v1/messages/count_tokens is a small route of route_table.c. An Anthropic
 * request has one choice: its output is j->ch[0].out. */
#include "server_internal.h"

static int anth_parse(srv_job *j, const char *body, size_t len, srv_err *e) {
    return srv_anth_parse(j->s, body, len, false, &j->r, e);
}

static int anth_start(srv_job *j, srv_err *e) { return srv_anth_out_init(&j->ch[0].out, j->s, &j->r, &j->prompt, e); }

static json_t *anth_response(srv_job *j) { return srv_anth_message(&j->ch[0].out); }

static void anth_finish(srv_job *j) { srv_anth_out_done(&j->ch[0].out); }

const srv_api srv_anth_api = {
    .what = "messages",
    .parse = anth_parse,
    .start = anth_start,
    .response = anth_response,
    .finish = anth_finish,
};
