/* lm_model_internal.h - pieces shared by the loader and the forward pass. */
#ifndef LM_MODEL_INTERNAL_H
#define LM_MODEL_INTERNAL_H

#include "lm_model.h"

void lm_model_scratch_free(lm_model *m);

#endif
