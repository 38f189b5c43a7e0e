/*
 * calib.c — measuring policies against the FP16 cache on windows of a dataset (see calib.h).
 *
 * Everything is a job: one window through one cache (the FP16 reference, or a policy's),
 * run by a worker with its own forward pass and a cache made for the job. Jobs are handed out
 * in order from one counter, so a point's windows finish close together and the point is
 * reported as soon as its last window is in; per-window results are kept and summed in window
 * order, so the figures do not depend on which worker ran what.
 */
#include "calib/calib.h"

#include "runner/parallel.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One window through one cache. */
typedef struct win_stats {
    double nll;
    int64_t predictions, agree;
    double memory_ratio;
    int64_t hi, lo, pruned; /* token-heads at the window's end */
    double seconds;
} win_stats_t;

struct mkv_calib {
    const mkv_model_t *m;
    mkv_calib_opts_t o;
    const int32_t **win;     /* [n_calib + n_valid] each window's first token */
    int32_t n_calib, n_valid;
    int ref_done;
    win_stats_t *ref;        /* [n_calib + n_valid] the FP16 cache on each window */
    int32_t *ref_pred;       /* [n_calib + n_valid][window - 1] its greedy predictions */
    int32_t workers;
    mkv_pool_t *pool;        /* workers - 1 threads; NULL for one worker */
    mkv_forward_ws_t **ws;   /* [workers] */
    float **logits;          /* [workers][prompt_len][vocab] */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int64_t mkv_calib_windows_available(const mkv_ppl_doc_t *docs, int32_t n_docs, const mkv_calib_opts_t *o)
{
    const mkv_ppl_opts_t po = {.window = o->window, .prompt_len = o->prompt_len,
                               .windows_per_doc = o->windows_per_doc};
    return mkv_perplexity_windows(docs, n_docs, &po);
}

void mkv_calib_free(mkv_calib_t *c)
{
    if (!c) return;
    for (int32_t w = 0; c->ws && w < c->workers; w++) {
        mkv_forward_ws_free(c->ws[w]);
        free(c->logits[w]);
    }
    free(c->ws);
    free(c->logits);
    mkv_pool_destroy(c->pool);
    free(c->win);
    free(c->ref);
    free(c->ref_pred);
    free(c);
}

mkv_status_t mkv_calib_create(const mkv_model_t *m, const mkv_ppl_doc_t *docs, int32_t n_docs,
                              const mkv_calib_opts_t *o, mkv_calib_t **out)
{
    *out = NULL;
    if (!m || !docs || !o)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "mkv_calib_create: null argument");
    if (o->window < 2 || o->window > m->cfg.max_pos || o->prompt_len < 1 || o->prompt_len >= o->window)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "window %d and prompt length %d: need 1 <= prompt < window <= the "
                                "model's %d positions", o->window, o->prompt_len, m->cfg.max_pos);
    if (o->calib_windows < 1 || o->valid_windows < 0 || o->windows_per_doc < 0 || o->workers < 0 ||
        o->max_checks < 1 || !(o->max_ppl_increase >= 0) || !(o->min_agreement >= 0 && o->min_agreement <= 1))
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "calibration options out of range (calibration windows %d >= 1, "
                                "validation windows %d >= 0, tolerance %g >= 0, agreement %g in [0, 1], "
                                "checks %d >= 1)", o->calib_windows, o->valid_windows,
                                o->max_ppl_increase, o->min_agreement, o->max_checks);
    const int64_t have = mkv_calib_windows_available(docs, n_docs, o);
    const int64_t need = (int64_t)o->calib_windows + o->valid_windows;
    if (have < need)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "the data holds %lld windows of %d tokens; %d calibration and %d "
                                "validation windows need %lld", (long long)have, o->window,
                                o->calib_windows, o->valid_windows, (long long)need);
    mkv_calib_t *c = calloc(1, sizeof *c);
    if (!c) goto oom;
    c->m = m;
    c->o = *o;
    c->n_calib = o->calib_windows;
    c->n_valid = o->valid_windows;
    const int32_t nw = c->n_calib + c->n_valid;
    c->win = calloc((size_t)nw, sizeof *c->win);
    c->ref = calloc((size_t)nw, sizeof *c->ref);
    c->ref_pred = malloc((size_t)nw * (size_t)(o->window - 1) * sizeof *c->ref_pred);
    if (!c->win || !c->ref || !c->ref_pred) goto oom;
    /* The windows in document order, as mkv_perplexity takes them. */
    int32_t k = 0;
    for (int32_t d = 0; d < n_docs && k < nw; d++) {
        int64_t n = docs[d].n / o->window;
        if (o->windows_per_doc > 0 && n > o->windows_per_doc) n = o->windows_per_doc;
        for (int64_t j = 0; j < n && k < nw; j++) c->win[k++] = docs[d].tokens + j * o->window;
    }
    const int32_t cores = mkv_cpu_count();
    c->workers = o->workers > 0 ? o->workers : cores;
    if (c->workers > 256) c->workers = 256;
    if (c->workers > 1 && !(c->pool = mkv_pool_create(c->workers))) goto oom;
    c->ws = calloc((size_t)c->workers, sizeof *c->ws);
    c->logits = calloc((size_t)c->workers, sizeof *c->logits);
    if (!c->ws || !c->logits) goto oom;
    for (int32_t w = 0; w < c->workers; w++) {
        char err[MKV_ERR_LEN];
        mkv_status_t st = mkv_forward_ws_create(m, o->prompt_len, &c->ws[w], err);
        if (st != MKV_STATUS_OK) {
            mkv_calib_free(c);
            return mkv_report_error(st, "%s", err);
        }
        /* One worker: the forward pass gets every core; several: one each. */
        if (c->workers > 1 && mkv_forward_ws_set_threads(c->ws[w], 1) != MKV_STATUS_OK) goto oom;
        if (!(c->logits[w] = malloc((size_t)o->prompt_len * (size_t)m->cfg.vocab * sizeof(float)))) goto oom;
    }
    *out = c;
    return MKV_STATUS_OK;
oom:
    mkv_calib_free(c);
    return mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "out of memory planning the calibration");
}

/* ---------------------------------------------------------------------------------------- */
/* One window through one cache                                                             */
/* ---------------------------------------------------------------------------------------- */

/* Adds the cache's per-head counts of slot 0 to heads (from its dump: the library's only
 * per-head view; a row absent from the dump is a head with every token pruned). */
static mkv_status_t add_heads(mkv_cache_t *cache, mkv_calib_heads_t *h, int64_t *acc)
{
    char *text = NULL;
    mkv_status_t st = mkv_cache_dump_json_string(cache, &text);
    if (st != MKV_STATUS_OK) return mkv_report_error(st, "%s", mkv_cache_last_error(cache));
    cJSON *root = cJSON_Parse(text);
    mkv_free(text);
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(root, "slots");
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "rows");
    const cJSON *s0 = cJSON_GetArrayItem(slots, 0);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(s0, "seq_len");
    if (!cJSON_IsNumber(n) || !cJSON_IsArray(rows)) {
        cJSON_Delete(root);
        return mkv_report_error(MKV_STATUS_INTERNAL, "the cache dump lacks slots or rows");
    }
    const int64_t N = (int64_t)n->valuedouble;
    const int64_t LH = (int64_t)h->L * h->H;
    int64_t *hi = acc, *lo = acc + LH, *seen = acc + 2 * LH;
    for (int64_t r = 0; r < LH; r++) seen[r] += N;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        const int l = cJSON_GetObjectItemCaseSensitive(row, "layer")->valueint;
        const int hd = cJSON_GetObjectItemCaseSensitive(row, "head")->valueint;
        if (l < 0 || l >= h->L || hd < 0 || hd >= h->H) continue;
        hi[(int64_t)l * h->H + hd] += cJSON_GetObjectItemCaseSensitive(row, "n_hi")->valueint;
        lo[(int64_t)l * h->H + hd] += cJSON_GetObjectItemCaseSensitive(row, "n_lo")->valueint;
    }
    cJSON_Delete(root);
    return MKV_STATUS_OK;
}

/* Window `wi` through a fresh cache of policy p (NULL: the FP16 reference, whose greedy
 * predictions go to ref_pred) on worker `wk`. head_acc: [3][L][H] counts to add to, or NULL. */
static mkv_status_t run_window(mkv_calib_t *c, int32_t wk, const mkv_policy_t *p, int32_t wi,
                               win_stats_t *s, int64_t *head_acc, mkv_calib_heads_t *shape)
{
    const mkv_model_t *m = c->m;
    const int32_t V = m->cfg.vocab, P = c->o.prompt_len, W = c->o.window;
    const int32_t *t = c->win[wi];
    int32_t *pred = c->ref_pred + (int64_t)wi * (W - 1);
    float *logits = c->logits[wk];
    mkv_policy_t fp16_policy;
    mkv_policy_default(&fp16_policy);
    mkv_cache_t *cache = NULL;
    mkv_status_t st = mkv_policy_make_cache(m, MKV_BACKEND_CPU, p == NULL, p ? p : &fp16_policy, 1,
                                            W, 1.0, &cache);
    if (st != MKV_STATUS_OK) return st;
    const mkv_forward_t fw = mkv_model_forward(c->ws[wk]);
    memset(s, 0, sizeof *s);
    int32_t slot;
    const double t0 = now_s();
    if ((st = mkv_cache_admit(cache, P, &slot)) != MKV_STATUS_OK) {
        st = mkv_report_error(st, "%s", mkv_cache_last_error(cache));
        goto done;
    }
    if ((st = fw.prefill(fw.ctx, cache, slot, t, P, logits, NULL)) != MKV_STATUS_OK) goto done;
    for (int32_t i = 0; i < W - 1; i++) {
        if (i >= P && (st = fw.decode(fw.ctx, cache, 1, &slot, &t[i], logits)) != MKV_STATUS_OK) goto done;
        const float *lg = i < P ? logits + (int64_t)i * V : logits;
        s->nll += mkv_ppl_nll(lg, V, t[i + 1]);
        const int32_t a = mkv_ppl_argmax(lg, V);
        if (!p) pred[i] = a;
        s->agree += a == pred[i];
        s->predictions++;
    }
    s->seconds = now_s() - t0;
    mkv_cache_stats_t cs;
    if ((st = mkv_cache_stats(cache, &cs)) != MKV_STATUS_OK) goto done;
    s->memory_ratio = (double)cs.bytes_in_use / (double)cs.bytes_fp16;
    s->hi = cs.tokens_hi;
    s->lo = cs.tokens_lo;
    s->pruned = cs.tokens_pruned;
    if ((st = mkv_cache_validate(cache)) != MKV_STATUS_OK) {
        st = mkv_report_error(st, "%s", mkv_cache_last_error(cache));
        goto done;
    }
    if (head_acc) st = add_heads(cache, shape, head_acc);
done:
    mkv_cache_destroy(cache);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Jobs over the workers                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct sched sched_t;
/* Runs job j on worker wk (no lock held). */
typedef mkv_status_t (*job_fn)(sched_t *s, int64_t j, int32_t wk);
/* Job j is done (lock held); nonzero stops the run. */
typedef int (*done_fn)(sched_t *s, int64_t j);

struct sched {
    mkv_calib_t *c;
    int64_t n_jobs, next, finished;
    const char *phase;
    job_fn run;
    done_fn done;
    void *ctx;
    pthread_mutex_t lock;
    int stop;                 /* no new job starts */
    int stopped;              /* stopped by *stop or a callback (not by an error) */
    mkv_status_t status;      /* the first error */
    char message[MKV_ERR_LEN];
    double t0;
};

static void worker(void *ctx, int64_t begin, int64_t end, int32_t part)
{
    sched_t *s = ctx;
    (void)end;
    const int32_t wk = (int32_t)begin; /* one item per worker: its index */
    (void)part;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        if (!s->stop && s->c->o.stop && *s->c->o.stop) s->stop = s->stopped = 1;
        const int64_t j = s->stop || s->next >= s->n_jobs ? -1 : s->next++;
        pthread_mutex_unlock(&s->lock);
        if (j < 0) return;
        const mkv_status_t st = s->run(s, j, wk);
        pthread_mutex_lock(&s->lock);
        if (st != MKV_STATUS_OK) {
            if (s->status == MKV_STATUS_OK) {
                s->status = st;
                snprintf(s->message, sizeof s->message, "%s", mkv_last_error());
            }
            s->stop = 1;
        } else {
            s->finished++;
            if (s->done && s->done(s, j)) s->stop = s->stopped = 1;
            const mkv_calib_opts_t *o = &s->c->o;
            if (o->progress) {
                const double el = now_s() - s->t0;
                const double eta = el / (double)s->finished * (double)(s->n_jobs - s->finished);
                o->progress(o->ctx, s->phase, s->finished, s->n_jobs, eta);
            }
        }
        pthread_mutex_unlock(&s->lock);
    }
}

static mkv_status_t run_jobs(mkv_calib_t *c, const char *phase, int64_t n_jobs, job_fn run,
                             done_fn done, void *ctx, int *stopped)
{
    sched_t s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.n_jobs = n_jobs;
    s.phase = phase;
    s.run = run;
    s.done = done;
    s.ctx = ctx;
    s.t0 = now_s();
    pthread_mutex_init(&s.lock, NULL);
    if (c->pool && n_jobs > 1) {
        /* NOTE: mkv_pool_run splits [0, n) over min(threads, n) threads; asking for exactly
         * `workers` items gives each thread one item, its worker index. */
        mkv_pool_run(c->pool, worker, &s, c->workers);
    } else {
        worker(&s, 0, 1, 0);
    }
    pthread_mutex_destroy(&s.lock);
    if (stopped) *stopped = s.stopped;
    if (s.status != MKV_STATUS_OK) return mkv_report_error(s.status, "%s", s.message);
    return MKV_STATUS_OK;
}

/* The FP16 reference on every window, once. */
static mkv_status_t ref_job(sched_t *s, int64_t j, int32_t wk)
{
    return run_window(s->c, wk, NULL, (int32_t)j, &s->c->ref[j], NULL, NULL);
}

static mkv_status_t ensure_reference(mkv_calib_t *c, int *stopped)
{
    if (c->ref_done) return MKV_STATUS_OK;
    mkv_status_t st = run_jobs(c, "reference", c->n_calib + c->n_valid, ref_job, NULL, NULL, stopped);
    if (st == MKV_STATUS_OK && !*stopped) c->ref_done = 1;
    return st;
}

/* Sums windows [first, first + n) of stats (and of the reference) into q. */
static void summarize(const mkv_calib_t *c, const win_stats_t *stats, int32_t first, int32_t n,
                      mkv_calib_quality_t *q)
{
    memset(q, 0, sizeof *q);
    int64_t agree = 0, hi = 0, lo = 0, pruned = 0;
    double mem = 0;
    for (int32_t w = 0; w < n; w++) {
        const win_stats_t *x = &stats[w], *r = &c->ref[first + w];
        q->nll += x->nll;
        q->nll_ref += r->nll;
        q->predictions += x->predictions;
        agree += x->agree;
        mem += x->memory_ratio;
        hi += x->hi, lo += x->lo, pruned += x->pruned;
        q->seconds += x->seconds;
    }
    const double seen = (double)(hi + lo + pruned);
    q->windows = n;
    q->ppl = exp(q->nll / (double)q->predictions);
    q->ppl_ref = exp(q->nll_ref / (double)q->predictions);
    q->ppl_increase = exp((q->nll - q->nll_ref) / (double)q->predictions) - 1.0;
    q->agreement = (double)agree / (double)q->predictions;
    q->memory_ratio = mem / n;
    q->frac_hi = seen > 0 ? (double)hi / seen : 0;
    q->frac_lo = seen > 0 ? (double)lo / seen : 0;
    q->frac_pruned = seen > 0 ? (double)pruned / seen : 0;
}

void mkv_calib_reference(const mkv_calib_t *c, mkv_calib_quality_t *q)
{
    summarize(c, c->ref, 0, c->n_calib, q);
}

/* ---------------------------------------------------------------------------------------- */
/* Measuring the grid                                                                       */
/* ---------------------------------------------------------------------------------------- */

typedef struct measure {
    mkv_calib_point_t *points;
    int32_t *todo;            /* [n_todo] indices of the points to measure */
    win_stats_t *stats;       /* [n_todo][n_calib] */
    int32_t *left;            /* [n_todo] windows still to run */
} measure_t;

static mkv_status_t point_job(sched_t *s, int64_t j, int32_t wk)
{
    const measure_t *x = s->ctx;
    const int32_t nc = s->c->n_calib, k = (int32_t)(j / nc), w = (int32_t)(j % nc);
    return run_window(s->c, wk, &x->points[x->todo[k]].policy, w, &x->stats[j], NULL, NULL);
}

static int point_done(sched_t *s, int64_t j)
{
    measure_t *x = s->ctx;
    mkv_calib_t *c = s->c;
    const int32_t k = (int32_t)(j / c->n_calib);
    if (--x->left[k] > 0) return 0;
    mkv_calib_point_t *p = &x->points[x->todo[k]];
    summarize(c, x->stats + (int64_t)k * c->n_calib, 0, c->n_calib, &p->q);
    p->done = 1;
    return c->o.point_done ? c->o.point_done(c->o.ctx, p, x->todo[k]) : 0;
}

mkv_status_t mkv_calib_measure(mkv_calib_t *c, mkv_calib_point_t *points, int32_t n, int *stopped)
{
    *stopped = 0;
    char err[MKV_ERR_LEN];
    for (int32_t i = 0; i < n; i++)
        if (mkv_policy_check(&points[i].policy, err) != MKV_STATUS_OK)
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "point %d: %s", i, err);
    mkv_status_t st = ensure_reference(c, stopped);
    if (st != MKV_STATUS_OK || *stopped) return st;
    measure_t x = {points, NULL, NULL, NULL};
    int32_t n_todo = 0;
    x.todo = malloc((size_t)(n > 0 ? n : 1) * sizeof *x.todo);
    x.left = malloc((size_t)(n > 0 ? n : 1) * sizeof *x.left);
    x.stats = malloc((size_t)(n > 0 ? n : 1) * (size_t)c->n_calib * sizeof *x.stats);
    if (!x.todo || !x.left || !x.stats) {
        st = mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "out of memory planning %d points", n);
        goto done;
    }
    for (int32_t i = 0; i < n; i++)
        if (!points[i].done) {
            x.left[n_todo] = c->n_calib;
            x.todo[n_todo++] = i;
        }
    if (n_todo > 0)
        st = run_jobs(c, "sweep", (int64_t)n_todo * c->n_calib, point_job, point_done, &x, stopped);
done:
    free(x.todo);
    free(x.left);
    free(x.stats);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Validation                                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef struct validate {
    const mkv_policy_t *p;
    int32_t first;            /* the first window (n_calib: the validation set) */
    win_stats_t *stats;       /* [n] */
    int64_t *heads;           /* [n][3][L][H] or NULL */
    mkv_calib_heads_t shape;
} validate_t;

static mkv_status_t validate_job(sched_t *s, int64_t j, int32_t wk)
{
    validate_t *x = s->ctx;
    const int64_t LH = (int64_t)x->shape.L * x->shape.H;
    return run_window(s->c, wk, x->p, x->first + (int32_t)j, &x->stats[j],
                      x->heads ? x->heads + j * 3 * LH : NULL, &x->shape);
}

void mkv_calib_heads_free(mkv_calib_heads_t *h)
{
    free(h->hi);
    free(h->lo);
    free(h->pruned);
    memset(h, 0, sizeof *h);
}

mkv_status_t mkv_calib_validate(mkv_calib_t *c, const mkv_policy_t *p, mkv_calib_quality_t *q,
                                mkv_calib_heads_t *heads, int *stopped)
{
    *stopped = 0;
    char err[MKV_ERR_LEN];
    if (mkv_policy_check(p, err) != MKV_STATUS_OK)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "%s", err);
    mkv_status_t st = ensure_reference(c, stopped);
    if (st != MKV_STATUS_OK || *stopped) return st;
    /* Without validation windows, the calibration windows stand in (say so in reports). */
    const int32_t first = c->n_valid > 0 ? c->n_calib : 0, n = c->n_valid > 0 ? c->n_valid : c->n_calib;
    validate_t x = {p, first, NULL, NULL, {c->m->cfg.n_layers, c->m->cfg.n_kv_heads, NULL, NULL, NULL}};
    const int64_t LH = (int64_t)x.shape.L * x.shape.H;
    x.stats = calloc((size_t)n, sizeof *x.stats);
    if (heads) x.heads = calloc((size_t)n * 3 * (size_t)LH, sizeof *x.heads);
    if (!x.stats || (heads && !x.heads)) {
        st = mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "out of memory validating");
        goto done;
    }
    if ((st = run_jobs(c, "validation", n, validate_job, NULL, &x, stopped)) != MKV_STATUS_OK || *stopped) goto done;
    summarize(c, x.stats, first, n, q);
    if (heads) {
        *heads = x.shape;
        heads->hi = calloc((size_t)LH, sizeof(double));
        heads->lo = calloc((size_t)LH, sizeof(double));
        heads->pruned = calloc((size_t)LH, sizeof(double));
        if (!heads->hi || !heads->lo || !heads->pruned) {
            mkv_calib_heads_free(heads);
            st = mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "out of memory validating");
            goto done;
        }
        for (int64_t r = 0; r < LH; r++) {
            int64_t hi = 0, lo = 0, seen = 0;
            for (int32_t w = 0; w < n; w++) {
                const int64_t *a = x.heads + (int64_t)w * 3 * LH;
                hi += a[r], lo += a[LH + r], seen += a[2 * LH + r];
            }
            if (seen == 0) continue;
            heads->hi[r] = (double)hi / (double)seen;
            heads->lo[r] = (double)lo / (double)seen;
            heads->pruned[r] = (double)(seen - hi - lo) / (double)seen;
        }
    }
done:
    free(x.stats);
    free(x.heads);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Front and choice                                                                         */
/* ---------------------------------------------------------------------------------------- */

static const mkv_calib_point_t *g_sort_points; /* qsort has no context argument in C11 */

static int cheaper(int32_t a, int32_t b)
{
    const mkv_calib_quality_t *x = &g_sort_points[a].q, *y = &g_sort_points[b].q;
    if (x->memory_ratio != y->memory_ratio) return x->memory_ratio < y->memory_ratio ? -1 : 1;
    if (x->ppl_increase != y->ppl_increase) return x->ppl_increase < y->ppl_increase ? -1 : 1;
    return (a > b) - (a < b);
}

static int cmp_cheaper(const void *a, const void *b)
{
    return cheaper(*(const int32_t *)a, *(const int32_t *)b);
}

/* Sorts idx[n] cheapest first. Not reentrant (the sort's context is a static). */
static void sort_cheapest(const mkv_calib_point_t *points, int32_t *idx, int32_t n)
{
    g_sort_points = points;
    qsort(idx, (size_t)n, sizeof *idx, cmp_cheaper);
    g_sort_points = NULL;
}

int32_t mkv_calib_pareto(mkv_calib_point_t *points, int32_t n, int32_t *front)
{
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        points[i].on_front = 0;
        if (!points[i].done) continue;
        const mkv_calib_quality_t *p = &points[i].q;
        int dominated = 0;
        for (int32_t j = 0; j < n && !dominated; j++) {
            if (j == i || !points[j].done) continue;
            const mkv_calib_quality_t *q = &points[j].q;
            dominated = q->memory_ratio <= p->memory_ratio && q->ppl_increase <= p->ppl_increase &&
                        (q->memory_ratio < p->memory_ratio || q->ppl_increase < p->ppl_increase);
        }
        if (!dominated) {
            points[i].on_front = 1;
            front[k++] = i;
        }
    }
    sort_cheapest(points, front, k);
    return k;
}

int32_t mkv_calib_candidates(const mkv_calib_point_t *points, int32_t n, double max_ppl_increase,
                             double min_agreement, int32_t *order)
{
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        const mkv_calib_point_t *p = &points[i];
        if (p->done && p->q.ppl_increase <= max_ppl_increase &&
            (min_agreement <= 0 || p->q.agreement >= min_agreement))
            order[k++] = i;
    }
    sort_cheapest(points, order, k);
    return k;
}

void mkv_calib_result_free(mkv_calib_result_t *r)
{
    free(r->front);
    mkv_calib_heads_free(&r->heads);
    memset(r, 0, sizeof *r);
    r->chosen = -1;
}

static int passes(const mkv_calib_opts_t *o, const mkv_calib_quality_t *q)
{
    return q->ppl_increase <= o->max_ppl_increase &&
           (o->min_agreement <= 0 || q->agreement >= o->min_agreement);
}

mkv_status_t mkv_calib_run(mkv_calib_t *c, mkv_calib_point_t *points, int32_t n,
                           mkv_calib_result_t *out)
{
    memset(out, 0, sizeof *out);
    out->chosen = -1;
    mkv_status_t st = mkv_calib_measure(c, points, n, &out->stopped);
    if (st != MKV_STATUS_OK || out->stopped) return st;
    int32_t *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    out->front = malloc((size_t)(n > 0 ? n : 1) * sizeof *out->front);
    if (!order || !out->front) {
        free(order);
        return mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "out of memory choosing a point");
    }
    out->n_front = mkv_calib_pareto(points, n, out->front);
    out->n_candidates = mkv_calib_candidates(points, n, c->o.max_ppl_increase, c->o.min_agreement, order);
    int32_t max_checks = c->o.max_checks < MKV_CALIB_MAX_CHECKS ? c->o.max_checks : MKV_CALIB_MAX_CHECKS;
    if (c->n_valid == 0) max_checks = 0; /* nothing to check on: the cheapest candidate */
    mkv_calib_heads_t first = {0};       /* the cheapest candidate's, should none pass */
    for (int32_t k = 0; k < out->n_candidates && k < max_checks && !out->validated; k++) {
        mkv_calib_check_t *ck = &out->checks[out->n_checks];
        mkv_calib_heads_t h = {0};
        ck->point = order[k];
        if ((st = mkv_calib_validate(c, &points[order[k]].policy, &ck->valid, &h, &out->stopped)) !=
                MKV_STATUS_OK || out->stopped)
            goto done;
        ck->passed = passes(&c->o, &ck->valid);
        out->n_checks++;
        if (ck->passed) {
            out->chosen = order[k];
            out->validated = 1;
            out->heads = h;
        } else if (k == 0) {
            first = h;
        } else {
            mkv_calib_heads_free(&h);
        }
    }
    if (out->chosen < 0 && out->n_candidates > 0) {
        out->chosen = order[0];
        if (out->n_checks > 0) {
            out->heads = first;
            first = (mkv_calib_heads_t){0};
        } else { /* no validation windows: the mix on the calibration windows */
            mkv_calib_quality_t q;
            st = mkv_calib_validate(c, &points[out->chosen].policy, &q, &out->heads, &out->stopped);
        }
    }
done:
    mkv_calib_heads_free(&first);
    free(order);
    return st;
}
