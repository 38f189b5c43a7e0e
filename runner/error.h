/*
 * error.h — how errors travel in the model runner: as in the library (common/error.h), every
 * function returns mkv_status_t; a failing one writes its message into a handle's buffer
 * (runner_fail) or, through the public mkv_report_error, into the thread's buffer behind
 * mkv_last_error(), and cleans up at a `fail:` label (RUNNER_TRY). The runner sees the library
 * only through mixkv.h.
 */
#ifndef MKV_RUNNER_ERROR_H
#define MKV_RUNNER_ERROR_H

#include "mixkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Formats a message into buf (MKV_ERR_LEN bytes; NULL: dropped) and returns status. */
mkv_status_t runner_fail(char *buf, mkv_status_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#define RUNNER_TRY(expr)                                                                        \
    do {                                                                                       \
        mkv_status_t runner_try_status_ = (expr);                                              \
        if (runner_try_status_ != MKV_STATUS_OK) {                                             \
            status = runner_try_status_;                                                       \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* MKV_RUNNER_ERROR_H */
