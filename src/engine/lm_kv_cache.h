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
} lm_kv_cache;

typedef struct lm_kv_seq {
    int32_t *blocks;      /* block table */
    int n_blocks, cap;
} lm_kv_seq;

int lm_kv_cache_create(lm_kv_cache **out, lm_backend *be, int n_layers, int64_t kv_width,
                       int block_size, int n_blocks, lm_err *e);
void lm_kv_cache_free(lm_kv_cache *c);

/* Makes seq's table cover positions [0, n_positions); -1 (with e) when the
 * pool is out of blocks, leaving seq as it was. */
int lm_kv_seq_reserve(lm_kv_cache *c, lm_kv_seq *seq, int n_positions, lm_err *e);
/* Returns every block of seq to the pool (shared blocks when their last user lets go). */
void lm_kv_seq_release(lm_kv_cache *c, lm_kv_seq *seq);

#endif
