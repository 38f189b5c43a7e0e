/*
 * perplexity.h — teacher-forced perplexity of a model over windows of documents, through
 * several caches at once (normally the FP16 baseline first, then one or more mixkv policies),
 * so that every mode sees the same windows and their greedy predictions can be compared
 * position by position.
 *
 * Each document is cut into consecutive, non-overlapping windows of `window` tokens (a
 * document's tail shorter than a window is not used). In each window the first prompt_len
 * tokens go through the prompt phase (prefill, then the prompt-phase policy at commit), the
 * rest one at a time through the generation phase (decode, then Algorithm 1), so both phases'
 * compression is exercised. Every position but the last predicts the next token: window - 1
 * predictions per window. Predictions are also summed per bucket of their position in the
 * window (mkv_ppl_bucket_of), which shows how quality changes with distance.
 */
#ifndef MKV_ENGINE_PERPLEXITY_H
#define MKV_ENGINE_PERPLEXITY_H

#include "runner/model.h"
#include "mixkv.h"

#include <stdint.h>

#define MKV_PPL_MAX_MODES 8
#define MKV_PPL_BUCKETS 8 /* positions [0, 128), [128, 256), [256, 512), ..., [8192, inf) */

/* The bucket of position p (0-based, in its window) and the first position of bucket b. */
static inline int mkv_ppl_bucket_of(int64_t p)
{
    int b = 0;
    for (int64_t lim = 128; b < MKV_PPL_BUCKETS - 1 && p >= lim; lim *= 2) b++;
    return b;
}
static inline int64_t mkv_ppl_bucket_start(int b) { return b == 0 ? 0 : (int64_t)64 << b; }

typedef struct mkv_ppl_bucket {
    double nll;          /* summed negative log-likelihood (nats) */
    int64_t predictions; /* tokens predicted at positions in the bucket */
    int64_t agree;       /* of which this mode's argmax equals mode 0's */
} mkv_ppl_bucket_t;

typedef struct mkv_ppl_mode {
    double nll;                /* summed negative log-likelihood (nats) */
    int64_t predictions;       /* tokens predicted */
    int64_t prompt_predictions;/* of which from prompt-phase positions */
    double prompt_nll;         /* their summed NLL */
    int64_t agree;             /* positions where this mode's argmax equals mode 0's */
    mkv_ppl_bucket_t bucket[MKV_PPL_BUCKETS];
    double memory_ratio_sum;   /* sum over windows of bytes_in_use / bytes_fp16 at the window's end */
    int64_t tokens_hi, tokens_lo, tokens_pruned; /* token-heads, summed at each window's end */
    double seconds;            /* forward time */
} mkv_ppl_mode_t;

typedef struct mkv_ppl_result {
    int32_t windows;           /* windows run */
    int32_t docs_used;         /* documents that gave at least one window */
    int32_t docs_short;        /* documents shorter than one window (skipped) */
    int32_t n_modes;
    mkv_ppl_mode_t mode[MKV_PPL_MAX_MODES];
} mkv_ppl_result_t;

/* One document: tokens[n] (BOS first, if the model uses one). */
typedef struct mkv_ppl_doc {
    const int32_t *tokens;
    int64_t n;
} mkv_ppl_doc_t;

typedef void (*mkv_ppl_progress_fn)(void *ctx, int32_t window, int32_t windows,
                                    const mkv_ppl_result_t *so_far);

typedef struct mkv_ppl_opts {
    int32_t window;          /* tokens per window, 2 .. the model's positions */
    int32_t prompt_len;      /* 1 <= prompt_len < window */
    int32_t max_windows;     /* at most this many windows in all; 0: all */
    int32_t windows_per_doc; /* at most this many windows of each document; 0: all */
    const char *dump_path;   /* the last mode's cache, written as a dump (mkv_cache_dump_json)
                                at the end of the last window before its slot is released;
                                NULL: none */
    mkv_ppl_progress_fn progress;
    void *progress_ctx;
    int32_t n_threads;       /* forward-pass threads; 0: one per online core */
    const mkv_forward_t *fwd; /* the forward pass to run (the CUDA one, say: its max_tokens must
                                 cover prompt_len); NULL: the model's CPU pass */
} mkv_ppl_opts_t;

/* -log softmax(logits[V])[target], in double; and the first index of the largest logit (the
 * greedy prediction). Shared with calibration (calib/calib.h), which scores the same way. */
double mkv_ppl_nll(const float *logits, int32_t V, int32_t target);
int32_t mkv_ppl_argmax(const float *x, int32_t n);

/* The number of windows mkv_perplexity will run for these documents and options. */
int64_t mkv_perplexity_windows(const mkv_ppl_doc_t *docs, int32_t n_docs, const mkv_ppl_opts_t *o);

/* Runs the windows through each of caches[n_modes] in turn (each with one slot of room for a
 * window; mode 0 is the reference for the agreement counts). INVALID_ARGUMENT when the options
 * are out of range or no document holds a whole window. Messages in mkv_last_error(). */
mkv_status_t mkv_perplexity(const mkv_model_t *m, mkv_cache_t *const *caches, int32_t n_modes,
                            const mkv_ppl_doc_t *docs, int32_t n_docs, const mkv_ppl_opts_t *o,
                            mkv_ppl_result_t *out);

#endif /* MKV_ENGINE_PERPLEXITY_H */
