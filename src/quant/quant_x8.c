/* quant_x8.c - repacking by eights and the portable parts of quant_x8.h.
 *
 * Group layout of q4_K (per block b of the 8 rows, 1152 bytes = 8 x 144): fp16 d[8], fp16
 * dmin[8], the rows' 64 six-bit scales and 64 six-bit mins regrouped (sm, below), then the
 * quants: for chunk j (0..3; its 32 bytes hold sub-block 2j in the low nibbles, 2j+1 in the
 * high), part m (0..3), row r (0..7): row r's bytes 8m .. 8m + 7 of chunk j. So the 64 bytes at
 * (j, m) give one 512-bit register whose 64-bit lane r holds 8 bytes of row r, and the activation
 * bytes they meet (8 of sub-block 2j or 2j + 1) are one 64-bit broadcast of the q8_K row: the
 * kernel reads the activation as it is.
 * sm (96 bytes, the 8 rows' 12 scale bytes re-encoded, so the kernel decodes all of them with a
 * few whole-register steps instead of per row): scale value i is (sub-block i / 8, row i % 8),
 * min value i is (sub-block 2 (i / 16) + i % 2, row (i / 2) % 8); sm[i] holds the low 4 bits of
 * scale i (bits 0-3) and of min i (bits 4-7); sm[64 + 2w], sm[65 + 2w] (a little-endian word)
 * hold the top 2 bits of scales 8w .. 8w + 7 (bits 2k, 2k + 1 for scale 8w + k); sm[80 + 2w],
 * sm[81 + 2w] those of mins 8w .. 8w + 7.
 * q6_K (per block, 1680 bytes = 8 x 210): fp16 d[8], the 16 int8 scales of each row, then the
 * 6-bit quants re-encoded as qb[half n][part m][plane p][row r][8 bytes]: byte c of plane p
 * (p < 3) holds quarter p's quant of element 32p + 8m + c of the half (bits 0-5) and bits 2p,
 * 2p + 1 of quarter 3's quant of element 96 + 8m + c (bits 6-7). A quarter's elements are 32
 * apart in the half (l, 32 + l, 64 + l, 96 + l share ql/qh bytes in q6_K). So the kernel gets
 * quarters 0-2 by one mask each and quarter 3 from the three top bit pairs (six steps for four
 * registers, against thirteen for q6_K's nibble and 2-bit planes).
 * mxfp4 and q8_0 (32-element blocks: a scale, e or fp16 d, then 16 or 32 quant bytes): blocks
 * go by pairs (b, b + 1): the scales [2][8] (block b's rows, then b + 1's), then each block's
 * quants as [part m][row r][8 bytes] = row r's qs bytes 8m .. 8m + 7. An odd last block is its
 * scales [8] and its quants. So the kernel takes two blocks per step, the rows of both in the 16
 * lanes of one register.
 */
#include "quant/quant_x8.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "quant/fp16.h"
#include "quant/quant_ref_internal.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/qtypes.h"

enum { X8_QK = 256 };

typedef struct {
    uint16_t d[8], dmin[8];
    uint8_t sm[96]; /* the scales and mins, as this file's header lays them out */
    uint8_t qs[1024];
} x8_q4_K;

static int x8_k4_sc_index(int jj, int r) { return 8 * jj + r; }
static int x8_k4_mn_index(int jj, int r) { return 16 * (jj / 2) + 2 * r + jj % 2; }

/* value i of sm's scales (is_min 0) or mins (1) */
static int x8_k4_get(const uint8_t *sm, int i, int is_min) {
    const int lo = (sm[i] >> (4 * is_min)) & 0xF;
    const int w = sm[64 + 16 * is_min + 2 * (i / 8)] | sm[65 + 16 * is_min + 2 * (i / 8)] << 8;
    return lo | ((w >> (2 * (i % 8))) & 3) << 4;
}

/* The 8 rows' 12 scale bytes (row r at sc12[r]) into sm (this file's header's layout). */
static void x8_k4_sm_pack(uint8_t *sc12[8], uint8_t *sm) {
    uint8_t sv[64], mv[64]; /* scale and min values in sm's order */
    for (int r = 0; r < 8; r++)
        for (int jj = 0; jj < 8; jj++)
            quant_k4_scale_min(jj, sc12[r], &sv[x8_k4_sc_index(jj, r)], &mv[x8_k4_mn_index(jj, r)]);
    for (int i = 0; i < 64; i++) sm[i] = (uint8_t)((sv[i] & 0xF) | (mv[i] & 0xF) << 4);
    for (int w = 0; w < 8; w++) {
        unsigned hs = 0, hm = 0;
        for (int k = 0; k < 8; k++) {
            hs |= (unsigned)((sv[8 * w + k] >> 4) & 3) << (2 * k);
            hm |= (unsigned)((mv[8 * w + k] >> 4) & 3) << (2 * k);
        }
        sm[64 + 2 * w] = (uint8_t)hs, sm[65 + 2 * w] = (uint8_t)(hs >> 8);
        sm[80 + 2 * w] = (uint8_t)hm, sm[81 + 2 * w] = (uint8_t)(hm >> 8);
    }
}

/* The 8 rows' 12 scale bytes (row r at sc12[r]) into sm or back: a bijection of 96 bits. */
static void x8_k4_sm_move(uint8_t *sc12[8], uint8_t *sm, bool to_group) {
    if (to_group) {
        x8_k4_sm_pack(sc12, sm);
        return;
    }
    for (int r = 0; r < 8; r++) {
        uint8_t sc[8], mn[8];
        for (int jj = 0; jj < 8; jj++) {
            sc[jj] = (uint8_t)x8_k4_get(sm, x8_k4_sc_index(jj, r), 0);
            mn[jj] = (uint8_t)x8_k4_get(sm, x8_k4_mn_index(jj, r), 1);
        }
        uint8_t *q = sc12[r]; /* quant_k4_scale_min's packing, inverted */
        for (int j = 0; j < 4; j++) {
            q[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
            q[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
            q[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
        }
    }
}

typedef struct {
    uint16_t d[8];
    int8_t scales[8][16];
    uint8_t qb[1536]; /* [n][m][p][r][c], see above */
} x8_q6_K;

/* The four quarters' quants (0..63) of element l (0..31) of half n of a q6_K block, or back */
static void x8_q6_get4(const block_q6_K *x, int n, int l, int q[4]) {
    const int la = x->ql[64 * n + l], lb = x->ql[64 * n + 32 + l], h = x->qh[32 * n + l];
    q[0] = (la & 0xF) | (h & 3) << 4;
    q[1] = (lb & 0xF) | ((h >> 2) & 3) << 4;
    q[2] = (la >> 4) | ((h >> 4) & 3) << 4;
    q[3] = (lb >> 4) | ((h >> 6) & 3) << 4;
}

static void x8_q6_set4(block_q6_K *x, int n, int l, const int q[4]) {
    x->ql[64 * n + l] = (uint8_t)((q[0] & 0xF) | (q[2] & 0xF) << 4);
    x->ql[64 * n + 32 + l] = (uint8_t)((q[1] & 0xF) | (q[3] & 0xF) << 4);
    x->qh[32 * n + l] = (uint8_t)(q[0] >> 4 | (q[1] >> 4) << 2 | (q[2] >> 4) << 4 | (q[3] >> 4) << 6);
}

/* The 32-element types' pieces: scale bytes and quant bytes per row and block. */
static void x8_q32_sizes(uint32_t wtype, size_t *scb, size_t *qb) {
    *scb = wtype == HM_TYPE_MXFP4 ? 1 : 2;
    *qb = wtype == HM_TYPE_MXFP4 ? 16 : 32;
}

/* Where block b (of nb) of the 8 rows lies in a group of a 32-element type: its 8 scales at *e,
 * its quants ([m][r][8]) at *q. */
static void x8_pair_at(uint32_t wtype, int64_t nb, int64_t b, size_t *e, size_t *q) {
    size_t scb, qb;
    x8_q32_sizes(wtype, &scb, &qb);
    const size_t pair = 16 * (scb + qb), base = pair * (size_t)(b / 2);
    if (b < nb - (nb & 1)) {
        *e = base + 8 * scb * (size_t)(b & 1);
        *q = base + 16 * scb + 8 * qb * (size_t)(b & 1);
    } else { /* the odd last block */
        *e = base;
        *q = base + 8 * scb;
    }
}

/* the AVX-512 kernel (quant_x8_avx512.c; quant_x8_avx512_built() is 0 where the build lacks it) */
int quant_x8_avx512_built(void);

bool quant_x8_supported(uint32_t wtype) {
    return wtype == HM_TYPE_Q4_K || wtype == HM_TYPE_Q6_K || wtype == HM_TYPE_MXFP4 ||
           wtype == HM_TYPE_Q8_0;
}

/* elements per block of a supported type */
static int64_t x8_block(uint32_t wtype) { return hm_type_get(wtype)->block_size; }

/* Whether the fast kernels go with kernel table kern: its ISA, plus VBMI */
static bool x8_fast_for(const quant_kernels *kern) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (!quant_x8_avx512_built() || !kern || kern->isa != QUANT_ISA_AVX512) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vbmi");
#else
    (void)kern;
    return false;
#endif
}

/* the kernel tables' choice (HOTMOE_ISA caps it) decides */
bool quant_x8_fast(void) { return x8_fast_for(quant_kernels_best()); }

size_t quant_x8_group_size(uint32_t wtype, int64_t k) {
    return quant_x8_supported(wtype) && k > 0 && k % x8_block(wtype) == 0
               ? 8 * hm_row_size(wtype, k) : 0;
}

/* Where every byte of row r's block b lies in the group block: n bytes at row offset ro and group
 * offset go, copied one way (to_group: repack) or the other (unpack). The one map of both. */
static inline __attribute__((always_inline)) void x8_piece(uint8_t *row, uint8_t *grp, size_t ro,
                                                            size_t go, size_t n, bool to_group) {
    if (to_group) memcpy(grp + go, row + ro, n);
    else memcpy(row + ro, grp + go, n);
}

/* Block b (of nb) of the 8 rows (row r's at blk + r * row_stride) into the group or back. */
static void x8_move_block(uint32_t wtype, int64_t nb, int64_t b, uint8_t *blk, size_t row_stride,
                          uint8_t *group, bool to_group) {
    if (x8_block(wtype) == 32) { /* mxfp4, q8_0: the scale first, then the quants */
        size_t scb, qb, e, q;
        x8_q32_sizes(wtype, &scb, &qb);
        x8_pair_at(wtype, nb, b, &e, &q);
        for (int r = 0; r < 8; r++) {
            uint8_t *x = blk + (size_t)r * row_stride;
            x8_piece(x, group, 0, e + scb * (size_t)r, scb, to_group);
            for (size_t m = 0; m < qb / 8; m++)
                x8_piece(x, group, scb + 8 * m, q + 64 * m + 8 * (size_t)r, 8, to_group);
        }
        return;
    }
    uint8_t *g = group + (size_t)b * 8 * hm_type_get(wtype)->type_size;
    if (wtype == HM_TYPE_Q4_K) {
        uint8_t *sc12[8];
        for (int r = 0; r < 8; r++) sc12[r] = blk + (size_t)r * row_stride + offsetof(block_q4_K, scales);
        x8_k4_sm_move(sc12, g + offsetof(x8_q4_K, sm), to_group);
    }
    for (int r = 0; r < 8; r++) {
        uint8_t *x = blk + (size_t)r * row_stride;
        if (wtype == HM_TYPE_Q6_K) {
            x8_piece(x, g, offsetof(block_q6_K, d), offsetof(x8_q6_K, d) + 2 * (size_t)r, 2, to_group);
            x8_piece(x, g, offsetof(block_q6_K, scales), offsetof(x8_q6_K, scales) + 16 * (size_t)r,
                     16, to_group);
            block_q6_K *xb = (block_q6_K *)(void *)x;
            x8_q6_K *gb6 = (x8_q6_K *)(void *)g;
            for (int n = 0; n < 2; n++)
                for (int l = 0; l < 32; l++) {
                    uint8_t *pb = gb6->qb + 768 * n + 192 * (l / 8) + 8 * r + l % 8;
                    int q[4];
                    if (to_group) {
                        x8_q6_get4(xb, n, l, q);
                        for (int p = 0; p < 3; p++)
                            pb[64 * p] = (uint8_t)(q[p] | ((q[3] >> (2 * p)) & 3) << 6);
                    } else {
                        for (int p = 0; p < 3; p++) q[p] = pb[64 * p] & 63;
                        q[3] = pb[0] >> 6 | (pb[64] >> 6) << 2 | (pb[128] >> 6) << 4;
                        x8_q6_set4(xb, n, l, q);
                    }
                }
        } else {
            x8_piece(x, g, offsetof(block_q4_K, d), offsetof(x8_q4_K, d) + 2 * (size_t)r, 2, to_group);
            x8_piece(x, g, offsetof(block_q4_K, dmin), offsetof(x8_q4_K, dmin) + 2 * (size_t)r, 2,
                     to_group);
            for (int j = 0; j < 4; j++)
                for (int m = 0; m < 4; m++)
                    x8_piece(x, g, offsetof(block_q4_K, qs) + (size_t)(32 * j + 8 * m),
                             offsetof(x8_q4_K, qs) + (size_t)(256 * j + 64 * m + 8 * r), 8, to_group);
        }
    }
}

static void x8_move(uint32_t wtype, int64_t nb, uint8_t *rows, size_t row_stride, uint8_t *group,
                    bool to_group) {
    const size_t rb = hm_type_get(wtype)->type_size;
    for (int64_t b = 0; b < nb; b++)
        x8_move_block(wtype, nb, b, rows + (size_t)b * rb, row_stride, group, to_group);
}

hm_status quant_x8_repack(uint32_t wtype, int64_t k, const void *rows, size_t row_stride,
                          void *group, hm_error *err) {
    if (!quant_x8_supported(wtype))
        return hm_error_set(err, HM_ERR_UNSUPPORTED, "x8 repack: %s has no repacked form",
                            hm_type_name(wtype));
    if (k <= 0 || k % x8_block(wtype))
        return hm_error_set(err, HM_ERR_ARG, "x8 repack: row length %lld is not a multiple of %lld",
                            (long long)k, (long long)x8_block(wtype));
    _Static_assert(sizeof(x8_q4_K) == 8 * sizeof(block_q4_K), "x8 q4_K group block size");
    _Static_assert(sizeof(x8_q6_K) == 8 * sizeof(block_q6_K), "x8 q6_K group block size");
    x8_move(wtype, k / x8_block(wtype), (uint8_t *)(uintptr_t)rows, row_stride, group, true);
    return HM_OK;
}

typedef struct {
    uint32_t wtype;
    int64_t k, n_groups;
    const uint8_t *rows;
    size_t row_stride, gs;
    uint8_t *dst;
} x8_rows_job;

enum { X8_REPACK_ITEM = 64 }; /* groups per item of quant_x8_repack_rows */

static void x8_rows_item(void *ctx, int64_t it, int ith) {
    (void)ith;
    const x8_rows_job *j = ctx;
    for (int64_t g = it * X8_REPACK_ITEM; g < (it + 1) * X8_REPACK_ITEM && g < j->n_groups; g++)
        x8_move(j->wtype, j->k / x8_block(j->wtype), (uint8_t *)(uintptr_t)(j->rows + (size_t)g * 8 * j->row_stride),
                j->row_stride, j->dst + (size_t)g * j->gs, true);
}

hm_status quant_x8_repack_rows(uint32_t wtype, int64_t k, const void *rows, size_t row_stride,
                               int64_t n_rows, void *dst, tp_pool *pool, hm_error *err) {
    if (n_rows < 0 || n_rows % 8)
        return hm_error_set(err, HM_ERR_ARG, "x8 repack: %lld rows are not whole groups of 8",
                            (long long)n_rows);
    if (n_rows == 0) return HM_OK;
    hm_status st = quant_x8_repack(wtype, k, rows, row_stride, dst, err); /* checks; group 0 */
    if (st != HM_OK) return st;
    const x8_rows_job j = {.wtype = wtype, .k = k, .n_groups = n_rows / 8, .rows = rows,
                           .row_stride = row_stride, .gs = quant_x8_group_size(wtype, k),
                           .dst = dst};
    tp_run_items(pool, x8_rows_item, (void *)&j, (j.n_groups + X8_REPACK_ITEM - 1) / X8_REPACK_ITEM);
    return HM_OK;
}

void quant_x8_unpack(uint32_t wtype, int64_t k, const void *group, void *rows, size_t row_stride) {
    if (quant_x8_supported(wtype))
        x8_move(wtype, k / x8_block(wtype), rows, row_stride, (uint8_t *)(uintptr_t)group, false);
}

/* The reference path, any type: block b of the 8 rows unpacked from the group (x8_move_block),
 * each row's block product and lane update by quant_ref_dot_block (docs/ARITHMETIC.md §2), then
 * the halving tree per row: quant_dot_ref's operations on the original rows, by construction. */
static void x8_dot_ref(uint32_t wtype, int64_t k, const void *group, const void *act, float out[8]) {
    const size_t rb = hm_type_get(wtype)->type_size;
    const size_t ab = quant_act_row_size(quant_act_for(wtype), x8_block(wtype));
    const int64_t nb = k / x8_block(wtype);
    uint8_t blk[8 * sizeof(block_q6_K)]; /* the largest block of a supported type */
    float acc[8][32];
    for (int r = 0; r < 8; r++)
        for (int l = 0; l < 32; l++) acc[r][l] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        x8_move_block(wtype, nb, b, blk, rb, (uint8_t *)(uintptr_t)group, false);
        for (int r = 0; r < 8; r++)
            quant_ref_dot_block(wtype, blk + (size_t)r * rb, (const uint8_t *)act + (size_t)b * ab,
                                &acc[r][b % 32]);
    }
    for (int r = 0; r < 8; r++) {
        for (int st = 16; st >= 1; st /= 2)
            for (int i = 0; i < st; i++) acc[r][i] = acc[r][i] + acc[r][i + st];
        out[r] = acc[r][0];
    }
}

/* The reference path for n activation rows (tests, and CPUs without the fast kernels) */
static void x8_dot_ref_rows(uint32_t wtype, int64_t k, const void *group, const void *act,
                            size_t astride, int n, float *out) {
    for (int t = 0; t < n; t++)
        x8_dot_ref(wtype, k, group, (const uint8_t *)act + (size_t)t * astride, out + 8 * t);
}

#define X8_DOT_FNS(T, TYPE, ELEMS)                                                              \
    void quant_x8_dot_##T##_avx512(int64_t nb, const void *group, const void *act, size_t astride, \
                                   int n, float *out);                                           \
    static void x8_dot_##T##_fast(int64_t k, const void *group, const void *act, size_t astride, \
                                  int n, float *out) {                                         \
        quant_x8_dot_##T##_avx512(k / (ELEMS), group, act, astride, n, out);                   \
    }                                                                                          \
    static void x8_dot_##T(int64_t k, const void *group, const void *act, size_t astride, int n, \
                           float *out) {                                                       \
        x8_dot_ref_rows(TYPE, k, group, act, astride, n, out);                                 \
    }
X8_DOT_FNS(q4_K, HM_TYPE_Q4_K, X8_QK)
X8_DOT_FNS(q6_K, HM_TYPE_Q6_K, X8_QK)
X8_DOT_FNS(mxfp4, HM_TYPE_MXFP4, 32)
X8_DOT_FNS(q8_0, HM_TYPE_Q8_0, 32)

/* Each type's kernels: fast (AVX-512) and reference. */
typedef struct {
    uint32_t type;
    quant_x8_dot_fn fast, ref;
} x8_kernels;
#define X8_KERNELS(T, TYPE) {TYPE, x8_dot_##T##_fast, x8_dot_##T}
static const x8_kernels k_x8[] = {X8_KERNELS(q4_K, HM_TYPE_Q4_K), X8_KERNELS(q6_K, HM_TYPE_Q6_K),
                                  X8_KERNELS(mxfp4, HM_TYPE_MXFP4), X8_KERNELS(q8_0, HM_TYPE_Q8_0)};

static const x8_kernels *x8_kernels_of(uint32_t wtype) {
    for (size_t i = 0; i < sizeof(k_x8) / sizeof(k_x8[0]); i++)
        if (k_x8[i].type == wtype) return &k_x8[i];
    return NULL;
}

quant_x8_dot_fn quant_x8_dot_for(uint32_t wtype, const quant_kernels *kern) {
    const x8_kernels *k = x8_kernels_of(wtype);
    return !k ? NULL : x8_fast_for(kern) ? k->fast : k->ref;
}

quant_x8_dot_fn quant_x8_dot_get(uint32_t wtype) {
    return quant_x8_dot_for(wtype, quant_kernels_best());
}
