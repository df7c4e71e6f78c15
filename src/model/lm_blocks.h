/* lm_blocks.h - sub-blocks shared by the pre-norm decoder architectures.
 *
 * llama.c (llama, mistral, qwen2, qwen3) and qwen3_moe.c differ only in
 * their feed-forward block, so the parts they share live here, written once:
 * the activation scratch, the attention sub-block (GQA over the paged KV
 * cache, rope, optional q/k/v/o biases and per-head q/k RMSNorm), the dense
 * SwiGLU MLP (also a shared expert), and the output head (final norm and
 * lm_head on the rows that want logits). Everything goes through backend ops. */
#ifndef LM_BLOCKS_H
#define LM_BLOCKS_H

#include "lm_arch.h"

/* Activations, grown to the largest batch seen and reused, so the decode loop
 * does not allocate. gate/up/act are ff wide. */
typedef struct lm_dec_scratch {
    int cap_tokens, cap_out;
    int64_t ff;
    lm_tensor x, h, q, k, v, qn, kn, attn, o, gate, up, act; /* [T][...] */
    lm_tensor hs, logits;                                    /* [n_out][D], [n_out][V] */
} lm_dec_scratch;

/* Makes room for T tokens, n_out logit rows and MLP width ff. */
int lm_dec_scratch_ensure(lm_model *m, lm_dec_scratch *s, int T, int n_out, int64_t ff, lm_err *e);
void lm_dec_scratch_release(lm_backend *be, lm_dec_scratch *s);

/* ---- attention ---- */

typedef struct lm_attn_layer {
    lm_tensor wq, wk, wv, wo;  /* [H*Dh][D], [Hkv*Dh][D], [Hkv*Dh][D], [D][H*Dh] */
    lm_tensor bq, bk, bv, bo;  /* biases, f32; data NULL when absent */
    lm_tensor q_norm, k_norm;  /* [Dh] f32 (qwen3); data NULL when absent */
} lm_attn_layer;

/* Tensor-name patterns (one %d: the layer). */
typedef struct lm_attn_names {
    const char *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo, *q_norm, *k_norm;
} lm_attn_names;

/* Hugging Face (model.layers.%d.self_attn.*) and GGUF (blk.%d.attn_*) names. */
extern const lm_attn_names lm_attn_hf_names, lm_attn_gguf_names;

/* Binds one layer's attention (biases and q/k norms as the config says). */
void lm_attn_bind(lm_binder *b, lm_attn_layer *L, const lm_attn_names *n, int layer);

/* residual[T][D] += Wo attn(rope(norm_q(Wq h)), rope(norm_k(Wk h)), Wv h)
 * for the batch, h = s->h (the normed input), s->o scratch; writes the
 * layer's keys and values; then post (may be NULL): the norm of the new
 * residual (the next sub-block's input; it may be s->h). */
void lm_attn_forward(lm_model *m, lm_dec_scratch *s, const lm_attn_layer *L, int layer, lm_kv_pool *kv,
                     const lm_batch *b, lm_tensor *residual, const lm_norm_out *post);

/* ---- dense SwiGLU MLP ---- */

typedef struct lm_mlp_layer {
    lm_tensor gate, up, down; /* [F][D], [F][D], [D][F] */
} lm_mlp_layer;

void lm_mlp_bind(lm_binder *b, lm_mlp_layer *L, const char *gate, const char *up, const char *down, int layer,
                 int64_t F);
/* out[T][D] += Wdown (silu(Wgate h) * Wup h) (the residual add; out is not
 * s->o, which is scratch); uses s->gate/up/act (F <= s->ff); then post (may
 * be NULL) as lm_attn_forward's. */
void lm_mlp_forward(lm_model *m, lm_dec_scratch *s, const lm_mlp_layer *L, lm_tensor *out, const lm_tensor *h,
                    const lm_norm_out *post);

/* ---- fused forms ---- */

/* The backend's fused op when it has one, else the plain ops it stands for
 * (lm_backend.h: matmul_n, matmul_glu, matmul_add, moe_add). Fusing the
 * norm into the residual add saves a kernel launch per sub-block on a GPU. */
void lm_op_matmul_n(lm_backend *be, int n, lm_tensor *const *y, const lm_tensor *x, const lm_tensor *const *w,
                    const lm_tensor *const *bias);
void lm_op_matmul_glu(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *wg, const lm_tensor *wu,
                      lm_glu act, lm_tensor *gate_ws, lm_tensor *up_ws);
void lm_op_matmul_add(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, lm_tensor *ws,
                      const lm_norm_out *norm);
/* y += moe(x), then norm (may be NULL) of the new y (lm_backend.h: moe_add). */
void lm_op_moe_add(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                   const lm_moe_params *p, lm_tensor *ws, const lm_norm_out *norm);
/* y += x, then norm (may be NULL) of the new y: the unfused residual add. */
void lm_op_add_norm(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_norm_out *norm);
void lm_op_rope_kv_write(lm_backend *be, lm_tensor *q, lm_tensor *k, const lm_tensor *v, const lm_rope_params *rq,
                         const lm_rope_params *rk, lm_kv_pool *kv, int layer, const lm_attn_batch *b);
/* Per-head norms of q and k into qn and kn, then lm_op_rope_kv_write(qn, kn, v). */
void lm_op_norm_rope_kv_write(lm_backend *be, lm_tensor *qn, const lm_tensor *q, lm_tensor *kn, const lm_tensor *k,
                              const lm_tensor *v, const lm_tensor *wq, const lm_tensor *wk, float eps, float w_offset,
                              const lm_rope_params *rq, const lm_rope_params *rk, lm_kv_pool *kv, int layer,
                              const lm_attn_batch *b);
/* delta_gates then gated_delta (g and beta: the raw projections in,
 * scratch out). */
void lm_op_gated_delta_gates(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, lm_tensor *g, lm_tensor *beta,
                             const lm_tensor *a_log, const lm_tensor *dt_bias, lm_kv_pool *kv,
                             const lm_attn_batch *b, const lm_delta_params *p);

/* ---- input ---- */

/* x[T][D] = rows of table for the batch's tokens: its ids, or (tokens NULL)
 * the previous forward's argmax ids on the backend. */
void lm_embed_tokens(lm_model *m, lm_tensor *x, const lm_tensor *table, const lm_batch *b);

/* ---- output ---- */

/* The batch's hidden rows (lm_batch.hidden_rows; none: nothing runs):
 * norm(x) of all T rows into ws [T][D] (free scratch), with the final norm's
 * weight and offset, then the asked-for rows to b->hidden_out, one copy per
 * run of consecutive rows. */
void lm_hidden_out(lm_model *m, const lm_tensor *x, lm_tensor *ws, const lm_tensor *norm, float w_offset,
                   const lm_batch *b);
/* logits[n_out][V] (host) = lm_head(norm(x[out_rows])), x = s->x. */
void lm_head_forward(lm_model *m, lm_dec_scratch *s, const lm_batch *b, float *logits);
/* The batch's output logits lg [n_out][V] (backend memory) to the host as
 * lm_batch asks: argmax ids and/or logit rows into logits (may be NULL). */
void lm_logits_out(lm_model *m, const lm_batch *b, const lm_tensor *lg, float *logits);

#endif
