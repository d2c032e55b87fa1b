/* test_ops.c - norms, elementwise ops, activations, RoPE (incl. YaRN) and routers against
 * straightforward double-precision references written here, and thread-count invariance
 * (bit-identical results for 1, 2 and 3 threads). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/threadpool.h"
#include "cpu/ops.h"
#include "cpu/ops_math.h"
#include "quant/fp16.h"
#include "harness.h"

static uint64_t rng_state = 0x1234567887654321ull;
static double urand(void) { /* xorshift64*, uniform in [0, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}
static float frand(float lo, float hi) { return (float)(lo + (hi - lo) * urand()); }
static float *frand_vec(int64_t n, float lo, float hi) {
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = frand(lo, hi);
    return v;
}

static tp_pool *pools[3]; /* 1, 2, 3 threads */
static int pools_up(void) {
    for (int i = 0; i < 3; i++)
        if (!pools[i] && tp_init(i + 1, &pools[i], NULL) != HM_OK) return 0;
    return 1;
}

/* ------------------------------------------------------------------ rmsnorm */

static void test_rmsnorm(void) {
    HM_REQUIRE(pools_up());
    const int64_t shapes[3][2] = {{7, 4096}, {64 * 3, 128}, {1, 2880}};
    for (int c = 0; c < 3; c++) {
        int64_t rows = shapes[c][0], n = shapes[c][1];
        float *x = frand_vec(rows * n, -3, 3), *w = frand_vec(n, 0.5f, 1.5f);
        float *y[3], *y0 = malloc((size_t)(rows * n) * sizeof(float));
        double maxrel = 0;
        for (int p = 0; p < 3; p++) {
            y[p] = malloc((size_t)(rows * n) * sizeof(float));
            cpu_rmsnorm(pools[p], x, w, y[p], rows, n, 1e-6f);
        }
        cpu_rmsnorm(NULL, x, NULL, y0, rows, n, 1e-5f);
        for (int64_t r = 0; r < rows; r++) {
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
            double s6 = 1.0 / sqrt(ss / n + 1e-6), s5 = 1.0 / sqrt(ss / n + 1e-5);
            for (int64_t i = 0; i < n; i++) {
                double ref = x[r * n + i] * s6 * w[i];
                double e = fabs(y[0][r * n + i] - ref) / fmax(fabs(ref), 1e-6);
                if (e > maxrel) maxrel = e;
                double ref0 = x[r * n + i] * s5;
                if (fabs(y0[r * n + i] - ref0) > 1e-6 * fmax(fabs(ref0), 1e-3)) maxrel = 1;
            }
        }
        HM_CHECK_MSG(maxrel < 1e-6, "shape %d: rel %g", c, maxrel);
        HM_CHECK(!memcmp(y[0], y[1], (size_t)(rows * n) * sizeof(float)));
        HM_CHECK(!memcmp(y[0], y[2], (size_t)(rows * n) * sizeof(float)));
        cpu_rmsnorm(pools[2], x, w, x, rows, n, 1e-6f); /* in place */
        HM_CHECK(!memcmp(y[0], x, (size_t)(rows * n) * sizeof(float)));
        for (int p = 0; p < 3; p++) free(y[p]);
        free(x); free(w); free(y0);
    }
}

/* The definition in cpu/ops.h, element by element: 32 double chains (element i into chain
 * i mod 32), the halving tree, (float)(sum / n), 1 / sqrtf(mean + eps), (x * s) * w. */
static void ref_rmsnorm_row(const float *x, const float *w, float *y, int64_t n, float eps) {
    double c[32] = {0.0};
    for (int64_t i = 0; i < n; i++) c[i % 32] += (double)x[i] * (double)x[i];
    for (int h = 16; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) c[l] += c[l + h];
    const float s = 1.0f / sqrtf((float)(c[0] / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) y[i] = w ? (x[i] * s) * w[i] : x[i] * s;
}

/* Bytes of the (AVX2 where the CPU has it) norm against the scalar definition: whole 32-chain
 * rows (the tree in registers), rows with a partial last group, with and without weights,
 * in place. */
static void test_rmsnorm_bits(void) {
    static const int64_t ns[] = {128, 2048, 2880, 32, 8, 100, 4100, 1};
    for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++) {
        const int64_t n = ns[c], rows = 3;
        float *x = frand_vec(rows * n, -3, 3), *w = frand_vec(n, 0.5f, 1.5f);
        x[0] = 1e-20f; /* tiny squares in a chain */
        float *y = malloc((size_t)(rows * n) * sizeof(float)), *r = malloc((size_t)n * sizeof(float));
        for (int wi = 0; wi < 2; wi++) {
            cpu_rmsnorm(NULL, x, wi ? w : NULL, y, rows, n, 1e-6f);
            int same = 1;
            for (int64_t k = 0; k < rows; k++) {
                ref_rmsnorm_row(x + k * n, wi ? w : NULL, r, n, 1e-6f);
                same &= !memcmp(r, y + k * n, (size_t)n * sizeof(float));
            }
            HM_CHECK_MSG(same, "n %lld weights %d", (long long)n, wi);
        }
        cpu_rmsnorm(NULL, x, w, y, rows, n, 1e-6f);
        cpu_rmsnorm(NULL, x, w, x, rows, n, 1e-6f); /* in place */
        HM_CHECK_MSG(!memcmp(x, y, (size_t)(rows * n) * sizeof(float)), "n %lld in place", (long long)n);
        free(x); free(w); free(y); free(r);
    }
    /* Rows whose result hangs on the chain tree: squares 16 * 3 + 4 * 2 + 2^-20 * 2 make the
     * sum 32 (1.75 + 2^-24), a float tie of the mean (n = 32; n = 128 scales it by 1/4), two
     * squares 2.25 * 2^-50 each fall below half an ulp of 56 alone but not together, and
     * 1 / sqrtf tells 1.75 from the next float: the output shows whether the tiny chains meet
     * before the big ones as the tree says. Chains drawn at random, 300 rows. */
    float x32[128], y32[128], r32[128];
    int differ = 0, sensitive = 0;
    for (int trial = 0; trial < 300; trial++) {
        const int64_t n = trial % 2 ? 128 : 32;
        int ch[9];
        for (int i = 0; i < 9; i++) {
            int again;
            do {
                ch[i] = (int)(urand() * 32.0) % 32;
                again = 0;
                for (int j = 0; j < i; j++) again |= ch[j] == ch[i];
            } while (again);
        }
        memset(x32, 0, sizeof(x32));
        const float v[9] = {4.0f, 4.0f, 4.0f, 2.0f, 2.0f, 0x1p-10f, 0x1p-10f, 1.5f * 0x1p-25f,
                            1.5f * 0x1p-25f};
        for (int i = 0; i < 9; i++) x32[ch[i]] = v[i];
        cpu_rmsnorm(NULL, x32, NULL, y32, 1, n, 0.0f);
        ref_rmsnorm_row(x32, NULL, r32, n, 0.0f);
        differ += memcmp(y32, r32, (size_t)n * sizeof(float)) != 0;
        double seq = 0.0; /* another order: the plain sum */
        for (int64_t i = 0; i < n; i++) seq += (double)x32[i] * (double)x32[i];
        sensitive += 1.0f / sqrtf((float)(seq / (double)n)) != 1.0f / sqrtf((float)(56.0 / (double)n));
    }
    HM_CHECK_MSG(differ == 0, "%d of 300 tie rows differ from the definition", differ);
    HM_CHECK_MSG(sensitive > 0, "the tie rows never depend on the summation order (test too weak)");
}

/* Slot combine bytes against the documented order, one token at a time (the decode shape:
 * 8 slots of 2048, and lengths with a partial last 8-element group), a skipped slot included. */
static void test_combine_bits(void) {
    static const int64_t ns[] = {2048, 2880, 13, 1};
    for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++) {
        const int64_t n = ns[c];
        const int nu = 8;
        float *ys = frand_vec(2 * nu * n, -2, 2), *w = frand_vec(2 * nu, -1, 1);
        float *out = malloc((size_t)(2 * n) * sizeof(float)), *ref = malloc((size_t)(2 * n) * sizeof(float));
        int32_t ids[16];
        for (int i = 0; i < 2 * nu; i++) ids[i] = i == 3 ? -1 : i;
        for (int with_ids = 0; with_ids < 2; with_ids++) {
            const int32_t *id = with_ids ? ids : NULL;
            cpu_moe_combine(NULL, ys, w, id, 2, nu, n, out);
            for (int64_t t = 0; t < 2; t++)
                for (int64_t i = 0; i < n; i++) {
                    float acc = 0.0f;
                    for (int sl = 0; sl < nu; sl++) {
                        if (id && id[t * nu + sl] < 0) continue;
                        acc = acc + w[t * nu + sl] * ys[(t * nu + sl) * n + i];
                    }
                    ref[t * n + i] = acc;
                }
            HM_CHECK_MSG(!memcmp(out, ref, (size_t)(2 * n) * sizeof(float)), "n %lld ids %d",
                         (long long)n, with_ids);
        }
        free(ys); free(w); free(out); free(ref);
    }
}

/* ------------------------------------------------------------------ elementwise */

static void test_elementwise(void) {
    HM_REQUIRE(pools_up());
    const int64_t n = 100003;
    float *a = frand_vec(n, -9, 9), *b = frand_vec(n, -9, 9);
    float *y[3];
    for (int p = 0; p < 3; p++) y[p] = malloc((size_t)n * sizeof(float));
    int ok_add = 1, ok_mul = 1, ok_scale = 1;
    for (int p = 0; p < 3; p++) {
        cpu_add(pools[p], a, b, y[p], n);
        for (int64_t i = 0; i < n; i++) ok_add &= y[p][i] == a[i] + b[i];
        cpu_mul(pools[p], a, b, y[p], n);
        for (int64_t i = 0; i < n; i++) ok_mul &= y[p][i] == a[i] * b[i];
        cpu_scale(pools[p], a, 0.37f, y[p], n);
        for (int64_t i = 0; i < n; i++) ok_scale &= y[p][i] == a[i] * 0.37f;
    }
    HM_CHECK(ok_add && ok_mul && ok_scale);

    /* activations against double; results identical across thread counts */
    double e_silu = 0, e_sig = 0, e_sw = 0, e_oai = 0;
    for (int p = 0; p < 3; p++) cpu_swiglu_oai(pools[p], a, b, y[p], n, 1.702f, 7.0f);
    HM_CHECK(!memcmp(y[0], y[1], (size_t)n * 4) && !memcmp(y[0], y[2], (size_t)n * 4));
    for (int64_t i = 0; i < n; i++) { /* transformers GptOssExperts, in double */
        double g = fmin(a[i], 7.0), u = fmax(-7.0, fmin(b[i], 7.0));
        double ref = g / (1.0 + exp(-g * 1.702)) * (u + 1.0);
        double e = fabs(y[0][i] - ref) / fmax(fabs(ref), 1e-3);
        if (e > e_oai) e_oai = e;
    }
    cpu_swiglu(pools[1], a, b, y[1], n);
    cpu_silu(pools[2], a, y[2], n);
    cpu_sigmoid(pools[0], a, y[0], n);
    for (int64_t i = 0; i < n; i++) {
        double sg = 1.0 / (1.0 + exp(-(double)a[i]));
        double es = fabs(y[0][i] - sg) / sg;
        double el = fabs(y[2][i] - a[i] * sg) / fmax(fabs(a[i] * sg), 1e-6);
        double ew = fabs(y[1][i] - a[i] * sg * b[i]) / fmax(fabs(a[i] * sg * b[i]), 1e-6);
        if (es > e_sig) e_sig = es;
        if (el > e_silu) e_silu = el;
        if (ew > e_sw) e_sw = ew;
    }
    HM_CHECK_MSG(e_sig < 1e-6 && e_silu < 1e-6 && e_sw < 1e-6, "sig %g silu %g swiglu %g", e_sig,
                 e_silu, e_sw);
    HM_CHECK_MSG(e_oai < 1e-6, "swiglu_oai rel %g", e_oai);
    /* clamp corners: gate above the limit, up outside [-limit, limit] */
    float g4[4] = {8.0f, 8.0f, -3.0f, 100.0f}, u4[4] = {8.0f, -9.0f, 20.0f, -1.0f}, o4[4];
    cpu_swiglu_oai(NULL, g4, u4, o4, 4, 1.702f, 7.0f);
    double r0 = 7.0 / (1 + exp(-7.0 * 1.702)) * 8.0, r1 = 7.0 / (1 + exp(-7.0 * 1.702)) * -6.0;
    double r2 = -3.0 / (1 + exp(3.0 * 1.702)) * 8.0;
    HM_CHECK(fabs(o4[0] - r0) < 1e-5 && fabs(o4[1] - r1) < 1e-5 && fabs(o4[2] - r2) < 1e-6);
    HM_CHECK(o4[3] == 0.0f); /* up = -1 -> (u + 1) = 0 */

    /* bit-identical to the scalar definitions (ops_math.h) whatever kernel ran, specials too */
    {
        const float sp[12] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.8f, -88.8f, 120.0f,
                              -120.0f, 7.0f, -7.0f, 1e-40f};
        for (int i = 0; i < 12; i++) { a[i] = sp[i]; b[i] = sp[11 - i]; }
        long bad = 0;
#define SAME(x, y) (hm_f32_to_bits(x) == hm_f32_to_bits(y) || (isnan(x) && isnan(y)))
        cpu_silu(pools[2], a, y[0], n);
        cpu_sigmoid(pools[2], a, y[1], n);
        cpu_swiglu(pools[2], a, b, y[2], n);
        for (int64_t i = 0; i < n; i++) {
            bad += !SAME(y[0][i], hm_siluf(a[i]));
            bad += !SAME(y[1][i], hm_sigmoidf(a[i]));
            bad += !SAME(y[2][i], hm_siluf(a[i]) * b[i]);
        }
        cpu_swiglu_oai(pools[2], a, b, y[0], n, 1.702f, 7.0f);
        for (int64_t i = 0; i < n; i++) {
            float g = a[i] > 7.0f ? 7.0f : a[i];
            float u = b[i] > 7.0f ? 7.0f : (b[i] < -7.0f ? -7.0f : b[i]);
            bad += !SAME(y[0][i], (g * hm_sigmoidf(g * 1.702f)) * (u + 1.0f));
        }
        cpu_geglu(pools[2], a, b, y[0], n);
        for (int64_t i = 0; i < n; i++) bad += !SAME(y[0][i], hm_geluf(a[i]) * b[i]);
        for (int simd = 0; simd < 2; simd++) { /* odd offsets and lengths: vector and tail */
            float sg[203];
            for (int64_t i0 = 0; i0 < 1000; i0 += 197) {
                const int64_t len = 203 - i0 % 11;
                cpu_swiglu_slice(a + i0, b + i0, sg, len, CPU_GLU_GELU, 0, 0,
                                 simd && cpu_act_simd());
                for (int64_t i = 0; i < len; i++) bad += !SAME(sg[i], y[0][i0 + i]);
            }
        }
        /* the caller-side slices (both SIMD choices, odd offsets and lengths) equal the pooled ops */
        cpu_swiglu(pools[2], a, b, y[1], n);
        cpu_swiglu_oai(pools[2], a, b, y[2], n, 1.702f, 7.0f);
        float sl[203];
        for (int oai = 0; oai < 2; oai++)
            for (int simd = 0; simd < 2; simd++)
                for (int64_t i0 = 0; i0 < 1000; i0 += 203 - 3 * simd) {
                    int64_t len = 203 - i0 % 13;
                    cpu_swiglu_slice(a + i0, b + i0, sl, len, oai, 1.702f, 7.0f,
                                     simd && cpu_act_simd());
                    for (int64_t i = 0; i < len; i++) bad += !SAME(sl[i], y[1 + oai][i0 + i]);
                }
#undef SAME
        HM_CHECK_MSG(bad == 0, "%ld activations differ from the scalar definition", bad);
    }

    /* gemma's gated GELU (tanh form): the same bytes at every thread count and in slices,
     * within float rounding of the definition in double */
    {
        for (int p = 0; p < 3; p++) cpu_geglu(pools[p], a, b, y[p], n);
        HM_CHECK(!memcmp(y[0], y[1], (size_t)n * 4) && !memcmp(y[0], y[2], (size_t)n * 4));
        double e_ge = 0; /* error over |ref| + |g up|: 1 + tanh cancels for g << 0, in float
                            as in torch's float32 gelu_pytorch_tanh */
        for (int64_t i = 0; i < n; i++) {
            const double g = a[i], t = tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g));
            const double ref = 0.5 * g * (1.0 + t) * b[i];
            e_ge = fmax(e_ge, fabs(y[0][i] - ref) / (fabs(ref) + fabs(g * b[i]) + 1e-30));
        }
        HM_CHECK_MSG(e_ge < 1e-6, "geglu err %g", e_ge);
        float sl[203];
        long bad = 0;
        for (int64_t i0 = 0; i0 < 1000; i0 += 203) {
            cpu_swiglu_slice(a + i0, b + i0, sl, 203, CPU_GLU_GELU, 0, 0, cpu_act_simd());
            bad += memcmp(sl, y[0] + i0, sizeof(sl)) != 0;
        }
        HM_CHECK_MSG(bad == 0, "%ld geglu slices differ from the pooled op", bad);
    }

    /* bias broadcast, expert bias, slot combine (in slot order, skipped slots) */
    float x6[6] = {1, 2, 3, 4, 5, 6}, bb[3] = {0.5f, -1, 2};
    cpu_add_bias(NULL, x6, bb, 2, 3);
    HM_CHECK(x6[0] == 1.5f && x6[1] == 1 && x6[2] == 5 && x6[3] == 4.5f && x6[5] == 8);
    float eb[3 * 2] = {10, 20, 30, 40, 50, 60}; /* [3 experts][2] */
    int32_t ids[2 * 2] = {2, -1, 0, 1};          /* [2 tok][2 slots] */
    float ys[2 * 2 * 2] = {1, 1, 7, 7, 2, 2, 3, 3};
    cpu_moe_add_bias(NULL, ys, eb, ids, 2, 2, 2);
    HM_CHECK(ys[0] == 51 && ys[1] == 61 && ys[2] == 7 && ys[4] == 12 && ys[5] == 22 && ys[6] == 33);
    float wts[4] = {0.25f, 100.0f, 0.5f, 0.5f}, outc[4];
    cpu_moe_combine(NULL, ys, wts, ids, 2, 2, 2, outc);
    HM_CHECK(outc[0] == 0.25f * 51 && outc[1] == 0.25f * 61); /* slot 1 skipped */
    HM_CHECK(outc[2] == 0.5f * 12 + 0.5f * 33 && outc[3] == 0.5f * 22 + 0.5f * 43);
    /* combine and expert bias at a size that uses the pool: same bits for 1, 2, 3 threads and
     * equal to the documented order */
    {
        const int64_t nt = 64, nd = 256;
        const int nu = 4, ne = 8;
        float *ysl = frand_vec(nt * nu * nd, -2, 2), *wsl = frand_vec(nt * nu, 0, 1);
        float *bsl = frand_vec(ne * nd, -1, 1), *ys2 = malloc((size_t)(nt * nu * nd) * 4);
        int32_t *isl = malloc((size_t)(nt * nu) * 4);
        for (int64_t i = 0; i < nt * nu; i++) isl[i] = (int32_t)((i * 5) % (ne + 1)) - 1;
        float *o[3];
        int same = 1, formula = 1;
        for (int p = 0; p < 3; p++) {
            memcpy(ys2, ysl, (size_t)(nt * nu * nd) * 4);
            cpu_moe_add_bias(pools[p], ys2, bsl, isl, nt, nu, nd);
            o[p] = malloc((size_t)(nt * nd) * 4);
            cpu_moe_combine(pools[p], ys2, wsl, isl, nt, nu, nd, o[p]);
            if (p) same &= !memcmp(o[0], o[p], (size_t)(nt * nd) * 4);
        }
        for (int64_t t = 0; t < nt; t++)
            for (int64_t i = 0; i < nd; i++) {
                float acc = 0.0f;
                for (int sl = 0; sl < nu; sl++) {
                    int32_t e = isl[t * nu + sl];
                    if (e < 0) continue;
                    float yv = ysl[(t * nu + sl) * nd + i] + bsl[e * nd + i];
                    acc = acc + wsl[t * nu + sl] * yv;
                }
                formula &= acc == o[0][t * nd + i];
            }
        HM_CHECK(same && formula);
        for (int p = 0; p < 3; p++) free(o[p]);
        free(ysl); free(wsl); free(bsl); free(ys2); free(isl);
    }
    for (int p = 0; p < 3; p++) free(y[p]);
    free(a); free(b);
}

/* ------------------------------------------------------------------ RoPE */

/* transformers-style reference: inv_freq (with YaRN's mix) in double, then angle = pos*inv. */
static void ref_rope(const float *x, double *out, int hd, int n_dims, int neox, int pos,
                     double base, double factor, int yarn, int orig, int truncate) {
    double attn = 1.0, lo = 0, hi = 0;
    if (yarn) {
        attn = 0.1 * log(factor) + 1.0;
        lo = n_dims * log(orig / (32.0 * 2 * M_PI)) / (2 * log(base));
        hi = n_dims * log(orig / (1.0 * 2 * M_PI)) / (2 * log(base));
        if (truncate) { lo = floor(lo); hi = ceil(hi); }
        lo = fmax(lo, 0); hi = fmin(hi, n_dims - 1);
        if (lo == hi) hi += 0.001;
    }
    for (int d = 0; d < hd; d++) out[d] = x[d];
    for (int i = 0; i < n_dims / 2; i++) {
        double pf = pow(base, 2.0 * i / n_dims), inv = 1.0 / pf;
        if (yarn) {
            double ramp = fmin(1.0, fmax(0.0, (i - lo) / (hi - lo)));
            double ef = 1.0 - ramp;
            inv = (1.0 / (factor * pf)) * (1 - ef) + inv * ef;
        }
        double c = cos(pos * inv) * attn, s = sin(pos * inv) * attn;
        int i0 = neox ? i : 2 * i, i1 = neox ? i + n_dims / 2 : 2 * i + 1;
        out[i0] = x[i0] * c - x[i1] * s;
        out[i1] = x[i1] * c + x[i0] * s;
    }
}

static double rope_case(int neox, int hd, int n_dims, double base, int yarn, int truncate,
                        float *out_copy) {
    const int n_tok = 9, n_head = 3;
    int32_t pos[9] = {0, 1, 2, 17, 100, 1000, 4095, 4096, 13111};
    float *x = frand_vec((int64_t)n_tok * n_head * hd, -1, 1);
    float *x0 = malloc((size_t)n_tok * n_head * hd * sizeof(float));
    memcpy(x0, x, (size_t)n_tok * n_head * hd * sizeof(float));
    cpu_rope_params p = cpu_rope_default(neox ? CPU_ROPE_NEOX : CPU_ROPE_NORM, n_dims, (float)base);
    if (yarn) {
        p.freq_scale = 1.0f / 32.0f;
        p.ext_factor = 1.0f;
        p.n_ctx_orig = 4096;
        p.yarn_truncate = truncate;
    }
    hm_error err;
    if (cpu_rope(pools[1], x, n_tok, n_head, hd, pos, &p, &err) != HM_OK) return 1e9;
    double maxe = 0, ref[256];
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const float *xi = x0 + (t * n_head + h) * hd;
            ref_rope(xi, ref, hd, n_dims, neox, pos[t], base, 32.0, yarn, 4096, truncate);
            for (int d = 0; d < hd; d++) {
                double e = fabs(x[(t * n_head + h) * hd + d] - ref[d]);
                if (e > maxe) maxe = e;
            }
        }
    /* thread-count invariance */
    float *x3 = malloc((size_t)n_tok * n_head * hd * sizeof(float));
    memcpy(x3, x0, (size_t)n_tok * n_head * hd * sizeof(float));
    cpu_rope(pools[2], x3, n_tok, n_head, hd, pos, &p, NULL);
    if (memcmp(x3, x, (size_t)n_tok * n_head * hd * sizeof(float))) maxe = 1e9;
    /* the two-step form (cos/sin table once, then rotation) gives the same bytes */
    float *cs = malloc((size_t)n_tok * (size_t)n_dims * sizeof(float));
    memcpy(x3, x0, (size_t)n_tok * n_head * hd * sizeof(float));
    if (cpu_rope_table(&p, hd, pos, n_tok, cs, NULL) != HM_OK ||
        cpu_rope_with_table(pools[2], x3, n_tok, n_head, hd, cs, &p, NULL) != HM_OK ||
        memcmp(x3, x, (size_t)n_tok * n_head * hd * sizeof(float)))
        maxe = 1e9;
    free(cs);
    cpu_rope(NULL, x0, n_tok, n_head, hd, pos, &p, NULL);
    if (memcmp(x0, x, (size_t)n_tok * n_head * hd * sizeof(float))) maxe = 1e9;
    if (out_copy) memcpy(out_copy, x, (size_t)n_tok * n_head * hd * sizeof(float));
    free(x); free(x0); free(x3);
    return maxe;
}

/* Bytes of the table rotation (AVX2 for neox where the CPU has it) against the definition's
 * float operations, (x0 * c - x1 * s, x0 * s + x1 * c), with the table's c and s: qwen3's
 * heads (64 pairs), a partial rotation of 50 pairs (not a multiple of 8), and the norm order. */
static void test_rope_table_bits(void) {
    static const int shapes[][3] = {{CPU_ROPE_NEOX, 128, 128}, {CPU_ROPE_NEOX, 128, 100},
                                    {CPU_ROPE_NORM, 128, 100}, {CPU_ROPE_NEOX, 64, 64}};
    for (size_t c = 0; c < sizeof(shapes) / sizeof(shapes[0]); c++) {
        const int mode = shapes[c][0], hd = shapes[c][1], nd = shapes[c][2], nh = 32, np = nd / 2;
        cpu_rope_params p = cpu_rope_default((cpu_rope_mode)mode, nd, 1000000.0f);
        const int32_t pos[2] = {7, 40001};
        float cs[2 * 2 * 64];
        hm_error err;
        HM_REQUIRE(cpu_rope_table(&p, hd, pos, 2, cs, &err) == HM_OK);
        float *x = frand_vec(2 * nh * hd, -2, 2), *ref = malloc((size_t)(2 * nh * hd) * sizeof(float));
        memcpy(ref, x, (size_t)(2 * nh * hd) * sizeof(float));
        for (int t = 0; t < 2; t++)
            for (int h = 0; h < nh; h++) {
                float *r = ref + (t * nh + h) * hd;
                for (int i = 0; i < np; i++) {
                    const float cc = cs[t * 2 * np + 2 * i], ss = cs[t * 2 * np + 2 * i + 1];
                    float *r0 = mode == CPU_ROPE_NEOX ? r + i : r + 2 * i;
                    float *r1 = mode == CPU_ROPE_NEOX ? r + np + i : r + 2 * i + 1;
                    const float x0 = *r0, x1 = *r1;
                    *r0 = x0 * cc - x1 * ss;
                    *r1 = x0 * ss + x1 * cc;
                }
            }
        HM_REQUIRE(cpu_rope_with_table(NULL, x, 2, nh, hd, cs, &p, &err) == HM_OK);
        HM_CHECK_MSG(!memcmp(x, ref, (size_t)(2 * nh * hd) * sizeof(float)), "mode %d hd %d n_dims %d",
                     mode, hd, nd);
        free(x); free(ref);
    }
}

static void test_rope(void) {
    HM_REQUIRE(pools_up());
    /* |x| <= 1; errors come from rounding cos/sin and the float rotation */
    double e;
    e = rope_case(0, 128, 128, 10000.0, 0, 0, NULL);
    HM_CHECK_MSG(e < 2e-6, "norm: %g", e);
    e = rope_case(1, 128, 128, 1000000.0, 0, 0, NULL);
    HM_CHECK_MSG(e < 2e-6, "neox: %g", e);
    e = rope_case(0, 96, 64, 10000.0, 0, 0, NULL); /* partial rotation: dims 64..95 untouched */
    HM_CHECK_MSG(e < 2e-6, "partial: %g", e);
    /* gpt-oss: head_dim 64, theta 150000, YaRN factor 32 over 4096, beta 32/1, mscale 1.3466 */
    static float a[9 * 3 * 64], b[9 * 3 * 64];
    rng_state = 77;
    e = rope_case(1, 64, 64, 150000.0, 1, 0, a);
    HM_CHECK_MSG(e < 4e-6, "yarn (truncate false, gpt-oss): %g", e);
    rng_state = 77;
    e = rope_case(1, 64, 64, 150000.0, 1, 1, b);
    HM_CHECK_MSG(e < 4e-6, "yarn (truncate true, llama.cpp): %g", e);
    double diff = 0;
    for (int i = 0; i < 9 * 3 * 64; i++) diff = fmax(diff, fabs(a[i] - b[i]));
    HM_CHECK_MSG(diff > 1e-3, "truncate must matter on gpt-oss's config (diff %g)", diff);
    /* frequency factors (gemma4's proportional rope): pairs of factor 1 as without them, pairs
     * of factor 1e30 unrotated, a factor 2 as half the angle */
    {
        float ff[16], xf[2 * 32], xp[2 * 32], xh[2 * 32];
        for (int i = 0; i < 16; i++) ff[i] = i < 4 ? 1.0f : i == 4 ? 2.0f : 1e30f;
        for (int i = 0; i < 64; i++) xf[i] = xp[i] = xh[i] = (float)sin(0.7 * i + 0.1);
        const int32_t ps[2] = {3, 1000};
        const int32_t half[2] = {0, 500}; /* pair 4's angle at 1000 / 2, pos 3 / 2 not whole */
        hm_error er;
        cpu_rope_params q = cpu_rope_default(CPU_ROPE_NEOX, 32, 1e6f), q0 = q;
        q.freq_factors = ff;
        HM_CHECK(cpu_rope(NULL, xf, 2, 1, 32, ps, &q, &er) == HM_OK);
        HM_CHECK(cpu_rope(NULL, xp, 2, 1, 32, ps, &q0, &er) == HM_OK);
        int okf = 1;
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < 16; i++) {
                const float *f = xf + 32 * t, *p0 = xp + 32 * t, *x0 = xh + 32 * t;
                if (i < 4) okf &= f[i] == p0[i] && f[i + 16] == p0[i + 16];
                if (i > 4) okf &= f[i] == x0[i] && f[i + 16] == x0[i + 16];
            }
        /* pair 4 at position 1000 with factor 2: the plain angle of pair 4 at position 500 */
        float xq[32];
        for (int i = 0; i < 32; i++) xq[i] = xh[32 + i];
        HM_CHECK(cpu_rope(NULL, xq, 1, 1, 32, &half[1], &q0, &er) == HM_OK);
        HM_CHECK_MSG(okf && fabsf(xq[4] - xf[32 + 4]) < 1e-6f &&
                         fabsf(xq[20] - xf[32 + 20]) < 1e-6f,
                     "rope frequency factors");
    }
    /* bad parameters */
    cpu_rope_params p = cpu_rope_default(CPU_ROPE_NEOX, 65, 10000.0f);
    float x[128] = {0};
    int32_t pos0 = 0;
    hm_error err;
    HM_CHECK(cpu_rope(NULL, x, 1, 1, 128, &pos0, &p, &err) == HM_ERR_ARG);
    p.n_dims = 256;
    HM_CHECK(cpu_rope(NULL, x, 1, 1, 128, &pos0, &p, &err) == HM_ERR_ARG);
}

/* ------------------------------------------------------------------ routers */

/* Reference: scores in double, order by (score desc, id asc) with a plain selection. */
static void ref_router(const float *l, const float *bias, int n, int k, int mode, int renorm,
                       int32_t *ids, double *w) {
    double sc[256];
    for (int e = 0; e < n; e++) sc[e] = (double)l[e] + (bias ? (double)bias[e] : 0.0);
    if (mode == CPU_GATE_SOFTMAX_TOPK) {
        double m = -INFINITY, s = 0;
        for (int e = 0; e < n; e++) m = fmax(m, sc[e]);
        for (int e = 0; e < n; e++) s += exp(sc[e] - m);
        for (int e = 0; e < n; e++) sc[e] = exp(sc[e] - m) / s;
    }
    int used[256] = {0};
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (!used[e] && (best < 0 || sc[e] > sc[best])) best = e;
        used[best] = 1;
        ids[i] = best;
        w[i] = sc[best];
    }
    if (mode == CPU_GATE_TOPK_SOFTMAX) {
        double s = 0, m = w[0];
        for (int i = 0; i < k; i++) s += exp(w[i] - m);
        for (int i = 0; i < k; i++) w[i] = exp(w[i] - m) / s;
    } else if (renorm) {
        double s = 0;
        for (int i = 0; i < k; i++) s += w[i];
        for (int i = 0; i < k; i++) w[i] /= s;
    }
}

static void test_router(void) {
    HM_REQUIRE(pools_up());
    const int n_tok = 300, n = 128, k = 8;
    float *l = frand_vec(n_tok * n, -4, 4), *bias = frand_vec(n, -1, 1);
    int32_t ids[3][300 * 8], rid[8];
    float w[3][300 * 8];
    double rw[8];
    for (int mode = 0; mode < 2; mode++)
        for (int renorm = 0; renorm < 2; renorm++)
            for (int wb = 0; wb < 2; wb++) {
                for (int p = 0; p < 3; p++)
                    HM_CHECK(cpu_router(pools[p], l, wb ? bias : NULL, n_tok, n, k, (cpu_gate_mode)mode,
                                        renorm, ids[p], w[p], NULL) == HM_OK);
                HM_CHECK(!memcmp(ids[0], ids[1], sizeof(ids[0])) && !memcmp(ids[0], ids[2], sizeof(ids[0])));
                HM_CHECK(!memcmp(w[0], w[1], sizeof(w[0])) && !memcmp(w[0], w[2], sizeof(w[0])));
                int id_ok = 1;
                double maxe = 0;
                for (int t = 0; t < n_tok; t++) {
                    ref_router(l + t * n, wb ? bias : NULL, n, k, mode, renorm, rid, rw);
                    for (int i = 0; i < k; i++) {
                        id_ok &= rid[i] == ids[0][t * k + i];
                        maxe = fmax(maxe, fabs(w[0][t * k + i] - rw[i]) / rw[i]);
                    }
                }
                HM_CHECK_MSG(id_ok, "mode %d renorm %d bias %d: ids differ", mode, renorm, wb);
                HM_CHECK_MSG(maxe < 2e-6, "mode %d renorm %d bias %d: weight rel %g", mode, renorm, wb, maxe);
            }
    /* ties: lower id first, in both modes */
    float tl[6] = {1, 3, 3, 2, 3, 2};
    int32_t ti[4];
    float tw[4];
    cpu_router(NULL, tl, NULL, 1, 6, 4, CPU_GATE_SOFTMAX_TOPK, 1, ti, tw, NULL);
    HM_CHECK(ti[0] == 1 && ti[1] == 2 && ti[2] == 4 && ti[3] == 3);
    HM_CHECK(tw[0] == tw[1] && tw[1] == tw[2] && tw[3] < tw[2]);
    cpu_router(NULL, tl, NULL, 1, 6, 4, CPU_GATE_TOPK_SOFTMAX, 0, ti, tw, NULL);
    HM_CHECK(ti[0] == 1 && ti[1] == 2 && ti[2] == 4 && ti[3] == 3);
    float eq[16];
    for (int i = 0; i < 16; i++) eq[i] = 0.5f;
    cpu_router(NULL, eq, NULL, 1, 16, 4, CPU_GATE_SOFTMAX_TOPK, 0, ti, tw, NULL);
    HM_CHECK(ti[0] == 0 && ti[1] == 1 && ti[2] == 2 && ti[3] == 3 && tw[0] == 1.0f / 16);
    cpu_router(NULL, eq, NULL, 1, 16, 4, CPU_GATE_SOFTMAX_TOPK, 1, ti, tw, NULL);
    HM_CHECK(tw[0] == 0.25f && tw[3] == 0.25f);
    /* errors */
    hm_error err;
    HM_CHECK(cpu_router(NULL, tl, NULL, 1, 6, 7, CPU_GATE_SOFTMAX_TOPK, 1, ti, tw, &err) == HM_ERR_ARG);
    HM_CHECK(cpu_router(NULL, tl, NULL, 1, 6, 0, CPU_GATE_SOFTMAX_TOPK, 1, ti, tw, &err) == HM_ERR_ARG);
    tl[2] = NAN;
    HM_CHECK(cpu_router(NULL, tl, NULL, 1, 6, 2, CPU_GATE_TOPK_SOFTMAX, 0, ti, tw, &err) == HM_ERR_RANGE);
    free(l); free(bias);
}

static void test_cleanup(void) {
    for (int i = 0; i < 3; i++) {
        tp_free(pools[i]);
        pools[i] = NULL;
    }
}

HM_TEST_MAIN(test_rmsnorm, test_rmsnorm_bits, test_combine_bits, test_elementwise, test_rope, test_rope_table_bits, test_router, test_cleanup)
