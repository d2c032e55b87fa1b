/* cuda_quant_moe.cuh - the grouped expert kernel shared by cuda_quant_moe.cu (plain products)
 * and cuda_quant_moe_fused.cu (gate/up + activation); two files so that nvcc compiles the two
 * sets of instantiations in parallel. Not a public header; design in cuda_quant_moe.cu. */
#ifndef HM_CUDA_CUDA_QUANT_MOE_CUH
#define HM_CUDA_CUDA_QUANT_MOE_CUH

#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_quant_internal.cuh"
#include "cuda/cuda_tune.h"

#define MOE_TILE 4 /* pairs of one expert per tile: 8 spilled registers (k-quants) */
#define MOE_ROWS_PER_WARP CUDA_TUNE_MOE_ROWS_PER_WARP
#define MOE_SMEM_IDS 1024 /* pairs whose ids are staged in shared memory */

typedef struct {
    const uint8_t *w, *w2;   /* gate (or the only) weights, up weights (fused) */
    size_t row_bytes;        /* bytes of one row (both matrices have the same type) */
    int64_t n_expert, n_rows, k;
    const uint8_t *act;      /* activation rows */
    size_t act_bytes;
    int x_per_slot;
    const int32_t *ids;      /* [n_pairs] */
    int64_t n_pairs;
    int n_used;
    float *y;                /* [n_pairs][n_rows] */
    const float *b1, *b2;    /* fused: biases [n_expert][n_rows] or NULL */
    int glu;
    float alpha, limit;
    size_t stage_bytes;      /* > 0: one-token rows staged in shared slots of this size */
    int units;               /* pair-per-CTA instance: row groups per CTA (>= 1) */
} moe_params;

/* The fused epilogue: bias (g + b, one rounding, as cpu_moe_add_bias) and the activation of
 * row r of expert e for the cnt pairs (lane 0 holds the dots) */
template <int NT>
static __device__ __forceinline__ void moe_store_gate_up(const moe_params &P, int e, const int *pairs, int cnt,
                                                         int64_t r, const float *g, const float *u) {
    if ((threadIdx.x & 31) != 0) return;
    const int64_t bi = (int64_t)e * P.n_rows + r;
    const float bg = P.b1 ? P.b1[bi] : 0.0f, bu = P.b2 ? P.b2[bi] : 0.0f;
#pragma unroll
    for (int i = 0; i < NT; i++) {
        if (i >= cnt) break;
        float gv = g[i], uv = u[i];
        if (P.b1) gv = __fadd_rn(gv, bg);
        if (P.b2) uv = __fadd_rn(uv, bu);
        P.y[(int64_t)pairs[i] * P.n_rows + r] =
            cm_glu(P.glu, gv, uv, P.alpha, P.limit);
    }
}

template <class T, int NT, bool FUSED>
static __device__ __forceinline__ void moe_tile(const moe_params &P, int e, const int *pairs, int cnt, int64_t r) {
    const uint8_t *a[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) {
        const int q = pairs[i < cnt ? i : cnt - 1];
        a[i] = P.act + (size_t)(P.x_per_slot ? q : q / P.n_used) * P.act_bytes;
    }
    const size_t wrow = ((size_t)e * (size_t)P.n_rows + (size_t)r) * P.row_bytes;
    float g[NT];
    if (FUSED) {
        float u[NT];
        if constexpr (NT <= 2) { /* gate and up rows' loads in flight together */
            const uint8_t *ws[2] = {P.w + wrow, P.w2 + wrow};
            float o[2][NT];
            rows_dot<T, NT, 2>(ws, P.k, a, o);
#pragma unroll
            for (int i = 0; i < NT; i++) {
                g[i] = o[0][i];
                u[i] = o[1][i];
            }
        } else {
            row_dot<T, NT>(P.w + wrow, P.k, a, g);
            row_dot<T, NT>(P.w2 + wrow, P.k, a, u);
        }
        moe_store_gate_up<NT>(P, e, pairs, cnt, r, g, u);
    } else {
        row_dot<T, NT>(P.w + wrow, P.k, a, g);
        if ((threadIdx.x & 31) == 0)
#pragma unroll
            for (int i = 0; i < NT; i++) {
                if (i >= cnt) break;
                P.y[(int64_t)pairs[i] * P.n_rows + r] = g[i];
            }
    }
}

/* decode (one pair): rows r + j CQ_WARPS, j < R, of the plain product, their loads in flight
 * together */
template <class T, int R>
static __device__ __forceinline__ void moe_plain_rows(const moe_params &P, int e, int pair, int64_t r) {
    const uint8_t *a[1] = {P.act + (size_t)(P.x_per_slot ? pair : pair / P.n_used) * P.act_bytes};
    const size_t w0 = ((size_t)e * (size_t)P.n_rows + (size_t)r) * P.row_bytes;
    const uint8_t *ws[R];
#pragma unroll
    for (int j = 0; j < R; j++) ws[j] = P.w + w0 + (size_t)j * CQ_WARPS * P.row_bytes;
    float o[R][1];
    rows_dot<T, 1, R>(ws, P.k, a, o);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int j = 0; j < R; j++) P.y[(int64_t)pair * P.n_rows + r + j * CQ_WARPS] = o[j][0];
}

/* Decode (one pair) with staging: the warp's two rows (gate and up of row r, or the plain rows
 * r and r + CQ_WARPS) are copied to shared memory by cp.async, all their bytes in flight at
 * once with no registers held, then rows_dot<T, 1, 2> reads them there: the same operations as
 * moe_tile<T, 1, true> and moe_plain_rows<T, 2>, so the same bytes. */
template <class T, bool FUSED>
static __device__ __forceinline__ void moe_one_staged(const moe_params &P, int e, int pair, int64_t r) {
    extern __shared__ __align__(16) uint8_t moe_slots[]; /* [CQ_WARPS][2][stage_bytes] */
    if (r >= P.n_rows) return; /* uniform over the warp */
    uint8_t *slot = moe_slots + (size_t)(threadIdx.x / 32) * 2 * P.stage_bytes;
    const uint8_t *a[1] = {P.act + (size_t)(P.x_per_slot ? pair : pair / P.n_used) * P.act_bytes};
    const uint8_t *w0 = P.w + ((size_t)e * (size_t)P.n_rows + (size_t)r) * P.row_bytes;
    const bool two = FUSED || r + CQ_WARPS < P.n_rows;
    const uint8_t *ws[2];
    ws[0] = cq_stage_row(slot, w0, P.row_bytes);
    ws[1] = two ? cq_stage_row(slot + P.stage_bytes, FUSED ? P.w2 + (w0 - P.w) : w0 + CQ_WARPS * P.row_bytes,
                                P.row_bytes)
                : ws[0];
    cq_stage_wait();
    float o[2][1];
    rows_dot<T, 1, 2>(ws, P.k, a, o);
    if (FUSED) {
        moe_store_gate_up<1>(P, e, &pair, 1, r, o[0], o[1]);
    } else if ((threadIdx.x & 31) == 0) {
        P.y[(int64_t)pair * P.n_rows + r] = o[0][0];
        if (two) P.y[(int64_t)pair * P.n_rows + r + CQ_WARPS] = o[1][0];
    }
}

/* rows per warp of the one-token instance: gate/up row pairs one after the other, plain rows
 * with their loads in flight together */
template <bool FUSED, int NTM> static constexpr __host__ __device__ int moe_rows_per_warp() {
    return NTM != 1 ? MOE_ROWS_PER_WARP : FUSED ? CUDA_TUNE_MOE_GU_ROWS : CUDA_TUNE_MOE_DOWN_ROWS;
}
/* the one-token instance reads two rows per warp (a gate/up pair, or two plain rows): the
 * shape moe_one_staged stages */
template <bool FUSED> static constexpr __host__ __device__ bool moe_two_rows() {
    return moe_rows_per_warp<FUSED, 1>() * (FUSED ? 2 : 1) == 2;
}

/* Warp 0 of a CTA: the next pairs of expert e from pair `start` on, in increasing order, up to
 * NTM of them, into pairs[] (*cnt of them) and the pair after the last one taken into *next
 * (n_pairs when the list ran out): 32 ids per ballot instead of one by one. */
template <int NTM>
static __device__ __forceinline__ void moe_gather(const moe_params &P, int e, int64_t start, const int *s_ids,
                                                  bool in_smem, int *pairs, int *cnt, int64_t *next) {
    const int lane = threadIdx.x & 31;
    int c = 0;
    int64_t nx = P.n_pairs;
    for (int64_t q0 = start; q0 < P.n_pairs; q0 += 32) {
        const int64_t q = q0 + lane;
        const bool m = q < P.n_pairs && (in_smem ? s_ids[q] : P.ids[q]) == e;
        const unsigned b = __ballot_sync(0xffffffffu, m);
        const int before = __popc(b & ((1u << lane) - 1u));
        if (m && c + before < NTM) pairs[c + before] = (int)q;
        if (c + __popc(b) >= NTM) { /* full: resume after the NTM-th pair */
            const unsigned last = __ballot_sync(0xffffffffu, m && c + before == NTM - 1);
            nx = q0 + __ffs(last);
            c = NTM;
            break;
        }
        c += __popc(b);
    }
    if (lane == 0) *cnt = c, *next = nx;
}

/* The pair-per-CTA instance's work for pair `pair` (expert e) and row group g: rows g *
 * (CQ_WARPS * RPW) + warp (+ j CQ_WARPS) */
template <class T, bool FUSED>
static __device__ __forceinline__ void moe_one_group(const moe_params &P, int e, int pair, int64_t g) {
    const int pr[1] = {pair};
    constexpr int RPW = moe_rows_per_warp<FUSED, 1>();
    const int64_t r0 = g * (CQ_WARPS * RPW) + threadIdx.x / 32;
    if (moe_two_rows<FUSED>() && P.stage_bytes) {
        moe_one_staged<T, FUSED>(P, e, pair, r0);
        return;
    }
    if (!FUSED && r0 + (RPW - 1) * CQ_WARPS < P.n_rows) {
        moe_plain_rows<T, RPW>(P, e, pair, r0);
        return;
    }
    for (int j = 0; j < RPW; j++) {
        const int64_t r = r0 + (int64_t)j * CQ_WARPS;
        if (r >= P.n_rows) break; /* uniform over the warp */
        moe_tile<T, 1, FUSED>(P, e, pr, 1, r);
    }
}

/* The pair-per-CTA instance for steps of several tokens: each block takes `units` row groups
 * of its pair in turn (a quarter of the blocks, their fixed costs shared); its own kernel, so the
 * loop's registers do not weigh on the one-token instance. */
template <class T, bool FUSED>
__global__ void __launch_bounds__(CQ_WARPS * 32, 6) k_moe_units(const moe_params P) {
    cu_pdl_enter();
    const int e = P.ids[blockIdx.x];
    if (e < 0 || e >= P.n_expert) return; /* uniform over the CTA */
#pragma unroll 1
    for (int u = 0; u < P.units; u++) {
        moe_one_group<T, FUSED>(P, e, (int)blockIdx.x, (int64_t)blockIdx.y * P.units + u);
        __syncwarp(); /* the warp's staging slots are written again by the next group */
    }
}

/* NTM: the most pairs of one expert computed together (1 when every token is alone: a
 * decode step, whose kernel then needs far fewer registers and runs more warps per SM) */
template <class T, bool FUSED, int NTM>
__global__ void __launch_bounds__(CQ_WARPS * 32, NTM == 1 ? 6 : 4) k_moe(const moe_params P) {
    cu_pdl_enter();
    if constexpr (NTM == 1) { /* a pair per CTA, no scan (pairs of one expert read it again) */
        const int e = P.ids[blockIdx.x];
        if (e < 0 || e >= P.n_expert) return; /* uniform over the CTA */
        moe_one_group<T, FUSED>(P, e, (int)blockIdx.x, blockIdx.y);
        return;
    }
    __shared__ int s_ids[MOE_SMEM_IDS]; /* the ids, when there are few enough */
    __shared__ int s_pairs[MOE_TILE];
    __shared__ int s_cnt;
    __shared__ int64_t s_next;
    const bool in_smem = P.n_pairs <= MOE_SMEM_IDS;
    if (in_smem)
        for (int64_t q = threadIdx.x; q < P.n_pairs; q += blockDim.x) s_ids[q] = P.ids[q];
    __syncthreads();
#define MOE_ID(q) (in_smem ? s_ids[q] : P.ids[q])
    const int64_t p = blockIdx.x;
    const int e = MOE_ID(p);
    if (e < 0 || e >= P.n_expert) return; /* uniform over the CTA */
    int dup = 0;
    for (int64_t q = threadIdx.x; q < p; q += blockDim.x) dup |= MOE_ID(q) == e;
    if (__syncthreads_or(dup)) return;
    const int64_t r0 = (int64_t)blockIdx.y * (CQ_WARPS * MOE_ROWS_PER_WARP) + threadIdx.x / 32;
    for (int64_t start = p;;) {
        if (threadIdx.x < 32) moe_gather<NTM>(P, e, start, s_ids, in_smem, s_pairs, &s_cnt, &s_next);
        __syncthreads();
        const int cnt = s_cnt;
        int pairs[NTM];
#pragma unroll
        for (int i = 0; i < NTM; i++) pairs[i] = s_pairs[i < cnt ? i : 0];
        start = s_next;
        __syncthreads(); /* s_pairs may be overwritten from here */
        if (cnt == 0) break;
        for (int j = 0; j < MOE_ROWS_PER_WARP; j++) {
            const int64_t r = r0 + (int64_t)j * CQ_WARPS;
            if (r >= P.n_rows) break; /* uniform over the warp */
            if (NTM == 1 || cnt == 1) moe_tile<T, 1, FUSED>(P, e, pairs, cnt, r);
            else if (cnt == 2) moe_tile<T, 2, FUSED>(P, e, pairs, cnt, r);
            else if (NTM <= 4 || cnt <= 4) moe_tile<T, 4, FUSED>(P, e, pairs, cnt, r);
            else if constexpr (NTM > 4) moe_tile<T, 8, FUSED>(P, e, pairs, cnt, r);
        }
        if (cnt < NTM || start >= P.n_pairs) break;
    }
#undef MOE_ID
}

template <class T, bool FUSED>
static void launch_moe(const moe_params *P, cudaStream_t st) {
    moe_params q = *P;
    q.row_bytes = (size_t)(q.k / T::BS) * T::TS;
    q.act_bytes = T::ACT == QUANT_ACT_F32 ? (size_t)q.k * 4 : (size_t)(q.k / T::BS) * T::ABS;
    /* A pair per CTA (the one-token instance, no scan, no tiles) for one token, where no expert
     * can have two pairs, and for steps of at most n_expert pairs: a few tokens' pairs mostly
     * fall on distinct experts (16 tokens x 8 of 128 experts: 1.6 pairs per expert used), so
     * reading an expert again for its second pair costs less than the tiled instance's scans
     * and registers. Every output is the same canonical dot either way. */
    const bool one = q.n_pairs <= q.n_used || q.n_pairs <= q.n_expert;
    /* a step of several tokens: each pair-per-CTA block takes 4 row groups, a quarter of the
     * blocks (a one-token step keeps one: its 8 pairs need every block there is) */
    q.units = one && q.n_pairs > 4 * (int64_t)q.n_used ? 4 : 1;
    const int rows_per_cta = (one ? q.units : 1) *
        CQ_WARPS * (one ? moe_rows_per_warp<FUSED, 1>() : moe_rows_per_warp<FUSED, MOE_TILE>());
    const dim3 grid((unsigned)q.n_pairs, (unsigned)((q.n_rows + rows_per_cta - 1) / rows_per_cta));
    /* one-token rows are staged in shared memory (moe_one_staged) when two slots per warp take
     * <= CQ_STAGE_MAX bytes and the bytes staged around the rows (16-byte pieces) stay inside
     * the weight arrays */
    const size_t slot = cq_stage_slot(q.row_bytes), total = (size_t)q.n_expert * q.n_rows * q.row_bytes;
    const bool stage = cq_stages<T>() && one && moe_two_rows<FUSED>() &&
                       CQ_WARPS * 2 * slot <= CQ_STAGE_MAX && cq_stage_ok(q.w, total) &&
                       (!FUSED || cq_stage_ok(q.w2, total));
    q.stage_bytes = stage ? slot : 0;
    const size_t smem = stage ? CQ_WARPS * 2 * slot : 0;
    if (one && q.units > 1) cu_launch(k_moe_units<T, FUSED>, grid, CQ_WARPS * 32, smem, st, q);
    else if (one) cu_launch(k_moe<T, FUSED, 1>, grid, CQ_WARPS * 32, smem, st, q);
    else cu_launch(k_moe<T, FUSED, MOE_TILE>, grid, CQ_WARPS * 32, 0, st, q);
}


template <class T>
static void launch_moe_plain(const moe_params *P, cudaStream_t st) { launch_moe<T, false>(P, st); }
template <class T>
static void launch_moe_fused(const moe_params *P, cudaStream_t st) { launch_moe<T, true>(P, st); }

/* cuda_quant_moe_fused.cu: enqueues the fused kernel for P (type already checked) */
void cq_moe_fused_launch(uint32_t wtype, const moe_params *P, cudaStream_t st);

#endif
