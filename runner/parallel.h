/*
 * parallel.h — the forward pass's thread pool: persistent workers that spin briefly between
 * runs (a decode step runs about 150 short parallel sections; waking sleeping threads for each
 * would cost more than the work) and then sleep. Work is split into static contiguous chunks
 * (memmgr/threads.c's rule), so a run with the same n always splits the same way; the kernels
 * run on it never let the split change a result.
 */
#ifndef MKV_ENGINE_PARALLEL_H
#define MKV_ENGINE_PARALLEL_H

#include <stdint.h>

typedef struct mkv_pool mkv_pool_t;

/* fn processes items [begin, end); part is the index of the thread running it (0: the caller),
 * for per-thread scratch. */
typedef void (*mkv_pool_fn)(void *ctx, int64_t begin, int64_t end, int32_t part);

/* n_threads >= 1 (the caller counts as one; 1 starts no thread). NULL on failure. */
mkv_pool_t *mkv_pool_create(int32_t n_threads);
void mkv_pool_destroy(mkv_pool_t *pool);
int32_t mkv_pool_threads(const mkv_pool_t *pool);

/* Splits [0, n) into min(threads, n) contiguous chunks, chunk i = [n*i/p, n*(i+1)/p), and
 * returns when all are done. pool == NULL runs fn(ctx, 0, n, 0) here. Not reentrant. */
void mkv_pool_run(mkv_pool_t *pool, mkv_pool_fn fn, void *ctx, int64_t n);

/* Online cores (sysconf), at least 1. */
int32_t mkv_cpu_count(void);

#endif /* MKV_ENGINE_PARALLEL_H */
