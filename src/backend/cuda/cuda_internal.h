/* cuda_internal.h - what the CUDA backend's files share.
 *
 * One backend = one device, one stream, one cuBLAS handle. Every op enqueues
 * on the stream and returns; read() synchronises. Host arrays that ops take
 * (positions, sequence ids, block tables, state slots, token ids, rope
 * frequencies) are staged into device memory through lm_cuda_stage: a pinned
 * host ring plus a device ring, both sized for one forward, copied with
 * cudaMemcpyAsync on the stream so no op waits for the host.
 *
 * Within a forward of few tokens the ops may instead be recorded and the
 * forward replayed as a CUDA graph (cuda_graph.cu): every launch goes
 * through lm_cuda_launch, every other stream call through lm_cuda_gate.
 *
 * Files: cuda_backend.cu (lifetime, memory, staging, weights, the op table),
 * cuda_graph.cu (graph passes), cuda_matmul.cu (the matmul op and its
 * fused q/k/v, gate/up and residual forms), cuda_gemv.cu (their GEMV
 * kernels for small T), cuda_gemm.cu (cuBLAS for large T),
 * cuda_elementwise.cu (norms, rope, activations, rows, argmax),
 * cuda_attention.cu (kv_write, paged attention), cuda_rope_kv.cu (rope
 * or norms fused with the KV write), cuda_attention_stage.cu (their batch),
 * cuda_delta.cu (conv1d_state, delta_gates, gated_delta, rms_norm_gated),
 * cuda_moe.cu (moe). */
#ifndef LM_CUDA_INTERNAL_H
#define LM_CUDA_INTERNAL_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <string.h>

#include <type_traits>

extern "C" {
#include "../lm_backend.h"
}

#define LM_CUDA_FREQ_SLOTS 8

#define LM_CUDA_IDS 65536 /* argmax rows kept on the device for the look-ahead */
#define LM_CUDA_LATER 4   /* outstanding argmax_rows_later, at most */

/* One outstanding argmax_rows_later: its ids' copy into pinned, then ev. */
typedef struct lm_cuda_later {
    cudaEvent_t ev;
    int32_t *pinned; /* [LM_CUDA_IDS] */
    int32_t *dst;    /* where argmax_wait puts them */
    size_t bytes;
    unsigned char *mask_pinned; /* argmax_rows_masked_later's row flags and masks, uploaded from here */
    size_t mask_cap;
} lm_cuda_later;

typedef struct lm_cuda {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    /* staging rings, reset at the start of each forward-sized window */
    unsigned char *stage_host;   /* pinned */
    unsigned char *stage_dev;
    size_t stage_cap, stage_used;
    /* scratch for ops that need temporary device memory (split-K partials,
     * MoE routing); grown on demand, stream-ordered */
    void *scratch;
    size_t scratch_cap;
    size_t total_mem, free_mem_at_start;
    size_t mem_limit; /* lm_backend_set_memory_limit; 0 = none */
    /* ---- added with cuda_backend.cu (fields appended, nothing above moved) ---- */
    int n_sms;      /* streaming multiprocessors, for grid sizing */
    /* rope frequencies on the device, by host array and content (every
     * layer passes one of a few arrays - Gemma has two; staging them each
     * time costs a copy, and a graph pass cannot upload) */
    struct {
        float *host; /* a copy of the values (owned) */
        int n;
        uint64_t hash;
        float *dev;
    } freq[LM_CUDA_FREQ_SLOTS];
    int freq_next; /* slot replaced next */
    int gemm_mode; /* LM_CUDA_GEMM_SPLIT, or LM_CUDA_GEMM_BF16 (lm_cuda_backend_bf16_act, LUMEN_CUDA_GEMM=bf16) */
    /* graph passes (cuda_graph.cu): mode, running hash of the pass's launches,
     * number of the pass (a new one at each start) */
    int gmode;
    uint64_t ghash, gpass;
    bool pdl; /* programmatic dependent launch: sm_90+, LUMEN_CUDA_PDL != 0 */
    struct lm_cuda_graphs *graphs;
    /* LM_CUDA_COUNTERS ints, zero between kernels: a kernel whose last block
     * finishes the work of all (the GEMV's fused norm, the decode
     * attention's split merge) counts its blocks here and the last one resets
     * its counter. Kernels of one stream never overlap past lm_pdl_wait, so
     * they share: counter 0 is the GEMV's, 1.. the attention's. */
    int *counters;
    bool fused; /* LUMEN_CUDA_FUSED != 0: the fused ops and the in-kernel split merge */
    bool att_tc; /* sm_80+, LUMEN_CUDA_ATT_TC != 0: tiled attention on tensor cores (cuda_attention_tc.cu) */
    bool att_bf16; /* LUMEN_CUDA_ATT_BF16 != 0: over bf16 caches, its bf16 kernel (cuda_attention_bf16.cu) */
    bool att_dec_tc; /* LUMEN_CUDA_ATT_DEC_TC != 0: decode on tensor cores (cuda_attention_decode_tc.cu) */
    int att_dec_stages; /* LUMEN_CUDA_ATT_DEC_STAGES: its key tiles a warp keeps (0: the default) */
    unsigned skip; /* LM_SKIP_* kinds whose launches are left out (LUMEN_CUDA_SKIP) */
    struct att_memo *att_memo; /* cuda_attention_stage.cu: staged batches of the current graph pass */
    bool gemv_tc_ok; /* sm_80+: GEMVs of 5-8 tokens can run on tensor cores (cuda_gemv.cu) */
    int gemv_tc;     /* LUMEN_CUDA_GEMV_TC: 1 on, 0 off, -1 (unset) with bf16 activations only */
    int gemv_chunks; /* most chunks of a row a GEMV thread takes: LM_GEMV_CHUNKS_MAX, or LUMEN_CUDA_GEMV_CHUNKS */
    bool quant_exact; /* quantised GEMVs in exact f32 arithmetic (LUMEN_CUDA_QUANT_EXACT=1); else int8 activations */
    bool qstaged_ok; /* sm_90+: the staged Q4_K / Q6_K decode GEMV can run (cuda_qgemv_staged.cu) */
    bool qstaged;    /* ... and is used (LUMEN_CUDA_QSTAGED, default on; lm_cuda_backend_qstaged) */
    int qstaged_blocks; /* its blocks an SM, 0: its default (LUMEN_CUDA_QSTAGED_BLOCKS, timing only) */
    int qstaged_stage_kb, qstaged_inflight_kb; /* its stage and in-flight bytes, 0: defaults (LUMEN_CUDA_QSTAGED_STAGE
                                                  / _INFLIGHT in KiB, timing only) */
    bool qstaged_fill; /* its stages may fill the SM's shared memory, one block alone (LUMEN_CUDA_QSTAGED_FILL=1:
                          the plan before the per-block budget, timing only) */
    /* Greedy look-ahead (cuda_elementwise.cu): the last argmax_rows ids stay
     * in ids_dev (ids_rows of them; -1 when more than LM_CUDA_IDS) for
     * get_rows_argmax; argmax_rows_later's copies to the host queue in a ring
     * of pinned buffers, each with an event, until argmax_wait (oldest
     * first: later_head, later_n outstanding). */
    int32_t *ids_dev;
    int64_t ids_rows;
    lm_cuda_later later[LM_CUDA_LATER];
    int later_head, later_n;
    /* gated_delta (cuda_delta.cu): a sequence with at least this many tokens
     * in the batch takes the chunked kernel, fewer the recurrent one
     * (LUMEN_CUDA_DELTA_CHUNK_MIN, default 32; 0: never chunked) */
    int delta_chunk_min;
    int att_blocks_sm; /* the decode attention's split target: blocks an SM (LUMEN_CUDA_ATT_BLOCKS_SM, default 4) */
    int smem_optin; /* most dynamic shared memory a block may opt in to (bytes) */
} lm_cuda;

#define LM_CUDA_COUNTERS 4096

/* LUMEN_CUDA_SKIP=kind,...: the launches of these kinds are left out, for
 * timing only (every value computed after them is wrong; the backend says so
 * at creation). A step's time with and without a kind is what that kind
 * costs inside the pipelined, graph-replayed step, which kernels timed
 * alone (ncu) do not show. Names in lm_cuda_skip_names (cuda_backend.cu). */
enum {
    LM_SKIP_ATTENTION = 1u << 0,  /* attention (and its split merge) */
    LM_SKIP_ROPE_KV = 1u << 1,    /* fused rope of q and k + KV write */
    LM_SKIP_NORM = 1u << 2,       /* rms_norm kernels */
    LM_SKIP_GEMV_N = 1u << 3,     /* GEMVs of several matrices (q/k/v, delta projections) */
    LM_SKIP_GEMV_GLU = 1u << 4,   /* gate + up GEMVs */
    LM_SKIP_GEMV_ADD = 1u << 5,   /* residual GEMVs no wider in than out (o, delta out) */
    LM_SKIP_GEMV_DOWN = 1u << 6,  /* residual GEMVs wider in than out (down) */
    LM_SKIP_NORM_TAIL = 1u << 7,  /* the residual GEMV's fused norm (the GEMV stays) */
    LM_SKIP_CONV = 1u << 8,       /* delta-net conv1d_state */
    LM_SKIP_GATES = 1u << 9,      /* delta-net gates */
    LM_SKIP_DELTA_RULE = 1u << 10, /* the gated delta rule */
    LM_SKIP_GNORM = 1u << 11,     /* delta-net gated norm */
    LM_SKIP_GEMM = 1u << 12,      /* cuBLAS products of more than 8 tokens (their splits and sums stay) */
    LM_SKIP_GEMM_SPLIT = 1u << 13, /* the splits, bias fills and term sums around those products */
};
static inline bool lm_cuda_skip(const lm_cuda *c, unsigned kind) { return (c->skip & kind) != 0; }

/* Large-T matmul precision: SPLIT (default) runs activations as three bf16
 * terms (hi + mid + lo, f32 accumulation: CPU parity); BF16 rounds
 * activations to bf16 (one product; for benchmarks). */
enum { LM_CUDA_GEMM_SPLIT = 0, LM_CUDA_GEMM_BF16 = 1 };

static inline lm_cuda *lm_cuda_of(lm_backend *be) { return (lm_cuda *)be->impl; }

/* Copies n bytes of host memory into the device staging ring (asynchronously,
 * in stream order) and returns the device copy; valid until the ring wraps,
 * which is at least the rest of the current forward. */
void *lm_cuda_stage(lm_cuda *c, const void *host, size_t bytes);
/* A GEMV thread's most chunks of a row (cuda_gemv.cu, lm_gemv_threads). */
#define LM_GEMV_CHUNKS_MAX 3
/* cuda_gemv.cu: the GEMVs of MoE pairs whose matrices are listed on the
 * device; mode LM_GEMV_STORE, or a GLU mode (the gate's activation). */
void lm_cuda_moe_gemv(lm_cuda *c, float *y, const float *x, const unsigned char *const *wp, int k, int pairs,
                      int64_t O, int64_t I, lm_dtype wt, int mode);
/* Grouped experts' GEMVs (cuda_gemv.cu): chunks of up to LM_MOE_CHUNK
 * tokens of one expert; a block takes LM_MOE_ROW_GROUPS groups of rows. */
#define LM_MOE_CHUNK 8
#define LM_MOE_ROW_GROUPS 8
void lm_cuda_moe_group_gemv(lm_cuda *c, float *y, const float *x, const int32_t *chunk, const int32_t *src,
                            const unsigned char *const *wtab, int E, int slots, int64_t O, int64_t I, lm_dtype wt,
                            int mode);
/* Device scratch of at least bytes, valid until the next call. */
void *lm_cuda_scratch(lm_cuda *c, size_t bytes);
/* Aborts with file:line and the CUDA error string: a failed launch or async
 * error inside an op is a bug (ops have no error return), except
 * out-of-memory at alloc time, which alloc reports by returning NULL. */
void lm_cuda_check_fail(cudaError_t err, const char *what, const char *file, int line);
/* The same for cuBLAS calls (status as int so that this header needs no
 * cuBLAS enum in C files). */
void lm_cuda_blas_fail(int status, const char *what, const char *file, int line);
#define LM_CUBLAS_CHECK(x) do { cublasStatus_t st_ = (x); if (st_ != CUBLAS_STATUS_SUCCESS) lm_cuda_blas_fail((int)st_, #x, __FILE__, __LINE__); } while (0)
/* Device workspace private to lm_cuda_matmul (split activations, f16 scale):
 * an op that holds lm_cuda_scratch may call lm_cuda_matmul without losing it.
 * lm_cuda_matmul never touches lm_cuda_scratch; the elementwise ops use
 * neither. Valid until the next call. */
void *lm_cuda_matmul_ws(lm_cuda *c, size_t bytes);
#define LM_CUDA_CHECK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) lm_cuda_check_fail(err_, #x, __FILE__, __LINE__); } while (0)
#define LM_CUDA_LAUNCHED(name) LM_CUDA_CHECK(cudaGetLastError())
/* An on/off environment switch: unset or empty gives dflt; "0", "off" and
 * "no" are off, anything else on (LUMEN_CUDA_GRAPHS, LUMEN_CUDA_PDL, ...). */
bool lm_cuda_env_flag(const char *name, bool dflt);
/* Makes c's device current on the calling thread (a stream of another device
 * cannot be launched on): the engine may call ops from a thread other than
 * the one that created the backend. Cheap when already current. */
/* The device this thread last made current through lm_cuda_set_device:
 * cudaSetDevice costs a driver call, and ops run hundreds of times a token. */
extern __thread int lm_cuda_current_device;
static inline void lm_cuda_set_device(int device) {
    LM_CUDA_CHECK(cudaSetDevice(device));
    lm_cuda_current_device = device;
}
static inline void lm_cuda_use(lm_cuda *c) {
    if (lm_cuda_current_device != c->device) lm_cuda_set_device(c->device);
}

/* The device copy of rope frequencies host[n] (cached by content;
 * cuda_elementwise.cu). */
const float *lm_cuda_freq(lm_cuda *c, const float *host, int n);

/* bf16(lo), bf16(hi) as one word, lo in the low half (an mma operand
 * register, two bf16 values of a store). */
static __device__ __forceinline__ uint32_t lm_bf16x2_bits(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* Rotates the pair (a, b) of a head by angle pos * inv_freq: the rope op's
 * arithmetic (angle rounded to f32 as transformers does, cos/sin in double),
 * shared by the rope kernel and the fused rope + KV write. */
static __device__ __forceinline__ void lm_rope_pair(float *a, float *b, int32_t pos, float inv_freq, double attn_factor) {
    const float af = (float)pos * inv_freq;
    double sn, cs;
    sincos((double)af, &sn, &cs);
    cs *= attn_factor;
    sn *= attn_factor;
    const double x = *a, y = *b;
    *a = (float)(x * cs - y * sn);
    *b = (float)(x * sn + y * cs);
}

__host__ __device__ constexpr int lm_log2_const(int n) { return n <= 1 ? 0 : 1 + lm_log2_const(n / 2); }
__host__ __device__ constexpr int lm_pow2_at_least(int n) { return n <= 1 ? 1 : 2 * lm_pow2_at_least((n + 1) / 2); }

/* Warp sums of NP values (a power of two; each lane holds its part of every
 * one) with the work split (recursive halving): at xor step o = 16, 8, ...
 * a lane keeps half of its values and adds its partner's part of them;
 * once one value is left the steps are the plain butterfly. Each sum is
 * mine + partner's at the partners lane ^ 16, ^ 8, ..., ^ 1, the tree of a
 * butterfly per value (v += shfl_xor(v, o)), so the bits are the same, for
 * NP - 1 + (5 - log2 NP) shuffles instead of 5 NP (32 values: 31 against
 * 160). Afterwards v[i], i < lm_scatter_keep(NP), holds the sum of value
 * lm_scatter_first<NP>(lane) + i; lanes that differ only in the bits of
 * lm_scatter_dups(NP) hold the same sums. */
template <int NP> __device__ __forceinline__ void lm_warp_sum_scatter(float (&v)[NP], int lane) {
    static_assert(NP == lm_pow2_at_least(NP), "a power of two");
    constexpr int LOG = lm_log2_const(NP) < 5 ? lm_log2_const(NP) : 5;
#pragma unroll
    for (int st = 0; st < LOG; st++) {
        const int half = (NP >> st) / 2, o = 16 >> st;
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int k = 0; k < NP / 2; k++) {
            if (k >= half) break;
            const float send = up ? v[k] : v[k + half], keep = up ? v[k + half] : v[k];
            v[k] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (int st = LOG; st < 5; st++) v[0] += __shfl_xor_sync(0xffffffffu, v[0], 16 >> st);
}
__host__ __device__ constexpr int lm_scatter_keep(int np) { return np > 32 ? np / 32 : 1; }
__host__ __device__ constexpr int lm_scatter_dups(int np) { return np >= 32 ? 0 : 32 / np - 1; }
template <int NP> __device__ __forceinline__ int lm_scatter_first(int lane) {
    constexpr int LOG = lm_log2_const(NP) < 5 ? lm_log2_const(NP) : 5;
    return (lane >> (5 - LOG)) * lm_scatter_keep(NP);
}

/* A GEMV's per-warp sums: each lane's parts acc[R][T] summed over the warp
 * (lm_warp_sum_scatter, zeros padding to a power of two) into out[r * T +
 * t], each by one lane. */
template <int R, int T>
__device__ __forceinline__ void lm_warp_sums_store(const float (&acc)[R][T], float *out, int lane) {
    constexpr int NV = R * T, NP = lm_pow2_at_least(NV);
    float v[NP];
#pragma unroll
    for (int i = 0; i < NP; i++) v[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++) v[i] = acc[i / T][i % T];
    lm_warp_sum_scatter<NP>(v, lane);
    const int first = lm_scatter_first<NP>(lane);
    if ((lane & lm_scatter_dups(NP)) == 0)
#pragma unroll
        for (int i = 0; i < lm_scatter_keep(NP); i++)
            if (first + i < NV) out[first + i] = v[i];
}

/* Sums v over the warp (xor tree: every lane gets the same bits). */
static __device__ __forceinline__ double lm_warp_sum_d(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* One row's RMSNorm by one warp (all 32 lanes call it): y = x / rms(x) *
 * (w + off), the squares summed in double over lanes l, l + 32, ... and
 * then across the warp. lm_rms_norm_warp_kernel and the fused q/k norm of
 * att_norm_rope_kv_kernel both use it, so they give the same bits. */
static __device__ __forceinline__ void lm_norm_row_warp(float *y, const float *x, const float *w, int64_t n,
                                                        double eps, double off) {
    const int lane = threadIdx.x & 31;
    double ss = 0.0;
    for (int64_t i = lane; i < n; i += 32) {
        const double xi = __ldcg(x + i); /* through L2: a fused tail reads what other blocks wrote */
        ss += xi * xi;
    }
    ss = lm_warp_sum_d(ss);
    const double s = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = lane; i < n; i += 32) y[i] = (float)((double)__ldcg(x + i) * s * ((double)w[i] + off));
}

/* One row's RMSNorm by a whole block: y = x / rms(x) * (w + off), sums in
 * double as on the CPU. The squares are summed over LM_NORM_VT virtual
 * threads in a fixed order whatever the block size (a multiple of 32 that
 * divides LM_NORM_VT), so the rms_norm op's kernel and the GEMV's fused norm
 * give the same bits. A block of LM_NORM_VT threads holds the row in
 * registers (LM_NORM_REGS values a thread; wider rows read the rest twice)
 * and so waits for memory once. x is read through L2 (__ldcg): in the fused
 * GEMV other blocks wrote it during this kernel, and L1 is not coherent. */
#define LM_NORM_VT 256
#define LM_NORM_REGS 24 /* rows up to 6144 wide in registers */
static __device__ void lm_norm_row(float *y, const float *x, const float *w, int64_t n, double eps, double off) {
    __shared__ double part[LM_NORM_VT / 32];
    __shared__ double scale;
    const int nt = blockDim.x, lane = threadIdx.x & 31, tid = threadIdx.x;
    __syncthreads(); /* the previous row's part and scale have been read */
    float xv[LM_NORM_REGS], wv[LM_NORM_REGS];
    if (nt == LM_NORM_VT) {
#pragma unroll
        for (int k = 0; k < LM_NORM_REGS; k++) {
            const int64_t i = tid + (int64_t)k * LM_NORM_VT;
            xv[k] = i < n ? __ldcg(x + i) : 0.0f;
            wv[k] = i < n ? w[i] : 0.0f;
        }
        double ss = 0.0;
#pragma unroll
        for (int k = 0; k < LM_NORM_REGS; k++) ss += (double)xv[k] * xv[k];
        for (int64_t i = tid + (int64_t)LM_NORM_REGS * LM_NORM_VT; i < n; i += LM_NORM_VT) {
            const double xi = __ldcg(x + i);
            ss += xi * xi;
        }
        ss = lm_warp_sum_d(ss);
        if (lane == 0) part[tid >> 5] = ss;
    } else {
        for (int v = tid; v < LM_NORM_VT; v += nt) { /* warp-uniform: a warp's lanes share v >> 5 */
            double ss = 0.0;
            for (int64_t i = v; i < n; i += LM_NORM_VT) {
                const double xi = __ldcg(x + i);
                ss += xi * xi;
            }
            ss = lm_warp_sum_d(ss);
            if (lane == 0) part[v >> 5] = ss;
        }
    }
    __syncthreads();
    if (tid < 32) {
        double v = lane < LM_NORM_VT / 32 ? part[lane] : 0.0;
        v = lm_warp_sum_d(v);
        if (lane == 0) scale = 1.0 / sqrt(v / (double)n + eps);
    }
    __syncthreads();
    const double s = scale;
    int64_t i0 = tid;
    if (nt == LM_NORM_VT) {
#pragma unroll
        for (int k = 0; k < LM_NORM_REGS; k++) {
            const int64_t i = tid + (int64_t)k * LM_NORM_VT;
            if (i < n) y[i] = (float)((double)xv[k] * s * ((double)wv[k] + off));
        }
        i0 = tid + (int64_t)LM_NORM_REGS * LM_NORM_VT;
    }
    for (int64_t i = i0; i < n; i += nt) y[i] = (float)((double)__ldcg(x + i) * s * ((double)w[i] + off));
}

/* One row's RMSNorm with the rms_norm op's bits (lm_cuda_rms_norm: a warp
 * a row up to LM_NORM_WARP_MAX wide, else lm_norm_row), for the fused norms
 * that end a kernel in its last block; every thread of the block calls it. */
#define LM_NORM_WARP_MAX 1024
static __device__ void lm_norm_row_op(float *y, const float *x, const float *w, int64_t n, double eps, double off) {
    if (n > LM_NORM_WARP_MAX) lm_norm_row(y, x, w, n, eps, off);
    else if (threadIdx.x < 32) lm_norm_row_warp(y, x, w, n, eps, off);
}

/* Whether the norm of y's rows [T][D] (f32, contiguous) can end a kernel in
 * its last blocks: one f32 norm vector of D, into a distinct [T][D] f32
 * tensor (the GEMV's and the MoE combine's fused norms). */
static inline bool lm_norm_out_fits(const lm_norm_out *n, const void *y, int64_t T, int64_t D) {
    return n && n->w->type == LM_F32 && n->w->rows * n->w->cols == D && n->y->type == LM_F32 && n->y->rows == T &&
           n->y->cols == D && n->y->data != y;
}

/* Whether this block is the last of `total` to arrive at *counter (after
 * its own global writes, which the last block may then read through L2);
 * the last one resets the counter. Every thread of the block must call it. */
static __device__ __forceinline__ bool lm_last_block(int *counter, int total) {
    __shared__ int last;
    __threadfence(); /* this block's writes, before it is counted */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1) == total - 1;
        if (last) *counter = 0; /* every other block has counted */
    }
    __syncthreads();
    if (last) __threadfence(); /* the other blocks' writes, before they are read */
    return last;
}

/* silu(g) * u and gelu(g) * u as the CPU computes them (silu in f32, gelu in
 * double; tanh_approx: gelu_pytorch_tanh), shared by the element-wise
 * kernels and the fused gate/up GEMV so that both give the same bits. */
static __device__ __forceinline__ float lm_silu_mul1(float g, float u) { return g / (1.0f + expf(-g)) * u; }
static __device__ __forceinline__ float lm_gelu_mul1(float g, float u, bool tanh_approx) {
    const double a = g;
    const double r = tanh_approx ? 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
                                 : 0.5 * a * (1.0 + erf(a * 0.7071067811865476));
    return (float)(r * u);
}

/* Op entry points, one definition each in the files above. */
void lm_cuda_matmul(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias);
void lm_cuda_rms_norm(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, float eps, float w_offset);
void lm_cuda_rope(lm_backend *be, lm_tensor *x, const int32_t *pos, const lm_rope_params *p);
void lm_cuda_silu_mul(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up);
void lm_cuda_add(lm_backend *be, lm_tensor *y, const lm_tensor *x);
void lm_cuda_scale(lm_backend *be, lm_tensor *y, float s);
void lm_cuda_get_rows(lm_backend *be, lm_tensor *y, const lm_tensor *table, const int32_t *ids);
void lm_cuda_gather_rows(lm_backend *be, lm_tensor *y, const lm_tensor *x, const int32_t *rows, int n);
void lm_cuda_gelu_mul(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up, bool tanh_approx);
void lm_cuda_softcap(lm_backend *be, lm_tensor *y, float cap);
void lm_cuda_copy_cols(lm_backend *be, lm_tensor *y, const lm_tensor *x, int64_t col0);
void lm_cuda_sigmoid_mul(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *gate);
void lm_cuda_kv_write(lm_backend *be, lm_kv_pool *kv, int layer, const lm_tensor *k, const lm_tensor *v,
                      const lm_attn_batch *b);
void lm_cuda_attention(lm_backend *be, lm_tensor *out, const lm_tensor *q, const lm_kv_pool *kv, int layer,
                       const lm_attn_batch *b, const lm_attn_params *p);
void lm_cuda_moe(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                 const lm_moe_params *p);
void lm_cuda_moe_add(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                     const lm_moe_params *p, lm_tensor *ws, const lm_norm_out *norm);
void lm_cuda_conv1d_state(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, lm_kv_pool *kv,
                          lm_state_ref state, const lm_attn_batch *b, bool silu);
void lm_cuda_delta_gates(lm_backend *be, lm_tensor *g, lm_tensor *beta, const lm_tensor *a_log,
                         const lm_tensor *dt_bias);
void lm_cuda_gated_delta(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g,
                         const lm_tensor *beta, lm_kv_pool *kv, const lm_attn_batch *b, const lm_delta_params *p);
void lm_cuda_argmax_rows(lm_backend *be, int32_t *host_ids, const lm_tensor *x);
void lm_cuda_argmax_rows_later(lm_backend *be, int32_t *host_ids, const lm_tensor *x);
void lm_cuda_argmax_wait(lm_backend *be);
void lm_cuda_get_rows_argmax(lm_backend *be, lm_tensor *y, const lm_tensor *table);
void lm_cuda_argmax_rows_masked_later(lm_backend *be, int32_t *host_ids, const lm_tensor *x, const uint32_t *masks,
                                      const uint8_t *masked);
void lm_cuda_matmul_n(lm_backend *be, int n, lm_tensor *const *y, const lm_tensor *x, const lm_tensor *const *w,
                      const lm_tensor *const *bias);
void lm_cuda_matmul_glu(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *wg, const lm_tensor *wu,
                        lm_glu act, lm_tensor *gate_ws, lm_tensor *up_ws);
void lm_cuda_matmul_add(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, lm_tensor *ws,
                        const lm_norm_out *norm);
void lm_cuda_rope_kv_write(lm_backend *be, lm_tensor *q, lm_tensor *k, const lm_tensor *v, const lm_rope_params *rq,
                           const lm_rope_params *rk, lm_kv_pool *kv, int layer, const lm_attn_batch *b);
void lm_cuda_norm_rope_kv_write(lm_backend *be, lm_tensor *qn, const lm_tensor *q, lm_tensor *kn, const lm_tensor *k,
                                const lm_tensor *v, const lm_tensor *wq, const lm_tensor *wk, float eps,
                                float w_offset, const lm_rope_params *rq, const lm_rope_params *rk, lm_kv_pool *kv,
                                int layer, const lm_attn_batch *b);
void lm_cuda_gated_delta_gates(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, lm_tensor *a, lm_tensor *b_raw,
                               const lm_tensor *a_log, const lm_tensor *dt_bias, lm_kv_pool *kv,
                               const lm_attn_batch *b, const lm_delta_params *p);
void lm_cuda_rms_norm_gated(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *z,
                            const lm_tensor *w, float eps);

/* Graph pass modes (cuda_graph.cu): OFF issues as usual; REPLAY hashes every
 * launch and issues nothing; CAPTURE hashes and issues under stream capture;
 * DRY (a pass that hit something uncapturable) does neither. */
enum { LM_G_OFF = 0, LM_G_REPLAY, LM_G_CAPTURE, LM_G_DRY };
typedef struct lm_cuda_graphs lm_cuda_graphs;
void lm_cuda_graphs_init(lm_cuda *c);
void lm_cuda_graphs_free(lm_cuda *c);
int lm_cuda_graph_begin(lm_backend *be, uint64_t key);
int lm_cuda_graph_end(lm_backend *be, bool ok);
void lm_cuda_graph_counts(lm_cuda *c, long *replayed, long *captured);
/* Mixes bytes into the pass hash. */
void lm_cuda_graph_mix(lm_cuda *c, const void *bytes, size_t n);
/* For a stream call other than a kernel launch (cuBLAS, in-op copies):
 * hashes desc in a pass and says whether to issue the call now. */
bool lm_cuda_gate(lm_cuda *c, const void *desc, size_t n);
/* Ends a pass that met something it cannot capture (see cuda_graph.cu). */
void lm_cuda_graph_abandon(lm_cuda *c);
/* lm_cuda_stage during a pass: the graph staging buffer. */
void *lm_cuda_graph_stage(lm_cuda *c, const void *host, size_t bytes);
/* A device-to-host copy during a pass, done after the graph has run; the
 * launch waits for it, unless later >= 0: then it records the event of
 * c->later[later] after it and counts that entry as outstanding (argmax_rows_later). */
void lm_cuda_graph_defer_read(lm_cuda *c, void *host, const void *dev, size_t bytes, int later);
/* Counts the look-ahead ring's entry `slot` as outstanding, its copy
 * issued: records its event (cuda_elementwise.cu). */
void lm_cuda_later_commit(lm_cuda *c, int slot);

template <typename P, typename A>
static inline void lm_cuda_mix_arg(lm_cuda *c, const A &a) {
    if constexpr (std::is_same_v<std::decay_t<A>, P>) {
        lm_cuda_graph_mix(c, &a, sizeof a); /* structs: the caller's bytes, padding as it set it */
    } else {
        const P v = static_cast<P>(a); /* scalars and pointers */
        lm_cuda_graph_mix(c, &v, sizeof v);
    }
}

/* Programmatic dependent launch (Hopper). A kernel launched with
 * lm_cuda_launch_pdl may start while the kernel before it still runs: it
 * calls lm_pdl_wait() before it touches memory an earlier kernel writes or
 * reads (weights excepted: the GEMV fetches its first weights before the
 * wait), and lm_pdl_trigger() to let the kernel after it start early. Both
 * are no-ops for a kernel launched plainly, and before sm_90. */
__device__ __forceinline__ void lm_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void lm_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* Every kernel launch of the backend: k<<<grid, block, smem, stream>>>(args)
 * outside a graph pass; inside one, the launch and the bytes of each
 * argument (converted to the kernel's parameter type) go into the pass hash,
 * and the launch is issued only while capturing. pdl: see lm_pdl_wait. */
template <typename... P, typename... A>
static inline void lm_cuda_launch_ex(lm_cuda *c, bool pdl, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                                     const A &...args) {
    static_assert(sizeof...(P) == sizeof...(A), "lm_cuda_launch: argument count differs from the kernel's");
    pdl = pdl && c->pdl;
    if (c->gmode != LM_G_OFF) {
        if (c->gmode == LM_G_DRY) return;
        struct {
            const void *k;
            unsigned g[3], b[3];
            uint64_t smem, pdl;
        } d;
        memset(&d, 0, sizeof d);
        d.k = (const void *)k;
        d.g[0] = grid.x, d.g[1] = grid.y, d.g[2] = grid.z;
        d.b[0] = block.x, d.b[1] = block.y, d.b[2] = block.z;
        d.smem = smem, d.pdl = pdl;
        lm_cuda_graph_mix(c, &d, sizeof d);
        (lm_cuda_mix_arg<P>(c, args), ...);
        if (c->gmode != LM_G_CAPTURE) return;
    }
    if (!pdl) {
        k<<<grid, block, smem, c->stream>>>(static_cast<P>(args)...);
        return;
    }
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = c->stream;
    cfg.attrs = at, cfg.numAttrs = 1;
    LM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, static_cast<P>(args)...));
}

template <typename... P, typename... A>
static inline void lm_cuda_launch(lm_cuda *c, void (*k)(P...), dim3 grid, dim3 block, size_t smem, const A &...args) {
    lm_cuda_launch_ex(c, false, k, grid, block, smem, args...);
}
template <typename... P, typename... A>
static inline void lm_cuda_launch_pdl(lm_cuda *c, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                                      const A &...args) {
    lm_cuda_launch_ex(c, true, k, grid, block, smem, args...);
}

/* cudaMemsetAsync / cudaMemcpyAsync (device to device) inside an op. */
void lm_cuda_memset(lm_cuda *c, void *p, int v, size_t bytes);
void lm_cuda_memcpy_d2d(lm_cuda *c, void *dst, const void *src, size_t bytes);

/* ---- matmul: cuda_matmul.cu picks cuda_gemv.cu or cuda_gemm.cu ------------------ */

#ifndef LM_GEMV_MAX_T
#define LM_GEMV_MAX_T 8 /* tokens up to which the GEMV beats cuBLAS (to be measured on the H200) */
#endif

/* What one GEMV launch computes. Plain and ADD modes: up to LM_GEMV_MAXM
 * matrices sharing x (q, k, v and a gate in one launch), block b working on
 * matrix m with first_block[m] <= b < first_block[m + 1]. GLU modes: w[0] =
 * gate, w[1] = up (both [F][I]), y[0] = act(x gate^T) * (x up^T): each block
 * takes R / 2 rows of both, so the product needs no second pass. ADD_NORM:
 * ADD of one matrix, then the last block to finish norms every row of the
 * new y into norm_y (lm_norm_row), which saves the norm's own launch. */
#define LM_GEMV_MAXM 4
enum { LM_GEMV_STORE = 0, LM_GEMV_ADD, LM_GEMV_ADD_NORM, LM_GEMV_GLU_SILU, LM_GEMV_GLU_GELU_TANH, LM_GEMV_GLU_GELU };

typedef struct lm_gemv_args {
    const float *x;
    int64_t I;
    const unsigned char *w[LM_GEMV_MAXM];
    const float *bias[LM_GEMV_MAXM];
    float *y[LM_GEMV_MAXM];
    int64_t O[LM_GEMV_MAXM];
    int64_t first_block[LM_GEMV_MAXM + 1];
    /* ADD_NORM */
    float *norm_y;
    const float *norm_w;
    double eps, w_offset;
    int *counter;
    int rows; /* per block: lm_gemv_rows(T) (host side; the kernel has it as a constant) */
    /* MOE == LM_MOE_PAIRS (one token a pair; grid.y = pairs): pair p's
     * matrix is moe_w[p] (GLU: gate moe_w[p], up moe_w[moe_E + p], moe_E =
     * the pairs), as the routing kernel wrote them; x is row p / moe_k of x
     * (GLU: the token) or row p (down: the pair's activations); y is row p
     * of y[0].
     * MOE == LM_MOE_GROUPS (grid.y = chunk slots): slot c is moe_chunk[3c ..]
     * = (expert, first grouped row r0, tokens n <= T; n = 0: an unused slot);
     * token i of the chunk is grouped row r0 + i, whose x is row
     * moe_src[r0 + i] of x (GLU) or row r0 + i (down, moe_src NULL); y is
     * row r0 + i of y[0]. */
    const int32_t *moe_chunk, *moe_src;
    const unsigned char *const *moe_w;
    int moe_k, moe_E;
    /* the quantised GEMV (cuda_qgemv.cu): tokens of x and y when fewer than
     * the kernel's T (the rest are not read or written); 0: T */
    int n_tok;
    /* bf16 activations (lm_cuda_backend_bf16_act, bf16 rows): x rounded
     * to bf16 as it is read, so the GEMV's products are the GEMM's */
    int x_bf16;
} lm_gemv_args;

static inline bool lm_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* cuda_gemv.cu: whether x and every weight allow 16-byte chunks; whether T
 * tokens take tensor-core tiles; an args block with no matrices yet, then
 * matrix i appended (a->rows rows a block), or the GLU modes' gate and up;
 * the launch for T tokens in a mode; one matrix's plain GEMV. */
bool lm_gemv_vec(const lm_gemv_args *a, int n, lm_dtype wt);
bool lm_gemv_tc(const lm_cuda *c, int64_t T, lm_dtype wt);
lm_gemv_args lm_gemv_args0(const float *x, int64_t I, int64_t T, bool tc);
void lm_gemv_add(lm_gemv_args *a, int i, float *y, const void *w, const float *bias, int64_t O);
void lm_gemv_set_glu(lm_gemv_args *a, float *y, const void *wg, const void *wu, int64_t F);
void lm_gemv_run(lm_cuda *c, int T, const lm_gemv_args *a, lm_dtype wt, int mode, bool vec);
void lm_gemv(lm_cuda *c, int T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias,
             int64_t O, int64_t I);

/* Where the columns of one product go. The product covers weights stored
 * back to back ([sum O][I]): part i's O[i] columns go to y[i] ([T][O[i]],
 * plus bias[i] when not NULL; added to what y[i] holds when acc). With glu
 * the two parts are a gate and an up projection and y[0] [T][O[0]] =
 * act(gate) * up instead. */
typedef struct lm_gemm_out {
    int n, glu; /* glu: 0, or LM_GLU_* + 1 */
    int acc, spare; /* spare: no padding bytes (kernel arguments are hashed as bytes in a graph pass) */
    float *y[LM_GEMV_MAXM];
    const float *bias[LM_GEMV_MAXM];
    int64_t O[LM_GEMV_MAXM];
} lm_gemm_out;

/* cuda_gemm.cu: y[t][o] = bias[o]; blocks for n elements; whether one
 * product can take o's stacked weights; the product as o says (lm_gemm),
 * o of n parts otherwise zero, and the common case of one output. */
__global__ void lm_bias_fill_kernel(float *y, const float *bias, int64_t T, int64_t O);
unsigned lm_grid_1d(lm_cuda *c, int64_t n, int threads);
bool lm_gemm_stackable(const lm_cuda *c, int64_t T, const lm_gemm_out *o);
void lm_gemm(lm_cuda *c, int64_t T, const float *x, const void *w, lm_dtype wt, int64_t I, const lm_gemm_out *o);
lm_gemm_out lm_gemm_out0(int n);
void lm_gemm1(lm_cuda *c, int64_t T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias,
              int64_t O, int64_t I, bool acc);

/* ---- quantised weights: cuda_quant.h (block decoders), cuda_qgemv.cu, cuda_dequant.cu ---- */
/* Whether the GPU kernels read blocks of type t (uploaded as stored): the
 * GGUF types, and FP8_B128 (Hugging Face FP8 repacked at load). */
static inline bool lm_cuda_qtype(lm_dtype t) {
    return t == LM_Q8_0 || t == LM_Q4_0 || t == LM_Q4_1 || t == LM_Q5_0 || t == LM_Q5_1 || t == LM_IQ4_NL ||
           t == LM_Q4_K || t == LM_Q5_K || t == LM_Q6_K || t == LM_IQ4_XS || t == LM_Q2_K || t == LM_Q3_K ||
           t == LM_FP8_B128 || t == LM_A4_BF16 || t == LM_A4_F16 || t == LM_A8_BF16 || t == LM_A8_F16;
}
/* The GEMV over quantised rows for T <= LM_GEMV_MAX_T: whether it takes x
 * and w (alignment); an args block for it (then lm_gemv_add per matrix,
 * all of one type); its launch; one matrix's GEMV. */
bool lm_qweight_ok(const void *w, lm_dtype wt);
bool lm_qgemv_ok(const float *x, const void *w, lm_dtype wt);
lm_gemv_args lm_qgemv_args0(const float *x, int64_t I);
void lm_qgemv_run(lm_cuda *c, int T, const lm_gemv_args *a, lm_dtype wt, int mode);
/* cuda_qgemv_staged.cu: the decode GEMV over Q4_K / Q6_K rows streamed
 * through shared memory by bulk copies (sm_90); lm_qgemv_run calls it when
 * lm_sgemv_takes says so. lm_sgemv_init once a backend (kernel attributes). */
void lm_sgemv_init(lm_cuda *c);
bool lm_sgemv_takes(const lm_cuda *c, const lm_gemv_args *a, lm_dtype wt);
void lm_sgemv_run(lm_cuda *c, int n_tok, const lm_gemv_args *a, lm_dtype wt, int mode);
/* Whether the quantised GEMV has its fused modes (LM_GEMV_ADD, LM_GEMV_GLU_SILU) for T tokens of type wt. */
bool lm_qgemv_fused(int64_t T, lm_dtype wt);
void lm_qgemv(lm_cuda *c, int T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias, int64_t O,
              int64_t I);
/* The MoE pairs form over quantised experts (lm_cuda_moe_gemv's contract). */
void lm_qmoe_gemv(lm_cuda *c, float *y, const float *x, const unsigned char *const *wp, int k, int pairs, int64_t O,
                  int64_t I, lm_dtype wt, int mode);
/* Any T over quantised w: widened to bf16 in row chunks, then the bf16 GEMM. */
void lm_qgemm(lm_cuda *c, int64_t T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias,
              int64_t O, int64_t I);
/* n quantised rows (ids on the device, or row0 + i) widened to f32 [n][I]. */
void lm_cuda_dequant_f32(lm_cuda *c, float *out, const void *w, lm_dtype wt, int64_t I, const int32_t *ids,
                         int64_t row0, int64_t n);
/* Device workspace private to lm_qgemm (widened weights, chunk products);
 * lm_qgemm calls lm_gemm, which uses lm_cuda_matmul_ws. Valid until the next call. */
void *lm_cuda_dequant_ws(lm_cuda *c, size_t bytes);

#endif
