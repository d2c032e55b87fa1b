/* test_ops_math.c - hm_expf (the shared exp definition), silu, sigmoid and gelu against double
 * libm (gelu: its tanh form, 0.5 g (1 + tanh(u))). */
#include <math.h>
#include <stdint.h>

#include "cpu/ops_internal.h"
#include "cpu/ops_math.h"
#include "harness.h"
#include "quant/fp16.h"

/* Distance in units in the last place between float a and the double b (rounded to float). */
static double ulp_err(float a, double b) {
    float bf = (float)b;
    if (a == bf) return 0.0;
    float ulp = nextafterf(fabsf(bf), INFINITY) - fabsf(bf);
    if (bf == 0.0f) ulp = 1.4e-45f;
    return fabs((double)a - b) / (double)ulp;
}

/* Sweeps every 997th float bit pattern of [-104, 88.72] (~4M inputs; a sweep of every 7th,
 * 320M inputs, measured 0.982 ulp at most, at x = -81.39479). */
static void test_expf_accuracy(void) {
    double max_ulp = 0.0, max_x = 0.0;
    long n = 0, bad_sub = 0;
    for (int sign = 0; sign < 2; sign++) {
        uint32_t hi = sign ? hm_f32_to_bits(104.0f) : hm_f32_to_bits(88.72f);
        for (uint32_t u = 0; u < hi; u += 997) {
            float x = hm_bits_to_f32(u | (sign ? 0x80000000u : 0));
            double ref = exp((double)x);
            float y = hm_expf(x);
            n++;
            if (ref < 1.1754943508222875e-38) { /* subnormal result: absolute bound */
                if (fabs((double)y - ref) > 2.0 * 1.401298464324817e-45) bad_sub++;
                continue;
            }
            double e = ulp_err(y, ref);
            if (e > max_ulp) { max_ulp = e; max_x = x; }
        }
    }
    printf("hm_expf: %ld inputs, max error %.3f ulp at x = %.9g\n", n, max_ulp, max_x);
    HM_CHECK_MSG(max_ulp <= 1.0, "max %.3f ulp at %.9g", max_ulp, max_x);
    HM_CHECK(bad_sub == 0);
}

static void test_expf_special(void) {
    HM_CHECK(hm_expf(0.0f) == 1.0f);
    HM_CHECK(hm_expf(-0.0f) == 1.0f);
    HM_CHECK(isinf(hm_expf(89.0f)) && hm_expf(89.0f) > 0);
    HM_CHECK(isinf(hm_expf(INFINITY)));
    HM_CHECK(hm_expf(-INFINITY) == 0.0f);
    HM_CHECK(hm_expf(-200.0f) == 0.0f);
    HM_CHECK(isnan(hm_expf(NAN)));
    HM_CHECK(hm_expf(88.72f) < INFINITY && hm_expf(88.72f) > 3.3e38f);
    HM_CHECK(hm_expf(-103.0f) > 0.0f); /* subnormal, not flushed */
    /* monotone over a fine grid around 0 */
    float prev = 0.0f;
    int mono = 1;
    for (float x = -2.0f; x < 2.0f; x += 1.0f / 4096) {
        float y = hm_expf(x);
        if (y < prev) mono = 0;
        prev = y;
    }
    HM_CHECK(mono);
}

static void test_silu_sigmoid(void) {
    double max_rel_s = 0, max_rel_g = 0;
    for (float x = -30.0f; x <= 30.0f; x += 0.0137f) {
        double sg = 1.0 / (1.0 + exp(-(double)x));
        double sl = (double)x * sg;
        double es = fabs(hm_sigmoidf(x) - sg) / sg;
        double el = fabs(hm_siluf(x) - sl) / fmax(fabs(sl), 1e-30);
        if (es > max_rel_g) max_rel_g = es;
        if (el > max_rel_s) max_rel_s = el;
    }
    HM_CHECK_MSG(max_rel_g < 4e-7, "sigmoid rel %g", max_rel_g);
    HM_CHECK_MSG(max_rel_s < 4e-7, "silu rel %g", max_rel_s);
    HM_CHECK(hm_siluf(-100.0f) == 0.0f && !signbit(hm_siluf(100.0f)));
    HM_CHECK(hm_siluf(100.0f) == 100.0f);
    HM_CHECK(hm_sigmoidf(0.0f) == 0.5f);
}

/* gelu: within a few float roundings of the tanh form (absolute near its zeros: the product
 * g * sigmoid(2u) is small there), and its limits exact */
static void test_gelu(void) {
    double max_err = 0;
    for (float g = -12.0f; g <= 12.0f; g += 0.00731f) {
        const double u = 0.7978845608 * ((double)g + 0.044715 * (double)g * g * g);
        const double want = 0.5 * (double)g * (1.0 + tanh(u));
        const double e = fabs(hm_geluf(g) - want) / fmax(fabs(want), 1e-3);
        if (e > max_err) max_err = e;
    }
    HM_CHECK_MSG(max_err < 2e-6, "gelu rel %g", max_err);
    HM_CHECK(hm_geluf(0.0f) == 0.0f && hm_geluf(100.0f) == 100.0f && hm_geluf(-100.0f) == 0.0f);
    HM_CHECK(isnan(hm_geluf(NAN)));
}

/* The AVX2 exp of the attention's softmax gives hm_expf's bits (on CPUs that have AVX2). */
static void test_expf_avx2_identical(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) {
        printf("no AVX2 on this CPU: nothing to compare\n");
        return;
    }
    enum { N = 4099 };
    static float x[N], y[N];
    long mism = 0;
    for (uint32_t base = 0; base < 0xffffffffu - 997u * N; base += 997u * N / 3) {
        for (int i = 0; i < N; i++) x[i] = y[i] = hm_bits_to_f32(base + 997u * (uint32_t)i);
        ops_exp_sub_avx2(y, N, 0.0f);
        for (int i = 0; i < N; i++) {
            float r = hm_expf(x[i] - 0.0f);
            if (hm_f32_to_bits(r) != hm_f32_to_bits(y[i]) && !(isnan(r) && isnan(y[i]))) mism++;
        }
    }
    for (int i = 0; i < N; i++) x[i] = y[i] = -30.0f + 0.01f * i;
    ops_exp_sub_avx2(y, N, 1.5f);
    for (int i = 0; i < N; i++)
        if (hm_f32_to_bits(hm_expf(x[i] - 1.5f)) != hm_f32_to_bits(y[i])) mism++;
    HM_CHECK_MSG(mism == 0, "%ld mismatches", mism);
}

HM_TEST_MAIN(test_expf_accuracy, test_expf_special, test_silu_sigmoid, test_gelu,
             test_expf_avx2_identical)
