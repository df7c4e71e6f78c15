/* cuda_quant.h - the GGUF block types on the GPU: how a thread reads its
 * slice of a block and turns it into floats. Shared by the quantised GEMV
 * (cuda_qgemv.cu) and the dequantising kernels (cuda_dequant.cu), so both
 * see the same values.
 *
 * A block (32 or 256 values, lm_dtype.h) is cut into LPB slices of
 * VPS = BV / LPB values; consecutive threads take consecutive slices, so
 * a warp's loads fall on a few consecutive blocks (Q4_K: 8 threads read
 * one block's 128 bytes of nibbles as 8 x 16 bytes). A slice is read with
 * the widest loads its alignment allows: 16 bytes for Q4_K and Q5_K
 * (144- and 176-byte blocks), 8 for IQ4_XS (136), aligned 4-byte words
 * joined by funnel shifts for the 2-byte aligned Q8_0, Q4_0 and Q6_K.
 * Loads take the evict-first hint (__ldcs): weights are read once.
 *
 * Each type gives: slice(blk, j) -> raw registers (scales already
 * decoded); codes(raw, q): the slice's q-th group of 4 consecutive values
 * (q < Q = VPS / 4, a constant after unrolling) as 4 bytes, value = scale
 * * (byte - OFF) - min (FP8_B128: e4m3 bytes, OFF < 0); scale(raw, g) and, for types with MIN, minv(raw,
 * g) of scale group g = q / QG; at(j, q): where group q starts within the
 * block. lm_q_quad gives the values as lm_dequant_row does (the same f32
 * products in the same order: d * sub-scale first, then * q, minus the
 * min); the GEMV instead sums (byte - OFF) * x per scale group and scales
 * the sum once.
 *
 * FULL types get every GEMV kernel (1, 2, 4, 8 tokens, fused forms); the
 * others (Q4_1, Q5_0, Q5_1, IQ4_NL: in K-quant files only where a row is
 * not whole 256-value blocks; Q2_K, Q3_K, FP8_B128 and MLX's affine A4 / A8)
 * a 1- and an 8-token kernel, since each kernel adds machine code to every
 * binary.
 *
 * Bytes become floats through the exponent trick (2^23 + b as bits, minus
 * 2^23 + OFF: exact), one byte permute and one add: the int-to-float
 * conversion runs at a quarter of the f32 rate on sm_90 and would cap a
 * Q4_K GEMV near half the memory bandwidth. */
#ifndef LM_CUDA_QUANT_H
#define LM_CUDA_QUANT_H

#ifndef LM_QUANT_HOST_CHECK /* tests/host/cuda_quant_check.cpp compiles this file for the CPU */
#include "cuda_internal.h"

#include <cuda_fp16.h>
#endif

static __device__ __forceinline__ float lm_q_f16(unsigned short h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ float lm_q_f16_at(const unsigned char *p) {
    return lm_q_f16(__ldcs((const unsigned short *)p));
}

/* N 4-byte words from a 2-byte aligned address: aligned loads, joined by a
 * funnel shift when p sits mid-word (then one more word is loaded, which
 * holds 2 bytes past p + 4N: quantised weights are allocated with
 * LM_CUDA_QUANT_PAD bytes after their last block). */
template <int N> static __device__ __forceinline__ void lm_q_words(const unsigned char *p, unsigned (&out)[N]) {
    const unsigned *b = (const unsigned *)((uintptr_t)p & ~(uintptr_t)3);
    const unsigned sh = ((unsigned)(uintptr_t)p & 2u) * 8u;
    unsigned w[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = __ldcs(b + i);
    w[N] = sh ? __ldcs(b + N) : 0u;
#pragma unroll
    for (int i = 0; i < N; i++) out[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

/* Byte e of v, minus off, as a float: exact for bytes and 0 <= off <= 255. */
static __device__ __forceinline__ float lm_q_bytef(unsigned v, int e, float off) {
    return __int_as_float(__byte_perm(v, 0x4b000000u, (unsigned)e | 0x7440u)) - (8388608.0f + off);
}

/* Q4_K / Q5_K: the 6-bit scales and mins of sub-blocks 2g and 2g + 1 (one
 * byte each: sub-block 2g in byte 0) from the header's scale words y, z, w
 * (the 12 bytes lm_q4k_scale_min in dtype.c reads). As 16-bit pairs H[k] =
 * bytes 2k, 2k + 1: pair g < 2 has its scales in H[g] and mins in H[g + 2];
 * pair g >= 2 has the low 4 bits of both in H[g + 2] (scale low nibble, min
 * high nibble) and their top 2 bits in the top bits of H[g - 2] (scales)
 * and H[g] (mins). Every pair sits in half g & 1 of its word, so the
 * decode is selects and masks with no byte index (a thread's g is fixed:
 * its slice j = 2g + h repeats every block). */
static __device__ __forceinline__ void lm_q_k_pair(unsigned y, unsigned z, unsigned w, int g, unsigned *sc,
                                                   unsigned *mn) {
    const unsigned sh = 16u * (unsigned)(g & 1);
    const bool lo = g < 2;
    const unsigned pa = ((lo ? y : w) >> sh) & 0xffffu, pb = ((lo ? z : y) >> sh) & 0xffffu, pc = (z >> sh) & 0xffffu;
    *sc = lo ? (pa & 0x3f3fu) : ((pa & 0x0f0fu) | ((pb >> 2) & 0x3030u));
    *mn = lo ? (pb & 0x3f3fu) : (((pa >> 4) & 0x0f0fu) | ((pc >> 2) & 0x3030u));
}

/* Four IQ4 codes (a byte each, 0..15) -> their levels (lm_iq4nl_levels)
 * plus 128, a byte each: byte permutes of the table's four words. */
static __device__ __forceinline__ unsigned lm_q_iq4_levels(unsigned s) {
    const unsigned t0 = 0xbfad9881u, t1 = 0xf6eaddcfu, t2 = 0x26190d01u, t3 = 0x71594535u; /* little-endian words */
    const unsigned sel = (s & 7u) | ((s >> 4) & 0x70u) | ((s >> 8) & 0x700u) | ((s >> 12) & 0x7000u);
    const unsigned lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const unsigned m = ((s >> 3) & 0x01010101u) * 0xffu; /* 0xff in bytes whose code is >= 8 */
    return ((lo & ~m) | (hi & m)) ^ 0x80808080u; /* the signed levels, offset by 128 */
}

/* Bits b, b+1, b+2, b+3 of qh as bit 4 of four bytes (Q5_0 / Q5_1's fifth bits). */
static __device__ __forceinline__ unsigned lm_q_bit4s(unsigned qh, int b) {
    const unsigned h = (qh >> b) & 15u;
    return ((h & 1u) | ((h & 2u) << 7) | ((h & 4u) << 14) | ((h & 8u) << 21)) << 4;
}

template <lm_dtype QT> struct lm_q;

/* Q8_0: {f16 d; int8 qs[32]}; a slice is 16 values (2 a block). */
template <> struct lm_q<LM_Q8_0> {
    static constexpr int BV = 32, BB = 34, LPB = 2, Q = 4, QG = 4, OFF = 128;
    static constexpr bool MIN = false, FULL = true;
    struct raw {
        float d;
        unsigned q[4];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        raw r;
        lm_q_words<4>(blk + 2 + 16 * j, r.q);
        r.d = lm_q_f16_at(blk);
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) { return r.q[q] ^ 0x80808080u; }
    static __device__ __forceinline__ float scale(const raw &r, int) { return r.d; }
    static __device__ __forceinline__ float minv(const raw &, int) { return 0.0f; }
    static __device__ __forceinline__ int at(int j, int q) { return 16 * j + 4 * q; }
};

/* Q4_0: {f16 d; uint8 qs[16]}, value l < 16 the low nibble of qs[l], l + 16
 * its high nibble; slice j takes qs[8j, 8j + 8): values 8j.. and 16 + 8j.. */
template <> struct lm_q<LM_Q4_0> {
    static constexpr int BV = 32, BB = 18, LPB = 2, Q = 4, QG = 4, OFF = 8;
    static constexpr bool MIN = false, FULL = true;
    struct raw {
        float d;
        unsigned q[2];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        raw r;
        lm_q_words<2>(blk + 2 + 8 * j, r.q);
        r.d = lm_q_f16_at(blk);
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        return (q < 2 ? r.q[q] : r.q[q - 2] >> 4) & 0x0f0f0f0fu;
    }
    static __device__ __forceinline__ float scale(const raw &r, int) { return r.d; }
    static __device__ __forceinline__ float minv(const raw &, int) { return 0.0f; }
    static __device__ __forceinline__ int at(int j, int q) { return q < 2 ? 8 * j + 4 * q : 16 + 8 * j + 4 * (q - 2); }
};

/* The 32-value types below share Q4_0's slices: slice j takes qs[8j, 8j +
 * 8): values 8j.. (low nibbles) and 16 + 8j.. (high). A "+ m" block is a
 * min of -m: scale * q - (-m) is d * q + m exactly. */
static __device__ __forceinline__ int lm_q32_at(int j, int q) { return q < 2 ? 8 * j + 4 * q : 16 + 8 * j + 4 * (q - 2); }

/* A half (f16, or bf16 when BF: its bits << 16, exact) at p. */
template <bool BF> static __device__ __forceinline__ float lm_q_half_at(const unsigned char *p) {
    const unsigned short h = __ldcs((const unsigned short *)p);
    return BF ? __int_as_float((int)((unsigned)h << 16)) : lm_q_f16(h);
}

/* Q4_1: {f16 d; f16 m; uint8 qs[16]}, x = d * q + m; with BF, the same
 * with bf16 d and m (MLX's A4_BF16; A4_F16 is Q4_1 itself). */
template <bool BF> struct lm_q_min4 {
    static constexpr int BV = 32, BB = 20, LPB = 2, Q = 4, QG = 4, OFF = 0;
    static constexpr bool MIN = true, FULL = false;
    struct raw {
        float d, nm;
        unsigned q[2];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        raw r;
        lm_q_words<2>(blk + 4 + 8 * j, r.q);
        r.d = lm_q_half_at<BF>(blk), r.nm = -lm_q_half_at<BF>(blk + 2);
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        return (q < 2 ? r.q[q] : r.q[q - 2] >> 4) & 0x0f0f0f0fu;
    }
    static __device__ __forceinline__ float scale(const raw &r, int) { return r.d; }
    static __device__ __forceinline__ float minv(const raw &r, int) { return r.nm; }
    static __device__ __forceinline__ int at(int j, int q) { return lm_q32_at(j, q); }
};
template <> struct lm_q<LM_Q4_1> : lm_q_min4<false> {};

/* Q5_0: {f16 d; uint32 qh; uint8 qs[16]}: Q4_0's nibbles plus bit l of qh
 * as value l's fifth bit; x = d * (q - 16). */
template <> struct lm_q<LM_Q5_0> {
    static constexpr int BV = 32, BB = 22, LPB = 2, Q = 4, QG = 4, OFF = 16;
    static constexpr bool MIN = false, FULL = false;
    struct raw {
        float d;
        unsigned q[2], qh;
        int j;
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        raw r;
        unsigned h[1];
        lm_q_words<2>(blk + 6 + 8 * j, r.q);
        lm_q_words<1>(blk + 2, h);
        r.d = lm_q_f16_at(blk), r.qh = h[0], r.j = j;
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        return ((q < 2 ? r.q[q] : r.q[q - 2] >> 4) & 0x0f0f0f0fu) | lm_q_bit4s(r.qh, lm_q32_at(r.j, q));
    }
    static __device__ __forceinline__ float scale(const raw &r, int) { return r.d; }
    static __device__ __forceinline__ float minv(const raw &, int) { return 0.0f; }
    static __device__ __forceinline__ int at(int j, int q) { return lm_q32_at(j, q); }
};

/* Q5_1: {f16 d; f16 m; uint32 qh; uint8 qs[16]}, x = d * q + m (q as Q5_0's, unsigned). */
template <> struct lm_q<LM_Q5_1> {
    static constexpr int BV = 32, BB = 24, LPB = 2, Q = 4, QG = 4, OFF = 0;
    static constexpr bool MIN = true, FULL = false;
    struct raw {
        float d, nm;
        unsigned q[2], qh;
        int j;
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        raw r;
        unsigned h[1];
        lm_q_words<2>(blk + 8 + 8 * j, r.q);
        lm_q_words<1>(blk + 4, h);
        r.d = lm_q_f16_at(blk), r.nm = -lm_q_f16_at(blk + 2), r.qh = h[0], r.j = j;
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        return ((q < 2 ? r.q[q] : r.q[q - 2] >> 4) & 0x0f0f0f0fu) | lm_q_bit4s(r.qh, lm_q32_at(r.j, q));
    }
    static __device__ __forceinline__ float scale(const raw &r, int) { return r.d; }
    static __device__ __forceinline__ float minv(const raw &r, int) { return r.nm; }
    static __device__ __forceinline__ int at(int j, int q) { return lm_q32_at(j, q); }
};

/* IQ4_NL: {f16 d; uint8 qs[16]}, Q4_0's nibbles indexing the IQ4 levels. */
template <> struct lm_q<LM_IQ4_NL> {
    static constexpr int BV = 32, BB = 18, LPB = 2, Q = 4, QG = 4, OFF = 128;
    static constexpr bool MIN = false, FULL = false;
    struct raw {
        float d;
        unsigned q[2];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        raw r;
        lm_q_words<2>(blk + 2 + 8 * j, r.q);
        r.d = lm_q_f16_at(blk);
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        return lm_q_iq4_levels((q < 2 ? r.q[q] : r.q[q - 2] >> 4) & 0x0f0f0f0fu);
    }
    static __device__ __forceinline__ float scale(const raw &r, int) { return r.d; }
    static __device__ __forceinline__ float minv(const raw &, int) { return 0.0f; }
    static __device__ __forceinline__ int at(int j, int q) { return lm_q32_at(j, q); }
};

/* A Q4_K / Q5_K header (h: d, dmin, 12 scale bytes) -> sub-blocks 2g and
 * 2g + 1's scale d * sc and min dmin * m, the products lm_dequant_row forms. */
static __device__ __forceinline__ void lm_q_k_head(const uint4 &h, int g, float &d0, float &o0, float &d1, float &o1) {
    const float d = lm_q_f16((unsigned short)(h.x & 0xffffu)), dmin = lm_q_f16((unsigned short)(h.x >> 16));
    unsigned sc, mn;
    lm_q_k_pair(h.y, h.z, h.w, g, &sc, &mn);
    d0 = d * lm_q_bytef(sc, 0, 0.0f), d1 = d * lm_q_bytef(sc, 1, 0.0f);
    o0 = dmin * lm_q_bytef(mn, 0, 0.0f), o1 = dmin * lm_q_bytef(mn, 1, 0.0f);
}

/* Q4_K: {f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]}; qs[32g, 32g +
 * 32) holds sub-blocks 2g (low nibbles) and 2g + 1 (high). Slice j = 2g +
 * h takes qs[16j, 16j + 16): values 64g + 16h.. (low) and 64g + 32 + 16h..
 * (high). */
template <> struct lm_q<LM_Q4_K> {
    static constexpr int BV = 256, BB = 144, LPB = 8, Q = 8, QG = 4, OFF = 0;
    static constexpr bool MIN = true, FULL = true;
    struct raw {
        float d0, o0, d1, o1;
        unsigned q[4];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        const uint4 h = __ldcs((const uint4 *)blk), v = __ldcs((const uint4 *)(blk + 16) + j);
        raw r;
        lm_q_k_head(h, j >> 1, r.d0, r.o0, r.d1, r.o1);
        r.q[0] = v.x, r.q[1] = v.y, r.q[2] = v.z, r.q[3] = v.w;
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        return (q < 4 ? r.q[q] : r.q[q - 4] >> 4) & 0x0f0f0f0fu;
    }
    static __device__ __forceinline__ float scale(const raw &r, int g) { return g ? r.d1 : r.d0; }
    static __device__ __forceinline__ float minv(const raw &r, int g) { return g ? r.o1 : r.o0; }
    static __device__ __forceinline__ int at(int j, int q) {
        return 64 * (j >> 1) + 16 * (j & 1) + (q < 4 ? 4 * q : 32 + 4 * (q - 4));
    }
};

/* Q5_K: Q4_K's header and nibbles (qs at byte 48) plus qh[32] at byte 16:
 * value l of sub-block pair g adds 16 when bit 2g (low) or 2g + 1 (high)
 * of qh[l] is set. Slice j = 2g + h reads qh[16h, 16h + 16). */
template <> struct lm_q<LM_Q5_K> {
    static constexpr int BV = 256, BB = 176, LPB = 8, Q = 8, QG = 4, OFF = 0;
    static constexpr bool MIN = true, FULL = true;
    struct raw {
        float d0, o0, d1, o1;
        unsigned q[4], hb[4];
        int g;
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        const uint4 h = __ldcs((const uint4 *)blk), qh = __ldcs((const uint4 *)(blk + 16) + (j & 1));
        const uint4 v = __ldcs((const uint4 *)(blk + 48) + j);
        raw r;
        r.g = j >> 1;
        lm_q_k_head(h, r.g, r.d0, r.o0, r.d1, r.o1);
        r.q[0] = v.x, r.q[1] = v.y, r.q[2] = v.z, r.q[3] = v.w;
        r.hb[0] = qh.x, r.hb[1] = qh.y, r.hb[2] = qh.z, r.hb[3] = qh.w;
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        const bool lo = q < 4;
        const int k = lo ? q : q - 4;
        return ((lo ? r.q[k] : r.q[k] >> 4) & 0x0f0f0f0fu) | (((r.hb[k] >> (2 * r.g + (lo ? 0 : 1))) & 0x01010101u) << 4);
    }
    static __device__ __forceinline__ float scale(const raw &r, int g) { return g ? r.d1 : r.d0; }
    static __device__ __forceinline__ float minv(const raw &r, int g) { return g ? r.o1 : r.o0; }
    static __device__ __forceinline__ int at(int j, int q) { return lm_q<LM_Q4_K>::at(j, q); }
};

/* IQ4_XS: {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}; slice j is
 * sub-block j (values 32j.. : low nibbles of qs[16j..], then high), level
 * lm_iq4nl_levels[code] times d * (ls - 32). The 16 levels are looked up
 * four at a time with byte permutes of the table's four words. */
template <> struct lm_q<LM_IQ4_XS> {
    static constexpr int BV = 256, BB = 136, LPB = 8, Q = 8, QG = 8, OFF = 128;
    static constexpr bool MIN = false, FULL = true;
    struct raw {
        float dl;
        unsigned q[4];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        const uint2 h = __ldcs((const uint2 *)blk);
        const uint2 a = __ldcs((const uint2 *)(blk + 8 + 16 * j)), b = __ldcs((const uint2 *)(blk + 16 + 16 * j));
        raw r;
        const unsigned sh = h.x >> 16;
        const int ls = (int)(((h.y >> (4 * j)) & 15u) | (((sh >> (2 * j)) & 3u) << 4));
        r.dl = lm_q_f16((unsigned short)(h.x & 0xffffu)) * (float)(ls - 32);
        r.q[0] = a.x, r.q[1] = a.y, r.q[2] = b.x, r.q[3] = b.y;
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        return lm_q_iq4_levels((q < 4 ? r.q[q] : r.q[q - 4] >> 4) & 0x0f0f0f0fu);
    }
    static __device__ __forceinline__ float scale(const raw &r, int) { return r.dl; }
    static __device__ __forceinline__ float minv(const raw &, int) { return 0.0f; }
    static __device__ __forceinline__ int at(int j, int q) { return 32 * j + 4 * q; }
};

/* Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}. Half h of 128
 * values: for l < 32, values l + 32m (m = 0..3) take the low nibble of
 * ql[64h + l] (m = 0), of ql[64h + 32 + l] (1), their high nibbles (2, 3),
 * bits 2m, 2m + 1 of qh[32h + l], scale scales[8h + l / 16 + 2m]. Slice j
 * = 4h + i takes l in [8i, 8i + 8) for all four m. */
template <> struct lm_q<LM_Q6_K> {
    static constexpr int BV = 256, BB = 210, LPB = 8, Q = 8, QG = 2, OFF = 32;
    static constexpr bool MIN = false, FULL = true;
    struct raw {
        float ds[4];
        unsigned a[2], b[2], hb[2];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        const int h = j >> 2, i = j & 3;
        raw r;
        unsigned sc[2];
        lm_q_words<2>(blk + 64 * h + 8 * i, r.a);
        lm_q_words<2>(blk + 64 * h + 32 + 8 * i, r.b);
        lm_q_words<2>(blk + 128 + 32 * h + 8 * i, r.hb);
        lm_q_words<2>(blk + 192 + 8 * h, sc);
        const float d = lm_q_f16_at(blk + 208);
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int k = (i >> 1) + 2 * m; /* byte of the 8 scales of this half */
            r.ds[m] = d * (float)(signed char)(sc[k >> 2] >> (8 * (k & 3)));
        }
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        const int m = q >> 1, e = q & 1;
        const unsigned src = (m & 1) ? r.b[e] : r.a[e];
        return ((m < 2 ? src : src >> 4) & 0x0f0f0f0fu) | (((r.hb[e] >> (2 * m)) & 0x03030303u) << 4);
    }
    static __device__ __forceinline__ float scale(const raw &r, int g) { return r.ds[g]; }
    static __device__ __forceinline__ float minv(const raw &, int) { return 0.0f; }
    static __device__ __forceinline__ int at(int j, int q) { return 128 * (j >> 2) + 8 * (j & 3) + 32 * (q >> 1) + 4 * (q & 1); }
};

/* Q2_K: {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}; value v = 128h + 32k
 * + l has the 2-bit code (qs[32h + l] >> 2k) & 3 and the scale byte
 * scales[v / 16] (low nibble scale, high nibble min): x = d * sc * q - dmin
 * * m. Slice j = 4h + i takes l in [8i, 8i + 8) for all four k (Q6_K's
 * slicing): 8 bytes of qs, a scale group a k (two quads). Blocks of 84
 * bytes keep every word 4-byte aligned. */
template <> struct lm_q<LM_Q2_K> {
    static constexpr int BV = 256, BB = 84, LPB = 8, Q = 8, QG = 2, OFF = 0;
    static constexpr bool MIN = true, FULL = false;
    struct raw {
        float ds[4], ms[4];
        unsigned q[2];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        const int h = j >> 2, i = j & 3;
        raw r;
        const unsigned *qs = (const unsigned *)(blk + 16 + 32 * h + 8 * i);
        r.q[0] = __ldcs(qs), r.q[1] = __ldcs(qs + 1);
        const unsigned *sw = (const unsigned *)(blk + 8 * h); /* scales[8h .. 8h + 8): k's byte 2k + i / 2 */
        const unsigned s0 = __ldcs(sw), s1 = __ldcs(sw + 1), dd = __ldcs((const unsigned *)(blk + 80));
        const float d = lm_q_f16((unsigned short)(dd & 0xffffu)), dmin = lm_q_f16((unsigned short)(dd >> 16));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int b = 2 * k + (i >> 1);
            const unsigned sc = ((b < 4 ? s0 : s1) >> (8 * (b & 3))) & 0xffu;
            r.ds[k] = d * lm_q_bytef(sc & 15u, 0, 0.0f), r.ms[k] = dmin * lm_q_bytef(sc >> 4, 0, 0.0f);
        }
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) { return (r.q[q & 1] >> (2 * (q >> 1))) & 0x03030303u; }
    static __device__ __forceinline__ float scale(const raw &r, int g) { return r.ds[g]; }
    static __device__ __forceinline__ float minv(const raw &r, int g) { return r.ms[g]; }
    static __device__ __forceinline__ int at(int j, int q) { return 128 * (j >> 2) + 32 * (q >> 1) + 8 * (j & 3) + 4 * (q & 1); }
};

/* Q3_K: {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}; value v = 128h +
 * 32k + l has Q2_K's code q2 and the bit (hmask[l] >> (4h + k)) & 1 (clear:
 * q = q2 - 4, set: q2), x = d * (scale[v / 16] - 32) * q: the code byte is
 * q2 + 4 * bit (OFF 4). Slices as Q2_K's. The 16 six-bit scales: the low
 * nibble of scale n is nibble n / 8 of byte n % 8, its top 2 bits bits
 * 2(n / 4) of byte 8 + n % 4 (lm_q3k_scale in dtype.c). Blocks of 110
 * bytes: words joined by funnel shifts. */
template <> struct lm_q<LM_Q3_K> {
    static constexpr int BV = 256, BB = 110, LPB = 8, Q = 8, QG = 2, OFF = 4;
    static constexpr bool MIN = false, FULL = false;
    struct raw {
        float ds[4];
        unsigned q[2], hb[2];
        int hs;
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        const int h = j >> 2, i = j & 3;
        raw r;
        unsigned sc[3];
        lm_q_words<2>(blk + 32 + 32 * h + 8 * i, r.q);
        lm_q_words<2>(blk + 8 * i, r.hb);
        lm_q_words<3>(blk + 96, sc);
        const float d = lm_q_f16_at(blk + 108);
        r.hs = 4 * h;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int n = 8 * h + 2 * k + (i >> 1), lo = n & 7, hi = 8 + (n & 3);
            const unsigned lw = lo < 4 ? sc[0] : sc[1], hw = sc[2];
            const unsigned v = ((lw >> (8 * (lo & 3) + 4 * (n >> 3))) & 15u) | (((hw >> (8 * (hi & 3) + 2 * (n >> 2))) & 3u) << 4);
            r.ds[k] = d * lm_q_bytef(v, 0, 32.0f);
        }
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) {
        const int k = q >> 1, e = q & 1;
        return ((r.q[e] >> (2 * k)) & 0x03030303u) | (((r.hb[e] >> (r.hs + k)) & 0x01010101u) << 2);
    }
    static __device__ __forceinline__ float scale(const raw &r, int g) { return r.ds[g]; }
    static __device__ __forceinline__ float minv(const raw &, int) { return 0.0f; }
    static __device__ __forceinline__ int at(int j, int q) { return lm_q<LM_Q2_K>::at(j, q); }
};

/* FP8_B128 (Hugging Face FP8, repacked at load): {f32 scale; e4m3 q[128]},
 * x = scale * q; slice j takes q[16j, 16j + 16). Its codes are e4m3 bytes,
 * not integers (OFF < 0): lm_q_vals reads each as the f16 with the same
 * sign, exponent and mantissa bits placed 7 bits up (S.EEEE.MMM ->
 * S.0EEEE.MMM0000000), which is the e4m3 value / 256 exactly, subnormals
 * included; the scale carries the 256 (scale * 256 * (q / 256) rounds as
 * scale * q: both factors scale by powers of two). S.1111.111, NaN in e4m3
 * and never a weight, reads as 480. */
template <> struct lm_q<LM_FP8_B128> {
    static constexpr int BV = 128, BB = 132, LPB = 8, Q = 4, QG = 4, OFF = -1;
    static constexpr bool MIN = false, FULL = false;
    struct raw {
        float d;
        unsigned q[4];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        raw r;
        const unsigned *p = (const unsigned *)(blk + 4 + 16 * j); /* blocks are 4-byte aligned */
#pragma unroll
        for (int i = 0; i < 4; i++) r.q[i] = __ldcs(p + i);
        r.d = __ldcs((const float *)blk) * 256.0f;
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) { return r.q[q]; }
    static __device__ __forceinline__ float scale(const raw &r, int) { return r.d; }
    static __device__ __forceinline__ float minv(const raw &, int) { return 0.0f; }
    static __device__ __forceinline__ int at(int j, int q) { return 16 * j + 4 * q; }
};

/* MLX affine blocks (lm_dtype.h): {scale s; bias b; codes}, x = s * q + b:
 * a min of -b, as Q4_1's "+ m". A4 is Q4_1's layout (its nibbles and a
 * 4-byte header); A8 holds 32 unsigned bytes, 2 slices of 16 as Q8_0's.
 * The _F16 types have f16 s and b, the _BF16 ones bf16. */
template <> struct lm_q<LM_A4_F16> : lm_q_min4<false> {};
template <> struct lm_q<LM_A4_BF16> : lm_q_min4<true> {};
template <bool BF> struct lm_q_a8 {
    static constexpr int BV = 32, BB = 36, LPB = 2, Q = 4, QG = 4, OFF = 0;
    static constexpr bool MIN = true, FULL = false;
    struct raw {
        float d, nm;
        unsigned q[4];
    };
    static __device__ __forceinline__ raw slice(const unsigned char *blk, int j) {
        raw r;
        lm_q_words<4>(blk + 4 + 16 * j, r.q);
        r.d = lm_q_half_at<BF>(blk), r.nm = -lm_q_half_at<BF>(blk + 2);
        return r;
    }
    static __device__ __forceinline__ unsigned codes(const raw &r, int q) { return r.q[q]; }
    static __device__ __forceinline__ float scale(const raw &r, int) { return r.d; }
    static __device__ __forceinline__ float minv(const raw &r, int) { return r.nm; }
    static __device__ __forceinline__ int at(int j, int q) { return 16 * j + 4 * q; }
};
template <> struct lm_q<LM_A8_F16> : lm_q_a8<false> {};
template <> struct lm_q<LM_A8_BF16> : lm_q_a8<true> {};

/* Four e4m3 bytes as floats / 256 (lm_q<LM_FP8_B128>): two bytes at a time
 * placed as f16 bit patterns by a byte permute, a mask and a shift. */
static __device__ __forceinline__ void lm_q_e4m3x4(unsigned v, float (&f)[4]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const unsigned u = __byte_perm(v, 0u, h ? 0x3424u : 0x1404u); /* bytes 2h, 2h + 1 at bits 8 and 24 */
        const unsigned p = (u & 0x80008000u) | ((u >> 1) & 0x3f803f80u);
        f[2 * h] = lm_q_f16((unsigned short)(p & 0xffffu)), f[2 * h + 1] = lm_q_f16((unsigned short)(p >> 16));
    }
}

/* The slice's q-th 4 values (byte - OFF) as floats (e4m3 codes: / 256). */
template <class Q>
static __device__ __forceinline__ void lm_q_vals(const typename Q::raw &r, int q, float (&f)[4]) {
    const unsigned v = Q::codes(r, q);
    if constexpr (Q::OFF < 0) {
        lm_q_e4m3x4(v, f);
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) f[e] = lm_q_bytef(v, e, (float)Q::OFF);
    }
}

/* The slice's q-th 4 values as lm_dequant_row computes them: scale * value
 * (- min), each product rounded before the subtraction. */
template <class Q>
static __device__ __forceinline__ void lm_q_quad(const typename Q::raw &r, int q, float (&w)[4]) {
    float f[4];
    lm_q_vals<Q>(r, q, f);
    const float s = Q::scale(r, q / Q::QG);
#pragma unroll
    for (int e = 0; e < 4; e++) w[e] = Q::MIN ? __fsub_rn(__fmul_rn(s, f[e]), Q::minv(r, q / Q::QG)) : __fmul_rn(s, f[e]);
}

/* ---- int8 activations (the dp4a GEMV, cuda_qgemv.cu) ----------------------------------- */

/* sum of four u8 codes times four s8 values, plus c (dp4a, unsigned a with signed b). */
static __device__ __forceinline__ int lm_q_dp4a_us(unsigned a, int b, int c) {
#ifdef LM_QUANT_HOST_CHECK
    for (int e = 0; e < 4; e++) c += (int)((a >> (8 * e)) & 0xffu) * (int)(signed char)(b >> (8 * e));
    return c;
#else
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

/* Four values times inv, rounded to the nearest integer (|v * inv| <= 127),
 * as four s8 bytes: adding 1.5 * 2^23 leaves the rounded integer in the low
 * mantissa bits (two's complement in the low byte), so no float-to-int
 * conversion (a quarter of the f32 rate). */
static __device__ __forceinline__ int lm_q_pack_s8(float a, float b, float c, float d, float inv) {
    const float m = 12582912.0f;
    const unsigned ua = __float_as_uint(fmaf(a, inv, m)), ub = __float_as_uint(fmaf(b, inv, m));
    const unsigned uc = __float_as_uint(fmaf(c, inv, m)), ud = __float_as_uint(fmaf(d, inv, m));
    return (int)__byte_perm(__byte_perm(ua, ub, 0x0040u), __byte_perm(uc, ud, 0x0040u), 0x5410u);
}

/* An int of magnitude < 2^22 as a float without the conversion unit. */
static __device__ __forceinline__ float lm_q_i2f(int v) {
    return __int_as_float(0x4b400000 + v) - 12582912.0f;
}

/* One slice's activations as int8 for the dp4a GEMV: the Q::Q groups of 4
 * values at Q::at(j, q) of one block's x (xb) scaled by their largest
 * magnitude to s8 (xi; value ~ xi * dx), and per scale group the sum of
 * the s8 values (isx, for the offset and the min). */
template <class Q> struct lm_q_x8 {
    int xi[Q::Q], isx[Q::Q / Q::QG];
    float dx;
};

template <class Q> static __device__ __forceinline__ lm_q_x8<Q> lm_q_quant_x(const float *xb, int j) {
    lm_q_x8<Q> r;
    float4 xv[Q::Q];
    float amax = 0.0f;
#pragma unroll
    for (int q = 0; q < Q::Q; q++) {
        xv[q] = *(const float4 *)(xb + Q::at(j, q));
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(xv[q].x), fabsf(xv[q].y)), fmaxf(fabsf(xv[q].z), fabsf(xv[q].w))));
    }
    const float inv = amax > 0.0f ? __fdividef(127.0f, amax) : 0.0f;
    r.dx = amax * (1.0f / 127.0f);
#pragma unroll
    for (int q = 0; q < Q::Q; q++) r.xi[q] = lm_q_pack_s8(xv[q].x, xv[q].y, xv[q].z, xv[q].w, inv);
#pragma unroll
    for (int g = 0; g < Q::Q / Q::QG; g++) {
        r.isx[g] = 0;
#pragma unroll
        for (int qi = 0; qi < Q::QG; qi++) r.isx[g] = __dp4a(r.xi[g * Q::QG + qi], 0x01010101, r.isx[g]);
    }
    return r;
}

/* acc + the slice's dot product with x8: per scale group the integer sum
 * of (code - OFF) * xi by dp4a, times scale * dx (minus min * dx * isx). */
template <class Q>
static __device__ __forceinline__ float lm_q_dot_i8(const typename Q::raw &v, const lm_q_x8<Q> &x8, float acc) {
#pragma unroll
    for (int g = 0; g < Q::Q / Q::QG; g++) {
        int is = -Q::OFF * x8.isx[g];
#pragma unroll
        for (int qi = 0; qi < Q::QG; qi++) is = lm_q_dp4a_us(Q::codes(v, g * Q::QG + qi), x8.xi[g * Q::QG + qi], is);
        acc = fmaf(Q::scale(v, g) * x8.dx, lm_q_i2f(is), acc);
        if constexpr (Q::MIN) acc = fmaf(-Q::minv(v, g) * x8.dx, lm_q_i2f(x8.isx[g]), acc);
    }
    return acc;
}

#endif
