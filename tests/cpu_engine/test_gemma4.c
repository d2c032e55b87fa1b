/* test_gemma4.c - the gemma4 architecture (Gemma 4's MoE model): forge's presets and GGUF
 * layout, the HF twin's names, the loader and its errors, the CPU engine's forward pass
 * (docs/GEMMA4.md):
 *   - tiny-gemma4moe's file has llama.cpp's tensors per layer kind (a sliding layer's attn_v,
 *     a full layer's global head size and one kv head, no attn_v), the dense MLP and its norms,
 *     the router's scale, per-expert scales, layer_output_scale, rope_freqs (1 on the rotated
 *     pairs, 1e30 on the others), no output.weight (tied), and the per-layer arrays;
 *   - the real preset's counts (Gemma-4-26B-A4B: 25.23B parameters);
 *   - the loader reads the layer kinds, the sizes per kind, the tied output, and names a
 *     missing or misshapen tensor; a full layer with its own attn_v, fused gate/up experts
 *     beside a separate up (fused ones alone: test_fused_gate_up.c), shared KV layers and kv
 *     heads differing within a kind are refused;
 *   - the CPU engine runs the model:
 *   - a prompt gives the same bytes as its tokens one by one, as ubatches of 3 and 5, with 1 or 2
 *     threads and again after a reset (f32 and Q4_K_M);
 *   - the logits match a double-precision reference written from the model's definition
 *     (gemma4_ref.h) within 1e-4 x their standard deviation, the same argmax at every position;
 *   - the sliding window: a prompt ten times tiny's window through a window-sized ring matches
 *     the reference, whose logits without the window differ far beyond that bar; a rewind past
 *     what the ring holds is refused;
 *   - two sequences interleaved in one engine give each sequence's bytes alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cpu_engine/cpu_engine.h"
#include "engine_test_util.h"
#include "gemma4_ref.h"
#include "harness.h"
#include "model/model.h"
#include "quant/qtypes.h"
#include "runtime/context.h"

static const forge_preset *preset(void) { return forge_preset_find("tiny-gemma4moe"); }

static bool has(const gguf_ctx *g, const char *name, int nd, int64_t a, int64_t b) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    return t && (int)t->n_dims == nd && t->ne[0] == a && (nd < 2 || t->ne[1] == b);
}

static void test_forge_layout(void) {
    const forge_preset *p = preset();
    HM_REQUIRE(p && p->tiny && p->arch == FORGE_ARCH_GEMMA4);
    char path[512];
    HM_REQUIRE(ft_forge(p, FORGE_MIX_Q4_K_M, 42, "g4-layout", false, 2, path, sizeof(path), NULL,
                        0) == HM_OK);
    gguf_ctx *g = NULL;
    hm_error err;
    HM_REQUIRE(gguf_open(path, &g, &err) == HM_OK);
    const int64_t E = 128;
    /* 2 sliding layers of 23 tensors, 2 full ones of 22, token_embd, rope_freqs, output_norm */
    HM_CHECK_MSG(gguf_tensor_count(g) == 3 + 2 * 23 + 2 * 22, "%lld tensors",
                 (long long)gguf_tensor_count(g));
    HM_CHECK(!gguf_find_tensor(g, "output.weight"));
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    HM_CHECK(te && te->type == HM_TYPE_Q8_0); /* tied: output's Q6_K, 128 wide falls back */
    const gguf_tensor *rf = gguf_find_tensor(g, "rope_freqs.weight");
    HM_REQUIRE(rf && rf->type == HM_TYPE_F32 && rf->ne[0] == 32);
    const float *f = rf->data;
    HM_CHECK(f[0] == 1.0f && f[7] == 1.0f && f[8] == 1e30f && f[31] == 1e30f);
    for (int il = 0; il < 4; il++) {
        const bool swa = il % 2 == 0;
        const int64_t hd = swa ? 32 : 64, kv = swa ? 2 : 1;
        char n[96];
#define HAS(suf, nd, a, b)                                                                        \
    do {                                                                                          \
        snprintf(n, sizeof(n), "blk.%d.%s", il, suf);                                             \
        HM_CHECK_MSG(has(g, n, nd, a, b), "%s missing or misshapen", n);                         \
    } while (0)
        HAS("attn_q.weight", 2, E, 4 * hd);
        HAS("attn_k.weight", 2, E, kv * hd);
        HAS("attn_output.weight", 2, 4 * hd, E);
        HAS("attn_q_norm.weight", 1, hd, 1);
        HAS("attn_k_norm.weight", 1, hd, 1);
        HAS("post_attention_norm.weight", 1, E, 1);
        HAS("layer_output_scale.weight", 1, 1, 1);
        HAS("ffn_norm.weight", 1, E, 1);
        HAS("ffn_gate.weight", 2, E, 64);
        HAS("ffn_down.weight", 2, 64, E);
        HAS("post_ffw_norm.weight", 1, E, 1);
        HAS("ffn_gate_inp.weight", 2, E, 16);
        HAS("ffn_gate_inp.scale", 1, E, 1);
        HAS("pre_ffw_norm_2.weight", 1, E, 1);
        HAS("post_ffw_norm_1.weight", 1, E, 1);
        HAS("post_ffw_norm_2.weight", 1, E, 1);
        HAS("ffn_gate_exps.weight", 3, E, 32);
        HAS("ffn_down_exps.weight", 3, 32, E);
        HAS("ffn_down_exps.scale", 1, 16, 1);
        snprintf(n, sizeof(n), "blk.%d.attn_v.weight", il);
        HM_CHECK_MSG(swa == !!gguf_find_tensor(g, n), "%s", n);
        snprintf(n, sizeof(n), "blk.%d.ffn_gate_inp.scale", il);
        const gguf_tensor *t = gguf_find_tensor(g, n);
        HM_CHECK(t && t->type == HM_TYPE_F32);
#undef HAS
    }
    gguf_arr arr;
    HM_REQUIRE(gguf_get_arr(g, "gemma4.attention.sliding_window_pattern", &arr, &err) == HM_OK);
    HM_CHECK(arr.n == 4 && gguf_arr_int(&arr, 0) == 1 && gguf_arr_int(&arr, 1) == 0 &&
             gguf_arr_int(&arr, 3) == 0);
    HM_REQUIRE(gguf_get_arr(g, "gemma4.attention.head_count_kv", &arr, &err) == HM_OK);
    HM_CHECK(arr.n == 4 && gguf_arr_int(&arr, 0) == 2 && gguf_arr_int(&arr, 1) == 1);
    int64_t v = 0;
    HM_CHECK(gguf_get_int(g, "gemma4.attention.key_length", &v, &err) == HM_OK && v == 64);
    HM_CHECK(gguf_get_int(g, "gemma4.attention.key_length_swa", &v, &err) == HM_OK && v == 32);
    HM_CHECK(gguf_get_int(g, "gemma4.rope.dimension_count", &v, &err) == HM_OK && v == 64);
    HM_CHECK(gguf_get_int(g, "gemma4.expert_feed_forward_length", &v, &err) == HM_OK && v == 32);
    double d = 0;
    HM_CHECK(gguf_get_float(g, "gemma4.final_logit_softcapping", &d, &err) == HM_OK && d == 30.0);
    HM_CHECK(gguf_get_float(g, "gemma4.rope.freq_base_swa", &d, &err) == HM_OK && d == 1e4);
    HM_CHECK(gguf_get_float(g, "gemma4.rope.freq_base", &d, &err) == HM_OK && d == 1e6);
    gguf_close(g);
    remove(path);
    /* the real preset: Gemma-4-26B-A4B's 25.2B parameters */
    const forge_preset *r = forge_preset_find("gemma-4-26b-a4b");
    HM_REQUIRE(r && forge_preset_check(r, &err) == HM_OK);
    forge_tensor_list l;
    HM_REQUIRE(forge_tensors_build(r, FORGE_MIX_Q4_K_M, &l, &err) == HM_OK);
    int64_t np = 0;
    forge_tensors_totals(&l, &np, NULL);
    HM_CHECK_MSG(np > 25200000000LL && np < 25260000000LL, "%lld parameters", (long long)np);
    HM_CHECK(l.n == 3 + 25 * 23 + 5 * 22);
    forge_tensors_free(&l);
    /* the last layer must be full attention, as transformers forces */
    forge_preset bad = *p;
    bad.n_layer = 3;
    HM_CHECK(forge_preset_check(&bad, &err) == HM_ERR_ARG && strstr(err.msg, "last layer"));
}

static void test_hf_names(void) {
    const forge_preset *p = preset();
    forge_tensor_list l;
    hm_error err;
    HM_REQUIRE(forge_tensors_build(p, FORGE_MIX_F32, &l, &err) == HM_OK);
    forge_hf_tensor *hs = NULL;
    int nh = 0;
    HM_REQUIRE(forge_hf_plan(p, &l, &hs, &nh, &err) == HM_OK);
    int found = 0;
    for (int i = 0; i < nh; i++) {
        const forge_hf_tensor *h = &hs[i];
        HM_CHECK_MSG(!strstr(h->name, "lm_head") && !strstr(h->name, "rope"), "%s", h->name);
        if (!strcmp(h->name, "model.layers.1.experts.gate_up_proj"))
            found += h->op == FH_CAT_GU && h->shape[0] == 16 && h->shape[1] == 64 && h->shape[2] == 128;
        if (!strcmp(h->name, "model.layers.1.router.per_expert_scale")) found += h->shape[0] == 16;
        if (!strcmp(h->name, "model.layers.2.self_attn.v_proj.weight")) found++;
        if (!strcmp(h->name, "model.layers.3.self_attn.v_proj.weight")) found += 100;
        if (!strcmp(h->name, "model.layers.0.layer_scalar")) found++;
        if (!strcmp(h->name, "model.layers.0.pre_feedforward_layernorm_2.weight")) found++;
    }
    HM_CHECK_MSG(found == 5, "found %d", found);
    free(hs);
    forge_tensors_free(&l);
}

/* the tiny preset p written with tensor `name` dropped (grow 0), grown by one row (1) or
 * renamed to `to` (2; ne[1] doubled when the name has gate_up), then loaded */
static hm_status load_broken(const forge_preset *p, const char *name, int op, const char *to,
                             hm_error *err) {
    forge_tensor_list l = {0};
    forge_vocab v = {0};
    hm_status st = forge_tensors_build(p, FORGE_MIX_F32, &l, err);
    if (st == HM_OK) st = forge_vocab_build(p, &v, err);
    for (int i = 0; st == HM_OK && name && i < l.n; i++) {
        if (strcmp(l.t[i].name, name)) continue;
        if (op == 1) l.t[i].ne[1]++;
        else if (op == 2) {
            snprintf(l.t[i].name, sizeof(l.t[i].name), "%s", to);
            if (strstr(to, "gate_up")) l.t[i].ne[1] *= 2;
        } else l.t[i] = l.t[--l.n];
        break;
    }
    return ft_write_load(p, &v, &l, "g4-broken.gguf", 1, st, err);
}

static void test_load(void) {
    char path[512];
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(ft_forge(preset(), FORGE_MIX_F32, 42, "g4-f32", false, 2, path, sizeof(path), NULL,
                        0) == HM_OK);
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    HM_CHECK(hm_model_arch(m)->gemma4);
    HM_CHECK(hp->n_layer == 4 && hp->n_embd == 128 && hp->n_vocab == 1024);
    HM_CHECK(hp->head_dim_k == 64 && hp->n_head_kv == 1 && hp->n_rot == 64 && hp->rope_base == 1e6f);
    HM_CHECK(hp->head_dim_swa == 32 && hp->n_head_kv_swa == 2 && hp->n_rot_swa == 32 &&
             hp->rope_base_swa == 1e4f);
    HM_CHECK(hp->n_ff == 64 && hp->n_ff_exp == 32 && hp->n_expert == 16 && hp->n_expert_used == 4);
    HM_CHECK(hp->sliding_window == 4 && hp->logit_softcap == 30.0f);
    HM_CHECK(hm_model_output(m)->data == hm_model_tok_embd(m)->data); /* tied */
    const hm_tensor *rf = hm_model_rope_freqs(m);
    HM_CHECK(rf->data && rf->ne[0] == 32 && ((const float *)rf->data)[8] == 1e30f);
    for (int il = 0; il < 4; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        HM_CHECK(L->swa == (il % 2 == 0));
        HM_CHECK(L->swa ? L->wv.data && L->wq.ne[1] == 128 : !L->wv.data && L->wq.ne[1] == 256);
        HM_CHECK(L->ffn_gate.data && L->ffn_post_norm1.data && L->ffn_pre_norm2.data &&
                 L->ffn_post_norm2.data && L->ffn_post_norm.data && L->attn_post_norm.data);
        HM_CHECK(L->router_scale.ne[0] == 128 && L->down_exps_scale.ne[0] == 16 &&
                 L->out_scale.ne[0] == 1 && L->gate_exps.ne[2] == 16);
    }
    /* the CPU engine takes it (GPU placements: tests/runtime/test_context_archs_gpu.c) */
    hm_context_params p = hm_context_default_params();
    p.n_ctx = 32;
    p.n_threads = 1;
    hm_context *c = NULL;
    HM_CHECK(hm_context_init(m, &p, &c, &err) == HM_OK && c);
    hm_context_free(c);
    hm_model_free(m);
    remove(path);

    const forge_preset *tp = preset();
    HM_CHECK(load_broken(tp, "blk.1.ffn_down_exps.scale", 0, NULL, &err) == HM_ERR_NOT_FOUND &&
             strstr(err.msg, "blk.1.ffn_down_exps.scale"));
    HM_CHECK(load_broken(tp, "blk.2.post_ffw_norm_1.weight", 0, NULL, &err) == HM_ERR_NOT_FOUND &&
             strstr(err.msg, "blk.2.post_ffw_norm_1.weight"));
    HM_CHECK(load_broken(tp, "rope_freqs.weight", 0, NULL, &err) == HM_ERR_NOT_FOUND &&
             strstr(err.msg, "rope_freqs.weight"));
    HM_CHECK(load_broken(tp, "blk.3.attn_k.weight", 1, NULL, &err) == HM_ERR_FORMAT &&
             strstr(err.msg, "blk.3.attn_k.weight") && strstr(err.msg, "expected"));
    HM_CHECK(load_broken(tp, "blk.0.ffn_gate.weight", 1, NULL, &err) == HM_ERR_FORMAT &&
             strstr(err.msg, "blk.0.ffn_gate.weight"));
    /* a full layer with a V of its own; fused gate/up experts */
    HM_CHECK(load_broken(tp, "blk.1.ffn_gate_inp.scale", 2, "blk.1.attn_v.weight", &err) ==
                 HM_ERR_UNSUPPORTED && strstr(err.msg, "blk.1.attn_v.weight"));
    HM_CHECK(load_broken(tp, "blk.2.ffn_gate_exps.weight", 2, "blk.2.ffn_gate_up_exps.weight",
                         &err) == HM_ERR_FORMAT && strstr(err.msg, "blk.2.ffn_gate_up_exps") &&
             strstr(err.msg, "blk.2.ffn_up_exps.weight")); /* fused beside a separate up */
    /* another pattern: a 4-period file (layers 0-2 sliding, 3 full) loads */
    forge_preset q = *tp;
    q.swa_period = 4;
    HM_CHECK(load_broken(&q, NULL, 0, NULL, &err) == HM_OK);
}

/* ---- the forward pass on the CPU engine ---- */

#define N_PROMPT 24
#define N_CTX 64

/* the tiny preset in mix (NULL on failure) */
static hm_model *load_tiny(forge_mix mix, const char *tag) {
    char path[512];
    hm_model *m = NULL;
    hm_error err;
    if (ft_forge(preset(), mix, 42, tag, false, 2, path, sizeof(path), NULL, 0) != HM_OK ||
        hm_model_load(path, NULL, &m, &err) != HM_OK)
        return NULL;
    return m;
}

static void prompt_identity(forge_mix mix, const char *tag) {
    hm_model *m = load_tiny(mix, tag);
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    const size_t sz = sizeof(float) * N_PROMPT * (size_t)V;
    int32_t ids[N_PROMPT];
    ce_t_ids(ids, N_PROMPT, 5);
    float *a = malloc(sz), *b = malloc(sz);
    HM_REQUIRE(a && b);
    const int chunks[][2] = {{1, 2}, {5, 2}, {3, 1}, {N_PROMPT, 1}, {1, 1}}; /* ubatch, threads */
    const int bad = ce_t_prompt_identity(m, N_CTX, ids, N_PROMPT, V, chunks, 5, a, b);
    HM_CHECK_MSG(bad == 0, "%s: %d runs (a reset, call sizes, threads) give other bytes than the "
                 "prompt", tag, bad);
    /* the soft cap holds every logit inside (-30, 30) */
    float mx = 0;
    for (size_t i = 0; i < N_PROMPT * (size_t)V; i++) mx = fabsf(a[i]) > mx ? fabsf(a[i]) : mx;
    HM_CHECK_MSG(mx > 0.0f && mx < 30.0f, "%s: max |logit| %g", tag, (double)mx);
    free(a);
    free(b);
    hm_model_free(m);
}

static void test_prompt_identity(void) {
    prompt_identity(FORGE_MIX_F32, "g4-id-f32");
    prompt_identity(FORGE_MIX_Q4_K_M, "g4-id-q4km");
}

/* the reference's logits [n][V] of ids (window_off: sliding layers see every position) */
static bool reference(const hm_model *m, const int32_t *ids, int n, bool window_off, double *ref) {
    gref r;
    if (!gref_init(&r, hm_model_gguf(m), N_CTX)) return false;
    r.window_off = window_off;
    const int64_t V = hm_model_hparams(m)->n_vocab;
    for (int t = 0; t < n; t++) gref_step(&r, ids[t], ref + (size_t)t * (size_t)V);
    gref_free(&r);
    return true;
}

static void test_reference(void) {
    hm_model *m = load_tiny(FORGE_MIX_F32, "g4-ref");
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    int32_t ids[N_PROMPT];
    ce_t_ids(ids, N_PROMPT, 9);
    float *lo = malloc(sizeof(float) * N_PROMPT * (size_t)V);
    double *ref = malloc(sizeof(double) * N_PROMPT * (size_t)V);
    HM_REQUIRE(lo && ref);
    cpu_engine *e = ce_t_engine(m, N_CTX, 8, 2, 1);
    HM_REQUIRE(e && ce_t_run(e, ids, N_PROMPT, 8, lo, V));
    cpu_engine_free(e);
    HM_REQUIRE(reference(m, ids, N_PROMPT, false, ref));
    const ce_t_cmp c = ce_t_compare(lo, ref, N_PROMPT, V);
    printf("tiny-gemma4moe vs double reference: max|diff| %.3g, std %.3g, ratio %.3g, argmax "
           "diffs %d\n", c.max_diff, c.sd, c.max_diff / c.sd, c.argmax_diff);
    HM_CHECK(c.sd > 0.1);
    HM_CHECK_MSG(c.max_diff <= 1e-4 * c.sd, "max|diff| %.3g > 1e-4 x std %.3g", c.max_diff, c.sd);
    HM_CHECK(c.argmax_diff == 0);
    free(lo);
    free(ref);
    hm_model_free(m);
}

static void test_window(void) {
    hm_model *m = load_tiny(FORGE_MIX_F32, "g4-win");
    HM_REQUIRE(m);
    const hm_hparams *hp = hm_model_hparams(m);
    const int64_t V = hp->n_vocab;
    enum { NW = 40 }; /* ten windows of tiny's 4 */
    HM_REQUIRE(hp->sliding_window * 10 == NW);
    int32_t ids[NW];
    ce_t_ids(ids, NW, 13);
    float *lo = malloc(sizeof(float) * NW * (size_t)V);
    double *ref = malloc(sizeof(double) * NW * (size_t)V);
    double *all = malloc(sizeof(double) * NW * (size_t)V);
    HM_REQUIRE(lo && ref && all);
    /* ubatches of 3: the sliding layers' caches are rings of window + 2 = 6 slots */
    cpu_engine *e = ce_t_engine(m, N_CTX, 3, 2, 1);
    HM_REQUIRE(e && ce_t_run(e, ids, NW, 3, lo, V));
    HM_REQUIRE(reference(m, ids, NW, false, ref) && reference(m, ids, NW, true, all));
    const ce_t_cmp c = ce_t_compare(lo, ref, NW, V);
    /* the reference without the window, from the first position past it */
    const size_t w = (size_t)hp->sliding_window * (size_t)V;
    float *lw = malloc(sizeof(float) * NW * (size_t)V);
    HM_REQUIRE(lw);
    for (size_t i = 0; i < NW * (size_t)V; i++) lw[i] = (float)all[i];
    const ce_t_cmp n = ce_t_compare(lw + w, ref + w, NW - (int)hp->sliding_window, V);
    printf("window: max|diff| %.3g (std %.3g, argmax diffs %d); without the window the reference "
           "moves %.3g\n", c.max_diff, c.sd, c.argmax_diff, n.max_diff);
    HM_CHECK_MSG(c.max_diff <= 1e-4 * c.sd, "max|diff| %.3g > 1e-4 x std %.3g", c.max_diff, c.sd);
    HM_CHECK(c.argmax_diff == 0);
    HM_CHECK_MSG(n.max_diff > 1e-2 * c.sd, "the window changes the logits by %.3g only",
                 n.max_diff);
    /* the first window's logits do not depend on it */
    HM_CHECK(!memcmp(all, ref, sizeof(double) * w));
    /* a rewind keeps only what the rings hold: back 2 (inside the ring) yes, far back no */
    hm_error err;
    HM_CHECK(cpu_engine_seq_truncate_check(e, 0, NW - 2, &err) == HM_OK);
    HM_CHECK(cpu_engine_seq_truncate_check(e, 0, 8, &err) == HM_ERR_STATE &&
             strstr(err.msg, "sliding-window"));
    cpu_engine_free(e);
    free(lo);
    free(lw);
    free(ref);
    free(all);
    hm_model_free(m);
}

static void test_sequences(void) {
    hm_model *m = load_tiny(FORGE_MIX_F32, "g4-seq");
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    enum { NT = 10 };
    int32_t ids[2][NT];
    float *alone = malloc(sizeof(float) * 2 * NT * (size_t)V), *got = malloc(sizeof(float) * 2 * (size_t)V);
    HM_REQUIRE(alone && got);
    int bad = 0;
    cpu_engine *e = ce_t_two_sequences(m, N_CTX, NT, V, &ids[0][0], alone, got, &bad);
    HM_REQUIRE(e);
    HM_CHECK_MSG(bad == 0, "%d rows differ from their sequence alone", bad);
    cpu_engine_free(e);
    free(alone);
    free(got);
    hm_model_free(m);
}

HM_TEST_MAIN(test_forge_layout, test_hf_names, test_load, test_prompt_identity, test_reference,
             test_window, test_sequences)
