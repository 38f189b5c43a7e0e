/*
 * cuda_mm.cu — the CUDA memory manager (see cuda_mm.h). Kernels first, then launchers, then the
 * entry points. Every kernel mirrors a phase of memmgr/resize.c: section 2i is head-region i's
 * high section and 2i + 1 its low section, head-region i = (j * L + layer) * H + head of the
 * j-th listed slot; recycled pages go to ring[(tail + offset + k) % P] in section order and new
 * pages come from ring[(head + offset + k) % P], so the CPU and GPU states stay identical.
 */
#include "memmgr/cuda_mm.h"

#include "common/error.h"

#include <cub/block/block_scan.cuh>
#include "common/device_scope.cuh"

#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

typedef unsigned long long u64;

/* What one call's kernels tell the host; copied back once per call. */
struct dev_status {
    int32_t code;      /* MKV_STATUS_* of the fit check */
    int32_t bad_hi, bad_lo;
    int32_t pad;
    u64 bad_region;    /* first head-region with invalid targets; ~0 when none */
    long long total_alloc, total_release;
    u64 head, tail;    /* counters after the call */
    long long sums[4]; /* reductions (stats, step demand, validate) */
};

/* Regions per block of the plan, recycle and allocate kernels: the block-level scan unit. */
#define PLAN_BLOCK 512
#define CHECK_BLOCK 1024

struct mkv_cuda_mm {
    mkv_mm_geom_t g;
    int32_t device;
    int32_t *ring;     /* [P] */
    int32_t *table;    /* [S][L][H][T] */
    int32_t *n_hi, *n_lo;       /* [S][L][H] */
    u64 *counters;     /* [2] head, tail */
    uint8_t *pool;     /* [P * page_bytes] or NULL */
    /* workspace, sized for every head-region at once */
    int32_t *target;              /* [2 * S * L * H] new token count per section */
    u64 *offset;                  /* [S * L * H] packed (release << 32 | alloc) exclusive
                                     offsets within the region's plan block */
    u64 *block_sum;               /* [blocks] packed block totals, then block bases */
    int64_t max_blocks;
    int32_t *d_args;              /* [2 * S] the call's slots, then new N per slot */
    int32_t *h_args;              /* pinned staging for d_args */
    dev_status *h_map, *d_map;    /* mapped pinned: the check writes the host's copy */
    uint8_t *d_flags;             /* [S] */
    int32_t *d_seq;               /* [S] */
    int32_t *own;                 /* [P] validate: how many places hold each page */
    dev_status *d_status;  /* the calls' status (bad_region kept at ~0 between calls) */
    dev_status *d_red;     /* reductions' own status (stats, step demand, validate) */
    /* Device-authoritative per-slot state and the sticky failure of asynchronous calls. */
    int32_t *d_len;               /* [S] N */
    long long *d_resv;            /* [S] reserved pages */
    mkv_cuda_fail_t *d_fail;      /* device copy, read by every gated kernel */
    mkv_cuda_fail_t *h_fail, *d_fail_map; /* mapped pinned: the host's copy */
    /* pinned host staging */
    int32_t *h_seq;
    uint8_t *h_flags;
    dev_status *h_status;
};


#define CUDA_TRY(expr)                                                                         \
    do {                                                                                       \
        cudaError_t e_ = (expr);                                                               \
        if (e_ != cudaSuccess) return mkv_fail(err, MKV_STATUS_CUDA_ERROR, "%s: %s", #expr,    \
                                               cudaGetErrorString(e_));                        \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* Kernels                                                                                  */
/* ---------------------------------------------------------------------------------------- */

__device__ __forceinline__ int32_t pages_for(int32_t n, int32_t tpp) { return (n + tpp - 1) / tpp; }

/* Table entry of the k-th page of a section: high from the left, low from the right. */
__device__ __forceinline__ int32_t *entry(int32_t *row, int32_t T, int sec, int32_t k)
{
    return sec == 0 ? &row[k] : &row[T - 1 - k];
}

static __global__ void init_kernel(int32_t *ring, int64_t P, int32_t *table, int64_t entries)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P + entries;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (i < P) ring[i] = (int32_t)i;
        else table[i - P] = -1;
    }
}

struct call_args {
    int kind;
    int dry_run;
    int64_t n_regions;
    int64_t per_slot; /* L * H */
    int32_t n_slots;
    int32_t T, tpp_hi, tpp_lo;
    int64_t P;
    long long others_reserved;
    const int32_t *args; /* [n_slots] slots, then [n_slots] new N (resize); NULL: inline */
    const int32_t *tgt_hi, *tgt_lo;
    int32_t call_id;     /* asynchronous calls: what a failure record names */
    int32_t async;       /* refusals become the sticky failure instead of a returned status */
    int32_t has_len;     /* resize: the call sets N (new_len given) */
    int32_t inl[2 * MKV_CUDA_MM_INLINE]; /* slots, then new N, when args is NULL */
};

__device__ __forceinline__ int32_t arg_of(const call_args &a, int64_t k)
{
    return a.args ? a.args[k] : a.inl[k];
}

__device__ __forceinline__ int64_t region_of(const call_args &a, int64_t i)
{
    return (int64_t)arg_of(a, i / a.per_slot) * a.per_slot + i % a.per_slot;
}

/* Release and alloc counts travel packed in one 64-bit value (release << 32 | alloc): the
 * sums stay below 2^31 (page counts), so one scan of packed values is two scans at once. */
__device__ __forceinline__ u64 pack(int32_t release, int32_t alloc)
{
    return ((u64)(uint32_t)release << 32) | (uint32_t)alloc;
}

/* Phase 1 with the first half of phase 2: each region's targets, pages gained and released
 * per section, and a block-level exclusive scan of them; invalid targets are flagged. */
static __global__ void __launch_bounds__(PLAN_BLOCK)
plan_kernel(call_args a, const int32_t *n_hi, const int32_t *n_lo, int32_t *target, u64 *offset,
            u64 *block_sum, dev_status *st, const int32_t *d_len)
{
    typedef cub::BlockScan<u64, PLAN_BLOCK> scan_t;
    __shared__ typename scan_t::TempStorage tmp;
    const int64_t i = blockIdx.x * (int64_t)PLAN_BLOCK + threadIdx.x;
    u64 v = 0;
    if (i < a.n_regions) {
        const int64_t r = region_of(a, i);
        int32_t hi, lo;
        if (a.kind == MKV_CUDA_OP_RESIZE) {
            hi = a.tgt_hi[i];
            lo = a.tgt_lo[i];
            /* the bound: the new N, or with N unchanged the device's N (a graph replay may be
             * steps ahead of the host's view when it was captured) */
            const int32_t bound = a.has_len ? arg_of(a, a.n_slots + i / a.per_slot)
                                            : d_len[arg_of(a, i / a.per_slot)];
            if (hi < 0 || lo < 0 || (long long)hi + lo > bound) {
                atomicMin(&st->bad_region, (u64)i); /* the first bad region, as the CPU reports it */
                hi = n_hi[r];
                lo = n_lo[r];
            }
        } else if (a.kind == MKV_CUDA_OP_APPEND) {
            hi = n_hi[r] + 1;
            lo = n_lo[r];
        } else {
            hi = 0;
            lo = 0;
        }
        target[2 * i] = hi;
        target[2 * i + 1] = lo;
        const int32_t oh = pages_for(n_hi[r], a.tpp_hi), nh = pages_for(hi, a.tpp_hi);
        const int32_t ol = pages_for(n_lo[r], a.tpp_lo), nl = pages_for(lo, a.tpp_lo);
        v = pack((oh > nh ? oh - nh : 0) + (ol > nl ? ol - nl : 0),
                 (nh > oh ? nh - oh : 0) + (nl > ol ? nl - ol : 0));
    }
    u64 excl, total;
    scan_t(tmp).ExclusiveSum(v, excl, total);
    if (i < a.n_regions) offset[i] = excl;
    if (threadIdx.x == 0) block_sum[blockIdx.x] = total;
}

/* The rest of phase 2, one block: block totals become block bases, then the fit check. On
 * success the counters advance at once (the later kernels work from the values before). The
 * host's copy of the status is written through mapped memory. */
static __global__ void __launch_bounds__(CHECK_BLOCK)
check_kernel(call_args a, int64_t blocks, u64 *block_sum, u64 *counters, dev_status *st,
             dev_status *host, mkv_cuda_fail_t *fail, mkv_cuda_fail_t *fail_host)
{
    typedef cub::BlockScan<u64, CHECK_BLOCK> scan_t;
    __shared__ typename scan_t::TempStorage tmp;
    u64 carry = 0;
    for (int64_t b0 = 0; b0 < blocks; b0 += CHECK_BLOCK) {
        const int64_t b = b0 + threadIdx.x;
        const u64 v = b < blocks ? block_sum[b] : 0;
        u64 excl, total;
        scan_t(tmp).ExclusiveSum(v, excl, total);
        if (b < blocks) block_sum[b] = carry + excl;
        carry += total;
        __syncthreads(); /* TempStorage is reused by the next chunk */
    }
    if (threadIdx.x != 0) return;
    const long long ta = (long long)(uint32_t)carry, tr = (long long)(carry >> 32);
    const u64 head = counters[0], tail = counters[1];
    const long long free_pages = (long long)(tail - head);
    int32_t code = MKV_STATUS_OK, bad_hi = 0, bad_lo = 0;
    const u64 bad = st->bad_region;
    if (bad != ~0ull) {
        code = MKV_STATUS_INVALID_ARGUMENT;
        bad_hi = a.tgt_hi[bad];
        bad_lo = a.tgt_lo[bad];
    } else if (ta > free_pages + tr - a.others_reserved) {
        code = MKV_STATUS_OUT_OF_PAGES;
    }
    if (fail->code != 0) {
        code = MKV_CUDA_SKIPPED; /* an earlier asynchronous call failed: change nothing */
    } else if (code != MKV_STATUS_OK && a.async && !a.dry_run) {
        mkv_cuda_fail_t f;
        f.code = code;
        f.call_id = a.call_id;
        f.kind = a.kind;
        f.bad_hi = bad_hi;
        f.bad_lo = bad_lo;
        f.bad_region = bad == ~0ull ? -1 : (long long)bad;
        f.total_alloc = ta;
        f.total_release = tr;
        f.free_pages = free_pages;
        f.others_reserved = a.others_reserved;
        *fail = f;
        *fail_host = f;
    }
    st->code = code;
    st->head = head; /* before the call: the bases of recycle and allocate */
    st->tail = tail;
    st->bad_region = ~0ull; /* ready for the next call */
    if (code == MKV_STATUS_OK && !a.dry_run) {
        counters[0] = head + (u64)ta;
        counters[1] = tail + (u64)tr;
    }
    host->code = code;
    host->bad_hi = bad_hi;
    host->bad_lo = bad_lo;
    host->bad_region = bad;
    host->total_alloc = ta;
    host->total_release = tr;
    host->head = counters[0];
    host->tail = counters[1];
}

/* Phase 3: shrinking sections write their last pages to the ring's tail, in section order. */
static __global__ void __launch_bounds__(PLAN_BLOCK)
recycle_kernel(call_args a, const int32_t *target, const int32_t *n_hi, const int32_t *n_lo,
               const u64 *offset, const u64 *block_base, int32_t *ring, int32_t *table,
               const dev_status *st)
{
    const int64_t i = blockIdx.x * (int64_t)PLAN_BLOCK + threadIdx.x;
    if (i >= a.n_regions || st->code != MKV_STATUS_OK) return;
    const int64_t r = region_of(a, i);
    int32_t *row = table + r * a.T;
    u64 base = st->tail + ((block_base[blockIdx.x] + offset[i]) >> 32);
    const int32_t cur[2] = {n_hi[r], n_lo[r]}, tpp[2] = {a.tpp_hi, a.tpp_lo};
    for (int sec = 0; sec < 2; sec++) {
        const int32_t k_old = pages_for(cur[sec], tpp[sec]), k_new = pages_for(target[2 * i + sec], tpp[sec]);
        for (int32_t k = k_new; k < k_old; k++, base++) {
            int32_t *e = entry(row, a.T, sec, k);
            ring[base % (u64)a.P] = *e;
            *e = -1;
        }
    }
}

/* Phase 4: growing sections take pages from the ring's head; counts are committed. */
static __global__ void __launch_bounds__(PLAN_BLOCK)
allocate_kernel(call_args a, const int32_t *target, const u64 *offset, const u64 *block_base,
                const int32_t *ring, int32_t *table, int32_t *n_hi, int32_t *n_lo, const dev_status *st,
                int32_t *d_len, long long *d_resv)
{
    const int64_t i = blockIdx.x * (int64_t)PLAN_BLOCK + threadIdx.x;
    if (i >= a.n_regions || st->code != MKV_STATUS_OK) return;
    const int64_t r = region_of(a, i);
    int32_t *row = table + r * a.T;
    u64 base = st->head + (uint32_t)(block_base[blockIdx.x] + offset[i]);
    const int32_t cur[2] = {n_hi[r], n_lo[r]}, tpp[2] = {a.tpp_hi, a.tpp_lo};
    for (int sec = 0; sec < 2; sec++) {
        const int32_t k_old = pages_for(cur[sec], tpp[sec]), k_new = pages_for(target[2 * i + sec], tpp[sec]);
        for (int32_t k = k_old; k < k_new; k++, base++) *entry(row, a.T, sec, k) = ring[base % (u64)a.P];
    }
    n_hi[r] = target[2 * i];
    n_lo[r] = target[2 * i + 1];
    if (i % a.per_slot == 0) { /* the slot's own state, once */
        const int32_t slot = arg_of(a, i / a.per_slot);
        if (a.kind == MKV_CUDA_OP_APPEND) d_len[slot] += 1;
        else if (a.kind == MKV_CUDA_OP_RELEASE) d_len[slot] = 0;
        else if (a.has_len) d_len[slot] = arg_of(a, a.n_slots + i / a.per_slot);
        d_resv[slot] = 0; /* every call that includes a slot ends its reservation */
    }
}

/* Sums of tokens and pages over head-regions [r0, r0 + n). */
static __global__ void sums_kernel(const int32_t *n_hi, const int32_t *n_lo, int64_t r0, int64_t n,
                                   int32_t tpp_hi, int32_t tpp_lo, dev_status *st)
{
    long long s[4] = {0, 0, 0, 0};
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int32_t h = n_hi[r0 + i], l = n_lo[r0 + i];
        s[0] += h;
        s[1] += l;
        s[2] += pages_for(h, tpp_hi);
        s[3] += pages_for(l, tpp_lo);
    }
    /* a warp's sums first: one atomic a warp, not a thread (the grid is whole warps) */
    for (int k = 0; k < 4; k++) {
        for (int off = 16; off > 0; off >>= 1) s[k] += __shfl_down_sync(0xffffffffu, s[k], off);
        if (threadIdx.x % 32 == 0 && s[k]) atomicAdd((u64 *)&st->sums[k], (u64)s[k]);
    }
}

static __global__ void demand_kernel(const int32_t *slots, const uint8_t *lo_can_grow, int64_t n_regions,
                                     int64_t per_slot, const int32_t *n_hi, const int32_t *n_lo,
                                     int32_t tpp_hi, int32_t tpp_lo, dev_status *st)
{
    long long s = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_regions;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = i / per_slot, r = (int64_t)slots[j] * per_slot + i % per_slot;
        s += n_hi[r] % tpp_hi == 0;
        s += lo_can_grow[j] && n_lo[r] % tpp_lo == 0;
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (threadIdx.x % 32 == 0 && s) atomicAdd((u64 *)&st->sums[0], (u64)s);
}

/* Validation: count the places of every page; check rows against counts and N. */
static __global__ void own_free_kernel(const int32_t *ring, const u64 *counters, int64_t P, int32_t *own,
                                       dev_status *st)
{
    const u64 head = counters[0], tail = counters[1];
    const long long n = (long long)(tail - head);
    if (n < 0 || n > P) {
        if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd((u64 *)&st->sums[0], 1ull);
        return;
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int32_t p = ring[(head + (u64)i) % (u64)P];
        if (p < 0 || p >= P) atomicAdd((u64 *)&st->sums[0], 1ull);
        else atomicAdd(&own[p], 1);
    }
}

static __global__ void own_rows_kernel(const int32_t *table, const int32_t *n_hi, const int32_t *n_lo,
                                       const uint8_t *active, const int32_t *seq_len, int64_t regions,
                                       int64_t per_slot, int32_t T, int32_t tpp_hi, int32_t tpp_lo,
                                       int64_t P, int32_t *own, dev_status *st)
{
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= regions) return;
    const int64_t slot = r / per_slot;
    const int32_t h = n_hi[r], l = n_lo[r];
    long long bad = 0;
    if (h < 0 || l < 0 || (!active[slot] && (h | l)) || (long long)h + l > seq_len[slot]) bad++;
    const int32_t kh = h > 0 ? pages_for(h, tpp_hi) : 0, kl = l > 0 ? pages_for(l, tpp_lo) : 0;
    if (kh + kl > T) bad++;
    const int32_t *row = table + r * T;
    for (int32_t e = 0; e < T; e++) {
        const int32_t p = row[e];
        const int used = e < kh || e >= T - kl;
        if (!used) {
            bad += p != -1;
        } else if (p < 0 || p >= P) {
            bad++;
        } else {
            atomicAdd(&own[p], 1);
        }
    }
    if (bad) atomicAdd((u64 *)&st->sums[0], (u64)bad);
}

static __global__ void own_check_kernel(const int32_t *own, int64_t P, dev_status *st)
{
    long long bad = 0;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P;
         p += (int64_t)gridDim.x * blockDim.x)
        bad += own[p] != 1;
    if (bad) atomicAdd((u64 *)&st->sums[0], (u64)bad);
}

/* ---------------------------------------------------------------------------------------- */
/* Host side                                                                                */
/* ---------------------------------------------------------------------------------------- */

static int grid_for(int64_t n, int block) { return (int)((n + block - 1) / block > 0 ? (n + block - 1) / block : 1); }

static void free_all(mkv_cuda_mm_t *m)
{
    cudaFree(m->ring);
    cudaFree(m->table);
    cudaFree(m->n_hi);
    cudaFree(m->n_lo);
    cudaFree(m->counters);
    cudaFree(m->pool);
    cudaFree(m->target);
    cudaFree(m->offset);
    cudaFree(m->block_sum);
    cudaFree(m->d_args);
    cudaFree(m->d_flags);
    cudaFree(m->d_seq);
    cudaFree(m->own);
    cudaFree(m->d_status);
    cudaFree(m->d_red);
    cudaFree(m->d_len);
    cudaFree(m->d_resv);
    cudaFree(m->d_fail);
    cudaFreeHost(m->h_fail);
    cudaFreeHost(m->h_args);
    cudaFreeHost(m->h_map);
    cudaFreeHost(m->h_seq);
    cudaFreeHost(m->h_flags);
    cudaFreeHost(m->h_status);
}

static mkv_status_t create(mkv_cuda_mm_t *m, int64_t pool_bytes, char *err)
{
    const mkv_mm_geom_t *g = &m->g;
    const int64_t regions = mkv_mm_regions(g), sections = 2 * regions, S = g->max_seqs;
    const int64_t entries = regions * g->row_entries, P = g->pool_pages;
    device_scope scope(m->device);
    CUDA_TRY(cudaMalloc((void **)&m->ring, (size_t)P * 4));
    CUDA_TRY(cudaMalloc((void **)&m->table, (size_t)entries * 4));
    /* One more count than regions: region R is always empty (a gated decode points there). */
    CUDA_TRY(cudaMalloc((void **)&m->n_hi, (size_t)(regions + 1) * 4));
    CUDA_TRY(cudaMalloc((void **)&m->n_lo, (size_t)(regions + 1) * 4));
    CUDA_TRY(cudaMalloc((void **)&m->d_len, (size_t)S * 4));
    CUDA_TRY(cudaMalloc((void **)&m->d_resv, (size_t)S * 8));
    CUDA_TRY(cudaMalloc((void **)&m->d_fail, sizeof(mkv_cuda_fail_t)));
    CUDA_TRY(cudaHostAlloc((void **)&m->h_fail, sizeof(mkv_cuda_fail_t), cudaHostAllocMapped));
    CUDA_TRY(cudaHostGetDevicePointer((void **)&m->d_fail_map, m->h_fail, 0));
    CUDA_TRY(cudaMalloc((void **)&m->counters, 2 * sizeof(u64)));
    if (pool_bytes > 0) CUDA_TRY(cudaMalloc((void **)&m->pool, (size_t)pool_bytes));
    m->max_blocks = (regions + PLAN_BLOCK - 1) / PLAN_BLOCK;
    CUDA_TRY(cudaMalloc((void **)&m->target, (size_t)sections * 4));
    CUDA_TRY(cudaMalloc((void **)&m->offset, (size_t)regions * sizeof(u64)));
    CUDA_TRY(cudaMalloc((void **)&m->block_sum, (size_t)(m->max_blocks > 0 ? m->max_blocks : 1) * sizeof(u64)));
    CUDA_TRY(cudaMalloc((void **)&m->d_args, (size_t)(2 * S) * 4));
    CUDA_TRY(cudaMalloc((void **)&m->d_flags, (size_t)S));
    CUDA_TRY(cudaMalloc((void **)&m->d_seq, (size_t)S * 4));
    CUDA_TRY(cudaMalloc((void **)&m->own, (size_t)P * 4));
    CUDA_TRY(cudaMalloc((void **)&m->d_status, sizeof(dev_status)));
    CUDA_TRY(cudaMalloc((void **)&m->d_red, sizeof(dev_status)));
    CUDA_TRY(cudaMallocHost((void **)&m->h_args, (size_t)(2 * S) * 4));
    CUDA_TRY(cudaHostAlloc((void **)&m->h_map, sizeof(dev_status), cudaHostAllocMapped));
    CUDA_TRY(cudaHostGetDevicePointer((void **)&m->d_map, m->h_map, 0));
    CUDA_TRY(cudaMallocHost((void **)&m->h_seq, (size_t)S * 4));
    CUDA_TRY(cudaMallocHost((void **)&m->h_flags, (size_t)S));
    CUDA_TRY(cudaMallocHost((void **)&m->h_status, sizeof(dev_status)));
    /* The initial state, as mkv_mm_state_init writes it on the host. */
    init_kernel<<<grid_for(P + entries, 256) < 4096 ? grid_for(P + entries, 256) : 4096, 256>>>(
        m->ring, P, m->table, entries);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemset(m->n_hi, 0, (size_t)(regions + 1) * 4));
    CUDA_TRY(cudaMemset(m->n_lo, 0, (size_t)(regions + 1) * 4));
    CUDA_TRY(cudaMemset(m->d_len, 0, (size_t)S * 4));
    CUDA_TRY(cudaMemset(m->d_resv, 0, (size_t)S * 8));
    CUDA_TRY(cudaMemset(m->d_fail, 0, sizeof(mkv_cuda_fail_t)));
    memset(m->h_fail, 0, sizeof(mkv_cuda_fail_t));
    const u64 counters[2] = {0, (u64)P};
    CUDA_TRY(cudaMemcpy(m->counters, counters, sizeof counters, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemset(m->d_status, 0xff, sizeof(dev_status))); /* bad_region = none */
    CUDA_TRY(cudaDeviceSynchronize());
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_mm_create(const mkv_mm_geom_t *g, int32_t device, int64_t pool_bytes,
                                           mkv_cuda_mm_t **out, char *err)
{
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return mkv_fail(err, MKV_STATUS_UNSUPPORTED, "the CUDA backend needs a CUDA device: %s",
                        e != cudaSuccess ? cudaGetErrorString(e) : "the runtime sees none");
    }
    if (device >= count)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "config.device_id = %d, but there are %d devices",
                        device, count);
    mkv_cuda_mm_t *m = (mkv_cuda_mm_t *)calloc(1, sizeof *m);
    if (!m) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the CUDA memory manager");
    m->g = *g;
    m->device = device;
    device_scope scope(device);
    const mkv_status_t st = create(m, pool_bytes, err);
    if (st != MKV_STATUS_OK) {
        free_all(m);
        free(m);
        (void)cudaGetLastError();
        if (st != MKV_STATUS_CUDA_ERROR) return st;
        char why[MKV_ERR_LEN];
        memcpy(why, err, sizeof why);
        return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "%s", why); /* allocations failed */
    }
    *out = m;
    return MKV_STATUS_OK;
}

extern "C" void mkv_cuda_mm_destroy(mkv_cuda_mm_t *m)
{
    if (!m) return;
    device_scope scope(m->device);
    free_all(m);
    free(m);
}

extern "C" uint8_t *mkv_cuda_mm_pool(mkv_cuda_mm_t *m) { return m->pool; }

extern "C" mkv_status_t mkv_cuda_mm_apply(mkv_cuda_mm_t *m, mkv_cuda_op_t *op, void *stream_ptr, char *err)
{
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    const mkv_mm_geom_t *g = &m->g;
    call_args a;
    a.kind = op->kind;
    a.dry_run = op->dry_run;
    a.per_slot = (int64_t)g->n_layers * g->n_kv_heads;
    a.n_slots = op->n_slots;
    a.n_regions = (int64_t)op->n_slots * a.per_slot;
    a.T = g->row_entries;
    a.tpp_hi = g->tpp_hi;
    a.tpp_lo = g->tpp_lo;
    a.P = g->pool_pages;
    a.others_reserved = (long long)op->others_reserved;
    a.tgt_hi = op->tgt_hi;
    a.tgt_lo = op->tgt_lo;
    a.call_id = op->call_id;
    a.has_len = op->kind == MKV_CUDA_OP_RESIZE && op->new_len != NULL;
    const int inline_args = op->n_slots <= MKV_CUDA_MM_INLINE;
    a.async = op->async && inline_args && !op->dry_run;
    a.args = inline_args ? NULL : m->d_args;
    const int64_t blocks = (a.n_regions + PLAN_BLOCK - 1) / PLAN_BLOCK;
    device_scope scope(m->device);
    /* The call's slots (and new N) travel as kernel parameters when they fit, else by one copy
     * through pinned memory (synchronous calls only). */
    if (inline_args) {
        memcpy(a.inl, op->slots, (size_t)op->n_slots * 4);
        if (a.has_len) memcpy(a.inl + op->n_slots, op->new_len, (size_t)op->n_slots * 4);
        else if (op->kind == MKV_CUDA_OP_RESIZE) /* N unchanged: the bound of the targets' check */
            for (int32_t j = 0; j < op->n_slots; j++) a.inl[op->n_slots + j] = op->cur_len[j];
    } else {
        memcpy(m->h_args, op->slots, (size_t)op->n_slots * 4);
        if (op->kind == MKV_CUDA_OP_RESIZE)
            memcpy(m->h_args + op->n_slots, a.has_len ? op->new_len : op->cur_len, (size_t)op->n_slots * 4);
        const int32_t n_args = op->kind == MKV_CUDA_OP_RESIZE ? 2 * op->n_slots : op->n_slots;
        if (n_args > 0)
            CUDA_TRY(cudaMemcpyAsync(m->d_args, m->h_args, (size_t)n_args * 4, cudaMemcpyHostToDevice, stream));
    }
    if (blocks > 0)
        plan_kernel<<<(unsigned)blocks, PLAN_BLOCK, 0, stream>>>(a, m->n_hi, m->n_lo, m->target, m->offset,
                                                                 m->block_sum, m->d_status, m->d_len);
    check_kernel<<<1, CHECK_BLOCK, 0, stream>>>(a, blocks, m->block_sum, m->counters, m->d_status, m->d_map,
                                                m->d_fail, m->d_fail_map);
    CUDA_TRY(cudaGetLastError());
    if (op->between) {
        const mkv_status_t hs = op->between(op->between_ctx, stream, err);
        if (hs != MKV_STATUS_OK) return hs;
    }
    if (!op->dry_run && blocks > 0) {
        recycle_kernel<<<(unsigned)blocks, PLAN_BLOCK, 0, stream>>>(a, m->target, m->n_hi, m->n_lo, m->offset,
                                                                    m->block_sum, m->ring, m->table,
                                                                    m->d_status);
        allocate_kernel<<<(unsigned)blocks, PLAN_BLOCK, 0, stream>>>(a, m->target, m->offset, m->block_sum,
                                                                     m->ring, m->table, m->n_hi, m->n_lo,
                                                                     m->d_status, m->d_len, m->d_resv);
    }
    CUDA_TRY(cudaGetLastError());
    if (a.async) { /* the outcome is collected later (mkv_cuda_mm_collect) */
        op->deferred = 1;
        return MKV_STATUS_OK;
    }
    op->deferred = 0;
    CUDA_TRY(cudaStreamSynchronize(stream));
    const volatile dev_status *s = m->h_map;
    op->head = (int64_t)s->head;
    op->tail = (int64_t)s->tail;
    op->total_alloc = s->total_alloc;
    op->total_release = s->total_release;
    op->bad_region = s->bad_region == ~0ull ? -1 : (int64_t)s->bad_region;
    op->bad_hi = s->bad_hi;
    op->bad_lo = s->bad_lo;
    if (s->code == MKV_CUDA_SKIPPED)
        return mkv_fail(err, MKV_STATUS_INTERNAL, "an asynchronous failure was not collected before this call");
    return (mkv_status_t)s->code;
}

extern "C" mkv_status_t mkv_cuda_mm_collect(mkv_cuda_mm_t *m, mkv_cuda_fail_t *fail, int32_t *len,
                                            int64_t *reserved, int64_t counters[2], char *err)
{
    const int32_t S = m->g.max_seqs;
    device_scope scope(m->device);
    CUDA_TRY(cudaDeviceSynchronize());
    memcpy(fail, (const void *)m->h_fail, sizeof *fail); /* written by the device, now idle */
    if (fail->code != 0) {
        CUDA_TRY(cudaMemset(m->d_fail, 0, sizeof(mkv_cuda_fail_t)));
        memset(m->h_fail, 0, sizeof(mkv_cuda_fail_t));
    }
    long long *resv = (long long *)malloc((size_t)S * 8);
    if (!resv) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate %d reservations", S);
    u64 c[2];
    cudaError_t e = cudaMemcpy(len, m->d_len, (size_t)S * 4, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(resv, m->d_resv, (size_t)S * 8, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(c, m->counters, sizeof c, cudaMemcpyDeviceToHost);
    for (int32_t s = 0; s < S && e == cudaSuccess; s++) reserved[s] = resv[s];
    free(resv);
    if (e != cudaSuccess) return mkv_fail(err, MKV_STATUS_CUDA_ERROR, "collect: %s", cudaGetErrorString(e));
    counters[0] = (int64_t)c[0];
    counters[1] = (int64_t)c[1];
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_mm_set_slot(mkv_cuda_mm_t *m, int32_t slot, int32_t len, int64_t reserved,
                                             char *err)
{
    device_scope scope(m->device);
    const long long r = reserved;
    CUDA_TRY(cudaMemcpy(m->d_len + slot, &len, 4, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(m->d_resv + slot, &r, 8, cudaMemcpyHostToDevice));
    return MKV_STATUS_OK;
}

void mkv_cuda_mm_get_view(mkv_cuda_mm_t *mm, mkv_cuda_mm_view_t *out)
{
    out->table = mm->table;
    out->n_hi = mm->n_hi;
    out->n_lo = mm->n_lo;
    out->pool = mm->pool;
    out->device = mm->device;
    out->len = mm->d_len;
    out->fail = &mm->d_fail->code;
    out->fail_rec = mm->d_fail;
    out->fail_host = mm->d_fail_map;
    out->check_code = &mm->d_status->code;
    out->empty_region = mkv_mm_regions(&mm->g);
}

extern "C" mkv_status_t mkv_cuda_mm_download(mkv_cuda_mm_t *m, mkv_mm_state_t *st, char *err)
{
    const mkv_mm_geom_t *g = &m->g;
    const int64_t regions = mkv_mm_regions(g);
    u64 counters[2];
    device_scope scope(m->device);
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaMemcpy(st->ring, m->ring, (size_t)g->pool_pages * 4, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(st->table, m->table, (size_t)(regions * g->row_entries) * 4, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(st->n_hi, m->n_hi, (size_t)regions * 4, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(st->n_lo, m->n_lo, (size_t)regions * 4, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(counters, m->counters, sizeof counters, cudaMemcpyDeviceToHost));
    st->head = (int64_t)counters[0];
    st->tail = (int64_t)counters[1];
    return MKV_STATUS_OK;
}

/* Finishes a reduction into d_red->sums: copies it back. */
static mkv_status_t finish_reduction(mkv_cuda_mm_t *m, char *err)
{
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpy(m->h_status, m->d_red, sizeof(dev_status), cudaMemcpyDeviceToHost));
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_mm_sums(mkv_cuda_mm_t *m, int32_t slot, int64_t out[4], char *err)
{
    const mkv_mm_geom_t *g = &m->g;
    const int64_t per_slot = (int64_t)g->n_layers * g->n_kv_heads;
    const int64_t r0 = slot >= 0 ? slot * per_slot : 0, n = slot >= 0 ? per_slot : mkv_mm_regions(g);
    device_scope scope(m->device);
    CUDA_TRY(cudaMemset(m->d_red, 0, sizeof(dev_status)));
    const int grid = grid_for(n, 256) < 1024 ? grid_for(n, 256) : 1024;
    sums_kernel<<<grid, 256>>>(m->n_hi, m->n_lo, r0, n, g->tpp_hi, g->tpp_lo, m->d_red);
    const mkv_status_t st = finish_reduction(m, err);
    if (st != MKV_STATUS_OK) return st;
    for (int k = 0; k < 4; k++) out[k] = m->h_status->sums[k];
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_mm_step_demand(mkv_cuda_mm_t *m, int32_t n_slots, const int32_t *slots,
                                                const uint8_t *lo_can_grow, int64_t *out, char *err)
{
    const mkv_mm_geom_t *g = &m->g;
    const int64_t per_slot = (int64_t)g->n_layers * g->n_kv_heads, n = n_slots * per_slot;
    device_scope scope(m->device);
    CUDA_TRY(cudaMemset(m->d_red, 0, sizeof(dev_status)));
    if (n > 0) {
        CUDA_TRY(cudaMemcpy(m->d_args, slots, (size_t)n_slots * 4, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMemcpy(m->d_flags, lo_can_grow, (size_t)n_slots, cudaMemcpyHostToDevice));
        const int grid = grid_for(n, 256) < 1024 ? grid_for(n, 256) : 1024;
        demand_kernel<<<grid, 256>>>(m->d_args, m->d_flags, n, per_slot, m->n_hi, m->n_lo, g->tpp_hi,
                                     g->tpp_lo, m->d_red);
    }
    const mkv_status_t st = finish_reduction(m, err);
    if (st != MKV_STATUS_OK) return st;
    *out = m->h_status->sums[0];
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_mm_validate(mkv_cuda_mm_t *m, const uint8_t *active, const int32_t *seq_len,
                                             int64_t *violations, char *err)
{
    const mkv_mm_geom_t *g = &m->g;
    const int64_t regions = mkv_mm_regions(g), P = g->pool_pages;
    device_scope scope(m->device);
    CUDA_TRY(cudaMemset(m->d_red, 0, sizeof(dev_status)));
    CUDA_TRY(cudaMemset(m->own, 0, (size_t)P * 4));
    CUDA_TRY(cudaMemcpy(m->d_flags, active, (size_t)g->max_seqs, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(m->d_seq, seq_len, (size_t)g->max_seqs * 4, cudaMemcpyHostToDevice));
    const int gp = grid_for(P, 256) < 1024 ? grid_for(P, 256) : 1024;
    own_free_kernel<<<gp, 256>>>(m->ring, m->counters, P, m->own, m->d_red);
    own_rows_kernel<<<grid_for(regions, 128), 128>>>(m->table, m->n_hi, m->n_lo, m->d_flags, m->d_seq,
                                                     regions, (int64_t)g->n_layers * g->n_kv_heads,
                                                     g->row_entries, g->tpp_hi, g->tpp_lo, P, m->own,
                                                     m->d_red);
    own_check_kernel<<<gp, 256>>>(m->own, P, m->d_red);
    const mkv_status_t st = finish_reduction(m, err);
    if (st != MKV_STATUS_OK) return st;
    *violations = m->h_status->sums[0];
    return MKV_STATUS_OK;
}
