/* lm_prefix_cache.h - the RAM prefix cache: full KV blocks kept for reuse,
 * addressed by a hash chain, with recurrent-state checkpoints for hybrid
 * models; and the history of recent requests that explains misses.
 *
 * A cached block is one lm_kv_cache block (16 tokens) on which the cache holds
 * one reference. Its key is the chain hash of everything up to its end:
 *   h_0 = seed (the model's identity), h_i = XXH3(tokens of block i-1, h_{i-1})
 * so that a key names a whole prefix, not just 16 tokens. Entries form a tree
 * (parent = the previous block); only childless entries are evicted, least
 * recently used first, so every cached block stays reachable from the root.
 *
 * A checkpoint is a recurrent-state slot of the pool holding the state of a
 * sequence exactly at the end of an entry's block. Blocks and checkpoints are
 * counted together against the byte budget; the number of checkpoints is also
 * capped by the slots the pool set aside for them.
 *
 * Everything here runs on the engine thread; the pool's memory is only ever
 * touched through backend ops (copy). */
#ifndef LM_PREFIX_CACHE_H
#define LM_PREFIX_CACHE_H

#include "lm_engine.h"
#include "lm_kv_cache.h"

typedef struct lm_prefix_cache lm_prefix_cache;

/* budget: bytes for blocks and checkpoints; max_ckpts: state slots the pool
 * reserved for checkpoints (0 for attention-only models); seed: the model's
 * identity (lm_pcache_model_seed). NULL when the budget holds no block. */
lm_prefix_cache *lm_pcache_create(lm_kv_cache *kv, size_t budget, int max_ckpts, uint64_t seed);
/* Drops every block reference and checkpoint slot back into kv. */
void lm_pcache_free(lm_prefix_cache *pc);

/* A seed naming the model: its path, geometry and weight size. */
uint64_t lm_pcache_model_seed(const char *path, const void *cfg, size_t cfg_bytes, size_t weight_bytes);
/* The chain hash of the block after `parent` (the seed for block 0). */
uint64_t lm_pcache_hash(uint64_t parent, const int32_t *tokens, int block_size);
uint64_t lm_pcache_seed(const lm_prefix_cache *pc);

/* What a lookup found for a prompt. */
typedef struct lm_pcache_hit {
    int n_tokens;       /* tokens restored (always < the prompt length) */
    int n_blocks;       /* leading full blocks shared as they are: blocks[0, n_blocks) */
    int32_t cow_block;  /* when n_tokens % 16: the block whose first n_tokens % 16 rows
                         * are copied into the sequence's block n_blocks; else -1 */
    int32_t ckpt;       /* stateful: the state slot holding the state at n_tokens; else -1 */
    int kv_blocks;      /* full prompt blocks whose K/V the chain matched */
} lm_pcache_hit;

/* Longest usable prefix of tokens[0, n): hashes[i] is the chain hash of full
 * block i (n / 16 of them). Stateful models only hit at a checkpoint. The
 * entries the hit uses are pinned (not evicted) until lm_pcache_unpin. */
void lm_pcache_lookup(lm_prefix_cache *pc, const int32_t *tokens, int n, const uint64_t *hashes, bool stateful,
                      lm_pcache_hit *hit, int32_t *blocks);
void lm_pcache_unpin(lm_prefix_cache *pc);

/* Evicts unpinned entries until the pool has `need` free blocks; false (and
 * nothing evicted) when even evicting all of them would not do. */
bool lm_pcache_make_room(lm_prefix_cache *pc, int need);

/* Keeps `block` (full, holding tokens) as the entry `hash` under `parent`
 * (the seed for block 0). 0: cached (or already there); -1: the parent is not
 * cached or the budget has no room. */
int lm_pcache_insert(lm_prefix_cache *pc, uint64_t hash, uint64_t parent, const int32_t *tokens, int32_t block);
/* Copies state slot `slot` into a checkpoint on entry `hash`. 1: made; 0: the
 * entry had one already; -1: the entry is gone or there is no room. */
int lm_pcache_checkpoint(lm_prefix_cache *pc, uint64_t hash, int32_t slot);
/* A new checkpoint on entry `hash` whose state the caller writes into the
 * returned slot (a lower tier's restore; no spare slot needed); -1 when the
 * entry is gone or has one, or there is no room. */
int32_t lm_pcache_checkpoint_slot(lm_prefix_cache *pc, uint64_t hash);
/* Frees the checkpoint on entry `hash`, if any. */
void lm_pcache_drop_checkpoint(lm_prefix_cache *pc, uint64_t hash);
/* Whether entry `hash` is cached. */
bool lm_pcache_has(const lm_prefix_cache *pc, uint64_t hash);
/* The state slot of entry `hash`'s checkpoint, or -1. */
int32_t lm_pcache_ckpt_of(const lm_prefix_cache *pc, uint64_t hash);
/* Pins entry `hash` (if cached) until lm_pcache_unpin, like a lookup's hit. */
void lm_pcache_pin(lm_prefix_cache *pc, uint64_t hash);
/* Told about what leaves the cache, before it goes (a lower tier keeps it):
 * an evicted block (block >= 0; ckpt its checkpoint's slot or -1), or a
 * checkpoint dropped for want of slots (block -1). parent: the parent's
 * hash, the seed for block 0. */
typedef void (*lm_pcache_spill_fn)(void *user, uint64_t hash, uint64_t parent, const int32_t *tokens, int32_t block,
                                   int32_t ckpt);
void lm_pcache_set_spill(lm_prefix_cache *pc, lm_pcache_spill_fn fn, void *user);
/* Marks the chain ending at `hash` most recently used (leaf first, root last). */
void lm_pcache_touch(lm_prefix_cache *pc, uint64_t hash);

typedef struct lm_pcache_stats {
    int blocks, checkpoints;
    size_t bytes;
    uint64_t evicted_blocks;
} lm_pcache_stats;
void lm_pcache_get_stats(const lm_prefix_cache *pc, lm_pcache_stats *s);
/* Checks the cache's invariants against the pool (tests); 0 when consistent. */
int lm_pcache_check(const lm_prefix_cache *pc);

/* ---- request history (miss diagnostics) ---- */

typedef struct lm_req_history lm_req_history;

/* Keeps the tokens of at most max_entries recent requests, max_tokens in all. */
lm_req_history *lm_hist_create(int max_entries, size_t max_tokens);
void lm_hist_free(lm_req_history *h);
/* Records tokens[0, n); returns an id for lm_hist_update. */
uint64_t lm_hist_add(lm_req_history *h, const int32_t *tokens, int n);
/* Replaces the tokens of request `id` (its answer grew), if still kept. */
void lm_hist_update(lm_req_history *h, uint64_t id, const int32_t *tokens, int n);

typedef struct lm_hist_match {
    int n_shared;      /* longest common prefix with the closest earlier request */
    int prev_len;      /* that request's length; 0 when none */
    int diverge_pos;   /* first differing position; -1 when one is a prefix of the other */
    int prev_start, n_prev;
    int32_t prev_window[LM_TRACE_WINDOW];
} lm_hist_match;
void lm_hist_closest(const lm_req_history *h, const int32_t *tokens, int n, lm_hist_match *m);

#endif
