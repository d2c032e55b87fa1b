/* line_input.c - see line_input.h. With libedit (HOTMOE_HAVE_EDITLINE, cli/ only) its readline
 * serves a terminal: arrows, history, the usual key bindings. */
#include "cli/line_input.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#ifdef HOTMOE_HAVE_EDITLINE
#include <editline/readline.h>
#endif

static char *plain_line(const char *prompt, size_t *len) {
    if (prompt && isatty(STDIN_FILENO)) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got = getline(&line, &cap, stdin);
    if (got < 0) {
        free(line);
        return NULL;
    }
    size_t k = (size_t)got;
    while (k && (line[k - 1] == '\n' || line[k - 1] == '\r')) k--;
    line[k] = 0;
    *len = k;
    return line;
}

char *cli_line_read(const char *prompt, size_t *len) {
#ifdef HOTMOE_HAVE_EDITLINE
    if (isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)) {
        char *line = readline(prompt ? prompt : "");
        if (!line) return NULL;
        size_t k = strlen(line);
        while (k && (line[k - 1] == '\n' || line[k - 1] == '\r')) k--;
        line[k] = 0;
        *len = k;
        return line;
    }
#endif
    return plain_line(prompt, len);
}

void cli_line_history(const char *text) {
#ifdef HOTMOE_HAVE_EDITLINE
    if (text && *text && isatty(STDIN_FILENO)) add_history(text);
#else
    (void)text;
#endif
}
