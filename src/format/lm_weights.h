/* lm_weights.h - where a model's tensors come from: one or more safetensors
 * files of a Hugging Face folder (single or sharded through
 * model.safetensors.index.json), or one GGUF file. An lm_source owns the
 * table (lm_source.h) and a model holds a reference on the source, so the
 * files stay mapped for the model's lifetime and weights are used in place. */
#ifndef LM_WEIGHTS_H
#define LM_WEIGHTS_H

#include "gguf.h"
#include "safetensors.h"

/* A checkpoint tensor rewritten at load into a lumen block type together
 * with its scale tensors (format/hf_quant.c); t.name is the weight's name,
 * t.data is owned by the weight source. */
typedef struct lm_repacked_tensor {
    lm_file_tensor t;
    const char *file;    /* the safetensors file the weight came from */
} lm_repacked_tensor;

typedef struct lm_weight_source {
    int n_files;
    lm_safetensors *st;  /* [n_files] */
    lm_gguf *gguf;       /* set for a GGUF model */
    int n_repacked;
    lm_repacked_tensor *repacked; /* [n_repacked] sorted by name, found before the files' tensors */
    size_t repacked_from;         /* file bytes of the tensors they replace (weights and scales) */
} lm_weight_source;

/* Opens DIR/model.safetensors or the shards named by DIR/model.safetensors.index.json,
 * then repacks FP8 and MLX-quantised weights (hf_quant.h). */
int lm_weights_open_hf(lm_weight_source *ws, const char *dir, lm_err *e);
int lm_weights_open_gguf(lm_weight_source *ws, const char *path, lm_err *e);
void lm_weights_close(lm_weight_source *ws);

/* Bytes of all tensors of the source (repacked ones at their repacked size). */
size_t lm_weights_bytes(const lm_weight_source *ws);

/* Finds a tensor by name; *file (optional) gets the path of its file. */
const lm_file_tensor *lm_weights_find(const lm_weight_source *ws, const char *name, const char **file);

#endif
