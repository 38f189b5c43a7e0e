/*
 * scheduler.c — the host scheduler loop (see scheduler.h).
 *
 * Admission is check-then-act with a margin: a request is admitted only when the available
 * pages cover its conservative prompt demand plus the worst case of the next decode step of
 * everything running (itself included), so that a fresh admission does not immediately force
 * a preemption. When a decode step still cannot be guaranteed, the newest running request is
 * preempted (released, requeued at the front) until it can.
 *
 * With several caches (tensor parallelism) each check is made on every cache against its own
 * pages and heads, and each action (admit, budget, release) is applied to every cache in
 * order; the caches then see the same sequence of admissions and releases, which is what keeps
 * a request's slot the same on all of them.
 */
#include "engine/scheduler.h"

#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mkv_scheduler {
    mkv_forward_t fwd;
    mkv_cache_t *caches[MKV_SCHEDULER_MAX_CACHES];  /* [n_caches], borrowed */
    int32_t n_kv_heads[MKV_SCHEDULER_MAX_CACHES];   /* [n_caches] each cache's share */
    int32_t n_caches, n_layers;
    int32_t eos, max_batch, max_seq_len;
    mkv_request_t **waiting; /* FCFS, front first */
    int32_t n_waiting, cap_waiting;
    mkv_request_t **running; /* [max_batch], in admission order */
    int32_t n_running;
    float *logits;           /* [max_batch][vocab] */
    float *sample_scratch;   /* [2 * vocab] */
    int32_t *slots, *tokens, *next; /* [max_batch] */
    float *temperature, *top_p; /* [max_batch] each request's, for decode_sample */
    double *u;               /* [max_batch] each request's uniform (0 when it draws none) */
    uint64_t *rng_before;    /* [max_batch] generator states before the draws, for a failed step */
    uint8_t *done;           /* [max_batch] */
    int32_t *input;          /* [max_tokens] prompt plus generated tokens (recompute); with
                                prefill_batch, every pending prompt, packed */
    /* Admitted this step, waiting for one prefill_batch call (admission order). */
    mkv_request_t **pending; /* [max_batch] */
    int32_t *pend_slots, *pend_lens; /* [max_batch] */
    int32_t n_pending, pend_tokens;
    int64_t admissions, steps;
    int32_t finished;
    mkv_token_fn on_token;
    void *ctx;
    mkv_finish_fn on_finish;
    void *finish_ctx;
    char fail_msg[MKV_ERR_LEN]; /* why this step's last FAILED request can never fit */
};

void mkv_scheduler_free(mkv_scheduler_t *s)
{
    if (!s) return;
    free(s->waiting);
    free(s->running);
    free(s->logits);
    free(s->sample_scratch);
    free(s->slots);
    free(s->tokens);
    free(s->next);
    free(s->temperature);
    free(s->top_p);
    free(s->u);
    free(s->rng_before);
    free(s->done);
    free(s->input);
    free(s->pending);
    free(s->pend_slots);
    free(s->pend_lens);
    free(s);
}

mkv_status_t mkv_scheduler_create(const mkv_forward_t *fwd, mkv_cache_t *cache, int32_t eos,
                                  int32_t max_batch, mkv_scheduler_t **out)
{
    mkv_cache_t *const one[1] = {cache};
    return mkv_scheduler_create_multi(fwd, one, 1, eos, max_batch, out);
}

/* The caches' geometry: every field the decisions share must agree with cache 0's; *info gets
 * cache 0's, heads[k] cache k's KV heads. */
static mkv_status_t check_caches(mkv_cache_t *const *caches, int32_t n_caches, mkv_cache_info_t *info,
                                 int32_t *heads)
{
    const mkv_status_t bad = MKV_STATUS_INVALID_ARGUMENT;
    if (n_caches < 1 || n_caches > MKV_SCHEDULER_MAX_CACHES)
        return mkv_fail_global(bad, "mkv_scheduler_create: %d caches, must be in [1, %d]", n_caches,
                               MKV_SCHEDULER_MAX_CACHES);
    for (int32_t k = 0; k < n_caches; k++) {
        mkv_cache_info_t ik;
        if (!caches[k]) return mkv_fail_global(bad, "mkv_scheduler_create: cache %d is null", k);
        for (int32_t j = 0; j < k; j++)
            if (caches[j] == caches[k])
                return mkv_fail_global(bad, "mkv_scheduler_create: cache %d is cache %d again", k, j);
        const mkv_status_t st = mkv_cache_info(caches[k], k == 0 ? info : &ik);
        if (st != MKV_STATUS_OK) return st;
        heads[k] = k == 0 ? info->config.n_kv_heads : ik.config.n_kv_heads;
        if (k == 0) continue;
        const char *field = ik.config.max_seqs != info->config.max_seqs           ? "max_seqs"
                            : ik.config.max_seq_len != info->config.max_seq_len ? "max_seq_len"
                            : ik.config.n_layers != info->config.n_layers       ? "n_layers"
                                                                                : NULL;
        if (field)
            return mkv_fail_global(bad,
                                   "mkv_scheduler_create: cache %d's %s differs from cache 0's "
                                   "(max_seqs %d / %d, max_seq_len %d / %d, n_layers %d / %d)",
                                   k, field, ik.config.max_seqs, info->config.max_seqs, ik.config.max_seq_len,
                                   info->config.max_seq_len, ik.config.n_layers, info->config.n_layers);
    }
    return MKV_STATUS_OK;
}

mkv_status_t mkv_scheduler_create_multi(const mkv_forward_t *fwd, mkv_cache_t *const *caches,
                                        int32_t n_caches, int32_t eos, int32_t max_batch,
                                        mkv_scheduler_t **out)
{
    mkv_cache_info_t info;
    int32_t heads[MKV_SCHEDULER_MAX_CACHES];
    mkv_clear_global_error();
    if (out) *out = NULL;
    if (!out || !fwd || !caches)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_scheduler_create: null argument");
    if (!fwd->prefill || !fwd->decode || fwd->vocab < 1 || fwd->max_positions < 1)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                                "mkv_scheduler_create: the forward pass lacks prefill or decode, or "
                                "has vocab %d, max_positions %d",
                                fwd->vocab, fwd->max_positions);
    mkv_status_t st = check_caches(caches, n_caches, &info, heads);
    if (st != MKV_STATUS_OK) return st;
    if (max_batch < 1 || max_batch > info.config.max_seqs)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                               "max_batch %d must be in [1, the cache's %d slots]", max_batch,
                               info.config.max_seqs);
    if (fwd->max_tokens < info.config.max_seq_len || fwd->max_tokens < max_batch)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                                "the forward pass takes %d tokens a call; the scheduler needs %d "
                                "(max_seq_len %d, max_batch %d)",
                                fwd->max_tokens,
                                info.config.max_seq_len > max_batch ? info.config.max_seq_len : max_batch,
                                info.config.max_seq_len, max_batch);
    mkv_scheduler_t *s = calloc(1, sizeof *s);
    if (!s) return mkv_fail_global(MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the scheduler");
    const int64_t V = fwd->vocab;
    s->fwd = *fwd;
    s->n_caches = n_caches;
    for (int32_t k = 0; k < n_caches; k++) {
        s->caches[k] = caches[k];
        s->n_kv_heads[k] = heads[k];
    }
    s->n_layers = info.config.n_layers;
    s->eos = eos;
    s->max_batch = max_batch;
    s->max_seq_len = info.config.max_seq_len;
    s->running = calloc((size_t)max_batch, sizeof *s->running);
    s->logits = malloc((size_t)(max_batch * V) * sizeof(float));
    s->sample_scratch = malloc((size_t)(2 * V) * sizeof(float));
    s->slots = malloc((size_t)max_batch * sizeof(int32_t));
    s->tokens = malloc((size_t)max_batch * sizeof(int32_t));
    s->next = malloc((size_t)max_batch * sizeof(int32_t));
    s->temperature = malloc((size_t)max_batch * sizeof(float));
    s->top_p = malloc((size_t)max_batch * sizeof(float));
    s->u = malloc((size_t)max_batch * sizeof(double));
    s->rng_before = malloc((size_t)max_batch * sizeof(uint64_t));
    s->done = malloc((size_t)max_batch);
    s->input = malloc((size_t)(fwd->prefill_batch ? fwd->max_tokens : s->max_seq_len) * sizeof(int32_t));
    s->pending = calloc((size_t)max_batch, sizeof *s->pending);
    s->pend_slots = malloc((size_t)max_batch * sizeof(int32_t));
    s->pend_lens = malloc((size_t)max_batch * sizeof(int32_t));
    if (!s->running || !s->logits || !s->sample_scratch || !s->slots || !s->tokens || !s->next ||
        !s->temperature || !s->top_p || !s->u || !s->rng_before || !s->done || !s->input || !s->pending ||
        !s->pend_slots || !s->pend_lens) {
        mkv_scheduler_free(s);
        return mkv_fail_global(MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the scheduler's buffers");
    }
    *out = s;
    return MKV_STATUS_OK;
}

int32_t mkv_scheduler_n_caches(const mkv_scheduler_t *s) { return s->n_caches; }

mkv_cache_t *mkv_scheduler_cache(const mkv_scheduler_t *s, int32_t i)
{
    return i >= 0 && i < s->n_caches ? s->caches[i] : NULL;
}

void mkv_scheduler_on_token(mkv_scheduler_t *s, mkv_token_fn fn, void *ctx)
{
    s->on_token = fn;
    s->ctx = ctx;
}

void mkv_scheduler_on_finish(mkv_scheduler_t *s, mkv_finish_fn fn, void *ctx)
{
    s->on_finish = fn;
    s->finish_ctx = ctx;
}

/* Room for one more waiting request. */
static mkv_status_t grow_waiting(mkv_scheduler_t *s)
{
    if (s->n_waiting < s->cap_waiting) return MKV_STATUS_OK;
    const int32_t cap = s->cap_waiting ? 2 * s->cap_waiting : 16;
    mkv_request_t **w = realloc(s->waiting, (size_t)cap * sizeof *w);
    if (!w) return mkv_fail_global(MKV_STATUS_OUT_OF_MEMORY, "cannot grow the waiting queue");
    s->waiting = w;
    s->cap_waiting = cap;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_scheduler_add(mkv_scheduler_t *s, mkv_request_t *r)
{
    mkv_clear_global_error();
    if (!s || !r || (r->prompt_len > 0 && !r->prompt))
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_scheduler_add: null argument");
    const int64_t total = (int64_t)r->prompt_len + r->max_new_tokens;
    if (r->prompt_len < 1 || r->max_new_tokens < 1 || total > s->max_seq_len ||
        total > s->fwd.max_positions)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                               "request %d: prompt %d + %d new tokens must be >= 1 + 1 and fit "
                               "max_seq_len %d and the model's %d positions",
                               r->id, r->prompt_len, r->max_new_tokens, s->max_seq_len,
                               s->fwd.max_positions);
    for (int32_t i = 0; i < r->prompt_len; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->fwd.vocab)
            return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                                   "request %d: prompt token %d = %d is outside the vocabulary",
                                   r->id, i, r->prompt[i]);
    if (grow_waiting(s) != MKV_STATUS_OK) return MKV_STATUS_OUT_OF_MEMORY;
    free(r->out);
    r->out = malloc((size_t)r->max_new_tokens * sizeof(int32_t));
    if (!r->out) return mkv_fail_global(MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the output");
    r->n_out = 0;
    r->state = MKV_REQ_WAITING;
    r->slot = -1;
    r->preemptions = 0;
    s->waiting[s->n_waiting++] = r;
    return MKV_STATUS_OK;
}

int mkv_scheduler_idle(const mkv_scheduler_t *s) { return s->n_waiting == 0 && s->n_running == 0; }

/* ---------------------------------------------------------------------------------------- */

/* Cache k's failure as the scheduler's, with that cache's message (and its index when there
 * are several). */
static mkv_status_t cache_fail(const mkv_scheduler_t *s, int32_t k, mkv_status_t st)
{
    if (s->n_caches == 1) return mkv_fail_global(st, "%s", mkv_cache_last_error(s->caches[0]));
    return mkv_fail_global(st, "cache %d: %s", k, mkv_cache_last_error(s->caches[k]));
}

/* Releases slot on every cache. Each is tried even after a failure, so that no cache keeps
 * the slot because another refused; the first failure is reported. */
static mkv_status_t release_everywhere(const mkv_scheduler_t *s, int32_t slot)
{
    mkv_status_t first = MKV_STATUS_OK;
    for (int32_t k = 0; k < s->n_caches; k++) {
        const mkv_status_t st = mkv_cache_release(s->caches[k], slot, NULL);
        if (st != MKV_STATUS_OK && first == MKV_STATUS_OK) first = cache_fail(s, k, st);
    }
    return first;
}

/* The cache use of a slot, summed over the caches (seq_len and active: cache 0's). */
static mkv_status_t slot_info_sum(const mkv_scheduler_t *s, int32_t slot, mkv_slot_info_t *sum)
{
    for (int32_t k = 0; k < s->n_caches; k++) {
        mkv_slot_info_t si;
        const mkv_status_t st = mkv_cache_slot_info(s->caches[k], slot, k == 0 ? sum : &si);
        if (st != MKV_STATUS_OK) return cache_fail(s, k, st);
        if (k == 0) continue;
        sum->reserved_pages += si.reserved_pages;
        sum->tokens_hi += si.tokens_hi;
        sum->tokens_lo += si.tokens_lo;
        sum->pages_hi += si.pages_hi;
        sum->pages_lo += si.pages_lo;
    }
    return MKV_STATUS_OK;
}

static void pop_front(mkv_scheduler_t *s)
{
    memmove(s->waiting, s->waiting + 1, (size_t)(--s->n_waiting) * sizeof *s->waiting);
}

static mkv_status_t push_front(mkv_scheduler_t *s, mkv_request_t *r)
{
    if (grow_waiting(s) != MKV_STATUS_OK) return MKV_STATUS_OUT_OF_MEMORY;
    memmove(s->waiting + 1, s->waiting, (size_t)s->n_waiting * sizeof *s->waiting);
    s->waiting[0] = r;
    s->n_waiting++;
    return MKV_STATUS_OK;
}

static void remove_running(mkv_scheduler_t *s, int32_t j)
{
    memmove(s->running + j, s->running + j + 1, (size_t)(s->n_running - j - 1) * sizeof *s->running);
    s->n_running--;
}

/* Records token t for r; returns 1 when r is done. */
static int emit(mkv_scheduler_t *s, mkv_request_t *r, int32_t t)
{
    r->out[r->n_out++] = t;
    if (s->on_token) s->on_token(s->ctx, r, t);
    return r->n_out >= r->max_new_tokens || (r->stop_at_eos && t == s->eos);
}

static mkv_status_t finish(mkv_scheduler_t *s, int32_t j)
{
    mkv_request_t *r = s->running[j];
    mkv_status_t st = slot_info_sum(s, r->slot, &r->kv);
    if (st != MKV_STATUS_OK) return st;
    if (s->on_finish && (st = s->on_finish(s->finish_ctx, r, s->caches[0])) != MKV_STATUS_OK) return st;
    if ((st = release_everywhere(s, r->slot)) != MKV_STATUS_OK) return st;
    r->state = MKV_REQ_FINISHED;
    r->slot = -1;
    s->finished++;
    remove_running(s, j);
    return MKV_STATUS_OK;
}

/* Cache k's worst case for the next decode step of everything running. */
static mkv_status_t running_demand(mkv_scheduler_t *s, int32_t k, int64_t *demand)
{
    for (int32_t j = 0; j < s->n_running; j++) s->slots[j] = s->running[j]->slot;
    const mkv_status_t st = mkv_cache_step_demand(s->caches[k], s->n_running, s->slots, demand);
    return st == MKV_STATUS_OK ? st : cache_fail(s, k, st);
}

/* *fits = 1 when the next decode step of everything running fits every cache. */
static mkv_status_t step_fits(mkv_scheduler_t *s, int *fits)
{
    *fits = 1;
    for (int32_t k = 0; k < s->n_caches && *fits; k++) {
        int64_t demand;
        mkv_cache_stats_t cs;
        mkv_status_t st;
        if ((st = running_demand(s, k, &demand)) != MKV_STATUS_OK) return st;
        if ((st = mkv_cache_stats(s->caches[k], &cs)) != MKV_STATUS_OK) return st;
        *fits = demand <= cs.available_pages;
    }
    return MKV_STATUS_OK;
}

/* The prefill of the requests admitted this step (prefill_batch), each then running with
 * its first token sampled, in admission order. */
static mkv_status_t flush_pending(mkv_scheduler_t *s)
{
    const int32_t n = s->n_pending, base = s->n_running, V = s->fwd.vocab;
    if (n == 0) return MKV_STATUS_OK;
    s->n_pending = 0;
    s->pend_tokens = 0;
    const mkv_status_t st =
        s->fwd.prefill_batch(s->fwd.ctx, s->caches[0], n, s->pend_slots, s->input, s->pend_lens, s->logits);
    if (st != MKV_STATUS_OK) return st;
    for (int32_t j = 0; j < n; j++) {
        mkv_request_t *r = s->pending[j];
        r->state = MKV_REQ_RUNNING;
        r->admitted_at = s->admissions++;
        s->running[s->n_running++] = r;
        s->done[j] = (uint8_t)emit(s, r, mkv_sample(&r->sampler, s->logits + (int64_t)j * V, V, s->sample_scratch));
    }
    for (int32_t j = n - 1; j >= 0; j--) {
        mkv_status_t fs;
        if (s->done[j] && (fs = finish(s, base + j)) != MKV_STATUS_OK) return fs;
    }
    return MKV_STATUS_OK;
}

/* Admits a len-token prompt on every cache, with its budget: the same slot on each. On a
 * failure whatever was admitted is released again: nothing stays half-admitted. */
static mkv_status_t admit_everywhere(mkv_scheduler_t *s, int32_t len, int32_t budget, int32_t *slot)
{
    int32_t taken[MKV_SCHEDULER_MAX_CACHES]; /* [n_caches] each cache's slot */
    int32_t n_taken = 0;
    mkv_status_t st = MKV_STATUS_OK;
    for (int32_t k = 0; k < s->n_caches && st == MKV_STATUS_OK; k++) {
        if ((st = mkv_cache_admit(s->caches[k], len, &taken[k])) != MKV_STATUS_OK) {
            st = cache_fail(s, k, st);
            break;
        }
        n_taken = k + 1;
        if (taken[k] != taken[0])
            st = mkv_fail_global(MKV_STATUS_INTERNAL,
                                 "cache %d admitted the request into slot %d, cache 0 into slot %d: the "
                                 "caches' slots have drifted apart (did something else admit or release?)",
                                 k, taken[k], taken[0]);
        else if (budget > 0 && (st = mkv_cache_set_budget(s->caches[k], taken[k], budget)) != MKV_STATUS_OK)
            st = cache_fail(s, k, st);
    }
    if (st == MKV_STATUS_OK) {
        *slot = taken[0];
        return MKV_STATUS_OK;
    }
    for (int32_t k = 0; k < n_taken; k++) (void)mkv_cache_release(s->caches[k], taken[k], NULL);
    return st;
}

/* Whether the front request (len tokens) fits every cache with the margin: the next decode
 * step of everything running, of the requests pending and of this one. *never names a cache
 * it could not fit even empty (else -1), and *need, *pool that cache's demand and pages. */
static mkv_status_t admission_fits(mkv_scheduler_t *s, int32_t len, int *fits, int32_t *never, int64_t *need,
                                   int64_t *pool)
{
    *fits = 1;
    *never = -1;
    for (int32_t k = 0; k < s->n_caches; k++) {
        int64_t prompt_pages, running_pages;
        mkv_cache_stats_t cs;
        mkv_status_t st;
        if ((st = mkv_cache_prompt_demand(s->caches[k], len, &prompt_pages)) != MKV_STATUS_OK) return st;
        if ((st = running_demand(s, k, &running_pages)) != MKV_STATUS_OK) return st;
        if ((st = mkv_cache_stats(s->caches[k], &cs)) != MKV_STATUS_OK) return st;
        const int64_t demand = prompt_pages + running_pages +
                               2 * (int64_t)s->n_layers * s->n_kv_heads[k] * (1 + s->n_pending);
        if (demand <= cs.available_pages) continue;
        *fits = 0;
        if (*never < 0 && demand > cs.total_pages - cs.reserved_pages) {
            *never = k;
            *need = demand;
            *pool = cs.total_pages;
        }
    }
    return MKV_STATUS_OK;
}

/* Admits the front request if it fits with the margin; *admitted says whether it did. A
 * request that cannot fit even an otherwise empty cache is dropped as FAILED (*failed, the
 * message kept in fail_msg). With prefill_batch the admitted request waits in pending for
 * flush_pending, as long as the pending prompts fit one call (else it waits for the next
 * step). */
static mkv_status_t try_admit(mkv_scheduler_t *s, int *admitted, int *failed)
{
    mkv_request_t *r = s->waiting[0];
    const int32_t len = r->prompt_len + r->n_out;
    const int batch = s->fwd.prefill_batch != NULL;
    int fits;
    int32_t never;
    int64_t need = 0, pool = 0;
    mkv_status_t st;
    *admitted = 0;
    *failed = 0;
    if (batch && s->n_pending > 0 && (int64_t)s->pend_tokens + len > s->fwd.max_tokens) return MKV_STATUS_OK;
    if ((st = admission_fits(s, len, &fits, &never, &need, &pool)) != MKV_STATUS_OK) return st;
    if (!fits) {
        if (s->n_running == 0 && never >= 0) {
            r->state = MKV_REQ_FAILED;
            pop_front(s);
            *failed = 1;
            if (s->n_caches == 1)
                snprintf(s->fail_msg, sizeof s->fail_msg,
                         "request %d needs %lld pages for its %d-token prompt and first step; "
                         "the pool has %lld",
                         r->id, (long long)need, len, (long long)pool);
            else
                snprintf(s->fail_msg, sizeof s->fail_msg,
                         "request %d needs %lld pages of cache %d for its %d-token prompt and first step; "
                         "that pool has %lld",
                         r->id, (long long)need, never, len, (long long)pool);
        }
        return MKV_STATUS_OK; /* FCFS: wait for pages */
    }
    int32_t slot;
    if ((st = admit_everywhere(s, len, r->budget, &slot)) != MKV_STATUS_OK) return st;
    pop_front(s);
    int32_t *in = s->input + (batch ? s->pend_tokens : 0);
    memcpy(in, r->prompt, (size_t)r->prompt_len * sizeof(int32_t));
    memcpy(in + r->prompt_len, r->out, (size_t)r->n_out * sizeof(int32_t));
    if (batch) {
        r->slot = slot;
        s->pending[s->n_pending] = r;
        s->pend_slots[s->n_pending] = slot;
        s->pend_lens[s->n_pending++] = len;
        s->pend_tokens += len;
        *admitted = 1;
        return MKV_STATUS_OK;
    }
    if ((st = s->fwd.prefill(s->fwd.ctx, s->caches[0], slot, s->input, len, NULL, s->logits)) != MKV_STATUS_OK)
        return st;
    r->state = MKV_REQ_RUNNING;
    r->slot = slot;
    r->admitted_at = s->admissions++;
    s->running[s->n_running++] = r;
    *admitted = 1;
    const int32_t t = mkv_sample(&r->sampler, s->logits, s->fwd.vocab, s->sample_scratch);
    return emit(s, r, t) ? finish(s, s->n_running - 1) : MKV_STATUS_OK;
}

/* Preempts the newest running request: releases it and requeues it at the front. */
static mkv_status_t preempt_newest(mkv_scheduler_t *s)
{
    int32_t j = 0;
    for (int32_t i = 1; i < s->n_running; i++)
        if (s->running[i]->admitted_at > s->running[j]->admitted_at) j = i;
    mkv_request_t *r = s->running[j];
    const mkv_status_t st = release_everywhere(s, r->slot);
    if (st != MKV_STATUS_OK) return st;
    r->state = MKV_REQ_WAITING;
    r->slot = -1;
    r->preemptions++;
    remove_running(s, j);
    return push_front(s, r);
}

mkv_status_t mkv_scheduler_step(mkv_scheduler_t *s, mkv_sched_stats_t *stats)
{
    mkv_sched_stats_t local;
    mkv_sched_stats_t *out = stats ? stats : &local;
    mkv_status_t st = MKV_STATUS_OK, fail = MKV_STATUS_OK;
    mkv_clear_global_error();
    memset(out, 0, sizeof *out);
    out->step = s->steps++;

    /* 1. Admissions, first come first served (with prefill_batch, one prefill for all). */
    while (s->n_waiting > 0 && s->n_running + s->n_pending < s->max_batch) {
        int admitted, failed;
        if ((st = try_admit(s, &admitted, &failed)) != MKV_STATUS_OK) return st;
        if (failed) { /* reported, and the step goes on with the next request */
            fail = MKV_STATUS_OUT_OF_PAGES;
            continue;
        }
        if (!admitted) break;
        out->admitted++;
    }
    if ((st = flush_pending(s)) != MKV_STATUS_OK) return st;

    /* 2. One decode step of everything running, preempting while it could run out. */
    while (s->n_running > 0) {
        int fits;
        if ((st = step_fits(s, &fits)) != MKV_STATUS_OK) return st;
        if (fits) break;
        if ((st = preempt_newest(s)) != MKV_STATUS_OK) return st;
        out->preempted++;
    }
    if (s->n_running > 0) {
        const int32_t n = s->n_running, V = s->fwd.vocab;
        for (int32_t j = 0; j < n; j++) {
            s->slots[j] = s->running[j]->slot;
            s->tokens[j] = s->running[j]->out[s->running[j]->n_out - 1];
        }
        /* The pass picks on its side when it can (every request greedy and decode_greedy, or
         * decode_sample): only the tokens come back. Otherwise the logits do, and the host
         * samples. */
        int greedy = s->fwd.decode_greedy != NULL;
        for (int32_t j = 0; j < n && greedy; j++) greedy = s->running[j]->sampler.temperature <= 0.0f;
        const int on_device = greedy || s->fwd.decode_sample != NULL;
        if (greedy) {
            st = s->fwd.decode_greedy(s->fwd.ctx, s->caches[0], n, s->slots, s->tokens, s->next);
        } else if (on_device) {
            /* Each request's uniform, drawn exactly when and as mkv_sample would draw it, so
             * its tokens match host sampling's; a failed step puts the generators back. */
            for (int32_t j = 0; j < n; j++) {
                mkv_sampler_t *g = &s->running[j]->sampler;
                s->temperature[j] = g->temperature;
                s->top_p[j] = g->top_p;
                s->rng_before[j] = g->state;
                s->u[j] = mkv_sampler_draws(g, V) ? mkv_sampler_uniform(g) : 0.0;
            }
            st = s->fwd.decode_sample(s->fwd.ctx, s->caches[0], n, s->slots, s->tokens, s->temperature, s->top_p,
                                      s->u, s->next);
            if (st != MKV_STATUS_OK)
                for (int32_t j = 0; j < n; j++) s->running[j]->sampler.state = s->rng_before[j];
        } else {
            st = s->fwd.decode(s->fwd.ctx, s->caches[0], n, s->slots, s->tokens, s->logits);
        }
        if (st != MKV_STATUS_OK) return st;
        for (int32_t j = 0; on_device && j < n; j++)
            if (s->next[j] < 0 || s->next[j] >= V)
                return mkv_fail_global(MKV_STATUS_INTERNAL, "the forward pass picked token %d for request %d, "
                                       "outside the vocabulary of %d", s->next[j], s->running[j]->id, V);
        out->decoded = n;
        /* Sample in running order; finish afterwards so indices stay valid. */
        uint8_t *done = s->done;
        for (int32_t j = 0; j < n; j++) {
            mkv_request_t *r = s->running[j];
            const int32_t t = on_device ? s->next[j]
                                        : mkv_sample(&r->sampler, s->logits + (int64_t)j * V, V, s->sample_scratch);
            done[j] = (uint8_t)emit(s, r, t);
        }
        for (int32_t j = n - 1; j >= 0; j--)
            if (done[j] && (st = finish(s, j)) != MKV_STATUS_OK) return st;
    }

    for (int32_t k = 0; k < s->n_caches; k++) {
        mkv_cache_stats_t cs;
        if ((st = mkv_cache_stats(s->caches[k], &cs)) != MKV_STATUS_OK) return st;
        out->free_pages += cs.free_pages;
        out->available_pages += cs.available_pages;
        out->tokens_hi += cs.tokens_hi;
        out->tokens_lo += cs.tokens_lo;
        out->tokens_pruned += cs.tokens_pruned;
    }
    out->running = s->n_running;
    out->waiting = s->n_waiting;
    out->finished = s->finished;
    /* The message of a FAILED request, reported again: later admission checks of the step
     * clear the thread's message. */
    return fail == MKV_STATUS_OK ? fail : mkv_fail_global(fail, "%s", s->fail_msg);
}
