/* lm_weights.h - where a model's tensors come from: one or more safetensors
 * files of a Hugging Face folder (single or sharded through
 * model.safetensors.index.json), or one GGUF file. An lm_source owns the
 * table (lm_source.h) and a model holds a reference on the source, so the
 * files stay mapped for the model's lifetime and weights are used in place. */
#ifndef LM_WEIGHTS_H
#define LM_WEIGHTS_H

#include "gguf.h"
#include "safetensors.h"

typedef struct lm_weight_source {
    int n_files;
    lm_safetensors *st;  /* [n_files] */
    lm_gguf *gguf;       /* set for a GGUF model */
} lm_weight_source;

/* Opens DIR/model.safetensors or the shards named by DIR/model.safetensors.index.json. */
int lm_weights_open_hf(lm_weight_source *ws, const char *dir, lm_err *e);
int lm_weights_open_gguf(lm_weight_source *ws, const char *path, lm_err *e);
void lm_weights_close(lm_weight_source *ws);

/* Bytes of all tensors of the source. */
size_t lm_weights_bytes(const lm_weight_source *ws);

/* Finds a tensor by name; *file (optional) gets the path of its file. */
const lm_file_tensor *lm_weights_find(const lm_weight_source *ws, const char *name, const char **file);

#endif
