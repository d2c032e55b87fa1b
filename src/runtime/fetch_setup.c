/* fetch_setup.c - the pieces of the fetched-expert path put together for a tiered context
 * (fetch_setup.h). */
#include "runtime/fetch_setup.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "cuda/cuda_fetch.h"
#include "cuda/cuda_host.h"
#include "moe/offload.h"
#include "runtime/calibrate.h"

uint64_t fetch_setup_full_cap(const hm_model *m) {
    const hm_hparams *hp = hm_model_hparams(m);
    uint64_t best = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const uint64_t b = offload_expert_size(m, il, CUDA_COPY_LANE_ALIGN) * (uint64_t)hp->n_expert;
        if (b > best) best = b;
    }
    return best;
}

/* Appends printf text to *report (grown with realloc); false when out of memory. */
static bool report_add(char **report, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool report_add(char **report, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return true;
    const size_t have = *report ? strlen(*report) : 0;
    char *r = realloc(*report, have + (size_t)n + 1);
    if (!r) return false;
    va_start(ap, fmt);
    vsnprintf(r + have, (size_t)n + 1, fmt, ap);
    va_end(ap);
    *report = r;
    return true;
}

hm_status fetch_setup_open(fetch_setup *s, const hm_model *m, struct cuda_engine *gpu,
                           hm_tiered *t, int device, size_t cap, int64_t threshold,
                           char **report, hm_error *err) {
    memset(s, 0, sizeof(*s));
    const hm_hparams *hp = hm_model_hparams(m);
    hm_error e = {0};
    const void *span = NULL;
    size_t span_n = 0;
    if (!offload_expert_span(m, &span, &span_n)) return HM_OK;
    char why[HM_ERROR_MSG_MAX + 64] = "";
    if (cap > 0) {
        if (cuda_host_register(span, span_n, &s->reg, &e) != HM_OK) {
            HM_LOGW("fetched experts: the expert bytes are not registered as pinned (%s); "
                    "copies go through pinned staging", e.msg);
            s->reg = NULL;
        }
        if (cuda_copy_lane_init(device, cap, s->reg, &s->lane, &e) != HM_OK) {
            snprintf(why, sizeof(why), "no copy lane: %s", e.msg);
            HM_LOGW("fetched experts: %s; the CPU computes every expert", why);
            s->lane = NULL;
        } else {
            s->cap = cap;
        }
    } else {
        snprintf(why, sizeof(why), "no VRAM left for staging buffers");
    }
    calib_params cp = {.model = m, .pool = hm_tiered_pool(t), .lane = s->lane, .device = device};
    calib_result cal;
    if (calib_run(&cp, &cal, &e) != HM_OK)
        HM_LOGW("calibration failed (%s); the offload decisions use default rates", e.msg);
    char line[4096];
    calib_format(&cal, line, sizeof(line));
    for (const char *q = line; *q;) { /* one log line each, as the placement report */
        const char *nl = strchr(q, '\n');
        const int n = nl ? (int)(nl - q) : (int)strlen(q);
        HM_LOGI("%.*s", n, q);
        q += n + (nl ? 1 : 0);
    }
    if (report && !report_add(report, "%s", line))
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (placement report)");
    offload_rates *rates = calloc((size_t)hp->n_layer, sizeof(*rates));
    if (!rates) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (offload rates)");
    for (int il = 0; il < hp->n_layer; il++) calib_layer_rates(&cal, m, il, &rates[il]);
    if (s->lane &&
        cuda_engine_fetch_set(gpu, cuda_copy_lane_buf(s->lane, 0), cuda_copy_lane_buf(s->lane, 1),
                              s->cap, &s->n_eligible, &e) != HM_OK) {
        snprintf(why, sizeof(why), "%s", e.msg);
        HM_LOGW("fetched experts: %s", why);
    }
    const hm_tiered_offload o = {.lane = s->lane, .rates = rates, .threshold = threshold,
                                 .debug = offload_debug_env()};
    hm_status st = hm_tiered_set_offload(t, &o, &e);
    free(rates);
    if (st != HM_OK) { /* bad rates or threshold: the CPU keeps every expert */
        snprintf(why, sizeof(why), "%s", e.msg);
        HM_LOGW("fetched experts: %s", why);
    }
    char rule[64];
    if (threshold > 0) snprintf(rule, sizeof(rule), "--moe-offload-threshold %lld",
                                (long long)threshold);
    else snprintf(rule, sizeof(rule), "the cost model");
    if (s->n_eligible > 0)
        HM_LOGI("fetched experts: prompt ubatches of %d host layer%s may run their experts on the "
                "GPU (%s; staging 2 x %.1f MiB, copies %s)", s->n_eligible,
                s->n_eligible == 1 ? "" : "s", rule, (double)s->cap / 1048576.0,
                s->reg ? "from the registered mapping" : "staged");
    if (report) {
        bool ok = s->n_eligible > 0
                      ? report_add(report, "fetched experts: %d host layer%s, %s, staging 2 x "
                                   "%.1f MiB, copies %s\n", s->n_eligible,
                                   s->n_eligible == 1 ? "" : "s", rule,
                                   (double)s->cap / 1048576.0,
                                   s->reg ? "registered" : "staged")
                      : report_add(report, "fetched experts: none (%s)\n",
                                   why[0] ? why : "no host layer has GPU kernels for its experts");
        if (!ok) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (placement report)");
    }
    return HM_OK;
}

void fetch_setup_close(fetch_setup *s, struct cuda_engine *gpu) {
    if (!s) return;
    if (s->lane && gpu) cuda_engine_fetch_set(gpu, NULL, NULL, 0, NULL, NULL);
    cuda_copy_lane_free(s->lane);
    cuda_host_unregister(s->reg);
    memset(s, 0, sizeof(*s));
}
