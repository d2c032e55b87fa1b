/* Device KV cache and attention (cuda_attn.h) against cpu_attention over a cache of the same
 * type, f16 and f32 (every case runs with both).
 * Each case runs a prompt in batches (crossing the sliding window where there is one), then
 * decode steps, on both sides: cuda_kv_store must write the CPU's cache bytes (f16 bits, or the
 * f32 values; compared row by row), and every attention output must satisfy
 * max |gpu - cpu| <= ATT_TOL * std(cpu output of that call). With an f32 cache the prompt
 * batches run the CUDA-core kernel (the tensor-core one takes f16 only), decode the same
 * one-token kernel as f16. The GPU sums in a different order (online softmax per 32-position tile,
 * flash-decoding splits, one f32 accumulator per dot product), so bit-identity is not claimed;
 * the worst ratio per case is printed. Cases: GQA, sliding window + sinks, 3000 positions,
 * head_dim 80, 256, 320 and 512 (gemma4's full layers), 16 and 128 query heads per kv head,
 * multi-token decode batches. Also:
 * determinism (the same call twice gives the same bytes), argument errors, the refusals (q8_0,
 * bf16, a mixed f16/f32 pair), one token of each of several sequences in one launch
 * (cuda_kv_store_seqs, cuda_attention_runs: the bytes of a launch per token), and (printed, not asserted) timings of decode and prompt
 * attention at model-like shapes, f16 and f32.
 * Without a GPU: the host checks only. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/cuda_attn.h"
#include "cuda_test_util.h"
#include "harness.h"
#include "quant/qtypes.h"

#define ATT_TOL 1e-4

static void test_host(void) {
#ifdef HOTMOE_HAVE_CUDA
    hm_error err;
    hm_error_clear(&err);
    HM_CHECK(cuda_kv_check(HM_TYPE_Q8_0, HM_TYPE_Q8_0, 8, 128, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK_MSG(strstr(err.msg, "q8_0") && strstr(err.msg, "f16 or f32"), "%s", err.msg);
    HM_CHECK(cuda_kv_check(HM_TYPE_F32, HM_TYPE_BF16, 8, 128, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK_MSG(strstr(err.msg, "bf16 KV cache (V)") && strstr(err.msg, "f16 or f32"), "%s",
                 err.msg);
    HM_CHECK(cuda_kv_check(HM_TYPE_F16, HM_TYPE_F32, 8, 128, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK_MSG(strstr(err.msg, "f16 K with f32 V") && strstr(err.msg, "one type"), "%s",
                 err.msg);
    HM_CHECK(cuda_kv_check(HM_TYPE_F32, HM_TYPE_F16, 8, 128, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK(cuda_kv_check(HM_TYPE_F16, HM_TYPE_F16, 8, 520, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK(cuda_kv_check(HM_TYPE_F32, HM_TYPE_F32, 8, 520, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK(cuda_kv_check(HM_TYPE_F16, HM_TYPE_F16, 2, 512, &err) == HM_OK);
    HM_CHECK(cuda_kv_check(HM_TYPE_F16, HM_TYPE_F16, 8, 128, &err) == HM_OK);
    HM_CHECK(cuda_kv_check(HM_TYPE_F32, HM_TYPE_F32, 8, 128, &err) == HM_OK);
    HM_CHECK(cuda_kv_bytes(HM_TYPE_F16, 4096, 8, 128) == (size_t)4096 * 8 * 128 * 2);
    HM_CHECK(cuda_kv_bytes(HM_TYPE_F32, 4096, 8, 128) == (size_t)4096 * 8 * 128 * 4);
    HM_CHECK(cuda_kv_bytes(HM_TYPE_Q8_0, 4096, 8, 128) == 0);
    HM_CHECK(cuda_kv_bytes(HM_TYPE_F32, 0, 8, 128) == 0);
    /* the store refuses other types before touching the device */
    int32_t dummy = 0;
    HM_CHECK(cuda_kv_store(HM_TYPE_BF16, &dummy, &dummy, 16, 1, 8, NULL, NULL, 1, &dummy, NULL,
                           &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK_MSG(strstr(err.msg, "bf16"), "%s", err.msg);
    cuda_attn_args a = {.n_head = 6, .n_head_kv = 4, .head_dim = 64, .n_ctx = 128, .n_tok = 1};
    HM_CHECK(cuda_attention(&a, NULL, &err) == HM_ERR_ARG); /* 6 % 4 */
    a.n_head = 8;
    HM_CHECK(cuda_attention(&a, NULL, &err) == HM_ERR_ARG); /* no buffers */
    a.kv_f32 = 1;
    HM_CHECK(cuda_attention(&a, NULL, &err) == HM_ERR_ARG); /* no buffers */
    a.head_dim = 520;
    HM_CHECK(cuda_attention(&a, NULL, &err) == HM_ERR_UNSUPPORTED);
    a.head_dim = 64;
    a.kv_f32 = 0;
    /* decode splits need scratch, prompt batches do not */
    a.n_ctx = 32768;
    HM_CHECK(cuda_attention_scratch_size(&a) > 0);
    a.n_tok = 512;
    a.n_head = 32;
    a.n_head_kv = 4;
    HM_CHECK(cuda_attention_scratch_size(&a) == 0);
    /* one token per sequence: the one-token kernel's shapes only; scratch for a launch's
     * tokens (16 of 4 kv heads split at n_ctx 32768: one launch); buffers checked first */
    a.n_tok = 16;
    a.head_dim = 128;
    HM_CHECK(cuda_attention_runs_fit(&a));
    const size_t one = cuda_attention_scratch_size(&(cuda_attn_args){.n_head = 32, .n_head_kv = 4,
                                                   .head_dim = 128, .n_ctx = 32768, .n_tok = 1});
    HM_CHECK(one > 0 && cuda_attention_runs_scratch_size(&a) > one);
    HM_CHECK(cuda_attention_runs(&a, &dummy, NULL, &err) == HM_ERR_ARG); /* no buffers */
    HM_CHECK_MSG(strstr(err.msg, "missing buffers"), "%s", err.msg);
    a.head_dim = 80;
    HM_CHECK(!cuda_attention_runs_fit(&a));
    HM_CHECK(cuda_attention_runs(&a, &dummy, NULL, &err) == HM_ERR_UNSUPPORTED);
    HM_CHECK(cuda_kv_store_seqs(HM_TYPE_BF16, &dummy, &dummy, 16, 1, 8, NULL, NULL, 1, &dummy,
                                &dummy, NULL, &err) == HM_ERR_UNSUPPORTED);
#else
    HM_CHECK(!cuda_compiled());
#endif
}

#ifdef HOTMOE_HAVE_CUDA

typedef struct {
    const char *name;
    int n_head, n_kv, hd;
    int64_t window;
    int sinks;
    int64_t n_ctx;
    int batches[8];     /* prompt batch sizes, 0-terminated */
    int n_steps, step_tok; /* then n_steps decode batches of step_tok tokens */
} att_case;

static const att_case k_cases[] = {
    {"gqa", 8, 2, 128, 0, 0, 512, {200}, 16, 1},
    {"swa_sinks", 8, 2, 64, 128, 1, 1024, {100, 100, 100}, 10, 1},
    {"swa_sinks_multi", 8, 2, 64, 128, 1, 1024, {150, 150}, 4, 3},
    {"long_3000", 4, 1, 128, 0, 0, 3072, {512, 512, 512, 512, 512, 440}, 4, 3},
    {"hd256_swa", 4, 4, 256, 64, 1, 256, {100, 50}, 5, 1},
    {"hd80", 6, 2, 80, 0, 0, 300, {37, 64}, 5, 2},
    /* head sizes over 256: the 512 instance (gemma-4-26b-a4b's full layers: 16 heads, 2 kv) */
    {"hd512", 16, 2, 512, 0, 0, 256, {100, 40}, 4, 1},
    {"hd320", 4, 2, 320, 0, 0, 256, {60}, 3, 2},
    {"rep16", 32, 2, 64, 0, 1, 256, {130}, 3, 1},
    {"rep128", 128, 1, 64, 0, 0, 128, {20}, 2, 1},
    /* the decode kernel's qwen3 / gpt-oss shapes: 8 heads per kv head, 32 merged parts */
    {"rep8_long", 16, 2, 128, 0, 0, 4096, {512, 512, 512, 512}, 6, 1},
    {"rep8_swa_sinks", 64, 8, 64, 128, 1, 1024, {300}, 6, 1},
    /* qwen3next / qwen35moe's gated attention layers: head_dim 256, 8 heads per kv head */
    {"rep8_hd256", 16, 2, 256, 0, 0, 2048, {512, 300}, 6, 1},
    /* prompt batches of the qwen3 / gpt-oss shapes with one part per block (tensor cores),
     * then a split batch */
    {"q3_prompt", 32, 4, 128, 0, 0, 1024, {512, 200}, 2, 1},
    {"goss_prompt", 64, 8, 64, 128, 1, 1024, {512}, 2, 1},
};

/* max |a - b| / std(a) */
static double rel_err(const float *ref, const float *got, int64_t n) {
    double mean = 0, var = 0, md = 0;
    for (int64_t i = 0; i < n; i++) mean += ref[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) {
        var += (ref[i] - mean) * (ref[i] - mean);
        double d = fabs((double)ref[i] - (double)got[i]);
        if (!(d <= md)) md = d; /* NaN propagates */
    }
    double sd = sqrt(var / (double)n);
    return md / (sd > 0 ? sd : 1.0);
}

/* One case with caches of type kt (HM_TYPE_F16 or HM_TYPE_F32) on both sides. */
static void run_case(const att_case *c, uint32_t kt) {
    hm_error err;
    hm_error_clear(&err);
    uint64_t s = 1234 + (uint64_t)c->hd * 7 + (uint64_t)c->n_head;
    const int row = c->n_kv * c->hd;
    const size_t esz = kt == HM_TYPE_F32 ? 4 : 2; /* bytes per cache element */
    cpu_kv_layer kv;
    HM_REQUIRE(cpu_kv_init(&kv, kt, kt, c->n_kv, c->hd, c->n_ctx, &err) == HM_OK);
    const size_t kvb = cuda_kv_bytes(kt, c->n_ctx, c->n_kv, c->hd);
    HM_REQUIRE(kvb == (size_t)c->n_ctx * row * esz);
    void *dkc = tu_dev(NULL, kvb), *dvc = tu_dev(NULL, kvb);
    void *hkc = malloc(kvb);
    float sinks[128];
    for (int h = 0; h < c->n_head; h++) sinks[h] = tu_unit(&s) * 3.0f;
    float *dsinks = tu_dev(sinks, sizeof(sinks));
    HM_REQUIRE(dkc && dvc && hkc && dsinks);
    const int max_tok = 512;
    float *q = malloc((size_t)max_tok * c->n_head * c->hd * 4), *k = malloc((size_t)max_tok * row * 4);
    float *v = malloc((size_t)max_tok * row * 4), *ref = malloc((size_t)max_tok * c->n_head * c->hd * 4);
    float *got = malloc((size_t)max_tok * c->n_head * c->hd * 4);
    float *got2 = malloc((size_t)max_tok * c->n_head * c->hd * 4);
    float *dq = tu_dev(NULL, (size_t)max_tok * c->n_head * c->hd * 4), *dk = tu_dev(NULL, (size_t)max_tok * row * 4);
    float *dv = tu_dev(NULL, (size_t)max_tok * row * 4), *dout = tu_dev(NULL, (size_t)max_tok * c->n_head * c->hd * 4);
    int32_t pos[512];
    int32_t *dpos = tu_dev(NULL, sizeof(pos));
    HM_REQUIRE(q && k && v && ref && got && got2 && dq && dk && dv && dout && dpos);

    double worst = 0;
    int64_t p0 = 0;
    int calls = 0, nb = 0;
    while (c->batches[nb]) nb++;
    for (int b = 0; b < nb + c->n_steps; b++) {
        const int n = b < nb ? c->batches[b] : c->step_tok;
        const int64_t nq = (int64_t)n * c->n_head * c->hd;
        tu_fill(&s, q, nq, 2.5f);
        tu_fill(&s, k, (int64_t)n * row, 1.5f);
        tu_fill(&s, v, (int64_t)n * row, 1.0f);
        for (int t = 0; t < n; t++) pos[t] = (int32_t)(p0 + t);
        cpu_attn_args ca = {.n_head = c->n_head, .n_tok = n, .pos0 = p0, .window = c->window,
                            .sinks = c->sinks ? sinks : NULL, .q = q, .k_new = k, .v_new = v,
                            .out = ref};
        HM_REQUIRE(cpu_attention(NULL, &kv, &ca, NULL, 0, &err) == HM_OK);
        HM_REQUIRE(tu_put(dq, q, nq * 4) && tu_put(dk, k, (size_t)n * row * 4) &&
                   tu_put(dv, v, (size_t)n * row * 4) && tu_put(dpos, pos, (size_t)n * 4));
        HM_REQUIRE(cuda_kv_store(kt, dkc, dvc, c->n_ctx, c->n_kv, c->hd, dk, dv, n, dpos, NULL, &err) == HM_OK);
        cuda_attn_args ga = {.n_head = c->n_head, .n_head_kv = c->n_kv, .head_dim = c->hd,
                             .n_ctx = c->n_ctx, .n_tok = n, .window = c->window,
                             .d_sinks = c->sinks ? dsinks : NULL, .d_pos = dpos, .q = dq,
                             .k_cache = dkc, .v_cache = dvc, .kv_f32 = kt == HM_TYPE_F32,
                             .out = dout};
        size_t scr = cuda_attention_scratch_size(&ga);
        ga.scratch = scr ? tu_dev(NULL, scr) : NULL;
        HM_REQUIRE(!scr || (ga.scratch && cudaMemset(ga.scratch, 0, scr) == cudaSuccess));
        HM_CHECK_MSG(cuda_attention(&ga, NULL, &err) == HM_OK, "%s %s: %s", c->name,
                     hm_type_name(kt), err.msg);
        HM_REQUIRE(tu_get(got, dout, nq * 4));
        /* the same call again: same bytes */
        HM_CHECK(cuda_attention(&ga, NULL, &err) == HM_OK);
        HM_REQUIRE(tu_get(got2, dout, nq * 4));
        HM_CHECK_MSG(memcmp(got, got2, nq * 4) == 0, "%s %s: not deterministic", c->name,
                     hm_type_name(kt));
        if (ga.scratch) cudaFree(ga.scratch);
        double e = rel_err(ref, got, nq);
        if (!(e <= worst)) worst = e;
        HM_CHECK_MSG(e <= ATT_TOL, "%s %s batch %d (pos %lld, %d tokens): max|diff|/std %.3g",
                     c->name, hm_type_name(kt), b, (long long)p0, n, e);
        calls++;
        p0 += n;
    }
    /* cache bytes: every stored row equals the CPU's row of the same type */
    HM_REQUIRE(kv.k_row_size == (size_t)row * esz);
    HM_REQUIRE(tu_get(hkc, dkc, kvb));
    HM_CHECK_MSG(memcmp(hkc, kv.k, (size_t)p0 * row * esz) == 0, "%s %s: K cache bytes differ",
                 c->name, hm_type_name(kt));
    HM_REQUIRE(tu_get(hkc, dvc, kvb));
    HM_CHECK_MSG(memcmp(hkc, kv.v, (size_t)p0 * row * esz) == 0, "%s %s: V cache bytes differ",
                 c->name, hm_type_name(kt));
    printf("%-16s %s heads %3d/%d hd %3d window %4lld sinks %d: %d calls to position %lld, "
           "worst max|diff|/std %.3g\n",
           c->name, hm_type_name(kt), c->n_head, c->n_kv, c->hd, (long long)c->window, c->sinks,
           calls, (long long)p0, worst);
    cpu_kv_free(&kv);
    cudaFree(dkc);
    cudaFree(dvc);
    cudaFree(dsinks);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dout);
    cudaFree(dpos);
    free(hkc);
    free(q);
    free(k);
    free(v);
    free(ref);
    free(got);
    free(got2);
}

/* Timing at model-like shapes (cache of type kt filled with random values in (-1, 1) on the
 * host side once). */
static void time_shape(const char *name, uint32_t kt, int n_head, int n_kv, int hd, int64_t n_ctx,
                       int n_tok, int64_t pos0, int64_t window, int iters) {
    hm_error err;
    const size_t kvb = cuda_kv_bytes(kt, n_ctx, n_kv, hd);
    void *h = malloc(kvb);
    HM_REQUIRE(h);
    uint64_t s = 99;
    if (kt == HM_TYPE_F32)
        tu_fill(&s, (float *)h, (int64_t)(kvb / 4), 1.0f);
    else
        for (size_t i = 0; i < kvb / 2; i++)
            ((uint16_t *)h)[i] = (uint16_t)(0x3800 + (tu_next(&s) % 0x800)) ^ (uint16_t)((tu_next(&s) & 1) << 15);
    void *dkc = tu_dev(h, kvb), *dvc = tu_dev(h, kvb);
    free(h);
    const size_t nq = (size_t)n_tok * n_head * hd;
    float *qh = malloc(nq * 4);
    int32_t *pos = malloc((size_t)n_tok * 4);
    HM_REQUIRE(qh && pos);
    tu_fill(&s, qh, (int64_t)nq, 1.0f);
    for (int t = 0; t < n_tok; t++) pos[t] = (int32_t)(pos0 + t);
    float *dq = tu_dev(qh, nq * 4), *dout = tu_dev(NULL, nq * 4);
    int32_t *dpos = tu_dev(pos, (size_t)n_tok * 4);
    HM_REQUIRE(dkc && dvc && dq && dout && dpos);
    cuda_attn_args a = {.n_head = n_head, .n_head_kv = n_kv, .head_dim = hd, .n_ctx = n_ctx,
                        .n_tok = n_tok, .window = window, .d_pos = dpos, .q = dq, .k_cache = dkc,
                        .v_cache = dvc, .kv_f32 = kt == HM_TYPE_F32, .out = dout};
    size_t scr = cuda_attention_scratch_size(&a);
    a.scratch = scr ? tu_dev(NULL, scr) : NULL;
    HM_REQUIRE(!scr || (a.scratch && cudaMemset(a.scratch, 0, scr) == cudaSuccess));
    HM_CHECK(cuda_attention(&a, NULL, &err) == HM_OK);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, NULL);
    for (int i = 0; i < iters; i++) cuda_attention(&a, NULL, &err);
    cudaEventRecord(e1, NULL);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = 1000.0 * ms / iters;
    /* bytes of K and V the call must read (visible positions of the last token) */
    const int64_t last = pos0 + n_tok - 1, first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    const double mb = (double)(last - first + 1) * n_kv * hd * 2 * (kt == HM_TYPE_F32 ? 4 : 2) / 1e6;
    printf("timing %-22s %s heads %d/%d hd %d, %d tok at pos %lld: %.1f us per call (%.0f GB/s "
           "of K+V)\n",
           name, hm_type_name(kt), n_head, n_kv, hd, n_tok, (long long)pos0, us,
           mb * 1e-3 / (us * 1e-6));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (a.scratch) cudaFree(a.scratch);
    cudaFree(dkc);
    cudaFree(dvc);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dpos);
    free(qh);
    free(pos);
}

/* cuda_kv_store_seqs and cuda_attention_runs (one token in each of n_seq sequences, sequence
 * order shuffled) give the bytes of cuda_kv_store into each sequence's rows and of
 * cuda_attention for each token alone; n_split > 1 at these n_ctx, and 40 tokens of 8 kv heads
 * need two launches (33 tokens' tile counters each). */
static void runs_case(uint32_t kt, int n_head, int n_kv, int hd, int64_t n_ctx, int n_seq,
                      int64_t window, int with_sinks) {
    hm_error err;
    hm_error_clear(&err);
    uint64_t s = 77 + (uint64_t)n_seq;
    const int64_t row = (int64_t)n_kv * hd, nq = (int64_t)n_head * hd;
    const size_t rb = cuda_kv_bytes(kt, 1, n_kv, hd), kvb = rb * (size_t)(n_ctx * n_seq);
    char *dka = tu_dev(NULL, kvb), *dva = tu_dev(NULL, kvb), *dkb = tu_dev(NULL, kvb), *dvb = tu_dev(NULL, kvb);
    float *k = malloc(sizeof(float) * (size_t)(n_ctx * row)), *v = malloc(sizeof(float) * (size_t)(n_ctx * row));
    float *dk = tu_dev(NULL, sizeof(float) * (size_t)(n_ctx * row));
    float *dv = tu_dev(NULL, sizeof(float) * (size_t)(n_ctx * row));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_ctx), *sq = malloc(sizeof(int32_t) * (size_t)n_seq);
    int32_t *base = malloc(sizeof(int32_t) * (size_t)n_seq);
    int32_t *dpos = tu_dev(NULL, sizeof(int32_t) * (size_t)n_ctx), *dbase = tu_dev(NULL, sizeof(int32_t) * (size_t)n_seq);
    float *q = malloc(sizeof(float) * (size_t)(n_seq * nq)), *dq = tu_dev(NULL, sizeof(float) * (size_t)(n_seq * nq));
    float *dout = tu_dev(NULL, sizeof(float) * (size_t)(n_seq * nq)), *done = tu_dev(NULL, sizeof(float) * (size_t)nq);
    float *got = malloc(sizeof(float) * (size_t)(n_seq * nq)), *one = malloc(sizeof(float) * (size_t)nq);
    char *ha = malloc(kvb), *hb = malloc(kvb);
    float sinks[64];
    for (int h = 0; h < n_head && h < 64; h++) sinks[h] = tu_unit(&s) * 2.0f;
    float *dsinks = tu_dev(sinks, sizeof(sinks));
    HM_REQUIRE(dka && dva && dkb && dvb && k && v && dk && dv && pos && sq && base && dpos && dbase && q &&
               dq && dout && done && got && one && ha && hb && dsinks && n_head <= 64);
    for (int64_t i = 0; i < n_ctx; i++) pos[i] = (int32_t)i;
    HM_REQUIRE(tu_put(dpos, pos, sizeof(int32_t) * (size_t)n_ctx));
    for (int sI = 0; sI < n_seq; sI++) { /* every row of every sequence */
        tu_fill(&s, k, n_ctx * row, 1.5f);
        tu_fill(&s, v, n_ctx * row, 1.0f);
        HM_REQUIRE(tu_put(dk, k, sizeof(float) * (size_t)(n_ctx * row)) &&
                   tu_put(dv, v, sizeof(float) * (size_t)(n_ctx * row)));
        const size_t off = rb * (size_t)(n_ctx * sI);
        HM_REQUIRE(cuda_kv_store(kt, dka + off, dva + off, n_ctx, n_kv, hd, dk, dv, n_ctx, dpos, NULL, &err) == HM_OK);
    }
    HM_REQUIRE(cudaMemcpy(dkb, dka, kvb, cudaMemcpyDeviceToDevice) == cudaSuccess &&
               cudaMemcpy(dvb, dva, kvb, cudaMemcpyDeviceToDevice) == cudaSuccess);
    for (int t = 0; t < n_seq; t++) { /* token t: sequence sq[t] (shuffled), position pos[t] */
        sq[t] = (int32_t)((t * 7 + 3) % n_seq);
        pos[t] = (int32_t)(t == 0 ? n_ctx - 1 : t == 1 ? 0 : (int64_t)(tu_next(&s) % (uint64_t)n_ctx));
        base[t] = (int32_t)(sq[t] * n_ctx);
    }
    tu_fill(&s, k, n_seq * row, 1.5f);
    tu_fill(&s, v, n_seq * row, 1.0f);
    tu_fill(&s, q, n_seq * nq, 2.5f);
    HM_REQUIRE(tu_put(dk, k, sizeof(float) * (size_t)(n_seq * row)) && tu_put(dv, v, sizeof(float) * (size_t)(n_seq * row)) &&
               tu_put(dpos, pos, sizeof(int32_t) * (size_t)n_seq) && tu_put(dbase, base, sizeof(int32_t) * (size_t)n_seq) &&
               tu_put(dq, q, sizeof(float) * (size_t)(n_seq * nq)));
    HM_CHECK(cuda_kv_store_seqs(kt, dka, dva, n_ctx, n_kv, hd, dk, dv, n_seq, dpos, dbase, NULL, &err) == HM_OK);
    for (int t = 0; t < n_seq; t++) {
        const size_t off = rb * (size_t)base[t];
        HM_REQUIRE(cuda_kv_store(kt, dkb + off, dvb + off, n_ctx, n_kv, hd, dk + t * row, dv + t * row, 1, dpos + t,
                                 NULL, &err) == HM_OK);
    }
    HM_REQUIRE(tu_get(ha, dka, kvb) && tu_get(hb, dkb, kvb));
    HM_CHECK_MSG(memcmp(ha, hb, kvb) == 0, "kv_store_seqs: K bytes differ (%d sequences)", n_seq);
    HM_REQUIRE(tu_get(ha, dva, kvb) && tu_get(hb, dvb, kvb));
    HM_CHECK_MSG(memcmp(ha, hb, kvb) == 0, "kv_store_seqs: V bytes differ (%d sequences)", n_seq);
    cuda_attn_args a = {.n_head = n_head, .n_head_kv = n_kv, .head_dim = hd, .n_ctx = n_ctx, .n_tok = n_seq,
                        .window = window, .d_sinks = with_sinks ? dsinks : NULL, .d_pos = dpos, .q = dq,
                        .k_cache = dka, .v_cache = dva, .kv_f32 = kt == HM_TYPE_F32, .out = dout};
    HM_CHECK(cuda_attention_runs_fit(&a));
    const size_t scr = cuda_attention_runs_scratch_size(&a);
    a.scratch = scr ? tu_dev(NULL, scr) : NULL;
    HM_REQUIRE(scr > 0 && a.scratch && cudaMemset(a.scratch, 0, scr) == cudaSuccess); /* split */
    HM_CHECK(cuda_attention_runs(&a, dbase, NULL, &err) == HM_OK);
    HM_REQUIRE(tu_get(got, dout, sizeof(float) * (size_t)(n_seq * nq)));
    int bad = 0;
    for (int t = 0; t < n_seq; t++) {
        cuda_attn_args b = a;
        b.n_tok = 1;
        b.d_pos = dpos + t;
        b.q = dq + t * nq;
        b.k_cache = dka + rb * (size_t)base[t];
        b.v_cache = dva + rb * (size_t)base[t];
        b.out = done;
        HM_REQUIRE(cuda_attention_scratch_size(&b) <= scr);
        HM_CHECK(cuda_attention(&b, NULL, &err) == HM_OK);
        HM_REQUIRE(tu_get(one, done, sizeof(float) * (size_t)nq));
        bad += memcmp(one, got + t * nq, sizeof(float) * (size_t)nq) != 0;
    }
    HM_CHECK_MSG(bad == 0, "attention_runs %s: %d of %d tokens differ from their own launch",
                 hm_type_name(kt), bad, n_seq);
    a.head_dim = 80; /* no one-token kernel */
    HM_CHECK(!cuda_attention_runs_fit(&a) && cuda_attention_runs(&a, dbase, NULL, &err) == HM_ERR_UNSUPPORTED);
    cudaFree(a.scratch);
    void *dev[] = {dka, dva, dkb, dvb, dk, dv, dpos, dbase, dq, dout, done, dsinks};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) cudaFree(dev[i]);
    free(k), free(v), free(pos), free(sq), free(base), free(q), free(got), free(one), free(ha), free(hb);
}

static void test_gpu(void) {
    if (!tu_have_gpu()) return;
    runs_case(HM_TYPE_F16, 32, 4, 128, 1024, 16, 0, 0);
    runs_case(HM_TYPE_F32, 32, 4, 128, 1024, 5, 0, 0);
    runs_case(HM_TYPE_F16, 64, 8, 64, 512, 40, 128, 1);
    static const uint32_t types[] = {HM_TYPE_F16, HM_TYPE_F32};
    for (int ti = 0; ti < 2; ti++)
        for (size_t i = 0; i < sizeof(k_cases) / sizeof(k_cases[0]); i++)
            run_case(&k_cases[i], types[ti]);
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t kt = types[ti];
        time_shape("qwen3-30b decode", kt, 32, 4, 128, 32768, 1, 4095, 0, 50);
        time_shape("qwen3-30b decode 32k", kt, 32, 4, 128, 32768, 1, 32767, 0, 50);
        time_shape("gpt-oss decode swa", kt, 64, 8, 64, 32768, 1, 32767, 128, 50);
        time_shape("gpt-oss decode full", kt, 64, 8, 64, 32768, 1, 8191, 0, 50);
        time_shape("qwen3-30b prompt 512", kt, 32, 4, 128, 4096, 512, 0, 0, 10);
        time_shape("gpt-oss prompt 512", kt, 64, 8, 64, 4096, 512, 0, 0, 10);
    }
}

#else

static void test_gpu(void) { (void)tu_have_gpu(); }

#endif

TU_TEST_MAIN(test_host, test_gpu)
