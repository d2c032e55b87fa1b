/* cpu_engine_forward.c - the CPU forward pass of every supported architecture, one ubatch at a
 * time (cpu_engine_decode).
 *
 * DESIGN: one function reads like the model (llama2.c style): embed, then per layer an
 * attention block and an MoE block, each `x = x + f(norm(x))`, then the final norm and the
 * output matrix. Where architectures differ the layer's descriptor (hm_arch_desc) decides:
 * biases, q/k norms, rope kind and YaRN, sinks and the sliding window, gating, swiglu kind,
 * expert biases and the shared expert; a hybrid architecture's layers take their own front
 * (cpu_engine_hybrid.c: the gated delta net or the gated attention), gemma4's layers are
 * cpu_engine_gemma4.c's whole (attention of their kind, dense MLP beside the experts). Every
 * step works on whole rows with the kernels of cpu/matmul.h and cpu/ops.h, which compute each
 * output element the same way whatever the number of tokens or threads — so a prompt batch and
 * the same tokens one by one give bit-identical logits.
 *
 * The expert FFN goes through the expert executor (moe_exec_run: routing result in, per-slot
 * outputs out); the weighted sum over the slots happens here, in slot order (cpu_moe_combine) —
 * or, with every expert on the CPU lane at decode, inside the expert job (cpu_moe_sum: the same
 * bytes). Each layer's routing result goes to the observer first (c->obs).
 *
 * Decode (up to MOE_FEW_TOK tokens) pays for every pool job (wake the threads, wait for the
 * slowest) more than for most of its ops, so a layer is two jobs: the front of the layer — q/k/v,
 * attention, wo and the router product — is one staged job (tp_run_stages), and the expert FFN
 * is one (cpu_moe_ffn); a one-token step with every expert on the CPU lane is one job for all
 * layers (cpu_engine_token.c, from the same steps: cpu_engine_steps.h; the front job is
 * cpu_engine_front.c's).
 * All paths call the same step functions and kernels, so they give the same bytes.
 *
 * A layer range (cpu_engine.h) runs the same steps for its layers only: its input is the
 * embedding or the given hidden rows, its output the logits or the residual rows.
 *
 * Buffers (nu = n_ubatch, n = tokens in this ubatch; shapes in cpu_engine_internal.h):
 *   x [n][n_embd] residual; xn [n][n_embd] normed; q/k/v projections; attn [n][n_head*hd];
 *   proj [n][n_embd] block output; router [n][n_expert]; ids/gw [n][n_used];
 *   ey [n][n_used][n_embd]; sg/su [n][n_ff_shexp]; sgate [n] (the experts' eg/eu: the
 *   executor's scratch).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "base/seqs.h"
#include "base/spin.h"
#include "cpu/matmul.h"
#include "cpu_engine/cpu_engine_steps.h"

/* q, k and v of one input, without biases (ce_linear_multi). */
static hm_status linear_qkv(cpu_engine *c, const hm_layer *L, const float *x, int64_t n,
                            hm_error *err) {
    const hm_tensor *w[3] = {&L->wq, &L->wk, &L->wv};
    float *y[3] = {c->q, c->k, c->v};
    return ce_linear_multi(c, 3, w, y, x, n, err);
}

/* After the wo product: its bias, the residual add x += proj and the FFN norm of x into xn
 * (pool NULL inside a job). */
static void wo_finish(cpu_engine *c, const hm_layer *L, int n, tp_pool *pool) {
    const hm_hparams *hp = c->hp;
    tp_pool *pe = ce_op_pool(pool, n * hp->n_embd);
    ce_add_bias(pool, &L->bo, c->proj, n, L->wo.ne[1]);
    cpu_add(pe, c->x, c->proj, c->x, (int64_t)n * hp->n_embd);
    cpu_rmsnorm(pe, c->x, L->ffn_norm.data, c->xn, n, hp->n_embd, hp->rms_eps);
}

/* Attention norm, q/k/v, attention and the wo product into proj (its bias and the residual:
 * wo_finish). */
static hm_status attention_block(cpu_engine *c, int il, int n, hm_error *err) {
    const hm_hparams *hp = c->hp;
    const hm_layer *L = hm_model_layer(c->m, il);
    tp_pool *pe = ce_op_pool(c->pool, n * hp->n_embd);

    cpu_rmsnorm(pe, c->x, L->attn_norm.data, c->xn, n, hp->n_embd, hp->rms_eps);
    hm_status st = linear_qkv(c, L, c->xn, n, err);
    if (st == HM_OK) st = ce_qkv_finish(c, L, n, c->pool, err);
    if (st == HM_OK) st = ce_attend(c, il, n, err);
    if (st == HM_OK) st = ce_linear(c, &L->wo, NULL, c->attn, n, c->proj, err);
    return st;
}

/* attention_block, ffn_norm and the router product of a decode step in one pool job; false
 * (nothing done) when a product cannot take part (q/k/v not one product, scratch too small). */
static bool layer_front_staged(cpu_engine *c, int il, int n, hm_status *st, hm_error *err) {
    ce_front f;
    tp_stage stages[CE_FRONT_STAGES];
    const int ns = ce_front_plan(c, il, n, &f, stages, st, err);
    if (*st != HM_OK) return true;
    if (ns == 0) return false;
    ce_front_pre(&f);
    tp_run_stages(c->pool, stages, ns);
    *st = f.st;
    if (f.st != HM_OK && err) *err = f.err;
    return true;
}

/* Attention block, FFN norm and router logits of layer il: c->xn, c->router. */
static hm_status layer_front(cpu_engine *c, int il, int n, hm_error *err) {
    hm_status st = HM_OK;
    if (!c->tok_seq && layer_front_staged(c, il, n, &st, err)) return st;
    const hm_layer *L = hm_model_layer(c->m, il);
    st = attention_block(c, il, n, err);
    if (st != HM_OK) return st;
    wo_finish(c, L, n, c->pool);
    return ce_linear(c, &L->router, NULL, c->xn, n, c->router, err);
}

/* Routing from the logits in c->router, the experts, their weighted sum, the shared expert. */
static hm_status moe_block(cpu_engine *c, int il, int n, hm_error *err) {
    const hm_model *m = c->m;
    const hm_hparams *hp = hm_model_hparams(m);
    const hm_arch_desc *d = hm_model_arch(m);
    const hm_layer *L = hm_model_layer(m, il);
    const int K = (int)hp->n_expert_used;
    const int64_t E = hp->n_embd;
    tp_pool *pe = ce_op_pool(c->pool, n * E);

    /* routing: logits -> top-k ids and weights (slot order = descending score) */
    cpu_gate_mode gm = d->gating == HM_GATING_TOPK_SOFTMAX ? CPU_GATE_TOPK_SOFTMAX
                                                           : CPU_GATE_SOFTMAX_TOPK;
    hm_status st = cpu_router(ce_op_pool(c->pool, n * hp->n_expert * 8), c->router,
                              L->router_b.data,
                              n, (int)hp->n_expert, K, gm,
                              d->gating == HM_GATING_SOFTMAX_TOPK_NORM, c->ids, c->gw, err);
    if (st != HM_OK) return st;
    if (c->obs.route) c->obs.route(c->obs.user, il, n, K, c->ids, c->gw);

    /* experts: per-slot outputs, then their weighted sum in slot order (with every expert on
     * the CPU at decode, inside the expert job, with the residual add when no shared expert
     * follows) */
    const moe_job job = {.layer = il, .n_tok = n, .n_used = K, .x = c->xn, .ids = c->ids,
                         .weights = c->gw, .y = c->ey};
    const cpu_moe_sum sum = {.w = c->gw, .out = c->proj,
                             .residual = d->shared_expert ? NULL : c->x};
    bool summed = false;
    st = moe_exec_run(c->exec, &job, &sum, &summed, err);
    if (st != HM_OK) return st;
    if (!summed)
        cpu_moe_combine(ce_op_pool(c->pool, n * K * E), c->ey, c->gw, c->ids, n, K, E, c->proj);

    if (d->shared_expert) { /* proj += sigmoid(xn . gate_inp) * down(silu(gate xn) * up xn) */
        const int64_t S = hp->n_ff_shexp;
        st = ce_linear(c, &L->sh_gate, NULL, c->xn, n, c->sg, err);
        if (st == HM_OK) st = ce_linear(c, &L->sh_up, NULL, c->xn, n, c->su, err);
        if (st != HM_OK) return st;
        cpu_swiglu(ce_op_pool(c->pool, n * S), c->sg, c->su, c->sg, n * S);
        float *sh = c->ey; /* [n][E]: the per-slot outputs are consumed already */
        st = ce_linear(c, &L->sh_down, NULL, c->sg, n, sh, err);
        if (st == HM_OK) st = ce_linear(c, &L->sh_gate_inp, NULL, c->xn, n, c->sgate, err);
        if (st != HM_OK) return st;
        cpu_sigmoid(NULL, c->sgate, c->sgate, n);
        for (int t = 0; t < n; t++) cpu_scale(NULL, sh + t * E, c->sgate[t], sh + t * E, E);
        cpu_add(pe, c->proj, sh, c->proj, n * E);
    }
    if (!summed || d->shared_expert) cpu_add(pe, c->x, c->proj, c->x, n * E);
    return HM_OK;
}

/* The input rows (row tokens[t] of token_embd, dequantised, or the given hidden rows) and the
 * engine's layers for n tokens at positions c->pos; *done when the one-job decode step also
 * wrote the logits. */
static hm_status run_layers(cpu_engine *c, const int32_t *tokens, const float *x_in, int n,
                            float *logits, hm_logits_mode mode, bool *done, hm_error *err) {
    const hm_model *m = c->m;
    const hm_hparams *hp = hm_model_hparams(m);
    const int64_t E = hp->n_embd;
    const int l0 = c->p.layer_begin, l1 = c->p.layer_end;
    hm_status st = HM_OK;
    if (l0 > 0) memcpy(c->x, x_in, sizeof(float) * (size_t)n * (size_t)E);
    for (int t = 0; t < n && l0 == 0; t++) {
        st = quant_dequantize_row(hm_model_tok_embd(m)->type,
                                  (const char *)hm_model_tok_embd(m)->data +
                                      (size_t)tokens[t] * hm_model_tok_embd(m)->row_size,
                                  c->x + t * E, E);
        if (st != HM_OK)
            return hm_error_set(err, st, "cannot read row %d of %s", tokens[t],
                                hm_model_tok_embd(m)->name);
    }
    /* every layer rotates q and k at these positions: their cos/sin once */
    const cpu_rope_params rp = hm_model_rope_params(m);
    const bool hybrid = c->desc->hybrid, gemma4 = c->desc->gemma4;
    st = gemma4 ? ce_gemma4_begin(c, n, l0 == 0, err)
                : cpu_rope_table(&rp, (int)hp->head_dim_k, c->pos, n, c->rope_cs, err);
    *done = false;
    if (st == HM_OK && n == 1 && !c->tok_seq && !hybrid && !gemma4) /* decode: one job if it can */
        st = ce_token_forward(c, mode == HM_LOGITS_NONE ? NULL : logits, done, err);
    for (int il = l0; il < l1 && st == HM_OK && !*done; il++) {
        if (gemma4) { /* its own layer: cpu_engine_gemma4.c */
            st = ce_gemma4_layer(c, il, n, err);
            continue;
        }
        st = hybrid ? ce_hybrid_front(c, il, n, err) : layer_front(c, il, n, err);
        if (st == HM_OK) st = moe_block(c, il, n, err);
    }
    return st;
}

/* The final norm and the output matrix on rows [0, cnt) of rows; with final_logit_softcapping
 * (gemma4) each logit l becomes cap * tanhf(l / cap). */
static hm_status output_rows(cpu_engine *c, const float *rows, int cnt, float *logits,
                             hm_error *err) {
    const hm_hparams *hp = c->hp;
    const int64_t E = hp->n_embd;
    cpu_rmsnorm(ce_op_pool(c->pool, cnt * E), rows, hm_model_output_norm(c->m)->data, c->xn, cnt,
                E, hp->rms_eps);
    hm_status st = ce_linear(c, hm_model_output(c->m), NULL, c->xn, cnt, logits, err);
    const float cap = hp->logit_softcap;
    if (st == HM_OK && cap > 0.0f)
        for (int64_t i = 0; i < (int64_t)cnt * hp->n_vocab; i++)
            logits[i] = cap * tanhf(logits[i] / cap);
    return st;
}

hm_status cpu_engine_forward(cpu_engine *c, const int32_t *tokens, const float *x_in, int n,
                             int pos, float *x_out, float *logits, hm_logits_mode mode,
                             hm_error *err) {
    const hm_hparams *hp = c->hp;
    const int64_t E = hp->n_embd;
    const int l0 = c->p.layer_begin, l1 = c->p.layer_end;
    const bool last = l1 == hp->n_layer; /* the range ends with the model's last layer */
    if (n <= 0 || n > c->p.n_ubatch)
        return hm_error_set(err, HM_ERR_ARG, "CPU engine: %d tokens in one ubatch (1..%d)", n,
                            c->p.n_ubatch);
    if (l0 == 0 ? !tokens : !x_in)
        return hm_error_set(err, HM_ERR_ARG, "CPU engine: layers [%d, %d) start from %s, none "
                            "given", l0, l1, l0 == 0 ? "token ids" : "hidden rows");
    if (mode != HM_LOGITS_NONE && (!last || !logits))
        return hm_error_set(err, HM_ERR_ARG, "CPU engine: logits asked of layers [%d, %d) of %lld"
                            "%s", l0, l1, (long long)hp->n_layer, logits ? "" : " without a buffer");
    for (int t = 0; t < n; t++) c->pos[t] = pos + t;
    c->tok_seq = NULL;
    hm_status st = c->rs ? ce_hybrid_positions(c, NULL, c->pos, n, err) : HM_OK;
    if (st != HM_OK) return st;
    bool done = false;
    st = run_layers(c, tokens, x_in, n, logits, mode, &done, err);
    if (st != HM_OK) return st;
    if (c->rs) ce_hybrid_advance(c, NULL, n);
    if (c->rs && n > 1) ce_hybrid_checkpoint(c, c->cur_seq); /* a prompt's end: rewinds return here */
    if (x_out) memcpy(x_out, c->x, sizeof(float) * (size_t)n * (size_t)E);
    if (done || mode == HM_LOGITS_NONE) return HM_OK;
    /* output: final norm and logits, for every token or only the last */
    const int first = mode == HM_LOGITS_ALL ? 0 : n - 1;
    return output_rows(c, c->x + first * E, n - first, logits, err);
}

hm_status cpu_engine_forward_seqs(cpu_engine *c, const int32_t *tokens, int n, const int32_t *seq,
                                  const int32_t *pos, const uint8_t *want, float *logits,
                                  hm_error *err) {
    const hm_hparams *hp = c->hp;
    const int64_t E = hp->n_embd;
    if (c->p.layer_begin != 0 || c->p.layer_end != hp->n_layer)
        return hm_error_set(err, HM_ERR_STATE, "CPU engine: several sequences need the whole "
                            "model (this engine runs layers [%d, %d))", c->p.layer_begin,
                            c->p.layer_end);
    if (n <= 0 || n > c->p.n_ubatch || !tokens || !seq || !pos)
        return hm_error_set(err, HM_ERR_ARG, "CPU engine: %d tokens of several sequences in one "
                            "ubatch (1..%d, with their sequences and positions)", n,
                            c->p.n_ubatch);
    int n_want = 0;
    hm_status st0 = hm_seqs_check(seq, pos, want, n, c->n_seq, c->p.n_ctx, "CPU engine", &n_want,
                                  err);
    if (st0 != HM_OK) return st0;
    if (n_want > 0 && !logits)
        return hm_error_set(err, HM_ERR_ARG, "CPU engine: logits of %d tokens without a buffer",
                            n_want);
    bool one = true; /* one sequence at consecutive positions: the single-sequence paths */
    for (int t = 1; t < n && one; t++) one = seq[t] == seq[0] && pos[t] == pos[t - 1] + 1;
    if (one && (n_want == 0 || (n_want == 1 && want[n - 1]))) {
        c->kv = c->kv_all + (size_t)seq[0] * (size_t)hp->n_layer;
        c->cur_seq = seq[0];
        hm_status st = cpu_engine_forward(c, tokens, NULL, n, pos[0], NULL, logits,
                                          n_want ? HM_LOGITS_LAST : HM_LOGITS_NONE, err);
        c->kv = c->kv_all;
        c->cur_seq = 0;
        return st;
    }
    memcpy(c->pos, pos, sizeof(*pos) * (size_t)n);
    hm_status st = c->rs ? ce_hybrid_positions(c, seq, c->pos, n, err) : HM_OK;
    if (st != HM_OK) return st;
    c->tok_seq = seq;
    bool done = false;
    st = run_layers(c, tokens, NULL, n, NULL, HM_LOGITS_NONE, &done, err);
    if (st == HM_OK && c->rs) {
        ce_hybrid_advance(c, seq, n);
        for (int t = 1; t < n; t++) /* a sequence with several tokens here: its prompt's end */
            if (seq[t] == seq[t - 1] && (t + 1 == n || seq[t + 1] != seq[t]))
                ce_hybrid_checkpoint(c, seq[t]);
    }
    c->tok_seq = NULL;
    if (st != HM_OK || n_want == 0) return st;
    int k = 0; /* the wanted rows, packed into proj */
    for (int t = 0; t < n; t++)
        if (want[t]) memcpy(c->proj + (size_t)k++ * (size_t)E, c->x + (size_t)t * (size_t)E,
                            sizeof(float) * (size_t)E);
    return output_rows(c, c->proj, n_want, logits, err);
}

hm_status cpu_engine_decode(cpu_engine *c, const int32_t *tokens, int n, int pos, float *logits,
                            hm_logits_mode mode, hm_error *err) {
    if (c->p.layer_begin != 0 || c->p.layer_end != c->hp->n_layer)
        return hm_error_set(err, HM_ERR_STATE, "CPU engine: runs layers [%d, %d) only "
                            "(cpu_engine_forward)", c->p.layer_begin, c->p.layer_end);
    return cpu_engine_forward(c, tokens, NULL, n, pos, NULL, logits, mode, err);
}
