/* cpu_impl.h - state of the CPU backend shared by its op files.
 *
 * lm_cpu is what be->impl points to: the kernel table chosen at creation, the
 * thread pool, and one scratch buffer per thread (weight panels, widened
 * rows). Scratch only grows, from the calling thread before a parallel region,
 * so steady-state decoding never allocates. */
#ifndef LM_CPU_IMPL_H
#define LM_CPU_IMPL_H

#include "cpu_kern.h"
#include "cpu_pool.h"

typedef struct lm_cpu {
    lm_backend be; /* be.impl points back here */
    const lm_cpu_kern *k;
    const lm_cpu_qkern *qk; /* int8-activation GEMV; NULL: exact widening */
    const lm_cpu_qkern *qk_best; /* what qk is when not exact */
    void *qx;               /* grow-only q8x rows of the current GEMV; caller thread */
    size_t qx_bytes;
    lm_pool *pool;
    int n_threads;
    float **scratch;      /* [n_threads] -> scratch_bytes, 64-byte aligned */
    size_t scratch_bytes; /* per thread */
    void *work;           /* grow-only workspace of ops that call other ops (moe); caller thread only */
    size_t work_bytes;
    void *att_parts;      /* grow-only partial states of a split decode (cpu_attention.c); caller thread */
    size_t att_parts_bytes;
    int32_t *last_ids;    /* the last argmax_rows result (get_rows_argmax) */
    int64_t n_last_ids, cap_last_ids;
} lm_cpu;

static inline lm_cpu *lm_cpu_get(lm_backend *be) { return (lm_cpu *)be->impl; }

/* The split decode's buffer, at least `bytes` long. Caller thread only. */
void *lm_cpu_att_parts(lm_cpu *c, size_t bytes);

/* Makes every thread's scratch at least `bytes` long. Caller thread only. */
void lm_cpu_reserve(lm_cpu *c, size_t bytes);

/* Runs fn over [0, n) split into one contiguous range per thread, or inline
 * on the caller when n * cost (roughly: flops) is too small to be worth
 * waking the pool. */
typedef void (*lm_cpu_range_fn)(void *ctx, int64_t i0, int64_t i1, int ith);
void lm_cpu_parallel_for(lm_cpu *c, int64_t n, int64_t cost, lm_cpu_range_fn fn, void *ctx);

/* Ops (cpu_matmul.c, cpu_ops.c, cpu_attention.c); signatures as in lm_backend_ops. */
void lm_cpu_matmul(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w,
                   const lm_tensor *bias);
void lm_cpu_matmul_n(lm_backend *be, int n, lm_tensor *const *y, const lm_tensor *x, const lm_tensor *const *w,
                     const lm_tensor *const *bias);
void lm_cpu_matmul_glu(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *wg, const lm_tensor *wu,
                       lm_glu act, lm_tensor *gate_ws, lm_tensor *up_ws);
void lm_cpu_rms_norm(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, float eps,
                     float w_offset);
void lm_cpu_rope(lm_backend *be, lm_tensor *x, const int32_t *pos, const lm_rope_params *p);
void lm_cpu_silu_mul(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up);
void lm_cpu_add(lm_backend *be, lm_tensor *y, const lm_tensor *x);
void lm_cpu_scale(lm_backend *be, lm_tensor *y, float s);
void lm_cpu_get_rows(lm_backend *be, lm_tensor *y, const lm_tensor *table, const int32_t *ids);
void lm_cpu_gather_rows(lm_backend *be, lm_tensor *y, const lm_tensor *x, const int32_t *rows, int n);
/* First needed by gemma (cpu_gemma.c). */
void lm_cpu_gelu_mul(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up, bool tanh_approx);
void lm_cpu_softcap(lm_backend *be, lm_tensor *y, float cap);
void lm_cpu_copy_cols(lm_backend *be, lm_tensor *y, const lm_tensor *x, int64_t col0);
void lm_cpu_kv_write(lm_backend *be, lm_kv_pool *kv, int layer, const lm_tensor *k,
                     const lm_tensor *v, const lm_attn_batch *b);
void lm_cpu_attention(lm_backend *be, lm_tensor *out, const lm_tensor *q, const lm_kv_pool *kv,
                      int layer, const lm_attn_batch *b, const lm_attn_params *p);
void lm_cpu_moe(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                const lm_moe_params *p); /* cpu_moe.c */

/* Gated DeltaNet ops (cpu_delta.c). */
void lm_cpu_conv1d_state(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w,
                         lm_kv_pool *kv, lm_state_ref state, const lm_attn_batch *b, bool silu);
void lm_cpu_delta_gates(lm_backend *be, lm_tensor *g, lm_tensor *beta, const lm_tensor *a_log,
                        const lm_tensor *dt_bias);
void lm_cpu_gated_delta(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g,
                        const lm_tensor *beta, lm_kv_pool *kv, const lm_attn_batch *b,
                        const lm_delta_params *p);
void lm_cpu_rms_norm_gated(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *z,
                           const lm_tensor *w, float eps);
void lm_cpu_sigmoid_mul(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *gate);

#endif
