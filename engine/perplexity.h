/*
 * perplexity.h — teacher-forced perplexity of a model over windows of a token stream, through
 * two caches at once (normally the FP16 baseline and mixkv), so that both see the same windows
 * and their greedy predictions can be compared token by token.
 *
 * Each window of `window` tokens: the first prompt_len tokens go through the prompt phase
 * (prefill, then the prompt-phase policy at commit), the rest one at a time through the
 * generation phase (decode, then Algorithm 1), so both phases' compression is exercised. Every
 * position but the last predicts the next token: window - 1 predictions per window.
 */
#ifndef MKV_ENGINE_PERPLEXITY_H
#define MKV_ENGINE_PERPLEXITY_H

#include "engine/model.h"
#include "mixkv.h"

#include <stdint.h>

typedef struct mkv_ppl_mode {
    double nll;                /* summed negative log-likelihood (nats) */
    int64_t predictions;       /* tokens predicted */
    int64_t prompt_predictions;/* of which from prompt-phase positions */
    double prompt_nll;         /* their summed NLL */
    double memory_ratio_sum;   /* sum over windows of bytes_in_use / bytes_fp16 at the window's end */
    int64_t tokens_hi, tokens_lo, tokens_pruned; /* summed at each window's end */
    double seconds;            /* forward time */
} mkv_ppl_mode_t;

typedef struct mkv_ppl_result {
    int32_t windows;
    mkv_ppl_mode_t mode[2];
    int64_t agree;             /* positions where both modes' argmax agree */
} mkv_ppl_result_t;

typedef void (*mkv_ppl_progress_fn)(void *ctx, int32_t window, int32_t windows,
                                    const mkv_ppl_result_t *so_far);

/* Runs windows of `window` tokens (consecutive, non-overlapping, at most max_windows; 0: all)
 * of tokens[n] through both caches (each with room for one window; slot use is one at a time).
 * 1 <= prompt_len < window. Messages in mkv_last_error(). */
mkv_status_t mkv_perplexity(const mkv_model_t *m, mkv_cache_t *const caches[2],
                            const int32_t *tokens, int64_t n, int32_t window, int32_t prompt_len,
                            int32_t max_windows, mkv_ppl_progress_fn progress, void *ctx,
                            mkv_ppl_result_t *out);

#endif /* MKV_ENGINE_PERPLEXITY_H */
