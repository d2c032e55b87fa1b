/* model_internal.h - the model struct, shared by the model/ sources only. */
#ifndef HM_MODEL_INTERNAL_H
#define HM_MODEL_INTERNAL_H

#include "cpu/ops.h"
#include "model/model.h"
#include "quant/quant.h"

struct hm_model {
    gguf_ctx *g;
    const hm_arch_desc *desc;
    hm_hparams hp;
    hm_tensor tok_embd;    /* {n_embd, n_vocab} any supported type */
    hm_tensor output_norm; /* {n_embd} f32 */
    hm_tensor output;      /* {n_embd, n_vocab} */
    hm_tensor rope_freqs;  /* gemma4: {head_dim_k / 2} f32 */
    bool *swa;             /* gemma4: [n_layer] sliding_window_pattern, read with the
                              hyper-parameters, copied into the layers */
    hm_layer *layers;      /* [n_layer] */
    float *owned;          /* small vectors converted to f32 at load (norms, biases of other
                              types); hm_tensor.data points into it */
    uint64_t weight_bytes;
    void **f32_copies;     /* [n_f32_copies] matrices dequantised by params.f32_weights */
    int n_f32_copies;
    struct model_x8_copy *x8_copies; /* [n_x8_copies] repacked matrices (params.repack) */
    int n_x8_copies;
};

/* model_repack.c: params.repack's copies. The bytes they will take (0: none wanted or the CPU
 * lacks the kernels) and in *extra the RAM that repacking needs beyond the weights (the largest
 * matrix, whose copy exists before the file's pages of it are released, plus every copy whose
 * source is not the file's mapping); then the copies themselves (hm_tensor.x8 of each), and
 * their release. */
uint64_t model_repack_bytes(const hm_model *m, uint64_t *extra);
hm_status model_repack(hm_model *m, hm_error *err);
void model_repack_free(hm_model *m);

#endif
