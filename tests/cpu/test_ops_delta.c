/* test_ops_delta.c - the linear-attention ops (cpu/ops_delta.c) against references in double
 * written from their definitions: the causal convolution against a full input history (and the
 * state it leaves: the last K-1 inputs), the L2 norm (and its eps floor), the gated delta rule
 * over 12 tokens against transformers' torch_recurrent_gated_delta_rule loop (state decayed,
 * kv_mem, delta, state update, output, per token), within 1e-5 of the largest output; beta 0
 * with g 0 leaves the state unchanged; the same tokens twice give the same bytes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "harness.h"

static uint64_t g_x = 12345;
static float rnd(void) { /* [-1, 1) */
    g_x = g_x * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_x >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void test_conv(void) {
    enum { C = 5, K = 4, T = 7 };
    float w[C * K], xs[T][C], state[(K - 1) * C], y[C];
    for (int i = 0; i < C * K; i++) w[i] = rnd();
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) xs[t][c] = rnd();
    memset(state, 0, sizeof(state));
    double worst = 0;
    for (int t = 0; t < T; t++) {
        cpu_conv1d_causal(state, w, xs[t], y, C, K);
        for (int c = 0; c < C; c++) {
            double ref = 0; /* inputs t-K+1 .. t, zeros before the first */
            for (int j = 0; j < K; j++) {
                const int s = t - (K - 1) + j;
                if (s >= 0) ref += (double)w[c * K + j] * xs[s][c];
            }
            worst = fmax(worst, fabs(ref - y[c]));
        }
    }
    HM_CHECK_MSG(worst < 1e-6, "conv: max |diff| %g", worst);
    for (int j = 0; j < K - 1; j++) /* the state: the last K-1 inputs, oldest first */
        HM_CHECK(!memcmp(state + j * C, xs[T - (K - 1) + j], sizeof(float) * C));
}

static void test_l2(void) {
    float x[4] = {3, 0, 4, 0};
    cpu_l2_norm(x, 4, 1e-6f);
    HM_CHECK(fabsf(x[0] - 0.6f) < 1e-7f && fabsf(x[2] - 0.8f) < 1e-7f && x[1] == 0);
    float z[3] = {1e-9f, 0, 0};
    cpu_l2_norm(z, 3, 1e-6f); /* below eps: divided by eps, not blown up */
    HM_CHECK(fabsf(z[0] - 1e-3f) < 1e-9f);
}

static void test_delta(void) {
    enum { DK = 8, DV = 6, T = 12 };
    float S[DK * DV], q[DK], k[DK], v[DV], o[DV], scratch[DV];
    double R[DK][DV];
    memset(S, 0, sizeof(S));
    memset(R, 0, sizeof(R));
    double worst = 0, big = 0;
    const float scale = 1.0f / sqrtf((float)DK);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < DK; i++) q[i] = rnd(), k[i] = rnd();
        for (int j = 0; j < DV; j++) v[j] = rnd();
        cpu_l2_norm(q, DK, 1e-6f);
        cpu_l2_norm(k, DK, 1e-6f);
        for (int i = 0; i < DK; i++) q[i] *= scale;
        const float g = -0.5f * (rnd() + 1.0f), beta = 0.5f * (rnd() + 1.0f);
        cpu_delta_rule(S, q, k, v, g, beta, DK, DV, o, scratch, 0);
        /* transformers: state *= exp(g); kv_mem = (state * k[:, None]).sum(-2);
         * delta = (v - kv_mem) * beta; state += k[:, None] * delta[None]; out = (state * q[:, None]).sum(-2) */
        double kv[DV] = {0}, out[DV] = {0};
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) {
                R[i][j] *= exp((double)g);
                kv[j] += R[i][j] * k[i];
            }
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) R[i][j] += k[i] * (v[j] - kv[j]) * beta;
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) out[j] += R[i][j] * q[i];
        for (int j = 0; j < DV; j++) {
            worst = fmax(worst, fabs(out[j] - o[j]));
            big = fmax(big, fabs(out[j]));
        }
    }
    HM_CHECK_MSG(worst <= 1e-5 * big && big > 0.01, "delta rule: max |diff| %g of max |o| %g",
                 worst, big);
    /* beta 0, g 0: the state stays, the output is S^T q */
    float S2[DK * DV];
    memcpy(S2, S, sizeof(S));
    cpu_delta_rule(S, q, k, v, 0.0f, 0.0f, DK, DV, o, scratch, 0);
    HM_CHECK(!memcmp(S, S2, sizeof(S)));
    /* the same inputs from the same state: the same bytes */
    float o1[DV], o2[DV];
    memcpy(S2, S, sizeof(S));
    cpu_delta_rule(S, q, k, v, -0.3f, 0.7f, DK, DV, o1, scratch, 0);
    cpu_delta_rule(S2, q, k, v, -0.3f, 0.7f, DK, DV, o2, scratch, 0);
    HM_CHECK(!memcmp(o1, o2, sizeof(o1)) && !memcmp(S, S2, sizeof(S)));
}

/* The AVX2 columns (dv a multiple of 8): the scalar loops' state and output bytes, step after
 * step from one state, at the real head size (128 x 128) and at 16 x 24. */
static void test_delta_simd(void) {
    if (!cpu_act_simd()) {
        printf("no AVX2: the SIMD delta rule not checked\n");
        return;
    }
    const int shapes[2][2] = {{128, 128}, {16, 24}};
    for (int si = 0; si < 2; si++) {
        const int dk = shapes[si][0], dv = shapes[si][1];
        float *S0 = calloc((size_t)dk * dv, 4), *S1 = calloc((size_t)dk * dv, 4);
        float *q = malloc((size_t)dk * 4), *k = malloc((size_t)dk * 4), *v = malloc((size_t)dv * 4);
        float *o0 = malloc((size_t)dv * 4), *o1 = malloc((size_t)dv * 4);
        float *sc = malloc((size_t)dv * 4);
        HM_REQUIRE(S0 && S1 && q && k && v && o0 && o1 && sc);
        int bad = 0;
        for (int t = 0; t < 6; t++) {
            for (int i = 0; i < dk; i++) q[i] = rnd(), k[i] = rnd();
            for (int j = 0; j < dv; j++) v[j] = rnd();
            cpu_l2_norm(q, dk, 1e-6f);
            cpu_l2_norm(k, dk, 1e-6f);
            const float g = -0.5f * (rnd() + 1.0f), beta = 0.5f * (rnd() + 1.0f);
            cpu_delta_rule(S0, q, k, v, g, beta, dk, dv, o0, sc, 0);
            cpu_delta_rule(S1, q, k, v, g, beta, dk, dv, o1, sc, 1);
            bad += memcmp(o0, o1, (size_t)dv * 4) != 0 || memcmp(S0, S1, (size_t)dk * dv * 4) != 0;
        }
        HM_CHECK_MSG(bad == 0, "%d x %d: %d steps differ from the scalar loops", dk, dv, bad);
        free(S0), free(S1), free(q), free(k), free(v), free(o0), free(o1), free(sc);
    }
}

HM_TEST_MAIN(test_conv, test_l2, test_delta, test_delta_simd)
