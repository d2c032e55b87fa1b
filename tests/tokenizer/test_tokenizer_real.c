/* test_tokenizer_real.c - hotmoe's tokenizer against the real Qwen3, gpt-oss (o200k_harmony) and
 * Mistral vocabularies: ids identical to the reference JS tokenizers' on a 12 kB mixed text and a
 * 9 kB adversarial one (each whole, and line by line), decode(encode(s)) == s, and streaming detokenisation
 * byte-identical to the full decode with only whole UTF-8 characters per step.
 * Reference ids: tests/tokenizer/data/NAME.ids, produced by tools/tokenizer/expected_ids.mjs
 * (command and package versions in docs/TOKENIZERS.md). */
#include <string.h>

#include "harness.h"
#include "tok_test_util.h"
#include "tokenizer/tok_unicode.h"

typedef struct {
    const char *s;
    size_t n;
} span;

/* Cases as expected_ids.mjs makes them: the whole text, then each line with its '\n'. */
static size_t make_cases(const char *text, size_t len, span *out, size_t cap) {
    size_t k = 0;
    out[k++] = (span){text, len};
    for (size_t i = 0; i < len && k < cap;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) + 1 : len;
        out[k++] = (span){text + i, e - i};
        i = e;
    }
    return k;
}

static int valid_utf8(const char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t k = tok_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

static void check_vocab(const char *text_name, const char *prefix, const char *name, unsigned enc_flags, unsigned dec_flags) {
    const tok_vocab *v = tt_vocab(name);
    HM_REQUIRE(v != NULL);
    size_t tlen, elen;
    char path[256];
    snprintf(path, sizeof(path), "tests/tokenizer/data/%s.txt", text_name);
    char *text = tt_read_file(path, &tlen);
    snprintf(path, sizeof(path), "tests/tokenizer/data/%s%s.ids", prefix, name);
    char *exp = tt_read_file(path, &elen);
    HM_REQUIRE(text && exp && tlen >= 9000);
    static span cases[2048];
    size_t nc = make_cases(text, tlen, cases, 2048);
    char *line = exp, *save = NULL;
    size_t bad = 0, total_ids = 0;
    for (size_t c = 0; c < nc; c++) {
        char *eol = strchr(line, '\n');
        HM_REQUIRE(eol != NULL);
        *eol = 0;
        tok_ids got = {0};
        hm_error err;
        HM_REQUIRE(tok_encode(v, cases[c].s, cases[c].n, enc_flags, &got, &err) == HM_OK);
        size_t i = 0;
        int same = 1;
        for (char *tk = strtok_r(line, " ", &save); tk; tk = strtok_r(NULL, " ", &save), i++) {
            int32_t id = (int32_t)strtol(tk, NULL, 10);
            if (i >= got.n || got.ids[i] != id) {
                if (same && bad < 5)
                    fprintf(stderr, "%s case %zu: first difference at id %zu: expected %d (%s), got %d (%s)\n", name, c, i, id,
                            tok_token_text(v, id), i < got.n ? got.ids[i] : -1, i < got.n ? tok_token_text(v, got.ids[i]) : "end");
                same = 0;
            }
        }
        if (i != got.n) same = 0;
        bad += !same;
        total_ids += got.n;
        /* decode(encode(s)) == s */
        char *dec;
        size_t dlen;
        HM_REQUIRE(tok_decode(v, got.ids, got.n, dec_flags, &dec, &dlen, &err) == HM_OK);
        HM_CHECK_MSG(dlen == cases[c].n && !memcmp(dec, cases[c].s, dlen), "%s case %zu: decode(encode(s)) != s", name, c);
        /* streaming, one token at a time */
        tok_stream st;
        tok_stream_init(&st, v, dec_flags);
        char *acc = malloc(dlen + 1);
        size_t an = 0;
        int stream_ok = 1;
        for (size_t t = 0; t < got.n && stream_ok; t++) {
            const char *p;
            size_t pn;
            HM_REQUIRE(tok_stream_push(&st, got.ids[t], &p, &pn, &err) == HM_OK);
            if (!valid_utf8(p, pn) || an + pn > dlen) stream_ok = 0;
            else memcpy(acc + an, p, pn), an += pn;
        }
        const char *p;
        size_t pn;
        tok_stream_flush(&st, &p, &pn);
        if (an + pn <= dlen) memcpy(acc + an, p, pn), an += pn;
        HM_CHECK_MSG(stream_ok && an == dlen && !memcmp(acc, dec, dlen), "%s case %zu: stream differs from decode", name, c);
        tok_stream_free(&st);
        free(acc);
        free(dec);
        tok_ids_free(&got);
        line = eol + 1;
    }
    HM_CHECK_MSG(bad == 0, "%s: %zu of %zu cases differ from the reference ids", name, bad, nc);
    printf("%s %s: %zu cases, %zu ids, %zu differ\n", text_name, name, nc, total_ids, bad);
    free(text);
    free(exp);
}

static void test_qwen3(void) { check_vocab("mixed", "", "qwen3", TOK_ENCODE_PARSE_SPECIAL, TOK_DECODE_SPECIAL); }
static void test_gptoss(void) { check_vocab("mixed", "", "gptoss", TOK_ENCODE_PARSE_SPECIAL, TOK_DECODE_SPECIAL); }
static void test_mistral(void) { check_vocab("mixed", "", "mistral", 0, TOK_DECODE_STRIP_SPACE); }
/* tools/tokenizer/make_adversarial.py: 541 short cases of tricky characters */
static void test_qwen3_adv(void) { check_vocab("adversarial", "adv_", "qwen3", TOK_ENCODE_PARSE_SPECIAL, TOK_DECODE_SPECIAL); }
static void test_gptoss_adv(void) { check_vocab("adversarial", "adv_", "gptoss", TOK_ENCODE_PARSE_SPECIAL, TOK_DECODE_SPECIAL); }
static void test_mistral_adv(void) { check_vocab("adversarial", "adv_", "mistral", 0, TOK_DECODE_STRIP_SPACE); }

HM_TEST_MAIN(test_qwen3, test_gptoss, test_mistral, test_qwen3_adv, test_gptoss_adv, test_mistral_adv)
