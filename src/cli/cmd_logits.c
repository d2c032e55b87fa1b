/* cmd_logits.c - `hotmoe logits -m MODEL (-p TEXT | --ids 1,2,3) -o FILE [--all|--last]`:
 * runs the tokens as one prompt and writes the logits of every position (or the last one) as
 * raw little-endian f32 after a small JSON header (docs/LOGITS.md), or as NumPy .npy when FILE
 * ends in ".npy". The tool every reference comparison uses.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "cli/commands.h"
#include "cli/engine.h"

#define CMD "logits"

/* "1,2,3" -> ids; one error line and false on anything else. */
static bool parse_ids(const char *s, tok_ids *out) {
    const char *p = s;
    while (*p) {
        while (*p == ' ') p++;
        if (!isdigit((unsigned char)*p)) {
            fprintf(stderr, "hotmoe " CMD ": --ids: expected a token id at '%s'\n", p);
            return false;
        }
        errno = 0;
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (errno || v > 0x7fffffffUL) {
            fprintf(stderr, "hotmoe " CMD ": --ids: id out of range at '%s'\n", p);
            return false;
        }
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 64;
            int32_t *n = realloc(out->ids, cap * sizeof(int32_t));
            if (!n) return false;
            out->ids = n, out->cap = cap;
        }
        out->ids[out->n++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "hotmoe " CMD ": --ids: unexpected '%c' (use 1,2,3)\n", *p);
            return false;
        }
    }
    if (out->n == 0) fprintf(stderr, "hotmoe " CMD ": --ids: no ids given\n");
    return out->n > 0;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* Writes the header (hotmoe format or .npy) and the rows; false after printing the error. */
static bool write_logits(const char *path, const cli_engine *e, const char *model_path,
                         const tok_ids *ids, bool all, const float *rows, int n_rows) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "hotmoe " CMD ": cannot create '%s': %s\n", path, strerror(errno));
        return false;
    }
    const int V = e->n_vocab;
    char *hdr = NULL;
    size_t hlen = 0;
    bool ok = true;
    if (ends_with(path, ".npy")) {
        /* NPY 1.0: magic, version, u16 header length, dict padded with spaces, '\n'; the data
         * starts at a multiple of 64. */
        char d[256];
        int n = snprintf(d, sizeof(d), "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, "
                                       "%d), }", n_rows, V);
        size_t total = 10 + (size_t)n + 1, pad = (64 - total % 64) % 64;
        uint16_t hl = (uint16_t)(n + pad + 1);
        unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff),
                                 (unsigned char)(hl >> 8)};
        ok = fwrite(pre, 1, 10, f) == 10 && fwrite(d, 1, (size_t)n, f) == (size_t)n;
        for (size_t i = 0; i < pad && ok; i++) ok = fputc(' ', f) != EOF;
        ok = ok && fputc('\n', f) != EOF;
    } else {
        hm_json j;
        hm_json_init_buf(&j, false);
        hm_json_obj_begin(&j);
        hm_json_key(&j, "format"), hm_json_str(&j, "hotmoe-logits");
        hm_json_key(&j, "version"), hm_json_int(&j, 1);
        hm_json_key(&j, "dtype"), hm_json_str(&j, "f32");
        hm_json_key(&j, "byte_order"), hm_json_str(&j, "little");
        hm_json_key(&j, "n_rows"), hm_json_int(&j, n_rows);
        hm_json_key(&j, "n_vocab"), hm_json_int(&j, V);
        hm_json_key(&j, "rows"), hm_json_str(&j, all ? "all" : "last");
        hm_json_key(&j, "first_position"), hm_json_int(&j, all ? 0 : (int64_t)ids->n - 1);
        hm_json_key(&j, "model"), hm_json_str(&j, model_path);
        hm_json_key(&j, "arch"), hm_json_str(&j, hm_model_arch(e->model)->name);
        hm_json_key(&j, "n_threads"), hm_json_int(&j, e->n_threads);
        hm_json_key(&j, "ids");
        hm_json_arr_begin(&j);
        for (size_t i = 0; i < ids->n; i++) hm_json_int(&j, ids->ids[i]);
        hm_json_arr_end(&j);
        hm_json_obj_end(&j);
        hm_error err;
        if (hm_json_finish(&j, &err) != HM_OK) {
            fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
            hm_json_free(&j);
            fclose(f);
            return false;
        }
        hdr = (char *)hm_json_data(&j, &hlen);
        /* magic (8) + u32 length + JSON padded with spaces and '\n' to a multiple of 64 */
        size_t total = 12 + hlen + 1, pad = (64 - total % 64) % 64;
        uint32_t L = (uint32_t)(hlen + pad + 1);
        unsigned char le[4] = {(unsigned char)L, (unsigned char)(L >> 8),
                               (unsigned char)(L >> 16), (unsigned char)(L >> 24)};
        ok = fwrite("HMLOGIT1", 1, 8, f) == 8 && fwrite(le, 1, 4, f) == 4 &&
             fwrite(hdr, 1, hlen, f) == hlen;
        for (size_t i = 0; i < pad && ok; i++) ok = fputc(' ', f) != EOF;
        ok = ok && fputc('\n', f) != EOF;
        hm_json_free(&j);
    }
    /* f32 little-endian (this host is little-endian: x86-64 / aarch64 as built) */
    size_t n = (size_t)n_rows * (size_t)V;
    ok = ok && fwrite(rows, sizeof(float), n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok) fprintf(stderr, "hotmoe " CMD ": write error on '%s'\n", path);
    return ok;
}

int cmd_logits(int argc, char **argv) {
    const char *ids_str = NULL, *out = NULL;
    bool all = false, last = false;
    const cli_arg_spec extra[] = {
        {"--ids", NULL, CLI_ARG_STR, &ids_str, "1,2,3", "token ids instead of -p TEXT"},
        {"-o", "--output", CLI_ARG_STR, &out, "FILE", "output file (.npy: NumPy; else "
                                                      "docs/LOGITS.md)"},
        {"--all", NULL, CLI_ARG_BOOL, &all, NULL, "logits of every position (default)"},
        {"--last", NULL, CLI_ARG_BOOL, &last, NULL, "logits of the last position only"},
    };
    const cli_args_def def = {CMD, "-m MODEL (-p TEXT | --ids 1,2,3) -o FILE [--all|--last]",
                              "Runs the tokens as one prompt and writes their logits.",
                              CLI_ARGS_MODEL | CLI_ARGS_PROMPT | CLI_ARGS_FILE |
                                  CLI_ARGS_CONTEXT | CLI_ARGS_THREADS,
                              extra, sizeof(extra) / sizeof(extra[0])};
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (!out) {
        fprintf(stderr, "hotmoe " CMD ": no output file (-o FILE)\n");
        return 2;
    }
    if ((a.prompt != NULL) + (ids_str != NULL) + (a.file != NULL) != 1) {
        fprintf(stderr, "hotmoe " CMD ": give exactly one of -p TEXT, -f FILE or --ids 1,2,3\n");
        return 2;
    }
    if (all && last) {
        fprintf(stderr, "hotmoe " CMD ": --all and --last exclude each other\n");
        return 2;
    }
    tok_ids ids = {0};
    if (ids_str && !parse_ids(ids_str, &ids)) {
        tok_ids_free(&ids);
        return 2;
    }
    cli_engine e;
    /* the context holds exactly the prompt unless -c says otherwise */
    int n_ctx_default = ids.n ? (int)ids.n : 0;
    rc = cli_engine_open(&e, CMD, &a, ids_str ? 0 : CLI_ENGINE_VOCAB, n_ctx_default);
    if (rc) {
        tok_ids_free(&ids);
        return rc;
    }
    hm_error err = {0};
    int ret = 1;
    float *rows = NULL;
    if (!ids_str) {
        size_t len = 0;
        char *text = a.prompt ? NULL : cli_read_file(CMD, a.file, &len);
        if (!a.prompt && !text) goto done;
        const char *t = a.prompt ? a.prompt : text;
        if (a.prompt) len = strlen(a.prompt);
        hm_status st = tok_encode(e.vocab, t, len,
                                  TOK_ENCODE_ADD_SPECIAL | TOK_ENCODE_PARSE_SPECIAL, &ids, &err);
        free(text);
        if (st != HM_OK) {
            fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
            goto done;
        }
        if (ids.n == 0) {
            fprintf(stderr, "hotmoe " CMD ": the prompt has no tokens\n");
            goto done;
        }
    }
    if ((int64_t)ids.n > hm_context_n_ctx(e.ctx)) {
        fprintf(stderr, "hotmoe " CMD ": %zu tokens do not fit the context size %d (-c)\n", ids.n,
                hm_context_n_ctx(e.ctx));
        goto done;
    }
    int n_rows = last ? 1 : (int)ids.n;
    rows = malloc((size_t)n_rows * (size_t)e.n_vocab * sizeof(float));
    if (!rows) {
        fprintf(stderr, "hotmoe " CMD ": out of memory for %d x %d logits\n", n_rows, e.n_vocab);
        goto done;
    }
    if (cli_engine_eval(&e, ids.ids, (int)ids.n, last ? rows : NULL, last ? NULL : rows, &err) !=
        HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        goto done;
    }
    if (write_logits(out, &e, a.model, &ids, !last, rows, n_rows)) ret = 0;
done:
    free(rows);
    tok_ids_free(&ids);
    cli_engine_close(&e);
    return ret;
}
