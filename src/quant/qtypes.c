#include "quant/qtypes.h"

#include <stdio.h>
#include <strings.h>

/* Block geometry as ggml defines it (ggml-common.h). Q8_K is an activation format: files do
 * not normally hold it, but it has a layout and hotmoe implements it. */
static const hm_type_info k_types[HM_TYPE_COUNT] = {
    [HM_TYPE_F32] = {"f32", 1, 4, true},
    [HM_TYPE_F16] = {"f16", 1, 2, true},
    [HM_TYPE_Q4_0] = {"q4_0", 32, 18, true},
    [HM_TYPE_Q4_1] = {"q4_1", 32, 20, true},
    [HM_TYPE_Q5_0] = {"q5_0", 32, 22, true},
    [HM_TYPE_Q5_1] = {"q5_1", 32, 24, true},
    [HM_TYPE_Q8_0] = {"q8_0", 32, 34, true},
    [HM_TYPE_Q8_1] = {"q8_1", 32, 36, false},
    [HM_TYPE_Q2_K] = {"q2_K", 256, 84, false},
    [HM_TYPE_Q3_K] = {"q3_K", 256, 110, false},
    [HM_TYPE_Q4_K] = {"q4_K", 256, 144, true},
    [HM_TYPE_Q5_K] = {"q5_K", 256, 176, true},
    [HM_TYPE_Q6_K] = {"q6_K", 256, 210, true},
    [HM_TYPE_Q8_K] = {"q8_K", 256, 292, true},
    [HM_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, false},
    [HM_TYPE_IQ2_XS] = {"iq2_xs", 256, 74, false},
    [HM_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, false},
    [HM_TYPE_IQ1_S] = {"iq1_s", 256, 50, false},
    [HM_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, true},
    [HM_TYPE_IQ3_S] = {"iq3_s", 256, 110, false},
    [HM_TYPE_IQ2_S] = {"iq2_s", 256, 82, false},
    [HM_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, true},
    [HM_TYPE_I8] = {"i8", 1, 1, false},
    [HM_TYPE_I16] = {"i16", 1, 2, false},
    [HM_TYPE_I32] = {"i32", 1, 4, false},
    [HM_TYPE_I64] = {"i64", 1, 8, false},
    [HM_TYPE_F64] = {"f64", 1, 8, false},
    [HM_TYPE_IQ1_M] = {"iq1_m", 256, 56, false},
    [HM_TYPE_BF16] = {"bf16", 1, 2, true},
    [HM_TYPE_TQ1_0] = {"tq1_0", 256, 54, false},
    [HM_TYPE_TQ2_0] = {"tq2_0", 256, 66, false},
    [HM_TYPE_MXFP4] = {"mxfp4", 32, 17, true},
};

const hm_type_info *hm_type_get(uint32_t type_id) {
    if (type_id >= HM_TYPE_COUNT || !k_types[type_id].name) return NULL;
    return &k_types[type_id];
}

const char *hm_type_name(uint32_t type_id) {
    static _Thread_local char buf[24];
    const hm_type_info *ti = hm_type_get(type_id);
    if (ti) return ti->name;
    snprintf(buf, sizeof(buf), "type%u", type_id);
    return buf;
}

int hm_type_from_name(const char *name) {
    for (int i = 0; i < HM_TYPE_COUNT; i++)
        if (k_types[i].name && !strcasecmp(k_types[i].name, name)) return i;
    return -1;
}

size_t hm_row_size(uint32_t type_id, int64_t n) {
    const hm_type_info *ti = hm_type_get(type_id);
    if (!ti || n < 0 || n % ti->block_size) return 0;
    return (size_t)(n / ti->block_size) * (size_t)ti->type_size;
}
