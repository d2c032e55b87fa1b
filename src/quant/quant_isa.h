/* quant_isa.h - internal: the SIMD kernel tables that quant.c dispatches to.
 *
 * Each is defined in its own file, compiled with that ISA's flags (CMake matches the file name):
 *   quant_avx2.c   -> quant_kernels_avx2()    (AVX2 + FMA + F16C)
 *   quant_avx512.c -> quant_kernels_avx512()  (AVX-512 F/BW/VL/VNNI)
 * Each returns its constant table, or NULL when this build lacks support for the ISA. They do NOT
 * check the running CPU: quant_kernels_get() does that (__builtin_cpu_supports) before calling. */
#ifndef HM_QUANT_QUANT_ISA_H
#define HM_QUANT_QUANT_ISA_H

#include "quant/quant.h"

const quant_kernels *quant_kernels_avx2(void);
const quant_kernels *quant_kernels_avx512(void);

#endif
