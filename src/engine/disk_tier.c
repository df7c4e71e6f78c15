/* disk_tier.c - how the engine uses the disk cache (lm_disk_cache.h) below
 * its RAM prefix cache (cache_policy.c's two seams).
 *
 * Down: every block and checkpoint leaving the RAM cache (evicted, or a
 * checkpoint dropped for want of slots), every prompt block as it fills
 * and, at the end of every request, its blocks and their checkpoints are
 * queued for the disk unless already there; those of one prefill chunk or
 * one request's end as one pack, in chain order. The pool's bytes are copied
 * out on the engine thread (a memcpy on the CPU; a device-to-host copy on
 * a GPU); the file is written by the writer thread.
 *
 * Up: before admission, when the prompt's chain continues on disk past
 * what the RAM cache holds, the blocks are read, checked and put back into
 * the pool and the RAM cache (and, for a hybrid, the latest checkpoint on
 * the way);
 * the ordinary RAM lookup then serves them. Entries read are pinned so
 * that loading one never evicts another of the same prompt. The reads run
 * on the engine thread for the queue's head before it is admitted, outside
 * the engine lock (lm_cache_policy_prefetch), and again at admission for
 * anything evicted in between.
 *
 * Chain hashes are seeded with the model identity (model_identity.c), not
 * a path, so entries survive a restart and a moved model. */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void spill_cb(void *user, uint64_t hash, uint64_t parent, const int32_t *tokens, int32_t block, int32_t ckpt) {
    lm_engine *en = user;
    lm_disk_tier_spill(en, hash, parent, tokens, block, ckpt);
}

int lm_disk_tier_open(lm_engine *en, const uint64_t ident[2], lm_err *e) {
    int rc = lm_dcache_open_with_faults(&en->dc, en->o.cache_dir, en->o.cache_disk, ident, en->o.cache_faults, e);
    if (rc == LM_DC_REFUSED) return -1;
    if (rc) {
        /* the disk tier only saves work: a directory it cannot use (not a
         * directory, unreadable) leaves the server on its RAM cache, said
         * loudly here and in /metrics (lumen_disk_cache_enabled 0) */
        fprintf(stderr, "lumen: disk cache off: %s; serving with the RAM prefix cache only\n", e->msg);
        en->st.disk_failed = true;
        return 0;
    }
    size_t bb = lm_kv_block_bytes(en->kv), sb = lm_kv_state_bytes(en->kv);
    en->dc_buf = lm_xmalloc(LM_MAX(bb, sb));
    lm_pcache_set_spill(en->pc, spill_cb, en);
    return 0;
}

void lm_disk_tier_close(lm_engine *en) {
    lm_dcache_close(en->dc);
    free(en->dc_buf);
    en->dc = NULL, en->dc_buf = NULL;
}

void lm_disk_tier_spill(lm_engine *en, uint64_t hash, uint64_t parent, const int32_t *tokens, int32_t block,
                        int32_t ckpt) {
    if (block >= 0 && !lm_dcache_has(en->dc, hash, LM_DC_KV)) {
        lm_kv_block_read(en->kv, block, en->dc_buf);
        lm_dcache_put(en->dc, hash, parent, LM_DC_KV, tokens, en->bs, en->dc_buf, lm_kv_block_bytes(en->kv));
    }
    if (ckpt >= 0 && !lm_dcache_has(en->dc, hash, LM_DC_STATE)) {
        lm_kv_state_read(en->kv, ckpt, en->dc_buf);
        lm_dcache_put(en->dc, hash, parent, LM_DC_STATE, tokens, en->bs, en->dc_buf, lm_kv_state_bytes(en->kv));
    }
}

/* A chain's entries, leaf first and root last: the disk's LRU then evicts
 * a chain from its end, as the RAM cache does, never its root first (which
 * would strand every entry after it). */
static void touch_chain(lm_engine *en, const lm_request *r, int from, int to) {
    for (int i = to - 1; i >= from; i--) {
        lm_dcache_touch(en->dc, r->hashes[i], LM_DC_STATE);
        lm_dcache_touch(en->dc, r->hashes[i], LM_DC_KV);
    }
}

void lm_disk_tier_keep(lm_engine *en, const lm_request *r, int from, int to) {
    /* in chain order, into one pack: a restore reads them with one read;
     * when the writer's queue overflows, the prefix's start is what gets in */
    lm_dcache_batch_begin(en->dc);
    for (int i = from; i < to; i++) {
        uint64_t parent = i ? r->hashes[i - 1] : lm_pcache_seed(en->pc);
        lm_disk_tier_spill(en, r->hashes[i], parent, r->tokens + (size_t)i * en->bs, r->seq.blocks[i],
                           lm_pcache_ckpt_of(en->pc, r->hashes[i]));
    }
    lm_dcache_batch_end(en->dc);
    touch_chain(en, r, from, to);
}

/* Block i of r's prompt from disk into a pool block and the RAM cache
 * (pinned); false when it cannot be. */
static bool load_block(lm_engine *en, const lm_request *r, int i) {
    if (!lm_pcache_make_room(en->pc, 1)) return false;
    int32_t b = lm_kv_block_take(en->kv);
    if (b < 0) return false;
    uint64_t parent = i ? r->hashes[i - 1] : lm_pcache_seed(en->pc);
    const int32_t *toks = r->tokens + (size_t)i * en->bs;
    bool ok = lm_dcache_get(en->dc, r->hashes[i], parent, LM_DC_KV, toks, en->bs, en->dc_buf,
                            lm_kv_block_bytes(en->kv)) == 0;
    if (ok) {
        lm_kv_block_write(en->kv, b, en->dc_buf);
        ok = lm_pcache_insert(en->pc, r->hashes[i], parent, toks, b) == 0;
    }
    lm_kv_block_unref(en->kv, b); /* the cache's reference keeps it */
    if (ok) lm_pcache_pin(en->pc, r->hashes[i]);
    return ok;
}

/* The checkpoint at the end of block k - 1 from disk into the RAM cache:
 * its slot first (making room may spill another checkpoint through
 * dc_buf), then the read into dc_buf. */
static bool load_state(lm_engine *en, const lm_request *r, int k) {
    uint64_t parent = k > 1 ? r->hashes[k - 2] : lm_pcache_seed(en->pc);
    int32_t slot = lm_pcache_checkpoint_slot(en->pc, r->hashes[k - 1]);
    if (slot < 0) return false;
    if (lm_dcache_get(en->dc, r->hashes[k - 1], parent, LM_DC_STATE, r->tokens + (size_t)(k - 1) * en->bs, en->bs,
                      en->dc_buf, lm_kv_state_bytes(en->kv)) != 0) {
        lm_pcache_drop_checkpoint(en->pc, r->hashes[k - 1]);
        return false;
    }
    lm_kv_state_write(en->kv, slot, en->dc_buf);
    return true;
}

#define MAX_CHILDREN 16 /* disk blocks continuing one prefix that a mid-block hit compares */
#define BLOCK_MAX 64    /* tokens of a block, at most (the engine's are 16) */

/* An attention model whose prompt leaves the cached chain inside block k
 * (its first k blocks cached, the k-th not): the block on disk under the
 * same parent that shares the most leading tokens with the prompt, into
 * the pool and the RAM cache (pinned), whose lookup then copies those rows
 * (copy-on-write), as it does for a block held in RAM. Only the tokens are
 * read to compare; the chosen entry is then read and checked whole. */
static bool load_partial(lm_engine *en, const lm_request *r, int k) {
    const int limit = r->n_prompt - 1; /* the last prompt token is always computed */
    const int avail = LM_MIN(en->bs, limit - k * en->bs);
    if (avail <= 0) return false;
    uint64_t parent = k ? r->hashes[k - 1] : lm_pcache_seed(en->pc), kids[MAX_CHILDREN], best_hash = 0;
    int n = lm_dcache_children(en->dc, parent, LM_DC_KV, kids, MAX_CHILDREN), best = 0;
    int32_t toks[BLOCK_MAX], best_toks[BLOCK_MAX];
    LM_ASSERT(en->bs <= BLOCK_MAX);
    const int32_t *want = r->tokens + (size_t)k * en->bs;
    for (int c = 0; c < n; c++) {
        if (lm_pcache_has(en->pc, kids[c])) continue; /* the RAM lookup sees it already */
        if (lm_dcache_peek(en->dc, kids[c], parent, LM_DC_KV, toks, en->bs) != 0) continue;
        int l = 0;
        while (l < avail && toks[l] == want[l]) l++;
        if (l > best) best = l, best_hash = kids[c], memcpy(best_toks, toks, (size_t)en->bs * sizeof *toks);
    }
    if (best == 0 || !lm_pcache_make_room(en->pc, 1)) return false;
    int32_t b = lm_kv_block_take(en->kv);
    if (b < 0) return false;
    bool ok = lm_dcache_get(en->dc, best_hash, parent, LM_DC_KV, best_toks, en->bs, en->dc_buf,
                            lm_kv_block_bytes(en->kv)) == 0;
    if (ok) {
        lm_kv_block_write(en->kv, b, en->dc_buf);
        ok = lm_pcache_insert(en->pc, best_hash, parent, best_toks, b) == 0;
    }
    lm_kv_block_unref(en->kv, b);
    if (ok) lm_pcache_pin(en->pc, best_hash);
    return ok;
}

bool lm_disk_tier_extend(lm_engine *en, const lm_request *r, const lm_pcache_hit *ram) {
    const int m = ram->kv_blocks;
    /* a hybrid resumes from a checkpoint <= n - 1; attention copies up to the last full block */
    const int max_full = en->stateful ? (r->n_prompt - 1) / en->bs : r->n_prompt / en->bs;
    int end = m;
    while (end < max_full && lm_dcache_ready(en->dc, r->hashes[end], LM_DC_KV)) end++;
    int target = end;
    if (en->stateful)
        while (target > ram->n_blocks && !lm_dcache_ready(en->dc, r->hashes[target - 1], LM_DC_STATE)) target--;
    /* attention: past the last full block the prompt shares, part of the next */
    bool partial = !en->stateful && end * en->bs < r->n_prompt - 1;
    if (target <= (en->stateful ? ram->n_blocks : m) && !partial) return false;
    for (int i = ram->n_blocks; i < m; i++) lm_pcache_pin(en->pc, r->hashes[i]); /* the RAM part stays */
    int loaded = m;
    if (target - m > 1) lm_dcache_willneed(en->dc, r->hashes + m, target - m, LM_DC_KV);
    while (loaded < target && load_block(en, r, loaded)) loaded++;
    touch_chain(en, r, 0, loaded);
    if (!en->stateful) return (loaded == end && partial && load_partial(en, r, loaded)) || loaded > m;
    for (int k = loaded; k > ram->n_blocks; k--)
        if (lm_dcache_ready(en->dc, r->hashes[k - 1], LM_DC_STATE) && load_state(en, r, k)) return true;
    return loaded > m;
}
