/* tok_test_util.h - shared by the tokenizer tests: reading files, loading the committed
 * vocab-only GGUFs (tests/tokenizer/data/NAME.gguf.gz, decompressed into $HOTMOE_TMP). */
#ifndef HM_TESTS_TOK_TEST_UTIL_H
#define HM_TESTS_TOK_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

static char *tt_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) p[n] = 0;
    if (len) *len = (size_t)n;
    return p;
}

static const char *tt_tmp(void) {
    const char *t = getenv("HOTMOE_TMP");
    return t && *t ? t : "/tmp";
}

/* Decompresses data/NAME.gguf.gz into $HOTMOE_TMP/tok_NAME.gguf (once) and loads it. */
static tok_vocab *tt_load_vocab(const char *name, char *path_out, size_t path_cap) {
    char path[512], cmd[2200];
    snprintf(path, sizeof(path), "%s/tok_%s.gguf", tt_tmp(), name);
    /* per-process temporary name: test programs may run in parallel */
    snprintf(cmd, sizeof(cmd), "gzip -dc tests/tokenizer/data/%s.gguf.gz > %s.%d && mv %s.%d %s", name, path, (int)getpid(), path,
             (int)getpid(), path);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot decompress tests/tokenizer/data/%s.gguf.gz\n", name);
        return NULL;
    }
    if (path_out) snprintf(path_out, path_cap, "%s", path);
    gguf_ctx *g;
    hm_error err;
    if (gguf_open(path, &g, &err) != HM_OK) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        return NULL;
    }
    tok_vocab *v = NULL;
    if (tok_vocab_load(g, &v, &err) != HM_OK) fprintf(stderr, "%s: %s\n", path, err.msg);
    gguf_close(g);
    return v;
}

/* Loads each vocabulary once per test program (freed at exit), for tests that use it repeatedly. */
static struct {
    char name[16];
    tok_vocab *v;
} tt_cache[4];

static void tt_cache_free(void) {
    for (int i = 0; i < 4; i++) tok_vocab_free(tt_cache[i].v);
}

static const tok_vocab *tt_vocab(const char *name) {
    for (int i = 0; i < 4; i++)
        if (tt_cache[i].v && !strcmp(tt_cache[i].name, name)) return tt_cache[i].v;
    for (int i = 0; i < 4; i++) {
        if (tt_cache[i].v) continue;
        if (i == 0) atexit(tt_cache_free);
        tt_cache[i].v = tt_load_vocab(name, NULL, 0);
        snprintf(tt_cache[i].name, sizeof(tt_cache[i].name), "%s", name);
        return tt_cache[i].v;
    }
    return NULL;
}

#endif
