/* tok_decode.c - ids -> bytes: token pieces, whole-sequence decoding, streaming detokeniser.
 *
 * DESIGN: a piece is computed from the token's text and type alone (BPE: GPT-2 byte symbols back
 * to bytes, other characters kept; SPM: U+2581 -> ' ', <0xXX> -> that byte; CONTROL -> "" unless
 * TOK_DECODE_SPECIAL; SPM UNKNOWN -> U+2585 like llama.cpp). tok_decode and tok_stream share
 * piece_append, so the stream's output concatenates to exactly tok_decode's. The stream keeps
 * at most 3 bytes (an incomplete UTF-8 sequence at the end) between pushes.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_unicode.h"

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static hm_status buf_reserve(buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return HM_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return HM_ERR_NOMEM;
    b->p = p;
    b->cap = cap;
    return HM_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Writes the piece of id to out (room: 4 * token length + 3 always suffices); returns length. */
static size_t piece_raw(const tok_vocab *v, int32_t id, unsigned flags, char *out) {
    const char *t = tok_text(v, id);
    size_t n = v->len[id], m = 0;
    switch (v->type[id]) {
    case TOK_TYPE_CONTROL:
        if (!(flags & TOK_DECODE_SPECIAL)) return 0;
        memcpy(out, t, n);
        return n;
    case TOK_TYPE_USER_DEFINED:
        memcpy(out, t, n);
        return n;
    case TOK_TYPE_UNUSED:
        return 0;
    default:
        break;
    }
    if (v->model == TOK_MODEL_SPM) {
        if (v->type[id] == TOK_TYPE_BYTE && n == 6 && hexval(t[3]) >= 0 && hexval(t[4]) >= 0) {
            out[0] = (char)(hexval(t[3]) * 16 + hexval(t[4]));
            return 1;
        }
        if (v->type[id] == TOK_TYPE_UNKNOWN) {
            memcpy(out, "\xE2\x96\x85", 3);
            return 3;
        }
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && !memcmp(t + i, "\xE2\x96\x81", 3)) {
                out[m++] = ' ';
                i += 3;
            } else {
                out[m++] = t[i++];
            }
        }
        return m;
    }
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_decode((const unsigned char *)t + i, n - i, &cp);
        int b = k ? tok_cp_to_byte(cp) : -1;
        if (b >= 0) {
            out[m++] = (char)b;
        } else {
            if (k == 0) k = 1;
            memcpy(out + m, t + i, k);
            m += k;
        }
        i += k;
    }
    return m;
}

size_t tok_token_piece(const tok_vocab *v, int32_t id, unsigned flags, char *out, size_t cap) {
    if (!v || id < 0 || id >= v->n) return 0;
    char small[256];
    size_t need = (size_t)v->len[id] + 4;
    char *tmp = need <= sizeof(small) ? small : malloc(need);
    if (!tmp) return 0;
    size_t n = piece_raw(v, id, flags, tmp);
    if (out) memcpy(out, tmp, n < cap ? n : cap);
    if (tmp != small) free(tmp);
    return n;
}

/* Appends id's piece to b; strips one leading space from the first non-empty piece when asked. */
static hm_status piece_append(const tok_vocab *v, int32_t id, unsigned flags, bool *started, buf *b) {
    if (buf_reserve(b, (size_t)v->len[id] + 4) != HM_OK) return HM_ERR_NOMEM;
    char *dst = b->p + b->n;
    size_t n = piece_raw(v, id, flags, dst);
    if (n == 0) return HM_OK;
    if (!*started && (flags & TOK_DECODE_STRIP_SPACE) && v->model == TOK_MODEL_SPM && v->add_space_prefix && dst[0] == ' ') {
        memmove(dst, dst + 1, n - 1);
        n--;
    }
    *started = true;
    b->n += n;
    b->p[b->n] = 0;
    return HM_OK;
}

hm_status tok_decode(const tok_vocab *v, const int32_t *ids, size_t n, unsigned flags, char **out, size_t *out_len, hm_error *err) {
    buf b = {0};
    bool started = false;
    *out = NULL;
    if (out_len) *out_len = 0;
    if (buf_reserve(&b, 0) != HM_OK) return hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory");
    b.p[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n) {
            free(b.p);
            return hm_error_set(err, HM_ERR_RANGE, "token id %d at position %zu is out of range (vocab has %d)", ids[i], i, v->n);
        }
        if (piece_append(v, ids[i], flags, &started, &b) != HM_OK) {
            free(b.p);
            return hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory");
        }
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return HM_OK;
}

/* ---- streaming ---- */

void tok_stream_init(tok_stream *s, const tok_vocab *v, unsigned flags) {
    memset(s, 0, sizeof(*s));
    s->v = v;
    s->flags = flags;
}

void tok_stream_free(tok_stream *s) {
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
}

/* Bytes at the end of p[0..n) that start a UTF-8 sequence not yet complete (0..3). */
static size_t incomplete_tail(const char *p, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)p[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        size_t need = tok_utf8_len(c);
        return need > back ? back : 0;
    }
    return 0;
}

/* Replaces what is not UTF-8 in b->p[0..n) by U+FFFD: one per maximal subpart (a lead byte
 * and the continuation bytes that follow it, up to the length it claims), else one per byte. */
static hm_status replace_invalid(buf *b) {
    const unsigned char *p = (const unsigned char *)b->p;
    size_t bad = 0;
    for (size_t i = 0; i < b->n;) {
        uint32_t cp;
        size_t l = tok_utf8_decode(p + i, b->n - i, &cp);
        bad += l == 0;
        i += l ? l : 1;
    }
    if (!bad) return HM_OK;
    char *t = malloc(b->n + 2 * bad + 1);
    if (!t) return HM_ERR_NOMEM;
    size_t o = 0;
    for (size_t i = 0; i < b->n;) {
        uint32_t cp;
        size_t l = tok_utf8_decode(p + i, b->n - i, &cp);
        if (l) {
            memcpy(t + o, p + i, l);
            o += l;
            i += l;
            continue;
        }
        size_t claim = tok_utf8_len(p[i]), j = 1;
        while (j < claim && i + j < b->n && (p[i + j] & 0xC0) == 0x80) j++;
        memcpy(t + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += j;
    }
    b->n = 0;
    if (buf_reserve(b, o) != HM_OK) {
        free(t);
        return HM_ERR_NOMEM;
    }
    memcpy(b->p, t, o);
    b->n = o;
    free(t);
    return HM_OK;
}

hm_status tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len, hm_error *err) {
    *text = "";
    *len = 0;
    if (id < 0 || id >= s->v->n) return hm_error_set(err, HM_ERR_RANGE, "token id %d is out of range (vocab has %d)", id, s->v->n);
    buf b = {s->buf, 0, s->cap};
    if (buf_reserve(&b, s->n_held) != HM_OK) return hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(b.p, s->held, s->n_held);
    b.n = s->n_held;
    hm_status st = piece_append(s->v, id, s->flags, &s->started, &b);
    s->buf = b.p;
    s->cap = b.cap;
    if (st != HM_OK) return hm_error_set(err, st, "tokenizer: out of memory");
    size_t keep = incomplete_tail(b.p, b.n);
    memcpy(s->held, b.p + b.n - keep, keep);
    s->n_held = keep;
    b.n -= keep;
    if (s->flags & TOK_DECODE_REPLACE_INVALID) {
        st = replace_invalid(&b);
        s->buf = b.p;
        s->cap = b.cap;
        if (st != HM_OK) return hm_error_set(err, st, "tokenizer: out of memory");
    }
    b.p[b.n] = 0;
    *text = b.p;
    *len = b.n;
    return HM_OK;
}

void tok_stream_flush(tok_stream *s, const char **text, size_t *len) {
    buf b = {s->buf, 0, s->cap};
    *text = "";
    *len = 0;
    if (buf_reserve(&b, 3) != HM_OK) return;
    s->buf = b.p;
    s->cap = b.cap;
    memcpy(b.p, s->held, s->n_held);
    size_t n = s->n_held;
    if ((s->flags & TOK_DECODE_REPLACE_INVALID) && n) { /* an incomplete last character */
        memcpy(b.p, "\xEF\xBF\xBD", 3);
        n = 3;
    }
    b.p[n] = 0;
    *text = b.p;
    *len = n;
    s->n_held = 0;
    s->started = false;
}
