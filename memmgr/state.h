/*
 * state.h — the memory manager's state, as plain arrays (DESIGN.md section 4).
 *
 * The CPU backend works on this struct directly; the CUDA backend (cuda_mm.h) keeps the same
 * arrays in device memory and copies them into this struct for validation and dumps. Nothing
 * here knows about models or token data: only pages, rows and counts.
 *
 * Page table rows: a head-region r = (slot * L + layer) * H + head owns row r of T int32
 * entries. High-precision page ids fill it from the left (entry k is the k-th high page),
 * low-precision page ids from the right (the k-th low page sits at entry T - 1 - k). Unused
 * entries hold -1. The row of a finished sequence's head-regions are contiguous (slot-major).
 *
 * Free page list: ring[P] of page ids with 64-bit counters; the free pages are
 * ring[head % P], ..., ring[(tail - 1) % P], so free = tail - head. Entries outside that
 * region are stale and never read.
 */
#ifndef MKV_MEMMGR_STATE_H
#define MKV_MEMMGR_STATE_H

#include "mixkv.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mkv_mm_geom {
    int32_t n_layers;    /* L */
    int32_t n_kv_heads;  /* H */
    int32_t max_seqs;    /* S */
    int32_t row_entries; /* T = ceil(max_seq_len / min(tpp_hi, tpp_lo)) + 1 */
    int32_t tpp_hi;      /* tokens per page, high-precision format */
    int32_t tpp_lo;      /* tokens per page, low-precision format */
    int32_t max_seq_len;
    int32_t window;      /* W, used only by the step demand */
    int64_t pool_pages;  /* P <= INT32_MAX */
} mkv_mm_geom_t;

typedef struct mkv_mm_state {
    mkv_mm_geom_t g;
    int32_t *ring;     /* [P] page ids; the free region is [head, tail) modulo P */
    int64_t head;      /* next ring position to allocate from; only grows */
    int64_t tail;      /* next ring position to recycle into; only grows; tail - head <= P */
    int32_t *table;    /* [S][L][H][T] page ids, -1 where unused */
    int32_t *n_hi;     /* [S][L][H] tokens in the high-precision section */
    int32_t *n_lo;     /* [S][L][H] tokens in the low-precision section */
    int32_t *seq_len;  /* [S] N; 0 for a free slot */
    uint8_t *active;   /* [S] 1 when the slot holds a sequence */
    int64_t *reserved; /* [S] pages reserved for an admitted prompt not yet placed */
    int64_t reserved_total;
} mkv_mm_state_t;

static inline int64_t mkv_mm_regions(const mkv_mm_geom_t *g)
{
    return (int64_t)g->max_seqs * g->n_layers * g->n_kv_heads;
}

static inline int64_t mkv_mm_region(const mkv_mm_geom_t *g, int32_t slot, int32_t layer,
                                    int32_t head)
{
    return ((int64_t)slot * g->n_layers + layer) * g->n_kv_heads + head;
}

/* NOTE: int64 before the multiply: S * L * H * T overflows int32 for large caches. */
static inline int32_t *mkv_mm_row(const mkv_mm_state_t *st, int64_t region)
{
    return st->table + region * st->g.row_entries;
}

static inline int32_t mkv_mm_pages_for(int32_t tokens, int32_t tpp)
{
    return (int32_t)(((int64_t)tokens + tpp - 1) / tpp);
}

static inline int64_t mkv_mm_free_pages(const mkv_mm_state_t *st) { return st->tail - st->head; }

static inline int32_t mkv_mm_ring_at(const mkv_mm_state_t *st, int64_t pos)
{
    return st->ring[pos % st->g.pool_pages];
}

/* Allocates the arrays for geometry g and fills the initial state: every page free in id
 * order (ring[i] = i, head 0, tail P), every row empty (-1), every slot free. */
mkv_status_t mkv_mm_state_init(mkv_mm_state_t *st, const mkv_mm_geom_t *g, char *err);
void mkv_mm_state_free(mkv_mm_state_t *st);

/* ---------------------------------------------------------------------------------------- */
/* Invariant checking, shared by mkv_cache_validate (live state) and `mixkv inspect` (dumps) */
/* ---------------------------------------------------------------------------------------- */

/* One head-region as the checker sees it: page lists with explicit lengths, so that a dump
 * whose lists disagree with its counts can be described. */
typedef struct mkv_row_view {
    int32_t slot, layer, head;
    int32_t n_hi, n_lo;  /* token counts */
    int32_t k_hi, k_lo;  /* page ids listed */
    const int32_t *hi;   /* [k_hi] high pages in section order */
    const int32_t *lo;   /* [k_lo] low pages in section order (first low page first) */
} mkv_row_view_t;

typedef struct mkv_slot_view {
    int32_t slot;
    int32_t seq_len;
    int64_t reserved;
} mkv_slot_view_t;

typedef struct mkv_state_view {
    mkv_mm_geom_t g;
    int64_t head, tail;
    const int32_t *free_ids;     /* [tail - head] the free region in ring order (from head) */
    int64_t n_free_ids;          /* length of free_ids (a dump may disagree with tail - head) */
    const mkv_slot_view_t *slots;/* active slots */
    int32_t n_slots;
    int64_t reserved_total;
    const mkv_row_view_t *rows;  /* non-empty rows (or all rows of active slots) */
    int64_t n_rows;
} mkv_state_view_t;

/* Kinds of violation, stable names in --json output (see mkv_violation_kind_name). */
typedef enum mkv_violation_kind {
    MKV_VIOL_COUNTERS = 0,    /* head/tail out of order, free count out of [0, P] */
    MKV_VIOL_FREE_LIST,       /* the listed free region disagrees with tail - head */
    MKV_VIOL_PAGE_RANGE,      /* a page id outside [0, P) */
    MKV_VIOL_PAGE_DUPLICATE,  /* a page id in two places */
    MKV_VIOL_PAGE_MISSING,    /* a page id in no place (leaked) */
    MKV_VIOL_ROW_COUNT,       /* a row's page list length disagrees with its token count */
    MKV_VIOL_ROW_OVERFLOW,    /* high plus low pages exceed the row's T entries */
    MKV_VIOL_ROW_LOCATION,    /* slot, layer or head out of range, a row of a free slot,
                                 or the same head-region listed twice */
    MKV_VIOL_TOKENS,          /* negative counts, n_hi + n_lo > N, N > max_seq_len */
    MKV_VIOL_RESERVATION,     /* reservations negative, not summing, or above free pages */
    MKV_VIOL_STALE_ENTRY,     /* live state only: an unused table entry is not -1 */
    MKV_VIOL_KIND_COUNT
} mkv_violation_kind_t;

const char *mkv_violation_kind_name(mkv_violation_kind_t kind);

typedef struct mkv_violation {
    mkv_violation_kind_t kind;
    int32_t page;                 /* the page concerned, or -1 */
    int32_t slot, layer, head;    /* the row concerned, or -1 */
    int32_t other_slot, other_layer, other_head; /* for duplicates: the other row, or -1
                                                    (other_slot == -2: the free list) */
    char message[256];            /* a full sentence naming page, rows and ring positions */
} mkv_violation_t;

typedef void (*mkv_violation_fn)(void *ctx, const mkv_violation_t *v);

/* Checks every invariant and calls report (may be NULL) for each violation, in a
 * deterministic order. Returns the number of violations; -1 if memory ran out. */
int64_t mkv_state_check(const mkv_state_view_t *view, mkv_violation_fn report, void *ctx);

/* Builds a view of a live state (rows of active slots, non-empty or not). The view points
 * into `scratch` buffers owned by the caller; free with mkv_state_view_release. */
typedef struct mkv_state_view_buf {
    mkv_state_view_t view;
    int32_t *free_ids;
    mkv_slot_view_t *slots;
    mkv_row_view_t *rows;
    int32_t *lo_ids;
} mkv_state_view_buf_t;

mkv_status_t mkv_state_view_build(const mkv_mm_state_t *st, int only_nonempty,
                                  mkv_state_view_buf_t *buf);
void mkv_state_view_release(mkv_state_view_buf_t *buf);

/* Live-state check: mkv_state_check on the view plus the unused-entry (-1) check. */
int64_t mkv_mm_state_check(const mkv_mm_state_t *st, mkv_violation_fn report, void *ctx);

/* A violation callback that keeps the first message and counts the rest. */
typedef struct mkv_first_violation {
    char message[256];
    int64_t count;
} mkv_first_violation_t;

void mkv_keep_first_violation(void *first, const mkv_violation_t *v);

#ifdef __cplusplus
}
#endif

#endif /* MKV_MEMMGR_STATE_H */
