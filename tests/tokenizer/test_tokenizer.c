/* test_tokenizer.c - tokenizer units: the four pre-tokenizers against JavaScript RegExp splits
 * of the 12 kB mixed text and the adversarial one (data/splits_*.txt, from
 * tools/tokenizer/expected_splits.mjs),
 * metadata errors, invalid UTF-8 handling, special-token parsing, BOS/space-prefix rules,
 * end-of-generation ids, decoding errors and the streaming detokeniser's hold-back. */
#include <string.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "tok_test_util.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_unicode.h"

static void check_splits(const char *text_name, const char *name, tok_pre pre) {
    size_t tlen;
    char path[256];
    snprintf(path, sizeof(path), "tests/tokenizer/data/%s.txt", text_name);
    char *text = tt_read_file(path, &tlen);
    snprintf(path, sizeof(path), "tests/tokenizer/data/splits_%s%s.txt", strcmp(text_name, "mixed") ? "adv_" : "", name);
    char *exp = tt_read_file(path, NULL);
    HM_REQUIRE(text && exp);
    uint32_t *cp = malloc(tlen * sizeof(*cp));
    uint8_t *cls = malloc(tlen);
    size_t *boff = malloc((tlen + 1) * sizeof(*boff));
    size_t m = 0;
    for (size_t i = 0; i < tlen; m++) {
        size_t k = tok_utf8_decode((const unsigned char *)text + i, tlen - i, &cp[m]);
        HM_REQUIRE(k > 0);
        cls[m] = (uint8_t)tok_uc_class(cp[m]);
        boff[m] = i;
        i += k;
    }
    boff[m] = tlen;
    size_t i = 0, piece = 0, bad = 0;
    char *save = NULL;
    for (char *tk = strtok_r(exp, " \n", &save); tk && i < m; tk = strtok_r(NULL, " \n", &save), piece++) {
        size_t want = (size_t)strtoul(tk, NULL, 10);
        size_t k = tok_pretok_match(pre, cp, cls, m, i);
        size_t got = boff[i + k] - boff[i];
        if (got != want) {
            if (bad++ < 3)
                fprintf(stderr, "%s: piece %zu at byte %zu: expected %zu bytes \"%.*s\", got %zu\n", name, piece, boff[i], want,
                        (int)want, text + boff[i], got);
            /* resynchronise on the reference */
            size_t e = boff[i] + want;
            while (i < m && boff[i] < e) i++;
            continue;
        }
        i += k;
    }
    HM_CHECK_MSG(bad == 0 && i == m, "%s: %zu of %zu pieces differ from JS RegExp", name, bad, piece);
    free(cp);
    free(cls);
    free(boff);
    free(text);
    free(exp);
}

static void test_pretok_gpt2(void) { check_splits("mixed", "gpt2", TOK_PRE_GPT2); check_splits("adversarial", "gpt2", TOK_PRE_GPT2); }
static void test_pretok_qwen2(void) { check_splits("mixed", "qwen2", TOK_PRE_QWEN2); check_splits("adversarial", "qwen2", TOK_PRE_QWEN2); }
static void test_pretok_llama3(void) { check_splits("mixed", "llama3", TOK_PRE_LLAMA3); check_splits("adversarial", "llama3", TOK_PRE_LLAMA3); }
static void test_pretok_o200k(void) { check_splits("mixed", "o200k", TOK_PRE_O200K); check_splits("adversarial", "o200k", TOK_PRE_O200K); }

/* A small vocab file: keys written as asked ("model", "tokens", "merges", pre NULL = absent). */
static hm_status load_small(const char *model, bool tokens, bool merges, const char *pre, hm_error *err) {
    char path[512];
    snprintf(path, sizeof(path), "%s/tok_small.gguf", tt_tmp());
    gguf_writer *w;
    if (gguf_writer_open(path, &w, err) != HM_OK) return HM_ERR_IO;
    const char *toks[] = {"a", "b", "ab", "Ġ"};
    const char *mg[] = {"a b"};
    if (model) gguf_writer_set_str(w, "tokenizer.ggml.model", model);
    if (pre) gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    if (tokens) gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    if (merges) gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", mg, 1);
    gguf_writer_begin_data(w);
    if (gguf_writer_close(w, err) != HM_OK) return HM_ERR_IO;
    gguf_ctx *g;
    hm_status st = gguf_open(path, &g, err);
    if (st != HM_OK) return st;
    tok_vocab *v = NULL;
    st = tok_vocab_load(g, &v, err);
    if (st == HM_OK) {
        tok_ids ids = {0};
        st = tok_encode(v, "ab a", 4, 0, &ids, err);
        if (st == HM_OK && !(ids.n == 3 && ids.ids[0] == 2 && ids.ids[1] == 3 && ids.ids[2] == 0)) st = HM_ERR_STATE;
        tok_ids_free(&ids);
    }
    tok_vocab_free(v);
    gguf_close(g);
    return st;
}

static void test_metadata_errors(void) {
    hm_error err;
    HM_CHECK(load_small("gpt2", true, true, "default", &err) == HM_OK);
    HM_CHECK(load_small("gpt2", true, true, NULL, &err) == HM_OK);
    HM_CHECK(load_small(NULL, true, true, "default", &err) == HM_ERR_NOT_FOUND && strstr(err.msg, "tokenizer.ggml.model"));
    HM_CHECK(load_small("gpt2", false, true, "default", &err) == HM_ERR_NOT_FOUND && strstr(err.msg, "tokenizer.ggml.tokens"));
    HM_CHECK(load_small("gpt2", true, false, "default", &err) == HM_ERR_NOT_FOUND && strstr(err.msg, "tokenizer.ggml.merges"));
    HM_CHECK(load_small("gpt2", true, true, "deepseek-v9", &err) == HM_ERR_UNSUPPORTED && strstr(err.msg, "deepseek-v9"));
    HM_CHECK(load_small("bert", true, true, "default", &err) == HM_ERR_UNSUPPORTED && strstr(err.msg, "bert"));
}

static void test_qwen3_rules(void) {
    const tok_vocab *v = tt_vocab("qwen3");
    HM_REQUIRE(v != NULL);
    hm_error err;
    tok_ids ids = {0};
    /* invalid UTF-8: error with the byte offset, or U+FFFD with the option */
    HM_CHECK(tok_encode(v, "ok\xC3(x", 5, 0, &ids, &err) == HM_ERR_FORMAT && strstr(err.msg, "offset 2"));
    HM_CHECK(tok_encode(v, "ok\xED\xA0\x80", 5, 0, &ids, &err) == HM_ERR_FORMAT); /* surrogate */
    HM_CHECK(tok_encode(v, "\xC0\xAF", 2, 0, &ids, &err) == HM_ERR_FORMAT && strstr(err.msg, "offset 0")); /* overlong */
    ids.n = 0;
    HM_REQUIRE(tok_encode(v, "ok\xC3(x", 5, TOK_ENCODE_REPLACE_INVALID, &ids, &err) == HM_OK);
    char *dec;
    size_t dn;
    HM_REQUIRE(tok_decode(v, ids.ids, ids.n, 0, &dec, &dn, &err) == HM_OK);
    HM_CHECK(dn == 7 && !memcmp(dec, "ok\xEF\xBF\xBD(x", 7));
    free(dec);
    /* specials: control tokens only when parsed, user-defined always, no BOS for Qwen */
    int32_t im_start = tok_token_find(v, "<|im_start|>", 12), think = tok_token_find(v, "<think>", 7);
    HM_CHECK(im_start == 151644 && think == 151667);
    ids.n = 0;
    HM_REQUIRE(tok_encode(v, "<|im_start|><think>", 19, TOK_ENCODE_ADD_SPECIAL | TOK_ENCODE_PARSE_SPECIAL, &ids, &err) == HM_OK);
    HM_CHECK(ids.n == 2 && ids.ids[0] == im_start && ids.ids[1] == think);
    ids.n = 0;
    HM_REQUIRE(tok_encode(v, "<|im_start|><think>", 19, 0, &ids, &err) == HM_OK);
    HM_CHECK(ids.n > 2 && ids.ids[ids.n - 1] == think && ids.ids[0] != im_start);
    /* decode: control tokens hidden unless asked */
    int32_t two[2] = {im_start, think};
    HM_REQUIRE(tok_decode(v, two, 2, 0, &dec, &dn, &err) == HM_OK);
    HM_CHECK(dn == 7 && !strcmp(dec, "<think>"));
    free(dec);
    int32_t badid[1] = {tok_vocab_n_tokens(v)};
    HM_CHECK(tok_decode(v, badid, 1, 0, &dec, &dn, &err) == HM_ERR_RANGE);
    /* end of generation */
    HM_CHECK(tok_is_eog(v, tok_token_find(v, "<|im_end|>", 10)) && tok_is_eog(v, tok_token_find(v, "<|endoftext|>", 13)));
    HM_CHECK(!tok_is_eog(v, im_start) && !tok_is_eog(v, 9707) && !tok_is_eog(v, -1));
    HM_CHECK(tok_eos(v) == 151645 && tok_bos(v) == 151643 && !tok_add_bos(v) && tok_vocab_pre(v) == TOK_PRE_QWEN2);
    tok_ids_free(&ids);
}

static void test_stream_holdback(void) {
    const tok_vocab *v = tt_vocab("qwen3");
    HM_REQUIRE(v != NULL);
    tok_stream s;
    tok_stream_init(&s, v, 0);
    const unsigned char emoji[4] = {0xF0, 0x9F, 0x98, 0x80};
    const char *p;
    size_t n;
    hm_error err;
    for (int i = 0; i < 3; i++) {
        HM_REQUIRE(tok_stream_push(&s, v->byte_tok[emoji[i]], &p, &n, &err) == HM_OK);
        HM_CHECK(n == 0);
    }
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok[emoji[3]], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 4 && !memcmp(p, emoji, 4));
    /* "a" then a lead byte: "a" comes out, the lead byte is held until the flush */
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok['a'], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 1 && p[0] == 'a');
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok[0xE4], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 0);
    tok_stream_flush(&s, &p, &n);
    HM_CHECK(n == 1 && (unsigned char)p[0] == 0xE4);
    /* a stray continuation byte can never complete: passed through at once */
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok[0x80], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 1);
    HM_CHECK(tok_stream_push(&s, -5, &p, &n, &err) == HM_ERR_RANGE);
    tok_stream_free(&s);

    /* TOK_DECODE_REPLACE_INVALID: what can never be UTF-8 becomes U+FFFD, valid text is kept */
    tok_stream_init(&s, v, TOK_DECODE_REPLACE_INVALID);
    const char *fffd = "\xEF\xBF\xBD";
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok[0x80], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 3 && !memcmp(p, fffd, 3)); /* stray continuation byte */
    /* a lead byte of a 3-byte sequence, one continuation, then 'a': one U+FFFD then 'a' */
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok[0xE4], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 0);
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok[0xB8], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 0);
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok['a'], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 4 && !memcmp(p, fffd, 3) && p[3] == 'a');
    /* 0xFF is never UTF-8; the emoji after it stays whole */
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok[0xFF], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 3 && !memcmp(p, fffd, 3));
    for (int i = 0; i < 4; i++) HM_REQUIRE(tok_stream_push(&s, v->byte_tok[emoji[i]], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 4 && !memcmp(p, emoji, 4));
    /* an incomplete character left at the end is one U+FFFD at the flush */
    HM_REQUIRE(tok_stream_push(&s, v->byte_tok[0xF0], &p, &n, &err) == HM_OK);
    HM_CHECK(n == 0);
    tok_stream_flush(&s, &p, &n);
    HM_CHECK(n == 3 && !memcmp(p, fffd, 3));
    tok_stream_flush(&s, &p, &n);
    HM_CHECK(n == 0);
    tok_stream_free(&s);
}

static void test_gptoss_mistral_rules(void) {
    const tok_vocab *g = tt_vocab("gptoss"), *m = tt_vocab("mistral");
    HM_REQUIRE(g && m);
    const char *eog[] = {"<|return|>", "<|end|>", "<|call|>", "<|endoftext|>"};
    for (size_t i = 0; i < 4; i++) HM_CHECK_MSG(tok_is_eog(g, tok_token_find(g, eog[i], strlen(eog[i]))), "%s", eog[i]);
    HM_CHECK(!tok_is_eog(g, tok_token_find(g, "<|start|>", 9)) && tok_vocab_pre(g) == TOK_PRE_O200K);
    HM_CHECK(tok_vocab_model(m) == TOK_MODEL_SPM && tok_add_bos(m) && tok_is_eog(m, 2) && !tok_is_eog(m, 1));
    hm_error err;
    tok_ids ids = {0};
    /* SPM: BOS added, a space is prefixed at the start and after a special token */
    HM_REQUIRE(tok_encode(m, "Hi<s>Hi", 7, TOK_ENCODE_ADD_SPECIAL | TOK_ENCODE_PARSE_SPECIAL, &ids, &err) == HM_OK);
    int32_t hi = tok_token_find(m, "\xE2\x96\x81Hi", 5);
    HM_CHECK(hi >= 0 && ids.n == 4 && ids.ids[0] == 1 && ids.ids[1] == hi && ids.ids[2] == 1 && ids.ids[3] == hi);
    /* the UNKNOWN token's text is split out like a control token, only when parsing specials */
    ids.n = 0;
    HM_REQUIRE(tok_encode(m, "Hi<unk>", 7, TOK_ENCODE_PARSE_SPECIAL, &ids, &err) == HM_OK);
    HM_CHECK(ids.n == 2 && ids.ids[0] == hi && ids.ids[1] == 0);
    ids.n = 0;
    HM_REQUIRE(tok_encode(m, "Hi<unk>", 7, 0, &ids, &err) == HM_OK);
    HM_CHECK(ids.n > 2 && ids.ids[0] == hi);
    for (size_t i = 0; i < ids.n; i++) HM_CHECK(ids.ids[i] != 0);
    /* byte fallback for a character not in the vocabulary */
    ids.n = 0;
    HM_REQUIRE(tok_encode(m, "\xF0\x9F\xA6\x80", 4, 0, &ids, &err) == HM_OK);
    HM_CHECK(ids.n == 5 && ids.ids[1] == 3 + 0xF0 && ids.ids[4] == 3 + 0x80);
    char *dec;
    size_t dn;
    HM_REQUIRE(tok_decode(m, ids.ids, ids.n, TOK_DECODE_STRIP_SPACE, &dec, &dn, &err) == HM_OK);
    HM_CHECK(dn == 4 && !memcmp(dec, "\xF0\x9F\xA6\x80", 4));
    free(dec);
    tok_ids_free(&ids);
}

/* Random bytes (mostly invalid UTF-8) and random code points: encode fails exactly when the text
 * is not UTF-8; with TOK_ENCODE_REPLACE_INVALID, decode(encode(s)) is s with each bad byte
 * replaced by U+FFFD (repair computed here independently). */
static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void random_roundtrip(const char *name, unsigned enc, unsigned dec) {
    const tok_vocab *v = tt_vocab(name);
    HM_REQUIRE(v != NULL);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    char s[96], fixed[96 * 3 + 8];
    size_t bad = 0;
    for (int iter = 0; iter < 400; iter++) {
        size_t n = 0, len = rng_next(&x) % 64;
        if (iter % 2) {
            for (; n < len; n++) s[n] = (char)(rng_next(&x) & 0xFF);
        } else {
            while (n + 4 <= len) {
                uint32_t cp = (uint32_t)(rng_next(&x) % 0x11000);
                if (rng_next(&x) % 3 == 0) cp = (uint32_t)(rng_next(&x) % 0x80);
                if (cp >= 0xD800 && cp <= 0xDFFF) cp = ' ';
                n += tok_utf8_encode(cp, s + n);
            }
        }
        size_t fn = 0;
        int valid = 1;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = tok_utf8_decode((const unsigned char *)s + i, n - i, &cp);
            if (!k) {
                memcpy(fixed + fn, "\xEF\xBF\xBD", 3);
                fn += 3;
                i++;
                valid = 0;
            } else {
                memcpy(fixed + fn, s + i, k);
                fn += k;
                i += k;
            }
        }
        tok_ids ids = {0};
        hm_error err;
        hm_status st = tok_encode(v, s, n, enc, &ids, &err);
        HM_CHECK_MSG(valid ? st == HM_OK : st == HM_ERR_FORMAT, "%s iter %d: status %d for %s text", name, iter, st, valid ? "valid" : "invalid");
        ids.n = 0;
        HM_REQUIRE(tok_encode(v, s, n, enc | TOK_ENCODE_REPLACE_INVALID, &ids, &err) == HM_OK);
        char *d;
        size_t dn;
        HM_REQUIRE(tok_decode(v, ids.ids, ids.n, dec, &d, &dn, &err) == HM_OK);
        if (dn != fn || memcmp(d, fixed, fn)) bad++;
        free(d);
        tok_ids_free(&ids);
    }
    HM_CHECK_MSG(bad == 0, "%s: %zu of 400 random strings do not round-trip", name, bad);
}

static void test_random_roundtrip(void) {
    random_roundtrip("qwen3", 0, 0);
    random_roundtrip("gptoss", 0, 0);
    random_roundtrip("mistral", 0, TOK_DECODE_STRIP_SPACE);
}

HM_TEST_MAIN(test_random_roundtrip, test_pretok_gpt2, test_pretok_qwen2, test_pretok_llama3, test_pretok_o200k, test_metadata_errors,
             test_qwen3_rules, test_stream_holdback, test_gptoss_mistral_rules)
