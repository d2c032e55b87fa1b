/* blocks.h - byte layouts of the quantised blocks, exactly as ggml stores them in GGUF files
 * (ggml-common.h), plus hotmoe's own activation block q8_32. Plain C structs with natural
 * alignment and no padding (checked below), shared by the CPU code and the CUDA kernels. */
#ifndef HM_QUANT_BLOCKS_H
#define HM_QUANT_BLOCKS_H

#include <stdint.h>

#include "quant/fp16.h"

/* the size checks below also compile as C++ (CUDA .cu files include this header) */
#ifdef __cplusplus
#define HM_BLOCK_ASSERT(c, m) static_assert(c, m)
#else
#define HM_BLOCK_ASSERT(c, m) _Static_assert(c, m)
#endif

#define HM_QK4_0 32
#define HM_QK8_0 32

/* x = (q - 8) * d; qs[j] holds element j in its low nibble and element j+16 in its high one */
typedef struct { hm_fp16 d; uint8_t qs[16]; } block_q4_0;
/* x = q * d + m */
typedef struct { hm_fp16 d; hm_fp16 m; uint8_t qs[16]; } block_q4_1;
/* x = (q - 16) * d; bit 4 of element j is bit j of qh (j = 0..31, little-endian uint32) */
typedef struct { hm_fp16 d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;
/* x = q * d + m */
typedef struct { hm_fp16 d; hm_fp16 m; uint8_t qh[4]; uint8_t qs[16]; } block_q5_1;
/* x = q * d */
typedef struct { hm_fp16 d; int8_t qs[32]; } block_q8_0;
/* x = kvalues_mxfp4[q] * 2^(e-128); nibble order as q4_0 */
typedef struct { uint8_t e; uint8_t qs[16]; } block_mxfp4;
/* x = kvalues_iq4nl[q] * d; nibble order as q4_0 */
typedef struct { hm_fp16 d; uint8_t qs[16]; } block_iq4_nl;

/* 256 elements in 8 sub-blocks of 32; 6-bit scale and min per sub-block packed in scales[12];
 * x = d * sc * q - dmin * m */
typedef struct { hm_fp16 d; hm_fp16 dmin; uint8_t scales[12]; uint8_t qs[128]; } block_q4_K;
typedef struct { hm_fp16 d; hm_fp16 dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } block_q5_K;
/* 256 elements in 16 sub-blocks of 16; x = d * scales[j] * (q - 32), q = 6 bits from ql/qh */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; hm_fp16 d; } block_q6_K;
/* activation format for K-quants: x = d * q; bsums[j] = sum of qs[16j .. 16j+15] */
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } block_q8_K;
/* 256 elements in 8 sub-blocks of 32; 6-bit scale ls (low 4 bits in scales_l, high 2 bits in
 * scales_h); x = d * (ls - 32) * kvalues_iq4nl[q] */
typedef struct { hm_fp16 d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } block_iq4_xs;

/* hotmoe's activation format for the 32-element weight blocks: x = d * q; sum = sum of qs.
 * Not a GGUF type. */
typedef struct { float d; int32_t sum; int8_t qs[32]; } block_q8_32;

HM_BLOCK_ASSERT(sizeof(block_q4_0) == 18, "block_q4_0 size");
HM_BLOCK_ASSERT(sizeof(block_q4_1) == 20, "block_q4_1 size");
HM_BLOCK_ASSERT(sizeof(block_q5_0) == 22, "block_q5_0 size");
HM_BLOCK_ASSERT(sizeof(block_q5_1) == 24, "block_q5_1 size");
HM_BLOCK_ASSERT(sizeof(block_q8_0) == 34, "block_q8_0 size");
HM_BLOCK_ASSERT(sizeof(block_mxfp4) == 17, "block_mxfp4 size");
HM_BLOCK_ASSERT(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");
HM_BLOCK_ASSERT(sizeof(block_q4_K) == 144, "block_q4_K size");
HM_BLOCK_ASSERT(sizeof(block_q5_K) == 176, "block_q5_K size");
HM_BLOCK_ASSERT(sizeof(block_q6_K) == 210, "block_q6_K size");
HM_BLOCK_ASSERT(sizeof(block_q8_K) == 292, "block_q8_K size");
HM_BLOCK_ASSERT(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");
HM_BLOCK_ASSERT(sizeof(block_q8_32) == 40, "block_q8_32 size");

/* Non-linear 4-bit grids (ggml's values). MXFP4's are the E2M1 values doubled. */
static const int8_t hm_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t hm_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

#endif
