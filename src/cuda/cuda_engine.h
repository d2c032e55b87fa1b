/* cuda_engine.h - the whole model on one GPU: device weights, device f16 KV cache, the forward
 * pass as a sequence of enqueued kernels. Plain C; implemented in cuda_engine*.cu, stubbed in
 * cuda_none.c (HM_ERR_UNSUPPORTED "built without CUDA").
 *
 * DESIGN: cuda_engine_init uploads every tensor the forward pass reads into one device arena
 * (through a pinned staging buffer, in chunks), allocates the KV cache (f16, n_ctx positions for
 * every layer: sliding-window layers mask, they keep no ring) and the scratch for n_ubatch
 * tokens, after checking that the device has the memory (admission control: the error says
 * what is needed and what is free, in MiB). The forward pass mirrors model_forward.c step by
 * step with the kernels of cuda_quant.h / cuda_ops.h / cuda_attn.h (/ cuda_gemm.h for prompt
 * ubatches). Decode-sized products (n_tok <= 8) use the matvec kernels, whose results are the
 * CPU's bytes.
 *
 * Two ways in:
 *  - cuda_engine_decode: the host API behind hm_decode (token ids and logits in host memory;
 *    synchronises at the end of the call).
 *  - cuda_engine_enqueue_step (cuda_engine_internal.h): enqueues one step for token ids already
 *    in device memory at the device position scalar, without any host synchronisation, so the
 *    autonomous decode loop can capture it into a CUDA graph.
 */
#ifndef HM_CUDA_CUDA_ENGINE_H
#define HM_CUDA_CUDA_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"

typedef struct cuda_engine cuda_engine;

typedef struct {
    int device;      /* CUDA device index (-mg/--main-gpu) */
    int n_ctx;       /* KV positions (resolved: > 0) */
    int n_ubatch;    /* largest n_tok of one forward step (resolved: > 0) */
    uint32_t type_k; /* KV cache types: only HM_TYPE_F16 on the GPU (else HM_ERR_UNSUPPORTED) */
    uint32_t type_v;
} cuda_engine_params;

/* Device bytes the engine would allocate: weights, KV cache, scratch (all three out, any may be
 * NULL). Returns HM_ERR_UNSUPPORTED naming the tensor and type when a weight type or the KV
 * type has no GPU kernel. Host-only computation (the stub of a build without CUDA returns
 * HM_ERR_UNSUPPORTED). */
hm_status cuda_engine_plan(const hm_model *m, const cuda_engine_params *p, uint64_t *weights,
                           uint64_t *kv, uint64_t *scratch, hm_error *err);

/* Uploads the model and allocates everything. Errors: no device / built without CUDA
 * (HM_ERR_UNSUPPORTED), unsupported weight or KV type (HM_ERR_UNSUPPORTED, named), not enough
 * free device memory (HM_ERR_NOMEM: "need N MiB (weights A + KV B + buffers C), device D has
 * F MiB free"), CUDA errors (HM_ERR_CUDA). */
hm_status cuda_engine_init(const hm_model *m, const cuda_engine_params *p, cuda_engine **out,
                           hm_error *err);
void cuda_engine_free(cuda_engine *e);

/* Runs tokens[0..n_tok) (host memory) at positions pos..pos+n_tok-1 in ubatches of at most
 * n_ubatch, storing K/V in the device cache; logits as hm_decode (LAST: [n_vocab] of the last
 * token, ALL: [n_tok][n_vocab]) copied to the host. The caller (hm_decode) has checked the
 * arguments (token ids in range, pos + n_tok <= n_ctx). Positions >= pos are overwritten, so
 * rewinding the cache is only a smaller pos. Synchronises the engine's stream before it
 * returns. */
hm_status cuda_engine_decode(cuda_engine *e, const int32_t *tokens, int n_tok, int pos,
                             float *logits, hm_logits_mode mode, hm_error *err);

/* "NVIDIA H100 80GB HBM3 (device 0), 123 MiB weights + 45 MiB KV + 6 MiB buffers" */
const char *cuda_engine_describe(const cuda_engine *e);

/* Host synchronisations (stream syncs, device->host copies) the engine made so far (the audit). */
uint64_t cuda_engine_host_syncs(const cuda_engine *e);

/* Routing counts on the device: with on, the router step of every forward pass (host API and the
 * captured decode step) adds each layer's calls, tokens and expert hits to device counters
 * (allocated and zeroed here); off removes that work. */
hm_status cuda_engine_route_counts_enable(cuda_engine *e, bool on, hm_error *err);
/* Adds the counts accumulated since the last read into hits [n_layer][n_expert], calls [n_layer]
 * and tokens [n_layer] (host arrays) and zeroes the device counters: one stream synchronisation,
 * counted in cuda_engine_host_syncs. */
hm_status cuda_engine_route_counts_read(cuda_engine *e, uint64_t *hits, uint64_t *calls,
                                        uint64_t *tokens, hm_error *err);

#endif
