/* cuda_quant_moe.cu - grouped expert products with device-resident ids (cuda_quant.h):
 * cuda_moe_matvec and the fused decode gate/up + bias + activation cuda_moe_gate_up.
 *
 * DESIGN: grid (pair p = t * n_used + s, row group). The CTA of pair p reads e = ids[p]; if e is
 * invalid, or an earlier pair has the same expert, it exits at once (so an unselected expert
 * costs nothing and a selected one is computed by exactly one CTA per row group). Otherwise
 * warp 0 gathers the pairs of expert e in increasing order, up to MOE_TILE (4) at a time, 32
 * ids per ballot, into shared memory, and each warp computes its rows for that tile with
 * row_dot<T, NT> (NT = 1, 2 or 4, padded with the last pair), so the expert's rows are streamed
 * once per tile (tiles of 8 spilled 350-650 bytes of registers per thread for the k-quants,
 * ptxas -v for sm_90). Every output is
 * the canonical dot of one (row, activation) pair: bit-identical to cpu_moe_matmul. A
 * one-token step, and any step of at most n_expert pairs (where most experts used have one),
 * launches an instance with a pair per CTA (with more than 4 tokens k_moe_units, whose blocks
 * take 4 row groups each: a quarter of the blocks; NTM = 1: 64-80 registers instead
 * of 128, so more warps per SM); there a warp loads the gate and up rows (fused), or its two
 * rows (plain), together (rows_dot with NR = 2); for every type but mxfp4 the two rows are first
 * copied into the warp's shared slots by cp.async (all bytes in flight, no registers held;
 * q6_K, whose register-loaded path spilled, gains most), and the dot reads them there. The
 * fused variant computes the gate and up
 * rows of the same tile, adds the optional
 * biases (g + b, one rounding, as cpu_moe_add_bias) and applies the activation with
 * cuda_math.cuh's bit-identical silu / gpt-oss swiglu (as moe_post_gate_up on the CPU).
 * Scanning for duplicates is O(n_tok * n_used) per CTA: meant for decode batches (n_tok <= 8);
 * prompts use the grouped GEMM (cuda_gemm.h).
 */
#include "cuda/cuda_quant_moe.cuh"

static hm_status moe_check(const cuda_moe_args *a, const char *fn, hm_error *err) {
    if (!a) return hm_error_set(err, HM_ERR_ARG, "%s: NULL arguments", fn);
    hm_status s = cq_check_k(err, fn, a->wtype, a->k);
    if (s != HM_OK) return s;
    if (a->n_expert <= 0 || a->n_rows < 0 || a->n_tok < 0 || a->n_used <= 0 ||
        a->n_tok * a->n_used > INT32_MAX || a->n_rows / CQ_WARPS > 65535)
        return hm_error_set(err, HM_ERR_ARG, "%s: bad shape (%lld experts, %lld rows, %lld tokens, %d used)", fn,
                            (long long)a->n_expert, (long long)a->n_rows, (long long)a->n_tok, a->n_used);
    if (a->n_rows > 0 && a->n_tok > 0 && (!a->w || !a->act || !a->ids))
        return hm_error_set(err, HM_ERR_ARG, "%s: NULL pointer", fn);
    return HM_OK;
}

static moe_params moe_params_of(const cuda_moe_args *a) {
    moe_params P = {};
    P.w = (const uint8_t *)a->w;
    P.n_expert = a->n_expert, P.n_rows = a->n_rows, P.k = a->k;
    P.act = (const uint8_t *)a->act;
    P.x_per_slot = a->x_per_slot;
    P.ids = a->ids;
    P.n_pairs = a->n_tok * a->n_used;
    P.n_used = a->n_used;
    P.y = a->y;
    return P;
}

extern "C" hm_status cuda_moe_matvec(const cuda_moe_args *a, void *stream, hm_error *err) {
    hm_status s = moe_check(a, "cuda_moe_matvec", err);
    if (s != HM_OK) return s;
    if (a->n_rows == 0 || a->n_tok == 0) return HM_OK;
    if (!a->y) return hm_error_set(err, HM_ERR_ARG, "cuda_moe_matvec: NULL y");
    const moe_params P = moe_params_of(a);
    CB_DISPATCH(a->wtype, launch_moe_plain, &P, (cudaStream_t)stream);
    return cq_launched(err, "cuda_moe_matvec");
}

extern "C" hm_status cuda_moe_gate_up(const cuda_moe_gate_up_args *a, void *stream, hm_error *err) {
    hm_status s = moe_check(a ? &a->gate : NULL, "cuda_moe_gate_up", err);
    if (s != HM_OK) return s;
    if (a->up_wtype != a->gate.wtype)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "cuda_moe_gate_up: gate %s and up %s differ in type",
                            hm_type_name(a->gate.wtype), hm_type_name(a->up_wtype));
    if (a->glu < CUDA_GLU_SWIGLU || a->glu > CUDA_GLU_GELU)
        return hm_error_set(err, HM_ERR_ARG, "cuda_moe_gate_up: unknown activation %d", (int)a->glu);
    if (a->gate.n_rows == 0 || a->gate.n_tok == 0) return HM_OK;
    if (!a->up_w || !a->out) return hm_error_set(err, HM_ERR_ARG, "cuda_moe_gate_up: NULL pointer");
    moe_params P = moe_params_of(&a->gate);
    P.w2 = (const uint8_t *)a->up_w;
    P.y = a->out;
    P.b1 = a->gate_b, P.b2 = a->up_b;
    P.glu = (int)a->glu;
    P.alpha = a->alpha, P.limit = a->limit;
    cq_moe_fused_launch(a->gate.wtype, &P, (cudaStream_t)stream);
    return cq_launched(err, "cuda_moe_gate_up");
}
