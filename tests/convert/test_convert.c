/* test_convert.c - `hotmoe convert` against `hotmoe forge`: every tiny preset's f32 HF twin
 * converts, for every type mix, to the GGUF forge writes for that mix (every tensor's name,
 * type, shape and bytes; every metadata value), and bad checkpoints fail naming the culprit.
 *
 * Keys allowed to differ: general.source.forge (forge only). general.name is passed with
 * --name (convert's default is the folder name). */
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/convert.h"
#include "forge/forge_test_util.h"
#include "harness.h"
#include "quant/fp16.h"

static bool kv_equal(const gguf_ctx *a, int64_t ia, const gguf_ctx *b, int64_t ib, char *why,
                     size_t cap) {
    gguf_vtype ta = gguf_kv_type(a, ia), tb = gguf_kv_type(b, ib);
    if (ta != tb) {
        snprintf(why, cap, "type %s vs %s", gguf_vtype_name(ta), gguf_vtype_name(tb));
        return false;
    }
    hm_error e;
    if (ta == GGUF_VT_STRING) {
        gguf_str x, y;
        gguf_kv_str(a, ia, &x, &e);
        gguf_kv_str(b, ib, &y, &e);
        if (x.len != y.len || memcmp(x.data, y.data, x.len)) {
            snprintf(why, cap, "string differs");
            return false;
        }
        return true;
    }
    if (ta == GGUF_VT_ARRAY) {
        gguf_arr x, y;
        gguf_kv_arr(a, ia, &x, &e);
        gguf_kv_arr(b, ib, &y, &e);
        if (x.type != y.type || x.n != y.n) {
            snprintf(why, cap, "array type/length %llu vs %llu", (unsigned long long)x.n,
                     (unsigned long long)y.n);
            return false;
        }
        for (uint64_t i = 0; i < x.n; i++) {
            bool same;
            if (x.type == GGUF_VT_STRING) {
                gguf_str s = gguf_arr_str(&x, i), t = gguf_arr_str(&y, i);
                same = s.len == t.len && !memcmp(s.data, t.data, s.len);
            } else if (x.type == GGUF_VT_FLOAT32 || x.type == GGUF_VT_FLOAT64) {
                double u = gguf_arr_float(&x, i), v = gguf_arr_float(&y, i);
                same = memcmp(&u, &v, sizeof(u)) == 0;
            } else {
                same = gguf_arr_int(&x, i) == gguf_arr_int(&y, i);
            }
            if (!same) {
                snprintf(why, cap, "element %llu differs", (unsigned long long)i);
                return false;
            }
        }
        return true;
    }
    if (ta == GGUF_VT_FLOAT32 || ta == GGUF_VT_FLOAT64) {
        double u, v;
        gguf_kv_float(a, ia, &u, &e);
        gguf_kv_float(b, ib, &v, &e);
        if (memcmp(&u, &v, sizeof(u))) {
            snprintf(why, cap, "%.9g vs %.9g", u, v);
            return false;
        }
        return true;
    }
    if (ta == GGUF_VT_BOOL) {
        bool u, v;
        gguf_kv_bool(a, ia, &u, &e);
        gguf_kv_bool(b, ib, &v, &e);
        if (u != v) {
            snprintf(why, cap, "%d vs %d", u, v);
            return false;
        }
        return true;
    }
    int64_t u, v;
    gguf_kv_int(a, ia, &u, &e);
    gguf_kv_int(b, ib, &v, &e);
    if (u != v) {
        snprintf(why, cap, "%lld vs %lld", (long long)u, (long long)v);
        return false;
    }
    return true;
}

/* number of differences between forge's file and convert's (only_type: compare only tensors
 * of that ggml type, -1 all; metadata: compare keys) */
static int compare_gguf(const char *ref_path, const char *out_path, int only_type, bool metadata) {
    gguf_ctx *a = NULL, *b = NULL;
    hm_error e;
    if (gguf_open(ref_path, &a, &e) != HM_OK || gguf_open(out_path, &b, &e) != HM_OK) {
        fprintf(stderr, "open: %s\n", e.msg);
        gguf_close(a);
        return 1;
    }
    int bad = 0;
    char why[128];
    for (int64_t i = 0; metadata && i < gguf_kv_count(a); i++) {
        const char *k = gguf_kv_key(a, i);
        if (!strcmp(k, "general.source.forge")) continue;
        int64_t j = gguf_find_key(b, k);
        if (j < 0) {
            fprintf(stderr, "%s: key %s missing\n", out_path, k);
            bad++;
            continue;
        }
        if (!kv_equal(a, i, b, j, why, sizeof(why))) {
            fprintf(stderr, "%s: key %s: %s\n", out_path, k, why);
            bad++;
        }
    }
    for (int64_t j = 0; metadata && j < gguf_kv_count(b); j++)
        if (gguf_find_key(a, gguf_kv_key(b, j)) < 0) {
            fprintf(stderr, "%s: extra key %s\n", out_path, gguf_kv_key(b, j));
            bad++;
        }
    if (gguf_tensor_count(a) != gguf_tensor_count(b)) {
        fprintf(stderr, "%s: tensor count differs\n", out_path);
        bad++;
    }
    for (int64_t i = 0; i < gguf_tensor_count(a) && i < gguf_tensor_count(b); i++) {
        const gguf_tensor *x = gguf_tensor_at(a, i), *y = gguf_tensor_at(b, i);
        if (only_type >= 0 && x->type != (uint32_t)only_type) continue;
        if (strcmp(x->name, y->name) || x->type != y->type || x->n_dims != y->n_dims ||
            memcmp(x->ne, y->ne, sizeof(x->ne)) || x->size != y->size) {
            fprintf(stderr, "%s: tensor %s: name/type/shape differs from %s\n", out_path, x->name,
                    y->name);
            bad++;
        } else if (memcmp(x->data, y->data, x->size)) {
            fprintf(stderr, "%s: tensor %s: bytes differ\n", out_path, x->name);
            bad++;
        }
    }
    gguf_close(a);
    gguf_close(b);
    return bad;
}

static hm_status run_convert(const char *dir, const char *out, forge_mix mix, const char *name,
                             hm_error *err) {
    convert_job job = {.hf_dir = dir, .out_path = out, .mix = mix, .name = name, .n_threads = 2};
    convert_result res;
    return convert_run(&job, &res, err);
}

/* the presets convert takes: every tiny one */
static bool converts(const forge_preset *p) { return p->tiny; }

/* ft_forge, the twin with qwen35moe's MTP block as mtp.* when mtp (the published form) */
static hm_status cv_forge(const forge_preset *p, forge_mix mix, const char *tag, bool mtp,
                          char *gguf_path, size_t cap, char *hf_dir, size_t hcap) {
    char name[256];
    snprintf(name, sizeof(name), "%s.gguf", tag);
    ft_path(gguf_path, cap, name);
    snprintf(name, sizeof(name), "%s-hf", tag);
    ft_path(hf_dir, hcap, name);
    forge_job job = {.preset = p, .mix = mix, .out_path = gguf_path, .hf_dir = hf_dir,
                     .hf_mtp = mtp, .n_threads = 2};
    job.gen.seed = 42;
    forge_result res;
    hm_error err;
    hm_status st = forge_write_gguf(&job, &res, &err);
    if (st == HM_OK) st = forge_write_hf(&job, &err);
    if (st != HM_OK) fprintf(stderr, "forge %s: %s\n", tag, err.msg);
    return st;
}

/* every tiny preset, every mix, from the f32 twin (qwen35moe's with its MTP block) */
static void test_equal_forge(void) {
    for (int pi = 0; pi < forge_preset_count(); pi++) {
        const forge_preset *p = forge_preset_at(pi);
        if (!converts(p)) continue;
        char g32[512], hf[512], tag[128];
        snprintf(tag, sizeof(tag), "cv-%s-f32", p->name);
        HM_REQUIRE(cv_forge(p, FORGE_MIX_F32, tag, p->arch == FORGE_ARCH_QWEN35MOE, g32,
                            sizeof(g32), hf, sizeof(hf)) == HM_OK);
        for (int m = 0; m < FORGE_MIX_COUNT; m++) {
            char ref[512], out[512], unused[8];
            snprintf(tag, sizeof(tag), "cv-%s-%s", p->name, forge_mix_name((forge_mix)m));
            if (m == FORGE_MIX_F32)
                snprintf(ref, sizeof(ref), "%s", g32);
            else
                HM_REQUIRE(ft_forge(p, (forge_mix)m, 42, tag, false, 2, ref, sizeof(ref), unused,
                                    sizeof(unused)) == HM_OK);
            char name[300];
            snprintf(name, sizeof(name), "%s-conv.gguf", tag);
            ft_path(out, sizeof(out), name);
            hm_error err;
            hm_status st = run_convert(hf, out, (forge_mix)m, p->model_name, &err);
            HM_CHECK_MSG(st == HM_OK, "%s: %s", tag, err.msg);
            if (st != HM_OK) continue;
            int bad = compare_gguf(ref, out, -1, true);
            HM_CHECK_MSG(bad == 0, "%s: %d differences", tag, bad);
            if (m != FORGE_MIX_F32) unlink(ref);
            unlink(out);
        }
    }
}

/* the comparison sees a difference: without --name, general.name is the folder's name */
static void test_compare_detects(void) {
    const forge_preset *p = forge_preset_find("tiny-qwen3moe");
    char g32[512], hf[512], out[512];
    HM_REQUIRE(ft_forge(p, FORGE_MIX_F32, 42, "cv-detect", true, 2, g32, sizeof(g32), hf,
                        sizeof(hf)) == HM_OK);
    ft_path(out, sizeof(out), "cv-detect-conv.gguf");
    hm_error err;
    HM_REQUIRE(run_convert(hf, out, FORGE_MIX_F32, NULL, &err) == HM_OK);
    HM_CHECK(compare_gguf(g32, out, -1, true) == 1);
    gguf_ctx *g = NULL;
    HM_REQUIRE(gguf_open(out, &g, &err) == HM_OK);
    gguf_str s;
    HM_CHECK(gguf_get_str(g, "general.name", &s, &err) == HM_OK && s.len == 12 &&
             !memcmp(s.data, "cv-detect-hf", 12));
    gguf_close(g);
    /* a different seed changes every weight tensor */
    char g7[512], unused[8];
    HM_REQUIRE(ft_forge(p, FORGE_MIX_F32, 7, "cv-detect7", false, 2, g7, sizeof(g7), unused,
                        sizeof(unused)) == HM_OK);
    HM_CHECK(compare_gguf(g7, out, -1, false) > 10);
}

/* ---- checkpoints edited on disk ---- */

static bool spit(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(d, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* path's safetensors header, parsed (NULL when unreadable), with the file's bytes in *d (*n of
 * them; the data start at *d + 8 + *hl) */
static json_t *st_read(const char *path, char **d, size_t *n, uint64_t *hl) {
    *d = (char *)ft_read_file(path, n);
    *hl = 0;
    if (!*d || *n < 8) return NULL;
    for (int k = 0; k < 8; k++) *hl |= (uint64_t)(uint8_t)(*d)[k] << (8 * k);
    return json_loadb(*d + 8, (size_t)*hl, 0, NULL);
}

/* a zeroed safetensors file of header h (padded with spaces to a multiple of 8) and data_bytes
 * of data: *total bytes, the data from *at (NULL when out of memory) */
static uint8_t *st_begin(const char *h, size_t data_bytes, size_t *total, size_t *at) {
    const size_t l = strlen(h), pad = (8 - l % 8) % 8;
    *at = 8 + l + pad;
    *total = *at + data_bytes;
    uint8_t *o = calloc(1, *total);
    if (!o) return NULL;
    for (int k = 0; k < 8; k++) o[k] = (uint8_t)((uint64_t)(l + pad) >> (8 * k));
    memcpy(o + 8, h, l);
    memset(o + 8 + l, ' ', pad);
    return o;
}

static const char *const k_files[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                      "model.safetensors"};

/* copies the twin src into HOTMOE_TMP/name (fresh), without the files whose bit is in skip */
static void copy_twin(const char *src, const char *name, unsigned skip, char *dst, size_t cap) {
    ft_path(dst, cap, name);
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dst);
    if (system(cmd) != 0) return;
    mkdir(dst, 0777);
    for (int i = 0; i < 4; i++) {
        if (skip & (1u << i)) continue;
        char a[1024], b[1024];
        size_t n;
        snprintf(a, sizeof(a), "%s/%s", src, k_files[i]);
        snprintf(b, sizeof(b), "%s/%s", dst, k_files[i]);
        char *d = (char *)ft_read_file(a, &n);
        if (d) spit(b, d, n);
        free(d);
    }
}

/* replaces the first occurrence of what by with (same length) in dir/file */
static bool patch(const char *dir, const char *file, const char *what, const char *with) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    size_t n;
    char *d = (char *)ft_read_file(path, &n);
    if (!d) return false;
    char *at = NULL;
    for (size_t i = 0; !at && i + strlen(what) <= n; i++)
        if (!memcmp(d + i, what, strlen(what))) at = d + i;
    bool ok = at && strlen(what) == strlen(with);
    if (ok) {
        memcpy(at, with, strlen(with));
        ok = spit(path, d, n);
    }
    free(d);
    return ok;
}

static bool truncate_file(const char *dir, const char *file, size_t cut) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    struct stat sb;
    return stat(path, &sb) == 0 && truncate(path, sb.st_size - (off_t)cut) == 0;
}

static void expect_error(const char *dir, const char *what, const char *s1, const char *s2) {
    char out[512];
    ft_path(out, sizeof(out), "cv-err.gguf");
    unlink(out);
    hm_error err = {0};
    hm_status st = run_convert(dir, out, FORGE_MIX_Q8_0, NULL, &err);
    HM_CHECK_MSG(st != HM_OK, "%s: converted", what);
    HM_CHECK_MSG(strstr(err.msg, s1) && (!s2 || strstr(err.msg, s2)),
                 "%s: message '%s' lacks '%s'/'%s'", what, err.msg, s1, s2 ? s2 : "");
    HM_CHECK_MSG(access(out, F_OK) != 0, "%s: output left behind", what);
}

static void test_errors(void) {
    const forge_preset *p = forge_preset_find("tiny-qwen3moe");
    char g32[512], hf[512], d[512];
    HM_REQUIRE(ft_forge(p, FORGE_MIX_F32, 42, "cv-errsrc", true, 2, g32, sizeof(g32), hf,
                        sizeof(hf)) == HM_OK);
    copy_twin(hf, "cv-e-noconfig", 1u, d, sizeof(d));
    expect_error(d, "missing config.json", "config.json", "missing");
    copy_twin(hf, "cv-e-arch", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "config.json", "\"Qwen3MoeForCausalLM\"", "\"LlamaForCausalLM000\""));
    expect_error(d, "unsupported architecture", "unsupported architecture LlamaForCausalLM000",
                 "MixtralForCausalLM, OlmoeForCausalLM");
    copy_twin(hf, "cv-e-missing", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "model.safetensors", "\"model.norm.weight\"", "\"model.norm.weighx\""));
    expect_error(d, "missing tensor", "missing tensor model.norm.weight", "[256]");
    copy_twin(hf, "cv-e-shape", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "config.json", "\"moe_intermediate_size\": 128",
                     "\"moe_intermediate_size\": 256"));
    expect_error(d, "wrong shape",
                 "model.layers.0.mlp.experts.0.gate_proj.weight has shape [128, 256]",
                 "implies [256, 256]");
    copy_twin(hf, "cv-e-dtype", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "model.safetensors", "\"dtype\":\"F32\"", "\"dtype\":\"I32\""));
    expect_error(d, "unsupported dtype", "dtype I32", "supported: F32, F16, BF16, F64");
    copy_twin(hf, "cv-e-trunc", 0, d, sizeof(d));
    HM_REQUIRE(truncate_file(d, "model.safetensors", 100));
    expect_error(d, "truncated safetensors", "model.safetensors: truncated: tensor lm_head.weight",
                 NULL);
    copy_twin(hf, "cv-e-json", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "model.safetensors", "\"data_offsets\":", "\"data_offsets\" "));
    expect_error(d, "malformed header", "model.safetensors: malformed JSON header", NULL);
    copy_twin(hf, "cv-e-shard", 0, d, sizeof(d));
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", d);
    const char *idx =
        "{\"metadata\": {}, \"weight_map\": {\"lm_head.weight\": \"model.safetensors\", "
        "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}";
    HM_REQUIRE(spit(path, idx, strlen(idx)));
    expect_error(d, "index names a missing shard", "names shard model-00002-of-00002.safetensors",
                 "No such file");
    copy_twin(hf, "cv-e-tok", 8u, d, sizeof(d)); /* no safetensors at all */
    expect_error(d, "no weights", "no model.safetensors", NULL);
}

/* rewrites dir/model.safetensors as n shards + model.safetensors.index.json, values as dtype
 * ("F32", "F16" or "BF16"); removes model.safetensors */
static bool reshard(const char *dir, int n_shards, const char *dtype) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    size_t n;
    uint64_t hl;
    char *d;
    json_t *hdr = st_read(path, &d, &n, &hl), *wm = json_object();
    if (!hdr) {
        free(d);
        json_decref(wm);
        return false;
    }
    const int es = !strcmp(dtype, "F32") ? 4 : 2;
    size_t count = json_object_size(hdr) - 1, idx = 0;
    json_t *shards[8];
    uint64_t off[8] = {0};
    for (int s = 0; s < n_shards; s++) shards[s] = json_object();
    const char *key;
    json_t *val;
    json_object_foreach(hdr, key, val) { /* pass 1: headers */
        if (!strcmp(key, "__metadata__")) continue;
        int s = (int)(idx++ * (size_t)n_shards / count);
        uint64_t b =
            (uint64_t)json_integer_value(json_array_get(json_object_get(val, "data_offsets"), 0));
        uint64_t e =
            (uint64_t)json_integer_value(json_array_get(json_object_get(val, "data_offsets"), 1));
        uint64_t nb = (e - b) / 4 * (uint64_t)es;
        json_object_set_new(shards[s], key,
                            json_pack("{s:s, s:O, s:[I, I]}", "dtype", dtype, "shape",
                                      json_object_get(val, "shape"), "data_offsets",
                                      (json_int_t)off[s], (json_int_t)(off[s] + nb)));
        off[s] += nb;
        char sn[64];
        snprintf(sn, sizeof(sn), "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        json_object_set_new(wm, key, json_string(sn));
    }
    bool ok = true;
    for (int s = 0; s < n_shards && ok; s++) {
        char *h = json_dumps(shards[s], JSON_COMPACT | JSON_PRESERVE_ORDER);
        size_t total, at;
        uint8_t *o = st_begin(h, off[s], &total, &at);
        if (!o) {
            free(h);
            ok = false;
            break;
        }
        json_object_foreach(shards[s], key, val) {
            json_t *src = json_object_get(hdr, key);
            uint64_t b = (uint64_t)json_integer_value(
                json_array_get(json_object_get(src, "data_offsets"), 0));
            uint64_t e = (uint64_t)json_integer_value(
                json_array_get(json_object_get(src, "data_offsets"), 1));
            uint64_t ob = (uint64_t)json_integer_value(
                json_array_get(json_object_get(val, "data_offsets"), 0));
            for (uint64_t i = 0; i < (e - b) / 4; i++) {
                float f;
                memcpy(&f, d + 8 + hl + b + i * 4, 4);
                uint16_t h16 =
                    es == 2 ? (!strcmp(dtype, "F16") ? hm_f32_to_fp16(f) : hm_f32_to_bf16(f)) : 0;
                memcpy(o + at + ob + i * (uint64_t)es, es == 4 ? (void *)&f : (void *)&h16,
                       (size_t)es);
            }
        }
        char sp[1024];
        snprintf(sp, sizeof(sp), "%s/model-%05d-of-%05d.safetensors", dir, s + 1, n_shards);
        ok = spit(sp, o, total);
        free(o);
        free(h);
    }
    json_t *index = json_pack("{s:{}, s:O}", "metadata", "weight_map", wm);
    char ip[1024];
    snprintf(ip, sizeof(ip), "%s/model.safetensors.index.json", dir);
    ok = ok && json_dump_file(index, ip, JSON_INDENT(2)) == 0;
    json_decref(index);
    json_decref(wm);
    json_decref(hdr);
    for (int s = 0; s < n_shards; s++) json_decref(shards[s]);
    free(d);
    return ok && unlink(path) == 0;
}

/* 3 shards + index, F32/F16/BF16: F32 gives forge's bytes; F16 gives forge's f16 tensors
 * (f32 -> f16 rounding is idempotent); BF16 gives the bf16-rounded values */
static void test_shards_dtypes(void) {
    const char *presets[2] = {"tiny-gpt-oss", "tiny-mixtral"};
    for (int pi = 0; pi < 2; pi++) {
        const forge_preset *p = forge_preset_find(presets[pi]);
        char g32[512], g16[512], hf[512], d[512], out[512], tag[128], unused[8];
        snprintf(tag, sizeof(tag), "cv-sh-%s", p->name);
        HM_REQUIRE(ft_forge(p, FORGE_MIX_F32, 42, tag, true, 2, g32, sizeof(g32), hf, sizeof(hf)) ==
                   HM_OK);
        snprintf(tag, sizeof(tag), "cv-sh-%s-f16", p->name);
        HM_REQUIRE(ft_forge(p, FORGE_MIX_F16, 42, tag, false, 2, g16, sizeof(g16), unused,
                            sizeof(unused)) == HM_OK);
        ft_path(out, sizeof(out), "cv-sh-out.gguf");
        hm_error err;
        copy_twin(hf, "cv-sh-f32", 0, d, sizeof(d));
        HM_REQUIRE(reshard(d, 3, "F32"));
        HM_CHECK_MSG(run_convert(d, out, FORGE_MIX_Q4_K_M, p->model_name, &err) == HM_OK, "%s",
                     err.msg);
        char gq[512];
        snprintf(tag, sizeof(tag), "cv-sh-%s-q4", p->name);
        HM_REQUIRE(ft_forge(p, FORGE_MIX_Q4_K_M, 42, tag, false, 2, gq, sizeof(gq), unused,
                            sizeof(unused)) == HM_OK);
        HM_CHECK(compare_gguf(gq, out, -1, true) == 0);
        copy_twin(hf, "cv-sh-f16", 0, d, sizeof(d));
        HM_REQUIRE(reshard(d, 2, "F16"));
        HM_CHECK_MSG(run_convert(d, out, FORGE_MIX_F16, p->model_name, &err) == HM_OK, "%s",
                     err.msg);
        HM_CHECK(compare_gguf(g16, out, 1 /* GGML F16 */, true) == 0);
        copy_twin(hf, "cv-sh-bf16", 0, d, sizeof(d));
        HM_REQUIRE(reshard(d, 3, "BF16"));
        HM_CHECK_MSG(run_convert(d, out, FORGE_MIX_F32, p->model_name, &err) == HM_OK, "%s",
                     err.msg);
        gguf_ctx *a = NULL, *b = NULL;
        HM_REQUIRE(gguf_open(g32, &a, &err) == HM_OK);
        HM_REQUIRE(gguf_open(out, &b, &err) == HM_OK);
        int64_t bad = 0;
        for (int64_t i = 0; i < gguf_tensor_count(a); i++) {
            const gguf_tensor *x = gguf_tensor_at(a, i), *y = gguf_tensor_at(b, i);
            for (uint64_t k = 0; k < x->size / 4; k++) {
                float u, v;
                memcpy(&u, (const uint8_t *)x->data + k * 4, 4);
                memcpy(&v, (const uint8_t *)y->data + k * 4, 4);
                float w = hm_bf16_to_f32(hm_f32_to_bf16(u));
                bad += memcmp(&v, &w, 4) != 0;
            }
        }
        HM_CHECK_MSG(bad == 0, "%s: %lld bf16 values differ", p->name, (long long)bad);
        gguf_close(a);
        gguf_close(b);
    }
}

/* a quantised twin (dequantised q8_0 values) converts back to forge's q8_0 bytes */
static void test_q8_twin(void) {
    for (int pi = 0; pi < forge_preset_count(); pi++) {
        const forge_preset *p = forge_preset_at(pi);
        if (!converts(p)) continue;
        char g[512], hf[512], out[512], tag[128];
        snprintf(tag, sizeof(tag), "cv-q8-%s", p->name);
        HM_REQUIRE(cv_forge(p, FORGE_MIX_Q8_0, tag, p->arch == FORGE_ARCH_QWEN35MOE, g, sizeof(g),
                            hf, sizeof(hf)) == HM_OK);
        ft_path(out, sizeof(out), "cv-q8-out.gguf");
        hm_error err;
        HM_CHECK_MSG(run_convert(hf, out, FORGE_MIX_Q8_0, p->model_name, &err) == HM_OK, "%s",
                     err.msg);
        int bad = compare_gguf(g, out, -1, true);
        HM_CHECK_MSG(bad == 0, "%s: %d differences", tag, bad);
    }
}

/* the config as transformers 5 saves it (num_local_experts, rope_parameters, and for a config
 * saved without its model no architectures, only model_type) converts to the same bytes; with
 * neither expert count the error names the field */
static void test_transformers5_config(void) {
    const char *presets[] = {"tiny-qwen3moe", "tiny-olmoe", "tiny-qwen2moe"};
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        const forge_preset *p = forge_preset_find(presets[i]);
        HM_REQUIRE(p);
        char g32[512], hf[512], d[512], tag[128], path[1024], out[512];
        snprintf(tag, sizeof(tag), "cv-v5-%s", p->name);
        HM_REQUIRE(ft_forge(p, FORGE_MIX_F32, 42, tag, true, 2, g32, sizeof(g32), hf,
                            sizeof(hf)) == HM_OK);
        snprintf(tag, sizeof(tag), "cv-v5-%s-edit", p->name);
        copy_twin(hf, tag, 0, d, sizeof(d));
        snprintf(path, sizeof(path), "%s/config.json", d);
        json_t *c = json_load_file(path, 0, NULL);
        HM_REQUIRE(c && json_object_get(c, "num_experts") && json_object_get(c, "rope_theta"));
        json_object_set(c, "num_local_experts", json_object_get(c, "num_experts"));
        json_object_del(c, "num_experts");
        json_t *rp = json_object();
        json_object_set(rp, "rope_theta", json_object_get(c, "rope_theta"));
        json_object_set_new(rp, "rope_type", json_string("default"));
        json_object_set_new(c, "rope_parameters", rp);
        json_object_del(c, "rope_theta");
        json_object_del(c, "architectures");
        HM_REQUIRE(json_dump_file(c, path, JSON_INDENT(2)) == 0);
        ft_path(out, sizeof(out), "cv-v5-out.gguf");
        hm_error err;
        HM_CHECK_MSG(run_convert(d, out, FORGE_MIX_F32, p->model_name, &err) == HM_OK, "%s: %s",
                     p->name, err.msg);
        int bad = compare_gguf(g32, out, -1, true);
        HM_CHECK_MSG(bad == 0, "%s: %d differences", p->name, bad);
        json_object_del(c, "num_local_experts");
        HM_REQUIRE(json_dump_file(c, path, JSON_INDENT(2)) == 0);
        json_decref(c);
        expect_error(d, "no expert count", "config.json: num_experts: missing", NULL);
    }
}

/* rewrites dir's model.safetensors with every "model.X" named "model.language_model.X" and
 * config.json as the published multimodal config (the text model's fields under text_config) */
static bool to_multimodal(const char *dir, const char *cls, const char *model_type) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    size_t n;
    uint64_t hl;
    char *d;
    json_t *hdr = st_read(path, &d, &n, &hl), *nh = json_object();
    if (!hdr) {
        free(d);
        json_decref(nh);
        return false;
    }
    const char *key;
    json_t *val;
    json_object_foreach(hdr, key, val) {
        char name[256];
        if (!strncmp(key, "model.", 6)) snprintf(name, sizeof(name), "model.language_model.%s", key + 6);
        else snprintf(name, sizeof(name), "%s", key);
        json_object_set(nh, name, val);
    }
    char *h = json_dumps(nh, JSON_COMPACT);
    size_t total, at;
    uint8_t *o = st_begin(h, n - 8 - hl, &total, &at);
    if (o) memcpy(o + at, d + 8 + hl, n - 8 - hl);
    bool ok = o && spit(path, o, total);
    free(o);
    free(h);
    free(d);
    json_decref(hdr);
    json_decref(nh);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_t *tc = json_load_file(path, 0, NULL);
    json_t *c = json_pack("{s:[s], s:s, s:O, s:b}", "architectures", cls, "model_type",
                          model_type, "text_config", tc, "tie_word_embeddings", 0);
    json_object_del(tc, "architectures");
    ok = ok && tc && c && json_dump_file(c, path, JSON_INDENT(2)) == 0;
    json_decref(c);
    json_decref(tc);
    return ok;
}

/* the hybrids beyond the round trip: a qwen35moe checkpoint without mtp.* (as transformers
 * saves it) gives forge's GGUF without the MTP block and says so; the published multimodal
 * layout (text_config, model.language_model.*) gives forge's bytes */
static void test_hybrid_mtp_layouts(void) {
    const forge_preset *p = forge_preset_find("tiny-qwen35moe");
    HM_REQUIRE(p && p->n_nextn == 1);
    forge_preset p0 = *p;
    p0.n_nextn = 0;
    char g[512], g0[512], hf[512], hf0[512], d[512], out[512];
    HM_REQUIRE(cv_forge(p, FORGE_MIX_Q8_0, "cv-mtp", false, g, sizeof(g), hf, sizeof(hf)) == HM_OK);
    HM_REQUIRE(cv_forge(&p0, FORGE_MIX_Q8_0, "cv-mtp0", false, g0, sizeof(g0), hf0, sizeof(hf0)) ==
               HM_OK);
    ft_path(out, sizeof(out), "cv-mtp-out.gguf");
    convert_job job = {.hf_dir = hf, .out_path = out, .mix = FORGE_MIX_Q8_0,
                       .name = p->model_name, .n_threads = 2};
    convert_result res;
    hm_error err;
    HM_REQUIRE(convert_run(&job, &res, &err) == HM_OK);
    HM_CHECK_MSG(strstr(res.note, "no mtp.* tensors") && strstr(res.note, "no MTP block"), "note '%s'",
                 res.note);
    int bad = compare_gguf(g0, out, -1, true);
    HM_CHECK_MSG(bad == 0, "no mtp.*: %d differences from forge's GGUF without the MTP block", bad);
    /* with the block: no note */
    char gm[512], hfm[512];
    HM_REQUIRE(cv_forge(p, FORGE_MIX_Q8_0, "cv-mtp1", true, gm, sizeof(gm), hfm, sizeof(hfm)) ==
               HM_OK);
    job.hf_dir = hfm;
    HM_REQUIRE(convert_run(&job, &res, &err) == HM_OK);
    HM_CHECK(res.note[0] == 0);
    HM_CHECK(compare_gguf(gm, out, -1, true) == 0);
    /* the multimodal layout */
    copy_twin(hfm, "cv-mtp-mm", 0, d, sizeof(d));
    HM_REQUIRE(to_multimodal(d, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"));
    job.hf_dir = d;
    HM_CHECK_MSG(convert_run(&job, &res, &err) == HM_OK, "multimodal: %s", err.msg);
    bad = compare_gguf(gm, out, -1, true);
    HM_CHECK_MSG(bad == 0, "multimodal: %d differences", bad);
    unlink(out);
}

/* sets config.json's key (in text_config when nested) to the integer v */
static bool set_config_int(const char *dir, const char *key, long long v) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_t *c = json_load_file(path, 0, NULL);
    if (!c) return false;
    json_object_set_new(c, key, json_integer(v));
    bool ok = json_dump_file(c, path, JSON_INDENT(2)) == 0;
    json_decref(c);
    return ok;
}

static void test_hybrid_errors(void) {
    char g[512], hf[512], d[512];
    HM_REQUIRE(cv_forge(forge_preset_find("tiny-qwen3next"), FORGE_MIX_F32, "cv-he-next", false, g,
                        sizeof(g), hf, sizeof(hf)) == HM_OK);
    copy_twin(hf, "cv-he-alog", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "model.safetensors", "\"model.layers.1.linear_attn.A_log\"",
                     "\"model.layers.1.linear_attn.A_loh\""));
    expect_error(d, "missing ssm tensor", "missing tensor model.layers.1.linear_attn.A_log", "[4]");
    copy_twin(hf, "cv-he-conv", 0, d, sizeof(d));
    HM_REQUIRE(set_config_int(d, "linear_conv_kernel_dim", 5));
    expect_error(d, "wrong conv1d shape",
                 "model.layers.0.linear_attn.conv1d.weight has shape [128, 1, 4]",
                 "implies [128, 1, 5]");
    copy_twin(hf, "cv-he-qkvz", 0, d, sizeof(d));
    HM_REQUIRE(set_config_int(d, "linear_value_head_dim", 32));
    expect_error(d, "wrong in_proj_qkvz shape", "model.layers.0.linear_attn.in_proj_qkvz.weight",
                 "has shape [192, 64], config.json implies [320, 64]");
    copy_twin(hf, "cv-he-key", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "config.json", "\"linear_num_key_heads\"", "\"linear_num_key_headz\""));
    expect_error(d, "missing config key", "config.json: linear_num_key_heads: missing", NULL);
    copy_twin(hf, "cv-he-fai", 0, d, sizeof(d));
    HM_REQUIRE(set_config_int(d, "full_attention_interval", 3));
    expect_error(d, "other layer pattern", "full_attention_interval: 3 unsupported", NULL);

    HM_REQUIRE(cv_forge(forge_preset_find("tiny-qwen35moe"), FORGE_MIX_F32, "cv-he-35", true, g,
                        sizeof(g), hf, sizeof(hf)) == HM_OK);
    copy_twin(hf, "cv-he-fc", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "model.safetensors", "\"mtp.fc.weight\"", "\"mtp.fc.weighx\""));
    expect_error(d, "missing MTP tensor", "missing tensor mtp.fc.weight", "[64, 128]");
    copy_twin(hf, "cv-he-beta", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "model.safetensors", "\"model.layers.2.linear_attn.in_proj_b.weight\"",
                     "\"model.layers.2.linear_attn.in_proj_b.weighx\""));
    expect_error(d, "missing in_proj_b", "missing tensor model.layers.2.linear_attn.in_proj_b.weight",
                 "[4, 64]");
    copy_twin(hf, "cv-he-gu", 0, d, sizeof(d));
    HM_REQUIRE(set_config_int(d, "moe_intermediate_size", 64));
    expect_error(d, "wrong gate_up_proj shape",
                 "model.layers.0.mlp.experts.gate_up_proj has shape [8, 64, 64]",
                 "implies [8, 128, 64]");
}

/* gemma4 beyond the round trip: the published multimodal layout (Gemma4ForConditionalGeneration
 * with text_config, model.language_model.*) gives forge's bytes; a missing tensor is named with
 * its shape; the config's variants hotmoe does not load and other layer patterns are refused */
static void test_gemma4(void) {
    char g[512], hf[512], d[512], out[512];
    HM_REQUIRE(cv_forge(forge_preset_find("tiny-gemma4moe"), FORGE_MIX_Q8_0, "cv-g4", false, g,
                        sizeof(g), hf, sizeof(hf)) == HM_OK);
    copy_twin(hf, "cv-g4-mm", 0, d, sizeof(d));
    HM_REQUIRE(to_multimodal(d, "Gemma4ForConditionalGeneration", "gemma4"));
    ft_path(out, sizeof(out), "cv-g4-out.gguf");
    hm_error err;
    HM_CHECK_MSG(run_convert(d, out, FORGE_MIX_Q8_0, "tiny-gemma4moe", &err) == HM_OK,
                 "multimodal: %s", err.msg);
    int bad = compare_gguf(g, out, -1, true);
    HM_CHECK_MSG(bad == 0, "gemma4 multimodal: %d differences", bad);
    unlink(out);
    copy_twin(hf, "cv-g4-scale", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "model.safetensors", "\"model.layers.1.router.per_expert_scale\"",
                     "\"model.layers.1.router.per_expert_scalx\""));
    expect_error(d, "missing per_expert_scale",
                 "missing tensor model.layers.1.router.per_expert_scale", "[16]");
    copy_twin(hf, "cv-g4-gu", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "model.safetensors", "\"model.layers.3.experts.gate_up_proj\"",
                     "\"model.layers.3.experts.gate_up_proq\""));
    expect_error(d, "missing gate_up_proj", "missing tensor model.layers.3.experts.gate_up_proj",
                 "[16, 64, 128]");
    copy_twin(hf, "cv-g4-kv", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "config.json", "\"attention_k_eq_v\": true", "\"attention_k_eq_v\": 1.00"));
    expect_error(d, "attention_k_eq_v not a boolean", "attention_k_eq_v: must be a boolean", NULL);
    copy_twin(hf, "cv-g4-kv2", 0, d, sizeof(d));
    HM_REQUIRE(patch(d, "config.json", "\"attention_k_eq_v\": true", "\"attention_k_eq_v\":false"));
    expect_error(d, "own V", "attention_k_eq_v: false unsupported", NULL);
    copy_twin(hf, "cv-g4-lt", 0, d, sizeof(d));
    char path[1024];
    snprintf(path, sizeof(path), "%s/config.json", d);
    json_t *c = json_load_file(path, 0, NULL);
    HM_REQUIRE(c);
    json_object_set_new(c, "layer_types",
                        json_pack("[s,s,s,s]", "sliding_attention", "sliding_attention",
                                  "full_attention", "full_attention"));
    HM_REQUIRE(json_dump_file(c, path, JSON_INDENT(2)) == 0);
    json_decref(c);
    expect_error(d, "other layer pattern", "layer_types[3]: full_attention unsupported",
                 "period 3");
}

HM_TEST_MAIN(test_equal_forge, test_compare_detects, test_errors, test_shards_dtypes, test_q8_twin,
             test_transformers5_config, test_hybrid_mtp_layouts, test_hybrid_errors, test_gemma4)
