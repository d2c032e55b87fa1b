/* cuda_engine.h - the whole model on one GPU: device weights, device f16 KV cache, the forward
 * pass as a sequence of enqueued kernels. Plain C; implemented in cuda_engine*.cu, stubbed in
 * cuda_none.c (HM_ERR_UNSUPPORTED "built without CUDA").
 *
 * DESIGN: cuda_engine_init uploads every tensor the forward pass reads into one device arena
 * (through a pinned staging buffer, in chunks), allocates the KV cache (f16, n_ctx positions for
 * every layer: sliding-window layers mask, they keep no ring) and the scratch for n_ubatch
 * tokens, after checking that the device has the memory (admission control: the error says
 * what is needed and what is free, in MiB). The forward pass mirrors cpu_engine_forward.c step by
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
 *
 * Expert residency: the experts' weights (gate, up, down and their biases) follow the residency
 * map (model/residency.h, cuda_engine_params.res). Each MoE layer's expert tensors are one arena
 * of n_slots experts, laid out as the file's tensors with expert e's bytes in slot
 * slot[layer][e]; the map's slot array is kept in device memory (the expert->slot table,
 * [n_layer][n_expert] int32). The router's top-k kernel writes, next to each selected expert id,
 * its slot (one load from the table per selected expert), and every expert kernel — the decode
 * matvecs, the prompt grouped GEMM, the bias adds — addresses an expert's weights as
 * base + slot * expert_stride. So moving an expert changes the table and a slot's bytes, never a
 * kernel or a graph. Without a map (res NULL) slot = expert id: the bytes uploaded and every
 * result are the same as with any permutation of the slots. An expert without a slot is never
 * read on the device. A MoE layer none of whose experts has a slot is a host layer: its expert
 * bytes stay in host memory and the CPU computes them through the hand-off of the tiered step
 * (cuda_handoff.h, runtime/tiered.h); a layer with some experts on the device and some not is
 * refused for now.
 *
 * Layer range (a partial -ngl, runtime/context.h): with layer_begin k > 0 the engine holds and
 * runs layers [k, n_layer), the output norm and the output matrix only: no token embeddings,
 * no weights and no KV cache for layers below k. Its input is hidden rows from the host
 * (cuda_engine_decode_rows: the residual after layer k - 1, computed by the CPU engine); token
 * ids are refused (cuda_engine_decode, the autonomous loop). Host layers (the tiered step) may
 * be among its layers as usual. With k = n_layer it runs the output layer alone.
 *
 * Routing counts: cuda_engine_route_counts_enable turns on per-layer counters in device memory
 * (hits [n_layer][n_expert] uint32, calls and tokens [n_layer] uint64) that the router's top-k
 * kernel increments (atomics, in the kernel that selects: no extra launch or graph node, and
 * nothing at all when off). cuda_engine_route_counts_read adds them to host arrays and zeroes
 * them: one stream synchronisation, so the autonomous decode reads them every so often (end of a
 * generation, or every N >= 64 steps), never per token. A decode graph follows the state it was
 * captured with; cuda_decode recaptures its graph when counting was switched since.
 */
#ifndef HM_CUDA_CUDA_ENGINE_H
#define HM_CUDA_CUDA_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"
#include "model/residency.h"

typedef struct cuda_engine cuda_engine;

typedef struct {
    int device;      /* CUDA device index (-mg/--main-gpu) */
    int n_ctx;       /* KV positions (resolved: > 0) */
    int n_ubatch;    /* largest n_tok of one forward step (resolved: > 0) */
    uint32_t type_k; /* KV cache types: only HM_TYPE_F16 on the GPU (else HM_ERR_UNSUPPORTED) */
    uint32_t type_v;
    const hm_residency *res; /* where each expert's weights live (read during init and plan
                              * only); NULL: every expert on the device, slot = expert id */
    uint64_t vram_budget;    /* --vram-budget: the most bytes init may allocate (weights + KV +
                              * buffers, not the CUDA context); 0 = no cap but the free memory */
    int layer_begin;         /* the first layer the engine runs, 0..n_layer (see DESIGN); 0: the
                              * whole model from token ids */
    int n_seq;               /* sequences, each a KV cache of n_ctx positions (0: one); only
                              * cuda_engine_decode_seqs reaches those after the first */
} cuda_engine_params;

/* Device bytes the engine would allocate: weights, KV cache, scratch (all three out, any may be
 * NULL). Returns HM_ERR_UNSUPPORTED naming the tensor and type when a weight type or the KV
 * type has no GPU kernel. A residency map (p->res) sizes each layer's expert arena by its
 * n_slots (a host layer's: none; a mixed layer's, some experts slotless: its hot slots, the
 * CPU side computing the others); a map that does not match the model or fails
 * hm_residency_check is HM_ERR_ARG. Host-only computation (the stub of
 * a build without CUDA returns HM_ERR_UNSUPPORTED). With layer_begin > 0 the token embeddings
 * and the layers below it count nothing (their entries of the map are not read); a layer_begin
 * outside 0..n_layer is HM_ERR_ARG. */
hm_status cuda_engine_plan(const hm_model *m, const cuda_engine_params *p, uint64_t *weights,
                           uint64_t *kv, uint64_t *scratch, hm_error *err);

/* Uploads the model and allocates everything. Errors: no device / built without CUDA
 * (HM_ERR_UNSUPPORTED), unsupported weight or KV type (HM_ERR_UNSUPPORTED, named), not enough
 * free device memory (HM_ERR_NOMEM: "need N MiB (weights A + KV B + buffers C), device D has
 * F MiB free"), more than p->vram_budget (HM_ERR_NOMEM naming both), CUDA errors
 * (HM_ERR_CUDA). */
hm_status cuda_engine_init(const hm_model *m, const cuda_engine_params *p, cuda_engine **out,
                           hm_error *err);
void cuda_engine_free(cuda_engine *e);

/* Runs tokens[0..n_tok) (host memory) at positions pos..pos+n_tok-1 in ubatches of at most
 * n_ubatch, storing K/V in the device cache; logits as hm_decode (LAST: [n_vocab] of the last
 * token, ALL: [n_tok][n_vocab]) copied to the host. The caller (hm_decode) has checked the
 * arguments (token ids in range, pos + n_tok <= n_ctx). Positions >= pos are overwritten, so
 * rewinding the cache is only a smaller pos. Synchronises the engine's stream before it
 * returns. HM_ERR_STATE for an engine with layer_begin > 0. With host layers: HM_ERR_STATE without a CPU side attached, while the hand-off is
 * aborted, or when a step's hand-off failed (cuda_handoff.h). */
hm_status cuda_engine_decode(cuda_engine *e, const int32_t *tokens, int n_tok, int pos,
                             float *logits, hm_logits_mode mode, hm_error *err);

/* As cuda_engine_decode, from hidden rows instead of token ids: x [n_tok][n_embd] f32 (host
 * memory) is the input of layer layer_begin at positions pos..pos+n_tok-1 (the embedding rows
 * when layer_begin is 0). The way into an engine with layer_begin > 0. */
/* One ubatch of several sequences (continuous batching), the whole model: token t (n <=
 * n_ubatch) belongs to sequence seq[t] (< n_seq) at position pos[t] (a sequence's tokens in
 * order at consecutive positions) and is stored in that sequence's cache; every layer's
 * attention runs once per run of consecutive tokens of one sequence. Logits
 * [n_want][n_vocab] of the tokens with want[t] != 0, in order (want NULL: none); synchronises.
 * The single-sequence calls and the decode loop use sequence 0. HM_ERR_ARG: bad sequences or
 * positions; HM_ERR_STATE: a layer range. */
/* Zeroes sequence seq's recurrent states (hybrid architectures' delta-net layers; nothing for
 * the others): a cleared sequence starts from an empty state, as its KV cache from position 0.
 * Enqueued on the engine's stream. HM_ERR_ARG: seq out of range. */
hm_status cuda_engine_seq_reset(cuda_engine *e, int seq, hm_error *err);
hm_status cuda_engine_decode_seqs(cuda_engine *e, const int32_t *tokens, int n, const int32_t *seq,
                                  const int32_t *pos, const uint8_t *want, float *logits,
                                  hm_error *err);

hm_status cuda_engine_decode_rows(cuda_engine *e, const float *x, int n_tok, int pos,
                                  float *logits, hm_logits_mode mode, hm_error *err);

/* "NVIDIA H100 80GB HBM3 (device 0), 123 MiB weights + 45 MiB KV + 6 MiB buffers" */
const char *cuda_engine_describe(const cuda_engine *e);

/* One lane of the expert executor (moe/moe_exec.h) on this engine's weights: for layer il,
 * y[t][s] = expert ids[t][s] of x[t] for every slot with ids >= 0 (host arrays: x [n_tok][n_embd],
 * ids [n_tok][n_used], y [n_tok][n_used][n_embd]; rows of other slots are left alone), with the
 * matvec kernels: the CPU's bytes. Synchronous. HM_ERR_STATE when an expert has no device slot. */
hm_status cuda_engine_experts(cuda_engine *e, int il, int n_tok, const float *x,
                              const int32_t *ids, float *y, hm_error *err);

/* Host synchronisations of the engine's stream so far (every wait of the host API, of
 * cuda_decode_finish and of cuda_engine_route_counts_read): the audit's host_syncs. */
uint64_t cuda_engine_host_syncs(const cuda_engine *e);

/* Routing counts (see DESIGN). on: allocates the device counters on first use and zeroes them
 * (enqueued); switching on while on, or off while off, changes nothing. Off keeps the counters
 * and what they hold until the next read. Steps enqueued while on count, steps enqueued while
 * off do not. HM_ERR_CUDA when the allocation fails. */
hm_status cuda_engine_route_counts_enable(cuda_engine *e, bool on, hm_error *err);
/* Adds the counts accumulated on the device since the last read (or enable) into
 * hits [n_layer][n_expert], calls [n_layer] and tokens [n_layer] (host arrays; calls and tokens
 * may be NULL), then zeroes the device counters: one stream synchronisation, counted in
 * cuda_engine_host_syncs, after every step enqueued so far. A layer's calls count router
 * launches (one per ubatch of a cuda_engine_decode call, one per decode step), tokens their
 * tokens, hits the (token, expert) selections. HM_ERR_STATE when counting was never enabled.
 * The device keeps hits in 32 bits: read at least every 2^32 routed tokens. */
hm_status cuda_engine_route_counts_read(cuda_engine *e, uint64_t *hits, uint64_t *calls,
                                        uint64_t *tokens, hm_error *err);

/* The hot cache's exchanges (cuda_hot.cu): in a mixed layer il, hot expert `out` gives its
 * device slot to cold expert `in`, without a reallocation or a host wait. Enqueued on the
 * engine's stream: out's table entry becomes -1 (from the next step on the CPU side computes
 * it); a side stream then copies in's bytes (gate, up, down, biases) from host memory into the
 * slot once every step enqueued before has finished; cuda_engine_hot_poll sets in's entry once
 * that copy has completed, between steps, so the table changes only between steps and no step
 * reads a half-copied slot. Where an expert runs changes no bit of a decode step, so the
 * results stay the same bytes throughout. At most CUDA_HOT_PENDING exchanges in flight
 * (HM_ERR_STATE beyond); HM_ERR_ARG for a layer that is not mixed, an out without a slot or an
 * in with one (a pending in counts as having one). */
enum { CUDA_HOT_PENDING = 64 };
hm_status cuda_engine_hot_exchange(cuda_engine *e, int il, int out, int in, hm_error *err);
/* Publishes the exchanges whose copies have completed (cudaEventQuery: no wait); returns the
 * number still in flight, or -1 with err set on a CUDA error. */
int cuda_engine_hot_poll(cuda_engine *e, hm_error *err);
/* Expert x's device slot in layer il as the host table has it (-1: none). */
int cuda_engine_slot(const cuda_engine *e, int il, int x);
/* From another thread (one producer: the CPU side's worker): asks for an exchange, which the
 * engine's own thread applies before its next step (cuda_engine_decode, cuda_decode_launch:
 * every CUDA call on the engine's stream stays on that thread, none while a graph is being
 * captured). HM_ERR_STATE when CUDA_HOT_PENDING requests wait already; HM_ERR_UNSUPPORTED for
 * an engine without mixed layers. Refusals at application are counted (applied, refused). */
hm_status cuda_engine_hot_request(cuda_engine *e, int il, int out, int in, hm_error *err);
void cuda_engine_hot_counts(const cuda_engine *e, uint64_t *applied, uint64_t *refused);

/* Routing taken from a table instead of the routers (--moe-routing-profile: benchmarks of forged
 * models, whose routers route almost uniformly; moe/route_synth.h draws the table): table
 * [n_pos][n_layer][n_used] expert ids for positions 0 .. n_pos - 1, uploaded (NULL: the routers
 * decide again). Each MoE layer's router still runs; a kernel then replaces its choice with the
 * table's row at every token's position (positions >= n_pos keep the router's), the weights with
 * 1 / n_used, the device slots accordingly, and the routing counts count the table's ids. Ids
 * outside [0, n_expert) are refused at upload (HM_ERR_ARG). Enqueued; the next steps see it. */
hm_status cuda_engine_route_table(cuda_engine *e, const int32_t *table, int n_pos, hm_error *err);

#endif
