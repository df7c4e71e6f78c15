/* cmd_check_template.c - `lumen check-template TEMPLATE CASES.jsonl`: renders
 * every case of a JSONL file ({"id", "context", "expected"} per line) with one
 * chat template and compares byte for byte.
 *
 * What a case expects: "expected_jinja2" when present (Python jinja2, what
 * transformers renders, where it differs from the JS reference), else an
 * error when "error" is present (the render must fail with a message that
 * contains it), else "expected". Cases marked "reference_limitation" (the
 * JS reference could not render them) count like the others and are also
 * tallied on their own; one of them that carries only the JS reference's
 * error message (no "expected_jinja2") passes when the render fails with any
 * message, since that text is the JS engine's, and is counted as
 * "error_text_not_compared".
 *
 * Prints one JSON line: passed and failed counts, the reference_limitation
 * tally, and the first failure (id, reason, byte offset of the first
 * difference, and both texts around it). Exits 0 only if every case passes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../template/lm_template.h"
#include "cli.h"

typedef struct check_template_opts {
    const char *tpl, *cases;
    int64_t now;
    bool verbose;
} check_template_opts;

static const lm_opt k_opts[] = {
    { LM_OPT_ARG, "TEMPLATE", NULL, LM_OPT_AT(check_template_opts, tpl), NULL,
      "a .jinja file, a tokenizer_config.json, a .gguf or a model folder; \"-\": each case's \"template\" field" },
    { LM_OPT_ARG, "CASES.jsonl", NULL, LM_OPT_AT(check_template_opts, cases), NULL,
      "the cases, one {\"id\", \"context\", \"expected\"} a line" },
    { LM_OPT_INT, "--now", NULL, LM_OPT_AT(check_template_opts, now), "SECONDS",
      "the time strftime_now() formats, in seconds since the epoch", "now", .ilo = 1, .ihi = 4102444800LL },
    { LM_OPT_FLAG, "--verbose", NULL, LM_OPT_AT(check_template_opts, verbose), NULL, "print every failure to stderr" },
    { .kind = LM_OPT_END },
};

static const check_template_opts k_defaults = { 0 };

static const lm_opt_cmd k_cmd = {
    .name = "check-template",
    .usage = "lumen check-template TEMPLATE CASES.jsonl [options]",
    .about = "Renders each case of CASES.jsonl with TEMPLATE and compares the text.\n"
             "Prints one JSON line {passed, failed, ..., first_failure}; exits 0 only if\n"
             "every case passes.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(check_template_opts),
};

typedef struct tally {
    int passed, failed, lim_passed, lim_failed, lim_err_any;
    json_t *first;
} tally;

/* A window of text around byte offset off, for the failure report. */
static json_t *snippet(const char *s, size_t n, size_t off) {
    size_t a = off > 80 ? off - 80 : 0, b = LM_MIN(n, off + 80);
    while (a > 0 && ((unsigned char)s[a] & 0xC0) == 0x80) a--;
    while (b < n && ((unsigned char)s[b] & 0xC0) == 0x80) b++;
    return json_stringn_nocheck(s + a, b - a);
}

static void fail(tally *t, bool limitation, json_t *detail, bool verbose) {
    t->failed++;
    if (limitation) t->lim_failed++;
    if (verbose) {
        char *d = json_dumps(detail, JSON_COMPACT);
        fprintf(stderr, "FAIL %s\n", d ? d : "?");
        free(d);
    }
    if (!t->first) t->first = detail;
    else json_decref(detail);
}

/* tpl NULL: each case carries its source (TEMPLATE "-"), unless parse_err
 * is set, when the template failed to parse and every case fails with it. */
static void check_case(const lm_template *tpl, const char *parse_err, const char *line, int lineno,
                       const lm_template_opts *opts, tally *t, bool verbose) {
    json_error_t je;
    json_t *c = json_loads(line, JSON_ALLOW_NUL, &je);
    json_t *detail = json_object();
    json_object_set_new(detail, "line", json_integer(lineno));
    if (!c || !json_is_object(c)) {
        json_object_set_new(detail, "reason", json_sprintf("bad case JSON: %s", c ? "not an object" : je.text));
        fail(t, false, detail, verbose);
        json_decref(c);
        return;
    }
    const json_t *id = json_object_get(c, "id");
    if (id) json_object_set(detail, "id", (json_t *)id);
    bool limitation = json_is_true(json_object_get(c, "reference_limitation"));
    if (limitation) json_object_set_new(detail, "reference_limitation", json_true());
    const json_t *want = json_object_get(c, "expected_jinja2");
    const json_t *want_err = want ? NULL : json_object_get(c, "error");
    if (!want && !want_err) want = json_object_get(c, "expected");
    const json_t *ctx = json_object_get(c, "context");
    if ((!want && !json_is_string(want_err)) || (want && !json_is_string(want)) || !json_is_object(ctx)) {
        json_object_set_new(detail, "reason", json_string("case needs a context object and an expected string or error"));
        fail(t, limitation, detail, verbose);
        json_decref(c);
        return;
    }
    char *out = NULL;
    size_t n = 0;
    lm_err e = { { 0 } };
    lm_template *own = NULL;
    int rc = 0;
    if (parse_err) {
        json_object_set_new(detail, "reason", json_string("template does not parse"));
        json_object_set_new(detail, "got_error", json_string(parse_err));
        fail(t, limitation, detail, verbose);
        json_decref(c);
        return;
    }
    if (!tpl) { /* TEMPLATE "-": the case carries its own source */
        const json_t *src = json_object_get(c, "template");
        if (!json_is_string(src)) rc = lm_errf(&e, "case has no template source");
        else rc = lm_template_parse(json_string_value(src), json_string_length(src), "template", &own, &e);
    }
    if (rc == 0) rc = lm_template_render(tpl ? tpl : own, ctx, opts, &out, &n, &e);
    lm_template_free(own);
    bool ok;
    if (want_err) {
        bool any_msg = limitation; /* the JS engine's own message */
        ok = rc != 0 && (any_msg || strstr(e.msg, json_string_value(want_err)) != NULL);
        if (ok && any_msg) t->lim_err_any++;
        if (!ok) {
            json_object_set_new(detail, "reason", json_string(rc ? "wrong error message" : "rendered, but an error was expected"));
            json_object_set(detail, "expected_error", (json_t *)want_err);
            if (rc) json_object_set_new(detail, "got_error", json_string(e.msg));
            else json_object_set_new(detail, "got", snippet(out, n, 0));
        }
    } else if (rc) {
        ok = false;
        json_object_set_new(detail, "reason", json_string("render failed"));
        json_object_set_new(detail, "got_error", json_string(e.msg));
    } else {
        const char *w = json_string_value(want);
        size_t wn = json_string_length(want);
        ok = wn == n && !memcmp(w, out, n);
        if (!ok) {
            size_t off = 0;
            while (off < n && off < wn && w[off] == out[off]) off++;
            json_object_set_new(detail, "reason", json_string("output differs"));
            json_object_set_new(detail, "offset", json_integer((json_int_t)off));
            json_object_set_new(detail, "expected_len", json_integer((json_int_t)wn));
            json_object_set_new(detail, "got_len", json_integer((json_int_t)n));
            json_object_set_new(detail, "expected", snippet(w, wn, off));
            json_object_set_new(detail, "got", snippet(out, n, off));
        }
    }
    free(out);
    if (ok) {
        t->passed++;
        if (limitation) t->lim_passed++;
        json_decref(detail);
    } else {
        fail(t, limitation, detail, verbose);
    }
    json_decref(c);
}

int lm_cmd_check_template(int argc, char **argv) {
    check_template_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    const char *tpl_path = o.tpl, *cases_path = o.cases;
    const bool verbose = o.verbose;
    lm_template_opts opts = { .now = o.now };
    if (!tpl_path || !cases_path) {
        lm_opts_help(&k_cmd, stderr);
        return 2;
    }
    lm_err e = { { 0 } };
    char *src;
    size_t len;
    lm_template *tpl = NULL;
    const char *parse_err = NULL;
    int rc = 0;
    if (!strcmp(tpl_path, "-")) goto cases;
    if (lm_template_load_source(tpl_path, &src, &len, &e)) {
        fprintf(stderr, "lumen check-template: %s\n", e.msg);
        return 1;
    }
    const char *base = strrchr(tpl_path, '/');
    rc = lm_template_parse(src, len, base ? base + 1 : tpl_path, &tpl, &e);
    free(src);
    if (rc) {
        fprintf(stderr, "lumen check-template: %s\n", e.msg);
        parse_err = e.msg; /* every case fails with it */
    }
cases:;
    FILE *f = fopen(cases_path, "rb");
    if (!f) {
        fprintf(stderr, "lumen check-template: %s: cannot open\n", cases_path);
        lm_template_free(tpl);
        return 1;
    }
    tally t = { 0 };
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int lineno = 0;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t k = (size_t)got;
        while (k && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ')) line[--k] = 0;
        if (k == 0) continue;
        check_case(tpl, parse_err, line, lineno, &opts, &t, verbose);
    }
    free(line);
    fclose(f);
    lm_template_free(tpl);
    json_t *r = json_object();
    json_object_set_new(r, "passed", json_integer(t.passed));
    json_object_set_new(r, "failed", json_integer(t.failed));
    json_object_set_new(r, "total", json_integer(t.passed + t.failed));
    json_object_set_new(r, "reference_limitation",
                        json_pack("{s:i,s:i,s:i}", "passed", t.lim_passed, "failed", t.lim_failed,
                                  "error_text_not_compared", t.lim_err_any));
    json_object_set_new(r, "first_failure", t.first ? t.first : json_null());
    char *d = json_dumps(r, JSON_COMPACT);
    printf("%s\n", d ? d : "{}");
    free(d);
    json_decref(r);
    if (t.passed + t.failed == 0) {
        fprintf(stderr, "lumen check-template: %s has no cases\n", cases_path);
        return 1;
    }
    return t.failed ? 1 : 0;
}
