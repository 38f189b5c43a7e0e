/*
 * test_memmgr_random.c — randomised operation sequences (admit, append, grow, shrink, mixed
 * resizes, placements, releases, deliberate over-demand and invalid input) checked after every
 * operation against the independent reference model of testutil.c: exact page ids in the free
 * region and every row, counts, slots, reservations, stats; refused calls change nothing;
 * mkv_cache_validate passes throughout. Small pools make full pools and ring wrap-around common.
 */
#include "testutil.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

typedef struct run_cfg {
    uint64_t seed;
    int32_t L, H, S, max_seq_len;
    mkv_format_t hi, lo;
    int32_t hi_tpp; /* page holds exactly this many high tokens */
    int64_t P;
    int32_t steps;
} run_cfg_t;

typedef struct run_counts {
    int64_t ok, out_of_pages, out_of_slots, invalid, over_refused, full_seen, wraps;
} run_counts_t;

static mkv_cache_t *make_cache(const run_cfg_t *rc)
{
    mkv_cache_config_t cfg = tu_config(rc->L, rc->H, rc->S, rc->max_seq_len, 1, rc->P);
    int64_t bytes = 0;
    cfg.hi_format = rc->hi;
    cfg.lo_format = rc->lo;
    TU_OK(mkv_page_bytes_for(rc->hi, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group, rc->hi_tpp,
                             &bytes));
    cfg.page_bytes = bytes;
    return tu_create(&cfg);
}

static void run(const run_cfg_t *rc, run_counts_t *cnt)
{
    mkv_cache_t *c = make_cache(rc);
    tu_model_t m;
    tu_op_t op;
    tu_rng_t rng = {rc->seed};
    tu_model_init(&m, c);
    tu_op_init(&op, &m);
    cr_assert_eq(m.tpp_hi, rc->hi_tpp);
    tu_model_expect_matches(&m, c, "initial state");
    for (int32_t step = 0; step < rc->steps; step++) {
        char where[160];
        tu_op_random(&rng, &m, &op);
        snprintf(where, sizeof where, "seed %llu step %d (%s, %d slots, prompt %d)",
                 (unsigned long long)rc->seed, step, op.label, op.n, op.prompt_len);
        if (op.kind == TU_OP_ADMIT && op.prompt_len >= 1) {
            int ok = -1;
            int64_t demand = -1;
            TU_COK(c, mkv_cache_can_admit(c, op.prompt_len, &ok));
            TU_COK(c, mkv_cache_prompt_demand(c, op.prompt_len, &demand));
            cr_assert_eq(demand, tu_model_prompt_demand(&m, op.prompt_len), "%s: demand", where);
            int free_slot = 0;
            for (int32_t s = 0; s < m.S; s++) free_slot |= !m.active[s];
            int want_ok = free_slot && m.fifo_len - tu_model_reserved_total(&m) >= demand;
            cr_assert_eq(ok, want_ok, "%s: can_admit says %d", where, ok);
        }
        tu_snap_t before, after;
        tu_snap_take(c, &before);
        int32_t cs = -1, ms = -1;
        int also_short = 0;
        mkv_status_t got = tu_op_apply_cache(c, &op, &cs);
        mkv_status_t want = tu_op_apply_model(&m, &op, &ms, &also_short);
        if (want == MKV_STATUS_OUT_OF_SLOTS && also_short)
            cr_assert(got == MKV_STATUS_OUT_OF_SLOTS || got == MKV_STATUS_OUT_OF_PAGES,
                      "%s: got '%s', expected out of slots or pages (%s)", where,
                      mkv_status_string(got), mkv_cache_last_error(c));
        else
            cr_assert_eq(got, want, "%s: got '%s', model says '%s' (%s)", where,
                         mkv_status_string(got), mkv_status_string(want),
                         mkv_cache_last_error(c));
        if (got == MKV_STATUS_OK) {
            cnt->ok++;
            if (op.kind == TU_OP_ADMIT) cr_assert_eq(cs, ms, "%s: slot %d, model %d", where, cs, ms);
            cr_assert_str_eq(mkv_cache_last_error(c), "", "%s: message after success", where);
        } else {
            cr_assert_str_neq(mkv_cache_last_error(c), "", "%s: no message", where);
            tu_snap_take(c, &after);
            tu_snap_expect_equal(&before, &after, 1, where);
            tu_snap_free(&after);
            cnt->out_of_pages += got == MKV_STATUS_OUT_OF_PAGES;
            cnt->out_of_slots += got == MKV_STATUS_OUT_OF_SLOTS;
            cnt->invalid += got == MKV_STATUS_INVALID_ARGUMENT;
            cnt->over_refused += got == MKV_STATUS_OUT_OF_PAGES && strcmp(op.label, "over") == 0;
        }
        tu_snap_free(&before);
        tu_model_expect_matches(&m, c, where);
        cnt->full_seen += m.fifo_len - tu_model_reserved_total(&m) == 0;
    }
    cnt->wraps += m.head / m.P;
    tu_op_free(&op);
    tu_model_free(&m);
    mkv_cache_destroy(c);
}

static void expect_coverage(const run_counts_t *c, int need_full)
{
    cr_log_info("ok %lld, out of pages %lld (deliberate %lld), out of slots %lld, invalid %lld, "
                "exhausted %lld steps, ring wraps %lld",
                (long long)c->ok, (long long)c->out_of_pages, (long long)c->over_refused,
                (long long)c->out_of_slots, (long long)c->invalid, (long long)c->full_seen,
                (long long)c->wraps);
    cr_assert_gt(c->ok, 0);
    cr_assert_gt(c->out_of_pages, 0, "no over-demand was ever refused");
    cr_assert_gt(c->over_refused, 0, "no deliberate over-demand was refused");
    cr_assert_gt(c->invalid, 0, "no invalid input was drawn");
    cr_assert_gt(c->wraps, 2, "the ring wrapped only %lld times", (long long)c->wraps);
    if (need_full) cr_assert_gt(c->full_seen, 0, "the pool was never exhausted");
}

/* Tiny pool: full pools and wrap-around all the time. */
Test(random, tiny_pool)
{
    run_counts_t cnt = {0};
    for (uint64_t seed = 1; seed <= 5; seed++) {
        run_cfg_t rc = {seed, 1, 2, 4, 32, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 4, 12, 5000};
        run(&rc, &cnt);
    }
    expect_coverage(&cnt, 1);
    cr_assert_gt(cnt.out_of_slots, 0);
}

/* More layers, heads and slots with a moderate pool. */
Test(random, moderate_pool)
{
    run_counts_t cnt = {0};
    for (uint64_t seed = 11; seed <= 15; seed++) {
        run_cfg_t rc = {seed, 2, 2, 5, 48, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 4, 40, 5000};
        run(&rc, &cnt);
    }
    expect_coverage(&cnt, 1);
}

/* Low pages hold fewer tokens than high ones (rows sized by tpp_lo). */
Test(random, low_format_smaller_pages)
{
    run_counts_t cnt = {0};
    for (uint64_t seed = 21; seed <= 25; seed++) {
        run_cfg_t rc = {seed, 1, 3, 4, 40, MKV_FORMAT_K4V2, MKV_FORMAT_K8V8, 5, 30, 5000};
        run(&rc, &cnt);
    }
    expect_coverage(&cnt, 1);
}

/* One token per high page: a page boundary at every token. */
Test(random, one_token_pages)
{
    run_counts_t cnt = {0};
    for (uint64_t seed = 31; seed <= 35; seed++) {
        run_cfg_t rc = {seed, 1, 2, 3, 24, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 1, 50, 5000};
        run(&rc, &cnt);
    }
    expect_coverage(&cnt, 1);
}

/* Larger pool and pages of 8 tokens: long sequences, wide rows. */
Test(random, larger_pool)
{
    run_counts_t cnt = {0};
    for (uint64_t seed = 41; seed <= 45; seed++) {
        run_cfg_t rc = {seed, 2, 3, 6, 64, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 8, 100, 5000};
        run(&rc, &cnt);
    }
    expect_coverage(&cnt, 0);
}
