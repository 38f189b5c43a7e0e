/*
 * forward_tp.h — tensor parallelism: the CUDA forward pass over n GPUs of one host, one mixkv
 * cache per GPU.
 *
 * Rank r runs on CUDA device r with its share of the model (runner/forward_cuda.h,
 * mkv_cuda_shard_t: H/n query heads, Hkv/n KV heads, I/n FFN columns) and its own cache, made
 * for its Hkv/n KV heads (its own pool, free list and page tables; the policy's decisions stay
 * per head-region). After each layer's output and down projections, NCCL sums the ranks'
 * residual streams (fp32, in place).
 *
 * One process drives every GPU, with one host thread per rank (the caller is rank 0): each
 * rank's launches, cuBLAS calls and cache calls (some of which wait for their device) run
 * concurrently instead of one after another, and the communicators come from one
 * ncclCommInitAll, with no rendezvous to set up (docs/decisions.md, 55).
 *
 * NCCL is loaded when the first group of more than one rank is made (dlopen of libnccl.so.2,
 * or the file MIXKV_NCCL_LIBRARY names), so the library and the tools need no NCCL to build
 * or to run on one GPU.
 */
#ifndef MKV_RUNNER_FORWARD_TP_H
#define MKV_RUNNER_FORWARD_TP_H

#include "mixkv.h"
#include "runner/forward_cuda.h"
#include "runner/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mkv_tp mkv_tp_t;

/* Most ranks a group takes. */
#define MKV_TP_MAX_RANKS 16

/* n_ranks ranks on devices 0 .. n_ranks - 1, each with its share of model m (real weights), or,
 * with m NULL, of stand-in weights of shape dummy (seed as mkv_cuda_forward_create_dummy; the
 * same numbers as one GPU's). Errors: INVALID_ARGUMENT (n_ranks out of [1, MKV_TP_MAX_RANKS],
 * or not dividing the heads, the KV heads and the FFN width), UNSUPPORTED (fewer devices than
 * ranks, no NCCL, a build without CUDA), OUT_OF_MEMORY, CUDA_ERROR; the reason in err. */
mkv_status_t mkv_tp_create(const mkv_model_t *m, const mkv_model_config_t *dummy, uint64_t seed, int32_t n_ranks,
                           int32_t max_tokens, mkv_dtype_t dtype, mkv_tp_t **out, char *err);
void mkv_tp_free(mkv_tp_t *tp);

int32_t mkv_tp_ranks(const mkv_tp_t *tp);

/* Rank r's pass (its device's weights, its phases); NULL out of range. */
mkv_cuda_forward_t *mkv_tp_rank(mkv_tp_t *tp, int32_t r);

/* The group as one forward pass over caches [n_ranks], cache r on device r with the model's
 * geometry except Hkv/n KV heads. Every call runs rank r's pass on cache r; the cache a call
 * is handed must be caches[0] (the scheduler over several caches passes its first,
 * engine/scheduler.h), and only rank 0 writes logits and tokens. Before a decode step, every
 * cache's free pages are checked against its step demand, so a refusal (OUT_OF_PAGES) changes
 * no rank. A rank that fails midway stops the others at their next all-reduce (the call
 * returns its status and message, "rank r: ..."); the ranks' caches are then out of step with
 * each other: release the call's slots. The caches stay the
 * caller's and must outlive the pass. INVALID_ARGUMENT for a cache on another device or of
 * another geometry. */
mkv_status_t mkv_tp_forward(mkv_tp_t *tp, mkv_cache_t *const *caches, mkv_forward_t *out);

/* Every rank's phases (mkv_cuda_forward_set_timing / _phases over the ranks). */
mkv_status_t mkv_tp_set_timing(mkv_tp_t *tp, int on);

#ifdef __cplusplus
}
#endif

#endif /* MKV_RUNNER_FORWARD_TP_H */
