/* cuda_sample.cu - the device sampler of cuda_sample.h: the chain of docs/SAMPLING.md on the GPU,
 * token for token the choice of sample_token.
 *
 * DESIGN: per pick, depending on the parameters (fixed at init):
 *   penalties on: smp_pen_kernel (grid) copies the logits to work [n] and its last block applies
 *                 the penalties of the device history ring to work (once per distinct token).
 *   greedy:       smp_argmax_kernel (grid): per-block (max, lowest id), the last block to finish
 *                 (atomic ticket) reduces them, writes the token and appends it to the history.
 *   top-k small:  smp_topk_local_kernel (grid): each block bitonic-sorts its chunk of 4096 keys
 *                 (desc_key(l) << 32 | id, ascending = (logit desc, id asc)) in shared memory and
 *                 keeps its first k; smp_topk_final_kernel (one block) sorts the G*k survivors
 *                 and runs the chain on the first k.
 *   otherwise:    smp_keys_kernel writes (desc_key, id) pairs in id order, cub's stable radix sort
 *                 orders them (so equal logits stay in id order), smp_full_final_kernel (one
 *                 block) runs the chain on the sorted list.
 * The chain (smp_chain) is sequential where the CPU is (float sums in candidate order): the
 * block computes 1024 terms at a time in parallel, thread 0 adds them in order.
 *
 * Early stop (why not every candidate is visited): with m the first candidate's value, the
 * terms are e_i = hm_expf(x_i), x_i = l_i - m (top-p) or l_i/T - m/T (draw), non-increasing in
 * candidate order (IEEE subtraction and division are monotone), and e_0 = hm_expf(0) = 1 when m
 * is finite. tests/cuda/test_cuda_sample.c checks, for every float x < SMP_TAIL_X (-18.5), that
 * hm_expf(x) < 2^-26. So once x_i < SMP_TAIL_X, every later term is below 2^-26, and
 *   - a running sum S >= 1 (it starts with e_0 = 1) has half an ulp >= 2^-24 > term: S + term
 *     rounds back to S, so the totals of top-p and of the draw are final at that point;
 *   - top-p's cum starts at c0 = fl(1/total) and only grows; q = fl(e/total) < 2^-26 c0 (1 + 2^-22)
 *     < c0 2^-25 < half an ulp of c0 <= half an ulp of cum: cum is final, no later cut;
 *   - the draw's cum after the live prefix equals total (the same additions) > target =
 *     fl(u total) (u <= 1 - 2^-24), so the pick is inside the live prefix.
 * When m (or m/T) is not finite the sums are NaN: no top-p cut, no cum > target, and the CPU
 * picks its last candidate (index nc - 1), which both sorted lists hold. Min-p keeps the prefix
 * l >= thr, found by scanning until the first failure.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>

#include "cuda/cuda_launch.cuh"

extern "C" {
#include "cuda/cuda_sample.h"
#include "cuda/cuda_math.cuh"
}

#define SMP_TAIL_X CUDA_SAMPLER_TAIL_X
#define SMP_FINAL_THREADS 1024
#define SMP_CHUNK 4096        /* keys per block in the top-k path (32 KB of shared memory) */
#define SMP_MERGE_CAP 8192    /* G * k survivors merged by the final block (64 KB dynamic) */
#define SMP_GRID_THREADS 256
#define SMP_ACCEPT_BATCH 256  /* tokens per accept kernel (kernel argument bytes) */

enum { SMP_PATH_GREEDY, SMP_PATH_TOPK, SMP_PATH_FULL };

/* device state; zeroed = empty history, no draws */
typedef struct {
    unsigned long long step; /* draws so far */
    int32_t head, len;       /* history ring: next write index, tokens held */
    uint32_t ticket_pen;     /* last-block tickets (each kernel resets its own) */
    uint32_t ticket_max;
} smp_state;

typedef struct {
    float temperature, top_p, min_p, logmin; /* logmin = logf(min_p) (host libm) */
    float rp, fp, pp;                        /* repeat, frequency, presence penalties */
    int32_t top_k, n, cap;                   /* cap = penalty_last_n */
    unsigned long long seed;
} smp_params;

struct cuda_sampler {
    smp_params kp;
    int path, pen_on, grid, grid_topk;
    smp_state *d_st;
    int32_t *d_hist;   /* [max(cap, 1)] ring */
    float *d_work;     /* [n] penalised logits (pen_on) */
    float *d_in;       /* [n] host logits of cuda_sampler_sample_host */
    int32_t *d_tok;    /* [1] token of cuda_sampler_sample_host */
    float *d_pre;      /* [n] running sums of the draw (sampling paths) */
    float *d_pval;     /* [grid] per-block max */
    int32_t *d_pid;    /* [grid] per-block argmax */
    int32_t *d_nan;    /* [max(grid, grid_topk)] per-block NaN flags */
    unsigned long long *d_part; /* [grid_topk * top_k] per-block sorted top-k keys */
    uint32_t *d_kin, *d_kout;   /* [n] radix keys (full path) */
    int32_t *d_iin, *d_iout;    /* [n] ids (full path) */
    char *d_cub;                /* [cub_bytes] radix sort scratch */
    size_t cub_bytes;
};

static hm_status smp_cuda_err(hm_error *err, const char *what, cudaError_t e) {
    return hm_error_set(err, HM_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

static hm_status smp_launched(hm_error *err, const char *kernel) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? HM_OK : smp_cuda_err(err, kernel, e);
}

/* ---- device helpers ---- */

/* ascending unsigned order = (logit desc); -0 counts as +0 (sample.c desc_key) */
static __device__ __forceinline__ uint32_t smp_desc_key(float l) {
    uint32_t u = __float_as_uint(__fadd_rn(l, 0.0f));
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

/* a before b in (logit desc, id asc) */
static __device__ __forceinline__ bool smp_before(float la, int32_t a, float lb, int32_t b) {
    return la > lb || (la == lb && a < b);
}

static __device__ __forceinline__ float smp_uniform(unsigned long long seed, unsigned long long step) {
    unsigned long long z = seed + (step + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z = z ^ (z >> 31);
    return __fmul_rn((float)(uint32_t)(z >> 40), 0x1.0p-24f);
}

static __device__ void smp_hist_push(int32_t *hist, smp_state *st, int32_t cap, int32_t tok) {
    if (cap <= 0) return;
    hist[st->head] = tok;
    st->head = (st->head + 1) % cap;
    if (st->len < cap) st->len++;
}

/* Block-wide last-block election: every block calls it after its global writes. */
static __device__ bool smp_last_block(uint32_t *ticket) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    return last;
}

/* Bitonic sort of s[0..npow2) ascending (npow2 a power of two), whole block. */
static __device__ void smp_bitonic(unsigned long long *s, int npow2) {
    for (int k = 2; k <= npow2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < npow2; i += blockDim.x) {
                int ixj = i ^ j;
                if (ixj > i) {
                    unsigned long long a = s[i], b = s[ixj];
                    bool up = (i & k) == 0;
                    if ((a > b) == up) {
                        s[i] = b;
                        s[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}

/* ---- kernels ---- */

/* work = logits; then the last block applies the penalties (sample.c apply_penalties). */
static __global__ void smp_pen_kernel(const float *logits, float *work, const int32_t *hist,
                                      smp_state *st, smp_params p) {
    cu_pdl_enter();
    for (int32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < p.n; t += gridDim.x * blockDim.x)
        work[t] = logits[t];
    if (!smp_last_block(&st->ticket_pen)) return;
    const int32_t len = st->len;
    for (int32_t j = threadIdx.x; j < len; j += blockDim.x) {
        const int32_t t = hist[j];
        bool first = true;
        for (int32_t i = 0; i < j && first; i++) first = hist[i] != t;
        if (!first) continue;
        int32_t c = 0;
        for (int32_t i = 0; i < len; i++) c += hist[i] == t;
        float v = __ldcg(work + t);
        v = v <= 0.0f ? __fmul_rn(v, p.rp) : __fdiv_rn(v, p.rp);
        v = __fsub_rn(v, __fadd_rn(__fmul_rn((float)c, p.fp), p.pp));
        work[t] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) st->ticket_pen = 0;
}

/* greedy: first maximum; NaN anywhere -> token -1 */
static __global__ void smp_argmax_kernel(const float *l, float *pval, int32_t *pid, int32_t *pnan,
                                         int32_t *hist, smp_state *st, int32_t *d_token,
                                         smp_params p) {
    cu_pdl_enter();
    float bv = -INFINITY;
    int32_t bi = 0x7fffffff;
    int nan = 0;
    for (int32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < p.n; t += gridDim.x * blockDim.x) {
        float v = l[t];
        nan |= v != v;
        if (bi == 0x7fffffff || smp_before(v, t, bv, bi)) {
            bv = v;
            bi = t;
        }
    }
    __shared__ float sv[32];
    __shared__ int32_t si[32], sn[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, bv, o);
        int32_t oi = __shfl_down_sync(0xffffffffu, bi, o);
        nan |= __shfl_down_sync(0xffffffffu, nan, o);
        if (oi != 0x7fffffff && (bi == 0x7fffffff || smp_before(ov, oi, bv, bi))) {
            bv = ov;
            bi = oi;
        }
    }
    const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        sv[w] = bv;
        si[w] = bi;
        sn[w] = nan;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < nw; i++) {
            nan |= sn[i];
            if (si[i] != 0x7fffffff && (bi == 0x7fffffff || smp_before(sv[i], si[i], bv, bi))) {
                bv = sv[i];
                bi = si[i];
            }
        }
        pval[blockIdx.x] = bv;
        pid[blockIdx.x] = bi;
        pnan[blockIdx.x] = nan;
    }
    if (!smp_last_block(&st->ticket_max)) return;
    if (threadIdx.x == 0) {
        bv = __ldcg(pval);
        bi = __ldcg(pid);
        nan = __ldcg(pnan);
        for (int b = 1; b < (int)gridDim.x; b++) {
            float ov = __ldcg(pval + b);
            int32_t oi = __ldcg(pid + b);
            nan |= __ldcg(pnan + b);
            if (oi != 0x7fffffff && (bi == 0x7fffffff || smp_before(ov, oi, bv, bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (nan) {
            *d_token = -1;
        } else {
            *d_token = bi;
            smp_hist_push(hist, st, p.cap, bi);
        }
        st->ticket_max = 0;
    }
}

/* top-k path, stage 1: block b sorts keys of tokens [b*SMP_CHUNK, ...) and keeps the first k */
static __global__ void smp_topk_local_kernel(const float *l, unsigned long long *part,
                                             int32_t *pnan, smp_params p) {
    cu_pdl_enter();
    __shared__ unsigned long long s[SMP_CHUNK];
    __shared__ int nan_any;
    if (threadIdx.x == 0) nan_any = 0;
    __syncthreads();
    const int32_t base = blockIdx.x * SMP_CHUNK;
    int nan = 0;
    for (int i = threadIdx.x; i < SMP_CHUNK; i += blockDim.x) {
        int32_t t = base + i;
        unsigned long long key = ~0ull;
        if (t < p.n) {
            float v = l[t];
            nan |= v != v;
            key = ((unsigned long long)smp_desc_key(v) << 32) | (uint32_t)t;
        }
        s[i] = key;
    }
    if (nan) nan_any = 1;
    __syncthreads();
    smp_bitonic(s, SMP_CHUNK);
    for (int i = threadIdx.x; i < p.top_k; i += blockDim.x)
        part[(size_t)blockIdx.x * p.top_k + i] = i < SMP_CHUNK ? s[i] : ~0ull;
    if (threadIdx.x == 0) pnan[blockIdx.x] = nan_any;
}

/* full path, stage 1: radix keys and ids in id order, NaN flags */
static __global__ void smp_keys_kernel(const float *l, uint32_t *kin, int32_t *iin, int32_t *pnan,
                                       smp_params p) {
    cu_pdl_enter();
    __shared__ int nan_any;
    if (threadIdx.x == 0) nan_any = 0;
    __syncthreads();
    int nan = 0;
    for (int32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < p.n; t += gridDim.x * blockDim.x) {
        float v = l[t];
        nan |= v != v;
        kin[t] = smp_desc_key(v);
        iin[t] = t;
    }
    if (nan) nan_any = 1;
    __syncthreads();
    if (threadIdx.x == 0) pnan[blockIdx.x] = nan_any;
}

/* ---- the chain, one block of SMP_FINAL_THREADS threads ---- */

typedef struct {
    float e[SMP_FINAL_THREADS]; /* terms of the current group of candidates */
    float acc;                  /* thread 0's running value, broadcast */
    int32_t found, done;
} smp_seq;

/* Term of candidate i: mode 0 top-p (x = l - m), mode 1 draw (x = l/T - m'). live = the term
 * is inside the prefix that can still change a sum (x >= SMP_TAIL_X, or NaN). */
static __device__ __forceinline__ float smp_term(float li, float m, float T, int mode, int *live) {
    float x = mode == 0 ? __fsub_rn(li, m) : __fsub_rn(__fdiv_rn(li, T), m);
    *live = !(x < SMP_TAIL_X);
    return cm_expf(x);
}

/* Sum of the terms of candidates [0, nc) in order, over the live prefix only (DESIGN note).
 * pre (optional, [nc]) receives the running sum after each live candidate; *n_live the prefix
 * length. The live flags form a prefix (x is non-increasing in candidate order), so each group
 * of 1024 is counted with __syncthreads_count and thread 0 adds exactly that many terms. */
static __device__ float smp_seq_sum(smp_seq *q, const int32_t *cid, const float *l, int32_t nc,
                                    float m, float T, int mode, float *pre, int32_t *n_live) {
    float res = 0.0f;
    int32_t nl = 0;
    if (threadIdx.x == 0) q->acc = 0.0f;
    for (int32_t g = 0; g < nc; g += SMP_FINAL_THREADS) {
        const int32_t i = g + threadIdx.x;
        int live = 0;
        float e = 0.0f;
        if (i < nc) e = smp_term(l[cid[i]], m, T, mode, &live);
        q->e[threadIdx.x] = e;
        const int cnt = __syncthreads_count(live);
        if (threadIdx.x == 0) {
            float sum = q->acc;
            if (pre) {
                for (int j = 0; j < cnt; j++) {
                    sum = __fadd_rn(sum, q->e[j]);
                    pre[g + j] = sum;
                }
            } else {
#pragma unroll 8
                for (int j = 0; j < cnt; j++) sum = __fadd_rn(sum, q->e[j]);
            }
            q->acc = sum;
        }
        __syncthreads();
        res = q->acc;
        nl = g + cnt;
        __syncthreads();
        if (cnt < SMP_FINAL_THREADS || res != res) break;
    }
    if (n_live) *n_live = nl;
    return res;
}

/* Top-p's cut: first i in [0, nc) where cum = cum + term_i / total reaches top_p; -1 if none
 * (the live prefix ends first: later terms leave cum unchanged). */
static __device__ int32_t smp_topp_cut(smp_seq *q, const int32_t *cid, const float *l, int32_t nc,
                                       float m, float total, float top_p) {
    int32_t res = -1;
    if (threadIdx.x == 0) {
        q->acc = 0.0f;
        q->found = -1;
    }
    for (int32_t g = 0; g < nc; g += SMP_FINAL_THREADS) {
        const int32_t i = g + threadIdx.x;
        int live = 0;
        float e = 0.0f;
        if (i < nc) e = __fdiv_rn(smp_term(l[cid[i]], m, 1.0f, 0, &live), total);
        q->e[threadIdx.x] = e;
        const int cnt = __syncthreads_count(live);
        if (threadIdx.x == 0) {
            float cum = q->acc;
            for (int j = 0; j < cnt; j++) {
                cum = __fadd_rn(cum, q->e[j]);
                if (cum >= top_p) {
                    q->found = g + j;
                    break;
                }
            }
            q->acc = cum;
        }
        __syncthreads();
        res = q->found;
        const float cum = q->acc;
        __syncthreads();
        if (res >= 0 || cnt < SMP_FINAL_THREADS || cum != cum) break;
    }
    return res;
}

/* First i in [0, n) with pre[i] > target (pre is non-decreasing); -1 if none. */
static __device__ int32_t smp_first_above(const float *pre, int32_t n, float target) {
    __shared__ int32_t first;
    int32_t f = -1;
    if (threadIdx.x == 0) first = 0x7fffffff;
    __syncthreads();
    for (int32_t g = 0; g < n; g += SMP_FINAL_THREADS) {
        const int32_t i = g + threadIdx.x;
        if (i < n && pre[i] > target) atomicMin(&first, i);
        __syncthreads();
        f = first;
        __syncthreads();
        if (f != 0x7fffffff) break;
    }
    return f == 0x7fffffff ? -1 : f;
}

/* Length of the prefix of [0, nc) with l >= thr. */
static __device__ int32_t smp_prefix_ge(const int32_t *cid, const float *l, int32_t nc, float thr) {
    __shared__ int32_t first_fail;
    int32_t f = nc;
    if (threadIdx.x == 0) first_fail = nc;
    __syncthreads();
    for (int32_t g = 0; g < nc; g += SMP_FINAL_THREADS) {
        int32_t i = g + threadIdx.x;
        if (i < nc && !(l[cid[i]] >= thr)) atomicMin(&first_fail, i);
        __syncthreads();
        f = first_fail;
        __syncthreads();
        if (f < nc) break;
    }
    return f;
}

/* sample.c sample_token after the candidates are known: cid[0..nc) in order (ids), l the
 * (penalised) logits, pre [nc] scratch. Writes the token, appends it, advances the counter.
 * The draw's cum runs through the same additions as its total, so the running sums of the
 * total pass (pre) are the cum values: the pick is the first pre[i] > target. */
static __device__ void smp_chain(smp_seq *q, const int32_t *cid, const float *l, int32_t nc,
                                 int nan, float *pre, int32_t *hist, smp_state *st,
                                 int32_t *d_token, const smp_params *p) {
    if (nan) {
        if (threadIdx.x == 0) *d_token = -1;
        return;
    }
    const float m = l[cid[0]];
    if (p->top_p < 1.0f && nc > 1) {
        float total = smp_seq_sum(q, cid, l, nc, m, 1.0f, 0, NULL, NULL);
        int32_t cut = smp_topp_cut(q, cid, l, nc, m, total, p->top_p);
        if (cut >= 0) nc = cut + 1;
    }
    if (p->min_p > 0.0f && nc > 1) {
        int32_t keep = smp_prefix_ge(cid, l, nc, __fadd_rn(m, p->logmin));
        nc = keep > 1 ? keep : 1;
    }
    const float T = p->temperature;
    const float m2 = __fdiv_rn(m, T);
    int32_t n_live = 0;
    const float total = smp_seq_sum(q, cid, l, nc, m2, T, 1, pre, &n_live);
    const float target = __fmul_rn(smp_uniform(p->seed, st->step), total);
    __syncthreads(); /* pre written by thread 0 */
    int32_t pick = smp_first_above(pre, n_live, target);
    if (pick < 0) pick = nc - 1;
    if (threadIdx.x == 0) {
        int32_t tok = cid[pick];
        *d_token = tok;
        smp_hist_push(hist, st, p->cap, tok);
        st->step++;
    }
}

/* top-k path, stage 2: merge the per-block lists, chain on the first k */
static __global__ void smp_topk_final_kernel(const float *l, const unsigned long long *part,
                                             const int32_t *pnan, int32_t *hist, smp_state *st,
                                             int32_t *d_token, float *pre, smp_params p,
                                             int nblk) {
    cu_pdl_enter();
    extern __shared__ unsigned long long s[]; /* [SMP_MERGE_CAP] */
    __shared__ smp_seq q;
    __shared__ int32_t cid[SMP_MERGE_CAP];
    __shared__ int nan_any;
    const int total = nblk * p.top_k;
    int npow2 = 1;
    while (npow2 < total) npow2 <<= 1;
    if (threadIdx.x == 0) nan_any = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < npow2; i += blockDim.x) s[i] = i < total ? part[i] : ~0ull;
    for (int b = threadIdx.x; b < nblk; b += blockDim.x)
        if (pnan[b]) nan_any = 1;
    __syncthreads();
    smp_bitonic(s, npow2);
    for (int i = threadIdx.x; i < p.top_k; i += blockDim.x) cid[i] = (int32_t)(uint32_t)s[i];
    __syncthreads();
    smp_chain(&q, cid, l, p.top_k, nan_any, pre, hist, st, d_token, &p);
}

/* full path, stage 2: chain on the sorted ids */
static __global__ void smp_full_final_kernel(const float *l, const int32_t *ids,
                                             const int32_t *pnan, int nblk, int32_t *hist,
                                             smp_state *st, int32_t *d_token, float *pre,
                                             smp_params p) {
    cu_pdl_enter();
    __shared__ smp_seq q;
    __shared__ int nan_any;
    if (threadIdx.x == 0) nan_any = 0;
    __syncthreads();
    for (int b = threadIdx.x; b < nblk; b += blockDim.x)
        if (pnan[b]) nan_any = 1;
    __syncthreads();
    const int32_t nc = p.top_k > 0 && p.top_k < p.n ? p.top_k : p.n;
    smp_chain(&q, ids, l, nc, nan_any, pre, hist, st, d_token, &p);
}

typedef struct {
    int32_t tok[SMP_ACCEPT_BATCH];
    int32_t n;
} smp_accept_args;

static __global__ void smp_accept_kernel(int32_t *hist, smp_state *st, smp_accept_args a,
                                         int32_t cap) {
    cu_pdl_enter();
    for (int i = 0; i < a.n; i++) smp_hist_push(hist, st, cap, a.tok[i]);
}

static __global__ void smp_set_draws_kernel(smp_state *st, unsigned long long v) {
    cu_pdl_enter(); st->step = v; }

/* ---- host API ---- */

extern "C" void cuda_sampler_free(cuda_sampler *s) {
    if (!s) return;
    cudaFree(s->d_st);
    cudaFree(s->d_hist);
    cudaFree(s->d_work);
    cudaFree(s->d_in);
    cudaFree(s->d_tok);
    cudaFree(s->d_pre);
    cudaFree(s->d_pval);
    cudaFree(s->d_pid);
    cudaFree(s->d_nan);
    cudaFree(s->d_part);
    cudaFree(s->d_kin);
    cudaFree(s->d_kout);
    cudaFree(s->d_iin);
    cudaFree(s->d_iout);
    cudaFree(s->d_cub);
    free(s);
}


#define SMP_ALLOC(ptr, count)                                                                \
    do {                                                                                     \
        cudaError_t e_ = cudaMalloc((void **)&(ptr), (size_t)(count) * sizeof(*(ptr)));     \
        if (e_ != cudaSuccess) {                                                             \
            cudaGetLastError();                                                              \
            cuda_sampler_free(s);                                                            \
            return smp_cuda_err(err, "device sampler: cudaMalloc", e_);                      \
        }                                                                                    \
    } while (0)

extern "C" hm_status cuda_sampler_init(const sample_params *p, int32_t n_vocab, void *stream,
                                       cuda_sampler **out, hm_error *err) {
    *out = NULL;
    hm_status st = sample_params_check(p, n_vocab, err);
    if (st != HM_OK) return st;
    cuda_sampler *s = (cuda_sampler *)calloc(1, sizeof(*s));
    if (!s) return hm_error_set(err, HM_ERR_NOMEM, "device sampler: out of memory");
    smp_params *kp = &s->kp;
    kp->temperature = p->temperature;
    kp->top_p = p->top_p;
    kp->min_p = p->min_p;
    kp->logmin = p->min_p > 0.0f ? logf(p->min_p) : 0.0f;
    kp->rp = p->repeat_penalty;
    kp->fp = p->frequency_penalty;
    kp->pp = p->presence_penalty;
    kp->top_k = p->top_k;
    kp->n = n_vocab;
    kp->cap = p->penalty_last_n;
    kp->seed = p->seed;
    s->pen_on = p->penalty_last_n > 0 && !(p->repeat_penalty == 1.0f &&
                                           p->frequency_penalty == 0.0f &&
                                           p->presence_penalty == 0.0f);
    int sms = 0, dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        free(s);
        return smp_cuda_err(err, "device sampler: no usable CUDA device", e);
    }
    int64_t want = ((int64_t)n_vocab + SMP_GRID_THREADS * 8 - 1) / (SMP_GRID_THREADS * 8);
    s->grid = (int)(want < 4 * sms ? want : 4 * sms);
    if (s->grid < 1) s->grid = 1;
    s->grid_topk = (int)(((int64_t)n_vocab + SMP_CHUNK - 1) / SMP_CHUNK);
    if (p->temperature <= 0.0f) s->path = SMP_PATH_GREEDY;
    else if (p->top_k > 0 && p->top_k < n_vocab &&
             (int64_t)s->grid_topk * p->top_k <= SMP_MERGE_CAP)
        s->path = SMP_PATH_TOPK;
    else s->path = SMP_PATH_FULL;

    const size_t n = (size_t)n_vocab;
    SMP_ALLOC(s->d_st, 1);
    SMP_ALLOC(s->d_hist, p->penalty_last_n > 0 ? p->penalty_last_n : 1);
    if (s->pen_on) SMP_ALLOC(s->d_work, n);
    SMP_ALLOC(s->d_in, n);
    SMP_ALLOC(s->d_tok, 1);
    if (s->path != SMP_PATH_GREEDY) SMP_ALLOC(s->d_pre, n);
    SMP_ALLOC(s->d_pval, s->grid);
    SMP_ALLOC(s->d_pid, s->grid);
    SMP_ALLOC(s->d_nan, s->grid > s->grid_topk ? s->grid : s->grid_topk);
    if (s->path == SMP_PATH_TOPK) {
        SMP_ALLOC(s->d_part, (size_t)s->grid_topk * p->top_k);
        e = cudaFuncSetAttribute(smp_topk_final_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 SMP_MERGE_CAP * (int)sizeof(unsigned long long));
        if (e != cudaSuccess) {
            cuda_sampler_free(s);
            return smp_cuda_err(err, "device sampler: shared memory for the top-k merge", e);
        }
    }
    if (s->path == SMP_PATH_FULL) {
        SMP_ALLOC(s->d_kin, n);
        SMP_ALLOC(s->d_kout, n);
        SMP_ALLOC(s->d_iin, n);
        SMP_ALLOC(s->d_iout, n);
        e = cub::DeviceRadixSort::SortPairs(NULL, s->cub_bytes, s->d_kin, s->d_kout, s->d_iin,
                                            s->d_iout, n_vocab, 0, 32, (cudaStream_t)stream);
        if (e != cudaSuccess) {
            cuda_sampler_free(s);
            return smp_cuda_err(err, "device sampler: radix sort size", e);
        }
        SMP_ALLOC(s->d_cub, s->cub_bytes > 0 ? s->cub_bytes : 1);
    }
    st = cuda_sampler_reset(s, stream, err);
    if (st != HM_OK) {
        cuda_sampler_free(s);
        return st;
    }
    *out = s;
    return HM_OK;
}

extern "C" hm_status cuda_sampler_reset(cuda_sampler *s, void *stream, hm_error *err) {
    cudaError_t e = cudaMemsetAsync(s->d_st, 0, sizeof(smp_state), (cudaStream_t)stream);
    return e == cudaSuccess ? HM_OK : smp_cuda_err(err, "device sampler: reset", e);
}

extern "C" hm_status cuda_sampler_accept_host(cuda_sampler *s, const int32_t *tokens, int n,
                                              void *stream, hm_error *err) {
    const int32_t cap = s->kp.cap;
    if (cap <= 0 || n <= 0) return HM_OK;
    /* only the last cap valid tokens can stay in the ring */
    int first = n, kept = 0;
    while (first > 0 && kept < cap) {
        first--;
        if (tokens[first] >= 0 && tokens[first] < s->kp.n) kept++;
    }
    smp_accept_args a;
    a.n = 0;
    for (int i = first; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= s->kp.n) continue;
        a.tok[a.n++] = tokens[i];
        if (a.n == SMP_ACCEPT_BATCH) {
            cu_launch(smp_accept_kernel, 1, 1, 0, (cudaStream_t)stream, s->d_hist, s->d_st, a, cap);
            hm_status st = smp_launched(err, "smp_accept_kernel");
            if (st != HM_OK) return st;
            a.n = 0;
        }
    }
    if (a.n > 0) {
        cu_launch(smp_accept_kernel, 1, 1, 0, (cudaStream_t)stream, s->d_hist, s->d_st, a, cap);
        return smp_launched(err, "smp_accept_kernel");
    }
    return HM_OK;
}

extern "C" hm_status cuda_sampler_set_draws(cuda_sampler *s, uint64_t n_draws, void *stream,
                                            hm_error *err) {
    cu_launch(smp_set_draws_kernel, 1, 1, 0, (cudaStream_t)stream, s->d_st, (unsigned long long)n_draws);
    return smp_launched(err, "smp_set_draws_kernel");
}

extern "C" hm_status cuda_sampler_sample(cuda_sampler *s, const float *d_logits, int32_t *d_token,
                                         void *stream, hm_error *err) {
    cudaStream_t cs = (cudaStream_t)stream;
    const smp_params p = s->kp;
    const float *l = d_logits;
    hm_status st;
    if (s->pen_on) {
        cu_launch(smp_pen_kernel, s->grid, SMP_GRID_THREADS, 0, cs, d_logits, s->d_work, s->d_hist,
                                                             s->d_st, p);
        if ((st = smp_launched(err, "smp_pen_kernel")) != HM_OK) return st;
        l = s->d_work;
    }
    if (s->path == SMP_PATH_GREEDY) {
        cu_launch(smp_argmax_kernel, s->grid, SMP_GRID_THREADS, 0, cs, l, s->d_pval, s->d_pid, s->d_nan,
                                                                s->d_hist, s->d_st, d_token, p);
        return smp_launched(err, "smp_argmax_kernel");
    }
    if (s->path == SMP_PATH_TOPK) {
        cu_launch(smp_topk_local_kernel, s->grid_topk, SMP_FINAL_THREADS, 0, cs, l, s->d_part, s->d_nan, p);
        if ((st = smp_launched(err, "smp_topk_local_kernel")) != HM_OK) return st;
        cu_launch(smp_topk_final_kernel, 1, SMP_FINAL_THREADS, SMP_MERGE_CAP * sizeof(unsigned long long), cs, l, s->d_part, s->d_nan, s->d_hist, s->d_st, d_token,
                                      s->d_pre, p, s->grid_topk);
        return smp_launched(err, "smp_topk_final_kernel");
    }
    cu_launch(smp_keys_kernel, s->grid, SMP_GRID_THREADS, 0, cs, l, s->d_kin, s->d_iin, s->d_nan, p);
    if ((st = smp_launched(err, "smp_keys_kernel")) != HM_OK) return st;
    size_t bytes = s->cub_bytes;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(s->d_cub, bytes, s->d_kin, s->d_kout, s->d_iin,
                                                    s->d_iout, p.n, 0, 32, cs);
    if (e != cudaSuccess) return smp_cuda_err(err, "device sampler: radix sort", e);
    cu_launch(smp_full_final_kernel, 1, SMP_FINAL_THREADS, 0, cs, l, s->d_iout, s->d_nan, s->grid,
                                                           s->d_hist, s->d_st, d_token, s->d_pre,
                                                           p);
    return smp_launched(err, "smp_full_final_kernel");
}

extern "C" hm_status cuda_sampler_sample_host(cuda_sampler *s, const float *logits, int32_t *token,
                                              void *stream, hm_error *err) {
    cudaStream_t cs = (cudaStream_t)stream;
    cudaError_t e = cudaMemcpyAsync(s->d_in, logits, (size_t)s->kp.n * sizeof(float),
                                    cudaMemcpyHostToDevice, cs);
    if (e != cudaSuccess) return smp_cuda_err(err, "device sampler: logits upload", e);
    hm_status st = cuda_sampler_sample(s, s->d_in, s->d_tok, stream, err);
    if (st != HM_OK) return st;
    int32_t tok = -1;
    e = cudaMemcpyAsync(&tok, s->d_tok, sizeof(tok), cudaMemcpyDeviceToHost, cs);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cs);
    if (e != cudaSuccess) return smp_cuda_err(err, "device sampler: token download", e);
    if (tok < 0) return hm_error_set(err, HM_ERR_ARG, "device sampler: a logit is NaN");
    *token = tok;
    return HM_OK;
}

extern "C" hm_status cuda_sampler_read_state(cuda_sampler *s, void *stream, uint64_t *n_draws,
                                             int32_t *hist_len, hm_error *err) {
    smp_state h;
    cudaError_t e = cudaMemcpyAsync(&h, s->d_st, sizeof(h), cudaMemcpyDeviceToHost,
                                    (cudaStream_t)stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e != cudaSuccess) return smp_cuda_err(err, "device sampler: state download", e);
    if (n_draws) *n_draws = h.step;
    if (hist_len) *hist_len = h.len;
    return HM_OK;
}
