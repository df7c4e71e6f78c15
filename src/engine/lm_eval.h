/* lm_eval.h - how well a model predicts a text (lumen eval): perplexity over
 * windows, and against a reference model on the same tokens the KL
 * divergence KL(ref || model) per position and top-1 agreement.
 *
 * The tokens are cut into windows of ctx tokens (the last one shorter); each
 * window starts a fresh sequence and every position but its last predicts
 * the next token, so a window of w tokens scores w - 1 predictions. Both
 * models see the same windows; logits come in chunks, so memory is a chunk
 * of rows, not a window. */
#ifndef LM_EVAL_H
#define LM_EVAL_H

#include "../model/lm_model.h"

/* Tokens per forward. Quantised matmuls may take another path for another
 * row count (int8 activations), so results are those of this chunking. */
#define LM_EVAL_CHUNK 64

typedef struct lm_eval_result {
    int n_tokens, n_windows, n_scored;
    double nll, ppl;           /* the model: mean -log p(next token) (nats), exp(nll) */
    bool has_ref;
    double ref_nll, ref_ppl;   /* the reference, on the same predictions */
    double kl_mean, kl_p99, kl_max; /* KL(ref || model) over the scored positions (nats) */
    double top1;               /* fraction of positions whose argmax is the reference's */
} lm_eval_result;

/* Evaluates ids[n] with m (and ref, NULL for none; it must have m's
 * vocabulary size) in windows of ctx tokens (ctx >= 2); m's KV cache in
 * the formats kvt, ref's always f32. */
int lm_eval_run(lm_model *m, lm_model *ref, const int32_t *ids, int n, int ctx, lm_kv_types kvt, lm_eval_result *out,
                lm_err *e);

#endif
