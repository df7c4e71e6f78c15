/* test_server_parse_harness.c - the chunking harness behind pp_check_case
 * (see test_server_parse.h).
 *
 * One run pushes the case text through the pipeline the server uses
 * (lm_stop_matcher -> lm_reasoning_parser -> lm_toolcall_parser), fed in the
 * chunks a cut list describes, and records everything that came out: the
 * concatenated content and reasoning deltas, the tool calls assembled from
 * their deltas (by index), the committed calls from the parser and whether a
 * stop string matched. Every delta is checked on the way (valid UTF-8, no tag
 * text, a call's id and name on its first delta only, indices in order).
 * A run is summarised as one string so that runs compare with strcmp. */
#include "test_server_parse.h"

#include "chat/lm_parse.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- small buffer ---------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static const char *sb_str(const sbuf *b) { return b->p ? b->p : ""; }

/* ---- one run ------------------------------------------------------------------ */

typedef struct pp_call {
    char *id, *name;
    sbuf args;
} pp_call;

typedef struct pp_run {
    const pp_case *c;
    const char *how; /* which chunking, for messages */
    bool utf8_in;    /* the input is valid UTF-8, so every delta must be */
    sbuf content, reasoning;
    pp_call calls[16];
    int n_calls;
    char *committed; /* lm_toolcall_parser_calls_json, dumped */
    int n_committed;
    bool stopped;
    int errors;
} pp_run;

static void run_free(pp_run *r) {
    free(r->content.p);
    free(r->reasoning.p);
    for (int i = 0; i < r->n_calls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].args.p);
    }
    free(r->committed);
    memset(r, 0, sizeof *r);
}

#define RUN_FAIL(r, ...)                                                         \
    do {                                                                         \
        fprintf(stderr, "  [%s, %s] ", (r)->c->name, (r)->how);                  \
        fprintf(stderr, __VA_ARGS__);                                            \
        fprintf(stderr, "\n");                                                   \
        (r)->errors++;                                                           \
    } while (0)

static bool utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || i + len > n) return false;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

static bool contains(const char *s, size_t n, const char *pat) {
    size_t m = strlen(pat);
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(s + i, pat, m) == 0) return true;
    return false;
}

static const char *const TAGS[] = {
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>",
};

/* A content or reasoning delta: valid UTF-8, and (for well-formed cases) no
 * tag text, whole or cut: the text of a real tag never reaches the output. */
static void text_delta(pp_run *r, sbuf *to, const char *what, const char *s, size_t n) {
    if (r->utf8_in && n && !utf8_valid(s, n)) RUN_FAIL(r, "%s delta is not valid UTF-8: \"%.*s\"", what, (int)n, s);
    if (!r->c->tags_in_content)
        for (size_t i = 0; i < LM_COUNT(TAGS); i++)
            if (contains(s, n, TAGS[i])) RUN_FAIL(r, "%s delta holds the tag %s", what, TAGS[i]);
    if (n && s[n] != 0) RUN_FAIL(r, "%s delta is not NUL-terminated", what);
    sb_put(to, s, n);
}

static void tool_out(pp_run *r, const lm_toolcall_out *o) {
    text_delta(r, &r->content, "content", o->content, o->content_len);
    int last = -1;
    for (int i = 0; i < o->n_calls; i++) {
        const lm_toolcall_delta *d = &o->calls[i];
        if (d->index <= last) RUN_FAIL(r, "tool-call deltas out of order (%d after %d)", d->index, last);
        last = d->index;
        if (r->utf8_in && d->args_len && !utf8_valid(d->args, d->args_len))
            RUN_FAIL(r, "arguments fragment is not valid UTF-8: \"%.*s\"", (int)d->args_len, d->args);
        if (d->args[d->args_len] != 0) RUN_FAIL(r, "arguments fragment is not NUL-terminated");
        if (d->index == r->n_calls) { /* a new call: id and name first */
            if (!d->id || !d->name) {
                RUN_FAIL(r, "first delta of call %d lacks id or name", d->index);
                continue;
            }
            if (r->n_calls == (int)LM_COUNT(r->calls)) abort();
            pp_call *pc = &r->calls[r->n_calls++];
            pc->id = strdup(d->id);
            pc->name = strdup(d->name);
            sb_put(&pc->args, "", 0);
        } else if (d->index < r->n_calls) {
            if (d->id || d->name) RUN_FAIL(r, "call %d: id or name repeated", d->index);
        } else {
            RUN_FAIL(r, "call index %d skips %d", d->index, r->n_calls);
            continue;
        }
        sb_put(&r->calls[d->index].args, d->args, d->args_len);
    }
    /* the OpenAI delta JSON must build (and be absent without deltas) */
    json_t *j = lm_toolcall_out_json(o);
    if ((j != NULL) != (o->n_calls > 0)) RUN_FAIL(r, "lm_toolcall_out_json presence");
    if (j) {
        for (size_t i = 0; i < json_array_size(j); i++) {
            json_t *e = json_array_get(j, i);
            bool first = o->calls[i].id != NULL;
            if (!json_is_integer(json_object_get(e, "index")) ||
                !json_is_string(json_object_get(json_object_get(e, "function"), "arguments")) ||
                first != json_is_string(json_object_get(e, "id")) ||
                first != json_is_string(json_object_get(e, "type")) ||
                first != json_is_string(json_object_get(json_object_get(e, "function"), "name")))
                RUN_FAIL(r, "bad delta JSON element %zu", i);
        }
        json_decref(j);
    }
}

typedef struct pipe {
    pp_run *r;
    lm_stop_matcher *stop;
    lm_reasoning_parser *think;
    lm_toolcall_parser *tools;
} pipe_t;

static void to_tools(pipe_t *pp, const char *s, size_t n) {
    if (!pp->tools) {
        text_delta(pp->r, &pp->r->content, "content", s, n);
        return;
    }
    lm_toolcall_out o;
    lm_toolcall_parser_feed(pp->tools, s, n, &o);
    tool_out(pp->r, &o);
}

static void to_think(pipe_t *pp, const char *s, size_t n) {
    if (!pp->think) {
        to_tools(pp, s, n);
        return;
    }
    lm_reasoning_delta d;
    lm_reasoning_parser_feed(pp->think, s, n, &d);
    text_delta(pp->r, &pp->r->reasoning, "reasoning", d.reasoning, d.reasoning_len);
    to_tools(pp, d.content, d.content_len);
}

static void feed(pipe_t *pp, const char *s, size_t n) {
    if (!pp->stop) {
        to_think(pp, s, n);
        return;
    }
    lm_stop_result sr;
    lm_stop_matcher_feed(pp->stop, s, n, &sr);
    pp->r->stopped = sr.stopped;
    to_think(pp, sr.text, sr.len);
}

/* Feeds c->text cut before each offset in cuts (ascending; equal offsets give
 * empty chunks), then finishes every stage in order. */
static void run_case(const pp_case *c, json_t *tools, const size_t *cuts, int ncuts, bool atomic, const char *how,
                     pp_run *r) {
    memset(r, 0, sizeof *r);
    r->c = c;
    r->how = how;
    r->utf8_in = utf8_valid(c->text, strlen(c->text));
    pipe_t pp = { .r = r };
    lm_err err = { { 0 } };
    if (c->stops) {
        int n = 0;
        while (c->stops[n]) n++;
        pp.stop = lm_stop_matcher_create(c->stops, NULL, n);
    }
    if (c->think) {
        lm_reasoning_opts o = { c->think_tags[0], c->think_tags[1], c->think_open, c->think_implicit };
        pp.think = lm_reasoning_parser_create(&o, &err);
        if (!pp.think) abort();
    }
    if (c->tools) {
        lm_toolcall_opts o = { .tools = tools, .id_seed = 42, .atomic = atomic };
        pp.tools = lm_toolcall_parser_create(&o, &err);
        if (!pp.tools) abort();
    }

    size_t len = strlen(c->text), prev = 0;
    for (int k = 0; k <= ncuts && !r->stopped; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        feed(&pp, c->text + prev, end - prev);
        prev = end;
    }
    if (pp.stop) {
        lm_stop_result sr;
        lm_stop_matcher_finish(pp.stop, &sr);
        to_think(&pp, sr.text, sr.len);
    }
    if (pp.think) {
        lm_reasoning_delta d;
        lm_reasoning_parser_finish(pp.think, &d);
        text_delta(r, &r->reasoning, "reasoning", d.reasoning, d.reasoning_len);
        to_tools(&pp, d.content, d.content_len);
    }
    if (pp.tools) {
        lm_toolcall_out o;
        r->n_committed = lm_toolcall_parser_finish(pp.tools, &o);
        tool_out(r, &o);
        json_t *calls = lm_toolcall_parser_calls_json(pp.tools);
        if ((int)json_array_size(calls) != r->n_committed) RUN_FAIL(r, "finish count != calls_json size");
        r->committed = json_dumps(calls, JSON_COMPACT);
        json_decref(calls);
    }
    lm_stop_matcher_free(pp.stop);
    lm_reasoning_parser_free(pp.think);
    lm_toolcall_parser_free(pp.tools);
}

/* Everything a run produced, as one comparable string. */
static char *summary(const pp_run *r) {
    sbuf b = { 0 };
    sb_puts(&b, "content=[");
    sb_put(&b, sb_str(&r->content), r->content.n);
    sb_puts(&b, "]\nreasoning=[");
    sb_put(&b, sb_str(&r->reasoning), r->reasoning.n);
    sb_puts(&b, "]\nstreamed=");
    for (int i = 0; i < r->n_calls; i++) {
        sb_puts(&b, "{");
        sb_puts(&b, r->calls[i].id);
        sb_puts(&b, " ");
        sb_puts(&b, r->calls[i].name);
        sb_puts(&b, " ");
        sb_put(&b, sb_str(&r->calls[i].args), r->calls[i].args.n);
        sb_puts(&b, "}");
    }
    sb_puts(&b, "\ncommitted=");
    sb_puts(&b, r->committed ? r->committed : "-");
    sb_puts(&b, r->stopped ? "\nstopped" : "\nnot stopped");
    return b.p;
}

/* ---- expected results ------------------------------------------------------------ */

static int str_check(pp_run *r, const char *what, const char *got, const char *want) {
    if (strcmp(got, want) == 0) return 0;
    RUN_FAIL(r, "%s:\n    got  [%s]\n    want [%s]", what, got, want);
    return 1;
}

static bool id_ok(const char *id) {
    if (strncmp(id, "call_", 5) != 0 || strlen(id) != 29) return false;
    for (const char *q = id + 5; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9'))) return false;
    return true;
}

static void check_expected(pp_run *r, bool atomic) {
    const pp_case *c = r->c;
    str_check(r, "content", sb_str(&r->content), c->content ? c->content : "");
    str_check(r, "reasoning", sb_str(&r->reasoning), c->reasoning ? c->reasoning : "");
    if (r->stopped != c->stopped) RUN_FAIL(r, "stopped = %d, want %d", r->stopped, c->stopped);
    if (!c->tools) return;

    json_t *want = json_loads(c->calls ? c->calls : "[]", 0, NULL);
    json_t *got = json_loads(r->committed, 0, NULL);
    if (!want || !got) abort();
    if (json_array_size(got) != json_array_size(want)) {
        RUN_FAIL(r, "%zu calls committed, want %zu: %s", json_array_size(got), json_array_size(want), r->committed);
    } else {
        for (size_t i = 0; i < json_array_size(want); i++) {
            json_t *w = json_array_get(want, i), *g = json_array_get(got, i);
            json_t *fn = json_object_get(g, "function");
            const char *name = json_string_value(json_object_get(fn, "name"));
            const char *args = json_string_value(json_object_get(fn, "arguments"));
            const char *id = json_string_value(json_object_get(g, "id"));
            if (!name || !args || !id || !lm_streq(json_string_value(json_object_get(g, "type")), "function")) {
                RUN_FAIL(r, "call %zu is not OpenAI-shaped: %s", i, r->committed);
                continue;
            }
            if (!id_ok(id)) RUN_FAIL(r, "call %zu: bad id %s", i, id);
            str_check(r, "call name", name, json_string_value(json_object_get(w, "name")));
            json_t *pa = json_loads(args, JSON_DECODE_ANY, NULL);
            if (!json_is_object(pa)) RUN_FAIL(r, "call %zu: arguments are not a JSON object: %s", i, args);
            else if (!json_equal(pa, json_object_get(w, "arguments"))) {
                char *ws = json_dumps(json_object_get(w, "arguments"), JSON_COMPACT);
                RUN_FAIL(r, "call %zu arguments:\n    got  %s\n    want %s", i, args, ws);
                free(ws);
            }
            json_decref(pa);
            if (i == 0 && c->args_exact) str_check(r, "exact arguments", args, c->args_exact);
        }
    }
    /* the deltas assemble into the committed calls, plus the partial ones */
    int want_streamed = (int)json_array_size(want) + (atomic ? 0 : c->partial);
    if (r->n_calls != want_streamed) RUN_FAIL(r, "%d calls streamed, want %d", r->n_calls, want_streamed);
    for (size_t i = 0; i < json_array_size(got); i++) {
        json_t *g = json_array_get(got, i);
        const char *id = json_string_value(json_object_get(g, "id"));
        json_t *fn = json_object_get(g, "function");
        int k = 0;
        while (k < r->n_calls && strcmp(r->calls[k].id, id) != 0) k++;
        if (k == r->n_calls) {
            RUN_FAIL(r, "committed call %s was never streamed", id);
            continue;
        }
        str_check(r, "streamed name", r->calls[k].name, json_string_value(json_object_get(fn, "name")));
        str_check(r, "streamed arguments", sb_str(&r->calls[k].args), json_string_value(json_object_get(fn, "arguments")));
    }
    json_decref(want);
    json_decref(got);
}

/* ---- chunkings --------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static uint64_t name_seed(const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
    return h | 1;
}

/* Random cuts: mostly short chunks, some long ones, some empty ones. */
static int random_cuts(size_t len, uint64_t *seed, size_t *cuts, int max) {
    int n = 0;
    size_t at = 0;
    while (n < max) {
        uint64_t r = rng_next(seed);
        size_t step = r % 8 == 0 ? (size_t)(r >> 8) % 64 : r % 8 == 1 ? 0 : 1 + (size_t)(r >> 8) % 6;
        at += step;
        if (at >= len) break;
        cuts[n++] = at;
    }
    return n;
}

/* Runs one chunking and compares it with the reference summary. */
static int compare_run(const pp_case *c, json_t *tools, const size_t *cuts, int ncuts, bool atomic, const char *how,
                       const char *ref) {
    pp_run r;
    run_case(c, tools, cuts, ncuts, atomic, how, &r);
    char *s = summary(&r);
    int fails = r.errors;
    if (strcmp(s, ref) != 0) {
        fprintf(stderr, "  [%s, %s%s] differs from the whole-text run:\n--- whole\n%s\n--- this\n%s\n", c->name, how,
                atomic ? ", atomic" : "", ref, s);
        fails++;
    }
    free(s);
    run_free(&r);
    return fails;
}

static int check_chunkings(const pp_case *c, json_t *tools, bool atomic, const char *ref, int n_random, size_t splits) {
    size_t len = strlen(c->text);
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    int fails = 0;
    char how[64];
    /* byte by byte */
    for (size_t i = 0; i + 1 < len; i++) cuts[i] = i + 1;
    fails += compare_run(c, tools, cuts, len ? (int)len - 1 : 0, atomic, "byte by byte", ref);
    /* every split into two chunks (or `splits` of them, spread out) */
    size_t stride = splits && len > splits ? len / splits : 1;
    for (size_t k = 1; k < len && fails < 5; k += stride) {
        cuts[0] = k;
        snprintf(how, sizeof how, "split at %zu", k);
        fails += compare_run(c, tools, cuts, 1, atomic, how, ref);
    }
    /* random */
    uint64_t seed = name_seed(c->name) ^ (atomic ? 0x5555 : 0);
    for (int t = 0; t < n_random && fails < 5; t++) {
        int n = random_cuts(len, &seed, cuts, (int)len + 1);
        snprintf(how, sizeof how, "random chunking %d", t);
        fails += compare_run(c, tools, cuts, n, atomic, how, ref);
    }
    free(cuts);
    return fails;
}

static int check_mode(const pp_case *c, bool atomic, bool expected, int n_random, size_t splits) {
    json_t *tools = c->tools_json ? json_loads(c->tools_json, 0, NULL) : NULL;
    if (c->tools_json && !tools) abort();
    pp_run whole;
    run_case(c, tools, NULL, 0, atomic, atomic ? "whole, atomic" : "whole", &whole);
    if (expected) check_expected(&whole, atomic);
    int fails = whole.errors;
    char *ref = summary(&whole);
    run_free(&whole);
    fails += check_chunkings(c, tools, atomic, ref, n_random, splits);
    free(ref);
    json_decref(tools);
    return fails;
}

int pp_check_case(const pp_case *c) {
    int fails = check_mode(c, false, true, 24, 0);
    if (c->tools) fails += check_mode(c, true, true, 8, 64); /* atomic: fewer splits */
    return fails;
}

int pp_check_consistent(const pp_case *c, int n_random, size_t splits) {
    int fails = check_mode(c, false, false, n_random, splits);
    if (c->tools) fails += check_mode(c, true, false, n_random / 2, splits);
    return fails;
}
