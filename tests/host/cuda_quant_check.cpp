/* cuda_quant_check.cpp - the GPU's block decoders (src/backend/cuda/
 * cuda_quant.h) run on the CPU, against lm_dequant_row, so that a machine
 * without a GPU (CI, the mutation runs) still checks them.
 *
 * The header is compiled as host C++ with the few CUDA intrinsics it uses
 * written out here by their PTX definitions (ld.global.cs, shf.r, prmt). For
 * every type, rows of random blocks (at a 2-byte offset too, where the
 * type's alignment allows it) are decoded slice by slice: every value is
 * written exactly once, equals lm_dequant_row's bit for bit, and the GEMV's
 * per-group sums (code * x summed, scaled once) give the plain dot product
 * within 1e-5 of sum |x w| (FP8_B128's e4m3 codes too). The int8 tensor-core GEMM's fragments
 * (cuda_mmq_types.h) likewise: every lane's codes of every group, times its
 * scale (minus its min), equal lm_dequant_row's values. Exit status 0 when
 * all hold; the failures are printed. Run by the test
 * cuda_quant_decoders_on_the_cpu. */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
#include "backend/lm_dtype.h"
}

#define LM_QUANT_HOST_CHECK
#define __device__
#define __forceinline__ inline
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
template <class T> static T __ldcs(const T *p) {
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}
static unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {
    return (unsigned)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
/* prmt without the sign-replicate mode (bit 3 of a selector nibble is unused here) */
static unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint8_t b[8];
    memcpy(b, &x, 4);
    memcpy(b + 4, &y, 4);
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)b[(s >> (4 * i)) & 7] << (8 * i);
    return r;
}
static float __int_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static unsigned short __ushort_as_half(unsigned short h) { return h; }
static float __half2float(unsigned short h) { return lm_f16_to_f32(h); }
static float __fmul_rn(float a, float b) { return a * b; }
struct float4 {
    float x, y, z, w;
};
static unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static float __fdividef(float a, float b) { return a / b; }
static int __dp4a(int a, int b, int c) {
    for (int e = 0; e < 4; e++) c += (int)(signed char)(a >> (8 * e)) * (int)(signed char)(b >> (8 * e));
    return c;
}
static float __fsub_rn(float a, float b) { return a - b; }
static unsigned __vsub4(unsigned a, unsigned b) { /* per byte, wrapping */
    unsigned r = 0;
    for (int e = 0; e < 4; e++) r |= ((((a >> (8 * e)) & 0xffu) - ((b >> (8 * e)) & 0xffu)) & 0xffu) << (8 * e);
    return r;
}

#include "backend/cuda/cuda_quant.h"
#include "backend/cuda/cuda_mmq_types.h"

static uint64_t qc_state = 12345;
static unsigned qc_rnd() {
    qc_state = qc_state * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)(qc_state >> 33);
}

/* The dp4a GEMV's arithmetic (lm_q_quant_x, lm_q_dot_i8) on one row of nb
 * blocks (w decoded by lm_dequant_row in ref): equal within f32 rounding to
 * the plain dot with each x rounded as the kernel rounds it (to a multiple
 * of its slice's amax / 127, ties to even), and within half a step a value
 * of the exact dot want. */
template <class Q>
static int qc_check_i8(const char *name, const uint8_t *w, const float *ref, const float *x, int nb, double want) {
    double got = 0, emul = 0, cond = 0, step = 0;
    for (int b = 0; b < nb; b++)
        for (int j = 0; j < Q::LPB; j++) {
            const typename Q::raw v = Q::slice(w + (size_t)b * Q::BB, j);
            const float *xb = x + b * Q::BV;
            const lm_q_x8<Q> x8 = lm_q_quant_x<Q>(xb, j);
            got += lm_q_dot_i8<Q>(v, x8, 0.0f);
            float amax = 0;
            for (int q = 0; q < Q::Q; q++)
                for (int e = 0; e < 4; e++) amax = fmaxf(amax, fabsf(xb[Q::at(j, q) + e]));
            const float inv = amax > 0 ? 127.0f / amax : 0.0f, dx = amax * (1.0f / 127.0f);
            for (int q = 0; q < Q::Q; q++)
                for (int e = 0; e < 4; e++) {
                    const int at = b * Q::BV + Q::at(j, q) + e;
                    const double r = nearbyint((double)x[at] * inv); /* one rounding of the exact product, as fmaf */
                    emul += (double)ref[at] * r * dx;
                    cond += fabs((double)ref[at] * r * dx);
                    step += fabs((double)ref[at]) * dx * 0.5;
                }
        }
    int bad = 0;
    if (!(fabs(got - emul) <= 1e-5 * cond + 1e-6) && bad++ < 5)
        printf("%s: the dp4a sum %.9g, the same rounding in double %.9g (sum |x w| %.3g)\n", name, got, emul, cond);
    if (!(fabs(got - want) <= step * 1.001 + 1e-5 * cond) && bad++ < 5)
        printf("%s: the dp4a sum %.9g is more than half a step a value (%.3g) from the exact dot %.9g\n", name, got,
               step, want);
    return bad;
}

/* The int8 GEMM's view of row w (I values, ref its lm_dequant_row): for
 * every unit of 256 values, lane tig of a quad and group g, the fragment
 * codes (u8 with a min, else s8) at k = 4 tig.. and 16 + 4 tig.. of the
 * group, as scale * code (- min), equal ref bit for bit. */
template <lm_dtype QT> static int qc_check_mq(const char *name, const uint8_t *w, const float *ref, int I) {
    using M = lm_mq<QT>;
    constexpr int KF = M::G / 16;
    int bad = 0;
    for (int u = 0; u < I / 256; u++)
        for (int tig = 0; tig < 4; tig++) {
            typename M::raw r;
            M::load(r, w, u, tig);
            for (int g = 0; g < 256 / M::G; g++) {
                unsigned a[KF];
                float sc, mn;
                M::frag(r, g, a);
                M::sm(r, g, sc, mn);
                for (int f = 0; f < KF; f++)
                    for (int e = 0; e < 4; e++) {
                        const unsigned byte = (a[f] >> (8 * e)) & 0xffu;
                        const float code = M::MIN ? (float)byte : (float)(signed char)byte;
                        const float v = M::MIN ? __fsub_rn(__fmul_rn(sc, code), mn) : __fmul_rn(sc, code);
                        const int at = 256 * u + M::G * g + 16 * f + 4 * tig + e;
                        if (memcmp(&v, &ref[at], 4) != 0 && bad++ < 5)
                            printf("%s: int8 GEMM fragment, value %d: %.9g, lm_dequant_row %.9g\n", name, at, v, ref[at]);
                    }
            }
        }
    return bad;
}

template <lm_dtype QT> static int qc_check(const char *name) {
    using Q = lm_q<QT>;
    const int nb = Q::BV == 32 ? 16 : 7, I = nb * Q::BV; /* 16: two units of the int8 GEMM */
    const size_t bytes = lm_dtype_row_bytes(QT, I);
    uint8_t *buf = (uint8_t *)aligned_alloc(16, (bytes + 47) / 16 * 16);
    float *ref = (float *)malloc(I * sizeof(float)), *got = (float *)malloc(I * sizeof(float));
    float *x = (float *)malloc(I * sizeof(float));
    int bad = 0;
    const bool wide = QT == LM_Q4_K || QT == LM_Q5_K || QT == LM_IQ4_XS || QT == LM_Q2_K || QT == LM_FP8_B128; /* 4- to 16-byte loads */
    for (int shift = 0; shift <= (wide ? 0 : 2); shift += 2) {
        uint8_t *w = buf + shift;
        for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)qc_rnd();
        const bool aff = QT == LM_A4_BF16 || QT == LM_A4_F16 || QT == LM_A8_BF16 || QT == LM_A8_F16; /* s and b */
        const bool bf = QT == LM_A4_BF16 || QT == LM_A8_BF16;
        const bool two = QT == LM_Q4_K || QT == LM_Q5_K || QT == LM_Q4_1 || QT == LM_Q5_1 || aff; /* d and dmin / m */
        const int f0 = QT == LM_Q6_K ? 208 : QT == LM_Q2_K ? 80 : QT == LM_Q3_K ? 108 : 0;
        const int f1 = QT == LM_Q2_K ? 82 : two ? 2 : -1;
        for (size_t off = 0; off < bytes; off += (size_t)lm_dtype_block_bytes(QT)) { /* finite f16 scales */
            const float sc = 0.01f * (1.0f + (float)(qc_rnd() % 100) / 50.0f) * ((qc_rnd() & 1) ? -1.0f : 1.0f);
            if (QT == LM_FP8_B128) { /* an f32 scale, and no NaN code (never a weight; the GPU reads it as 480) */
                memcpy(w + off, &sc, 4);
                for (int k = 4; k < 132; k++)
                    if ((w[off + k] & 0x7f) == 0x7f) w[off + k] ^= 1;
                continue;
            }
            uint16_t h = bf ? lm_f32_to_bf16(sc) : lm_f32_to_f16(sc);
            memcpy(w + off + f0, &h, 2);
            if (f1 >= 0) {
                const float m = 0.003f * (1.0f + (float)(qc_rnd() % 100) / 50.0f) * (aff && (qc_rnd() & 1) ? -1.0f : 1.0f);
                h = bf ? lm_f32_to_bf16(m) : lm_f32_to_f16(m);
                memcpy(w + off + f1, &h, 2);
            }
        }
        lm_dequant_row(QT, w, ref, I);
        for (int i = 0; i < I; i++) got[i] = NAN, x[i] = (float)(qc_rnd() % 2000) / 1000.0f - 1.0f;
        double dot = 0, want = 0, cond = 0;
        for (int b = 0; b < nb; b++)
            for (int j = 0; j < Q::LPB; j++) {
                const typename Q::raw v = Q::slice(w + (size_t)b * Q::BB, j);
                for (int q = 0; q < Q::Q; q++) {
                    float f[4];
                    lm_q_quad<Q>(v, q, f);
                    for (int e = 0; e < 4; e++) {
                        const int at = b * Q::BV + Q::at(j, q) + e;
                        if (!std::isnan(got[at]) && bad++ < 5) printf("%s: value %d decoded twice\n", name, at);
                        got[at] = f[e];
                    }
                }
                for (int g = 0; g < Q::Q / Q::QG; g++) { /* the GEMV's form */
                    float sq = 0, sx = 0;
                    for (int qi = 0; qi < Q::QG; qi++) {
                        const int q = g * Q::QG + qi;
                        float f[4];
                        lm_q_vals<Q>(v, q, f);
                        for (int e = 0; e < 4; e++) {
                            const int at = b * Q::BV + Q::at(j, q) + e;
                            sq += f[e] * x[at];
                            sx += x[at];
                        }
                    }
                    dot += (double)Q::scale(v, g) * sq - (Q::MIN ? (double)Q::minv(v, g) * sx : 0.0);
                }
            }
        for (int i = 0; i < I; i++) {
            want += (double)ref[i] * x[i];
            cond += fabs((double)ref[i] * x[i]);
            if (memcmp(&ref[i], &got[i], 4) != 0 && bad++ < 5)
                printf("%s (row at +%d): value %d: lm_dequant_row %.9g, GPU decoder %.9g\n", name, shift, i, ref[i], got[i]);
        }
        if (!(fabs(dot - want) <= 1e-5 * cond) && bad++ < 5)
            printf("%s: the GEMV's grouped sum %.9g, the plain dot %.9g (sum |x w| %.3g)\n", name, dot, want, cond);
        if constexpr (Q::OFF >= 0) /* integer codes: the int8 GEMV's form */
            bad += qc_check_i8<Q>(name, w, ref, x, nb, want);
        if constexpr (Q::OFF >= 0 && QT != LM_Q2_K && QT != LM_Q3_K && QT != LM_A4_BF16 && QT != LM_A4_F16 &&
                      QT != LM_A8_BF16 && QT != LM_A8_F16) /* and the int8 GEMM's (cuda_mmq.cu) */
            bad += qc_check_mq<QT>(name, w, ref, I);
    }
    printf("%s: %s\n", name, bad ? "DIFFERENT" : "equal");
    free(buf), free(ref), free(got), free(x);
    return bad;
}

int main() {
    const int bad = qc_check<LM_Q8_0>("Q8_0") + qc_check<LM_Q4_0>("Q4_0") + qc_check<LM_Q4_1>("Q4_1") +
                    qc_check<LM_Q5_0>("Q5_0") + qc_check<LM_Q5_1>("Q5_1") + qc_check<LM_IQ4_NL>("IQ4_NL") +
                    qc_check<LM_Q4_K>("Q4_K") + qc_check<LM_Q5_K>("Q5_K") + qc_check<LM_Q6_K>("Q6_K") +
                    qc_check<LM_IQ4_XS>("IQ4_XS") + qc_check<LM_Q2_K>("Q2_K") + qc_check<LM_Q3_K>("Q3_K") +
                    qc_check<LM_FP8_B128>("FP8_B128") + qc_check<LM_A4_BF16>("A4_BF16") + qc_check<LM_A4_F16>("A4_F16") +
                    qc_check<LM_A8_BF16>("A8_BF16") + qc_check<LM_A8_F16>("A8_F16");
    return bad != 0;
}
