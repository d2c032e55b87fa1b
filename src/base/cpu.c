#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "base/cpu.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <stdatomic.h>

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

static int detect_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c() &&
           has_bmi2();
}

static int detect_avx512(void) {
    return detect_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
}

/* cpuid is slow in a virtual machine (a VM exit per call) and the answer never changes: each
 * check runs once; -1 means not yet known. Racing first calls store the same value. */
static atomic_int g_avx2 = -1, g_avx512 = -1;

int hm_cpu_has_avx2(void) {
    int v = atomic_load_explicit(&g_avx2, memory_order_relaxed);
    if (v < 0) atomic_store_explicit(&g_avx2, v = detect_avx2(), memory_order_relaxed);
    return v;
}

int hm_cpu_has_avx512(void) {
    int v = atomic_load_explicit(&g_avx512, memory_order_relaxed);
    if (v < 0) atomic_store_explicit(&g_avx512, v = detect_avx512(), memory_order_relaxed);
    return v;
}
#else
int hm_cpu_has_avx2(void) { return 0; }
int hm_cpu_has_avx512(void) { return 0; }
#endif

uint64_t hm_ram_bytes(void) {
    const char *e = getenv("HOTMOE_RAM_MIB");
    if (e && *e) {
        char *end = NULL;
        unsigned long long mib = strtoull(e, &end, 10);
        if (end && *end == '\0') return (uint64_t)mib << 20;
    }
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

const char *hm_bytes_str(uint64_t bytes, char buf[32]) {
    if (bytes >= (1ull << 30)) snprintf(buf, 32, "%.2f GiB", bytes / 1073741824.0);
    else snprintf(buf, 32, "%.1f MiB", bytes / 1048576.0);
    return buf;
}

int hm_cpu_count_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) { /* fails beyond CPU_SETSIZE CPUs */
        const int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

const char *hm_cpu_threads_warning(int n_threads, char *buf, size_t n) {
    const int allowed = hm_cpu_count_allowed();
    if (n_threads <= allowed) return NULL;
    snprintf(buf, n, "-t %d exceeds the %d CPU%s this process may use; threads will share cores",
             n_threads, allowed, allowed == 1 ? "" : "s");
    return buf;
}
