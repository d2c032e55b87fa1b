/* cuda_fetch.h - prompt ubatches of a tiered engine run the RAM experts they use on the GPU:
 * the GPU side of the fetched-expert path (seed 003). Plain C; implemented in cuda_fetch.cu,
 * stubbed in cuda_none.c.
 *
 * DESIGN: at a host layer (every expert in host RAM, cuda_handoff.h) a prompt ubatch
 * (n_tok > CUDA_ENGINE_MATVEC_MAX_TOK) posts its request with msg.fetch = 1 when the layer is
 * eligible (its three expert matrices have tensor-core GEMM kernels) and the engine was given
 * staging buffers (cuda_engine_fetch_set: the copy lane's two device buffers, cuda_host.h). The
 * GPU stream then waits in the hand-off's wait kernel while the CPU side (runtime/tiered.c):
 *   1. counts the tokens per expert from the posted ids and decides which used experts the GPU
 *      runs (moe/offload.h: the cost model or --moe-offload-threshold);
 *   2. copies those experts' bytes through the copy lane into buffer il & 1, expert j of the
 *      GPU's list at j * slot_bytes, its parts (gate, up, down rows, then the biases present:
 *      offload_expert_ranges' order) at part_off[] inside the slot, each 256-byte aligned — the
 *      layout cuda_engine_fetch_layout gives both sides;
 *   3. computes the other experts' slots with its CPU lane (ids of fetched slots masked to -1);
 *   4. waits for the copies (host-side event sync of the lane: prompt batches only);
 *   5. writes fslot [n_tok][n_used] (the fetched slot index, or -1: the CPU's y) and answers.
 * After the wait the GPU (cuda_fetch_enqueue_experts) copies fslot into e->dslot (cache-volatile
 * loads), runs the grouped GEMMs of the all-GPU prompt path on the staging buffer (expert stride
 * slot_bytes; slots < 0 skipped), the biases and the activation, and fills the CPU's slots of
 * e->ey from the hand-off's y; the forward's combine then sums every token's slots in slot
 * order, whoever computed them. Decode-sized steps never take this path (byte-identical to the
 * all-GPU engine, graph-captured, no host synchronisation).
 *
 * Ordering needs no device events: the CPU side copies into a buffer only after it saw the
 * request of the layer, which the GPU posts after every kernel of the previous layers (that read
 * the buffers) has finished; the GPU reads the buffer only after the answer, which comes after
 * the copies completed.
 */
#ifndef HM_CUDA_CUDA_FETCH_H
#define HM_CUDA_CUDA_FETCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CUDA_FETCH_MAX_PARTS = 6, CUDA_FETCH_ALIGN = 256 };

/* Where layer il's fetched experts go in a staging buffer. */
typedef struct {
    int eligible;       /* the GPU runs this layer's fetched experts for prompt ubatches */
    int n_parts;        /* ranges per expert: gate, up, down, then the biases present */
    size_t part_bytes[CUDA_FETCH_MAX_PARTS]; /* exact bytes of each part */
    size_t part_off[CUDA_FETCH_MAX_PARTS];   /* offset of each part inside a slot */
    size_t slot_bytes;  /* one expert in the buffer (each part rounded up to CUDA_FETCH_ALIGN) */
    int n_slots;        /* experts one buffer holds: min(n_expert, cap / slot_bytes) */
} cuda_fetch_layout;

struct cuda_engine;

/* The staging buffer a layer's experts are copied into. */
static inline int cuda_fetch_buffer(int il) { return il & 1; }

/* Gives the engine two device staging buffers of cap bytes each (not owned; the copy lane's
 * cuda_copy_lane_buf(lane, 0/1)) and enables the fetched path for the host layers whose expert
 * types the GEMM handles and whose one expert fits cap. buf NULL or cap 0 disables it. The
 * engine's stream must be idle. HM_ERR_STATE for an engine without host layers. Returns the
 * number of eligible layers in *n_eligible (may be NULL). */
hm_status cuda_engine_fetch_set(struct cuda_engine *e, void *buf0, void *buf1, size_t cap,
                                int *n_eligible, hm_error *err);
/* Layer il's layout; eligible 0 for a layer that is not a host layer or while the path is off.
 * Bytes are computed from the model's tensors whether or not the path is on (n_slots then 0). */
void cuda_engine_fetch_layout(const struct cuda_engine *e, int il, cuda_fetch_layout *out);

/* Post-fetch at decode steps (seed 000; the CPU side: runtime/tiered_postfetch.c): with on, a
 * decode request (n_tok <= CUDA_HANDOFF_PF_TOK) at an eligible layer may come back with fslot
 * [n_tok][n_used] naming, for some cold slots, a scratch slot k of staging buffer il & 1 that
 * holds the slot's expert's down rows at k * (its down bytes), and h (cuda_handoff.h) holding
 * the slot's activation; the GPU then runs those down products itself (cuda_postfetch.cu). The
 * CPU side must write every slot's fslot (-1: y holds its output) of such requests. Needs the
 * staging buffers (cuda_engine_fetch_set first); the engine's stream idle; a decode step
 * captured before is captured again. HM_ERR_STATE without host layers or buffers. */
hm_status cuda_engine_postfetch_set(struct cuda_engine *e, bool on, hm_error *err);
/* Whether layer il takes post-fetched down products (post-fetch on, a host or mixed layer
 * without down biases, the scratch for CUDA_HANDOFF_PF_TOK * n_used experts fits a buffer);
 * *bytes (may be NULL) gets one expert's down bytes (0 when not). */
bool cuda_engine_postfetch_layer(const struct cuda_engine *e, int il, size_t *bytes);

#ifdef __cplusplus
}
#endif

#endif
