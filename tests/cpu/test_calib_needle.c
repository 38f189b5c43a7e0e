/*
 * test_calib_needle.c — needle-in-a-haystack retrieval in calibration (calib/needle.h,
 * `calibrate --needle`). The bundled TinyStories model cannot retrieve a number, so these
 * test the mechanics: prompts that hold the secret at the asked depth within the length, the
 * judge on hand-made answers, needle figures on every point beside the FP16 reference's (run
 * once), a policy that keeps everything at full precision answering exactly as FP16 does, the
 * needle-drop constraint on hand-made points, resuming without running the needle trials
 * again, and the command's JSON and refusals. The real runs take about a second on 2 cores.
 */
#include "calib_fixture.h"

#include "calib/calib.h"
#include "calib/needle.h"
#include "calib/state.h"
#include "runner/tokenizer.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A small set: lengths `shorter` and `longer`, depths 0, 0.5 and 1, `trials` each, plain
 * prompts. NOTE: the needle sentence and the question take about 70 of TinyStories' tokens
 * (digits are one token each), so shorter prompts leave almost no haystack. */
static mkv_needle_t *small_set(const cf_fixture_t *f, int32_t shorter, int32_t longer, int32_t trials, int64_t seed)
{
    mkv_needle_opts_t o = MKV_NEEDLE_OPTS_INIT;
    o.lengths[0] = shorter, o.lengths[1] = longer, o.n_lengths = 2;
    o.depths[0] = 0.0, o.depths[1] = 0.5, o.depths[2] = 1.0, o.n_depths = 3;
    o.trials = trials;
    o.max_new = 8;
    o.seed = seed;
    o.plain = 1;
    mkv_needle_t *nd = NULL;
    /* The haystack: the data without its BOS. */
    cr_assert_eq(mkv_needle_create(f->tok, f->ids + 1, f->n - 1, &o, &nd), MKV_STATUS_OK, "%s", mkv_last_error());
    return nd;
}

static int32_t count_tokens(const mkv_tokenizer_t *tok, const char *text, size_t len)
{
    int32_t *ids = NULL, n = 0;
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_tokenizer_encode(tok, text, len, 0, &ids, &n, err), MKV_STATUS_OK, "%s", err);
    free(ids);
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* Prompts and the judge                                                                    */
/* ---------------------------------------------------------------------------------------- */

Test(calib_needle, prompt_holds_the_secret_at_its_depth_within_the_length)
{
    cf_fixture_t f;
    cf_load(&f);
    mkv_needle_t *nd = small_set(&f, 128, 448, 2, 1);
    cr_assert_eq(mkv_needle_count(nd), 2 * 3 * 2);
    cr_assert_eq(mkv_needle_template(nd), MKV_CHAT_NONE);
    const char *question = "\n\nQuestion: What is the secret number mentioned in the text above?\nAnswer: "
                           "The secret number is";
    for (int32_t i = 0; i < mkv_needle_count(nd); i++) {
        const mkv_needle_trial_t *t = mkv_needle_trial(nd, i);
        const int32_t want_len = i < 6 ? 128 : 448;
        const double want_depth = (double)((i / 2) % 3) * 0.5;
        cr_assert(t->length == want_len && t->depth == want_depth, "trial %d: length %d depth %g", i,
                  t->length, t->depth);
        cr_assert(t->secret >= 10000 && t->secret <= 99999);
        cr_assert(t->n_prompt <= t->length && t->n_prompt >= t->length - 24, "trial %d: %d tokens for %d", i,
                  t->n_prompt, t->length);
        cr_assert(t->n_prompt <= mkv_needle_longest(nd));
        char *text = NULL, err[MKV_ERR_LEN];
        cr_assert_eq(mkv_tokenizer_decode(f.tok, t->prompt, t->n_prompt, 1, &text, err), MKV_STATUS_OK);
        char needle[96];
        snprintf(needle, sizeof needle, "The secret number is %ld. Remember it: %ld.", t->secret, t->secret);
        const char *at = strstr(text, needle), *q = strstr(text, question);
        cr_assert(at && q && at < q, "trial %d: no needle before the question in:\n%s", i, text);
        cr_assert_str_eq(q, question, "the prompt ends with the question");
        /* The needle's depth in haystack tokens: at or after depth x the haystack, by at most
         * the 64 tokens the cut may move to a sentence end (plus a few merged at the joins). */
        const int32_t before = count_tokens(f.tok, text, (size_t)(at - text));
        const char *after_needle = at + strlen(needle);
        const int32_t after = count_tokens(f.tok, after_needle, (size_t)(q - after_needle));
        const double H = before + after;
        cr_assert(before >= want_depth * H - 3 && before <= want_depth * H + 64 + 3,
                  "trial %d (depth %g): %d haystack tokens before the needle, %d after", i, want_depth, before,
                  after);
        if (want_depth == 1.0)
            cr_assert_eq(strspn(after_needle, " "), (size_t)(q - after_needle),
                         "depth 1: the needle does not end the haystack: '%.*s'", (int)(q - after_needle),
                         after_needle);
        free(text);
    }
    /* The same seed draws the same trials; another seed other secrets. */
    mkv_needle_t *again = small_set(&f, 128, 448, 2, 1), *other = small_set(&f, 128, 448, 2, 2);
    int differ = 0;
    for (int32_t i = 0; i < mkv_needle_count(nd); i++) {
        const mkv_needle_trial_t *a = mkv_needle_trial(nd, i), *b = mkv_needle_trial(again, i);
        cr_assert(a->secret == b->secret && a->start == b->start && a->n_prompt == b->n_prompt &&
                  !memcmp(a->prompt, b->prompt, (size_t)a->n_prompt * sizeof *a->prompt));
        differ += mkv_needle_trial(other, i)->secret != a->secret;
    }
    cr_assert_geq(differ, 10, "seed 2 drew the secrets of seed 1");
    mkv_needle_free(again);
    mkv_needle_free(other);
    mkv_needle_free(nd);

    /* Refused: a haystack shorter than a length, a depth outside [0, 1], no lengths. */
    mkv_needle_opts_t o = MKV_NEEDLE_OPTS_INIT;
    o.lengths[0] = 128, o.n_lengths = 1;
    cr_assert_eq(mkv_needle_create(f.tok, f.ids, 100, &o, &nd), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(mkv_last_error(), "fewer than"), "%s", mkv_last_error());
    o.depths[0] = 1.5;
    cr_assert_eq(mkv_needle_create(f.tok, f.ids, f.n, &o, &nd), MKV_STATUS_INVALID_ARGUMENT);
    o.depths[0] = 0.0, o.n_lengths = 0;
    cr_assert_eq(mkv_needle_create(f.tok, f.ids, f.n, &o, &nd), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_null(nd);
    cf_unload(&f);
}

Test(calib_needle, judge_takes_the_first_number_of_the_answer)
{
    cr_assert(mkv_needle_judge(" 42817.", 42817));
    cr_assert(mkv_needle_judge("The secret number is 42817, I think", 42817));
    cr_assert(mkv_needle_judge("\n42817\n12345", 42817));
    cr_assert(!mkv_needle_judge(" 12345. No, 42817.", 42817), "only the first number counts");
    cr_assert(!mkv_needle_judge(" 428170", 42817));
    cr_assert(!mkv_needle_judge(" 4281", 42817));
    cr_assert(!mkv_needle_judge(" 42,817", 42817), "a separator ends the number");
    cr_assert(!mkv_needle_judge("I do not know.", 42817));
    cr_assert(!mkv_needle_judge("", 42817));
    cr_assert_eq(mkv_needle_first_number("no digits"), -1);
    cr_assert_eq(mkv_needle_first_number("x7y"), 7);
    cr_assert_eq(mkv_needle_first_number("99999999999999999"), 999999999999L, "at most 12 digits read");
}

/* ---------------------------------------------------------------------------------------- */
/* The choice with a needle-drop limit, on hand-made points                                 */
/* ---------------------------------------------------------------------------------------- */

static mkv_calib_point_t pt(double mem, double inc, int32_t right, int32_t right_ref, int32_t trials)
{
    mkv_calib_point_t p;
    memset(&p, 0, sizeof p);
    p.done = 1;
    p.q.memory_ratio = mem;
    p.q.ppl_increase = inc;
    p.q.agreement = 1.0;
    p.q.needle_trials = trials;
    p.q.needle_right = right;
    p.q.needle_right_ref = right_ref;
    if (trials > 0) {
        p.q.needle_accuracy = (double)right / trials;
        p.q.needle_accuracy_ref = (double)right_ref / trials;
    }
    return p;
}

Test(calib_needle, max_needle_drop_excludes_a_point_that_loses_the_needle)
{
    mkv_calib_point_t p[] = {
        pt(0.30, 0.004, 1, 6, 6), /* 0: cheapest, but answers 1 of 6 where FP16 answers 6 */
        pt(0.40, 0.006, 4, 6, 6), /* 1: a drop of exactly 1/3 */
        pt(0.50, 0.002, 6, 6, 6), /* 2: no drop */
        pt(0.35, 0.020, 6, 6, 6), /* 3: outside the perplexity tolerance */
        pt(0.45, 0.001, 0, 0, 0), /* 4: no needle trials: the needle limit does not apply */
    };
    const int32_t n = sizeof p / sizeof p[0];
    int32_t order[8];
    mkv_calib_limits_t l = {0.01, 0.0, 1.0};
    int32_t k = mkv_calib_eligible(p, n, &l, order);
    cr_assert(k == 4 && order[0] == 0 && order[1] == 1 && order[2] == 4 && order[3] == 2,
              "no needle limit: %d candidates, first %d", k, order[0]);
    l.max_needle_drop = 1.0 / 3.0;
    k = mkv_calib_eligible(p, n, &l, order);
    cr_assert(k == 3 && order[0] == 1 && order[1] == 4 && order[2] == 2,
              "a drop of 1/3 at most: %d candidates, first %d", k, order[0]);
    l.max_needle_drop = 0.0;
    k = mkv_calib_eligible(p, n, &l, order);
    cr_assert(k == 2 && order[0] == 4 && order[1] == 2, "no drop: %d candidates, first %d", k, order[0]);
    cr_assert(!mkv_calib_within(&l, &p[1].q) && mkv_calib_within(&l, &p[2].q));
    /* The old entry point knows nothing of needles. */
    cr_assert_eq(mkv_calib_candidates(p, n, 0.01, 0.0, order), 4);
    /* A handle's limits come from its options. */
    mkv_calib_opts_t o = MKV_CALIB_OPTS_INIT;
    cr_assert(mkv_calib_limits(&o).max_needle_drop >= 1.0, "no constraint by default");
}

/* ---------------------------------------------------------------------------------------- */
/* Real calibrations with needle trials                                                     */
/* ---------------------------------------------------------------------------------------- */

typedef struct counter {
    int64_t calls[4];         /* progress calls per phase: reference, needle reference, sweep, validation */
    int64_t total[4];         /* and the last total */
    int32_t points_seen, stop_after;
    int32_t refs_saved;
    mkv_calib_state_t *state;
} counter_t;

static int phase_index(const char *phase)
{
    static const char *const names[] = {"reference", "needle reference", "sweep", "validation"};
    for (int k = 0; k < 4; k++)
        if (!strcmp(phase, names[k])) return k;
    cr_assert_fail("unknown phase '%s'", phase);
    return 0;
}

static void count_progress(void *ctx, const char *phase, int64_t done, int64_t total, double eta)
{
    counter_t *c = ctx;
    (void)done, (void)eta;
    const int k = phase_index(phase);
    c->calls[k]++;
    c->total[k] = total;
}

static int save_point(void *ctx, const mkv_calib_point_t *p, int32_t index)
{
    counter_t *c = ctx;
    char err[MKV_ERR_LEN];
    (void)index;
    if (c->state) cr_assert_eq(mkv_calib_state_add(c->state, p, err), MKV_STATUS_OK, "%s", err);
    return ++c->points_seen == c->stop_after;
}

static int save_reference(void *ctx, int32_t set, const mkv_needle_result_t *r, int32_t n)
{
    counter_t *c = ctx;
    char err[MKV_ERR_LEN];
    c->refs_saved++;
    if (c->state)
        cr_assert_eq(mkv_calib_state_add_needle_reference(c->state, set, r, n, err), MKV_STATUS_OK, "%s", err);
    return 0;
}

/* Three points: everything at full precision (K16V16 both sides, thresholds 0), and two
 * compressing ones. */
static mkv_calib_point_t *three_points(void)
{
    mkv_calib_point_t *p = calloc(3, sizeof *p);
    for (int i = 0; i < 3; i++) mkv_policy_default(&p[i].policy);
    p[0].policy.hi = p[0].policy.lo = MKV_FORMAT_K16V16;
    p[0].policy.alpha_h = p[0].policy.alpha_l = 0.0f;
    p[1].policy.alpha_h = 2.0f, p[1].policy.alpha_l = 0.5f, p[1].policy.window = 16;
    p[2].policy.alpha_h = 6.0f, p[2].policy.alpha_l = 1.0f, p[2].policy.window = 16;
    return p;
}

static mkv_calib_opts_t needle_opts(const mkv_needle_t *nd, counter_t *ctr)
{
    mkv_calib_opts_t o = MKV_CALIB_OPTS_INIT;
    o.window = 96;
    o.prompt_len = 24;
    o.calib_windows = 2;
    o.valid_windows = 0;
    o.workers = 2;
    o.needle = nd;
    o.progress = count_progress;
    o.point_done = save_point;
    o.needle_ref_done = save_reference;
    o.ctx = ctr;
    return o;
}

Test(calib_needle, every_point_answers_beside_the_reference_run_once)
{
    cf_fixture_t f;
    cf_load(&f);
    mkv_needle_t *nd = small_set(&f, 128, 192, 1, 1);
    const int32_t T = mkv_needle_count(nd);
    counter_t ctr = {{0}, {0}, 0, -1, 0, NULL};
    mkv_calib_opts_t o = needle_opts(nd, &ctr);
    mkv_calib_t *c = NULL;
    o.max_needle_drop = -0.1;
    cr_assert_eq(mkv_calib_create(f.m, &f.doc, 1, &o, &c), MKV_STATUS_INVALID_ARGUMENT, "a negative drop");
    cr_assert(strstr(mkv_last_error(), "needle drop"), "%s", mkv_last_error());
    o.max_needle_drop = 1.0;
    cr_assert_eq(mkv_calib_create(f.m, &f.doc, 1, &o, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    mkv_calib_point_t *p = three_points();
    int stopped = 0;
    cr_assert_eq(mkv_calib_measure(c, p, 3, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert(!stopped);
    cr_assert_eq(ctr.total[1], T, "the needle reference ran %lld trials, not %d", (long long)ctr.total[1], T);
    cr_assert_eq(ctr.calls[1], T);
    cr_assert_eq(ctr.refs_saved, 1);
    cr_assert_eq(ctr.total[2], 3 * (2 + T), "each point: its windows and its trials");
    mkv_calib_quality_t ref;
    mkv_calib_reference(c, &ref);
    cr_assert(ref.needle_trials == T && ref.needle_same == T && ref.needle_right == ref.needle_right_ref);
    const mkv_needle_result_t *fp16 = NULL;
    cr_assert_eq(mkv_calib_needle_reference(c, MKV_CALIB_NEEDLE_CALIBRATION, &fp16), T);
    cr_assert_not_null(fp16);
    for (int i = 0; i < 3; i++) {
        const mkv_calib_quality_t *q = &p[i].q;
        cr_assert(p[i].done);
        cr_assert_eq(q->needle_trials, T, "point %d: %d needle trials", i, q->needle_trials);
        cr_assert_eq(q->needle_right_ref, ref.needle_right, "point %d: the reference's count", i);
        cr_assert(q->needle_accuracy >= 0.0 && q->needle_accuracy <= 1.0);
        cr_assert_eq(q->needle_accuracy_ref, ref.needle_accuracy);
    }
    /* Full precision everywhere: FP16's answers, token for token, and its perplexity. */
    cr_assert_eq(p[0].q.needle_same, T, "the K16V16 point answered %d of %d trials as FP16", p[0].q.needle_same, T);
    cr_assert_eq(p[0].q.needle_right, ref.needle_right);
    cr_assert_eq(p[0].q.needle_accuracy, ref.needle_accuracy);
    cr_assert_eq(p[0].q.nll, p[0].q.nll_ref);
    /* Thresholds change the answers somewhere (the memory is what they buy). */
    cr_assert_lt(p[2].q.needle_same, T, "alpha_h 6 answered every trial as FP16");

    /* More points on the same handle: the needle reference does not run again. */
    memset(&ctr, 0, sizeof ctr);
    ctr.stop_after = -1;
    mkv_calib_point_t *more = three_points();
    cr_assert_eq(mkv_calib_measure(c, more + 1, 1, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert(ctr.calls[0] == 0 && ctr.calls[1] == 0, "the reference ran again");
    cr_assert_eq(ctr.total[2], 2 + T);
    cr_assert(more[1].q.needle_right == p[1].q.needle_right && more[1].q.needle_same == p[1].q.needle_same);
    /* Validation without validation windows: the calibration trials stand in. */
    mkv_calib_quality_t v;
    cr_assert_eq(mkv_calib_validate(c, &p[0].policy, &v, NULL, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert(v.needle_trials == T && v.needle_same == T && v.needle_right == p[0].q.needle_right);
    free(more);
    free(p);
    mkv_calib_free(c);
    mkv_needle_free(nd);
    cf_unload(&f);
}

Test(calib_needle, resume_restores_needle_figures_without_running_them)
{
    cf_fixture_t f;
    cf_load(&f);
    mkv_needle_t *nd = small_set(&f, 128, 192, 1, 1);
    const int32_t T = mkv_needle_count(nd);
    char *path = cf_tmp_path("needle_state");
    unlink(path); /* the state file is new */
    char err[MKV_ERR_LEN];
    cJSON *key = cJSON_CreateObject();
    cJSON_AddStringToObject(key, "tag", "needle");

    /* Uninterrupted. */
    counter_t ctr = {{0}, {0}, 0, -1, 0, NULL};
    mkv_calib_opts_t o = needle_opts(nd, &ctr);
    mkv_calib_t *c = NULL;
    mkv_calib_point_t *full = three_points();
    int stopped = 0;
    cr_assert_eq(mkv_calib_create(f.m, &f.doc, 1, &o, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(mkv_calib_measure(c, full, 3, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    mkv_calib_free(c);

    /* Stopped after the first point, saving the point and the FP16 needle results. */
    memset(&ctr, 0, sizeof ctr);
    ctr.stop_after = 1;
    mkv_calib_point_t *part = three_points();
    int32_t restored = -1;
    cr_assert_eq(mkv_calib_create(f.m, &f.doc, 1, &o, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(mkv_calib_state_open(path, key, part, 3, c, &ctr.state, &restored, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(mkv_calib_measure(c, part, 3, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert(stopped);
    cr_assert_eq(ctr.refs_saved, 1);
    mkv_calib_state_close(ctr.state);
    mkv_calib_free(c);

    /* Resumed: the point and the reference come back; no needle reference runs, and only the
     * two points left run their windows and trials. */
    memset(&ctr, 0, sizeof ctr);
    ctr.stop_after = -1;
    mkv_calib_point_t *fresh = three_points();
    cr_assert_eq(mkv_calib_create(f.m, &f.doc, 1, &o, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(mkv_calib_state_open(path, key, fresh, 3, c, &ctr.state, &restored, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(restored, 1);
    const mkv_needle_result_t *fp16 = NULL;
    cr_assert_eq(mkv_calib_needle_reference(c, MKV_CALIB_NEEDLE_CALIBRATION, &fp16), T);
    cr_assert_not_null(fp16, "the FP16 needle results were not restored");
    cr_assert_eq(mkv_calib_measure(c, fresh, 3, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert(!stopped);
    cr_assert_eq(ctr.calls[1], 0, "the needle reference ran %lld trials on resuming", (long long)ctr.calls[1]);
    cr_assert_eq(ctr.refs_saved, 0);
    cr_assert_eq(ctr.total[2], 2 * (2 + T), "%lld sweep jobs on resuming", (long long)ctr.total[2]);
    cr_assert_eq(ctr.points_seen, 2);
    for (int i = 0; i < 3; i++) {
        const mkv_calib_quality_t *a = &fresh[i].q, *b = &full[i].q;
        cr_assert(a->needle_trials == b->needle_trials && a->needle_right == b->needle_right &&
                      a->needle_right_ref == b->needle_right_ref && a->needle_same == b->needle_same &&
                      a->needle_accuracy == b->needle_accuracy && a->nll == b->nll,
                  "point %d: resumed %d/%d right (%d same) vs uninterrupted %d/%d (%d)", i, a->needle_right,
                  a->needle_trials, a->needle_same, b->needle_right, b->needle_trials, b->needle_same);
    }
    mkv_calib_state_close(ctr.state);
    mkv_calib_free(c);
    cJSON_Delete(key);
    unlink(path);
    free(path);
    free(full);
    free(part);
    free(fresh);
    mkv_needle_free(nd);
    cf_unload(&f);
}

/* ---------------------------------------------------------------------------------------- */
/* The command                                                                              */
/* ---------------------------------------------------------------------------------------- */

Test(calib_needle, calibrate_needle_json_and_refusals)
{
    char cmd[4096];
    /* Bad values exit 2 before any work (the model path is not even read). */
    static const struct {
        const char *args, *words;
    } bad[] = {
        {"--needle --max-needle-drop -0.1", "--max-needle-drop"},
        {"--needle --max-needle-drop 1.5", "--max-needle-drop"},
        {"--needle --needle-lengths ''", "--needle-lengths: no values"},
        {"--needle --needle-lengths 100,,200", "--needle-lengths"},
        {"--needle --needle-depths 0,1.5", "--needle-depths"},
        {"--needle --needle-depths -0.5", "--needle-depths"},
        {"--needle --needle-trials 0", "--needle-trials"},
        {"--max-needle-drop 0.1", "--max-needle-drop needs --needle"},
        {"--haystack x.txt", "--haystack needs --needle"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(cmd, sizeof cmd, "'%s' calibrate --model /nonexistent --data x %s 2>&1", MIXKV_CLI_PATH,
                 bad[k].args);
        cr_assert_eq(cf_sh(cmd), 2, "%s: %s", bad[k].args, cf_out);
        cr_assert(strstr(cf_out, bad[k].words), "%s: '%s' lacks '%s'", bad[k].args, cf_out, bad[k].words);
    }
    if (!cf_present()) cr_skip_test("model or data fixture absent under %s: skipped", MIXKV_SHARED_DIR);
    char dir[] = "/tmp/mkv_needle_cli_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    const char *run = "head -c 30000 '%s' | '%s' calibrate --model '%s' --data - --window 96 --prompt-len 24 "
                      "--calib-windows 2 --valid-windows 2 --alpha-h 0,6 --alpha-l 0,1 --recent-window 16 "
                      "--max-ppl-increase 10 --needle --needle-lengths 128 %s --resume %s/state.jsonl 2>&1";
    char extra[256];
    snprintf(extra, sizeof extra, "--max-needle-drop 0.5 --json %s/c.json", dir);
    snprintf(cmd, sizeof cmd, run, CF_DATA_FILE, MIXKV_CLI_PATH, CF_MODEL_DIR, extra, dir);
    cr_assert_eq(cf_sh(cmd), 0, "%s", cf_out);
    cr_assert(strstr(cf_out, "needle: 3 trials; FP16 answers"), "%s", cf_out);
    snprintf(cmd, sizeof cmd, "cat %s/c.json", dir);
    cr_assert_eq(cf_sh(cmd), 0);
    cJSON *j = cJSON_Parse(cf_out);
    cr_assert_not_null(j);
    cr_assert_float_eq(cJSON_GetObjectItem(j, "max_needle_drop")->valuedouble, 0.5, 1e-12);
    const cJSON *settings = cJSON_GetObjectItem(j, "needle");
    cr_assert_eq(cJSON_GetObjectItem(settings, "trials")->valueint, 1);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(settings, "depths")), 3);
    const cJSON *fp16 = cJSON_GetObjectItem(j, "fp16");
    cr_assert_eq(cJSON_GetObjectItem(fp16, "needle_trials")->valueint, 3);
    const double ref_acc = cJSON_GetObjectItem(fp16, "needle_accuracy")->valuedouble;
    const cJSON *pts = cJSON_GetObjectItem(j, "points"), *p;
    cr_assert_eq(cJSON_GetArraySize(pts), 3);
    cJSON_ArrayForEach(p, pts) {
        const cJSON *q = cJSON_GetObjectItem(p, "calibration");
        const cJSON *acc = cJSON_GetObjectItem(q, "needle_accuracy");
        cr_assert(cJSON_IsNumber(acc), "a point without needle_accuracy");
        cr_assert_eq(cJSON_GetObjectItem(q, "needle_trials")->valueint, 3);
        cr_assert_float_eq(cJSON_GetObjectItem(q, "needle_accuracy_ref")->valuedouble, ref_acc, 0.0);
    }
    const cJSON *ch = cJSON_GetObjectItem(j, "choice");
    cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "calibration"), "needle_accuracy")));
    /* Validation ran the held-back trials. */
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "validation"), "needle_trials")->valueint, 3);
    cJSON_Delete(j);
    /* The state file holds the FP16 needle results once per set. */
    snprintf(cmd, sizeof cmd, "grep -c needle_reference %s/state.jsonl", dir);
    cr_assert_eq(cf_sh(cmd), 0);
    cr_assert_eq(atoi(cf_out), 2, "%s", cf_out);

    /* Resumed: nothing of the needle runs again in the sweep; other needle settings are refused. */
    snprintf(cmd, sizeof cmd, run, CF_DATA_FILE, MIXKV_CLI_PATH, CF_MODEL_DIR, "", dir);
    cr_assert_eq(cf_sh(cmd), 0, "%s", cf_out);
    cr_assert(strstr(cf_out, "3 of 3 points restored") && strstr(cf_out, "needle reference restored"), "%s", cf_out);
    cr_assert(!strstr(cf_out, "needle reference:") && !strstr(cf_out, "sweep:"), "%s", cf_out);
    snprintf(cmd, sizeof cmd, run, CF_DATA_FILE, MIXKV_CLI_PATH, CF_MODEL_DIR, "--needle-trials 2", dir);
    cr_assert_eq(cf_sh(cmd), 2, "%s", cf_out);
    cr_assert(strstr(cf_out, "\"needle\" differs"), "%s", cf_out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    (void)cf_sh(cmd);
}
