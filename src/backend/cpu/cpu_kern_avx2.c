/* cpu_kern_avx2.c - AVX2 kernels (with FMA and F16C).
 *
 * The same structure as cpu_kern_avx512.c at half the width, for CPUs without
 * AVX-512: GEMV streams 4 weight rows against 1-2 tokens (16 ymm registers
 * leave room for 8 accumulators), GEMM uses a 6 x 16 tile (12 accumulators).
 * AVX2 has no cheap byte masks for 16-bit loads, so ragged row ends are
 * finished in scalar code with the same f32 arithmetic. Compiled with
 * -mavx2 -mfma -mf16c; entered only when lm_cpu_isa_detect() allows it. */
#include "cpu_kern.h"

#include <immintrin.h>
#include <math.h>

#define LM_AI static inline __attribute__((always_inline))
#define LM_Y_MR 6
#define LM_Y_NR 16
#ifndef LM_Y_KC
#define LM_Y_KC 1024 /* GEMM k-slice: the 16 x 1024 f32 panel (64 KB) stays in L2; measured best */
#endif
#define LM_Y_PF 1024 /* software prefetch distance, in values */
#ifndef LM_Y_GEMM_MIN
#define LM_Y_GEMM_MIN 16 /* tokens from which GEMM beats the GEMV tiles */
#endif

LM_AI __m256 lm_y_ld(lm_dtype dt, const void *base, int64_t i) {
    if (dt == LM_F32) return _mm256_loadu_ps((const float *)base + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i));
    if (dt == LM_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

LM_AI float lm_y_ld1(lm_dtype dt, const void *base, int64_t i) {
    if (dt == LM_F32) return ((const float *)base)[i];
    uint16_t h = ((const uint16_t *)base)[i];
    if (dt == LM_BF16) return lm_bf16_to_f32(h);
    return _cvtsh_ss(h);
}

LM_AI float lm_y_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- GEMV ------------------------------------------------------------- */

LM_AI void lm_y_gemv(lm_dtype dt, const int NT, const void *w, size_t ldw, int nr, const float *x,
                     int64_t ldx, int64_t n, const float *bias, float *y, int64_t ldy) {
    const size_t esz = dt == LM_F32 ? 4 : 2;
    const char *wr[4];
    uintptr_t next[4];
    for (int r = 0; r < 4; r++) {
        wr[r] = (const char *)w + (size_t)(r < nr ? r : 0) * ldw;
        /* same row of the next tile; as an integer, since it may lie past the
         * end of the weight (only ever prefetched, never loaded) */
        next[r] = (uintptr_t)w + (4 + (uintptr_t)r) * ldw;
    }
    const size_t row_bytes = (size_t)n * esz;
    __m256 acc[2][4];
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 4; r++) acc[t][r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if ((size_t)i * esz % 64 == 0) { /* once per cache line; wraps as in cpu_kern_avx512.c */
                size_t off = (size_t)(i + LM_Y_PF) * esz;
                _mm_prefetch(off >= row_bytes ? (const char *)(next[r] + (off - row_bytes)) : wr[r] + off,
                             _MM_HINT_T0);
            }
            a[r] = lm_y_ld(dt, wr[r], i);
        }
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            __m256 xa = _mm256_loadu_ps(x + t * ldx + i);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) acc[t][r] = _mm256_fmadd_ps(a[r], xa, acc[t][r]);
        }
    }
    /* Reduce with constant indices only: indexing acc[][] by the run-time nr
     * would make GCC keep the accumulators in memory inside the loop. */
    float sum[2][4];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) sum[t][r] = lm_y_hsum(acc[t][r]);
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < nr; r++) {
            float s = sum[t][r];
            for (int64_t j = i; j < n; j++) s += lm_y_ld1(dt, wr[r], j) * x[t * ldx + j];
            y[t * ldy + r] = s + (bias ? bias[r] : 0.0f);
        }
}

#define LM_Y_GEMV_FN(name, dt)                                                                \
    static void name(const void *w, size_t ldw, int nr, const float *x, int64_t ldx, int nt, \
                     int64_t n, const float *bias, float *y, int64_t ldy) {                  \
        if (nt == 1) lm_y_gemv(dt, 1, w, ldw, nr, x, ldx, n, bias, y, ldy);                   \
        else lm_y_gemv(dt, 2, w, ldw, nr, x, ldx, n, bias, y, ldy);                           \
    }

LM_Y_GEMV_FN(lm_y_gemv_f32, LM_F32)
LM_Y_GEMV_FN(lm_y_gemv_bf16, LM_BF16)
LM_Y_GEMV_FN(lm_y_gemv_f16, LM_F16)

/* ---- row widening for the GEMM packer --------------------------------- */

LM_AI void lm_y_to_f32(lm_dtype dt, const void *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, lm_y_ld(dt, src, i));
    for (; i < n; i++) dst[i] = lm_y_ld1(dt, src, i);
}

static void lm_y_bf16_to_f32(const void *s, float *d, int64_t n) { lm_y_to_f32(LM_BF16, s, d, n); }
static void lm_y_f16_to_f32(const void *s, float *d, int64_t n) { lm_y_to_f32(LM_F16, s, d, n); }
static void lm_y_f32_to_f32(const void *s, float *d, int64_t n) { lm_y_to_f32(LM_F32, s, d, n); }

/* ---- GEMM panel packing ----------------------------------------------- */

/* In-register transpose of an 8 x 8 f32 block: r[i][j] -> r[j][i]. */
LM_AI void lm_y_tr8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* u[i+c]: columns c and c+4 of rows i..i+3 */
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

LM_AI void lm_y_pack(lm_dtype dt, const void *w, size_t ldw, int nv, int64_t kc, float *wp) {
    for (int h = 0; h < LM_Y_NR / 8; h++) {
        int rows = nv - 8 * h;
        if (rows <= 0) {
            for (int64_t k = 0; k < kc; k++) _mm256_store_ps(wp + k * LM_Y_NR + 8 * h, _mm256_setzero_ps());
            continue;
        }
        const char *base = (const char *)w + (size_t)(8 * h) * ldw;
        for (int64_t k = 0; k < kc; k += 8) {
            int64_t n = LM_MIN((int64_t)8, kc - k);
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                if (i >= rows) {
                    r[i] = _mm256_setzero_ps();
                } else if (n == 8) {
                    r[i] = lm_y_ld(dt, base + (size_t)i * ldw, k);
                } else { /* ragged end of the slice */
                    float tmp[8] = { 0 };
                    for (int64_t j = 0; j < n; j++) tmp[j] = lm_y_ld1(dt, base + (size_t)i * ldw, k + j);
                    r[i] = _mm256_loadu_ps(tmp);
                }
            }
            lm_y_tr8(r);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) /* constant indices keep r[] in registers */
                if (j < n) _mm256_store_ps(wp + (k + j) * LM_Y_NR + 8 * h, r[j]);
        }
    }
}

static void lm_y_pack_f32(const void *w, size_t ldw, int nv, int64_t kc, float *wp) {
    lm_y_pack(LM_F32, w, ldw, nv, kc, wp);
}
static void lm_y_pack_bf16(const void *w, size_t ldw, int nv, int64_t kc, float *wp) {
    lm_y_pack(LM_BF16, w, ldw, nv, kc, wp);
}
static void lm_y_pack_f16(const void *w, size_t ldw, int nv, int64_t kc, float *wp) {
    lm_y_pack(LM_F16, w, ldw, nv, kc, wp);
}

/* ---- GEMM micro-kernel ------------------------------------------------- */

static void lm_y_gemm(const float *x, int64_t ldx, const float *wp, int64_t kc, float *y, int64_t ldy,
                      int mt, int nt, const float *bias, bool first) {
    const float *xr[LM_Y_MR];
    for (int r = 0; r < LM_Y_MR; r++) xr[r] = x + (r < mt ? r : 0) * ldx; /* spare rows: dropped */
    __m256 c0[LM_Y_MR], c1[LM_Y_MR];
    for (int r = 0; r < LM_Y_MR; r++) c0[r] = c1[r] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        __m256 w0 = _mm256_load_ps(wp), w1 = _mm256_load_ps(wp + 8);
#pragma GCC unroll 6
        for (int r = 0; r < LM_Y_MR; r++) {
            __m256 b = _mm256_broadcast_ss(xr[r] + k);
            c0[r] = _mm256_fmadd_ps(b, w0, c0[r]);
            c1[r] = _mm256_fmadd_ps(b, w1, c1[r]);
        }
        wp += LM_Y_NR;
    }
    /* Ragged tiles go through a buffer: AVX2 masked stores need int masks.
     * The buffer is filled with constant indices: indexing c0[] by the
     * run-time mt would make GCC keep the accumulators in memory. */
    float buf[LM_Y_MR][LM_Y_NR];
#pragma GCC unroll 6
    for (int r = 0; r < LM_Y_MR; r++) {
        _mm256_storeu_ps(buf[r], c0[r]);
        _mm256_storeu_ps(buf[r] + 8, c1[r]);
    }
    for (int r = 0; r < mt; r++) {
        float *yr = y + r * ldy;
        if (nt == LM_Y_NR) {
            __m256 b0, b1;
            if (first) {
                b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
                b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
            } else {
                b0 = _mm256_loadu_ps(yr);
                b1 = _mm256_loadu_ps(yr + 8);
            }
            _mm256_storeu_ps(yr, _mm256_add_ps(b0, _mm256_loadu_ps(buf[r])));
            _mm256_storeu_ps(yr + 8, _mm256_add_ps(b1, _mm256_loadu_ps(buf[r] + 8)));
        } else {
            for (int j = 0; j < nt; j++) {
                float base = first ? (bias ? bias[j] : 0.0f) : yr[j];
                yr[j] = base + buf[r][j];
            }
        }
    }
}

/* ---- attention --------------------------------------------------------- */

/* Sums each of a0..a3 across its 8 lanes: the four results in a __m128. */
LM_AI __m128 lm_y_hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h01 = _mm256_hadd_ps(a0, a1), h23 = _mm256_hadd_ps(a2, a3);
    __m256 h = _mm256_hadd_ps(h01, h23); /* per 128-bit half: partial sums of a0..a3 */
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

static void lm_y_attn_scores(const float *q, const float *k, int64_t ldk, int n, int dh, float scale,
                             float *s) {
    const int dv = dh & ~7; /* vectorised part; the rest is added in scalar */
    int j = 0;
    for (; j + 4 <= n; j += 4) { /* four keys share the q loads and one reduction */
        const float *kr[4] = { k + j * ldk, k + (j + 1) * ldk, k + (j + 2) * ldk, k + (j + 3) * ldk };
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < dv; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[0] + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[1] + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[2] + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[3] + i), a3);
        }
        float d[4];
        _mm_storeu_ps(d, lm_y_hsum4(a0, a1, a2, a3));
        for (int c = 0; c < 4; c++) {
            for (int i = dv; i < dh; i++) d[c] += q[i] * kr[c][i];
            s[j + c] = d[c] * scale;
        }
    }
    for (; j < n; j++) {
        const float *kr = k + j * ldk;
        __m256 a0 = _mm256_setzero_ps();
        for (int i = 0; i < dv; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kr + i), a0);
        float d = lm_y_hsum(a0);
        for (int i = dv; i < dh; i++) d += q[i] * kr[i];
        s[j] = d * scale;
    }
}

/* exp(x) for x <= 0: the same Cephes scheme as cpu_kern_avx512.c, with 2^n
 * built in the exponent bits; below -87.3 (where 2^n would be subnormal) the
 * result is flushed to 0, ~1e-38 away from the true value. */
LM_AI __m256 lm_y_exp(__m256 x) {
    __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

static float lm_y_attn_exp(float *s, int n, float m) {
    const __m256 vm = _mm256_set1_ps(m), cut = _mm256_set1_ps(LM_ATT_EXP_CUT);
    __m256 sum = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + j), vm);
        const __m256 e = _mm256_and_ps(lm_y_exp(x), _mm256_cmp_ps(x, cut, _CMP_GE_OQ));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float t = lm_y_hsum(sum);
    for (; j < n; j++) t += s[j] = lm_att_exp_cut(s[j] - m);
    return t;
}

/* o += sum_j p[j] v_j, 32 columns of o held in registers at a time. */
static void lm_y_attn_accum(float *o, const float *p, const float *v, int64_t ldv, int n, int dh) {
    int d0 = 0;
    for (; d0 + 32 <= dh; d0 += 32) {
        __m256 acc[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) acc[c] = _mm256_loadu_ps(o + d0 + 8 * c);
        for (int j = 0; j < n; j++) {
            __m256 pj = _mm256_set1_ps(p[j]);
            const float *vr = v + j * ldv + d0;
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8 * c), acc[c]);
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
    }
    for (; d0 + 8 <= dh; d0 += 8) {
        __m256 acc = _mm256_loadu_ps(o + d0);
        for (int j = 0; j < n; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * ldv + d0), acc);
        _mm256_storeu_ps(o + d0, acc);
    }
    for (; d0 < dh; d0++)
        for (int j = 0; j < n; j++) o[d0] += p[j] * v[j * ldv + d0];
}

static void lm_y_scal(float *y, float a, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}

const lm_cpu_kern lm_cpu_kern_avx2 = {
    .isa = LM_ISA_AVX2,
    .gemv_rows = 4,
    .gemv_tokens = 2,
    .gemv = { [LM_F32] = lm_y_gemv_f32, [LM_BF16] = lm_y_gemv_bf16, [LM_F16] = lm_y_gemv_f16,
              [LM_FP8_B128] = lm_cpu_fp8_gemv_avx2 },
    .to_f32 = { [LM_F32] = lm_y_f32_to_f32, [LM_BF16] = lm_y_bf16_to_f32, [LM_F16] = lm_y_f16_to_f32,
                [LM_FP8_B128] = lm_cpu_fp8_to_f32_avx2, [LM_A4_BF16] = lm_cpu_a4_bf16_to_f32_avx2,
                [LM_A4_F16] = lm_cpu_a4_f16_to_f32_avx2, [LM_A8_BF16] = lm_cpu_a8_bf16_to_f32_avx2,
                [LM_A8_F16] = lm_cpu_a8_f16_to_f32_avx2 },
    .mr = LM_Y_MR,
    .nr = LM_Y_NR,
    .kc = LM_Y_KC,
    .gemm_min_tokens = LM_Y_GEMM_MIN,
    .gemm = lm_y_gemm,
    .pack = { [LM_F32] = lm_y_pack_f32, [LM_BF16] = lm_y_pack_bf16, [LM_F16] = lm_y_pack_f16 },
    .attn_scores = lm_y_attn_scores,
    .attn_exp = lm_y_attn_exp,
    .attn_accum = lm_y_attn_accum,
    .scal = lm_y_scal,
    .kv_to_f32 = { [LM_KV_Q8] = lm_cpu_kv_q8_to_f32_avx2, [LM_KV_Q4] = lm_cpu_kv_q4_to_f32_avx2,
                   [LM_KV_Q4R] = lm_cpu_kv_q4_to_f32_avx2 },
};
