/* cuda_engine_seqs.cu - several sequences in one GPU step (cuda_engine.h:
 * cuda_engine_decode_seqs), the engine under continuous batching.
 *
 * DESIGN: each layer's KV arrays hold n_seq caches of n_ctx rows, sequence s at row s * n_ctx;
 * sequence 0 is the one every single-sequence call and the decode loop use. A step of several
 * sequences is the ordinary forward (cuda_engine_enqueue_forward) with two differences, both
 * driven by e->n_runs: the tokens' positions are uploaded instead of counted from d_pos, and
 * the attention block, after RoPE over the whole step, stores each run's k/v rows in its
 * sequence's cache and runs attention once per run (cuda_engine_attn_runs), with the same
 * kernels and arguments a single-sequence step of that run's tokens uses. When every run is
 * one token (the decode steps of continuous batching) the stores are one launch and the
 * attention of all of them one launch of the one-token kernel with a cache offset per token
 * (cuda_attention_runs: each row the bytes of its own launch); per run, 16 sequences cost 32
 * launches per layer. Everything else —
 * the products, the router, the experts (on the GPU, or the CPU side of a tiered step) — sees
 * n rows as in any step. The wanted rows' hidden states are moved to the front of e->x for the
 * output product.
 */
#include <cuda_runtime.h>
#include <string.h>

extern "C" {
#include "base/seqs.h"
#include "cuda/cuda_attn.h"
#include "cuda/cuda_engine_internal.h"
#include "cuda/cuda_handoff.h"
#include "quant/qtypes.h"
}

extern "C" hm_status cuda_engine_attn_runs(cuda_engine *e, const cuda_layer *L, hm_error *err) {
    const int nh = (int)e->hp.n_head, nkv = L->n_kv, hd = L->hd; /* K and V heads alike */
    const int64_t nk = (int64_t)nkv * hd, nv = nk;
    const int64_t nq = (int64_t)nh * hd, no = nq;
    const size_t row_k = cuda_kv_bytes(e->p.type_k, 1, nkv, hd);
    const size_t row_v = cuda_kv_bytes(e->p.type_v, 1, nkv, hd);
    bool ones = true; /* every run a single token: run r is token r */
    for (int r = 0; r < e->n_runs && ones; r++) ones = e->run_len[r] == 1;
    if (ones) {
        cuda_attn_args a = cuda_engine_attn_args(e, L, e->n_runs, e->d_positions, e->q,
                                                 L->k_cache, L->v_cache, e->attn);
        if (cuda_attention_runs_fit(&a)) {
            hm_status st = cuda_kv_store_seqs(e->p.type_k, L->k_cache, L->v_cache, e->p.n_ctx,
                                              nkv, hd, e->k, e->v, e->n_runs, e->d_positions,
                                              e->d_base, e->stream, err);
            return st == HM_OK ? cuda_attention_runs(&a, e->d_base, e->stream, err) : st;
        }
    }
    hm_status st = HM_OK;
    for (int r = 0; r < e->n_runs && st == HM_OK; r++) {
        const int t0 = e->run_t0[r], len = e->run_len[r];
        const size_t base = (size_t)e->run_seq[r] * (size_t)e->p.n_ctx;
        void *kc = (char *)L->k_cache + base * row_k, *vc = (char *)L->v_cache + base * row_v;
        st = cuda_kv_store(e->p.type_k, kc, vc, e->p.n_ctx, nkv, hd, e->k + t0 * nk,
                           e->v + t0 * nv, len, e->d_positions + t0, e->stream, err);
        if (st != HM_OK) break;
        st = cuda_engine_attn(e, L, len, e->d_positions + t0, e->q + t0 * nq, kc, vc,
                              e->attn + t0 * no, err);
    }
    return st;
}

/* The call's checks: sequences, positions in order, the logits buffer. */
static hm_status check_seqs(const cuda_engine *e, const int32_t *tokens, int n, const int32_t *seq,
                            const int32_t *pos, const uint8_t *want, const float *logits,
                            int *n_want, hm_error *err) {
    const int n_seq = e->p.n_seq > 1 ? e->p.n_seq : 1;
    if (e->p.layer_begin > 0)
        return hm_error_set(err, HM_ERR_STATE, "GPU: several sequences need the whole model "
                            "(this engine starts at layer %d)", e->p.layer_begin);
    if (n <= 0 || n > e->p.n_ubatch || !tokens || !seq || !pos)
        return hm_error_set(err, HM_ERR_ARG, "GPU: %d tokens of several sequences in one step "
                            "(1..%d, with their sequences and positions)", n, e->p.n_ubatch);
    hm_status st = hm_seqs_check(seq, pos, want, n, n_seq, e->p.n_ctx, "GPU", n_want, err);
    if (st != HM_OK) return st;
    if (*n_want > 0 && !logits)
        return hm_error_set(err, HM_ERR_ARG, "GPU: logits of %d tokens without a buffer",
                            *n_want);
    return HM_OK;
}

extern "C" hm_status cuda_engine_decode_seqs(cuda_engine *e, const int32_t *tokens, int n,
                                             const int32_t *seq, const int32_t *pos,
                                             const uint8_t *want, float *logits, hm_error *err) {
    int n_want = 0;
    hm_status st = check_seqs(e, tokens, n, seq, pos, want, logits, &n_want, err);
    if (st != HM_OK) return st;
    if (cudaSetDevice(e->p.device) != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: cannot select device %d", e->p.device);
    st = cuda_handoff_ready(e, err);
    if (st != HM_OK) return st;
    cuda_hot_service(e); /* the hot cache's exchanges asked for: between steps */
    cudaStream_t s = (cudaStream_t)e->stream;
    e->n_runs = 0;
    for (int t = 0; t < n; t++) {
        if (t == 0 || seq[t] != seq[t - 1] || pos[t] != pos[t - 1] + 1) {
            e->run_t0[e->n_runs] = t;
            e->run_len[e->n_runs] = 0;
            e->run_seq[e->n_runs++] = seq[t];
        }
        e->run_len[e->n_runs - 1]++;
    }
    e->run_max = 0;
    for (int r = 0; r < e->n_runs; r++)
        if (e->run_len[r] > e->run_max) e->run_max = e->run_len[r];
    for (int r = 0; e->h_runs && r < e->n_runs; r++) /* one run per state: no two blocks on it */
        for (int q = 0; q < r; q++)
            if (e->run_seq[q] == e->run_seq[r]) {
                const int sq = e->run_seq[r];
                e->n_runs = 0;
                return hm_error_set(err, HM_ERR_ARG, "GPU: sequence %d's tokens are not together "
                                    "in the batch (a recurrent state takes one run per step)", sq);
            }
    memcpy(e->h_tokens, tokens, sizeof(int32_t) * (size_t)n);
    memcpy(e->h_positions, pos, sizeof(int32_t) * (size_t)n);
    int32_t *h_base = e->h_positions + e->p.n_ubatch; /* [n] first cache row of each token */
    for (int t = 0; t < n; t++) h_base[t] = (int32_t)((int64_t)seq[t] * e->p.n_ctx);
    cudaError_t ce = cudaMemcpyAsync(e->d_tokens, e->h_tokens, sizeof(int32_t) * (size_t)n,
                                     cudaMemcpyHostToDevice, s);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(e->d_base, h_base, sizeof(int32_t) * (size_t)n,
                             cudaMemcpyHostToDevice, s);
    if (ce == cudaSuccess && e->h_runs) { /* the delta net's runs (cuda_delta_run) */
        for (int r = 0; r < e->n_runs; r++) {
            e->h_runs[3 * r] = e->run_t0[r];
            e->h_runs[3 * r + 1] = e->run_len[r];
            e->h_runs[3 * r + 2] = e->run_seq[r];
        }
        ce = cudaMemcpyAsync(e->d_runs, e->h_runs, sizeof(int32_t) * 3 * (size_t)e->n_runs,
                             cudaMemcpyHostToDevice, s);
    }
    if (ce != cudaSuccess) {
        e->n_runs = 0;
        return hm_error_set(err, HM_ERR_CUDA, "GPU: token upload: %s", cudaGetErrorString(ce));
    }
    st = cuda_engine_enqueue_forward(e, e->d_tokens, n, err);
    e->n_runs = 0; /* read while enqueueing only */
    const int64_t E = e->hp.n_embd, V = e->hp.n_vocab;
    for (int t = 0, k = 0; st == HM_OK && want && t < n; t++) { /* wanted rows to the front */
        if (!want[t]) continue;
        if (t != k &&
            cudaMemcpyAsync(e->x + k * E, e->x + t * E, sizeof(float) * (size_t)E,
                            cudaMemcpyDeviceToDevice, s) != cudaSuccess)
            st = hm_error_set(err, HM_ERR_CUDA, "GPU: logits rows: %s",
                              cudaGetErrorString(cudaGetLastError()));
        k++;
    }
    for (int r = 0; r < n_want && st == HM_OK; r += e->n_logit_rows) {
        const int nr = n_want - r < e->n_logit_rows ? n_want - r : e->n_logit_rows;
        st = cuda_engine_enqueue_logits(e, r, nr, err);
        if (st == HM_OK) st = cuda_engine_logits_to_host(e, nr, logits + (size_t)r * (size_t)V, err);
    }
    if (st == HM_OK) st = cuda_engine_sync(e, err);
    if (st == HM_OK) st = cuda_engine_handoff_check(e, err);
    return st;
}
