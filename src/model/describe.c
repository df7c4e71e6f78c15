/* describe.c - what a loaded model is, for listings (/v1/models): its
 * parameter count and the storage type most of its weight bytes are in,
 * counted over the file's tensors (cheap: no data is read). */
#include "lm_model.h"

#include "../format/lm_weights.h"

static void count(const lm_file_tensor *t, int n, int64_t *params, size_t *bytes) {
    for (int i = 0; i < n; i++) {
        *params += lm_file_tensor_numel(&t[i]);
        if (t[i].type < LM_DTYPE_COUNT) bytes[t[i].type] += t[i].nbytes;
    }
}

void lm_model_describe(const lm_model *m, int64_t *n_params, const char **dtype) {
    size_t bytes[LM_DTYPE_COUNT + 1] = { 0 };
    *n_params = 0;
    const lm_weight_source *ws = m->weights;
    if (ws->gguf) count(ws->gguf->tensors, ws->gguf->n_tensors, n_params, bytes);
    for (int f = 0; f < ws->n_files; f++) count(ws->st[f].tensors, ws->st[f].n_tensors, n_params, bytes);
    for (int r = 0; r < ws->n_repacked; r++) count(&ws->repacked[r].t, 1, n_params, bytes);
    int best = 0;
    for (int t = 1; t < LM_DTYPE_COUNT; t++)
        if (bytes[t] > bytes[best]) best = t;
    *dtype = lm_dtype_name((lm_dtype)best);
}
