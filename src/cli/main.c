/* main.c - `hotmoe SUBCOMMAND ...`: finds the subcommand in the table and runs it. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

#define HOTMOE_VERSION "0.1.0"

static const cli_command k_commands[] = {
    {"forge", "write a GGUF model (and its HuggingFace copy) of a real MoE architecture", cmd_forge},
    {"convert", "convert a HuggingFace checkpoint folder (safetensors) to GGUF in any hotmoe type", cmd_convert},
    {"inspect", "describe any GGUF file: metadata, tensors, sizes per category and tier", cmd_inspect},
    {"tokenize", "print the token ids of a text (llama-tokenize); works on vocab-only GGUF files", cmd_tokenize},
    {"run", "generate text from a prompt, streaming it, with prompt/generation speeds", cmd_run},
    {"logits", "write the logits of a prompt (raw f32 + JSON header, or .npy) for comparisons", cmd_logits},
    {"chat", "interactive chat with the model's chat template (streaming, multi-turn)", cmd_chat},
    {"bench", "prompt (ppN) and generation (tgN) speed like llama-bench", cmd_bench},
    {"batched-bench", "several sequences decoded together (continuous batching), like llama-batched-bench", cmd_batched},
    {"perplexity", "perplexity of a text file, computed as llama-perplexity does", cmd_perplexity},
    {"learn", "run prompts with the expert usage tracer and write a learn file (per-layer expert hits)", cmd_learn},
    {"serve", "OpenAI-compatible HTTP server (chat, completions, streaming)", cmd_serve},
    {"plan", "print the hot cache's plan for a model and a learn file: experts per layer, bytes, expected hit rate (no GPU needed)", cmd_plan},
};

static void usage(FILE *f) {
    fprintf(f, "hotmoe %s - Mixture-of-Experts inference for GGUF models\n\n"
               "usage: hotmoe COMMAND [options]   (hotmoe COMMAND --help for its options)\n\n"
               "commands:\n", HOTMOE_VERSION);
    for (size_t i = 0; i < sizeof(k_commands) / sizeof(k_commands[0]); i++)
        fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("hotmoe %s\n", HOTMOE_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof(k_commands) / sizeof(k_commands[0]); i++)
        if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "hotmoe: unknown command '%s' (try 'hotmoe --help')\n", argv[1]);
    return 2;
}
