/* line_input.h - one line of input for `hotmoe chat`: on a terminal with libedit (line editing,
 * history), else a plain read of stdin (scripts, pipes, builds without libedit). */
#ifndef HM_CLI_LINE_INPUT_H
#define HM_CLI_LINE_INPUT_H

#include <stdbool.h>
#include <stddef.h>

/* The next line without its line end, malloc'd (*len its length), or NULL at end of input (or
 * a Ctrl-C at the prompt). prompt is shown on a terminal only. */
char *cli_line_read(const char *prompt, size_t *len);
/* Adds a finished message to the history (a terminal with libedit; else nothing). */
void cli_line_history(const char *text);

#endif
