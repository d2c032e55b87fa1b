/* cpu_engine.c - the CPU engine's state: KV cache, scratch buffers, thread pool, the expert
 * executor; cpu_engine_decode.
 *
 * DESIGN: everything a forward pass writes is allocated here once, sized for n_ubatch tokens,
 * so a decode allocates nothing (the matmul/attention scratch sizes are computed for the
 * largest call; a call that would need more falls back to the kernel's own allocation rather
 * than failing). Full-attention layers keep n_ctx positions; sliding-window layers a ring of
 * window + n_ubatch - 1 (cpu_kv_slots_needed); an engine with a layer range holds the cache
 * of its layers only (the others' entries stay empty). Several sequences (n_seq) each have such
 * a cache; the scratch is shared. A hybrid architecture's recurrent layers keep no KV cache but
 * a recurrent state per sequence (convolution and delta-rule states, zeroed by a reset; it
 * cannot be cut back, so a truncation that would is refused). gemma4's layer kinds have their own
 * KV heads and head size (hm_model_layer_kv): each layer's cache has its own row shape, the
 * scratch the widest. Buffer shapes: cpu_engine_internal.h.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu/matmul.h"
#include "cpu_engine/cpu_engine_steps.h"
#include "quant/qtypes.h"

/* The layer range of p: [*b, *e), layer_end 0 meaning n_layer. */
static void layer_range(const hm_model *m, const cpu_engine_params *p, int *b, int *e) {
    const int nl = (int)hm_model_hparams(m)->n_layer;
    *b = p->layer_begin;
    *e = p->layer_end > 0 ? p->layer_end : nl;
}

static int64_t layer_slots(const hm_model *m, const cpu_engine_params *p, int il) {
    const hm_hparams *hp = hm_model_hparams(m);
    if (hm_model_layer(m, il)->recurrent) return 0; /* a recurrent state instead */
    if (hm_model_layer(m, il)->swa) {
        int64_t s = cpu_kv_slots_needed(hp->sliding_window, p->n_ubatch);
        if (s > 0 && s < p->n_ctx) return s;
    }
    return p->n_ctx;
}

/* Floats of the hybrid architectures' scratch buffers (shapes in cpu_engine_internal.h). */
static void hybrid_scratch(const hm_model *m, int64_t nu, int nth, uint64_t *in, uint64_t *z,
                           uint64_t *ba, uint64_t *o, uint64_t *tmp) {
    const hm_hparams *hp = hm_model_hparams(m);
    const uint64_t vd = (uint64_t)(hp->ssm_n_v_heads * hp->ssm_head_v);
    const uint64_t cd = (uint64_t)(2 * hp->ssm_n_k_heads * hp->ssm_head_k) + vd;
    const uint64_t nq = (uint64_t)(hp->n_head * hp->head_dim_k);
    *in = (uint64_t)nu * (cd + vd > 2 * nq ? cd + vd : 2 * nq);
    *z = (uint64_t)nu * vd;
    *ba = (uint64_t)nu * 2 * (uint64_t)hp->ssm_n_v_heads;
    *o = (uint64_t)nu * (vd > nq ? vd : nq);
    *tmp = cd + vd + (uint64_t)(nth > 0 ? nth : 1) * 2 * (uint64_t)hp->ssm_head_v;
}

/* The widest q (n_head x head size) and K/V rows (kv heads x head size) of any layer (gemma4's
 * layer kinds differ), and the width of sg/su: the shared expert's or gemma4's dense MLP's. */
static void widths(const hm_model *m, int64_t *nq, int64_t *nk, int64_t *nff) {
    const hm_hparams *hp = hm_model_hparams(m);
    *nq = hp->n_head * hp->head_dim_k;
    *nk = hp->n_head_kv * hp->head_dim_k;
    for (int il = 0; il < hp->n_layer; il++) {
        int64_t kv, hd;
        hm_model_layer_kv(m, il, &kv, &hd);
        if (hp->n_head * hd > *nq) *nq = hp->n_head * hd;
        if (kv * hd > *nk) *nk = kv * hd;
    }
    *nff = hp->n_ff > hp->n_ff_shexp ? hp->n_ff : hp->n_ff_shexp;
}

/* Floats of the scratch buffers (see cpu_engine_internal.h for each buffer's shape). */
static uint64_t scratch_floats(const hm_model *m, const cpu_engine_params *p) {
    const hm_hparams *hp = hm_model_hparams(m);
    uint64_t nu = (uint64_t)p->n_ubatch, E = (uint64_t)hp->n_embd, K = (uint64_t)hp->n_expert_used;
    int64_t wq, wk, wff;
    widths(m, &wq, &wk, &wff);
    const uint64_t nq = (uint64_t)wq, nk = (uint64_t)wk;
    uint64_t f = nu * (3 * E + 2 * nq + 2 * nk + (uint64_t)hp->n_expert + K +
                       2 * K * hp->n_ff_exp + K * E + 2 * (uint64_t)wff + 1 +
                       (uint64_t)(hp->n_rot + hp->n_rot_swa));
    if (hm_model_arch(m)->hybrid) {
        uint64_t in, z, ba, o, tmp;
        hybrid_scratch(m, p->n_ubatch, p->n_threads, &in, &z, &ba, &o, &tmp);
        f += in + z + ba + o + tmp;
    }
    return f;
}

/* One sequence's recurrent state of the layers [l0, l1): floats, and each layer's offset. */
static size_t hybrid_state(const hm_model *m, int l0, int l1, size_t *off) {
    const hm_hparams *hp = hm_model_hparams(m);
    const size_t cd = (size_t)(2 * hp->ssm_n_k_heads * hp->ssm_head_k +
                               hp->ssm_n_v_heads * hp->ssm_head_v);
    const size_t per = (size_t)(hp->ssm_conv_kernel - 1) * cd +
                       (size_t)(hp->ssm_n_v_heads * hp->ssm_head_k * hp->ssm_head_v);
    size_t n = 0;
    for (int il = l0; il < l1; il++) {
        if (!hm_model_layer(m, il)->recurrent) continue;
        if (off) off[il] = n;
        n += per;
    }
    return n;
}

uint64_t cpu_engine_bytes(const hm_model *m, const cpu_engine_params *p) {
    const hm_hparams *hp = hm_model_hparams(m);
    uint64_t kv = 0;
    int l0, l1;
    layer_range(m, p, &l0, &l1);
    if (l1 > hp->n_layer) l1 = (int)hp->n_layer;
    for (int il = l0 > 0 ? l0 : 0; il < l1; il++) {
        int64_t nkv, hd;
        hm_model_layer_kv(m, il, &nkv, &hd);
        kv += (uint64_t)layer_slots(m, p, il) *
              (hm_row_size(p->type_k, nkv * hd) + hm_row_size(p->type_v, nkv * hd));
    }
    if (hm_model_arch(m)->hybrid) /* each sequence's recurrent state */
        kv += hybrid_state(m, l0 > 0 ? l0 : 0, l1, NULL) * sizeof(float);
    return kv * (uint64_t)(p->n_seq > 1 ? p->n_seq : 1) + scratch_floats(m, p) * sizeof(float);
}

/* Largest dense-product scratch any call of a ubatch needs, and the one-job expert FFN's (the
 * one-token job runs it from this scratch). */
static size_t mm_scratch_max(const hm_model *m, int64_t nu, const moe_exec *x) {
    const hm_hparams *hp = hm_model_hparams(m);
    const hm_tensor *out = hm_model_output(m);
    size_t mx = cpu_matmul_scratch_size(out->type, hp->n_embd, nu);
    for (int il = 0; il < hp->n_layer; il++) {
        const hm_layer *L = hm_model_layer(m, il);
        const hm_tensor *mats[] = {&L->wq,      &L->wk,       &L->wv,          &L->wo,
                                   &L->router,  &L->sh_gate,  &L->sh_up,       &L->sh_down,
                                   &L->sh_gate_inp, &L->ssm_qkv, &L->ssm_gate, &L->ssm_in,
                                   &L->ssm_ba,  &L->ssm_out, &L->ssm_beta, &L->ssm_alpha,
                                   &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
            if (!mats[i]->data) continue;
            size_t s = cpu_matmul_scratch_size(mats[i]->type, mats[i]->ne[0], nu);
            if (s > mx) mx = s;
        }
    }
    size_t s = moe_exec_ffn_scratch_size(x);
    return s > mx ? s : mx;
}

hm_status cpu_engine_init(const hm_model *m, const cpu_engine_params *p, cpu_engine **out,
                          hm_error *err) {
    *out = NULL;
    const hm_hparams *hp = hm_model_hparams(m);
    int l0, l1;
    layer_range(m, p, &l0, &l1);
    if (l0 < 0 || l0 >= l1 || l1 > hp->n_layer)
        return hm_error_set(err, HM_ERR_ARG, "CPU engine: layer range [%d, %d) of a model of %lld "
                            "layers", l0, l1, (long long)hp->n_layer);
    cpu_engine *c = calloc(1, sizeof(*c));
    if (!c) return hm_error_set(err, HM_ERR_NOMEM, "out of memory (CPU engine)");
    c->m = m;
    c->p = *p;
    c->p.layer_end = l1;
    c->hp = hp;
    c->desc = hm_model_arch(m);
    c->kern = quant_kernels_best();
    hm_status st = tp_init(p->n_threads, &c->pool, err);
    if (st == HM_OK) st = moe_exec_init(m, c->pool, p->n_ubatch, &c->exec, err);
    c->n_seq = p->n_seq > 1 ? p->n_seq : 1;
    if (st == HM_OK &&
        !(c->kv_all = calloc((size_t)c->n_seq * (size_t)hp->n_layer, sizeof(cpu_kv_layer))))
        st = hm_error_set(err, HM_ERR_NOMEM, "out of memory (KV cache)");
    c->kv = c->kv_all;
    for (int sq = 0; sq < c->n_seq && st == HM_OK; sq++)
        for (int il = l0; il < l1 && st == HM_OK; il++)
            if (!hm_model_layer(m, il)->recurrent) {
                int64_t nkv, hd;
                hm_model_layer_kv(m, il, &nkv, &hd);
                st = cpu_kv_init(&c->kv_all[(size_t)sq * (size_t)hp->n_layer + (size_t)il],
                                 p->type_k, p->type_v, (int)nkv, (int)hd, layer_slots(m, p, il),
                                 err);
            }
    if (st != HM_OK) {
        cpu_engine_free(c);
        return st;
    }
    const int64_t nu = p->n_ubatch, E = hp->n_embd, K = hp->n_expert_used;
    int64_t nq, nk, nff;
    widths(m, &nq, &nk, &nff);
    bool ok = true;
#define ALLOC(ptr, count)                                                                        \
    do {                                                                                         \
        size_t n_ = (size_t)(count);                                                             \
        (ptr) = n_ ? malloc(n_ * sizeof(*(ptr))) : NULL;                                         \
        if (n_ && !(ptr)) ok = false;                                                            \
    } while (0)
    ALLOC(c->x, nu * E);
    ALLOC(c->xn, nu * E);
    ALLOC(c->q, nu * nq);
    ALLOC(c->k, nu * nk);
    ALLOC(c->v, nu * nk);
    ALLOC(c->attn, nu * nq);
    ALLOC(c->proj, nu * E);
    ALLOC(c->pos, nu);
    ALLOC(c->rope_cs, nu * (hp->n_rot > 0 ? hp->n_rot + hp->n_rot_swa : 1));
    ALLOC(c->router, nu * hp->n_expert);
    ALLOC(c->ids, nu * K);
    ALLOC(c->gw, nu * K);
    ALLOC(c->ey, nu * K * E);
    ALLOC(c->sg, nu * nff);
    ALLOC(c->su, nu * nff);
    ALLOC(c->sgate, nu);
    if (c->desc->hybrid) {
        uint64_t in, z, ba, o, tmp;
        hybrid_scratch(m, nu, tp_size(c->pool), &in, &z, &ba, &o, &tmp);
        c->rs_floats = hybrid_state(m, l0, l1, NULL);
        ALLOC(c->rs_off, hp->n_layer);
        if (c->rs_off) {
            memset(c->rs_off, 0, sizeof(size_t) * (size_t)hp->n_layer);
            hybrid_state(m, l0, l1, c->rs_off);
        }
        c->rs = calloc((size_t)c->n_seq * c->rs_floats + 1, sizeof(float));
        if (!c->rs) ok = false;
        c->rs_pos = calloc((size_t)c->n_seq, sizeof(int64_t));
        if (!c->rs_pos) ok = false;
        c->ck = malloc(sizeof(float) * ((size_t)c->n_seq * c->rs_floats + 1));
        ALLOC(c->ck_pos, c->n_seq);
        if (!c->ck) ok = false;
        for (int sq = 0; c->ck_pos && sq < c->n_seq; sq++) c->ck_pos[sq] = -1; /* none yet */
        ALLOC(c->rs_next, c->n_seq);
        ALLOC(c->hy_in, in);
        ALLOC(c->hy_z, z);
        ALLOC(c->hy_ba, ba);
        ALLOC(c->hy_o, o);
        ALLOC(c->hy_tmp, tmp);
    }
#undef ALLOC
    c->mm_scratch_size = mm_scratch_max(m, nu, c->exec);
    c->mm_scratch = malloc(c->mm_scratch_size ? c->mm_scratch_size : 1);
    /* attention scratch for the largest call: a full ubatch at the end of the context */
    cpu_attn_args a = {.n_head = (int)hp->n_head, .n_tok = nu, .pos0 = p->n_ctx - nu};
    for (int il = l0; il < l1; il++) {
        if (hm_model_layer(m, il)->recurrent) continue; /* no KV cache */
        a.window = hm_model_layer(m, il)->swa ? hp->sliding_window : 0;
        size_t s = cpu_attention_scratch_size(&c->kv[il], &a, tp_size(c->pool));
        if (s > c->attn_scratch_size) c->attn_scratch_size = s;
    }
    c->attn_scratch = malloc(c->attn_scratch_size ? c->attn_scratch_size : 1);
    if (!ok || !c->mm_scratch || !c->attn_scratch) {
        cpu_engine_free(c);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory (CPU engine buffers)");
    }
    *out = c;
    return HM_OK;
}

void cpu_engine_free(cpu_engine *c) {
    if (!c) return;
    if (c->kv_all)
        for (int i = 0; i < c->n_seq * (int)c->hp->n_layer; i++) cpu_kv_free(&c->kv_all[i]);
    free(c->kv_all);
    ce_token_free(c);
    tp_free(c->pool);
    moe_exec_free(c->exec);
    void *bufs[] = {c->x,   c->xn, c->q,  c->k,     c->v,          c->attn,
                    c->proj, c->pos, c->rope_cs, c->router, c->ids, c->gw,
                    c->ey,  c->sg, c->su, c->sgate, c->mm_scratch, c->attn_scratch,
                    c->rs,  c->rs_off, c->rs_pos, c->rs_next, c->ck, c->ck_pos, c->hy_in, c->hy_z,
                    c->hy_ba, c->hy_o, c->hy_tmp};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
    free(c);
}

void cpu_engine_reset(cpu_engine *c) {
    for (int sq = 0; sq < c->n_seq; sq++) cpu_engine_seq_reset(c, sq);
}

void cpu_engine_seq_reset(cpu_engine *c, int seq) {
    if (seq < 0 || seq >= c->n_seq) return;
    for (int il = 0; il < c->hp->n_layer; il++)
        cpu_kv_clear(&c->kv_all[(size_t)seq * (size_t)c->hp->n_layer + (size_t)il]);
    if (c->rs) { /* a new sequence's recurrent state is zero, with no checkpoint */
        memset(c->rs + (size_t)seq * c->rs_floats, 0, sizeof(float) * c->rs_floats);
        c->rs_pos[seq] = 0;
        c->ck_pos[seq] = -1;
    }
}

hm_status cpu_engine_seq_restore(cpu_engine *c, int seq, int n_keep, int *at, hm_error *err) {
    if (seq < 0 || seq >= c->n_seq)
        return hm_error_set(err, HM_ERR_ARG, "sequence %d of %d", seq, c->n_seq);
    if (!c->rs || c->ck_pos[seq] < 0 || c->ck_pos[seq] > n_keep ||
        c->ck_pos[seq] > c->rs_pos[seq])
        return hm_error_set(err, HM_ERR_STATE, "sequence %d: no checkpoint of its recurrent "
                            "state at or before position %d", seq, n_keep);
    memcpy(c->rs + (size_t)seq * c->rs_floats, c->ck + (size_t)seq * c->rs_floats,
           sizeof(float) * c->rs_floats);
    c->rs_pos[seq] = c->ck_pos[seq];
    *at = (int)c->ck_pos[seq];
    return HM_OK;
}

hm_status cpu_engine_truncate_check(const cpu_engine *c, int n_keep, hm_error *err) {
    return cpu_engine_seq_truncate_check(c, 0, n_keep, err);
}

hm_status cpu_engine_seq_truncate_check(const cpu_engine *c, int seq, int n_keep, hm_error *err) {
    const int64_t W = c->hp->sliding_window;
    if (seq < 0 || seq >= c->n_seq)
        return hm_error_set(err, HM_ERR_ARG, "sequence %d of %d", seq, c->n_seq);
    if (c->rs && n_keep != c->rs_pos[seq]) /* docs/HYBRID.md: checkpoints are not built */
        return hm_error_set(err, HM_ERR_STATE, "cannot rewind sequence %d to position %d: its "
                            "recurrent (%s linear-attention) state holds %lld tokens and cannot "
                            "be cut back; clear the sequence and read it again", seq, n_keep,
                            c->desc->name, (long long)c->rs_pos[seq]);
    for (int il = c->p.layer_begin; il < c->p.layer_end; il++) {
        const cpu_kv_layer *kv = &c->kv_all[(size_t)seq * (size_t)c->hp->n_layer + (size_t)il];
        if (!hm_model_layer(c->m, il)->swa || kv->n_slots >= c->p.n_ctx) continue;
        for (int64_t q = n_keep - W + 1 > 0 ? n_keep - W + 1 : 0; q < n_keep; q++)
            if (kv->slot_pos[q % kv->n_slots] != q)
                return hm_error_set(err, HM_ERR_STATE, "cannot rewind to position %d: the "
                                    "sliding-window cache of layer %d no longer holds position "
                                    "%lld", n_keep, il, (long long)q);
    }
    return HM_OK;
}

moe_exec *cpu_engine_exec(cpu_engine *c) { return c->exec; }

void cpu_engine_set_observer(cpu_engine *c, const moe_observer *o) {
    c->obs = o ? *o : (moe_observer){0};
}

int cpu_engine_n_threads(const cpu_engine *c) { return tp_size(c->pool); }

void cpu_engine_layers(const cpu_engine *c, int *begin, int *end) {
    *begin = c->p.layer_begin;
    *end = c->p.layer_end;
}
