/* cuda_gemm.cu - tensor-core products for prompt-sized batches (see cuda_gemm.h).
 *
 * DESIGN: one thread block computes a TOK x ROWS (64 x 64) tile of y with 4 warps (each 32 x 32,
 * 2 x 2 wmma f16 16x16x16 fragments, f32 accumulators). Per k step of 64 it copies the f16
 * activations of its tokens into shared memory (16-byte loads) and dequantises its weight rows
 * (gemm_deq::deq<TYPE>, 16 elements per call, two calls per thread) into shared memory as f16;
 * the tile is then stored through shared memory so that y is written in coalesced row order.
 * The token side of a tile is a list of (activation row, output row) pairs in shared memory: a
 * plain product lists tokens t0..t0+63, a grouped one the (token, slot) pairs of one expert, so
 * both run the same body. Latency is hidden by occupancy (18 KiB of shared memory per block),
 * not by an explicit pipeline.
 *
 * Grouped routing (moe_route_kernel, one block): count the pairs per expert in shared memory,
 * exclusive prefix sums of pair and tile counts, write the tile table, then scatter the pair
 * indices into expert order with shared atomics. The order of pairs within an expert is not
 * deterministic, but every output element is computed by the same sequence of fragment
 * operations whatever row of a tile it lands in, so the results are.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>

extern "C" {
#include "cuda/cuda_gemm.h"
#include "quant/qtypes.h"
}
#include "cuda/cuda_gemm_deq.cuh"
#include "cuda/cuda_launch.cuh"

using namespace nvcuda;

namespace {

constexpr int BM = CUDA_GEMM_TILE_TOK;  /* tokens per block */
constexpr int BN = CUDA_GEMM_TILE_ROWS; /* weight rows per block */
constexpr int BK = 64;                  /* k per shared-memory step */
constexpr int LDS = BK + 8;             /* padded row pitch (halves) of the A and B tiles */
constexpr int LDC = BN + 4;             /* padded row pitch (floats) of the output staging */
constexpr int THREADS = 128;
constexpr int ROUTE_THREADS = 1024;

static_assert(BM == 64 && BN == 64, "the warp layout below assumes 64 x 64 tiles");

struct smem_tiles {
    __half a[BM][LDS]; /* activations [token][k] */
    __half b[BN][LDS]; /* weights [row][k] */
};
union smem_gemm {
    smem_tiles t;
    float c[BM][LDC]; /* output staging [token][row] */
};

/* One 64 x 64 tile: a_row[m] is the f16 activation row of tile token m (-1: none), y_row[m] the
 * output row (of n_rows floats) it is written to. */
template <int TYPE>
__device__ void gemm_tile(const uint8_t *w, size_t row_bytes, int64_t n_rows, int k,
                          const __half *xh, const int64_t *a_row, const int64_t *y_row, float *y,
                          int64_t row0, smem_gemm &sm) {
    const int tid = threadIdx.x, warp = tid / 32;
    const int wm = warp / 2, wn = warp % 2; /* warp's 32 x 32 quarter */
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = 0; k0 < k; k0 += BK) {
        const int kv = min(BK, k - k0); /* 32 or 64 */
        /* activations: 64 rows x 8 chunks of 8 halves */
#pragma unroll
        for (int i = 0; i < (BM * BK / 8) / THREADS; i++) {
            const int idx = tid + i * THREADS, m = idx / (BK / 8), c = (idx % (BK / 8)) * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            const int64_t ar = a_row[m];
            if (ar >= 0 && c < kv) v = *(const uint4 *)(xh + ar * k + k0 + c);
            *(uint4 *)&sm.t.a[m][c] = v;
        }
        /* weights: 64 rows x 4 groups of 16 */
#pragma unroll
        for (int i = 0; i < (BN * BK / 16) / THREADS; i++) {
            const int idx = tid + i * THREADS, n = idx / (BK / 16), c = (idx % (BK / 16)) * 16;
            float f[16];
            if (row0 + n < n_rows && c < kv) {
                gemm_deq::deq<TYPE>::run(w + (row0 + n) * row_bytes, k0 + c, f);
            } else {
#pragma unroll
                for (int j = 0; j < 16; j++) f[j] = 0.0f;
            }
            __half2 h[8];
#pragma unroll
            for (int j = 0; j < 8; j++) h[j] = __floats2half2_rn(f[2 * j], f[2 * j + 1]);
            *(uint4 *)&sm.t.b[n][c] = *(const uint4 *)&h[0];
            *(uint4 *)&sm.t.b[n][c + 8] = *(const uint4 *)&h[4];
        }
        __syncthreads();
        for (int kk = 0; kk < kv; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &sm.t.a[wm * 32 + i * 16][kk], LDS);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], &sm.t.b[wn * 32 + j * 16][kk], LDS);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&sm.c[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < BM * BN; idx += THREADS) {
        const int m = idx / BN, n = idx % BN;
        const int64_t yr = y_row[m];
        if (yr >= 0 && row0 + n < n_rows) y[yr * n_rows + row0 + n] = sm.c[m][n];
    }
}

/* grid (token tiles, row tiles) */
template <int TYPE>
__global__ void __launch_bounds__(THREADS)
gemm_kernel(const uint8_t *w, size_t row_bytes, int64_t n_rows, int k, const __half *xh,
            int64_t n_tok, float *y) {
    cu_pdl_enter();
    __shared__ __align__(128) smem_gemm sm;
    __shared__ int64_t a_row[BM], y_row[BM];
    const int64_t t0 = (int64_t)blockIdx.x * BM;
    for (int m = threadIdx.x; m < BM; m += THREADS) {
        const int64_t t = t0 + m;
        a_row[m] = y_row[m] = t < n_tok ? t : -1;
    }
    __syncthreads();
    gemm_tile<TYPE>(w, row_bytes, n_rows, k, xh, a_row, y_row, y, (int64_t)blockIdx.y * BN, sm);
}

/* grid (max tiles, row tiles); tiles past *n_tiles exit */
template <int TYPE>
__global__ void __launch_bounds__(THREADS)
gemm_moe_kernel(const uint8_t *w, size_t row_bytes, size_t expert_bytes, int64_t n_rows, int k,
                const __half *xh, int x_per_slot, int n_used, const int32_t *sorted,
                const int32_t *t_exp, const int32_t *t_start, const int32_t *t_n,
                const int32_t *n_tiles, float *y) {
    cu_pdl_enter();
    const int tile = blockIdx.x;
    if (tile >= *n_tiles) return;
    __shared__ __align__(128) smem_gemm sm;
    __shared__ int64_t a_row[BM], y_row[BM];
    const int start = t_start[tile], cnt = t_n[tile];
    for (int m = threadIdx.x; m < BM; m += THREADS) {
        int64_t p = m < cnt ? sorted[start + m] : -1;
        a_row[m] = p < 0 ? -1 : (x_per_slot ? p : p / n_used);
        y_row[m] = p;
    }
    __syncthreads();
    gemm_tile<TYPE>(w + (size_t)t_exp[tile] * expert_bytes, row_bytes, n_rows, k, xh, a_row,
                    y_row, y, (int64_t)blockIdx.y * BN, sm);
}

/* One block: group the valid pairs of ids [n_pairs] by expert (see DESIGN). Dynamic shared
 * memory: 2 * n_expert ints. */
__global__ void __launch_bounds__(ROUTE_THREADS)
moe_route_kernel(const int32_t *ids, int n_pairs, int n_expert, int32_t *sorted, int32_t *t_exp,
                 int32_t *t_start, int32_t *t_n, int32_t *n_tiles) {
    cu_pdl_enter();
    extern __shared__ int route_sh[];
    int *cnt = route_sh, *cur = route_sh + n_expert;
    __shared__ int scan_p[ROUTE_THREADS], scan_t[ROUTE_THREADS];
    const int tid = threadIdx.x;
    for (int e = tid; e < n_expert; e += ROUTE_THREADS) cnt[e] = 0;
    __syncthreads();
    for (int p = tid; p < n_pairs; p += ROUTE_THREADS) {
        const int id = ids[p];
        if (id >= 0 && id < n_expert) atomicAdd(&cnt[id], 1);
    }
    __syncthreads();
    /* each thread owns a contiguous run of experts */
    const int per = (n_expert + ROUTE_THREADS - 1) / ROUTE_THREADS;
    const int e0 = min(tid * per, n_expert), e1 = min(e0 + per, n_expert);
    int sp = 0, st = 0;
    for (int e = e0; e < e1; e++) {
        sp += cnt[e];
        st += (cnt[e] + BM - 1) / BM;
    }
    scan_p[tid] = sp;
    scan_t[tid] = st;
    __syncthreads();
    for (int off = 1; off < ROUTE_THREADS; off *= 2) { /* inclusive Hillis-Steele scan */
        const int ap = tid >= off ? scan_p[tid - off] : 0;
        const int at = tid >= off ? scan_t[tid - off] : 0;
        __syncthreads();
        scan_p[tid] += ap;
        scan_t[tid] += at;
        __syncthreads();
    }
    int op = scan_p[tid] - sp, ot = scan_t[tid] - st;
    for (int e = e0; e < e1; e++) {
        cur[e] = op;
        for (int i = 0; i * BM < cnt[e]; i++, ot++) {
            t_exp[ot] = e;
            t_start[ot] = op + i * BM;
            t_n[ot] = min(BM, cnt[e] - i * BM);
        }
        op += cnt[e];
    }
    if (tid == ROUTE_THREADS - 1) *n_tiles = scan_t[tid];
    __syncthreads();
    for (int p = tid; p < n_pairs; p += ROUTE_THREADS) {
        const int id = ids[p];
        if (id >= 0 && id < n_expert) sorted[atomicAdd(&cur[id], 1)] = p;
    }
}

/* xh[i] = f16(x[i]) (round to nearest even), n a multiple of 4 */
__global__ void to_f16_kernel(const float4 *x, __half2 *xh, int64_t n4) {
    cu_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float4 v = x[i];
        xh[2 * i] = __floats2half2_rn(v.x, v.y);
        xh[2 * i + 1] = __floats2half2_rn(v.z, v.w);
    }
}

hm_status launch_check(const char *what, hm_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return hm_error_set(err, HM_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
    return HM_OK;
}

hm_status to_f16(const float *x, int64_t n, __half *xh, cudaStream_t s, hm_error *err) {
    const int64_t n4 = n / 4;
    const int64_t blocks = n4 / 256 + 1;
    cu_launch(to_f16_kernel, (unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, s,
        (const float4 *)x, (__half2 *)xh, n4);
    return launch_check("cuda_gemm to_f16_kernel", err);
}

/* x-macro over the weight types */
#define GEMM_TYPES(X)                                                                         \
    X(HM_TYPE_F32) X(HM_TYPE_F16) X(HM_TYPE_BF16) X(HM_TYPE_Q4_0) X(HM_TYPE_Q4_1)             \
    X(HM_TYPE_Q5_0) X(HM_TYPE_Q5_1) X(HM_TYPE_Q8_0) X(HM_TYPE_MXFP4) X(HM_TYPE_IQ4_NL)        \
    X(HM_TYPE_Q4_K) X(HM_TYPE_Q5_K) X(HM_TYPE_Q6_K) X(HM_TYPE_IQ4_XS)

hm_status check_shape(uint32_t wtype, int64_t n_rows, int64_t k, int64_t n_tok, hm_error *err) {
    if (!cuda_gemm_supported(wtype))
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "cuda_gemm: unsupported weight type %s",
                            hm_type_name(wtype));
    const hm_type_info *ti = hm_type_get(wtype);
    if (k <= 0 || k % 32 || k % ti->block_size || k > (1 << 30))
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm: k = %lld is not a positive multiple of 32 and of %s's block",
                            (long long)k, ti->name);
    if (n_rows <= 0 || n_rows > (int64_t)65535 * BN || n_tok <= 0 || n_tok > ((int64_t)1 << 30))
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm: bad shape n_rows %lld, n_tok %lld",
                            (long long)n_rows, (long long)n_tok);
    return HM_OK;
}

} // namespace

extern "C" hm_status cuda_gemm(uint32_t wtype, const void *w, int64_t n_rows, int64_t k,
                               const float *x, int64_t n_tok, float *y, void *scratch,
                               size_t scratch_size, void *stream, hm_error *err) {
    hm_status st = check_shape(wtype, n_rows, k, n_tok, err);
    if (st != HM_OK) return st;
    if (!w || !x || !y || !scratch)
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm: NULL pointer");
    if ((uintptr_t)w % 16 || (uintptr_t)x % 16 || (uintptr_t)scratch % 16)
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm: weights, x and scratch must be 16-byte aligned");
    if (scratch_size < cuda_gemm_scratch_size(k, n_tok))
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm: scratch of %zu bytes, need %zu",
                            scratch_size, cuda_gemm_scratch_size(k, n_tok));
    cudaStream_t s = (cudaStream_t)stream;
    __half *xh = (__half *)scratch;
    st = to_f16(x, k * n_tok, xh, s, err);
    if (st != HM_OK) return st;
    const size_t row_bytes = hm_row_size(wtype, k);
    const dim3 grid((unsigned)((n_tok + BM - 1) / BM), (unsigned)((n_rows + BN - 1) / BN));
    switch (wtype) {
#define X(T)                                                                                  \
    case T:                                                                                   \
        cu_launch(gemm_kernel<T>, grid, THREADS, 0, s, (const uint8_t *)w, row_bytes, n_rows, (int)k, \
                                                xh, n_tok, y);                                \
        break;
        GEMM_TYPES(X)
#undef X
    default: break;
    }
    return launch_check("cuda_gemm gemm_kernel", err);
}

extern "C" hm_status cuda_gemm_moe(const cuda_gemm_moe_args *a, void *scratch,
                                   size_t scratch_size, void *stream, hm_error *err) {
    if (!a) return hm_error_set(err, HM_ERR_ARG, "cuda_gemm_moe: NULL arguments");
    hm_status st = check_shape(a->wtype, a->n_rows, a->k, a->n_tok, err);
    if (st != HM_OK) return st;
    if (a->n_used <= 0 || a->n_expert <= 0 || a->n_expert > CUDA_GEMM_MAX_EXPERTS ||
        a->n_tok * a->n_used > ((int64_t)1 << 30))
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm_moe: bad n_used %d / n_expert %lld",
                            a->n_used, (long long)a->n_expert);
    if (!a->w || !a->x || !a->y || !a->ids || !scratch)
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm_moe: NULL pointer");
    if ((uintptr_t)a->w % 16 || (uintptr_t)a->x % 16 || (uintptr_t)scratch % 16)
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm_moe: weights, x and scratch must be 16-byte aligned");
    const size_t need = cuda_gemm_moe_scratch_size(a);
    if (scratch_size < need)
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm_moe: scratch of %zu bytes, need %zu",
                            scratch_size, need);
    const int64_t n_pairs = a->n_tok * a->n_used, x_rows = a->x_per_slot ? n_pairs : a->n_tok;
    const int64_t max_tiles = cuda_gemm_moe_max_tiles(n_pairs, a->n_expert);
    uint8_t *p = (uint8_t *)scratch;
    __half *xh = (__half *)p;
    p += cuda_gemm_align_((size_t)x_rows * (size_t)a->k * 2);
    int32_t *sorted = (int32_t *)p;
    p += cuda_gemm_align_((size_t)n_pairs * 4);
    int32_t *t_exp = (int32_t *)p;
    p += cuda_gemm_align_((size_t)max_tiles * 4);
    int32_t *t_start = (int32_t *)p;
    p += cuda_gemm_align_((size_t)max_tiles * 4);
    int32_t *t_n = (int32_t *)p;
    p += cuda_gemm_align_((size_t)max_tiles * 4);
    int32_t *n_tiles = (int32_t *)p;

    cudaStream_t s = (cudaStream_t)stream;
    st = to_f16(a->x, x_rows * a->k, xh, s, err);
    if (st != HM_OK) return st;
    cu_launch(moe_route_kernel, 1, ROUTE_THREADS, 2 * (size_t)a->n_expert * sizeof(int), s,
        a->ids, (int)n_pairs, (int)a->n_expert, sorted, t_exp, t_start, t_n, n_tiles);
    st = launch_check("cuda_gemm_moe moe_route_kernel", err);
    if (st != HM_OK) return st;
    const size_t row_bytes = hm_row_size(a->wtype, a->k);
    const size_t expert_bytes = a->w_stride ? a->w_stride : row_bytes * (size_t)a->n_rows;
    if (a->w_stride && (a->w_stride % 16 || a->w_stride < row_bytes * (size_t)a->n_rows))
        return hm_error_set(err, HM_ERR_ARG, "cuda_gemm_moe: expert stride %zu (a multiple of 16 "
                            "of at least %zu bytes)", a->w_stride, row_bytes * (size_t)a->n_rows);
    const dim3 grid((unsigned)max_tiles, (unsigned)((a->n_rows + BN - 1) / BN));
    switch (a->wtype) {
#define X(T)                                                                                  \
    case T:                                                                                   \
        cu_launch(gemm_moe_kernel<T>, grid, THREADS, 0, s,                                           \
            (const uint8_t *)a->w, row_bytes, expert_bytes, a->n_rows, (int)a->k, xh,         \
            a->x_per_slot, a->n_used, sorted, t_exp, t_start, t_n, n_tiles, a->y);            \
        break;
        GEMM_TYPES(X)
#undef X
    default: break;
    }
    return launch_check("cuda_gemm_moe gemm_moe_kernel", err);
}
