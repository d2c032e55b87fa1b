/* test_quant_simd.c - every kernel table this CPU runs (ref, avx2, avx512) against the scalar
 * reference, bit for bit: activation quantisation bytes, and dot tiles of every supported type
 * over many row lengths and tile shapes (nr, nc in {1,2,3,4,7,8}), with random valid blocks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "quant/quant.h"
#include "quant/quant_simd_tables.h"

static unsigned long long g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    return hm_t_rnd(&g_rng);
}
static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

/* Tables to test: every ISA this CPU runs, plus the plain AVX-512 table when dispatch picked
 * the VBMI variant (both must match the reference). */
static int tables(const quant_kernels *out[QUANT_ISA_COUNT + 1]) {
    int n = 0;
    for (int isa = 0; isa < QUANT_ISA_COUNT; isa++) {
        const quant_kernels *k = quant_kernels_get((quant_isa)isa);
        if (k) out[n++] = k;
        if (k && isa == QUANT_ISA_AVX512 && quant_kernels_avx512_plain() != k)
            out[n++] = quant_kernels_avx512_plain();
    }
    return n;
}

static const uint32_t k_types[] = {HM_TYPE_Q8_0, HM_TYPE_Q4_K, HM_TYPE_MXFP4, HM_TYPE_Q6_K,
                                   HM_TYPE_Q5_K, HM_TYPE_IQ4_XS, HM_TYPE_Q4_0, HM_TYPE_Q4_1,
                                   HM_TYPE_Q5_0, HM_TYPE_Q5_1, HM_TYPE_IQ4_NL, HM_TYPE_F32,
                                   HM_TYPE_F16, HM_TYPE_BF16};
#define N_TYPES (int)(sizeof(k_types) / sizeof(k_types[0]))

static void put_fp16(uint8_t *p, float f) {
    hm_fp16 h = hm_f32_to_fp16(f);
    memcpy(p, &h, 2);
}

/* A random but valid row of n elements of type t: random bytes, then sane scales. */
static void fill_row(uint32_t t, uint8_t *w, int64_t n) {
    const hm_type_info *ti = hm_type_get(t);
    int64_t nb = n / ti->block_size;
    size_t bs = (size_t)ti->type_size;
    for (size_t i = 0; i < (size_t)nb * bs; i++) w[i] = (uint8_t)rnd();
    const int tiny_row = rnd() % 4 == 0;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + (size_t)b * bs;
        float sgn = (rnd() & 1) ? -1.0f : 1.0f;
        switch (t) {
        case HM_TYPE_F32:
            for (int e = 0; e < 1; e++) { float f = rndf(-1, 1); memcpy(p, &f, 4); }
            break;
        case HM_TYPE_F16: put_fp16(p, rndf(-1, 1)); break;
        case HM_TYPE_BF16: { hm_bf16 h = hm_f32_to_bf16(rndf(-1, 1)); memcpy(p, &h, 2); } break;
        case HM_TYPE_MXFP4: /* normal scales; in a quarter of the rows 2^-128..2^-124 (d*da subnormal) */
            p[0] = (uint8_t)(tiny_row ? rnd() % 5 : 110 + rnd() % 30);
            break;
        case HM_TYPE_Q6_K: put_fp16(p + 208, sgn * rndf(1e-4f, 0.1f)); break;
        case HM_TYPE_Q4_1: case HM_TYPE_Q5_1: case HM_TYPE_Q4_K: case HM_TYPE_Q5_K:
            put_fp16(p, sgn * rndf(1e-4f, 0.1f));
            put_fp16(p + 2, rndf(-0.1f, 0.1f));
            break;
        default: put_fp16(p, sgn * rndf(1e-4f, 0.1f)); break;
        }
    }
}

/* Activations with some special blocks: all zero, tiny (id = inf), exact halves. */
static void fill_act(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = rndf(-2, 2);
    for (int64_t b = 0; b + 32 <= n; b += 32) {
        uint32_t kind = rnd() % 8;
        if (kind == 0) for (int i = 0; i < 32; i++) x[b + i] = 0.0f;
        if (kind == 1) for (int i = 0; i < 32; i++) x[b + i] = (i % 3) ? rndf(-1e-37f, 1e-37f) : 0.0f;
        if (kind == 2) {
            for (int i = 0; i < 32; i++) x[b + i] = (float)((int)(rnd() % 254) - 127) + 0.5f;
            x[b] = 127.0f; /* amax 127 -> id = 1: the values round half to even */
        }
        if (kind == 3) for (int i = 0; i < 32; i++) x[b + i] *= 1e4f;
    }
}

static void test_act_quantize(void) {
    const int64_t n = 256 * 9;
    float *x = malloc((size_t)n * sizeof(float));
    const quant_kernels *tabs[QUANT_ISA_COUNT + 1];
    int ntab = tables(tabs);
    for (int ti_ = 0; ti_ < ntab; ti_++) {
        const quant_kernels *k = tabs[ti_];
        for (int a = 0; a < QUANT_ACT_COUNT; a++) {
            size_t sz = quant_act_row_size((quant_act)a, n);
            uint8_t *r = malloc(sz), *s = malloc(sz);
            for (int rep = 0; rep < 20; rep++) {
                fill_act(x, n);
                memset(r, 0xa5, sz);
                memset(s, 0x5a, sz);
                quant_act_quantize_ref((quant_act)a, x, r, n);
                HM_REQUIRE(k->act[a] != NULL);
                k->act[a](x, s, n);
                HM_CHECK_MSG(memcmp(r, s, sz) == 0, "isa %s act %d rep %d", k->name, a, rep);
            }
            free(r);
            free(s);
        }
    }
    free(x);
}

/* Compares k's tile (nr x nc at row length n) with quant_dot_ref of each element. */
static int check_tile(const quant_kernels *k, uint32_t t, int64_t n, int nr, int nc) {
    size_t wrow = hm_row_size(t, n);
    quant_act act = quant_act_for(t);
    size_t arow = quant_act_row_size(act, n);
    size_t wstride = wrow + 8, astride = arow + 8; /* strides other than the row size */
    uint8_t *w = malloc(wstride * (size_t)nr), *a = malloc(astride * (size_t)nc);
    float *x = malloc((size_t)n * sizeof(float));
    for (int r = 0; r < nr; r++) fill_row(t, w + (size_t)r * wstride, n);
    for (int c = 0; c < nc; c++) {
        fill_act(x, n);
        quant_act_quantize_ref(act, x, a + (size_t)c * astride, n);
    }
    size_t ostride = (size_t)nr + 1;
    float *out = malloc(ostride * (size_t)nc * sizeof(float));
    for (size_t i = 0; i < ostride * (size_t)nc; i++) out[i] = -12345.0f;
    k->dot[t](n, w, wstride, nr, a, astride, nc, out, ostride);
    int bad = 0;
    for (int c = 0; c < nc; c++) {
        for (int r = 0; r < nr; r++) {
            float ref = quant_dot_ref(t, n, w + (size_t)r * wstride, a + (size_t)c * astride);
            float got = out[(size_t)c * ostride + (size_t)r];
            if (memcmp(&ref, &got, 4) != 0 && bad++ < 3)
                fprintf(stderr, "  %s %s n=%lld tile %dx%d [r%d c%d]: ref %.9g got %.9g\n", k->name,
                        hm_type_name(t), (long long)n, nr, nc, r, c, ref, got);
        }
        if (out[(size_t)c * ostride + (size_t)nr] != -12345.0f) bad++;
    }
    free(w);
    free(a);
    free(x);
    free(out);
    return bad;
}

static void test_dot_lengths(void) {
    /* blocks per row: 1 block up to many, with non-multiples of 8 and 32 */
    /* (256-element types: 1-4 blocks are one two-row packed group; 9, 12, 35 end in a packed
     * tail of 1, 4, 3 blocks after full groups, 35's into the lanes the first group used) */
    /* (32-element types' matvec: a partial last group in each of the 4 accumulator registers,
     * 5, 12, 21, 26 / 37, 44, 90; 90 is k = 2880) */
    static const int64_t nbs[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 21, 26, 31, 32, 33, 35, 37, 44, 64, 90, 549};
    const quant_kernels *tabs[QUANT_ISA_COUNT + 1];
    int ntab = tables(tabs);
    for (int ti_ = 0; ti_ < ntab; ti_++) {
        const quant_kernels *k = tabs[ti_];
        for (int ti = 0; ti < N_TYPES; ti++) {
            uint32_t t = k_types[ti];
            HM_REQUIRE(k->dot[t] != NULL);
            int bs = hm_type_get(t)->block_size;
            int unit = bs == 1 ? 1 : bs;
            for (size_t j = 0; j < sizeof(nbs) / sizeof(nbs[0]); j++) {
                int64_t n = nbs[j] * unit;
                if (bs != 32 && nbs[j] > 90) continue;  /* 549: the SIMD kernels' long-row (segment) path */
                if (bs == 256 && nbs[j] > 35) continue; /* keep the test fast */
                /* 2 and 3 rows: the matvec goes by row pairs, an odd row alone */
                for (int nr = 2; nr <= 3; nr++)
                    HM_CHECK_MSG(check_tile(k, t, n, nr, 1) == 0, "%s %s n=%lld nr=%d", k->name,
                                 hm_type_name(t), (long long)n, nr);
            }
            if (bs == 1) {
                static const int64_t ns[] = {5, 31, 33, 100, 32 * 37 + 3};
                for (int j = 0; j < 5; j++)
                    HM_CHECK_MSG(check_tile(k, t, ns[j], 1, 2) == 0, "%s %s n=%lld", k->name,
                                 hm_type_name(t), (long long)ns[j]);
            }
        }
    }
}

static void test_dot_tiles(void) {
    static const int dims[] = {1, 2, 3, 4, 7, 8};
    const quant_kernels *tabs[QUANT_ISA_COUNT + 1];
    int ntab = tables(tabs);
    for (int ti_ = 0; ti_ < ntab; ti_++) {
        const quant_kernels *k = tabs[ti_];
        for (int ti = 0; ti < N_TYPES; ti++) {
            uint32_t t = k_types[ti];
            int bs = hm_type_get(t)->block_size;
            int64_t n = bs == 256 ? 256 * 11 : 32 * 37;
            for (int i = 0; i < 6; i++)
                for (int j = 0; j < 6; j++)
                    HM_CHECK_MSG(check_tile(k, t, n, dims[i], dims[j]) == 0, "%s %s %dx%d", k->name,
                                 hm_type_name(t), dims[i], dims[j]);
        }
    }
}

static void test_tables_present(void) {
    const quant_kernels *best = quant_kernels_best();
    HM_REQUIRE(best != NULL);
    printf("best kernel table on this CPU: %s\n", best->name);
    const quant_kernels *tabs[QUANT_ISA_COUNT + 1];
    int ntab = tables(tabs);
    printf("tables under test:");
    for (int i = 0; i < ntab; i++) printf(" %s%s", tabs[i]->name, tabs[i] == quant_kernels_avx512_plain() ? "(plain)" : "");
    printf("\n");
    HM_CHECK(quant_kernels_get(QUANT_ISA_REF) != NULL);
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        HM_CHECK(quant_kernels_get(QUANT_ISA_AVX2) != NULL);
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
        HM_CHECK(quant_kernels_get(QUANT_ISA_AVX512) != NULL);
#endif
}

HM_TEST_MAIN(test_tables_present, test_act_quantize, test_dot_lengths, test_dot_tiles)
