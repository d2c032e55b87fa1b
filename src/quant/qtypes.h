/* qtypes.h - the tensor element types of GGUF files (ggml's type ids) and their block geometry.
 *
 * DESIGN: one table describes every type id a GGUF file may carry, including the ones hotmoe
 * cannot compute with, so that the reader can validate sizes and `inspect` can describe any
 * file. `supported` says whether quant/ implements the type; everything else is refused by the
 * loaders with "unsupported type T in tensor NAME". The ids are ggml's and are stored in files:
 * never renumber them.
 */
#ifndef HM_QUANT_QTYPES_H
#define HM_QUANT_QTYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    HM_TYPE_F32 = 0,
    HM_TYPE_F16 = 1,
    HM_TYPE_Q4_0 = 2,
    HM_TYPE_Q4_1 = 3,
    HM_TYPE_Q5_0 = 6,
    HM_TYPE_Q5_1 = 7,
    HM_TYPE_Q8_0 = 8,
    HM_TYPE_Q8_1 = 9,
    HM_TYPE_Q2_K = 10,
    HM_TYPE_Q3_K = 11,
    HM_TYPE_Q4_K = 12,
    HM_TYPE_Q5_K = 13,
    HM_TYPE_Q6_K = 14,
    HM_TYPE_Q8_K = 15,
    HM_TYPE_IQ2_XXS = 16,
    HM_TYPE_IQ2_XS = 17,
    HM_TYPE_IQ3_XXS = 18,
    HM_TYPE_IQ1_S = 19,
    HM_TYPE_IQ4_NL = 20,
    HM_TYPE_IQ3_S = 21,
    HM_TYPE_IQ2_S = 22,
    HM_TYPE_IQ4_XS = 23,
    HM_TYPE_I8 = 24,
    HM_TYPE_I16 = 25,
    HM_TYPE_I32 = 26,
    HM_TYPE_I64 = 27,
    HM_TYPE_F64 = 28,
    HM_TYPE_IQ1_M = 29,
    HM_TYPE_BF16 = 30,
    HM_TYPE_TQ1_0 = 34,
    HM_TYPE_TQ2_0 = 35,
    HM_TYPE_MXFP4 = 39,
    HM_TYPE_COUNT = 40, /* one past the largest id this table knows */
} hm_type;

#define HM_QK_K 256 /* elements in a K-quant super-block */

typedef struct {
    const char *name;   /* ggml's name: "q4_K", "mxfp4", ...; NULL for ids that are not types */
    int32_t block_size; /* elements per block */
    int32_t type_size;  /* bytes per block */
    bool supported;     /* quant/ can dequantise it and dot it with activations */
} hm_type_info;

/* Info for a type id, or NULL when the id is not a known type (removed or future ids). */
const hm_type_info *hm_type_get(uint32_t type_id);

/* Name of a type id; "type<N>" form for unknown ids (thread-local buffer). */
const char *hm_type_name(uint32_t type_id);

/* Type id for a name (case-insensitive, "q4_k" == "Q4_K"); -1 if unknown. */
int hm_type_from_name(const char *name);

/* Bytes of a row of n elements; 0 if the type is unknown or n is not a multiple of its block
 * size. */
size_t hm_row_size(uint32_t type_id, int64_t n);

#endif
