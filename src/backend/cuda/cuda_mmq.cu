/* cuda_mmq.cu - y = x W^T for more than LM_GEMV_MAX_T tokens over GGUF
 * block-quantised W, multiplied straight from the blocks on int8 tensor
 * cores.
 *
 * Why: the other path (cuda_dequant.cu) widens W to bf16 on every call,
 * which reads the 4-bit weight and writes and reads it again at 16 bits: a
 * Llama-8B Q4_K_M decode step of 32 tokens moved ~7x the bytes the weights
 * hold (1,239 tok/s on the H200 against llama.cpp's 3,264). Here every
 * weight byte is read once per tile of up to 64 tokens.
 *
 * x is first rounded to int8 per 32 values (scale dx = amax / 127, as the
 * int8 GEMV rounds it) with each group's dx * sum(codes) for the types whose
 * blocks carry a min. A block of 4 warps takes 64 weight rows (a warp 16)
 * by 16, 32 or 64 tokens and walks I in units of 256 values: the unit's x codes
 * are staged in shared memory (cp.async, double-buffered); each warp reads
 * its rows' block bytes into registers (the next unit's while it
 * multiplies), forms the mma A fragments from the codes as stored (u8 for
 * types with a min, s8 otherwise) and, per scale group (32 values; Q6_K's
 * 16), multiplies them by 8 tokens in one mma (m16n8k32; k16 for Q6_K),
 * adding scale * dx * sum (- min * dx * sum(x codes)) in f32. The integer
 * sums are exact, so the rounding is x's alone, as in the int8 GEMV.
 *
 * Few output tiles (decode batches over 4,096-row matrices) split I over
 * up to LM_MMQ_SPLIT groups of blocks, whose partial sums a second kernel
 * adds in a fixed order: the result depends on the shape, never on timing. */
#include "cuda_mmq.h"

#include "cuda_mmq_types.h"

#define LM_MMQ_THREADS 128 /* 4 warps */
#define LM_MMQ_ROWS 64     /* weight rows a block: 16 a warp */
#define LM_MMQ_UNIT 256    /* values of I a step */
#define LM_MMQ_XB 272      /* shared bytes of a token's unit: 256 codes + 16, so 8 tokens fall on distinct banks */

/* ---- tensor-core products ------------------------------------------------------------- */

/* c = A (16 x 32, rows gid / gid + 8 in a0 / a1, k + 16 in a2 / a3) times B (32 x 8) */
template <bool U8>
static __device__ __forceinline__ void lm_mmq_k32(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                  unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (U8)
        asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%10,%10,%10,%10};"
                     : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
    else
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%10,%10,%10,%10};"
                     : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
    c[0] = c[1] = c[2] = c[3] = 0 * (int)(a0 + a1 + a2 + a3 + b0 + b1); /* lm_mmq_takes refuses before sm_80 */
#endif
}

/* c = A (16 x 16, s8) times B (16 x 8) */
static __device__ __forceinline__ void lm_mmq_k16(int (&c)[4], unsigned a0, unsigned a1, unsigned b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    c[0] = c[1] = c[2] = c[3] = 0 * (int)(a0 + a1 + b0);
#endif
}

static __device__ __forceinline__ void lm_mmq_cp16(void *s, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(s)), "l"(g)
                 : "memory");
}
static __device__ __forceinline__ void lm_mmq_cp8(void *s, const void *g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((unsigned)__cvta_generic_to_shared(s)), "l"(g)
                 : "memory");
}

typedef struct lm_mmq_args {
    const unsigned char *w; /* rows of ldw bytes */
    const unsigned char *xq; /* [T][I] int8 codes of x */
    const float2 *xs;       /* [T][I / 32]: dx, dx * sum of the group's codes */
    float *out;             /* y [T][O], or split partial sums [split][T][O] */
    const float *bias;      /* added by the kernel when split == 1 */
    int64_t T, O, I, ldw;
    int split;
} lm_mmq_args;

template <lm_dtype QT, int NT> __global__ void __launch_bounds__(LM_MMQ_THREADS) lm_mmq_kernel(lm_mmq_args p) {
    using M = lm_mq<QT>;
    constexpr int BN = 8 * NT, NG = LM_MMQ_UNIT / M::G, KF = M::G / 16;
    __shared__ __align__(16) unsigned char xq_s[2][BN * LM_MMQ_XB];
    __shared__ __align__(16) float2 xs_s[2][LM_MMQ_UNIT / 32][BN];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const int64_t row0 = (int64_t)blockIdx.x * LM_MMQ_ROWS + 16 * warp, t0 = (int64_t)blockIdx.y * BN;
    const int U = (int)(p.I / LM_MMQ_UNIT);
    const int ub = (int)((int64_t)blockIdx.z * U / p.split), ue = (int)((int64_t)(blockIdx.z + 1) * U / p.split);
    const unsigned char *wa = p.w + (size_t)LM_MIN(row0 + gid, p.O - 1) * (size_t)p.ldw;
    const unsigned char *wb = p.w + (size_t)LM_MIN(row0 + gid + 8, p.O - 1) * (size_t)p.ldw;
    const int64_t gx = p.I / 32;
    /* x of unit u into buffer buf: tokens past T repeat the last (their outputs are not stored) */
    auto stage = [&](int u, int buf) {
#pragma unroll
        for (int i = threadIdx.x; i < BN * 16; i += LM_MMQ_THREADS) {
            const int n = i >> 4, ch = i & 15;
            const int64_t t = LM_MIN(t0 + n, p.T - 1);
            lm_mmq_cp16(&xq_s[buf][n * LM_MMQ_XB + 16 * ch], p.xq + (size_t)t * (size_t)p.I + (size_t)u * LM_MMQ_UNIT + 16 * ch);
        }
#pragma unroll
        for (int i = threadIdx.x; i < BN * 8; i += LM_MMQ_THREADS) {
            const int g = i / BN, n = i % BN;
            const int64_t t = LM_MIN(t0 + n, p.T - 1);
            lm_mmq_cp8(&xs_s[buf][g][n], p.xs + (size_t)t * (size_t)gx + (size_t)u * 8 + g);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    typename M::raw ra, rb;
    if (ub < ue) {
        stage(ub, 0);
        M::load(ra, wa, ub, tig);
        M::load(rb, wb, ub, tig);
    }
    for (int u = ub; u < ue; u++) {
        const int buf = (u - ub) & 1;
        const bool more = u + 1 < ue;
        typename M::raw na, nb;
        if (more) { /* the next unit's x and weights in flight while this one multiplies */
            stage(u + 1, buf ^ 1);
            M::load(na, wa, u + 1, tig);
            M::load(nb, wb, u + 1, tig);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        const unsigned char *xb = xq_s[buf] + gid * LM_MMQ_XB + 4 * tig;
#pragma unroll
        for (int g = 0; g < NG; g++) {
            unsigned fa[KF], fb[KF];
            M::frag(ra, g, fa);
            M::frag(rb, g, fb);
            float sa, sb, ma, mb;
            M::sm(ra, g, sa, ma);
            M::sm(rb, g, sb, mb);
            const int xg = g * M::G / 32;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const unsigned char *xp = xb + nt * 8 * LM_MMQ_XB + g * M::G;
                int c[4];
                if constexpr (KF == 2)
                    lm_mmq_k32<M::MIN>(c, fa[0], fb[0], fa[1], fb[1], *(const unsigned *)xp, *(const unsigned *)(xp + 16));
                else lm_mmq_k16(c, fa[0], fb[0], *(const unsigned *)xp);
                const float4 d = *(const float4 *)&xs_s[buf][xg][nt * 8 + 2 * tig]; /* tokens 2 tig, 2 tig + 1 */
                acc[nt][0] = fmaf(sa * d.x, lm_q_i2f(c[0]), acc[nt][0]);
                acc[nt][1] = fmaf(sa * d.z, lm_q_i2f(c[1]), acc[nt][1]);
                acc[nt][2] = fmaf(sb * d.x, lm_q_i2f(c[2]), acc[nt][2]);
                acc[nt][3] = fmaf(sb * d.z, lm_q_i2f(c[3]), acc[nt][3]);
                if constexpr (M::MIN) {
                    acc[nt][0] = fmaf(-ma, d.y, acc[nt][0]), acc[nt][1] = fmaf(-ma, d.w, acc[nt][1]);
                    acc[nt][2] = fmaf(-mb, d.y, acc[nt][2]), acc[nt][3] = fmaf(-mb, d.w, acc[nt][3]);
                }
            }
        }
        __syncthreads(); /* this buffer is staged again two units on */
        if (more) ra = na, rb = nb;
    }
    float *out = p.out + (size_t)blockIdx.z * (size_t)(p.T * p.O);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t t = t0 + nt * 8 + 2 * tig + (e & 1), r = row0 + gid + 8 * (e >> 1);
            if (t < p.T && r < p.O) out[t * p.O + r] = p.bias ? acc[nt][e] + p.bias[r] : acc[nt][e];
        }
}

/* x [n4 quads] -> int8 codes (a word a quad) and per 32 values {dx, dx *
 * sum of codes}; 8 lanes a group, every lane of a warp present for the
 * shuffles (lanes past the end carry zeros and store nothing). */
__global__ void lm_mmq_quant_x_kernel(const float4 *x, int64_t n4, int *xq, float2 *xs) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = i < n4;
    const float4 v = live ? x[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float inv = amax > 0.0f ? __fdividef(127.0f, amax) : 0.0f;
    const int q = lm_q_pack_s8(v.x, v.y, v.z, v.w, inv);
    int s = __dp4a(q, 0x01010101, 0);
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (!live) return;
    xq[i] = q;
    if ((i & 7) == 0) {
        const float dx = amax * (1.0f / 127.0f);
        xs[i >> 3] = make_float2(dx, dx * (float)s);
    }
}

/* y = bias + the split partial sums, in split order */
__global__ void lm_mmq_sum_kernel(float *y, const float *part, const float *bias, int64_t n, int64_t O, int split) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = part[i];
        for (int s = 1; s < split; s++) v += part[(size_t)s * (size_t)n + (size_t)i];
        y[i] = bias ? v + bias[i % O] : v;
    }
}

/* ---- host ----------------------------------------------------------------------------- */

#define LM_MMQ_SPLIT 8 /* most groups of blocks I is split over (LUMEN_CUDA_MMQ_SPLIT for timing) */
/* most tokens the int8 GEMM takes; more go to the widened bf16 product,
 * which wins there: Llama-8B Q4_K_M on the H200, int8 / widened tok/s at
 * 128 tokens a forward 5,603 / 4,782 (decode) and 4,461 / 3,904 (prefill
 * chunks), at 256 6,296 / 8,663 and 5,250 / 6,500 (LUMEN_CUDA_MMQ_MAX_T
 * for timing) */
#define LM_MMQ_MAX_T 128

typedef struct {
    bool on;
    int64_t max_t;
    int split, per_sm, nt; /* per_sm: blocks an SM the split aims at; nt: 8-token tiles a block, 0: by T */
} lm_mmq_conf;

static const lm_mmq_conf &lm_mmq_conf_get(void) {
    static const lm_mmq_conf k = [] {
        lm_mmq_conf v;
        v.on = lm_cuda_env_flag("LUMEN_CUDA_MMQ", true);
        const char *t = getenv("LUMEN_CUDA_MMQ_MAX_T"), *s = getenv("LUMEN_CUDA_MMQ_SPLIT");
        v.max_t = t && atoll(t) > 0 ? atoll(t) : LM_MMQ_MAX_T;
        v.split = s && atoi(s) > 0 ? LM_MIN(atoi(s), 16) : LM_MMQ_SPLIT;
        const char *b = getenv("LUMEN_CUDA_MMQ_PER_SM"), *n = getenv("LUMEN_CUDA_MMQ_NT"); /* timing only */
        v.per_sm = b && atoi(b) > 0 ? atoi(b) : 8;
        v.nt = n && (atoi(n) == 2 || atoi(n) == 4 || atoi(n) == 8) ? atoi(n) : 0;
        return v;
    }();
    return k;
}

bool lm_mmq_takes(const lm_cuda *c, int64_t T, const float *x, const void *w, lm_dtype wt, int64_t I) {
    const lm_mmq_conf &k = lm_mmq_conf_get();
    const bool typed = wt == LM_Q8_0 || wt == LM_Q4_0 || wt == LM_Q4_1 || wt == LM_Q5_0 || wt == LM_Q5_1 ||
                       wt == LM_IQ4_NL || wt == LM_Q4_K || wt == LM_Q5_K || wt == LM_Q6_K || wt == LM_IQ4_XS;
    return typed && k.on && !c->quant_exact && c->gemv_tc_ok && T <= k.max_t && T <= (int64_t)65535 * 8 &&
           I > 0 && I % LM_MMQ_UNIT == 0 && lm_aligned16(x) && lm_qweight_ok(w, wt);
}

static size_t lm_mmq_al256(size_t v) { return (v + 255) & ~(size_t)255; }

template <lm_dtype QT> static void lm_mmq_go(lm_cuda *c, dim3 grid, int NT, const lm_mmq_args &a) {
    if (NT == 2) lm_cuda_launch(c, lm_mmq_kernel<QT, 2>, grid, LM_MMQ_THREADS, 0, a);
    else if (NT == 4) lm_cuda_launch(c, lm_mmq_kernel<QT, 4>, grid, LM_MMQ_THREADS, 0, a);
    else lm_cuda_launch(c, lm_mmq_kernel<QT, 8>, grid, LM_MMQ_THREADS, 0, a);
}

void lm_mmq(lm_cuda *c, int64_t T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias, int64_t O,
            int64_t I) {
    LM_ASSERT(lm_mmq_takes(c, T, x, w, wt, I) && O > 0 && T > 0);
    if (lm_cuda_skip(c, LM_SKIP_GEMM)) return; /* timing only, as the other products */
    const lm_mmq_conf &k = lm_mmq_conf_get();
    const int NT = k.nt ? k.nt : T <= 16 ? 2 : T <= 32 ? 4 : 8;
    const int64_t mt = (O + LM_MMQ_ROWS - 1) / LM_MMQ_ROWS, nt = (T + 8 * NT - 1) / (8 * NT), U = I / LM_MMQ_UNIT;
    /* split I while the output tiles leave SMs idle (~8 blocks an SM; 8 against 4: batch 32 of a
     * Llama-8B Q4_K_M 3,678 against 3,451 tok/s on the H200), each part at least 4 units */
    const int64_t want = k.per_sm * (int64_t)c->n_sms;
    int split = 1;
    if (mt * nt < want) split = (int)LM_MAX((int64_t)1, LM_MIN((int64_t)k.split, LM_MIN((want + mt * nt - 1) / (mt * nt), U / 4)));
    const size_t qb = lm_mmq_al256((size_t)(T * I)), sb = lm_mmq_al256((size_t)(T * (I / 32)) * sizeof(float2));
    const size_t pb = split > 1 ? (size_t)split * (size_t)(T * O) * sizeof(float) : 0;
    unsigned char *ws = (unsigned char *)lm_cuda_dequant_ws(c, qb + sb + pb);
    lm_mmq_args a;
    memset(&a, 0, sizeof a); /* a graph pass hashes the bytes, padding too */
    a.w = (const unsigned char *)w, a.xq = ws, a.xs = (const float2 *)(ws + qb);
    a.out = split > 1 ? (float *)(ws + qb + sb) : y, a.bias = split > 1 ? NULL : bias;
    a.T = T, a.O = O, a.I = I, a.ldw = (int64_t)lm_dtype_row_bytes(wt, I), a.split = split;
    const int64_t n4 = T * I / 4;
    lm_cuda_launch(c, lm_mmq_quant_x_kernel, (unsigned)((n4 + 255) / 256), 256, 0, (const float4 *)x, n4, (int *)ws,
                   (float2 *)(ws + qb));
    LM_CUDA_LAUNCHED("mmq quant x");
    const dim3 grid((unsigned)mt, (unsigned)nt, (unsigned)split);
    switch (wt) {
    case LM_Q8_0: lm_mmq_go<LM_Q8_0>(c, grid, NT, a); break;
    case LM_Q4_0: lm_mmq_go<LM_Q4_0>(c, grid, NT, a); break;
    case LM_Q4_1: lm_mmq_go<LM_Q4_1>(c, grid, NT, a); break;
    case LM_Q5_0: lm_mmq_go<LM_Q5_0>(c, grid, NT, a); break;
    case LM_Q5_1: lm_mmq_go<LM_Q5_1>(c, grid, NT, a); break;
    case LM_IQ4_NL: lm_mmq_go<LM_IQ4_NL>(c, grid, NT, a); break;
    case LM_Q4_K: lm_mmq_go<LM_Q4_K>(c, grid, NT, a); break;
    case LM_Q5_K: lm_mmq_go<LM_Q5_K>(c, grid, NT, a); break;
    case LM_Q6_K: lm_mmq_go<LM_Q6_K>(c, grid, NT, a); break;
    case LM_IQ4_XS: lm_mmq_go<LM_IQ4_XS>(c, grid, NT, a); break;
    default: LM_ASSERT(!"mmq: weight type");
    }
    LM_CUDA_LAUNCHED("mmq");
    if (split > 1) {
        lm_cuda_launch(c, lm_mmq_sum_kernel, lm_grid_1d(c, T * O, 256), 256, 0, y, (const float *)a.out, bias, T * O, O,
                       split);
        LM_CUDA_LAUNCHED("mmq sum");
    }
}
