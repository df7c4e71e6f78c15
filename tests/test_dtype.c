/* test_dtype.c - type table, half-float conversion and dequantisers.
 *
 * Two kinds of checks for each quantised type: exact values from hand-built
 * blocks, with the expected value of every element derived here straight from
 * the block layout (indices computed per element, not by mirroring the
 * decoder's loops), and dequant(quant(x)) against x within the error the
 * format allows, using a small reference quantiser written for the test. */
#include "lm_test.h"

#include "backend/lm_dtype.h"

#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* Deterministic pseudo-random floats in [-1, 1). */
static float rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* Smallest f16 that is >= v (v > 0), so scales never shrink when stored. */
static uint16_t f16_ceil(float v) {
    uint16_t h = lm_f32_to_f16(v);
    if (lm_f16_to_f32(h) < v) h++;
    return h;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- type table ------------------------------------------------------------ */

LM_TEST(dtype_table) {
    LM_CHECK(strcmp(lm_dtype_name(LM_F32), "F32") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_BF16), "BF16") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_Q4_K), "Q4_K") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_Q6_K), "Q6_K") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_I32), "I32") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_Q5_K), "Q5_K") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_IQ4_XS), "IQ4_XS") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_Q4_1), "Q4_1") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_Q5_0), "Q5_0") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_Q5_1), "Q5_1") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_IQ4_NL), "IQ4_NL") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_Q2_K), "Q2_K") == 0);
    LM_CHECK(strcmp(lm_dtype_name(LM_Q3_K), "Q3_K") == 0);
    /* by name, not by position: types are appended by several branches */
    static const int blk[LM_DTYPE_COUNT] = {
        [LM_F32] = 1,      [LM_F16] = 1,      [LM_BF16] = 1,     [LM_Q8_0] = 32,     [LM_Q4_0] = 32,
        [LM_Q4_K] = 256,   [LM_Q6_K] = 256,   [LM_Q5_K] = 256,   [LM_IQ4_XS] = 256,  [LM_Q4_1] = 32,
        [LM_Q5_0] = 32,    [LM_Q5_1] = 32,    [LM_IQ4_NL] = 32,  [LM_Q2_K] = 256,    [LM_Q3_K] = 256,
        [LM_FP8_B128] = 128, [LM_A4_BF16] = 32, [LM_A4_F16] = 32, [LM_A8_BF16] = 32, [LM_A8_F16] = 32,
        [LM_I32] = 1,
    };
    static const int bytes[LM_DTYPE_COUNT] = {
        [LM_F32] = 4,      [LM_F16] = 2,      [LM_BF16] = 2,     [LM_Q8_0] = 34,     [LM_Q4_0] = 18,
        [LM_Q4_K] = 144,   [LM_Q6_K] = 210,   [LM_Q5_K] = 176,   [LM_IQ4_XS] = 136,  [LM_Q4_1] = 20,
        [LM_Q5_0] = 22,    [LM_Q5_1] = 24,    [LM_IQ4_NL] = 18,  [LM_Q2_K] = 84,     [LM_Q3_K] = 110,
        [LM_FP8_B128] = 132, [LM_A4_BF16] = 20, [LM_A4_F16] = 20, [LM_A8_BF16] = 36, [LM_A8_F16] = 36,
        [LM_I32] = 4,
    };
    for (int t = 0; t < LM_DTYPE_COUNT; t++) {
        LM_CHECK(lm_dtype_block((lm_dtype)t) == blk[t]);
        LM_CHECK(lm_dtype_block_bytes((lm_dtype)t) == bytes[t]);
        LM_CHECK(lm_dtype_is_quant((lm_dtype)t) == (blk[t] > 1));
    }
    LM_CHECK(lm_dtype_row_bytes(LM_F32, 7) == 28);
    LM_CHECK(lm_dtype_row_bytes(LM_BF16, 3) == 6);
    LM_CHECK(lm_dtype_row_bytes(LM_Q8_0, 64) == 68);
    LM_CHECK(lm_dtype_row_bytes(LM_Q4_0, 96) == 54);
    LM_CHECK(lm_dtype_row_bytes(LM_Q4_K, 512) == 288);
    LM_CHECK(lm_dtype_row_bytes(LM_Q6_K, 768) == 630);
    LM_CHECK(lm_dtype_row_bytes(LM_Q6_K, 0) == 0);
}

/* ---- half floats ------------------------------------------------------------- */

LM_TEST(dtype_f16_known_values) {
    LM_CHECK(lm_f32_to_f16(0.0f) == 0x0000);
    LM_CHECK(lm_f32_to_f16(-0.0f) == 0x8000);
    LM_CHECK(lm_f32_to_f16(1.0f) == 0x3c00);
    LM_CHECK(lm_f32_to_f16(-2.0f) == 0xc000);
    LM_CHECK(lm_f32_to_f16(0.5f) == 0x3800);
    LM_CHECK(lm_f32_to_f16(65504.0f) == 0x7bff);     /* largest finite */
    LM_CHECK(lm_f32_to_f16(65519.0f) == 0x7bff);     /* below the midpoint */
    LM_CHECK(lm_f32_to_f16(65520.0f) == 0x7c00);     /* midpoint: ties to even = inf */
    LM_CHECK(lm_f32_to_f16(1e10f) == 0x7c00);
    LM_CHECK(lm_f32_to_f16(-1e10f) == 0xfc00);
    LM_CHECK(lm_f32_to_f16(INFINITY) == 0x7c00);
    LM_CHECK(lm_f32_to_f16(-INFINITY) == 0xfc00);
    uint16_t n = lm_f32_to_f16(NAN);
    LM_CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
    LM_CHECK(isnan(lm_f16_to_f32(0x7e00)) && isnan(lm_f16_to_f32(0xfc01)));
    LM_CHECK(lm_f16_to_f32(0x7c00) == INFINITY && lm_f16_to_f32(0xfc00) == -INFINITY);
    /* subnormals */
    LM_CHECK(lm_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    LM_CHECK(lm_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    LM_CHECK(lm_f16_to_f32(0x0400) == ldexpf(1.0f, -14));
    LM_CHECK(lm_f16_to_f32(0x8001) == -ldexpf(1.0f, -24));
    LM_CHECK(lm_f32_to_f16(ldexpf(1.0f, -24)) == 0x0001);
    LM_CHECK(lm_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000);             /* tie to even (0) */
    LM_CHECK(lm_f32_to_f16(ldexpf(1.0001f, -25)) == 0x0001);          /* just above the tie */
    LM_CHECK(lm_f32_to_f16(ldexpf(3.0f, -25)) == 0x0002);             /* tie to even (2) */
    LM_CHECK(lm_f32_to_f16(ldexpf(1.0f, -30)) == 0x0000);
    LM_CHECK(lm_f32_to_f16(-ldexpf(1.0f, -30)) == 0x8000);
    LM_CHECK(lm_f32_to_f16(ldexpf(2047.0f, -25)) == 0x0400);          /* rounds up into normal */
    /* round to nearest even in the normal range */
    LM_CHECK(lm_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00);
    LM_CHECK(lm_f32_to_f16(1.0f + ldexpf(3.0f, -11)) == 0x3c02);
    LM_CHECK(lm_f32_to_f16(1.0f + ldexpf(1.0f, -12)) == 0x3c00);
}

/* Every half round-trips through f32. */
LM_TEST(dtype_f16_roundtrip_all) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = lm_f16_to_f32((uint16_t)h);
        bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan) {
            bad += !isnan(f);
        } else {
            bad += lm_f32_to_f16(f) != h;
        }
    }
    LM_CHECK_MSG(bad == 0, "%d halves did not round-trip", bad);
}

/* Rounding at every boundary between adjacent positive halves: the exact
 * midpoint goes to the even one, the floats either side of it to the nearer. */
LM_TEST(dtype_f16_rounding_boundaries) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double lo = lm_f16_to_f32((uint16_t)h);
        double hi = h == 0x7bff ? 65536.0 : lm_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2); /* exact: halves have 11 significant bits */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        bad += lm_f32_to_f16(mid) != even;
        bad += lm_f32_to_f16(nextafterf(mid, 0.0f)) != h;
        bad += lm_f32_to_f16(nextafterf(mid, INFINITY)) != h + 1;
        bad += lm_f32_to_f16(-mid) != (0x8000 | even);
    }
    LM_CHECK_MSG(bad == 0, "%d rounding mistakes", bad);
}

LM_TEST(dtype_bf16_helpers) {
    LM_CHECK(lm_f32_to_bf16(1.0f) == 0x3f80);
    LM_CHECK(lm_bf16_to_f32(0x3f80) == 1.0f);
    LM_CHECK(lm_f32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80); /* tie to even */
    LM_CHECK(lm_f32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82);
    LM_CHECK(isnan(lm_bf16_to_f32(lm_f32_to_bf16(NAN))));
}

/* ---- plain types --------------------------------------------------------------- */

LM_TEST(dtype_dequant_plain) {
    float out[4];
    uint8_t buf[16];
    float f[4] = { 1.5f, -2.25f, 0.0f, 1e-3f };
    memcpy(buf, f, sizeof f);
    lm_dequant_row(LM_F32, buf, out, 4);
    LM_CHECK(memcmp(out, f, sizeof f) == 0);

    uint16_t h[4] = { 0x3c00, 0xc000, 0x0001, 0x7bff };
    memcpy(buf, h, sizeof h);
    lm_dequant_row(LM_F16, buf, out, 4);
    LM_CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == ldexpf(1.0f, -24) && out[3] == 65504.0f);

    uint16_t b[4] = { 0x3f80, 0xc040, 0x0000, 0x4049 };
    memcpy(buf, b, sizeof b);
    lm_dequant_row(LM_BF16, buf, out, 4);
    LM_CHECK(out[0] == 1.0f && out[1] == -3.0f && out[2] == 0.0f && f32_bits(out[3]) == 0x40490000u);

    int32_t i[4] = { 0, -7, 123456, INT32_MIN };
    memcpy(buf, i, sizeof i);
    lm_dequant_row(LM_I32, buf, out, 4);
    LM_CHECK(out[0] == 0.0f && out[1] == -7.0f && out[2] == 123456.0f && out[3] == -2147483648.0f);

    /* unaligned source inside a byte buffer */
    uint8_t odd[17];
    memcpy(odd + 1, f, sizeof f);
    lm_dequant_row(LM_F32, odd + 1, out, 4);
    LM_CHECK(memcmp(out, f, sizeof f) == 0);
}

/* ---- hand-built blocks ------------------------------------------------------------ */

LM_TEST(dtype_q8_0_exact) {
    uint8_t blk[2 * 34];
    for (int b = 0; b < 2; b++) {
        put16(blk + 34 * b, b ? 0xb000 : 0x3000); /* d = 0.125, then -0.125 */
        for (int j = 0; j < 32; j++) blk[34 * b + 2 + j] = (uint8_t)(int8_t)(j * 8 - 128 + b);
    }
    float out[64];
    lm_dequant_row(LM_Q8_0, blk, out, 64);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 32; j++) {
            float want = (b ? -0.125f : 0.125f) * (float)(j * 8 - 128 + b);
            LM_CHECK(out[32 * b + j] == want);
        }
}

LM_TEST(dtype_q4_0_exact) {
    uint8_t blk[18];
    put16(blk, 0x3800); /* d = 0.5 */
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    float out[32];
    lm_dequant_row(LM_Q4_0, blk, out, 32);
    for (int e = 0; e < 32; e++) {
        /* element e: low nibble of byte e (e < 16), high nibble of byte e-16 */
        int q = e < 16 ? e : 15 - (e - 16);
        LM_CHECK(out[e] == 0.5f * (float)(q - 8));
    }
}

/* Scales / mins of the hand-built Q4_K block, decoded by hand from
 * scales[] = {0x41,2,3,4, 0x85,6,7,8, 0x21,0x43,0x65,0x87}:
 * j<4: scale = scales[j] & 63, min = scales[j+4] & 63;
 * j>=4: scale = low nibble of scales[j+4] | top 2 bits of scales[j-4] << 4,
 *       min = high nibble of scales[j+4] | top 2 bits of scales[j] << 4. */
static const uint8_t q4k_scales[12] = { 0x41, 2, 3, 4, 0x85, 6, 7, 8, 0x21, 0x43, 0x65, 0x87 };
static const int q4k_sc[8] = { 1, 2, 3, 4, 17, 3, 5, 7 };
static const int q4k_m[8] = { 5, 6, 7, 8, 34, 4, 6, 8 };

/* Q5_K: the Q4_K block's scales and nibbles, qs after 32 bytes of qh; value
 * l of sub-block j gains 16 when bit j of qh[l] is set. */
LM_TEST(dtype_q5_k_exact) {
    uint8_t blk[176];
    put16(blk, 0x3c00);     /* d = 1 */
    put16(blk + 2, 0x3800); /* dmin = 0.5 */
    memcpy(blk + 4, q4k_scales, 12);
    for (int i = 0; i < 32; i++) blk[16 + i] = (uint8_t)(i * 53 + 7);
    for (int i = 0; i < 128; i++) blk[48 + i] = (uint8_t)(i * 37 + 11);
    float out[256];
    lm_dequant_row(LM_Q5_K, blk, out, 256);
    for (int v = 0; v < 256; v++) {
        int byte = 32 * (v / 64) + v % 32, sb = v / 32;
        int q = (v % 64) < 32 ? blk[48 + byte] & 15 : blk[48 + byte] >> 4;
        q += ((blk[16 + v % 32] >> sb) & 1) * 16;
        float want = 1.0f * (float)q4k_sc[sb] * (float)q - 0.5f * (float)q4k_m[sb];
        LM_CHECK_MSG(out[v] == want, "v=%d got %g want %g", v, out[v], want);
    }
}

LM_TEST(dtype_q4_k_exact) {
    uint8_t blk[144];
    put16(blk, 0x3c00);     /* d = 1 */
    put16(blk + 2, 0x3800); /* dmin = 0.5 */
    memcpy(blk + 4, q4k_scales, 12);
    for (int i = 0; i < 128; i++) blk[16 + i] = (uint8_t)(i * 37 + 11);
    float out[256];
    lm_dequant_row(LM_Q4_K, blk, out, 256);
    for (int v = 0; v < 256; v++) {
        /* 64 values per 32 bytes of qs: the first 32 from low nibbles,
         * the next 32 from high nibbles of the same bytes */
        int byte = 32 * (v / 64) + v % 32;
        int q = (v % 64) < 32 ? blk[16 + byte] & 15 : blk[16 + byte] >> 4;
        int sb = v / 32;
        float want = 1.0f * (float)q4k_sc[sb] * (float)q - 0.5f * (float)q4k_m[sb];
        LM_CHECK_MSG(out[v] == want, "v=%d got %g want %g", v, out[v], want);
    }
}

LM_TEST(dtype_q6_k_exact) {
    uint8_t blk[2 * 210];
    for (int b = 0; b < 2; b++) {
        uint8_t *p = blk + 210 * b;
        for (int i = 0; i < 128; i++) p[i] = (uint8_t)(i * 29 + 3 + b);
        for (int i = 0; i < 64; i++) p[128 + i] = (uint8_t)(i * 53 + 7);
        for (int i = 0; i < 16; i++) p[192 + i] = (uint8_t)(int8_t)((i - 8) * (b ? 9 : 5));
        put16(p + 208, b ? 0x3400 : 0xb800); /* d = 0.25, -0.5 */
    }
    float out[512];
    lm_dequant_row(LM_Q6_K, blk, out, 512);
    for (int b = 0; b < 2; b++) {
        const uint8_t *p = blk + 210 * b;
        float d = b ? 0.25f : -0.5f;
        for (int v = 0; v < 256; v++) {
            int h = v / 128, k = (v % 128) / 32, l = v % 32;
            /* low 4 bits: quarter k of the half takes ql[l] / ql[l+32]
             * low nibbles (k = 0, 1), then their high nibbles (k = 2, 3) */
            uint8_t ql = p[64 * h + l + 32 * (k & 1)];
            int lo = k < 2 ? ql & 15 : ql >> 4;
            int hi = (p[128 + 32 * h + l] >> (2 * k)) & 3;
            int sc = (int8_t)p[192 + v / 16];
            float want = d * (float)sc * (float)((lo | hi << 4) - 32);
            LM_CHECK_MSG(out[256 * b + v] == want, "b=%d v=%d got %g want %g", b, v, out[256 * b + v], want);
        }
    }
}

/* ---- reference quantisers and round trips -------------------------------------------- */

/* Q8_0: d = amax/127, q = round(x/d). Returns the largest allowed error. */
static float quant_q8_0(const float *x, uint8_t *blk) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    uint16_t hd = amax > 0 ? f16_ceil(amax / 127) : 0;
    float d = lm_f16_to_f32(hd);
    put16(blk, hd);
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)(d ? clampi((int)lrintf(x[j] / d), -127, 127) : 0);
    return 0.5f * d * 1.0001f;
}

/* Q4_0: d = (value of largest magnitude) / -8, so it maps to q = 0; values of
 * the other sign may clamp at q = 15, an error of up to one step. */
static float quant_q4_0(const float *x, uint8_t *blk) {
    float m = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > fabsf(m)) m = x[j];
    uint16_t hd = lm_f32_to_f16(m / -8);
    float d = lm_f16_to_f32(hd);
    put16(blk, hd);
    for (int j = 0; j < 16; j++) {
        int q0 = d ? clampi((int)lrintf(x[j] / d) + 8, 0, 15) : 8;
        int q1 = d ? clampi((int)lrintf(x[j + 16] / d) + 8, 0, 15) : 8;
        blk[2 + j] = (uint8_t)(q0 | q1 << 4);
    }
    return fabsf(d) * 1.01f;
}

/* Q4_K: per sub-block of 32, step s = (max - min)/15 and offset o = -min
 * (min taken <= 0); s and o are stored as 6-bit multiples of d and dmin.
 * Rounding the scale up and the offset up keeps every value in range up to
 * one dmin at the top. Returns the largest allowed error over the block. */
static float quant_q4_k(const float *x, uint8_t *blk) {
    float s[8], o[8], smax = 0, omax = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = -INFINITY;
        for (int l = 0; l < 32; l++) lo = fminf(lo, x[32 * j + l]), hi = fmaxf(hi, x[32 * j + l]);
        s[j] = (hi - lo) / 15;
        o[j] = -lo;
        smax = fmaxf(smax, s[j]);
        omax = fmaxf(omax, o[j]);
    }
    uint16_t hd = smax > 0 ? f16_ceil(smax / 63) : 0, hm = omax > 0 ? f16_ceil(omax / 63) : 0;
    float d = lm_f16_to_f32(hd), dmin = lm_f16_to_f32(hm), tol = 0;
    int sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = d ? clampi((int)ceilf(s[j] / d), 0, 63) : 0;
        m[j] = dmin ? clampi((int)ceilf(o[j] / dmin), 0, 63) : 0;
        tol = fmaxf(tol, 0.5f * d * (float)sc[j] + dmin);
    }
    put16(blk, hd);
    put16(blk + 2, hm);
    uint8_t *scales = blk + 4;
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    uint8_t *qs = blk + 16;
    memset(qs, 0, 128);
    for (int v = 0; v < 256; v++) {
        int j = v / 32;
        float step = d * (float)sc[j];
        int q = step > 0 ? clampi((int)lrintf((x[v] + dmin * (float)m[j]) / step), 0, 15) : 0;
        int byte = 32 * (v / 64) + v % 32;
        qs[byte] |= (uint8_t)((v % 64) < 32 ? q : q << 4);
    }
    return tol * 1.001f + 1e-6f;
}

/* Q6_K: per 16 values s = amax/31 as an int8 multiple of d; q in [-32, 31]. */
static float quant_q6_k(const float *x, uint8_t *blk) {
    float s[16], smax = 0, tol = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0;
        for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * j + l]));
        s[j] = amax / 31;
        smax = fmaxf(smax, s[j]);
    }
    uint16_t hd = smax > 0 ? f16_ceil(smax / 127) : 0;
    float d = lm_f16_to_f32(hd);
    int8_t *scales = (int8_t *)(blk + 192);
    for (int j = 0; j < 16; j++) {
        scales[j] = (int8_t)(d ? clampi((int)ceilf(s[j] / d), 0, 127) : 0);
        tol = fmaxf(tol, 0.5f * d * (float)scales[j]);
    }
    put16(blk + 208, hd);
    memset(blk, 0, 192);
    for (int v = 0; v < 256; v++) {
        float step = d * (float)scales[v / 16];
        int q = (step > 0 ? clampi((int)lrintf(x[v] / step), -32, 31) : 0) + 32;
        int h = v / 128, k = (v % 128) / 32, l = v % 32;
        blk[64 * h + l + 32 * (k & 1)] |= (uint8_t)(k < 2 ? (q & 15) : (q & 15) << 4);
        blk[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
    }
    return tol * 1.001f + 1e-6f;
}

typedef float (*quant_fn)(const float *x, uint8_t *blk);

/* Quantises n random rows (several blocks each, with varied magnitudes) and
 * checks every dequantised value against the quantiser's error bound. */
static int roundtrip(lm_dtype t, quant_fn q, uint64_t seed) {
    enum { NB = 4 };
    int blk = lm_dtype_block(t), bb = lm_dtype_block_bytes(t), bad = 0;
    float *x = malloc(sizeof(float) * (size_t)(blk * NB)), *y = malloc(sizeof(float) * (size_t)(blk * NB));
    uint8_t *data = malloc((size_t)(bb * NB));
    float tol[NB];
    for (int row = 0; row < 50; row++) {
        for (int b = 0; b < NB; b++) {
            float scale = ldexpf(1.0f, (row % 13) - 6) * (b + 1);
            bool positive = (row + b) % 5 == 0; /* exercises a zero min / one-sided blocks */
            for (int i = 0; i < blk; i++) {
                float r = rnd(&seed) * scale;
                x[b * blk + i] = positive ? fabsf(r) : r;
            }
            if (row == 7 && b == 1) memset(x + b * blk, 0, sizeof(float) * (size_t)blk); /* all zero */
            tol[b] = q(x + b * blk, data + b * bb);
        }
        lm_dequant_row(t, data, y, (int64_t)blk * NB);
        for (int i = 0; i < blk * NB; i++) {
            if (!(fabsf(y[i] - x[i]) <= tol[i / blk])) {
                if (bad < 5)
                    fprintf(stderr, "  %s row %d i %d: x=%g y=%g tol=%g\n", lm_dtype_name(t), row, i, x[i], y[i],
                            tol[i / blk]);
                bad++;
            }
        }
    }
    free(x);
    free(y);
    free(data);
    return bad;
}

LM_TEST(dtype_q8_0_roundtrip) { LM_CHECK(roundtrip(LM_Q8_0, quant_q8_0, 1) == 0); }
LM_TEST(dtype_q4_0_roundtrip) { LM_CHECK(roundtrip(LM_Q4_0, quant_q4_0, 2) == 0); }
LM_TEST(dtype_q4_k_roundtrip) { LM_CHECK(roundtrip(LM_Q4_K, quant_q4_k, 3) == 0); }
LM_TEST(dtype_q6_k_roundtrip) { LM_CHECK(roundtrip(LM_Q6_K, quant_q6_k, 4) == 0); }

/* The error bounds above are loose; also check the typical error is what the
 * bit width promises (catches a decoder that is merely "close"). */
LM_TEST(dtype_quant_rms_error) {
    static const struct { lm_dtype t; quant_fn q; float max_rel_rms; } cases[] = {
        { LM_Q8_0, quant_q8_0, 0.006f },
        { LM_Q4_0, quant_q4_0, 0.10f },
        { LM_Q4_K, quant_q4_k, 0.10f },
        { LM_Q6_K, quant_q6_k, 0.03f },
    };
    uint64_t seed = 99;
    for (size_t c = 0; c < LM_COUNT(cases); c++) {
        float x[256], y[256];
        uint8_t data[256 * 2];
        int blk = lm_dtype_block(cases[c].t), nb = 256 / blk;
        for (int i = 0; i < 256; i++) x[i] = rnd(&seed);
        for (int b = 0; b < nb; b++) cases[c].q(x + b * blk, data + b * lm_dtype_block_bytes(cases[c].t));
        lm_dequant_row(cases[c].t, data, y, 256);
        double se = 0, sx = 0;
        for (int i = 0; i < 256; i++) se += (double)(y[i] - x[i]) * (y[i] - x[i]), sx += (double)x[i] * x[i];
        double rel = sqrt(se / sx);
        LM_CHECK_MSG(rel <= cases[c].max_rel_rms, "%s: relative rms error %g", lm_dtype_name(cases[c].t), rel);
    }
}
