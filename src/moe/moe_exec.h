/* moe_exec.h - the expert executor: runs the slots of one layer's routing result, each expert on
 * its lane, and the routing observer that sees every routing result.
 *
 * DESIGN: a forward pass (the CPU engine, later the tiered one) hands the executor one job per
 * MoE layer: the FFN input rows, the selected expert ids and the place for the per-slot outputs
 * (moe_job). Each expert of each layer has a lane (moe_exec_set_lane): MOE_LANE_CPU is computed
 * here with the CPU kernels (cpu/matmul.h) on the executor's own scratch; another lane is a
 * function installed by whoever provides it (moe_exec_set_lane_fn: a GPU engine, a test). A
 * slot's output does not depend on which lane ran it or on which other slots ran (the lanes give
 * the same bytes for an expert: docs/ARITHMETIC.md), and the caller sums the slots in slot order,
 * so placement never changes a bit of the result (ARCHITECTURE.md section 3).
 *
 * When every expert is on the CPU lane the forward pass may take the executor's CPU products
 * itself (moe_exec_cpu_args: the one-token job plans them as a stage of its own) instead of
 * calling moe_exec_run; both give the same bytes.
 *
 * The observer (moe_observer) is fed each layer's routing result: per call with the ids when the
 * engine has them on the host (the CPU path), or as counts accumulated on a device and read
 * every so often (the GPU path), so the autonomous decode needs no host synchronisation per
 * token. The tracer (moe/tracer.h) provides both.
 */
#ifndef HM_MOE_MOE_EXEC_H
#define HM_MOE_MOE_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "base/threadpool.h"
#include "cpu/matmul.h"
#include "model/model.h"

/* One layer's routing result and the place for the per-slot outputs. */
typedef struct {
    int layer;
    int64_t n_tok;
    int n_used;
    const float *x;        /* [n_tok][n_embd] ffn-normed input */
    const int32_t *ids;    /* [n_tok][n_used] selected experts, slot order; < 0: skipped */
    const float *weights;  /* [n_tok][n_used] gating weights (informative; y is unweighted) */
    float *y;              /* [n_tok][n_used][n_embd] out: expert(ids[t][s])(x[t]), unweighted,
                              expert biases included; rows of skipped slots are left alone */
} moe_job;

/* A lane other than the CPU's: computes the slots of job whose id >= 0 (the executor passes a
 * job whose other slots are skipped). */
typedef hm_status (*moe_lane_fn)(void *impl, const hm_model *m, const moe_job *job,
                                 hm_error *err);

enum { MOE_LANE_CPU = 0, MOE_LANE_MAX = 4 }; /* lanes 1..MOE_LANE_MAX-1: moe_exec_set_lane_fn */

typedef struct moe_exec moe_exec;

/* An executor for m's jobs of up to n_tok_max tokens on pool (borrowed; NULL: the calling
 * thread). Every expert starts on MOE_LANE_CPU. */
hm_status moe_exec_init(const hm_model *m, tp_pool *pool, int64_t n_tok_max, moe_exec **out,
                        hm_error *err);
void moe_exec_free(moe_exec *x);

/* Installs lane (1..MOE_LANE_MAX-1); fn NULL removes it (its experts go back to the CPU). */
hm_status moe_exec_set_lane_fn(moe_exec *x, int lane, moe_lane_fn fn, void *impl, hm_error *err);
/* Puts expert e of layer il on lane (which must be MOE_LANE_CPU or installed). */
hm_status moe_exec_set_lane(moe_exec *x, int il, int e, int lane, hm_error *err);
int moe_exec_lane(const moe_exec *x, int il, int e);
/* true when every expert is on the CPU lane. */
bool moe_exec_all_cpu(const moe_exec *x);

/* Computes every slot of job, each on its expert's lane. With sum (and every slot of the job on
 * the CPU lane, n_tok <= MOE_FEW_TOK) the weighted sum of the slots goes into sum->out (plus
 * sum->residual) inside the same pool job and *summed is true; otherwise *summed is false and
 * the caller sums job->y. */
enum { MOE_FEW_TOK = 4 };
hm_status moe_exec_run(moe_exec *x, const moe_job *job, const cpu_moe_sum *sum, bool *summed,
                       hm_error *err);

/* The CPU lane's gate and up products, biases and activation for the slots of job with id >= 0
 * (every expert computed here, whatever its lane), into h [n_tok][n_used][n_ff_exp] (other
 * rows left alone): the input of the down product, the same bytes as moe_exec_run computes on
 * the way (post-fetch: the GPU then runs the down product, runtime/tiered_postfetch.c). */
hm_status moe_exec_gate_up(moe_exec *x, const moe_job *job, float *h, hm_error *err);

/* The CPU lane's three products for layer il (ids [n][K], input xin [n][n_embd], per-slot outputs
 * y [n][K][n_embd]; the executor's scratch holds the activations) and the gate/up post step's
 * context; true when gate and up can be one paired product (cpu_moe_matmul_pair, cpu_moe_ffn). */
typedef struct {
    const hm_layer *L;
    const int32_t *ids;
    float *eg, *eu;
    int64_t F;
    int act;  /* CPU_GLU_SILU, CPU_GLU_OAI (gpt-oss) or CPU_GLU_GELU (gemma4): cpu/ops.h */
    int simd; /* cpu_act_simd(), read once per layer */
} moe_post_ctx;
bool moe_exec_cpu_args(moe_exec *x, int il, const int32_t *ids, int64_t n, int K,
                       const float *xin, float *y, cpu_moe_args *gate, cpu_moe_args *up,
                       cpu_moe_args *down, moe_post_ctx *pc);
/* cpu_moe_post_fn: rows [r0, r1) of slot p: expert biases, then the activation into eg. */
void moe_exec_post(void *ctx, int64_t p, int64_t r0, int64_t r1);
/* Scratch bytes the CPU lane's one-job FFN of up to MOE_FEW_TOK tokens needs (for a caller that
 * runs it as a stage of its own job). */
size_t moe_exec_ffn_scratch_size(const moe_exec *x);

/* ---- the routing observer ---- */

typedef struct {
    /* one layer call's routing result, on the host (CPU path): ids/weights [n_tok][n_used] */
    void (*route)(void *user, int layer, int64_t n_tok, int n_used, const int32_t *ids,
                  const float *weights);
    /* counts accumulated since the last report (GPU path): layer calls, tokens, and the hits of
     * each expert, hits [n_expert] */
    void (*counts)(void *user, int layer, uint64_t calls, uint64_t tokens, const uint64_t *hits);
    void *user;
} moe_observer;

#endif
