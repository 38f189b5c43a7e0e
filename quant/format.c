/*
 * format.c — the format table and page segment arithmetic (see format.h).
 */
#include "quant/format.h"

#include "common/error.h"

#include <ctype.h>
#include <string.h>

static const mkv_format_desc_t g_formats[MKV_FORMAT_COUNT] = {
    [MKV_FORMAT_K16V16] = {"K16V16", 16, 16}, [MKV_FORMAT_K8V8] = {"K8V8", 8, 8},
    [MKV_FORMAT_K8V4] = {"K8V4", 8, 4},       [MKV_FORMAT_K4V4] = {"K4V4", 4, 4},
    [MKV_FORMAT_K8V2] = {"K8V2", 8, 2},       [MKV_FORMAT_K4V2] = {"K4V2", 4, 2},
    [MKV_FORMAT_K4V8] = {"K4V8", 4, 8},       [MKV_FORMAT_K2V4] = {"K2V4", 2, 4},
};

const mkv_format_desc_t *mkv_format_desc(mkv_format_t format)
{
    if ((int)format < 0 || format >= MKV_FORMAT_COUNT) return NULL;
    return &g_formats[format];
}

const char *mkv_format_name(mkv_format_t format)
{
    const mkv_format_desc_t *f = mkv_format_desc(format);
    return f ? f->name : "?";
}

mkv_status_t mkv_format_from_name(const char *name, mkv_format_t *out_format)
{
    mkv_clear_global_error();
    if (!name || !out_format)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_format_from_name: null argument");
    for (int f = 0; f < MKV_FORMAT_COUNT; f++) {
        const char *a = g_formats[f].name, *b = name;
        while (*a && *b && toupper((unsigned char)*a) == toupper((unsigned char)*b)) a++, b++;
        if (*a == '\0' && *b == '\0') {
            *out_format = (mkv_format_t)f;
            return MKV_STATUS_OK;
        }
    }
    return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                           "unknown format '%s' (expected K16V16, K8V8, K8V4, K4V4, K8V2, K4V2, "
                           "K4V8 or K2V4)", name);
}

static mkv_status_t report(char *err, const char *fmt, int32_t v)
{
    if (err) return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, fmt, v);
    return MKV_STATUS_INVALID_ARGUMENT;
}

int32_t mkv_default_group_elems(int32_t bits, int is_value)
{
    return MKV_DEFAULT_GROUP_ELEMS(bits, is_value);
}

static int valid_group_elems(int32_t e) { return e == 0 || MKV_VALID_GROUP_ELEMS(e); }

int32_t mkv_resolve_group_elems(int32_t group_elems, int32_t bits, int is_value,
                                int32_t head_dim)
{
    if (!valid_group_elems(group_elems)) return 0;
    if (bits == 16) return head_dim;
    const int32_t e = group_elems ? group_elems : mkv_default_group_elems(bits, is_value);
    return e < head_dim ? e : head_dim;
}

mkv_status_t mkv_segment_bytes(mkv_format_t format, int32_t head_dim, int32_t key_group,
                               int32_t value_group, int64_t per_token[MKV_PAGE_SEGMENTS],
                               char *err)
{
    const mkv_format_desc_t *f = mkv_format_desc(format);
    if (!f) return report(err, "format %d is not a valid mkv_format_t", (int32_t)format);
    if (head_dim != 16 && head_dim != 32 && head_dim != 64 && head_dim != 128 && head_dim != 256)
        return report(err, "head_dim %d is not supported (16, 32, 64, 128 or 256)", head_dim);
    if (!valid_group_elems(key_group))
        return report(err, "key group size %d is not supported (16, 32, 64, 128 or 256 elements; "
                           "0 for the default)", key_group);
    if (!valid_group_elems(value_group))
        return report(err, "value group size %d is not supported (16, 32, 64, 128 or 256 "
                           "elements; 0 for the default)", value_group);
    const int32_t kg = head_dim / mkv_resolve_group_elems(key_group, f->key_bits, 0, head_dim);
    const int32_t vg = head_dim / mkv_resolve_group_elems(value_group, f->value_bits, 1, head_dim);
    per_token[MKV_SEG_KEY] = MKV_CODE_BYTES((int64_t)head_dim, f->key_bits);
    per_token[MKV_SEG_KEY_META] = MKV_META_BYTES((int64_t)kg, f->key_bits);
    per_token[MKV_SEG_VALUE] = MKV_CODE_BYTES((int64_t)head_dim, f->value_bits);
    per_token[MKV_SEG_VALUE_META] = MKV_META_BYTES((int64_t)vg, f->value_bits);
    per_token[MKV_SEG_SCORE] = 4;
    per_token[MKV_SEG_POS] = 4;
    return MKV_STATUS_OK;
}

static void vec_layout(int32_t d, int32_t bits, int32_t group_elems, mkv_vec_layout_t *v)
{
    v->bits = bits;
    v->vec_bytes = MKV_CODE_BYTES(d, bits);
    v->chunk_bytes = v->vec_bytes < 16 ? v->vec_bytes : 16;
    v->n_chunks = v->vec_bytes / v->chunk_bytes;
    v->chunk_elems = v->chunk_bytes * 8 / bits;
    v->group_elems = group_elems; /* resolved: d for 16-bit sides */
    v->groups = d / group_elems;
}

/* Segment sizes of n tokens, laid out in order with 16-byte alignment; returns the end. */
static int64_t layout_for(const int64_t per_token[MKV_PAGE_SEGMENTS], int32_t tokens,
                          mkv_page_layout_t *out)
{
    int64_t off = 0;
    for (int s = 0; s < MKV_PAGE_SEGMENTS; s++) {
        off = MKV_ALIGN16(off);
        if (out) {
            out->offset[s] = off;
            out->bytes[s] = per_token[s] * tokens;
        }
        off += per_token[s] * tokens;
    }
    if (out) {
        out->tokens = tokens;
        out->used_bytes = off;
    }
    return off;
}

mkv_status_t mkv_page_layout(mkv_format_t format, int32_t head_dim, int32_t key_group,
                             int32_t value_group, int64_t page_bytes, mkv_page_layout_t *out,
                             char *err)
{
    int64_t per_token[MKV_PAGE_SEGMENTS];
    mkv_status_t st = mkv_segment_bytes(format, head_dim, key_group, value_group, per_token, err);
    if (st != MKV_STATUS_OK) return st;
    int64_t sum = 0;
    for (int s = 0; s < MKV_PAGE_SEGMENTS; s++) sum += per_token[s];
    /* Alignment only adds bytes, so page_bytes / sum is an upper bound; walk down from it. */
    int64_t n = page_bytes > 0 ? page_bytes / sum : 0;
    if (n > INT32_MAX) n = INT32_MAX;
    while (n > 0 && layout_for(per_token, (int32_t)n, NULL) > page_bytes) n--;
    n = MKV_PAGE_TOKENS_OF_FIT(n); /* fewer tokens only shrink the layout */
    if (n < 1) {
        if (err)
            mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                     "page_bytes %lld holds no %s token at d=%d (one needs %lld bytes)",
                     (long long)page_bytes, mkv_format_name(format), head_dim,
                     (long long)layout_for(per_token, 1, NULL));
        return MKV_STATUS_INVALID_ARGUMENT;
    }
    if (out) {
        const mkv_format_desc_t *f = mkv_format_desc(format);
        layout_for(per_token, (int32_t)n, out);
        out->head_dim = head_dim;
        vec_layout(head_dim, f->key_bits,
                   mkv_resolve_group_elems(key_group, f->key_bits, 0, head_dim), &out->key);
        vec_layout(head_dim, f->value_bits,
                   mkv_resolve_group_elems(value_group, f->value_bits, 1, head_dim), &out->value);
    }
    return MKV_STATUS_OK;
}

mkv_status_t mkv_tokens_per_page(mkv_format_t format, int32_t head_dim, int32_t key_group,
                                 int32_t value_group, int64_t page_bytes, int32_t *out_tokens)
{
    char err[MKV_ERR_LEN];
    mkv_page_layout_t lay;
    mkv_clear_global_error();
    if (!out_tokens)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_tokens_per_page: null out_tokens");
    mkv_status_t st = mkv_page_layout(format, head_dim, key_group, value_group, page_bytes, &lay, err);
    if (st != MKV_STATUS_OK) return mkv_fail_global(st, "%s", err);
    *out_tokens = lay.tokens;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_page_bytes_for(mkv_format_t format, int32_t head_dim, int32_t key_group,
                                int32_t value_group, int32_t tokens, int64_t *out_bytes)
{
    char err[MKV_ERR_LEN];
    int64_t per_token[MKV_PAGE_SEGMENTS];
    mkv_clear_global_error();
    if (!out_bytes)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_page_bytes_for: null out_bytes");
    if (tokens < 1)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "tokens %d must be >= 1", tokens);
    mkv_status_t st = mkv_segment_bytes(format, head_dim, key_group, value_group, per_token, err);
    if (st != MKV_STATUS_OK) return mkv_fail_global(st, "%s", err);
    *out_bytes = MKV_ALIGN16(layout_for(per_token, tokens, NULL));
    return MKV_STATUS_OK;
}
