/* cuda_delta.cu - the gated delta net on the GPU (cuda_delta.h; design there). */
#include <cuda_runtime.h>

extern "C" {
#include "cuda/cuda_delta.h"
}
#include "cuda/cuda_check.cuh"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_math.cuh"

namespace {

constexpr int CONV_THREADS = 128, MAX_K = 8, CONV_AHEAD = 8;

/* A thread per channel c of run blockIdx.y: y = silu(sum_j<K-1 w[c][j] tap_j + w[c][K-1] x),
 * token after token, the taps (oldest first) in registers and stored back at the end
 * (cpu_conv1d_causal + cpu_silu). A prompt's inputs are loaded CONV_AHEAD tokens at a time
 * before their outputs overwrite them, so the loads overlap instead of waiting one by one. */
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
    const int end = r.t0 + r.len;
    for (int t0 = r.t0; t0 < end; t0 += CONV_AHEAD) {
        float xs[CONV_AHEAD];
#pragma unroll
        for (int u = 0; u < CONV_AHEAD; u++)
            xs[u] = t0 + u < end ? a.qkv[(int64_t)(t0 + u) * cd + c] : 0.0f;
#pragma unroll
        for (int u = 0; u < CONV_AHEAD; u++) {
            if (t0 + u >= end) break;
            const float x = xs[u];
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < MAX_K - 1; j++)
                if (j < K - 1) acc = __fadd_rn(acc, __fmul_rn(w[j], tap[j]));
            acc = __fadd_rn(acc, __fmul_rn(w[K - 1], x));
            a.qkv[(int64_t)(t0 + u) * cd + c] = cm_siluf(acc);
#pragma unroll
            for (int j = 0; j < MAX_K - 1; j++) /* drop the oldest tap, append x */
                if (j < K - 2) tap[j] = tap[j + 1];
                else if (j == K - 2) tap[j] = x;
        }
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
__global__ void __launch_bounds__(256) k_delta_heads(cuda_delta_args a, int64_t cd, int chunk_min) {
    cu_pdl_enter();
    __shared__ float s_q[DK], s_k[DK];
    extern __shared__ float s_o[]; /* [dv] */
    const int h = blockIdx.x, j = threadIdx.x, dv = a.dv, r = a.nv / a.nk;
    const bool mine = j < dv; /* the block is whole warps; threads past dv only take part */
    const cuda_delta_run run = a.d_runs[blockIdx.y];
    if (run.len <= 0 || run.len >= chunk_min) return; /* uniform over the block */
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

/* ---- the chunked form: runs of at least CUDA_DELTA_CHUNK_MIN tokens (cuda_delta.h) ----
 * Per chunk of C tokens of a head, with gamma_i the decay from the chunk's start through token
 * i (lc_i = log gamma_i, the sum of the tokens' softplus(a + dt) * A) and the state S0 at its
 * start (the recurrence S_i = g_i S_{i-1} + k_i u_i^T, u_i = beta_i (v_i - g_i S_{i-1}^T k_i)):
 *   A_ij = gamma_i / gamma_j k_i.k_j (j < i), B_ij = gamma_i / gamma_j q_i.k_j (j <= i);
 *   (I + diag(beta) A) [XK | XV] = diag(beta) [diag(gamma) K | V]   (forward substitution);
 *   U = XV - XK S0;  O = diag(gamma) Q S0 + B U;  S = gamma_C S0 + K^T diag(gamma_C / gamma) U.
 * A block takes CH_CW columns of one head's state (in shared memory) through the run's chunks;
 * A, B and XK, which every column needs, are computed by each block. The outputs are raw o;
 * k_delta_gnorm applies the gated norm after. */

constexpr int CH_THREADS = 256, CH_WARPS = CH_THREADS / 32, CH_CW = 32;

/* shared floats of k_delta_chunked<DK, C>: K, Q, XK [C][DK+1], A, B [C][C+1], S [DK][CW+1],
 * XV, U [C][CW+1], lc, beta, w [C] */
static constexpr size_t ch_smem_floats(int dk, int c) {
    return 3 * (size_t)c * (dk + 1) + 2 * (size_t)c * (c + 1) + (size_t)dk * (CH_CW + 1) +
           2 * (size_t)c * (CH_CW + 1) + 3 * (size_t)c;
}

template <int DK, int C>
__global__ void __launch_bounds__(CH_THREADS) k_delta_chunked(cuda_delta_args a, int64_t cd) {
    cu_pdl_enter();
    constexpr int KP = DK + 1, CP = C + 1, WP = CH_CW + 1;
    extern __shared__ float ch_smem[];
    float *Ks = ch_smem, *Qs = Ks + C * KP, *XK = Qs + C * KP, *Am = XK + C * KP;
    float *Bm = Am + C * CP, *Ss = Bm + C * CP, *XV = Ss + DK * WP, *Us = XV + C * WP;
    float *lc = Us + C * WP, *bt = lc + C, *wn = bt + C;
    const int h = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const cuda_delta_run run = a.d_runs[blockIdx.y];
    if (run.len < CUDA_DELTA_CHUNK_MIN) return; /* uniform over the block: k_delta_heads' run */
    const int dv = a.dv, r = a.nv / a.nk, g = a.v_tiled ? h % a.nk : h / r;
    const int c = (int)blockIdx.z * CH_CW + lane; /* this lane's state column */
    const bool col_ok = c < dv;
    float *S = a.state + (int64_t)run.seq * a.state_stride + (int64_t)(a.conv_k - 1) * cd +
               (int64_t)h * DK * dv;
    for (int x = warp; x < DK; x += CH_WARPS) Ss[x * WP + lane] = col_ok ? S[(int64_t)x * dv + c] : 0.0f;
    const float dth = a.dt[h], Ah = a.a[h];
    for (int c0 = 0; c0 < run.len; c0 += C) {
        const int n = run.len - c0 < C ? run.len - c0 : C;
        const int64_t t0 = run.t0 + c0;
        for (int e = tid; e < n * DK; e += CH_THREADS) { /* the chunk's q and k rows */
            const int i = e / DK, x = e % DK;
            const float *y = a.qkv + (t0 + i) * cd;
            Qs[i * KP + x] = y[g * DK + x];
            Ks[i * KP + x] = y[a.nk * DK + g * DK + x];
        }
        for (int e = tid; e < n * CH_CW; e += CH_THREADS) { /* v's columns, XV's right side */
            const int i = e / CH_CW, l = e % CH_CW, cc = (int)blockIdx.z * CH_CW + l;
            XV[i * WP + l] = cc < dv ? a.qkv[(t0 + i) * cd + 2 * a.nk * DK + (int64_t)h * dv + cc] : 0.0f;
        }
        if (tid < n) {
            const int64_t t = t0 + tid;
            const float *bp = a.ab_split ? a.ba + t * a.nv + h : a.ba + t * 2 * a.nv + g * 2 * r + h % r;
            const float *ap = a.ab_split ? bp + a.n_tok * a.nv : bp + r;
            bt[tid] = cm_sigmoidf(*bp);
            lc[tid] = __fmul_rn(softplus(__fadd_rn(*ap, dth)), Ah);
        }
        __syncthreads();
        if (tid == 0)
            for (int i = 1; i < n; i++) lc[i] = __fadd_rn(lc[i - 1], lc[i]);
        __syncthreads();
        if (tid < n) wn[tid] = cm_expf(__fsub_rn(lc[n - 1], lc[tid]));
        for (int e = tid; e < n * n; e += CH_THREADS) { /* A and B */
            const int i = e / n, j = e % n;
            float kk = 0.0f, qk = 0.0f;
            if (j <= i) {
                for (int x = 0; x < DK; x++) {
                    const float kj = Ks[j * KP + x];
                    kk = __fmaf_rn(Ks[i * KP + x], kj, kk);
                    qk = __fmaf_rn(Qs[i * KP + x], kj, qk);
                }
                const float f = cm_expf(__fsub_rn(lc[i], lc[j]));
                kk = __fmul_rn(kk, f);
                qk = __fmul_rn(qk, f);
            }
            Am[i * CP + j] = j < i ? kk : 0.0f;
            Bm[i * CP + j] = qk;
        }
        __syncthreads();
        for (int col = tid; col < DK + CH_CW; col += CH_THREADS) { /* XK and XV, a column each */
            const bool kc = col < DK;
            float *X = kc ? XK + col : XV + (col - DK);
            const int ld = kc ? KP : WP;
            for (int i = 0; i < n; i++) {
                float v = kc ? __fmul_rn(cm_expf(lc[i]), Ks[i * KP + col]) : X[i * ld];
                for (int j = 0; j < i; j++) v = __fmaf_rn(-Am[i * CP + j], X[j * ld], v);
                X[i * ld] = __fmul_rn(bt[i], v);
            }
        }
        __syncthreads();
        for (int i = warp; i < n; i += CH_WARPS) { /* U = XV - XK S0 */
            float u = XV[i * WP + lane];
            for (int x = 0; x < DK; x++) u = __fmaf_rn(-XK[i * KP + x], Ss[x * WP + lane], u);
            Us[i * WP + lane] = u;
        }
        __syncthreads();
        for (int i = warp; i < n; i += CH_WARPS) { /* O = diag(gamma) Q S0 + B U, raw */
            float qs = 0.0f;
            for (int x = 0; x < DK; x++) qs = __fmaf_rn(Qs[i * KP + x], Ss[x * WP + lane], qs);
            float o = __fmul_rn(cm_expf(lc[i]), qs);
            for (int j = 0; j <= i; j++) o = __fmaf_rn(Bm[i * CP + j], Us[j * WP + lane], o);
            if (col_ok) a.out[(t0 + i) * a.nv * dv + (int64_t)h * dv + c] = o;
        }
        __syncthreads();
        const float gn = cm_expf(lc[n - 1]);
        for (int x = warp; x < DK; x += CH_WARPS) { /* S = gamma_C S0 + K^T diag(w) U */
            float sv = __fmul_rn(gn, Ss[x * WP + lane]);
            for (int j = 0; j < n; j++) sv = __fmaf_rn(__fmul_rn(Ks[j * KP + x], wn[j]), Us[j * WP + lane], sv);
            Ss[x * WP + lane] = sv;
        }
        __syncthreads(); /* before the next chunk's rows overwrite K, Q, XV and lc */
    }
    if (col_ok)
        for (int x = warp; x < DK; x += CH_WARPS) S[(int64_t)x * dv + c] = Ss[x * WP + lane];
}

/* The chunked runs' gated norm, a warp per token and value head: o = (o * rms_scale(o)) *
 * norm_w * silu(z), k_delta_heads' arithmetic on the raw o. */
__global__ void k_delta_gnorm(cuda_delta_args a) {
    cu_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, h = blockIdx.y;
    const cuda_delta_run run = a.d_runs[blockIdx.z];
    const int i = (int)blockIdx.x * (int)(blockDim.x >> 5) + warp;
    if (run.len < CUDA_DELTA_CHUNK_MIN || i >= run.len) return; /* uniform over the warp */
    const int64_t t = run.t0 + i, dv = a.dv, row = t * a.nv * dv + (int64_t)h * dv;
    float *o = a.out + row;
    const float sc = __shfl_sync(0xffffffffu, cm_rms_scale(o, dv, a.eps), 0);
    for (int64_t j = lane; j < dv; j += 32)
        o[j] = __fmul_rn(__fmul_rn(__fmul_rn(o[j], sc), a.norm_w[j]), cm_siluf(a.z[row + j]));
}

template <int DK, int C>
static bool ch_launch(const cuda_delta_args &A, int64_t cd, cudaStream_t s) {
    const size_t smem = ch_smem_floats(DK, C) * sizeof(float);
    if (cudaFuncSetAttribute(k_delta_chunked<DK, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess)
        return false;
    const dim3 grid((unsigned)A.nv, (unsigned)A.n_runs, (unsigned)((A.dv + CH_CW - 1) / CH_CW));
    cu_launch(k_delta_chunked<DK, C>, grid, CH_THREADS, smem, s, A, cd);
    return true;
}

/* The chunk length for head size dk on this device: 64 tokens where the shared memory allows,
 * else 32, else 0 (no chunked form: every run token by token). */
static int ch_len(int dk) {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (ch_smem_floats(dk, 64) * sizeof(float) <= (size_t)optin) return 64;
    return ch_smem_floats(dk, 32) * sizeof(float) <= (size_t)optin ? 32 : 0;
}

static bool ch_run(const cuda_delta_args &A, int64_t cd, int len, cudaStream_t s) {
#define CH_CASE(D)                                                                                 \
    case D: return len == 64 ? ch_launch<D, 64>(A, cd, s) : ch_launch<D, 32>(A, cd, s)
    switch (A.dk) {
    CH_CASE(16); CH_CASE(32); CH_CASE(64); CH_CASE(128); CH_CASE(256);
    default: return false;
    }
#undef CH_CASE
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
    /* runs of CUDA_DELTA_CHUNK_MIN tokens or more take the chunked form where this device's
     * shared memory holds it; k_delta_heads takes the others */
    const int64_t longest = a->max_run > 0 ? a->max_run : a->n_tok;
    const int clen = longest >= CUDA_DELTA_CHUNK_MIN ? ch_len(a->dk) : 0;
    const int chunk_min = clen ? CUDA_DELTA_CHUNK_MIN : 0x7fffffff;
    const dim3 grid((unsigned)a->nv, (unsigned)a->n_runs);
    const size_t smem = sizeof(float) * (size_t)a->dv;
    const int threads = (a->dv + 31) / 32 * 32;
    switch (a->dk) {
    case 16: cu_launch(k_delta_heads<16>, grid, threads, smem, s, A, cd, chunk_min); break;
    case 32: cu_launch(k_delta_heads<32>, grid, threads, smem, s, A, cd, chunk_min); break;
    case 64: cu_launch(k_delta_heads<64>, grid, threads, smem, s, A, cd, chunk_min); break;
    case 128: cu_launch(k_delta_heads<128>, grid, threads, smem, s, A, cd, chunk_min); break;
    default: cu_launch(k_delta_heads<256>, grid, threads, smem, s, A, cd, chunk_min); break;
    }
    if ((st = cu_launched("k_delta_heads", err)) != HM_OK || !clen) return st;
    if (!ch_run(A, cd, clen, s))
        return hm_error_set(err, HM_ERR_CUDA, "k_delta_chunked: %zu bytes of shared memory refused",
                            ch_smem_floats(a->dk, clen) * sizeof(float));
    if ((st = cu_launched("k_delta_chunked", err)) != HM_OK) return st;
    cu_launch(k_delta_gnorm, dim3((unsigned)((a->n_tok + 7) / 8), (unsigned)a->nv, (unsigned)a->n_runs),
              256, 0, s, A);
    return cu_launched("k_delta_gnorm", err);
}
