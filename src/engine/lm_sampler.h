/* lm_sampler.h - turn a row of logits into a token.
 *
 * temperature 0 is greedy (lowest id wins a tie). Otherwise the filters apply
 * in the order top_k, top_p, min_p on the temperature-scaled distribution and
 * a token is drawn with the sampler's own seeded generator, so the same seed
 * gives the same tokens.
 *
 * A request's sampler may also change the logits first (lm_sampler_adjust:
 * OpenAI's logit_bias and presence / frequency penalties, the repetition
 * penalty), remembering the tokens it has accepted; and lm_logprobs reports
 * the log-softmax of the model's own logits for the OpenAI logprobs fields. */
#ifndef LM_SAMPLER_H
#define LM_SAMPLER_H

#include "../base/lm_base.h"

typedef struct lm_sampler_params {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
} lm_sampler_params;

typedef struct lm_sampler lm_sampler;

lm_sampler *lm_sampler_create(const lm_sampler_params *p, int vocab);
void lm_sampler_free(lm_sampler *s);
int lm_sample(lm_sampler *s, const float *logits);
/* Tests: the ids a draw at the sampler's temperature picks from, after its
 * filters, in the order they are summed (ids[0, n) and their probabilities
 * p; every id when nothing filters); returns n. ids, p: [vocab]. */
int lm_sampler_kept(lm_sampler *s, const float *logits, int32_t *ids, float *p);
/* Whether s always takes the largest logit (temperature 0): lm_argmax. */
bool lm_sampler_greedy(const lm_sampler *s);

typedef struct lm_logit_bias {
    int32_t token;
    float bias;
} lm_logit_bias;

/* What a request changes in its logits before sampling: logit_bias added
 * first, then per token v the repetition penalty (over prompt and accepted
 * tokens: a positive logit divided by it, a negative one multiplied) and
 * presence + frequency * count over accepted tokens subtracted. */
typedef struct lm_logit_adjust {
    float presence_penalty;       /* 0 = off */
    float frequency_penalty;      /* 0 = off */
    float repetition_penalty;     /* 1 (or <= 0) = off */
    const lm_logit_bias *bias;    /* tokens in [0, vocab) */
    int n_bias;
} lm_logit_adjust;

/* Gives s the changes of a (the bias is copied); prompt[0, n_prompt) counts
 * for the repetition penalty. Penalties cost two [vocab] arrays; none are
 * made when every penalty is off. */
void lm_sampler_adjust(lm_sampler *s, const lm_logit_adjust *a, const int32_t *prompt, int n_prompt);
/* Whether s's token is the argmax of the model's own logits: greedy, and
 * nothing changes them. */
bool lm_sampler_plain_greedy(const lm_sampler *s);
/* lm_sample of logits with s's changes applied in work (host [vocab], the
 * caller's scratch; untouched when there are none). */
int lm_sample_adjusted(lm_sampler *s, const float *logits, float *work);
/* lm_sample_adjusted with every token whose bit in allow (a token mask,
 * lm_grammar.h: bit id % 32 of word id / 32) is clear left out; at least
 * one must be set. Always writes work. */
int lm_sample_masked(lm_sampler *s, const float *logits, float *work, const uint32_t *allow);
/* Records a token the sequence took (the penalties count it). */
void lm_sampler_accept(lm_sampler *s, int32_t tok);

/* Log-softmax of logits [vocab]: returns tok's, and writes the n_top most
 * likely ids (highest first, lowest id on ties) and theirs to top_ids /
 * top_logprobs; n_top <= vocab. O(n_top * vocab): for n_top of about 20. */
float lm_logprobs(const float *logits, int vocab, int32_t tok, int n_top, int32_t *top_ids, float *top_logprobs);

#endif
