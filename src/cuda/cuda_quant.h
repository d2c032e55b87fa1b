/* cuda_quant.h - quantised weight products on the GPU: activation quantisation, matrix-vector
 * products for decode-sized batches, the grouped Mixture-of-Experts product with device-resident
 * expert ids, the fused expert gate/up + activation, and embedding row lookup.
 *
 * DESIGN: every product is the canonical dot of docs/ARITHMETIC.md, so each output is
 * bit-identical to cpu_matmul / cpu_moe_matmul / quant_dot_ref for any n_tok (tokens are tiled
 * by <= 8 internally; tiling never changes a result). A warp owns a weight row: the INTEGER work
 * of each block is split across lanes (exact, any order), then the block's float update is done
 * by the lane that owns accumulator (block mod 32), in increasing block order, and the 32 lanes
 * are combined by the __shfl_down tree 16..1. Activations are quantised once per call by
 * cuda_quantize_act into the CPU's byte layout (q8_32 / q8_K rows; f32 rows for float weights).
 *
 * Contract of every launcher: all pointers except the argument structs are DEVICE pointers;
 * `stream` is a cudaStream_t (NULL = default stream); the call only enqueues kernels (no sync,
 * no allocation, no copy to the host), so it can be captured into a CUDA graph. Returns
 * HM_ERR_ARG / HM_ERR_UNSUPPORTED for bad arguments (checked on the host before launching),
 * HM_ERR_CUDA (naming the kernel) when the launch fails. A build without CUDA gets stubs that
 * return HM_ERR_UNSUPPORTED "built without CUDA".
 * Supported weight types: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K mxfp4 iq4_nl
 * iq4_xs.
 */
#ifndef HM_CUDA_CUDA_QUANT_H
#define HM_CUDA_CUDA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/status.h"
#include "quant/quant.h"

/* Bytes of one activation row of k elements for weight type wtype: identical to
 * quant_act_row_size(quant_act_for(wtype), k) (4*k for f32/f16/bf16); 0 if the type is not
 * supported or k does not fit its blocks. Host-only, also in builds without CUDA. */
static inline size_t cuda_act_row_bytes(uint32_t wtype, int64_t k) {
    const quant_act a = quant_act_for(wtype);
    return a == QUANT_ACT_COUNT ? 0 : quant_act_row_size(a, k);
}

/* act[r] = activation row of x[r] for weight type wtype, r < n_rows.
 *   x: [n_rows][k] f32; act: n_rows rows of cuda_act_row_bytes(wtype, k) bytes.
 * Bytes identical to quant_act_quantize_ref. For f32/f16/bf16 weights the row is a copy of x
 * (callers may also pass x itself as the activation of cuda_matvec). */
hm_status cuda_quantize_act(uint32_t wtype, const float *x, int64_t k, int64_t n_rows, void *act,
                            void *stream, hm_error *err);
/* cuda_swiglu(gate, up) then cuda_quantize_act of the result, in one launch and with its bytes
 * (the SwiGLU values are not stored); wtype must take quantised activations (HM_ERR_ARG for
 * float weights: use cuda_swiglu and the f32 rows). gate, up: [n_rows][k]. */
hm_status cuda_quantize_act_glu(uint32_t wtype, const float *gate, const float *up, int64_t k,
                                int64_t n_rows, void *act, void *stream, hm_error *err);

/* y[t][r] = dot(row r of w, act row t), r < n_rows, t < n_tok.
 *   w: [n_rows] rows of k elements of wtype (hm_row_size(wtype, k) bytes each), contiguous;
 *   act: [n_tok] rows from cuda_quantize_act; y: [n_tok][n_rows] f32. */
hm_status cuda_matvec(uint32_t wtype, const void *w, int64_t n_rows, int64_t k, const void *act,
                      int64_t n_tok, float *y, void *stream, hm_error *err);

/* Grouped expert product, the device twin of cpu_moe_args (all pointers device pointers). An
 * "expert" here is an index into w: the engine passes the selected experts' device slots
 * (cuda_engine.h: expert arenas of n_slots experts) as ids and n_slots as n_expert. */
typedef struct {
    uint32_t wtype;
    const void *w;         /* [n_expert][n_rows] rows of k elements, contiguous */
    int64_t n_expert, n_rows, k;
    const void *act;       /* activation rows (cuda_quantize_act of the inputs):
                            * x_per_slot ? [n_tok][n_used] : [n_tok] */
    int x_per_slot;        /* 0: every slot of token t reads act row t; 1: its own row */
    const int32_t *ids;    /* [n_tok][n_used] selected experts, in device memory */
    int64_t n_tok;
    int n_used;
    float *y;              /* [n_tok][n_used][n_rows] */
} cuda_moe_args;

/* y[t][s][r] = dot(row r of expert ids[t][s], act of (t, s)), one launch for all selected
 * experts; each expert's weights are read once per call (pairs sharing an expert are computed
 * together, tiles of <= 4), unselected experts cost nothing. The ids live on the device, so there
 * is no error path for them: a slot with id < 0 or id >= n_expert is SKIPPED and its y rows are
 * left untouched (cpu_moe_matmul fails on id >= n_expert instead). */
hm_status cuda_moe_matvec(const cuda_moe_args *a, void *stream, hm_error *err);

/* Expert activation after gate/up (docs/OPS.md). */
typedef enum {
    CUDA_GLU_SWIGLU = 0, /* silu(g) * u */
    CUDA_GLU_OAI = 1,    /* gpt-oss: g = min(g, limit), u = clamp(u, -limit, limit),
                          * (g * sigmoid(g * alpha)) * (u + 1) */
    CUDA_GLU_GELU = 2,   /* gemma4: gelu(g) * u (hm_geluf) */
} cuda_glu; /* the values of cpu/ops.h's CPU_GLU_* */

/* Fused decode expert gate/up: for each (t, s) and row r
 *   g = dot(gate row r of expert e, act) [+ gate_b[e][r]], u = likewise with up,
 *   out[t][s][r] = glu(g, u)
 * bit-identical to the gate/up/bias/activation of the executor's CPU lane (moe_exec_post).
 * gate.y is ignored; gate.ids/act/x_per_slot/n_tok/n_used/n_expert/n_rows/k are shared by up;
 * up_wtype must equal gate.wtype (else HM_ERR_UNSUPPORTED: run two cuda_moe_matvec and the
 * elementwise ops instead). Skipped slots
 * (id < 0 or >= n_expert) leave out untouched. */
typedef struct {
    cuda_moe_args gate;   /* the gate product (and the shared geometry) */
    uint32_t up_wtype;
    const void *up_w;     /* [n_expert][n_rows] rows of k elements */
    const float *gate_b;  /* [n_expert][n_rows] f32 or NULL */
    const float *up_b;    /* [n_expert][n_rows] f32 or NULL */
    cuda_glu glu;
    float alpha, limit;   /* CUDA_GLU_OAI only (gpt-oss: 1.702, 7.0) */
    float *out;           /* [n_tok][n_used][n_rows] */
} cuda_moe_gate_up_args;

hm_status cuda_moe_gate_up(const cuda_moe_gate_up_args *a, void *stream, hm_error *err);

/* out[i] = dequantised row d_ids[i] of table (row i of out has k floats), i < n.
 *   table: rows of row_size bytes (hm_row_size(wtype, k)); d_ids: [n] device int32; out: [n][k].
 * Values bit-identical to quant_dequantize_row. An id outside [0, n_rows of the table) cannot be
 * checked on the device (the table's row count is not passed): callers validate token ids; a
 * negative id writes zeros. */
hm_status cuda_get_rows(uint32_t wtype, const void *table, size_t row_size, const int32_t *d_ids,
                        int64_t n, int64_t k, float *out, void *stream, hm_error *err);

#ifdef __cplusplus
}
#endif

#endif
