/* ops_math.h - the one definition of exp, SiLU, sigmoid and GELU used by the
 * CPU operators (cpu/ops.h), the samplers and — written the same way — the CUDA kernels.
 *
 * DESIGN: hm_expf uses only IEEE single multiplies and adds rounded to nearest-even (no FMA, no
 * libm), so a CUDA port with __fmul_rn/__fadd_rn gives the same bits, and the compiler may
 * vectorise it. Recipe (Cephes expf polynomial):
 *   NaN -> NaN; x > 88.72283935546875 -> +inf; x < -103.972084045410156 -> +0;
 *   n  = (x * 1.44269502f + 12582912.0f) - 12582912.0f      (round to nearest integer)
 *   r  = (x - n * 0.693359375f) - n * -2.12194440e-4f        (n * 0.693359375f is exact)
 *   z  = r * r
 *   p  = 1.9875691500e-4f; p = p*r + 1.3981999507e-3f; p = p*r + 8.3334519073e-3f;
 *        p = p*r + 4.1665795894e-2f; p = p*r + 1.6666665459e-1f; p = p*r + 5.0000001201e-1f;
 *   y  = (p * z + r) + 1.0f                                  (left to right)
 *   result = (y * 2^n1) * 2^(n - n1), n1 = n / 2 (C division, toward zero), powers of two built
 *   from exponent bits; the first product is exact, so subnormal results round once.
 * Each line is evaluated exactly as written, one rounding per operation. Accuracy: below 1 ulp
 * of exp for normal results (0.982 ulp worst over 320M inputs; tests/cpu/test_ops_math.c).
 */
#ifndef HM_CPU_OPS_MATH_H
#define HM_CPU_OPS_MATH_H

#include <stdint.h>
#include <string.h>

static inline float hm_math_pow2i(int e) { /* 2^e for -126 <= e <= 127 */
    uint32_t u = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float hm_expf(float x) {
    if (x != x) return x;
    if (x > 88.72283935546875f) return __builtin_inff();
    if (x < -103.972084045410156f) return 0.0f;
    float n = (x * 1.44269502f + 12582912.0f) - 12582912.0f;
    float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = (p * z + r) + 1.0f;
    int ni = (int)n;
    int n1 = ni / 2;
    return (y * hm_math_pow2i(n1)) * hm_math_pow2i(ni - n1);
}

static inline float hm_sigmoidf(float x) { return 1.0f / (1.0f + hm_expf(-x)); }
static inline float hm_siluf(float x) { return x / (1.0f + hm_expf(-x)); }
/* GELU, tanh form (transformers' gelu_pytorch_tanh, ggml's gelu): 0.5 g (1 + tanh(u)) with
 * u = 0.7978845608 (g + 0.044715 g^3), written as g * sigmoid(2u), the same function without
 * libm's tanhf (whose bits differ from the GPU's) and without 1 + tanh's cancellation. */
static inline float hm_geluf(float g) {
    const float u = 0.7978845608f * (g + 0.044715f * g * g * g);
    return g / (1.0f + hm_expf(-2.0f * u));
}

#endif
