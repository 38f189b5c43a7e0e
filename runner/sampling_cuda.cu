/*
 * sampling_cuda.cu — the next token of each row of logits on the device (runner/sampling_cuda.h),
 * one 1024-thread block per row, so that a decode step's logits never cross to the host.
 *
 * The host reference (engine/sampling.c, mkv_sample_with_u) sorts the whole vocabulary for
 * top-p. Here nothing is sorted: the probabilities p_i (the reference's float values, bit for
 * bit: difference and quotient in float, exp in double rounded to float) are positive floats,
 * so their bit patterns order like their values, and the kept set's smallest value v, and then
 * the chosen token's value q, are found by a radix descent over the bits: the exponent (bits
 * 30..23, 256 bins), then bits 22..11 and bits 10..0 within it. Each bin holds the sum of its
 * elements' 24-bit integer mantissas, exact in 64 bits; within one exponent every element has
 * the same scale 2^(e - 150), so the mass of the elements of that exponent at or above any
 * value is an exact integer times a power of two, and "the mass at or above x" is
 *     H(x) = A + S * 2^(e - 150)      (one rounding: A, the mass of the higher exponents, in
 *                                      double, plus an exact product)
 * evaluated the same way at every level, so the levels cannot disagree with one another. Ties
 * (several tokens of value v or q) are taken in id order by counting: the r-th lowest id of
 * that value. Without top-p the reference scans in id order: a block scan of contiguous
 * per-thread chunks does the same.
 *
 * Where the device can differ from the reference: only in the order of its double sums, so
 * only when u times the mass falls within rounding of a boundary between two tokens (or the
 * kept mass within rounding of top_p times the total).
 *
 * Layers: helpers (block scans, the warp-aggregated histogram add), the phases of a row, the
 * kernel, the launcher, the entry point.
 */
#include "runner/sampling_cuda.h"

#include "runner/error.h"

#include <cuda_runtime.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int THREADS = 1024, WARPS = THREADS / 32; /* warp 0 scans the warp totals */
constexpr unsigned FULL = 0xffffffffu;
constexpr int L1_BINS = 256;      /* bits 30..23: the exponent (p >= 0, so bit 31 is 0) */
constexpr int L2_BITS = 12;       /* bits 22..11 */
constexpr int L3_BITS = 11;       /* bits 10..0 */
static_assert(THREADS % 32 == 0 && WARPS <= 32, "the block scans take one warp total per lane of warp 0");
static_assert((1 << L2_BITS) % THREADS == 0 && (1 << L3_BITS) % THREADS == 0, "whole bins per thread");
static_assert(L1_BINS == 32 * 8, "eight exponent bins per lane of warp 0");
static_assert(sizeof(mkv_sample_row_t) == 16, "one row's parameters: u, temperature, top_p");

struct row_shared {
    unsigned long long hist[1 << L2_BITS]; /* [digit] mantissa sums of one level (L2 or L3) */
    unsigned long long hist1[L1_BINS];     /* [exponent] mantissa sums */
    double scan_d[WARPS + 1];              /* block scans: warp bases, then the total */
    unsigned long long scan_u[WARPS + 1];
    int scan_i[WARPS + 1];
    float red_v[WARPS];                    /* argmax per warp */
    int32_t red_i[WARPS];
    int best;                              /* find_digit: the largest qualifying digit */
    unsigned long long best_above;         /* ... and the mantissa sum above it */
    int32_t found;                         /* a token id */
    int bin;                               /* find_bin's answer (-1: none) */
    double bin_above, target;              /* its A, and the target it was tested against */
};

/* 2^k for k in [-1022, 1023], exact. */
__device__ __forceinline__ double pow2(int k) { return __longlong_as_double((long long)(k + 1023) << 52); }

/* A non-negative float's 24-bit integer mantissa (implicit bit included; subnormals without). */
__device__ __forceinline__ uint32_t mant_of(uint32_t b)
{
    const uint32_t m = b & 0x7fffffu;
    return (b >> 23) ? m | 0x800000u : m;
}

/* The value of one mantissa unit for exponent field e: p = mant_of(p) * scale_of(p >> 23). */
__device__ __forceinline__ double scale_of(uint32_t e) { return pow2((int)(e ? e : 1u) - 150); }

/* NOTE: the reference's probability, bit for bit (engine/sampling.c): the float difference and
 * quotient (never contracted: the _rn intrinsics), then exp in double rounded to float. */
__device__ __forceinline__ float prob(float logit, float m, float t)
{
    const float p = __double2float_rn(exp((double)__fdiv_rn(__fsub_rn(logit, m), t)));
    return p >= 0.0f ? p : 0.0f; /* NaN (non-finite logits) counts as 0 */
}

/* Thread order exclusive prefix sum of v over the block; *total the whole sum. Every thread
 * calls it (it synchronises the block). */
template <typename T> __device__ T block_excl_scan(T v, T *tot, T *total)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    T inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(FULL, inc, o);
        if (lane >= o) inc += y;
    }
    T ex = __shfl_up_sync(FULL, inc, 1);
    if (lane == 0) ex = T(0);
    if (lane == 31) tot[w] = inc;
    __syncthreads();
    if (w == 0) {
        T ti = lane < WARPS ? tot[lane] : T(0);
        for (int o = 1; o < 32; o <<= 1) {
            const T y = __shfl_up_sync(FULL, ti, o);
            if (lane >= o) ti += y;
        }
        T te = __shfl_up_sync(FULL, ti, 1);
        if (lane == 0) te = T(0);
        if (lane < WARPS) tot[lane] = te;
        if (lane == 31) tot[WARPS] = ti;
    }
    __syncthreads();
    const T r = tot[w] + ex;
    *total = tot[WARPS];
    __syncthreads(); /* tot is free again */
    return r;
}

/* h[digit] += v for every lane with digit >= 0, one atomic per distinct digit in the warp (the
 * exponent level has few distinct digits: without this, most adds would collide). All 32 lanes
 * call it. A warp's sum of 24-bit mantissas fits 32 bits. */
__device__ __forceinline__ void hist_add(unsigned long long *h, int digit, uint32_t v)
{
    const unsigned peers = __match_any_sync(FULL, digit);
    const uint32_t s = __reduce_add_sync(peers, v);
    if (digit >= 0 && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&h[digit], (unsigned long long)s);
}

/* The row's largest value and the lowest index holding it (argmax, as the reference's). */
__device__ void block_argmax(const float *x, int32_t V, row_shared &sh, float *mv, int32_t *mi)
{
    float v = -INFINITY;
    int32_t idx = INT32_MAX;
    for (int32_t i = threadIdx.x; i < V; i += THREADS)
        if (x[i] > v) v = x[i], idx = i; /* ascending i: the first of equals stays */
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(FULL, v, off);
        const int32_t oi = __shfl_xor_sync(FULL, idx, off);
        if (ov > v || (ov == v && oi < idx)) v = ov, idx = oi;
    }
    if (threadIdx.x % 32 == 0) sh.red_v[threadIdx.x / 32] = v, sh.red_i[threadIdx.x / 32] = idx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < WARPS; w++)
            if (sh.red_v[w] > v || (sh.red_v[w] == v && sh.red_i[w] < idx)) v = sh.red_v[w], idx = sh.red_i[w];
        sh.red_v[0] = v, sh.red_i[0] = idx == INT32_MAX ? 0 : idx;
    }
    __syncthreads();
    *mv = sh.red_v[0];
    *mi = sh.red_i[0];
    __syncthreads();
}

__device__ __forceinline__ bool passes(double h, double target, bool strict)
{
    return strict ? h > target : h >= target;
}

/* Warp 0, over the exponent bins from the top: the largest bin e holding mass whose
 * H = A_e + hist1[e] * scale passes the test against target (or, when of_total, against target
 * times the sum of every bin), A_e the mass of the bins above it (lanes hold 8 bins each, lane 0
 * the top ones; A_e: a lane scan, then sequential within the lane). Into sh.bin (-1: none),
 * sh.bin_above (A_e) and sh.target. With fallback, a miss (the target above every H, by
 * rounding) takes the lowest bin holding mass, its H as the target. The caller synchronises. */
__device__ void find_bin(row_shared &sh, double target, bool of_total, bool strict, bool fallback)
{
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    double local = 0.0;
    for (int j = 0; j < 8; j++) {
        const int e = L1_BINS - 1 - lane * 8 - j;
        local += (double)sh.hist1[e] * scale_of((uint32_t)e);
    }
    double inc = local;
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(FULL, inc, o);
        if (lane >= o) inc += y;
    }
    double a = __shfl_up_sync(FULL, inc, 1);
    if (lane == 0) a = 0.0;
    if (of_total) target *= __shfl_sync(FULL, inc, 31);
    int mine = -1, low = -1;
    double mine_a = 0.0, low_a = 0.0, low_h = 0.0;
    for (int j = 0; j < 8; j++) {
        const int e = L1_BINS - 1 - lane * 8 - j;
        const unsigned long long s = sh.hist1[e];
        if (!s) continue;
        const double h = a + (double)s * scale_of((uint32_t)e);
        if (mine < 0 && passes(h, target, strict)) mine = e, mine_a = a;
        low = e, low_a = a, low_h = h;
        a = h;
    }
    const unsigned fm = __ballot_sync(FULL, mine >= 0), lm = __ballot_sync(FULL, low >= 0);
    int bin = -1;
    double above = 0.0;
    if (fm) { /* the top bin: the lowest lane that found one */
        const int src = __ffs(fm) - 1;
        bin = __shfl_sync(FULL, mine, src);
        above = __shfl_sync(FULL, mine_a, src);
    } else if (fallback && lm) { /* the lowest bin: the highest lane holding mass */
        const int src = 31 - __clz((int)lm);
        bin = __shfl_sync(FULL, low, src);
        above = __shfl_sync(FULL, low_a, src);
        target = __shfl_sync(FULL, low_h, src);
    }
    if (lane == 0) sh.bin = bin, sh.bin_above = above, sh.target = target;
}

/* h [1 << nbits] = per digit (b >> shift) & (2^nbits - 1), the mantissa sums of the elements
 * whose bits b have b >> (shift + nbits) == prefix and b > floor. */
__device__ void level_hist(const float *x, int32_t V, int shift, int nbits, uint32_t prefix, uint32_t floor,
                           unsigned long long *h)
{
    const int nb = 1 << nbits;
    for (int d = threadIdx.x; d < nb; d += THREADS) h[d] = 0;
    __syncthreads();
    for (int32_t i0 = 0; i0 < V; i0 += THREADS) {
        const int32_t i = i0 + (int32_t)threadIdx.x;
        const uint32_t b = i < V ? __float_as_uint(x[i]) : 0u;
        const bool in = i < V && (b >> (shift + nbits)) == prefix && b > floor;
        if (!__any_sync(FULL, in)) continue; /* warp-uniform */
        hist_add(h, in ? (int)((b >> shift) & (uint32_t)(nb - 1)) : -1, in ? mant_of(b) : 0u);
    }
    __syncthreads();
}

/* Over the digits of h from the top: the largest digit d holding mass whose
 * H = a + (base + sum of h[d'] for d' >= d) * sc passes the test; *above = base plus the sum of
 * h above d. -1 when none. Each thread holds 2^nbits / THREADS digits, thread 0 the top ones. */
__device__ int find_digit(const unsigned long long *h, int nbits, unsigned long long base, double a, double sc,
                          double target, bool strict, row_shared &sh, unsigned long long *above)
{
    const int k = (1 << nbits) / THREADS, hi = (1 << nbits) - 1 - (int)threadIdx.x * k;
    unsigned long long local = 0, total;
    for (int j = 0; j < k; j++) local += h[hi - j];
    if (threadIdx.x == 0) sh.best = -1;
    unsigned long long s = base + block_excl_scan(local, sh.scan_u, &total); /* < 2^53: exact */
    int mine = -1;
    unsigned long long mine_above = 0;
    for (int j = 0; j < k; j++) {
        const unsigned long long hd = h[hi - j];
        if (hd && passes(a + (double)(s + hd) * sc, target, strict)) {
            mine = hi - j, mine_above = s;
            break;
        }
        s += hd;
    }
    if (mine >= 0) atomicMax(&sh.best, mine);
    __syncthreads();
    const int best = sh.best;
    if (best >= 0 && mine == best) sh.best_above = mine_above;
    __syncthreads();
    *above = sh.best_above;
    return best;
}

/* The smallest r in [1, count] with a + (w + r * mant) * sc passing the test; count when none.
 * The same in every thread (block-uniform arguments). */
__device__ int64_t tie_count(double a, unsigned long long w, uint32_t mant, double sc, int64_t count, double target,
                             bool strict)
{
    int64_t lo = 1, hi = count;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (passes(a + (double)(w + (unsigned long long)mid * mant) * sc, target, strict)) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* The k-th lowest id (k >= 1) whose value has bits `bits`: contiguous per-thread chunks,
 * counted, scanned, and the chunk holding it walked. -1 when fewer than k. */
__device__ int32_t kth_id(const float *x, int32_t V, uint32_t bits, int64_t k, row_shared &sh)
{
    const int32_t c = (V + THREADS - 1) / THREADS;
    const int32_t b0 = min(V, (int32_t)threadIdx.x * c), b1 = min(V, b0 + c);
    int cnt = 0;
    for (int32_t i = b0; i < b1; i++) cnt += __float_as_uint(x[i]) == bits;
    if (threadIdx.x == 0) sh.found = -1;
    int total;
    const int ex = block_excl_scan(cnt, sh.scan_i, &total);
    if (ex < k && k <= ex + cnt) {
        int64_t j = ex;
        for (int32_t i = b0; i < b1; i++)
            if (__float_as_uint(x[i]) == bits && ++j == k) {
                sh.found = i;
                break;
            }
    }
    __syncthreads();
    const int32_t id = sh.found;
    __syncthreads();
    return id;
}

/* No top-p: the first id whose running sum (id order) exceeds u times the total; the last id
 * when u rounds up to it (as the reference). The probabilities are computed into x on the way. */
__device__ int32_t pick_in_id_order(float *x, int32_t V, float m, float t, double u, row_shared &sh)
{
    const int32_t c = (V + THREADS - 1) / THREADS;
    const int32_t b0 = min(V, (int32_t)threadIdx.x * c), b1 = min(V, b0 + c);
    double s = 0.0, z;
    for (int32_t i = b0; i < b1; i++) {
        const float p = prob(x[i], m, t);
        x[i] = p;
        s += p;
    }
    if (threadIdx.x == 0) sh.found = INT32_MAX;
    double acc = block_excl_scan(s, sh.scan_d, &z);
    const double target = u * z;
    for (int32_t i = b0; i < b1; i++) { /* a later chunk stops at once: the lowest id wins */
        const float p = x[i];
        acc += p;
        if (p > 0.0f && target < acc) {
            atomicMin(&sh.found, i);
            break;
        }
    }
    __syncthreads();
    return sh.found == INT32_MAX ? V - 1 : sh.found;
}

/* The value the descent found: its bits, the exponent's A and the mantissa sum above it. */
struct level_pick {
    uint32_t bits;
    double a, sc;
    unsigned long long above; /* mantissa sum of the exponent's elements above bits (and above floor) */
    int64_t count;            /* elements of value bits */
};

/* Levels 2 and 3 within exponent bin e (A = a), elements above floor only: the largest value
 * whose H passes the test. false when none (rounding). */
__device__ bool descend(const float *x, int32_t V, uint32_t e, double a, uint32_t floor, double target, bool strict,
                        row_shared &sh, level_pick *out)
{
    const double sc = scale_of(e);
    unsigned long long w2, w3;
    level_hist(x, V, L3_BITS, L2_BITS, e, floor, sh.hist);
    const int d2 = find_digit(sh.hist, L2_BITS, 0, a, sc, target, strict, sh, &w2);
    if (d2 < 0) return false;
    const uint32_t prefix = (e << L2_BITS) | (uint32_t)d2;
    level_hist(x, V, 0, L3_BITS, prefix, floor, sh.hist);
    const int d3 = find_digit(sh.hist, L3_BITS, w2, a, sc, target, strict, sh, &w3);
    if (d3 < 0) return false;
    out->bits = (prefix << L3_BITS) | (uint32_t)d3;
    out->a = a, out->sc = sc, out->above = w3;
    out->count = (int64_t)(sh.hist[d3] / mant_of(out->bits));
    __syncthreads(); /* sh.hist is read above before anyone refills it */
    return true;
}

/* Top-p in (0, 1): the kept set (every value above v, and the r lowest ids of value v), then the
 * token for u within it, as the reference's sorted scan. -1 on a degenerate row. */
__device__ int32_t pick_nucleus(float *x, int32_t V, float m, float t, float top_p, double u, row_shared &sh)
{
    for (int e = threadIdx.x; e < L1_BINS; e += THREADS) sh.hist1[e] = 0;
    __syncthreads();
    for (int32_t i0 = 0; i0 < V; i0 += THREADS) {
        const int32_t i = i0 + (int32_t)threadIdx.x;
        uint32_t b = 0;
        if (i < V) {
            const float p = prob(x[i], m, t);
            x[i] = p;
            b = __float_as_uint(p);
        }
        hist_add(sh.hist1, b ? (int)(b >> 23) : -1, mant_of(b));
    }
    __syncthreads();
    /* 1. v: the largest value with H(v) >= top_p times the total; r ties of it. */
    find_bin(sh, (double)top_p, true, false, true);
    __syncthreads();
    const int e1 = sh.bin;
    const double a1 = sh.bin_above, target = sh.target;
    __syncthreads();
    level_pick v = {};
    if (e1 < 0 || !descend(x, V, (uint32_t)e1, a1, 0u, target, false, sh, &v)) return -1;
    const uint32_t mv = mant_of(v.bits);
    const int64_t r = tie_count(v.a, v.above, mv, v.sc, v.count, target, false);
    const double mass = v.a + (double)(v.above + (unsigned long long)r * mv) * v.sc;
    const double us = u * mass;
    /* 2. The token: the largest value q of the kept set with H(q) > u * mass. Values above v
     * first: the exponent bins with bin e1 cut to its elements above v (the same A for e1, as
     * the bins above are unchanged), then levels 2 and 3 above v. */
    if (threadIdx.x < 32) {
        for (int e = threadIdx.x; e <= e1; e += 32) sh.hist1[e] = e == e1 ? v.above : 0;
        __syncwarp();
        find_bin(sh, us, false, true, false);
    }
    __syncthreads();
    const int e2 = sh.bin;
    const double a2 = sh.bin_above;
    __syncthreads();
    level_pick q = {};
    if (e2 >= 0 && descend(x, V, (uint32_t)e2, a2, v.bits, us, true, sh, &q)) {
        const int64_t k = tie_count(q.a, q.above, mant_of(q.bits), q.sc, q.count, us, true);
        return kth_id(x, V, q.bits, k, sh);
    }
    /* Else one of the r kept ties of v (the r-th when u * mass rounds up to the kept mass). */
    return kth_id(x, V, v.bits, tie_count(v.a, v.above, mv, v.sc, r, us, true), sh);
}

/* One block per row. */
__global__ void __launch_bounds__(THREADS) sample_kernel(float *logits, int32_t V, const mkv_sample_row_t *rows,
                                                         int32_t *next)
{
    __shared__ row_shared sh;
    float *x = logits + (int64_t)blockIdx.x * V;
    const mkv_sample_row_t pr = rows[blockIdx.x];
    float m;
    int32_t best;
    block_argmax(x, V, sh, &m, &best);
    int32_t id = best;
    if (!(pr.temperature <= 0.0f) && V > 1) {
        if (pr.top_p > 0.0f && pr.top_p < 1.0f) id = pick_nucleus(x, V, m, pr.temperature, pr.top_p, pr.u, sh);
        else id = pick_in_id_order(x, V, m, pr.temperature, pr.u, sh);
        if (id < 0 || id >= V) id = best; /* non-finite logits */
    }
    if (threadIdx.x == 0) next[blockIdx.x] = id;
}

} // namespace

static mkv_status_t launch(float *logits, int32_t n, int32_t vocab, const mkv_sample_row_t *rows, int32_t *next,
                           cudaStream_t stream, char *err)
{
    sample_kernel<<<n, THREADS, 0, stream>>>(logits, vocab, rows, next);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return runner_fail(err, MKV_STATUS_CUDA_ERROR, "CUDA sampling: %s", cudaGetErrorString(e));
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_sample(float *logits, int32_t n, int32_t vocab, const mkv_sample_row_t *rows,
                                        int32_t *next, void *stream, char *err)
{
    if (!logits || !rows || !next || n < 1 || vocab < 1)
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_sample: %d rows of %d, or a null pointer", n,
                           vocab);
    return launch(logits, n, vocab, rows, next, (cudaStream_t)stream, err);
}
