/* commands.h - the `hotmoe` subcommands. Each returns the process exit status (0 ok, 1 error,
 * 2 usage error) and prints its own errors as one line "hotmoe CMD: message". */
#ifndef HM_CLI_COMMANDS_H
#define HM_CLI_COMMANDS_H

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
} cli_command;

int cmd_forge(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_batched(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_learn(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
