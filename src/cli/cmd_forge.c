/* Placeholder while the forge command is being written in this session; replaced before landing. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_forge(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "hotmoe forge: unavailable in this build\n");
    return 1;
}
