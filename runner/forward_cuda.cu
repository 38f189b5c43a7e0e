/*
 * forward_cuda.cu — the model runner's forward pass on CUDA (runner/forward_cuda.h).
 *
 * One layer, n tokens, element type T (f32, f16 or bf16) for weights and activations:
 *   a = rmsnorm(x) (T) -> [q | k | v] = a [Wq; Wk; Wv]^T (one cuBLAS GEMM, fp32 accumulation)
 *   -> q, k, v split out, RoPE on q and k (one kernel) ->
 *   the cache's attention (q, k, v -> att, all T) -> x += att Wo^T (the GEMM accumulates into
 *   the fp32 residual, beta 1) -> a = rmsnorm(x) -> [gate | up] (one GEMM) -> h = silu(gate) *
 *   up -> x += h Wdown^T.
 * The logits are a GEMM of the final norm's rows with lm_head into fp32, copied to the host
 * (mkv_forward_t hands logits to its driver), or turned into tokens on the device: greedy picks
 * (argmax_kernel, decode_greedy) or sampled ones (runner/sampling_cuda.h, decode_sample).
 * Every launch of a call goes to one stream (f->s): the legacy default stream, or with graphs
 * on (mkv_cuda_forward_set_graphs) a blocking stream of the pass's own, on which decode steps
 * are captured into a CUDA graph and replayed while the running batch stays the same.
 */
#include "runner/forward_cuda.h"

#include "runner/error.h"
#include "runner/sampling_cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

struct dev_layer {
    void *wqkv;   /* [H hd + 2 Hkv hd][D]: Wq, Wk, Wv stacked, one GEMM */
    void *w_gu;   /* [2 I][D]: W_gate, W_up stacked */
    void *wo, *w_down;
    float *attn_norm, *mlp_norm;
};

} // namespace

struct mkv_cuda_forward {
    mkv_model_config_t cfg; /* this rank's share: n_heads, n_kv_heads, intermediate divided */
    mkv_cuda_shard_t shard; /* {0, 1, NULL}: the whole model */
    mkv_dtype_t dtype;
    int32_t max_tokens;
    int device;
    cublasHandle_t blas;
    void *embed, *lm_head; /* [V][D] in dtype; the same pointer when tied */
    float *final_norm;
    dev_layer *layers;     /* host array of device pointers */
    /* scratch, [T] rows */
    float *x;              /* [T][D] residual stream */
    void *a;               /* [T][D] a block's normed input */
    void *qkv;             /* [T][H hd + 2 Hkv hd] the fused projection */
    void *q, *k, *v, *att; /* [T][H hd], [T][Hkv hd] x2, [T][H hd] */
    void *gu;              /* [T][2 I] gate and up */
    void *h;               /* [T][I] silu(gate) * up */
    float *logits;         /* [logit_rows][V] */
    int32_t logit_rows;    /* grows to the largest decode batch (a prefill needs one row) */
    float *rope;           /* [rope_len][hd / 2][2] cos, sin of every position so far */
    int32_t rope_len;
    int32_t *d_pos;        /* [T] the call's positions */
    int32_t *tok;          /* [T] */
    mkv_sample_row_t *rows; /* [T] decode_sample's per-row parameters */
    /* where a call's time goes (mkv_cuda_forward_set_timing): events at phase boundaries */
    int timing;
    cudaEvent_t *ev;       /* [MAX_MARKS] */
    int32_t *ev_cat;
    int32_t n_marks;
    double phase_ms[MKV_CUDA_PHASES];
    /* host scratch */
    double *inv_freq;      /* [hd / 2] */
    int32_t *h_tok;        /* [T], pinned: uploaded without waiting for the device */
    cudaEvent_t uploaded;  /* after the last upload from h_tok and pos */
    int32_t *pos;          /* [T] pinned: the call's positions */
    mkv_sample_row_t *h_rows; /* [T] */
    /* CUDA graphs of decode steps (mkv_cuda_forward_set_graphs) */
    cudaStream_t s;        /* every launch of a call: NULL, or gstream with graphs on */
    cudaStream_t gstream;  /* blocking: ordered with the legacy stream's work both ways */
    int graphs, capturing;
    int32_t horizon;       /* launches of a capture before the next */
    cudaGraphExec_t exec;  /* the captured step, or NULL */
    int32_t g_n, g_left, g_picks; /* what it was captured for: batch, launches left, picks */
    int32_t *g_slots;      /* [T] its slots */
    int64_t g_captures, g_updates, g_launches;
};

static void drop_graph(mkv_cuda_forward_t *f);
static mkv_status_t logit_rows_for(mkv_cuda_forward_t *f, int32_t n, char *err);

/* ---------------------------------------------------------------------------------------- */
/* Kernels                                                                                  */
/* ---------------------------------------------------------------------------------------- */

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void embed_kernel(const T *E, const int32_t *tok, int32_t D, float *x)
{
    const int32_t t = blockIdx.x;
    const T *row = E + (int64_t)tok[t] * D;
    for (int32_t i = threadIdx.x; i < D; i += blockDim.x) x[(int64_t)t * D + i] = to_f(row[i]);
}

/* One block per row: y = x / sqrt(mean(x^2) + eps) * w, the mean in double as on the CPU. */
template <typename T>
__global__ void rmsnorm_kernel(const float *x, const float *w, int32_t D, float eps, T *y)
{
    __shared__ double part[32];
    const int32_t t = blockIdx.x;
    const float *xt = x + (int64_t)t * D;
    double ss = 0.0;
    for (int32_t i = threadIdx.x; i < D; i += blockDim.x) ss += (double)xt[i] * xt[i];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < (int)blockDim.x / 32; i++) s += part[i];
        part[0] = s;
    }
    __syncthreads();
    const float r = (float)(1.0 / sqrt(part[0] / D + (double)eps));
    for (int32_t i = threadIdx.x; i < D; i += blockDim.x) y[(int64_t)t * D + i] = from_f<T>(xt[i] * r * w[i]);
}

/* Deterministic stand-in weights: uniform in [-scale, scale) from a hash of (seed, i), i the
 * element's index in the whole [.][full_cols] matrix; p [rows][cols] is the block of it that
 * starts at (row0, col0) (a rank's rows or columns; the whole matrix: 0, 0, cols = full_cols). */
template <typename T>
__global__ void fill_uniform_kernel(T *p, int64_t rows, int64_t cols, int64_t full_cols, int64_t row0, int64_t col0,
                                    uint64_t seed, float scale)
{
    const int64_t n = rows * cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = (row0 + e / cols) * full_cols + col0 + e % cols;
        uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        p[e] = from_f<T>(scale * (2.0f * u - 1.0f));
    }
}

__global__ void fill_const_kernel(float *p, int64_t n, float v)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = v;
}

/* The fused projection's rows [n][H hd | Hkv hd | Hkv hd] into contiguous q, k, v, RoPE applied
 * to q and k on the way (Hugging Face's rotate_half: in each head, element i pairs with i + hd/2;
 * cs [n][hd/2][2] holds each token's cos and sin); one thread per pair. */
template <typename T>
__global__ void split_rope_kernel(const T *qkv, int32_t n, int32_t H, int32_t Hkv, int32_t hd, const float *rope,
                                  const int32_t *pos, T *q, T *k, T *v)
{
    const int32_t half = hd / 2, heads = H + 2 * Hkv;
    const int64_t total = (int64_t)n * heads * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int32_t i = (int32_t)(e % half);
        const int64_t th = e / half;
        const int32_t t = (int32_t)(th / heads), h = (int32_t)(th % heads);
        const T *src = qkv + ((int64_t)t * heads + h) * hd;
        if (h >= H + Hkv) { /* v: a copy */
            T *dst = v + ((int64_t)t * Hkv + (h - H - Hkv)) * hd;
            dst[i] = src[i];
            dst[i + half] = src[i + half];
            continue;
        }
        T *dst = h < H ? q + ((int64_t)t * H + h) * hd : k + ((int64_t)t * Hkv + (h - H)) * hd;
        const float *cs = rope + ((int64_t)pos[t] * half + i) * 2;
        const float c = cs[0], s = cs[1];
        const float x1 = to_f(src[i]), x2 = to_f(src[i + half]);
        dst[i] = from_f<T>(x1 * c - x2 * s);
        dst[i + half] = from_f<T>(x2 * c + x1 * s);
    }
}

/* h [n][I] = silu(gate) * up from gu [n][gate I | up I]. */
template <typename T>
__global__ void silu_mul_kernel(const T *gu, int32_t I, int64_t n, T *h)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = e / I, i = e % I;
        const float g = to_f(gu[t * 2 * I + i]), u = to_f(gu[t * 2 * I + I + i]);
        h[e] = from_f<T>(g / (1.0f + expf(-g)) * u);
    }
}

enum { MAX_MARKS = 2048 }; /* Llama-3-70B: 11 a layer, 80 layers */

/* From here on, the time belongs to phase cat (no-op unless timing). */
static void mark(mkv_cuda_forward_t *f, int32_t cat)
{
    if (!f->timing || f->n_marks >= MAX_MARKS) return;
    cudaEventRecord(f->ev[f->n_marks], f->s);
    f->ev_cat[f->n_marks++] = cat;
}

/* The call's marks into phase_ms, once its work is done. */
static void settle_marks(mkv_cuda_forward_t *f)
{
    if (!f->timing || f->n_marks < 2) {
        f->n_marks = 0;
        return;
    }
    cudaEventSynchronize(f->ev[f->n_marks - 1]);
    for (int32_t i = 0; i + 1 < f->n_marks; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, f->ev[i], f->ev[i + 1]) == cudaSuccess) f->phase_ms[f->ev_cat[i]] += ms;
    }
    f->n_marks = 0;
}

static unsigned grid_of(int64_t n, int threads)
{
    const int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

/* ---------------------------------------------------------------------------------------- */
/* Dispatch on the element type                                                             */
/* ---------------------------------------------------------------------------------------- */

static size_t esize(mkv_dtype_t t) { return mkv_dtype_size(t); }

static cudaDataType_t cuda_type(mkv_dtype_t t)
{
    return t == MKV_DTYPE_F32 ? CUDA_R_32F : t == MKV_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

template <typename F>
static void with_type(mkv_dtype_t t, F f)
{
    if (t == MKV_DTYPE_F32) f(float());
    else if (t == MKV_DTYPE_F16) f(__half());
    else f(__nv_bfloat16());
}

static mkv_status_t cuda_failed(char *err, const char *what)
{
    const cudaError_t e = cudaGetLastError();
    return runner_fail(err, MKV_STATUS_CUDA_ERROR, "CUDA forward: %s: %s", what, cudaGetErrorString(e));
}

/* C [n][out] (ctype) = A [n][in] (dtype) W^T, W [out][in] (dtype), row-major; beta 1 adds. */
static mkv_status_t gemm(mkv_cuda_forward_t *f, const void *W, int32_t out, int32_t in, const void *A,
                         int32_t n, void *C, mkv_dtype_t ctype, float beta, char *err)
{
    const float alpha = 1.0f;
    const cudaDataType_t t = cuda_type(f->dtype);
    const cublasStatus_t s = cublasGemmEx(f->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, W, t, in, A,
                                          t, in, &beta, C, cuda_type(ctype), out, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return runner_fail(err, MKV_STATUS_CUDA_ERROR, "CUDA forward: cublasGemmEx (%d x %d x %d): status %d",
                           n, out, in, (int)s);
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Create and free                                                                          */
/* ---------------------------------------------------------------------------------------- */

void mkv_cuda_forward_free(mkv_cuda_forward_t *f)
{
    if (!f) return;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(f->device);
    if (f->layers) {
        for (int32_t l = 0; l < f->cfg.n_layers; l++) {
            dev_layer *d = &f->layers[l];
            void *p[] = {d->wqkv, d->w_gu, d->wo, d->w_down, d->attn_norm, d->mlp_norm};
            for (void *x : p) cudaFree(x);
        }
        free(f->layers);
    }
    if (f->lm_head != f->embed) cudaFree(f->lm_head);
    void *p[] = {f->embed, f->final_norm, f->x, f->a, f->qkv, f->q, f->k, f->v, f->att, f->gu, f->h,
                 f->logits, f->rope, f->d_pos, f->tok, f->rows};
    for (void *x : p) cudaFree(x);
    if (f->blas) cublasDestroy(f->blas);
    if (f->ev) {
        for (int i = 0; i < MAX_MARKS; i++) cudaEventDestroy(f->ev[i]);
        free(f->ev);
    }
    free(f->ev_cat);
    free(f->inv_freq);
    drop_graph(f);
    if (f->gstream) cudaStreamDestroy(f->gstream);
    free(f->g_slots);
    if (f->uploaded) {
        cudaEventSynchronize(f->uploaded); /* a failed call may have left an upload queued */
        cudaEventDestroy(f->uploaded);
    }
    cudaFreeHost(f->h_tok);
    cudaFreeHost(f->pos);
    free(f->h_rows);
    cudaSetDevice(prev);
    free(f);
}

/* n fp32 host values to a new device array of f->dtype (or fp32 when as_f32). */
static mkv_status_t upload(mkv_cuda_forward_t *f, const float *src, int64_t n, int as_f32, void **out,
                           char *err)
{
    *out = NULL;
    const mkv_dtype_t t = as_f32 ? MKV_DTYPE_F32 : f->dtype;
    const size_t bytes = (size_t)n * esize(t);
    if (cudaMalloc(out, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "CUDA forward: cannot allocate %zu bytes of weights",
                           bytes);
    }
    const void *host = src;
    void *conv = NULL;
    if (t != MKV_DTYPE_F32) {
        if (!(conv = malloc(bytes)))
            return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "CUDA forward: cannot convert %lld weights",
                               (long long)n);
        (void)mkv_convert(conv, t, src, MKV_DTYPE_F32, n);
        host = conv;
    }
    const cudaError_t e = cudaMemcpy(*out, host, bytes, cudaMemcpyHostToDevice);
    free(conv);
    return e == cudaSuccess ? MKV_STATUS_OK : cuda_failed(err, "weight upload");
}

/* Several fp32 host tensors, one after another, into one new device array of f->dtype. */
static mkv_status_t upload_stacked(mkv_cuda_forward_t *f, const float *const *src, const int64_t *n, int parts,
                                   void **out, char *err)
{
    int64_t total = 0;
    for (int i = 0; i < parts; i++) total += n[i];
    const size_t es = esize(f->dtype);
    if (cudaMalloc(out, (size_t)total * es) != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "CUDA forward: cannot allocate %zu bytes of weights",
                           (size_t)total * es);
    }
    int64_t at = 0;
    for (int i = 0; i < parts; i++) {
        void *part = NULL;
        mkv_status_t st = upload(f, src[i], n[i], 0, &part, err);
        if (st != MKV_STATUS_OK) return st;
        const cudaError_t e = cudaMemcpy((char *)*out + at * es, part, (size_t)n[i] * es, cudaMemcpyDeviceToDevice);
        cudaFree(part);
        if (e != cudaSuccess) return cuda_failed(err, "weight upload");
        at += n[i];
    }
    return MKV_STATUS_OK;
}

static mkv_status_t scratch(void **p, size_t bytes, char *err)
{
    if (cudaMalloc(p, bytes) == cudaSuccess) return MKV_STATUS_OK;
    *p = NULL;
    (void)cudaGetLastError();
    return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "CUDA forward: cannot allocate %zu bytes of scratch", bytes);
}

extern "C" int mkv_cuda_forward_available(void) { return 1; }

extern "C" void mkv_cuda_device_name(char *buf, int n)
{
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(buf, (size_t)n, "none");
        return;
    }
    snprintf(buf, (size_t)n, "%s", prop.name);
}

/* Room for n weights of f->dtype on the device. */
static mkv_status_t alloc_weights(mkv_cuda_forward_t *f, int64_t n, void **out, char *err)
{
    const size_t bytes = (size_t)n * esize(f->dtype);
    if (cudaMalloc(out, bytes) == cudaSuccess) return MKV_STATUS_OK;
    *out = NULL;
    (void)cudaGetLastError();
    return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "CUDA forward: cannot allocate %zu bytes of weights", bytes);
}

/* The block [rows][cols] at (row0, col0) of stand-in tensor `id` (its seed), a matrix with
 * full_cols columns and fan-in `in` (uniform in +-1/sqrt(in)), into p. */
static mkv_status_t dummy_block(mkv_cuda_forward_t *f, void *p, int64_t rows, int64_t cols, int64_t full_cols,
                                int64_t row0, int64_t col0, int64_t in, uint64_t seed, uint64_t id, char *err)
{
    const float scale = (float)(1.0 / sqrt((double)in));
    with_type(f->dtype, [&](auto z) {
        using T = decltype(z);
        fill_uniform_kernel<T><<<grid_of(rows * cols, 256), 256>>>((T *)p, rows, cols, full_cols, row0, col0,
                                                                  seed * 1000003ull + id, scale);
    });
    return cudaGetLastError() == cudaSuccess ? MKV_STATUS_OK : cuda_failed(err, "dummy weights");
}

/* A whole stand-in matrix [rows][in]. */
static mkv_status_t dummy(mkv_cuda_forward_t *f, int64_t rows, int64_t in, uint64_t seed, uint64_t id, void **out,
                          char *err)
{
    mkv_status_t st = alloc_weights(f, rows * in, out, err);
    return st == MKV_STATUS_OK ? dummy_block(f, *out, rows, in, in, 0, 0, in, seed, id, err) : st;
}

static mkv_status_t ones(int64_t n, float **out, char *err)
{
    if (cudaMalloc((void **)out, (size_t)n * 4) != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "CUDA forward: cannot allocate norms");
    }
    fill_const_kernel<<<grid_of(n, 256), 256>>>(*out, n, 1.0f);
    return cudaGetLastError() == cudaSuccess ? MKV_STATUS_OK : cuda_failed(err, "norm weights");
}

/* The share of the model that rank sh->rank of sh->n_ranks runs (sh NULL: all of it). */
static mkv_status_t shard_config(const mkv_model_config_t *c, const mkv_cuda_shard_t *sh, mkv_model_config_t *loc,
                                 mkv_cuda_shard_t *out_sh, char *err)
{
    *loc = *c;
    mkv_cuda_shard_t one = {0, 1, NULL, NULL};
    *out_sh = sh ? *sh : one;
    const int32_t n = out_sh->n_ranks;
    if (n < 1 || out_sh->rank < 0 || out_sh->rank >= n || (n > 1 && !out_sh->all_reduce))
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                           "CUDA forward: rank %d of %d ranks (an all-reduce is needed for more than one)",
                           out_sh->rank, n);
    if (c->n_heads < 1 || c->n_kv_heads < 1 || c->intermediate < 1 || c->n_heads % n || c->n_kv_heads % n ||
        c->intermediate % n)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                           "CUDA forward: %d ranks do not divide the model's %d heads, %d KV heads and FFN width %d",
                           n, c->n_heads, c->n_kv_heads, c->intermediate);
    loc->n_heads = c->n_heads / n;
    loc->n_kv_heads = c->n_kv_heads / n;
    loc->intermediate = c->intermediate / n;
    return MKV_STATUS_OK;
}

/* Everything but the weights: the handle, cuBLAS, scratch for max_tokens tokens; c is the
 * rank's share (shard_config). */
static mkv_status_t create_common(const mkv_model_config_t *c, const mkv_cuda_shard_t *sh, int32_t max_tokens,
                                  mkv_dtype_t dtype, mkv_cuda_forward_t **out, char *err)
{
    *out = NULL;
    if (max_tokens < 1 || mkv_dtype_size(dtype) == 0)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                           "mkv_cuda_forward_create: %d tokens (>= 1), element type %d", max_tokens, (int)dtype);
    if (c->n_layers < 1 || c->hidden < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->head_dim < 2 ||
        c->intermediate < 1 || c->vocab < 1 || c->n_heads % c->n_kv_heads != 0)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_forward_create: a model shape out of range");
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        (void)cudaGetLastError();
        return runner_fail(err, MKV_STATUS_CUDA_ERROR, "mkv_cuda_forward_create: no CUDA device");
    }
    mkv_cuda_forward_t *f = (mkv_cuda_forward_t *)calloc(1, sizeof *f);
    if (!f) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the CUDA forward pass");
    f->cfg = *c;
    f->shard = *sh;
    f->dtype = dtype;
    f->max_tokens = max_tokens;
    cudaGetDevice(&f->device);
    mkv_status_t status = MKV_STATUS_OK;
    const int64_t D = c->hidden, V = c->vocab, I = c->intermediate, hd = c->head_dim;
    const int64_t QD = (int64_t)c->n_heads * hd, KD = (int64_t)c->n_kv_heads * hd, T = max_tokens;
    const size_t es = esize(dtype);
    if (cublasCreate(&f->blas) != CUBLAS_STATUS_SUCCESS) {
        f->blas = NULL;
        status = runner_fail(err, MKV_STATUS_CUDA_ERROR, "CUDA forward: cublasCreate failed");
        goto fail;
    }
    cublasSetStream(f->blas, NULL);
    cublasSetMathMode(f->blas, CUBLAS_DEFAULT_MATH); /* no TF32: fp32 is fp32 */
    if (!(f->layers = (dev_layer *)calloc((size_t)c->n_layers, sizeof *f->layers))) {
        status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the CUDA forward pass");
        goto fail;
    }
    f->logit_rows = max_tokens < 64 ? max_tokens : 64;
    RUNNER_TRY(scratch((void **)&f->x, (size_t)(T * D) * 4, err));
    RUNNER_TRY(scratch(&f->a, (size_t)(T * D) * es, err));
    RUNNER_TRY(scratch(&f->qkv, (size_t)(T * (QD + 2 * KD)) * es, err));
    RUNNER_TRY(scratch(&f->q, (size_t)(T * QD) * es, err));
    RUNNER_TRY(scratch(&f->k, (size_t)(T * KD) * es, err));
    RUNNER_TRY(scratch(&f->v, (size_t)(T * KD) * es, err));
    RUNNER_TRY(scratch(&f->att, (size_t)(T * QD) * es, err));
    RUNNER_TRY(scratch(&f->gu, (size_t)(T * 2 * I) * es, err));
    RUNNER_TRY(scratch(&f->h, (size_t)(T * I) * es, err));
    RUNNER_TRY(scratch((void **)&f->logits, (size_t)f->logit_rows * V * 4, err));
    RUNNER_TRY(scratch((void **)&f->d_pos, (size_t)T * 4, err));
    RUNNER_TRY(scratch((void **)&f->tok, (size_t)T * 4, err));
    RUNNER_TRY(scratch((void **)&f->rows, (size_t)T * sizeof(mkv_sample_row_t), err));
    f->inv_freq = (double *)malloc((size_t)(hd / 2 + 1) * sizeof(double));
    if (cudaMallocHost((void **)&f->pos, (size_t)T * sizeof(int32_t)) != cudaSuccess ||
        cudaMallocHost((void **)&f->h_tok, (size_t)T * sizeof(int32_t)) != cudaSuccess ||
        cudaEventCreateWithFlags(&f->uploaded, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the CUDA forward pass's pinned scratch");
        goto fail;
    }
    f->h_rows = (mkv_sample_row_t *)malloc((size_t)T * sizeof(mkv_sample_row_t));
    if (!f->inv_freq || !f->h_rows) {
        status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the CUDA forward pass's host scratch");
        goto fail;
    }
    for (int32_t i = 0; i < hd / 2; i++) f->inv_freq[i] = pow((double)c->rope_theta, -2.0 * i / hd);
    *out = f;
    return MKV_STATUS_OK;
fail:
    mkv_cuda_forward_free(f);
    return status;
}

/* Columns [col0, col0 + cols) of a host matrix [rows][full_cols], gathered into a new array
 * (a rank's share of a row-parallel weight); NULL when out of memory. */
static float *gather_cols(const float *src, int64_t rows, int64_t full_cols, int64_t col0, int64_t cols)
{
    float *g = (float *)malloc((size_t)(rows * cols) * sizeof(float));
    if (g)
        for (int64_t r = 0; r < rows; r++) memcpy(g + r * cols, src + r * full_cols + col0, (size_t)cols * sizeof(float));
    return g;
}

/* A row-parallel weight's share: columns [col0, col0 + cols) of [rows][full_cols]. */
static mkv_status_t upload_cols(mkv_cuda_forward_t *f, const float *src, int64_t rows, int64_t full_cols,
                                int64_t col0, int64_t cols, void **out, char *err)
{
    if (cols == full_cols) return upload(f, src, rows * cols, 0, out, err);
    float *g = gather_cols(src, rows, full_cols, col0, cols);
    if (!g) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "CUDA forward: cannot gather a weight's columns");
    const mkv_status_t st = upload(f, g, rows * cols, 0, out, err);
    free(g);
    return st;
}

extern "C" mkv_status_t mkv_cuda_forward_create_ex(const mkv_model_t *m, const mkv_cuda_shard_t *shard,
                                                   int32_t max_tokens, mkv_dtype_t dtype, mkv_cuda_forward_t **out,
                                                   char *err)
{
    if (!out || !m)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_forward_create: null argument");
    mkv_model_config_t loc;
    mkv_cuda_shard_t sh;
    mkv_status_t status = shard_config(&m->cfg, shard, &loc, &sh, err);
    if (status != MKV_STATUS_OK) return status;
    mkv_cuda_forward_t *f;
    if ((status = create_common(&loc, &sh, max_tokens, dtype, &f, err)) != MKV_STATUS_OK) return status;
    const mkv_model_config_t *c = &m->cfg;
    const int64_t D = c->hidden, V = c->vocab, hd = c->head_dim, r = sh.rank;
    /* the whole model's widths, and this rank's */
    const int64_t QD = (int64_t)c->n_heads * hd, I = c->intermediate;
    const int64_t qd = (int64_t)loc.n_heads * hd, kd = (int64_t)loc.n_kv_heads * hd, ir = loc.intermediate;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mkv_layer_weights_t *w = &m->layers[l];
        dev_layer *d = &f->layers[l];
        /* column-parallel: the rank's rows of Wq, Wk, Wv, W_gate, W_up */
        const float *qkv[3] = {w->wq + r * qd * D, w->wk + r * kd * D, w->wv + r * kd * D};
        const float *gu[2] = {w->w_gate + r * ir * D, w->w_up + r * ir * D};
        const int64_t qkv_n[3] = {qd * D, kd * D, kd * D}, gu_n[2] = {ir * D, ir * D};
        RUNNER_TRY(upload_stacked(f, qkv, qkv_n, 3, &d->wqkv, err));
        RUNNER_TRY(upload_stacked(f, gu, gu_n, 2, &d->w_gu, err));
        /* row-parallel: the rank's columns of Wo and W_down */
        RUNNER_TRY(upload_cols(f, w->wo, D, QD, r * qd, qd, &d->wo, err));
        RUNNER_TRY(upload_cols(f, w->w_down, D, I, r * ir, ir, &d->w_down, err));
        RUNNER_TRY(upload(f, w->attn_norm, D, 1, (void **)&d->attn_norm, err));
        RUNNER_TRY(upload(f, w->mlp_norm, D, 1, (void **)&d->mlp_norm, err));
    }
    RUNNER_TRY(upload(f, m->embed, V * D, 0, &f->embed, err));
    if (m->lm_head == m->embed) f->lm_head = f->embed;
    else RUNNER_TRY(upload(f, m->lm_head, V * D, 0, &f->lm_head, err));
    RUNNER_TRY(upload(f, m->final_norm, D, 1, (void **)&f->final_norm, err));
    *out = f;
    return MKV_STATUS_OK;
fail:
    mkv_cuda_forward_free(f);
    return status;
}

extern "C" mkv_status_t mkv_cuda_forward_create(const mkv_model_t *m, int32_t max_tokens, mkv_dtype_t dtype,
                                                mkv_cuda_forward_t **out, char *err)
{
    return mkv_cuda_forward_create_ex(m, NULL, max_tokens, dtype, out, err);
}

extern "C" mkv_status_t mkv_cuda_forward_create_dummy_ex(const mkv_model_config_t *c, uint64_t seed,
                                                         const mkv_cuda_shard_t *shard, int32_t max_tokens,
                                                         mkv_dtype_t dtype, mkv_cuda_forward_t **out, char *err)
{
    if (!out || !c)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_forward_create_dummy: null argument");
    mkv_model_config_t loc;
    mkv_cuda_shard_t sh;
    mkv_status_t status = shard_config(c, shard, &loc, &sh, err);
    if (status != MKV_STATUS_OK) return status;
    mkv_cuda_forward_t *f;
    if ((status = create_common(&loc, &sh, max_tokens, dtype, &f, err)) != MKV_STATUS_OK) return status;
    const int64_t D = c->hidden, V = c->vocab, hd = c->head_dim, r = sh.rank, es = (int64_t)esize(dtype);
    const int64_t QD = (int64_t)c->n_heads * hd, KD = (int64_t)c->n_kv_heads * hd, I = c->intermediate;
    const int64_t qd = (int64_t)loc.n_heads * hd, kd = (int64_t)loc.n_kv_heads * hd, ir = loc.intermediate;
    for (int32_t l = 0; l < c->n_layers; l++) {
        dev_layer *d = &f->layers[l];
        const uint64_t id = (uint64_t)l * 16;
        /* [Wq; Wk; Wv] is one matrix [QD + 2 KD][D]: the rank's rows of each part */
        RUNNER_TRY(alloc_weights(f, (qd + 2 * kd) * D, &d->wqkv, err));
        char *qkv = (char *)d->wqkv;
        RUNNER_TRY(dummy_block(f, qkv, qd, D, D, r * qd, 0, D, seed, id + 0, err));
        RUNNER_TRY(dummy_block(f, qkv + qd * D * es, kd, D, D, QD + r * kd, 0, D, seed, id + 0, err));
        RUNNER_TRY(dummy_block(f, qkv + (qd + kd) * D * es, kd, D, D, QD + KD + r * kd, 0, D, seed, id + 0, err));
        /* Wo [D][QD]: the rank's columns */
        RUNNER_TRY(alloc_weights(f, D * qd, &d->wo, err));
        RUNNER_TRY(dummy_block(f, d->wo, D, qd, QD, 0, r * qd, QD, seed, id + 3, err));
        /* [W_gate; W_up] [2 I][D]: the rank's rows of each */
        RUNNER_TRY(alloc_weights(f, 2 * ir * D, &d->w_gu, err));
        RUNNER_TRY(dummy_block(f, d->w_gu, ir, D, D, r * ir, 0, D, seed, id + 4, err));
        RUNNER_TRY(dummy_block(f, (char *)d->w_gu + ir * D * es, ir, D, D, I + r * ir, 0, D, seed, id + 4, err));
        /* W_down [D][I]: the rank's columns */
        RUNNER_TRY(alloc_weights(f, D * ir, &d->w_down, err));
        RUNNER_TRY(dummy_block(f, d->w_down, D, ir, I, 0, r * ir, I, seed, id + 6, err));
        RUNNER_TRY(ones(D, &d->attn_norm, err));
        RUNNER_TRY(ones(D, &d->mlp_norm, err));
    }
    /* embeddings of unit scale (as the norms will see them), lm_head like a projection */
    RUNNER_TRY(alloc_weights(f, V * D, &f->embed, err));
    RUNNER_TRY(dummy_block(f, f->embed, V, D, D, 0, 0, 1, seed, (uint64_t)c->n_layers * 16 + 1, err));
    if (c->tied) f->lm_head = f->embed;
    else RUNNER_TRY(dummy(f, V, D, seed, (uint64_t)c->n_layers * 16 + 2, &f->lm_head, err));
    RUNNER_TRY(ones(D, &f->final_norm, err));
    if (cudaDeviceSynchronize() != cudaSuccess) {
        status = cuda_failed(err, "dummy weights");
        goto fail;
    }
    *out = f;
    return MKV_STATUS_OK;
fail:
    mkv_cuda_forward_free(f);
    return status;
}

extern "C" mkv_status_t mkv_cuda_forward_create_dummy(const mkv_model_config_t *c, uint64_t seed,
                                                      int32_t max_tokens, mkv_dtype_t dtype,
                                                      mkv_cuda_forward_t **out, char *err)
{
    return mkv_cuda_forward_create_dummy_ex(c, seed, NULL, max_tokens, dtype, out, err);
}

extern "C" const mkv_model_config_t *mkv_cuda_forward_config(const mkv_cuda_forward_t *f)
{
    return f ? &f->cfg : NULL;
}

/* Bytes of the weights on the device (what one decode step reads at least once). */
extern "C" int64_t mkv_cuda_forward_weight_bytes(const mkv_cuda_forward_t *f)
{
    if (!f) return 0;
    const mkv_model_config_t *c = &f->cfg;
    const int64_t D = c->hidden, V = c->vocab, I = c->intermediate, hd = c->head_dim;
    const int64_t QD = (int64_t)c->n_heads * hd, KD = (int64_t)c->n_kv_heads * hd;
    const int64_t per_layer = (QD * D + 2 * KD * D + D * QD + 3 * I * D) * (int64_t)esize(f->dtype) + 2 * D * 4;
    return per_layer * c->n_layers + V * D * (int64_t)esize(f->dtype) * (c->tied ? 1 : 2) + D * 4;
}

/* ---------------------------------------------------------------------------------------- */
/* The pass                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t report(mkv_status_t st, const char *err)
{
    return mkv_report_error(st, "%s", err);
}

static mkv_status_t cache_failed(mkv_cache_t *cache, mkv_status_t st)
{
    return mkv_report_error(st, "%s", mkv_cache_last_error(cache));
}

/* The pinned inputs may be written: their last upload is done. Before f->pos is filled. */
static void inputs_free(mkv_cuda_forward_t *f) { cudaEventSynchronize(f->uploaded); }

/* RoPE's table covers positions [0, need): grown (outside any capture) by computing the new
 * rows on the host as the CPU pass does, the angle in double, cos and sin rounded to fp32. A
 * captured graph reads the old table, so it goes. */
static mkv_status_t rope_for(mkv_cuda_forward_t *f, int32_t need, char *err)
{
    if (need <= f->rope_len) return MKV_STATUS_OK;
    const int32_t half = f->cfg.head_dim / 2;
    int64_t len = (int64_t)f->rope_len * 2;
    if (len < need) len = need;
    if (len < 1024) len = 1024;
    float *h = (float *)malloc((size_t)(len * half * 2) * sizeof(float)), *d = NULL;
    if (!h) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate RoPE's table");
    for (int64_t t = 0; t < len; t++)
        for (int32_t i = 0; i < half; i++) {
            const double ang = (double)t * f->inv_freq[i];
            h[(t * half + i) * 2] = (float)cos(ang);
            h[(t * half + i) * 2 + 1] = (float)sin(ang);
        }
    mkv_status_t st = scratch((void **)&d, (size_t)(len * half * 2) * sizeof(float), err);
    if (st == MKV_STATUS_OK && cudaMemcpy(d, h, (size_t)(len * half * 2) * sizeof(float), cudaMemcpyHostToDevice) !=
                                   cudaSuccess) {
        cudaFree(d);
        st = cuda_failed(err, "RoPE's table");
    }
    free(h);
    if (st != MKV_STATUS_OK) return st;
    drop_graph(f);
    cudaFree(f->rope);
    f->rope = d;
    f->rope_len = (int32_t)len;
    return MKV_STATUS_OK;
}

/* Embeddings of n tokens at positions f->pos (written after inputs_free). The tokens and the
 * positions go up from pinned memory in stream order, so the host goes on launching while
 * the step's first kernels (the append) run: a copy from pageable memory would wait for them.
 * A capture's inputs were copied in before it, and its graph's launches copy from the same
 * pinned rows. */
static mkv_status_t begin(mkv_cuda_forward_t *f, const int32_t *tokens, int32_t n, char *err)
{
    if (!f->capturing) memcpy(f->h_tok, tokens, (size_t)n * sizeof(int32_t));
    if (cudaMemcpyAsync(f->d_pos, f->pos, (size_t)n * 4, cudaMemcpyHostToDevice, f->s) != cudaSuccess ||
        cudaMemcpyAsync(f->tok, f->h_tok, (size_t)n * 4, cudaMemcpyHostToDevice, f->s) != cudaSuccess ||
        (!f->capturing && cudaEventRecord(f->uploaded, f->s) != cudaSuccess))
        return cuda_failed(err, "input upload");
    mark(f, MKV_CUDA_PHASE_OTHER);
    with_type(f->dtype, [&](auto z) {
        using T = decltype(z);
        embed_kernel<T><<<n, 128, 0, f->s>>>((const T *)f->embed, f->tok, f->cfg.hidden, f->x);
    });
    return cudaGetLastError() == cudaSuccess ? MKV_STATUS_OK : cuda_failed(err, "embed");
}

/* x [n][D] += the rank's product W^T of A [n][in]: the GEMM adds into the residual stream on
 * rank 0 (beta 1; alone, this is all) and writes the rank's part on the others (beta 0); then
 * the all-reduce sums the ranks' streams, so every rank holds x plus every rank's part. */
static mkv_status_t residual_gemm(mkv_cuda_forward_t *f, const void *W, int32_t in, const void *A, int32_t n,
                                  char *err)
{
    const int32_t D = f->cfg.hidden;
    const mkv_cuda_shard_t *sh = &f->shard;
    mark(f, MKV_CUDA_PHASE_GEMM);
    mkv_status_t st = gemm(f, W, D, in, A, n, f->x, MKV_DTYPE_F32, sh->rank == 0 ? 1.0f : 0.0f, err);
    if (st != MKV_STATUS_OK || sh->n_ranks == 1) return st;
    mark(f, MKV_CUDA_PHASE_ALL_REDUCE);
    return sh->all_reduce(sh->ctx, f->x, (int64_t)n * D, err);
}

/* Every layer over the n tokens in f->x; decode: through decode_layer_ex, else prefill_layer_ex. */
static mkv_status_t layers(mkv_cuda_forward_t *f, mkv_cache_t *cache, int32_t n, int32_t n_slots,
                           const int32_t *slots, int decode, char *err)
{
    const mkv_model_config_t *c = &f->cfg;
    const int32_t D = c->hidden, QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim;
    const int32_t I = c->intermediate;
    mkv_status_t st;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const dev_layer *w = &f->layers[l];
        mark(f, MKV_CUDA_PHASE_OTHER);
        with_type(f->dtype, [&](auto z) {
            using T = decltype(z);
            rmsnorm_kernel<T><<<n, 256, 0, f->s>>>(f->x, w->attn_norm, D, c->rms_eps, (T *)f->a);
        });
        mark(f, MKV_CUDA_PHASE_GEMM);
        if ((st = gemm(f, w->wqkv, QD + 2 * KD, D, f->a, n, f->qkv, f->dtype, 0.0f, err)) != MKV_STATUS_OK)
            return st;
        mark(f, MKV_CUDA_PHASE_OTHER);
        with_type(f->dtype, [&](auto z) {
            using T = decltype(z);
            const int64_t pairs = (int64_t)n * (c->n_heads + 2 * c->n_kv_heads) * (c->head_dim / 2);
            split_rope_kernel<T><<<grid_of(pairs, 256), 256, 0, f->s>>>((const T *)f->qkv, n, c->n_heads, c->n_kv_heads,
                                                               c->head_dim, f->rope, f->d_pos, (T *)f->q, (T *)f->k,
                                                               (T *)f->v);
        });
        if (cudaGetLastError() != cudaSuccess) return cuda_failed(err, "norm or rope");
        mark(f, MKV_CUDA_PHASE_ATTENTION);
        st = decode ? mkv_cache_decode_layer_ex(cache, n_slots, slots, l, f->dtype, f->q, f->k, f->v, f->att, f->s)
                    : mkv_cache_prefill_layer_ex(cache, n_slots, slots, l, f->dtype, f->q, f->k, f->v, f->att,
                                                 f->s);
        if (st != MKV_STATUS_OK)
            return runner_fail(err, st, "layer %d: %s", l, mkv_cache_last_error(cache));
        if ((st = residual_gemm(f, w->wo, QD, f->att, n, err)) != MKV_STATUS_OK) return st;
        mark(f, MKV_CUDA_PHASE_OTHER);
        with_type(f->dtype, [&](auto z) {
            using T = decltype(z);
            rmsnorm_kernel<T><<<n, 256, 0, f->s>>>(f->x, w->mlp_norm, D, c->rms_eps, (T *)f->a);
        });
        mark(f, MKV_CUDA_PHASE_GEMM);
        if ((st = gemm(f, w->w_gu, 2 * I, D, f->a, n, f->gu, f->dtype, 0.0f, err)) != MKV_STATUS_OK) return st;
        mark(f, MKV_CUDA_PHASE_OTHER);
        with_type(f->dtype, [&](auto z) {
            using T = decltype(z);
            silu_mul_kernel<T><<<grid_of((int64_t)n * I, 256), 256, 0, f->s>>>((const T *)f->gu, I, (int64_t)n * I, (T *)f->h);
        });
        if (cudaGetLastError() != cudaSuccess) return cuda_failed(err, "silu");
        if ((st = residual_gemm(f, w->w_down, I, f->h, n, err)) != MKV_STATUS_OK) return st;
    }
    return MKV_STATUS_OK;
}

/* The end of a call on a rank without the head: its work done, its marks settled. */
static mkv_status_t finish_call(mkv_cuda_forward_t *f, char *err)
{
    mark(f, MKV_CUDA_PHASE_OTHER); /* the end */
    if (f->capturing) return MKV_STATUS_OK; /* the graph's launch waits */
    if (cudaDeviceSynchronize() != cudaSuccess) return cuda_failed(err, "the layers");
    settle_marks(f);
    return MKV_STATUS_OK;
}

/* The logits of rows [first, first + count) of f->x into host logits [count][V] (logits NULL:
 * left on the device); on a rank other than 0, only the end of the call. */
static mkv_status_t head(mkv_cuda_forward_t *f, int32_t first, int32_t count, float *logits, char *err)
{
    const mkv_model_config_t *c = &f->cfg;
    if (f->shard.rank != 0) return finish_call(f, err);
    mark(f, MKV_CUDA_PHASE_HEAD);
    with_type(f->dtype, [&](auto z) {
        using T = decltype(z);
        rmsnorm_kernel<T><<<count, 256, 0, f->s>>>(f->x + (int64_t)first * c->hidden, f->final_norm, c->hidden, c->rms_eps,
                                          (T *)f->a);
    });
    mkv_status_t st = logit_rows_for(f, count, err);
    if (st != MKV_STATUS_OK) return st;
    st = gemm(f, f->lm_head, c->vocab, c->hidden, f->a, count, f->logits, MKV_DTYPE_F32, 0.0f, err);
    if (st != MKV_STATUS_OK) return st;
    if (logits && cudaMemcpy(logits, f->logits, (size_t)count * c->vocab * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        return cuda_failed(err, "logits download");
    return finish_call(f, err);
}

static mkv_status_t check_tokens(const mkv_cuda_forward_t *f, const char *fn, const int32_t *tokens, int32_t n,
                                 char *err)
{
    if (!tokens) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "%s: null tokens", fn);
    if (n < 1 || n > f->max_tokens)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "%s: %d tokens, the pass takes 1 to %d", fn, n,
                           f->max_tokens);
    for (int32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= f->cfg.vocab)
            return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "%s: token %d (at %d) is outside [0, %d)", fn,
                               tokens[t], t, f->cfg.vocab);
    return MKV_STATUS_OK;
}

static mkv_status_t cuda_prefill(void *ctx, mkv_cache_t *cache, int32_t slot, const int32_t *tokens, int32_t n,
                                 float *logits, float *last_logits)
{
    mkv_cuda_forward_t *f = (mkv_cuda_forward_t *)ctx;
    char err[MKV_ERR_LEN];
    mkv_status_t st;
    if ((st = check_tokens(f, "CUDA prefill", tokens, n, err)) != MKV_STATUS_OK) return report(st, err);
    int32_t admitted;
    if ((st = mkv_cache_prompt_len(cache, slot, &admitted)) != MKV_STATUS_OK) return cache_failed(cache, st);
    if (n != admitted)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "CUDA prefill: %d tokens, but slot %d was admitted with a prompt of %d", n, slot,
                                admitted);
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(f->device);
    inputs_free(f);
    for (int32_t t = 0; t < n; t++) f->pos[t] = t;
    f->n_marks = 0;
    if ((st = rope_for(f, n, err)) == MKV_STATUS_OK && (st = begin(f, tokens, n, err)) == MKV_STATUS_OK && (st = layers(f, cache, n, 1, &slot, 0, err)) == MKV_STATUS_OK) {
        mark(f, MKV_CUDA_PHASE_CACHE);
        if ((st = mkv_cache_commit_prompt(cache, 1, &slot, f->s)) != MKV_STATUS_OK)
            st = runner_fail(err, st, "%s", mkv_cache_last_error(cache));
        else if (logits) {
            if ((st = head(f, 0, n, logits, err)) == MKV_STATUS_OK && last_logits && f->shard.rank == 0)
                memcpy(last_logits, logits + (int64_t)(n - 1) * f->cfg.vocab, (size_t)f->cfg.vocab * sizeof(float));
        } else if (last_logits) {
            st = head(f, n - 1, 1, last_logits, err);
        }
    }
    cudaSetDevice(prev);
    return st == MKV_STATUS_OK ? st : report(st, err);
}

/* Several admitted slots' prompts in one pass (mkv_forward_t.prefill_batch): packed rows, each
 * slot's positions from 0, one GEMM per weight for all of them; then the slots' last rows
 * moved to the front of f->x (row j <= slot j's last row, so no source is overwritten before
 * it is read) for one head GEMM. */
static mkv_status_t cuda_prefill_batch(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                       const int32_t *tokens, const int32_t *lens, float *last_logits)
{
    mkv_cuda_forward_t *f = (mkv_cuda_forward_t *)ctx;
    char err[MKV_ERR_LEN];
    mkv_status_t st;
    if (n_slots < 1 || !slots || !lens || !last_logits)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "CUDA batched prefill: %d slots, slots %p, lens %p, last_logits %p", n_slots,
                                (const void *)slots, (const void *)lens, (void *)last_logits);
    int64_t total = 0;
    for (int32_t j = 0; j < n_slots; j++) {
        int32_t admitted;
        if ((st = mkv_cache_prompt_len(cache, slots[j], &admitted)) != MKV_STATUS_OK) return cache_failed(cache, st);
        if (lens[j] != admitted)
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                    "CUDA batched prefill: %d tokens for slot %d, admitted with a prompt of %d",
                                    lens[j], slots[j], admitted);
        total += lens[j];
    }
    if (total > f->max_tokens)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                "CUDA batched prefill: %lld tokens in all; the pass takes %d a call",
                                (long long)total, f->max_tokens);
    if ((st = check_tokens(f, "CUDA batched prefill", tokens, (int32_t)total, err)) != MKV_STATUS_OK)
        return report(st, err);
    const int32_t n = (int32_t)total;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(f->device);
    inputs_free(f);
    int32_t longest = 0;
    for (int32_t j = 0, t0 = 0; j < n_slots; t0 += lens[j++]) {
        for (int32_t t = 0; t < lens[j]; t++) f->pos[t0 + t] = t;
        if (lens[j] > longest) longest = lens[j];
    }
    f->n_marks = 0;
    if ((st = rope_for(f, longest, err)) == MKV_STATUS_OK && (st = begin(f, tokens, n, err)) == MKV_STATUS_OK && (st = layers(f, cache, n, n_slots, slots, 0, err)) == MKV_STATUS_OK) {
        mark(f, MKV_CUDA_PHASE_CACHE);
        if ((st = mkv_cache_commit_prompt(cache, n_slots, slots, f->s)) != MKV_STATUS_OK) {
            st = runner_fail(err, st, "%s", mkv_cache_last_error(cache));
        } else {
            const size_t row = (size_t)f->cfg.hidden * sizeof(float);
            for (int32_t j = 0, last = -1; j < n_slots && st == MKV_STATUS_OK; j++) {
                last += lens[j];
                if (last != j && cudaMemcpyAsync(f->x + (int64_t)j * f->cfg.hidden, f->x + (int64_t)last * f->cfg.hidden,
                                                 row, cudaMemcpyDeviceToDevice, f->s) != cudaSuccess)
                    st = cuda_failed(err, "last rows");
            }
            if (st == MKV_STATUS_OK) st = head(f, 0, n_slots, last_logits, err);
        }
    }
    cudaSetDevice(prev);
    return st == MKV_STATUS_OK ? st : report(st, err);
}

/* Each row's first index of its largest value (mkv_sample's greedy pick, for finite logits):
 * one block per row. */
__global__ void argmax_kernel(const float *logits, int32_t V, int32_t *out)
{
    __shared__ float bv[32];
    __shared__ int32_t bi[32];
    const float *row = logits + (int64_t)blockIdx.x * V;
    float v = -INFINITY;
    int32_t idx = INT32_MAX;
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x)
        if (row[i] > v) v = row[i], idx = i; /* ascending i: the first of equals stays */
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, off);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, off);
        if (ov > v || (ov == v && oi < idx)) v = ov, idx = oi;
    }
    if (threadIdx.x % 32 == 0) bv[threadIdx.x / 32] = v, bi[threadIdx.x / 32] = idx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / 32; w++)
            if (bv[w] > v || (bv[w] == v && bi[w] < idx)) v = bv[w], idx = bi[w];
        out[blockIdx.x] = idx == INT32_MAX ? 0 : idx;
    }
}

/* The logits buffer holds at least n rows (grown outside any capture: it allocates). */
static mkv_status_t logit_rows_for(mkv_cuda_forward_t *f, int32_t n, char *err)
{
    if (n <= f->logit_rows) return MKV_STATUS_OK;
    cudaFree(f->logits);
    f->logits = NULL;
    if (scratch((void **)&f->logits, (size_t)n * f->cfg.vocab * 4, err) != MKV_STATUS_OK) {
        f->logit_rows = 0;
        return MKV_STATUS_OUT_OF_MEMORY;
    }
    f->logit_rows = n;
    return MKV_STATUS_OK;
}

/* Every launch of a decode step, on f->s, then the call's end (no wait while capturing):
 * append, inputs, layers, compress, head; logits to the host when not NULL; picks 1: greedy
 * picks into f->tok, 2: sampled ones under f->rows (uploaded already). */
static mkv_status_t step_launches(mkv_cuda_forward_t *f, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                  const int32_t *tokens, float *logits, int picks, char *err)
{
    const mkv_model_config_t *c = &f->cfg;
    mkv_status_t st;
    mark(f, MKV_CUDA_PHASE_CACHE);
    if ((st = mkv_cache_append(cache, n_slots, slots, f->s)) != MKV_STATUS_OK)
        return runner_fail(err, st, "%s", mkv_cache_last_error(cache));
    if ((st = begin(f, tokens, n_slots, err)) != MKV_STATUS_OK ||
        (st = layers(f, cache, n_slots, n_slots, slots, 1, err)) != MKV_STATUS_OK)
        return st;
    mark(f, MKV_CUDA_PHASE_CACHE);
    if ((st = mkv_cache_compress(cache, n_slots, slots, f->s)) != MKV_STATUS_OK)
        return runner_fail(err, st, "%s", mkv_cache_last_error(cache));
    if (f->shard.rank != 0) return finish_call(f, err);
    mark(f, MKV_CUDA_PHASE_HEAD);
    with_type(f->dtype, [&](auto z) {
        using T = decltype(z);
        rmsnorm_kernel<T><<<n_slots, 256, 0, f->s>>>(f->x, f->final_norm, c->hidden, c->rms_eps, (T *)f->a);
    });
    if ((st = logit_rows_for(f, n_slots, err)) != MKV_STATUS_OK ||
        (st = gemm(f, f->lm_head, c->vocab, c->hidden, f->a, n_slots, f->logits, MKV_DTYPE_F32, 0.0f, err)) !=
            MKV_STATUS_OK)
        return st;
    if (logits && cudaMemcpy(logits, f->logits, (size_t)n_slots * c->vocab * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        return cuda_failed(err, "logits download");
    if (picks == 1)
        argmax_kernel<<<n_slots, 1024, 0, f->s>>>(f->logits, c->vocab, f->tok);
    else if (picks == 2 && (st = mkv_cuda_sample(f->logits, n_slots, c->vocab, f->rows, f->tok, f->s, err)) !=
                               MKV_STATUS_OK)
        return st;
    if (cudaGetLastError() != cudaSuccess) return cuda_failed(err, "the picks");
    return finish_call(f, err);
}

static void drop_graph(mkv_cuda_forward_t *f)
{
    if (f->exec) cudaGraphExecDestroy(f->exec);
    f->exec = NULL;
    f->g_left = 0;
}

/* A decode step through the captured graph: captured again when the batch, its slots or the
 * picks differ from the capture's, or after f->horizon launches (the cache plans each
 * captured attention call for that many); the new capture updates the executable graph in
 * place where its topology allows. Afterwards the cache's view is brought to the device's,
 * which a launch moves without the host taking part. */
static mkv_status_t graph_step(mkv_cuda_forward_t *f, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                               const int32_t *tokens, int picks, char *err)
{
    mkv_status_t st;
    memcpy(f->h_tok, tokens, (size_t)n_slots * sizeof(int32_t)); /* what the graph's copy reads */
    const bool same = f->exec && f->g_left > 0 && f->g_n == n_slots && f->g_picks == picks &&
                      memcmp(f->g_slots, slots, (size_t)n_slots * sizeof *slots) == 0;
    if (!same) {
        if ((st = logit_rows_for(f, n_slots, err)) != MKV_STATUS_OK) return st;
        if ((st = mkv_cache_set_capture_horizon(cache, f->horizon)) != MKV_STATUS_OK)
            return runner_fail(err, st, "%s", mkv_cache_last_error(cache));
        if (cudaStreamBeginCapture(f->s, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
            return cuda_failed(err, "stream capture");
        f->capturing = 1;
        st = step_launches(f, cache, n_slots, slots, tokens, NULL, picks, err);
        f->capturing = 0;
        cudaGraph_t g = NULL;
        const cudaError_t e = cudaStreamEndCapture(f->s, &g);
        if (st == MKV_STATUS_OK && e != cudaSuccess) st = cuda_failed(err, "stream capture");
        if (st == MKV_STATUS_OK && f->exec) { /* the same kernels with new parameters, mostly */
            cudaGraphExecUpdateResultInfo info;
            if (cudaGraphExecUpdate(f->exec, g, &info) == cudaSuccess) {
                f->g_updates++;
            } else {
                (void)cudaGetLastError();
                drop_graph(f);
            }
        }
        if (st == MKV_STATUS_OK && !f->exec && cudaGraphInstantiate(&f->exec, g, 0) != cudaSuccess) {
            f->exec = NULL;
            st = cuda_failed(err, "graph instantiation");
        }
        if (g) cudaGraphDestroy(g);
        if (st != MKV_STATUS_OK) {
            (void)cudaGetLastError();
            drop_graph(f);
            /* the capture ran only the host's side of the step calls: back to the device's */
            (void)mkv_cache_sync(cache, f->s);
            return st;
        }
        f->g_n = n_slots;
        f->g_picks = picks;
        memcpy(f->g_slots, slots, (size_t)n_slots * sizeof *slots);
        f->g_left = f->horizon;
        f->g_captures++;
    }
    if (cudaGraphLaunch(f->exec, f->s) != cudaSuccess || cudaEventRecord(f->uploaded, f->s) != cudaSuccess) {
        drop_graph(f);
        return cuda_failed(err, "graph launch");
    }
    f->g_left--;
    f->g_launches++;
    if ((st = mkv_cache_sync(cache, f->s)) != MKV_STATUS_OK)
        return runner_fail(err, st, "%s", mkv_cache_last_error(cache));
    return MKV_STATUS_OK;
}

/* One decode step; logits: to the host when not NULL; next: the picks come back, greedy
 * (rows NULL) or sampled under rows [n_slots] (host, as sampling_cuda.h uploads them). */
static mkv_status_t decode_step(mkv_cuda_forward_t *f, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                const int32_t *tokens, float *logits, int32_t *next, const mkv_sample_row_t *rows)
{
    char err[MKV_ERR_LEN];
    mkv_status_t st;
    if ((st = check_tokens(f, "CUDA decode", tokens, n_slots, err)) != MKV_STATUS_OK) return report(st, err);
    if (!slots) return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "CUDA decode: null slots");
    /* the new token's position: N before the append */
    inputs_free(f);
    if ((st = mkv_cache_seq_lens(cache, n_slots, slots, f->pos)) != MKV_STATUS_OK) return cache_failed(cache, st);
    int32_t last = 0;
    for (int32_t j = 0; j < n_slots; j++) {
        if (f->pos[j] == 0)
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "CUDA decode: slot %d has no committed prompt",
                                    slots[j]);
        if (f->pos[j] > last) last = f->pos[j];
    }
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(f->device);
    f->n_marks = 0;
    if ((st = rope_for(f, last + 1, err)) != MKV_STATUS_OK) {
        cudaSetDevice(prev);
        return report(st, err);
    }
    const int picks = !next || f->shard.rank != 0 ? 0 : rows ? 2 : 1;
    if (picks == 2 && cudaMemcpy(f->rows, rows, (size_t)n_slots * sizeof *rows, cudaMemcpyHostToDevice) != cudaSuccess)
        st = cuda_failed(err, "sampling parameters");
    else if (f->graphs && !f->timing && !logits && picks != 2)
        st = graph_step(f, cache, n_slots, slots, tokens, picks, err);
    else
        st = step_launches(f, cache, n_slots, slots, tokens, logits, picks, err);
    if (st == MKV_STATUS_OK && picks &&
        cudaMemcpy(next, f->tok, (size_t)n_slots * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        st = cuda_failed(err, "picked tokens");
    cudaSetDevice(prev);
    return st == MKV_STATUS_OK ? st : report(st, err);
}

static mkv_status_t cuda_decode(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                const int32_t *tokens, float *logits)
{
    return decode_step((mkv_cuda_forward_t *)ctx, cache, n_slots, slots, tokens, logits, NULL, NULL);
}

static mkv_status_t cuda_decode_greedy(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                       const int32_t *tokens, int32_t *next)
{
    if (!next) return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "CUDA decode: null next");
    return decode_step((mkv_cuda_forward_t *)ctx, cache, n_slots, slots, tokens, NULL, next, NULL);
}

static mkv_status_t cuda_decode_sample(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                       const int32_t *tokens, const float *temperature, const float *top_p,
                                       const double *u, int32_t *next)
{
    mkv_cuda_forward_t *f = (mkv_cuda_forward_t *)ctx;
    if (!next || !temperature || !top_p || !u)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "CUDA decode: null next, temperature, top_p or u");
    if (n_slots < 1 || n_slots > f->max_tokens)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "CUDA decode: %d slots, the pass takes 1 to %d",
                                n_slots, f->max_tokens);
    for (int32_t j = 0; j < n_slots; j++) {
        if (temperature[j] > 0.0f && !(u[j] >= 0.0 && u[j] < 1.0))
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "CUDA decode: u[%d] = %g is outside [0, 1)", j,
                                    u[j]);
        f->h_rows[j].u = u[j];
        f->h_rows[j].temperature = temperature[j];
        f->h_rows[j].top_p = top_p[j];
    }
    return decode_step(f, cache, n_slots, slots, tokens, NULL, next, f->h_rows);
}

extern "C" mkv_forward_t mkv_cuda_forward(mkv_cuda_forward_t *f)
{
    mkv_forward_t fw;
    memset(&fw, 0, sizeof fw);
    if (!f) return fw; /* no calls: mkv_scheduler_create refuses it */
    fw.ctx = f;
    fw.vocab = f->cfg.vocab;
    fw.max_positions = f->cfg.max_pos;
    fw.max_tokens = f->max_tokens;
    fw.prefill = cuda_prefill;
    fw.decode = cuda_decode;
    fw.decode_greedy = cuda_decode_greedy;
    fw.decode_sample = cuda_decode_sample;
    fw.prefill_batch = cuda_prefill_batch;
    return fw;
}

extern "C" mkv_status_t mkv_cuda_forward_set_timing(mkv_cuda_forward_t *f, int on)
{
    if (!f) return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_forward_set_timing: null pass");
    if (on && !f->ev) {
        f->ev = (cudaEvent_t *)calloc(MAX_MARKS, sizeof *f->ev);
        f->ev_cat = (int32_t *)calloc(MAX_MARKS, sizeof *f->ev_cat);
        if (!f->ev || !f->ev_cat) return mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "cannot allocate timing events");
        /* on the pass's device: an event of another device cannot be recorded on its stream
         * (a rank of a tensor-parallel group is timed from the caller's thread) */
        int prev = 0;
        cudaGetDevice(&prev);
        cudaSetDevice(f->device);
        cudaError_t e = cudaSuccess;
        for (int i = 0; i < MAX_MARKS && e == cudaSuccess; i++) e = cudaEventCreate(&f->ev[i]);
        cudaSetDevice(prev);
        if (e != cudaSuccess)
            return mkv_report_error(MKV_STATUS_CUDA_ERROR, "cudaEventCreate: %s", cudaGetErrorString(e));
    }
    f->timing = on != 0;
    f->n_marks = 0;
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_forward_set_graphs(mkv_cuda_forward_t *f, int on, int32_t horizon)
{
    if (!f) return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_forward_set_graphs: null pass");
    if (on && horizon < 1)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_forward_set_graphs: horizon %d (>= 1)", horizon);
    if (on && f->shard.n_ranks > 1)
        return mkv_report_error(MKV_STATUS_UNSUPPORTED,
                                "CUDA graphs: not with tensor parallelism (the all-reduces have streams of their own)");
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(f->device);
    if (on && !f->gstream) {
        if (cudaStreamCreate(&f->gstream) != cudaSuccess) {
            (void)cudaGetLastError();
            f->gstream = NULL;
            cudaSetDevice(prev);
            return mkv_report_error(MKV_STATUS_CUDA_ERROR, "CUDA graphs: cannot create a stream");
        }
    }
    if (on && !f->g_slots && !(f->g_slots = (int32_t *)malloc((size_t)f->max_tokens * sizeof(int32_t)))) {
        cudaSetDevice(prev);
        return mkv_report_error(MKV_STATUS_OUT_OF_MEMORY, "CUDA graphs: cannot allocate the slot list");
    }
    cudaDeviceSynchronize(); /* the old stream's work done before the new one's starts */
    drop_graph(f);
    f->graphs = on != 0;
    f->horizon = on ? horizon : 0;
    if (on) f->g_captures = f->g_updates = f->g_launches = 0;
    f->s = on ? f->gstream : NULL;
    cublasSetStream(f->blas, f->s);
    cudaSetDevice(prev);
    return MKV_STATUS_OK;
}

extern "C" void mkv_cuda_forward_graph_stats(const mkv_cuda_forward_t *f, int64_t *captures, int64_t *updates,
                                             int64_t *launches)
{
    *captures = f ? f->g_captures : 0;
    *updates = f ? f->g_updates : 0;
    *launches = f ? f->g_launches : 0;
}

extern "C" void mkv_cuda_forward_phases(mkv_cuda_forward_t *f, double ms[MKV_CUDA_PHASES], int reset)
{
    for (int i = 0; i < MKV_CUDA_PHASES; i++) {
        ms[i] = f ? f->phase_ms[i] : 0.0;
        if (f && reset) f->phase_ms[i] = 0.0;
    }
}
