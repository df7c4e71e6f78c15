/* cpu_kern_avx512.c - AVX-512 kernels (F, BW, VL, DQ; FMA, F16C).
 *
 * Compiled with -mavx512*; entered only when lm_cpu_isa_detect() reported
 * LM_ISA_AVX512. Every helper here is static so that no AVX-512 code can be
 * picked by the linker for a portable caller.
 *
 * GEMV (decode): streams up to 4 weight rows at once, 32 values (one 64-byte
 * line of bf16) per row per step, widened to f32 in registers (bf16 by a
 * 16-bit shift, f16 by vcvtph2ps) and multiplied into 1-4 token vectors with
 * FMA; each (token, row) pair has its own 16-lane f32 accumulator, reduced
 * once at the end. The activation is never rounded.
 *
 * AVX512_BF16 is not used: vdpbf16ps would round the activation to bf16
 * (~1e-2 relative error in a dot product), and splitting x = hi + lo into two
 * bf16 parts still has ~10x the error of f32 FMA (1e-5 vs 1e-6) while running
 * at half the speed here (vdpbf16ps issues at a quarter of the FMA rate).
 * Measured by tools/bench_kernels --only hilo.
 *
 * GEMM (prefill): an 8 x 32 register tile (8 tokens x 32 outputs = 16 zmm
 * accumulators). Per k it loads two vectors of the packed f32 weight panel
 * and broadcasts 8 packed activations. */
#include "cpu_kern.h"

#include <immintrin.h>
#include <string.h>

#define LM_AI static inline __attribute__((always_inline))
#ifndef LM_Z_MR
#define LM_Z_MR 8 /* GEMM tile: tokens (16 accumulators with NR = 32) */
#endif
#define LM_Z_NR 32
#ifndef LM_Z_KC
#define LM_Z_KC 512 /* GEMM k-slice: a 32 x 512 f32 panel (64 KB, L2); 8% faster than 256 */
#endif
#ifndef LM_Z_GEMM_MIN
#define LM_Z_GEMM_MIN 16 /* tokens from which GEMM beats the GEMV tiles */
#endif

/* ---- loads that widen 16 values of a weight dtype to f32 ---------------- */

LM_AI __m512 lm_z_ld(lm_dtype dt, const void *base, int64_t i) {
    if (dt == LM_F32) return _mm512_loadu_ps((const float *)base + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
    if (dt == LM_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

LM_AI __m512 lm_z_ld_mask(lm_dtype dt, const void *base, int64_t i, __mmask16 m) {
    if (dt == LM_F32) return _mm512_maskz_loadu_ps(m, (const float *)base + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)base + i);
    if (dt == LM_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

LM_AI __mmask16 lm_z_mask(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

/* ---- GEMV ------------------------------------------------------------- */

/* Distance of the software prefetch, in values: ~2 KB of bf16 ahead per row,
 * enough to cover memory latency at the streaming rate of one core. */
#ifndef LM_Z_PF
#define LM_Z_PF 1024
#endif
#ifndef LM_Z_PF_WRAP
#define LM_Z_PF_WRAP 1
#endif

LM_AI void lm_z_gemv(lm_dtype dt, const int NT, const void *w, size_t ldw, int nr, const float *x,
                     int64_t ldx, int64_t n, const float *bias, float *y, int64_t ldy) {
    const size_t esz = dt == LM_F32 ? 4 : 2;
    /* Rows beyond nr alias row 0: same work, results dropped. */
    const char *wr[4];
    uintptr_t next[4];
    for (int r = 0; r < 4; r++) {
        wr[r] = (const char *)w + (size_t)(r < nr ? r : 0) * ldw;
        /* same row of the next tile; as an integer, since it may lie past the
         * end of the weight (only ever prefetched, never loaded) */
        next[r] = (uintptr_t)w + (4 + (uintptr_t)r) * ldw;
    }
    const size_t row_bytes = (size_t)n * esz;
    __m512 acc[LM_GEMV_MAX_TOKENS][4];
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 4; r++) acc[t][r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a[4], b[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            /* Past the end of the row, keep the stream going into the same
             * row of the next tile (prefetching never faults, and the rows
             * the driver hands over next are the following ones): with
             * short rows (I = 2048 bf16 is one 4 KB page) the start of every
             * row would otherwise be a demand miss. */
            size_t off = (size_t)(i + LM_Z_PF) * esz;
            const char *pf = LM_Z_PF_WRAP && off >= row_bytes ? (const char *)(next[r] + (off - row_bytes))
                                                              : wr[r] + off;
            _mm_prefetch(pf, _MM_HINT_T0);
            if (esz == 4) _mm_prefetch(pf + 64, _MM_HINT_T0);
            a[r] = lm_z_ld(dt, wr[r], i);
            b[r] = lm_z_ld(dt, wr[r], i + 16);
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m512 xa = _mm512_loadu_ps(x + t * ldx + i), xb = _mm512_loadu_ps(x + t * ldx + i + 16);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                acc[t][r] = _mm512_fmadd_ps(a[r], xa, acc[t][r]);
                acc[t][r] = _mm512_fmadd_ps(b[r], xb, acc[t][r]);
            }
        }
    }
    for (; i < n; i += 16) {
        __mmask16 m = lm_z_mask(n - i);
        __m512 a[4];
        for (int r = 0; r < 4; r++) a[r] = lm_z_ld_mask(dt, wr[r], i, m);
        for (int t = 0; t < NT; t++) {
            __m512 xa = _mm512_maskz_loadu_ps(m, x + t * ldx + i);
            for (int r = 0; r < 4; r++) acc[t][r] = _mm512_fmadd_ps(a[r], xa, acc[t][r]);
        }
    }
    /* Reduce with constant indices only: indexing acc[][] by the run-time nr
     * would make GCC keep the accumulators in memory inside the loop. */
    float sum[LM_GEMV_MAX_TOKENS][4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) sum[t][r] = _mm512_reduce_add_ps(acc[t][r]);
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < nr; r++) y[t * ldy + r] = sum[t][r] + (bias ? bias[r] : 0.0f);
}

#define LM_Z_GEMV_FN(name, dt)                                                                   \
    static void name(const void *w, size_t ldw, int nr, const float *x, int64_t ldx, int nt,    \
                     int64_t n, const float *bias, float *y, int64_t ldy) {                     \
        switch (nt) {                                                                            \
        case 1: lm_z_gemv(dt, 1, w, ldw, nr, x, ldx, n, bias, y, ldy); break;                    \
        case 2: lm_z_gemv(dt, 2, w, ldw, nr, x, ldx, n, bias, y, ldy); break;                    \
        case 3: lm_z_gemv(dt, 3, w, ldw, nr, x, ldx, n, bias, y, ldy); break;                    \
        default: lm_z_gemv(dt, 4, w, ldw, nr, x, ldx, n, bias, y, ldy); break;                   \
        }                                                                                        \
    }

LM_Z_GEMV_FN(lm_z_gemv_f32, LM_F32)
LM_Z_GEMV_FN(lm_z_gemv_bf16, LM_BF16)
LM_Z_GEMV_FN(lm_z_gemv_f16, LM_F16)

/* ---- row widening for the GEMM packer --------------------------------- */

LM_AI void lm_z_to_f32(lm_dtype dt, const void *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, lm_z_ld(dt, src, i));
    if (i < n) {
        __mmask16 m = lm_z_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, lm_z_ld_mask(dt, src, i, m));
    }
}

static void lm_z_bf16_to_f32(const void *s, float *d, int64_t n) { lm_z_to_f32(LM_BF16, s, d, n); }
static void lm_z_f16_to_f32(const void *s, float *d, int64_t n) { lm_z_to_f32(LM_F16, s, d, n); }
static void lm_z_f32_to_f32(const void *s, float *d, int64_t n) { lm_z_to_f32(LM_F32, s, d, n); }

/* ---- GEMM panel packing ----------------------------------------------- */

/* In-register transpose of a 16 x 16 f32 block: r[i][j] -> r[j][i].
 * Stage 1-2 transpose 4 x 4 blocks inside each 128-bit lane, stage 3-4 move
 * the lanes; 64 shuffles for 256 values. */
LM_AI void lm_z_tr16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));     /* column 4L+0 of rows i..i+3 */
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c)); /* column 4L+1 */
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d)); /* column 4L+2 */
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d)); /* column 4L+3 */
    }
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44);
        __m512 v1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xee);
        __m512 v2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
        __m512 v3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xee);
        t[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
        t[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Widens and transposes 16-row x 16-column blocks straight into the panel. */
LM_AI void lm_z_pack(lm_dtype dt, const void *w, size_t ldw, int nv, int64_t kc, float *wp) {
    for (int h = 0; h < LM_Z_NR / 16; h++) {
        int rows = nv - 16 * h; /* valid rows in this half */
        if (rows <= 0) {
            for (int64_t k = 0; k < kc; k++) _mm512_store_ps(wp + k * LM_Z_NR + 16 * h, _mm512_setzero_ps());
            continue;
        }
        const char *base = (const char *)w + (size_t)(16 * h) * ldw;
        for (int64_t k = 0; k < kc; k += 16) {
            int64_t n = LM_MIN((int64_t)16, kc - k);
            __mmask16 m = lm_z_mask(n);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                const char *row = base + (size_t)(i < rows ? i : 0) * ldw;
                __m512 v = n == 16 ? lm_z_ld(dt, row, k) : lm_z_ld_mask(dt, row, k, m);
                r[i] = i < rows ? v : _mm512_setzero_ps();
            }
            lm_z_tr16(r);
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) /* constant indices keep r[] in registers */
                if (j < n) _mm512_store_ps(wp + (k + j) * LM_Z_NR + 16 * h, r[j]);
        }
    }
}

static void lm_z_pack_f32(const void *w, size_t ldw, int nv, int64_t kc, float *wp) {
    lm_z_pack(LM_F32, w, ldw, nv, kc, wp);
}
static void lm_z_pack_bf16(const void *w, size_t ldw, int nv, int64_t kc, float *wp) {
    lm_z_pack(LM_BF16, w, ldw, nv, kc, wp);
}
static void lm_z_pack_f16(const void *w, size_t ldw, int nv, int64_t kc, float *wp) {
    lm_z_pack(LM_F16, w, ldw, nv, kc, wp);
}

/* ---- GEMM micro-kernel ------------------------------------------------- */

static void lm_z_gemm(const float *x, int64_t ldx, const float *wp, int64_t kc, float *y, int64_t ldy,
                      int mt, int nt, const float *bias, bool first) {
    const __mmask16 m0 = lm_z_mask(nt), m1 = lm_z_mask(nt > 16 ? nt - 16 : 0);
    const float *xr[LM_Z_MR];
    for (int r = 0; r < LM_Z_MR; r++) xr[r] = x + (r < mt ? r : 0) * ldx; /* spare rows: dropped */
    __m512 c0[LM_Z_MR], c1[LM_Z_MR];
    if (first) {
        __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
        __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int r = 0; r < LM_Z_MR; r++) c0[r] = b0, c1[r] = b1;
    } else {
#pragma GCC unroll 16
        for (int r = 0; r < LM_Z_MR; r++) {
            bool ok = r < mt;
            c0[r] = ok ? _mm512_maskz_loadu_ps(m0, y + r * ldy) : _mm512_setzero_ps();
            c1[r] = ok ? _mm512_maskz_loadu_ps(m1, y + r * ldy + 16) : _mm512_setzero_ps();
        }
    }
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        __m512 w0 = _mm512_load_ps(wp), w1 = _mm512_load_ps(wp + 16);
#pragma GCC unroll 16
        for (int r = 0; r < LM_Z_MR; r++) {
            __m512 b = _mm512_set1_ps(xr[r][k]);
            c0[r] = _mm512_fmadd_ps(b, w0, c0[r]);
            c1[r] = _mm512_fmadd_ps(b, w1, c1[r]);
        }
        wp += LM_Z_NR;
    }
    /* Constant indices only (see lm_z_gemv): spare rows are skipped by a
     * test, not by a run-time loop bound. */
#pragma GCC unroll 16
    for (int r = 0; r < LM_Z_MR; r++) {
        if (r < mt) {
            _mm512_mask_storeu_ps(y + r * ldy, m0, c0[r]);
            _mm512_mask_storeu_ps(y + r * ldy + 16, m1, c1[r]);
        }
    }
}

/* ---- attention --------------------------------------------------------- */

/* Sums each of a0..a3 across its 16 lanes: the four results in lanes 0-3.
 * Two rounds of lane shuffles reduce 4 x 16 values to 4 x 4, then two
 * in-lane permutes finish; ~3 instructions per key instead of a full
 * reduction each. */
LM_AI __m128 lm_z_hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xee));
    __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xee));
    /* lane i of u: four partial sums of a_i */
    __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xdd));
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4e));
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0xb1)); /* every element of lane i: sum of a_i */
    __m512i idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, u));
}

LM_AI __m512 lm_z_ldq(const float *p, int i, int dh) {
    return i + 16 <= dh ? _mm512_loadu_ps(p + i) : _mm512_maskz_loadu_ps(lm_z_mask(dh - i), p + i);
}

static void lm_z_attn_scores(const float *q, const float *k, int64_t ldk, int n, int dh, float scale,
                             float *s) {
    const __m128 vs = _mm_set1_ps(scale);
    int j = 0;
    for (; j + 4 <= n; j += 4) { /* four keys share the q loads and one reduction */
        const float *k0 = k + j * ldk, *k1 = k0 + ldk, *k2 = k1 + ldk, *k3 = k2 + ldk;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < dh; i += 16) {
            __m512 qv = lm_z_ldq(q, i, dh);
            a0 = _mm512_fmadd_ps(qv, lm_z_ldq(k0, i, dh), a0);
            a1 = _mm512_fmadd_ps(qv, lm_z_ldq(k1, i, dh), a1);
            a2 = _mm512_fmadd_ps(qv, lm_z_ldq(k2, i, dh), a2);
            a3 = _mm512_fmadd_ps(qv, lm_z_ldq(k3, i, dh), a3);
        }
        _mm_storeu_ps(s + j, _mm_mul_ps(lm_z_hsum4(a0, a1, a2, a3), vs));
    }
    for (; j < n; j++) {
        const float *kr = k + j * ldk;
        __m512 a0 = _mm512_setzero_ps();
        for (int i = 0; i < dh; i += 16) a0 = _mm512_fmadd_ps(lm_z_ldq(q, i, dh), lm_z_ldq(kr, i, dh), a0);
        s[j] = _mm512_reduce_add_ps(a0) * scale;
    }
}

/* exp(x) for x <= 0 (softmax weights), Cephes' single-precision scheme:
 * x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact product),
 * e^r by a degree-7 polynomial, then vscalefps multiplies by 2^n, which
 * also produces the subnormal and zero results correctly. Error ~1 ulp. */
LM_AI __m512 lm_z_exp(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f)); /* e^-104 is 0 in f32 */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

static float lm_z_attn_exp(float *s, int n, float m) {
    const __m512 vm = _mm512_set1_ps(m), cut = _mm512_set1_ps(LM_ATT_EXP_CUT);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 k = lm_z_mask(n - j);
        const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm);
        __m512 e = lm_z_exp(x);
        e = _mm512_maskz_mov_ps(k & _mm512_cmp_ps_mask(x, cut, _CMP_GE_OQ), e);
        _mm512_mask_storeu_ps(s + j, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* o += sum_j p[j] v_j, 64 columns of o held in registers at a time. */
static void lm_z_attn_accum(float *o, const float *p, const float *v, int64_t ldv, int n, int dh) {
    for (int d0 = 0; d0 < dh; d0 += 64) {
        __mmask16 mk[4];
        __m512 acc[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            int w = dh - d0 - 16 * c;
            mk[c] = lm_z_mask(w > 0 ? w : 0);
            acc[c] = _mm512_maskz_loadu_ps(mk[c], o + d0 + 16 * c);
        }
        for (int j = 0; j < n; j++) {
            __m512 pj = _mm512_set1_ps(p[j]);
            const float *vr = v + j * ldv + d0;
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[c] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(mk[c], vr + 16 * c), acc[c]);
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(o + d0 + 16 * c, mk[c], acc[c]);
    }
}

/* silu(g) u with sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e)
 * below, e = exp(-|g|) <= 1 (lm_z_exp's domain; no overflow either way). */
static void lm_z_silu_mul(float *y, const float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = lm_z_mask(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = lm_z_exp(_mm512_sub_ps(zero, _mm512_abs_ps(x)));
        __m512 r = _mm512_div_ps(one, _mm512_add_ps(one, e));
        __m512 sig = _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), e, r);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_mul_ps(x, sig), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

static void lm_z_scal(float *y, float a, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = lm_z_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* ---- quantised KV rows (cpu_kv_avx2.c's, 16 values a vector) ---- */

LM_AI __m512 lm_z_kv_scale(const uint8_t *row, int64_t codes_bytes, int64_t i) {
    uint16_t h;
    memcpy(&h, row + codes_bytes + 2 * (i / LM_KV_GROUP), 2);
    return _mm512_set1_ps(_cvtsh_ss(h));
}

static void lm_z_kv_q8_to_f32(const void *rowp, int64_t c0, int64_t n, int64_t w, float *y) {
    const uint8_t *row = rowp;
    const int64_t cb = (int64_t)lm_kv_codes_bytes(LM_KV_Q8, w);
    for (int64_t i = c0; i < c0 + n; i += LM_KV_GROUP, y += LM_KV_GROUP) {
        const __m512 d = lm_z_kv_scale(row, cb, i);
        for (int k = 0; k < LM_KV_GROUP; k += 16) {
            const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + i + k)));
            _mm512_storeu_ps(y + k, _mm512_mul_ps(_mm512_cvtepi32_ps(c), d));
        }
    }
}

static void lm_z_kv_q4_to_f32(const void *rowp, int64_t c0, int64_t n, int64_t w, float *y) {
    const uint8_t *row = rowp;
    const int64_t cb = (int64_t)lm_kv_codes_bytes(LM_KV_Q4, w);
    const __m128i low = _mm_set1_epi8(15);
    const __m512i eight = _mm512_set1_epi32(8);
    for (int64_t i = c0; i < c0 + n; i += LM_KV_GROUP, y += LM_KV_GROUP) {
        const __m512 d = lm_z_kv_scale(row, cb, i);
        /* value 2j in byte j's low nibble, 2j + 1 in its high one */
        const __m128i b = _mm_loadu_si128((const __m128i *)(row + i / 2));
        const __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
        const __m512i v0 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), eight);
        const __m512i v1 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), eight);
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(v0), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(v1), d));
    }
}

const lm_cpu_kern lm_cpu_kern_avx512 = {
    .isa = LM_ISA_AVX512,
    .gemv_rows = 4,
    .gemv_tokens = 4,
    .gemv = { [LM_F32] = lm_z_gemv_f32, [LM_BF16] = lm_z_gemv_bf16, [LM_F16] = lm_z_gemv_f16,
              [LM_FP8_B128] = lm_cpu_fp8_gemv_avx2 },
    .to_f32 = { [LM_F32] = lm_z_f32_to_f32, [LM_BF16] = lm_z_bf16_to_f32, [LM_F16] = lm_z_f16_to_f32,
                [LM_FP8_B128] = lm_cpu_fp8_to_f32_avx2, [LM_A4_BF16] = lm_cpu_a4_bf16_to_f32_avx2,
                [LM_A4_F16] = lm_cpu_a4_f16_to_f32_avx2, [LM_A8_BF16] = lm_cpu_a8_bf16_to_f32_avx2,
                [LM_A8_F16] = lm_cpu_a8_f16_to_f32_avx2 },
    .mr = LM_Z_MR,
    .nr = LM_Z_NR,
    .kc = LM_Z_KC,
    .gemm_min_tokens = LM_Z_GEMM_MIN,
    .gemm = lm_z_gemm,
    .pack = { [LM_F32] = lm_z_pack_f32, [LM_BF16] = lm_z_pack_bf16, [LM_F16] = lm_z_pack_f16 },
    .attn_scores = lm_z_attn_scores,
    .attn_exp = lm_z_attn_exp,
    .attn_accum = lm_z_attn_accum,
    .scal = lm_z_scal,
    .silu_mul = lm_z_silu_mul,
    .kv_to_f32 = { [LM_KV_Q8] = lm_z_kv_q8_to_f32, [LM_KV_Q4] = lm_z_kv_q4_to_f32, [LM_KV_Q4R] = lm_z_kv_q4_to_f32 },
};
