/* forge_hf_internal.h - the HF writer's tokenizer half (forge_hf_tok.c). */
#ifndef HM_FORGE_HF_INTERNAL_H
#define HM_FORGE_HF_INTERNAL_H

#include "forge/forge.h"

/* Writes tokenizer.json (a `tokenizers` BPE model matching the GGUF vocabulary) and
 * tokenizer_config.json (special tokens, chat template) into dir. */
hm_status forge_hf_write_tokenizer(const char *dir, const forge_preset *p, const forge_vocab *v,
                                   hm_error *err);

#endif
