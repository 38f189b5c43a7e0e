/*
 * calibrate.c — `mixkv calibrate`: sweeps a grid of policies (alpha_h x alpha_l by default,
 * DiffKV's ranges; optionally recent windows, formats and group sizes) over calibration
 * windows of a dataset, against the FP16 cache on the same windows (calib/calib.h), finds the
 * Pareto front of memory against perplexity increase, chooses the cheapest point within the
 * tolerance, checks it on held-back validation windows, and writes the results: a table, JSON
 * (schema mixkv-calibrate), a policy file for the other commands' --policy, and an SVG of the
 * trade-off (calibrate_report.c). With --needle every point also answers needle-in-a-haystack
 * trials (calib/needle.h) and may be held to a largest drop of retrieval accuracy. A sweep
 * saves every finished point to a state file (--resume) and stops cleanly on Ctrl-C, so a long
 * one can be resumed.
 */
#include "calib/state.h"
#include "runner/tokenizer.h"
#include "tools/calibrate.h"
#include "tools/cli.h"
#include "tools/model_opts.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CMD "calibrate"

void mkv_calibrate_usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv calibrate --model PATH --data FILE|DIR|- [OPTIONS]\n"
            "\n"
            "Calibrates the thresholds alpha_h and alpha_l (and, if asked, the recent window,\n"
            "the formats and the quantization group size) for a model on a dataset, as DiffKV\n"
            "does (section 7): every point of the grid runs over the same calibration windows as\n"
            "the FP16 cache (computed once), and is scored by its memory ratio to FP16, its\n"
            "perplexity increase and its greedy agreement (with --needle, also its needle\n"
            "retrieval accuracy). The Pareto front of memory against perplexity increase is\n"
            "found, the point with the least memory within --max-ppl-increase (and\n"
            "--max-needle-drop) is chosen and checked on held-back validation windows and\n"
            "trials (the next candidate, cheapest first, when it fails there; at most\n"
            "--max-checks).\n"
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
            "Needle retrieval:\n"
            "  --needle            every point also answers needle-in-a-haystack trials (as\n"
            "                      'mixkv needle'); its accuracy beside FP16's on the same trials\n"
            "  --haystack DIR|FILE the text to hide the needles in [the --data documents]\n"
            "  --needle-lengths L,... prompt lengths in tokens [the window, within the positions]\n"
            "  --needle-depths D,...  needle depths, fractions of the haystack [0,0.5,1]\n"
            "  --needle-trials N   needles per length and depth [1]\n"
            "  --max-needle-drop X a candidate's accuracy at most X (a fraction) below FP16's\n"
            "                      [no constraint]\n"
            "Output:\n"
            "  --json FILE         every point, the front, the choice and its per-head mix\n"
            "                      (schema mixkv-calibrate; '-': stdout)\n"
            "  --policy-out FILE   the chosen policy, for --policy of generate, perplexity,\n"
            "                      needle, bench and serve-bench (written only when a point\n"
            "                      passed its check, or without validation windows)\n"
            "  --plot FILE.svg     memory ratio against perplexity increase, front and choice\n"
            "  --resume FILE       save each finished point to FILE and restore those already\n"
            "                      there (the same run only): Ctrl-C stops, rerunning resumes\n"
            "  --workers N         points measured at once, each on one core [one per core;\n"
            "                      with --backend cuda, 1: each worker holds the weights]\n"
            MKV_RUN_OPTS_HELP
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

/* The needle options (all but --needle itself): 1 when argv[*i] was one, -1 on a bad value. */
static int parse_needle(int argc, char **argv, int *i, cal_opts_t *o)
{
    const char *v, *name = argv[*i];
    int m;
    double tmp[MKV_NEEDLE_MAX_GRID];
    mkv_needle_opts_t *t = &o->trials;
    if ((m = mkv_cli_option(CMD, argc, argv, i, "--haystack", 1, 0, &v)) != 0) {
        if (m < 0) return -1;
        o->haystack = v;
    } else if ((m = mkv_cli_option(CMD, argc, argv, i, "--needle-lengths", 1, 0, &v)) != 0) {
        if (m < 0 || mkv_cli_parse_list(CMD, "--needle-lengths", v, 16, 1 << 20, 1, MKV_NEEDLE_MAX_GRID, tmp,
                                        &t->n_lengths) < 0)
            return -1;
        for (int32_t k = 0; k < t->n_lengths; k++) t->lengths[k] = (int32_t)tmp[k];
    } else if ((m = mkv_cli_option(CMD, argc, argv, i, "--needle-depths", 1, 0, &v)) != 0) {
        if (m < 0 || mkv_cli_parse_list(CMD, "--needle-depths", v, 0.0, 1.0, 0, MKV_NEEDLE_MAX_GRID, t->depths,
                                        &t->n_depths) < 0)
            return -1;
    } else if ((m = mkv_cli_option(CMD, argc, argv, i, "--needle-trials", 1, 0, &v)) != 0) {
        if (m < 0 || mkv_cli_parse_i32(CMD, "--needle-trials", v, 1, 1000, &t->trials) < 0) return -1;
    } else if ((m = mkv_cli_option(CMD, argc, argv, i, "--max-needle-drop", 1, 0, &v)) != 0) {
        if (m < 0 || mkv_cli_parse_double(CMD, "--max-needle-drop", v, 0.0, 1.0, &o->max_needle_drop) < 0)
            return -1;
        o->needle_drop_given = 1;
    } else {
        return 0;
    }
    if (!o->needle_option) o->needle_option = name;
    return 1;
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
        if ((m = mkv_run_opts_parse(CMD, argc, argv, &i, &o->run)) != 0) {
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
        if (!strcmp(argv[i], "--needle")) {
            o->needle = 1;
            continue;
        }
        if ((m = parse_needle(argc, argv, &i, o)) != 0) {
            if (m < 0) return -1;
            continue;
        }
        mkv_cli_error(CMD, "unknown argument '%s' (see 'mixkv calibrate --help')", argv[i]);
        return -1;
    }
    if (!o->model || !o->data) {
        mkv_cli_error(CMD, "--model PATH and --data FILE|DIR|- are required");
        return -1;
    }
    if (o->needle_option && !o->needle) {
        mkv_cli_error(CMD, "%s needs --needle", o->needle_option);
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
    /* The reference phases run windows or needle trials; the others, with --needle, both. */
    const char *unit = !strcmp(phase, "needle reference")         ? "needle trials"
                       : r->o->needle && strcmp(phase, "reference") ? "windows and needle trials"
                                                                    : "windows";
    fprintf(stderr, "%s%s: %lld/%lld %s, %d/%d points done, ETA %s%s", r->tty ? "\r" : "", phase,
            (long long)done, (long long)total, unit, r->points_done, r->points_total, left,
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

static int needle_ref_done(void *ctx, int32_t set, const mkv_needle_result_t *results, int32_t n)
{
    run_ctx_t *r = ctx;
    if (!r->state) return 0;
    char err[MKV_ERR_LEN];
    if (mkv_calib_state_add_needle_reference(r->state, set, results, n, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        return 1;
    }
    return 0;
}

/* What makes a state file's points comparable with this run's: the settings that change
 * what a point measures on the calibration windows and needle trials. */
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
    if (o->run.backend != MKV_BACKEND_CPU) { /* absent for the CPU: earlier state files match */
        cJSON_AddStringToObject(k, "backend", mkv_backend_name(o->run.backend));
        cJSON_AddStringToObject(k, "dtype", mkv_dtype_name(o->run.dtype));
    }
    if (o->needle) { /* absent without: the state files of earlier runs still match */
        cJSON *nj = mkv_calibrate_needle_json(o);
        cJSON_AddBoolToObject(nj, "plain", o->trials.plain);
        cJSON_AddItemToObject(k, "needle", nj);
    }
    return k;
}

/* ---------------------------------------------------------------------------------------- */
/* Needle trials                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* The haystack's tokens: --haystack's text, or the --data documents joined (each one's BOS
 * left out). *hay malloc'ed. -1 with a message printed. */
static int haystack_tokens(const cal_opts_t *o, const mkv_tokenizer_t *tok, const mkv_docs_t *docs,
                           int32_t **hay, int64_t *n_hay)
{
    *hay = NULL;
    *n_hay = 0;
    if (o->haystack) {
        char err[MKV_ERR_LEN];
        size_t len = 0;
        int32_t n = 0;
        char *text = mkv_docs_read_text(CMD, o->haystack, &len);
        if (!text) return -1;
        const mkv_status_t st = mkv_tokenizer_encode(tok, text, len, 0, hay, &n, err);
        free(text);
        if (st != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "--haystack %s: %s", o->haystack, err);
            return -1;
        }
        *n_hay = n;
        return 0;
    }
    const int32_t bos = mkv_tokenizer_bos(tok);
    if (!(*hay = malloc((size_t)(mkv_docs_tokens(docs, NULL) + 1) * sizeof **hay))) {
        mkv_cli_error(CMD, "out of memory joining the documents");
        return -1;
    }
    for (int32_t d = 0; d < docs->n; d++) {
        const int32_t skip = docs->doc[d].n > 0 && docs->doc[d].tokens[0] == bos;
        memcpy(*hay + *n_hay, docs->doc[d].tokens + skip, (size_t)(docs->doc[d].n - skip) * sizeof **hay);
        *n_hay += docs->doc[d].n - skip;
    }
    return 0;
}

/* The needle sets: the calibration trials and, with validation windows, held-back ones (the
 * next seed: other secrets and stretches). The default length is the window, within the
 * positions the answer leaves. Exit status 0, or 2 with a message printed. */
static int make_needles(cal_opts_t *o, const mkv_model_t *model, const mkv_tokenizer_t *tok,
                        const mkv_docs_t *docs, mkv_needle_t **sets)
{
    mkv_needle_opts_t *t = &o->trials;
    const int32_t room = model->cfg.max_pos - t->max_new;
    if (t->n_lengths == 0) {
        t->lengths[0] = o->window < room ? o->window : room;
        t->n_lengths = 1;
    }
    for (int32_t k = 0; k < t->n_lengths; k++)
        if (t->lengths[k] > room) {
            mkv_cli_error(CMD, "--needle-lengths: %d plus %d answer tokens exceed the model's %d positions",
                          t->lengths[k], t->max_new, model->cfg.max_pos);
            return MKV_EXIT_USAGE;
        }
    int32_t *hay = NULL;
    int64_t n_hay = 0;
    if (haystack_tokens(o, tok, docs, &hay, &n_hay) < 0) return MKV_EXIT_USAGE;
    mkv_needle_opts_t valid = *t;
    valid.seed = t->seed + 1;
    int rc = MKV_EXIT_OK;
    for (int s = 0; s < 1 + (o->valid_windows > 0) && rc == MKV_EXIT_OK; s++)
        if (mkv_needle_create(tok, hay, n_hay, s == 0 ? t : &valid, &sets[s]) != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "--needle: %s: %s", o->haystack ? o->haystack : o->data, mkv_last_error());
            rc = MKV_EXIT_USAGE;
        }
    free(hay);
    return rc;
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
    mkv_run_opts_default(&o.run);
    o.calib_windows = 16;
    o.valid_windows = 8;
    o.max_checks = 3;
    o.max_ppl_increase = 0.01;
    o.trials = (mkv_needle_opts_t)MKV_NEEDLE_OPTS_INIT;
    o.trials.n_lengths = 0; /* the window */
    o.trials.depths[0] = 0.0, o.trials.depths[1] = 0.5, o.trials.depths[2] = 1.0;
    o.trials.n_depths = 3;
    o.trials.trials = 1;
    o.max_needle_drop = 1.0;
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
    mkv_needle_t *needle[MKV_CALIB_NEEDLE_SETS] = {NULL, NULL};
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
    if (o.needle && (rc = make_needles(&o, model, tok, &docs, needle)) != MKV_EXIT_OK) goto done;
    rc = MKV_EXIT_FAIL;
    mkv_calib_opts_t co = MKV_CALIB_OPTS_INIT;
    co.window = o.window;
    co.prompt_len = o.prompt_len;
    co.calib_windows = o.calib_windows;
    co.valid_windows = o.valid_windows;
    co.windows_per_doc = o.windows_per_doc;
    co.workers = o.workers;
    co.backend = o.run.backend;
    co.dtype = o.run.dtype;
    co.max_ppl_increase = o.max_ppl_increase;
    co.min_agreement = o.min_agreement;
    co.max_checks = o.max_checks;
    co.needle = needle[MKV_CALIB_NEEDLE_CALIBRATION];
    co.needle_valid = needle[MKV_CALIB_NEEDLE_VALIDATION];
    co.max_needle_drop = o.max_needle_drop;
    co.needle_ref_done = needle_ref_done;
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
        const mkv_status_t st = mkv_calib_state_open(o.resume_path, key, pts, n, cal, &state, &restored, err);
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
        const mkv_needle_result_t *r = NULL;
        mkv_calib_needle_reference(cal, MKV_CALIB_NEEDLE_CALIBRATION, &r);
        if (!o.quiet && r)
            fprintf(stderr, "mixkv calibrate: the FP16 needle reference restored from %s\n", o.resume_path);
    }
    if (!o.quiet) {
        fprintf(stderr, "mixkv calibrate: %d points x %d windows of %d tokens, %d validation windows; ", n,
                o.calib_windows, o.window, o.valid_windows);
        if (o.needle)
            fprintf(stderr, "%d needle trials of up to %d tokens (%d held back); ",
                    mkv_needle_count(needle[0]), mkv_needle_longest(needle[0]),
                    needle[1] ? mkv_needle_count(needle[1]) : 0);
        fprintf(stderr, "Ctrl-C stops%s\n", o.resume_path ? " (rerun to resume)" : "");
    }
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
    mkv_calibrate_print_table(o.json_path && !strcmp(o.json_path, "-") ? stderr : stdout, &o, pts, n, &ref,
                              &res);
    if (o.json_path) {
        cJSON *root = mkv_calibrate_json(&o, &docs, pts, n, &ref, &res,
                                         needle[0] ? mkv_needle_template(needle[0]) : MKV_CHAT_NONE);
        const int w = mkv_cli_write_json(CMD, root, o.json_path);
        cJSON_Delete(root);
        if (w < 0) goto done;
    }
    if (o.plot_path && mkv_calibrate_plot(&o, pts, n, &res) < 0) goto done;
    const int usable = res.chosen >= 0 && (res.validated || o.valid_windows == 0);
    if (o.policy_out && usable) {
        const mkv_calib_point_t *c = &pts[res.chosen];
        mkv_policy_source_t src = {o.model, o.data, c->q.memory_ratio, c->q.ppl_increase, NAN, NAN,
                                   o.max_ppl_increase, NAN, NAN, NAN};
        if (c->q.needle_trials > 0) {
            src.needle_accuracy = c->q.needle_accuracy;
            src.needle_accuracy_ref = c->q.needle_accuracy_ref;
        }
        for (int32_t k = 0; k < res.n_checks; k++)
            if (res.checks[k].point == res.chosen) {
                src.valid_ppl_increase = res.checks[k].valid.ppl_increase;
                src.valid_memory_ratio = res.checks[k].valid.memory_ratio;
                if (res.checks[k].valid.needle_trials > 0)
                    src.valid_needle_accuracy = res.checks[k].valid.needle_accuracy;
            }
        if (mkv_policy_save(o.policy_out, &c->policy, &src, err) != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "--policy-out: %s", err);
            goto done;
        }
    } else if (o.policy_out) {
        mkv_cli_error(CMD, "--policy-out: not written: no point %s", res.chosen < 0
                           ? (o.needle_drop_given ? "within the tolerance and the needle drop" : "within the tolerance")
                           : "passed its check on the validation windows");
    }
    rc = usable ? MKV_EXIT_OK : MKV_EXIT_FAIL;
done:
    mkv_calib_result_free(&res);
    mkv_calib_state_close(state);
    mkv_calib_free(cal);
    for (int s = 0; s < MKV_CALIB_NEEDLE_SETS; s++) mkv_needle_free(needle[s]);
    free(pts);
    mkv_docs_free(&docs);
    mkv_tokenizer_free(tok);
    mkv_model_free(model);
    return rc;
}
