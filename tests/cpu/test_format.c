/*
 * test_format.c — the format table and page sizes: names, tokens per page (checked against
 * hand-computed segment sizes), the inverse mkv_page_bytes_for, and argument checks.
 */
#include "quant/format.h"

#include <criterion/criterion.h>

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static const int32_t k_dims[] = {16, 32, 64, 128, 256};
/* elements per group (0: the default); sizes >= d mean one group */
static const int32_t k_groups[] = {16, 32, 64, 128, 256, 0};
#define N_GROUPS (sizeof k_groups / sizeof k_groups[0])

Test(format, names_round_trip)
{
    static const char *const want[MKV_FORMAT_COUNT] = {"K16V16", "K8V8", "K8V4", "K4V4",
                                                       "K8V2",   "K4V2", "K4V8", "K2V4"};
    for (int f = 0; f < MKV_FORMAT_COUNT; f++) {
        const char *name = mkv_format_name((mkv_format_t)f);
        cr_assert_str_eq(name, want[f], "format %d is named %s", f, name);
        mkv_format_t back = MKV_FORMAT_COUNT;
        cr_assert_eq(mkv_format_from_name(name, &back), MKV_STATUS_OK);
        cr_assert_eq((int)back, f);
        char lower[16];
        size_t i = 0;
        for (; name[i] && i + 1 < sizeof lower; i++) lower[i] = (char)tolower((unsigned char)name[i]);
        lower[i] = '\0';
        back = MKV_FORMAT_COUNT;
        cr_assert_eq(mkv_format_from_name(lower, &back), MKV_STATUS_OK, "%s does not parse", lower);
        cr_assert_eq((int)back, f);
        lower[0] = 'K'; /* mixed case */
        cr_assert_eq(mkv_format_from_name(lower, &back), MKV_STATUS_OK, "%s does not parse", lower);
        cr_assert_eq((int)back, f);
    }
    cr_assert_str_eq(mkv_format_name(MKV_FORMAT_COUNT), "?");
    cr_assert_str_eq(mkv_format_name((mkv_format_t)-1), "?");
}

Test(format, bad_names_rejected)
{
    static const char *const bad[] = {"", "K8", "K8V4x", "K8V44", "K3V4", "fp16", " K8V4", "K8V"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mkv_format_t f = MKV_FORMAT_K4V2;
        cr_assert_eq(mkv_format_from_name(bad[i], &f), MKV_STATUS_INVALID_ARGUMENT,
                     "'%s' parsed", bad[i]);
        cr_assert_eq(f, MKV_FORMAT_K4V2, "'%s' changed the output", bad[i]);
        cr_assert_str_neq(mkv_last_error(), "", "'%s': no message", bad[i]);
    }
}

Test(format, hand_computed_tokens_per_page)
{
    /* K8V4, d 128, 1 group, per token: 128 key + 4 key meta + 64 value + 4 value meta
     * + 4 score + 4 pos = 208 bytes; 32 tokens are 6656 bytes, every segment a multiple of 16. */
    int32_t t = 0;
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 256, 6656, &t), MKV_STATUS_OK);
    cr_assert_eq(t, 32);
    /* 31 tokens fit 6655 bytes; a page where 16 or more fit holds a multiple of 16
     * (MKV_PAGE_TOKEN_ALIGN). */
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 256, 6655, &t), MKV_STATUS_OK);
    cr_assert_eq(t, 16);
    /* K4V2: 64 + 4 + 32 + 4 + 4 + 4 = 112 per token; 59 tokens need 3776 | 236 -> 4016 | 1888
     * -> 5904 | 236 -> 6144 | 236 -> 6384 | 236 = 6620 <= 6656; 60 need 6732 > 6656. The page
     * holds 48 of the 59 that fit. */
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K4V2, 128, 256, 256, 6656, &t), MKV_STATUS_OK);
    cr_assert_eq(t, 48);
    /* K16V16: 256 + 0 + 256 + 0 + 4 + 4 = 520 per token; 12 tokens use 6240 bytes. */
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K16V16, 128, 256, 256, 6656, &t), MKV_STATUS_OK);
    cr_assert_eq(t, 12);
    /* K8V4 with 4 groups (32 elements) a side: 128 + 16 + 64 + 16 + 4 + 4 = 232 per token;
     * 28 tokens = 6496 fit, the page holds 16. */
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 32, 32, 6656, &t), MKV_STATUS_OK);
    cr_assert_eq(t, 16);
    /* Below 16 the page holds what fits: 16 one-group K8V4 tokens fill 3328 bytes (every
     * segment a multiple of 16), so 16 bytes less hold 15, and 17 tokens (3536 bytes) give 16. */
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 256, 16 * 208, &t), MKV_STATUS_OK);
    cr_assert_eq(t, 16);
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 256, 16 * 208 - 16, &t), MKV_STATUS_OK);
    cr_assert_eq(t, 15);
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 256, 17 * 208 + 48, &t), MKV_STATUS_OK);
    cr_assert_eq(t, 16);
    /* One K8V4 token at d 16: 16 | 4 -> 20 -> 32 | 8 -> 40 -> 48 | 4 -> 52 -> 64 | 4 -> 68 -> 80
     * | 4 = 84 bytes; 83 bytes hold none. */
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 16, 256, 256, 84, &t), MKV_STATUS_OK);
    cr_assert_eq(t, 1);
    t = -7;
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 16, 256, 256, 83, &t), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(t, -7, "a failed call wrote its output");
    cr_assert_str_neq(mkv_last_error(), "");
    int64_t b = 0;
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K8V4, 128, 256, 256, 32, &b), MKV_STATUS_OK);
    cr_assert_eq(b, 6656);
}

Test(format, segment_layout_aligned)
{
    for (int f = 0; f < MKV_FORMAT_COUNT; f++)
        for (size_t di = 0; di < 5; di++) {
            mkv_page_layout_t lay;
            cr_assert_eq(mkv_page_layout((mkv_format_t)f, k_dims[di], 16, 32, 4096, &lay, NULL),
                         MKV_STATUS_OK);
            cr_assert(lay.used_bytes <= 4096);
            for (int s = 0; s < MKV_PAGE_SEGMENTS; s++) {
                cr_assert_eq(lay.offset[s] % MKV_SEGMENT_ALIGN, 0);
                if (s > 0)
                    cr_assert(lay.offset[s] >= lay.offset[s - 1] + lay.bytes[s - 1],
                              "segments %d and %d overlap", s - 1, s);
            }
        }
}

Test(format, monotonic_in_page_bytes)
{
    for (int f = 0; f < MKV_FORMAT_COUNT; f++) {
        int32_t prev = 0;
        for (int64_t bytes = 16; bytes <= 20000; bytes += 37) {
            int32_t t = 0;
            mkv_status_t s = mkv_tokens_per_page((mkv_format_t)f, 64, 32, 16, bytes, &t);
            if (s != MKV_STATUS_OK) {
                cr_assert_eq(s, MKV_STATUS_INVALID_ARGUMENT);
                cr_assert_eq(prev, 0, "%s: %lld bytes hold no token but fewer held %d",
                             mkv_format_name((mkv_format_t)f), (long long)bytes, prev);
                continue;
            }
            cr_assert(t >= prev && t >= 1, "%s: %lld bytes hold %d tokens, fewer held %d",
                      mkv_format_name((mkv_format_t)f), (long long)bytes, t, prev);
            prev = t;
        }
        cr_assert(prev > 1, "%s: never more than one token", mkv_format_name((mkv_format_t)f));
    }
}

Test(format, unsupported_dims_and_groups)
{
    static const int32_t bad_d[] = {0, -128, 8, 48, 96, 100, 512};
    static const int32_t bad_g[] = {-1, 1, 3, 8, 24, 48, 512};
    int32_t t = 5;
    int64_t b = 5;
    for (size_t i = 0; i < sizeof bad_d / sizeof bad_d[0]; i++) {
        cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, bad_d[i], 256, 256, 1 << 20, &t),
                     MKV_STATUS_INVALID_ARGUMENT, "d %d accepted", bad_d[i]);
        cr_assert_str_neq(mkv_last_error(), "");
        cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K8V4, bad_d[i], 256, 256, 4, &b),
                     MKV_STATUS_INVALID_ARGUMENT, "d %d accepted", bad_d[i]);
    }
    for (size_t i = 0; i < sizeof bad_g / sizeof bad_g[0]; i++) {
        cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K4V2, 128, bad_g[i], 0, 1 << 20, &t),
                     MKV_STATUS_INVALID_ARGUMENT, "key group %d accepted", bad_g[i]);
        cr_assert(strstr(mkv_last_error(), "key group") != NULL, "%s", mkv_last_error());
        cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K4V2, 128, 0, bad_g[i], 1 << 20, &t),
                     MKV_STATUS_INVALID_ARGUMENT, "value group %d accepted", bad_g[i]);
        cr_assert(strstr(mkv_last_error(), "value group") != NULL, "%s", mkv_last_error());
        cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K4V2, 128, bad_g[i], 16, 4, &b),
                     MKV_STATUS_INVALID_ARGUMENT, "groups %d accepted", bad_g[i]);
        /* Checked even where the side is 16-bit: a bad number is a bug wherever it lands. */
        cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K16V16, 128, 0, bad_g[i], 4, &b),
                     MKV_STATUS_INVALID_ARGUMENT, "groups %d accepted", bad_g[i]);
    }
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_COUNT, 128, 256, 256, 1 << 20, &t),
                 MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_tokens_per_page((mkv_format_t)-1, 128, 256, 256, 1 << 20, &t),
                 MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_COUNT, 128, 256, 256, 4, &b), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K8V4, 128, 256, 256, 0, &b), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K8V4, 128, 256, 256, -3, &b), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 256, 0, &t), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 256, -6656, &t),
                 MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(t, 5, "a failed call wrote its output");
    cr_assert_eq(b, 5, "a failed call wrote its output");
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 256, 6656, NULL),
                 MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K8V4, 128, 256, 256, 32, NULL),
                 MKV_STATUS_INVALID_ARGUMENT);
}

Test(format, page_bytes_for_is_minimal_aligned_page)
{
    /* The smallest 16-byte multiple into which n tokens fit. It holds exactly n whenever any
     * 16-byte multiple does and n is below 16 or a multiple of 16 (16 bytes less holds fewer,
     * and capacity is monotonic); from 16 up it holds the multiple of 16 at or below what fits
     * (MKV_PAGE_TOKEN_ALIGN); where no 16-byte multiple holds exactly n (K4V4 at d 16: one
     * token needs 84 bytes, and 96 hold two), it holds more. */
    int exact = 0, total = 0;
    for (int f = 0; f < MKV_FORMAT_COUNT; f++)
        for (size_t di = 0; di < 5; di++)
            for (size_t gi = 0; gi < N_GROUPS; gi++)
                for (int32_t n = 1; n <= 80; n += 1 + (n > 20) * 6) {
                    mkv_format_t fmt = (mkv_format_t)f;
                    int32_t d = k_dims[di], g = k_groups[gi], got = 0;
                    int64_t bytes = 0;
                    cr_assert_eq(mkv_page_bytes_for(fmt, d, g, g, n, &bytes), MKV_STATUS_OK);
                    cr_assert_eq(bytes % MKV_SEGMENT_ALIGN, 0);
                    cr_assert_eq(mkv_tokens_per_page(fmt, d, g, g, bytes, &got), MKV_STATUS_OK);
                    const int32_t want = n >= 16 ? n / 16 * 16 : n;
                    cr_assert_geq(got, want, "%s d %d g %d: page_bytes_for(%d) = %lld holds %d",
                                  mkv_format_name(fmt), d, g, n, (long long)bytes, got);
                    cr_assert(got < 16 || got % 16 == 0, "%s d %d g %d: %d tokens a page",
                              mkv_format_name(fmt), d, g, got);
                    /* Minimal up to alignment: 16 bytes less holds fewer tokens (where the page
                     * holds what fits: n below 16 or a multiple of 16). */
                    mkv_status_t s = mkv_tokens_per_page(fmt, d, g, g, bytes - 16, &got);
                    if (n < 16 || n % 16 == 0)
                        cr_assert(s != MKV_STATUS_OK || got < want,
                                  "%s d %d g %d: %lld bytes also hold %d tokens",
                                  mkv_format_name(fmt), d, g, (long long)(bytes - 16), want);
                    mkv_tokens_per_page(fmt, d, g, g, bytes, &got);
                    total++;
                    exact += got == want;
                }
    /* The exceptions are the few small-d formats whose per-token bytes are not 16-aligned. */
    cr_assert_geq(exact, total * 9 / 10, "only %d of %d pages hold exactly the tokens asked", exact,
                  total);
}

/* Per side: keys and values of one format take their own group size. */
Test(format, groups_per_side)
{
    int32_t t = 0;
    /* DiffKV's K8V4 at d 128: keys 1 group, values 2: 128 + 4 + 64 + 8 + 4 + 4 = 212 a token,
     * 32 tokens 6784 bytes. */
    int64_t b = 0;
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K8V4, 128, 128, 64, 32, &b), MKV_STATUS_OK);
    cr_assert_eq(b, 6784);
    mkv_page_layout_t lay;
    char err[256];
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K8V4, 128, 128, 64, b, &lay, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(lay.tokens, 32);
    cr_assert_eq(lay.key.groups, 1);
    cr_assert_eq(lay.key.group_elems, 128);
    cr_assert_eq(lay.value.groups, 2);
    cr_assert_eq(lay.value.group_elems, 64);
    cr_assert_eq(lay.bytes[MKV_SEG_KEY_META], 32 * 4);
    cr_assert_eq(lay.bytes[MKV_SEG_VALUE_META], 32 * 8);
    /* DiffKV's K4V2: keys 2 groups, values 4: 64 + 8 + 32 + 16 + 4 + 4 = 128 a token. */
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V2, 128, 64, 32, b, &lay, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(lay.key.groups, 2);
    cr_assert_eq(lay.value.groups, 4);
    cr_assert_eq(lay.tokens, 48, "K4V2 (2, 4 groups) in 6784 bytes (52 fit): %d tokens", lay.tokens);
    /* Sizes >= d are the whole vector, so 256 at d 64 is one group; 16 at d 256 is 16. */
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V4, 64, 256, 128, 4096, &lay, err), MKV_STATUS_OK);
    cr_assert(lay.key.groups == 1 && lay.key.group_elems == 64 && lay.value.groups == 1);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K2V4, 256, 16, 16, 1 << 16, &lay, err), MKV_STATUS_OK);
    cr_assert(lay.key.groups == 16 && lay.key.group_elems == 16 && lay.value.groups == 16);
    /* 16-bit sides ignore the size: no metadata, one "group" of d. */
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K16V16, 128, 16, 16, 6656, &lay, err), MKV_STATUS_OK);
    cr_assert(lay.key.groups == 1 && lay.key.group_elems == 128 && lay.bytes[MKV_SEG_KEY_META] == 0);
    cr_assert_eq(lay.tokens, 12);
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 16, 6656, &t), MKV_STATUS_OK);
    /* 128 + 4 + 64 + 32 + 8 = 236 a token: 28 tokens fit (6608), 29 need 6844; the page holds
     * 16. */
    cr_assert_eq(t, 16);
}

/* Every format x every group choice per side x every d: the layout says what the formula says. */
Test(format, every_group_choice_every_side)
{
    for (int f = 0; f < MKV_FORMAT_COUNT; f++) {
        const mkv_format_desc_t *fd = mkv_format_desc((mkv_format_t)f);
        for (size_t di = 0; di < 5; di++)
            for (size_t ki = 0; ki < N_GROUPS; ki++)
                for (size_t vi = 0; vi < N_GROUPS; vi++) {
                    const int32_t d = k_dims[di], kg = k_groups[ki], vg = k_groups[vi];
                    mkv_page_layout_t lay;
                    char err[256];
                    cr_assert_eq(mkv_page_layout((mkv_format_t)f, d, kg, vg, 1 << 16, &lay, err),
                                 MKV_STATUS_OK, "%s", err);
                    const int32_t ke = fd->key_bits == 16 ? d
                                       : kg ? (kg < d ? kg : d)
                                            : (mkv_default_group_elems(fd->key_bits, 0) < d
                                                   ? mkv_default_group_elems(fd->key_bits, 0) : d);
                    const int32_t ve = fd->value_bits == 16 ? d
                                       : vg ? (vg < d ? vg : d)
                                            : (mkv_default_group_elems(fd->value_bits, 1) < d
                                                   ? mkv_default_group_elems(fd->value_bits, 1) : d);
                    cr_assert(lay.key.group_elems == ke && lay.key.groups == d / ke &&
                                  lay.value.group_elems == ve && lay.value.groups == d / ve,
                              "%s d %d groups %d/%d: key %d x %d, value %d x %d", fd->name, d,
                              kg, vg, lay.key.groups, lay.key.group_elems, lay.value.groups,
                              lay.value.group_elems);
                    cr_assert(lay.key.groups <= 16 && lay.value.groups <= 16);
                    const int64_t n = lay.tokens;
                    cr_assert_eq(lay.bytes[MKV_SEG_KEY_META], n * MKV_META_BYTES(d / ke, fd->key_bits));
                    cr_assert_eq(lay.bytes[MKV_SEG_VALUE_META],
                                 n * MKV_META_BYTES(d / ve, fd->value_bits));
                    cr_assert_eq(lay.used_bytes, MKV_PAGE_USED_BYTES(n, d, fd->key_bits,
                                                                     fd->value_bits, d / ke, d / ve));
                }
    }
}

/* The defaults table: one place, valid sizes, and what a 0 resolves to. */
Test(format, default_groups)
{
    cr_assert_eq(mkv_default_group_elems(8, 0), MKV_DEFAULT_GROUP_8BIT_KEY);
    cr_assert_eq(mkv_default_group_elems(8, 1), MKV_DEFAULT_GROUP_8BIT_VALUE);
    cr_assert_eq(mkv_default_group_elems(4, 0), MKV_DEFAULT_GROUP_4BIT_KEY);
    cr_assert_eq(mkv_default_group_elems(4, 1), MKV_DEFAULT_GROUP_4BIT_VALUE);
    cr_assert_eq(mkv_default_group_elems(2, 0), MKV_DEFAULT_GROUP_2BIT_KEY);
    cr_assert_eq(mkv_default_group_elems(2, 1), MKV_DEFAULT_GROUP_2BIT_VALUE);
    cr_assert_eq(mkv_default_group_elems(16, 0), 256);
    for (int bits = 2; bits <= 8; bits *= 2)
        for (int side = 0; side < 2; side++) {
            const int32_t e = mkv_default_group_elems(bits, side);
            cr_assert(e == 16 || e == 32 || e == 64 || e == 128 || e == 256);
            for (size_t di = 0; di < 5; di++) {
                const int32_t d = k_dims[di];
                cr_assert_eq(mkv_resolve_group_elems(0, bits, side, d), e < d ? e : d);
            }
        }
    /* A zero and the default's own value give the same layout. */
    mkv_page_layout_t a, b;
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V2, 128, 0, 0, 6656, &a, NULL), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(MKV_FORMAT_K4V2, 128, MKV_DEFAULT_GROUP_4BIT_KEY,
                                 MKV_DEFAULT_GROUP_2BIT_VALUE, 6656, &b, NULL), MKV_STATUS_OK);
    cr_assert(a.tokens == b.tokens && a.key.groups == b.key.groups &&
              a.value.groups == b.value.groups && a.used_bytes == b.used_bytes);
    /* The default page of the default config: 32 K8V4 tokens with the default groups. */
    int64_t bytes = 0;
    cr_assert_eq(mkv_page_bytes_for(MKV_FORMAT_K8V4, 128, 0, 0, 32, &bytes), MKV_STATUS_OK);
    cr_assert_eq(bytes, MKV_DEFAULT_PAGE_BYTES_D128);
}
