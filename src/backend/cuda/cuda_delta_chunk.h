/* cuda_delta_chunk.h - the chunked Gated DeltaNet kernel (cuda_delta.cu) and
 * the types it shares with the recurrent one, in a header so that
 * tests/host/cuda_delta_check.cpp can compile the kernel as host C++ (with
 * LM_DELTA_HOST_CHECK defined, threads and barriers written out there) and
 * check it against the delta rule on a machine without a GPU.
 *
 * Included by cuda_delta.cu after cuda_internal.h (lm_pdl_wait,
 * lm_pdl_trigger) and DELTA_FULL; the host check defines those itself. */
#ifndef LM_CUDA_DELTA_CHUNK_H
#define LM_CUDA_DELTA_CHUNK_H

#include <math.h>
#include <stdint.h>
#include <stddef.h>

typedef struct delta_seqs {
    const int32_t *pos, *slot, *start, *tok; /* device: [T], [S], [S+1], [T] */
} delta_seqs;

typedef struct delta_args {
    float *out;
    const float *qkv, *g, *beta;
    const float *a_log, *dt_bias; /* not NULL: g and beta are the raw projections (the gates fused) */
    int64_t qkv_ld, out_ld;
    float *state;
    int64_t slot_floats, st_off;
    delta_seqs q;
    int Hk, Hv, Dk, Dv, P;
    bool v_tiled; /* lm_delta_params.v_tiled */
    int Dvb; /* state columns per block: Dv / gridDim.z (chunked: ceil(Dv / gridDim.z), a multiple of 4) */
    int rec_max; /* sequences of fewer tokens take the recurrent kernel, the others the chunked one */
    int DkP; /* chunked: Dk rounded up to a multiple of 4 */
} delta_args;

/* softplus as torch computes it (threshold 20: linear above). */
__device__ __forceinline__ double delta_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

/* g and beta of one (token, head); the fused form (gated_delta_gates) calls
 * it too, so both give the same bits. */
__device__ __forceinline__ void delta_gate_pair(double a, double b, double a_log, double dt_bias, float *g, float *beta) {
    *g = (float)(-exp(a_log) * delta_softplus(a + dt_bias));
    *beta = (float)(1.0 / (1.0 + exp(-b)));
}

/* ---- gated_delta, chunked ------------------------------------------------------ */

/* The chunked form of cpu_delta.c (its header has the algebra), for
 * sequences with many tokens in the batch. Block (value head, sequence,
 * column group z) keeps columns z Dvb .. z Dvb + Dvb - 1 of its state in
 * shared memory and walks the sequence DCH tokens at a time; the columns of
 * S (and of u and o) are independent given q, k, g and beta, so a head's
 * columns spread over blocks. Per chunk, with G_i the cumulative log decay
 * (double) and n <= DCH tokens (rows past n are zero):
 *   L   q, k transposed to QT, KT [DkP][DCH] (L2-normed, q scaled by
 *       1/sqrt(Dk)); v's columns to U [DCH][Dvb]; beta, e^{G_i},
 *       e^{G_n - G_i}.
 *   M1  An = -beta_i e^{G_i-G_j} k_i.k_j (j < i) and
 *       Aqk = e^{G_i-G_j} q_i.k_j (j <= i), [DCH][DCH], 4x4 tiles of the
 *       lower triangle, one a thread (136 of the 256).
 *   M2  R = beta (V - e^G K S0), O = e^G Q S0: thread (r, cg) owns rows
 *       4r .. 4r+3 and CT column quads cg, cg+16; R replaces V in U, O
 *       stays in registers.
 *   M3  U = (I - An)^-1 R, forward substitution in four 16-row blocks:
 *       rows of block b first take -A's product with the rows solved
 *       before (a tiled product), then a thread a column substitutes the
 *       block's 16 rows in registers. (u = W_v - W_k S0 of the CPU form:
 *       the same sums, W_k's product with S0 taken before the solve.)
 *   M4  O += Aqk U, written out.
 *   M5  S = e^{G_n} S0 + (e^{G_n-G} K)^T U: thread (r, cg) owns row quads
 *       r, r+16, .. (PM of them) and the same column quads.
 * Every product is f32 FMA on register tiles from shared memory, the
 * decays exponents of differences <= 0 as in the CPU form. Shared:
 * QT, KT [DkP][DCH_LD]; An, Aqk [DCH][DCH_LD]; U [DCH][Dvb]; S [DkP][Dvb];
 * beta, e^G, e^{G_n-G} [DCH]; G [DCH] double (dch_smem_bytes). */
#define DCH 64            /* tokens per chunk */
#define DCH_LD 68         /* row stride of the [.][DCH] tiles: float4 rows, transposing writes 4-way */
#define DCH_THREADS 256
#define DCH_LU 16         /* loads in flight a thread in the chunk's load step */

#define DCH_STATIC_SMEM 64 /* bound on the kernel's static shared memory (egn), which the opt-in limit counts too */

static inline size_t dch_smem_bytes(int DkP, int Dvb) {
    return (size_t)(2 * DkP * DCH_LD + 2 * DCH * DCH_LD + DCH * Dvb + DkP * Dvb + 3 * DCH) * sizeof(float) +
           DCH * sizeof(double);
}

__device__ __forceinline__ void dch_fma4(float4 &acc, float a, const float4 b) {
    acc.x += a * b.x, acc.y += a * b.y, acc.z += a * b.z, acc.w += a * b.w;
}

/* CT column quads per thread (Dvb <= 64 CT), PM row quads per thread in M5
 * (DkP <= 64 PM). */
template <int CT, int PM>
__global__ void __launch_bounds__(DCH_THREADS, 1) delta_chunk_kernel(delta_args a) {
#ifndef LM_DELTA_HOST_CHECK
    extern __shared__ __align__(16) float dch_smem[];
#else
    float *dch_smem = lm_delta_host_smem; /* the host check's block memory */
#endif
    __shared__ float egn; /* e^{G_n} */
    const int h = blockIdx.x, s = blockIdx.y;
    const int i0 = a.q.start[s], i1 = a.q.start[s + 1];
    if (i1 - i0 < a.rec_max) return; /* block-uniform; rec_max >= 1, so never empty */
    const int Dk = a.Dk, DkP = a.DkP, Dv = a.Dv, Dvb = a.Dvb, tid = threadIdx.x;
    const int v0 = blockIdx.z * Dvb;
    float *QT = dch_smem, *KT = QT + DkP * DCH_LD, *An = KT + DkP * DCH_LD, *Aqk = An + DCH * DCH_LD;
    float *U = Aqk + DCH * DCH_LD, *Sm = U + DCH * Dvb, *bet = Sm + DkP * Dvb, *eg = bet + DCH, *dn = eg + DCH;
    double *G = reinterpret_cast<double *>(dn + DCH);

    const int hk = a.v_tiled ? h % a.Hk : h / (a.Hv / a.Hk);
    const int64_t qo = (int64_t)hk * Dk, ko = (int64_t)a.Hk * Dk + qo, vo = 2 * (int64_t)a.Hk * Dk + (int64_t)h * Dv;
    const double qscale = 1.0 / sqrt((double)Dk);
    float *Sg = a.state + (int64_t)a.q.slot[s] * a.slot_floats + a.st_off + (int64_t)h * Dk * Dv;

    /* the state's columns before the PDL wait (see delta_rule_kernel) */
    const bool zero = a.q.pos[a.q.tok[i0]] == 0;
    for (int e = tid; e < DkP * Dvb; e += DCH_THREADS) {
        const int d = e / Dvb, v = v0 + e % Dvb;
        Sm[e] = (!zero && d < Dk && v < Dv) ? Sg[(int64_t)d * Dv + v] : 0.0f;
    }
    lm_pdl_wait();

    const int r = tid >> 4, cg = tid & 15, lane = tid & 31;
    bool cv[CT]; /* column quad m of this thread is in the block */
#pragma unroll
    for (int m = 0; m < CT; m++) cv[m] = 4 * (cg + 16 * m) < Dvb;

    for (int c0 = i0; c0 < i1; c0 += DCH) {
        const int n = min(DCH, i1 - c0);
        /* L: raw q, k, v rows and the gates, DCH_LU elements a thread loaded
         * before any is stored (one block a multiprocessor: the loads'
         * latency is hidden by having many in flight, not by other warps) */
        for (int e0 = tid; e0 < DCH * DkP; e0 += DCH_LU * DCH_THREADS) {
            float qv[DCH_LU], kv[DCH_LU];
#pragma unroll
            for (int l = 0; l < DCH_LU; l++) {
                const int e = e0 + l * DCH_THREADS, i = e / DkP, d = e - i * DkP;
                qv[l] = kv[l] = 0.0f;
                if (i < n && d < Dk) {
                    const float *row = a.qkv + (int64_t)a.q.tok[c0 + i] * a.qkv_ld;
                    qv[l] = row[qo + d], kv[l] = row[ko + d];
                }
            }
#pragma unroll
            for (int l = 0; l < DCH_LU; l++) {
                const int e = e0 + l * DCH_THREADS, i = e / DkP, d = e - i * DkP;
                if (i < DCH) QT[d * DCH_LD + i] = qv[l], KT[d * DCH_LD + i] = kv[l];
            }
        }
        for (int e0 = tid; e0 < DCH * Dvb; e0 += DCH_LU * DCH_THREADS) {
            float vv[DCH_LU];
#pragma unroll
            for (int l = 0; l < DCH_LU; l++) {
                const int e = e0 + l * DCH_THREADS, i = e / Dvb, v = v0 + (e - i * Dvb);
                vv[l] = (i < n && v < Dv) ? a.qkv[(int64_t)a.q.tok[c0 + i] * a.qkv_ld + vo + v] : 0.0f;
            }
#pragma unroll
            for (int l = 0; l < DCH_LU; l++) {
                const int e = e0 + l * DCH_THREADS;
                if (e < DCH * Dvb) U[e] = vv[l];
            }
        }
        if (tid < DCH) {
            float g = 0.0f, be = 0.0f;
            if (tid < n) {
                const int64_t gi = (int64_t)a.q.tok[c0 + tid] * a.Hv + h;
                g = a.g[gi], be = a.beta[gi];
                if (a.a_log) delta_gate_pair(g, be, a.a_log[h], a.dt_bias[h], &g, &be);
            }
            bet[tid] = be, G[tid] = (double)g;
        }
        __syncthreads();
        { /* L2 norms in double, as lm_l2norm: two threads a (q or k, row) */
            const int rs = tid >> 1, half = tid & 1, i = rs & (DCH - 1);
            float *M = rs < DCH ? QT : KT;
            double ss = 0.0;
            for (int d = half; d < Dk; d += 2) {
                const double x = M[d * DCH_LD + i];
                ss += x * x;
            }
            ss += __shfl_xor_sync(DELTA_FULL, ss, 1);
            const float f = (float)((rs < DCH ? qscale : 1.0) / sqrt(ss + 1e-6));
            for (int d = half; d < Dk; d += 2) M[d * DCH_LD + i] *= f;
        }
        if (tid < 32) { /* G: inclusive scan of the decays in double; e^G and e^{G_n - G} */
            double lo = G[lane], hi = G[lane + 32];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const double x = __shfl_up_sync(DELTA_FULL, lo, o), y = __shfl_up_sync(DELTA_FULL, hi, o);
                if (lane >= o) lo += x, hi += y;
            }
            hi += __shfl_sync(DELTA_FULL, lo, 31);
            const double gn = __shfl_sync(DELTA_FULL, n - 1 < 32 ? lo : hi, (n - 1) & 31);
            G[lane] = lo, G[lane + 32] = hi;
            eg[lane] = (float)exp(lo), eg[lane + 32] = (float)exp(hi);
            dn[lane] = lane < n ? (float)exp(gn - lo) : 0.0f;
            dn[lane + 32] = lane + 32 < n ? (float)exp(gn - hi) : 0.0f;
            if (lane == 0) egn = (float)exp(gn);
        }
        __syncthreads();
        /* M1: the lower triangle's 136 4x4 tiles (ti, tj <= ti) */
        if (tid < 136) {
            int ti = 0, tj = tid;
            while (tj > ti) tj -= ++ti;
            float kk[4][4], qk[4][4];
#pragma unroll
            for (int x = 0; x < 4; x++)
#pragma unroll
                for (int y = 0; y < 4; y++) kk[x][y] = qk[x][y] = 0.0f;
            for (int d = 0; d < DkP; d++) {
                const float4 ka = *reinterpret_cast<const float4 *>(KT + d * DCH_LD + 4 * ti);
                const float4 qa = *reinterpret_cast<const float4 *>(QT + d * DCH_LD + 4 * ti);
                const float4 kb = *reinterpret_cast<const float4 *>(KT + d * DCH_LD + 4 * tj);
                const float ka_[4] = { ka.x, ka.y, ka.z, ka.w }, qa_[4] = { qa.x, qa.y, qa.z, qa.w };
                const float kb_[4] = { kb.x, kb.y, kb.z, kb.w };
#pragma unroll
                for (int x = 0; x < 4; x++)
#pragma unroll
                    for (int y = 0; y < 4; y++) kk[x][y] += ka_[x] * kb_[y], qk[x][y] += qa_[x] * kb_[y];
            }
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int i = 4 * ti + x;
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    const int j = 4 * tj + y;
                    float an = 0.0f, aq = 0.0f;
                    if (i < n && j <= i) {
                        const float decay = (float)exp(G[i] - G[j]);
                        aq = qk[x][y] * decay;
                        if (j < i) an = kk[x][y] * (-bet[i] * decay);
                    }
                    An[i * DCH_LD + j] = an, Aqk[i * DCH_LD + j] = aq;
                }
            }
        }
        /* M2: K S0 and Q S0 for rows 4r .. 4r+3 */
        float4 o[4][CT];
        {
            float4 ks[4][CT];
#pragma unroll
            for (int x = 0; x < 4; x++)
#pragma unroll
                for (int m = 0; m < CT; m++) ks[x][m] = o[x][m] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int d = 0; d < DkP; d++) {
                const float4 ka = *reinterpret_cast<const float4 *>(KT + d * DCH_LD + 4 * r);
                const float4 qa = *reinterpret_cast<const float4 *>(QT + d * DCH_LD + 4 * r);
                const float ka_[4] = { ka.x, ka.y, ka.z, ka.w }, qa_[4] = { qa.x, qa.y, qa.z, qa.w };
#pragma unroll
                for (int m = 0; m < CT; m++) {
                    if (!cv[m]) continue;
                    const float4 sb = *reinterpret_cast<const float4 *>(Sm + d * Dvb + 4 * (cg + 16 * m));
#pragma unroll
                    for (int x = 0; x < 4; x++) dch_fma4(ks[x][m], ka_[x], sb), dch_fma4(o[x][m], qa_[x], sb);
                }
            }
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int i = 4 * r + x;
                const float b = bet[i], e = eg[i];
#pragma unroll
                for (int m = 0; m < CT; m++) {
                    if (!cv[m]) continue;
                    float4 *u = reinterpret_cast<float4 *>(U + i * Dvb + 4 * (cg + 16 * m));
                    float4 vv = *u;
                    vv.x = b * (vv.x - e * ks[x][m].x), vv.y = b * (vv.y - e * ks[x][m].y);
                    vv.z = b * (vv.z - e * ks[x][m].z), vv.w = b * (vv.w - e * ks[x][m].w);
                    *u = vv;
                    o[x][m].x *= e, o[x][m].y *= e, o[x][m].z *= e, o[x][m].w *= e;
                }
            }
        }
        __syncthreads();
        /* M3: U = (I - An)^-1 R, 16 rows at a time; M5's decayed keys */
        const int nb = (n + 15) / 16;
        for (int b = 0; b < nb; b++) {
            if (b == 0) {
                for (int e = tid; e < DkP * DCH; e += DCH_THREADS) {
                    const int j = e & (DCH - 1);
                    KT[(e / DCH) * DCH_LD + j] *= dn[j];
                }
            } else {
                const int i = 16 * b + r;
#pragma unroll
                for (int m = 0; m < CT; m++) {
                    if (!cv[m]) continue;
                    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    for (int j = 0; j < 16 * b; j++)
                        dch_fma4(acc, An[i * DCH_LD + j], *reinterpret_cast<const float4 *>(U + j * Dvb + 4 * (cg + 16 * m)));
                    float4 *u = reinterpret_cast<float4 *>(U + i * Dvb + 4 * (cg + 16 * m));
                    float4 uu = *u;
                    uu.x += acc.x, uu.y += acc.y, uu.z += acc.z, uu.w += acc.w;
                    *u = uu;
                }
                __syncthreads();
            }
            if (tid < Dvb) {
                float xr[16];
                const float *Ab = An + 16 * b * DCH_LD + 16 * b;
#pragma unroll
                for (int ii = 0; ii < 16; ii++) xr[ii] = U[(16 * b + ii) * Dvb + tid];
#pragma unroll
                for (int ii = 1; ii < 16; ii++)
#pragma unroll
                    for (int jj = 0; jj < ii; jj++) xr[ii] += Ab[ii * DCH_LD + jj] * xr[jj];
#pragma unroll
                for (int ii = 0; ii < 16; ii++) U[(16 * b + ii) * Dvb + tid] = xr[ii];
            }
            __syncthreads();
        }
        /* M4: O += Aqk U (Aqk is zero above the diagonal: j < 4r + 4) */
        for (int j4 = 0; j4 <= r; j4++) {
            float4 aq[4];
#pragma unroll
            for (int x = 0; x < 4; x++) aq[x] = *reinterpret_cast<const float4 *>(Aqk + (4 * r + x) * DCH_LD + 4 * j4);
#pragma unroll
            for (int m = 0; m < CT; m++) {
                if (!cv[m]) continue;
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    const float4 u = *reinterpret_cast<const float4 *>(U + (4 * j4 + y) * Dvb + 4 * (cg + 16 * m));
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        const float ax = y == 0 ? aq[x].x : y == 1 ? aq[x].y : y == 2 ? aq[x].z : aq[x].w;
                        dch_fma4(o[x][m], ax, u);
                    }
                }
            }
        }
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int i = 4 * r + x;
            if (i >= n) continue;
            float *orow = a.out + (int64_t)a.q.tok[c0 + i] * a.out_ld + (int64_t)h * Dv;
#pragma unroll
            for (int m = 0; m < CT; m++) {
                if (!cv[m]) continue;
                const int v = v0 + 4 * (cg + 16 * m);
                const float ov[4] = { o[x][m].x, o[x][m].y, o[x][m].z, o[x][m].w };
#pragma unroll
                for (int y = 0; y < 4; y++)
                    if (v + y < Dv) orow[v + y] = ov[y];
            }
        }
        /* M5: S = e^{G_n} S0 + (e^{G_n - G} K)^T U over the chunk's rows */
        {
            float4 sa[PM][4][CT];
            const float en = egn;
#pragma unroll
            for (int p = 0; p < PM; p++)
#pragma unroll
                for (int x = 0; x < 4; x++)
#pragma unroll
                    for (int m = 0; m < CT; m++) {
                        const int d = 4 * (r + 16 * p) + x;
                        if (d < DkP && cv[m]) {
                            const float4 s0 = *reinterpret_cast<const float4 *>(Sm + d * Dvb + 4 * (cg + 16 * m));
                            sa[p][x][m] = make_float4(en * s0.x, en * s0.y, en * s0.z, en * s0.w);
                        } else {
                            sa[p][x][m] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        }
                    }
            const int nj = (n + 3) / 4;
            for (int j4 = 0; j4 < nj; j4++) {
                float4 u[4][CT];
#pragma unroll
                for (int y = 0; y < 4; y++)
#pragma unroll
                    for (int m = 0; m < CT; m++)
                        u[y][m] = cv[m] ? *reinterpret_cast<const float4 *>(U + (4 * j4 + y) * Dvb + 4 * (cg + 16 * m))
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int p = 0; p < PM; p++) {
                    if (4 * (r + 16 * p) >= DkP) continue;
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        const float4 k = *reinterpret_cast<const float4 *>(KT + (4 * (r + 16 * p) + x) * DCH_LD + 4 * j4);
#pragma unroll
                        for (int m = 0; m < CT; m++) {
                            dch_fma4(sa[p][x][m], k.x, u[0][m]);
                            dch_fma4(sa[p][x][m], k.y, u[1][m]);
                            dch_fma4(sa[p][x][m], k.z, u[2][m]);
                            dch_fma4(sa[p][x][m], k.w, u[3][m]);
                        }
                    }
                }
            }
#pragma unroll
            for (int p = 0; p < PM; p++)
#pragma unroll
                for (int x = 0; x < 4; x++)
#pragma unroll
                    for (int m = 0; m < CT; m++) {
                        const int d = 4 * (r + 16 * p) + x;
                        if (d < DkP && cv[m]) *reinterpret_cast<float4 *>(Sm + d * Dvb + 4 * (cg + 16 * m)) = sa[p][x][m];
                    }
        }
        __syncthreads();
    }
    /* the kernel after this one may start only now: its blocks, waiting
     * resident, would otherwise hold the room of this kernel's later waves */
    lm_pdl_trigger();
    for (int e = tid; e < DkP * Dvb; e += DCH_THREADS) {
        const int d = e / Dvb, v = v0 + e % Dvb;
        if (d < Dk && v < Dv) Sg[(int64_t)d * Dv + v] = Sm[e];
    }
}

#endif
