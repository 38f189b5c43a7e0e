/*
 * threads.h — a small persistent pthread pool for the CPU backend's parallel phases
 * (planning and page-id copies). The calling thread takes part; a run returns when every
 * item is done. Threads are created once with the cache, never inside a step.
 */
#ifndef MKV_MEMMGR_THREADS_H
#define MKV_MEMMGR_THREADS_H

#include <stdint.h>

typedef struct mkv_threads mkv_threads_t;

/* fn processes items [begin, end) of a run. */
typedef void (*mkv_range_fn)(void *ctx, int64_t begin, int64_t end);

/* n_threads >= 2 (the caller counts as one). NULL on failure. */
mkv_threads_t *mkv_threads_create(int32_t n_threads);
void mkv_threads_destroy(mkv_threads_t *tp);

/* Splits [0, n) into one contiguous chunk per thread. tp == NULL runs fn(ctx, 0, n) here. */
void mkv_threads_run(mkv_threads_t *tp, mkv_range_fn fn, void *ctx, int64_t n);

#endif /* MKV_MEMMGR_THREADS_H */
