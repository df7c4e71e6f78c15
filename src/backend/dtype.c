/* dtype.c - type table, scalar half-float conversion and reference dequantisers.
 *
 * Design: one static table describes each lm_dtype (name, values per block,
 * bytes per block). The dequantisers are plain portable C working block by
 * block on the GGUF/ggml block layouts, reading fields byte-wise so that
 * unaligned data inside a mapped file is fine. They are the reference the
 * faster kernels are tested against, so clarity wins over speed here.
 *
 * Half floats are converted with integer bit manipulation (exact, including
 * subnormals, infinities and NaN, round-to-nearest-even), so results do not
 * depend on the compiler or on F16C being present. */
#include "lm_dtype.h"
#include "dtype_hf.h"

#include <string.h>

typedef struct lm_dtype_info {
    const char *name;
    int block;
    int block_bytes;
} lm_dtype_info;

#define LM_QK 32   /* values per Q8_0 / Q4_0 block */
#define LM_QKK 256 /* values per K-quant super-block */

static const lm_dtype_info lm_dtype_table[LM_DTYPE_COUNT] = {
    [LM_F32] = { "F32", 1, 4 },
    [LM_F16] = { "F16", 1, 2 },
    [LM_BF16] = { "BF16", 1, 2 },
    [LM_Q8_0] = { "Q8_0", LM_QK, 2 + LM_QK },
    [LM_Q4_0] = { "Q4_0", LM_QK, 2 + LM_QK / 2 },
    [LM_Q4_K] = { "Q4_K", LM_QKK, 2 + 2 + 12 + LM_QKK / 2 },
    [LM_Q6_K] = { "Q6_K", LM_QKK, LM_QKK / 2 + LM_QKK / 4 + LM_QKK / 16 + 2 },
    [LM_Q5_K] = { "Q5_K", LM_QKK, 2 + 2 + 12 + LM_QKK / 8 + LM_QKK / 2 },
    [LM_IQ4_XS] = { "IQ4_XS", LM_QKK, 2 + 2 + 4 + LM_QKK / 2 },
    [LM_Q4_1] = { "Q4_1", LM_QK, 2 + 2 + LM_QK / 2 },
    [LM_Q5_0] = { "Q5_0", LM_QK, 2 + 4 + LM_QK / 2 },
    [LM_Q5_1] = { "Q5_1", LM_QK, 2 + 2 + 4 + LM_QK / 2 },
    [LM_IQ4_NL] = { "IQ4_NL", LM_QK, 2 + LM_QK / 2 },
    [LM_Q2_K] = { "Q2_K", LM_QKK, LM_QKK / 16 + LM_QKK / 4 + 2 + 2 },
    [LM_Q3_K] = { "Q3_K", LM_QKK, LM_QKK / 8 + LM_QKK / 4 + 12 + 2 },
    [LM_FP8_B128] = { "FP8_B128", LM_FP8_BLOCK, LM_FP8_BLOCK_BYTES },
    [LM_A4_BF16] = { "A4_BF16", LM_AFF_BLOCK, 4 + LM_AFF_BLOCK / 2 },
    [LM_A4_F16] = { "A4_F16", LM_AFF_BLOCK, 4 + LM_AFF_BLOCK / 2 },
    [LM_A8_BF16] = { "A8_BF16", LM_AFF_BLOCK, 4 + LM_AFF_BLOCK },
    [LM_A8_F16] = { "A8_F16", LM_AFF_BLOCK, 4 + LM_AFF_BLOCK },
    [LM_I32] = { "I32", 1, 4 },
};

static const lm_dtype_info *lm_dtype_get(lm_dtype t) {
    LM_ASSERT((unsigned)t < LM_DTYPE_COUNT);
    return &lm_dtype_table[t];
}

const char *lm_dtype_name(lm_dtype t) {
    if ((unsigned)t >= LM_DTYPE_COUNT) return "?";
    return lm_dtype_table[t].name;
}

int lm_dtype_block(lm_dtype t) { return lm_dtype_get(t)->block; }

int lm_dtype_block_bytes(lm_dtype t) { return lm_dtype_get(t)->block_bytes; }

size_t lm_dtype_row_bytes(lm_dtype t, int64_t n) {
    const lm_dtype_info *d = lm_dtype_get(t);
    LM_ASSERT(n >= 0 && n % d->block == 0);
    return (size_t)(n / d->block) * (size_t)d->block_bytes;
}

bool lm_dtype_is_quant(lm_dtype t) { return lm_dtype_get(t)->block > 1; }

/* ---- scalar conversions ---------------------------------------------- */

static float lm_bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t lm_f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

float lm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return lm_bits_to_f32(sign | 0x7f800000u | (mant << 13)); /* inf / nan */
    if (exp == 0) {
        if (mant == 0) return lm_bits_to_f32(sign); /* signed zero */
        /* Subnormal: normalise so the leading 1 reaches bit 10. */
        int e = -1;
        do {
            mant <<= 1;
            e++;
        } while (!(mant & 0x400u));
        return lm_bits_to_f32(sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13));
    }
    return lm_bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Shifts m right by s bits, rounding to nearest, ties to even. */
static uint32_t lm_shift_rne(uint32_t m, int s) {
    uint32_t q = m >> s;
    uint32_t rem = m & ((1u << s) - 1);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

uint16_t lm_f32_to_f16(float f) {
    uint32_t u = lm_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* quiet nan */
    if (a >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 65536 (or inf) */
    if (a >= 0x38800000u) {
        /* Normal half range: rebias the exponent; a mantissa carry from
         * rounding moves into the exponent, up to infinity, as it should. */
        uint32_t h = lm_shift_rne(a - (112u << 23), 13);
        return (uint16_t)(sign | (h >= 0x7c00u ? 0x7c00u : h));
    }
    if (a <= 0x33000000u) return sign; /* <= 2^-25 rounds to zero (tie to even) */
    /* Subnormal half: value / 2^-24 = mant * 2^(e-126). */
    uint32_t e = a >> 23;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | lm_shift_rne(mant, (int)(126 - e)));
}

/* ---- little-endian field reads ----------------------------------------- */

static uint16_t lm_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t lm_rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static float lm_rdh(const uint8_t *p) { return lm_f16_to_f32(lm_rd16(p)); }

/* ---- per-type dequantisers --------------------------------------------- */

static void lm_deq_f32(const uint8_t *s, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = lm_bits_to_f32(lm_rd32(s + 4 * i));
}

static void lm_deq_f16(const uint8_t *s, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = lm_rdh(s + 2 * i);
}

static void lm_deq_bf16(const uint8_t *s, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = lm_bf16_to_f32(lm_rd16(s + 2 * i));
}

static void lm_deq_i32(const uint8_t *s, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (float)(int32_t)lm_rd32(s + 4 * i);
}

/* Q8_0: {f16 d; int8 qs[32]}, x = d * q. */
static void lm_deq_q8_0(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 34, y += LM_QK) {
        float d = lm_rdh(s);
        for (int j = 0; j < LM_QK; j++) y[j] = d * (float)(int8_t)s[2 + j];
    }
}

/* Q4_0: {f16 d; uint8 qs[16]}, element j < 16 in the low nibble of qs[j],
 * element j + 16 in its high nibble; x = d * (q - 8). */
static void lm_deq_q4_0(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 18, y += LM_QK) {
        float d = lm_rdh(s);
        const uint8_t *qs = s + 2;
        for (int j = 0; j < LM_QK / 2; j++) {
            y[j] = d * (float)((qs[j] & 0x0f) - 8);
            y[j + LM_QK / 2] = d * (float)((qs[j] >> 4) - 8);
        }
    }
}

/* Q4_K sub-block j (0..7) scale and min, 6 bits each, packed in 12 bytes:
 * j < 4: low 6 bits of sc[j] (scale) and sc[j+4] (min); j >= 4: low nibble
 * (scale) / high nibble (min) of sc[j+4], with the top 2 bits taken from the
 * spare high bits of sc[j-4] (scale) and sc[j] (min). */
void lm_q4k_scale_min(int j, const uint8_t *sc, int *scale, int *min) {
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4);
        *min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

/* Q4_K: {f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]}; each 32 bytes of
 * qs hold two sub-blocks: low nibbles first, then high nibbles. */
static void lm_deq_q4_k(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 144) {
        float d = lm_rdh(s), dmin = lm_rdh(s + 2);
        const uint8_t *sc = s + 4, *qs = s + 16;
        for (int g = 0; g < 4; g++, qs += 32) {
            int s0, m0, s1, m1;
            lm_q4k_scale_min(2 * g, sc, &s0, &m0);
            lm_q4k_scale_min(2 * g + 1, sc, &s1, &m1);
            float d0 = d * (float)s0, o0 = dmin * (float)m0;
            float d1 = d * (float)s1, o1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) *y++ = d0 * (float)(qs[l] & 0x0f) - o0;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(qs[l] >> 4) - o1;
        }
    }
}

/* Q5_K: {f16 d; f16 dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}:
 * Q4_K's scales, mins and nibbles, plus a fifth bit: value l of block j
 * (0..7) adds 16 when bit j of qh[l] is set. */
static void lm_deq_q5_k(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 176) {
        float d = lm_rdh(s), dmin = lm_rdh(s + 2);
        const uint8_t *sc = s + 4, *qh = s + 16, *qs = s + 48;
        for (int g = 0; g < 4; g++, qs += 32) {
            int s0, m0, s1, m1;
            lm_q4k_scale_min(2 * g, sc, &s0, &m0);
            lm_q4k_scale_min(2 * g + 1, sc, &s1, &m1);
            float d0 = d * (float)s0, o0 = dmin * (float)m0;
            float d1 = d * (float)s1, o1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++)
                *y++ = d0 * (float)((qs[l] & 0x0f) | (((qh[l] >> (2 * g)) & 1) << 4)) - o0;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((qs[l] >> 4) | (((qh[l] >> (2 * g + 1)) & 1) << 4)) - o1;
        }
    }
}

/* The 16 non-uniform levels of IQ4_NL / IQ4_XS (a constant of the format). */
const int8_t lm_iq4nl_levels[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113 };

/* IQ4_XS: {f16 d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128]}. Block
 * j (0..7) of 32 values has the 6-bit scale ls = nibble j of scales_l (low
 * nibble first) | bits 2j, 2j+1 of scales_h << 4, and x = d * (ls - 32) *
 * level[code]; its codes are the 16 bytes qs[16j ..]: low nibbles give
 * values 0-15, high nibbles 16-31. */
static void lm_deq_iq4_xs(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 136) {
        float d = lm_rdh(s);
        unsigned sh = lm_rd16(s + 2);
        for (int j = 0; j < 8; j++, y += 32) {
            int ls = ((s[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (int)(((sh >> (2 * j)) & 3) << 4);
            float dl = d * (float)(ls - 32);
            const uint8_t *qs = s + 8 + 16 * j;
            for (int l = 0; l < 16; l++) {
                y[l] = dl * (float)lm_iq4nl_levels[qs[l] & 0x0f];
                y[l + 16] = dl * (float)lm_iq4nl_levels[qs[l] >> 4];
            }
        }
    }
}

/* Q6_K: {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d}. Each half of
 * 128 values uses 64 bytes of ql and 32 of qh; for l < 32 the four values
 * l, l+32, l+64, l+96 take low nibble of ql[l], low nibble of ql[l+32], high
 * nibble of ql[l], high nibble of ql[l+32], and bit pairs 0-1, 2-3, 4-5, 6-7
 * of qh[l]. One scale per 16 values; x = d * scale * (q - 32). */
static void lm_deq_q6_k(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 210) {
        const uint8_t *ql = s, *qh = s + 128;
        const int8_t *sc = (const int8_t *)(s + 192);
        float d = lm_rdh(s + 208);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q0 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q1 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is + 0] * (float)q0;
                y[l + 32] = d * (float)sc[is + 2] * (float)q1;
                y[l + 64] = d * (float)sc[is + 4] * (float)q2;
                y[l + 96] = d * (float)sc[is + 6] * (float)q3;
            }
        }
    }
}

/* Q4_1: {f16 d; f16 m; uint8 qs[16]}, nibbles as Q4_0; x = d * q + m. */
static void lm_deq_q4_1(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 20, y += LM_QK) {
        float d = lm_rdh(s), m = lm_rdh(s + 2);
        for (int j = 0; j < LM_QK / 2; j++) {
            y[j] = d * (float)(s[4 + j] & 0x0f) + m;
            y[j + LM_QK / 2] = d * (float)(s[4 + j] >> 4) + m;
        }
    }
}

/* The 5-bit code of element j (0..31) of a Q5_0 / Q5_1 block: its nibble
 * (as Q4_0) and bit j of the little-endian 32-bit qh as the fifth bit. */
static int lm_q5_code(const uint8_t *qs, uint32_t qh, int j) {
    int nib = j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
    return nib | (int)(((qh >> j) & 1u) << 4);
}

/* Q5_0: {f16 d; uint8 qh[4]; uint8 qs[16]}; x = d * (q - 16). */
static void lm_deq_q5_0(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 22, y += LM_QK) {
        float d = lm_rdh(s);
        uint32_t qh = lm_rd32(s + 2);
        for (int j = 0; j < LM_QK; j++) y[j] = d * (float)(lm_q5_code(s + 6, qh, j) - 16);
    }
}

/* Q5_1: {f16 d; f16 m; uint8 qh[4]; uint8 qs[16]}; x = d * q + m. */
static void lm_deq_q5_1(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 24, y += LM_QK) {
        float d = lm_rdh(s), m = lm_rdh(s + 2);
        uint32_t qh = lm_rd32(s + 4);
        for (int j = 0; j < LM_QK; j++) y[j] = d * (float)lm_q5_code(s + 8, qh, j) + m;
    }
}

/* IQ4_NL: {f16 d; uint8 qs[16]}, nibbles as Q4_0 index the IQ4 levels. */
static void lm_deq_iq4_nl(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 18, y += LM_QK) {
        float d = lm_rdh(s);
        for (int j = 0; j < LM_QK / 2; j++) {
            y[j] = d * (float)lm_iq4nl_levels[s[2 + j] & 0x0f];
            y[j + LM_QK / 2] = d * (float)lm_iq4nl_levels[s[2 + j] >> 4];
        }
    }
}

/* Q2_K: {uint8 scales[16]; uint8 qs[64]; f16 d; f16 dmin}. Value v = 128h +
 * 32k + l (h < 2, k < 4, l < 32) has the 2-bit code (qs[32h + l] >> 2k) & 3;
 * each 16 values v share scales[v / 16]: low nibble scale, high nibble min;
 * x = d * scale * q - dmin * min. */
static void lm_deq_q2_k(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 84, y += LM_QKK) {
        float d = lm_rdh(s + 80), dmin = lm_rdh(s + 82);
        for (int v = 0; v < LM_QKK; v++) {
            int q = (s[16 + 32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3;
            uint8_t sc = s[v / 16];
            y[v] = d * (float)(sc & 0x0f) * (float)q - dmin * (float)(sc >> 4);
        }
    }
}

/* Q3_K's 16 six-bit scales (before the -32), packed in 12 bytes: the low
 * nibble of scale i is nibble i / 8 of byte i % 8, its top 2 bits are bits
 * 2(i / 4), 2(i / 4) + 1 of byte 8 + i % 4. */
static int lm_q3k_scale(const uint8_t *sc, int i) {
    return ((sc[i % 8] >> (4 * (i / 8))) & 0x0f) | (((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4);
}

/* Q3_K: {uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; f16 d}. Value
 * v = 128h + 32k + l has Q2_K's 2-bit code q2 and the high bit
 * (hmask[l] >> (4h + k)) & 1; q = q2 - 4 when that bit is clear, else q2;
 * x = d * (scale[v / 16] - 32) * q. */
static void lm_deq_q3_k(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += 110, y += LM_QKK) {
        float d = lm_rdh(s + 108);
        for (int v = 0; v < LM_QKK; v++) {
            int q2 = (s[32 + 32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3;
            int hi = (s[v % 32] >> (v / 32)) & 1;
            y[v] = d * (float)(lm_q3k_scale(s + 96, v / 16) - 32) * (float)(q2 - (hi ? 0 : 4));
        }
    }
}

void lm_dequant_row(lm_dtype t, const void *src, float *dst, int64_t n) {
    int blk = lm_dtype_block(t);
    LM_ASSERT(n >= 0 && n % blk == 0);
    const uint8_t *s = src;
    int64_t nb = n / blk;
    switch (t) {
    case LM_F32: lm_deq_f32(s, dst, n); break;
    case LM_F16: lm_deq_f16(s, dst, n); break;
    case LM_BF16: lm_deq_bf16(s, dst, n); break;
    case LM_I32: lm_deq_i32(s, dst, n); break;
    case LM_Q8_0: lm_deq_q8_0(s, dst, nb); break;
    case LM_Q4_0: lm_deq_q4_0(s, dst, nb); break;
    case LM_Q4_K: lm_deq_q4_k(s, dst, nb); break;
    case LM_Q6_K: lm_deq_q6_k(s, dst, nb); break;
    case LM_Q5_K: lm_deq_q5_k(s, dst, nb); break;
    case LM_IQ4_XS: lm_deq_iq4_xs(s, dst, nb); break;
    case LM_Q4_1: lm_deq_q4_1(s, dst, nb); break;
    case LM_Q5_0: lm_deq_q5_0(s, dst, nb); break;
    case LM_Q5_1: lm_deq_q5_1(s, dst, nb); break;
    case LM_IQ4_NL: lm_deq_iq4_nl(s, dst, nb); break;
    case LM_Q2_K: lm_deq_q2_k(s, dst, nb); break;
    case LM_Q3_K: lm_deq_q3_k(s, dst, nb); break;
    case LM_FP8_B128: lm_dequant_fp8_b128(s, dst, nb); break;
    case LM_A4_BF16:
    case LM_A4_F16:
    case LM_A8_BF16:
    case LM_A8_F16: lm_dequant_affine(t, s, dst, nb); break;
    case LM_DTYPE_COUNT: LM_ASSERT(!"bad dtype"); break;
    }
}
