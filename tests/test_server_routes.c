/* test_server_routes.c - the route table (src/server/route_table.c): where
 * each URL goes, and the entry names /metrics counts requests by. */
#include <string.h>

#include "lm_test.h"
#include "server/server_internal.h"

LM_TEST(server_route_table) {
    static const struct {
        const char *url, *metric;
    } k_urls[] = {
        { "/v1/chat/completions", "chat_completions" }, { "/chat/completions", "chat_completions" },
        { "/v1/completions", "completions" },           { "/completions", "completions" },
        { "/v1/responses", "responses" },               { "/responses", "responses" },
        { "/v1/models", "models" },                     { "/v1/models/", "models" },
        { "/v1/models/qwen3", "models" },               { "/health", "health" },
        { "/metrics", "metrics" },                      { "/v1/modelsx", "other" },
        { "/v1/messages", "messages" },                 { "/v1/messages/count_tokens", "messages_count_tokens" },
        { "/v1/messages/", "other" },                   { "/messages", "other" },
        { "/v1/chat/completions/", "other" },           { "/health/", "other" },
        { "/", "page" },                                { "/assets/chat.js", "page" },
        { "/index.html", "other" },                     { "", "other" },
        { "/v1/embeddings", "embeddings" },             { "/embeddings", "embeddings" },
        { "/tokenize", "tokenize" },                    { "/v1/tokenize", "tokenize" },
        { "/detokenize", "detokenize" },                { "/v1/detokenize", "detokenize" },
    };
    for (size_t i = 0; i < LM_COUNT(k_urls); i++) {
        int r = srv_route_of(k_urls[i].url);
        LM_CHECK_MSG(r >= 0 && r < SRV_N_ROUTES && lm_streq(srv_routes[r].metric, k_urls[i].metric), "%s -> %d",
                     k_urls[i].url, r);
    }
    /* the names /metrics prints, in order; only the last entry is the catch-all */
    static const char *const k_names[SRV_N_ROUTES] = { "chat_completions", "completions", "responses", "messages",
                                                       "messages_count_tokens", "embeddings", "tokenize",
                                                       "detokenize", "models", "health", "metrics", "page",
                                                       "other" };
    for (int r = 0; r < SRV_N_ROUTES; r++) {
        LM_CHECK(lm_streq(srv_routes[r].metric, k_names[r]));
        LM_CHECK((srv_routes[r].path == NULL) == (r == SRV_N_ROUTES - 1));
        LM_CHECK((srv_routes[r].handler == NULL) == (r == SRV_N_ROUTES - 1));
    }
    /* only generation, count_tokens, embeddings and (de)tokenize take POST;
     * only /health and the chat page are open without the API key */
    for (int r = 0; r < SRV_N_ROUTES - 1; r++) {
        LM_CHECK(srv_routes[r].post == (r < 8));
        LM_CHECK(srv_routes[r].anthropic == (r == 3 || r == 4)); /* Anthropic error bodies */
        LM_CHECK(srv_routes[r].open == (!strcmp(srv_routes[r].path, "/health") || !strcmp(srv_routes[r].metric, "page")));
    }
}
