/* engine.c - model + vocabulary + context + sampler from the common flags (see engine.h). */
#include "cli/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "runtime/tiered.h"

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *cli_read_file(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "hotmoe %s: cannot open '%s'\n", cmd, path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    bool bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fprintf(stderr, "hotmoe %s: cannot read '%s'\n", cmd, path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* "hotmoe CMD: PATH: message" for an error of the model file, so that the line always names
 * the file (the loader's messages may not); the path once when the message already has it. */
static void print_model_error(const char *cmd, const char *path, const hm_error *err) {
    if (strstr(err->msg, path))
        fprintf(stderr, "hotmoe %s: %s\n", cmd, err->msg);
    else
        fprintf(stderr, "hotmoe %s: %s: %s\n", cmd, path, err->msg);
}

void cli_engine_close(cli_engine *e) {
    if (e->ctx && e->perf_out) {
        hm_error err = {0};
        if (hm_context_perf_write(e->ctx, e->perf_out, &err) != HM_OK)
            fprintf(stderr, "hotmoe %s: --moe-layer-perf-out: %s\n", e->cmd, err.msg);
        else
            fprintf(stderr, "hotmoe %s: layer perf -> %s\n", e->cmd, e->perf_out);
    }
    hm_gen_free(e->gen);
    hm_context_free(e->ctx);
    tok_vocab_free(e->vocab);
    hm_model_free(e->model);
    memset(e, 0, sizeof(*e));
}

int cli_engine_open(cli_engine *e, const char *cmd, const cli_common_args *a, unsigned what,
                    int n_ctx_default) {
    memset(e, 0, sizeof(*e));
    e->cmd = cmd;
    if (!a->model) {
        fprintf(stderr, "hotmoe %s: no model given (-m FILE)\n", cmd);
        return 1;
    }
    hm_error err = {0};
    hm_model_params mp = hm_model_default_params();
    /* the repacked copies serve the CPU's decode only: not made for a model meant for the GPU */
    mp.repack = a->repack && a->n_gpu_layers <= 0;
    if (a->repack && a->n_gpu_layers > 0)
        fprintf(stderr, "hotmoe %s: --repack is for CPU decode; ignored with -ngl %d\n", cmd,
                a->n_gpu_layers);
    if (hm_model_load(a->model, &mp, &e->model, &err) != HM_OK) {
        print_model_error(cmd, a->model, &err);
        return 1;
    }
    if (a->mlock && gguf_lock(hm_model_gguf(e->model), &err) != HM_OK)
        fprintf(stderr, "hotmoe %s: --mlock: %s; the model stays pageable\n", cmd, err.msg);
    const hm_hparams *hp = hm_model_hparams(e->model);
    e->n_vocab = (int)hp->n_vocab;
    if (what & CLI_ENGINE_VOCAB) {
        if (tok_vocab_load(hm_model_gguf(e->model), &e->vocab, &err) != HM_OK) {
            print_model_error(cmd, a->model, &err);
            cli_engine_close(e);
            return 1;
        }
    }
    hm_context_params cp = hm_context_default_params();
    cp.n_ctx = a->n_ctx > 0 ? a->n_ctx : n_ctx_default;
    if (a->n_seq > 1) { /* -c is every slot's together */
        const int total = cp.n_ctx > 0 ? cp.n_ctx
                          : hp->n_ctx_train > 0 && hp->n_ctx_train < 4096 ? (int)hp->n_ctx_train
                                                                          : 4096;
        cp.n_ctx = total / a->n_seq;
        cp.n_seq = a->n_seq;
        if (cp.n_ctx < 16) {
            fprintf(stderr, "hotmoe %s: -c %d split between %d slots leaves %d positions each "
                    "(at least 16)\n", cmd, total, a->n_seq, cp.n_ctx);
            cli_engine_close(e);
            return 2;
        }
    }
    cp.n_batch = a->n_batch;
    cp.n_ubatch = a->n_ubatch;
    cp.n_threads = a->n_threads;
    cp.type_k = (uint32_t)cli_args_cache_type(a->cache_type_k);
    cp.type_v = (uint32_t)cli_args_cache_type(a->cache_type_v);
    cp.n_gpu_layers = a->n_gpu_layers;
    cp.cpu_moe = a->cpu_moe;
    cp.n_cpu_moe = a->n_cpu_moe;
    cp.vram_budget = (uint64_t)a->vram_budget_mib << 20;
    cp.main_gpu = a->main_gpu;
    cp.gpu_strict = a->gpu_strict;
    cp.moe_offload_threshold = a->moe_offload_threshold;
    cp.moe_hot_cache = a->moe_hot_cache;
    cp.moe_hot_cache_max_mib = a->moe_hot_cache_max_mib;
    cp.moe_hot_cache_reserve_mib = a->moe_hot_cache_reserve_mib;
    cp.moe_hot_cache_weight.layer_curve = a->moe_hot_cache_layer_curve;
    hm_error we;
    hot_weighting_parse(a->moe_hot_cache_weighting, &cp.moe_hot_cache_weight.mode, &we);
    hot_policy_parse(a->moe_hot_cache_policy, &cp.moe_hot_cache_policy, &we);
    cp.moe_hot_cache_update_rate = a->moe_hot_cache_update_rate;
    cp.moe_hot_cache_update_interval = a->moe_hot_cache_update_interval;
    cp.moe_layer_perf = a->moe_layer_perf_out || !strcmp(a->moe_layer_perf, "full")
                            ? HM_LAYER_PERF_FULL
                        : !strcmp(a->moe_layer_perf, "update") ? HM_LAYER_PERF_UPDATE
                                                               : HM_LAYER_PERF_OFF;
    e->perf_out = a->moe_layer_perf_out;
    cp.routing_profile = a->routing_profile;
    cp.routing_seed = 42; /* fixed: the same routing run after run */
    bool oom = false;
    char *ot = cli_args_overrides(a, &oom); /* the context keeps its own copy */
    if (oom) {
        fprintf(stderr, "hotmoe %s: out of memory\n", cmd);
        cli_engine_close(e);
        return 1;
    }
    cp.override_tensor = ot;
    if (hp->n_ctx_train > 0 && cp.n_ctx > hp->n_ctx_train)
        fprintf(stderr, "hotmoe %s: warning: context %d is longer than the model was trained for "
                        "(%lld)\n",
                cmd, cp.n_ctx, (long long)hp->n_ctx_train);
    hm_status st = hm_context_init(e->model, &cp, &e->ctx, &err);
    free(ot);
    if (st != HM_OK) {
        fprintf(stderr, "hotmoe %s: %s\n", cmd, err.msg);
        cli_engine_close(e);
        return st == HM_ERR_ARG ? 2 : 1; /* a bad placement flag (-ot, -mg) is a usage error */
    }
    int n_ctx = hm_context_n_ctx(e->ctx);
    e->n_batch = a->n_batch < n_ctx ? a->n_batch : n_ctx;
    e->n_threads = hm_context_n_threads(e->ctx); /* what runs: the tiered side's own default */
    if (what & CLI_ENGINE_SAMPLER) {
        sample_params sp = sample_params_default();
        sp.temperature = a->temp;
        sp.top_k = a->top_k;
        sp.top_p = a->top_p;
        sp.min_p = a->min_p;
        sp.repeat_penalty = a->repeat_penalty;
        sp.presence_penalty = a->presence_penalty;
        sp.frequency_penalty = a->frequency_penalty;
        sp.penalty_last_n = a->repeat_last_n < 0 ? n_ctx : a->repeat_last_n;
        e->seed = a->seed;
        if (a->seed == CLI_SEED_RANDOM) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            e->seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
        }
        sp.seed = e->seed;
        e->sp = sp;
        hm_gen_params gp = hm_gen_default_params();
        gp.host_loop = (what & CLI_ENGINE_HOST_LOOP) != 0;
        gp.audit_tokens = (what & CLI_ENGINE_AUDIT) ? n_ctx : 0;
        if (hm_gen_init(e->ctx, &sp, &gp, &e->gen, &err) != HM_OK) {
            fprintf(stderr, "hotmoe %s: %s\n", cmd, err.msg);
            cli_engine_close(e);
            return 1;
        }
    }
    HM_LOGD("%s: %s, context %d tokens, batch %d / ubatch %d, %d threads, %s, seed %llu", cmd,
            a->model, hm_context_n_ctx(e->ctx), a->n_batch, a->n_ubatch, e->n_threads,
            cli_engine_backend(e), (unsigned long long)e->seed);
    return 0;
}

const char *cli_engine_backend(const cli_engine *e) {
    return hm_context_gpu(e->ctx) ? "CUDA" : "CPU";
}

void cli_engine_print_audit(const cli_engine *e, const hm_gen *g) {
    hm_gen_audit au;
    hm_gen_audit_get(g, &au);
    int gaps = au.n_tokens > 1 ? au.n_tokens - 1 : 1;
    fprintf(stderr,
            "audit: backend %s (%s), %d tokens, host syncs/token %.3f (%llu in the loop, %llu "
            "at start/end), graph nodes/token %llu (%llu kernels), %llu decode steps, %llu stream "
            "queries, tg mean %.3f ms, cv %.4f over %d tokens\n",
            cli_engine_backend(e), au.gpu ? "autonomous graph" : "host loop", au.n_tokens,
            (double)au.host_syncs / gaps, (unsigned long long)au.host_syncs,
            (unsigned long long)au.host_syncs_end, (unsigned long long)au.graph_nodes,
            (unsigned long long)au.kernel_nodes, (unsigned long long)au.steps,
            (unsigned long long)au.stream_queries,
            au.tg_mean_s * 1e3, au.tg_cv, au.n_timed);
}

void cli_engine_print_tiered(const cli_engine *e) {
    hm_tiered *t = hm_context_tiered(e->ctx);
    if (!t) return;
    hm_tiered_stats s;
    hm_tiered_get_stats(t, &s);
    fprintf(stderr,
            "tiered: %llu layer requests to the CPU (%.1f us computing each), prompt layers %llu "
            "(experts %llu on the GPU from %.1f MiB copied, %llu of %llu copied ahead used, %llu "
            "on the CPU, %.1f ms enqueueing copies, %.1f ms waiting for them); faults %llu, "
            "steps redone %llu, failed copies %llu\n",
            (unsigned long long)s.requests, s.requests ? s.busy_s * 1e6 / (double)s.requests : 0.0,
            (unsigned long long)s.fetch_requests, (unsigned long long)s.gpu_experts,
            (double)s.fetched_bytes / 1048576.0, (unsigned long long)s.ahead_used,
            (unsigned long long)s.ahead_experts, (unsigned long long)s.cpu_experts,
            s.copy_enqueue_s * 1e3, s.copy_wait_s * 1e3,
            (unsigned long long)s.faults, (unsigned long long)s.retries,
            (unsigned long long)s.copy_fallbacks);
    if (s.hot_hits + s.hot_misses > 0)
        fprintf(stderr, "hot cache: %llu hits, %llu misses (hit rate %.1f %%), %llu admissions, "
                "%llu updates, %llu exchanges (%llu refused)\n",
                (unsigned long long)s.hot_hits, (unsigned long long)s.hot_misses,
                100.0 * (double)s.hot_hits / (double)(s.hot_hits + s.hot_misses),
                (unsigned long long)s.hot_admitted, (unsigned long long)s.hot_updates,
                (unsigned long long)s.hot_exchanged, (unsigned long long)s.hot_refused);
    hm_tiered_perf_sum ps;
    hm_error pe;
    if (hm_tiered_perf_mode(t) == HM_LAYER_PERF_FULL &&
        hm_tiered_perf_summary(t, &ps, &pe) == HM_OK && ps.calls > 0) {
        const double n = (double)ps.calls, nt = ps.timed ? (double)ps.timed : 1.0;
        fprintf(stderr, "layer perf: %d layers, %llu requests (%llu timed); per request: wall "
                "%.1f us = hot lane %.1f + join wait %.1f, cold lane %.1f us; fetched %llu "
                "experts (%.1f MiB, waits %.1f ms), post-fetched %llu, fallbacks %llu\n", ps.layers,
                (unsigned long long)ps.calls, (unsigned long long)ps.timed, ps.wall_us / nt,
                ps.hot_us / nt, ps.wait_us / nt, ps.cold_us / n,
                (unsigned long long)ps.fetch_experts, (double)ps.fetch_bytes / 1048576.0,
                ps.fetch_wait_us / 1e3, (unsigned long long)ps.pf_experts,
                (unsigned long long)ps.fallbacks);
    }
    if (s.pf_requests + s.pf_fallbacks > 0) { /* seed 000's metrics */
        const double ov = s.pf_copy_s > 0 ? 1.0 - s.pf_wait_s / s.pf_copy_s : 1.0;
        const uint64_t tried = s.pf_experts + s.pf_fallbacks;
        fprintf(stderr, "post-fetch: %llu requests, %llu down products on the GPU (%.1f MiB "
                "copied), overlap %.1f %%, fallbacks %llu (%.1f %%); scratch: the staging "
                "buffers\n", (unsigned long long)s.pf_requests,
                (unsigned long long)s.pf_experts, (double)s.pf_bytes / 1048576.0,
                100.0 * (ov < 0 ? 0 : ov), (unsigned long long)s.pf_fallbacks,
                tried ? 100.0 * (double)s.pf_fallbacks / (double)tried : 0.0);
    }
}

hm_status cli_engine_eval(cli_engine *e, const int32_t *ids, int n, float *logits_last,
                          float *logits_all, hm_error *err) {
    for (int done = 0; done < n;) {
        int k = n - done < e->n_batch ? n - done : e->n_batch;
        int pos = hm_context_n_past(e->ctx);
        bool last = done + k == n;
        float *out = NULL;
        hm_logits_mode mode = HM_LOGITS_NONE;
        if (logits_all) {
            out = logits_all + (size_t)done * (size_t)e->n_vocab;
            mode = HM_LOGITS_ALL;
        } else if (last && logits_last) {
            out = logits_last;
            mode = HM_LOGITS_LAST;
        }
        hm_status st = hm_decode(e->ctx, ids + done, k, pos, out, mode, err);
        if (st) return st;
        done += k;
    }
    if (logits_all && logits_last && n > 0)
        memcpy(logits_last, logits_all + (size_t)(n - 1) * (size_t)e->n_vocab,
               sizeof(float) * (size_t)e->n_vocab);
    return HM_OK;
}
