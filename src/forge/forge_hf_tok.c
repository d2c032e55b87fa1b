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

#include "forge/forge_hf_internal.h"
#include "forge/forge_json.h"
#include "forge/forge_vocab_internal.h"

static void obj_type(fj *j, const char *type) {
    fj_obj_begin(j);
    fj_kstr(j, "type", type);
}

static void bytelevel(fj *j, bool prefix, bool trim, bool regex) {
    obj_type(j, "ByteLevel");
    fj_kbool(j, "add_prefix_space", prefix);
    fj_kbool(j, "trim_offsets", trim);
    fj_kbool(j, "use_regex", regex);
    fj_obj_end(j);
}

static void string_pattern(fj *j, const char *kind, const char *s) {
    fj_key(j, "pattern");
    fj_obj_begin(j);
    fj_kstr(j, kind, s);
    fj_obj_end(j);
}

static void tokenizer_json(fj *j, const forge_vocab *v) {
    fj_obj_begin(j);
    fj_kstr(j, "version", "1.0");
    fj_knull(j, "truncation");
    fj_knull(j, "padding");
    fj_key(j, "added_tokens");
    fj_arr_begin(j);
    for (int64_t i = 0; i < v->n; i++) {
        int t = v->types[i];
        if (t != FORGE_TT_CONTROL && t != FORGE_TT_USER && t != FORGE_TT_UNKNOWN) continue;
        fj_obj_begin(j);
        fj_kint(j, "id", i);
        fj_kstr(j, "content", v->tokens[i]);
        fj_kbool(j, "single_word", false);
        fj_kbool(j, "lstrip", false);
        fj_kbool(j, "rstrip", false);
        fj_kbool(j, "normalized", false);
        fj_kbool(j, "special", t != FORGE_TT_USER);
        fj_obj_end(j);
    }
    fj_arr_end(j);
    if (v->spm) {
        fj_key(j, "normalizer");
        obj_type(j, "Sequence");
        fj_key(j, "normalizers");
        fj_arr_begin(j);
        obj_type(j, "Prepend");
        fj_kstr(j, "prepend", "\xE2\x96\x81");
        fj_obj_end(j);
        obj_type(j, "Replace");
        string_pattern(j, "String", " ");
        fj_kstr(j, "content", "\xE2\x96\x81");
        fj_obj_end(j);
        fj_arr_end(j);
        fj_obj_end(j);
        fj_knull(j, "pre_tokenizer");
        fj_key(j, "post_processor");
        obj_type(j, "TemplateProcessing");
        static const char *const seqs[2] = {"single", "pair"};
        for (int s = 0; s < 2; s++) {
            fj_key(j, seqs[s]);
            fj_arr_begin(j);
            for (int part = 0; part <= s; part++) {
                fj_obj_begin(j); fj_key(j, "SpecialToken"); fj_obj_begin(j);
                fj_kstr(j, "id", v->bos_str); fj_kint(j, "type_id", part);
                fj_obj_end(j); fj_obj_end(j);
                fj_obj_begin(j); fj_key(j, "Sequence"); fj_obj_begin(j);
                fj_kstr(j, "id", part ? "B" : "A"); fj_kint(j, "type_id", part);
                fj_obj_end(j); fj_obj_end(j);
            }
            fj_arr_end(j);
        }
        fj_key(j, "special_tokens");
        fj_obj_begin(j);
        fj_key(j, v->bos_str);
        fj_obj_begin(j);
        fj_kstr(j, "id", v->bos_str);
        fj_key(j, "ids"); fj_arr_begin(j); fj_int(j, v->bos); fj_arr_end(j);
        fj_key(j, "tokens"); fj_arr_begin(j); fj_str(j, v->bos_str); fj_arr_end(j);
        fj_obj_end(j);
        fj_obj_end(j);
        fj_obj_end(j);
        fj_key(j, "decoder");
        obj_type(j, "Sequence");
        fj_key(j, "decoders");
        fj_arr_begin(j);
        obj_type(j, "Replace");
        string_pattern(j, "String", "\xE2\x96\x81");
        fj_kstr(j, "content", " ");
        fj_obj_end(j);
        obj_type(j, "ByteFallback"); fj_obj_end(j);
        obj_type(j, "Fuse"); fj_obj_end(j);
        obj_type(j, "Strip");
        fj_kstr(j, "content", " ");
        fj_kint(j, "start", 1);
        fj_kint(j, "stop", 0);
        fj_obj_end(j);
        fj_arr_end(j);
        fj_obj_end(j);
    } else {
        fj_knull(j, "normalizer");
        fj_key(j, "pre_tokenizer");
        const char *re = forge_pretok_regex(v->pre);
        if (re) {
            obj_type(j, "Sequence");
            fj_key(j, "pretokenizers");
            fj_arr_begin(j);
            obj_type(j, "Split");
            string_pattern(j, "Regex", re);
            fj_kstr(j, "behavior", "Isolated");
            fj_kbool(j, "invert", false);
            fj_obj_end(j);
            bytelevel(j, false, true, false);
            fj_arr_end(j);
            fj_obj_end(j);
        } else {
            bytelevel(j, false, true, true);
        }
        fj_key(j, "post_processor");
        bytelevel(j, true, false, true);
        fj_key(j, "decoder");
        bytelevel(j, true, true, true);
    }
    fj_key(j, "model");
    obj_type(j, "BPE");
    fj_knull(j, "dropout");
    fj_kstr(j, "unk_token", v->spm ? v->unk_str : NULL);
    fj_knull(j, "continuing_subword_prefix");
    fj_knull(j, "end_of_word_suffix");
    fj_kbool(j, "fuse_unk", v->spm);
    fj_kbool(j, "byte_fallback", v->spm);
    fj_kbool(j, "ignore_merges", false);
    fj_key(j, "vocab");
    fj_obj_begin(j);
    for (int64_t i = 0; i < v->n; i++) fj_kint(j, v->tokens[i], i);
    fj_obj_end(j);
    fj_key(j, "merges");
    fj_arr_begin(j);
    for (int64_t i = 0; i < v->n_merges; i++) fj_str(j, v->merges[i]);
    fj_arr_end(j);
    fj_obj_end(j);
    fj_obj_end(j);
}

static hm_status write_json(const char *dir, const char *name, fj *j, hm_error *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    hm_status st = fj_write_file(j, path, err);
    fj_free(j);
    return st;
}

hm_status forge_hf_write_tokenizer(const char *dir, const forge_preset *p, const forge_vocab *v,
                                   hm_error *err) {
    fj j;
    fj_init(&j, true);
    tokenizer_json(&j, v);
    hm_status st = write_json(dir, "tokenizer.json", &j, err);
    if (st != HM_OK) return st;
    fj_init(&j, true);
    fj_obj_begin(&j);
    fj_kbool(&j, "add_bos_token", v->add_bos);
    fj_kbool(&j, "add_eos_token", false);
    fj_kstr(&j, "bos_token", v->bos_str);
    fj_kstr(&j, "eos_token", v->eos_str);
    fj_kstr(&j, "pad_token", v->pad_str);
    fj_kstr(&j, "unk_token", v->unk_str);
    fj_kstr(&j, "chat_template", v->chat_template);
    fj_kbool(&j, "clean_up_tokenization_spaces", false);
    fj_kint(&j, "model_max_length", p->n_ctx);
    fj_kstr(&j, "tokenizer_class", "PreTrainedTokenizerFast");
    fj_obj_end(&j);
    return write_json(dir, "tokenizer_config.json", &j, err);
}
