/* test_gguf_seeds.c - the committed fuzz seed corpus (the .gguf files in fuzz/gguf/corpus) is what the
 * writer produces from the recipes below, byte for byte, so any change of the writer's layout
 * shows up here. The files are small (< 4 KB) valid GGUFs: versions 2 and 3, every value type,
 * string arrays, arrays of arrays, tensors of several types, a non-default alignment, and a tiny
 * MoE-shaped model (also used by tests/cli/inspect.sh).
 * Regenerate after an intended change: HOTMOE_REGEN_SEEDS=1 build/<dir>/test_gguf_seeds
 * (run from the repository root), then commit the files. */
#include <stdint.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "quant/qtypes.h"

#define CORPUS "fuzz/gguf/corpus"

typedef struct {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
} seed_tensor;

/* Declares the tensors, then writes their bytes (a fixed pattern per tensor). */
static hm_status add_tensors(gguf_writer *w, const seed_tensor *ts, size_t n) {
    hm_status st = HM_OK;
    for (size_t i = 0; i < n && !st; i++) st = gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne);
    if (!st) st = gguf_writer_begin_data(w);
    for (size_t i = 0; i < n && !st; i++) {
        size_t bytes = hm_row_size(ts[i].type, ts[i].ne[0]) * (size_t)(ts[i].ne[1] * ts[i].ne[2] * ts[i].ne[3]);
        for (size_t b = 0; b < bytes && !st; b++) {
            /* f16/bf16/f32 patterns stay finite: small positive values */
            uint8_t v = (uint8_t)((b * 37 + i * 11) & 0x3f);
            st = gguf_writer_write(w, &v, 1);
        }
    }
    return st;
}

static void fill_ne(seed_tensor *t) {
    for (uint32_t d = t->n_dims; d < 4; d++) t->ne[d] = 1;
}

static hm_status seed_values(gguf_writer *w) {
    int32_t i32s[4] = {-1, 0, 1, 1 << 30};
    double f64s[2] = {0.5, -3.0};
    bool bools[3] = {true, false, true};
    const char *strs[] = {"<s>", "</s>", "hello", "", "\xe2\x96\x81world"};
    hm_status st = gguf_writer_set_str(w, "general.architecture", "seedarch");
    if (!st) st = gguf_writer_set_u8(w, "seed.u8", 255);
    if (!st) st = gguf_writer_set_i8(w, "seed.i8", -128);
    if (!st) st = gguf_writer_set_u16(w, "seed.u16", 65535);
    if (!st) st = gguf_writer_set_i16(w, "seed.i16", -32768);
    if (!st) st = gguf_writer_set_u32(w, "seed.u32", 123456789);
    if (!st) st = gguf_writer_set_i32(w, "seed.i32", -123456789);
    if (!st) st = gguf_writer_set_u64(w, "seed.u64", 1ull << 63);
    if (!st) st = gguf_writer_set_i64(w, "seed.i64", -(1ll << 62));
    if (!st) st = gguf_writer_set_f32(w, "seed.f32", 3.5f);
    if (!st) st = gguf_writer_set_f64(w, "seed.f64", 1e-300);
    if (!st) st = gguf_writer_set_bool(w, "seed.bool", true);
    if (!st) st = gguf_writer_set_arr(w, "seed.arr_i32", GGUF_VT_INT32, i32s, 4);
    if (!st) st = gguf_writer_set_arr(w, "seed.arr_f64", GGUF_VT_FLOAT64, f64s, 2);
    if (!st) st = gguf_writer_set_arr(w, "seed.arr_bool", GGUF_VT_BOOL, bools, 3);
    if (!st) st = gguf_writer_set_arr_str(w, "seed.arr_str", strs, 5);
    if (!st) st = gguf_writer_begin_arr_arr(w, "seed.nested");
    if (!st) st = gguf_writer_set_arr(w, NULL, GGUF_VT_INT32, i32s, 2);
    if (!st) st = gguf_writer_set_arr_str(w, NULL, strs, 3);
    if (!st) st = gguf_writer_begin_arr_arr(w, NULL);
    if (!st) st = gguf_writer_set_arr(w, NULL, GGUF_VT_BOOL, bools, 2);
    if (!st) st = gguf_writer_end_arr_arr(w);
    if (!st) st = gguf_writer_end_arr_arr(w);
    return st;
}

static hm_status seed_v3_values(gguf_writer *w) {
    hm_status st = seed_values(w);
    seed_tensor ts[] = {{"a.f32", HM_TYPE_F32, 1, {5}}, {"b.q4_0", HM_TYPE_Q4_0, 2, {32, 2}}};
    for (size_t i = 0; i < 2; i++) fill_ne(&ts[i]);
    return st ? st : add_tensors(w, ts, 2);
}

static hm_status seed_v2_types(gguf_writer *w) {
    hm_status st = gguf_writer_set_str(w, "general.architecture", "llama");
    if (!st) st = gguf_writer_set_u32(w, "llama.block_count", 1);
    seed_tensor ts[] = {{"q8", HM_TYPE_Q8_0, 2, {32, 2}}, {"h", HM_TYPE_F16, 3, {3, 2, 2}},
                        {"mx", HM_TYPE_MXFP4, 1, {64}}, {"k4", HM_TYPE_Q4_K, 1, {256}},
                        {"q6", HM_TYPE_Q6_K, 1, {256}}};
    for (size_t i = 0; i < 5; i++) fill_ne(&ts[i]);
    return st ? st : add_tensors(w, ts, 5);
}

static hm_status seed_v3_align64(gguf_writer *w) {
    hm_status st = gguf_writer_set_u32(w, "general.alignment", 64);
    if (!st) st = gguf_writer_set_str(w, "general.name", "aligned");
    seed_tensor ts[] = {{"bf", HM_TYPE_BF16, 1, {3}}, {"nl", HM_TYPE_IQ4_NL, 2, {32, 1}},
                        {"blk.0.ffn_up_exps.weight", HM_TYPE_Q5_0, 3, {32, 2, 3}},
                        {"i32", HM_TYPE_I32, 4, {1, 2, 1, 2}}};
    for (size_t i = 0; i < 4; i++) fill_ne(&ts[i]);
    return st ? st : add_tensors(w, ts, 4);
}

/* A tiny MoE-shaped model: layer 0 dense, layers 1-2 with 2 routed experts and a shared one. */
static hm_status seed_moe_tiny(gguf_writer *w) {
    char tok[24][16];
    const char *toks[24];
    for (int i = 0; i < 24; i++) {
        snprintf(tok[i], sizeof(tok[i]), "t%d", i);
        toks[i] = tok[i];
    }
    hm_status st = gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    if (!st) st = gguf_writer_set_str(w, "general.name", "moe-tiny");
    if (!st) st = gguf_writer_set_u32(w, "qwen3moe.block_count", 3);
    if (!st) st = gguf_writer_set_u32(w, "qwen3moe.expert_count", 2);
    if (!st) st = gguf_writer_set_u32(w, "qwen3moe.expert_used_count", 1);
    if (!st) st = gguf_writer_set_f32(w, "qwen3moe.rope.freq_base", 10000.0f);
    if (!st) st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 24);
    if (st) return st;
    seed_tensor ts[40];
    char names[40][48];
    size_t n = 0;
#define T(nm, ty, nd, ...)                                                                 \
    do {                                                                                   \
        snprintf(names[n], sizeof(names[n]), "%s", nm);                                    \
        ts[n] = (seed_tensor){names[n], ty, nd, {__VA_ARGS__}};                            \
        fill_ne(&ts[n]);                                                                   \
        n++;                                                                               \
    } while (0)
    T("token_embd.weight", HM_TYPE_Q8_0, 2, 32, 2);
    for (int l = 0; l < 3; l++) {
        char nm[48];
#define TL(suffix, ty, nd, ...)                                                            \
    do {                                                                                   \
        snprintf(nm, sizeof(nm), "blk.%d.%s", l, suffix);                                  \
        T(nm, ty, nd, __VA_ARGS__);                                                        \
    } while (0)
        TL("attn_norm.weight", HM_TYPE_F16, 1, 32);
        TL("attn_q.weight", HM_TYPE_Q8_0, 2, 32, 1);
        if (l == 0) {
            TL("ffn_gate.weight", HM_TYPE_Q8_0, 2, 32, 1);
            TL("ffn_up.weight", HM_TYPE_Q8_0, 2, 32, 1);
            TL("ffn_down.weight", HM_TYPE_Q8_0, 2, 32, 1);
        } else {
            TL("ffn_gate_inp.weight", HM_TYPE_F16, 2, 32, 2);
            TL("ffn_gate_exps.weight", HM_TYPE_Q8_0, 3, 32, 1, 2);
            TL("ffn_up_exps.weight", HM_TYPE_Q8_0, 3, 32, 1, 2);
            TL("ffn_down_exps.weight", HM_TYPE_Q4_0, 3, 32, 1, 2);
            TL("ffn_up_shexp.weight", HM_TYPE_Q8_0, 2, 32, 1);
        }
#undef TL
    }
    T("output_norm.weight", HM_TYPE_F16, 1, 32);
    T("output.weight", HM_TYPE_Q8_0, 2, 32, 2);
#undef T
    return add_tensors(w, ts, n);
}

typedef struct {
    const char *file;
    hm_status (*build)(gguf_writer *w);
    uint32_t version; /* 2: the version field is rewritten (v2 and v3 differ only there) */
} seed;

static const seed k_seeds[] = {
    {"v3_values.gguf", seed_v3_values, 3},
    {"v2_types.gguf", seed_v2_types, 2},
    {"v3_align64.gguf", seed_v3_align64, 3},
    {"v3_moe_tiny.gguf", seed_moe_tiny, 3},
};

static size_t read_all(const char *path, uint8_t *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void test_seed_corpus(void) {
    const char *d = getenv("HOTMOE_TMP");
    bool regen = getenv("HOTMOE_REGEN_SEEDS") != NULL;
    for (size_t s = 0; s < sizeof(k_seeds) / sizeof(k_seeds[0]); s++) {
        char path[512], committed[512];
        snprintf(path, sizeof(path), "%s/seed_%s", d && *d ? d : "/tmp", k_seeds[s].file);
        snprintf(committed, sizeof(committed), CORPUS "/%s", k_seeds[s].file);
        gguf_writer *w;
        hm_error err;
        HM_REQUIRE(gguf_writer_open(path, &w, &err) == HM_OK);
        hm_status st = k_seeds[s].build(w);
        HM_CHECK_MSG(st == HM_OK, "%s: %s", k_seeds[s].file, gguf_writer_errmsg(w));
        HM_CHECK_MSG(gguf_writer_close(w, &err) == HM_OK, "%s: %s", k_seeds[s].file, err.msg);
        static uint8_t got[8192], want[8192];
        size_t n = read_all(path, got, sizeof(got));
        unlink(path);
        HM_CHECK_MSG(n > 24 && n < 4096, "%s: %zu bytes", k_seeds[s].file, n);
        if (n > 4) got[4] = (uint8_t)k_seeds[s].version;
        gguf_ctx *c;
        HM_CHECK_MSG(gguf_open_mem(got, n, &c, &err) == HM_OK, "%s: %s", k_seeds[s].file, err.msg);
        if (c) {
            HM_CHECK(gguf_version(c) == k_seeds[s].version);
            gguf_close(c);
        }
        if (regen) {
            FILE *f = fopen(committed, "wb");
            HM_CHECK_MSG(f && fwrite(got, 1, n, f) == n, "cannot write %s", committed);
            if (f) fclose(f);
            printf("wrote %s (%zu bytes)\n", committed, n);
        }
        size_t m = read_all(committed, want, sizeof(want));
        HM_CHECK_MSG(m == n && !memcmp(got, want, n), "%s differs from what the writer produces "
                     "(see the top of this file to regenerate)", committed);
    }
}

HM_TEST_MAIN(test_seed_corpus)
