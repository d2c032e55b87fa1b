/* test_qwen3next.c - the qwen3next architecture (Qwen3-Next: gated delta-net layers and a gated
 * full-attention layer every 4th) on the CPU engine, with forge's tiny-qwen3next:
 *   - the forged GGUF has llama.cpp's tensors per layer kind (names, shapes, types) and keys;
 *   - the loader reads them (hyper-parameters, layer kinds) and names a missing or misshapen
 *     tensor; an older file's fused ssm_in gives the bytes of attn_qkv + attn_gate;
 *   - a prompt gives the same bytes as its tokens one by one, as ubatches of 5, with 1 or 2
 *     threads and again after a reset;
 *   - the logits match a double-precision reference written from the model's definition
 *     (qwen3next_ref.h) within 1e-4 x their standard deviation;
 *   - two sequences interleaved in one engine give each sequence's bytes alone; a rewind of a
 *     recurrent state is refused, a reset sequence starts again (GPU placements:
 *     tests/runtime/test_context_archs_gpu.c). */
#define HYBRID_PRESET "tiny-qwen3next"
#define HYBRID_TAG "q3n"
#include "hybrid_tests.h"

static bool has(const gguf_ctx *g, const char *name, int nd, int64_t a, int64_t b, uint32_t *type) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t || (int)t->n_dims != nd || t->ne[0] != a || (nd > 1 && t->ne[1] != b)) return false;
    if (type) *type = t->type;
    return true;
}

static void test_forge_layout(void) {
    const forge_preset *p = preset();
    HM_REQUIRE(p && p->tiny && p->arch == FORGE_ARCH_QWEN3NEXT);
    const forge_mix mixes[] = {FORGE_MIX_F32, FORGE_MIX_Q4_K_M};
    for (int mi = 0; mi < 2; mi++) {
        char path[512], tag[64];
        snprintf(tag, sizeof(tag), "q3n-layout-%s", forge_mix_name(mixes[mi]));
        HM_REQUIRE(ft_forge(p, mixes[mi], 42, tag, false, 2, path, sizeof(path), NULL, 0) == HM_OK);
        gguf_ctx *g = NULL;
        hm_error err;
        HM_REQUIRE(gguf_open(path, &g, &err) == HM_OK);
        const int64_t E = 64, kd = 2 * 16, vd = 4 * 16, cd = 2 * kd + vd;
        /* 3 recurrent layers of 18 tensors, 1 full-attention layer of 16, 3 global */
        HM_CHECK_MSG(gguf_tensor_count(g) == 3 + 3 * 18 + 16, "%lld tensors",
                     (long long)gguf_tensor_count(g));
        for (int il = 0; il < 4; il++) {
            char n[96];
            uint32_t ty = 0;
#define HAS(suf, nd, a, b)                                                                        \
    do {                                                                                          \
        snprintf(n, sizeof(n), "blk.%d.%s", il, suf);                                             \
        HM_CHECK_MSG(has(g, n, nd, a, b, &ty), "%s missing or misshapen", n);                    \
    } while (0)
            HAS("attn_norm.weight", 1, E, 1);
            HAS("post_attention_norm.weight", 1, E, 1);
            HAS("ffn_gate_inp_shexp.weight", 1, E, 1);
            HAS("ffn_gate_shexp.weight", 2, E, 64);
            if (il < 3) {
                HAS("attn_qkv.weight", 2, E, cd);
                if (mixes[mi] == FORGE_MIX_F32) HM_CHECK(ty == HM_TYPE_F32);
                HAS("attn_gate.weight", 2, E, vd);
                HAS("ssm_ba.weight", 2, E, 8);
                HAS("ssm_conv1d.weight", 2, 4, cd);
                HM_CHECK_MSG(ty == HM_TYPE_F32, "ssm_conv1d is %s", hm_type_name(ty));
                HAS("ssm_dt.bias", 1, 4, 1);
                HAS("ssm_a", 1, 4, 1);
                HAS("ssm_norm.weight", 1, 16, 1);
                HAS("ssm_out.weight", 2, vd, E);
                snprintf(n, sizeof(n), "blk.%d.attn_q.weight", il);
                HM_CHECK(!gguf_find_tensor(g, n));
            } else {
                HAS("attn_q.weight", 2, E, 2 * 4 * 32); /* query and gate per head */
                HAS("attn_k.weight", 2, E, 2 * 32);
                HAS("attn_output.weight", 2, 4 * 32, E);
                HAS("attn_q_norm.weight", 1, 32, 1);
                snprintf(n, sizeof(n), "blk.%d.ssm_a", il);
                HM_CHECK(!gguf_find_tensor(g, n));
            }
#undef HAS
        }
        const char *keys[] = {"qwen3next.ssm.conv_kernel", "qwen3next.ssm.state_size",
                              "qwen3next.ssm.group_count", "qwen3next.ssm.time_step_rank",
                              "qwen3next.ssm.inner_size", "qwen3next.rope.dimension_count",
                              "qwen3next.full_attention_interval"};
        const int64_t want[] = {4, 16, 2, 4, 64, 8, 4};
        for (int k = 0; k < 7; k++) {
            int64_t v = -1, i = gguf_find_key(g, keys[k]);
            HM_CHECK_MSG(i >= 0 && gguf_kv_int(g, i, &v, &err) == HM_OK && v == want[k],
                         "%s = %lld", keys[k], (long long)v);
        }
        gguf_close(g);
        remove(path);
    }
}

static void test_load(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const hm_hparams *hp = hm_model_hparams(m);
    HM_CHECK(hm_model_arch(m)->hybrid && hm_model_arch(m)->attn_gate);
    HM_CHECK(hp->ssm_conv_kernel == 4 && hp->ssm_head_k == 16 && hp->ssm_head_v == 16 &&
             hp->ssm_n_k_heads == 2 && hp->ssm_n_v_heads == 4 && hp->full_attn_interval == 4);
    HM_CHECK(hp->n_rot == 8 && hp->head_dim_k == 32 && hp->n_ff_shexp == 64);
    for (int il = 0; il < 4; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        HM_CHECK(L->recurrent == (il != 3));
        HM_CHECK(L->recurrent ? L->ssm_qkv.data && L->ssm_out.data && !L->wq.data
                              : L->wq.data && L->wq.ne[1] == 256 && !L->ssm_qkv.data);
        HM_CHECK(L->ffn_norm.data && L->sh_gate_inp.data);
    }
    hm_model_free(m);
    hm_error err;
    HM_CHECK(load_broken("blk.1.ssm_ba.weight", false, &err) == HM_ERR_NOT_FOUND &&
             strstr(err.msg, "blk.1.ssm_ba.weight"));
    HM_CHECK(load_broken("blk.0.attn_qkv.weight", false, &err) == HM_ERR_NOT_FOUND &&
             strstr(err.msg, "attn_qkv") && strstr(err.msg, "ssm_in"));
    HM_CHECK(load_broken("blk.2.ssm_out.weight", true, &err) == HM_ERR_FORMAT &&
             strstr(err.msg, "blk.2.ssm_out.weight") && strstr(err.msg, "expected"));
    HM_CHECK(load_broken("blk.3.attn_q.weight", true, &err) == HM_ERR_FORMAT &&
             strstr(err.msg, "blk.3.attn_q.weight"));
}

/* tiny-qwen3next as an older file: each recurrent layer's attn_qkv and attn_gate fused into
 * ssm_in, rows per key head [q, k, v (r heads), z (r heads)] (the forged values regrouped) */
typedef struct {
    ft_rows_ctx rc;
    const forge_tensor_list *orig;
} legacy_ctx;

static hm_status legacy_rows(void *ctx, const forge_tensor *t, int64_t r0, int64_t nr, void *dst,
                             float *scratch) {
    const legacy_ctx *c = ctx;
    if (!strstr(t->name, "ssm_in")) return ft_gen_rows((void *)&c->rc, t, r0, nr, dst, scratch);
    char qn[64], gn[64];
    snprintf(qn, sizeof(qn), "blk.%d.attn_qkv.weight", t->layer);
    snprintf(gn, sizeof(gn), "blk.%d.attn_gate.weight", t->layer);
    const forge_tensor *q = NULL, *g = NULL;
    for (int i = 0; i < c->orig->n; i++) {
        if (!strcmp(c->orig->t[i].name, qn)) q = &c->orig->t[i];
        if (!strcmp(c->orig->t[i].name, gn)) g = &c->orig->t[i];
    }
    if (!q || !g) return HM_ERR_STATE;
    const int64_t dk = 16, rdv = 2 * 16, kd = 2 * dk, w = 2 * dk + 2 * rdv, E = t->ne[0];
    for (int64_t r = r0; r < r0 + nr; r++) {
        const int64_t grp = r / w, o = r % w;
        const forge_tensor *src = o < 2 * dk + rdv ? q : g;
        const int64_t sr = o < dk             ? grp * dk + o
                           : o < 2 * dk       ? kd + grp * dk + (o - dk)
                           : o < 2 * dk + rdv ? 2 * kd + grp * rdv + (o - 2 * dk)
                                              : grp * rdv + (o - 2 * dk - rdv);
        hm_status st = ft_gen_rows((void *)&c->rc, src, sr, 1, (float *)dst + (r - r0) * E, scratch);
        if (st != HM_OK) return st;
    }
    return HM_OK;
}

static void test_legacy_ssm_in(void) {
    const forge_preset *p = preset();
    forge_tensor_list l = {0}, orig = {0};
    forge_vocab v = {0};
    hm_error err;
    HM_REQUIRE(forge_tensors_build(p, FORGE_MIX_F32, &l, &err) == HM_OK);
    HM_REQUIRE(forge_tensors_build(p, FORGE_MIX_F32, &orig, &err) == HM_OK);
    HM_REQUIRE(forge_vocab_build(p, &v, &err) == HM_OK);
    for (int i = 0; i < l.n; i++) {
        if (strstr(l.t[i].name, "attn_qkv")) {
            snprintf(l.t[i].name, sizeof(l.t[i].name), "blk.%d.ssm_in.weight", l.t[i].layer);
            l.t[i].ne[1] += 64; /* + vd: z */
        } else if (strstr(l.t[i].name, "attn_gate")) {
            l.t[i--] = l.t[--l.n];
        }
    }
    char path[512], ref_path[512];
    ft_path(path, sizeof(path), "q3n-legacy.gguf");
    forge_gen gen = {.seed = 42};
    legacy_ctx lc = {{&gen, p}, &orig};
    HM_REQUIRE(forge_gguf_write(path, p, FORGE_MIX_F32, &v, &l, legacy_rows, &lc, NULL, "t",
                                false, NULL, NULL, &err) == HM_OK);
    hm_model *m = NULL, *ref = load_tiny(ref_path, sizeof(ref_path));
    HM_REQUIRE(ref);
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    HM_CHECK(hm_model_layer(m, 0)->ssm_in.data && !hm_model_layer(m, 0)->ssm_qkv.data);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    int32_t ids[12];
    ce_t_ids(ids, 12, 31);
    float *a = malloc(sizeof(float) * 12 * (size_t)V), *b = malloc(sizeof(float) * 12 * (size_t)V);
    HM_REQUIRE(a && b);
    cpu_engine *e1 = ce_t_engine(m, N_CTX, 4, 2, 1), *e2 = ce_t_engine(ref, N_CTX, 4, 2, 1);
    HM_REQUIRE(e1 && e2 && ce_t_run(e1, ids, 12, 4, a, V) && ce_t_run(e2, ids, 12, 4, b, V));
    HM_CHECK_MSG(!memcmp(a, b, sizeof(float) * 12 * (size_t)V),
                 "the fused ssm_in gives other logits than attn_qkv + attn_gate");
    cpu_engine_free(e1);
    cpu_engine_free(e2);
    free(a);
    free(b);
    hm_model_free(m);
    hm_model_free(ref);
    forge_vocab_free(&v);
    forge_tensors_free(&l);
    forge_tensors_free(&orig);
    remove(path);
}

HM_TEST_MAIN(test_forge_layout, test_load, test_prompt_identity, test_reference, test_sequences, test_rewind,
             test_legacy_ssm_in)
