/*
 * perplexity.c — teacher-forced perplexity through two caches (see perplexity.h).
 */
#include "engine/perplexity.h"

#include "common/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* -log softmax(logits)[target], in double. */
static double nll(const float *logits, int32_t V, int32_t target)
{
    float m = logits[0];
    for (int32_t i = 1; i < V; i++) m = logits[i] > m ? logits[i] : m;
    double z = 0.0;
    for (int32_t i = 0; i < V; i++) z += exp((double)logits[i] - m);
    return log(z) - ((double)logits[target] - m);
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

mkv_status_t mkv_perplexity(const mkv_model_t *m, mkv_cache_t *const caches[2],
                            const int32_t *tokens, int64_t n, int32_t window, int32_t prompt_len,
                            int32_t max_windows, mkv_ppl_progress_fn progress, void *ctx,
                            mkv_ppl_result_t *out)
{
    char err[MKV_ERR_LEN];
    mkv_status_t st = MKV_STATUS_OK;
    mkv_forward_ws_t *ws = NULL;
    float *logits = NULL;
    int32_t *pred = NULL;
    mkv_clear_global_error();
    memset(out, 0, sizeof *out);
    if (window < 2 || prompt_len < 1 || prompt_len >= window)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                               "window %d and prompt length %d: need 1 <= prompt < window", window,
                               prompt_len);
    if (window > m->cfg.max_pos)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                               "window %d exceeds the model's %d positions", window, m->cfg.max_pos);
    int64_t windows = n / window;
    if (max_windows > 0 && windows > max_windows) windows = max_windows;
    if (windows < 1)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                               "the text has %lld tokens, fewer than one window of %d",
                               (long long)n, window);
    const int32_t V = m->cfg.vocab;
    if ((st = mkv_forward_ws_create(m, window, &ws, err)) != MKV_STATUS_OK)
        return mkv_fail_global(st, "%s", err);
    logits = malloc((size_t)window * V * sizeof(float));
    pred = malloc((size_t)window * sizeof(int32_t)); /* mode 0's argmax per position */
    if (!logits || !pred) {
        st = mkv_fail_global(MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the logits");
        goto done;
    }

    for (int64_t w = 0; w < windows; w++) {
        const int32_t *t = tokens + w * window;
        for (int k = 0; k < 2; k++) {
            mkv_cache_t *c = caches[k];
            mkv_ppl_mode_t *md = &out->mode[k];
            int32_t slot;
            const double t0 = now_s();
            if ((st = mkv_cache_admit(c, prompt_len, &slot)) != MKV_STATUS_OK) {
                mkv_fail_global(st, "%s", mkv_cache_last_error(c));
                goto done;
            }
            /* Prompt: logits of every prompt position. */
            if ((st = mkv_model_prefill(m, c, slot, t, prompt_len, logits, NULL, ws)) != MKV_STATUS_OK)
                goto done;
            /* Generation: feed the true next token, one at a time. */
            for (int32_t i = prompt_len; i < window - 1; i++)
                if ((st = mkv_model_decode(m, c, 1, &slot, &t[i], logits + (int64_t)i * V, ws)) !=
                    MKV_STATUS_OK)
                    goto done;
            md->seconds += now_s() - t0;
            for (int32_t i = 0; i + 1 < window; i++) {
                const float *lg = logits + (int64_t)i * V;
                const double x = nll(lg, V, t[i + 1]);
                md->nll += x;
                md->predictions++;
                if (i < prompt_len) {
                    md->prompt_nll += x;
                    md->prompt_predictions++;
                }
                const int32_t a = argmax(lg, V);
                if (k == 0) pred[i] = a;
                else out->agree += a == pred[i];
            }
            mkv_cache_stats_t cs;
            mkv_cache_stats(c, &cs);
            md->memory_ratio_sum += (double)cs.bytes_in_use / (double)cs.bytes_fp16;
            md->tokens_hi += cs.tokens_hi;
            md->tokens_lo += cs.tokens_lo;
            md->tokens_pruned += cs.tokens_pruned;
            if ((st = mkv_cache_validate(c)) != MKV_STATUS_OK ||
                (st = mkv_cache_release(c, slot, NULL)) != MKV_STATUS_OK) {
                mkv_fail_global(st, "%s", mkv_cache_last_error(c));
                goto done;
            }
        }
        out->windows = (int32_t)(w + 1);
        if (progress) progress(ctx, (int32_t)(w + 1), (int32_t)windows, out);
    }
done:
    mkv_forward_ws_free(ws);
    free(logits);
    free(pred);
    return st;
}
