/* tok_unicode.h - Unicode character classes for the pre-tokenizers (internal to src/tokenizer).
 *
 * DESIGN: one sorted table of code point ranges (generated: unicode_data.c, by
 * tools/gen_unicode_table.py) gives each code point one class; lookups are a binary search.
 * UTF-8 decoding here is strict (no overlongs, surrogates or values above U+10FFFF).
 */
#ifndef HM_TOKENIZER_TOK_UNICODE_H
#define HM_TOKENIZER_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    TOK_UC_OTHER = 0,
    TOK_UC_LU = 1, TOK_UC_LL = 2, TOK_UC_LT = 3, TOK_UC_LM = 4, TOK_UC_LO = 5,
    TOK_UC_M = 6,  /* Mn, Mc, Me */
    TOK_UC_N = 7,  /* Nd, Nl, No */
    TOK_UC_WS = 8, /* White_Space */
};

typedef struct {
    uint32_t first, last;
    uint8_t cls;
} tok_unicode_range;

extern const char tok_unicode_version[];
extern const uint32_t tok_unicode_n_ranges;
extern const tok_unicode_range tok_unicode_ranges[];

/* Class of a code point (TOK_UC_*). */
int tok_uc_class(uint32_t cp);

/* Decodes one UTF-8 character at s[0..n) (n >= 1): returns its length (1..4) and sets *cp, or
 * returns 0 when the bytes there are not valid UTF-8. */
size_t tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Encodes cp into out (4 bytes room); returns the length. */
size_t tok_utf8_encode(uint32_t cp, char *out);
/* Length a UTF-8 sequence starting with lead byte b claims (1..4), 0 for a byte that cannot
 * start one. */
size_t tok_utf8_len(unsigned char b);

#endif
