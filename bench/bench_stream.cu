/*
 * bench_stream — how fast a decode kernel's warps can stream K16V16 pages (d 128: a token's
 * keys and values are 512 bytes; a page of 32 tokens is 16 KiB) when they do nothing else,
 * by cp.async of 16 bytes a lane (what tc_item.cuh's producer does) or by one bulk copy a page
 * (cp.async.bulk, the copy engine, completion on an mbarrier). The streaming ceiling of the
 * small batches, where issue 22's K16V16 target is unmet: regions of the call's shape, items of
 * I tokens a warp, 4 warps a block, S stages a warp; pages in random order; the L2 flushed by
 * reading 256 MiB before each timed call; median of the calls; JSON with --json.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "bench_stream: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static constexpr int PAGE_TOKENS = 32, TOKEN_BYTES = 512, PAGE_BYTES = PAGE_TOKENS * TOKEN_BYTES;
static constexpr int WARPS = 4;

struct args_t {
    const uint8_t *pool;
    const int32_t *table; /* [region][page] */
    int32_t pages;        /* per region */
    int32_t item_pages;   /* per warp */
    int32_t items;        /* per region */
    uint32_t *sink;
    uint64_t *stamps; /* --stamps: per warp its start, first stage landed and end (ns), or null */
};

__device__ __forceinline__ uint64_t now_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* The consumer's reads of a landed stage of `bytes`: every lane a 16-byte unit in each 512. */
__device__ __forceinline__ uint32_t touch(const uint8_t *st, int bytes, int lane)
{
    uint32_t x = 0;
    for (int o = lane * 16; o < bytes; o += 512) x ^= *reinterpret_cast<const uint32_t *>(st + o);
    return x;
}

/* A warp's item: its index, its region's row of page ids and its first page there. */
struct warp_item {
    int64_t item;
    const int32_t *row;
    int32_t p0;
};

__device__ __forceinline__ warp_item item_of(const args_t &a, int warp)
{
    const int64_t item = (int64_t)blockIdx.x * WARPS + warp;
    return warp_item{item, a.table + item / a.items * a.pages, (int32_t)(item % a.items) * a.item_pages};
}

/* Work on a landed stage: FMAS fp32 multiply-adds a lane in 8 independent chains (the decode
 * kernel's subtile is about 470 instructions, its mma and softmax chains dependent), seeded by
 * the stage's data so that it cannot start before the data lands. */
template <int FMAS>
__device__ __forceinline__ uint32_t work(uint32_t x)
{
    if constexpr (FMAS == 0) {
        return x;
    } else {
        float c[8];
#pragma unroll
        for (int i = 0; i < 8; i++) c[i] = __uint_as_float((x & 0x007fffffu) | 0x3f800000u) + (float)i;
#pragma unroll
        for (int k = 0; k < FMAS / 8; k++)
#pragma unroll
            for (int i = 0; i < 8; i++) c[i] = fmaf(c[i], 0.999f, 0.001f);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) s += c[i];
        return x ^ __float_as_uint(s);
    }
}

/* cp.async of 16 bytes a lane, stages of STAGE_TOKENS tokens (16: half a page, as the decode
 * kernel's K16V16 stages; 32: a page); FMAS: work per 16 tokens after they land. */
template <int S, int STAGE_TOKENS, int FMAS = 0>
__global__ void __launch_bounds__(WARPS * 32) stream_lanes(args_t a)
{
    extern __shared__ __align__(128) uint8_t sm[];
    constexpr int SB = STAGE_TOKENS * TOKEN_BYTES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const warp_item wi = item_of(a, warp);
    const int64_t item = wi.item;
    const int32_t *row = wi.row, p0 = wi.p0;
    uint8_t *ws = sm + warp * S * SB;
    const int n_stages = a.item_pages * PAGE_TOKENS / STAGE_TOKENS;
    if (a.stamps && lane == 0) a.stamps[3 * item] = now_ns();
    auto produce = [&](int k) {
        if (k < n_stages) {
            const int32_t t0 = k * STAGE_TOKENS;
            const uint8_t *page = a.pool + (int64_t)row[p0 + t0 / PAGE_TOKENS] * PAGE_BYTES;
            const int slot0 = t0 % PAGE_TOKENS;
            const uint32_t dst = smem_u32(ws + (k % S) * SB);
            /* units: 32 chunk rows (16 key, 16 value) x STAGE_TOKENS tokens of 16 bytes */
            for (int u = lane; u < 32 * STAGE_TOKENS; u += 32) {
                const int c = u / STAGE_TOKENS, t = u % STAGE_TOKENS;
                const uint8_t *src = page + c * (PAGE_TOKENS * 16) + (slot0 + t) * 16;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + u * 16), "l"(src) : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    for (int k = 0; k < S - 1; k++) produce(k);
    uint32_t acc = 0;
    for (int k = 0; k < n_stages; k++) {
        __syncwarp();
        produce(k + S - 1);
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
        __syncwarp();
        if (k == 0 && a.stamps && lane == 0) a.stamps[3 * item + 1] = now_ns();
        acc ^= touch(ws + (k % S) * SB, SB, lane);
#pragma unroll
        for (int u = 0; u < STAGE_TOKENS / 16; u++) acc = work<FMAS>(acc);
    }
    if (a.stamps && lane == 0) a.stamps[3 * item + 2] = now_ns();
    if (acc == 0x9e3779b9u) a.sink[0] = acc;
}

/* One bulk copy a page (the copy engine), stages of a page, each completed on its mbarrier. */
template <int S>
__global__ void __launch_bounds__(WARPS * 32) stream_bulk(args_t a)
{
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ __align__(8) uint64_t bar[WARPS][S];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const warp_item wi = item_of(a, warp);
    const int32_t *row = wi.row, p0 = wi.p0;
    uint8_t *ws = sm + warp * S * PAGE_BYTES;
    if (lane == 0)
        for (int s = 0; s < S; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[warp][s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
    const int n = a.item_pages;
    auto produce = [&](int k) {
        if (k < n && lane == 0) {
            const uint32_t b = smem_u32(&bar[warp][k % S]);
            const uint8_t *src = a.pool + (int64_t)row[p0 + k] * PAGE_BYTES;
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(PAGE_BYTES) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             smem_u32(ws + (k % S) * PAGE_BYTES)),
                         "l"(src), "r"(PAGE_BYTES), "r"(b)
                         : "memory");
        }
    };
    for (int k = 0; k < S - 1; k++) produce(k);
    uint32_t acc = 0;
    for (int k = 0; k < n; k++) {
        __syncwarp();
        produce(k + S - 1);
        const uint32_t b = smem_u32(&bar[warp][k % S]);
        const uint32_t parity = (uint32_t)(k / S) & 1u;
        uint32_t done = 0;
        while (!done)
            asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done)
                         : "r"(b), "r"(parity)
                         : "memory");
        acc ^= touch(ws + (k % S) * PAGE_BYTES, PAGE_BYTES, lane);
    }
    if (acc == 0x9e3779b9u) a.sink[0] = acc;
}

__global__ void flush_read(const uint4 *p, size_t n, uint32_t *sink)
{
    uint32_t x = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x ^= p[i].x;
    if (x == 0x9e3779b9u) sink[1] = x;
}

typedef void (*kern_t)(args_t);

struct variant {
    const char *name;
    kern_t k;
    int stage_bytes, stages;
    bool stamps; /* the kernel writes args_t::stamps */
};

static double pct(std::vector<double> v, double p)
{
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(p * (v.size() - 1) + 0.5))];
}

int main(int argc, char **argv)
{
    int reps = 20;
    bool stamps = false;
    const char *json = nullptr;
    std::vector<int> batches = {1, 2, 4, 8}, lengths = {8192, 16384, 32768};
    std::vector<int> items = {128, 256, 512};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--stamps")) stamps = true;
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: bench_stream [--reps N] [--json FILE] [--stamps]\n"
                   "Streams K16V16 pages (d 128, 32 tokens, 16 KiB) of batch x 8 KV heads x length\n"
                   "tokens through 4-warp blocks, items of 128, 256 or 512 tokens a warp, by\n"
                   "cp.async (16 bytes a lane; stages of 16 or 32 tokens) or one bulk copy a page,\n"
                   "2 to 6 stages a warp (at most 192 KiB a block), nothing computed, or (work*) 128\n"
                   "to 1,024 fp32 FMAs a lane per 16 tokens; time per call after an L2 flush, and\n"
                   "the fraction of the device copy rate. --stamps: one more call of each\n"
                   "cp.async variant with each warp's start, first stage landed and end stamped\n"
                   "(globaltimer), their spread reported from the first warp's start.\n");
            return 0;
        } else {
            fprintf(stderr, "bench_stream: unknown argument %s (--help)\n", argv[i]);
            return 2;
        }
    }
    const int heads = 8;
    size_t max_pages = 0;
    for (int b : batches)
        for (int l : lengths) max_pages = std::max(max_pages, (size_t)b * heads * l / PAGE_TOKENS);
    const size_t pool_pages = max_pages + 64;
    uint8_t *pool;
    CK(cudaMalloc(&pool, pool_pages * PAGE_BYTES));
    CK(cudaMemset(pool, 1, pool_pages * PAGE_BYTES));
    const size_t flush_bytes = 256u << 20;
    uint4 *flush;
    uint32_t *sink;
    int32_t *table;
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMemset(flush, 0, flush_bytes));
    CK(cudaMalloc(&sink, 64));
    CK(cudaMalloc(&table, max_pages * sizeof(int32_t)));
    std::vector<int32_t> perm(pool_pages);
    for (size_t i = 0; i < pool_pages; i++) perm[i] = (int32_t)i;
    std::mt19937 rng(7);
    std::shuffle(perm.begin(), perm.end(), rng);
    CK(cudaMemcpy(table, perm.data(), max_pages * sizeof(int32_t), cudaMemcpyHostToDevice));
    uint64_t *stamp_buf = nullptr;
    size_t max_warps = 0;
    for (int b : batches)
        for (int l : lengths)
            for (int it : items) max_warps = std::max(max_warps, (size_t)b * heads * (l / it));
    if (stamps) CK(cudaMalloc(&stamp_buf, 3 * max_warps * sizeof(uint64_t)));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* the copy rate: a device-to-device copy of 1 GiB, bytes read and written per second */
    double copy_gbs = 0;
    {
        const size_t n = (size_t)1 << 30;
        uint8_t *x, *y;
        CK(cudaMalloc(&x, n));
        CK(cudaMalloc(&y, n));
        std::vector<float> ts;
        for (int r = 0; r < 10; r++) {
            CK(cudaEventRecord(e0));
            CK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            ts.push_back(ms);
        }
        std::sort(ts.begin(), ts.end());
        copy_gbs = 2.0 * n / (ts[ts.size() / 2] * 1e-3) / 1e9; /* read + write, as bench_attention */
        CK(cudaFree(x));
        CK(cudaFree(y));
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const variant vs[] = {
        {"lanes16_s3", stream_lanes<3, 16>, 16 * TOKEN_BYTES, 3, true},
        {"lanes16_s4", stream_lanes<4, 16>, 16 * TOKEN_BYTES, 4, true},
        {"lanes16_s6", stream_lanes<6, 16>, 16 * TOKEN_BYTES, 6, true},
        {"lanes32_s3", stream_lanes<3, 32>, 32 * TOKEN_BYTES, 3, true},
        {"bulk_s2", stream_bulk<2>, PAGE_BYTES, 2, false},
        {"bulk_s3", stream_bulk<3>, PAGE_BYTES, 3, false},
        {"work128_s3", stream_lanes<3, 16, 128>, 16 * TOKEN_BYTES, 3, true},
        {"work256_s3", stream_lanes<3, 16, 256>, 16 * TOKEN_BYTES, 3, true},
        {"work512_s3", stream_lanes<3, 16, 512>, 16 * TOKEN_BYTES, 3, true},
        {"work1024_s3", stream_lanes<3, 16, 1024>, 16 * TOKEN_BYTES, 3, true},
    };
    for (const variant &v : vs)
        CK(cudaFuncSetAttribute(v.k, cudaFuncAttributeMaxDynamicSharedMemorySize, WARPS * v.stages * v.stage_bytes));
    FILE *jf = json ? fopen(json, "w") : nullptr;
    if (jf)
        fprintf(jf, "{\"schema\": \"mixkv-bench-stream\", \"schema_version\": 1, \"device\": \"%s\", \"copy_rate_gbs\": %.1f, "
                    "\"reps\": %d, \"results\": [",
                prop.name, copy_gbs, reps);
    printf("device %s, copy rate %.1f GB/s\n%-12s %5s %6s %5s %7s %9s %7s %6s\n", prop.name, copy_gbs, "variant", "batch",
           "length", "item", "blocks", "time_us", "GB/s", "copy");
    bool first = true;
    for (int b : batches)
        for (int l : lengths)
            for (int it : items)
                for (const variant &v : vs) {
                    args_t a;
                    a.pool = pool, a.table = table, a.pages = l / PAGE_TOKENS, a.item_pages = it / PAGE_TOKENS;
                    a.items = l / it, a.sink = sink, a.stamps = nullptr;
                    const int64_t warps = (int64_t)b * heads * a.items;
                    const unsigned blocks = (unsigned)(warps / WARPS);
                    std::vector<float> ts;
                    for (int r = 0; r < reps + 2; r++) {
                        flush_read<<<prop.multiProcessorCount * 4, 512>>>(flush, flush_bytes / 16, sink);
                        CK(cudaEventRecord(e0));
                        v.k<<<blocks, WARPS * 32, WARPS * v.stages * v.stage_bytes>>>(a);
                        CK(cudaEventRecord(e1));
                        CK(cudaEventSynchronize(e1));
                        CK(cudaGetLastError());
                        float ms;
                        CK(cudaEventElapsedTime(&ms, e0, e1));
                        if (r >= 2) ts.push_back(ms * 1000.0f);
                    }
                    std::sort(ts.begin(), ts.end());
                    const double us = ts[ts.size() / 2];
                    const double bytes = (double)b * heads * l * TOKEN_BYTES;
                    const double gbs = bytes / (us * 1e-6) / 1e9;
                    printf("%-12s %5d %6d %5d %7u %9.2f %7.1f %5.1f%%", v.name, b, l, it, blocks, us, gbs, 100 * gbs / copy_gbs);
                    if (jf)
                        fprintf(jf, "%s\n  {\"variant\": \"%s\", \"batch\": %d, \"length\": %d, \"item_tokens\": %d, "
                                    "\"stages\": %d, \"stage_bytes\": %d, \"blocks\": %u, \"time_us\": %.2f, \"gbs\": %.1f, "
                                    "\"fraction_of_copy\": %.4f",
                                first ? "" : ",", v.name, b, l, it, v.stages, v.stage_bytes, blocks, us, gbs, gbs / copy_gbs);
                    if (stamps && v.stamps) {
                        /* one more call, stamped: each warp's times from the first warp's start (us) */
                        a.stamps = stamp_buf;
                        flush_read<<<prop.multiProcessorCount * 4, 512>>>(flush, flush_bytes / 16, sink);
                        v.k<<<blocks, WARPS * 32, WARPS * v.stages * v.stage_bytes>>>(a);
                        CK(cudaDeviceSynchronize());
                        std::vector<uint64_t> st(3 * (size_t)warps);
                        CK(cudaMemcpy(st.data(), stamp_buf, st.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
                        uint64_t t0 = UINT64_MAX;
                        for (int64_t w = 0; w < warps; w++) t0 = std::min(t0, st[3 * w]);
                        std::vector<double> start, land, end;
                        for (int64_t w = 0; w < warps; w++) {
                            start.push_back(1e-3 * (double)(st[3 * w] - t0));
                            land.push_back(1e-3 * (double)(st[3 * w + 1] - t0));
                            end.push_back(1e-3 * (double)(st[3 * w + 2] - t0));
                        }
                        printf("   starts <= %.1f, first landed %.1f / %.1f (median / max), ends %.1f / %.1f / %.1f (min / median / max)",
                               pct(start, 1.0), pct(land, 0.5), pct(land, 1.0), pct(end, 0.0), pct(end, 0.5), pct(end, 1.0));
                        if (jf)
                            fprintf(jf, ", \"stamps_us\": {\"start_max\": %.2f, \"first_median\": %.2f, \"first_max\": %.2f, "
                                        "\"end_min\": %.2f, \"end_median\": %.2f, \"end_max\": %.2f}",
                                    pct(start, 1.0), pct(land, 0.5), pct(land, 1.0), pct(end, 0.0), pct(end, 0.5), pct(end, 1.0));
                    }
                    printf("\n");
                    if (jf) fprintf(jf, "}");
                    first = false;
                }
    if (jf) {
        fprintf(jf, "\n]}\n");
        fclose(jf);
    }
    return 0;
}
