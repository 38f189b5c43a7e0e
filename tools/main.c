/*
 * main.c — the `mixkv` command: dispatches to subcommands (docs/cli.md).
 *
 * Exit statuses are shared by every subcommand: 0 success, 1 a check failed (or a diff found
 * differences), 2 bad usage or input.
 */
#include "mixkv.h"
#include "tools/cli.h"

#include <stdio.h>
#include <string.h>

typedef struct command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
    void (*usage)(FILE *f);
} command_t;

static const command_t g_commands[] = {
    {"bench", "compare mixkv with the FP16 paged baseline on a synthetic workload", mkv_bench_main,
     mkv_bench_usage},
    {"calibrate", "choose alpha_h / alpha_l for a model on a dataset: sweep, Pareto front, check",
     mkv_calibrate_main, mkv_calibrate_usage},
    {"generate", "generate text with a Llama-family model through the mixkv cache",
     mkv_generate_main, mkv_generate_usage},
    {"inspect", "check, summarise and diff cache dumps (mkv_cache_dump_json)", mkv_inspect_main,
     mkv_inspect_usage},
    {"needle", "needle-in-a-haystack retrieval, FP16 baseline and mixkv, over lengths and depths",
     mkv_needle_main, mkv_needle_usage},
    {"perplexity", "perplexity of a model on texts, FP16 baseline and mixkv in one run",
     mkv_perplexity_main, mkv_perplexity_usage},
    {"serve-bench", "serving throughput, FP16 baseline and mixkv with the same KV memory",
     mkv_serve_bench_main, mkv_serve_bench_usage},
};
#define N_COMMANDS (sizeof g_commands / sizeof g_commands[0])

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv COMMAND [OPTIONS] [ARGS]\n"
            "       mixkv --help | --version\n"
            "       mixkv help COMMAND\n"
            "\n"
            "mixkv %s: a mixed-precision KV cache for LLM inference.\n"
            "\n"
            "commands:\n",
            mkv_version());
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-12s %s\n", g_commands[i].name, g_commands[i].summary);
    fputs("\nexit status: 0 success, 1 a check failed or a diff found differences, "
          "2 bad usage or input.\nRun 'mixkv help COMMAND' or 'mixkv COMMAND --help' for a "
          "command's options.\n",
          f);
}

static const command_t *find(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(g_commands[i].name, name) == 0) return &g_commands[i];
    return NULL;
}

/* Explains why `name` is not a command; returns the usage exit status. */
static int unknown(const char *name)
{
    mkv_cli_error(NULL, "unknown command '%s' (see 'mixkv --help')", name);
    return MKV_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return MKV_EXIT_USAGE;
    }
    const char *arg = argv[1];
    if (mkv_cli_is_help(arg)) {
        usage(stdout);
        return MKV_EXIT_OK;
    }
    if (strcmp(arg, "--version") == 0 || strcmp(arg, "-V") == 0) {
        printf("mixkv %s\n", mkv_version());
        return MKV_EXIT_OK;
    }
    if (strcmp(arg, "help") == 0) {
        if (argc == 2) {
            usage(stdout);
            return MKV_EXIT_OK;
        }
        if (argc > 3) {
            mkv_cli_error(NULL, "help takes one command name");
            return MKV_EXIT_USAGE;
        }
        const command_t *cmd = find(argv[2]);
        if (!cmd) return unknown(argv[2]);
        cmd->usage(stdout);
        return MKV_EXIT_OK;
    }
    if (arg[0] == '-') {
        mkv_cli_error(NULL, "unknown option '%s' (see 'mixkv --help')", arg);
        return MKV_EXIT_USAGE;
    }
    const command_t *cmd = find(arg);
    if (!cmd) return unknown(arg);
    return cmd->run(argc - 1, argv + 1);
}
