/*
 * test_threads.c — the CPU backend's pthread pool (memmgr/threads.h): every item of [0, n)
 * processed exactly once, in at most one contiguous chunk per thread, with the caller taking
 * part and the run returning only when all is done; and a multi-threaded cache producing exactly
 * the state of a serial one for the same random operation sequence.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */

#include "memmgr/threads.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct count_ctx {
    atomic_int *hits;      /* [n] */
    int64_t n;
    atomic_int bad_ranges; /* calls with begin > end or outside [0, n) */
    atomic_int chunks;     /* calls with a non-empty range */
    atomic_int caller_items;
    pthread_t caller;
    int slow;              /* sleep in every chunk, so that late workers would be noticed */
} count_ctx_t;

static void count_fn(void *p, int64_t begin, int64_t end)
{
    count_ctx_t *ctx = p;
    if (begin < 0 || end > ctx->n || begin > end) {
        atomic_fetch_add(&ctx->bad_ranges, 1);
        return;
    }
    if (begin < end) atomic_fetch_add(&ctx->chunks, 1);
    if (ctx->slow) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (pthread_equal(pthread_self(), ctx->caller))
        atomic_fetch_add(&ctx->caller_items, (int)(end - begin));
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&ctx->hits[i], 1);
}

/* Runs the pool `reps` times over [0, n) and checks every run. */
static void check_runs(mkv_threads_t *tp, int32_t n_threads, int64_t n, int reps, int slow)
{
    count_ctx_t ctx;
    ctx.hits = calloc((size_t)(n ? n : 1), sizeof(atomic_int));
    cr_assert_not_null(ctx.hits);
    ctx.n = n;
    ctx.caller = pthread_self();
    ctx.slow = slow;
    for (int rep = 0; rep < reps; rep++) {
        for (int64_t i = 0; i < n; i++) atomic_store(&ctx.hits[i], 0);
        atomic_store(&ctx.bad_ranges, 0);
        atomic_store(&ctx.chunks, 0);
        atomic_store(&ctx.caller_items, 0);
        mkv_threads_run(tp, count_fn, &ctx, n);
        cr_assert_eq(atomic_load(&ctx.bad_ranges), 0, "threads %d n %lld: bad range", n_threads,
                     (long long)n);
        for (int64_t i = 0; i < n; i++)
            cr_assert_eq(atomic_load(&ctx.hits[i]), 1,
                         "threads %d n %lld rep %d: item %lld processed %d times", n_threads,
                         (long long)n, rep, (long long)i, atomic_load(&ctx.hits[i]));
        int chunks = atomic_load(&ctx.chunks);
        cr_assert(chunks <= (tp ? n_threads : 1), "threads %d n %lld: %d chunks", n_threads,
                  (long long)n, chunks);
        if (n >= n_threads)
            cr_assert_gt(atomic_load(&ctx.caller_items), 0,
                         "threads %d n %lld: the caller processed nothing", n_threads,
                         (long long)n);
    }
    free(ctx.hits);
}

static const int64_t k_sizes[] = {0, 1, 2, 3, 5, 7, 16, 63, 1000, 100003};

Test(threads, every_item_once)
{
    static const int32_t counts[] = {2, 3, 4, 7, 16};
    for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
        mkv_threads_t *tp = mkv_threads_create(counts[t]);
        cr_assert_not_null(tp, "mkv_threads_create(%d) failed", counts[t]);
        for (size_t s = 0; s < sizeof k_sizes / sizeof k_sizes[0]; s++)
            check_runs(tp, counts[t], k_sizes[s], k_sizes[s] > 5000 ? 3 : 20, 0);
        mkv_threads_destroy(tp);
    }
}

Test(threads, many_runs_one_pool)
{
    mkv_threads_t *tp = mkv_threads_create(3);
    cr_assert_not_null(tp);
    for (int i = 0; i < 2000; i++) check_runs(tp, 3, i % 37, 1, 0);
    mkv_threads_destroy(tp);
}

Test(threads, run_waits_for_slow_workers)
{
    mkv_threads_t *tp = mkv_threads_create(4);
    cr_assert_not_null(tp);
    check_runs(tp, 4, 64, 10, 1);
    check_runs(tp, 4, 3, 10, 1);
    mkv_threads_destroy(tp);
}

Test(threads, null_pool_runs_inline)
{
    for (size_t s = 0; s < sizeof k_sizes / sizeof k_sizes[0]; s++)
        check_runs(NULL, 1, k_sizes[s], 2, 0);
    mkv_threads_destroy(NULL);
}

Test(threads, create_destroy_repeatedly)
{
    for (int i = 0; i < 50; i++) {
        mkv_threads_t *tp = mkv_threads_create(2 + i % 5);
        cr_assert_not_null(tp);
        if (i % 2) check_runs(tp, 2 + i % 5, 100, 1, 0);
        mkv_threads_destroy(tp);
    }
}

/* Two pools used at once from two host threads (distinct handles are independent). */
static void *pool_user(void *arg)
{
    (void)arg;
    mkv_threads_t *tp = mkv_threads_create(3);
    cr_assert_not_null(tp);
    for (int i = 0; i < 300; i++) check_runs(tp, 3, 1 + i % 200, 1, 0);
    mkv_threads_destroy(tp);
    return NULL;
}

Test(threads, independent_pools_concurrently)
{
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, pool_user, NULL), 0);
    pool_user(NULL);
    cr_assert_eq(pthread_join(th, NULL), 0);
}

/* ---------------------------------------------------------------------------------------- */
/* n_threads > 1 gives the serial result                                                    */
/* ---------------------------------------------------------------------------------------- */

/* min_regions: the parallel threshold of the threaded cache (0: every call runs threaded). */
static void equivalence(uint64_t seed, int32_t L, int32_t H, int32_t S, int64_t P,
                        int32_t n_threads, int32_t steps, int64_t min_regions)
{
    mkv_cache_config_t cfg = tu_config(L, H, S, 64, 4, P);
    cfg.n_threads = 1;
    mkv_cache_t *serial = tu_create(&cfg);
    cfg.n_threads = n_threads;
    mkv_cache_t *par = tu_create(&cfg);
    par->parallel_min_regions = min_regions;
    int64_t threaded_calls = 0;
    cr_assert_null(serial->threads);
    cr_assert_not_null(par->threads, "n_threads %d created no pool", n_threads);
    tu_model_t m;
    tu_op_t op;
    tu_rng_t rng = {seed};
    tu_model_init(&m, serial);
    tu_op_init(&op, &m);
    int64_t ok = 0, refused = 0;
    for (int32_t step = 0; step < steps; step++) {
        char where[128];
        tu_op_random(&rng, &m, &op);
        snprintf(where, sizeof where, "seed %llu step %d (%s)", (unsigned long long)seed, step,
                 op.label);
        int32_t s1 = -1, s2 = -1, sm = -1;
        mkv_status_t a = tu_op_apply_cache(serial, &op, &s1);
        mkv_status_t b = tu_op_apply_cache(par, &op, &s2);
        threaded_calls += (op.kind != TU_OP_ADMIT) &&
                          (int64_t)(op.kind == TU_OP_RELEASE ? 1 : op.n) * L * H >= min_regions;
        mkv_status_t want = tu_op_apply_model(&m, &op, &sm, NULL);
        cr_assert_eq(a, b, "%s: serial '%s', %d threads '%s' (%s)", where, mkv_status_string(a),
                     n_threads, mkv_status_string(b), mkv_cache_last_error(par));
        cr_assert_eq(s1, s2, "%s: admitted into %d and %d", where, s1, s2);
        if (a == MKV_STATUS_OK) {
            cr_assert_eq(want, MKV_STATUS_OK, "%s: model says '%s'", where,
                         mkv_status_string(want));
            ok++;
        } else {
            refused++;
            if (want == MKV_STATUS_OK) { /* keep the model in step: it applied the op */
                cr_assert_fail("%s: refused with '%s', model applied it", where,
                               mkv_status_string(a));
            }
        }
        tu_snap_t x, y;
        tu_snap_take(serial, &x);
        tu_snap_take(par, &y);
        tu_snap_expect_equal(&x, &y, 1, where);
        tu_snap_free(&x);
        tu_snap_free(&y);
        if (step % 16 == 0 || step == steps - 1) {
            tu_model_expect_matches(&m, serial, where);
            tu_model_expect_matches(&m, par, where);
        }
    }
    cr_assert_gt(ok, steps / 4);
    cr_assert_gt(refused, 0);
    cr_assert_gt(threaded_calls, steps / 10, "only %lld calls took the threaded path",
                 (long long)threaded_calls);
    tu_op_free(&op);
    tu_model_free(&m);
    mkv_cache_destroy(serial);
    mkv_cache_destroy(par);
}

Test(threads, three_threads_match_serial)
{
    equivalence(101, 8, 8, 8, 1500, 3, 1000, 0);
    equivalence(102, 8, 8, 8, 400, 3, 1000, 0); /* tight pool: many refusals and wraps */
}

Test(threads, many_threads_match_serial)
{
    equivalence(201, 4, 8, 16, 1200, 7, 300, 0);
    equivalence(202, 1, 2, 4, 24, 5, 2000, 0); /* tiny cache: fewer sections than threads */
}

Test(threads, default_threshold_matches_serial)
{
    /* Llama-3-8B's 32 x 8 head-regions per slot: calls of 8 or more slots cross the default
     * threshold and run threaded, smaller ones inline. */
    equivalence(301, 32, 8, 16, 60000, 4, 200, MKV_PARALLEL_MIN_REGIONS);
}
