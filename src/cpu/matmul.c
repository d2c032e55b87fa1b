/* matmul.c - cpu_matmul and cpu_moe_matmul (see matmul.h).
 *
 * DESIGN: two item jobs on the pool per call (tp_run_items: finished when the items are, so a
 * descheduled thread delays nothing unless it holds an item): (1) the activation rows are
 * quantised into scratch (a few rows by the calling thread alone, cheaper than a job);
 * (2) threads claim work items one at a time. A work item is a chunk of MM_ROW_ALIGN-aligned weight rows (of one expert for MoE);
 * inside it, tokens go in tiles of MM_TOK_TILE and rows in groups of MM_NR, each one call of
 * the kernel table's tile function: the MM_NR weight rows stay in L1/L2 while the tile's
 * tokens pass, the token tile's activations stay in L2 while the chunk's rows pass. Chunks are sized so
 * that there are several per thread (load balance) but never below MM_NR rows. For MoE the
 * caller thread first groups (token, slot) pairs by expert (counting sort), phase 1 quantises
 * each pair's input into its grouped position, and phase 2's items are (expert, row chunk) over
 * all selected experts; results go through a small per-item buffer to y[t][s][.].
 * Fused forms for decode, where every pool job costs a dispatch, a barrier and a tail:
 * cpu_matmul_multi shares one quantised input and one item counter among up to 4 matrices
 * (q/k/v), cpu_moe_matmul_pair computes the same rows of two expert products (gate/up) in one
 * item and lets the caller finish those rows (bias, activation) before the job ends;
 * cpu_matmul_job_* are cpu_matmul_multi's steps (plan, quantise, rows) for a caller that chains
 * products and the steps between them in one staged job (tp_run_stages).
 */
#include "cpu/matmul.h"
#include "cpu/ops.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { MM_NR = 16, MM_TOK_TILE = 16, MM_ROW_ALIGN = QUANT_X8_ROWS, MM_MAX_CHUNK = 256 };

/* Repacked weights (quant_x8.h) are used for products of at most this many activation rows per
 * matrix (decode); larger batches keep the dot tiles, which hold a token tile in cache. */
enum { MM_X8_MAX_ROWS = 4 };

/* Activations of at most this many elements are quantised by the calling thread before the
 * job starts (a decode step's one row, or its n_used expert rows): cheaper than the barrier
 * that a parallel quantisation phase needs. */
enum { MM_INLINE_ACT = 16384 };

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MM_RELAX() _mm_pause()
#else
#define MM_RELAX() ((void)0)
#endif

typedef cpu_matmul_kern mm_kern;

static hm_status mm_kern_init(const quant_kernels *kern, uint32_t wtype, int64_t k, mm_kern *mk,
                              hm_error *err) {
    const hm_type_info *ti = hm_type_get(wtype);
    quant_act act = quant_act_for(wtype);
    if (!ti || act == QUANT_ACT_COUNT || !kern->dot[wtype] || !kern->act[act])
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "matmul: unsupported weight type %s",
                            hm_type_name(wtype));
    mk->dot = kern->dot[wtype];
    mk->act = kern->act[act];
    mk->atype = act;
    mk->k = k;
    mk->wrow = hm_row_size(wtype, k);
    mk->arow = quant_act_row_size(act, k);
    if (k <= 0 || mk->wrow == 0 || mk->arow == 0)
        return hm_error_set(err, HM_ERR_ARG, "matmul: row length %lld is not a multiple of %s's block",
                            (long long)k, hm_type_name(wtype));
    return HM_OK;
}

/* Rows [r0, r1) of w against nc activation rows: out[c * ostride + (r - r0)]. */
static void mm_rows(const mm_kern *mk, const uint8_t *w, int64_t r0, int64_t r1,
                    const uint8_t *act, int64_t nc, float *out, size_t ostride) {
    for (int64_t c0 = 0; c0 < nc; c0 += MM_TOK_TILE) {
        int tc = (int)(nc - c0 < MM_TOK_TILE ? nc - c0 : MM_TOK_TILE);
        /* one token: no tile to keep in cache, so the whole chunk is one call (the tile
         * function's per-call activation preparation is then paid once per chunk) */
        const int64_t step = tc == 1 ? r1 - r0 : MM_NR;
        for (int64_t r = r0; r < r1; r += step) {
            int nr = (int)(r1 - r < step ? r1 - r : step);
            mk->dot(mk->k, w + (size_t)r * mk->wrow, mk->wrow, nr, act + (size_t)c0 * mk->arow,
                    mk->arow, tc, out + (size_t)c0 * ostride + (size_t)(r - r0), ostride);
        }
    }
}

static int64_t mm_chunk_rows(int64_t total_rows, int nth) {
    int64_t c = total_rows / ((int64_t)nth * 8);
    if (c > MM_MAX_CHUNK) c = MM_MAX_CHUNK;
    c = c / MM_ROW_ALIGN * MM_ROW_ALIGN;
    return c < MM_ROW_ALIGN ? MM_ROW_ALIGN : c;
}

static const quant_kernels *mm_default_kern(const quant_kernels *kern) {
    return kern ? kern : quant_kernels_best();
}

/* ---- dense ---- */

size_t cpu_matmul_scratch_size(uint32_t wtype, int64_t k, int64_t n_tok) {
    quant_act act = quant_act_for(wtype);
    size_t arow = act == QUANT_ACT_COUNT ? 0 : quant_act_row_size(act, k);
    if (arow == 0 || n_tok <= 0) return 0;
    return arow * (size_t)n_tok;
}
/* The same as mm_rows from the repacked copy x8 of w (rows r0, r1 whole groups of 8): each
 * group of 8 rows is one quant_x8 product per activation row, the group in L1 across them. */
static void mm_rows_x8(quant_x8_dot_fn x8dot, const mm_kern *mk, const uint8_t *x8, int64_t r0,
                       int64_t r1, const uint8_t *act, int64_t nc, float *out, size_t ostride) {
    for (int64_t r = r0; r < r1; r += QUANT_X8_ROWS)
        for (int64_t c = 0; c < nc; c++)
            x8dot(mk->k, x8 + (size_t)r * mk->wrow, act + (size_t)c * mk->arow,
                  out + (size_t)c * ostride + (size_t)(r - r0));
}

/* quant_x8's kernel for a product of n_act activation rows over n_rows rows of wtype with a
 * repacked copy x8, or NULL when the dot tiles serve (no copy, a batch, rows not in groups). */
static quant_x8_dot_fn mm_x8_pick(const void *x8, uint32_t wtype, int64_t n_rows, int64_t n_act) {
    return x8 && n_act <= MM_X8_MAX_ROWS && n_rows % QUANT_X8_ROWS == 0
               ? quant_x8_dot_get(wtype) : NULL;
}

typedef cpu_matmul_part mm_mat;
typedef cpu_matmul_job mm_job;

/* Item t of the quantisation job: activation row t. */
static void mm_act_item(void *ctx, int64_t t, int ith) {
    (void)ith;
    const mm_job *j = ctx;
    const mm_kern *mk0 = &j->m[0].mk;
    mk0->act(j->x + (size_t)t * (size_t)mk0->k, j->act + (size_t)t * mk0->arow, mk0->k);
}

/* Item it of a product job: matrix *m's rows [r0, r1). */
static const mm_mat *mm_item_rows(const mm_job *j, int64_t it, int64_t *r0, int64_t *r1) {
    int mi = j->n_mat - 1;
    while (j->m[mi].item0 > it) mi--;
    const mm_mat *m = &j->m[mi];
    *r0 = (it - m->item0) * m->chunk;
    *r1 = *r0 + m->chunk < m->n_rows ? *r0 + m->chunk : m->n_rows;
    return m;
}

/* Item it of the product job: one chunk of rows of one matrix against every token. */
static void mm_item(void *ctx, int64_t it, int ith) {
    (void)ith;
    const mm_job *j = ctx;
    int64_t r0, r1;
    const mm_mat *m = mm_item_rows(j, it, &r0, &r1);
    if (m->x8dot)
        mm_rows_x8(m->x8dot, &m->mk, m->x8, r0, r1, j->act, j->n_tok, m->y + r0, (size_t)m->n_rows);
    else
        mm_rows(&m->mk, m->w, r0, r1, j->act, j->n_tok, m->y + r0, (size_t)m->n_rows);
    if (j->on_rows) j->on_rows(j->on_rows_ctx, (int)(m - j->m), r0, r1);
}

/* The weight rows of item it into the calling core's L2 (prefetcht1): the thread runs the item
 * once its stage opens, so the stream of weights need not stop at the stage's gate. */
static void mm_item_prefetch(void *ctx, int64_t it) {
    int64_t r0, r1;
    const mm_mat *m = mm_item_rows(ctx, it, &r0, &r1);
    const uint8_t *w = (m->x8dot ? m->x8 : m->w) + (size_t)r0 * m->mk.wrow; /* a group: 8 rows */
    const size_t bytes = (size_t)(r1 - r0) * m->mk.wrow;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(w + o, 0, 2);
}

hm_status cpu_matmul_job_init(mm_job *j, const quant_kernels *kern, int n_mat,
                              const cpu_matmul_mat *mats, int64_t k, int64_t n_tok, int nth,
                              void *scratch, size_t scratch_size, hm_error *err) {
    memset(j, 0, sizeof(*j));
    kern = mm_default_kern(kern);
    if (n_mat < 1 || n_mat > CPU_MATMUL_MAX_MULTI)
        return hm_error_set(err, HM_ERR_ARG, "matmul: %d matrices in one call (1 to %d)", n_mat,
                            CPU_MATMUL_MAX_MULTI);
    if (n_tok <= 0)
        return hm_error_set(err, HM_ERR_ARG, "matmul: empty product (%lld tokens)", (long long)n_tok);
    int64_t total_rows = 0;
    for (int i = 0; i < n_mat; i++) {
        hm_status st = mm_kern_init(kern, mats[i].wtype, k, &j->m[i].mk, err);
        if (st != HM_OK) return st;
        if (mats[i].n_rows <= 0)
            return hm_error_set(err, HM_ERR_ARG, "matmul: empty product (%lld rows, %lld tokens)",
                                (long long)mats[i].n_rows, (long long)n_tok);
        if (quant_act_for(mats[i].wtype) != quant_act_for(mats[0].wtype))
            return hm_error_set(err, HM_ERR_ARG, "matmul: %s and %s do not share an activation "
                                "format", hm_type_name(mats[0].wtype), hm_type_name(mats[i].wtype));
        total_rows += mats[i].n_rows;
    }
    size_t need = cpu_matmul_scratch_size(mats[0].wtype, k, n_tok);
    if (!scratch || scratch_size < need)
        return hm_error_set(err, HM_ERR_ARG, "matmul: scratch of %zu bytes, %zu needed", scratch_size, need);
    /* one chunk size for all matrices, from their total: the items are of similar cost */
    const int64_t chunk = mm_chunk_rows(total_rows, nth);
    for (int i = 0; i < n_mat; i++) {
        j->m[i].w = mats[i].w;
        j->m[i].n_rows = mats[i].n_rows;
        j->m[i].y = mats[i].y;
        j->m[i].x8 = mats[i].x8;
        j->m[i].x8dot = mm_x8_pick(mats[i].x8, mats[i].wtype, mats[i].n_rows, n_tok);
        j->m[i].chunk = chunk;
        j->m[i].item0 = j->n_items;
        j->n_items += (mats[i].n_rows + chunk - 1) / chunk;
    }
    j->n_mat = n_mat;
    j->n_tok = n_tok;
    j->act = scratch;
    return HM_OK;
}

void cpu_matmul_job_quantize(mm_job *j, const float *x) {
    j->x = x;
    for (int64_t t = 0; t < j->n_tok; t++) mm_act_item(j, t, 0);
}

bool cpu_matmul_job_part_ok(const mm_job *j, int64_t i0, int64_t n) {
    const mm_kern *mk = &j->m[0].mk;
    return i0 >= 0 && n > 0 && i0 + n <= mk->k && quant_act_row_size(mk->atype, n) > 0 &&
           (i0 == 0 || quant_act_row_size(mk->atype, i0) > 0);
}

void cpu_matmul_job_quantize_part(mm_job *j, const float *x, int64_t t, int64_t i0, int64_t n) {
    const mm_kern *mk = &j->m[0].mk;
    mk->act(x + (size_t)t * (size_t)mk->k + i0,
            j->act + (size_t)t * mk->arow + quant_act_row_size(mk->atype, i0), n);
}

tp_stage cpu_matmul_job_stage(mm_job *j) {
    return (tp_stage){.fn = mm_item, .ctx = j, .n_items = j->n_items, .prefetch = mm_item_prefetch};
}

hm_status cpu_matmul_multi(tp_pool *pool, const quant_kernels *kern, int n_mat,
                           const cpu_matmul_mat *mats, int64_t k, const float *x, int64_t n_tok,
                           void *scratch, size_t scratch_size, hm_error *err) {
    void *own = NULL;
    if (!scratch && n_mat >= 1 && n_tok > 0) {
        scratch_size = cpu_matmul_scratch_size(mats[0].wtype, k, n_tok);
        scratch = own = malloc(scratch_size ? scratch_size : 1);
        if (!own)
            return hm_error_set(err, HM_ERR_NOMEM, "matmul: out of memory (%zu bytes)", scratch_size);
    }
    mm_job j;
    hm_status st = cpu_matmul_job_init(&j, kern, n_mat, mats, k, n_tok, tp_size(pool), scratch,
                                       scratch_size, err);
    if (st == HM_OK) {
        j.x = x;
        tp_run_items(n_tok * k <= MM_INLINE_ACT ? NULL : pool, mm_act_item, &j, n_tok);
        tp_run_items(pool, mm_item, &j, j.n_items);
    }
    free(own);
    return st;
}

hm_status cpu_matmul(tp_pool *pool, const quant_kernels *kern, uint32_t wtype, const void *w,
                     int64_t n_rows, int64_t k, const float *x, int64_t n_tok, float *y,
                     void *scratch, size_t scratch_size, hm_error *err) {
    cpu_matmul_mat m = {.wtype = wtype, .w = w, .n_rows = n_rows, .y = y};
    return cpu_matmul_multi(pool, kern, 1, &m, k, x, n_tok, scratch, scratch_size, err);
}

/* ---- grouped MoE ---- */

typedef struct {
    size_t act, pairs, counts, items; /* byte offsets into scratch */
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
    l->total = mm_align(l->items + ((size_t)a->n_expert + 1) * sizeof(int64_t));
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
    size_t wexp, wexpb; /* bytes of one expert of a, of b */
    uint8_t *act;     /* [n_pairs] quantised rows, grouped by expert */
    int32_t *pairs;   /* [n_pairs] t * n_used + s, grouped by expert */
    int64_t *off;     /* [n_expert + 1] first grouped pair of each expert */
    int64_t *item0;   /* [n_expert + 1] first work item of each expert */
    int64_t n_pairs, chunk;
    quant_x8_dot_fn x8dot, x8dotb; /* quant_x8's kernel for a, b (repacked copies), or NULL */
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
 * and copied (a decode step's 8 pairs cost one quantisation, not 8). */
static void moe_acts(tp_pool *pool, moe_job *j) {
    const cpu_moe_args *a = j->a;
    if (!a->x_per_slot && a->n_tok == 1) {
        moe_act_item(j, 0, 0);
        for (int64_t g = 1; g < j->n_pairs; g++)
            memcpy(j->act + (size_t)g * j->mk.arow, j->act, j->mk.arow);
        return;
    }
    tp_run_items(j->n_pairs * a->k <= MM_INLINE_ACT ? NULL : pool, moe_act_item, j,
                 j->n_pairs);
}

/* Rows [r0, r1) of one product (weights w of expert e, kernel mk, repacked copy x8 when x8dot)
 * for the expert's grouped pairs, into y[pair][.]. */
static void moe_rows(const moe_job *j, const mm_kern *mk, const uint8_t *w, const uint8_t *x8,
                     quant_x8_dot_fn x8dot, float *y, int64_t e, int64_t r0, int64_t r1) {
    const int64_t n_rows = j->a->n_rows, g0 = j->off[e], g1 = j->off[e + 1];
    const size_t wexp = mk->wrow * (size_t)n_rows;
    if (x8dot && g1 - g0 <= MM_X8_MAX_ROWS) {
        /* each pair straight into its output row (pairs are a decode step's few) */
        for (int64_t g = g0; g < g1; g++)
            mm_rows_x8(x8dot, mk, x8 + (size_t)e * wexp, r0, r1, j->act + (size_t)g * j->mk.arow,
                       1, y + (size_t)j->pairs[g] * (size_t)n_rows + (size_t)r0, 0);
        return;
    }
    float tmp[MM_TOK_TILE * MM_MAX_CHUNK]; /* [tok][row] of one token tile */
    for (int64_t t0 = g0; t0 < g1; t0 += MM_TOK_TILE) {
        int64_t nc = g1 - t0 < MM_TOK_TILE ? g1 - t0 : MM_TOK_TILE;
        mm_rows(mk, w + (size_t)e * wexp, r0, r1, j->act + (size_t)t0 * j->mk.arow, nc, tmp,
                (size_t)(r1 - r0));
        for (int64_t c = 0; c < nc; c++)
            memcpy(y + (size_t)j->pairs[t0 + c] * (size_t)n_rows + (size_t)r0,
                   tmp + (size_t)c * (size_t)(r1 - r0), (size_t)(r1 - r0) * sizeof(float));
    }
}

/* Item it of the product job: one chunk of rows of one selected expert, every pair of it (both
 * products of a pair, then the caller's post on those rows). */
static void moe_item(void *ctx, int64_t it, int ith) {
    (void)ith;
    const moe_job *j = ctx;
    const cpu_moe_args *a = j->a;
    int64_t lo = 0, hi = a->n_expert; /* expert e with item0[e] <= it < item0[e + 1] */
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (j->item0[mid] <= it) lo = mid;
        else hi = mid;
    }
    const int64_t e = lo;
    const int64_t r0 = (it - j->item0[e]) * j->chunk;
    const int64_t r1 = r0 + j->chunk < a->n_rows ? r0 + j->chunk : a->n_rows;
    moe_rows(j, &j->mk, a->w, a->x8, j->x8dot, a->y, e, r0, r1);
    if (!j->b) return;
    moe_rows(j, &j->mkb, j->b->w, j->b->x8, j->x8dotb, j->b->y, e, r0, r1);
    if (j->post)
        for (int64_t g = j->off[e]; g < j->off[e + 1]; g++) j->post(j->post_ctx, j->pairs[g], r0, r1);
}

hm_status cpu_moe_matmul(tp_pool *pool, const quant_kernels *kern, const cpu_moe_args *a,
                         void *scratch, size_t scratch_size, hm_error *err) {
    return cpu_moe_matmul_pair(pool, kern, a, NULL, NULL, NULL, scratch, scratch_size, err);
}

/* Kernels, pair compatibility, layout and expert ids of a grouped product (j: mk, mkb, b,
 * wexpb, post). */
static hm_status moe_check(const quant_kernels *kern, const cpu_moe_args *a,
                           const cpu_moe_args *b, cpu_moe_post_fn post, void *post_ctx,
                           moe_job *j, moe_layout *l, hm_error *err) {
    memset(j, 0, sizeof(*j));
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
        j->wexpb = j->mkb.wrow * (size_t)b->n_rows;
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

/* Points j into scratch s (layout l), groups the pairs by expert (counting sort; skipped slots,
 * id < 0, drop out) and numbers the work items. */
static void moe_plan(moe_job *j, const cpu_moe_args *a, const moe_layout *l, uint8_t *s, int nth) {
    const int64_t np = a->n_tok * a->n_used;
    j->a = a;
    j->act = s + l->act;
    j->pairs = (int32_t *)(void *)(s + l->pairs);
    j->off = (int64_t *)(void *)(s + l->counts);
    j->item0 = (int64_t *)(void *)(s + l->items);
    j->wexp = j->mk.wrow * (size_t)a->n_rows;
    j->x8dot = mm_x8_pick(a->x8, a->wtype, a->n_rows, 0); /* used for experts of few pairs */
    j->x8dotb = j->b ? mm_x8_pick(j->b->x8, j->b->wtype, j->b->n_rows, 0) : NULL;
    memset(j->off, 0, ((size_t)a->n_expert + 1) * sizeof(int64_t));
    for (int64_t p = 0; p < np; p++)
        if (a->ids[p] >= 0) j->off[a->ids[p] + 1]++;
    int64_t active_rows = 0;
    for (int64_t e = 0; e < a->n_expert; e++) {
        if (j->off[e + 1]) active_rows += a->n_rows;
        j->off[e + 1] += j->off[e];
    }
    j->n_pairs = j->off[a->n_expert];
    int64_t *fill = j->item0; /* reused as insertion cursors, then overwritten */
    memcpy(fill, j->off, ((size_t)a->n_expert + 1) * sizeof(int64_t));
    for (int64_t p = 0; p < np; p++)
        if (a->ids[p] >= 0) j->pairs[fill[a->ids[p]]++] = (int32_t)p;
    j->chunk = mm_chunk_rows(j->b ? 2 * active_rows : active_rows, nth);
    const int64_t per_expert = (a->n_rows + j->chunk - 1) / j->chunk;
    j->item0[0] = 0;
    for (int64_t e = 0; e < a->n_expert; e++)
        j->item0[e + 1] = j->item0[e] + (j->off[e + 1] > j->off[e] ? per_expert : 0);
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
        tp_run_items(pool, moe_item, &j, j.item0[a->n_expert]);
    }
    free(own);
    return HM_OK;
}

/* ---- the whole expert FFN in one job ---- */

typedef struct {
    moe_job gu, dn;       /* gate/up pair (with its post) and down */
    atomic_llong *done;   /* [n_expert] gate/up items finished */
    atomic_int *ready;    /* [n_expert] 1 once the expert's down inputs are quantised */
    int64_t per_expert;   /* gate/up items of a selected expert */
    const cpu_moe_sum *sum;
    atomic_int *chunk_done; /* [down row chunks] down items finished (with sum) */
    int n_active;           /* experts with pairs: down items per row chunk */
} ffn_job;

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

static int64_t item_expert(const int64_t *item0, int64_t n_expert, int64_t it) {
    int64_t lo = 0, hi = n_expert; /* expert e with item0[e] <= it < item0[e + 1] */
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (item0[mid] <= it) lo = mid;
        else hi = mid;
    }
    return lo;
}

static void ffn_item(void *ctx, int64_t it, int ith) {
    ffn_job *f = ctx;
    const int64_t n_expert = f->gu.a->n_expert, G = f->gu.item0[n_expert];
    if (it < G) {
        moe_item(&f->gu, it, ith);
        const int64_t e = item_expert(f->gu.item0, n_expert, it);
        if (atomic_fetch_add_explicit(&f->done[e], 1, memory_order_acq_rel) + 1 == f->per_expert) {
            /* the expert's last gate/up item: every activation row of its pairs is complete */
            for (int64_t g = f->dn.off[e]; g < f->dn.off[e + 1]; g++) moe_act_item(&f->dn, g, ith);
            atomic_store_explicit(&f->ready[e], 1, memory_order_release);
        }
        return;
    }
    /* a down item: its expert's gate/up items were all claimed before it (one counter, claimed
     * in order), so they complete; wait for them */
    const int64_t id = it - G, e = item_expert(f->dn.item0, n_expert, id);
    for (int spins = 0; !atomic_load_explicit(&f->ready[e], memory_order_acquire);)
        if (++spins < 256) MM_RELAX();
        else sched_yield(); /* more threads than cores: let the holder of the item run */
    moe_item(&f->dn, id, ith);
    if (!f->sum) return;
    const int64_t c = id - f->dn.item0[e], r0 = c * f->dn.chunk; /* its row chunk */
    if (atomic_fetch_add_explicit(&f->chunk_done[c], 1, memory_order_acq_rel) + 1 == f->n_active)
        ffn_sum_rows(f, r0, r0 + f->dn.chunk < f->dn.a->n_rows ? r0 + f->dn.chunk : f->dn.a->n_rows);
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

hm_status cpu_moe_ffn(tp_pool *pool, const quant_kernels *kern, const cpu_moe_args *gate,
                      const cpu_moe_args *up, cpu_moe_post_fn post, void *post_ctx,
                      const cpu_moe_args *down, const cpu_moe_sum *sum, void *scratch,
                      size_t scratch_size, hm_error *err) {
    kern = mm_default_kern(kern);
    ffn_job f = {.sum = sum};
    moe_layout lg, ld;
    hm_status st = moe_check(kern, gate, up, post, post_ctx, &f.gu, &lg, err);
    if (st == HM_OK) st = moe_check(kern, down, NULL, NULL, NULL, &f.dn, &ld, err);
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
    void *own = NULL;
    if (!scratch) {
        scratch = own = malloc(need);
        if (!own) return hm_error_set(err, HM_ERR_NOMEM, "moe ffn: out of memory (%zu bytes)", need);
    } else if (scratch_size < need) {
        return hm_error_set(err, HM_ERR_ARG, "moe ffn: scratch of %zu bytes, %zu needed", scratch_size, need);
    }
    uint8_t *s = scratch;
    moe_plan(&f.gu, gate, &lg, s, tp_size(pool));
    moe_plan(&f.dn, down, &ld, s + o_dn, tp_size(pool));
    f.done = (atomic_llong *)(void *)(s + o_done);
    f.ready = (atomic_int *)(void *)(s + o_ready);
    f.chunk_done = (atomic_int *)(void *)(s + o_chunks);
    for (int64_t e = 0; e < gate->n_expert; e++) {
        atomic_init(&f.done[e], 0);
        atomic_init(&f.ready[e], 0);
        f.n_active += f.dn.item0[e + 1] > f.dn.item0[e];
    }
    for (int64_t c = 0; c <= down->n_rows / MM_ROW_ALIGN; c++) atomic_init(&f.chunk_done[c], 0);
    f.per_expert = (gate->n_rows + f.gu.chunk - 1) / f.gu.chunk;
    if (f.gu.n_pairs > 0) {
        moe_acts(pool, &f.gu);
        tp_run_items(pool, ffn_item, &f, f.gu.item0[gate->n_expert] + f.dn.item0[down->n_expert]);
    } else if (sum) {
        ffn_sum_rows(&f, 0, down->n_rows); /* no slot ran: a sum of nothing */
    }
    free(own);
    return HM_OK;
}
