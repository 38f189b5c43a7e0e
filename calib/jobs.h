/*
 * jobs.h — calibration's work queue (internal to calib/): jobs 0 .. n-1 handed out in order
 * from one counter to `workers` threads of the runner's pool, each calling the job function
 * with its worker index (so it can use that worker's forward pass). A callback under a lock
 * hears of each finished job, in whatever order they finish; progress is reported after each.
 * The first error stops the queue (the jobs in flight finish) and is returned with its
 * message; *stop (a signal handler's flag) or the callback stop it cleanly.
 */
#ifndef MKV_CALIB_JOBS_H
#define MKV_CALIB_JOBS_H

#include "calib/calib.h"
#include "runner/parallel.h"

typedef struct mkv_jobs {
    mkv_pool_t *pool;         /* workers - 1 threads, or NULL: the caller's thread only */
    int32_t workers;
    volatile sig_atomic_t *stop;
    mkv_calib_progress_fn progress; /* or NULL */
    void *progress_ctx;
} mkv_jobs_t;

/* Runs job j on worker `worker` (no lock held). */
typedef mkv_status_t (*mkv_job_fn)(void *ctx, int64_t j, int32_t worker);
/* Job j is done (the queue's lock held); nonzero stops the queue. */
typedef int (*mkv_job_done_fn)(void *ctx, int64_t j);

/* Runs the phase's n_jobs jobs. *stopped (when not NULL) = 1 when *stop or `done` stopped it. */
mkv_status_t mkv_jobs_run(const mkv_jobs_t *q, const char *phase, int64_t n_jobs, mkv_job_fn run,
                          mkv_job_done_fn done, void *ctx, int *stopped);

/* Seconds on a monotonic clock. */
double mkv_jobs_now(void);

#endif /* MKV_CALIB_JOBS_H */
