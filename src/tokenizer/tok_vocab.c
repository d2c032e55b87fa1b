/* tok_vocab.c - builds a tok_vocab from a GGUF file's tokenizer.* keys; lookups.
 *
 * DESIGN: token strings are copied into one arena; a hash table (open addressing, FNV-1a) maps
 * text -> id; BPE merges "A B" become (id A, id B) -> (rank, id of AB) in a second table so the
 * merge loop works on ids. Special tokens (CONTROL, USER_DEFINED, UNKNOWN) are kept sorted longest first
 * for the splitter. End-of-generation ids: eos/eot/eom plus control tokens whose text is one of
 * llama.cpp's known end markers.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_unicode.h"

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* GPT-2 bytes_to_unicode: printable bytes map to themselves, the others to U+0100 upwards. */
static int byte_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

/* The non-printable bytes 0x00-0x20, 0x7F-0xA0, 0xAD map in order to U+0100..U+0143. */
uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_printable(b)) return b;
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    return 256u + 67u; /* 0xAD */
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(0x7F + k - 33);
    return 0xAD;
}

int32_t tok_token_find(const tok_vocab *v, const char *text, size_t len) {
    size_t mask = v->hash_cap - 1;
    for (size_t h = fnv1a(text, len) & mask;; h = (h + 1) & mask) {
        int32_t id = v->hash[h];
        if (id < 0) return -1;
        if (v->len[id] == len && !memcmp(tok_text(v, id), text, len)) return id;
    }
}

int32_t tok_merge_find(const tok_vocab *v, int32_t a, int32_t b, int32_t *result) {
    if (!v->merge_cap) return -1;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = v->merge_cap - 1;
    for (size_t h = mix64(key) & mask;; h = (h + 1) & mask) {
        const tok_merge *m = &v->merges[h];
        if (m->key == UINT64_MAX) return -1;
        if (m->key == key) {
            *result = m->result;
            return m->rank;
        }
    }
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static hm_status opt_id(const gguf_ctx *g, const char *key, int32_t n, int32_t *out, hm_error *err) {
    *out = -1;
    if (gguf_find_key(g, key) < 0) return HM_OK;
    int64_t x;
    hm_status st = gguf_get_int(g, key, &x, err);
    if (st != HM_OK) return st;
    if (x < 0 || x >= n) return hm_error_set(err, HM_ERR_RANGE, "%s = %lld is not a token id (vocab has %d)", key, (long long)x, n);
    *out = (int32_t)x;
    return HM_OK;
}

static hm_status opt_bool(const gguf_ctx *g, const char *key, bool def, bool *out, hm_error *err) {
    *out = def;
    if (gguf_find_key(g, key) < 0) return HM_OK;
    return gguf_get_bool(g, key, out, err);
}

static bool int_type(gguf_vtype t) {
    return t <= GGUF_VT_INT32 || t == GGUF_VT_BOOL || t == GGUF_VT_UINT64 || t == GGUF_VT_INT64;
}

static hm_status load_tokens(tok_vocab *v, const gguf_ctx *g, hm_error *err) {
    gguf_arr toks, types = {0}, scores = {0};
    hm_status st = gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, err);
    if (st != HM_OK) return st;
    if (toks.type != GGUF_VT_STRING || toks.n == 0 || toks.n > INT32_MAX / 2)
        return hm_error_set(err, HM_ERR_FORMAT, "tokenizer.ggml.tokens: expected a non-empty array of strings");
    v->n = (int32_t)toks.n;
    bool have_types = gguf_find_key(g, "tokenizer.ggml.token_type") >= 0;
    bool have_scores = gguf_find_key(g, "tokenizer.ggml.scores") >= 0;
    if (have_types && (st = gguf_get_arr(g, "tokenizer.ggml.token_type", &types, err)) != HM_OK) return st;
    if (have_scores && (st = gguf_get_arr(g, "tokenizer.ggml.scores", &scores, err)) != HM_OK) return st;
    if (have_types && (types.n != toks.n || !int_type(types.type)))
        return hm_error_set(err, HM_ERR_FORMAT, "tokenizer.ggml.token_type: expected %llu integers", (unsigned long long)toks.n);
    if (have_scores && (scores.n != toks.n || (scores.type != GGUF_VT_FLOAT32 && scores.type != GGUF_VT_FLOAT64)))
        return hm_error_set(err, HM_ERR_FORMAT, "tokenizer.ggml.scores: expected %llu floats", (unsigned long long)toks.n);
    size_t total = 0;
    for (uint64_t i = 0; i < toks.n; i++) total += gguf_arr_str(&toks, i).len + 1;
    if (total > UINT32_MAX) return hm_error_set(err, HM_ERR_RANGE, "tokenizer.ggml.tokens: %zu bytes of text is too much", total);
    size_t n = (size_t)v->n;
    v->arena = malloc(total);
    v->off = malloc(n * sizeof(*v->off));
    v->len = malloc(n * sizeof(*v->len));
    v->type = malloc(n);
    v->eog = calloc(n, 1);
    v->score = malloc(n * sizeof(*v->score));
    v->hash_cap = pow2_at_least(n * 2);
    v->hash = malloc(v->hash_cap * sizeof(*v->hash));
    if (!v->arena || !v->off || !v->len || !v->type || !v->eog || !v->score || !v->hash)
        return hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory for %d tokens", v->n);
    memset(v->hash, 0xFF, v->hash_cap * sizeof(*v->hash));
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(&toks, i);
        memcpy(v->arena + pos, s.data, s.len);
        v->arena[pos + s.len] = 0;
        v->off[i] = (uint32_t)pos;
        v->len[i] = (uint32_t)s.len;
        pos += s.len + 1;
        int64_t ty = have_types ? gguf_arr_int(&types, i) : TOK_TYPE_NORMAL;
        v->type[i] = (uint8_t)(ty >= 0 && ty <= TOK_TYPE_BYTE ? ty : TOK_TYPE_UNDEFINED);
        v->score[i] = have_scores ? (float)gguf_arr_float(&scores, i) : 0.0f;
        /* first id wins for duplicate texts */
        if (tok_token_find(v, s.data, s.len) >= 0) continue;
        size_t mask = v->hash_cap - 1, h = fnv1a(s.data, s.len) & mask;
        while (v->hash[h] >= 0) h = (h + 1) & mask;
        v->hash[h] = (int32_t)i;
    }
    return HM_OK;
}

static hm_status load_merges(tok_vocab *v, const gguf_ctx *g, hm_error *err) {
    gguf_arr m;
    hm_status st = gguf_get_arr(g, "tokenizer.ggml.merges", &m, err);
    if (st != HM_OK) return st;
    if (m.type != GGUF_VT_STRING) return hm_error_set(err, HM_ERR_FORMAT, "tokenizer.ggml.merges: expected an array of strings");
    v->merge_cap = pow2_at_least((size_t)m.n * 2);
    v->merges = malloc(v->merge_cap * sizeof(*v->merges));
    if (!v->merges) return hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory for %llu merges", (unsigned long long)m.n);
    for (size_t i = 0; i < v->merge_cap; i++) v->merges[i].key = UINT64_MAX;
    char buf[1024];
    for (uint64_t r = 0; r < m.n; r++) {
        gguf_str s = gguf_arr_str(&m, r);
        const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL; /* first space after the first byte */
        if (!sp || s.len >= sizeof(buf))
            return hm_error_set(err, HM_ERR_FORMAT, "tokenizer.ggml.merges[%llu]: expected \"A B\"", (unsigned long long)r);
        size_t la = (size_t)(sp - s.data), lb = s.len - la - 1;
        int32_t a = tok_token_find(v, s.data, la), b = tok_token_find(v, sp + 1, lb);
        memcpy(buf, s.data, la);
        memcpy(buf + la, sp + 1, lb);
        int32_t c = tok_token_find(v, buf, la + lb);
        if (a < 0 || b < 0 || c < 0) continue; /* merge into or from a non-token: never applies */
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        size_t mask = v->merge_cap - 1, h = mix64(key) & mask;
        while (v->merges[h].key != UINT64_MAX && v->merges[h].key != key) h = (h + 1) & mask;
        if (v->merges[h].key == key) continue; /* a repeated merge keeps its first rank */
        v->merges[h] = (tok_merge){key, (int32_t)r, c};
    }
    return HM_OK;
}

/* Token types split out of text before the model runs (llama.cpp: CONTROL, USER_DEFINED, UNKNOWN). */
static bool is_special_type(uint8_t t) {
    return t == TOK_TYPE_CONTROL || t == TOK_TYPE_USER_DEFINED || t == TOK_TYPE_UNKNOWN;
}

static hm_status collect_specials(tok_vocab *v) {
    size_t k = 0;
    for (int32_t i = 0; i < v->n; i++)
        k += is_special_type(v->type[i]) && v->len[i] > 0;
    v->specials = malloc((k ? k : 1) * sizeof(*v->specials));
    if (!v->specials) return HM_ERR_NOMEM;
    k = 0;
    for (int32_t i = 0; i < v->n; i++) {
        if (!(is_special_type(v->type[i]) && v->len[i] > 0)) continue;
        /* insertion by length, longest first; ties by id (stable) */
        size_t j = k++;
        while (j > 0 && v->len[v->specials[j - 1]] < v->len[i]) {
            v->specials[j] = v->specials[j - 1];
            j--;
        }
        v->specials[j] = i;
        unsigned char c = (unsigned char)tok_text(v, i)[0];
        v->special_first[c >> 3] |= (uint8_t)(1u << (c & 7));
    }
    v->n_specials = k;
    return HM_OK;
}

static void find_byte_tokens(tok_vocab *v) {
    for (int b = 0; b < 256; b++) {
        char buf[8];
        size_t n;
        if (v->model == TOK_MODEL_BPE) {
            n = tok_utf8_encode(tok_byte_to_cp((uint8_t)b), buf);
        } else {
            static const char hex[] = "0123456789ABCDEF";
            memcpy(buf, "<0x", 3);
            buf[3] = hex[b >> 4];
            buf[4] = hex[b & 15];
            buf[5] = '>';
            n = 6;
        }
        v->byte_tok[b] = tok_token_find(v, buf, n);
    }
}

/* Control tokens that end a turn in the model families hotmoe runs (llama.cpp's list). */
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>",
    "<|eom_id|>", "<end_of_turn>", "<|end_of_text|>", "</s>",
};

static void mark_eog(tok_vocab *v) {
    int32_t ids[] = {v->eos, v->eot, v->eom};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
        if (ids[i] >= 0) v->eog[ids[i]] = 1;
    for (size_t i = 0; i < sizeof(k_eog_texts) / sizeof(k_eog_texts[0]); i++) {
        int32_t id = tok_token_find(v, k_eog_texts[i], strlen(k_eog_texts[i]));
        if (id >= 0 && v->type[id] == TOK_TYPE_CONTROL) v->eog[id] = 1;
    }
}

static hm_status pick_pre(tok_vocab *v, hm_error *err) {
    static const struct { const char *name; tok_pre pre; } k_pre[] = {
        {"default", TOK_PRE_GPT2}, {"gpt2", TOK_PRE_GPT2}, {"gpt-2", TOK_PRE_GPT2},
        {"olmo", TOK_PRE_GPT2}, {"qwen2", TOK_PRE_QWEN2}, {"llama-bpe", TOK_PRE_LLAMA3},
        {"llama3", TOK_PRE_LLAMA3}, {"gpt-4o", TOK_PRE_O200K},
    };
    if (!v->pre_name[0]) {
        v->pre = TOK_PRE_GPT2;
        return HM_OK;
    }
    for (size_t i = 0; i < sizeof(k_pre) / sizeof(k_pre[0]); i++)
        if (!strcmp(v->pre_name, k_pre[i].name)) {
            v->pre = k_pre[i].pre;
            /* llama.cpp: llama3 and gpt-4o emit a word that is a token without merging */
            v->ignore_merges = v->pre == TOK_PRE_LLAMA3 || v->pre == TOK_PRE_O200K;
            return HM_OK;
        }
    if (v->model == TOK_MODEL_SPM) return HM_OK; /* SPM ignores the pre-tokenizer */
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "tokenizer.ggml.pre = \"%s\" is not a supported pre-tokenizer "
                        "(default, gpt2, olmo, qwen2, llama-bpe, gpt-4o)", v->pre_name);
}

hm_status tok_vocab_load(const gguf_ctx *g, tok_vocab **out, hm_error *err) {
    *out = NULL;
    gguf_str model;
    hm_status st = gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (st != HM_OK) return st;
    tok_vocab *v = calloc(1, sizeof(*v));
    if (!v) return hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory");
    if (model.len == 4 && !memcmp(model.data, "gpt2", 4)) v->model = TOK_MODEL_BPE;
    else if (model.len == 5 && !memcmp(model.data, "llama", 5)) v->model = TOK_MODEL_SPM;
    else {
        st = hm_error_set(err, HM_ERR_UNSUPPORTED, "tokenizer.ggml.model = \"%.*s\" is not supported (gpt2, llama)",
                          (int)(model.len > 64 ? 64 : model.len), model.data);
        goto fail;
    }
    if (gguf_find_key(g, "tokenizer.ggml.pre") >= 0) {
        gguf_str pre;
        if ((st = gguf_get_str(g, "tokenizer.ggml.pre", &pre, err)) != HM_OK) goto fail;
        size_t n = pre.len < sizeof(v->pre_name) - 1 ? pre.len : sizeof(v->pre_name) - 1;
        memcpy(v->pre_name, pre.data, n);
    }
    if ((st = pick_pre(v, err)) != HM_OK) goto fail;
    if ((st = load_tokens(v, g, err)) != HM_OK) goto fail;
    if (v->model == TOK_MODEL_BPE && (st = load_merges(v, g, err)) != HM_OK) goto fail;
    if ((st = opt_id(g, "tokenizer.ggml.bos_token_id", v->n, &v->bos, err)) != HM_OK ||
        (st = opt_id(g, "tokenizer.ggml.eos_token_id", v->n, &v->eos, err)) != HM_OK ||
        (st = opt_id(g, "tokenizer.ggml.eot_token_id", v->n, &v->eot, err)) != HM_OK ||
        (st = opt_id(g, "tokenizer.ggml.eom_token_id", v->n, &v->eom, err)) != HM_OK ||
        (st = opt_id(g, "tokenizer.ggml.padding_token_id", v->n, &v->pad, err)) != HM_OK ||
        (st = opt_id(g, "tokenizer.ggml.unknown_token_id", v->n, &v->unk, err)) != HM_OK)
        goto fail;
    bool spm = v->model == TOK_MODEL_SPM;
    if ((st = opt_bool(g, "tokenizer.ggml.add_bos_token", spm, &v->add_bos, err)) != HM_OK ||
        (st = opt_bool(g, "tokenizer.ggml.add_eos_token", false, &v->add_eos, err)) != HM_OK ||
        (st = opt_bool(g, "tokenizer.ggml.add_space_prefix", spm, &v->add_space_prefix, err)) != HM_OK)
        goto fail;
    if (spm && v->unk < 0) v->unk = tok_token_find(v, "<unk>", 5);
    if (collect_specials(v) != HM_OK) {
        st = hm_error_set(err, HM_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    find_byte_tokens(v);
    mark_eog(v);
    *out = v;
    return HM_OK;
fail:
    tok_vocab_free(v);
    return st;
}

void tok_vocab_free(tok_vocab *v) {
    if (!v) return;
    free(v->arena);
    free(v->off);
    free(v->len);
    free(v->type);
    free(v->eog);
    free(v->score);
    free(v->hash);
    free(v->merges);
    free(v->specials);
    free(v);
}

int32_t tok_vocab_n_tokens(const tok_vocab *v) { return v->n; }
tok_model tok_vocab_model(const tok_vocab *v) { return v->model; }
tok_pre tok_vocab_pre(const tok_vocab *v) { return v->pre; }
const char *tok_vocab_pre_name(const tok_vocab *v) { return v->pre_name; }
int32_t tok_bos(const tok_vocab *v) { return v->bos; }
int32_t tok_eos(const tok_vocab *v) { return v->eos; }
int32_t tok_eot(const tok_vocab *v) { return v->eot; }
int32_t tok_pad(const tok_vocab *v) { return v->pad; }
int32_t tok_unk(const tok_vocab *v) { return v->unk; }
bool tok_add_bos(const tok_vocab *v) { return v->add_bos && v->bos >= 0; }
bool tok_add_eos(const tok_vocab *v) { return v->add_eos && v->eos >= 0; }
bool tok_is_eog(const tok_vocab *v, int32_t id) { return id >= 0 && id < v->n && v->eog[id]; }
bool tok_is_control(const tok_vocab *v, int32_t id) { return id >= 0 && id < v->n && v->type[id] == TOK_TYPE_CONTROL; }
tok_type tok_token_type(const tok_vocab *v, int32_t id) {
    return id >= 0 && id < v->n ? (tok_type)v->type[id] : TOK_TYPE_UNDEFINED;
}
const char *tok_token_text(const tok_vocab *v, int32_t id) { return id >= 0 && id < v->n ? tok_text(v, id) : NULL; }
