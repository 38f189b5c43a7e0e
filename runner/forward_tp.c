/*
 * forward_tp.c — tensor parallelism over the GPUs of one host (runner/forward_tp.h).
 *
 * A group holds n rank passes (runner/forward_cuda.h, each on its device), NCCL communicators
 * from one ncclCommInitAll, a stream per rank for the all-reduces, and a thread pool of n
 * threads (runner/parallel.h; the caller is rank 0, the others spin briefly between calls, as
 * a decode step comes right after the last). A forward call is published to the pool and
 * runs rank r's pass on cache r in thread r; the ranks meet only in the all-reduces.
 *
 * The all-reduce runs on the rank's own stream, created blocking: it waits for the work the
 * pass queued on the legacy default stream before it, and the pass's later work waits for it,
 * with no event between them.
 *
 * The ranks meet on a host barrier before and after queueing their parts of an all-reduce.
 * Without it, one process driving several GPUs from several threads deadlocks: a rank whose
 * NCCL kernel waits for a peer's part holds its device busy, while the peer's thread, before
 * queueing that part, blocks in a call that takes the driver's lock and waits for a device
 * (cudaFree, cudaMalloc, a copy to pageable host memory: the cache's prefill makes such
 * calls) behind a thread waiting for that busy device. Seen on two H200s as a hang of
 * serve-bench; the tests, with less work in flight, had passed. Outside the two barriers,
 * every queued NCCL kernel has all its peers queued, so it finishes whatever the threads do.
 */
#include "runner/forward_tp.h"

#include "runner/error.h"
#include "runner/parallel.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if MKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if MKV_HAVE_CUDA && MKV_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#define TP_NCCL 1
#else
#define TP_NCCL 0
#endif

#if TP_NCCL
/* The NCCL entry points the group uses, from dlopen. */
typedef struct nccl_api {
    void *lib;
    ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
} nccl_api_t;
#endif

typedef struct tp_rank {
    mkv_tp_t *tp;
    int32_t r;
} tp_rank_t;

/* A spinning barrier of n threads (sense by generation): the all-reduces' meeting point. A
 * rank whose call fails raises `failed`, so the others stop waiting for it instead of
 * hanging (before the barrier ahead of an all-reduce, none has queued its part yet). */
typedef struct tp_barrier {
    atomic_int arrived;
    atomic_uint generation;
    atomic_int failed;
    int n;
} tp_barrier_t;

#if TP_NCCL
/* 0 once every rank has arrived; -1 when a rank failed. */
static int barrier_wait(tp_barrier_t *b)
{
    if (atomic_load(&b->failed)) return -1;
    const unsigned g = atomic_load(&b->generation);
    if (atomic_fetch_add(&b->arrived, 1) == b->n - 1) {
        atomic_store(&b->arrived, 0);
        atomic_fetch_add(&b->generation, 1);
        return 0;
    }
    for (long spins = 0; atomic_load(&b->generation) == g; spins++) {
        if (atomic_load(&b->failed)) return -1;
        if (spins > (1 << 12)) sched_yield();
    }
    return 0;
}
#endif

struct mkv_tp {
    int32_t n;
    mkv_cuda_forward_t *pass[MKV_TP_MAX_RANKS];
    mkv_forward_t fw[MKV_TP_MAX_RANKS];
    mkv_cache_t *caches[MKV_TP_MAX_RANKS]; /* bound by mkv_tp_forward */
    tp_rank_t rank[MKV_TP_MAX_RANKS];      /* the all-reduce's context */
    tp_barrier_t barrier;                  /* around each all-reduce queued */
    mkv_pool_t *pool;
#if TP_NCCL
    nccl_api_t nccl;
    ncclComm_t comm[MKV_TP_MAX_RANKS];
    cudaStream_t stream[MKV_TP_MAX_RANKS];
#endif
};

int32_t mkv_tp_ranks(const mkv_tp_t *tp) { return tp ? tp->n : 0; }

mkv_cuda_forward_t *mkv_tp_rank(mkv_tp_t *tp, int32_t r) { return tp && r >= 0 && r < tp->n ? tp->pass[r] : NULL; }

/* ---------------------------------------------------------------------------------------- */
/* NCCL                                                                                     */
/* ---------------------------------------------------------------------------------------- */

#if TP_NCCL
static mkv_status_t nccl_load(nccl_api_t *a, char *err)
{
    const char *env = getenv("MIXKV_NCCL_LIBRARY");
    const char *names[] = {env, "libnccl.so.2", "libnccl.so"};
    const char *why = "";
    for (size_t i = 0; i < sizeof names / sizeof *names && !a->lib; i++) {
        if (!names[i] || !*names[i]) continue;
        if (!(a->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL))) why = dlerror();
        if (env && i == 0 && !a->lib) break; /* the user's choice, or nothing */
    }
    if (!a->lib)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                           "tensor parallelism needs NCCL: cannot load %s (%s); set MIXKV_NCCL_LIBRARY",
                           env && *env ? env : "libnccl.so.2", why ? why : "");
    /* dlsym returns void *; the cast through a union keeps ISO C quiet. */
#define NCCL_SYM(field, name)                                                                  \
    do {                                                                                       \
        union { void *p; __typeof__(a->field) f; } u_;                                         \
        if (!(u_.p = dlsym(a->lib, name)))                                                     \
            return runner_fail(err, MKV_STATUS_UNSUPPORTED, "NCCL library lacks %s", name);    \
        a->field = u_.f;                                                                       \
    } while (0)
    NCCL_SYM(comm_init_all, "ncclCommInitAll");
    NCCL_SYM(all_reduce, "ncclAllReduce");
    NCCL_SYM(comm_destroy, "ncclCommDestroy");
    NCCL_SYM(error_string, "ncclGetErrorString");
#undef NCCL_SYM
    return MKV_STATUS_OK;
}

/* mkv_cuda_shard_t.all_reduce: x summed over the ranks, in place, on the rank's stream. */
static mkv_status_t tp_all_reduce(void *ctx, float *x, int64_t n, char *err)
{
    const tp_rank_t *rk = ctx;
    mkv_tp_t *tp = rk->tp;
    if (barrier_wait(&tp->barrier) < 0)
        return runner_fail(err, MKV_STATUS_CUDA_ERROR, "rank %d: another rank failed this call", rk->r);
    const ncclResult_t e = tp->nccl.all_reduce(x, x, (size_t)n, ncclFloat32, ncclSum, tp->comm[rk->r],
                                               tp->stream[rk->r]);
    /* every rank's part is queued (or has failed to be); the sum is on its way either way */
    if (barrier_wait(&tp->barrier) < 0 && e == ncclSuccess)
        return runner_fail(err, MKV_STATUS_CUDA_ERROR, "rank %d: another rank failed this call", rk->r);
    if (e != ncclSuccess)
        return runner_fail(err, MKV_STATUS_CUDA_ERROR, "rank %d: ncclAllReduce of %lld floats: %s", rk->r,
                           (long long)n, tp->nccl.error_string(e));
    return MKV_STATUS_OK;
}
#endif

/* ---------------------------------------------------------------------------------------- */
/* Create and free                                                                          */
/* ---------------------------------------------------------------------------------------- */

void mkv_tp_free(mkv_tp_t *tp)
{
    if (!tp) return;
    for (int32_t r = 0; r < tp->n; r++) mkv_cuda_forward_free(tp->pass[r]);
#if TP_NCCL
    for (int32_t r = 0; r < tp->n; r++) {
        if (tp->comm[r]) tp->nccl.comm_destroy(tp->comm[r]);
        if (tp->stream[r]) {
            cudaSetDevice(r);
            cudaStreamDestroy(tp->stream[r]);
        }
    }
    if (tp->nccl.lib) dlclose(tp->nccl.lib);
#endif
    mkv_pool_destroy(tp->pool);
    free(tp);
}

mkv_status_t mkv_tp_create(const mkv_model_t *m, const mkv_model_config_t *dummy, uint64_t seed, int32_t n_ranks,
                           int32_t max_tokens, mkv_dtype_t dtype, mkv_tp_t **out, char *err)
{
    if (!out || (!m && !dummy)) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_tp_create: null argument");
    *out = NULL;
    if (n_ranks < 1 || n_ranks > MKV_TP_MAX_RANKS)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "tensor parallelism: %d ranks (1 to %d)", n_ranks,
                           MKV_TP_MAX_RANKS);
    const mkv_model_config_t *c = m ? &m->cfg : dummy;
    if (c->n_heads % n_ranks || c->n_kv_heads % n_ranks || c->intermediate % n_ranks)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                           "tensor parallelism: %d ranks do not divide the model's %d heads, %d KV heads and "
                           "FFN width %d",
                           n_ranks, c->n_heads, c->n_kv_heads, c->intermediate);
#if !MKV_HAVE_CUDA
    (void)seed, (void)max_tokens, (void)dtype;
    return runner_fail(err, MKV_STATUS_UNSUPPORTED, "this build has no CUDA (configured with MIXKV_CUDA=OFF)");
#else
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) {
        (void)cudaGetLastError();
        n_dev = 0;
    }
    if (n_dev < n_ranks)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "tensor parallelism over %d GPUs: the runtime sees %d",
                           n_ranks, n_dev);
#if !TP_NCCL
    if (n_ranks > 1)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                           "tensor parallelism over %d GPUs: this build has no NCCL (nccl.h was not found)",
                           n_ranks);
#endif
    mkv_tp_t *tp = calloc(1, sizeof *tp);
    if (!tp) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the tensor-parallel group");
    tp->n = n_ranks;
    tp->barrier.n = n_ranks;
    mkv_status_t status = MKV_STATUS_OK;
    int prev = 0;
    cudaGetDevice(&prev);
    if (!(tp->pool = mkv_pool_create(n_ranks))) {
        status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot start %d rank threads", n_ranks);
        goto fail;
    }
#if TP_NCCL
    if (n_ranks > 1) {
        RUNNER_TRY(nccl_load(&tp->nccl, err));
        int devs[MKV_TP_MAX_RANKS];
        for (int32_t r = 0; r < n_ranks; r++) devs[r] = r;
        const ncclResult_t e = tp->nccl.comm_init_all(tp->comm, n_ranks, devs);
        if (e != ncclSuccess) {
            memset(tp->comm, 0, sizeof tp->comm);
            status = runner_fail(err, MKV_STATUS_CUDA_ERROR, "ncclCommInitAll over %d GPUs: %s", n_ranks,
                                 tp->nccl.error_string(e));
            goto fail;
        }
    }
#endif
    for (int32_t r = 0; r < n_ranks; r++) {
        mkv_cuda_shard_t sh = {r, n_ranks, NULL, NULL};
        tp->rank[r].tp = tp;
        tp->rank[r].r = r;
        if (cudaSetDevice(r) != cudaSuccess) {
            status = runner_fail(err, MKV_STATUS_CUDA_ERROR, "cudaSetDevice(%d): %s", r,
                                 cudaGetErrorString(cudaGetLastError()));
            goto fail;
        }
#if TP_NCCL
        if (n_ranks > 1) {
            if (cudaStreamCreate(&tp->stream[r]) != cudaSuccess) {
                tp->stream[r] = NULL;
                status = runner_fail(err, MKV_STATUS_CUDA_ERROR, "cudaStreamCreate on device %d: %s", r,
                                     cudaGetErrorString(cudaGetLastError()));
                goto fail;
            }
            sh.all_reduce = tp_all_reduce;
            sh.ctx = &tp->rank[r];
        }
#endif
        RUNNER_TRY(m ? mkv_cuda_forward_create_ex(m, &sh, max_tokens, dtype, &tp->pass[r], err)
                     : mkv_cuda_forward_create_dummy_ex(dummy, seed, &sh, max_tokens, dtype, &tp->pass[r], err));
        tp->fw[r] = mkv_cuda_forward(tp->pass[r]);
    }
    cudaSetDevice(prev);
    *out = tp;
    return MKV_STATUS_OK;
fail:
    cudaSetDevice(prev);
    mkv_tp_free(tp);
    return status;
#endif
}

mkv_status_t mkv_tp_set_timing(mkv_tp_t *tp, int on)
{
    if (!tp) return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "mkv_tp_set_timing: null group");
    for (int32_t r = 0; r < tp->n; r++) {
        const mkv_status_t st = mkv_cuda_forward_set_timing(tp->pass[r], on);
        if (st != MKV_STATUS_OK) return st;
    }
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* The calls                                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef enum call_kind { CALL_PREFILL, CALL_PREFILL_BATCH, CALL_DECODE, CALL_GREEDY, CALL_SAMPLE } call_kind_t;

/* One forward call, as every rank runs it: the same arguments (only rank 0 writes outputs). */
typedef struct tp_call {
    mkv_tp_t *tp;
    call_kind_t kind;
    int32_t slot, n, n_slots;
    const int32_t *slots, *tokens, *lens;
    float *logits, *last_logits;
    int32_t *next;
    const float *temperature, *top_p;
    const double *u;
    mkv_status_t st[MKV_TP_MAX_RANKS];
    char err[MKV_TP_MAX_RANKS][MKV_ERR_LEN];
} tp_call_t;

static void run_rank(void *ctx, int64_t begin, int64_t end, int32_t part)
{
    (void)part;
    tp_call_t *a = ctx;
    for (int64_t r = begin; r < end; r++) {
        const mkv_forward_t *fw = &a->tp->fw[r];
        mkv_cache_t *c = a->tp->caches[r];
        mkv_status_t st = MKV_STATUS_INTERNAL;
        switch (a->kind) {
        case CALL_PREFILL: st = fw->prefill(fw->ctx, c, a->slot, a->tokens, a->n, a->logits, a->last_logits); break;
        case CALL_PREFILL_BATCH:
            st = fw->prefill_batch(fw->ctx, c, a->n_slots, a->slots, a->tokens, a->lens, a->last_logits);
            break;
        case CALL_DECODE: st = fw->decode(fw->ctx, c, a->n_slots, a->slots, a->tokens, a->logits); break;
        case CALL_GREEDY: st = fw->decode_greedy(fw->ctx, c, a->n_slots, a->slots, a->tokens, a->next); break;
        case CALL_SAMPLE:
            st = fw->decode_sample(fw->ctx, c, a->n_slots, a->slots, a->tokens, a->temperature, a->top_p, a->u,
                                   a->next);
            break;
        }
        a->st[r] = st;
        if (st != MKV_STATUS_OK) {
            snprintf(a->err[r], MKV_ERR_LEN, "%s", mkv_last_error());
            atomic_store(&a->tp->barrier.failed, 1); /* no rank waits for this one any more */
        }
    }
}

/* Runs the call on every rank; the first failing rank's status and message. */
static mkv_status_t run(mkv_tp_t *tp, mkv_cache_t *cache, tp_call_t *a)
{
    if (cache != tp->caches[0])
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "tensor-parallel pass: handed a cache that is not rank 0's (mkv_tp_forward)");
    a->tp = tp;
    atomic_store(&tp->barrier.failed, 0);
    atomic_store(&tp->barrier.arrived, 0);
    mkv_pool_run(tp->pool, run_rank, a, tp->n);
    /* the first rank that failed on its own, not one that stopped because another had */
    for (int32_t r = 0; r < tp->n; r++)
        if (a->st[r] != MKV_STATUS_OK && !strstr(a->err[r], "another rank failed"))
            return tp->n == 1 ? mkv_report_error(a->st[r], "%s", a->err[r])
                              : mkv_report_error(a->st[r], "rank %d: %s", r, a->err[r]);
    for (int32_t r = 0; r < tp->n; r++)
        if (a->st[r] != MKV_STATUS_OK)
            return tp->n == 1 ? mkv_report_error(a->st[r], "%s", a->err[r])
                              : mkv_report_error(a->st[r], "rank %d: %s", r, a->err[r]);
    return MKV_STATUS_OK;
}

/* Before a decode step: every rank's cache has the pages its append and compress may take, so
 * a refusal comes before any rank has changed. */
static mkv_status_t check_step(mkv_tp_t *tp, int32_t n_slots, const int32_t *slots)
{
    if (tp->n == 1) return MKV_STATUS_OK; /* one cache: its own refusal changes nothing */
    for (int32_t r = 0; r < tp->n; r++) {
        int64_t demand;
        mkv_cache_stats_t cs;
        mkv_status_t st = mkv_cache_step_demand(tp->caches[r], n_slots, slots, &demand);
        if (st == MKV_STATUS_OK) st = mkv_cache_stats(tp->caches[r], &cs);
        if (st != MKV_STATUS_OK)
            return mkv_report_error(st, "rank %d: %s", r, mkv_cache_last_error(tp->caches[r]));
        if (demand > cs.available_pages)
            return mkv_report_error(MKV_STATUS_OUT_OF_PAGES,
                                    "rank %d: a decode step of %d slots may take %lld pages; %lld are available", r,
                                    n_slots, (long long)demand, (long long)cs.available_pages);
    }
    return MKV_STATUS_OK;
}

static mkv_status_t tp_prefill(void *ctx, mkv_cache_t *cache, int32_t slot, const int32_t *tokens, int32_t n,
                               float *logits, float *last_logits)
{
    tp_call_t a = {.kind = CALL_PREFILL, .slot = slot, .tokens = tokens, .n = n, .logits = logits,
                   .last_logits = last_logits};
    return run(ctx, cache, &a);
}

static mkv_status_t tp_prefill_batch(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                     const int32_t *tokens, const int32_t *lens, float *last_logits)
{
    tp_call_t a = {.kind = CALL_PREFILL_BATCH, .n_slots = n_slots, .slots = slots, .tokens = tokens, .lens = lens,
                   .last_logits = last_logits};
    return run(ctx, cache, &a);
}

static mkv_status_t tp_decode(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                              const int32_t *tokens, float *logits)
{
    mkv_status_t st = check_step(ctx, n_slots, slots);
    tp_call_t a = {.kind = CALL_DECODE, .n_slots = n_slots, .slots = slots, .tokens = tokens, .logits = logits};
    return st == MKV_STATUS_OK ? run(ctx, cache, &a) : st;
}

static mkv_status_t tp_decode_greedy(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                     const int32_t *tokens, int32_t *next)
{
    mkv_status_t st = check_step(ctx, n_slots, slots);
    tp_call_t a = {.kind = CALL_GREEDY, .n_slots = n_slots, .slots = slots, .tokens = tokens, .next = next};
    return st == MKV_STATUS_OK ? run(ctx, cache, &a) : st;
}

static mkv_status_t tp_decode_sample(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                     const int32_t *tokens, const float *temperature, const float *top_p,
                                     const double *u, int32_t *next)
{
    mkv_status_t st = check_step(ctx, n_slots, slots);
    tp_call_t a = {.kind = CALL_SAMPLE, .n_slots = n_slots, .slots = slots, .tokens = tokens,
                   .temperature = temperature, .top_p = top_p, .u = u, .next = next};
    return st == MKV_STATUS_OK ? run(ctx, cache, &a) : st;
}

mkv_status_t mkv_tp_forward(mkv_tp_t *tp, mkv_cache_t *const *caches, mkv_forward_t *out)
{
    if (!tp || !caches || !out) return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "mkv_tp_forward: null argument");
    for (int32_t r = 0; r < tp->n; r++) {
        mkv_cache_info_t info;
        if (!caches[r]) return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "mkv_tp_forward: cache %d is null", r);
        mkv_status_t st = mkv_cache_info(caches[r], &info);
        if (st != MKV_STATUS_OK) return st;
        const mkv_model_config_t *c = mkv_cuda_forward_config(tp->pass[r]);
        const mkv_cache_config_t *k = &info.config;
        if (k->backend != MKV_BACKEND_CUDA || k->device_id != r || k->n_layers != c->n_layers ||
            k->n_kv_heads != c->n_kv_heads || k->group_size != c->n_heads / c->n_kv_heads || k->head_dim != c->head_dim)
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                    "mkv_tp_forward: cache %d is %s device %d, %d layers x %d KV heads (G %d, d %d); "
                                    "rank %d runs on CUDA device %d with %d layers x %d KV heads (G %d, d %d)",
                                    r, k->backend == MKV_BACKEND_CUDA ? "on CUDA" : "on the CPU, not on", k->device_id,
                                    k->n_layers, k->n_kv_heads, k->group_size, k->head_dim, r, r, c->n_layers,
                                    c->n_kv_heads, c->n_heads / c->n_kv_heads, c->head_dim);
    }
    for (int32_t r = 0; r < tp->n; r++) tp->caches[r] = caches[r];
    memset(out, 0, sizeof *out);
    const mkv_forward_t *f0 = &tp->fw[0];
    out->ctx = tp;
    out->vocab = f0->vocab;
    out->max_positions = f0->max_positions;
    out->max_tokens = f0->max_tokens;
    out->prefill = tp_prefill;
    out->decode = tp_decode;
    out->decode_greedy = tp_decode_greedy;
    out->decode_sample = tp_decode_sample;
    out->prefill_batch = tp_prefill_batch;
    return MKV_STATUS_OK;
}
