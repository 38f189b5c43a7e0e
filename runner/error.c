/*
 * error.c — the runner's error messages (runner/error.h).
 */
#include "runner/error.h"

#include <stdarg.h>
#include <stdio.h>

mkv_status_t runner_fail(char *buf, mkv_status_t status, const char *fmt, ...)
{
    if (!buf) return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, MKV_ERR_LEN, fmt, ap);
    va_end(ap);
    return status;
}
