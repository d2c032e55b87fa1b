/* cuda_quant_moe.cu - grouped expert products with device-resident ids (cuda_quant.h):
 * cuda_moe_matvec and the fused decode gate/up + bias + activation cuda_moe_gate_up.
 *
 * DESIGN: grid (pair p = t * n_used + s, row group). The CTA of pair p reads e = ids[p]; if e is
 * invalid, or an earlier pair has the same expert, it exits at once (so an unselected expert
 * costs nothing and a selected one is computed by exactly one CTA per row group). Otherwise
 * thread 0 gathers the pairs of expert e in increasing order, up to 8 at a time, into shared
 * memory, and each warp computes its rows for that tile with row_dot<T, NT> (NT = 1, 2, 4 or 8,
 * padded with the last pair), so the expert's rows are streamed once per tile. Every output is
 * the canonical dot of one (row, activation) pair: bit-identical to cpu_moe_matmul. The fused
 * variant computes the gate and up rows of the same tile back to back, adds the optional
 * biases (g + b, one rounding, as cpu_moe_add_bias) and applies the activation with
 * cuda_math.cuh's bit-identical silu / gpt-oss swiglu (as moe_post_gate_up on the CPU).
 * Scanning for duplicates is O(n_tok * n_used) per CTA: meant for decode batches (n_tok <= 8);
 * prompts use the grouped GEMM (cuda_gemm.h).
 */
#include "cuda/cuda_quant_internal.cuh"

#define MOE_TILE 8
#define MOE_ROWS_PER_WARP 2

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
} moe_params;

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
    row_dot<T, NT>(P.w + wrow, P.k, a, g);
    if (FUSED) {
        float u[NT];
        row_dot<T, NT>(P.w2 + wrow, P.k, a, u);
        if ((threadIdx.x & 31) == 0) {
            const int64_t bi = (int64_t)e * P.n_rows + r;
            const float bg = P.b1 ? P.b1[bi] : 0.0f, bu = P.b2 ? P.b2[bi] : 0.0f;
#pragma unroll
            for (int i = 0; i < NT; i++) {
                if (i >= cnt) break;
                float gv = g[i], uv = u[i];
                if (P.b1) gv = __fadd_rn(gv, bg);
                if (P.b2) uv = __fadd_rn(uv, bu);
                P.y[(int64_t)pairs[i] * P.n_rows + r] =
                    P.glu == CUDA_GLU_OAI ? cm_swiglu_oai(gv, uv, P.alpha, P.limit) : cm_swiglu(gv, uv);
            }
        }
    } else if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int i = 0; i < NT; i++) {
            if (i >= cnt) break;
            P.y[(int64_t)pairs[i] * P.n_rows + r] = g[i];
        }
    }
}

template <class T, bool FUSED>
__global__ void __launch_bounds__(CQ_WARPS * 32) k_moe(const moe_params P) {
    __shared__ int s_pairs[MOE_TILE];
    __shared__ int s_cnt;
    __shared__ int64_t s_next;
    const int64_t p = blockIdx.x;
    const int e = P.ids[p];
    if (e < 0 || e >= P.n_expert) return; /* uniform over the CTA */
    int dup = 0;
    for (int64_t q = threadIdx.x; q < p; q += blockDim.x) dup |= P.ids[q] == e;
    if (__syncthreads_or(dup)) return;
    const int64_t r0 = (int64_t)blockIdx.y * (CQ_WARPS * MOE_ROWS_PER_WARP) + threadIdx.x / 32;
    for (int64_t start = p;;) {
        if (threadIdx.x == 0) {
            int c = 0;
            int64_t q = start;
            for (; q < P.n_pairs && c < MOE_TILE; q++)
                if (P.ids[q] == e) s_pairs[c++] = (int)q;
            s_cnt = c;
            s_next = q;
        }
        __syncthreads();
        const int cnt = s_cnt;
        int pairs[MOE_TILE];
#pragma unroll
        for (int i = 0; i < MOE_TILE; i++) pairs[i] = s_pairs[i < cnt ? i : 0];
        start = s_next;
        __syncthreads(); /* s_pairs may be overwritten from here */
        if (cnt == 0) break;
        for (int j = 0; j < MOE_ROWS_PER_WARP; j++) {
            const int64_t r = r0 + (int64_t)j * CQ_WARPS;
            if (r >= P.n_rows) break; /* uniform over the warp */
            if (cnt == 1) moe_tile<T, 1, FUSED>(P, e, pairs, cnt, r);
            else if (cnt == 2) moe_tile<T, 2, FUSED>(P, e, pairs, cnt, r);
            else if (cnt <= 4) moe_tile<T, 4, FUSED>(P, e, pairs, cnt, r);
            else moe_tile<T, 8, FUSED>(P, e, pairs, cnt, r);
        }
        if (cnt < MOE_TILE || start >= P.n_pairs) break;
    }
}

template <class T>
static void launch_moe(const moe_params *P, bool fused, cudaStream_t st) {
    moe_params q = *P;
    q.row_bytes = (size_t)(q.k / T::BS) * T::TS;
    q.act_bytes = T::ACT == QUANT_ACT_F32 ? (size_t)q.k * 4 : (size_t)(q.k / T::BS) * T::ABS;
    const int rows_per_cta = CQ_WARPS * MOE_ROWS_PER_WARP;
    const dim3 grid((unsigned)q.n_pairs, (unsigned)((q.n_rows + rows_per_cta - 1) / rows_per_cta));
    if (fused) k_moe<T, true><<<grid, CQ_WARPS * 32, 0, st>>>(q);
    else k_moe<T, false><<<grid, CQ_WARPS * 32, 0, st>>>(q);
}

static hm_status moe_check(const cuda_moe_args *a, const char *fn, hm_error *err) {
    if (!a) return hm_error_set(err, HM_ERR_ARG, "%s: NULL arguments", fn);
    hm_status s = cq_check_k(err, fn, a->wtype, a->k);
    if (s != HM_OK) return s;
    if (a->n_expert <= 0 || a->n_rows < 0 || a->n_tok < 0 || a->n_used <= 0 ||
        a->n_tok * a->n_used > INT32_MAX || a->n_rows / (CQ_WARPS * MOE_ROWS_PER_WARP) > 65535)
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
    CB_DISPATCH(a->wtype, launch_moe, &P, false, (cudaStream_t)stream);
    return cq_launched(err, "cuda_moe_matvec");
}

extern "C" hm_status cuda_moe_gate_up(const cuda_moe_gate_up_args *a, void *stream, hm_error *err) {
    hm_status s = moe_check(a ? &a->gate : NULL, "cuda_moe_gate_up", err);
    if (s != HM_OK) return s;
    if (a->up_wtype != a->gate.wtype)
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "cuda_moe_gate_up: gate %s and up %s differ in type",
                            hm_type_name(a->gate.wtype), hm_type_name(a->up_wtype));
    if (a->glu != CUDA_GLU_SWIGLU && a->glu != CUDA_GLU_OAI)
        return hm_error_set(err, HM_ERR_ARG, "cuda_moe_gate_up: unknown activation %d", (int)a->glu);
    if (a->gate.n_rows == 0 || a->gate.n_tok == 0) return HM_OK;
    if (!a->up_w || !a->out) return hm_error_set(err, HM_ERR_ARG, "cuda_moe_gate_up: NULL pointer");
    moe_params P = moe_params_of(&a->gate);
    P.w2 = (const uint8_t *)a->up_w;
    P.y = a->out;
    P.b1 = a->gate_b, P.b2 = a->up_b;
    P.glu = (int)a->glu;
    P.alpha = a->alpha, P.limit = a->limit;
    CB_DISPATCH(a->gate.wtype, launch_moe, &P, true, (cudaStream_t)stream);
    return cq_launched(err, "cuda_moe_gate_up");
}
