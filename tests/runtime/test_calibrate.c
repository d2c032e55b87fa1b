/* test_calibrate.c - the calibration's CPU parts (runtime/calibrate.h) on forged models: the
 * numbers measured are positive and finite and cover every expert weight type, the cache round
 * trip gives the same numbers (bit for bit: JSON doubles with 17 digits), HOTMOE_CALIBRATE=0 and
 * =force, a corrupt cache is measured again with a warning (never an error), every malformed
 * field is refused by name, the keys (a copied file hits, another model or another weight form
 * misses), the cache directory rules, a layer's blended rates and the report text. The GPU part
 * (the copy lane's bandwidth) is in tests/cuda/test_cuda_host.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "../forge/forge_test_util.h"
#include "base/cpu.h"
#include "base/threadpool.h"
#include "model/model.h"
#include "quant/qtypes.h"
#include "runtime/calibrate.h"
#include "runtime/calibrate_internal.h"

static char g_dir[512];

static void setup_dir(void) {
    if (g_dir[0]) return;
    char name[64];
    snprintf(name, sizeof(name), "calib-test-%ld", (long)getpid());
    ft_path(g_dir, sizeof(g_dir), name);
    mkdir(g_dir, 0755);
}

static hm_model *load(const char *preset, forge_mix mix, bool f32w) {
    char path[512];
    if (!ft_forged("calib", preset, mix, path, sizeof(path))) return NULL;
    hm_model_params mp = hm_model_default_params();
    mp.f32_weights = f32w;
    hm_model *m = NULL;
    hm_error err;
    if (hm_model_load(path, &mp, &m, &err) != HM_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        return NULL;
    }
    return m;
}

static int fin_pos(double v) { return isfinite(v) && v > 0; }

static void check_measured(const calib_result *c, const hm_model *m) {
    uint32_t types[CALIB_MAX_TYPES];
    const int nt = calib_model_types(m, types, CALIB_MAX_TYPES);
    HM_CHECK(nt >= 1 && c->n_types == nt);
    HM_CHECK_MSG(fin_pos(c->host_read_bps) && c->host_read_bytes > 0, "read %g B/s, %llu B",
                 c->host_read_bps, (unsigned long long)c->host_read_bytes);
    HM_CHECK(c->h2d_bps == 0 && c->h2d_source[0] == '\0'); /* no lane */
    for (int i = 0; i < c->n_types; i++) {
        const calib_type *t = &c->types[i];
        HM_CHECK(t->wtype == types[i]);
        HM_CHECK_MSG(fin_pos(t->t1_s) && fin_pos(t->tb_s), "%s: %g %g", hm_type_name(t->wtype),
                     t->t1_s, t->tb_s);
        HM_CHECK(t->bytes > 0 && t->n_expert >= 1 && t->batch == CALIB_BATCH);
        HM_CHECK(fin_pos(t->tok_s_per_byte));
        HM_CHECK(isfinite(t->fixed_s_per_byte) && t->fixed_s_per_byte >= 0);
    }
}

/* force measures and writes; the next run reads the same numbers; 0 measures nothing */
static void test_measure_roundtrip(void) {
    setup_dir();
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q4_K_M, false);
    HM_REQUIRE(m);
    tp_pool *pool = NULL;
    hm_error err;
    HM_REQUIRE(tp_init(2, &pool, &err) == HM_OK);
    calib_params p = {.model = m, .pool = pool, .device = -1, .cache_dir = g_dir,
                      .mode = "force"};
    calib_result a, b;
    HM_REQUIRE(calib_run(&p, &a, &err) == HM_OK);
    HM_CHECK(a.source == CALIB_MEASURED);
    check_measured(&a, m);
    HM_CHECK(a.n_threads == 2);
    printf("measured in %.3f s\n", a.seconds);
    HM_CHECK_MSG(a.seconds > 0 && a.seconds < 5, "%.3f s", a.seconds);
    HM_CHECK(a.cache_path[0] && access(a.cache_path, R_OK) == 0);
    HM_CHECK(strncmp(a.cache_path, g_dir, strlen(g_dir)) == 0);

    p.mode = "1";
    HM_REQUIRE(calib_run(&p, &b, &err) == HM_OK);
    HM_CHECK(b.source == CALIB_CACHED && b.seconds == 0); /* nothing measured now */
    HM_CHECK(!strcmp(a.cache_path, b.cache_path));
    HM_CHECK(!strcmp(a.machine_key, b.machine_key) && !strcmp(a.model_key, b.model_key));
    HM_CHECK(a.host_read_bps == b.host_read_bps && a.host_read_bytes == b.host_read_bytes);
    HM_CHECK(a.n_types == b.n_types);
    for (int i = 0; i < a.n_types && i < b.n_types; i++) {
        HM_CHECK(a.types[i].wtype == b.types[i].wtype && a.types[i].bytes == b.types[i].bytes);
        HM_CHECK(a.types[i].t1_s == b.types[i].t1_s && a.types[i].tb_s == b.types[i].tb_s);
        HM_CHECK(a.types[i].tok_s_per_byte == b.types[i].tok_s_per_byte);
        HM_CHECK(a.types[i].fixed_s_per_byte == b.types[i].fixed_s_per_byte);
    }

    /* the environment when mode is NULL */
    p.mode = NULL;
    setenv("HOTMOE_CALIBRATE", "0", 1);
    HM_REQUIRE(calib_run(&p, &b, &err) == HM_OK);
    HM_CHECK(b.source == CALIB_OFF && b.host_read_bps == CALIB_DEFAULT_HOST_READ);
    HM_CHECK(b.n_types == a.n_types && b.types[0].tok_s_per_byte == CALIB_DEFAULT_CPU_TOK);
    setenv("HOTMOE_CALIBRATE", "force", 1);
    HM_REQUIRE(calib_run(&p, &b, &err) == HM_OK);
    HM_CHECK(b.source == CALIB_MEASURED);
    unsetenv("HOTMOE_CALIBRATE");
    HM_REQUIRE(calib_run(&p, &b, &err) == HM_OK);
    HM_CHECK(b.source == CALIB_CACHED);
    p.mode = "sometimes"; /* unknown: taken as 1, with a note */
    HM_REQUIRE(calib_run(&p, &b, &err) == HM_OK);
    HM_CHECK(b.source == CALIB_CACHED && strstr(b.note, "sometimes") != NULL);

    /* a single-thread run (NULL pool) is another machine key */
    calib_params p1 = {.model = m, .device = -1, .cache_dir = g_dir, .mode = "1"};
    HM_REQUIRE(calib_run(&p1, &b, &err) == HM_OK);
    HM_CHECK(b.source == CALIB_MEASURED && b.n_threads == 1);
    HM_CHECK(strcmp(b.cache_path, a.cache_path) != 0);
    check_measured(&b, m);

    HM_CHECK(calib_run(NULL, &b, &err) == HM_ERR_ARG);
    tp_free(pool);
    hm_model_free(m);
}

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(s, f);
    fclose(f);
}

/* A corrupt cache file: measured again, a warning in the note, the file repaired. */
static void test_corrupt_cache(void) {
    setup_dir();
    hm_model *m = load("tiny-olmoe", FORGE_MIX_Q8_0, false);
    HM_REQUIRE(m);
    hm_error err;
    calib_params p = {.model = m, .device = -1, .cache_dir = g_dir, .mode = "force"};
    calib_result a, b;
    HM_REQUIRE(calib_run(&p, &a, &err) == HM_OK);
    HM_REQUIRE(a.cache_path[0]);
    const char *bad[] = {"", "{", "garbage\x01\xff", "[]", "{\"format\": 3}", "null"};
    p.mode = "1";
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_text(a.cache_path, bad[i]);
        HM_REQUIRE(calib_run(&p, &b, &err) == HM_OK);
        HM_CHECK_MSG(b.source == CALIB_MEASURED, "case %zu", i);
        HM_CHECK_MSG(strstr(b.note, "cache unreadable") != NULL, "case %zu: note '%s'", i,
                     b.note);
        check_measured(&b, m);
        calib_result c;
        HM_CHECK_MSG(calib_cache_read(a.cache_path, m, a.machine_key, a.model_key, "", &c,
                                      &err) == HM_OK, "case %zu not repaired: %s", i, err.msg);
    }
    /* a directory where the cache file should be: not cached, still measured */
    unlink(a.cache_path);
    mkdir(a.cache_path, 0755);
    HM_REQUIRE(calib_run(&p, &b, &err) == HM_OK);
    HM_CHECK(b.source == CALIB_MEASURED && b.cache_path[0] == '\0');
    HM_CHECK_MSG(b.note[0] != '\0', "no note");
    rmdir(a.cache_path);
    hm_model_free(m);
}

/* Field by field: each broken value is refused with its name (HM_ERR_FORMAT). */
static void test_cache_fields(void) {
    setup_dir();
    hm_model *m = load("tiny-olmoe", FORGE_MIX_Q8_0, false);
    HM_REQUIRE(m);
    hm_error err;
    char mk[384], dk[96], path[600];
    calib_machine_key(-1, 3, mk, sizeof(mk));
    calib_model_key(m, dk, sizeof(dk));
    snprintf(path, sizeof(path), "%s/fields.json", g_dir);
    const char *good_fmt =
        "{\"format\": \"hotmoe-calibration\", \"version\": %s, \"machine_key\": \"%s\", "
        "\"model_key\": \"%s\", \"n_threads\": %s, \"host_read\": {\"bytes_per_s\": %s, "
        "\"bytes\": 4096}, \"h2d\": {\"bytes_per_s\": %s, \"source\": \"%s\"}, \"types\": "
        "[{\"type\": \"%s\", \"bytes\": 1000, \"experts\": 2, \"batch\": %s, \"t1_s\": %s, "
        "\"tb_s\": 4.1e-3}], \"measure_s\": 0.1}";
    struct {
        const char *version, *threads, *read, *h2d, *src, *type, *batch, *t1, *field;
        hm_status want;
    } cases[] = {
        {"1", "3", "2e10", "0", "", "q8_0", "32", "1e-3", NULL, HM_OK},
        {"2", "3", "2e10", "0", "", "q8_0", "32", "1e-3", "version", HM_ERR_FORMAT},
        {"1", "0", "2e10", "0", "", "q8_0", "32", "1e-3", "n_threads", HM_ERR_FORMAT},
        {"1", "3", "-5", "0", "", "q8_0", "32", "1e-3", "bytes_per_s", HM_ERR_FORMAT},
        {"1", "3", "\"fast\"", "0", "", "q8_0", "32", "1e-3", "bytes_per_s", HM_ERR_FORMAT},
        {"1", "3", "2e10", "5e10", "", "q8_0", "32", "1e-3", "h2d", HM_ERR_FORMAT},
        {"1", "3", "2e10", "0", "psychic", "q8_0", "32", "1e-3", "source", HM_ERR_FORMAT},
        {"1", "3", "2e10", "0", "", "q9_X", "32", "1e-3", "type", HM_ERR_FORMAT},
        {"1", "3", "2e10", "0", "", "q8_0", "1", "1e-3", "batch", HM_ERR_FORMAT},
        {"1", "3", "2e10", "0", "", "q8_0", "32", "0", "t1_s", HM_ERR_FORMAT},
        {"1", "3", "2e10", "0", "", "q8_0", "32", "1e999", "line", HM_ERR_FORMAT},
        /* valid, but measured through a lane: not what a run without one needs */
        {"1", "3", "2e10", "5e10", "staged", "q8_0", "32", "1e-3", "'staged'", HM_ERR_STATE},
        /* valid, but the model's q8_0 experts are not covered */
        {"1", "3", "2e10", "0", "", "q4_K", "32", "1e-3", "q8_0", HM_ERR_STATE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[2048];
        snprintf(text, sizeof(text), good_fmt, cases[i].version, mk, dk, cases[i].threads,
                 cases[i].read, cases[i].h2d, cases[i].src, cases[i].type, cases[i].batch,
                 cases[i].t1);
        write_text(path, text);
        calib_result c;
        hm_error_clear(&err);
        const hm_status st = calib_cache_read(path, m, mk, dk, "", &c, &err);
        HM_CHECK_MSG(st == cases[i].want, "case %zu: status %d, %s", i, (int)st, err.msg);
        if (cases[i].field)
            HM_CHECK_MSG(strstr(err.msg, cases[i].field) != NULL, "case %zu: '%s' lacks '%s'", i,
                         err.msg, cases[i].field);
        if (st == HM_OK) {
            /* the rates derived on reading: tok = (4.1 - 1) ms / (31 x 1000 B) = 1e-7 s/B,
             * fixed = 1 ms / 1000 B - tok = 9e-7 s/B */
            HM_CHECK(c.source == CALIB_CACHED && c.n_types == 1 && c.n_threads == 3);
            HM_CHECK(fabs(c.types[0].tok_s_per_byte - 1e-7) < 1e-18);
            HM_CHECK(fabs(c.types[0].fixed_s_per_byte - 9e-7) < 1e-18);
        }
    }
    /* a duplicate key, and other keys */
    write_text(path, "{\"format\": \"hotmoe-calibration\", \"format\": \"x\"}");
    calib_result c;
    HM_CHECK(calib_cache_read(path, m, mk, dk, "", &c, &err) == HM_ERR_FORMAT);
    char text[2048];
    snprintf(text, sizeof(text), good_fmt, "1", mk, dk, "3", "2e10", "0", "", "q8_0", "32", "1e-3");
    write_text(path, text);
    HM_CHECK(calib_cache_read(path, m, "cpu=other", dk, "", &c, &err) == HM_ERR_STATE);
    HM_CHECK(calib_cache_read(path, m, mk, "size=1;layout=0", "", &c, &err) == HM_ERR_STATE);
    unlink(path);
    HM_CHECK(calib_cache_read(path, m, mk, dk, "", &c, &err) == HM_ERR_NOT_FOUND);
    hm_model_free(m);
}

/* Keys: the machine's facts; a copied file has the model key of the original, another model or
 * the experts held as f32 another; paths follow the keys and the directory rules. */
static void test_keys(void) {
    setup_dir();
    char mk[384], k1[96], k2[96], k3[96], k4[96];
    calib_machine_key(-1, 7, mk, sizeof(mk));
    char want[64];
    snprintf(want, sizeof(want), ";cpus=%d;threads=7;gpu=none", hm_cpu_count_allowed());
    HM_CHECK_MSG(!strncmp(mk, "cpu=", 4) && strstr(mk, want) != NULL, "%s", mk);

    char path[512], copy[600];
    HM_REQUIRE(ft_forged("calib", "tiny-olmoe", FORGE_MIX_Q8_0, path, sizeof(path)));
    snprintf(copy, sizeof(copy), "%s/renamed.gguf", g_dir);
    size_t n = 0;
    uint8_t *bytes = ft_read_file(path, &n);
    HM_REQUIRE(bytes);
    FILE *f = fopen(copy, "wb");
    HM_REQUIRE(f);
    HM_CHECK(fwrite(bytes, 1, n, f) == n);
    fclose(f);
    free(bytes);
    hm_model *a = NULL, *b = NULL;
    hm_error err;
    HM_REQUIRE(hm_model_load(path, NULL, &a, &err) == HM_OK);
    HM_REQUIRE(hm_model_load(copy, NULL, &b, &err) == HM_OK);
    calib_model_key(a, k1, sizeof(k1));
    calib_model_key(b, k2, sizeof(k2));
    HM_CHECK_MSG(!strcmp(k1, k2), "%s vs %s", k1, k2);
    char sz[48];
    snprintf(sz, sizeof(sz), "size=%zu;layout=", n);
    HM_CHECK_MSG(!strncmp(k1, sz, strlen(sz)) && strlen(k1) == strlen(sz) + 16, "%s", k1);
    hm_model_free(b);
    hm_model *c = load("tiny-olmoe", FORGE_MIX_F16, false);
    hm_model *d = load("tiny-olmoe", FORGE_MIX_Q8_0, true);
    HM_REQUIRE(c && d);
    calib_model_key(c, k3, sizeof(k3));
    calib_model_key(d, k4, sizeof(k4));
    HM_CHECK(strcmp(k1, k3) != 0 && strcmp(k1, k4) != 0);

    char p1[512], p2[512], p3[512];
    HM_REQUIRE(calib_cache_path("/some/dir", mk, k1, p1, sizeof(p1), &err) == HM_OK);
    HM_CHECK_MSG(!strncmp(p1, "/some/dir/calib-", 16) && strlen(p1) == 16 + 16 + 5, "%s", p1);
    HM_REQUIRE(calib_cache_path("/some/dir", mk, k3, p2, sizeof(p2), &err) == HM_OK);
    HM_CHECK(strcmp(p1, p2) != 0);
    HM_CHECK(calib_cache_path("/some/dir", mk, k1, p3, 20, &err) == HM_ERR_RANGE);
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char *sx = xdg ? strdup(xdg) : NULL, *sh = home ? strdup(home) : NULL;
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    HM_REQUIRE(calib_cache_path(NULL, mk, k1, p3, sizeof(p3), &err) == HM_OK);
    HM_CHECK_MSG(!strncmp(p3, "/xdg/hotmoe/calib-", 18), "%s", p3);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/someone", 1);
    HM_REQUIRE(calib_cache_path(NULL, mk, k1, p3, sizeof(p3), &err) == HM_OK);
    HM_CHECK_MSG(!strncmp(p3, "/home/someone/.cache/hotmoe/calib-", 34), "%s", p3);
    unsetenv("HOME");
    HM_CHECK(calib_cache_path(NULL, mk, k1, p3, sizeof(p3), &err) == HM_ERR_NOT_FOUND);
    /* no cache directory at all: calib_run still measures, with a note */
    calib_params pp = {.model = a, .device = -1, .mode = "1"};
    calib_result r;
    HM_REQUIRE(calib_run(&pp, &r, &err) == HM_OK);
    HM_CHECK(r.source == CALIB_MEASURED && r.cache_path[0] == '\0');
    HM_CHECK_MSG(strstr(r.note, "not cached") != NULL, "%s", r.note);
    if (sx) setenv("XDG_CACHE_HOME", sx, 1);
    if (sh) setenv("HOME", sh, 1);
    free(sx);
    free(sh);
    hm_model_free(a);
    hm_model_free(c);
    hm_model_free(d);
    unlink(copy);
}

/* t(n) = bytes (fixed + n tok) through (1, t1) and (batch, tb):
 *   bytes 1000, batch 32, t1 1 ms, tb 4.1 ms: tok = 3.1 ms / 31 / 1000 = 1e-7 s/B,
 *   fixed = 1e-6 - 1e-7 = 9e-7 s/B.
 *   tb 0.9 ms < t1 (noise): tok = 1e-3 x 1e-6 = 1e-9 (the floor), fixed = 1e-6 - 1e-9. */
static void test_derive(void) {
    calib_type t = {.bytes = 1000, .batch = 32, .t1_s = 1e-3, .tb_s = 4.1e-3};
    calib_type_derive(&t);
    HM_CHECK(fabs(t.tok_s_per_byte - 1e-7) < 1e-18 && fabs(t.fixed_s_per_byte - 9e-7) < 1e-18);
    t.tb_s = 0.9e-3;
    calib_type_derive(&t);
    HM_CHECK(fabs(t.tok_s_per_byte - 1e-9) < 1e-20);
    HM_CHECK(fabs(t.fixed_s_per_byte - (1e-6 - 1e-9)) < 1e-18);
}

/* A layer's rates: the matrices' per-byte rates weighted by their bytes. Gate and up are one
 * type, down another only if the mix makes it so; the expected value is computed from the
 * tensors here by the same formula, with hand-set rates 1e-9/1e-10 (gate, up type) and
 * 3e-9/3e-10 (down type when it differs). */
static void test_layer_rates(void) {
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q4_K_M, false);
    HM_REQUIRE(m);
    calib_result c;
    memset(&c, 0, sizeof(c));
    calib_defaults(m, true, &c);
    HM_CHECK(c.source == CALIB_OFF && c.h2d_bps == CALIB_DEFAULT_H2D);
    c.h2d_bps = 4e10;
    for (int i = 0; i < c.n_types; i++) {
        c.types[i].fixed_s_per_byte = i == 0 ? 1e-9 : 3e-9;
        c.types[i].tok_s_per_byte = i == 0 ? 1e-10 : 3e-10;
    }
    const hm_layer *L = hm_model_layer(m, 1);
    const hm_tensor *ts[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
    double bytes = 0, fx = 0, tk = 0;
    for (int i = 0; i < 3; i++) {
        const double b = (double)ts[i]->row_size * (double)ts[i]->ne[1];
        const bool first = ts[i]->type == c.types[0].wtype;
        bytes += b;
        fx += b * (first ? 1e-9 : 3e-9);
        tk += b * (first ? 1e-10 : 3e-10);
    }
    offload_rates r;
    calib_layer_rates(&c, m, 1, &r);
    HM_CHECK(r.h2d_bytes_per_s == 4e10 && r.gpu_fixed_s == CALIB_GPU_FIXED_S);
    HM_CHECK(fabs(r.cpu_fixed_s_per_byte - fx / bytes) < 1e-21);
    HM_CHECK(fabs(r.cpu_tok_s_per_byte - tk / bytes) < 1e-22);
    HM_CHECK(r.cpu_fixed_s_per_byte >= 1e-9 && r.cpu_fixed_s_per_byte <= 3e-9);
    const double eb = (double)offload_expert_size(m, 1, 1);
    HM_CHECK(eb >= bytes && fabs(r.gpu_tok_s - eb / CALIB_GPU_BYTE_TOK_PER_S) < 1e-24);
    calib_layer_rates(&c, m, 99, &r); /* no such layer: the defaults */
    HM_CHECK(r.cpu_tok_s_per_byte == CALIB_DEFAULT_CPU_TOK && r.h2d_bytes_per_s == 4e10);
    hm_model_free(m);
}

static void test_format(void) {
    setup_dir();
    hm_model *m = load("tiny-qwen3moe", FORGE_MIX_Q4_K_M, false);
    HM_REQUIRE(m);
    hm_error err;
    calib_params p = {.model = m, .device = -1, .cache_dir = g_dir, .mode = "force"};
    calib_result c;
    HM_REQUIRE(calib_run(&p, &c, &err) == HM_OK);
    char buf[4096];
    const size_t n = calib_format(&c, buf, sizeof(buf));
    printf("%s", buf);
    HM_CHECK(n == strlen(buf) && n > 0 && buf[n - 1] == '\n');
    HM_CHECK(strstr(buf, "calibration: measured in") != NULL);
    HM_CHECK(strstr(buf, "host read:") != NULL && strstr(buf, "GB/s") != NULL);
    HM_CHECK(strstr(buf, "host->device: none") != NULL);
    char want[64];
    snprintf(want, sizeof(want), "CPU experts %s:", hm_type_name(c.types[0].wtype));
    HM_CHECK(strstr(buf, want) != NULL);
    char small[10];
    HM_CHECK(calib_format(&c, small, sizeof(small)) == n && strlen(small) == sizeof(small) - 1);
    calib_defaults(m, false, &c);
    calib_format(&c, buf, sizeof(buf));
    HM_CHECK(strstr(buf, "calibration: off") != NULL && strstr(buf, "default") != NULL);
    hm_model_free(m);
}

HM_TEST_MAIN(test_measure_roundtrip, test_corrupt_cache, test_cache_fields, test_keys,
             test_derive, test_layer_rates, test_format)
