/* cuda_engine_api.cu - the GPU engine's host API around the enqueue functions: a call's tokens
 * or input rows uploaded through pinned buffers and run in ubatches (cuda_engine_decode,
 * cuda_engine_decode_rows), the logits brought back, the position set, and the one place the
 * host waits for the engine's stream (cuda_engine_sync, counted for the audit).
 *
 * DESIGN: between two ubatches the host waits for the previous upload (the pinned buffers are
 * reused) and services the hot cache's exchanges; a tiered step's failure is read after each
 * wait (cuda_engine_handoff_check), so a call returns the step's error, never stale logits.
 */
#include <cuda_runtime.h>
#include <string.h>

extern "C" {
#include "cuda/cuda_engine_internal.h"
}

extern "C" const char *cuda_engine_describe(const cuda_engine *e) { return e->info; }

extern "C" uint64_t cuda_engine_host_syncs(const cuda_engine *e) {
    return e ? e->n_host_syncs : 0;
}

extern "C" hm_status cuda_engine_sync(cuda_engine *e, hm_error *err) {
    e->n_host_syncs++;
    cudaError_t ce = cudaStreamSynchronize((cudaStream_t)e->stream);
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: %s", cudaGetErrorString(ce));
    return HM_OK;
}

extern "C" hm_status cuda_engine_set_pos(cuda_engine *e, int pos, hm_error *err) {
    /* the pinned value must not change before the copy ran: callers sync in between (decode) */
    *e->h_pos = pos;
    cudaError_t ce = cudaMemcpyAsync(e->d_pos, e->h_pos, sizeof(int32_t), cudaMemcpyHostToDevice,
                                     (cudaStream_t)e->stream);
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: position upload: %s", cudaGetErrorString(ce));
    return HM_OK;
}

hm_status cuda_engine_logits_to_host(cuda_engine *e, int n, float *dst, hm_error *err) {
    size_t bytes = sizeof(float) * (size_t)n * (size_t)e->hp.n_vocab;
    cudaError_t ce = cudaMemcpyAsync(e->h_logits, e->d_logits, bytes, cudaMemcpyDeviceToHost,
                                     (cudaStream_t)e->stream);
    if (ce != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: logits copy: %s", cudaGetErrorString(ce));
    hm_status st = cuda_engine_sync(e, err);
    if (st == HM_OK) st = cuda_engine_handoff_check(e, err); /* a tiered step that failed */
    if (st == HM_OK) memcpy(dst, e->h_logits, bytes);
    return st;
}

/* The host API's body: tokens (ids, layer_begin 0) or rows ([n_tok][n_embd] f32) in host
 * memory, one of them NULL. */
static hm_status decode_input(cuda_engine *e, const int32_t *tokens, const float *rows,
                              int n_tok, int pos, float *logits, hm_logits_mode mode,
                              hm_error *err) {
    if (n_tok <= 0 || pos < 0 || (int64_t)pos + n_tok > e->p.n_ctx)
        return hm_error_set(err, HM_ERR_ARG, "GPU: %d tokens at position %d do not fit %d",
                            n_tok, pos, e->p.n_ctx);
    if (cudaSetDevice(e->p.device) != cudaSuccess)
        return hm_error_set(err, HM_ERR_CUDA, "GPU: cannot select device %d", e->p.device);
    cudaStream_t s = (cudaStream_t)e->stream;
    const size_t row_bytes = sizeof(float) * (size_t)e->hp.n_embd;
    if (rows && !e->h_rows) { /* pinned [n_ubatch][n_embd], once */
        cudaError_t ce = cudaMallocHost((void **)&e->h_rows, row_bytes * (size_t)e->p.n_ubatch);
        if (ce != cudaSuccess) {
            e->h_rows = NULL;
            return hm_error_set(err, HM_ERR_CUDA, "GPU: pinned input rows (%zu bytes): %s",
                                row_bytes * (size_t)e->p.n_ubatch, cudaGetErrorString(ce));
        }
    }
    hm_status st = cuda_handoff_ready(e, err); /* host layers: a CPU side serving, no fault */
    if (st == HM_OK) st = cuda_engine_set_pos(e, pos, err);
    for (int done = 0; done < n_tok && st == HM_OK;) {
        int n = n_tok - done < e->p.n_ubatch ? n_tok - done : e->p.n_ubatch;
        bool last = done + n == n_tok;
        cuda_hot_service(e); /* the hot cache's exchanges asked for: between steps */
        /* h_tokens / h_rows are reused: wait for the previous ubatch's upload to have run */
        if (done > 0) st = cuda_engine_sync(e, err);
        if (st == HM_OK && done > 0) st = cuda_engine_handoff_check(e, err);
        if (st != HM_OK) break;
        cudaError_t ce;
        if (rows) { /* layer layer_begin's input: straight into the residual stream */
            memcpy(e->h_rows, rows + (size_t)done * (size_t)e->hp.n_embd, row_bytes * (size_t)n);
            ce = cudaMemcpyAsync(e->x, e->h_rows, row_bytes * (size_t)n, cudaMemcpyHostToDevice,
                                 s);
        } else {
            memcpy(e->h_tokens, tokens + done, sizeof(int32_t) * (size_t)n);
            ce = cudaMemcpyAsync(e->d_tokens, e->h_tokens, sizeof(int32_t) * (size_t)n,
                                 cudaMemcpyHostToDevice, s);
        }
        if (ce != cudaSuccess)
            return hm_error_set(err, HM_ERR_CUDA, "GPU: %s upload: %s", rows ? "input rows" :
                                "token", cudaGetErrorString(ce));
        st = cuda_engine_enqueue_forward(e, rows ? NULL : e->d_tokens, n, err);
        if (st == HM_OK && mode == HM_LOGITS_ALL) {
            for (int r = 0; r < n && st == HM_OK; r += e->n_logit_rows) {
                int nr = n - r < e->n_logit_rows ? n - r : e->n_logit_rows;
                st = cuda_engine_enqueue_logits(e, r, nr, err);
                if (st == HM_OK)
                    st = cuda_engine_logits_to_host(e, nr,
                                        logits + (size_t)(done + r) * (size_t)e->hp.n_vocab, err);
            }
        } else if (st == HM_OK && mode == HM_LOGITS_LAST && last) {
            st = cuda_engine_enqueue_logits(e, n - 1, 1, err);
            if (st == HM_OK) st = cuda_engine_logits_to_host(e, 1, logits, err);
        }
        if (st == HM_OK) st = cuda_engine_enqueue_advance(e, n, err);
        done += n;
    }
    if (st == HM_OK) st = cuda_engine_sync(e, err);
    if (st == HM_OK) st = cuda_engine_handoff_check(e, err);
    return st;
}

extern "C" hm_status cuda_engine_decode(cuda_engine *e, const int32_t *tokens, int n_tok, int pos,
                                        float *logits, hm_logits_mode mode, hm_error *err) {
    if (e->p.layer_begin > 0)
        return hm_error_set(err, HM_ERR_STATE, "GPU: the engine starts at layer %d: its input is "
                            "hidden rows (cuda_engine_decode_rows), not token ids",
                            e->p.layer_begin);
    if (!tokens) return hm_error_set(err, HM_ERR_ARG, "GPU: no token ids");
    return decode_input(e, tokens, NULL, n_tok, pos, logits, mode, err);
}

extern "C" hm_status cuda_engine_decode_rows(cuda_engine *e, const float *x, int n_tok, int pos,
                                             float *logits, hm_logits_mode mode, hm_error *err) {
    if (!x) return hm_error_set(err, HM_ERR_ARG, "GPU: no input rows");
    return decode_input(e, NULL, x, n_tok, pos, logits, mode, err);
}
