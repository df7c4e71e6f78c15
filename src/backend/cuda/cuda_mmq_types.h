/* cuda_mmq_types.h - the GGUF block types as the int8 tensor-core GEMM
 * (cuda_mmq.cu) reads them: a row's codes as mma A fragments with their
 * scales and mins. Compiled for the CPU too by tests/host/cuda_quant_check.cpp,
 * which checks every value against lm_dequant_row. */
#ifndef LM_CUDA_MMQ_TYPES_H
#define LM_CUDA_MMQ_TYPES_H

#include "cuda_quant.h"

/* A 32-bit word at a 2-byte aligned address (two aligned loads and a
 * funnel shift; the word after a tensor's last block is padding,
 * LM_CUDA_QUANT_PAD), and at a 4-byte aligned one. Plain loads, not the
 * evict-first ones of cuda_quant.h: the four lanes of a quad read
 * neighbouring words, which L1 then serves (and no read-only path:
 * test cuda_sources_no_readonly_loads says why). */
static __device__ __forceinline__ unsigned lm_mq_w2(const unsigned char *p) {
    const unsigned *b = (const unsigned *)((uintptr_t)p & ~(uintptr_t)3);
    return __funnelshift_r(b[0], b[1], ((unsigned)(uintptr_t)p & 2u) * 8u);
}
static __device__ __forceinline__ unsigned lm_mq_w4(const unsigned char *p) { return *(const unsigned *)p; }
static __device__ __forceinline__ float lm_mq_h(const unsigned char *p) { return lm_q_f16(*(const unsigned short *)p); }

/* Per type: G values a scale group (32; Q6_K 16), RB bytes a row's unit of
 * 256 values, MIN (codes u8 and value = scale * code - min; else codes s8
 * and value = scale * code); raw: what lane tig of a quad reads of one row's
 * unit u (load); frag(r, g, a): group g's codes at k = 4 tig.. (a[0]) and,
 * for G = 32, 16 + 4 tig.. (a[1]), four to a word; sm(r, g, s, m): its
 * scale and min. scale * code (- min), each product rounded, is
 * lm_dequant_row's value bit for bit (tests/host/cuda_quant_check.cpp). */
template <lm_dtype QT> struct lm_mq;

/* Q4_K / Q5_K: group g's scale d * sc and min dmin * m from the header h */
static __device__ __forceinline__ void lm_mq_k_sm(const uint4 &h, int g, float &s, float &m) {
    unsigned sc, mn;
    lm_q_k_pair(h.y, h.z, h.w, g >> 1, &sc, &mn);
    s = lm_q_f16((unsigned short)(h.x & 0xffffu)) * lm_q_bytef(sc, g & 1, 0.0f);
    m = lm_q_f16((unsigned short)(h.x >> 16)) * lm_q_bytef(mn, g & 1, 0.0f);
}

template <> struct lm_mq<LM_Q4_K> { /* qs[32p, 32p + 32): group 2p low nibbles, 2p + 1 high */
    static constexpr int G = 32, RB = 144;
    static constexpr bool MIN = true;
    struct raw {
        uint4 h;
        unsigned q[8];
    };
    static __device__ __forceinline__ void load(raw &r, const unsigned char *row, int u, int tig) {
        const unsigned char *b = row + (size_t)u * RB;
        r.h = *(const uint4 *)b;
#pragma unroll
        for (int i = 0; i < 8; i++) r.q[i] = lm_mq_w4(b + 16 + 16 * i + 4 * tig);
    }
    static __device__ __forceinline__ void frag(const raw &r, int g, unsigned (&a)[2]) {
        const int p = g >> 1, s = 4 * (g & 1);
        a[0] = (r.q[2 * p] >> s) & 0x0f0f0f0fu, a[1] = (r.q[2 * p + 1] >> s) & 0x0f0f0f0fu;
    }
    static __device__ __forceinline__ void sm(const raw &r, int g, float &s, float &m) { lm_mq_k_sm(r.h, g, s, m); }
};

template <> struct lm_mq<LM_Q5_K> { /* Q4_K's layout (qs at 48) plus bit g of qh[l] as value l's 16 */
    static constexpr int G = 32, RB = 176;
    static constexpr bool MIN = true;
    struct raw {
        uint4 h;
        unsigned q[8], qh[2];
    };
    static __device__ __forceinline__ void load(raw &r, const unsigned char *row, int u, int tig) {
        const unsigned char *b = row + (size_t)u * RB;
        r.h = *(const uint4 *)b;
        r.qh[0] = lm_mq_w4(b + 16 + 4 * tig), r.qh[1] = lm_mq_w4(b + 32 + 4 * tig);
#pragma unroll
        for (int i = 0; i < 8; i++) r.q[i] = lm_mq_w4(b + 48 + 16 * i + 4 * tig);
    }
    static __device__ __forceinline__ void frag(const raw &r, int g, unsigned (&a)[2]) {
        const int p = g >> 1, s = 4 * (g & 1);
        a[0] = ((r.q[2 * p] >> s) & 0x0f0f0f0fu) | (((r.qh[0] >> g) & 0x01010101u) << 4);
        a[1] = ((r.q[2 * p + 1] >> s) & 0x0f0f0f0fu) | (((r.qh[1] >> g) & 0x01010101u) << 4);
    }
    static __device__ __forceinline__ void sm(const raw &r, int g, float &s, float &m) { lm_mq_k_sm(r.h, g, s, m); }
};

/* Q6_K: group j of 16 = values 16j.. = half hf = j / 8, m = (j / 2) % 4,
 * l = 16 (j % 2) + i: ql[64 hf + 32 (m % 2) + l] nibble m / 2, bits 2m,
 * 2m + 1 of qh[32 hf + l], scale scales[j]. */
template <> struct lm_mq<LM_Q6_K> {
    static constexpr int G = 16, RB = 210;
    static constexpr bool MIN = false;
    struct raw {
        unsigned ql[8], qh[4], sc[4];
        float d;
    };
    static __device__ __forceinline__ void load(raw &r, const unsigned char *row, int u, int tig) {
        const unsigned char *b = row + (size_t)u * RB;
#pragma unroll
        for (int i = 0; i < 8; i++) /* i = 4 hf + 2 (m % 2) + l / 16 */
            r.ql[i] = lm_mq_w2(b + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * tig);
#pragma unroll
        for (int i = 0; i < 4; i++) r.qh[i] = lm_mq_w2(b + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * tig);
#pragma unroll
        for (int i = 0; i < 4; i++) r.sc[i] = lm_mq_w2(b + 192 + 4 * i);
        r.d = lm_mq_h(b + 208);
    }
    static __device__ __forceinline__ void frag(const raw &r, int j, unsigned (&a)[1]) {
        const int hf = j >> 3, m = (j >> 1) & 3, lh = j & 1;
        const unsigned lo = (r.ql[4 * hf + 2 * (m & 1) + lh] >> (4 * (m >> 1))) & 0x0f0f0f0fu;
        const unsigned hi = ((r.qh[2 * hf + lh] >> (2 * m)) & 0x03030303u) << 4;
        a[0] = __vsub4(lo | hi, 0x20202020u);
    }
    static __device__ __forceinline__ void sm(const raw &r, int j, float &s, float &m) {
        s = r.d * (float)(signed char)(r.sc[j >> 2] >> (8 * (j & 3))), m = 0.0f;
    }
};

/* IQ4_XS: sub-block g: low nibbles of qs[16g + l] for l < 16, high ones above */
template <> struct lm_mq<LM_IQ4_XS> {
    static constexpr int G = 32, RB = 136;
    static constexpr bool MIN = false;
    struct raw {
        uint2 h;
        unsigned q[8];
    };
    static __device__ __forceinline__ void load(raw &r, const unsigned char *row, int u, int tig) {
        const unsigned char *b = row + (size_t)u * RB;
        r.h = *(const uint2 *)b;
#pragma unroll
        for (int g = 0; g < 8; g++) r.q[g] = lm_mq_w4(b + 8 + 16 * g + 4 * tig);
    }
    static __device__ __forceinline__ void frag(const raw &r, int g, unsigned (&a)[2]) {
        a[0] = lm_q_iq4_levels(r.q[g] & 0x0f0f0f0fu) ^ 0x80808080u;
        a[1] = lm_q_iq4_levels((r.q[g] >> 4) & 0x0f0f0f0fu) ^ 0x80808080u;
    }
    static __device__ __forceinline__ void sm(const raw &r, int g, float &s, float &m) {
        const unsigned ls = ((r.h.y >> (4 * g)) & 15u) | (((r.h.x >> (16 + 2 * g)) & 3u) << 4);
        s = lm_q_f16((unsigned short)(r.h.x & 0xffffu)) * (float)((int)ls - 32), m = 0.0f;
    }
};

/* The 32-value types: a unit is 8 blocks, group g block g. Q4_0's nibble
 * layout (value l < 16 the low nibble of qs[l], l + 16 its high nibble)
 * is shared by Q4_1, Q5_0, Q5_1 and IQ4_NL. */
template <> struct lm_mq<LM_Q8_0> {
    static constexpr int G = 32, RB = 8 * 34;
    static constexpr bool MIN = false;
    struct raw {
        unsigned q[16];
        float d[8];
    };
    static __device__ __forceinline__ void load(raw &r, const unsigned char *row, int u, int tig) {
        const unsigned char *b = row + (size_t)u * RB;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            r.q[2 * k] = lm_mq_w2(b + 34 * k + 2 + 4 * tig), r.q[2 * k + 1] = lm_mq_w2(b + 34 * k + 18 + 4 * tig);
            r.d[k] = lm_mq_h(b + 34 * k);
        }
    }
    static __device__ __forceinline__ void frag(const raw &r, int g, unsigned (&a)[2]) { a[0] = r.q[2 * g], a[1] = r.q[2 * g + 1]; }
    static __device__ __forceinline__ void sm(const raw &r, int g, float &s, float &m) { s = r.d[g], m = 0.0f; }
};

template <> struct lm_mq<LM_Q4_0> {
    static constexpr int G = 32, RB = 8 * 18;
    static constexpr bool MIN = false;
    struct raw {
        unsigned q[8];
        float d[8];
    };
    static __device__ __forceinline__ void load(raw &r, const unsigned char *row, int u, int tig) {
        const unsigned char *b = row + (size_t)u * RB;
#pragma unroll
        for (int k = 0; k < 8; k++) r.q[k] = lm_mq_w2(b + 18 * k + 2 + 4 * tig), r.d[k] = lm_mq_h(b + 18 * k);
    }
    static __device__ __forceinline__ void frag(const raw &r, int g, unsigned (&a)[2]) {
        a[0] = __vsub4(r.q[g] & 0x0f0f0f0fu, 0x08080808u), a[1] = __vsub4((r.q[g] >> 4) & 0x0f0f0f0fu, 0x08080808u);
    }
    static __device__ __forceinline__ void sm(const raw &r, int g, float &s, float &m) { s = r.d[g], m = 0.0f; }
};

template <> struct lm_mq<LM_Q4_1> { /* x = d q + m: min -m */
    static constexpr int G = 32, RB = 8 * 20;
    static constexpr bool MIN = true;
    struct raw {
        unsigned q[8];
        float d[8], m[8];
    };
    static __device__ __forceinline__ void load(raw &r, const unsigned char *row, int u, int tig) {
        const unsigned char *b = row + (size_t)u * RB;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            r.q[k] = lm_mq_w2(b + 20 * k + 4 + 4 * tig);
            r.d[k] = lm_mq_h(b + 20 * k), r.m[k] = lm_mq_h(b + 20 * k + 2);
        }
    }
    static __device__ __forceinline__ void frag(const raw &r, int g, unsigned (&a)[2]) {
        a[0] = r.q[g] & 0x0f0f0f0fu, a[1] = (r.q[g] >> 4) & 0x0f0f0f0fu;
    }
    static __device__ __forceinline__ void sm(const raw &r, int g, float &s, float &m) { s = r.d[g], m = -r.m[g]; }
};

/* Q5_0 / Q5_1: qh bit l is value l's fifth bit; kept shifted by 4 tig so
 * that bits 0..3 and 16..19 belong to the lane's two words */
template <> struct lm_mq<LM_Q5_0> {
    static constexpr int G = 32, RB = 8 * 22;
    static constexpr bool MIN = false;
    struct raw {
        unsigned q[8], qh[8];
        float d[8];
    };
    static __device__ __forceinline__ void load(raw &r, const unsigned char *row, int u, int tig) {
        const unsigned char *b = row + (size_t)u * RB;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            r.q[k] = lm_mq_w2(b + 22 * k + 6 + 4 * tig), r.qh[k] = lm_mq_w2(b + 22 * k + 2) >> (4 * tig);
            r.d[k] = lm_mq_h(b + 22 * k);
        }
    }
    static __device__ __forceinline__ void frag(const raw &r, int g, unsigned (&a)[2]) {
        a[0] = __vsub4((r.q[g] & 0x0f0f0f0fu) | lm_q_bit4s(r.qh[g], 0), 0x10101010u);
        a[1] = __vsub4(((r.q[g] >> 4) & 0x0f0f0f0fu) | lm_q_bit4s(r.qh[g], 16), 0x10101010u);
    }
    static __device__ __forceinline__ void sm(const raw &r, int g, float &s, float &m) { s = r.d[g], m = 0.0f; }
};

template <> struct lm_mq<LM_Q5_1> {
    static constexpr int G = 32, RB = 8 * 24;
    static constexpr bool MIN = true;
    struct raw {
        unsigned q[8], qh[8];
        float d[8], m[8];
    };
    static __device__ __forceinline__ void load(raw &r, const unsigned char *row, int u, int tig) {
        const unsigned char *b = row + (size_t)u * RB;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            r.q[k] = lm_mq_w2(b + 24 * k + 8 + 4 * tig), r.qh[k] = lm_mq_w2(b + 24 * k + 4) >> (4 * tig);
            r.d[k] = lm_mq_h(b + 24 * k), r.m[k] = lm_mq_h(b + 24 * k + 2);
        }
    }
    static __device__ __forceinline__ void frag(const raw &r, int g, unsigned (&a)[2]) {
        a[0] = (r.q[g] & 0x0f0f0f0fu) | lm_q_bit4s(r.qh[g], 0);
        a[1] = ((r.q[g] >> 4) & 0x0f0f0f0fu) | lm_q_bit4s(r.qh[g], 16);
    }
    static __device__ __forceinline__ void sm(const raw &r, int g, float &s, float &m) { s = r.d[g], m = -r.m[g]; }
};

/* IQ4_NL: Q4_0's block (f16 d, 16 bytes of nibbles) with the nibbles
 * indexing the IQ4 levels */
template <> struct lm_mq<LM_IQ4_NL> : lm_mq<LM_Q4_0> {
    static __device__ __forceinline__ void frag(const raw &r, int g, unsigned (&a)[2]) {
        a[0] = lm_q_iq4_levels(r.q[g] & 0x0f0f0f0fu) ^ 0x80808080u;
        a[1] = lm_q_iq4_levels((r.q[g] >> 4) & 0x0f0f0f0fu) ^ 0x80808080u;
    }
};

#endif
