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
#include "quant/quant_cuda.cuh"

#include <cuda_runtime.h>

#include <stdint.h>

#define QC_WARPS 4            /* warps (vector jobs in flight) per block */
#define QC_MAX_BLOCKS 65535   /* grid-stride beyond this */

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
