/* tok_encode.c - text -> ids: UTF-8 check, special-token split, byte-level BPE and SPM merging.
 *
 * DESIGN: the text is first checked (or repaired, with TOK_ENCODE_REPLACE_INVALID) to be UTF-8.
 * Special tokens are split out by a leftmost-longest scan (CONTROL and UNKNOWN only with
 * TOK_ENCODE_PARSE_SPECIAL; USER_DEFINED always, as llama.cpp does). Each fragment between them
 * is encoded by the model:
 *  - BPE: the fragment's code points and classes go to the pre-tokenizer; each pre-token's bytes
 *    start as byte-symbol tokens and are merged with a binary heap keyed by (rank, position),
 *    lowest first; a merged pair is checked to still be adjacent and unchanged when popped.
 *  - SPM: ' ' -> U+2581 (and one prepended on the first fragment when add_space_prefix), symbols
 *    are UTF-8 characters, a heap keyed by (-score, position) merges the best adjacent pair whose
 *    concatenation is a token; symbols left that are not tokens fall back to <0xXX> bytes.
 * Work buffers are allocated per call (sizes: code points / symbols of the fragment).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_unicode.h"

hm_status tok_ids_push(tok_ids *t, int32_t id) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        int32_t *p = realloc(t->ids, cap * sizeof(*p));
        if (!p) return HM_ERR_NOMEM;
        t->ids = p;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    return HM_OK;
}

void tok_ids_free(tok_ids *t) {
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

/* ---- binary heap of merge candidates ---- */
typedef struct {
    double key; /* rank (BPE) or -score (SPM): lower pops first */
    uint32_t left, right; /* symbol indices */
    uint32_t left_len, right_len; /* symbol lengths when pushed (staleness check) */
} cand;

typedef struct {
    cand *a;
    size_t n, cap;
} heap;

static int cand_less(const cand *x, const cand *y) { return x->key < y->key || (x->key == y->key && x->left < y->left); }

static hm_status heap_push(heap *h, cand c) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        cand *p = realloc(h->a, cap * sizeof(*p));
        if (!p) return HM_ERR_NOMEM;
        h->a = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && cand_less(&c, &h->a[(i - 1) / 2])) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = c;
    return HM_OK;
}

static cand heap_pop(heap *h) {
    cand top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && cand_less(&h->a[c + 1], &h->a[c])) c++;
        if (!cand_less(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

/* Symbols of one word: a doubly linked list over [n] entries. */
typedef struct {
    int32_t id;   /* token id (BPE) or -1 when the text is not a token (SPM) */
    uint32_t off, len; /* bytes in the word (SPM) / byte count (BPE) */
    int32_t prev, next;
} sym;

/* ---- BPE ---- */

static hm_status bpe_try(const tok_vocab *v, heap *h, const sym *s, int32_t l) {
    if (l < 0 || s[l].next < 0) return HM_OK;
    int32_t r = s[l].next, res;
    int32_t rank = tok_merge_find(v, s[l].id, s[r].id, &res);
    if (rank < 0) return HM_OK;
    return heap_push(h, (cand){(double)rank, (uint32_t)l, (uint32_t)r, s[l].len, s[r].len});
}

static hm_status bpe_word(const tok_vocab *v, const unsigned char *w, size_t n, sym *s, heap *h, char *tmp, tok_ids *out) {
    if (v->ignore_merges) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += tok_utf8_encode(tok_byte_to_cp(w[i]), tmp + k);
        int32_t id = tok_token_find(v, tmp, k);
        if (id >= 0) return tok_ids_push(out, id);
    }
    for (size_t i = 0; i < n; i++)
        s[i] = (sym){v->byte_tok[w[i]], (uint32_t)i, 1, (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    h->n = 0;
    hm_status st = HM_OK;
    for (size_t i = 0; i + 1 < n && st == HM_OK; i++) st = bpe_try(v, h, s, (int32_t)i);
    while (st == HM_OK && h->n) {
        cand c = heap_pop(h);
        sym *l = &s[c.left], *r = &s[c.right];
        if (l->len == 0 || r->len == 0 || l->next != (int32_t)c.right || l->len != c.left_len || r->len != c.right_len) continue;
        int32_t res;
        tok_merge_find(v, l->id, r->id, &res);
        l->id = res;
        l->len += r->len;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = (int32_t)c.left;
        r->len = 0;
        st = bpe_try(v, h, s, l->prev);
        if (st == HM_OK) st = bpe_try(v, h, s, (int32_t)c.left);
    }
    for (int32_t i = 0; st == HM_OK && i >= 0; i = s[i].next) {
        if (s[i].id >= 0) st = tok_ids_push(out, s[i].id);
        else if (v->unk >= 0) st = tok_ids_push(out, v->unk); /* a byte with no symbol token */
    }
    return st;
}

hm_status tok_encode_bpe(const tok_vocab *v, const char *text, size_t n, tok_ids *out, hm_error *err) {
    if (n == 0) return HM_OK;
    uint32_t *cp = malloc(n * sizeof(*cp));
    uint32_t *boff = malloc((n + 1) * sizeof(*boff));
    uint8_t *cls = malloc(n);
    sym *s = malloc(n * sizeof(*s));
    char *tmp = malloc(2 * n + 1);
    heap h = {0};
    hm_status st = HM_OK;
    if (!cp || !boff || !cls || !s || !tmp) {
        st = hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory for %zu bytes of text", n);
        goto done;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; m++) {
        size_t k = tok_utf8_decode((const unsigned char *)text + i, n - i, &cp[m]);
        boff[m] = (uint32_t)i;
        cls[m] = (uint8_t)tok_uc_class(cp[m]);
        i += k ? k : 1; /* the caller has validated; stay safe anyway */
    }
    boff[m] = (uint32_t)n;
    for (size_t i = 0; i < m && st == HM_OK;) {
        size_t k = tok_pretok_match(v->pre, cp, cls, m, i);
        if (k == 0) k = 1;
        st = bpe_word(v, (const unsigned char *)text + boff[i], boff[i + k] - boff[i], s, &h, tmp, out);
        i += k;
    }
    if (st != HM_OK) st = hm_error_set(err, st, "tokenizer: out of memory");
done:
    free(cp);
    free(boff);
    free(cls);
    free(s);
    free(tmp);
    free(h.a);
    return st;
}

/* ---- SentencePiece ---- */

static hm_status spm_try(const tok_vocab *v, heap *h, const sym *s, const char *t, int32_t l) {
    if (l < 0 || s[l].next < 0) return HM_OK;
    int32_t r = s[l].next;
    int32_t id = tok_token_find(v, t + s[l].off, s[l].len + s[r].len);
    if (id < 0) return HM_OK;
    return heap_push(h, (cand){-(double)v->score[id], (uint32_t)l, (uint32_t)r, s[l].len, s[r].len});
}

hm_status tok_encode_spm(const tok_vocab *v, const char *text, size_t n, bool prefix_space, tok_ids *out, hm_error *err) {
    if (n == 0) return HM_OK;
    size_t cap = 3 * n + 3; /* every ' ' becomes 3 bytes */
    char *t = malloc(cap);
    sym *s = malloc((cap) * sizeof(*s));
    heap h = {0};
    hm_status st = HM_OK;
    if (!t || !s) {
        st = hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory for %zu bytes of text", n);
        goto done;
    }
    size_t m = 0;
    if (prefix_space) {
        memcpy(t, "\xE2\x96\x81", 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] == ' ') {
            memcpy(t + m, "\xE2\x96\x81", 3);
            m += 3;
        } else {
            t[m++] = text[i];
        }
    }
    int32_t ns = 0;
    for (size_t i = 0; i < m; ns++) {
        size_t k = tok_utf8_len((unsigned char)t[i]);
        if (k == 0 || i + k > m) k = 1;
        s[ns] = (sym){-1, (uint32_t)i, (uint32_t)k, ns - 1, -1};
        if (ns > 0) s[ns - 1].next = ns;
        i += k;
    }
    for (int32_t i = 0; i + 1 < ns && st == HM_OK; i++) st = spm_try(v, &h, s, t, i);
    while (st == HM_OK && h.n) {
        cand c = heap_pop(&h);
        sym *l = &s[c.left], *r = &s[c.right];
        if (l->len == 0 || r->len == 0 || l->next != (int32_t)c.right || l->len != c.left_len || r->len != c.right_len) continue;
        l->len += r->len;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = (int32_t)c.left;
        r->len = 0;
        st = spm_try(v, &h, s, t, l->prev);
        if (st == HM_OK) st = spm_try(v, &h, s, t, (int32_t)c.left);
    }
    for (int32_t i = 0; st == HM_OK && i >= 0 && ns > 0; i = s[i].next) {
        int32_t id = tok_token_find(v, t + s[i].off, s[i].len);
        if (id >= 0) {
            st = tok_ids_push(out, id);
            continue;
        }
        for (uint32_t k = 0; k < s[i].len && st == HM_OK; k++) {
            int32_t b = v->byte_tok[(unsigned char)t[s[i].off + k]];
            st = tok_ids_push(out, b >= 0 ? b : v->unk >= 0 ? v->unk : 0);
        }
    }
    if (st != HM_OK) st = hm_error_set(err, st, "tokenizer: out of memory");
done:
    free(t);
    free(s);
    free(h.a);
    return st;
}

/* ---- entry point ---- */

/* Checks text is UTF-8; with repair, *fixed gets a copy where each bad byte is U+FFFD. */
static hm_status check_utf8(const char *text, size_t len, bool repair, char **fixed, size_t *fixed_len, hm_error *err) {
    *fixed = NULL;
    size_t i = 0;
    uint32_t cp;
    while (i < len) {
        size_t k = tok_utf8_decode((const unsigned char *)text + i, len - i, &cp);
        if (k == 0) break;
        i += k;
    }
    if (i == len) return HM_OK;
    if (!repair)
        return hm_error_set(err, HM_ERR_FORMAT, "input is not valid UTF-8 at byte offset %zu (byte 0x%02X)", i, (unsigned char)text[i]);
    char *o = malloc(3 * len + 1);
    if (!o) return hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory");
    size_t m = 0;
    for (i = 0; i < len;) {
        size_t k = tok_utf8_decode((const unsigned char *)text + i, len - i, &cp);
        if (k == 0) {
            memcpy(o + m, "\xEF\xBF\xBD", 3);
            m += 3;
            i++;
        } else {
            memcpy(o + m, text + i, k);
            m += k;
            i += k;
        }
    }
    *fixed = o;
    *fixed_len = m;
    return HM_OK;
}

/* Longest special token matching at text[i]; -1 if none. */
static int32_t match_special(const tok_vocab *v, const char *text, size_t len, size_t i, bool parse_control) {
    unsigned char c = (unsigned char)text[i];
    if (!(v->special_first[c >> 3] & (1u << (c & 7)))) return -1;
    for (size_t k = 0; k < v->n_specials; k++) {
        int32_t id = v->specials[k];
        if (v->type[id] != TOK_TYPE_USER_DEFINED && !parse_control) continue; /* CONTROL, UNKNOWN */
        uint32_t l = v->len[id];
        if (l <= len - i && !memcmp(text + i, tok_text(v, id), l)) return id;
    }
    return -1;
}

hm_status tok_encode(const tok_vocab *v, const char *text, size_t len, unsigned flags, tok_ids *out, hm_error *err) {
    if (!v || !out || (!text && len)) return hm_error_set(err, HM_ERR_ARG, "tok_encode: NULL argument");
    char *fixed;
    size_t fixed_len;
    hm_status st = check_utf8(text, len, flags & TOK_ENCODE_REPLACE_INVALID, &fixed, &fixed_len, err);
    if (st != HM_OK) return st;
    if (fixed) {
        text = fixed;
        len = fixed_len;
    }
    bool add = flags & TOK_ENCODE_ADD_SPECIAL, parse = flags & TOK_ENCODE_PARSE_SPECIAL;
    if (add && tok_add_bos(v)) st = tok_ids_push(out, v->bos);
    bool prev_special = true; /* SPM: a space is prepended at the start and after specials */
    size_t start = 0;
    for (size_t i = 0; st == HM_OK && i <= len; i++) {
        int32_t sp = i < len ? match_special(v, text, len, i, parse) : -1;
        if (sp < 0 && i < len) continue;
        if (i > start) {
            if (v->model == TOK_MODEL_BPE) st = tok_encode_bpe(v, text + start, i - start, out, err);
            else st = tok_encode_spm(v, text + start, i - start, v->add_space_prefix && prev_special, out, err);
            prev_special = false;
            if (st != HM_OK) break;
        }
        if (sp >= 0) {
            st = tok_ids_push(out, sp);
            prev_special = true;
            i += v->len[sp] - 1;
            start = i + 1;
        }
    }
    if (st == HM_OK && add && tok_add_eos(v)) st = tok_ids_push(out, v->eos);
    free(fixed);
    if (st == HM_ERR_NOMEM && err && err->status != HM_ERR_NOMEM) hm_error_set(err, st, "tokenizer: out of memory");
    return st;
}
