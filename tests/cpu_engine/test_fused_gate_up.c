/* test_fused_gate_up.c - experts' gate and up fused in one tensor (llama.cpp's ffn_gate_up_exps
 * {n_embd, 2 n_ff_exp, n_expert}: per expert the gate rows, then the up rows), as the published
 * Gemma-4 GGUFs and llama.cpp's convert --fuse-gate-up-exps write them:
 *   - forge --fuse-gate-up writes that layout for gemma4, qwen3next and qwen35moe: one fused
 *     tensor per layer (the MTP block's too), no separate gate/up, and its rows are byte for byte
 *     the separate file's gate and up rows; other architectures are refused;
 *   - the loader presents it as gate_exps and up_exps views of the mapped tensor (an expert
 *     stride of 2 n_ff_exp rows, no copy), and the CPU engine gives the separate file's logits
 *     bytes for a prompt and for decode steps, in f32, q8_0 and Q4_K_M, with and without the
 *     rows repacked by eights;
 *   - a misshapen fused tensor is named with its expected shape, a missing gate names the fused
 *     alternative, and a fused tensor on an architecture llama.cpp reads without it is refused
 *     by name. The GPU's upload of such a file: tests/runtime/test_context_archs_gpu.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cpu_engine/cpu_engine.h"
#include "engine_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "moe/offload.h"
#include "quant/qtypes.h"
#include "runtime/context.h"

static const char *const k_presets[] = {"tiny-gemma4moe", "tiny-qwen35moe", "tiny-qwen3next"};
enum { N_PRESETS = 3 };

/* preset in mix to HOTMOE_TMP/<tag>.gguf, fused or not */
static hm_status forge_file(const char *preset, forge_mix mix, bool fuse, char *path, size_t cap,
                            hm_error *err) {
    char name[160];
    snprintf(name, sizeof(name), "fgu-%s-%s%s.gguf", preset, forge_mix_name(mix),
             fuse ? "-fused" : "");
    ft_path(path, cap, name);
    forge_job job = {.preset = forge_preset_find(preset), .mix = mix, .out_path = path,
                     .n_threads = 2, .fuse_gate_up = fuse};
    job.gen.seed = 42;
    forge_result res;
    return forge_write_gguf(&job, &res, err);
}

/* The fused file's tensors: one ffn_gate_up_exps per block, its rows the separate file's. */
static void test_forge_layout(void) {
    const forge_mix mixes[] = {FORGE_MIX_F32, FORGE_MIX_Q4_K_M};
    for (int pi = 0; pi < N_PRESETS; pi++)
        for (int mi = 0; mi < 2; mi++) {
            char a[512], b[512];
            hm_error err;
            HM_REQUIRE(forge_file(k_presets[pi], mixes[mi], false, a, sizeof(a), &err) == HM_OK);
            HM_REQUIRE(forge_file(k_presets[pi], mixes[mi], true, b, sizeof(b), &err) == HM_OK);
            gguf_ctx *ga = NULL, *gb = NULL;
            HM_REQUIRE(gguf_open(a, &ga, &err) == HM_OK && gguf_open(b, &gb, &err) == HM_OK);
            int n_fused = 0;
            for (int il = 0; il < 64; il++) {
                char gn[96], un[96], fn[96];
                snprintf(gn, sizeof(gn), "blk.%d.ffn_gate_exps.weight", il);
                snprintf(un, sizeof(un), "blk.%d.ffn_up_exps.weight", il);
                snprintf(fn, sizeof(fn), "blk.%d.ffn_gate_up_exps.weight", il);
                const gguf_tensor *g = gguf_find_tensor(ga, gn), *u = gguf_find_tensor(ga, un),
                                  *f = gguf_find_tensor(gb, fn);
                HM_CHECK(!gguf_find_tensor(gb, gn) && !gguf_find_tensor(gb, un));
                if (!g) {
                    HM_CHECK(!f);
                    continue;
                }
                HM_REQUIRE(u && f);
                n_fused++;
                const int64_t F = g->ne[1], X = g->ne[2];
                HM_CHECK(f->type == g->type && f->ne[0] == g->ne[0] && f->ne[1] == 2 * F &&
                         f->ne[2] == X);
                const size_t rs = hm_row_size(g->type, g->ne[0]), eb = (size_t)F * rs;
                bool same = true;
                for (int64_t e = 0; e < X; e++) {
                    const char *fe = (const char *)f->data + 2 * (size_t)e * eb;
                    same = same && !memcmp(fe, (const char *)g->data + (size_t)e * eb, eb) &&
                           !memcmp(fe + eb, (const char *)u->data + (size_t)e * eb, eb);
                }
                HM_CHECK_MSG(same, "%s %s: %s is not gate rows then up rows per expert",
                             k_presets[pi], forge_mix_name(mixes[mi]), fn);
            }
            HM_CHECK(n_fused >= 4);
            HM_CHECK(gguf_tensor_count(gb) == gguf_tensor_count(ga) - n_fused);
            gguf_close(ga);
            gguf_close(gb);
            remove(a);
            remove(b);
        }
    /* architectures llama.cpp reads only with separate gate and up */
    char p[512];
    hm_error err;
    HM_CHECK(forge_file("tiny-qwen3moe", FORGE_MIX_F32, true, p, sizeof(p), &err) == HM_ERR_ARG &&
             strstr(err.msg, "qwen3moe"));
}

/* ---- the CPU engine ---- */

#define N_PROMPT 10
#define N_STEPS 4

/* logits of a prompt (one call) then N_STEPS decode steps, [N_PROMPT + N_STEPS][V] */
static bool run_model(const hm_model *m, const int32_t *ids, float *lo) {
    const int64_t V = hm_model_hparams(m)->n_vocab;
    cpu_engine_params p = {.n_ctx = 32, .n_ubatch = N_PROMPT, .n_threads = 2,
                           .type_k = HM_TYPE_F32, .type_v = HM_TYPE_F32, .n_seq = 1};
    cpu_engine *e = NULL;
    hm_error err;
    if (cpu_engine_init(m, &p, &e, &err) != HM_OK) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return false;
    }
    hm_status st = cpu_engine_decode(e, ids, N_PROMPT, 0, lo, HM_LOGITS_ALL, &err);
    for (int t = N_PROMPT; t < N_PROMPT + N_STEPS && st == HM_OK; t++)
        st = cpu_engine_decode(e, ids + t, 1, t, lo + (size_t)t * (size_t)V, HM_LOGITS_ALL, &err);
    if (st != HM_OK) fprintf(stderr, "decode: %s\n", err.msg);
    cpu_engine_free(e);
    return st == HM_OK;
}

static void same_logits(const char *preset, forge_mix mix) {
    char a[512], b[512];
    hm_error err;
    HM_REQUIRE(forge_file(preset, mix, false, a, sizeof(a), &err) == HM_OK);
    HM_REQUIRE(forge_file(preset, mix, true, b, sizeof(b), &err) == HM_OK);
    int32_t ids[N_PROMPT + N_STEPS];
    uint64_t x = 7;
    for (int i = 0; i < N_PROMPT + N_STEPS; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((x >> 33) % 500);
    }
    for (int repack = 0; repack < 2; repack++) {
        hm_model_params mp = hm_model_default_params();
        mp.repack = repack;
        hm_model *ma = NULL, *mb = NULL;
        HM_REQUIRE(hm_model_load(a, &mp, &ma, &err) == HM_OK);
        HM_REQUIRE(hm_model_load(b, &mp, &mb, &err) == HM_OK);
        HM_CHECK(!hm_model_fused_gate_up(ma) && hm_model_fused_gate_up(mb));
        const hm_hparams *hp = hm_model_hparams(mb);
        for (int il = 0; il < hp->n_layer; il++) {
            const hm_tensor *g = &hm_model_layer(mb, il)->gate_exps;
            const hm_tensor *u = &hm_model_layer(mb, il)->up_exps;
            HM_CHECK(g->ne[1] == hp->n_ff_exp && g->expert_stride == 2 * (size_t)hp->n_ff_exp *
                                                                       g->row_size &&
                     (const char *)u->data ==
                         (const char *)g->data + (size_t)hp->n_ff_exp * g->row_size);
            HM_CHECK(!repack || !hm_model_layer(ma, il)->gate_exps.x8 == !g->x8);
        }
        /* the file stays mapped: no second copy of the experts */
        HM_CHECK(hm_model_weight_bytes(mb) == hm_model_weight_bytes(ma));
        const size_t sz = sizeof(float) * (N_PROMPT + N_STEPS) * (size_t)hp->n_vocab;
        float *la = malloc(sz), *lb = malloc(sz);
        HM_REQUIRE(la && lb);
        HM_REQUIRE(run_model(ma, ids, la) && run_model(mb, ids, lb));
        HM_CHECK_MSG(!memcmp(la, lb, sz), "%s %s%s: the fused file gives other logits bytes",
                     preset, forge_mix_name(mix), repack ? " (repacked)" : "");
        free(la);
        free(lb);
        hm_model_free(ma);
        hm_model_free(mb);
    }
    remove(a);
    remove(b);
}

static void test_same_logits(void) {
    const forge_mix mixes[] = {FORGE_MIX_F32, FORGE_MIX_Q8_0, FORGE_MIX_Q4_K_M};
    for (int pi = 0; pi < N_PRESETS; pi++)
        for (int mi = 0; mi < 3; mi++) same_logits(k_presets[pi], mixes[mi]);
}

/* The byte ranges of one expert that copies to the GPU read (moe/offload.h: uploads, fetches,
 * the hot cache's exchanges): in a fused file they are the separate file's bytes, and the span
 * to pin covers every expert's rows. */
static void test_offload_ranges(void) {
    char a[512], b[512];
    hm_error err;
    HM_REQUIRE(forge_file("tiny-gemma4moe", FORGE_MIX_Q8_0, false, a, sizeof(a), &err) == HM_OK);
    HM_REQUIRE(forge_file("tiny-gemma4moe", FORGE_MIX_Q8_0, true, b, sizeof(b), &err) == HM_OK);
    hm_model *ma = NULL, *mb = NULL;
    HM_REQUIRE(hm_model_load(a, NULL, &ma, &err) == HM_OK &&
               hm_model_load(b, NULL, &mb, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(ma);
    int bad = 0;
    for (int il = 0; il < hp->n_layer; il++)
        for (int e = 0; e < hp->n_expert; e++) {
            offload_range ra[OFFLOAD_MAX_RANGES], rb[OFFLOAD_MAX_RANGES];
            const int na = offload_expert_ranges(ma, il, e, ra);
            const int nb = offload_expert_ranges(mb, il, e, rb);
            bad += na != nb || na < 3;
            for (int i = 0; i < na && i < nb; i++)
                bad += ra[i].n != rb[i].n || memcmp(ra[i].p, rb[i].p, ra[i].n) != 0;
        }
    HM_CHECK_MSG(bad == 0, "%d expert ranges of the fused file differ from the separate file's",
                 bad);
    HM_CHECK(offload_expert_size(ma, 0, 256) == offload_expert_size(mb, 0, 256));
    const void *p;
    size_t n;
    HM_REQUIRE(offload_expert_span(mb, &p, &n));
    const hm_layer *L = hm_model_layer(mb, 0);
    const char *lo = p, *hi = (const char *)p + n;
    const char *up_last =
        (const char *)L->up_exps.data + (size_t)(hp->n_expert - 1) * L->up_exps.expert_stride;
    HM_CHECK((const char *)L->gate_exps.data >= lo &&
             up_last + L->up_exps.row_size * (size_t)hp->n_ff_exp <= hi);
    hm_model_free(ma);
    hm_model_free(mb);
    remove(a);
    remove(b);
}

/* ---- the loader's errors ---- */

/* preset written (f32) with layer 1's gate renamed ffn_gate_up_exps, ne[1] times `mul`, and its
 * up dropped (mul 0: the gate dropped, the up kept); then loaded */
static hm_status load_fused(const char *preset, int64_t mul, hm_error *err) {
    const forge_preset *p = forge_preset_find(preset);
    forge_tensor_list l = {0};
    forge_vocab v = {0};
    hm_status st = forge_tensors_build(p, FORGE_MIX_F32, &l, err);
    if (st == HM_OK) st = forge_vocab_build(p, &v, err);
    for (int i = 0; st == HM_OK && i < l.n; i++) {
        if (!mul) {
            if (!strcmp(l.t[i].name, "blk.1.ffn_gate_exps.weight")) l.t[i--] = l.t[--l.n];
        } else if (!strcmp(l.t[i].name, "blk.1.ffn_gate_exps.weight")) {
            snprintf(l.t[i].name, sizeof(l.t[i].name), "blk.1.ffn_gate_up_exps.weight");
            l.t[i].ne[1] *= mul;
        } else if (!strcmp(l.t[i].name, "blk.1.ffn_up_exps.weight")) {
            l.t[i--] = l.t[--l.n];
        }
    }
    return ft_write_load(p, &v, &l, "fgu-edited.gguf", 3, st, err);
}

static void test_load_errors(void) {
    hm_error err;
    HM_CHECK(load_fused("tiny-gemma4moe", 2, &err) == HM_OK);
    HM_CHECK(load_fused("tiny-gemma4moe", 3, &err) == HM_ERR_FORMAT &&
             strstr(err.msg, "blk.1.ffn_gate_up_exps.weight") && strstr(err.msg, "expected"));
    HM_CHECK(load_fused("tiny-qwen35moe", 1, &err) == HM_ERR_FORMAT &&
             strstr(err.msg, "blk.1.ffn_gate_up_exps.weight") && strstr(err.msg, "expected"));
    HM_CHECK(load_fused("tiny-qwen35moe", 0, &err) == HM_ERR_NOT_FOUND &&
             strstr(err.msg, "blk.1.ffn_gate_exps.weight") &&
             strstr(err.msg, "blk.1.ffn_gate_up_exps.weight"));
    HM_CHECK(load_fused("tiny-qwen3moe", 2, &err) == HM_ERR_UNSUPPORTED &&
             strstr(err.msg, "blk.1.ffn_gate_up_exps.weight") && strstr(err.msg, "qwen3moe"));
}

HM_TEST_MAIN(test_forge_layout, test_same_logits, test_offload_ranges, test_load_errors)
