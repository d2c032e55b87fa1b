/* test_hot_setup.c - the hot cache's builder on the host (runtime/hot_setup.h): a plan turned into
 * device slots of a --cpu-moe placement's residency map, no GPU needed. Chosen experts get the
 * next slots of their layer in id order and a device home, the others stay host-only; the
 * placement's device bytes grow by the cache; a budget that holds every expert makes whole
 * layers (every slot: GPU layers); an unreadable file, another model's file and a budget below
 * one expert per RAM layer leave the map as it was, with the reason in the report; a cache taken
 * back (hot_setup_revert: the engine could not start with it) leaves the plan as it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../forge/forge_test_util.h"
#include "harness.h"
#include "learn_test_util.h"
#include "model/model.h"
#include "moe/offload.h"
#include "moe/placement.h"
#include "runtime/hot_setup.h"

static hm_model *g_model;
static char g_path[512];

static hm_model *model(void) {
    hm_error err;
    if (!g_model && (!ft_forged("hotsetup", "tiny-qwen3moe", FORGE_MIX_Q8_0, g_path,
                                sizeof(g_path)) ||
                     hm_model_load(g_path, NULL, &g_model, &err) != HM_OK))
        g_model = NULL;
    return g_model;
}

/* -ngl 99 --cpu-moe on a device of 1 TiB */
static void cpu_moe_plan(moe_placement *pl) {
    moe_placement_options o = moe_placement_default_options();
    o.n_gpu_layers = 99;
    o.cpu_moe = true;
    o.vram_free = 1ull << 40;
    o.kv_bytes_per_layer = 1000;
    o.scratch_bytes = 500;
    hm_error err;
    HM_REQUIRE(moe_placement_plan(model(), &o, pl, &err) == HM_OK);
}

/* Applies a cache of max_mib from file to a fresh --cpu-moe plan; the report into *report. */
static hm_status apply(const char *file, int64_t max_mib, moe_placement *pl, char **report) {
    cpu_moe_plan(pl);
    hm_context_params p = hm_context_default_params();
    p.moe_hot_cache = file;
    p.moe_hot_cache_max_mib = max_mib;
    hm_error err;
    return hot_setup_apply(model(), &p, pl, report, NULL, &err);
}

/* Every layer's slots: hot experts numbered 0, 1, ... in id order, a device home; the rest
 * host-only. Returns the experts with a slot. */
static int check_slots(const moe_placement *pl) {
    const hm_residency *r = &pl->res;
    int total = 0;
    for (int il = 0; il < r->n_layer; il++) {
        int next = 0;
        for (int e = 0; e < r->n_expert; e++) {
            const size_t i = hm_residency_at(r, il, e);
            if (r->slot[i] >= 0) {
                HM_CHECK_MSG(r->slot[i] == next && (r->home[i] & HM_HOME_DEVICE) &&
                             (r->home[i] & HM_HOME_HOST), "layer %d expert %d: slot %d, want %d",
                             il, e, r->slot[i], next);
                next++;
            } else {
                HM_CHECK(!(r->home[i] & HM_HOME_DEVICE) && (r->home[i] & HM_HOME_HOST));
            }
        }
        HM_CHECK(r->n_slots[il] == next);
        total += next;
    }
    return total;
}

static void test_partial_and_whole(void) {
    HM_REQUIRE(model());
    const hm_hparams *hp = hm_model_hparams(model());
    const int NL = (int)hp->n_layer, NE = (int)hp->n_expert;
    char learn[600];
    snprintf(learn, sizeof(learn), "%s.hotsetup.learn.json", g_path);
    HM_REQUIRE(write_learn(model(), learn));
    uint64_t all = 0;
    for (int il = 0; il < NL; il++) all += offload_expert_size(model(), il, 1) * (uint64_t)NE;

    moe_placement base, pl;
    cpu_moe_plan(&base);
    for (int il = 0; il < NL; il++) HM_REQUIRE(base.res.n_slots[il] == 0);
    char *report = NULL;
    HM_REQUIRE(apply(learn, 1, &pl, &report) == HM_OK); /* 1 MiB: a part of the experts */
    const int n = check_slots(&pl);
    uint64_t bytes = 0;
    for (int il = 0; il < NL; il++) bytes += pl.res.n_slots[il] * offload_expert_size(model(), il, 1);
    HM_CHECK_MSG(n > 0 && bytes <= (1u << 20) && bytes < all, "%d experts, %llu bytes", n,
                 (unsigned long long)bytes);
    HM_CHECK(pl.device_total == base.device_total + bytes &&
             pl.device_weights == base.device_weights + bytes);
    HM_CHECK(report && strstr(report, "hot cache plan:") && strstr(report, "whole layers:"));
    free(report);
    moe_placement_free(&pl);

    report = NULL; /* room for everything: whole layers, every slot */
    HM_REQUIRE(apply(learn, (int64_t)(all >> 20) + 2, &pl, &report) == HM_OK);
    HM_CHECK(check_slots(&pl) == NL * NE);
    for (int il = 0; il < NL; il++) HM_CHECK(pl.res.n_slots[il] == NE);
    HM_CHECK(report && strstr(report, "(whole: a GPU layer)"));
    free(report);
    moe_placement_free(&pl);
    moe_placement_free(&base);
    remove(learn);
}

/* No cache, the map untouched, the reason reported. */
static void check_none(const char *file, int64_t max_mib, const char *why) {
    moe_placement pl;
    char *report = NULL;
    HM_REQUIRE(apply(file, max_mib, &pl, &report) == HM_OK);
    HM_CHECK(check_slots(&pl) == 0);
    HM_CHECK_MSG(report && strstr(report, "hot cache: none (") && strstr(report, why),
                 "report: %s (want '%s')", report ? report : "(none)", why);
    free(report);
    moe_placement_free(&pl);
}

static void test_refusals(void) {
    HM_REQUIRE(model());
    char path[600];
    snprintf(path, sizeof(path), "%s.hotsetup.missing.json", g_path);
    remove(path);
    check_none(path, 1, "hotsetup.missing.json");
    /* another model's file: one layer more */
    snprintf(path, sizeof(path), "%s.hotsetup.other.json", g_path);
    FILE *f = fopen(path, "w");
    HM_REQUIRE(f);
    const hm_hparams *hp = hm_model_hparams(model());
    const int NL = (int)hp->n_layer + 1, NE = (int)hp->n_expert;
    fprintf(f, "{\"format\":\"hotmoe-expert-usage\",\"version\":1,\"n_layer\":%d,\"n_expert\":%d,"
               "\"n_expert_used\":%d,\"prompts\":1,\"total_tokens\":%d,\"rejected\":0,\"experts\":[",
            NL, NE, (int)hp->n_expert_used, NE);
    for (int e = 0; e < NE; e++) fprintf(f, "%s%d", e ? "," : "", NL);
    fprintf(f, "],\"layers\":[");
    for (int il = 0; il < NL; il++) {
        fprintf(f, "%s{\"layer\":%d,\"calls\":1,\"tokens\":%d,\"expert_hits_total\":%d,"
                   "\"experts\":[", il ? "," : "", il, NE, NE);
        for (int e = 0; e < NE; e++) fprintf(f, "%s1", e ? "," : "");
        fprintf(f, "]}");
    }
    fprintf(f, "]}\n");
    HM_REQUIRE(fclose(f) == 0);
    check_none(path, 1, "for a model of");
    remove(path);
    /* a budget below one expert per RAM layer */
    char learn[600];
    snprintf(learn, sizeof(learn), "%s.hotsetup.small.json", g_path);
    HM_REQUIRE(write_learn(model(), learn));
    hm_context_params p = hm_context_default_params();
    moe_placement pl;
    char *report = NULL;
    cpu_moe_plan(&pl);
    p.moe_hot_cache = learn;
    p.moe_hot_cache_max_mib = -1;
    p.moe_hot_cache_reserve_mib = 0;
    pl.budget = pl.device_total + 1; /* the auto budget leaves one byte */
    hm_error err;
    HM_REQUIRE(hot_setup_apply(model(), &p, &pl, &report, NULL, &err) == HM_OK);
    HM_CHECK(check_slots(&pl) == 0 && report && strstr(report, "less than one expert"));
    free(report);
    moe_placement_free(&pl);
    remove(learn);
}

/* The undo: a cache applied, then taken back (the engine could not start with it): the map and
 * the device figures are the plan's before, byte for byte, and the report says why; no cache
 * added (a refused file): nothing kept, nothing changed. */
static void test_revert(void) {
    char learn[600];
    snprintf(learn, sizeof(learn), "%s.hotsetup.revert.json", g_path);
    HM_REQUIRE(model() && write_learn(model(), learn));
    moe_placement before, pl;
    cpu_moe_plan(&before);
    cpu_moe_plan(&pl);
    hm_context_params p = hm_context_default_params();
    p.moe_hot_cache = learn;
    p.moe_hot_cache_max_mib = 1;
    hot_setup_undo u;
    char *report = NULL;
    hm_error err;
    HM_REQUIRE(hot_setup_apply(model(), &p, &pl, &report, &u, &err) == HM_OK);
    const hm_residency *a = &before.res, *b = &pl.res;
    const size_t n = (size_t)a->n_layer * (size_t)a->n_expert;
    HM_CHECK(u.added && check_slots(&pl) > 0 && pl.device_total > before.device_total);
    hot_setup_revert(&pl, &u, "GPU: out of memory", &report);
    HM_CHECK(!u.added && !u.res.home && check_slots(&pl) == 0);
    HM_CHECK(!memcmp(a->home, b->home, n) && !memcmp(a->slot, b->slot, n * sizeof(*a->slot)) &&
             !memcmp(a->n_slots, b->n_slots, (size_t)a->n_layer * sizeof(*a->n_slots)) &&
             pl.device_total == before.device_total &&
             pl.device_weights == before.device_weights && pl.fits == before.fits);
    HM_CHECK_MSG(report && strstr(report, "hot cache: none (the GPU cannot start with it: GPU: "
                                          "out of memory)"), "%s", report ? report : "");
    free(report);
    report = NULL;
    moe_placement_free(&pl);
    cpu_moe_plan(&pl);
    p.moe_hot_cache = "/nonexistent/hot.json";
    HM_REQUIRE(hot_setup_apply(model(), &p, &pl, &report, &u, &err) == HM_OK);
    HM_CHECK(!u.added && !u.res.home && pl.device_total == before.device_total);
    hot_setup_revert(&pl, &u, "unused", &report);
    HM_CHECK(report && !strstr(report, "unused"));
    free(report);
    moe_placement_free(&pl);
    moe_placement_free(&before);
    remove(learn);
}

static void test_cleanup(void) {
    hm_model_free(g_model);
    g_model = NULL;
}

HM_TEST_MAIN(test_partial_and_whole, test_refusals, test_revert, test_cleanup)
