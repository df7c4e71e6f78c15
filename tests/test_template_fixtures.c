/* test_template_fixtures.c - every case of ../shared/fixtures/templates/NAME/
 * cases.jsonl rendered byte for byte: one test per fixture template, one
 * that sweeps whatever directories exist (so new fixtures are covered), and
 * one that runs `lumen check-template` the way a reviewer would.
 *
 * A case expects "expected_jinja2" when present (Python jinja2's rendering,
 * which transformers uses), else an error containing "error", else
 * "expected". Cases marked reference_limitation are checked the same way and
 * counted in the output line, except that one expecting only the JS
 * reference's error passes on any render failure (as in check-template). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "template/lm_template.h"
#include "test_util.h"

typedef struct fx_result {
    int passed, failed, limitation;
} fx_result;

/* The directory's template file: the one that is not cases.jsonl. */
static char *template_file(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char *found = NULL;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.' || !strcmp(ent->d_name, "cases.jsonl")) continue;
        if (strstr(ent->d_name, ".jinja") || strstr(ent->d_name, ".json")) {
            free(found);
            size_t n = strlen(dir) + strlen(ent->d_name) + 2;
            found = malloc(n);
            snprintf(found, n, "%s/%s", dir, ent->d_name);
        }
    }
    closedir(d);
    return found;
}

static void run_dir(lm_test_ctx *lm_t_, const char *dir, fx_result *r) {
    char *tpath = template_file(dir);
    LM_REQUIRE(tpath != NULL);
    char *src;
    size_t len;
    lm_err e;
    int rc = lm_template_load_source(tpath, &src, &len, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) {
        free(tpath);
        return;
    }
    lm_template *t;
    rc = lm_template_parse(src, len, tpath, &t, &e);
    free(src);
    free(tpath);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    char cases[1024];
    snprintf(cases, sizeof cases, "%s/cases.jsonl", dir);
    size_t n;
    char *text = lm_tu_read(cases, &n);
    LM_CHECK_MSG(text != NULL, "cannot read %s", cases);
    for (char *line = text, *next; text && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!*line) continue;
        json_error_t je;
        json_t *c = json_loads(line, JSON_ALLOW_NUL, &je);
        LM_CHECK_MSG(c != NULL, "%s: bad JSON: %s", cases, je.text);
        if (!c) continue;
        const char *id = json_string_value(json_object_get(c, "id"));
        const json_t *want = json_object_get(c, "expected_jinja2");
        const json_t *want_err = want ? NULL : json_object_get(c, "error");
        if (!want && !want_err) want = json_object_get(c, "expected");
        bool limitation = json_is_true(json_object_get(c, "reference_limitation"));
        if (limitation) r->limitation++;
        char *out = NULL;
        size_t out_n = 0;
        rc = lm_template_render(t, json_object_get(c, "context"), NULL, &out, &out_n, &e);
        bool ok;
        if (want_err) {
            ok = rc != 0 && (limitation || strstr(e.msg, json_string_value(want_err)));
            LM_CHECK_MSG(ok, "%s %s: want error [%s], got [%s]", dir, id, json_string_value(want_err),
                         rc ? e.msg : "rendered text");
        } else {
            ok = rc == 0 && out_n == json_string_length(want) && !memcmp(out, json_string_value(want), out_n);
            if (!ok) {
                size_t off = 0, wn = json_string_length(want);
                const char *w = json_string_value(want);
                while (rc == 0 && off < out_n && off < wn && out[off] == w[off]) off++;
                LM_CHECK_MSG(ok, "%s %s: %s at byte %zu: want [%.60s] got [%.60s]", dir, id,
                             rc ? e.msg : "differs", off, w + LM_MIN(off, wn), rc ? "" : out + off);
            }
        }
        if (ok) r->passed++;
        else r->failed++;
        free(out);
        json_decref(c);
    }
    free(text);
    lm_template_free(t);
}

static void run_named(lm_test_ctx *lm_t_, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "templates/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    fx_result r = { 0 };
    run_dir(lm_t_, dir, &r);
    free(dir);
    LM_CHECK_MSG(r.passed > 0 && r.failed == 0, "%s: %d passed, %d failed", name, r.passed, r.failed);
}

LM_TEST(template_fixture_tiny_chatml) { run_named(lm_t_, "tiny-chatml"); }
LM_TEST(template_fixture_qwen3) { run_named(lm_t_, "qwen3"); }
LM_TEST(template_fixture_qwen38) { run_named(lm_t_, "qwen38"); }
LM_TEST(template_fixture_gemma3) { run_named(lm_t_, "gemma3"); }
LM_TEST(template_fixture_gemma4_31b) { run_named(lm_t_, "gemma4-31b"); }
LM_TEST(template_fixture_gemma4_e2b) { run_named(lm_t_, "gemma4-e2b"); }
LM_TEST(template_fixture_nemotron35) { run_named(lm_t_, "nemotron35"); }
LM_TEST(template_fixture_nemotron3nano) { run_named(lm_t_, "nemotron3nano"); }
LM_TEST(template_fixture_glimmer) { run_named(lm_t_, "glimmer"); }
LM_TEST(template_fixture_laguna_v2) { run_named(lm_t_, "laguna-v2"); }
LM_TEST(template_fixture_laguna_v8) { run_named(lm_t_, "laguna-v8"); }

/* Every directory under templates/, including ones added after this file. */
LM_TEST(template_fixture_all_directories) {
    char *root = lm_test_fixture_path("templates");
    if (!root) LM_SKIP("%s", lm_test_fixtures_why());
    DIR *d = opendir(root);
    if (!d) {
        free(root);
        LM_SKIP("no templates/ in the fixtures");
    }
    fx_result r = { 0 };
    int dirs = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        char path[1024], cases[1100];
        snprintf(path, sizeof path, "%s/%s", root, ent->d_name);
        snprintf(cases, sizeof cases, "%s/cases.jsonl", path);
        FILE *f = fopen(cases, "r");
        if (!f) continue;
        fclose(f);
        dirs++;
        run_dir(lm_t_, path, &r);
    }
    closedir(d);
    free(root);
    printf("  %d template directories: %d cases passed, %d failed (%d marked reference_limitation)\n", dirs,
           r.passed, r.failed, r.limitation);
    LM_CHECK(dirs > 0 && r.failed == 0);
}

/* The checker command itself: one JSON line, exit 0 when all pass, 1 and the
 * first failure when one does not. */
LM_TEST(template_check_template_cli) {
    char *dir = lm_test_fixture_path("templates/qwen3");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' check-template '%s/chat_template.jinja' '%s/cases.jsonl'", lm_test_lumen_bin(), dir,
             dir);
    int rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s %s", rc, out ? out : "", err ? err : "");
    LM_CHECK(out && strstr(out, "\"passed\":12,\"failed\":0"));
    free(out);
    free(err);
    /* a wrong expectation fails with the first difference */
    char *tmp = lm_tu_mkdir("check_template");
    char cases[1024];
    snprintf(cases, sizeof cases, "%s/bad.jsonl", tmp);
    const char *bad = "{\"id\": \"x1\", \"context\": {\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}, "
                      "\"expected\": \"<|im_start|>user\\nHo<|im_end|>\\n\"}\n";
    LM_REQUIRE(lm_tu_write(cases, bad, strlen(bad)) == 0);
    snprintf(cmd, sizeof cmd, "'%s' check-template '%s/chat_template.jinja' '%s'", lm_test_lumen_bin(), dir, cases);
    out = err = NULL;
    rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK(rc == 1);
    LM_CHECK(out && strstr(out, "\"failed\":1") && strstr(out, "\"id\":\"x1\"") && strstr(out, "\"offset\":18"));
    free(out);
    free(err);
    free(tmp);
    free(dir);
}
