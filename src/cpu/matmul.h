/* matmul.h - CPU matrix-vector and small-batch matrix products of quantised weights with f32
 * activations, and the grouped Mixture-of-Experts variant.
 *
 * DESIGN: every output element is one call of the kernel table's dot tile on one (weight row,
 * activation row) pair, so results are bit-identical to quant_dot_ref whatever the thread count,
 * batch size or tiling (docs/ARITHMETIC.md). Activations are quantised once, in parallel, to the
 * weight type's activation format; then weight rows are split into chunks handed out through an
 * atomic counter, so a matvec (one token) streams the weights once at memory bandwidth, and a
 * batch is tiled over tokens so that a chunk of weight rows stays in cache across a tile of
 * tokens. The MoE product groups (token, slot) pairs by expert and schedules the (expert, row
 * chunk) items of all selected experts on the pool together.
 *
 * Scratch: callers that run every step pass a buffer of cpu_*_scratch_size bytes (no
 * allocation on the hot path); scratch == NULL makes the call allocate and free its own.
 */
#ifndef HM_CPU_MATMUL_H
#define HM_CPU_MATMUL_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "base/threadpool.h"
#include "quant/quant.h"
#include "quant/quant_x8.h"

/* Bytes of scratch cpu_matmul needs for n_tok activation rows of k elements (0 if k does not
 * fit the type's blocks). */
size_t cpu_matmul_scratch_size(uint32_t wtype, int64_t k, int64_t n_tok);

/* y[t][r] = dot(row r of w, x[t]) for r < n_rows, t < n_tok.
 *   w: [n_rows] rows of k elements of wtype (row size hm_row_size(wtype, k)), contiguous;
 *   x: [n_tok][k] f32; y: [n_tok][n_rows] f32.
 * pool may be NULL (single thread); kern NULL means quant_kernels_best(). */
hm_status cpu_matmul(tp_pool *pool, const quant_kernels *kern, uint32_t wtype, const void *w,
                     int64_t n_rows, int64_t k, const float *x, int64_t n_tok, float *y,
                     void *scratch, size_t scratch_size, hm_error *err);

/* Several products of the same activations in one pool job (e.g. q, k and v of one input): the
 * activations are quantised once and the row chunks of all matrices are shared out together.
 * Every matrix must have k columns and a weight type with the same activation format
 * (quant_act_for); scratch as for cpu_matmul(mats[0].wtype, k, n_tok). Results are those of
 * cpu_matmul on each matrix. */
enum { CPU_MATMUL_MAX_MULTI = 4 };
typedef struct {
    uint32_t wtype;
    const void *w; /* [n_rows] rows of k elements */
    int64_t n_rows;
    float *y;      /* [n_tok][n_rows] */
    const void *x8; /* NULL, or w repacked by eights (quant_x8.h): products of a few tokens then
                       use quant_x8's kernel, the same results */
} cpu_matmul_mat;
hm_status cpu_matmul_multi(tp_pool *pool, const quant_kernels *kern, int n_mat,
                           const cpu_matmul_mat *mats, int64_t k, const float *x, int64_t n_tok,
                           void *scratch, size_t scratch_size, hm_error *err);

/* cpu_matmul_multi in steps, as one stage of a caller's staged pool job (tp_run_stages), so that
 * a decode step can chain several products and the small steps between them in one job:
 * cpu_matmul_job_init checks and plans the product for a pool of nth threads (scratch is
 * required, sized as cpu_matmul_multi's, and holds the quantised activations until the stage
 * has run); cpu_matmul_job_quantize quantises x [n_tok][k] on the calling thread (e.g. in the
 * previous stage's `then`); cpu_matmul_job_stage is the stage whose items compute every row.
 * Results are those of cpu_matmul_multi. The job's fields are private to matmul.c. */
typedef struct {
    quant_dot_tile_fn dot;
    quant_act_fn act;
    quant_act atype;
    int64_t k;
    size_t wrow, arow; /* bytes of one weight row, one quantised activation row */
} cpu_matmul_kern;
typedef struct {
    cpu_matmul_kern mk;
    const uint8_t *w;
    int64_t n_rows, v0; /* v0: its first row in the job's row space (matmul.c) */
    float *y;
    const uint8_t *x8;     /* the repacked rows when x8dot is set */
    quant_x8_dot_fn x8dot; /* quant_x8's kernel for this product, or NULL (the dot tiles) */
} cpu_matmul_part;
typedef struct {
    cpu_matmul_part m[CPU_MATMUL_MAX_MULTI];
    int n_mat;
    int64_t n_tok, n_items;
    int64_t n_v, nth, big, mid, small; /* the item plan (mm_item_range) */
    const float *x;
    uint8_t *act; /* [n_tok] quantised rows of m[0].mk.arow bytes (shared by every matrix) */
    /* may be set after cpu_matmul_job_init: called by the item that wrote rows [r0, r1) of
     * matrix mi's y (every token), right after (e.g. a bias and a residual add on that core) */
    void (*on_rows)(void *ctx, int mi, int64_t r0, int64_t r1);
    void *on_rows_ctx;
    /* may be set after cpu_matmul_job_init: the activation rows (act's layout) an item on thread
     * ith reads instead of act, e.g. that thread's own copy, made from the input at its first
     * item (cpu_matmul_job_quantize is then not needed) */
    const uint8_t *(*act_for)(void *ctx, int ith);
    void *act_for_ctx;
} cpu_matmul_job;
hm_status cpu_matmul_job_init(cpu_matmul_job *j, const quant_kernels *kern, int n_mat,
                              const cpu_matmul_mat *mats, int64_t k, int64_t n_tok, int nth,
                              void *scratch, size_t scratch_size, hm_error *err);
void cpu_matmul_job_quantize(cpu_matmul_job *j, const float *x);
/* The same in parts, e.g. by the items that wrote them: elements [i0, i0 + n) of token t's row x
 * ([k] floats) into its activation row, the bytes cpu_matmul_job_quantize writes there. Only
 * for parts cpu_matmul_job_part_ok accepts (i0 and n whole activation blocks: 256, 32 or 1). */
bool cpu_matmul_job_part_ok(const cpu_matmul_job *j, int64_t i0, int64_t n);
void cpu_matmul_job_quantize_part(cpu_matmul_job *j, const float *x, int64_t t, int64_t i0,
                                  int64_t n);
tp_stage cpu_matmul_job_stage(cpu_matmul_job *j);

/* Grouped expert product. The expert tensor is ggml's 3-D [n_expert][n_rows][k] (GGUF ne =
 * {k, n_rows, n_expert}, e.g. blk.N.ffn_up_exps.weight). */
typedef struct {
    uint32_t wtype;
    const void *w;          /* [n_expert][n_rows] rows of k elements, contiguous */
    size_t w_stride;        /* bytes from one expert's rows in w to the next; 0: n_rows rows
                               (contiguous). E.g. gate or up viewed in a fused gate/up tensor.
                               x8 is always contiguous */
    int64_t n_expert, n_rows, k;
    const float *x;         /* x_per_slot ? [n_tok][n_used][k] : [n_tok][k] */
    int x_per_slot;         /* 0: all slots of a token share x[t] (gate/up); 1: own input (down) */
    const int32_t *ids;     /* [n_tok][n_used] selected experts; an id < 0 skips that slot */
    int64_t n_tok;
    int n_used;
    float *y;               /* [n_tok][n_used][n_rows]; rows of skipped slots are not written */
    const void *x8;         /* NULL, or w repacked by eights (quant_x8.h): experts with few
                               pairs then use quant_x8's kernel, the same results */
    const void *xq;         /* NULL, or (one token, x shared by the slots) x already quantised
                               to the product's activation format by the caller: read instead */
} cpu_moe_args;

size_t cpu_moe_scratch_size(const cpu_moe_args *a);

/* y[t][s][r] = dot(row r of expert ids[t][s], x of (t, s)). Fails with HM_ERR_RANGE, before
 * computing anything, if an id is >= n_expert. */
hm_status cpu_moe_matmul(tp_pool *pool, const quant_kernels *kern, const cpu_moe_args *a,
                         void *scratch, size_t scratch_size, hm_error *err);

/* Called inside the pool job once rows [r0, r1) of pair p (= t * n_used + s) are written in
 * both a->y and b->y (e.g. the expert biases and swiglu of those rows). */
typedef void (*cpu_moe_post_fn)(void *ctx, int64_t p, int64_t r0, int64_t r1);

/* Two grouped products over the same inputs (gate and up) in one pool job: the inputs are
 * quantised once and each work item computes the same rows of both, then calls post (may be
 * NULL). a and b must have equal x, x_per_slot, ids, n_tok, n_used, n_expert, n_rows, k and
 * activation format; b NULL is cpu_moe_matmul. Scratch as cpu_moe_scratch_size(a). */
hm_status cpu_moe_matmul_pair(tp_pool *pool, const quant_kernels *kern, const cpu_moe_args *a,
                              const cpu_moe_args *b, cpu_moe_post_fn post, void *post_ctx,
                              void *scratch, size_t scratch_size, hm_error *err);

/* The expert FFN of a few tokens in one pool job (decode: one job instead of two): the gate/up
 * pair as cpu_moe_matmul_pair (post writes the activation into gate->y), then the down product
 * of each expert as soon as all of that expert's gate/up rows are done — the thread finishing
 * an expert's last gate/up item quantises its down inputs, so no barrier separates the phases.
 * down must read gate->y per slot (x_per_slot 1, same ids, k = gate->n_rows). Results are those
 * of cpu_moe_matmul_pair followed by cpu_moe_matmul(down). */
size_t cpu_moe_ffn_scratch_size(const cpu_moe_args *gate, const cpu_moe_args *down);
/* Optional: the slots' weighted sum inside the same job. Once every expert's down rows of a row
 * chunk are done, the thread finishing the last of them adds the down bias to those rows of
 * every slot (cpu_moe_add_bias), sums them (cpu_moe_combine_rows) into out and adds out to
 * residual (x + out): the bytes of those calls after the job, by the cores that hold the rows. */
typedef struct {
    const float *w;     /* [n_tok][n_used] slot weights */
    const float *bias;  /* [n_expert][down rows] or NULL */
    float *out;         /* [n_tok][down rows] */
    float *residual;    /* [n_tok][down rows] or NULL */
} cpu_moe_sum;
hm_status cpu_moe_ffn(tp_pool *pool, const quant_kernels *kern, const cpu_moe_args *gate,
                      const cpu_moe_args *up, cpu_moe_post_fn post, void *post_ctx,
                      const cpu_moe_args *down, const cpu_moe_sum *sum, void *scratch,
                      size_t scratch_size, hm_error *err);

/* cpu_moe_ffn in steps, as one stage of a caller's staged job (a decode step in one job):
 * cpu_moe_ffn_job_items says how many items the stage will have when n_active experts have
 * pairs (known before the routing, e.g. n_used of one token), for a pool of nth threads;
 * cpu_moe_ffn_job_init checks and plans (scratch required, cpu_moe_ffn_scratch_size bytes), then
 * cpu_moe_ffn_job_inputs quantises the inputs (on act_pool, or the calling thread when NULL: e.g.
 * in the previous stage's `then`); cpu_moe_ffn_job_stage is the stage. Once planned, a job's
 * item can be prefetched (cpu_moe_ffn_job_prefetch: its weight rows into L2 until the gate
 * opens, as a stage's prefetch). The arguments must live until the stage has run. Results are
 * those of cpu_moe_ffn. The job is opaque: cpu_moe_ffn_job_size() bytes. */
typedef struct cpu_moe_ffn_job cpu_moe_ffn_job;
size_t cpu_moe_ffn_job_size(void);
int64_t cpu_moe_ffn_job_items(const cpu_moe_args *gate, const cpu_moe_args *up,
                              const cpu_moe_args *down, int64_t n_active, int nth);
hm_status cpu_moe_ffn_job_init(cpu_moe_ffn_job *j, const quant_kernels *kern,
                               const cpu_moe_args *gate, const cpu_moe_args *up,
                               cpu_moe_post_fn post, void *post_ctx, const cpu_moe_args *down,
                               const cpu_moe_sum *sum, void *scratch, size_t scratch_size,
                               int nth, hm_error *err);
void cpu_moe_ffn_job_inputs(cpu_moe_ffn_job *j, tp_pool *act_pool);
void cpu_moe_ffn_job_prefetch(const cpu_moe_ffn_job *j, int64_t item, const tp_gate *gate);
int64_t cpu_moe_ffn_job_n_items(const cpu_moe_ffn_job *j);
tp_stage cpu_moe_ffn_job_stage(cpu_moe_ffn_job *j);

#endif
