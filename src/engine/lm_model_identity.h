/* lm_model_identity.h - the model identity disk-cache entries carry
 * (model_identity.c tells what it covers). */
#ifndef LM_MODEL_IDENTITY_H
#define LM_MODEL_IDENTITY_H

#include "../model/lm_model.h"
#include "lm_disk_cache.h"

/* XXH3-128 of m's configuration and weights, extra[0, n_extra) and
 * LM_DC_VERSION; *sampled (optional): the weights were too large to hash
 * whole and were sampled. */
void lm_model_identity(const lm_model *m, const void *extra, size_t n_extra, uint64_t out[2], bool *sampled);

#endif
