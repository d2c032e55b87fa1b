/* cpu.h - which SIMD instruction sets the running CPU (and OS) supports, in the groups hotmoe's
 * kernel files are compiled for: *_avx2.c with AVX2+FMA+F16C+BMI2, *_avx512.c with AVX-512
 * F/BW/VL/DQ/VNNI on top. One place, so that every dispatcher asks the same question. */
#ifndef HM_BASE_CPU_H
#define HM_BASE_CPU_H

int hm_cpu_has_avx2(void);   /* AVX2, FMA, F16C, BMI2 */
int hm_cpu_has_avx512(void); /* hm_cpu_has_avx2() and AVX-512 F, BW, VL, DQ, VNNI */

#endif
