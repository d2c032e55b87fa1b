/* test_forge_hf.c - the HF copy: model.safetensors parses (8-byte header length, F32 entries
 * with contiguous data_offsets) and its values equal quant_dequantize_row of the GGUF tensors,
 * through the layout changes written out here independently: llama's Q/K rope permutation
 * (convert_hf_to_gguf's permute, inverted), per-expert slices, gpt-oss's fused gate_up_proj with
 * interleaved columns and transposed down_proj; config.json and tokenizer files are present and
 * name the right classes. */
#include "forge_test_util.h"
#include "harness.h"

typedef struct {
    ft_st st;
    gguf_ctx *g;
    const forge_preset *p;
    char dir[512];
} hf_case;

static bool open_case(hf_case *c, const char *preset, forge_mix mix) {
    memset(c, 0, sizeof(*c));
    c->p = forge_preset_find(preset);
    char tag[128], path[512], f[600];
    snprintf(tag, sizeof(tag), "hf-%s-%s", preset, forge_mix_name(mix));
    if (ft_forge(c->p, mix, 5, tag, true, 2, path, sizeof(path), c->dir, sizeof(c->dir)) != HM_OK) return false;
    hm_error err;
    if (gguf_open(path, &c->g, &err) != HM_OK) return false;
    snprintf(f, sizeof(f), "%s/model.safetensors", c->dir);
    return ft_st_open(&c->st, f);
}

static void close_case(hf_case *c) {
    static const char *const files[] = {"model.safetensors", "config.json", "generation_config.json",
                                        "tokenizer.json", "tokenizer_config.json"};
    gguf_close(c->g);
    ft_st_close(&c->st);
    char f[700];
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(f, sizeof(f), "%s/%s", c->dir, files[i]);
        remove(f);
    }
    remove(c->dir);
    size_t n = strlen(c->dir);
    snprintf(f, sizeof(f), "%.*s.gguf", (int)(n - 3), c->dir); /* "<tag>-hf" -> "<tag>.gguf" */
    remove(f);
}

/* whole GGUF tensor, dequantised */
static float *deq_all(gguf_ctx *g, const char *name, const gguf_tensor **out) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) return NULL;
    int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    float *d = malloc((size_t)(rows * t->ne[0]) * sizeof(float));
    if (d && ft_deq(t, 0, rows, d) != 0) { free(d); d = NULL; }
    *out = t;
    return d;
}

/* HF tensor hf equals GGUF tensor gname element for element (same order) */
static void expect_copy(hf_case *c, const char *hf, const char *gname) {
    int nd;
    int64_t sh[4], n;
    const float *h = ft_st_get(&c->st, hf, &nd, sh, &n);
    const gguf_tensor *t;
    float *d = deq_all(c->g, gname, &t);
    HM_CHECK_MSG(h && d, "%s / %s", hf, gname);
    if (h && d) {
        int64_t ne = t->ne[0] * t->ne[1] * t->ne[2];
        HM_CHECK_MSG(n == ne, "%s: %lld vs %lld elements", hf, (long long)n, (long long)ne);
        HM_CHECK_MSG(n == ne && !memcmp(h, d, (size_t)n * 4), "%s differs from %s", hf, gname);
    }
    free(d);
}

static void test_qwen3moe(void) {
    hf_case c;
    HM_REQUIRE(open_case(&c, "tiny-qwen3moe", FORGE_MIX_Q4_K_M));
    const forge_preset *p = c.p;
    expect_copy(&c, "model.embed_tokens.weight", "token_embd.weight");
    expect_copy(&c, "lm_head.weight", "output.weight");
    expect_copy(&c, "model.norm.weight", "output_norm.weight");
    expect_copy(&c, "model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight");
    expect_copy(&c, "model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight");
    expect_copy(&c, "model.layers.1.post_attention_layernorm.weight", "blk.1.ffn_norm.weight");
    expect_copy(&c, "model.layers.2.mlp.gate.weight", "blk.2.ffn_gate_inp.weight");
    /* expert e of a 3-D tensor is rows [e*ne1, (e+1)*ne1) */
    const gguf_tensor *t;
    float *d = deq_all(c.g, "blk.2.ffn_down_exps.weight", &t);
    HM_REQUIRE(d);
    for (int64_t e = 0; e < p->n_expert; e += 5) {
        char name[128];
        int nd;
        int64_t sh[4], n;
        snprintf(name, sizeof(name), "model.layers.2.mlp.experts.%lld.down_proj.weight", (long long)e);
        const float *h = ft_st_get(&c.st, name, &nd, sh, &n);
        HM_CHECK(h && nd == 2 && sh[0] == p->n_embd && sh[1] == p->n_ff_exp);
        HM_CHECK(h && !memcmp(h, d + e * p->n_embd * p->n_ff_exp, (size_t)n * 4));
    }
    free(d);
    /* 3 global tensors; per layer 2 norms, q k v o, q/k norms, router, 3 per expert */
    int expect = 3 + (int)p->n_layer * (9 + 3 * (int)p->n_expert);
    int count = 0;
    for (const char *s = c.st.header; (s = strstr(s, "\"data_offsets\"")); s++) count++;
    HM_CHECK_MSG(count == expect, "%d tensors, want %d", count, expect);
    char f[600];
    snprintf(f, sizeof(f), "%s/config.json", c.dir);
    size_t n;
    char *cfg = (char *)ft_read_file(f, &n);
    HM_CHECK(cfg && strstr(cfg, "\"Qwen3MoeForCausalLM\"") && strstr(cfg, "\"moe_intermediate_size\": 128") &&
             strstr(cfg, "\"num_experts\": 16") && strstr(cfg, "\"norm_topk_prob\": true"));
    free(cfg);
    snprintf(f, sizeof(f), "%s/tokenizer.json", c.dir);
    char *tok = (char *)ft_read_file(f, &n);
    HM_CHECK(tok && strstr(tok, "\"type\": \"BPE\"") && strstr(tok, "\"<|im_start|>\"") && strstr(tok, "\"Split\""));
    free(tok);
    snprintf(f, sizeof(f), "%s/tokenizer_config.json", c.dir);
    tok = (char *)ft_read_file(f, &n);
    HM_CHECK(tok && strstr(tok, "im_start") && strstr(tok, "\"eos_token\": \"<|im_end|>\""));
    free(tok);
    close_case(&c);
}

static void test_mixtral_unpermute(void) {
    hf_case c;
    HM_REQUIRE(open_case(&c, "tiny-mixtral", FORGE_MIX_Q8_0));
    const forge_preset *p = c.p;
    const int64_t D = p->head_dim, E = p->n_embd;
    static const char *const which[2] = {"q_proj", "k_proj"};
    static const char *const gg[2] = {"attn_q.weight", "attn_k.weight"};
    for (int w = 0; w < 2; w++) {
        char hn[128], gn[128];
        snprintf(hn, sizeof(hn), "model.layers.1.self_attn.%s.weight", which[w]);
        snprintf(gn, sizeof(gn), "blk.1.%s", gg[w]);
        int nd;
        int64_t sh[4], n;
        const float *h = ft_st_get(&c.st, hn, &nd, sh, &n);
        const gguf_tensor *t;
        float *d = deq_all(c.g, gn, &t);
        HM_REQUIRE(h && d);
        const int64_t heads = t->ne[1] / D;
        HM_CHECK(heads == (w ? p->n_head_kv : p->n_head));
        /* convert_hf_to_gguf: gguf = hf.reshape(H, 2, D/2, E).swapaxes(1, 2) */
        int bad = 0;
        for (int64_t hh = 0; hh < heads; hh++)
            for (int64_t j = 0; j < 2; j++)
                for (int64_t i = 0; i < D / 2; i++)
                    bad += memcmp(h + (hh * D + j * (D / 2) + i) * E, d + (hh * D + 2 * i + j) * E, (size_t)E * 4) != 0;
        HM_CHECK_MSG(bad == 0, "%s: %d rows misplaced", hn, bad);
        free(d);
    }
    expect_copy(&c, "model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight");
    expect_copy(&c, "model.layers.0.block_sparse_moe.gate.weight", "blk.0.ffn_gate_inp.weight");
    int nd;
    int64_t sh[4], n;
    const gguf_tensor *t;
    float *d = deq_all(c.g, "blk.1.ffn_up_exps.weight", &t);
    const float *h = ft_st_get(&c.st, "model.layers.1.block_sparse_moe.experts.7.w3.weight", &nd, sh, &n);
    HM_CHECK(h && d && !memcmp(h, d + 7 * p->n_ff * E, (size_t)n * 4));
    free(d);
    char f[600];
    size_t fn;
    snprintf(f, sizeof(f), "%s/tokenizer.json", c.dir);
    char *tok = (char *)ft_read_file(f, &fn);
    HM_CHECK(tok && strstr(tok, "\"byte_fallback\": true") && strstr(tok, "\"<0x0A>\"") && strstr(tok, "TemplateProcessing"));
    free(tok);
    snprintf(f, sizeof(f), "%s/config.json", c.dir);
    tok = (char *)ft_read_file(f, &fn);
    HM_CHECK(tok && strstr(tok, "MixtralForCausalLM") && strstr(tok, "\"num_local_experts\": 8"));
    free(tok);
    close_case(&c);
}

static void test_gpt_oss_fused(void) {
    hf_case c;
    HM_REQUIRE(open_case(&c, "tiny-gpt-oss", FORGE_MIX_MXFP4));
    const forge_preset *p = c.p;
    const int64_t E = p->n_embd, F = p->n_ff_exp, X = p->n_expert;
    int nd;
    int64_t sh[4], n;
    const gguf_tensor *tg, *tu, *td;
    float *g = deq_all(c.g, "blk.1.ffn_gate_exps.weight", &tg), *u = deq_all(c.g, "blk.1.ffn_up_exps.weight", &tu);
    float *dn = deq_all(c.g, "blk.1.ffn_down_exps.weight", &td);
    const float *gu = ft_st_get(&c.st, "model.layers.1.mlp.experts.gate_up_proj", &nd, sh, &n);
    HM_REQUIRE(g && u && dn && gu);
    HM_CHECK(nd == 3 && sh[0] == X && sh[1] == E && sh[2] == 2 * F);
    int bad = 0;
    for (int64_t e = 0; e < X; e++)
        for (int64_t f = 0; f < F; f++)
            for (int64_t cc = 0; cc < E; cc++) {
                bad += gu[(e * E + cc) * 2 * F + 2 * f] != g[(e * F + f) * E + cc];
                bad += gu[(e * E + cc) * 2 * F + 2 * f + 1] != u[(e * F + f) * E + cc];
            }
    HM_CHECK_MSG(bad == 0, "gate_up_proj: %d elements differ", bad);
    const float *down = ft_st_get(&c.st, "model.layers.1.mlp.experts.down_proj", &nd, sh, &n);
    HM_REQUIRE(down);
    HM_CHECK(nd == 3 && sh[0] == X && sh[1] == F && sh[2] == E);
    bad = 0;
    for (int64_t e = 0; e < X; e++)
        for (int64_t f = 0; f < F; f++)
            for (int64_t cc = 0; cc < E; cc++) bad += down[(e * F + f) * E + cc] != dn[(e * E + cc) * F + f];
    HM_CHECK_MSG(bad == 0, "down_proj: %d elements differ", bad);
    free(g); free(u); free(dn);
    g = deq_all(c.g, "blk.0.ffn_gate_exps.bias", &tg);
    u = deq_all(c.g, "blk.0.ffn_up_exps.bias", &tu);
    const float *gub = ft_st_get(&c.st, "model.layers.0.mlp.experts.gate_up_proj_bias", &nd, sh, &n);
    HM_REQUIRE(g && u && gub);
    bad = 0;
    for (int64_t e = 0; e < X; e++)
        for (int64_t f = 0; f < F; f++) bad += gub[e * 2 * F + 2 * f] != g[e * F + f] || gub[e * 2 * F + 2 * f + 1] != u[e * F + f];
    HM_CHECK(bad == 0);
    free(g); free(u);
    expect_copy(&c, "model.layers.0.mlp.experts.down_proj_bias", "blk.0.ffn_down_exps.bias");
    expect_copy(&c, "model.layers.0.self_attn.sinks", "blk.0.attn_sinks.weight");
    expect_copy(&c, "model.layers.0.mlp.router.weight", "blk.0.ffn_gate_inp.weight");
    expect_copy(&c, "model.layers.0.mlp.router.bias", "blk.0.ffn_gate_inp.bias");
    expect_copy(&c, "model.layers.0.self_attn.o_proj.bias", "blk.0.attn_output.bias");
    expect_copy(&c, "model.layers.3.post_attention_layernorm.weight", "blk.3.post_attention_norm.weight");
    expect_copy(&c, "model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight");
    char f[600];
    size_t fn;
    snprintf(f, sizeof(f), "%s/config.json", c.dir);
    char *cfg = (char *)ft_read_file(f, &fn);
    const char *lt = cfg ? strstr(cfg, "\"layer_types\": [") : NULL; /* sliding, full, ... */
    const char *sl = lt ? strstr(lt, "\"sliding_attention\"") : NULL;
    HM_CHECK(cfg && strstr(cfg, "GptOssForCausalLM") && strstr(cfg, "\"rope_type\": \"yarn\"") && sl &&
             strstr(sl, "\"full_attention\"") && strstr(cfg, "\"num_local_experts\": 8"));
    free(cfg);
    close_case(&c);
}

static void test_olmoe_qwen2moe(void) {
    hf_case c;
    HM_REQUIRE(open_case(&c, "tiny-olmoe", FORGE_MIX_F16));
    expect_copy(&c, "model.layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight");
    expect_copy(&c, "model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight");
    expect_copy(&c, "model.layers.1.mlp.gate.weight", "blk.1.ffn_gate_inp.weight");
    close_case(&c);
    HM_REQUIRE(open_case(&c, "tiny-qwen2moe", FORGE_MIX_Q4_K_M));
    expect_copy(&c, "model.layers.1.mlp.shared_expert_gate.weight", "blk.1.ffn_gate_inp_shexp.weight");
    expect_copy(&c, "model.layers.1.mlp.shared_expert.down_proj.weight", "blk.1.ffn_down_shexp.weight");
    expect_copy(&c, "model.layers.1.self_attn.q_proj.bias", "blk.1.attn_q.bias");
    int nd;
    int64_t sh[4], n;
    HM_CHECK(ft_st_get(&c.st, "model.layers.1.mlp.shared_expert_gate.weight", &nd, sh, &n) && nd == 2 && sh[0] == 1);
    HM_CHECK(!ft_st_get(&c.st, "model.layers.1.self_attn.o_proj.bias", &nd, sh, &n));
    close_case(&c);
}

HM_TEST_MAIN(test_qwen3moe, test_mixtral_unpermute, test_gpt_oss_fused, test_olmoe_qwen2moe)
