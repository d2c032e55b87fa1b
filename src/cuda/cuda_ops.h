/* cuda_ops.h - device versions of the forward pass's non-matmul operators (cpu/ops.h): RMS norm,
 * add/scale/bias, the MoE per-expert bias and slot combine, the shared-expert combine,
 * activations (SiLU, sigmoid, SwiGLU, gpt-oss's clamped SwiGLU), the routers and RoPE.
 *
 * DESIGN: plain C launchers over device f32 buffers (shapes as in cpu/ops.h). Every launcher
 * only enqueues on `stream` (a cudaStream_t; NULL = the legacy default stream): no allocation,
 * no synchronisation, no device->host copy, so everything here can be captured into a CUDA
 * graph. Values that change per decode step (positions, expert ids) are read from device
 * memory. A launcher returns HM_ERR_ARG for bad host-side shapes and HM_ERR_CUDA (naming the
 * kernel) when the launch fails; device-side problems have no error path and are documented
 * per function (what happens with an out-of-range id or position).
 * Numerics: each op does the same IEEE single operations in the same order as the CPU
 * function named beside it (docs/OPS.md; __fadd_rn/__fmul_rn/__fdiv_rn, exp = hm_expf's
 * recipe), so outputs are bit-identical to the CPU's — checked byte for byte by
 * tests/cuda/test_cuda_ops.c. Every op allows in-place use (y == x) like the CPU ones, except
 * cuda_moe_combine (out must not alias y).
 */
#ifndef HM_CUDA_CUDA_OPS_H
#define HM_CUDA_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>


#ifdef __cplusplus
extern "C" {
#endif

#include "base/status.h"
#include "cpu/ops.h"

/* ------------------------------------------------------------------ norms and elementwise */

/* = cpu_rmsnorm: y[r][i] = (x[r][i] * s_r) * w[i] (w NULL: x * s_r), s_r from the double
 * sum of squares in 32 chains (docs/OPS.md). x, y: [n_rows][n]; w: [n]. One block per row;
 * the chains are the lanes of one warp (n/32 dependent adds each). */
hm_status cuda_rmsnorm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n,
                       float eps, void *stream, hm_error *err);

/* = cpu_add: y = a + b; [n]. */
hm_status cuda_add(const float *a, const float *b, float *y, int64_t n, void *stream,
                   hm_error *err);
/* = cpu_scale: y = a * s; [n]. */
hm_status cuda_scale(const float *a, float s, float *y, int64_t n, void *stream, hm_error *err);
/* = cpu_add_bias: x[r][i] += b[i]; x: [n_rows][n], b: [n]. */
hm_status cuda_add_bias(float *x, const float *b, int64_t n_rows, int64_t n, void *stream,
                        hm_error *err);
/* = cpu_moe_add_bias with device ids: y[t][s][i] += bias[ids[t][s]][i]; slots with id < 0 or
 * id >= n_expert are left untouched. y: [n_tok][n_used][n]; bias: [n_expert][n];
 * d_ids: [n_tok][n_used] device int32 (the engine passes the device slots: the biases are
 * stored by slot, n_expert = the layer's slots). */
hm_status cuda_moe_add_bias(float *y, const float *bias, const int32_t *d_ids, int64_t n_tok,
                            int n_used, int64_t n, int n_expert, void *stream, hm_error *err);
/* = cpu_moe_combine with device ids: out[t][i] = ((0 + w[t][0]*y[t][0][i]) + w[t][1]*y[t][1][i])
 * + ..., slots with id < 0 skipped (d_ids NULL = none skipped). y: [n_tok][n_used][n];
 * w: [n_tok][n_used]; out: [n_tok][n], must not alias y. */
hm_status cuda_moe_combine(const float *y, const float *w, const int32_t *d_ids, int64_t n_tok,
                           int n_used, int64_t n, float *out, void *stream, hm_error *err);
/* The shared expert's gated add (cpu_engine_forward.c, qwen2moe): out[t][i] = out[t][i] +
 * sh[t][i] * sigmoid(gate[t]) — the CPU's cpu_sigmoid, cpu_scale, cpu_add sequence, same
 * bits. out, sh: [n_tok][n]; gate: [n_tok] (the logit, before the sigmoid). */
hm_status cuda_shexp_combine(float *out, const float *sh, const float *gate, int64_t n_tok,
                             int64_t n, void *stream, hm_error *err);

/* ------------------------------------------------------------------ activations */

/* = cpu_silu / cpu_sigmoid: [n]. */
hm_status cuda_silu(const float *x, float *y, int64_t n, void *stream, hm_error *err);
hm_status cuda_sigmoid(const float *x, float *y, int64_t n, void *stream, hm_error *err);
/* = cpu_swiglu: out = silu(gate) * up; [n]; out may alias gate or up. */
hm_status cuda_swiglu(const float *gate, const float *up, float *out, int64_t n, void *stream,
                      hm_error *err);
/* = cpu_swiglu_oai: g = min(gate, limit), u = clamp(up, -limit, limit),
 * out = (g * sigmoid(g * alpha)) * (u + 1); [n]. */
hm_status cuda_swiglu_oai(const float *gate, const float *up, float *out, int64_t n, float alpha,
                          float limit, void *stream, hm_error *err);
/* = cpu_swiglu_slice of kind CPU_GLU_SILU, CPU_GLU_OAI (gpt-oss's alpha 1.702 and limit 7) or
 * CPU_GLU_GELU (cpu_geglu): the expert activation of an architecture (cuda_engine_glu); [n]. */
hm_status cuda_glu_act(int kind, const float *gate, const float *up, float *out, int64_t n,
                       void *stream, hm_error *err);
/* The logits' soft-capping (gemma4): x = cap * tanh(x / cap), CUDA's tanhf (within 2 ulp of the
 * CPU's libm: close to, not equal to, the CPU); [n]. */
hm_status cuda_softcap(float *x, float cap, int64_t n, void *stream, hm_error *err);

/* ------------------------------------------------------------------ router */

/* What a router launch writes besides the ids and weights (device memory; all optional):
 *  - with slot_of [n_expert] (a layer's expert->slot table, cuda_engine.h) and dslot
 *    [n_tok][k]: dslot[t][s] = slot_of[ids[t][s]], the device slot of each selected expert, the
 *    index the expert kernels read the layer's expert arenas with (cuda_moe_args.ids,
 *    cuda_gemm_moe_args.ids, the bias adds). The table is never written by a kernel, so the
 *    launch asks L2 for it before waiting for its predecessor;
 *  - with hits [n_expert] and stat [2] (the routing counts of cuda_engine.h): hits[id] += 1 for
 *    every (token, selected expert), stat[0] += 1 (calls) and stat[1] += n_tok (tokens) per
 *    launch, by atomics in the selecting block. Unset: nothing counted and nothing done. */
typedef struct {
    const int32_t *slot_of;
    int32_t *dslot;
    uint32_t *hits;
    uint64_t *stat;
} cuda_route_out;

/* = cpu_router with outputs in device memory: logits [n_tok][n_expert] (device), bias
 * [n_expert] or NULL (device), d_ids [n_tok][k] int32, d_weights [n_tok][k] f32. Slots by
 * descending score, equal scores lower id first; both gating modes and renorm as the CPU.
 * 1 <= k <= n_expert <= 4096 (HM_ERR_ARG otherwise). The CPU rejects NaN logits; here a NaN
 * has no error path: a NaN score sorts after every number (ties among NaNs by id), so the ids
 * stay k distinct experts, but that token's weights are unspecified (NaN in softmax mode). One
 * block per token. out: NULL, or the extra outputs (cuda_route_out; slot_of and dslot come
 * together, and hits and stat, HM_ERR_ARG otherwise). */
hm_status cuda_router(const float *logits, const float *bias, int64_t n_tok, int n_expert, int k,
                      cpu_gate_mode mode, int renorm, int32_t *d_ids, float *d_weights,
                      const cuda_route_out *out, void *stream, hm_error *err);

/* ------------------------------------------------------------------ RoPE */

/* cos/sin per position, exactly the CPU's: table [n_pos][n_dims/2][2] = (c, s) of positions
 * 0..n_pos-1, obtained by running cpu_rope itself on unit pairs (host memory; the caller
 * uploads it once). 8 * n_dims/2 * n_pos bytes (e.g. 1 MiB for 64 pairs x 4096 positions). */
hm_status cuda_rope_table_fill(const cpu_rope_params *p, int64_t n_pos, float *table,
                               hm_error *err);

typedef struct {
    cpu_rope_params p;    /* the same parameters as the CPU (mode, n_dims, base, YaRN, ...) */
    const float *d_table; /* device [n_table][n_dims/2][2] from cuda_rope_table_fill, or NULL */
    int64_t n_table;      /* positions in d_table */
} cuda_rope_args;

/* = cpu_rope on q [n_tok][n_head][head_dim] and (k non-NULL) k [n_tok][n_head_kv][head_dim] in
 * one launch; token t at position d_pos[t] (device int32 [n_tok]). Positions below n_table
 * read cos/sin from d_table: bit-identical to cpu_rope. Other positions compute the angles on
 * the device with the CPU's double formulas (freq_base^(-2i/n_dims) and the YaRN mix are
 * computed on the host in double exactly as cpu_rope and passed in; cos/sin are CUDA's double
 * cos/sin, within 2 double ulp of libm's, so the float result equals the CPU's unless the
 * double value lies within ~2^-28 relative of a float rounding boundary — not seen in the
 * test's 3000 positions x 64 pairs). Errors as cpu_rope (HM_ERR_ARG). */
hm_status cuda_rope_qk(float *q, int n_head, float *k, int n_head_kv, int64_t n_tok,
                       int head_dim, const int32_t *d_pos, const cuda_rope_args *a, void *stream,
                       hm_error *err);

#ifdef __cplusplus
}
#endif

#endif
