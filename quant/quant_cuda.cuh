/*
 * quant_cuda.cuh — the quantizer's device functions (quant.c's steps, one for one), shared by
 * the CUDA translation units that write or read tokens in pages: quant/quant_cuda.cu and the
 * KV backend's kernels (engine/kv_cuda.cu). Warp-level: one warp per vector. Relies on IEEE
 * fp32 with subnormals (no -ftz=true, no --use_fast_math).
 */
#ifndef MKV_QUANT_QUANT_CUDA_CUH
#define MKV_QUANT_QUANT_CUDA_CUH

#include "quant/format.h"
#include "quant/half.h"

#include <cuda_runtime.h>

#include <stdint.h>

#define QC_MAX_D 256 /* format.c accepts d up to 256 */
#ifndef FULL_MASK
#define FULL_MASK 0xffffffffu
#endif

/* ---------------------------------------------------------------------------------------- */
/* Device helpers: quant.c's steps, one for one                                              */
/* ---------------------------------------------------------------------------------------- */

/* mkv_quant_sanitize: NaN -> 0, beyond +-65504 (inf included) -> +-65504. */
static __device__ __forceinline__ float sanitize(float v)
{
    if (isnan(v)) return 0.0f;
    if (v > MKV_F16_MAX || v < -MKV_F16_MAX) return v > 0.0f ? MKV_F16_MAX : -MKV_F16_MAX;
    return v;
}

/* quant.c's f16_next_down / f16_next_up: one fp16 ulp towards -inf / +inf (sign-magnitude). */
static __device__ __forceinline__ uint16_t f16_next_down(uint16_t h)
{
    if (h == 0x0000u) return 0x8001u;
    return (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
}

static __device__ __forceinline__ uint16_t f16_next_up(uint16_t h)
{
    if (h == 0x8000u || h == 0x0000u) return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1u) : (uint16_t)(h + 1u);
}

/* The largest fp16 <= x (quant.c's f16_round_down); -0 stays -0, as on the CPU. */
static __device__ __forceinline__ uint16_t f16_round_down(float x)
{
    const uint16_t h = mkv_f32_to_f16(x);
    return mkv_f16_to_f32(h) > x ? f16_next_down(h) : h;
}

/* quant.c's group_scale: round the fp32 quotient up to fp16, then the exact double check. */
static __device__ __forceinline__ uint16_t group_scale(float hi, uint16_t zero_h, int32_t bits)
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

static __device__ __forceinline__ void put_bytes(uint8_t *p, uint32_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static __device__ __forceinline__ uint32_t get_bytes(const uint8_t *p, int n)
{
    uint32_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

/* log2 of a power of two (format.h's chunk bytes and group elements all are): a shift
 * instead of an integer division by a runtime value (about twenty instructions each). */
static __device__ __forceinline__ int32_t log2_p2(int32_t p) { return __ffs(p) - 1; }

/* Byte offset within a page of byte j >= 0 of a vector's packed codes (format.h's chunk
 * order; chunk_bytes = min(16, vec_bytes), a power of two). */
static __device__ __forceinline__ int64_t packed_byte(const mkv_page_layout_t *lay, int which,
                                               int32_t slot, int32_t j)
{
    const int32_t cb = which ? lay->value.chunk_bytes : lay->key.chunk_bytes;
    return mkv_code_offset(lay, which, slot, j >> log2_p2(cb)) + (j & (cb - 1));
}

/* mkv_quant_write_vector by one warp: x[d] (shared, already sanitised) into the key or value
 * of slot; q[d] is shared scratch for the unpacked codes. Ends with the warp synchronised. */
static __device__ void write_vector(uint8_t *page, const mkv_page_layout_t *lay, int which,
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
    /* Every group at once: lane l holds elements [l * E, (l + 1) * E), so a group of n
     * elements is n / E neighbouring lanes (a power of two), whose min and max come from xor
     * shuffles inside that lane segment. The CPU scans a group in order and replaces only on a
     * strict < (>), so of equal values it keeps the first: that decides the sign of a zero min
     * or max ([+0, -0, ...] vs [-0, +0, ...]), which reaches the stored zero. Hence (value,
     * index) pairs with the lower index winning ties. */
    const int32_t n = v->group_elems, qmax = (1 << v->bits) - 1;
    const int32_t E = d >= 32 ? d / 32 : 1, lanes = n / E, i0 = lane * E;
    const bool active = i0 < d;
    float lo = 0.0f, hi = 0.0f;
    int32_t lo_at = -1, hi_at = -1;
    for (int32_t e = 0; e < E && active; e++) {
        const float xv = x[i0 + e];
        if (lo_at < 0 || xv < lo) lo = xv, lo_at = i0 + e;
        if (hi_at < 0 || xv > hi) hi = xv, hi_at = i0 + e;
    }
    for (int off = lanes / 2; off > 0; off >>= 1) {
        const float olo = __shfl_xor_sync(FULL_MASK, lo, off), ohi = __shfl_xor_sync(FULL_MASK, hi, off);
        const int32_t olo_at = __shfl_xor_sync(FULL_MASK, lo_at, off);
        const int32_t ohi_at = __shfl_xor_sync(FULL_MASK, hi_at, off);
        if (olo_at >= 0 && (lo_at < 0 || olo < lo || (olo == lo && olo_at < lo_at))) lo = olo, lo_at = olo_at;
        if (ohi_at >= 0 && (hi_at < 0 || ohi > hi || (ohi == hi && ohi_at < hi_at))) hi = ohi, hi_at = ohi_at;
    }
    /* A lane's E codes fill whole bytes that sit together in one chunk where E * bits is 8, 16,
     * 32 or 64 (d 64 to 256 at 2 to 8 bits, but 2-bit at d 64): one store from registers. */
    const int32_t lane_bits = E * v->bits, lane_bytes = lane_bits / 8;
    const bool direct = d >= 32 && lane_bits % 8 == 0 && lane_bytes <= 8 && v->chunk_bytes % lane_bytes == 0;
    uint64_t packed = 0;
    if (active) {
        uint16_t scale_h = 0, zero_h;
        if (lo == hi) { /* constant group, compared after sanitising, -0 == +0 included */
            zero_h = mkv_f32_to_f16(lo);
            if (!direct)
                for (int32_t e = 0; e < E; e++) q[i0 + e] = 0;
        } else {
            zero_h = f16_round_down(lo);
            scale_h = group_scale(hi, zero_h, v->bits);
            const float zero_f = mkv_f16_to_f32(zero_h), scale_f = mkv_f16_to_f32(scale_h);
            for (int32_t e = 0; e < E; e++) {
                /* scale > 0, so the quotient is finite; clamping the int is clamping quant.c's
                 * float, as __float2int_rn saturates (and x >= zero keeps it >= 0 anyway). */
                const int c = __float2int_rn(__fdiv_rn(__fsub_rn(x[i0 + e], zero_f), scale_f));
                const uint32_t code = (uint32_t)(c < 0 ? 0 : c > qmax ? qmax : c);
                if (direct) packed |= (uint64_t)code << (e * v->bits);
                else q[i0 + e] = (uint8_t)code;
            }
        }
        if ((i0 & (n - 1)) == 0) /* the group's first lane writes its metadata: {scale, zero}, one word */
            *(uint32_t *)(page + mkv_meta_offset(lay, which, slot, i0 >> log2_p2(n))) =
                (uint32_t)scale_h | (uint32_t)zero_h << 16;
    }
    if (direct) { /* little-endian: code e at bit e * bits of the lane's bytes, as below */
        if (active) {
            uint8_t *dst = page + packed_byte(lay, which, slot, i0 * v->bits / 8);
            switch (lane_bytes) {
            case 1: *dst = (uint8_t)packed; break;
            case 2: *(uint16_t *)dst = (uint16_t)packed; break;
            case 4: *(uint32_t *)dst = (uint32_t)packed; break;
            default: *(uint64_t *)dst = packed; break;
            }
        }
        __syncwarp();
        return;
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
static __device__ void read_vector(const uint8_t *page, const mkv_page_layout_t *lay, int which,
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
            /* {scale, zero}: one aligned word (segments start on 16-byte boundaries) */
            const uint32_t meta =
                *(const uint32_t *)(page + mkv_meta_offset(lay, which, slot, i >> log2_p2(v->group_elems)));
            const float s = mkv_f16_to_f32((uint16_t)meta), z = mkv_f16_to_f32((uint16_t)(meta >> 16));
            e = __fadd_rn(__fmul_rn((float)code, s), z); /* the product is exact */
        }
        x[i] = sanitize(e);
    }
    __syncwarp();
}

#endif /* MKV_QUANT_QUANT_CUDA_CUH */
