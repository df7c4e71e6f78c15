/* test_server_embeddings.c - /v1/embeddings, /tokenize, /detokenize, the
 * /v1/models metadata and U+0000 in request fields, through `lumen serve`
 * on the qwen3 fixture (last-token pooling, normalised: no
 * sentence-transformers files).
 *
 * The embedding of prompt0's ids must be transformers' (the reference's
 * last hidden state after the final norm, normalised) within 1e-5, as
 * floats and as base64; bad inputs get a 400 whose error names the param. */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat/lm_chat.h"
#include "format/safetensors.h"
#include "guard_util.h"
#include "lm_test.h"

static bool start(lm_test_ctx *lm_t_, gu_server *s, char **dir) {
    *dir = lm_test_fixture_path("models/qwen3");
    if (!*dir) return false;
    /* an f32 KV cache: the vectors are checked against f32 references to 1e-5 */
    if (gu_server_start(s, *dir, "--threads 1 --parallel 2 --max-queue 8 --kv-type f32")) {
        gu_server_dump_log(s);
        LM_CHECK(!"the server started");
        free(*dir);
        *dir = NULL;
        return false;
    }
    return true;
}

/* POST path body; the JSON answer (NULL on a transport failure), *status. */
static json_t *post(int port, const char *path, const char *body, int *status) {
    gu_resp r = { 0 };
    json_t *j = NULL;
    *status = -1;
    if (gu_http(port, "POST", path, body, NULL, &r) == 0) {
        *status = r.status;
        j = gu_json(&r);
    }
    gu_resp_free(&r);
    return j;
}

static const char *err_param(const json_t *j) {
    return json_string_value(json_object_get(json_object_get(j, "error"), "param"));
}

/* 4 * n bytes of standard base64 into floats (little-endian); count or -1. */
static int b64_floats(const char *s, float *out, int max) {
    static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char bytes[16384];
    size_t nb = 0, n = strlen(s);
    for (size_t i = 0; i + 4 <= n && nb + 3 <= sizeof bytes; i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int c = 0; c < 4; c++) {
            const char *p = s[i + c] == '=' ? NULL : strchr(k, s[i + c]);
            if (s[i + c] == '=') pad++;
            else if (!p) return -1;
            v = v << 6 | (p ? (uint32_t)(p - k) : 0);
        }
        bytes[nb++] = (unsigned char)(v >> 16);
        if (pad < 2) bytes[nb++] = (unsigned char)(v >> 8);
        if (pad < 1) bytes[nb++] = (unsigned char)v;
    }
    if (nb % 4 || (int)(nb / 4) > max) return -1;
    for (size_t i = 0; i < nb / 4; i++) {
        uint32_t u = bytes[4 * i] | bytes[4 * i + 1] << 8 | bytes[4 * i + 2] << 16 | (uint32_t)bytes[4 * i + 3] << 24;
        memcpy(&out[i], &u, 4);
    }
    return (int)(nb / 4);
}

LM_TEST(server_embeddings) {
    gu_server s;
    char *dir;
    if (!start(lm_t_, &s, &dir)) {
        if (!lm_t_->failed) LM_SKIP("%s", lm_test_fixtures_why());
        return;
    }
    /* the reference: prompt0's last hidden row, normalised */
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    lm_safetensors ref = { 0 };
    LM_REQUIRE(lm_safetensors_open(&ref, path, NULL) == 0);
    const lm_file_tensor *ids = lm_safetensors_find(&ref, "prompt0.ids"), *last = NULL;
    for (int l = 0; l < 64; l++) {
        snprintf(path, sizeof path, "prompt0.hidden.%d", l);
        if (lm_safetensors_find(&ref, path)) last = lm_safetensors_find(&ref, path);
    }
    LM_REQUIRE(ids && last && last->shape[1] == 64);
    const int T = (int)ids->shape[0], D = 64;
    float want[64];
    double ss = 0;
    for (int i = 0; i < D; i++) ss += pow(((const float *)last->data)[(T - 1) * D + i], 2);
    for (int i = 0; i < D; i++) want[i] = (float)(((const float *)last->data)[(T - 1) * D + i] / sqrt(ss));
    char body[4096], list[1024] = "[";
    for (int t = 0; t < T; t++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", t ? "," : "", ((const int32_t *)ids->data)[t]);
    strcat(list, "]");

    int st;
    snprintf(body, sizeof body, "{\"model\":\"qwen3\",\"input\":[%s,\"hello world\"],\"encoding_format\":\"float\"}", list);
    json_t *j = post(s.port, "/v1/embeddings", body, &st);
    LM_CHECK(st == 200);
    LM_CHECK(lm_streq(json_string_value(json_object_get(j, "object")), "list"));
    json_t *data = json_object_get(j, "data");
    LM_CHECK(json_array_size(data) == 2);
    json_t *e0 = json_object_get(json_array_get(data, 0), "embedding");
    LM_CHECK(json_integer_value(json_object_get(json_array_get(data, 1), "index")) == 1);
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_array_get(data, 0), "object")), "embedding"));
    LM_REQUIRE(json_array_size(e0) == (size_t)D);
    double worst = 0;
    for (int i = 0; i < D; i++) worst = fmax(worst, fabs(json_number_value(json_array_get(e0, (size_t)i)) - want[i]));
    LM_CHECK_MSG(worst <= 1e-5, "server vs transformers: %g", worst);
    json_t *usage = json_object_get(j, "usage");
    LM_CHECK(json_integer_value(json_object_get(usage, "prompt_tokens")) > T &&
             json_integer_value(json_object_get(usage, "total_tokens")) ==
                 json_integer_value(json_object_get(usage, "prompt_tokens")));
    json_decref(j);

    /* base64 (the openai SDK's default) carries the same floats */
    snprintf(body, sizeof body, "{\"input\":%s,\"encoding_format\":\"base64\"}", list);
    j = post(s.port, "/embeddings", body, &st);
    LM_CHECK(st == 200);
    float got[64];
    const char *b64 = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "embedding"));
    LM_REQUIRE(b64 && b64_floats(b64, got, 64) == D);
    worst = 0;
    for (int i = 0; i < D; i++) worst = fmax(worst, fabs(got[i] - want[i]));
    LM_CHECK_MSG(worst <= 1e-5, "base64 vs transformers: %g", worst);
    json_decref(j);

    /* dimensions: the first 16, normalised again */
    snprintf(body, sizeof body, "{\"input\":[%s],\"dimensions\":16}", list);
    j = post(s.port, "/v1/embeddings", body, &st);
    e0 = json_object_get(json_array_get(json_object_get(j, "data"), 0), "embedding");
    LM_CHECK(st == 200 && json_array_size(e0) == 16);
    ss = 0;
    for (int i = 0; i < 16; i++) ss += want[i] * (double)want[i];
    for (int i = 0; i < 16 && json_array_size(e0) == 16; i++)
        LM_CHECK_NEAR(json_number_value(json_array_get(e0, (size_t)i)), want[i] / sqrt(ss), 1e-5);
    json_decref(j);

    /* bad inputs: status and the param named */
    static const struct { const char *body, *param; int status; } k_bad[] = {
        { "{\"input\":\"x\",\"dimensions\":65}", "dimensions", 400 },
        { "{\"input\":\"x\",\"dimensions\":0}", "dimensions", 400 },
        { "{\"input\":\"x\",\"encoding_format\":\"int8\"}", "encoding_format", 400 },
        { "{\"input\":[\"ok\",\"\"]}", "input[1]", 400 },
        { "{\"input\":[[1,2],[3,99999]]}", "input[1]", 400 },
        { "{\"input\":[]}", "input", 400 },
        { "{\"input\":5}", "input", 400 },
        { "{}", "input", 400 },
        { "{\"input\":\"x\",\"user\":5}", "user", 400 },
        { "{\"input\":\"x\",\"model\":\"other\"}", "model", 404 },
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof *k_bad; i++) {
        j = post(s.port, "/v1/embeddings", k_bad[i].body, &st);
        LM_CHECK_MSG(st == k_bad[i].status && lm_streq(err_param(j), k_bad[i].param), "%s: %d %s", k_bad[i].body, st,
                     err_param(j) ? err_param(j) : "(no param)");
        json_decref(j);
    }
    /* a list far longer than the queue (8) goes in windows: all answered */
    char many[8192] = "{\"input\":[";
    for (int i = 0; i < 100; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%s\"item %d\"", i ? "," : "", i);
    strcat(many, "]}");
    j = post(s.port, "/v1/embeddings", many, &st);
    data = json_object_get(j, "data");
    LM_CHECK_MSG(st == 200 && json_array_size(data) == 100, "%d, %zu vectors", st, json_array_size(data));
    LM_CHECK(json_integer_value(json_object_get(json_array_get(data, 99), "index")) == 99);
    LM_CHECK(json_array_size(json_object_get(json_array_get(data, 99), "embedding")) == (size_t)D);
    json_decref(j);
    /* over the context (4096): 400 naming the index */
    size_t cap = 5000 * 4 + 64;
    char *big = malloc(cap);
    strcpy(big, "{\"input\":[[1],[");
    for (int i = 0; i < 4097; i++) strcat(big, i ? ",5" : "5");
    strcat(big, "]]}");
    j = post(s.port, "/v1/embeddings", big, &st);
    LM_CHECK(st == 400 && lm_streq(err_param(j), "input[1]"));
    LM_CHECK(lm_streq(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "context_length_exceeded"));
    json_decref(j);
    free(big);
    lm_safetensors_close(&ref);
    LM_CHECK(gu_server_stop(&s) == 0);
    free(dir);
}

LM_TEST(server_tokenize_models) {
    gu_server s;
    char *dir;
    if (!start(lm_t_, &s, &dir)) {
        if (!lm_t_->failed) LM_SKIP("%s", lm_test_fixtures_why());
        return;
    }
    int st;
    json_t *j = post(s.port, "/tokenize", "{\"content\":\"hello world\"}", &st);
    json_t *toks = json_object_get(j, "tokens");
    LM_CHECK(st == 200 && json_array_size(toks) > 0 && json_is_integer(json_array_get(toks, 0)));
    char *ids = json_dumps(toks, JSON_COMPACT);
    json_decref(j);
    char body[512];
    snprintf(body, sizeof body, "{\"tokens\":%s}", ids);
    j = post(s.port, "/detokenize", body, &st);
    LM_CHECK(st == 200 && lm_streq(json_string_value(json_object_get(j, "content")), "hello world"));
    json_decref(j);
    free(ids);
    /* pieces, with the NUL byte kept as text */
    j = post(s.port, "/v1/tokenize", "{\"prompt\":\"a\\u0000b\",\"with_pieces\":true}", &st);
    toks = json_object_get(j, "tokens");
    LM_CHECK(st == 200 && json_array_size(toks) == 3);
    json_t *mid = json_object_get(json_array_get(toks, 1), "piece");
    LM_CHECK(json_string_length(mid) == 1 && json_string_value(mid)[0] == 0);
    LM_CHECK(json_is_integer(json_object_get(json_array_get(toks, 1), "id")));
    json_decref(j);
    static const struct { const char *path, *body, *param; } k_bad[] = {
        { "/detokenize", "{\"tokens\":[1,1024]}", "tokens" },
        { "/detokenize", "{\"tokens\":[-1]}", "tokens" },
        { "/detokenize", "{\"tokens\":\"x\"}", "tokens" },
        { "/tokenize", "{\"content\":5}", "content" },
        { "/tokenize", "{\"content\":\"x\",\"add_special\":\"yes\"}", "add_special" },
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof *k_bad; i++) {
        j = post(s.port, k_bad[i].path, k_bad[i].body, &st);
        LM_CHECK_MSG(st == 400 && lm_streq(err_param(j), k_bad[i].param), "%s %s: %d", k_bad[i].path, k_bad[i].body, st);
        json_decref(j);
    }
    /* /v1/models: the old fields and the metadata */
    gu_resp r = { 0 };
    LM_REQUIRE(gu_http(s.port, "GET", "/v1/models", NULL, NULL, &r) == 0);
    j = gu_json(&r);
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    LM_CHECK(json_integer_value(json_object_get(m, "max_model_len")) == 4096);
    LM_CHECK(json_integer_value(json_object_get(m, "context_length")) == 4096);
    LM_CHECK(lm_streq(json_string_value(json_object_get(m, "architecture")), "qwen3"));
    LM_CHECK(lm_streq(json_string_value(json_object_get(m, "dtype")), "BF16"));
    LM_CHECK(json_integer_value(json_object_get(m, "parameters")) > 100000);
    char *caps = json_dumps(json_object_get(m, "capabilities"), JSON_COMPACT);
    LM_CHECK_MSG(lm_streq(caps, "[\"completion\",\"chat\",\"tools\",\"reasoning\",\"embeddings\"]"), "%s", caps);
    free(caps);
    json_t *emb = json_object_get(m, "embedding");
    LM_CHECK(json_integer_value(json_object_get(emb, "dimensions")) == 64);
    LM_CHECK(lm_streq(json_string_value(json_object_get(emb, "pooling")), "last"));
    LM_CHECK(lm_streq(json_string_value(json_object_get(emb, "source")), "default"));
    json_decref(j);
    gu_resp_free(&r);
    LM_CHECK(gu_server_stop(&s) == 0);
    free(dir);
}

/* U+0000 anywhere a string goes (message content as a string and as parts,
 * tool-call arguments, a tool result, stop strings, a completion prompt)
 * is accepted, and the NUL reaches the tokenizer as text: the prompt with
 * it is longer than without. */
LM_TEST(server_nul_round_trip) {
    gu_server s;
    char *dir;
    if (!start(lm_t_, &s, &dir)) {
        if (!lm_t_->failed) LM_SKIP("%s", lm_test_fixtures_why());
        return;
    }
    static const char k_chat[] =
        "{\"max_tokens\":2,\"temperature\":0,\"stop\":[\"a%sb\"],\"messages\":["
        "{\"role\":\"system\",\"content\":\"sys%stem\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x%sy\"}]},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"p\\\":\\\"a%sb\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r%s\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"p\":{\"type\":\"string\"}}}}}]}";
    long n_prompt[2] = { 0, 0 };
    for (int with = 0; with < 2; with++) {
        const char *z = with ? "\\u0000" : "", *za = with ? "\\\\u0000" : "";
        char body[2048];
        snprintf(body, sizeof body, k_chat, z, z, z, za, z);
        int st;
        json_t *j = post(s.port, "/v1/chat/completions", body, &st);
        LM_CHECK_MSG(st == 200, "with NUL %d: %d", with, st);
        n_prompt[with] = (long)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
        json_decref(j);
    }
    LM_CHECK_MSG(n_prompt[1] > n_prompt[0] + 3, "prompt tokens %ld with NULs, %ld without", n_prompt[1], n_prompt[0]);
    int st;
    json_t *j = post(s.port, "/v1/completions", "{\"max_tokens\":1,\"prompt\":\"a\\u0000b\",\"echo\":true}", &st);
    const json_t *text = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
    LM_CHECK(st == 200 && json_string_length(text) >= 3 && !memcmp(json_string_value(text), "a\0b", 3));
    json_decref(j);
    LM_CHECK(gu_server_stop(&s) == 0);
    free(dir);
}

/* The chat layer keeps U+0000 as text: in contents (string and parts), in
 * a tool result, and in tool-call arguments, which are parsed into an
 * object for the template (it prints them with tojson, hence the space
 * after the colon) rather than left as the client's string. */
LM_TEST(chat_render_keeps_nul) {
    char *dir = lm_test_fixture_path("models/qwen3");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_tokenizer *tok = NULL;
    lm_chat *chat = NULL;
    LM_REQUIRE(lm_tokenizer_load(&tok, dir, NULL) == 0);
    LM_REQUIRE(lm_chat_create(&chat, tok, NULL, NULL) == 0);
    static const char k_msgs[] =
        "[{\"role\":\"system\",\"content\":\"sys\\u0000tem\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\\u0000y\"}]},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"p\\\":\\\"a\\\\u0000b\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\\u0000\"}]";
    json_t *msgs = json_loads(k_msgs, JSON_ALLOW_NUL, NULL);
    LM_REQUIRE(msgs);
    lm_chat_req cr = { .messages = msgs };
    lm_chat_prompt p;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_chat_render(chat, &cr, &p, &e) == 0);
    LM_CHECK(memmem(p.text, p.len, "sys\0tem", 7) && memmem(p.text, p.len, "x\0y", 3) &&
             memmem(p.text, p.len, "r\0\n", 3));
    const char *args = "\"arguments\": {\"p\": \"a\\u0000b\"}";
    LM_CHECK_MSG(memmem(p.text, p.len, args, strlen(args)), "%.*s", (int)p.len, p.text);
    lm_chat_prompt_free(&p);
    json_decref(msgs);
    lm_chat_free(chat);
    lm_tokenizer_free(tok);
    free(dir);
}
