/* test_grammar_schemas.c - the corpus of real-world JSON schemas in
 * tests/data/schemas: every output a grammar lets through, over the demo
 * model's real tokenizer, parses and validates against its schema
 * (random walks through the token masks, several seeds; a small validator
 * for the supported subset, patterns checked with PCRE2). Also: schemas
 * lumen cannot honour are refused with the construct named. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "../src/grammar/lm_grammar.h"
#include "../src/tokenizer/lm_tokenizer.h"
#include "lm_test.h"
#include "schema_check.h"

/* ---- random walks ---- */

typedef struct demo_vocab {
    lm_tokenizer *tok;
    lm_grammar_vocab *v;
    int n;
    int32_t eos;
    uint8_t *closing; /* [n] the token has a " } ] or , */
    int stride;       /* masks are checked on ids id % stride == step % stride */
} demo_vocab;

static bool demo_vocab_load(demo_vocab *d, const char *dir, int stride) {
    lm_err e = { { 0 } };
    memset(d, 0, sizeof *d);
    d->stride = stride;
    if (lm_tokenizer_load(&d->tok, dir, &e)) return false;
    d->n = lm_tokenizer_n_vocab(d->tok);
    const char **b = calloc((size_t)d->n, sizeof *b);
    size_t *l = calloc((size_t)d->n, sizeof *l);
    d->closing = calloc((size_t)d->n, 1);
    lm_tok_str t = { 0 };
    for (int id = 0; id < d->n; id++) {
        if (lm_tokenizer_is_special(d->tok, id) || !lm_tokenizer_token_bytes(d->tok, id, &t)) continue;
        char *c = malloc(t.len + 1);
        memcpy(c, t.s, t.len);
        b[id] = c, l[id] = t.len;
        for (size_t i = 0; i < t.len; i++) d->closing[id] |= strchr("\"}],", t.s[i]) != NULL && t.s[i];
    }
    lm_tok_str_free(&t);
    d->eos = lm_tokenizer_token_to_id(d->tok, "<|im_end|>", 10);
    if (d->eos < 0) d->eos = lm_tokenizer_eos(d->tok);
    d->v = lm_grammar_vocab_create(d->n, b, l, &d->eos, 1);
    for (int id = 0; id < d->n; id++) free((char *)b[id]);
    free(b), free(l);
    return true;
}

static void demo_vocab_free(demo_vocab *d) {
    lm_grammar_vocab_free(d->v);
    lm_tokenizer_free(d->tok);
    free(d->closing);
}

static uint64_t rnd(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* One walk: random allowed tokens, leaning towards closing ones so the
 * value ends; the text into out. false when it did not end in limit. */
static bool walk(const demo_vocab *d, lm_grammar *g, uint64_t seed, lm_tok_str *out, int limit, int *mismatch) {
    lm_grammar_matcher *m = lm_grammar_matcher_create(g, d->v);
    uint32_t *mask = malloc((size_t)lm_grammar_mask_words(d->n) * 4);
    int32_t *ids = malloc((size_t)d->n * sizeof *ids);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    out->len = 0;
    bool ended = false;
    for (int step = 0; step < limit && !ended; step++) {
        lm_grammar_mask(m, mask);
        if (mismatch && step < 60) /* the mask (with its shortcuts and cache) is exactly the tokens accepted one by one */
            for (int id = step % d->stride; id < d->n; id += d->stride) {
                bool ok = lm_grammar_accept(m, id);
                if (ok) lm_grammar_rollback(m, 1);
                *mismatch += ok != ((mask[id >> 5] >> (id & 31)) & 1);
            }
        int n = 0, nc = 0;
        /* while checking masks, wander (long strings reach the self-loop shortcut) */
        bool lean = (!mismatch || step >= 60) && rnd(&x) % 100 < (uint64_t)(40 + step / 4);
        for (int id = 0; id < d->n; id++)
            if ((mask[id >> 5] >> (id & 31)) & 1) ids[n++] = id;
        if (lean) {
            for (int i = 0; i < n; i++)
                if (ids[i] == d->eos || d->closing[ids[i]]) ids[nc++] = ids[i];
            if (nc) n = nc;
        }
        if (n == 0) break;
        int32_t id = ids[rnd(&x) % (uint64_t)n];
        if (!lm_grammar_accept(m, id)) break;
        if (id == d->eos) {
            ended = true;
            break;
        }
        size_t bl;
        lm_tok_str t = { 0 };
        lm_tokenizer_token_bytes(d->tok, id, &t);
        bl = t.len;
        out->s = realloc(out->s, out->len + bl + 1);
        memcpy(out->s + out->len, t.s, bl);
        out->len += bl;
        out->s[out->len] = 0;
        lm_tok_str_free(&t);
    }
    free(mask), free(ids);
    lm_grammar_matcher_free(m);
    return ended;
}

#define CORPUS_DIR "tests/data/schemas"

/* The corpus's next schema (a .json file of CORPUS_DIR, opened as dir):
 * its path into path and its JSON into *schema (NULL when it does not
 * parse); false after the last. */
static bool corpus_next(DIR *dir, char *path, size_t n_path, json_t **schema) {
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (!strstr(de->d_name, ".json")) continue;
        snprintf(path, n_path, CORPUS_DIR "/%s", de->d_name);
        *schema = json_load_file(path, 0, NULL);
        return true;
    }
    return false;
}

LM_TEST(grammar_schema_corpus_outputs_validate) {
    demo_vocab d;
    if (!demo_vocab_load(&d, "models/demo", 1)) {
        LM_SKIP("models/demo/tokenizer.json not loadable");
        return;
    }
    DIR *dir = opendir(CORPUS_DIR);
    LM_CHECK(dir);
    if (!dir) return demo_vocab_free(&d);
    int files = 0, outputs = 0;
    char path[512];
    json_t *schema;
    while (corpus_next(dir, path, sizeof path, &schema)) {
        LM_CHECK_MSG(schema, "%s does not parse", path);
        lm_grammar *g = NULL;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(!lm_grammar_from_schema(&g, schema, &e), "%s: %s", path, e.msg);
        files++;
        lm_tok_str out = { 0 };
        int ended = 0;
        for (uint64_t seed = 1; g && seed <= 8; seed++) {
            int bad = 0;
            bool fin = walk(&d, g, seed, &out, 1500, seed == 1 ? &bad : NULL);
            LM_CHECK_MSG(bad == 0, "%s seed %d: %d mask bits differ from accepting the token", path, (int)seed, bad);
            if (!fin) continue;
            ended++;
            json_error_t je;
            json_t *v = json_loadb(out.s, out.len, 0, &je);
            LM_CHECK_MSG(v, "%s seed %d: does not parse: %s\n%s", path, (int)seed, je.text, out.s);
            LM_CHECK_MSG(!v || schema_valid(schema, schema, v), "%s seed %d: invalid:\n%s", path, (int)seed, out.s);
            json_decref(v);
            outputs++;
        }
        LM_CHECK_MSG(ended >= 4, "%s: only %d of 8 walks ended", path, ended);
        free(out.s);
        lm_grammar_unref(g);
        json_decref(schema);
    }
    closedir(dir);
    LM_CHECK(files >= 8 && outputs >= 32);
    demo_vocab_free(&d);
}

/* The same property over the Qwen3 vocabulary (151,669 ids: long tokens,
 * much UTF-8), where the mask's shortcuts do most of the work: the first
 * 60 masks of one walk per schema equal accepting each token, checked on
 * every 24th id (a different residue each step). */
LM_TEST(grammar_schema_corpus_masks_qwen3) {
    demo_vocab d;
    char *qwen3 = lm_test_fixture_path("tokenizers/qwen3");
    bool have = qwen3 && demo_vocab_load(&d, qwen3, 24);
    free(qwen3);
    if (!have) {
        LM_SKIP("%s", lm_test_fixtures_why());
        return;
    }
    DIR *dir = opendir(CORPUS_DIR);
    LM_REQUIRE(dir);
    int files = 0;
    char path[512];
    json_t *schema;
    while (corpus_next(dir, path, sizeof path, &schema)) {
        lm_grammar *g = NULL;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(schema && !lm_grammar_from_schema(&g, schema, &e), "%s: %s", path, e.msg);
        lm_tok_str out = { 0 };
        int bad = 0;
        if (g) walk(&d, g, 3, &out, 60, &bad);
        LM_CHECK_MSG(bad == 0, "%s: %d mask bits differ from accepting the token", path, bad);
        files += g != NULL;
        free(out.s);
        lm_grammar_unref(g);
        json_decref(schema);
    }
    closedir(dir);
    LM_CHECK(files >= 8);
    demo_vocab_free(&d);
}

/* ---- per-element tables against whole-stack walks ---- */

/* A nested JSON document: any JSON (tree 0) or one valid for
 * tree_recursive.json (tree 1: names of at most 10 characters, at most
 * two children). */
static void nested_doc(FILE *f, uint64_t *x, int depth, bool tree) {
    static const char *keys[] = { "id", "items", "children", "value", "tags" };
    static const char *words[] = { "alpha", "src/main.c", "Zürich", "a b" };
    if (tree) {
        fprintf(f, "{\"name\": \"%s\"", words[rnd(x) % LM_COUNT(words)]);
        if (depth < 5 && rnd(x) % 4) {
            const int n = 1 + (int)(rnd(x) % 2);
            fputs(", \"children\": [", f);
            for (int i = 0; i < n; i++) {
                if (i) fputs(", ", f);
                nested_doc(f, x, depth + 1, true);
            }
            fputc(']', f);
        }
        fputc('}', f);
        return;
    }
    const bool obj = depth == 0 || rnd(x) % 2;
    const int n = 2 + (int)(rnd(x) % 2);
    fputc(obj ? '{' : '[', f);
    for (int i = 0; i < n; i++) {
        if (i) fputs(", ", f);
        if (obj) fprintf(f, "\"%s\": ", keys[rnd(x) % LM_COUNT(keys)]);
        const int kind = depth < 5 ? (int)(rnd(x) % 4) : 2 + (int)(rnd(x) % 2);
        if (kind < 2) nested_doc(f, x, depth + 1, false);
        else if (kind == 2) fprintf(f, "\"%s\"", words[rnd(x) % LM_COUNT(words)]);
        else fprintf(f, "%d", (int)(rnd(x) % 2000) - 10);
    }
    fputc(obj ? '}' : ']', f);
}

/* Replays documents token by token through two compilations of schema,
 * masks from tables on one and from whole-stack walks on the other: every
 * mask equal, and every stride-th id (a moving residue) as accepting it
 * says. Returns the steps compared; tables made and taken again into st. */
static int replay_tables_vs_walks(const demo_vocab *d, const char *schema, bool tree, int docs, int *bad,
                                  lm_grammar_stats *st) {
    json_t *s = json_loads(schema, 0, NULL);
    lm_grammar *g[2] = { NULL, NULL };
    lm_err e = { { 0 } };
    for (int i = 0; i < 2; i++)
        if (!s || lm_grammar_from_schema(&g[i], s, &e)) {
            json_decref(s);
            lm_grammar_unref(g[0]);
            *bad += 1;
            return 0;
        }
    lm_grammar_set_tables(g[1], false);
    const int words = lm_grammar_mask_words(d->n);
    uint32_t *mask[2] = { malloc((size_t)words * 4), malloc((size_t)words * 4) };
    int steps = 0;
    for (int doc = 0; doc < docs; doc++) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        uint64_t x = (uint64_t)doc * 0x9E3779B97F4A7C15ull + 11;
        nested_doc(f, &x, 0, tree);
        fclose(f);
        lm_tok_ids ids = { 0 };
        if (lm_tokenizer_encode(d->tok, text, len, false, &ids, &e)) *bad += 1;
        lm_grammar_matcher *m[2] = { lm_grammar_matcher_create(g[0], d->v), lm_grammar_matcher_create(g[1], d->v) };
        for (size_t i = 0; i <= ids.n; i++, steps++) {
            const int n0 = lm_grammar_mask(m[0], mask[0]), n1 = lm_grammar_mask(m[1], mask[1]);
            *bad += n0 != n1 || memcmp(mask[0], mask[1], (size_t)words * 4) != 0;
            for (int id = steps % d->stride; id < d->n; id += d->stride) {
                const bool ok = lm_grammar_accept(m[0], id);
                if (ok) lm_grammar_rollback(m[0], 1);
                *bad += ok != ((mask[0][id >> 5] >> (id & 31)) & 1);
            }
            if (i == ids.n) break;
            const bool a0 = lm_grammar_accept(m[0], ids.ids[i]), a1 = lm_grammar_accept(m[1], ids.ids[i]);
            if (!a0 || !a1) {
                fprintf(stderr, "  doc %d token %zu refused:\n%s\n", doc, i, text);
                *bad += 1;
                break;
            }
        }
        if (!lm_grammar_can_end(m[0])) fprintf(stderr, "  doc %d does not end:\n%s\n", doc, text), *bad += 1;
        lm_grammar_matcher_free(m[0]), lm_grammar_matcher_free(m[1]);
        lm_tok_ids_free(&ids);
        free(text);
    }
    lm_grammar_get_stats(g[0], st);
    free(mask[0]), free(mask[1]);
    lm_grammar_unref(g[0]), lm_grammar_unref(g[1]);
    json_decref(s);
    return steps;
}

/* Masks built from per-element tables (the tokens a stack's top elements
 * allow whatever lies below, and the trie nodes where a path leaves them)
 * equal masks walked with the whole stacks, on nested documents where each
 * depth is a new stack set (json_object, a recursive schema) over the
 * demo's vocabulary and Qwen3's; the tables are made once and taken again
 * at other depths. */
LM_TEST(grammar_schema_tables_equal_walks) {
    static const char *tree_schema = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
                                     "\"string\",\"maxLength\":10},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":"
                                     "\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"name\"],\"additionalProperties\":"
                                     "false}},\"$ref\":\"#/$defs/node\"}";
    char *qwen3 = lm_test_fixture_path("tokenizers/qwen3");
    const char *dirs[] = { "models/demo", qwen3 };
    for (int k = 0; k < 2; k++) {
        demo_vocab d;
        if (!dirs[k] || !demo_vocab_load(&d, dirs[k], k ? 97 : 1)) {
            LM_SKIP("%s", k ? lm_test_fixtures_why() : "models/demo/tokenizer.json not loadable");
            continue;
        }
        for (int tree = 0; tree < 2; tree++) {
            int bad = 0;
            lm_grammar_stats st;
            const int steps = replay_tables_vs_walks(&d, tree ? tree_schema : "{\"type\":\"object\"}", tree,
                                                     6, &bad, &st);
            LM_CHECK_MSG(bad == 0, "%s, %s: %d differences", dirs[k], tree ? "tree" : "json_object", bad);
            LM_CHECK_MSG(steps >= 100, "%s: %d steps", dirs[k], steps);
            LM_CHECK_MSG(st.tables > 0 && st.table_uses > st.tables, "%s, %s: %llu tables made, taken %llu times",
                         dirs[k], tree ? "tree" : "json_object", (unsigned long long)st.tables,
                         (unsigned long long)st.table_uses);
        }
        demo_vocab_free(&d);
    }
    free(qwen3);
}

LM_TEST(grammar_schema_unsupported_named) {
    static const struct {
        const char *schema, *names;
    } bad[] = {
        { "{\"type\":\"object\",\"not\":{}}", "'not'" },
        { "{\"type\":\"object\",\"patternProperties\":{}}", "'patternProperties'" },
        { "{\"type\":\"string\",\"format\":\"ipv6\"}", "ipv6" },
        { "{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences" },
        { "{\"$ref\":\"#/$defs/missing\"}", "does not resolve" },
        { "{\"allOf\":[{\"type\":\"object\"},{\"type\":\"object\"}]}", "allOf" },
        { "{\"type\":\"number\",\"minimum\":-1.5}", "number bounds" },
        { "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer" },
        /* oneOf whose branches overlap: "exactly one" cannot be a grammar of alternatives */
        { "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"maxLength\":3}]}", "oneOf branches 0 and 1" },
        { "{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"},{\"type\":\"number\"}]}", "oneOf branches 0 and 2" },
        { "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"a\",\"b\"]}},\"required\":[\"kind\"]},"
          "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"}},\"required\":[\"kind\"]}]}", "oneOf branches 0 and 1" },
        { "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]},"
          "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}", "oneOf branches 0 and 1" },
    };
    for (size_t i = 0; i < LM_COUNT(bad); i++) {
        json_t *s = json_loads(bad[i].schema, 0, NULL);
        lm_grammar *g = NULL;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(lm_grammar_from_schema(&g, s, &e) != 0 && strstr(e.msg, bad[i].names), "%s: '%s'", bad[i].schema,
                     e.msg);
        lm_grammar_unref(g);
        json_decref(s);
    }
}

/* oneOf where lumen can show the branches exclude each other compiles
 * (and then "at least one" is "exactly one"): types, const/enum values, a
 * required discriminator (through $ref), a required property the other
 * branch forbids. */
LM_TEST(grammar_schema_oneof_exclusive_accepted) {
    static const char *ok[] = {
        "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},{\"type\":\"null\"}]}",
        "{\"oneOf\":[{\"enum\":[1,2]},{\"enum\":[3,\"1\"]},{\"const\":true}]}",
        "{\"$defs\":{\"click\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"click\"}},\"required\":[\"kind\"]}},"
        "\"oneOf\":[{\"$ref\":\"#/$defs/click\"},{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"key\",\"scroll\"]}},"
        "\"required\":[\"kind\"]}]}",
        "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"],"
        "\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"],"
        "\"additionalProperties\":false}]}",
    };
    for (size_t i = 0; i < LM_COUNT(ok); i++) {
        json_t *s = json_loads(ok[i], 0, NULL);
        lm_grammar *g = NULL;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(s && lm_grammar_from_schema(&g, s, &e) == 0, "%s: %s", ok[i], e.msg);
        lm_grammar_unref(g);
        json_decref(s);
    }
}

/* Integer ranges: every value in [lo, hi] and nothing around it. */
LM_TEST(grammar_schema_integer_ranges) {
    static const int r[][2] = { { 0, 7 }, { 3, 120 }, { -50, -3 }, { -12, 130 }, { 99, 1001 } };
    for (size_t i = 0; i < LM_COUNT(r); i++) {
        char buf[128];
        snprintf(buf, sizeof buf, "{\"type\":\"integer\",\"minimum\":%d,\"maximum\":%d}", r[i][0], r[i][1]);
        json_t *s = json_loads(buf, 0, NULL);
        lm_grammar *g = NULL;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(!lm_grammar_from_schema(&g, s, &e), "%s", e.msg);
        json_decref(s);
        if (!g) continue;
        int32_t end = 0;
        const char *one = "x";
        size_t len = 1;
        lm_grammar_vocab *v = lm_grammar_vocab_create(1, &one, &len, &end, 0);
        for (int x = r[i][0] - 30; x <= r[i][1] + 30; x++) {
            lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
            snprintf(buf, sizeof buf, "%d", x);
            bool ok = lm_grammar_accept_bytes(m, buf, strlen(buf)) && lm_grammar_can_end(m);
            LM_CHECK_MSG(ok == (x >= r[i][0] && x <= r[i][1]), "[%d, %d]: %d", r[i][0], r[i][1], x);
            lm_grammar_matcher_free(m);
        }
        lm_grammar_vocab_free(v);
        lm_grammar_unref(g);
    }
}

/* Claude Code's and opencode's Read tools bound offsets by
 * Number.MAX_SAFE_INTEGER (2^53 - 1): accepted, and the bound holds. */
LM_TEST(grammar_schema_integer_safe_integer_bound) {
    json_t *s = json_loads("{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}", 0, NULL);
    lm_grammar *g = NULL;
    lm_err e = { { 0 } };
    const int rc = lm_grammar_from_schema(&g, s, &e);
    json_decref(s);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    LM_REQUIRE(rc == 0);
    int32_t end = 0;
    const char *one = "x";
    size_t len = 1;
    lm_grammar_vocab *v = lm_grammar_vocab_create(1, &one, &len, &end, 0);
    static const struct { const char *text; bool ok; } k[] = {
        { "0", true }, { "120", true }, { "-9007199254740991", true }, { "9007199254740991", true },
        { "9007199254740992", false }, { "-9007199254740992", false }, { "10000000000000000", false },
    };
    for (size_t i = 0; i < LM_COUNT(k); i++) {
        lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
        bool ok = lm_grammar_accept_bytes(m, k[i].text, strlen(k[i].text)) && lm_grammar_can_end(m);
        LM_CHECK_MSG(ok == k[i].ok, "%s: accepted %d", k[i].text, ok);
        lm_grammar_matcher_free(m);
    }
    lm_grammar_vocab_free(v);
    lm_grammar_unref(g);
}
