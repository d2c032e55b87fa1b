/* cmd_tokenize.c - `hotmoe tokenize -m MODEL (-p TEXT | -f FILE) [--ids-only] [--show-pieces]
 * [--no-bos] [--no-parse-special] [--replace-invalid]`: prints the token ids of a text, like
 * llama-tokenize. Works on any GGUF with tokenizer.* keys, vocab-only files (no tensors) too.
 *
 * Output: one line per token "ID -> 'PIECE'" (the decoded bytes; control characters and bytes
 * of incomplete UTF-8 are shown as \n, \t, \r, \xNN); --show-pieces adds the vocabulary string
 * and the token type; --ids-only prints just "[id, id, ...]" (llama-tokenize --ids format).
 * BOS/EOS are added as the vocabulary says unless --no-bos; special tokens in the text are
 * recognised unless --no-parse-special.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "gguf/gguf.h"
#include "tokenizer/tok_unicode.h"
#include "tokenizer/tokenizer.h"

static const char *const k_type_names[] = {"undefined", "normal", "unknown", "control", "user-defined", "unused", "byte"};

/* Prints s[0..n) with control characters and invalid UTF-8 escaped. */
static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        size_t k = tok_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (k == 0) printf("\\x%02X", c);
        else if (c == '\n') printf("\\n");
        else if (c == '\t') printf("\\t");
        else if (c == '\r') printf("\\r");
        else if (c == '\\') printf("\\\\");
        else if (c < 0x20 || c == 0x7F) printf("\\x%02X", c);
        else fwrite(s + i, 1, k, stdout);
        i += k ? k : 1;
    }
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        n += fread(p + n, 1, cap - n, f);
        if (n < cap) break;
        char *q = realloc(p, cap * 2);
        if (!q) {
            free(p);
            p = NULL;
            break;
        }
        p = q;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(p);
        return NULL;
    }
    *len = n;
    return p;
}

int cmd_tokenize(int argc, char **argv) {
    bool ids_only = false, show_pieces = false, no_bos = false, no_parse = false, replace = false;
    const char *prompt = NULL;
    const cli_arg_spec extra[] = {
        {"-p", "--prompt", CLI_ARG_STR, &prompt, "TEXT", "text to tokenize"},
        {"--ids-only", "--ids", CLI_ARG_BOOL, &ids_only, NULL, "print only the ids, as [1, 2, 3]"},
        {"--show-pieces", NULL, CLI_ARG_BOOL, &show_pieces, NULL, "also print each token's vocabulary string and type"},
        {"--no-bos", NULL, CLI_ARG_BOOL, &no_bos, NULL, "do not add BOS/EOS even when the vocabulary asks for them"},
        {"--no-parse-special", NULL, CLI_ARG_BOOL, &no_parse, NULL, "treat control-token text like <|im_end|> as plain text"},
        {"--replace-invalid", NULL, CLI_ARG_BOOL, &replace, NULL, "replace invalid UTF-8 bytes by U+FFFD instead of failing"},
    };
    const cli_args_def def = {"tokenize", "-m MODEL (-p TEXT | -f FILE) [options]",
                              "Prints the token ids of a text (also for vocab-only GGUF files).",
                              CLI_ARGS_MODEL | CLI_ARGS_FILE, extra, sizeof(extra) / sizeof(extra[0])};
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (!a.model) {
        fprintf(stderr, "hotmoe tokenize: -m MODEL is required\n");
        return 2;
    }
    if (prompt && a.file) {
        fprintf(stderr, "hotmoe tokenize: -p and -f both given; use one\n");
        return 2;
    }
    if (!prompt && !a.file) {
        fprintf(stderr, "hotmoe tokenize: give one of -p TEXT or -f FILE\n");
        return 2;
    }
    size_t len = 0;
    char *owned = NULL;
    const char *text = prompt;
    if (a.file) {
        owned = read_all(a.file, &len);
        if (!owned) {
            fprintf(stderr, "hotmoe tokenize: cannot read %s\n", a.file);
            return 1;
        }
        text = owned;
    } else {
        len = strlen(text);
    }
    hm_error err;
    gguf_ctx *g = NULL;
    tok_vocab *v = NULL;
    tok_ids ids = {0};
    rc = 1;
    if (gguf_open(a.model, &g, &err) != HM_OK) {
        fprintf(stderr, "hotmoe tokenize: %s: %s\n", a.model, err.msg);
        goto done;
    }
    if (tok_vocab_load(g, &v, &err) != HM_OK) {
        fprintf(stderr, "hotmoe tokenize: %s: %s\n", a.model, err.msg);
        goto done;
    }
    unsigned flags = (no_bos ? 0 : TOK_ENCODE_ADD_SPECIAL) | (no_parse ? 0 : TOK_ENCODE_PARSE_SPECIAL) |
                     (replace ? TOK_ENCODE_REPLACE_INVALID : 0);
    if (tok_encode(v, text, len, flags, &ids, &err) != HM_OK) {
        fprintf(stderr, "hotmoe tokenize: %s\n", err.msg);
        goto done;
    }
    if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < ids.n; i++) printf("%s%d", i ? ", " : "", ids.ids[i]);
        printf("]\n");
    } else {
        char *piece = NULL;
        size_t cap = 0;
        for (size_t i = 0; i < ids.n; i++) {
            size_t n = tok_token_piece(v, ids.ids[i], TOK_DECODE_SPECIAL, NULL, 0);
            if (n + 1 > cap) {
                char *p = realloc(piece, n + 1);
                if (!p) break;
                piece = p;
                cap = n + 1;
            }
            tok_token_piece(v, ids.ids[i], TOK_DECODE_SPECIAL, piece, cap);
            printf("%6d -> '", ids.ids[i]);
            print_escaped(piece, n);
            putchar('\'');
            if (show_pieces) {
                const char *raw = tok_token_text(v, ids.ids[i]);
                printf("  [");
                print_escaped(raw, strlen(raw));
                printf(", %s]", k_type_names[tok_token_type(v, ids.ids[i])]);
            }
            putchar('\n');
        }
        free(piece);
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    tok_ids_free(&ids);
    tok_vocab_free(v);
    if (g) gguf_close(g);
    free(owned);
    return rc;
}
