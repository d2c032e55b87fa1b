/* context.h - a model running: the context that holds one sequence, on the CPU or a GPU.
 *
 * DESIGN: hm_context_init takes a model, a placement (-ngl, -mg, --gpu-strict) and options
 * (context size, batch sizes, threads, KV cache types) and creates the engine that runs it: the
 * CPU engine (cpu_engine/cpu_engine.h: KV cache, scratch, the thread pool) or the GPU engine
 * (cuda/cuda_engine.h: weights, KV cache and scratch in VRAM). hm_decode checks its arguments,
 * rewinds the cache when asked to, and hands the tokens to that engine, in ubatches on the CPU.
 * Which engine runs is decided here and nowhere else; the generation loop (runtime/generate.h)
 * sits on top. Decisions taken at init:
 *  - placement (any of n_gpu_layers > 0, cpu_moe, n_cpu_moe, override_tensor, vram_budget,
 *    gpu_strict): the placement planner (moe/placement.h) plans it with the device's free
 *    memory and the GPU engine's KV and scratch sizes, and its report goes to the log once
 *    (info level; hm_context_placement_report keeps it). Then the plan runs:
 *      no GPU (no device, or a build without CUDA): one warning line that the GPU placement
 *        is ignored and the CPU runs the model; gpu_strict refuses instead;
 *      nothing on the device: the CPU engine;
 *      everything on the device: the GPU engine (admission control against vram_budget too;
 *        when it cannot start, one warning line and the CPU, unless gpu_strict);
 *      every layer's attention on the device, some layers' routed experts in RAM (the tiered
 *        plan, also what a whole model that does not fit gets): the GPU engine with the plan's
 *        residency map, its host-only layers' experts computed by CPU threads (-t) through the
 *        hand-off (runtime/tiered.h); a failed step carries the CPU side's reason and the
 *        hand-off is reset for the next call;
 *      a split plan (a partial -ngl k <= n_layer, as llama.cpp counts it: layers [0, s) wholly
 *        on the host, layers [s, n_layer) and the output on the device, s = n_layer + 1 - k):
 *        the CPU engine runs layers [0, s) with their KV cache in RAM (the embedding too), the
 *        GPU engine layers [s, n_layer), the output norm and matrix with their KV cache in VRAM;
 *        each ubatch's hidden rows [n][n_embd] f32 go from one to the other. Routed experts of
 *        GPU layers may stay in RAM as in the tiered plan (--cpu-moe, --n-cpu-moe, -ot): host
 *        layers of the GPU engine with the tiered runtime's CPU side. Generation takes the
 *        per-token host path (runtime/generate.h), never the GPU's autonomous loop;
 *      any other plan with a layer's attention on the host beside a device part: HM_ERR_UNSUPPORTED
 *        naming what to use instead (-ngl N alone, -ngl 99 --cpu-moe, --n-cpu-moe N, -ngl 0);
 *    an explicit plan that does not fit the budget is HM_ERR_NOMEM, a bad -ot HM_ERR_ARG (the
 *    planner's message);
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
#include "moe/hot_admit.h"
#include "moe/hot_weight.h"
#include "moe/moe_exec.h"

typedef struct hm_context hm_context;

typedef enum { HM_LAYER_PERF_OFF = 0, HM_LAYER_PERF_UPDATE, HM_LAYER_PERF_FULL } hm_layer_perf;

typedef struct {
    int n_ctx;        /* KV positions (-c); 0 = min(n_ctx_train, 4096) */
    int n_batch;      /* -b: largest n_tok one hm_decode call accepts (default 2048) */
    int n_ubatch;     /* -ub: tokens computed together (default 512) */
    int n_threads;    /* -t; 0 = the CPUs this process may use */
    uint32_t type_k;  /* KV cache types (-ctk/-ctv): HM_TYPE_F16 (default), HM_TYPE_F32,
                         HM_TYPE_BF16, HM_TYPE_Q8_0 on the CPU; f16 on the GPU */
    uint32_t type_v;
    bool check_ram;   /* refuse when weights + cache + scratch exceed physical RAM (default true) */
    int n_gpu_layers; /* -ngl: 0 = CPU (default); as llama.cpp counts: the output layer, then
                         the last layers; > n_layer = the whole model (docs/PLACEMENT.md) */
    bool cpu_moe;     /* --cpu-moe: every layer's routed experts stay in RAM */
    int n_cpu_moe;    /* --n-cpu-moe N: the routed experts of layers [0, N) stay in RAM */
    const char *override_tensor; /* -ot "REGEX=DEVICE[,REGEX=DEVICE...]" (DEVICE: CPU or
                                    CUDA0; copied at init), NULL: none */
    uint64_t vram_budget; /* --vram-budget in bytes: the most hotmoe allocates on the GPU
                             (weights, KV, buffers; not the CUDA context); 0 = the free VRAM */
    int main_gpu;     /* -mg: CUDA device index (default 0) */
    bool gpu_strict;  /* --gpu-strict: the whole model on the GPU or hm_context_init fails with
                         the reason (admission control), never a tiered plan or the CPU */
    int64_t moe_offload_threshold; /* --moe-offload-threshold N: prompt ubatches of >= N tokens
                         run every used RAM expert on the GPU from a fetched copy, smaller ones
                         on the CPU; 0 = the calibrated cost model (docs/OFFLOAD.md). Decode
                         steps (<= 8 tokens) always stay on the CPU */
    const char *moe_hot_cache;     /* --moe-hot-cache FILE (learn or perf file; copied at init):
                                      a tiered plan keeps the best-scored experts of its RAM
                                      layers in VRAM (docs/HOT_CACHE.md); NULL: none */
    int64_t moe_hot_cache_max_mib; /* -1: what the placement leaves of the budget minus the
                                      reserve (default), else > 0 */
    int64_t moe_hot_cache_reserve_mib; /* default 1024 */
    hot_weight_cfg moe_hot_cache_weight; /* default flat, layer curve 0.5 */
    hot_policy moe_hot_cache_policy;     /* --moe-hot-cache-policy: static (default), lru, lfru */
    double moe_hot_cache_update_rate;    /* --moe-hot-cache-update-rate: share of hot slots an
                                            update may exchange, [0, 1] (0: none, default) */
    int64_t moe_hot_cache_update_interval; /* tokens between updates (default 256) */
    const char *routing_profile;  /* --moe-routing-profile FILE (benchmarks): the GPU engine's
                                     routing drawn from this routing profile (moe/route_synth.h)
                                     instead of the model's routers; NULL: the routers */
    uint64_t routing_seed;        /* its seed */
    hm_layer_perf moe_layer_perf; /* --moe-layer-perf: off (default), update (only what the
                                     updater needs), full (per-layer counters for
                                     hm_context_perf_write) */
    int n_seq;        /* sequences, each with its own cache of n_ctx positions (hm_decode_seqs;
                         the server's -np slots); 0 or 1: one. More than one on the CPU engine,
                         the GPU engine (full) and tiered placements, not a split one */
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

/* ---- several sequences (continuous batching: runtime/slots.h) ----
 * Sequence 0 is the one hm_decode, hm_context_n_past, _reset and _truncate work on. */
int hm_context_n_seq(const hm_context *ctx);
int hm_context_seq_n_past(const hm_context *ctx, int seq);
/* Empties sequence seq's cache. */
hm_status hm_context_seq_clear(hm_context *ctx, int seq, hm_error *err);
/* Keeps positions [0, n_keep) of sequence seq (as hm_context_truncate for sequence 0). */
hm_status hm_context_seq_truncate(hm_context *ctx, int seq, int n_keep, hm_error *err);
/* Goes back to at most n_keep positions of sequence seq: *kept = n_keep where the caches can
 * be cut there; with a recurrent state (hybrid architectures on the CPU engine) that cannot,
 * *kept = the position of the state's checkpoint (the end of the sequence's last prompt) when
 * that is <= n_keep. The caller reads its tokens again from *kept. HM_ERR_STATE when neither
 * holds (clear the sequence instead); HM_ERR_ARG for a bad seq or n_keep. */
hm_status hm_context_seq_rewind(hm_context *ctx, int seq, int n_keep, int *kept, hm_error *err);
/* One batch over several sequences: token i (tokens[0..n), n <= n_batch) is appended to sequence
 * seq[i] at its next position (a sequence's tokens in order). logits receives [n_want][n_vocab]:
 * the rows of the tokens with want[i] != 0, in order (want NULL: none). A token's logits are the
 * bytes a single-sequence hm_decode of its sequence gives (on the GPU: in steps of at most 8
 * tokens, the decode kernels' sizes). Errors: ids, sequences, a sequence that would outgrow
 * n_ctx (HM_ERR_RANGE, nothing run), HM_ERR_UNSUPPORTED on a split placement. */
hm_status hm_decode_seqs(hm_context *ctx, const int32_t *tokens, const int32_t *seq, int n,
                         const uint8_t *want, float *logits, hm_error *err);

int hm_context_n_past(const hm_context *ctx);
int hm_context_n_ctx(const hm_context *ctx);
int hm_context_n_batch(const hm_context *ctx);
/* Empties the KV cache (sequence 0's). */
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

/* The placement report made at init (moe_placement_report: bytes per tier, what lives where
 * and why), or NULL when no placement was asked for (plain -ngl 0). Owned by the context. */
const char *hm_context_placement_report(const hm_context *ctx);

/* The GPU engine running this context (cuda/cuda_engine.h), or NULL on the CPU path. A split
 * context has one too: it runs the layers from hm_context_split_layer on. */
struct cuda_engine;
struct cuda_engine *hm_context_gpu(const hm_context *ctx);

/* The CPU side of a tiered context's host layers (runtime/tiered.h: its counters, the test
 * hooks of its failure paths), or NULL. Owned by the context. */
struct hm_tiered;
struct hm_tiered *hm_context_tiered(const hm_context *ctx);

/* Writes the live layer perf counters (--moe-layer-perf full: the layers the CPU side of a
 * tiered context serves; runtime/tiered.h) to path in the learn schema. HM_ERR_STATE when the
 * context has no such layers or the counters are off. */
hm_status hm_context_perf_write(hm_context *ctx, const char *path, hm_error *err);

/* Memory the context holds: on the GPU (the placement plan's device total: weights, KV cache,
 * buffers, the hot cache) and host memory registered as pinned (the experts' mapping, for the
 * copies); both 0 on the CPU. */
void hm_context_memory(const hm_context *ctx, uint64_t *vram, uint64_t *pinned);

/* The hot cache of layer il (a tiered context on a GPU whose layer keeps some, not all, of its
 * experts in VRAM): hot[e] = 1 for the experts holding a slot now ([n_expert], caller's); their
 * number, 0 for a layer without a cache. Call it between steps (runtime/hot_setup.c). */
int hm_context_hot_layer(const hm_context *ctx, int il, uint8_t *hot);

/* A split context (a partial -ngl running): the first layer on the GPU (the CPU runs the ones
 * before it; n_layer: the GPU runs the output layer alone); 0 for any other context. */
int hm_context_split_layer(const hm_context *ctx);

#endif
