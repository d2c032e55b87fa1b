/* cuda_gemm_deq.cuh - dequantisation of 16 consecutive elements of a weight row, for the
 * tensor-core GEMM's shared-memory tiles (cuda_gemm.cu).
 *
 * DESIGN: one struct per weight type with run(row, e0, out): out[j] = the float value of element
 * e0 + j (e0 a multiple of 16) of the row, computed with the float expressions of
 * quant_dequantize_row (src/quant/quant_ref_deq.c) in the same order (explicit _rn intrinsics),
 * so the f32 values are exactly the CPU's; the GEMM then rounds them to f16. 16 elements never
 * straddle a block or a sub-block scale, so each call decodes one scale. The 16 quant bytes
 * are loaded with the widest access the block's alignment in a row allows (rows start 16-byte
 * aligned: q4_K/q5_K blocks stay 16-aligned, iq4_xs 8, q4_1 4, most others 2, mxfp4 1); small
 * integers become floats by the exponent trick (u2f), exact and cheaper than I2F.
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


/* (float)q for 0 <= q < 2^23 without a conversion instruction (I2F is a quarter-rate op): the
 * bits 0x4B000000 | q are the float 2^23 + q, and subtracting 2^23 is exact */
__device__ __forceinline__ float u2f(uint32_t q) {
    return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.0f);
}
/* (float)(q - bias) for 0 <= q < 2^22, bias <= 2^22: exact by the same argument */
__device__ __forceinline__ float u2f_minus(uint32_t q, int bias) {
    return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.0f + (float)bias);
}

/* 16 bytes at p (aligned to A bytes) as four little-endian words */
template <int A> __device__ __forceinline__ void load16(const uint8_t *p, uint32_t w[4]) {
    if (A >= 16) {
        const uint4 v = *(const uint4 *)p;
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if (A >= 4) {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = ((const uint32_t *)p)[i];
    } else if (A >= 2) {
        const uint16_t *h = (const uint16_t *)p;
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = h[2 * i] | ((uint32_t)h[2 * i + 1] << 16);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++)
            w[i] = p[4 * i] | (p[4 * i + 1] << 8) | (p[4 * i + 2] << 16) | ((uint32_t)p[4 * i + 3] << 24);
    }
}
/* byte j of the 16 bytes w */
__device__ __forceinline__ uint32_t byte_of(const uint32_t w[4], int j) { return (w[j / 4] >> (8 * (j % 4))) & 0xff; }

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
/* f16 at a 2-byte aligned address */
__device__ __forceinline__ float f16a(const uint8_t *p) { return __half2float(*(const __half *)p); }

template <> struct deq<HM_TYPE_Q4_0> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q4_0);
        const float d = f16a(b);
        const int sh = (e0 % 32) / 4; /* 0: low nibbles (elements 0..15), 4: high */
        uint32_t w[4];
        load16<2>(b + 2, w);
#pragma unroll
        for (int j = 0; j < 16; j++) o[j] = __fmul_rn(u2f_minus((byte_of(w, j) >> sh) & 0xf, 8), d);
    }
};
template <> struct deq<HM_TYPE_Q4_1> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q4_1);
        const float d = f16a(b), m = f16a(b + 2);
        const int sh = (e0 % 32) / 4;
        uint32_t w[4];
        load16<4>(b + 4, w);
#pragma unroll
        for (int j = 0; j < 16; j++)
            o[j] = __fadd_rn(__fmul_rn(u2f((byte_of(w, j) >> sh) & 0xf), d), m);
    }
};
template <> struct deq<HM_TYPE_Q5_0> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q5_0);
        const float d = f16a(b);
        const int j0 = e0 % 32, sh = j0 / 4;
        const uint32_t qh = (*(const uint16_t *)(b + 2) | ((uint32_t) * (const uint16_t *)(b + 4) << 16)) >> j0;
        uint32_t w[4];
        load16<2>(b + 6, w);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t q = ((byte_of(w, j) >> sh) & 0xf) | (((qh >> j) & 1) << 4);
            o[j] = __fmul_rn(u2f_minus(q, 16), d);
        }
    }
};
template <> struct deq<HM_TYPE_Q5_1> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q5_1);
        const float d = f16a(b), m = f16a(b + 2);
        const int j0 = e0 % 32, sh = j0 / 4;
        const uint32_t qh = *(const uint32_t *)(b + 4) >> j0;
        uint32_t w[4];
        load16<8>(b + 8, w);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t q = ((byte_of(w, j) >> sh) & 0xf) | (((qh >> j) & 1) << 4);
            o[j] = __fadd_rn(__fmul_rn(u2f(q), d), m);
        }
    }
};
template <> struct deq<HM_TYPE_Q8_0> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_q8_0);
        const float d = f16a(b);
        uint32_t w[4];
        load16<2>(b + 2 + e0 % 32, w);
        /* signed byte q: q ^ 0x80 is q + 128 */
#pragma unroll
        for (int j = 0; j < 16; j++) o[j] = __fmul_rn(u2f_minus(byte_of(w, j) ^ 0x80, 128), d);
    }
};
template <> struct deq<HM_TYPE_MXFP4> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_mxfp4);
        const uint32_t e = b[0];
        const float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
        const int sh = (e0 % 32) / 4;
        uint32_t w[4];
        load16<1>(b + 1, w);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int v = grid4(MXFP4_LO, MXFP4_HI, (byte_of(w, j) >> sh) & 0xf);
            o[j] = __fmul_rn(u2f_minus((uint32_t)(v + 128), 128), d);
        }
    }
};
template <> struct deq<HM_TYPE_IQ4_NL> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 32) * sizeof(block_iq4_nl);
        const float d = f16a(b);
        const int sh = (e0 % 32) / 4;
        uint32_t w[4];
        load16<2>(b + 2, w);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int v = grid4(IQ4NL_LO, IQ4NL_HI, (byte_of(w, j) >> sh) & 0xf);
            o[j] = __fmul_rn(d, u2f_minus((uint32_t)(v + 128), 128));
        }
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
        const uint8_t *b = row + (size_t)(e0 / 256) * sizeof(block_q4_K); /* 16-byte aligned */
        const int e = e0 % 256, sub = e / 32, l0 = e % 32;
        int sc, mn;
        k4_scale_min(sub, b + 4, &sc, &mn);
        const float d1 = __fmul_rn(f16a(b), u2f(sc)), m1 = __fmul_rn(f16a(b + 2), u2f(mn));
        const int sh = 4 * (sub & 1);
        uint32_t w[4];
        load16<16>(b + 16 + 32 * (sub / 2) + l0, w);
#pragma unroll
        for (int j = 0; j < 16; j++) o[j] = __fsub_rn(__fmul_rn(d1, u2f((byte_of(w, j) >> sh) & 0xf)), m1);
    }
};
template <> struct deq<HM_TYPE_Q5_K> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 256) * sizeof(block_q5_K); /* 16-byte aligned */
        const int e = e0 % 256, sub = e / 32, l0 = e % 32;
        int sc, mn;
        k4_scale_min(sub, b + 4, &sc, &mn);
        const float d1 = __fmul_rn(f16a(b), u2f(sc)), m1 = __fmul_rn(f16a(b + 2), u2f(mn));
        const int sh = 4 * (sub & 1);
        uint32_t h[4], w[4];
        load16<16>(b + 16 + l0, h);
        load16<16>(b + 48 + 32 * (sub / 2) + l0, w);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t v = ((byte_of(w, j) >> sh) & 0xf) | (((byte_of(h, j) >> sub) & 1) << 4);
            o[j] = __fsub_rn(__fmul_rn(d1, u2f(v)), m1);
        }
    }
};
template <> struct deq<HM_TYPE_Q6_K> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 256) * sizeof(block_q6_K); /* 2-byte aligned */
        const int e = e0 % 256, h = e / 128, qd = (e % 128) / 32, l0 = e % 32;
        const int sc = (int8_t)b[192 + 8 * h + l0 / 16 + 2 * qd];
        const float ds = __fmul_rn(f16a(b + 208), (float)sc);
        const int shl = 4 * (qd >> 1), shh = 2 * qd;
        uint32_t wl[4], wh[4];
        load16<2>(b + 64 * h + 32 * (qd & 1) + l0, wl);
        load16<2>(b + 128 + 32 * h + l0, wh);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t q = ((byte_of(wl, j) >> shl) & 0xf) | (((byte_of(wh, j) >> shh) & 3) << 4);
            o[j] = __fmul_rn(ds, u2f_minus(q, 32));
        }
    }
};
template <> struct deq<HM_TYPE_IQ4_XS> {
    static __device__ __forceinline__ void run(const uint8_t *row, int e0, float *o) {
        const uint8_t *b = row + (size_t)(e0 / 256) * sizeof(block_iq4_xs); /* 8-byte aligned */
        const int e = e0 % 256, ib = e / 32, sh = (e % 32) / 4;
        const int scales_h = *(const uint16_t *)(b + 2);
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
        const float dl = __fmul_rn(f16a(b), (float)(ls - 32));
        uint32_t w[4];
        load16<8>(b + 8 + 16 * ib, w);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int v = grid4(IQ4NL_LO, IQ4NL_HI, (byte_of(w, j) >> sh) & 0xf);
            o[j] = __fmul_rn(dl, u2f_minus((uint32_t)(v + 128), 128));
        }
    }
};

} // namespace gemm_deq

#endif
