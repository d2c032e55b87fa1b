/* test_qwen35moe.c - the qwen35moe architecture (Qwen3.5-MoE: qwen3next's hybrid with separate
 * b/a projections, value heads in llama.cpp's tiled order, a multi-section rope and MTP blocks)
 * on the CPU engine, with forge's tiny-qwen35moe (2 key heads, 4 value heads, one MTP block):
 *   - the forged GGUF has llama.cpp's tensors per layer kind (ssm_beta, ssm_alpha; the MTP
 *     block's nextn tensors after the decoder layers) and keys (rope.dimension_sections,
 *     nextn_predict_layers, block_count = layers + MTP blocks);
 *   - the loader reads them (n_layer without the MTP block, the sections), names a missing or
 *     misshapen tensor (ssm_beta, ssm_alpha, the MTP block's eh_proj) and reads fused gate/up
 *     experts (ffn_gate_up_exps) as two strided views; a file without an MTP block gives the
 *     same bytes;
 *   - the shared hybrid tests (hybrid_tests.h): a prompt gives the bytes of its tokens one by
 *     one (ubatches, threads, reset), logits within 1e-4 x std of the double reference (which
 *     writes out the sectioned rope and the tiled value heads), sequences;
 *   - the value-head order matters: the reference read with qwen3next's grouped order (value
 *     head h reading key head h / r) is far from the engine's logits. */
#define HYBRID_PRESET "tiny-qwen35moe"
#define HYBRID_TAG "q35"
#include "hybrid_tests.h"

static bool has(const gguf_ctx *g, const char *name, int nd, int64_t a, int64_t b) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    return t && (int)t->n_dims == nd && t->ne[0] == a && (nd < 2 || t->ne[1] == b);
}

static int64_t key_int(const gguf_ctx *g, const char *key) {
    hm_error err;
    int64_t v = -1, i = gguf_find_key(g, key);
    if (i < 0 || gguf_kv_int(g, i, &v, &err) != HM_OK) return -1;
    return v;
}

static void test_forge_layout(void) {
    const forge_preset *p = preset();
    HM_REQUIRE(p && p->tiny && p->arch == FORGE_ARCH_QWEN35MOE);
    char path[512];
    HM_REQUIRE(ft_forge(p, FORGE_MIX_Q4_K_M, 42, "q35-layout", false, 2, path, sizeof(path), NULL,
                        0) == HM_OK);
    gguf_ctx *g = NULL;
    hm_error err;
    HM_REQUIRE(gguf_open(path, &g, &err) == HM_OK);
    const int64_t E = 64, kd = 2 * 16, vd = 4 * 16, cd = 2 * kd + vd;
    /* 3 recurrent layers of 19 tensors, 1 full-attention layer of 16, the MTP block's 16 + 4,
     * 3 global */
    HM_CHECK_MSG(gguf_tensor_count(g) == 3 + 3 * 19 + 16 + 20, "%lld tensors",
                 (long long)gguf_tensor_count(g));
    for (int il = 0; il < 5; il++) {
        char n[96];
#define HAS(suf, nd, a, b)                                                                        \
    do {                                                                                          \
        snprintf(n, sizeof(n), "blk.%d.%s", il, suf);                                             \
        HM_CHECK_MSG(has(g, n, nd, a, b), "%s missing or misshapen", n);                         \
    } while (0)
#define HASNT(suf)                                                                                \
    do {                                                                                          \
        snprintf(n, sizeof(n), "blk.%d.%s", il, suf);                                             \
        HM_CHECK_MSG(!gguf_find_tensor(g, n), "%s present", n);                                  \
    } while (0)
        HAS("attn_norm.weight", 1, E, 1);
        HAS("post_attention_norm.weight", 1, E, 1);
        HAS("ffn_gate_exps.weight", 3, E, 32);
        HAS("ffn_gate_inp_shexp.weight", 1, E, 1);
        if (il < 3) {
            HAS("attn_qkv.weight", 2, E, cd);
            HAS("attn_gate.weight", 2, E, vd);
            HAS("ssm_beta.weight", 2, E, 4);
            HAS("ssm_alpha.weight", 2, E, 4);
            HASNT("ssm_ba.weight");
            HAS("ssm_conv1d.weight", 2, 4, cd);
            HAS("ssm_a", 1, 4, 1);
            HAS("ssm_out.weight", 2, vd, E);
        } else {
            HAS("attn_q.weight", 2, E, 2 * 4 * 32);
            HAS("attn_k_norm.weight", 1, 32, 1);
            HASNT("ssm_beta.weight");
        }
        if (il == 4) {
            HAS("nextn.eh_proj.weight", 2, 2 * E, E);
            HAS("nextn.enorm.weight", 1, E, 1);
            HAS("nextn.hnorm.weight", 1, E, 1);
            HAS("nextn.shared_head_norm.weight", 1, E, 1);
        } else {
            HASNT("nextn.eh_proj.weight");
        }
#undef HAS
#undef HASNT
    }
    HM_CHECK(key_int(g, "qwen35moe.block_count") == 5);
    HM_CHECK(key_int(g, "qwen35moe.nextn_predict_layers") == 1);
    HM_CHECK(key_int(g, "qwen35moe.rope.dimension_count") == 8);
    HM_CHECK(key_int(g, "qwen35moe.ssm.time_step_rank") == 4);
    HM_CHECK(gguf_find_key(g, "qwen35moe.feed_forward_length") < 0);
    gguf_arr arr;
    HM_CHECK(gguf_get_arr(g, "qwen35moe.rope.dimension_sections", &arr, &err) == HM_OK &&
             arr.n == 4 && gguf_arr_int(&arr, 0) == 2 && gguf_arr_int(&arr, 1) == 1 &&
             gguf_arr_int(&arr, 2) == 1 && gguf_arr_int(&arr, 3) == 0);
    gguf_close(g);
    remove(path);
    /* the real preset's shapes: Qwen3.5-35B-A3B */
    const forge_preset *r = forge_preset_find("qwen3.5-35b-a3b");
    HM_REQUIRE(r && r->arch == FORGE_ARCH_QWEN35MOE && forge_preset_check(r, &err) == HM_OK);
    HM_CHECK(r->n_layer == 40 && r->n_embd == 2048 && r->n_expert == 256 && r->n_expert_used == 8 &&
             r->ssm_n_v_heads == 32 && r->ssm_n_k_heads == 16 && forge_preset_n_rot(r) == 64 &&
             r->rope_sections[0] + r->rope_sections[1] + r->rope_sections[2] == 32 &&
             r->n_vocab == 248320 && r->n_nextn == 1);
}

/* the tiny preset written with `edit` applied to its tensor list, then loaded */
static hm_status load_edited(const forge_preset *p, void (*edit)(forge_tensor_list *),
                             hm_model **out, hm_error *err) {
    forge_tensor_list l = {0};
    forge_vocab v = {0};
    hm_status st = forge_tensors_build(p, FORGE_MIX_F32, &l, err);
    if (st == HM_OK) st = forge_vocab_build(p, &v, err);
    if (st == HM_OK) edit(&l);
    char path[512];
    ft_path(path, sizeof(path), "q35-edited.gguf");
    forge_gen gen = {.seed = 42};
    ft_rows_ctx rc = {&gen, p};
    if (st == HM_OK)
        st = forge_gguf_write(path, p, FORGE_MIX_F32, &v, &l, ft_gen_rows, &rc, NULL, "t", false,
                              NULL, NULL, err);
    forge_vocab_free(&v);
    forge_tensors_free(&l);
    if (st != HM_OK) return HM_ERR_STATE; /* the writer failed: not what is tested */
    st = hm_model_load(path, NULL, out, err);
    remove(path);
    return st;
}

/* layer 1's experts as llama.cpp's --fuse-gate-up-exps writes them */
static void fuse_gate_up(forge_tensor_list *l) {
    for (int i = 0; i < l->n; i++) {
        if (!strcmp(l->t[i].name, "blk.1.ffn_gate_exps.weight")) {
            snprintf(l->t[i].name, sizeof(l->t[i].name), "blk.1.ffn_gate_up_exps.weight");
            l->t[i].ne[1] *= 2;
        } else if (!strcmp(l->t[i].name, "blk.1.ffn_up_exps.weight")) {
            l->t[i--] = l->t[--l->n];
        }
    }
}

static void test_load(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const hm_hparams *hp = hm_model_hparams(m);
    const hm_arch_desc *d = hm_model_arch(m);
    HM_CHECK(d->hybrid && d->attn_gate && d->ssm_ab_split && d->ssm_v_tiled && d->rope_sections);
    HM_CHECK(hp->n_layer == 4 && hp->n_nextn == 1 && hp->n_rot == 8 && hp->ssm_n_v_heads == 4);
    HM_CHECK(hp->rope_sections[0] == 2 && hp->rope_sections[1] == 1 && hp->rope_sections[2] == 1 &&
             hp->rope_sections[3] == 0);
    for (int il = 0; il < 4; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        HM_CHECK(L->recurrent == (il != 3));
        HM_CHECK(L->recurrent ? L->ssm_beta.data && L->ssm_alpha.data && !L->ssm_ba.data &&
                                    L->ssm_beta.ne[1] == 4
                              : L->wq.data && !L->ssm_beta.data);
    }
    HM_CHECK(!hm_model_layer(m, 4)); /* the MTP block is no decoder layer */
    hm_model_free(m);
    hm_error err;
    HM_CHECK(load_broken("blk.2.ssm_beta.weight", false, &err) == HM_ERR_NOT_FOUND &&
             strstr(err.msg, "blk.2.ssm_beta.weight"));
    HM_CHECK(load_broken("blk.0.ssm_alpha.weight", true, &err) == HM_ERR_FORMAT &&
             strstr(err.msg, "blk.0.ssm_alpha.weight") && strstr(err.msg, "expected"));
    HM_CHECK(load_broken("blk.4.nextn.hnorm.weight", false, &err) == HM_ERR_NOT_FOUND &&
             strstr(err.msg, "blk.4.nextn.hnorm.weight"));
    HM_CHECK(load_broken("blk.4.nextn.eh_proj.weight", true, &err) == HM_ERR_FORMAT &&
             strstr(err.msg, "blk.4.nextn.eh_proj.weight") && strstr(err.msg, "expected"));
    m = NULL;
    /* fused gate/up experts: two views of the fused tensor, gate rows then up rows per expert
     * (the forward pass on them: test_fused_gate_up.c) */
    HM_CHECK(load_edited(preset(), fuse_gate_up, &m, &err) == HM_OK && m);
    if (m) {
        const hm_tensor *g = &hm_model_layer(m, 1)->gate_exps, *u = &hm_model_layer(m, 1)->up_exps;
        const int64_t F = hm_model_hparams(m)->n_ff_exp;
        HM_CHECK(g->ne[1] == F && u->ne[1] == F &&
                 g->expert_stride == 2 * (size_t)F * g->row_size &&
                 u->expert_stride == g->expert_stride &&
                 (const char *)u->data == (const char *)g->data + (size_t)F * g->row_size);
        HM_CHECK(!hm_model_layer(m, 0)->gate_exps.expert_stride && hm_model_fused_gate_up(m));
    }
    hm_model_free(m);
}

static void no_edit(forge_tensor_list *l) { (void)l; }

/* The MTP block is ignored: a file without it gives the same bytes. */
static void test_nextn(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path)), *m2 = NULL;
    HM_REQUIRE(m);
    forge_preset p = *preset();
    p.n_nextn = 0;
    hm_error err;
    HM_REQUIRE(load_edited(&p, no_edit, &m2, &err) == HM_OK);
    HM_CHECK(hm_model_hparams(m2)->n_layer == 4 && hm_model_hparams(m2)->n_nextn == 0);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    int32_t ids[10];
    ce_t_ids(ids, 10, 41);
    float *a = malloc(sizeof(float) * 10 * (size_t)V), *b = malloc(sizeof(float) * 10 * (size_t)V);
    HM_REQUIRE(a && b);
    cpu_engine *e1 = ce_t_engine(m, N_CTX, 4, 2, 1), *e2 = ce_t_engine(m2, N_CTX, 4, 2, 1);
    HM_REQUIRE(e1 && e2 && ce_t_run(e1, ids, 10, 4, a, V) && ce_t_run(e2, ids, 10, 4, b, V));
    HM_CHECK_MSG(!memcmp(a, b, sizeof(float) * 10 * (size_t)V),
                 "the MTP block changed the logits");
    cpu_engine_free(e1);
    cpu_engine_free(e2);
    free(a);
    free(b);
    hm_model_free(m);
    hm_model_free(m2);
}

/* The reference with the grouped order (value head h reading key head h / r, qwen3next's) is
 * far from the engine's logits, which match the tiled one (test_reference). */
static void test_head_order(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    enum { NT = 8 };
    int32_t ids[NT];
    ce_t_ids(ids, NT, 9);
    float *lo = malloc(sizeof(float) * NT * (size_t)V);
    double *ref = malloc(sizeof(double) * (size_t)V);
    HM_REQUIRE(lo && ref);
    cpu_engine *e = ce_t_engine(m, N_CTX, NT, 2, 1);
    HM_REQUIRE(e && ce_t_run(e, ids, NT, NT, lo, V));
    qref r;
    HM_REQUIRE(qref_init(&r, hm_model_gguf(m), N_CTX));
    r.tiled = false;
    double md = 0;
    for (int t = 0; t < NT; t++) {
        qref_step(&r, ids[t], ref);
        for (int64_t j = 0; j < V; j++) {
            const double d = fabs((double)lo[(size_t)t * (size_t)V + (size_t)j] - ref[j]);
            if (d > md) md = d;
        }
    }
    qref_free(&r);
    HM_CHECK_MSG(md > 1e-2, "grouped heads within %.3g of the engine", md);
    cpu_engine_free(e);
    free(lo);
    free(ref);
    hm_model_free(m);
}

HM_TEST_MAIN(test_forge_layout, test_load, test_nextn, test_prompt_identity,
             test_reference, test_sequences, test_rewind, test_head_order)
