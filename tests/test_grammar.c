/* test_grammar.c - the grammar module: GBNF, regex and JSON Schema front
 * ends, matching, masks over a vocabulary, rollback, forced bytes. */
#include <stdlib.h>
#include <string.h>

#include "../src/grammar/grammar_internal.h" /* the stack count (grammar_shared_prefix_one_stack) */
#include "lm_test.h"

static lm_grammar *gbnf(const char *s) {
    lm_grammar *g = NULL;
    lm_err e = { { 0 } };
    if (lm_grammar_from_gbnf(&g, s, strlen(s), &e)) fprintf(stderr, "  gbnf: %s\n", e.msg);
    return g;
}

/* A small vocabulary: every printable byte and newline as one token, some
 * multi-byte tokens, and id 0 as the end token. */
static lm_grammar_vocab *small_vocab(int *n_out) {
    static const char *multi[] = { "{\"", "\":", "\",", "true", "false", "null", "name", "age", "  ", "\"}", "12",
                                   "abc", "é", "\xc3", "\xa9", "<tool_call>", "éa" };
    int n = 1 + 96 + (int)LM_COUNT(multi);
    const char **b = calloc((size_t)n, sizeof *b);
    size_t *l = calloc((size_t)n, sizeof *l);
    static char bytes[96];
    for (int i = 0; i < 95; i++) bytes[i] = (char)(32 + i);
    bytes[95] = '\n';
    for (int i = 0; i < 96; i++) b[1 + i] = &bytes[i], l[1 + i] = 1;
    for (size_t i = 0; i < LM_COUNT(multi); i++) b[97 + i] = multi[i], l[97 + i] = strlen(multi[i]);
    int32_t end = 0;
    lm_grammar_vocab *v = lm_grammar_vocab_create(n, b, l, &end, 1);
    free(b), free(l);
    *n_out = n;
    return v;
}

static bool accepts(lm_grammar *g, const char *s) {
    int n;
    lm_grammar_vocab *v = small_vocab(&n);
    lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
    bool ok = lm_grammar_accept_bytes(m, s, strlen(s)) && lm_grammar_can_end(m);
    lm_grammar_matcher_free(m);
    lm_grammar_vocab_free(v);
    return ok;
}

LM_TEST(grammar_gbnf_basics) {
    lm_grammar *g = gbnf("root ::= \"a\" b+ (\"x\" | \"y\")? [0-9]{2,3}\nb ::= [bB]\n");
    LM_CHECK(g);
    if (!g) return;
    LM_CHECK(accepts(g, "ab12"));
    LM_CHECK(accepts(g, "abBbx123"));
    LM_CHECK(!accepts(g, "a12"));
    LM_CHECK(!accepts(g, "ab1"));
    LM_CHECK(!accepts(g, "ab1234"));
    LM_CHECK(!accepts(g, "abz12"));
    lm_grammar_unref(g);
    /* multi-line alternatives, comments, UTF-8 classes */
    g = gbnf("root ::= w # a comment\n  | \"é\"\nw ::= [^a-z\\x00-\\x1f]+\n");
    LM_CHECK(g);
    if (!g) return;
    LM_CHECK(accepts(g, "é"));
    LM_CHECK(accepts(g, "ABé€"));
    LM_CHECK(!accepts(g, "abc"));
    LM_CHECK(!accepts(g, "\xc3")); /* half a character */
    lm_grammar_unref(g);
}

LM_TEST(grammar_gbnf_errors) {
    static const char *bad[] = { "root ::= x\n", "a ::= \"x\"\n", "root ::= root \"a\" | \"b\"\n",
                                 "root ::= (\"a\"?)*\n", "root ::= \"a\nroot ::= \"b\"\n", "root ::= [b-a]\n",
                                 "root ::= \"a\"{2000}\n", "root ::= \"a\" )\n" };
    for (size_t i = 0; i < LM_COUNT(bad); i++) {
        lm_grammar *g = NULL;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(lm_grammar_from_gbnf(&g, bad[i], strlen(bad[i]), &e) != 0 && e.msg[0], "%s", bad[i]);
        lm_grammar_unref(g);
    }
}

LM_TEST(grammar_regex) {
    struct {
        const char *re, *yes, *no;
    } cases[] = {
        { "^\\d{3}-\\d{4}$", "555-1234", "5551234" },
        { "[a-z]+(\\.[a-z]+)*@x\\.org", "a.b@x.org", "a..b@x.org" },
        { "(cat|dog)s?", "dogs", "cats!" },
        { "[^\\s]+", "\xe2\x82\xac!", "a b" },
        { "a.c", "a\xc3\xa9" "c", "a\nc" },
    };
    for (size_t i = 0; i < LM_COUNT(cases); i++) {
        lm_grammar *g = NULL;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(!lm_grammar_from_regex(&g, cases[i].re, strlen(cases[i].re), &e), "%s: %s", cases[i].re, e.msg);
        if (!g) continue;
        LM_CHECK_MSG(accepts(g, cases[i].yes), "%s should match %s", cases[i].re, cases[i].yes);
        LM_CHECK_MSG(!accepts(g, cases[i].no), "%s should not match %s", cases[i].re, cases[i].no);
        lm_grammar_unref(g);
    }
    static const char *bad[] = { "(a)\\1", "a(?=b)", "\\bword", "a|*", "(ab" };
    for (size_t i = 0; i < LM_COUNT(bad); i++) {
        lm_grammar *g = NULL;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(lm_grammar_from_regex(&g, bad[i], strlen(bad[i]), &e) != 0, "%s", bad[i]);
        lm_grammar_unref(g);
    }
}

/* The mask agrees with accepting each token one by one. */
LM_TEST(grammar_mask_matches_accept) {
    lm_grammar *g = gbnf("root ::= \"{\\\"name\\\":\" (\"true\" | \"null\" | [0-9]+) \"}\"\n");
    LM_CHECK(g);
    if (!g) return;
    int n;
    lm_grammar_vocab *v = small_vocab(&n);
    lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
    uint32_t *mask = calloc((size_t)lm_grammar_mask_words(n), 4);
    const char *text = "{\"name\":12}";
    int steps = 0;
    for (size_t at = 0; at <= strlen(text); steps++) {
        int allowed = lm_grammar_mask(m, mask), count = 0;
        for (int id = 0; id < n; id++) {
            bool bit = (mask[id >> 5] >> (id & 31)) & 1;
            count += bit;
            bool ok = lm_grammar_accept(m, id);
            if (ok) lm_grammar_rollback(m, 1);
            LM_CHECK_MSG(bit == ok, "step %d token %d: mask %d, accept %d", steps, id, bit, ok);
        }
        LM_CHECK(count == allowed);
        if (at == strlen(text)) {
            LM_CHECK(lm_grammar_can_end(m) && (mask[0] & 1));
            break;
        }
        LM_CHECK(lm_grammar_accept_bytes(m, text + at, 1));
        at++;
    }
    /* rollback restores: undo everything, then the first mask again */
    LM_CHECK(lm_grammar_steps(m) == (int)strlen(text));
    lm_grammar_rollback(m, lm_grammar_steps(m));
    LM_CHECK(!lm_grammar_can_end(m));
    char forced[32];
    size_t k = lm_grammar_forced(m, forced, sizeof forced);
    LM_CHECK(k == 8 && !memcmp(forced, "{\"name\":", 8));
    LM_CHECK(lm_grammar_steps(m) == 0);
    free(mask);
    lm_grammar_matcher_free(m);
    lm_grammar_vocab_free(v);
    lm_grammar_unref(g);
}

/* Strict fill spells the forced bytes with the longest tokens and leaves
 * the one that would reach their end to the model. */
LM_TEST(grammar_strict_fill) {
    lm_grammar *g = gbnf("root ::= \"{\\\"name\\\": \" (\"true\" | \"null\") \"}\"\n");
    LM_CHECK(g);
    if (!g) return;
    int n;
    lm_grammar_vocab *v = small_vocab(&n);
    lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
    int32_t ids[16];
    int k = lm_grammar_fill(m, ids, 16);
    /* forced: {"name": then a space: {" + name + ": , the space left out */
    LM_CHECK_MSG(k == 3, "%d tokens", k);
    LM_CHECK(lm_grammar_steps(m) == k);
    char forced[8];
    LM_CHECK(lm_grammar_forced(m, forced, sizeof forced) == 1 && forced[0] == ' ');
    LM_CHECK(lm_grammar_accept_bytes(m, " t", 2));
    LM_CHECK(lm_grammar_fill(m, ids, 2) == 2); /* "rue}" forced: r, u within the cap */
    LM_CHECK(lm_grammar_fill(m, ids, 16) == 1 && lm_grammar_forced(m, forced, sizeof forced) == 1 && forced[0] == '}');
    lm_grammar_matcher_free(m);
    lm_grammar_vocab_free(v);
    lm_grammar_unref(g);
}

/* A JSON string is one state whatever character came last: after "é" (a
 * two-byte character) the mask comes from the cache entry made after "a". */
LM_TEST(grammar_string_state_after_multibyte_char) {
    lm_grammar *g = gbnf("root ::= \"\\\"\" [^\"\\\\]* \"\\\"\"\n");
    LM_REQUIRE(g);
    int n;
    lm_grammar_vocab *v = small_vocab(&n);
    lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
    uint32_t *mask = calloc((size_t)lm_grammar_mask_words(n), 4);
    LM_CHECK(lm_grammar_accept_bytes(m, "\"a", 2));
    int a = lm_grammar_mask(m, mask);
    lm_grammar_stats s0, s1;
    lm_grammar_get_stats(g, &s0);
    LM_CHECK(lm_grammar_accept_bytes(m, "\xc3\xa9", 2));
    LM_CHECK(lm_grammar_mask(m, mask) == a);
    lm_grammar_get_stats(g, &s1);
    LM_CHECK_MSG(s1.mask_hits == s0.mask_hits + 1, "hits %llu -> %llu", (unsigned long long)s0.mask_hits,
                 (unsigned long long)s1.mask_hits);
    free(mask);
    lm_grammar_matcher_free(m);
    lm_grammar_vocab_free(v);
    lm_grammar_unref(g);
}

/* Tokens the mask and one-by-one acceptance disagree on, at m's state. */
static int mask_disagreements(lm_grammar_matcher *m, int n) {
    uint32_t *mask = calloc((size_t)lm_grammar_mask_words(n), 4);
    int allowed = lm_grammar_mask(m, mask), count = 0, bad = 0;
    for (int id = 0; id < n; id++) {
        bool bit = (mask[id >> 5] >> (id & 31)) & 1;
        count += bit;
        bool ok = lm_grammar_accept(m, id);
        if (ok) lm_grammar_rollback(m, 1);
        bad += bit != ok;
    }
    free(mask);
    return bad + (count != allowed);
}

/* Counted repetitions (a chain of sets, one per count left) whose bytes
 * part ways only some counts in: "false" fits [a-z]{0,3} [a-m]{0,3} from
 * no state, "name" does; "abc" fits [a-z]{2} "c"? although the chain of
 * [a-z] ends after two; "éa" does not fit ([a-z] | [^\x00-\x7f] "!"){0,4}
 * although every character of both kinds is one count. Masks at every count must agree with accepting
 * each token, including after a two-byte character. */
LM_TEST(grammar_mask_counted_repetition) {
    static const struct {
        const char *gbnf, *text;
    } cases[] = {
        { "root ::= [a-z]{0,3} [a-m]{0,3} \".\" | \"\\\"\" [^\"\\\\]{0,5} \"\\\"\"\n", "abcab." },
        { "root ::= [a-z]{0,3} [a-m]{0,3} \".\" | \"\\\"\" [^\"\\\\]{0,5} \"\\\"\"\n", "\"ab\xc3\xa9x\"" },
        { "root ::= [a-z]{2} \"c\"? \".\"\n", "abc." },
        { "root ::= ([a-z] | [^\\x00-\\x7f] \"!\"){0,4} \".\"\n", "a\xc3\xa9!b." },
    };
    int n;
    lm_grammar_vocab *v = small_vocab(&n);
    for (size_t t = 0; t < LM_COUNT(cases); t++) {
        lm_grammar *g = gbnf(cases[t].gbnf);
        LM_REQUIRE(g);
        lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
        const char *text = cases[t].text;
        for (size_t at = 0; at <= strlen(text); at++) {
            int bad = mask_disagreements(m, n);
            LM_CHECK_MSG(bad == 0, "'%s' after %zu bytes: %d tokens disagree", text, at, bad);
            if (at < strlen(text)) LM_CHECK(lm_grammar_accept_bytes(m, text + at, 1));
        }
        lm_grammar_matcher_free(m);
        lm_grammar_unref(g);
    }
    lm_grammar_vocab_free(v);
}

/* Alternatives that begin alike are factored: through their shared prefix
 * one parse stack stands for all of them (a mask steps each stack per
 * trie node: 250 tool calls were 250 stacks), and the language is the
 * same, masks included. */
LM_TEST(grammar_shared_prefix_one_stack) {
    lm_grammar *g = gbnf("root ::= \"tool_ab\" \"1\" | \"tool_ab2\" | \"tool_ac\" x | \"tool_\" | \"to\"\nx ::= [0-9]+\n");
    LM_REQUIRE(g);
    static const char *yes[] = { "tool_ab1", "tool_ab2", "tool_ac77", "tool_", "to" };
    static const char *no[] = { "tool_ab", "tool_ac", "tool_ab12", "tool", "tool_x" };
    for (size_t i = 0; i < LM_COUNT(yes); i++) LM_CHECK_MSG(accepts(g, yes[i]), "%s", yes[i]);
    for (size_t i = 0; i < LM_COUNT(no); i++) LM_CHECK_MSG(!accepts(g, no[i]), "%s", no[i]);
    int n;
    lm_grammar_vocab *v = small_vocab(&n);
    lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
    const char *text = "tool_ac7";
    for (size_t at = 0; at <= strlen(text); at++) {
        LM_CHECK_MSG(mask_disagreements(m, n) == 0, "after %zu bytes", at);
        if (at >= 1 && at <= 5) LM_CHECK_MSG(m->cur.n == 1, "after %zu bytes: %d stacks", at, m->cur.n);
        if (at < strlen(text)) LM_CHECK(lm_grammar_accept_bytes(m, text + at, 1));
    }
    lm_grammar_matcher_free(m);
    lm_grammar_vocab_free(v);
    lm_grammar_unref(g);
}

/* A stack whose top may pop at once (a nullable rest: spaces before a
 * digit) is keyed with its parent: after "a " only "1" may follow, after
 * "b " only "2", though both tops are the same element of x and the
 * matchers share the grammar's tables. */
LM_TEST(grammar_tables_keyed_with_parent) {
    lm_grammar *g = gbnf("root ::= \"a\" x \"1\" | \"b\" x \"2\"\nx ::= [ ]*\n");
    LM_REQUIRE(g);
    int n;
    lm_grammar_vocab *v = small_vocab(&n);
    static const char *texts[] = { "a ", "b ", "a  ", "b" };
    for (size_t t = 0; t < LM_COUNT(texts); t++) {
        lm_grammar_matcher *m = lm_grammar_matcher_create(g, v);
        LM_CHECK(lm_grammar_accept_bytes(m, texts[t], strlen(texts[t])));
        LM_CHECK_MSG(mask_disagreements(m, n) == 0, "after '%s'", texts[t]);
        lm_grammar_matcher_free(m);
    }
    lm_grammar_stats st;
    lm_grammar_get_stats(g, &st);
    LM_CHECK_MSG(st.tables >= 2, "%llu tables", (unsigned long long)st.tables);
    lm_grammar_vocab_free(v);
    lm_grammar_unref(g);
}
