/* lm_gguf_config.h - model configuration from GGUF metadata. */
#ifndef LM_GGUF_CONFIG_H
#define LM_GGUF_CONFIG_H

#include "../format/gguf.h"
#include "lm_config.h"

int lm_config_from_gguf(lm_model_config *c, const lm_gguf *g, lm_err *e);

#endif
