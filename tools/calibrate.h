/*
 * calibrate.h — inside `mixkv calibrate`: its options, shared by the command (calibrate.c:
 * parsing, the run, saving) and its reports (calibrate_report.c: the table, the JSON, the
 * plot).
 */
#ifndef MKV_TOOLS_CALIBRATE_H
#define MKV_TOOLS_CALIBRATE_H

#include "calib/calib.h"
#include "calib/grid.h"
#include "tools/docs.h"
#include "tools/model_opts.h"

#include <cjson/cJSON.h>
#include <stdio.h>

typedef struct cal_opts {
    const char *model, *data, *json_path, *policy_out, *plot_path, *resume_path;
    int32_t window, prompt_len, calib_windows, valid_windows, windows_per_doc, workers, max_checks;
    double max_ppl_increase, min_agreement; /* fractions */
    int quiet;
    mkv_policy_t base;          /* every point's settings outside the grid */
    mkv_run_opts_t run;         /* --backend, --dtype */
    mkv_calib_grid_t grid;
    int swept[MKV_CALIB_SETTINGS]; /* given on the command line */
    /* --needle: */
    int needle;
    const char *haystack;       /* NULL: the --data documents */
    mkv_needle_opts_t trials;   /* no lengths given: the window (within the positions) */
    double max_needle_drop;     /* a fraction; 1: no constraint */
    int needle_drop_given;
    const char *needle_option;  /* the first needle option given (for the message without --needle) */
} cal_opts_t;

/* The results: a table, the JSON (schema mixkv-calibrate), the SVG of the trade-off. chat is
 * the needle prompts' template. */
void mkv_calibrate_print_table(FILE *f, const cal_opts_t *o, const mkv_calib_point_t *pts, int32_t n,
                               const mkv_calib_quality_t *ref, const mkv_calib_result_t *r);
cJSON *mkv_calibrate_json(const cal_opts_t *o, const mkv_docs_t *docs, const mkv_calib_point_t *pts,
                          int32_t n, const mkv_calib_quality_t *ref, const mkv_calib_result_t *r,
                          mkv_chat_template_t chat);
/* The needle trials' settings (haystack, lengths, depths, trials, max_new, seed), for the JSON
 * and the state file's run header. */
cJSON *mkv_calibrate_needle_json(const cal_opts_t *o);
int mkv_calibrate_plot(const cal_opts_t *o, const mkv_calib_point_t *pts, int32_t n,
                       const mkv_calib_result_t *r);

#endif /* MKV_TOOLS_CALIBRATE_H */
