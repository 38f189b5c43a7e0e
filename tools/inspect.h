/*
 * inspect.h — the parts of `mixkv inspect` shared between inspect.c (one dump: check,
 * summary, report), inspect_diff.c (comparison of two dumps) and inspect_tp.c (the dumps of a
 * tensor-parallel run, one per GPU).
 */
#ifndef MKV_TOOLS_INSPECT_H
#define MKV_TOOLS_INSPECT_H

#include "memmgr/dump.h"
#include "mixkv.h"

#include <cjson/cJSON.h>
#include <stdint.h>

/* a + b, saturating at the int64 range (sums over dumps as written, before any check). */
static inline int64_t mkv_sat_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? (b < 0 ? INT64_MIN : INT64_MAX) : r;
}

/* Memory use of one slot or of a whole dump (definitions in docs/cli.md). The sums saturate
 * at the int64 range: they run over a dump as written, before any check. */
typedef struct mkv_usage_sum {
    int64_t seq_len, reserved;
    int64_t tokens_hi, tokens_lo, tokens_seen, tokens_pruned;
    int64_t pages_hi, pages_lo, bytes, bytes_fp16;
} mkv_usage_sum_t;

typedef struct mkv_summary {
    mkv_usage_sum_t all;
    int64_t free_pages, available_pages, used_pages;
    mkv_usage_sum_t *slots; /* [d->n_slots], in the dump's slot order */
} mkv_summary_t;

/* The violations found in one dump, as listed (--max-violations) and counted. */
typedef struct mkv_collected {
    mkv_violation_t *list;      /* [n_listed] */
    int64_t n_listed, cap, max; /* max 0: no limit */
    int64_t count;              /* all that matched the filter */
    int64_t elsewhere;          /* violations outside the --slot filter */
    int32_t slot;               /* filter: -1 none */
    int oom;
} mkv_collected_t;

/* One dump, read, checked and summarised. */
typedef struct mkv_inspected {
    const char *path;
    mkv_dump_t d;
    mkv_summary_t s;
    mkv_collected_t c;
} mkv_inspected_t;

/* Reads the dump at path, checks it (violations filtered by only_slot, -1: none) and
 * summarises it. Returns MKV_EXIT_OK, or MKV_EXIT_USAGE with the message printed (unreadable
 * or malformed file, out of memory). *out is safe to release either way. */
int mkv_inspect_read(const char *path, int32_t only_slot, int64_t max_violations,
                     mkv_inspected_t *out);
void mkv_inspect_release(mkv_inspected_t *in);

/* 1 when slot is one of the dump's active slots. */
int mkv_inspect_slot_active(const mkv_dump_t *d, int32_t slot);

/* The report of one dump: text on stdout, or a JSON object. first_head is the global number
 * of the dump's KV head 0 in a tensor-parallel set (text rows of --slot are numbered
 * globally, JSON rows gain "global_head"), or -1 for a dump on its own. */
void mkv_inspect_print_report(const mkv_inspected_t *in, int32_t only_slot, int64_t first_head);
cJSON *mkv_inspect_report_json(const mkv_inspected_t *in, int32_t only_slot, int64_t first_head);

/* Pieces of the report, for the total of a tensor-parallel set. */
void mkv_usage_add(mkv_usage_sum_t *into, const mkv_usage_sum_t *u); /* all but seq_len */
void mkv_inspect_print_usage(const mkv_usage_sum_t *a); /* the pages, tokens, bytes lines */
void mkv_inspect_print_slot_header(void);
void mkv_inspect_print_slot_line(int32_t slot, const mkv_usage_sum_t *u);
cJSON *mkv_inspect_usage_json(const mkv_usage_sum_t *u, int32_t slot); /* slot -1: a total */

/* `mixkv inspect --diff A B`: prints what changed from dump A to dump B (text on stdout, or
 * JSON on stdout when json is set and json_path is NULL, or text plus JSON into json_path).
 * Returns the exit status: 0 identical, 1 different, 2 bad input. */
int mkv_inspect_diff(const char *path_a, const char *path_b, int json, const char *json_path);

/* `mixkv inspect A B ...` (n >= 2) or `--tp X.json` (n >= 1): the dumps of a tensor-parallel
 * run in rank order, each checked and reported as a dump on its own, then checked against
 * each other and totalled. Returns the exit status: 0 all consistent, 1 a violation in a rank
 * or a mismatch between ranks, 2 bad usage or an unreadable file. */
int mkv_inspect_tp(const char *const *paths, int n, int32_t only_slot, int json,
                   const char *json_path, int64_t max_violations);

/* The files of `--tp X.json`: X.rank0.json, X.rank1.json, ... as long as they exist (".json"
 * is appended when X does not end with it). Returns a malloc'ed array of malloc'ed names and
 * its length in *n, or NULL with a message printed when X.rank0.json does not exist or memory
 * runs out. */
char **mkv_inspect_tp_files(const char *base, int *n);

#endif /* MKV_TOOLS_INSPECT_H */
