/* convert_vocab.c - tokenizer.json + tokenizer_config.json as the GGUF vocabulary
 * (tokenizer.ggml.*), following convert_hf_to_gguf's rules.
 *
 * DESIGN: ids come from the BPE model's vocab and the added_tokens list; ids below vocab_size
 * that neither names become "[PADi]" of type UNUSED (as convert_hf_to_gguf pads Qwen), and a
 * vocab entry spelled "[PADi]" at id i counts as such a pad. Types: added special tokens are
 * CONTROL (the model's unk_token UNKNOWN), other added tokens USER_DEFINED, "<0xHH>" pieces of a
 * byte-fallback model BYTE, the rest NORMAL. A BPE model with byte_fallback is SentencePiece
 * ("llama"): it gets scores and no merges in the GGUF. Scores rank pieces as the merges do:
 * pieces a merge produces score -r (r: rank in id order), the other normal pieces below all of
 * them, -(n_merges + r); SentencePiece vocabularies are ordered by score, so id order is score
 * order. Byte-level models ("gpt2") get merges; the pre-tokenizer name is recognised from the
 * Split regex (forge_pretok_regex: qwen2, gpt-4o) or plain ByteLevel (olmo for OLMoE, else
 * gpt-2). Special tokens come from tokenizer_config.json's *_token strings, else config.json's
 * *_token_id; the chat template from tokenizer_config.json or chat_template.jinja.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_internal.h"
#include "forge/forge_vocab_internal.h"

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static json_t *load(const char *dir, const char *name, bool required, char *path, size_t cap,
                    hm_status *st, hm_error *err) {
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (required) *st = hm_error_set(err, HM_ERR_NOT_FOUND, "%s: missing", path);
        return NULL;
    }
    fclose(f);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        *st = hm_error_set(err, HM_ERR_FORMAT, "%s: malformed JSON: %s (line %d, column %d)", path,
                           je.text, je.line, je.column);
    return root;
}

/* a *_token field: a string or {"content": string} */
static const char *token_field(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int64_t id_field(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_array(v)) v = json_array_get(v, 0);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static bool is_byte_piece(const char *s) {
    return strlen(s) == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>';
}

static bool is_pad_of(const char *s, int64_t id) {
    char buf[32];
    snprintf(buf, sizeof(buf), "[PAD%lld]", (long long)id);
    return !strcmp(s, buf);
}

static hm_status read_tokens(const char *path, json_t *tok, const forge_preset *p, forge_vocab *v,
                             json_t *tcfg, hm_error *err) {
    json_t *model = json_object_get(tok, "model"), *vocab = json_object_get(model, "vocab");
    if (!json_is_object(model) || !json_is_object(vocab))
        return hm_error_set(err, HM_ERR_FORMAT, "%s: model.vocab: missing or not an object", path);
    json_t *mt = json_object_get(model, "type");
    if (json_is_string(mt) && strcmp(json_string_value(mt), "BPE"))
        return hm_error_set(err, HM_ERR_UNSUPPORTED,
                            "%s: model.type %s: only BPE tokenizers are supported", path,
                            json_string_value(mt));
    v->spm = json_is_true(json_object_get(model, "byte_fallback"));
    const int64_t n = p->n_vocab;
    v->n = n;
    v->tokens = calloc((size_t)n, sizeof(char *));
    v->types = calloc((size_t)n, sizeof(int32_t));
    v->scores = calloc((size_t)n, sizeof(float));
    if (!v->tokens || !v->types || !v->scores)
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory for %lld tokens", (long long)n);
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= n)
            return hm_error_set(
                err, HM_ERR_FORMAT,
                "%s: model.vocab.%s: id must be an integer in 0..%lld (config.json vocab_size)",
                path, key, (long long)n - 1);
        int64_t id = (int64_t)json_integer_value(val);
        free(v->tokens[id]);
        if (!(v->tokens[id] = dupstr(key))) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        v->types[id] = is_pad_of(key, id)             ? FORGE_TT_UNUSED
                       : v->spm && is_byte_piece(key) ? FORGE_TT_BYTE
                                                      : FORGE_TT_NORMAL;
    }
    const char *unk = token_field(tcfg, "unk_token");
    json_t *added = json_object_get(tok, "added_tokens");
    size_t i;
    json_array_foreach(added, i, val) {
        json_t *jid = json_object_get(val, "id"), *jc = json_object_get(val, "content");
        if (!json_is_integer(jid) || !json_is_string(jc) || json_integer_value(jid) < 0 ||
            json_integer_value(jid) >= n)
            return hm_error_set(
                err, HM_ERR_FORMAT,
                "%s: added_tokens[%zu]: needs an id in 0..%lld and a content string", path, i,
                (long long)n - 1);
        int64_t id = (int64_t)json_integer_value(jid);
        const char *c = json_string_value(jc);
        free(v->tokens[id]);
        if (!(v->tokens[id] = dupstr(c))) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        bool special = json_is_true(json_object_get(val, "special"));
        v->types[id] = unk && !strcmp(c, unk) ? FORGE_TT_UNKNOWN
                       : special              ? FORGE_TT_CONTROL
                                              : FORGE_TT_USER;
    }
    for (int64_t k = 0; k < n; k++) {
        if (v->tokens[k]) continue;
        char buf[32];
        snprintf(buf, sizeof(buf), "[PAD%lld]", (long long)k);
        if (!(v->tokens[k] = dupstr(buf))) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        v->types[k] = FORGE_TT_UNUSED;
    }
    return HM_OK;
}

static hm_status read_merges(const char *path, json_t *tok, forge_vocab *v, hm_error *err) {
    json_t *merges = json_object_get(json_object_get(tok, "model"), "merges");
    if (!merges)
        merges = json_array();
    else
        json_incref(merges);
    if (!json_is_array(merges)) {
        json_decref(merges);
        return hm_error_set(err, HM_ERR_FORMAT, "%s: model.merges: not an array", path);
    }
    size_t n = json_array_size(merges), i;
    v->merges = calloc(n + 1, sizeof(char *));
    if (!v->merges) {
        json_decref(merges);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    }
    json_t *m;
    hm_status st = HM_OK;
    json_array_foreach(merges, i, m) {
        char *s = NULL;
        if (json_is_string(m)) {
            s = dupstr(json_string_value(m));
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            const char *a = json_string_value(json_array_get(m, 0)),
                       *b = json_string_value(json_array_get(m, 1));
            size_t la = strlen(a), lb = strlen(b);
            if ((s = malloc(la + lb + 2))) {
                memcpy(s, a, la);
                s[la] = ' ';
                memcpy(s + la + 1, b, lb + 1);
            }
        } else {
            st = hm_error_set(err, HM_ERR_FORMAT,
                              "%s: model.merges[%zu]: not \"a b\" or [\"a\", \"b\"]", path, i);
            break;
        }
        if (!s) {
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
            break;
        }
        v->merges[v->n_merges++] = s;
    }
    json_decref(merges);
    return st;
}

/* SentencePiece scores from the merges (see DESIGN) */
static hm_status spm_scores(json_t *tok, forge_vocab *v, hm_error *err) {
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    bool *merged = calloc((size_t)v->n, sizeof(bool));
    if (!merged) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    for (int64_t k = 0; k < v->n_merges; k++) {
        char *s = v->merges[k], *sp = strchr(s, ' ');
        if (!sp) continue;
        size_t la = (size_t)(sp - s), lb = strlen(sp + 1);
        char *cat = malloc(la + lb + 1);
        if (!cat) {
            free(merged);
            return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        }
        memcpy(cat, s, la);
        memcpy(cat + la, sp + 1, lb + 1);
        json_t *id = json_object_get(vocab, cat);
        if (json_is_integer(id) && json_integer_value(id) < v->n)
            merged[json_integer_value(id)] = true;
        free(cat);
    }
    int64_t rm = 0, rb = 0;
    for (int64_t i = 0; i < v->n; i++) {
        if (v->types[i] != FORGE_TT_NORMAL) continue;
        v->scores[i] = merged[i] ? -(float)(rm++) : -(float)(v->n_merges + rb++);
    }
    free(merged);
    return HM_OK;
}

static hm_status pre_name(const char *path, json_t *tok, const forge_preset *p, forge_vocab *v,
                          hm_error *err) {
    if (v->spm) {
        v->pre = dupstr("default");
        return v->pre ? HM_OK : hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    }
    json_t *pt = json_object_get(tok, "pre_tokenizer");
    const char *re = NULL;
    json_t *list = json_object_get(pt, "pretokenizers"), *x;
    size_t i;
    json_array_foreach(list, i, x) {
        json_t *pat = json_object_get(json_object_get(x, "pattern"), "Regex");
        if (json_is_string(pat)) re = json_string_value(pat);
    }
    const char *name = NULL;
    if (re) {
        static const char *const known[] = {"qwen2", "gpt-4o"};
        for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++)
            if (!strcmp(re, forge_pretok_regex(known[k]))) name = known[k];
        if (!name)
            return hm_error_set(
                err, HM_ERR_UNSUPPORTED,
                "%s: pre_tokenizer: the Split regex is not one hotmoe knows (qwen2, gpt-4o)", path);
    } else {
        json_t *ty = json_object_get(pt, "type");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "ByteLevel"))
            return hm_error_set(
                err, HM_ERR_UNSUPPORTED,
                "%s: pre_tokenizer: neither ByteLevel nor a Split regex hotmoe knows", path);
        name = p->arch == FORGE_ARCH_OLMOE ? "olmo" : "gpt-2";
    }
    v->pre = dupstr(name);
    return v->pre ? HM_OK : hm_error_set(err, HM_ERR_NOMEM, "out of memory");
}

static int64_t find_token(const forge_vocab *v, const char *s) {
    if (!s) return -1;
    for (int64_t i = 0; i < v->n; i++)
        if (!strcmp(v->tokens[i], s)) return i;
    return -1;
}

static hm_status chat_template(const char *dir, json_t *tcfg, forge_vocab *v, hm_error *err) {
    json_t *ct = json_object_get(tcfg, "chat_template");
    const char *s = json_is_string(ct) ? json_string_value(ct) : NULL;
    size_t i;
    json_t *x;
    if (json_is_array(ct)) json_array_foreach(ct, i, x) {
            json_t *nm = json_object_get(x, "name"), *t = json_object_get(x, "template");
            if (json_is_string(nm) && !strcmp(json_string_value(nm), "default") &&
                json_is_string(t))
                s = json_string_value(t);
        }
    if (s) {
        v->chat_template = dupstr(s);
        return v->chat_template ? HM_OK : hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return HM_OK;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        fclose(f);
        return hm_error_set(err, HM_ERR_IO, "%s: cannot read", path);
    }
    fclose(f);
    buf[len] = 0;
    v->chat_template = buf;
    return HM_OK;
}

hm_status convert_vocab_read(const char *dir, const forge_preset *p, forge_vocab *v,
                             hm_error *err) {
    memset(v, 0, sizeof(*v));
    v->bos = v->eos = v->pad = v->unk = -1;
    char tpath[4096], cpath[4096], gpath[4096];
    hm_status st = HM_OK;
    json_t *tok = load(dir, "tokenizer.json", true, tpath, sizeof(tpath), &st, err);
    json_t *tcfg = st == HM_OK
                       ? load(dir, "tokenizer_config.json", false, cpath, sizeof(cpath), &st, err)
                       : NULL;
    json_t *cfg =
        st == HM_OK ? load(dir, "config.json", false, gpath, sizeof(gpath), &st, err) : NULL;
    if (st == HM_OK) st = read_tokens(tpath, tok, p, v, tcfg, err);
    if (st == HM_OK) st = read_merges(tpath, tok, v, err);
    if (st == HM_OK && v->spm) st = spm_scores(tok, v, err);
    if (st == HM_OK) st = pre_name(tpath, tok, p, v, err);
    if (st == HM_OK) st = chat_template(dir, tcfg, v, err);
    if (st == HM_OK) {
        static const char *const keys[4] = {"bos", "eos", "pad", "unk"};
        int64_t *ids[4] = {&v->bos, &v->eos, &v->pad, &v->unk};
        for (int k = 0; k < 4; k++) {
            char key[32];
            snprintf(key, sizeof(key), "%s_token", keys[k]);
            const char *s = token_field(tcfg, key);
            int64_t id = find_token(v, s);
            if (s && id < 0) {
                st = hm_error_set(err, HM_ERR_FORMAT, "%s: %s \"%s\" is not in tokenizer.json",
                                  cpath, key, s);
                break;
            }
            if (!s) {
                snprintf(key, sizeof(key), "%s_token_id", keys[k]);
                id = id_field(cfg, key);
                if (id >= v->n) {
                    st = hm_error_set(err, HM_ERR_FORMAT, "%s: %s %lld is not below vocab_size",
                                      gpath, key, (long long)id);
                    break;
                }
            }
            *ids[k] = id;
        }
        json_t *ab = json_object_get(tcfg, "add_bos_token");
        v->add_bos = json_is_true(ab);
        v->bos_str = v->bos >= 0 ? v->tokens[v->bos] : NULL;
        v->eos_str = v->eos >= 0 ? v->tokens[v->eos] : NULL;
        v->pad_str = v->pad >= 0 ? v->tokens[v->pad] : NULL;
        v->unk_str = v->unk >= 0 ? v->tokens[v->unk] : NULL;
    }
    json_decref(tok);
    json_decref(tcfg);
    json_decref(cfg);
    if (st != HM_OK) convert_vocab_free(v);
    return st;
}

void convert_vocab_free(forge_vocab *v) {
    if (!v) return;
    free((char *)v->pre);
    free((char *)v->chat_template);
    v->pre = v->chat_template = NULL;
    forge_vocab_free(v);
}
