/* lm_backend.h - the op interface that every model is written against.
 *
 * A backend owns memory and runs ops; it never knows which model calls it.
 * Models hold lm_tensor handles and call the lm_op_* wrappers below; they never
 * dereference activation memory themselves, so the same forward pass runs on
 * any backend (CPU now, CUDA later).
 *
 * Dimension names used in shape comments:
 *   T tokens in the batch, D model width, H query heads, Hkv key/value heads,
 *   Dh head width, F feed-forward width, V vocabulary, S sequences in the batch.
 *
 * Activations are f32 row-major [rows][cols]. Weights are [out][in] row-major
 * in any lm_dtype (HF safetensors and GGUF share this layout), so
 * matmul computes y[t][o] = sum_i x[t][i] * W[o][i]. */
#ifndef LM_BACKEND_H
#define LM_BACKEND_H

#include "lm_dtype.h"
#include "lm_kv_type.h"

typedef struct lm_tensor {
    lm_dtype type;
    int64_t rows, cols; /* [rows][cols], row-major; vectors have rows = 1 */
    void *data;         /* backend memory */
} lm_tensor;

/* The paged KV cache, as a backend sees it: per layer, K and V blocks of
 * block_size tokens in a pool; token position p of a sequence lives in block
 * table[p / block_size] at offset p % block_size. The engine owns which block
 * belongs to whom; the backend only reads and writes the slots it is told.
 * Rows of layer l are lm_kv_layer_width(pool, l) values in the format
 * k_type / v_type (lm_kv_type.h), lm_kv_row_bytes(type, width) bytes each. */
typedef struct lm_kv_pool {
    int n_layers;
    int block_size;   /* tokens per block */
    int n_blocks;     /* blocks per layer */
    int64_t kv_width; /* Hkv * Dh of the widest layer */
    /* [n_layers] values a row of each layer holds (<= kv_width), so that a
     * narrow layer (Gemma's sliding ones) takes only its own width; NULL:
     * every layer kv_width. Read it through lm_kv_layer_width. */
    const int64_t *layer_width;
    /* Sliding-window layers kept in rings (ring_blocks > 0): a layer with
     * layer_ring[l] has no block of the pool; each recurrent-state slot s
     * holds ring_blocks blocks of it (block ids s * ring_blocks + j, its K
     * and V arrays sized n_state_slots * ring_blocks blocks) that a
     * sequence's positions reuse, block i at j = i % ring_blocks, so its
     * memory follows the window, not the context. The model addresses them
     * (gemma.c); kernels see a pool of that many blocks. */
    int ring_blocks;
    const bool *layer_ring; /* [n_layers], NULL without rings */
    lm_kv_type k_type, v_type; /* LM_KV_F32 (0) unless chosen */
    int rot;          /* LM_KV_Q4R: values per rotated piece (a power of two dividing every head) */
    void **k, **v;    /* [n_layers] -> [n_blocks][block_size] rows, backend memory */
    /* Recurrent state (e.g. Gated DeltaNet conv window and delta state): state
     * tensor i has n_state_slots slots of state_floats[i] floats; a sequence
     * owns one slot (lm_attn_batch.state_slot), the same in every tensor. */
    int n_state;
    int n_state_slots;
    int64_t *state_floats; /* [n_state] */
    float **state;         /* [n_state] -> [n_state_slots][state_floats[i]], backend memory */
} lm_kv_pool;

/* Values a row of layer l holds: its row stride in K and V. */
static inline int64_t lm_kv_layer_width(const lm_kv_pool *p, int l) {
    return p->layer_width ? p->layer_width[l] : p->kv_width;
}

/* What attention needs to know about a batch: for token t, its sequence
 * seq[t] and position pos[t]; each sequence's block table. */
typedef struct lm_attn_batch {
    int n_tokens;
    const int32_t *pos;                  /* [T] */
    const int32_t *seq;                  /* [T] index into block_tables */
    int n_seqs;
    const int32_t *const *block_tables;  /* [S] -> block ids covering positions 0..max pos */
    const int32_t *state_slot;           /* [S] recurrent-state slot, NULL without state */
    /* [T] or NULL: a slot that also receives the sequence's recurrent state
     * as it is right after token t (-1: none); the sequence's own slot
     * still ends at its last token. Speculative decoding's per-position
     * state: a rejected draft rolls back to the state after the last
     * accepted token without feeding anything again. Only the recurrent
     * ops of a backend with lm_backend_ops.state_out write it. */
    const int32_t *state_out;
} lm_attn_batch;

typedef struct lm_attn_params {
    int n_heads, n_kv_heads, head_dim;
    float scale;   /* usually 1/sqrt(Dh) */
    int window;    /* > 0: attend only to the last `window` positions (sliding) */
    float softcap; /* > 0: logits = softcap * tanh(logits / softcap) */
} lm_attn_params;

typedef struct lm_rope_params {
    int n_heads, head_dim;
    int rot_dim;           /* leading dims of each head that rotate (partial rotary) */
    bool interleaved;      /* pairs (2i, 2i+1) as in GGUF llama; else (i, i+rot_dim/2) as HF */
    const float *inv_freq; /* [rot_dim / 2], host memory, already scaled (llama3 etc.) */
    float attn_factor;     /* multiplies cos and sin (yarn); 1 otherwise */
} lm_rope_params;

/* The activation of a gated MLP (matmul_glu, moe). */
typedef enum lm_glu { LM_GLU_SILU = 0, LM_GLU_GELU_TANH, LM_GLU_GELU } lm_glu;

/* Mixture of experts (moe op): E experts, each a gated MLP
 *   expert_e(x) = down_e (act(gate_e x) * up_e x)
 * (act SiLU, or GELU for Gemma 4)
 * with gate_e, up_e [F][D] and down_e [D][F] in any weight dtype. Each token
 * picks the top_k experts by router logit (exact ties: lowest expert index
 * first, as torch.topk on CUDA; its CPU kernel picks among tied experts in no
 * fixed order), weights them by the softmax over all E logits,
 * renormalised over the chosen k when norm_topk (HF norm_topk_prob), then
 * times expert_scale[e] when given, and sums the weighted expert outputs in
 * ascending expert order. A fused checkpoint tensor ([E][2F][D]) is passed as
 * per-expert row views; shared experts and their gates are separate ops. */
typedef struct lm_moe_params {
    int n_experts;               /* E */
    int top_k;                   /* k, 1 <= k <= E */
    bool norm_topk;              /* renormalise the k chosen probabilities to sum to 1 */
    const lm_tensor *gate, *up;  /* [E] -> [F][D] */
    const lm_tensor *down;       /* [E] -> [D][F] */
    const lm_tensor *expert_scale; /* [1][E] f32 backend memory, or NULL */
    lm_glu act;                  /* the gate's activation (zero: SiLU) */
} lm_moe_params;

/* Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention). A sequence's
 * recurrent state lives in its slot of the pool (lm_attn_batch.state_slot):
 * tensor `index` of lm_kv_pool.state, `offset` floats into the slot. Ops that
 * use it walk each sequence's tokens in batch order, which must be
 * consecutive positions; a sequence whose first token in the batch has
 * position 0 starts from a zero state whatever the slot holds. */
typedef struct lm_state_ref {
    int index;      /* state tensor */
    int64_t offset; /* floats into each slot */
} lm_state_ref;

/* gated_delta: per value head h (key head h / (Hv / Hk)), with q and k
 * L2-normalised (x / sqrt(sum x^2 + 1e-6)) and q scaled by 1/sqrt(Dk), the
 * state S [Dk][Dv] evolves token by token as
 *   S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
 * (the recurrent form). Several tokens of one sequence run in the chunked
 * form, equal up to rounding. State: [Hv][Dk][Dv] floats at `state`. */
typedef struct lm_delta_params {
    int n_k_heads, n_v_heads; /* Hk, Hv (Hv a multiple of Hk) */
    int k_dim, v_dim;         /* Dk, Dv */
    lm_state_ref state;
    /* Which key head value head h reads: false, h / (Hv / Hk) (Hugging Face
     * orders value heads grouped by key head); true, h % Hk (the tiled order
     * llama.cpp's converter writes Qwen3.5 GGUFs in). */
    bool v_tiled;
} lm_delta_params;

/* The routing of one token (host memory): sel [k] the chosen experts by
 * descending logit, w [k] their weights, as lm_moe_params says; every
 * backend's moe op routes through it. scale: [E] or NULL. */
void lm_moe_route(const float *logits, const float *scale, int E, int k, bool norm, int32_t *sel, float *w);
/* The softmax denominator of the routing, the sum of exp(l[e] - m) over
 * e < E in double, in the order a warp sums it (moe_topk.h,
 * LM_MOE_DEN_LANES): so that the GPU's routing kernel gives the host's bits
 * without a serial sum. */
double lm_moe_softmax_den(const float *l, int E, double m);

/* Argument contracts every backend checks the same way (op_check.c). */
void lm_check_state_ref(const lm_kv_pool *kv, lm_state_ref r, const lm_attn_batch *b, int64_t floats);
void lm_check_gated_delta(const lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g, const lm_tensor *beta,
                          const lm_kv_pool *kv, const lm_attn_batch *b, const lm_delta_params *p);
void lm_check_moe(const lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits, const lm_moe_params *p);


/* The RMSNorm that follows a residual add (matmul_add): y = rms_norm(the
 * updated residual) * (w + w_offset), as the rms_norm op computes it; the
 * input of the next sub-block. */
typedef struct lm_norm_out {
    lm_tensor *y;
    const lm_tensor *w;
    float eps, w_offset;
} lm_norm_out;

typedef struct lm_backend lm_backend;

struct lm_backend_ops {
    /* Memory: alloc returns zeroed backend memory (NULL on failure). */
    void *(*alloc)(lm_backend *be, size_t bytes);
    void (*free)(lm_backend *be, void *p);
    /* Makes a weight usable on this backend; host_data stays valid for the
     * backend's lifetime (mmapped). CPU uses it in place. */
    int (*upload_weight)(lm_backend *be, lm_tensor *t, const void *host_data, lm_err *e);
    /* Optional (NULL: upload_weight one by one): n weights of the same
     * width that the model multiplies by the same input (q, k, v; gate, up),
     * which a backend may place back to back to cover them with one product
     * (matmul_n, matmul_glu). lm_backend_upload_weights calls either. */
    int (*upload_weights)(lm_backend *be, int n, lm_tensor *const *t, const void *const *host_data, lm_err *e);
    void (*read)(lm_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*write)(lm_backend *be, void *dst, const void *host_src, size_t bytes);
    /* Optional (NULL: read one by one): n reads, all done on return. A GPU
     * queues them into pinned memory and waits once, where a read into
     * pageable memory waits for each (a KV block is two regions a layer). */
    void (*read_n)(lm_backend *be, int n, void *const *host_dst, const void *const *src, const size_t *bytes);
    /* Backend-to-backend: zero bytes at dst; copy bytes from src to dst. */
    void (*clear)(lm_backend *be, void *dst, size_t bytes);
    void (*copy)(lm_backend *be, void *dst, const void *src, size_t bytes);

    /* y[T][O] = x[T][I] * W[O][I]^T (+ bias[O] if bias != NULL, f32). */
    void (*matmul)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w,
                   const lm_tensor *bias);
    /* y[r] = x[r] / rms(x[r]) * (w + w_offset), rows of width w->cols; w is f32.
     * x->cols must be a multiple of w->cols (per-head norms use Dh-wide rows). */
    void (*rms_norm)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w,
                     float eps, float w_offset);
    /* In place on x[T][H*Dh] at positions pos[T]. */
    void (*rope)(lm_backend *be, lm_tensor *x, const int32_t *pos, const lm_rope_params *p);
    /* y = silu(gate) * up, all [T][F]. */
    void (*silu_mul)(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up);
    /* y += x (same shape). */
    void (*add)(lm_backend *be, lm_tensor *y, const lm_tensor *x);
    /* y *= s. */
    void (*scale)(lm_backend *be, lm_tensor *y, float s);
    /* y[t] = table[ids[t]] as f32; ids in host memory, bounds-checked by the caller. */
    void (*get_rows)(lm_backend *be, lm_tensor *y, const lm_tensor *table, const int32_t *ids);
    /* Copies rows rows[i] of x into y[i]. */
    void (*gather_rows)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const int32_t *rows, int n);
    /* ---- first needed by gemma (cpu_gemma.c) ---- */
    /* y = gelu(gate) * up, all [T][F]: the tanh approximation
     * (gelu_pytorch_tanh) when tanh_approx, else the erf form. */
    void (*gelu_mul)(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up, bool tanh_approx);
    /* In place: y = cap * tanh(y / cap), cap > 0 (logit soft-capping). */
    void (*softcap)(lm_backend *be, lm_tensor *y, float cap);
    /* y[t][j] = x[t][col0 + j], j < y->cols: a block of columns of each row. */
    void (*copy_cols)(lm_backend *be, lm_tensor *y, const lm_tensor *x, int64_t col0);
    /* Writes k, v [T][Hkv*Dh] into layer `layer` of the pool at the batch's positions. */
    void (*kv_write)(lm_backend *be, lm_kv_pool *kv, int layer, const lm_tensor *k,
                     const lm_tensor *v, const lm_attn_batch *b);
    /* out[T][H*Dh] = causal softmax(q k^T * scale) v over each token's own
     * sequence, positions [0, pos[t]] (or the window). GQA: head h reads kv head
     * h / (H / Hkv). */
    void (*attention)(lm_backend *be, lm_tensor *out, const lm_tensor *q, const lm_kv_pool *kv,
                      int layer, const lm_attn_batch *b, const lm_attn_params *p);
    /* y[T][D] = sum over each token's top-k experts of weight * expert(x[t]),
     * routed by router_logits [T][E] (f32, e.g. matmul of x by the router);
     * see lm_moe_params. y must not alias x. */
    void (*moe)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                const lm_moe_params *p);
    /* Gated DeltaNet ops (see lm_state_ref, lm_delta_params). */
    /* true: conv1d_state, gated_delta and gated_delta_gates write
     * lm_attn_batch.state_out; false: the batch must not have it. */
    bool state_out;
    /* Causal depthwise conv of each sequence's x [T][C] with w [C][K] (f32),
     * continuing from the sequence's last K-1 inputs ([K-1][C] floats at
     * `state`, updated): y[t][c] = silu?(sum_j w[c][j] x[t-K+1+j][c]). y must
     * not alias x. */
    void (*conv1d_state)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w,
                         lm_kv_pool *kv, lm_state_ref state, const lm_attn_batch *b, bool silu);
    /* In place on [T][Hv]: g = -exp(a_log) * softplus(g + dt_bias) (log decay),
     * beta = sigmoid(beta); a_log and dt_bias are f32 [Hv]. */
    void (*delta_gates)(lm_backend *be, lm_tensor *g, lm_tensor *beta, const lm_tensor *a_log,
                        const lm_tensor *dt_bias);
    /* out[T][Hv*Dv] from qkv [T][2*Hk*Dk + Hv*Dv] (q | k | v, heads
     * contiguous), g and beta [T][Hv]; updates each sequence's state. */
    void (*gated_delta)(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g,
                        const lm_tensor *beta, lm_kv_pool *kv, const lm_attn_batch *b,
                        const lm_delta_params *p);
    /* y[r] = x[r] / rms(x[r]) * w * silu(z[r]), rows of width w->cols (f32). */
    void (*rms_norm_gated)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *z,
                           const lm_tensor *w, float eps);
    /* y = x * sigmoid(gate); gate [T][cols] or [T][1] (one gate per row). y may be x. */
    void (*sigmoid_mul)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *gate);
    /* host_ids[r] = lm_argmax of row r of x [rows][cols] (f32): greedy
     * decoding without copying logits to the host. Waits for the result. */
    void (*argmax_rows)(lm_backend *be, int32_t *host_ids, const lm_tensor *x);
    /* Greedy look-ahead (optional, all three or none; lm_model_look_ahead).
     * The backend keeps the ids of its last argmax_rows or argmax_rows_later
     * itself, so that the next forward can embed them without the host
     * having seen them, and the host can queue that forward before the ids
     * arrive. */
    /* As argmax_rows, but may return before the ids are in host_ids: they
     * are there once the matching argmax_wait returns (one argmax_wait per
     * call, oldest first; at most 4 outstanding). */
    void (*argmax_rows_later)(lm_backend *be, int32_t *host_ids, const lm_tensor *x);
    /* Waits for the oldest outstanding argmax_rows_later and writes its ids. */
    void (*argmax_wait)(lm_backend *be);
    /* y[r] = table[ids[r]] (as get_rows) with ids the last argmax_rows(_later)
     * results, which had y->rows rows. */
    void (*get_rows_argmax)(lm_backend *be, lm_tensor *y, const lm_tensor *table);
    /* Optional, with the three above (lm_model_masked_look_ahead): as
     * argmax_rows_later, but row r with masked[r] != 0 takes
     * lm_argmax_masked over its mask, masks + r * ceil(cols / 32) words,
     * instead of lm_argmax: greedy under a grammar whose mask became known
     * after the forward was queued (masked NULL: none is). Copies masks and
     * masked before it returns; not inside a graph pass. */
    void (*argmax_rows_masked_later)(lm_backend *be, int32_t *host_ids, const lm_tensor *x, const uint32_t *masks,
                                     const uint8_t *masked);
    /* Optional fused forms (NULL: not offered; lm_blocks.h's lm_op_matmul_n,
     * lm_op_matmul_glu, lm_op_matmul_add and lm_op_moe_add compose them
     * from the ops above; lm_op_rope_kv_write likewise). Results equal the
     * composed ops' up to rounding. */
    /* y[i] = x W[i]^T (+ bias[i]) for n <= 4 weights sharing x (q, k, v, gate);
     * bias NULL or [n] of optional tensors. */
    void (*matmul_n)(lm_backend *be, int n, lm_tensor *const *y, const lm_tensor *x, const lm_tensor *const *w,
                     const lm_tensor *const *bias);
    /* y[T][F] = act(x Wg^T) * (x Wu^T); gate_ws and up_ws [T][F] are
     * workspace the backend may use. */
    void (*matmul_glu)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *wg,
                       const lm_tensor *wu, lm_glu act, lm_tensor *gate_ws, lm_tensor *up_ws);
    /* y += x W^T (the residual add fused); ws [T][O] is workspace. Then,
     * when norm is not NULL, the RMSNorm of the new y into norm->y. */
    void (*matmul_add)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, lm_tensor *ws,
                       const lm_norm_out *norm);
    /* rope(q, rq), rope(k, rk), then kv_write(k, v) at the batch's positions. */
    void (*rope_kv_write)(lm_backend *be, lm_tensor *q, lm_tensor *k, const lm_tensor *v, const lm_rope_params *rq,
                          const lm_rope_params *rk, lm_kv_pool *kv, int layer, const lm_attn_batch *b);
    /* rms_norm(qn, q, wq), rms_norm(kn, k, wk) (per-head norms: wq and wk
     * are head_dim wide; eps and w_offset as rms_norm), then
     * rope_kv_write(qn, kn, v). */
    void (*norm_rope_kv_write)(lm_backend *be, lm_tensor *qn, const lm_tensor *q, lm_tensor *kn, const lm_tensor *k,
                               const lm_tensor *v, const lm_tensor *wq, const lm_tensor *wk, float eps,
                               float w_offset, const lm_rope_params *rq, const lm_rope_params *rk, lm_kv_pool *kv,
                               int layer, const lm_attn_batch *b);
    /* delta_gates(g, beta, a_log, dt_bias), then gated_delta: g and beta
     * come in as the raw projections and are scratch afterwards. */
    void (*gated_delta_gates)(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, lm_tensor *g, lm_tensor *beta,
                              const lm_tensor *a_log, const lm_tensor *dt_bias, lm_kv_pool *kv,
                              const lm_attn_batch *b, const lm_delta_params *p);
    /* y += moe(x) (the residual add fused); ws [T][D] is workspace. Then,
     * when norm is not NULL, the RMSNorm of the new y into norm->y. */
    void (*moe_add)(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                    const lm_moe_params *p, lm_tensor *ws, const lm_norm_out *norm);
    /* Optional (NULL: not offered): replaying a forward as one recorded
     * launch (CUDA graphs). lm_model_forward calls graph_begin(key), with
     * key naming the batch's shape, not its data; a nonzero answer starts a
     * pass in which the backend may defer reads (read, argmax_rows) until
     * graph_end. graph_end(ok) finishes the pass: 0 when its work is done and
     * every read has landed, 1 when the caller must run the same forward
     * again (the backend has switched to issuing it for real) and then call
     * graph_end again. A pass never issues work the eager path would not. */
    int (*graph_begin)(lm_backend *be, uint64_t key);
    int (*graph_end)(lm_backend *be, bool ok);
    void (*destroy)(lm_backend *be);
};

struct lm_backend {
    const struct lm_backend_ops *ops;
    const char *name;
    void *impl;
    lm_backend *inner; /* the wrapped backend of a wrapper (profiling), else NULL */
};

/* The backend under any wrappers: what backend-specific calls act on. */
static inline lm_backend *lm_backend_base(lm_backend *be) {
    while (be && be->inner) be = be->inner;
    return be;
}
/* Wraps inner so that every op is timed alone; the table goes to stderr at
 * destroy (LUMEN_PROFILE=1 in the CLI). Destroying it destroys inner. */
lm_backend *lm_backend_profiled(lm_backend *inner);

/* be's upload_weights, or upload_weight for each of the n weights. */
int lm_backend_upload_weights(lm_backend *be, int n, lm_tensor *const *t, const void *const *host_data, lm_err *e);
/* Convenience: allocate an f32 activation tensor [rows][cols] on be. */
int lm_tensor_alloc(lm_backend *be, lm_tensor *t, int64_t rows, int64_t cols);
void lm_tensor_release(lm_backend *be, lm_tensor *t);
/* A view of rows [r0, r0+n) of an f32 activation tensor. */
lm_tensor lm_tensor_rows(const lm_tensor *t, int64_t r0, int64_t n);

static inline void lm_backend_destroy(lm_backend *be) { if (be) be->ops->destroy(be); }

/* The CPU backend. isa forces a code path (tests exercise each one that the
 * machine supports); LM_ISA_AUTO picks the best. n_threads <= 0: every core. */
typedef enum lm_cpu_isa { LM_ISA_AUTO = 0, LM_ISA_SCALAR, LM_ISA_AVX2, LM_ISA_AVX512 } lm_cpu_isa;
lm_backend *lm_cpu_backend_create(int n_threads, lm_cpu_isa isa, lm_err *e);
/* Best ISA this machine supports, and its name. */
lm_cpu_isa lm_cpu_isa_detect(void);
const char *lm_cpu_isa_name(lm_cpu_isa isa);
int lm_cpu_backend_threads(const lm_backend *be);
/* Quantised weights in GEMV (decode): false (the default) rounds activations
 * to int8 blocks and uses integer dot products; true widens the weights to
 * f32 and keeps activations exact (slow; the reference). The environment
 * variable LUMEN_CPU_QUANT_EXACT=1 sets true at creation. Returns the old
 * setting. */
bool lm_cpu_backend_quant_exact(lm_backend *be, bool exact);

/* The CUDA backend on GPU `device` (0 = the first). NULL with e set when lumen
 * was built without CUDA, no usable GPU is present, or setup fails. Weights
 * are copied to the GPU at upload; out of GPU memory is an error naming the
 * bytes asked for and free. */
lm_backend *lm_cuda_backend_create(int device, lm_err *e);
/* Whether a usable GPU is present; if not, why (for skips and --device auto). */
bool lm_cuda_available(char *why, size_t n);
/* Quantised weights in the CUDA GEMV (up to 8 tokens): false (the default)
 * rounds each thread's slice of the activations to int8 and uses dp4a
 * integer dot products; true keeps exact f32 activations (the reference,
 * several times the instructions). LUMEN_CUDA_QUANT_EXACT=1 sets true at
 * creation. Returns the old setting; false and no effect without CUDA. */
bool lm_cuda_backend_quant_exact(lm_backend *be, bool exact);
/* Matrix products over bf16 weights, and the tiled attention over a bf16
 * cache, on the GPU: false (the default) keeps f32 activations exact
 * (above 8 tokens split in three bf16 terms for the tensor cores, three
 * products; attention on split TF32 operands); true rounds them to bf16
 * (one product, as llama.cpp and vLLM do): at every product, GEMV and GEMM
 * alike, so that a token's products are the same whatever path computes
 * them, and in the tiled attention (queries and softmax weights,
 * cuda_attention_bf16.cu). The order of f32 sums still differs between
 * paths, and a bf16 rounding amplifies such a difference where a value
 * sits on a rounding boundary: cached, batched and speculated logits agree
 * to ~0.1 on the demo (~1e-5 exact), so greedy tokens can change at near
 * ties. Tensor-core GEMVs of 5-8 tokens follow the mode
 * (LUMEN_CUDA_GEMV_TC=0 keeps them off). LUMEN_CUDA_GEMM=bf16 sets true at
 * creation. Set before the first forward (graphs record the mode).
 * Returns the old setting; false and no effect without CUDA. */
bool lm_cuda_backend_bf16_act(lm_backend *be, bool on);
/* Q4_K and Q6_K GEMVs with int8 activations (sm_90): true (the default
 * there) streams the rows through shared memory with bulk copies
 * (cuda_qgemv_staged.cu); false takes the slice kernel (cuda_qgemv.cu), for
 * tests and A/B timing. LUMEN_CUDA_QSTAGED=0 sets false at creation.
 * Returns the old setting; false and no effect without CUDA or before sm_90. */
bool lm_cuda_backend_qstaged(lm_backend *be, bool on);
/* Bytes of device memory free now and in all (0, 0 on non-GPU backends),
 * within the limit set below. */
void lm_backend_mem_info(lm_backend *be, size_t *free_bytes, size_t *total_bytes);
/* Caps the device memory this backend reports: total at most `bytes`, free
 * at most `bytes` minus the device memory taken since the backend was
 * created (by this process, or by others meanwhile), so that model loading
 * and the engine's KV sizing stay inside it (sharing a GPU). 0 removes the
 * cap; no-op on the CPU. */
void lm_backend_set_memory_limit(lm_backend *be, size_t bytes);
/* Forwards run as replayed CUDA graphs so far, and graphs captured (0, 0 on
 * backends without graphs). */
void lm_backend_graph_counts(lm_backend *be, long *replayed, long *captured);
/* Waits until every op enqueued on be has run (no-op on the CPU). */
void lm_backend_sync(lm_backend *be);
/* Host memory that reads from be land in fastest: pinned on a GPU (a read
 * into pageable memory is staged by the driver, ~5x slower for the
 * logits of a 150k vocabulary), plain elsewhere; uninitialised, aborts when
 * none can be had. Freed by lm_backend_host_free with the same be. */
void *lm_backend_host_alloc(lm_backend *be, size_t bytes);
void lm_backend_host_free(lm_backend *be, void *p);
/* The CUDA backend's MoE routing of T tokens, on host arrays (for tests
 * against lm_moe_route): logits [T][E], scale [E] or NULL; sel and w [T][k]
 * get each token's experts in ascending order with their weights. Returns
 * false on a backend that is not CUDA. */
bool lm_cuda_moe_route(lm_backend *be, const float *logits, const float *scale, int T, int E, int k, bool norm,
                       int32_t *sel, float *w);

#endif
