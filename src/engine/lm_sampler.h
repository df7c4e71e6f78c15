/* lm_sampler.h - turn a row of logits into a token.
 *
 * temperature 0 is greedy (lowest id wins a tie). Otherwise the filters apply
 * in the order top_k, top_p, min_p on the temperature-scaled distribution and
 * a token is drawn with the sampler's own seeded generator, so the same seed
 * gives the same tokens. */
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
/* Whether s always takes the largest logit (temperature 0): lm_argmax. */
bool lm_sampler_greedy(const lm_sampler *s);

/* Index of the largest value (first one on ties). */

#endif
