/* test_quant_deq.c - quant_dequantize_row on hand-built blocks: known scales and bit patterns,
 * with expected values derived here from the layouts described in blocks.h (and, for a few
 * elements per type, worked out by hand in the comments). All values are dyadic and small, so
 * they are exact in float and the checks compare with ==. Also: which types are unsupported,
 * bad lengths, and that nothing is written past n. (Bit-identity with ggml on real data is
 * test_quant_fixtures.c.) */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"
#include "quant/quant.h"

/* fp16 bit patterns of a few exact values */
#define H_1 0x3C00
#define H_2 0x4000
#define H_M2 0xC000
#define H_HALF 0x3800
#define H_QUARTER 0x3400
#define H_EIGHTH 0x3000
#define H_M1 0xBC00

/* ggml's iq4_nl grid, written out here independently of blocks.h */
static const int kv_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};
/* E2M1 (the OCP MXFP4 element): codes 0..7 positive, bit 3 is the sign */
static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* Dequantises n elements of type t into y[0..n) and checks that y[n] (a canary) is untouched. */
static int deq(uint32_t t, const void *src, float *y, int64_t n) {
    y[n] = 12345.0f;
    const hm_status st = quant_dequantize_row(t, src, y, n);
    HM_CHECK_MSG(st == HM_OK, "%s: status %d", hm_type_name(t), (int)st);
    HM_CHECK_MSG(y[n] == 12345.0f, "%s: wrote past n", hm_type_name(t));
    return st == HM_OK;
}

static int count_bad(const float *y, const float *want, int n, const char *what) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (!(y[i] == want[i])) {
            if (!bad) fprintf(stderr, "%s: element %d is %g, want %g\n", what, i, y[i], want[i]);
            bad++;
        }
    return bad;
}

static void test_q4_0(void) {
    block_q4_0 b[2];
    float y[65], want[64];
    b[0].d = H_HALF;
    for (int j = 0; j < 16; j++) b[0].qs[j] = (uint8_t)(j | ((15 - j) << 4));
    b[1].d = H_M2;
    memset(b[1].qs, 0x5A, 16);
    for (int j = 0; j < 16; j++) {
        want[j] = (float)(j - 8) * 0.5f;      /* low nibble: element j */
        want[j + 16] = (float)(7 - j) * 0.5f; /* high nibble: element j + 16: (15-j) - 8 */
        want[32 + j] = (10 - 8) * -2.0f;      /* 0xA */
        want[48 + j] = (5 - 8) * -2.0f;       /* 0x5 */
    }
    if (!deq(HM_TYPE_Q4_0, b, y, 64)) return;
    HM_CHECK(count_bad(y, want, 64, "q4_0") == 0);
    HM_CHECK(y[0] == -4.0f && y[15] == 3.5f && y[16] == 3.5f && y[31] == -4.0f);
    HM_CHECK(y[32] == -4.0f && y[63] == 6.0f);
}

static void test_q4_1(void) {
    block_q4_1 b;
    float y[33], want[32];
    b.d = H_QUARTER;
    b.m = H_M1;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | (((j + 1) & 15) << 4));
    for (int j = 0; j < 16; j++) {
        want[j] = (float)j * 0.25f - 1.0f;
        want[j + 16] = (float)((j + 1) & 15) * 0.25f - 1.0f;
    }
    if (!deq(HM_TYPE_Q4_1, &b, y, 32)) return;
    HM_CHECK(count_bad(y, want, 32, "q4_1") == 0);
    HM_CHECK(y[0] == -1.0f && y[15] == 2.75f && y[31] == -1.0f);
}

static void test_q5_0_q5_1(void) {
    block_q5_0 b0;
    block_q5_1 b1;
    float y[33], want[32];
    const uint8_t qh[4] = {0x0F, 0xF0, 0x55, 0xAA}; /* little-endian 0xAA55F00F */
    b0.d = H_1;
    b1.d = H_HALF;
    b1.m = H_QUARTER;
    memcpy(b0.qh, qh, 4);
    memcpy(b1.qh, qh, 4);
    for (int j = 0; j < 16; j++) b0.qs[j] = b1.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    for (int e = 0; e < 32; e++) {
        const int low = e < 16 ? e : 15 - (e - 16);
        const int hi = (qh[e / 8] >> (e % 8)) & 1; /* bit e of qh */
        want[e] = (float)((low | (hi << 4)) - 16);
    }
    if (deq(HM_TYPE_Q5_0, &b0, y, 32)) {
        HM_CHECK(count_bad(y, want, 32, "q5_0") == 0);
        /* e=0: 0|16 - 16; e=4: 4 - 16 (bit 4 of 0x0F clear); e=16: 15|16 - 16 (bit 0 of 0x55);
         * e=17: 14 - 16 (bit 1 of 0x55 clear); e=31: 0|16 - 16 (bit 7 of 0xAA) */
        HM_CHECK(y[0] == 0.0f && y[4] == -12.0f && y[16] == 15.0f && y[17] == -2.0f &&
                 y[31] == 0.0f);
    }
    for (int e = 0; e < 32; e++) want[e] = (want[e] + 16.0f) * 0.5f + 0.25f;
    if (deq(HM_TYPE_Q5_1, &b1, y, 32)) {
        HM_CHECK(count_bad(y, want, 32, "q5_1") == 0);
        HM_CHECK(y[0] == 8.25f && y[16] == 15.75f);
    }
}

static void test_q8_0(void) {
    block_q8_0 b;
    float y[33], want[32];
    b.d = H_2;
    for (int j = 0; j < 32; j++) b.qs[j] = (int8_t)(j * 8 - 128);
    for (int j = 0; j < 32; j++) want[j] = (float)(j * 8 - 128) * 2.0f;
    if (!deq(HM_TYPE_Q8_0, &b, y, 32)) return;
    HM_CHECK(count_bad(y, want, 32, "q8_0") == 0);
    HM_CHECK(y[0] == -256.0f && y[31] == 240.0f);
}

static void test_mxfp4(void) {
    block_mxfp4 b;
    float y[33], want[32];
    b.e = 130; /* scale 2^(130-127) = 8 */
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    for (int e = 0; e < 32; e++) {
        const int code = e < 16 ? e : 15 - (e - 16);
        const float v = e2m1[code & 7] * 8.0f;
        want[e] = (code & 8) ? -v : v;
    }
    if (!deq(HM_TYPE_MXFP4, &b, y, 32)) return;
    HM_CHECK(count_bad(y, want, 32, "mxfp4") == 0);
    HM_CHECK(y[7] == 48.0f && y[15] == -48.0f && y[9] == -4.0f && y[8] == 0.0f && y[16] == -48.0f);
    b.e = 0; /* the smallest scale, 2^-127: a float subnormal, kept */
    if (deq(HM_TYPE_MXFP4, &b, y, 32)) HM_CHECK(y[1] == 0x1p-128f && y[7] == 0x1.8p-125f);
}

static void test_iq4_nl(void) {
    block_iq4_nl b;
    float y[33], want[32];
    b.d = H_HALF;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    for (int e = 0; e < 32; e++) want[e] = 0.5f * (float)kv_iq4[e < 16 ? e : 31 - e];
    if (!deq(HM_TYPE_IQ4_NL, &b, y, 32)) return;
    HM_CHECK(count_bad(y, want, 32, "iq4_nl") == 0);
    HM_CHECK(y[0] == -63.5f && y[15] == 56.5f && y[16] == 56.5f);
}

/* The 12 scale bytes used for q4_K and q5_K and what they unpack to (worked out by hand):
 *   sc[0..3] = low 6 bits of bytes 0..3: 0xC1&63=1, 0x42&63=2, 3, 63
 *   mn[0..3] = low 6 bits of bytes 4..7: 0, 0x84&63=4, 0x3E=62, 0xC1&63=1
 *   sc[4+i] = (byte[8+i] & 15) | (byte[i] >> 6) << 4: 0xA|3<<4=58, 0xB|1<<4=27, 7|0=7, 0|0=0
 *   mn[4+i] = (byte[8+i] >> 4) | (byte[4+i] >> 6) << 4: 2|0=2, 5|2<<4=37, 6|0=6, 15|3<<4=63 */
static const uint8_t k_scales[12] = {0xC1, 0x42, 0x03, 0x3F, 0x00, 0x84,
                                     0x3E, 0xC1, 0x2A, 0x5B, 0x67, 0xF0};
static const int k_sc[8] = {1, 2, 3, 63, 58, 27, 7, 0};
static const int k_mn[8] = {0, 4, 62, 1, 2, 37, 6, 63};

static void test_q4_K(void) {
    block_q4_K b;
    float y[257], want[256];
    b.d = H_HALF;
    b.dmin = H_QUARTER;
    memcpy(b.scales, k_scales, 12);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            b.qs[32 * g + l] = (uint8_t)(((l + g) & 15) | (((3 * l + g) & 15) << 4));
    /* element 64g + l: low nibble of qs[32g + l], sub-block 2g; 64g + 32 + l: high nibble,
     * sub-block 2g + 1 */
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            want[64 * g + l] =
                0.5f * (float)(k_sc[2 * g] * ((l + g) & 15)) - 0.25f * (float)k_mn[2 * g];
            want[64 * g + 32 + l] = 0.5f * (float)(k_sc[2 * g + 1] * ((3 * l + g) & 15)) -
                                    0.25f * (float)k_mn[2 * g + 1];
        }
    if (!deq(HM_TYPE_Q4_K, &b, y, 256)) return;
    HM_CHECK(count_bad(y, want, 256, "q4_K") == 0);
    /* by hand: e=32: q=0, mn[1]=4: -1; e=69 (g1 l5, sub 2): q=6: 0.5*3*6 - 0.25*62 = -6.5;
     * e=168 (g2 high l8, sub 5): q=(24+2)&15=10: 0.5*27*10 - 0.25*37 = 125.75;
     * e=255 (sub 7, sc 0): -0.25*63 */
    HM_CHECK(y[0] == 0.0f && y[32] == -1.0f && y[69] == -6.5f && y[168] == 125.75f &&
             y[255] == -15.75f);
}

static void test_q5_K(void) {
    block_q5_K b;
    float y[257], want[256];
    b.d = H_HALF;
    b.dmin = H_QUARTER;
    memcpy(b.scales, k_scales, 12);
    for (int l = 0; l < 32; l++) b.qh[l] = (uint8_t)(l * 37 + 11);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            b.qs[32 * g + l] = (uint8_t)(((l + g) & 15) | (((3 * l + g) & 15) << 4));
    /* bit 4 of an element of sub-block j is bit j of qh[l] */
    for (int e = 0; e < 256; e++) {
        const int j = e / 32, l = e % 32, g = e / 64;
        const int low = (j & 1) ? ((3 * l + g) & 15) : ((l + g) & 15);
        const int q = low | (((b.qh[l] >> j) & 1) << 4);
        want[e] = 0.5f * (float)(k_sc[j] * q) - 0.25f * (float)k_mn[j];
    }
    if (!deq(HM_TYPE_Q5_K, &b, y, 256)) return;
    HM_CHECK(count_bad(y, want, 256, "q5_K") == 0);
    /* by hand: qh[0] = 11 = 0b1011: e=0: q=16: 0.5*1*16 = 8; e=32: q=16: 0.5*2*16 - 1 = 15;
     * qh[5] = 196 = 0b11000100: e=69 (sub 2, bit 2 set): q=6+16: 0.5*3*22 - 15.5 = 17.5 */
    HM_CHECK(y[0] == 8.0f && y[32] == 15.0f && y[69] == 17.5f);
}

static void test_q6_K(void) {
    block_q6_K b;
    float y[257], want[256];
    static const int8_t sc[16] = {-128, 127, -1, 5, 0, 64, -64, 3, 2, -2, 1, 100, -100, 7, -7, 9};
    b.d = H_EIGHTH;
    memcpy(b.scales, sc, 16);
    for (int i = 0; i < 128; i++) b.ql[i] = (uint8_t)(i * 29 + 3);
    for (int i = 0; i < 64; i++) b.qh[i] = (uint8_t)(i * 53 + 7);
    /* element 128h + 32k + l: low 4 bits are nibble k>>1 of ql[64h + 32(k&1) + l], high 2 bits
     * are bits 2k..2k+1 of qh[32h + l]; sub-block e/16 */
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        const int low = (b.ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
        const int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
        want[e] = 0.125f * (float)(sc[e / 16] * ((low | (hi << 4)) - 32));
    }
    if (!deq(HM_TYPE_Q6_K, &b, y, 256)) return;
    HM_CHECK(count_bad(y, want, 256, "q6_K") == 0);
    /* by hand: e=0: ql[0]=3, qh[0]=7 -> q = 3|3<<4 = 51: 0.125*-128*19 = -304;
     * e=200 (h1 k2 l8): ql[72]=43=0x2B high nibble 2, qh[40]=79 bits 4-5 = 0 -> q=2:
     * 0.125*-100*-30 = 375 */
    HM_CHECK(y[0] == -304.0f && y[200] == 375.0f);
}

static void test_q8_K(void) {
    block_q8_K b;
    float y[257];
    memset(&b, 0, sizeof(b));
    b.d = 0.1f;
    for (int i = 0; i < 256; i++) b.qs[i] = (int8_t)(i - 128);
    if (!deq(HM_TYPE_Q8_K, &b, y, 256)) return;
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += !(y[i] == 0.1f * (float)(i - 128));
    HM_CHECK(bad == 0);
}

static void test_iq4_xs(void) {
    block_iq4_xs b;
    float y[257], want[256];
    /* ls[ib] = nibble ib%2 of scales_l[ib/2] | bits 2ib..2ib+1 of scales_h << 4; scales_h =
     * 0xE4E4 gives high parts 0,1,2,3,0,1,2,3: ls = 1, 2|16, 3|32, 4|48, 5, 6|16, 7|32, 8|48 */
    static const int ls[8] = {1, 18, 35, 52, 5, 22, 39, 56};
    const uint8_t sl[4] = {0x21, 0x43, 0x65, 0x87};
    b.d = H_QUARTER;
    b.scales_h = 0xE4E4;
    memcpy(b.scales_l, sl, 4);
    for (int ib = 0; ib < 8; ib++)
        for (int j = 0; j < 16; j++)
            b.qs[16 * ib + j] = (uint8_t)(((j + ib) & 15) | (((5 * j + ib) & 15) << 4));
    for (int ib = 0; ib < 8; ib++)
        for (int j = 0; j < 16; j++) {
            want[32 * ib + j] = 0.25f * (float)((ls[ib] - 32) * kv_iq4[(j + ib) & 15]);
            want[32 * ib + 16 + j] = 0.25f * (float)((ls[ib] - 32) * kv_iq4[(5 * j + ib) & 15]);
        }
    if (!deq(HM_TYPE_IQ4_XS, &b, y, 256)) return;
    HM_CHECK(count_bad(y, want, 256, "iq4_xs") == 0);
    /* by hand: e=0: (1-32) * -127 / 4 = 984.25; e=114 (ib3, high, j=2): q=13 -> 69:
     * (52-32) * 69 / 4 = 345 */
    HM_CHECK(y[0] == 984.25f && y[114] == 345.0f);
}

static void test_float_types(void) {
    const hm_fp16 h[4] = {0x3C00, 0xC000, 0x7BFF, 0x0001};
    const hm_bf16 bf[3] = {0x3F80, 0xC040, 0x0001};
    const float f[3] = {1.5f, -0.0f, 1e-45f};
    float y[5];
    if (deq(HM_TYPE_F16, h, y, 4))
        HM_CHECK(y[0] == 1.0f && y[1] == -2.0f && y[2] == 65504.0f && y[3] == 0x1p-24f);
    if (deq(HM_TYPE_BF16, bf, y, 3)) HM_CHECK(y[0] == 1.0f && y[1] == -3.0f && y[2] == 0x1p-133f);
    if (deq(HM_TYPE_F32, f, y, 3)) HM_CHECK(!memcmp(y, f, sizeof(f)));
}

static void test_unsupported_and_bad_n(void) {
    static const uint32_t unsupported[] = {HM_TYPE_Q8_1,
                                           HM_TYPE_Q2_K,
                                           HM_TYPE_Q3_K,
                                           HM_TYPE_IQ2_XXS,
                                           HM_TYPE_IQ3_S,
                                           HM_TYPE_IQ1_M,
                                           HM_TYPE_I8,
                                           HM_TYPE_I32,
                                           HM_TYPE_F64,
                                           HM_TYPE_TQ2_0,
                                           4,
                                           HM_TYPE_COUNT,
                                           1000,
                                           0xFFFFFFFFu};
    uint8_t buf[512] = {0};
    float y[256], x[256] = {0};
    for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++) {
        const uint32_t t = unsupported[i];
        HM_CHECK_MSG(quant_dequantize_row(t, buf, y, 256) == HM_ERR_UNSUPPORTED, "type %u", t);
        HM_CHECK_MSG(quant_quantize_row(t, x, buf, 256) == HM_ERR_UNSUPPORTED, "type %u", t);
        HM_CHECK_MSG(quant_act_for(t) == QUANT_ACT_COUNT, "type %u", t);
    }
    HM_CHECK(quant_dequantize_row(HM_TYPE_Q4_0, buf, y, 33) == HM_ERR_ARG);
    HM_CHECK(quant_dequantize_row(HM_TYPE_Q4_K, buf, y, 32) == HM_ERR_ARG);
    HM_CHECK(quant_dequantize_row(HM_TYPE_Q8_0, buf, y, -32) == HM_ERR_ARG);
    HM_CHECK(quant_dequantize_row(HM_TYPE_Q8_0, buf, y, 0) == HM_OK);
    HM_CHECK(quant_quantize_row(HM_TYPE_IQ4_XS, x, buf, 255) == HM_ERR_ARG);
    HM_CHECK(quant_quantize_row(HM_TYPE_F16, x, buf, 7) == HM_OK);
    /* non-finite input: refused by block types, kept by the float types */
    x[100] = NAN;
    HM_CHECK(quant_quantize_row(HM_TYPE_Q4_K, x, buf, 256) == HM_ERR_RANGE);
    HM_CHECK(quant_quantize_row(HM_TYPE_Q8_0, x, buf, 128) == HM_ERR_RANGE);
    HM_CHECK(quant_quantize_row(HM_TYPE_Q8_0, x, buf, 96) == HM_OK);
    x[100] = -INFINITY;
    HM_CHECK(quant_quantize_row(HM_TYPE_MXFP4, x, buf, 128) == HM_ERR_RANGE);
    HM_CHECK(quant_quantize_row(HM_TYPE_BF16, x, buf, 128) == HM_OK);
    HM_CHECK(((const hm_bf16 *)buf)[100] == 0xFF80);
}

HM_TEST_MAIN(test_q4_0, test_q4_1, test_q5_0_q5_1, test_q8_0, test_mxfp4, test_iq4_nl, test_q4_K,
             test_q5_K, test_q6_K, test_q8_K, test_iq4_xs, test_float_types,
             test_unsupported_and_bad_n)
