/* matmul.c - the dense products cpu_matmul, cpu_matmul_multi and cpu_matmul_job_* (see matmul.h);
 * the grouped expert products are in matmul_moe.c.
 *
 * DESIGN: two item jobs on the pool per call (tp_run_items: finished when the items are, so a
 * descheduled thread delays nothing unless it holds an item): (1) the activation rows are
 * quantised into scratch (a few rows by the calling thread alone, cheaper than a job);
 * (2) threads claim work items one at a time. A work item is a chunk of MM_ROW_ALIGN-aligned weight rows (of one expert for MoE);
 * inside it, tokens go in tiles of MM_TOK_TILE and rows in groups of MM_NR, each one call of
 * the kernel table's tile function: the MM_NR weight rows stay in L1/L2 while the tile's
 * tokens pass, the token tile's activations stay in L2 while the chunk's rows pass. Chunks are
 * big first and small for each thread's last two or so (mm_chunk_plan: long streams between
 * item starts, threads that still finish together). With a repacked copy (x8) a product of a
 * few tokens calls quant_x8's kernel per group of 8 rows instead. For MoE the caller thread
 * first groups (token, slot) pairs by expert, phase 1 quantises each pair's input into its
 * grouped position, and phase 2's items are (expert, row chunk) over all selected experts;
 * results go through a small per-item buffer to y[t][s][.] (matmul_moe.c).
 * Fused forms for decode, where every pool job costs a dispatch, a barrier and a tail:
 * cpu_matmul_multi shares one quantised input and one item counter among up to 4 matrices
 * (q/k/v), cpu_moe_matmul_pair computes the same rows of two expert products (gate/up) in one
 * item and lets the caller finish those rows (bias, activation) before the job ends;
 * cpu_matmul_job_* are cpu_matmul_multi's steps (plan, quantise, rows) for a caller that chains
 * products and the steps between them in one staged job (tp_run_stages).
 */
#include "cpu/matmul.h"
#include "cpu/ops.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/matmul_internal.h"


hm_status mm_kern_init(const quant_kernels *kern, uint32_t wtype, int64_t k, mm_kern *mk,
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
void mm_rows(const mm_kern *mk, const uint8_t *w, int64_t r0, int64_t r1,
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

int64_t mm_chunk_rows(int64_t total_rows, int nth) {
    int64_t c = total_rows / ((int64_t)nth * HM_TUNE_MM_ITEMS_PER_THREAD);
    if (c > MM_MAX_CHUNK) c = MM_MAX_CHUNK;
    c = c / MM_ROW_ALIGN * MM_ROW_ALIGN;
    return c < MM_ROW_ALIGN ? MM_ROW_ALIGN : c;
}


/* A product job's item sizes: its rows (all matrices' in order, as the items are claimed) go in
 * a first wave of nth big chunks (each thread's first item, whose rows it prefetches while it
 * waits at the stage's gate), a second wave of nth chunks half as big, then small ones for about
 * the last two items of each thread. Long streams between item starts (each costs a cold
 * stream start; items of ~40 KB stream ~8% slower than items of ~100 KB), while the thread that
 * starts late (it ran the stage's `then`, its first item is not prefetched) and the threads
 * that stream slower than the rest still finish with the others (host traces at 1c412a3,
 * bench/RESULTS.md). */
static void mm_chunk_plan(int64_t total_rows, int nth, int64_t *big, int64_t *mid, int64_t *small) {
    const int64_t a = MM_ROW_ALIGN;
    int64_t sm = (total_rows / ((int64_t)nth * 16) + a - 1) / a * a;
    sm = sm < a ? a : sm > MM_MAX_CHUNK ? MM_MAX_CHUNK : sm;
    int64_t tail = sm * 2 * nth;
    if (tail > total_rows) tail = total_rows;
    int64_t bg = (total_rows - tail) * 2 / ((int64_t)nth * 3) / a * a;
    bg = bg < sm ? sm : bg > MM_MAX_CHUNK ? MM_MAX_CHUNK : bg;
    int64_t md = bg / 2 / a * a;
    md = md < sm ? sm : md;
    *big = bg;
    *mid = md;
    *small = sm;
}

/* Item it's rows [v0, v1) of a job's row space (n_v rows): nth items of big rows, nth of mid,
 * then items of small rows. */
static void mm_item_range(const cpu_matmul_job *j, int64_t it, int64_t *v0, int64_t *v1) {
    int64_t at, n;
    if (it < j->nth) at = it * j->big, n = j->big;
    else if (it < 2 * j->nth) at = j->nth * j->big + (it - j->nth) * j->mid, n = j->mid;
    else at = j->nth * (j->big + j->mid) + (it - 2 * j->nth) * j->small, n = j->small;
    *v0 = at < j->n_v ? at : j->n_v;
    *v1 = at + n < j->n_v ? at + n : j->n_v;
}

static int64_t mm_plan_items(const cpu_matmul_job *j) {
    const int64_t waves = j->nth * (j->big + j->mid);
    if (j->n_v <= j->nth * j->big) return (j->n_v + j->big - 1) / j->big;
    if (j->n_v <= waves) return j->nth + (j->n_v - j->nth * j->big + j->mid - 1) / j->mid;
    return 2 * j->nth + (j->n_v - waves + j->small - 1) / j->small;
}

const quant_kernels *mm_default_kern(const quant_kernels *kern) {
    return kern ? kern : quant_kernels_best();
}

/* ---- dense ---- */

size_t cpu_matmul_scratch_size(uint32_t wtype, int64_t k, int64_t n_tok) {
    quant_act act = quant_act_for(wtype);
    size_t arow = act == QUANT_ACT_COUNT ? 0 : quant_act_row_size(act, k);
    if (arow == 0 || n_tok <= 0) return 0;
    return arow * (size_t)n_tok;
}
/* Rows [r0, r1) (whole groups of 8) of the repacked copy x8 against nc activation rows (act +
 * c * astride), into out[idx(c) * ostride + r] with idx(c) = c, or slots[c] when given (an
 * expert's scattered pairs): each group of 8 rows against MM_TOK_TILE activation rows at a time
 * (the multi-row kernels decode each weight block once for several of them), the group in L1
 * across the tiles; one activation row (a decode step) straight into its output. */
void mm_rows_x8(quant_x8_dot_fn x8dot, const mm_kern *mk, const uint8_t *x8, int64_t r0,
                int64_t r1, const uint8_t *act, size_t astride, int64_t nc, float *out,
                size_t ostride, const int32_t *slots) {
    if (nc == 1) {
        float *o = out + (size_t)(slots ? slots[0] : 0) * ostride;
        for (int64_t r = r0; r < r1; r += QUANT_X8_ROWS)
            x8dot(mk->k, x8 + (size_t)r * mk->wrow, act, astride, 1, o + (size_t)r);
        return;
    }
    float tmp[MM_TOK_TILE * QUANT_X8_ROWS]; /* [token][row] of one group */
    for (int64_t c0 = 0; c0 < nc; c0 += MM_TOK_TILE) {
        const int n = nc - c0 < MM_TOK_TILE ? (int)(nc - c0) : MM_TOK_TILE;
        for (int64_t r = r0; r < r1; r += QUANT_X8_ROWS) {
            x8dot(mk->k, x8 + (size_t)r * mk->wrow, act + (size_t)c0 * astride, astride, n, tmp);
            for (int c = 0; c < n; c++) {
                const size_t o = (size_t)(slots ? slots[c0 + c] : c0 + c) * ostride + (size_t)r;
                memcpy(out + o, tmp + QUANT_X8_ROWS * c, QUANT_X8_ROWS * sizeof(float));
            }
        }
    }
}

quant_x8_dot_fn mm_x8_pick(const quant_kernels *kern, const void *x8, uint32_t wtype, int64_t n_rows) {
    return x8 && n_rows % QUANT_X8_ROWS == 0 ? quant_x8_dot_for(wtype, kern) : NULL;
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

/* The matrices' rows lie one after another in the job's row space (each from a multiple of
 * MM_ROW_ALIGN, v0), so that an item's size does not depend on where a matrix ends: an item may
 * hold rows of two matrices. Matrix mi's rows [r0, r1) of item it; false if it has none. */
static bool mm_item_part(const mm_job *j, int64_t it, int mi, int64_t *r0, int64_t *r1) {
    int64_t v0, v1;
    mm_item_range(j, it, &v0, &v1);
    const mm_mat *m = &j->m[mi];
    *r0 = v0 > m->v0 ? v0 - m->v0 : 0;
    *r1 = v1 - m->v0 < m->n_rows ? v1 - m->v0 : m->n_rows;
    return *r0 < *r1;
}

/* Item it of the product job: its rows (of one matrix or two) against every token. */
static void mm_item(void *ctx, int64_t it, int ith) {
    const mm_job *j = ctx;
    const uint8_t *act = j->act_for ? j->act_for(j->act_for_ctx, ith) : j->act;
    for (int mi = 0; mi < j->n_mat; mi++) {
        const mm_mat *m = &j->m[mi];
        int64_t r0, r1;
        if (!mm_item_part(j, it, mi, &r0, &r1)) continue;
        if (m->x8dot)
            mm_rows_x8(m->x8dot, &m->mk, m->x8, r0, r1, act, m->mk.arow, j->n_tok, m->y,
                       (size_t)m->n_rows, NULL);
        else
            mm_rows(&m->mk, m->w, r0, r1, act, j->n_tok, m->y + r0, (size_t)m->n_rows);
        if (j->on_rows) j->on_rows(j->on_rows_ctx, mi, r0, r1);
    }
}

/* The weight rows of item it into the calling core's L2 (prefetcht1), from its first row on,
 * until the gate opens: the thread runs the item once its stage opens, so the stream of weights
 * need not stop at the stage's gate, and a thread that came late starts the item at once (each
 * prefetch instruction waits for a free fill buffer: loading a whole item first kept late
 * threads from computing for up to ~10 µs after the gate opened; host trace at 59983ba,
 * bench/RESULTS.md). (A cap of 32 or 64 KB was tried before 2e6b731: inside the host's noise.) */
static void mm_item_prefetch(void *ctx, int64_t it, const tp_gate *gate) {
    const mm_job *j = ctx;
    for (int mi = 0; mi < j->n_mat; mi++) {
        const mm_mat *m = &j->m[mi];
        int64_t r0, r1;
        if (!mm_item_part(j, it, mi, &r0, &r1)) continue;
        const uint8_t *w = (m->x8dot ? m->x8 : m->w) + (size_t)r0 * m->mk.wrow; /* a group: 8 rows */
        if (!mm_prefetch_until(w, (size_t)(r1 - r0) * m->mk.wrow, gate)) return;
    }
}

bool mm_prefetch_until(const uint8_t *w, size_t bytes, const tp_gate *gate) {
    for (size_t o = 0; o < bytes; o += 64) {
        if (o % 1024 == 0 && tp_gate_open(gate)) return false;
        __builtin_prefetch(w + o, 0, 2);
    }
    return true;
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
    for (int i = 0; i < n_mat; i++) {
        hm_status st = mm_kern_init(kern, mats[i].wtype, k, &j->m[i].mk, err);
        if (st != HM_OK) return st;
        if (mats[i].n_rows <= 0)
            return hm_error_set(err, HM_ERR_ARG, "matmul: empty product (%lld rows, %lld tokens)",
                                (long long)mats[i].n_rows, (long long)n_tok);
        if (quant_act_for(mats[i].wtype) != quant_act_for(mats[0].wtype))
            return hm_error_set(err, HM_ERR_ARG, "matmul: %s and %s do not share an activation "
                                "format", hm_type_name(mats[0].wtype), hm_type_name(mats[i].wtype));
    }
    size_t need = cpu_matmul_scratch_size(mats[0].wtype, k, n_tok);
    if (!scratch || scratch_size < need)
        return hm_error_set(err, HM_ERR_ARG, "matmul: scratch of %zu bytes, %zu needed", scratch_size, need);
    /* item sizes from the matrices' total (rows of similar cost), in claiming order */
    int64_t v = 0;
    for (int i = 0; i < n_mat; i++) {
        j->m[i].w = mats[i].w;
        j->m[i].n_rows = mats[i].n_rows;
        j->m[i].y = mats[i].y;
        j->m[i].x8 = mats[i].x8;
        j->m[i].x8dot = mm_x8_pick(kern, mats[i].x8, mats[i].wtype, mats[i].n_rows);
        j->m[i].v0 = v;
        v += (mats[i].n_rows + MM_ROW_ALIGN - 1) / MM_ROW_ALIGN * MM_ROW_ALIGN;
    }
    j->n_v = j->m[n_mat - 1].v0 + mats[n_mat - 1].n_rows;
    j->nth = nth < 1 ? 1 : nth;
    mm_chunk_plan(v, (int)j->nth, &j->big, &j->mid, &j->small);
    j->n_items = mm_plan_items(j);
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

