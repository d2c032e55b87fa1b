/* encode_cases.c - prints the ids of a text file and of each of its lines (one line of ids per
 * case, added/control tokens parsed, no BOS), for tools/tokenizer/check_forge_vocabs.sh.
 * usage: encode_cases MODEL.gguf TEXT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
int main(int argc, char **argv) {
    gguf_ctx *g; hm_error err; tok_vocab *v;
    if (gguf_open(argv[1], &g, &err) || tok_vocab_load(g, &v, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    FILE *f = fopen(argv[2], "rb"); static char t[1 << 20]; size_t n = fread(t, 1, sizeof t, f); fclose(f);
    unsigned flags = TOK_ENCODE_PARSE_SPECIAL;
    for (size_t i = 0, c = 0; i < n || c == 0; c++) {
        const char *s = c == 0 ? t : t + i; size_t len;
        if (c == 0) len = n; else { const char *nl = memchr(s, '\n', n - i); len = nl ? (size_t)(nl - s) + 1 : n - i; i += len; }
        tok_ids ids = {0};
        if (tok_encode(v, s, len, flags, &ids, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        for (size_t k = 0; k < ids.n; k++) printf(k ? " %d" : "%d", ids.ids[k]);
        printf("\n"); tok_ids_free(&ids);
        if (c > 0 && i >= n) break;
    }
    return 0;
}
