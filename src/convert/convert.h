/* convert.h - `hotmoe convert`: a HuggingFace checkpoint folder (config.json, *.safetensors,
 * tokenizer.json, tokenizer_config.json) to a GGUF file, the inverse of forge's HF writer.
 *
 * DESIGN: the checkpoint's config.json becomes a forge_preset (convert_config.c), its tokenizer
 * files a forge_vocab (convert_vocab.c). forge then supplies everything that defines the GGUF:
 * forge_tensors_build gives the tensor names, shapes and per-tensor types of the type mix, and
 * forge_hf_plan gives, for each GGUF tensor, the transformers tensors it is made of and the
 * layout change (convert_hf_to_gguf's Mixtral q/k permutation, expert stacking, gpt-oss's fused
 * gate_up, the hybrids' regrouped and reordered delta-net heads, A_log, zero-centred norms).
 * convert_gguf.c inverts those operations row by row from memory-mapped safetensors
 * (convert_st.c) and streams each tensor through the same quantisers forge uses, so a forged
 * f32 HF twin converts to exactly the bytes `forge --type T` writes. See docs/CONVERT.md.
 */
#ifndef HM_CONVERT_CONVERT_H
#define HM_CONVERT_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "forge/forge.h"

typedef struct {
    const char *hf_dir;   /* checkpoint folder */
    const char *out_path; /* GGUF to write */
    forge_mix mix;
    const char *name; /* general.name; NULL: the folder's base name */
    int n_threads;    /* encoding threads; 0: online CPUs */
    bool progress;    /* progress bar on stderr */
} convert_job;

typedef struct {
    const char *arch; /* GGUF general.architecture (static string) */
    int n_tensors;
    int64_t n_params;
    uint64_t bytes; /* GGUF file size */
    double seconds;
    char note[256]; /* "" or one line the user should see (an MTP block left out) */
} convert_result;

/* Converts job->hf_dir to job->out_path; on failure removes the partial output and says in err
 * which file, tensor or field is wrong. */
hm_status convert_run(const convert_job *job, convert_result *res, hm_error *err);

/* The HF architecture classes convert reads, for messages: "Qwen3MoeForCausalLM, ...". */
const char *convert_supported_archs(void);

#endif
