/*
 * test_inspect.c — the `mixkv` command (tools/), run as a real process: `mixkv inspect` on
 * clean dumps and on dumps with planted corruptions (edited with cJSON, never by string
 * surgery), --slot, --json, --diff, and the exit statuses of bad usage and bad input.
 */
#define _POSIX_C_SOURCE 200809L /* posix_spawn, mkstemp */

#include "memmgr/dump.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ---------------------------------------------------------------------------------------- */
/* Running the command                                                                      */
/* ---------------------------------------------------------------------------------------- */

static char *tmp_path(void)
{
    char *path = strdup("/tmp/mkv_inspect_test_XXXXXX");
    cr_assert_not_null(path);
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    return path;
}

static void rm_tmp(char *path)
{
    unlink(path);
    free(path);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot read %s", path);
    size_t cap = 4096, len = 0, n;
    char *buf = malloc(cap);
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

typedef struct run {
    int status; /* exit status */
    char *out, *err;
} run_t;

static void run_free(run_t *r)
{
    free(r->out);
    free(r->err);
}

/* Runs `mixkv ARGS...` (NULL-terminated) with stdout and stderr captured. */
static run_t run_cli(const char *arg0, ...)
{
    const char *argv[16] = {MIXKV_CLI_PATH};
    int argc = 1;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && argc < 15; a = va_arg(ap, const char *)) argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;

    char *out_path = tmp_path(), *err_path = tmp_path();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_TRUNC, 0);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_TRUNC, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, MIXKV_CLI_PATH, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(rc, 0, "cannot run %s", MIXKV_CLI_PATH);
    int wstatus;
    cr_assert_eq(waitpid(pid, &wstatus, 0), pid);
    cr_assert(WIFEXITED(wstatus), "mixkv did not exit normally (signal %d)",
              WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0);
    run_t r = {WEXITSTATUS(wstatus), slurp(out_path), slurp(err_path)};
    rm_tmp(out_path);
    rm_tmp(err_path);
    return r;
}

#define EXPECT_IN(hay, needle)                                                                     \
    cr_assert(strstr((hay), (needle)) != NULL, "expected '%s' in:\n%s", (needle), (hay))

/* ---------------------------------------------------------------------------------------- */
/* Dumps                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* L 2, H 3, S 5, 4 hi / 7 lo tokens per page, T 17, 120 pages. Slots 0, 1, 2 active with hi
 * and lo pages and no pending reservation; slot 0's rows hold whole hi pages (n_hi = 8). */
static mkv_cache_t *make_cache(void)
{
    mkv_cache_config_t cfg = tu_config(2, 3, 5, 64, 4, 120);
    mkv_cache_t *c = tu_create(&cfg);
    int32_t slot;
    for (int i = 0; i < 3; i++) TU_COK(c, mkv_cache_admit(c, 8, &slot));
    int32_t slots[2] = {0, 1}, seq_len[2] = {16, 20}, n_hi[12], n_lo[12];
    for (int i = 0; i < 6; i++) {
        n_hi[i] = 8;
        n_lo[i] = (i % 3) * 3;
        n_hi[6 + i] = 4 + i % 3;
        n_lo[6 + i] = 7 + i / 3;
    }
    mkv_resize_t rz = {2, slots, seq_len, n_hi, n_lo};
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    int32_t two = 2;
    for (int i = 0; i < 3; i++) TU_COK(c, mkv_cache_append(c, 1, &two, NULL));
    tu_expect_valid(c, "make_cache");
    cr_assert_eq(c->st.reserved_total, 0);
    return c;
}

static cJSON *cache_json(mkv_cache_t *c)
{
    char *s = NULL;
    TU_COK(c, mkv_cache_dump_json_string(c, &s));
    cJSON *root = cJSON_Parse(s);
    cr_assert_not_null(root);
    mkv_free(s);
    return root;
}

static char *write_json(const cJSON *root)
{
    char *path = tmp_path();
    char *text = cJSON_PrintUnformatted(root);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    cJSON_free(text);
    return path;
}

static char *write_cache(mkv_cache_t *c)
{
    char *path = tmp_path();
    TU_COK(c, mkv_cache_dump_json(c, path));
    return path;
}

static cJSON *at(cJSON *o, const char *key)
{
    cJSON *it = cJSON_GetObjectItem(o, key);
    cr_assert_not_null(it, "no member '%s'", key);
    return it;
}

static cJSON *row_at(cJSON *root, int i) { return cJSON_GetArrayItem(at(root, "rows"), i); }

static int id_at(cJSON *row, const char *section, int k)
{
    return cJSON_GetArrayItem(at(row, section), k)->valueint;
}

/* Runs inspect on an edited dump; expects exit 1 and every needle in stdout. */
static void expect_flagged(cJSON *root, const char *const *needles, int n)
{
    char *path = write_json(root);
    run_t r = run_cli("inspect", path, NULL);
    cr_assert_eq(r.status, 1, "exit %d, stdout:\n%s\nstderr:\n%s", r.status, r.out, r.err);
    for (int i = 0; i < n; i++) EXPECT_IN(r.out, needles[i]);
    EXPECT_IN(r.err, "mixkv inspect: ");
    EXPECT_IN(r.err, "invariant violation");
    run_free(&r);
    rm_tmp(path);
}

/* ---------------------------------------------------------------------------------------- */
/* Clean dumps                                                                              */
/* ---------------------------------------------------------------------------------------- */

Test(inspect, clean_dump_summary)
{
    mkv_cache_t *c = make_cache();
    mkv_cache_stats_t s = tu_stats(c);
    char *path = write_cache(c);
    run_t r = run_cli("inspect", path, NULL);
    cr_assert_eq(r.status, 0, "exit %d:\n%s%s", r.status, r.out, r.err);
    cr_assert_str_eq(r.err, "");
    char want[256];
    EXPECT_IN(r.out, "L=2 H=3 G=4 d=128 S=5 max_seq_len=64");
    EXPECT_IN(r.out, "hi=K8V4 (4 tokens/page) lo=K4V2 (7 tokens/page) T=17");
    snprintf(
        want, sizeof want, "pool: 120 pages: %lld free, 0 reserved, %lld available, %lld in use",
        (long long)s.free_pages, (long long)s.available_pages, (long long)(120 - s.free_pages));
    EXPECT_IN(r.out, want);
    snprintf(want, sizeof want, "pages: %lld hi, %lld lo", (long long)s.pages_hi,
             (long long)s.pages_lo);
    EXPECT_IN(r.out, want);
    snprintf(want, sizeof want, "tokens: %lld hi, %lld lo, %lld pruned, %lld seen",
             (long long)s.tokens_hi, (long long)s.tokens_lo, (long long)s.tokens_pruned,
             (long long)s.tokens_seen);
    EXPECT_IN(r.out, want);
    snprintf(want, sizeof want, "bytes: %lld in use, %lld as FP16", (long long)s.bytes_in_use,
             (long long)s.bytes_fp16);
    EXPECT_IN(r.out, want);
    EXPECT_IN(r.out, "slots: 3 active");
    EXPECT_IN(r.out, "check: ok");
    /* Per-slot table: slot 2 has N 3, 18 hi tokens, 6 hi pages. */
    mkv_slot_info_t si;
    TU_COK(c, mkv_cache_slot_info(c, 2, &si));
    snprintf(want, sizeof want, "%6d %8d %10lld %10lld", 2, si.seq_len, (long long)si.tokens_hi,
             (long long)si.tokens_lo);
    EXPECT_IN(r.out, want);
    run_free(&r);
    rm_tmp(path);
    mkv_cache_destroy(c);
}

Test(inspect, slot_view)
{
    mkv_cache_t *c = make_cache();
    char *path = write_cache(c);
    run_t r = run_cli("inspect", "--slot", "1", path, NULL);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    EXPECT_IN(r.out, "rows of slot 1:");
    /* Row (1, 1, 2): its hi and lo page ids as the cache holds them. */
    const mkv_mm_state_t *st = &c->st;
    const int64_t reg = mkv_mm_region(&st->g, 1, 1, 2);
    const int32_t *row = mkv_mm_row(st, reg);
    const int32_t T = st->g.row_entries;
    char want[160];
    snprintf(want, sizeof want, "%6d %5d %8d %8d  [%d, %d] | [%d, %d]", 1, 2, st->n_hi[reg],
             st->n_lo[reg], row[0], row[1], row[T - 1], row[T - 2]);
    cr_assert_eq(st->n_hi[reg], 6);
    cr_assert_eq(st->n_lo[reg], 8);
    EXPECT_IN(r.out, want);
    cr_assert_null(strstr(r.out, "rows of slot 0"));
    run_free(&r);

    r = run_cli("inspect", "--slot=3", path, NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "mixkv inspect: slot 3 is not active");
    run_free(&r);
    r = run_cli("inspect", "--slot", "5", path, NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "outside [0, 5)");
    run_free(&r);
    r = run_cli("inspect", "--slot", "x1", path, NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "--slot: 'x1' is not an integer");
    run_free(&r);
    rm_tmp(path);
    mkv_cache_destroy(c);
}

Test(inspect, json_clean)
{
    mkv_cache_t *c = make_cache();
    mkv_cache_stats_t s = tu_stats(c);
    char *path = write_cache(c);
    run_t r = run_cli("inspect", "--json", path, NULL);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    cJSON *root = cJSON_Parse(r.out);
    cr_assert_not_null(root, "--json prints JSON only:\n%s", r.out);
    cJSON *sum = at(root, "summary");
    cr_assert_eq((int64_t)at(sum, "pages_hi")->valuedouble, s.pages_hi);
    cr_assert_eq((int64_t)at(sum, "pages_lo")->valuedouble, s.pages_lo);
    cr_assert_eq((int64_t)at(sum, "tokens_pruned")->valuedouble, s.tokens_pruned);
    cr_assert_eq((int64_t)at(sum, "bytes")->valuedouble, s.bytes_in_use);
    cr_assert_eq((int64_t)at(sum, "bytes_fp16")->valuedouble, s.bytes_fp16);
    cr_assert_eq((int64_t)at(sum, "free_pages")->valuedouble, s.free_pages);
    cr_assert_eq(cJSON_GetArraySize(at(root, "slots")), 3);
    cr_assert_str_eq(at(at(root, "config"), "lo_format")->valuestring, "K4V2");
    cJSON *check = at(root, "check");
    cr_assert(cJSON_IsTrue(at(check, "ok")));
    cr_assert_eq(cJSON_GetArraySize(at(check, "violations")), 0);
    cJSON_Delete(root);
    run_free(&r);

    /* --json=FILE: the text on stdout, the JSON in the file, with --slot's rows. */
    char *json_path = tmp_path();
    char opt[64];
    snprintf(opt, sizeof opt, "--json=%s", json_path);
    r = run_cli("inspect", opt, "--slot", "0", path, NULL);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    EXPECT_IN(r.out, "rows of slot 0:");
    char *text = slurp(json_path);
    root = cJSON_Parse(text);
    cr_assert_not_null(root);
    cr_assert_eq(cJSON_GetArraySize(at(root, "rows")), 6);
    cr_assert_eq(at(cJSON_GetArrayItem(at(root, "rows"), 0), "n_hi")->valueint, 8);
    cr_assert_eq(cJSON_GetArraySize(at(cJSON_GetArrayItem(at(root, "rows"), 0), "hi")), 2);
    cJSON_Delete(root);
    free(text);
    run_free(&r);
    rm_tmp(json_path);
    rm_tmp(path);
    mkv_cache_destroy(c);
}

/* Found by fuzz_dump: the summary sums a dump as written, and N = 2^31 - 1 over 2^23
 * head-regions of d = 128 in two slots overflowed int64 (undefined behaviour, a negative
 * byte count). The sums now saturate. */
Test(inspect, huge_counts_saturate)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    cJSON *cfg = at(root, "config");
    cJSON_ReplaceItemInObject(cfg, "n_layers", cJSON_CreateNumber(1 << 20));
    cJSON_ReplaceItemInObject(cfg, "n_kv_heads", cJSON_CreateNumber(8));
    cJSON_ReplaceItemInObject(cfg, "max_seqs", cJSON_CreateNumber(2));
    cJSON_ReplaceItemInObject(cfg, "max_seq_len", cJSON_CreateNumber(1));
    cJSON_ReplaceItemInObject(at(root, "layout"), "row_entries", cJSON_CreateNumber(2));
    cJSON *slots = at(root, "slots");
    cJSON_DeleteItemFromArray(slots, 2);
    for (int i = 0; i < 2; i++)
        cJSON_ReplaceItemInObject(cJSON_GetArrayItem(slots, i), "seq_len",
                                  cJSON_CreateNumber(2147483647));
    char *path = write_json(root);
    run_t r = run_cli("inspect", "--json", path, NULL);
    cr_assert_eq(r.status, 1, "the N beyond max_seq_len is a violation:\n%s%s", r.out, r.err);
    cJSON *rep = cJSON_Parse(r.out);
    cr_assert_not_null(rep, "%s", r.out);
    cJSON *sum = at(rep, "summary");
    cr_assert_eq(at(sum, "bytes_fp16")->valuedouble, (double)INT64_MAX, "saturated, not wrapped");
    cr_assert_eq(at(sum, "tokens_seen")->valuedouble, 2.0 * 2147483647.0 * (1 << 23));
    cr_assert_gt(at(cJSON_GetArrayItem(at(rep, "slots"), 0), "bytes_fp16")->valuedouble, 0.0);
    cJSON_Delete(rep);
    run_free(&r);
    rm_tmp(path);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

/* ---------------------------------------------------------------------------------------- */
/* Planted corruptions                                                                      */
/* ---------------------------------------------------------------------------------------- */

Test(inspect, page_in_two_rows)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    /* rows[0] is (0, 0, 0), rows[4] is (0, 1, 1). */
    const int dup = id_at(row_at(root, 0), "hi", 1), lost = id_at(row_at(root, 4), "hi", 0);
    cJSON_ReplaceItemInArray(at(row_at(root, 4), "hi"), 0, cJSON_CreateNumber(dup));
    char a[160], b[160];
    snprintf(a, sizeof a,
             "[page_duplicated] page %d is in two places: row (slot 0, layer 0, head 0) hi[1] and "
             "row (slot 0, layer 1, head 1) hi[0]",
             dup);
    snprintf(b, sizeof b, "[page_missing] page %d is neither in the free list nor in any row",
             lost);
    const char *needles[] = {a, b, "check: 2 violations"};
    expect_flagged(root, needles, 3);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

Test(inspect, page_free_and_in_row)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    const int free0 = cJSON_GetArrayItem(at(at(root, "ring"), "free"), 0)->valueint;
    const int lost = id_at(row_at(root, 7), "lo", 0);
    cJSON_ReplaceItemInArray(at(row_at(root, 7), "lo"), 0, cJSON_CreateNumber(free0));
    cJSON *r7 = row_at(root, 7);
    char a[200], b[160];
    snprintf(a, sizeof a,
             "page %d is in two places: the free list at head+0 and row (slot %d, layer %d, head "
             "%d) lo[0]",
             free0, at(r7, "slot")->valueint, at(r7, "layer")->valueint, at(r7, "head")->valueint);
    snprintf(b, sizeof b, "page %d is neither in the free list nor in any row (leaked)", lost);
    const char *needles[] = {a, b};
    expect_flagged(root, needles, 2);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

Test(inspect, leaked_page)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    cJSON *ring = at(root, "ring"), *free_ids = at(ring, "free");
    const int n = cJSON_GetArraySize(free_ids);
    const int lost = cJSON_GetArrayItem(free_ids, n - 1)->valueint;
    cJSON_DeleteItemFromArray(free_ids, n - 1);
    cJSON_ReplaceItemInObject(ring, "tail", cJSON_CreateNumber(at(ring, "tail")->valuedouble - 1));
    cJSON_ReplaceItemInObject(ring, "free_pages", cJSON_CreateNumber(n - 1));
    char a[160];
    snprintf(a, sizeof a,
             "[page_missing] page %d is neither in the free list nor in any row (leaked)", lost);
    const char *needles[] = {a, "check: 1 violation\n"};
    expect_flagged(root, needles, 2);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

Test(inspect, wrong_counts)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    cJSON *row = row_at(root, 2); /* (0, 0, 2): n_hi 8 in 2 pages */
    cr_assert_eq(at(row, "n_hi")->valueint, 8);
    cJSON_ReplaceItemInObject(row, "n_hi", cJSON_CreateNumber(9));
    const char *needles[] = {"[row_page_count] row (slot 0, layer 0, head 2) lists 2 hi pages but "
                             "n_hi 9 needs ceil(9 / 4) = 3"};
    expect_flagged(root, needles, 1);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

Test(inspect, page_out_of_range)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    const int lost = id_at(row_at(root, 1), "hi", 0);
    cJSON_ReplaceItemInArray(at(row_at(root, 1), "hi"), 0, cJSON_CreateNumber(127));
    char b[160];
    snprintf(b, sizeof b, "page %d is neither in the free list nor in any row", lost);
    const char *needles[] = {"[page_out_of_range] row (slot 0, layer 0, head 1) hi[0] holds page "
                             "id 127 outside [0, 120)",
                             b};
    expect_flagged(root, needles, 2);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

Test(inspect, row_overflow)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    /* Move 16 pages from the head of the free list into row (0, 0, 0): 18 hi pages > T = 17. */
    cJSON *ring = at(root, "ring"), *free_ids = at(ring, "free"), *row = row_at(root, 0);
    for (int i = 0; i < 16; i++) {
        cJSON *id = cJSON_DetachItemFromArray(free_ids, 0);
        cJSON_AddItemToArray(at(row, "hi"), id);
    }
    cJSON_ReplaceItemInObject(ring, "head", cJSON_CreateNumber(at(ring, "head")->valuedouble + 16));
    cJSON_ReplaceItemInObject(ring, "free_pages", cJSON_CreateNumber(cJSON_GetArraySize(free_ids)));
    cJSON_ReplaceItemInObject(row, "n_hi", cJSON_CreateNumber(18 * 4));
    const char *needles[] = {"[row_overflow] row (slot 0, layer 0, head 0) lists 18 hi + 0 lo "
                             "pages, more than its 17 entries",
                             "[token_counts] row (slot 0, layer 0, head 0)"};
    expect_flagged(root, needles, 2);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

Test(inspect, json_lists_violations)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    const int dup = id_at(row_at(root, 0), "hi", 0);
    cJSON_ReplaceItemInArray(at(row_at(root, 9), "lo"), 0, cJSON_CreateNumber(dup)); /* (1, 1, 0) */
    char *path = write_json(root);
    run_t r = run_cli("inspect", "--json", path, NULL);
    cr_assert_eq(r.status, 1, "%s%s", r.out, r.err);
    cJSON *out = cJSON_Parse(r.out);
    cr_assert_not_null(out, "%s", r.out);
    cJSON *check = at(out, "check");
    cr_assert(cJSON_IsFalse(at(check, "ok")));
    cr_assert_eq(at(check, "violation_count")->valueint, 2);
    cJSON *v = cJSON_GetArrayItem(at(check, "violations"), 0);
    cr_assert_str_eq(at(v, "kind")->valuestring, "page_duplicated");
    cr_assert_eq(at(v, "page")->valueint, dup);
    cr_assert_eq(at(v, "slot")->valueint, 1);
    cr_assert_eq(at(v, "layer")->valueint, 1);
    cr_assert_eq(at(v, "head")->valueint, 0);
    cr_assert_eq(at(v, "other_slot")->valueint, 0);
    cr_assert_eq(at(v, "other_layer")->valueint, 0);
    cr_assert_eq(at(v, "other_head")->valueint, 0);
    cr_assert(cJSON_IsFalse(at(v, "other_is_free_list")));
    cr_assert(strstr(at(v, "message")->valuestring, "is in two places") != NULL);
    v = cJSON_GetArrayItem(at(check, "violations"), 1);
    cr_assert_str_eq(at(v, "kind")->valuestring, "page_missing");
    cr_assert(cJSON_IsNull(at(v, "slot")));
    cJSON_Delete(out);
    run_free(&r);
    rm_tmp(path);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

Test(inspect, many_violations_capped)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    cJSON *ring = at(root, "ring");
    const int n_free = cJSON_GetArraySize(at(ring, "free"));
    cr_assert(n_free > 20);
    /* Forget the whole free list: every free page leaks. */
    cJSON_ReplaceItemInObject(ring, "free", cJSON_CreateArray());
    cJSON_ReplaceItemInObject(ring, "tail", cJSON_CreateNumber(at(ring, "head")->valuedouble));
    cJSON_ReplaceItemInObject(ring, "free_pages", cJSON_CreateNumber(0));
    char *path = write_json(root);
    run_t r = run_cli("inspect", "--max-violations", "5", path, NULL);
    cr_assert_eq(r.status, 1);
    char want[96];
    snprintf(want, sizeof want, "check: %d violations", n_free);
    EXPECT_IN(r.out, want);
    snprintf(want, sizeof want, "... and %d more", n_free - 5);
    EXPECT_IN(r.out, want);
    run_free(&r);
    r = run_cli("inspect", "--json", "--max-violations=0", path, NULL);
    cJSON *out = cJSON_Parse(r.out);
    cr_assert_not_null(out);
    cr_assert_eq(cJSON_GetArraySize(at(at(out, "check"), "violations")), n_free);
    cJSON_Delete(out);
    run_free(&r);
    rm_tmp(path);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

/* ---------------------------------------------------------------------------------------- */
/* Bad input and usage                                                                      */
/* ---------------------------------------------------------------------------------------- */

Test(inspect, bad_files_exit_2)
{
    mkv_cache_t *c = make_cache();
    cJSON *root = cache_json(c);
    char *text = cJSON_Print(root);
    char *path = tmp_path();
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, strlen(text) / 2, f); /* truncated */
    fclose(f);
    run_t r = run_cli("inspect", path, NULL);
    cr_assert_eq(r.status, 2, "%s%s", r.out, r.err);
    EXPECT_IN(r.err, "mixkv inspect: ");
    EXPECT_IN(r.err, "invalid JSON at line");
    cr_assert_str_eq(r.out, "");
    run_free(&r);

    cJSON_ReplaceItemInObject(root, "version", cJSON_CreateNumber(7));
    char *wrong = write_json(root);
    r = run_cli("inspect", wrong, NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "unsupported dump version 7 (this mixkv reads versions 1 to 2)");
    run_free(&r);

    r = run_cli("inspect", "/nonexistent-mkv/dump.json", NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "/nonexistent-mkv/dump.json: cannot open");
    run_free(&r);

    r = run_cli("inspect", "--diff", path, wrong, NULL);
    cr_assert_eq(r.status, 2);
    run_free(&r);

    rm_tmp(wrong);
    rm_tmp(path);
    cJSON_free(text);
    cJSON_Delete(root);
    mkv_cache_destroy(c);
}

Test(inspect, usage)
{
    run_t r = run_cli(NULL, NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "usage: mixkv");
    run_free(&r);

    r = run_cli("--version", NULL);
    cr_assert_eq(r.status, 0);
    EXPECT_IN(r.out, mkv_version());
    run_free(&r);

    r = run_cli("--help", NULL);
    cr_assert_eq(r.status, 0);
    EXPECT_IN(r.out, "inspect");
    EXPECT_IN(r.out, "calibrate");
    run_free(&r);

    r = run_cli("help", "inspect", NULL);
    cr_assert_eq(r.status, 0);
    EXPECT_IN(r.out, "--slot N");
    run_free(&r);
    r = run_cli("inspect", "--help", NULL);
    cr_assert_eq(r.status, 0);
    EXPECT_IN(r.out, "--diff");
    run_free(&r);

    r = run_cli("calibrate", NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "--model PATH and --data FILE|DIR|- are required");
    run_free(&r);
    r = run_cli("frobnicate", NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "unknown command 'frobnicate'");
    run_free(&r);
    r = run_cli("inspect", NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "mixkv inspect: missing the dump file");
    run_free(&r);
    r = run_cli("inspect", "--bogus", "x.json", NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "unknown option '--bogus'");
    run_free(&r);
    r = run_cli("inspect", "--diff", "a.json", NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "--diff takes two dump files");
    run_free(&r);
    r = run_cli("inspect", "a.json", "b.json", NULL);
    cr_assert_eq(r.status, 2);
    run_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* Diffs                                                                                    */
/* ---------------------------------------------------------------------------------------- */

Test(inspect, diff_append)
{
    mkv_cache_t *c = make_cache();
    char *a = write_cache(c);
    const long long head0 = c->st.head, free0 = c->st.tail - c->st.head;
    int32_t zero = 0;
    TU_COK(c, mkv_cache_append(c, 1, &zero, NULL)); /* n_hi 8 -> 9: one new hi page per row */
    char *b = write_cache(c);
    const mkv_mm_state_t *st = &c->st;

    run_t r = run_cli("inspect", "--diff", a, b, NULL);
    cr_assert_eq(r.status, 1, "%s%s", r.out, r.err);
    EXPECT_IN(r.out, "--- ");
    EXPECT_IN(r.out, "slot 0: N 16 -> 17 (+1)\n");
    char want[160];
    snprintf(want, sizeof want, "ring: head %lld -> %lld (+6), free %lld -> %lld (-6)\n", head0,
             head0 + 6, free0, free0 - 6);
    EXPECT_IN(r.out, want);
    EXPECT_IN(r.out, "ring: 6 pages left the free list [");
    for (int32_t l = 0; l < 2; l++) {
        for (int32_t h = 0; h < 3; h++) {
            const int32_t *row = mkv_mm_row(st, mkv_mm_region(&st->g, 0, l, h));
            snprintf(want, sizeof want,
                     "row (slot 0, layer %d, head %d): n_hi 8 -> 9 (+1); hi pages added [%d]\n", l,
                     h, row[2]);
            EXPECT_IN(r.out, want);
        }
    }
    cr_assert_null(strstr(r.out, "slot 1"), "unchanged slots are not listed");
    run_free(&r);

    r = run_cli("inspect", "--diff", "--json", a, b, NULL);
    cr_assert_eq(r.status, 1);
    cJSON *out = cJSON_Parse(r.out);
    cr_assert_not_null(out, "%s", r.out);
    cr_assert(cJSON_IsFalse(at(out, "identical")));
    cr_assert_eq(cJSON_GetArraySize(at(out, "config")), 0);
    cr_assert_eq(at(at(at(out, "ring"), "head"), "delta")->valueint, 6);
    cr_assert_eq(cJSON_GetArraySize(at(at(out, "ring"), "left_free_list")), 6);
    cJSON *rows = at(out, "rows");
    cr_assert_eq(cJSON_GetArraySize(rows), 6);
    cJSON *row = cJSON_GetArrayItem(rows, 5);
    cr_assert_str_eq(at(row, "change")->valuestring, "changed");
    cr_assert_eq(at(row, "layer")->valueint, 1);
    cr_assert_eq(at(row, "head")->valueint, 2);
    cr_assert_eq(at(at(row, "n_hi"), "delta")->valueint, 1);
    cr_assert_eq(cJSON_GetArraySize(at(row, "hi_added")), 1);
    cr_assert_eq(cJSON_GetArrayItem(at(row, "hi_added"), 0)->valueint,
                 mkv_mm_row(st, mkv_mm_region(&st->g, 0, 1, 2))[2]);
    cr_assert_eq(cJSON_GetArraySize(at(row, "hi_removed")), 0);
    cJSON_Delete(out);
    run_free(&r);

    r = run_cli("inspect", "--diff", a, a, NULL);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    cr_assert_str_eq(r.out, "", "identical dumps print nothing");
    run_free(&r);
    r = run_cli("inspect", "--diff", "--json", b, b, NULL);
    cr_assert_eq(r.status, 0);
    out = cJSON_Parse(r.out);
    cr_assert_not_null(out);
    cr_assert(cJSON_IsTrue(at(out, "identical")));
    cJSON_Delete(out);
    run_free(&r);
    rm_tmp(a);
    rm_tmp(b);
    mkv_cache_destroy(c);
}

Test(inspect, diff_release_admit_and_config)
{
    mkv_cache_t *c = make_cache();
    char *a = write_cache(c);
    TU_COK(c, mkv_cache_release(c, 1, NULL));
    int32_t slot;
    TU_COK(c, mkv_cache_admit(c, 4, &slot));
    cr_assert_eq(slot, 1);
    TU_COK(c, mkv_cache_release(c, 2, NULL));
    char *b = write_cache(c);
    run_t r = run_cli("inspect", "--diff", a, b, NULL);
    cr_assert_eq(r.status, 1, "%s%s", r.out, r.err);
    EXPECT_IN(r.out, "slot 1: N 20 -> 0 (-20), reserved 0 -> 12 (+12)\n");
    EXPECT_IN(r.out, "slot 2: released (was N 3, reserved 0)");
    EXPECT_IN(r.out, "reserved_pages: 0 -> 12 (+12)");
    EXPECT_IN(r.out, "row (slot 1, layer 0, head 0): removed: n_hi 4, n_lo 7");
    EXPECT_IN(r.out, "row (slot 2, layer 1, head 2): removed: n_hi 3, n_lo 0");
    run_free(&r);

    /* The other direction: admitted slot and added rows; plus a config change. */
    cJSON *root = cache_json(c);
    cJSON_ReplaceItemInObject(at(root, "config"), "alpha_l", cJSON_CreateNumber(0.5));
    char *b2 = write_json(root);
    r = run_cli("inspect", "--diff", b2, a, NULL);
    cr_assert_eq(r.status, 1);
    EXPECT_IN(r.out, "config.alpha_l: 0.5 -> 0.0199999996");
    EXPECT_IN(r.out, "slot 2: admitted (N 3, reserved 0)");
    EXPECT_IN(r.out, "row (slot 2, layer 0, head 0): added: n_hi 3, n_lo 0, hi [");
    run_free(&r);
    cJSON_Delete(root);
    rm_tmp(a);
    rm_tmp(b);
    rm_tmp(b2);
    mkv_cache_destroy(c);
}

/* ---------------------------------------------------------------------------------------- */
/* Tensor-parallel sets                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* One rank of a tensor-parallel cache: KV heads [first_head, first_head + H) of a model with
 * L layers, S 5, its own pool. Slots 0, 1, 2 are active with N 16, 20, 3 as in make_cache;
 * each row's counts depend on its global head only, so the ranks together hold what one cache
 * of all the heads would. */
static mkv_cache_t *make_rank_cache(int32_t L, int32_t H, int32_t first_head)
{
    mkv_cache_config_t cfg = tu_config(L, H, 5, 64, 4, 24 * L * H);
    mkv_cache_t *c = tu_create(&cfg);
    int32_t slot;
    for (int i = 0; i < 3; i++) TU_COK(c, mkv_cache_admit(c, 8, &slot));
    int32_t slots[2] = {0, 1}, seq_len[2] = {16, 20};
    int32_t *n_hi = malloc((size_t)(2 * L * H) * sizeof *n_hi);
    int32_t *n_lo = malloc((size_t)(2 * L * H) * sizeof *n_lo);
    cr_assert(n_hi && n_lo);
    for (int32_t s = 0; s < 2; s++) {
        for (int32_t l = 0; l < L; l++) {
            for (int32_t h = 0; h < H; h++) {
                const int32_t g = first_head + h, i = (s * L + l) * H + h;
                n_hi[i] = s == 0 ? 8 : 4 + g % 3;
                n_lo[i] = s == 0 ? g % 3 * 3 : 7 + l % 2;
            }
        }
    }
    mkv_resize_t rz = {2, slots, seq_len, n_hi, n_lo};
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    int32_t two = 2;
    for (int i = 0; i < 3; i++) TU_COK(c, mkv_cache_append(c, 1, &two, NULL)); /* decode */
    tu_expect_valid(c, "make_rank_cache");
    free(n_hi);
    free(n_lo);
    return c;
}

/* The text after `marker` in out (the rank's section of the report). */
static const char *section(const char *out, const char *marker)
{
    const char *p = strstr(out, marker);
    cr_assert_not_null(p, "no '%s' in:\n%s", marker, out);
    return p;
}

static int64_t i64_at(cJSON *o, const char *key) { return (int64_t)at(o, key)->valuedouble; }

Test(inspect, tp_set_totals)
{
    mkv_cache_t *c0 = make_rank_cache(2, 3, 0), *c1 = make_rank_cache(2, 2, 3);
    mkv_cache_t *whole = make_rank_cache(2, 5, 0);
    mkv_cache_stats_t s0 = tu_stats(c0), s1 = tu_stats(c1), sw = tu_stats(whole);
    char *a = write_cache(c0), *b = write_cache(c1);

    run_t r = run_cli("inspect", a, b, NULL);
    cr_assert_eq(r.status, 0, "exit %d:\n%s%s", r.status, r.out, r.err);
    cr_assert_str_eq(r.err, "");
    const char *rank1 = section(r.out, "== rank 1 of 2: KV heads 3 to 4 globally (local 0 to 1) ==");
    EXPECT_IN(section(r.out, "== rank 0 of 2: KV heads 0 to 2 globally (local 0 to 2) =="), "L=2 H=3 G=4");
    EXPECT_IN(rank1, "L=2 H=2 G=4");
    const char *total = section(rank1, "== tensor-parallel set: 2 ranks, 5 KV heads");
    char want[256];
    snprintf(want, sizeof want, "tokens: %lld hi, %lld lo, %lld pruned, %lld seen",
             (long long)(s0.tokens_hi + s1.tokens_hi), (long long)(s0.tokens_lo + s1.tokens_lo),
             (long long)(s0.tokens_pruned + s1.tokens_pruned),
             (long long)(s0.tokens_seen + s1.tokens_seen));
    EXPECT_IN(total, want);
    snprintf(want, sizeof want, "bytes: %lld in use, %lld as FP16",
             (long long)(s0.bytes_in_use + s1.bytes_in_use),
             (long long)(s0.bytes_fp16 + s1.bytes_fp16));
    EXPECT_IN(total, want);
    EXPECT_IN(total, "slots: 3 active");
    EXPECT_IN(total, "ranks: every invariant holds in every rank");
    EXPECT_IN(total, "set: consistent");
    run_free(&r);

    r = run_cli("inspect", "--json", a, b, NULL);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    cJSON *out = cJSON_Parse(r.out);
    cr_assert_not_null(out, "--json prints JSON only:\n%s", r.out);
    cJSON *ranks = at(out, "ranks"), *tot = at(out, "total");
    cr_assert_eq(cJSON_GetArraySize(ranks), 2);
    static const char *const keys[] = {"tokens_hi", "tokens_lo", "tokens_seen", "tokens_pruned",
                                       "pages_hi",  "pages_lo",  "bytes",       "bytes_fp16"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        int64_t sum = 0;
        for (int i = 0; i < 2; i++) {
            cJSON *rank = cJSON_GetArrayItem(ranks, i);
            cr_assert_eq(i64_at(rank, "rank"), i);
            cr_assert(cJSON_IsTrue(at(at(rank, "check"), "ok")));
            sum += i64_at(at(rank, "summary"), keys[k]);
        }
        cr_assert_eq(i64_at(tot, keys[k]), sum, "total %s", keys[k]);
    }
    cr_assert_eq(i64_at(tot, "tokens_hi"), s0.tokens_hi + s1.tokens_hi);
    cr_assert_eq(i64_at(tot, "tokens_seen"), s0.tokens_seen + s1.tokens_seen);
    /* The ranks together hold the tokens of one cache of all five heads. */
    cr_assert_eq(i64_at(tot, "tokens_hi"), sw.tokens_hi);
    cr_assert_eq(i64_at(tot, "tokens_lo"), sw.tokens_lo);
    cr_assert_eq(i64_at(tot, "tokens_seen"), sw.tokens_seen);
    cr_assert_eq(i64_at(tot, "pages_hi"), sw.pages_hi);
    cr_assert_eq(i64_at(tot, "n_kv_heads"), 5);
    cr_assert_eq(i64_at(tot, "total_pages"), 24 * 2 * 3 + 24 * 2 * 2);
    cr_assert_eq(i64_at(cJSON_GetArrayItem(ranks, 1), "first_head"), 3);
    cJSON *slots = at(tot, "slots");
    cr_assert_eq(cJSON_GetArraySize(slots), 3);
    cJSON *slot1 = cJSON_GetArrayItem(slots, 1);
    cr_assert_eq(i64_at(slot1, "slot"), 1);
    cr_assert_eq(i64_at(slot1, "seq_len"), 20);
    cr_assert_eq(i64_at(slot1, "tokens_seen"), 20 * 2 * 5);
    cr_assert(cJSON_IsTrue(at(out, "consistent")));
    cr_assert_eq(cJSON_GetArraySize(at(out, "violations")), 0);
    cJSON_Delete(out);
    run_free(&r);
    rm_tmp(a);
    rm_tmp(b);
    mkv_cache_destroy(c0);
    mkv_cache_destroy(c1);
    mkv_cache_destroy(whole);
}

Test(inspect, tp_option_finds_rank_files)
{
    char dir[] = "/tmp/mkv_inspect_tp_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char base[64], f0[80], f1[80], none[80];
    snprintf(base, sizeof base, "%s/run.json", dir);
    snprintf(f0, sizeof f0, "%s/run.rank0.json", dir);
    snprintf(f1, sizeof f1, "%s/run.rank1.json", dir);
    snprintf(none, sizeof none, "%s/none.json", dir);
    mkv_cache_t *c0 = make_rank_cache(2, 2, 0), *c1 = make_rank_cache(2, 2, 2);
    TU_COK(c0, mkv_cache_dump_json(c0, f0));
    TU_COK(c1, mkv_cache_dump_json(c1, f1));

    run_t r = run_cli("inspect", "--json", "--tp", base, NULL);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    cJSON *out = cJSON_Parse(r.out);
    cr_assert_not_null(out, "%s", r.out);
    cr_assert_eq(cJSON_GetArraySize(at(out, "ranks")), 2);
    cr_assert_str_eq(at(cJSON_GetArrayItem(at(out, "ranks"), 1), "file")->valuestring, f1);
    cJSON_Delete(out);
    run_free(&r);

    r = run_cli("inspect", "--tp", none, NULL);
    cr_assert_eq(r.status, 2, "%s%s", r.out, r.err);
    EXPECT_IN(r.err, "none.rank0.json does not exist");
    run_free(&r);
    r = run_cli("inspect", "--tp", base, f0, NULL);
    cr_assert_eq(r.status, 2);
    run_free(&r);
    r = run_cli("inspect", f0, "/nonexistent-mkv/run.rank1.json", NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "/nonexistent-mkv/run.rank1.json: cannot open");
    run_free(&r);

    unlink(f0);
    unlink(f1);
    rmdir(dir);
    mkv_cache_destroy(c0);
    mkv_cache_destroy(c1);
}

Test(inspect, tp_slot_numbers_heads_globally)
{
    mkv_cache_t *c0 = make_rank_cache(2, 3, 0), *c1 = make_rank_cache(2, 2, 3);
    char *a = write_cache(c0), *b = write_cache(c1);
    run_t r = run_cli("inspect", "--slot", "1", a, b, NULL);
    cr_assert_eq(r.status, 0, "%s%s", r.out, r.err);
    /* Rank 1's row (slot 1, layer 0, local head 0) is global head 3. */
    const mkv_mm_state_t *st = &c1->st;
    const int64_t reg = mkv_mm_region(&st->g, 1, 0, 0);
    const int32_t *row = mkv_mm_row(st, reg);
    char want[160];
    cr_assert_eq(st->n_hi[reg], 4); /* one hi page */
    cr_assert_eq(st->n_lo[reg], 7); /* one lo page */
    snprintf(want, sizeof want, "%6d %5d %8d %8d  [%d] | [%d]\n", 0, 3, 4, 7, row[0],
             row[st->g.row_entries - 1]);
    const char *rank1 = section(r.out, "== rank 1 of 2");
    EXPECT_IN(rank1, "rows of slot 1 (KV heads numbered globally: local head h is 3 + h)");
    EXPECT_IN(rank1, want);
    cr_assert_null(strstr(rank1, "     0     0 "), "rank 1 lists no head 0:\n%s", rank1);
    run_free(&r);

    r = run_cli("inspect", "--json", "--slot=1", a, b, NULL);
    cr_assert_eq(r.status, 0);
    cJSON *out = cJSON_Parse(r.out);
    cr_assert_not_null(out, "%s", r.out);
    cJSON *row0 = cJSON_GetArrayItem(at(cJSON_GetArrayItem(at(out, "ranks"), 1), "rows"), 0);
    cr_assert_eq(i64_at(row0, "head"), 0);
    cr_assert_eq(i64_at(row0, "global_head"), 3);
    cr_assert_eq(cJSON_GetArraySize(at(at(out, "total"), "slots")), 1);
    cJSON_Delete(out);
    run_free(&r);

    r = run_cli("inspect", "--slot", "4", a, b, NULL);
    cr_assert_eq(r.status, 2);
    EXPECT_IN(r.err, "slot 4 is not active in any rank");
    run_free(&r);
    rm_tmp(a);
    rm_tmp(b);
    mkv_cache_destroy(c0);
    mkv_cache_destroy(c1);
}

Test(inspect, tp_slots_differ)
{
    mkv_cache_t *c0 = make_rank_cache(2, 3, 0), *c1 = make_rank_cache(2, 2, 3);
    TU_COK(c1, mkv_cache_release(c1, 2, NULL));
    int32_t one = 1;
    TU_COK(c1, mkv_cache_append(c1, 1, &one, NULL));
    char *a = write_cache(c0), *b = write_cache(c1);
    run_t r = run_cli("inspect", a, b, NULL);
    cr_assert_eq(r.status, 1, "%s%s", r.out, r.err);
    EXPECT_IN(r.out, "set: 2 mismatches between ranks");
    EXPECT_IN(r.out, "[seq_len_mismatch] slot 1 has N = 20 in rank 0 but N = 21 in rank 1");
    EXPECT_IN(r.out, "[slot_mismatch] slot 2 is active in rank 0 but not in rank 1");
    EXPECT_IN(r.out, "ranks: every invariant holds in every rank");
    EXPECT_IN(r.err, "mixkv inspect: the ranks disagree: 2 mismatches, first: slot 1 has N");
    run_free(&r);

    r = run_cli("inspect", "--json", a, b, NULL);
    cr_assert_eq(r.status, 1);
    cJSON *out = cJSON_Parse(r.out);
    cr_assert_not_null(out, "%s", r.out);
    cr_assert(cJSON_IsFalse(at(out, "consistent")));
    cr_assert(cJSON_IsTrue(at(out, "ranks_ok")));
    cJSON *v = cJSON_GetArrayItem(at(out, "violations"), 1);
    cr_assert_str_eq(at(v, "kind")->valuestring, "slot_mismatch");
    cr_assert_eq(i64_at(v, "slot"), 2);
    cr_assert_eq(cJSON_GetArrayItem(at(v, "ranks"), 1)->valueint, 1);
    cJSON_Delete(out);
    run_free(&r);
    rm_tmp(a);
    rm_tmp(b);
    mkv_cache_destroy(c0);
    mkv_cache_destroy(c1);
}

Test(inspect, tp_config_differs)
{
    mkv_cache_t *c0 = make_rank_cache(2, 3, 0), *c1 = make_rank_cache(3, 2, 3);
    char *a = write_cache(c0), *b = write_cache(c1);
    run_t r = run_cli("inspect", a, b, NULL);
    cr_assert_eq(r.status, 1, "%s%s", r.out, r.err);
    EXPECT_IN(r.out, "set: 1 mismatch between ranks\n");
    EXPECT_IN(r.out, "[config_mismatch] config.n_layers differs: 2 in rank 0, 3 in rank 1");
    cr_assert_null(strstr(r.out, "config.n_kv_heads"), "n_kv_heads may differ");
    cr_assert_null(strstr(r.out, "config.pool_pages"), "pool_pages may differ");
    run_free(&r);
    rm_tmp(a);
    rm_tmp(b);
    mkv_cache_destroy(c0);
    mkv_cache_destroy(c1);
}

Test(inspect, tp_corrupt_rank)
{
    mkv_cache_t *c0 = make_rank_cache(2, 3, 0), *c1 = make_rank_cache(2, 2, 3);
    char *a = write_cache(c0);
    cJSON *root = cache_json(c1);
    /* rows[0] is (0, 0, 0), rows[3] is (0, 1, 1): the same page in two rows of rank 1. */
    const int dup = id_at(row_at(root, 0), "hi", 1);
    cJSON_ReplaceItemInArray(at(row_at(root, 3), "hi"), 0, cJSON_CreateNumber(dup));
    char *b = write_json(root);
    run_t r = run_cli("inspect", a, b, NULL);
    cr_assert_eq(r.status, 1, "%s%s", r.out, r.err);
    const char *rank1 = section(r.out, "== rank 1 of 2");
    char want[200];
    snprintf(want, sizeof want,
             "[page_duplicated] page %d is in two places: row (slot 0, layer 0, head 0) hi[1] and "
             "row (slot 0, layer 1, head 1) hi[0]",
             dup);
    EXPECT_IN(rank1, want);
    cr_assert(strstr(r.out, "check: ok") < rank1, "rank 0 is clean");
    EXPECT_IN(r.out, "ranks: violations in rank 1 (2), listed above");
    EXPECT_IN(r.out, "set: consistent");
    snprintf(want, sizeof want, "mixkv inspect: rank 1 (%s): 2 invariant violations", b);
    EXPECT_IN(r.err, want);
    run_free(&r);

    r = run_cli("inspect", "--json", a, b, NULL);
    cr_assert_eq(r.status, 1);
    cJSON *out = cJSON_Parse(r.out);
    cr_assert_not_null(out, "%s", r.out);
    cr_assert(cJSON_IsTrue(at(at(cJSON_GetArrayItem(at(out, "ranks"), 0), "check"), "ok")));
    cr_assert(cJSON_IsFalse(at(at(cJSON_GetArrayItem(at(out, "ranks"), 1), "check"), "ok")));
    cr_assert(cJSON_IsFalse(at(out, "consistent")));
    cr_assert(cJSON_IsTrue(at(out, "ranks_agree")));
    cJSON_Delete(out);
    run_free(&r);
    cJSON_Delete(root);
    rm_tmp(a);
    rm_tmp(b);
    mkv_cache_destroy(c0);
    mkv_cache_destroy(c1);
}
