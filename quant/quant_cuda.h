/*
 * quant_cuda.h — the quantizer on the GPU: new tokens' K/V written into their pages
 * in any format, and the K8V4 -> K4V2 demotion, bit-identical to quant/quant.h (the CPU
 * reference: same sanitising, directed fp16 rounding of zero and scale, round-half-even codes).
 */
#ifndef MKV_QUANT_QUANT_CUDA_H
#define MKV_QUANT_QUANT_CUDA_H

#include "quant/format.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Quantize-and-append: for each token i and KV head h, K and V (fp16, or bf16 when is_bf16,
 * already rotated; element order [n_tok][H][d]) into slot slot[i][h] of page page[i][h]
 * (layout lay), with score `score` and position pos[i]. Equals mkv_page_write_token on the
 * same values (converted exactly to fp32) byte for byte. All pointers are device pointers. */
typedef struct mkv_cuda_append {
    const uint16_t *k, *v;  /* [n_tok][H][d] fp16 or bf16 bits */
    int32_t is_bf16;
    int32_t n_tok, n_heads;
    const int32_t *page;    /* [n_tok][H] page ids */
    const int32_t *slot;    /* [n_tok][H] slots within the pages */
    const int32_t *pos;     /* [n_tok] */
    float score;
    uint8_t *pool;          /* page p at pool + (int64_t)p * page_bytes */
    int64_t page_bytes;
    mkv_page_layout_t lay;
} mkv_cuda_append_t;

mkv_status_t mkv_cuda_quant_append(const mkv_cuda_append_t *a, void *stream, char *err);

/* Demotion of n tokens: token i read from (src_page[i], src_slot[i]) in layout src, dequantized,
 * quantized afresh into (dst_page[i], dst_slot[i]) in layout dst, score and position carried;
 * equals mkv_page_demote_token byte for byte. Source and destination slots must not overlap. */
mkv_status_t mkv_cuda_demote(uint8_t *pool, int64_t page_bytes, const mkv_page_layout_t *src,
                             const mkv_page_layout_t *dst, int32_t n, const int32_t *src_page,
                             const int32_t *src_slot, const int32_t *dst_page,
                             const int32_t *dst_slot, void *stream, char *err);

#ifdef __cplusplus
}
#endif

#endif /* MKV_QUANT_QUANT_CUDA_H */
