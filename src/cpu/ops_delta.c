/* ops_delta.c - the linear-attention pieces of the hybrid architectures (Qwen3-Next, Qwen3.5:
 * gated delta-net layers): the causal depthwise convolution with its state, the L2 norm and the
 * gated delta rule, one token at a time (ops.h).
 *
 * DESIGN: a sequence is processed token by token, for a prompt as for a decode step, so a
 * prompt and the same tokens one by one give the same bytes (the CPU engine's rule); the
 * chunked form of the delta rule (the GPU's, for prompts) is the same sums in another order.
 * Each function is a plain loop with a fixed order of additions; exp through hm_expf (no libm
 * differences between machines). The state layout is llama.cpp's: the convolution keeps the
 * last K-1 inputs per channel, the delta rule a [d_k][d_v] matrix per value head.
 */
#include "cpu/ops.h"

#include <math.h>
#include <string.h>

#include "cpu/ops_internal.h"
#include "cpu/ops_math.h"

void cpu_conv1d_causal(float *state, const float *w, const float *x, float *y, int64_t C, int K) {
    for (int64_t c = 0; c < C; c++) {
        const float *wc = w + c * K;
        float acc = 0.0f;
        for (int j = 0; j < K - 1; j++) acc += wc[j] * state[(int64_t)j * C + c];
        acc += wc[K - 1] * x[c];
        y[c] = acc;
    }
    if (K > 1) { /* drop the oldest input, append x */
        memmove(state, state + C, sizeof(float) * (size_t)((K - 2) * C));
        memcpy(state + (int64_t)(K - 2) * C, x, sizeof(float) * (size_t)C);
    }
}

void cpu_l2_norm(float *x, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float s = 1.0f / sqrtf(ss > eps * eps ? ss : eps * eps);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * s;
}

void cpu_delta_rule(float *S, const float *q, const float *k, const float *v, float g, float beta,
                    int64_t dk, int64_t dv, float *o, float *scratch, int simd) {
    const float decay = hm_expf(g);
    float *kv = scratch; /* [dv] S^T k after the decay */
    if (simd && dv % 8 == 0) {
        ops_delta_rule_avx2(S, q, k, v, decay, beta, dk, dv, o, kv);
        return;
    }
    for (int64_t j = 0; j < dv; j++) kv[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        float *row = S + i * dv;
        for (int64_t j = 0; j < dv; j++) {
            row[j] = row[j] * decay;
            kv[j] += row[j] * k[i];
        }
    }
    for (int64_t j = 0; j < dv; j++) kv[j] = (v[j] - kv[j]) * beta; /* the delta */
    for (int64_t j = 0; j < dv; j++) o[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        float *row = S + i * dv;
        for (int64_t j = 0; j < dv; j++) {
            row[j] = row[j] + k[i] * kv[j];
            o[j] += row[j] * q[i];
        }
    }
}
