/* cuda_attention_stage.cu - the batch of kv_write, the fused KV writes and
 * attention on the device: its host arrays checked against the KV pool and
 * staged in one copy (att_stage), and within a graph pass staged once for
 * all layers (att_stage_memo).
 *
 * The batch's host arrays (pos, seq, the block tables, flattened with
 * per-sequence offsets, and what the caller adds: the attention's work
 * list) are packed into one host buffer and staged with one lm_cuda_stage.
 * A sequence's table is copied up to the entry of its largest position in
 * this batch, which is all the interface promises to exist. */
#include "cuda_attention.h"

#include <stdlib.h>
#include <string.h>

/* ---- staging the batch ------------------------------------------------------- */

/* Checks every token's slot and every block a token reads ([lo, pos]; lo =
 * pos for kv_write, window > 0 narrows it for attention), then stages pos,
 * seq, the tables and n_extra ints of `extra` in one copy. */
att_dev att_stage(lm_cuda *c, const lm_kv_pool *kv, const lm_attn_batch *b, int window, bool write_only,
                         const int32_t *extra, size_t n_extra) {
    const int T = b->n_tokens, S = b->n_seqs, bs = kv->block_size;
    int32_t *maxp = (int32_t *)lm_xmalloc((size_t)(2 * S + 1) * sizeof(int32_t));
    int32_t *minlo = maxp + S, *off = NULL;
    for (int s = 0; s < S; s++) maxp[s] = -1, minlo[s] = INT32_MAX;
    for (int t = 0; t < T; t++) {
        LM_ASSERT(b->seq[t] >= 0 && b->seq[t] < S && b->pos[t] >= 0);
        const int32_t *table = b->block_tables[b->seq[t]];
        int32_t p = b->pos[t], lo = write_only ? p : (window > 0 ? LM_MAX(0, p - window + 1) : 0);
        int32_t blk = table[p / bs];
        LM_ASSERT(blk >= 0 && blk < kv->n_blocks);
        maxp[b->seq[t]] = LM_MAX(maxp[b->seq[t]], p);
        minlo[b->seq[t]] = LM_MIN(minlo[b->seq[t]], lo);
    }
    size_t total = 0;
    for (int s = 0; s < S; s++) {
        if (maxp[s] < 0) continue;
        const int32_t *table = b->block_tables[s];
        if (!write_only) /* every block between the lowest key and the highest position */
            for (int32_t i = minlo[s] / bs; i <= maxp[s] / bs; i++)
                LM_ASSERT(table[i] >= 0 && table[i] < kv->n_blocks);
        total += (size_t)(maxp[s] / bs + 1);
    }
    /* Layout [pos T][seq T][tab_off S][extra][tables], its size rounded up
     * to a power of two (>= 1024 ints): the pointers and the size are then
     * the same from step to step of a decode, which a CUDA graph replay
     * needs (cuda_graph.cu), while the tables grow a block at a time. */
    size_t n = 2 * (size_t)T + (size_t)S + n_extra + total, n_alloc = 1024;
    while (n_alloc < n) n_alloc *= 2;
    int32_t *h = (int32_t *)lm_xcalloc(n_alloc, sizeof(int32_t));
    memcpy(h, b->pos, (size_t)T * sizeof(int32_t));
    memcpy(h + T, b->seq, (size_t)T * sizeof(int32_t));
    off = h + 2 * T;
    int32_t *tab = off + S + n_extra;
    size_t at = 0;
    for (int s = 0; s < S; s++) {
        off[s] = (int32_t)at;
        if (maxp[s] < 0) continue;
        size_t len = (size_t)(maxp[s] / bs + 1);
        memcpy(tab + at, b->block_tables[s], len * sizeof(int32_t));
        at += len;
    }
    if (n_extra) memcpy(off + S, extra, n_extra * sizeof(int32_t));
    const int32_t *d = (const int32_t *)lm_cuda_stage(c, h, n_alloc * sizeof(int32_t));
    free(h);
    free(maxp);
    att_dev r = { d, d + T, d + 2 * T + S + n_extra, d + 2 * T, d + 2 * T + S };
    return r;
}

/* Within one graph pass (one forward) every layer stages the same batch:
 * the first staging is remembered by what it was built from and reused, so
 * a decode step builds and uploads its tables a few times, not twice per
 * layer. Eager forwards stage each time (nothing marks where they end). */
#define ATT_MEMO_SLOTS 4
typedef struct att_memo_key {
    uint64_t pass;
    const lm_kv_pool *kv;
    const int32_t *pos, *seq;
    const int32_t *const *tables;
    int T, S, window;
    bool write_only;
} att_memo_key;
struct att_memo {
    att_memo_key key[ATT_MEMO_SLOTS];
    att_dev d[ATT_MEMO_SLOTS];
    int next;
};

att_dev att_stage_memo(lm_cuda *c, const lm_kv_pool *kv, const lm_attn_batch *b, int window, bool write_only) {
    if (c->gmode != LM_G_REPLAY && c->gmode != LM_G_CAPTURE) return att_stage(c, kv, b, window, write_only, NULL, 0);
    if (!c->att_memo) c->att_memo = (struct att_memo *)lm_xcalloc(1, sizeof *c->att_memo);
    struct att_memo *m = c->att_memo;
    att_memo_key k;
    memset(&k, 0, sizeof k);
    k.pass = c->gpass, k.kv = kv, k.pos = b->pos, k.seq = b->seq, k.tables = b->block_tables;
    k.T = b->n_tokens, k.S = b->n_seqs, k.window = write_only ? 0 : window, k.write_only = write_only;
    for (int i = 0; i < ATT_MEMO_SLOTS; i++)
        if (!memcmp(&m->key[i], &k, sizeof k)) return m->d[i];
    const int i = m->next;
    m->next = (m->next + 1) % ATT_MEMO_SLOTS;
    m->key[i] = k;
    m->d[i] = att_stage(c, kv, b, window, write_only, NULL, 0);
    return m->d[i];
}
