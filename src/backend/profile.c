/* profile.c - a backend that times every op of the backend it wraps
 * (LUMEN_PROFILE=1 on any model command): each op waits for the device
 * before and after, so its time is its own launch plus execution, and the
 * table printed at destroy says where a forward spends its time. Waiting
 * serialises the host and the device, so the total is slower than an
 * unprofiled run by the overlap it removes; compare shares, not sums. */
#include <stdio.h>
#include <stdlib.h>

#include "../base/lm_base.h"
#include "lm_backend.h"

enum {
    P_MATMUL, P_RMS_NORM, P_ROPE, P_SILU_MUL, P_ADD, P_SCALE, P_GET_ROWS, P_GATHER_ROWS, P_GELU_MUL, P_SOFTCAP,
    P_COPY_COLS, P_KV_WRITE, P_ATTENTION, P_MOE, P_CONV1D, P_DELTA_GATES, P_GATED_DELTA, P_RMS_NORM_GATED,
    P_SIGMOID_MUL, P_READ, P_WRITE, P_CLEAR, P_COPY, P_ARGMAX, P_N
};
static const char *const k_names[P_N] = {
    "matmul", "rms_norm", "rope", "silu_mul", "add", "scale", "get_rows", "gather_rows", "gelu_mul", "softcap",
    "copy_cols", "kv_write", "attention", "moe", "conv1d_state", "delta_gates", "gated_delta", "rms_norm_gated",
    "sigmoid_mul", "read", "write", "clear", "copy", "argmax_rows",
};

typedef struct prof {
    lm_backend *inner;
    double t[P_N];
    uint64_t n[P_N];
    double t0;
} prof;

static lm_backend *in(lm_backend *be) { return ((prof *)be->impl)->inner; }

static void begin(lm_backend *be) {
    lm_backend_sync(in(be));
    ((prof *)be->impl)->t0 = lm_now();
}

static void end(lm_backend *be, int op) {
    lm_backend_sync(in(be));
    prof *p = be->impl;
    p->t[op] += lm_now() - p->t0;
    p->n[op]++;
}

/* One wrapper per op: time the inner backend's op. */
#define WRAP(op, id, params, args)            \
    static void w_##op params {               \
        begin(be);                            \
        in(be)->ops->op args;                 \
        end(be, id);                          \
    }

WRAP(matmul, P_MATMUL, (lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, const lm_tensor *b),
     (in(be), y, x, w, b))
WRAP(rms_norm, P_RMS_NORM,
     (lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, float eps, float off),
     (in(be), y, x, w, eps, off))
WRAP(rope, P_ROPE, (lm_backend *be, lm_tensor *x, const int32_t *pos, const lm_rope_params *p), (in(be), x, pos, p))
WRAP(silu_mul, P_SILU_MUL, (lm_backend *be, lm_tensor *y, const lm_tensor *g, const lm_tensor *u), (in(be), y, g, u))
WRAP(add, P_ADD, (lm_backend *be, lm_tensor *y, const lm_tensor *x), (in(be), y, x))
WRAP(scale, P_SCALE, (lm_backend *be, lm_tensor *y, float s), (in(be), y, s))
WRAP(get_rows, P_GET_ROWS, (lm_backend *be, lm_tensor *y, const lm_tensor *t, const int32_t *ids),
     (in(be), y, t, ids))
WRAP(gather_rows, P_GATHER_ROWS, (lm_backend *be, lm_tensor *y, const lm_tensor *x, const int32_t *rows, int n),
     (in(be), y, x, rows, n))
WRAP(gelu_mul, P_GELU_MUL, (lm_backend *be, lm_tensor *y, const lm_tensor *g, const lm_tensor *u, bool t),
     (in(be), y, g, u, t))
WRAP(softcap, P_SOFTCAP, (lm_backend *be, lm_tensor *y, float cap), (in(be), y, cap))
WRAP(copy_cols, P_COPY_COLS, (lm_backend *be, lm_tensor *y, const lm_tensor *x, int64_t c0), (in(be), y, x, c0))
WRAP(kv_write, P_KV_WRITE,
     (lm_backend *be, lm_kv_pool *kv, int layer, const lm_tensor *k, const lm_tensor *v, const lm_attn_batch *b),
     (in(be), kv, layer, k, v, b))
WRAP(attention, P_ATTENTION,
     (lm_backend *be, lm_tensor *out, const lm_tensor *q, const lm_kv_pool *kv, int layer, const lm_attn_batch *b,
      const lm_attn_params *p),
     (in(be), out, q, kv, layer, b, p))
WRAP(moe, P_MOE,
     (lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *r, const lm_moe_params *p),
     (in(be), y, x, r, p))
WRAP(conv1d_state, P_CONV1D,
     (lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, lm_kv_pool *kv, lm_state_ref st,
      const lm_attn_batch *b, bool silu),
     (in(be), y, x, w, kv, st, b, silu))
WRAP(delta_gates, P_DELTA_GATES,
     (lm_backend *be, lm_tensor *g, lm_tensor *beta, const lm_tensor *a, const lm_tensor *dt), (in(be), g, beta, a, dt))
WRAP(gated_delta, P_GATED_DELTA,
     (lm_backend *be, lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g, const lm_tensor *beta,
      lm_kv_pool *kv, const lm_attn_batch *b, const lm_delta_params *p),
     (in(be), out, qkv, g, beta, kv, b, p))
WRAP(rms_norm_gated, P_RMS_NORM_GATED,
     (lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *z, const lm_tensor *w, float eps),
     (in(be), y, x, z, w, eps))
WRAP(sigmoid_mul, P_SIGMOID_MUL, (lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *g),
     (in(be), y, x, g))
WRAP(read, P_READ, (lm_backend *be, void *dst, const void *src, size_t n), (in(be), dst, src, n))
WRAP(write, P_WRITE, (lm_backend *be, void *dst, const void *src, size_t n), (in(be), dst, src, n))
WRAP(clear, P_CLEAR, (lm_backend *be, void *dst, size_t n), (in(be), dst, n))
WRAP(argmax_rows, P_ARGMAX, (lm_backend *be, int32_t *ids, const lm_tensor *x), (in(be), ids, x))
WRAP(copy, P_COPY, (lm_backend *be, void *dst, const void *src, size_t n), (in(be), dst, src, n))

static void *w_alloc(lm_backend *be, size_t n) { return in(be)->ops->alloc(in(be), n); }
static void w_free(lm_backend *be, void *p) { in(be)->ops->free(in(be), p); }
static int w_upload(lm_backend *be, lm_tensor *t, const void *h, lm_err *e) {
    return in(be)->ops->upload_weight(in(be), t, h, e);
}

static void w_destroy(lm_backend *be) {
    prof *p = be->impl;
    double total = 0;
    for (int i = 0; i < P_N; i++) total += p->t[i];
    fprintf(stderr, "lumen profile (%s backend, each op timed alone):\n%-16s %10s %12s %10s %6s\n", be->name, "op",
            "calls", "total ms", "us/call", "share");
    for (int i = 0; i < P_N; i++)
        if (p->n[i])
            fprintf(stderr, "%-16s %10llu %12.2f %10.1f %5.1f%%\n", k_names[i], (unsigned long long)p->n[i],
                    1e3 * p->t[i], 1e6 * p->t[i] / (double)p->n[i], total > 0 ? 100 * p->t[i] / total : 0.0);
    lm_backend_destroy(p->inner);
    free(p);
    free(be);
}

static const struct lm_backend_ops k_prof_ops = {
    .alloc = w_alloc, .free = w_free, .upload_weight = w_upload, .read = w_read, .write = w_write,
    .clear = w_clear, .copy = w_copy, .matmul = w_matmul, .rms_norm = w_rms_norm, .rope = w_rope,
    .silu_mul = w_silu_mul, .add = w_add, .scale = w_scale, .get_rows = w_get_rows,
    .gather_rows = w_gather_rows, .gelu_mul = w_gelu_mul, .softcap = w_softcap, .copy_cols = w_copy_cols,
    .kv_write = w_kv_write, .attention = w_attention, .moe = w_moe, .conv1d_state = w_conv1d_state,
    .delta_gates = w_delta_gates, .gated_delta = w_gated_delta, .rms_norm_gated = w_rms_norm_gated,
    .sigmoid_mul = w_sigmoid_mul, .argmax_rows = w_argmax_rows, .destroy = w_destroy,
};

lm_backend *lm_backend_profiled(lm_backend *inner) {
    if (!inner) return NULL;
    prof *p = lm_xcalloc(1, sizeof *p);
    p->inner = inner;
    lm_backend *be = lm_xcalloc(1, sizeof *be);
    be->ops = &k_prof_ops;
    be->name = inner->name;
    be->impl = p;
    be->inner = inner;
    return be;
}
