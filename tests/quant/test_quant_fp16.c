/* test_quant_fp16.c - the 16-bit float conversions of quant/fp16.h against straightforward
 * references written here with double arithmetic: every half and every bfloat16 (exhaustive),
 * every rounding midpoint between neighbouring halfs/bfloat16s (ties to even), random floats over
 * the whole range, and all 256 E8M0 scales. */
#include <math.h>
#include <stdint.h>

#include "harness.h"
#include "quant/fp16.h"

/* value of a finite half, from its fields */
static double half_value(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* nearest half to a finite float, ties to even, by rounding a / quantum in double */
static uint16_t half_from_float_ref(float f) {
    const uint16_t sign = signbit(f) ? 0x8000 : 0;
    const double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7c00;
    const double q = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, ilogb(a) - 10);
    const double v = nearbyint(a / q) * q; /* a/q is exact: both are dyadic with few bits */
    if (v < 0x1p-14) return sign | (uint16_t)(v / 0x1p-24);
    const int e = ilogb(v);
    const int m = (int)(v / ldexp(1.0, e - 10)) - 1024;
    return sign | (uint16_t)(((e + 15) << 10) | m);
}

/* nearest bfloat16 to a finite float, ties to even (overflow gives inf) */
static uint16_t bf16_from_float_ref(float f) {
    const double a = fabs((double)f);
    const double q = a < 0x1p-126 ? 0x1p-133 : ldexp(1.0, ilogb(a) - 7);
    const double v = nearbyint(a / q) * q;
    const float r = (float)(signbit(f) ? -v : v); /* exact, or overflow to inf */
    return (uint16_t)(hm_f32_to_bits(r) >> 16);
}

static void test_half_to_float_exhaustive(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = hm_fp16_to_f32((hm_fp16)h);
        const int e = (h >> 10) & 31, m = h & 1023;
        if (e == 31) {
            if (m == 0)
                bad += !(isinf(f) && (signbit(f) != 0) == ((h >> 15) != 0));
            else /* quiet NaN, payload kept: what F16C's vcvtph2ps gives */
                bad += hm_f32_to_bits(f) !=
                       (((h & 0x8000u) << 16) | 0x7fc00000u | ((uint32_t)m << 13));
            continue;
        }
        bad += (double)f != half_value((uint16_t)h) || (signbit(f) != 0) != ((h >> 15) != 0);
    }
    HM_CHECK_MSG(bad == 0, "%d halfs decode wrongly", bad);
}

static void test_half_roundtrip_and_midpoints(void) {
    int bad_rt = 0, bad_mid = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = hm_fp16_to_f32((hm_fp16)h);
        if (isnan(f)) {
            const hm_fp16 r = hm_f32_to_fp16(f);
            bad_rt += !((r & 0x7c00) == 0x7c00 && (r & 0x3ff));
            continue;
        }
        bad_rt += hm_f32_to_fp16(f) != h;
        /* midpoint to the next half of larger magnitude (exact in float: 12 significant bits) */
        if ((h & 0x7fff) >= 0x7c00) continue;
        const uint16_t next = (uint16_t)(h + 1);
        const double mid =
            (half_value((uint16_t)h) +
             ((next & 0x7fff) == 0x7c00 ? (h & 0x8000 ? -65536.0 : 65536.0) : half_value(next))) /
            2;
        const float fm = (float)mid;
        HM_REQUIRE((double)fm == mid);
        const uint16_t even = (h & 1) ? next : (uint16_t)h;
        bad_mid += hm_f32_to_fp16(fm) != even;
        bad_mid += hm_f32_to_fp16(nextafterf(fm, 0.0f)) != h;
        bad_mid += hm_f32_to_fp16(nextafterf(fm, signbit(fm) ? -INFINITY : INFINITY)) != next;
    }
    HM_CHECK_MSG(bad_rt == 0, "%d halfs do not round-trip", bad_rt);
    HM_CHECK_MSG(bad_mid == 0, "%d midpoint roundings wrong", bad_mid);
    HM_CHECK(hm_f32_to_fp16(65504.0f) == 0x7bff);
    HM_CHECK(hm_f32_to_fp16(65519.99f) == 0x7bff);
    HM_CHECK(hm_f32_to_fp16(65520.0f) == 0x7c00);
    HM_CHECK(hm_f32_to_fp16(-1e10f) == 0xfc00);
    HM_CHECK(hm_f32_to_fp16(0x1p-25f) == 0x0000);   /* tie between 0 and 2^-24: even */
    HM_CHECK(hm_f32_to_fp16(0x1.8p-24f) == 0x0002); /* tie between 1 and 2 ulps: 2 */
    HM_CHECK(hm_f32_to_fp16(-0.0f) == 0x8000);
}

static uint32_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 32);
}

static void test_float_to_half_random(void) {
    uint64_t s = 12345;
    int bad = 0, bad_bf = 0;
    for (int i = 0; i < 1000000; i++) {
        const uint32_t bits = rng_next(&s);
        const float f = hm_bits_to_f32(bits);
        if (!isfinite(f)) continue;
        bad += hm_f32_to_fp16(f) != half_from_float_ref(f);
        bad_bf += hm_f32_to_bf16(f) != bf16_from_float_ref(f);
    }
    HM_CHECK_MSG(bad == 0, "%d floats round to the wrong half", bad);
    HM_CHECK_MSG(bad_bf == 0, "%d floats round to the wrong bfloat16", bad_bf);
}

static void test_bf16_exhaustive(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = hm_bf16_to_f32((hm_bf16)h);
        if (isnan(f)) {
            bad += !isnan(hm_bf16_to_f32(hm_f32_to_bf16(f)));
            continue;
        }
        bad += hm_f32_to_bits(f) != h << 16;
        bad += hm_f32_to_bf16(f) != h;
        if (isinf(f) || (h & 0x7fff) == 0x7f7f) continue;
        /* midpoint to the next bfloat16: the float with bit 15 set */
        const float mid = hm_bits_to_f32((h << 16) | 0x8000);
        const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        bad += hm_f32_to_bf16(mid) != even;
        bad += hm_f32_to_bf16(hm_bits_to_f32((h << 16) | 0x7fff)) != h;
        bad += hm_f32_to_bf16(hm_bits_to_f32((h << 16) | 0x8001)) != (uint16_t)(h + 1);
    }
    HM_CHECK_MSG(bad == 0, "%d bfloat16 conversions wrong", bad);
    HM_CHECK(hm_f32_to_bf16(3.0e38f) == 0x7f62); /* 3.0e38 = 0x7f61b1e6 rounds up */
    HM_CHECK(hm_f32_to_bf16(hm_bits_to_f32(0x7f7fffffu)) == 0x7f80); /* FLT_MAX rounds to inf */
}

static void test_e8m0(void) {
    for (int e = 0; e < 256; e++) {
        const float f = hm_e8m0_half_to_f32((uint8_t)e);
        HM_CHECK_MSG((double)f == ldexp(1.0, e - 128), "e=%d gives %a", e, (double)f);
    }
    HM_CHECK(hm_e8m0_half_to_f32(127) == 0.5f);
    HM_CHECK(hm_e8m0_half_to_f32(128) == 1.0f);
    HM_CHECK(hm_e8m0_half_to_f32(0) == 0x1p-128f);
}

HM_TEST_MAIN(test_half_to_float_exhaustive, test_half_roundtrip_and_midpoints,
             test_float_to_half_random, test_bf16_exhaustive, test_e8m0)
