/*
 * calib.c — measuring policies against the FP16 cache on windows of a dataset and on needle
 * trials (see calib.h); the front and the choice are choice.c's, the work queue jobs.c's.
 *
 * Everything is a job: one window or one needle trial through one cache (the FP16
 * reference, or a policy's), run by a worker with its own forward pass and a cache made for
 * the job. Jobs are handed out in order from one counter, so a point's windows and trials
 * finish close together and the point is reported as soon as its last job is in; per-job
 * results are kept and summed in order, so the figures do not depend on which worker ran what.
 */
#include "calib/calib.h"

#include "calib/jobs.h"
#include "runner/forward_cuda.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One window through one cache. */
typedef struct win_stats {
    double nll;
    int64_t predictions, agree;
    double memory_ratio;
    int64_t hi, lo, pruned; /* token-heads at the window's end */
    double seconds;
} win_stats_t;

/* One needle trial through a policy's cache, against the FP16 cache's answer. */
typedef struct trial_stats {
    int right, same;
} trial_stats_t;

struct mkv_calib {
    const mkv_model_t *m;
    mkv_calib_opts_t o;
    const int32_t **win;     /* [n_calib + n_valid] each window's first token */
    int32_t n_calib, n_valid;
    int ref_done;
    win_stats_t *ref;        /* [n_calib + n_valid] the FP16 cache on each window */
    int32_t *ref_pred;       /* [n_calib + n_valid][window - 1] its greedy predictions */
    const mkv_needle_t *needle[MKV_CALIB_NEEDLE_SETS]; /* [set] its trials, or NULL */
    int32_t n_trials[MKV_CALIB_NEEDLE_SETS];
    int needle_ref_done[MKV_CALIB_NEEDLE_SETS];
    mkv_needle_result_t *needle_ref[MKV_CALIB_NEEDLE_SETS]; /* [set][n_trials] the FP16 cache's */
    int32_t workers;
    mkv_pool_t *pool;        /* workers - 1 threads; NULL for one worker */
    mkv_forward_ws_t **ws;   /* [workers] the CPU passes, or */
    mkv_cuda_forward_t **cuda; /* [workers] the CUDA passes */
    mkv_forward_t *fw;       /* [workers] either, as a forward pass */
    float **logits;          /* [workers][prompt_len][vocab] */
};

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
        mkv_cuda_forward_free(c->cuda[w]);
        free(c->logits[w]);
    }
    free(c->ws);
    free(c->cuda);
    free(c->fw);
    free(c->logits);
    mkv_pool_destroy(c->pool);
    free(c->win);
    free(c->ref);
    free(c->ref_pred);
    for (int s = 0; s < MKV_CALIB_NEEDLE_SETS; s++) free(c->needle_ref[s]);
    free(c);
}

const mkv_calib_opts_t *mkv_calib_options(const mkv_calib_t *c)
{
    return &c->o;
}

/* The needle set the validation runs: the held-back one, else the calibration one. */
static int32_t valid_set(const mkv_calib_t *c)
{
    return c->needle[MKV_CALIB_NEEDLE_VALIDATION] ? MKV_CALIB_NEEDLE_VALIDATION : MKV_CALIB_NEEDLE_CALIBRATION;
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
        o->max_checks < 1 || !(o->max_ppl_increase >= 0) || !(o->min_agreement >= 0 && o->min_agreement <= 1) ||
        !(o->max_needle_drop >= 0))
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "calibration options out of range (calibration windows %d >= 1, "
                                "validation windows %d >= 0, tolerance %g >= 0, agreement %g in [0, 1], "
                                "checks %d >= 1, needle drop %g >= 0)", o->calib_windows, o->valid_windows,
                                o->max_ppl_increase, o->min_agreement, o->max_checks, o->max_needle_drop);
    /* Needle prompts go through the prompt phase whole: the workspaces are sized for them. */
    const mkv_needle_t *sets[MKV_CALIB_NEEDLE_SETS] = {
        o->needle, o->needle && o->valid_windows > 0 && o->needle_valid != o->needle ? o->needle_valid : NULL};
    int32_t max_tokens = o->prompt_len;
    for (int s = 0; s < MKV_CALIB_NEEDLE_SETS; s++) {
        if (!sets[s]) continue;
        const int32_t longest = mkv_needle_longest(sets[s]), max_new = mkv_needle_options(sets[s])->max_new;
        if (longest + max_new > m->cfg.max_pos)
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                    "needle prompts of up to %d tokens plus %d answer tokens exceed the "
                                    "model's %d positions", longest, max_new, m->cfg.max_pos);
        max_tokens = longest > max_tokens ? longest : max_tokens;
    }
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
    for (int s = 0; s < MKV_CALIB_NEEDLE_SETS; s++) {
        if (!(c->needle[s] = sets[s])) continue;
        c->n_trials[s] = mkv_needle_count(sets[s]);
        if (!(c->needle_ref[s] = calloc((size_t)c->n_trials[s], sizeof *c->needle_ref[s]))) goto oom;
    }
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
    c->workers = o->workers > 0 ? o->workers : o->backend == MKV_BACKEND_CUDA ? 1 : cores;
    if (c->workers > 256) c->workers = 256;
    if (c->workers > 1 && !(c->pool = mkv_pool_create(c->workers))) goto oom;
    c->ws = calloc((size_t)c->workers, sizeof *c->ws);
    c->cuda = calloc((size_t)c->workers, sizeof *c->cuda);
    c->fw = calloc((size_t)c->workers, sizeof *c->fw);
    c->logits = calloc((size_t)c->workers, sizeof *c->logits);
    if (!c->ws || !c->cuda || !c->fw || !c->logits) goto oom;
    for (int32_t w = 0; w < c->workers; w++) {
        char err[MKV_ERR_LEN];
        const int cuda = o->backend == MKV_BACKEND_CUDA;
        mkv_status_t st = cuda ? mkv_cuda_forward_create(m, max_tokens, o->dtype, &c->cuda[w], err)
                               : mkv_forward_ws_create(m, max_tokens, &c->ws[w], err);
        if (st != MKV_STATUS_OK) {
            mkv_calib_free(c);
            return mkv_report_error(st, "%s", err);
        }
        c->fw[w] = cuda ? mkv_cuda_forward(c->cuda[w]) : mkv_model_forward(c->ws[w]);
        /* One worker: the CPU pass gets every core; several: one each. */
        if (!cuda && c->workers > 1 && mkv_forward_ws_set_threads(c->ws[w], 1) != MKV_STATUS_OK) goto oom;
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

/* A cache for one job of up to max_seq_len tokens: policy p's, or (p NULL) the FP16 cache. */
static mkv_status_t make_cache(const mkv_calib_t *c, const mkv_policy_t *p, int32_t max_seq_len,
                               mkv_cache_t **out)
{
    mkv_policy_t fp16_policy;
    mkv_policy_default(&fp16_policy);
    return mkv_policy_make_cache(c->m, c->o.backend, p == NULL, p ? p : &fp16_policy, 1,
                                 max_seq_len, 1.0, out);
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
    mkv_cache_t *cache = NULL;
    mkv_status_t st = make_cache(c, p, W, &cache);
    if (st != MKV_STATUS_OK) return st;
    const mkv_forward_t fw = c->fw[wk];
    memset(s, 0, sizeof *s);
    int32_t slot;
    const double t0 = mkv_jobs_now();
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
    s->seconds = mkv_jobs_now() - t0;
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

/* Trial i of needle set `set` through a fresh cache of policy p (NULL: the FP16 reference,
 * whose result goes to needle_ref) on worker wk; a policy's is judged against FP16's answer. */
static mkv_status_t run_trial(mkv_calib_t *c, int32_t wk, const mkv_policy_t *p, int32_t set,
                              int32_t i, trial_stats_t *s)
{
    const mkv_needle_t *nd = c->needle[set];
    mkv_needle_result_t mine, *r = p ? &mine : &c->needle_ref[set][i];
    mkv_cache_t *cache = NULL;
    mkv_status_t st = make_cache(c, p, mkv_needle_trial(nd, i)->n_prompt + mkv_needle_options(nd)->max_new,
                                 &cache);
    if (st != MKV_STATUS_OK) return st;
    st = mkv_needle_run(nd, i, &c->fw[wk], c->m->cfg.eos, cache, c->logits[wk], r, NULL);
    mkv_cache_destroy(cache);
    if (st == MKV_STATUS_OK && s) {
        s->right = r->right;
        s->same = mkv_needle_same_answer(r, &c->needle_ref[set][i]);
    }
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Jobs over the workers                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* The phase's jobs over the handle's workers (calib/jobs.h). */
static mkv_status_t run_jobs(mkv_calib_t *c, const char *phase, int64_t n_jobs, mkv_job_fn run,
                             mkv_job_done_fn done, void *ctx, int *stopped)
{
    const mkv_jobs_t q = {c->pool, c->workers, c->o.stop, c->o.progress, c->o.ctx};
    return mkv_jobs_run(&q, phase, n_jobs, run, done, ctx, stopped);
}

/* The FP16 reference on every window, once. */
static mkv_status_t ref_job(void *ctx, int64_t j, int32_t wk)
{
    mkv_calib_t *c = ctx;
    return run_window(c, wk, NULL, (int32_t)j, &c->ref[j], NULL, NULL);
}

/* The needle sets still to run through the FP16 cache, one after the other. */
typedef struct needle_ref {
    mkv_calib_t *c;
    int32_t set[MKV_CALIB_NEEDLE_SETS], n_sets;
} needle_ref_t;

static mkv_status_t needle_ref_job(void *ctx, int64_t j, int32_t wk)
{
    const needle_ref_t *x = ctx;
    int32_t k = 0;
    while (j >= x->c->n_trials[x->set[k]]) j -= x->c->n_trials[x->set[k++]];
    return run_trial(x->c, wk, NULL, x->set[k], (int32_t)j, NULL);
}

static mkv_status_t ensure_reference(mkv_calib_t *c, int *stopped)
{
    mkv_status_t st = MKV_STATUS_OK;
    if (!c->ref_done) {
        st = run_jobs(c, "reference", c->n_calib + c->n_valid, ref_job, NULL, c, stopped);
        if (st != MKV_STATUS_OK || *stopped) return st;
        c->ref_done = 1;
    }
    needle_ref_t x = {c, {0}, 0};
    int64_t jobs = 0;
    for (int32_t set = 0; set < MKV_CALIB_NEEDLE_SETS; set++)
        if (c->needle[set] && !c->needle_ref_done[set]) {
            x.set[x.n_sets++] = set;
            jobs += c->n_trials[set];
        }
    if (jobs == 0) return MKV_STATUS_OK;
    if ((st = run_jobs(c, "needle reference", jobs, needle_ref_job, NULL, &x, stopped)) != MKV_STATUS_OK ||
        *stopped)
        return st;
    for (int32_t k = 0; k < x.n_sets; k++) {
        const int32_t set = x.set[k];
        c->needle_ref_done[set] = 1;
        if (c->o.needle_ref_done &&
            c->o.needle_ref_done(c->o.ctx, set, c->needle_ref[set], c->n_trials[set]))
            *stopped = 1;
    }
    return MKV_STATUS_OK;
}

int32_t mkv_calib_needle_reference(const mkv_calib_t *c, int32_t set, const mkv_needle_result_t **results)
{
    if (set < 0 || set >= MKV_CALIB_NEEDLE_SETS || !c->needle[set]) {
        if (results) *results = NULL;
        return 0;
    }
    if (results) *results = c->needle_ref_done[set] ? c->needle_ref[set] : NULL;
    return c->n_trials[set];
}

mkv_status_t mkv_calib_needle_restore(mkv_calib_t *c, int32_t set, const mkv_needle_result_t *results,
                                      int32_t n)
{
    if (set < 0 || set >= MKV_CALIB_NEEDLE_SETS || !c->needle[set] || n != c->n_trials[set])
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "needle set %d has %d trials, not %d", set,
                                set >= 0 && set < MKV_CALIB_NEEDLE_SETS ? c->n_trials[set] : 0, n);
    for (int32_t i = 0; i < n; i++)
        if (results[i].n_answer < 0 || results[i].n_answer > MKV_NEEDLE_MAX_NEW)
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "needle result %d: %d answer tokens", i,
                                    results[i].n_answer);
    memcpy(c->needle_ref[set], results, (size_t)n * sizeof *results);
    c->needle_ref_done[set] = 1;
    return MKV_STATUS_OK;
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

/* Adds needle set `set`'s figures to q: stats[n_trials] the policy's trials (NULL: the FP16
 * cache's own, against itself). */
static void summarize_trials(const mkv_calib_t *c, int32_t set, const trial_stats_t *stats,
                             mkv_calib_quality_t *q)
{
    const int32_t n = c->n_trials[set];
    if (!c->needle[set] || n == 0) return;
    q->needle_trials = n;
    for (int32_t i = 0; i < n; i++) {
        const int ref = c->needle_ref[set][i].right;
        q->needle_right_ref += ref;
        q->needle_right += stats ? stats[i].right : ref;
        q->needle_same += stats ? stats[i].same : 1;
    }
    q->needle_accuracy = (double)q->needle_right / n;
    q->needle_accuracy_ref = (double)q->needle_right_ref / n;
}

void mkv_calib_reference(const mkv_calib_t *c, mkv_calib_quality_t *q)
{
    summarize(c, c->ref, 0, c->n_calib, q);
    summarize_trials(c, MKV_CALIB_NEEDLE_CALIBRATION, NULL, q);
}

/* ---------------------------------------------------------------------------------------- */
/* Measuring the grid                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* A point's jobs: its n_calib windows, then its needle trials (calibration set). */
typedef struct measure {
    mkv_calib_t *c;
    mkv_calib_point_t *points;
    int32_t *todo;            /* [n_todo] indices of the points to measure */
    int32_t per_point;        /* jobs per point: n_calib + trials */
    win_stats_t *stats;       /* [n_todo][n_calib] */
    trial_stats_t *trials;    /* [n_todo][trials] */
    int32_t *left;            /* [n_todo] jobs still to run */
} measure_t;

static mkv_status_t point_job(void *ctx, int64_t j, int32_t wk)
{
    const measure_t *x = ctx;
    const int32_t nc = x->c->n_calib, nt = x->per_point - nc;
    const int32_t k = (int32_t)(j / x->per_point), r = (int32_t)(j % x->per_point);
    const mkv_policy_t *p = &x->points[x->todo[k]].policy;
    if (r < nc) return run_window(x->c, wk, p, r, &x->stats[(int64_t)k * nc + r], NULL, NULL);
    return run_trial(x->c, wk, p, MKV_CALIB_NEEDLE_CALIBRATION, r - nc, &x->trials[(int64_t)k * nt + r - nc]);
}

static int point_done(void *ctx, int64_t j)
{
    measure_t *x = ctx;
    mkv_calib_t *c = x->c;
    const int32_t k = (int32_t)(j / x->per_point), nt = x->per_point - c->n_calib;
    if (--x->left[k] > 0) return 0;
    mkv_calib_point_t *p = &x->points[x->todo[k]];
    summarize(c, x->stats + (int64_t)k * c->n_calib, 0, c->n_calib, &p->q);
    summarize_trials(c, MKV_CALIB_NEEDLE_CALIBRATION, x->trials + (int64_t)k * nt, &p->q);
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
    const int32_t nt = c->n_trials[MKV_CALIB_NEEDLE_CALIBRATION];
    const size_t room = (size_t)(n > 0 ? n : 1);
    measure_t x = {c, points, NULL, c->n_calib + nt, NULL, NULL, NULL};
    int32_t n_todo = 0;
    x.todo = malloc(room * sizeof *x.todo);
    x.left = malloc(room * sizeof *x.left);
    x.stats = malloc(room * (size_t)c->n_calib * sizeof *x.stats);
    x.trials = malloc(room * (size_t)(nt > 0 ? nt : 1) * sizeof *x.trials);
    if (!x.todo || !x.left || !x.stats || !x.trials) {
        st = mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "out of memory planning %d points", n);
        goto done;
    }
    for (int32_t i = 0; i < n; i++)
        if (!points[i].done) {
            x.left[n_todo] = x.per_point;
            x.todo[n_todo++] = i;
        }
    if (n_todo > 0)
        st = run_jobs(c, "sweep", (int64_t)n_todo * x.per_point, point_job, point_done, &x, stopped);
done:
    free(x.todo);
    free(x.left);
    free(x.stats);
    free(x.trials);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Validation                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* The jobs: the n windows from `first`, then the trials of needle set `set`. */
typedef struct validate {
    mkv_calib_t *c;
    const mkv_policy_t *p;
    int32_t first;            /* the first window (n_calib: the validation set) */
    int32_t n;                /* windows */
    int32_t set;              /* the needle set */
    win_stats_t *stats;       /* [n] */
    trial_stats_t *trials;    /* [the set's trials] */
    int64_t *heads;           /* [n][3][L][H] or NULL */
    mkv_calib_heads_t shape;
} validate_t;

static mkv_status_t validate_job(void *ctx, int64_t j, int32_t wk)
{
    validate_t *x = ctx;
    const int64_t LH = (int64_t)x->shape.L * x->shape.H;
    if (j >= x->n) return run_trial(x->c, wk, x->p, x->set, (int32_t)(j - x->n), &x->trials[j - x->n]);
    return run_window(x->c, wk, x->p, x->first + (int32_t)j, &x->stats[j],
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
    /* ... and so do the calibration trials without a held-back set. */
    const int32_t set = valid_set(c), nt = c->n_trials[set];
    validate_t x = {c, p, first, n, set, NULL, NULL, NULL,
                    {c->m->cfg.n_layers, c->m->cfg.n_kv_heads, NULL, NULL, NULL}};
    const int64_t LH = (int64_t)x.shape.L * x.shape.H;
    x.stats = calloc((size_t)n, sizeof *x.stats);
    x.trials = calloc((size_t)(nt > 0 ? nt : 1), sizeof *x.trials);
    if (heads) x.heads = calloc((size_t)n * 3 * (size_t)LH, sizeof *x.heads);
    if (!x.stats || !x.trials || (heads && !x.heads)) {
        st = mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "out of memory validating");
        goto done;
    }
    if ((st = run_jobs(c, "validation", n + nt, validate_job, NULL, &x, stopped)) != MKV_STATUS_OK || *stopped)
        goto done;
    summarize(c, x.stats, first, n, q);
    summarize_trials(c, set, x.trials, q);
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
    free(x.trials);
    free(x.heads);
    return st;
}
