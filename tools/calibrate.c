/*
 * calibrate.c — `mixkv calibrate`: sweeps a grid of policies (alpha_h x alpha_l by default,
 * DiffKV's ranges; optionally recent windows, formats and group sizes) over calibration
 * windows of a dataset, against the FP16 cache on the same windows (calib/calib.h), finds the
 * Pareto front of memory against perplexity increase, chooses the cheapest point within the
 * tolerance, checks it on held-back validation windows, and writes the results: a table, JSON
 * (schema mixkv-calibrate), a policy file for the other commands' --policy, and an SVG of the
 * trade-off. A sweep saves every finished point to a state file (--resume) and stops cleanly
 * on Ctrl-C, so a long one can be resumed.
 */
#include "calib/calib.h"
#include "calib/grid.h"
#include "calib/state.h"
#include "runner/tokenizer.h"
#include "tools/cli.h"
#include "tools/docs.h"
#include "tools/model_opts.h"
#include "tools/svg.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CMD "calibrate"

typedef struct cal_opts {
    const char *model, *data, *json_path, *policy_out, *plot_path, *resume_path;
    int32_t window, prompt_len, calib_windows, valid_windows, windows_per_doc, workers, max_checks;
    double max_ppl_increase, min_agreement; /* fractions */
    int quiet;
    mkv_policy_t base;          /* every point's settings outside the grid */
    mkv_calib_grid_t grid;
    int swept[MKV_CALIB_SETTINGS]; /* given on the command line */
} cal_opts_t;

void mkv_calibrate_usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv calibrate --model PATH --data FILE|DIR|- [OPTIONS]\n"
            "\n"
            "Calibrates the thresholds alpha_h and alpha_l (and, if asked, the recent window,\n"
            "the formats and the quantization group size) for a model on a dataset, as DiffKV\n"
            "does (section 7): every point of the grid runs over the same calibration windows as\n"
            "the FP16 cache (computed once), and is scored by its memory ratio to FP16, its\n"
            "perplexity increase and its greedy agreement. The Pareto front of memory against\n"
            "perplexity increase is found, the point with the least memory within\n"
            "--max-ppl-increase is chosen and checked on held-back validation windows (the next\n"
            "candidate, cheapest first, when it fails there; at most --max-checks).\n"
            "\n"
            "Grid (lists: comma-separated values and ranges START:STOP:STEP, e.g. 0:5:1,8):\n"
            "  --alpha-h LIST      [0:5:1]\n"
            "  --alpha-l LIST      [0:0.1:0.02]; pairs with alpha_l > alpha_h are skipped\n"
            "  --recent-window LIST, --hi-format LIST, --lo-format LIST, --group-size LIST\n"
            "                      [the base policy's one value]\n"
            "Base policy (every point's other settings): --policy FILE and the single-valued\n"
            "options of 'mixkv generate' (--obs-window, --hi-key-group, ...).\n"
            "\n"
            "Windows:\n"
            "  --window N          tokens per window [min(512, the model's positions) - 1]\n"
            "  --prompt-len P      prompt-phase tokens per window [window / 4]\n"
            "  --calib-windows N   windows every point runs [16]\n"
            "  --valid-windows N   held-back windows after them, for the check (0: none) [8]\n"
            "  --windows-per-doc N at most N windows of each document, 0: all [0]\n"
            "Choice:\n"
            "  --max-ppl-increase PCT  the tolerance, perplexity increase in percent [1]\n"
            "  --min-agreement PCT also require this greedy agreement with FP16 (0: no) [0]\n"
            "  --max-checks N      candidates tried on the validation windows [3]\n"
            "Output:\n"
            "  --json FILE         every point, the front, the choice and its per-head mix\n"
            "                      (schema mixkv-calibrate; '-': stdout)\n"
            "  --policy-out FILE   the chosen policy, for --policy of generate, perplexity,\n"
            "                      needle, bench and serve-bench (written only when a point\n"
            "                      passed its check, or without validation windows)\n"
            "  --plot FILE.svg     memory ratio against perplexity increase, front and choice\n"
            "  --resume FILE       save each finished point to FILE and restore those already\n"
            "                      there (the same run only): Ctrl-C stops, rerunning resumes\n"
            "  --workers N         points measured at once, each on one core [one per core]\n"
            "  --quiet             no progress line\n"
            "  -h, --help          this help\n"
            "\n"
            "exit status: 0 a point was chosen and passed its check; 1 none within the tolerance,\n"
            "none passed, interrupted, or a run failed; 2 bad usage or input.\n");
}

/* A percentage ("1", "1%", "0.5") as a fraction. */
static int parse_pct(const char *what, const char *v, double *out)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    const size_t n = strlen(buf);
    if (n > 0 && buf[n - 1] == '%') buf[n - 1] = '\0';
    double x;
    if (mkv_cli_parse_double(CMD, what, buf, 0.0, 100.0, &x) < 0) return -1;
    *out = x / 100.0;
    return 0;
}

static int parse(int argc, char **argv, cal_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        int m, s;
        char err[MKV_ERR_LEN];
        if (mkv_cli_is_help(argv[i])) {
            mkv_calibrate_usage(stdout);
            return 1;
        }
        /* The grid: the policy's own option names, given lists. */
        if ((s = mkv_policy_opts_is_sweepable(argv[i])) >= 0) {
            char name[40];
            snprintf(name, sizeof name, "--%s", mkv_calib_setting_name((mkv_calib_setting_t)s));
            if (mkv_cli_option(CMD, argc, argv, &i, name, 1, 0, &v) < 0) return -1;
            if (mkv_calib_grid_parse(&o->grid, (mkv_calib_setting_t)s, v, err) != MKV_STATUS_OK) {
                mkv_cli_error(CMD, "%s", err);
                return -1;
            }
            o->swept[s] = 1;
            continue;
        }
        if ((m = mkv_policy_opts_parse(CMD, argc, argv, &i, &o->base)) != 0) {
            if (m < 0) return -1;
            continue;
        }
#define STR_OPT(name, field)                                                                   \
    if ((m = mkv_cli_option(CMD, argc, argv, &i, name, 1, 0, &v)) != 0) {                      \
        if (m < 0) return -1;                                                                  \
        o->field = v;                                                                          \
        continue;                                                                              \
    }
#define I32_OPT(name, field, lo, hi)                                                           \
    if ((m = mkv_cli_option(CMD, argc, argv, &i, name, 1, 0, &v)) != 0) {                      \
        if (m < 0 || mkv_cli_parse_i32(CMD, name, v, lo, hi, &o->field) < 0) return -1;        \
        continue;                                                                              \
    }
        STR_OPT("--model", model)
        STR_OPT("--data", data)
        STR_OPT("--json", json_path)
        STR_OPT("--policy-out", policy_out)
        STR_OPT("--plot", plot_path)
        STR_OPT("--resume", resume_path)
        I32_OPT("--windows-per-doc", windows_per_doc, 0, 1 << 30)
        I32_OPT("--window", window, 2, 1 << 20)
        I32_OPT("--prompt-len", prompt_len, 1, 1 << 20)
        I32_OPT("--calib-windows", calib_windows, 1, 1 << 20)
        I32_OPT("--valid-windows", valid_windows, 0, 1 << 20)
        I32_OPT("--workers", workers, 1, 256)
        I32_OPT("--max-checks", max_checks, 1, MKV_CALIB_MAX_CHECKS)
#undef STR_OPT
#undef I32_OPT
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--max-ppl-increase", 1, 0, &v)) != 0) {
            if (m < 0 || parse_pct("--max-ppl-increase", v, &o->max_ppl_increase) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--min-agreement", 1, 0, &v)) != 0) {
            if (m < 0 || parse_pct("--min-agreement", v, &o->min_agreement) < 0) return -1;
            continue;
        }
        if (!strcmp(argv[i], "--quiet")) {
            o->quiet = 1;
            continue;
        }
        mkv_cli_error(CMD, "unknown argument '%s' (see 'mixkv calibrate --help')", argv[i]);
        return -1;
    }
    if (!o->model || !o->data) {
        mkv_cli_error(CMD, "--model PATH and --data FILE|DIR|- are required");
        return -1;
    }
    if (mkv_cli_check_writable(CMD, "--json", o->json_path) < 0 ||
        mkv_cli_check_writable(CMD, "--policy-out", o->policy_out) < 0 ||
        mkv_cli_check_writable(CMD, "--plot", o->plot_path) < 0)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Progress, interruption, saving                                                           */
/* ---------------------------------------------------------------------------------------- */

static volatile sig_atomic_t g_interrupted;
static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_interrupted = 1;
    g_stop = 1;
}

typedef struct run_ctx {
    const cal_opts_t *o;
    int32_t points_total, points_done;
    mkv_calib_state_t *state;
    int tty;
} run_ctx_t;

static void progress(void *ctx, const char *phase, int64_t done, int64_t total, double eta)
{
    run_ctx_t *r = ctx;
    if (r->o->quiet) return;
    if (!r->tty && done != total && done % (total / 10 > 0 ? total / 10 : 1) != 0) return;
    char left[32] = "?";
    if (!isnan(eta)) {
        const long t = (long)(eta + 0.5);
        if (t >= 3600) snprintf(left, sizeof left, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
        else snprintf(left, sizeof left, "%ld:%02ld", t / 60, t % 60);
    }
    fprintf(stderr, "%s%s: %lld/%lld windows, %d/%d points done, ETA %s%s", r->tty ? "\r" : "",
            phase, (long long)done, (long long)total, r->points_done, r->points_total, left,
            r->tty ? "   " : "\n");
    if (r->tty && done == total) fputc('\n', stderr);
}

static int point_done(void *ctx, const mkv_calib_point_t *p, int32_t index)
{
    run_ctx_t *r = ctx;
    (void)index;
    r->points_done++;
    if (!r->state) return 0;
    char err[MKV_ERR_LEN];
    if (mkv_calib_state_add(r->state, p, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        return 1; /* stop: a point that cannot be saved would be lost on an interruption */
    }
    return 0;
}

/* What makes a state file's points comparable with this run's: the settings that change
 * what a point measures on the calibration windows. */
static cJSON *run_key(const cal_opts_t *o)
{
    cJSON *k = cJSON_CreateObject();
    cJSON_AddStringToObject(k, "model", o->model);
    cJSON_AddStringToObject(k, "data", o->data);
    cJSON_AddNumberToObject(k, "window", o->window);
    cJSON_AddNumberToObject(k, "prompt_len", o->prompt_len);
    cJSON_AddNumberToObject(k, "calib_windows", o->calib_windows);
    cJSON_AddNumberToObject(k, "windows_per_doc", o->windows_per_doc);
    cJSON_AddStringToObject(k, "mixkv_version", mkv_version());
    return k;
}

/* ---------------------------------------------------------------------------------------- */
/* Reporting                                                                                */
/* ---------------------------------------------------------------------------------------- */

static void print_table(FILE *f, const cal_opts_t *o, const mkv_calib_point_t *pts, int32_t n,
                        const mkv_calib_quality_t *ref, const mkv_calib_result_t *r)
{
    fprintf(f, "\ncalibrate: %d points on %d windows of %d tokens (%d prompt); FP16 perplexity %.4f, "
               "tolerance +%.2f%%\n\n", n, o->calib_windows, o->window, o->prompt_len, ref->ppl,
            100.0 * o->max_ppl_increase);
    fprintf(f, "     %-40s %8s %9s %9s %7s %7s %7s\n", "policy", "memory", "ppl", "agree", "high",
            "low", "pruned");
    for (int32_t i = 0; i < n; i++) {
        const mkv_calib_point_t *p = &pts[i];
        char label[160];
        mkv_policy_label(&p->policy, label, sizeof label);
        const char mark = i == r->chosen ? '>' : p->on_front ? '*' : ' ';
        if (!p->done) {
            fprintf(f, "  %c  %-40s %8s\n", mark, label, "(not run)");
            continue;
        }
        fprintf(f, "  %c  %-40s %8.3f %+8.2f%% %8.2f%% %6.1f%% %6.1f%% %6.1f%%\n", mark, label,
                p->q.memory_ratio, 100.0 * p->q.ppl_increase, 100.0 * p->q.agreement,
                100.0 * p->q.frac_hi, 100.0 * p->q.frac_lo, 100.0 * p->q.frac_pruned);
    }
    fprintf(f, "\n(* on the Pareto front of memory ratio and perplexity increase, > chosen; memory: "
               "bytes in use over a plain FP16 cache's; FP16's own paged cache: %.3f)\n",
            ref->memory_ratio);
    fprintf(f, "%d of %d points within the tolerance on the calibration windows\n", r->n_candidates, n);
    for (int32_t k = 0; k < r->n_checks; k++) {
        const mkv_calib_check_t *c = &r->checks[k];
        char label[160];
        mkv_policy_label(&pts[c->point].policy, label, sizeof label);
        fprintf(f, "validation check %d: %s: memory %.3f, perplexity %+.2f%% (FP16 %.4f), agreement "
                   "%.2f%%: %s\n", k + 1, label, c->valid.memory_ratio, 100.0 * c->valid.ppl_increase,
                c->valid.ppl_ref, 100.0 * c->valid.agreement, c->passed ? "passed" : "failed");
    }
    if (r->chosen >= 0) {
        const mkv_calib_point_t *c = &pts[r->chosen];
        char label[160];
        mkv_policy_label(&c->policy, label, sizeof label);
        fprintf(f, "chosen: %s: %.2fx smaller than FP16, perplexity %+.2f%%%s\n", label,
                1.0 / c->q.memory_ratio, 100.0 * c->q.ppl_increase,
                r->validated ? ", validated" : o->valid_windows == 0 ? " (no validation windows)"
                                                                     : ", NOT validated");
    } else {
        fprintf(f, "no point stays within +%.2f%%: widen the grid (lower alphas) or the tolerance\n",
                100.0 * o->max_ppl_increase);
    }
}

static cJSON *point_json(const mkv_calib_point_t *p, int32_t index)
{
    cJSON *o = cJSON_CreateObject();
    char label[160];
    mkv_policy_label(&p->policy, label, sizeof label);
    cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddStringToObject(o, "label", label);
    cJSON *pol = cJSON_AddObjectToObject(o, "policy");
    mkv_policy_to_json(&p->policy, pol);
    cJSON_AddBoolToObject(o, "done", p->done);
    cJSON_AddBoolToObject(o, "on_front", p->on_front);
    if (p->done) cJSON_AddItemToObject(o, "calibration", mkv_calib_quality_json(&p->q));
    else cJSON_AddNullToObject(o, "calibration");
    return o;
}

static cJSON *result_json(const cal_opts_t *o, const mkv_docs_t *docs, const mkv_calib_point_t *pts,
                          int32_t n, const mkv_calib_quality_t *ref, const mkv_calib_result_t *r)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "schema", "mixkv-calibrate");
    cJSON_AddNumberToObject(root, "schema_version", 1);
    cJSON_AddStringToObject(root, "mixkv_version", mkv_version());
    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddStringToObject(root, "data", o->data);
    cJSON_AddNumberToObject(root, "documents", docs->n);
    cJSON_AddNumberToObject(root, "window", o->window);
    cJSON_AddNumberToObject(root, "prompt_len", o->prompt_len);
    cJSON_AddNumberToObject(root, "calibration_windows", o->calib_windows);
    cJSON_AddNumberToObject(root, "validation_windows", o->valid_windows);
    cJSON_AddNumberToObject(root, "max_ppl_increase", o->max_ppl_increase);
    cJSON_AddNumberToObject(root, "min_agreement", o->min_agreement);
    cJSON *grid = cJSON_AddObjectToObject(root, "grid");
    for (int s = 0; s < MKV_CALIB_SETTINGS; s++) {
        if (o->grid.n[s] == 0) continue;
        cJSON *a = cJSON_AddArrayToObject(grid, mkv_calib_setting_name((mkv_calib_setting_t)s));
        for (int32_t k = 0; k < o->grid.n[s]; k++)
            cJSON_AddItemToArray(a, s == MKV_CALIB_HI_FORMAT || s == MKV_CALIB_LO_FORMAT
                                        ? cJSON_CreateString(mkv_format_name((mkv_format_t)(int)o->grid.value[s][k]))
                                        : cJSON_CreateNumber(o->grid.value[s][k]));
    }
    cJSON *base = cJSON_AddObjectToObject(root, "base_policy");
    mkv_policy_to_json(&o->base, base);
    cJSON_AddItemToObject(root, "fp16", mkv_calib_quality_json(ref));
    cJSON *ps = cJSON_AddArrayToObject(root, "points");
    for (int32_t i = 0; i < n; i++) cJSON_AddItemToArray(ps, point_json(&pts[i], i));
    cJSON *front = cJSON_AddArrayToObject(root, "front");
    for (int32_t k = 0; k < r->n_front; k++) cJSON_AddItemToArray(front, cJSON_CreateNumber(r->front[k]));
    cJSON_AddNumberToObject(root, "candidates", r->n_candidates);
    cJSON *checks = cJSON_AddArrayToObject(root, "checks");
    for (int32_t k = 0; k < r->n_checks; k++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "point", r->checks[k].point);
        cJSON_AddItemToObject(c, "validation", mkv_calib_quality_json(&r->checks[k].valid));
        cJSON_AddBoolToObject(c, "passed", r->checks[k].passed);
        cJSON_AddItemToArray(checks, c);
    }
    if (r->chosen < 0) {
        cJSON_AddNullToObject(root, "choice");
        return root;
    }
    cJSON *ch = cJSON_AddObjectToObject(root, "choice");
    cJSON_AddNumberToObject(ch, "point", r->chosen);
    cJSON_AddBoolToObject(ch, "validated", r->validated);
    cJSON *pol = cJSON_AddObjectToObject(ch, "policy");
    mkv_policy_to_json(&pts[r->chosen].policy, pol);
    cJSON_AddItemToObject(ch, "calibration", mkv_calib_quality_json(&pts[r->chosen].q));
    for (int32_t k = 0; k < r->n_checks; k++)
        if (r->checks[k].point == r->chosen)
            cJSON_AddItemToObject(ch, "validation", mkv_calib_quality_json(&r->checks[k].valid));
    /* Per layer, per KV head: the mix at the choice. */
    const mkv_calib_heads_t *h = &r->heads;
    cJSON_AddStringToObject(ch, "heads_measured_on", o->valid_windows > 0 ? "validation" : "calibration");
    cJSON *layers = cJSON_AddArrayToObject(ch, "layers");
    for (int32_t l = 0; l < h->L; l++) {
        cJSON *lj = cJSON_CreateObject();
        double hi = 0, lo = 0, pr = 0;
        cJSON *heads = cJSON_CreateArray();
        for (int32_t k = 0; k < h->H; k++) {
            const int64_t x = (int64_t)l * h->H + k;
            cJSON *hj = cJSON_CreateObject();
            cJSON_AddNumberToObject(hj, "head", k);
            cJSON_AddNumberToObject(hj, "fraction_high", h->hi[x]);
            cJSON_AddNumberToObject(hj, "fraction_low", h->lo[x]);
            cJSON_AddNumberToObject(hj, "fraction_pruned", h->pruned[x]);
            cJSON_AddItemToArray(heads, hj);
            hi += h->hi[x], lo += h->lo[x], pr += h->pruned[x];
        }
        cJSON_AddNumberToObject(lj, "layer", l);
        cJSON_AddNumberToObject(lj, "fraction_high", hi / h->H);
        cJSON_AddNumberToObject(lj, "fraction_low", lo / h->H);
        cJSON_AddNumberToObject(lj, "fraction_pruned", pr / h->H);
        cJSON_AddItemToObject(lj, "heads", heads);
        cJSON_AddItemToArray(layers, lj);
    }
    return root;
}

/* The trade-off: memory ratio (x) against perplexity increase in percent (y); every point
 * grey, the front joined in blue, the tolerance dashed, the choice ringed in red. */
static int write_plot(const cal_opts_t *o, const mkv_calib_point_t *pts, int32_t n,
                      const mkv_calib_result_t *r)
{
    double xmin = 1e9, xmax = -1e9, ymin = 0, ymax = 100.0 * o->max_ppl_increase;
    for (int32_t i = 0; i < n; i++) {
        if (!pts[i].done) continue;
        const double x = pts[i].q.memory_ratio, y = 100.0 * pts[i].q.ppl_increase;
        xmin = x < xmin ? x : xmin, xmax = x > xmax ? x : xmax;
        ymin = y < ymin ? y : ymin, ymax = y > ymax ? y : ymax;
    }
    if (xmin > xmax) xmin = 0, xmax = 1;
    const double xpad = 0.05 * (xmax - xmin + 1e-3), ypad = 0.05 * (ymax - ymin + 1e-3);
    mkv_svg_t svg;
    if (mkv_svg_open(&svg, CMD, o->plot_path, 720, 480) < 0) return -1;
    char title[256];
    const char *slash = strrchr(o->model, '/');
    snprintf(title, sizeof title, "%s: memory vs perplexity increase (%d windows of %d)",
             slash && slash[1] ? slash + 1 : o->model, o->calib_windows, o->window);
    mkv_svg_panel(&svg, 80, 50, 600, 360, xmin - xpad, xmax + xpad, ymin - ypad, ymax + ypad, title);
    mkv_svg_xticks(&svg, 5);
    mkv_svg_yticks(&svg, 5);
    mkv_svg_axis_titles(&svg, "KV memory, ratio to a plain FP16 cache", "perplexity increase (%)");
    mkv_svg_hline(&svg, 100.0 * o->max_ppl_increase, "#2ca02c", 1);
    mkv_svg_hline(&svg, 0.0, "#bbb", 0);
    for (int32_t i = 0; i < n; i++)
        if (pts[i].done && !pts[i].on_front)
            mkv_svg_circle(&svg, pts[i].q.memory_ratio, 100.0 * pts[i].q.ppl_increase, 3, "#999", "none");
    double *fx = malloc((size_t)(r->n_front > 0 ? r->n_front : 1) * sizeof *fx);
    double *fy = malloc((size_t)(r->n_front > 0 ? r->n_front : 1) * sizeof *fy);
    if (fx && fy) {
        for (int32_t k = 0; k < r->n_front; k++) {
            fx[k] = pts[r->front[k]].q.memory_ratio;
            fy[k] = 100.0 * pts[r->front[k]].q.ppl_increase;
        }
        mkv_svg_polyline(&svg, fx, fy, r->n_front, "#1f77b4", 1.5, 0);
        for (int32_t k = 0; k < r->n_front; k++) mkv_svg_circle(&svg, fx[k], fy[k], 4, "#1f77b4", "none");
    }
    free(fx);
    free(fy);
    if (r->chosen >= 0) {
        const mkv_calib_point_t *c = &pts[r->chosen];
        const double x = c->q.memory_ratio, y = 100.0 * c->q.ppl_increase;
        char label[200], pl[160];
        mkv_policy_label(&c->policy, pl, sizeof pl);
        mkv_svg_circle(&svg, x, y, 8, "none", "#d62728");
        snprintf(label, sizeof label, "chosen: %s (%.2fx)", pl, 1.0 / x);
        mkv_svg_text(&svg, mkv_svg_px(&svg, x) + 10, mkv_svg_py(&svg, y) - 10, "start", "#d62728", 12, label);
    }
    char legend[128];
    snprintf(legend, sizeof legend, "dashed: tolerance +%.2f%%", 100.0 * o->max_ppl_increase);
    mkv_svg_text(&svg, 80, 468, "start", "#999", 12, "grey: grid points");
    mkv_svg_text(&svg, 220, 468, "start", "#1f77b4", 12, "blue: Pareto front");
    mkv_svg_text(&svg, 370, 468, "start", "#2ca02c", 12, legend);
    return mkv_svg_close(&svg, CMD);
}

/* ---------------------------------------------------------------------------------------- */
/* The command                                                                              */
/* ---------------------------------------------------------------------------------------- */

int mkv_calibrate_main(int argc, char **argv)
{
    cal_opts_t o;
    memset(&o, 0, sizeof o);
    mkv_policy_default(&o.base);
    mkv_calib_grid_default(&o.grid);
    o.calib_windows = 16;
    o.valid_windows = 8;
    o.max_checks = 3;
    o.max_ppl_increase = 0.01;
    const int p = parse(argc, argv, &o);
    if (p != 0) return p > 0 ? MKV_EXIT_OK : MKV_EXIT_USAGE;

    int rc = MKV_EXIT_FAIL;
    char err[MKV_ERR_LEN];
    mkv_model_t *model = NULL;
    mkv_tokenizer_t *tok = NULL;
    mkv_docs_t docs = {0};
    mkv_calib_point_t *pts = NULL;
    int32_t n = 0;
    mkv_calib_t *cal = NULL;
    mkv_calib_state_t *state = NULL;
    mkv_calib_result_t res;
    memset(&res, 0, sizeof res);
    res.chosen = -1;
    if (mkv_calib_grid_points(&o.base, &o.grid, &pts, &n, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        return MKV_EXIT_USAGE;
    }
    if (mkv_model_load(o.model, &model, err) != MKV_STATUS_OK ||
        mkv_tokenizer_load(o.model, &tok, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (o.window == 0) o.window = (model->cfg.max_pos < 512 ? model->cfg.max_pos : 512) - 1;
    if (o.prompt_len == 0) o.prompt_len = o.window / 4 > 0 ? o.window / 4 : 1;
    if (o.prompt_len >= o.window || o.window > model->cfg.max_pos) {
        mkv_cli_error(CMD, "need --prompt-len %d < --window %d <= the model's %d positions",
                      o.prompt_len, o.window, model->cfg.max_pos);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (mkv_docs_load(CMD, &docs, tok, o.data) < 0) {
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    mkv_calib_opts_t co = MKV_CALIB_OPTS_INIT;
    co.window = o.window;
    co.prompt_len = o.prompt_len;
    co.calib_windows = o.calib_windows;
    co.valid_windows = o.valid_windows;
    co.windows_per_doc = o.windows_per_doc;
    co.workers = o.workers;
    co.max_ppl_increase = o.max_ppl_increase;
    co.min_agreement = o.min_agreement;
    co.max_checks = o.max_checks;
    co.stop = &g_stop;
    run_ctx_t ctx = {&o, n, 0, NULL, isatty(STDERR_FILENO)};
    co.progress = progress;
    co.point_done = point_done;
    co.ctx = &ctx;
    if (mkv_calib_create(model, docs.doc, docs.n, &co, &cal) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s: %s", o.data, mkv_last_error());
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (o.resume_path) {
        cJSON *key = run_key(&o);
        int32_t restored = 0;
        const mkv_status_t st = mkv_calib_state_open(o.resume_path, key, pts, n, &state, &restored, err);
        cJSON_Delete(key);
        if (st != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "--resume: %s", err);
            rc = MKV_EXIT_USAGE;
            goto done;
        }
        ctx.state = state;
        ctx.points_done = restored;
        if (!o.quiet && restored > 0)
            fprintf(stderr, "mixkv calibrate: %d of %d points restored from %s\n", restored, n, o.resume_path);
    }
    if (!o.quiet)
        fprintf(stderr, "mixkv calibrate: %d points x %d windows of %d tokens, %d validation windows; "
                        "Ctrl-C stops%s\n", n, o.calib_windows, o.window, o.valid_windows,
                o.resume_path ? " (rerun to resume)" : "");
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    const mkv_status_t st = mkv_calib_run(cal, pts, n, &res);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (st != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        goto done;
    }
    if (res.stopped) {
        mkv_cli_error(CMD, "%s after %d of %d points%s", g_interrupted ? "interrupted" : "stopped",
                      ctx.points_done, n,
                      o.resume_path ? "; run the same command again to resume" : " (--resume FILE keeps them)");
        goto done;
    }
    mkv_calib_quality_t ref;
    mkv_calib_reference(cal, &ref);
    print_table(o.json_path && !strcmp(o.json_path, "-") ? stderr : stdout, &o, pts, n, &ref, &res);
    if (o.json_path) {
        cJSON *root = result_json(&o, &docs, pts, n, &ref, &res);
        const int w = mkv_cli_write_json(CMD, root, o.json_path);
        cJSON_Delete(root);
        if (w < 0) goto done;
    }
    if (o.plot_path && write_plot(&o, pts, n, &res) < 0) goto done;
    const int usable = res.chosen >= 0 && (res.validated || o.valid_windows == 0);
    if (o.policy_out && usable) {
        const mkv_calib_point_t *c = &pts[res.chosen];
        mkv_policy_source_t src = {o.model, o.data, c->q.memory_ratio, c->q.ppl_increase, NAN, NAN,
                                   o.max_ppl_increase};
        for (int32_t k = 0; k < res.n_checks; k++)
            if (res.checks[k].point == res.chosen) {
                src.valid_ppl_increase = res.checks[k].valid.ppl_increase;
                src.valid_memory_ratio = res.checks[k].valid.memory_ratio;
            }
        if (mkv_policy_save(o.policy_out, &c->policy, &src, err) != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "--policy-out: %s", err);
            goto done;
        }
    } else if (o.policy_out) {
        mkv_cli_error(CMD, "--policy-out: not written: no point %s", res.chosen < 0
                           ? "within the tolerance" : "passed its check on the validation windows");
    }
    rc = usable ? MKV_EXIT_OK : MKV_EXIT_FAIL;
done:
    mkv_calib_result_free(&res);
    mkv_calib_state_close(state);
    mkv_calib_free(cal);
    free(pts);
    mkv_docs_free(&docs);
    mkv_tokenizer_free(tok);
    mkv_model_free(model);
    return rc;
}
