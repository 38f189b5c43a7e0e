/*
 * cache.h — the inside of an mkv_cache_t handle, shared by the memory manager's files
 * (cache.c, resize.c, dump.c). Not part of the public API.
 */
#ifndef MKV_MEMMGR_CACHE_H
#define MKV_MEMMGR_CACHE_H

#include "common/error.h"
#include "memmgr/state.h"
#include "memmgr/threads.h"
#include "mixkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-step workspace, sized once at create so that no step allocates memory. Indexed by
 * section: 2 * region + 0 for the high section, 2 * region + 1 for the low section, over the
 * head-regions of the slots named in one call, in call order. */
typedef struct mkv_mm_work {
    int32_t *target;    /* [2 * S * L * H] new token count per section */
    int32_t *alloc;     /* [2 * S * L * H] pages a section gains */
    int32_t *release;   /* [2 * S * L * H] pages a section gives back */
    int32_t *alloc_off; /* [2 * S * L * H] exclusive prefix sum of alloc within its chunk */
    int32_t *rel_off;   /* [2 * S * L * H] exclusive prefix sum of release within its chunk */
    int32_t *slot_seen; /* [S] call stamp, to refuse duplicate slots */
    int32_t *new_len;   /* [S] a resize's new N per listed slot */
    uint8_t *flags;     /* [S] per listed slot (CUDA step demand: N >= W) */
    int32_t stamp;
    /* Per chunk of head-regions (one chunk per thread): totals, bases, first bad region. */
    int32_t n_chunks;
    int64_t *chunk_alloc;  /* [n_chunks] pages the chunk's sections gain, then its base */
    int64_t *chunk_rel;    /* [n_chunks] pages the chunk's sections give back, then its base */
    int64_t *chunk_bad;    /* [n_chunks] first head-region with invalid targets, or -1 */
} mkv_mm_work_t;

struct mkv_mm_op; /* one batched page movement (resize.c) */

/* The memory manager's backends side by side (memmgr/backend.c): every public call checks its
 * arguments once, then dispatches through the cache's table. */
typedef struct mkv_mm_backend {
    const char *name;
    /* resize.c's phases over the call's head-regions (check, then act) */
    mkv_status_t (*apply)(struct mkv_mm_op *op, int dry_run, void *stream);
    /* tokens_hi, tokens_lo, pages_hi, pages_lo of one slot (slot >= 0) or of every region */
    mkv_status_t (*sums)(const mkv_cache_t *c, int32_t slot, int64_t out[4], char *err);
    /* mkv_cache_step_demand's count, arguments checked */
    mkv_status_t (*step_demand)(mkv_cache_t *c, int32_t n_slots, const int32_t *slots, int64_t *out);
    /* a new occupant of slot: N 0 and its reservation, where the backend keeps them */
    mkv_status_t (*admitted)(mkv_cache_t *c, int32_t slot, int64_t reserved);
    /* the whole state into c->st (dumps, validation); *violations: what the backend's own
     * check found there (NULL: skip it) */
    mkv_status_t (*mirror)(mkv_cache_t *c, int64_t *violations);
    /* waits for asynchronous work and refreshes c->st's per-slot state (NULL: nothing) */
    mkv_status_t (*collect)(mkv_cache_t *c);
} mkv_mm_backend_t;

extern const mkv_mm_backend_t mkv_mm_cpu_backend;
#ifdef MKV_HAVE_CUDA
extern const mkv_mm_backend_t mkv_mm_cuda_backend;
#endif

/* resize.c's appliers, for the tables */
mkv_status_t mkv_mm_apply_cpu(struct mkv_mm_op *op, int dry_run, void *stream);
mkv_status_t mkv_mm_apply_cuda(struct mkv_mm_op *op, int dry_run, void *stream);

struct mkv_cache {
    mkv_cache_config_t cfg; /* resolved: page_bytes and pool_pages filled in */
    const mkv_mm_backend_t *mm; /* the memory manager's backend, chosen at create */
    mkv_cache_info_t info;
    mkv_mm_state_t st;
    uint8_t *pool;          /* [P * page_bytes] host page storage (CPU backend); NULL with
                               METADATA_ONLY and for the CUDA backend */
    struct mkv_cuda_mm *dev;/* the CUDA backend's device state (memmgr/cuda_mm.h), or NULL;
                               st then mirrors the device state (per-slot arrays authoritative
                               on the host, head / tail refreshed by every call, the rest by
                               mkv_cuda_mm_download) */
    mkv_mm_work_t work;
    mkv_threads_t *threads; /* NULL when n_threads <= 1 */
    /* Per slot, set at admission, for the KV backend (engine/kv_backend.c). */
    int32_t *prompt_len;    /* [S] the admitted prompt length */
    uint32_t *epoch;        /* [S] bumped at every admission: tells a new occupant apart */
    /* Token data state of the KV backend, created on first use, freed with the cache. */
    struct mkv_kv *kv;
    void (*kv_free)(struct mkv_kv *kv);
    int64_t parallel_min_regions; /* calls with fewer head-regions run inline (tests lower it) */
    mkv_parallel_fn par_run;      /* the engine's threads for the CPU backend's attention */
    void *par_runner;             /* (mkv_cache_set_parallel); NULL: the calling thread */
    int32_t par_parts;
    /* CUDA backend, asynchronous steps (MKV_CACHE_ASYNC_STEPS): append, decode and compress
     * enqueue work and return; a refusal on the device stays there until collected
     * (mkv_cache_collect), which also refreshes the host's mirror of the per-slot state. */
    int async;                /* the flag was set */
    int pending;              /* asynchronous work since the last collection */
    int32_t call_id;          /* numbers the asynchronous calls */
    mkv_status_t deferred;    /* a collected refusal not yet reported */
    char deferred_msg[MKV_ERR_LEN];
    void (*kv_refresh)(mkv_cache_t *c); /* the KV layer's per-slot state from the device */
    int32_t capture_horizon;  /* mkv_cache_set_capture_horizon; 0: plan captures for max_seq_len */
    double kept_fraction;     /* (tokens_hi + tokens_lo) / tokens_seen at the last mkv_cache_stats
                                 (1 before any): a KV backend's estimate of a region's stored
                                 tokens from its sequence's length (the decode plan's hint) */
    char err[MKV_ERR_LEN];
};

/* Waits for the cache's asynchronous work (CUDA backend; a no-op otherwise), refreshes the
 * host mirror from the device and moves a device-side refusal into cache->deferred. */
mkv_status_t mkv_cache_collect(mkv_cache_t *c);

/* mkv_cache_collect, then reports (and clears) a deferred refusal into c->err: what every
 * synchronous call with a mutable handle does first. */
mkv_status_t mkv_cache_settle(mkv_cache_t *c);

/* The asynchronous resize of the CUDA KV backend's compress (N unchanged, device targets):
 * fit check, then between(ctx) (kernels gated on the check), then the page movement. With
 * c->async the outcome is collected later; otherwise collected before returning. */
mkv_status_t mkv_cache_resize_device(mkv_cache_t *c, int32_t n_slots, const int32_t *slots,
                                     const int32_t *tgt_hi, const int32_t *tgt_lo,
                                     mkv_status_t (*between)(void *ctx, void *stream, char *err),
                                     void *ctx, void *stream);

/* Below this many head-regions a call runs on the calling thread alone (bench_memmgr: at 256
 * regions waking 4 to 16 workers costs 5 to 20 times the work; at 4096 they win). */
#define MKV_PARALLEL_MIN_REGIONS 2048

/* Checks a list of slots: n_slots in [0, S], each in range, active, listed once (message in
 * c->err). */
mkv_status_t mkv_cache_check_slots(mkv_cache_t *c, int32_t n_slots, const int32_t *slots);

/* Validates a config and resolves its defaults into *out (message into err). */
mkv_status_t mkv_config_resolve(const mkv_cache_config_t *in, mkv_cache_config_t *out,
                                mkv_mm_geom_t *geom, char *err);

#ifdef __cplusplus
}
#endif

#endif /* MKV_MEMMGR_CACHE_H */
