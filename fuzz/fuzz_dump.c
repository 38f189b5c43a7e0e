/*
 * fuzz_dump.c — libFuzzer target: the input as a cache dump (docs/dump-format.md) through
 * every path a user's dump file reaches:
 *   - mkv_dump_read_string (memmgr/dump_read.c), and when it reads, the invariant checker on
 *     mkv_dump_view (memmgr/check.c);
 *   - mkv_cache_load_json (memmgr/dump.c: check, create a cache, restore, check again);
 *   - `mixkv inspect` (tools/inspect.c: text, --json, --slot) and `mixkv inspect --diff`
 *     against itself and against a fixed sample dump (tools/inspect_diff.c), and as rank 1
 *     of a tensor-parallel set after the sample (tools/inspect_tp.c).
 * Seeds: fuzz/corpus/dump/. With MKV_FUZZ_SAMPLE_DUMP=FILE the target writes its sample dump
 * to FILE and exits (fuzz/make_seeds.py uses it).
 */
#include "common/error.h"
#include "fuzz_util.h"
#include "memmgr/dump.h"
#include "memmgr/state.h"
#include "mixkv.h"
#include "tools/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* NOTE: a dump's geometry (slots, layers, heads, max_seq_len) is not backed by its content
 * (free slots and empty rows are not listed), and the checker, inspect and a loaded cache
 * allocate in proportion to it, as mkv_cache_create does for the same config: a dump of a huge
 * cache legitimately needs a big machine. The harness skips dumps beyond this budget, and
 * loads whose page storage (unless METADATA_ONLY) exceeds it, like a careful caller would. */
#define GEOMETRY_BYTES_MAX ((int64_t)256 << 20)
#define LOAD_POOL_BYTES_MAX ((int64_t)64 << 20)

/* Bytes the dump's geometry makes the checker and a loaded cache allocate, roughly. */
static double geometry_bytes(const mkv_mm_geom_t *g)
{
    const double regions = (double)mkv_mm_regions(g); /* NOTE: double, products overflow int64 */
    return (double)g->max_seqs * 32 + regions * ((double)g->row_entries * 4 + 16) +
           (double)g->pool_pages * 20;
}

static char sample_path[512];

/* A small cache after admissions, a resize, appends and a release: hi and lo pages in use,
 * a pending reservation, free pages out of order. */
static void write_sample(const char *path)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = 1;
    cfg.n_kv_heads = 2;
    cfg.max_seqs = 3;
    cfg.max_seq_len = 32;
    cfg.head_dim = 64;
    cfg.page_bytes = 0; /* the default page (32 high tokens), whatever the group fields are */
    cfg.pool_pages = 24;
    cfg.window = 4;
    cfg.flags = MKV_CACHE_METADATA_ONLY;
    mkv_cache_t *c = NULL;
    int32_t slot, slots[2] = {0, 1}, seq_len[2] = {10, 12}, n_hi[4] = {3, 4, 5, 6},
                  n_lo[4] = {2, 0, 4, 6};
    mkv_resize_t rz = {2, slots, seq_len, n_hi, n_lo};
    if (mkv_cache_create(&cfg, &c) != MKV_STATUS_OK || mkv_cache_admit(c, 5, &slot) ||
        mkv_cache_admit(c, 5, &slot) || mkv_cache_admit(c, 3, &slot) ||
        mkv_cache_resize(c, &rz, NULL) || mkv_cache_append(c, 2, slots, NULL) ||
        mkv_cache_release(c, 0, NULL) || mkv_cache_admit(c, 7, &slot) ||
        mkv_cache_dump_json(c, path)) {
        fprintf(stderr, "fuzz_dump: cannot build the sample dump: %s\n", mkv_last_error());
        abort();
    }
    mkv_cache_destroy(c);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *to = getenv("MKV_FUZZ_SAMPLE_DUMP");
    if (to) {
        write_sample(to);
        exit(0);
    }
    fuzz_path(sample_path, sizeof sample_path, "sample.json");
    write_sample(sample_path);
    /* `mixkv inspect` prints its reports on stdout: nobody reads them here. */
    if (!fuzz_verbose() && !freopen("/dev/null", "w", stdout)) abort();
    return 0;
}

static int inspect(int argc, const char **argv)
{
    return mkv_inspect_main(argc, (char **)argv);
}

static void count_violation(void *ctx, const mkv_violation_t *v)
{
    (void)v;
    ++*(int64_t *)ctx;
}

/* Byte mutations rarely keep a dump parseable: half the time, a JSON-aware one instead
 * (fuzz_mutate_json), so that structurally valid but hostile dumps reach the checker, the
 * loader and inspect. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    if (seed & 1) {
        char *text = fuzz_mutate_json((const char *)data, size, seed >> 1, NULL, 0);
        const size_t len = text ? strlen(text) : 0;
        if (len && len <= max_size) memcpy(data, text, len);
        free(text);
        if (len && len <= max_size) return len;
    }
    return LLVMFuzzerMutate(data, size, max_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[MKV_ERR_LEN] = "";
    mkv_dump_t d;
    const mkv_status_t st = mkv_dump_read_string((const char *)data, size, &d, err);
    if (fuzz_verbose()) fprintf(stderr, "fuzz_dump: read: %s %s\n", mkv_status_string(st), err);
    if (st != MKV_STATUS_OK) {
        mkv_dump_free(&d);
        return 0;
    }
    if (geometry_bytes(&d.g) > (double)GEOMETRY_BYTES_MAX) {
        mkv_dump_free(&d);
        return 0;
    }
    mkv_state_view_t view;
    mkv_dump_view(&d, &view);
    int64_t seen = 0;
    const int64_t n = mkv_state_check(&view, count_violation, &seen);
    const int64_t pool_bytes = d.config.flags & MKV_CACHE_METADATA_ONLY
                                   ? 0
                                   : d.config.pool_pages * d.config.page_bytes;
    if (fuzz_verbose())
        fprintf(stderr, "fuzz_dump: %lld violations (%lld reported)\n", (long long)n,
                (long long)seen);
    mkv_dump_free(&d);

    const char *path = fuzz_write("dump.json", data, size);
    if (pool_bytes <= LOAD_POOL_BYTES_MAX) {
        mkv_cache_t *c = NULL;
        const mkv_status_t ls = mkv_cache_load_json(path, &c);
        if (fuzz_verbose())
            fprintf(stderr, "fuzz_dump: load: %s %s\n", mkv_status_string(ls), mkv_last_error());
        if (ls == MKV_STATUS_OK) {
            /* A loaded cache must be valid and dump back to something that reads. */
            if (mkv_cache_validate(c) != MKV_STATUS_OK) {
                fprintf(stderr, "fuzz_dump: a loaded cache fails validation: %s\n",
                        mkv_last_error());
                abort();
            }
            char *again = NULL;
            if (mkv_cache_dump_json_string(c, &again) == MKV_STATUS_OK) {
                mkv_dump_t d2;
                if (mkv_dump_read_string(again, strlen(again), &d2, err) != MKV_STATUS_OK) {
                    fprintf(stderr, "fuzz_dump: the re-dump of a loaded cache does not read: %s\n",
                            err);
                    abort();
                }
                mkv_dump_free(&d2);
            }
            free(again);
        }
        mkv_cache_destroy(c);
    }

    const char *plain[] = {"inspect", "--max-violations", "0", path};
    const char *json[] = {"inspect", "--json", path};
    const char *slot[] = {"inspect", "--slot", "0", path};
    const char *diff_self[] = {"inspect", "--diff", path, path};
    const char *diff_sample[] = {"inspect", "--diff", "--json", sample_path, path};
    const char *diff_back[] = {"inspect", "--diff", path, sample_path};
    const char *tp[] = {"inspect", "--json", sample_path, path};
    const char *tp_slot[] = {"inspect", "--slot", "0", sample_path, path, path};
    inspect(4, plain);
    inspect(3, json);
    inspect(4, slot);
    if (inspect(4, diff_self) != MKV_EXIT_OK) {
        fprintf(stderr, "fuzz_dump: inspect --diff finds differences between a dump and itself\n");
        abort();
    }
    inspect(5, diff_sample);
    inspect(4, diff_back);
    inspect(4, tp);
    inspect(6, tp_slot);
    return 0;
}
