/* cpu_qdot_vnni.c - the int8 GEMV for AVX-512 VNNI (vpdpbusd on ymm).
 *
 * The kernels are in cpu_qdot_x86.h, shared with the AVX2 build; compiled
 * with -mavx512vnni -mavx512vl (see CMakeLists.txt: files named *_vnni.c)
 * and only entered when lm_cpu_has_avx512_vnni() said yes. */
#define LM_QD_VNNI 1
#include "cpu_qdot_x86.h"
#include "cpu_qblock.h"

const lm_cpu_qkern lm_cpu_qkern_vnni = { .name = "avx512-vnni", LM_QD_TABLE,
                                        .qgemm = lm_qgemm_vnni, .qgemm_mr = LM_QGEMM_VNNI_MR,
                                        .qpanel_pack = lm_qpanel_pack_avx512,
                                        .q8x_quantize = lm_q8x_quantize_avx512 };
