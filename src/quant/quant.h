/* quant.h - dequantise, quantise, and the canonical dot product of a weight row with an
 * activation row, for every supported type; a scalar reference and SIMD kernel tables.
 *
 * DESIGN: the dot product of a quantised row with an activation is *defined* once, in
 * docs/ARITHMETIC.md, down to the order of every float operation: activations are quantised to
 * q8_32 (32-element weight blocks) or q8_K (256-element blocks), per-block sums are integers
 * (exact), each block's float contribution is fused into lane (block mod 32) of 32 accumulators
 * with fmaf, and the 32 lanes are summed by a fixed halving tree. Float weights (f32/f16/bf16)
 * use f32 activations and fuse element i into lane (i mod 32). Every implementation — the
 * scalar reference here, AVX2, AVX-512, and the CUDA kernels — must give the same bits. That is
 * what lets an expert move between CPU and GPU without changing a bit of the model's output.
 *
 * No state: kernel tables are constant, chosen by the caller (cpu/ keeps one in its context).
 */
#ifndef HM_QUANT_QUANT_H
#define HM_QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "quant/blocks.h"
#include "quant/qtypes.h"

/* Activation formats a weight type is dotted with. */
typedef enum {
    QUANT_ACT_F32 = 0, /* f32, f16, bf16 weights */
    QUANT_ACT_Q8_32,   /* q4_0 q4_1 q5_0 q5_1 q8_0 iq4_nl mxfp4 */
    QUANT_ACT_Q8_K,    /* q4_K q5_K q6_K iq4_xs */
    QUANT_ACT_COUNT
} quant_act;

/* Activation format for a supported weight type (QUANT_ACT_COUNT for unsupported ones). */
quant_act quant_act_for(uint32_t wtype);
/* Bytes of one activation row of n elements; 0 if n is not a multiple of its block. */
size_t quant_act_row_size(quant_act act, int64_t n);

/* ---- scalar reference (the definition; slow) ---- */

/* dst[0..n) = values of the n elements in src. n must be a multiple of the block size. */
hm_status quant_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
/* Quantises n floats into type (for forge and tests). Returns HM_ERR_UNSUPPORTED for types
 * without a quantiser, HM_ERR_ARG for a bad n, HM_ERR_RANGE when a block type is given a NaN
 * or infinity (f32/f16/bf16 keep them). */
hm_status quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);
/* Activation quantisation as defined in ARITHMETIC.md (QUANT_ACT_F32 copies). */
void quant_act_quantize_ref(quant_act act, const float *x, void *dst, int64_t n);
/* The canonical dot product of one weight row (n elements) with one activation row. */
float quant_dot_ref(uint32_t wtype, int64_t n, const void *w, const void *act);

/* ---- kernel tables ---- */

typedef enum { QUANT_ISA_REF = 0, QUANT_ISA_AVX2, QUANT_ISA_AVX512, QUANT_ISA_COUNT } quant_isa;

/* out[c * out_stride + r] = dot(row r of w, row c of act) for r < nr, c < nc.
 * w_stride and act_stride are in bytes. Results are bit-identical to quant_dot_ref. */
typedef void (*quant_dot_tile_fn)(int64_t n, const void *w, size_t w_stride, int nr,
                                  const void *act, size_t act_stride, int nc,
                                  float *out, size_t out_stride);
/* Quantises n floats into one activation row (bit-identical to quant_act_quantize_ref). */
typedef void (*quant_act_fn)(const float *x, void *dst, int64_t n);

typedef struct {
    quant_isa isa;
    const char *name;                     /* "ref", "avx2", "avx512" */
    quant_dot_tile_fn dot[HM_TYPE_COUNT]; /* NULL for unsupported types */
    quant_act_fn act[QUANT_ACT_COUNT];
} quant_kernels;

/* The table for isa, or NULL if this CPU (or this build) cannot run it. */
const quant_kernels *quant_kernels_get(quant_isa isa);
/* The best table this CPU runs; HOTMOE_ISA=ref|avx2|avx512 in the environment caps it. */
const quant_kernels *quant_kernels_best(void);

#endif
