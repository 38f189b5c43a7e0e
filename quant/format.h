/*
 * format.h — the KV format table and the unified page's segment sizes. Shared by C and CUDA:
 * the one place that says how many bytes a token takes in each segment of a page.
 *
 * A page of one format holds `tokens` tokens of one head-region in six segments, each starting
 * on a 16-byte boundary (DESIGN.md section 3, docs/page-layout.md):
 *   0 key codes       d * key_bits / 8 bytes per token
 *   1 key metadata    key groups * (fp16 scale + fp16 zero) per token; none for 16-bit keys
 *   2 value codes     d * value_bits / 8 bytes per token
 *   3 value metadata  value groups * 4 bytes per token; none for 16-bit values
 *   4 scores          fp32 running attention sum per token
 *   5 positions       int32 position per token
 * Order inside the code segments (key codes and value codes alike): a vector of d elements at
 * b bits is vec_bytes = d * b / 8 bytes, cut into chunks of chunk_bytes = min(16, vec_bytes);
 * the segment is [n_chunks][tokens][chunk_bytes]: chunk c of every token of the page, then
 * chunk c + 1. Why: the decode kernel gives each thread of a warp one token and walks the
 * chunks, so at each step a warp reads chunk c of 32 consecutive tokens, 512 contiguous bytes
 * in 16-byte loads (fully coalesced); for values a thread owns a chunk and walks the tokens,
 * and neighbouring threads again read neighbouring 16-byte pieces. Inside a chunk, element e
 * sits in byte e * b / 8, low bits first (4-bit: element 2j in the low nibble of byte j;
 * 2-bit: elements 4j .. 4j + 3 from bit 0 up); 16-bit elements are little-endian fp16.
 *
 * Order inside the metadata segments: [groups][tokens] of {fp16 scale, fp16 zero} (4 bytes),
 * so a warp reading one group of 32 consecutive tokens reads 128 contiguous bytes. Group g
 * covers elements [g * group_elems, (g + 1) * group_elems). Scores: fp32 [tokens]; positions:
 * int32 [tokens].
 *
 * Quantization groups are chosen per side (keys, values) of each format and expressed as
 * elements per group (16, 32, 64, 128 or 256; a size >= d means the whole vector), so a choice
 * means the same at every head dimension: groups = d / min(group_elems, d). A group of 16
 * elements at 2 bits is 4 bytes, a quarter of a 16-byte chunk, so a chunk may span up to four
 * groups; readers look up the group per element (or per 32-bit word), never per chunk.
 */
#ifndef MKV_QUANT_FORMAT_H
#define MKV_QUANT_FORMAT_H

#include "mixkv.h"

#include <stdint.h>

#if defined(__CUDACC__)
#define MKV_HD __host__ __device__ __forceinline__
#else
#define MKV_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MKV_SEGMENT_ALIGN 16
#define MKV_PAGE_SEGMENTS 6
#define MKV_DEFAULT_TOKENS_PER_PAGE 32 /* default page: 32 tokens of the high format */
/* A page where 16 tokens or more fit holds a multiple of 16 (decision 111): a 16-token run
 * (the decode kernel's subtile) of every code and metadata segment then starts on a 64-byte
 * boundary and never crosses a page, so that the kernel's reads cover whole 128-byte lines. */
#define MKV_PAGE_TOKEN_ALIGN 16

enum { MKV_SEG_KEY = 0, MKV_SEG_KEY_META, MKV_SEG_VALUE, MKV_SEG_VALUE_META, MKV_SEG_SCORE,
       MKV_SEG_POS };

typedef struct mkv_format_desc {
    const char *name; /* "K8V4" */
    int32_t key_bits; /* 16, 8, 4 or 2 */
    int32_t value_bits;
} mkv_format_desc_t;

/* NULL for an out-of-range format. */
const mkv_format_desc_t *mkv_format_desc(mkv_format_t format);

/* How one vector (a key or a value) of a format is stored. */
typedef struct mkv_vec_layout {
    int32_t bits;        /* 16, 8, 4 or 2 */
    int32_t vec_bytes;   /* d * bits / 8 */
    int32_t chunk_bytes; /* min(16, vec_bytes) */
    int32_t n_chunks;    /* vec_bytes / chunk_bytes */
    int32_t chunk_elems; /* elements per chunk: chunk_bytes * 8 / bits */
    int32_t groups;      /* quantization groups per vector, 1 .. 16 (1 for 16-bit: no metadata) */
    int32_t group_elems; /* elements per group: d / groups, a power of two >= 16 */
} mkv_vec_layout_t;

typedef struct mkv_page_layout {
    int32_t tokens;                        /* tokens per page */
    int32_t head_dim;                      /* d */
    mkv_vec_layout_t key, value;
    int64_t offset[MKV_PAGE_SEGMENTS];     /* byte offset of each segment, 16-byte aligned */
    int64_t bytes[MKV_PAGE_SEGMENTS];      /* bytes used by each segment */
    int64_t used_bytes;                    /* end of the last segment */
} mkv_page_layout_t;

/* Byte offset, within a page, of chunk c of the key (which = 0) or value (which = 1) codes of
 * the token in slot t. */
MKV_HD int64_t mkv_code_offset(const mkv_page_layout_t *lay, int which, int32_t t, int32_t c)
{
    const mkv_vec_layout_t *v = which ? &lay->value : &lay->key;
    return lay->offset[which ? MKV_SEG_VALUE : MKV_SEG_KEY] +
           ((int64_t)c * lay->tokens + t) * v->chunk_bytes;
}

/* Byte offset of the {fp16 scale, fp16 zero} pair of group g of the token in slot t. */
MKV_HD int64_t mkv_meta_offset(const mkv_page_layout_t *lay, int which, int32_t t, int32_t g)
{
    return lay->offset[which ? MKV_SEG_VALUE_META : MKV_SEG_KEY_META] +
           ((int64_t)g * lay->tokens + t) * 4;
}

MKV_HD int64_t mkv_score_offset(const mkv_page_layout_t *lay, int32_t t)
{
    return lay->offset[MKV_SEG_SCORE] + (int64_t)t * 4;
}

MKV_HD int64_t mkv_pos_offset(const mkv_page_layout_t *lay, int32_t t)
{
    return lay->offset[MKV_SEG_POS] + (int64_t)t * 4;
}

/* mkv_default_group_elems (mixkv.h) reads the table MKV_DEFAULT_GROUP_* below. */

/* A side's group size as stored in a layout: 0 -> the default for its bits, capped at d;
 * 16-bit sides -> d. Returns 0 for a size that is not 0, 16, 32, 64, 128 or 256. */
int32_t mkv_resolve_group_elems(int32_t group_elems, int32_t bits, int is_value,
                                int32_t head_dim);

/* Bytes per token of each segment, with key_group and value_group elements per quantization
 * group (0: the default). Returns INVALID_ARGUMENT (message into err, which may be NULL) for
 * an unsupported format, head dimension or group size. */
mkv_status_t mkv_segment_bytes(mkv_format_t format, int32_t head_dim, int32_t key_group,
                               int32_t value_group, int64_t per_token[MKV_PAGE_SEGMENTS],
                               char *err);

/* Layout of a page of page_bytes: the most tokens that fit (a multiple of MKV_PAGE_TOKEN_ALIGN
 * where that many fit), with segment offsets. */
mkv_status_t mkv_page_layout(mkv_format_t format, int32_t head_dim, int32_t key_group,
                             int32_t value_group, int64_t page_bytes, mkv_page_layout_t *out,
                             char *err);

#ifdef __cplusplus
}
#endif

/* Default elements per quantization group, per bit width and side: the one table behind
 * mkv_default_group_elems (and MKV_CACHE_CONFIG_INIT's zeros). Chosen from SmolLM2-135M
 * perplexity on the essays at 2K-token windows (docs/results.md, "SmolLM2-135M on the
 * essays"): 16-element groups for 4- and 2-bit values (one scale per 64 four-bit values cost
 * 0.8% perplexity), 32 for 4-bit keys, the whole vector for 8-bit keys (finer key groups
 * measured within noise). 256 = the whole vector at any d. */
#define MKV_DEFAULT_GROUP_8BIT_KEY 256
#define MKV_DEFAULT_GROUP_8BIT_VALUE 256
#define MKV_DEFAULT_GROUP_4BIT_KEY 32
#define MKV_DEFAULT_GROUP_4BIT_VALUE 16
#define MKV_DEFAULT_GROUP_2BIT_KEY 16
#define MKV_DEFAULT_GROUP_2BIT_VALUE 16
#define MKV_MAX_GROUP_ELEMS 256 /* largest group size accepted (= the largest d) */
#define MKV_MIN_GROUP_ELEMS 16  /* smallest: at most 16 groups a vector */

/* The segment arithmetic as constant expressions: format.c computes every layout with these,
 * and the asserts below lock the default pages of docs/page-layout.md. kg, vg: groups per key
 * and per value vector. */
#define MKV_DEFAULT_GROUP_ELEMS(bits, is_value)                                                 \
    ((bits) == 8   ? ((is_value) ? MKV_DEFAULT_GROUP_8BIT_VALUE : MKV_DEFAULT_GROUP_8BIT_KEY)   \
     : (bits) == 4 ? ((is_value) ? MKV_DEFAULT_GROUP_4BIT_VALUE : MKV_DEFAULT_GROUP_4BIT_KEY)   \
     : (bits) == 2 ? ((is_value) ? MKV_DEFAULT_GROUP_2BIT_VALUE : MKV_DEFAULT_GROUP_2BIT_KEY)   \
                   : MKV_MAX_GROUP_ELEMS)
#define MKV_GROUPS_OF(d, elems) ((elems) >= (d) ? 1 : (d) / (elems))
#define MKV_CODE_BYTES(d, bits) ((d) * (bits) / 8)
#define MKV_META_BYTES(groups, bits) ((bits) == 16 ? 0 : (groups) * 4)
#define MKV_ALIGN16(x) (((x) + MKV_SEGMENT_ALIGN - 1) / MKV_SEGMENT_ALIGN * MKV_SEGMENT_ALIGN)
#define MKV_PAGE_USED_BYTES(n, d, kb, vb, kg, vg)                                              \
    (MKV_ALIGN16((n) * MKV_CODE_BYTES(d, kb)) + MKV_ALIGN16((n) * MKV_META_BYTES(kg, kb)) +     \
     MKV_ALIGN16((n) * MKV_CODE_BYTES(d, vb)) + MKV_ALIGN16((n) * MKV_META_BYTES(vg, vb)) +     \
     MKV_ALIGN16((n) * 4) + (n) * 4)
/* The tokens a page holds where n fit (MKV_PAGE_TOKEN_ALIGN). */
#define MKV_PAGE_TOKENS_OF_FIT(n) ((n) >= MKV_PAGE_TOKEN_ALIGN ? (n) / MKV_PAGE_TOKEN_ALIGN * MKV_PAGE_TOKEN_ALIGN : (n))
/* Groups per vector of one side with the default group size. */
#define MKV_DEFAULT_GROUPS(d, bits, is_value) MKV_GROUPS_OF(d, MKV_DEFAULT_GROUP_ELEMS(bits, is_value))

#if defined(__cplusplus)
#define MKV_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define MKV_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/* The page layout formula, locked on the one-group pages of docs/page-layout.md (6656 bytes:
 * 32 K8V4 tokens at d = 128 with one group per vector on every side). */
#define MKV_ONE_GROUP_PAGE_BYTES_D128 6656
MKV_STATIC_ASSERT(MKV_PAGE_USED_BYTES(32, 128, 8, 4, 1, 1) == MKV_ONE_GROUP_PAGE_BYTES_D128,
                  "32 one-group K8V4 tokens fill 6656 bytes exactly");
MKV_STATIC_ASSERT(MKV_PAGE_USED_BYTES(59, 128, 4, 2, 1, 1) <= MKV_ONE_GROUP_PAGE_BYTES_D128 &&
                      MKV_PAGE_USED_BYTES(60, 128, 4, 2, 1, 1) > MKV_ONE_GROUP_PAGE_BYTES_D128 &&
                      MKV_PAGE_TOKENS_OF_FIT(59) == 48,
                  "59 one-group K4V2 tokens fit 6656 bytes, which hold 48");
MKV_STATIC_ASSERT(MKV_PAGE_USED_BYTES(12, 128, 16, 16, 1, 1) <= MKV_ONE_GROUP_PAGE_BYTES_D128 &&
                      MKV_PAGE_USED_BYTES(13, 128, 16, 16, 1, 1) > MKV_ONE_GROUP_PAGE_BYTES_D128,
                  "6656 bytes hold 12 K16V16 tokens");
/* DiffKV's groups at d 128 (K8V4: keys 1, values 2), the page of docs/page-layout.md. */
MKV_STATIC_ASSERT(MKV_PAGE_USED_BYTES(32, 128, 8, 4, 1, 2) == 6784,
                  "32 K8V4 tokens with 2 value groups fill 6784 bytes");

/* The default page (config.page_bytes = 0) holds MKV_DEFAULT_TOKENS_PER_PAGE tokens of the
 * high format with the config's groups; with the default groups at d = 128 that is: */
#define MKV_DEFAULT_PAGE_BYTES_D128                                                            \
    MKV_PAGE_USED_BYTES(MKV_DEFAULT_TOKENS_PER_PAGE, 128, 8, 4, MKV_DEFAULT_GROUPS(128, 8, 0),   \
                        MKV_DEFAULT_GROUPS(128, 4, 1))
/* Whatever the default groups are, they must be valid sizes, and the default low format must
 * stay denser than the high one in the default page (demotion has to free memory). */
#define MKV_VALID_GROUP_ELEMS(e) ((e) == 16 || (e) == 32 || (e) == 64 || (e) == 128 || (e) == 256)
MKV_STATIC_ASSERT(MKV_VALID_GROUP_ELEMS(MKV_DEFAULT_GROUP_8BIT_KEY) &&
                      MKV_VALID_GROUP_ELEMS(MKV_DEFAULT_GROUP_8BIT_VALUE) &&
                      MKV_VALID_GROUP_ELEMS(MKV_DEFAULT_GROUP_4BIT_KEY) &&
                      MKV_VALID_GROUP_ELEMS(MKV_DEFAULT_GROUP_4BIT_VALUE) &&
                      MKV_VALID_GROUP_ELEMS(MKV_DEFAULT_GROUP_2BIT_KEY) &&
                      MKV_VALID_GROUP_ELEMS(MKV_DEFAULT_GROUP_2BIT_VALUE),
                  "default group sizes are 16, 32, 64, 128 or 256 elements");
MKV_STATIC_ASSERT(MKV_DEFAULT_PAGE_BYTES_D128 % MKV_SEGMENT_ALIGN == 0,
                  "the default page is a whole number of 16-byte units");
MKV_STATIC_ASSERT(MKV_PAGE_USED_BYTES(48, 128, 4, 2, MKV_DEFAULT_GROUPS(128, 4, 0),
                                      MKV_DEFAULT_GROUPS(128, 2, 1)) <=
                      MKV_DEFAULT_PAGE_BYTES_D128,
                  "the default page holds at least 1.5x as many K4V2 tokens as K8V4 tokens");
MKV_STATIC_ASSERT(MKV_DEFAULT_TOKENS_PER_PAGE % MKV_PAGE_TOKEN_ALIGN == 0,
                  "the default page holds exactly its 32 high tokens");
MKV_STATIC_ASSERT(MKV_CODE_BYTES(16, 2) == 4 && MKV_CODE_BYTES(256, 16) == 512,
                  "vector sizes at the extremes of d and bits");
MKV_STATIC_ASSERT(MKV_SEGMENT_ALIGN == 16, "16-byte segments: one vector load per chunk");

#endif /* MKV_QUANT_FORMAT_H */
