/* cpu_engine.h - the CPU forward pass of a model: KV cache, scratch, thread pool, decode.
 *
 * DESIGN: the runtime (runtime/context.h) creates one engine per context that runs on the CPU
 * and calls cpu_engine_decode once per ubatch; the engine knows nothing of GPUs, generation or
 * sampling. The expert FFN goes through an expert executor (moe/moe_exec.h) that the engine
 * creates on its own pool (cpu_engine_exec: the caller may move experts to other lanes), and
 * every layer's routing result goes to the observer when one is set. Every output element is
 * computed by the same per-row code whatever the ubatch size or thread count, so a batch and the
 * same tokens one at a time give bit-identical logits.
 *
 * Layer range: an engine may run only layers [layer_begin, layer_end) of the model (a context
 * whose first layers run on the CPU and the rest on a GPU: runtime/context.h). It then holds the
 * KV cache of those layers only. The range that starts at layer 0 embeds token ids; a later one
 * starts from given hidden rows. The range that ends at the last layer applies the output norm
 * and matrix; an earlier one hands back the hidden rows (the residual after its last layer).
 * Running [0, k) then [k, n_layer) on two engines gives the whole forward's bytes: every step is
 * the same per-row code, and the residual rows passed between them are the f32 state itself.
 */
#ifndef HM_CPU_ENGINE_CPU_ENGINE_H
#define HM_CPU_ENGINE_CPU_ENGINE_H

#include <stdint.h>

#include "base/status.h"
#include "model/model.h"
#include "moe/moe_exec.h"

typedef struct cpu_engine cpu_engine;

typedef struct {
    int n_ctx;       /* KV positions (> 0) */
    int n_ubatch;    /* most tokens of one cpu_engine_decode call (> 0) */
    int n_threads;   /* pool size (> 0) */
    uint32_t type_k; /* KV cache row types (cpu_kv_init) */
    uint32_t type_v;
    int layer_begin; /* first layer this engine runs (0: from the embedding) */
    int layer_end;   /* one past its last layer; 0 = n_layer (the output norm and matrix) */
    int n_seq;       /* sequences, each with its own KV cache of n_ctx positions (0: one) */
} cpu_engine_params;

/* Bytes cpu_engine_init allocates for these params (KV cache + scratch). */
uint64_t cpu_engine_bytes(const hm_model *m, const cpu_engine_params *p);

hm_status cpu_engine_init(const hm_model *m, const cpu_engine_params *p, cpu_engine **out,
                          hm_error *err);
void cpu_engine_free(cpu_engine *e);

/* One ubatch: tokens[0..n) (n <= n_ubatch, ids checked by the caller) at positions
 * pos..pos+n-1, appended to the KV cache; logits as hm_logits_mode says. The whole model
 * (an engine with a layer range: HM_ERR_STATE). */
hm_status cpu_engine_decode(cpu_engine *e, const int32_t *tokens, int n, int pos, float *logits,
                            hm_logits_mode mode, hm_error *err);

/* One ubatch through the engine's layer range: its input is tokens[0..n) (layer_begin 0) or
 * the hidden rows x_in [n][n_embd] f32 (layer_begin > 0; the other is ignored), at positions
 * pos..pos+n-1, appended to the range's KV cache. x_out [n][n_embd] (may be NULL when the range
 * ends at the last layer) receives the residual after the range's last layer; logits as mode
 * says when the range ends at the last layer (an earlier end takes HM_LOGITS_NONE only). For
 * the whole model, cpu_engine_forward(e, tokens, NULL, n, pos, NULL, logits, mode) is
 * cpu_engine_decode. HM_ERR_ARG for a missing input or output. */
hm_status cpu_engine_forward(cpu_engine *e, const int32_t *tokens, const float *x_in, int n,
                             int pos, float *x_out, float *logits, hm_logits_mode mode,
                             hm_error *err);

/* One ubatch of several sequences (continuous batching), the whole model: token t of
 * tokens[0..n) (n <= n_ubatch) belongs to sequence seq[t] (< n_seq) at position pos[t] and is
 * appended to that sequence's cache; a sequence's tokens in one call come in order at
 * consecutive positions (its next ones). Rows of logits [n_want][n_vocab] for the tokens with
 * want[t] != 0, in token order (want NULL: none). Every row is computed as a single-sequence
 * call computes it: a token's logits do not depend on the other sequences in the batch.
 * HM_ERR_ARG for a bad sequence or position order. */
hm_status cpu_engine_forward_seqs(cpu_engine *e, const int32_t *tokens, int n, const int32_t *seq,
                                  const int32_t *pos, const uint8_t *want, float *logits,
                                  hm_error *err);
/* Empties sequence seq's cache. */
void cpu_engine_seq_reset(cpu_engine *e, int seq);

/* The layer range [*begin, *end) the engine runs. */
void cpu_engine_layers(const cpu_engine *e, int *begin, int *end);

/* Empties the KV cache (every sequence's). */
void cpu_engine_reset(cpu_engine *e);
/* HM_OK when the cache, holding n_past positions, can be cut back to n_keep (a sliding-window
 * ring must still hold the window before n_keep), else HM_ERR_STATE naming the layer. */
hm_status cpu_engine_truncate_check(const cpu_engine *e, int n_keep, hm_error *err);
/* The same for sequence seq's caches. */
hm_status cpu_engine_seq_truncate_check(const cpu_engine *e, int seq, int n_keep, hm_error *err);
/* Hybrid architectures: sequence seq's recurrent state back to its checkpoint (the state after
 * the sequence's last call of several tokens, a prompt) when that holds at most n_keep tokens;
 * *at = its tokens, which the caller reads again from there. HM_ERR_STATE: no such checkpoint
 * (the state is left as it was). The KV caches are the caller's to cut (to *at). */
hm_status cpu_engine_seq_restore(cpu_engine *e, int seq, int n_keep, int *at, hm_error *err);

/* The engine's expert executor (owned by the engine). */
moe_exec *cpu_engine_exec(cpu_engine *e);
/* Every layer's routing result goes to o (copied; NULL: none). */
void cpu_engine_set_observer(cpu_engine *e, const moe_observer *o);
int cpu_engine_n_threads(const cpu_engine *e);

#endif
