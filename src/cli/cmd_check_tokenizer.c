/* cmd_check_tokenizer.c - `lumen check-tokenizer DIR CASES.jsonl`: compares
 * the tokenizer with expected encodings, one JSON line of results.
 *
 * Each case line holds "text" and any of "ids" (encode without special
 * tokens), "ids_with_special", "tokens" (strings of "ids"), "decoded"
 * (decode(ids) keeping special tokens) and "decoded_with_special"
 * (decode(ids_with_special)). Decoding is checked on the expected ids, so
 * an encode bug does not hide a decode one. The streaming detokenizer must
 * also reproduce "decoded" when its pieces are concatenated. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/lm_tokenizer.h"
#include "cli.h"

typedef struct check_tokenizer_opts {
    const char *dir, *cases;
} check_tokenizer_opts;

static const lm_opt k_opts[] = {
    { LM_OPT_ARG, "DIR", NULL, LM_OPT_AT(check_tokenizer_opts, dir), NULL,
      "a folder with tokenizer.json (and tokenizer_config.json), a model folder, a tokenizer.json file or a .gguf "
      "file" },
    { LM_OPT_ARG, "CASES.jsonl", NULL, LM_OPT_AT(check_tokenizer_opts, cases), NULL,
      "the cases, one JSON object a line" },
    { .kind = LM_OPT_END },
};

static const check_tokenizer_opts k_defaults = { 0 };

static const lm_opt_cmd k_cmd = {
    .name = "check-tokenizer",
    .usage = "lumen check-tokenizer DIR CASES.jsonl",
    .about = "Each line of CASES.jsonl is {\"text\", \"ids\", \"ids_with_special\", \"tokens\",\n"
             "\"decoded\", \"decoded_with_special\"} (fields other than text optional).\n"
             "Prints one JSON line {passed, failed, total, first_failure} and exits 0\n"
             "only if there is at least one case and every case passes.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(check_tokenizer_opts),
};

typedef struct failure {
    int line;
    const char *field;
    json_t *text, *expected, *got;
} failure;

static json_t *ids_json(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static bool ids_equal(json_t *want, const lm_tok_ids *got) {
    if (json_array_size(want) != got->n) return false;
    for (size_t i = 0; i < got->n; i++) {
        json_t *v = json_array_get(want, i);
        if (!json_is_integer(v) || json_integer_value(v) != got->ids[i]) return false;
    }
    return true;
}

/* Expected ids as an array of int32 (false if not a list of ids). */
static bool ids_from(json_t *a, lm_tok_ids *out) {
    out->n = 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX)
            return false;
        if (out->n == out->cap) {
            out->cap = out->cap ? out->cap * 2 : 64;
            out->ids = realloc(out->ids, out->cap * sizeof *out->ids);
            if (!out->ids) abort();
        }
        out->ids[out->n++] = (int32_t)json_integer_value(v);
    }
    return json_is_array(a);
}

static bool str_equal(json_t *want, const char *s, size_t n) {
    return json_is_string(want) && json_string_length(want) == n && !memcmp(json_string_value(want), s, n);
}

static void note(failure *f, int line, const char *field, json_t *text, json_t *expected, json_t *got) {
    if (f->field) {
        json_decref(got);
        return;
    }
    *f = (failure){ line, field, json_incref(text), json_incref(expected), got };
}

/* Checks one case; returns true if every present field matches. */
static bool check_case(lm_tokenizer *tok, json_t *c, int line, failure *f) {
    json_t *text = json_object_get(c, "text");
    if (!json_is_string(text)) {
        note(f, line, "text", text, NULL, json_string("case has no \"text\" string"));
        return false;
    }
    const char *s = json_string_value(text);
    size_t n = json_string_length(text);
    bool ok = true;
    lm_err e = { { 0 } };
    lm_tok_ids ids = { 0 }, want = { 0 };
    lm_tok_str out = { 0 };
    json_t *v;
    if (lm_tokenizer_encode(tok, s, n, false, &ids, &e)) {
        note(f, line, "ids", text, NULL, json_string(e.msg));
        ok = false;
        goto done;
    }
    if ((v = json_object_get(c, "ids")) && !ids_equal(v, &ids)) {
        note(f, line, "ids", text, v, ids_json(ids.ids, ids.n));
        ok = false;
    }
    if ((v = json_object_get(c, "tokens"))) {
        json_t *got = json_array();
        bool same = json_array_size(v) == ids.n;
        for (size_t i = 0; i < ids.n; i++) {
            size_t l = 0;
            const char *t = lm_tokenizer_id_to_token(tok, ids.ids[i], &l);
            json_array_append_new(got, t ? json_stringn(t, l) : json_null());
            if (same && !(t && str_equal(json_array_get(v, i), t, l))) same = false;
        }
        if (!same) {
            note(f, line, "tokens", text, v, got);
            ok = false;
        } else json_decref(got);
    }
    ids.n = 0;
    if (lm_tokenizer_encode(tok, s, n, true, &ids, &e)) {
        note(f, line, "ids_with_special", text, NULL, json_string(e.msg));
        ok = false;
        goto done;
    }
    if ((v = json_object_get(c, "ids_with_special")) && !ids_equal(v, &ids)) {
        note(f, line, "ids_with_special", text, v, ids_json(ids.ids, ids.n));
        ok = false;
    }
    static const char *const dec_fields[2][2] = { { "ids", "decoded" },
                                                  { "ids_with_special", "decoded_with_special" } };
    for (int k = 0; k < 2; k++) {
        json_t *src = json_object_get(c, dec_fields[k][0]), *exp = json_object_get(c, dec_fields[k][1]);
        if (!exp || !src) continue;
        if (!ids_from(src, &want)) {
            note(f, line, dec_fields[k][0], text, src, json_string("not a list of ids"));
            ok = false;
            continue;
        }
        lm_tokenizer_decode(tok, want.ids, want.n, false, &out);
        if (!str_equal(exp, out.s, out.len)) {
            note(f, line, dec_fields[k][1], text, exp, json_stringn(out.s, out.len));
            ok = false;
        }
        if (k) continue;
        /* the streaming detokenizer, one id at a time */
        lm_detok *d = lm_detok_create(tok, false);
        out.len = 0;
        for (size_t i = 0; i < want.n; i++) lm_detok_push(d, want.ids[i], &out);
        lm_detok_finish(d, &out);
        lm_detok_free(d);
        if (!str_equal(exp, out.s ? out.s : "", out.len)) {
            note(f, line, "decoded (streaming)", text, exp, json_stringn(out.s ? out.s : "", out.len));
            ok = false;
        }
    }
done:
    lm_tok_ids_free(&ids);
    lm_tok_ids_free(&want);
    lm_tok_str_free(&out);
    return ok;
}

int lm_cmd_check_tokenizer(int argc, char **argv) {
    check_tokenizer_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    const char *dir = o.dir, *cases = o.cases;
    if (!dir || !cases) {
        fprintf(stderr, "lumen check-tokenizer: needs DIR and CASES.jsonl (see --help)\n");
        return 2;
    }
    lm_err e = { { 0 } };
    lm_tokenizer *tok;
    double t0 = lm_now();
    if (lm_tokenizer_load(&tok, dir, &e)) {
        fprintf(stderr, "lumen check-tokenizer: %s\n", e.msg);
        return 1;
    }
    double load_s = lm_now() - t0;
    FILE *fp = fopen(cases, "rb");
    if (!fp) {
        fprintf(stderr, "lumen check-tokenizer: %s: cannot open\n", cases);
        lm_tokenizer_free(tok);
        return 1;
    }
    int passed = 0, failed = 0, line = 0;
    failure f = { 0 };
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&buf, &cap, fp)) >= 0) {
        line++;
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
        if (len == 0) continue;
        json_error_t je;
        json_t *c = json_loadb(buf, (size_t)len, JSON_ALLOW_NUL, &je);
        if (!json_is_object(c)) {
            char msg[300];
            snprintf(msg, sizeof msg, "bad JSON at column %d: %s", je.column, je.text);
            note(&f, line, "json", NULL, NULL, json_string(msg));
            failed++;
        } else if (check_case(tok, c, line, &f)) passed++;
        else failed++;
        json_decref(c);
    }
    free(buf);
    fclose(fp);
    json_t *res = json_object();
    json_object_set_new(res, "tokenizer", json_string(dir));
    json_object_set_new(res, "passed", json_integer(passed));
    json_object_set_new(res, "failed", json_integer(failed));
    json_object_set_new(res, "total", json_integer(passed + failed));
    json_object_set_new(res, "load_ms", json_integer((json_int_t)(load_s * 1000)));
    if (f.field) {
        json_t *ff = json_object();
        json_object_set_new(ff, "line", json_integer(f.line));
        json_object_set_new(ff, "field", json_string(f.field));
        json_object_set(ff, "text", f.text ? f.text : json_null());
        json_object_set(ff, "expected", f.expected ? f.expected : json_null());
        json_object_set(ff, "got", f.got ? f.got : json_null());
        json_object_set_new(res, "first_failure", ff);
    } else {
        json_object_set_new(res, "first_failure", json_null());
    }
    char *out = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
    puts(out ? out : "{}");
    free(out);
    json_decref(res);
    json_decref(f.text);
    json_decref(f.expected);
    json_decref(f.got);
    lm_tokenizer_free(tok);
    if (passed + failed == 0) fprintf(stderr, "lumen check-tokenizer: %s has no cases\n", cases);
    return failed == 0 && passed > 0 ? 0 : 1;
}
