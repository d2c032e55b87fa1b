/* tok_unicode.c - class lookup in the generated range table, strict UTF-8 coding. */
#include "tokenizer/tok_unicode.h"

int tok_uc_class(uint32_t cp) {
    if (cp < 0x80) { /* ASCII fast path */
        if ((cp >= 'a' && cp <= 'z')) return TOK_UC_LL;
        if ((cp >= 'A' && cp <= 'Z')) return TOK_UC_LU;
        if (cp >= '0' && cp <= '9') return TOK_UC_N;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return TOK_UC_WS;
        return TOK_UC_OTHER;
    }
    uint32_t lo = 0, hi = tok_unicode_n_ranges;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const tok_unicode_range *r = &tok_unicode_ranges[mid];
        if (cp < r->first) hi = mid;
        else if (cp > r->last) lo = mid + 1;
        else return r->cls;
    }
    return TOK_UC_OTHER;
}

size_t tok_utf8_len(unsigned char b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

size_t tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    size_t len = tok_utf8_len(s[0]);
    if (len == 0 || len > n) return 0;
    if (len == 1) {
        *cp = s[0];
        return 1;
    }
    uint32_t c = s[0] & (0x7F >> len);
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[k] & 0x3F);
    }
    if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10FFFF)) ||
        (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return len;
}

size_t tok_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}
