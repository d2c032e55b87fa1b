/* context.h - a model running: the context that holds one sequence, on the CPU or a GPU.
 *
 * DESIGN: hm_context_init takes a model, a placement (-ngl, -mg, --gpu-strict) and options
 * (context size, batch sizes, threads, KV cache types) and creates the engine that runs it: the
 * CPU engine (cpu_engine/cpu_engine.h: KV cache, scratch, the thread pool) or the GPU engine
 * (cuda/cuda_engine.h: weights, KV cache and scratch in VRAM). hm_decode checks its arguments,
 * rewinds the cache when asked to, and hands the tokens to that engine, in ubatches on the CPU.
 * Which engine runs is decided here and nowhere else; the generation loop (runtime/generate.h)
 * sits on top. Decisions taken at init:
 *  - n_gpu_layers > 0: the whole model on the GPU when it fits (partial placement: a later
 *    tier); otherwise one warning line and the CPU, unless gpu_strict, which fails instead;
 *  - n_threads 0: the CPUs this process may use (hm_cpu_count_allowed); more than that: warned.
 *
 * Experts and routing: on the CPU the expert FFN goes through the engine's expert executor
 * (hm_context_exec: experts may be moved to other lanes, moe/moe_exec.h). Every layer's routing
 * result goes to the context's one observer (hm_context_set_observer, or the tracer through
 * hm_context_set_tracer): per call on the CPU; on the GPU the engine counts on the device and the
 * counts are read once a hm_decode call or a generation ends (never per token).
 */
#ifndef HM_RUNTIME_CONTEXT_H
#define HM_RUNTIME_CONTEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"
#include "moe/moe_exec.h"

typedef struct hm_context hm_context;

typedef struct {
    int n_ctx;        /* KV positions (-c); 0 = min(n_ctx_train, 4096) */
    int n_batch;      /* -b: largest n_tok one hm_decode call accepts (default 2048) */
    int n_ubatch;     /* -ub: tokens computed together (default 512) */
    int n_threads;    /* -t; 0 = the CPUs this process may use */
    uint32_t type_k;  /* KV cache types (-ctk/-ctv): HM_TYPE_F16 (default), HM_TYPE_F32,
                         HM_TYPE_BF16, HM_TYPE_Q8_0 on the CPU; f16 on the GPU */
    uint32_t type_v;
    bool check_ram;   /* refuse when weights + cache + scratch exceed physical RAM (default true) */
    int n_gpu_layers; /* -ngl: 0 = CPU (default); > 0 = the whole model on the GPU (partial
                         placement is not implemented: 0 < ngl < n_layer + 1 also places all of
                         it and says so in the log) */
    int main_gpu;     /* -mg: CUDA device index (default 0) */
    bool gpu_strict;  /* --gpu-strict: when the GPU cannot take the model, hm_context_init fails
                         with the reason (admission control) instead of running on the CPU */
} hm_context_params;

hm_context_params hm_context_default_params(void);

hm_status hm_context_init(const hm_model *m, const hm_context_params *params, hm_context **out,
                          hm_error *err);
void hm_context_free(hm_context *ctx);

/* Bytes hm_context_init would allocate on the CPU path (KV cache + scratch) for these params. */
uint64_t hm_context_bytes(const hm_model *m, const hm_context_params *params);

/* Runs tokens[0..n_tok) at positions pos..pos+n_tok-1 and appends them to the KV cache.
 * pos must be <= hm_context_n_past(ctx) (a smaller pos truncates first, as
 * hm_context_truncate); pos + n_tok must be <= n_ctx; n_tok <= n_batch. Token ids are checked
 * against n_vocab. */
hm_status hm_decode(hm_context *ctx, const int32_t *tokens, int n_tok, int pos, float *logits,
                    hm_logits_mode mode, hm_error *err);

int hm_context_n_past(const hm_context *ctx);
int hm_context_n_ctx(const hm_context *ctx);
int hm_context_n_batch(const hm_context *ctx);
/* Empties the KV cache. */
void hm_context_reset(hm_context *ctx);
/* Keeps positions [0, n_keep). Sliding-window layers keep a ring, so truncating further back
 * than n_ubatch positions before n_past is HM_ERR_STATE when the model has them. */
hm_status hm_context_truncate(hm_context *ctx, int n_keep, hm_error *err);

/* The routing observer (copied; NULL: none). On the GPU only its `counts` is fed: an observer
 * without one makes hm_decode fail with HM_ERR_UNSUPPORTED there. */
hm_status hm_context_set_observer(hm_context *ctx, const moe_observer *o, hm_error *err);
/* The expert usage tracer (moe/tracer.h) as the observer; NULL removes it. Not owned. */
struct moe_tracer;
hm_status hm_context_set_tracer(hm_context *ctx, struct moe_tracer *t, hm_error *err);
/* Reports the counts accumulated on the GPU to the observer now (one device read; nothing to do
 * on the CPU, where routing is reported as it happens). The generator calls it when a generation
 * ends. */
hm_status hm_context_flush_routes(hm_context *ctx, hm_error *err);

/* The expert executor of a CPU context (NULL on the GPU path). */
moe_exec *hm_context_exec(hm_context *ctx);

int hm_context_n_threads(const hm_context *ctx);
const hm_model *hm_context_model(const hm_context *ctx);

/* The GPU engine running this context (cuda/cuda_engine.h), or NULL on the CPU path. */
struct cuda_engine;
struct cuda_engine *hm_context_gpu(const hm_context *ctx);

#endif
