/*
 * calibrate_report.c — what `mixkv calibrate` reports (see calibrate.h): the table of points
 * with the checks and the choice, the JSON of schema mixkv-calibrate (docs/results-schema.md)
 * and the SVG of memory against perplexity increase.
 */
#include "tools/calibrate.h"

#include "calib/state.h"
#include "tools/svg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CMD "calibrate"

/* " needle 66.7% (FP16 100.0%)" for a quality with needle trials, else "". */
static const char *needle_text(const mkv_calib_quality_t *q, char *buf, size_t len)
{
    buf[0] = '\0';
    if (q->needle_trials > 0)
        snprintf(buf, len, ", needle %.1f%% (FP16 %.1f%%)", 100.0 * q->needle_accuracy,
                 100.0 * q->needle_accuracy_ref);
    return buf;
}

void mkv_calibrate_print_table(FILE *f, const cal_opts_t *o, const mkv_calib_point_t *pts, int32_t n,
                               const mkv_calib_quality_t *ref, const mkv_calib_result_t *r)
{
    char nt[96];
    fprintf(f, "\ncalibrate: %d points on %d windows of %d tokens (%d prompt); FP16 perplexity %.4f, "
               "tolerance +%.2f%%\n", n, o->calib_windows, o->window, o->prompt_len, ref->ppl,
            100.0 * o->max_ppl_increase);
    if (o->needle) {
        fprintf(f, "needle: %d trials; FP16 answers %d right (%.1f%%)", ref->needle_trials,
                ref->needle_right, 100.0 * ref->needle_accuracy);
        if (o->needle_drop_given) fprintf(f, "; a drop of at most %.3f allowed", o->max_needle_drop);
        fputc('\n', f);
    }
    fprintf(f, "\n     %-40s %8s %9s %9s %7s %7s %7s%s\n", "policy", "memory", "ppl", "agree", "high",
            "low", "pruned", o->needle ? "  needle" : "");
    for (int32_t i = 0; i < n; i++) {
        const mkv_calib_point_t *p = &pts[i];
        char label[160];
        mkv_policy_label(&p->policy, label, sizeof label);
        const char mark = i == r->chosen ? '>' : p->on_front ? '*' : ' ';
        if (!p->done) {
            fprintf(f, "  %c  %-40s %8s\n", mark, label, "(not run)");
            continue;
        }
        fprintf(f, "  %c  %-40s %8.3f %+8.2f%% %8.2f%% %6.1f%% %6.1f%% %6.1f%%", mark, label,
                p->q.memory_ratio, 100.0 * p->q.ppl_increase, 100.0 * p->q.agreement,
                100.0 * p->q.frac_hi, 100.0 * p->q.frac_lo, 100.0 * p->q.frac_pruned);
        if (p->q.needle_trials > 0) fprintf(f, " %6.1f%%", 100.0 * p->q.needle_accuracy);
        fputc('\n', f);
    }
    fprintf(f, "\n(* on the Pareto front of memory ratio and perplexity increase, > chosen; memory: "
               "bytes in use over a plain FP16 cache's; FP16's own paged cache: %.3f%s)\n",
            ref->memory_ratio, o->needle ? "; needle: fraction of the trials answered right" : "");
    fprintf(f, "%d of %d points within the tolerance%s on the calibration windows\n", r->n_candidates, n,
            o->needle_drop_given ? " and the needle drop" : "");
    for (int32_t k = 0; k < r->n_checks; k++) {
        const mkv_calib_check_t *c = &r->checks[k];
        char label[160];
        mkv_policy_label(&pts[c->point].policy, label, sizeof label);
        fprintf(f, "validation check %d: %s: memory %.3f, perplexity %+.2f%% (FP16 %.4f), agreement "
                   "%.2f%%%s: %s\n", k + 1, label, c->valid.memory_ratio, 100.0 * c->valid.ppl_increase,
                c->valid.ppl_ref, 100.0 * c->valid.agreement, needle_text(&c->valid, nt, sizeof nt),
                c->passed ? "passed" : "failed");
    }
    if (r->chosen >= 0) {
        const mkv_calib_point_t *c = &pts[r->chosen];
        char label[160];
        mkv_policy_label(&c->policy, label, sizeof label);
        fprintf(f, "chosen: %s: %.2fx smaller than FP16, perplexity %+.2f%%%s%s\n", label,
                1.0 / c->q.memory_ratio, 100.0 * c->q.ppl_increase, needle_text(&c->q, nt, sizeof nt),
                r->validated ? ", validated" : o->valid_windows == 0 ? " (no validation windows)"
                                                                     : ", NOT validated");
    } else if (o->needle_drop_given) {
        fprintf(f, "no point stays within +%.2f%% and a needle drop of %.3f: widen the grid (lower "
                   "alphas) or the limits\n", 100.0 * o->max_ppl_increase, o->max_needle_drop);
    } else {
        fprintf(f, "no point stays within +%.2f%%: widen the grid (lower alphas) or the tolerance\n",
                100.0 * o->max_ppl_increase);
    }
}

cJSON *mkv_calibrate_needle_json(const cal_opts_t *o)
{
    const mkv_needle_opts_t *t = &o->trials;
    cJSON *nj = cJSON_CreateObject();
    if (o->haystack) cJSON_AddStringToObject(nj, "haystack", o->haystack);
    else cJSON_AddNullToObject(nj, "haystack");
    cJSON_AddItemToObject(nj, "lengths", cJSON_CreateIntArray(t->lengths, t->n_lengths));
    cJSON_AddItemToObject(nj, "depths", cJSON_CreateDoubleArray(t->depths, t->n_depths));
    cJSON_AddNumberToObject(nj, "trials", t->trials);
    cJSON_AddNumberToObject(nj, "max_new", t->max_new);
    cJSON_AddNumberToObject(nj, "seed", (double)t->seed);
    return nj;
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

cJSON *mkv_calibrate_json(const cal_opts_t *o, const mkv_docs_t *docs, const mkv_calib_point_t *pts,
                          int32_t n, const mkv_calib_quality_t *ref, const mkv_calib_result_t *r,
                          mkv_chat_template_t chat)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "schema", "mixkv-calibrate");
    cJSON_AddNumberToObject(root, "schema_version", 1);
    cJSON_AddStringToObject(root, "mixkv_version", mkv_version());
    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddStringToObject(root, "data", o->data);
    cJSON_AddStringToObject(root, "backend", mkv_backend_name(o->run.backend));
    cJSON_AddStringToObject(root, "dtype", o->run.backend == MKV_BACKEND_CUDA ? mkv_dtype_name(o->run.dtype) : "f32");
    cJSON_AddNumberToObject(root, "documents", docs->n);
    cJSON_AddNumberToObject(root, "window", o->window);
    cJSON_AddNumberToObject(root, "prompt_len", o->prompt_len);
    cJSON_AddNumberToObject(root, "calibration_windows", o->calib_windows);
    cJSON_AddNumberToObject(root, "validation_windows", o->valid_windows);
    cJSON_AddNumberToObject(root, "max_ppl_increase", o->max_ppl_increase);
    cJSON_AddNumberToObject(root, "min_agreement", o->min_agreement);
    if (o->needle_drop_given) cJSON_AddNumberToObject(root, "max_needle_drop", o->max_needle_drop);
    else cJSON_AddNullToObject(root, "max_needle_drop");
    if (o->needle) {
        cJSON *nj = mkv_calibrate_needle_json(o);
        cJSON_AddStringToObject(nj, "chat_template", mkv_chat_template_name(chat));
        cJSON_AddItemToObject(root, "needle", nj);
    } else {
        cJSON_AddNullToObject(root, "needle");
    }
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
int mkv_calibrate_plot(const cal_opts_t *o, const mkv_calib_point_t *pts, int32_t n,
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
