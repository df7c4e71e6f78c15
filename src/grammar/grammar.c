/* grammar.c - the builder the front ends (gbnf.c, regex.c) write into, and
 * the compiled grammar it finishes into (see lm_grammar.h).
 *
 * Character classes over code points become byte rules here: a range of
 * code points is split into pieces whose UTF-8 encodings differ only in
 * ranges of each byte (the split used by RE2 and Rust's regex-syntax), so
 * that the matcher only ever compares bytes. */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

/* The most copies one repetition bound may ask for ({m,n}, minItems ...):
 * each copy is elements in the compiled grammar. */
#define G_MAX_REPEAT 1000

void gb_init(g_builder *b) { memset(b, 0, sizeof *b); }

void gb_free(g_builder *b) {
    for (int i = 0; i < b->n_rules; i++) free(b->rules[i].name), free(b->rules[i].body.v);
    free(b->rules);
    free(b->sets);
    free(b->names);
    memset(b, 0, sizeof *b);
}

static int new_rule(g_builder *b, char *name) {
    if (b->n_rules == b->cap_rules) {
        b->cap_rules = b->cap_rules ? b->cap_rules * 2 : 32;
        b->rules = lm_xrealloc(b->rules, (size_t)b->cap_rules * sizeof *b->rules);
    }
    b->rules[b->n_rules] = (g_rule){ .name = name };
    return b->n_rules++;
}

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* The slot of name in b->names: its rule, or the empty slot to put it in. */
static int32_t *name_slot(g_builder *b, const char *name, size_t n) {
    for (size_t i = name_hash(name, n) & (size_t)(b->name_cap - 1);; i = (i + 1) & (size_t)(b->name_cap - 1)) {
        int32_t r = b->names[i];
        if (r < 0 || (strlen(b->rules[r].name) == n && !memcmp(b->rules[r].name, name, n))) return &b->names[i];
    }
}

int gb_named(g_builder *b, const char *name, size_t n) {
    if (2 * (b->n_names + 1) > b->name_cap) { /* grow and rehash */
        int32_t *old = b->names;
        int old_cap = b->name_cap;
        b->name_cap = b->name_cap ? b->name_cap * 2 : 64;
        b->names = lm_xmalloc((size_t)b->name_cap * sizeof *b->names);
        memset(b->names, 0xff, (size_t)b->name_cap * sizeof *b->names);
        for (int i = 0; i < old_cap; i++)
            if (old[i] >= 0) *name_slot(b, b->rules[old[i]].name, strlen(b->rules[old[i]].name)) = old[i];
        free(old);
    }
    int32_t *slot = name_slot(b, name, n);
    if (*slot >= 0) return *slot;
    char *s = lm_xmalloc(n + 1);
    memcpy(s, name, n);
    s[n] = 0;
    *slot = new_rule(b, s);
    b->n_names++;
    return *slot;
}

int gb_anon(g_builder *b) {
    int r = new_rule(b, NULL);
    b->rules[r].defined = true;
    return r;
}

void gb_push(g_builder *b, int rule, uint8_t type, int32_t arg) {
    g_seq *s = &b->rules[rule].body;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->v = lm_xrealloc(s->v, (size_t)s->cap * sizeof *s->v);
    }
    s->v[s->n++] = (g_elem){ type, arg };
}

void gb_bytes(g_builder *b, int rule, const g_set *set) {
    for (int i = b->n_sets - 1; i >= 0 && i >= b->n_sets - 64; i--) /* recent sets repeat (literals, classes) */
        if (!memcmp(&b->sets[i], set, sizeof *set)) {
            gb_push(b, rule, G_BYTES, i);
            return;
        }
    if (b->n_sets == b->cap_sets) {
        b->cap_sets = b->cap_sets ? b->cap_sets * 2 : 64;
        b->sets = lm_xrealloc(b->sets, (size_t)b->cap_sets * sizeof *b->sets);
    }
    b->sets[b->n_sets] = *set;
    gb_push(b, rule, G_BYTES, b->n_sets++);
}

void gb_byte(g_builder *b, int rule, uint8_t c) {
    g_set s = { { 0 } };
    g_set_add(&s, c);
    gb_bytes(b, rule, &s);
}

static int utf8_put(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) return o[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | (cp >> 6 & 63)),
               o[2] = (uint8_t)(0x80 | (cp & 63)), 3;
    o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | (cp >> 12 & 63));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 63)), o[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

/* Whether a JSON string must escape cp. */
static bool json_escaped(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

void gb_codepoint(g_builder *b, int rule, uint32_t cp) {
    if (b->json_string && json_escaped(cp)) b->json_bad = true;
    uint8_t u[4];
    int n = utf8_put(cp, u);
    for (int i = 0; i < n; i++) gb_byte(b, rule, u[i]);
}

/* One alternative of rule `into` for code points lo..hi, split until every
 * piece is a sequence of byte ranges. */
static void utf8_range(g_builder *b, int into, uint32_t lo, uint32_t hi, bool *first) {
    static const uint32_t edge[] = { 0x7F, 0x7FF, 0xFFFF };
    if (lo > hi) return;
    if (lo <= 0xDFFF && hi >= 0xD800) { /* surrogates are not characters */
        if (lo < 0xD800) utf8_range(b, into, lo, 0xD7FF, first);
        if (hi > 0xDFFF) utf8_range(b, into, 0xE000, hi, first);
        return;
    }
    for (int i = 0; i < 3; i++)
        if (lo <= edge[i] && hi > edge[i]) {
            utf8_range(b, into, lo, edge[i], first);
            utf8_range(b, into, edge[i] + 1, hi, first);
            return;
        }
    uint8_t a[4], z[4];
    int n = utf8_put(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_range(b, into, lo, lo | m, first);
                utf8_range(b, into, (lo | m) + 1, hi, first);
                return;
            }
            if ((hi & m) != m) {
                utf8_range(b, into, lo, (hi & ~m) - 1, first);
                utf8_range(b, into, hi & ~m, hi, first);
                return;
            }
        }
    }
    utf8_put(hi, z);
    if (!*first) gb_push(b, into, G_ALT, 0);
    *first = false;
    for (int i = 0; i < n; i++) {
        g_set s = { { 0 } };
        for (int c = a[i]; c <= z[i]; c++) g_set_add(&s, (uint8_t)c);
        gb_bytes(b, into, &s);
    }
}

static int cmp_u32pair(const void *x, const void *y) {
    const uint32_t *a = x, *c = y;
    return a[0] < c[0] ? -1 : a[0] > c[0];
}

void gb_class(g_builder *b, int rule, const uint32_t *lo, const uint32_t *hi, int n, bool negate) {
    /* sorted, merged ranges; then the complement when negated */
    uint32_t(*r)[2] = lm_xmalloc((size_t)(n + 1) * sizeof *r);
    for (int i = 0; i < n; i++) r[i][0] = lo[i], r[i][1] = hi[i];
    qsort(r, (size_t)n, sizeof *r, cmp_u32pair);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i][0] <= r[m - 1][1] + 1) {
            if (r[i][1] > r[m - 1][1]) r[m - 1][1] = r[i][1];
        } else {
            r[m][0] = r[i][0], r[m][1] = r[i][1], m++;
        }
    }
    if (negate) {
        uint32_t(*c)[2] = lm_xmalloc((size_t)(m + 1) * sizeof *c);
        int k = 0;
        uint32_t next = 0;
        for (int i = 0; i < m; i++) {
            if (r[i][0] > next) c[k][0] = next, c[k][1] = r[i][0] - 1, k++;
            next = r[i][1] + 1;
        }
        if (next <= 0x10FFFF) c[k][0] = next, c[k][1] = 0x10FFFF, k++;
        free(r);
        r = c;
        m = k;
    }
    bool ascii = true;
    for (int i = 0; i < m; i++) ascii &= r[i][1] < 0x80;

    g_set s = { { 0 } };
    for (int i = 0; i < m; i++)
        for (uint32_t c = r[i][0]; c <= r[i][1] && c < 0x80; c++)
            if (!b->json_string || !json_escaped(c)) g_set_add(&s, (uint8_t)c); /* as seen inside a JSON string */
    if (ascii) {
        gb_bytes(b, rule, &s);
    } else {
        int into = gb_anon(b);
        bool first = true;
        if (s.w[0] | s.w[1]) {
            gb_bytes(b, into, &s);
            first = false;
        }
        for (int i = 0; i < m; i++) utf8_range(b, into, LM_MAX(r[i][0], 0x80u), r[i][1], &first);
        gb_push(b, rule, G_REF, into);
    }
    free(r);
}

/* ---- repetition ---- */

/* A new rule whose body is the elements el[0, n). */
static int rule_of(g_builder *b, const g_elem *el, int n) {
    int r = gb_anon(b);
    for (int i = 0; i < n; i++) gb_push(b, r, el[i].type, el[i].arg);
    return r;
}

int gb_repeat(g_builder *b, int rule, int from, int min, int max, lm_err *e) {
    if (min > G_MAX_REPEAT || max > G_MAX_REPEAT)
        return lm_errf(e, "a repetition bound of %d is over the limit of %d", LM_MAX(min, max), G_MAX_REPEAT);
    if (max >= 0 && max < min) return lm_errf(e, "a repetition's maximum %d is below its minimum %d", max, min);
    g_seq *s = &b->rules[rule].body;
    int n = s->n - from;
    /* the atom as one rule: copies are then one reference each */
    int atom = n == 1 ? -1 : rule_of(b, s->v + from, n);
    g_elem one = n == 1 ? s->v[from] : (g_elem){ G_REF, atom };
    b->rules[rule].body.n = from;
    for (int i = 0; i < min; i++) gb_push(b, rule, one.type, one.arg);
    if (max < 0) { /* star ::= atom star | */
        int star = gb_anon(b);
        gb_push(b, star, one.type, one.arg);
        gb_push(b, star, G_REF, star);
        gb_push(b, star, G_ALT, 0);
        gb_push(b, rule, G_REF, star);
    } else if (max > min) { /* opt_k ::= atom opt_(k-1) | */
        int prev = -1;
        for (int k = 0; k < max - min; k++) {
            int opt = gb_anon(b);
            gb_push(b, opt, one.type, one.arg);
            if (prev >= 0) gb_push(b, opt, G_REF, prev);
            gb_push(b, opt, G_ALT, 0);
            prev = opt;
        }
        gb_push(b, rule, G_REF, prev);
    }
    return 0;
}

/* ---- checks and flattening ---- */

/* nullable[r]: rule r matches the empty string (a fixpoint). */
static bool *nullable_rules(const g_builder *b) {
    bool *nl = lm_xcalloc((size_t)b->n_rules, 1), changed = true;
    while (changed) {
        changed = false;
        for (int r = 0; r < b->n_rules; r++) {
            if (nl[r]) continue;
            const g_seq *s = &b->rules[r].body;
            bool alt_ok = true;
            for (int i = 0; i <= s->n; i++) {
                if (i == s->n || s->v[i].type == G_ALT) {
                    if (alt_ok) {
                        nl[r] = changed = true;
                        break;
                    }
                    alt_ok = true;
                } else if (s->v[i].type == G_BYTES || (s->v[i].type == G_REF && !nl[s->v[i].arg])) {
                    alt_ok = false;
                }
            }
        }
    }
    return nl;
}

/* Whether rule r can reach itself at the left edge (states: 0 unseen, 1 on
 * the path, 2 done). */
static bool left_cycle(const g_builder *b, const bool *nl, int r, uint8_t *state, int *culprit) {
    if (state[r] == 1) return *culprit = r, true;
    if (state[r] == 2) return false;
    state[r] = 1;
    const g_seq *s = &b->rules[r].body;
    bool lead = true;
    for (int i = 0; i < s->n; i++) {
        const g_elem *x = &s->v[i];
        if (x->type == G_ALT) {
            lead = true;
            continue;
        }
        if (!lead) continue;
        if (x->type == G_REF && left_cycle(b, nl, x->arg, state, culprit)) return true;
        lead = x->type == G_REF && nl[x->arg];
    }
    state[r] = 2;
    return false;
}

static const char *rule_name(const g_builder *b, int r) { return b->rules[r].name ? b->rules[r].name : "(a group)"; }

/* first[] and nullable[] of every element: per rule by a fixpoint (a
 * reference contributes its rule's), then per element from the end of
 * each alternative backwards. Matching uses them to expand only the
 * alternatives that can take the next byte. */
static void first_sets(lm_grammar *g) {
    g_set *rf = lm_xcalloc((size_t)g->n_rules, sizeof *rf);
    uint8_t *rn = lm_xcalloc((size_t)g->n_rules, 1);
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < g->n_rules; r++) {
            g_set f = rf[r];
            bool nl = rn[r], lead = true;
            for (int p = g->rule_start[r];; p++) {
                const g_elem x = g->el[p];
                if (x.type == G_ALT || x.type == G_END) {
                    nl |= lead;
                    if (x.type == G_END) break;
                    lead = true;
                    continue;
                }
                if (!lead) continue;
                const g_set *s = x.type == G_BYTES ? &g->sets[x.arg] : &rf[x.arg];
                for (int w = 0; w < 4; w++) f.w[w] |= s->w[w];
                lead = x.type == G_REF && rn[x.arg];
            }
            if (memcmp(&f, &rf[r], sizeof f) || nl != rn[r]) rf[r] = f, rn[r] = nl, changed = true;
        }
    }
    g->first = lm_xcalloc((size_t)g->n_el, sizeof *g->first);
    g->nullable = lm_xcalloc((size_t)g->n_el, 1);
    for (int p = g->n_el - 1; p >= 0; p--) {
        const g_elem x = g->el[p];
        if (x.type == G_ALT || x.type == G_END) {
            g->nullable[p] = 1;
            continue;
        }
        const g_set *s = x.type == G_BYTES ? &g->sets[x.arg] : &rf[x.arg];
        bool nl = x.type == G_REF && rn[x.arg];
        g->first[p] = *s;
        if (nl) {
            for (int w = 0; w < 4; w++) g->first[p].w[w] |= g->first[p + 1].w[w];
            g->nullable[p] = g->nullable[p + 1];
        }
    }
    free(rf);
    free(rn);
}

/* ---- left factoring ----
 *
 * Alternatives that begin alike (a tool-call grammar's 250 calls all start
 * with {"name": "tool_) would each keep a stack through the shared
 * prefix: a mask then steps 250 stacks per trie node. Factoring the first
 * element out (x A | x B  ->  x T, T ::= A | B), and T's in turn, keeps
 * one stack until the alternatives really differ. The language does not
 * change. */

static bool same_elem(const g_builder *b, g_elem x, g_elem y) {
    if (x.type != y.type) return false;
    if (x.type == G_BYTES) return x.arg == y.arg || !memcmp(&b->sets[x.arg], &b->sets[y.arg], sizeof(g_set));
    return x.arg == y.arg;
}

static void factor_rule(g_builder *b, int r) {
    const g_seq old = b->rules[r].body;
    int n_alt = 1;
    for (int i = 0; i < old.n; i++) n_alt += old.v[i].type == G_ALT;
    if (n_alt < 2) return;
    int *st = lm_xmalloc((size_t)n_alt * sizeof *st), *len = lm_xmalloc((size_t)n_alt * sizeof *len);
    int *lead = lm_xmalloc((size_t)n_alt * sizeof *lead); /* the first alternative of a's group */
    for (int a = 0, i = 0; a < n_alt; a++, i++) {
        st[a] = i;
        while (i < old.n && old.v[i].type != G_ALT) i++;
        len[a] = i - st[a];
    }
    bool any = false;
    for (int a = 0; a < n_alt; a++) {
        lead[a] = a;
        for (int p = 0; p < a && lead[a] == a; p++)
            if (lead[p] == p && len[p] > 0 && len[a] > 0 && same_elem(b, old.v[st[p]], old.v[st[a]])) lead[a] = p, any = true;
    }
    if (any) {
        b->rules[r].body = (g_seq){ 0 };
        bool first_group = true;
        for (int a = 0; a < n_alt; a++) {
            if (lead[a] != a) continue;
            if (!first_group) gb_push(b, r, G_ALT, 0);
            first_group = false;
            int members = 0;
            for (int x = a; x < n_alt; x++) members += lead[x] == a;
            if (members == 1) {
                for (int i = 0; i < len[a]; i++) gb_push(b, r, old.v[st[a] + i].type, old.v[st[a] + i].arg);
                continue;
            }
            const int t = gb_anon(b);
            gb_push(b, r, old.v[st[a]].type, old.v[st[a]].arg);
            gb_push(b, r, G_REF, t);
            bool first_tail = true;
            for (int x = a; x < n_alt; x++) {
                if (lead[x] != a) continue;
                if (!first_tail) gb_push(b, t, G_ALT, 0);
                first_tail = false;
                for (int i = 1; i < len[x]; i++) gb_push(b, t, old.v[st[x] + i].type, old.v[st[x] + i].arg);
            }
        }
        free(old.v);
    }
    free(st), free(len), free(lead);
}

int gb_finish(g_builder *b, int root, lm_grammar **out, lm_err *e) {
    *out = NULL;
    for (int r = 0; r < b->n_rules; r++)
        if (!b->rules[r].defined) return lm_errf(e, "the rule '%s' is used but never defined", b->rules[r].name);
    bool *nl = nullable_rules(b);
    /* a repetition rule (x star | ) whose x can be empty would loop */
    for (int r = 0; r < b->n_rules; r++) {
        const g_seq *s = &b->rules[r].body;
        if (s->n >= 2 && s->v[s->n - 1].type == G_ALT && s->v[s->n - 2].type == G_REF && s->v[s->n - 2].arg == r) {
            bool empty = true;
            for (int i = 0; i < s->n - 2; i++) empty &= s->v[i].type == G_REF && nl[s->v[i].arg];
            if (empty) {
                free(nl);
                return lm_errf(e, "a repetition of something that can match the empty string");
            }
        }
    }
    uint8_t *state = lm_xcalloc((size_t)b->n_rules, 1);
    int culprit = -1;
    for (int r = 0; r < b->n_rules && culprit < 0; r++) left_cycle(b, nl, r, state, &culprit);
    free(state);
    free(nl);
    if (culprit >= 0) return lm_errf(e, "the rule '%s' is left-recursive", rule_name(b, culprit));
    for (int r = 0; r < b->n_rules; r++) factor_rule(b, r); /* rules it makes are factored in turn */
    int start_rule = gb_anon(b); /* start ::= root: the first stack's top */
    gb_push(b, start_rule, G_REF, root);
    /* the context sentinel of mask.c's tables: any byte, then the end */
    int ctx_rule = gb_anon(b);
    g_set any;
    memset(&any, 0xFF, sizeof any);
    gb_bytes(b, ctx_rule, &any);

    lm_grammar *g = lm_xcalloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    pthread_mutex_init(&g->mu, NULL);
    g->n_rules = b->n_rules;
    g->rule_start = lm_xmalloc((size_t)b->n_rules * sizeof *g->rule_start);
    for (int r = 0; r < b->n_rules; r++) g->n_el += b->rules[r].body.n + 1;
    g->el = lm_xmalloc((size_t)g->n_el * sizeof *g->el);
    int k = 0;
    for (int r = 0; r < b->n_rules; r++) {
        g->rule_start[r] = k;
        if (b->rules[r].body.n) memcpy(g->el + k, b->rules[r].body.v, (size_t)b->rules[r].body.n * sizeof *g->el);
        k += b->rules[r].body.n;
        g->el[k++] = (g_elem){ G_END, 0 };
    }
    g->sets = b->sets;
    g->n_sets = b->n_sets;
    b->sets = NULL;
    b->n_sets = b->cap_sets = 0;
    g->root = root;
    g->start = g->rule_start[start_rule];
    g->ctx = g->rule_start[ctx_rule];
    first_sets(g);
    g->st.rules = g->n_rules;
    g->st.elements = g->n_el;
    *out = g;
    return 0;
}

/* ---- the grammar ---- */

lm_grammar *lm_grammar_ref(lm_grammar *g) {
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void lm_grammar_unref(lm_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    for (int i = 0; i < g->cache_cap; i++) free(g->cache[i].mask);
    free(g->cache);
    g_tables_free(g);
    pthread_mutex_destroy(&g->mu);
    free(g->el);
    free(g->rule_start);
    free(g->sets);
    free(g->first);
    free(g->nullable);
    free(g);
}

void lm_grammar_get_stats(lm_grammar *g, lm_grammar_stats *s) {
    pthread_mutex_lock(&g->mu);
    *s = g->st;
    pthread_mutex_unlock(&g->mu);
}
