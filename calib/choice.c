/*
 * choice.c — the Pareto front, the candidates within the limits and the whole calibration's
 * choice (see calib.h): measure, then walk the candidates cheapest first through the
 * validation check (docs/decisions.md, 50). Only the public API of calib.h is used here; the
 * measuring is calib.c's.
 */
#include "calib/calib.h"

#include <stdlib.h>
#include <string.h>

static const mkv_calib_point_t *g_sort_points; /* qsort has no context argument in C11 */

static int cheaper(int32_t a, int32_t b)
{
    const mkv_calib_quality_t *x = &g_sort_points[a].q, *y = &g_sort_points[b].q;
    if (x->memory_ratio != y->memory_ratio) return x->memory_ratio < y->memory_ratio ? -1 : 1;
    if (x->ppl_increase != y->ppl_increase) return x->ppl_increase < y->ppl_increase ? -1 : 1;
    return (a > b) - (a < b);
}

static int cmp_cheaper(const void *a, const void *b)
{
    return cheaper(*(const int32_t *)a, *(const int32_t *)b);
}

/* Sorts idx[n] cheapest first. Not reentrant (the sort's context is a static). */
static void sort_cheapest(const mkv_calib_point_t *points, int32_t *idx, int32_t n)
{
    g_sort_points = points;
    qsort(idx, (size_t)n, sizeof *idx, cmp_cheaper);
    g_sort_points = NULL;
}

int32_t mkv_calib_pareto(mkv_calib_point_t *points, int32_t n, int32_t *front)
{
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        points[i].on_front = 0;
        if (!points[i].done) continue;
        const mkv_calib_quality_t *p = &points[i].q;
        int dominated = 0;
        for (int32_t j = 0; j < n && !dominated; j++) {
            if (j == i || !points[j].done) continue;
            const mkv_calib_quality_t *q = &points[j].q;
            dominated = q->memory_ratio <= p->memory_ratio && q->ppl_increase <= p->ppl_increase &&
                        (q->memory_ratio < p->memory_ratio || q->ppl_increase < p->ppl_increase);
        }
        if (!dominated) {
            points[i].on_front = 1;
            front[k++] = i;
        }
    }
    sort_cheapest(points, front, k);
    return k;
}

mkv_calib_limits_t mkv_calib_limits(const mkv_calib_opts_t *o)
{
    return (mkv_calib_limits_t){o->max_ppl_increase, o->min_agreement, o->max_needle_drop};
}

int mkv_calib_within(const mkv_calib_limits_t *l, const mkv_calib_quality_t *q)
{
    if (!(q->ppl_increase <= l->max_ppl_increase)) return 0;
    if (l->min_agreement > 0 && !(q->agreement >= l->min_agreement)) return 0;
    if (q->needle_trials > 0 && l->max_needle_drop < 1.0 &&
        q->needle_accuracy_ref - q->needle_accuracy > l->max_needle_drop + 1e-9)
        return 0;
    return 1;
}

int32_t mkv_calib_eligible(const mkv_calib_point_t *points, int32_t n, const mkv_calib_limits_t *l,
                           int32_t *order)
{
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++)
        if (points[i].done && mkv_calib_within(l, &points[i].q)) order[k++] = i;
    sort_cheapest(points, order, k);
    return k;
}

int32_t mkv_calib_candidates(const mkv_calib_point_t *points, int32_t n, double max_ppl_increase,
                             double min_agreement, int32_t *order)
{
    const mkv_calib_limits_t l = {max_ppl_increase, min_agreement, 1.0};
    return mkv_calib_eligible(points, n, &l, order);
}

void mkv_calib_result_free(mkv_calib_result_t *r)
{
    free(r->front);
    mkv_calib_heads_free(&r->heads);
    memset(r, 0, sizeof *r);
    r->chosen = -1;
}

mkv_status_t mkv_calib_run(mkv_calib_t *c, mkv_calib_point_t *points, int32_t n,
                           mkv_calib_result_t *out)
{
    memset(out, 0, sizeof *out);
    out->chosen = -1;
    mkv_status_t st = mkv_calib_measure(c, points, n, &out->stopped);
    if (st != MKV_STATUS_OK || out->stopped) return st;
    const mkv_calib_opts_t *o = mkv_calib_options(c);
    const mkv_calib_limits_t lim = mkv_calib_limits(o);
    int32_t *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    out->front = malloc((size_t)(n > 0 ? n : 1) * sizeof *out->front);
    if (!order || !out->front) {
        free(order);
        return mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "out of memory choosing a point");
    }
    out->n_front = mkv_calib_pareto(points, n, out->front);
    out->n_candidates = mkv_calib_eligible(points, n, &lim, order);
    int32_t max_checks = o->max_checks < MKV_CALIB_MAX_CHECKS ? o->max_checks : MKV_CALIB_MAX_CHECKS;
    if (o->valid_windows == 0) max_checks = 0; /* nothing to check on: the cheapest candidate */
    mkv_calib_heads_t first = {0};             /* the cheapest candidate's, should none pass */
    for (int32_t k = 0; k < out->n_candidates && k < max_checks && !out->validated; k++) {
        mkv_calib_check_t *ck = &out->checks[out->n_checks];
        mkv_calib_heads_t h = {0};
        ck->point = order[k];
        if ((st = mkv_calib_validate(c, &points[order[k]].policy, &ck->valid, &h, &out->stopped)) !=
                MKV_STATUS_OK || out->stopped)
            goto done;
        ck->passed = mkv_calib_within(&lim, &ck->valid);
        out->n_checks++;
        if (ck->passed) {
            out->chosen = order[k];
            out->validated = 1;
            out->heads = h;
        } else if (k == 0) {
            first = h;
        } else {
            mkv_calib_heads_free(&h);
        }
    }
    if (out->chosen < 0 && out->n_candidates > 0) {
        out->chosen = order[0];
        if (out->n_checks > 0) {
            out->heads = first;
            first = (mkv_calib_heads_t){0};
        } else { /* no validation windows: the mix on the calibration windows */
            mkv_calib_quality_t q;
            st = mkv_calib_validate(c, &points[out->chosen].policy, &q, &out->heads, &out->stopped);
        }
    }
done:
    mkv_calib_heads_free(&first);
    free(order);
    return st;
}
