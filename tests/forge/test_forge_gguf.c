/* test_forge_gguf.c - forged GGUF files: every tiny preset in every type mix is written,
 * re-opened with gguf_open and has exactly the tensors llama.cpp's loader requires (names,
 * shapes and types written out here by hand from llama.cpp's load_arch_tensors, independently
 * of forge_tensors.c), the metadata keys it reads, deterministic bytes, and the Q4_K_M type
 * rules of llama-quant.cpp on the real presets. */
#include <math.h>

#include "forge_test_util.h"
#include "harness.h"
#include "quant/qtypes.h"

typedef struct {
    const char *suffix;
    int n_dims;
    int64_t ne[3];
} want;

/* llama.cpp's required per-layer tensors of a preset, written from its load_arch_tensors */
static int expected_layer(const forge_preset *p, want *w) {
    const int64_t E = p->n_embd, D = p->head_dim, Q = p->n_head * D, K = p->n_head_kv * D, X = p->n_expert;
    int n = 0;
#define W(s, nd, a, b, c) w[n++] = (want){s, nd, {a, b, c}}
    W("attn_norm.weight", 1, E, 1, 1);
    W("attn_q.weight", 2, E, Q, 1);
    W("attn_k.weight", 2, E, K, 1);
    W("attn_v.weight", 2, E, K, 1);
    W("attn_output.weight", 2, Q, E, 1);
    W("ffn_gate_inp.weight", 2, E, X, 1);
    switch (p->arch) {
    case FORGE_ARCH_QWEN3MOE:
        W("attn_q_norm.weight", 1, D, 1, 1);
        W("attn_k_norm.weight", 1, D, 1, 1);
        W("ffn_norm.weight", 1, E, 1, 1);
        W("ffn_gate_exps.weight", 3, E, p->n_ff_exp, X);
        W("ffn_up_exps.weight", 3, E, p->n_ff_exp, X);
        W("ffn_down_exps.weight", 3, p->n_ff_exp, E, X);
        break;
    case FORGE_ARCH_LLAMA:
        W("ffn_norm.weight", 1, E, 1, 1);
        W("ffn_gate_exps.weight", 3, E, p->n_ff, X);
        W("ffn_up_exps.weight", 3, E, p->n_ff, X);
        W("ffn_down_exps.weight", 3, p->n_ff, E, X);
        break;
    case FORGE_ARCH_OLMOE:
        W("attn_q_norm.weight", 1, Q, 1, 1);
        W("attn_k_norm.weight", 1, K, 1, 1);
        W("ffn_norm.weight", 1, E, 1, 1);
        W("ffn_gate_exps.weight", 3, E, p->n_ff, X);
        W("ffn_up_exps.weight", 3, E, p->n_ff, X);
        W("ffn_down_exps.weight", 3, p->n_ff, E, X);
        break;
    case FORGE_ARCH_GPTOSS:
        W("post_attention_norm.weight", 1, E, 1, 1);
        W("attn_q.bias", 1, Q, 1, 1);
        W("attn_k.bias", 1, K, 1, 1);
        W("attn_v.bias", 1, K, 1, 1);
        W("attn_output.bias", 1, E, 1, 1);
        W("attn_sinks.weight", 1, p->n_head, 1, 1);
        W("ffn_gate_inp.bias", 1, X, 1, 1);
        W("ffn_gate_exps.weight", 3, E, p->n_ff_exp, X);
        W("ffn_up_exps.weight", 3, E, p->n_ff_exp, X);
        W("ffn_down_exps.weight", 3, p->n_ff_exp, E, X);
        W("ffn_gate_exps.bias", 2, p->n_ff_exp, X, 1);
        W("ffn_up_exps.bias", 2, p->n_ff_exp, X, 1);
        W("ffn_down_exps.bias", 2, E, X, 1);
        break;
    case FORGE_ARCH_QWEN2MOE:
        W("attn_q.bias", 1, Q, 1, 1);
        W("attn_k.bias", 1, K, 1, 1);
        W("attn_v.bias", 1, K, 1, 1);
        W("ffn_norm.weight", 1, E, 1, 1);
        W("ffn_gate_exps.weight", 3, E, p->n_ff_exp, X);
        W("ffn_up_exps.weight", 3, E, p->n_ff_exp, X);
        W("ffn_down_exps.weight", 3, p->n_ff_exp, E, X);
        W("ffn_gate_inp_shexp.weight", 1, E, 1, 1);
        W("ffn_gate_shexp.weight", 2, E, p->n_ff_shexp, 1);
        W("ffn_up_shexp.weight", 2, E, p->n_ff_shexp, 1);
        W("ffn_down_shexp.weight", 2, p->n_ff_shexp, E, 1);
        break;
    default: break;
    }
#undef W
    return n;
}

static bool has_ne(const gguf_tensor *t, int nd, const int64_t *ne) {
    if ((int)t->n_dims != nd) return false;
    for (int d = 0; d < nd; d++)
        if (t->ne[d] != ne[d]) return false;
    return true;
}

static uint64_t get_u(gguf_ctx *g, const char *key) {
    uint64_t v = 0;
    hm_error err;
    if (gguf_get_uint(g, key, &v, &err) != HM_OK) {
        fprintf(stderr, "missing %s\n", key);
        return UINT64_MAX;
    }
    return v;
}

static bool str_is(gguf_ctx *g, const char *key, const char *want_s) {
    gguf_str s;
    hm_error err;
    return gguf_get_str(g, key, &s, &err) == HM_OK && s.len == strlen(want_s) && !memcmp(s.data, want_s, s.len);
}

static void check_metadata(gguf_ctx *g, const forge_preset *p, forge_mix mix) {
    const char *a = forge_arch_name(p->arch);
    char k[128];
    HM_CHECK(str_is(g, "general.architecture", a));
    HM_CHECK(str_is(g, "general.name", p->model_name));
    HM_CHECK(get_u(g, "general.quantization_version") == 2);
    HM_CHECK(get_u(g, "general.file_type") == forge_mix_file_type(mix));
#define KU(suffix, v) do { snprintf(k, sizeof(k), "%s.%s", a, suffix); HM_CHECK_MSG(get_u(g, k) == (uint64_t)(v), "%s", k); } while (0)
    KU("block_count", p->n_layer);
    KU("context_length", p->n_ctx);
    KU("embedding_length", p->n_embd);
    KU("feed_forward_length", p->n_ff);
    KU("attention.head_count", p->n_head);
    KU("attention.head_count_kv", p->n_head_kv);
    KU("attention.key_length", p->head_dim);
    KU("attention.value_length", p->head_dim);
    KU("rope.dimension_count", p->head_dim);
    KU("expert_count", p->n_expert);
    KU("expert_used_count", p->n_expert_used);
    if (p->arch != FORGE_ARCH_LLAMA && p->arch != FORGE_ARCH_OLMOE) KU("expert_feed_forward_length", p->n_ff_exp);
    if (p->arch == FORGE_ARCH_QWEN2MOE) KU("expert_shared_feed_forward_length", p->n_ff_shexp);
    if (p->arch == FORGE_ARCH_GPTOSS) {
        KU("attention.sliding_window", p->sliding_window);
        KU("rope.scaling.original_context_length", p->yarn_orig_ctx);
        snprintf(k, sizeof(k), "%s.rope.scaling.type", a);
        HM_CHECK(str_is(g, k, "yarn"));
    }
#undef KU
    double f = 0;
    hm_error err;
    snprintf(k, sizeof(k), "%s.attention.layer_norm_rms_epsilon", a);
    HM_CHECK(gguf_get_float(g, k, &f, &err) == HM_OK && fabs(f - p->rms_eps) < 1e-9);
    snprintf(k, sizeof(k), "%s.rope.freq_base", a);
    HM_CHECK(gguf_get_float(g, k, &f, &err) == HM_OK && f == (float)p->rope_base);
    const bool spm = p->arch == FORGE_ARCH_LLAMA;
    HM_CHECK(str_is(g, "tokenizer.ggml.model", spm ? "llama" : "gpt2"));
    const char *pre = p->arch == FORGE_ARCH_GPTOSS ? "gpt-4o" : p->arch == FORGE_ARCH_OLMOE ? "olmo"
                      : spm ? "default" : "qwen2";
    HM_CHECK(str_is(g, "tokenizer.ggml.pre", pre));
    gguf_arr arr;
    HM_CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &arr, &err) == HM_OK && arr.n == (uint64_t)p->n_vocab);
    HM_CHECK(gguf_get_arr(g, "tokenizer.ggml.token_type", &arr, &err) == HM_OK && arr.n == (uint64_t)p->n_vocab);
    if (spm) HM_CHECK(gguf_get_arr(g, "tokenizer.ggml.scores", &arr, &err) == HM_OK && arr.n == (uint64_t)p->n_vocab);
    else HM_CHECK(gguf_get_arr(g, "tokenizer.ggml.merges", &arr, &err) == HM_OK && arr.n > 300);
    HM_CHECK(get_u(g, "tokenizer.ggml.bos_token_id") < (uint64_t)p->n_vocab);
    HM_CHECK(get_u(g, "tokenizer.ggml.eos_token_id") < (uint64_t)p->n_vocab);
    HM_CHECK(gguf_find_key(g, "tokenizer.chat_template") >= 0);
}

static void check_types(const gguf_tensor *t, forge_mix mix) {
    const bool vec = t->n_dims == 1 || strstr(t->name, ".bias") || strstr(t->name, "ffn_gate_inp.weight");
    if (vec) { HM_CHECK_MSG(t->type == HM_TYPE_F32, "%s is %s", t->name, hm_type_name(t->type)); return; }
    switch (mix) {
    case FORGE_MIX_F32: HM_CHECK(t->type == HM_TYPE_F32); break;
    case FORGE_MIX_F16: HM_CHECK(t->type == HM_TYPE_F16); break;
    case FORGE_MIX_Q8_0: HM_CHECK(t->type == HM_TYPE_Q8_0); break;
    case FORGE_MIX_MXFP4:
        HM_CHECK_MSG(t->type == (t->n_dims == 3 ? HM_TYPE_MXFP4 : HM_TYPE_Q8_0), "%s is %s", t->name, hm_type_name(t->type));
        break;
    default: { /* q4_k_m: K-quants, or llama.cpp's fallbacks / bumps */
        uint32_t ty = t->type;
        HM_CHECK_MSG(ty == HM_TYPE_Q4_K || ty == HM_TYPE_Q5_K || ty == HM_TYPE_Q6_K || ty == HM_TYPE_Q8_0 ||
                         ty == HM_TYPE_Q5_0 || ty == HM_TYPE_Q5_1, "%s is %s", t->name, hm_type_name(ty));
        if (t->ne[0] % 256) HM_CHECK(ty != HM_TYPE_Q4_K && ty != HM_TYPE_Q5_K && ty != HM_TYPE_Q6_K);
    }
    }
}

static void test_tiny_presets_every_mix(void) {
    for (int i = 0; i < forge_preset_count(); i++) {
        const forge_preset *p = forge_preset_at(i);
        /* layers differ by kind: tests/cpu_engine/test_qwen3next.c, test_qwen35moe.c, test_gemma4.c */
        if (!p->tiny || forge_arch_own_layout(p->arch)) continue;
        for (int m = 0; m < FORGE_MIX_COUNT; m++) {
            char tag[128], path[512], hf[512];
            snprintf(tag, sizeof(tag), "tg-%s-%s", p->name, forge_mix_name((forge_mix)m));
            HM_REQUIRE(ft_forge(p, (forge_mix)m, 7, tag, false, 2, path, sizeof(path), hf, sizeof(hf)) == HM_OK);
            gguf_ctx *g = NULL;
            hm_error err;
            HM_REQUIRE(gguf_open(path, &g, &err) == HM_OK);
            want w[64];
            int nw = expected_layer(p, w);
            /* exactly: 3 global tensors + nw per layer */
            HM_CHECK_MSG(gguf_tensor_count(g) == 3 + nw * p->n_layer, "%s: %lld tensors", tag, (long long)gguf_tensor_count(g));
            int64_t emb[2] = {p->n_embd, p->n_vocab}, en[1] = {p->n_embd};
            const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
            HM_CHECK(t && has_ne(t, 2, emb));
            HM_CHECK((t = gguf_find_tensor(g, "output.weight")) && has_ne(t, 2, emb));
            HM_CHECK((t = gguf_find_tensor(g, "output_norm.weight")) && has_ne(t, 1, en));
            for (int il = 0; il < (int)p->n_layer; il++)
                for (int k = 0; k < nw; k++) {
                    char name[128];
                    snprintf(name, sizeof(name), "blk.%d.%s", il, w[k].suffix);
                    t = gguf_find_tensor(g, name);
                    HM_CHECK_MSG(t && has_ne(t, w[k].n_dims, w[k].ne), "%s: %s missing or misshapen", tag, name);
                }
            for (int64_t k = 0; k < gguf_tensor_count(g); k++) check_types(gguf_tensor_at(g, k), (forge_mix)m);
            check_metadata(g, p, (forge_mix)m);
            gguf_close(g);
            remove(path);
        }
    }
}

static uint64_t file_hash(const char *path) {
    size_t n = 0;
    uint8_t *b = ft_read_file(path, &n);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; b && i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    free(b);
    return h ^ n;
}

static void test_deterministic(void) {
    const forge_preset *p = forge_preset_find("tiny-gpt-oss");
    char a[512], b[512], c[512], hf[512];
    HM_REQUIRE(ft_forge(p, FORGE_MIX_Q4_K_M, 11, "det-a", false, 1, a, sizeof(a), hf, sizeof(hf)) == HM_OK);
    HM_REQUIRE(ft_forge(p, FORGE_MIX_Q4_K_M, 11, "det-b", false, 3, b, sizeof(b), hf, sizeof(hf)) == HM_OK);
    HM_REQUIRE(ft_forge(p, FORGE_MIX_Q4_K_M, 12, "det-c", false, 2, c, sizeof(c), hf, sizeof(hf)) == HM_OK);
    uint64_t ha = file_hash(a), hb = file_hash(b), hc = file_hash(c);
    HM_CHECK(ha == hb); /* same seed, different thread counts: same bytes */
    HM_CHECK(ha != hc); /* another seed: other bytes */
    remove(a); remove(b); remove(c);
}

static const forge_tensor *find_t(const forge_tensor_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    return NULL;
}

/* llama-quant.cpp rules, checked on the real shapes */
static void test_q4_k_m_rules(void) {
    forge_tensor_list l;
    hm_error err;
    HM_REQUIRE(forge_tensors_build(forge_preset_find("qwen3-30b-a3b"), FORGE_MIX_Q4_K_M, &l, &err) == HM_OK);
    HM_CHECK(find_t(&l, "output.weight")->type == HM_TYPE_Q6_K);
    HM_CHECK(find_t(&l, "token_embd.weight")->type == HM_TYPE_Q4_K);
    HM_CHECK(find_t(&l, "blk.0.ffn_gate_inp.weight")->type == HM_TYPE_F32);
    /* use_more_bits(i, 48): i < 6, i >= 42, (i - 6) % 3 == 2 */
    HM_CHECK(find_t(&l, "blk.5.ffn_down_exps.weight")->type == HM_TYPE_Q6_K);
    HM_CHECK(find_t(&l, "blk.6.ffn_down_exps.weight")->type == HM_TYPE_Q4_K);
    HM_CHECK(find_t(&l, "blk.8.ffn_down_exps.weight")->type == HM_TYPE_Q6_K);
    HM_CHECK(find_t(&l, "blk.8.attn_v.weight")->type == HM_TYPE_Q6_K);
    HM_CHECK(find_t(&l, "blk.9.attn_v.weight")->type == HM_TYPE_Q4_K);
    HM_CHECK(find_t(&l, "blk.47.ffn_down_exps.weight")->type == HM_TYPE_Q6_K);
    HM_CHECK(find_t(&l, "blk.9.ffn_up_exps.weight")->type == HM_TYPE_Q4_K);
    HM_CHECK(find_t(&l, "blk.9.attn_k.weight")->type == HM_TYPE_Q4_K);
    HM_CHECK(find_t(&l, "blk.9.attn_output.weight")->type == HM_TYPE_Q4_K);
    uint64_t bytes;
    forge_tensors_totals(&l, NULL, &bytes);
    /* a llama.cpp Q4_K_M file of this layout is 17.28 GiB; tensor data is all but ~3 MiB */
    HM_CHECK_MSG(fabs((double)bytes / 1073741824.0 - 17.28) < 0.01, "%.4f GiB", (double)bytes / 1073741824.0);
    forge_tensors_free(&l);

    /* n_expert == 8 (mixtral): attn_v and attn_k q8_0, attn_output q5_K */
    HM_REQUIRE(forge_tensors_build(forge_preset_find("mixtral-8x7b"), FORGE_MIX_Q4_K_M, &l, &err) == HM_OK);
    HM_CHECK(find_t(&l, "blk.9.attn_v.weight")->type == HM_TYPE_Q8_0);
    HM_CHECK(find_t(&l, "blk.9.attn_k.weight")->type == HM_TYPE_Q8_0);
    HM_CHECK(find_t(&l, "blk.9.attn_output.weight")->type == HM_TYPE_Q5_K);
    HM_CHECK(find_t(&l, "blk.9.attn_q.weight")->type == HM_TYPE_Q4_K);
    forge_tensors_free(&l);

    /* gpt-oss rows of 2880 are not multiples of 256: q4_K -> q5_0, q6_K -> q8_0 */
    HM_REQUIRE(forge_tensors_build(forge_preset_find("gpt-oss-20b"), FORGE_MIX_Q4_K_M, &l, &err) == HM_OK);
    HM_CHECK(find_t(&l, "blk.1.ffn_gate_exps.weight")->type == HM_TYPE_Q5_0);
    HM_CHECK(find_t(&l, "blk.0.ffn_down_exps.weight")->type == HM_TYPE_Q8_0);
    HM_CHECK(find_t(&l, "output.weight")->type == HM_TYPE_Q8_0);
    HM_CHECK(find_t(&l, "blk.0.attn_sinks.weight")->type == HM_TYPE_F32);
    forge_tensors_free(&l);

    HM_REQUIRE(forge_tensors_build(forge_preset_find("gpt-oss-20b"), FORGE_MIX_MXFP4, &l, &err) == HM_OK);
    HM_CHECK(find_t(&l, "blk.1.ffn_gate_exps.weight")->type == HM_TYPE_MXFP4);
    HM_CHECK(find_t(&l, "blk.1.attn_q.weight")->type == HM_TYPE_Q8_0);
    HM_CHECK(find_t(&l, "blk.1.ffn_gate_exps.bias")->type == HM_TYPE_F32);
    forge_tensors_free(&l);
}

static void test_bad_presets(void) {
    forge_preset p = *forge_preset_find("tiny-qwen3moe");
    hm_error err;
    p.n_expert_used = p.n_expert + 1;
    HM_CHECK(forge_preset_check(&p, &err) == HM_ERR_ARG && strstr(err.msg, "n_expert_used"));
    p = *forge_preset_find("tiny-gpt-oss");
    p.head_dim = 32;
    HM_CHECK(forge_preset_check(&p, &err) == HM_ERR_ARG);
    forge_job job = {.preset = forge_preset_find("tiny-olmoe"), .mix = FORGE_MIX_F16,
                     .out_path = "/nonexistent-dir/x.gguf", .n_threads = 1};
    forge_result res;
    HM_CHECK(forge_write_gguf(&job, &res, &err) == HM_ERR_IO);
}

/* direct mode (random blocks): every quantised tensor dequantises to mean ~0 and the tensor's
 * std (1/sqrt(fan_in) for matrices), for each block type the mixes use */
static void test_direct_blocks(void) {
    static const forge_mix mixes[3] = {FORGE_MIX_Q4_K_M, FORGE_MIX_MXFP4, FORGE_MIX_Q8_0};
    const forge_preset *p = forge_preset_find("tiny-qwen3moe");
    for (int m = 0; m < 3; m++) {
        char path[512];
        ft_path(path, sizeof(path), "direct.gguf");
        forge_job job = {.preset = p, .mix = mixes[m], .out_path = path, .n_threads = 2};
        job.gen.seed = 1;
        job.gen.direct = true;
        forge_result res;
        hm_error err;
        HM_REQUIRE(forge_write_gguf(&job, &res, &err) == HM_OK);
        gguf_ctx *g;
        HM_REQUIRE(gguf_open(path, &g, &err) == HM_OK);
        for (int64_t k = 0; k < gguf_tensor_count(g); k++) {
            const gguf_tensor *t = gguf_tensor_at(g, k);
            if (t->type == HM_TYPE_F32 || t->type == HM_TYPE_F16 || t->n_dims < 2 || !strcmp(t->name, "token_embd.weight")) continue;
            int64_t rows = t->ne[1] * t->ne[2], n = rows * t->ne[0];
            float *d = malloc((size_t)n * sizeof(float));
            HM_REQUIRE(d && ft_deq(t, 0, rows, d) == 0);
            double s = 0, ss = 0;
            for (int64_t i = 0; i < n; i++) { s += d[i]; ss += (double)d[i] * d[i]; }
            double mean = s / (double)n, sd = sqrt(ss / (double)n - mean * mean), want_sd = 1.0 / sqrt((double)t->ne[0]);
            HM_CHECK_MSG(fabs(sd / want_sd - 1) < 0.2 && fabs(mean) < 0.1 * want_sd, "%s %s: mean %g std %g want %g",
                         t->name, hm_type_name(t->type), mean, sd, want_sd);
            free(d);
        }
        gguf_close(g);
        remove(path);
    }
}

HM_TEST_MAIN(test_tiny_presets_every_mix, test_deterministic, test_q4_k_m_rules, test_bad_presets,
             test_direct_blocks)
