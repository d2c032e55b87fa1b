/* The device sampler (cuda_sample.h) against the CPU sampler (sample.h): the same token from the
 * same logits, parameters, history and draw number, for every path (greedy, small top-k, full
 * sort), every chain step, ties, -inf/+inf/NaN logits, vocabularies from 1 to 151936 tokens;
 * a 300-step loop with the picked tokens fed back into the penalty history; state restored on a
 * second sampler (accept_host + set_draws); one pick captured in a CUDA graph and replayed.
 * Without a GPU: the early-stop bound the device relies on (checked for every float) and the
 * clean failure of the entry points. The per-call time of a replayed graph is printed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops_math.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_sample.h"
#include "harness.h"
#include "cuda_test_util.h"
#include "sample/sample.h"

#ifdef HOTMOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static uint64_t rng_s = 0x1234567ull;
static uint64_t rnd_u64(void) { return sample_rng_u64(0xC0FFEEull, rng_s++); }
static double rnd_unit(void) { return (double)(rnd_u64() >> 11) * 0x1.0p-53; }
static double rnd_normal(void) {
    double u = rnd_unit(), v = rnd_unit();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* The early stop of cuda_sample.cu: hm_expf(x) < 2^-26 for every float x < CUDA_SAMPLER_TAIL_X
 * (enumerated bit pattern by bit pattern down to -104, below which hm_expf is 0 by definition),
 * and hm_expf(0) == 1. */
static void test_tail_bound(void) {
    float x0 = CUDA_SAMPLER_TAIL_X, lim = -104.0f;
    uint32_t a, b;
    memcpy(&a, &x0, 4);
    memcpy(&b, &lim, 4);
    long bad = 0, n = 0;
    for (uint32_t u = a + 1; u <= b; u++, n++) {
        float x;
        memcpy(&x, &u, 4);
        if (!(hm_expf(x) < 0x1.0p-26f)) bad++;
    }
    HM_CHECK_MSG(bad == 0, "%ld of %ld floats below the tail bound have hm_expf >= 2^-26", bad, n);
    HM_CHECK(n > 20000000);
    HM_CHECK(hm_expf(0.0f) == 1.0f && hm_expf(-0.0f) == 1.0f);
    HM_CHECK(hm_expf(-104.5f) == 0.0f);
}

/* Parameters a sampler must refuse, and (no GPU) the clean failure of init. */
static void test_errors(void) {
    sample_params p = sample_params_default();
    cuda_sampler *s = (cuda_sampler *)1;
    hm_error err;
    hm_error_clear(&err);
    p.penalty_last_n = -1;
    hm_status st = cuda_sampler_init(&p, 100, NULL, &s, &err);
    HM_CHECK(s == NULL);
    HM_CHECK(st == (cuda_compiled() ? HM_ERR_ARG : HM_ERR_UNSUPPORTED));
    HM_CHECK(err.msg[0] != '\0');
    p = sample_params_default();
    p.repeat_penalty = INFINITY;
    hm_error_clear(&err);
    st = cuda_sampler_init(&p, 100, NULL, &s, &err);
    HM_CHECK(st == (cuda_compiled() ? HM_ERR_ARG : HM_ERR_UNSUPPORTED) && err.msg[0]);
    p = sample_params_default();
    hm_error_clear(&err);
    st = cuda_sampler_init(&p, 0, NULL, &s, &err);
    HM_CHECK(st == (cuda_compiled() ? HM_ERR_ARG : HM_ERR_UNSUPPORTED) && err.msg[0]);
    if (!tu_have_gpu()) {
        hm_error_clear(&err);
        p = sample_params_default();
        st = cuda_sampler_init(&p, 100, NULL, &s, &err);
        HM_CHECK(st == HM_ERR_UNSUPPORTED || st == HM_ERR_CUDA);
        HM_CHECK(s == NULL);
        HM_CHECK(err.msg[0] != '\0');
        printf("no-GPU init: %s\n", err.msg);
    }
}

/* ---- logit rows ---- */

enum { ROW_NORMAL, ROW_TIES, ROW_NEGINF, ROW_EQUAL, ROW_PEAK, ROW_POSINF, ROW_ALLNEGINF,
       ROW_WIDE, ROW_NAN, ROW_KINDS };

static void fill_row(float *l, int32_t n, int kind) {
    double sigma = (double)(1 + (int)(rnd_u64() % 8));
    for (int32_t t = 0; t < n; t++) {
        double v = rnd_normal() * sigma;
        switch (kind) {
        case ROW_TIES: v = floor(v * 2.0) * 0.5; break;               /* many exact ties */
        case ROW_NEGINF: if (rnd_u64() % 3 == 0) v = -INFINITY; break;
        case ROW_EQUAL: v = 1.5; break;
        case ROW_WIDE: v = v * 8.0 - 20.0; break;                     /* spread over > 100 */
        default: break;
        }
        l[t] = (float)v;
    }
    if (kind == ROW_PEAK) l[rnd_u64() % (uint64_t)n] += 30.0f;
    if (kind == ROW_POSINF) {
        l[rnd_u64() % (uint64_t)n] = INFINITY;
        l[rnd_u64() % (uint64_t)n] = INFINITY;
    }
    if (kind == ROW_ALLNEGINF)
        for (int32_t t = 0; t < n; t++) l[t] = -INFINITY;
    if (kind == ROW_NAN) l[rnd_u64() % (uint64_t)n] = NAN;
    if (kind == ROW_NORMAL && n > 2) { /* a tie at the top sometimes */
        int32_t a = (int32_t)(rnd_u64() % (uint64_t)n), b = (int32_t)(rnd_u64() % (uint64_t)n);
        float mx = l[0];
        for (int32_t t = 1; t < n; t++) mx = l[t] > mx ? l[t] : mx;
        l[a] = mx;
        l[b] = mx;
    }
}

static sample_params make_params(float temp, int32_t k, float top_p, float min_p, float rp,
                                 float fp, float pp, int32_t last_n, uint64_t seed) {
    sample_params p = sample_params_default();
    p.temperature = temp;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repeat_penalty = rp;
    p.frequency_penalty = fp;
    p.presence_penalty = pp;
    p.penalty_last_n = last_n;
    p.seed = seed;
    return p;
}

#define N_CONFIGS 24
static sample_params config(int i) {
    switch (i) {
    case 0: return make_params(0.0f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 64, 1);   /* greedy */
    case 1: return make_params(-1.0f, 0, 1.0f, 0.0f, 1.3f, 0.4f, 0.2f, 32, 2);    /* greedy+pen */
    case 2: return make_params(0.8f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 64, 3);   /* defaults */
    case 3: return make_params(1.0f, 1, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 4);
    case 4: return make_params(1.0f, 5, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 5);
    case 5: return make_params(0.7f, 200, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 6);
    case 6: return make_params(1.0f, 0, 0.5f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 7);
    case 7: return make_params(1.0f, 0, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 8);
    case 8: return make_params(1.0f, 0, 0.999f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 9);
    case 9: return make_params(1.0f, 0, 1.0f, 0.05f, 1.0f, 0.0f, 0.0f, 0, 10);
    case 10: return make_params(0.9f, 0, 1.0f, 0.3f, 1.0f, 0.0f, 0.0f, 0, 11);
    case 11: return make_params(1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 12);      /* pure draw */
    case 12: return make_params(0.3f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 13);
    case 13: return make_params(2.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 14);
    case 14: return make_params(1.0f, 1000, 0.95f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 15); /* big k */
    case 15: return make_params(0.8f, 40, 0.95f, 0.05f, 1.2f, 0.3f, 0.5f, 64, 16); /* + pen */
    case 16: return make_params(1.0f, 0, 0.9f, 0.05f, 1.1f, 0.0f, 0.0f, 16, 17);
    case 17: return make_params(1e-30f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 18);  /* overflow */
    case 18: return make_params(1.0f, 0, 1.0f, 2.0f, 1.0f, 0.0f, 0.0f, 0, 19);    /* min_p > 1 */
    case 19: return make_params(1.5f, 30, 0.8f, 0.1f, 1.0f, 0.0f, 0.0f, 0, 20);
    case 20: return make_params(1.0f, 0, 0.95f, 1e-20f, 1.0f, 0.0f, 0.0f, 0, 21);
    case 21: return make_params(5.0f, 0, 0.95f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 22);
    case 22: return make_params(1.0f, 300, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 23);
    default: return make_params(0.6f, 8, 0.7f, 0.0f, 0.9f, -0.2f, 0.1f, 8, 24);
    }
}

/* One pick on both samplers; the CPU sampler accepts the token as the device one does. Returns
 * 1 when both agree; *tok = the CPU's token (-1 on error). */
static int pick_both(sample_state *cs, cuda_sampler *gs, const float *l, uint64_t *draws,
                     const sample_params *p, const char *what, int32_t *tok) {
    hm_error e1, e2;
    hm_error_clear(&e1);
    hm_error_clear(&e2);
    int32_t tc = -7, tg = -9;
    hm_status s1 = sample_token(cs, l, &tc, &e1);
    hm_status s2 = cuda_sampler_sample_host(gs, l, &tg, NULL, &e2);
    int ok = s1 == s2 && (s1 != HM_OK || tc == tg);
    HM_CHECK_MSG(ok, "%s: cpu %d (status %d) gpu %d (status %d: %s)", what, tc, (int)s1, tg,
                 (int)s2, e2.msg);
    if (s1 == HM_OK) {
        sample_accept(cs, tc);
        if (p->temperature > 0.0f) (*draws)++;
    }
    if (tok) *tok = s1 == HM_OK ? tc : -1;
    uint64_t gd = 0;
    int32_t hl = 0;
    HM_CHECK(cuda_sampler_read_state(gs, NULL, &gd, &hl, &e2) == HM_OK);
    HM_CHECK_MSG(gd == *draws, "%s: draws gpu %llu cpu %llu", what, (unsigned long long)gd,
                 (unsigned long long)*draws);
    return ok && gd == *draws;
}

/* Every configuration x vocabulary size x row kind, several rows each. */
static void test_rows(void) {
    if (!tu_have_gpu()) return;
    static const int32_t vocab[] = {1, 2, 3, 17, 1000, 5000, 151936};
    const int nv = (int)(sizeof(vocab) / sizeof(vocab[0]));
    float *l = malloc(151936 * sizeof(float));
    HM_REQUIRE(l != NULL);
    long rows = 0, agree = 0;
    for (int c = 0; c < N_CONFIGS; c++) {
        sample_params p = config(c);
        for (int v = 0; v < nv; v++) {
            int32_t n = vocab[v];
            sample_state *cs = NULL;
            cuda_sampler *gs = NULL;
            hm_error err;
            hm_error_clear(&err);
            HM_REQUIRE(sample_init(&p, n, &cs, &err) == HM_OK);
            hm_status st = cuda_sampler_init(&p, n, NULL, &gs, &err);
            HM_CHECK_MSG(st == HM_OK, "config %d n %d: %s", c, n, err.msg);
            if (st != HM_OK) {
                sample_free(cs);
                continue;
            }
            uint64_t draws = 0;
            int reps = n >= 100000 ? 2 : (n >= 1000 ? 6 : 12);
            for (int r = 0; r < reps; r++)
                for (int kind = 0; kind < ROW_KINDS; kind++) {
                    fill_row(l, n, kind);
                    char what[96];
                    snprintf(what, sizeof(what), "config %d n %d kind %d rep %d", c, n, kind, r);
                    agree += pick_both(cs, gs, l, &draws, &p, what, NULL);
                    rows++;
                }
            cuda_sampler_free(gs);
            sample_free(cs);
        }
    }
    printf("rows: %ld, device == cpu: %ld\n", rows, agree);
    HM_CHECK(rows > 3000 && agree == rows);
    free(l);
}

/* 300 steps with the picks fed back (penalties see them); at step 150 a second device sampler
 * gets the state through accept_host (the whole token list) + set_draws and must continue
 * identically. */
static void test_loop(void) {
    if (!tu_have_gpu()) return;
    static const int cfgs[] = {2, 15, 16, 23, 1, 7};
    const int32_t n = 151936;
    float *base = malloc((size_t)n * sizeof(float)), *l = malloc((size_t)n * sizeof(float));
    int32_t *hist = malloc(400 * sizeof(int32_t));
    HM_REQUIRE(base && l && hist);
    for (int ci = 0; ci < (int)(sizeof(cfgs) / sizeof(cfgs[0])); ci++) {
        sample_params p = config(cfgs[ci]);
        sample_state *cs = NULL;
        cuda_sampler *gs = NULL, *gs2 = NULL;
        hm_error err;
        hm_error_clear(&err);
        HM_REQUIRE(sample_init(&p, n, &cs, &err) == HM_OK);
        HM_REQUIRE(cuda_sampler_init(&p, n, NULL, &gs, &err) == HM_OK);
        int nh = 0;
        int32_t prompt[40]; /* a prompt, with two out-of-range ids that both samplers skip */
        for (int i = 0; i < 40; i++) prompt[i] = (int32_t)(rnd_u64() % 2000);
        prompt[5] = -3;
        prompt[17] = n + 5;
        for (int i = 0; i < 40; i++) {
            sample_accept(cs, prompt[i]);
            hist[nh++] = prompt[i];
        }
        HM_CHECK(cuda_sampler_accept_host(gs, prompt, 40, NULL, &err) == HM_OK);
        for (int32_t t = 0; t < n; t++) base[t] = (float)(rnd_normal() * 2.0);
        for (int i = 0; i < 2000; i++) base[i] += 6.0f; /* the prompt's tokens are likely */
        uint64_t draws = 0, draws2 = 0;
        int ok = 1;
        for (int step = 0; step < 300; step++) {
            for (int32_t t = 0; t < n; t++) l[t] = base[t] + (float)(rnd_unit() - 0.5);
            char what[64];
            snprintf(what, sizeof(what), "loop config %d step %d", cfgs[ci], step);
            if (step == 150) {
                HM_REQUIRE(cuda_sampler_init(&p, n, NULL, &gs2, &err) == HM_OK);
                HM_CHECK(cuda_sampler_accept_host(gs2, hist, nh, NULL, &err) == HM_OK);
                HM_CHECK(cuda_sampler_set_draws(gs2, draws, NULL, &err) == HM_OK);
                draws2 = draws;
            }
            int32_t tc = -1, t2 = -5;
            ok &= pick_both(cs, gs, l, &draws, &p, what, &tc);
            hist[nh++] = tc;
            if (gs2) {
                uint64_t d2 = 0;
                HM_CHECK(cuda_sampler_sample_host(gs2, l, &t2, NULL, &err) == HM_OK);
                HM_CHECK(cuda_sampler_read_state(gs2, NULL, &d2, NULL, &err) == HM_OK);
                if (p.temperature > 0.0f) draws2++;
                HM_CHECK_MSG(d2 == draws2 && t2 == tc, "%s: restored sampler %d (draws %llu) vs %d",
                             what, t2, (unsigned long long)d2, tc);
            }
        }
        HM_CHECK_MSG(ok, "loop config %d diverged", cfgs[ci]);
        cuda_sampler_free(gs2);
        cuda_sampler_free(gs);
        sample_free(cs);
    }
    free(base);
    free(l);
    free(hist);
}

#ifdef HOTMOE_HAVE_CUDA
/* One pick captured into a CUDA graph, replayed on fresh logits (same tokens as the CPU), then
 * replayed 2000 times on one row to time it (n = 151936). */
static void test_graph(void) {
    if (!tu_have_gpu()) return;
    static const int cfgs[] = {0, 2, 7, 9, 15, 11};
    static const char *names[] = {"greedy", "defaults k40 p.95 m.05", "top-p .9 (k off)",
                                  "min-p .05 (k off)", "defaults + penalties", "pure draw (all off)"};
    const int32_t n = 151936;
    float *l = malloc((size_t)n * sizeof(float));
    HM_REQUIRE(l != NULL);
    cudaStream_t stream;
    HM_REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    float *d_l = NULL;
    int32_t *d_tok = NULL;
    HM_REQUIRE(cudaMalloc((void **)&d_l, (size_t)n * sizeof(float)) == cudaSuccess);
    HM_REQUIRE(cudaMalloc((void **)&d_tok, sizeof(int32_t)) == cudaSuccess);
    for (int ci = 0; ci < (int)(sizeof(cfgs) / sizeof(cfgs[0])); ci++) {
        sample_params p = config(cfgs[ci]);
        sample_state *cs = NULL;
        cuda_sampler *gs = NULL;
        hm_error err;
        hm_error_clear(&err);
        HM_REQUIRE(sample_init(&p, n, &cs, &err) == HM_OK);
        HM_REQUIRE(cuda_sampler_init(&p, n, stream, &gs, &err) == HM_OK);
        HM_REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        HM_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
        hm_status st = cuda_sampler_sample(gs, d_l, d_tok, stream, &err);
        HM_REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
        HM_REQUIRE(st == HM_OK);
        HM_REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
        int agree = 0;
        for (int r = 0; r < 20; r++) {
            for (int32_t t = 0; t < n; t++) l[t] = (float)(rnd_normal() * 3.0);
            l[r * 7] += 12.0f;
            int32_t tc = -1, tg = -2;
            HM_CHECK(sample_token(cs, l, &tc, &err) == HM_OK);
            sample_accept(cs, tc);
            cudaMemcpyAsync(d_l, l, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, stream);
            HM_CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
            cudaMemcpyAsync(&tg, d_tok, sizeof(tg), cudaMemcpyDeviceToHost, stream);
            HM_CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
            agree += tc == tg;
        }
        HM_CHECK_MSG(agree == 20, "graph %s: %d of 20 agree", names[ci], agree);
        /* timing: realistic row (normal, std 3, one +12 token), 2000 replays */
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int i = 0; i < 50; i++) cudaGraphLaunch(exec, stream);
        cudaEventRecord(e0, stream);
        for (int i = 0; i < 2000; i++) cudaGraphLaunch(exec, stream);
        cudaEventRecord(e1, stream);
        HM_CHECK(cudaEventSynchronize(e1) == cudaSuccess);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("device sampler, n=%d, %-26s %7.1f us per pick (graph replay)\n", n, names[ci],
               ms * 1000.0f / 2000.0f);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cuda_sampler_free(gs);
        sample_free(cs);
    }
    cudaFree(d_l);
    cudaFree(d_tok);
    cudaStreamDestroy(stream);
    free(l);
}
#else
static void test_graph(void) { HM_CHECK(!cuda_compiled()); }
#endif

TU_TEST_MAIN(test_tail_bound, test_errors, test_rows, test_loop, test_graph)
