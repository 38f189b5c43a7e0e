/*
 * inspect.c — `mixkv inspect`: checks a cache dump (docs/dump-format.md) against every
 * invariant of DESIGN.md section 4, prints a summary of memory use per precision and per
 * slot, one slot's rows with --slot, and machine-readable output with --json (docs/cli.md).
 * The comparison of two dumps (--diff) lives in inspect_diff.c, the dumps of a
 * tensor-parallel run (one per GPU) in inspect_tp.c; both build on the functions exported
 * here (inspect.h).
 *
 * The checker is the library's own (mkv_state_check, the one behind mkv_cache_validate), run
 * on a view of the dump, so a dump and a live cache are judged by the same code.
 */
#include "common/error.h"
#include "memmgr/dump.h"
#include "tools/cli.h"
#include "tools/inspect.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define CMD                    "inspect"
#define DEFAULT_MAX_VIOLATIONS 100

void mkv_inspect_usage(FILE *f)
{
    fputs(
        "usage: mixkv inspect [OPTIONS] DUMP.json\n"
        "       mixkv inspect [OPTIONS] RANK0.json RANK1.json ...\n"
        "       mixkv inspect [OPTIONS] --tp X.json\n"
        "       mixkv inspect --diff [--json[=FILE]] A.json B.json\n"
        "\n"
        "Checks a cache dump (written by mkv_cache_dump_json) against every invariant of the\n"
        "memory manager and reports each violation, naming the page and the rows (slot, layer,\n"
        "head); then summarises pages, tokens and bytes by precision and per slot.\n"
        "\n"
        "Two or more dumps (without --diff) are the caches of one tensor-parallel run, one per\n"
        "GPU, in rank order: rank r holds the KV heads after those of ranks 0 .. r-1. Each is\n"
        "checked and summarised on its own; then the set is checked (the same config except\n"
        "n_kv_heads and pool_pages, the same active slots with the same N in every rank) and\n"
        "totalled over the ranks.\n"
        "\n"
        "options:\n"
        "  --slot N              show slot N's rows (layer, head, n_hi, n_lo, page ids); in a\n"
        "                        tensor-parallel set, from every rank, heads numbered globally\n"
        "  --json[=FILE]         machine-readable output (docs/cli.md): on stdout instead of the\n"
        "                        text, or to FILE in addition to it\n"
        "  --max-violations N    list at most N violations (default 100; 0: all)\n"
        "  --tp X.json           the tensor-parallel set X.rank0.json, X.rank1.json, ... (as\n"
        "                        many as exist; X.rank0.json must exist)\n"
        "  --diff A B            what changed from dump A to dump B: config, ring counters,\n"
        "                        slots, rows (counts and page ids per section)\n"
        "  -h, --help            this help\n"
        "\n"
        "DUMP may be '-' for stdin.\n"
        "exit status: 0 the dump is consistent (with --diff: the dumps are identical),\n"
        "1 an invariant is violated or the ranks of a set disagree (with --diff: the dumps\n"
        "differ), 2 bad usage or an unreadable, malformed or wrong-version file.\n",
        f);
}

/* ---------------------------------------------------------------------------------------- */
/* Summary                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* NOTE: the sums run over a dump as written, before any check: a slot may claim N = 2^31 - 1
 * over 2^23 head-regions of d = 256 (found by fuzz_dump), so they saturate at the int64 range
 * instead of overflowing. */
static int64_t sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? ((a < 0) != (b < 0) ? INT64_MIN : INT64_MAX) : r;
}

static void finish(mkv_usage_sum_t *u, int64_t page_bytes)
{
    u->tokens_pruned = mkv_sat_add(mkv_sat_add(u->tokens_seen, -u->tokens_hi), -u->tokens_lo);
    u->bytes = sat_mul(mkv_sat_add(u->pages_hi, u->pages_lo), page_bytes);
}

void mkv_usage_add(mkv_usage_sum_t *into, const mkv_usage_sum_t *u)
{
    into->reserved = mkv_sat_add(into->reserved, u->reserved);
    into->tokens_hi = mkv_sat_add(into->tokens_hi, u->tokens_hi);
    into->tokens_lo = mkv_sat_add(into->tokens_lo, u->tokens_lo);
    into->tokens_seen = mkv_sat_add(into->tokens_seen, u->tokens_seen);
    into->tokens_pruned = mkv_sat_add(into->tokens_pruned, u->tokens_pruned);
    into->pages_hi = mkv_sat_add(into->pages_hi, u->pages_hi);
    into->pages_lo = mkv_sat_add(into->pages_lo, u->pages_lo);
    into->bytes = mkv_sat_add(into->bytes, u->bytes);
    into->bytes_fp16 = mkv_sat_add(into->bytes_fp16, u->bytes_fp16);
}

/* Sums over the dump as written; robust to any content (rows of unknown slots count in the
 * totals only). Returns -1 when memory runs out. */
static int summarise(const mkv_dump_t *d, mkv_summary_t *s)
{
    const mkv_mm_geom_t *g = &d->g;
    const int64_t per_token_fp16 = 2 * (int64_t)d->config.head_dim * 2; /* K and V, fp16 */
    const int64_t lh = (int64_t)g->n_layers * g->n_kv_heads;
    memset(s, 0, sizeof *s);
    s->slots = calloc((size_t)(d->n_slots > 0 ? d->n_slots : 1), sizeof *s->slots);
    int32_t *index = malloc((size_t)g->max_seqs * sizeof *index); /* slot -> position */
    if (!s->slots || !index) {
        free(index);
        return -1;
    }
    for (int32_t i = 0; i < g->max_seqs; i++) index[i] = -1;
    for (int32_t i = 0; i < d->n_slots; i++) {
        const mkv_slot_view_t *sv = &d->slots[i];
        mkv_usage_sum_t *u = &s->slots[i];
        u->seq_len = sv->seq_len;
        u->reserved = sv->reserved;
        u->tokens_seen = sat_mul(sv->seq_len, lh);
        u->bytes_fp16 = sat_mul(u->tokens_seen, per_token_fp16);
        s->all.tokens_seen = mkv_sat_add(s->all.tokens_seen, u->tokens_seen);
        if (sv->slot >= 0 && sv->slot < g->max_seqs && index[sv->slot] < 0) index[sv->slot] = i;
    }
    for (int64_t r = 0; r < d->n_rows; r++) {
        const mkv_row_view_t *row = &d->rows[r];
        mkv_usage_sum_t *sums[2] = {&s->all, NULL};
        if (row->slot >= 0 && row->slot < g->max_seqs && index[row->slot] >= 0)
            sums[1] = &s->slots[index[row->slot]];
        for (int k = 0; k < 2 && sums[k]; k++) {
            sums[k]->tokens_hi = mkv_sat_add(sums[k]->tokens_hi, row->n_hi);
            sums[k]->tokens_lo = mkv_sat_add(sums[k]->tokens_lo, row->n_lo);
            sums[k]->pages_hi += row->k_hi; /* bounded by the ids the file lists */
            sums[k]->pages_lo += row->k_lo;
        }
    }
    free(index);
    for (int32_t i = 0; i < d->n_slots; i++) finish(&s->slots[i], d->config.page_bytes);
    s->all.reserved = d->reserved_total;
    s->all.bytes_fp16 = sat_mul(s->all.tokens_seen, per_token_fp16);
    finish(&s->all, d->config.page_bytes);
    s->free_pages = d->tail - d->head;
    s->available_pages = s->free_pages - d->reserved_total;
    s->used_pages = g->pool_pages - s->free_pages;
    return 0;
}

static double ratio(const mkv_usage_sum_t *u)
{
    return u->bytes_fp16 > 0 ? (double)u->bytes / (double)u->bytes_fp16 : 0.0;
}

static void print_config(const mkv_dump_t *d)
{
    const mkv_cache_config_t *c = &d->config;
    printf("config: L=%d H=%d G=%d d=%d S=%d max_seq_len=%d page_bytes=%" PRId64
           " hi=%s (%d tokens/page) lo=%s (%d tokens/page) T=%d W=%d alpha_h=%g alpha_l=%g "
           "groups hi k%d/v%d lo k%d/v%d%s\n",
           c->n_layers, c->n_kv_heads, c->group_size, c->head_dim, c->max_seqs, c->max_seq_len,
           c->page_bytes, mkv_format_name(c->hi_format), d->g.tpp_hi, mkv_format_name(c->lo_format),
           d->g.tpp_lo, d->g.row_entries, c->window, (double)c->alpha_h, (double)c->alpha_l,
           c->hi_key_group, c->hi_value_group, c->lo_key_group, c->lo_value_group,
           (c->flags & MKV_CACHE_METADATA_ONLY) ? " metadata-only" : "");
}

void mkv_inspect_print_slot_header(void)
{
    printf("%6s %8s %10s %10s %10s %9s %9s %12s %12s %7s %9s\n", "slot", "N", "tokens_hi",
           "tokens_lo", "pruned", "pages_hi", "pages_lo", "bytes", "fp16_bytes", "ratio",
           "reserved");
}

void mkv_inspect_print_slot_line(int32_t slot, const mkv_usage_sum_t *u)
{
    printf("%6d %8" PRId64 " %10" PRId64 " %10" PRId64 " %10" PRId64 " %9" PRId64 " %9" PRId64
           " %12" PRId64 " %12" PRId64 " %7.3f %9" PRId64 "\n",
           slot, u->seq_len, u->tokens_hi, u->tokens_lo, u->tokens_pruned, u->pages_hi, u->pages_lo,
           u->bytes, u->bytes_fp16, ratio(u), u->reserved);
}

void mkv_inspect_print_usage(const mkv_usage_sum_t *a)
{
    printf("pages: %" PRId64 " hi, %" PRId64 " lo\n", a->pages_hi, a->pages_lo);
    printf("tokens: %" PRId64 " hi, %" PRId64 " lo, %" PRId64 " pruned, %" PRId64 " seen\n",
           a->tokens_hi, a->tokens_lo, a->tokens_pruned, a->tokens_seen);
    printf("bytes: %" PRId64 " in use, %" PRId64 " as FP16, ratio %.3f", a->bytes, a->bytes_fp16,
           ratio(a));
    if (a->bytes > 0)
        printf(" (%.2fx smaller than FP16)", (double)a->bytes_fp16 / (double)a->bytes);
    putchar('\n');
}

static void print_summary(const char *path, const mkv_dump_t *d, const mkv_summary_t *s)
{
    printf("dump: %s (written by mixkv %s, dump format %d)\n", path, d->mixkv_version,
           d->version);
    print_config(d);
    printf("pool: %" PRId64 " pages: %" PRId64 " free, %" PRId64 " reserved, %" PRId64
           " available, %" PRId64 " in use (ring head %" PRId64 ", tail %" PRId64 ")\n",
           d->g.pool_pages, s->free_pages, d->reserved_total, s->available_pages, s->used_pages,
           d->head, d->tail);
    mkv_inspect_print_usage(&s->all);
    printf("slots: %d active\n", d->n_slots);
}

/* ---------------------------------------------------------------------------------------- */
/* Violations                                                                               */
/* ---------------------------------------------------------------------------------------- */

static void collect(void *ctx, const mkv_violation_t *v)
{
    mkv_collected_t *c = ctx;
    if (c->slot >= 0 && v->slot != c->slot && v->other_slot != c->slot) {
        c->elsewhere++;
        return;
    }
    c->count++;
    if (c->max > 0 && c->n_listed >= c->max) return;
    if (c->n_listed == c->cap) {
        int64_t cap = c->cap ? c->cap * 2 : 64;
        mkv_violation_t *p = realloc(c->list, (size_t)cap * sizeof *p);
        if (!p) {
            c->oom = 1;
            return;
        }
        c->list = p;
        c->cap = cap;
    }
    c->list[c->n_listed++] = *v;
}

static cJSON *json_loc(int32_t v) { return v >= 0 ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static cJSON *violation_json(const mkv_violation_t *v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", mkv_violation_kind_name(v->kind));
    cJSON_AddItemToObject(o, "page", json_loc(v->page));
    cJSON_AddItemToObject(o, "slot", json_loc(v->slot));
    cJSON_AddItemToObject(o, "layer", json_loc(v->layer));
    cJSON_AddItemToObject(o, "head", json_loc(v->head));
    cJSON_AddItemToObject(o, "other_slot", json_loc(v->other_slot));
    cJSON_AddItemToObject(o, "other_layer", json_loc(v->other_layer));
    cJSON_AddItemToObject(o, "other_head", json_loc(v->other_head));
    cJSON_AddBoolToObject(o, "other_is_free_list", v->other_slot == -2);
    cJSON_AddStringToObject(o, "message", v->message);
    return o;
}

/* ---------------------------------------------------------------------------------------- */
/* JSON output                                                                              */
/* ---------------------------------------------------------------------------------------- */

cJSON *mkv_inspect_usage_json(const mkv_usage_sum_t *u, int32_t slot)
{
    cJSON *o = cJSON_CreateObject();
    if (slot >= 0) {
        cJSON_AddNumberToObject(o, "slot", slot);
        mkv_cli_json_add_i64(o, "seq_len", u->seq_len);
    }
    mkv_cli_json_add_i64(o, "reserved_pages", u->reserved);
    mkv_cli_json_add_i64(o, "tokens_hi", u->tokens_hi);
    mkv_cli_json_add_i64(o, "tokens_lo", u->tokens_lo);
    mkv_cli_json_add_i64(o, "tokens_seen", u->tokens_seen);
    mkv_cli_json_add_i64(o, "tokens_pruned", u->tokens_pruned);
    mkv_cli_json_add_i64(o, "pages_hi", u->pages_hi);
    mkv_cli_json_add_i64(o, "pages_lo", u->pages_lo);
    mkv_cli_json_add_i64(o, "bytes", u->bytes);
    mkv_cli_json_add_i64(o, "bytes_fp16", u->bytes_fp16);
    cJSON_AddItemToObject(o, "ratio",
                          u->bytes_fp16 > 0 ? cJSON_CreateNumber(ratio(u)) : cJSON_CreateNull());
    return o;
}

static cJSON *row_json(const mkv_row_view_t *r, int64_t first_head)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "layer", r->layer);
    cJSON_AddNumberToObject(o, "head", r->head);
    if (first_head >= 0) mkv_cli_json_add_i64(o, "global_head", first_head + r->head);
    cJSON_AddNumberToObject(o, "n_hi", r->n_hi);
    cJSON_AddNumberToObject(o, "n_lo", r->n_lo);
    cJSON_AddItemToObject(o, "hi", mkv_cli_json_ids(r->hi, r->k_hi));
    cJSON_AddItemToObject(o, "lo", mkv_cli_json_ids(r->lo, r->k_lo));
    return o;
}

cJSON *mkv_inspect_report_json(const mkv_inspected_t *in, int32_t only_slot,
                               int64_t first_head)
{
    const mkv_dump_t *d = &in->d;
    const mkv_summary_t *s = &in->s;
    const mkv_collected_t *c = &in->c;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "file", in->path);
    cJSON_AddNumberToObject(root, "dump_version", d->version);
    cJSON_AddStringToObject(root, "mixkv_version", d->mixkv_version);
    cJSON_AddItemToObject(root, "config", mkv_dump_config_json(&d->config));
    cJSON *layout = cJSON_AddObjectToObject(root, "layout");
    cJSON_AddNumberToObject(layout, "tokens_per_page_hi", d->g.tpp_hi);
    cJSON_AddNumberToObject(layout, "tokens_per_page_lo", d->g.tpp_lo);
    cJSON_AddNumberToObject(layout, "row_entries", d->g.row_entries);

    cJSON *sum = mkv_inspect_usage_json(&s->all, -1);
    mkv_cli_json_add_i64(sum, "total_pages", d->g.pool_pages);
    mkv_cli_json_add_i64(sum, "free_pages", s->free_pages);
    mkv_cli_json_add_i64(sum, "available_pages", s->available_pages);
    mkv_cli_json_add_i64(sum, "used_pages", s->used_pages);
    mkv_cli_json_add_i64(sum, "ring_head", d->head);
    mkv_cli_json_add_i64(sum, "ring_tail", d->tail);
    cJSON_AddNumberToObject(sum, "active_slots", d->n_slots);
    cJSON_AddItemToObject(root, "summary", sum);

    cJSON *slots = cJSON_AddArrayToObject(root, "slots");
    for (int32_t i = 0; i < d->n_slots; i++)
        if (only_slot < 0 || d->slots[i].slot == only_slot)
            cJSON_AddItemToArray(slots, mkv_inspect_usage_json(&s->slots[i], d->slots[i].slot));
    if (only_slot >= 0) {
        cJSON *rows = cJSON_AddArrayToObject(root, "rows");
        for (int64_t r = 0; r < d->n_rows; r++)
            if (d->rows[r].slot == only_slot)
                cJSON_AddItemToArray(rows, row_json(&d->rows[r], first_head));
    }

    cJSON *check = cJSON_AddObjectToObject(root, "check");
    cJSON_AddBoolToObject(check, "ok", c->count + c->elsewhere == 0);
    mkv_cli_json_add_i64(check, "violation_count", c->count);
    if (only_slot >= 0) mkv_cli_json_add_i64(check, "violations_elsewhere", c->elsewhere);
    cJSON_AddBoolToObject(check, "truncated", c->n_listed < c->count);
    cJSON *list = cJSON_AddArrayToObject(check, "violations");
    for (int64_t i = 0; i < c->n_listed; i++)
        cJSON_AddItemToArray(list, violation_json(&c->list[i]));
    return root;
}

/* ---------------------------------------------------------------------------------------- */
/* Text output                                                                              */
/* ---------------------------------------------------------------------------------------- */

static void print_ids(const int32_t *ids, int32_t n)
{
    putchar('[');
    for (int32_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    putchar(']');
}

void mkv_inspect_print_report(const mkv_inspected_t *in, int32_t only_slot,
                              int64_t first_head)
{
    const mkv_dump_t *d = &in->d;
    const mkv_summary_t *s = &in->s;
    const mkv_collected_t *c = &in->c;
    print_summary(in->path, d, s);
    putchar('\n');
    mkv_inspect_print_slot_header();
    for (int32_t i = 0; i < d->n_slots; i++)
        if (only_slot < 0 || d->slots[i].slot == only_slot)
            mkv_inspect_print_slot_line(d->slots[i].slot, &s->slots[i]);
    if (only_slot >= 0) {
        printf("\nrows of slot %d", only_slot);
        if (first_head >= 0)
            printf(" (KV heads numbered globally: local head h is %" PRId64 " + h)", first_head);
        printf(":\n%6s %5s %8s %8s  %s\n", "layer", "head", "n_hi", "n_lo", "hi pages | lo pages");
        for (int64_t r = 0; r < d->n_rows; r++) {
            const mkv_row_view_t *row = &d->rows[r];
            if (row->slot != only_slot) continue;
            printf("%6d %5" PRId64 " %8d %8d  ", row->layer,
                   (first_head > 0 ? first_head : 0) + row->head, row->n_hi, row->n_lo);
            print_ids(row->hi, row->k_hi);
            fputs(" | ", stdout);
            print_ids(row->lo, row->k_lo);
            putchar('\n');
        }
    }
    putchar('\n');
    if (c->count == 0) {
        printf("check: ok, every invariant holds%s\n", only_slot >= 0 && c->elsewhere == 0 ? ""
                                                       : only_slot >= 0 ? " for this slot"
                                                                        : "");
    } else {
        printf("check: %" PRId64 " violation%s%s\n", c->count, c->count == 1 ? "" : "s",
               only_slot >= 0 ? " involving this slot" : "");
        for (int64_t i = 0; i < c->n_listed; i++)
            printf("  [%s] %s\n", mkv_violation_kind_name(c->list[i].kind), c->list[i].message);
        if (c->n_listed < c->count)
            printf("  ... and %" PRId64 " more (--max-violations 0 lists all)\n",
                   c->count - c->n_listed);
    }
    if (only_slot >= 0 && c->elsewhere > 0)
        printf("check: %" PRId64 " more violation%s elsewhere (run without --slot)\n", c->elsewhere,
               c->elsewhere == 1 ? "" : "s");
}

/* ---------------------------------------------------------------------------------------- */
/* Entry point                                                                              */
/* ---------------------------------------------------------------------------------------- */

int mkv_inspect_read(const char *path, int32_t only_slot, int64_t max_violations,
                     mkv_inspected_t *out)
{
    char err[MKV_ERR_LEN];
    memset(out, 0, sizeof *out);
    out->path = path;
    out->c = (mkv_collected_t){NULL, 0, 0, max_violations, 0, 0, only_slot, 0};
    if (mkv_dump_read_file(path, &out->d, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        return MKV_EXIT_USAGE;
    }
    mkv_state_view_t view;
    mkv_dump_view(&out->d, &view);
    if (mkv_state_check(&view, collect, &out->c) < 0 || out->c.oom ||
        summarise(&out->d, &out->s) != 0) {
        mkv_cli_error(CMD, "%s: out of memory", path);
        return MKV_EXIT_USAGE;
    }
    return MKV_EXIT_OK;
}

void mkv_inspect_release(mkv_inspected_t *in)
{
    free(in->c.list);
    free(in->s.slots);
    mkv_dump_free(&in->d);
    memset(in, 0, sizeof *in);
}

int mkv_inspect_slot_active(const mkv_dump_t *d, int32_t slot)
{
    for (int32_t i = 0; i < d->n_slots; i++)
        if (d->slots[i].slot == slot) return 1;
    return 0;
}

static int inspect_one(const char *path, int32_t only_slot, int json, const char *json_path,
                       int64_t max_violations)
{
    mkv_inspected_t in;
    int rc = mkv_inspect_read(path, only_slot, max_violations, &in);
    if (rc != MKV_EXIT_OK) goto done;
    if (only_slot >= in.d.g.max_seqs) {
        mkv_cli_error(CMD, "--slot %d is outside [0, %d) in %s", only_slot, in.d.g.max_seqs, path);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (only_slot >= 0 && !mkv_inspect_slot_active(&in.d, only_slot)) {
        mkv_cli_error(CMD, "slot %d is not active in %s", only_slot, path);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (json) {
        cJSON *root = mkv_inspect_report_json(&in, only_slot, -1);
        if (json_path) mkv_inspect_print_report(&in, only_slot, -1);
        if (mkv_cli_write_json(CMD, root, json_path) != 0) rc = MKV_EXIT_USAGE;
        cJSON_Delete(root);
    } else {
        mkv_inspect_print_report(&in, only_slot, -1);
    }
    const int64_t n_viol = in.c.count + in.c.elsewhere;
    if (rc == MKV_EXIT_OK && n_viol > 0) {
        mkv_cli_error(CMD, "%s: %" PRId64 " invariant violation%s", path, n_viol,
                      n_viol == 1 ? "" : "s");
        rc = MKV_EXIT_FAIL;
    }
done:
    mkv_inspect_release(&in);
    return rc;
}

int mkv_inspect_main(int argc, char **argv)
{
    /* NOTE: every file is an argument, so argc bounds their number. */
    const char **files = malloc((size_t)(argc > 0 ? argc : 1) * sizeof *files);
    if (!files) {
        mkv_cli_error(CMD, "out of memory");
        return MKV_EXIT_USAGE;
    }
    int n_files = 0, json = 0, diff = 0, rc = MKV_EXIT_USAGE;
    const char *json_path = NULL, *tp_base = NULL, *value;
    int32_t slot = -1;
    int64_t max_violations = DEFAULT_MAX_VIOLATIONS;
    int only_files = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int m;
        if (only_files || arg[0] != '-' || strcmp(arg, "-") == 0) {
            files[n_files++] = arg;
        } else if (strcmp(arg, "--") == 0) {
            only_files = 1;
        } else if (mkv_cli_is_help(arg)) {
            mkv_inspect_usage(stdout);
            rc = MKV_EXIT_OK;
            goto done;
        } else if ((m = mkv_cli_option(CMD, argc, argv, &i, "--slot", 1, 1, &value)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--slot", value, 0, INT32_MAX, &slot) != 0)
                goto done;
        } else if ((m = mkv_cli_option(CMD, argc, argv, &i, "--max-violations", 1, 1, &value)) !=
                   0) {
            if (m < 0 || mkv_cli_parse_i64(CMD, "--max-violations", value, 0, INT64_MAX,
                                           &max_violations) != 0)
                goto done;
        } else if ((m = mkv_cli_option(CMD, argc, argv, &i, "--json", 0, 1, &value)) != 0) {
            if (m < 0) goto done;
            json = 1;
            json_path = value && strcmp(value, "-") != 0 ? value : NULL;
            if (value && !value[0]) {
                mkv_cli_error(CMD, "--json=: empty file name");
                goto done;
            }
        } else if ((m = mkv_cli_option(CMD, argc, argv, &i, "--tp", 1, 1, &tp_base)) != 0) {
            if (m < 0) goto done;
            if (!tp_base[0] || strcmp(tp_base, "-") == 0) {
                mkv_cli_error(CMD, "--tp takes the name the run was given (X.json for "
                                   "X.rank0.json, X.rank1.json, ...)");
                goto done;
            }
        } else if ((m = mkv_cli_option(CMD, argc, argv, &i, "--diff", 0, 0, &value)) != 0) {
            if (m < 0) goto done;
            diff = 1;
        } else {
            mkv_cli_error(CMD, "unknown option '%s'; see 'mixkv inspect --help'", arg);
            goto done;
        }
    }
    if (diff) {
        if (n_files != 2 || slot >= 0 || tp_base) {
            mkv_cli_error(CMD, "--diff takes two dump files (A B) and no --slot or --tp");
            goto done;
        }
        rc = mkv_inspect_diff(files[0], files[1], json, json_path);
    } else if (tp_base) {
        if (n_files != 0) {
            mkv_cli_error(CMD, "--tp names the whole set; give no other dump file ('%s')",
                          files[0]);
            goto done;
        }
        int n = 0;
        char **names = mkv_inspect_tp_files(tp_base, &n);
        if (!names) goto done;
        rc = mkv_inspect_tp((const char *const *)names, n, slot, json, json_path,
                            max_violations);
        for (int r = 0; r < n; r++) free(names[r]);
        free(names);
    } else if (n_files >= 2) {
        rc = mkv_inspect_tp(files, n_files, slot, json, json_path, max_violations);
    } else if (n_files == 1) {
        rc = inspect_one(files[0], slot, json, json_path, max_violations);
    } else {
        mkv_cli_error(CMD, "missing the dump file; see 'mixkv inspect --help'");
    }
done:
    free(files);
    return rc;
}
