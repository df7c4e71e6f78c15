/* fuzz_responses.c - libFuzzer harness for POST /v1/responses' request
 * parsing (server/responses_request.c) and its store.
 *
 * Design: the input is a request body, as a client sends it. It is parsed
 * and translated into a chat request against a server with no model (no
 * chat template, so nothing renders; the translation and the chat parser's
 * checks all run). A body that parses is stored under one id, so a later
 * input naming "previous_response_id": "resp_fuzz" chains onto it (the
 * seeds do). Checked promises (an abort is a finding): a refusal is a 400
 * or 404 with a message; an accepted body gives a chat request with at
 * least one message. ASan/UBSan/LSan report memory errors and leaks. */
#include "server/responses.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static srv *g_srv;

static srv *server(void) {
    if (g_srv) return g_srv;
    g_srv = lm_xcalloc(1, sizeof *g_srv);
    g_srv->model_name = lm_xstrdup("demo");
    g_srv->ctx = 4096;
    g_srv->n_vocab = 4096;
    g_srv->stop_ids[0] = 2;
    g_srv->n_stop_ids = 1;
    g_srv->resp_store = srv_resp_store_create(4, 1 << 16);
    return g_srv;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    srv *s = server();
    srv_resp_req q;
    srv_req r;
    srv_err e;
    memset(&e, 0, sizeof e);
    if (srv_resp_parse(s, (const char *)data, size, &q, &r, &e) == 0) {
        LM_ASSERT(r.kind == SRV_CHAT && json_array_size(r.messages) >= 1);
        LM_ASSERT(json_is_array(q.items) && json_is_object(q.echo));
        srv_resp_store_put(s->resp_store, "resp_fuzz", q.items);
    } else {
        LM_ASSERT((e.status == 400 || e.status == 404) && e.msg[0]);
    }
    srv_resp_req_free(&q);
    srv_req_free(&r);
    return 0;
}
