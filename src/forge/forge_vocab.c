/* forge_vocab.c - tokenizers for forged models, in the two forms llama.cpp reads.
 *
 * DESIGN: a small BPE training on an embedded English text (forge_vocab_text.c) makes common
 * words single tokens. Byte-level BPE ("gpt2" model; qwen, gpt-oss, olmoe): ids 0..255 are the
 * 256 bytes as GPT-2's byte-to-unicode characters (in GPT-2's order), then one token per learned
 * merge; words are split like the models' pre-tokenizer regexes split them (letters with one
 * leading space, single digits, punctuation runs), so merges never cross a split point.
 * SentencePiece ("llama" model; mixtral): <unk> <s> </s>, byte-fallback <0x00>..<0xFF>, the
 * single characters of the text, and pieces learned the same way on "▁"-prefixed words, scored
 * by merge order (earlier = higher), which is how llama.cpp's SPM tokenizer picks merges.
 * The rest up to the preset's vocabulary size is filled with unused tokens ([PADn], as
 * llama.cpp's converter pads Qwen) around the real models' special tokens at their real ids.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forge/forge_vocab_internal.h"

/* ---- string -> id table ---- */
typedef struct {
    int64_t *slot; /* -1 empty, else token id */
    uint64_t cap;
} str_table;

static uint64_t str_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

static bool table_init(str_table *t, int64_t n) {
    t->cap = 1024;
    while (t->cap < (uint64_t)n * 2) t->cap <<= 1;
    t->slot = malloc(t->cap * sizeof(int64_t));
    if (!t->slot) return false;
    for (uint64_t i = 0; i < t->cap; i++) t->slot[i] = -1;
    return true;
}

/* id of s, or -1; with insert_id >= 0, inserts s -> insert_id when absent */
static int64_t table_find(str_table *t, char **tokens, const char *s, int64_t insert_id) {
    uint64_t i = str_hash(s) & (t->cap - 1);
    while (t->slot[i] >= 0) {
        if (!strcmp(tokens[t->slot[i]], s)) return t->slot[i];
        i = (i + 1) & (t->cap - 1);
    }
    if (insert_id >= 0) t->slot[i] = insert_id;
    return -1;
}

void forge_byte_to_unicode(uint8_t b, char out[4]) {
    /* printable bytes map to themselves; the other 68 to U+0100 + their rank among them */
    unsigned cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)) {
        cp = b;
    } else {
        unsigned rank = 0;
        for (unsigned c = 0; c < b; c++)
            if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) rank++;
        cp = 256 + rank;
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
    else { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); out[2] = 0; }
}

/* GPT-2's byte order of the first 256 ids: the printable ranges, then the rest */
static int byte_order(uint8_t order[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++)
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) order[n++] = (uint8_t)b;
    for (int b = 0; b < 256; b++)
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) order[n++] = (uint8_t)b;
    return n;
}

/* ---- BPE training ---- */
typedef struct {
    int *sym; /* symbol ids */
    int len;
    int freq;
} word;

typedef struct {
    word *w;
    int n, cap;
} word_set;

static bool words_add(word_set *ws, const int *sym, int len) {
    for (int i = 0; i < ws->n; i++)
        if (ws->w[i].len == len && !memcmp(ws->w[i].sym, sym, (size_t)len * sizeof(int))) {
            ws->w[i].freq++;
            return true;
        }
    if (ws->n == ws->cap) {
        int nc = ws->cap ? ws->cap * 2 : 256;
        word *nw = realloc(ws->w, (size_t)nc * sizeof(word));
        if (!nw) return false;
        ws->w = nw;
        ws->cap = nc;
    }
    int *copy = malloc((size_t)len * sizeof(int));
    if (!copy) return false;
    memcpy(copy, sym, (size_t)len * sizeof(int));
    ws->w[ws->n++] = (word){copy, len, 1};
    return true;
}

static void words_free(word_set *ws) {
    for (int i = 0; i < ws->n; i++) free(ws->w[i].sym);
    free(ws->w);
}

typedef struct {
    uint64_t *key; /* (a << 32 | b) + 1, 0 = empty */
    int64_t *cnt;
    uint64_t cap;
} pair_map;

/* Learns up to max_merges merges; new symbols get ids *n_sym, *n_sym+1, ... (or an existing id
 * when the concatenation is already a token). merges[2k], merges[2k+1] are the pair of merge k,
 * res[k] its result. Returns the number of merges, -1 on allocation failure. */
static int64_t bpe_train(word_set *ws, char **tokens, int64_t *n_sym, int64_t max_sym,
                         str_table *tab, int64_t max_merges, int *merges, int *res) {
    pair_map pm = {0};
    pm.cap = 1 << 16;
    pm.key = malloc(pm.cap * sizeof(uint64_t));
    pm.cnt = malloc(pm.cap * sizeof(int64_t));
    if (!pm.key || !pm.cnt) { free(pm.key); free(pm.cnt); return -1; }
    int64_t nm = 0;
    while (nm < max_merges && *n_sym < max_sym) {
        memset(pm.key, 0, pm.cap * sizeof(uint64_t));
        uint64_t best_key = 0;
        int64_t best = 1;
        for (int i = 0; i < ws->n; i++) {
            const word *w = &ws->w[i];
            for (int j = 0; j + 1 < w->len; j++) {
                uint64_t k = (((uint64_t)(uint32_t)w->sym[j] << 32) | (uint32_t)w->sym[j + 1]) + 1;
                uint64_t h = (k * 0x9e3779b97f4a7c15ULL) >> 48;
                while (pm.key[h] && pm.key[h] != k) h = (h + 1) & (pm.cap - 1);
                if (!pm.key[h]) { pm.key[h] = k; pm.cnt[h] = 0; }
                pm.cnt[h] += w->freq;
                if (pm.cnt[h] > best || (pm.cnt[h] == best && best > 1 && k < best_key)) {
                    best = pm.cnt[h];
                    best_key = k;
                }
            }
        }
        if (best < 2) break;
        int a = (int)((best_key - 1) >> 32), b = (int)((best_key - 1) & 0xffffffffu);
        size_t la = strlen(tokens[a]), lb = strlen(tokens[b]);
        char *s = malloc(la + lb + 1);
        if (!s) { free(pm.key); free(pm.cnt); return -1; }
        memcpy(s, tokens[a], la);
        memcpy(s + la, tokens[b], lb + 1);
        int64_t id = table_find(tab, tokens, s, -1);
        if (id < 0) {
            id = *n_sym;
            tokens[id] = s;
            table_find(tab, tokens, s, id);
            (*n_sym)++;
        } else {
            free(s);
        }
        merges[2 * nm] = a;
        merges[2 * nm + 1] = b;
        res[nm] = (int)id;
        nm++;
        for (int i = 0; i < ws->n; i++) {
            word *w = &ws->w[i];
            int o = 0;
            for (int j = 0; j < w->len; j++) {
                if (j + 1 < w->len && w->sym[j] == a && w->sym[j + 1] == b) { w->sym[o++] = (int)id; j++; }
                else w->sym[o++] = w->sym[j];
            }
            w->len = o;
        }
    }
    free(pm.key);
    free(pm.cnt);
    return nm;
}

static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* byte-level words: " ?letters", " ?digit", " ?punct+", whitespace runs */
static bool split_bytes(const char *text, word_set *ws, const int byte_id[256]) {
    size_t n = strlen(text), i = 0;
    int buf[256];
    while (i < n) {
        size_t s = i, j = i;
        if (text[j] == ' ' && j + 1 < n && !is_space(text[j + 1])) j++;
        if (is_alpha(text[j])) { while (j < n && is_alpha(text[j])) j++; }
        else if (is_digit(text[j])) j++;
        else if (!is_space(text[j])) { while (j < n && !is_space(text[j]) && !is_alpha(text[j]) && !is_digit(text[j])) j++; }
        else { while (j < n && is_space(text[j])) j++; }
        int len = 0;
        for (size_t k = s; k < j && len < 256; k++) buf[len++] = byte_id[(unsigned char)text[k]];
        if (!words_add(ws, buf, len)) return false;
        i = j;
    }
    return true;
}

/* ---- specials ---- */
typedef struct {
    const char *text;
    int type;
} special;

static const special k_qwen3_specials[] = {
    {"<|endoftext|>", FORGE_TT_CONTROL}, {"<|im_start|>", FORGE_TT_CONTROL},
    {"<|im_end|>", FORGE_TT_CONTROL}, {"<|object_ref_start|>", FORGE_TT_CONTROL},
    {"<|object_ref_end|>", FORGE_TT_CONTROL}, {"<|box_start|>", FORGE_TT_CONTROL},
    {"<|box_end|>", FORGE_TT_CONTROL}, {"<|quad_start|>", FORGE_TT_CONTROL},
    {"<|quad_end|>", FORGE_TT_CONTROL}, {"<|vision_start|>", FORGE_TT_CONTROL},
    {"<|vision_end|>", FORGE_TT_CONTROL}, {"<|vision_pad|>", FORGE_TT_CONTROL},
    {"<|image_pad|>", FORGE_TT_CONTROL}, {"<|video_pad|>", FORGE_TT_CONTROL},
    {"<tool_call>", FORGE_TT_USER}, {"</tool_call>", FORGE_TT_USER},
    {"<|fim_prefix|>", FORGE_TT_USER}, {"<|fim_middle|>", FORGE_TT_USER},
    {"<|fim_suffix|>", FORGE_TT_USER}, {"<|fim_pad|>", FORGE_TT_USER},
    {"<|repo_name|>", FORGE_TT_USER}, {"<|file_sep|>", FORGE_TT_USER},
    {"<tool_response>", FORGE_TT_USER}, {"</tool_response>", FORGE_TT_USER},
    {"<think>", FORGE_TT_USER}, {"</think>", FORGE_TT_USER},
};
static const special k_qwen2_specials[] = {
    {"<|endoftext|>", FORGE_TT_CONTROL}, {"<|im_start|>", FORGE_TT_CONTROL}, {"<|im_end|>", FORGE_TT_CONTROL},
};
static const special k_olmoe_specials[] = {
    {"<|endoftext|>", FORGE_TT_CONTROL}, {"<|padding|>", FORGE_TT_CONTROL},
};
/* o200k_harmony from id 199998; NULL entries are <|reserved_ID|> */
static const special k_harmony_specials[] = {
    {"<|startoftext|>", FORGE_TT_CONTROL}, {"<|endoftext|>", FORGE_TT_CONTROL}, {NULL, 0}, {NULL, 0},
    {"<|return|>", FORGE_TT_CONTROL}, {"<|constrain|>", FORGE_TT_CONTROL}, {NULL, 0},
    {"<|channel|>", FORGE_TT_CONTROL}, {"<|start|>", FORGE_TT_CONTROL}, {"<|end|>", FORGE_TT_CONTROL},
    {"<|message|>", FORGE_TT_CONTROL}, {NULL, 0}, {NULL, 0}, {NULL, 0}, {"<|call|>", FORGE_TT_CONTROL},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static char *fmtstr(const char *fmt, long long v) {
    char buf[64];
    snprintf(buf, sizeof(buf), fmt, v);
    return dupstr(buf);
}

static hm_status alloc_vocab(forge_vocab *v, int64_t n, int64_t max_merges, hm_error *err) {
    v->n = n;
    v->tokens = calloc((size_t)n, sizeof(char *));
    v->types = calloc((size_t)n, sizeof(int32_t));
    v->scores = calloc((size_t)n, sizeof(float));
    v->merges = calloc((size_t)max_merges + 1, sizeof(char *));
    if (!v->tokens || !v->types || !v->scores || !v->merges)
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory for a %lld-token vocabulary", (long long)n);
    return HM_OK;
}

static char *merge_str(char **tokens, int a, int b) {
    size_t la = strlen(tokens[a]), lb = strlen(tokens[b]);
    char *s = malloc(la + lb + 2);
    if (!s) return NULL;
    memcpy(s, tokens[a], la);
    s[la] = ' ';
    memcpy(s + la + 1, tokens[b], lb + 1);
    return s;
}

/* Learns merges on ws and records them in v; returns the first free id or -1 on OOM. */
static int64_t learn(forge_vocab *v, word_set *ws, str_table *tab, int64_t n_sym, int64_t max_sym,
                     int64_t max_merges, int64_t *n_merges_out) {
    int *mg = malloc((size_t)(max_merges + 1) * 2 * sizeof(int));
    int *res = malloc((size_t)(max_merges + 1) * sizeof(int));
    if (!mg || !res) { free(mg); free(res); return -1; }
    int64_t nm = bpe_train(ws, v->tokens, &n_sym, max_sym, tab, max_merges, mg, res);
    if (nm < 0) { free(mg); free(res); return -1; }
    for (int64_t k = 0; k < nm; k++) {
        v->merges[k] = merge_str(v->tokens, mg[2 * k], mg[2 * k + 1]);
        if (!v->merges[k]) { free(mg); free(res); return -1; }
    }
    v->n_merges = nm;
    *n_merges_out = nm;
    free(mg);
    free(res);
    return n_sym;
}

static hm_status build_bpe(const forge_preset *p, forge_vocab *v, str_table *tab, hm_error *err) {
    uint8_t order[256];
    int byte_id[256];
    byte_order(order);
    for (int i = 0; i < 256; i++) {
        char u[4];
        forge_byte_to_unicode(order[i], u);
        v->tokens[i] = dupstr(u);
        if (!v->tokens[i]) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        v->types[i] = FORGE_TT_NORMAL;
        byte_id[order[i]] = i;
        table_find(tab, v->tokens, u, i);
    }
    word_set ws = {0};
    if (!split_bytes(forge_vocab_training_text(), &ws, byte_id)) {
        words_free(&ws);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    }
    int64_t nm = 0, next = learn(v, &ws, tab, 256, p->special_base, p->n_merges_max, &nm);
    words_free(&ws);
    if (next < 0) return hm_error_set(err, HM_ERR_NOMEM, "out of memory training the tokenizer");
    for (int64_t i = 256; i < next; i++) v->types[i] = FORGE_TT_NORMAL;
    return HM_OK;
}

static hm_status build_spm(const forge_preset *p, forge_vocab *v, str_table *tab, hm_error *err) {
    static const char *const head[3] = {"<unk>", "<s>", "</s>"};
    static const int head_type[3] = {FORGE_TT_UNKNOWN, FORGE_TT_CONTROL, FORGE_TT_CONTROL};
    int64_t id = 0;
    for (; id < 3; id++) { v->tokens[id] = dupstr(head[id]); v->types[id] = head_type[id]; }
    for (int b = 0; b < 256; b++, id++) {
        v->tokens[id] = fmtstr("<0x%02llX>", b);
        v->types[id] = FORGE_TT_BYTE;
    }
    for (int64_t i = 0; i < id; i++) {
        if (!v->tokens[i]) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        table_find(tab, v->tokens, v->tokens[i], i);
    }
    /* single characters: "▁" then the text's distinct ASCII characters */
    const char *text = forge_vocab_training_text();
    int char_id[128];
    for (int c = 0; c < 128; c++) char_id[c] = -1;
    const int64_t first_char = id;
    v->tokens[id] = dupstr("\xE2\x96\x81");
    table_find(tab, v->tokens, v->tokens[id], id);
    const int space_id = (int)id++;
    for (const char *c = text; *c; c++) {
        unsigned char ch = (unsigned char)*c;
        if (ch >= 128 || is_space((char)ch) || char_id[ch] >= 0) continue;
        char s[2] = {(char)ch, 0};
        v->tokens[id] = dupstr(s);
        table_find(tab, v->tokens, s, id);
        char_id[ch] = (int)id++;
    }
    const int64_t n_chars = id - first_char;
    word_set ws = {0};
    int buf[256];
    for (const char *c = text; *c;) {
        while (*c && is_space(*c)) c++;
        if (!*c) break;
        int len = 0;
        buf[len++] = space_id;
        while (*c && !is_space(*c) && len < 256) buf[len++] = char_id[(unsigned char)*c++];
        if (!words_add(&ws, buf, len)) { words_free(&ws); return hm_error_set(err, HM_ERR_NOMEM, "out of memory"); }
    }
    int64_t nm = 0, next = learn(v, &ws, tab, id, p->n_vocab, p->n_merges_max, &nm);
    words_free(&ws);
    if (next < 0) return hm_error_set(err, HM_ERR_NOMEM, "out of memory training the tokenizer");
    /* scores: learned pieces by merge order, single characters below them */
    for (int64_t i = first_char; i < first_char + n_chars; i++) {
        v->types[i] = FORGE_TT_NORMAL;
        v->scores[i] = -(float)(nm + (i - first_char));
    }
    for (int64_t i = first_char + n_chars; i < next; i++) {
        v->types[i] = FORGE_TT_NORMAL;
        v->scores[i] = -(float)(i - first_char - n_chars);
    }
    return HM_OK;
}

static int64_t find_tok(forge_vocab *v, str_table *tab, const char *s) { return table_find(tab, v->tokens, s, -1); }

hm_status forge_vocab_build(const forge_preset *p, forge_vocab *v, hm_error *err) {
    memset(v, 0, sizeof(*v));
    v->bos = v->eos = v->pad = v->unk = -1;
    v->spm = p->arch == FORGE_ARCH_LLAMA;
    v->chat_template = forge_chat_template(p->arch);
    hm_status st = alloc_vocab(v, p->n_vocab, p->n_merges_max, err);
    str_table tab = {0};
    if (st == HM_OK && !table_init(&tab, p->n_vocab)) st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    if (st == HM_OK) st = v->spm ? build_spm(p, v, &tab, err) : build_bpe(p, v, &tab, err);
    if (st != HM_OK) goto fail;

    const special *sp = NULL;
    int nsp = 0;
    switch (p->arch) {
    case FORGE_ARCH_QWEN3NEXT:
    case FORGE_ARCH_QWEN35MOE:
    case FORGE_ARCH_GEMMA4: /* forge's byte-level BPE with Qwen3's specials, not Gemma's tokenizer */
    case FORGE_ARCH_QWEN3MOE: sp = k_qwen3_specials; nsp = COUNT(k_qwen3_specials); v->pre = "qwen2"; break;
    case FORGE_ARCH_QWEN2MOE: sp = k_qwen2_specials; nsp = COUNT(k_qwen2_specials); v->pre = "qwen2"; break;
    case FORGE_ARCH_OLMOE: sp = k_olmoe_specials; nsp = COUNT(k_olmoe_specials); v->pre = "olmo"; break;
    case FORGE_ARCH_GPTOSS: sp = k_harmony_specials; nsp = COUNT(k_harmony_specials); v->pre = "gpt-4o"; break;
    default: v->pre = "default"; break;
    }
    if (!v->spm && p->special_base + nsp > p->n_vocab) {
        st = hm_error_set(err, HM_ERR_ARG, "vocabulary of %lld tokens too small for %d special tokens at %lld",
                          (long long)p->n_vocab, nsp, (long long)p->special_base);
        goto fail;
    }
    for (int64_t i = 0; i < p->n_vocab; i++) {
        if (v->tokens[i]) continue;
        int64_t k = i - p->special_base;
        if (!v->spm && k >= 0 && k < nsp && sp[k].text) {
            v->tokens[i] = dupstr(sp[k].text);
            v->types[i] = sp[k].type;
        } else if (p->arch == FORGE_ARCH_GPTOSS && k >= 0) {
            v->tokens[i] = fmtstr("<|reserved_%lld|>", (long long)i);
            v->types[i] = FORGE_TT_CONTROL;
        } else {
            v->tokens[i] = fmtstr("[PAD%lld]", (long long)i);
            v->types[i] = FORGE_TT_UNUSED;
        }
        if (!v->tokens[i]) { st = hm_error_set(err, HM_ERR_NOMEM, "out of memory"); goto fail; }
        if (find_tok(v, &tab, v->tokens[i]) >= 0) {
            st = hm_error_set(err, HM_ERR_STATE, "duplicate token '%s'", v->tokens[i]);
            goto fail;
        }
        table_find(&tab, v->tokens, v->tokens[i], i);
    }

    switch (p->arch) {
    case FORGE_ARCH_QWEN3MOE:
    case FORGE_ARCH_QWEN3NEXT:
    case FORGE_ARCH_QWEN35MOE:
    case FORGE_ARCH_GEMMA4:
    case FORGE_ARCH_QWEN2MOE:
        v->bos = v->pad = find_tok(v, &tab, "<|endoftext|>");
        v->eos = find_tok(v, &tab, "<|im_end|>");
        break;
    case FORGE_ARCH_OLMOE:
        v->bos = v->eos = find_tok(v, &tab, "<|endoftext|>");
        v->pad = find_tok(v, &tab, "<|padding|>");
        break;
    case FORGE_ARCH_GPTOSS:
        v->bos = find_tok(v, &tab, "<|startoftext|>");
        v->eos = find_tok(v, &tab, "<|return|>");
        v->pad = find_tok(v, &tab, "<|endoftext|>");
        break;
    default:
        v->unk = 0; v->bos = 1; v->eos = 2;
        v->add_bos = true;
        break;
    }
    v->bos_str = v->bos >= 0 ? v->tokens[v->bos] : NULL;
    v->eos_str = v->eos >= 0 ? v->tokens[v->eos] : NULL;
    v->pad_str = v->pad >= 0 ? v->tokens[v->pad] : NULL;
    v->unk_str = v->unk >= 0 ? v->tokens[v->unk] : NULL;
    free(tab.slot);
    return HM_OK;
fail:
    free(tab.slot);
    forge_vocab_free(v);
    return st;
}

void forge_vocab_free(forge_vocab *v) {
    if (!v) return;
    if (v->tokens)
        for (int64_t i = 0; i < v->n; i++) free(v->tokens[i]);
    if (v->merges)
        for (int64_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->scores);
    free(v->merges);
    memset(v, 0, sizeof(*v));
}
