/* test_server_marks.c - the server tells the engine where a chat prompt's
 * messages end, so that the demo hybrid reuses all but a few tokens of a
 * conversation whose last message changed (lm_chat_mark_messages, then
 * lm_gen_params.prompt_marks), and answers exactly as a cold server does.
 *
 * Three servers on the demo: one with a RAM and disk cache serves turn A
 * and then B (A with its last user message changed in its middle); a
 * second on the same --cache-dir serves C (A with the last user message
 * replaced whole: a departure at a message boundary) from disk; a third
 * without a cache gives the cold answers. The trace says what each shared
 * with the closest earlier prompt and how much was cached. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guard_util.h"
#include "lm_test.h"
#include "test_util.h"

static const char k_long[] =
    "Here is the log of the failing build, line by line, with the compiler's notes kept in order so that "
    "the cause can be found: the first error names a header that moved, the second a function whose "
    "signature changed, and the rest follow from those two. The linker then reports twelve undefined "
    "symbols, all from the networking module, which was split into two libraries in the update; the "
    "test runner never starts. The warnings before the first error are about deprecated flags and can "
    "be ignored for now, although the team plans to clean them up next quarter when the toolchain moves.";

/* The conversation with `last` as its final user message. */
static char *mk_body(const char *last) {
    json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s},{s:s,s:s},{s:s,s:s}]", "role", "system", "content",
                             "You are a terse build engineer.", "role", "user", "content",
                             "Why does the build fail after the update?", "role", "assistant", "content",
                             "Send the full log, please.", "role", "user", "content", last);
    json_t *req = json_pack("{s:o,s:i,s:f}", "messages", msgs, "max_tokens", 8, "temperature", 0.0);
    char *b = json_dumps(req, 0);
    json_decref(req);
    return b;
}

/* The chat answer's text (malloc'd), or NULL. */
static char *mk_chat(int port, const char *body) {
    gu_resp r;
    if (gu_http(port, "POST", "/v1/chat/completions", body, NULL, &r) != 0) return NULL;
    json_t *j = r.status == 200 ? gu_json(&r) : NULL;
    const char *t = json_string_value(
        json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
    char *out = t ? strdup(t) : NULL;
    json_decref(j);
    gu_resp_free(&r);
    return out;
}

typedef struct mk_tr {
    long n_prompt, n_cached, n_disk, n_shared;
} mk_tr;

/* Line `k` of the trace file (0 first). */
static bool mk_trace(const char *path, int k, mk_tr *t) {
    char *all = lm_tu_read(path, NULL);
    if (!all) return false;
    char *line = all;
    for (int i = 0; i < k && line; i++) line = (line = strchr(line, '\n')) ? line + 1 : NULL;
    json_t *j = line ? json_loads(line, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    free(all);
    if (!j) return false;
    t->n_prompt = (long)json_integer_value(json_object_get(j, "n_prompt"));
    t->n_cached = (long)json_integer_value(json_object_get(j, "n_cached"));
    t->n_disk = (long)json_integer_value(json_object_get(j, "n_cached_disk"));
    t->n_shared = (long)json_integer_value(json_object_get(json_object_get(j, "cache"), "n_shared"));
    json_decref(j);
    return true;
}

LM_TEST(server_marks_hybrid_reuse_exact_demo) {
    if (lm_tu_run("command -v curl >/dev/null", NULL, NULL) != 0) LM_SKIP("needs curl");
    char *work = lm_tu_mkdir("server_marks");
    char tr1[700], tr2[700], extra[1600], last_b[1024], last_c[1024];
    snprintf(tr1, sizeof tr1, "%s/trace1.jsonl", work);
    snprintf(tr2, sizeof tr2, "%s/trace2.jsonl", work);
    /* B changes the last message in its middle; C replaces it whole */
    char *a = mk_body(k_long);
    snprintf(last_b, sizeof last_b, "%.*sTWELVE FATAL ERRORS%s", 300, k_long, k_long + 330);
    char *b = mk_body(last_b);
    snprintf(last_c, sizeof last_c, "Never mind the log; %s", "which compiler flags does the project set by default?");
    char *c = mk_body(last_c);
    gu_server s;
    snprintf(extra, sizeof extra, "--threads 1 --cache-ram 64M --cache-dir '%s/cache' --trace '%s'", work, tr1);
    GU_START(s, gu_demo_dir(), extra);
    char *got_a = mk_chat(s.port, a), *got_b = mk_chat(s.port, b);
    GU_STOP(s);
    snprintf(extra, sizeof extra, "--threads 1 --cache-ram 64M --cache-dir '%s/cache' --trace '%s'", work, tr2);
    GU_START(s, gu_demo_dir(), extra);
    char *got_c = mk_chat(s.port, c);
    GU_STOP(s);
    GU_START(s, gu_demo_dir(), "--threads 1 --cache-ram 0");
    char *cold_b = mk_chat(s.port, b), *cold_c = mk_chat(s.port, c);
    GU_STOP(s);
    LM_REQUIRE(got_a && got_b && got_c && cold_b && cold_c);
    LM_CHECK_MSG(!strcmp(got_b, cold_b), "B: '%s', cold '%s'", got_b, cold_b);
    LM_CHECK_MSG(!strcmp(got_c, cold_c), "C: '%s', cold '%s'", got_c, cold_c);
    mk_tr ta, tb, tc;
    LM_REQUIRE(mk_trace(tr1, 0, &ta) && mk_trace(tr1, 1, &tb) && mk_trace(tr2, 0, &tc));
    /* B shares half its last message with A: fewer than 64 recomputed */
    LM_CHECK_MSG(tb.n_shared > 64 && tb.n_shared - tb.n_cached < 64, "B: %ld cached of %ld shared", tb.n_cached,
                 tb.n_shared);
    /* C departs where A's last message starts: a checkpoint there, from disk
     * (the history is gone with the restart: compare with A's length) */
    LM_CHECK_MSG(tc.n_cached > 0 && tc.n_disk == tc.n_cached && tc.n_cached < ta.n_prompt - 40,
                 "C: %ld cached, %ld from disk (A: %ld tokens)", tc.n_cached, tc.n_disk, ta.n_prompt);
    free(a), free(b), free(c);
    free(got_a), free(got_b), free(got_c), free(cold_b), free(cold_c);
    free(work);
}
