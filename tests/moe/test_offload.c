/* test_offload.c - the offload cost model (moe/offload.h) on hand-made numbers whose right
 * answers are derived in the comments, seed 003's threshold rule, the causes and their text,
 * bad input, and where an expert's bytes are in a forged model (tiny-gpt-oss q8_0: expert
 * biases, so six ranges per expert). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../forge/forge_test_util.h"
#include "model/model.h"
#include "moe/offload.h"

static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 + 1e-9 * fabs(b); }

/* Four experts of 1e6 bytes; CPU: 1e-10 s/byte fixed + 1e-10 s/byte per token, i.e. 0.1 ms per
 * expert + 0.1 ms per token; GPU: copy at h2d, nothing else. Tokens 20, 10, 0, 1. */
static void four(offload_expert ex[4]) {
    const int32_t tok[4] = {20, 10, 0, 1};
    for (int e = 0; e < 4; e++) ex[e] = (offload_expert){.n_tok = tok[e], .bytes = 1000000};
}

static offload_rates rates(double h2d) {
    return (offload_rates){.h2d_bytes_per_s = h2d, .cpu_fixed_s_per_byte = 1e-10,
                           .cpu_tok_s_per_byte = 1e-10};
}

/* h2d 1e9 B/s: copy 1 ms per expert. cpu: e0 2.1 ms, e1 1.1 ms, e3 0.2 ms; all on CPU 3.4 ms.
 * Visiting order by cpu/gpu: e0 (2.1), e1 (1.1), e3 (0.2).
 *   e0 -> GPU: lanes CPU 1.3, GPU 1.0: max 1.3 < 3.4, gain.
 *   e1: CPU 0.2, GPU 2.0: max 2.0 > 1.3, no gain.   e3: CPU 1.1, GPU 2.0: no gain.
 * So e0 on the GPU, e1 and e3 on the CPU, e2 unused; lanes 1.3 ms / 1.0 ms. */
static void test_cost_model(void) {
    offload_plan p;
    hm_error err;
    HM_REQUIRE(offload_plan_init(&p, 4, &err) == HM_OK);
    offload_expert ex[4];
    four(ex);
    const offload_rates r = rates(1e9);
    const offload_opts o = {.cap_bytes = OFFLOAD_NO_CAP};
    HM_CHECK(close_to(offload_cpu_s(&r, &ex[0]), 2.1e-3));
    HM_CHECK(close_to(offload_gpu_s(&r, &ex[0]), 1.0e-3));
    HM_REQUIRE(offload_decide(&p, 16, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.gpu[0] == 1 && p.why[0] == OFFLOAD_WHY_GAIN);
    HM_CHECK(p.gpu[1] == 0 && p.why[1] == OFFLOAD_WHY_NO_GAIN);
    HM_CHECK(p.gpu[2] == 0 && p.why[2] == OFFLOAD_WHY_UNUSED);
    HM_CHECK(p.gpu[3] == 0 && p.why[3] == OFFLOAD_WHY_NO_GAIN);
    HM_CHECK(p.n_used == 3 && p.n_gpu == 1 && p.gpu_bytes == 1000000);
    HM_CHECK_MSG(close_to(p.cpu_s, 1.3e-3), "cpu lane %g", p.cpu_s);
    HM_CHECK_MSG(close_to(p.gpu_s, 1.0e-3), "gpu lane %g", p.gpu_s);
    HM_CHECK_MSG(close_to(p.all_cpu_s, 3.4e-3), "all cpu %g", p.all_cpu_s);
    offload_plan_free(&p);
}

/* h2d 1e10 B/s: copy 0.1 ms per expert. Without a cap:
 *   e0: CPU 1.3, GPU 0.1 -> gain;  e1: CPU 0.2, GPU 0.2 -> max 0.2 < 1.3, gain;
 *   e3: CPU 0.0, GPU 0.3 -> max 0.3 > 0.2, no gain.  Lanes 0.2 / 0.2 ms.
 * With a staging buffer of 1.5e6 bytes: e0 fits (1e6); e1 does not (2e6) -> staging full;
 *   e3 (sizes equal, so it does not fit either) -> staging full. Lanes: CPU 1.3, GPU 0.1.
 * With e3 half the size (5e5 bytes: cpu 0.1 ms, copy 0.05 ms; all on CPU 3.3 ms) and the same
 * cap, the greedy goes on after e1's skip: e0: CPU 1.2, GPU 0.1; e1 staging full; e3: CPU 1.1,
 * GPU 0.15 -> gain. Lanes 1.1 / 0.15 ms. */
static void test_cap(void) {
    offload_plan p;
    hm_error err;
    HM_REQUIRE(offload_plan_init(&p, 4, &err) == HM_OK);
    offload_expert ex[4];
    four(ex);
    const offload_rates r = rates(1e10);
    offload_opts o = {.cap_bytes = OFFLOAD_NO_CAP};
    HM_REQUIRE(offload_decide(&p, 16, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.gpu[0] && p.gpu[1] && !p.gpu[3] && p.why[3] == OFFLOAD_WHY_NO_GAIN);
    HM_CHECK(close_to(p.cpu_s, 0.2e-3) && close_to(p.gpu_s, 0.2e-3));

    o.cap_bytes = 1500000;
    HM_REQUIRE(offload_decide(&p, 16, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.gpu[0] && p.why[0] == OFFLOAD_WHY_GAIN);
    HM_CHECK(!p.gpu[1] && p.why[1] == OFFLOAD_WHY_CAP);
    HM_CHECK(!p.gpu[3] && p.why[3] == OFFLOAD_WHY_CAP);
    HM_CHECK(close_to(p.cpu_s, 1.3e-3) && close_to(p.gpu_s, 0.1e-3));
    HM_CHECK(p.gpu_bytes <= o.cap_bytes);

    ex[3].bytes = 500000;
    HM_REQUIRE(offload_decide(&p, 16, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.gpu[0] && !p.gpu[1] && p.why[1] == OFFLOAD_WHY_CAP);
    HM_CHECK(p.gpu[3] && p.why[3] == OFFLOAD_WHY_GAIN);
    HM_CHECK_MSG(close_to(p.cpu_s, 1.1e-3) && close_to(p.gpu_s, 0.15e-3), "lanes %g %g",
                 p.cpu_s, p.gpu_s);
    HM_CHECK(p.gpu_bytes == 1500000);
    offload_plan_free(&p);
}

/* An expert already copied (ahead): test_cost_model's numbers with e1 copied, so gpu(e1) = 0
 * (no copy, no fixed cost in these rates) and its key is infinite: visited first.
 *   e1: CPU 2.3, GPU 0.0 -> gain; e0: CPU 0.2, GPU 1.0 -> max 1.0 < 2.3, gain;
 *   e3: CPU 0.0, GPU 2.0 -> no gain. Lanes 0.2 / 1.0 ms; only e0's bytes are copied, and with a
 * staging buffer of 1e6 bytes e1 takes no room, so e0 still fits (and e3, next, does not). The CPU's cost of e1 is the
 * same as uncopied (2.1 - 1.0 = 1.1 ms: all on CPU still 3.4). */
static void test_copied(void) {
    offload_plan p;
    hm_error err;
    HM_REQUIRE(offload_plan_init(&p, 4, &err) == HM_OK);
    offload_expert ex[4];
    four(ex);
    ex[1].copied = true;
    const offload_rates r = rates(1e9);
    HM_CHECK(close_to(offload_gpu_s(&r, &ex[1]), 0.0) && close_to(offload_cpu_s(&r, &ex[1]), 1.1e-3));
    offload_opts o = {.cap_bytes = OFFLOAD_NO_CAP};
    for (int k = 0; k < 2; k++) {
        o.cap_bytes = k ? 1000000 : OFFLOAD_NO_CAP;
        HM_REQUIRE(offload_decide(&p, 16, ex, &r, &o, &err) == HM_OK);
        HM_CHECK_MSG(p.gpu[0] && p.gpu[1] && !p.gpu[3] &&
                         p.why[3] == (k ? OFFLOAD_WHY_CAP : OFFLOAD_WHY_NO_GAIN),
                     "cap %d: gpu %d %d %d why %d %d %d", k, p.gpu[0], p.gpu[1], p.gpu[3], p.why[0],
                     p.why[1], p.why[3]);
        HM_CHECK(p.n_gpu == 2 && p.gpu_bytes == 1000000);
        HM_CHECK_MSG(close_to(p.cpu_s, 0.2e-3) && close_to(p.gpu_s, 1.0e-3), "lanes %g %g",
                     p.cpu_s, p.gpu_s);
        HM_CHECK(close_to(p.all_cpu_s, 3.4e-3));
    }
    /* a buffer the copies ahead filled (no room left, cap_bytes 0): e1 runs on the GPU, nothing
     * else may be copied, in either mode */
    o = (offload_opts){.cap_bytes = 0};
    for (int k = 0; k < 2; k++) {
        o.threshold = k;
        HM_REQUIRE(offload_decide(&p, 16, ex, &r, &o, &err) == HM_OK);
        HM_CHECK_MSG(p.n_gpu == 1 && p.gpu[1] && p.gpu_bytes == 0 && p.why[0] == OFFLOAD_WHY_CAP &&
                         p.why[3] == OFFLOAD_WHY_CAP, "full, threshold %d: %d on the GPU, %llu "
                     "bytes, why %d %d", k, p.n_gpu, (unsigned long long)p.gpu_bytes, p.why[0],
                     p.why[3]);
    }
    offload_plan_free(&p);
}

/* A fixed GPU cost per expert and per token count on the GPU lane. h2d 1e10 (0.1 ms copy),
 * gpu_fixed 0.05 ms, gpu_tok 0.01 ms: gpu(e0) = 0.1 + 0.05 + 0.2 = 0.35 ms, gpu(e1) = 0.25,
 * gpu(e3) = 0.16. Ratios: e0 2.1/0.35 = 6, e1 1.1/0.25 = 4.4, e3 0.2/0.16 = 1.25.
 *   e0: CPU 1.3, GPU 0.35 -> gain; e1: CPU 0.2, GPU 0.6 -> max 0.6 < 1.3, gain;
 *   e3: CPU 0.0, GPU 0.76 -> no gain. Lanes 0.2 / 0.6 ms. */
static void test_gpu_costs(void) {
    offload_plan p;
    hm_error err;
    HM_REQUIRE(offload_plan_init(&p, 4, &err) == HM_OK);
    offload_expert ex[4];
    four(ex);
    offload_rates r = rates(1e10);
    r.gpu_fixed_s = 0.05e-3;
    r.gpu_tok_s = 0.01e-3;
    const offload_opts o = {.cap_bytes = OFFLOAD_NO_CAP};
    HM_CHECK(close_to(offload_gpu_s(&r, &ex[0]), 0.35e-3));
    HM_REQUIRE(offload_decide(&p, 16, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.gpu[0] && p.gpu[1] && !p.gpu[3] && p.why[3] == OFFLOAD_WHY_NO_GAIN);
    HM_CHECK_MSG(close_to(p.cpu_s, 0.2e-3) && close_to(p.gpu_s, 0.6e-3), "lanes %g %g",
                 p.cpu_s, p.gpu_s);
    offload_plan_free(&p);
}

/* Large and small ubatches of one layer of 8 equal experts (1e6 bytes; CPU 0.1 ms + 0.1 ms per
 * token; GPU 0.01 ms per expert besides the copy). One decode token routed to 2 experts (1 token
 * each, 0.2 ms on the CPU): all on the CPU 0.4 ms. At h2d 1e10 (0.1 ms a copy, 0.11 on the GPU
 * lane) moving one gives CPU 0.2 / GPU 0.11 -> gain; the second: CPU 0, GPU 0.22 > 0.2: no gain.
 * So even a decode step copies one expert when PCIe is that fast (the lanes overlap). At h2d
 * 1e9 (1.01 ms) nothing moves: 1.01 > 0.4.
 * A prompt ubatch of 64 tokens x 2 slots spread over all 8 (16 each): cpu 1.7 ms each, all CPU
 * 13.6 ms; at 1.01 ms per expert on the GPU, k experts there give max(1.7 (8 - k), 1.01 k):
 * k = 4 -> 6.8; k = 5 -> 5.1 / 5.05 (max 5.1); k = 6 -> 3.4 / 6.06 (max 6.06 > 5.1): no gain.
 * So 5 experts (ids 0..4: equal ratios, lower id first), lanes 5.1 / 5.05 ms. */
static void test_batch_sizes(void) {
    offload_plan p;
    hm_error err;
    HM_REQUIRE(offload_plan_init(&p, 8, &err) == HM_OK);
    offload_expert ex[8];
    for (int e = 0; e < 8; e++) ex[e] = (offload_expert){.n_tok = 0, .bytes = 1000000};
    ex[2].n_tok = ex[6].n_tok = 1;
    offload_rates r = rates(1e10);
    r.gpu_fixed_s = 0.01e-3;
    const offload_opts o = {.cap_bytes = OFFLOAD_NO_CAP};
    HM_REQUIRE(offload_decide(&p, 1, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.n_used == 2 && p.n_gpu == 1 && p.gpu[2] && !p.gpu[6]);
    HM_CHECK(p.why[6] == OFFLOAD_WHY_NO_GAIN);
    r.h2d_bytes_per_s = 1e9;
    HM_REQUIRE(offload_decide(&p, 1, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.n_gpu == 0 && p.why[2] == OFFLOAD_WHY_NO_GAIN && p.why[6] == OFFLOAD_WHY_NO_GAIN);

    for (int e = 0; e < 8; e++) ex[e].n_tok = 16;
    HM_REQUIRE(offload_decide(&p, 64, ex, &r, &o, &err) == HM_OK);
    HM_CHECK_MSG(p.n_gpu == 5, "%d on the GPU", p.n_gpu);
    for (int e = 0; e < 8; e++) HM_CHECK_MSG(p.gpu[e] == (e < 5), "expert %d", e);
    HM_CHECK_MSG(close_to(p.cpu_s, 5.1e-3) && close_to(p.gpu_s, 5.05e-3), "lanes %g %g", p.cpu_s,
                 p.gpu_s);
    HM_CHECK(close_to(p.all_cpu_s, 13.6e-3));
    offload_plan_free(&p);
}

/* Seed 003: --moe-offload-threshold 32. 31 tokens: every used expert on the CPU ("below
 * threshold"), whatever the rates; 32: every used expert on the GPU, unused ones not copied.
 * With a 1.5e6-byte buffer the used experts go in id order while they fit: e0 (1e6) yes, e1 no,
 * e3 no (1e6 more). Threshold 1 sends a one-token ubatch to the GPU. */
static void test_threshold(void) {
    offload_plan p;
    hm_error err;
    HM_REQUIRE(offload_plan_init(&p, 4, &err) == HM_OK);
    offload_expert ex[4];
    four(ex);
    const offload_rates r = rates(1e9);
    offload_opts o = {.threshold = 32, .cap_bytes = OFFLOAD_NO_CAP};
    HM_REQUIRE(offload_decide(&p, 31, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.n_gpu == 0);
    HM_CHECK(p.why[0] == OFFLOAD_WHY_THRESHOLD_LT && p.why[1] == OFFLOAD_WHY_THRESHOLD_LT &&
             p.why[3] == OFFLOAD_WHY_THRESHOLD_LT && p.why[2] == OFFLOAD_WHY_UNUSED);
    HM_REQUIRE(offload_decide(&p, 32, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.n_gpu == 3 && p.gpu[0] && p.gpu[1] && !p.gpu[2] && p.gpu[3]);
    HM_CHECK(p.why[0] == OFFLOAD_WHY_THRESHOLD_GE && p.why[2] == OFFLOAD_WHY_UNUSED);
    /* lanes: CPU 0, GPU 3.0 ms (three copies of 1 ms) */
    HM_CHECK(close_to(p.cpu_s, 0) && close_to(p.gpu_s, 3.0e-3));
    o.cap_bytes = 1500000;
    HM_REQUIRE(offload_decide(&p, 512, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.gpu[0] && !p.gpu[1] && !p.gpu[3]);
    HM_CHECK(p.why[1] == OFFLOAD_WHY_CAP && p.why[3] == OFFLOAD_WHY_CAP);
    o = (offload_opts){.threshold = 1, .cap_bytes = OFFLOAD_NO_CAP};
    ex[0].n_tok = 1;
    ex[1].n_tok = ex[3].n_tok = 0;
    HM_REQUIRE(offload_decide(&p, 1, ex, &r, &o, &err) == HM_OK);
    HM_CHECK(p.n_gpu == 1 && p.gpu[0] && p.why[0] == OFFLOAD_WHY_THRESHOLD_GE);
    offload_plan_free(&p);
}

/* No copy path (h2d 0): every used expert on the CPU, in both modes. */
static void test_no_gpu(void) {
    offload_plan p;
    hm_error err;
    HM_REQUIRE(offload_plan_init(&p, 4, &err) == HM_OK);
    offload_expert ex[4];
    four(ex);
    const offload_rates r = rates(0);
    offload_opts o = {.cap_bytes = OFFLOAD_NO_CAP};
    for (int mode = 0; mode < 2; mode++) {
        o.threshold = mode ? 1 : 0;
        HM_REQUIRE(offload_decide(&p, 512, ex, &r, &o, &err) == HM_OK);
        HM_CHECK(p.n_gpu == 0 && p.n_used == 3);
        HM_CHECK(p.why[0] == OFFLOAD_WHY_NO_GPU && p.why[2] == OFFLOAD_WHY_UNUSED);
        HM_CHECK(close_to(p.cpu_s, 3.4e-3) && p.gpu_s == 0);
    }
    offload_plan_free(&p);
}

/* Equal experts: the lower id moves first, every time. 10 tokens each on e2 and e5, copies 1 ms,
 * cpu 1.1 ms each: moving e2 gives 1.1 / 1.0 (< 2.2), then e5 gives 0 / 2.0: no gain. */
static void test_ties(void) {
    offload_plan p;
    hm_error err;
    HM_REQUIRE(offload_plan_init(&p, 6, &err) == HM_OK);
    offload_expert ex[6];
    for (int e = 0; e < 6; e++) ex[e] = (offload_expert){.n_tok = 0, .bytes = 1000000};
    ex[5].n_tok = ex[2].n_tok = 10;
    const offload_rates r = rates(1e9);
    const offload_opts o = {.cap_bytes = OFFLOAD_NO_CAP};
    for (int rep = 0; rep < 3; rep++) {
        HM_REQUIRE(offload_decide(&p, 10, ex, &r, &o, &err) == HM_OK);
        HM_CHECK(p.gpu[2] == 1 && p.gpu[5] == 0 && p.why[5] == OFFLOAD_WHY_NO_GAIN);
    }
    offload_plan_free(&p);
}

static void test_bad_input(void) {
    offload_plan p;
    hm_error err;
    HM_CHECK(offload_plan_init(&p, 0, &err) == HM_ERR_ARG);
    HM_REQUIRE(offload_plan_init(&p, 4, &err) == HM_OK);
    offload_expert ex[4];
    four(ex);
    offload_rates r = rates(1e9);
    const offload_opts o = {.cap_bytes = OFFLOAD_NO_CAP};
    r.cpu_tok_s_per_byte = -1;
    HM_CHECK(offload_decide(&p, 4, ex, &r, &o, &err) == HM_ERR_ARG);
    HM_CHECK(strstr(err.msg, "rates") != NULL);
    r = rates(NAN);
    HM_CHECK(offload_decide(&p, 4, ex, &r, &o, &err) == HM_ERR_ARG);
    r = rates(INFINITY);
    HM_CHECK(offload_decide(&p, 4, ex, &r, &o, &err) == HM_ERR_ARG);
    r = rates(1e9);
    ex[1].n_tok = -3;
    HM_CHECK(offload_decide(&p, 4, ex, &r, &o, &err) == HM_ERR_ARG);
    HM_CHECK(strstr(err.msg, "expert 1") != NULL);
    ex[1].n_tok = 3;
    HM_CHECK(offload_decide(&p, -1, ex, &r, &o, &err) == HM_ERR_ARG);
    const offload_opts neg = {.threshold = -2, .cap_bytes = OFFLOAD_NO_CAP};
    HM_CHECK(offload_decide(&p, 4, ex, &r, &neg, &err) == HM_ERR_ARG);
    offload_plan_free(&p);
    offload_plan_free(&p); /* twice: zeroed */
    offload_plan_free(NULL);
}

/* The debug text: the layer line and one line per (lane, cause) with id:tokens; the length
 * returned is the text's whatever the buffer (snprintf's rule). */
static void test_format(void) {
    offload_plan p;
    hm_error err;
    HM_REQUIRE(offload_plan_init(&p, 4, &err) == HM_OK);
    offload_expert ex[4];
    four(ex);
    const offload_rates r = rates(1e9);
    const offload_opts o = {.cap_bytes = OFFLOAD_NO_CAP};
    HM_REQUIRE(offload_decide(&p, 16, ex, &r, &o, &err) == HM_OK);
    char buf[1024];
    const size_t n = offload_plan_format(&p, 7, ex, buf, sizeof(buf));
    HM_CHECK(n == strlen(buf));
    HM_CHECK_MSG(strstr(buf, "sched layer 7: ubatch 16 tok, cost model: 3/4 experts used, 1 GPU")
                     != NULL, "%s", buf);
    HM_CHECK_MSG(strstr(buf, "\n  GPU gain: 0:20\n") != NULL, "%s", buf);
    HM_CHECK_MSG(strstr(buf, "\n  CPU no gain: 1:10 3:1\n") != NULL, "%s", buf);
    HM_CHECK(strstr(buf, "2:0") == NULL); /* unused experts are not listed */
    char small[16];
    HM_CHECK(offload_plan_format(&p, 7, ex, small, sizeof(small)) == n);
    HM_CHECK(strlen(small) == sizeof(small) - 1 && !strncmp(small, buf, sizeof(small) - 1));
    HM_CHECK(offload_plan_format(&p, 7, ex, NULL, 0) == n);
    const offload_opts th = {.threshold = 8, .cap_bytes = OFFLOAD_NO_CAP};
    HM_REQUIRE(offload_decide(&p, 16, ex, &r, &th, &err) == HM_OK);
    offload_plan_format(&p, 7, ex, buf, sizeof(buf));
    HM_CHECK_MSG(strstr(buf, "--moe-offload-threshold 8") != NULL, "%s", buf);
    HM_CHECK_MSG(strstr(buf, "  GPU threshold: 0:20 1:10 3:1\n") != NULL, "%s", buf);
    offload_plan_free(&p);

    setenv("HOTMOE_SCHED_DEBUG", "1", 1);
    HM_CHECK(offload_debug_env());
    setenv("HOTMOE_SCHED_DEBUG", "0", 1);
    HM_CHECK(!offload_debug_env());
    unsetenv("HOTMOE_SCHED_DEBUG");
    HM_CHECK(!offload_debug_env());
}

static void test_count_tokens(void) {
    const int32_t ids[4][2] = {{0, 3}, {3, 1}, {-1, 3}, {9, 0}}; /* 9: out of range */
    int32_t c[4] = {7, 7, 7, 7};
    offload_count_tokens(&ids[0][0], 4, 2, 4, c);
    HM_CHECK(c[0] == 2 && c[1] == 1 && c[2] == 0 && c[3] == 3);
}

/* Ranges of a forged model: gate, up, down and three biases per expert (gpt-oss), consecutive
 * experts one stride apart, inside the span, the size their sum (rounded as asked). */
static void test_model_ranges(void) {
    char path[512];
    HM_REQUIRE(ft_forged("offload", "tiny-gpt-oss", FORGE_MIX_Q8_0, path, sizeof(path)));
    hm_model *m = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &m, &err) == HM_OK);
    const hm_hparams *hp = hm_model_hparams(m);
    const void *span;
    size_t span_n;
    HM_REQUIRE(offload_expert_span(m, &span, &span_n));
    const uintptr_t lo = (uintptr_t)span, hi = lo + span_n;
    for (int il = 0; il < hp->n_layer; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        const size_t gate = L->gate_exps.row_size * (size_t)hp->n_ff_exp;
        const size_t down = L->down_exps.row_size * (size_t)hp->n_embd;
        uint64_t sum = 0, sum256 = 0;
        for (int e = 0; e < hp->n_expert; e++) {
            offload_range rg[OFFLOAD_MAX_RANGES];
            const int n = offload_expert_ranges(m, il, e, rg);
            HM_REQUIRE(n == 6);
            HM_CHECK(rg[0].p == (const uint8_t *)L->gate_exps.data + (size_t)e * gate);
            HM_CHECK(rg[0].n == gate && rg[1].n == gate && rg[2].n == down);
            HM_CHECK(rg[2].p == (const uint8_t *)L->down_exps.data + (size_t)e * down);
            HM_CHECK(rg[5].p == (const uint8_t *)L->down_exps_b.data + (size_t)e * 4 * hp->n_embd);
            uint64_t s = 0, s256 = 0;
            for (int i = 0; i < n; i++) {
                HM_CHECK((uintptr_t)rg[i].p >= lo && (uintptr_t)rg[i].p + rg[i].n <= hi);
                s += rg[i].n;
                s256 += (rg[i].n + 255) / 256 * 256;
            }
            if (e == 0) {
                sum = s;
                sum256 = s256;
            }
        }
        HM_CHECK(offload_expert_size(m, il, 1) == sum);
        HM_CHECK(offload_expert_size(m, il, 256) == sum256 && sum256 >= sum);
    }
    offload_range rg[OFFLOAD_MAX_RANGES];
    HM_CHECK(offload_expert_ranges(m, 0, (int)hp->n_expert, rg) == 0);
    HM_CHECK(offload_expert_ranges(m, -1, 0, rg) == 0);
    HM_CHECK(offload_expert_size(m, (int)hp->n_layer, 1) == 0);
    hm_model_free(m);
}

HM_TEST_MAIN(test_cost_model, test_cap, test_copied, test_gpu_costs, test_batch_sizes, test_threshold,
             test_no_gpu, test_ties, test_bad_input, test_format, test_count_tokens,
             test_model_ranges)
