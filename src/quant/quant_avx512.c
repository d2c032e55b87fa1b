/* quant_avx512.c - the AVX-512 (F/BW/VL/VNNI) kernel table: the code of quant_simd_*.h compiled
 * with VNNI, whose vpdpbusd/vpdpwssd replace the pmaddubsw+pmaddwd pairs of the AVX2 build. The
 * kernels keep 256-bit vectors (the lane layout of quant_simd_common.h; no frequency penalty on
 * older Xeons); results are bit-identical to quant_dot_ref like every table. When the CPU also
 * has VBMI, quant_kernels_avx512() hands out the variant of quant_vbmi_avx512.c instead. */
#include "quant/quant_isa.h"
#include "quant/quant_simd_float.h"
#include "quant/quant_simd_tables.h"

SIMD_KERNEL_TABLE(k_avx512, QUANT_ISA_AVX512, "avx512")

const quant_kernels *quant_kernels_avx512_plain(void) { return &k_avx512; }

const quant_kernels *quant_kernels_avx512(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vbmi")) return quant_kernels_avx512_vbmi();
    return &k_avx512;
}
