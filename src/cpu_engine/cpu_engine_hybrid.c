/* cpu_engine_hybrid.c - the front of a layer of a hybrid architecture (Qwen3-Next, qwen3next;
 * Qwen3.5-MoE, qwen35moe):
 * a gated delta-net (linear-attention) layer on each sequence's recurrent state, or a full
 * attention layer whose output is gated per element (docs/HYBRID.md).
 *
 * DESIGN: the products (q/k/v, z, b/a, the output) are the engine's row products (ce_linear),
 * so their bytes do not depend on the number of tokens. The recurrence runs token by token for
 * a prompt as for a decode step: the convolution on the calling thread in token order (its
 * state is one row per tap), then one item per value head, which walks the call's tokens in
 * order on that head's delta state (heads are independent, each head's sums have one order
 * whatever the thread that runs it). So a prompt and the same tokens one by one give the same
 * bytes, whatever the thread count; several sequences in one call each read and write their
 * own state (ce_tok_seq). The recurrent state is the engine's (cpu_engine_internal.h: c->rs);
 * ce_hybrid_positions keeps a call from continuing a state at another position than the one it
 * reached (no rewinding: docs/HYBRID.md).
 *
 * One recurrent layer, token t of sequence s (llama.cpp's qwen3next graph, transformers'
 * Qwen3NextGatedDeltaNet; kd = k heads x dk, vd = v heads x dv, r = v heads / k heads):
 *   [q | k | v] = xn . ssm_qkv [cd], z = xn . ssm_gate [vd], [b | a] per k head = xn . ssm_ba;
 *   y = silu(conv1d_causal(state_s, [q | k | v]));  q, k per head L2-normalised (eps rms_eps),
 *   q scaled by 1/sqrt(dk); per value head h (reading key head h / r):
 *   beta = sigmoid(b_h), g = softplus(a_h + ssm_dt_h) * ssm_a_h, S_h = delta rule (ops.h);
 *   o_h = rmsnorm(o_h) * ssm_norm * silu(z_h);  proj = o . ssm_out.
 * qwen35moe differs in two descriptor flags: b and a come from ssm_beta and ssm_alpha, one per
 * value head (ssm_ab_split), and its value heads are in llama.cpp's tiled order, value head h
 * reading key head h % k heads (ssm_v_tiled); its multi-section rope is NEOX's for text.
 * A full-attention layer: attn_q's rows per head [query (hd) | gate (hd)]; the query and k
 * RMS-normed per head, NEOX rope on the first n_rot dims, attention over the KV cache, times
 * sigmoid(gate), then attn_output.
 * Buffers: cpu_engine_internal.h (hy_in, hy_z, hy_ba, hy_o, hy_tmp).
 */
#include <math.h>
#include <string.h>

#include "cpu/ops_math.h"
#include "cpu_engine/cpu_engine_steps.h"

int ce_tok_seq(const cpu_engine *c, int t) { return c->tok_seq ? c->tok_seq[t] : c->cur_seq; }

hm_status ce_hybrid_positions(cpu_engine *c, const int32_t *seq, const int32_t *pos, int n,
                              hm_error *err) {
    memcpy(c->rs_next, c->rs_pos, sizeof(int64_t) * (size_t)c->n_seq);
    for (int t = 0; t < n; t++) {
        const int s = seq ? seq[t] : c->cur_seq;
        if (pos[t] != c->rs_next[s])
            return hm_error_set(err, HM_ERR_STATE, "%s: sequence %d's recurrent state holds %lld "
                                "tokens; a token at position %d cannot continue it (a state is "
                                "not rewound: clear the sequence first)", c->desc->name, s,
                                (long long)c->rs_next[s], pos[t]);
        c->rs_next[s]++;
    }
    return HM_OK;
}

void ce_hybrid_advance(cpu_engine *c, const int32_t *seq, int n) {
    for (int t = 0; t < n; t++) c->rs_pos[seq ? seq[t] : c->cur_seq]++;
}

void ce_hybrid_checkpoint(cpu_engine *c, int seq) {
    memcpy(c->ck + (size_t)seq * c->rs_floats, c->rs + (size_t)seq * c->rs_floats,
           sizeof(float) * c->rs_floats);
    c->ck_pos[seq] = c->rs_pos[seq];
}


/* softplus as torch and ggml compute it: x above 20, else log(1 + e^x) (in double). */
static float softplus(float x) { return x > 20.0f ? x : (float)log1p(exp((double)x)); }

typedef struct {
    cpu_engine *c;
    const hm_layer *L;
    int il, n;
    int64_t nk, nv, dk, dv, cd, vd;
    size_t conv_floats; /* the convolution state's floats before the delta state */
    float *scratch;     /* [threads][2 dv] */
    int simd;           /* cpu_act_simd(), read once per call */
} delta_job;

/* Item h: value head h over the call's tokens in order, each on its sequence's state. */
static void delta_head(void *ctx, int64_t h, int ith) {
    const delta_job *j = ctx;
    const cpu_engine *c = j->c;
    const hm_layer *L = j->L;
    const bool split = j->L->ssm_beta.data != NULL;
    const int64_t r = j->nv / j->nk, dk = j->dk, dv = j->dv;
    const int64_t g = j->c->desc->ssm_v_tiled ? h % j->nk : h / r; /* its key head */
    const float *dt = L->ssm_dt.data, *A = L->ssm_a.data, *nw = L->ssm_norm.data;
    float *scr = j->scratch + (size_t)ith * 2 * (size_t)dv, *gz = scr + dv;
    const size_t off = c->rs_off[j->il];
    for (int t = 0; t < j->n; t++) {
        float *S = c->rs + (size_t)ce_tok_seq(c, t) * c->rs_floats + off + j->conv_floats +
                   (size_t)(h * dk * dv);
        const float *y = c->hy_in + (int64_t)t * j->cd; /* the convolution's output */
        const float *q = y + g * dk, *k = y + j->nk * dk + g * dk;
        const float *v = y + 2 * j->nk * dk + h * dv;
        /* b and a: [n][v heads] each (split), or per key head [b (r), a (r)] */
        const float *bp = split ? c->hy_ba + (int64_t)t * j->nv + h
                                : c->hy_ba + (int64_t)t * 2 * j->nv + g * 2 * r + h % r;
        const float *ap = split ? bp + (int64_t)j->n * j->nv : bp + r;
        const float beta = 1.0f / (1.0f + hm_expf(-*bp));
        const float gl = softplus(*ap + dt[h]) * A[h];
        float *o = c->hy_o + (int64_t)t * j->vd + h * dv;
        cpu_delta_rule(S, q, k, v, gl, beta, dk, dv, o, scr, j->simd);
        cpu_rmsnorm(NULL, o, nw, o, 1, dv, c->hp->rms_eps);
        cpu_silu(NULL, c->hy_z + (int64_t)t * j->vd + h * dv, gz, dv);
        cpu_mul(NULL, o, gz, o, dv);
    }
}

/* The delta net of recurrent layer il on n tokens: c->xn in, c->proj out. */
static hm_status linear_block(cpu_engine *c, int il, int n, hm_error *err) {
    const hm_hparams *hp = c->hp;
    const hm_layer *L = hm_model_layer(c->m, il);
    delta_job j = {.c = c, .L = L, .il = il, .n = n, .nk = hp->ssm_n_k_heads, .nv = hp->ssm_n_v_heads,
                   .dk = hp->ssm_head_k, .dv = hp->ssm_head_v, .simd = cpu_act_simd()};
    j.vd = j.nv * j.dv;
    j.cd = 2 * j.nk * j.dk + j.vd;
    const int K = (int)hp->ssm_conv_kernel;
    j.conv_floats = (size_t)(K - 1) * (size_t)j.cd;
    float *row = c->hy_tmp; /* [cd + vd] */
    j.scratch = c->hy_tmp + j.cd + j.vd;
    hm_status st;
    if (L->ssm_qkv.data) {
        st = ce_linear(c, &L->ssm_qkv, NULL, c->xn, n, c->hy_in, err);
        if (st == HM_OK) st = ce_linear(c, &L->ssm_gate, NULL, c->xn, n, c->hy_z, err);
    } else { /* the fused ssm_in: per k head [q (dk), k (dk), v (r dv), z (r dv)] */
        st = ce_linear(c, &L->ssm_in, NULL, c->xn, n, c->hy_in, err);
        const int64_t r = j.nv / j.nk, w = 2 * j.dk + 2 * r * j.dv;
        for (int t = 0; t < n && st == HM_OK; t++) { /* row t moves down to t * cd: in order */
            memcpy(row, c->hy_in + (int64_t)t * (j.cd + j.vd),
                   sizeof(float) * (size_t)(j.cd + j.vd));
            float *dst = c->hy_in + (int64_t)t * j.cd, *z = c->hy_z + (int64_t)t * j.vd;
            for (int64_t g = 0; g < j.nk; g++) {
                const float *src = row + g * w;
                memcpy(dst + g * j.dk, src, sizeof(float) * (size_t)j.dk);
                memcpy(dst + j.nk * j.dk + g * j.dk, src + j.dk, sizeof(float) * (size_t)j.dk);
                memcpy(dst + 2 * j.nk * j.dk + g * r * j.dv, src + 2 * j.dk,
                       sizeof(float) * (size_t)(r * j.dv));
                memcpy(z + g * r * j.dv, src + 2 * j.dk + r * j.dv,
                       sizeof(float) * (size_t)(r * j.dv));
            }
        }
    }
    if (st == HM_OK && L->ssm_beta.data) { /* hy_ba: b [n][v heads], then a [n][v heads] */
        st = ce_linear(c, &L->ssm_beta, NULL, c->xn, n, c->hy_ba, err);
        if (st == HM_OK)
            st = ce_linear(c, &L->ssm_alpha, NULL, c->xn, n, c->hy_ba + (int64_t)n * j.nv, err);
    } else if (st == HM_OK) {
        st = ce_linear(c, &L->ssm_ba, NULL, c->xn, n, c->hy_ba, err);
    }
    if (st != HM_OK) return st;
    /* the convolution with each token's sequence state, SiLU, the q/k L2 norms */
    const float qscale = 1.0f / sqrtf((float)j.dk);
    for (int t = 0; t < n; t++) {
        float *conv = c->rs + (size_t)ce_tok_seq(c, t) * c->rs_floats + c->rs_off[il];
        float *y = c->hy_in + (int64_t)t * j.cd;
        cpu_conv1d_causal(conv, L->ssm_conv1d.data, y, row, j.cd, K);
        cpu_silu(NULL, row, y, j.cd);
        for (int64_t h = 0; h < 2 * j.nk; h++) cpu_l2_norm(y + h * j.dk, j.dk, hp->rms_eps);
        cpu_scale(NULL, y, qscale, y, j.nk * j.dk);
    }
    /* the delta rule, its norm and gate: one item per value head */
    const bool inline_ = (int64_t)n * j.nv * j.dk * j.dv <= CE_INLINE_ELEMS;
    tp_run_items(inline_ ? NULL : c->pool, delta_head, &j, j.nv);
    return ce_linear(c, &L->ssm_out, NULL, c->hy_o, n, c->proj, err);
}

/* The gated full attention of layer il on n tokens: c->xn in, c->proj out. */
static hm_status gated_attention_block(cpu_engine *c, int il, int n, hm_error *err) {
    const hm_hparams *hp = c->hp;
    const hm_layer *L = hm_model_layer(c->m, il);
    const int64_t nh = hp->n_head, hd = hp->head_dim_k, nq = nh * hd;
    hm_status st = ce_linear(c, &L->wq, NULL, c->xn, n, c->hy_in, err); /* [n][nh][q | gate] */
    if (st == HM_OK) st = ce_linear(c, &L->wk, NULL, c->xn, n, c->k, err);
    if (st == HM_OK) st = ce_linear(c, &L->wv, NULL, c->xn, n, c->v, err);
    if (st != HM_OK) return st;
    for (int64_t th = 0; th < n * nh; th++) {
        const float *src = c->hy_in + th * 2 * hd;
        memcpy(c->q + th * hd, src, sizeof(float) * (size_t)hd);
        memcpy(c->hy_o + th * hd, src + hd, sizeof(float) * (size_t)hd);
    }
    st = ce_qkv_finish(c, L, n, c->pool, err); /* per-head q/k norms, rope */
    if (st == HM_OK) st = ce_attend(c, il, n, err);
    if (st != HM_OK) return st;
    tp_pool *pe = ce_op_pool(c->pool, (int64_t)n * nq);
    cpu_sigmoid(pe, c->hy_o, c->hy_o, (int64_t)n * nq);
    cpu_mul(pe, c->attn, c->hy_o, c->attn, (int64_t)n * nq);
    return ce_linear(c, &L->wo, NULL, c->attn, n, c->proj, err);
}

hm_status ce_hybrid_front(cpu_engine *c, int il, int n, hm_error *err) {
    const hm_hparams *hp = c->hp;
    const hm_layer *L = hm_model_layer(c->m, il);
    const int64_t E = hp->n_embd;
    tp_pool *pe = ce_op_pool(c->pool, n * E);
    cpu_rmsnorm(pe, c->x, L->attn_norm.data, c->xn, n, E, hp->rms_eps);
    hm_status st = L->recurrent ? linear_block(c, il, n, err)
                                : gated_attention_block(c, il, n, err);
    if (st != HM_OK) return st;
    cpu_add(pe, c->x, c->proj, c->x, (int64_t)n * E);
    cpu_rmsnorm(pe, c->x, L->ffn_norm.data, c->xn, n, E, hp->rms_eps);
    return ce_linear(c, &L->router, NULL, c->xn, n, c->router, err);
}
