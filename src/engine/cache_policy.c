/* cache_policy.c - how the engine uses its prefix cache (lm_prefix_cache.h
 * is the cache itself: entries, LRU, checkpoint slots).
 *
 * At admission the prompt is looked up: the full blocks it shares with
 * cached ones join its block table by reference; a hit ending inside a
 * block copies that block's first rows into a fresh block (copy-on-write);
 * a hybrid model also copies the recurrent-state checkpoint at the hit into
 * the sequence's slot. When the pool is short, cache-only blocks are
 * evicted before the request waits. After every forward the blocks a
 * sequence filled (prompt or generated) are inserted, so concurrent and
 * later requests can share them. Hybrids take checkpoints at the last
 * block boundary <= the prompt end and <= the prompt end - 1 (prefill
 * chunks are cut there), every 1024 prompt tokens when the pool has 16 or
 * more checkpoint slots, where the request's chat messages end and densely
 * inside its last message (lm_cache_policy_plan), and at every block
 * boundary reached while
 * generating (keeping only the latest), so that a next turn - prompt +
 * answer + new message - hits. The history of recent requests tells why a
 * prompt hit less than it shares with one of them (lm_cache_miss).
 *
 * The disk tier (disk_tier.c) hooks in at two places only:
 * lm_cache_policy_lookup, which extends the RAM hit from the disk (loads
 * the blocks and checkpoint past it into the pool and the RAM cache, then
 * looks up again), and the end of a request, whose blocks it writes behind
 * (with what the RAM cache evicts, through its spill hook). Nothing else
 * here knows where a block came from.
 *
 * Everything runs on the engine thread; admission (lookup, restore) runs
 * under en->mu and updates en->st there. */
#include "engine_internal.h"
#include "lm_model_identity.h"

#include <stdlib.h>
#include <string.h>

#define HIST_REQUESTS 64          /* requests the miss diagnostics remember */
#define HIST_TOKENS (1u << 22)    /* and at most this many tokens of them */

/* Prompt checkpoints every LM_CKPT_EVERY tokens as well, when the pool has
 * slots to spare (LM_CKPT_EVERY_MIN_SLOTS): a prompt that departs from a long
 * earlier one (a rewritten turn, dropped reasoning) then resumes from the
 * last multiple before the divergence instead of from nothing. */
#define LM_CKPT_EVERY 1024
#define LM_CKPT_EVERY_MIN_SLOTS 16

/* Where the server marks message ends (lm_gen_params.prompt_marks), a
 * hybrid checkpoints at the block end at or below each, and inside the last
 * marked message (between the last two marks) every LM_CKPT_FINE tokens,
 * widened so that there are at most LM_CKPT_FINE_MAX: a prompt departing
 * there then replays fewer than LM_CKPT_FINE tokens (when that message is
 * up to 1,024 tokens long). */
#define LM_CKPT_FINE 64
#define LM_CKPT_FINE_MAX 16

int lm_cache_policy_create(lm_engine *en, size_t cache_blocks, lm_err *e) {
    static const char no_ram[] = "--cache-dir needs a RAM prefix cache (--cache-ram above 0): disk entries come back through it";
    const lm_model *m = en->m;
    if (en->o.cache_dir && !cache_blocks) return lm_errf(e, "%s", no_ram);
    if (cache_blocks) {
        /* the KV format too: blocks of another format must never hit */
        struct { int64_t vocab, layers, kv_layers, kv_width, max_pos, k_type, v_type, block, state; } id = {
            m->cfg.vocab, m->cfg.n_layers, m->n_kv_layers, m->kv_width, m->cfg.max_pos,
            en->kv->pool.k_type, en->kv->pool.v_type, en->bs, (int64_t)lm_kv_state_bytes(en->kv) };
        uint64_t ident[2] = { 0, 0 }, seed;
        if (en->o.cache_dir) {
            /* entries outlive the process: name the model by its bytes, not its path */
            double t0 = lm_now();
            lm_model_identity(m, &id, sizeof id, ident, &en->st.disk_identity_sampled);
            en->st.disk_identity_s = lm_now() - t0;
            seed = ident[0];
        } else {
            seed = lm_pcache_model_seed(m->path, &id, sizeof id, m->weight_bytes);
        }
        en->pc = lm_pcache_create(en->kv, en->o.cache_ram, en->ckpt_slots, seed);
        if (en->o.cache_dir && !en->pc) return lm_errf(e, "%s", no_ram);
        if (en->o.cache_dir && lm_disk_tier_open(en, ident, e)) return -1;
    }
    en->hist = lm_hist_create(HIST_REQUESTS, HIST_TOKENS);
    en->hit_blocks = lm_xmalloc(((size_t)en->o.ctx / (size_t)en->bs + 2) * sizeof(int32_t));
    return 0;
}

void lm_cache_policy_free(lm_engine *en) {
    if (en->dc) lm_disk_tier_close(en);
    lm_pcache_free(en->pc);
    lm_hist_free(en->hist);
    free(en->hit_blocks);
    en->pc = NULL, en->hist = NULL, en->hit_blocks = NULL;
}

/* Chain hashes of r's full blocks among its first n tokens. */
static void hash_blocks(lm_engine *en, lm_request *r, int n) {
    for (int i = r->n_hashes; i < n / en->bs; i++) {
        uint64_t parent = i ? r->hashes[i - 1] : lm_pcache_seed(en->pc);
        r->hashes[i] = lm_pcache_hash(parent, r->tokens + (size_t)i * en->bs, en->bs);
        r->n_hashes = i + 1;
    }
}

/* Full block i of r into the cache: 0 when it is there. Every block the
 * cache takes comes through here (a lower tier's write-behind seam). */
static int keep_block(lm_engine *en, lm_request *r, int i) {
    uint64_t parent = i ? r->hashes[i - 1] : lm_pcache_seed(en->pc);
    return lm_pcache_insert(en->pc, r->hashes[i], parent, r->tokens + (size_t)i * en->bs, r->seq.blocks[i]);
}

/* ---- checkpoints ---- */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void lm_cache_policy_plan(const lm_engine *en, lm_request *r, const int32_t *marks, int n) {
    if (!en->pc || !en->stateful || !marks || n <= 0) return;
    const int bs = en->bs;
    int32_t *at = lm_xmalloc(((size_t)n + LM_CKPT_FINE_MAX) * sizeof *at);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (marks[i] > 0 && marks[i] <= r->n_prompt) at[k++] = marks[i];
    qsort(at, (size_t)k, sizeof *at, cmp_i32);
    if (k > 0) {
        /* inside the last message (between the last two marks), where a
         * retried or rewritten turn departs: fewer than LM_CKPT_FINE_MAX
         * more, LM_CKPT_FINE apart or wider */
        int last = at[k - 1], base = k > 1 ? at[k - 2] / bs * bs : 0;
        int step = LM_MAX(LM_CKPT_FINE, (last - base + LM_CKPT_FINE_MAX - 1) / LM_CKPT_FINE_MAX);
        step = (step + bs - 1) / bs * bs;
        for (int p = base + step; p < last && k < n + LM_CKPT_FINE_MAX; p += step) at[k++] = p;
    }
    /* the block end at or below each; sorted, once each */
    for (int i = 0; i < k; i++) at[i] = at[i] / bs * bs;
    qsort(at, (size_t)k, sizeof *at, cmp_i32);
    int u = 0;
    for (int i = 0; i < k; i++)
        if (at[i] > 0 && (u == 0 || at[i] != at[u - 1])) at[u++] = at[i];
    if (u == 0) {
        free(at);
        return;
    }
    /* the latest ones when there are more than half the slots: a prompt
     * departs from an earlier one late more often than early */
    int keep = LM_MIN(u, LM_MAX(1, en->ckpt_slots / 2));
    memmove(at, at + (u - keep), (size_t)keep * sizeof *at);
    r->ckpt_at = at;
    r->n_ckpt_at = keep;
}

/* The prompt checkpoint positions of a hybrid: the last block boundary
 * <= n_prompt - 1 (a repeat of the prompt hits it) and <= n_prompt (a prompt
 * that extends this one hits it), the multiples of LM_CKPT_EVERY, and the
 * request's planned ones (message boundaries). */
static bool is_prompt_ckpt(const lm_engine *en, const lm_request *r, int pos) {
    if (pos <= 0) return false;
    if (en->ckpt_slots >= LM_CKPT_EVERY_MIN_SLOTS && pos % LM_CKPT_EVERY == 0) return true;
    if (r->n_ckpt_at && bsearch(&(int32_t){ pos }, r->ckpt_at, (size_t)r->n_ckpt_at, sizeof(int32_t), cmp_i32))
        return true;
    return pos == (r->n_prompt - 1) / en->bs * en->bs || pos == r->n_prompt / en->bs * en->bs;
}

int lm_cache_policy_cut(const lm_engine *en, const lm_request *r, int n) {
    if (!en->pc || !en->stateful) return n;
    int cut = n;
    for (int p = r->n_cached + 1; p < r->n_cached + n; p++)
        if (p % en->bs == 0 && is_prompt_ckpt(en, r, p)) {
            cut = p - r->n_cached;
            break;
        }
    return cut;
}

bool lm_cache_policy_may_checkpoint(const lm_engine *en, int n_cached) {
    return en->stateful && en->pc && n_cached % en->bs == 0;
}

/* ---- after forwards ---- */

void lm_cache_policy_progress(lm_engine *en, lm_request *r) {
    if (!en->pc) return;
    int full = r->n_cached / en->bs, from = r->n_ins;
    hash_blocks(en, r, r->n_cached);
    while (r->n_ins < full && keep_block(en, r, r->n_ins) == 0) r->n_ins++;
    /* prompt blocks go to disk as they fill, so the writer works during the
     * prefill (generated ones wait for the end: no device copy per token) */
    if (en->dc && r->n_cached <= r->n_prompt) lm_disk_tier_keep(en, r, from, r->n_ins);
    if (!en->stateful || r->n_cached % en->bs || r->n_cached == 0 || r->n_ins < full) return;
    uint64_t h = r->hashes[full - 1];
    if (r->n_cached <= r->n_prompt) {
        if (is_prompt_ckpt(en, r, r->n_cached)) lm_pcache_checkpoint(en->pc, h, r->slot);
        return;
    }
    /* generating: keep only the latest boundary's checkpoint */
    if (lm_pcache_checkpoint(en->pc, h, r->slot) == 1) {
        if (r->has_gen_ckpt) lm_pcache_drop_checkpoint(en->pc, r->gen_ckpt);
        r->has_gen_ckpt = true;
        r->gen_ckpt = h;
    }
}

/* At the end of a request: its full blocks (prompt and generated tokens with
 * K/V) are kept, including any evicted while it ran, most recent first. */
static void keep_all(lm_engine *en, lm_request *r) {
    if (!en->pc) return;
    lm_cache_policy_progress(en, r);
    int full = r->n_cached / en->bs, ok = 0;
    while (ok < full && keep_block(en, r, ok) == 0) ok++;
    if (ok > 0) lm_pcache_touch(en->pc, r->hashes[ok - 1]);
    if (en->dc) lm_disk_tier_keep(en, r, 0, ok);
}

void lm_cache_policy_finish(lm_engine *en, lm_request *r, bool keep) {
    if (keep) keep_all(en, r);
    lm_hist_update(en->hist, r->hist_id, r->tokens, r->n_tokens);
}

/* ---- admission ---- */

void lm_cache_policy_prefetch(lm_engine *en) {
    if (!en->dc) return;
    pthread_mutex_lock(&en->mu);
    /* only this thread takes requests off the queue: r stays valid unlocked */
    lm_request *r = en->q_head;
    pthread_mutex_unlock(&en->mu);
    if (!r || r->embed || r->prefetched || atomic_load(&r->cancelled)) return;
    r->prefetched = true;
    double t0 = lm_now();
    hash_blocks(en, r, r->n_prompt);
    lm_pcache_hit before, after;
    lm_pcache_lookup(en->pc, r->tokens, r->n_prompt, r->hashes, en->stateful, &before, en->hit_blocks);
    bool loaded = lm_disk_tier_extend(en, r, &before);
    lm_pcache_unpin(en->pc);
    r->tr.disk_read_s += lm_now() - t0;
    if (!loaded) return;
    lm_pcache_lookup(en->pc, r->tokens, r->n_prompt, r->hashes, en->stateful, &after, en->hit_blocks);
    lm_pcache_unpin(en->pc);
    r->prefetch_disk = LM_MAX(0, after.n_tokens - before.n_tokens);
}

void lm_cache_policy_lookup(lm_engine *en, lm_request *r, lm_cache_hit *hit) {
    *hit = (lm_cache_hit){ .ram = { .cow_block = -1, .ckpt = -1 }, .blocks = en->hit_blocks, .t_lookup = lm_now() };
    if (en->pc) {
        hash_blocks(en, r, r->n_prompt);
        lm_pcache_lookup(en->pc, r->tokens, r->n_prompt, r->hashes, en->stateful, &hit->ram, en->hit_blocks);
        double t0 = lm_now();
        bool loaded = en->dc && lm_disk_tier_extend(en, r, &hit->ram);
        if (en->dc) r->tr.disk_read_s += lm_now() - t0;
        if (loaded) {
            int ram_tokens = hit->ram.n_tokens;
            lm_pcache_unpin(en->pc);
            lm_pcache_lookup(en->pc, r->tokens, r->n_prompt, r->hashes, en->stateful, &hit->ram, en->hit_blocks);
            hit->disk_tokens = LM_MAX(0, hit->ram.n_tokens - ram_tokens);
        }
        /* what the prefetch loaded came from disk too, as far as it is still used */
        hit->disk_tokens = LM_MIN(hit->ram.n_tokens, hit->disk_tokens + r->prefetch_disk);
    }
    hit->t_found = lm_now();
}

bool lm_cache_policy_make_room(lm_engine *en, int blocks) { return en->pc && lm_pcache_make_room(en->pc, blocks); }

void lm_cache_policy_unpin(lm_engine *en) {
    if (en->pc) lm_pcache_unpin(en->pc);
}

/* Miss diagnostics: the closest earlier request, and why the hit fell short. */
static lm_cache_miss diagnose(lm_engine *en, lm_request *r, const lm_pcache_hit *hit) {
    lm_hist_match hm;
    lm_hist_closest(en->hist, r->tokens, r->n_prompt, &hm);
    lm_request_trace *t = &r->tr;
    t->n_shared = hm.n_shared;
    t->diverge_pos = hm.diverge_pos;
    t->prev_start = hm.prev_start;
    t->n_prev = hm.n_prev;
    memcpy(t->prev_window, hm.prev_window, sizeof t->prev_window);
    int usable = LM_MIN(hm.n_shared, r->n_prompt - 1);
    int aligned = usable / en->bs * en->bs;
    if (en->pc && hit->n_tokens < aligned)
        return en->stateful && hit->kv_blocks * en->bs >= aligned ? LM_MISS_STATE : LM_MISS_EVICTED;
    return hm.diverge_pos >= 0 ? LM_MISS_DIVERGED : LM_MISS_NONE;
}

void lm_cache_policy_restore(lm_engine *en, lm_request *r, const lm_cache_hit *hit) {
    const lm_pcache_hit *h = &hit->ram;
    if (h->cow_block >= 0)
        lm_kv_block_copy_rows(en->kv, r->seq.blocks[h->n_blocks], h->cow_block, h->n_tokens % en->bs);
    if (h->ckpt >= 0) lm_kv_state_copy(en->kv, r->slot, h->ckpt);
    lm_cache_policy_unpin(en);
    r->tr.lookup_s = hit->t_found - hit->t_lookup;
    r->tr.restore_s = lm_now() - hit->t_found;
    r->n_cached = r->n_hit = h->n_tokens;
    r->n_ins = h->n_blocks;
    r->tr.miss = diagnose(en, r, h);
    r->hist_id = lm_hist_add(en->hist, r->tokens, r->n_prompt);
    if (en->pc) {
        en->st.cache_lookup_tokens += (uint64_t)r->n_prompt;
        en->st.cache_hit_tokens += (uint64_t)h->n_tokens;
        en->st.cache_disk_hit_tokens += (uint64_t)hit->disk_tokens;
    }
    r->tr.n_cached_disk = hit->disk_tokens;
    en->st.miss_diverged += r->tr.miss == LM_MISS_DIVERGED;
    en->st.miss_evicted += r->tr.miss == LM_MISS_EVICTED;
    en->st.miss_state += r->tr.miss == LM_MISS_STATE;
}

void lm_cache_policy_stats(lm_engine *en) {
    if (!en->pc) return;
    lm_pcache_stats ps;
    lm_pcache_get_stats(en->pc, &ps);
    en->st.cache_blocks = ps.blocks;
    en->st.cache_checkpoints = ps.checkpoints;
    en->st.cache_bytes = ps.bytes;
    en->st.cache_evicted_blocks = ps.evicted_blocks;
    if ((en->st.disk_on = en->dc != NULL)) lm_dcache_get_stats(en->dc, &en->st.disk);
}
