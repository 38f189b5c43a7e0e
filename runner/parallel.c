/*
 * parallel.c — see parallel.h. A run publishes (fn, ctx, n, parts) and bumps a generation
 * counter; workers spin on it for a while (about 0.2 ms) and then sleep on a condition
 * variable. Sleeping is race-free with sequentially consistent atomics: a worker counts itself
 * in `sleepers` under the mutex before re-checking the generation, and the caller, after bumping
 * the generation, takes the mutex and broadcasts whenever it sees a sleeper.
 */
#include "runner/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define SPINS (1 << 14)

struct mkv_pool {
    int32_t n_threads;
    pthread_t *workers;           /* [n_threads - 1] */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint_fast64_t generation;
    atomic_int pending;           /* chunks of the current run not finished */
    atomic_int sleepers;
    atomic_int quit;
    /* The current run; written before the generation bump, read after seeing it. */
    mkv_pool_fn fn;
    void *ctx;
    int64_t n;
    int32_t parts;
};

typedef struct worker_arg {
    mkv_pool_t *pool;
    int32_t index;
} worker_arg_t;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_part(mkv_pool_t *p, int32_t i)
{
    if (i >= p->parts) return;
    const int64_t b = p->n * i / p->parts, e = p->n * (i + 1) / p->parts;
    if (b < e) p->fn(p->ctx, b, e, i);
}

static void *worker_main(void *argp)
{
    worker_arg_t *arg = argp;
    mkv_pool_t *p = arg->pool;
    const int32_t index = arg->index;
    free(arg);
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->quit)) {
            if (++spins < SPINS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->quit)) break;
        seen = g;
        run_part(p, index);
        atomic_fetch_sub(&p->pending, 1);
    }
    return NULL;
}

int32_t mkv_cpu_count(void)
{
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int32_t)n;
}

mkv_pool_t *mkv_pool_create(int32_t n_threads)
{
    if (n_threads < 1) return NULL;
    mkv_pool_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->quit, 0);
    p->n_threads = 1;
    for (int32_t i = 1; i < n_threads; i++) {
        worker_arg_t *arg = malloc(sizeof *arg);
        if (!arg) break;
        arg->pool = p;
        arg->index = i;
        if (pthread_create(&p->workers[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            break;
        }
        p->n_threads++;
    }
    if (p->n_threads != n_threads) {
        mkv_pool_destroy(p);
        return NULL;
    }
    return p;
}

void mkv_pool_destroy(mkv_pool_t *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i + 1 < p->n_threads; i++) pthread_join(p->workers[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p->workers);
    free(p);
}

int32_t mkv_pool_threads(const mkv_pool_t *p) { return p ? p->n_threads : 1; }

void mkv_pool_run(mkv_pool_t *p, mkv_pool_fn fn, void *ctx, int64_t n)
{
    if (n <= 0) return;
    if (!p || p->n_threads == 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->parts = n < p->n_threads ? (int32_t)n : p->n_threads;
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    run_part(p, 0);
    int spins = 0;
    while (atomic_load(&p->pending) > 0)
        if (++spins < SPINS) cpu_relax();
        else sched_yield();
}
