/* forge_vocab_tmpl.c - chat templates (Jinja, in the real models' style) and the HF
 * pre-tokenizer regexes that go with llama.cpp's pre-tokenizer names. */
#include <string.h>

#include "forge/forge_vocab_internal.h"

/* Qwen3: ChatML with the thinking switch */
static const char k_chatml_qwen3[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

/* Qwen1.5 chat: ChatML with the default system prompt */
static const char k_chatml_qwen2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* Mixtral-8x7B-Instruct-v0.1 */
static const char k_mistral[] =
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}";

/* OLMoE-1B-7B-0924-Instruct (Tulu format) */
static const char k_tulu[] =
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\\n' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{% if not loop.last %}"
    "{{ '<|assistant|>\\n'  + message['content'] + eos_token + '\\n' }}"
    "{% else %}{{ '<|assistant|>\\n'  + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}";

/* gpt-oss: harmony (the system header, developer instructions, final-channel answers). Newlines
 * are string-literal expressions ({{ '\\n' }}): in raw template text Jinja would emit a
 * backslash and an 'n'. */
static const char k_harmony[] =
    "{#- harmony -#}"
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.{{ '\\n' }}"
    "Knowledge cutoff: 2024-06{{ '\\n\\n' }}Reasoning: {{ reasoning_effort | default('medium') }}"
    "{{ '\\n\\n' }}"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' or message['role'] == 'developer' -%}"
    "<|start|>developer<|message|># Instructions{{ '\\n\\n' }}{{ message['content'] }}<|end|>"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- if message.get('thinking') -%}<|start|>assistant<|channel|>analysis<|message|>"
    "{{ message['thinking'] }}<|end|>{%- endif -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ message['content'] }}"
    "{%- if loop.last and not add_generation_prompt -%}<|return|>{%- else -%}<|end|>{%- endif -%}"
    "{%- else -%}<|start|>{{ message['role'] }}<|message|>{{ message['content'] }}<|end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}";

const char *forge_chat_template(forge_arch a) {
    switch (a) {
    case FORGE_ARCH_QWEN3MOE:
    case FORGE_ARCH_QWEN3NEXT:
    case FORGE_ARCH_QWEN35MOE:
    case FORGE_ARCH_GEMMA4: return k_chatml_qwen3; /* with the vocabulary's Qwen3 specials */
    case FORGE_ARCH_QWEN2MOE: return k_chatml_qwen2;
    case FORGE_ARCH_LLAMA: return k_mistral;
    case FORGE_ARCH_OLMOE: return k_tulu;
    case FORGE_ARCH_GPTOSS: return k_harmony;
    default: return "";
    }
}

static const char k_re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_o200k[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *forge_pretok_regex(const char *pre) {
    if (!strcmp(pre, "qwen2")) return k_re_qwen2;
    if (!strcmp(pre, "gpt-4o")) return k_re_o200k;
    return NULL; /* olmo: GPT-2's own ByteLevel regex */
}
