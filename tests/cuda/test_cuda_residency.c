/* test_cuda_residency.c - the GPU engine follows the expert residency map
 * (cuda_engine_params.res, model/residency.h, cuda/cuda_engine.h).
 *
 * Host checks (CUDA builds, no device needed: cuda_engine_plan): a map of the wrong shape or an
 * inconsistent one is HM_ERR_ARG; a map where an expert has no device slot while others of its
 * layer have one (a mixed layer, the hot cache's shape: test_cuda_tiered.c runs it) plans the
 * layer's arena as its n_slots say; a permuted map plans the same weight bytes as none;
 * a map where every expert of a layer is in host memory (a host layer: the tiered step,
 * test_cuda_tiered.c) plans exactly that layer's expert bytes less.
 * With a GPU, on tiny forged models of every architecture x weight mix: an engine whose experts
 * sit in permuted slots (slot = (id * 7 + 3) % n_expert, a permutation for the presets' 8 and 16
 * experts) gives logits byte-identical to an engine without a map (slot = id) and to one with
 * the explicit all-device map: a 21-token prompt (all logits; the grouped GEMM for quantised
 * weights, the batched expert matvecs with HOTMOE_GPU_NO_GEMM and for f32), 8 one-token decode
 * steps (the one-token expert kernels, fused router, deferred down bias) and a 3-token step. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "cuda/cuda_engine.h"
#include "cuda_test_util.h"
#include "harness.h"
#include "model/model.h"
#include "model/residency.h"
#include "quant/qtypes.h"

#define N_PROMPT 21
#define N_STEPS 8
#define N_CTX 64

static cuda_engine_params eng_params(const hm_residency *res) {
    cuda_engine_params p;
    memset(&p, 0, sizeof(p));
    p.device = 0;
    p.n_ctx = N_CTX;
    p.n_ubatch = 32;
    p.type_k = p.type_v = HM_TYPE_F16;
    p.res = res;
    return p;
}

/* slot = (id * 7 + 3) % n_expert in every layer */
static void permute(hm_residency *r) {
    for (int l = 0; l < r->n_layer; l++)
        for (int e = 0; e < r->n_expert; e++)
            r->slot[hm_residency_at(r, l, e)] = (e * 7 + 3) % r->n_expert;
}

static void test_plan(void) {
    if (!cuda_compiled()) return; /* the stub refuses every plan */
    char path[512];
    HM_REQUIRE(ft_forged("cudares", "tiny-qwen3moe", FORGE_MIX_Q4_K_M, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    const int nl = (int)hp->n_layer, ne = (int)hp->n_expert;
    uint64_t w0 = 0, w1 = 0, kv0 = 0, kv1 = 0, s0 = 0, s1 = 0;
    cuda_engine_params p = eng_params(NULL);
    HM_CHECK_MSG(cuda_engine_plan(m, &p, &w0, &kv0, &s0, &err) == HM_OK, "%s", err.msg);

    hm_residency r;
    HM_REQUIRE(hm_residency_init_device(&r, nl, ne, &err) == HM_OK);
    permute(&r);
    p = eng_params(&r);
    HM_CHECK_MSG(cuda_engine_plan(m, &p, &w1, &kv1, &s1, &err) == HM_OK, "%s", err.msg);
    HM_CHECK(w1 == w0 && kv1 == kv0 && s1 == s0);

    /* an expert without a device slot: a mixed layer (the hot cache's shape), planned with the
     * same arena while n_slots stays; one expert's bytes less once the arena is one slot
     * smaller */
    const size_t i = hm_residency_at(&r, 1, 5);
    const int32_t keep = r.slot[i];
    r.slot[i] = -1;
    r.home[i] = HM_HOME_HOST;
    hm_error_clear(&err);
    HM_CHECK_MSG(cuda_engine_plan(m, &p, &w1, NULL, NULL, &err) == HM_OK, "%s", err.msg);
    HM_CHECK(w1 == w0);
    r.n_slots[1] = ne - 1;
    for (int x = 0; x < ne; x++) {
        const size_t j = hm_residency_at(&r, 1, x);
        if (r.slot[j] == ne - 1) r.slot[j] = keep; /* the freed slot takes the last one's */
    }
    hm_error_clear(&err);
    HM_CHECK_MSG(cuda_engine_plan(m, &p, &w1, NULL, NULL, &err) == HM_OK, "%s", err.msg);
    HM_CHECK_MSG(w1 < w0, "%llu >= %llu", (unsigned long long)w1, (unsigned long long)w0);
    /* inconsistent: a device slot without the device home */
    r.n_slots[1] = ne;
    r.slot[i] = keep;
    for (int x = 0; x < ne; x++) r.slot[hm_residency_at(&r, 1, x)] = (x * 7 + 3) % ne;
    hm_error_clear(&err);
    HM_CHECK(cuda_engine_plan(m, &p, NULL, NULL, NULL, &err) == HM_ERR_ARG &&
             strstr(err.msg, "no device home"));
    /* a host layer: no slot for any expert of layer 1 */
    for (int x = 0; x < ne; x++) {
        const size_t j = hm_residency_at(&r, 1, x);
        r.slot[j] = -1;
        r.home[j] = HM_HOME_HOST;
    }
    r.n_slots[1] = 0;
    uint64_t wh = 0, sh = 0;
    hm_error_clear(&err);
    HM_CHECK_MSG(cuda_engine_plan(m, &p, &wh, NULL, &sh, &err) == HM_OK, "%s", err.msg);
    const hm_layer *L1 = hm_model_layer(m, 1);
    const hm_tensor *xt[] = {&L1->gate_exps, &L1->up_exps, &L1->down_exps};
    uint64_t xb = 0;
    for (int k = 0; k < 3; k++) /* 256-byte aligned tensors in the arena */
        xb += (hm_row_size(xt[k]->type, xt[k]->ne[0]) * (uint64_t)xt[k]->ne[1] *
                   (uint64_t)xt[k]->ne[2] + 255) / 256 * 256;
    HM_CHECK_MSG(wh + xb == w0, "host layer: %llu + %llu != %llu bytes", (unsigned long long)wh,
                 (unsigned long long)xb, (unsigned long long)w0);
    HM_CHECK(sh >= s0); /* the step's sequence number */
    hm_residency_free(&r);
    /* a map of another model's shape */
    HM_REQUIRE(hm_residency_init_device(&r, nl, ne * 2, &err) == HM_OK);
    p = eng_params(&r);
    hm_error_clear(&err);
    HM_CHECK(cuda_engine_plan(m, &p, NULL, NULL, NULL, &err) == HM_ERR_ARG &&
             strstr(err.msg, "expert residency: a map of"));
    hm_residency_free(&r);
    hm_model_free(m);
}

#ifdef HOTMOE_HAVE_CUDA
/* Every logit the engine gives for the sequence: prompt (all rows), N_STEPS single steps, one
 * step of 3 tokens (all rows). out: [N_PROMPT + N_STEPS + 3][n_vocab]. */
static bool run_engine(const hm_model *m, const hm_residency *res, const int32_t *seq,
                       float *out, const char *what) {
    const int64_t V = hm_model_hparams(m)->n_vocab;
    cuda_engine_params p = eng_params(res);
    cuda_engine *e = NULL;
    hm_error err;
    hm_error_clear(&err);
    hm_status st = cuda_engine_init(m, &p, &e, &err);
    HM_CHECK_MSG(st == HM_OK, "%s: init: %s", what, err.msg);
    if (st != HM_OK) return false;
    st = cuda_engine_decode(e, seq, N_PROMPT, 0, out, HM_LOGITS_ALL, &err);
    for (int i = 0; i < N_STEPS && st == HM_OK; i++) {
        const int pos = N_PROMPT + i;
        st = cuda_engine_decode(e, seq + pos, 1, pos, out + (size_t)pos * (size_t)V,
                                HM_LOGITS_LAST, &err);
    }
    const int pos = N_PROMPT + N_STEPS;
    if (st == HM_OK)
        st = cuda_engine_decode(e, seq + pos, 3, pos, out + (size_t)pos * (size_t)V,
                                HM_LOGITS_ALL, &err);
    HM_CHECK_MSG(st == HM_OK, "%s: decode: %s", what, err.msg);
    cuda_engine_free(e);
    return st == HM_OK;
}

static int compare_model(const char *preset, forge_mix mix, bool no_gemm) {
    char path[512];
    if (!ft_forged("cudares", preset, mix, path, sizeof(path))) {
        HM_CHECK_MSG(0, "forge %s %s", preset, forge_mix_name(mix));
        return 0;
    }
    hm_model *m = NULL;
    hm_error err;
    if (hm_model_load(path, NULL, &m, &err) != HM_OK) {
        HM_CHECK_MSG(0, "%s", err.msg);
        return 0;
    }
    const hm_hparams *hp = hm_model_hparams(m);
    const int64_t V = hp->n_vocab;
    const size_t rows = N_PROMPT + N_STEPS + 3, bytes = rows * (size_t)V * sizeof(float);
    int32_t seq[N_PROMPT + N_STEPS + 3];
    uint64_t x = 77;
    for (size_t i = 0; i < rows; i++) seq[i] = 3 + (int32_t)(tu_next(&x) % (uint64_t)(V - 3));
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    hm_residency perm, ident;
    if (!a || !b || !c ||
        hm_residency_init_device(&perm, (int)hp->n_layer, (int)hp->n_expert, &err) != HM_OK ||
        hm_residency_init_device(&ident, (int)hp->n_layer, (int)hp->n_expert, &err) != HM_OK) {
        HM_CHECK_MSG(0, "out of memory");
        exit(1);
    }
    permute(&perm);
    if (no_gemm) setenv("HOTMOE_GPU_NO_GEMM", "1", 1);
    char what[160];
    snprintf(what, sizeof(what), "%s %s%s", preset, forge_mix_name(mix),
             no_gemm ? " (no GEMM)" : "");
    int ok = run_engine(m, NULL, seq, a, what) && run_engine(m, &perm, seq, b, what) &&
             run_engine(m, &ident, seq, c, what);
    unsetenv("HOTMOE_GPU_NO_GEMM");
    if (ok) {
        const int64_t db = tu_diff_at(a, b, bytes), dc = tu_diff_at(a, c, bytes);
        HM_CHECK_MSG(db < 0, "%s: permuted slots differ from slot = id at logits row %lld", what,
                     (long long)(db / 4 / V));
        HM_CHECK_MSG(dc < 0, "%s: the all-device map differs from none at logits row %lld", what,
                     (long long)(dc / 4 / V));
        ok = db < 0 && dc < 0;
        printf("%-14s %-7s %-9s %s\n", preset, forge_mix_name(mix), no_gemm ? "no-gemm" : "",
               ok ? "byte-identical" : "DIFFERENT");
    }
    hm_residency_free(&perm);
    hm_residency_free(&ident);
    free(a), free(b), free(c);
    hm_model_free(m);
    return ok;
}
#endif

static void test_permuted_slots(void) {
    if (!tu_have_gpu()) return;
#ifdef HOTMOE_HAVE_CUDA
    static const char *presets[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe",
                                    "tiny-gpt-oss", "tiny-qwen2moe"};
    static const forge_mix mixes[] = {FORGE_MIX_F32, FORGE_MIX_Q8_0, FORGE_MIX_Q4_K_M,
                                      FORGE_MIX_MXFP4};
    int n = 0;
    for (size_t pi = 0; pi < sizeof(presets) / sizeof(presets[0]); pi++)
        for (size_t mi = 0; mi < sizeof(mixes) / sizeof(mixes[0]); mi++) {
            if (mixes[mi] == FORGE_MIX_MXFP4 && strcmp(presets[pi], "tiny-gpt-oss")) continue;
            n += compare_model(presets[pi], mixes[mi], false);
            if (mixes[mi] == FORGE_MIX_Q4_K_M) n += compare_model(presets[pi], mixes[mi], true);
        }
    printf("expert residency: %d model runs byte-identical with permuted slots\n", n);
#endif
}

TU_TEST_MAIN(test_plan, test_permuted_slots)
