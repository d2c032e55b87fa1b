/* quant_simd_lanes.h - internal: the block-per-lane tile driver of the 256-element types
 * (quant_simd_kquants.h). Included by quant_avx2.c and quant_avx512.c after
 * quant_simd_common.h.
 *
 * DESIGN: a type supplies UNPACK(w, &st), which decodes one weight block into registers (st),
 * DOT(&st, a, &ps, &pt), which gives for one activation block the integer partials ps (and
 * pt for a second term), and SCALE8(w, wix, a, aix, mask, full, &d1, &d2), which forms the
 * float factors of up to 8 blocks at once (lane i: the blocks at byte offsets wix[i] of w and
 * aix[i] of a; mask: the lanes to read, full: all 8): d1 = d*da (and d2, e.g. -(dmin*da)),
 * each lane one single-rounded product as in the reference (gathers: no per-block fp16 work).
 * SIMD_LANE_TILE runs, for each weight row, groups of 8 blocks: each block is unpacked once and dotted with up to SIMD_LANE_TC activation rows (batch reuse); then per
 * activation row simd_hsum8x8 of the partials and acc = fma(d1, (float)s, acc)
 * [; fma(d2, (float)t, acc)] on the accumulator register that holds lanes b%32. Lanes of a
 * partial last group are blended in. A single activation row (the matvec) takes a fully
 * unrolled path with the partials in registers. SCALE8 takes each lane's block offsets, so one
 * 8-lane register can also hold 4 blocks of each of two rows: when a row ends in a group of at
 * most 4 blocks (expert rows of k = 768 or 1024 are nothing else), the matvec takes rows by
 * pairs and does that group of both rows in one pass (one hsum, one pair of gathers, one fma
 * per term), then both rows' trees together: every lane still gets the same single-rounded
 * operations in the same order as alone, and the per-row fixed cost is roughly halved.
 */
#ifndef HM_QUANT_SIMD_LANES_H
#define HM_QUANT_SIMD_LANES_H

#include "quant/quant_simd_common.h"

enum { SIMD_LANE_TC = 4 };

/* The last CNT (1..4) blocks at b of two rows (w0, w0 + ws) in one pass, lanes 0-3 row 0 and
 * 4-7 row 1: c (the two rows' accumulator lanes 8*((b/8)%4) + 0..3, side by side) gets each
 * block's update, exactly as SIMD_LANE_GROUP1 gives it to each row; other lanes keep theirs. */
#define SIMD_LANE_PACK2(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, w0, ws, a, b, CNT, c)       \
    do {                                                                                       \
        __m256i ps_[8], pt_[8];                                                                \
        __m256 d1_, d2_;                                                                       \
        _Pragma("GCC unroll 8") for (int i_ = 0; i_ < 8; i_++) {                               \
            if ((i_ & 3) < (CNT)) {                                                            \
                ST st_;                                                                        \
                UNPACK((w0) + (size_t)(i_ >> 2) * (ws) + (size_t)((b) + (i_ & 3)) * (WSZ), &st_); \
                DOT(&st_, (a) + (size_t)((b) + (i_ & 3)) * (ASZ), &ps_[i_], &pt_[i_]);         \
            } else {                                                                           \
                ps_[i_] = pt_[i_] = _mm256_setzero_si256();                                    \
            }                                                                                  \
        }                                                                                      \
        const __m256 m1_ = simd_lane_mask(CNT);                                                \
        const __m256 m_ = _mm256_permute2f128_ps(m1_, m1_, 0x00);                              \
        SCALE8((w0) + (size_t)(b) * (WSZ), simd_ix44(WSZ, ws), (a) + (size_t)(b) * (ASZ),      \
               simd_ix44(ASZ, 0), m_, 0, &d1_, &d2_);                                          \
        __m256 r_ = _mm256_fmadd_ps(d1_, _mm256_cvtepi32_ps(simd_hsum8x8(ps_)), (c));          \
        if (HAS_T)                                                                             \
            r_ = _mm256_fmadd_ps(d2_, _mm256_cvtepi32_ps(simd_hsum8x8(pt_)), r_);              \
        (c) = _mm256_blendv_ps((c), r_, m_);                                                   \
    } while (0)

/* One group of CNT (1..8) blocks at b for one activation row a, fully unrolled (FULL: CNT == 8)
 * so that the 8 blocks' independent work interleaves; the matvec path. */
#define SIMD_LANE_GROUP1(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, wr, a, b, CNT, FULL, acc)    \
    do {                                                                                       \
        __m256i ps_[8], pt_[8];                                                                \
        __m256 d1_, d2_;                                                                       \
        _Pragma("GCC unroll 8") for (int i_ = 0; i_ < 8; i_++) {                               \
            if ((FULL) || i_ < (CNT)) {                                                        \
                ST st_;                                                                        \
                UNPACK((wr) + (size_t)((b) + i_) * (WSZ), &st_);                               \
                DOT(&st_, (a) + (size_t)((b) + i_) * (ASZ), &ps_[i_], &pt_[i_]);               \
            } else {                                                                           \
                ps_[i_] = pt_[i_] = _mm256_setzero_si256();                                    \
            }                                                                                  \
        }                                                                                      \
        SCALE8((wr) + (size_t)(b) * (WSZ), simd_ix8(WSZ), (a) + (size_t)(b) * (ASZ), simd_ix8(ASZ), \
               simd_lane_mask(CNT), (FULL), &d1_, &d2_);                                       \
        __m256 *ac_ = &(acc).a[((b) >> 3) & 3];                                                \
        __m256 r_ = _mm256_fmadd_ps(d1_, _mm256_cvtepi32_ps(simd_hsum8x8(ps_)), *ac_);        \
        if (HAS_T)                                                                             \
            r_ = _mm256_fmadd_ps(d2_, _mm256_cvtepi32_ps(simd_hsum8x8(pt_)), r_);              \
        *ac_ = (FULL) ? r_ : _mm256_blendv_ps(*ac_, r_, simd_lane_mask(CNT));                  \
    } while (0)

#define SIMD_LANE_TILE(NAME, ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, BS)                             \
    static float NAME##_row1(int64_t nb, const uint8_t *wr, const uint8_t *a) {                \
        simd_acc acc;                                                                          \
        simd_acc_zero(&acc);                                                                   \
        int64_t b = 0;                                                                         \
        for (; b + 8 <= nb; b += 8) {                                                          \
            simd_prefetch_w(wr + (size_t)b * (WSZ), 8 * (WSZ));                                \
            SIMD_LANE_GROUP1(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, wr, a, b, 8, 1, acc);           \
        }                                                                                      \
        if (b < nb) { /* short rows (k = 768: 3 blocks) are all tail: prefetch it too */       \
            simd_prefetch_w(wr + (size_t)b * (WSZ), (size_t)(nb - b) * (WSZ));                 \
            SIMD_LANE_GROUP1(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, wr, a, b, (int)(nb - b), 0, acc); \
        }                                                                                      \
        return simd_tree(&acc);                                                                \
    }                                                                                          \
    /* two rows against the same activations: a short tail (<= 4 blocks) of both in one    \
     * pass, and one tree for both; each row's arithmetic is NAME##_row1's */                  \
    static void NAME##_row2(int64_t nb, const uint8_t *w0, size_t ws, const uint8_t *a, float *out) { \
        const uint8_t *w1 = w0 + ws;                                                           \
        if (nb <= 4) { /* k <= 1024 (expert down rows): the whole row is one packed group */   \
            simd_prefetch_w(w0, (size_t)nb * (WSZ));                                           \
            simd_prefetch_w(w1, (size_t)nb * (WSZ));                                           \
            __m256 c = _mm256_setzero_ps();                                                    \
            SIMD_LANE_PACK2(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, w0, ws, a, 0, (int)nb, c); \
            /* lanes 4..31 of each row are +0: the s = 16, 8, 4 steps add +0 to lanes 0..3 */ \
            simd_tree2_tail(_mm256_add_ps(c, _mm256_setzero_ps()), out);                     \
            return;                                                                            \
        }                                                                                      \
        simd_acc acc0, acc1;                                                                   \
        simd_acc_zero(&acc0);                                                                  \
        simd_acc_zero(&acc1);                                                                  \
        int64_t b = 0;                                                                         \
        /* the next pair whole, now: the pair's back-and-forth order (head 0, head 1, both     \
         * tails) defeats the hardware's stream prefetch, and rows over 2 KiB (q6_K at k =     \
         * 2816) outrun the groups' own distance: 12 -> 24 GB/s streaming q6_K, dev box */     \
        simd_prefetch_at(w0, 2 * ws, 2 * ws);                                                  \
        for (; b + 8 <= nb; b += 8) {                                                          \
            simd_prefetch_w(w0 + (size_t)b * (WSZ), 8 * (WSZ));                                \
            simd_prefetch_w(w1 + (size_t)b * (WSZ), 8 * (WSZ));                                \
            SIMD_LANE_GROUP1(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, w0, a, b, 8, 1, acc0);  \
            SIMD_LANE_GROUP1(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, w1, a, b, 8, 1, acc1);  \
        }                                                                                      \
        if (b < nb) {                                                                          \
            const int cnt = (int)(nb - b), l = (int)((b >> 3) & 3);                            \
            simd_prefetch_w(w0 + (size_t)b * (WSZ), (size_t)cnt * (WSZ));                      \
            simd_prefetch_w(w1 + (size_t)b * (WSZ), (size_t)cnt * (WSZ));                      \
            if (cnt <= 4) {                                                                    \
                __m256 c = _mm256_permute2f128_ps(acc0.a[l], acc1.a[l], 0x20);                 \
                SIMD_LANE_PACK2(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, w0, ws, a, b, cnt, c); \
                acc0.a[l] = _mm256_blend_ps(acc0.a[l], c, 0x0f);                               \
                acc1.a[l] = _mm256_blend_ps(acc1.a[l], _mm256_permute2f128_ps(c, c, 0x11), 0x0f); \
            } else {                                                                           \
                SIMD_LANE_GROUP1(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, w0, a, b, cnt, 0, acc0); \
                SIMD_LANE_GROUP1(ST, UNPACK, DOT, SCALE8, HAS_T, WSZ, ASZ, w1, a, b, cnt, 0, acc1); \
            }                                                                                  \
        }                                                                                      \
        simd_tree2_tail(simd_tree2_s4(&acc0, &acc1), out);                                     \
    }                                                                                          \
    static void NAME##_tile(int64_t n, const void *w, size_t w_stride, int nr, const void *act, \
                            size_t act_stride, int nc, float *out, size_t out_stride) {        \
        enum { TC = SIMD_LANE_TC };                                                            \
        const int64_t nb = n / (BS);                                                           \
        const uint8_t *wp = (const uint8_t *)w, *xp = (const uint8_t *)act;                    \
        if (nc == 1) {                                                                         \
            int r = 0;                                                                         \
            if ((nb & 7) != 0 && (nb & 7) <= 4) /* a short tail to pack: rows by pairs */      \
                for (; r + 2 <= nr; r += 2)                                                    \
                    NAME##_row2(nb, wp + (size_t)r * w_stride, w_stride, xp, out + r);         \
            for (; r < nr; r++) out[r] = NAME##_row1(nb, wp + (size_t)r * w_stride, xp);       \
            return;                                                                            \
        }                                                                                      \
        for (int c0 = 0; c0 < nc; c0 += TC) {                                                  \
            const int tcn = nc - c0 < TC ? nc - c0 : TC;                                       \
            for (int r = 0; r < nr; r++) {                                                     \
                const uint8_t *wr = wp + (size_t)r * w_stride;                                 \
                simd_acc acc[TC];                                                              \
                for (int t = 0; t < tcn; t++) simd_acc_zero(&acc[t]);                          \
                for (int64_t b = 0; b < nb; b += 8) {                                          \
                    const int cnt = nb - b < 8 ? (int)(nb - b) : 8;                            \
                    __m256i ps[TC][8], pt[TC][8];                                              \
                    __m256 d1[TC], d2[TC];                                                     \
                    if (cnt == 8) simd_prefetch_w(wr + (size_t)b * (WSZ), 8 * (WSZ));          \
                    for (int i = 0; i < 8; i++) {                                              \
                        if (i < cnt) {                                                         \
                            ST st;                                                             \
                            UNPACK(wr + (size_t)(b + i) * (WSZ), &st);                         \
                            for (int t = 0; t < tcn; t++)                                      \
                                DOT(&st, xp + (size_t)(c0 + t) * act_stride + (size_t)(b + i) * (ASZ), \
                                    &ps[t][i], &pt[t][i]);                                     \
                        } else {                                                               \
                            for (int t = 0; t < tcn; t++)                                      \
                                ps[t][i] = pt[t][i] = _mm256_setzero_si256();                  \
                        }                                                                      \
                    }                                                                          \
                    const int l = (int)((b >> 3) & 3);                                         \
                    for (int t = 0; t < tcn; t++)                                              \
                        SCALE8(wr + (size_t)b * (WSZ), simd_ix8(WSZ),                          \
                               xp + (size_t)(c0 + t) * act_stride + (size_t)b * (ASZ), simd_ix8(ASZ), \
                               simd_lane_mask(cnt), cnt == 8, &d1[t], &d2[t]);                 \
                    for (int t = 0; t < tcn; t++) {                                            \
                        __m256 rv = _mm256_fmadd_ps(d1[t],                                     \
                                                    _mm256_cvtepi32_ps(simd_hsum8x8(ps[t])),   \
                                                    acc[t].a[l]);                              \
                        if (HAS_T)                                                             \
                            rv = _mm256_fmadd_ps(d2[t],                                        \
                                                 _mm256_cvtepi32_ps(simd_hsum8x8(pt[t])), rv); \
                        acc[t].a[l] = cnt == 8 ? rv : _mm256_blendv_ps(acc[t].a[l], rv, simd_lane_mask(cnt)); \
                    }                                                                          \
                }                                                                              \
                for (int t = 0; t < tcn; t++)                                                  \
                    out[(size_t)(c0 + t) * out_stride + (size_t)r] = simd_tree(&acc[t]);       \
            }                                                                                  \
        }                                                                                      \
    }

#endif
