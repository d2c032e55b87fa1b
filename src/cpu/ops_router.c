/* ops_router.c - MoE gating: softmax then top-k (qwen3moe, mixtral, olmoe, qwen2moe) and top-k
 * then softmax (gpt-oss).
 *
 * DESIGN: one token at a time (tokens split across the pool when there are many). Top-k is an
 * insertion into a k-long list kept in descending score order while experts are visited in
 * increasing id; an expert enters only with a strictly greater score than the list's last, so
 * on equal scores the lower id stays ahead: deterministic, and the same rule a GPU version can
 * implement as a sort by (score desc, id asc). Softmax: max subtracted, hm_expf (8 lanes at a
 * time with AVX2, the same bits), float sum in the documented order, then one division per
 * value.
 */
#include "cpu/ops.h"

#include <math.h>
#include <stdlib.h>

#include "base/cpu.h"
#include "cpu/ops_internal.h"
#include "cpu/ops_math.h"

#define ROUTER_MAX_EXPERTS 4096

typedef struct {
    const float *logits, *bias;
    int64_t n_tok;
    int n_expert, k;
    cpu_gate_mode mode;
    int renorm;
    int32_t *ids;
    float *weights;
    int simd; /* hm_cpu_has_avx2(): the exps by ops_exp_sub_avx2 */
} router_job;

/* Top-k of sc[0..n) into ids/val (descending, ties: lower id first). */
static void topk(const float *sc, int n, int k, int32_t *ids, float *val) {
    int cnt = 0;
    for (int e = 0; e < n; e++) {
        float s = sc[e];
        if (cnt == k && !(s > val[k - 1])) continue;
        int i = cnt < k ? cnt++ : k - 1;
        while (i > 0 && s > val[i - 1]) {
            val[i] = val[i - 1];
            ids[i] = ids[i - 1];
            i--;
        }
        val[i] = s;
        ids[i] = e;
    }
}

static void router_token(const router_job *j, int64_t t, float *sc /* [n_expert] */) {
    const int n = j->n_expert, k = j->k;
    const float *l = j->logits + t * n;
    int32_t *ids = j->ids + t * k;
    float *w = j->weights + t * k;
    for (int e = 0; e < n; e++) sc[e] = j->bias ? l[e] + j->bias[e] : l[e];
    if (j->mode == CPU_GATE_SOFTMAX_TOPK) {
        float m = -INFINITY;
        for (int e = 0; e < n; e++)
            if (sc[e] > m) m = sc[e];
        if (j->simd) ops_exp_sub_avx2(sc, n, m); /* the same bits, 8 at a time */
        else
            for (int e = 0; e < n; e++) sc[e] = hm_expf(sc[e] - m);
        float sum = 0.0f;
        for (int e = 0; e < n; e++) sum = sum + sc[e];
        for (int e = 0; e < n; e++) sc[e] = sc[e] / sum;
        topk(sc, n, k, ids, w);
        if (j->renorm) {
            float s = 0.0f;
            for (int i = 0; i < k; i++) s = s + w[i];
            for (int i = 0; i < k; i++) w[i] = w[i] / s;
        }
    } else {
        topk(sc, n, k, ids, w);
        const float m = w[0];
        float sum = 0.0f;
        for (int i = 0; i < k; i++) {
            w[i] = hm_expf(w[i] - m);
            sum = sum + w[i];
        }
        for (int i = 0; i < k; i++) w[i] = w[i] / sum;
    }
}

static void router_worker(void *ctx, int ith, int nth) {
    const router_job *j = ctx;
    float sc[ROUTER_MAX_EXPERTS];
    int64_t t0, t1;
    ops_split(j->n_tok, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) router_token(j, t, sc);
}

hm_status cpu_router(tp_pool *pool, const float *logits, const float *bias, int64_t n_tok,
                     int n_expert, int k, cpu_gate_mode mode, int renorm, int32_t *ids,
                     float *weights, hm_error *err) {
    if (n_expert < 1 || n_expert > ROUTER_MAX_EXPERTS || k < 1 || k > n_expert)
        return hm_error_set(err, HM_ERR_ARG, "router: need 1 <= k (%d) <= n_expert (%d) <= %d", k,
                            n_expert, ROUTER_MAX_EXPERTS);
    if (mode != CPU_GATE_SOFTMAX_TOPK && mode != CPU_GATE_TOPK_SOFTMAX)
        return hm_error_set(err, HM_ERR_ARG, "router: unknown gating mode %d", (int)mode);
    if (n_tok <= 0) return HM_OK;
    for (int64_t i = 0; i < n_tok * n_expert; i++)
        if (isnan(logits[i]))
            return hm_error_set(err, HM_ERR_RANGE, "router: logit of token %lld, expert %lld is NaN",
                                (long long)(i / n_expert), (long long)(i % n_expert));
    router_job j = {logits, bias, n_tok, n_expert, k, mode, renorm, ids, weights, hm_cpu_has_avx2()};
    ops_run(pool, router_worker, &j, n_tok * n_expert, 65536);
    return HM_OK;
}
