/* cpu_kern_scalar.c - portable kernels: the reference-shaped fallback.
 *
 * Plain C that any x86-64 (or other) CPU runs; the compiler may vectorise it
 * for the baseline ISA only. Only f32 weights get a GEMV kernel: the driver
 * widens every other dtype with lm_dequant_row first, which is exact.
 * Dot products keep eight partial sums, which both shortens the rounding
 * chains (better conditioned than one running sum) and lets the compiler use
 * baseline SIMD without reassociating floats on its own. */
#include "cpu_kern.h"

#include <math.h>

#define LM_SC_MR 4
#define LM_SC_NR 8

static float lm_sc_dot(const float *a, const float *b, int64_t n) {
    float s[8] = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    for (; i < n; i++) s[0] += a[i] * b[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

static void lm_sc_gemv_f32(const void *w, size_t ldw, int nr, const float *x, int64_t ldx, int nt,
                           int64_t n, const float *bias, float *y, int64_t ldy) {
    for (int r = 0; r < nr; r++) {
        const float *wr = (const float *)((const char *)w + (size_t)r * ldw);
        float b = bias ? bias[r] : 0.0f;
        for (int t = 0; t < nt; t++) y[t * ldy + r] = lm_sc_dot(wr, x + t * ldx, n) + b;
    }
}

static void lm_sc_gemm(const float *x, int64_t ldx, const float *wp, int64_t kc, float *y, int64_t ldy,
                       int mt, int nt, const float *bias, bool first) {
    float acc[LM_SC_MR][LM_SC_NR] = { { 0 } };
    const float *xr[LM_SC_MR];
    for (int r = 0; r < LM_SC_MR; r++) xr[r] = x + (r < mt ? r : 0) * ldx; /* spare rows: dropped */
    for (int64_t k = 0; k < kc; k++) {
        const float *wk = wp + k * LM_SC_NR;
        for (int r = 0; r < LM_SC_MR; r++)
            for (int j = 0; j < LM_SC_NR; j++) acc[r][j] += xr[r][k] * wk[j];
    }
    for (int r = 0; r < mt; r++) {
        float *yr = y + r * ldy;
        for (int j = 0; j < nt; j++) {
            float base = first ? (bias ? bias[j] : 0.0f) : yr[j];
            yr[j] = base + acc[r][j];
        }
    }
}

static void lm_sc_pack_f32(const void *w, size_t ldw, int nv, int64_t kc, float *wp) {
    for (int r = 0; r < LM_SC_NR; r++) {
        if (r < nv) {
            const float *src = (const float *)((const char *)w + (size_t)r * ldw);
            for (int64_t k = 0; k < kc; k++) wp[k * LM_SC_NR + r] = src[k];
        } else {
            for (int64_t k = 0; k < kc; k++) wp[k * LM_SC_NR + r] = 0.0f;
        }
    }
}

static void lm_sc_attn_scores(const float *q, const float *k, int64_t ldk, int n, int dh, float scale,
                              float *s) {
    for (int j = 0; j < n; j++) s[j] = lm_sc_dot(q, k + j * ldk, dh) * scale;
}

static float lm_sc_attn_exp(float *s, int n, float m) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) sum += s[j] = lm_att_exp_cut(s[j] - m);
    return sum;
}

static void lm_sc_attn_accum(float *o, const float *p, const float *v, int64_t ldv, int n, int dh) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < dh; i++) o[i] += p[j] * v[j * ldv + i];
}

static void lm_sc_scal(float *y, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

const lm_cpu_kern lm_cpu_kern_scalar = {
    .isa = LM_ISA_SCALAR,
    .gemv_rows = 4,
    .gemv_tokens = 4,
    .gemv = { [LM_F32] = lm_sc_gemv_f32 },
    .mr = LM_SC_MR,
    .nr = LM_SC_NR,
    .kc = 256,
    .gemm_min_tokens = 8,
    .gemm = lm_sc_gemm,
    .pack = { [LM_F32] = lm_sc_pack_f32 },
    .attn_scores = lm_sc_attn_scores,
    .attn_exp = lm_sc_attn_exp,
    .attn_accum = lm_sc_attn_accum,
    .scal = lm_sc_scal,
};
