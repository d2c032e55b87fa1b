/* cuda_delta.cu - the gated delta net on the GPU (cuda_delta.h; design there). */
#include <cuda_runtime.h>

extern "C" {
#include "cuda/cuda_delta.h"
}
#include "cuda/cuda_check.cuh"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_math.cuh"

namespace {

constexpr int CONV_THREADS = 128, MAX_K = 8;

/* A thread per channel c of run blockIdx.y: y = silu(sum_j<K-1 w[c][j] tap_j + w[c][K-1] x),
 * token after token, the taps (oldest first) in registers and stored back at the end
 * (cpu_conv1d_causal + cpu_silu). */
__global__ void k_delta_conv(cuda_delta_args a, int64_t cd) {
    cu_pdl_enter();
    const int64_t c = (int64_t)blockIdx.x * CONV_THREADS + threadIdx.x;
    const cuda_delta_run r = a.d_runs[blockIdx.y];
    if (c >= cd || r.len <= 0) return;
    const int K = a.conv_k;
    float *st = a.state + (int64_t)r.seq * a.state_stride;
    const float *w = a.conv_w + c * K;
    float tap[MAX_K];
#pragma unroll
    for (int j = 0; j < MAX_K - 1; j++) tap[j] = j < K - 1 ? st[(int64_t)j * cd + c] : 0.0f;
    for (int t = r.t0; t < r.t0 + r.len; t++) {
        float *xy = a.qkv + (int64_t)t * cd + c;
        const float x = *xy;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < MAX_K - 1; j++)
            if (j < K - 1) acc = __fadd_rn(acc, __fmul_rn(w[j], tap[j]));
        acc = __fadd_rn(acc, __fmul_rn(w[K - 1], x));
        *xy = cm_siluf(acc);
#pragma unroll
        for (int j = 0; j < MAX_K - 1; j++) /* drop the oldest tap, append x */
            if (j < K - 2) tap[j] = tap[j + 1];
            else if (j == K - 2) tap[j] = x;
    }
#pragma unroll
    for (int j = 0; j < MAX_K - 1; j++)
        if (j < K - 1) st[(int64_t)j * cd + c] = tap[j];
}

/* A warp per (token, head) of the 2 nk q and k heads: x /= max(|x|, eps) (the sum of squares in
 * index order, as cpu_l2_norm, by every lane from shuffled squares), then q times qscale
 * (cpu_scale). */
__global__ void k_delta_l2(cuda_delta_args a, int64_t cd, float qscale) {
    cu_pdl_enter();
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31, nh = 2 * a.nk;
    if (w >= a.n_tok * nh) return;
    const int64_t t = w / nh, h = w % nh;
    float *x = a.qkv + t * cd + h * a.dk;
    float ss = 0.0f; /* every lane adds the squares in index order, 32 loads at a time */
    for (int base = 0; base < a.dk; base += 32) {
        const float v = base + lane < a.dk ? x[base + lane] : 0.0f, v2 = __fmul_rn(v, v);
#pragma unroll
        for (int src = 0; src < 32; src++) {
            const float q = __shfl_sync(0xffffffffu, v2, src);
            if (base + src < a.dk) ss = __fadd_rn(ss, q);
        }
    }
    const float e2 = __fmul_rn(a.eps, a.eps);
    const float s = __fdiv_rn(1.0f, __fsqrt_rn(ss > e2 ? ss : e2));
    for (int i = lane; i < a.dk; i += 32) {
        const float v = __fmul_rn(x[i], s);
        x[i] = h < a.nk ? __fmul_rn(v, qscale) : v;
    }
}

/* softplus as the CPU computes it (x above 20, else log(1 + e^x) in double) */
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : (float)log1p(exp((double)x)); }

/* Value head blockIdx.x of run blockIdx.y, thread j = column j of the state S [dk][dv]: per
 * token cpu_delta_rule (S *= exp(g); kv = S^T k; d = (v - kv) beta; S += k d^T; o = S^T q),
 * then o = (o * rms_scale(o)) * norm_w, times silu(z). */
template <int DK>
__global__ void __launch_bounds__(256) k_delta_heads(cuda_delta_args a, int64_t cd) {
    cu_pdl_enter();
    __shared__ float s_q[DK], s_k[DK];
    extern __shared__ float s_o[]; /* [dv] */
    const int h = blockIdx.x, j = threadIdx.x, dv = a.dv, r = a.nv / a.nk;
    const bool mine = j < dv; /* the block is whole warps; threads past dv only take part */
    const cuda_delta_run run = a.d_runs[blockIdx.y];
    if (run.len <= 0) return; /* uniform over the block */
    const int g = a.v_tiled ? h % a.nk : h / r; /* the key head */
    float *S = a.state + (int64_t)run.seq * a.state_stride + (int64_t)(a.conv_k - 1) * cd +
               (int64_t)h * DK * dv;
    float col[DK];
#pragma unroll
    for (int i = 0; i < DK; i++) col[i] = mine ? S[(int64_t)i * dv + j] : 0.0f;
    const float dth = a.dt[h], Ah = a.a[h], nw = mine ? a.norm_w[j] : 0.0f;
    for (int t = run.t0; t < run.t0 + run.len; t++) {
        const float *y = a.qkv + (int64_t)t * cd;
        for (int i = j; i < DK; i += blockDim.x) {
            s_q[i] = y[g * DK + i];
            s_k[i] = y[a.nk * DK + g * DK + i];
        }
        const float *bp = a.ab_split ? a.ba + (int64_t)t * a.nv + h
                                     : a.ba + (int64_t)t * 2 * a.nv + g * 2 * r + h % r;
        const float *ap = a.ab_split ? bp + a.n_tok * a.nv : bp + r;
        const float beta = cm_sigmoidf(*bp);
        const float decay = cm_expf(__fmul_rn(softplus(__fadd_rn(*ap, dth)), Ah));
        const float v = mine ? y[2 * a.nk * DK + h * dv + j] : 0.0f;
        __syncthreads();
        float kv = 0.0f;
#pragma unroll
        for (int i = 0; i < DK; i++) {
            col[i] = __fmul_rn(col[i], decay);
            kv = __fadd_rn(kv, __fmul_rn(col[i], s_k[i]));
        }
        const float d = __fmul_rn(__fsub_rn(v, kv), beta);
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < DK; i++) {
            col[i] = __fadd_rn(col[i], __fmul_rn(s_k[i], d));
            o = __fadd_rn(o, __fmul_rn(col[i], s_q[i]));
        }
        if (mine) s_o[j] = o;
        __syncthreads();
        const float sc = cm_rms_scale_block(s_o, dv, a.eps);
        if (mine) {
            const float zj = a.z[(int64_t)t * a.nv * dv + (int64_t)h * dv + j];
            a.out[(int64_t)t * a.nv * dv + (int64_t)h * dv + j] =
                __fmul_rn(__fmul_rn(__fmul_rn(o, sc), nw), cm_siluf(zj));
        }
        __syncthreads(); /* s_q, s_k, s_o and the scale are read before the next token's */
    }
    if (mine)
#pragma unroll
        for (int i = 0; i < DK; i++) S[(int64_t)i * dv + j] = col[i];
}

} // namespace

extern "C" hm_status cuda_delta_net(const cuda_delta_args *a, void *stream, hm_error *err) {
    if (!a) return hm_error_set(err, HM_ERR_ARG, "cuda_delta_net: missing arguments");
    const bool dk_ok = a->dk == 16 || a->dk == 32 || a->dk == 64 || a->dk == 128 || a->dk == 256;
    if (a->nk <= 0 || a->nv <= 0 || a->nv % a->nk || !dk_ok || a->dv <= 0 || a->dv > 256 || a->conv_k < 2 || a->conv_k > MAX_K || a->n_tok < 0 || a->n_runs < 0 ||
        a->n_runs > 65535 || a->state_stride <= 0)
        return hm_error_set(err, HM_ERR_ARG, "cuda_delta_net: unsupported shape (%d/%d heads of "
                            "%d/%d, K %d, %d runs)", a->nk, a->nv, a->dk, a->dv, a->conv_k,
                            a->n_runs);
    if (a->n_tok == 0 || a->n_runs == 0) return HM_OK;
    if (!a->d_runs || !a->conv_w || !a->dt || !a->a || !a->norm_w || !a->state || !a->qkv ||
        !a->z || !a->ba || !a->out)
        return hm_error_set(err, HM_ERR_ARG, "cuda_delta_net: missing buffers");
    const cudaStream_t s = (cudaStream_t)stream;
    const int64_t cd = 2 * (int64_t)a->nk * a->dk + (int64_t)a->nv * a->dv;
    const cuda_delta_args A = *a;
    cu_launch(k_delta_conv, dim3((unsigned)((cd + CONV_THREADS - 1) / CONV_THREADS), (unsigned)a->n_runs),
              CONV_THREADS, 0, s, A, cd);
    hm_status st = cu_launched("k_delta_conv", err);
    if (st != HM_OK) return st;
    const int64_t warps = a->n_tok * 2 * a->nk;
    cu_launch(k_delta_l2, (unsigned)((warps * 32 + 255) / 256), 256, 0, s, A, cd,
              1.0f / sqrtf((float)a->dk)); /* the CPU's qscale */
    if ((st = cu_launched("k_delta_l2", err)) != HM_OK) return st;
    const dim3 grid((unsigned)a->nv, (unsigned)a->n_runs);
    const size_t smem = sizeof(float) * (size_t)a->dv;
    const int threads = (a->dv + 31) / 32 * 32;
    switch (a->dk) {
    case 16: cu_launch(k_delta_heads<16>, grid, threads, smem, s, A, cd); break;
    case 32: cu_launch(k_delta_heads<32>, grid, threads, smem, s, A, cd); break;
    case 64: cu_launch(k_delta_heads<64>, grid, threads, smem, s, A, cd); break;
    case 128: cu_launch(k_delta_heads<128>, grid, threads, smem, s, A, cd); break;
    default: cu_launch(k_delta_heads<256>, grid, threads, smem, s, A, cd); break;
    }
    return cu_launched("k_delta_heads", err);
}
