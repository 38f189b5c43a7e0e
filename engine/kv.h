/*
 * kv.h — the KV backend layer between the public token-data calls (include/mixkv.h:
 * prefill, commit, decode, compress) and their implementations. engine/kv_api.c checks every
 * argument and the step order once, then dispatches through the cache's backend table: the
 * CPU implementation (engine/kv_backend.c) and the CUDA one (engine/kv_cuda.cu) sit side by
 * side behind the same mkv_kv_ops_t, and neither re-checks what the API layer checked.
 *
 * The step bookkeeping both backends share (which layers of a prompt were prefilled, which
 * layers of a step were decoded, whether a slot was compressed at its length) lives here,
 * with the layer, not in the memory manager's handle.
 */
#ifndef MKV_ENGINE_KV_H
#define MKV_ENGINE_KV_H

#include "memmgr/cache.h"
#include "quant/format.h"
#include "mixkv.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mkv_kv mkv_kv_t;

/* One backend's implementation of the token-data calls. Arguments arrive checked: slots
 * valid, active and distinct; layers in range; tensors non-null; the step order respected.
 * Tensors: q [rows][H * G][d], k and v [rows][H][d], out [rows][H * G][d] in `dtype`, with
 * rows the slots' prompt lengths one after another (prefill) or one row per slot (decode).
 * The CPU backend runs its attention on the cache's parallel function (par_run). */
typedef struct mkv_kv_ops {
    const char *name;
    mkv_status_t (*create)(mkv_cache_t *c, mkv_kv_t *kv);
    void (*destroy)(mkv_kv_t *kv);
    mkv_status_t (*prefill)(mkv_cache_t *c, mkv_kv_t *kv, int32_t n_slots, const int32_t *slots,
                            int32_t layer, mkv_dtype_t dtype, const void *q, const void *k,
                            const void *v, void *out, void *stream);
    mkv_status_t (*commit)(mkv_cache_t *c, mkv_kv_t *kv, int32_t n_slots, const int32_t *slots,
                           void *stream);
    mkv_status_t (*decode)(mkv_cache_t *c, mkv_kv_t *kv, int32_t n_slots, const int32_t *slots,
                           int32_t layer, mkv_dtype_t dtype, const void *q, const void *k,
                           const void *v, void *out, void *stream);
    mkv_status_t (*compress)(mkv_cache_t *c, mkv_kv_t *kv, int32_t n_slots, const int32_t *slots,
                             void *stream);
    /* The step bookkeeping (decoded, compressed) from the device, where it is authoritative
     * (asynchronous steps, graph replays); NULL for backends that keep it on the host. */
    void (*refresh)(mkv_cache_t *c, mkv_kv_t *kv);
} mkv_kv_ops_t;

struct mkv_kv {
    const mkv_kv_ops_t *ops;
    int32_t max_seqs, n_layers;
    mkv_page_layout_t lay_hi, lay_lo;
    uint32_t *prefill_epoch; /* [S] the occupant whose prefilled[] flags these are */
    uint8_t *prefilled;      /* [S][L] layers prefilled for that occupant */
    int32_t *decoded;        /* [S][L] N at which the layer last received its new token */
    int32_t *compressed;     /* [S] N at which the slot was last compressed */
    int32_t *budget;         /* [S] tokens kept per head-region (0: no cap) ... */
    uint32_t *budget_epoch;  /* [S] ... for this occupant (a new one starts without a cap) */
    void *impl;              /* the backend's own state */
};

/* Slot s's budget for its current occupant (mkv_cache_set_budget), 0 when none. */
static inline int32_t mkv_kv_budget(const mkv_cache_t *c, const mkv_kv_t *kv, int32_t s)
{
    return kv->budget_epoch[s] == c->epoch[s] ? kv->budget[s] : 0;
}

extern const mkv_kv_ops_t mkv_kv_cpu_ops;
#ifdef MKV_HAVE_CUDA
extern const mkv_kv_ops_t mkv_kv_cuda_ops;
#endif

#ifdef __cplusplus
}
#endif

#endif /* MKV_ENGINE_KV_H */
