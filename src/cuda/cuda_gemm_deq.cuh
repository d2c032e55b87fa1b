/* cuda_gemm_deq.cuh - dequantisation of 16 consecutive elements of a weight row, for the
 * tensor-core GEMM's shared-memory tiles (cuda_gemm.cu).
 *
 * DESIGN: one struct per weight type with run(row, e0, out): out[j] = the float value of element
 * e0 + j (e0 a multiple of 16) of the row, computed with the float expressions of
 * quant_dequantize_row (src/quant/quant_ref_deq.c) in the same order (explicit _rn intrinsics),
 * so the f32 values are exactly the CPU's; the GEMM then rounds them to f16. 16 elements never
 * straddle a block or a sub-block scale, so each call decodes one scale. Block types are read
 * byte-wise (their structs are only 1- or 2-byte aligned in a row); float types with 16-byte
 * vector loads (rows of k % 32 == 0 elements stay 16-byte aligned).
 */
#ifndef HM_CUDA_CUDA_GEMM_DEQ_CUH
#define HM_CUDA_CUDA_GEMM_DEQ_CUH

#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "quant/blocks.h"
#include "quant/qtypes.h"
}

namespace gemm_deq {

__device__ __forceinline__ float f16(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

/* the 16-entry signed 4-bit grids, packed 8 per 64-bit word (no memory lookup) */
__device__ __forceinline__ int grid4(uint64_t lo, uint64_t hi, int q) {
    return (int)(int8_t)(uint8_t)(((q < 8 ? lo : hi) >> (8 * (q & 7))) & 0xff);
}
#define GD_PACK8(a, b, c, d, e, f, g, h)                                                    \
    ((uint64_t)(uint8_t)(a) | ((uint64_t)(uint8_t)(b) << 8) | ((uint64_t)(uint8_t)(c) << 16) | \
     ((uint64_t)(uint8_t)(d) << 24) | ((uint64_t)(uint8_t)(e) << 32) |                        \
     ((uint64_t)(uint8_t)(f) << 40) | ((uint64_t)(uint8_t)(g) << 48) |                        \
     ((uint64_t)(uint8_t)(h) << 56))
/* hm_kvalues_iq4nl and hm_kvalues_mxfp4 of blocks.h */
constexpr uint64_t IQ4NL_LO = GD_PACK8(-127, -104, -83, -65, -49, -35, -22, -10);
constexpr uint64_t IQ4NL_HI = GD_PACK8(1, 13, 25, 38, 53, 69, 89, 113);
constexpr uint64_t MXFP4_LO = GD_PACK8(0, 1, 2, 3, 4, 6, 8, 12);
constexpr uint64_t MXFP4_HI = GD_PACK8(0, -1, -2, -3, -4, -6, -8, -12);
#undef GD_PACK8

/* nibble of element j (0..31) in the q4_0 order: low nibble of qs[j] for j < 16, else high
 * nibble of qs[j - 16] */
__device__ __forceinline__ int nib32(const uint8_t *qs, int j) {
    return j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
}

template <int T> struct deq;

template <> struct deq<HM_TYPE_F32> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const float4 *p = (const float4 *)(row + (size_t)e0 * 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float4 v = p[i];
            o[4 * i] = v.x, o[4 * i + 1] = v.y, o[4 * i + 2] = v.z, o[4 * i + 3] = v.w;
        }
    }
};
template <> struct deq<HM_TYPE_F16> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint4 *p = (const uint4 *)(row + (size_t)e0 * 2);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint4 v = p[i];
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                o[8 * i + 2 * j] = __half2float(__ushort_as_half((unsigned short)(w[j] & 0xffff)));
                o[8 * i + 2 * j + 1] = __half2float(__ushort_as_half((unsigned short)(w[j] >> 16)));
            }
        }
    }
};
template <> struct deq<HM_TYPE_BF16> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint4 *p = (const uint4 *)(row + (size_t)e0 * 2);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint4 v = p[i];
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                o[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
                o[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
            }
        }
    }
};
template <> struct deq<HM_TYPE_Q4_0> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q4_0);
        const float d = f16(b);
        const int j0 = e0 % 32;
#pragma unroll
        for (int j = 0; j < 16; j++) o[j] = __fmul_rn((float)(nib32(b + 2, j0 + j) - 8), d);
    }
};
template <> struct deq<HM_TYPE_Q4_1> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q4_1);
        const float d = f16(b), m = f16(b + 2);
        const int j0 = e0 % 32;
#pragma unroll
        for (int j = 0; j < 16; j++)
            o[j] = __fadd_rn(__fmul_rn((float)nib32(b + 4, j0 + j), d), m);
    }
};
template <> struct deq<HM_TYPE_Q5_0> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q5_0);
        const float d = f16(b);
        const uint32_t qh = b[2] | (b[3] << 8) | (b[4] << 16) | ((uint32_t)b[5] << 24);
        const int j0 = e0 % 32;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = nib32(b + 6, j0 + j) | (int)(((qh >> (j0 + j)) & 1) << 4);
            o[j] = __fmul_rn((float)(q - 16), d);
        }
    }
};
template <> struct deq<HM_TYPE_Q5_1> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q5_1);
        const float d = f16(b), m = f16(b + 2);
        const uint32_t qh = b[4] | (b[5] << 8) | (b[6] << 16) | ((uint32_t)b[7] << 24);
        const int j0 = e0 % 32;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = nib32(b + 8, j0 + j) | (int)(((qh >> (j0 + j)) & 1) << 4);
            o[j] = __fadd_rn(__fmul_rn((float)q, d), m);
        }
    }
};
template <> struct deq<HM_TYPE_Q8_0> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q8_0);
        const float d = f16(b);
        const int8_t *qs = (const int8_t *)(b + 2) + e0 % 32;
#pragma unroll
        for (int j = 0; j < 16; j++) o[j] = __fmul_rn((float)qs[j], d);
    }
};
template <> struct deq<HM_TYPE_MXFP4> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_mxfp4);
        const uint32_t e = b[0];
        const float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
        const int j0 = e0 % 32;
#pragma unroll
        for (int j = 0; j < 16; j++)
            o[j] = __fmul_rn((float)grid4(MXFP4_LO, MXFP4_HI, nib32(b + 1, j0 + j)), d);
    }
};
template <> struct deq<HM_TYPE_IQ4_NL> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_iq4_nl);
        const float d = f16(b);
        const int j0 = e0 % 32;
#pragma unroll
        for (int j = 0; j < 16; j++)
            o[j] = __fmul_rn(d, (float)grid4(IQ4NL_LO, IQ4NL_HI, nib32(b + 2, j0 + j)));
    }
};

/* 6-bit scale and min of sub-block j of a q4_K / q5_K block (quant_k4_scale_min) */
__device__ __forceinline__ void k4_scale_min(int j, const uint8_t *s, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <> struct deq<HM_TYPE_Q4_K> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 256) * sizeof(block_q4_K);
        const int e = e0 % 256, sub = e / 32, l0 = e % 32;
        int sc, mn;
        k4_scale_min(sub, b + 4, &sc, &mn);
        const float d1 = __fmul_rn(f16(b), (float)sc), m1 = __fmul_rn(f16(b + 2), (float)mn);
        const uint8_t *q = b + 16 + 32 * (sub / 2) + l0;
        const int sh = 4 * (sub & 1);
#pragma unroll
        for (int j = 0; j < 16; j++) o[j] = __fsub_rn(__fmul_rn(d1, (float)((q[j] >> sh) & 0xf)), m1);
    }
};
template <> struct deq<HM_TYPE_Q5_K> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 256) * sizeof(block_q5_K);
        const int e = e0 % 256, sub = e / 32, l0 = e % 32;
        int sc, mn;
        k4_scale_min(sub, b + 4, &sc, &mn);
        const float d1 = __fmul_rn(f16(b), (float)sc), m1 = __fmul_rn(f16(b + 2), (float)mn);
        const uint8_t *qh = b + 16 + l0;
        const uint8_t *q = b + 48 + 32 * (sub / 2) + l0;
        const int sh = 4 * (sub & 1);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int v = ((q[j] >> sh) & 0xf) + (((qh[j] >> sub) & 1) << 4);
            o[j] = __fsub_rn(__fmul_rn(d1, (float)v), m1);
        }
    }
};
template <> struct deq<HM_TYPE_Q6_K> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 256) * sizeof(block_q6_K);
        const int e = e0 % 256, h = e / 128, qd = (e % 128) / 32, l0 = e % 32;
        const uint8_t *ql = b + 64 * h + 32 * (qd & 1) + l0;
        const uint8_t *qh = b + 128 + 32 * h + l0;
        const int sc = (int8_t)b[192 + 8 * h + l0 / 16 + 2 * qd];
        const float ds = __fmul_rn(f16(b + 208), (float)sc);
        const int shl = 4 * (qd >> 1), shh = 2 * qd;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = (((ql[j] >> shl) & 0xf) | (((qh[j] >> shh) & 3) << 4)) - 32;
            o[j] = __fmul_rn(ds, (float)q);
        }
    }
};
template <> struct deq<HM_TYPE_IQ4_XS> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 256) * sizeof(block_iq4_xs);
        const int e = e0 % 256, ib = e / 32, j0 = e % 32;
        const int scales_h = b[2] | (b[3] << 8);
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
        const float dl = __fmul_rn(f16(b), (float)(ls - 32));
        const uint8_t *qs = b + 8 + 16 * ib;
#pragma unroll
        for (int j = 0; j < 16; j++)
            o[j] = __fmul_rn(dl, (float)grid4(IQ4NL_LO, IQ4NL_HI, nib32(qs, j0 + j)));
    }
};

} // namespace gemm_deq

#endif
