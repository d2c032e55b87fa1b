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
 *     recurrent state is refused, a reset sequence starts again;
 *   - a context asked for the GPU refuses the model with the reason. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cpu_engine/cpu_engine.h"
#include "harness.h"
#include "model/model.h"
#include "qwen3next_ref.h"
#include "quant/qtypes.h"
#include "runtime/context.h"

#define N_PROMPT 24
#define N_CTX 64

static const forge_preset *preset(void) { return forge_preset_find("tiny-qwen3next"); }

static void ids_of(int32_t *ids, int n, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((x >> 33) % 957);
    }
}

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

/* tiny-qwen3next in f32 (NULL on failure) */
static hm_model *load_tiny(char *path, size_t cap) {
    hm_model *m = NULL;
    hm_error err;
    if (ft_forge(preset(), FORGE_MIX_F32, 42, "q3n-f32", false, 2, path, cap, NULL, 0) != HM_OK ||
        hm_model_load(path, NULL, &m, &err) != HM_OK)
        return NULL;
    return m;
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

/* tiny-qwen3next written with tensor `name` dropped (reshape 0) or with one more row */
static hm_status load_broken(const char *name, bool reshape, hm_error *err) {
    const forge_preset *p = preset();
    forge_tensor_list l = {0};
    forge_vocab v = {0};
    hm_status st = forge_tensors_build(p, FORGE_MIX_F32, &l, err);
    if (st == HM_OK) st = forge_vocab_build(p, &v, err);
    for (int i = 0; st == HM_OK && i < l.n; i++) {
        if (strcmp(l.t[i].name, name)) continue;
        if (reshape) l.t[i].ne[1]++;
        else l.t[i] = l.t[--l.n];
        break;
    }
    char path[512];
    ft_path(path, sizeof(path), "q3n-broken.gguf");
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

static cpu_engine *engine(const hm_model *m, int ub, int nth, int n_seq) {
    cpu_engine_params p = {.n_ctx = N_CTX, .n_ubatch = ub, .n_threads = nth,
                           .type_k = HM_TYPE_F32, .type_v = HM_TYPE_F32, .n_seq = n_seq};
    cpu_engine *e = NULL;
    hm_error err;
    if (cpu_engine_init(m, &p, &e, &err) != HM_OK) fprintf(stderr, "engine: %s\n", err.msg);
    return e;
}

/* logits [n][V] of ids through e from position 0 in calls of at most `chunk` tokens */
static bool run(cpu_engine *e, const int32_t *ids, int n, int chunk, float *lo, int64_t V) {
    hm_error err;
    for (int t = 0; t < n; t += chunk) {
        const int k = n - t < chunk ? n - t : chunk;
        if (cpu_engine_decode(e, ids + t, k, t, lo + (size_t)t * (size_t)V, HM_LOGITS_ALL,
                              &err) != HM_OK) {
            fprintf(stderr, "decode: %s\n", err.msg);
            return false;
        }
    }
    return true;
}

static void test_prompt_identity(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    const size_t sz = sizeof(float) * N_PROMPT * (size_t)V;
    int32_t ids[N_PROMPT];
    ids_of(ids, N_PROMPT, 5);
    float *a = malloc(sz), *b = malloc(sz);
    HM_REQUIRE(a && b);
    cpu_engine *e = engine(m, N_PROMPT, 2, 1);
    HM_REQUIRE(e && run(e, ids, N_PROMPT, N_PROMPT, a, V)); /* one prompt call */
    cpu_engine_reset(e);
    HM_REQUIRE(run(e, ids, N_PROMPT, N_PROMPT, b, V));
    HM_CHECK_MSG(!memcmp(a, b, sz), "after a reset the prompt gives other bytes");
    cpu_engine_free(e);
    const int chunks[][2] = {{1, 2}, {5, 2}, {N_PROMPT, 1}, {1, 1}}; /* ubatch, threads */
    for (int k = 0; k < 4; k++) {
        e = engine(m, chunks[k][0], chunks[k][1], 1);
        memset(b, 0, sz);
        HM_REQUIRE(e && run(e, ids, N_PROMPT, chunks[k][0], b, V));
        HM_CHECK_MSG(!memcmp(a, b, sz), "ubatch %d, %d threads: other bytes than the prompt",
                     chunks[k][0], chunks[k][1]);
        cpu_engine_free(e);
    }
    /* the recurrence took effect: the last token's logits depend on the earlier ones */
    int32_t ids2[N_PROMPT];
    memcpy(ids2, ids, sizeof(ids));
    ids2[0] = ids[0] == 100 ? 101 : 100;
    e = engine(m, N_PROMPT, 2, 1);
    HM_REQUIRE(e && run(e, ids2, N_PROMPT, N_PROMPT, b, V));
    HM_CHECK(memcmp(a + (N_PROMPT - 1) * V, b + (N_PROMPT - 1) * V, sizeof(float) * (size_t)V));
    cpu_engine_free(e);
    free(a);
    free(b);
    hm_model_free(m);
}

static void test_reference(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    int32_t ids[N_PROMPT];
    ids_of(ids, N_PROMPT, 9);
    float *lo = malloc(sizeof(float) * N_PROMPT * (size_t)V);
    double *ref = malloc(sizeof(double) * N_PROMPT * (size_t)V);
    HM_REQUIRE(lo && ref);
    cpu_engine *e = engine(m, 8, 2, 1);
    HM_REQUIRE(e && run(e, ids, N_PROMPT, 8, lo, V));
    cpu_engine_free(e);
    qref r;
    HM_REQUIRE(qref_init(&r, hm_model_gguf(m), N_CTX));
    for (int t = 0; t < N_PROMPT; t++) qref_step(&r, ids[t], ref + (size_t)t * (size_t)V);
    qref_free(&r);
    double mean = 0, var = 0, md = 0;
    const size_t n = N_PROMPT * (size_t)V;
    for (size_t i = 0; i < n; i++) mean += ref[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (ref[i] - mean) * (ref[i] - mean);
    const double sd = sqrt(var / (double)n);
    int argmax_diff = 0;
    for (int t = 0; t < N_PROMPT; t++) {
        int64_t ia = 0, ib = 0;
        for (int64_t j = 0; j < V; j++) {
            const size_t i = (size_t)t * (size_t)V + (size_t)j;
            const double d = fabs((double)lo[i] - ref[i]);
            if (!(d <= md)) md = d;
            if (lo[i] > lo[(size_t)t * (size_t)V + (size_t)ia]) ia = j;
            if (ref[i] > ref[(size_t)t * (size_t)V + (size_t)ib]) ib = j;
        }
        argmax_diff += ia != ib;
    }
    printf("qwen3next vs double reference: max|diff| %.3g, std %.3g, ratio %.3g, argmax diffs %d\n",
           md, sd, md / sd, argmax_diff);
    HM_CHECK(sd > 0.1);
    HM_CHECK_MSG(md <= 1e-4 * sd, "max|diff| %.3g > 1e-4 x std %.3g", md, sd);
    HM_CHECK(argmax_diff == 0);
    free(lo);
    free(ref);
    hm_model_free(m);
}

static void test_sequences(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    const int64_t V = hm_model_hparams(m)->n_vocab;
    enum { NT = 10 };
    int32_t ids[2][NT];
    ids_of(ids[0], NT, 21);
    ids_of(ids[1], NT, 22);
    float *alone = malloc(sizeof(float) * 2 * NT * (size_t)V), *got = malloc(sizeof(float) * 2 * (size_t)V);
    HM_REQUIRE(alone && got);
    for (int s = 0; s < 2; s++) {
        cpu_engine *e = engine(m, 4, 2, 1);
        HM_REQUIRE(e && run(e, ids[s], NT, 4, alone + (size_t)s * NT * (size_t)V, V));
        cpu_engine_free(e);
    }
    cpu_engine *e = engine(m, 4, 2, 2);
    HM_REQUIRE(e);
    hm_error err;
    int bad = 0;
    for (int t = 0; t < NT; t++) { /* one token of each sequence per call, order alternating */
        const int first = t % 2;
        const int32_t tok[2] = {ids[first][t], ids[1 - first][t]}, sq[2] = {first, 1 - first};
        const int32_t pos[2] = {t, t};
        const uint8_t want[2] = {1, 1};
        HM_REQUIRE(cpu_engine_forward_seqs(e, tok, 2, sq, pos, want, got, &err) == HM_OK);
        for (int k = 0; k < 2; k++)
            bad += memcmp(got + (size_t)k * (size_t)V,
                          alone + ((size_t)sq[k] * NT + (size_t)t) * (size_t)V,
                          sizeof(float) * (size_t)V) != 0;
    }
    HM_CHECK_MSG(bad == 0, "%d rows differ from their sequence alone", bad);
    /* a recurrent state is not rewound: cutting back is refused, keeping everything is not */
    HM_CHECK(cpu_engine_seq_truncate_check(e, 1, NT - 2, &err) == HM_ERR_STATE &&
             strstr(err.msg, "recurrent"));
    HM_CHECK(cpu_engine_seq_truncate_check(e, 1, NT, &err) == HM_OK);
    const int32_t tok0 = ids[1][0], sq1 = 1, p3 = 3;
    HM_CHECK(cpu_engine_forward_seqs(e, &tok0, 1, &sq1, &p3, NULL, NULL, &err) == HM_ERR_STATE);
    /* a reset sequence starts again: its first tokens give the bytes they gave alone */
    cpu_engine_seq_reset(e, 1);
    HM_CHECK(cpu_engine_seq_truncate_check(e, 1, 0, &err) == HM_OK);
    for (int t = 0; t < 3; t++) {
        const int32_t pos = t;
        const uint8_t want = 1;
        HM_REQUIRE(cpu_engine_forward_seqs(e, &ids[1][t], 1, &sq1, &pos, &want, got, &err) ==
                   HM_OK);
        HM_CHECK(!memcmp(got, alone + ((size_t)NT + (size_t)t) * (size_t)V,
                         sizeof(float) * (size_t)V));
    }
    cpu_engine_free(e);
    free(alone);
    free(got);
    hm_model_free(m);
}

/* tiny-qwen3next as an older file: each recurrent layer's attn_qkv and attn_gate fused into
 * ssm_in, rows per key head [q, k, v (r heads), z (r heads)] (the forged values regrouped) */
typedef struct {
    rows_ctx rc;
    const forge_tensor_list *orig;
} legacy_ctx;

static hm_status legacy_rows(void *ctx, const forge_tensor *t, int64_t r0, int64_t nr, void *dst,
                             float *scratch) {
    const legacy_ctx *c = ctx;
    if (!strstr(t->name, "ssm_in")) return gen_rows((void *)&c->rc, t, r0, nr, dst, scratch);
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
        hm_status st = gen_rows((void *)&c->rc, src, sr, 1, (float *)dst + (r - r0) * E, scratch);
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
    ids_of(ids, 12, 31);
    float *a = malloc(sizeof(float) * 12 * (size_t)V), *b = malloc(sizeof(float) * 12 * (size_t)V);
    HM_REQUIRE(a && b);
    cpu_engine *e1 = engine(m, 4, 2, 1), *e2 = engine(ref, 4, 2, 1);
    HM_REQUIRE(e1 && e2 && run(e1, ids, 12, 4, a, V) && run(e2, ids, 12, 4, b, V));
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

static void test_gpu_refused(void) {
    char path[512];
    hm_model *m = load_tiny(path, sizeof(path));
    HM_REQUIRE(m);
    hm_context_params p = hm_context_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    p.n_gpu_layers = 99;
    hm_context *c = NULL;
    hm_error err;
    HM_CHECK(hm_context_init(m, &p, &c, &err) == HM_ERR_UNSUPPORTED &&
             strstr(err.msg, "qwen3next") && strstr(err.msg, "CPU"));
    HM_CHECK(!c);
    p.n_gpu_layers = 0; /* the CPU engine runs it */
    HM_CHECK(hm_context_init(m, &p, &c, &err) == HM_OK);
    hm_context_free(c);
    hm_model_free(m);
}

HM_TEST_MAIN(test_forge_layout, test_load, test_prompt_identity, test_reference, test_sequences,
             test_legacy_ssm_in, test_gpu_refused)
