/* cpu_qdot_avx2.c - the int8 GEMV for AVX2 (vpmaddubsw + vpmaddwd).
 *
 * The kernels are in cpu_qdot_x86.h, shared with the VNNI build; this file
 * only compiles them for AVX2 + FMA + F16C and names the table, with the
 * int8 GEMM tile and the q8x rounding of cpu_qgemm_avx2.c. */
#include "cpu_qdot_x86.h"

const lm_cpu_qkern lm_cpu_qkern_avx2 = { .name = "avx2", LM_QD_TABLE,
                                        .qgemm = lm_qgemm_avx2, .qgemm_mr = LM_QGEMM_AVX2_MR,
                                        .qgemm_max_code = LM_QGEMM_AVX2_MAX_CODE,
                                        .q8x_quantize = lm_q8x_quantize_avx2 };
