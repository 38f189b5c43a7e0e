/*
 * error.h — how errors travel inside mixkv.
 *
 * Every internal function returns mkv_status_t. A failing function records a message with
 * mkv_fail() (into a handle's buffer) or mkv_fail_global() (into the thread's buffer behind
 * mkv_last_error()) and returns the status; callers pass it up with MKV_TRY and clean up at a
 * `fail:` label. The library never exits.
 */
#ifndef MKV_COMMON_ERROR_H
#define MKV_COMMON_ERROR_H

#include "mixkv.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MKV_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MKV_PRINTF(a, b)
#endif

/* Formats a message into buf (MKV_ERR_LEN bytes) and returns status. */
mkv_status_t mkv_fail(char *buf, mkv_status_t status, const char *fmt, ...) MKV_PRINTF(3, 4);

/* Formats a message into this thread's buffer behind mkv_last_error() and returns status. */
mkv_status_t mkv_fail_global(mkv_status_t status, const char *fmt, ...) MKV_PRINTF(2, 3);

/* Clears this thread's message (called on entry of handle-less API calls). */
void mkv_clear_global_error(void);

/* Copies a handle's message into the thread's buffer (when a handle dies with its error). */
void mkv_set_global_error_text(const char *text);

#define MKV_TRY(expr)                                                                           \
    do {                                                                                       \
        mkv_status_t mkv_try_status_ = (expr);                                                 \
        if (mkv_try_status_ != MKV_STATUS_OK) {                                                \
            status = mkv_try_status_;                                                          \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

/* Integer helpers used across modules. */
static inline int64_t mkv_ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t mkv_align_up64(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

#ifdef __cplusplus
}
#endif

#endif /* MKV_COMMON_ERROR_H */
