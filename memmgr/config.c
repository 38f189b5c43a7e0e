/*
 * config.c — validation of mkv_cache_config_t and resolution of its defaults. Every field is
 * checked, and the message names the field, so an engine author sees at once what is wrong.
 */
#include "memmgr/cache.h"
#include "quant/format.h"

#include <math.h>
#include <string.h>

#define MKV_MAX_DIM (1 << 20)        /* bound on L, H, G, S: keeps products far from overflow */
#define MKV_MAX_SEQ_LEN (1 << 28)
#define MKV_MAX_THREADS 256
#define MKV_KNOWN_FLAGS (MKV_CACHE_METADATA_ONLY | MKV_CACHE_ASYNC_STEPS | MKV_CACHE_NO_SCORES)

static mkv_status_t bad(char *err, const char *fmt, long long v)
{
    return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, fmt, v);
}

static mkv_status_t check_dim(char *err, const char *name, int32_t v)
{
    if (v < 1 || v > MKV_MAX_DIM)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "config.%s = %d must be in [1, %d]", name,
                        v, MKV_MAX_DIM);
    return MKV_STATUS_OK;
}

mkv_status_t mkv_config_resolve(const mkv_cache_config_t *in, mkv_cache_config_t *out,
                                mkv_mm_geom_t *geom, char *err)
{
    mkv_status_t status;
    if (!in || !out || !geom) return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "null config");
    if (in->version != MKV_CACHE_CONFIG_VERSION || in->struct_size != sizeof(mkv_cache_config_t))
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "config.version %u / struct_size %u do not match this library (%u / %u): "
                        "initialise the config with MKV_CACHE_CONFIG_INIT",
                        in->version, in->struct_size, MKV_CACHE_CONFIG_VERSION,
                        (unsigned)sizeof(mkv_cache_config_t));
    mkv_cache_config_t c = *in;
    MKV_TRY(check_dim(err, "n_layers", c.n_layers));
    MKV_TRY(check_dim(err, "n_kv_heads", c.n_kv_heads));
    MKV_TRY(check_dim(err, "group_size", c.group_size));
    MKV_TRY(check_dim(err, "max_seqs", c.max_seqs));
    if (c.max_seq_len < 1 || c.max_seq_len > MKV_MAX_SEQ_LEN)
        return bad(err, "config.max_seq_len = %lld must be in [1, 268435456]", c.max_seq_len);
    if (!mkv_format_desc(c.hi_format))
        return bad(err, "config.hi_format = %lld is not a valid mkv_format_t", (long long)c.hi_format);
    if (!mkv_format_desc(c.lo_format))
        return bad(err, "config.lo_format = %lld is not a valid mkv_format_t", (long long)c.lo_format);
    int64_t per_token[MKV_PAGE_SEGMENTS];
    char why[MKV_ERR_LEN];
    /* Group sizes: checked one by one so the message names the field, then resolved (0 ->
     * the default for the side's bits, capped at d; 16-bit sides -> d) so that the resolved
     * config, dumps and layouts all say what the pages hold. */
    struct {
        const char *name;
        int32_t *v;
        mkv_format_t format;
        int is_value;
    } groups[4] = {{"hi_key_group", &c.hi_key_group, c.hi_format, 0},
                   {"hi_value_group", &c.hi_value_group, c.hi_format, 1},
                   {"lo_key_group", &c.lo_key_group, c.lo_format, 0},
                   {"lo_value_group", &c.lo_value_group, c.lo_format, 1}};
    if (mkv_segment_bytes(c.hi_format, c.head_dim, 0, 0, per_token, why) != MKV_STATUS_OK)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "config: %s", why);
    for (int i = 0; i < 4; i++) {
        const mkv_format_desc_t *f = mkv_format_desc(groups[i].format);
        const int32_t bits = groups[i].is_value ? f->value_bits : f->key_bits;
        const int32_t e = mkv_resolve_group_elems(*groups[i].v, bits, groups[i].is_value, c.head_dim);
        if (e == 0)
            return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                            "config.%s = %d must be 16, 32, 64, 128 or 256 elements per "
                            "quantization group (0: the default)",
                            groups[i].name, *groups[i].v);
        *groups[i].v = e;
    }
    if (mkv_segment_bytes(c.hi_format, c.head_dim, c.hi_key_group, c.hi_value_group, per_token,
                          why) != MKV_STATUS_OK)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "config: %s", why);

    if (c.page_bytes == 0) {
        /* Default page: exactly MKV_DEFAULT_TOKENS_PER_PAGE tokens of the high format, with
         * its resolved groups (so finer groups make a larger default page, not fewer tokens). */
        c.page_bytes = 0;
        for (int s = 0; s < MKV_PAGE_SEGMENTS; s++)
            c.page_bytes += mkv_align_up64(per_token[s] * MKV_DEFAULT_TOKENS_PER_PAGE,
                                           MKV_SEGMENT_ALIGN);
    }
    if (c.page_bytes < MKV_SEGMENT_ALIGN || c.page_bytes % MKV_SEGMENT_ALIGN != 0)
        return bad(err, "config.page_bytes = %lld must be a positive multiple of 16", c.page_bytes);
    mkv_page_layout_t lay_hi, lay_lo;
    if (mkv_page_layout(c.hi_format, c.head_dim, c.hi_key_group, c.hi_value_group, c.page_bytes,
                        &lay_hi, why) != MKV_STATUS_OK)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "config.page_bytes: %s", why);
    if (mkv_page_layout(c.lo_format, c.head_dim, c.lo_key_group, c.lo_value_group, c.page_bytes,
                        &lay_lo, why) != MKV_STATUS_OK)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "config.page_bytes: %s", why);

    if (c.pool_pages < 0) return bad(err, "config.pool_pages = %lld must be >= 0", c.pool_pages);
    if (c.pool_pages == 0) {
        if (c.pool_bytes <= 0)
            return bad(err, "config: set pool_pages or pool_bytes (pool_bytes = %lld)", c.pool_bytes);
        c.pool_pages = c.pool_bytes / c.page_bytes;
        if (c.pool_pages < 1)
            return bad(err, "config.pool_bytes = %lld holds no page", c.pool_bytes);
    }
    if (c.pool_pages > INT32_MAX)
        return bad(err, "config.pool_pages = %lld exceeds the int32 page-id range", c.pool_pages);
    if (c.pool_pages > INT64_MAX / c.page_bytes)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "config: pool_pages = %lld pages of page_bytes = %lld overflow a "
                        "64-bit byte count",
                        (long long)c.pool_pages, (long long)c.page_bytes);
    c.pool_bytes = c.pool_pages * c.page_bytes;

    if (!isfinite(c.alpha_h) || c.alpha_h < 0.0f)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "config.alpha_h = %g must be finite and >= 0",
                        (double)c.alpha_h);
    if (!isfinite(c.alpha_l) || c.alpha_l < 0.0f || c.alpha_l > c.alpha_h)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "config.alpha_l = %g must be finite and in [0, alpha_h = %g]",
                        (double)c.alpha_l, (double)c.alpha_h);
    if (c.window < 0) return bad(err, "config.window = %lld must be >= 0", c.window);
    if (c.obs_window < 0) return bad(err, "config.obs_window = %lld must be >= 0", c.obs_window);
    if (!isfinite(c.softmax_scale) || c.softmax_scale < 0.0f)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "config.softmax_scale = %g must be finite and >= 0 (0: 1 / sqrt(d))",
                        (double)c.softmax_scale);
    if (c.softmax_scale == 0.0f) c.softmax_scale = 1.0f / sqrtf((float)c.head_dim);
    if (c.backend != MKV_BACKEND_CPU && c.backend != MKV_BACKEND_CUDA)
        return bad(err, "config.backend = %lld is not a valid mkv_backend_t", (long long)c.backend);
    if (!isfinite(c.mix_high) || !isfinite(c.mix_low) || c.mix_high < 0.0f || c.mix_low < 0.0f ||
        c.mix_high > 1.0f || c.mix_low > 1.0f || (double)c.mix_high + c.mix_low > 1.0 + 1e-6)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "config.mix_high = %g and mix_low = %g must lie in [0, 1] with a sum of at most 1",
                        (double)c.mix_high, (double)c.mix_low);
    if (c.device_id < 0) return bad(err, "config.device_id = %lld must be >= 0", c.device_id);
    if (c.n_threads == 0) c.n_threads = 1;
    if (c.n_threads < 1 || c.n_threads > MKV_MAX_THREADS)
        return bad(err, "config.n_threads = %lld must be in [1, 256]", c.n_threads);
    if (c.flags & ~(uint32_t)MKV_KNOWN_FLAGS)
        return bad(err, "config.flags = %#llx has unknown bits", (long long)c.flags);
    if ((c.flags & MKV_CACHE_NO_SCORES) &&
        (c.alpha_h != 0.0f || c.alpha_l != 0.0f || c.mix_high > 0.0f || c.mix_low > 0.0f))
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "config.flags has MKV_CACHE_NO_SCORES, which needs a cache that never compresses: "
                        "alpha_h = %g and alpha_l = %g must be 0 and mix_high = %g, mix_low = %g 0",
                        (double)c.alpha_h, (double)c.alpha_l, (double)c.mix_high, (double)c.mix_low);

    const int32_t tpp_min = lay_hi.tokens < lay_lo.tokens ? lay_hi.tokens : lay_lo.tokens;
    memset(geom, 0, sizeof *geom);
    geom->n_layers = c.n_layers;
    geom->n_kv_heads = c.n_kv_heads;
    geom->max_seqs = c.max_seqs;
    geom->tpp_hi = lay_hi.tokens;
    geom->tpp_lo = lay_lo.tokens;
    geom->row_entries = (int32_t)(mkv_ceil_div64(c.max_seq_len, tpp_min) + 1);
    geom->max_seq_len = c.max_seq_len;
    geom->window = c.window;
    geom->pool_pages = c.pool_pages;
    const int64_t sections = 2 * mkv_mm_regions(geom);
    if (sections > INT32_MAX)
        return bad(err, "config: 2 * max_seqs * n_layers * n_kv_heads = %lld exceeds int32", sections);
    *out = c;
    return MKV_STATUS_OK;
fail:
    return status;
}
