/* quant_avx2.c - placeholder: replaced by the SIMD kernels (another helper writes this file).
 * Returns NULL, meaning "this build has no avx2 table", so dispatch falls back to the reference. */
#include "quant/quant_isa.h"

const quant_kernels *quant_kernels_avx2(void) { return NULL; }
