/* cuda_math.cuh - device versions of hm_expf, hm_sigmoidf, hm_siluf (src/cpu/ops_math.h) and
 * the expert activations of docs/OPS.md, bit-identical to the CPU's, hm_f32_to_fp16, and the
 * rmsnorm scale (docs/OPS.md) as one warp computes it.
 *
 * DESIGN: the CPU recipe uses only IEEE single multiplies, adds and one divide, each rounded to
 * nearest-even and never contracted; here every operation is the matching _rn intrinsic, so the
 * result does not depend on --fmad or the compiler. Header-only (__device__ __forceinline__).
 */
#ifndef HM_CUDA_CUDA_MATH_CUH
#define HM_CUDA_CUDA_MATH_CUH

#include <stdint.h>

/* 2^e for -126 <= e <= 127 */
static __device__ __forceinline__ float cm_pow2i(int e) {
    return __int_as_float((e + 127) << 23);
}

/* hm_expf of ops_math.h, operation for operation */
static __device__ __forceinline__ float cm_expf(float x) {
    if (x != x) return x;
    if (x > 88.72283935546875f) return __int_as_float(0x7f800000);
    if (x < -103.972084045410156f) return 0.0f;
    float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269502f), 12582912.0f), 12582912.0f);
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693359375f)), __fmul_rn(n, -2.12194440e-4f));
    float z = __fmul_rn(r, r);
    float p = 1.9875691500e-4f;
    p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
    p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
    p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
    float y = __fadd_rn(__fadd_rn(__fmul_rn(p, z), r), 1.0f);
    int ni = (int)n;
    int n1 = ni / 2;
    return __fmul_rn(__fmul_rn(y, cm_pow2i(n1)), cm_pow2i(ni - n1));
}

/* 1 / (1 + exp(-x)) */
static __device__ __forceinline__ float cm_sigmoidf(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, cm_expf(-x)));
}

/* x / (1 + exp(-x)) */
static __device__ __forceinline__ float cm_siluf(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, cm_expf(-x)));
}

/* silu(g) * u (docs/OPS.md swiglu) */
static __device__ __forceinline__ float cm_swiglu(float g, float u) {
    return __fmul_rn(cm_siluf(g), u);
}

/* gpt-oss: g = min(g, limit) (NaN stays), u = clamp(u, -limit, limit),
 * (g * sigmoid(g * alpha)) * (u + 1) */
static __device__ __forceinline__ float cm_swiglu_oai(float g, float u, float alpha, float limit) {
    g = g > limit ? limit : g;
    u = u > limit ? limit : (u < -limit ? -limit : u);
    return __fmul_rn(__fmul_rn(g, cm_sigmoidf(__fmul_rn(g, alpha))), __fadd_rn(u, 1.0f));
}

/* hm_geluf of ops_math.h: g / (1 + exp(-2u)), u = 0.7978845608 (g + ((0.044715 g) g) g) */
static __device__ __forceinline__ float cm_geluf(float g) {
    const float c = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float u = __fmul_rn(0.7978845608f, __fadd_rn(g, c));
    return __fdiv_rn(g, __fadd_rn(1.0f, cm_expf(__fmul_rn(-2.0f, u))));
}

/* The expert activation of kind (cpu/ops.h: CPU_GLU_SILU, CPU_GLU_OAI with alpha and limit,
 * CPU_GLU_GELU), as cpu_swiglu_slice */
static __device__ __forceinline__ float cm_glu(int kind, float g, float u, float alpha,
                                               float limit) {
    return kind == 1 ? cm_swiglu_oai(g, u, alpha, limit)
           : kind == 2 ? __fmul_rn(cm_geluf(g), u)
                       : cm_swiglu(g, u);
}

/* hm_f32_to_fp16 (quant/fp16.h), operation for operation: round to nearest even, >= 65520 to
 * inf, NaN to the quiet NaN 0x7e00 with the sign. */
static __device__ __forceinline__ uint16_t cm_f32_to_f16(float f) {
    const uint32_t x = __float_as_uint(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        const float v = __fmul_rn(__uint_as_float(ax), 16777216.0f);
        uint32_t m = (uint32_t)v;
        const float rem = __fsub_rn(v, (float)m);
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return (uint16_t)(sign | m);
    }
    const uint32_t r = ax + 0x0fffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* docs/OPS.md's rmsnorm scale 1 / sqrt(mean(x^2) + eps) of row[0..n), by one whole warp: lane l
 * runs double chain l (elements l, l + 32, ... in increasing order), chains combine by the
 * halving tree c[l] += c[l + w], w = 16, 8, 4, 2, 1 (cpu_rmsnorm's order). Valid in lane 0. */
static __device__ __forceinline__ float cm_rms_scale(const float *row, int64_t n, float eps) {
    double acc = 0.0;
    for (int64_t i = threadIdx.x & 31; i < n; i += 32) {
        const double v = (double)row[i];
        acc = __dadd_rn(acc, __dmul_rn(v, v));
    }
    for (int o = 16; o > 0; o >>= 1) acc = __dadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, o));
    const float mean = __double2float_rn(__ddiv_rn(acc, (double)n));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

/* cm_rms_scale for a whole block: warp 0 computes it and every thread gets it (one barrier:
 * every thread of the block calls this) */
static __device__ __forceinline__ float cm_rms_scale_block(const float *row, int64_t n, float eps) {
    __shared__ float s_scale;
    if (threadIdx.x < 32) {
        const float r = cm_rms_scale(row, n, eps);
        if (threadIdx.x == 0) s_scale = r;
    }
    __syncthreads();
    return s_scale;
}

#endif
