/* cuda_quant.cu - activation quantisation, matvec, grouped expert products (plain and fused
 * gate/up + activation) and embedding lookup on the GPU (API and contract: cuda_quant.h).
 *
 * DESIGN: one warp computes one weight row against a tile of NT <= 8 activation rows
 * (row_dot). For block types the warp walks the row in rounds of 32 blocks; a block's integer
 * work is split over G lanes (cuda_blocks.cuh: 4 lanes per 32-element block, 8 per 256-element
 * super-block), so even a k = 768 row (3 super-blocks) keeps 24 lanes busy. The G partial
 * integer sums are combined by __shfl_xor (exact), and the group's first lane applies the
 * block's float update to its accumulator. Block b belongs to spec lane b % 32; in round r the
 * group g at step gi handles block 32r + gi*(32/G) + g, i.e. spec lane gi*(32/G) + g, always in
 * the same physical lane and register slot gi, so each spec lane sees its blocks in increasing
 * order. At the end the 32 spec lanes are moved to physical lanes 0..31 and summed with the
 * __shfl_down tree 16..1: exactly docs/ARITHMETIC.md. Float weights use lane = element mod 32.
 * Tokens: the host picks NT in {1, 2, 4, 8} (a partial tile repeats its last activation row and
 * drops the extra results), so every n_tok gives the CPU's bytes.
 * MoE: CTA (pair p, row group). A pair whose expert already appears in an earlier pair exits;
 * the first pair of an expert gathers all pairs of that expert (in order, tiles of <= 4) and
 * computes them together, so each selected expert's rows are read once per tile of 8 pairs and
 * unselected experts are never touched. Invalid ids (< 0 or >= n_expert) skip their pair.
 */
#include <cuda_runtime.h>

#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_quant_internal.cuh"

extern "C" {
#include "cuda/cuda_fused.h"
}

/* ---------------------------------------------------------------- matvec */

extern "C" hm_status cuda_matvec(uint32_t wtype, const void *w, int64_t n_rows, int64_t k, const void *act,
                                 int64_t n_tok, float *y, void *stream, hm_error *err) {
    hm_status s = cq_check_k(err, "cuda_matvec", wtype, k);
    if (s != HM_OK) return s;
    if (n_rows < 0 || n_tok < 0 || n_tok / 8 > 65535 || n_rows / CQ_WARPS > INT32_MAX)
        return hm_error_set(err, HM_ERR_ARG, "cuda_matvec: bad shape (%lld rows, %lld tokens)", (long long)n_rows,
                            (long long)n_tok);
    if (n_rows == 0 || n_tok == 0) return HM_OK;
    if (!w || !act || !y) return hm_error_set(err, HM_ERR_ARG, "cuda_matvec: NULL pointer");
    /* the one-matrix case of the grouped launch (cuda_fused_matvec.cu): one kernel for both */
    const cuda_multi_mat m = {w, n_rows, NULL, y, 0};
    return cuda_matvec_multi(wtype, k, act, n_tok, &m, 1, stream, err);
}

/* ---------------------------------------------------------------- activation quantisation */

/* One thread per element; B = 32 (q8_32, a warp per block) or 256 (q8_K, a CTA per block). With
 * up (GLU): the element is cm_swiglu(x, up), cuda_swiglu's value. */
template <int B, bool GLU>
__global__ void __launch_bounds__(256) k_quant_act(const float *x, const float *up, int64_t k,
                                                   int64_t n_el, uint8_t *act, size_t act_bytes) {
    cu_pdl_enter();
    __shared__ float wmax[8];
    const int64_t e = (int64_t)blockIdx.x * 256 + threadIdx.x;
    const bool in = e < n_el; /* n_el is a multiple of B, so a whole block is in or out */
    const int64_t row = e / k, ib = (e % k) / B;
    uint8_t *blk = act + (size_t)row * act_bytes + (size_t)ib * (B == 32 ? CB_A32 : CB_AK);
    const float v = !in ? 0.0f : GLU ? cm_swiglu(x[e], up[e]) : x[e];
    cq_quant_block<B>(v, in, blk, wmax);
}

extern "C" hm_status cuda_quantize_act(uint32_t wtype, const float *x, int64_t k, int64_t n_rows, void *act,
                                       void *stream, hm_error *err) {
    hm_status s = cq_check_k(err, "cuda_quantize_act", wtype, k);
    if (s != HM_OK) return s;
    if (n_rows < 0) return hm_error_set(err, HM_ERR_ARG, "cuda_quantize_act: n_rows = %lld", (long long)n_rows);
    if (n_rows == 0) return HM_OK;
    if (!x || !act) return hm_error_set(err, HM_ERR_ARG, "cuda_quantize_act: NULL pointer");
    const quant_act at = quant_act_for(wtype);
    const cudaStream_t st = (cudaStream_t)stream;
    const int64_t n_el = k * n_rows;
    if (at == QUANT_ACT_F32) {
        if ((const void *)x == act) return HM_OK;
        cudaMemcpyAsync(act, x, (size_t)n_el * sizeof(float), cudaMemcpyDeviceToDevice, st);
        return cq_launched(err, "cuda_quantize_act (copy)");
    }
    const size_t ab = quant_act_row_size(at, k);
    const unsigned grid = (unsigned)((n_el + 255) / 256);
    const float *no = NULL;
    if (at == QUANT_ACT_Q8_32)
        cu_launch(k_quant_act<32, false>, grid, 256, 0, st, x, no, k, n_el, (uint8_t *)act, ab);
    else
        cu_launch(k_quant_act<256, false>, grid, 256, 0, st, x, no, k, n_el, (uint8_t *)act, ab);
    return cq_launched(err, "cuda_quantize_act");
}

extern "C" hm_status cuda_quantize_act_glu(uint32_t wtype, const float *gate, const float *up,
                                           int64_t k, int64_t n_rows, void *act, void *stream,
                                           hm_error *err) {
    hm_status s = cq_check_k(err, "cuda_quantize_act_glu", wtype, k);
    if (s != HM_OK) return s;
    const quant_act at = quant_act_for(wtype);
    if (at == QUANT_ACT_F32)
        return hm_error_set(err, HM_ERR_ARG, "cuda_quantize_act_glu: %s weights read f32 rows",
                            hm_type_name(wtype));
    if (n_rows < 0)
        return hm_error_set(err, HM_ERR_ARG, "cuda_quantize_act_glu: n_rows = %lld", (long long)n_rows);
    if (n_rows == 0) return HM_OK;
    if (!gate || !up || !act) return hm_error_set(err, HM_ERR_ARG, "cuda_quantize_act_glu: NULL pointer");
    const int64_t n_el = k * n_rows;
    const size_t ab = quant_act_row_size(at, k);
    const unsigned grid = (unsigned)((n_el + 255) / 256);
    const cudaStream_t st = (cudaStream_t)stream;
    if (at == QUANT_ACT_Q8_32)
        cu_launch(k_quant_act<32, true>, grid, 256, 0, st, gate, up, k, n_el, (uint8_t *)act, ab);
    else
        cu_launch(k_quant_act<256, true>, grid, 256, 0, st, gate, up, k, n_el, (uint8_t *)act, ab);
    return cq_launched(err, "cuda_quantize_act_glu");
}

/* ---------------------------------------------------------------- embedding rows */

template <class T>
__global__ void k_get_rows(const uint8_t *table, size_t row_size, const int32_t *ids, int64_t k, float *out) {
    cu_pdl_enter();
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t i = blockIdx.y;
    if (j >= k) return;
    const int32_t id = ids[i];
    float v = 0.0f;
    if (id >= 0) v = T::deq(table + (size_t)id * row_size + (size_t)(j / T::BS) * T::TS, (int)(j % T::BS));
    out[i * k + j] = v;
}

template <class T>
static void launch_get_rows(const uint8_t *table, size_t row_size, const int32_t *ids, int64_t n, int64_t k,
                            float *out, cudaStream_t st) {
    const dim3 grid((unsigned)((k + 255) / 256), (unsigned)n);
    cu_launch(k_get_rows<T>, grid, 256, 0, st, table, row_size, ids, k, out);
}

extern "C" hm_status cuda_get_rows(uint32_t wtype, const void *table, size_t row_size, const int32_t *d_ids,
                                   int64_t n, int64_t k, float *out, void *stream, hm_error *err) {
    hm_status s = cq_check_k(err, "cuda_get_rows", wtype, k);
    if (s != HM_OK) return s;
    if (n < 0 || n > 65535 || row_size < hm_row_size(wtype, k))
        return hm_error_set(err, HM_ERR_ARG, "cuda_get_rows: bad n = %lld or row size %zu (< %zu)", (long long)n,
                            row_size, hm_row_size(wtype, k));
    if (n == 0) return HM_OK;
    if (!table || !d_ids || !out) return hm_error_set(err, HM_ERR_ARG, "cuda_get_rows: NULL pointer");
    CB_DISPATCH(wtype, launch_get_rows, (const uint8_t *)table, row_size, d_ids, n, k, out, (cudaStream_t)stream);
    return cq_launched(err, "cuda_get_rows");
}
