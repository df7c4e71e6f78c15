/* cuda_attention_decode_tc.cu - decode attention (a few query tokens a
 * sequence) on bf16 tensor cores, over bf16, q8 and q4 (q4r) caches.
 *
 * Why: the CUDA-core decode kernel (cuda_attention.cu) spends ~140-180
 * instructions a (key, kv head) pair on its dot products, reductions and
 * shuffles, whatever the format: on the H200 at a 32k context (Llama-3.1-8B
 * shape) it read a layer's bf16 cache at 2.1 TB/s and the q8 one at 0.9,
 * so the narrower formats were slower than bf16 (issue #29). Here a pair
 * costs ~3 mma and a few instructions (ncu: 12.7M instructions a layer
 * against 37.4M in bf16, 19.8M against 43.7M in q8), and the cache streams
 * through shared memory ahead of the math. Measured there: a layer at 32k
 * 54.0 us in bf16 (62.6 before), 61.8 in q8 (79.4), 53.5 in q4r (76.8).
 * Still far from the bytes' 31 / 17 / 9 us: a warp's tile is a chain of
 * dependent steps (ldmatrix, mma, the softmax's shuffles, movmatrix, mma)
 * and more stages in flight did not help; q8 and q4r stay a little slower
 * than bf16.
 *
 * Roofline, Llama-3.1-8B shape, one token at a 32k context: a layer reads
 * 32,768 x 8 heads x 2 (K, V) x 128 values: 134 MB in bf16 (31 us at the
 * 4.3 TB/s copy rate), 71 MB in q8, 38 MB in q4; the products are 2 x 32k x
 * 32 heads x 128 MACs (exact: x3), far from any compute limit.
 *
 * Work: a block per (token, kv head, split of the keys), 4 warps; a warp
 * takes tiles of 16 keys (tiles w, w + 4, ... of the split) with a ring of
 * two stages in its own shared memory, filled by cp.async while it works on
 * the other (no block barrier until the end). The products put keys on the
 * mma's M side and the group's query heads (up to 8) on N:
 *   S^T [16 keys x 8 heads] = K [16 x Dh] Q^T, K by ldmatrix, Q^T's
 *   fragments from shared memory; O^T [Dh x 8] += V^T P^T, V^T by
 *   ldmatrix.trans, P^T from the score accumulators through movmatrix.
 * Exact as the other kernels: q and the softmax weights in three bf16 terms
 * each (att_bf_pack3), f32 accumulation, expf. Quantised rows: their codes
 * are converted to bf16 (exact: small integers) into a tile the same
 * ldmatrix reads; K's scales (per 32 values) multiply each 32-wide group's
 * partial scores, V's multiply the weights P before they are split (the
 * scale varies along the keys, the mma's reduction side).
 * The warps merge in shared memory at the end and splits leave partials,
 * merged by the last split of a head group, as in the CUDA-core kernel
 * (att_decode_finish). */
#include "cuda_attention.h"
#include "cuda_attention_combine.h"

#define ATT_DT_MAX_WARPS 8
#define ATT_DT_KEYS 16 /* keys a warp's tile: the mma's M */
#define ATT_DT_TERMS 3 /* q and P in three bf16 terms */

/* One head's slice of a cache row in format KT (LM_KV_BF16, _Q8 or _Q4) and
 * where a warp keeps it. */
template <int DH, int KT> struct att_dt_fmt {
    static constexpr bool QUANT = KT != LM_KV_BF16;
    static constexpr int CODE_BYTES = KT == LM_KV_BF16 ? 2 * DH : KT == LM_KV_Q8 ? DH : DH / 2;
    static constexpr int SCALE_BYTES = QUANT ? DH / 16 : 0; /* f16 a 32 values */
    /* a stage: K codes [16][CODE_BYTES], V codes, K scales [16][SCALE_BYTES],
     * V scales; bf16 rows are the tile ldmatrix reads (att_dt_at) */
    static constexpr int STAGE = 2 * ATT_DT_KEYS * (CODE_BYTES + SCALE_BYTES);
    static constexpr int TILE = QUANT ? ATT_DT_KEYS * DH * 2 : 0; /* K's codes as bf16, then V's */
    /* warps a block: the quantised formats' extra instructions want more
     * warps an SM to hide their chains (16 against 12 at Dh = 128) */
    static constexpr int WARPS = QUANT ? 8 : 4;
    static constexpr int Q_BYTES = ATT_DT_TERMS * (DH / 16) * 32 * 8; /* Q^T fragments, uint2 a lane */
    static constexpr int MERGE_BYTES = WARPS * 8 * DH * 4;            /* the warps' O^T, f32 */
    /* a warp's area with nst stages, and the block's shared memory */
    static constexpr __host__ __device__ int warp_bytes(int nst) { return nst * STAGE + TILE; }
    static constexpr __host__ __device__ int smem(int nst) {
        return Q_BYTES + (WARPS * warp_bytes(nst) > MERGE_BYTES ? WARPS * warp_bytes(nst) : MERGE_BYTES);
    }
    static_assert(STAGE % 16 == 0 && CODE_BYTES % 16 == 0, "16-byte copies");
};

/* Where value 8 k of row r of a bf16 tile lies, k a multiple of 8: the
 * 16-byte pieces of a row swizzled by its low three bits, so that the 8 rows
 * an ldmatrix phase reads fall on distinct banks without padding (which
 * would cost a block an SM at Dh = 128). */
template <int DH> __device__ __forceinline__ int att_dt_at(int r, int k) { return r * DH + (((k >> 3) ^ (r & 7)) << 3); }

/* bytes (4, 8 or 16) global -> shared by cp.async.ca, zeros when !ok */
template <int BYTES> __device__ __forceinline__ void att_dt_cp(void *dst, const void *src, const void *base, bool ok) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(s), "l"(ok ? src : base), "n"(BYTES),
                 "r"(ok ? BYTES : 0)
                 : "memory");
}

/* 16 bytes of codes to bf16 values k, k + 1, ... of row r of a tile (q8: 16
 * values, q4: 32; k a multiple of 16) */
template <int KT, int DH>
__device__ __forceinline__ void att_dt_widen16(__nv_bfloat16 *tile, int r, int k, uint4 v) {
    const unsigned w[4] = { v.x, v.y, v.z, v.w };
    if constexpr (KT == LM_KV_Q8) {
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o[2 * i] = lm_bf16x2_bits((float)(signed char)(w[i]), (float)(signed char)(w[i] >> 8));
            o[2 * i + 1] = lm_bf16x2_bits((float)(signed char)(w[i] >> 16), (float)(signed char)(w[i] >> 24));
        }
        *(uint4 *)(tile + att_dt_at<DH>(r, k)) = make_uint4(o[0], o[1], o[2], o[3]);
        *(uint4 *)(tile + att_dt_at<DH>(r, k + 8)) = make_uint4(o[4], o[5], o[6], o[7]);
    } else { /* byte k: value 2k in the low nibble, 2k + 1 in the high one, stored + 8 */
        uint32_t o[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const unsigned b = w[i / 4] >> (8 * (i % 4));
            o[i] = lm_bf16x2_bits((float)((int)(b & 15u) - 8), (float)((int)((b >> 4) & 15u) - 8));
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            *(uint4 *)(tile + att_dt_at<DH>(r, k + 8 * i)) = make_uint4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
    }
}

template <int DH, int KT>
__global__ void __launch_bounds__(att_dt_fmt<DH, KT>::WARPS * 32, att_dt_fmt<DH, KT>::QUANT ? 2 : 1)
    att_dt_kernel(att_args a) {
    using F = att_dt_fmt<DH, KT>;
    constexpr int W = F::WARPS;
    constexpr int KS = DH / 16, NG = DH / 32, CPR = F::CODE_BYTES / 16, NCH = ATT_DT_KEYS * CPR;
    static_assert(NCH % 32 == 0, "whole rounds of a warp's copies");
    extern __shared__ uint4 att_dt_smem4[];
    unsigned char *smem = (unsigned char *)att_dt_smem4;
    uint2 *sq = (uint2 *)smem; /* [term][ks][lane]: b0, b1 of Q^T */
    __shared__ float s_m[ATT_DT_MAX_WARPS][8], s_l[ATT_DT_MAX_WARPS][8];
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int t = blockIdx.x, hg = blockIdx.y, z = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int h0 = hg * a.gsz, G = a.gsz;
    const int32_t p = a.d.pos[t];
    const int32_t *table = a.d.tab + a.d.tab_off[a.d.seq[t]];
    const int lo = a.window > 0 ? max(0, p - a.window + 1) : 0, range = p - lo + 1;
    /* splits of whole tiles; tiles on multiples of 16 keys, so that a
     * tile's rows lie in one pool block (block sizes are multiples of 16:
     * lm_att_decode_tc_blocks), masked outside [k_lo, k_hi] */
    const int chunk = ((range + a.n_splits - 1) / a.n_splits + ATT_DT_KEYS - 1) / ATT_DT_KEYS * ATT_DT_KEYS;
    const int k_lo = lo + z * chunk, k_hi = min(p, k_lo + chunk - 1), kb = k_lo & ~(ATT_DT_KEYS - 1);
    const int nt = k_hi >= k_lo ? (k_hi - kb + ATT_DT_KEYS) / ATT_DT_KEYS : 0;

    /* Q^T's B fragments: lane (g, c) of k-step ks holds q[head g][16 ks + 2c, + 1]
     * and [16 ks + 2c + 8, + 9]; heads past the group are zeros */
    for (int e = tid; e < KS * 32; e += W * 32) {
        const int ks = e >> 5, hh = (e & 31) >> 2, cc = e & 3;
        float v[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        if (hh < G) {
            const float *qh = a.q + (int64_t)t * a.q_ld + (int64_t)(h0 + hh) * DH + 16 * ks + 2 * cc;
            v[0] = qh[0], v[1] = qh[1], v[2] = qh[8], v[3] = qh[9];
        }
        uint32_t b0[3], b1[3];
        att_bf_pack3(b0, v[0], v[1]);
        att_bf_pack3(b1, v[2], v[3]);
#pragma unroll
        for (int i = 0; i < ATT_DT_TERMS; i++) sq[(i * KS + ks) * 32 + (e & 31)] = make_uint2(b0[i], b1[i]);
    }

    const int nst = a.stages;
    unsigned char *wb = smem + F::Q_BYTES + warp * F::warp_bytes(nst);
    const unsigned char *kl = (const unsigned char *)a.kl, *vl = (const unsigned char *)a.vl;
    const int64_t hoff = (int64_t)hg * F::CODE_BYTES, soff = (int64_t)hg * F::SCALE_BYTES;
    /* the pool row of tile i's first key, read an iteration before its
     * copies so that the table read waits on no one */
    auto row_of = [&](int i) -> int64_t {
        const int j = kb + ATT_DT_KEYS * i;
        return i < nt ? (int64_t)table[j / a.bs] * a.bs + j % a.bs : 0;
    };
    /* tile i's K and V rows (row0 on) into stage st, one commit group
     * (empty past the last tile); a lane copies piece cc of rows r, r + 32 / CPR, ... */
    auto issue = [&](int i, int st, int64_t row0) {
        if (i < nt) {
            unsigned char *sb = wb + st * F::STAGE;
            const int j0 = kb + ATT_DT_KEYS * i, cc = lane % CPR;
            const unsigned char *ks = kl + row0 * a.k_rb + hoff + cc * 16, *vs = vl + row0 * a.v_rb + hoff + cc * 16;
#pragma unroll
            for (int e = lane; e < NCH; e += 32) {
                const int r = e / CPR;
                const bool ok = j0 + r >= k_lo && j0 + r <= k_hi;
                const int dk = F::QUANT ? r * F::CODE_BYTES + cc * 16 : 2 * att_dt_at<DH>(r, 8 * cc);
                const int dv = F::QUANT ? (ATT_DT_KEYS + r) * F::CODE_BYTES + cc * 16 : 2 * att_dt_at<DH>(ATT_DT_KEYS + r, 8 * cc);
                att_cp16(sb + dk, ks + r * a.k_rb, kl, ok);
                att_cp16(sb + dv, vs + r * a.v_rb, vl, ok);
            }
            if constexpr (F::QUANT) { /* lanes 0-15 K's scales, 16-31 V's, of key lane & 15 */
                const bool isv = lane >= 16;
                const int r = lane & 15;
                const bool ok = j0 + r >= k_lo && j0 + r <= k_hi;
                const unsigned char *src = (isv ? vl + (row0 + r) * a.v_rb + a.v_cb : kl + (row0 + r) * a.k_rb + a.k_cb) + soff;
                att_dt_cp<F::SCALE_BYTES>(sb + 2 * ATT_DT_KEYS * F::CODE_BYTES + lane * F::SCALE_BYTES, src,
                                          isv ? vl : kl, ok);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    /* the warp's n-th tile (i = warp + 4n) goes to stage n % nst; tiles
     * n + 1 .. n + nst - 1 are in flight while it works on tile n */
    for (int n = 0; n < nst - 1; n++) issue(warp + W * n, n, row_of(warp + W * n));
    int64_t next_row = row_of(warp + W * (nst - 1));
    __syncthreads(); /* Q^T written */

    float o[KS][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
#pragma unroll
    for (int mt = 0; mt < KS; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    const float sc = a.scale;
    for (int i = warp, n = 0; i < nt; i += W, n++) {
        const int st = n % nst;
        issue(i + W * (nst - 1), (n + nst - 1) % nst, next_row); /* into the stage tile n - 1 left */
        next_row = row_of(i + W * nst);
        if (nst == 2) asm volatile("cp.async.wait_group 1;" ::: "memory"); /* tile n has arrived */
        else if (nst == 3) asm volatile("cp.async.wait_group 2;" ::: "memory");
        else asm volatile("cp.async.wait_group 3;" ::: "memory");
        __syncwarp();
        const unsigned char *sb = wb + st * F::STAGE;
        const int j0 = kb + ATT_DT_KEYS * i;
        /* quantised: K's codes (stage rows 0-15), later V's (16-31), to the bf16 tile */
        __nv_bfloat16 *tile = (__nv_bfloat16 *)(wb + nst * F::STAGE);
        auto widen = [&](int r0) {
#pragma unroll
            for (int e = lane; e < NCH; e += 32) {
                const int r = e / CPR, cc = e % CPR;
                att_dt_widen16<KT, DH>(tile, r, cc * (KT == LM_KV_Q8 ? 16 : 32),
                                       *(const uint4 *)(sb + (r0 + r) * F::CODE_BYTES + cc * 16));
            }
            __syncwarp();
        };
        const __nv_bfloat16 *tK = F::QUANT ? tile : (const __nv_bfloat16 *)sb;
        const __nv_bfloat16 *tV = F::QUANT ? tile : tK + ATT_DT_KEYS * DH; /* bf16: rows 16-31 (att_dt_at) */
        if constexpr (F::QUANT) widen(0);
        const unsigned short *ks16 = (const unsigned short *)(sb + 2 * ATT_DT_KEYS * F::CODE_BYTES);
        const unsigned short *vs16 = ks16 + ATT_DT_KEYS * (F::SCALE_BYTES / 2);

        /* S^T = K Q^T: rows keys g, g + 8; columns heads 2c, 2c + 1; bf16:
         * a 32-value group's products in sg, added after (two chains of
         * mma, not one of KS * 3) */
        float s[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
        for (int gr = 0; gr < NG; gr++) {
            float sg[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
            for (int k2 = 0; k2 < 2; k2++) {
                const int ks = 2 * gr + k2;
                uint32_t kf[4];
                att_bf_ldsm4(kf, tK + att_dt_at<DH>(lane & 15, 16 * ks + (lane >> 4) * 8));
#pragma unroll
                for (int term = ATT_DT_TERMS - 1; term >= 0; term--) { /* smallest first */
                    const uint2 b = sq[(term * KS + ks) * 32 + lane];
                    att_bf_mma(sg, kf, b.x, b.y);
                }
            }
            if constexpr (F::QUANT) {
                const float d0 = __half2float(__ushort_as_half(ks16[g * NG + gr]));
                const float d1 = __half2float(__ushort_as_half(ks16[(g + 8) * NG + gr]));
                s[0] = fmaf(d0, sg[0], s[0]), s[1] = fmaf(d0, sg[1], s[1]);
                s[2] = fmaf(d1, sg[2], s[2]), s[3] = fmaf(d1, sg[3], s[3]);
            } else {
                s[0] += sg[0], s[1] += sg[1], s[2] += sg[2], s[3] += sg[3];
            }
        }
        /* online softmax per head (column); a column's 8 row lanes (same c) agree on m */
        float pr[4], mx[2] = { -INFINITY, -INFINITY };
        const bool edge = j0 < k_lo || j0 + ATT_DT_KEYS - 1 > k_hi; /* warp-uniform */
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float x = a.softcap > 0.0f ? a.softcap * tanhf(s[e] * sc / a.softcap) : s[e] * sc;
            const int j = j0 + g + 8 * (e >> 1);
            if (edge) x = j >= k_lo && j <= k_hi ? x : -INFINITY;
            pr[e] = x;
            mx[e & 1] = fmaxf(mx[e & 1], x);
        }
        float al[2], mb[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(ATT_FULL, mx[h], off));
            const float mn = fmaxf(m[h], mx[h]);
            al[h] = mn != -INFINITY ? expf(m[h] - mn) : 1.0f;
            mb[h] = mn != -INFINITY ? mn : 0.0f;
            m[h] = mn;
        }
#pragma unroll
        for (int e = 0; e < 4; e++) pr[e] = expf(pr[e] - mb[e & 1]);
#pragma unroll
        for (int h = 0; h < 2; h++) l[h] = l[h] * al[h] + (pr[h] + pr[h + 2]);
        if (__any_sync(ATT_FULL, al[0] != 1.0f || al[1] != 1.0f)) /* once the maxima settle, rarely */
#pragma unroll
            for (int mt = 0; mt < KS; mt++) o[mt][0] *= al[0], o[mt][1] *= al[1], o[mt][2] *= al[0], o[mt][3] *= al[1];

        if constexpr (F::QUANT) { /* every lane has read K's tile */
            __syncwarp();
            widen(ATT_DT_KEYS);
        }
        /* O^T += V^T P^T: P^T's B fragments by transposing the accumulator's
         * two 8 x 8 halves (keys 0-7, 8-15); quantised V: a group's scales
         * on P first */
        auto pv = [&](int mt0, int mt1, float p0, float p1, float p2, float p3) {
            uint32_t t0[3], t1[3], b0[3], b1[3];
            att_bf_pack3(t0, p0, p1);
            att_bf_pack3(t1, p2, p3);
#pragma unroll
            for (int i2 = 0; i2 < ATT_DT_TERMS; i2++) b0[i2] = att_bf_trans(t0[i2]), b1[i2] = att_bf_trans(t1[i2]);
#pragma unroll
            for (int mt = mt0; mt < mt1; mt++) {
                uint32_t vf[4];
                att_bf_ldsm4t(vf, tV + att_dt_at<DH>((lane & 7) + ((lane >> 4) & 1) * 8, 16 * mt + ((lane >> 3) & 1) * 8));
#pragma unroll
                for (int term = ATT_DT_TERMS - 1; term >= 0; term--) att_bf_mma(o[mt], vf, b0[term], b1[term]);
            }
        };
        if constexpr (F::QUANT) {
#pragma unroll
            for (int gr = 0; gr < NG; gr++) {
                const float d0 = __half2float(__ushort_as_half(vs16[g * NG + gr]));
                const float d1 = __half2float(__ushort_as_half(vs16[(g + 8) * NG + gr]));
                pv(2 * gr, 2 * gr + 2, pr[0] * d0, pr[1] * d0, pr[2] * d1, pr[3] * d1);
            }
        } else {
            pv(0, KS, pr[0], pr[1], pr[2], pr[3]);
        }
        __syncwarp(); /* every lane is done with stage st: the next trip refills it */
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");

    /* merge the warps: a head's l over its 8 row lanes, then through shared memory */
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) l[h] += __shfl_xor_sync(ATT_FULL, l[h], off);
    __syncthreads(); /* the stages are free: O^T goes over them */
    float *s_o = (float *)(smem + F::Q_BYTES); /* [warp][head][DH] */
    if (g == 0)
#pragma unroll
        for (int h = 0; h < 2; h++) s_m[warp][2 * c + h] = m[h], s_l[warp][2 * c + h] = l[h];
#pragma unroll
    for (int mt = 0; mt < KS; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s_o[(warp * 8 + 2 * c + (e & 1)) * DH + 16 * mt + g + 8 * (e >> 1)] = o[mt][e];
    __syncthreads();
    att_decode_finish(a, t, z, h0, G, DH, W, &s_m[0][0], &s_l[0][0], 8, s_o, 8 * DH);
}

/* stages a warp keeps: LUMEN_CUDA_ATT_DEC_STAGES (2-4), else 2. On the H200
 * (8B shape, Q4_K_M weights, decode at 32k / 131k) 3 were no faster and 4
 * slower (bf16 0.82x / 0.68x: one block an SM): the kernel waits on its
 * tiles' arithmetic chain, not on memory */
static int att_dt_stages(const lm_cuda *c) {
    return c->att_dec_stages >= 2 && c->att_dec_stages <= 4 ? c->att_dec_stages : 2;
}

template <int DH, int KT> static int att_dt_blocks(int nst) {
    static int n[5]; /* per instantiation and stage count: blocks an SM at its shared memory */
    if (!n[nst]) {
        const int smem = att_dt_fmt<DH, KT>::smem(nst);
        if (smem > 48 * 1024)
            LM_CUDA_CHECK(cudaFuncSetAttribute(att_dt_kernel<DH, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        LM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n[nst], att_dt_kernel<DH, KT>,
                                                                    att_dt_fmt<DH, KT>::WARPS * 32, smem));
        n[nst] = LM_MAX(n[nst], 1);
    }
    return n[nst];
}

template <int DH> static int att_dt_blocks_fmt(int kt, int nst) {
    return kt == LM_KV_BF16 ? att_dt_blocks<DH, LM_KV_BF16>(nst)
           : kt == LM_KV_Q8 ? att_dt_blocks<DH, LM_KV_Q8>(nst)
                            : att_dt_blocks<DH, LM_KV_Q4>(nst);
}

int lm_att_decode_tc_blocks(const lm_cuda *c, const lm_kv_pool *kv, int layer, int Dh, int gsz) {
    const int kt = kv->k_type == LM_KV_Q4R ? LM_KV_Q4 : kv->k_type, vt = kv->v_type == LM_KV_Q4R ? LM_KV_Q4 : kv->v_type;
    if (!c->att_tc || !c->att_dec_tc || kt != vt || (kt != LM_KV_BF16 && kt != LM_KV_Q8 && kt != LM_KV_Q4)) return 0;
    if (gsz > 8 || (Dh != 64 && Dh != 128 && Dh != 256) || kv->block_size % ATT_DT_KEYS != 0) return 0;
    /* 16-byte copies of rows and heads; the scales' copies on their size */
    const int64_t w = lm_kv_layer_width(kv, layer);
    const size_t rb = lm_kv_row_bytes(kv->k_type, w), cb = lm_kv_codes_bytes(kv->k_type, w);
    if (((uintptr_t)kv->k[layer] | (uintptr_t)kv->v[layer]) % 16 != 0 || rb % 16 != 0) return 0;
    if (kt != LM_KV_BF16 && cb % 16 != 0) return 0;
    const int nst = att_dt_stages(c);
    if (Dh == 64) return att_dt_blocks_fmt<64>(kt, nst);
    return Dh == 128 ? att_dt_blocks_fmt<128>(kt, nst) : att_dt_blocks_fmt<256>(kt, nst);
}

template <int DH, int KT> static void att_dt_launch(lm_cuda *c, dim3 grid, const att_args *a) {
    att_dt_blocks<DH, KT>(a->stages); /* the shared-memory opt-in */
    lm_cuda_launch_pdl(c, att_dt_kernel<DH, KT>, grid, att_dt_fmt<DH, KT>::WARPS * 32,
                       (size_t)att_dt_fmt<DH, KT>::smem(a->stages), *a);
    LM_CUDA_LAUNCHED("att_dt_kernel");
}

template <int DH> static void att_dt_launch_fmt(lm_cuda *c, int kt, dim3 grid, const att_args *a) {
    if (kt == LM_KV_BF16) att_dt_launch<DH, LM_KV_BF16>(c, grid, a);
    else if (kt == LM_KV_Q8) att_dt_launch<DH, LM_KV_Q8>(c, grid, a);
    else att_dt_launch<DH, LM_KV_Q4>(c, grid, a);
}

void lm_att_decode_tc_launch(lm_cuda *c, dim3 grid, att_args *a) {
    const int kt = a->kt == LM_KV_Q4R ? LM_KV_Q4 : a->kt;
    a->n_sub = 1, a->stages = att_dt_stages(c);
    if (c->fused && a->n_splits > 1 && (int64_t)grid.x * grid.y <= LM_CUDA_COUNTERS - 1) a->cnt = c->counters + 1;
    if (a->Dh == 64) att_dt_launch_fmt<64>(c, kt, grid, a);
    else if (a->Dh == 128) att_dt_launch_fmt<128>(c, kt, grid, a);
    else att_dt_launch_fmt<256>(c, kt, grid, a);
}
