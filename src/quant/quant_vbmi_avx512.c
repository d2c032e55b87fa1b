/* quant_vbmi_avx512.c - the AVX-512 kernel table once more, with VBMI enabled: the 4-bit table
 * lookups (mxfp4, iq4_nl, iq4_xs) become one vpermb per 32 nibbles. Same bits as every table.
 * CMake gives this file the AVX-512 flags (name ends in _avx512.c); VBMI is added here (GCC).
 * Under other compilers the pragma is skipped and this table equals the plain one. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx512vbmi")
#endif
#include "quant/quant_simd_float.h"
#include "quant/quant_simd_tables.h"

SIMD_KERNEL_TABLE(k_avx512_vbmi, QUANT_ISA_AVX512, "avx512")

const quant_kernels *quant_kernels_avx512_vbmi(void) { return &k_avx512_vbmi; }
