/*
 * quant.h — the reference quantizer (CPU backend; the CUDA quantizer must match it bit for bit).
 *
 * Asymmetric min-max quantization per group (DESIGN.md section 3), for a group of n elements
 * at b bits with lo = min and hi = max of the (sanitised) group:
 *   constant group (lo == hi):  zero = fp16_rne(lo), scale = 0; every element decodes to zero;
 *   otherwise:                  zero  = the largest fp16 <= lo            (rounded down)
 *                               scale = the smallest fp16 s with zero + (2^b - 1) * s >= hi
 *                                       (rounded up from (hi - zero) / (2^b - 1), then checked
 *                                       exactly in double and stepped up once more if the fp32
 *                                       quotient landed low; the CUDA quantizer does the same)
 *   q  = clamp(round_half_even((x - zero) / scale), 0, 2^b - 1)   (fp32, IEEE division)
 *   x' = q * scale + zero                                         (fp32, from the fp16 values)
 * DESIGN.md's scale = (max - min) / (2^b - 1), zero = min, with the fp16 rounding directed so
 * that the grid [zero, zero + (2^b - 1) * scale] always covers [lo, hi]: every element decodes
 * within half a step (scale / 2, plus fp32 rounding) of its value. The encoder uses the stored
 * fp16 scale and zero, so encoder and decoder agree exactly.
 * 16-bit elements are stored raw as fp16 (round to nearest even), with no metadata.
 *
 * Non-finite and out-of-range input: each element is sanitised first, NaN -> 0, +-inf and
 * finite values beyond fp16's range -> +-65504; the group is then quantized normally, so the
 * stored codes and metadata are always finite and no other token or group is affected. The
 * writers return how many elements were sanitised.
 */
#ifndef MKV_QUANT_QUANT_H
#define MKV_QUANT_QUANT_H

#include "quant/format.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Replaces x by its sanitised value; returns 1 when it changed it. */
int mkv_quant_sanitize(float *x);

/* Quantizes n elements (a copy is sanitised) at b in {8, 4, 2} bits: one code per element in
 * codes[n] (unpacked, 0 .. 2^b - 1), fp16 scale and zero. Returns elements sanitised. */
int32_t mkv_quant_group(const float *x, int32_t n, int32_t bits, uint16_t *scale, uint16_t *zero,
                        uint8_t *codes);

/* x'[i] = codes[i] * scale + zero in fp32. */
void mkv_dequant_group(const uint8_t *codes, int32_t n, uint16_t scale, uint16_t zero, float *out);

/* Writes vector x[d] as the key (which = 0) or value (which = 1) of the token in `slot` of a
 * page laid out by lay: codes packed into their chunks, metadata into its segment. Returns the
 * number of elements sanitised. */
int32_t mkv_quant_write_vector(uint8_t *page, const mkv_page_layout_t *lay, int which,
                               int32_t slot, const float *x);

/* Reads (dequantizes) the key or value of slot into out[d]. */
void mkv_quant_read_vector(const uint8_t *page, const mkv_page_layout_t *lay, int which,
                           int32_t slot, float *out);

/* A whole token: key, value, running score and position. Returns elements sanitised. */
int32_t mkv_page_write_token(uint8_t *page, const mkv_page_layout_t *lay, int32_t slot,
                             const float *k, const float *v, float score, int32_t pos);
void mkv_page_read_token(const uint8_t *page, const mkv_page_layout_t *lay, int32_t slot,
                         float *k, float *v, float *score, int32_t *pos);

float mkv_page_score(const uint8_t *page, const mkv_page_layout_t *lay, int32_t slot);
void mkv_page_set_score(uint8_t *page, const mkv_page_layout_t *lay, int32_t slot, float score);
int32_t mkv_page_pos(const uint8_t *page, const mkv_page_layout_t *lay, int32_t slot);

/* Copies a token slot (codes, metadata, score, position) between pages of one layout: the
 * swap-remove that keeps sections dense. */
void mkv_page_copy_token(uint8_t *dst, int32_t dst_slot, const uint8_t *src, int32_t src_slot,
                         const mkv_page_layout_t *lay);

/* Demotion: dequantizes the token of src (layout src_lay, e.g. K8V4) and quantizes it afresh
 * into dst (layout dst_lay, e.g. K4V2), score and position carried over. scratch: 2 * d
 * floats. Returns elements sanitised (0 for finite stored data). */
int32_t mkv_page_demote_token(uint8_t *dst, const mkv_page_layout_t *dst_lay, int32_t dst_slot,
                              const uint8_t *src, const mkv_page_layout_t *src_lay,
                              int32_t src_slot, float *scratch);

#ifdef __cplusplus
}
#endif

#endif /* MKV_QUANT_QUANT_H */
