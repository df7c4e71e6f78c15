/* test_cuda_graphs.c - a forward replayed as a CUDA graph gives exactly what
 * the same forward issued op by op gives. Two GPU backends, one with graphs
 * off (LUMEN_CUDA_GRAPHS=0), run the same decode: three sequences of
 * different lengths prefilled, then steps of all three together (crossing KV
 * block boundaries, so the staged block tables grow), a two-sequence step in
 * between (another shape), and alternate steps that ask for logits and for
 * greedy ids only. Every logit and id must be bitwise equal, and the graph
 * backend must really have replayed graphs (else the test proves nothing).
 * A MoE model's forwards of up to 128 tokens (routing and grouping on the
 * device) are recorded too. Skips without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_kv_cache.h"
#include "model/lm_model.h"
#include "test_util.h"

#define N_SEQ 3
#define N_STEPS 40

typedef struct side {
    lm_backend *be;
    lm_model *m;
    lm_kv_cache *kv;
    lm_kv_seq seqs[N_SEQ];
    int32_t slots[N_SEQ];
} side;

static int side_open(side *s, const char *dir, bool graphs, lm_err *e) {
    memset(s, 0, sizeof *s);
    if (graphs) unsetenv("LUMEN_CUDA_GRAPHS");
    else setenv("LUMEN_CUDA_GRAPHS", "0", 1);
    s->be = lm_cuda_backend_create(0, e);
    unsetenv("LUMEN_CUDA_GRAPHS");
    if (!s->be || lm_model_load(&s->m, dir, s->be, e)) return -1;
    if (lm_kv_cache_create_for(&s->kv, s->m, (lm_kv_types){ 0 }, 16, 64, N_SEQ, 0, e)) return -1;
    for (int i = 0; i < N_SEQ; i++) {
        s->slots[i] = lm_kv_state_acquire(s->kv);
        if (lm_kv_seq_reserve(s->kv, &s->seqs[i], 300, e)) return -1;
    }
    return 0;
}

static void side_close(side *s) {
    for (int i = 0; i < N_SEQ && s->kv; i++) lm_kv_seq_release(s->kv, &s->seqs[i]);
    lm_kv_cache_free(s->kv);
    lm_model_free(s->m);
    lm_backend_destroy(s->be);
}

/* One forward of n sequences (first[i] of them) with one token each at
 * pos[i]; logits [n][V] when logits, else greedy ids into ids. */
static int side_step(side *s, int n, const int *which, const int32_t *tok, const int32_t *pos, float *logits,
                     int32_t *ids, lm_err *e) {
    int32_t seq[N_SEQ], rows[N_SEQ], slots[N_SEQ];
    const int32_t *tables[N_SEQ];
    for (int i = 0; i < n; i++) {
        seq[i] = i, rows[i] = i;
        tables[i] = s->seqs[which[i]].blocks;
        slots[i] = s->slots[which[i]];
    }
    lm_batch b = { .n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = n, .block_tables = tables,
                   .state_slot = slots[0] >= 0 ? slots : NULL, .n_out = n, .out_rows = rows,
                   .out_argmax = logits ? NULL : ids };
    return lm_model_forward(s->m, &s->kv->pool, &b, logits, e);
}

static void compare(lm_test_ctx *lm_t_, const char *dir, side *gp, side *qp) {
    side g = *gp, q = *qp;
    lm_err e = { { 0 } };
    const int V = g.m->cfg.vocab;
    float *lg = NULL, *lq = NULL;
    lg = malloc((size_t)N_SEQ * V * sizeof(float));
    lq = malloc((size_t)N_SEQ * V * sizeof(float));
    /* prompts of 5, 17 and 30 tokens, one forward each */
    static const int plen[N_SEQ] = { 5, 17, 30 };
    int32_t next[N_SEQ], at[N_SEQ];
    for (int i = 0; i < N_SEQ; i++) {
        int32_t tok[32], pos[32], sq[32];
        for (int t = 0; t < plen[i]; t++) tok[t] = (t * 31 + 7 * i + 3) % V, pos[t] = t, sq[t] = 0;
        int32_t last = plen[i] - 1;
        side *both[2] = { &g, &q };
        for (int k = 0; k < 2; k++) {
            const int32_t *tab = both[k]->seqs[i].blocks;
            lm_batch b = { .n_tokens = plen[i], .tokens = tok, .pos = pos, .seq = sq, .n_seqs = 1,
                           .block_tables = &tab, .state_slot = both[k]->slots[i] >= 0 ? &both[k]->slots[i] : NULL,
                           .n_out = 1, .out_rows = &last };
            if (lm_model_forward(both[k]->m, &both[k]->kv->pool, &b, k ? lq : lg, &e)) {
                LM_CHECK_MSG(false, "prefill: %s", e.msg);
                goto out;
            }
        }
        LM_CHECK(memcmp(lg, lq, (size_t)V * sizeof(float)) == 0);
        next[i] = lm_argmax(lq, V);
        at[i] = plen[i];
    }
    int differ = 0, steps = 0;
    for (int step = 0; step < N_STEPS; step++) {
        /* every 7th step only sequences 0 and 2 move: another batch shape */
        int which[N_SEQ], n = 0;
        for (int i = 0; i < N_SEQ; i++)
            if (step % 7 != 3 || i != 1) which[n++] = i;
        int32_t tok[N_SEQ], pos[N_SEQ], ig[N_SEQ], iq[N_SEQ];
        for (int i = 0; i < n; i++) tok[i] = next[which[i]], pos[i] = at[which[i]];
        const bool want_logits = step % 2 == 0;
        if (side_step(&g, n, which, tok, pos, want_logits ? lg : NULL, ig, &e) ||
            side_step(&q, n, which, tok, pos, want_logits ? lq : NULL, iq, &e)) {
            LM_CHECK_MSG(false, "step %d: %s", step, e.msg);
            goto out;
        }
        if (want_logits) {
            differ += memcmp(lg, lq, (size_t)n * V * sizeof(float)) != 0;
            for (int i = 0; i < n; i++) iq[i] = lm_argmax(lq + (size_t)i * V, V);
        } else {
            differ += memcmp(ig, iq, (size_t)n * sizeof(int32_t)) != 0;
        }
        for (int i = 0; i < n; i++) next[which[i]] = iq[i], at[which[i]]++;
        steps++;
    }
    long rg = 0, cg = 0, rq = 0, cq = 0;
    lm_backend_graph_counts(g.be, &rg, &cg);
    lm_backend_graph_counts(q.be, &rq, &cq);
    printf("  %s: %d steps, %d differ; graphs: %ld replayed, %ld captured (graphs off: %ld, %ld)\n", dir, steps,
           differ, rg, cg, rq, cq);
    LM_CHECK(differ == 0);
    LM_CHECK(rq == 0 && cq == 0);
    LM_CHECK_MSG(rg >= N_STEPS / 2, "only %ld of %d steps replayed a graph", rg, N_STEPS);
out:
    free(lg);
    free(lq);
}

static void graphs_equal_eager(lm_test_ctx *lm_t_, const char *dir) {
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("no GPU: %s", why);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    side g, q; /* graphs on, graphs off */
    memset(&q, 0, sizeof q);
    if (side_open(&g, dir, true, &e) || side_open(&q, dir, false, &e)) LM_CHECK_MSG(false, "%s: %s", dir, e.msg);
    else compare(lm_t_, dir, &g, &q);
    side_close(&g);
    side_close(&q);
}

static void local(lm_test_ctx *lm_t_, const char *rel) {
    LM_SKIP_UNLESS_CARRIED(rel);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", LUMEN_SOURCE_DIR, rel);
    graphs_equal_eager(lm_t_, dir);
}

static void fixture(lm_test_ctx *lm_t_, const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    graphs_equal_eager(lm_t_, dir);
    free(dir);
}

LM_TEST(cuda_graphs_demo_hybrid) { local(lm_t_, "models/demo"); }
LM_TEST(cuda_graphs_gemma4_two_ropes) { local(lm_t_, "tests/data/gemma/gemma4-x"); }
LM_TEST(cuda_graphs_moe) { local(lm_t_, "tests/data/moe/qwen3-moe-e32-k8"); }
LM_TEST(cuda_graphs_llama) { fixture(lm_t_, "llama"); }
LM_TEST(cuda_graphs_qwen3) { fixture(lm_t_, "qwen3"); }
