/* cuda_attention_tc.cu - the tiled (prefill, chunk, mixed batch) attention
 * of cuda_attention.cu on TF32 tensor cores: f32 caches and heads wider than
 * 128 (a bf16 cache's narrower heads take cuda_attention_bf16.cu).
 *
 * Same work items, masking, online softmax and split partials as the
 * CUDA-core att_kernel: a block per (tile of 64 query rows, kv head and head
 * subgroup, split), a row being a (token, query head) pair that reads the
 * block's kv head. 4 warps, each owning MT m16 tiles of rows (the mma
 * shapes): two for heads up to 128 wide (128 rows a block), one above. Per tile of BK keys: S = Q K^T (16 x BK a warp), masked,
 * scaled and soft-capped as att_kernel does, the running max m, denominator
 * l and accumulator rescaled, then O += P V.
 *
 * Both products are mma.sync m16n8k8 on TF32 operands with f32 accumulation.
 * A bf16 cache (B16) is widened as its rows come in; a bf16 value is TF32
 * exactly, so K and V then go to the tensor cores unsplit (two products).
 * TF32 keeps 10 of f32's 23 mantissa bits, so each operand x is split as
 * big = tf32(x), small = x - big (to ~2^-22 of x as the tensor cores read
 * it) and a product taken as small*big + big*small + big*big (small*small,
 * ~2^-22 relative, dropped): three mma where one would do, the price of
 * agreeing with the CPU backend and the decode kernel to ~1e-6 as the f32
 * kernel does.
 *
 * Fragments (PTX ISA, m16n8k8 .tf32; g = lane / 4, t = lane % 4):
 *   A 16x8: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
 *   B 8x8:  b0 (k t, n g), b1 (k t+4, n g)
 *   C 16x8: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
 * P V takes the scores' C fragments as its A operand without moving them:
 * the sum over keys does not care in which order the 8 keys of a k-step
 * pair up, so A's column t is read as key 2t and column t+4 as key 2t+1
 * (a0 = c0, a1 = c2, a2 = c1, a3 = c3) and B's rows likewise (b0 = V[2t],
 * b1 = V[2t+1]).
 *
 * Shared memory: Q [64 MT][SP], K and V [BK][SP] f32 with SP = DP + 4, which
 * puts the 32 lanes of every fragment load on 32 different banks
 * (4g + t for Q and K, 8t + g for V). Keys come in with cp.async (16 bytes,
 * zero-filled past the range or the head width), so the loads of a tile are
 * all in flight at once without passing through registers. DP = 128, MT =
 * 2, BK = 32: 101 KB (and 254 registers, 8 bytes spilled), two blocks a
 * multiprocessor; DP = 256, MT = 1, BK = 32: 133 KB, one.
 *
 * Measured on the H200 (Llama-8B shape, 4k prefill, bf16 GEMM): 15.7k tok/s
 * with one m16 tile a warp, 16.9k with two, 17.6k with the small term
 * unrounded, 9.8k on CUDA cores. ncu on one layer's attention (two tiles,
 * small term rounded): 38 % of issue slots busy at 8 warps a
 * multiprocessor (registers and shared memory both limit it to two
 * blocks), the ALU pipe (the TF32 conversions) the busiest at 32 %. */
#include "cuda_attention.h"

#include <math.h>

#define ATT_TC_WARPS 4
#define ATT_TC_THREADS (ATT_TC_WARPS * 32)


/* x as a TF32 pair: big = tf32(x), small = x - big (exact in f32). small
 * goes to the tensor cores as it is: they read the top 19 bits of an f32
 * operand (truncating small costs ~2^-11 of it, ~2^-22 of x), which saves
 * a second conversion on the kernel's busiest pipe. */
__device__ __forceinline__ void att_tc_split(float x, uint32_t &big, uint32_t &small) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
    small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ void att_tc_mma(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* d += A B in three TF32 products. */
__device__ __forceinline__ void att_tc_mma3(float *d, const uint32_t *ab, const uint32_t *as, const uint32_t *bb,
                                            const uint32_t *bs) {
    att_tc_mma(d, as, bb);
    att_tc_mma(d, ab, bs);
    att_tc_mma(d, ab, bb);
}

/* A B operand (K, V): split as above, or when it was a bf16 (B16) taken
 * whole: 8 significant bits fit TF32's 11, its small part is zero. */
template <bool B16> __device__ __forceinline__ void att_tc_operand(float x, uint32_t &big, uint32_t &small) {
    if (B16) big = __float_as_uint(x), small = 0;
    else att_tc_split(x, big, small);
}

/* d += A B, B's small part skipped when it is zero (B16): the sum is the
 * three-product one's bit for bit, as its middle product adds zeros. */
template <bool B16>
__device__ __forceinline__ void att_tc_mma_b(float *d, const uint32_t *ab, const uint32_t *as, const uint32_t *bb,
                                             const uint32_t *bs) {
    if (B16) {
        att_tc_mma(d, as, bb);
        att_tc_mma(d, ab, bb);
    } else {
        att_tc_mma3(d, ab, as, bb, bs);
    }
}

/* DP: head width padded (a multiple of 32, zeros past Dh); BK keys a tile;
 * MT m16 tiles of rows a warp (ROWS = 64 MT rows a block): with two, each
 * K and V fragment loaded and split serves two mma, not one.
 * grid (tiles, Hkv * n_sub, n_splits). */
template <int DP, int BK, int MT, bool B16>
__global__ void __launch_bounds__(ATT_TC_THREADS) att_tc_kernel(att_args a) {
    constexpr int SP = DP + 4, NT = BK / 8, ND = DP / 8, ROWS = ATT_TC_WARPS * 16 * MT;
    extern __shared__ float4 att_tc_smem4[];
    float *sQ = (float *)att_tc_smem4; /* [ROWS][SP] */
    float *sK = sQ + ROWS * SP;        /* [BK][SP] */
    float *sV = sK + BK * SP;          /* [BK][SP] */
    __shared__ int r_tok[ROWS], r_head[ROWS], r_pos[ROWS], r_lo[ROWS];

    const int32_t *tr = a.tiles + 4 * (int64_t)blockIdx.x;
    const int4 tile = make_int4(tr[0], tr[1], tr[2], tr[3]);
    const int hg = blockIdx.y / a.n_sub, sub = blockIdx.y % a.n_sub;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int32_t *table = a.d.tab + a.d.tab_off[a.d.seq[a.tok[tile.x]]];

    for (int r = tid; r < ROWS; r += ATT_TC_THREADS)
        att_tile_row(a, tile, hg, sub, r, &r_tok[r], &r_head[r], &r_pos[r], &r_lo[r]);
    __syncthreads();
    for (int i = tid; i < ROWS * (DP / 4); i += ATT_TC_THREADS) {
        const int r = i / (DP / 4), c4 = 4 * (i % (DP / 4));
        const bool ok = r_tok[r] >= 0 && c4 < a.Dh;
        att_cp16(sQ + r * SP + c4, a.q + (int64_t)r_tok[r] * a.q_ld + (int64_t)r_head[r] * a.Dh + c4, a.q, ok);
    }

    int k_lo, k_hi;
    att_tile_split(a, tile, &k_lo, &k_hi);

    /* rows of this lane: tile mt's g and g + 8 (C fragment halves 0 and 1) */
    int row[MT][2], pos[MT][2], lo[MT][2];
    float m[MT][2], l[MT][2], o[MT][ND][4];
    bool any = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            row[mt][hf] = warp * 16 * MT + mt * 16 + g + 8 * hf;
            pos[mt][hf] = r_pos[row[mt][hf]], lo[mt][hf] = r_lo[row[mt][hf]];
            m[mt][hf] = -INFINITY, l[mt][hf] = 0.0f;
            any |= pos[mt][hf] >= 0;
        }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < ND; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    const bool active = __any_sync(ATT_FULL, any);
    const int64_t goff = (int64_t)hg * a.Dh;

    for (int j0 = k_lo; j0 <= k_hi; j0 += BK) {
        __syncthreads(); /* the previous tile consumed */
        for (int i = tid; i < BK * (DP / 4); i += ATT_TC_THREADS) {
            const int jj = i / (DP / 4), c4 = 4 * (i % (DP / 4)), j = j0 + jj;
            const bool ok = j <= k_hi && c4 < a.Dh;
            const int64_t kr = ok ? (int64_t)table[j / a.bs] * a.bs + j % a.bs : 0;
            if (B16) { /* widened on the way: 8 bytes a row piece, zeros past the range */
                att_kv_raw<LM_KV_BF16, 4> rk, rv;
                float4 kx = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vx = kx;
                if (ok) {
                    rk.load(0, a.kl, a.k_rb, 0, kr, goff + c4), rv.load(0, a.vl, a.v_rb, 0, kr, goff + c4);
                    float y[4];
                    rk.widen(y), kx = make_float4(y[0], y[1], y[2], y[3]);
                    rv.widen(y), vx = make_float4(y[0], y[1], y[2], y[3]);
                }
                *(float4 *)(sK + jj * SP + c4) = kx, *(float4 *)(sV + jj * SP + c4) = vx;
                continue;
            }
            const int64_t off = kr * a.kv_ld + goff + c4;
            att_cp16(sK + jj * SP + c4, a.kl + off, a.kl, ok);
            att_cp16(sV + jj * SP + c4, a.vl + off, a.vl, ok);
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();
        if (!active) continue; /* warp-uniform */

        /* S = Q K^T: NT n-tiles of 8 keys */
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < NT; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll 2
        for (int kk = 0; kk < DP; kk += 8) {
            uint32_t qb[MT][4], qs[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const float *q0 = sQ + row[mt][0] * SP + kk + t, *q1 = sQ + row[mt][1] * SP + kk + t;
                att_tc_split(q0[0], qb[mt][0], qs[mt][0]);
                att_tc_split(q1[0], qb[mt][1], qs[mt][1]);
                att_tc_split(q0[4], qb[mt][2], qs[mt][2]);
                att_tc_split(q1[4], qb[mt][3], qs[mt][3]);
            }
#pragma unroll
            for (int n = 0; n < NT; n++) {
                uint32_t kb[2], ks[2];
                att_tc_operand<B16>(sK[(n * 8 + g) * SP + kk + t], kb[0], ks[0]);
                att_tc_operand<B16>(sK[(n * 8 + g) * SP + kk + t + 4], kb[1], ks[1]);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) att_tc_mma_b<B16>(s[mt][n], qb[mt], qs[mt], kb, ks);
            }
        }

        /* online softmax per row; a row's 4 lanes (same g) hold its BK
         * scores between them */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = j0 + n * 8 + 2 * t + (e & 1), hf = e >> 1;
                    float x = s[mt][n][e] * a.scale;
                    if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
                    const bool ok = j <= k_hi && pos[mt][hf] >= 0 && j <= pos[mt][hf] && j >= lo[mt][hf];
                    x = ok ? x : -INFINITY;
                    s[mt][n][e] = x;
                    mx[hf] = fmaxf(mx[hf], x);
                }
            float al[2], ps[2] = { 0.0f, 0.0f };
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float mn = fmaxf(m[mt][hf], att_max4(mx[hf]));
                al[hf] = mn != -INFINITY ? expf(m[mt][hf] - mn) : 1.0f; /* 0 when m was -inf */
                m[mt][hf] = mn;
            }
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float x = s[mt][n][e];
                    const float p = x != -INFINITY ? expf(x - m[mt][e >> 1]) : 0.0f;
                    s[mt][n][e] = p;
                    ps[e >> 1] += p;
                }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) l[mt][hf] = l[mt][hf] * al[hf] + att_sum4(ps[hf]);
#pragma unroll
            for (int n = 0; n < ND; n++)
                o[mt][n][0] *= al[0], o[mt][n][1] *= al[0], o[mt][n][2] *= al[1], o[mt][n][3] *= al[1];
        }

        /* O += P V: k-step n covers keys n*8 .. n*8+7 */
#pragma unroll
        for (int n = 0; n < NT; n++) {
            uint32_t pb[MT][4], pq[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                att_tc_split(s[mt][n][0], pb[mt][0], pq[mt][0]);
                att_tc_split(s[mt][n][2], pb[mt][1], pq[mt][1]);
                att_tc_split(s[mt][n][1], pb[mt][2], pq[mt][2]);
                att_tc_split(s[mt][n][3], pb[mt][3], pq[mt][3]);
            }
            const float *v0 = sV + (n * 8 + 2 * t) * SP + g, *v1 = v0 + SP;
#pragma unroll
            for (int d = 0; d < ND; d++) {
                uint32_t vb[2], vs[2];
                att_tc_operand<B16>(v0[d * 8], vb[0], vs[0]);
                att_tc_operand<B16>(v1[d * 8], vb[1], vs[1]);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) att_tc_mma_b<B16>(o[mt][d], pb[mt], pq[mt], vb, vs);
            }
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory"); /* an empty split still loaded Q */

    /* out (one split) or the split's partials; columns d*8 + 2t, +1 */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = row[mt][hf], tk = r_tok[r], h = r_head[r];
            if (tk < 0) continue;
            float *dst;
            float f = 1.0f;
            if (a.n_splits == 1) {
                dst = a.out + (int64_t)tk * a.out_ld + (int64_t)h * a.Dh;
                f = 1.0f / l[mt][hf];
            } else {
                const int64_t idx = ((int64_t)tk * a.H + h) * a.n_splits + blockIdx.z;
                if (t == 0) a.pm[idx] = m[mt][hf], a.pl[idx] = l[mt][hf];
                dst = a.pacc + idx * a.Dh;
            }
#pragma unroll
            for (int d = 0; d < ND; d++) {
                const int col = d * 8 + 2 * t;
                if (col < a.Dh) dst[col] = o[mt][d][2 * hf] * f;
                if (col + 1 < a.Dh) dst[col + 1] = o[mt][d][2 * hf + 1] * f;
            }
        }
}

template <int DP, int BK, int MT, bool B16>
static void att_tc_launch(lm_cuda *c, dim3 grid, const att_args *a) {
    const size_t smem = (size_t)(ATT_TC_WARPS * 16 * MT + 2 * BK) * (DP + 4) * sizeof(float);
    static bool opted; /* per instantiation; the limit is a property of the kernel */
    if (!opted)
        LM_CUDA_CHECK(cudaFuncSetAttribute(att_tc_kernel<DP, BK, MT, B16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem));
    opted = true;
    lm_cuda_launch(c, att_tc_kernel<DP, BK, MT, B16>, grid, ATT_TC_THREADS, smem, *a);
    LM_CUDA_LAUNCHED("att_tc_kernel");
}

int lm_att_tc_rows(const lm_cuda *c, int Dh, int64_t q_ld, int64_t kv_ld, const void *q, const void *kl,
                   const void *vl) {
    /* cp.async moves 16 bytes: rows of q and of the pool, and the head's
     * columns, must start on 16-byte boundaries */
    const bool aligned = Dh % 4 == 0 && q_ld % 4 == 0 && kv_ld % 4 == 0 &&
                         ((uintptr_t)q | (uintptr_t)kl | (uintptr_t)vl) % 16 == 0;
    if (!c->att_tc || !aligned || Dh > 256) return 0;
    return Dh <= 128 ? 128 : 64; /* two m16 tiles a warp stay in registers up to 128 wide */
}

void lm_att_tc_launch(lm_cuda *c, dim3 grid, const att_args *a) {
    /* the row counts lm_att_tc_rows promised: 128 up to 128 wide, else 64 */
    const bool b16 = a->kt == LM_KV_BF16; /* lm_att_tc_rows: then V too */
    if (a->Dh <= 64) b16 ? att_tc_launch<64, 64, 2, true>(c, grid, a) : att_tc_launch<64, 64, 2, false>(c, grid, a);
    else if (a->Dh <= 128)
        b16 ? att_tc_launch<128, 32, 2, true>(c, grid, a) : att_tc_launch<128, 32, 2, false>(c, grid, a);
    else b16 ? att_tc_launch<256, 32, 1, true>(c, grid, a) : att_tc_launch<256, 32, 1, false>(c, grid, a);
}
