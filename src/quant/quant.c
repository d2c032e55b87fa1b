/* quant.c - activation formats per weight type, and the kernel tables: the scalar reference
 * table and dispatch to the SIMD tables (quant_avx2.c, quant_avx512.c).
 *
 * DESIGN: the reference table wraps the scalar definitions (quant_dot_ref,
 * quant_act_quantize_ref) in the tile and activation signatures every table shares; its tile
 * functions are generated per type by a macro because the tile signature carries no type id.
 * quant_kernels_get checks the running CPU (__builtin_cpu_supports) before handing out a SIMD
 * table; the SIMD files themselves return NULL when the build could not compile them.
 * quant_kernels_best walks from the best ISA down, capped by HOTMOE_ISA. No mutable state.
 */
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/log.h"
#include "quant/quant.h"
#include "quant/quant_isa.h"

quant_act quant_act_for(uint32_t wtype) {
    switch (wtype) {
    case HM_TYPE_F32:
    case HM_TYPE_F16:
    case HM_TYPE_BF16:
        return QUANT_ACT_F32;
    case HM_TYPE_Q4_0:
    case HM_TYPE_Q4_1:
    case HM_TYPE_Q5_0:
    case HM_TYPE_Q5_1:
    case HM_TYPE_Q8_0:
    case HM_TYPE_IQ4_NL:
    case HM_TYPE_MXFP4:
        return QUANT_ACT_Q8_32;
    case HM_TYPE_Q4_K:
    case HM_TYPE_Q5_K:
    case HM_TYPE_Q6_K:
    case HM_TYPE_IQ4_XS:
        return QUANT_ACT_Q8_K;
    default:
        return QUANT_ACT_COUNT; /* includes q8_K: an activation format, not a weight type */
    }
}

size_t quant_act_row_size(quant_act act, int64_t n) {
    if (n < 0) return 0;
    switch (act) {
    case QUANT_ACT_F32:
        return (size_t)n * sizeof(float);
    case QUANT_ACT_Q8_32:
        return n % 32 ? 0 : (size_t)(n / 32) * sizeof(block_q8_32);
    case QUANT_ACT_Q8_K:
        return n % HM_QK_K ? 0 : (size_t)(n / HM_QK_K) * sizeof(block_q8_K);
    default:
        return 0;
    }
}

/* ---- reference table ---- */

static void ref_tile(uint32_t wtype, int64_t n, const void *w, size_t w_stride, int nr,
                     const void *act, size_t act_stride, int nc, float *out, size_t out_stride) {
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++)
            out[(size_t)c * out_stride + (size_t)r] =
                quant_dot_ref(wtype, n, (const char *)w + (size_t)r * w_stride,
                              (const char *)act + (size_t)c * act_stride);
}

#define REF_TILE(T)                                                                                \
    static void ref_tile_##T(int64_t n, const void *w, size_t w_stride, int nr, const void *act,   \
                             size_t act_stride, int nc, float *out, size_t out_stride) {           \
        ref_tile(HM_TYPE_##T, n, w, w_stride, nr, act, act_stride, nc, out, out_stride);           \
    }
REF_TILE(F32)
REF_TILE(F16)
REF_TILE(BF16)
REF_TILE(Q4_0)
REF_TILE(Q4_1)
REF_TILE(Q5_0)
REF_TILE(Q5_1)
REF_TILE(Q8_0)
REF_TILE(IQ4_NL)
REF_TILE(MXFP4)
REF_TILE(Q4_K)
REF_TILE(Q5_K)
REF_TILE(Q6_K)
REF_TILE(IQ4_XS)
#undef REF_TILE

#define REF_ACT(A)                                                                                 \
    static void ref_act_##A(const float *x, void *dst, int64_t n) {                                \
        quant_act_quantize_ref(QUANT_ACT_##A, x, dst, n);                                          \
    }
REF_ACT(F32)
REF_ACT(Q8_32)
REF_ACT(Q8_K)
#undef REF_ACT

static const quant_kernels k_ref = {
    .isa = QUANT_ISA_REF,
    .name = "ref",
    .dot =
        {
            [HM_TYPE_F32] = ref_tile_F32,
            [HM_TYPE_F16] = ref_tile_F16,
            [HM_TYPE_BF16] = ref_tile_BF16,
            [HM_TYPE_Q4_0] = ref_tile_Q4_0,
            [HM_TYPE_Q4_1] = ref_tile_Q4_1,
            [HM_TYPE_Q5_0] = ref_tile_Q5_0,
            [HM_TYPE_Q5_1] = ref_tile_Q5_1,
            [HM_TYPE_Q8_0] = ref_tile_Q8_0,
            [HM_TYPE_IQ4_NL] = ref_tile_IQ4_NL,
            [HM_TYPE_MXFP4] = ref_tile_MXFP4,
            [HM_TYPE_Q4_K] = ref_tile_Q4_K,
            [HM_TYPE_Q5_K] = ref_tile_Q5_K,
            [HM_TYPE_Q6_K] = ref_tile_Q6_K,
            [HM_TYPE_IQ4_XS] = ref_tile_IQ4_XS,
        },
    .act = {[QUANT_ACT_F32] = ref_act_F32,
            [QUANT_ACT_Q8_32] = ref_act_Q8_32,
            [QUANT_ACT_Q8_K] = ref_act_Q8_K},
};

/* ---- dispatch ---- */

static int cpu_has(quant_isa isa) {
    if (isa == QUANT_ISA_AVX2) return hm_cpu_has_avx2();
    if (isa == QUANT_ISA_AVX512) return hm_cpu_has_avx512();
    return 0;
}

const quant_kernels *quant_kernels_get(quant_isa isa) {
    switch (isa) {
    case QUANT_ISA_REF:
        return &k_ref;
    case QUANT_ISA_AVX2:
        return cpu_has(isa) ? quant_kernels_avx2() : NULL;
    case QUANT_ISA_AVX512:
        return cpu_has(isa) ? quant_kernels_avx512() : NULL;
    default:
        return NULL;
    }
}

const quant_kernels *quant_kernels_best(void) {
    quant_isa cap = QUANT_ISA_COUNT - 1;
    const char *env = getenv("HOTMOE_ISA");
    if (env && *env) {
        if (!strcmp(env, "ref"))
            cap = QUANT_ISA_REF;
        else if (!strcmp(env, "avx2"))
            cap = QUANT_ISA_AVX2;
        else if (!strcmp(env, "avx512"))
            cap = QUANT_ISA_AVX512;
        else
            HM_LOGW("HOTMOE_ISA=%s is not one of ref, avx2, avx512; ignored", env);
    }
    for (int isa = (int)cap; isa > QUANT_ISA_REF; isa--) {
        const quant_kernels *k = quant_kernels_get((quant_isa)isa);
        if (k) return k;
    }
    return &k_ref;
}
