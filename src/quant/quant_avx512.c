/* quant_avx512.c - placeholder: replaced by the SIMD kernels (another helper writes this file).
 * Returns NULL, meaning "this build has no avx512 table", so dispatch falls back to the reference. */
#include "quant/quant_isa.h"

const quant_kernels *quant_kernels_avx512(void) { return NULL; }
