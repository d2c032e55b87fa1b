/* quant_avx2.c - the AVX2 (+FMA, F16C) kernel table: every supported type is vectorised.
 *
 * DESIGN: the kernels live in quant_simd_*.h and are compiled twice, here with AVX2 flags and in
 * quant_avx512.c with AVX-512 VNNI (which swaps pmaddubsw+pmaddwd for vpdpbusd / vpdpwssd).
 * Bit-identity with quant_dot_ref follows from the scheme explained in quant_simd_common.h. */
#include "quant/quant_isa.h"
#include "quant/quant_simd_float.h"

SIMD_KERNEL_TABLE(k_avx2, QUANT_ISA_AVX2, "avx2")

const quant_kernels *quant_kernels_avx2(void) { return &k_avx2; }
