/* matcher.c - parse stacks over a compiled grammar: accepting bytes and
 * tokens, rollback, forced bytes (see lm_grammar.h).
 *
 * A stack is a node id: its top is a G_BYTES element, each node below is
 * where a referenced rule returns to. A reference in tail position returns
 * straight to its parent (no node), so right-recursive repetition keeps
 * stacks flat. Nodes are never changed, only appended; what a failed or
 * undone step appended is dropped by truncating the arena. */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

/* Past this many stacks a set stops growing: an ambiguous grammar must not
 * take the engine's memory. Real schemas stay in the single digits. */
#define G_MAX_STACKS 4096

int32_t gm_node_new(lm_grammar_matcher *m, int32_t pos, int32_t parent) {
    if (m->n_nodes == m->cap_nodes) {
        m->cap_nodes = m->cap_nodes ? m->cap_nodes * 2 : 1024;
        m->nodes = lm_xrealloc(m->nodes, (size_t)m->cap_nodes * sizeof *m->nodes);
    }
    m->nodes[m->n_nodes] = (g_node){ pos, parent };
    return m->n_nodes++;
}


/* Adds the stack (pos, parent) unless the set (from out->base) has it. A
 * top that has ended its alternative pops on any byte, so the stack is its
 * parent's: folding it keeps equal states equal in content (the mask's
 * chain and cache compare stacks by content; a JSON string after a
 * two-byte character is then the state it is after an ASCII one). */
static void add_stack(lm_grammar_matcher *m, int32_t pos, int32_t parent, g_ids *out) {
    int32_t id = -1;
    while (parent >= 0 && (m->g->el[pos].type == G_END || m->g->el[pos].type == G_ALT)) {
        id = parent;
        pos = m->nodes[id].pos, parent = m->nodes[id].parent;
    }
    for (int i = out->base; i < out->n; i++) {
        const g_node *x = &m->nodes[out->v[i]];
        if (x->pos == pos && x->parent == parent) return;
    }
    if (out->n - out->base >= G_MAX_STACKS) return;
    g_ids_push(out, id >= 0 ? id : gm_node_new(m, pos, parent));
}

/* Whether set s holds c; while probing, also narrows m->probe to the
 * bytes that agree with c on s (chain in mask.c: bytes that agree on
 * every test step() makes take exactly c's path). */
static inline bool takes(lm_grammar_matcher *m, const g_set *s, uint8_t c) {
    const bool in = g_set_has(s, c);
    if (m->probing)
        for (int w = 0; w < 4; w++) m->probe[w] &= in ? s->w[w] : ~s->w[w];
    return in;
}

/* Every way the stack (pos, parent) takes byte c, appended to out: a
 * reference expands only the alternatives whose first bytes hold c (or
 * that can match nothing, to look past them); an end returns to the
 * parent. What is left after c stays unexpanded until the next byte. */
static void step(lm_grammar_matcher *m, int32_t pos, int32_t parent, uint8_t c, g_ids *out) {
    const lm_grammar *g = m->g;
    const g_elem *el = g->el;
    for (;;) {
        const g_elem x = el[pos];
        if (x.type == G_BYTES) {
            if (takes(m, &g->sets[x.arg], c)) add_stack(m, pos + 1, parent, out);
            return;
        }
        if (x.type == G_END || x.type == G_ALT) {
            if (parent < 0) return; /* the grammar has ended: no more bytes */
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            continue;
        }
        if (!g->nullable[pos] && !takes(m, &g->first[pos], c)) return;
        uint8_t after = el[pos + 1].type;
        int32_t ret = -2; /* made on first use */
        for (int32_t a = g->rule_start[x.arg];;) {
            if (g->nullable[a] || takes(m, &g->first[a], c)) {
                if (ret == -2) ret = after == G_END || after == G_ALT ? parent : gm_node_new(m, pos + 1, parent);
                step(m, a, ret, c, out);
            }
            while (el[a].type != G_ALT && el[a].type != G_END) a++;
            if (el[a].type == G_END) break;
            a++;
        }
        return;
    }
}

void gm_advance(lm_grammar_matcher *m, int in_off, int n, uint8_t c, g_ids *out) {
    for (int i = 0; i < n; i++) {
        const g_node x = m->nodes[out->v[in_off + i]];
        step(m, x.pos, x.parent, c, out);
    }
}

/* Whether stack id can end the grammar: the rest of every level is nullable. */
static bool stack_accepting(const lm_grammar_matcher *m, int32_t id) {
    for (; id >= 0; id = m->nodes[id].parent)
        if (!m->g->nullable[m->nodes[id].pos]) return false;
    return true;
}

bool gm_accepting(const lm_grammar_matcher *m, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (stack_accepting(m, ids[i])) return true;
    return false;
}

/* The bytes stack id can take next. */
static void stack_next(const lm_grammar_matcher *m, int32_t id, g_set *u) {
    for (; id >= 0; id = m->nodes[id].parent) {
        const int32_t p = m->nodes[id].pos;
        for (int w = 0; w < 4; w++) u->w[w] |= m->g->first[p].w[w];
        if (!m->g->nullable[p]) return;
    }
}

/* ---- the matcher ---- */

lm_grammar_matcher *lm_grammar_matcher_create(lm_grammar *g, const lm_grammar_vocab *v) {
    lm_grammar_matcher *m = lm_xcalloc(1, sizeof *m);
    m->g = lm_grammar_ref(g);
    m->v = v;
    g_ids_push(&m->cur, gm_node_new(m, g->start, -1));
    m->cur.accepting = gm_accepting(m, m->cur.v, m->cur.n);
    return m;
}

void lm_grammar_matcher_free(lm_grammar_matcher *m) {
    if (!m) return;
    lm_grammar_unref(m->g);
    free(m->nodes);
    free(m->cur.v);
    free(m->hist);
    free(m->hist_ids.v);
    free(m->tmp.v);
    free(m->roots.v);
    free(m->scratch);
    free(m->lvl.v);
    free(m->lvl_start);
    free(m->lvl_n);
    free(m->lvl_nodes);
    free(m->lvl_chain);
    free(m->ch.v);
    free(m->ch_off);
    free(m->ch_n);
    free(m->ch_k);
    free(m->ch_u8);
    free(m);
}

static void save_step(lm_grammar_matcher *m, int n_nodes) {
    if (m->n_hist == m->cap_hist) {
        m->cap_hist = m->cap_hist ? m->cap_hist * 2 : 64;
        m->hist = lm_xrealloc(m->hist, (size_t)m->cap_hist * sizeof *m->hist);
    }
    m->hist[m->n_hist++] = (struct g_step){ n_nodes, m->hist_ids.n, m->cur.n, m->cur.accepting, m->ended };
    for (int i = 0; i < m->cur.n; i++) g_ids_push(&m->hist_ids, m->cur.v[i]);
}

/* Runs bytes s[0, n) from the current set into m->tmp; false when some
 * byte is taken by no stack. */
static bool run_bytes(lm_grammar_matcher *m, const char *s, size_t n) {
    g_ids *t = &m->tmp;
    t->n = 0;
    for (int i = 0; i < m->cur.n; i++) g_ids_push(t, m->cur.v[i]);
    for (size_t i = 0; i < n; i++) {
        int off = 0, cnt = t->n;
        t->base = cnt;
        gm_advance(m, off, cnt, (uint8_t)s[i], t);
        if (t->n == cnt) return false;
        /* keep only the new set at the front */
        memmove(t->v, t->v + cnt, (size_t)(t->n - cnt) * sizeof *t->v);
        t->n -= cnt;
        t->base = 0;
    }
    return true;
}

bool lm_grammar_accept_bytes(lm_grammar_matcher *m, const char *s, size_t n) {
    if (m->ended) return false;
    int mark = m->n_nodes;
    if (!run_bytes(m, s, n)) {
        m->n_nodes = mark;
        return false;
    }
    save_step(m, mark);
    m->cur.n = 0;
    for (int i = 0; i < m->tmp.n; i++) g_ids_push(&m->cur, m->tmp.v[i]);
    m->cur.accepting = gm_accepting(m, m->cur.v, m->cur.n);
    return true;
}

bool lm_grammar_accept(lm_grammar_matcher *m, int32_t id) {
    if (m->ended) return false;
    if (gv_is_end(m->v, id)) {
        if (!m->cur.accepting) return false;
        save_step(m, m->n_nodes);
        m->ended = true;
        return true;
    }
    size_t n;
    const char *s = gv_bytes(m->v, id, &n);
    if (!s || n == 0) return false;
    return lm_grammar_accept_bytes(m, s, n);
}

void lm_grammar_rollback(lm_grammar_matcher *m, int n) {
    LM_ASSERT(n >= 0 && n <= m->n_hist);
    if (n == 0) return;
    const struct g_step st = m->hist[m->n_hist - n];
    m->n_hist -= n;
    m->n_nodes = st.n_nodes;
    m->cur.n = 0;
    for (int i = 0; i < st.n_ids; i++) g_ids_push(&m->cur, m->hist_ids.v[st.ids_off + i]);
    m->hist_ids.n = st.ids_off;
    m->cur.accepting = st.accepting;
    m->ended = st.ended;
}

int lm_grammar_steps(const lm_grammar_matcher *m) { return m->n_hist; }

bool lm_grammar_can_end(const lm_grammar_matcher *m) { return !m->ended && m->cur.accepting; }

bool lm_grammar_done(const lm_grammar_matcher *m) {
    if (m->ended) return true;
    g_set u = { { 0 } };
    for (int i = 0; i < m->cur.n; i++) stack_next(m, m->cur.v[i], &u);
    return !(u.w[0] | u.w[1] | u.w[2] | u.w[3]);
}

size_t lm_grammar_forced(lm_grammar_matcher *m, char *buf, size_t cap) {
    int mark = m->n_nodes;
    size_t k = 0;
    g_ids *t = &m->tmp;
    t->n = 0;
    for (int i = 0; i < m->cur.n; i++) g_ids_push(t, m->cur.v[i]);
    while (k < cap && !m->ended && t->n > 0 && !gm_accepting(m, t->v, t->n)) {
        g_set u = { { 0 } };
        for (int i = 0; i < t->n; i++) stack_next(m, t->v[i], &u);
        int c = -1, count = 0;
        for (int b = 0; b < 256 && count < 2; b++)
            if (g_set_has(&u, (uint8_t)b)) c = b, count++;
        if (count != 1) break;
        int cnt = t->n;
        t->base = cnt;
        gm_advance(m, 0, cnt, (uint8_t)c, t);
        memmove(t->v, t->v + cnt, (size_t)(t->n - cnt) * sizeof *t->v);
        t->n -= cnt;
        t->base = 0;
        buf[k++] = (char)c;
    }
    m->n_nodes = mark;
    return k;
}
