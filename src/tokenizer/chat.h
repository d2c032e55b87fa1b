/* chat.h - chat templates: a list of {role, content} messages -> the prompt text the model was
 * trained on, as the GGUF's `tokenizer.chat_template` (Jinja) renders it in transformers.
 *
 * DESIGN: no Jinja interpreter. chat_template_detect recognises the template's family by
 * distinctive substrings and reads the few literals that vary between models of a family
 * (ChatML's default system prompt, forge's shortened harmony preamble); chat_render is then a
 * fixed formatter per family that reproduces, character for character, what the Jinja renders
 * for messages with string contents (no tools, no tool calls). Families:
 *   chatml          <|im_start|>role\ncontent<|im_end|>\n ... (Qwen1.5/2/2.5/3, forge qwen3moe
 *                   and qwen2moe); Qwen3's real template also moves <think>..</think> out of
 *                   assistant contents and honours enable_thinking.
 *   harmony         gpt-oss: <|start|>system<|message|>{identity, cutoff, date, reasoning,
 *                   channels}<|end|><|start|>developer<|message|># Instructions\n\n{system}
 *                   \n\n<|end|> then <|start|>role<|message|>content<|end|> (OpenAI's template);
 *                   forge's shortened harmony template is rendered as that template is written.
 *   mistral         Mixtral-8x7B-Instruct-v0.1 (current): <s> [INST] {system\n\n}user [/INST]
 *                   assistant</s> ...
 *   mistral-legacy  the original Mixtral/Mistral v0.1 template (forge's): <s>[INST] user [/INST]
 *                   assistant</s>; a system message is refused as that template refuses it.
 *   tulu            OLMoE-Instruct (forge olmoe): <|system|>\n..\n<|user|>\n..\n<|assistant|>\n
 * An unrecognised template is HM_ERR_UNSUPPORTED with one line saying so; the user can then
 * name a family with --chat-template NAME (chat_template_from_name).
 */
#ifndef HM_TOKENIZER_CHAT_H
#define HM_TOKENIZER_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

typedef enum {
    CHAT_CHATML = 0,
    CHAT_HARMONY,
    CHAT_MISTRAL,
    CHAT_MISTRAL_LEGACY,
    CHAT_TULU,
    CHAT_FAMILY_COUNT
} chat_family;

typedef struct {
    chat_family family;
    bool qwen3_think;       /* chatml: Qwen3's <think> handling (real Qwen3 templates) */
    bool enable_thinking;   /* chatml: the template reads enable_thinking */
    char *default_system;   /* chatml: system turn used when messages[0] is not system (NULL:
                               none) */
    char *harmony_preamble; /* harmony from forge: the system message body as written in the
                               template, with "{reasoning}" where the effort goes (NULL: OpenAI's
                               template) */
    char *harmony_dev_prefix; /* harmony from forge: text before a developer message's content */
    char *harmony_dev_suffix; /* ... and after it (before <|end|>) */
    char *harmony_effort;     /* harmony from forge: the template's default reasoning effort */
} chat_template;

typedef struct {
    const char *role;    /* "system", "developer", "user", "assistant" */
    const char *content;
} chat_message;

typedef struct {
    bool add_generation_prompt;
    const char *bos_token;        /* the vocabulary's BOS/EOS text ("<s>"); NULL = "" */
    const char *eos_token;
    int enable_thinking;          /* chatml with enable_thinking: -1 undefined, 0 false, 1 true */
    const char *reasoning_effort; /* harmony: "low", "medium" or "high" (any other value is an
                                     HM_ERR_ARG of chat_render); NULL = the template's default
                                     ("medium") */
    const char *model_identity;   /* harmony (OpenAI's); NULL = "You are ChatGPT, a large
                                     language model trained by OpenAI." */
    const char *date;             /* harmony (OpenAI's) "Current date: YYYY-MM-DD"; NULL = today
                                     (UTC) */
} chat_render_opts;

chat_render_opts chat_render_default_opts(void);

/* Recognises a Jinja chat template. HM_ERR_UNSUPPORTED ("unrecognised chat template (...);
 * pass --chat-template NAME, one of chatml, harmony, mistral, mistral-legacy, tulu") when no
 * family matches. */
hm_status chat_template_detect(const char *jinja, size_t len, chat_template *out,
                               hm_error *err);
/* A family by name (see chat_family_name); HM_ERR_ARG listing the names otherwise. */
hm_status chat_template_from_name(const char *name, chat_template *out, hm_error *err);
/* override_name (non-NULL) wins; else tokenizer.chat_template of g (HM_ERR_NOT_FOUND when
 * absent, saying to pass --chat-template). */
hm_status chat_template_for_model(const gguf_ctx *g, const char *override_name,
                                  chat_template *out, hm_error *err);
void chat_template_free(chat_template *t);

const char *chat_family_name(chat_family f);
const char *chat_family_names(void); /* "chatml, harmony, mistral, mistral-legacy, tulu" */

/* The reasoning efforts of the harmony format (gpt-oss): true for "low", "medium", "high". */
#define CHAT_REASONING_EFFORTS "low, medium, high"
bool chat_reasoning_effort_valid(const char *effort);

/* Renders msgs into a malloc'd NUL-terminated string (*out, *out_len). Errors are what the
 * Jinja template raises (HM_ERR_ARG with its message): roles not alternating (mistral), a system
 * message (mistral-legacy), an unknown role; and (harmony) a reasoning effort other than
 * CHAT_REASONING_EFFORTS, which the template would write into the prompt as it is. opts NULL =
 * defaults. */
hm_status chat_render(const chat_template *t, const chat_message *msgs, size_t n,
                      const chat_render_opts *opts, char **out, size_t *out_len, hm_error *err);

/* Token texts that end an assistant turn for this family (NULL-terminated), or NULL when the
 * vocabulary's end-of-generation set (tok_is_eog) is the rule. harmony: <|return|>, <|call|>,
 * <|endoftext|> (not <|end|>, which closes the analysis message inside a turn). */
const char *const *chat_stop_texts(const chat_template *t);

/* The defaults with the vocabulary's BOS and EOS texts ("" when it has none). */
chat_render_opts chat_render_opts_for(const tok_vocab *v);
/* A rendered conversation's tokens: BOS as the vocabulary adds it, unless the template wrote
 * it already, then the text with its special tokens matched (appended to out). */
hm_status chat_tokenize(const tok_vocab *v, const char *text, size_t len,
                        tok_ids *out, hm_error *err);
/* The ids of the template's end-of-turn texts (chat_stop_texts) in v, at most cap; 0 when the
 * family has none (the vocabulary's end-of-generation set is the rule) or v has none of them. */
int chat_stop_ids(const chat_template *t, const tok_vocab *v, int32_t *ids, int cap);

/* What of a harmony reply (gpt-oss) a user sees: the final channel's text, and text before any
 * channel marker (a model that does not speak harmony, e.g. a forged one). Feed every token with
 * chat_harmony_token, then its decoded piece with chat_harmony_piece; the piece is shown when
 * that returns true. For another family every piece is shown. */
typedef struct {
    bool on;                                   /* harmony */
    int32_t id_channel, id_message, id_start, id_end; /* control tokens (-1: absent) */
    bool in_final, want_channel;
    char chan[16];
    size_t chan_n;
} chat_harmony;

void chat_harmony_init(chat_harmony *h, const chat_template *t, const tok_vocab *v);
void chat_harmony_token(chat_harmony *h, int32_t tok);
bool chat_harmony_piece(chat_harmony *h, const char *piece, size_t len);

#endif
