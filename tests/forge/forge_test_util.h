/* forge_test_util.h - helpers shared by the forge tests: scratch paths, forging a preset,
 * reading a safetensors file, dequantising GGUF rows. */
#ifndef HM_TESTS_FORGE_UTIL_H
#define HM_TESTS_FORGE_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forge/forge.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"

static inline void ft_path(char *buf, size_t cap, const char *name) {
    const char *d = getenv("HOTMOE_TMP");
    snprintf(buf, cap, "%s/%s", d && *d ? d : "/tmp", name);
}

/* forges preset+mix to HOTMOE_TMP/<tag>.gguf (and <tag>-hf when hf); returns HM_OK */
static inline hm_status ft_forge(const forge_preset *p, forge_mix mix, uint64_t seed, const char *tag,
                                 bool hf, int threads, char *gguf_path, size_t cap, char *hf_dir, size_t hcap) {
    char name[256];
    snprintf(name, sizeof(name), "%s.gguf", tag);
    ft_path(gguf_path, cap, name);
    if (hf) {
        snprintf(name, sizeof(name), "%s-hf", tag);
        ft_path(hf_dir, hcap, name);
    }
    forge_job job = {.preset = p, .mix = mix, .out_path = gguf_path, .hf_dir = hf ? hf_dir : NULL,
                     .n_threads = threads};
    job.gen.seed = seed;
    forge_result res;
    hm_error err;
    hm_status st = forge_write_gguf(&job, &res, &err);
    if (st == HM_OK && hf) st = forge_write_hf(&job, &err);
    if (st != HM_OK) fprintf(stderr, "forge %s: %s\n", tag, err.msg);
    return st;
}

/* preset forged in mix (seed 42, GGUF only) as "<prefix>-<preset>-<mix>": the test model of the
 * GPU and engine tests. */
static inline bool ft_forged(const char *prefix, const char *preset, forge_mix mix, char *path,
                             size_t cap) {
    char tag[128];
    snprintf(tag, sizeof(tag), "%s-%s-%s", prefix, preset, forge_mix_name(mix));
    return ft_forge(forge_preset_find(preset), mix, 42, tag, false, 2, path, cap, NULL, 0) ==
           HM_OK;
}

/* ft_forged with the experts' gate and up fused (forge --fuse-gate-up), as "<prefix>-<preset>-
 * <mix>-fused" */
static inline bool ft_forged_fused(const char *prefix, const char *preset, forge_mix mix,
                                   char *path, size_t cap) {
    char name[160];
    snprintf(name, sizeof(name), "%s-%s-%s-fused.gguf", prefix, preset, forge_mix_name(mix));
    ft_path(path, cap, name);
    forge_job job = {.preset = forge_preset_find(preset), .mix = mix, .out_path = path,
                     .n_threads = 2, .fuse_gate_up = true};
    job.gen.seed = 42;
    forge_result res;
    hm_error err;
    const hm_status st = forge_write_gguf(&job, &res, &err);
    if (st != HM_OK) fprintf(stderr, "forge %s: %s\n", name, err.msg);
    return st == HM_OK;
}

static inline uint8_t *ft_read_file(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    if (b) b[sz] = 0;
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* dequantised rows [r0, r0+nr) of a GGUF tensor into dst */
static inline int ft_deq(const gguf_tensor *t, int64_t r0, int64_t nr, float *dst) {
    size_t rs = hm_row_size(t->type, t->ne[0]);
    for (int64_t r = 0; r < nr; r++)
        if (quant_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)(r0 + r) * rs, dst + r * t->ne[0], t->ne[0]) != HM_OK)
            return -1;
    return 0;
}

typedef struct {
    uint8_t *file;
    size_t size;
    const char *header; /* NUL-terminated copy */
    char *hdr_copy;
    uint64_t data_start;
} ft_st;

static inline bool ft_st_open(ft_st *s, const char *path) {
    memset(s, 0, sizeof(*s));
    s->file = ft_read_file(path, &s->size);
    if (!s->file || s->size < 8) return false;
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++) hl |= (uint64_t)s->file[k] << (8 * k);
    if (hl + 8 > s->size) return false;
    s->hdr_copy = malloc(hl + 1);
    memcpy(s->hdr_copy, s->file + 8, hl);
    s->hdr_copy[hl] = 0;
    s->header = s->hdr_copy;
    s->data_start = 8 + hl;
    return true;
}

static inline void ft_st_close(ft_st *s) { free(s->file); free(s->hdr_copy); }

/* finds tensor name: shape (n_dims) and a pointer to its f32 data; NULL if absent/bad */
static inline const float *ft_st_get(const ft_st *s, const char *name, int *n_dims, int64_t shape[4], int64_t *n) {
    char key[256];
    snprintf(key, sizeof(key), "\"%s\":{", name);
    const char *e = strstr(s->header, key);
    if (!e) return NULL;
    const char *sh = strstr(e, "\"shape\":[");
    const char *of = strstr(e, "\"data_offsets\":[");
    if (!sh || !of || !strstr(e, "\"dtype\":\"F32\"")) return NULL;
    sh += 9;
    *n_dims = 0;
    *n = 1;
    while (*sh != ']' && *n_dims < 4) {
        char *end;
        shape[*n_dims] = strtoll(sh, &end, 10);
        *n *= shape[(*n_dims)++];
        sh = end;
        if (*sh == ',') sh++;
    }
    char *end;
    uint64_t a = strtoull(of + 16, &end, 10), b = strtoull(end + 1, NULL, 10);
    if (b - a != (uint64_t)*n * 4 || s->data_start + b > s->size) return NULL;
    return (const float *)(s->file + s->data_start + a);
}

/* forge_gguf_write's row callback over forge's generator, for tests that write an edited
 * tensor list: ft_rows_ctx {generator, preset} as its context. */
typedef struct {
    const forge_gen *g;
    const forge_preset *p;
} ft_rows_ctx;

static inline hm_status ft_gen_rows(void *ctx, const forge_tensor *t, int64_t r0, int64_t nr,
                                    void *dst, float *scratch) {
    const ft_rows_ctx *c = (const ft_rows_ctx *)ctx;
    return forge_gen_rows(c->g, c->p, t, r0, nr, dst, scratch);
}

/* Writes preset p's f32 tensors l (as the caller edited them) with vocabulary v to `name` in
 * the test folder (rows from forge's generator of `seed`), frees l and v, and loads the file:
 * the loader's status (HM_ERR_STATE when the writer failed: not what a test checks). */
static inline hm_status ft_write_load(const forge_preset *p, forge_vocab *v, forge_tensor_list *l,
                                      const char *name, uint64_t seed, hm_status st,
                                      hm_error *err) {
    char path[512];
    ft_path(path, sizeof(path), name);
    forge_gen gen = {.seed = seed};
    ft_rows_ctx rc = {&gen, p};
    if (st == HM_OK)
        st = forge_gguf_write(path, p, FORGE_MIX_F32, v, l, ft_gen_rows, &rc, NULL, "t", false,
                              NULL, NULL, err);
    forge_vocab_free(v);
    forge_tensors_free(l);
    if (st != HM_OK) return HM_ERR_STATE;
    hm_model *m = NULL;
    st = hm_model_load(path, NULL, &m, err);
    hm_model_free(m);
    remove(path);
    return st;
}

#endif
