/* context.c - hm_context: which engine runs a model, and hm_decode on top of it.
 *
 * DESIGN: the context resolves the user's parameters once (defaults, clamps, the KV types each
 * engine takes), then creates exactly one engine. With placement flags it plans first
 * (placement_open: the device, the GPU engine's sizes, moe_placement_plan, the report) and runs
 * the plan it can run: the GPU engine for a plan with everything on the device, the GPU engine
 * with the plan's residency map plus the tiered runtime's CPU side for a plan whose only host
 * tensors are routed experts, the CPU engine for one with nothing on the device or when there
 * is no GPU (said in one line, refused under gpu_strict); a split plan (a partial -ngl: layers
 * [0, k) wholly on the host, the later ones and the output on the device) runs both engines,
 * the CPU engine on layers [0, k) and the GPU engine (layer_begin k) on the rest, and any other
 * plan with attention on both sides is refused with what to use instead. Without placement
 * flags: the CPU engine. hm_decode validates its arguments for all (token ids, positions,
 * sizes), keeps the cache length (n_past) and runs the tokens: on the CPU in ubatches of at most
 * n_ubatch, on the GPU in one call (the engine splits), on a split context ubatch by ubatch
 * through the CPU's layers, their hidden rows [n][n_embd] f32 then through the GPU's. Routing reaches the observer per call on the CPU; on the
 * GPU the device counts are read after each hm_decode call and when a generation ends
 * (hm_context_flush_routes), never per token.
 */
#include "runtime/context.h"
#include "runtime/runtime_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/log.h"
#include "cpu_engine/cpu_engine.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_engine.h"
#include "cuda/cuda_handoff.h"
#include "cuda/cuda_host.h"
#include "moe/placement.h"
#include "moe/routing_stats.h"
#include "moe/tracer.h"
#include "quant/qtypes.h"
#include "runtime/fetch_setup.h"
#include "runtime/hot_setup.h"
#include "runtime/route_setup.h"
#include "runtime/tiered.h"


hm_context_params hm_context_default_params(void) {
    hm_context_params p = {.n_ctx = 0, .n_batch = 2048, .n_ubatch = 512, .n_threads = 0,
                           .type_k = HM_TYPE_F16, .type_v = HM_TYPE_F16, .check_ram = true,
                           .n_gpu_layers = 0, .cpu_moe = false, .n_cpu_moe = 0,
                           .override_tensor = NULL, .vram_budget = 0, .main_gpu = 0,
                           .gpu_strict = false, .moe_hot_cache = NULL,
                           .moe_hot_cache_max_mib = -1, .moe_hot_cache_reserve_mib = 1024,
                           .moe_hot_cache_weight = hot_weight_default(),
                           .moe_hot_cache_policy = HOT_POLICY_STATIC,
                           .moe_hot_cache_update_rate = 0.0,
                           .moe_hot_cache_update_interval = 256};
    return p;
}

/* Fills in defaults and clamps; returns HM_ERR_ARG on nonsense. */
static hm_status resolve_params(const hm_model *m, const hm_context_params *in,
                                hm_context_params *p, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(m);
    *p = in ? *in : hm_context_default_params();
    if (p->n_ctx < 0 || p->n_batch < 0 || p->n_ubatch < 0 || p->n_threads < 0)
        return hm_error_set(err, HM_ERR_ARG, "context sizes and thread count must be >= 0");
    if (p->n_gpu_layers < 0 || p->main_gpu < 0 || p->n_cpu_moe < 0 ||
        p->moe_offload_threshold < 0)
        return hm_error_set(err, HM_ERR_ARG, "-ngl, --n-cpu-moe, --moe-offload-threshold and "
                            "-mg must be >= 0");
    if (p->moe_hot_cache_max_mib < -1 || p->moe_hot_cache_max_mib == 0 ||
        p->moe_hot_cache_reserve_mib < 0)
        return hm_error_set(err, HM_ERR_ARG, "--moe-hot-cache-max-mib must be -1 or > 0 and "
                            "--moe-hot-cache-reserve-mib >= 0 (got %lld and %lld)",
                            (long long)p->moe_hot_cache_max_mib,
                            (long long)p->moe_hot_cache_reserve_mib);
    if (!(p->moe_hot_cache_update_rate >= 0 && p->moe_hot_cache_update_rate <= 1) ||
        p->moe_hot_cache_update_interval < 1 || p->moe_hot_cache_policy < 0 ||
        p->moe_hot_cache_policy >= HOT_POLICY_COUNT)
        return hm_error_set(err, HM_ERR_ARG, "--moe-hot-cache-update-rate must be in [0, 1], "
                            "--moe-hot-cache-update-interval >= 1 and the policy known");
    if (p->n_seq < 0 || p->n_seq > 256)
        return hm_error_set(err, HM_ERR_ARG, "%d sequences (-np): 1 to 256", p->n_seq);
    if (p->n_seq == 0) p->n_seq = 1;
    if (p->n_ctx == 0) p->n_ctx = (int)(hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    if (p->n_batch == 0) p->n_batch = 2048;
    if (p->n_ubatch == 0) p->n_ubatch = 512;
    if ((int64_t)p->n_batch > (int64_t)p->n_ctx * p->n_seq) /* a batch holds every sequence's */
        p->n_batch = (int)((int64_t)p->n_ctx * p->n_seq);
    if (p->n_ubatch > p->n_batch) p->n_ubatch = p->n_batch;
    if (p->n_threads == 0) p->n_threads = hm_cpu_count_allowed();
    if (p->n_ctx > (1 << 24))
        return hm_error_set(err, HM_ERR_RANGE, "context size %d is too large (max %d)", p->n_ctx,
                            1 << 24);
    if (p->n_threads > 1024)
        return hm_error_set(err, HM_ERR_RANGE, "thread count %d is too large (max 1024)",
                            p->n_threads);
    for (int i = 0; i < 2; i++) {
        uint32_t t = i ? p->type_v : p->type_k;
        if (t != HM_TYPE_F16 && t != HM_TYPE_Q8_0 && t != HM_TYPE_F32 && t != HM_TYPE_BF16)
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "unsupported KV cache type %s (use f32,"
                                " f16, bf16 or q8_0)", hm_type_name(t));
        if (t == HM_TYPE_Q8_0 && hp->head_dim_k % 32)
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "q8_0 KV cache needs a head size that "
                                "is a multiple of 32 (this model: %lld)",
                                (long long)hp->head_dim_k);
    }
    return HM_OK;
}

static cpu_engine_params cpu_params(const hm_context_params *p) {
    return (cpu_engine_params){.n_ctx = p->n_ctx, .n_ubatch = p->n_ubatch,
                               .n_threads = p->n_threads, .type_k = p->type_k,
                               .type_v = p->type_v, .n_seq = p->n_seq};
}

uint64_t hm_context_bytes(const hm_model *m, const hm_context_params *params) {
    hm_context_params p;
    if (resolve_params(m, params, &p, NULL) != HM_OK) return 0;
    const cpu_engine_params cp = cpu_params(&p);
    return cpu_engine_bytes(m, &cp);
}

/* ---- placement ---- */

/* The GPU engine's admission control keeps this much of the free VRAM for the CUDA context's
 * own allocations and graphs (the reserve of cuda_engine_init.cu); the plan is given the free
 * memory without it, so a plan that fits is one the engine admits. */
static const uint64_t k_cuda_reserve = 256ull << 20;

static bool placement_asked(const hm_context_params *p) {
    return p->n_gpu_layers > 0 || p->cpu_moe || p->n_cpu_moe > 0 ||
           (p->override_tensor && *p->override_tensor) || p->vram_budget > 0;
}

static void appendf(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t cap, const char *fmt, ...) {
    const size_t n = strlen(buf);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* The placement flags for messages: "-ngl 99 --cpu-moe --n-cpu-moe 2 -ot '...' ...". */
static const char *placement_flags(const hm_context_params *p, char *buf, size_t cap) {
    buf[0] = 0;
    appendf(buf, cap, "-ngl %d", p->n_gpu_layers);
    if (p->cpu_moe) appendf(buf, cap, " --cpu-moe");
    if (p->n_cpu_moe > 0) appendf(buf, cap, " --n-cpu-moe %d", p->n_cpu_moe);
    if (p->override_tensor && *p->override_tensor)
        appendf(buf, cap, " -ot '%s'", p->override_tensor);
    if (p->vram_budget > 0)
        appendf(buf, cap, " --vram-budget %llu", (unsigned long long)(p->vram_budget >> 20));
    return buf;
}

/* What the plan needs to know of the GPU: whether it can take part (why not, if not), its free
 * memory less the reserve, and the GPU engine's sizes besides the weights: KV bytes of one
 * layer and scratch, to which the engine's 256-byte alignment of every tensor is added (the
 * planner counts tensor bytes unaligned; the whole model's padding bounds any part's). */
typedef struct {
    bool have;
    char why[HM_ERROR_MSG_MAX];
    uint64_t free;
    uint64_t kv_layer, scratch;
} gpu_facts;

static void gpu_facts_get(const hm_model *m, const hm_context_params *p, gpu_facts *g) {
    const hm_hparams *hp = hm_model_hparams(m);
    memset(g, 0, sizeof(*g));
    /* without an engine to ask: the K and V rows of every position (f32 4 bytes an element,
     * the GPU's other type f16 2), no scratch */
    g->kv_layer = (uint64_t)p->n_ctx * (uint64_t)p->n_seq * (uint64_t)hp->n_head_kv *
                  ((uint64_t)hp->head_dim_k * (p->type_k == HM_TYPE_F32 ? 4u : 2u) +
                   (uint64_t)hp->head_dim_v * (p->type_v == HM_TYPE_F32 ? 4u : 2u));
    cuda_device_info info[16];
    int n_dev = 0;
    hm_error e = {0};
    if (!cuda_compiled()) {
        snprintf(g->why, sizeof(g->why), "built without CUDA");
        return;
    }
    if (cuda_device_query(info, 16, &n_dev, &e) != HM_OK) {
        snprintf(g->why, sizeof(g->why), "%s", e.msg);
        return;
    }
    if (n_dev == 0) {
        snprintf(g->why, sizeof(g->why), "no CUDA device");
        return;
    }
    if (p->main_gpu >= n_dev) {
        snprintf(g->why, sizeof(g->why), "device %d does not exist (-mg; %d device%s)",
                 p->main_gpu, n_dev, n_dev == 1 ? "" : "s");
        return;
    }
    const cuda_engine_params ep = {.device = p->main_gpu, .n_ctx = p->n_ctx,
                                   .n_ubatch = p->n_ubatch, .type_k = p->type_k,
                                   .type_v = p->type_v, .n_seq = p->n_seq};
    uint64_t wb = 0, kvb = 0, sb = 0;
    if (cuda_engine_plan(m, &ep, &wb, &kvb, &sb, &e) != HM_OK) {
        snprintf(g->why, sizeof(g->why), "%s", e.msg);
        return;
    }
    const uint64_t raw = hm_model_weight_bytes(m);
    g->have = true;
    g->free = info[p->main_gpu].free_bytes > k_cuda_reserve
                  ? info[p->main_gpu].free_bytes - k_cuda_reserve : 0;
    g->kv_layer = hp->n_layer > 0 ? (kvb + (uint64_t)hp->n_layer - 1) / (uint64_t)hp->n_layer : 0;
    g->scratch = sb + (wb > raw ? wb - raw : 0);
}

/* Logs the report line by line (one log line each, as the rest of the load log). */
static void log_report(hm_log_level level, const char *text) {
    for (const char *s = text; s && *s;) {
        const char *nl = strchr(s, '\n');
        const int n = nl ? (int)(nl - s) : (int)strlen(s);
        hm_log(level, "%.*s", n, s);
        s += n + (nl ? 1 : 0);
    }
}

typedef enum { PLAN_HOST, PLAN_FULL, PLAN_TIERED, PLAN_SPLIT, PLAN_MIXED } plan_kind;

/* The GPU's first layer k when p is a split plan (a partial -ngl): every tensor of layers
 * [0, k) on the host; in layers [k, n_layer) the attention and every tensor but the routed
 * experts on the device (experts in RAM there: the GPU engine's host layers); the output norm
 * and matrix on the device (token_embd is read by the CPU whatever its tier). 0 when p is not. */
static int split_layer(const moe_placement *p) {
    int k = 0;
    while (k < p->n_layer && !p->attn_device[k]) k++;
    if (k == 0) return 0;
    for (int il = k; il < p->n_layer; il++)
        if (!p->attn_device[il]) return 0;
    for (int i = 0; i < p->n_tensor; i++) {
        const moe_placement_tensor *t = &p->tensors[i];
        const bool dev = t->tier == MOE_TIER_DEVICE;
        if (t->kind == MOE_TENSOR_OUTPUT && !dev) return 0;
        if (t->layer < 0) continue;
        if (t->layer < k ? dev : !dev && t->kind != MOE_TENSOR_EXPERTS) return 0;
    }
    return k;
}

/* What kind of plan p is; *host_tensor: the first tensor other than a routed expert's that
 * stays on the host (NULL when none). */
static plan_kind plan_classify(const moe_placement *p, const moe_placement_tensor **host_tensor) {
    bool any_dev = false, all_dev = true, attn_host = false;
    *host_tensor = NULL;
    for (int i = 0; i < p->n_tensor; i++) {
        const moe_placement_tensor *t = &p->tensors[i];
        if (t->tier == MOE_TIER_DEVICE) {
            any_dev = true;
            continue;
        }
        all_dev = false;
        if (t->kind != MOE_TENSOR_EXPERTS && !*host_tensor) *host_tensor = t;
    }
    for (int il = 0; il < p->n_layer; il++) attn_host |= !p->attn_device[il];
    if (!any_dev) return PLAN_HOST;
    if (all_dev) return PLAN_FULL;
    if (!attn_host && !*host_tensor) return PLAN_TIERED;
    if (split_layer(p) > 0) return PLAN_SPLIT;
    return PLAN_MIXED;
}

/* "0-2, 5": the layers whose attention stays on the host. */
static void host_attn_layers(const moe_placement *p, char *buf, size_t cap) {
    buf[0] = 0;
    for (int i = 0; i < p->n_layer; i++) {
        if (p->attn_device[i]) continue;
        int j = i;
        while (j + 1 < p->n_layer && !p->attn_device[j + 1]) j++;
        appendf(buf, cap, "%s%d", buf[0] ? ", " : "", i);
        if (j > i) appendf(buf, cap, "-%d", j);
        i = j;
    }
}

static hm_status refuse_mixed(const hm_context *c, const moe_placement_tensor *host_tensor,
                              hm_error *err) {
    char flags[256], layers[160];
    placement_flags(&c->p, flags, sizeof(flags));
    host_attn_layers(&c->plan, layers, sizeof(layers));
    if (layers[0])
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "placement %s: the attention of layers %s "
                            "would run on the host while the GPU holds the rest, and not as "
                            "the first layers wholly on the host (what -ngl N runs: layers "
                            "[0, k) on the CPU, the later ones and the output on the GPU); use "
                            "-ngl N alone, -ngl 99 --cpu-moe (attention on the GPU, routed "
                            "experts in RAM), -ngl 99 --n-cpu-moe N, or -ngl 0 (CPU only)", flags,
                            layers);
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "placement %s: %s would stay on the host; "
                        "while the GPU runs the model only routed expert tensors (ffn_*_exps) "
                        "may stay in RAM: drop that -ot, or use --cpu-moe / --n-cpu-moe N for "
                        "the experts", flags, host_tensor ? host_tensor->name : "a tensor");
}

/* The fetched-expert path of a tiered engine (runtime/fetch_setup.h): staging buffers of the
 * size the plan reserved, else what the budget leaves (at most the largest layer's experts). */
static hm_status fetch_open(hm_context *c, hm_error *err) {
    uint64_t cap = c->staging;
    if (!cap && c->plan.budget > c->plan.device_total) {
        const uint64_t full = fetch_setup_full_cap(c->m);
        cap = (c->plan.budget - c->plan.device_total) / 2;
        if (cap > full) cap = full;
    }
    return fetch_setup_open(&c->fetch, c->m, c->gpu, c->tiered, c->p.main_gpu, (size_t)cap,
                            c->p.moe_offload_threshold, &c->report, err);
}

/* The GPU engine for the plan: the whole model (res NULL), or the tiered plan (res: the plan's
 * residency map, whose host-only layers the engine hands to the CPU side, runtime/tiered.h);
 * split > 0: from that layer on (the CPU engine runs the ones before, c->split). HM_OK with
 * c->gpu set, or why it cannot start (in e2; nothing left open). */
static hm_status gpu_start(hm_context *c, const hm_residency *res, int split, hm_error *e2) {
    cuda_engine_params ep = {.device = c->p.main_gpu, .n_ctx = c->p.n_ctx,
                             .n_ubatch = c->p.n_ubatch, .type_k = c->p.type_k,
                             .type_v = c->p.type_v, .res = res, .vram_budget = c->p.vram_budget,
                             .layer_begin = split, .n_seq = split > 0 ? 1 : c->p.n_seq};
    hm_status st = cuda_engine_init(c->m, &ep, &c->gpu, e2);
    if (st == HM_OK && cuda_engine_host_layers(c->gpu) > 0) {
        hm_tiered_params tp = hm_tiered_default_params();
        tp.n_threads = c->tiered_threads;
        st = hm_tiered_init(c->m, c->gpu, &tp, &c->tiered, e2);
        if (st == HM_OK) st = fetch_open(c, e2);
        if (st == HM_OK)
            st = hot_setup_control(c->m, &c->p, &c->plan.res, c->gpu, c->tiered, e2);
        if (st == HM_OK && c->p.moe_layer_perf == HM_LAYER_PERF_FULL)
            st = hm_tiered_perf_enable(c->tiered, e2);
        if (st != HM_OK) {
            hm_tiered_free(c->tiered);
            c->tiered = NULL;
            fetch_setup_close(&c->fetch, c->gpu);
            cuda_engine_free(c->gpu);
            c->gpu = NULL;
        }
    }
    if (st == HM_OK) {
        c->split = split;
        if (split > 0)
            HM_LOGI("placement: layers 0-%d on the CPU (%d threads), %s on the GPU", split - 1,
                    c->p.n_threads, split < c->plan.n_layer ? "the later layers and the output"
                                                            : "the output layer");
        if (c->tiered)
            HM_LOGI("GPU: %s; the routed experts of %d layers in RAM, computed by %d CPU threads",
                    cuda_engine_describe(c->gpu), cuda_engine_host_layers(c->gpu),
                    hm_tiered_n_threads(c->tiered));
        else
            HM_LOGI("GPU: %s", cuda_engine_describe(c->gpu));
        return HM_OK;
    }
    c->gpu = NULL;
    return st;
}

/* gpu_start, or when it cannot start, the CPU (logged) unless gpu_strict. */
static hm_status gpu_open(hm_context *c, const hm_residency *res, int split, hm_error *err) {
    hm_error e2 = {0};
    const hm_status st = gpu_start(c, res, split, &e2);
    if (st == HM_OK) return HM_OK;
    if (c->p.gpu_strict)
        return hm_error_set(err, st, "GPU required (--gpu-strict) but unavailable: %s", e2.msg);
    HM_LOGW("GPU unavailable (%s); running on the CPU", e2.msg);
    return HM_OK;
}

/* A tiered plan with the hot cache's slots added (runtime/hot_setup.h); when the engine cannot
 * start with them (out of VRAM while building it, say), without them: the plan as it was, said. */
static hm_status hot_open(hm_context *c, hm_error *err) {
    hot_setup_undo u;
    hm_status st = hot_setup_apply(c->m, &c->p, &c->plan, &c->report, &u, err);
    if (st != HM_OK) return st;
    hm_error e2 = {0};
    if (u.added && gpu_start(c, &c->plan.res, 0, &e2) == HM_OK) {
        hot_setup_undo_free(&u);
        return HM_OK;
    }
    if (u.added) c->p.moe_hot_cache = NULL; /* no controller, no updates */
    hot_setup_revert(&c->plan, &u, e2.msg, &c->report);
    return gpu_open(c, &c->plan.res, 0, err);
}

/* Plans the placement, logs the report, and starts what runs it (see DESIGN). HM_OK with
 * c->gpu NULL: the CPU engine runs the model. */
static hm_status placement_open(hm_context *c, hm_error *err) {
    gpu_facts g;
    gpu_facts_get(c->m, &c->p, &g);
    moe_placement_options o = moe_placement_default_options();
    o.n_gpu_layers = c->p.n_gpu_layers;
    o.cpu_moe = c->p.cpu_moe;
    o.n_cpu_moe = c->p.n_cpu_moe;
    o.overrides = c->p.override_tensor;
    o.vram_budget = c->p.vram_budget;
    o.vram_free = g.free;
    o.kv_bytes_per_layer = g.kv_layer;
    o.scratch_bytes = g.scratch;
    /* two staging buffers for the prompts' fetched experts (runtime/fetch_setup.h) */
    const uint64_t staging =
        g.have ? fetch_setup_staging(fetch_setup_full_cap(c->m), g.free, c->p.vram_budget) : 0;
    if (c->p.cpu_moe || c->p.n_cpu_moe > 0 || (c->p.override_tensor && *c->p.override_tensor)) {
        c->staging = staging; /* experts asked into RAM */
        o.scratch_bytes += 2 * staging;
    } else {
        o.tier_scratch_bytes = 2 * staging; /* should the automatic choice put some there */
    }
    o.gpu_strict = c->p.gpu_strict && g.have; /* no GPU: refused below, with the reason */
    hm_status st = moe_placement_plan(c->m, &o, &c->plan, err);
    if (st != HM_OK) return st;
    if (c->plan.tier_scratch) c->staging = staging;
    c->report = moe_placement_report(&c->plan);
    if (!c->report) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (placement report)");
    const moe_placement *pl = &c->plan;
    const bool wants_gpu = pl->asked_device_total > 0 || pl->device_total > 0;
    if (!g.have) { /* the plan is a report only (debug level) */
        log_report(HM_LOG_DEBUG, c->report);
        if (!wants_gpu) return HM_OK;
        if (c->p.gpu_strict)
            return hm_error_set(err, HM_ERR_UNSUPPORTED, "GPU required (--gpu-strict) but "
                                "unavailable: %s", g.why);
        char flags[256];
        HM_LOGW("GPU unavailable (%s): the GPU placement (%s) is ignored; running on the CPU "
                "only", g.why, placement_flags(&c->p, flags, sizeof(flags)));
        return HM_OK;
    }
    log_report(HM_LOG_INFO, c->report);
    const moe_placement_tensor *host_tensor = NULL;
    const plan_kind kind = plan_classify(pl, &host_tensor);
    if (kind == PLAN_HOST) return HM_OK;
    if (!pl->fits) {
        char need[32], bud[32], flags[256];
        return hm_error_set(err, HM_ERR_NOMEM, "placement %s needs %s of VRAM, the budget is %s "
                            "(%s): put fewer layers on the GPU (-ngl), more experts in RAM "
                            "(--cpu-moe, --n-cpu-moe N), or raise --vram-budget",
                            placement_flags(&c->p, flags, sizeof(flags)),
                            hm_bytes_str(pl->device_total, need), hm_bytes_str(pl->budget, bud),
                            c->p.vram_budget ? "--vram-budget" : "the free VRAM");
    }
    if (c->p.moe_hot_cache && kind != PLAN_TIERED)
        HM_LOGW("hot cache: --moe-hot-cache needs a placement that keeps routed experts in RAM "
                "with the attention on the GPU (-ngl 99 --cpu-moe, --n-cpu-moe N, ...): ignored");
    if (kind == PLAN_FULL) return gpu_open(c, NULL, 0, err);
    if (kind == PLAN_TIERED && c->p.moe_hot_cache) return hot_open(c, err);
    if (kind == PLAN_TIERED) return gpu_open(c, &pl->res, 0, err);
    if (kind == PLAN_SPLIT) return gpu_open(c, &pl->res, split_layer(pl), err);
    return refuse_mixed(c, host_tensor, err);
}

/* RAM for the weights (mapped) and, on the CPU path, the KV cache and buffers; a context on the
 * GPU keeps those in VRAM (its admission control checked them). */
static hm_status check_ram(const hm_context *c, hm_error *err) {
    uint64_t ctx_bytes = c->gpu ? 0 : hm_context_bytes(c->m, &c->p);
    if (c->split > 0) { /* the CPU's layers' KV cache and buffers, and the hand-over rows */
        cpu_engine_params cp = cpu_params(&c->p);
        cp.layer_end = c->split;
        ctx_bytes = cpu_engine_bytes(c->m, &cp) + sizeof(float) * (uint64_t)c->p.n_ubatch *
                                                      (uint64_t)hm_model_hparams(c->m)->n_embd;
    }
    const uint64_t need = hm_model_weight_bytes(c->m) + ctx_bytes, ram = hm_ram_bytes();
    if (!ram || need <= ram) return HM_OK;
    char b1[32], b2[32], b3[32], b4[32];
    return hm_error_set(err, HM_ERR_NOMEM, "model needs %s of RAM (weights %s + KV cache and "
                        "buffers %s for -c %d) but this machine has %s", hm_bytes_str(need, b1),
                        hm_bytes_str(hm_model_weight_bytes(c->m), b2),
                        hm_bytes_str(ctx_bytes, b3), c->p.n_ctx, hm_bytes_str(ram, b4));
}

hm_status hm_context_init(const hm_model *m, const hm_context_params *params, hm_context **out,
                          hm_error *err) {
    *out = NULL;
    hm_context_params p;
    hm_status st = resolve_params(m, params, &p, err);
    if (st != HM_OK) return st;
    hm_context *c = calloc(1, sizeof(*c));
    if (!c) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (context)");
    c->m = m;
    c->p = p;
    c->tiered_threads = params->n_threads;
    if (p.moe_hot_cache) {
        c->hot_cache = strdup(p.moe_hot_cache);
        c->p.moe_hot_cache = c->hot_cache;
        if (!c->hot_cache) st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (context)");
    }
    if (p.override_tensor) {
        c->override_tensor = strdup(p.override_tensor);
        c->p.override_tensor = c->override_tensor;
        if (!c->override_tensor) st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (context)");
    }
    if (st == HM_OK && placement_asked(&c->p)) st = placement_open(c, err);
    if (st == HM_OK && c->p.n_seq > 1 && c->split > 0)
        st = hm_error_set(err, HM_ERR_UNSUPPORTED, "%d sequences (-np %d): a placement split "
                          "between the CPU and the GPU engines (a partial -ngl) runs one "
                          "sequence; use -ngl 99 (with --cpu-moe or --n-cpu-moe for experts in "
                          "RAM) or -ngl 0", c->p.n_seq, c->p.n_seq);
    if (st == HM_OK &&
        (!(c->seq_past = calloc((size_t)c->p.n_seq, sizeof(int))) ||
         !(c->seq_add = calloc((size_t)c->p.n_seq, sizeof(int))) ||
         !(c->seq_pos = malloc(sizeof(int32_t) * (size_t)c->p.n_batch))))
        st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (context)");
    if (st == HM_OK && c->p.routing_profile) st = route_setup_open(c->m, &c->p, c->gpu, err);
    if (st == HM_OK && c->p.moe_hot_cache && !c->gpu)
        HM_LOGW("hot cache: --moe-hot-cache needs a GPU running a placement that keeps routed "
                "experts in RAM (-ngl 99 --cpu-moe, ...): ignored");
    if (st == HM_OK && p.check_ram) st = check_ram(c, err);
    if (st == HM_OK && (!c->gpu || c->split > 0)) {
        char buf[160];
        const char *w = hm_cpu_threads_warning(p.n_threads, buf, sizeof(buf));
        if (w) HM_LOGW("%s", w);
        cpu_engine_params cp = cpu_params(&p);
        cp.layer_end = c->split; /* 0: every layer */
        st = cpu_engine_init(m, &cp, &c->cpu, err);
        if (st == HM_OK && c->split > 0 &&
            !(c->rows = malloc(sizeof(float) * (size_t)p.n_ubatch *
                               (size_t)hm_model_hparams(m)->n_embd)))
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (hidden rows)");
    }
    if (st != HM_OK) {
        hm_context_free(c);
        return st;
    }
    *out = c;
    return HM_OK;
}

void hm_context_free(hm_context *c) {
    if (!c) return;
    hm_tiered_free(c->tiered); /* before the engine it serves */
    fetch_setup_close(&c->fetch, c->gpu); /* after the worker that copies, before the engine */
    cuda_engine_free(c->gpu);
    cpu_engine_free(c->cpu);
    free(c->rows);
    free(c->seq_past);
    free(c->seq_add);
    free(c->seq_pos);
    free(c->hits);
    free(c->calls);
    free(c->tokens);
    moe_placement_free(&c->plan);
    free(c->report);
    free(c->override_tensor);
    free(c->hot_cache);
    free(c);
}

int hm_context_n_past(const hm_context *c) { return c->n_past; }
int hm_context_n_ctx(const hm_context *c) { return c->p.n_ctx; }
int hm_context_n_batch(const hm_context *c) { return c->p.n_batch; }
const hm_model *hm_context_model(const hm_context *c) { return c->m; }
int hm_context_n_threads(const hm_context *c) {
    if (c->tiered) return hm_tiered_n_threads(c->tiered);
    return c->cpu ? cpu_engine_n_threads(c->cpu) : c->p.n_threads;
}
struct cuda_engine *hm_context_gpu(const hm_context *c) { return c->gpu; }

struct hm_tiered *hm_context_tiered(const hm_context *c) { return c->tiered; }

hm_status hm_context_perf_write(hm_context *c, const char *path, hm_error *err) {
    if (!c->tiered)
        return hm_error_set(err, HM_ERR_STATE, "layer perf: counts the layers whose experts the "
                            "CPU side serves (a tiered placement on a GPU): none here");
    const hm_arch_desc *d = hm_model_arch(c->m);
    return hm_tiered_perf_write(c->tiered, path, d ? d->name : NULL, NULL, err);
}
void hm_context_memory(const hm_context *c, uint64_t *vram, uint64_t *pinned) {
    const void *base = NULL;
    size_t len = 0;
    double secs = 0;
    if (c->fetch.reg) cuda_host_reg_range(c->fetch.reg, &base, &len, &secs);
    *vram = c->gpu ? c->plan.device_total : 0;
    *pinned = (uint64_t)len;
}
const char *hm_context_placement_report(const hm_context *c) { return c->report; }
int hm_context_split_layer(const hm_context *c) { return c->split; }
moe_exec *hm_context_exec(hm_context *c) { return c->cpu ? cpu_engine_exec(c->cpu) : NULL; }

void hm_context_reset(hm_context *c) {
    /* the GPU's KV cache is overwritten from the position a decode starts at; its recurrent
     * states (hybrid layers) are zeroed on its stream: a failure there is the stream's error,
     * which the next step reports */
    if (c->cpu) cpu_engine_seq_reset(c->cpu, 0);
    if (c->gpu) (void)cuda_engine_seq_reset(c->gpu, 0, NULL);
    c->n_past = 0;
}

/* A recurrent state (hybrid layers) on the GPU is not rewound: keeping fewer positions than a
 * sequence holds is refused, as the CPU engine refuses it (docs/HYBRID.md). */
static hm_status gpu_state_cut(const hm_context *c, int seq, int n_keep, int n_past, hm_error *err) {
    if (!c->gpu || !hm_model_arch(c->m)->hybrid || n_keep == n_past) return HM_OK;
    return hm_error_set(err, HM_ERR_STATE, "%s: sequence %d's recurrent state holds %d tokens and "
                        "is not rewound to %d (clear the sequence and read it again)",
                        hm_model_arch(c->m)->name, seq, n_past, n_keep);
}

hm_status hm_context_truncate(hm_context *c, int n_keep, hm_error *err) {
    if (n_keep < 0 || n_keep > c->n_past)
        return hm_error_set(err, HM_ERR_ARG, "cannot keep %d positions of %d", n_keep, c->n_past);
    if (n_keep == 0) {
        hm_context_reset(c);
        return HM_OK;
    }
    if (c->cpu) { /* the GPU keeps every position of every layer */
        hm_status st = cpu_engine_truncate_check(c->cpu, n_keep, err);
        if (st != HM_OK) return st;
    }
    hm_status st = gpu_state_cut(c, 0, n_keep, c->n_past, err);
    if (st != HM_OK) return st;
    c->n_past = n_keep;
    return HM_OK;
}

/* ---- routing observer ---- */

hm_status hm_context_set_observer(hm_context *c, const moe_observer *o, hm_error *err) {
    c->obs = o ? *o : (moe_observer){0};
    if (c->cpu) cpu_engine_set_observer(c->cpu, o); /* a split context: the CPU's layers */
    if (!c->gpu) return HM_OK;
    const bool want = o && o->counts;
    if (want && !c->hits) {
        const hm_hparams *hp = hm_model_hparams(c->m);
        const size_t nl = (size_t)hp->n_layer, ne = (size_t)(hp->n_expert > 0 ? hp->n_expert : 1);
        c->hits = calloc(nl * ne, sizeof(uint64_t));
        c->calls = calloc(nl, sizeof(uint64_t));
        c->tokens = calloc(nl, sizeof(uint64_t));
        if (!c->hits || !c->calls || !c->tokens)
            return hm_error_set(err, HM_ERR_NOMEM, "out of memory (route counts)");
    }
    if (want == c->gpu_counting) return HM_OK;
    hm_status st = cuda_engine_route_counts_enable(c->gpu, want, err);
    if (st == HM_OK) c->gpu_counting = want;
    return st;
}

static void tracer_route(void *user, int layer, int64_t n_tok, int n_used, const int32_t *ids,
                         const float *weights) {
    (void)weights;
    moe_tracer_record(user, layer, ids, n_tok, n_used);
}

static void tracer_counts(void *user, int layer, uint64_t calls, uint64_t tokens,
                          const uint64_t *hits) {
    moe_tracer_add_counts(user, layer, calls, tokens, hits);
}

hm_status hm_context_set_tracer(hm_context *c, struct moe_tracer *t, hm_error *err) {
    if (!t) return hm_context_set_observer(c, NULL, err);
    const moe_observer o = {.route = tracer_route, .counts = tracer_counts, .user = t};
    return hm_context_set_observer(c, &o, err);
}

hm_status hm_context_flush_routes(hm_context *c, hm_error *err) {
    if (!c->gpu || !c->gpu_counting) return HM_OK;
    const hm_hparams *hp = hm_model_hparams(c->m);
    const size_t nl = (size_t)hp->n_layer, ne = (size_t)hp->n_expert;
    memset(c->hits, 0, nl * ne * sizeof(uint64_t));
    memset(c->calls, 0, nl * sizeof(uint64_t));
    memset(c->tokens, 0, nl * sizeof(uint64_t));
    hm_status st = cuda_engine_route_counts_read(c->gpu, c->hits, c->calls, c->tokens, err);
    if (st != HM_OK) return st;
    for (size_t il = 0; il < nl; il++)
        if (c->calls[il]) c->obs.counts(c->obs.user, (int)il, c->calls[il], c->tokens[il],
                                        c->hits + il * ne);
    return HM_OK;
}

/* ---- decode ---- */

static hm_status check_decode(const hm_context *c, const int32_t *tokens, int n_tok, int pos,
                              const float *logits, hm_logits_mode mode, hm_error *err) {
    const hm_hparams *hp = hm_model_hparams(c->m);
    if (n_tok <= 0 || !tokens)
        return hm_error_set(err, HM_ERR_ARG, "nothing to decode (%d tokens)", n_tok);
    if (mode != HM_LOGITS_NONE && !logits)
        return hm_error_set(err, HM_ERR_ARG, "logits requested but no buffer given");
    if (n_tok > c->p.n_batch)
        return hm_error_set(err, HM_ERR_ARG, "%d tokens in one call exceed the batch size %d "
                            "(-b)", n_tok, c->p.n_batch);
    if (pos < 0 || pos > c->n_past)
        return hm_error_set(err, HM_ERR_ARG, "position %d is past the %d positions in the cache",
                            pos, c->n_past);
    if ((int64_t)pos + n_tok > c->p.n_ctx)
        return hm_error_set(err, HM_ERR_RANGE, "%d tokens at position %d do not fit the context "
                            "size %d (-c)", n_tok, pos, c->p.n_ctx);
    for (int i = 0; i < n_tok; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return hm_error_set(err, HM_ERR_RANGE, "token id %d at index %d is outside the "
                                "vocabulary (%lld tokens)", tokens[i], i, (long long)hp->n_vocab);
    if (c->gpu && c->obs.route && !c->obs.counts)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "this routing observer needs every routing "
                            "result on the host: it runs on the CPU path only (use -ngl 0)");
    return HM_OK;
}

/* A failed GPU step of a tiered context: the CPU side's reason joins the engine's, and the
 * hand-off is reset so the next call can run (the failed positions are not kept: n_past stays).
 * Returns whether the reset worked. */
static bool tiered_fault(hm_context *c, hm_status st, hm_error *err) {
    hm_error cpu = {0};
    if (hm_tiered_check(c->tiered, &cpu) != HM_OK && err) {
        char gpu_msg[HM_ERROR_MSG_MAX];
        snprintf(gpu_msg, sizeof(gpu_msg), "%s", err->msg);
        hm_error_set(err, st, "%s (CPU side: %s)", gpu_msg, cpu.msg);
    }
    hm_error reset = {0};
    if (hm_tiered_reset(c->tiered, &reset) == HM_OK) return true;
    HM_LOGW("tiered: the hand-off could not be reset: %s", reset.msg);
    return false;
}

bool runtime_context_tiered_recover(hm_context *c, hm_status st, const char *what,
                                    hm_error *err) {
    if (!c->tiered) return false;
    const bool reset = tiered_fault(c, st, err);
    if (st != HM_ERR_STATE || !reset) return false;
    hm_tiered_count_retry(c->tiered);
    HM_LOGW("tiered: %s failed (%s); the hand-off was reset and it is redone", what,
            err ? err->msg : "no reason given");
    return true;
}

/* One GPU engine call of a tiered or all-GPU context, redone once after a tiered fault. */
static hm_status gpu_step(hm_context *c, const int32_t *tokens, const float *rows, int n, int pos,
                          float *logits, hm_logits_mode mode, hm_error *err) {
    for (int attempt = 0;; attempt++) {
        hm_status st = rows ? cuda_engine_decode_rows(c->gpu, rows, n, pos, logits, mode, err)
                            : cuda_engine_decode(c->gpu, tokens, n, pos, logits, mode, err);
        if (st == HM_OK) return st;
        if (attempt == 1) {
            if (c->tiered) tiered_fault(c, st, err);
            return st;
        }
        char what[64];
        snprintf(what, sizeof(what), "the step at position %d", pos);
        if (!runtime_context_tiered_recover(c, st, what, err)) return st;
    }
}

/* A split context: per ubatch, the CPU engine's layers [0, split) from the token ids into
 * c->rows, then the GPU engine's layers and the output from those rows. The CPU's KV cache
 * holds its layers, the GPU's the others; both are overwritten from pos, so n_past is the
 * context's alone. Routing reaches the observer from the CPU per call (route) and from the GPU
 * as counts after the call. */
static hm_status decode_split(hm_context *c, const int32_t *tokens, int n_tok, int pos,
                              float *logits, hm_logits_mode mode, hm_error *err) {
    const int64_t V = hm_model_hparams(c->m)->n_vocab;
    hm_status st = HM_OK;
    for (int done = 0; done < n_tok;) {
        const int n = n_tok - done < c->p.n_ubatch ? n_tok - done : c->p.n_ubatch;
        const bool last = done + n == n_tok;
        const hm_logits_mode um = mode == HM_LOGITS_ALL ? HM_LOGITS_ALL
                                  : (mode == HM_LOGITS_LAST && last) ? HM_LOGITS_LAST
                                                                     : HM_LOGITS_NONE;
        float *lo = mode == HM_LOGITS_ALL ? logits + (size_t)done * (size_t)V : logits;
        st = cpu_engine_forward(c->cpu, tokens + done, NULL, n, pos + done, c->rows, NULL,
                                HM_LOGITS_NONE, err);
        if (st != HM_OK) return st;
        st = gpu_step(c, NULL, c->rows, n, pos + done, lo, um, err);
        if (st != HM_OK) return st;
        c->n_past = pos + done + n;
        done += n;
    }
    return hm_context_flush_routes(c, err);
}

hm_status hm_decode(hm_context *c, const int32_t *tokens, int n_tok, int pos, float *logits,
                    hm_logits_mode mode, hm_error *err) {
    hm_status st = check_decode(c, tokens, n_tok, pos, logits, mode, err);
    if (st == HM_OK && pos < c->n_past) st = hm_context_truncate(c, pos, err);
    if (st != HM_OK) return st;
    if (c->split > 0) return decode_split(c, tokens, n_tok, pos, logits, mode, err);
    if (c->gpu) {
        st = gpu_step(c, tokens, NULL, n_tok, pos, logits, mode, err);
        if (st != HM_OK) return st;
        c->n_past = pos + n_tok;
        return hm_context_flush_routes(c, err);
    }
    const int64_t V = hm_model_hparams(c->m)->n_vocab;
    for (int done = 0; done < n_tok;) {
        int n = n_tok - done < c->p.n_ubatch ? n_tok - done : c->p.n_ubatch;
        bool last = done + n == n_tok;
        hm_logits_mode um = mode == HM_LOGITS_ALL ? HM_LOGITS_ALL
                            : (mode == HM_LOGITS_LAST && last) ? HM_LOGITS_LAST : HM_LOGITS_NONE;
        float *lo = mode == HM_LOGITS_ALL ? logits + (size_t)done * (size_t)V : logits;
        st = cpu_engine_decode(c->cpu, tokens + done, n, pos + done, lo, um, err);
        if (st != HM_OK) return st;
        c->n_past = pos + done + n;
        done += n;
    }
    return HM_OK;
}

void runtime_context_set_past(hm_context *c, int n_past) { c->n_past = n_past; }
