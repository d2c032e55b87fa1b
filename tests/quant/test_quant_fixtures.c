/* test_quant_fixtures.c - quant_dequantize_row against ggml's own dequantisation.
 *
 * DESIGN: tests/quant/fixtures/<type>.blocks holds raw blocks of one type and <type>.f32 the
 * floats that ggml's reference dequantisation (its to_float type traits, built from a pinned
 * llama.cpp commit with -ffp-contract=off; see fixtures/README.md) produced from them. The
 * fixtures are an independent oracle: hotmoe must give the same bits for every element
 * (NaN included: the payload must match too), both for the whole row and block by block.
 * fixtures/convert.{f32,f16,bf16} check the other direction for the float formats: float inputs
 * at every kind of rounding boundary and ggml's f16 and bf16 encodings of them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "quant/fp16.h"
#include "quant/qtypes.h"
#include "quant/quant.h"

#define FIXTURE_DIR "tests/quant/fixtures"

/* Every type the fixtures cover (ggml's names, which are also the file names). */
static const char *const fixture_types[] = {"f16",  "bf16", "q4_0", "q4_1",  "q5_0",
                                            "q5_1", "q8_0", "q4_K", "q5_K",  "q6_K",
                                            "q8_K", "mxfp4", "iq4_nl", "iq4_xs"};
#define N_FIXTURE_TYPES (int)(sizeof(fixture_types) / sizeof(fixture_types[0]))

/* Reads a whole file into a malloc'd buffer (16-byte aligned, as block structs need); NULL on
 * failure. */
static void *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len > 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = aligned_alloc(16, ((size_t)len + 15) & ~(size_t)15);
        if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    if (buf) *size = (size_t)len;
    return buf;
}

static int is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* Compares got against want bit for bit; prints the first mismatch and returns the count. */
static int64_t count_mismatches(const char *tname, int32_t bsize, const float *want,
                                const float *got, int64_t n, const char *what) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &want[i], 4);
        memcpy(&b, &got[i], 4);
        if (a == b) continue;
        if (bad == 0)
            fprintf(stderr,
                    "%s (%s): first mismatch at block %lld element %lld: ggml %.9g (0x%08x), "
                    "hotmoe %.9g (0x%08x)%s\n",
                    tname, what, (long long)(i / bsize), (long long)(i % bsize), (double)want[i],
                    a, (double)got[i], b,
                    is_nan_bits(a) && is_nan_bits(b) ? " [both NaN, payload differs]" : "");
        bad++;
    }
    if (bad) fprintf(stderr, "%s (%s): %lld of %lld elements differ\n", tname, what,
                     (long long)bad, (long long)n);
    return bad;
}

/* One type: load both files, check their sizes agree with the type table, dequantise. */
static void check_fixture(const char *tname) {
    char path[256];
    size_t nblk = 0, nf32 = 0;
    snprintf(path, sizeof(path), FIXTURE_DIR "/%s.blocks", tname);
    uint8_t *blocks = read_all(path, &nblk);
    HM_CHECK_MSG(blocks != NULL, "cannot read %s", path);
    snprintf(path, sizeof(path), FIXTURE_DIR "/%s.f32", tname);
    float *want = read_all(path, &nf32);
    HM_CHECK_MSG(want != NULL, "cannot read %s", path);
    int type = hm_type_from_name(tname);
    HM_CHECK_MSG(type >= 0, "unknown type name %s", tname);
    if (!blocks || !want || type < 0) goto done;

    const hm_type_info *info = hm_type_get((uint32_t)type);
    HM_REQUIRE(info != NULL);
    int64_t n = (int64_t)(nf32 / sizeof(float));
    HM_CHECK_MSG(nf32 % sizeof(float) == 0 && n % info->block_size == 0, "%s: bad .f32 size %zu",
                 tname, nf32);
    HM_CHECK_MSG(hm_row_size((uint32_t)type, n) == nblk,
                 "%s: %zu bytes of blocks for %lld elements, type table says %zu", tname, nblk,
                 (long long)n, hm_row_size((uint32_t)type, n));
    if (hm_row_size((uint32_t)type, n) != nblk) goto done;

    float *got = malloc((size_t)n * sizeof(float));
    HM_REQUIRE(got != NULL);
    /* poison: every element must be written */
    memset(got, 0xff, (size_t)n * sizeof(float));
    hm_status st = quant_dequantize_row((uint32_t)type, blocks, got, n);
    HM_CHECK_MSG(st == HM_OK, "%s: quant_dequantize_row returned %d", tname, (int)st);
    if (st == HM_OK)
        HM_CHECK_MSG(count_mismatches(tname, info->block_size, want, got, n, "whole row") == 0,
                     "%s differs from ggml", tname);

    /* Block by block (a row that starts mid-fixture): same bits. Float types go 64 at a time. */
    int64_t step = info->block_size > 1 ? info->block_size : 64;
    size_t step_bytes = hm_row_size((uint32_t)type, step);
    memset(got, 0xff, (size_t)n * sizeof(float));
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i += step) {
        const uint8_t *src = blocks + (size_t)(i / step) * step_bytes;
        ok = quant_dequantize_row((uint32_t)type, src, got + i, step) == HM_OK;
    }
    HM_CHECK_MSG(ok, "%s: quant_dequantize_row failed on a single block", tname);
    if (ok)
        HM_CHECK_MSG(count_mismatches(tname, info->block_size, want, got, n, "block by block") == 0,
                     "%s differs from ggml block by block", tname);
    free(got);
done:
    free(blocks);
    free(want);
}

static void test_fixtures_f16_bf16(void) {
    check_fixture("f16");
    check_fixture("bf16");
}

static void test_fixtures_legacy_32(void) {
    for (int i = 2; i <= 6; i++) check_fixture(fixture_types[i]);
}

static void test_fixtures_k_quants(void) {
    for (int i = 7; i <= 10; i++) check_fixture(fixture_types[i]);
}

static void test_fixtures_nonlinear(void) {
    for (int i = 11; i < N_FIXTURE_TYPES; i++) check_fixture(fixture_types[i]);
}

/* float -> f16 / bf16 (quant_quantize_row and the fp16.h helpers) against ggml's encodings. */
static void check_convert(uint32_t type, const char *ext) {
    char path[256];
    size_t nx = 0, ny = 0;
    float *x = read_all(FIXTURE_DIR "/convert.f32", &nx);
    snprintf(path, sizeof(path), FIXTURE_DIR "/convert.%s", ext);
    uint16_t *want = read_all(path, &ny);
    HM_CHECK_MSG(x != NULL && want != NULL, "cannot read the convert fixtures (%s)", ext);
    if (!x || !want || nx / 4 != ny / 2 || nx % 4) {
        HM_CHECK_MSG(0, "convert fixture sizes %zu / %zu", nx, ny);
        free(x);
        free(want);
        return;
    }
    int64_t n = (int64_t)(nx / 4);
    uint16_t *got = malloc((size_t)n * 2);
    HM_REQUIRE(got != NULL);
    hm_status st = quant_quantize_row(type, x, got, n);
    HM_CHECK_MSG(st == HM_OK, "quant_quantize_row(%s) returned %d", ext, (int)st);
    int64_t bad = 0, bad_helper = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = type == HM_TYPE_F16 ? hm_f32_to_fp16(x[i]) : hm_f32_to_bf16(x[i]);
        uint32_t xb;
        memcpy(&xb, &x[i], 4);
        if (h != want[i] && bad_helper++ == 0)
            fprintf(stderr, "%s helper: first mismatch at input %lld (0x%08x): ggml 0x%04x, hotmoe 0x%04x\n",
                    ext, (long long)i, xb, want[i], h);
        if (st == HM_OK && got[i] != want[i] && bad++ == 0)
            fprintf(stderr, "%s row: first mismatch at input %lld (0x%08x): ggml 0x%04x, hotmoe 0x%04x\n",
                    ext, (long long)i, xb, want[i], got[i]);
    }
    HM_CHECK_MSG(bad == 0 && bad_helper == 0, "%s: %lld row / %lld helper mismatches of %lld", ext,
                 (long long)bad, (long long)bad_helper, (long long)n);
    free(got);
    free(x);
    free(want);
}

static void test_convert_to_f16_bf16(void) {
    check_convert(HM_TYPE_F16, "f16");
    check_convert(HM_TYPE_BF16, "bf16");
}

/* The fixtures cover what they claim: F16/BF16 every bit pattern in order, MXFP4 every finite
 * E8M0 scale (0..254), and the other types at least one zero and one negative fp16 scale. */
static void test_fixture_coverage(void) {
    size_t n = 0;
    uint16_t *h = read_all(FIXTURE_DIR "/f16.blocks", &n);
    HM_REQUIRE(h != NULL);
    HM_CHECK(n == 65536 * 2);
    int in_order = 1;
    for (size_t i = 0; i < n / 2; i++) in_order &= h[i] == (uint16_t)i;
    HM_CHECK(in_order);
    free(h);

    uint8_t *mx = read_all(FIXTURE_DIR "/mxfp4.blocks", &n);
    HM_REQUIRE(mx != NULL);
    int seen[256] = {0};
    for (size_t b = 0; b + 17 <= n; b += 17) seen[mx[b]] = 1;
    int all = 1;
    for (int e = 0; e < 255; e++) all &= seen[e];
    HM_CHECK_MSG(all, "mxfp4 fixture misses some E8M0 scale in 0..254");
    HM_CHECK_MSG(!seen[255], "mxfp4 fixture has the NaN scale 255");
    free(mx);

    uint8_t *q = read_all(FIXTURE_DIR "/q4_0.blocks", &n);
    HM_REQUIRE(q != NULL);
    int zero = 0, neg = 0, sub = 0;
    for (size_t b = 0; b + 18 <= n; b += 18) {
        uint16_t d = (uint16_t)(q[b] | (q[b + 1] << 8));
        zero |= (d & 0x7fff) == 0;
        neg |= (d & 0x8000) && (d & 0x7fff);
        sub |= (d & 0x7c00) == 0 && (d & 0x3ff);
    }
    HM_CHECK(zero && neg && sub);
    free(q);
}

HM_TEST_MAIN(test_fixtures_f16_bf16, test_fixtures_legacy_32, test_fixtures_k_quants,
             test_fixtures_nonlinear, test_convert_to_f16_bf16, test_fixture_coverage)
