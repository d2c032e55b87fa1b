/* tok_internal.h - the tok_vocab layout and helpers shared by the tokenizer's files. */
#ifndef HM_TOKENIZER_TOK_INTERNAL_H
#define HM_TOKENIZER_TOK_INTERNAL_H

#include "tokenizer/tokenizer.h"

/* Merge table entry: (left id, right id) -> rank and result id. */
typedef struct {
    uint64_t key; /* (uint64)left << 32 | right; UINT64_MAX = empty slot */
    int32_t rank;
    int32_t result;
} tok_merge;

struct tok_vocab {
    tok_model model;
    tok_pre pre;
    char pre_name[64];
    int32_t n;          /* token count */
    char *arena;        /* all token strings, NUL-terminated */
    uint32_t *off;      /* [n] offset of token i in arena */
    uint32_t *len;      /* [n] byte length */
    uint8_t *type;      /* [n] tok_type */
    uint8_t *eog;       /* [n] 1 for end-of-generation tokens */
    float *score;       /* [n] SPM scores (0 when absent) */
    int32_t *hash;      /* [hash_cap] token ids by text hash, -1 empty */
    size_t hash_cap;    /* power of two */
    tok_merge *merges;  /* [merge_cap] open addressing */
    size_t merge_cap;   /* power of two; 0 for SPM */
    int32_t *specials;  /* [n_specials] CONTROL/USER_DEFINED ids, longest text first */
    size_t n_specials;
    uint8_t special_first[32]; /* bit set of first bytes of special tokens */
    int32_t byte_tok[256]; /* BPE: token of each byte's GPT-2 symbol; SPM: <0xXX>; -1 none */
    int32_t bos, eos, eot, eom, pad, unk;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
};

static inline const char *tok_text(const tok_vocab *v, int32_t id) { return v->arena + v->off[id]; }

/* Length in code points of the pre-token at code point i (tok_pretok.c). */
size_t tok_pretok_match(tok_pre pre, const uint32_t *cp, const uint8_t *cls, size_t n, size_t i);

/* GPT-2 byte <-> code point mapping (tok_vocab.c). */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not a byte symbol */

/* Merge lookup: rank (or -1) and result id. */
int32_t tok_merge_find(const tok_vocab *v, int32_t a, int32_t b, int32_t *result);

/* Appends ids (tok_encode helpers). */
hm_status tok_ids_push(tok_ids *t, int32_t id);
/* Encodes one special-free fragment (already valid UTF-8) with the vocab's model. */
hm_status tok_encode_bpe(const tok_vocab *v, const char *s, size_t n, tok_ids *out, hm_error *err);
hm_status tok_encode_spm(const tok_vocab *v, const char *s, size_t n, bool prefix_space,
                         tok_ids *out, hm_error *err);

#endif
