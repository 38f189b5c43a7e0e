/*
 * kv_backend.h — the KV backend's entry points for the model runner's threads: the same calls
 * as mkv_cache_prefill_layer / mkv_cache_decode_layer (include/mixkv.h), with the attention
 * split over a pool (engine/parallel.h; NULL: the calling thread alone). Results are the same
 * bits for any thread count: prefill runs attention/prefill_ref.c's blocked kernel, decode
 * attends each head-region on one thread.
 */
#ifndef MKV_ENGINE_KV_BACKEND_H
#define MKV_ENGINE_KV_BACKEND_H

#include "engine/parallel.h"
#include "mixkv.h"

mkv_status_t mkv_cache_prefill_layer_pool(mkv_cache_t *cache, int32_t slot, int32_t layer,
                                          const float *q, const float *k, const float *v,
                                          float *out, mkv_pool_t *pool);
mkv_status_t mkv_cache_decode_layer_pool(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                         int32_t layer, const float *q, const float *k,
                                         const float *v, float *out, mkv_pool_t *pool);

#endif /* MKV_ENGINE_KV_BACKEND_H */
