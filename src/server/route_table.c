/* route_table.c - every HTTP endpoint of the server in one table, and the
 * handlers of the small ones.
 *
 * An entry says where a request goes (its path, an alias without /v1, or
 * the path's subpaths), what it needs (POST, or GET and HEAD; the API key
 * unless open), who answers it, whether it gets a log line, and its name in
 * lumen_requests_total. server.c dispatches and counts by an entry's index,
 * metrics.c prints the names in table order; the last entry catches every
 * other URL (404). The generation endpoints' handler is generate.c. */
#include <string.h>

#include "responses.h"
#include "server_internal.h"

/* ---- the small routes ------------------------------------------------------------------ */

/* 503 "draining" once SIGTERM is taken, so a load balancer stops sending
 * before the server goes (Envoy's drain does the same). */
static enum MHD_Result handle_health(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    bool draining = atomic_load(&s->draining);
    return srv_respond_json(cc, c, draining ? 503 : 200, json_pack("{s:s}", "status", draining ? "draining" : "ok"));
}

static json_t *model_object(const srv *s) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(s->model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(s->created));
    json_object_set_new(m, "owned_by", json_string("lumen"));
    json_object_set_new(m, "max_model_len", json_integer(s->ctx));
    if (!s->model) return m; /* tests without a model */
    /* metadata beyond OpenAI's (llama-server and vLLM give similar) */
    const lm_model *md = s->model;
    json_object_set_new(m, "context_length", json_integer(s->ctx));
    json_object_set_new(m, "architecture", json_string(md->cfg.model_type));
    int64_t n_params = 0;
    const char *dtype = NULL;
    lm_model_describe(md, &n_params, &dtype);
    json_object_set_new(m, "dtype", json_string(dtype));
    json_object_set_new(m, "parameters", json_integer(n_params));
    json_t *caps = json_array();
    json_array_append_new(caps, json_string("completion"));
    if (s->chat) json_array_append_new(caps, json_string("chat"));
    if (s->chat && s->chat_tools) json_array_append_new(caps, json_string("tools"));
    if (s->chat && s->chat->think) json_array_append_new(caps, json_string("reasoning"));
    const lm_pooling *pool = &md->pooling;
    if (pool->mode != LM_POOL_NONE) json_array_append_new(caps, json_string("embeddings"));
    json_object_set_new(m, "capabilities", caps);
    json_object_set_new(m, "embedding",
                        json_pack("{s:i, s:s, s:b, s:s}", "dimensions", md->cfg.d_model, "pooling",
                                  lm_pool_mode_name(pool->mode), "normalized", pool->normalize, "source",
                                  pool->source));
    return m;
}

static enum MHD_Result handle_models(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    const char *id = url + strlen("/v1/models");
    if (*id == '/' && id[1]) {
        if (strcmp(id + 1, s->model_name) != 0) {
            srv_err e;
            srv_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                     "The model '%.200s' does not exist.", id + 1);
            return srv_respond_error(cc, c, &e);
        }
        return srv_respond_json(cc, c, 200, model_object(s));
    }
    json_t *list = json_object();
    json_object_set_new(list, "object", json_string("list"));
    json_t *data = json_array();
    json_array_append_new(data, model_object(s));
    json_object_set_new(list, "data", data);
    return srv_respond_json(cc, c, 200, list);
}

static enum MHD_Result handle_metrics(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    char *text = srv_metrics_text(&s->metrics, s->en);
    return srv_respond_text(cc, c, 200, text, strlen(text), "text/plain; version=0.0.4; charset=utf-8");
}

static enum MHD_Result handle_chat(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    return srv_handle_generate(s, c, cc, SRV_CHAT);
}

static enum MHD_Result handle_completions(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    return srv_handle_generate(s, c, cc, SRV_COMPLETION);
}

static enum MHD_Result handle_responses(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    return srv_handle_api(s, c, cc, &srv_responses_api);
}

static enum MHD_Result handle_messages(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    return srv_handle_api(s, c, cc, &srv_anth_api);
}

static enum MHD_Result handle_count_tokens(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    srv_err e = { 0 };
    int n = 0;
    if (srv_anth_count_tokens(s, cc->body ? cc->body : "", cc->body_len, &n, &e)) return srv_respond_error(cc, c, &e);
    return srv_respond_json(cc, c, 200, json_pack("{s:i}", "input_tokens", n));
}

static enum MHD_Result handle_embeddings(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    return srv_handle_embeddings(s, c, cc);
}

static enum MHD_Result handle_tokenize(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    return srv_handle_tokenize(s, c, cc);
}

static enum MHD_Result handle_detokenize(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    return srv_handle_detokenize(s, c, cc);
}

/* ---- the table ------------------------------------------------------------------------- */

/* Unsized: the compiler holds the count to SRV_N_ROUTES in the header. */
const srv_route srv_routes[] = {
    { .path = "/v1/chat/completions", .alias = "/chat/completions", .post = true, .handler = handle_chat,
      .metric = "chat_completions" },
    { .path = "/v1/completions", .alias = "/completions", .post = true, .handler = handle_completions,
      .metric = "completions" },
    { .path = "/v1/responses", .alias = "/responses", .post = true, .handler = handle_responses,
      .metric = "responses" },
    { .path = "/v1/messages", .post = true, .anthropic = true, .handler = handle_messages, .metric = "messages" },
    { .path = "/v1/messages/count_tokens", .post = true, .anthropic = true, .handler = handle_count_tokens,
      .metric = "messages_count_tokens" },
    { .path = "/v1/embeddings", .alias = "/embeddings", .post = true, .handler = handle_embeddings,
      .metric = "embeddings" },
    { .path = "/tokenize", .alias = "/v1/tokenize", .post = true, .handler = handle_tokenize, .metric = "tokenize" },
    { .path = "/detokenize", .alias = "/v1/detokenize", .post = true, .handler = handle_detokenize,
      .metric = "detokenize" },
    { .path = "/v1/models", .subpaths = true, .handler = handle_models, .metric = "models" },
    { .path = "/health", .open = true, .quiet = true, .handler = handle_health, .metric = "health" },
    { .path = "/metrics", .quiet = true, .handler = handle_metrics, .metric = "metrics" },
    /* the chat page at / and its files under /assets/ (web_page.c) */
    { .path = "/assets", .alias = "/", .subpaths = true, .open = true, .quiet = true, .handler = srv_handle_page,
      .metric = "page" },
    { .metric = "other" }, /* any other URL: 404 */
};

int srv_route_of(const char *url) {
    int i = 0;
    for (; srv_routes[i].path; i++) {
        const srv_route *r = &srv_routes[i];
        size_t n = strlen(r->path);
        if (!strcmp(url, r->path) || (r->alias && !strcmp(url, r->alias)) ||
            (r->subpaths && !strncmp(url, r->path, n) && url[n] == '/'))
            return i;
    }
    return i;
}
