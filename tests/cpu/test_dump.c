/*
 * test_dump.c — JSON dumps (memmgr/dump.c, docs/dump-format.md): the written text matches the
 * state, dump -> load -> dump is byte-identical after random operation mixes, a loaded cache
 * behaves exactly like the original, and the reader refuses every kind of bad input with the
 * right status and a message that names the problem, without crashing.
 */
#define _POSIX_C_SOURCE 200809L /* mkstemp, fdopen */

#include "memmgr/dump.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Writes len bytes into a fresh temporary file; returns its path (free with rm_tmp). */
static char *tmp_file(const char *text, size_t len)
{
    char *path = strdup("/tmp/mkv_dump_test_XXXXXX");
    cr_assert_not_null(path);
    int fd = mkstemp(path);
    cr_assert(fd >= 0, "mkstemp failed");
    FILE *f = fdopen(fd, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(text, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
    return path;
}

static void rm_tmp(char *path)
{
    unlink(path);
    free(path);
}

static char *dump_string(mkv_cache_t *c)
{
    char *s = NULL;
    TU_COK(c, mkv_cache_dump_json_string(c, &s));
    cr_assert_not_null(s);
    return s;
}

/* Dumps c, loads the dump into a new cache, and checks that it dumps identically. */
static mkv_cache_t *reload(mkv_cache_t *c)
{
    char *s1 = dump_string(c);
    char *path = tmp_file(s1, strlen(s1));
    mkv_cache_t *loaded = NULL;
    mkv_status_t st = mkv_cache_load_json(path, &loaded);
    cr_assert_eq(st, MKV_STATUS_OK, "load: %s (%s)", mkv_status_string(st), mkv_last_error());
    cr_assert_str_eq(mkv_last_error(), "", "a successful load leaves no error message");
    char *s2 = dump_string(loaded);
    cr_assert_str_eq(s1, s2, "dump -> load -> dump is not byte-identical");
    tu_expect_valid(loaded, "after load");
    mkv_free(s1);
    mkv_free(s2);
    rm_tmp(path);
    return loaded;
}

/* Expects loading `text` to fail with status `want` and a message containing `needle`. */
static void expect_load_error(const char *text, size_t len, mkv_status_t want, const char *needle)
{
    char *path = tmp_file(text, len);
    mkv_cache_t *c = (mkv_cache_t *)&c; /* poison: must come back NULL */
    mkv_status_t st = mkv_cache_load_json(path, &c);
    cr_assert_eq(st, want, "got '%s', expected '%s' (%s)", mkv_status_string(st),
                 mkv_status_string(want), mkv_last_error());
    cr_assert_null(c, "a failed load must leave *out_cache NULL");
    cr_assert(strstr(mkv_last_error(), needle) != NULL, "message '%s' does not mention '%s'",
              mkv_last_error(), needle);
    rm_tmp(path);
}

static void expect_load_error_json(cJSON *root, mkv_status_t want, const char *needle)
{
    char *text = cJSON_PrintUnformatted(root);
    cr_assert_not_null(text);
    expect_load_error(text, strlen(text), want, needle);
    cJSON_free(text);
}

/* A cache with some of everything: three active slots with hi and lo pages, one released,
 * one reservation pending. */
static mkv_cache_t *sample_cache(uint32_t flags)
{
    mkv_cache_config_t cfg = tu_config(2, 3, 5, 64, 4, 160);
    cfg.flags = flags;
    mkv_cache_t *c = tu_create(&cfg);
    int32_t slot, slots[2] = {0, 1};
    for (int i = 0; i < 4; i++) TU_COK(c, mkv_cache_admit(c, 9, &slot));
    int32_t seq_len[2] = {20, 24}, n_hi[12], n_lo[12];
    for (int i = 0; i < 12; i++) {
        n_hi[i] = 3 + i;
        n_lo[i] = i % 4 * 2;
    }
    mkv_resize_t rz = {2, slots, seq_len, n_hi, n_lo};
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    TU_COK(c, mkv_cache_append(c, 2, slots, NULL));
    TU_COK(c, mkv_cache_release(c, 2, NULL));
    int32_t three = 3;
    TU_COK(c, mkv_cache_append(c, 1, &three, NULL));
    TU_COK(c, mkv_cache_admit(c, 30, &slot)); /* slot 2 again, reservation pending */
    tu_expect_valid(c, "sample");
    return c;
}

/* Runs n random operations on every cache in cs[] (same ops, same statuses), keeping the
 * model in step; compares the caches' dumps after each operation when n_caches > 1. */
static void run_ops(tu_rng_t *rng, tu_model_t *m, mkv_cache_t **cs, int n_caches, int n)
{
    tu_op_t op;
    tu_op_init(&op, m);
    for (int i = 0; i < n; i++) {
        tu_op_random(rng, m, &op);
        int32_t slot_c = -1, slot_m = -1;
        int also_short = 0;
        mkv_status_t want = tu_op_apply_model(m, &op, &slot_m, &also_short);
        for (int k = 0; k < n_caches; k++) {
            mkv_status_t got = tu_op_apply_cache(cs[k], &op, &slot_c);
            int ok = got == want || (also_short && got == MKV_STATUS_OUT_OF_PAGES);
            cr_assert(ok, "op %d (%s) on cache %d: got '%s', expected '%s' (%s)", i, op.label, k,
                      mkv_status_string(got), mkv_status_string(want), mkv_cache_last_error(cs[k]));
            if (got == MKV_STATUS_OK && op.kind == TU_OP_ADMIT)
                cr_assert_eq(slot_c, slot_m, "admit gave slot %d, model %d", slot_c, slot_m);
        }
        if (n_caches > 1) {
            char *a = dump_string(cs[0]);
            for (int k = 1; k < n_caches; k++) {
                char *b = dump_string(cs[k]);
                cr_assert_str_eq(a, b, "op %d (%s): the loaded cache diverged", i, op.label);
                mkv_free(b);
            }
            mkv_free(a);
        }
    }
    tu_op_free(&op);
}

/* ---------------------------------------------------------------------------------------- */
/* Writing                                                                                  */
/* ---------------------------------------------------------------------------------------- */

Test(dump, text_matches_state)
{
    mkv_cache_t *c = sample_cache(MKV_CACHE_METADATA_ONLY);
    const mkv_mm_state_t *st = &c->st;
    const mkv_mm_geom_t *g = &st->g;
    char *s = dump_string(c);
    cr_assert(s[strlen(s) - 1] == '\n', "a dump ends with a newline");

    cJSON *root = cJSON_Parse(s);
    cr_assert_not_null(root, "the dump is valid JSON");
    cr_assert_str_eq(cJSON_GetObjectItem(root, "format")->valuestring, "mixkv-cache-dump");
    cr_assert_eq(cJSON_GetObjectItem(root, "version")->valueint, 2);
    cr_assert_str_eq(cJSON_GetObjectItem(root, "mixkv_version")->valuestring, mkv_version());
    cJSON *cfg = cJSON_GetObjectItem(root, "config");
    cr_assert_eq(cJSON_GetObjectItem(cfg, "n_kv_heads")->valueint, 3);
    cr_assert_eq(cJSON_GetObjectItem(cfg, "pool_pages")->valueint, 160);
    cr_assert_eq(cJSON_GetObjectItem(cfg, "page_bytes")->valuedouble, (double)c->cfg.page_bytes);
    cr_assert_str_eq(cJSON_GetObjectItem(cfg, "hi_format")->valuestring, "K8V4");
    /* How the cache runs is not its state: CPU and CUDA dumps are byte-identical. */
    cr_assert_null(cJSON_GetObjectItem(cfg, "backend"));
    cr_assert_null(cJSON_GetObjectItem(cfg, "n_threads"));
    cr_assert_eq(cJSON_GetObjectItem(cfg, "flags")->valueint, (int)MKV_CACHE_METADATA_ONLY);
    cr_assert_null(cJSON_GetObjectItem(cfg, "pool_bytes"), "pool_bytes is not written");
    cJSON *layout = cJSON_GetObjectItem(root, "layout");
    cr_assert_eq(cJSON_GetObjectItem(layout, "tokens_per_page_hi")->valueint, 4);
    cr_assert_eq(cJSON_GetObjectItem(layout, "tokens_per_page_lo")->valueint, 7);
    cr_assert_eq(cJSON_GetObjectItem(layout, "row_entries")->valueint, g->row_entries);

    cJSON *ring = cJSON_GetObjectItem(root, "ring");
    cr_assert_eq((int64_t)cJSON_GetObjectItem(ring, "head")->valuedouble, st->head);
    cr_assert_eq((int64_t)cJSON_GetObjectItem(ring, "tail")->valuedouble, st->tail);
    cJSON *free_ids = cJSON_GetObjectItem(ring, "free");
    cr_assert_eq(cJSON_GetArraySize(free_ids), st->tail - st->head);
    int64_t k = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, free_ids) cr_assert_eq(e->valueint, mkv_mm_ring_at(st, st->head + k++));
    cr_assert_eq((int64_t)cJSON_GetObjectItem(root, "reserved_pages")->valuedouble,
                 st->reserved_total);
    cr_assert(st->reserved_total > 0, "the sample has a pending reservation");

    /* Slots: the active ones, ascending. */
    cJSON *slots = cJSON_GetObjectItem(root, "slots");
    int n_active = 0;
    for (int32_t s_ = 0; s_ < g->max_seqs; s_++) {
        if (!st->active[s_]) continue;
        cJSON *o = cJSON_GetArrayItem(slots, n_active++);
        cr_assert_not_null(o);
        cr_assert_eq(cJSON_GetObjectItem(o, "slot")->valueint, s_);
        cr_assert_eq(cJSON_GetObjectItem(o, "seq_len")->valueint, st->seq_len[s_]);
        cr_assert_eq((int64_t)cJSON_GetObjectItem(o, "reserved_pages")->valuedouble,
                     st->reserved[s_]);
    }
    cr_assert_eq(cJSON_GetArraySize(slots), n_active);

    /* Rows: non-empty rows of active slots in region order, hi from the left, lo from the right. */
    cJSON *rows = cJSON_GetObjectItem(root, "rows");
    int64_t r_i = 0;
    const int32_t T = g->row_entries;
    for (int32_t s_ = 0; s_ < g->max_seqs; s_++) {
        for (int32_t l = 0; l < g->n_layers && st->active[s_]; l++) {
            for (int32_t h = 0; h < g->n_kv_heads; h++) {
                const int64_t reg = mkv_mm_region(g, s_, l, h);
                if (st->n_hi[reg] == 0 && st->n_lo[reg] == 0) continue;
                cJSON *o = cJSON_GetArrayItem(rows, (int)r_i++);
                cr_assert_not_null(o, "row (%d, %d, %d) missing", s_, l, h);
                cr_assert_eq(cJSON_GetObjectItem(o, "slot")->valueint, s_);
                cr_assert_eq(cJSON_GetObjectItem(o, "layer")->valueint, l);
                cr_assert_eq(cJSON_GetObjectItem(o, "head")->valueint, h);
                cr_assert_eq(cJSON_GetObjectItem(o, "n_hi")->valueint, st->n_hi[reg]);
                cr_assert_eq(cJSON_GetObjectItem(o, "n_lo")->valueint, st->n_lo[reg]);
                cJSON *hi = cJSON_GetObjectItem(o, "hi"), *lo = cJSON_GetObjectItem(o, "lo");
                cr_assert_eq(cJSON_GetArraySize(hi), mkv_mm_pages_for(st->n_hi[reg], g->tpp_hi));
                cr_assert_eq(cJSON_GetArraySize(lo), mkv_mm_pages_for(st->n_lo[reg], g->tpp_lo));
                const int32_t *row = mkv_mm_row(st, reg);
                for (int i = 0; i < cJSON_GetArraySize(hi); i++)
                    cr_assert_eq(cJSON_GetArrayItem(hi, i)->valueint, row[i]);
                for (int i = 0; i < cJSON_GetArraySize(lo); i++)
                    cr_assert_eq(cJSON_GetArrayItem(lo, i)->valueint, row[T - 1 - i]);
            }
        }
    }
    cr_assert_eq(cJSON_GetArraySize(rows), r_i, "only non-empty rows are written");
    cr_assert(r_i > 0);
    cJSON_Delete(root);
    mkv_free(s);
    mkv_cache_destroy(c);
}

Test(dump, file_equals_string)
{
    mkv_cache_t *c = sample_cache(MKV_CACHE_METADATA_ONLY);
    char *s = dump_string(c);
    char *path = tmp_file("", 0);
    TU_COK(c, mkv_cache_dump_json(c, path));
    cr_assert_str_eq(mkv_cache_last_error(c), "");
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    char *buf = calloc(strlen(s) + 16, 1);
    size_t n = fread(buf, 1, strlen(s) + 8, f);
    fclose(f);
    cr_assert_eq(n, strlen(s));
    cr_assert_str_eq(buf, s);
    free(buf);
    rm_tmp(path);
    mkv_free(s);
    mkv_cache_destroy(c);
}

Test(dump, to_stdout, .init = cr_redirect_stdout)
{
    mkv_cache_t *c = sample_cache(MKV_CACHE_METADATA_ONLY);
    char *s = dump_string(c);
    TU_COK(c, mkv_cache_dump_json(c, "-"));
    fflush(stdout);
    cr_assert_stdout_eq_str(s);
    mkv_free(s);
    mkv_cache_destroy(c);
}

Test(dump, api_errors)
{
    char *s = NULL;
    cr_assert_eq(mkv_cache_dump_json_string(NULL, &s), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_str_neq(mkv_last_error(), "");
    cr_assert_eq(mkv_cache_dump_json(NULL, "/tmp/x.json"), MKV_STATUS_INVALID_ARGUMENT);
    mkv_cache_t *c = sample_cache(MKV_CACHE_METADATA_ONLY);
    cr_assert_eq(mkv_cache_dump_json_string(c, NULL), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_str_neq(mkv_cache_last_error(c), "");
    cr_assert_eq(mkv_cache_dump_json(c, NULL), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_cache_dump_json(c, "/nonexistent-dir-mkv/dump.json"), MKV_STATUS_IO_ERROR);
    cr_assert(strstr(mkv_cache_last_error(c), "/nonexistent-dir-mkv/dump.json") != NULL, "%s",
              mkv_cache_last_error(c));
    TU_COK(c, mkv_cache_dump_json_string(c, &s));
    cr_assert_str_eq(mkv_cache_last_error(c), "", "a success clears the handle's message");
    mkv_free(s);

    mkv_cache_t *out = NULL;
    cr_assert_eq(mkv_cache_load_json(NULL, &out), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_cache_load_json("/tmp/x.json", NULL), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_str_neq(mkv_last_error(), "");
    mkv_cache_destroy(c);
}

/* ---------------------------------------------------------------------------------------- */
/* Round trips                                                                              */
/* ---------------------------------------------------------------------------------------- */

Test(dump, round_trip_fresh_and_sample)
{
    mkv_cache_config_t cfg = tu_config(2, 3, 5, 64, 4, 50);
    mkv_cache_t *fresh = tu_create(&cfg);
    mkv_cache_t *loaded = reload(fresh);
    cr_assert_eq(loaded->st.tail - loaded->st.head, 50);
    mkv_cache_destroy(loaded);
    mkv_cache_destroy(fresh);

    for (int with_pool = 0; with_pool < 2; with_pool++) {
        mkv_cache_t *c = sample_cache(with_pool ? 0u : MKV_CACHE_METADATA_ONLY);
        loaded = reload(c);
        cr_assert_eq(loaded->cfg.flags, c->cfg.flags);
        cr_assert_eq(loaded->pool != NULL, with_pool, "the pool follows the recorded flags");
        tu_snap_t a, b;
        tu_snap_take(c, &a);
        tu_snap_take(loaded, &b);
        tu_snap_expect_equal(&a, &b, 0, "loaded vs original"); /* stale ring entries may differ */
        tu_snap_free(&a);
        tu_snap_free(&b);
        mkv_cache_destroy(loaded);
        mkv_cache_destroy(c);
    }
}

Test(dump, floats_survive_exactly)
{
    static const float alphas[][2] = {
        {1.0f, 0.02f}, {0.7f, 0.0123f}, {3.0e-7f, 1.0e-9f}, {123456.789f, 0.1f}};
    for (size_t i = 0; i < sizeof alphas / sizeof alphas[0]; i++) {
        mkv_cache_config_t cfg = tu_config(1, 1, 1, 16, 4, 8);
        cfg.alpha_h = alphas[i][0];
        cfg.alpha_l = alphas[i][1];
        mkv_cache_t *c = tu_create(&cfg);
        mkv_cache_t *loaded = reload(c);
        cr_assert(memcmp(&loaded->cfg.alpha_h, &cfg.alpha_h, sizeof(float)) == 0,
                  "alpha_h %.9g -> %.9g", (double)cfg.alpha_h, (double)loaded->cfg.alpha_h);
        cr_assert(memcmp(&loaded->cfg.alpha_l, &cfg.alpha_l, sizeof(float)) == 0,
                  "alpha_l %.9g -> %.9g", (double)cfg.alpha_l, (double)loaded->cfg.alpha_l);
        mkv_cache_destroy(loaded);
        mkv_cache_destroy(c);
    }
}

/* Random operation mixes: at checkpoints, dump -> load -> dump is identical, and the loaded
 * cache then follows the original exactly through further operations. */
Test(dump, round_trip_random_ops)
{
    int with_lo = 0, with_reservation = 0, wrapped = 0, checkpoints = 0;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        mkv_cache_config_t cfg = tu_config(2, 3, 5, 48, 4, seed % 2 ? 90 : 200);
        cfg.n_threads = seed == 3 ? 2 : 1;
        mkv_cache_t *c = tu_create(&cfg);
        tu_model_t m;
        tu_model_init(&m, c);
        tu_rng_t rng = {seed * 0x9e3779b97f4a7c15ull};
        for (int round = 0; round < 8; round++) {
            run_ops(&rng, &m, &c, 1, 40);
            mkv_cache_stats_t s = tu_stats(c);
            checkpoints++;
            with_lo += s.pages_lo > 0;
            with_reservation += s.reserved_pages > 0;
            wrapped += c->st.head > c->st.g.pool_pages;
            mkv_cache_t *loaded = reload(c);
            mkv_cache_t *both[2] = {c, loaded};
            run_ops(&rng, &m, both, 2, 15);
            tu_model_expect_matches(&m, loaded, "loaded cache after further operations");
            mkv_cache_destroy(loaded);
        }
        tu_model_free(&m);
        mkv_cache_destroy(c);
    }
    /* The checkpoints must have covered the interesting states. */
    cr_assert(with_lo > checkpoints / 4, "low-precision pages at %d of %d checkpoints", with_lo,
              checkpoints);
    cr_assert(with_reservation > 0, "no checkpoint with a pending reservation");
    cr_assert(wrapped > 0, "no checkpoint after the ring wrapped");
}

/* ---------------------------------------------------------------------------------------- */
/* Refusals                                                                                 */
/* ---------------------------------------------------------------------------------------- */

Test(dump, truncated_files)
{
    mkv_cache_t *c = sample_cache(MKV_CACHE_METADATA_ONLY);
    char *s = dump_string(c);
    const size_t len = strlen(s);
    /* Every cut before the closing brace leaves an incomplete document. */
    const size_t cuts[] = {1, 2, 10, len / 7, len / 3, len / 2, len - 200, len - 3, len - 2};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        expect_load_error(s, cuts[i], MKV_STATUS_PARSE_ERROR, "invalid JSON");
    expect_load_error(s, len - 2, MKV_STATUS_PARSE_ERROR, "truncated");
    mkv_free(s);
    mkv_cache_destroy(c);
}

Test(dump, malformed_and_empty)
{
    expect_load_error("", 0, MKV_STATUS_PARSE_ERROR, "empty");
    expect_load_error(" \n\t\n", 4, MKV_STATUS_PARSE_ERROR, "empty");
    expect_load_error("{]", 2, MKV_STATUS_PARSE_ERROR, "line 1, column");
    expect_load_error("hello", 5, MKV_STATUS_PARSE_ERROR, "invalid JSON");
    expect_load_error("{\"a\":1}\n{", 9, MKV_STATUS_PARSE_ERROR, "after the JSON document");
    expect_load_error("[1,2,3]", 7, MKV_STATUS_PARSE_ERROR, "not a mixkv cache dump");
    expect_load_error("{\"x\":1}", 7, MKV_STATUS_PARSE_ERROR, "not a mixkv cache dump");
    expect_load_error("{\"format\":\"other\"}", 18, MKV_STATUS_PARSE_ERROR, "format is 'other'");
    expect_load_error("\0\0\0", 3, MKV_STATUS_PARSE_ERROR, "invalid JSON");

    /* Deep nesting: refused by cJSON's nesting limit, not a stack overflow. */
    const size_t depth = 200000;
    char *deep = malloc(2 * depth);
    memset(deep, '[', depth);
    memset(deep + depth, ']', depth);
    expect_load_error(deep, 2 * depth, MKV_STATUS_PARSE_ERROR, "invalid JSON");
    free(deep);

    mkv_cache_t *out = NULL;
    cr_assert_eq(mkv_cache_load_json("/nonexistent-dir-mkv/dump.json", &out), MKV_STATUS_IO_ERROR);
    cr_assert(strstr(mkv_last_error(), "/nonexistent-dir-mkv/dump.json") != NULL);
    cr_assert_eq(mkv_cache_load_json("/tmp", &out), MKV_STATUS_IO_ERROR);
    cr_assert(strstr(mkv_last_error(), "directory") != NULL, "%s", mkv_last_error());
    cr_assert_null(out);
}

/* Parses a sample dump for editing. */
static cJSON *sample_json(void)
{
    mkv_cache_t *c = sample_cache(MKV_CACHE_METADATA_ONLY);
    char *s = dump_string(c);
    cJSON *root = cJSON_Parse(s);
    cr_assert_not_null(root);
    mkv_free(s);
    mkv_cache_destroy(c);
    return root;
}

static cJSON *at(cJSON *o, const char *key)
{
    cJSON *it = cJSON_GetObjectItem(o, key);
    cr_assert_not_null(it, "no member '%s'", key);
    return it;
}

static void set(cJSON *o, const char *key, cJSON *v) { cJSON_ReplaceItemInObject(o, key, v); }

Test(dump, wrong_format_version_fields_and_types)
{
    cJSON *root = sample_json();
    set(root, "version", cJSON_CreateNumber(3));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "unsupported dump version 3");
    cJSON_Delete(root);

    root = sample_json();
    cJSON_DeleteItemFromObject(at(root, "config"), "lo_value_group");
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "config.lo_value_group: missing");
    cJSON_Delete(root);

    root = sample_json();
    set(at(root, "config"), "hi_key_group", cJSON_CreateNumber(24));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "hi_key_group = 24");
    cJSON_Delete(root);

    root = sample_json();
    set(root, "format", cJSON_CreateString("mixkv-trace"));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "not a mixkv cache dump");
    cJSON_Delete(root);

    root = sample_json();
    cJSON_DeleteItemFromObject(at(root, "config"), "head_dim");
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "config.head_dim: missing");
    cJSON_Delete(root);

    root = sample_json();
    cJSON_DeleteItemFromObject(root, "rows");
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "rows: missing");
    cJSON_Delete(root);

    root = sample_json();
    cJSON *hi = at(cJSON_GetArrayItem(at(root, "rows"), 1), "hi");
    cJSON_ReplaceItemInArray(hi, 0, cJSON_CreateString("7"));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR,
                           "rows[1].hi[0]: expected an integer, found a string");
    cJSON_Delete(root);

    root = sample_json();
    set(at(root, "ring"), "free", cJSON_CreateObject());
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR,
                           "ring.free: expected an array, found an object");
    cJSON_Delete(root);

    root = sample_json();
    set(cJSON_GetArrayItem(at(root, "slots"), 0), "seq_len", cJSON_CreateNumber(2.5));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR,
                           "slots[0].seq_len: expected an integer, found 2.5");
    cJSON_Delete(root);

    root = sample_json();
    set(at(root, "config"), "hi_format", cJSON_CreateString("K9V9"));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "config.hi_format: unknown format 'K9V9'");
    cJSON_Delete(root);

    root = sample_json();
    set(at(root, "config"), "head_dim", cJSON_CreateNumber(100));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "head_dim");
    cJSON_Delete(root);

    root = sample_json();
    set(at(root, "layout"), "row_entries", cJSON_CreateNumber(99));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "layout.row_entries: recorded 99");
    cJSON_Delete(root);

    root = sample_json();
    set(at(root, "ring"), "free_pages", cJSON_CreateNumber(3));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "ring.free_pages");
    cJSON_Delete(root);

    root = sample_json();
    set(root, "slots", cJSON_CreateNull());
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "slots: expected an array, found null");
    cJSON_Delete(root);
}

Test(dump, huge_and_odd_numbers)
{
    struct {
        const char *obj, *key, *raw, *needle;
    } cases[] = {
        {"config", "n_layers", "1e300", "config.n_layers: 1.0000000000000001e+300 is out of range"},
        {"config", "n_layers", "4294967296", "config.n_layers"},
        {"config", "pool_pages", "-5", "config.pool_pages"},
        {"config", "pool_pages", "9007199254740993", "config.pool_pages"},
        {"config", "alpha_h", "1e999", "config.alpha_h"},
        {"config", "alpha_h", "1e300", "not a finite float"},
        {"config", "flags", "-1", "config.flags"},
        {"ring", "head", "1e20", "ring.head"},
        {"ring", "tail", "true", "ring.tail: expected an integer, found a boolean"},
        {"root", "reserved_pages", "-1e999", "reserved_pages: expected an integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *root = sample_json();
        cJSON *obj = strcmp(cases[i].obj, "root") == 0 ? root : at(root, cases[i].obj);
        set(obj, cases[i].key, cJSON_CreateRaw(cases[i].raw));
        expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, cases[i].needle);
        cJSON_Delete(root);
    }
    /* A page id beyond int32 in a row. */
    cJSON *root = sample_json();
    cJSON *hi = at(cJSON_GetArrayItem(at(root, "rows"), 2), "hi");
    cJSON_ReplaceItemInArray(hi, 0, cJSON_CreateRaw("2147483648"));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR,
                           "rows[2].hi[0]: 2147483648 is out of range");
    cJSON_Delete(root);
}

/* Found by fuzz_dump: a 1 KB dump claiming 2^31 - 1 pages had the checker (inspect, load)
 * allocate 32 GB and walk every page. A pool that the listed page ids do not back is refused;
 * a few missing pages still read, so that inspect reports each as leaked. */
Test(dump, pool_not_backed_by_listed_pages)
{
    cJSON *root = sample_json();
    set(at(root, "config"), "pool_pages", cJSON_CreateRaw("2147483647"));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "config.pool_pages: 2147483647 pages");
    cJSON_Delete(root);

    root = sample_json();
    const int64_t pool = (int64_t)cJSON_GetNumberValue(at(at(root, "config"), "pool_pages"));
    set(at(root, "config"), "pool_pages", cJSON_CreateNumber((double)(pool + 1000)));
    char *text = cJSON_PrintUnformatted(root);
    char err[MKV_ERR_LEN];
    mkv_dump_t d;
    cr_assert_eq(mkv_dump_read_string(text, strlen(text), &d, err), MKV_STATUS_OK, "%s", err);
    mkv_state_view_t v;
    mkv_dump_view(&d, &v);
    cr_assert_geq(mkv_state_check(&v, NULL, NULL), 1000, "each missing page is reported");
    mkv_dump_free(&d);
    cJSON_free(text);
    cJSON_Delete(root);
}

/* Structurally sound but inconsistent: read fine (for inspect), refused by the loader. */
Test(dump, corrupt_state_refused)
{
    cJSON *root = sample_json();
    cJSON *rows = at(root, "rows");
    const int dup = cJSON_GetArrayItem(at(cJSON_GetArrayItem(rows, 0), "hi"), 0)->valueint;
    cJSON_ReplaceItemInArray(at(cJSON_GetArrayItem(rows, 1), "hi"), 0, cJSON_CreateNumber(dup));
    char *text = cJSON_PrintUnformatted(root);
    char err[MKV_ERR_LEN];
    mkv_dump_t d;
    cr_assert_eq(mkv_dump_read_string(text, strlen(text), &d, err), MKV_STATUS_OK, "%s", err);
    mkv_state_view_t v;
    mkv_dump_view(&d, &v);
    cr_assert_eq(v.n_rows, cJSON_GetArraySize(rows));
    cr_assert(mkv_state_check(&v, NULL, NULL) >= 2, "a duplicate and a leaked page");
    mkv_dump_free(&d);

    char needle[64];
    snprintf(needle, sizeof needle, "page %d is in two places", dup);
    expect_load_error(text, strlen(text), MKV_STATUS_CORRUPT, needle);
    cJSON_free(text);
    cJSON_Delete(root);

    /* A row longer than T is representable in a dump: the checker reports the overflow. */
    root = sample_json();
    cJSON *hi = at(cJSON_GetArrayItem(at(root, "rows"), 0), "hi");
    for (int i = 0; i < 40; i++) cJSON_AddItemToArray(hi, cJSON_CreateNumber(1000 + i));
    expect_load_error_json(root, MKV_STATUS_CORRUPT, "invariant");
    cJSON_Delete(root);
}

/* Random byte damage: the reader returns OK or PARSE_ERROR, never crashes, and whatever it
 * accepts can be checked. */
Test(dump, random_damage_never_crashes)
{
    mkv_cache_t *c = sample_cache(MKV_CACHE_METADATA_ONLY);
    char *s = dump_string(c);
    const size_t len = strlen(s);
    char *buf = malloc(len + 1);
    static const char junk[] = "{}[],:\"-0123456789eE.+ \ntrufalsn\\x";
    tu_rng_t rng = {42};
    int parse_errors = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, s, len + 1);
        size_t n = len;
        const int edits = tu_rand_range(&rng, 1, 4);
        for (int e = 0; e < edits; e++) {
            const size_t pos = (size_t)tu_rand_range(&rng, 0, (int32_t)n - 1);
            buf[pos] = junk[tu_rand_range(&rng, 0, (int32_t)sizeof junk - 2)];
        }
        if (tu_rand_range(&rng, 0, 3) == 0) n = (size_t)tu_rand_range(&rng, 0, (int32_t)n);
        mkv_dump_t d;
        char err[MKV_ERR_LEN] = "";
        mkv_status_t st = mkv_dump_read_string(buf, n, &d, err);
        cr_assert(st == MKV_STATUS_OK || st == MKV_STATUS_PARSE_ERROR, "status %s",
                  mkv_status_string(st));
        if (st == MKV_STATUS_OK) {
            mkv_state_view_t v;
            mkv_dump_view(&d, &v);
            cr_assert(mkv_state_check(&v, NULL, NULL) >= 0);
        } else {
            cr_assert_str_neq(err, "");
            parse_errors++;
        }
        mkv_dump_free(&d);
    }
    cr_assert(parse_errors > 100, "the damage should usually be detected (%d)", parse_errors);
    free(buf);
    mkv_free(s);
    mkv_cache_destroy(c);
}

/* The dump of a cache with per-side groups g[4], rewritten as version 1 with one quant_groups
 * member in place of the four sizes. */
static char *as_version1(const char *v2, int32_t quant_groups)
{
    cJSON *root = cJSON_Parse(v2);
    cr_assert_not_null(root);
    set(root, "version", cJSON_CreateNumber(1));
    cJSON *cfg = at(root, "config");
    static const char *const names[] = {"hi_key_group", "hi_value_group", "lo_key_group",
                                        "lo_value_group"};
    for (int i = 0; i < 4; i++) cJSON_DeleteItemFromObject(cfg, names[i]);
    cJSON_AddNumberToObject(cfg, "quant_groups", quant_groups);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* Version-1 dumps (one quant_groups count for every side) load, converted to d / quant_groups
 * elements a side; the reloaded cache dumps as version 2, identical to a cache created with
 * those sizes. */
Test(dump, version1_converted)
{
    for (int32_t qg = 1; qg <= 4; qg *= 2) {
        mkv_cache_config_t cfg = tu_config(2, 3, 5, 64, 4, 40);
        cfg.hi_key_group = cfg.hi_value_group = cfg.lo_key_group = cfg.lo_value_group = 128 / qg;
        int64_t bytes = 0;
        TU_OK(mkv_page_bytes_for(cfg.hi_format, 128, 128 / qg, 128 / qg, 4, &bytes));
        cfg.page_bytes = bytes;
        mkv_cache_t *c = tu_create(&cfg);
        int32_t slot;
        TU_COK(c, mkv_cache_admit(c, 9, &slot));
        char *v2 = dump_string(c);
        char *v1 = as_version1(v2, qg);
        char *path = tmp_file(v1, strlen(v1));
        mkv_cache_t *loaded = NULL;
        mkv_status_t st = mkv_cache_load_json(path, &loaded);
        cr_assert_eq(st, MKV_STATUS_OK, "quant_groups %d: %s", qg, mkv_last_error());
        cr_assert_eq(loaded->cfg.hi_key_group, 128 / qg);
        cr_assert_eq(loaded->cfg.lo_value_group, 128 / qg);
        char *again = dump_string(loaded);
        cr_assert_str_eq(again, v2, "quant_groups %d: v1 -> load -> dump differs from v2", qg);
        mkv_dump_t d;
        char err[512];
        cr_assert_eq(mkv_dump_read_file(path, &d, err), MKV_STATUS_OK, "%s", err);
        cr_assert_eq(d.version, 1);
        cr_assert_eq(d.config.hi_value_group, 128 / qg);
        mkv_dump_free(&d);
        rm_tmp(path);
        mkv_free(v2);
        mkv_free(again);
        cJSON_free(v1);
        mkv_cache_destroy(loaded);
        mkv_cache_destroy(c);
    }
    /* A v1 dump without quant_groups, or with a count that is not 1, 2 or 4, or whose groups
     * would be under 16 elements (4 groups at d 16 were allowed then), is refused. */
    mkv_cache_t *c = sample_cache(MKV_CACHE_METADATA_ONLY);
    char *v2 = dump_string(c);
    char *v1 = as_version1(v2, 3);
    expect_load_error(v1, strlen(v1), MKV_STATUS_PARSE_ERROR, "config.quant_groups: 3");
    cJSON_free(v1);
    cJSON *root = cJSON_Parse(v2);
    set(root, "version", cJSON_CreateNumber(1));
    expect_load_error_json(root, MKV_STATUS_PARSE_ERROR, "config.quant_groups: missing");
    cJSON_Delete(root);
    mkv_free(v2);
    mkv_cache_destroy(c);

    mkv_cache_config_t cfg = tu_config(1, 1, 1, 16, 4, 8);
    cfg.head_dim = 16;
    int64_t bytes = 0;
    TU_OK(mkv_page_bytes_for(cfg.hi_format, 16, 16, 16, 4, &bytes));
    cfg.page_bytes = bytes;
    c = tu_create(&cfg);
    v2 = dump_string(c);
    v1 = as_version1(v2, 4);
    expect_load_error(v1, strlen(v1), MKV_STATUS_PARSE_ERROR, "below the 16");
    cJSON_free(v1);
    mkv_free(v2);
    mkv_cache_destroy(c);
}
