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
#include "moe/postfetch.h"
#include "runtime/calibrate.h"

#define PF_GPU_D_S 10e-6 /* the GPU's time for one post-fetched down product, launch included */

uint64_t fetch_setup_full_cap(const hm_model *m) {
    const hm_hparams *hp = hm_model_hparams(m);
    uint64_t best = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const uint64_t b = offload_expert_size(m, il, CUDA_COPY_LANE_ALIGN) * (uint64_t)hp->n_expert;
        if (b > best) best = b;
    }
    return best;
}

uint64_t fetch_setup_staging(uint64_t full, uint64_t free, uint64_t budget) {
    const uint64_t vram = budget > 0 && budget < free ? budget : free;
    const uint64_t cap = vram / 8 > FETCH_STAGING_MIN ? vram / 8 : FETCH_STAGING_MIN;
    return full < cap ? full : cap;
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

/* Post-fetch at decode steps (seed 000; runtime/tiered_postfetch.c): the variables, then on
 * when forced (HOTMOE_POSTFETCH_FORCE=1) or when the cost model could ever choose it, i.e. host
 * memory feeds the CPU's reads and the copies faster together than reads alone (concurrency > 1;
 * not measured at start, so 1: one shared bandwidth, which bench_host_pcie measured on the GPU
 * machine). A variable that is not a number: the error. */
static hm_status postfetch_open(fetch_setup *s, struct cuda_engine *gpu, hm_tiered *t,
                                const calib_result *cal, char **report, hm_error *err) {
    pf_config c;
    hm_status st = pf_config_from_env(&c, err);
    if (st != HM_OK) return st;
    const pf_rates r = {.read_bytes_per_s = cal->host_read_bps, .h2d_bytes_per_s = cal->h2d_bps,
                        .concurrency = 1.0, .gpu_d_s = PF_GPU_D_S};
    char why[160];
    const bool want = c.force_gpu || (c.enable && !c.force_cpu && r.concurrency > 1.0);
    if (!s->lane) snprintf(why, sizeof(why), "no copy lane");
    else if (c.force_cpu) snprintf(why, sizeof(why), "LLAMA_POSTFETCH_FORCE_CPU=1");
    else if (!c.enable && !c.force_gpu) snprintf(why, sizeof(why), "LLAMA_POSTFETCH_ENABLE=0");
    else snprintf(why, sizeof(why), "host memory shares one bandwidth between the CPU's reads "
                  "and copies: no gain; HOTMOE_POSTFETCH_FORCE=1 forces it");
    bool on = false;
    if (want && s->lane) {
        hm_error e = {0};
        if (cuda_engine_postfetch_set(gpu, true, &e) == HM_OK &&
            hm_tiered_set_postfetch(t, true, &c, &r, &e) == HM_OK) {
            on = true;
        } else {
            cuda_engine_postfetch_set(gpu, false, NULL);
            snprintf(why, sizeof(why), "%.150s", e.msg);
        }
    }
    if (on) {
        char pad[48] = "";
        if (c.scratchpad_mb > 0) snprintf(pad, sizeof(pad), " and %d MiB", c.scratchpad_mb);
        HM_LOGI("post-fetch: on (%s, at most %d experts%s per layer and step, %s; scratchpad: "
                "the staging buffers, %.1f MiB each)",
                c.force_gpu ? "forced: every cold expert's down product" : "the cost model",
                c.max_transfers, pad, c.block_on_miss ? "the GPU waits for a late copy"
                                                      : "a late copy leaves it to the CPU",
                (double)s->cap / 1048576.0);
        if (!c.dedicated_streams)
            HM_LOGW("post-fetch: LLAMA_POSTFETCH_USE_DEDICATED_STREAMS=0 changes nothing here: "
                    "the copies always run on the copy lane's own stream");
    }
    if (report && !report_add(report, "post-fetch: %s%s%s\n", on ? "on" : "off (",
                              on ? "" : why, on ? "" : ")"))
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (placement report)");
    return HM_OK;
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
    st = postfetch_open(s, gpu, t, &cal, report, err);
    if (st != HM_OK) return st;
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
