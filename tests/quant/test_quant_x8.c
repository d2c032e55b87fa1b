/* test_quant_x8.c - rows repacked by eights (quant_x8.h), q4_K, q6_K, mxfp4, q8_0: repacking
 * loses nothing, and the 8-row product is bit-identical to quant_dot_ref on the original rows,
 * on the fast kernel when this CPU runs it and on the reference path (HOTMOE_ISA=avx2), for row
 * lengths of 1 to 40 blocks (past 32 blocks a row's lanes take a second block each; the 32-element
 * types' odd counts end in a block without a pair) and rows of random scales. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/quant_x8.h"

static unsigned long long g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    return hm_t_rnd(&g_rng);
}
static float rndf(void) { return (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f; }

enum { N_TYPES = 4 };
static const uint32_t k_types[N_TYPES] = {HM_TYPE_Q4_K, HM_TYPE_Q6_K, HM_TYPE_MXFP4, HM_TYPE_Q8_0};

/* elements per block and the activation format of a type */
static int64_t blk(uint32_t type) { return type == HM_TYPE_MXFP4 || type == HM_TYPE_Q8_0 ? 32 : 256; }
static quant_act act_of(uint32_t type) { return quant_act_for(type); }

/* 8 rows of k elements of type (quantised random floats, every row its own range), stride ws */
static void make_rows(uint32_t type, int64_t k, uint8_t *w, size_t ws) {
    float *x = malloc(sizeof(float) * (size_t)k);
    for (int r = 0; r < 8; r++) {
        const float scale = 0.01f + (float)(rnd() % 1000) * 0.01f;
        for (int64_t i = 0; i < k; i++) x[i] = scale * rndf();
        if (r == 3) memset(x, 0, sizeof(float) * (size_t)blk(type)); /* an all-zero block */
        HM_REQUIRE(quant_quantize_row(type, x, w + (size_t)r * ws, k) == HM_OK);
    }
    free(x);
}

static void test_repack_roundtrip(void) {
    const int64_t k = 2048;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = k_types[ti];
        const size_t ws = hm_row_size(type, k) + 16; /* rows need not be contiguous */
        uint8_t *w = calloc(8, ws), *back = calloc(8, ws);
        void *g = malloc(quant_x8_group_size(type, k));
        make_rows(type, k, w, ws);
        hm_error err;
        HM_REQUIRE(quant_x8_repack(type, k, w, ws, g, &err) == HM_OK);
        quant_x8_unpack(type, k, g, back, ws);
        for (int r = 0; r < 8; r++)
            HM_CHECK_MSG(!memcmp(w + (size_t)r * ws, back + (size_t)r * ws, hm_row_size(type, k)),
                         "%s row %d changed by repack + unpack", hm_type_name(type), r);
        HM_CHECK(quant_x8_group_size(type, k) == 8 * hm_row_size(type, k));
        HM_CHECK(quant_x8_repack(type, 1000, w, ws, g, &err) == HM_ERR_ARG);
        HM_CHECK(quant_x8_supported(type) && quant_x8_dot_get(type));
        free(w);
        free(back);
        free(g);
    }
    hm_error err;
    uint8_t buf[64];
    HM_CHECK(quant_x8_repack(HM_TYPE_Q4_0, 2048, buf, 0, buf, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK(!quant_x8_supported(HM_TYPE_Q4_0) && !quant_x8_dot_get(HM_TYPE_Q5_K));
}

/* the 8-row product against quant_dot_ref for rows of nb blocks; returns rows that differ */
static int check_len(uint32_t type, int64_t nb) {
    const int64_t k = blk(type) * nb;
    const size_t ws = hm_row_size(type, k);
    uint8_t *w = malloc(8 * ws);
    void *g = malloc(quant_x8_group_size(type, k));
    float *x = malloc(sizeof(float) * (size_t)k);
    void *a = malloc(quant_act_row_size(act_of(type), k));
    make_rows(type, k, w, ws);
    for (int64_t i = 0; i < k; i++) x[i] = rndf() * (i % 97 == 0 ? 50.0f : 1.0f);
    quant_act_quantize_ref(act_of(type), x, a, k);
    hm_error err;
    if (quant_x8_repack(type, k, w, ws, g, &err) != HM_OK) return 8;
    float out[8];
    quant_x8_dot_get(type)(k, g, a, 0, 1, out);
    int bad = 0;
    for (int r = 0; r < 8; r++) {
        const float ref = quant_dot_ref(type, k, w + (size_t)r * ws, a);
        if (memcmp(&ref, &out[r], sizeof(float))) {
            if (!bad) printf("  %s, %lld blocks, row %d: %.9g, reference %.9g\n", hm_type_name(type),
                             (long long)nb, r, (double)out[r], (double)ref);
            bad++;
        }
    }
    free(w);
    free(g);
    free(x);
    free(a);
    return bad;
}

static void test_dot_fast(void) {
    printf("  fast kernel on this CPU: %s\n", quant_x8_fast() ? "yes" : "no (reference path)");
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int64_t nb = 1; nb <= 40; nb++)
            for (int rep = 0; rep < 3; rep++)
                HM_CHECK_MSG(check_len(k_types[ti], nb) == 0, "%s, %lld blocks",
                             hm_type_name(k_types[ti]), (long long)nb);
}

static void test_dot_reference_path(void) {
    const char *old = getenv("HOTMOE_ISA");
    char *keep = old ? strdup(old) : NULL;
    setenv("HOTMOE_ISA", "avx2", 1);
    HM_CHECK(!quant_x8_fast());
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int64_t nb = 1; nb <= 34; nb += 3)
            HM_CHECK_MSG(check_len(k_types[ti], nb) == 0, "%s, %lld blocks",
                         hm_type_name(k_types[ti]), (long long)nb);
    if (keep) setenv("HOTMOE_ISA", keep, 1);
    else unsetenv("HOTMOE_ISA");
    free(keep);
}

/* Raw blocks at the integer limits (every quant at its maximum or random bytes, scales of all 6
 * or 8 bits) against activations of -128 and 127 (a row as the quantisers never make it, but the
 * types allow): the kernel's int16 and int32 lanes must still give the reference's exact
 * integers. Float factors are kept finite (the float part is not what is tested). */
static void x8_fill_act(uint32_t type, void *act, int nb, int c) {
    for (int b = 0; b < nb; b++) {
        int8_t *qs;
        int n;
        if (blk(type) == 32) {
            block_q8_32 *a = (block_q8_32 *)act + b;
            a->d = 1.0f;
            qs = a->qs;
            n = 32;
        } else {
            block_q8_K *a = (block_q8_K *)act + b;
            a->d = 1.0f;
            qs = a->qs;
            n = 256;
        }
        for (int i = 0; i < n; i++)
            qs[i] = (int8_t)(c % 3 == 0 ? -128 : c % 3 == 1 ? 127 : (int)(rnd() % 256) - 128);
        if (blk(type) == 32) {
            block_q8_32 *a = (block_q8_32 *)act + b;
            a->sum = 0;
            for (int i = 0; i < 32; i++) a->sum += qs[i];
        } else {
            block_q8_K *a = (block_q8_K *)act + b;
            for (int i = 0; i < 16; i++) {
                int sum = 0;
                for (int l = 0; l < 16; l++) sum += qs[16 * i + l];
                a->bsums[i] = (int16_t)sum;
            }
        }
    }
}

static void test_dot_extremes(void) {
    enum { NB = 5 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = k_types[ti];
        const int64_t K = blk(type) * NB;
        const size_t ws = hm_row_size(type, K), bs = ws / NB;
        uint8_t *w = malloc(8 * ws);
        void *g = malloc(quant_x8_group_size(type, K));
        void *a = malloc(quant_act_row_size(act_of(type), K));
        HM_REQUIRE(w && g && a);
        int bad = 0;
        for (int c = 0; c < 12; c++) {
            for (size_t i = 0; i < 8 * ws; i++) w[i] = c < 6 ? 0xff : (uint8_t)rnd();
            for (int r = 0; r < 8; r++)
                for (int b = 0; b < NB; b++) { /* d (and q4_K's dmin) = 2^-e, e in 0..7 */
                    uint8_t *blk0 = w + (size_t)r * ws + (size_t)b * bs;
                    if (type == HM_TYPE_MXFP4) { /* 2^(e - 128), e in 121..128 */
                        blk0[0] = (uint8_t)(121 + rnd() % 8);
                        continue;
                    }
                    const size_t dpos = type == HM_TYPE_Q6_K ? bs - 2 : 0; /* q8_0: 0 too */
                    const uint16_t d = (uint16_t)(0x3c00 - 0x400 * (rnd() % 8));
                    memcpy(blk0 + dpos, &d, 2);
                    if (type == HM_TYPE_Q4_K) memcpy(blk0 + 2, &d, 2);
                }
            x8_fill_act(type, a, NB, c);
            hm_error err;
            HM_REQUIRE(quant_x8_repack(type, K, w, ws, g, &err) == HM_OK);
            float out[8];
            quant_x8_dot_get(type)(K, g, a, 0, 1, out);
            for (int r = 0; r < 8; r++) {
                const float ref = quant_dot_ref(type, K, w + (size_t)r * ws, a);
                bad += memcmp(&ref, &out[r], sizeof(float)) != 0;
            }
        }
        HM_CHECK_MSG(bad == 0, "%s: %d rows at the limits differ from the reference", hm_type_name(type), bad);
        free(w), free(g), free(a);
    }
}

/* A whole matrix (quant_x8_repack_rows, on a pool of 3 and on the caller): group g is the
 * repack of rows 8g..8g+7; row counts that are not whole groups are refused. */
static void test_repack_rows(void) {
    const int64_t k = 512, n_rows = 8 * 150; /* more groups than one pool item */
    tp_pool *pool = NULL;
    HM_REQUIRE(tp_init(3, &pool, NULL) == HM_OK);
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = k_types[ti];
        const size_t ws = hm_row_size(type, k), gs = quant_x8_group_size(type, k);
        uint8_t *w = malloc(ws * (size_t)n_rows), *a = malloc(ws * (size_t)n_rows);
        uint8_t *b = malloc(ws * (size_t)n_rows), *g = malloc(gs);
        HM_REQUIRE(w && a && b && g);
        for (int64_t r = 0; r < n_rows; r += 8) make_rows(type, k, w + (size_t)r * ws, ws);
        hm_error err;
        HM_CHECK(quant_x8_repack_rows(type, k, w, ws, n_rows, a, pool, &err) == HM_OK);
        HM_CHECK(quant_x8_repack_rows(type, k, w, ws, n_rows, b, NULL, &err) == HM_OK);
        HM_CHECK(!memcmp(a, b, ws * (size_t)n_rows));
        int bad = 0;
        for (int64_t grp = 0; grp < n_rows / 8; grp++) {
            HM_REQUIRE(quant_x8_repack(type, k, w + (size_t)grp * 8 * ws, ws, g, &err) == HM_OK);
            bad += memcmp(g, a + (size_t)grp * gs, gs) != 0;
        }
        HM_CHECK_MSG(bad == 0, "%s: %d groups differ from quant_x8_repack's", hm_type_name(type), bad);
        HM_CHECK(quant_x8_repack_rows(type, k, w, ws, 12, a, pool, &err) == HM_ERR_ARG);
        free(w), free(a), free(b), free(g);
    }
    tp_free(pool);
}

/* n activation rows at once (1 to 9: tiles of 4 and their rest) give each row's bits of the
 * one-row call, on the fast kernel and the reference path. */
static int check_dotn(uint32_t type, int64_t nb, int n, const quant_kernels *kern) {
    const int64_t k = blk(type) * nb;
    const size_t ws = hm_row_size(type, k), as = quant_act_row_size(act_of(type), k);
    uint8_t *w = malloc(8 * ws), *a = malloc(as * (size_t)n);
    void *g = malloc(quant_x8_group_size(type, k));
    float *x = malloc(sizeof(float) * (size_t)k), *out = malloc(sizeof(float) * 8 * (size_t)n);
    hm_error err;
    int bad = 0;
    if (!w || !a || !g || !x || !out) {
        bad = n;
        goto done;
    }
    make_rows(type, k, w, ws);
    for (int t = 0; t < n; t++) {
        for (int64_t i = 0; i < k; i++) x[i] = rndf();
        quant_act_quantize_ref(act_of(type), x, a + (size_t)t * as, k);
    }
    if (quant_x8_repack(type, k, w, ws, g, &err) != HM_OK) {
        bad = n;
        goto done;
    }
    quant_x8_dot_for(type, kern)(k, g, a, as, n, out);
    for (int t = 0; t < n; t++) {
        float one[8];
        quant_x8_dot_for(type, kern)(k, g, a + (size_t)t * as, 0, 1, one);
        bad += memcmp(one, out + 8 * t, sizeof(one)) != 0;
    }
done:
    free(w), free(a), free(g), free(x), free(out);
    return bad;
}

static void test_dotn(void) {
    const quant_kernels *kerns[2] = {quant_kernels_best(), quant_kernels_get(QUANT_ISA_AVX2)};
    for (int ki = 0; ki < 2; ki++) {
        if (!kerns[ki]) continue;
        for (int ti = 0; ti < N_TYPES; ti++)
            for (int n = 1; n <= 9; n++)
                for (int64_t nb = 1; nb <= 9; nb += 4)
                    HM_CHECK_MSG(check_dotn(k_types[ti], nb, n, kerns[ki]) == 0, "%s, %s, %d rows, %lld blocks",
                                 kerns[ki]->name, hm_type_name(k_types[ti]), n, (long long)nb);
    }
}

HM_TEST_MAIN(test_repack_roundtrip, test_repack_rows, test_dot_fast, test_dot_extremes,
             test_dot_reference_path, test_dotn)
