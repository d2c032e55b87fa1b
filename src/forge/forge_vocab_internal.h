/* forge_vocab_internal.h - pieces shared by forge's tokenizer builder and HF writer. */
#ifndef HM_FORGE_VOCAB_INTERNAL_H
#define HM_FORGE_VOCAB_INTERNAL_H

#include "forge/forge.h"

const char *forge_vocab_training_text(void);
/* The chat template (Jinja, as the real model's tokenizer_config.json has it) for an arch. */
const char *forge_chat_template(forge_arch a);
/* HF pre-tokenizer regex for a llama.cpp pre-tokenizer name ("qwen2", "gpt-4o", "olmo"). */
const char *forge_pretok_regex(const char *pre);

#endif
