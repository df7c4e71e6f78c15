/* cpu_qblock.h - quantised weight blocks as the int8 GEMM (prefill) reads them.
 *
 * Design: the int8 GEMM sees every quant type the same way, per 32-value
 * block of a row: unsigned 8-bit codes u[32] and, for each half of 16 values,
 * a scale and an offset, so that the weight is
 *     w_i = sc[i / 16] * u_i - off[i / 16].
 * With the activation block rounded to q8x (x_i ~ d * q_i, cpu_kern.h), a
 * block's dot product is d * sum_h (sc_h * (u . q)_h - off_h * (sum q)_h):
 * integer dot products of codes, the rest in f32. Types whose two halves
 * share one scale and offset (all but Q6_K here) set `halves` false and the
 * kernel does one integer dot per block. A type plugs in with one pack
 * function (lm_qblock_types), which unpacks a row's run of blocks into the
 * panel; the codes come from the same decoders the int8 GEMV's portable
 * kernels use (cpu_qdot_scalar.c).
 *
 * The packed panel (lm_qpanel_pack) holds LM_QP_ROWS rows of a run of blocks,
 * one block after another, each LM_QP_BLOCK_BYTES:
 *     uint8 codes[8][LM_QP_ROWS][4]   values 4k..4k+3 of row r at [k][r]
 *     float sc[2][LM_QP_ROWS]         per half, then per row
 *     float off[2][LM_QP_ROWS]
 * so that one 64-byte load gives 16 rows x 4 consecutive values, the operand
 * of vpdpbusd, and the scales of 16 rows are one vector. Rows past the end
 * of the matrix have zero codes, scales and offsets. */
#ifndef LM_CPU_QBLOCK_H
#define LM_CPU_QBLOCK_H

#include "cpu_kern.h"

#define LM_QP_ROWS 32
#define LM_QP_CODES (32 * LM_QP_ROWS)
#define LM_QP_BLOCK_BYTES (LM_QP_CODES + 4 * LM_QP_ROWS * (int)sizeof(float))

/* Blocks b0 .. b0+nb-1 (32 values each) of the quant row `row` into row r
 * of the panel: codes, and sc/off per half. */
typedef void (*lm_qblock_pack_fn)(const uint8_t *row, int64_t b0, int nb, uint8_t *panel, int r);

typedef struct lm_qblock_type {
    lm_qblock_pack_fn pack; /* NULL: the int8 GEMM does not take this type */
    bool halves;                /* the halves have their own scale and offset */
    /* the largest code the packer writes: the AVX2 tile sums products in
     * 16 bits as long as this bound allows (test_cpu_qgemm checks it) */
    uint8_t max_code;
} lm_qblock_type;

extern const lm_qblock_type lm_qblock_types[LM_DTYPE_COUNT];

/* Blocks b0 .. b0+nb-1 of a K-quant row walked super-block by super-block
 * (BYTES each; a run may start and end inside one), for a packer's body:
 * i, the run's index of the super-block's first block here; sbo, the
 * super-block's byte offset in the row; blocks j0 .. j0+nj-1 of it. */
#define LM_QP_SUPER_RUN(BYTES, ...)                                     \
    for (int i = 0; i < nb;) {                                          \
        const int64_t sbo = ((b0 + i) / 8) * (BYTES);                   \
        const int j0 = (int)((b0 + i) % 8), nj = LM_MIN(8 - j0, nb - i); \
        __VA_ARGS__                                                     \
        i += nj;                                                        \
    }

/* Packs blocks b0 .. b0+nb-1 of nv <= LM_QP_ROWS rows (w: the first row,
 * ldw bytes per row) into panel (nb * LM_QP_BLOCK_BYTES, 64-byte aligned). */
void lm_qpanel_pack(lm_dtype t, const void *w, size_t ldw, int nv, int64_t b0, int nb, uint8_t *panel);
/* The same bytes, 16 rows at a time with AVX-512 for Q4_K, Q5_K, Q6_K and
 * Q8_0 (cpu_qblock_avx512.c); other types through lm_qpanel_pack. */
void lm_qpanel_pack_avx512(lm_dtype t, const void *w, size_t ldw, int nv, int64_t b0, int nb, uint8_t *panel);

/* Decoders of cpu_qdot_scalar.c: unsigned codes of one 32-value block
 * (Q8_0 and IQ4_XS shifted by +128); the K-quants take the super-block and
 * the block index j (0..7) in it. restrict lets -O2 vectorise them. */
void lm_qs_codes_q8_0(const uint8_t *restrict blk, uint8_t *restrict u);
void lm_qs_codes_q4_0(const uint8_t *restrict blk, uint8_t *restrict u);
void lm_qs_codes_q4_k(const uint8_t *restrict sb, int j, uint8_t *restrict u);
void lm_qs_codes_q5_k(const uint8_t *restrict sb, int j, uint8_t *restrict u);
void lm_qs_codes_iq4_xs(const uint8_t *restrict sb, int j, uint8_t *restrict u);
void lm_qs_codes_q6_k(const uint8_t *restrict sb, int j, uint8_t *restrict u);
/* IQ4_NL (levels + 128), Q5_0 / Q5_1 (nibbles at qs, fifth bits at qh),
 * Q2_K / Q3_K block j (Q3_K with hmask: q + 4); Q3_K's scale i with its -32. */
void lm_qs_codes_iq4_nl(const uint8_t *restrict blk, uint8_t *restrict u);
void lm_qs_codes_q5(const uint8_t *restrict qh, const uint8_t *restrict qs, uint8_t *restrict u);
void lm_qs_codes_q23_k(const uint8_t *restrict qs, const uint8_t *restrict hmask, int j, uint8_t *restrict u);
int lm_qs_q3k_scale(const uint8_t *sc, int i);

#endif
