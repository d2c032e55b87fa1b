/* forge_hf_tok.c - tokenizer.json and tokenizer_config.json for a forged vocabulary.
 *
 * DESIGN: a `tokenizers` BPE model with the GGUF's vocabulary (same ids) and merges.
 * Byte-level models get the pre-tokenizer of their llama.cpp pre name (qwen2 / gpt-4o: Split on
 * the model's regex + ByteLevel without regex; olmo: GPT-2's ByteLevel regex) and a ByteLevel
 * decoder. The SentencePiece model (mixtral) becomes the usual "llama" tokenizer.json: Prepend
 * and Replace normalizers for "▁", byte_fallback, a decoder that undoes them, and a template
 * that adds <s>. Control and user-defined tokens are added tokens (special = control).
 */
#include <stdio.h>

#include "base/json.h"
#include "forge/forge_hf_internal.h"
#include "forge/forge_vocab_internal.h"

static void obj_type(hm_json *j, const char *type) {
    hm_json_obj_begin(j);
    hm_json_kstr(j, "type", type);
}

static void bytelevel(hm_json *j, bool prefix, bool trim, bool regex) {
    obj_type(j, "ByteLevel");
    hm_json_kbool(j, "add_prefix_space", prefix);
    hm_json_kbool(j, "trim_offsets", trim);
    hm_json_kbool(j, "use_regex", regex);
    hm_json_obj_end(j);
}

static void string_pattern(hm_json *j, const char *kind, const char *s) {
    hm_json_key(j, "pattern");
    hm_json_obj_begin(j);
    hm_json_kstr(j, kind, s);
    hm_json_obj_end(j);
}

static void tokenizer_json(hm_json *j, const forge_vocab *v) {
    hm_json_obj_begin(j);
    hm_json_kstr(j, "version", "1.0");
    hm_json_knull(j, "truncation");
    hm_json_knull(j, "padding");
    hm_json_key(j, "added_tokens");
    hm_json_arr_begin(j);
    for (int64_t i = 0; i < v->n; i++) {
        int t = v->types[i];
        if (t != FORGE_TT_CONTROL && t != FORGE_TT_USER && t != FORGE_TT_UNKNOWN) continue;
        hm_json_obj_begin(j);
        hm_json_kint(j, "id", i);
        hm_json_kstr(j, "content", v->tokens[i]);
        hm_json_kbool(j, "single_word", false);
        hm_json_kbool(j, "lstrip", false);
        hm_json_kbool(j, "rstrip", false);
        hm_json_kbool(j, "normalized", false);
        hm_json_kbool(j, "special", t != FORGE_TT_USER);
        hm_json_obj_end(j);
    }
    hm_json_arr_end(j);
    if (v->spm) {
        hm_json_key(j, "normalizer");
        obj_type(j, "Sequence");
        hm_json_key(j, "normalizers");
        hm_json_arr_begin(j);
        obj_type(j, "Prepend");
        hm_json_kstr(j, "prepend", "\xE2\x96\x81");
        hm_json_obj_end(j);
        obj_type(j, "Replace");
        string_pattern(j, "String", " ");
        hm_json_kstr(j, "content", "\xE2\x96\x81");
        hm_json_obj_end(j);
        hm_json_arr_end(j);
        hm_json_obj_end(j);
        hm_json_knull(j, "pre_tokenizer");
        hm_json_key(j, "post_processor");
        obj_type(j, "TemplateProcessing");
        static const char *const seqs[2] = {"single", "pair"};
        for (int s = 0; s < 2; s++) {
            hm_json_key(j, seqs[s]);
            hm_json_arr_begin(j);
            for (int part = 0; part <= s; part++) {
                hm_json_obj_begin(j); hm_json_key(j, "SpecialToken"); hm_json_obj_begin(j);
                hm_json_kstr(j, "id", v->bos_str); hm_json_kint(j, "type_id", part);
                hm_json_obj_end(j); hm_json_obj_end(j);
                hm_json_obj_begin(j); hm_json_key(j, "Sequence"); hm_json_obj_begin(j);
                hm_json_kstr(j, "id", part ? "B" : "A"); hm_json_kint(j, "type_id", part);
                hm_json_obj_end(j); hm_json_obj_end(j);
            }
            hm_json_arr_end(j);
        }
        hm_json_key(j, "special_tokens");
        hm_json_obj_begin(j);
        hm_json_key(j, v->bos_str);
        hm_json_obj_begin(j);
        hm_json_kstr(j, "id", v->bos_str);
        hm_json_key(j, "ids"); hm_json_arr_begin(j); hm_json_int(j, v->bos); hm_json_arr_end(j);
        hm_json_key(j, "tokens"); hm_json_arr_begin(j); hm_json_str(j, v->bos_str); hm_json_arr_end(j);
        hm_json_obj_end(j);
        hm_json_obj_end(j);
        hm_json_obj_end(j);
        hm_json_key(j, "decoder");
        obj_type(j, "Sequence");
        hm_json_key(j, "decoders");
        hm_json_arr_begin(j);
        obj_type(j, "Replace");
        string_pattern(j, "String", "\xE2\x96\x81");
        hm_json_kstr(j, "content", " ");
        hm_json_obj_end(j);
        obj_type(j, "ByteFallback"); hm_json_obj_end(j);
        obj_type(j, "Fuse"); hm_json_obj_end(j);
        obj_type(j, "Strip");
        hm_json_kstr(j, "content", " ");
        hm_json_kint(j, "start", 1);
        hm_json_kint(j, "stop", 0);
        hm_json_obj_end(j);
        hm_json_arr_end(j);
        hm_json_obj_end(j);
    } else {
        hm_json_knull(j, "normalizer");
        hm_json_key(j, "pre_tokenizer");
        const char *re = forge_pretok_regex(v->pre);
        if (re) {
            obj_type(j, "Sequence");
            hm_json_key(j, "pretokenizers");
            hm_json_arr_begin(j);
            obj_type(j, "Split");
            string_pattern(j, "Regex", re);
            hm_json_kstr(j, "behavior", "Isolated");
            hm_json_kbool(j, "invert", false);
            hm_json_obj_end(j);
            bytelevel(j, false, true, false);
            hm_json_arr_end(j);
            hm_json_obj_end(j);
        } else {
            bytelevel(j, false, true, true);
        }
        hm_json_key(j, "post_processor");
        bytelevel(j, true, false, true);
        hm_json_key(j, "decoder");
        bytelevel(j, true, true, true);
    }
    hm_json_key(j, "model");
    obj_type(j, "BPE");
    hm_json_knull(j, "dropout");
    hm_json_kstr(j, "unk_token", v->spm ? v->unk_str : NULL);
    hm_json_knull(j, "continuing_subword_prefix");
    hm_json_knull(j, "end_of_word_suffix");
    hm_json_kbool(j, "fuse_unk", v->spm);
    hm_json_kbool(j, "byte_fallback", v->spm);
    hm_json_kbool(j, "ignore_merges", false);
    hm_json_key(j, "vocab");
    hm_json_obj_begin(j);
    for (int64_t i = 0; i < v->n; i++) hm_json_kint(j, v->tokens[i], i);
    hm_json_obj_end(j);
    hm_json_key(j, "merges");
    hm_json_arr_begin(j);
    for (int64_t i = 0; i < v->n_merges; i++) hm_json_str(j, v->merges[i]);
    hm_json_arr_end(j);
    hm_json_obj_end(j);
    hm_json_obj_end(j);
}

static hm_status write_json(const char *dir, const char *name, hm_json *j, hm_error *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    hm_status st = hm_json_write_file(j, path, err);
    hm_json_free(j);
    return st;
}

hm_status forge_hf_write_tokenizer(const char *dir, const forge_preset *p, const forge_vocab *v,
                                   hm_error *err) {
    hm_json j;
    hm_json_init_buf(&j, true);
    tokenizer_json(&j, v);
    hm_status st = write_json(dir, "tokenizer.json", &j, err);
    if (st != HM_OK) return st;
    hm_json_init_buf(&j, true);
    hm_json_obj_begin(&j);
    hm_json_kbool(&j, "add_bos_token", v->add_bos);
    hm_json_kbool(&j, "add_eos_token", false);
    hm_json_kstr(&j, "bos_token", v->bos_str);
    hm_json_kstr(&j, "eos_token", v->eos_str);
    hm_json_kstr(&j, "pad_token", v->pad_str);
    hm_json_kstr(&j, "unk_token", v->unk_str);
    hm_json_kstr(&j, "chat_template", v->chat_template);
    hm_json_kbool(&j, "clean_up_tokenization_spaces", false);
    hm_json_kint(&j, "model_max_length", p->n_ctx);
    hm_json_kstr(&j, "tokenizer_class", "PreTrainedTokenizerFast");
    hm_json_obj_end(&j);
    return write_json(dir, "tokenizer_config.json", &j, err);
}
