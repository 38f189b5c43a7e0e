/*
 * cuda_mm.h — the CUDA backend of the memory manager (DESIGN.md section 4): the ring,
 * its head / tail counters, the page tables and the counts live in device memory, and every
 * batched call runs memmgr/resize.c's four phases as kernels (plan, CUB exclusive sums, a
 * one-thread fit check that writes a device status, recycle, allocate, finalize). Nothing moves
 * when the check fails. The host keeps the per-slot bookkeeping (active, N, reservations) and
 * a mirror of head / tail, refreshed by one asynchronous copy per call; each call ends with one
 * stream synchronisation so that it can return its status.
 *
 * Page ids, row layout and the order in which pages move are the CPU reference's exactly, so
 * both backends reach identical states (and dumps) for the same calls.
 */
#ifndef MKV_MEMMGR_CUDA_MM_H
#define MKV_MEMMGR_CUDA_MM_H

#include "memmgr/state.h"
#include "mixkv.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mkv_cuda_mm mkv_cuda_mm_t;

enum { MKV_CUDA_OP_RESIZE = 0, MKV_CUDA_OP_APPEND = 1, MKV_CUDA_OP_RELEASE = 2 };

/* Slots an asynchronous call may list: they travel as kernel parameters (no copy from host
 * memory, so a CUDA graph can capture the call). Larger calls are synchronous. */
#define MKV_CUDA_MM_INLINE 512

/* A status no call returns: the fit check of a call that found an earlier asynchronous
 * failure pending, and changed nothing. */
#define MKV_CUDA_SKIPPED 1000

/* The first refusal of an asynchronous call, kept on the device (sticky: every later gated
 * kernel changes nothing) until mkv_cuda_mm_collect reads and clears it. code 0: none. */
typedef struct mkv_cuda_fail {
    int32_t code;     /* MKV_STATUS_* (OUT_OF_PAGES, INVALID_ARGUMENT, INTERNAL) */
    int32_t call_id;  /* the caller's number for the call */
    int32_t kind;     /* MKV_CUDA_OP_* of a memory-manager call; -1 for another kernel's */
    int32_t bad_hi, bad_lo;
    int32_t pad;
    long long bad_region;
    long long total_alloc, total_release, free_pages, others_reserved;
} mkv_cuda_fail_t;

typedef struct mkv_cuda_op {
    int kind;
    int32_t n_slots;
    const int32_t *slots;   /* host [n_slots], validated by the caller */
    const int32_t *new_len; /* host [n_slots]: each slot's N after the call (resize only) */
    const int32_t *tgt_hi;  /* device [n_slots][L][H] (resize only) */
    const int32_t *tgt_lo;
    const int32_t *cur_len; /* host [n_slots]: each slot's N now (resize without new_len) */
    int64_t others_reserved;/* pages reserved by slots outside the call */
    int dry_run;            /* stop after the fit check */
    int async;              /* no synchronisation: a refusal becomes the sticky failure (only
                               when n_slots <= MKV_CUDA_MM_INLINE; op->deferred tells) */
    int32_t call_id;
    /* Enqueued after the fit check and before any page moves (NULL: none): the caller's
     * kernels that must see the pages before the call, gated on the check's outcome. */
    mkv_status_t (*between)(void *ctx, void *stream, char *err);
    void *between_ctx;
    /* Results. */
    int64_t head, tail;     /* counters after the call */
    int64_t total_alloc, total_release;
    int64_t bad_region;     /* INVALID_ARGUMENT: the first head-region with bad targets */
    int32_t bad_hi, bad_lo; /* its targets */
    int deferred;           /* 1: asynchronous, outcome not known yet (results unset) */
} mkv_cuda_op_t;

/* Allocates device state for geometry g on `device`, the pool (pool_bytes, 0 for none) and the
 * workspace for the largest call (every slot), then writes the initial state: every page free
 * in id order, every row -1, every count 0. */
mkv_status_t mkv_cuda_mm_create(const mkv_mm_geom_t *g, int32_t device, int64_t pool_bytes,
                                mkv_cuda_mm_t **out, char *err);
void mkv_cuda_mm_destroy(mkv_cuda_mm_t *mm);

/* The device page pool (NULL without one). */
uint8_t *mkv_cuda_mm_pool(mkv_cuda_mm_t *mm);

/* The device arrays the KV backend's kernels read and write (engine/kv_cuda.cu): page-table
 * rows [S][L][H][T] and section counts [S][L][H], and the device ordinal. */
typedef struct mkv_cuda_mm_view {
    int32_t *table;
    int32_t *n_hi, *n_lo;
    uint8_t *pool;
    int32_t device;
    int32_t *len;          /* [S] N, device-authoritative */
    const int32_t *fail;   /* the sticky failure's code: gated kernels do nothing when != 0 */
    mkv_cuda_fail_t *fail_rec, *fail_host; /* where a kernel records a failure (device, mapped) */
    const int32_t *check_code; /* the last fit check's outcome (0: the call goes ahead) */
    int64_t empty_region;  /* R: a region index whose counts are always 0 */
} mkv_cuda_mm_view_t;
void mkv_cuda_mm_get_view(mkv_cuda_mm_t *mm, mkv_cuda_mm_view_t *out);

/* One batched call. OK, OUT_OF_PAGES (nothing written; totals filled), INVALID_ARGUMENT
 * (targets out of range; bad_* filled; nothing written) or CUDA_ERROR. */
mkv_status_t mkv_cuda_mm_apply(mkv_cuda_mm_t *mm, mkv_cuda_op_t *op, void *stream, char *err);

/* Waits for the device, then reads the sticky failure (cleared; fail->code 0: none) and the
 * device-authoritative per-slot state: N [S], reservations [S], and the counters. */
mkv_status_t mkv_cuda_mm_collect(mkv_cuda_mm_t *mm, mkv_cuda_fail_t *fail, int32_t *len,
                                 int64_t *reserved, int64_t counters[2], char *err);

/* Sets one slot's device state (admission). Synchronous. */
mkv_status_t mkv_cuda_mm_set_slot(mkv_cuda_mm_t *mm, int32_t slot, int32_t len, int64_t reserved,
                                  char *err);

/* Copies ring, table, counts and counters into the host state's arrays (synchronous). */
mkv_status_t mkv_cuda_mm_download(mkv_cuda_mm_t *mm, mkv_mm_state_t *st, char *err);

/* Sums over every head-region (inactive ones hold nothing): tokens_hi, tokens_lo, pages_hi,
 * pages_lo; with slot >= 0 over that slot's head-regions only. */
mkv_status_t mkv_cuda_mm_sums(mkv_cuda_mm_t *mm, int32_t slot, int64_t out[4], char *err);

/* Worst-case pages of the next decode step of these slots (lo_can_grow[j]: N >= W). */
mkv_status_t mkv_cuda_mm_step_demand(mkv_cuda_mm_t *mm, int32_t n_slots, const int32_t *slots,
                                     const uint8_t *lo_can_grow, int64_t *out, char *err);

/* The invariants, checked by a kernel: every page in exactly one place, rows consistent with
 * their counts and their slot's N, unused entries -1. *violations counts what it found. */
mkv_status_t mkv_cuda_mm_validate(mkv_cuda_mm_t *mm, const uint8_t *active, const int32_t *seq_len,
                                  int64_t *violations, char *err);

#ifdef __cplusplus
}
#endif

#endif /* MKV_MEMMGR_CUDA_MM_H */
