/* cuda_fused_matvec.cu - several products of one weight type in one launch (cuda_matvec_multi
 * of cuda_fused.h), e.g. an attention layer's q, k and v against one quantised activation.
 *
 * DESIGN: the matvec kernel (cuda_matvec is its one-matrix case): a warp per row, CQ_WARPS
 * rows per CTA; the CTAs of a launch are the concatenation of each matrix's CTAs, so a CTA
 * finds its matrix by comparing blockIdx.x with the matrices' first CTA (unrolled selects, no
 * indexed parameter memory). A warp computes its row with row_dot (cuda_quant_internal.cuh)
 * and the token tiling cq_tile; the optional bias is added in the epilogue with the same
 * __fadd_rn as cuda_add_bias, and an accumulating matrix adds the product to y's old values as
 * cuda_add does (the o product into the residual stream; the old values are loaded before the
 * dot, so their latency hides behind it). Before waiting for the previous kernel (cu_pdl_enter), a warp
 * starts fetching its weight row: with programmatic dependent launch the CTAs are resident
 * while the previous (usually latency-bound) kernel runs, so the weights stream in meanwhile.
 * One-token launches copy the row into the warp's shared slot by cp.async (cq_stage_row: all
 * its bytes in flight, no registers held) when the matrices allow it; otherwise the
 * warp asks L2 for the row. Same operations either way: the same bytes.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_quant_internal.cuh"

extern "C" {
#include "cuda/cuda_fused.h"
}

typedef struct {
    const uint8_t *w[CUDA_MULTI_MAX];
    const float *bias[CUDA_MULTI_MAX];
    float *y[CUDA_MULTI_MAX];
    int64_t n_rows[CUDA_MULTI_MAX];
    int acc_mask; /* bit i: matrix i accumulates into y */
    unsigned blk0[CUDA_MULTI_MAX]; /* first CTA of matrix i (unused entries: the total) */
    int n_mat;
} multi_k;

template <class T, int NT>
__global__ void __launch_bounds__(CQ_WARPS * 32, 4)
k_matvec_multi(const multi_k M, size_t row_bytes, int64_t k, const uint8_t *act,
               size_t act_bytes, int64_t n_tok, size_t stage_bytes) {
    int m = 0;
#pragma unroll
    for (int i = 1; i < CUDA_MULTI_MAX; i++)
        if (i < M.n_mat && blockIdx.x >= M.blk0[i]) m = i;
    const uint8_t *w = M.w[0];
    const float *bias = M.bias[0];
    float *y = M.y[0];
    int64_t n_rows = M.n_rows[0];
    unsigned b0 = M.blk0[0];
#pragma unroll
    for (int i = 1; i < CUDA_MULTI_MAX; i++)
        if (i == m) {
            w = M.w[i];
            bias = M.bias[i];
            y = M.y[i];
            n_rows = M.n_rows[i];
            b0 = M.blk0[i];
        }
    const int64_t r = (int64_t)(blockIdx.x - b0) * CQ_WARPS + threadIdx.x / 32;
    const uint8_t *wr = w + (size_t)r * row_bytes;
    const bool staged = NT == 1 && stage_bytes && r < n_rows;
    if (staged) { /* the row into shared memory while the previous kernel finishes */
        extern __shared__ __align__(16) uint8_t mv_slots[]; /* [CQ_WARPS][stage_bytes] */
        wr = cq_stage_row(mv_slots + (size_t)(threadIdx.x / 32) * stage_bytes, wr, row_bytes);
    } else if (r < n_rows) { /* ... or into L2 */
        for (size_t o = (size_t)(threadIdx.x & 31) * 128; o < row_bytes; o += 32 * 128) cu_prefetch_l2(wr + o);
    }
    const float b = bias && r < n_rows && (threadIdx.x & 31) == 0 ? bias[r] : 0.0f; /* weights too */
    cu_pdl_enter();
    if (r >= n_rows) return; /* whole warp */
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const bool acc = (M.acc_mask >> m) & 1;
    float old[NT]; /* an accumulating row's values, loaded before the dot (only this warp writes them) */
#pragma unroll
    for (int i = 0; i < NT; i++)
        old[i] = acc && (threadIdx.x & 31) == 0 && t0 + i < n_tok ? y[(t0 + i) * n_rows + r] : 0.0f;
    if (staged) cq_stage_wait();
    const uint8_t *a[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) a[i] = act + (size_t)min(t0 + i, n_tok - 1) * act_bytes;
    float out[NT];
    row_dot<T, NT>(wr, k, a, out);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int i = 0; i < NT; i++)
            if (t0 + i < n_tok) {
                const float v = bias ? __fadd_rn(out[i], b) : out[i];
                y[(t0 + i) * n_rows + r] = acc ? __fadd_rn(old[i], v) : v;
            }
    }
}

template <class T>
static void launch_multi(const multi_k *M, unsigned n_blocks, int64_t k, const uint8_t *act,
                         int64_t n_tok, cudaStream_t st) {
    const size_t row_bytes = (size_t)(k / T::BS) * T::TS;
    const size_t act_bytes =
        T::ACT == QUANT_ACT_F32 ? (size_t)k * 4 : (size_t)(k / T::BS) * T::ABS;
    const int nt = cq_tile(n_tok);
    const dim3 grid(n_blocks, (unsigned)((n_tok + nt - 1) / nt));
    const dim3 block(CQ_WARPS * 32);
    /* one token: rows staged when a CTA's slots fit and every matrix allows it */
    const size_t slot = cq_stage_slot(row_bytes);
    bool stage = cq_stages<T>() && nt == 1 && CQ_WARPS * slot <= CQ_STAGE_MAX;
    for (int i = 0; i < M->n_mat; i++) stage = stage && cq_stage_ok(M->w[i], (size_t)M->n_rows[i] * row_bytes);
    const size_t sb = stage ? slot : 0, smem = CQ_WARPS * sb;
    switch (nt) {
    case 1: cu_launch(k_matvec_multi<T, 1>, grid, block, smem, st, *M, row_bytes, k, act, act_bytes, n_tok, sb); break;
    case 2: cu_launch(k_matvec_multi<T, 2>, grid, block, 0, st, *M, row_bytes, k, act, act_bytes, n_tok, sb); break;
    case 4: cu_launch(k_matvec_multi<T, 4>, grid, block, 0, st, *M, row_bytes, k, act, act_bytes, n_tok, sb); break;
    default: cu_launch(k_matvec_multi<T, 8>, grid, block, 0, st, *M, row_bytes, k, act, act_bytes, n_tok, sb); break;
    }
}

extern "C" hm_status cuda_matvec_multi(uint32_t wtype, int64_t k, const void *act, int64_t n_tok,
                                       const cuda_multi_mat *m, int n_mat, void *stream,
                                       hm_error *err) {
    hm_status s = cq_check_k(err, "cuda_matvec_multi", wtype, k);
    if (s != HM_OK) return s;
    if (!m || n_mat < 1 || n_mat > CUDA_MULTI_MAX)
        return hm_error_set(err, HM_ERR_ARG, "cuda_matvec_multi: %d matrices (1..%d)", n_mat,
                            CUDA_MULTI_MAX);
    if (n_tok < 0 || n_tok / 8 > 65535)
        return hm_error_set(err, HM_ERR_ARG, "cuda_matvec_multi: %lld tokens", (long long)n_tok);
    multi_k M;
    memset(&M, 0, sizeof(M));
    int64_t total = 0;
    for (int i = 0; i < n_mat; i++) {
        if (m[i].n_rows < 0 || (m[i].n_rows > 0 && (!m[i].w || !m[i].y)))
            return hm_error_set(err, HM_ERR_ARG, "cuda_matvec_multi: matrix %d: bad rows or NULL", i);
        M.w[i] = (const uint8_t *)m[i].w;
        M.bias[i] = m[i].bias;
        M.y[i] = m[i].y;
        M.n_rows[i] = m[i].n_rows;
        if (m[i].accumulate) M.acc_mask |= 1 << i;
        M.blk0[i] = (unsigned)total;
        total += (m[i].n_rows + CQ_WARPS - 1) / CQ_WARPS;
        if (total > INT32_MAX)
            return hm_error_set(err, HM_ERR_ARG, "cuda_matvec_multi: too many rows");
    }
    for (int i = n_mat; i < CUDA_MULTI_MAX; i++) M.blk0[i] = (unsigned)total;
    M.n_mat = n_mat;
    if (n_tok == 0 || total == 0) return HM_OK;
    if (!act) return hm_error_set(err, HM_ERR_ARG, "cuda_matvec_multi: NULL activations");
    CB_DISPATCH(wtype, launch_multi, &M, (unsigned)total, k, (const uint8_t *)act, n_tok,
                (cudaStream_t)stream);
    return cq_launched(err, "k_matvec_multi");
}
