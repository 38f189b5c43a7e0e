/*
 * quant_cuda.cu — the quantizer on the GPU (see quant_cuda.h): quantize-and-append of new
 * tokens and the demotion of stored ones, byte-identical to quant/quant.c. Kernels first, then
 * launchers, then the entry points.
 *
 * One warp per vector job (a (token, head) of an append, a token of a demotion); the warp
 * stages its d <= 256 sanitised fp32 values and its codes in shared memory, reduces each
 * group's min and max with shuffles, and writes codes, metadata, score and position byte by
 * byte (pages have no alignment promise: page_bytes may be any size). Every arithmetic step
 * is quant.c's, in the same order and precision, spelt with explicit round-to-nearest
 * intrinsics so that no compiler contraction can change a bit. NOTE: this file relies on IEEE
 * fp32 with subnormals (no -ftz=true, no --use_fast_math); the subnormal and tiny-range tests
 * of tests/gpu/test_quant_cuda.c fail if that changes.
 */
#include "quant/quant_cuda.h"

#include "common/error.h"
#include "quant/half.h"

#include <cuda_runtime.h>

#include <stdint.h>

#define QC_MAX_D 256          /* format.c accepts d up to 256 */
#define QC_WARPS 4            /* warps (vector jobs in flight) per block */
#define QC_MAX_BLOCKS 65535   /* grid-stride beyond this */
#define FULL_MASK 0xffffffffu

/* ---------------------------------------------------------------------------------------- */
/* Device helpers: quant.c's steps, one for one                                              */
/* ---------------------------------------------------------------------------------------- */

/* mkv_quant_sanitize: NaN -> 0, beyond +-65504 (inf included) -> +-65504. */
__device__ __forceinline__ float sanitize(float v)
{
    if (isnan(v)) return 0.0f;
    if (v > MKV_F16_MAX || v < -MKV_F16_MAX) return v > 0.0f ? MKV_F16_MAX : -MKV_F16_MAX;
    return v;
}

/* quant.c's f16_next_down / f16_next_up: one fp16 ulp towards -inf / +inf (sign-magnitude). */
__device__ __forceinline__ uint16_t f16_next_down(uint16_t h)
{
    if (h == 0x0000u) return 0x8001u;
    return (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
}

__device__ __forceinline__ uint16_t f16_next_up(uint16_t h)
{
    if (h == 0x8000u || h == 0x0000u) return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1u) : (uint16_t)(h + 1u);
}

/* The largest fp16 <= x (quant.c's f16_round_down); -0 stays -0, as on the CPU. */
__device__ __forceinline__ uint16_t f16_round_down(float x)
{
    const uint16_t h = mkv_f32_to_f16(x);
    return mkv_f16_to_f32(h) > x ? f16_next_down(h) : h;
}

/* quant.c's group_scale: round the fp32 quotient up to fp16, then the exact double check. */
__device__ __forceinline__ uint16_t group_scale(float hi, uint16_t zero_h, int32_t bits)
{
    const float m = (float)((1 << bits) - 1);
    const float zero = mkv_f16_to_f32(zero_h);
    const float want = __fdiv_rn(__fsub_rn(hi, zero), m);
    uint16_t s = mkv_f32_to_f16(want);
    if (mkv_f16_to_f32(s) < want) s = f16_next_up(s);
    if (__dadd_rn((double)__fmul_rn(m, mkv_f16_to_f32(s)), (double)zero) < (double)hi)
        s = f16_next_up(s);
    return s;
}

/* The group's min (want_max false) or max, warp-wide. The CPU scans in order and replaces
 * only on a strict < (>), so of equal values it keeps the first: that decides the sign of a
 * zero min or max ([+0, -0, ...] vs [-0, +0, ...]), which reaches the stored zero. Hence the
 * (value, index) reduction with the lower index winning ties. */
__device__ __forceinline__ float warp_extreme(const float *x, int32_t n, int lane, bool want_max)
{
    float best = 0.0f;
    int32_t at = -1;
    for (int32_t i = lane; i < n; i += 32) {
        const float v = x[i];
        if (at < 0 || (want_max ? v > best : v < best)) best = v, at = i;
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, best, off);
        const int32_t oat = __shfl_xor_sync(FULL_MASK, at, off);
        const bool better = oat >= 0 && (at < 0 || (want_max ? ov > best : ov < best) ||
                                         (ov == best && oat < at));
        if (better) best = ov, at = oat;
    }
    return best;
}

__device__ __forceinline__ void put_bytes(uint8_t *p, uint32_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

__device__ __forceinline__ uint32_t get_bytes(const uint8_t *p, int n)
{
    uint32_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

/* Byte offset within a page of byte j of a vector's packed codes (format.h's chunk order). */
__device__ __forceinline__ int64_t packed_byte(const mkv_page_layout_t *lay, int which,
                                               int32_t slot, int32_t j)
{
    const int32_t cb = which ? lay->value.chunk_bytes : lay->key.chunk_bytes;
    return mkv_code_offset(lay, which, slot, j / cb) + j % cb;
}

/* mkv_quant_write_vector by one warp: x[d] (shared, already sanitised) into the key or value
 * of slot; q[d] is shared scratch for the unpacked codes. Ends with the warp synchronised. */
__device__ void write_vector(uint8_t *page, const mkv_page_layout_t *lay, int which,
                             int32_t slot, const float *x, uint8_t *q, int lane)
{
    const mkv_vec_layout_t *v = which ? &lay->value : &lay->key;
    const int32_t d = lay->head_dim;
    if (v->bits == 16) {
        for (int32_t i = lane; i < d; i += 32)
            put_bytes(page + packed_byte(lay, which, slot, 2 * i), mkv_f32_to_f16(x[i]), 2);
        __syncwarp();
        return;
    }
    const int32_t n = v->group_elems, qmax = (1 << v->bits) - 1;
    for (int32_t g = 0; g < v->groups; g++) {
        const float *xg = x + g * n;
        uint8_t *qg = q + g * n;
        const float lo = warp_extreme(xg, n, lane, false);
        const float hi = warp_extreme(xg, n, lane, true);
        uint16_t scale_h = 0, zero_h;
        if (lo == hi) { /* constant group, compared after sanitising, -0 == +0 included */
            zero_h = mkv_f32_to_f16(lo);
            for (int32_t i = lane; i < n; i += 32) qg[i] = 0;
        } else {
            zero_h = f16_round_down(lo);
            scale_h = group_scale(hi, zero_h, v->bits);
            const float zero_f = mkv_f16_to_f32(zero_h), scale_f = mkv_f16_to_f32(scale_h);
            for (int32_t i = lane; i < n; i += 32) {
                /* scale > 0, so the quotient is finite; clamping the int is clamping quant.c's
                 * float, as __float2int_rn saturates (and x >= zero keeps it >= 0 anyway). */
                const int c = __float2int_rn(__fdiv_rn(__fsub_rn(xg[i], zero_f), scale_f));
                qg[i] = (uint8_t)(c < 0 ? 0 : c > qmax ? qmax : c);
            }
        }
        if (lane == 0) {
            uint8_t *meta = page + mkv_meta_offset(lay, which, slot, g);
            put_bytes(meta, scale_h, 2);
            put_bytes(meta + 2, zero_h, 2);
        }
    }
    __syncwarp();
    const int32_t per_byte = 8 / v->bits;
    for (int32_t j = lane; j < v->vec_bytes; j += 32) {
        uint32_t b = 0;
        for (int32_t e = 0; e < per_byte; e++) b |= (uint32_t)q[j * per_byte + e] << (e * v->bits);
        page[packed_byte(lay, which, slot, j)] = (uint8_t)b;
    }
    __syncwarp();
}

/* mkv_quant_read_vector by one warp, sanitised on the way in (as mkv_page_write_token will
 * sanitise it): the key or value of slot into x[d] (shared). Ends synchronised. */
__device__ void read_vector(const uint8_t *page, const mkv_page_layout_t *lay, int which,
                            int32_t slot, float *x, int lane)
{
    const mkv_vec_layout_t *v = which ? &lay->value : &lay->key;
    const int32_t d = lay->head_dim;
    for (int32_t i = lane; i < d; i += 32) {
        float e;
        if (v->bits == 16) {
            e = mkv_f16_to_f32((uint16_t)get_bytes(page + packed_byte(lay, which, slot, 2 * i), 2));
        } else {
            const int32_t bit = i * v->bits;
            const uint32_t mask = (1u << v->bits) - 1u;
            const uint32_t code = (page[packed_byte(lay, which, slot, bit / 8)] >> (bit % 8)) & mask;
            const uint8_t *meta = page + mkv_meta_offset(lay, which, slot, i / v->group_elems);
            const float s = mkv_f16_to_f32((uint16_t)get_bytes(meta, 2));
            const float z = mkv_f16_to_f32((uint16_t)get_bytes(meta + 2, 2));
            e = __fadd_rn(__fmul_rn((float)code, s), z); /* the product is exact */
        }
        x[i] = sanitize(e);
    }
    __syncwarp();
}

/* ---------------------------------------------------------------------------------------- */
/* Kernels                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Job j = token j / H, head j % H. Jobs whose page or slot is out of range are skipped (the
 * host cannot check device arrays without a synchronisation; a stray write would corrupt
 * another page). */
static __global__ void __launch_bounds__(QC_WARPS * 32)
append_kernel(const __grid_constant__ mkv_cuda_append_t a, int64_t n_jobs)
{
    __shared__ float xs[QC_WARPS][QC_MAX_D];
    __shared__ uint8_t qs[QC_WARPS][QC_MAX_D];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t d = a.lay.head_dim;
    for (int64_t j = (int64_t)blockIdx.x * QC_WARPS + warp; j < n_jobs;
         j += (int64_t)gridDim.x * QC_WARPS) {
        const int32_t page = a.page[j], slot = a.slot[j];
        if (page < 0 || slot < 0 || slot >= a.lay.tokens) continue; /* warp-uniform */
        uint8_t *pg = a.pool + (int64_t)page * a.page_bytes;
        for (int which = 0; which < 2; which++) {
            const uint16_t *src = (which ? a.v : a.k) + j * d;
            for (int32_t i = lane; i < d; i += 32) {
                /* bf16 -> fp32 is the bits shifted up; fp16 -> fp32 is exact */
                const float e = a.is_bf16 ? mkv_bits_f32((uint32_t)src[i] << 16)
                                          : mkv_f16_to_f32(src[i]);
                xs[warp][i] = sanitize(e);
            }
            __syncwarp();
            write_vector(pg, &a.lay, which, slot, xs[warp], qs[warp], lane);
        }
        if (lane == 0) {
            put_bytes(pg + mkv_score_offset(&a.lay, slot), mkv_f32_bits(a.score), 4);
            put_bytes(pg + mkv_pos_offset(&a.lay, slot), (uint32_t)a.pos[j / a.n_heads], 4);
        }
    }
}

struct demote_args {
    uint8_t *pool;
    int64_t page_bytes;
    mkv_page_layout_t src, dst;
    int32_t n;
    const int32_t *src_page, *src_slot, *dst_page, *dst_slot; /* [n] */
};

static __global__ void __launch_bounds__(QC_WARPS * 32)
demote_kernel(const __grid_constant__ demote_args a)
{
    __shared__ float xs[QC_WARPS][QC_MAX_D];
    __shared__ uint8_t qs[QC_WARPS][QC_MAX_D];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t j = (int64_t)blockIdx.x * QC_WARPS + warp; j < a.n;
         j += (int64_t)gridDim.x * QC_WARPS) {
        const int32_t sp = a.src_page[j], ss = a.src_slot[j];
        const int32_t dp = a.dst_page[j], ds = a.dst_slot[j];
        if (sp < 0 || ss < 0 || ss >= a.src.tokens || dp < 0 || ds < 0 || ds >= a.dst.tokens)
            continue; /* warp-uniform; see append_kernel */
        const uint8_t *src = a.pool + (int64_t)sp * a.page_bytes;
        uint8_t *dst = a.pool + (int64_t)dp * a.page_bytes;
        for (int which = 0; which < 2; which++) {
            read_vector(src, &a.src, which, ss, xs[warp], lane);
            write_vector(dst, &a.dst, which, ds, xs[warp], qs[warp], lane);
        }
        if (lane < 4) {
            dst[mkv_score_offset(&a.dst, ds) + lane] = src[mkv_score_offset(&a.src, ss) + lane];
            dst[mkv_pos_offset(&a.dst, ds) + lane] = src[mkv_pos_offset(&a.src, ss) + lane];
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Launchers                                                                                */
/* ---------------------------------------------------------------------------------------- */

static unsigned blocks_for(int64_t jobs)
{
    const int64_t b = (jobs + QC_WARPS - 1) / QC_WARPS;
    return (unsigned)(b < QC_MAX_BLOCKS ? b : QC_MAX_BLOCKS);
}

static mkv_status_t launched(const char *what, char *err)
{
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return mkv_fail(err, MKV_STATUS_CUDA_ERROR, "%s launch: %s", what, cudaGetErrorString(e));
    return MKV_STATUS_OK;
}

static mkv_status_t launch_append(const mkv_cuda_append_t *a, int64_t n_jobs,
                                  cudaStream_t stream, char *err)
{
    append_kernel<<<blocks_for(n_jobs), QC_WARPS * 32, 0, stream>>>(*a, n_jobs);
    return launched("append_kernel", err);
}

static mkv_status_t launch_demote(const demote_args *a, cudaStream_t stream, char *err)
{
    demote_kernel<<<blocks_for(a->n), QC_WARPS * 32, 0, stream>>>(*a);
    return launched("demote_kernel", err);
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                             */
/* ---------------------------------------------------------------------------------------- */

static bool same_vec(const mkv_vec_layout_t *a, const mkv_vec_layout_t *b)
{
    return a->bits == b->bits && a->vec_bytes == b->vec_bytes && a->chunk_bytes == b->chunk_bytes &&
           a->n_chunks == b->n_chunks && a->chunk_elems == b->chunk_elems &&
           a->groups == b->groups && a->group_elems == b->group_elems;
}

/* The kernels trust every field of a layout, so a layout must be exactly the one format.c
 * derives for its format, d and groups in pages of page_bytes (what every caller builds with
 * mkv_page_layout); this also bounds d by 256 and keeps each slot inside its page. */
static mkv_status_t check_layout(const mkv_page_layout_t *lay, int64_t page_bytes,
                                 const char *what, char *err)
{
    int f = 0;
    for (; f < MKV_FORMAT_COUNT; f++) {
        const mkv_format_desc_t *fd = mkv_format_desc((mkv_format_t)f);
        if (fd->key_bits == lay->key.bits && fd->value_bits == lay->value.bits) break;
    }
    if (f == MKV_FORMAT_COUNT)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "%s: no format has %d-bit keys and %d-bit values", what, lay->key.bits,
                        lay->value.bits);
    if (lay->head_dim < 1 || lay->head_dim > QC_MAX_D)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "%s: head_dim %d is not in 1..%d",
                        what, lay->head_dim, QC_MAX_D);
    const int32_t kg = lay->key.group_elems, vg = lay->value.group_elems;
    const mkv_format_t format = (mkv_format_t)f;
    char why[MKV_ERR_LEN];
    mkv_page_layout_t ref;
    if (mkv_page_layout(format, lay->head_dim, kg, vg, page_bytes, &ref, why) != MKV_STATUS_OK)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "%s: %s", what, why);
    bool same = lay->tokens == ref.tokens && lay->head_dim == ref.head_dim &&
                same_vec(&lay->key, &ref.key) && same_vec(&lay->value, &ref.value) &&
                lay->used_bytes == ref.used_bytes;
    for (int s = 0; s < MKV_PAGE_SEGMENTS; s++)
        same = same && lay->offset[s] == ref.offset[s] && lay->bytes[s] == ref.bytes[s];
    if (!same)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "%s: the layout is not mkv_page_layout(%s, d = %d, groups of %d / %d "
                        "elements, page_bytes = %lld) (groups or head dims mismatching?)",
                        what, mkv_format_name(format), lay->head_dim, kg, vg,
                        (long long)page_bytes);
    return MKV_STATUS_OK;
}

extern "C" mkv_status_t mkv_cuda_quant_append(const mkv_cuda_append_t *a, void *stream, char *err)
{
    char local[MKV_ERR_LEN];
    if (!err) err = local;
    if (!a) return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_quant_append: a is NULL");
    if (a->n_tok < 0 || a->n_heads < 0)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "mkv_cuda_quant_append: n_tok %d and n_heads %d must be >= 0", a->n_tok,
                        a->n_heads);
    const int64_t n_jobs = (int64_t)a->n_tok * a->n_heads;
    if (!a->pool || (n_jobs > 0 && (!a->k || !a->v || !a->page || !a->slot || !a->pos)))
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "mkv_cuda_quant_append: null pointer (pool %p, k %p, v %p, page %p, "
                        "slot %p, pos %p)", (void *)a->pool, (const void *)a->k,
                        (const void *)a->v, (const void *)a->page, (const void *)a->slot,
                        (const void *)a->pos);
    const mkv_status_t st = check_layout(&a->lay, a->page_bytes, "mkv_cuda_quant_append", err);
    if (st != MKV_STATUS_OK) return st;
    if (n_jobs == 0) return MKV_STATUS_OK;
    return launch_append(a, n_jobs, (cudaStream_t)stream, err);
}

extern "C" mkv_status_t mkv_cuda_demote(uint8_t *pool, int64_t page_bytes,
                                        const mkv_page_layout_t *src, const mkv_page_layout_t *dst,
                                        int32_t n, const int32_t *src_page, const int32_t *src_slot,
                                        const int32_t *dst_page, const int32_t *dst_slot,
                                        void *stream, char *err)
{
    char local[MKV_ERR_LEN];
    if (!err) err = local;
    if (n < 0)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_demote: n %d must be >= 0", n);
    if (!pool || !src || !dst ||
        (n > 0 && (!src_page || !src_slot || !dst_page || !dst_slot)))
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "mkv_cuda_demote: null pointer (pool %p, src %p, dst %p, src_page %p, "
                        "src_slot %p, dst_page %p, dst_slot %p)", (void *)pool, (const void *)src,
                        (const void *)dst, (const void *)src_page, (const void *)src_slot,
                        (const void *)dst_page, (const void *)dst_slot);
    mkv_status_t st = check_layout(src, page_bytes, "mkv_cuda_demote (src)", err);
    if (st != MKV_STATUS_OK) return st;
    st = check_layout(dst, page_bytes, "mkv_cuda_demote (dst)", err);
    if (st != MKV_STATUS_OK) return st;
    if (src->head_dim != dst->head_dim)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "mkv_cuda_demote: head_dim differs (src %d, dst %d)", src->head_dim,
                        dst->head_dim);
    if (n == 0) return MKV_STATUS_OK;
    const demote_args a = {pool, page_bytes, *src, *dst, n, src_page, src_slot, dst_page, dst_slot};
    return launch_demote(&a, (cudaStream_t)stream, err);
}
