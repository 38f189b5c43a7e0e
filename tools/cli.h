/*
 * cli.h — helpers shared by the subcommands of the `mixkv` command (docs/cli.md): exit
 * statuses, prefixed messages, option matching, numbers parsed with range checks, and JSON
 * written to a file or stdout.
 *
 * Every subcommand is `int mkv_<name>_main(int argc, char **argv)` with argv[0] the
 * subcommand's name, and prints its help with `void mkv_<name>_usage(FILE *)`.
 */
#ifndef MKV_TOOLS_CLI_H
#define MKV_TOOLS_CLI_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>

/* Exit statuses, the same for every subcommand. */
enum {
    MKV_EXIT_OK = 0,    /* success; for a check: no problem found; for a diff: no difference */
    MKV_EXIT_FAIL = 1,  /* a check found a problem; a diff found a difference */
    MKV_EXIT_USAGE = 2, /* bad usage or input: unknown option, unreadable or malformed file */
};

/* Prints "mixkv <cmd>: <message>\n" to stderr ("mixkv: " when cmd is NULL). */
void mkv_cli_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* 1 when arg is -h or --help. */
int mkv_cli_is_help(const char *arg);

/* Matches argv[*i] against a long option `name` ("--slot"). Returns 0 when it is another
 * argument. For an option with a value (want_value = 1), accepts "--slot 3" (advancing *i)
 * and "--slot=3"; *value receives the text. For a flag (want_value = 0), accepts "--json"
 * (*value = NULL) and, when allow_inline is set, "--json=FILE" (*value = "FILE").
 * Returns 1 on a match, -1 (message printed) when a value is missing or not allowed. */
int mkv_cli_option(const char *cmd, int argc, char **argv, int *i, const char *name, int want_value,
                   int allow_inline, const char **value);

/* Parse a whole decimal integer / a finite number in [lo, hi]. On failure print
 * "mixkv <cmd>: <what>: ..." and return -1; 0 on success. */
int mkv_cli_parse_i64(const char *cmd, const char *what, const char *text, int64_t lo, int64_t hi,
                      int64_t *out);
int mkv_cli_parse_i32(const char *cmd, const char *what, const char *text, int32_t lo, int32_t hi,
                      int32_t *out);
int mkv_cli_parse_double(const char *cmd, const char *what, const char *text, double lo, double hi,
                         double *out);

/* A comma-separated list of numbers in [lo, hi] (whole numbers when `integer`), at most max of
 * them, into out[*n]. On failure (an empty list or item, a value out of range, too many)
 * print "mixkv <cmd>: <what>: ..." and return -1; 0 on success. */
int mkv_cli_parse_list(const char *cmd, const char *what, const char *text, double lo, double hi,
                       int integer, int32_t max, double *out, int32_t *n);

/* Writes root, formatted, with a trailing newline, to path ("-" or NULL: stdout).
 * Prints a message and returns -1 on failure. */
int mkv_cli_write_json(const char *cmd, const cJSON *root, const char *path);

/* Checks, before the work starts, that a result file can be written (path "-" or NULL:
 * stdout, always fine): opens it for appending and closes it, removing it again when it did
 * not exist. Prints "<what>: cannot open ..." and returns -1 on failure. */
int mkv_cli_check_writable(const char *cmd, const char *what, const char *path);

/* Reads a whole file ("-": standard input) into a malloc'ed, NUL-terminated buffer; *len
 * its length. Prints a message and returns NULL on failure (a directory included). */
char *mkv_cli_read_file(const char *cmd, const char *path, size_t *len);

/* cJSON helpers that keep int64 values exact (cJSON stores numbers as double). */
cJSON *mkv_cli_json_i64(int64_t v);
void mkv_cli_json_add_i64(cJSON *obj, const char *key, int64_t v);
/* An array of int32 values (an empty array for n == 0). */
cJSON *mkv_cli_json_ids(const int32_t *ids, int64_t n);

/* Subcommands. */
int mkv_inspect_main(int argc, char **argv);
void mkv_inspect_usage(FILE *f);
int mkv_bench_main(int argc, char **argv);
void mkv_bench_usage(FILE *f);
int mkv_generate_main(int argc, char **argv);
void mkv_generate_usage(FILE *f);
int mkv_perplexity_main(int argc, char **argv);
void mkv_perplexity_usage(FILE *f);
int mkv_serve_bench_main(int argc, char **argv);
void mkv_serve_bench_usage(FILE *f);
int mkv_needle_main(int argc, char **argv);
int mkv_calibrate_main(int argc, char **argv);
void mkv_calibrate_usage(FILE *f);
void mkv_needle_usage(FILE *f);

#endif /* MKV_TOOLS_CLI_H */
