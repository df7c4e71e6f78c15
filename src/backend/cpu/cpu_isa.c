/* cpu_isa.c - which instruction sets this machine can run.
 *
 * __builtin_cpu_supports checks both the CPU and the OS (XSAVE state for
 * ymm/zmm registers). F16C is read from CPUID directly because older GCCs do
 * not know its name; we only trust it together with AVX2, whose check already
 * covers OS support of ymm state. This file is portable C: it must run, and
 * say no, on a CPU that has none of these. */
#include "cpu_kern.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static bool lm_cpu_has_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c >> 29) & 1u;
}

static bool lm_cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && lm_cpu_has_f16c();
}

static bool lm_cpu_has_avx512(void) {
    __builtin_cpu_init();
    return lm_cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
}

bool lm_cpu_has_avx512_vnni(void) {
    __builtin_cpu_init();
    return lm_cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
}
#else
bool lm_cpu_has_avx512_vnni(void) { return false; }
static bool lm_cpu_has_avx2(void) { return false; }
static bool lm_cpu_has_avx512(void) { return false; }
#endif

lm_cpu_isa lm_cpu_isa_detect(void) {
    if (lm_cpu_has_avx512()) return LM_ISA_AVX512;
    if (lm_cpu_has_avx2()) return LM_ISA_AVX2;
    return LM_ISA_SCALAR;
}

const char *lm_cpu_isa_name(lm_cpu_isa isa) {
    switch (isa) {
    case LM_ISA_AUTO: return "auto";
    case LM_ISA_SCALAR: return "scalar";
    case LM_ISA_AVX2: return "avx2";
    case LM_ISA_AVX512: return "avx512";
    }
    return "?";
}
