/* cuda_kv_format.cu - the KV cache's non-f32 formats on the GPU
 * (lm_kv_type.h): the kv_write that encodes rows, and the rotation of
 * LM_KV_Q4R applied to queries and undone on attention outputs. The
 * attention kernels read the encoded rows themselves (att_kv_at,
 * att_kv_span in cuda_attention.h).
 *
 * Encoding is kv_type.c's, operation for operation, so the rows equal the
 * CPU's bit for bit: a block takes a span of a row (128 values, or one
 * rotation width when that is wider), a thread a value; the rotation
 * (each rot-wide piece of the span) multiplies by the signs, then runs the
 * Walsh-Hadamard butterflies
 * (a + b, a - b) in shared memory and scales by 1/sqrt(n); a warp is one
 * scale group: its max |x| by shuffles, d = f16(max / Q), code = rint(x /
 * d) clamped to [-Q, Q]. */
#include "cuda_attention.h"

#define KVF_SPAN 128 /* values a block encodes, at least */

/* The rotation of x, this thread's value i of a block's values in s[]
 * (pieces of n, n dividing the block): returns R x (or R^T x) at i. Every
 * thread of the block takes part. */
__device__ float kvf_rotate(float x, float *s, int i, int n, bool inverse) {
    if (!inverse) x *= lm_kv_rot_sign(i % n);
    s[i] = x;
    __syncthreads();
    for (int h = 1; h < n; h *= 2) {
        float a = 0.0f, b = 0.0f;
        const int j = (i / (2 * h)) * 2 * h + i % h; /* the pair (j, j + h) this thread's value belongs to */
        a = s[j], b = s[j + h];
        __syncthreads();
        s[i] = (i == j) ? a + b : a - b;
        __syncthreads();
    }
    x = s[i] * (1.0f / sqrtf((float)n));
    __syncthreads();
    if (inverse) x *= lm_kv_rot_sign(i % n);
    return x;
}

typedef struct kvf_args {
    const float *x[2]; /* K, V: [T][cols] */
    unsigned char *l[2];
    int t[2];
    int64_t rb[2], cb[2], x_ld, cols;
    int bs, rot;
    att_dev d;
} kvf_args;

/* grid (T, spans, 2: K then V), block = a span of blockDim.x values. */
__global__ void kvf_write_kernel(kvf_args a) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    __shared__ float s[LM_KV_MAX_ROT];
    const int tok = blockIdx.x, z = blockIdx.z, i = threadIdx.x, lane = i & 31;
    const int t = a.t[z];
    const int64_t c = (int64_t)blockIdx.y * blockDim.x + i;
    const int32_t p = a.d.pos[tok], sq = a.d.seq[tok];
    const int64_t row = (int64_t)a.d.tab[a.d.tab_off[sq] + p / a.bs] * a.bs + p % a.bs;
    unsigned char *r = a.l[z] + row * a.rb[z];
    float x = c < a.cols ? a.x[z][(int64_t)tok * a.x_ld + c] : 0.0f;
    if (t == LM_KV_Q4R) x = kvf_rotate(x, s, i, a.rot, false); /* whole pieces: cols % rot == 0 */
    if (c >= a.cols) return; /* no block barrier below; warps stay whole (cols % 32 == 0 when quantised) */
    if (t == LM_KV_F32 || t == LM_KV_BF16) {
        att_kv_put(r, t == LM_KV_BF16, c, x);
        return;
    }
    /* quantised: cols is a multiple of 32, so the warp is one whole group */
    const float q = t == LM_KV_Q8 ? 127.0f : 7.0f;
    float amax = fabsf(x);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(ATT_FULL, amax, o));
    const __half dh = __float2half_rn(amax / q);
    const float d = __half2float(dh);
    const float code = fmaxf(-q, fminf(q, d > 0.0f ? rintf(x / d) : 0.0f));
    if (lane == 0) ((unsigned short *)(r + a.cb[z]))[c / 32] = __half_as_ushort(dh);
    if (t == LM_KV_Q8) {
        ((signed char *)r)[c] = (signed char)(int)code;
        return;
    }
    const int hi = __shfl_down_sync(ATT_FULL, (int)code, 1);
    if ((lane & 1) == 0) r[c / 2] = (unsigned char)(((int)code + 8) | ((hi + 8) << 4));
}

void lm_cuda_kv_write_fmt(lm_cuda *c, lm_kv_pool *kv, int layer, const lm_tensor *k, const lm_tensor *v, att_dev d) {
    const int64_t cols = k->cols;
    if (lm_kv_quantised(kv->k_type) || lm_kv_quantised(kv->v_type)) LM_ASSERT(cols % LM_KV_GROUP == 0);
    const bool rot = kv->k_type == LM_KV_Q4R || kv->v_type == LM_KV_Q4R;
    if (rot) LM_ASSERT(kv->rot >= 2 && kv->rot <= LM_KV_MAX_ROT && (kv->rot & (kv->rot - 1)) == 0 && cols % kv->rot == 0);
    kvf_args a;
    memset(&a, 0, sizeof a); /* padding too: a graph pass hashes the bytes */
    a.x[0] = (const float *)k->data, a.x[1] = (const float *)v->data;
    a.l[0] = (unsigned char *)kv->k[layer], a.l[1] = (unsigned char *)kv->v[layer];
    a.t[0] = kv->k_type, a.t[1] = kv->v_type;
    const int64_t w = lm_kv_layer_width(kv, layer);
    a.rb[0] = (int64_t)lm_kv_row_bytes(kv->k_type, w);
    a.rb[1] = (int64_t)lm_kv_row_bytes(kv->v_type, w);
    a.cb[0] = (int64_t)lm_kv_codes_bytes(kv->k_type, w);
    a.cb[1] = (int64_t)lm_kv_codes_bytes(kv->v_type, w);
    a.x_ld = cols, a.cols = cols, a.bs = kv->block_size, a.rot = rot ? kv->rot : 1;
    a.d = d;
    /* spans of whole rotation pieces */
    const int span = LM_MAX(a.rot, KVF_SPAN);
    const unsigned spans = (unsigned)((cols + span - 1) / span);
    lm_cuda_launch_pdl(c, kvf_write_kernel, dim3((unsigned)k->rows, spans, 2), span, 0, a);
    LM_CUDA_LAUNCHED("kvf_write_kernel");
}

/* grid (T, cols / rot), block rot threads. */
__global__ void kvf_rotate_kernel(float *y, int64_t y_ld, const float *x, int64_t x_ld, int rot, bool inverse) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    __shared__ float s[LM_KV_MAX_ROT];
    const int64_t t = blockIdx.x, c = (int64_t)blockIdx.y * rot + threadIdx.x;
    const float v = kvf_rotate(x[t * x_ld + c], s, threadIdx.x, rot, inverse);
    y[t * y_ld + c] = v;
}

void lm_cuda_kv_rotate(lm_cuda *c, float *y, int64_t y_ld, const float *x, int64_t x_ld, int T, int64_t cols, int rot,
                       bool inverse) {
    LM_ASSERT(rot >= 2 && rot <= LM_KV_MAX_ROT && (rot & (rot - 1)) == 0 && cols % rot == 0);
    if (T == 0) return;
    lm_cuda_launch_pdl(c, kvf_rotate_kernel, dim3((unsigned)T, (unsigned)(cols / rot)), rot, 0, y, y_ld, x, x_ld, rot,
                       inverse);
    LM_CUDA_LAUNCHED("kvf_rotate_kernel");
}
