/* fuzz_qblocks.c - libFuzzer harness for the quantised block decoders and the
 * int8-activation GEMV kernels.
 *
 * Design: byte 0 picks a quantised type, byte 1 the rows (1-4) and tokens
 * (1-4), the rest are the weight blocks, copied into an exact-size heap
 * buffer so that ASan reports any read past the last block. The f16 scale
 * fields are then bounded (exponent forced into 2^-5..2^2, sign and mantissa
 * kept) so the values stay finite; every other bit (codes, packed 4/6-bit
 * scales and mins, high-bit masks) is the fuzzer's. Each row is decoded with
 * lm_dequant_row and must be finite; the activations come from a generator
 * seeded by the input, are rounded to q8x, and every int8 table this CPU
 * runs must agree with the double-precision dot of the decoded weights and
 * the rounded activations. The kernels split each block into a scale part
 * and an offset part (mins, m, code offsets), which may cancel, so the bound
 * is taken from the largest term they can form: per 32 values, the block's
 * largest scale x 4096 (largest code x largest sub-scale) x sum |x|. */
#include "backend/cpu/cpu_kern.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const lm_dtype qb_types[] = { LM_Q8_0, LM_Q4_0, LM_Q4_K, LM_Q5_K, LM_Q6_K, LM_IQ4_XS,
                                     LM_Q4_1, LM_Q5_0, LM_Q5_1, LM_IQ4_NL, LM_Q2_K, LM_Q3_K };

/* Offsets of the f16 fields in a block of type t; returns their count. */
static int qb_f16_fields(lm_dtype t, int off[2]) {
    switch (t) {
    case LM_Q4_K: case LM_Q5_K: case LM_Q4_1: case LM_Q5_1: off[0] = 0, off[1] = 2; return 2;
    case LM_Q6_K: off[0] = 208; return 1;
    case LM_Q2_K: off[0] = 80, off[1] = 82; return 2;
    case LM_Q3_K: off[0] = 108; return 1;
    default: off[0] = 0; return 1;
    }
}

/* Forces an f16's exponent into 2^-5..2^2; returns its magnitude. */
static float qb_bound_f16(uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    h = (uint16_t)((h & 0x83ffu) | ((10u + ((h >> 10) & 7u)) << 10));
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
    return fabsf(lm_f16_to_f32(h));
}

static float qb_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    const lm_dtype t = qb_types[data[0] % LM_COUNT(qb_types)];
    const int nr = 1 + (data[1] & 3), nt = 1 + ((data[1] >> 2) & 3);
    const int blk = lm_dtype_block(t), bb = lm_dtype_block_bytes(t);
    int64_t nb = (int64_t)(size - 2) / (nr * bb);
    if (nb < 1) return 0;
    nb = nb > 64 ? 64 : nb;
    const int64_t n = nb * blk;
    const size_t rb = (size_t)nb * (size_t)bb;
    uint8_t *w = malloc(rb * (size_t)nr);
    memcpy(w, data + 2, rb * (size_t)nr);
    /* bound the scales; dmax[r][b]: the largest scale of row r's block b */
    float *dmax = malloc(sizeof(float) * (size_t)(nr * nb));
    int off[2], nf = qb_f16_fields(t, off);
    for (int r = 0; r < nr; r++)
        for (int64_t b = 0; b < nb; b++) {
            float m = 0;
            for (int f = 0; f < nf; f++) m = fmaxf(m, qb_bound_f16(w + (size_t)r * rb + (size_t)b * bb + off[f]));
            dmax[r * nb + b] = m;
        }
    float *wd = malloc(sizeof(float) * (size_t)(nr * n));
    for (int r = 0; r < nr; r++) {
        lm_dequant_row(t, w + (size_t)r * rb, wd + r * n, n);
        for (int64_t i = 0; i < n; i++) LM_ASSERT(isfinite(wd[r * n + i]));
    }
    /* activations: blocks of different magnitudes, from the input's bytes */
    uint64_t seed = size;
    for (size_t i = 0; i < size && i < 64; i++) seed = seed * 31 + data[i];
    float *x = malloc(sizeof(float) * (size_t)(nt * n));
    for (int64_t b = 0; b < nt * n / 32; b++) {
        float amp = powf(10.0f, -1.0f - qb_rnd(&seed));
        for (int i = 0; i < 32; i++) x[b * 32 + i] = amp * qb_rnd(&seed);
    }
    const size_t ldq = lm_q8x_row_bytes(n);
    void *xq = lm_xaligned(ldq * (size_t)nt);
    for (int k = 0; k < nt; k++) lm_q8x_quantize(x + k * n, n, (char *)xq + (size_t)k * ldq);
    const lm_cpu_qkern *tabs[3] = { &lm_cpu_qkern_scalar, NULL, NULL };
    if (lm_cpu_isa_detect() >= LM_ISA_AVX2) tabs[1] = &lm_cpu_qkern_avx2;
    if (lm_cpu_has_avx512_vnni()) tabs[2] = &lm_cpu_qkern_vnni;
    for (int k = 0; k < 3; k++) {
        if (!tabs[k]) continue;
        LM_ASSERT(tabs[k]->qgemv[t] != NULL);
        float y[LM_GEMV_MAX_TOKENS * LM_GEMV_MAX_ROWS];
        tabs[k]->qgemv[t](w, rb, nr, xq, ldq, nt, n, NULL, y, LM_GEMV_MAX_ROWS);
        for (int tk = 0; tk < nt; tk++) {
            const void *row = (const char *)xq + (size_t)tk * ldq;
            const int8_t *q = row;
            const float *dx = lm_q8x_d(row, n);
            for (int r = 0; r < nr; r++) {
                double ref = 0, bound = 0;
                for (int64_t i = 0; i < n; i++) {
                    double xv = (double)q[i] * dx[i / 32];
                    ref += (double)wd[r * n + i] * xv;
                    bound += 4096.0 * dmax[r * nb + i / blk] * fabs(xv);
                }
                double got = y[tk * LM_GEMV_MAX_ROWS + r];
                LM_ASSERT(isfinite(got) && fabs(got - ref) <= 1e-5 * bound + 1e-6);
            }
        }
    }
    lm_afree(xq);
    free(x);
    free(wd);
    free(dmax);
    free(w);
    return 0;
}
