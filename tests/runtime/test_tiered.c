/* test_tiered.c - the CPU side of the tiered step (runtime/tiered.h) and its hand-off protocol
 * (cuda/cuda_handoff.h), with ordinary host memory standing in for the mapped memory and the
 * test thread playing the GPU: it writes a request (rows, ids, gating weights, the message),
 * stores ready = seq (release) and waits for done == seq (acquire) or abort.
 *
 * Checked on tiny forged models (qwen3moe q8_0: no expert biases; gpt-oss q4_k_m: biases and
 * the OAI activation):
 *  - every answer equals the executor's CPU lane run directly on the same request (bytes), for
 *    1..8 tokens, host layers = every MoE layer and then the odd ones, over many steps; the
 *    counters count requests and tokens;
 *  - a malformed message (wrong layer, too many tokens), an expert id out of range and the
 *    injected failure each end in: no answer, the abort word set, a fault counted and
 *    hm_tiered_check naming it; the next request is not served; hm_tiered_reset serves again
 *    (and the answer is right);
 *  - hm_tiered_abort while idle sets abort and is reported; the stall hook leaves a request
 *    unanswered without abort (the GPU's timeout is what ends such a wait); reset recovers;
 *  - hm_tiered_free with a request pending returns (abort set), nothing hangs (alarm);
 *  - views that do not fit the model are refused (HM_ERR_ARG);
 *  - the hot cache's controller (mixed layers: hot slots posted as -2 - id): lru admissions,
 *    at most one per layer per step, and updates by the window's scores, handed to the exchange
 *    callback; the answers stay the CPU lane's; the counters add up; the layer perf file
 *    (hm_tiered_perf_write) reads back through the learn file's reader with the posted split.
 */
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../forge/forge_test_util.h"
#include "harness.h"
#include "moe/learn_file.h"
#include "moe/moe_exec.h"
#include "runtime/tiered.h"
#define TIERED_TEST_TAG "tiered"
#include "tiered_test_util.h"

static void check_answers(const char *preset, forge_mix mix) {
    hm_model *m = load(preset, mix);
    HM_REQUIRE(m);
    for (int odd = 0; odd < 2; odd++) {
        fake_gpu g;
        hm_tiered *t = start(m, &g, odd);
        HM_REQUIRE(t);
        hm_error err;
        uint64_t toks = 0, reqs = 0;
        for (int step = 0; step < 24; step++) {
            const int n = 1 + step % NT_MAX;
            for (int j = 0; j < g.v.n_host; j++) {
                HM_CHECK_MSG(round_trip(&g, j, n), "%s %s: step %d layer %d (%d tokens)", preset,
                             forge_mix_name(mix), step, g.v.host_layers[j], n);
                toks += (uint64_t)n;
                reqs++;
            }
        }
        hm_tiered_stats s;
        hm_tiered_get_stats(t, &s);
        HM_CHECK(s.requests == reqs && s.tokens == toks && s.faults == 0 && s.aborts == 0);
        HM_CHECK(hm_tiered_check(t, &err) == HM_OK);
        hm_tiered_free(t);
        HM_CHECK(g.v.ctl->abort != 0); /* free released any waiter */
        fake_free(&g);
    }
    hm_model_free(m);
}

static void test_answers_equal_cpu_lane(void) {
    check_answers("tiny-qwen3moe", FORGE_MIX_Q8_0);
    check_answers("tiny-gpt-oss", FORGE_MIX_Q4_K_M);
}

/* A fault: no answer, abort set, counted, named; the next request not served; reset recovers. */
static void expect_fault(hm_tiered *t, fake_gpu *g, uint32_t seq, int L, const char *what,
                         uint64_t faults_before) {
    hm_error err;
    HM_CHECK_MSG(wait_answer(g, L, seq, 30.0) == 0, "%s: no abort", what);
    HM_CHECK(g->v.flags[L].done != seq);
    hm_tiered_stats s;
    hm_tiered_get_stats(t, &s);
    HM_CHECK_MSG(s.faults == faults_before + 1, "%s: %llu faults", what,
                 (unsigned long long)s.faults);
    HM_CHECK_MSG(hm_tiered_check(t, &err) == HM_ERR_STATE && strstr(err.msg, what), "%s: '%s'",
                 what, err.msg);
    /* aborted: a new request is not served */
    const int L0 = g->v.host_layers[0];
    uint32_t s2 = post(g, L0, 1, (uint32_t)L0, 1, 0);
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    HM_CHECK_MSG(__atomic_load_n(&g->v.flags[L0].done, __ATOMIC_ACQUIRE) != s2,
                 "%s: served while aborted", what);
    HM_CHECK(hm_tiered_reset(t, &err) == HM_OK);
    HM_CHECK(g->v.ctl->abort == 0 && g->v.flags[L0].done == g->v.flags[L0].ready);
    HM_CHECK(hm_tiered_check(t, &err) == HM_OK);
    HM_CHECK_MSG(round_trip(g, 0, 3) && round_trip(g, g->v.n_host - 1, 8), "%s: after reset",
                 what);
}

static void test_faults(void) {
    alarm(600); /* a hang is a failure, not a stuck test */
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q8_0);
    HM_REQUIRE(m);
    fake_gpu g;
    HM_REQUIRE(fake_init(&g, m, false));
    hm_tiered_params tp = hm_tiered_default_params();
    tp.n_threads = 2;
    tp.fail_after = 5;
    hm_tiered *t = NULL;
    hm_error err;
    HM_REQUIRE(hm_tiered_init_view(m, &g.v, &tp, &t, &err) == HM_OK);
    HM_CHECK(g.v.ctl->timeout_ns == 20000ull * 1000000ull || getenv("HOTMOE_TIERED_TIMEOUT_MS"));
    const int L0 = g.v.host_layers[0];
    /* the injected failure: the 6th request */
    for (int i = 0; i < 5; i++) HM_CHECK(round_trip(&g, i % g.v.n_host, 2));
    uint32_t s = post(&g, L0, 2, (uint32_t)L0, 2, 0);
    expect_fault(t, &g, s, L0, "test hook", 0);
    /* a message naming another layer */
    s = post(&g, L0, 1, (uint32_t)L0 + 1, 1, 0);
    expect_fault(t, &g, s, L0, "malformed", 1);
    /* more tokens than the area holds */
    s = post(&g, L0, 1, (uint32_t)L0, NT_MAX + 1, 0);
    expect_fault(t, &g, s, L0, "malformed", 2);
    /* an expert id out of range */
    s = post(&g, L0, 2, (uint32_t)L0, 2, (int)g.v.n_expert);
    expect_fault(t, &g, s, L0, "expert id", 3);
    /* the caller's abort while idle */
    hm_tiered_abort(t, "unit test");
    HM_CHECK(g.v.ctl->abort == CUDA_HANDOFF_ABORT_HOST);
    HM_CHECK(hm_tiered_check(t, &err) == HM_ERR_STATE && strstr(err.msg, "unit test"));
    HM_CHECK(hm_tiered_reset(t, &err) == HM_OK && round_trip(&g, 0, 1));
    hm_tiered_stats st;
    hm_tiered_get_stats(t, &st);
    HM_CHECK(st.faults == 4 && st.aborts == 5 && st.resets == 5);
    hm_tiered_free(t);
    fake_free(&g);

    /* the stall hook: the request stays unanswered, abort stays clear (the GPU's timeout ends
     * such a wait); reset recovers; free with a request pending returns */
    HM_REQUIRE(fake_init(&g, m, true));
    tp.fail_after = 0;
    tp.stall_after = 3;
    HM_REQUIRE(hm_tiered_init_view(m, &g.v, &tp, &t, &err) == HM_OK);
    for (int i = 0; i < 3; i++) HM_CHECK(round_trip(&g, i % g.v.n_host, 1));
    const int L1 = g.v.host_layers[0];
    s = post(&g, L1, 1, (uint32_t)L1, 1, 0);
    HM_CHECK(wait_answer(&g, L1, s, 0.2) == -1);
    HM_CHECK(g.v.ctl->abort == 0);
    HM_CHECK(hm_tiered_reset(t, &err) == HM_OK && round_trip(&g, 0, 4));
    s = post(&g, L1, 1, (uint32_t)L1, 1, 0);
    HM_CHECK(wait_answer(&g, L1, s, 30.0) == 1 && answer_ok(&g, L1, 1));
    /* pending at free: a stalled worker again */
    hm_tiered_free(t);
    tp.stall_after = 1;
    HM_REQUIRE(hm_tiered_init_view(m, &g.v, &tp, &t, &err) == HM_OK);
    HM_CHECK(g.v.ctl->abort == 0); /* init starts clean */
    HM_CHECK(round_trip(&g, 0, 1));
    s = post(&g, L1, 1, (uint32_t)L1, 1, 0);
    HM_CHECK(wait_answer(&g, L1, s, 0.1) == -1);
    const double t0 = now_s();
    hm_tiered_free(t);
    HM_CHECK(now_s() - t0 < 5.0);
    HM_CHECK(wait_answer(&g, L1, s, 1.0) == 0); /* the "GPU" is released */
    fake_free(&g);
    alarm(0);
    hm_model_free(m);
}

/* Requests posted with msg.fetch (prompt ubatches of the fetched-expert path) on a view: no copy
 * lane and no staging layout, so every used expert stays on the CPU ("no GPU"): the answer is
 * the CPU lane's bytes, fslot is -1 everywhere, the counters count the request and its used
 * experts; HOTMOE_SCHED_DEBUG's text (hm_tiered_offload.debug) names the layer, the ubatch, the
 * rule and the experts with their tokens; a negative threshold or rate is refused. */
static void test_fetch_requests_without_lane(void) {
    alarm(600);
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q8_0);
    HM_REQUIRE(m);
    fake_gpu g;
    hm_tiered *t = start(m, &g, false);
    HM_REQUIRE(t);
    hm_error err;
    hm_tiered_offload o = {.lane = NULL, .rates = NULL, .threshold = -1, .debug = true};
    HM_CHECK(hm_tiered_set_offload(t, &o, &err) == HM_ERR_ARG &&
             strstr(err.msg, "--moe-offload-threshold"));
    const int nl = (int)hm_model_hparams(m)->n_layer;
    offload_rates *bad = calloc((size_t)nl, sizeof(*bad));
    HM_REQUIRE(bad);
    bad[nl - 1].gpu_tok_s = -1;
    o.threshold = 4;
    o.rates = bad;
    HM_CHECK(hm_tiered_set_offload(t, &o, &err) == HM_ERR_ARG && strstr(err.msg, "rates"));
    free(bad);
    o.rates = NULL;
    HM_REQUIRE(hm_tiered_set_offload(t, &o, &err) == HM_OK);
    const int L = g.v.host_layers[0], K = g.v.n_used, n = NT_MAX;
    for (int i = 0; i < n * K; i++) g.v.fslot[i] = 1234; /* must be overwritten */
    g.v.msg->fetch = 1;
    hm_t_log lc;
    hm_t_log_begin(&lc);
    const uint32_t seq = post(&g, L, n, (uint32_t)L, (uint32_t)n, 0);
    const int r = wait_answer(&g, L, seq, 30.0);
    char *log = hm_t_log_end(&lc);
    g.v.msg->fetch = 0;
    HM_CHECK(r == 1 && answer_ok(&g, L, n));
    bool all_cpu = true;
    for (int i = 0; i < n * K; i++) all_cpu = all_cpu && g.v.fslot[i] == -1;
    HM_CHECK(all_cpu);
    int32_t counts[256];
    HM_REQUIRE(g.v.n_expert <= 256);
    memset(counts, 0, sizeof(counts));
    int used = 0;
    for (int i = 0; i < n * K; i++) used += counts[g.v.ids[i]]++ == 0;
    hm_tiered_stats s;
    hm_tiered_get_stats(t, &s);
    HM_CHECK_MSG(s.fetch_requests == 1 && s.gpu_experts == 0 && s.cpu_experts == (uint64_t)used &&
                     s.fetched_bytes == 0,
                 "fetch %llu gpu %llu cpu %llu (used %d)", (unsigned long long)s.fetch_requests,
                 (unsigned long long)s.gpu_experts, (unsigned long long)s.cpu_experts, used);
    char head[160];
    snprintf(head, sizeof(head), "sched layer %d: ubatch %d tok, --moe-offload-threshold 4", L, n);
    HM_CHECK_MSG(log && strstr(log, head) && strstr(log, "CPU no GPU:"), "%s", log ? log : "");
    /* every used expert listed with its tokens */
    for (int x = 0; log && x < (int)g.v.n_expert; x++) {
        if (!counts[x]) continue;
        char item[32];
        snprintf(item, sizeof(item), " %d:%d", x, counts[x]);
        HM_CHECK_MSG(strstr(log, item), "expert %s missing in: %s", item, log);
    }
    free(log);
    /* a request without fetch after it: served as before */
    HM_CHECK(round_trip(&g, 0, 3));
    hm_tiered_free(t);
    fake_free(&g);
    hm_model_free(m);
}

static void test_bad_views(void) {
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q8_0);
    HM_REQUIRE(m);
    fake_gpu g;
    HM_REQUIRE(fake_init(&g, m, false));
    hm_tiered *t = NULL;
    hm_error err;
    hm_tiered_params tp = hm_tiered_default_params();
    tp.n_threads = 1;
    cuda_handoff_view v = g.v;
    v.n_embd++;
    HM_CHECK(hm_tiered_init_view(m, &v, &tp, &t, &err) == HM_ERR_ARG && !t);
    v = g.v;
    v.n_host = 0;
    HM_CHECK(hm_tiered_init_view(m, &v, &tp, &t, &err) == HM_ERR_ARG && !t);
    int32_t rev[2] = {1, 0};
    v = g.v;
    v.host_layers = rev;
    v.n_host = 2;
    HM_CHECK(hm_tiered_init_view(m, &v, &tp, &t, &err) == HM_ERR_ARG && !t);
    v = g.v;
    tp.n_threads = -1;
    HM_CHECK(hm_tiered_init_view(m, &v, &tp, &t, &err) == HM_ERR_ARG && !t);
    HM_CHECK(hm_tiered_init(m, NULL, &tp, &t, &err) == HM_ERR_ARG && !t);
    hm_tiered_free(NULL);
    fake_free(&g);
    hm_model_free(m);
}

/* ---- the hot cache's controller (runtime/tiered_hot.c) ---- */

typedef struct {
    int n;
    hot_exchange x[4096];
} exchange_log;

static hm_status log_exchange(void *user, int il, int out, int in, hm_error *err) {
    (void)err;
    exchange_log *l = user;
    if (l->n < 4096) l->x[l->n++] = (hot_exchange){il, out, in, 0.0};
    return HM_OK;
}

/* A request of layer L in step seq as a mixed layer's: random ids, the hot ones (hot map)
 * posted as -2 - id. */
/* A request of n tokens with random ids, skewed when fav: every token also selects experts 1
 * and 3 (cold: odd), in its first slots unless it has them already. */
static void post_mixed(fake_gpu *g, const uint8_t *hot, int L, uint32_t seq, int n, bool fav) {
    fill_request(g, n, 0);
    const cuda_handoff_view *v = &g->v;
    const int K = v->n_used, NE = (int)v->n_expert;
    for (int t = 0; t < n && fav; t++)
        for (int f = 0; f < 2; f++) {
            int32_t *ids = v->ids + t * K;
            bool has = false;
            for (int s = 0; s < K; s++) has = has || ids[s] == 1 + 2 * f;
            for (int s = 0; s < K && !has; s++) /* a slot not holding the other favourite */
                if (ids[s] != 1 && ids[s] != 3) ids[s] = 1 + 2 * f, has = true;
        }
    for (int i = 0; i < n * K; i++)
        if (hot[(size_t)L * (size_t)NE + (size_t)v->ids[i]]) v->ids[i] = -2 - v->ids[i];
    publish(g, L, seq, (uint32_t)L, (uint32_t)n);
}

/* Mixed layers (even experts hot): lru admits misses into unused hot experts' slots, at most one
 * per layer per step, every admission names a hot victim and a missed expert; the answers stay
 * the CPU lane's on the posted ids (hot slots skipped); the counters add up. Then a static cache
 * with updates every 12 tokens at rate 0.5 exchanges slots by the window's scores, the routing
 * skewed (two cold experts in every token) so that they stand out from chance. */
static void test_hot_controller(void) {
    alarm(600);
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q8_0);
    HM_REQUIRE(m);
    const hm_hparams *hp = hm_model_hparams(m);
    const int NL = (int)hp->n_layer, NE = (int)hp->n_expert, K = (int)hp->n_expert_used;
    uint8_t *hot = calloc((size_t)NL * (size_t)NE, 1);
    exchange_log *lg = calloc(1, sizeof(*lg));
    HM_REQUIRE(hot && lg);
    for (int il = 0; il < NL; il++)
        for (int e = 0; e < NE; e += 2) hot[(size_t)il * (size_t)NE + (size_t)e] = 1;
    for (int mode = 0; mode < 2; mode++) {
        fake_gpu g;
        hm_tiered *t = start(m, &g, false);
        HM_REQUIRE(t);
        hm_error err;
        hm_tiered_hot_cfg hc = {.policy = mode ? HOT_POLICY_STATIC : HOT_POLICY_LRU,
                                .admit_per_step = 1, .decay = 0.9,
                                .update_rate = mode ? 0.5 : 0.0, .update_interval = 12,
                                .weight = hot_weight_default()};
        lg->n = 0;
        HM_REQUIRE(hm_tiered_set_hot(t, &hc, hot, log_exchange, lg, &err) == HM_OK);
        HM_REQUIRE(hm_tiered_perf_enable(t, &err) == HM_OK);
        uint64_t posted_hot = 0, posted_cold = 0;
        hc.update_rate = 1.5;
        HM_CHECK(hm_tiered_set_hot(t, &hc, hot, log_exchange, lg, &err) ==
                 HM_ERR_ARG);
        /* the map a static cache gives without a controller: a missing one is refused */
        HM_CHECK(hm_tiered_set_hot_map(t, NULL, &err) == HM_ERR_ARG);
        HM_CHECK(hm_tiered_set_hot_map(t, hot, &err) == HM_OK);
        uint64_t sel = 0;
        bool ok = true;
        const uint32_t steps = mode ? 24 : 12;
        for (uint32_t step = 1; step <= steps && ok; step++)
            for (int j = 0; j < g.v.n_host && ok; j++) {
                const int L = g.v.host_layers[j];
                post_mixed(&g, hot, L, step, 1, mode == 1);
                for (int i = 0; i < K; i++) {
                    posted_hot += g.v.ids[i] <= -2;
                    posted_cold += g.v.ids[i] >= 0;
                }
                ok = wait_answer(&g, L, step, 30.0) == 1 && answer_ok(&g, L, 1);
                sel += (uint64_t)K;
            }
        HM_CHECK_MSG(ok, "%s: a request went unanswered or wrong", mode ? "updates" : "lru");
        /* the layer perf file: the learn schema's reader takes it; the split is what was posted */
        char pf[64];
        snprintf(pf, sizeof(pf), "/tmp/hotmoe_perf_%d.json", (int)getpid());
        HM_CHECK_MSG(hm_tiered_perf_write(t, pf, "qwen3moe", NULL, &err) == HM_OK, "%s", err.msg);
        moe_learn l;
        if (moe_learn_load(pf, &l, &err) == HM_OK) {
            uint64_t h = 0, c = 0, calls = 0;
            for (int il = 0; il < l.n_layer; il++) {
                calls += l.layers[il].calls;
                if (!l.layers[il].has_branch_counts) continue;
                for (int e = 0; e < l.n_expert; e++) {
                    h += l.layers[il].hot_experts[e];
                    c += l.layers[il].cold_experts[e];
                }
            }
            HM_CHECK_MSG(h == posted_hot && c == posted_cold &&
                             calls == steps * (uint64_t)g.v.n_host,
                         "perf file: hot %llu (%llu), cold %llu (%llu), calls %llu",
                         (unsigned long long)h, (unsigned long long)posted_hot,
                         (unsigned long long)c, (unsigned long long)posted_cold,
                         (unsigned long long)calls);
            moe_learn_free(&l);
        } else {
            HM_CHECK_MSG(false, "perf file: %s", err.msg);
        }
        remove(pf);
        /* parks the worker: the last step's admissions, decided after its last answer, are
         * handed over before the counts are read */
        HM_CHECK(hm_tiered_perf_disable(t) == HM_OK);
        hm_tiered_stats s;
        hm_tiered_get_stats(t, &s);
        hm_tiered_free(t); /* the worker stopped: the log is ours */
        HM_CHECK_MSG(s.hot_hits + s.hot_misses == sel, "%llu + %llu selections of %llu",
                     (unsigned long long)s.hot_hits, (unsigned long long)s.hot_misses,
                     (unsigned long long)sel);
        HM_CHECK(lg->n > 0 && s.hot_exchanged == (uint64_t)lg->n && s.hot_refused == 0);
        if (mode == 0) {
            HM_CHECK(s.hot_admitted == (uint64_t)lg->n && s.hot_updates == 0);
            for (int i = 0; i < lg->n; i++)
                HM_CHECK_MSG(lg->x[i].out != lg->x[i].in && lg->x[i].out >= 0 &&
                                 lg->x[i].out < NE && lg->x[i].in >= 0 && lg->x[i].in < NE,
                             "admission %d: %d -> %d", i, lg->x[i].out, lg->x[i].in);
            HM_CHECK(lg->n <= 12 * g.v.n_host); /* at most one per layer per step */
        } else {
            HM_CHECK_MSG(s.hot_admitted == 0 && s.hot_updates >= 2, "admitted %llu, updates "
                         "%llu", (unsigned long long)s.hot_admitted,
                         (unsigned long long)s.hot_updates);
        }
        fake_free(&g);
    }
    free(hot);
    free(lg);
    hm_model_free(m);
}

/* A manual apply (seed 001's POST /moe-hot-cache): with even experts hot and a file that scores
 * only the odd ones, every hot slot of the mixed layers goes to an odd expert (rate 1); a file
 * of another shape and an object without a controller are refused. */
static void test_hot_apply(void) {
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q8_0);
    HM_REQUIRE(m);
    const hm_hparams *hp = hm_model_hparams(m);
    const int NL = (int)hp->n_layer, NE = (int)hp->n_expert;
    uint8_t *hot = calloc((size_t)NL * (size_t)NE, 1);
    exchange_log *lg = calloc(1, sizeof(*lg));
    uint64_t *counts = calloc((size_t)NL * (size_t)NE, sizeof(uint64_t));
    moe_learn_layer *ly = calloc((size_t)NL, sizeof(*ly));
    HM_REQUIRE(hot && lg && counts && ly);
    for (int il = 0; il < NL; il++) {
        for (int e = 0; e < NE; e++) {
            hot[(size_t)il * (size_t)NE + (size_t)e] = e % 2 == 0;
            counts[(size_t)il * (size_t)NE + (size_t)e] = e % 2 ? 10u + (uint64_t)e : 0u;
        }
        ly[il] = (moe_learn_layer){.calls = 1, .tokens = 100,
                                   .experts = counts + (size_t)il * (size_t)NE};
    }
    const moe_learn l = {.n_layer = NL, .n_expert = NE, .n_expert_used = (int)hp->n_expert_used,
                         .layers = ly};
    fake_gpu g;
    hm_tiered *t = start(m, &g, false);
    HM_REQUIRE(t);
    hm_error err;
    hot_update_stats st;
    HM_CHECK(hm_tiered_hot_apply(t, &l, &st, &err) == HM_ERR_STATE); /* no controller yet */
    const hm_tiered_hot_cfg hc = {.policy = HOT_POLICY_STATIC, .admit_per_step = 1,
                                  .decay = 0.9, .update_rate = 0.0, .update_interval = 256,
                                  .weight = hot_weight_default()};
    HM_REQUIRE(hm_tiered_set_hot(t, &hc, hot, log_exchange, lg, &err) == HM_OK);
    HM_CHECK_MSG(hm_tiered_hot_apply(t, &l, &st, &err) == HM_OK, "%s", err.msg);
    const int want = NL * (NE / 2);
    HM_CHECK_MSG(lg->n == want && st.exchanged == want && st.max_exchange == want,
                 "%d exchanges (want %d), stats %d of %d", lg->n, want, st.exchanged,
                 st.max_exchange);
    for (int i = 0; i < lg->n; i++)
        HM_CHECK_MSG(lg->x[i].out % 2 == 0 && lg->x[i].in % 2 == 1, "exchange %d: %d -> %d", i,
                     lg->x[i].out, lg->x[i].in);
    const moe_learn other = {.n_layer = NL, .n_expert = NE + 1, .layers = ly};
    HM_CHECK(hm_tiered_hot_apply(t, &other, &st, &err) == HM_ERR_ARG);
    hm_tiered_free(t);
    fake_free(&g);
    free(hot);
    free(lg);
    free(counts);
    free(ly);
    hm_model_free(m);
}

HM_TEST_MAIN(test_answers_equal_cpu_lane, test_faults, test_fetch_requests_without_lane,
             test_bad_views, test_hot_controller, test_hot_apply)
