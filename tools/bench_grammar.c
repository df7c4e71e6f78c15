/* bench_grammar.c - structured output's costs (issue #32).
 *
 *   bench_grammar [--tokenizer DIR] [--model DIR] [--threads N] [--device cpu|cuda] [--requests N]
 *                 [--only-ahead 1] [--only-masks 1]
 *
 * 1. Token masks over a real vocabulary (default: the Qwen3 tokenizer of
 *    ../shared/fixtures, 151,669 ids): the vocabulary's trie build, each
 *    schema of tests/data/schemas compiled (best of 5), then 8 random
 *    walks per schema through fresh grammars (the mask cache starts cold),
 *    every lm_grammar_mask timed: p50 / p99 / mean / max, and the same for
 *    the misses alone (masks computed, not found in the cache). The same
 *    for nested documents replayed token by token through response_format
 *    json_object's grammar (each depth a new stack set), and for a Hermes
 *    tool-call grammar of 250 generated tools. Each twice:
 *    misses built from per-element tables (the default) and by walking
 *    the vocabulary with the whole stacks, on the same walks (a hash of
 *    every mask says whether both ways gave the same masks).
 * 2. Decode on the demo model through the engine (greedy, 1 request):
 *    tokens per second without a grammar, with a JSON schema, and with the
 *    250-tool call grammar (each the median ratio of 9 rounds of one run
 *    without and one with, and its mask time per mask; the tools are only in
 *    the grammar: 250 tool definitions do not fit the demo model's
 *    4,096-token context), and a schema of long fixed keys with strict
 *    fill off and on, each the best of 3 runs.
 * 3. Masks computed during the forward against after it (mask_ahead):
 *    --requests (4) constrained requests at once, 7 rounds alternating
 *    which goes first.
 * Parts 2 and 3 run the model on --device (cpu; cuda: the first GPU);
 * --only-ahead 1 runs part 3 alone; --only-masks 1 part 1 alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <pthread.h>

#include "../src/backend/lm_backend.h"
#include "../src/engine/lm_engine.h"
#include "../src/grammar/lm_grammar.h"
#include "../src/tokenizer/lm_tokenizer.h"

static lm_grammar_vocab *vocab_of(const lm_tokenizer *tok, int n, int32_t end) {
    const char **b = calloc((size_t)n, sizeof *b);
    size_t *l = calloc((size_t)n, sizeof *l);
    lm_tok_str t = { 0 };
    for (int id = 0; id < n && id < lm_tokenizer_n_vocab(tok); id++) {
        if (lm_tokenizer_is_special(tok, id) || !lm_tokenizer_token_bytes(tok, id, &t)) continue;
        char *c = malloc(t.len + 1);
        memcpy(c, t.s, t.len);
        b[id] = c, l[id] = t.len;
    }
    lm_tok_str_free(&t);
    lm_grammar_vocab *v = lm_grammar_vocab_create(n, b, l, &end, 1);
    for (int id = 0; id < n; id++) free((char *)b[id]);
    free(b), free(l);
    return v;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct times {
    double *v;
    int n, cap;
} times;

static void t_add(times *t, double x) {
    if (t->n == t->cap) t->cap = t->cap ? t->cap * 2 : 1024, t->v = realloc(t->v, (size_t)t->cap * sizeof *t->v);
    t->v[t->n++] = x;
}

static void t_print(const char *what, times *t) {
    if (!t->n) return;
    qsort(t->v, (size_t)t->n, sizeof *t->v, cmp_d);
    double sum = 0;
    for (int i = 0; i < t->n; i++) sum += t->v[i];
    printf("  %-28s n %6d  p50 %8.1f us  p99 %9.1f us  mean %8.1f us  max %9.1f us\n", what, t->n,
           t->v[t->n / 2] * 1e6, t->v[(int)(t->n * 0.99)] * 1e6, sum / t->n * 1e6, t->v[t->n - 1] * 1e6);
}

static uint64_t rnd(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* m's mask into mask, timed into all (and miss when the cache lacked it),
 * its words folded into hash. */
static void timed_mask(lm_grammar *g, lm_grammar_matcher *m, uint32_t *mask, int words, times *all, times *miss,
                       uint64_t *hash) {
    lm_grammar_stats s0, s1;
    lm_grammar_get_stats(g, &s0);
    double t0 = lm_now();
    lm_grammar_mask(m, mask);
    double dt = lm_now() - t0;
    lm_grammar_get_stats(g, &s1);
    t_add(all, dt);
    if (s1.mask_hits == s0.mask_hits) t_add(miss, dt);
    for (int i = 0; i < words; i++) *hash = (*hash ^ mask[i]) * 0x100000001B3ull;
}

/* Random walks (as tests/test_grammar_schemas.c) timing every mask. */
static void walks(lm_grammar *g, const lm_grammar_vocab *v, int n_vocab, int32_t end, int n_walks, times *all,
                  times *miss, uint64_t *hash) {
    const int words = lm_grammar_mask_words(n_vocab);
    uint32_t *mask = malloc((size_t)words * 4);
    int32_t *ids = malloc((size_t)n_vocab * sizeof *ids);
    for (int w = 0; w < n_walks; w++) {
        lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
        uint64_t x = (uint64_t)w * 0x9E3779B97F4A7C15ull + 1;
        for (int step = 0; step < 400; step++) {
            timed_mask(g, m, mask, words, all, miss, hash);
            int n = 0;
            for (int id = 0; id < n_vocab; id++)
                if ((mask[id >> 5] >> (id & 31)) & 1) ids[n++] = id;
            if (!n) break;
            /* lean to the end token, and to short tokens, so values end */
            int32_t id = ids[rnd(&x) % (uint64_t)n];
            if (lm_grammar_can_end(m)) id = end;
            if (!lm_grammar_accept(m, id) || id == end) break;
        }
        lm_grammar_matcher_free(m);
    }
    free(mask), free(ids);
}

/* A nested JSON document (objects and arrays down to depth 6, strings,
 * numbers, literals), as a model answering response_format json_object
 * might write it. */
static void nested_json(FILE *f, uint64_t *x, int depth) {
    static const char *keys[] = { "id", "name", "items", "config", "children", "value", "tags", "meta" };
    static const char *words[] = { "alpha", "build the index", "src/main.c", "ok", "Zürich", "two words" };
    const bool obj = rnd(x) % 2 == 0;
    const int n = 2 + (int)(rnd(x) % 3);
    fputc(obj ? '{' : '[', f);
    for (int i = 0; i < n; i++) {
        if (i) fputs(", ", f);
        if (obj) fprintf(f, "\"%s\": ", keys[rnd(x) % LM_COUNT(keys)]);
        const int kind = depth < 6 ? (int)(rnd(x) % 5) : 2 + (int)(rnd(x) % 3);
        if (kind < 2) nested_json(f, x, depth + 1);
        else if (kind == 2) fprintf(f, "\"%s\"", words[rnd(x) % LM_COUNT(words)]);
        else if (kind == 3) fprintf(f, "%d", (int)(rnd(x) % 20000) - 100);
        else fputs(rnd(x) % 2 ? "true" : "null", f);
    }
    fputc(obj ? '}' : ']', f);
}

/* Masks timed at every token of a nested document (the root an object),
 * as the tokenizer splits it. */
static void replay(lm_grammar *g, const lm_grammar_vocab *v, int n_vocab, lm_tokenizer *tok, uint64_t seed,
                   times *all, times *miss, uint64_t *hash) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
    fputs("{\"result\": ", f);
    nested_json(f, &x, 1);
    fputc('}', f);
    fclose(f);
    lm_tok_ids ids = { 0 };
    lm_err e = { { 0 } };
    const int words = lm_grammar_mask_words(n_vocab);
    uint32_t *mask = malloc((size_t)words * 4);
    lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
    if (!lm_tokenizer_encode(tok, text, len, false, &ids, &e))
        for (size_t i = 0; i < ids.n; i++) {
            timed_mask(g, m, mask, words, all, miss, hash);
            if (!lm_grammar_accept(m, ids.ids[i])) {
                fprintf(stderr, "replay: token %zu of %zu refused\n", i, ids.n);
                break;
            }
        }
    lm_grammar_matcher_free(m);
    lm_tok_ids_free(&ids);
    free(mask), free(text);
}

/* A Hermes call grammar over n generated tools (constrain.c's form). */
static char *tools_gbnf(int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fputs("root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall ::= ", f);
    for (int i = 0; i < n; i++) fprintf(f, "%s\"{\\\"name\\\": \\\"tool_%03d\\\", \\\"arguments\\\": \" a%d \"}\"", i ? " | " : "", i, i);
    fputc('\n', f);
    for (int i = 0; i < n; i++) {
        char prefix[16], schema[1024];
        snprintf(prefix, sizeof prefix, "a%d", i);
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"path_%d\":{\"type\":\"string\"},\"count_%d\":{\"type\":\"integer\","
                 "\"minimum\":0,\"maximum\":%d},\"mode\":{\"enum\":[\"fast\",\"safe\",\"m%d\"]},\"dry\":{\"type\":\"boolean\"}},"
                 "\"required\":[\"path_%d\"],\"additionalProperties\":false}",
                 i, i, 10 + i, i, i);
        json_t *s = json_loads(schema, 0, NULL);
        lm_err e = { { 0 } };
        if (lm_schema_append_gbnf(f, s, prefix, &e)) fprintf(stderr, "tool %d: %s\n", i, e.msg);
        json_decref(s);
    }
    fclose(f);
    return buf;
}

/* ---- decode ---- */

typedef struct done_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int n;
    double t_first, t_done;
} done_wait;

static void on_tok(void *user, const lm_token_event *ev) {
    done_wait *d = user;
    pthread_mutex_lock(&d->mu);
    if (ev->has_token && d->n++ == 0) d->t_first = lm_now();
    if (ev->done) d->done = true, d->t_done = lm_now();
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* Decode tokens per second after the first token; *steps the engine's. */
static double decode_once(lm_model *m, lm_grammar *g, const lm_grammar_vocab *v, int fill, int max_tokens, int *n_out,
                     uint64_t *steps) {
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 2048, .parallel = 1, .strict_fill = fill };
    if (lm_engine_create(&en, m, &o, &e)) {
        fprintf(stderr, "engine: %s\n", e.msg);
        return 0;
    }
    int32_t prompt[32];
    for (int i = 0; i < 32; i++) prompt[i] = (i * 131 + 7) % 3000 + 20;
    done_wait d = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
    lm_gen_params p = { .sampling = { .temperature = 0 }, .repetition_penalty = 1, .max_tokens = max_tokens,
                        .grammar = g, .grammar_vocab = v };
    lm_request *r = NULL;
    lm_engine_stats s0, s1;
    lm_engine_get_stats(en, &s0);
    if (lm_engine_submit(en, prompt, 32, &p, on_tok, &d, &r, &e) != LM_ENGINE_OK) {
        fprintf(stderr, "submit: %s\n", e.msg);
        lm_engine_free(en);
        return 0;
    }
    pthread_mutex_lock(&d.mu);
    while (!d.done) pthread_cond_wait(&d.cv, &d.mu);
    pthread_mutex_unlock(&d.mu);
    lm_request_release(r);
    lm_engine_get_stats(en, &s1);
    lm_engine_free(en);
    *n_out = d.n;
    *steps = s1.steps - s0.steps;
    return d.n > 1 ? (d.n - 1) / (d.t_done - d.t_first) : 0;
}

/* The best of 3 runs: the machine is shared, the best run is the one least disturbed. */
static double decode(lm_model *m, lm_grammar *g, const lm_grammar_vocab *v, int fill, int max_tokens, int *n_out,
                     uint64_t *steps) {
    double best = 0;
    for (int i = 0; i < 3; i++) {
        double r = decode_once(m, g, v, fill, max_tokens, n_out, steps);
        best = r > best ? r : best;
    }
    return best;
}

/* A grammar's decode against unconstrained decode: 9 rounds, each one
 * run without and one with (alternating which goes first), so both see
 * the same load from the other processes on the machine; the figure is
 * the median of the rounds' ratios (the rates themselves moved 2-3x
 * between runs on the shared VM). Also the mask time per mask over those
 * runs (the first run fills the grammar's cache), to show whether masks
 * are still visible next to a decode step. */
static void decode_vs(lm_model *m, lm_grammar *g, const lm_grammar_vocab *v, const char *what) {
    enum { ROUNDS = 9 };
    double ratio[ROUNDS], with[ROUNDS], without[ROUNDS];
    int n = 0;
    uint64_t steps;
    lm_grammar_stats s0, s1;
    lm_grammar_get_stats(g, &s0);
    for (int i = 0; i < ROUNDS; i++) {
        if (i & 1) with[i] = decode_once(m, g, v, -1, 256, &n, &steps);
        without[i] = decode_once(m, NULL, NULL, -1, 256, &n, &steps);
        if (!(i & 1)) with[i] = decode_once(m, g, v, -1, 256, &n, &steps);
        ratio[i] = without[i] > 0 ? with[i] / without[i] : 0;
    }
    lm_grammar_get_stats(g, &s1);
    qsort(ratio, ROUNDS, sizeof *ratio, cmp_d);
    qsort(with, ROUNDS, sizeof *with, cmp_d);
    qsort(without, ROUNDS, sizeof *without, cmp_d);
    const uint64_t k = s1.masks - s0.masks;
    printf("  %-40s %7.1f tok/s (median; %d tokens) vs %7.1f without: median ratio %.1f %% (%.1f-%.1f)\n", what,
           with[ROUNDS / 2], n, without[ROUNDS / 2], 100 * ratio[ROUNDS / 2], 100 * ratio[0], 100 * ratio[ROUNDS - 1]);
    printf("  %-40s %7.1f us per mask (%llu masks, %.0f %% from the cache)\n", "  its masks",
           k ? (s1.mask_s - s0.mask_s) / (double)k * 1e6 : 0.0, (unsigned long long)k,
           k ? 100.0 * (double)(s1.mask_hits - s0.mask_hits) / (double)k : 0.0);
}

/* Four constrained requests at once (different prompts), greedy, with
 * the masks computed after each forward (mask_ahead -1) or during it (1):
 * tokens per second over the whole batch, and the masks' time per token,
 * all of it and the part the engine thread spent after the forwards. */
typedef struct batch_run {
    double tok_s, mask_us, wait_us;
} batch_run;

static int n_requests = 4;

static batch_run decode_batch(lm_model *m, lm_grammar *g, const lm_grammar_vocab *v, int mask_ahead) {
    enum { NMAX = 64, PROMPT = 32 };
    const int N = n_requests;
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 2048, .parallel = N, .mask_ahead = mask_ahead };
    batch_run br = { 0 };
    if (lm_engine_create(&en, m, &o, &e)) {
        fprintf(stderr, "engine: %s\n", e.msg);
        return br;
    }
    done_wait d[NMAX];
    lm_request *r[NMAX];
    int32_t prompt[NMAX][PROMPT];
    lm_engine_stats s0, s1;
    lm_engine_get_stats(en, &s0);
    const double t0 = lm_now();
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < PROMPT; i++) prompt[k][i] = (i * 131 + 7 + 977 * k) % 3000 + 20;
        d[k] = (done_wait){ .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
        lm_gen_params p = { .sampling = { .temperature = 0 }, .repetition_penalty = 1, .max_tokens = 256,
                            .grammar = g, .grammar_vocab = v };
        if (lm_engine_submit(en, prompt[k], PROMPT, &p, on_tok, &d[k], &r[k], &e) != LM_ENGINE_OK) {
            fprintf(stderr, "submit: %s\n", e.msg);
            exit(1);
        }
    }
    int tokens = 0;
    for (int k = 0; k < N; k++) {
        pthread_mutex_lock(&d[k].mu);
        while (!d[k].done) pthread_cond_wait(&d[k].cv, &d[k].mu);
        pthread_mutex_unlock(&d[k].mu);
        lm_request_release(r[k]);
        tokens += d[k].n;
    }
    const double dt = lm_now() - t0;
    for (int i = 0; i < 1000; i++) { /* the stats are published after the step */
        lm_engine_get_stats(en, &s1);
        if (s1.running == 0) break;
    }
    lm_engine_free(en);
    const double masks = (double)(s1.grammar_masks - s0.grammar_masks);
    br.tok_s = tokens / dt;
    br.mask_us = masks > 0 ? (s1.grammar_mask_s - s0.grammar_mask_s) / masks * 1e6 : 0;
    br.wait_us = masks > 0 ? (s1.grammar_wait_s - s0.grammar_wait_s) / masks * 1e6 : 0;
    return br;
}

/* decode_batch off and on, alternating which goes first, ROUNDS rounds:
 * the median ratio on / off, and the mask times of each. */
static void masks_ahead_vs(lm_model *m, lm_grammar *g, const lm_grammar_vocab *v, const char *what) {
    enum { ROUNDS = 7 };
    double ratio[ROUNDS], off_t[ROUNDS], on_t[ROUNDS], mask[2] = { 0 }, wait[2] = { 0 };
    for (int i = 0; i < ROUNDS; i++) {
        batch_run off, on;
        if (i & 1) on = decode_batch(m, g, v, 1);
        off = decode_batch(m, g, v, -1);
        if (!(i & 1)) on = decode_batch(m, g, v, 1);
        ratio[i] = off.tok_s > 0 ? on.tok_s / off.tok_s : 0;
        off_t[i] = off.tok_s, on_t[i] = on.tok_s;
        mask[0] += off.mask_us / ROUNDS, wait[0] += off.wait_us / ROUNDS;
        mask[1] += on.mask_us / ROUNDS, wait[1] += on.wait_us / ROUNDS;
    }
    qsort(ratio, ROUNDS, sizeof *ratio, cmp_d);
    qsort(off_t, ROUNDS, sizeof *off_t, cmp_d);
    qsort(on_t, ROUNDS, sizeof *on_t, cmp_d);
    printf("  %-40s after: %7.1f tok/s, masks %.2f us a token (%.2f after the forward)\n", what, off_t[ROUNDS / 2],
           mask[0], wait[0]);
    printf("  %-40s during: %7.1f tok/s, masks %.2f us a token (%.2f after the forward): median ratio %.3f "
           "(%.3f-%.3f)\n", "", on_t[ROUNDS / 2], mask[1], wait[1], ratio[ROUNDS / 2], ratio[0], ratio[ROUNDS - 1]);
}

int main(int argc, char **argv) {
    const char *tok_dir = "../shared/fixtures/tokenizers/qwen3", *model_dir = "models/demo";
    int threads = 2;
    const char *device = "cpu";
    bool only_ahead = false, only_masks = false;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokenizer")) tok_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--model")) model_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--requests")) n_requests = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--only-ahead")) only_ahead = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "--only-masks")) only_masks = atoi(argv[i + 1]) != 0;
    }
    if (n_requests < 1 || n_requests > 64 || (strcmp(device, "cpu") && strcmp(device, "cuda"))) {
        fprintf(stderr, "bench_grammar: --requests 1..64, --device cpu|cuda\n");
        return 2;
    }
    lm_err e = { { 0 } };
    lm_tokenizer *tok = NULL;
    if (lm_tokenizer_load(&tok, tok_dir, &e)) return fprintf(stderr, "%s: %s\n", tok_dir, e.msg), 1;
    int n = lm_tokenizer_n_vocab(tok);
    int32_t end = lm_tokenizer_eos(tok);
    double t0 = lm_now();
    lm_grammar_vocab *v = vocab_of(tok, n, end);
    printf("vocabulary %s: %d ids, trie built in %.1f ms\n", tok_dir, n, (lm_now() - t0) * 1e3);

    times compile = { 0 };
    char *tg = tools_gbnf(250);
    for (int way = 0; way < 2 && !only_ahead; way++) { /* 0: tables, 1: whole-stack walks */
        times all = { 0 }, miss = { 0 }, tall = { 0 }, tmiss = { 0 };
        uint64_t hash = 0xCBF29CE484222325ull, made = 0, uses = 0;
        DIR *dir = opendir("tests/data/schemas");
        struct dirent *de;
        if (!way) printf("compile (best of 5):\n");
        while (dir && (de = readdir(dir))) {
            if (!strstr(de->d_name, ".json")) continue;
            char path[512];
            snprintf(path, sizeof path, "tests/data/schemas/%s", de->d_name);
            json_t *s = json_load_file(path, 0, NULL);
            double best = 1e9;
            lm_grammar *g = NULL;
            for (int k = 0; k < (way ? 1 : 5); k++) {
                lm_grammar_unref(g);
                double c0 = lm_now();
                if (lm_grammar_from_schema(&g, s, &e)) return fprintf(stderr, "%s: %s\n", path, e.msg), 1;
                double dt = lm_now() - c0;
                best = dt < best ? dt : best;
            }
            lm_grammar_stats st;
            lm_grammar_get_stats(g, &st);
            if (!way) {
                t_add(&compile, best);
                printf("  %-24s %7.3f ms  (%d rules, %d elements)\n", de->d_name, best * 1e3, st.rules, st.elements);
            }
            lm_grammar_set_tables(g, !way);
            walks(g, v, n, end, 8, &all, &miss, &hash);
            lm_grammar_get_stats(g, &st);
            made += st.tables, uses += st.table_uses;
            lm_grammar_unref(g);
            json_decref(s);
        }
        if (dir) closedir(dir);
        printf("masks over %d ids, 8 walks per schema, cold cache per schema, %s:\n", n,
               way ? "misses walked with the whole stacks" : "misses from per-element tables");
        t_print("every mask", &all);
        t_print("computed (cache misses)", &miss);
        if (!way) printf("  tables made %llu, taken again %llu\n", (unsigned long long)made, (unsigned long long)uses);
        /* response_format json_object: a nested document replayed token by token */
        times jall = { 0 }, jmiss = { 0 };
        json_t *any = json_pack("{s:s}", "type", "object");
        for (int doc = 0; doc < 8; doc++) {
            lm_grammar *jg = NULL;
            if (lm_grammar_from_schema(&jg, any, &e)) return fprintf(stderr, "json_object: %s\n", e.msg), 1;
            lm_grammar_set_tables(jg, !way);
            replay(jg, v, n, tok, (uint64_t)doc + 1, &jall, &jmiss, &hash);
            lm_grammar_unref(jg);
        }
        t_print("json_object replay, every mask", &jall);
        t_print("json_object replay, computed", &jmiss);
        json_decref(any);
        free(jall.v), free(jmiss.v);
        lm_grammar *tools = NULL;
        t0 = lm_now();
        if (lm_grammar_from_gbnf(&tools, tg, strlen(tg), &e)) return fprintf(stderr, "250 tools: %s\n", e.msg), 1;
        if (!way) printf("250 tools: %zu bytes of GBNF compiled in %.1f ms\n", strlen(tg), (lm_now() - t0) * 1e3);
        lm_grammar_set_tables(tools, !way);
        walks(tools, v, n, end, 8, &tall, &tmiss, &hash);
        t_print("250 tools, every mask", &tall);
        t_print("250 tools, computed", &tmiss);
        printf("  hash of every mask: %016llx\n", (unsigned long long)hash);
        free(all.v), free(miss.v), free(tall.v), free(tmiss.v);
        lm_grammar_unref(tools);
    }
    lm_grammar_vocab_free(v);
    lm_tokenizer_free(tok);
    if (only_masks) {
        free(tg), free(compile.v);
        return 0;
    }

    /* decode on the demo model */
    lm_tokenizer *dt = NULL;
    lm_backend *be = !strcmp(device, "cuda") ? lm_cuda_backend_create(0, &e)
                                             : lm_cpu_backend_create(threads, LM_ISA_AUTO, &e);
    lm_model *m = NULL;
    if (!be || lm_tokenizer_load(&dt, model_dir, &e) || lm_model_load(&m, model_dir, be, &e))
        return fprintf(stderr, "%s: %s\n", model_dir, e.msg), 1;
    int32_t dend = lm_tokenizer_token_to_id(dt, "<|im_end|>", 10);
    lm_grammar_vocab *dv = vocab_of(dt, m->cfg.vocab, dend);
    json_t *text = json_loads("{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\",\"minLength\":900,"
                              "\"maxLength\":1000}},\"required\":[\"text\"]}", 0, NULL);
    json_t *keys = json_loads(
        "{\"type\":\"array\",\"minItems\":40,\"maxItems\":40,\"items\":{\"type\":\"object\",\"properties\":{"
        "\"customer_account_identifier\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},"
        "\"billing_address_postal_code_verified\":{\"type\":\"boolean\"},"
        "\"preferred_notification_channel_setting\":{\"enum\":[\"email\",\"sms\"]}},"
        "\"required\":[\"customer_account_identifier\",\"billing_address_postal_code_verified\","
        "\"preferred_notification_channel_setting\"],\"additionalProperties\":false}}", 0, NULL);
    lm_grammar *gt = NULL, *gk = NULL, *g250 = NULL;
    char *tg_any = tools_gbnf(250);
    /* the call grammar repeated, so a long decode stays inside it */
    size_t tl = strlen(tg_any);
    char *rep = malloc(tl + 64);
    memcpy(rep, "root ::= one+\none ::=", 21);
    memcpy(rep + 21, tg_any + 8, tl - 8 + 1);
    if (lm_grammar_from_schema(&gt, text, &e) || lm_grammar_from_schema(&gk, keys, &e) ||
        lm_grammar_from_gbnf(&g250, rep, strlen(rep), &e))
        return fprintf(stderr, "%s\n", e.msg), 1;
    printf("decode, %s on %s, %d threads, greedy, one request:\n", model_dir, device, threads);
    int nt;
    uint64_t steps;
    if (!only_ahead) {
        double base = decode(m, NULL, NULL, -1, 256, &nt, &steps);
        printf("  %-40s %7.1f tok/s (%d tokens)\n", "no grammar", base, nt);
        decode_vs(m, gt, dv, "JSON schema (a long string)");
        decode_vs(m, g250, dv, "250-tool call grammar");
    }
    printf("masks during the forward (mask_ahead), %d constrained requests at once, %d threads, 7 rounds:\n",
           n_requests, threads);
    masks_ahead_vs(m, gt, dv, "JSON schema (a long string)");
    masks_ahead_vs(m, g250, dv, "250-tool call grammar");
    uint64_t s_off, s_on;
    int n_off, n_on;
    if (!only_ahead) {
        double off = decode(m, gk, dv, -1, 1000, &n_off, &s_off);
        double on = decode(m, gk, dv, 0, 1000, &n_on, &s_on);
        printf("  %-40s %7.1f tok/s (%d tokens, %llu steps)\n", "long fixed keys, strict fill off", off, n_off,
               (unsigned long long)s_off);
        printf("  %-40s %7.1f tok/s (%d tokens, %llu steps) = %.2fx\n", "long fixed keys, strict fill on", on, n_on,
               (unsigned long long)s_on, on / off);
    }
    free(rep), free(tg_any), free(tg);
    json_decref(text), json_decref(keys);
    lm_grammar_unref(gt), lm_grammar_unref(gk), lm_grammar_unref(g250);
    lm_grammar_vocab_free(dv);
    lm_model_free(m);
    lm_backend_destroy(be);
    lm_tokenizer_free(dt);
    free(compile.v);
    return 0;
}
