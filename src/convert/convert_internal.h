/* convert_internal.h - the pieces of `hotmoe convert` (see convert.h). */
#ifndef HM_CONVERT_INTERNAL_H
#define HM_CONVERT_INTERNAL_H

#include <stddef.h>

#include "convert/convert.h"

/* ---- safetensors (convert_st.c) ---- */
typedef enum { ST_F32, ST_F16, ST_BF16, ST_F64, ST_OTHER } st_dtype;

typedef struct {
    char *name;
    st_dtype dtype;
    char dtype_name[16]; /* as the header spells it */
    int n_dims;
    int64_t shape[8];    /* PyTorch order */
    const uint8_t *data; /* into the file's map */
    int file;            /* index into st_set.files */
} st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
} st_file;

typedef struct {
    st_file *files;
    int n_files;
    st_tensor *t; /* sorted by name */
    int n;
} st_set;

/* Opens dir/model.safetensors.index.json and its shards, or dir/model.safetensors, or every
 * *.safetensors in dir; every header is checked against its file's size. */
hm_status convert_st_open(const char *dir, st_set *s, hm_error *err);
void convert_st_close(st_set *s);
const st_tensor *convert_st_find(const st_set *s, const char *name); /* NULL if absent */
int64_t convert_st_nelem(const st_tensor *t);
/* n elements from element first, as f32 (ST_OTHER must be rejected before) */
void convert_st_read(const st_tensor *t, int64_t first, int64_t n, float *dst);
/* one element with a stride: dst[k] = t[first + k*stride] */
void convert_st_gather(const st_tensor *t, int64_t first, int64_t stride, int64_t n, float *dst);

/* ---- config.json (convert_config.c) ---- */
/* Fills p (arch and hyper-parameters) from dir/config.json; model_name is left to the caller. */
hm_status convert_config_read(const char *dir, forge_preset *p, hm_error *err);

/* ---- tokenizer (convert_vocab.c) ---- */
/* Builds v from dir/tokenizer.json and dir/tokenizer_config.json (and chat_template.jinja),
 * with ids from config.json as a fallback for the special tokens; n_vocab pads the vocabulary
 * with [PADi] tokens as convert_hf_to_gguf does. Strings in v are owned by v (forge_vocab_free
 * frees tokens/merges; the other strings are freed by convert_vocab_free). */
hm_status convert_vocab_read(const char *dir, const forge_preset *p, forge_vocab *v, hm_error *err);
void convert_vocab_free(forge_vocab *v);

#endif
