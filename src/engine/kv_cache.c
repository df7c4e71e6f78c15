/* kv_cache.c - block pool and per-sequence block tables. */
#include "lm_kv_cache.h"

#include "../model/lm_model.h"

#include <stdlib.h>
#include <string.h>

static int cache_create(lm_kv_cache **out, lm_backend *be, int n_layers, int64_t kv_width, const int64_t *layer_width,
                        lm_kv_types types, int rot, int block_size, int n_blocks, const lm_state_spec *state,
                        const bool *ring, int ring_blocks, lm_err *e);

int lm_kv_cache_create(lm_kv_cache **out, lm_backend *be, int n_layers, int64_t kv_width,
                       int block_size, int n_blocks, const lm_state_spec *state, lm_err *e) {
    return lm_kv_cache_create_typed(out, be, n_layers, kv_width, NULL, (lm_kv_types){ LM_KV_F32, LM_KV_F32 }, 0,
                                    block_size, n_blocks, state, e);
}

int lm_kv_check_format(lm_kv_types t, int64_t kv_width, int head_dim, int rot, lm_err *e) {
    if ((unsigned)t.k >= LM_KV_TYPE_COUNT || (unsigned)t.v >= LM_KV_TYPE_COUNT) return lm_errf(e, "bad KV format");
    bool q = lm_kv_quantised(t.k) || lm_kv_quantised(t.v);
    if (q && kv_width % LM_KV_GROUP)
        return lm_errf(e, "KV format %s needs rows of whole %d-value scale groups (this model's KV rows: %lld values)",
                       lm_kv_type_name(lm_kv_quantised(t.k) ? t.k : t.v), LM_KV_GROUP, (long long)kv_width);
    if ((t.k == LM_KV_Q4R || t.v == LM_KV_Q4R) &&
        (rot < 2 || rot > LM_KV_MAX_ROT || (rot & (rot - 1)) || head_dim % rot))
        return lm_errf(e, "KV format q4r: no rotation width of 2..%d divides the head width %d", LM_KV_MAX_ROT,
                       head_dim);
    return 0;
}

int lm_kv_rot_for(int head_dim) {
    int r = head_dim & -head_dim; /* the largest power of two dividing it */
    return LM_MIN(r, LM_KV_ROT_DEFAULT);
}

size_t lm_kv_bytes_per_token(lm_kv_types t, int n_layers, int64_t kv_width) {
    return (size_t)n_layers * (lm_kv_row_bytes(t.k, kv_width) + lm_kv_row_bytes(t.v, kv_width));
}

/* K and V bytes of one token of a layer kv_width wide. */
static size_t row_pair(lm_kv_types t, int64_t w) { return lm_kv_bytes_per_token(t, 1, w); }

static int64_t model_width(const lm_model *m, int l) { return m->kv_layer_width ? m->kv_layer_width[l] : m->kv_width; }

static bool model_ring_layer(const lm_model *m, int l, int ring_blocks) {
    return ring_blocks > 0 && m->kv_layer_sliding && m->kv_layer_sliding[l];
}

size_t lm_kv_model_bytes_per_token(const lm_model *m, lm_kv_types t, int ring_blocks) {
    size_t n = 0;
    for (int l = 0; l < m->n_kv_layers; l++)
        if (!model_ring_layer(m, l, ring_blocks))
            n += row_pair(t, model_width(m, l));
    return n;
}

/* Sliding-window layers in rings (lm_kv_pool.ring_blocks), rather than per-layer
 * block tables in this pool: a block id names a block of every layer, so
 * freeing one for the sliding layers alone would free no memory unless they
 * had an allocator, tables and prefix-cache entries of their own. As rings
 * they are per-sequence state of a fixed size, which the recurrent-state
 * machinery already owns, batches, checkpoints and restores: a prefix hit
 * comes only at a checkpoint (a copy of the ring at a block boundary), so
 * it never restores a block that was reused. The ring holds the window
 * before a forward's first token and the forward's own tokens, so that
 * nothing a forward reads is overwritten by its own writes. */
int lm_kv_ring_for(const lm_model *m, int block_size, int ctx, int max_chunk) {
    const int w = m->cfg.sliding_window;
    bool any = false;
    for (int l = 0; l < m->n_kv_layers; l++) any |= model_ring_layer(m, l, 1);
    if (!any || w <= 0 || max_chunk <= 0 || block_size <= 0) return 0;
    int r = (w - 1 + max_chunk + block_size - 1) / block_size + 1;
    return (int64_t)r * block_size < ctx ? r : 0; /* else keeping every block is no bigger */
}

int lm_kv_model_state_spec(const lm_model *m, lm_kv_types t, int block_size, int ring_blocks, int64_t *floats,
                           int max) {
    int n = lm_model_state_spec(m, floats, max);
    LM_ASSERT(n >= 0 && n <= max);
    for (int l = 0; l < m->n_kv_layers; l++) {
        if (!model_ring_layer(m, l, ring_blocks)) continue;
        LM_ASSERT(n + 2 <= max);
        size_t kb = lm_kv_row_bytes(t.k, model_width(m, l)), vb = lm_kv_row_bytes(t.v, model_width(m, l));
        LM_ASSERT(kb % sizeof(float) == 0 && vb % sizeof(float) == 0);
        floats[n++] = (int64_t)ring_blocks * block_size * (int64_t)(kb / sizeof(float));
        floats[n++] = (int64_t)ring_blocks * block_size * (int64_t)(vb / sizeof(float));
    }
    return n;
}

size_t lm_kv_model_state_bytes(const lm_model *m, lm_kv_types t, int block_size, int ring_blocks) {
    int64_t floats[128];
    const int n = lm_kv_model_state_spec(m, t, block_size, ring_blocks, floats, 128);
    size_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += (size_t)floats[i] * sizeof(float);
    return bytes;
}

static bool pool_ring_layer(const lm_kv_pool *p, int l) { return p->ring_blocks > 0 && p->layer_ring[l]; }

/* Bytes a token of the pool's block layers (ring false) or ring layers takes. */
static size_t pool_token_bytes(const lm_kv_pool *p, bool ring) {
    const lm_kv_types t = { p->k_type, p->v_type };
    size_t n = 0;
    for (int l = 0; l < p->n_layers; l++)
        if (pool_ring_layer(p, l) == ring) n += row_pair(t, lm_kv_layer_width(p, l));
    return n;
}

size_t lm_kv_pool_bytes_per_token(const lm_kv_pool *p) { return pool_token_bytes(p, false); }

size_t lm_kv_pool_ring_bytes(const lm_kv_pool *p) {
    return pool_token_bytes(p, true) * (size_t)p->ring_blocks * (size_t)p->block_size;
}

int lm_kv_cache_create_typed(lm_kv_cache **out, lm_backend *be, int n_layers, int64_t kv_width,
                             const int64_t *layer_width, lm_kv_types types, int rot, int block_size, int n_blocks,
                             const lm_state_spec *state, lm_err *e) {
    return cache_create(out, be, n_layers, kv_width, layer_width, types, rot, block_size, n_blocks, state, NULL, 0, e);
}

/* lm_kv_cache_create_typed with rings: the layers ring names keep
 * ring_blocks blocks per state slot in the last 2 x (ring layers) tensors
 * of state (K, then V, layer by layer), not in the pool. */
static int cache_create(lm_kv_cache **out, lm_backend *be, int n_layers, int64_t kv_width, const int64_t *layer_width,
                        lm_kv_types types, int rot, int block_size, int n_blocks, const lm_state_spec *state,
                        const bool *ring, int ring_blocks, lm_err *e) {
    *out = NULL;
    if (n_layers <= 0 || kv_width <= 0 || block_size <= 0 || n_blocks <= 0)
        return lm_errf(e, "bad KV cache geometry");
    for (int l = 0; layer_width && l < n_layers; l++)
        if (layer_width[l] <= 0 || layer_width[l] > kv_width) return lm_errf(e, "bad KV cache geometry");
    for (int l = 0; l < n_layers; l++) {
        int64_t w = layer_width ? layer_width[l] : kv_width;
        if (lm_kv_check_format(types, w, (int)LM_MIN(w, INT32_MAX), rot, e)) return -1;
    }
    lm_kv_cache *c = lm_xcalloc(1, sizeof *c);
    c->be = be;
    c->pool = (lm_kv_pool){ .n_layers = n_layers, .block_size = block_size, .n_blocks = n_blocks, .kv_width = kv_width,
                            .k_type = types.k, .v_type = types.v, .rot = rot };
    /* each layer's arrays at its own width: a model whose layers differ
     * (Gemma 4: narrow sliding layers, wide global ones) pays for each
     * layer what it writes, not the widest layer's rows everywhere */
    int64_t *widths = lm_xmalloc((size_t)n_layers * sizeof(int64_t));
    for (int l = 0; l < n_layers; l++) widths[l] = layer_width ? layer_width[l] : kv_width;
    c->pool.layer_width = widths;
    int n_ring = 0;
    if (ring_blocks > 0) {
        bool *rl = lm_xmalloc((size_t)n_layers * sizeof(bool));
        for (int l = 0; l < n_layers; l++) n_ring += rl[l] = ring[l];
        c->pool.layer_ring = rl;
        c->pool.ring_blocks = ring_blocks;
    }
    c->pool.k = lm_xcalloc((size_t)n_layers, sizeof(void *));
    c->pool.v = lm_xcalloc((size_t)n_layers, sizeof(void *));
    size_t rows = (size_t)n_blocks * (size_t)block_size;
    for (int l = 0; l < n_layers; l++) {
        if (pool_ring_layer(&c->pool, l)) continue; /* in the state tensors below */
        size_t kbytes = rows * lm_kv_row_bytes(types.k, widths[l]);
        size_t vbytes = rows * lm_kv_row_bytes(types.v, widths[l]);
        c->pool.k[l] = be->ops->alloc(be, kbytes);
        c->pool.v[l] = be->ops->alloc(be, vbytes);
        if (!c->pool.k[l] || !c->pool.v[l]) {
            lm_kv_cache_free(c);
            return lm_errf(e, "out of memory for the KV cache (layer %d of %d: %zu bytes)", l, n_layers,
                           kbytes + vbytes);
        }
    }
    c->free_list = lm_xmalloc((size_t)n_blocks * sizeof(int32_t));
    c->refs = lm_xcalloc((size_t)n_blocks, sizeof(int32_t));
    for (int i = 0; i < n_blocks; i++) c->free_list[i] = n_blocks - 1 - i; /* pop 0 first */
    c->n_free = n_blocks;
    if (state && state->n > 0) {
        lm_kv_pool *p = &c->pool;
        p->n_state = state->n;
        p->n_state_slots = state->slots > 0 ? state->slots : 1;
        p->state_floats = lm_xmalloc((size_t)state->n * sizeof(int64_t));
        p->state = lm_xcalloc((size_t)state->n, sizeof(float *));
        for (int i = 0; i < state->n; i++) {
            p->state_floats[i] = state->floats[i];
            size_t sb = (size_t)p->n_state_slots * (size_t)state->floats[i] * sizeof(float);
            p->state[i] = be->ops->alloc(be, sb);
            if (!p->state[i]) {
                lm_kv_cache_free(c);
                return lm_errf(e, "out of memory for recurrent state (%zu bytes)", sb);
            }
        }
        c->free_slots = lm_xmalloc((size_t)p->n_state_slots * sizeof(int32_t));
        for (int i = 0; i < p->n_state_slots; i++) c->free_slots[i] = p->n_state_slots - 1 - i;
        c->n_free_slots = p->n_state_slots;
    }
    LM_ASSERT(c->pool.n_state >= 2 * n_ring);
    for (int l = 0, i = c->pool.n_state - 2 * n_ring; l < n_layers; l++)
        if (pool_ring_layer(&c->pool, l)) {
            c->pool.k[l] = c->pool.state[i++];
            c->pool.v[l] = c->pool.state[i++];
        }
    *out = c;
    return 0;
}

int lm_kv_cache_create_for(lm_kv_cache **out, const lm_model *m, lm_kv_types types, int block_size, int n_blocks,
                           int state_slots, int ring_blocks, lm_err *e) {
    int64_t floats[128];
    int n = lm_kv_model_state_spec(m, types, block_size, ring_blocks, floats, 128);
    lm_state_spec st = { n, floats, state_slots };
    if (lm_kv_check_model(m, types, e)) return -1;
    if (ring_blocks > 0 && !m->kv_layer_sliding) return lm_errf(e, "KV rings for a model without sliding layers");
    return cache_create(out, m->be, m->n_kv_layers, m->kv_width, m->kv_layer_width, types,
                        lm_kv_rot_for(m->cfg.head_dim), block_size, n_blocks, &st,
                        ring_blocks > 0 ? m->kv_layer_sliding : NULL, ring_blocks, e);
}

int lm_kv_check_model(const lm_model *m, lm_kv_types types, lm_err *e) {
    for (int l = 0; l < m->n_kv_layers; l++)
        if (lm_kv_check_format(types, m->kv_layer_width ? m->kv_layer_width[l] : m->kv_width, m->cfg.head_dim,
                               lm_kv_rot_for(m->cfg.head_dim), e))
            return -1;
    if ((lm_kv_quantised(types.k) || lm_kv_quantised(types.v)) &&
        ((int64_t)m->cfg.n_kv_heads * m->cfg.head_dim) % LM_KV_GROUP)
        return lm_errf(e, "KV format %s needs rows of whole %d-value scale groups (this model's layers write %lld)",
                       lm_kv_type_name(lm_kv_quantised(types.k) ? types.k : types.v), LM_KV_GROUP,
                       (long long)m->cfg.n_kv_heads * m->cfg.head_dim);
    return 0;
}

void lm_kv_state_clear(lm_kv_cache *c, int32_t slot) {
    const lm_kv_pool *p = &c->pool;
    LM_ASSERT(slot >= 0 && slot < p->n_state_slots);
    for (int i = 0; i < p->n_state; i++) {
        size_t n = (size_t)p->state_floats[i] * sizeof(float);
        c->be->ops->clear(c->be, (char *)p->state[i] + (size_t)slot * n, n);
    }
}

int32_t lm_kv_state_take(lm_kv_cache *c) {
    if (c->pool.n_state == 0 || c->n_free_slots == 0) return -1;
    return c->free_slots[--c->n_free_slots];
}

int32_t lm_kv_state_acquire(lm_kv_cache *c) {
    int32_t slot = lm_kv_state_take(c);
    if (slot >= 0) lm_kv_state_clear(c, slot);
    return slot;
}

void lm_kv_state_copy(lm_kv_cache *c, int32_t dst, int32_t src) {
    const lm_kv_pool *p = &c->pool;
    LM_ASSERT(dst >= 0 && dst < p->n_state_slots && src >= 0 && src < p->n_state_slots);
    if (dst == src) return;
    for (int i = 0; i < p->n_state; i++) {
        size_t n = (size_t)p->state_floats[i] * sizeof(float);
        c->be->ops->copy(c->be, (char *)p->state[i] + (size_t)dst * n, (char *)p->state[i] + (size_t)src * n, n);
    }
}

size_t lm_kv_state_bytes(const lm_kv_cache *c) {
    size_t n = 0;
    for (int i = 0; i < c->pool.n_state; i++) n += (size_t)c->pool.state_floats[i] * sizeof(float);
    return n;
}

void lm_kv_state_release(lm_kv_cache *c, int32_t slot) {
    if (slot < 0) return;
    LM_ASSERT(c->n_free_slots < c->pool.n_state_slots);
    c->free_slots[c->n_free_slots++] = slot;
}

void lm_kv_cache_free(lm_kv_cache *c) {
    if (!c) return;
    for (int l = 0; l < c->pool.n_layers; l++) {
        if (pool_ring_layer(&c->pool, l)) continue; /* state tensors, freed below */
        if (c->pool.k[l]) c->be->ops->free(c->be, c->pool.k[l]);
        if (c->pool.v[l]) c->be->ops->free(c->be, c->pool.v[l]);
    }
    free(c->pool.k);
    free(c->pool.v);
    free((void *)c->pool.layer_width);
    free((void *)c->pool.layer_ring);
    for (int i = 0; i < c->pool.n_state; i++)
        if (c->pool.state[i]) c->be->ops->free(c->be, c->pool.state[i]);
    free(c->pool.state);
    free(c->pool.state_floats);
    free(c->free_slots);
    free(c->free_list);
    free(c->refs);
    free(c);
}

int lm_kv_seq_reserve(lm_kv_cache *c, lm_kv_seq *seq, int n_positions, lm_err *e) {
    int need = (n_positions + c->pool.block_size - 1) / c->pool.block_size;
    if (need <= seq->n_blocks) return 0;
    if (need - seq->n_blocks > c->n_free)
        return lm_errf(e, "KV cache full: %d more blocks needed, %d free", need - seq->n_blocks, c->n_free);
    if (need > seq->cap) {
        seq->cap = LM_MAX(need, seq->cap * 2);
        seq->blocks = lm_xrealloc(seq->blocks, (size_t)seq->cap * sizeof(int32_t));
    }
    while (seq->n_blocks < need) {
        int32_t b = c->free_list[--c->n_free];
        c->refs[b] = 1;
        seq->blocks[seq->n_blocks++] = b;
    }
    return 0;
}

void lm_kv_seq_release(lm_kv_cache *c, lm_kv_seq *seq) {
    for (int i = 0; i < seq->n_blocks; i++) lm_kv_block_unref(c, seq->blocks[i]);
    free(seq->blocks);
    memset(seq, 0, sizeof *seq);
}

void lm_kv_seq_share(lm_kv_cache *c, lm_kv_seq *seq, const int32_t *blocks, int n) {
    if (n <= 0) return;
    if (seq->n_blocks + n > seq->cap) {
        seq->cap = LM_MAX(seq->n_blocks + n, seq->cap * 2);
        seq->blocks = lm_xrealloc(seq->blocks, (size_t)seq->cap * sizeof(int32_t));
    }
    for (int i = 0; i < n; i++) {
        lm_kv_block_ref(c, blocks[i]);
        seq->blocks[seq->n_blocks++] = blocks[i];
    }
}

void lm_kv_block_ref(lm_kv_cache *c, int32_t b) {
    LM_ASSERT(b >= 0 && b < c->pool.n_blocks && c->refs[b] > 0);
    c->refs[b]++;
}

void lm_kv_block_unref(lm_kv_cache *c, int32_t b) {
    LM_ASSERT(b >= 0 && b < c->pool.n_blocks && c->refs[b] > 0);
    if (--c->refs[b] == 0) c->free_list[c->n_free++] = b;
}

void lm_kv_block_copy_rows(lm_kv_cache *c, int32_t dst, int32_t src, int n_rows) {
    const lm_kv_pool *p = &c->pool;
    LM_ASSERT(dst >= 0 && dst < p->n_blocks && src >= 0 && src < p->n_blocks && dst != src);
    LM_ASSERT(n_rows >= 0 && n_rows <= p->block_size);
    for (int l = 0; l < p->n_layers; l++) {
        if (pool_ring_layer(p, l)) continue; /* rings are state: lm_kv_state_copy */
        const int64_t w = lm_kv_layer_width(p, l);
        size_t kr = lm_kv_row_bytes(p->k_type, w), kblk = kr * (size_t)p->block_size;
        size_t vr = lm_kv_row_bytes(p->v_type, w), vblk = vr * (size_t)p->block_size;
        c->be->ops->copy(c->be, (char *)p->k[l] + (size_t)dst * kblk, (char *)p->k[l] + (size_t)src * kblk, kr * (size_t)n_rows);
        c->be->ops->copy(c->be, (char *)p->v[l] + (size_t)dst * vblk, (char *)p->v[l] + (size_t)src * vblk, vr * (size_t)n_rows);
    }
}

size_t lm_kv_block_bytes(const lm_kv_cache *c) {
    return (size_t)c->pool.block_size * lm_kv_pool_bytes_per_token(&c->pool);
}

int32_t lm_kv_block_take(lm_kv_cache *c) {
    if (c->n_free == 0) return -1;
    int32_t b = c->free_list[--c->n_free];
    c->refs[b] = 1;
    return b;
}

/* n regions to host, back to back: one read_n where the backend has it. */
static void read_regions(lm_backend *be, int n, void *const *dst, const void *const *src, const size_t *bytes) {
    if (be->ops->read_n) be->ops->read_n(be, n, dst, src, bytes);
    else
        for (int i = 0; i < n; i++) be->ops->read(be, dst[i], src[i], bytes[i]);
}

#define IO_REGIONS 64 /* regions a read_n takes at once */

/* Block b's K and V of every block layer (each at its own width; ring
 * layers are state, lm_kv_state_read) to (to_host) or from host:
 * lm_kv_block_bytes in all. */
static void block_io(lm_kv_cache *c, int32_t b, uint8_t *host, bool to_host) {
    const lm_kv_pool *p = &c->pool;
    LM_ASSERT(b >= 0 && b < p->n_blocks);
    void *dst[IO_REGIONS];
    const void *src[IO_REGIONS];
    size_t len[IO_REGIONS];
    int n = 0;
    for (int l = 0; l < p->n_layers; l++) {
        if (pool_ring_layer(p, l)) continue;
        const int64_t w = lm_kv_layer_width(p, l);
        size_t kblk = lm_kv_row_bytes(p->k_type, w) * (size_t)p->block_size;
        size_t vblk = lm_kv_row_bytes(p->v_type, w) * (size_t)p->block_size;
        char *k = (char *)p->k[l] + (size_t)b * kblk, *v = (char *)p->v[l] + (size_t)b * vblk;
        if (to_host) {
            if (n + 2 > IO_REGIONS) read_regions(c->be, n, dst, src, len), n = 0;
            dst[n] = host, src[n] = k, len[n++] = kblk;
            dst[n] = host + kblk, src[n] = v, len[n++] = vblk;
        } else {
            c->be->ops->write(c->be, k, host, kblk);
            c->be->ops->write(c->be, v, host + kblk, vblk);
        }
        host += kblk + vblk;
    }
    if (n) read_regions(c->be, n, dst, src, len);
}

void lm_kv_block_read(lm_kv_cache *c, int32_t b, void *host) { block_io(c, b, host, true); }
void lm_kv_block_write(lm_kv_cache *c, int32_t b, const void *host) { block_io(c, b, (uint8_t *)host, false); }

static void state_io(lm_kv_cache *c, int32_t slot, uint8_t *host, bool to_host) {
    const lm_kv_pool *p = &c->pool;
    LM_ASSERT(slot >= 0 && slot < p->n_state_slots);
    void *dst[IO_REGIONS];
    const void *src[IO_REGIONS];
    size_t len[IO_REGIONS];
    int k = 0;
    for (int i = 0; i < p->n_state; i++) {
        size_t n = (size_t)p->state_floats[i] * sizeof(float);
        char *s = (char *)p->state[i] + (size_t)slot * n;
        if (to_host) {
            if (k == IO_REGIONS) read_regions(c->be, k, dst, src, len), k = 0;
            dst[k] = host, src[k] = s, len[k++] = n;
        } else {
            c->be->ops->write(c->be, s, host, n);
        }
        host += n;
    }
    if (k) read_regions(c->be, k, dst, src, len);
}

void lm_kv_state_read(lm_kv_cache *c, int32_t slot, void *host) { state_io(c, slot, host, true); }
void lm_kv_state_write(lm_kv_cache *c, int32_t slot, const void *host) { state_io(c, slot, (uint8_t *)host, false); }
