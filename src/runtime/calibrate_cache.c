/* calibrate_cache.c - the calibration's keys and its cache file (calibrate.h).
 *
 * DESIGN: the cache is one small JSON file per (machine, model) pair, named by a 64-bit FNV-1a
 * hash of the two keys and holding the keys themselves, so a hash collision reads as "another
 * machine or model" (HM_ERR_STATE), never as a wrong hit. Only measurements are stored (times,
 * bytes, bandwidths); the per-byte rates are derived again on reading, so the file cannot
 * disagree with itself. The reader checks every field (type, range, finiteness) and names the
 * first problem; the writer goes through a temporary file and a rename, so a reader never sees a
 * half-written file.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/json.h"
#include "cuda/cuda_device.h"
#include "quant/qtypes.h"
#include "runtime/calibrate_internal.h"

#define CALIB_FORMAT "hotmoe-calibration"

/* ---- model facts ---- */

static const hm_tensor *layer_matrix(const hm_layer *L, int i) {
    return i == 0 ? &L->gate_exps : i == 1 ? &L->up_exps : &L->down_exps;
}

int calib_model_types(const hm_model *m, uint32_t *types, int max) {
    const hm_hparams *hp = hm_model_hparams(m);
    int n = 0;
    for (int il = 0; il < hp->n_layer; il++)
        for (int i = 0; i < 3; i++) {
            const hm_tensor *t = layer_matrix(hm_model_layer(m, il), i);
            if (!t->data) continue;
            int seen = 0;
            for (int j = 0; j < n; j++) seen |= types[j] == t->type;
            if (!seen && n < max) types[n++] = t->type;
        }
    return n;
}

bool calib_type_tensor(const hm_model *m, uint32_t type, const hm_tensor **out) {
    const hm_hparams *hp = hm_model_hparams(m);
    for (int il = 0; il < hp->n_layer; il++)
        for (int i = 0; i < 3; i++) {
            const hm_tensor *t = layer_matrix(hm_model_layer(m, il), i);
            if (t->data && t->type == type) {
                *out = t;
                return true;
            }
        }
    return false;
}

void calib_type_derive(calib_type *t) {
    const double b = (double)t->bytes, B = (double)t->batch;
    double tok = (t->tb_s - t->t1_s) / ((B - 1) * b);
    const double floor = 1e-3 * t->t1_s / b;
    if (!(tok >= floor)) tok = floor;
    double fixed = t->t1_s / b - tok;
    t->tok_s_per_byte = tok;
    t->fixed_s_per_byte = fixed > 0 ? fixed : 0;
}

/* ---- keys ---- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
static const uint64_t k_fnv0 = 0xcbf29ce484222325ull;

static void cpu_model_name(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) && strncmp(line, "Hardware", 8)) continue;
        const char *c = strchr(line, ':');
        if (!c) continue;
        c++;
        while (*c == ' ' || *c == '\t') c++;
        size_t len = strcspn(c, "\r\n");
        while (len > 0 && (c[len - 1] == ' ' || c[len - 1] == '\t')) len--;
        if (len == 0) continue;
        snprintf(buf, n, "%.*s", (int)len, c);
        break;
    }
    fclose(f);
}

void calib_machine_key(int device, int n_threads, char *buf, size_t n) {
    char cpu[256], gpu[256] = "none";
    cpu_model_name(cpu, sizeof(cpu));
    if (device >= 0) {
        cuda_device_info d[16];
        int nd = 0;
        hm_error e;
        if (cuda_device_query(d, 16, &nd, &e) == HM_OK && device < nd)
            snprintf(gpu, sizeof(gpu), "%s", d[device].name);
    }
    snprintf(buf, n, "cpu=%s;cpus=%d;threads=%d;gpu=%s", cpu, hm_cpu_count_allowed(), n_threads,
             gpu);
}

void calib_model_key(const hm_model *m, char *buf, size_t n) {
    const gguf_ctx *g = hm_model_gguf(m);
    uint64_t h = k_fnv0;
    for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        h = fnv(h, t->name, strlen(t->name) + 1);
        h = fnv(h, &t->type, sizeof(t->type));
        h = fnv(h, &t->n_dims, sizeof(t->n_dims));
        h = fnv(h, t->ne, sizeof(t->ne));
        h = fnv(h, &t->offset, sizeof(t->offset));
    }
    /* how the engine holds the experts (f32 copies, repacked rows) changes the CPU's speed */
    const hm_hparams *hp = hm_model_hparams(m);
    for (int il = 0; il < hp->n_layer; il++)
        for (int i = 0; i < 3; i++) {
            const hm_tensor *t = layer_matrix(hm_model_layer(m, il), i);
            const uint8_t x8 = t->x8 != NULL;
            h = fnv(h, &t->type, sizeof(t->type));
            h = fnv(h, &x8, 1);
        }
    snprintf(buf, n, "size=%" PRIu64 ";layout=%016" PRIx64, gguf_file_size(g), h);
}

hm_status calib_cache_path(const char *dir, const char *machine_key, const char *model_key,
                           char *buf, size_t n, hm_error *err) {
    char d[448];
    if (dir && *dir) {
        if (snprintf(d, sizeof(d), "%s", dir) >= (int)sizeof(d))
            return hm_error_set(err, HM_ERR_RANGE, "calibration cache: directory name too long");
    } else {
        const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        int k;
        if (x && *x) k = snprintf(d, sizeof(d), "%s/hotmoe", x);
        else if (home && *home) k = snprintf(d, sizeof(d), "%s/.cache/hotmoe", home);
        else
            return hm_error_set(err, HM_ERR_NOT_FOUND,
                                "calibration cache: neither XDG_CACHE_HOME nor HOME is set");
        if (k >= (int)sizeof(d))
            return hm_error_set(err, HM_ERR_RANGE, "calibration cache: directory name too long");
    }
    uint64_t h = fnv(k_fnv0, machine_key, strlen(machine_key) + 1);
    h = fnv(h, model_key, strlen(model_key) + 1);
    if (snprintf(buf, n, "%s/calib-%016" PRIx64 ".json", d, h) >= (int)n)
        return hm_error_set(err, HM_ERR_RANGE, "calibration cache: path too long");
    return HM_OK;
}

/* ---- reading ---- */

typedef struct {
    const char *path;
    hm_error *err;
} rd;

__attribute__((format(printf, 3, 4)))
static hm_status bad(const rd *r, hm_status st, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return hm_error_set(r->err, st, "%s: %s", r->path, msg);
}

/* obj[key] as a finite number > 0 (>= 0 when zero_ok) */
static hm_status get_pos(const rd *r, const json_t *obj, const char *key, const char *where,
                         bool zero_ok, double *out) {
    const json_t *v = json_object_get(obj, key);
    if (!json_is_number(v)) return bad(r, HM_ERR_FORMAT, "%s%s: missing or not a number", where, key);
    const double d = json_number_value(v);
    if (!isfinite(d) || d < 0 || (!zero_ok && d == 0))
        return bad(r, HM_ERR_FORMAT, "%s%s: %g is not a %s finite number", where, key, d,
                   zero_ok ? "non-negative" : "positive");
    *out = d;
    return HM_OK;
}

static hm_status get_int(const rd *r, const json_t *obj, const char *key, const char *where,
                         int64_t lo, int64_t hi, int64_t *out) {
    const json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        return bad(r, HM_ERR_FORMAT, "%s%s: missing or not an integer", where, key);
    const json_int_t i = json_integer_value(v);
    if (i < lo || i > hi)
        return bad(r, HM_ERR_FORMAT, "%s%s: %" JSON_INTEGER_FORMAT " outside [%" PRId64
                   ", %" PRId64 "]", where, key, i, lo, hi);
    *out = (int64_t)i;
    return HM_OK;
}

static hm_status get_str(const rd *r, const json_t *obj, const char *key, const char *where,
                         char *dst, size_t cap) {
    const json_t *v = json_object_get(obj, key);
    if (!json_is_string(v)) return bad(r, HM_ERR_FORMAT, "%s%s: missing or not a string", where, key);
    if (json_string_length(v) >= cap)
        return bad(r, HM_ERR_FORMAT, "%s%s: longer than %zu bytes", where, key, cap - 1);
    snprintf(dst, cap, "%s", json_string_value(v));
    return HM_OK;
}

static hm_status read_types(const rd *r, const json_t *root, calib_result *c) {
    const json_t *a = json_object_get(root, "types");
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > CALIB_MAX_TYPES)
        return bad(r, HM_ERR_FORMAT, "types: must be an array of 1 to %d entries",
                   CALIB_MAX_TYPES);
    c->n_types = (int)json_array_size(a);
    for (int i = 0; i < c->n_types; i++) {
        const json_t *o = json_array_get(a, (size_t)i);
        char where[32], name[32];
        snprintf(where, sizeof(where), "types[%d].", i);
        if (!json_is_object(o)) return bad(r, HM_ERR_FORMAT, "types[%d]: not an object", i);
        calib_type *t = &c->types[i];
        int64_t v;
        hm_status st = get_str(r, o, "type", where, name, sizeof(name));
        if (st != HM_OK) return st;
        const int id = hm_type_from_name(name);
        if (id < 0) return bad(r, HM_ERR_FORMAT, "%stype: unknown weight type '%s'", where, name);
        t->wtype = (uint32_t)id;
        for (int j = 0; j < i; j++)
            if (c->types[j].wtype == t->wtype)
                return bad(r, HM_ERR_FORMAT, "%stype: '%s' given twice", where, name);
        if ((st = get_int(r, o, "bytes", where, 1, INT64_MAX, &v)) != HM_OK) return st;
        t->bytes = (uint64_t)v;
        if ((st = get_int(r, o, "experts", where, 1, 1 << 20, &v)) != HM_OK) return st;
        t->n_expert = (int)v;
        if ((st = get_int(r, o, "batch", where, 2, 1 << 20, &v)) != HM_OK) return st;
        t->batch = (int)v;
        if ((st = get_pos(r, o, "t1_s", where, false, &t->t1_s)) != HM_OK) return st;
        if ((st = get_pos(r, o, "tb_s", where, false, &t->tb_s)) != HM_OK) return st;
        calib_type_derive(t);
    }
    return HM_OK;
}

static hm_status read_root(const rd *r, const json_t *root, calib_result *c) {
    if (!json_is_object(root)) return bad(r, HM_ERR_FORMAT, "not a JSON object");
    char fmt[32];
    int64_t v;
    hm_status st = get_str(r, root, "format", "", fmt, sizeof(fmt));
    if (st != HM_OK) return st;
    if (strcmp(fmt, CALIB_FORMAT)) return bad(r, HM_ERR_FORMAT, "format: '%s' is not '%s'", fmt, CALIB_FORMAT);
    if ((st = get_int(r, root, "version", "", CALIB_VERSION, CALIB_VERSION, &v)) != HM_OK) return st;
    if ((st = get_str(r, root, "machine_key", "", c->machine_key, sizeof(c->machine_key))) != HM_OK)
        return st;
    if ((st = get_str(r, root, "model_key", "", c->model_key, sizeof(c->model_key))) != HM_OK)
        return st;
    if ((st = get_int(r, root, "n_threads", "", 1, 1 << 16, &v)) != HM_OK) return st;
    c->n_threads = (int)v;
    const json_t *hr = json_object_get(root, "host_read"), *h2d = json_object_get(root, "h2d");
    if (!json_is_object(hr)) return bad(r, HM_ERR_FORMAT, "host_read: missing or not an object");
    if ((st = get_pos(r, hr, "bytes_per_s", "host_read.", false, &c->host_read_bps)) != HM_OK)
        return st;
    if ((st = get_int(r, hr, "bytes", "host_read.", 1, INT64_MAX, &v)) != HM_OK) return st;
    c->host_read_bytes = (uint64_t)v;
    if (!json_is_object(h2d)) return bad(r, HM_ERR_FORMAT, "h2d: missing or not an object");
    if ((st = get_pos(r, h2d, "bytes_per_s", "h2d.", true, &c->h2d_bps)) != HM_OK) return st;
    if ((st = get_str(r, h2d, "source", "h2d.", c->h2d_source, sizeof(c->h2d_source))) != HM_OK)
        return st;
    const bool known = !strcmp(c->h2d_source, "registered") || !strcmp(c->h2d_source, "staged");
    if (!known && c->h2d_source[0])
        return bad(r, HM_ERR_FORMAT, "h2d.source: '%s' is not registered, staged or empty",
                   c->h2d_source);
    if (known != (c->h2d_bps > 0))
        return bad(r, HM_ERR_FORMAT, "h2d: bytes_per_s %g does not go with source '%s'",
                   c->h2d_bps, c->h2d_source);
    return read_types(r, root, c);
}

hm_status calib_cache_read(const char *path, const hm_model *m, const char *machine_key,
                           const char *model_key, const char *h2d_source, calib_result *out,
                           hm_error *err) {
    const rd r = {path, err};
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT) return bad(&r, HM_ERR_NOT_FOUND, "no calibration cached");
        return bad(&r, HM_ERR_IO, "%s", strerror(errno));
    }
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return bad(&r, HM_ERR_FORMAT, "line %d: %s", je.line, je.text);
    calib_result c;
    memset(&c, 0, sizeof(c));
    hm_status st = read_root(&r, root, &c);
    json_decref(root);
    if (st != HM_OK) return st;
    if (strcmp(c.machine_key, machine_key) || strcmp(c.model_key, model_key))
        return bad(&r, HM_ERR_STATE, "measured on another machine or model (%s; %s)",
                   c.machine_key, c.model_key);
    if (strcmp(c.h2d_source, h2d_source ? h2d_source : ""))
        return bad(&r, HM_ERR_STATE, "host->device measured from '%s', now '%s'", c.h2d_source,
                   h2d_source ? h2d_source : "");
    uint32_t types[CALIB_MAX_TYPES];
    const int nt = calib_model_types(m, types, CALIB_MAX_TYPES);
    for (int i = 0; i < nt; i++) {
        int found = 0;
        for (int j = 0; j < c.n_types; j++) found |= c.types[j].wtype == types[i];
        if (!found)
            return bad(&r, HM_ERR_STATE, "no measurement of type %s", hm_type_name(types[i]));
    }
    snprintf(c.cache_path, sizeof(c.cache_path), "%s", path);
    c.source = CALIB_CACHED;
    *out = c;
    return HM_OK;
}

/* ---- writing ---- */

static hm_status mkdirs(const char *dir, hm_error *err) {
    char p[512];
    if (snprintf(p, sizeof(p), "%s", dir) >= (int)sizeof(p))
        return hm_error_set(err, HM_ERR_RANGE, "calibration cache: directory name too long");
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return hm_error_set(err, HM_ERR_IO, "calibration cache: mkdir %s: %s", p,
                                strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return hm_error_set(err, HM_ERR_IO, "calibration cache: mkdir %s: %s", p, strerror(errno));
    return HM_OK;
}

hm_status calib_cache_write(const calib_result *c, const char *path, hm_error *err) {
    char dir[512];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        hm_status st = mkdirs(dir, err);
        if (st != HM_OK) return st;
    }
    hm_json j;
    hm_json_init_buf(&j, true);
    hm_json_obj_begin(&j);
    hm_json_kstr(&j, "format", CALIB_FORMAT);
    hm_json_kint(&j, "version", CALIB_VERSION);
    hm_json_kstr(&j, "machine_key", c->machine_key);
    hm_json_kstr(&j, "model_key", c->model_key);
    hm_json_kint(&j, "n_threads", c->n_threads);
    hm_json_key(&j, "host_read");
    hm_json_obj_begin(&j);
    hm_json_kdouble(&j, "bytes_per_s", c->host_read_bps);
    hm_json_kuint(&j, "bytes", c->host_read_bytes);
    hm_json_obj_end(&j);
    hm_json_key(&j, "h2d");
    hm_json_obj_begin(&j);
    hm_json_kdouble(&j, "bytes_per_s", c->h2d_bps);
    hm_json_kstr(&j, "source", c->h2d_source);
    hm_json_obj_end(&j);
    hm_json_key(&j, "types");
    hm_json_arr_begin(&j);
    for (int i = 0; i < c->n_types; i++) {
        const calib_type *t = &c->types[i];
        hm_json_obj_begin(&j);
        hm_json_kstr(&j, "type", hm_type_name(t->wtype));
        hm_json_kuint(&j, "bytes", t->bytes);
        hm_json_kint(&j, "experts", t->n_expert);
        hm_json_kint(&j, "batch", t->batch);
        hm_json_kdouble(&j, "t1_s", t->t1_s);
        hm_json_kdouble(&j, "tb_s", t->tb_s);
        hm_json_obj_end(&j);
    }
    hm_json_arr_end(&j);
    hm_json_kdouble(&j, "measure_s", c->seconds);
    hm_json_obj_end(&j);
    char tmp[560];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    hm_status st = hm_json_write_file(&j, tmp, err);
    hm_json_free(&j);
    if (st != HM_OK) {
        unlink(tmp);
        return st;
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return hm_error_set(err, HM_ERR_IO, "calibration cache: rename to %s: %s", path,
                            strerror(e));
    }
    return HM_OK;
}
