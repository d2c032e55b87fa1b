/* inspect_json.c - `hotmoe inspect --json`: the same report as the text form, as one JSON object
 * on stdout. Metadata is a list of {key, type, value}; arrays carry elem_type and n, and their
 * value holds at most JSON_ARR_MAX elements per level (then "truncated": true), so a 150k-token
 * vocabulary stays small. Every tensor is listed. Byte counts are exact integers.
 */
#include <stdio.h>

#include "base/json.h"
#include "cli/inspect.h"
#include "quant/qtypes.h"

#define JSON_ARR_MAX 64

static void json_arr_values(hm_json *j, const gguf_arr *a) {
    uint64_t n = a->n < JSON_ARR_MAX ? a->n : JSON_ARR_MAX;
    hm_json_arr_begin(j);
    for (uint64_t i = 0; i < n; i++) {
        switch (a->type) {
        case GGUF_VT_FLOAT32: hm_json_float(j, (float)gguf_arr_float(a, i)); break;
        case GGUF_VT_FLOAT64: hm_json_double(j, gguf_arr_float(a, i)); break;
        case GGUF_VT_STRING: {
            gguf_str s = gguf_arr_str(a, i);
            hm_json_strn(j, s.data, (size_t)s.len);
        } break;
        case GGUF_VT_ARRAY: {
            gguf_arr in = gguf_arr_arr(a, i);
            json_arr_values(j, &in);
        } break;
        case GGUF_VT_BOOL: hm_json_bool(j, gguf_arr_int(a, i) != 0); break;
        case GGUF_VT_UINT64: hm_json_uint(j, (uint64_t)gguf_arr_int(a, i)); break;
        default: hm_json_int(j, gguf_arr_int(a, i)); break;
        }
    }
    hm_json_arr_end(j);
}

static void json_kv(hm_json *j, const gguf_ctx *c, int64_t i) {
    gguf_vtype t = gguf_kv_type(c, i);
    hm_json_obj_begin(j);
    hm_json_key(j, "key");
    hm_json_str(j, gguf_kv_key(c, i));
    hm_json_key(j, "type");
    hm_json_str(j, gguf_vtype_name(t));
    int64_t iv;
    uint64_t uv;
    double dv;
    bool bv;
    gguf_str sv;
    gguf_arr av;
    if (t == GGUF_VT_ARRAY && gguf_kv_arr(c, i, &av, NULL) == HM_OK) {
        hm_json_key(j, "elem_type");
        hm_json_str(j, gguf_vtype_name(av.type));
        hm_json_key(j, "n");
        hm_json_uint(j, av.n);
        hm_json_key(j, "value");
        json_arr_values(j, &av);
        if (av.n > JSON_ARR_MAX) {
            hm_json_key(j, "truncated");
            hm_json_bool(j, true);
        }
    } else {
        hm_json_key(j, "value");
        if (t == GGUF_VT_STRING && gguf_kv_str(c, i, &sv, NULL) == HM_OK) hm_json_strn(j, sv.data, (size_t)sv.len);
        else if (t == GGUF_VT_BOOL && gguf_kv_bool(c, i, &bv, NULL) == HM_OK) hm_json_bool(j, bv);
        else if (t == GGUF_VT_FLOAT32 && gguf_kv_float(c, i, &dv, NULL) == HM_OK) hm_json_float(j, (float)dv);
        else if (gguf_kv_float(c, i, &dv, NULL) == HM_OK) hm_json_double(j, dv);
        else if (gguf_kv_uint(c, i, &uv, NULL) == HM_OK) hm_json_uint(j, uv);
        else if (gguf_kv_int(c, i, &iv, NULL) == HM_OK) hm_json_int(j, iv);
        else hm_json_null(j);
    }
    hm_json_obj_end(j);
}

static void json_key_uint(hm_json *j, const char *k, uint64_t v) {
    hm_json_key(j, k);
    hm_json_uint(j, v);
}

int inspect_print_json(const char *path, const inspect_summary *s) {
    const gguf_ctx *c = s->ctx;
    hm_json j;
    hm_json_init_file(&j, stdout, true);
    hm_json_obj_begin(&j);
    hm_json_key(&j, "file");
    hm_json_str(&j, path);
    json_key_uint(&j, "version", gguf_version(c));
    json_key_uint(&j, "alignment", gguf_alignment(c));
    json_key_uint(&j, "file_size", gguf_file_size(c));
    json_key_uint(&j, "data_offset", gguf_data_offset(c));
    hm_json_key(&j, "metadata");
    hm_json_arr_begin(&j);
    for (int64_t i = 0; i < gguf_kv_count(c); i++) json_kv(&j, c, i);
    hm_json_arr_end(&j);
    json_key_uint(&j, "tensor_count", (uint64_t)gguf_tensor_count(c));
    json_key_uint(&j, "tensor_bytes", s->total_bytes);
    hm_json_key(&j, "categories");
    hm_json_obj_begin(&j);
    for (int k = 0; k < INSPECT_CAT_COUNT; k++) {
        hm_json_key(&j, inspect_category_name((inspect_category)k));
        hm_json_obj_begin(&j);
        json_key_uint(&j, "tensors", (uint64_t)s->cat_tensors[k]);
        json_key_uint(&j, "bytes", s->cat_bytes[k]);
        hm_json_obj_end(&j);
    }
    hm_json_obj_end(&j);
    hm_json_key(&j, "experts");
    hm_json_obj_begin(&j);
    json_key_uint(&j, "moe_layers", (uint64_t)s->n_layers);
    hm_json_key(&j, "uniform");
    hm_json_bool(&j, s->n_layers > 0 && s->uniform);
    if (s->n_layers && s->uniform) {
        json_key_uint(&j, "n_expert", (uint64_t)s->layers[0].n_expert);
        json_key_uint(&j, "bytes_per_expert", s->layers[0].bytes_per_expert);
    }
    hm_json_key(&j, "layers");
    hm_json_arr_begin(&j);
    for (int64_t k = 0; k < s->n_layers; k++) {
        hm_json_obj_begin(&j);
        json_key_uint(&j, "layer", (uint64_t)s->layers[k].layer);
        json_key_uint(&j, "n_expert", (uint64_t)s->layers[k].n_expert);
        json_key_uint(&j, "bytes_per_expert", s->layers[k].bytes_per_expert);
        hm_json_obj_end(&j);
    }
    hm_json_arr_end(&j);
    hm_json_obj_end(&j);
    uint64_t routed = s->cat_bytes[INSPECT_EXPERTS];
    hm_json_key(&j, "tiers");
    hm_json_obj_begin(&j);
    hm_json_key(&j, "all_gpu");
    hm_json_obj_begin(&j);
    json_key_uint(&j, "vram", s->total_bytes);
    json_key_uint(&j, "host_ram", 0);
    hm_json_obj_end(&j);
    hm_json_key(&j, "experts_in_ram");
    hm_json_obj_begin(&j);
    json_key_uint(&j, "vram", s->total_bytes - routed);
    json_key_uint(&j, "host_ram", routed);
    hm_json_obj_end(&j);
    hm_json_obj_end(&j);
    hm_json_key(&j, "tensors");
    hm_json_arr_begin(&j);
    for (int64_t i = 0; i < gguf_tensor_count(c); i++) {
        const gguf_tensor *t = gguf_tensor_at(c, i);
        hm_json_obj_begin(&j);
        hm_json_key(&j, "name");
        hm_json_str(&j, t->name);
        hm_json_key(&j, "type");
        hm_json_str(&j, hm_type_name(t->type));
        hm_json_key(&j, "shape");
        hm_json_arr_begin(&j);
        for (uint32_t d = 0; d < t->n_dims; d++) hm_json_int(&j, t->ne[d]);
        hm_json_arr_end(&j);
        json_key_uint(&j, "bytes", t->size);
        json_key_uint(&j, "offset", t->offset);
        hm_json_key(&j, "category");
        hm_json_str(&j, inspect_category_name(s->cat[i]));
        hm_json_obj_end(&j);
    }
    hm_json_arr_end(&j);
    hm_json_obj_end(&j);
    hm_error err;
    hm_status st = hm_json_finish(&j, &err);
    hm_json_free(&j);
    if (st == HM_OK && (fputc('\n', stdout) == EOF || fflush(stdout) != 0)) st = HM_ERR_IO;
    if (st) fprintf(stderr, "hotmoe inspect: writing the report failed: %s\n", err.msg);
    return st ? 1 : 0;
}
