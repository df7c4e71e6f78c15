/* test_guard_prefix_cache.c - the prefix cache evicts the least recently
 * used entry, and its keys name whole prefixes (issue #25: eviction taking
 * the most recent entry went unnoticed because no test checked the order).
 *
 * Design. The cache alone, on a small CPU pool (1 layer, 16-token blocks):
 * one-block prompts whose first tokens all differ (so that a miss touches
 * nothing: a lookup only refreshes what it matches), put in and looked up in
 * a planned order; each eviction must take exactly the entry that order says
 * is the least recently used, whether the byte budget (insert) or the pool
 * (make_room) forces it. A miss is probed before anything else is looked up,
 * since lookups refresh the entries they hit. Checkpoints (hybrid models)
 * have their own LRU under the slot cap: the oldest checkpoint goes. */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_kv_cache.h"
#include "engine/lm_prefix_cache.h"
#include "lm_test.h"

enum { BS = 16, W = 4 };

typedef struct pc_env {
    lm_backend *be;
    lm_kv_cache *kv;
    lm_prefix_cache *pc;
} pc_env;

static int env_open(pc_env *v, int n_blocks, int budget_blocks, int ckpt_slots, int budget_ckpts) {
    memset(v, 0, sizeof *v);
    v->be = lm_cpu_backend_create(1, LM_ISA_AUTO, NULL);
    if (!v->be) return -1;
    int64_t fl[1] = { 8 };
    lm_state_spec spec = { ckpt_slots ? 1 : 0, ckpt_slots ? fl : NULL, ckpt_slots ? 1 + ckpt_slots : 0 };
    if (lm_kv_cache_create(&v->kv, v->be, 1, W, BS, n_blocks, &spec, NULL)) return -1;
    size_t budget = (size_t)budget_blocks * lm_kv_block_bytes(v->kv) + (size_t)budget_ckpts * lm_kv_state_bytes(v->kv);
    v->pc = lm_pcache_create(v->kv, budget, ckpt_slots, 77);
    return v->pc ? 0 : -1;
}

static void env_close(pc_env *v) {
    lm_pcache_free(v->pc);
    lm_kv_cache_free(v->kv);
    lm_backend_destroy(v->be);
}

/* Prompt `tag`: n tokens; block b's tokens start with tag*100 + b (every
 * block of every prompt differs at its first token). */
static void prompt(int tag, int n, int32_t *t) {
    for (int i = 0; i < n; i++) t[i] = i % BS == 0 ? tag * 100 + i / BS : 5000 + tag * 7 + i;
}

static void hashes_of(const pc_env *v, const int32_t *t, int n, uint64_t *h) {
    for (int i = 0; i < n / BS; i++) h[i] = lm_pcache_hash(i ? h[i - 1] : lm_pcache_seed(v->pc), t + i * BS, BS);
}

/* Tokens of prompt `tag` (n tokens, stateful or not) served from the cache. */
static int hit_tokens(pc_env *v, const int32_t *t, int n, bool stateful) {
    uint64_t h[8];
    int32_t blocks[8];
    hashes_of(v, t, n, h);
    lm_pcache_hit hit;
    lm_pcache_lookup(v->pc, t, n, h, stateful, &hit, blocks);
    lm_pcache_unpin(v->pc);
    return hit.n_tokens;
}

static int hits(pc_env *v, int tag, int n) {
    int32_t t[128];
    prompt(tag, n, t);
    return hit_tokens(v, t, n, false);
}

/* A request for prompt `tag` of n tokens: lookup, blocks, every full block
 * inserted, the sequence released (the cache keeps its blocks). With `slot`
 * >= 0 the last full block gets a checkpoint. 0 on success. */
static int serve(pc_env *v, int tag, int n, int slot) {
    int32_t t[128], blocks[8];
    uint64_t h[8];
    prompt(tag, n, t);
    hashes_of(v, t, n, h);
    lm_pcache_hit hit;
    lm_pcache_lookup(v->pc, t, n, h, slot >= 0, &hit, blocks);
    int need = (n + BS - 1) / BS - hit.n_blocks;
    if (v->kv->n_free < need && !lm_pcache_make_room(v->pc, need)) {
        lm_pcache_unpin(v->pc);
        return -1;
    }
    lm_kv_seq seq = { 0 };
    lm_kv_seq_share(v->kv, &seq, blocks, hit.n_blocks);
    if (lm_kv_seq_reserve(v->kv, &seq, n, NULL)) return -1;
    lm_pcache_unpin(v->pc);
    int rc = 0;
    for (int i = 0; i < n / BS && rc == 0; i++) rc = lm_pcache_insert(v->pc, h[i], i ? h[i - 1] : lm_pcache_seed(v->pc), t + i * BS, seq.blocks[i]);
    if (rc == 0 && slot >= 0 && n / BS > 0) rc = lm_pcache_checkpoint(v->pc, h[n / BS - 1], slot) >= 0 ? 0 : -1;
    lm_kv_seq_release(v->kv, &seq);
    return rc;
}

/* The byte budget holds 4 blocks: each insert past it evicts the least
 * recently used entry (a lookup hit refreshes an entry). */
LM_TEST(guard_prefix_lru_budget_order) {
    pc_env v;
    LM_REQUIRE(env_open(&v, 32, 4, 0, 0) == 0);
    enum { A = 1, B, C, D, E, F, G };
    for (int tag = A; tag <= D; tag++) LM_REQUIRE(serve(&v, tag, 17, -1) == 0); /* recency: D C B A */
    LM_CHECK(hits(&v, A, 17) == 16);                                            /* A D C B */
    LM_REQUIRE(serve(&v, E, 17, -1) == 0);                                      /* B goes: E A D C */
    LM_CHECK_MSG(hits(&v, B, 17) == 0, "B (least recently used) was kept");
    LM_REQUIRE(serve(&v, F, 17, -1) == 0); /* C goes: F E A D */
    LM_CHECK_MSG(hits(&v, C, 17) == 0, "C (least recently used) was kept");
    LM_CHECK(hits(&v, D, 17) == 16);       /* D F E A */
    LM_REQUIRE(serve(&v, G, 17, -1) == 0); /* A goes: G D F E */
    LM_CHECK_MSG(hits(&v, A, 17) == 0, "A (least recently used) was kept");
    int kept = 0;
    for (int tag = D; tag <= G; tag++) kept += hits(&v, tag, 17) == 16;
    LM_CHECK_MSG(kept == 4, "%d of D, E, F, G kept", kept);
    lm_pcache_stats st;
    lm_pcache_get_stats(v.pc, &st);
    LM_CHECK(st.blocks == 4 && st.evicted_blocks == 3);
    LM_CHECK(lm_pcache_check(v.pc) == 0);
    env_close(&v);
}

/* Only leaves are evicted, and a lookup refreshes the whole chain it used:
 * a two-block prompt's leaf goes before its root, and a chain refreshed by a
 * hit outlives single blocks put in before that hit. */
LM_TEST(guard_prefix_lru_chains) {
    pc_env v;
    LM_REQUIRE(env_open(&v, 32, 4, 0, 0) == 0);
    enum { X = 1, B, C, D };
    LM_REQUIRE(serve(&v, X, 33, -1) == 0); /* X0 <- X1: recency X1 X0 */
    LM_REQUIRE(serve(&v, B, 17, -1) == 0); /* B X1 X0 */
    LM_REQUIRE(serve(&v, C, 17, -1) == 0); /* C B X1 X0: full */
    LM_REQUIRE(serve(&v, D, 17, -1) == 0); /* X0 has a child: X1 goes, D C B X0 */
    LM_CHECK_MSG(hits(&v, X, 33) == 16, "X kept %d tokens, want its first block only", hits(&v, X, 33));
    /* that lookup refreshed X0: X0 D C B */
    LM_REQUIRE(serve(&v, X + 10, 17, -1) == 0); /* B goes */
    LM_CHECK(hits(&v, B, 17) == 0);
    LM_CHECK(hits(&v, C, 17) == 16 && hits(&v, D, 17) == 16 && hits(&v, X, 33) == 16);
    LM_CHECK(lm_pcache_check(v.pc) == 0);
    env_close(&v);
}

/* When the pool (not the budget) runs short, make_room evicts least
 * recently used entries first, and only as many as needed. */
LM_TEST(guard_prefix_lru_make_room_order) {
    pc_env v;
    LM_REQUIRE(env_open(&v, 6, 6, 0, 0) == 0);
    enum { A = 1, B, C, D };
    for (int tag = A; tag <= D; tag++) LM_REQUIRE(serve(&v, tag, 17, -1) == 0); /* D C B A; 4 blocks held, 2 free */
    LM_CHECK(hits(&v, A, 17) == 16);                                            /* A D C B */
    LM_REQUIRE(v.kv->n_free == 2);
    LM_REQUIRE(lm_pcache_make_room(v.pc, 4)); /* two must go: B, then C */
    LM_CHECK(v.kv->n_free == 4);
    LM_CHECK_MSG(hits(&v, B, 17) == 0 && hits(&v, C, 17) == 0, "B and C (least recently used) were kept");
    LM_CHECK_MSG(hits(&v, A, 17) == 16 && hits(&v, D, 17) == 16, "A or D (recently used) was evicted");
    LM_CHECK(lm_pcache_check(v.pc) == 0);
    env_close(&v);
}

/* Checkpoints: with 2 slots, a third checkpoint drops the least recently
 * used one (a hybrid hits only at a checkpoint, so its prompt then misses). */
LM_TEST(guard_prefix_lru_checkpoints) {
    pc_env v;
    LM_REQUIRE(env_open(&v, 32, 8, 2, 2) == 0);
    int32_t slot = lm_kv_state_acquire(v.kv);
    LM_REQUIRE(slot >= 0);
    enum { A = 1, B, C };
    int32_t t[64];
    LM_REQUIRE(serve(&v, A, 17, slot) == 0);
    LM_REQUIRE(serve(&v, B, 17, slot) == 0); /* B A */
    prompt(A, 17, t);
    LM_CHECK(hit_tokens(&v, t, 17, true) == 16); /* A B */
    LM_REQUIRE(serve(&v, C, 17, slot) == 0);     /* B's checkpoint goes */
    prompt(B, 17, t);
    LM_CHECK_MSG(hit_tokens(&v, t, 17, true) == 0, "B's checkpoint (least recently used) was kept");
    prompt(A, 17, t);
    LM_CHECK_MSG(hit_tokens(&v, t, 17, true) == 16, "A's checkpoint (recently used) was dropped");
    prompt(C, 17, t);
    LM_CHECK(hit_tokens(&v, t, 17, true) == 16);
    lm_pcache_stats st;
    lm_pcache_get_stats(v.pc, &st);
    LM_CHECK(st.checkpoints == 2 && st.blocks == 3);
    LM_CHECK(lm_pcache_check(v.pc) == 0);
    lm_kv_state_release(v.kv, slot);
    env_close(&v);
}

/* A block's key names everything before it: two prompts whose second blocks
 * are equal but whose first blocks differ are two chains, both served in
 * full; and the key depends on the seed (the model's identity). */
LM_TEST(guard_prefix_hash_names_prefix) {
    pc_env v;
    LM_REQUIRE(env_open(&v, 32, 8, 0, 0) == 0);
    int32_t x[33], z[33];
    prompt(1, 33, x);
    memcpy(z, x, sizeof z);
    z[0] = 999; /* another first block, the same second block */
    uint64_t hx[2], hz[2];
    hashes_of(&v, x, 33, hx);
    hashes_of(&v, z, 33, hz);
    LM_CHECK(hx[0] != hz[0]);
    LM_CHECK_MSG(hx[1] != hz[1], "the second block's key ignores the first block");
    LM_CHECK(lm_pcache_hash(1, x, BS) != lm_pcache_hash(2, x, BS));
    for (int k = 0; k < 2; k++) {
        const int32_t *t = k ? z : x;
        const uint64_t *h = k ? hz : hx;
        int32_t blocks[4];
        lm_pcache_hit hit;
        lm_pcache_lookup(v.pc, t, 33, h, false, &hit, blocks);
        lm_kv_seq seq = { 0 };
        LM_REQUIRE(lm_kv_seq_reserve(v.kv, &seq, 33, NULL) == 0);
        lm_pcache_unpin(v.pc);
        LM_CHECK(lm_pcache_insert(v.pc, h[0], lm_pcache_seed(v.pc), t, seq.blocks[0]) == 0);
        LM_CHECK(lm_pcache_insert(v.pc, h[1], h[0], t + BS, seq.blocks[1]) == 0);
        lm_kv_seq_release(v.kv, &seq);
    }
    LM_CHECK_MSG(hit_tokens(&v, x, 33, false) == 32, "x: %d", hit_tokens(&v, x, 33, false));
    LM_CHECK_MSG(hit_tokens(&v, z, 33, false) == 32, "z: %d", hit_tokens(&v, z, 33, false));
    lm_pcache_stats st;
    lm_pcache_get_stats(v.pc, &st);
    LM_CHECK(st.blocks == 4);
    env_close(&v);
}
