/* cpu_engine_gemma4.c - a layer of Gemma 4's MoE model (gemma4, docs/GEMMA4.md) on the CPU
 * engine: the attention of the layer's kind, then a dense GELU MLP beside the routed experts.
 *
 * DESIGN: like the hybrid architectures' front (cpu_engine_hybrid.c) this is one function per
 * layer that the forward pass calls for every layer of a gemma4 model; it uses the engine's row
 * products (ce_linear), norms and attention (ce_attend, over each layer's own cache: the layer
 * kinds have their own KV heads and head size, hm_model_layer_kv), and the expert executor for
 * the experts (GELU-tanh, hm_arch_desc.swiglu), so a prompt and the same tokens one by one give
 * the same bytes whatever the thread count. Decode runs the same steps (no one-job token path).
 *
 * One layer, h = head size of the kind (head_dim_swa or head_dim_k), rms() = RMS norm (eps
 * rms_eps), x the residual rows [n][n_embd]:
 *   xn = rms(x) * attn_norm;  q = rms_head(xn . wq) * q_norm;  k = rms_head(xn . wk) * k_norm;
 *   v = rms_head(xn . wv) without weight, on a full layer (no wv) rms_head(xn . wk) (K's
 *   product before its norm); NEOX rope on q, k: a sliding layer's table (rope.freq_base_swa on
 *   n_rot_swa dims), a full layer's (rope.freq_base on n_rot dims with rope_freqs as frequency
 *   factors: the proportional rope); attention with scale 1 (a sliding layer sees its last
 *   sliding_window positions); x += rms(attn . wo) * post_attention_norm.
 *   FFN on a = x: router logits = router . (rms(a) * ffn_gate_inp.scale / sqrt(n_embd)),
 *   softmax over all experts, top-k, renormalised, each weight times ffn_down_exps.scale of its
 *   expert; experts on rms(a) * pre_ffw_norm_2, their weighted sum e = rms(sum) *
 *   post_ffw_norm_2; dense d = rms(down(gelu_tanh(gate xn) * up xn)) * post_ffw_norm_1 with
 *   xn = rms(a) * ffn_norm; x = (a + rms(d + e) * post_ffw_norm) * layer_output_scale.
 * The embedding is scaled by sqrt(n_embd) (ce_gemma4_begin); the logits' soft-capping is the
 * forward pass's output step (final_logit_softcapping).
 * Buffers (shapes in cpu_engine_internal.h): q/k/v/attn with the kind's widths; proj the
 * experts' sum; ey's first n rows the dense MLP's output once the experts' slots are summed;
 * sg/su [n][n_ff] the dense MLP's gate and up.
 */
#include <math.h>
#include <string.h>

#include "cpu_engine/cpu_engine_steps.h"

hm_status ce_gemma4_begin(cpu_engine *c, int n, bool embed, hm_error *err) {
    const hm_hparams *hp = c->hp;
    const int64_t E = hp->n_embd;
    if (embed) /* transformers: the scale in the weights' dtype (f32 here) */
        cpu_scale(ce_op_pool(c->pool, n * E), c->x, (float)sqrt((double)E), c->x, n * E);
    const cpu_rope_params full = hm_model_rope_params(c->m), swa = hm_model_rope_params_swa(c->m);
    hm_status st = cpu_rope_table(&full, (int)hp->head_dim_k, c->pos, n, c->rope_cs, err);
    if (st == HM_OK)
        st = cpu_rope_table(&swa, (int)hp->head_dim_swa, c->pos, n,
                            c->rope_cs + (size_t)c->p.n_ubatch * (size_t)hp->n_rot, err);
    return st;
}

/* The attention block of layer il: c->x += rms(attention) * post_attention_norm. */
static hm_status attention(cpu_engine *c, const hm_layer *L, int il, int n, hm_error *err) {
    const hm_hparams *hp = c->hp;
    const int64_t E = hp->n_embd, nh = hp->n_head;
    int64_t nkv, hd;
    hm_model_layer_kv(c->m, il, &nkv, &hd);
    tp_pool *pe = ce_op_pool(c->pool, n * E);
    cpu_rmsnorm(pe, c->x, L->attn_norm.data, c->xn, n, E, hp->rms_eps);
    /* q [n][nh][hd], k and v [n][nkv][hd] (a full layer has no wv) */
    const hm_tensor *w[3] = {&L->wq, &L->wk, &L->wv};
    float *y[3] = {c->q, c->k, c->v};
    hm_status st = ce_linear_multi(c, L->wv.data ? 3 : 2, w, y, c->xn, n, err);
    if (st != HM_OK) return st;
    if (!L->wv.data) /* a full layer: V is K's product */
        memcpy(c->v, c->k, sizeof(float) * (size_t)(n * nkv * hd));
    tp_pool *pq = ce_op_pool(c->pool, n * nh * hd);
    cpu_rmsnorm(pq, c->q, L->q_norm.data, c->q, n * nh, hd, hp->rms_eps);
    cpu_rmsnorm(pq, c->k, L->k_norm.data, c->k, n * nkv, hd, hp->rms_eps);
    cpu_rmsnorm(pq, c->v, NULL, c->v, n * nkv, hd, hp->rms_eps);
    const cpu_rope_params rp = L->swa ? hm_model_rope_params_swa(c->m) : hm_model_rope_params(c->m);
    const float *cs = L->swa ? c->rope_cs + (size_t)c->p.n_ubatch * (size_t)hp->n_rot : c->rope_cs;
    st = cpu_rope_with_table(pq, c->q, n, (int)nh, (int)hd, cs, &rp, err);
    if (st == HM_OK) st = cpu_rope_with_table(pq, c->k, n, (int)nkv, (int)hd, cs, &rp, err);
    if (st == HM_OK) st = ce_attend(c, il, n, err); /* scale 1: ce_attn_args */
    if (st == HM_OK) st = ce_linear(c, &L->wo, NULL, c->attn, n, c->proj, err);
    if (st != HM_OK) return st;
    cpu_rmsnorm(pe, c->proj, L->attn_post_norm.data, c->proj, n, E, hp->rms_eps);
    cpu_add(pe, c->x, c->proj, c->x, n * E);
    return HM_OK;
}

/* The routing of layer il from the residual rows c->x: c->ids, c->gw (times the per-expert
 * scales), seen by the observer. */
static hm_status route(cpu_engine *c, const hm_layer *L, int il, int n, hm_error *err) {
    const hm_hparams *hp = c->hp;
    const int64_t E = hp->n_embd, X = hp->n_expert;
    const int K = (int)hp->n_expert_used;
    tp_pool *pe = ce_op_pool(c->pool, n * E);
    cpu_rmsnorm(pe, c->x, NULL, c->xn, n, E, hp->rms_eps);
    const float *rs = L->router_scale.data, inv = (float)(1.0 / sqrt((double)E));
    for (int t = 0; t < n; t++) { /* (rms(a) * scale) * 1/sqrt(n_embd), as transformers */
        float *r = c->xn + (int64_t)t * E;
        cpu_mul(NULL, r, rs, r, E);
        cpu_scale(NULL, r, inv, r, E);
    }
    hm_status st = ce_linear(c, &L->router, NULL, c->xn, n, c->router, err); /* [n][X] */
    if (st == HM_OK)
        st = cpu_router(ce_op_pool(c->pool, n * X * 8), c->router, NULL, n, (int)X, K,
                        CPU_GATE_SOFTMAX_TOPK, 1, c->ids, c->gw, err);
    if (st != HM_OK) return st;
    const float *es = L->down_exps_scale.data;
    for (int64_t i = 0; i < (int64_t)n * K; i++) c->gw[i] *= es[c->ids[i]];
    if (c->obs.route) c->obs.route(c->obs.user, il, n, K, c->ids, c->gw);
    return HM_OK;
}

hm_status ce_gemma4_layer(cpu_engine *c, int il, int n, hm_error *err) {
    const hm_hparams *hp = c->hp;
    const hm_layer *L = hm_model_layer(c->m, il);
    const int64_t E = hp->n_embd, F = hp->n_ff;
    const int K = (int)hp->n_expert_used;
    tp_pool *pe = ce_op_pool(c->pool, n * E);
    hm_status st = attention(c, L, il, n, err);
    if (st == HM_OK) st = route(c, L, il, n, err);
    if (st != HM_OK) return st;
    /* experts: their weighted sum in slot order into proj, then its norm */
    cpu_rmsnorm(pe, c->x, L->ffn_pre_norm2.data, c->xn, n, E, hp->rms_eps);
    const moe_job job = {.layer = il, .n_tok = n, .n_used = K, .x = c->xn, .ids = c->ids,
                         .weights = c->gw, .y = c->ey};
    const cpu_moe_sum sum = {.w = c->gw, .out = c->proj, .residual = NULL};
    bool summed = false;
    st = moe_exec_run(c->exec, &job, &sum, &summed, err);
    if (st != HM_OK) return st;
    if (!summed)
        cpu_moe_combine(ce_op_pool(c->pool, n * K * E), c->ey, c->gw, c->ids, n, K, E, c->proj);
    cpu_rmsnorm(pe, c->proj, L->ffn_post_norm2.data, c->proj, n, E, hp->rms_eps);
    /* the dense MLP into ey's first n rows (the slots are summed already) */
    float *dense = c->ey; /* [n][E] */
    cpu_rmsnorm(pe, c->x, L->ffn_norm.data, c->xn, n, E, hp->rms_eps);
    const hm_tensor *wd[2] = {&L->ffn_gate, &L->ffn_up};
    float *yd[2] = {c->sg, c->su}; /* [n][F] */
    st = ce_linear_multi(c, 2, wd, yd, c->xn, n, err);
    if (st != HM_OK) return st;
    cpu_geglu(ce_op_pool(c->pool, n * F), c->sg, c->su, c->sg, n * F);
    st = ce_linear(c, &L->ffn_down, NULL, c->sg, n, dense, err);
    if (st != HM_OK) return st;
    cpu_rmsnorm(pe, dense, L->ffn_post_norm1.data, dense, n, E, hp->rms_eps);
    /* x = (x + rms(dense + experts) * post_ffw_norm) * layer scalar */
    cpu_add(pe, dense, c->proj, c->proj, n * E);
    cpu_rmsnorm(pe, c->proj, L->ffn_post_norm.data, c->proj, n, E, hp->rms_eps);
    cpu_add(pe, c->x, c->proj, c->x, n * E);
    cpu_scale(pe, c->x, *(const float *)L->out_scale.data, c->x, n * E);
    return HM_OK;
}
