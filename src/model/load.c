/* load.c - build an lm_model from an opened source: a Hugging Face folder
 * or a GGUF file (format/lm_source.h decides which).
 *
 * Generic steps: read the config (config.json or GGUF metadata), take the
 * weight table from the source (files mapped once, used in place; the model
 * holds a reference on the source), find the architecture, let it bind its
 * tensors, then compute the rope frequencies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "../base/lm_file.h"
#include "lm_arch.h"
#include "lm_gguf_config.h"
#include "lm_model.h"

/* Rope frequencies, including GGUF's optional per-frequency divisors
 * (rope_freqs.weight, how llama.cpp stores Llama 3 scaling). */
static int setup_rope(lm_model *m, lm_err *e) {
    const lm_model_config *c = &m->cfg;
    m->rot_dim = (int)(c->head_dim * c->rope.partial_factor);
    m->rot_dim -= m->rot_dim % 2;
    if (m->rot_dim <= 0) return lm_errf(e, "%s: rotary dimension is zero", m->path);
    m->inv_freq = lm_xmalloc((size_t)(m->rot_dim / 2) * sizeof(float));
    m->rope_attn_factor = lm_rope_inv_freq(&c->rope, m->rot_dim, m->inv_freq);
    if (c->rope.freq_factors) {
        lm_binder b = { m, e, 0 };
        lm_tensor div = { 0 };
        lm_bind_vector(&b, &div, "rope_freqs.weight", m->rot_dim / 2, true);
        if (b.failed) return -1;
        float *host = lm_xmalloc((size_t)(m->rot_dim / 2) * sizeof(float));
        m->be->ops->read(m->be, host, div.data, (size_t)(m->rot_dim / 2) * sizeof(float));
        for (int i = 0; i < m->rot_dim / 2; i++) m->inv_freq[i] /= host[i];
        free(host);
    }
    return 0;
}

/* A backend with its own memory (a GPU) copies every weight: a model that
 * cannot fit is refused before the first copy, with the numbers (the
 * backend's own upload error covers what this estimate misses). */
bool lm_model_fits(size_t need, size_t free_b) { return need <= free_b / 100 * 95; }

static int check_device_memory(const lm_model *m, lm_err *e) {
    size_t free_b = 0, total_b = 0, need = lm_weights_bytes(m->weights);
    lm_backend_mem_info(m->be, &free_b, &total_b);
    if (total_b == 0 || lm_model_fits(need, free_b)) return 0;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return lm_errf(e, "%s: the model's weights need %.2f GiB; the GPU has %.2f GiB free of %.2f (try --device cpu)",
                   m->path, need / gib, free_b / gib, total_b / gib);
}

int lm_model_tensor_bytes(lm_source *src, size_t *bytes, lm_err *e) {
    const lm_weight_source *ws;
    *bytes = 0;
    if (lm_source_weights(src, &ws, e)) return -1;
    *bytes = lm_weights_bytes(ws);
    return 0;
}

int lm_model_file_tensor_bytes(const char *path, size_t *bytes, lm_err *e) {
    lm_source *src;
    *bytes = 0;
    if (lm_source_open(&src, path, e)) return -1;
    int rc = lm_model_tensor_bytes(src, bytes, e);
    lm_source_unref(src);
    return rc;
}

/* The pooling of embeddings: the folder's sentence-transformers files, or
 * the GGUF's <arch>.pooling_type. */
static void read_pooling(lm_model *m, const lm_gguf *g) {
    if (!g) return lm_pooling_read_hf(&m->pooling, m->path);
    char *arch = lm_gguf_get_str(g, "general.architecture");
    char key[96];
    snprintf(key, sizeof key, "%s.pooling_type", arch ? arch : "");
    free(arch);
    int64_t type = 0;
    bool has = lm_gguf_get_int(g, key, &type);
    lm_pooling_from_gguf(&m->pooling, has, type);
}

int lm_model_load_from(lm_model **out, lm_source *src, lm_backend *be, lm_err *e) {
    return lm_model_load_with(out, src, be, NULL, e);
}

int lm_model_load_with(lm_model **out, lm_source *src, lm_backend *be, const lm_model_load_opts *o, lm_err *e) {
    *out = NULL;
    lm_model *m = lm_xcalloc(1, sizeof *m);
    m->be = be;
    m->progress = o ? o->progress : NULL;
    m->source = lm_source_ref(src);
    m->path = lm_xstrdup(lm_source_path(src));
    const lm_gguf *g = lm_source_gguf(src);
    /* config.json before the weights: a folder without one is told so */
    int rc = lm_source_kind_of(src) == LM_SOURCE_HF ? lm_config_load_hf(&m->cfg, m->path, e) : 0;
    if (!rc) rc = lm_source_weights(src, &m->weights, e);
    if (!rc && g) rc = lm_config_from_gguf(&m->cfg, g, e);
    if (!rc && o) rc = lm_rope_override_apply(&m->cfg, &o->rope, e);
    if (!rc) read_pooling(m, g);
    if (!rc) rc = check_device_memory(m, e);
    if (!rc) {
        m->arch = lm_arch_find(m->cfg.model_type);
        LM_ASSERT(m->arch); /* both config readers only accept known types */
        rc = m->arch->bind(m, e);
    }
    m->progress = NULL; /* the caller's, only for the call */
    if (!rc) rc = setup_rope(m, e);
    if (!rc && m->n_kv_layers == 0) m->n_kv_layers = m->cfg.n_layers;
    if (!rc && m->kv_width == 0) m->kv_width = (int64_t)m->cfg.n_kv_heads * m->cfg.head_dim;
    if (rc) {
        lm_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int lm_model_load(lm_model **out, const char *path, lm_backend *be, lm_err *e) {
    lm_source *src;
    *out = NULL;
    if (lm_source_open(&src, path, e)) return -1;
    int rc = lm_model_load_from(out, src, be, e);
    lm_source_unref(src);
    return rc;
}

int lm_model_check_batch(const lm_model *m, const lm_kv_pool *kv, const lm_batch *b, lm_err *e) {
    if (b->n_tokens <= 0) return lm_errf(e, "empty batch");
    if (b->n_out < 0 || b->n_out > b->n_tokens) return lm_errf(e, "%d logit rows for %d tokens", b->n_out, b->n_tokens);
    if ((!b->tokens || b->argmax_later) && !lm_model_look_ahead(m))
        return lm_errf(e, "%s: this model or backend cannot take tokens from the device or return before its argmax",
                       m->path);
    if (b->argmax_later && (!b->out_argmax || b->n_out == 0)) return lm_errf(e, "argmax_later without argmax rows");
    if (b->argmax_masked && (!b->argmax_later || !lm_model_masked_look_ahead(m)))
        return lm_errf(e, "%s: a masked argmax needs argmax_later on a backend that offers it", m->path);
    if (m->masked_ids) return lm_errf(e, "a forward before the last one's masked argmax");
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->tokens && (b->tokens[t] < 0 || b->tokens[t] >= m->cfg.vocab))
            return lm_errf(e, "token id %d out of range [0, %d)", b->tokens[t], m->cfg.vocab);
        if (b->pos[t] < 0) return lm_errf(e, "negative position %d", b->pos[t]);
        if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs)
            return lm_errf(e, "token %d names sequence %d of %d", t, b->seq[t], b->n_seqs);
    }
    for (int i = 0; i < b->n_out; i++)
        if (b->out_rows[i] < 0 || b->out_rows[i] >= b->n_tokens)
            return lm_errf(e, "logit row %d out of range [0, %d)", b->out_rows[i], b->n_tokens);
    if (b->n_hidden < 0 || b->n_hidden > b->n_tokens || (b->n_hidden > 0 && !b->hidden_out))
        return lm_errf(e, "%d hidden rows for %d tokens", b->n_hidden, b->n_tokens);
    for (int i = 0; i < b->n_hidden; i++)
        if (b->hidden_rows[i] < 0 || b->hidden_rows[i] >= b->n_tokens)
            return lm_errf(e, "hidden row %d out of range [0, %d)", b->hidden_rows[i], b->n_tokens);
    if (kv->n_state > 0 && !b->state_slot) return lm_errf(e, "a model with recurrent state needs state slots");
    for (int s = 0; kv->n_state > 0 && s < b->n_seqs; s++)
        if (b->state_slot[s] < 0 || b->state_slot[s] >= kv->n_state_slots)
            return lm_errf(e, "state slot %d out of range [0, %d)", b->state_slot[s], kv->n_state_slots);
    if (b->state_out && !(kv->n_state > 0 && lm_model_state_out(m)))
        return lm_errf(e, "per-position state asked of a model or backend that does not keep it");
    for (int t = 0; b->state_out && t < b->n_tokens; t++)
        if (b->state_out[t] < -1 || b->state_out[t] >= kv->n_state_slots)
            return lm_errf(e, "state_out slot %d out of range [-1, %d)", b->state_out[t], kv->n_state_slots);
    return 0;
}

/* Batches small enough to be worth a graph (decode steps, short drafts);
 * prefill chunks run long kernels, where launches cost nothing. */
#define LM_GRAPH_MAX_TOKENS 256

/* The batch's shape, for the backend's graph cache: what decides which
 * launches a forward makes apart from the data (positions, ids, tables). */
static uint64_t lm_batch_shape_key(const lm_model *m, const lm_kv_pool *kv, const lm_batch *b, const float *logits) {
    uint64_t h = XXH3_64bits_withSeed(&m, sizeof m, 0);
    int64_t hdr[] = { (int64_t)(uintptr_t)kv, b->n_tokens, b->n_seqs, b->n_out, b->state_slot != NULL, b->state_out != NULL,
                      b->out_argmax != NULL, b->out_logits != NULL, logits != NULL, b->tokens == NULL,
                      b->argmax_later, b->argmax_masked, b->n_hidden };
    h = XXH3_64bits_withSeed(hdr, sizeof hdr, h);
    h = XXH3_64bits_withSeed(b->seq, (size_t)b->n_tokens * sizeof *b->seq, h);
    if (b->n_out) h = XXH3_64bits_withSeed(b->out_rows, (size_t)b->n_out * sizeof *b->out_rows, h);
    if (b->out_logits && b->n_out) h = XXH3_64bits_withSeed(b->out_logits, (size_t)b->n_out, h);
    if (b->n_hidden) h = XXH3_64bits_withSeed(b->hidden_rows, (size_t)b->n_hidden * sizeof *b->hidden_rows, h);
    return h;
}

int lm_model_forward(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, lm_err *e) {
    if (lm_model_check_batch(m, kv, b, e)) return -1;
    lm_backend *be = m->be;
    if (be->ops->graph_begin && b->n_tokens <= LM_GRAPH_MAX_TOKENS &&
        be->ops->graph_begin(be, lm_batch_shape_key(m, kv, b, logits))) {
        /* at most three passes: replay, capture, eager (see lm_backend.h) */
        for (;;) {
            int rc = m->arch->forward(m, kv, b, logits, e);
            if (be->ops->graph_end(be, rc == 0) == 0) {
                if (rc) m->masked_ids = NULL; /* no argmax follows a failed forward */
                return rc;
            }
        }
    }
    int rc = m->arch->forward(m, kv, b, logits, e);
    if (rc) m->masked_ids = NULL;
    return rc;
}

bool lm_model_look_ahead(const lm_model *m) {
    const struct lm_backend_ops *op = m->be->ops;
    return op->argmax_rows_later && op->argmax_wait && op->get_rows_argmax && !m->host_tokens;
}

void lm_model_wait_argmax(lm_model *m) { m->be->ops->argmax_wait(m->be); }

bool lm_model_masked_look_ahead(const lm_model *m) {
    return lm_model_look_ahead(m) && m->be->ops->argmax_rows_masked_later;
}

void lm_model_argmax_masked(lm_model *m, const uint32_t *masks, const uint8_t *masked) {
    LM_ASSERT(m->masked_ids);
    m->be->ops->argmax_rows_masked_later(m->be, m->masked_ids, &m->masked_lg, masks, masked);
    m->masked_ids = NULL;
}

void lm_model_free(lm_model *m) {
    if (!m) return;
    if (m->arch && m->arch->free) m->arch->free(m);
    for (int i = 0; i < m->n_owned; i++) m->be->ops->free(m->be, m->owned[i]);
    free(m->owned);
    free(m->inv_freq);
    free(m->kv_layer_width);
    free(m->kv_layer_sliding);
    lm_config_free(&m->cfg);
    lm_source_unref(m->source);
    free(m->path);
    free(m);
}

size_t lm_model_kv_bytes_per_token(const lm_model *m) {
    size_t n = 0;
    for (int l = 0; l < m->n_kv_layers; l++) n += 2 * (size_t)(m->kv_layer_width ? m->kv_layer_width[l] : m->kv_width);
    return n * sizeof(float);
}

size_t lm_model_weight_bytes(const lm_model *m) { return m->weight_bytes; }

const lm_draft *lm_model_draft(const lm_model *m) {
    const lm_draft *d = m->arch->draft;
    return d && d->kv_layers(m) > 0 ? d : NULL;
}

bool lm_model_state_out(const lm_model *m) {
    return m->arch->state_per_pos && lm_backend_base(m->be)->ops->state_out;
}

int lm_model_state_spec(const lm_model *m, int64_t *floats, int max) {
    return m->arch->state_spec ? m->arch->state_spec(m, floats, max) : 0;
}
