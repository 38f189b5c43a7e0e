/*
 * threads.c — a persistent pthread pool (see threads.h). Workers sleep on a condition
 * variable between runs; a run bumps a generation counter, each thread (the caller included)
 * takes one contiguous chunk, and the caller waits until every worker has finished its chunk.
 * Chunks are static, so a run with the same n always splits the same way.
 */
#include "memmgr/threads.h"

#include <pthread.h>
#include <stdlib.h>

struct mkv_threads {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* workers wait here for a new generation */
    pthread_cond_t done; /* the caller waits here for pending == 0 */
    pthread_t *workers;  /* [n_threads - 1] */
    int32_t n_threads;
    uint64_t generation;
    int32_t pending;
    int quit;
    mkv_range_fn fn;
    void *ctx;
    int64_t n;
};

typedef struct worker_arg {
    mkv_threads_t *tp;
    int32_t index; /* 1 .. n_threads - 1; the caller is 0 */
} worker_arg_t;

static void chunk(int64_t n, int32_t parts, int32_t index, int64_t *begin, int64_t *end)
{
    *begin = n * index / parts;
    *end = n * (index + 1) / parts;
}

static void *worker_main(void *p)
{
    worker_arg_t *arg = p;
    mkv_threads_t *tp = arg->tp;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&tp->mu);
        while (!tp->quit && tp->generation == seen) pthread_cond_wait(&tp->wake, &tp->mu);
        if (tp->quit) {
            pthread_mutex_unlock(&tp->mu);
            break;
        }
        seen = tp->generation;
        mkv_range_fn fn = tp->fn;
        void *ctx = tp->ctx;
        int64_t n = tp->n;
        pthread_mutex_unlock(&tp->mu);

        int64_t b, e;
        chunk(n, tp->n_threads, arg->index, &b, &e);
        if (b < e) fn(ctx, b, e);

        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0) pthread_cond_signal(&tp->done);
        pthread_mutex_unlock(&tp->mu);
    }
    free(arg);
    return NULL;
}

mkv_threads_t *mkv_threads_create(int32_t n_threads)
{
    if (n_threads < 2) return NULL;
    mkv_threads_t *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
    if (!tp->workers) {
        free(tp);
        return NULL;
    }
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->done, NULL);
    tp->n_threads = 1;
    for (int32_t i = 1; i < n_threads; i++) {
        worker_arg_t *arg = malloc(sizeof *arg);
        if (!arg) break;
        arg->tp = tp;
        arg->index = i;
        if (pthread_create(&tp->workers[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            break;
        }
        tp->n_threads++;
    }
    if (tp->n_threads != n_threads) {
        mkv_threads_destroy(tp);
        return NULL;
    }
    return tp;
}

void mkv_threads_destroy(mkv_threads_t *tp)
{
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->quit = 1;
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int32_t i = 0; i + 1 < tp->n_threads; i++) pthread_join(tp->workers[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->wake);
    pthread_cond_destroy(&tp->done);
    free(tp->workers);
    free(tp);
}

void mkv_threads_run(mkv_threads_t *tp, mkv_range_fn fn, void *ctx, int64_t n)
{
    if (n <= 0) return;
    if (!tp || n < tp->n_threads) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n = n;
    tp->pending = tp->n_threads - 1;
    tp->generation++;
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);

    int64_t b, e;
    chunk(n, tp->n_threads, 0, &b, &e);
    if (b < e) fn(ctx, b, e);

    pthread_mutex_lock(&tp->mu);
    while (tp->pending > 0) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}
