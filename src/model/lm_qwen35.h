/* lm_qwen35.h - the Qwen3.5 / Qwen3-Next hybrid architecture (qwen35.c):
 * its configuration beyond lm_model_config, its layer weights, and the
 * multi-token-prediction (MTP) head that Qwen3.5 checkpoints carry for
 * speculative decoding.
 *
 * Dimension names (besides lm_backend.h's): Hk, Hv Gated DeltaNet key and
 * value heads, Dk, Dv their widths, C = 2*Hk*Dk + Hv*Dv the convolved q|k|v
 * width, K the convolution kernel, E experts. */
#ifndef LM_QWEN35_H
#define LM_QWEN35_H

#include "lm_moe.h"

/* What config.json says beyond the common fields (lm_model_config.hybrid). */
typedef struct lm_hybrid_config {
    int lin_k_heads, lin_v_heads; /* Hk, Hv: linear_num_key_heads / _value_heads */
    int lin_k_dim, lin_v_dim;     /* Dk, Dv: linear_key_head_dim / _value_head_dim */
    int conv_kernel;              /* K: linear_conv_kernel_dim */
    bool attn_out_gate;           /* full attention: o_proj(attn * sigmoid(gate)) */
    int mtp_layers;               /* mtp_num_hidden_layers (0 when absent) */
    bool v_tiled;                 /* value heads in tiled order (lm_delta_params.v_tiled) */
    bool layer_linear[];          /* [n_layers] Gated DeltaNet (else full attention) */
} lm_hybrid_config;

/* Gated full attention: q, its output gate and k/v projections; q and k get
 * a zero-centred RMSNorm per head, partial rope, then GQA over the KV cache;
 * the output is multiplied by sigmoid(gate) before o_proj. */
typedef struct lm_q35_attn {
    lm_tensor wq, wgate;     /* [H*Dh][D] each (split from q_proj's per-head [q; gate] rows) */
    lm_tensor wk, wv;        /* [Hkv*Dh][D] */
    lm_tensor wo;            /* [D][H*Dh] */
    lm_tensor q_norm, k_norm;/* [Dh] f32, used as (1 + w) */
} lm_q35_attn;

/* Gated DeltaNet (linear attention). Qwen3-Next's fused in_proj_qkvz / in_proj_ba
 * (grouped per key head) are re-ordered at load into Qwen3.5's layout. */
typedef struct lm_q35_delta {
    lm_tensor w_qkv;         /* [C][D]: q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv) */
    lm_tensor w_z;           /* [Hv*Dv][D] output gate */
    lm_tensor w_b, w_a;      /* [Hv][D]: update strength, decay step */
    lm_tensor conv;          /* [C][K] f32 depthwise causal conv */
    lm_tensor a_log, dt_bias;/* [Hv] f32 */
    lm_tensor norm;          /* [Dv] f32 gated RMSNorm weight (plain w) */
    lm_tensor w_out;         /* [D][Hv*Dv] */
} lm_q35_delta;

/* Feed-forward: dense SwiGLU, or (qwen3_next) a sparse MoE block plus a
 * shared SwiGLU expert scaled by sigmoid(shared_gate h). */
typedef struct lm_q35_ffn {
    lm_tensor gate, up, down;        /* [F][D], [F][D], [D][F]: the MLP, or the shared expert */
    lm_moe_layer moe;                /* router and routed experts (sparse layers) */
    lm_tensor shared_gate;           /* [1][D] (sparse layers with a shared expert) */
} lm_q35_ffn;

typedef struct lm_q35_layer {
    bool linear;             /* Gated DeltaNet, else full attention */
    bool moe;                /* sparse feed-forward */
    int kv_layer;            /* full attention: its layer in the KV pool */
    int state;               /* linear: its tensor in lm_kv_pool.state */
    lm_tensor in_norm;       /* [D] f32, (1 + w) */
    lm_tensor post_norm;     /* [D] f32, (1 + w) */
    lm_q35_attn attn;
    lm_q35_delta delta;
    lm_q35_ffn ffn;
} lm_q35_layer;

/* The MTP head (checkpoint tensors mtp.*), loaded when present; it takes no
 * part in the model's forward. One step predicts the token after next:
 *   h' = fc [pre_fc_norm_embedding(embed(next token)) ; pre_fc_norm_hidden(h)]
 * then its decoder layers (full attention, with the main model's rope), then
 * norm and the main model's lm_head. Its attention layers need KV-cache layers
 * of their own when it runs: layer l uses layer l (kv_layer) of the MTP pool. */
typedef struct lm_qwen35_mtp {
    int n_layers;
    lm_tensor fc_emb, fc_hidden;       /* [D][D] each: the column halves of mtp.fc [D][2D] */
    lm_tensor pre_fc_norm_embedding;   /* [D] f32, (1 + w) */
    lm_tensor pre_fc_norm_hidden;      /* [D] f32, (1 + w) */
    lm_tensor norm;                    /* [D] f32, (1 + w) */
    lm_q35_layer *layers;              /* [n_layers] */
} lm_qwen35_mtp;

/* The MTP head of a qwen3_5 / qwen3_next model, or NULL (other architectures,
 * or a checkpoint without mtp.* tensors). */
const lm_qwen35_mtp *lm_qwen35_mtp_head(const lm_model *m);

/* lm_model_forward of a qwen3_5 / qwen3_next model that also hands back the
 * final hidden states (after model.norm) of the logit rows: hidden_out
 * [n_out][D] host (NULL: none, like lm_model_forward); logits may be NULL. */
int lm_qwen35_forward_hidden(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, float *hidden_out,
                             lm_err *e);

/* One MTP step over a batch: b->tokens are the next tokens (token t+1 for
 * position t), b->pos the positions t, hidden [n_tokens][D] (host) the main
 * model's final hidden states at those positions (lm_qwen35_forward_hidden).
 * Keys and values go to mtp_kv, a pool of its own with at least the head's
 * n_layers layers of the model's kv_width and no recurrent state
 * (b->state_slot is ignored). Writes logits [n_out][V] (host) for
 * b->out_rows: the predictions of the tokens at t+2. Shares the model's
 * activation scratch: not concurrently with its forward. */
int lm_qwen35_mtp_forward(lm_model *m, lm_kv_pool *mtp_kv, const lm_batch *b, const float *hidden, float *logits,
                          lm_err *e);

#endif
