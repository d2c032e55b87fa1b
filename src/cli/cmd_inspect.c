/* Placeholder while the inspect command is being written in this session; replaced before landing. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_inspect(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "hotmoe inspect: unavailable in this build\n");
    return 1;
}
