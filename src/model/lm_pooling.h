/* lm_pooling.h - how a model's hidden states become one embedding vector.
 *
 * Which pooling a checkpoint wants is data in the model's files: a Hugging
 * Face folder says it the way sentence-transformers configures it
 * (modules.json naming a Pooling module whose folder holds config.json with
 * pooling_mode_lasttoken / pooling_mode_mean_tokens / pooling_mode_cls_token,
 * and a Normalize module when the vectors are L2-normalised); a GGUF file in
 * <arch>.pooling_type (llama.cpp's numbering). Without either, a causal LM's
 * natural embedding is taken: the last token, normalised.
 *
 * Pooling reads the hidden state after the final norm (lm_batch.hidden_rows)
 * of the positions lm_pooling_span names; lm_embed_pool_add folds a chunk of them in
 * (a prompt may come in several prefill chunks), lm_embed_pool_end gives the
 * vector. Sums are kept in double so that a long mean does not drift. */
#ifndef LM_POOLING_H
#define LM_POOLING_H

#include "../base/lm_base.h"

/* LM_POOL_NONE: the files ask for a pooling lumen does not do (max, a
 * weighted mean, llama.cpp's rank ...); embeddings are refused, saying why,
 * while generation is unaffected. */
typedef enum lm_pool_mode { LM_POOL_LAST = 0, LM_POOL_MEAN, LM_POOL_CLS, LM_POOL_NONE } lm_pool_mode;

typedef struct lm_pooling {
    lm_pool_mode mode;
    bool normalize;   /* L2-normalise the pooled vector */
    char source[160]; /* where it was read ("sentence-transformers", "gguf", "default"),
                       * or with LM_POOL_NONE why embeddings are refused */
} lm_pooling;

/* "last", "mean", "cls", "none". */
const char *lm_pool_mode_name(lm_pool_mode m);

/* The pooling of the Hugging Face folder dir: its sentence-transformers
 * files, or the default (last token, normalised) when it has none. Files
 * that cannot be read or name an unknown pooling give LM_POOL_NONE. */
void lm_pooling_read_hf(lm_pooling *p, const char *dir);
/* From GGUF metadata: pooling_type (llama.cpp's: 1 mean, 2 cls, 3 last;
 * 0 = none, or the key absent: the default), has_type false when absent.
 * GGUF embeddings are normalised, as llama-server returns them. */
void lm_pooling_from_gguf(lm_pooling *p, bool has_type, int64_t type);

/* The positions [*first, *first + *count) of a prompt of n tokens that
 * pooling reads. */
void lm_pooling_span(const lm_pooling *p, int n, int *first, int *count);

/* One vector being pooled: D wide. */
typedef struct lm_embed_pool {
    lm_pooling how;
    int64_t D;
    double *acc; /* [D] */
    int n;       /* rows folded in */
} lm_embed_pool;

void lm_embed_pool_begin(lm_embed_pool *p, const lm_pooling *how, int64_t D);
/* Folds in n rows [n][D] (host) of positions inside lm_pooling_span. */
void lm_embed_pool_add(lm_embed_pool *p, const float *rows, int n);
/* The vector into out [D]; false when no row came in. */
bool lm_embed_pool_end(const lm_embed_pool *p, float *out);
void lm_embed_pool_free(lm_embed_pool *p);

/* In place: v[0..n) / ||v|| (unchanged when the norm is 0). */
void lm_l2_normalize(float *v, int64_t n);

#endif
