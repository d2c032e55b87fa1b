/* cuda_attn.cu - device KV cache store (f16 or f32) and flash attention (cuda_attn.h).
 *
 * DESIGN: attn_kernel<HD> (HD = 64, 128, 256 or 512: the register tile bound of head_dim) runs
 * 128 threads = 4 warps on a block of query rows: R = NT tokens x HB query heads of one kv head
 * (row r = token r / HB, head r % HB), R <= 64 (HD <= 128), 32 (256) or 16 (512: gemma4's full
 * layers; 164 KB of shared memory, more than GPUs below sm_80 give a block). Warp w owns rows
 * w, w+4, ...:
 * it holds their running max m, denominator l and accumulator acc[row][lane + 32 j] in
 * registers. The block walks its share of the visible positions in tiles of ATT_BK = 32 rows:
 * K and V tiles are converted from f16 into shared memory (K padded to hd + 1 floats per row so
 * lane = position reads hit distinct banks); lane i of a warp scores position k0 + i against
 * each of its rows (q rows live in shared memory, broadcast reads), applies scale and the
 * causal/window mask, then the warp does the online-softmax update (tile max and sum by
 * shuffles) and accumulates P.V with the probabilities shuffled from their lanes.
 * Splits (grid.z = S > 1, decode): the blocks of one query tile take S_eff = min(S, tiles of
 * ATT_BK in the tile's visible range [lo, hi]) parts (read from d_pos at run time, so a short
 * context runs one block per kv head and the others return at once); each writes (m, l, acc)
 * to scratch, and the last of them to arrive (a counter per tile in the scratch, reset by that
 * block) merges the S_eff parts with the sink in a fixed order. S_eff = 1 (and prompt
 * batches): the block finalises directly.
 * Exp is cm_expf (hm_expf's recipe); the sink joins the max and the denominator as on the CPU.
 * One-token decode with head_dim 64 or 128 and 1, 2, 4 or 8 heads per kv head (every preset)
 * takes attn_decode_kernel instead (below): warps own heads and chunks of positions rather
 * than query rows, so no block-wide barrier per tile and few registers.
 * Cache element type T (uint16_t: f16 bits; float: f32) is a template parameter of the store
 * and of both kernels: kv_load8 / kv_load_n turn a row piece into f32 registers (exact for
 * either type), everything after that is the same code, so the f16 instantiations compute what
 * they did before the f32 cache existed.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "cuda/cuda_attn.h"
#include "quant/qtypes.h"
}
#include "cuda/cuda_attn_internal.cuh"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_math.cuh"

/* ------------------------------------------------------------------ KV cache */

static bool kv_type_ok(uint32_t t) { return t == HM_TYPE_F16 || t == HM_TYPE_F32; }

extern "C" hm_status cuda_kv_check(uint32_t type_k, uint32_t type_v, int n_head_kv, int head_dim,
                                   hm_error *err) {
    if (!kv_type_ok(type_k) || !kv_type_ok(type_v)) {
        const bool k_bad = !kv_type_ok(type_k);
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "%s KV cache (%s) is not supported on the GPU (f16 or f32)",
                            hm_type_name(k_bad ? type_k : type_v), k_bad ? "K" : "V");
    }
    if (type_k != type_v)
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "%s K with %s V: the GPU needs one type for K and V (f16 or f32)",
                            hm_type_name(type_k), hm_type_name(type_v));
    if (n_head_kv < 1 || head_dim < 8 || head_dim % 8 || head_dim > 512)
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "GPU attention: head_dim %d (need a multiple of 8 up to 512) or %d kv "
                            "heads not supported",
                            head_dim, n_head_kv);
    return HM_OK;
}

extern "C" size_t cuda_kv_bytes(uint32_t type, int64_t n_ctx, int n_head_kv, int head_dim) {
    if (!kv_type_ok(type) || n_ctx <= 0 || n_head_kv <= 0 || head_dim <= 0) return 0;
    return (size_t)n_ctx * (size_t)n_head_kv * (size_t)head_dim * (type == HM_TYPE_F32 ? 4 : 2);
}

/* one cache element from f32: f16 bits round-to-nearest-even (cpu_kv_store's), f32 as is */
static __device__ __forceinline__ void kv_put(uint16_t *d, float x) { *d = cm_f32_to_f16(x); }
static __device__ __forceinline__ void kv_put(float *d, float x) { *d = x; }

/* 8 consecutive cache elements as f32 (p: 16-byte aligned) */
static __device__ __forceinline__ void kv_load8(const uint16_t *p, float f[8]) {
    const uint4 raw = *(const uint4 *)p;
    const __half2 *h2 = (const __half2 *)&raw;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f2 = __half22float2(h2[i]);
        f[2 * i] = f2.x;
        f[2 * i + 1] = f2.y;
    }
}
static __device__ __forceinline__ void kv_load8(const float *p, float f[8]) {
    const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
    f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}

/* attn_kernel's tile piece: kv_load8 of K and of V at one offset (f16: converted element by
 * element, K and V interleaved, as that kernel always did; the same values either way) */
static __device__ __forceinline__ void kv_load8_kv(const uint16_t *k, const uint16_t *v,
                                                   float kf[8], float vf[8]) {
    const uint4 kr = *(const uint4 *)k;
    const uint4 vr = *(const uint4 *)v;
    const __half *kh = (const __half *)&kr, *vh = (const __half *)&vr;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        kf[i] = __half2float(kh[i]);
        vf[i] = __half2float(vh[i]);
    }
}
static __device__ __forceinline__ void kv_load8_kv(const float *k, const float *v, float kf[8],
                                                   float vf[8]) {
    kv_load8(k, kf);
    kv_load8(v, vf);
}

/* N = 2 or 4 consecutive cache elements as f32 (p aligned to N elements) */
template <int N> static __device__ __forceinline__ void kv_load_n(const uint16_t *p, float *f) {
    static_assert(N == 2 || N % 4 == 0, "kv_load_n: 2 or a multiple of 4 elements");
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const uint2 raw = *(const uint2 *)(p + i);
            const float2 a = __half22float2(*(const __half2 *)&raw.x);
            const float2 b = __half22float2(*(const __half2 *)&raw.y);
            f[i] = a.x; f[i + 1] = a.y; f[i + 2] = b.x; f[i + 3] = b.y;
        }
    } else {
        const float2 a = __half22float2(*(const __half2 *)p);
        f[0] = a.x; f[1] = a.y;
    }
}
template <int N> static __device__ __forceinline__ void kv_load_n(const float *p, float *f) {
    static_assert(N == 2 || N % 4 == 0, "kv_load_n: 2 or a multiple of 4 elements");
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const float4 a = *(const float4 *)(p + i);
            f[i] = a.x; f[i + 1] = a.y; f[i + 2] = a.z; f[i + 3] = a.w;
        }
    } else {
        const float2 a = *(const float2 *)p;
        f[0] = a.x; f[1] = a.y;
    }
}

template <typename T>
__global__ void kv_store_kernel(T *kc, T *vc, int64_t n_ctx, int64_t row, const float *k,
                                const float *v, int64_t n_tok, const int32_t *pos,
                                const int32_t *base) {
    cu_pdl_enter();
    const int64_t total = n_tok * row;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / row, e = i % row;
        const int64_t p = pos[t];
        if (p < 0 || p >= n_ctx) continue;
        const int64_t r = base ? base[t] + p : p; /* the row in its sequence's cache */
        kv_put(kc + r * row + e, k[i]);
        kv_put(vc + r * row + e, v[i]);
    }
}

extern "C" hm_status cuda_kv_store(uint32_t type, void *k_cache, void *v_cache, int64_t n_ctx,
                                   int n_head_kv, int head_dim, const float *k, const float *v,
                                   int64_t n_tok, const int32_t *d_pos, void *stream,
                                   hm_error *err) {
    return cuda_kv_store_seqs(type, k_cache, v_cache, n_ctx, n_head_kv, head_dim, k, v, n_tok,
                              d_pos, NULL, stream, err);
}

extern "C" hm_status cuda_kv_store_seqs(uint32_t type, void *k_cache, void *v_cache,
                                        int64_t n_ctx, int n_head_kv, int head_dim,
                                        const float *k, const float *v, int64_t n_tok,
                                        const int32_t *d_pos, const int32_t *d_base,
                                        void *stream, hm_error *err) {
    if (n_ctx <= 0 || n_head_kv <= 0 || head_dim <= 0 || n_tok < 0 || !d_pos)
        return hm_error_set(err, HM_ERR_ARG, "cuda_kv_store: bad shape or missing positions");
    if (!kv_type_ok(type))
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "cuda_kv_store: %s cache (f16 or f32 only)",
                            hm_type_name(type));
    if (n_tok == 0) return HM_OK;
    const int64_t row = (int64_t)n_head_kv * head_dim, total = n_tok * row;
    int64_t blocks = (total + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    const cudaStream_t s = (cudaStream_t)stream;
    if (type == HM_TYPE_F32)
        cu_launch(kv_store_kernel<float>, (unsigned)blocks, 256, 0, s, (float *)k_cache,
                  (float *)v_cache, n_ctx, row, k, v, n_tok, d_pos, d_base);
    else
        cu_launch(kv_store_kernel<uint16_t>, (unsigned)blocks, 256, 0, s, (uint16_t *)k_cache,
                  (uint16_t *)v_cache, n_ctx, row, k, v, n_tok, d_pos, d_base);
    return attn_launched("kv_store_kernel", err);
}

/* ------------------------------------------------------------------ attention */

/* One warp, one query row, one tile of 32 positions: s is this lane's scaled score (-inf where
 * not visible). Updates the running max m and denominator l, rescales acc, and returns this
 * lane's probability (0 where not visible, or while nothing has been visible). */
template <int DPL>
static __device__ __forceinline__ float attn_online_step(float s, float &m, float &l, float *acc) {
    float mt = s;
    for (int o = 16; o > 0; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
    const float mn = fmaxf(m, mt);
    if (mn == -INFINITY) return 0.0f; /* warp-uniform */
    const float alpha = cm_expf(__fsub_rn(m, mn));
    const float e = s == -INFINITY ? 0.0f : cm_expf(__fsub_rn(s, mn));
    float es = e;
    for (int o = 16; o > 0; o >>= 1) es = __fadd_rn(es, __shfl_xor_sync(0xffffffffu, es, o));
    l = __fadd_rn(__fmul_rn(l, alpha), es);
    m = mn;
#pragma unroll
    for (int dd = 0; dd < DPL; dd++) acc[dd] = __fmul_rn(acc[dd], alpha);
    return e;
}

template <int HD> struct attn_cfg {
    static const int RMAX = HD <= 128 ? 64 : HD <= 256 ? 32 : 16; /* rows per block */
    static const int RPW = RMAX / ATT_WARPS;     /* rows per warp */
    static const int DPL = HD / 32;              /* output dims per lane */
};

static size_t attn_smem_bytes(int hd, int rows) {
    return ((size_t)rows * hd + (size_t)ATT_BK * (hd + 1) + (size_t)ATT_BK * hd) * sizeof(float) +
           (size_t)rows * 2 * sizeof(int);
}

template <int HD, typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_kernel(const attn_plan P, const float *q, const T *kc, const T *vc,
                const int32_t *pos, const float *sinks, float *out, void *scratch) {
    cu_pdl_enter();
    typedef attn_cfg<HD> C;
    float *part = (float *)((char *)scratch + ATT_COUNTER_BYTES);
    extern __shared__ float smem[];
    const int hd = P.hd;
    float *Qs = smem;                             /* [rows][hd] */
    float *Ks = Qs + (size_t)P.rows * hd;         /* [ATT_BK][hd + 1] */
    float *Vs = Ks + (size_t)ATT_BK * (hd + 1);   /* [ATT_BK][hd] */
    int *rlo = (int *)(Vs + (size_t)ATT_BK * hd); /* [rows] first visible position */
    int *rhi = rlo + P.rows;                      /* [rows] last visible position */
    __shared__ int s_range[3]; /* begin, end (exclusive), S_eff */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t t0 = (int64_t)blockIdx.x * P.nt;
    const int g = blockIdx.y / P.n_hchunk;
    const int hq0 = g * P.n_rep + (blockIdx.y % P.n_hchunk) * P.hb; /* first query head */
    const int hq_end = (g + 1) * P.n_rep;

    attn_row_ranges(P, pos, t0, hq0, hq_end, P.rows, rlo, rhi);
    for (int i = threadIdx.x; i < P.rows * hd; i += ATT_THREADS) {
        const int r = i / hd, d = i % hd;
        const int64_t t = t0 + r / P.hb;
        const int h = hq0 + r % P.hb;
        Qs[i] = t < P.n_tok && h < hq_end ? q[(t * P.n_head + h) * hd + d] : 0.0f;
    }
    __syncthreads();
    attn_part_range(P, rlo, rhi, s_range);
    __syncthreads();
    const int k_begin = s_range[0], k_end = s_range[1], n_part = s_range[2];
    if ((int)blockIdx.z >= n_part) return; /* block-uniform */

    float m[C::RPW], l[C::RPW], acc[C::RPW][C::DPL];
#pragma unroll
    for (int j = 0; j < C::RPW; j++) {
        m[j] = -INFINITY;
        l[j] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < C::DPL; dd++) acc[j][dd] = 0.0f;
    }
    const int row_stride = P.n_kv * hd; /* elements per cache row */
    const int chunks = hd / 8;          /* 8-element pieces of one head row */

    for (int k0 = k_begin; k0 < k_end; k0 += ATT_BK) {
        __syncthreads(); /* previous tile fully used */
        for (int c = threadIdx.x; c < ATT_BK * chunks; c += ATT_THREADS) {
            const int pk = c / chunks, d0 = (c % chunks) * 8;
            const int p = k0 + pk;
            float kf[8], vf[8];
            if (p < k_end) {
                const size_t off = (size_t)p * row_stride + (size_t)g * hd + d0;
                kv_load8_kv(kc + off, vc + off, kf, vf);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) kf[i] = vf[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                Ks[pk * (hd + 1) + d0 + i] = kf[i];
                Vs[pk * hd + d0 + i] = vf[i];
            }
        }
        __syncthreads();

        /* scores of position k0 + lane for this warp's rows */
        float sc[C::RPW];
#pragma unroll
        for (int j = 0; j < C::RPW; j++) sc[j] = 0.0f;
        const float *kr = Ks + lane * (hd + 1);
        for (int d = 0; d < hd; d++) {
            const float kv = kr[d];
#pragma unroll
            for (int j = 0; j < C::RPW; j++) {
                const int r = warp + ATT_WARPS * j;
                if (r < P.rows) sc[j] = __fmaf_rn(Qs[r * hd + d], kv, sc[j]);
            }
        }
        const int p = k0 + lane;
        float pr[C::RPW];
#pragma unroll
        for (int j = 0; j < C::RPW; j++) {
            const int r = warp + ATT_WARPS * j;
            pr[j] = 0.0f;
            if (r >= P.rows) continue;
            const bool vis = p < k_end && p >= rlo[r] && p <= rhi[r];
            pr[j] = attn_online_step<C::DPL>(vis ? __fmul_rn(sc[j], P.scale) : -INFINITY, m[j], l[j], acc[j]);
        }
        /* P.V */
        const int nk = k_end - k0 < ATT_BK ? k_end - k0 : ATT_BK;
        for (int pk = 0; pk < nk; pk++) {
            float vv[C::DPL];
#pragma unroll
            for (int dd = 0; dd < C::DPL; dd++) {
                const int d = lane + 32 * dd;
                vv[dd] = d < hd ? Vs[pk * hd + d] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < C::RPW; j++) {
                const float e = __shfl_sync(0xffffffffu, pr[j], pk);
#pragma unroll
                for (int dd = 0; dd < C::DPL; dd++) acc[j][dd] = __fmaf_rn(e, vv[dd], acc[j][dd]);
            }
        }
    }

    /* write: final output (one part) or the partial (m, l, acc) */
#pragma unroll
    for (int j = 0; j < C::RPW; j++) {
        const int r = warp + ATT_WARPS * j;
        if (r >= P.rows || rlo[r] > rhi[r]) continue;
        const int64_t t = t0 + r / P.hb;
        const int h = hq0 + r % P.hb;
        if (n_part == 1) {
            float mf = m[j], den = l[j];
            if (sinks) {
                const float sk = sinks[h];
                mf = fmaxf(m[j], sk);
                const float f = cm_expf(__fsub_rn(m[j], mf));
                den = __fadd_rn(__fmul_rn(l[j], f), cm_expf(__fsub_rn(sk, mf)));
#pragma unroll
                for (int dd = 0; dd < C::DPL; dd++) acc[j][dd] = __fmul_rn(acc[j][dd], f);
            }
            float *o = out + (t * P.n_head + h) * hd;
#pragma unroll
            for (int dd = 0; dd < C::DPL; dd++) {
                const int d = lane + 32 * dd;
                if (d < hd) o[d] = __fdiv_rn(acc[j][dd], den);
            }
        } else {
            float *pp = part + ((t * P.n_head + h) * P.n_split + blockIdx.z) * (size_t)(hd + 2);
            if (lane == 0) {
                pp[0] = m[j];
                pp[1] = l[j];
            }
#pragma unroll
            for (int dd = 0; dd < C::DPL; dd++) {
                const int d = lane + 32 * dd;
                if (d < hd) pp[2 + d] = acc[j][dd];
            }
        }
    }
    if (n_part == 1) return;

    /* the last part of this tile to finish merges all parts */
    if (!attn_arrive_last((int *)scratch + blockIdx.x * gridDim.y + blockIdx.y, n_part)) return;
    for (int j = 0; j < C::RPW; j++) {
        const int r = warp + ATT_WARPS * j;
        if (r >= P.rows || rlo[r] > rhi[r]) continue;
        const int64_t t = t0 + r / P.hb;
        const int h = hq0 + r % P.hb;
        attn_merge_row<C::DPL>(part + (t * P.n_head + h) * P.n_split * (size_t)(hd + 2), n_part,
                               hd, sinks ? sinks + h : NULL, out + (t * P.n_head + h) * hd);
    }
}

/* ------------------------------------------------------------------ decode (one token) */

/* attn_decode_kernel<HD, NREP>: one query token, grid (kv head g, part s, token z), 4 warps.
 * Token z (q and out row z, position pos[z]) reads caches that start at row base[z] (0 without
 * base) and has its own tile counters (z * n_kv + g) and partials, so each token of a launch
 * of several gets the bytes of a launch of its own (cuda_attention_runs). The NREP
 * query heads of the group are staged in shared memory. The warps split the heads into
 * NG = min(NREP, 4) groups of HPW heads, and each group's 4 / NG warps split the part's
 * chunks of 32 positions (chunk c goes to warp group c mod 4 / NG): lane i scores position i
 * of the chunk against the warp's heads (its K row read as 16-byte pieces), the warp does the
 * online-softmax update per head, then lane i accumulates output dims [DPL i, DPL i + DPL)
 * from the chunk's V rows (coalesced rows, the probabilities shuffled from their lanes; each
 * lane asks L2 for its V row before the scores, so the V loads find it there). The warps of a
 * head group merge (m, l, acc) in shared memory in chunk-group order, then the block finalises
 * (one part) or writes its partial and the last part merges (attn_merge_row). Every order is
 * fixed: same bytes on every run. */
template <int HD, int NREP, typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_decode_kernel(const attn_plan P, const float *q, const T *kc, const T *vc,
                       const int32_t *pos, const int32_t *base, const float *sinks, float *out,
                       void *scratch) {
    cu_pdl_enter();
    const int z = blockIdx.z;
    const int row = P.n_kv * HD; /* elements per cache row */
    q += (size_t)z * P.n_head * HD;
    out += (size_t)z * P.n_head * HD;
    if (base) {
        kc += (size_t)base[z] * row;
        vc += (size_t)base[z] * row;
    }
    constexpr int DPL = HD / 32, NP = HD / 8; /* output dims per lane, 8-element pieces per row */
    constexpr int LINE = 128 / (int)sizeof(T); /* elements per 128-byte line */
    constexpr int NG = NREP < ATT_WARPS ? NREP : ATT_WARPS; /* head groups */
    constexpr int HPW = NREP / NG, NPG = ATT_WARPS / NG;     /* heads per warp, chunk groups */
    constexpr int VG = DPL > 4 ? ATT_VG * 4 / DPL : ATT_VG;  /* V rows in flight: 16 x 4 dims */
    __shared__ float Qs[NREP][HD];
    __shared__ float Wm[ATT_WARPS][HPW], Wl[ATT_WARPS][HPW];
    __shared__ float Wa[ATT_WARPS][HPW][HD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hg = warp % NG, cg = warp / NG; /* the warp's heads hg * HPW + r, chunk group */
    const int g = blockIdx.x, h0 = g * NREP;
    int64_t p = pos[z];
    if (p > P.n_ctx - 1) p = P.n_ctx - 1;
    if (p < 0) return; /* nothing visible: the output row is not written (as attn_kernel) */
    const int lo = P.window > 0 && p - P.window + 1 > 0 ? (int)(p - P.window + 1) : 0;
    const int64_t len = p - lo + 1;
    int64_t se = (len + ATT_BK - 1) / ATT_BK;
    const int n_part = (int)(se < 1 ? 1 : se > P.n_split ? P.n_split : se);
    if ((int)blockIdx.y >= n_part) return;
    const int k_begin = (int)(lo + len * blockIdx.y / n_part);
    const int k_end = (int)(lo + len * (blockIdx.y + 1) / n_part);

    for (int i = threadIdx.x; i < NREP * HD; i += ATT_THREADS) Qs[i / HD][i % HD] = q[(int64_t)h0 * HD + i];
    __syncthreads();

    float m[HPW], l[HPW], acc[HPW][DPL];
#pragma unroll
    for (int r = 0; r < HPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < DPL; dd++) acc[r][dd] = 0.0f;
    }
    for (int c0 = k_begin + ATT_BK * cg; c0 < k_end; c0 += ATT_BK * NPG) {
        const int pk = c0 + lane;
        const bool vis = pk < k_end;
        if (vis)
#pragma unroll
            for (int o = 0; o < HD; o += LINE) /* 128-byte lines of this lane's V row */
                cu_prefetch_l2(vc + (size_t)pk * row + (size_t)g * HD + o);
        float sc[HPW];
#pragma unroll
        for (int r = 0; r < HPW; r++) sc[r] = 0.0f;
        const T *kr = kc + (size_t)(vis ? pk : c0) * row + (size_t)g * HD;
#pragma unroll
        for (int j = 0; j < NP; j++) {
            float kf[8];
            kv_load8(kr + 8 * j, kf);
#pragma unroll
            for (int r = 0; r < HPW; r++)
#pragma unroll
                for (int i = 0; i < 8; i++) sc[r] = __fmaf_rn(Qs[hg * HPW + r][8 * j + i], kf[i], sc[r]);
        }
        float pr[HPW];
#pragma unroll
        for (int r = 0; r < HPW; r++) {
            pr[r] = attn_online_step<DPL>(vis ? __fmul_rn(sc[r], P.scale) : -INFINITY, m[r], l[r], acc[r]);
        }
        /* V rows in groups of VG, their loads issued together (rows past k_end read row
         * k_end - 1, valid memory, with probability 0) */
        const int nk = k_end - c0 < ATT_BK ? k_end - c0 : ATT_BK;
        for (int j0 = 0; j0 < nk; j0 += VG) {
            float vf[VG][DPL];
#pragma unroll
            for (int jj = 0; jj < VG; jj++) {
                const int pj = min(c0 + j0 + jj, k_end - 1);
                kv_load_n<DPL>(vc + (size_t)pj * row + (size_t)g * HD + DPL * lane, vf[jj]);
            }
#pragma unroll
            for (int jj = 0; jj < VG; jj++)
#pragma unroll
                for (int r = 0; r < HPW; r++) {
                    const float e = __shfl_sync(0xffffffffu, pr[r], j0 + jj);
                    if (j0 + jj < nk)
#pragma unroll
                        for (int dd = 0; dd < DPL; dd++) acc[r][dd] = __fmaf_rn(e, vf[jj][dd], acc[r][dd]);
                }
        }
    }
    /* merge the chunk groups of each head (a warp with no chunk has m = -inf, l = 0) */
#pragma unroll
    for (int r = 0; r < HPW; r++) {
        if (lane == 0) {
            Wm[warp][r] = m[r];
            Wl[warp][r] = l[r];
        }
#pragma unroll
        for (int dd = 0; dd < DPL; dd++) Wa[warp][r][DPL * lane + dd] = acc[r][dd];
    }
    __syncthreads();
    const bool one = n_part == 1;
    float *part = (float *)((char *)scratch + ATT_COUNTER_BYTES) +
                  (size_t)z * P.n_head * P.n_split * (HD + 2);
    for (int i = threadIdx.x; i < NREP * HD; i += ATT_THREADS) {
        const int hr = i / HD, d = i % HD, h = h0 + hr;
        const int wg = hr / HPW, r = hr % HPW; /* the head's warps: wg + NG * c, c < NPG */
        float M = -INFINITY;
#pragma unroll
        for (int c = 0; c < NPG; c++) M = fmaxf(M, Wm[wg + NG * c][r]);
        const float mf = one && sinks ? fmaxf(M, sinks[h]) : M;
        float den = 0.0f, a = 0.0f;
#pragma unroll
        for (int c = 0; c < NPG; c++) {
            const int w = wg + NG * c;
            if (Wm[w][r] == -INFINITY) continue;
            const float f = cm_expf(__fsub_rn(Wm[w][r], mf));
            den = __fmaf_rn(Wl[w][r], f, den);
            a = __fmaf_rn(Wa[w][r][d], f, a);
        }
        if (one) {
            if (sinks) den = __fadd_rn(den, cm_expf(__fsub_rn(sinks[h], mf)));
            out[(int64_t)h * HD + d] = __fdiv_rn(a, den);
        } else {
            float *pp = part + ((int64_t)h * P.n_split + blockIdx.y) * (HD + 2);
            if (d == 0) {
                pp[0] = M;
                pp[1] = den;
            }
            pp[2 + d] = a;
        }
    }
    if (one || !attn_arrive_last((int *)scratch + z * P.n_kv + g, n_part)) return;
    for (int r = warp; r < NREP; r += ATT_WARPS)
        attn_merge_row<DPL>(part + (int64_t)(h0 + r) * P.n_split * (HD + 2), n_part, HD,
                            sinks ? sinks + h0 + r : NULL, out + (int64_t)(h0 + r) * HD);
}

/* nz tokens of a->q, a->d_pos (and d_base, or NULL) from token z0 on, one launch */
template <int HD, int NREP, typename T>
static hm_status attn_decode_launch(const attn_plan *P, const cuda_attn_args *a, const int32_t *d_base,
                                    int64_t z0, int nz, cudaStream_t s, hm_error *err) {
    const size_t qo = (size_t)z0 * P->n_head * HD;
    cu_launch(attn_decode_kernel<HD, NREP, T>, dim3((unsigned)P->n_kv, (unsigned)P->n_split, (unsigned)nz),
              ATT_THREADS, 0, s, *P, a->q + qo, (const T *)a->k_cache, (const T *)a->v_cache, a->d_pos + z0,
              d_base ? d_base + z0 : NULL, a->d_sinks, a->out + qo, a->scratch);
    return attn_launched("attn_decode_kernel", err);
}

/* the decode kernel's shapes: one token, head_dim 64, 128 or 256, 1, 2, 4 or 8 heads per kv
 * head */
static bool attn_decode_fits(const attn_plan *P) {
    return P->n_tok == 1 && (P->hd == 64 || P->hd == 128 || P->hd == 256) &&
           (P->n_rep == 1 || P->n_rep == 2 || P->n_rep == 4 || P->n_rep == 8);
}

template <typename T>
static hm_status attn_decode(const attn_plan *P, const cuda_attn_args *a, const int32_t *d_base, int64_t z0,
                             int nz, cudaStream_t s, hm_error *err) {
#define ATT_DEC(HDV, NRV)                                                                          \
    if (P->hd == HDV && P->n_rep == NRV) return attn_decode_launch<HDV, NRV, T>(P, a, d_base, z0, nz, s, err)
    ATT_DEC(64, 1); ATT_DEC(64, 2); ATT_DEC(64, 4); ATT_DEC(64, 8);
    ATT_DEC(128, 1); ATT_DEC(128, 2); ATT_DEC(128, 4); ATT_DEC(128, 8);
    ATT_DEC(256, 1); ATT_DEC(256, 2); ATT_DEC(256, 4); ATT_DEC(256, 8);
#undef ATT_DEC
    return hm_error_set(err, HM_ERR_ARG, "cuda_attention: no decode kernel for this shape");
}

static hm_status attn_make_plan(const cuda_attn_args *a, attn_plan *P, hm_error *err) {
    if (!a) return hm_error_set(err, HM_ERR_ARG, "cuda_attention: missing arguments");
    if (a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv)
        return hm_error_set(err, HM_ERR_ARG,
                            "cuda_attention: %d heads not a multiple of %d kv heads", a->n_head,
                            a->n_head_kv);
    const uint32_t kt = a->kv_f32 ? HM_TYPE_F32 : HM_TYPE_F16;
    hm_status st = cuda_kv_check(kt, kt, a->n_head_kv, a->head_dim, err);
    if (st != HM_OK) return st;
    if (a->n_tok < 0 || a->n_ctx <= 0 || a->n_ctx > 0x7fffffff || a->n_tok > 0x7fffffff)
        return hm_error_set(err, HM_ERR_ARG, "cuda_attention: bad batch (%lld tokens, n_ctx %lld)",
                            (long long)a->n_tok, (long long)a->n_ctx);
    P->n_head = a->n_head;
    P->n_kv = a->n_head_kv;
    P->hd = a->head_dim;
    P->n_rep = a->n_head / a->n_head_kv;
    const int rmax = a->head_dim <= 128 ? 64 : a->head_dim <= 256 ? 32 : 16; /* attn_cfg */
    P->hb = P->n_rep < rmax ? P->n_rep : rmax;
    P->n_hchunk = (P->n_rep + P->hb - 1) / P->hb;
    P->nt = rmax / P->hb;
    if (P->nt > a->n_tok) P->nt = a->n_tok > 0 ? (int)a->n_tok : 1;
    P->rows = P->nt * P->hb;
    P->n_ctx = a->n_ctx;
    P->n_tok = a->n_tok;
    P->window = a->window;
    P->scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)a->head_dim);
    const int64_t n_tiles = (a->n_tok + P->nt - 1) / P->nt;
    const int64_t base = n_tiles * P->n_kv * P->n_hchunk;
    int64_t S = base >= ATT_TARGET_BLOCKS / 2 ? 1 : (ATT_TARGET_BLOCKS + base - 1) / base;
    int64_t cap = a->n_ctx / ATT_MIN_SPLIT_LEN;
    if (S > cap) S = cap;
    if (S > ATT_MAX_SPLITS) S = ATT_MAX_SPLITS;
    if (S < 1) S = 1;
    P->n_split = (int)S;
    return HM_OK;
}

extern "C" size_t cuda_attention_scratch_size(const cuda_attn_args *a) {
    attn_plan P;
    if (attn_make_plan(a, &P, NULL) != HM_OK || P.n_split == 1) return 0;
    return ATT_COUNTER_BYTES + attn_part_floats(P) * sizeof(float);
}

template <int HD, typename T>
static hm_status attn_launch(const attn_plan *P, const cuda_attn_args *a, cudaStream_t s,
                             hm_error *err) {
    const size_t smem = attn_smem_bytes(P->hd, P->rows);
    cudaError_t e = cudaFuncSetAttribute(attn_kernel<HD, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "cuda_attention: shared memory %zu bytes: %s", smem,
                            cudaGetErrorString(e));
    const dim3 grid((unsigned)((P->n_tok + P->nt - 1) / P->nt), (unsigned)(P->n_kv * P->n_hchunk),
                    (unsigned)P->n_split);
    cu_launch(attn_kernel<HD, T>, grid, ATT_THREADS, smem, s, *P, a->q, (const T *)a->k_cache,
              (const T *)a->v_cache, a->d_pos, a->d_sinks, a->out, a->scratch);
    return attn_launched("attn_kernel", err);
}

/* the kernel for the plan's shape: one-token decode, tensor cores (f16 prompts), or attn_kernel */
template <typename T>
static hm_status attn_run(const attn_plan *P, const cuda_attn_args *a, cudaStream_t s,
                          hm_error *err) {
    if (attn_decode_fits(P)) return attn_decode<T>(P, a, NULL, 0, 1, s, err);
    if constexpr (sizeof(T) == 2) {
        if (attn_mma_fits(P)) return attn_mma(P, a, s, err);
    }
    if (P->hd <= 64) return attn_launch<64, T>(P, a, s, err);
    if (P->hd <= 128) return attn_launch<128, T>(P, a, s, err);
    if (P->hd <= 256) return attn_launch<256, T>(P, a, s, err);
    return attn_launch<512, T>(P, a, s, err);
}

extern "C" hm_status cuda_attention(const cuda_attn_args *a, void *stream, hm_error *err) {
    attn_plan P;
    hm_status st = attn_make_plan(a, &P, err);
    if (st != HM_OK) return st;
    if (a->n_tok == 0) return HM_OK;
    if (!a->q || !a->k_cache || !a->v_cache || !a->out || !a->d_pos)
        return hm_error_set(err, HM_ERR_ARG, "cuda_attention: missing buffers");
    if (P.n_split > 1 && !a->scratch)
        return hm_error_set(err, HM_ERR_ARG, "cuda_attention: %d splits need scratch (%zu bytes)",
                            P.n_split, cuda_attention_scratch_size(a));
    if ((unsigned)P.n_kv * P.n_hchunk > 65535)
        return hm_error_set(err, HM_ERR_ARG, "cuda_attention: too many heads");
    cudaStream_t s = (cudaStream_t)stream;
    return a->kv_f32 ? attn_run<float>(&P, a, s, err) : attn_run<uint16_t>(&P, a, s, err);
}

/* ------------------------------------------------------------------ one token per sequence */

/* The plan of one of the tokens (n_tok 1) and the tokens per launch: every token of a launch
 * has its own tile counters, ATT_TARGET_BLOCKS of them in all. */
static hm_status attn_runs_plan(const cuda_attn_args *a, attn_plan *P, int *per_launch, hm_error *err) {
    cuda_attn_args one = *a;
    one.n_tok = 1;
    hm_status st = attn_make_plan(&one, P, err);
    if (st != HM_OK) return st;
    if (!attn_decode_fits(P))
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "cuda_attention_runs: no decode kernel for "
                            "head_dim %d, %d heads per kv head", P->hd, P->n_rep);
    const int64_t g = P->n_split > 1 ? ATT_TARGET_BLOCKS / P->n_kv : 65535;
    *per_launch = (int)(g < 1 ? 1 : g > 65535 ? 65535 : g);
    return HM_OK;
}

extern "C" bool cuda_attention_runs_fit(const cuda_attn_args *a) {
    attn_plan P;
    int g;
    return a && attn_runs_plan(a, &P, &g, NULL) == HM_OK;
}

extern "C" size_t cuda_attention_runs_scratch_size(const cuda_attn_args *a) {
    attn_plan P;
    int g;
    if (!a || a->n_tok <= 0 || attn_runs_plan(a, &P, &g, NULL) != HM_OK || P.n_split == 1) return 0;
    const int64_t nz = a->n_tok < g ? a->n_tok : g;
    return ATT_COUNTER_BYTES + (size_t)nz * attn_part_floats(P) * sizeof(float);
}

extern "C" hm_status cuda_attention_runs(const cuda_attn_args *a, const int32_t *d_base, void *stream,
                                         hm_error *err) {
    attn_plan P;
    int g;
    hm_status st = a ? attn_runs_plan(a, &P, &g, err)
                     : hm_error_set(err, HM_ERR_ARG, "cuda_attention_runs: missing arguments");
    if (st != HM_OK || a->n_tok == 0) return st;
    if (!a->q || !a->k_cache || !a->v_cache || !a->out || !a->d_pos || !d_base)
        return hm_error_set(err, HM_ERR_ARG, "cuda_attention_runs: missing buffers");
    if (P.n_split > 1 && !a->scratch)
        return hm_error_set(err, HM_ERR_ARG, "cuda_attention_runs: %d splits need scratch (%zu bytes)",
                            P.n_split, cuda_attention_runs_scratch_size(a));
    cudaStream_t s = (cudaStream_t)stream;
    for (int64_t z0 = 0; z0 < a->n_tok && st == HM_OK; z0 += g) {
        const int nz = (int)(a->n_tok - z0 < g ? a->n_tok - z0 : g);
        st = a->kv_f32 ? attn_decode<float>(&P, a, d_base, z0, nz, s, err)
                       : attn_decode<uint16_t>(&P, a, d_base, z0, nz, s, err);
    }
    return st;
}
