/* cmd_plan.c - `hotmoe plan -m MODEL --moe-hot-cache FILE [options]`: prints the hot cache's plan
 * (seed 001) for a model and a learn or perf file, without a GPU: which experts of the layers
 * whose experts stay in RAM would get a VRAM slot, their bytes and the expected hit rate per
 * layer (moe/hot_plan.h; docs/HOT_CACHE.md).
 *
 * DESIGN: the layers that can hold cache slots are those the placement flags leave in RAM
 * (moe/placement.h); without placement flags the plan is for `-ngl 99 --cpu-moe` (every routed
 * expert in RAM). The budget is --moe-hot-cache-max-mib N, or with -1 (the default) what
 * --vram-budget leaves after the placement's own VRAM (weights, an f16 KV cache of -c
 * positions; the engine's buffers are not known without a GPU, so the figure is an upper
 * estimate, said in the output) minus --moe-hot-cache-reserve-mib.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/model.h"
#include "moe/hot_plan.h"
#include "moe/learn_file.h"
#include "moe/placement.h"

#define CMD "plan"
#define MIB (1ull << 20)

/* The layers whose routed experts the placement leaves in RAM, into el[]; the placement's VRAM
 * bytes into *dev. */
static hm_status eligible_layers(const hm_model *m, const cli_common_args *a, bool *el,
                                 uint64_t *dev, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(m);
    moe_placement_options o = moe_placement_default_options();
    const bool given = a->n_gpu_layers > 0 || a->cpu_moe || a->n_cpu_moe > 0 ||
                       a->override_tensor.n > 0;
    o.n_gpu_layers = given ? a->n_gpu_layers : 99;
    o.cpu_moe = given ? a->cpu_moe : true;
    o.n_cpu_moe = a->n_cpu_moe;
    bool oom = false;
    char *ot = cli_args_overrides(a, &oom);
    if (oom) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    o.overrides = ot;
    const int64_t n_ctx = a->n_ctx > 0 ? a->n_ctx : 4096;
    o.kv_bytes_per_layer = (uint64_t)n_ctx * (uint64_t)hp->n_head_kv *
                           ((uint64_t)hp->head_dim_k + (uint64_t)hp->head_dim_v) * 2u;
    moe_placement p;
    hm_status st = moe_placement_plan(m, &o, &p, err);
    free(ot);
    if (st != HM_OK) return st;
    for (int il = 0; il < hp->n_layer; il++)
        el[il] = hm_model_layer(m, il)->gate_exps.data && p.res.n_slots[il] == 0;
    *dev = p.device_total;
    moe_placement_free(&p);
    return HM_OK;
}

static int plan_run(const cli_common_args *a) {
    hm_error err = {0};
    hot_weight_cfg cfg = hot_weight_default();
    hot_weighting_parse(a->moe_hot_cache_weighting, &cfg.mode, NULL); /* checked by the parser */
    cfg.layer_curve = a->moe_hot_cache_layer_curve;
    const int max_mib = a->moe_hot_cache_max_mib, reserve_mib = a->moe_hot_cache_reserve_mib;
    if (max_mib == -1 && !a->given_vram_budget) {
        fprintf(stderr, "hotmoe " CMD ": --moe-hot-cache-max-mib -1 (auto) sizes the cache from "
                        "the VRAM the placement leaves: give --vram-budget MiB (the card's "
                        "size), or --moe-hot-cache-max-mib N\n");
        return 2;
    }
    moe_learn l;
    if (moe_learn_load(a->moe_hot_cache, &l, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        return 1;
    }
    hm_model *m = NULL;
    int rc = 1;
    bool *el = NULL;
    hot_plan p = {0};
    hm_model_params mp = hm_model_default_params();
    mp.check_ram = false; /* a plan reads the file's shapes, never its weights */
    if (hm_model_load(a->model, &mp, &m, &err) != HM_OK) goto fail;
    el = calloc((size_t)hm_model_hparams(m)->n_layer, sizeof(bool));
    uint64_t dev = 0;
    if (!el) {
        hm_error_set(&err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (eligible_layers(m, a, el, &dev, &err) != HM_OK) goto fail;
    uint64_t budget = (uint64_t)max_mib * MIB;
    if (max_mib == -1) {
        budget = hot_plan_auto_budget((uint64_t)a->vram_budget_mib * MIB, dev,
                                      (uint64_t)reserve_mib * MIB);
        printf("budget: --vram-budget %d MiB - the placement's %.1f MiB (weights, f16 KV; "
               "without the engine's buffers: an upper estimate) - reserve %d MiB = %.1f MiB\n",
               a->vram_budget_mib, (double)dev / (double)MIB, reserve_mib,
               (double)budget / (double)MIB);
    }
    if (hot_plan_make(m, &l, &cfg, el, budget, &p, &err) != HM_OK) goto fail;
    char *text = hot_plan_format(&p);
    if (!text) {
        hm_error_set(&err, HM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    fputs(text, stdout);
    free(text);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
    hot_plan_free(&p);
    free(el);
    hm_model_free(m);
    moe_learn_free(&l);
    return rc;
}

int cmd_plan(int argc, char **argv) {
    const cli_args_def def = {
        CMD, "-m MODEL --moe-hot-cache FILE [--moe-hot-cache-max-mib N] [placement] [options]",
        "Prints the hot cache's plan without a GPU: for each layer whose routed experts stay in "
        "RAM under the placement flags (default: -ngl 99 --cpu-moe), the experts that get a "
        "VRAM slot, their bytes and the expected hit rate (their share of the file's "
        "selections). The --moe-hot-cache-* flags are those of run, bench and chat.",
        CLI_ARGS_MODEL | CLI_ARGS_CONTEXT, NULL, 0};
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (!a.model || !a.moe_hot_cache) {
        fprintf(stderr, "hotmoe " CMD ": -m MODEL and --moe-hot-cache FILE are required\n");
        return 2;
    }
    return plan_run(&a);
}
