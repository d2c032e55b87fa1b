/* cuda_fused.cu - residual + rmsnorm + activation quantisation, and per-head q/k norm + RoPE +
 * KV store, each in one launch (cuda_fused.h).
 *
 * DESIGN: k_fused_norm_mb spreads a row over blocks of FM_SLICE elements, one thread each:
 * block s forms its slice of the row (x, x + add, or x + the slot combine in cuda_moe_combine's
 * slot order, FN_SLOTS slot loads issued before use) and writes it back to x; the blocks of
 * the row meet at a barrier (arrival counter + generation in the caller's sync area, the last
 * arrival resets the counter; a launch has at most FM_MAX_BLOCKS blocks, all resident, and
 * longer batches take several launches); then every block reads the whole new row from L2,
 * warp 0 computes the rmsnorm scale (cm_rms_scale: the CPU's 32 double chains and tree), and
 * the block normalises its slice into xn and quantises it as k_quant_act does
 * (cq_quant_block: one q8_K super-block, or eight q8_32 blocks). Same operations on the same
 * values: the unfused sequence's bytes.
 * k_fused_qk is one block per (token, head) of q and k: the head row is staged in shared
 * memory, normed (cm_rms_scale on head_dim), rotated pair by pair exactly as
 * rope_kernel (table cos/sin, or the device double formulas beyond the table), written back,
 * and for k heads stored with the v head into the f16 caches (kv_store_kernel's conversion).
 * The rope constants and rotation (cuda_rope.cuh) and the f16 conversion (cuda_math.cuh) are
 * the same code the unfused launchers use.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "cuda/cuda_blocks.cuh"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_math.cuh"
#include "cuda/cuda_quant_internal.cuh"
#include "cuda/cuda_rope.cuh"

extern "C" {
#include "cuda/cuda_fused.h"
#include "cuda/cuda_quant.h"
}

namespace cg = cooperative_groups;

#define FN_SLOTS 8       /* MoE slots whose loads are issued together */
#define FM_SLICE 256     /* k_fused_norm_mb: elements (threads) per block */
#define FM_MAX_BLOCKS 264 /* ... and at most this many blocks (2 per SM: all resident) */
#define FQ_THREADS 128
#define FQ_MAX_HD 256
#define FULL 0xffffffffu

static hm_status fused_launched(const char *kernel, hm_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "CUDA kernel %s: %s", kernel, cudaGetErrorString(e));
    return HM_OK;
}

/* ------------------------------------------------------------ norm + quantise */

typedef struct {
    float *x;
    const float *add, *ey, *gw;
    const int32_t *ids, *bids;
    int n_used, n_expert;
    const float *eb;
    const float *sh, *sg; /* the shared expert's output and gate logit (or NULL) */
    const float *w;
    float eps;
    float *xn;
    uint8_t *act;
    size_t act_bytes;
    int64_t n;
    int *sync;  /* [n_tok][2] arrival counter, generation */
    int64_t t0; /* first token of the launch */
} norm_k;

/* x[t][i] + the slot combine of element i, slots in increasing order (cuda_moe_add_bias then
 * moe_combine_kernel), then the shared expert's term (shexp_combine_kernel): the slots' loads
 * are issued FN_SLOTS at a time, before any is used */
static __device__ __forceinline__ float fused_combine(const norm_k &A, int64_t t, int64_t i,
                                                      float x) {
    const int64_t n = A.n;
    float acc = 0.0f;
    for (int s0 = 0; s0 < A.n_used; s0 += FN_SLOTS) {
        float y[FN_SLOTS], b[FN_SLOTS], g[FN_SLOTS];
        int32_t id[FN_SLOTS];
        bool hb[FN_SLOTS]; /* the slot's bias row exists */
#pragma unroll
        for (int u = 0; u < FN_SLOTS; u++) {
            const int64_t ts = t * A.n_used + s0 + u;
            const bool in = s0 + u < A.n_used;
            id[u] = !in ? -1 : A.ids ? A.ids[ts] : 0;
            const int32_t bi = !in ? -1 : A.bids ? A.bids[ts] : id[u];
            y[u] = in ? A.ey[ts * n + i] : 0.0f;
            g[u] = in ? A.gw[ts] : 0.0f;
            hb[u] = A.eb && bi >= 0 && bi < A.n_expert;
            b[u] = hb[u] ? A.eb[(int64_t)bi * n + i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < FN_SLOTS; u++) {
            if (id[u] < 0) continue; /* skipped slot, or past n_used */
            const float v = hb[u] ? __fadd_rn(y[u], b[u]) : y[u];
            acc = __fadd_rn(acc, __fmul_rn(g[u], v));
        }
    }
    if (A.sh) acc = __fadd_rn(acc, __fmul_rn(A.sh[t * n + i], cm_sigmoidf(A.sg[t])));
    return __fadd_rn(x, acc); /* cuda_add(x, combine) */
}

/* all gridDim.y blocks of row blockIdx.x meet here (see the DESIGN note) */
static __device__ __forceinline__ void fm_row_barrier(int *sync) {
    __threadfence(); /* every thread's writes of x, before the arrival */
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile int *gen = sync + 1;
        const int g = *gen;
        __threadfence();
        if (atomicAdd(sync, 1) == (int)gridDim.y - 1) {
            *(volatile int *)sync = 0;
            __threadfence();
            atomicAdd(sync + 1, 1);
        } else {
            while (*gen == g) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

/* Element i of row t after the optional expert combine or residual add (written back to x). */
static __device__ __forceinline__ float fm_input(const norm_k &A, int64_t t, int64_t i, bool in) {
    float *xr = A.x + t * A.n;
    float v = in ? xr[i] : 0.0f;
    if (in && A.ey) {
        v = fused_combine(A, t, i, v);
        xr[i] = v;
    } else if (in && A.add) {
        v = __fadd_rn(v, A.add[t * A.n + i]);
        xr[i] = v;
    }
    return v;
}

/* With the whole row t in shared memory: the rms scale, then element i (value v) normalised,
 * weighted, written to xn and quantised; `slice` is the block's slice of the row. */
template <int B>
static __device__ __forceinline__ void fm_output(const norm_k &A, int64_t t, int64_t i, bool in, float v,
                                                 const float *row, int64_t slice) {
    __shared__ float wmax[FM_SLICE / 32];
    const float sv = __fmul_rn(v, cm_rms_scale_block(row, A.n, A.eps));
    const float y = in && A.w ? __fmul_rn(sv, A.w[i]) : sv;
    if (in) A.xn[t * A.n + i] = y;
    if constexpr (B != 0) {
        /* the slice is one q8_K super-block (n % 256 == 0), or whole q8_32 blocks (n % 32 == 0) */
        uint8_t *ar = A.act + (size_t)t * A.act_bytes;
        uint8_t *blk = B == 32 ? ar + (size_t)(i / 32) * CB_A32 : ar + (size_t)slice * CB_AK;
        cq_quant_block<B>(y, in, blk, wmax);
    }
}

/* B = 0: no quantisation; 32: q8_32; 256: q8_K. grid (n_tok, ceil(n / FM_SLICE)). */
template <int B>
__global__ void __launch_bounds__(FM_SLICE) k_fused_norm_mb(const norm_k A) {
    cu_pdl_enter();
    extern __shared__ float row[]; /* [n] */
    const int64_t t = A.t0 + blockIdx.x, n = A.n;
    const int64_t i = (int64_t)blockIdx.y * FM_SLICE + threadIdx.x;
    const bool in = i < n;
    const float v = fm_input(A, t, i, in);
    if (!A.xn) return; /* block-uniform */
    fm_row_barrier(A.sync + 2 * t);
    for (int64_t j = threadIdx.x; j < n; j += FM_SLICE) row[j] = __ldcg(A.x + t * n + j);
    __syncthreads();
    fm_output<B>(A, t, i, in, v, row, blockIdx.y);
}

/* The row's nb = gridDim.x blocks form one thread-block cluster: each block forms its slice
 * (as k_fused_norm_mb), the cluster barrier (hardware, no global atomics or spinning) makes the
 * slices visible, every block gathers the whole row from its peers' shared memory, and after a
 * second cluster barrier (no block leaves while others read its slice) proceeds as
 * k_fused_norm_mb. Same operations: the same bytes. */
template <int B>
__global__ void __launch_bounds__(FM_SLICE) k_fused_norm_cl(const norm_k A) {
    cu_pdl_enter();
    extern __shared__ float row[]; /* [n] */
    __shared__ float slice[FM_SLICE];
    cg::cluster_group cl = cg::this_cluster();
    const int64_t t = A.t0 + blockIdx.y, n = A.n;
    const int64_t i = (int64_t)blockIdx.x * FM_SLICE + threadIdx.x;
    const bool in = i < n;
    const float v = fm_input(A, t, i, in);
    slice[threadIdx.x] = v;
    if (!A.xn) return; /* grid-uniform: no block waits at the cluster barrier */
    cl.sync();
    for (int64_t j = threadIdx.x; j < n; j += FM_SLICE)
        row[j] = cl.map_shared_rank(slice, (unsigned)(j / FM_SLICE))[j % FM_SLICE];
    cl.sync();
    fm_output<B>(A, t, i, in, v, row, blockIdx.x);
}

extern "C" hm_status cuda_fused_norm_quant(const cuda_fused_norm_args *a, void *stream,
                                           hm_error *err) {
    if (!a) return hm_error_set(err, HM_ERR_ARG, "cuda_fused_norm_quant: missing arguments");
    if (a->n < 1 || a->n > CUDA_FUSED_NORM_MAX || a->n_tok < 0 || a->n_tok > 0x7fffffff)
        return hm_error_set(err, HM_ERR_ARG,
                            "cuda_fused_norm_quant: bad shape (%lld rows of %lld, at most %d)",
                            (long long)a->n_tok, (long long)a->n, CUDA_FUSED_NORM_MAX);
    if (a->ey && (a->add || !a->gw || a->n_used < 1 ||
                  (a->ey_bias && ((!a->ids && !a->bias_ids) || a->n_expert < 1))))
        return hm_error_set(err, HM_ERR_ARG,
                            "cuda_fused_norm_quant: combine needs gw, n_used >= 1 and no add "
                            "(a bias needs ids or bias_ids and n_expert >= 1)");
    if (a->sh && (!a->ey || !a->sgate))
        return hm_error_set(err, HM_ERR_ARG,
                            "cuda_fused_norm_quant: a shared expert's term needs ey and sgate");
    norm_k A;
    memset(&A, 0, sizeof(A));
    A.x = a->x;
    A.add = a->add;
    A.ey = a->ey;
    A.gw = a->gw;
    A.ids = a->ids;
    A.bids = a->bias_ids;
    A.n_used = a->n_used;
    A.eb = a->ey ? a->ey_bias : NULL;
    A.n_expert = a->n_expert;
    A.sh = a->ey ? a->sh : NULL;
    A.sg = a->sgate;
    A.w = a->norm_w;
    A.eps = a->eps;
    A.xn = a->xn;
    A.n = a->n;
    int B = 0;
    if (a->xn && a->act) {
        const quant_act at = quant_act_for(a->wtype);
        if (at == QUANT_ACT_COUNT)
            return hm_error_set(err, HM_ERR_UNSUPPORTED,
                                "cuda_fused_norm_quant: unsupported weight type %s",
                                hm_type_name(a->wtype));
        B = at == QUANT_ACT_Q8_32 ? 32 : at == QUANT_ACT_Q8_K ? 256 : 0;
        if (B && a->n % B)
            return hm_error_set(err, HM_ERR_ARG,
                                "cuda_fused_norm_quant: %lld is not a multiple of %s's "
                                "activation block (%d)",
                                (long long)a->n, hm_type_name(a->wtype), B);
        A.act = (uint8_t *)a->act;
        A.act_bytes = quant_act_row_size(at, a->n);
    }
    if (a->n_tok == 0 || (!a->xn && !a->add && !a->ey)) return HM_OK;
    if (!a->x) return hm_error_set(err, HM_ERR_ARG, "cuda_fused_norm_quant: missing x");
    if (!a->d_sync) return hm_error_set(err, HM_ERR_ARG, "cuda_fused_norm_quant: no sync area (d_sync)");
    const size_t smem = (size_t)a->n * sizeof(float);
    const cudaStream_t st = (cudaStream_t)stream;
    const int64_t nb = (a->n + FM_SLICE - 1) / FM_SLICE;
    if (nb <= 16 && a->xn) { /* a row per cluster of nb blocks */
        void (*k)(const norm_k) = B == 32 ? k_fused_norm_cl<32> : B == 256 ? k_fused_norm_cl<256>
                                                                         : k_fused_norm_cl<0>;
        if (nb > 8) cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        for (A.t0 = 0; A.t0 < a->n_tok; A.t0 += 65535) {
            const int64_t rows = a->n_tok - A.t0 < 65535 ? a->n_tok - A.t0 : 65535;
            cu_launch_cluster(k, (unsigned)nb, dim3((unsigned)nb, (unsigned)rows), FM_SLICE, smem,
                              st, A);
            const hm_status r = fused_launched("k_fused_norm_cl", err);
            if (r != HM_OK) return r;
        }
        return HM_OK;
    }
    const int64_t per = FM_MAX_BLOCKS / nb > 0 ? FM_MAX_BLOCKS / nb : 1; /* rows per launch */
    A.sync = a->d_sync;
    for (A.t0 = 0; A.t0 < a->n_tok; A.t0 += per) { /* every block of a launch is resident */
        const int64_t rows = a->n_tok - A.t0 < per ? a->n_tok - A.t0 : per;
        const dim3 g((unsigned)rows, (unsigned)nb);
        if (B == 32) cu_launch(k_fused_norm_mb<32>, g, FM_SLICE, smem, st, A);
        else if (B == 256) cu_launch(k_fused_norm_mb<256>, g, FM_SLICE, smem, st, A);
        else cu_launch(k_fused_norm_mb<0>, g, FM_SLICE, smem, st, A);
        const hm_status r = fused_launched("k_fused_norm_mb", err);
        if (r != HM_OK) return r;
    }
    return HM_OK;
}

/* ------------------------------------------------------------ q/k norm + RoPE + KV store */

typedef struct {
    float *q, *k;
    const float *v;
    int n_head, n_kv, hd, qk_norm;
    const float *q_norm, *k_norm;
    float eps;
    const int32_t *pos;
    uint16_t *kc, *vc;
    int64_t n_ctx;
    cr_consts rc;
} qk_k;

/* grid (n_tok, n_head + n_head_kv) */
__global__ void __launch_bounds__(FQ_THREADS) k_fused_qk(const qk_k A) {
    __shared__ float buf[FQ_MAX_HD];
    static_assert(FQ_MAX_HD <= 2 * FQ_THREADS, "two elements, one rope pair per thread");
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y, hd = A.hd;
    const bool isq = h < A.n_head;
    const int hk = h - A.n_head;
    const float *w = A.qk_norm ? (isq ? A.q_norm : A.k_norm) : NULL;
    float wv[2]; /* the norm weights (never written by a kernel): before the wait */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int i = threadIdx.x + j * FQ_THREADS;
        wv[j] = w && i < hd ? w[i] : 1.0f;
    }
    cu_pdl_enter();
    float *x = isq ? A.q + (t * A.n_head + h) * hd : A.k + (t * A.n_kv + hk) * hd;
    const int32_t p = A.pos[t]; /* loaded with the row, then the rope pair's cos/sin */
    for (int i = threadIdx.x; i < hd; i += FQ_THREADS) buf[i] = x[i];
    const cr_consts &rc = A.rc;
    const bool pair = (int)threadIdx.x < rc.n_pairs; /* n_pairs <= hd / 2 <= FQ_THREADS */
    float c = 0.0f, sn = 0.0f;
    if (pair) cr_cos_sin(rc, p, threadIdx.x, c, sn);
    __syncthreads();
    if (A.qk_norm) {
        const float s = cm_rms_scale_block(buf, hd, A.eps);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int i = threadIdx.x + j * FQ_THREADS;
            if (i >= hd) break;
            const float v = __fmul_rn(buf[i], s);
            buf[i] = w ? __fmul_rn(v, wv[j]) : v;
        }
        __syncthreads();
    }
    if (pair) cr_apply(rc, threadIdx.x, c, sn, buf);
    __syncthreads();
    const bool store = !isq && p >= 0 && (int64_t)p < A.n_ctx;
    const int64_t row = (int64_t)A.n_kv * hd;
    const size_t off = (size_t)p * row + (size_t)hk * hd;
    const float *vr = A.v + (t * A.n_kv + hk) * hd;
    for (int i = threadIdx.x; i < hd; i += FQ_THREADS) {
        x[i] = buf[i];
        if (store) {
            A.kc[off + i] = cm_f32_to_f16(buf[i]);
            A.vc[off + i] = cm_f32_to_f16(vr[i]);
        }
    }
}

extern "C" hm_status cuda_fused_qk_rope_store(const cuda_fused_qk_args *a, void *stream,
                                              hm_error *err) {
    if (!a) return hm_error_set(err, HM_ERR_ARG, "cuda_fused_qk_rope_store: missing arguments");
    if (a->n_head < 1 || a->n_head_kv < 1 || a->head_dim < 2 || a->head_dim > FQ_MAX_HD ||
        a->n_tok < 0 || a->n_tok > 0x7fffffff || a->n_head + a->n_head_kv > 65535 ||
        a->n_ctx <= 0)
        return hm_error_set(err, HM_ERR_ARG,
                            "cuda_fused_qk_rope_store: bad shape (%lld tokens, %d + %d heads of "
                            "%d, n_ctx %lld)",
                            (long long)a->n_tok, a->n_head, a->n_head_kv, a->head_dim,
                            (long long)a->n_ctx);
    qk_k A;
    hm_status st = cr_prepare("cuda_fused_qk_rope_store", &a->rope.p, a->head_dim, &A.rc, err);
    if (st != HM_OK) return st;
    if (a->rope.d_table && a->rope.n_table > 0) {
        A.rc.table = a->rope.d_table;
        A.rc.n_table = a->rope.n_table;
    }
    A.q = a->q;
    A.k = a->k;
    A.v = a->v;
    A.n_head = a->n_head;
    A.n_kv = a->n_head_kv;
    A.hd = a->head_dim;
    A.qk_norm = a->qk_norm;
    A.q_norm = a->q_norm;
    A.k_norm = a->k_norm;
    A.eps = a->eps;
    A.pos = a->d_pos;
    A.kc = a->k_cache;
    A.vc = a->v_cache;
    A.n_ctx = a->n_ctx;
    if (a->n_tok == 0) return HM_OK;
    if (!a->q || !a->k || !a->v || !a->d_pos || !a->k_cache || !a->v_cache)
        return hm_error_set(err, HM_ERR_ARG, "cuda_fused_qk_rope_store: missing buffers");
    const dim3 grid((unsigned)a->n_tok, (unsigned)(a->n_head + a->n_head_kv));
    cu_launch(k_fused_qk, grid, FQ_THREADS, 0, (cudaStream_t)stream, A);
    return fused_launched("k_fused_qk", err);
}
