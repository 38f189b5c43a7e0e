/*
 * cuda_mm.cu — the CUDA memory manager (see cuda_mm.h). Kernels first, then launchers, then the
 * entry points. Every kernel mirrors a phase of memmgr/resize.c: section 2i is head-region i's
 * high section and 2i + 1 its low section, head-region i = (j * L + layer) * H + head of the
 * j-th listed slot; recycled pages go to ring[(tail + offset + k) % P] in section order and new
 * pages come from ring[(head + offset + k) % P], so the CPU and GPU states stay identical.
 */
#include "memmgr/cuda_mm.h"

#include "common/error.h"

#include <cub/device/device_scan.cuh>
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

struct mkv_cuda_mm {
    mkv_mm_geom_t g;
    int32_t device;
    int32_t *ring;     /* [P] */
    int32_t *table;    /* [S][L][H][T] */
    int32_t *n_hi, *n_lo;       /* [S][L][H] */
    u64 *counters;     /* [2] head, tail */
    uint8_t *pool;     /* [P * page_bytes] or NULL */
    /* workspace, sized for every head-region at once */
    int32_t *target, *alloc, *release, *alloc_off, *rel_off; /* [2 * S * L * H] */
    void *cub_temp;
    size_t cub_bytes;
    int32_t *d_slots, *d_new_len; /* [S] */
    uint8_t *d_flags;             /* [S] */
    int32_t *d_seq;               /* [S] */
    int32_t *own;                 /* [P] validate: how many places hold each page */
    dev_status *d_status;
    /* pinned host staging */
    int32_t *h_slots, *h_new_len, *h_seq;
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
    int64_t n_regions;
    int64_t per_slot; /* L * H */
    int32_t T, tpp_hi, tpp_lo;
    int64_t P;
    const int32_t *slots, *new_len, *tgt_hi, *tgt_lo;
};

__device__ __forceinline__ int64_t region_of(const call_args &a, int64_t i)
{
    return (int64_t)a.slots[i / a.per_slot] * a.per_slot + i % a.per_slot;
}

/* Phase 1: targets, pages gained and released per section; invalid targets flagged. */
static __global__ void plan_kernel(call_args a, const int32_t *n_hi, const int32_t *n_lo,
                                   int32_t *target, int32_t *alloc, int32_t *release, dev_status *st)
{
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= a.n_regions) return;
    const int64_t r = region_of(a, i);
    int32_t hi, lo;
    if (a.kind == MKV_CUDA_OP_RESIZE) {
        hi = a.tgt_hi[i];
        lo = a.tgt_lo[i];
        if (hi < 0 || lo < 0 || (long long)hi + lo > a.new_len[i / a.per_slot]) {
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
    const int32_t cur[2] = {n_hi[r], n_lo[r]}, tgt[2] = {hi, lo}, tpp[2] = {a.tpp_hi, a.tpp_lo};
    for (int sec = 0; sec < 2; sec++) {
        const int32_t k_old = pages_for(cur[sec], tpp[sec]), k_new = pages_for(tgt[sec], tpp[sec]);
        target[2 * i + sec] = tgt[sec];
        alloc[2 * i + sec] = k_new > k_old ? k_new - k_old : 0;
        release[2 * i + sec] = k_old > k_new ? k_old - k_new : 0;
    }
}

/* Phase 2's decision, one thread: the fit check against the counters. */
static __global__ void check_kernel(int64_t sections, const int32_t *alloc, const int32_t *alloc_off,
                                    const int32_t *release, const int32_t *rel_off, const u64 *counters,
                                    long long others_reserved, const int32_t *tgt_hi,
                                    const int32_t *tgt_lo, dev_status *st)
{
    const long long ta = sections ? (long long)alloc_off[sections - 1] + alloc[sections - 1] : 0;
    const long long tr = sections ? (long long)rel_off[sections - 1] + release[sections - 1] : 0;
    const long long free_pages = (long long)(counters[1] - counters[0]);
    st->total_alloc = ta;
    st->total_release = tr;
    st->head = counters[0];
    st->tail = counters[1];
    if (st->bad_region != ~0ull) {
        st->code = MKV_STATUS_INVALID_ARGUMENT;
        st->bad_hi = tgt_hi[st->bad_region];
        st->bad_lo = tgt_lo[st->bad_region];
    } else if (ta > free_pages + tr - others_reserved) {
        st->code = MKV_STATUS_OUT_OF_PAGES;
    } else {
        st->code = MKV_STATUS_OK;
    }
}

/* Phase 3: shrinking sections write their last pages to the ring's tail. */
static __global__ void recycle_kernel(call_args a, const int32_t *target, const int32_t *release,
                                      const int32_t *rel_off, int32_t *ring, int32_t *table,
                                      const dev_status *st)
{
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= a.n_regions || st->code != MKV_STATUS_OK) return;
    int32_t *row = table + region_of(a, i) * a.T;
    const u64 tail = st->tail;
    for (int sec = 0; sec < 2; sec++) {
        const int32_t n = release[2 * i + sec];
        if (n == 0) continue;
        const int32_t k_new = pages_for(target[2 * i + sec], sec ? a.tpp_lo : a.tpp_hi);
        const u64 base = tail + (u64)rel_off[2 * i + sec];
        for (int32_t k = 0; k < n; k++) {
            int32_t *e = entry(row, a.T, sec, k_new + k);
            ring[(base + k) % (u64)a.P] = *e;
            *e = -1;
        }
    }
}

/* Phase 4: growing sections take pages from the ring's head; counts are committed. */
static __global__ void allocate_kernel(call_args a, const int32_t *target, const int32_t *alloc,
                                       const int32_t *alloc_off, const int32_t *ring, int32_t *table,
                                       int32_t *n_hi, int32_t *n_lo, const dev_status *st)
{
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= a.n_regions || st->code != MKV_STATUS_OK) return;
    const int64_t r = region_of(a, i);
    int32_t *row = table + r * a.T;
    const u64 head = st->head;
    const int32_t cur[2] = {n_hi[r], n_lo[r]};
    for (int sec = 0; sec < 2; sec++) {
        const int32_t n = alloc[2 * i + sec];
        if (n == 0) continue;
        const int32_t k_old = pages_for(cur[sec], sec ? a.tpp_lo : a.tpp_hi);
        const u64 base = head + (u64)alloc_off[2 * i + sec];
        for (int32_t k = 0; k < n; k++) *entry(row, a.T, sec, k_old + k) = ring[(base + k) % (u64)a.P];
    }
    n_hi[r] = target[2 * i];
    n_lo[r] = target[2 * i + 1];
}

static __global__ void finalize_kernel(u64 *counters, dev_status *st)
{
    if (st->code != MKV_STATUS_OK) return;
    counters[0] += (u64)st->total_alloc;
    counters[1] += (u64)st->total_release;
    st->head = counters[0];
    st->tail = counters[1];
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
    for (int k = 0; k < 4; k++)
        if (s[k]) atomicAdd((u64 *)&st->sums[k], (u64)s[k]);
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
    if (s) atomicAdd((u64 *)&st->sums[0], (u64)s);
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
    cudaFree(m->alloc);
    cudaFree(m->release);
    cudaFree(m->alloc_off);
    cudaFree(m->rel_off);
    cudaFree(m->cub_temp);
    cudaFree(m->d_slots);
    cudaFree(m->d_new_len);
    cudaFree(m->d_flags);
    cudaFree(m->d_seq);
    cudaFree(m->own);
    cudaFree(m->d_status);
    cudaFreeHost(m->h_slots);
    cudaFreeHost(m->h_new_len);
    cudaFreeHost(m->h_seq);
    cudaFreeHost(m->h_flags);
    cudaFreeHost(m->h_status);
}

static mkv_status_t create(mkv_cuda_mm_t *m, int64_t pool_bytes, char *err)
{
    const mkv_mm_geom_t *g = &m->g;
    const int64_t regions = mkv_mm_regions(g), sections = 2 * regions, S = g->max_seqs;
    const int64_t entries = regions * g->row_entries, P = g->pool_pages;
    CUDA_TRY(cudaSetDevice(m->device));
    CUDA_TRY(cudaMalloc((void **)&m->ring, (size_t)P * 4));
    CUDA_TRY(cudaMalloc((void **)&m->table, (size_t)entries * 4));
    CUDA_TRY(cudaMalloc((void **)&m->n_hi, (size_t)regions * 4));
    CUDA_TRY(cudaMalloc((void **)&m->n_lo, (size_t)regions * 4));
    CUDA_TRY(cudaMalloc((void **)&m->counters, 2 * sizeof(u64)));
    if (pool_bytes > 0) CUDA_TRY(cudaMalloc((void **)&m->pool, (size_t)pool_bytes));
    CUDA_TRY(cudaMalloc((void **)&m->target, (size_t)sections * 4));
    CUDA_TRY(cudaMalloc((void **)&m->alloc, (size_t)sections * 4));
    CUDA_TRY(cudaMalloc((void **)&m->release, (size_t)sections * 4));
    CUDA_TRY(cudaMalloc((void **)&m->alloc_off, (size_t)sections * 4));
    CUDA_TRY(cudaMalloc((void **)&m->rel_off, (size_t)sections * 4));
    CUDA_TRY(cub::DeviceScan::ExclusiveSum(NULL, m->cub_bytes, m->alloc, m->alloc_off, (int)sections));
    CUDA_TRY(cudaMalloc(&m->cub_temp, m->cub_bytes > 0 ? m->cub_bytes : 1));
    CUDA_TRY(cudaMalloc((void **)&m->d_slots, (size_t)S * 4));
    CUDA_TRY(cudaMalloc((void **)&m->d_new_len, (size_t)S * 4));
    CUDA_TRY(cudaMalloc((void **)&m->d_flags, (size_t)S));
    CUDA_TRY(cudaMalloc((void **)&m->d_seq, (size_t)S * 4));
    CUDA_TRY(cudaMalloc((void **)&m->own, (size_t)P * 4));
    CUDA_TRY(cudaMalloc((void **)&m->d_status, sizeof(dev_status)));
    CUDA_TRY(cudaMallocHost((void **)&m->h_slots, (size_t)S * 4));
    CUDA_TRY(cudaMallocHost((void **)&m->h_new_len, (size_t)S * 4));
    CUDA_TRY(cudaMallocHost((void **)&m->h_seq, (size_t)S * 4));
    CUDA_TRY(cudaMallocHost((void **)&m->h_flags, (size_t)S));
    CUDA_TRY(cudaMallocHost((void **)&m->h_status, sizeof(dev_status)));
    /* The initial state, as mkv_mm_state_init writes it on the host. */
    init_kernel<<<grid_for(P + entries, 256) < 4096 ? grid_for(P + entries, 256) : 4096, 256>>>(
        m->ring, P, m->table, entries);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemset(m->n_hi, 0, (size_t)regions * 4));
    CUDA_TRY(cudaMemset(m->n_lo, 0, (size_t)regions * 4));
    const u64 counters[2] = {0, (u64)P};
    CUDA_TRY(cudaMemcpy(m->counters, counters, sizeof counters, cudaMemcpyHostToDevice));
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
    const mkv_status_t st = create(m, pool_bytes, err);
    if (st != MKV_STATUS_OK) {
        free_all(m);
        free(m);
        (void)cudaGetLastError();
        return st == MKV_STATUS_CUDA_ERROR ? mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "%s", err) : st;
    }
    *out = m;
    return MKV_STATUS_OK;
}

extern "C" void mkv_cuda_mm_destroy(mkv_cuda_mm_t *m)
{
    if (!m) return;
    cudaSetDevice(m->device);
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
    a.per_slot = (int64_t)g->n_layers * g->n_kv_heads;
    a.n_regions = (int64_t)op->n_slots * a.per_slot;
    a.T = g->row_entries;
    a.tpp_hi = g->tpp_hi;
    a.tpp_lo = g->tpp_lo;
    a.P = g->pool_pages;
    a.slots = m->d_slots;
    a.new_len = m->d_new_len;
    a.tgt_hi = op->tgt_hi;
    a.tgt_lo = op->tgt_lo;
    const int64_t sections = 2 * a.n_regions;
    CUDA_TRY(cudaSetDevice(m->device));
    memcpy(m->h_slots, op->slots, (size_t)op->n_slots * 4);
    CUDA_TRY(cudaMemcpyAsync(m->d_slots, m->h_slots, (size_t)op->n_slots * 4, cudaMemcpyHostToDevice, stream));
    if (op->kind == MKV_CUDA_OP_RESIZE) {
        memcpy(m->h_new_len, op->new_len, (size_t)op->n_slots * 4);
        CUDA_TRY(cudaMemcpyAsync(m->d_new_len, m->h_new_len, (size_t)op->n_slots * 4,
                                 cudaMemcpyHostToDevice, stream));
    }
    CUDA_TRY(cudaMemsetAsync(m->d_status, 0xff, sizeof(dev_status), stream)); /* bad_region = ~0 */
    const int block = 256, grid = grid_for(a.n_regions, block);
    if (a.n_regions > 0) {
        plan_kernel<<<grid, block, 0, stream>>>(a, m->n_hi, m->n_lo, m->target, m->alloc, m->release,
                                                m->d_status);
        CUDA_TRY(cudaGetLastError());
        size_t bytes = m->cub_bytes;
        CUDA_TRY(cub::DeviceScan::ExclusiveSum(m->cub_temp, bytes, m->alloc, m->alloc_off, (int)sections, stream));
        CUDA_TRY(cub::DeviceScan::ExclusiveSum(m->cub_temp, bytes, m->release, m->rel_off, (int)sections, stream));
    }
    check_kernel<<<1, 1, 0, stream>>>(sections, m->alloc, m->alloc_off, m->release, m->rel_off,
                                      m->counters, (long long)op->others_reserved, op->tgt_hi,
                                      op->tgt_lo, m->d_status);
    CUDA_TRY(cudaGetLastError());
    if (!op->dry_run && a.n_regions > 0) {
        recycle_kernel<<<grid, block, 0, stream>>>(a, m->target, m->release, m->rel_off, m->ring,
                                                   m->table, m->d_status);
        allocate_kernel<<<grid, block, 0, stream>>>(a, m->target, m->alloc, m->alloc_off, m->ring,
                                                    m->table, m->n_hi, m->n_lo, m->d_status);
        finalize_kernel<<<1, 1, 0, stream>>>(m->counters, m->d_status);
        CUDA_TRY(cudaGetLastError());
    }
    CUDA_TRY(cudaMemcpyAsync(m->h_status, m->d_status, sizeof(dev_status), cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(cudaStreamSynchronize(stream));
    const dev_status *s = m->h_status;
    op->head = (int64_t)s->head;
    op->tail = (int64_t)s->tail;
    op->total_alloc = s->total_alloc;
    op->total_release = s->total_release;
    op->bad_region = s->bad_region == ~0ull ? -1 : (int64_t)s->bad_region;
    op->bad_hi = s->bad_hi;
    op->bad_lo = s->bad_lo;
    return (mkv_status_t)s->code;
}

extern "C" mkv_status_t mkv_cuda_mm_download(mkv_cuda_mm_t *m, mkv_mm_state_t *st, char *err)
{
    const mkv_mm_geom_t *g = &m->g;
    const int64_t regions = mkv_mm_regions(g);
    u64 counters[2];
    CUDA_TRY(cudaSetDevice(m->device));
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

/* Runs a reduction into d_status->sums and copies the status back. */
static mkv_status_t finish_reduction(mkv_cuda_mm_t *m, char *err)
{
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpy(m->h_status, m->d_status, sizeof(dev_status), cudaMemcpyDeviceToHost));
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_mm_sums(mkv_cuda_mm_t *m, int32_t slot, int64_t out[4], char *err)
{
    const mkv_mm_geom_t *g = &m->g;
    const int64_t per_slot = (int64_t)g->n_layers * g->n_kv_heads;
    const int64_t r0 = slot >= 0 ? slot * per_slot : 0, n = slot >= 0 ? per_slot : mkv_mm_regions(g);
    CUDA_TRY(cudaSetDevice(m->device));
    CUDA_TRY(cudaMemset(m->d_status, 0, sizeof(dev_status)));
    const int grid = grid_for(n, 256) < 1024 ? grid_for(n, 256) : 1024;
    sums_kernel<<<grid, 256>>>(m->n_hi, m->n_lo, r0, n, g->tpp_hi, g->tpp_lo, m->d_status);
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
    CUDA_TRY(cudaSetDevice(m->device));
    CUDA_TRY(cudaMemset(m->d_status, 0, sizeof(dev_status)));
    if (n > 0) {
        CUDA_TRY(cudaMemcpy(m->d_slots, slots, (size_t)n_slots * 4, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaMemcpy(m->d_flags, lo_can_grow, (size_t)n_slots, cudaMemcpyHostToDevice));
        const int grid = grid_for(n, 256) < 1024 ? grid_for(n, 256) : 1024;
        demand_kernel<<<grid, 256>>>(m->d_slots, m->d_flags, n, per_slot, m->n_hi, m->n_lo, g->tpp_hi,
                                     g->tpp_lo, m->d_status);
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
    CUDA_TRY(cudaSetDevice(m->device));
    CUDA_TRY(cudaMemset(m->d_status, 0, sizeof(dev_status)));
    CUDA_TRY(cudaMemset(m->own, 0, (size_t)P * 4));
    CUDA_TRY(cudaMemcpy(m->d_flags, active, (size_t)g->max_seqs, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(m->d_seq, seq_len, (size_t)g->max_seqs * 4, cudaMemcpyHostToDevice));
    const int gp = grid_for(P, 256) < 1024 ? grid_for(P, 256) : 1024;
    own_free_kernel<<<gp, 256>>>(m->ring, m->counters, P, m->own, m->d_status);
    own_rows_kernel<<<grid_for(regions, 128), 128>>>(m->table, m->n_hi, m->n_lo, m->d_flags, m->d_seq,
                                                     regions, (int64_t)g->n_layers * g->n_kv_heads,
                                                     g->row_entries, g->tpp_hi, g->tpp_lo, P, m->own,
                                                     m->d_status);
    own_check_kernel<<<gp, 256>>>(m->own, P, m->d_status);
    const mkv_status_t st = finish_reduction(m, err);
    if (st != MKV_STATUS_OK) return st;
    *violations = m->h_status->sums[0];
    return MKV_STATUS_OK;
}
