/* test_dtype_more_quants.c - known answers for the Q4_1, Q5_0, Q5_1, IQ4_NL,
 * Q2_K and Q3_K reference dequantisers (dtype.c).
 *
 * Each test builds blocks from chosen codes by packing every element where
 * the format puts it (the packing is written per element from the layout, not
 * by mirroring the decoder's loops), then checks every decoded value against
 * scale * code (+ offset) computed here. A few values are also spelled out as
 * literals worked out by hand from the raw bytes, so that a packer and a
 * decoder that agree on the same wrong layout still fail. */
#include "lm_test.h"

#include "backend/lm_dtype.h"

#include <string.h>

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* Element e (0..31) of a 32-value block's nibbles: low nibble of byte e for
 * e < 16, high nibble of byte e - 16 otherwise. */
static void put_nibble(uint8_t *qs, int e, int v) {
    if (e < 16) qs[e] = (uint8_t)((qs[e] & 0xf0) | (v & 15));
    else qs[e - 16] = (uint8_t)((qs[e - 16] & 0x0f) | ((v & 15) << 4));
}

/* Codes used below: a fixed permutation-like pattern over the value range. */
static int code_at(int e, int range, int salt) { return (e * 7 + salt * 3 + e / 5) % range; }

LM_TEST(dtype_q4_1_exact) {
    uint8_t blk[2 * 20] = { 0 };
    for (int b = 0; b < 2; b++) {
        put16(blk + 20 * b, b ? 0xb400 : 0x3800);     /* d = 0.5, then -0.25 */
        put16(blk + 20 * b + 2, b ? 0x4000 : 0xbc00); /* m = -1, then 2 */
        for (int e = 0; e < 32; e++) put_nibble(blk + 20 * b + 4, e, code_at(e, 16, b));
    }
    float out[64];
    lm_dequant_row(LM_Q4_1, blk, out, 64);
    for (int b = 0; b < 2; b++)
        for (int e = 0; e < 32; e++) {
            float want = (b ? -0.25f : 0.5f) * (float)code_at(e, 16, b) + (b ? 2.0f : -1.0f);
            LM_CHECK_MSG(out[32 * b + e] == want, "b=%d e=%d got %g want %g", b, e, out[32 * b + e], want);
        }
    /* by hand: byte 4 = codes 0 (low) and code_at(16) = (112 + 3) % 16 = 3 (high) */
    LM_CHECK(blk[4] == 0x30 && out[0] == -1.0f && out[16] == 0.5f);
}

/* Q5_0 / Q5_1: element e's fifth bit is bit e of the 32-bit qh. */
static void put_q5(uint8_t *qh, uint8_t *qs, int e, int v) {
    put_nibble(qs, e, v);
    if (v & 16) qh[e / 8] |= (uint8_t)(1u << (e % 8));
}

LM_TEST(dtype_q5_0_exact) {
    uint8_t blk[2 * 22] = { 0 };
    for (int b = 0; b < 2; b++) {
        uint8_t *p = blk + 22 * b;
        put16(p, b ? 0x3400 : 0xb800); /* d = -0.5, then 0.25 */
        for (int e = 0; e < 32; e++) put_q5(p + 2, p + 6, e, code_at(e, 32, b));
    }
    float out[64];
    lm_dequant_row(LM_Q5_0, blk, out, 64);
    for (int b = 0; b < 2; b++)
        for (int e = 0; e < 32; e++) {
            float want = (b ? 0.25f : -0.5f) * (float)(code_at(e, 32, b) - 16);
            LM_CHECK_MSG(out[32 * b + e] == want, "b=%d e=%d got %g want %g", b, e, out[32 * b + e], want);
        }
    /* by hand, block 0: code_at(31) = (217 + 6) % 32 = 31: nibble 15 in the
     * high half of qs[15], bit 7 of qh[3]; x = -0.5 * 15 */
    LM_CHECK((blk[6 + 15] >> 4) == 15 && (blk[2 + 3] & 0x80) && out[31] == -7.5f);
    /* code 0 (element 0): -0.5 * -16 */
    LM_CHECK(out[0] == 8.0f);
}

LM_TEST(dtype_q5_1_exact) {
    uint8_t blk[2 * 24] = { 0 };
    for (int b = 0; b < 2; b++) {
        uint8_t *p = blk + 24 * b;
        put16(p, b ? 0x3c00 : 0x3000);     /* d = 0.125, then 1 */
        put16(p + 2, b ? 0xc200 : 0x3c00); /* m = 1, then -3 */
        for (int e = 0; e < 32; e++) put_q5(p + 4, p + 8, e, code_at(e, 32, b + 5));
    }
    float out[64];
    lm_dequant_row(LM_Q5_1, blk, out, 64);
    for (int b = 0; b < 2; b++)
        for (int e = 0; e < 32; e++) {
            float want = (b ? 1.0f : 0.125f) * (float)code_at(e, 32, b + 5) + (b ? -3.0f : 1.0f);
            LM_CHECK_MSG(out[32 * b + e] == want, "b=%d e=%d got %g want %g", b, e, out[32 * b + e], want);
        }
    /* by hand, block 1, element 0: code 18 -> 18 - 3 */
    LM_CHECK(out[32] == 15.0f);
}

LM_TEST(dtype_iq4_nl_exact) {
    uint8_t blk[2 * 18] = { 0 };
    for (int b = 0; b < 2; b++) {
        put16(blk + 18 * b, b ? 0xb800 : 0x2c00); /* d = 1/16, then -0.5 */
        for (int e = 0; e < 32; e++) put_nibble(blk + 18 * b + 2, e, code_at(e, 16, b + 2));
    }
    float out[64];
    lm_dequant_row(LM_IQ4_NL, blk, out, 64);
    for (int b = 0; b < 2; b++)
        for (int e = 0; e < 32; e++) {
            float want = (b ? -0.5f : 0.0625f) * (float)lm_iq4nl_levels[code_at(e, 16, b + 2)];
            LM_CHECK_MSG(out[32 * b + e] == want, "b=%d e=%d got %g want %g", b, e, out[32 * b + e], want);
        }
    /* by hand: block 0 element 0 is code 6, the level -22; block 1 element 0
     * code 9, level 13 */
    LM_CHECK(out[0] == -22.0f / 16.0f && out[32] == -6.5f);
}

/* Q2_K and Q3_K keep value v = 128h + 32k + l (h < 2, k < 4, l < 32) in bits
 * 2k, 2k+1 of qs[32h + l]; Q3_K's third bit is bit 4h + k of hmask[l]. */
static void put_2bit(uint8_t *qs, int v, int q) {
    int h = v / 128, k = (v / 32) % 4, l = v % 32;
    qs[32 * h + l] |= (uint8_t)((q & 3) << (2 * k));
}

LM_TEST(dtype_q2_k_exact) {
    uint8_t blk[84] = { 0 };
    int sc[16], mn[16];
    for (int i = 0; i < 16; i++) {
        sc[i] = (i * 5 + 3) % 16;
        mn[i] = (i * 11 + 1) % 16;
        blk[i] = (uint8_t)(sc[i] | mn[i] << 4);
    }
    for (int v = 0; v < 256; v++) put_2bit(blk + 16, v, code_at(v, 4, 1));
    put16(blk + 80, 0x3800); /* d = 0.5 */
    put16(blk + 82, 0x3400); /* dmin = 0.25 */
    float out[256];
    lm_dequant_row(LM_Q2_K, blk, out, 256);
    for (int v = 0; v < 256; v++) {
        float want = 0.5f * (float)sc[v / 16] * (float)code_at(v, 4, 1) - 0.25f * (float)mn[v / 16];
        LM_CHECK_MSG(out[v] == want, "v=%d got %g want %g", v, out[v], want);
    }
    /* by hand: v = 200 is h 1, k 2, l 8: bits 4-5 of qs[40]; code (1400 + 3
     * + 40) % 4 = 3; scales[12] = 0x5f: scale 15, min 5 -> 0.5*15*3 - 1.25 */
    LM_CHECK(((blk[16 + 40] >> 4) & 3) == 3 && blk[12] == 0x5f && out[200] == 21.25f);
}

/* Q3_K's 16 six-bit scales into 12 bytes: low nibble of scale i in nibble
 * i / 8 of byte i % 8, top two bits in bits 2(i / 4) of byte 8 + i % 4. */
static void put_q3k_scale(uint8_t *sc, int i, int v) {
    sc[i % 8] |= (uint8_t)((v & 15) << (4 * (i / 8)));
    sc[8 + i % 4] |= (uint8_t)((v >> 4) << (2 * (i / 4)));
}

LM_TEST(dtype_q3_k_exact) {
    uint8_t blk[2 * 110] = { 0 };
    int sc[2][16];
    for (int b = 0; b < 2; b++) {
        uint8_t *p = blk + 110 * b;
        for (int i = 0; i < 16; i++) {
            sc[b][i] = (i * 23 + 9 + 31 * b) % 64; /* the stored 6 bits; the scale is this - 32 */
            put_q3k_scale(p + 96, i, sc[b][i]);
        }
        for (int v = 0; v < 256; v++) {
            int q = code_at(v, 8, b) - 4; /* -4..3 */
            put_2bit(p + 32, v, q & 3);
            if (q >= 0) p[v % 32] |= (uint8_t)(1u << (v / 32)); /* high bit set: no -4 */
        }
        put16(p + 108, b ? 0xb000 : 0x3c00); /* d = 1, then -0.125 */
    }
    float out[512];
    lm_dequant_row(LM_Q3_K, blk, out, 512);
    for (int b = 0; b < 2; b++)
        for (int v = 0; v < 256; v++) {
            float want = (b ? -0.125f : 1.0f) * (float)(sc[b][v / 16] - 32) * (float)(code_at(v, 8, b) - 4);
            LM_CHECK_MSG(out[256 * b + v] == want, "b=%d v=%d got %g want %g", b, v, out[256 * b + v], want);
        }
    /* by hand, block 0: scale 15 is stored as 23*15+9 = 354 % 64 = 34 =
     * 0b100010: low nibble 2 in the high nibble of byte 7, top bits 2 in bits
     * 6-7 of byte 11. v = 255 (h 1, k 3, l 31): code (1785 + 51) % 8 = 4 -> q 0;
     * v = 250: code (1750 + 50) % 8 = 0 -> q -4: 1 * (34 - 32) * -4 */
    LM_CHECK((blk[96 + 7] >> 4) == 2 && (blk[96 + 11] >> 6) == 2);
    LM_CHECK(out[255] == 0.0f && out[250] == -8.0f);
    /* v = 250's high bit (bit 7 of hmask[26]) is clear, v = 255's is set */
    LM_CHECK(!(blk[26] & 0x80) && (blk[31] & 0x80));
}
