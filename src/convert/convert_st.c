/* convert_st.c - reading safetensors checkpoints: one file, several shards listed by
 * model.safetensors.index.json, or every *.safetensors of a folder.
 *
 * DESIGN: every file is memory-mapped read-only and never copied; a tensor is a pointer into its
 * file's map. The header (8-byte little-endian length, then JSON) is parsed with jansson and
 * checked before any tensor is used: the header fits the file, every tensor's data_offsets lie
 * inside the file and match its shape and dtype. Tensors are kept sorted by name so a lookup is
 * a binary search (checkpoints have tens of thousands of per-expert tensors). Dtypes other than
 * F32/F16/BF16/F64 are recorded by name and rejected by the caller when such a tensor is needed,
 * so unrelated extra tensors do not stop a conversion.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/convert_internal.h"
#include "quant/fp16.h"

static const struct {
    const char *name;
    st_dtype dt;
    int size;
} k_dtypes[] = {{"F32", ST_F32, 4}, {"F16", ST_F16, 2}, {"BF16", ST_BF16, 2}, {"F64", ST_F64, 8}};

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static hm_status map_file(const char *path, st_file *f, hm_error *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return hm_error_set(err, errno == ENOENT ? HM_ERR_NOT_FOUND : HM_ERR_IO, "%s: %s", path,
                            strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return hm_error_set(err, HM_ERR_IO, "%s: %s", path, strerror(e));
    }
    f->size = (size_t)sb.st_size;
    f->map = NULL;
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return hm_error_set(err, HM_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        f->map = m;
    }
    close(fd);
    f->path = dupstr(path);
    if (!f->path) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    return HM_OK;
}

static hm_status add_tensor(st_set *s, int *cap, st_tensor *t, hm_error *err) {
    if (s->n == *cap) {
        int nc = *cap ? *cap * 2 : 256;
        st_tensor *nt = realloc(s->t, (size_t)nc * sizeof(*nt));
        if (!nt) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
        s->t = nt;
        *cap = nc;
    }
    s->t[s->n++] = *t;
    return HM_OK;
}

/* Parses the header of file index fi and appends its tensors. */
static hm_status parse_header(st_set *s, int fi, int *cap, hm_error *err) {
    const st_file *f = &s->files[fi];
    const uint8_t *m = f->map;
    if (f->size < 8)
        return hm_error_set(err, HM_ERR_FORMAT,
                            "%s: truncated: %zu bytes, not even a header length", f->path, f->size);
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++) hl |= (uint64_t)m[k] << (8 * k);
    if (hl > f->size - 8)
        return hm_error_set(err, HM_ERR_FORMAT, "%s: truncated: header of %llu bytes, file has %zu",
                            f->path, (unsigned long long)hl, f->size);
    json_error_t je;
    json_t *root = json_loadb((const char *)m + 8, (size_t)hl, 0, &je);
    if (!root)
        return hm_error_set(err, HM_ERR_FORMAT,
                            "%s: malformed JSON header: %s (line %d, column %d)", f->path, je.text,
                            je.line, je.column);
    hm_status st = HM_OK;
    if (!json_is_object(root))
        st = hm_error_set(err, HM_ERR_FORMAT, "%s: malformed JSON header: not an object", f->path);
    const uint64_t data0 = 8 + hl, avail = f->size - data0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (st != HM_OK) break;
        if (!strcmp(key, "__metadata__")) continue;
        st_tensor t = {.file = fi, .dtype = ST_OTHER};
        json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape"),
               *off = json_object_get(val, "data_offsets");
        if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) ||
            json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
            !json_is_integer(json_array_get(off, 1)) || json_array_size(sh) > 8) {
            st = hm_error_set(err, HM_ERR_FORMAT,
                              "%s: malformed JSON header: tensor %s needs dtype, shape (<= 8 dims) "
                              "and data_offsets [begin, end]",
                              f->path, key);
            break;
        }
        snprintf(t.dtype_name, sizeof(t.dtype_name), "%s", json_string_value(dt));
        int esize = 0;
        for (size_t k = 0; k < sizeof(k_dtypes) / sizeof(k_dtypes[0]); k++)
            if (!strcmp(t.dtype_name, k_dtypes[k].name)) {
                t.dtype = k_dtypes[k].dt;
                esize = k_dtypes[k].size;
            }
        t.n_dims = (int)json_array_size(sh);
        uint64_t nel = 1;
        for (int d = 0; d < t.n_dims; d++) {
            json_t *x = json_array_get(sh, (size_t)d);
            if (!json_is_integer(x) || json_integer_value(x) < 0) {
                st = hm_error_set(
                    err, HM_ERR_FORMAT,
                    "%s: malformed JSON header: tensor %s: shape[%d] is not a non-negative integer",
                    f->path, key, d);
                break;
            }
            t.shape[d] = (int64_t)json_integer_value(x);
            nel *= (uint64_t)t.shape[d];
        }
        if (st != HM_OK) break;
        json_int_t b = json_integer_value(json_array_get(off, 0)),
                   e = json_integer_value(json_array_get(off, 1));
        if (b < 0 || e < b) {
            st = hm_error_set(err, HM_ERR_FORMAT, "%s: tensor %s: bad data_offsets [%lld, %lld]",
                              f->path, key, (long long)b, (long long)e);
            break;
        }
        if ((uint64_t)e > avail) {
            st = hm_error_set(err, HM_ERR_FORMAT,
                              "%s: truncated: tensor %s data ends at byte %llu, the file has %zu",
                              f->path, key, (unsigned long long)(data0 + (uint64_t)e), f->size);
            break;
        }
        if (esize && (uint64_t)(e - b) != nel * (uint64_t)esize) {
            st = hm_error_set(
                err, HM_ERR_FORMAT,
                "%s: tensor %s: data_offsets span %lld bytes, shape and dtype %s need %llu",
                f->path, key, (long long)(e - b), t.dtype_name,
                (unsigned long long)(nel * (uint64_t)esize));
            break;
        }
        t.data = m + data0 + (uint64_t)b;
        t.name = dupstr(key);
        if (!t.name) {
            st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
            break;
        }
        st = add_tensor(s, cap, &t, err);
        if (st != HM_OK) free(t.name);
    }
    json_decref(root);
    return st;
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}
static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static hm_status open_files(st_set *s, const char *dir, char **names, int n, hm_error *err,
                            const char *index) {
    s->files = calloc((size_t)(n ? n : 1), sizeof(*s->files));
    if (!s->files) return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    int cap = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        hm_status st = map_file(path, &s->files[i], err);
        if (st != HM_OK) {
            if (index && err) {
                char why[HM_ERROR_MSG_MAX];
                snprintf(why, sizeof(why), "%s", err->msg);
                hm_error_set(err, st, "%s/%s names shard %s, which cannot be opened (%s)", dir,
                             index, names[i], why);
            }
            return st;
        }
        s->n_files = i + 1;
        if ((st = parse_header(s, i, &cap, err)) != HM_OK) return st;
    }
    return HM_OK;
}

/* shard names of an index's weight_map, sorted and distinct */
static hm_status read_index(const char *dir, const char *path, char ***out, int *n_out,
                            json_t **root_out, hm_error *err) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return hm_error_set(err, HM_ERR_FORMAT, "%s: malformed JSON: %s (line %d)", path, je.text,
                            je.line);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return hm_error_set(err, HM_ERR_FORMAT, "%s: weight_map: missing or not an object", path);
    }
    size_t n = json_object_size(wm), k = 0;
    const char **names = calloc(n ? n : 1, sizeof(*names));
    if (!names) {
        json_decref(root);
        return hm_error_set(err, HM_ERR_NOMEM, "out of memory");
    }
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val)) {
            free(names);
            json_decref(root);
            return hm_error_set(err, HM_ERR_FORMAT, "%s: weight_map.%s: not a file name", path,
                                key);
        }
        names[k++] = json_string_value(val);
    }
    qsort(names, n, sizeof(*names), cmp_str);
    int m = 0;
    for (size_t i = 0; i < n; i++)
        if (!m || strcmp(names[m - 1], names[i])) names[m++] = names[i];
    (void)dir;
    *out = (char **)names;
    *n_out = m;
    *root_out = root;
    return HM_OK;
}

hm_status convert_st_open(const char *dir, st_set *s, hm_error *err) {
    memset(s, 0, sizeof(*s));
    char path[4096];
    struct stat sb;
    hm_status st;
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    if (stat(path, &sb) == 0) {
        char **names = NULL;
        int n = 0;
        json_t *root = NULL;
        st = read_index(dir, path, &names, &n, &root, err);
        if (st == HM_OK) st = open_files(s, dir, names, n, err, "model.safetensors.index.json");
        /* every tensor the index names must be in its shard */
        if (st == HM_OK) {
            qsort(s->t, (size_t)s->n, sizeof(*s->t), cmp_tensor);
            const char *key;
            json_t *val;
            json_object_foreach(json_object_get(root, "weight_map"), key, val) {
                const st_tensor *t = convert_st_find(s, key);
                if (!t) {
                    st = hm_error_set(err, HM_ERR_NOT_FOUND, "%s: tensor %s is not in its shard %s",
                                      path, key, json_string_value(val));
                    break;
                }
            }
        }
        free(names);
        json_decref(root);
        if (st != HM_OK) convert_st_close(s);
        return st;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    char *one = "model.safetensors";
    if (stat(path, &sb) == 0) {
        st = open_files(s, dir, &one, 1, err, NULL);
    } else {
        DIR *d = opendir(dir);
        if (!d)
            return hm_error_set(err, errno == ENOENT ? HM_ERR_NOT_FOUND : HM_ERR_IO, "%s: %s", dir,
                                strerror(errno));
        char **names = NULL;
        int n = 0, cap = 0;
        st = HM_OK;
        for (struct dirent *e; st == HM_OK && (e = readdir(d));) {
            size_t l = strlen(e->d_name);
            if (l < 12 || strcmp(e->d_name + l - 12, ".safetensors")) continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                char **nn = realloc(names, (size_t)cap * sizeof(*nn));
                if (!nn) {
                    st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
                    break;
                }
                names = nn;
            }
            if (!(names[n] = dupstr(e->d_name)))
                st = hm_error_set(err, HM_ERR_NOMEM, "out of memory");
            else
                n++;
        }
        closedir(d);
        if (st == HM_OK && n == 0)
            st = hm_error_set(
                err, HM_ERR_NOT_FOUND,
                "%s: no model.safetensors, model.safetensors.index.json or *.safetensors", dir);
        if (st == HM_OK) {
            qsort(names, (size_t)n, sizeof(*names), cmp_str);
            st = open_files(s, dir, names, n, err, NULL);
        }
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
    }
    if (st == HM_OK) {
        qsort(s->t, (size_t)s->n, sizeof(*s->t), cmp_tensor);
        for (int i = 1; i < s->n; i++)
            if (!strcmp(s->t[i].name, s->t[i - 1].name)) {
                st = hm_error_set(err, HM_ERR_FORMAT, "%s: tensor %s is in both %s and %s", dir,
                                  s->t[i].name, s->files[s->t[i - 1].file].path,
                                  s->files[s->t[i].file].path);
                break;
            }
    }
    if (st != HM_OK) convert_st_close(s);
    return st;
}

void convert_st_close(st_set *s) {
    for (int i = 0; i < s->n; i++) free(s->t[i].name);
    for (int i = 0; i < s->n_files; i++) {
        if (s->files[i].map) munmap(s->files[i].map, s->files[i].size);
        free(s->files[i].path);
    }
    free(s->files);
    free(s->t);
    memset(s, 0, sizeof(*s));
}

const st_tensor *convert_st_find(const st_set *s, const char *name) {
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(s->t[mid].name, name);
        if (!c) return &s->t[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int64_t convert_st_nelem(const st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->shape[d];
    return n;
}

static inline float get1(const st_tensor *t, int64_t i) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32: {
        float f;
        memcpy(&f, p + i * 4, 4);
        return f;
    }
    case ST_F16: {
        hm_fp16 h;
        memcpy(&h, p + i * 2, 2);
        return hm_fp16_to_f32(h);
    }
    case ST_BF16: {
        hm_bf16 h;
        memcpy(&h, p + i * 2, 2);
        return hm_bf16_to_f32(h);
    }
    case ST_F64: {
        double d;
        memcpy(&d, p + i * 8, 8);
        return (float)d;
    }
    default:
        return 0.0f;
    }
}

void convert_st_read(const st_tensor *t, int64_t first, int64_t n, float *dst) {
    if (t->dtype == ST_F32) {
        memcpy(dst, t->data + first * 4, (size_t)n * 4);
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = get1(t, first + i);
}

void convert_st_gather(const st_tensor *t, int64_t first, int64_t stride, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i++) dst[i] = get1(t, first + i * stride);
}
