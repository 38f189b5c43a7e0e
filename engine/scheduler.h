/*
 * scheduler.h — the host scheduler loop (DESIGN.md section 6): waiting and running queues,
 * first come first served, continuous batching, admission while the free pages cover a
 * request's conservative prompt demand, preemption by recompute of the newest running request
 * when a decode step could run out of pages, per-request budgets, finish on EOS or a token
 * limit. One mkv_scheduler_step is one engine step: admissions (each a prefill), then one
 * batched decode step of every running request.
 *
 * Preemption by recompute: a preempted request releases its slot and returns to the front of
 * the waiting queue; when admitted again, its prompt and the tokens it had generated are
 * prefilled as one prompt. In fp16 mode this reproduces the request's state exactly (prefill
 * attention equals decode attention bit for bit), so greedy outputs do not change; in mixkv
 * mode the recomputed tokens are classified by the prompt-phase policy instead of having gone
 * through Algorithm 1 one by one, so the cache, and possibly the output, differ (docs/model.md).
 *
 * Tensor parallelism: the scheduler can drive several caches (one per GPU, each holding its
 * share of the KV heads, with its own pool and page tables) that share every decision. A
 * request is admitted only when it fits every cache, is preempted when any cache runs short,
 * and is admitted and released on all of them together, so its slot is the same everywhere.
 */
#ifndef MKV_ENGINE_SCHEDULER_H
#define MKV_ENGINE_SCHEDULER_H

#include "engine/sampling.h"
#include "mixkv.h"

#include <stdint.h>

typedef enum mkv_req_state {
    MKV_REQ_WAITING = 0,
    MKV_REQ_RUNNING,
    MKV_REQ_FINISHED,
    MKV_REQ_FAILED, /* can never fit one of the caches (message in the scheduler's error) */
} mkv_req_state_t;

typedef struct mkv_request {
    /* Set by the caller before mkv_scheduler_add. */
    int32_t id;
    const int32_t *prompt; /* [prompt_len], borrowed until the request finishes */
    int32_t prompt_len;
    int32_t max_new_tokens;
    int32_t budget;        /* tokens kept per head-region, 0: none */
    int32_t stop_at_eos;   /* finish when EOS is sampled (it is kept in out) */
    mkv_sampler_t sampler;
    /* Maintained by the scheduler. */
    int32_t *out;          /* [max_new_tokens] generated tokens */
    int32_t n_out;
    mkv_req_state_t state;
    int32_t slot;          /* while running */
    int32_t preemptions;
    int64_t admitted_at;   /* admission counter: the newest running request is preempted */
    mkv_slot_info_t kv;    /* the request's cache use just before it finished: tokens and
                              pages summed over the caches, seq_len and active of cache 0 */
} mkv_request_t;

typedef struct mkv_sched_stats {
    int64_t step;
    int32_t running, waiting, finished;
    int32_t admitted, preempted; /* in this step */
    int32_t decoded;             /* tokens decoded in this step (one per running request) */
    int64_t free_pages, available_pages;        /* summed over the caches */
    int64_t tokens_hi, tokens_lo, tokens_pruned; /* summed over the caches */
} mkv_sched_stats_t;

/* Called for every generated token, in order per request. */
typedef void (*mkv_token_fn)(void *ctx, const mkv_request_t *req, int32_t token);

typedef struct mkv_scheduler mkv_scheduler_t;

/* The most caches one scheduler drives. */
#define MKV_SCHEDULER_MAX_CACHES 64

/* fwd: the forward pass (copied; its ctx must outlive the scheduler), whose max_tokens covers
 * the cache's max_seq_len (a preempted request comes back as one prompt) and max_batch.
 * eos: the model's EOS id (-1: none). max_batch: most requests running at once (<= the
 * cache's slots). The cache is borrowed and must outlive the scheduler. Messages go to
 * mkv_last_error(). */
mkv_status_t mkv_scheduler_create(const mkv_forward_t *fwd, mkv_cache_t *cache, int32_t eos,
                                  int32_t max_batch, mkv_scheduler_t **out);

/* n_caches caches that share every decision (tensor parallelism: one per GPU, each for its
 * share of the KV heads): mkv_scheduler_create is this with one cache. 1 <= n_caches <=
 * MKV_SCHEDULER_MAX_CACHES distinct caches (the array is copied; the caches are borrowed) that
 * agree on max_seqs, max_seq_len and n_layers (n_kv_heads may differ), else
 * INVALID_ARGUMENT naming the field and the cache, nothing allocated.
 *  - Admission: the request's prompt demand plus a margin (the next decode step of everything
 *    running and pending, itself included) must fit every cache's available pages; a request
 *    that could never fit one of the caches is FAILED. It is admitted on every cache in order,
 *    and gets the same slot on each (the caches see the same admissions and releases; a
 *    mismatch is INTERNAL, with whatever was admitted released), with its budget on each.
 *  - Preemption: while any cache's next decode step could run out of pages.
 *  - Finish and preemption release the slot on every cache.
 *  - The forward pass's calls receive caches[0]: a tensor-parallel pass holds every rank's
 *    cache itself (it runs each rank's layers on its cache) and is handed the first one, with
 *    the slots, which are the same on every cache.
 *  - Errors of cache k carry that cache's mkv_cache_last_error(). */
mkv_status_t mkv_scheduler_create_multi(const mkv_forward_t *fwd, mkv_cache_t *const *caches,
                                        int32_t n_caches, int32_t eos, int32_t max_batch,
                                        mkv_scheduler_t **out);
void mkv_scheduler_free(mkv_scheduler_t *s);

/* The caches the scheduler drives: how many, and the i-th (NULL out of range). */
int32_t mkv_scheduler_n_caches(const mkv_scheduler_t *s);
mkv_cache_t *mkv_scheduler_cache(const mkv_scheduler_t *s, int32_t i);

void mkv_scheduler_on_token(mkv_scheduler_t *s, mkv_token_fn fn, void *ctx);

/* Called when a request finishes, before its slot is released: the cache still holds the
 * request's tokens (for a dump, say). cache is the first cache; a hook reaches the others
 * with mkv_scheduler_cache. A status other than OK stops the step with it; the hook reports
 * its message into mkv_last_error(). */
typedef mkv_status_t (*mkv_finish_fn)(void *ctx, const mkv_request_t *req, mkv_cache_t *cache);
void mkv_scheduler_on_finish(mkv_scheduler_t *s, mkv_finish_fn fn, void *ctx);

/* Queues a request (FCFS). INVALID_ARGUMENT when its prompt plus max_new_tokens exceeds the
 * cache's max_seq_len or the model's positions, or a field is out of range. */
mkv_status_t mkv_scheduler_add(mkv_scheduler_t *s, mkv_request_t *req);

/* One engine step. stats may be NULL. A request that cannot fit even into an empty cache is
 * marked MKV_REQ_FAILED (the step goes on, and returns OUT_OF_PAGES with its message); other
 * errors stop and return their status. */
mkv_status_t mkv_scheduler_step(mkv_scheduler_t *s, mkv_sched_stats_t *stats);

/* 1 when no request is waiting or running. */
int mkv_scheduler_idle(const mkv_scheduler_t *s);

#endif /* MKV_ENGINE_SCHEDULER_H */
