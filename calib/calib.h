/*
 * calib.h — calibration of a compression policy on a model and a dataset (DiffKV section 7):
 * measure a grid of policies (alpha_h x alpha_l, optionally recent windows, formats and
 * quantization groups) against the FP16 cache on the same calibration windows, find the Pareto
 * front of memory against quality loss, choose the point with the least memory whose loss
 * stays within a tolerance, and check it on held-back validation windows.
 *
 * The API an engine calls; `mixkv calibrate` (tools/calibrate.c) is one user. It sits above
 * the model runner (runner/model.h: the CPU forward pass) and mixkv.h, and below the tools.
 *
 * Windows. The documents are cut into consecutive windows of `window` tokens as by
 * `mixkv perplexity` (runner/perplexity.h: the first prompt_len tokens through the prompt
 * phase, the rest one at a time through the generation phase; window - 1 predictions each).
 * The first calib_windows windows are the calibration set, the next valid_windows the
 * validation set, never measured during the sweep.
 *
 * Quality. For each window the FP16 cache's (K16V16, nothing compressed) negative
 * log-likelihood and greedy prediction at every position are computed once and reused by
 * every point. A point's perplexity increase is exp((NLL - NLL_fp16) / predictions) - 1 over
 * its windows; its greedy agreement the fraction of positions whose argmax is FP16's; its
 * memory ratio the mean over windows of the cache's bytes in use over a plain FP16 cache's
 * for the same tokens, taken at each window's end (mkv_cache_stats).
 *
 * Needle retrieval (optional: opts.needle, calib/needle.h). Every point also answers a set of
 * needle-in-a-haystack trials; its needle accuracy is the fraction answered right, beside the
 * FP16 cache's on the same trials (run once per handle, or restored from a saved run with
 * mkv_calib_needle_restore). Validation runs a held-back set of trials (opts.needle_valid),
 * and a candidate may be held to a largest drop of accuracy below FP16's (max_needle_drop).
 *
 * Parallelism. Work is split into jobs of one window (or one needle trial) of one policy; `workers` jobs run at
 * once on the runner's thread pool, each worker with a forward pass of its own (one thread;
 * with one worker the pass gets every core). Results do not depend on the number of workers.
 *
 * Thread safety: a mkv_calib_t is used by one thread at a time; callbacks are called with an
 * internal lock held, one at a time, from whichever worker finished.
 */
#ifndef MKV_CALIB_CALIB_H
#define MKV_CALIB_CALIB_H

#include "calib/needle.h"
#include "calib/policy.h"
#include "runner/model.h"
#include "runner/perplexity.h"
#include "mixkv.h"

#include <signal.h>
#include <stdint.h>

/* What a policy did on a set of windows. */
typedef struct mkv_calib_quality {
    int32_t windows;
    int64_t predictions;
    double nll, nll_ref;      /* summed NLL (nats), the policy's and the FP16 cache's */
    double ppl, ppl_ref;      /* perplexities */
    double ppl_increase;      /* ppl / ppl_ref - 1 (negative: better than FP16) */
    double agreement;         /* greedy agreement with FP16, 0..1 */
    double memory_ratio;      /* mean bytes in use / plain FP16 bytes at window ends */
    double frac_hi, frac_lo, frac_pruned; /* token-heads kept high / low / pruned at window ends */
    double seconds;           /* forward time, summed over the windows' jobs */
    /* Needle trials (all 0 without them): */
    int32_t needle_trials;
    int32_t needle_right, needle_right_ref; /* trials answered right, by the policy and by FP16 */
    int32_t needle_same;      /* trials whose answer is FP16's, token for token */
    double needle_accuracy, needle_accuracy_ref; /* right / trials, the policy's and FP16's */
} mkv_calib_quality_t;

typedef struct mkv_calib_point {
    mkv_policy_t policy;
    int done;                 /* measured, or read back from a saved run */
    mkv_calib_quality_t q;    /* on the calibration windows */
    int on_front;             /* on the Pareto front (mkv_calib_pareto) */
} mkv_calib_point_t;

/* Progress of a phase ("reference": the FP16 cache on every window; "needle reference": the
 * FP16 cache on every needle trial; "sweep": the points, their windows and trials;
 * "validation": a candidate on the validation windows and trials): jobs (one window or trial
 * through one cache) done out of the phase's total, and an estimate of the phase's seconds
 * left. */
typedef void (*mkv_calib_progress_fn)(void *ctx, const char *phase, int64_t jobs_done,
                                      int64_t jobs_total, double eta_s);
/* A point finished (for saving it); returning nonzero stops the sweep like *stop does. */
typedef int (*mkv_calib_point_fn)(void *ctx, const mkv_calib_point_t *point, int32_t index);
/* The FP16 cache's results on needle set `set` (MKV_CALIB_NEEDLE_*) are in (for saving
 * them); returning nonzero stops the run like *stop does. */
typedef int (*mkv_calib_needle_ref_fn)(void *ctx, int32_t set, const mkv_needle_result_t *results,
                                       int32_t n);

typedef struct mkv_calib_opts {
    int32_t window;           /* tokens per window, 2 .. the model's positions */
    int32_t prompt_len;       /* 1 <= prompt_len < window */
    int32_t calib_windows;    /* >= 1 */
    int32_t valid_windows;    /* >= 0 (0: no validation) */
    int32_t windows_per_doc;  /* at most this many windows of each document; 0: all */
    int32_t workers;          /* jobs at once; 0: one per online core */
    double max_ppl_increase;  /* the tolerance: relative perplexity increase (0.01: 1%) */
    double min_agreement;     /* and, when > 0, the least greedy agreement */
    int32_t max_checks;       /* candidates tried on the validation windows, cheapest first,
                                 before giving up (>= 1) */
    volatile sig_atomic_t *stop; /* NULL, or set nonzero (a signal handler) to stop: the jobs in
                                 flight finish, no new one starts */
    mkv_calib_progress_fn progress;
    mkv_calib_point_fn point_done;
    void *ctx;                /* passed to the callbacks */
    const mkv_needle_t *needle;       /* NULL, or the needle trials every point answers (its
                                         prompts plus max_new tokens within the model's
                                         positions); must outlive the handle */
    const mkv_needle_t *needle_valid; /* the held-back trials of the validation check; NULL:
                                         needle's (as without validation windows) */
    double max_needle_drop;   /* with needle trials, a candidate's needle accuracy may fall at
                                 most this far below FP16's (0.1: ten points); >= 0, 1 or
                                 more: no constraint */
    mkv_calib_needle_ref_fn needle_ref_done;
    /* Where the windows and trials run: the CPU pass (dtype ignored: fp32), or the CUDA pass
     * (runner/forward_cuda.h) in dtype with CUDA caches, one pass per worker on the current
     * device (workers 0 then means one). */
    mkv_backend_t backend;
    mkv_dtype_t dtype;
} mkv_calib_opts_t;

#define MKV_CALIB_OPTS_INIT                                                                    \
    {255, 64, 16, 8, 0, 0, 0.01, 0.0, 3, NULL, NULL, NULL, NULL, NULL, NULL, 1.0, NULL, MKV_BACKEND_CPU,   \
     MKV_DTYPE_F32}

/* The needle sets of a handle. */
enum { MKV_CALIB_NEEDLE_CALIBRATION = 0, MKV_CALIB_NEEDLE_VALIDATION = 1, MKV_CALIB_NEEDLE_SETS = 2 };

typedef struct mkv_calib mkv_calib_t; /* opaque: the windows and the FP16 reference */

/* Plans the windows of docs (which must outlive the handle) for model m. INVALID_ARGUMENT
 * when the options are out of range or the documents hold fewer than calib_windows +
 * valid_windows windows (the message says how many they hold). Messages in mkv_last_error(). */
mkv_status_t mkv_calib_create(const mkv_model_t *m, const mkv_ppl_doc_t *docs, int32_t n_docs,
                              const mkv_calib_opts_t *o, mkv_calib_t **out);
void mkv_calib_free(mkv_calib_t *c);

/* The options the handle was made with. */
const mkv_calib_opts_t *mkv_calib_options(const mkv_calib_t *c);

/* Windows the documents hold for these options (calibration and validation both come from
 * them). */
int64_t mkv_calib_windows_available(const mkv_ppl_doc_t *docs, int32_t n_docs, const mkv_calib_opts_t *o);

/* Measures every point not yet done on the calibration windows (the FP16 reference first,
 * once per handle), calling point_done as each finishes. *stopped = 1 when *stop or a
 * callback stopped it (the points done so far are marked, the others untouched). */
mkv_status_t mkv_calib_measure(mkv_calib_t *c, mkv_calib_point_t *points, int32_t n, int *stopped);

/* Marks on_front on the done points that no other done point dominates (memory ratio and
 * perplexity increase both no worse, one better; equal points are both on the front) and
 * writes their indices to front[] (n entries of room), by memory ratio ascending, then
 * increase. Returns the front's size. */
int32_t mkv_calib_pareto(mkv_calib_point_t *points, int32_t n, int32_t *front);

/* What a point must do to be chosen. */
typedef struct mkv_calib_limits {
    double max_ppl_increase;  /* perplexity increase at most this */
    double min_agreement;     /* when > 0, greedy agreement at least this */
    double max_needle_drop;   /* for a quality with needle trials: needle_accuracy_ref -
                                 needle_accuracy at most this (1 or more: no constraint) */
} mkv_calib_limits_t;

/* The limits of a handle's options. */
mkv_calib_limits_t mkv_calib_limits(const mkv_calib_opts_t *o);

/* 1 when q is within the limits. NOTE: the needle drop is compared with a margin of 1e-9, so
 * that a drop of exactly the limit in fractions of trials (1/3) passes. */
int mkv_calib_within(const mkv_calib_limits_t *l, const mkv_calib_quality_t *q);

/* The done points within the limits, cheapest first (memory ratio, then increase, then index)
 * into order[] (n entries of room). Returns their number. */
int32_t mkv_calib_eligible(const mkv_calib_point_t *points, int32_t n, const mkv_calib_limits_t *l,
                           int32_t *order);

/* mkv_calib_eligible on the perplexity increase and agreement only. */
int32_t mkv_calib_candidates(const mkv_calib_point_t *points, int32_t n, double max_ppl_increase,
                             double min_agreement, int32_t *order);

/* Per layer and KV head at a policy: fractions of token-heads kept high, low and pruned,
 * summed over the windows' ends. Arrays [L][H]. */
typedef struct mkv_calib_heads {
    int32_t L, H;
    double *hi, *lo, *pruned;
} mkv_calib_heads_t;
void mkv_calib_heads_free(mkv_calib_heads_t *h);

/* Runs one policy on the validation windows and needle trials: quality (against the FP16
 * reference there) and, when heads is not NULL, the per-head mix. */
mkv_status_t mkv_calib_validate(mkv_calib_t *c, const mkv_policy_t *p, mkv_calib_quality_t *q,
                                mkv_calib_heads_t *heads, int *stopped);

/* The FP16 reference on the calibration windows (memory ratio of the FP16 paged cache
 * itself: its pages carry scores and positions) and needle trials. Valid after
 * mkv_calib_measure. */
void mkv_calib_reference(const mkv_calib_t *c, mkv_calib_quality_t *q);

/* The trials of needle set `set` (0 when the handle has none: no needle, or no held-back
 * set) and, when results is not NULL, the FP16 cache's results on them once run or restored
 * (NULL before). */
int32_t mkv_calib_needle_reference(const mkv_calib_t *c, int32_t set, const mkv_needle_result_t **results);

/* Restores the FP16 cache's results on needle set `set` (as a saved run measured them), so
 * they are not run again. INVALID_ARGUMENT when the set does not have n trials. */
mkv_status_t mkv_calib_needle_restore(mkv_calib_t *c, int32_t set, const mkv_needle_result_t *results,
                                      int32_t n);

/* The whole calibration: measure, front, then the candidates (within the limits) cheapest
 * first on the validation windows and trials until one stays within the limits there too (at
 * most max_checks). */
typedef struct mkv_calib_check {
    int32_t point;            /* index of the candidate */
    mkv_calib_quality_t valid;
    int passed;
} mkv_calib_check_t;

#define MKV_CALIB_MAX_CHECKS 16

typedef struct mkv_calib_result {
    int32_t n_front;
    int32_t *front;           /* [n_front] indices, by memory ratio (owned) */
    int32_t n_candidates;     /* points within the limits on the calibration windows */
    int32_t chosen;           /* the point chosen: the first candidate that passed its check,
                                 else the first candidate (validated 0), -1 when none */
    int validated;            /* the chosen point stayed within the tolerance on validation */
    int32_t n_checks;
    mkv_calib_check_t checks[MKV_CALIB_MAX_CHECKS];
    mkv_calib_heads_t heads;  /* at the chosen point, on the validation windows (or the
                                 calibration windows when there are none) */
    int stopped;              /* interrupted: only the points marked done were measured */
} mkv_calib_result_t;

mkv_status_t mkv_calib_run(mkv_calib_t *c, mkv_calib_point_t *points, int32_t n,
                           mkv_calib_result_t *out);
void mkv_calib_result_free(mkv_calib_result_t *r);

#endif /* MKV_CALIB_CALIB_H */
