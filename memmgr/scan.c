/*
 * scan.c — the reference exclusive prefix sum (see scan.h).
 */
#include "memmgr/scan.h"

int64_t mkv_exclusive_scan_i32(const int32_t *in, int32_t *out, int64_t n)
{
    int64_t sum = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t v = in[i];
        out[i] = (int32_t)sum;
        sum += v;
    }
    return sum;
}
