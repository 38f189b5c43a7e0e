/*
 * scan.h — exclusive prefix sums, the coordination step of parallel KV compaction: per-section
 * page demands become disjoint offsets from the ring's head (allocation) or tail (recycling).
 * The C function is the reference; the CUDA one (CUB) must match it exactly.
 */
#ifndef MKV_MEMMGR_SCAN_H
#define MKV_MEMMGR_SCAN_H

#include "mixkv.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = in[0] + ... + in[i-1]; returns the total in[0] + ... + in[n-1]. in == out is
 * allowed. The caller guarantees partial sums fit int32 (they are page counts <= P). */
int64_t mkv_exclusive_scan_i32(const int32_t *in, int32_t *out, int64_t n);

#ifdef MKV_HAVE_CUDA
/* Device version: d_out[i] = exclusive prefix sum of d_in, *d_total = the sum (all device
 * memory, n <= INT32_MAX). Call first with d_temp == NULL to get *temp_bytes; nothing is
 * allocated inside. Asynchronous on `stream`; returns CUDA_ERROR with a message in err. */
mkv_status_t mkv_cuda_exclusive_scan_i32(const int32_t *d_in, int32_t *d_out, int32_t *d_total,
                                         int64_t n, void *d_temp, size_t *temp_bytes, void *stream,
                                         char *err);
#endif

#ifdef __cplusplus
}
#endif

#endif /* MKV_MEMMGR_SCAN_H */
