/* test_golden.c - the HuggingFace goldens themselves (tests/model/golden/, README there): that
 * they still describe what `hotmoe forge` writes, and that each file is whole and consistent.
 * The comparison of hotmoe's logits with them is tests/model/test_model_golden.c.
 *
 * For each of the 16 golden files:
 *   - the model is forged here (preset, type, seed 42 from the header) and the GGUF's sha256
 *     and size must equal the header's gguf_sha256 / gguf_size: a change in forge's output
 *     makes the goldens stale, and this test says so by name;
 *   - header: magic, reference is transformers (not the script's --dry-run), compute_dtype
 *     float64, every array inside the file with its declared shape;
 *   - prompts: the ids equal make_prompts() of tools/reference/hf_logits.py rebuilt here from
 *     its LCG (so the prompts are documented by code, not only by data);
 *   - f32 files: the stored logits' argmax equals the stored argmax wherever the stored margin
 *     exceeds f32 rounding, the margin equals top1 - top2 of the stored logits, the std of the
 *     stored logits equals the header's pK.logits_std;
 *   - the first greedy token is the argmax of the prompt's last position;
 *   - perplexity: sum of ppl.nll equals ppl_nll_sum, exp(sum / n) equals ppl, n = ids - 1, and
 *     ppl_text_sha256 is the sha256 of tests/model/golden/ppl_text.txt.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../forge/forge_test_util.h"

#define GOLDEN_DIR "tests/model/golden"

/* ---- sha256 (FIPS 180-4), small and slow enough for a few 30 MB files ---- */

typedef struct {
    uint32_t h[8];
    uint8_t blk[64];
    uint64_t len;
    size_t n;
} sha256_ctx;

static const uint32_t k_sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t ror32(uint32_t x, int r) { return (x >> r) | (x << (32 - r)); }

static void sha256_block(sha256_ctx *c, const uint8_t *p) {
    uint32_t w[64], s[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(s, c->h, sizeof(s));
    uint32_t a = s[0], b = s[1], cc = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) +
                      k_sha_k[i] + w[i];
        uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g, g = f, f = e, e = d + t1, d = cc, cc = b, b = a, a = t1 + t2;
    }
    s[0] = a, s[1] = b, s[2] = cc, s[3] = d, s[4] = e, s[5] = f, s[6] = g, s[7] = h;
    for (int i = 0; i < 8; i++) c->h[i] += s[i];
}

static void sha256_hex(const uint8_t *data, size_t len, char out[65]) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    sha256_ctx c;
    memcpy(c.h, h0, sizeof(h0));
    size_t i = 0;
    for (; i + 64 <= len; i += 64) sha256_block(&c, data + i);
    uint8_t tail[128] = {0};
    size_t r = len - i;
    memcpy(tail, data + i, r);
    tail[r] = 0x80;
    size_t tl = r + 1 + 8 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;
    for (int k = 0; k < 8; k++) tail[tl - 1 - k] = (uint8_t)(bits >> (8 * k));
    sha256_block(&c, tail);
    if (tl == 128) sha256_block(&c, tail + 64);
    for (int k = 0; k < 8; k++) snprintf(out + 8 * k, 9, "%08x", c.h[k]);
}

/* ---- golden file reader ---- */

typedef struct {
    uint8_t *buf;
    size_t n;
    char *hdr;     /* NUL-terminated copy of the header text, up to and including "end\n" */
    size_t data_off;
    uint8_t *data; /* [n - data_off] copy of the arrays' bytes: malloc-aligned (the header's
                      length is arbitrary, so in buf they may be misaligned for int32/float) */
} golden;

static bool golden_open(golden *g, const char *path) {
    memset(g, 0, sizeof(*g));
    g->buf = ft_read_file(path, &g->n);
    if (!g->buf || g->n < 20 || memcmp(g->buf, "hotmoe-golden 1\n", 16)) return false;
    for (size_t i = 0; i + 5 <= g->n; i++)
        if (!memcmp(g->buf + i, "\nend\n", 5)) {
            g->data_off = i + 5;
            g->hdr = malloc(i + 6);
            if (!g->hdr) return false;
            memcpy(g->hdr, g->buf, i + 5);
            g->hdr[i + 5] = 0;
            g->data = malloc(g->n - g->data_off + 1);
            if (!g->data) return false;
            memcpy(g->data, g->buf + g->data_off, g->n - g->data_off);
            return true;
        }
    return false;
}

static void golden_close(golden *g) {
    free(g->buf);
    free(g->hdr);
    free(g->data);
}

static bool golden_str(const golden *g, const char *key, char *out, size_t cap) {
    size_t k = strlen(key);
    for (const char *p = g->hdr; *p;) {
        const char *e = strchr(p, '\n');
        if (!e) break;
        if (!strncmp(p, key, k) && p[k] == ' ') {
            size_t n = (size_t)(e - p) - k - 1;
            if (n >= cap) return false;
            memcpy(out, p + k + 1, n);
            out[n] = 0;
            return true;
        }
        p = e + 1;
    }
    return false;
}

static double golden_num(const golden *g, const char *key) {
    char v[128], *end;
    if (!golden_str(g, key, v, sizeof(v))) return NAN;
    double d = strtod(v, &end);
    return *end ? NAN : d;
}

/* Array NAME of type TYPE: its data, element count and dims (shape "AxB" -> d0=A, d1=B). */
static const void *golden_arr(const golden *g, const char *name, const char *type, int64_t *d0,
                              int64_t *d1) {
    char key[128];
    snprintf(key, sizeof(key), "\narray %s ", name);
    const char *p = strstr(g->hdr, key);
    if (!p) return NULL;
    char t[8], shape[64];
    unsigned long long off;
    if (sscanf(p + strlen(key), "%7s %63s %llu", t, shape, &off) != 3 || strcmp(t, type)) return NULL;
    char *s = shape;
    *d0 = strtoll(s, &s, 10);
    *d1 = 1;
    if (*s == 'x') *d1 = strtoll(s + 1, &s, 10);
    if (*s || *d0 <= 0 || *d1 <= 0) return NULL;
    uint64_t bytes = (uint64_t)*d0 * (uint64_t)*d1 * 4;
    if (off % 4 || g->data_off + off + bytes > g->n) return NULL;
    return g->data + off;
}

/* make_prompts() of tools/reference/hf_logits.py */
static void lcg_ids(uint64_t seed, int n, int32_t *out) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = 3 + (int32_t)((x >> 33) % (960 - 3));
    }
}

static int make_prompt(int k, int32_t bos, int32_t *out) {
    switch (k) {
    case 0: out[0] = bos; lcg_ids(1, 39, out + 1); return 40;
    case 1: lcg_ids(2, 32, out); return 32;
    case 2: {
        int32_t motif[8];
        lcg_ids(4, 8, motif);
        out[0] = bos;
        for (int r = 0; r < 4; r++) memcpy(out + 1 + 8 * r, motif, sizeof(motif));
        return 33;
    }
    case 3: out[0] = bos; lcg_ids(3, 99, out + 1); return 100;
    default: return 0;
    }
}

static void check_file(const char *file, const char *text_sha) {
    char path[512];
    snprintf(path, sizeof(path), GOLDEN_DIR "/%s", file);
    golden g;
    HM_REQUIRE(golden_open(&g, path));
    char preset[64], type[32], want_sha[80], ref[128], v[128];
    HM_REQUIRE(golden_str(&g, "preset", preset, sizeof(preset)));
    HM_REQUIRE(golden_str(&g, "type", type, sizeof(type)));
    HM_REQUIRE(golden_str(&g, "gguf_sha256", want_sha, sizeof(want_sha)));
    HM_REQUIRE(golden_str(&g, "reference", ref, sizeof(ref)));
    HM_CHECK_MSG(!strncmp(ref, "transformers-", 13), "%s: reference '%s'", file, ref);
    HM_CHECK(golden_str(&g, "compute_dtype", v, sizeof(v)) && !strcmp(v, "float64"));
    HM_CHECK(golden_num(&g, "seed") == 42);
    HM_CHECK(golden_str(&g, "ppl_text_sha256", v, sizeof(v)) && !strcmp(v, text_sha));

    /* forge it here: same bytes as on the machine that made the golden? */
    const forge_preset *fp = forge_preset_find(preset);
    int mix = forge_mix_from_name(type);
    HM_REQUIRE(fp && mix >= 0);
    char tag[128], gg[512], got_sha[65];
    snprintf(tag, sizeof(tag), "golden-check-%s-%s", preset, type);
    HM_REQUIRE(ft_forge(fp, (forge_mix)mix, 42, tag, false, 2, gg, sizeof(gg), NULL, 0) == HM_OK);
    size_t fsz;
    uint8_t *fb = ft_read_file(gg, &fsz);
    HM_REQUIRE(fb);
    sha256_hex(fb, fsz, got_sha);
    free(fb);
    remove(gg);
    HM_CHECK_MSG(!strcmp(got_sha, want_sha),
                 "%s: forge output changed (sha256 %s, golden made from %s): re-make the goldens "
                 "(tests/model/golden/README.md)", file, got_sha, want_sha);
    HM_CHECK((double)fsz == golden_num(&g, "gguf_size"));

    const int64_t V = (int64_t)golden_num(&g, "n_vocab");
    const int32_t bos = (int32_t)golden_num(&g, "bos");
    const bool full = golden_num(&g, "has_logits") == 1;
    HM_CHECK(full == !strcmp(type, "f32"));
    HM_REQUIRE(V == 1024 && golden_num(&g, "n_prompts") == 4 && golden_num(&g, "n_greedy") == 64);
    int mism = 0;
    for (int k = 0; k < 4; k++) {
        char nm[64];
        int64_t n, one, n2, ng, ng2;
        int32_t want[128];
        int wn = make_prompt(k, bos, want);
        snprintf(nm, sizeof(nm), "p%d.ids", k);
        const int32_t *ids = golden_arr(&g, nm, "i32", &n, &one);
        snprintf(nm, sizeof(nm), "p%d.argmax", k);
        const int32_t *am = golden_arr(&g, nm, "i32", &n2, &one);
        snprintf(nm, sizeof(nm), "p%d.margin", k);
        const float *mg = golden_arr(&g, nm, "f32", &n2, &one);
        snprintf(nm, sizeof(nm), "p%d.greedy", k);
        const int32_t *gr = golden_arr(&g, nm, "i32", &ng, &one);
        snprintf(nm, sizeof(nm), "p%d.greedy_margin", k);
        const float *gm = golden_arr(&g, nm, "f32", &ng2, &one);
        HM_REQUIRE(ids && am && mg && gr && gm && n2 == n && ng == 64 && ng2 == 64);
        HM_CHECK_MSG(n == wn && !memcmp(ids, want, (size_t)wn * 4), "%s p%d: ids differ from "
                     "make_prompts()", file, k);
        HM_CHECK(gr[0] == am[n - 1]);
        for (int64_t t = 0; t < n; t++) HM_CHECK(am[t] >= 0 && am[t] < V && mg[t] >= 0);
        for (int s = 0; s < 64; s++) HM_CHECK(gr[s] >= 0 && gr[s] < V && gm[s] >= 0);
        if (!full) continue;
        int64_t nl, vl;
        snprintf(nm, sizeof(nm), "p%d.logits", k);
        const float *lg = golden_arr(&g, nm, "f32", &nl, &vl);
        HM_REQUIRE(lg && nl == n && vl == V);
        double sum = 0, sq = 0;
        for (int64_t t = 0; t < n; t++) {
            const float *l = lg + t * V;
            int b = 0;
            for (int64_t j = 1; j < V; j++)
                if (l[j] > l[b]) b = (int)j;
            double b2 = -INFINITY;
            for (int64_t j = 0; j < V; j++)
                if (j != b && l[j] > b2) b2 = l[j];
            /* f32 storage of float64 logits moves each by <= 2^-24 relative */
            if (mg[t] > 1e-5) mism += b != am[t];
            HM_CHECK_MSG(fabs((l[b] - b2) - mg[t]) < 1e-5, "%s p%d t%lld: margin", file, k,
                         (long long)t);
            for (int64_t j = 0; j < V; j++) sum += l[j], sq += (double)l[j] * l[j];
        }
        double cnt = (double)(n * V), mean = sum / cnt;
        double sd = sqrt((sq - cnt * mean * mean) / (cnt - 1));
        snprintf(nm, sizeof(nm), "p%d.logits_std", k);
        HM_CHECK_MSG(fabs(sd / golden_num(&g, nm) - 1) < 1e-5, "%s p%d: std %.9g vs %.9g", file,
                     k, sd, golden_num(&g, nm));
    }
    HM_CHECK_MSG(mism == 0, "%s: %d stored argmax differ from the stored logits", file, mism);

    int64_t m, one, mn;
    const int32_t *pid = golden_arr(&g, "ppl.ids", "i32", &m, &one);
    const float *nll = golden_arr(&g, "ppl.nll", "f32", &mn, &one);
    HM_REQUIRE(pid && nll && mn == m - 1 && golden_num(&g, "ppl_n_scored") == (double)(m - 1));
    double s = 0;
    for (int64_t i = 0; i < m; i++) HM_CHECK(pid[i] >= 0 && pid[i] < V);
    for (int64_t i = 0; i < mn; i++) s += nll[i];
    const double ref_sum = golden_num(&g, "ppl_nll_sum"), ppl = golden_num(&g, "ppl");
    HM_CHECK_MSG(fabs(s / ref_sum - 1) < 1e-6, "%s: sum(nll) %.10g vs %.10g", file, s, ref_sum);
    HM_CHECK(fabs(exp(ref_sum / (double)mn) / ppl - 1) < 1e-12);
    HM_CHECK(ppl > 100 && ppl < 10000); /* random weights: near the vocabulary size */
    printf("  %-28s sha256 %.12s  ppl %.4f over %lld tokens\n", file, got_sha, ppl,
           (long long)mn);
    golden_close(&g);
}

static void test_sha256(void) {
    /* FIPS 180-4 examples */
    char h[65];
    sha256_hex((const uint8_t *)"abc", 3, h);
    HM_CHECK(!strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha256_hex((const uint8_t *)m, strlen(m), h);
    HM_CHECK(!strcmp(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    sha256_hex((const uint8_t *)"", 0, h);
    HM_CHECK(!strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
}

static void test_golden_files(void) {
    static const char *const files[] = {
        "tiny-qwen3moe-f32",   "tiny-qwen3moe-q8_0", "tiny-qwen3moe-q4_k_m", "tiny-mixtral-f32",
        "tiny-mixtral-q8_0",   "tiny-mixtral-q4_k_m", "tiny-olmoe-f32",      "tiny-olmoe-q8_0",
        "tiny-olmoe-q4_k_m",   "tiny-gpt-oss-f32",    "tiny-gpt-oss-q8_0",   "tiny-gpt-oss-q4_k_m",
        "tiny-gpt-oss-mxfp4",  "tiny-qwen2moe-f32",   "tiny-qwen2moe-q8_0",  "tiny-qwen2moe-q4_k_m"};
    size_t tn;
    uint8_t *text = ft_read_file(GOLDEN_DIR "/ppl_text.txt", &tn);
    HM_REQUIRE(text);
    char tsha[65];
    sha256_hex(text, tn, tsha);
    free(text);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char f[96];
        snprintf(f, sizeof(f), "%s.golden", files[i]);
        check_file(f, tsha);
    }
}

HM_TEST_MAIN(test_sha256, test_golden_files)
