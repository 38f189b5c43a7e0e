/*
 * format.h — the KV format table and the unified page's segment sizes. Shared by C and CUDA:
 * the one place that says how many bytes a token takes in each segment of a page.
 *
 * A page of one format holds `tokens` tokens of one head-region in six segments, each starting
 * on a 16-byte boundary (DESIGN.md section 3, docs/page-layout.md):
 *   0 key codes       d * key_bits / 8 bytes per token
 *   1 key metadata    quant_groups * (fp16 scale + fp16 zero) per token; none for 16-bit keys
 *   2 value codes     d * value_bits / 8 bytes per token
 *   3 value metadata  as for keys
 *   4 scores          fp32 running attention sum per token
 *   5 positions       int32 position per token
 * The order of codes inside a segment belongs to the quant module (a later issue); the sizes
 * here do not depend on it.
 */
#ifndef MKV_QUANT_FORMAT_H
#define MKV_QUANT_FORMAT_H

#include "mixkv.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MKV_SEGMENT_ALIGN 16
#define MKV_PAGE_SEGMENTS 6
#define MKV_DEFAULT_TOKENS_PER_PAGE 32 /* default page: 32 tokens of the high format */

enum { MKV_SEG_KEY = 0, MKV_SEG_KEY_META, MKV_SEG_VALUE, MKV_SEG_VALUE_META, MKV_SEG_SCORE,
       MKV_SEG_POS };

typedef struct mkv_format_desc {
    const char *name; /* "K8V4" */
    int32_t key_bits; /* 16, 8, 4 or 2 */
    int32_t value_bits;
} mkv_format_desc_t;

/* NULL for an out-of-range format. */
const mkv_format_desc_t *mkv_format_desc(mkv_format_t format);

typedef struct mkv_page_layout {
    int32_t tokens;                        /* tokens per page */
    int64_t offset[MKV_PAGE_SEGMENTS];     /* byte offset of each segment, 16-byte aligned */
    int64_t bytes[MKV_PAGE_SEGMENTS];      /* bytes used by each segment */
    int64_t used_bytes;                    /* end of the last segment */
} mkv_page_layout_t;

/* Bytes per token of each segment. Returns INVALID_ARGUMENT (message into err, which may be
 * NULL) for an unsupported format, head dimension or group count. */
mkv_status_t mkv_segment_bytes(mkv_format_t format, int32_t head_dim, int32_t quant_groups,
                               int64_t per_token[MKV_PAGE_SEGMENTS], char *err);

/* Layout of a page of page_bytes: the most tokens that fit, with segment offsets. */
mkv_status_t mkv_page_layout(mkv_format_t format, int32_t head_dim, int32_t quant_groups,
                             int64_t page_bytes, mkv_page_layout_t *out, char *err);

#ifdef __cplusplus
}
#endif

#endif /* MKV_QUANT_FORMAT_H */
