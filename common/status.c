/*
 * status.c — status strings, the library version and the thread-local error buffer.
 */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MKV_STR2(x) #x
#define MKV_STR(x) MKV_STR2(x)

static _Thread_local char g_last_error[MKV_ERR_LEN];

const char *mkv_status_string(mkv_status_t status)
{
    switch (status) {
    case MKV_STATUS_OK: return "ok";
    case MKV_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case MKV_STATUS_UNSUPPORTED: return "unsupported";
    case MKV_STATUS_OUT_OF_PAGES: return "out of pages";
    case MKV_STATUS_OUT_OF_MEMORY: return "out of memory";
    case MKV_STATUS_CUDA_ERROR: return "CUDA error";
    case MKV_STATUS_IO_ERROR: return "I/O error";
    case MKV_STATUS_PARSE_ERROR: return "parse error";
    case MKV_STATUS_INTERNAL: return "internal error";
    case MKV_STATUS_OUT_OF_SLOTS: return "out of sequence slots";
    case MKV_STATUS_CORRUPT: return "corrupt cache state";
    }
    return "unknown status";
}

const char *mkv_version(void)
{
    return MKV_STR(MKV_VERSION_MAJOR) "." MKV_STR(MKV_VERSION_MINOR) "." MKV_STR(MKV_VERSION_PATCH);
}

const char *mkv_last_error(void) { return g_last_error; }

void mkv_free(void *ptr) { free(ptr); }

mkv_status_t mkv_fail(char *buf, mkv_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, MKV_ERR_LEN, fmt, ap);
    va_end(ap);
    return status;
}

mkv_status_t mkv_fail_global(mkv_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

void mkv_clear_global_error(void) { g_last_error[0] = '\0'; }

void mkv_set_global_error_text(const char *text)
{
    snprintf(g_last_error, sizeof g_last_error, "%s", text);
}
