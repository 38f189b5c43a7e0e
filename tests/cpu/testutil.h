/*
 * testutil.h — shared helpers of the CPU tests: small cache configs, deep snapshots of a cache's
 * memory-manager state (to prove that a refused call changed nothing), and an independent
 * reference model of the memory manager.
 *
 * The model is deliberately simple and written without the library's internals: a FIFO queue of
 * free page ids, per head-region lists of high and low page ids in section order, per-slot N,
 * active flag and reservation. It predicts every page id the library hands out, so tests compare
 * it with cache->st exactly after every operation.
 */
#ifndef MKV_TESTS_CPU_TESTUTIL_H
#define MKV_TESTS_CPU_TESTUTIL_H

#include "runner/model.h"
#include "memmgr/cache.h"
#include "mixkv.h"

#include <stdint.h>

/* ---------------------------------------------------------------------------------------- */
/* Configs and caches                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* A METADATA_ONLY config: L layers, H heads, S slots, K8V4 / K4V2 at d = 128, one group, pages
 * that hold exactly hi_tpp high tokens, pool_pages pages, window 8. */
mkv_cache_config_t tu_config(int32_t L, int32_t H, int32_t S, int32_t max_seq_len, int32_t hi_tpp,
                             int64_t pool_pages);

/* Creates a cache; fails the test (with mkv_last_error) unless it succeeds. */
mkv_cache_t *tu_create(const mkv_cache_config_t *cfg);

mkv_cache_info_t tu_info(const mkv_cache_t *c);
mkv_cache_stats_t tu_stats(const mkv_cache_t *c);

/* Fails the test unless mkv_cache_validate is OK. */
void tu_expect_valid(mkv_cache_t *c, const char *where);

/* ---------------------------------------------------------------------------------------- */
/* Snapshots                                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef struct tu_snap {
    mkv_mm_geom_t g;
    int64_t head, tail, reserved_total;
    int32_t *ring;     /* [P] the whole ring */
    int32_t *free_ids; /* [tail - head] the free region in ring order */
    int64_t n_free;
    int32_t *table;    /* [R * T] */
    int32_t *n_hi, *n_lo; /* [R] */
    int32_t *seq_len;  /* [S] */
    uint8_t *active;   /* [S] */
    int64_t *reserved; /* [S] */
    mkv_cache_stats_t stats;
} tu_snap_t;

void tu_snap_take(const mkv_cache_t *c, tu_snap_t *s);
void tu_snap_free(tu_snap_t *s);

/* Fails the test at the first difference. whole_ring also compares the stale ring entries. */
void tu_snap_expect_equal(const tu_snap_t *a, const tu_snap_t *b, int whole_ring,
                          const char *what);

void tu_stats_expect_equal(const mkv_cache_stats_t *a, const mkv_cache_stats_t *b,
                           const char *what);

/* Runs `call`, expects status `expected`, a non-empty mkv_cache_last_error and an unchanged
 * state (whole ring included). */
#define TU_EXPECT_REFUSED(cache, expected, call)                                                \
    do {                                                                                       \
        tu_snap_t tu_before_, tu_after_;                                                       \
        tu_snap_take((cache), &tu_before_);                                                    \
        mkv_status_t tu_got_ = (call);                                                         \
        cr_assert_eq(tu_got_, (expected), "%s: got '%s', expected '%s' (%s)", #call,           \
                     mkv_status_string(tu_got_), mkv_status_string(expected),                  \
                     mkv_cache_last_error(cache));                                             \
        cr_assert_str_neq(mkv_cache_last_error(cache), "", "%s: no error message", #call);     \
        tu_snap_take((cache), &tu_after_);                                                     \
        tu_snap_expect_equal(&tu_before_, &tu_after_, 1, #call);                               \
        tu_snap_free(&tu_before_);                                                             \
        tu_snap_free(&tu_after_);                                                              \
        tu_expect_valid((cache), #call);                                                       \
    } while (0)

#define TU_OK(call)                                                                            \
    do {                                                                                       \
        mkv_status_t tu_got_ = (call);                                                         \
        cr_assert_eq(tu_got_, MKV_STATUS_OK, "%s: got '%s' (%s)", #call,                       \
                     mkv_status_string(tu_got_), mkv_last_error());                            \
    } while (0)

/* As TU_OK for calls on a handle (the message comes from the handle). */
#define TU_COK(cache, call)                                                                    \
    do {                                                                                       \
        mkv_status_t tu_got_ = (call);                                                         \
        cr_assert_eq(tu_got_, MKV_STATUS_OK, "%s: got '%s' (%s)", #call,                       \
                     mkv_status_string(tu_got_), mkv_cache_last_error(cache));                 \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* Random numbers (splitmix64: reproducible across platforms)                               */
/* ---------------------------------------------------------------------------------------- */

typedef struct tu_rng {
    uint64_t s;
} tu_rng_t;

uint64_t tu_rand(tu_rng_t *r);
/* Uniform in [lo, hi] (inclusive); lo when hi < lo. */
int32_t tu_rand_range(tu_rng_t *r, int32_t lo, int32_t hi);

/* ---------------------------------------------------------------------------------------- */
/* The reference model                                                                      */
/* ---------------------------------------------------------------------------------------- */

typedef struct tu_model {
    int32_t L, H, S, T, tpp_hi, tpp_lo, max_seq_len, W, d;
    int64_t P, page_bytes;
    int64_t head, tail;        /* expected ring counters */
    int32_t *fifo;             /* [P] circular queue of free ids */
    int64_t fifo_first, fifo_len;
    int32_t *hi, *lo;          /* [R][T] page ids in section order */
    int32_t *n_hi, *n_lo;      /* [R] */
    int32_t *N;                /* [S] */
    uint8_t *active;           /* [S] */
    int64_t *res;              /* [S] reservations */
} tu_model_t;

/* A fresh model for the geometry of cache c (which must be freshly created). */
void tu_model_init(tu_model_t *m, const mkv_cache_t *c);
void tu_model_free(tu_model_t *m);

int64_t tu_model_region(const tu_model_t *m, int32_t slot, int32_t layer, int32_t head);
int64_t tu_model_reserved_total(const tu_model_t *m);
int64_t tu_model_prompt_demand(const tu_model_t *m, int32_t prompt_len);

/* Each returns the status the library must return and applies the operation when it is OK.
 * For admit, OUT_OF_SLOTS is returned when no slot is free; *also_short (may be NULL) then says
 * whether the pages would not have covered the demand either (either status is acceptable). */
mkv_status_t tu_model_admit(tu_model_t *m, int32_t prompt_len, int32_t *out_slot, int *also_short);
mkv_status_t tu_model_append(tu_model_t *m, int32_t n, const int32_t *slots);
mkv_status_t tu_model_resize(tu_model_t *m, int32_t n, const int32_t *slots,
                             const int32_t *seq_len, const int32_t *n_hi, const int32_t *n_lo);
mkv_status_t tu_model_release(tu_model_t *m, int32_t slot);
int64_t tu_model_step_demand(const tu_model_t *m, int32_t n, const int32_t *slots);

/* Fails the test unless cache c matches the model exactly: counters, free region in ring order,
 * every row, counts, slots, reservations, stats, slot infos, step demand; and validates. */
void tu_model_expect_matches(const tu_model_t *m, mkv_cache_t *c, const char *where);

/* ---------------------------------------------------------------------------------------- */
/* Random operations                                                                        */
/* ---------------------------------------------------------------------------------------- */

typedef enum tu_op_kind {
    TU_OP_ADMIT,
    TU_OP_APPEND,
    TU_OP_RESIZE,
    TU_OP_RELEASE,
} tu_op_kind_t;

typedef struct tu_op {
    tu_op_kind_t kind;
    const char *label; /* "admit", "append", "grow", "shrink", "mixed", "place", "release",
                          "over", "bad" */
    int32_t prompt_len; /* admit */
    int32_t slot;       /* release */
    int32_t n;          /* append / resize: slots listed */
    int32_t *slots;     /* [S + 1] */
    int32_t *seq_len;   /* [S + 1] */
    int use_seq_len;
    int32_t *n_hi, *n_lo; /* [(S + 1) * L * H] */
} tu_op_t;

void tu_op_init(tu_op_t *op, const tu_model_t *m);
void tu_op_free(tu_op_t *op);

/* Draws a random operation for the model's current state (valid most of the time; "over"
 * tries to demand more pages than there are, "bad" is invalid input). */
void tu_op_random(tu_rng_t *r, const tu_model_t *m, tu_op_t *op);

mkv_status_t tu_op_apply_cache(mkv_cache_t *c, const tu_op_t *op, int32_t *out_slot);
mkv_status_t tu_op_apply_model(tu_model_t *m, const tu_op_t *op, int32_t *out_slot,
                               int *also_short);

/* calloc that asserts success (n may be 0). */
void *tu_xcalloc(size_t n, size_t sz);

/* Loads a model folder, asserting success (the message names the folder and the reason). */
mkv_model_t *tu_model_load(const char *dir);

#endif /* MKV_TESTS_CPU_TESTUTIL_H */
