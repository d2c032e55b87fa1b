/* cpu.h - which SIMD instruction sets the running CPU (and OS) supports, in the groups hotmoe's
 * kernel files are compiled for: *_avx2.c with AVX2+FMA+F16C+BMI2, *_avx512.c with AVX-512
 * F/BW/VL/DQ/VNNI on top. One place, so that every dispatcher asks the same question. Also the
 * machine's RAM, for the loaders' size checks, and the CPUs the process may use, for the default
 * thread count. */
#ifndef HM_BASE_CPU_H
#define HM_BASE_CPU_H

int hm_cpu_has_avx2(void);   /* AVX2, FMA, F16C, BMI2 */
int hm_cpu_has_avx512(void); /* hm_cpu_has_avx2() and AVX-512 F, BW, VL, DQ, VNNI */

#include <stdint.h>
/* Physical RAM in bytes (0 if unknown). The environment variable HOTMOE_RAM_MIB replaces it, so
 * tests can check the "model needs N GiB of RAM" refusal on any machine. */
uint64_t hm_ram_bytes(void);
/* "17.28 GiB" or "8.4 MiB" (below 1 GiB) into buf; returns buf. */
const char *hm_bytes_str(uint64_t bytes, char buf[32]);

#include <stddef.h>
/* CPUs this process may run on (its affinity mask, e.g. taskset or a container's cpuset;
 * falls back to the online CPUs): the default thread count. At least 1. */
int hm_cpu_count_allowed(void);
/* NULL when n_threads <= hm_cpu_count_allowed(); otherwise a one-line warning in buf ("-t 20
 * exceeds the 16 CPUs this process may use; threads will share cores"), returned. */
const char *hm_cpu_threads_warning(int n_threads, char *buf, size_t n);

#endif
