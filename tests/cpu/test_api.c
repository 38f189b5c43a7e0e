/*
 * test_api.c — the public API's surface: status strings, version, backends, null arguments on
 * every call, config validation (one bad field at a time, the message naming it), and the
 * derived layout reported by mkv_cache_info.
 */
#include "testutil.h"

#include "quant/format.h"

#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATUS_COUNT 11 /* MKV_STATUS_OK .. MKV_STATUS_CORRUPT */

Test(api, status_strings_distinct)
{
    for (int a = 0; a < STATUS_COUNT; a++) {
        const char *sa = mkv_status_string((mkv_status_t)a);
        cr_assert_not_null(sa);
        cr_assert_str_neq(sa, "", "status %d has an empty string", a);
        for (int b = 0; b < a; b++)
            cr_assert_str_neq(sa, mkv_status_string((mkv_status_t)b), "statuses %d and %d share '%s'",
                              a, b, sa);
    }
    cr_assert_eq(MKV_STATUS_OK, 0);
    cr_assert_eq(MKV_STATUS_CORRUPT, STATUS_COUNT - 1);
    const char *unknown = mkv_status_string((mkv_status_t)1000);
    cr_assert_not_null(unknown);
    cr_assert_str_neq(unknown, "");
}

Test(api, version_matches_header)
{
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", MKV_VERSION_MAJOR, MKV_VERSION_MINOR,
             MKV_VERSION_PATCH);
    cr_assert_str_eq(mkv_version(), want);
}

Test(api, backends)
{
    int avail = -1;
    cr_assert_eq(mkv_backend_available(MKV_BACKEND_CPU, &avail), MKV_STATUS_OK);
    cr_assert_eq(avail, 1);
    avail = -1;
    cr_assert_eq(mkv_backend_available(MKV_BACKEND_CUDA, &avail), MKV_STATUS_OK);
    cr_assert(avail == 0 || avail == 1);
    cr_assert_eq(mkv_backend_available((mkv_backend_t)7, &avail), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_backend_available(MKV_BACKEND_CPU, NULL), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(mkv_backend_name(MKV_BACKEND_CPU), "cpu");
    cr_assert_str_eq(mkv_backend_name(MKV_BACKEND_CUDA), "cuda");
    cr_assert_str_eq(mkv_backend_name((mkv_backend_t)7), "?");
}

Test(api, cuda_backend_without_device_refused)
{
    int avail = -1;
    cr_assert_eq(mkv_backend_available(MKV_BACKEND_CUDA, &avail), MKV_STATUS_OK);
    if (avail) cr_skip_test("a CUDA device is visible; the GPU tests cover this backend");
    mkv_cache_config_t cfg = tu_config(2, 2, 2, 64, 4, 64);
    cfg.backend = MKV_BACKEND_CUDA;
    mkv_cache_t *c = (mkv_cache_t *)&cfg; /* poison: must come back NULL */
    mkv_status_t s = mkv_cache_create(&cfg, &c);
    cr_assert_neq(s, MKV_STATUS_OK);
    cr_assert_null(c);
    cr_assert_str_neq(mkv_last_error(), "");
}

/* Every public call with a null pointer where one is required. */
Test(api, null_arguments)
{
    const int32_t E = MKV_STATUS_INVALID_ARGUMENT;
    mkv_cache_config_t cfg = tu_config(2, 2, 2, 64, 4, 64);
    mkv_cache_t *c = tu_create(&cfg);
    int32_t slot = 0, i32 = 0;
    int64_t i64 = 0;
    int ok = 0;
    mkv_cache_info_t info;
    mkv_cache_stats_t stats;
    mkv_slot_info_t si;
    char *json = NULL;
    mkv_format_t f;
    TU_COK(c, mkv_cache_admit(c, 4, &slot));

    cr_assert_eq(mkv_format_from_name(NULL, &f), E);
    cr_assert_str_neq(mkv_last_error(), "");
    cr_assert_eq(mkv_format_from_name("K8V4", NULL), E);
    mkv_cache_t *other = (mkv_cache_t *)&cfg; /* poison: must come back NULL */
    cr_assert_eq(mkv_cache_create(NULL, &other), E);
    cr_assert_null(other);
    cr_assert_str_neq(mkv_last_error(), "");
    cr_assert_eq(mkv_cache_create(&cfg, NULL), E);
    mkv_cache_destroy(NULL);
    mkv_free(NULL);
    cr_assert_not_null(mkv_cache_last_error(NULL));

    cr_assert_eq(mkv_cache_info(NULL, &info), E);
    cr_assert_eq(mkv_cache_info(c, NULL), E);
    cr_assert_eq(mkv_cache_prompt_demand(NULL, 4, &i64), E);
    cr_assert_eq(mkv_cache_prompt_demand(c, 4, NULL), E);
    cr_assert_eq(mkv_cache_can_admit(NULL, 4, &ok), E);
    cr_assert_eq(mkv_cache_can_admit(c, 4, NULL), E);
    cr_assert_eq(mkv_cache_admit(NULL, 4, &i32), E);
    TU_EXPECT_REFUSED(c, E, mkv_cache_admit(c, 4, NULL));
    cr_assert_eq(mkv_cache_step_demand(NULL, 1, &slot, &i64), E);
    cr_assert_eq(mkv_cache_step_demand(c, 1, NULL, &i64), E);
    cr_assert_eq(mkv_cache_step_demand(c, 1, &slot, NULL), E);
    cr_assert_eq(mkv_cache_append(NULL, 1, &slot, NULL), E);
    TU_EXPECT_REFUSED(c, E, mkv_cache_append(c, 1, NULL, NULL));

    int32_t LH = cfg.n_layers * cfg.n_kv_heads, hi[4] = {1, 1, 1, 1}, lo[4] = {0, 0, 0, 0};
    int32_t n1 = 1;
    cr_assert_eq(LH, 4);
    mkv_resize_t rz = {1, &slot, &n1, hi, lo};
    cr_assert_eq(mkv_cache_resize(NULL, &rz, NULL), E);
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, NULL, NULL));
    rz.slots = NULL;
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.slots = &slot;
    rz.n_hi = NULL;
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.n_hi = hi;
    rz.n_lo = NULL;
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.n_lo = lo;
    TU_COK(c, mkv_cache_resize(c, &rz, NULL)); /* the same call with every pointer is fine */

    cr_assert_eq(mkv_cache_release(NULL, 0, NULL), E);
    cr_assert_eq(mkv_cache_stats(NULL, &stats), E);
    cr_assert_eq(mkv_cache_stats(c, NULL), E);
    cr_assert_eq(mkv_cache_slot_info(NULL, 0, &si), E);
    cr_assert_eq(mkv_cache_slot_info(c, 0, NULL), E);
    cr_assert_eq(mkv_cache_validate(NULL), E);
    cr_assert_eq(mkv_cache_dump_json(NULL, "-"), E);
    cr_assert_eq(mkv_cache_dump_json(c, NULL), E);
    cr_assert_eq(mkv_cache_dump_json_string(NULL, &json), E);
    cr_assert_eq(mkv_cache_dump_json_string(c, NULL), E);
    mkv_cache_t *loaded = NULL;
    cr_assert_eq(mkv_cache_load_json(NULL, &loaded), E);
    cr_assert_null(loaded);
    cr_assert_eq(mkv_cache_load_json("/nonexistent/mixkv.json", NULL), E);
    tu_expect_valid(c, "after null arguments");
    mkv_cache_destroy(c);
}

/* A config with one bad field must fail with INVALID_ARGUMENT, leave *out NULL and name the
 * field (or one of the alternatives, separated by '|') in mkv_last_error(). */
static void expect_bad_config(const mkv_cache_config_t *cfg, const char *fields, const char *what)
{
    mkv_cache_t *c = (mkv_cache_t *)cfg; /* poison */
    mkv_status_t s = mkv_cache_create(cfg, &c);
    cr_assert_eq(s, MKV_STATUS_INVALID_ARGUMENT, "%s: got '%s' (%s)", what, mkv_status_string(s),
                 mkv_last_error());
    cr_assert_null(c, "%s: *out_cache not NULL", what);
    const char *msg = mkv_last_error();
    char buf[128];
    snprintf(buf, sizeof buf, "%s", fields);
    int named = 0;
    for (char *tok = strtok(buf, "|"); tok && !named; tok = strtok(NULL, "|"))
        named = strstr(msg, tok) != NULL;
    cr_assert(named, "%s: message '%s' names none of %s", what, msg, fields);
}

#define BAD(field_expr, fields)                                                                 \
    do {                                                                                       \
        mkv_cache_config_t cfg = base;                                                         \
        field_expr;                                                                            \
        expect_bad_config(&cfg, fields, #field_expr);                                          \
    } while (0)

Test(api, config_validation)
{
    mkv_cache_config_t base = tu_config(2, 2, 2, 64, 4, 64);
    mkv_cache_destroy(tu_create(&base)); /* the base is good */
    BAD(cfg.n_layers = 0, "n_layers");
    BAD(cfg.n_layers = -1, "n_layers");
    BAD(cfg.n_kv_heads = 0, "n_kv_heads");
    BAD(cfg.group_size = 0, "group_size");
    BAD(cfg.group_size = -4, "group_size");
    BAD(cfg.max_seqs = 0, "max_seqs");
    BAD(cfg.max_seq_len = 0, "max_seq_len");
    BAD(cfg.max_seq_len = -5, "max_seq_len");
    BAD(cfg.head_dim = 48, "head_dim");
    BAD(cfg.head_dim = 0, "head_dim");
    BAD(cfg.hi_key_group = 3, "hi_key_group");
    BAD(cfg.hi_value_group = 8, "hi_value_group");
    BAD(cfg.lo_key_group = -16, "lo_key_group");
    BAD(cfg.lo_value_group = 512, "lo_value_group");
    BAD(cfg.lo_value_group = 48, "lo_value_group");
    /* Checked on 16-bit sides too, where the size is otherwise ignored. */
    BAD((cfg.lo_format = MKV_FORMAT_K16V16, cfg.lo_key_group = 1), "lo_key_group");
    BAD(cfg.hi_format = MKV_FORMAT_COUNT, "hi_format");
    BAD(cfg.hi_format = (mkv_format_t)-1, "hi_format");
    BAD(cfg.lo_format = (mkv_format_t)42, "lo_format");
    BAD(cfg.page_bytes = 64, "page_bytes");
    BAD(cfg.page_bytes = -6656, "page_bytes");
    BAD((cfg.pool_pages = 0, cfg.pool_bytes = 0), "pool_pages|pool_bytes");
    BAD((cfg.pool_pages = 0, cfg.pool_bytes = cfg.page_bytes - 1), "pool_pages|pool_bytes");
    BAD(cfg.pool_pages = -3, "pool_pages");
    BAD(cfg.pool_pages = (int64_t)INT32_MAX + 1, "pool_pages");
    /* found by fuzz_dump: pool_pages * page_bytes overflowed int64 (signed overflow UB) */
    BAD((cfg.pool_pages = INT32_MAX, cfg.page_bytes = INT64_MAX / 1024 * 16), "overflow");
    BAD(cfg.window = -1, "window");
    BAD((cfg.alpha_h = 0.01f, cfg.alpha_l = 0.02f), "alpha_l|alpha_h");
    BAD(cfg.alpha_l = -0.5f, "alpha_l");
    BAD((cfg.alpha_h = -1.0f, cfg.alpha_l = -2.0f), "alpha_h|alpha_l");
    BAD(cfg.alpha_h = NAN, "alpha_h");
    BAD(cfg.alpha_l = NAN, "alpha_l");
    BAD(cfg.backend = (mkv_backend_t)9, "backend");
    BAD(cfg.version = 0, "version");
    BAD(cfg.version = MKV_CACHE_CONFIG_VERSION + 1, "version");
    BAD(cfg.struct_size = 8, "struct_size");
    BAD(cfg.n_threads = -1, "n_threads");
    BAD(cfg.flags = 0x80u, "flags");
    /* No scores only for a cache that never compresses. */
    BAD(cfg.flags = MKV_CACHE_NO_SCORES, "MKV_CACHE_NO_SCORES");
    BAD((cfg.flags = MKV_CACHE_NO_SCORES, cfg.alpha_h = cfg.alpha_l = 0.0f, cfg.mix_low = 0.5f),
        "MKV_CACHE_NO_SCORES");
    /* A page that holds one high token (K4V2) but no low token (K16V16). */
    int64_t one = 0;
    TU_OK(mkv_page_bytes_for(MKV_FORMAT_K4V2, 128, 256, 256, 1, &one));
    BAD((cfg.hi_format = MKV_FORMAT_K4V2, cfg.lo_format = MKV_FORMAT_K16V16, cfg.page_bytes = one),
        "page_bytes|lo_format");
}

/* MKV_CACHE_NO_SCORES: accepted for a cache that never compresses, and then no budget (which
 * would need scores) is accepted. */
Test(api, no_scores_cache)
{
    mkv_cache_config_t cfg = tu_config(2, 2, 2, 64, 4, 64);
    cfg.alpha_h = cfg.alpha_l = 0.0f;
    cfg.flags = MKV_CACHE_NO_SCORES;
    mkv_cache_t *c = tu_create(&cfg);
    int32_t slot = -1;
    TU_COK(c, mkv_cache_admit(c, 10, &slot));
    cr_assert_eq(mkv_cache_set_budget(c, slot, 100), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_neq(strstr(mkv_cache_last_error(c), "MKV_CACHE_NO_SCORES"), NULL, "%s", mkv_cache_last_error(c));
    cr_assert_eq(tu_info(c).config.flags, MKV_CACHE_NO_SCORES);
    mkv_cache_destroy(c);
}

static void *fail_in_thread(void *arg)
{
    (void)arg;
    mkv_format_t f;
    mkv_format_from_name("K9V9", &f); /* leaves a message in this thread only */
    return (void *)(uintptr_t)(mkv_last_error()[0] != '\0');
}

/* mkv_last_error() is per thread; a success clears it. */
Test(api, last_error_is_per_thread)
{
    mkv_format_t f;
    int32_t t;
    cr_assert_eq(mkv_format_from_name("K9V9", &f), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_str_neq(mkv_last_error(), "");
    cr_assert_eq(mkv_tokens_per_page(MKV_FORMAT_K8V4, 128, 256, 256, 6656, &t), MKV_STATUS_OK);
    cr_assert_str_eq(mkv_last_error(), "", "a success left '%s'", mkv_last_error());
    pthread_t th;
    void *had_message = NULL;
    cr_assert_eq(pthread_create(&th, NULL, fail_in_thread, NULL), 0);
    cr_assert_eq(pthread_join(th, &had_message), 0);
    cr_assert_not_null(had_message, "the other thread saw no message");
    cr_assert_str_eq(mkv_last_error(), "", "another thread's message leaked: '%s'",
                     mkv_last_error());
}

Test(api, config_defaults_and_info)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.max_seqs = 3;
    cfg.n_layers = 2;
    cfg.n_kv_heads = 4;
    cfg.max_seq_len = 100;
    /* The default page: 32 K8V4 tokens with the default groups (quant/format.h). */
    const int64_t page = MKV_DEFAULT_PAGE_BYTES_D128;
    cfg.pool_bytes = page * 40 + 100; /* 40 default pages and change */
    cfg.flags = MKV_CACHE_METADATA_ONLY;
    mkv_cache_t *c = tu_create(&cfg);
    mkv_cache_info_t info = tu_info(c);
    int64_t want_page = 0;
    TU_OK(mkv_page_bytes_for(cfg.hi_format, cfg.head_dim, 0, 0, 32, &want_page));
    cr_assert_eq(want_page, page);
    cr_assert_eq(info.config.page_bytes, want_page);
    cr_assert_eq(info.config.pool_pages, 40);
    cr_assert_eq(info.tokens_per_page_hi, 32);
    int32_t lo_tpp = 0;
    TU_OK(mkv_tokens_per_page(MKV_FORMAT_K4V2, 128, 0, 0, page, &lo_tpp));
    cr_assert_eq(info.tokens_per_page_lo, lo_tpp);
    cr_assert_gt(lo_tpp, 32);
    /* The resolved config names the group sizes the pages hold: defaults capped at d. */
    cr_assert_eq(info.config.hi_key_group, mkv_resolve_group_elems(0, 8, 0, 128));
    cr_assert_eq(info.config.hi_value_group, mkv_resolve_group_elems(0, 4, 1, 128));
    cr_assert_eq(info.config.lo_key_group, mkv_resolve_group_elems(0, 4, 0, 128));
    cr_assert_eq(info.config.lo_value_group, mkv_resolve_group_elems(0, 2, 1, 128));
    cr_assert_eq(info.config.hi_key_group, 128, "the 8-bit key default is the whole vector");
    cr_assert_eq(info.row_entries, 4 + 1); /* ceil(100 / 32) + 1 */
    cr_assert_eq(info.region_count, 3 * 2 * 4);
    cr_assert_eq(info.pool_bytes, 0, "a METADATA_ONLY cache reports pool bytes");
    cr_assert(info.table_bytes >= (int64_t)3 * 2 * 4 * 5 * 4, "table_bytes %lld too small",
              (long long)info.table_bytes);
    cr_assert_eq(info.config.n_layers, 2);
    cr_assert_eq(info.config.window, 64);
    cr_assert_eq(info.config.hi_format, MKV_FORMAT_K8V4);
    cr_assert_eq(info.config.lo_format, MKV_FORMAT_K4V2);
    int64_t demand = 0;
    TU_COK(c, mkv_cache_prompt_demand(c, 33, &demand));
    cr_assert_eq(demand, 2 * 4 * (2 + 1));
    TU_COK(c, mkv_cache_prompt_demand(c, 32, &demand));
    cr_assert_eq(demand, 2 * 4 * (1 + 1));
    cr_assert_eq(mkv_cache_prompt_demand(c, 0, &demand), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_cache_prompt_demand(c, 101, &demand), MKV_STATUS_INVALID_ARGUMENT);
    mkv_cache_stats_t st = tu_stats(c);
    cr_assert_eq(st.total_pages, 40);
    cr_assert_eq(st.free_pages, 40);
    cr_assert_eq(st.available_pages, 40);
    cr_assert_eq(st.active_slots, 0);
    cr_assert_eq(st.bytes_in_use, 0);
    cr_assert_str_eq(mkv_cache_last_error(c), "");
    mkv_cache_destroy(c);
}

/* min(tpp_hi, tpp_lo) sizes the rows: a low format with fewer tokens per page. */
Test(api, row_entries_use_smaller_tpp)
{
    mkv_cache_config_t cfg = tu_config(1, 1, 1, 50, 8, 10);
    cfg.lo_format = MKV_FORMAT_K16V16;
    mkv_cache_t *c = tu_create(&cfg);
    mkv_cache_info_t info = tu_info(c);
    int32_t lo = 0;
    TU_OK(mkv_tokens_per_page(MKV_FORMAT_K16V16, 128, 0, 0, cfg.page_bytes, &lo));
    cr_assert_eq(info.tokens_per_page_hi, 8);
    cr_assert_eq(info.tokens_per_page_lo, lo);
    cr_assert_lt(lo, 8);
    cr_assert_eq(info.row_entries, (50 + lo - 1) / lo + 1);
    mkv_cache_destroy(c);
}

/* A cache with real page storage: pool bytes reported, operations and validation work. */
Test(api, cache_with_storage)
{
    mkv_cache_config_t cfg = tu_config(2, 2, 2, 64, 32, 24);
    cfg.flags = 0;
    mkv_cache_t *c = tu_create(&cfg);
    mkv_cache_info_t info = tu_info(c);
    cr_assert_eq(info.config.page_bytes, 6656);
    cr_assert_eq(info.pool_bytes, 24 * 6656);
    cr_assert_not_null(c->pool);
    tu_model_t m;
    tu_model_init(&m, c);
    int32_t slot = -1, ms = -1;
    TU_COK(c, mkv_cache_admit(c, 40, &slot));
    cr_assert_eq(tu_model_admit(&m, 40, &ms, NULL), MKV_STATUS_OK);
    cr_assert_eq(slot, ms);
    for (int i = 0; i < 64; i++) { /* up to max_seq_len */
        TU_COK(c, mkv_cache_append(c, 1, &slot, NULL));
        cr_assert_eq(tu_model_append(&m, 1, &slot), MKV_STATUS_OK);
        tu_model_expect_matches(&m, c, "append with storage");
    }
    /* The first and last bytes of the pool are writable (the caller's token data). */
    c->pool[0] = 1;
    c->pool[info.pool_bytes - 1] = 2;
    TU_COK(c, mkv_cache_release(c, slot, NULL));
    cr_assert_eq(tu_model_release(&m, slot), MKV_STATUS_OK);
    tu_model_expect_matches(&m, c, "release with storage");
    tu_model_free(&m);
    mkv_cache_destroy(c);
}

/* mkv_cache_validate reports CORRUPT, with a message, for deliberate corruption. */
Test(api, validate_detects_corruption)
{
    mkv_cache_config_t cfg = tu_config(1, 2, 2, 32, 4, 20);
    mkv_cache_t *c = tu_create(&cfg);
    int32_t s0 = -1, s1 = -1;
    TU_COK(c, mkv_cache_admit(c, 8, &s0));
    TU_COK(c, mkv_cache_admit(c, 4, &s1));
    int32_t slots[2] = {0, 1}, N[2] = {9, 6}, hi[4] = {9, 5, 4, 2}, lo[4] = {0, 4, 2, 0};
    mkv_resize_t rz = {2, slots, N, hi, lo};
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    tu_expect_valid(c, "before corruption");
    mkv_mm_state_t *st = &c->st;
    int32_t T = st->g.row_entries;
    int32_t *row0 = st->table, *row1 = st->table + T;

#define CORRUPT(stmt, undo)                                                                     \
    do {                                                                                       \
        stmt;                                                                                  \
        mkv_status_t s_ = mkv_cache_validate(c);                                               \
        cr_assert_eq(s_, MKV_STATUS_CORRUPT, "%s: validate says '%s'", #stmt,                  \
                     mkv_status_string(s_));                                                   \
        cr_assert_str_neq(mkv_cache_last_error(c), "", "%s: no message", #stmt);               \
        undo;                                                                                  \
        tu_expect_valid(c, "after undoing " #stmt);                                            \
    } while (0)

    int32_t saved = row1[0];
    CORRUPT(row1[0] = row0[0], row1[0] = saved);            /* a page in two rows */
    CORRUPT(st->head += 1, st->head -= 1);                   /* a free page leaked */
    CORRUPT(st->tail += 1, st->tail -= 1);                   /* a stale entry counted free */
    CORRUPT(st->n_hi[0] = 8, st->n_hi[0] = 9);               /* 3 high pages for 8 tokens */
    CORRUPT(st->n_lo[1] = 0, st->n_lo[1] = 4);               /* 1 low page for no token */
    saved = row0[T - 2];
    CORRUPT(row0[T - 2] = st->ring[st->head % st->g.pool_pages], row0[T - 2] = saved);
    saved = st->ring[st->head % st->g.pool_pages];
    CORRUPT(st->ring[st->head % st->g.pool_pages] = row0[0],
            st->ring[st->head % st->g.pool_pages] = saved); /* a used page in the free list */
    saved = row0[0];
    CORRUPT(row0[0] = (int32_t)st->g.pool_pages, row0[0] = saved); /* id out of range */
    CORRUPT(st->seq_len[1] = 5, st->seq_len[1] = 6);         /* n_hi + n_lo > N */
    CORRUPT(st->seq_len[0] = 33, st->seq_len[0] = 9);        /* N > max_seq_len */
    CORRUPT(st->reserved_total += 1, st->reserved_total -= 1);
    CORRUPT(st->active[1] = 0, st->active[1] = 1);           /* rows of a free slot */
    CORRUPT((st->reserved[1] = 100, st->reserved_total += 100),
            (st->reserved[1] = 0, st->reserved_total -= 100)); /* reserved above free */
#undef CORRUPT
    mkv_cache_destroy(c);
}

/* Group sizes per side: resolved in the config (0 -> default, capped at d; 16-bit -> d), and
 * the pages sized with them. */
Test(api, config_group_sizes_resolve)
{
    mkv_cache_config_t cfg = tu_config(1, 1, 1, 64, 8, 16);
    cfg.head_dim = 64;
    cfg.page_bytes = 0;
    cfg.hi_format = MKV_FORMAT_K8V4, cfg.lo_format = MKV_FORMAT_K16V16;
    cfg.hi_key_group = 256, cfg.hi_value_group = 16, cfg.lo_key_group = 16, cfg.lo_value_group = 0;
    mkv_cache_t *c = tu_create(&cfg);
    mkv_cache_info_t info = tu_info(c);
    cr_assert_eq(info.config.hi_key_group, 64);
    cr_assert_eq(info.config.hi_value_group, 16);
    cr_assert_eq(info.config.lo_key_group, 64, "16-bit sides resolve to d");
    cr_assert_eq(info.config.lo_value_group, 64);
    int64_t want = 0;
    TU_OK(mkv_page_bytes_for(MKV_FORMAT_K8V4, 64, 256, 16, 32, &want));
    cr_assert_eq(info.config.page_bytes, want);
    /* 64 + 4 + 32 + 16 + 4 + 4 = 124 bytes a token, 32 tokens: 3968 */
    cr_assert_eq(want, 3968);
    mkv_cache_destroy(c);
    /* A resolved config is a fixed point. */
    cfg = info.config;
    c = tu_create(&cfg);
    mkv_cache_info_t again = tu_info(c);
    cr_assert(again.config.page_bytes == info.config.page_bytes &&
              again.config.hi_key_group == 64 && again.config.hi_value_group == 16 &&
              again.config.lo_key_group == 64 && again.config.lo_value_group == 64);
    mkv_cache_destroy(c);
}

/* mkv_convert: exact widening, round-to-nearest-even narrowing (ties, overflow, subnormals,
 * NaN), unaligned buffers, and refusals that write nothing. */
Test(api, convert_element_types)
{
    const float x[8] = {1.0f, -2.5f, 65504.0f, 65520.0f, 1.0f + 0x1p-11f, 0x1p-24f, 0x1p-26f, NAN};
    const uint16_t want16[8] = {0x3c00, 0xc100, 0x7bff, 0x7c00, 0x3c00, 0x0001, 0x0000, 0};
    uint8_t raw[1 + 8 * 4]; /* an odd offset: no alignment assumed */
    uint16_t h[8];
    TU_OK(mkv_convert(h, MKV_DTYPE_F16, x, MKV_DTYPE_F32, 8));
    for (int i = 0; i < 7; i++) cr_assert_eq(h[i], want16[i], "f16 of element %d: %#x", i, h[i]);
    cr_assert((h[7] & 0x7c00) == 0x7c00 && (h[7] & 0x3ff), "NaN stays NaN: %#x", h[7]);
    float back[8];
    TU_OK(mkv_convert(raw + 1, MKV_DTYPE_F32, h, MKV_DTYPE_F16, 8));
    memcpy(back, raw + 1, sizeof back);
    cr_assert_eq(back[0], 1.0f);
    cr_assert_eq(back[2], 65504.0f);
    cr_assert(isinf(back[3]) && back[3] > 0);
    cr_assert_eq(back[5], 0x1p-24f);
    cr_assert(isnan(back[7]));
    /* bf16: 1 + 2^-8 is a tie (to even: 1), 1 + 3 * 2^-8 rounds up */
    const float y[2] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f};
    uint16_t b[2];
    TU_OK(mkv_convert(b, MKV_DTYPE_BF16, y, MKV_DTYPE_F32, 2));
    cr_assert_eq(b[0], 0x3f80);
    cr_assert_eq(b[1], 0x3f82);
    uint16_t f2[2];
    TU_OK(mkv_convert(f2, MKV_DTYPE_F16, b, MKV_DTYPE_BF16, 2)); /* through f32, exact */
    cr_assert_eq(f2[0], 0x3c00);
    cr_assert_eq(f2[1], 0x3c10); /* 1 + 2^-6 */
    /* refusals write nothing */
    uint16_t keep[2] = {0xabcd, 0xabcd};
    cr_assert_eq(mkv_convert(keep, MKV_DTYPE_F16, x, MKV_DTYPE_F32, -1), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_convert(NULL, MKV_DTYPE_F16, x, MKV_DTYPE_F32, 1), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_convert(keep, MKV_DTYPE_COUNT, x, MKV_DTYPE_F32, 2), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_str_neq(mkv_last_error(), "");
    cr_assert(keep[0] == 0xabcd && keep[1] == 0xabcd);
    TU_OK(mkv_convert(NULL, MKV_DTYPE_F16, NULL, MKV_DTYPE_F32, 0));
}

/* mkv_report_error: an engine's message in mkv_last_error(), its status returned; NULL clears. */
Test(api, report_error_reaches_last_error)
{
    cr_assert_eq(mkv_report_error(MKV_STATUS_IO_ERROR, "engine: %s %d", "file", 7), MKV_STATUS_IO_ERROR);
    cr_assert_str_eq(mkv_last_error(), "engine: file 7");
    cr_assert_eq(mkv_report_error(MKV_STATUS_OK, NULL), MKV_STATUS_OK);
    cr_assert_str_eq(mkv_last_error(), "");
}
