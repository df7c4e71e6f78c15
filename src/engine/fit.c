/* fit.c - the engine's memory: how big the KV pool is, and a warm-up
 * forward that allocates everything a step will need.
 *
 * The pool holds blocks for the running sequences (kv_tokens, one spare
 * block per sequence) plus the prefix cache's blocks and, for hybrids, its
 * checkpoint slots; every running sequence also has a state slot, and
 * speculation adds spare slots (lm_spec_state_slots) and, with the MTP
 * head, the head's own K/V for every block (lm_spec_head_block_bytes), with
 * a draft model its K/V for every block and its state slots. On a
 * backend with its own memory (a GPU) all of it is allocated up front, so
 * it must fit what the device has free: the default KV size shrinks to fit,
 * an explicit one that does not fit is an error with the numbers. The
 * warm-up then runs the largest forward a step can send, so a GPU that
 * cannot hold the activations fails at creation, not mid-request. */
#include "engine_internal.h"

#include <stdio.h>
#include <unistd.h>

/* The host's available memory (MemAvailable; free pages where /proc is
 * absent), 0 when unknown. */
static size_t host_available(void) {
    size_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            avail = (size_t)kb << 10;
            break;
        }
    }
    if (f) fclose(f);
    if (!avail) {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages > 0 && psz > 0) avail = (size_t)pages * (size_t)psz;
    }
    return avail;
}

/* LM_CACHE_RAM_AUTO (lm_engine.h): on a GPU the cache's blocks live in its
 * memory, where a 1 GiB cap would hold 8k tokens of an 8B model's bf16 KV;
 * a quarter of what the weights leave keeps room for the running KV. */
static size_t default_cache_ram(const lm_engine *en) {
    size_t free_b = 0, total_b = 0;
    lm_backend_mem_info(en->m->be, &free_b, &total_b);
    if (total_b > 0) return free_b / 4;
    const size_t cap = (size_t)1 << 30, avail = host_available();
    return avail ? LM_MIN(cap, avail / 4) : cap;
}

size_t lm_engine_cache_ram(const lm_engine *en) { return en->o.cache_ram; }

/* On a backend with its own memory the default KV pool (parallel * ctx
 * tokens at the model's full context) can be far beyond it. Shrinks the KV
 * tokens, and the context if even one sequence would not fit, to 90 % of
 * the free memory (the rest is for activations and workspaces), saying so;
 * an explicit kv_tokens that does not fit is an error with the numbers.
 * Admission then keeps requests within it. */
static int fit_device_memory(lm_engine *en, const lm_engine_opts *opts, size_t block_bytes, size_t state_bytes,
                             size_t cache_blocks, int slots, size_t extra, int *n_blocks, lm_err *e) {
    size_t free_b = 0, total_b = 0;
    lm_backend_mem_info(en->m->be, &free_b, &total_b);
    if (total_b == 0) return 0; /* host memory: pages are touched as they are used */
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const size_t budget = free_b / 10 * 9, block = (size_t)en->bs;
    const size_t fixed = (size_t)slots * state_bytes + cache_blocks * block_bytes + extra;
    const size_t want = (size_t)*n_blocks * block_bytes + fixed;
    if (want <= budget) return 0;
    if (opts && opts->kv_tokens > 0)
        return lm_errf(e, "a KV cache of %d tokens (plus the prefix cache) needs %.2f GiB; the GPU has %.2f GiB free of %.2f",
                       en->o.kv_tokens, want / gib, free_b / gib, total_b / gib);
    size_t fit_blocks = budget > fixed ? (budget - fixed) / block_bytes : 0;
    fit_blocks = fit_blocks > (size_t)en->o.parallel ? fit_blocks - (size_t)en->o.parallel : 0;
    if (fit_blocks * block < 256)
        return lm_errf(e, "a KV cache of 256 tokens and the prefix cache and state slots (%.2f GiB) do not fit in the "
                       "GPU's %.2f GiB free of %.2f (try a smaller --cache-ram)",
                       (double)(fixed + 16 * block_bytes) / gib, free_b / gib, total_b / gib);
    en->o.kv_tokens = (int)LM_MIN(fit_blocks * block, (size_t)INT32_MAX / 2);
    if (en->o.ctx > en->o.kv_tokens) en->o.ctx = en->o.kv_tokens;
    *n_blocks = (en->o.kv_tokens + (int)block - 1) / (int)block + en->o.parallel;
    fprintf(stderr, "lumen: KV cache sized to %d tokens (context %d) to fit the GPU's %.2f GiB free\n",
            en->o.kv_tokens, en->o.ctx, free_b / gib);
    return 0;
}

int lm_fit_memory(lm_engine *en, const lm_engine_opts *opts, int *n_blocks, size_t *cache_blocks, lm_err *e) {
    const lm_model *m = en->m;
    const int block = en->bs;
    if (en->o.cache_ram == LM_CACHE_RAM_AUTO) en->o.cache_ram = default_cache_ram(en);
    /* one spare block per sequence: budgets rarely end on a block boundary */
    *n_blocks = (en->o.kv_tokens + block - 1) / block + en->o.parallel;
    /* the prefix cache's blocks and checkpoint slots come on top */
    /* sliding-window layers in rings that hold a window and a step's tokens */
    en->ring = lm_kv_ring_for(m, block, en->o.ctx, lm_engine_max_step(en));
    const size_t state_bytes = lm_kv_model_state_bytes(m, en->o.kv_type, block, en->ring);
    size_t block_bytes = (size_t)block * lm_kv_model_bytes_per_token(m, en->o.kv_type, en->ring);
    en->stateful = state_bytes > 0;
    /* speculation: the MTP head's K/V (its pool has a block for each of
     * the engine's) and spare state slots (snapshots, or per position) */
    block_bytes += lm_spec_head_block_bytes(&en->o, m, block);
    /* a draft model's K/V (a block for each of the engine's too) and its state slots */
    const size_t dm_state = en->dm_model ? lm_dm_state_bytes(&en->o, en->dm_model, block) : 0;
    if (en->dm_model) block_bytes += lm_dm_block_bytes(&en->o, en->dm_model, block);
    const int spec_slots = lm_spec_state_slots(&en->o, m, en->stateful);
    *cache_blocks = en->o.cache_ram / block_bytes;
    int ckpts = 0;
    if (*cache_blocks > (size_t)(INT32_MAX / 2 - *n_blocks)) *cache_blocks = (size_t)(INT32_MAX / 2 - *n_blocks);
    if (state_bytes && *cache_blocks) {
        /* checkpoint slots for up to half the budget (at least one when it fits next to a block) */
        size_t c = en->o.cache_ram / 2 / state_bytes;
        if (c == 0 && en->o.cache_ram >= state_bytes + block_bytes) c = 1;
        ckpts = (int)LM_MIN(c, (size_t)4096);
    }
    en->ckpt_slots = ckpts;
    const int slots = en->stateful ? en->o.parallel + ckpts + spec_slots : 0;
    if (fit_device_memory(en, opts, block_bytes, state_bytes, *cache_blocks, slots, dm_state, n_blocks, e)) return -1;
    en->fit_bytes = ((size_t)*n_blocks + *cache_blocks) * block_bytes + (size_t)slots * state_bytes + dm_state;
    return 0;
}

size_t lm_engine_cache_bytes(const lm_engine *en, size_t *counted) {
    const lm_kv_pool *p = &en->kv->pool;
    if (counted) *counted = en->fit_bytes;
    return (size_t)p->n_blocks * lm_kv_block_bytes(en->kv) + (size_t)p->n_state_slots * lm_kv_state_bytes(en->kv) +
           lm_mtp_bytes(en->spec_mtp) + lm_dm_bytes(en->spec_dm);
}

/* A warm-up forward: a prefill of T tokens (capped by the context and the
 * pool) on a scratch sequence, with as many output rows as a decode step
 * of every running sequence asks for; then the sequence is released. The
 * prefix cache never sees it. Runs before the engine thread starts, so it
 * borrows the step's builder. */
static int warm_up(lm_engine *en, int T, lm_err *e) {
    T = LM_MIN(LM_MIN(T, en->o.ctx), en->o.kv_tokens);
    /* every running sequence's row, and its draft's (lm_spec.h) */
    const int n_out = LM_MIN(en->o.parallel * (1 + lm_spec_max_draft(en->spec)), T);
    lm_kv_seq seq = { 0 };
    if (lm_kv_seq_reserve(en->kv, &seq, T, e)) return -1;
    int32_t slot = en->stateful ? lm_kv_state_acquire(en->kv) : -1;
    /* the step's builder and id rows: T <= its tokens, n_out <= its rows */
    lm_batch_builder *bb = en->bb;
    lm_batch_reset(bb);
    int s = lm_batch_add_seq(bb, seq.blocks, slot);
    lm_batch_add_tokens(bb, s, NULL, 0, T);
    for (int i = 0; i < n_out; i++) lm_batch_add_out(bb, T - n_out + i);
    lm_batch_set_argmax(bb, en->cur.ids, NULL, false);
    int rc = lm_batch_forward(bb, en->m, &en->kv->pool, NULL, e);
    if (slot >= 0) lm_kv_state_release(en->kv, slot);
    lm_kv_seq_release(en->kv, &seq);
    if (rc && e) {
        char why[sizeof e->msg];
        snprintf(why, sizeof why, "%s", e->msg);
        lm_errf(e, "warm-up forward of %d tokens failed: %s", T, why);
    }
    return rc;
}

int lm_fit_prefill_tokens(int step, int want, size_t used1, size_t used2, size_t free_b) {
    if (want <= 2 * step) return want; /* the warm-ups ran it */
    /* bytes a token beyond 2 * step: the growth between the warm-ups, or
     * (none: buffers with room to spare) an even share of the second */
    const double per = used2 > used1 ? (double)(used2 - used1) / step : (double)used2 / (2.0 * step);
    if (per <= 0) return want;
    const double fit = 2.0 * step + (double)free_b / 2 / per;
    if (fit >= want) return want;
    return LM_MAX(step, (int)(fit / step) * step);
}

/* lm_engine_opts.warmup: the largest forward a step can send, so that every
 * activation and workspace buffer exists before the first request. On a
 * GPU the default prompt-only budget (4096) may need more than the memory
 * the KV pool left (90 % of it went there): measured at step_tokens and
 * twice that, it is lowered to what fits, saying so, rather than failing
 * at the first long prompt or aborting here. */
int lm_fit_warm_up(lm_engine *en, bool auto_prefill, lm_err *e) {
    if (!lm_engine_opt_on(en, en->o.warmup)) return 0;
    const int step = en->o.step_tokens, want = en->o.prefill_tokens;
    size_t f0 = 0, f1 = 0, f2 = 0, total = 0;
    lm_backend_mem_info(en->m->be, &f0, &total);
    if (!auto_prefill || want <= step || total == 0) return warm_up(en, lm_engine_max_step(en), e);
    if (warm_up(en, step, e)) return -1;
    lm_backend_mem_info(en->m->be, &f1, &total);
    if (warm_up(en, LM_MIN(2 * step, want), e)) return -1;
    lm_backend_mem_info(en->m->be, &f2, &total);
    const int fit = lm_fit_prefill_tokens(step, want, f0 > f1 ? f0 - f1 : 0, f0 > f2 ? f0 - f2 : 0, f2);
    if (fit < want) {
        fprintf(stderr, "lumen: prompts alone go in steps of %d tokens, not %d: the GPU has %.2f GiB free after the "
                        "KV cache (--prefill-tokens sets it)\n",
                fit, want, (double)f2 / (1024.0 * 1024.0 * 1024.0));
        en->o.prefill_tokens = fit;
    }
    return en->o.prefill_tokens > 2 * step ? warm_up(en, en->o.prefill_tokens, e) : 0;
}
