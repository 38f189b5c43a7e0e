/*
 * convert.c — mkv_convert (mixkv.h): element type conversions with the CPU backend's exact
 * rules (quant/half.h), for engines built on mixkv.
 */
#include "common/error.h"
#include "quant/half.h"

#include <string.h>

mkv_status_t mkv_convert(void *dst, mkv_dtype_t to, const void *src, mkv_dtype_t from, int64_t n)
{
    const size_t sd = mkv_dtype_size(to), ss = mkv_dtype_size(from);
    if (!sd || !ss)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_convert: element type %d -> %d out of range",
                               (int)from, (int)to);
    if (n < 0 || (n > 0 && (!dst || !src)))
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_convert: %lld elements, dst %p, src %p",
                               (long long)n, dst, src);
    if (to == from) {
        if (n > 0) memcpy(dst, src, (size_t)n * sd);
        return MKV_STATUS_OK;
    }
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) { /* byte copies: no alignment needed (little-endian host) */
        float x;
        if (from == MKV_DTYPE_F32) {
            memcpy(&x, s + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            x = from == MKV_DTYPE_F16 ? mkv_f16_to_f32(h) : mkv_bf16_to_f32(h);
        }
        if (to == MKV_DTYPE_F32) {
            memcpy(d + 4 * i, &x, 4);
        } else {
            const uint16_t h = to == MKV_DTYPE_F16 ? mkv_f32_to_f16(x) : mkv_f32_to_bf16(x);
            memcpy(d + 2 * i, &h, 2);
        }
    }
    return MKV_STATUS_OK;
}
