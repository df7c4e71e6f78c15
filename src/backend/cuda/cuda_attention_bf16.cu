/* cuda_attention_bf16.cu - the tiled attention (prefill, chunks, mixed
 * batches) of cuda_attention.cu over a bf16 KV cache on bf16 tensor cores
 * (mma m16n8k16, f32 accumulation). K and V are bf16 as stored, so only the
 * queries and the softmax weights need care:
 *  - bf16 activations (lm_cuda_backend_bf16_act): both rounded to bf16, one
 *    mma a product;
 *  - exact (the default): both split into three bf16 terms, x = hi + mid +
 *    lo to ~2^-24 of x (finer than f32 rounding), three mma a product whose
 *    sum is that of f32 operands to f32 accumulation; the softmax in natural
 *    units with expf, as the CPU. Results as the TF32 kernel
 *    (cuda_attention_tc.cu), which takes two TF32 mma of half the depth at
 *    half the rate a product and stays for f32 caches and wider heads.
 *
 * Same work items, masking, online softmax and split partials as the
 * other tiled kernels: a block per (tile of 64 query rows, kv head and head
 * subgroup, split), a row being a (token, query head) pair. 4 warps of 16
 * rows; keys in tiles of BK = 64, double-buffered: the next tile's K and V
 * rows stream into shared memory (cp.async, 16 bytes, zeros past the range
 * or the head width) while the warps work on this one. Each warp keeps its
 * Q fragments in registers; K fragments come by ldmatrix, V's by
 * ldmatrix.trans; P = 2^(S log2(e) - m) goes from the score accumulators
 * straight into the A operand of P V (rows g and g + 8 of two 8-key n-tiles
 * are the 16 keys of one k-step), rounded to bf16; l sums them in f32. Key
 * tiles inside every row's causal range and window skip the mask. The
 * keys' pool rows are looked up a tile ahead into shared memory.
 *
 * Roofline, Llama-3.1-8B shape, 4,096-token prefill: 32 layers x 32 heads x
 * 4096^2 / 2 causal pairs x 128 x 4 flops = 4.4 TFLOP, ~6 ms at the H200's
 * ~750 dense bf16 TFLOP/s; the exact TF32 kernel ran at ~60-120 TFLOP/s.
 *
 * Shared memory (bf16, rows padded by 16 bytes so that the 8 rows an
 * ldmatrix phase reads fall on distinct banks): Q [64][DP + 8], K and V
 * [2][64][DP + 8]: 87 KB at DP = 128 (two blocks a multiprocessor), 46 KB at
 * 64. Heads wider than 128 take the exact kernel. */
#include "cuda_attention.h"

#include <cuda_bf16.h>

#define ATT_BF_WARPS 4
#define ATT_BF_THREADS (ATT_BF_WARPS * 32)
#define ATT_BF_ROWS (ATT_BF_WARPS * 16)
#define ATT_BF_BK 64

/* 2^x by the MUFU unit (ex2.approx: ~2 ulp; 2^-inf = 0) */
__device__ __forceinline__ float att_bf_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* x as term `term` of its three-term bf16 split (hi, mid, lo), or (term
 * -1) rounded to bf16 */
__device__ __forceinline__ float att_bf_term(float x, int term) {
    if (term < 0) return x;
    float r = x;
    for (int i = 0; i < term; i++) r -= __bfloat162float(__float2bfloat16_rn(r)); /* exact in f32 */
    return r;
}

/* DP: head width padded to 64 or 128 (zeros past Dh); EXACT: three-term
 * operands. grid (tiles, Hkv * n_sub, n_splits). */
template <int DP, bool EXACT>
__global__ void __launch_bounds__(ATT_BF_THREADS, 2) att_bf_kernel(att_args a) {
    constexpr int SP = DP + 8, BK = ATT_BF_BK, NT = BK / 8, ND = DP / 8, KS = DP / 16, ROWS = ATT_BF_ROWS;
    extern __shared__ uint4 att_bf_smem4[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)att_bf_smem4; /* [ROWS][SP]: q (EXACT: its terms, one after another) */
    __nv_bfloat16 *sK = sQ + ROWS * SP;                /* [2][BK][SP] */
    __nv_bfloat16 *sV = sK + 2 * BK * SP;              /* [2][BK][SP] */
    __shared__ int r_tok[ROWS], r_head[ROWS], r_pos[ROWS], r_lo[ROWS];

    /* the last tiles first: a sequence's tiles come in position order, so
     * the longest key ranges start early instead of trailing the grid */
    const int32_t *tr = a.tiles + 4 * (int64_t)(gridDim.x - 1 - blockIdx.x);
    const int4 tile = make_int4(tr[0], tr[1], tr[2], tr[3]);
    const int hg = blockIdx.y / a.n_sub, sub = blockIdx.y % a.n_sub;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int32_t *table = a.d.tab + a.d.tab_off[a.d.seq[a.tok[tile.x]]];
    const int64_t goff = (int64_t)hg * a.Dh;
    int k_lo, k_hi;
    att_tile_split(a, tile, &k_lo, &k_hi);

    /* the pool rows of tile j0's keys into s_row[st] (-1 past the range):
     * one division and table read a key, done a tile ahead of the loads */
    __shared__ int s_row[2][BK];
    auto rows_of = [&](int st, int j0) {
        if (tid < BK) {
            const int j = j0 + tid;
            s_row[st][tid] = j <= k_hi ? table[j / a.bs] * a.bs + j % a.bs : -1;
        }
    };
    /* K and V rows of the tile s_row[st] names into stage st, one commit
     * group; a thread takes column c8 of rows tid / (DP / 8) + 8 i */
    constexpr int CPR = DP / 8, RPI = ATT_BF_THREADS / CPR; /* chunks a row, rows an iteration */
    const int c8 = 8 * (tid % CPR), rr = tid / CPR;
    const bool col_ok = c8 < a.Dh;
    const unsigned char *kbase = (const unsigned char *)a.kl + (goff + c8) * 2,
                        *vbase = (const unsigned char *)a.vl + (goff + c8) * 2;
    auto load_kv = [&](int st) {
        __nv_bfloat16 *dk = sK + st * BK * SP + c8, *dv = sV + st * BK * SP + c8;
#pragma unroll
        for (int jj = rr; jj < BK; jj += RPI) {
            const int kr = s_row[st][jj];
            const bool ok = kr >= 0 && col_ok;
            att_cp16(dk + jj * SP, kbase + (int64_t)kr * a.k_rb, a.kl, ok);
            att_cp16(dv + jj * SP, vbase + (int64_t)kr * a.v_rb, a.vl, ok);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    rows_of(0, k_lo);
    rows_of(1, k_lo + BK);

    for (int r = tid; r < ROWS; r += ATT_BF_THREADS)
        att_tile_row(a, tile, hg, sub, r, &r_tok[r], &r_head[r], &r_pos[r], &r_lo[r]);
    __syncthreads();
    /* Q's term `term` (att_bf_term) into sQ, zeros past the rows and the head width */
    auto put_q = [&](int term) {
        for (int i = tid; i < ROWS * (DP / 8); i += ATT_BF_THREADS) {
            const int r = i / (DP / 8), qc = 8 * (i % (DP / 8));
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (r_tok[r] >= 0 && qc < a.Dh) {
                const float *src = a.q + (int64_t)r_tok[r] * a.q_ld + (int64_t)r_head[r] * a.Dh + qc;
                const float4 x0 = *(const float4 *)src, x1 = *(const float4 *)(src + 4);
                v = make_uint4(lm_bf16x2_bits(att_bf_term(x0.x, term), att_bf_term(x0.y, term)),
                               lm_bf16x2_bits(att_bf_term(x0.z, term), att_bf_term(x0.w, term)),
                               lm_bf16x2_bits(att_bf_term(x1.x, term), att_bf_term(x1.y, term)),
                               lm_bf16x2_bits(att_bf_term(x1.z, term), att_bf_term(x1.w, term)));
            }
            *(uint4 *)(sQ + r * SP + qc) = v;
        }
    };
    /* A fragments of the warp's 16 rows of sQ at k-step ks */
    auto q_frag = [&](uint32_t(&f)[4], int ks) {
        att_bf_ldsm4(f, sQ + (warp * 16 + (lane & 15)) * SP + ks * 16 + (lane >> 4) * 8);
    };
    /* hi (and mid) pass through sQ into registers; lo stays there */
    uint32_t qf[KS][4], qm[EXACT ? KS : 1][4];
    put_q(EXACT ? 0 : -1);
    __syncthreads(); /* Q, the rows and s_row written */
    if (k_lo <= k_hi) load_kv(0);
#pragma unroll
    for (int ks = 0; ks < KS; ks++) q_frag(qf[ks], ks);
    if constexpr (EXACT) {
        __syncthreads();
        put_q(1);
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < KS; ks++) q_frag(qm[ks], ks);
        __syncthreads();
        put_q(2);
        /* the loop's first barrier orders these stores before its reads */
    }

    const int rw = warp * 16 + g; /* this lane's rows: rw and rw + 8 */
    int pos[2], lo[2];
    float m[2], l[2], o[ND][4]; /* m in log2 units: scores are scaled by scale * log2(e) */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) pos[hf] = r_pos[rw + 8 * hf], lo[hf] = r_lo[rw + 8 * hf], m[hf] = -INFINITY, l[hf] = 0;
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const bool active = __any_sync(ATT_FULL, pos[0] >= 0 || pos[1] >= 0);
    /* the warp's lowest position (a row past the tile: -1) and highest
     * window start: a key tile inside both needs no mask */
    int wpos = min(pos[0], pos[1]), wlo = max(lo[0], lo[1]);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
        wpos = min(wpos, __shfl_xor_sync(ATT_FULL, wpos, off));
        wlo = max(wlo, __shfl_xor_sync(ATT_FULL, wlo, off));
    }
    /* scores in log2 units (2^x by the MUFU unit), exact: natural (expf) */
    const float l2e = EXACT ? 1.0f : 1.4426950408889634f, sl2 = a.scale * l2e;
    auto ex = [](float x) { return EXACT ? expf(x) : att_bf_exp2(x); };

    int st = 0;
    for (int j0 = k_lo; j0 <= k_hi; j0 += BK, st ^= 1) {
        if (j0 + BK <= k_hi) {
            load_kv(st ^ 1); /* that stage was consumed before the last barrier */
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        if (active) { /* warp-uniform */
            const __nv_bfloat16 *cK = sK + st * BK * SP, *cV = sV + st * BK * SP;
            /* S = Q K^T: n-tiles of 8 keys, two a ldmatrix */
            float s[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t ql[4]; /* EXACT: the lo term, from sQ */
                if constexpr (EXACT) q_frag(ql, ks);
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t kb[4];
                    att_bf_ldsm4(kb, cK + (np * 16 + (lane & 7) + (lane >> 4) * 8) * SP + ks * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int h = 0; h < 2; h++) { /* smallest term first */
                        if constexpr (EXACT) {
                            att_bf_mma(s[2 * np + h], ql, kb[2 * h], kb[2 * h + 1]);
                            att_bf_mma(s[2 * np + h], qm[ks], kb[2 * h], kb[2 * h + 1]);
                        }
                        att_bf_mma(s[2 * np + h], qf[ks], kb[2 * h], kb[2 * h + 1]);
                    }
                }
            }
            /* online softmax (units as l2e says); a row's 4 lanes (same g) hold its BK scores */
            const bool full = j0 + BK - 1 <= min(wpos, k_hi) && j0 >= wlo; /* warp-uniform */
            float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hf = e >> 1;
                    float x;
                    if (a.softcap > 0.0f) x = a.softcap * tanhf(s[n][e] * a.scale / a.softcap) * l2e;
                    else x = s[n][e] * sl2;
                    if (!full) {
                        const int j = j0 + n * 8 + 2 * t + (e & 1);
                        const bool ok = j <= k_hi && pos[hf] >= 0 && j <= pos[hf] && j >= lo[hf];
                        x = ok ? x : -INFINITY;
                    }
                    s[n][e] = x;
                    mx[hf] = fmaxf(mx[hf], x);
                }
            float al[2], mb[2], ps[2] = { 0.0f, 0.0f };
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float mn = fmaxf(m[hf], att_max4(mx[hf]));
                al[hf] = mn != -INFINITY ? ex(m[hf] - mn) : 1.0f; /* 0 when m was -inf */
                m[hf] = mn;
                mb[hf] = mn != -INFINITY ? mn : 0.0f; /* a row with no key yet: every p is exp2(-inf) = 0 */
            }
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = ex(s[n][e] - mb[e >> 1]);
                    s[n][e] = p;
                    ps[e >> 1] += p;
                }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) l[hf] = l[hf] * al[hf] + att_sum4(ps[hf]);
#pragma unroll
            for (int n = 0; n < ND; n++) o[n][0] *= al[0], o[n][1] *= al[0], o[n][2] *= al[1], o[n][3] *= al[1];
            /* O += P V: k-step kp takes keys 16kp .. 16kp + 15, n-tiles 2kp and 2kp + 1 of S */
#pragma unroll
            for (int kp = 0; kp < NT / 2; kp++) {
                constexpr int NP = EXACT ? 3 : 1; /* P's terms, pa[0] the largest */
                uint32_t pa[NP][4];
                if constexpr (EXACT) {
                    uint32_t t3[4][3];
                    att_bf_pack3(t3[0], s[2 * kp][0], s[2 * kp][1]);
                    att_bf_pack3(t3[1], s[2 * kp][2], s[2 * kp][3]);
                    att_bf_pack3(t3[2], s[2 * kp + 1][0], s[2 * kp + 1][1]);
                    att_bf_pack3(t3[3], s[2 * kp + 1][2], s[2 * kp + 1][3]);
#pragma unroll
                    for (int i = 0; i < NP; i++)
#pragma unroll
                        for (int j = 0; j < 4; j++) pa[i][j] = t3[j][i];
                } else {
                    pa[0][0] = lm_bf16x2_bits(s[2 * kp][0], s[2 * kp][1]);
                    pa[0][1] = lm_bf16x2_bits(s[2 * kp][2], s[2 * kp][3]);
                    pa[0][2] = lm_bf16x2_bits(s[2 * kp + 1][0], s[2 * kp + 1][1]);
                    pa[0][3] = lm_bf16x2_bits(s[2 * kp + 1][2], s[2 * kp + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < ND / 2; dp++) {
                    uint32_t vb[4];
                    att_bf_ldsm4t(vb, cV + (kp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SP + dp * 16 + (lane >> 4) * 8);
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int i = NP - 1; i >= 0; i--) att_bf_mma(o[2 * dp + h], pa[i], vb[2 * h], vb[2 * h + 1]);
                }
            }
        }
        rows_of(st, j0 + 2 * BK); /* s_row[st] served this tile's loads a trip ago */
        __syncthreads(); /* this stage is read; the next trip loads over the other */
    }

    /* out (one split) or the split's partials; columns d*8 + 2t, +1 */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = rw + 8 * hf, tk = r_tok[r], h = r_head[r];
        if (tk < 0) continue;
        float *dst;
        float f = 1.0f;
        if (a.n_splits == 1) {
            dst = a.out + (int64_t)tk * a.out_ld + (int64_t)h * a.Dh;
            f = 1.0f / l[hf];
        } else {
            const int64_t idx = ((int64_t)tk * a.H + h) * a.n_splits + blockIdx.z;
            if (t == 0) a.pm[idx] = EXACT ? m[hf] : m[hf] * 0.6931471805599453f, a.pl[idx] = l[hf]; /* natural units, as att_combine reads */
            dst = a.pacc + idx * a.Dh;
        }
#pragma unroll
        for (int d = 0; d < ND; d++) {
            const int col = d * 8 + 2 * t;
            if (col < a.Dh) dst[col] = o[d][2 * hf] * f;
            if (col + 1 < a.Dh) dst[col + 1] = o[d][2 * hf + 1] * f;
        }
    }
}

template <int DP, bool EXACT> static void att_bf_launch(lm_cuda *c, dim3 grid, const att_args *a) {
    const size_t smem = (size_t)(ATT_BF_ROWS + 4 * ATT_BF_BK) * (DP + 8) * sizeof(__nv_bfloat16);
    static bool opted; /* per instantiation */
    if (!opted)
        LM_CUDA_CHECK(
            cudaFuncSetAttribute(att_bf_kernel<DP, EXACT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    opted = true;
    lm_cuda_launch(c, att_bf_kernel<DP, EXACT>, grid, ATT_BF_THREADS, smem, *a);
    LM_CUDA_LAUNCHED("att_bf_kernel");
}

int lm_att_bf16_rows(const lm_cuda *c, int Dh, int64_t q_ld, int64_t kv_ld, int kt, int vt, const void *q,
                     const void *kl, const void *vl) {
    if (!c->att_tc || !c->att_bf16 || kt != LM_KV_BF16 || vt != LM_KV_BF16) return 0;
    /* 16-byte pieces: of q's rows (f32) and of the cache's rows and heads (bf16) */
    const bool aligned = Dh % 8 == 0 && q_ld % 4 == 0 && kv_ld % 8 == 0 &&
                         ((uintptr_t)q | (uintptr_t)kl | (uintptr_t)vl) % 16 == 0;
    return aligned && Dh <= 128 ? ATT_BF_ROWS : 0;
}

void lm_att_bf16_launch(lm_cuda *c, dim3 grid, const att_args *a) {
    const bool exact = c->gemm_mode != LM_CUDA_GEMM_BF16;
    if (a->Dh <= 64) exact ? att_bf_launch<64, true>(c, grid, a) : att_bf_launch<64, false>(c, grid, a);
    else exact ? att_bf_launch<128, true>(c, grid, a) : att_bf_launch<128, false>(c, grid, a);
}
