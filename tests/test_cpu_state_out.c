/* test_cpu_state_out.c - the recurrent ops' per-position state
 * (lm_attn_batch.state_out) on the CPU backend: speculative decoding's
 * rollback takes the state after an accepted draft from it (spec.c), so it
 * must be the state that feeding the tokens one forward at a time leaves.
 *
 * One batch, two interleaved sequences: a verify-like run of 5 tokens that
 * asks for the state after each of its first 4, and a 70-token prefill from
 * position 0 that asks after token 30 (a chunk of the chunked form ends
 * there). Reference: the same tokens fed in pieces that end where a state
 * is asked for, the slot read after each piece. Bit-identical: a verify's
 * tokens take the recurrent step as decoding does, a piece's chunk is the
 * chunk the batch cuts, and conv windows are copies of the inputs. The
 * sequences' own slots end as without state_out, and other slots are
 * untouched. */
#include "lm_test.h"

#include "backend/lm_backend.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

enum { HK = 2, HV = 4, DK = 8, DV = 6, QKV = 2 * HK * DK + HV * DV, CW = QKV, K = 4 };
enum { DELTA_F = HV * DK * DV, CONV_F = (K - 1) * CW, SLOT_F = CONV_F + DELTA_F, SLOTS = 12, NA = 5, NB = 70 };

static float so_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

typedef struct so_pool {
    lm_kv_pool kv;
    int64_t floats;
    float *state;
} so_pool;

/* conv1d_state, then gated_delta on its output, over batch b; token t
 * takes row rows[t] of the inputs x, g and beta. */
static void so_forward(lm_backend *be, so_pool *p, const lm_attn_batch *b, const float *x, const float *w,
                       const float *g, const float *beta, const int *rows) {
    const int T = b->n_tokens;
    float *xs = malloc(sizeof(float) * T * CW), *gs = malloc(sizeof(float) * T * HV),
          *bs = malloc(sizeof(float) * T * HV);
    for (int t = 0; t < T; t++) {
        memcpy(xs + t * CW, x + rows[t] * CW, sizeof(float) * CW);
        memcpy(gs + t * HV, g + rows[t] * HV, sizeof(float) * HV);
        memcpy(bs + t * HV, beta + rows[t] * HV, sizeof(float) * HV);
    }
    lm_tensor tx, tw, ty, tg, tb, to;
    LM_ASSERT(!lm_tensor_alloc(be, &tx, T, CW) && !lm_tensor_alloc(be, &tw, CW, K) && !lm_tensor_alloc(be, &ty, T, CW));
    LM_ASSERT(!lm_tensor_alloc(be, &tg, T, HV) && !lm_tensor_alloc(be, &tb, T, HV) &&
              !lm_tensor_alloc(be, &to, T, HV * DV));
    be->ops->write(be, tx.data, xs, sizeof(float) * T * CW);
    be->ops->write(be, tw.data, w, sizeof(float) * CW * K);
    be->ops->write(be, tg.data, gs, sizeof(float) * T * HV);
    be->ops->write(be, tb.data, bs, sizeof(float) * T * HV);
    be->ops->conv1d_state(be, &ty, &tx, &tw, &p->kv, (lm_state_ref){ 0, 0 }, b, true);
    lm_delta_params dp = { HK, HV, DK, DV, { 0, CONV_F }, false };
    be->ops->gated_delta(be, &to, &ty, &tg, &tb, &p->kv, b, &dp);
    lm_tensor *all[] = { &tx, &tw, &ty, &tg, &tb, &to };
    for (size_t i = 0; i < LM_COUNT(all); i++) lm_tensor_release(be, all[i]);
    free(xs), free(gs), free(bs);
}

static const float *so_slot(const so_pool *p, int s) { return p->state + (size_t)s * SLOT_F; }

static void state_out_case(lm_test_ctx *lm_t_, lm_cpu_isa isa, int threads) {
    if (isa > lm_cpu_isa_detect()) return;
    lm_backend *be = lm_cpu_backend_create(threads, isa, NULL);
    LM_REQUIRE(be && be->ops->state_out);
    uint64_t seed = 17 + (uint64_t)threads;
    float *x = malloc(sizeof(float) * (NA + NB) * CW), w[CW * K], g[(NA + NB) * HV], beta[(NA + NB) * HV];
    float *init = malloc(sizeof(float) * SLOTS * SLOT_F);
    for (int i = 0; i < (NA + NB) * CW; i++) x[i] = so_rnd(&seed);
    for (int i = 0; i < CW * K; i++) w[i] = so_rnd(&seed);
    for (int i = 0; i < (NA + NB) * HV; i++) g[i] = -0.8f + 0.7f * so_rnd(&seed), beta[i] = 0.5f + 0.5f * so_rnd(&seed);
    for (int i = 0; i < SLOTS * SLOT_F; i++) init[i] = 0.3f * so_rnd(&seed); /* saved states and garbage */
    so_pool p = { .floats = SLOT_F };
    p.state = be->ops->alloc(be, sizeof(float) * SLOTS * SLOT_F);
    p.kv = (lm_kv_pool){ .n_state = 1, .n_state_slots = SLOTS, .state_floats = &p.floats, .state = &p.state };
    be->ops->write(be, p.state, init, sizeof(float) * SLOTS * SLOT_F);

    /* the batch: A (rows 0..4, slot 0, positions 9..13) asks after its first
     * 4 tokens into slots 2..5; B (rows 5.., slot 1, from 0) after token 30
     * into slot 6 */
    int n[2] = { NA, NB }, pos0[2] = { 9, 0 };
    int32_t pos[NA + NB], seq[NA + NB], slot[2] = { 0, 1 }, out[NA + NB];
    int rows[NA + NB], T = lm_tu_round_robin(2, n, pos0, pos, seq);
    for (int t = 0, seen[2] = { 0, 0 }; t < T; t++) {
        int s = seq[t], i = seen[s]++;
        rows[t] = s == 0 ? i : NA + i;
        out[t] = s == 0 && i < NA - 1 ? 2 + i : s == 1 && i == 30 ? 6 : -1;
    }
    lm_attn_batch b = { T, pos, seq, 2, NULL, slot, out };
    so_forward(be, &p, &b, x, w, g, beta, rows);
    float *got = malloc(sizeof(float) * SLOTS * SLOT_F);
    memcpy(got, p.state, sizeof(float) * SLOTS * SLOT_F);

    /* the reference: pieces A 1,1,1,1,1 and B 31,39, each from the state before */
    be->ops->write(be, p.state, init, sizeof(float) * SLOTS * SLOT_F);
    for (int i = 0; i < NA; i++) {
        int32_t pa = 9 + i, sa = 0, zs = 0;
        int r = i;
        lm_attn_batch one = { 1, &pa, &zs, 1, NULL, &sa, NULL };
        so_forward(be, &p, &one, x, w, g, beta, &r);
        if (i < NA - 1)
            LM_CHECK_MSG(memcmp(so_slot(&p, 0), got + (size_t)(2 + i) * SLOT_F, sizeof(float) * SLOT_F) == 0,
                         "state after verify token %d differs from one token at a time", i);
    }
    LM_CHECK(memcmp(so_slot(&p, 0), got, sizeof(float) * SLOT_F) == 0); /* A's own slot: after its last */
    for (int piece = 0, done = 0; piece < 2; piece++) {
        int len = piece == 0 ? 31 : NB - 31, r[NB];
        int32_t pb[NB], zs[NB], sb = 1;
        for (int i = 0; i < len; i++) pb[i] = done + i, zs[i] = 0, r[i] = NA + done + i;
        lm_attn_batch pc = { len, pb, zs, 1, NULL, &sb, NULL };
        so_forward(be, &p, &pc, x, w, g, beta, r);
        if (piece == 0)
            LM_CHECK_MSG(memcmp(so_slot(&p, 1), got + (size_t)6 * SLOT_F, sizeof(float) * SLOT_F) == 0,
                         "state after prefill token 30 differs from a forward that ends there");
        done += len;
    }
    LM_CHECK(memcmp(so_slot(&p, 1), got + SLOT_F, sizeof(float) * SLOT_F) == 0); /* B's own slot */
    for (int s = 7; s < SLOTS; s++) /* slots nobody named: untouched */
        LM_CHECK(memcmp(got + (size_t)s * SLOT_F, init + (size_t)s * SLOT_F, sizeof(float) * SLOT_F) == 0);
    free(got), free(x), free(init);
    be->ops->free(be, p.state);
    lm_backend_destroy(be);
}

LM_TEST(hybrid_state_out_per_position) {
    static const lm_cpu_isa isas[] = { LM_ISA_SCALAR, LM_ISA_AVX2, LM_ISA_AVX512 };
    for (size_t i = 0; i < LM_COUNT(isas); i++) state_out_case(lm_t_, isas[i], 1 + (int)(i % 2));
}
