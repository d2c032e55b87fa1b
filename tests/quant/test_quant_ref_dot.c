/* test_quant_ref_dot.c - quant_dot_ref, the canonical dot product, checked two ways for every
 * weight type and several row lengths (block counts below, at and above the 32 lanes):
 *  (a) close to a float64 dot of the dequantised weights and dequantised activations;
 *  (b) bit-identical to an independent re-implementation of ARITHMETIC.md §2-3 written here:
 *      it decodes the blocks from raw byte offsets (not the structs or quant/ helpers) into
 *      integer weights and integer sub-block scales, recomputes the activation sums from qs
 *      (instead of using the stored sum / bsums), and follows the doc's formulas literally.
 * Weights are both quantised Gaussian data and random bytes (every bit pattern of the scales
 * and quants; fp16 scales kept finite). Also the reference kernel table and its dispatch. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "quant/quant.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rng_u32(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 32);
}
static float rng_gauss(void) {
    const double u1 = ((double)rng_u32() + 0.5) / 4294967296.0;
    const double u2 = ((double)rng_u32() + 0.5) / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static const uint32_t k_wtypes[] = {HM_TYPE_F32,    HM_TYPE_F16,  HM_TYPE_BF16, HM_TYPE_Q4_0,
                                    HM_TYPE_Q4_1,   HM_TYPE_Q5_0, HM_TYPE_Q5_1, HM_TYPE_Q8_0,
                                    HM_TYPE_Q4_K,   HM_TYPE_Q5_K, HM_TYPE_Q6_K, HM_TYPE_IQ4_NL,
                                    HM_TYPE_IQ4_XS, HM_TYPE_MXFP4};
#define N_WTYPES (int)(sizeof(k_wtypes) / sizeof(k_wtypes[0]))

/* ---- the independent re-implementation ---- */

static const int kv_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};
static const int kv_mx[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float rd_f16(const uint8_t *p) { return hm_fp16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }
static float rd_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
static int32_t rd_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}
/* element e (0..31) of 16 bytes in q4_0 order: low nibbles are 0..15, high nibbles 16..31 */
static int nib(const uint8_t *qs, int e) { return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4; }

/* One decoded weight block: w[i] is the integer the doc multiplies with a[i] (offset already
 * applied), sub-blocks of `sub` elements carry integer scale sc[] and min mn[]; d, m the floats. */
typedef struct {
    int w[256], sc[16], mn[16], sub;
    float d, m;
} dec_block;

static void decode(uint32_t t, const uint8_t *b, dec_block *o) {
    o->sub = 32;
    o->d = o->m = 0.0f;
    for (int j = 0; j < 16; j++) o->sc[j] = 1, o->mn[j] = 0;
    switch (t) {
    case HM_TYPE_Q4_0: /* d @0, qs @2 */
        o->d = rd_f16(b);
        for (int e = 0; e < 32; e++) o->w[e] = nib(b + 2, e) - 8;
        break;
    case HM_TYPE_Q4_1: /* d @0, m @2, qs @4 */
        o->d = rd_f16(b), o->m = rd_f16(b + 2);
        for (int e = 0; e < 32; e++) o->w[e] = nib(b + 4, e);
        break;
    case HM_TYPE_Q5_0: /* d @0, qh @2 (bit e = bit 4 of element e), qs @6 */
        o->d = rd_f16(b);
        for (int e = 0; e < 32; e++)
            o->w[e] = (nib(b + 6, e) | (((b[2 + e / 8] >> (e % 8)) & 1) << 4)) - 16;
        break;
    case HM_TYPE_Q5_1: /* d @0, m @2, qh @4, qs @8 */
        o->d = rd_f16(b), o->m = rd_f16(b + 2);
        for (int e = 0; e < 32; e++)
            o->w[e] = nib(b + 8, e) | (((b[4 + e / 8] >> (e % 8)) & 1) << 4);
        break;
    case HM_TYPE_Q8_0: /* d @0, qs @2 (int8) */
        o->d = rd_f16(b);
        for (int e = 0; e < 32; e++) o->w[e] = (int8_t)b[2 + e];
        break;
    case HM_TYPE_IQ4_NL: /* d @0, qs @2 */
        o->d = rd_f16(b);
        for (int e = 0; e < 32; e++) o->w[e] = kv_iq4[nib(b + 2, e)];
        break;
    case HM_TYPE_MXFP4: /* e @0, qs @1; d = 2^(e-128) */
        o->d = ldexpf(1.0f, (int)b[0] - 128);
        for (int e = 0; e < 32; e++) o->w[e] = kv_mx[nib(b + 1, e)];
        break;
    case HM_TYPE_Q4_K:
    case HM_TYPE_Q5_K: { /* d @0, dmin @2, scales @4 (12); q5_K: qh @16 (32); qs @16 or @48 */
        const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (t == HM_TYPE_Q5_K ? 48 : 16);
        o->d = rd_f16(b), o->m = rd_f16(b + 2);
        for (int j = 0; j < 8; j++) {
            o->sc[j] = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
            o->mn[j] = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        for (int e = 0; e < 256; e++) {
            const int j = e / 32, byte = qs[32 * (j / 2) + e % 32];
            o->w[e] = (j & 1) ? byte >> 4 : byte & 15;
            if (t == HM_TYPE_Q5_K) o->w[e] |= ((qh[e % 32] >> j) & 1) << 4;
        }
        break;
    }
    case HM_TYPE_Q6_K: { /* ql @0 (128), qh @128 (64), scales @192 (16 x int8), d @208 */
        o->sub = 16;
        o->d = rd_f16(b + 208);
        for (int j = 0; j < 16; j++) o->sc[j] = (int8_t)b[192 + j];
        for (int e = 0; e < 256; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            const int lo = (b[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
            const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
            o->w[e] = (lo | (hi << 4)) - 32;
        }
        break;
    }
    case HM_TYPE_IQ4_XS: { /* d @0, scales_h @2 (u16), scales_l @4 (4), qs @8 (128) */
        const int sh = b[2] | (b[3] << 8);
        o->d = rd_f16(b);
        for (int j = 0; j < 8; j++) {
            o->sc[j] = (((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)) - 32;
            for (int e = 0; e < 32; e++) o->w[32 * j + e] = kv_iq4[nib(b + 8 + 16 * j, e)];
        }
        break;
    }
    default:
        break;
    }
}

/* ARITHMETIC.md §2-3 for one row; act is the activation row in its format. */
static float indep_dot(uint32_t t, int64_t n, const uint8_t *w, const uint8_t *act) {
    float acc[32];
    for (int l = 0; l < 32; l++) acc[l] = 0.0f;
    if (t == HM_TYPE_F32 || t == HM_TYPE_F16 || t == HM_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float wi;
            if (t == HM_TYPE_F32)
                wi = rd_f32(w + 4 * i);
            else if (t == HM_TYPE_F16)
                wi = rd_f16(w + 2 * i);
            else
                wi = hm_bf16_to_f32((uint16_t)(w[2 * i] | (w[2 * i + 1] << 8)));
            acc[i % 32] = fmaf(wi, rd_f32(act + 4 * i), acc[i % 32]);
        }
    } else {
        const hm_type_info *ti = hm_type_get(t);
        const int B = ti->block_size;
        const size_t abytes =
            B == 32 ? 40 : 292; /* q8_32: d, sum, qs[32]; q8_K: d, qs[256], bsums */
        dec_block db;
        for (int64_t b = 0; b < n / B; b++) {
            const uint8_t *wb = w + b * ti->type_size, *ab = act + b * abytes;
            const float da = rd_f32(ab);
            const int8_t *a = (const int8_t *)(ab + (B == 32 ? 8 : 4));
            decode(t, wb, &db);
            int32_t s = 0, t_min = 0, sum_a = 0;
            for (int j = 0; j < B / db.sub; j++) {
                int32_t sj = 0, aj = 0;
                for (int i = j * db.sub; i < (j + 1) * db.sub; i++)
                    sj += db.w[i] * a[i], aj += a[i];
                s += db.sc[j] * sj;
                t_min += db.mn[j] * aj;
                sum_a += aj;
            }
            float *lane = &acc[b % 32];
            if (t == HM_TYPE_Q4_1 || t == HM_TYPE_Q5_1) {
                *lane = fmaf(db.d * da, (float)s, *lane);
                *lane = fmaf(db.m * da, (float)sum_a, *lane);
            } else if (t == HM_TYPE_Q4_K || t == HM_TYPE_Q5_K) {
                *lane = fmaf(db.d * da, (float)s, *lane);
                *lane = fmaf(-(db.m * da), (float)t_min, *lane);
            } else {
                *lane = fmaf(db.d * da, (float)s, *lane);
            }
            if (B == 32) HM_CHECK(rd_i32(ab + 4) == sum_a); /* the stored sum agrees */
        }
    }
    for (int s = 16; s >= 1; s /= 2)
        for (int i = 0; i < s; i++) acc[i] = acc[i] + acc[i + s];
    return acc[0];
}

/* ---- the comparisons ---- */

/* Random bytes for nb blocks of t, with the float scale fields made finite (fp16 in ±[2^-10, 4],
 * e8m0 in 118..138) so the float64 comparison is meaningful. */
static void random_blocks(uint32_t t, uint8_t *w, int64_t n) {
    const hm_type_info *ti = hm_type_get(t);
    const size_t bytes = hm_row_size(t, n);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rng_u32();
    for (int64_t b = 0; b < n / ti->block_size; b++) {
        uint8_t *p = w + b * ti->type_size;
        int off[2] = {-1, -1};
        if (t == HM_TYPE_F16 || t == HM_TYPE_BF16)
            off[0] = 0;
        else if (t == HM_TYPE_Q6_K)
            off[0] = 208;
        else if (t == HM_TYPE_MXFP4)
            p[0] = (uint8_t)(118 + rng_u32() % 21);
        else if (t != HM_TYPE_F32)
            off[0] = 0;
        if (t == HM_TYPE_Q4_1 || t == HM_TYPE_Q5_1 || t == HM_TYPE_Q4_K || t == HM_TYPE_Q5_K)
            off[1] = 2;
        for (int k = 0; k < 2; k++) {
            if (off[k] < 0) continue;
            const float v =
                ldexpf((float)(rng_u32() % 1024) / 1024.0f + 1.0f, (int)(rng_u32() % 12) - 10);
            const uint16_t h = t == HM_TYPE_BF16 ? hm_f32_to_bf16(rng_u32() & 1 ? -v : v)
                                                 : hm_f32_to_fp16(rng_u32() & 1 ? -v : v);
            p[off[k]] = (uint8_t)h, p[off[k] + 1] = (uint8_t)(h >> 8);
        }
        if (t == HM_TYPE_F32) {
            const float v = rng_gauss();
            memcpy(p, &v, 4);
        }
    }
}

static void check_type(uint32_t t, int64_t n, int random_bytes) {
    const quant_act at = quant_act_for(t);
    float *x = malloc((size_t)n * sizeof(float)), *wd = malloc((size_t)n * sizeof(float));
    float *ad = malloc((size_t)n * sizeof(float));
    uint8_t *w = malloc(hm_row_size(t, n) + 1), *a = malloc(quant_act_row_size(at, n) + 1);
    HM_REQUIRE(x && wd && ad && w && a);
    if (random_bytes) {
        random_blocks(t, w, n);
    } else {
        for (int64_t i = 0; i < n; i++) x[i] = rng_gauss();
        HM_CHECK(quant_quantize_row(t, x, w, n) == HM_OK);
    }
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss() * 2.0f;
    quant_act_quantize_ref(at, x, a, n);
    HM_CHECK(quant_dequantize_row(t, w, wd, n) == HM_OK);
    /* dequantised activations */
    if (at == QUANT_ACT_F32)
        memcpy(ad, x, (size_t)n * sizeof(float));
    else if (at == QUANT_ACT_Q8_K)
        HM_CHECK(quant_dequantize_row(HM_TYPE_Q8_K, a, ad, n) == HM_OK);
    else
        for (int64_t i = 0; i < n; i++) {
            const block_q8_32 *blk = (const block_q8_32 *)a + i / 32;
            ad[i] = blk->d * (float)blk->qs[i % 32];
        }
    double exact = 0.0, mag = 0.0, wmax = 0.0;
    for (int64_t i = 0; i < n; i++) wmax = fmax(wmax, fabs(wd[i]));
    for (int64_t i = 0; i < n; i++) {
        exact += (double)wd[i] * ad[i];
        mag += (fabs(wd[i]) + wmax) * fabs(ad[i]);
    }
    const float got = quant_dot_ref(t, n, w, a);
    const float indep = indep_dot(t, n, w, a);
    HM_CHECK_MSG(fabs(got - exact) <= 1e-5 * mag + 1e-30, "%s n=%lld %s: dot %.9g, float64 %.9g",
                 hm_type_name(t), (long long)n, random_bytes ? "random bytes" : "quantised",
                 (double)got, exact);
    HM_CHECK_MSG(!memcmp(&got, &indep, 4), "%s n=%lld %s: dot %a, independent %a", hm_type_name(t),
                 (long long)n, random_bytes ? "random bytes" : "quantised", (double)got,
                 (double)indep);
    free(x), free(wd), free(ad), free(w), free(a);
}

static void test_dot_all_types(void) {
    /* block counts 1, 2, 3, 31, 32, 33, 70 (lanes wrap twice) */
    static const int nblocks[] = {1, 2, 3, 31, 32, 33, 70};
    static const int nfloat[] = {1, 7, 31, 32, 33, 64, 100, 1000, 4097};
    for (int k = 0; k < N_WTYPES; k++) {
        const uint32_t t = k_wtypes[k];
        const hm_type_info *ti = hm_type_get(t);
        const int is_float = ti->block_size == 1;
        const int cnt = is_float ? (int)(sizeof(nfloat) / sizeof(nfloat[0]))
                                 : (int)(sizeof(nblocks) / sizeof(nblocks[0]));
        for (int i = 0; i < cnt; i++) {
            const int64_t n = is_float ? nfloat[i] : (int64_t)nblocks[i] * ti->block_size;
            check_type(t, n, 0);
            check_type(t, n, 1);
        }
    }
}

/* the lane order matters: a row where the tree's order is visible in the low bits */
static void test_dot_lane_order(void) {
    enum { N = 64 };
    float w[N], x[N];
    for (int i = 0; i < N; i++) w[i] = 1.0f, x[i] = 0.0f;
    x[0] = 1.0f;      /* lane 0 */
    x[16] = 0x1p-24f; /* lane 16: added to lane 0 first: 1 + 2^-24 rounds to 1 (even) */
    x[48] = 0x1p-24f; /* lane 16 again: lane 16 = 2^-23 then 1 + 2^-23 is exact */
    const float got = quant_dot_ref(HM_TYPE_F32, N, w, x);
    HM_CHECK(got == 1.0f + 0x1p-23f);
    x[48] = 0.0f;
    x[8] = 0x1p-24f; /* lanes 0, 8, 16: step 16 adds lane 16 to lane 0 (rounds to 1), step 8
                      * then adds lane 8 to it (rounds to 1 again) */
    HM_CHECK(quant_dot_ref(HM_TYPE_F32, N, w, x) == 1.0f);
    x[16] = 0.0f;
    x[24] = 0x1p-24f; /* lanes 8 and 24 meet first (step 16), then join lane 0: exact */
    HM_CHECK(quant_dot_ref(HM_TYPE_F32, N, w, x) == 1.0f + 0x1p-23f);
    HM_CHECK(isnan(quant_dot_ref(HM_TYPE_Q2_K, 256, w, x)));
    HM_CHECK(isnan(quant_dot_ref(HM_TYPE_Q8_K, 256, w, x)));
}

static void test_ref_kernel_table(void) {
    const quant_kernels *k = quant_kernels_get(QUANT_ISA_REF);
    HM_REQUIRE(k != NULL);
    HM_CHECK(k->isa == QUANT_ISA_REF && !strcmp(k->name, "ref"));
    HM_CHECK(quant_kernels_get(QUANT_ISA_COUNT) == NULL);
    for (uint32_t t = 0; t < HM_TYPE_COUNT; t++)
        HM_CHECK_MSG((k->dot[t] != NULL) == (quant_act_for(t) != QUANT_ACT_COUNT), "type %u", t);
    for (int a = 0; a < QUANT_ACT_COUNT; a++) HM_CHECK(k->act[a] != NULL);

    /* tile: 3 weight rows x 2 activation rows with padded strides == quant_dot_ref each */
    for (int ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t t = k_wtypes[ti];
        const int64_t n = 512;
        const quant_act at = quant_act_for(t);
        const size_t ws = hm_row_size(t, n) + 16, as = quant_act_row_size(at, n) + 8;
        uint8_t *w = calloc(3, ws), *a = calloc(2, as);
        float x[512], out[2 * 5];
        HM_REQUIRE(w && a);
        for (int r = 0; r < 3; r++) {
            for (int i = 0; i < n; i++) x[i] = rng_gauss();
            quant_quantize_row(t, x, w + r * ws, n);
        }
        for (int c = 0; c < 2; c++) {
            for (int i = 0; i < n; i++) x[i] = rng_gauss();
            k->act[at](x, a + c * as, n);
            uint8_t *chk = malloc(as);
            quant_act_quantize_ref(at, x, chk, n);
            HM_CHECK(!memcmp(chk, a + c * as, quant_act_row_size(at, n)));
            free(chk);
        }
        for (int i = 0; i < 10; i++) out[i] = -1.0f;
        k->dot[t](n, w, ws, 3, a, as, 2, out, 5);
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < 3; r++) {
                const float want = quant_dot_ref(t, n, w + r * ws, a + c * as);
                HM_CHECK_MSG(!memcmp(&out[c * 5 + r], &want, 4), "%s tile r%d c%d", hm_type_name(t),
                             r, c);
            }
        HM_CHECK(out[3] == -1.0f && out[9] == -1.0f);
        free(w), free(a);
    }

    /* HOTMOE_ISA caps the choice; an unknown value is ignored */
    setenv("HOTMOE_ISA", "ref", 1);
    HM_CHECK(quant_kernels_best() == k);
    setenv("HOTMOE_ISA", "avx2", 1);
    HM_CHECK(quant_kernels_best()->isa <= QUANT_ISA_AVX2);
    HM_CHECK(quant_kernels_best() ==
             (quant_kernels_get(QUANT_ISA_AVX2) ? quant_kernels_get(QUANT_ISA_AVX2) : k));
    unsetenv("HOTMOE_ISA");
    const quant_kernels *best = quant_kernels_best();
    HM_REQUIRE(best != NULL);
    for (int isa = QUANT_ISA_COUNT - 1; isa > (int)best->isa; isa--)
        HM_CHECK(quant_kernels_get((quant_isa)isa) == NULL); /* nothing better was available */
}

/* Every SIMD table this CPU runs must give the reference's bits on the corner cases of
 * ARITHMETIC.md §1 (ties, the tiny-amax corner, zero blocks) and on random-byte weights (every
 * scale/quant bit pattern). test_quant_simd.c covers them on ordinary data. */
static void test_simd_tables_on_corners(void) {
    float z[256] = {1e-38f, -1e-38f, 0.0f, 5e-39f, 1e-45f};
    float t[256] = {127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, -127.0f, 126.5f};
    float zero[256] = {0.0f};
    const float *cases[3] = {z, t, zero};
    static uint8_t r[1024], s[1024];
    for (int isa = QUANT_ISA_AVX2; isa < QUANT_ISA_COUNT; isa++) {
        const quant_kernels *k = quant_kernels_get((quant_isa)isa);
        if (!k) continue;
        for (int a = QUANT_ACT_Q8_32; a <= QUANT_ACT_Q8_K; a++)
            for (int c = 0; c < 3; c++) {
                const int n = a == QUANT_ACT_Q8_32 ? 32 : 256;
                memset(r, 0, sizeof(r)), memset(s, 0xAA, sizeof(s));
                quant_act_quantize_ref((quant_act)a, cases[c], r, n);
                k->act[a](cases[c], s, n);
                HM_CHECK_MSG(!memcmp(r, s, quant_act_row_size((quant_act)a, n)),
                             "%s act %d corner case %d differs from the reference", k->name, a, c);
            }
        for (int ti = 0; ti < N_WTYPES; ti++) {
            const uint32_t wt = k_wtypes[ti];
            const int64_t n =
                hm_type_get(wt)->block_size == 1 ? 1000 : 70 * hm_type_get(wt)->block_size;
            const quant_act at = quant_act_for(wt);
            uint8_t *w = malloc(hm_row_size(wt, n)), *act = malloc(quant_act_row_size(at, n));
            float *x = malloc((size_t)n * sizeof(float));
            HM_REQUIRE(w && act && x);
            random_blocks(wt, w, n);
            for (int64_t i = 0; i < n; i++) x[i] = rng_gauss();
            quant_act_quantize_ref(at, x, act, n);
            const float want = quant_dot_ref(wt, n, w, act);
            float got = -1.0f;
            k->dot[wt](n, w, 0, 1, act, 0, 1, &got, 1);
            HM_CHECK_MSG(!memcmp(&got, &want, 4), "%s %s random bytes: %a, reference %a", k->name,
                         hm_type_name(wt), (double)got, (double)want);
            free(w), free(act), free(x);
        }
    }
}

HM_TEST_MAIN(test_dot_all_types, test_dot_lane_order, test_ref_kernel_table,
             test_simd_tables_on_corners)
