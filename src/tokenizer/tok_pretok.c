/* tok_pretok.c - the pre-tokenizer regexes of byte-level BPE models as hand-written matchers.
 *
 * DESIGN: each matcher returns the length (in code points) of the match that the model's regex,
 * run with leftmost-first alternation and backtracking (Oniguruma / fancy-regex / JS RegExp
 * semantics), finds at position i of a code point array whose classes are precomputed. The
 * alternatives are written out in the regex's order; comments give the alternative. \s is
 * Unicode White_Space; (?i:) contractions fold ASCII case only.
 *   gpt2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   qwen2: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*
 *          |\s*[\r\n]+|\s+(?!\S)|\s+            (llama3: \p{N}{1,3} instead of \p{N})
 *   o200k: [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|..)?
 *          |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|..)?
 *          |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 */
#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_unicode.h"

typedef struct {
    const uint32_t *cp; /* [n] code points */
    const uint8_t *cls; /* [n] TOK_UC_* */
    size_t n;
} text_view;

#define CLS(j) (t->cls[j])
static int is_l(const text_view *t, size_t j) { return j < t->n && CLS(j) >= TOK_UC_LU && CLS(j) <= TOK_UC_LO; }
static int is_n(const text_view *t, size_t j) { return j < t->n && CLS(j) == TOK_UC_N; }
static int is_ws(const text_view *t, size_t j) { return j < t->n && CLS(j) == TOK_UC_WS; }
static int is_nl(const text_view *t, size_t j) { return j < t->n && (t->cp[j] == '\r' || t->cp[j] == '\n'); }
/* [^\s\p{L}\p{N}] */
static int is_punct(const text_view *t, size_t j) { return j < t->n && !is_ws(t, j) && !is_l(t, j) && !is_n(t, j); }
/* [^\r\n\p{L}\p{N}] */
static int is_prefix(const text_view *t, size_t j) { return j < t->n && !is_nl(t, j) && !is_l(t, j) && !is_n(t, j); }
/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] */
static int is_upper(const text_view *t, size_t j) {
    return j < t->n && (CLS(j) == TOK_UC_LU || CLS(j) == TOK_UC_LT || CLS(j) == TOK_UC_LM ||
                        CLS(j) == TOK_UC_LO || CLS(j) == TOK_UC_M);
}
/* [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
static int is_lower(const text_view *t, size_t j) {
    return j < t->n && (CLS(j) == TOK_UC_LL || CLS(j) == TOK_UC_LM || CLS(j) == TOK_UC_LO ||
                        CLS(j) == TOK_UC_M);
}
#undef CLS

/* End of the run of characters with property f starting at j. */
static size_t run(const text_view *t, size_t j, int (*f)(const text_view *, size_t)) {
    while (f(t, j)) j++;
    return j;
}

static uint32_t fold(uint32_t c, int ci) { return (ci && c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d at j (case-insensitive when ci); length or 0. */
static size_t contraction(const text_view *t, size_t j, int ci) {
    if (j + 1 >= t->n || t->cp[j] != '\'') return 0;
    uint32_t a = fold(t->cp[j + 1], ci);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (j + 2 >= t->n) return 0;
    uint32_t b = fold(t->cp[j + 2], ci);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Whitespace tail shared by all: [\s*[\r\n]+ when nl_alt] | \s+(?!\S) | \s+ at i (is_ws(i)). */
static size_t match_space(const text_view *t, size_t i, int nl_alt) {
    size_t e = run(t, i, is_ws);
    if (nl_alt) {
        for (size_t q = e; q > i; q--)
            if (is_nl(t, q - 1)) return q - i;
    }
    if (e == t->n || e - i < 2) return e - i;
    return e - i - 1;
}

static size_t match_gpt2(const text_view *t, size_t i) {
    size_t k = contraction(t, i, 0);
    if (k) return k;
    size_t j = i + (t->cp[i] == ' ');
    if (is_l(t, j)) return run(t, j, is_l) - i;
    if (is_n(t, j)) return run(t, j, is_n) - i;
    if (is_punct(t, j)) return run(t, j, is_punct) - i;
    if (is_ws(t, i)) return match_space(t, i, 0);
    return 1;
}

static size_t match_qwen2(const text_view *t, size_t i, size_t max_digits) {
    size_t k = contraction(t, i, 1);
    if (k) return k;
    if (is_prefix(t, i) && is_l(t, i + 1)) return run(t, i + 1, is_l) - i;
    if (is_l(t, i)) return run(t, i, is_l) - i;
    if (is_n(t, i)) {
        size_t e = run(t, i, is_n);
        return e - i < max_digits ? e - i : max_digits;
    }
    size_t j = i + (t->cp[i] == ' ');
    if (is_punct(t, j)) return run(t, run(t, j, is_punct), is_nl) - i;
    if (is_ws(t, i)) return match_space(t, i, 1);
    return 1;
}

static int is_nl_slash(const text_view *t, size_t j) { return is_nl(t, j) || (j < t->n && t->cp[j] == '/'); }

/* o200k alternative 1 at s: UPPER* LOWER+ contraction?; end or 0. */
static size_t o200k_alt1(const text_view *t, size_t s) {
    size_t a = run(t, s, is_upper);
    for (size_t jj = a + 1; jj-- > s;) {
        if (!is_lower(t, jj)) continue;
        size_t e = run(t, jj, is_lower);
        return e + contraction(t, e, 1);
    }
    return 0;
}

/* o200k alternative 2 at s: UPPER+ LOWER* contraction?; end or 0. */
static size_t o200k_alt2(const text_view *t, size_t s) {
    size_t a = run(t, s, is_upper);
    if (a == s) return 0;
    size_t e = run(t, a, is_lower);
    return e + contraction(t, e, 1);
}

static size_t match_o200k(const text_view *t, size_t i) {
    int pre = is_prefix(t, i);
    size_t e;
    if (pre && (e = o200k_alt1(t, i + 1))) return e - i;
    if ((e = o200k_alt1(t, i))) return e - i;
    if (pre && (e = o200k_alt2(t, i + 1))) return e - i;
    if ((e = o200k_alt2(t, i))) return e - i;
    if (is_n(t, i)) {
        e = run(t, i, is_n);
        return e - i < 3 ? e - i : 3;
    }
    size_t j = i + (t->cp[i] == ' ');
    if (is_punct(t, j)) return run(t, run(t, j, is_punct), is_nl_slash) - i;
    if (is_ws(t, i)) return match_space(t, i, 1);
    return 1;
}

size_t tok_pretok_match(tok_pre pre, const uint32_t *cp, const uint8_t *cls, size_t n, size_t i) {
    text_view t = {cp, cls, n};
    switch (pre) {
    case TOK_PRE_QWEN2: return match_qwen2(&t, i, 1);
    case TOK_PRE_LLAMA3: return match_qwen2(&t, i, 3);
    case TOK_PRE_O200K: return match_o200k(&t, i);
    case TOK_PRE_GPT2:
    default: return match_gpt2(&t, i);
    }
}
