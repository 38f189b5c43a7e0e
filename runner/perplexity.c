/*
 * perplexity.c — teacher-forced perplexity through several caches (see perplexity.h).
 */
#include "runner/perplexity.h"

#include "runner/error.h"

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

double mkv_ppl_nll(const float *logits, int32_t V, int32_t target)
{
    float m = logits[0];
    for (int32_t i = 1; i < V; i++) m = logits[i] > m ? logits[i] : m;
    double z = 0.0;
    for (int32_t i = 0; i < V; i++) z += exp((double)logits[i] - m);
    return log(z) - ((double)logits[target] - m);
}

int32_t mkv_ppl_argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int64_t mkv_perplexity_windows(const mkv_ppl_doc_t *docs, int32_t n_docs, const mkv_ppl_opts_t *o)
{
    if (o->window < 2) return 0;
    int64_t total = 0;
    for (int32_t d = 0; d < n_docs; d++) {
        int64_t w = docs[d].n / o->window;
        if (o->windows_per_doc > 0 && w > o->windows_per_doc) w = o->windows_per_doc;
        total += w;
    }
    if (o->max_windows > 0 && total > o->max_windows) total = o->max_windows;
    return total;
}

/* Scores the prediction at position i of a window (logits lg, next token `target`) for mode k;
 * pred0 holds mode 0's argmax per position. */
static void score(mkv_ppl_mode_t *md, int k, int32_t *pred0, const float *lg, int32_t V,
                  int32_t i, int32_t target, int prompt)
{
    const double x = mkv_ppl_nll(lg, V, target);
    const int32_t a = mkv_ppl_argmax(lg, V);
    mkv_ppl_bucket_t *b = &md->bucket[mkv_ppl_bucket_of(i)];
    md->nll += x;
    md->predictions++;
    b->nll += x;
    b->predictions++;
    if (prompt) {
        md->prompt_nll += x;
        md->prompt_predictions++;
    }
    if (k == 0) pred0[i] = a;
    const int same = a == pred0[i];
    md->agree += same;
    b->agree += same;
}

/* One window of tokens t[window] through cache c as mode k. */
static mkv_status_t run_window(const mkv_model_t *m, mkv_cache_t *c, int k, const int32_t *t,
                               const mkv_ppl_opts_t *o, int last, const mkv_forward_t *fw,
                               float *logits, int32_t *pred0, mkv_ppl_mode_t *md)
{
    const int32_t V = m->cfg.vocab, P = o->prompt_len;
    mkv_status_t st;
    int32_t slot;
    const double t0 = now_s();
    if ((st = mkv_cache_admit(c, P, &slot)) != MKV_STATUS_OK)
        return mkv_report_error(st, "%s", mkv_cache_last_error(c));
    /* Prompt: logits of every prompt position. */
    if ((st = fw->prefill(fw->ctx, c, slot, t, P, logits, NULL)) != MKV_STATUS_OK) return st;
    double busy = now_s() - t0;
    for (int32_t i = 0; i < P; i++)
        score(md, k, pred0, logits + (int64_t)i * V, V, i, t[i + 1], 1);
    /* Generation: feed the true next token, one at a time. */
    for (int32_t i = P; i < o->window - 1; i++) {
        const double t1 = now_s();
        if ((st = fw->decode(fw->ctx, c, 1, &slot, &t[i], logits)) != MKV_STATUS_OK) return st;
        busy += now_s() - t1;
        score(md, k, pred0, logits, V, i, t[i + 1], 0);
    }
    md->seconds += busy;
    mkv_cache_stats_t cs;
    mkv_cache_stats(c, &cs);
    md->memory_ratio_sum += (double)cs.bytes_in_use / (double)cs.bytes_fp16;
    md->tokens_hi += cs.tokens_hi;
    md->tokens_lo += cs.tokens_lo;
    md->tokens_pruned += cs.tokens_pruned;
    if ((st = mkv_cache_validate(c)) != MKV_STATUS_OK)
        return mkv_report_error(st, "%s", mkv_cache_last_error(c));
    if (last && o->dump_path && (st = mkv_cache_dump_json(c, o->dump_path)) != MKV_STATUS_OK)
        return mkv_report_error(st, "%s", mkv_cache_last_error(c));
    if ((st = mkv_cache_release(c, slot, NULL)) != MKV_STATUS_OK)
        return mkv_report_error(st, "%s", mkv_cache_last_error(c));
    return MKV_STATUS_OK;
}

mkv_status_t mkv_perplexity(const mkv_model_t *m, mkv_cache_t *const *caches, int32_t n_modes,
                            const mkv_ppl_doc_t *docs, int32_t n_docs, const mkv_ppl_opts_t *o,
                            mkv_ppl_result_t *out)
{
    char err[MKV_ERR_LEN];
    mkv_status_t st = MKV_STATUS_OK;
    mkv_forward_ws_t *ws = NULL;
    float *logits = NULL;
    int32_t *pred0 = NULL;
    (void)mkv_report_error(MKV_STATUS_OK, NULL);
    memset(out, 0, sizeof *out);
    if (n_modes < 1 || n_modes > MKV_PPL_MAX_MODES)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "%d modes: 1 to %d", n_modes,
                               MKV_PPL_MAX_MODES);
    if (o->window < 2 || o->prompt_len < 1 || o->prompt_len >= o->window)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                               "window %d and prompt length %d: need 1 <= prompt < window",
                               o->window, o->prompt_len);
    if (o->window > m->cfg.max_pos)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                               "window %d exceeds the model's %d positions", o->window,
                               m->cfg.max_pos);
    if (o->max_windows < 0 || o->windows_per_doc < 0)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "negative window limits");
    const int64_t windows = mkv_perplexity_windows(docs, n_docs, o);
    if (windows < 1) {
        int64_t longest = 0;
        for (int32_t d = 0; d < n_docs; d++) longest = docs[d].n > longest ? docs[d].n : longest;
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                               "no document holds a window of %d tokens (the longest has %lld)",
                               o->window, (long long)longest);
    }
    const int32_t V = m->cfg.vocab;
    mkv_forward_t fw;
    if (o->fwd) {
        fw = *o->fwd;
        if (fw.vocab != V || fw.max_tokens < o->prompt_len || !fw.prefill || !fw.decode)
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                    "the forward pass (vocab %d, %d tokens a call) does not fit the model "
                                    "(vocab %d) and prompt length %d",
                                    fw.vocab, fw.max_tokens, V, o->prompt_len);
    } else {
        if ((st = mkv_forward_ws_create(m, o->prompt_len, &ws, err)) != MKV_STATUS_OK)
            return mkv_report_error(st, "%s", err);
        if (o->n_threads > 0 && (st = mkv_forward_ws_set_threads(ws, o->n_threads)) != MKV_STATUS_OK) {
            mkv_forward_ws_free(ws);
            return mkv_report_error(st, "cannot use %d threads", o->n_threads);
        }
        fw = mkv_model_forward(ws);
    }
    logits = malloc((size_t)o->prompt_len * V * sizeof(float));
    pred0 = malloc((size_t)o->window * sizeof(int32_t));
    if (!logits || !pred0) {
        st = mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the logits of %d positions",
                             o->prompt_len);
        goto done;
    }
    out->n_modes = n_modes;
    for (int32_t d = 0; d < n_docs; d++) out->docs_short += docs[d].n < o->window;
    int64_t w = 0;
    for (int32_t d = 0; d < n_docs && w < windows; d++) {
        int64_t nw = docs[d].n / o->window;
        if (o->windows_per_doc > 0 && nw > o->windows_per_doc) nw = o->windows_per_doc;
        if (nw == 0) continue;
        out->docs_used++;
        for (int64_t j = 0; j < nw && w < windows; j++, w++) {
            const int32_t *t = docs[d].tokens + j * o->window;
            for (int k = 0; k < n_modes; k++) {
                const int last = w + 1 == windows && k == n_modes - 1;
                if ((st = run_window(m, caches[k], k, t, o, last, &fw, logits, pred0,
                                     &out->mode[k])) != MKV_STATUS_OK)
                    goto done;
            }
            out->windows = (int32_t)(w + 1);
            if (o->progress) o->progress(o->progress_ctx, out->windows, (int32_t)windows, out);
        }
    }
done:
    mkv_forward_ws_free(ws);
    free(logits);
    free(pred0);
    return st;
}
