/* cuda_fetch.cu - the GPU side of the fetched-expert path of prompt ubatches (cuda_fetch.h).
 *
 * DESIGN: cuda_engine_fetch_set computes, per host layer, where one expert's parts sit in a
 * staging slot (the CPU side copies to the same offsets) and whether the layer is eligible: its
 * gate, up and down matrices take the grouped tensor-core GEMM (the all-GPU prompt path's
 * kernels: a fetched expert's slot output is what that path computes from the same bytes) and at
 * least one expert fits a buffer. After the hand-off's wait, cuda_fetch_enqueue_experts runs
 *   fetch_table_kernel   fslot (mapped host memory, cache-volatile loads) -> e->dslot, ids
 *                        outside [0, n_slots) -> -1 (a faulted or malformed answer reads no
 *                        byte outside the buffer); in a mixed layer the hot slots (a resident
 *                        slot before: the GPU computed them already, the CPU was not asked)
 *                        become -2, which every kernel below skips;
 *   cuda_gemm_moe x 3    gate and up on xn, down on the activation, weights at the staging
 *                        buffer + part offset with the slot stride; slots < 0 skipped;
 *   fetch_bias_kernel    the expert biases, read from the staging slot (stride slot_bytes);
 *   fetch_take_kernel    the CPU's slots (dslot == -1) from the hand-off's y into e->ey.
 * Every launch is in stream order after the wait; nothing synchronises the host.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_launch.cuh"

extern "C" {
#include "cuda/cuda_engine_internal.h"
#include "cuda/cuda_gemm.h"
#include "cuda/cuda_ops.h"
#include "quant/qtypes.h"
}

static hm_status launched(const char *what, hm_error *err) {
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: %s: %s", what, cudaGetErrorString(ce));
    return HM_OK;
}

static size_t fetch_align(size_t n) {
    return (n + CUDA_FETCH_ALIGN - 1) / CUDA_FETCH_ALIGN * CUDA_FETCH_ALIGN;
}

/* fslot [n] (mapped) -> dslot [n] (device), out-of-range ids -> -1 */
__global__ void fetch_table_kernel(const int32_t *fslot, int32_t *dslot, int n, int n_slots,
                                   int mixed) {
    cu_pdl_enter();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        if (mixed && dslot[i] >= 0) { /* hot: done on the resident slot */
            dslot[i] = -2;
            continue;
        }
        const int s = __ldcv(fslot + i);
        dslot[i] = s >= 0 && s < n_slots ? s : -1;
    }
}

/* y [n_pairs][n] += the bias row of slot dslot[p] (at base + slot * stride bytes) */
__global__ void fetch_bias_kernel(float *y, const char *base, size_t stride,
                                  const int32_t *dslot, int n_pairs, int n) {
    cu_pdl_enter();
    const int p = blockIdx.x;
    if (p >= n_pairs) return;
    const int s = dslot[p];
    if (s < 0) return;
    const float *b = (const float *)(base + (size_t)s * stride);
    float *row = y + (size_t)p * (size_t)n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = row[i] + b[i];
}

/* ey[p] = y[p] (mapped, cache-volatile) for the pairs the CPU computed (dslot == -1) */
__global__ void fetch_take_kernel(const float *y, float *ey, const int32_t *dslot, int n_pairs,
                                  int n) {
    cu_pdl_enter();
    const int p = blockIdx.x;
    if (p >= n_pairs || dslot[p] != -1) return;
    const size_t o = (size_t)p * (size_t)n;
    if ((n & 3) == 0) {
        const float4 *s = (const float4 *)(y + o);
        float4 *d = (float4 *)(ey + o);
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) d[i] = __ldcv(s + i);
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) ey[o + i] = __ldcv(y + o + i);
    }
}

/* The layout of layer il from the engine's tensor metadata (host layers keep it, d unset). */
static void layout_of(const cuda_engine *e, int il, size_t cap, cuda_fetch_layout *out) {
    memset(out, 0, sizeof(*out));
    const cuda_layer *L = &e->layers[il];
    const cuda_tensor *mats[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
    const cuda_tensor *bias[3] = {&L->gate_exps_b, &L->up_exps_b, &L->down_exps_b};
    if (!(L->host || L->mixed) || !L->gate_exps.d || !L->up_exps.d || !L->down_exps.d) return;
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        out->part_bytes[out->n_parts] = mats[i]->row_size * (size_t)mats[i]->ne[1];
        out->part_off[out->n_parts] = off;
        off += fetch_align(out->part_bytes[out->n_parts++]);
    }
    for (int i = 0; i < 3; i++) {
        if (!bias[i]->d) continue;
        out->part_bytes[out->n_parts] = bias[i]->row_size;
        out->part_off[out->n_parts] = off;
        off += fetch_align(out->part_bytes[out->n_parts++]);
    }
    out->slot_bytes = off;
    bool ok = e->use_gemm;
    for (int i = 0; i < 3; i++)
        ok = ok && mats[i]->type != HM_TYPE_F32 && cuda_gemm_supported(mats[i]->type) &&
             mats[i]->ne[0] % 32 == 0;
    for (int i = 0; i < 3; i++) /* biases are read as f32 rows of the matrix's outputs */
        ok = ok && (!bias[i]->d || (bias[i]->type == HM_TYPE_F32 &&
                                    bias[i]->row_size == 4 * (size_t)mats[i]->ne[1]));
    int64_t ns = cap && off ? (int64_t)(cap / off) : 0;
    if (ns > e->hp.n_expert) ns = e->hp.n_expert;
    if (ns > CUDA_GEMM_MAX_EXPERTS) ns = CUDA_GEMM_MAX_EXPERTS;
    out->n_slots = (int)ns;
    out->eligible = ok && ns > 0;
}

extern "C" hm_status cuda_engine_fetch_set(cuda_engine *e, void *buf0, void *buf1, size_t cap,
                                           int *n_eligible, hm_error *err) {
    if (n_eligible) *n_eligible = 0;
    if (!e || e->n_host == 0)
        return hm_error_set(err, HM_ERR_STATE, "fetched experts: the engine has no host layer");
    const bool on = buf0 && buf1 && cap > 0;
    if (!e->fetch) {
        e->fetch = (cuda_fetch_layout *)calloc((size_t)e->hp.n_layer, sizeof(cuda_fetch_layout));
        if (!e->fetch) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (fetch layouts)");
    }
    e->fetch_buf[0] = on ? buf0 : NULL;
    e->fetch_buf[1] = on ? buf1 : NULL;
    e->fetch_cap = on ? cap : 0;
    int n = 0;
    for (int il = 0; il < e->hp.n_layer; il++) {
        layout_of(e, il, e->fetch_cap, &e->fetch[il]);
        n += e->fetch[il].eligible;
    }
    if (n_eligible) *n_eligible = n;
    return HM_OK;
}

extern "C" void cuda_engine_fetch_layout(const cuda_engine *e, int il, cuda_fetch_layout *out) {
    memset(out, 0, sizeof(*out));
    if (!e || il < 0 || il >= e->hp.n_layer) return;
    if (e->fetch) {
        *out = e->fetch[il];
        return;
    }
    layout_of(e, il, 0, out);
}

extern "C" bool cuda_fetch_active(const cuda_engine *e, int il, int n_tok) {
    return e->fetch && e->fetch_cap > 0 && n_tok > CUDA_ENGINE_MATVEC_MAX_TOK &&
           e->fetch[il].eligible;
}

extern "C" hm_status cuda_fetch_enqueue_experts(cuda_engine *e, int il, int n_tok,
                                                hm_error *err) {
    const cuda_fetch_layout *lay = &e->fetch[il];
    const cuda_layer *L = &e->layers[il];
    const hm_hparams *hp = &e->hp;
    const int64_t F = hp->n_ff_exp, E = hp->n_embd;
    const int K = (int)hp->n_expert_used;
    const int n_pairs = n_tok * K;
    cudaStream_t s = (cudaStream_t)e->stream;
    const char *buf = (const char *)e->fetch_buf[cuda_fetch_buffer(il)];
    cu_launch(fetch_table_kernel, (unsigned)((n_pairs + 255) / 256), 256, 0, s,
              (const int32_t *)e->ho_d.fslot, e->dslot, n_pairs, lay->n_slots,
              L->mixed ? 1 : 0);
    hm_status st = launched("fetched experts: slot table", err);
    const cuda_tensor *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
    float *y[3] = {e->eg, e->eu, e->ey};
    int part = 3; /* the next bias part */
    size_t bias_off[3] = {0, 0, 0};
    const cuda_tensor *bias[3] = {&L->gate_exps_b, &L->up_exps_b, &L->down_exps_b};
    for (int i = 0; i < 3; i++)
        if (bias[i]->d) bias_off[i] = lay->part_off[part++] + 1; /* +1: present */
    for (int i = 0; i < 3 && st == HM_OK; i++) {
        if (i == 2) { /* the gate and up biases and the activation before the down product */
            for (int b = 0; b < 2 && st == HM_OK; b++) {
                if (!bias_off[b]) continue;
                cu_launch(fetch_bias_kernel, (unsigned)n_pairs, 128, 0, s, y[b],
                          buf + bias_off[b] - 1, lay->slot_bytes, (const int32_t *)e->dslot,
                          n_pairs, (int)F);
                st = launched("fetched experts: bias", err);
            }
            if (st == HM_OK)
                st = cuda_glu_act(cuda_engine_glu(e), e->eg, e->eu, e->eg, (int64_t)n_pairs * F,
                              e->stream, err);
            if (st != HM_OK) return st;
        }
        st = cuda_experts_gemm(e, i, w[i]->type, buf + lay->part_off[i], lay->slot_bytes,
                               lay->n_slots, n_tok, err);
    }
    if (st == HM_OK && bias_off[2]) {
        cu_launch(fetch_bias_kernel, (unsigned)n_pairs, 128, 0, s, e->ey,
                  buf + bias_off[2] - 1, lay->slot_bytes, (const int32_t *)e->dslot, n_pairs,
                  (int)E);
        st = launched("fetched experts: down bias", err);
    }
    if (st == HM_OK) {
        cu_launch(fetch_take_kernel, (unsigned)n_pairs, 128, 0, s, (const float *)e->ho_d.y,
                  e->ey, (const int32_t *)e->dslot, n_pairs, (int)E);
        st = launched("fetched experts: the CPU's slots", err);
    }
    return st;
}
