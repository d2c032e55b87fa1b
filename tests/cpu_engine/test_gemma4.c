/* test_gemma4.c - the gemma4 architecture (Gemma 4's MoE model) as far as it is built: forge's
 * presets and GGUF layout, the HF twin's names, the loader and its errors, and the engines'
 * refusal (the forward pass is not built yet: docs/GEMMA4.md):
 *   - tiny-gemma4moe's file has llama.cpp's tensors per layer kind (a sliding layer's attn_v,
 *     a full layer's global head size and one kv head, no attn_v), the dense MLP and its norms,
 *     the router's scale, per-expert scales, layer_output_scale, rope_freqs (1 on the rotated
 *     pairs, 1e30 on the others), no output.weight (tied), and the per-layer arrays;
 *   - the real preset's counts (Gemma-4-26B-A4B: 25.23B parameters);
 *   - the loader reads the layer kinds, the sizes per kind, the tied output, and names a
 *     missing or misshapen tensor; a full layer with its own attn_v, fused gate/up experts,
 *     shared KV layers and kv heads differing within a kind are refused;
 *   - the CPU engine and a GPU placement are refused with the reason. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cpu_engine/cpu_engine.h"
#include "harness.h"
#include "model/model.h"
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

typedef struct {
    const forge_gen *g;
    const forge_preset *p;
} rows_ctx;

static hm_status gen_rows(void *ctx, const forge_tensor *t, int64_t r0, int64_t nr, void *dst,
                          float *scratch) {
    const rows_ctx *c = ctx;
    return forge_gen_rows(c->g, c->p, t, r0, nr, dst, scratch);
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
    char path[512];
    ft_path(path, sizeof(path), "g4-broken.gguf");
    forge_gen gen = {.seed = 1};
    rows_ctx rc = {&gen, p};
    if (st == HM_OK)
        st = forge_gguf_write(path, p, FORGE_MIX_F32, &v, &l, gen_rows, &rc, NULL, "t", false,
                              NULL, NULL, err);
    forge_vocab_free(&v);
    forge_tensors_free(&l);
    if (st != HM_OK) return HM_ERR_STATE; /* the writer failed: not what is tested */
    hm_model *m = NULL;
    st = hm_model_load(path, NULL, &m, err);
    hm_model_free(m);
    remove(path);
    return st;
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
    /* the engines refuse it with the reason */
    cpu_engine_params cp = {.n_ctx = 32, .n_ubatch = 4, .n_threads = 1, .type_k = HM_TYPE_F32,
                            .type_v = HM_TYPE_F32, .n_seq = 1};
    cpu_engine *e = NULL;
    HM_CHECK(cpu_engine_init(m, &cp, &e, &err) == HM_ERR_UNSUPPORTED && !e &&
             strstr(err.msg, "gemma4") && strstr(err.msg, "not built"));
    hm_context_params p = hm_context_default_params();
    p.n_ctx = 32;
    p.n_threads = 1;
    p.n_gpu_layers = 99;
    hm_context *c = NULL;
    HM_CHECK(hm_context_init(m, &p, &c, &err) == HM_ERR_UNSUPPORTED && !c &&
             strstr(err.msg, "gemma4") && strstr(err.msg, "-ngl 0"));
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
                         &err) == HM_ERR_UNSUPPORTED && strstr(err.msg, "ffn_gate_up_exps"));
    /* another pattern: a 4-period file (layers 0-2 sliding, 3 full) loads */
    forge_preset q = *tp;
    q.swa_period = 4;
    HM_CHECK(load_broken(&q, NULL, 0, NULL, &err) == HM_OK);
}

HM_TEST_MAIN(test_forge_layout, test_hf_names, test_load)
