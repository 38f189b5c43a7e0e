/*
 * jobs.c — calibration's work queue over the runner's pool (see jobs.h).
 */
#include "calib/jobs.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct sched {
    const mkv_jobs_t *q;
    int64_t n_jobs, next, finished;
    const char *phase;
    mkv_job_fn run;
    mkv_job_done_fn done;
    void *ctx;
    pthread_mutex_t lock;
    int stop;                 /* no new job starts */
    int stopped;              /* stopped by *stop or a callback (not by an error) */
    mkv_status_t status;      /* the first error */
    char message[MKV_ERR_LEN];
    double t0;
} sched_t;

double mkv_jobs_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void worker(void *ctx, int64_t begin, int64_t end, int32_t part)
{
    sched_t *s = ctx;
    (void)end;
    const int32_t wk = (int32_t)begin; /* one item per worker: its index */
    (void)part;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        if (!s->stop && s->q->stop && *s->q->stop) s->stop = s->stopped = 1;
        const int64_t j = s->stop || s->next >= s->n_jobs ? -1 : s->next++;
        pthread_mutex_unlock(&s->lock);
        if (j < 0) return;
        const mkv_status_t st = s->run(s->ctx, j, wk);
        pthread_mutex_lock(&s->lock);
        if (st != MKV_STATUS_OK) {
            if (s->status == MKV_STATUS_OK) {
                s->status = st;
                snprintf(s->message, sizeof s->message, "%s", mkv_last_error());
            }
            s->stop = 1;
        } else {
            s->finished++;
            if (s->done && s->done(s->ctx, j)) s->stop = s->stopped = 1;
            if (s->q->progress) {
                const double el = mkv_jobs_now() - s->t0;
                const double eta = el / (double)s->finished * (double)(s->n_jobs - s->finished);
                s->q->progress(s->q->progress_ctx, s->phase, s->finished, s->n_jobs, eta);
            }
        }
        pthread_mutex_unlock(&s->lock);
    }
}

mkv_status_t mkv_jobs_run(const mkv_jobs_t *q, const char *phase, int64_t n_jobs, mkv_job_fn run,
                          mkv_job_done_fn done, void *ctx, int *stopped)
{
    sched_t s;
    memset(&s, 0, sizeof s);
    s.q = q;
    s.n_jobs = n_jobs;
    s.phase = phase;
    s.run = run;
    s.done = done;
    s.ctx = ctx;
    s.t0 = mkv_jobs_now();
    pthread_mutex_init(&s.lock, NULL);
    if (q->pool && n_jobs > 1) {
        /* NOTE: mkv_pool_run splits [0, n) over min(threads, n) threads; asking for exactly
         * `workers` items gives each thread one item, its worker index. */
        mkv_pool_run(q->pool, worker, &s, q->workers);
    } else {
        worker(&s, 0, 1, 0);
    }
    pthread_mutex_destroy(&s.lock);
    if (stopped) *stopped = s.stopped;
    if (s.status != MKV_STATUS_OK) return mkv_report_error(s.status, "%s", s.message);
    return MKV_STATUS_OK;
}
