/* test_cli.c - the lumen binary as users run it: output format, exit codes,
 * and one-line errors for bad input. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "test_util.h"

static int lumen(const char *args, char **out, char **err) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %.3000s", lm_test_lumen_bin(), args);
    return lm_tu_run(cmd, out, err);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; s && *s; s++) n += *s == '\n';
    return n;
}

LM_TEST(cli_parity_json_and_exit_code) {
    char *dir = lm_test_fixture_path("models/qwen3");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char args[1200], *out = NULL, *err = NULL;
    snprintf(args, sizeof args, "parity '%s'", dir);
    int rc = lumen(args, &out, &err);
    LM_CHECK_MSG(rc == 0, "exit %d, stderr: %s", rc, err);
    LM_CHECK(count_lines(out) == 1);
    json_t *j = json_loads(out ? out : "", 0, NULL);
    LM_CHECK(json_is_true(json_object_get(j, "ok")));
    LM_CHECK(json_real_value(json_object_get(j, "max_abs_err")) <= 1e-3);
    LM_CHECK(json_array_size(json_object_get(j, "prompts")) == 3);
    json_decref(j);
    free(out);
    free(err);
    /* an impossible tolerance must fail with exit 1, still printing the JSON line */
    snprintf(args, sizeof args, "parity '%s' --tol 1e-12", dir);
    rc = lumen(args, &out, &err);
    LM_CHECK(rc == 1);
    j = json_loads(out ? out : "", 0, NULL);
    LM_CHECK(json_is_false(json_object_get(j, "ok")));
    json_decref(j);
    free(out);
    free(err);
    free(dir);
}

LM_TEST(cli_run_greedy_matches_reference) {
    /* prompt0 of the llama fixture and the first 8 of its greedy tokens */
    char *dir = lm_test_fixture_path("models/llama");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char *ref_path = lm_test_fixture_path("models/llama/reference.safetensors");
    size_t n;
    char *ref = lm_tu_read(ref_path, &n);
    LM_REQUIRE(ref && n > 8);
    uint64_t hl;
    memcpy(&hl, ref, 8);
    json_t *h = json_loadb(ref + 8, hl, 0, NULL);
    const uint8_t *data = (const uint8_t *)ref + 8 + hl;
    json_t *ids = json_object_get(h, "prompt0.ids"), *gids = json_object_get(h, "prompt0.greedy_ids");
    LM_REQUIRE(ids && gids);
    size_t ib = (size_t)json_integer_value(json_array_get(json_object_get(ids, "data_offsets"), 0));
    size_t ie = (size_t)json_integer_value(json_array_get(json_object_get(ids, "data_offsets"), 1));
    size_t gb = (size_t)json_integer_value(json_array_get(json_object_get(gids, "data_offsets"), 0));
    char args[2048], expect[512];
    size_t a = (size_t)snprintf(args, sizeof args, "run -m '%s' -n 8 --ignore-eos --prompt-ids ", dir);
    for (size_t i = ib; i < ie; i += 4) {
        int32_t v;
        memcpy(&v, data + i, 4);
        a += (size_t)snprintf(args + a, sizeof args - a, "%s%d", i > ib ? "," : "", v);
    }
    size_t x = 0;
    for (int i = 0; i < 8; i++) {
        int32_t v;
        memcpy(&v, data + gb + 4 * (size_t)i, 4);
        x += (size_t)snprintf(expect + x, sizeof expect - x, "%s%d", i ? " " : "", v);
    }
    snprintf(expect + x, sizeof expect - x, "\n");
    char *out = NULL, *err = NULL;
    int rc = lumen(args, &out, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
    LM_CHECK_MSG(out && !strcmp(out, expect), "got \"%s\", expected \"%s\"", out, expect);
    LM_CHECK(err && strstr(err, "tok/s"));
    free(out);
    free(err);
    /* same seed, same sampled tokens; another seed, (almost surely) others */
    char *s1 = NULL, *s2 = NULL, *s3 = NULL;
    size_t base = strlen(args);
    snprintf(args + base, sizeof args - base, " -n 16 --temp 1.5 --seed 7");
    lumen(args, &s1, NULL);
    lumen(args, &s2, NULL);
    snprintf(args + base, sizeof args - base, " -n 16 --temp 1.5 --seed 8");
    lumen(args, &s3, NULL);
    LM_CHECK(s1 && s2 && s3 && !strcmp(s1, s2) && strcmp(s1, s3));
    free(s1);
    free(s2);
    free(s3);
    json_decref(h);
    free(ref);
    free(ref_path);
    free(dir);
}

LM_TEST(cli_bad_input_one_line_errors) {
    char *out = NULL, *err = NULL;
    int rc = lumen("run -m /nonexistent/dir --prompt-ids 1,2", &out, &err);
    LM_CHECK(rc == 1);
    LM_CHECK(err && strstr(err, "/nonexistent/dir") && count_lines(err) == 1);
    free(out);
    free(err);
    rc = lumen("run -m x --prompt-ids 1,,b", &out, &err);
    LM_CHECK(rc == 2 && err && strstr(err, "--prompt-ids"));
    free(out);
    free(err);
    rc = lumen("frobnicate", &out, &err);
    LM_CHECK(rc == 2 && err && strstr(err, "unknown command"));
    free(out);
    free(err);
    rc = lumen("parity", &out, &err);
    LM_CHECK(rc == 2);
    free(out);
    free(err);
    static const char *const bad_mem[] = { "run -p x --gpu-memory lots", "run -p x --gpu-memory 0",
                                           "serve --gpu-memory 1.5G" };
    for (size_t i = 0; i < LM_COUNT(bad_mem); i++) {
        rc = lumen(bad_mem[i], &out, &err);
        LM_CHECK_MSG(rc == 2 && err && strstr(err, "--gpu-memory"), "%s: exit %d: %s", bad_mem[i], rc, err);
        free(out);
        free(err);
    }
    /* on the CPU the limit has nothing to limit */
    rc = lumen("run -p 'def f(' -n 4 --device cpu --gpu-memory 1G", &out, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
    free(out);
    free(err);
    rc = lumen("--help", &out, &err);
    LM_CHECK(rc == 0 && out && strstr(out, "parity") && strstr(out, "bench"));
    free(out);
    free(err);
    /* a token id outside the vocabulary is an error, not a crash */
    char *dir = lm_test_fixture_path("models/llama");
    if (dir) {
        char args[1100];
        snprintf(args, sizeof args, "run -m '%s' --prompt-ids 1,5000 -n 2", dir);
        rc = lumen(args, &out, &err);
        LM_CHECK(rc == 1 && err && strstr(err, "token id 5000 out of range"));
        free(out);
        free(err);
        free(dir);
    }
}

/* Text in, text out on the bundled demo model (the default without -m):
 * greedy output is repeatable, and chat answers turn after turn. */
LM_TEST(cli_run_text_and_chat_on_demo_model) {
    char *out1 = NULL, *out2 = NULL, *err = NULL;
    int rc = lumen("run -p 'def add(a, b):' -n 24 --temp 0 --ignore-eos", &out1, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
    LM_CHECK(out1 && strlen(out1) > 10);
    free(err);
    lumen("run -p 'def add(a, b):' -n 24 --temp 0 --ignore-eos", &out2, NULL);
    LM_CHECK(out1 && out2 && !strcmp(out1, out2));
    free(out1);
    free(out2);
    /* two chat turns from standard input, each answered */
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "printf 'Write a Python function `square`: Return x squared.\\nNow one called `cube`.\\n' | '%s' chat --temp 0 -n 40",
             lm_test_lumen_bin());
    char *chat = NULL;
    err = NULL;
    rc = lm_tu_run(cmd, &chat, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
    LM_CHECK(chat && strlen(chat) > 20);
    free(chat);
    free(err);
}

/* run and chat share the sampling options: chat takes --top-k / --min-p
 * too, a seed repeats its tokens, and bad values are refused naming the
 * option. */
LM_TEST(cli_sampling_options_shared) {
    char *a = NULL, *b = NULL, *err = NULL;
    const char *args = "run -p 'def add(a, b):' -n 16 --temp 0.9 --top-k 20 --top-p 0.9 --min-p 0.05 --seed 7 "
                       "--ignore-eos --device cpu";
    LM_CHECK(lumen(args, &a, NULL) == 0 && lumen(args, &b, NULL) == 0);
    LM_CHECK(a && b && strlen(a) > 5 && !strcmp(a, b));
    free(a), free(b);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "printf 'Hello\\n' | '%s' chat --temp 0.8 --top-k 5 --min-p 0.1 --seed 3 -n 8 --device cpu",
             lm_test_lumen_bin());
    int rc = lm_tu_run(cmd, &a, &err);
    LM_CHECK_MSG(rc == 0, "chat with --top-k/--min-p: exit %d: %s", rc, err);
    free(a), free(err);
    static const char *const bad[] = { "run -p x --temp -1", "run -p x --top-p 0", "chat --min-p 2",
                                       "chat --top-k -3", "run -p x --seed -1" };
    for (size_t i = 0; i < LM_COUNT(bad); i++) {
        rc = lumen(bad[i], NULL, &err);
        LM_CHECK_MSG(rc == 2 && err && strstr(err, "bad value for --"), "%s: exit %d, %s", bad[i], rc, err);
        free(err);
    }
}

/* A MoE model's batched step reads an expert per distinct pick, not one
 * token's experts: `lumen bench --batch 3` gives no share of the copy
 * roofline for it, `--batch 1` does. */
LM_TEST(cli_bench_batched_moe_has_no_dense_roofline) {
    for (int B = 1; B <= 3; B += 2) {
        char cmd[512], *out = NULL, *err = NULL;
        snprintf(cmd, sizeof cmd,
                 "bench -m '" LUMEN_SOURCE_DIR "/tests/data/moe/qwen3-moe-e32-k8' --device cpu --batch %d "
                 "--prompt-len 8 --gen 4",
                 B);
        int rc = lumen(cmd, &out, &err);
        LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
        json_error_t je;
        json_t *j = out ? json_loads(out, 0, &je) : NULL;
        LM_CHECK_MSG(j != NULL, "not one JSON line: %s", out ? out : "(none)");
        if (j) {
            LM_CHECK(json_real_value(json_object_get(j, "copy_GB_s")) > 0);
            LM_CHECK_MSG((json_object_get(j, "decode_pct_of_copy") != NULL) == (B == 1), "batch %d: %s", B, out);
            json_decref(j);
        }
        free(out);
        free(err);
    }
}

/* `lumen bench --batch`: B sequences prefilled in chunks, then decoding
 * together with greedy ids from the backend; one JSON line with the rate
 * and, the bandwidth measured, the share of a step its weights take at the
 * copy rate. */
LM_TEST(cli_bench_batched_decode_on_demo_model) {
    char *out = NULL, *err = NULL;
    int rc = lumen("bench -m '" LUMEN_SOURCE_DIR "/models/demo' --device cpu --batch 3 --prompt-len 40 --chunk 16 --gen 8",
                   &out, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    LM_CHECK_MSG(j != NULL, "not one JSON line: %s", out ? out : "(none)");
    if (j) {
        LM_CHECK(json_integer_value(json_object_get(j, "batch")) == 3);
        LM_CHECK(json_real_value(json_object_get(j, "decode_tok_s")) > 0);
        double issue = json_real_value(json_object_get(j, "body_issue_ms")), body = json_real_value(json_object_get(j, "body_ms"));
        LM_CHECK_MSG(issue > 0 && body >= issue, "body_issue_ms %g, body_ms %g", issue, body);
        double step = json_real_value(json_object_get(j, "decode_step_ms"));
        double w = json_real_value(json_object_get(j, "weights_at_copy_ms"));
        double pct = json_real_value(json_object_get(j, "decode_pct_of_copy"));
        LM_CHECK(json_real_value(json_object_get(j, "copy_GB_s")) > 0 && w > 0);
        LM_CHECK_MSG(fabs(pct - 100 * w / step) <= 0.2 + 2e-3 * pct, "pct %g, weights %g ms, step %g ms", pct, w, step);
        json_decref(j);
    }
    free(out);
    free(err);
}

/* run --spec: the same text as plain decoding with each mode on the demo
 * model (its MTP head, lookup, auto, itself as a separate draft model); a
 * draft model that is not there is an error naming it. */
LM_TEST(cli_run_spec_same_text) {
    const char *base = "run -p 'def add(a, b):\n    return a + b\n\n\ndef sub(a, b):' -n 48 --temp 0 --ignore-eos";
    char args[512], *plain = NULL, *out = NULL, *err = NULL;
    int rc = lumen(base, &plain, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
    free(err);
    static const char *const modes[] = { "mtp", "lookup", "auto", "mtp --spec-draft 2 --spec-fixed",
                                         "draft:" LUMEN_SOURCE_DIR "/models/demo --spec-draft 3 --spec-fixed" };
    for (int i = 0; i < 5; i++) {
        snprintf(args, sizeof args, "%s --spec %s", base, modes[i]);
        out = err = NULL;
        rc = lumen(args, &out, &err);
        LM_CHECK_MSG(rc == 0, "--spec %s: exit %d: %s", modes[i], rc, err);
        LM_CHECK_MSG(plain && out && !strcmp(plain, out), "--spec %s: '%s' vs '%s'", modes[i], out, plain);
        LM_CHECK_MSG(err && strstr(err, "\"verify_steps\":"), "--spec %s: no counters: %s", modes[i], err);
        free(out), free(err);
    }
    out = err = NULL;
    rc = lumen("run --prompt-ids 1,2,3 --spec draft:/nonexistent/draft", &out, &err);
    LM_CHECK_MSG(rc == 1 && err && strstr(err, "draft model /nonexistent/draft"), "exit %d: %s", rc, err);
    free(out), free(err), free(plain);
}
