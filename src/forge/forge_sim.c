/* forge_sim.c - what an expert cache would hit on a forged model: a simulation.
 *
 * DESIGN: draws unit-Gaussian hidden states (as RMS-normalised inputs look to the router),
 * computes every layer's router logits from the forged router weights (and bias), takes the
 * top-k, counts how often each expert is chosen, and reports the share of selections that fall
 * on the N most chosen experts of each layer — the hit rate of a cache holding those N experts
 * per layer. Gaussian inputs are an assumption; real hidden states are not Gaussian.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forge/forge.h"

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

hm_status forge_sim_hits(const forge_preset *p, const forge_gen *g, int n_samples,
                         const int *cache_n, int n_cache, double *hit, hm_error *err) {
    const int64_t E = p->n_embd, X = p->n_expert, K = p->n_expert_used;
    float *w = malloc((size_t)(E * X) * sizeof(float));
    float *bias = calloc((size_t)X, sizeof(float));
    float *x = malloc((size_t)E * sizeof(float));
    float *logit = malloc((size_t)X * sizeof(float));
    int64_t *count = malloc((size_t)X * sizeof(int64_t));
    if (!w || !bias || !x || !logit || !count) {
        free(w); free(bias); free(x); free(logit); free(count);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory for the simulation");
    }
    for (int j = 0; j < n_cache; j++) hit[j] = 0;
    forge_tensor rt = {0}, bt = {0};
    for (int il = 0; il < (int)p->n_layer; il++) {
        /* the same tensors forge writes for this layer */
        snprintf(rt.name, sizeof(rt.name), "blk.%d.ffn_gate_inp.weight", il);
        rt.role = FR_ROUTER; rt.layer = il; rt.n_dims = 2; rt.ne[0] = E; rt.ne[1] = X;
        rt.std = (float)(1.0 / sqrt((double)E));
        forge_gen_floats(g, p, &rt, 0, E * X, w);
        if (p->arch == FORGE_ARCH_GPTOSS) {
            snprintf(bt.name, sizeof(bt.name), "blk.%d.ffn_gate_inp.bias", il);
            bt.role = FR_ROUTER_BIAS; bt.layer = il; bt.n_dims = 1; bt.ne[0] = X; bt.std = 0.1f;
            forge_gen_floats(g, p, &bt, 0, X, bias);
        }
        memset(count, 0, (size_t)X * sizeof(int64_t));
        forge_tensor xt = {0};
        snprintf(xt.name, sizeof(xt.name), "sim.hidden.%d", il);
        xt.std = 1.0f;
        for (int s = 0; s < n_samples; s++) {
            forge_gen_floats(g, p, &xt, (int64_t)s * E, E, x);
            for (int64_t e = 0; e < X; e++) {
                double acc = bias[e];
                for (int64_t c = 0; c < E; c++) acc += (double)w[e * E + c] * x[c];
                logit[e] = (float)acc;
            }
            for (int64_t k = 0; k < K; k++) { /* top-k by repeated argmax */
                int64_t best = -1;
                for (int64_t e = 0; e < X; e++)
                    if (logit[e] > -INFINITY && (best < 0 || logit[e] > logit[best])) best = e;
                count[best]++;
                logit[best] = -INFINITY;
            }
        }
        qsort(count, (size_t)X, sizeof(int64_t), cmp_desc);
        for (int j = 0; j < n_cache; j++) {
            int64_t covered = 0;
            for (int64_t e = 0; e < cache_n[j] && e < X; e++) covered += count[e];
            hit[j] += (double)covered / ((double)n_samples * (double)K);
        }
    }
    for (int j = 0; j < n_cache; j++) hit[j] /= (double)p->n_layer;
    free(w); free(bias); free(x); free(logit); free(count);
    return HM_OK;
}
