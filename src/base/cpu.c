#include "base/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* F16C is CPUID.1:ECX bit 29; clang's __builtin_cpu_supports does not know the name. */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

/* BMI2 (pdep/pext) is CPUID.(7,0):EBX bit 8; the SIMD files are compiled with -mbmi2. */
static int has_bmi2(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 8));
}

int hm_cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c() &&
           has_bmi2();
}

int hm_cpu_has_avx512(void) {
    return hm_cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
}
#else
int hm_cpu_has_avx2(void) { return 0; }
int hm_cpu_has_avx512(void) { return 0; }
#endif
