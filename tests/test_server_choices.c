/* test_server_choices.c - n > 1 on /v1/chat/completions and
 * /v1/completions through `lumen serve` (qwen3 fixture): n choices with
 * indexes 0..n-1, usage summing every choice's tokens, temperature 0 giving
 * n equal choices, a seed giving reproducible and different choices, a
 * stream whose chunks carry each choice's index with one usage chunk and
 * one [DONE] at the very end, and n above 16 refused. */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "guard_util.h"
#include "lm_test.h"

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

/* The texts of the choices (by index) of a chat answer, "\x1f"-joined (malloc'd). */
static char *choice_texts(const json_t *j, int n) {
    const json_t *ch = json_object_get(j, "choices");
    char *out = calloc(1, 8192);
    for (int i = 0; i < n; i++) {
        const json_t *c = NULL;
        for (size_t k = 0; k < json_array_size(ch); k++)
            if (json_integer_value(json_object_get(json_array_get(ch, k), "index")) == i) c = json_array_get(ch, k);
        const char *t = json_string_value(json_object_get(json_object_get(c, "message"), "content"));
        if (!t) t = json_string_value(json_object_get(c, "text"));
        strncat(out, t ? t : "(none)", 8000 - strlen(out));
        strcat(out, "\x1f");
    }
    return out;
}

LM_TEST(server_n_choices) {
    char *dir = lm_test_fixture_path("models/qwen3");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    gu_server s;
    if (gu_server_start(&s, dir, "--threads 1 --parallel 4")) {
        gu_server_dump_log(&s);
        free(dir);
        LM_REQUIRE(!"the server started");
    }
    int st;
    const char *chat = "{\"n\":4,\"max_tokens\":6,\"seed\":7,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    json_t *a = post(s.port, "/v1/chat/completions", chat, &st);
    LM_CHECK(st == 200 && json_array_size(json_object_get(a, "choices")) == 4);
    int gen = 0;
    for (int i = 0; i < 4; i++) {
        json_t *c = json_array_get(json_object_get(a, "choices"), (size_t)i);
        LM_CHECK(json_integer_value(json_object_get(c, "index")) == i);
        LM_CHECK(json_string_value(json_object_get(c, "finish_reason")) != NULL);
    }
    json_t *u = json_object_get(a, "usage");
    gen = (int)json_integer_value(json_object_get(u, "completion_tokens"));
    LM_CHECK_MSG(gen > 6 && gen <= 24, "completion_tokens %d for 4 choices of at most 6", gen);
    LM_CHECK(json_integer_value(json_object_get(u, "total_tokens")) ==
             json_integer_value(json_object_get(u, "prompt_tokens")) + gen);
    json_t *b = post(s.port, "/v1/chat/completions", chat, &st);
    char *ta = choice_texts(a, 4), *tb = choice_texts(b, 4);
    LM_CHECK_MSG(!strcmp(ta, tb), "the same seed gave different choices");
    char *first = strndup(ta, strcspn(ta, "\x1f"));
    int same = 0;
    for (const char *p = ta; *p; p += strcspn(p, "\x1f") + 1) same += !strncmp(p, first, strlen(first)) && p[strlen(first)] == '\x1f';
    LM_CHECK_MSG(same < 4, "4 sampled choices all equal: %s", ta);
    free(first), free(ta), free(tb);
    json_decref(a), json_decref(b);

    /* temperature 0: every choice is the greedy one */
    a = post(s.port, "/v1/completions", "{\"n\":3,\"max_tokens\":5,\"temperature\":0,\"prompt\":\"hello\"}", &st);
    ta = choice_texts(a, 3);
    const char *t0 = json_string_value(json_object_get(json_array_get(json_object_get(a, "choices"), 0), "text"));
    char want[512];
    snprintf(want, sizeof want, "%s\x1f%s\x1f%s\x1f", t0 ? t0 : "?", t0 ? t0 : "?", t0 ? t0 : "?");
    LM_CHECK(st == 200 && t0 && !strcmp(ta, want));
    free(ta);
    json_decref(a);

    /* a stream: each choice's chunks carry its index, one usage chunk and
     * one [DONE], both after every choice's finish_reason */
    gu_resp r = { 0 };
    LM_REQUIRE(gu_http(s.port, "POST", "/v1/chat/completions",
                       "{\"n\":3,\"max_tokens\":4,\"seed\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                       NULL, &r) == 0);
    int n_done = 0, n_bad = 0;
    json_t *chunks = gu_sse_chunks(&r, &n_done, &n_bad);
    LM_CHECK(n_done == 1 && n_bad == 0);
    int finishes[3] = { 0 }, roles[3] = { 0 }, n_usage = 0;
    size_t k;
    json_t *c;
    json_array_foreach(chunks, k, c) {
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        if (json_object_get(c, "usage") && !json_is_null(json_object_get(c, "usage"))) {
            n_usage++;
            LM_CHECK(k == json_array_size(chunks) - 1);
            LM_CHECK(json_integer_value(json_object_get(json_object_get(c, "usage"), "completion_tokens")) > 4);
            continue;
        }
        int idx = (int)json_integer_value(json_object_get(ch, "index"));
        LM_REQUIRE(idx >= 0 && idx < 3);
        if (json_object_get(json_object_get(ch, "delta"), "role")) roles[idx]++;
        if (json_is_string(json_object_get(ch, "finish_reason"))) finishes[idx]++;
    }
    for (int i = 0; i < 3; i++) LM_CHECK_MSG(roles[i] == 1 && finishes[i] == 1, "choice %d: %d roles, %d finishes", i, roles[i], finishes[i]);
    LM_CHECK(n_usage == 1);
    json_decref(chunks);
    gu_resp_free(&r);

    a = post(s.port, "/v1/chat/completions", "{\"n\":17,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &st);
    LM_CHECK(st == 400 && lm_streq(json_string_value(json_object_get(json_object_get(a, "error"), "param")), "n"));
    json_decref(a);
    LM_CHECK(gu_server_stop(&s) == 0);
    free(dir);
}
