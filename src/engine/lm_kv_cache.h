/* lm_kv_cache.h - the paged KV cache: a pool of fixed-size blocks per layer
 * and, per sequence, a block table. Blocks are reference-counted so that
 * sequences sharing a prefix can share its blocks (the prefix cache and
 * copy-on-write build on this). */
#ifndef LM_KV_CACHE_H
#define LM_KV_CACHE_H

#include "../backend/lm_backend.h"

typedef struct lm_kv_cache {
    lm_backend *be;       /* not owned */
    lm_kv_pool pool;
    int32_t *free_list;   /* [n_blocks] stack of free block ids */
    int n_free;
    int32_t *refs;        /* [n_blocks] */
    int32_t *free_slots;  /* [n_state_slots] stack of free recurrent-state slots */
    int n_free_slots;
} lm_kv_cache;

/* Recurrent state a model needs per sequence (lm_model_state_spec). */
typedef struct lm_state_spec {
    int n;                   /* state tensors; 0 for a pure-attention model */
    const int64_t *floats;   /* [n] floats per slot of each */
    int slots;               /* how many sequences can hold state at once */
} lm_state_spec;

typedef struct lm_kv_seq {
    int32_t *blocks;      /* block table */
    int n_blocks, cap;
} lm_kv_seq;

/* An f32 cache. */
int lm_kv_cache_create(lm_kv_cache **out, lm_backend *be, int n_layers, int64_t kv_width,
                       int block_size, int n_blocks, const lm_state_spec *state, lm_err *e);
/* A cache whose K and V rows are in the formats types (lm_kv_type.h); rot:
 * the rotation width of LM_KV_Q4R (lm_kv_rot_for), else ignored.
 * layer_width: [n_layers] values a row of each layer holds (each at most
 * kv_width), copied; NULL: every layer kv_width. */
int lm_kv_cache_create_typed(lm_kv_cache **out, lm_backend *be, int n_layers, int64_t kv_width,
                             const int64_t *layer_width, lm_kv_types types, int rot, int block_size, int n_blocks,
                             const lm_state_spec *state, lm_err *e);
/* Whether a model of this KV width and head width can use the formats
 * (quantised ones need heads of whole scale groups); -1 with e if not. */
int lm_kv_check_format(lm_kv_types t, int64_t kv_width, int head_dim, int rot, lm_err *e);
/* The rotation width for heads of head_dim values: its largest power-of-two
 * divisor, at most LM_KV_ROT_DEFAULT. */
#define LM_KV_ROT_DEFAULT 128
int lm_kv_rot_for(int head_dim);
/* KV bytes one token takes over n_layers layers of kv_width (K and V) in these formats. */
size_t lm_kv_bytes_per_token(lm_kv_types t, int n_layers, int64_t kv_width);
/* The same summed over model m's KV layers, each at its own width (those
 * kept in rings left out when ring_blocks > 0), and over a pool's block
 * layers (the figure of the startup line). */
struct lm_model;
size_t lm_kv_model_bytes_per_token(const struct lm_model *m, lm_kv_types t, int ring_blocks);
size_t lm_kv_pool_bytes_per_token(const lm_kv_pool *p);
/* Bytes the rings of one state slot take (0 without rings). */
size_t lm_kv_pool_ring_bytes(const lm_kv_pool *p);
/* Blocks per sequence in which m's sliding-window layers can keep their
 * window (lm_kv_pool.ring_blocks) when no forward gives a sequence more than
 * max_chunk tokens: ceil((window - 1 + max_chunk) / block_size) + 1; 0 when
 * the model has none or a ring would be no smaller than a ctx-token
 * sequence's blocks. */
int lm_kv_ring_for(const struct lm_model *m, int block_size, int ctx, int max_chunk);
/* The per-slot state tensors of m's cache (floats each, into floats[max]):
 * its recurrent state (lm_model_state_spec), then K and V of each ring
 * layer; their count. */
int lm_kv_model_state_spec(const struct lm_model *m, lm_kv_types t, int block_size, int ring_blocks, int64_t *floats,
                           int max);
/* Bytes of one slot of those tensors (0: m needs no state slot). */
size_t lm_kv_model_state_bytes(const struct lm_model *m, lm_kv_types t, int block_size, int ring_blocks);
void lm_kv_cache_free(lm_kv_cache *c);

/* The cache model m needs: its KV layers and width in the formats types,
 * and its recurrent state with state_slots slots (ignored for
 * attention-only models). ring_blocks > 0 (lm_kv_ring_for): its sliding
 * layers in rings of that many blocks per slot, state like the recurrent
 * one (a slot per sequence, checkpoints, restores). A format the model's
 * heads cannot take is an error naming it. */
int lm_kv_cache_create_for(lm_kv_cache **out, const struct lm_model *m, lm_kv_types types, int block_size,
                           int n_blocks, int state_slots, int ring_blocks, lm_err *e);
/* Whether model m can keep its KV cache in the formats types; -1 with e
 * naming the format and the width that does not fit. */
int lm_kv_check_model(const struct lm_model *m, lm_kv_types types, lm_err *e);

/* Makes seq's table cover positions [0, n_positions); -1 (with e) when the
 * pool is out of blocks, leaving seq as it was. */
int lm_kv_seq_reserve(lm_kv_cache *c, lm_kv_seq *seq, int n_positions, lm_err *e);
/* Returns every block of seq to the pool (shared blocks when their last user lets go). */
void lm_kv_seq_release(lm_kv_cache *c, lm_kv_seq *seq);
/* Appends n existing blocks to seq's (empty or block-aligned) table, taking a
 * reference on each: the prefix cache's blocks shared by a new sequence. */
void lm_kv_seq_share(lm_kv_cache *c, lm_kv_seq *seq, const int32_t *blocks, int n);

/* Another reference on a block in use; dropping the last returns it to the pool. */
void lm_kv_block_ref(lm_kv_cache *c, int32_t b);
void lm_kv_block_unref(lm_kv_cache *c, int32_t b);
/* Copies the first n_rows token rows of block src into block dst, every
 * layer, K and V (copy-on-write of a partly shared block). Backend ops only. */
void lm_kv_block_copy_rows(lm_kv_cache *c, int32_t dst, int32_t src, int n_rows);
/* Bytes one block holds over all its layers (K and V; rings are not in blocks). */
size_t lm_kv_block_bytes(const lm_kv_cache *c);
/* A free block with one reference, its contents left as they are; -1 when none. */
int32_t lm_kv_block_take(lm_kv_cache *c);
/* Block b to or from host memory of lm_kv_block_bytes: per layer its K rows,
 * then its V rows, in the cache's own formats (the disk tier's payload). */
void lm_kv_block_read(lm_kv_cache *c, int32_t b, void *host);
void lm_kv_block_write(lm_kv_cache *c, int32_t b, const void *host);

/* A zeroed recurrent-state slot, or -1 when none is free (or the model has
 * no recurrent state: then callers pass state_slot = NULL). */
int32_t lm_kv_state_acquire(lm_kv_cache *c);
void lm_kv_state_release(lm_kv_cache *c, int32_t slot);
/* Zeroes a slot (a sequence starting over). */
void lm_kv_state_clear(lm_kv_cache *c, int32_t slot);
/* A free slot left as it is (its contents are about to be overwritten), or -1. */
int32_t lm_kv_state_take(lm_kv_cache *c);
/* Copies slot src into slot dst, every state tensor (checkpoint, restore). */
void lm_kv_state_copy(lm_kv_cache *c, int32_t dst, int32_t src);
/* Bytes one slot holds over all state tensors, rings included (0 without state). */
size_t lm_kv_state_bytes(const lm_kv_cache *c);
/* Slot to or from host memory of lm_kv_state_bytes, state tensors in order. */
void lm_kv_state_read(lm_kv_cache *c, int32_t slot, void *host);
void lm_kv_state_write(lm_kv_cache *c, int32_t slot, const void *host);

#endif
