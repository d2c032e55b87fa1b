/* test_forge_vocab.c - forged tokenizers: for every preset (real vocabulary sizes included)
 * the vocabulary has exactly n_vocab distinct tokens, byte tokens cover 0..255 (GPT-2's
 * byte-to-unicode strings, or <0x00>..<0xFF> for SentencePiece), every merge "a b" joins two
 * tokens into a token, common words are single tokens, special tokens sit at the real models'
 * ids, and the GGUF holds the same token list. */
#include "forge_test_util.h"
#include "harness.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int64_t find(const forge_vocab *v, const char *s) {
    for (int64_t i = 0; i < v->n; i++)
        if (!strcmp(v->tokens[i], s)) return i;
    return -1;
}

static void check_vocab(const forge_preset *p) {
    forge_vocab v;
    hm_error err;
    HM_REQUIRE(forge_vocab_build(p, &v, &err) == HM_OK);
    HM_CHECK(v.n == p->n_vocab);
    /* distinct */
    char **sorted = malloc((size_t)v.n * sizeof(char *));
    HM_REQUIRE(sorted);
    memcpy(sorted, v.tokens, (size_t)v.n * sizeof(char *));
    qsort(sorted, (size_t)v.n, sizeof(char *), cmp_str);
    int dups = 0;
    for (int64_t i = 1; i < v.n; i++) dups += !strcmp(sorted[i - 1], sorted[i]);
    HM_CHECK_MSG(dups == 0, "%s: %d duplicate tokens", p->name, dups);
    /* byte coverage */
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        char s[16];
        if (v.spm) snprintf(s, sizeof(s), "<0x%02X>", b);
        else forge_byte_to_unicode((uint8_t)b, s);
        char *key = s;
        char **hit = bsearch(&key, sorted, (size_t)v.n, sizeof(char *), cmp_str);
        missing += !hit;
        if (v.spm && hit) HM_CHECK(v.types[find(&v, s)] == FORGE_TT_BYTE);
    }
    HM_CHECK_MSG(missing == 0, "%s: %d bytes without a token", p->name, missing);
    /* merges: both halves and the join are tokens */
    int badm = 0;
    HM_CHECK(v.n_merges > 300);
    for (int64_t m = 0; m < v.n_merges; m++) {
        char buf[256];
        snprintf(buf, sizeof(buf), "%s", v.merges[m]);
        char *sp = strchr(buf, ' ');
        if (!sp || strchr(sp + 1, ' ')) { badm++; continue; }
        *sp = 0;
        char joined[256];
        snprintf(joined, sizeof(joined), "%s%s", buf, sp + 1);
        char *k1 = buf, *k2 = sp + 1, *k3 = joined;
        badm += !bsearch(&k1, sorted, (size_t)v.n, sizeof(char *), cmp_str) ||
                !bsearch(&k2, sorted, (size_t)v.n, sizeof(char *), cmp_str) ||
                !bsearch(&k3, sorted, (size_t)v.n, sizeof(char *), cmp_str);
    }
    HM_CHECK_MSG(badm == 0, "%s: %d bad merges", p->name, badm);
    /* common words became tokens */
    HM_CHECK(find(&v, v.spm ? "\xE2\x96\x81the" : "\xC4\xA0the") >= 0);
    HM_CHECK(find(&v, v.spm ? "\xE2\x96\x81model" : "\xC4\xA0model") >= 0);
    HM_CHECK(v.bos >= 0 && v.eos >= 0 && v.eos < v.n && v.chat_template && *v.chat_template);
    if (v.spm) {
        HM_CHECK(!strcmp(v.tokens[0], "<unk>") && !strcmp(v.tokens[1], "<s>") && !strcmp(v.tokens[2], "</s>"));
        HM_CHECK(v.scores[find(&v, "\xE2\x96\x81t")] > v.scores[find(&v, "\xE2\x96\x81the")]);
        HM_CHECK(v.add_bos && strstr(v.chat_template, "[INST]"));
    }
    free(sorted);
    forge_vocab_free(&v);
}

static void test_every_preset(void) {
    for (int i = 0; i < forge_preset_count(); i++) check_vocab(forge_preset_at(i));
}

static void test_real_special_ids(void) {
    forge_vocab v;
    hm_error err;
    HM_REQUIRE(forge_vocab_build(forge_preset_find("qwen3-30b-a3b"), &v, &err) == HM_OK);
    HM_CHECK(!strcmp(v.tokens[151643], "<|endoftext|>") && !strcmp(v.tokens[151644], "<|im_start|>"));
    HM_CHECK(!strcmp(v.tokens[151645], "<|im_end|>") && v.eos == 151645 && !strcmp(v.tokens[151668], "</think>"));
    HM_CHECK(v.types[151644] == FORGE_TT_CONTROL && v.types[151667] == FORGE_TT_USER && v.types[151935] == FORGE_TT_UNUSED);
    HM_CHECK(!strcmp(v.pre, "qwen2") && strstr(v.chat_template, "<|im_start|>"));
    forge_vocab_free(&v);
    HM_REQUIRE(forge_vocab_build(forge_preset_find("gpt-oss-20b"), &v, &err) == HM_OK);
    HM_CHECK(!strcmp(v.tokens[200006], "<|start|>") && !strcmp(v.tokens[200008], "<|message|>"));
    HM_CHECK(!strcmp(v.tokens[200005], "<|channel|>") && !strcmp(v.tokens[200007], "<|end|>"));
    HM_CHECK(!strcmp(v.tokens[200002], "<|return|>") && v.eos == 200002 && !strcmp(v.tokens[199998], "<|startoftext|>"));
    HM_CHECK(!strcmp(v.tokens[201087], "<|reserved_201087|>") && !strcmp(v.pre, "gpt-4o"));
    forge_vocab_free(&v);
    HM_REQUIRE(forge_vocab_build(forge_preset_find("olmoe-1b-7b"), &v, &err) == HM_OK);
    HM_CHECK(!strcmp(v.tokens[50279], "<|endoftext|>") && v.eos == 50279 && !strcmp(v.pre, "olmo"));
    forge_vocab_free(&v);
}

static void test_gguf_tokens(void) {
    const forge_preset *p = forge_preset_find("tiny-mixtral");
    char path[512], hf[512];
    HM_REQUIRE(ft_forge(p, FORGE_MIX_F16, 1, "vocab-mixtral", false, 1, path, sizeof(path), hf, sizeof(hf)) == HM_OK);
    gguf_ctx *g;
    hm_error err;
    HM_REQUIRE(gguf_open(path, &g, &err) == HM_OK);
    forge_vocab v;
    HM_REQUIRE(forge_vocab_build(p, &v, &err) == HM_OK);
    gguf_arr toks, types, scores;
    HM_REQUIRE(gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, &err) == HM_OK);
    HM_REQUIRE(gguf_get_arr(g, "tokenizer.ggml.token_type", &types, &err) == HM_OK);
    HM_REQUIRE(gguf_get_arr(g, "tokenizer.ggml.scores", &scores, &err) == HM_OK);
    int bad = 0;
    for (int64_t i = 0; i < v.n; i++) {
        gguf_str s = gguf_arr_str(&toks, (uint64_t)i);
        bad += s.len != strlen(v.tokens[i]) || memcmp(s.data, v.tokens[i], s.len) ||
               gguf_arr_int(&types, (uint64_t)i) != v.types[i] || gguf_arr_float(&scores, (uint64_t)i) != v.scores[i];
    }
    HM_CHECK(bad == 0);
    uint64_t id;
    HM_CHECK(gguf_get_uint(g, "tokenizer.ggml.unknown_token_id", &id, &err) == HM_OK && id == 0);
    forge_vocab_free(&v);
    gguf_close(g);
    remove(path);
}

HM_TEST_MAIN(test_every_preset, test_real_special_ids, test_gguf_tokens)
