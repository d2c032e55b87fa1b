/* test_forge_sim.c - the planted expert skew: router row scales are a per-layer permutation of
 * (rank+1)^(-S/2) keyed by the seed, the written router rows carry them, and the simulated cache
 * hit rate (Gaussian inputs through the forged routers) rises with S. */
#include <math.h>

#include "forge_test_util.h"
#include "harness.h"

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void test_router_scales(void) {
    const forge_preset *p = forge_preset_find("tiny-qwen3moe");
    forge_gen g = {.seed = 9, .skew_s = 1.0};
    float s0[64], s1[64];
    int same_layer = 0;
    for (int64_t e = 0; e < p->n_expert; e++) {
        s0[e] = forge_router_scale(&g, p, 0, e);
        s1[e] = forge_router_scale(&g, p, 1, e);
        same_layer += s0[e] == s1[e];
    }
    HM_CHECK(same_layer < p->n_expert); /* ranks permuted per layer */
    qsort(s0, (size_t)p->n_expert, sizeof(float), cmp_f);
    for (int64_t r = 0; r < p->n_expert; r++)
        HM_CHECK_MSG(fabsf(s0[r] - powf((float)(r + 1), -0.5f)) < 1e-6f, "rank %lld scale %g", (long long)r, s0[r]);
    forge_gen g0 = {.seed = 9};
    HM_CHECK(forge_router_scale(&g0, p, 0, 3) == 1.0f);
    forge_gen g2 = {.seed = 10, .skew_s = 1.0};
    int moved = 0;
    for (int64_t e = 0; e < p->n_expert; e++) moved += forge_router_scale(&g2, p, 0, e) != forge_router_scale(&g, p, 0, e);
    HM_CHECK(moved > 0); /* another seed, other ranks */

    /* the router rows written carry the scale: row RMS ~ scale / sqrt(n_embd) */
    forge_tensor_list l;
    hm_error err;
    HM_REQUIRE(forge_tensors_build(p, FORGE_MIX_Q8_0, &l, &err) == HM_OK);
    const forge_tensor *rt = NULL;
    for (int i = 0; i < l.n; i++)
        if (!strcmp(l.t[i].name, "blk.2.ffn_gate_inp.weight")) rt = &l.t[i];
    HM_REQUIRE(rt);
    float *w = malloc((size_t)(rt->ne[0] * rt->ne[1]) * sizeof(float));
    HM_REQUIRE(w);
    forge_gen_floats(&g, p, rt, 0, rt->ne[0] * rt->ne[1], w);
    int bad = 0;
    for (int64_t e = 0; e < rt->ne[1]; e++) {
        double ss = 0;
        for (int64_t c = 0; c < rt->ne[0]; c++) ss += (double)w[e * rt->ne[0] + c] * w[e * rt->ne[0] + c];
        double rms = sqrt(ss / (double)rt->ne[0]) * sqrt((double)p->n_embd);
        bad += fabs(rms / forge_router_scale(&g, p, 2, e) - 1.0) > 0.15;
    }
    HM_CHECK_MSG(bad == 0, "%d router rows off their scale", bad);
    free(w);
    forge_tensors_free(&l);
}

static void test_hit_rate_rises(void) {
    const forge_preset *p = forge_preset_find("tiny-qwen3moe");
    int ns[2] = {4, 8};
    double h0[2], h1[2], h2[2];
    hm_error err;
    forge_gen g = {.seed = 3};
    HM_REQUIRE(forge_sim_hits(p, &g, 400, ns, 2, h0, &err) == HM_OK);
    g.skew_s = 1.0;
    HM_REQUIRE(forge_sim_hits(p, &g, 400, ns, 2, h1, &err) == HM_OK);
    g.skew_s = 2.0;
    HM_REQUIRE(forge_sim_hits(p, &g, 400, ns, 2, h2, &err) == HM_OK);
    for (int j = 0; j < 2; j++) {
        HM_CHECK(h0[j] >= (double)ns[j] / (double)p->n_expert - 1e-9 && h0[j] < 1.0);
        HM_CHECK_MSG(h1[j] > h0[j] + 0.05 && h2[j] > h1[j], "N=%d: %.3f %.3f %.3f", ns[j], h0[j], h1[j], h2[j]);
    }
    HM_CHECK(h0[1] > h0[0]);
}

HM_TEST_MAIN(test_router_scales, test_hit_rate_rises)
