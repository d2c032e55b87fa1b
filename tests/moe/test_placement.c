/* test_placement.c - the placement planner (moe/placement.h) on forged tiny models
 * (tiny-qwen3moe: 4 layers of 16 experts; tiny-gpt-oss: expert biases, sinks; tiny-qwen2moe:
 * shared experts): -ngl 0, -ngl 99, -ngl 1 and -ngl n_layer (llama.cpp's count: the output
 * first), --cpu-moe, --n-cpu-moe, -ot (exact matches, first override wins, errors), the
 * automatic tiered choice when the whole model does not fit and --gpu-strict's refusal, the
 * byte totals and the report. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../forge/forge_test_util.h"
#include "model/model.h"
#include "moe/placement.h"

static hm_model *load_preset(const char *preset) {
    char tag[96], path[512];
    snprintf(tag, sizeof(tag), "placement-%s", preset);
    if (ft_forge(forge_preset_find(preset), FORGE_MIX_F32, 7, tag, false, 2, path, sizeof(path),
                 NULL, 0) != HM_OK)
        return NULL;
    hm_model *m = NULL;
    hm_error err;
    if (hm_model_load(path, NULL, &m, &err) != HM_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        return NULL;
    }
    return m;
}

static hm_model *g_model; /* tiny-qwen3moe, loaded once */

static hm_model *model(void) {
    if (!g_model) g_model = load_preset("tiny-qwen3moe");
    return g_model;
}

static const uint64_t k_big = 1ull << 40;
static const uint64_t k_kv = 1000, k_scratch = 500;

static moe_placement_options opts(int ngl) {
    moe_placement_options o = moe_placement_default_options();
    o.n_gpu_layers = ngl;
    o.vram_free = k_big;
    o.kv_bytes_per_layer = k_kv;
    o.scratch_bytes = k_scratch;
    return o;
}

static const moe_placement_tensor *find(const moe_placement *p, const char *name) {
    for (int i = 0; i < p->n_tensor; i++)
        if (strcmp(p->tensors[i].name, name) == 0) return &p->tensors[i];
    return NULL;
}

static bool is_exps(const char *name) { return strstr(name, "_exps.") != NULL; }

/* Totals agree with the tensors and the model; attention, KV, residency agree with the tiers. */
static void check_consistent(const hm_model *m, const moe_placement *p,
                             const moe_placement_options *o) {
    uint64_t dev = 0, hexp = 0, hoth = 0;
    for (int i = 0; i < p->n_tensor; i++) {
        const moe_placement_tensor *t = &p->tensors[i];
        if (t->tier == MOE_TIER_DEVICE) dev += t->bytes;
        else if (is_exps(t->name)) hexp += t->bytes;
        else hoth += t->bytes;
    }
    HM_CHECK(dev == p->device_weights);
    HM_CHECK(hexp == p->host_experts);
    HM_CHECK(hoth == p->host_other);
    HM_CHECK_MSG(dev + hexp + hoth == hm_model_weight_bytes(m), "%llu vs %llu",
                 (unsigned long long)(dev + hexp + hoth),
                 (unsigned long long)hm_model_weight_bytes(m));
    int n_attn = 0;
    for (int il = 0; il < p->n_layer; il++) n_attn += p->attn_device[il];
    HM_CHECK(p->device_kv == (uint64_t)n_attn * o->kv_bytes_per_layer);
    const uint64_t scratch =
        o->scratch_bytes + (p->tier_scratch ? o->tier_scratch_bytes : 0);
    HM_CHECK(p->device_scratch == (dev > 0 || n_attn > 0 ? scratch : 0));
    HM_CHECK(p->device_total == p->device_weights + p->device_kv + p->device_scratch);
    HM_CHECK(p->fits == (p->device_total <= p->budget));
    hm_error err;
    HM_CHECK(hm_residency_check(&p->res, &err) == HM_OK);
    for (int il = 0; il < p->n_layer; il++)
        for (int e = 0; e < p->res.n_expert; e++)
            HM_CHECK(p->res.home[hm_residency_at(&p->res, il, e)] & HM_HOME_HOST);
}

static hm_status plan(const moe_placement_options *o, moe_placement *p, hm_error *err) {
    hm_status st = moe_placement_plan(model(), o, p, err);
    if (st == HM_OK) check_consistent(model(), p, o);
    else fprintf(stderr, "  (plan: %s)\n", err->msg);
    return st;
}

static int n_tier(const moe_placement *p, moe_tier tier) {
    int n = 0;
    for (int i = 0; i < p->n_tensor; i++) n += p->tensors[i].tier == tier;
    return n;
}

static void test_ngl0_all_host(void) {
    HM_REQUIRE(model());
    moe_placement_options o = opts(0);
    moe_placement p;
    hm_error err;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(n_tier(&p, MOE_TIER_DEVICE) == 0);
    HM_CHECK(p.device_total == 0 && p.fits);
    for (int il = 0; il < p.n_layer; il++) {
        HM_CHECK(!p.attn_device[il]);
        HM_CHECK(p.res.n_slots[il] == 0);
    }
    HM_CHECK(p.choice == MOE_PLAN_AS_ASKED);
    moe_placement_free(&p);
}

static void test_ngl99_all_device(void) {
    HM_REQUIRE(model());
    moe_placement_options o = opts(99);
    moe_placement p;
    hm_error err;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(n_tier(&p, MOE_TIER_HOST) == 0);
    HM_CHECK(p.fits && p.choice == MOE_PLAN_AS_ASKED);
    HM_CHECK(p.device_weights == hm_model_weight_bytes(model()));
    HM_CHECK(p.device_kv == (uint64_t)p.n_layer * k_kv && p.device_scratch == k_scratch);
    HM_CHECK(p.host_experts == 0 && p.host_other == 0);
    for (int il = 0; il < p.n_layer; il++) {
        HM_CHECK(p.attn_device[il]);
        HM_CHECK(p.res.n_slots[il] == p.res.n_expert);
        for (int e = 0; e < p.res.n_expert; e++) {
            HM_CHECK(p.res.slot[hm_residency_at(&p.res, il, e)] == e);
            HM_CHECK(p.res.home[hm_residency_at(&p.res, il, e)] ==
                     (HM_HOME_HOST | HM_HOME_DEVICE));
        }
    }
    moe_placement_free(&p);
}

/* llama.cpp's count: -ngl 1 is the output layer alone; -ngl n_layer leaves layer 0 (and the
 * token embedding) on the host. */
static void test_ngl_counts_output_first(void) {
    HM_REQUIRE(model());
    const int L = (int)hm_model_hparams(model())->n_layer;
    moe_placement p;
    hm_error err;
    moe_placement_options o = opts(1);
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(find(&p, "output.weight")->tier == MOE_TIER_DEVICE);
    HM_CHECK(find(&p, "output_norm.weight")->tier == MOE_TIER_DEVICE);
    HM_CHECK(find(&p, "token_embd.weight")->tier == MOE_TIER_HOST);
    HM_CHECK(n_tier(&p, MOE_TIER_DEVICE) == 2);
    moe_placement_free(&p);

    o = opts(L);
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(find(&p, "token_embd.weight")->tier == MOE_TIER_HOST);
    HM_CHECK(find(&p, "output.weight")->tier == MOE_TIER_DEVICE);
    for (int i = 0; i < p.n_tensor; i++)
        if (p.tensors[i].layer >= 0)
            HM_CHECK_MSG((p.tensors[i].tier == MOE_TIER_DEVICE) == (p.tensors[i].layer >= 1), "%s",
                         p.tensors[i].name);
    HM_CHECK(!p.attn_device[0] && p.attn_device[1] && p.attn_device[L - 1]);
    HM_CHECK(p.res.n_slots[0] == 0 && p.res.n_slots[1] == p.res.n_expert);
    moe_placement_free(&p);
}

static void test_cpu_moe(void) {
    HM_REQUIRE(model());
    moe_placement_options o = opts(99);
    o.cpu_moe = true;
    moe_placement p;
    hm_error err;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    for (int i = 0; i < p.n_tensor; i++) {
        const moe_placement_tensor *t = &p.tensors[i];
        HM_CHECK_MSG((t->tier == MOE_TIER_HOST) == is_exps(t->name), "%s", t->name);
        if (is_exps(t->name)) HM_CHECK(t->why == MOE_WHY_CPU_MOE);
    }
    for (int il = 0; il < p.n_layer; il++) {
        HM_CHECK(p.attn_device[il]);
        HM_CHECK(p.res.n_slots[il] == 0);
        for (int e = 0; e < p.res.n_expert; e++) {
            HM_CHECK(p.res.home[hm_residency_at(&p.res, il, e)] == HM_HOME_HOST);
            HM_CHECK(p.res.slot[hm_residency_at(&p.res, il, e)] == -1);
        }
    }
    HM_CHECK(p.host_other == 0 && p.host_experts > 0);
    moe_placement_free(&p);
}

static void test_n_cpu_moe(void) {
    HM_REQUIRE(model());
    moe_placement_options o = opts(99);
    o.n_cpu_moe = 1;
    moe_placement p;
    hm_error err;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    for (int i = 0; i < p.n_tensor; i++) {
        const moe_placement_tensor *t = &p.tensors[i];
        const bool host = is_exps(t->name) && t->layer == 0;
        HM_CHECK_MSG((t->tier == MOE_TIER_HOST) == host, "%s", t->name);
    }
    HM_CHECK(p.res.n_slots[0] == 0);
    for (int il = 1; il < p.n_layer; il++) HM_CHECK(p.res.n_slots[il] == p.res.n_expert);
    for (int il = 0; il < p.n_layer; il++) HM_CHECK(p.attn_device[il]);
    moe_placement_free(&p);
}

static void test_override_exact(void) {
    HM_REQUIRE(model());
    moe_placement_options o = opts(99);
    o.overrides = "blk\\.1\\.ffn_.*_exps=CPU";
    moe_placement p;
    hm_error err;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    int n_host = 0;
    for (int i = 0; i < p.n_tensor; i++) {
        const moe_placement_tensor *t = &p.tensors[i];
        const bool host = is_exps(t->name) && t->layer == 1;
        n_host += host;
        HM_CHECK_MSG((t->tier == MOE_TIER_HOST) == host, "%s", t->name);
        HM_CHECK((t->why == MOE_WHY_OVERRIDE) == host);
    }
    HM_CHECK(n_host == 3); /* gate, up, down */
    HM_REQUIRE(p.n_override == 1);
    HM_CHECK(p.overrides[0].n_tensors == 3 && p.overrides[0].bytes == p.host_experts);
    HM_CHECK(strcmp(p.overrides[0].pattern, "blk\\.1\\.ffn_.*_exps") == 0);
    HM_CHECK(p.res.n_slots[1] == 0 && p.res.n_slots[0] == p.res.n_expert);
    HM_CHECK(p.choice == MOE_PLAN_AS_ASKED);
    moe_placement_free(&p);
}

static void test_override_first_wins(void) {
    HM_REQUIRE(model());
    moe_placement_options o = opts(99);
    o.overrides = "blk\\.1\\..*=CPU,blk\\.1\\.attn_q\\.weight=CUDA0";
    moe_placement p;
    hm_error err;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    const moe_placement_tensor *q = find(&p, "blk.1.attn_q.weight");
    HM_REQUIRE(q);
    HM_CHECK(q->tier == MOE_TIER_HOST && q->override_index == 0);
    HM_CHECK(p.overrides[1].n_tensors == 0);
    HM_CHECK(!p.attn_device[1] && p.attn_device[0]);
    moe_placement_free(&p);

    /* the other order: the specific one first puts it on the device under -ngl 0 too */
    o = opts(0);
    o.overrides = "blk\\.2\\.attn_q\\.weight=CUDA0,blk\\.2\\..*=CPU";
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    q = find(&p, "blk.2.attn_q.weight");
    HM_REQUIRE(q);
    HM_CHECK(q->tier == MOE_TIER_DEVICE && q->override_index == 0);
    HM_CHECK(n_tier(&p, MOE_TIER_DEVICE) == 1);
    HM_CHECK(!p.attn_device[2]); /* the rest of its attention is on the host */
    HM_CHECK(p.device_kv == 0 && p.device_scratch == k_scratch);
    char *r = moe_placement_report(&p);
    HM_REQUIRE(r);
    HM_CHECK(strstr(r, "layer 2: attention tensors split") != NULL);
    free(r);
    moe_placement_free(&p);
}

static void expect_error(const char *ot, const char *want1, const char *want2) {
    moe_placement_options o = opts(99);
    o.overrides = ot;
    moe_placement p;
    hm_error err;
    hm_status st = moe_placement_plan(model(), &o, &p, &err);
    HM_CHECK_MSG(st == HM_ERR_ARG, "-ot %s: status %d", ot, (int)st);
    if (st == HM_OK) {
        moe_placement_free(&p);
        return;
    }
    HM_CHECK_MSG(strstr(err.msg, want1) != NULL, "'%s' not in: %s", want1, err.msg);
    if (want2) HM_CHECK_MSG(strstr(err.msg, want2) != NULL, "'%s' not in: %s", want2, err.msg);
    HM_CHECK(p.tensors == NULL && p.res.home == NULL); /* nothing left to free */
}

static void test_override_errors(void) {
    HM_REQUIRE(model());
    expect_error("blk\\.(1=CPU", "bad regex 'blk\\.(1'", "-ot 'blk\\.(1=CPU'");
    expect_error("blk\\.1\\..*=GPU", "unknown device 'GPU'", "known: CPU, CUDA0");
    expect_error("exps=CPU,blk\\.1=cuda0", "-ot 'blk\\.1=cuda0': unknown device 'cuda0'", NULL);
    expect_error("blk\\.1\\.ffn", "-ot 'blk\\.1\\.ffn': expected REGEX=DEVICE", NULL);
    expect_error("=CPU", "empty regex", NULL);
    expect_error("exps=CPU,", "-ot '': expected REGEX=DEVICE", NULL);
    moe_placement_options o = opts(-1);
    moe_placement p;
    hm_error err;
    HM_CHECK(moe_placement_plan(model(), &o, &p, &err) == HM_ERR_ARG);
    HM_CHECK(strstr(err.msg, "-ngl -1") != NULL);
}

/* device_total of explicit options (under a huge budget); n_cpu_moe: --n-cpu-moe. */
static uint64_t total_ncm(int ngl, bool cpu_moe, int n_cpu_moe) {
    moe_placement_options o = opts(ngl);
    o.cpu_moe = cpu_moe;
    o.n_cpu_moe = n_cpu_moe;
    moe_placement p;
    hm_error err;
    if (plan(&o, &p, &err) != HM_OK) return 0;
    const uint64_t t = p.device_total;
    moe_placement_free(&p);
    return t;
}

static uint64_t total_of(int ngl, bool cpu_moe) { return total_ncm(ngl, cpu_moe, 0); }

static void test_auto_tier(void) {
    HM_REQUIRE(model());
    const int L = (int)hm_model_hparams(model())->n_layer;
    const uint64_t full = total_of(99, false), cm = total_of(99, true);
    HM_REQUIRE(full > cm && cm > 0 && L >= 3);
    moe_placement p;
    hm_error err;

    /* between: the experts of the fewest first layers in RAM that fits (--n-cpu-moe K) */
    moe_placement_options o = opts(99);
    o.vram_budget = cm + (full - cm) / 2;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(p.choice == MOE_PLAN_AUTO_N_CPU_MOE);
    const int k = p.n_cpu_moe;
    HM_CHECK_MSG(k >= 1 && k < L && total_ncm(99, false, k) <= o.vram_budget &&
                 total_ncm(99, false, k - 1) > o.vram_budget, "K = %d", k);
    HM_CHECK(p.fits && !p.cpu_moe && p.n_gpu_layers == 99 && p.device_total <= o.vram_budget);
    HM_CHECK(p.asked_device_total == full && p.device_total == total_ncm(99, false, k));
    for (int il = 0; il < L; il++)
        HM_CHECK((p.res.n_slots[il] == 0) == (il < k) && p.attn_device[il]);
    char *r = moe_placement_report(&p);
    HM_REQUIRE(r);
    printf("%s", r);
    char want[96];
    snprintf(want, sizeof(want), "plan: -ngl 99 --n-cpu-moe %d\n", k);
    HM_CHECK(strstr(r, "chosen automatically") && strstr(r, want));
    free(r);
    moe_placement_free(&p);

    /* the staging a tiered plan adds counts: a budget K just fits, one byte of staging sends
     * one more layer's experts to RAM */
    const uint64_t saved = o.vram_budget;
    o.vram_budget = total_ncm(99, false, k);
    o.tier_scratch_bytes = 1;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK_MSG(p.n_cpu_moe == k + 1 || (k + 1 == L && p.choice == MOE_PLAN_AUTO_CPU_MOE),
                 "K = %d with staging (%d without)", p.n_cpu_moe, k);
    HM_CHECK(p.tier_scratch);
    moe_placement_free(&p);
    /* staging that fits nowhere: --cpu-moe without it */
    o.vram_budget = cm;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(p.choice == MOE_PLAN_AUTO_CPU_MOE && !p.tier_scratch && p.device_total == cm);
    moe_placement_free(&p);
    o.tier_scratch_bytes = 0;
    o.vram_budget = saved;

    /* only every routed expert in RAM fits: --cpu-moe */
    o.vram_budget = cm;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(p.choice == MOE_PLAN_AUTO_CPU_MOE);
    HM_CHECK(p.fits && p.cpu_moe && p.n_gpu_layers == 99);
    HM_CHECK(p.asked_device_total == full && p.device_total == cm);
    HM_CHECK(p.budget == o.vram_budget);
    for (int il = 0; il < L; il++) HM_CHECK(p.res.n_slots[il] == 0 && p.attn_device[il]);
    r = moe_placement_report(&p);
    HM_REQUIRE(r);
    printf("%s", r);
    HM_CHECK(strstr(r, "chosen automatically") != NULL);
    HM_CHECK(strstr(r, "every routed expert moved to RAM (as --cpu-moe)") != NULL);
    free(r);
    moe_placement_free(&p);

    /* smaller: --cpu-moe with fewer layers; the most that fits */
    const uint64_t two = total_of(2, true);
    HM_REQUIRE(two < total_of(3, true));
    o.vram_budget = two;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(p.choice == MOE_PLAN_AUTO_FEWER_LAYERS);
    HM_CHECK(p.fits && p.cpu_moe && p.n_gpu_layers == 2 && p.device_total == two);
    HM_CHECK(!p.attn_device[L - 2] && p.attn_device[L - 1]); /* output + last layer */
    r = moe_placement_report(&p);
    HM_REQUIRE(r);
    printf("%s", r);
    HM_CHECK(strstr(r, "fewer layers on the GPU") != NULL && strstr(r, "-ngl 2 --cpu-moe") != NULL);
    free(r);
    moe_placement_free(&p);

    /* a budget below any GPU use: -ngl 0, the CPU */
    o.vram_budget = 1;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(p.choice == MOE_PLAN_AUTO_FEWER_LAYERS && p.n_gpu_layers == 0 && p.device_total == 0);
    moe_placement_free(&p);

    /* vram_budget 0: the free VRAM */
    o.vram_budget = 0;
    o.vram_free = cm;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(p.budget == cm && p.choice == MOE_PLAN_AUTO_CPU_MOE);
    moe_placement_free(&p);

    /* explicit options that do not fit are not changed */
    o = opts(L);
    o.vram_budget = cm;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(p.choice == MOE_PLAN_AS_ASKED && !p.fits && p.n_gpu_layers == L);
    r = moe_placement_report(&p);
    HM_REQUIRE(r);
    HM_CHECK(strstr(r, "does NOT fit") != NULL);
    free(r);
    moe_placement_free(&p);
}

static void test_gpu_strict_refuses(void) {
    HM_REQUIRE(model());
    const uint64_t full = total_of(99, false);
    moe_placement_options o = opts(99);
    o.vram_budget = full - 1;
    o.gpu_strict = true;
    moe_placement p;
    hm_error err;
    HM_CHECK(moe_placement_plan(model(), &o, &p, &err) == HM_ERR_NOMEM);
    char need[64], budget[64];
    snprintf(need, sizeof(need), "needs %llu bytes of VRAM", (unsigned long long)full);
    snprintf(budget, sizeof(budget), "the budget is %llu bytes", (unsigned long long)(full - 1));
    HM_CHECK_MSG(strstr(err.msg, need) && strstr(err.msg, budget) &&
                 strstr(err.msg, "the whole model") && strstr(err.msg, "--gpu-strict"),
                 "%s", err.msg);
    printf("gpu_strict: %s\n", err.msg);
    /* the budget exactly: fits, strict or not */
    o.vram_budget = full;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    HM_CHECK(p.fits && p.choice == MOE_PLAN_AS_ASKED);
    moe_placement_free(&p);
}

static void test_report_tiers(void) {
    HM_REQUIRE(model());
    moe_placement_options o = opts(99);
    o.n_cpu_moe = 2;
    o.overrides = "^output\\.weight=CPU"; /* unanchored would match attn_output too */
    moe_placement p;
    hm_error err;
    HM_REQUIRE(plan(&o, &p, &err) == HM_OK);
    char *r = moe_placement_report(&p);
    HM_REQUIRE(r);
    printf("%s", r);
    const char *want[] = {"device (VRAM)", "host (RAM", "weights", "KV", "scratch",
                          "routed experts: device slots in layers 2-3; host only in layers 0-1",
                          "attention + KV cache: device in layers 0-3; host in layers none",
                          "output.weight host", "-ot '^output\\.weight=CPU': 1 tensor",
                          "--n-cpu-moe 2"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        HM_CHECK_MSG(strstr(r, want[i]) != NULL, "'%s' not in the report", want[i]);
    free(r);
    moe_placement_free(&p);
}

/* Other architectures: expert biases (gpt-oss), shared experts (qwen2moe) stay with their kind. */
static void test_other_archs(void) {
    const char *presets[] = {"tiny-gpt-oss", "tiny-qwen2moe"};
    for (int k = 0; k < 2; k++) {
        hm_model *m = load_preset(presets[k]);
        HM_REQUIRE(m);
        moe_placement_options o = opts(99);
        o.cpu_moe = true;
        moe_placement p;
        hm_error err;
        HM_REQUIRE(moe_placement_plan(m, &o, &p, &err) == HM_OK);
        check_consistent(m, &p, &o);
        int n_host = 0;
        for (int i = 0; i < p.n_tensor; i++) {
            const moe_placement_tensor *t = &p.tensors[i];
            n_host += t->tier == MOE_TIER_HOST;
            HM_CHECK_MSG((t->tier == MOE_TIER_HOST) == is_exps(t->name), "%s %s", presets[k],
                         t->name);
        }
        const int per_layer = k == 0 ? 6 : 3; /* gpt-oss: weights and biases */
        HM_CHECK_MSG(n_host == per_layer * p.n_layer, "%s: %d", presets[k], n_host);
        if (k == 1) HM_CHECK(find(&p, "blk.0.ffn_up_shexp.weight")->tier == MOE_TIER_DEVICE);
        moe_placement_free(&p);
        hm_model_free(m);
    }
}

static void test_cleanup(void) {
    hm_model_free(g_model);
    g_model = NULL;
}

HM_TEST_MAIN(test_ngl0_all_host, test_ngl99_all_device, test_ngl_counts_output_first, test_cpu_moe,
             test_n_cpu_moe, test_override_exact, test_override_first_wins, test_override_errors,
             test_auto_tier, test_gpu_strict_refuses, test_report_tiers, test_other_archs,
             test_cleanup)
