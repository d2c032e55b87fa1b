/* cpu_engine_front.c - the front of a decode layer as one staged job (cpu_engine_steps.h): q/k/v
 * with the heads and attention, wo, the router product, and the small steps between them.
 *
 * DESIGN: the small steps run where their data is: each q/k head is an item (bias, norm, rope; a
 * k head also stores K and V; for one token it runs on the q/k/v item that completes its rows,
 * and the attention items are items of the q/k/v stage too, each started once its heads are
 * done), each attention item quantises the output heads it wrote for wo, each wo item adds the
 * bias and the residual on its rows; what needs a whole row (the FFN norm, a whole-projection
 * q/k norm) runs on the thread that finishes the stage before, or, the norms of a one-token
 * step, on every thread that needs the row (ce_front_thr). A thread waiting for the next
 * stage prefetches the weight (or KV) rows of the item it holds. The steps and kernels are
 * cpu_engine_forward.c's, so the bytes are.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "base/spin.h"
#include "cpu/matmul.h"
#include "cpu_engine/cpu_engine_steps.h"

static void front_after_qkv(void *ctx) {
    ce_front *f = ctx;
    f->st = ce_qkv_finish(f->c, f->L, f->n, NULL, &f->err);
    if (f->st == HM_OK) f->st = cpu_attention_begin(NULL, &f->attn, &f->err);
}

/* Item i of the heads stage (q/k norms per head or none): one head of one token — q heads
 * first, then k heads — its bias, norm and rope: qkv_finish's steps on that head's row, which
 * they treat row by row, so the same bytes. A k head's item also adds the v bias to v head hh
 * and stores both into the KV cache (cpu_kv_store_head: cpu_kv_store's bytes). */
static void front_head_item(void *ctx, int64_t i, int ith) {
    (void)ith;
    ce_front *f = ctx;
    const cpu_engine *c = f->c;
    const hm_layer *L = f->L;
    const hm_hparams *hp = c->hp;
    const int nh = (int)hp->n_head, nkv = (int)hp->n_head_kv, hd = (int)hp->head_dim_k;
    const int64_t t = i / (nh + nkv);
    const int h = (int)(i % (nh + nkv));
    const bool is_q = h < nh;
    const int hh = is_q ? h : h - nh;
    float *row = (is_q ? c->q + t * nh * hd : c->k + t * nkv * hd) + (int64_t)hh * hd;
    const hm_tensor *b = is_q ? &L->bq : &L->bk, *w = is_q ? &L->q_norm : &L->k_norm;
    if (b->data) cpu_add_bias(NULL, row, (const float *)b->data + (int64_t)hh * hd, 1, hd);
    if (c->desc->qk_norm == HM_QKNORM_HEAD)
        cpu_rmsnorm(NULL, row, w->data, row, 1, hd, hp->rms_eps);
    if (cpu_rope_with_table(NULL, row, 1, 1, hd, c->rope_cs + t * f->rp.n_dims, &f->rp, NULL) !=
        HM_OK)
        atomic_store(&f->head_fail, 1);
    if (is_q) return;
    const int hv = (int)hp->head_dim_v;
    float *vrow = c->v + (t * nkv + hh) * hv;
    if (L->bv.data) cpu_add_bias(NULL, vrow, (const float *)L->bv.data + (int64_t)hh * hv, 1, hv);
    if (cpu_kv_store_head(f->attn.kv, c->pos[t], hh, row, vrow) != HM_OK)
        atomic_fetch_or(&f->kv_fail, 1 << t);
}

/* A q/k/v item's rows [r0, r1) of matrix mi (heads_in_qkv): counted to their heads; the item
 * that completes a head runs that head's step at once, on rows still in its cache. A q head
 * needs its head_dim rows of q, a k head its rows of k and of v (its item stores both). */
static void front_qkv_rows(void *ctx, int mi, int64_t r0, int64_t r1) {
    ce_front *f = ctx;
    const hm_hparams *hp = f->c->hp;
    const int64_t hd = hp->head_dim_k, nh = hp->n_head;
    for (int64_t h = r0 / hd; h * hd < r1; h++) {
        const int64_t lo = h * hd > r0 ? h * hd : r0, hi = (h + 1) * hd < r1 ? (h + 1) * hd : r1;
        const int64_t head = mi == f->q_mi ? h : nh + h, need = mi == f->q_mi ? hd : 2 * hd;
        if (atomic_fetch_add_explicit(&f->head_rows[head], (int)(hi - lo), memory_order_acq_rel) +
                (hi - lo) == need) {
            front_head_item(f, head, 0);
            hm_spin_set(&f->head_done[head], 1); /* wakes a waiter asleep on it */
        }
    }
}

/* After the heads stage: the stored positions marked (a failed token's slot emptied, as
 * cpu_kv_store does), then attention's check that it reads only cached positions. */
static void front_heads_failed(ce_front *f) {
    const int fail = atomic_load(&f->kv_fail);
    cpu_kv_layer *kv = f->attn.kv;
    for (int t = 0; t < f->n; t++)
        if (fail >> t & 1) kv->slot_pos[f->c->pos[t] % kv->n_slots] = -1;
    if (atomic_load(&f->head_fail))
        f->st = hm_error_set(&f->err, HM_ERR_ARG, "rope: arguments refused for %s",
                             f->c->desc->name);
    else if (fail)
        f->st = hm_error_set(&f->err, HM_ERR_RANGE,
                             "KV store: K or V of position %d is not finite (q8_0 cache)",
                             f->c->pos[__builtin_ctz((unsigned)fail)]);
}

static void front_after_heads(void *ctx) {
    ce_front *f = ctx;
    cpu_kv_mark(f->attn.kv, f->c->pos[0], f->n);
    front_heads_failed(f);
    if (f->st == HM_OK) f->st = cpu_attention_begin(NULL, &f->attn, &f->err);
}

/* ---- attention inside the q/k/v stage (attn_in_qkv): the stage's items are the q/k/v items,
 * then the attention items; an attention item waits for its q heads and KV head (their rows'
 * items were all claimed before it: one counter, claimed in order, so they complete) and runs
 * while the last q/k/v items finish, instead of after a gate. Positions are marked and checked
 * before the stage (ce_front_pre); a failed K/V store empties its slot after it, as above
 * (the layer's error then stops the step). */
static void front_wait_head(ce_front *f, int h) {
    hm_spin_until(&f->head_done[h], 1);
}

static void front_qkv_attn_item(void *ctx, int64_t it, int ith) {
    ce_front *f = ctx;
    if (it < f->qkv_stage.n_items) {
        f->qkv_stage.fn(f->qkv_stage.ctx, it, ith);
        return;
    }
    it -= f->qkv_stage.n_items;
    int64_t t;
    int g, h0, h1;
    cpu_attention_item_heads(&f->attn, it, &t, &g, &h0, &h1);
    front_wait_head(f, (int)f->c->hp->n_head + g);
    for (int h = h0; h < h1; h++) front_wait_head(f, h);
    f->attn_stage.fn(f->attn_stage.ctx, it, ith);
}

static void front_qkv_attn_prefetch(void *ctx, int64_t it, const tp_gate *gate) {
    ce_front *f = ctx;
    if (it < f->qkv_stage.n_items) f->qkv_stage.prefetch(f->qkv_stage.ctx, it, gate);
    else if (f->attn_stage.prefetch)
        f->attn_stage.prefetch(f->attn_stage.ctx, it - f->qkv_stage.n_items, gate);
}

static void front_after_qkv_attn(void *ctx) {
    ce_front *f = ctx;
    front_heads_failed(f);
    if (f->st == HM_OK && !f->out_by_item) cpu_matmul_job_quantize(&f->wo, f->c->attn);
}

static tp_stage front_qkv_attn_stage(ce_front *f) {
    return (tp_stage){.fn = front_qkv_attn_item, .ctx = f,
                      .n_items = f->qkv_stage.n_items + f->attn_stage.n_items,
                      .then = front_after_qkv_attn, .then_ctx = f,
                      .prefetch = front_qkv_attn_prefetch};
}

static void front_after_attn(void *ctx) {
    ce_front *f = ctx;
    if (f->st == HM_OK) cpu_matmul_job_quantize(&f->wo, f->c->attn);
}

/* An attention item's output heads, quantised for wo by the core that wrote them. */
static void front_attn_out(void *ctx, int64_t t, int h0, int h1) {
    ce_front *f = ctx;
    const int64_t hd = f->c->hp->head_dim_v;
    cpu_matmul_job_quantize_part(&f->wo, f->c->attn, t, h0 * hd, (h1 - h0) * hd);
}

/* A wo item's rows [r0, r1): wo_finish's bias and residual add there, by the core that wrote
 * them (elementwise, so the same bytes); the FFN norm stays for the stage's `then`. */
static void front_wo_rows(void *ctx, int mi, int64_t r0, int64_t r1) {
    (void)mi;
    ce_front *f = ctx;
    const cpu_engine *c = f->c;
    const int64_t E = c->hp->n_embd;
    for (int t = 0; t < f->n; t++) {
        float *p = c->proj + t * E + r0, *x = c->x + t * E + r0;
        if (f->L->bo.data) cpu_add_bias(NULL, p, (const float *)f->L->bo.data + r0, 1, r1 - r0);
        cpu_add(NULL, x, p, x, r1 - r0);
    }
}

/* After the wo stage: the FFN norm of the whole residual row, the router's activations. */
static void front_after_wo(void *ctx) {
    ce_front *f = ctx;
    if (f->st != HM_OK) return;
    const hm_hparams *hp = f->c->hp;
    cpu_rmsnorm(NULL, f->c->x, f->L->ffn_norm.data, f->c->xn, f->n, hp->n_embd, hp->rms_eps);
    cpu_matmul_job_quantize(&f->router, f->c->xn);
}

static tp_stage stage_then(tp_stage s, void (*then)(void *), void *ctx) {
    s.then = then;
    s.then_ctx = ctx;
    return s;
}

int ce_front_plan(cpu_engine *c, int il, int n, ce_front *fp, tp_stage *stages,
                     hm_status *st, hm_error *err) {
    *fp = (ce_front){.c = c, .L = hm_model_layer(c->m, il), .n = n,
                        .rp = hm_model_rope_params(c->m), .st = HM_OK, .il = il, .epoch = 1};
    ce_front *f = fp;
    atomic_init(&f->head_fail, 0);
    atomic_init(&f->kv_fail, 0);
    *st = HM_OK;
    const hm_layer *L = f->L;
    const int nth = tp_size(c->pool);
    const hm_hparams *hp = c->hp;
    cpu_matmul_mat q[3];
    f->aa = ce_attn_args(c, il, n);
    /* with per-head (or no) q/k norms, the heads are items of a stage of their own, which also
     * store K and V (so attention stores nothing) */
    const bool by_head = c->desc->qk_norm != HM_QKNORM_FULL &&
                         hp->head_dim_k == hp->head_dim_v && c->kv[il].head_dim == hp->head_dim_k;
    if (by_head) f->aa.k_new = f->aa.v_new = NULL;
    if (n > MOE_FEW_TOK || !ce_qkv_mats(c, L, q) || !ce_mm_fits(c, &L->wq, n) ||
        !ce_mm_fits(c, &L->wo, n) || !ce_mm_fits(c, &L->router, n) ||
        cpu_attention_scratch_size(&c->kv[il], &f->aa, nth) > c->attn_scratch_size)
        return 0;
    /* one token, heads in the q/k/v stage: k and v rows first, then q's, so that the KV heads
     * are done early and the attention items of the first groups of q heads run while the last
     * q rows stream, instead of every attention item waiting for the last v rows */
    f->q_mi = 0;
    if (by_head && n == 1 && hp->n_head + hp->n_head_kv <= CE_MAX_HEADS) {
        const cpu_matmul_mat mq = q[0];
        q[0] = q[1];
        q[1] = q[2];
        q[2] = mq;
        f->q_mi = 2;
    }
    const cpu_matmul_mat o = {.wtype = L->wo.type, .w = L->wo.data, .n_rows = L->wo.ne[1],
                              .y = c->proj, .x8 = L->wo.x8};
    const cpu_matmul_mat r = {.wtype = L->router.type, .w = L->router.data,
                              .n_rows = L->router.ne[1], .y = c->router};
    void *ms = c->mm_scratch; /* every product's activations in turn */
    const size_t mss = c->mm_scratch_size;
    /* wo's activations after q/k/v's where they fit, so that attention items may write them
     * while q/k/v items still read theirs (attn_in_qkv) */
    size_t wo_at = (cpu_matmul_scratch_size(L->wq.type, L->wq.ne[0], n) + 63) / 64 * 64;
    if (wo_at + cpu_matmul_scratch_size(L->wo.type, L->wo.ne[0], n) > mss) wo_at = 0;
    *st = cpu_matmul_job_init(&f->qkv, c->kern, 3, q, L->wq.ne[0], n, nth, ms, mss, err);
    if (*st == HM_OK) *st = cpu_matmul_job_init(&f->wo, c->kern, 1, &o, L->wo.ne[0], n, nth,
                                                (uint8_t *)ms + wo_at, mss - wo_at, err);
    if (*st == HM_OK) *st = cpu_matmul_job_init(&f->router, c->kern, 1, &r, L->router.ne[0], n,
                                                nth, ms, mss, err);
    if (*st == HM_OK) *st = cpu_attention_plan(&f->attn, &c->kv[il], &f->aa, nth, c->attn_scratch,
                                               c->attn_scratch_size, err);
    if (*st != HM_OK) return 0;
    /* attention items quantise their own output heads for wo when those are whole blocks */
    const int64_t hdv = hp->head_dim_v;
    const bool out_by_item = cpu_matmul_job_part_ok(&f->wo, 0, f->attn.rep_per_sub * hdv) &&
                             cpu_matmul_job_part_ok(&f->wo, 0, f->attn.n_rep * hdv);
    f->by_head = by_head;
    f->heads_in_qkv = by_head && n == 1 && hp->n_head + hp->n_head_kv <= CE_MAX_HEADS;
    f->attn_in_qkv = f->heads_in_qkv && wo_at > 0;
    for (int64_t h = 0; f->heads_in_qkv && h < hp->n_head + hp->n_head_kv; h++) {
        atomic_init(&f->head_rows[h], 0);
        atomic_init(&f->head_done[h], 0);
    }
    if (f->heads_in_qkv) {
        f->qkv.on_rows = front_qkv_rows;
        f->qkv.on_rows_ctx = f;
    }
    f->out_by_item = out_by_item;
    if (out_by_item) {
        f->attn.on_out = front_attn_out;
        f->attn.on_out_ctx = f;
    }
    const int64_t n_heads = f->heads_in_qkv ? 0 : (int64_t)n * (hp->n_head + hp->n_head_kv);
    const tp_stage heads = {.fn = n_heads ? front_head_item : NULL, .ctx = f, .n_items = n_heads,
                            .then = front_after_heads, .then_ctx = f};
    const tp_stage qkv = cpu_matmul_job_stage(&f->qkv), attn = cpu_attention_stage(&f->attn);
    f->wo.on_rows = front_wo_rows; /* wo_finish's bias and residual add in the wo items */
    f->wo.on_rows_ctx = f;
    int ns = 0;
    if (f->attn_in_qkv) {
        f->qkv_stage = qkv;
        f->attn_stage = attn;
        f->attn_at = ns;
        stages[ns++] = front_qkv_attn_stage(f);
    } else {
        stages[ns++] = by_head ? qkv : stage_then(qkv, front_after_qkv, f);
        if (by_head) stages[ns++] = heads;
        f->attn_at = ns;
        stages[ns++] = out_by_item ? attn : stage_then(attn, front_after_attn, f);
    }
    stages[ns++] = stage_then(cpu_matmul_job_stage(&f->wo), front_after_wo, f);
    stages[ns++] = cpu_matmul_job_stage(&f->router);
    return ns;
}

int ce_front_replan(ce_front *f, int il, tp_stage *attn, hm_status *st, hm_error *err) {
    cpu_engine *c = f->c;
    const int nth = tp_size(c->pool);
    f->st = HM_OK;
    f->epoch++;
    atomic_store(&f->head_fail, 0);
    atomic_store(&f->kv_fail, 0);
    for (int64_t h = 0; f->heads_in_qkv && h < c->hp->n_head + c->hp->n_head_kv; h++) {
        atomic_store_explicit(&f->head_rows[h], 0, memory_order_relaxed);
        atomic_store_explicit(&f->head_done[h], 0, memory_order_relaxed);
    }
    f->aa = ce_attn_args(c, il, f->n);
    if (f->by_head) f->aa.k_new = f->aa.v_new = NULL;
    *st = HM_OK;
    if (cpu_attention_scratch_size(&c->kv[il], &f->aa, nth) > c->attn_scratch_size) return 0;
    *st = cpu_attention_plan(&f->attn, &c->kv[il], &f->aa, nth, c->attn_scratch,
                             c->attn_scratch_size, err);
    if (*st != HM_OK) return 1;
    const int64_t hdv = c->hp->head_dim_v;
    f->out_by_item = cpu_matmul_job_part_ok(&f->wo, 0, f->attn.rep_per_sub * hdv) &&
                     cpu_matmul_job_part_ok(&f->wo, 0, f->attn.n_rep * hdv);
    if (f->out_by_item) {
        f->attn.on_out = front_attn_out;
        f->attn.on_out_ctx = f;
    }
    if (f->attn_in_qkv) {
        f->attn_stage = cpu_attention_stage(&f->attn);
        *attn = front_qkv_attn_stage(f);
        return 1;
    }
    *attn = f->out_by_item ? cpu_attention_stage(&f->attn)
                           : stage_then(cpu_attention_stage(&f->attn), front_after_attn, f);
    return 1;
}

void ce_front_pre(ce_front *f) {
    const cpu_engine *c = f->c;
    const hm_hparams *hp = c->hp;
    if (!f->thr) { /* else each thread norms the row at its first q/k/v item */
        cpu_rmsnorm(NULL, c->x, f->L->attn_norm.data, c->xn, f->n, hp->n_embd, hp->rms_eps);
        cpu_matmul_job_quantize(&f->qkv, c->xn);
    }
    if (f->attn_in_qkv && f->st == HM_OK) { /* front_after_heads' steps before the stage */
        cpu_kv_mark(f->attn.kv, c->pos[0], f->n);
        f->st = cpu_attention_begin(NULL, &f->attn, &f->err);
    }
}

/* ---- per-thread norms (ce_front_thr) ---- */

enum { THR_TAG = 64 };

static size_t thr_align(size_t v) { return (v + 63) / 64 * 64; }

size_t ce_thr_stride(const cpu_engine *c) {
    const size_t row = thr_align((size_t)c->hp->n_embd * sizeof(float)); /* any act row fits */
    return THR_TAG + 3 * row;
}

/* Thread ith's normed row (f32, after the slot's tag). */
static float *thr_row(const ce_front *f, int ith) {
    return (float *)(void *)(f->thr->buf + (size_t)ith * f->thr->stride + THR_TAG);
}

/* Thread ith's slot: its row normed with norm (kind 0: attention, 1: FFN) for this plan of the
 * layer, made now if the slot holds another; *made says whether it was. */
static uint8_t *thr_slot(ce_front *f, int ith, int kind, const hm_tensor *norm, bool *made) {
    const cpu_engine *c = f->c;
    uint8_t *s = f->thr->buf + (size_t)ith * f->thr->stride;
    const uint64_t tag = ((f->epoch * (uint64_t)c->hp->n_layer + (uint64_t)f->il) << 1 |
                          (uint64_t)kind) + 1;
    *made = false;
    if (*(uint64_t *)(void *)s != tag) {
        cpu_rmsnorm(NULL, c->x, norm->data, thr_row(f, ith), 1, c->hp->n_embd,
                    c->hp->rms_eps);
        *(uint64_t *)(void *)s = tag;
        *made = true;
    }
    return s;
}

static const uint8_t *front_qkv_act(void *ctx, int ith) {
    ce_front *f = ctx;
    bool made;
    uint8_t *s = thr_slot(f, ith, 0, &f->L->attn_norm, &made);
    uint8_t *act = s + THR_TAG + thr_align((size_t)f->c->hp->n_embd * sizeof(float));
    const cpu_matmul_kern *mk = &f->qkv.m[0].mk;
    if (made) mk->act((const float *)(const void *)(s + THR_TAG), act, mk->k);
    return act;
}

static const uint8_t *front_router_act(void *ctx, int ith) {
    ce_front *f = ctx;
    bool made;
    uint8_t *s = thr_slot(f, ith, 1, &f->L->ffn_norm, &made);
    const cpu_matmul_kern *mk = &f->router.m[0].mk;
    if (mk->atype == QUANT_ACT_F32) return s + THR_TAG; /* the f32 activation is the row */
    uint8_t *act = s + THR_TAG + 2 * thr_align((size_t)f->c->hp->n_embd * sizeof(float));
    if (made) mk->act((const float *)(const void *)(s + THR_TAG), act, mk->k);
    return act;
}

/* A router item: the FFN input's blocks it, it + N, ... quantised from this thread's normed
 * row, then its rows of the router product (which reads the thread's activation row). */
static void front_router_item(void *ctx, int64_t it, int ith) {
    ce_front *f = ctx;
    front_router_act(f, ith);
    const float *xn = thr_row(f, ith);
    const int64_t E = f->c->hp->n_embd, B = f->ffn_blk, N = f->router_stage.n_items;
    for (int64_t b = it; b * B < E; b += N)
        f->ffn_act(xn + b * B, f->thr->xq + quant_act_row_size(f->ffn_atype, b * B), B);
    f->router_stage.fn(f->router_stage.ctx, it, ith);
}

static void front_router_prefetch(void *ctx, int64_t it, const tp_gate *gate) {
    ce_front *f = ctx;
    if (f->router_stage.prefetch) f->router_stage.prefetch(f->router_stage.ctx, it, gate);
}

bool ce_front_thr(ce_front *f, const ce_thr *thr, tp_stage *stages, int ns,
                     uint32_t ffn_wtype) {
    const cpu_engine *c = f->c;
    const int64_t E = c->hp->n_embd;
    const quant_act at = quant_act_for(ffn_wtype);
    const quant_kernels *kern = c->kern ? c->kern : quant_kernels_best();
    int64_t B = 0;
    for (int64_t b = 1; b <= 256 && !B; b *= 2)
        if (quant_act_row_size(at, b) > 0) B = b;
    if (f->n != 1 || ns < 2 || at == QUANT_ACT_COUNT || !B || E % B || !kern->act[at] ||
        f->qkv.m[0].mk.k != E || f->router.m[0].mk.k != E ||
        stages[ns - 1].ctx != (void *)&f->router || stages[ns - 2].ctx != (void *)&f->wo)
        return false;
    f->thr = thr;
    f->ffn_act = kern->act[at];
    f->ffn_atype = at;
    f->ffn_blk = B;
    f->qkv.act_for = front_qkv_act;
    f->qkv.act_for_ctx = f;
    f->router.act_for = front_router_act;
    f->router.act_for_ctx = f;
    f->router_stage = stages[ns - 1];
    stages[ns - 1].fn = front_router_item;
    stages[ns - 1].ctx = f;
    stages[ns - 1].prefetch = front_router_prefetch;
    stages[ns - 2].then = NULL; /* the router items norm the row */
    return true;
}
