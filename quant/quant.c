/*
 * quant.c — the reference quantizer of the CPU backend (contract in quant.h, page layout in
 * format.h). The CUDA quantizer must store the same bits, so every step here is one a kernel
 * can repeat exactly: fp16 conversions from half.h, fp32 IEEE arithmetic in a fixed order,
 * round-to-nearest-even. Notes for a port:
 *   - q = rint((x - zero) / scale) is a subtraction and an IEEE division in fp32, then
 *     round-half-even (__float2int_rn); no fast-math reciprocal;
 *   - dequantization q * scale + zero may be contracted into an FMA or not: q has at most 8
 *     significant bits and scale 11, so the product is exact in fp32 and only the add rounds;
 *   - the scale check in group_scale() is exact (double), not an fp32 comparison.
 * Pages are plain byte arrays with no alignment promise: every multi-byte field goes through
 * memcpy or explicit little-endian bytes, never through a cast pointer.
 */
#include "quant/quant.h"

#include "quant/half.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#define MKV_MAX_HEAD_DIM 256 /* format.c accepts d up to 256 */

int mkv_quant_sanitize(float *x)
{
    const float v = *x;
    if (isnan(v)) {
        *x = 0.0f;
        return 1;
    }
    /* Also catches +-inf. Values in (65504, 65520) would round to 65504 anyway, but a fixed
     * clamp keeps "sanitised" a property of the input alone. */
    if (v > MKV_F16_MAX || v < -MKV_F16_MAX) {
        *x = v > 0.0f ? MKV_F16_MAX : -MKV_F16_MAX;
        return 1;
    }
    return 0;
}

/* The fp16 one ulp towards -inf from h (h finite, not -65504). Halves are sign-magnitude, so
 * for a positive h that is h - 1 and for a negative h (or -0) it is h + 1 in magnitude; +0
 * steps to the smallest negative subnormal. */
static uint16_t f16_next_down(uint16_t h)
{
    if (h == 0x0000u) return 0x8001u;
    return (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
}

/* The fp16 one ulp towards +inf from h (h finite, not 65504); mirror of f16_next_down. */
static uint16_t f16_next_up(uint16_t h)
{
    if (h == 0x8000u || h == 0x0000u) return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1u) : (uint16_t)(h + 1u);
}

/* The largest fp16 <= x, for finite |x| <= 65504. Round to nearest lands within half an ulp,
 * so one step down is enough when it landed above x (also across a binade boundary). */
static uint16_t f16_round_down(float x)
{
    const uint16_t h = mkv_f32_to_f16(x);
    return mkv_f16_to_f32(h) > x ? f16_next_down(h) : h;
}

/* The scale of a non-constant group: the smallest fp16 s with zero + m * s >= hi, exactly.
 * The fp32 quotient (hi - zero) / m is rounded twice (the difference, then the division), so
 * its upward fp16 rounding can land one ulp short when the exact quotient sits within ~2^-23
 * above an fp16 value; the exact check then steps up once (the fp16 ulp is 2^12 times coarser
 * than that error, so one step always suffices; and it never lands one ulp high, as m * s is
 * an fp32 value and rounding is monotone). In the check, m * s is exact in fp32 (at most
 * 8 + 11 significant bits) and the double sum of it and zero is exact (both are multiples of
 * 2^-24 below 2^25), so the comparison is exact; the grid then covers [lo, hi] for certain,
 * which is what bounds every element's error by half a step. */
static uint16_t group_scale(float hi, uint16_t zero_h, int32_t bits)
{
    const float m = (float)((1 << bits) - 1);
    const float zero = mkv_f16_to_f32(zero_h);
    const float want = (hi - zero) / m;
    uint16_t s = mkv_f32_to_f16(want);
    if (mkv_f16_to_f32(s) < want) s = f16_next_up(s);
    if ((double)(m * mkv_f16_to_f32(s)) + (double)zero < (double)hi) s = f16_next_up(s);
    return s;
}

int32_t mkv_quant_group(const float *x, int32_t n, int32_t bits, uint16_t *scale, uint16_t *zero,
                        uint8_t *codes)
{
    assert(bits == 8 || bits == 4 || bits == 2);
    int32_t sanitised = 0;
    float lo = 0.0f, hi = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        float v = x[i];
        sanitised += mkv_quant_sanitize(&v);
        if (i == 0 || v < lo) lo = v;
        if (i == 0 || v > hi) hi = v;
    }
    if (lo == hi) { /* constant (or empty) group: every element decodes to zero exactly */
        *scale = 0;
        *zero = mkv_f32_to_f16(lo);
        memset(codes, 0, (size_t)(n > 0 ? n : 0));
        return sanitised;
    }
    const uint16_t zero_h = f16_round_down(lo);
    const uint16_t scale_h = group_scale(hi, zero_h, bits);
    /* The encoder works from the stored fp16 values, so encoder and decoder agree exactly. */
    const float zero_f = mkv_f16_to_f32(zero_h), scale_f = mkv_f16_to_f32(scale_h);
    const float qmax = (float)((1 << bits) - 1);
    for (int32_t i = 0; i < n; i++) {
        float v = x[i];
        mkv_quant_sanitize(&v);
        /* nearbyintf rounds half to even in the default mode, like __float2int_rn. */
        float q = nearbyintf((v - zero_f) / scale_f);
        q = q < 0.0f ? 0.0f : (q > qmax ? qmax : q);
        codes[i] = (uint8_t)q;
    }
    *scale = scale_h;
    *zero = zero_h;
    return sanitised;
}

void mkv_dequant_group(const uint8_t *codes, int32_t n, uint16_t scale, uint16_t zero, float *out)
{
    const float s = mkv_f16_to_f32(scale), z = mkv_f16_to_f32(zero);
    for (int32_t i = 0; i < n; i++) {
        out[i] = (float)codes[i] * s + z; /* exact product: FMA or not, one rounding */
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Packing: a vector's packed bytes, element i at bit i * bits, are cut into chunks of         */
/* chunk_bytes; because a chunk holds a whole number of elements, chunk c of the packed vector */
/* is exactly chunk c of format.h's order, so packing and placing are separate steps.         */
/* ---------------------------------------------------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xffu);
    p[1] = (uint8_t)(v >> 8);
}

static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static const mkv_vec_layout_t *vec_of(const mkv_page_layout_t *lay, int which)
{
    return which ? &lay->value : &lay->key;
}

static void store_chunks(uint8_t *page, const mkv_page_layout_t *lay, int which, int32_t slot,
                         const uint8_t *packed)
{
    const mkv_vec_layout_t *v = vec_of(lay, which);
    for (int32_t c = 0; c < v->n_chunks; c++)
        memcpy(page + mkv_code_offset(lay, which, slot, c), packed + (size_t)c * v->chunk_bytes,
               (size_t)v->chunk_bytes);
}

static void load_chunks(const uint8_t *page, const mkv_page_layout_t *lay, int which,
                        int32_t slot, uint8_t *packed)
{
    const mkv_vec_layout_t *v = vec_of(lay, which);
    for (int32_t c = 0; c < v->n_chunks; c++)
        memcpy(packed + (size_t)c * v->chunk_bytes, page + mkv_code_offset(lay, which, slot, c),
               (size_t)v->chunk_bytes);
}

int32_t mkv_quant_write_vector(uint8_t *page, const mkv_page_layout_t *lay, int which,
                               int32_t slot, const float *x)
{
    const mkv_vec_layout_t *v = vec_of(lay, which);
    const int32_t d = lay->head_dim;
    uint8_t packed[MKV_MAX_HEAD_DIM * 2];
    int32_t sanitised = 0;
    assert(d <= MKV_MAX_HEAD_DIM && slot >= 0 && slot < lay->tokens);
    if (v->bits == 16) {
        for (int32_t i = 0; i < d; i++) {
            float e = x[i];
            sanitised += mkv_quant_sanitize(&e);
            put_u16(packed + 2 * i, mkv_f32_to_f16(e));
        }
        store_chunks(page, lay, which, slot, packed);
        return sanitised;
    }
    uint8_t codes[MKV_MAX_HEAD_DIM];
    for (int32_t g = 0; g < v->groups; g++) {
        const int32_t first = g * v->group_elems;
        uint16_t scale, zero;
        sanitised += mkv_quant_group(x + first, v->group_elems, v->bits, &scale, &zero,
                                     codes + first);
        uint8_t *meta = page + mkv_meta_offset(lay, which, slot, g);
        put_u16(meta, scale);
        put_u16(meta + 2, zero);
    }
    memset(packed, 0, (size_t)v->vec_bytes);
    for (int32_t i = 0; i < d; i++) {
        const int32_t bit = i * v->bits;
        packed[bit / 8] |= (uint8_t)(codes[i] << (bit % 8));
    }
    store_chunks(page, lay, which, slot, packed);
    return sanitised;
}

void mkv_quant_read_vector(const uint8_t *page, const mkv_page_layout_t *lay, int which,
                           int32_t slot, float *out)
{
    const mkv_vec_layout_t *v = vec_of(lay, which);
    const int32_t d = lay->head_dim;
    uint8_t packed[MKV_MAX_HEAD_DIM * 2];
    assert(d <= MKV_MAX_HEAD_DIM && slot >= 0 && slot < lay->tokens);
    load_chunks(page, lay, which, slot, packed);
    if (v->bits == 16) {
        for (int32_t i = 0; i < d; i++) out[i] = mkv_f16_to_f32(get_u16(packed + 2 * i));
        return;
    }
    uint8_t codes[MKV_MAX_HEAD_DIM];
    const unsigned mask = (1u << v->bits) - 1u;
    for (int32_t i = 0; i < d; i++) {
        const int32_t bit = i * v->bits;
        codes[i] = (uint8_t)((packed[bit / 8] >> (bit % 8)) & mask);
    }
    for (int32_t g = 0; g < v->groups; g++) {
        const uint8_t *meta = page + mkv_meta_offset(lay, which, slot, g);
        const int32_t first = g * v->group_elems;
        mkv_dequant_group(codes + first, v->group_elems, get_u16(meta), get_u16(meta + 2),
                          out + first);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Token slots                                                                               */
/* ---------------------------------------------------------------------------------------- */

float mkv_page_score(const uint8_t *page, const mkv_page_layout_t *lay, int32_t slot)
{
    float s;
    memcpy(&s, page + mkv_score_offset(lay, slot), sizeof s);
    return s;
}

void mkv_page_set_score(uint8_t *page, const mkv_page_layout_t *lay, int32_t slot, float score)
{
    memcpy(page + mkv_score_offset(lay, slot), &score, sizeof score);
}

int32_t mkv_page_pos(const uint8_t *page, const mkv_page_layout_t *lay, int32_t slot)
{
    int32_t p;
    memcpy(&p, page + mkv_pos_offset(lay, slot), sizeof p);
    return p;
}

int32_t mkv_page_write_token(uint8_t *page, const mkv_page_layout_t *lay, int32_t slot,
                             const float *k, const float *v, float score, int32_t pos)
{
    int32_t sanitised = mkv_quant_write_vector(page, lay, 0, slot, k);
    sanitised += mkv_quant_write_vector(page, lay, 1, slot, v);
    mkv_page_set_score(page, lay, slot, score);
    memcpy(page + mkv_pos_offset(lay, slot), &pos, sizeof pos);
    return sanitised;
}

void mkv_page_read_token(const uint8_t *page, const mkv_page_layout_t *lay, int32_t slot,
                         float *k, float *v, float *score, int32_t *pos)
{
    if (k) mkv_quant_read_vector(page, lay, 0, slot, k);
    if (v) mkv_quant_read_vector(page, lay, 1, slot, v);
    if (score) *score = mkv_page_score(page, lay, slot);
    if (pos) *pos = mkv_page_pos(page, lay, slot);
}

void mkv_page_copy_token(uint8_t *dst, int32_t dst_slot, const uint8_t *src, int32_t src_slot,
                         const mkv_page_layout_t *lay)
{
    /* memmove: the swap-remove copies within one page (distinct slots never overlap, and a
     * slot copied onto itself is a no-op either way). */
    for (int which = 0; which < 2; which++) {
        const mkv_vec_layout_t *v = vec_of(lay, which);
        for (int32_t c = 0; c < v->n_chunks; c++)
            memmove(dst + mkv_code_offset(lay, which, dst_slot, c),
                    src + mkv_code_offset(lay, which, src_slot, c), (size_t)v->chunk_bytes);
        if (v->bits == 16) continue; /* no metadata segment */
        for (int32_t g = 0; g < v->groups; g++)
            memmove(dst + mkv_meta_offset(lay, which, dst_slot, g),
                    src + mkv_meta_offset(lay, which, src_slot, g), 4);
    }
    memmove(dst + mkv_score_offset(lay, dst_slot), src + mkv_score_offset(lay, src_slot), 4);
    memmove(dst + mkv_pos_offset(lay, dst_slot), src + mkv_pos_offset(lay, src_slot), 4);
}

int32_t mkv_page_demote_token(uint8_t *dst, const mkv_page_layout_t *dst_lay, int32_t dst_slot,
                              const uint8_t *src, const mkv_page_layout_t *src_lay,
                              int32_t src_slot, float *scratch)
{
    assert(dst_lay->head_dim == src_lay->head_dim);
    float *k = scratch, *v = scratch + src_lay->head_dim;
    float score;
    int32_t pos;
    /* DESIGN.md section 3: afresh from the decoded values, not by shifting codes, so the low
     * format gets its own min-max grid per group. */
    mkv_page_read_token(src, src_lay, src_slot, k, v, &score, &pos);
    return mkv_page_write_token(dst, dst_lay, dst_slot, k, v, score, pos);
}
