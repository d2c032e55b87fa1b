/* tokenizer.h - text <-> token ids for GGUF models, as llama.cpp tokenizes them.
 *
 * DESIGN: a tok_vocab is built once from a GGUF file's tokenizer.* keys (strings are copied, so
 * the gguf_ctx may be closed afterwards). Two models:
 *   - "gpt2" byte-level BPE: special/added tokens are split out first (longest match), the rest
 *     is cut into words by the pre-tokenizer named by tokenizer.ggml.pre (hand-written matchers
 *     of the HF regexes: gpt2/default/olmo, qwen2, llama-bpe, gpt-4o; Unicode categories from
 *     the generated table in unicode_data.c), each word is mapped byte -> GPT-2 byte symbol and
 *     merged by merge rank (lowest rank first, leftmost on ties).
 *   - "llama" SentencePiece: spaces become U+2581, one is prepended when add_space_prefix,
 *     adjacent symbols are merged by best score, unknown pieces fall back to <0xXX> byte tokens.
 * Decoding maps pieces back to bytes. tok_stream decodes one id at a time and holds back an
 * incomplete UTF-8 sequence at the end of what it has seen, so the pieces it returns are
 * always whole characters; tok_stream_flush returns what is held (unchanged, so that the
 * concatenated stream is byte-identical to tok_decode of all ids).
 * Nothing here prints or exits; errors are hm_status plus one line in hm_error.
 */
#ifndef HM_TOKENIZER_TOKENIZER_H
#define HM_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "gguf/gguf.h"

typedef enum { TOK_MODEL_BPE = 0, TOK_MODEL_SPM = 1 } tok_model;

/* Pre-tokenizers (byte-level BPE only). */
typedef enum {
    TOK_PRE_GPT2 = 0, /* "default", "gpt2", "olmo" and other GPT-2-regex names */
    TOK_PRE_QWEN2,    /* "qwen2" */
    TOK_PRE_LLAMA3,   /* "llama-bpe", "llama3" */
    TOK_PRE_O200K,    /* "gpt-4o" (o200k_base / o200k_harmony, gpt-oss) */
} tok_pre;

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
typedef enum {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
} tok_type;

typedef struct tok_vocab tok_vocab;

/* Loads the vocabulary from tokenizer.* keys. Missing required keys (tokenizer.ggml.model,
 * tokenizer.ggml.tokens, tokenizer.ggml.merges for gpt2) -> HM_ERR_NOT_FOUND naming the key; an
 * unknown model or pre-tokenizer name -> HM_ERR_UNSUPPORTED naming it. Optional keys: token_type
 * (default NORMAL), scores (default 0), bos/eos/eot/eom/unknown/padding ids, add_bos_token,
 * add_eos_token, add_space_prefix (SPM; default true). */
hm_status tok_vocab_load(const gguf_ctx *g, tok_vocab **out, hm_error *err);
void tok_vocab_free(tok_vocab *v);

int32_t tok_vocab_n_tokens(const tok_vocab *v);
tok_model tok_vocab_model(const tok_vocab *v);
tok_pre tok_vocab_pre(const tok_vocab *v);
const char *tok_vocab_pre_name(const tok_vocab *v); /* tokenizer.ggml.pre as given ("" if none) */

/* Special ids; -1 when the model has none. */
int32_t tok_bos(const tok_vocab *v);
int32_t tok_eos(const tok_vocab *v);
int32_t tok_eot(const tok_vocab *v);
int32_t tok_pad(const tok_vocab *v);
int32_t tok_unk(const tok_vocab *v);
bool tok_add_bos(const tok_vocab *v);
bool tok_add_eos(const tok_vocab *v);

/* True for end-of-generation tokens: eos, eot, eom and the control tokens llama.cpp treats as
 * such (<|im_end|>, <|endoftext|>, <|eot_id|>, <|eom_id|>, <|return|>, <|call|>, <|end|> ...). */
bool tok_is_eog(const tok_vocab *v, int32_t id);
/* True for CONTROL tokens (not rendered by decoding unless TOK_DECODE_SPECIAL). */
bool tok_is_control(const tok_vocab *v, int32_t id);
tok_type tok_token_type(const tok_vocab *v, int32_t id); /* TOK_TYPE_UNDEFINED if out of range */

/* The token's string as stored in the vocabulary (GPT-2 byte symbols / U+2581 not mapped back),
 * NUL-terminated; NULL when id is out of range. */
const char *tok_token_text(const tok_vocab *v, int32_t id);
/* Looks a token string up; -1 when absent. */
int32_t tok_token_find(const tok_vocab *v, const char *text, size_t len);

/* A growable id buffer; zero-initialise, free with tok_ids_free. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} tok_ids;
void tok_ids_free(tok_ids *t);

enum {
    TOK_ENCODE_ADD_SPECIAL = 1u << 0,    /* add BOS/EOS as the vocab's add_bos/add_eos say */
    TOK_ENCODE_PARSE_SPECIAL = 1u << 1,  /* match CONTROL and UNKNOWN tokens in the text
                                            (USER_DEFINED always match, as in llama.cpp) */
    TOK_ENCODE_REPLACE_INVALID = 1u << 2 /* invalid UTF-8: each bad byte becomes U+FFFD instead
                                            of failing with HM_ERR_FORMAT */
};

/* Appends the ids of text[0..len) to out (which may hold ids already). Invalid UTF-8 ->
 * HM_ERR_FORMAT naming the byte offset (unless TOK_ENCODE_REPLACE_INVALID). */
hm_status tok_encode(const tok_vocab *v, const char *text, size_t len, unsigned flags,
                     tok_ids *out, hm_error *err);

enum {
    TOK_DECODE_SPECIAL = 1u << 0,    /* render CONTROL tokens' text (default: they decode to "") */
    TOK_DECODE_STRIP_SPACE = 1u << 1, /* SPM with add_space_prefix: drop the one leading space of
                                         the first piece (undoes the prepended U+2581) */
    TOK_DECODE_REPLACE_INVALID = 1u << 2 /* tok_stream only: byte sequences that are not UTF-8
                                            become U+FFFD (one per maximal invalid subpart, and
                                            an incomplete sequence left at flush), as
                                            transformers' decode does: for text shown to users */
};

/* The bytes of one token: GPT-2 byte symbols mapped back to bytes, U+2581 -> ' ', <0xXX> ->
 * the byte. Writes min(len, cap) bytes to buf (no NUL) and returns len; 0 for an id out of range
 * or a CONTROL token without TOK_DECODE_SPECIAL. */
size_t tok_token_piece(const tok_vocab *v, int32_t id, unsigned flags, char *buf, size_t cap);

/* Decodes ids into a malloc'd NUL-terminated string (*out, length *out_len). An id out of range
 * is HM_ERR_RANGE naming it. */
hm_status tok_decode(const tok_vocab *v, const int32_t *ids, size_t n, unsigned flags,
                     char **out, size_t *out_len, hm_error *err);

/* Streaming detokeniser. */
typedef struct {
    const tok_vocab *v;
    unsigned flags;   /* TOK_DECODE_* */
    bool started;     /* a piece has been produced (for TOK_DECODE_STRIP_SPACE) */
    char held[4];     /* incomplete UTF-8 sequence carried to the next push */
    size_t n_held;
    char *buf;        /* output of the last push/flush: [len] bytes + NUL */
    size_t cap;
} tok_stream;

void tok_stream_init(tok_stream *s, const tok_vocab *v, unsigned flags);
void tok_stream_free(tok_stream *s);
/* Decodes id; *text (valid until the next call) gets the complete UTF-8 characters now
 * available (possibly none: *len 0). Invalid byte sequences that can never become valid are
 * passed through as they are (like tok_decode), or replaced with TOK_DECODE_REPLACE_INVALID. */
hm_status tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len,
                          hm_error *err);
/* Returns what is still held (an incomplete sequence at the end of the ids) and resets. */
void tok_stream_flush(tok_stream *s, const char **text, size_t *len);

#endif
