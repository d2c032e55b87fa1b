/* quant_simd_tables.h - internal: the two AVX-512 kernel tables behind quant_kernels_avx512().
 * quant_kernels_avx512() returns the VBMI one when the running CPU has AVX-512 VBMI (vpermb for
 * the 4-bit table lookups of mxfp4, iq4_nl, iq4_xs), else the plain one. Both give the same bits;
 * tests call each directly. */
#ifndef HM_QUANT_SIMD_TABLES_H
#define HM_QUANT_SIMD_TABLES_H

#include "quant/quant.h"

/* AVX-512 F/BW/VL/VNNI (quant_avx512.c). */
const quant_kernels *quant_kernels_avx512_plain(void);
/* ... plus VBMI (quant_vbmi_avx512.c); the caller checks that the CPU has VBMI. */
const quant_kernels *quant_kernels_avx512_vbmi(void);

#endif
