/*
 * tc_trace.cuh — timeline stamps of the tensor-core decode kernels, for diagnosis only: built
 * into the kernels where MKV_TC_TRACE is defined (a build of its own, docs/decode-kernel.md,
 * "Timeline stamps"), and nothing otherwise. A stamp appends the record {globaltimer, clock64,
 * tag | SM << 8 | warp << 16, block, arg} to tc_args::trace (when non-null): trace[0] counts
 * the records reserved (a warp's in chunks), record k is the four words trace[4 + 4 k ..]
 * (MKV_TC_TRACE_CAP at most), tag 0 where its chunk left it unused (the buffer is zeroed
 * before a traced call).
 */
#ifndef MKV_ATTENTION_TC_TRACE_CUH
#define MKV_ATTENTION_TC_TRACE_CUH

#include "attention/decode_tc.h"

namespace mkv_tc {

enum trace_tag {
    TR_START = 1, /* a block begins (thread 0) */
    TR_CMD,       /* a command taken (thread 0; arg: decode id, or -2 - score job) */
    TR_FIRST,     /* a warp's first staged subtile has landed (lane 0; arg: item's first token) */
    TR_ITEM,      /* a warp's item is done, its partial written (lane 0) */
    TR_ARRIVE,    /* a block's arrival at its region (thread 0; arg: 1 for the last) */
    TR_MERGED,    /* the region's last block has merged it into out (thread 0) */
    TR_EXIT,      /* a block ends (thread 0) */
    TR_FIN_START, /* a finalize block begins (thread 0) */
    TR_FIN_END,   /* a finalize block ends (thread 0) */
    TR_FIN_WAITED, /* a finalize block's wait for the decode kernel has returned (thread 0) */
    TR_FIN_MS,     /* a finalize block has its heads' maxima and sums (thread 0) */
    TR_WAITED,     /* a merging block that is not its region's last has seen the last arrive (thread 0) */
    TR_MS,         /* a merging block has its region's maxima and sums (thread 0) */
    TR_LANDED,     /* a merging block's first chunk of parts has landed (thread 0) */
};

#ifdef MKV_TC_TRACE
/* Records a warp reserves at a time (one atomic on trace[0] per chunk: a global atomic per stamp
 * made each stamping thread wait a round trip, and at a call's end, where every block stamps,
 * queue behind the others on one address, which moved the stamps after it by a microsecond and
 * more). A warp's state, in shared memory: its chunk's first record << 6 | records used. */
#define MKV_TC_TRACE_CHUNK 32
__device__ __forceinline__ uint32_t *trace_warps()
{
    __shared__ uint32_t w[32];
    return w;
}
#endif

/* At a stamping kernel's start, by every warp before its first stamp: its chunk used up. */
__device__ __forceinline__ void trace_init(const tc_args &a)
{
#ifdef MKV_TC_TRACE
    if (a.trace && (threadIdx.x & 31) == 0) trace_warps()[threadIdx.x >> 5] = MKV_TC_TRACE_CHUNK;
#else
    (void)a;
#endif
}

/* Lane 0 of a warp only (each warp's chunk is its lane 0's). */
__device__ __forceinline__ void trace_stamp(const tc_args &a, int tag, int32_t arg)
{
#ifdef MKV_TC_TRACE
    if (!a.trace) return;
    unsigned long long gt;
    uint32_t sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned long long clk = (unsigned long long)clock64();
    uint32_t &st = trace_warps()[threadIdx.x >> 5];
    if ((st & 63) >= MKV_TC_TRACE_CHUNK) {
        const unsigned long long c = atomicAdd(a.trace, (unsigned long long)MKV_TC_TRACE_CHUNK);
        st = c + MKV_TC_TRACE_CHUNK <= MKV_TC_TRACE_CAP ? (uint32_t)c << 6 : (uint32_t)MKV_TC_TRACE_CAP << 6;
    }
    const uint32_t k = (st >> 6) + (st & 63);
    st += 1;
    if (k >= MKV_TC_TRACE_CAP) return;
    const unsigned long long block =
        blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    unsigned long long *r = a.trace + 4 + 4 * (unsigned long long)k;
    r[0] = gt, r[1] = clk;
    r[2] = (unsigned long long)tag | (unsigned long long)sm << 8 | (unsigned long long)(threadIdx.x >> 5) << 16;
    r[3] = block | (unsigned long long)(uint32_t)arg << 32;
#else
    (void)a, (void)tag, (void)arg;
#endif
}

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_TRACE_CUH */
