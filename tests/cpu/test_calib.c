/*
 * test_calib.c — calibration (calib/): grid lists and the values refused, the Pareto front and
 * the candidates on hand-made points, policy files read back exactly (and refused when wrong),
 * a sweep interrupted and resumed from its state file giving the figures of an uninterrupted
 * one (on another number of workers), and a small real calibration of the bundled TinyStories
 * model whose choice holds on its validation windows; then `mixkv calibrate` end to end and its
 * policy file through `perplexity --policy`. The real runs take a few seconds on 2 cores.
 */
#include "calib_fixture.h"

#include "calib/calib.h"
#include "calib/grid.h"
#include "calib/state.h"
#include "runner/tokenizer.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------- */
/* Grid                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void expect_list(mkv_calib_setting_t s, const char *text, const double *want, int n)
{
    mkv_calib_grid_t g;
    memset(&g, 0, sizeof g);
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_calib_grid_parse(&g, s, text, err), MKV_STATUS_OK, "'%s': %s", text, err);
    cr_assert_eq(g.n[s], n, "'%s': %d values, expected %d", text, g.n[s], n);
    for (int k = 0; k < n; k++)
        cr_assert_float_eq(g.value[s][k], want[k], 1e-12, "'%s'[%d] = %.17g, expected %g", text, k,
                           g.value[s][k], want[k]);
}

static void expect_refused(mkv_calib_setting_t s, const char *text, const char *words)
{
    mkv_calib_grid_t g;
    memset(&g, 0, sizeof g);
    g.n[s] = 1;
    g.value[s][0] = 7;
    char err[MKV_ERR_LEN] = "";
    cr_assert_eq(mkv_calib_grid_parse(&g, s, text, err), MKV_STATUS_INVALID_ARGUMENT, "'%s' accepted", text);
    cr_assert(strstr(err, words), "'%s': message '%s' lacks '%s'", text, err, words);
    cr_assert(g.n[s] == 1 && g.value[s][0] == 7, "'%s': a refused list changed the grid", text);
}

/* A whole file as a string (malloc'ed). */
static char *slurp_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    rewind(f);
    char *t = malloc((size_t)n + 1);
    cr_assert_eq(fread(t, 1, (size_t)n, f), (size_t)n);
    t[n] = '\0';
    fclose(f);
    return t;
}

Test(calib_grid, lists_and_ranges)
{
    expect_list(MKV_CALIB_ALPHA_H, "0:5:1", (double[]){0, 1, 2, 3, 4, 5}, 6);
    expect_list(MKV_CALIB_ALPHA_L, "0:0.1:0.02", (double[]){0, 0.02, 0.04, 0.06, 0.08, 0.1}, 6);
    expect_list(MKV_CALIB_ALPHA_L, "0.3:1:0.1", (double[]){0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0}, 8);
    expect_list(MKV_CALIB_ALPHA_H, "1:3:1,8,0.5", (double[]){1, 2, 3, 8, 0.5}, 5);
    expect_list(MKV_CALIB_ALPHA_H, "2", (double[]){2}, 1);
    expect_list(MKV_CALIB_ALPHA_H, "0:1:0.4", (double[]){0, 0.4, 0.8}, 3); /* STOP not reached */
    expect_list(MKV_CALIB_RECENT_WINDOW, "16,32,64", (double[]){16, 32, 64}, 3);
    expect_list(MKV_CALIB_GROUP_SIZE, "0,16,64", (double[]){0, 16, 64}, 3);
    expect_list(MKV_CALIB_HI_FORMAT, "K8V4,K8V8",
                (double[]){(double)MKV_FORMAT_K8V4, (double)MKV_FORMAT_K8V8}, 2);
}

Test(calib_grid, bad_values_refused_with_the_option_named)
{
    expect_refused(MKV_CALIB_ALPHA_H, "", "empty item");
    expect_refused(MKV_CALIB_ALPHA_H, "1,,2", "empty item");
    expect_refused(MKV_CALIB_ALPHA_H, "1,", "empty item");
    expect_refused(MKV_CALIB_ALPHA_H, "x", "--alpha-h: 'x' is not a number");
    expect_refused(MKV_CALIB_ALPHA_H, "nan", "not a number");
    expect_refused(MKV_CALIB_ALPHA_H, "-1", "out of range");
    expect_refused(MKV_CALIB_ALPHA_L, "0:1", "START:STOP:STEP");
    expect_refused(MKV_CALIB_ALPHA_L, "1:0:0.1", "STEP > 0 and START <= STOP");
    expect_refused(MKV_CALIB_ALPHA_L, "0:1:0", "STEP > 0");
    expect_refused(MKV_CALIB_ALPHA_L, "0:1000:1", "more than");
    expect_refused(MKV_CALIB_ALPHA_L, "0.1,0.1", "repeats");
    expect_refused(MKV_CALIB_ALPHA_L, "0:0.2:0.1,0.1", "repeats");
    expect_refused(MKV_CALIB_RECENT_WINDOW, "1.5", "whole number");
    expect_refused(MKV_CALIB_GROUP_SIZE, "24", "not supported");
    expect_refused(MKV_CALIB_LO_FORMAT, "K9V9", "not a format");
}

Test(calib_grid, default_grid_is_diffkv_ranges_without_refused_pairs)
{
    mkv_calib_grid_t g;
    mkv_calib_grid_default(&g);
    mkv_policy_t base;
    mkv_policy_default(&base);
    base.window = 32;
    mkv_calib_point_t *pts = NULL;
    int32_t n = 0;
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_calib_grid_points(&base, &g, &pts, &n, err), MKV_STATUS_OK, "%s", err);
    /* alpha_h 0..5 x alpha_l 0..0.1: at alpha_h 0 only alpha_l 0 is allowed (alpha_l <= alpha_h). */
    cr_assert_eq(n, 1 + 5 * 6);
    for (int32_t i = 0; i < n; i++) {
        cr_assert(pts[i].policy.alpha_l <= pts[i].policy.alpha_h);
        cr_assert_eq(pts[i].policy.window, 32, "the base policy's other settings are kept");
        cr_assert(!pts[i].done);
    }
    cr_assert(pts[1].policy.alpha_h == 1.0f && pts[1].policy.alpha_l == 0.0f);
    cr_assert(pts[2].policy.alpha_h == 1.0f && pts[2].policy.alpha_l == 0.02f, "alpha_l varies fastest");
    free(pts);

    /* Every other setting multiplies the grid. */
    cr_assert_eq(mkv_calib_grid_parse(&g, MKV_CALIB_RECENT_WINDOW, "16,64", err), MKV_STATUS_OK);
    cr_assert_eq(mkv_calib_grid_points(&base, &g, &pts, &n, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(n, 2 * 31);
    free(pts);

    /* Nothing left: refused. */
    cr_assert_eq(mkv_calib_grid_parse(&g, MKV_CALIB_ALPHA_H, "0.5", err), MKV_STATUS_OK);
    cr_assert_eq(mkv_calib_grid_parse(&g, MKV_CALIB_ALPHA_L, "1,2", err), MKV_STATUS_OK);
    cr_assert_eq(mkv_calib_grid_points(&base, &g, &pts, &n, err), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err, "alpha_l <= alpha_h"), "%s", err);
}

/* ---------------------------------------------------------------------------------------- */
/* Pareto front and candidates                                                              */
/* ---------------------------------------------------------------------------------------- */

static mkv_calib_point_t pt(double mem, double inc, double agree)
{
    mkv_calib_point_t p;
    memset(&p, 0, sizeof p);
    p.done = 1;
    p.q.memory_ratio = mem;
    p.q.ppl_increase = inc;
    p.q.agreement = agree;
    return p;
}

Test(calib_pareto, front_of_hand_made_points)
{
    mkv_calib_point_t p[] = {
        pt(0.60, 0.001, 0.99), /* 0: front (least loss) */
        pt(0.50, 0.004, 0.97), /* 1: front */
        pt(0.55, 0.006, 0.96), /* 2: dominated by 1 */
        pt(0.40, 0.012, 0.95), /* 3: front */
        pt(0.40, 0.012, 0.90), /* 4: equal to 3 in both measures: front too */
        pt(0.30, 0.030, 0.90), /* 5: front (least memory) */
        pt(0.45, 0.012, 0.99), /* 6: dominated by 3 (more memory, same loss) */
        pt(0.70, -0.002, 0.99),/* 7: front: better than FP16 */
        pt(0.10, 0.000, 1.00), /* 8: not done: ignored */
    };
    const int32_t n = sizeof p / sizeof p[0];
    p[8].done = 0;
    int32_t front[16];
    const int32_t k = mkv_calib_pareto(p, n, front);
    const int32_t want[] = {5, 3, 4, 1, 0, 7}; /* by memory ratio, then loss, then index */
    cr_assert_eq(k, 6, "front of %d points", k);
    for (int32_t i = 0; i < k; i++) cr_assert_eq(front[i], want[i], "front[%d] = %d, expected %d", i, front[i], want[i]);
    const int on[] = {1, 1, 0, 1, 1, 1, 0, 1, 0};
    for (int32_t i = 0; i < n; i++) cr_assert_eq(p[i].on_front, on[i], "point %d on_front %d", i, p[i].on_front);

    /* Candidates within 1%, cheapest first; with an agreement floor as well. */
    int32_t order[16];
    int32_t c = mkv_calib_candidates(p, n, 0.01, 0.0, order);
    const int32_t want_c[] = {1, 2, 0, 7};
    cr_assert_eq(c, 4);
    for (int32_t i = 0; i < c; i++) cr_assert_eq(order[i], want_c[i]);
    c = mkv_calib_candidates(p, n, 0.01, 0.98, order);
    cr_assert(c == 2 && order[0] == 0 && order[1] == 7, "%d candidates, first %d", c, order[0]);
    c = mkv_calib_candidates(p, n, 0.0, 0.0, order);
    cr_assert(c == 1 && order[0] == 7, "tolerance 0: only the point at or below FP16");
    /* The cheapest candidate is on the front (nothing cheaper stays within the tolerance). */
    c = mkv_calib_candidates(p, n, 0.02, 0.0, order);
    cr_assert(p[order[0]].on_front && order[0] == 3);
}

/* ---------------------------------------------------------------------------------------- */
/* Policy files                                                                             */
/* ---------------------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

Test(calib_policy, file_round_trip_and_refusals)
{
    mkv_policy_t p, q;
    mkv_policy_default(&p);
    p.hi = MKV_FORMAT_K8V8;
    p.lo = MKV_FORMAT_K4V4;
    p.alpha_h = 3.0f;
    p.alpha_l = 0.06f; /* not exact in binary: must come back as the same float */
    p.window = 48;
    p.obs_window = 8;
    p.hi_key_group = 64, p.hi_value_group = 16, p.lo_key_group = 32, p.lo_value_group = 16;
    char *path = cf_tmp_path("policy");
    char err[MKV_ERR_LEN];
    const mkv_policy_source_t src = {"model-x", "data-y", 0.4, 0.008, 0.009, 0.41, 0.01, NAN, NAN, NAN};
    cr_assert_eq(mkv_policy_save(path, &p, &src, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(mkv_policy_load(path, &q, err), MKV_STATUS_OK, "%s", err);
    cr_assert(mkv_policy_equal(&p, &q), "a policy file does not read back as written");
    cr_assert(q.alpha_l == 0.06f);
    char *text = slurp_file(path);
    cr_assert(strstr(text, "\"validation_ppl_increase\"") && !strstr(text, "needle"),
              "the source block: figures without needle trials:\n%s", text);
    free(text);
    /* With needle trials the source records their accuracies, and the policy still reads back. */
    const mkv_policy_source_t nsrc = {"model-x", "data-y", 0.4, 0.008, 0.009, 0.41, 0.01, 0.75, 0.5, 1.0};
    cr_assert_eq(mkv_policy_save(path, &p, &nsrc, err), MKV_STATUS_OK, "%s", err);
    text = slurp_file(path);
    cr_assert(strstr(text, "\"needle_accuracy\":\t0.75") && strstr(text, "\"validation_needle_accuracy\":\t0.5") &&
                  strstr(text, "\"needle_accuracy_fp16\":\t1"),
              "the needle accuracies in the source block:\n%s", text);
    free(text);
    cr_assert_eq(mkv_policy_load(path, &q, err), MKV_STATUS_OK, "%s", err);
    cr_assert(mkv_policy_equal(&p, &q));

    /* Absent members keep the defaults. */
    write_text(path, "{\"schema\": \"mixkv-policy\", \"schema_version\": 1, \"alpha_h\": 2}");
    cr_assert_eq(mkv_policy_load(path, &q, err), MKV_STATUS_OK, "%s", err);
    mkv_policy_t d;
    mkv_policy_default(&d);
    d.alpha_h = 2.0f;
    cr_assert(mkv_policy_equal(&d, &q));

    static const struct {
        const char *text, *words;
    } bad[] = {
        {"{\"schema\": \"mixkv-policy\", \"schema_version\": 1, \"alpha_hh\": 2}", "unknown member \"alpha_hh\""},
        {"{\"schema\": \"mixkv-policy\", \"schema_version\": 1, \"alpha_h\": 1, \"alpha_l\": 2}", "must not exceed"},
        {"{\"schema\": \"mixkv-policy\", \"schema_version\": 1, \"hi_format\": \"K9V9\"}", "not a format"},
        {"{\"schema\": \"mixkv-policy\", \"schema_version\": 1, \"lo_value_group\": 24}", "not supported"},
        {"{\"schema\": \"mixkv-policy\", \"schema_version\": 1, \"recent_window\": 1.5}", "whole number"},
        {"{\"schema\": \"mixkv-policy\", \"schema_version\": 2}", "version 2"},
        {"{\"schema\": \"mixkv-bench\", \"schema_version\": 1}", "not a policy file"},
        {"{\"schema\": \"mixkv-policy\", \"schema_version\": 1, \"alpha_h\": \"1\"}", "not a number"},
        {"[1, 2", "not a JSON object"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_text(path, bad[k].text);
        mkv_policy_default(&q);
        q.window = 5;
        err[0] = '\0';
        cr_assert_neq(mkv_policy_load(path, &q, err), MKV_STATUS_OK, "accepted: %s", bad[k].text);
        cr_assert(strstr(err, bad[k].words), "'%s': message '%s' lacks '%s'", bad[k].text, err, bad[k].words);
        cr_assert(strstr(err, path), "the message names the file: %s", err);
        cr_assert_eq(q.window, 5, "a refused file changed the policy");
    }
    unlink(path);
    cr_assert_eq(mkv_policy_load(path, &q, err), MKV_STATUS_IO_ERROR);
    free(path);
}

/* ---------------------------------------------------------------------------------------- */
/* Real runs on TinyStories                                                                 */
/* ---------------------------------------------------------------------------------------- */

static mkv_calib_point_t *grid(const char *ah, const char *al, int32_t *n)
{
    mkv_calib_grid_t g;
    mkv_calib_grid_default(&g);
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_calib_grid_parse(&g, MKV_CALIB_ALPHA_H, ah, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(mkv_calib_grid_parse(&g, MKV_CALIB_ALPHA_L, al, err), MKV_STATUS_OK, "%s", err);
    mkv_policy_t base;
    mkv_policy_default(&base);
    base.window = 16;
    mkv_calib_point_t *pts = NULL;
    cr_assert_eq(mkv_calib_grid_points(&base, &g, &pts, n, err), MKV_STATUS_OK, "%s", err);
    return pts;
}

typedef struct stopper {
    int32_t seen, stop_after;
    mkv_calib_state_t *state;
} stopper_t;

static int save_and_maybe_stop(void *ctx, const mkv_calib_point_t *p, int32_t index)
{
    stopper_t *s = ctx;
    char err[MKV_ERR_LEN];
    (void)index;
    if (s->state) cr_assert_eq(mkv_calib_state_add(s->state, p, err), MKV_STATUS_OK, "%s", err);
    return ++s->seen == s->stop_after;
}

static cJSON *key(const char *tag)
{
    cJSON *k = cJSON_CreateObject();
    cJSON_AddStringToObject(k, "model", "tinystories");
    cJSON_AddStringToObject(k, "tag", tag);
    return k;
}

Test(calib_run, interrupted_sweep_resumes_to_the_same_figures)
{
    cf_fixture_t f;
    cf_load(&f);
    mkv_calib_opts_t o = MKV_CALIB_OPTS_INIT;
    o.window = 96;
    o.prompt_len = 24;
    o.calib_windows = 3;
    o.valid_windows = 0;
    int32_t n;
    mkv_calib_point_t *full = grid("0,2,6", "0,0.5,1", &n);
    mkv_calib_point_t *part = grid("0,2,6", "0,0.5,1", &n);
    cr_assert_eq(n, 7);

    /* Uninterrupted, two workers. */
    mkv_calib_t *c = NULL;
    o.workers = 2;
    cr_assert_eq(mkv_calib_create(f.m, &f.doc, 1, &o, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    int stopped = 0;
    cr_assert_eq(mkv_calib_measure(c, full, n, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert(!stopped);
    mkv_calib_free(c);

    /* One worker, stopped after 3 points, each saved as it finished. */
    char *path = cf_tmp_path("state");
    unlink(path);
    char err[MKV_ERR_LEN];
    cJSON *k = key("a");
    stopper_t st = {0, 3, NULL};
    int32_t restored = -1;
    cr_assert_eq(mkv_calib_state_open(path, k, part, n, NULL, &st.state, &restored, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(restored, 0);
    o.workers = 1;
    o.point_done = save_and_maybe_stop;
    o.ctx = &st;
    cr_assert_eq(mkv_calib_create(f.m, &f.doc, 1, &o, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(mkv_calib_measure(c, part, n, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert(stopped, "the callback's stop was not reported");
    int32_t done = 0;
    for (int32_t i = 0; i < n; i++) done += part[i].done;
    cr_assert_eq(done, 3, "%d points done after stopping at 3", done);
    mkv_calib_state_close(st.state);
    mkv_calib_free(c);

    /* A write cut short by the interruption: ignored, and the file stays appendable. */
    FILE *fp = fopen(path, "a");
    fputs("{\"policy\": {\"alpha_h\": 6", fp);
    fclose(fp);

    /* Another run's state file is refused. */
    cJSON *other = key("b");
    mkv_calib_point_t *fresh = grid("0,2,6", "0,0.5,1", &n);
    mkv_calib_state_t *s2 = NULL;
    cr_assert_eq(mkv_calib_state_open(path, other, fresh, n, NULL, &s2, &restored, err), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err, "another run") && strstr(err, "\"tag\""), "%s", err);
    cJSON_Delete(other);

    /* Resume: the 3 saved points come back, the other 4 run, the figures equal the full run's. */
    st = (stopper_t){0, -1, NULL};
    cr_assert_eq(mkv_calib_state_open(path, k, fresh, n, NULL, &st.state, &restored, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(restored, 3);
    cr_assert_eq(mkv_calib_create(f.m, &f.doc, 1, &o, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(mkv_calib_measure(c, fresh, n, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert(!stopped);
    cr_assert_eq(st.seen, 4, "%d points measured on resuming, expected the 4 left", st.seen);
    for (int32_t i = 0; i < n; i++) {
        cr_assert(fresh[i].done);
        cr_assert(fresh[i].q.nll == full[i].q.nll && fresh[i].q.nll_ref == full[i].q.nll_ref &&
                      fresh[i].q.memory_ratio == full[i].q.memory_ratio &&
                      fresh[i].q.agreement == full[i].q.agreement &&
                      fresh[i].q.frac_pruned == full[i].q.frac_pruned,
                  "point %d: resumed %.17g / %.17g vs uninterrupted %.17g / %.17g", i, fresh[i].q.nll,
                  fresh[i].q.memory_ratio, full[i].q.nll, full[i].q.memory_ratio);
    }
    /* Thresholds matter: pruning grows with alpha_l at alpha_h 6. */
    cr_assert(full[n - 1].q.frac_pruned > full[n - 3].q.frac_pruned, "alpha_l 1 prunes no more than 0");
    mkv_calib_state_close(st.state);
    mkv_calib_free(c);
    cJSON_Delete(k);
    unlink(path);
    free(path);
    free(full);
    free(part);
    free(fresh);
    cf_unload(&f);
}

Test(calib_run, small_calibration_holds_on_validation_windows)
{
    cf_fixture_t f;
    cf_load(&f);
    mkv_calib_opts_t o = MKV_CALIB_OPTS_INIT;
    o.window = 255;
    o.prompt_len = 64;
    o.calib_windows = 6;
    o.valid_windows = 6;
    o.max_ppl_increase = 0.01;
    o.max_checks = 3;
    int32_t n;
    mkv_calib_point_t *pts = grid("0,2,4,8", "0,0.5,1,2", &n);
    mkv_calib_t *c = NULL;
    cr_assert_eq(mkv_calib_create(f.m, &f.doc, 1, &o, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    mkv_calib_result_t r;
    cr_assert_eq(mkv_calib_run(c, pts, n, &r), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert(!r.stopped);
    cr_assert_geq(r.chosen, 0, "no point within 1%% on the calibration windows");
    cr_assert(r.validated, "no candidate held on the validation windows (%d checks)", r.n_checks);
    const mkv_calib_point_t *ch = &pts[r.chosen];
    cr_assert(ch->on_front, "the choice is on the front");
    cr_assert_leq(ch->q.ppl_increase, 0.01);
    const mkv_calib_check_t *ck = &r.checks[r.n_checks - 1];
    cr_assert_eq(ck->point, r.chosen);
    cr_assert_leq(ck->valid.ppl_increase, 0.01, "validation: %+.3f%%", 100 * ck->valid.ppl_increase);
    cr_assert_eq(ck->valid.windows, 6);
    /* Every cheaper candidate was checked first and failed there (the winner's curse of a
     * small calibration set: docs/decisions.md); nothing within the tolerance is cheaper. */
    for (int32_t k = 0; k + 1 < r.n_checks; k++) {
        cr_assert(!r.checks[k].passed);
        cr_assert_leq(pts[r.checks[k].point].q.memory_ratio, ch->q.memory_ratio);
    }
    for (int32_t i = 0; i < n; i++) {
        int checked = 0;
        for (int32_t k = 0; k < r.n_checks; k++) checked |= r.checks[k].point == i;
        if (pts[i].q.ppl_increase <= 0.01 && !checked)
            cr_assert_geq(pts[i].q.memory_ratio, ch->q.memory_ratio, "point %d is cheaper", i);
    }
    /* The per-head mix at the choice: fractions of each head's tokens that add up to 1. */
    cr_assert_eq(r.heads.L, f.m->cfg.n_layers);
    cr_assert_eq(r.heads.H, f.m->cfg.n_kv_heads);
    for (int32_t x = 0; x < r.heads.L * r.heads.H; x++)
        cr_assert_float_eq(r.heads.hi[x] + r.heads.lo[x] + r.heads.pruned[x], 1.0, 1e-9);
    mkv_calib_result_free(&r);
    mkv_calib_free(c);
    free(pts);
    cf_unload(&f);
}

/* ---------------------------------------------------------------------------------------- */
/* The command                                                                              */
/* ---------------------------------------------------------------------------------------- */

Test(calib_cli, calibrate_writes_json_policy_and_plot_that_perplexity_accepts)
{
    if (!cf_present()) cr_skip_test("model or data fixture absent under %s: skipped", MIXKV_SHARED_DIR);
    char dir[] = "/tmp/mkv_calib_cli_XXXXXX", cmd[4096];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd,
             "head -c 40000 '%s' | '%s' calibrate --model '%s' --data - --window 128 --prompt-len 32 "
             "--calib-windows 3 --valid-windows 3 --alpha-h 0,2,6 --alpha-l 0,1 --recent-window 16 "
             "--max-ppl-increase 5%% --quiet --json %s/c.json --policy-out %s/p.json --plot %s/c.svg "
             "--resume %s/state.jsonl 2>&1",
             CF_DATA_FILE, MIXKV_CLI_PATH, CF_MODEL_DIR, dir, dir, dir, dir);
    cr_assert_eq(cf_sh(cmd), 0, "%s", cf_out);
    cr_assert(strstr(cf_out, "chosen:"), "%s", cf_out);
    /* The JSON: every point, the front, the choice with its per-layer, per-head mix. */
    snprintf(cmd, sizeof cmd, "cat %s/c.json", dir);
    cr_assert_eq(cf_sh(cmd), 0);
    cJSON *j = cJSON_Parse(cf_out);
    cr_assert_not_null(j);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "schema")->valuestring, "mixkv-calibrate");
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "points")), 5);
    cr_assert_geq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "front")), 1);
    const cJSON *ch = cJSON_GetObjectItem(j, "choice");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(ch, "validated")));
    const cJSON *layers = cJSON_GetObjectItem(ch, "layers");
    cr_assert_eq(cJSON_GetArraySize(layers), 2);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(layers, 0), "heads")), 4);
    const double ah = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "policy"), "alpha_h")->valuedouble;
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "grep -c '<circle' %s/c.svg", dir);
    cr_assert_eq(cf_sh(cmd), 0);
    cr_assert_geq(atoi(cf_out), 5, "the plot has a marker per point");

    /* Rerunning with the state file measures nothing again and chooses the same point. */
    snprintf(cmd, sizeof cmd,
             "head -c 40000 '%s' | '%s' calibrate --model '%s' --data - --window 128 --prompt-len 32 "
             "--calib-windows 3 --valid-windows 3 --alpha-h 0,2,6 --alpha-l 0,1 --recent-window 16 "
             "--max-ppl-increase 5 --resume %s/state.jsonl 2>&1 >/dev/null",
             CF_DATA_FILE, MIXKV_CLI_PATH, CF_MODEL_DIR, dir);
    cr_assert_eq(cf_sh(cmd), 0, "%s", cf_out);
    cr_assert(strstr(cf_out, "5 of 5 points restored"), "%s", cf_out);

    /* The policy file through perplexity --policy: its alphas reach the mode; an explicit
     * option wins over the file wherever it stands. */
    snprintf(cmd, sizeof cmd,
             "head -c 3000 '%s' | '%s' perplexity --model '%s' --data - --window 100 --max-windows 1 "
             "--alpha-l 0 --policy %s/p.json --quiet --json - 2>/dev/null",
             CF_DATA_FILE, MIXKV_CLI_PATH, CF_MODEL_DIR, dir);
    cr_assert_eq(cf_sh(cmd), 0, "%s", cf_out);
    j = cJSON_Parse(cf_out);
    cr_assert_not_null(j, "%s", cf_out);
    const cJSON *pol = cJSON_GetObjectItem(j, "mixkv_policy");
    cr_assert_float_eq(cJSON_GetObjectItem(pol, "alpha_h")->valuedouble, ah, 1e-6);
    cr_assert_float_eq(cJSON_GetObjectItem(pol, "alpha_l")->valuedouble, 0.0, 1e-9);
    cr_assert_eq(cJSON_GetObjectItem(pol, "window")->valueint, 16);
    cJSON_Delete(j);

    /* A broken policy file and a bad list exit 2 before any work. */
    snprintf(cmd, sizeof cmd, "echo '{}' > %s/bad.json; '%s' generate --model x --prompt y --policy %s/bad.json 2>&1",
             dir, MIXKV_CLI_PATH, dir);
    cr_assert_eq(cf_sh(cmd), 2, "%s", cf_out);
    cr_assert(strstr(cf_out, "not a policy file"), "%s", cf_out);
    snprintf(cmd, sizeof cmd, "'%s' calibrate --model x --data y --alpha-l 0,,1 2>&1", MIXKV_CLI_PATH);
    cr_assert_eq(cf_sh(cmd), 2, "%s", cf_out);
    cr_assert(strstr(cf_out, "--alpha-l: '0,,1' has an empty item"), "%s", cf_out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    (void)cf_sh(cmd);
}
