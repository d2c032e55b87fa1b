/* matmul_moe.c - the grouped expert products: cpu_moe_matmul, cpu_moe_matmul_pair and the
 * one-job expert FFN cpu_moe_ffn (see matmul.h; the shared design notes are matmul.c's).
 */
#include "base/spin.h"
#include "cpu/matmul_internal.h"
#include "cpu/ops.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- grouped MoE ---- */

typedef struct {
    size_t act, pairs, counts, items, eids; /* byte offsets into scratch */
    size_t total;
} moe_layout;

static size_t mm_align(size_t v) { return (v + 63) / 64 * 64; }

static int moe_layout_get(const cpu_moe_args *a, moe_layout *l) {
    quant_act act = quant_act_for(a->wtype);
    size_t arow = act == QUANT_ACT_COUNT ? 0 : quant_act_row_size(act, a->k);
    if (arow == 0 || a->n_tok <= 0 || a->n_used <= 0 || a->n_expert <= 0) return 0;
    size_t np = (size_t)a->n_tok * (size_t)a->n_used;
    l->act = 0;
    l->pairs = mm_align(l->act + arow * np);                                 /* int32 [np] */
    l->counts = mm_align(l->pairs + np * sizeof(int32_t));                   /* int64 [n_expert + 1] */
    l->items = mm_align(l->counts + ((size_t)a->n_expert + 1) * sizeof(int64_t)); /* int64 [n_expert + 1] */
    l->eids = mm_align(l->items + ((size_t)a->n_expert + 1) * sizeof(int64_t)); /* int32 [n_expert] */
    l->total = mm_align(l->eids + (size_t)a->n_expert * sizeof(int32_t));
    return 1;
}

size_t cpu_moe_scratch_size(const cpu_moe_args *a) {
    moe_layout l;
    return moe_layout_get(a, &l) ? l.total : 0;
}

typedef struct {
    mm_kern mk, mkb;
    const cpu_moe_args *a, *b; /* b: optional second product over the same inputs */
    cpu_moe_post_fn post;
    void *post_ctx;
    /* The plan touches only the selected experts' entries: a decode step's few cache lines,
     * which the other cores read last layer (each write costs a transfer). */
    uint8_t *act;     /* [n_pairs] quantised rows, grouped by expert (act_stride apart) */
    size_t act_stride; /* bytes between grouped pairs' rows: 0 when all share row 0 (one token) */
    int32_t *pairs;   /* [n_pairs] t * n_used + s, grouped by expert */
    int32_t *eid;     /* [n_active] the selected experts' ids, increasing */
    int64_t *off;     /* [n_active + 1] first grouped pair of each selected expert */
    int64_t *item0;   /* [n_active + 1] first work item of each selected expert */
    int64_t n_pairs, n_active, chunk;
    int64_t small, small_from; /* selected experts from small_from on have items of small rows */
    quant_x8_dot_fn x8dot, x8dotb; /* quant_x8's kernel for a, b (repacked copies), or NULL */
    const quant_kernels *kern;      /* the kernel table (the x8 kernels go with it) */
} moe_job;

/* Item g of the quantisation job: the input of grouped pair g. */
static void moe_act_item(void *ctx, int64_t g, int ith) {
    (void)ith;
    const moe_job *j = ctx;
    const cpu_moe_args *a = j->a;
    const size_t k = (size_t)a->k;
    const int64_t p = j->pairs[g];
    const float *xr = a->x_per_slot ? a->x + (size_t)p * k : a->x + (size_t)(p / a->n_used) * k;
    j->mk.act(xr, j->act + (size_t)g * j->mk.arow, a->k);
}

/* The grouped pairs' activation rows. One token's pairs all read its row: it is quantised once
 * (or was, by the caller: xq) and every pair reads it (a decode step's 8 pairs cost one
 * quantisation, not 8). */
static void moe_acts(tp_pool *pool, moe_job *j) {
    const cpu_moe_args *a = j->a;
    j->act_stride = j->mk.arow;
    if (!a->x_per_slot && a->n_tok == 1) {
        if (a->xq) j->act = (uint8_t *)(uintptr_t)a->xq;
        else moe_act_item(j, 0, 0);
        j->act_stride = 0;
        return;
    }
    tp_run_items(j->n_pairs * a->k <= MM_INLINE_ACT ? NULL : pool, moe_act_item, j,
                 j->n_pairs);
}

/* Rows [r0, r1) of item c of selected expert ia (its c-th item). */
static void moe_item_rows(const moe_job *j, int64_t ia, int64_t c, int64_t *r0, int64_t *r1) {
    const int64_t n = ia < j->small_from ? j->chunk : j->small;
    *r0 = c * n;
    *r1 = *r0 + n < j->a->n_rows ? *r0 + n : j->a->n_rows;
}

/* Bytes from one expert's rows in p->w to the next (cpu_moe_args.w_stride). */
static size_t moe_w_stride(const cpu_moe_args *p, const mm_kern *mk) {
    return p->w_stride ? p->w_stride : mk->wrow * (size_t)p->n_rows;
}

/* Rows [r0, r1) of one product p (weights of selected expert ia, kernel mk, repacked copy
 * when x8dot) for the expert's grouped pairs, into p->y[pair][.]. */
static void moe_rows(const moe_job *j, const mm_kern *mk, const cpu_moe_args *p,
                     quant_x8_dot_fn x8dot, int64_t ia, int64_t r0, int64_t r1) {
    const int64_t n_rows = j->a->n_rows, g0 = j->off[ia], g1 = j->off[ia + 1], e = j->eid[ia];
    const size_t wexp = mk->wrow * (size_t)n_rows;
    const uint8_t *x8 = p->x8;
    const uint8_t *w = (const uint8_t *)p->w + (size_t)e * moe_w_stride(p, mk);
    float *y = p->y;
    if (x8dot) { /* the expert's pairs, each into its own output row */
        mm_rows_x8(x8dot, mk, x8 + (size_t)e * wexp, r0, r1, j->act + (size_t)g0 * j->act_stride,
                   j->act_stride, g1 - g0, y, (size_t)n_rows, j->pairs + g0);
        return;
    }
    float tmp[MM_TOK_TILE * MM_MAX_CHUNK]; /* [tok][row] of one token tile */
    for (int64_t t0 = g0; t0 < g1; t0 += MM_TOK_TILE) {
        int64_t nc = g1 - t0 < MM_TOK_TILE ? g1 - t0 : MM_TOK_TILE;
        if (j->act_stride == 0) { /* shared row: the dot tiles want one row per pair */
            mm_rows(mk, w, r0, r1, j->act, 1, tmp, (size_t)(r1 - r0));
            for (int64_t c = 1; c < nc; c++)
                memcpy(tmp + (size_t)c * (size_t)(r1 - r0), tmp, (size_t)(r1 - r0) * sizeof(float));
        } else {
            mm_rows(mk, w, r0, r1, j->act + (size_t)t0 * j->act_stride, nc, tmp,
                    (size_t)(r1 - r0));
        }
        for (int64_t c = 0; c < nc; c++)
            memcpy(y + (size_t)j->pairs[t0 + c] * (size_t)n_rows + (size_t)r0,
                   tmp + (size_t)c * (size_t)(r1 - r0), (size_t)(r1 - r0) * sizeof(float));
    }
}

/* The selected expert ia with item0[ia] <= it < item0[ia + 1]. */
static int64_t item_active(const moe_job *j, int64_t it) {
    int64_t lo = 0, hi = j->n_active;
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (j->item0[mid] <= it) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Item it of the product job: one chunk of rows of one selected expert, every pair of it (both
 * products of a pair, then the caller's post on those rows). */
/* Rows [r0, r1) of both products of a pair from their repacked copies, for selected expert ia's
 * few pairs: a group of 8 rows of one, then the same of the other, so that the two weight
 * streams advance together (each prefetched ahead by the kernel) instead of the second one
 * starting cold halfway through the item. Each row's product is the same call as moe_rows'. */
static void moe_rows_x8_pair(const moe_job *j, int64_t ia, int64_t r0, int64_t r1) {
    const cpu_moe_args *a = j->a, *b = j->b;
    const int64_t n_rows = a->n_rows, e = j->eid[ia];
    const uint8_t *wa = a->x8 + (size_t)e * j->mk.wrow * (size_t)n_rows;
    const uint8_t *wb = b->x8 + (size_t)e * j->mkb.wrow * (size_t)n_rows;
    for (int64_t r = r0; r < r1; r += QUANT_X8_ROWS)
        for (int64_t g = j->off[ia]; g < j->off[ia + 1]; g++) {
            const uint8_t *act = j->act + (size_t)g * j->act_stride;
            const size_t o = (size_t)j->pairs[g] * (size_t)n_rows + (size_t)r;
            j->x8dot(j->mk.k, wa + (size_t)r * j->mk.wrow, act, 0, 1, a->y + o);
            j->x8dotb(j->mkb.k, wb + (size_t)r * j->mkb.wrow, act, 0, 1, b->y + o);
        }
}

static void moe_item(void *ctx, int64_t it, int ith) {
    (void)ith;
    const moe_job *j = ctx;
    const cpu_moe_args *a = j->a;
    const int64_t ia = item_active(j, it);
    int64_t r0, r1;
    moe_item_rows(j, ia, it - j->item0[ia], &r0, &r1);
    if (j->b && j->x8dot && j->x8dotb && j->off[ia + 1] - j->off[ia] <= MM_X8_PAIR_MAX) {
        moe_rows_x8_pair(j, ia, r0, r1);
    } else {
        moe_rows(j, &j->mk, a, j->x8dot, ia, r0, r1);
        if (!j->b) return;
        moe_rows(j, &j->mkb, j->b, j->x8dotb, ia, r0, r1);
    }
    if (j->post)
        for (int64_t g = j->off[ia]; g < j->off[ia + 1]; g++) j->post(j->post_ctx, j->pairs[g], r0, r1);
}

hm_status cpu_moe_matmul(tp_pool *pool, const quant_kernels *kern, const cpu_moe_args *a,
                         void *scratch, size_t scratch_size, hm_error *err) {
    return cpu_moe_matmul_pair(pool, kern, a, NULL, NULL, NULL, scratch, scratch_size, err);
}

/* Kernels, pair compatibility, layout and expert ids of a grouped product (j: mk, mkb, b,
 * post). */
static hm_status moe_check(const quant_kernels *kern, const cpu_moe_args *a,
                           const cpu_moe_args *b, cpu_moe_post_fn post, void *post_ctx,
                           moe_job *j, moe_layout *l, hm_error *err) {
    memset(j, 0, sizeof(*j));
    j->kern = kern;
    hm_status st = mm_kern_init(kern, a->wtype, a->k, &j->mk, err);
    if (st != HM_OK) return st;
    if (b) {
        st = mm_kern_init(kern, b->wtype, b->k, &j->mkb, err);
        if (st != HM_OK) return st;
        if (b->k != a->k || b->n_rows != a->n_rows || b->n_expert != a->n_expert ||
            b->x != a->x || b->x_per_slot != a->x_per_slot || b->ids != a->ids ||
            b->n_tok != a->n_tok || b->n_used != a->n_used ||
            quant_act_for(b->wtype) != quant_act_for(a->wtype))
            return hm_error_set(err, HM_ERR_ARG, "moe matmul: the two products of a pair must "
                                "share inputs, shapes and activation format");
        j->b = b;
    }
    j->post = post;
    j->post_ctx = post_ctx;
    if (a->n_rows <= 0 || !moe_layout_get(a, l))
        return hm_error_set(err, HM_ERR_ARG, "moe matmul: empty product (%lld experts, %lld rows, %lld tokens, %d used)",
                            (long long)a->n_expert, (long long)a->n_rows, (long long)a->n_tok, a->n_used);
    const int64_t np = a->n_tok * a->n_used;
    if (np > INT32_MAX)
        return hm_error_set(err, HM_ERR_RANGE, "moe matmul: %lld (token, slot) pairs exceed 2^31", (long long)np);
    for (int64_t p = 0; p < np; p++)
        if (a->ids[p] >= a->n_expert)
            return hm_error_set(err, HM_ERR_RANGE, "moe matmul: token %lld slot %lld selects expert %d of %lld",
                                (long long)(p / a->n_used), (long long)(p % a->n_used), a->ids[p],
                                (long long)a->n_expert);
    return HM_OK;
}

static void moe_number_items(moe_job *j);

/* Points j into scratch s (layout l), groups the pairs by expert (skipped slots, id < 0, drop
 * out; within an expert the pairs keep their order) and numbers the work items. A decode step's
 * few pairs are sorted in place; many go by a counting sort over every expert. */
static void moe_plan(moe_job *j, const cpu_moe_args *a, const moe_layout *l, uint8_t *s, int nth) {
    const int64_t np = a->n_tok * a->n_used;
    j->a = a;
    j->act = s + l->act;
    j->act_stride = j->mk.arow;
    j->pairs = (int32_t *)(void *)(s + l->pairs);
    j->off = (int64_t *)(void *)(s + l->counts);
    j->item0 = (int64_t *)(void *)(s + l->items);
    j->eid = (int32_t *)(void *)(s + l->eids);
    j->x8dot = mm_x8_pick(j->kern, a->x8, a->wtype, a->n_rows);
    j->x8dotb = j->b ? mm_x8_pick(j->kern, j->b->x8, j->b->wtype, j->b->n_rows) : NULL;
    int64_t n = 0;
    if (np <= 64) { /* insertion sort by id, stable */
        for (int64_t p = 0; p < np; p++) {
            const int32_t id = a->ids[p];
            if (id < 0) continue;
            int64_t i = n++;
            for (; i > 0 && a->ids[j->pairs[i - 1]] > id; i--) j->pairs[i] = j->pairs[i - 1];
            j->pairs[i] = (int32_t)p;
        }
    } else { /* counting sort; item0 holds the per-expert counts, then the insertion cursors */
        int64_t *cnt = j->item0;
        memset(cnt, 0, ((size_t)a->n_expert + 1) * sizeof(int64_t));
        for (int64_t p = 0; p < np; p++)
            if (a->ids[p] >= 0) cnt[a->ids[p] + 1]++;
        for (int64_t e = 0; e < a->n_expert; e++) cnt[e + 1] += cnt[e];
        for (int64_t p = 0; p < np; p++)
            if (a->ids[p] >= 0) j->pairs[cnt[a->ids[p]]++] = (int32_t)p;
        n = cnt[a->n_expert];
    }
    j->n_pairs = n;
    j->n_active = 0;
    for (int64_t g = 0; g < n; g++) /* the selected experts and where their pairs start */
        if (g == 0 || a->ids[j->pairs[g]] != a->ids[j->pairs[g - 1]]) {
            j->eid[j->n_active] = a->ids[j->pairs[g]];
            j->off[j->n_active++] = g;
        }
    j->off[j->n_active] = n;
    j->chunk = j->small = mm_chunk_rows((j->b ? 2 : 1) * j->n_active * a->n_rows, nth);
    j->small_from = j->n_active;
    moe_number_items(j);
}

/* item0 from n_active, chunk, small and small_from. */
static void moe_number_items(moe_job *j) {
    const int64_t n_rows = j->a->n_rows;
    j->item0[0] = 0;
    for (int64_t ia = 0; ia < j->n_active; ia++) {
        const int64_t c = ia < j->small_from ? j->chunk : j->small;
        j->item0[ia + 1] = j->item0[ia] + (n_rows + c - 1) / c;
    }
}

hm_status cpu_moe_matmul_pair(tp_pool *pool, const quant_kernels *kern, const cpu_moe_args *a,
                              const cpu_moe_args *b, cpu_moe_post_fn post, void *post_ctx,
                              void *scratch, size_t scratch_size, hm_error *err) {
    moe_job j;
    moe_layout l;
    hm_status st = moe_check(mm_default_kern(kern), a, b, post, post_ctx, &j, &l, err);
    if (st != HM_OK) return st;
    void *own = NULL;
    if (!scratch) {
        scratch = own = malloc(l.total);
        if (!own) return hm_error_set(err, HM_ERR_NOMEM, "moe matmul: out of memory (%zu bytes)", l.total);
    } else if (scratch_size < l.total) {
        return hm_error_set(err, HM_ERR_ARG, "moe matmul: scratch of %zu bytes, %zu needed", scratch_size, l.total);
    }
    moe_plan(&j, a, &l, scratch, tp_size(pool));
    if (j.n_pairs > 0) {
        moe_acts(pool, &j);
        tp_run_items(pool, moe_item, &j, j.item0[j.n_active]);
    }
    free(own);
    return HM_OK;
}

/* ---- the whole expert FFN in one job ---- */

struct cpu_moe_ffn_job {
    moe_job gu, dn;       /* gate/up pair (with its post) and down */
    atomic_llong *done;   /* [n_active] gate/up items finished, per selected expert */
    atomic_int *ready;    /* [n_active] 1 once the expert's down inputs are quantised */
    int64_t per_expert;   /* gate/up items of a selected expert */
    const cpu_moe_sum *sum;
    atomic_int *chunk_done; /* [down row chunks] down items finished (with sum) */
    int n_active;           /* experts with pairs: down items per row chunk */
    int64_t n_items;
};
typedef cpu_moe_ffn_job ffn_job;

/* Rows [r0, r1) of every token's slot sum, once every slot's down rows there are done. */
static void ffn_sum_rows(const ffn_job *f, int64_t r0, int64_t r1) {
    const cpu_moe_args *d = f->dn.a;
    const cpu_moe_sum *sm = f->sum;
    const int64_t n = d->n_rows;
    for (int64_t t = 0; t < d->n_tok; t++) {
        float *ys = d->y + (size_t)(t * d->n_used) * (size_t)n;
        const int32_t *ids = d->ids + t * d->n_used;
        if (sm->bias)
            for (int s = 0; s < d->n_used; s++)
                if (ids[s] >= 0)
                    cpu_add_bias(NULL, ys + (size_t)s * (size_t)n + r0,
                                 sm->bias + (size_t)ids[s] * (size_t)n + r0, 1, r1 - r0);
        float *out = sm->out + (size_t)t * (size_t)n;
        cpu_moe_combine_rows(ys, sm->w + t * d->n_used, ids, d->n_used, n, r0, r1, out);
        if (sm->residual) {
            float *x = sm->residual + (size_t)t * (size_t)n + r0;
            cpu_add(NULL, x, out + r0, x, r1 - r0);
        }
    }
}

static void ffn_item(void *ctx, int64_t it, int ith) {
    ffn_job *f = ctx;
    const int64_t G = f->gu.item0[f->gu.n_active];
    if (it < G) {
        moe_item(&f->gu, it, ith);
        const int64_t e = item_active(&f->gu, it); /* the same selected experts as dn's */
        if (atomic_fetch_add_explicit(&f->done[e], 1, memory_order_acq_rel) + 1 == f->per_expert) {
            /* the expert's last gate/up item: every activation row of its pairs is complete */
            for (int64_t g = f->dn.off[e]; g < f->dn.off[e + 1]; g++) moe_act_item(&f->dn, g, ith);
            hm_spin_set(&f->ready[e], 1); /* wakes a down item asleep on it */
        }
        return;
    }
    /* a down item: its expert's gate/up items were all claimed before it (one counter, claimed
     * in order), so they complete; wait for them */
    const int64_t id = it - G, e = item_active(&f->dn, id);
    hm_spin_until(&f->ready[e], 1);
    moe_item(&f->dn, id, ith);
    if (!f->sum) return;
    /* its rows' cells of dn.small rows: each sums once every active expert's rows there are */
    int64_t r0, r1;
    moe_item_rows(&f->dn, e, id - f->dn.item0[e], &r0, &r1);
    const int64_t n = f->dn.small, n_rows = f->dn.a->n_rows;
    for (int64_t c = r0 / n; c * n < r1; c++)
        if (atomic_fetch_add_explicit(&f->chunk_done[c], 1, memory_order_acq_rel) + 1 == f->n_active)
            ffn_sum_rows(f, c * n, (c + 1) * n < n_rows ? (c + 1) * n : n_rows);
}

/* scratch: gate/up layout, down layout, done[n_expert], ready[n_expert], chunk_done[down rows /
 * MM_ROW_ALIGN + 1] (row chunks are whole MM_ROW_ALIGN groups) */
static size_t ffn_scratch(const moe_layout *lg, const moe_layout *ld, int64_t n_expert,
                          int64_t down_rows, size_t *o_dn, size_t *o_done, size_t *o_ready,
                          size_t *o_chunks) {
    *o_dn = lg->total;
    *o_done = mm_align(*o_dn + ld->total);
    *o_ready = mm_align(*o_done + (size_t)n_expert * sizeof(atomic_llong));
    *o_chunks = mm_align(*o_ready + (size_t)n_expert * sizeof(atomic_int));
    return mm_align(*o_chunks + (size_t)(down_rows / MM_ROW_ALIGN + 1) * sizeof(atomic_int));
}

size_t cpu_moe_ffn_scratch_size(const cpu_moe_args *gate, const cpu_moe_args *down) {
    moe_layout lg, ld;
    if (!moe_layout_get(gate, &lg) || !moe_layout_get(down, &ld)) return 0;
    size_t a, b, c, d;
    return ffn_scratch(&lg, &ld, gate->n_expert, down->n_rows, &a, &b, &c, &d);
}

/* The down product's item sizes from the plain chunk: big items, then the last active expert's
 * in small ones (the job's tail); big is a whole number of small cells (the slot sum's unit). */
static void ffn_down_sizes(int64_t chunk, int64_t *big, int64_t *small) {
    const int64_t sm = chunk / 2 / MM_ROW_ALIGN * MM_ROW_ALIGN;
    *small = sm < MM_ROW_ALIGN ? MM_ROW_ALIGN : sm;
    const int64_t mult = MM_MAX_CHUNK / *small;
    *big = *small * (mult < 1 ? 1 : mult > 4 ? 4 : mult);
}

size_t cpu_moe_ffn_job_size(void) { return sizeof(cpu_moe_ffn_job); }

int64_t cpu_moe_ffn_job_items(const cpu_moe_args *gate, const cpu_moe_args *up,
                              const cpu_moe_args *down, int64_t n_active, int nth) {
    if (n_active <= 0) return 0;
    const int64_t cg = mm_chunk_rows((up ? 2 : 1) * n_active * gate->n_rows, nth);
    int64_t big, small;
    ffn_down_sizes(mm_chunk_rows(n_active * down->n_rows, nth), &big, &small);
    return n_active * ((gate->n_rows + cg - 1) / cg) +
           (n_active - 1) * ((down->n_rows + big - 1) / big) + (down->n_rows + small - 1) / small;
}

hm_status cpu_moe_ffn_job_init(cpu_moe_ffn_job *j, const quant_kernels *kern,
                               const cpu_moe_args *gate, const cpu_moe_args *up,
                               cpu_moe_post_fn post, void *post_ctx, const cpu_moe_args *down,
                               const cpu_moe_sum *sum, void *scratch, size_t scratch_size,
                               int nth, hm_error *err) {
    kern = mm_default_kern(kern);
    memset(j, 0, sizeof(*j));
    ffn_job *f = j;
    f->sum = sum;
    moe_layout lg, ld;
    hm_status st = moe_check(kern, gate, up, post, post_ctx, &f->gu, &lg, err);
    if (st == HM_OK) st = moe_check(kern, down, NULL, NULL, NULL, &f->dn, &ld, err);
    if (st != HM_OK) return st;
    if (!down->x_per_slot || down->x != gate->y || down->ids != gate->ids ||
        down->n_tok != gate->n_tok || down->n_used != gate->n_used ||
        down->n_expert != gate->n_expert || down->k != gate->n_rows)
        return hm_error_set(err, HM_ERR_ARG, "moe ffn: down must read the gate product per slot "
                            "(same ids, tokens, experts; k = the gate's rows)");
    if (sum && (!sum->w || !sum->out))
        return hm_error_set(err, HM_ERR_ARG, "moe ffn: a slot sum needs weights and an output");
    size_t o_dn, o_done, o_ready, o_chunks;
    const size_t need = ffn_scratch(&lg, &ld, gate->n_expert, down->n_rows, &o_dn, &o_done,
                                    &o_ready, &o_chunks);
    if (!scratch || scratch_size < need)
        return hm_error_set(err, HM_ERR_ARG, "moe ffn: scratch of %zu bytes, %zu needed", scratch_size, need);
    uint8_t *s = scratch;
    moe_plan(&f->gu, gate, &lg, s, nth);
    moe_plan(&f->dn, down, &ld, s + o_dn, nth);
    ffn_down_sizes(f->dn.chunk, &f->dn.chunk, &f->dn.small);
    f->dn.small_from = f->dn.n_active - 1; /* the last selected expert's items are small */
    moe_number_items(&f->dn);
    f->done = (atomic_llong *)(void *)(s + o_done);
    f->ready = (atomic_int *)(void *)(s + o_ready);
    f->chunk_done = (atomic_int *)(void *)(s + o_chunks);
    f->n_active = (int)f->dn.n_active;
    f->per_expert = (gate->n_rows + f->gu.chunk - 1) / f->gu.chunk;
    if (f->gu.n_pairs > 0) f->n_items = f->gu.item0[f->gu.n_active] + f->dn.item0[f->dn.n_active];
    return HM_OK;
}

void cpu_moe_ffn_job_inputs(cpu_moe_ffn_job *j, tp_pool *act_pool) {
    ffn_job *f = j;
    for (int64_t e = 0; e < f->n_active; e++) {
        atomic_init(&f->done[e], 0);
        atomic_init(&f->ready[e], 0);
    }
    const int64_t n = f->dn.a->n_rows;
    for (int64_t c = 0; c * f->dn.small < n; c++) atomic_init(&f->chunk_done[c], 0);
    if (f->gu.n_pairs > 0) moe_acts(act_pool, &f->gu);
    else if (f->sum) ffn_sum_rows(f, 0, n); /* no slot ran: a sum of nothing */
}

/* Rows [r0, r1) of one product of selected expert ia (its repacked copy when the job uses it)
 * into L2, until the gate opens. */
static bool moe_prefetch_rows(const moe_job *j, const cpu_moe_args *a, const mm_kern *mk,
                              quant_x8_dot_fn x8dot, int64_t ia, int64_t r0, int64_t r1,
                              const tp_gate *gate) {
    const size_t e = (size_t)j->eid[ia], row0 = (size_t)r0 * mk->wrow;
    const uint8_t *w = x8dot ? (const uint8_t *)a->x8 + e * mk->wrow * (size_t)a->n_rows + row0
                             : (const uint8_t *)a->w + e * moe_w_stride(a, mk) + row0;
    return mm_prefetch_until(w, (size_t)(r1 - r0) * mk->wrow, gate);
}

void cpu_moe_ffn_job_prefetch(const cpu_moe_ffn_job *j, int64_t it, const tp_gate *gate) {
    const ffn_job *f = j;
    const int64_t G = f->gu.item0[f->gu.n_active];
    if (it < 0 || it >= f->n_items) return;
    const moe_job *m = it < G ? &f->gu : &f->dn;
    const int64_t i = it < G ? it : it - G, ia = item_active(m, i);
    int64_t r0, r1;
    moe_item_rows(m, ia, i - m->item0[ia], &r0, &r1);
    if (moe_prefetch_rows(m, m->a, &m->mk, m->x8dot, ia, r0, r1, gate) && m->b)
        moe_prefetch_rows(m, m->b, &m->mkb, m->x8dotb, ia, r0, r1, gate);
}

int64_t cpu_moe_ffn_job_n_items(const cpu_moe_ffn_job *j) { return j->n_items; }

tp_stage cpu_moe_ffn_job_stage(cpu_moe_ffn_job *j) {
    return (tp_stage){.fn = ffn_item, .ctx = j, .n_items = j->n_items};
}

hm_status cpu_moe_ffn(tp_pool *pool, const quant_kernels *kern, const cpu_moe_args *gate,
                      const cpu_moe_args *up, cpu_moe_post_fn post, void *post_ctx,
                      const cpu_moe_args *down, const cpu_moe_sum *sum, void *scratch,
                      size_t scratch_size, hm_error *err) {
    void *own = NULL;
    if (!scratch) {
        scratch_size = cpu_moe_ffn_scratch_size(gate, down);
        scratch = own = malloc(scratch_size ? scratch_size : 1);
        if (!own) return hm_error_set(err, HM_ERR_NOMEM, "moe ffn: out of memory (%zu bytes)", scratch_size);
    }
    cpu_moe_ffn_job f;
    hm_status st = cpu_moe_ffn_job_init(&f, kern, gate, up, post, post_ctx, down, sum, scratch,
                                        scratch_size, tp_size(pool), err);
    if (st == HM_OK) cpu_moe_ffn_job_inputs(&f, pool);
    if (st == HM_OK && f.n_items > 0) tp_run_items(pool, ffn_item, &f, f.n_items);
    free(own);
    return st;
}
