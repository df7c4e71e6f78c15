/* cuda_elementwise.cu - the small per-row and per-element ops on the GPU.
 *
 * rms_norm, rope, silu_mul, add, scale, get_rows, gather_rows, gelu_mul,
 * softcap, copy_cols and sigmoid_mul. All are memory bound; each follows
 * the CPU backend's arithmetic (cpu_ops.c, cpu_gemma.c, cpu_delta.c) so
 * that results agree to an f32 rounding: rms_norm sums squares and scales
 * in double; rope takes the angle as the f32 product pos * inv_freq (as
 * transformers rounds it) and cos/sin in double; gelu and softcap run their
 * tanh/erf in double; silu and sigmoid are f32 as on the CPU. Host arrays
 * (positions, ids, rows, inv_freq) go through lm_cuda_stage. Element-wise
 * kernels use grid-stride loops sized to a few blocks per SM. */
#include "cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define LM_EW_THREADS 256

static unsigned lm_ew_grid(lm_cuda *c, int64_t n) {
    int64_t b = (n + LM_EW_THREADS - 1) / LM_EW_THREADS;
    int64_t cap = (int64_t)(c->n_sms > 0 ? c->n_sms : 64) * 16;
    return (unsigned)LM_MAX((int64_t)1, LM_MIN(b, cap));
}

#define LM_GRID_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

static bool lm_same_shape(const lm_tensor *a, const lm_tensor *b) {
    return a->type == LM_F32 && b->type == LM_F32 && a->rows == b->rows && a->cols == b->cols;
}

/* ---- rms_norm ---------------------------------------------------------------------- */

/* Narrow rows (n <= 1024, e.g. per-head norms): one warp per row. */
__global__ void lm_rms_norm_warp_kernel(float *y, const float *x, const float *w, int64_t rows, int64_t n, double eps,
                                        double off) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;
    lm_norm_row_warp(y + r * n, x + r * n, w, n, eps, off);
}

/* Wide rows: one block per row (lm_norm_row, shared with the GEMV's fused
 * norm). */
#define LM_NORM_BLOCK LM_NORM_VT

__global__ void __launch_bounds__(LM_NORM_BLOCK) lm_rms_norm_block_kernel(float *y, const float *x, const float *w,
                                                                          int64_t n, double eps, double off) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t r = blockIdx.x;
    lm_norm_row(y + r * n, x + r * n, w, n, eps, off);
}

void lm_cuda_rms_norm(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, float eps,
                      float w_offset) {
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && w->type == LM_F32);
    LM_ASSERT(w->cols > 0 && x->cols % w->cols == 0 && w->rows == 1);
    LM_ASSERT(y->rows == x->rows && y->cols == x->cols);
    lm_cuda *c = lm_cuda_of(be);
    const int64_t n = w->cols, rows = x->rows * (x->cols / w->cols);
    if (rows == 0 || lm_cuda_skip(c, LM_SKIP_NORM)) return;
    lm_cuda_use(c);
    if (n <= LM_NORM_WARP_MAX) {
        const int64_t per_block = LM_EW_THREADS / 32;
        int64_t blocks = (rows + per_block - 1) / per_block;
        LM_ASSERT(blocks <= 0x7fffffff);
        lm_cuda_launch_pdl(c, lm_rms_norm_warp_kernel, (unsigned)blocks, LM_EW_THREADS, 0, (float *)y->data,
                           (const float *)x->data, (const float *)w->data, rows, n, eps, w_offset);
    } else {
        LM_ASSERT(rows <= 0x7fffffff);
        lm_cuda_launch_pdl(c, lm_rms_norm_block_kernel, (unsigned)rows, LM_NORM_BLOCK, 0, (float *)y->data,
                           (const float *)x->data, (const float *)w->data, n, eps, w_offset);
    }
    LM_CUDA_LAUNCHED("rms_norm");
}

/* ---- rope ---------------------------------------------------------------------------- */

/* One thread per (token, head, frequency): the heads of a token recompute
 * the same cos/sin, which costs less than walking them in one thread. */
__global__ void lm_rope_kernel(float *x, int64_t T, int64_t cols, const int32_t *pos, const float *inv_freq,
                               int n_heads, int head_dim, int half, bool interleaved, double attn_factor) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    LM_GRID_LOOP(idx, T * n_heads * half) {
        const int64_t t = idx / ((int64_t)n_heads * half);
        const int h = (int)(idx / half % n_heads), i = (int)(idx % half);
        const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
        float *xh = x + t * cols + (int64_t)h * head_dim;
        lm_rope_pair(&xh[ia], &xh[ib], pos[t], inv_freq[i], attn_factor);
    }
}

/* p->inv_freq on the device: a cached copy of the same values (models
 * may hold one array per layer with equal contents, as Gemma does), else an
 * upload into the slot used least recently. */
const float *lm_cuda_freq(lm_cuda *c, const float *host, int n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)host;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    for (int i = 0; i < LM_CUDA_FREQ_SLOTS; i++)
        if (c->freq[i].dev && c->freq[i].n == n && c->freq[i].hash == h &&
            memcmp(c->freq[i].host, host, (size_t)n * sizeof(float)) == 0)
            return c->freq[i].dev;
    if (c->gmode != LM_G_OFF) { /* a new upload in a graph pass: run this forward eagerly */
        lm_cuda_graph_abandon(c);
        return c->freq[0].dev;
    }
    const int i = c->freq_next;
    c->freq_next = (i + 1) % LM_CUDA_FREQ_SLOTS;
    if (c->freq[i].dev && c->freq[i].n < n) {
        LM_CUDA_CHECK(cudaFreeAsync(c->freq[i].dev, c->stream));
        c->freq[i].dev = NULL;
    }
    if (!c->freq[i].dev) LM_CUDA_CHECK(cudaMallocAsync((void **)&c->freq[i].dev, (size_t)n * sizeof(float), c->stream));
    const float *staged = (const float *)lm_cuda_stage(c, host, (size_t)n * sizeof(float));
    LM_CUDA_CHECK(cudaMemcpyAsync(c->freq[i].dev, staged, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    c->freq[i].host = (float *)lm_xrealloc(c->freq[i].host, (size_t)n * sizeof(float));
    memcpy(c->freq[i].host, host, (size_t)n * sizeof(float));
    c->freq[i].n = n, c->freq[i].hash = h;
    return c->freq[i].dev;
}

void lm_cuda_rope(lm_backend *be, lm_tensor *x, const int32_t *pos, const lm_rope_params *p) {
    LM_ASSERT(x->type == LM_F32);
    LM_ASSERT(p->rot_dim >= 0 && p->rot_dim % 2 == 0 && p->rot_dim <= p->head_dim);
    LM_ASSERT((int64_t)p->n_heads * p->head_dim <= x->cols);
    if (p->rot_dim == 0 || x->rows == 0) return;
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    const int half = p->rot_dim / 2;
    const int32_t *dpos = (const int32_t *)lm_cuda_stage(c, pos, (size_t)x->rows * sizeof *pos);
    const float *dfreq = lm_cuda_freq(c, p->inv_freq, half);
    const int64_t n = x->rows * p->n_heads * half;
    lm_cuda_launch_pdl(c, lm_rope_kernel, lm_ew_grid(c, n), LM_EW_THREADS, 0, (float *)x->data, x->rows, x->cols, dpos,
                       dfreq, p->n_heads, p->head_dim, half, p->interleaved, (double)p->attn_factor);
    LM_CUDA_LAUNCHED("rope");
}

/* ---- element-wise ------------------------------------------------------------------------ */

__global__ void lm_silu_mul_kernel(float *y, const float *g, const float *u, int64_t n) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    LM_GRID_LOOP(i, n) y[i] = lm_silu_mul1(g[i], u[i]);
}

__global__ void lm_add_kernel(float *y, const float *x, int64_t n) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    LM_GRID_LOOP(i, n) y[i] += x[i];
}

__global__ void lm_scale_kernel(float *y, float s, int64_t n) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    LM_GRID_LOOP(i, n) y[i] *= s;
}

__global__ void lm_gelu_mul_kernel(float *y, const float *g, const float *u, int64_t n, bool tanh_approx) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    LM_GRID_LOOP(i, n) y[i] = lm_gelu_mul1(g[i], u[i], tanh_approx);
}

__global__ void lm_softcap_kernel(float *y, double cap, int64_t n) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    LM_GRID_LOOP(i, n) y[i] = (float)(cap * tanh((double)y[i] / cap));
}

__global__ void lm_sigmoid_mul_kernel(float *y, const float *x, const float *gate, int64_t n, int64_t cols,
                                      bool per_row) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    LM_GRID_LOOP(i, n) {
        if (per_row) {
            float s = 1.0f / (1.0f + expf(-gate[i / cols]));
            y[i] = x[i] * s;
        } else {
            y[i] = x[i] / (1.0f + expf(-gate[i]));
        }
    }
}

void lm_cuda_silu_mul(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up) {
    LM_ASSERT(lm_same_shape(y, gate) && lm_same_shape(y, up));
    lm_cuda *c = lm_cuda_of(be);
    const int64_t n = y->rows * y->cols;
    if (n == 0) return;
    lm_cuda_use(c);
    lm_cuda_launch_pdl(c, lm_silu_mul_kernel, lm_ew_grid(c, n), LM_EW_THREADS, 0, (float *)y->data,
                       (const float *)gate->data, (const float *)up->data, n);
    LM_CUDA_LAUNCHED("silu_mul");
}

void lm_cuda_add(lm_backend *be, lm_tensor *y, const lm_tensor *x) {
    LM_ASSERT(lm_same_shape(y, x));
    lm_cuda *c = lm_cuda_of(be);
    const int64_t n = y->rows * y->cols;
    if (n == 0) return;
    lm_cuda_use(c);
    lm_cuda_launch_pdl(c, lm_add_kernel, lm_ew_grid(c, n), LM_EW_THREADS, 0, (float *)y->data, (const float *)x->data,
                       n);
    LM_CUDA_LAUNCHED("add");
}

void lm_cuda_scale(lm_backend *be, lm_tensor *y, float s) {
    LM_ASSERT(y->type == LM_F32);
    lm_cuda *c = lm_cuda_of(be);
    const int64_t n = y->rows * y->cols;
    if (n == 0) return;
    lm_cuda_use(c);
    lm_cuda_launch_pdl(c, lm_scale_kernel, lm_ew_grid(c, n), LM_EW_THREADS, 0, (float *)y->data, s, n);
    LM_CUDA_LAUNCHED("scale");
}

void lm_cuda_gelu_mul(lm_backend *be, lm_tensor *y, const lm_tensor *gate, const lm_tensor *up, bool tanh_approx) {
    LM_ASSERT(lm_same_shape(y, gate) && lm_same_shape(y, up));
    lm_cuda *c = lm_cuda_of(be);
    const int64_t n = y->rows * y->cols;
    if (n == 0) return;
    lm_cuda_use(c);
    lm_cuda_launch_pdl(c, lm_gelu_mul_kernel, lm_ew_grid(c, n), LM_EW_THREADS, 0, (float *)y->data,
                       (const float *)gate->data, (const float *)up->data, n, tanh_approx);
    LM_CUDA_LAUNCHED("gelu_mul");
}

void lm_cuda_softcap(lm_backend *be, lm_tensor *y, float cap) {
    LM_ASSERT(y->type == LM_F32 && cap > 0);
    lm_cuda *c = lm_cuda_of(be);
    const int64_t n = y->rows * y->cols;
    if (n == 0) return;
    lm_cuda_use(c);
    lm_cuda_launch_pdl(c, lm_softcap_kernel, lm_ew_grid(c, n), LM_EW_THREADS, 0, (float *)y->data, (double)cap, n);
    LM_CUDA_LAUNCHED("softcap");
}

void lm_cuda_sigmoid_mul(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *gate) {
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && gate->type == LM_F32);
    LM_ASSERT(y->rows == x->rows && y->cols == x->cols && gate->rows == x->rows);
    LM_ASSERT(gate->cols == 1 || gate->cols == x->cols);
    lm_cuda *c = lm_cuda_of(be);
    const int64_t n = x->rows * x->cols;
    if (n == 0) return;
    lm_cuda_use(c);
    lm_cuda_launch_pdl(c, lm_sigmoid_mul_kernel, lm_ew_grid(c, n), LM_EW_THREADS, 0, (float *)y->data,
                   (const float *)x->data, (const float *)gate->data, n, x->cols, gate->cols == 1);
    LM_CUDA_LAUNCHED("sigmoid_mul");
}

/* ---- rows and columns ----------------------------------------------------------------------- */

/* y[i][j] = table[ids[i]][j] widened to f32 (exact for bf16/f16/f32). */
template <lm_dtype TT>
__global__ void lm_get_rows_kernel(float *y, const void *table, const int32_t *ids, int64_t n_rows, int64_t cols) {
    LM_GRID_LOOP(i, n_rows * cols) {
        const int64_t r = i / cols, j = i % cols;
        const int64_t src = (int64_t)ids[r] * cols + j;
        float v;
        if constexpr (TT == LM_BF16) v = __uint_as_float((unsigned)((const unsigned short *)table)[src] << 16);
        else if constexpr (TT == LM_F16) v = __half2float(((const __half *)table)[src]);
        else v = ((const float *)table)[src];
        y[i] = v;
    }
}

/* get_rows with the ids already on the device (dids); y not empty, c in use. */
static void lm_get_rows_dev(lm_cuda *c, lm_tensor *y, const lm_tensor *table, const int32_t *dids) {
    LM_ASSERT(y->type == LM_F32 && y->cols == table->cols);
    LM_ASSERT(table->type == LM_F32 || table->type == LM_F16 || table->type == LM_BF16 || lm_cuda_qtype(table->type));
    const int64_t n = y->rows * y->cols;
    const unsigned g = lm_ew_grid(c, n);
    float *yp = (float *)y->data;
    if (lm_cuda_qtype(table->type)) { /* a quantised embedding table: rows widened to f32 */
        lm_cuda_dequant_f32(c, yp, table->data, table->type, y->cols, dids, 0, y->rows);
        return;
    }
    switch (table->type) {
    case LM_BF16:
        lm_cuda_launch(c, lm_get_rows_kernel<LM_BF16>, g, LM_EW_THREADS, 0, yp, table->data, dids, y->rows, y->cols);
        break;
    case LM_F16:
        lm_cuda_launch(c, lm_get_rows_kernel<LM_F16>, g, LM_EW_THREADS, 0, yp, table->data, dids, y->rows, y->cols);
        break;
    default:
        lm_cuda_launch(c, lm_get_rows_kernel<LM_F32>, g, LM_EW_THREADS, 0, yp, table->data, dids, y->rows, y->cols);
        break;
    }
    LM_CUDA_LAUNCHED("get_rows");
}

void lm_cuda_get_rows(lm_backend *be, lm_tensor *y, const lm_tensor *table, const int32_t *ids) {
    for (int64_t i = 0; i < y->rows; i++) LM_ASSERT(ids[i] >= 0 && ids[i] < table->rows);
    if (y->rows * y->cols == 0) return;
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    lm_get_rows_dev(c, y, table, (const int32_t *)lm_cuda_stage(c, ids, (size_t)y->rows * sizeof *ids));
}

void lm_cuda_gather_rows(lm_backend *be, lm_tensor *y, const lm_tensor *x, const int32_t *rows, int n) {
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && y->cols == x->cols && n >= 0 && n <= y->rows);
    LM_ASSERT(y->data != x->data || n == 0);
    for (int i = 0; i < n; i++) LM_ASSERT(rows[i] >= 0 && rows[i] < x->rows);
    const int64_t total = (int64_t)n * x->cols;
    if (total == 0) return;
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    const int32_t *drows = (const int32_t *)lm_cuda_stage(c, rows, (size_t)n * sizeof *rows);
    lm_cuda_launch(c, lm_get_rows_kernel<LM_F32>, lm_ew_grid(c, total), LM_EW_THREADS, 0, (float *)y->data, x->data,
                   drows, n, x->cols);
    LM_CUDA_LAUNCHED("gather_rows");
}

void lm_cuda_copy_cols(lm_backend *be, lm_tensor *y, const lm_tensor *x, int64_t col0) {
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && y->rows == x->rows);
    LM_ASSERT(col0 >= 0 && y->cols >= 0 && col0 + y->cols <= x->cols && y->data != x->data);
    if (y->rows == 0 || y->cols == 0) return;
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    LM_CUDA_CHECK(cudaMemcpy2DAsync(y->data, (size_t)y->cols * sizeof(float), (const float *)x->data + col0,
                                    (size_t)x->cols * sizeof(float), (size_t)y->cols * sizeof(float), (size_t)y->rows,
                                    cudaMemcpyDeviceToDevice, c->stream));
}

/* ---- argmax of rows ------------------------------------------------------------------- */

/* lm_argmax's answer for each row: the first index of the largest value,
 * NaN never winning, and 0 when x[0] is NaN or nothing beats x[0] (a row of
 * -inf). Two passes, so that a 128k-wide row is read by many blocks: pass 1,
 * grid (rows, parts), each block keeps the first strictly-largest element
 * of its slice; pass 2, a block per row merges the parts. The merge keeps
 * the larger value, the smaller index on ties (slices are in index order). */
#define LM_ARGMAX_THREADS 256
#define LM_ARGMAX_SLICE 4096 /* elements per block in pass 1 */

/* Block-wide best (value, index) of each thread's (bv, bi); the result in
 * thread 0. */
__device__ void lm_argmax_block(float bv, int32_t bi, float *out_v, int32_t *out_i) {
    __shared__ float sv[LM_ARGMAX_THREADS];
    __shared__ int32_t si[LM_ARGMAX_THREADS];
    sv[threadIdx.x] = bv, si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = sv[threadIdx.x + s];
            const int32_t oi = si[threadIdx.x + s];
            if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x]))
                sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *out_v = sv[0], *out_i = si[0];
}

__global__ void __launch_bounds__(LM_ARGMAX_THREADS)
    lm_argmax_part_kernel(float *pv, int32_t *pi, const float *x, int64_t cols) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const float *row = x + (int64_t)blockIdx.x * cols;
    const int64_t lo = (int64_t)blockIdx.y * LM_ARGMAX_SLICE, hi = LM_MIN(cols, lo + LM_ARGMAX_SLICE);
    float bv = -INFINITY;
    int32_t bi = INT32_MAX;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float v = row[i];
        if (v > bv) bv = v, bi = (int32_t)i;
    }
    const int64_t at = (int64_t)blockIdx.x * gridDim.y + blockIdx.y;
    lm_argmax_block(bv, bi, &pv[at], &pi[at]);
}

__global__ void __launch_bounds__(LM_ARGMAX_THREADS)
    lm_argmax_merge_kernel(int32_t *ids, const float *pv, const int32_t *pi, int parts, const float *x, int64_t cols) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t r = blockIdx.x;
    float bv = -INFINITY;
    int32_t bi = INT32_MAX;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) {
        const float v = pv[r * parts + i];
        const int32_t k = pi[r * parts + i];
        if (v > bv || (v == bv && k < bi)) bv = v, bi = k;
    }
    __shared__ float v0;
    __shared__ int32_t i0;
    lm_argmax_block(bv, bi, &v0, &i0);
    if (threadIdx.x == 0) {
        const float first = x[r * cols];
        ids[r] = (first != first || i0 == INT32_MAX) ? 0 : i0;
    }
}

/* The argmax kernels over x's rows; the ids go to c->ids_dev when they fit
 * (kept there for get_rows_argmax), else to scratch. Returns where. */
static int32_t *lm_argmax_launch(lm_cuda *c, const lm_tensor *x) {
    LM_ASSERT(x->type == LM_F32 && x->cols > 0 && x->cols <= INT32_MAX && x->rows <= 0x7fffffff);
    lm_cuda_use(c);
    const int parts = (int)((x->cols + LM_ARGMAX_SLICE - 1) / LM_ARGMAX_SLICE);
    LM_ASSERT(parts <= 0xffff);
    const size_t np = (size_t)x->rows * (size_t)parts;
    /* scratch: ids [rows] (when ids_dev is too small), values [rows][parts], indices [rows][parts] */
    unsigned char *sc = (unsigned char *)lm_cuda_scratch(c, 256 + np * 8 + (size_t)x->rows * 4);
    float *pv = (float *)(sc + 256);
    int32_t *pi = (int32_t *)(pv + np), *d = pi + np;
    c->ids_rows = -1;
    if (x->rows <= LM_CUDA_IDS) d = c->ids_dev, c->ids_rows = x->rows;
    lm_cuda_launch_pdl(c, lm_argmax_part_kernel, dim3((unsigned)x->rows, (unsigned)parts), LM_ARGMAX_THREADS, 0, pv, pi,
                       (const float *)x->data, x->cols);
    lm_cuda_launch_pdl(c, lm_argmax_merge_kernel, (unsigned)x->rows, LM_ARGMAX_THREADS, 0, d, (const float *)pv,
                       (const int32_t *)pi, parts, (const float *)x->data, x->cols);
    LM_CUDA_LAUNCHED("argmax_rows");
    return d;
}

void lm_cuda_argmax_rows(lm_backend *be, int32_t *host_ids, const lm_tensor *x) {
    if (x->rows == 0) return;
    lm_cuda *c = lm_cuda_of(be);
    const int32_t *d = lm_argmax_launch(c, x);
    if (c->gmode != LM_G_OFF) { /* the ids come back after the graph has run */
        lm_cuda_graph_defer_read(c, host_ids, d, (size_t)x->rows * sizeof(int32_t), -1);
        return;
    }
    LM_CUDA_CHECK(cudaMemcpyAsync(host_ids, d, (size_t)x->rows * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    LM_CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

void lm_cuda_later_commit(lm_cuda *c, int slot) {
    LM_ASSERT(c->later_n < LM_CUDA_LATER && slot == (c->later_head + c->later_n) % LM_CUDA_LATER);
    LM_CUDA_CHECK(cudaEventRecord(c->later[slot].ev, c->stream));
    c->later_n++;
}

/* The ids go to the ring's next pinned buffer (in a graph pass: after the
 * graph, committed at its launch; a pass that is run again eagerly fills
 * the same entry), and reach host_ids at argmax_wait. */
void lm_cuda_argmax_rows_later(lm_backend *be, int32_t *host_ids, const lm_tensor *x) {
    lm_cuda *c = lm_cuda_of(be);
    LM_ASSERT(c->later_n < LM_CUDA_LATER && x->rows > 0 && x->rows <= LM_CUDA_IDS);
    const int slot = (c->later_head + c->later_n) % LM_CUDA_LATER;
    lm_cuda_later *l = &c->later[slot];
    l->dst = host_ids, l->bytes = (size_t)x->rows * sizeof(int32_t);
    const int32_t *d = lm_argmax_launch(c, x);
    if (c->gmode != LM_G_OFF) {
        lm_cuda_graph_defer_read(c, l->pinned, d, l->bytes, slot);
        return;
    }
    LM_CUDA_CHECK(cudaMemcpyAsync(l->pinned, d, l->bytes, cudaMemcpyDeviceToHost, c->stream));
    lm_cuda_later_commit(c, slot);
}

void lm_cuda_argmax_wait(lm_backend *be) {
    lm_cuda *c = lm_cuda_of(be);
    LM_ASSERT(c->gmode == LM_G_OFF && c->later_n > 0);
    lm_cuda_use(c);
    lm_cuda_later *l = &c->later[c->later_head];
    LM_CUDA_CHECK(cudaEventSynchronize(l->ev));
    memcpy(l->dst, l->pinned, l->bytes);
    c->later_head = (c->later_head + 1) % LM_CUDA_LATER;
    c->later_n--;
}

/* ---- argmax under grammar masks ------------------------------------------------------ */

/* lm_argmax_masked's order as one 64-bit key an element, the largest
 * winning: the value's bits made order-preserving as an unsigned (-0 read
 * as 0) in the high word, NaN (1) below every number, an id the mask
 * refuses below that (no key: 0), and the id's complement in the low word,
 * so that the first id wins a tie. */
__device__ __forceinline__ uint64_t lm_mkey(float v, int32_t i) {
    uint32_t u = 1;
    if (v == v) {
        u = __float_as_uint(v == 0.0f ? 0.0f : v);
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    return ((uint64_t)u << 32) | (uint32_t)~(uint32_t)i;
}

/* The block's largest key, in thread 0. */
__device__ uint64_t lm_mkey_block_max(uint64_t k) {
    __shared__ uint64_t w[LM_ARGMAX_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t t = __shfl_xor_sync(0xffffffffu, k, o);
        k = t > k ? t : k;
    }
    if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = k;
    __syncthreads();
    k = threadIdx.x < blockDim.x / 32 ? w[threadIdx.x] : 0;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) {
            const uint64_t t = __shfl_xor_sync(0xffffffffu, k, o);
            k = t > k ? t : k;
        }
    return k;
}

/* Pass 1, grid (rows, parts): each block's largest key of its slice. A row
 * without its flag takes every id. */
__global__ void __launch_bounds__(LM_ARGMAX_THREADS)
    lm_argmax_masked_part_kernel(uint64_t *pk, const float *x, int64_t cols, const uint8_t *masked,
                                 const uint32_t *masks) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t r = blockIdx.x, words = (cols + 31) / 32;
    const float *row = x + r * cols;
    const uint32_t *m = masked[r] ? masks + r * words : NULL;
    const int64_t lo = (int64_t)blockIdx.y * LM_ARGMAX_SLICE, hi = LM_MIN(cols, lo + LM_ARGMAX_SLICE);
    uint64_t best = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        if (m && !((m[i >> 5] >> (i & 31)) & 1u)) continue;
        const uint64_t k = lm_mkey(row[i], (int32_t)i);
        best = k > best ? k : best;
    }
    best = lm_mkey_block_max(best);
    if (threadIdx.x == 0) pk[r * gridDim.y + blockIdx.y] = best;
}

/* Pass 2, a block a row: the row's id. Nothing allowed: 0; a row without
 * its flag keeps lm_argmax's one difference, 0 when x[0] is NaN. */
__global__ void __launch_bounds__(LM_ARGMAX_THREADS)
    lm_argmax_masked_merge_kernel(int32_t *ids, const uint64_t *pk, int parts, const float *x, int64_t cols,
                                  const uint8_t *masked) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t r = blockIdx.x;
    uint64_t best = 0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) best = pk[r * parts + i] > best ? pk[r * parts + i] : best;
    best = lm_mkey_block_max(best);
    if (threadIdx.x == 0) {
        const float first = x[r * cols];
        ids[r] = best == 0 || (!masked[r] && first != first) ? 0 : (int32_t)~(uint32_t)best;
    }
}

/* The flags and masks go through the ring entry's own pinned buffer (idle:
 * its last use was waited for before the entry came free), then the two
 * passes, the ids into ids_dev and on to the host as argmax_rows_later's. */
void lm_cuda_argmax_rows_masked_later(lm_backend *be, int32_t *host_ids, const lm_tensor *x, const uint32_t *masks,
                                      const uint8_t *masked) {
    lm_cuda *c = lm_cuda_of(be);
    LM_ASSERT(c->gmode == LM_G_OFF && c->later_n < LM_CUDA_LATER && x->type == LM_F32 && x->rows > 0 &&
              x->rows <= LM_CUDA_IDS && x->cols > 0 && x->cols <= INT32_MAX);
    lm_cuda_use(c);
    const int slot = (c->later_head + c->later_n) % LM_CUDA_LATER;
    lm_cuda_later *l = &c->later[slot];
    const size_t rows = (size_t)x->rows, words = (size_t)(x->cols + 31) / 32;
    const size_t fbytes = (rows + 15) & ~(size_t)15, mbytes = masks ? rows * words * 4 : 0, need = fbytes + mbytes;
    if (need > l->mask_cap) {
        if (l->mask_pinned) LM_CUDA_CHECK(cudaFreeHost(l->mask_pinned));
        l->mask_cap = LM_MAX(need, 2 * l->mask_cap);
        LM_CUDA_CHECK(cudaMallocHost((void **)&l->mask_pinned, l->mask_cap));
    }
    if (masked) memcpy(l->mask_pinned, masked, rows);
    else memset(l->mask_pinned, 0, rows);
    if (masks) memcpy(l->mask_pinned + fbytes, masks, mbytes);
    const int parts = (int)((x->cols + LM_ARGMAX_SLICE - 1) / LM_ARGMAX_SLICE);
    LM_ASSERT(parts <= 0xffff);
    const size_t np = rows * (size_t)parts;
    unsigned char *sc = (unsigned char *)lm_cuda_scratch(c, 256 + np * 8 + need);
    uint64_t *pk = (uint64_t *)(sc + 256);
    unsigned char *dm = (unsigned char *)(pk + np);
    LM_CUDA_CHECK(cudaMemcpyAsync(dm, l->mask_pinned, need, cudaMemcpyHostToDevice, c->stream));
    const uint8_t *dflags = dm;
    const uint32_t *dmasks = (const uint32_t *)(dm + fbytes);
    lm_cuda_launch_pdl(c, lm_argmax_masked_part_kernel, dim3((unsigned)rows, (unsigned)parts), LM_ARGMAX_THREADS, 0,
                       pk, (const float *)x->data, x->cols, dflags, dmasks);
    lm_cuda_launch_pdl(c, lm_argmax_masked_merge_kernel, (unsigned)rows, LM_ARGMAX_THREADS, 0, c->ids_dev,
                       (const uint64_t *)pk, parts, (const float *)x->data, x->cols, dflags);
    LM_CUDA_LAUNCHED("argmax_rows_masked");
    c->ids_rows = x->rows;
    l->dst = host_ids, l->bytes = rows * sizeof(int32_t);
    LM_CUDA_CHECK(cudaMemcpyAsync(l->pinned, c->ids_dev, l->bytes, cudaMemcpyDeviceToHost, c->stream));
    lm_cuda_later_commit(c, slot);
}

void lm_cuda_get_rows_argmax(lm_backend *be, lm_tensor *y, const lm_tensor *table) {
    lm_cuda *c = lm_cuda_of(be);
    LM_ASSERT(c->ids_rows == y->rows && y->cols > 0);
    lm_cuda_use(c);
    lm_get_rows_dev(c, y, table, c->ids_dev);
}
