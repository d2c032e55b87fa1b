/* cli_tracer.c - tracer flags shared by the inference commands (see cli_tracer.h). */
#include "cli/cli_tracer.h"

#include <stdio.h>

int cli_tracer_args(const char *cmd, moe_tracer_config *tc, int *argc, char **argv) {
    hm_error err = {0};
    moe_tracer_config_init(tc);
    if (moe_tracer_config_from_env(tc, &err) != HM_OK ||
        moe_tracer_config_extract(tc, argc, argv, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", cmd, err.msg);
        return 2;
    }
    return 0;
}

int cli_tracer_attach(cli_engine *e, const moe_tracer_config *tc, const char *model_path,
                      moe_tracer **out) {
    *out = NULL;
    if (!moe_tracer_config_enabled(tc)) return 0;
    hm_error err = {0};
    const hm_hparams *hp = hm_model_hparams(e->model);
    moe_tracer *tr = NULL;
    if (moe_tracer_init(&tr, tc, (int)hp->n_layer, (int)hp->n_expert, (int)hp->n_expert_used,
                        &err) != HM_OK ||
        moe_tracer_set_model_info(tr, hm_model_arch(e->model)->name, NULL, model_path, &err) !=
            HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        moe_tracer_free(tr);
        return 1;
    }
    if (hm_context_set_tracer(e->ctx, tr, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        moe_tracer_free(tr);
        return 1;
    }
    *out = tr;
    return 0;
}

int cli_tracer_finish(cli_engine *e, moe_tracer *tr) {
    if (!tr) return 0;
    hm_error err = {0};
    int rc = 0;
    /* what the GPU counted since the last generation ended, then detach */
    if (e->ctx && (hm_context_flush_routes(e->ctx, &err) != HM_OK ||
                   hm_context_set_tracer(e->ctx, NULL, &err) != HM_OK)) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        rc = 1;
    }
    if (moe_tracer_finish(tr, &err) != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", e->cmd, err.msg);
        rc = 1;
    }
    moe_tracer_free(tr);
    return rc;
}
