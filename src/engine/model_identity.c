/* model_identity.c - a 128-bit name for "this model, these weights, this
 * cache layout", so that disk-cache entries of any other model, format or
 * version are never served (lm_model_identity in lm_disk_tier.h).
 *
 * It hashes (XXH3-128) the configuration as the files state it (config.json
 * of a Hugging Face folder; a GGUF file's bytes before its tensor data, the
 * metadata), every tensor's name, type, shape and bytes, the caller's
 * extra (geometry and KV formats), the RoPE the model runs with (after
 * --rope-* options, which change every cached K) and the cache version -
 * never the path,
 * so a moved or copied model keeps its entries. Weights up to
 * LM_ID_FULL_BYTES are hashed whole; past that, each tensor's first, middle
 * and last LM_ID_SAMPLE bytes, which any fine-tune or requantisation
 * changes and which costs milliseconds instead of a full read of a large
 * model at every start. */
#include "lm_model_identity.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../base/lm_file.h"
#include "../format/gguf.h"
#include "../format/lm_weights.h"
#include "../format/safetensors.h"

#define LM_ID_FULL_BYTES ((size_t)1 << 30)
#define LM_ID_SAMPLE ((size_t)64 << 10)

static void hash_tensor(XXH3_state_t *s, const lm_file_tensor *t, bool whole) {
    XXH3_128bits_update(s, t->name, strlen(t->name) + 1);
    XXH3_128bits_update(s, t->type_name, sizeof t->type_name);
    XXH3_128bits_update(s, t->shape, sizeof t->shape[0] * (size_t)t->n_dims);
    XXH3_128bits_update(s, &t->nbytes, sizeof t->nbytes);
    if (whole || t->nbytes <= 3 * LM_ID_SAMPLE) {
        XXH3_128bits_update(s, t->data, t->nbytes);
        return;
    }
    XXH3_128bits_update(s, t->data, LM_ID_SAMPLE);
    XXH3_128bits_update(s, t->data + (t->nbytes - LM_ID_SAMPLE) / 2, LM_ID_SAMPLE);
    XXH3_128bits_update(s, t->data + t->nbytes - LM_ID_SAMPLE, LM_ID_SAMPLE);
}

static size_t file_bytes(const lm_weight_source *ws) {
    size_t n = 0;
    for (int f = 0; f < ws->n_files; f++)
        for (int i = 0; i < ws->st[f].n_tensors; i++) n += ws->st[f].tensors[i].nbytes;
    if (ws->gguf)
        for (int i = 0; i < ws->gguf->n_tensors; i++) n += ws->gguf->tensors[i].nbytes;
    return n;
}

/* Field by field: the struct's padding is not data. */
static void hash_rope(XXH3_state_t *s, const lm_rope_config *r) {
    const double v[] = { (double)r->type,    r->theta,          r->factor,    r->low_freq_factor,
                         r->high_freq_factor, r->orig_max_pos,  r->beta_fast, r->beta_slow,
                         r->attn_factor,      r->partial_factor, (double)r->interleaved, (double)r->freq_factors };
    XXH3_128bits_update(s, v, sizeof v);
}

void lm_model_identity(const lm_model *m, const void *extra, size_t n_extra, uint64_t out[2], bool *sampled) {
    XXH3_state_t *s = XXH3_createState();
    LM_ASSERT(s);
    XXH3_128bits_reset(s);
    const uint32_t version = LM_DC_VERSION;
    XXH3_128bits_update(s, &version, sizeof version);
    XXH3_128bits_update(s, extra, n_extra);
    hash_rope(s, &m->cfg.rope);
    static const lm_weight_source none = { 0 };
    const lm_weight_source *ws = m->weights ? m->weights : &none;
    bool whole = file_bytes(ws) <= LM_ID_FULL_BYTES;
    if (sampled) *sampled = !whole;
    if (ws->gguf) {
        const lm_gguf *g = ws->gguf;
        const uint8_t *first = g->file.data + g->file.size;
        for (int i = 0; i < g->n_tensors; i++)
            if (g->tensors[i].data < first) first = g->tensors[i].data;
        if (g->file.data) XXH3_128bits_update(s, g->file.data, (size_t)(first - g->file.data));
        for (int i = 0; i < g->n_tensors; i++) hash_tensor(s, &g->tensors[i], whole);
    } else {
        char *cfg_path = lm_path_join(m->path, "config.json");
        size_t len = 0;
        char *cfg = lm_read_file(cfg_path, &len, NULL);
        if (cfg) XXH3_128bits_update(s, cfg, len);
        free(cfg);
        free(cfg_path);
    }
    for (int f = 0; f < ws->n_files; f++)
        for (int i = 0; i < ws->st[f].n_tensors; i++) hash_tensor(s, &ws->st[f].tensors[i], whole);
    XXH128_hash_t h = XXH3_128bits_digest(s);
    XXH3_freeState(s);
    out[0] = h.low64;
    out[1] = h.high64;
}
