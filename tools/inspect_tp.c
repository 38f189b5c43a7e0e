/*
 * inspect_tp.c — `mixkv inspect A.json B.json ...` and `mixkv inspect --tp X.json`: the cache
 * dumps of a tensor-parallel run, one per GPU, in rank order (docs/cli.md).
 *
 * Each GPU holds its own cache, with its own pages, for a contiguous share of the KV heads:
 * rank r's local head h is global head first_head[r] + h, where first_head[r] is the sum of
 * the earlier ranks' n_kv_heads (r * Hr when every rank holds Hr heads).
 *
 * Each dump is checked and reported exactly as a dump on its own (inspect.c). Then the set is
 * checked against rank 0: the same config except n_kv_heads and pool_pages (each GPU sizes
 * its pool from its own memory), and the same active slots with the same N (every rank of a
 * run sees the same tokens). Reservations may differ: they count pages, which scale with the
 * heads a rank holds. Last comes the total: pages, tokens and bytes summed over the ranks, in
 * all and per slot.
 */
#include "tools/cli.h"
#include "tools/inspect.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CMD "inspect"

/* ---------------------------------------------------------------------------------------- */
/* The files of --tp X.json                                                                 */
/* ---------------------------------------------------------------------------------------- */

static char *rank_file(const char *base, int rank)
{
    size_t stem = strlen(base);
    if (stem >= 5 && strcmp(base + stem - 5, ".json") == 0) stem -= 5;
    char *name = malloc(stem + 32);
    if (name) snprintf(name, stem + 32, "%.*s.rank%d.json", (int)stem, base, rank);
    return name;
}

char **mkv_inspect_tp_files(const char *base, int *n)
{
    char **names = NULL;
    int count = 0, cap = 0;
    for (;; count++) {
        char *name = rank_file(base, count);
        if (name && access(name, F_OK) != 0) {
            if (count == 0)
                mkv_cli_error(CMD, "--tp %s: %s does not exist (a tensor-parallel run writes "
                                   "X.rank0.json, X.rank1.json, ...)",
                              base, name);
            free(name);
            break;
        }
        if (name && count == cap) {
            char **p = realloc(names, (size_t)(cap = cap ? cap * 2 : 8) * sizeof *p);
            if (!p) {
                free(name);
                name = NULL;
            } else {
                names = p;
            }
        }
        if (!name) {
            mkv_cli_error(CMD, "out of memory");
            while (count > 0) free(names[--count]);
            break;
        }
        names[count] = name;
    }
    if (count == 0) {
        free(names);
        return NULL;
    }
    *n = count;
    return names;
}

/* ---------------------------------------------------------------------------------------- */
/* Mismatches between ranks                                                                 */
/* ---------------------------------------------------------------------------------------- */

typedef struct mismatch {
    const char *kind;  /* "config_mismatch", "slot_mismatch", "seq_len_mismatch" */
    const char *field; /* the config member, or NULL */
    int32_t slot;      /* -1: none */
    int rank_a, rank_b;
    char message[256];
} mismatch_t;

typedef struct tp_set {
    mkv_inspected_t *ranks; /* [n] */
    int64_t *first_head;    /* [n] global number of each rank's KV head 0 */
    int64_t n_heads;        /* over all ranks */
    int n;
    int32_t only_slot;      /* -1: all */

    mismatch_t *list;       /* [n_listed] */
    int64_t n_listed, cap, max, count;
    int oom;

    /* The total over the ranks. */
    mkv_usage_sum_t all;
    int64_t pool_pages, free_pages, reserved, available_pages, used_pages;
    mkv_usage_sum_t *slots; /* [n_slots] per slot id, ascending */
    int32_t *slot_ids;      /* [n_slots] */
    int64_t n_slots;
} tp_set_t;

static void mismatch(tp_set_t *t, const char *kind, const char *field, int32_t slot, int rank_b,
                     const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* One mismatch between rank 0 and rank_b: counted, and listed up to --max-violations. */
static void mismatch(tp_set_t *t, const char *kind, const char *field, int32_t slot, int rank_b,
                     const char *fmt, ...)
{
    t->count++;
    if (t->max > 0 && t->n_listed >= t->max) return;
    if (t->n_listed == t->cap) {
        int64_t cap = t->cap ? t->cap * 2 : 16;
        mismatch_t *p = realloc(t->list, (size_t)cap * sizeof *p);
        if (!p) {
            t->oom = 1;
            return;
        }
        t->list = p;
        t->cap = cap;
    }
    mismatch_t *m = &t->list[t->n_listed++];
    *m = (mismatch_t){kind, field, slot, 0, rank_b, ""};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->message, sizeof m->message, fmt, ap);
    va_end(ap);
}

static void check_configs(tp_set_t *t)
{
    const mkv_cache_config_t *c0 = &t->ranks[0].d.config;
    for (int r = 1; r < t->n; r++) {
        for (size_t i = 0; i < mkv_config_field_count; i++) {
            const mkv_config_field_t *f = &mkv_config_fields[i];
            if (strcmp(f->name, "n_kv_heads") == 0 || strcmp(f->name, "pool_pages") == 0)
                continue;
            char a[64], b[64];
            mkv_dump_config_field_text(c0, f, a, sizeof a);
            mkv_dump_config_field_text(&t->ranks[r].d.config, f, b, sizeof b);
            if (strcmp(a, b) != 0)
                mismatch(t, "config_mismatch", f->name, -1, r,
                         "config.%s differs: %s in rank 0, %s in rank %d", f->name, a, b, r);
        }
    }
}

/* Every active slot of every rank, sorted by (slot, rank, position in the dump). */
typedef struct slot_ref {
    int32_t slot, index;
    int rank;
} slot_ref_t;

static int cmp_ref(const void *x, const void *y)
{
    const slot_ref_t *a = x, *b = y;
    if (a->slot != b->slot) return (a->slot > b->slot) - (a->slot < b->slot);
    if (a->rank != b->rank) return (a->rank > b->rank) - (a->rank < b->rank);
    return (a->index > b->index) - (a->index < b->index);
}

/* One slot id, refs[0 .. n) (at least one): rank 0 against every other rank. A slot listed
 * twice in one rank is that rank's own violation; its first entry stands for the rank. */
static void check_slot(tp_set_t *t, const slot_ref_t *refs, int64_t n)
{
    const int32_t slot = refs[0].slot;
    const mkv_slot_view_t *s0 = refs[0].rank == 0 ? &t->ranks[0].d.slots[refs[0].index] : NULL;
    int64_t k = 0;
    for (int r = 1; r < t->n; r++) {
        while (k < n && refs[k].rank < r) k++;
        const mkv_slot_view_t *sr = k < n && refs[k].rank == r ? &t->ranks[r].d.slots[refs[k].index]
                                                                : NULL;
        if (s0 && !sr)
            mismatch(t, "slot_mismatch", NULL, slot, r,
                     "slot %d is active in rank 0 but not in rank %d", slot, r);
        else if (!s0 && sr)
            mismatch(t, "slot_mismatch", NULL, slot, r,
                     "slot %d is active in rank %d but not in rank 0", slot, r);
        else if (s0 && sr && s0->seq_len != sr->seq_len)
            mismatch(t, "seq_len_mismatch", NULL, slot, r,
                     "slot %d has N = %d in rank 0 but N = %d in rank %d", slot, s0->seq_len,
                     sr->seq_len, r);
    }
}

/* Checks the slots and sums them per slot id. Returns -1 when memory runs out. */
static int check_and_total_slots(tp_set_t *t)
{
    int64_t n_refs = 0;
    for (int r = 0; r < t->n; r++) n_refs += t->ranks[r].d.n_slots;
    const size_t cap = (size_t)(n_refs > 0 ? n_refs : 1);
    slot_ref_t *refs = malloc(cap * sizeof *refs);
    t->slots = calloc(cap, sizeof *t->slots);
    t->slot_ids = malloc(cap * sizeof *t->slot_ids);
    if (!refs || !t->slots || !t->slot_ids) {
        free(refs);
        return -1;
    }
    int64_t k = 0;
    for (int r = 0; r < t->n; r++)
        for (int32_t i = 0; i < t->ranks[r].d.n_slots; i++)
            refs[k++] = (slot_ref_t){t->ranks[r].d.slots[i].slot, i, r};
    qsort(refs, (size_t)n_refs, sizeof *refs, cmp_ref);
    for (int64_t i = 0, j; i < n_refs; i = j) {
        for (j = i; j < n_refs && refs[j].slot == refs[i].slot;) j++;
        check_slot(t, refs + i, j - i);
        mkv_usage_sum_t *u = &t->slots[t->n_slots];
        t->slot_ids[t->n_slots++] = refs[i].slot;
        u->seq_len = t->ranks[refs[i].rank].d.slots[refs[i].index].seq_len;
        for (int64_t m = i; m < j; m++)
            mkv_usage_add(u, &t->ranks[refs[m].rank].s.slots[refs[m].index]);
    }
    free(refs);
    return 0;
}

static void total_pool(tp_set_t *t)
{
    for (int r = 0; r < t->n; r++) {
        const mkv_inspected_t *in = &t->ranks[r];
        mkv_usage_add(&t->all, &in->s.all);
        t->pool_pages = mkv_sat_add(t->pool_pages, in->d.g.pool_pages);
        t->free_pages = mkv_sat_add(t->free_pages, in->s.free_pages);
        t->reserved = mkv_sat_add(t->reserved, in->d.reserved_total);
        t->available_pages = mkv_sat_add(t->available_pages, in->s.available_pages);
        t->used_pages = mkv_sat_add(t->used_pages, in->s.used_pages);
    }
}

static int64_t rank_violations(const mkv_inspected_t *in) { return in->c.count + in->c.elsewhere; }

static int ranks_ok(const tp_set_t *t)
{
    for (int r = 0; r < t->n; r++)
        if (rank_violations(&t->ranks[r]) > 0) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Output                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static void print_set(const tp_set_t *t)
{
    for (int r = 0; r < t->n; r++) {
        const mkv_inspected_t *in = &t->ranks[r];
        /* The checker's sentences name local heads; the heading gives the translation. */
        printf("%s== rank %d of %d: KV heads %" PRId64 " to %" PRId64 " globally (local 0 to %d) "
               "==\n",
               r ? "\n" : "", r, t->n, t->first_head[r],
               t->first_head[r] + in->d.config.n_kv_heads - 1, in->d.config.n_kv_heads - 1);
        mkv_inspect_print_report(in, t->only_slot, t->first_head[r]);
    }
    printf("\n== tensor-parallel set: %d rank%s, %" PRId64 " KV heads, summed over the ranks ==\n",
           t->n, t->n == 1 ? "" : "s", t->n_heads);
    printf("pool: %" PRId64 " pages: %" PRId64 " free, %" PRId64 " reserved, %" PRId64
           " available, %" PRId64 " in use\n",
           t->pool_pages, t->free_pages, t->reserved, t->available_pages, t->used_pages);
    mkv_inspect_print_usage(&t->all);
    printf("slots: %" PRId64 " active\n\n", t->n_slots);
    mkv_inspect_print_slot_header();
    for (int64_t i = 0; i < t->n_slots; i++)
        if (t->only_slot < 0 || t->slot_ids[i] == t->only_slot)
            mkv_inspect_print_slot_line(t->slot_ids[i], &t->slots[i]);
    putchar('\n');

    if (ranks_ok(t)) {
        printf("ranks: every invariant holds in every rank\n");
    } else {
        fputs("ranks: violations in", stdout);
        for (int r = 0, sep = 0; r < t->n; r++) {
            const int64_t v = rank_violations(&t->ranks[r]);
            if (v > 0) printf("%s rank %d (%" PRId64 ")", sep++ ? "," : "", r, v);
        }
        fputs(", listed above\n", stdout);
    }
    if (t->count == 0) {
        printf("set: consistent: the same config except n_kv_heads and pool_pages, the same "
               "active slots with the same N\n");
        return;
    }
    printf("set: %" PRId64 " mismatch%s between ranks\n", t->count, t->count == 1 ? "" : "es");
    for (int64_t i = 0; i < t->n_listed; i++)
        printf("  [%s] %s\n", t->list[i].kind, t->list[i].message);
    if (t->n_listed < t->count)
        printf("  ... and %" PRId64 " more (--max-violations 0 lists all)\n",
               t->count - t->n_listed);
}

static cJSON *set_json(const tp_set_t *t)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *ranks = cJSON_AddArrayToObject(root, "ranks");
    for (int r = 0; r < t->n; r++) {
        cJSON *o = mkv_inspect_report_json(&t->ranks[r], t->only_slot, t->first_head[r]);
        cJSON_AddNumberToObject(o, "rank", r);
        mkv_cli_json_add_i64(o, "first_head", t->first_head[r]);
        cJSON_AddItemToArray(ranks, o);
    }
    cJSON *total = mkv_inspect_usage_json(&t->all, -1);
    cJSON_AddNumberToObject(total, "ranks", t->n);
    mkv_cli_json_add_i64(total, "n_kv_heads", t->n_heads);
    mkv_cli_json_add_i64(total, "total_pages", t->pool_pages);
    mkv_cli_json_add_i64(total, "free_pages", t->free_pages);
    mkv_cli_json_add_i64(total, "available_pages", t->available_pages);
    mkv_cli_json_add_i64(total, "used_pages", t->used_pages);
    mkv_cli_json_add_i64(total, "active_slots", t->n_slots);
    cJSON *slots = cJSON_AddArrayToObject(total, "slots");
    for (int64_t i = 0; i < t->n_slots; i++)
        if (t->only_slot < 0 || t->slot_ids[i] == t->only_slot)
            cJSON_AddItemToArray(slots, mkv_inspect_usage_json(&t->slots[i], t->slot_ids[i]));
    cJSON_AddItemToObject(root, "total", total);

    cJSON_AddBoolToObject(root, "consistent", ranks_ok(t) && t->count == 0);
    cJSON_AddBoolToObject(root, "ranks_ok", ranks_ok(t));
    cJSON_AddBoolToObject(root, "ranks_agree", t->count == 0);
    mkv_cli_json_add_i64(root, "violation_count", t->count);
    cJSON_AddBoolToObject(root, "truncated", t->n_listed < t->count);
    cJSON *list = cJSON_AddArrayToObject(root, "violations");
    for (int64_t i = 0; i < t->n_listed; i++) {
        const mismatch_t *m = &t->list[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kind", m->kind);
        cJSON *pair = cJSON_AddArrayToObject(o, "ranks");
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(m->rank_a));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(m->rank_b));
        cJSON_AddItemToObject(o, "slot", m->slot >= 0 ? cJSON_CreateNumber(m->slot)
                                                      : cJSON_CreateNull());
        cJSON_AddItemToObject(o, "field", m->field ? cJSON_CreateString(m->field)
                                                   : cJSON_CreateNull());
        cJSON_AddStringToObject(o, "message", m->message);
        cJSON_AddItemToArray(list, o);
    }
    return root;
}

/* ---------------------------------------------------------------------------------------- */
/* Entry point                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* --slot N must lie within rank 0's slots and be active in some rank (a slot active in some
 * ranks only is a mismatch, reported with the rest). */
static int check_slot_option(const tp_set_t *t)
{
    const int32_t slot = t->only_slot;
    if (slot < 0) return 0;
    if (slot >= t->ranks[0].d.g.max_seqs) {
        mkv_cli_error(CMD, "--slot %d is outside [0, %d) in %s", slot, t->ranks[0].d.g.max_seqs,
                      t->ranks[0].path);
        return -1;
    }
    for (int r = 0; r < t->n; r++)
        if (mkv_inspect_slot_active(&t->ranks[r].d, slot)) return 0;
    mkv_cli_error(CMD, "slot %d is not active in any rank", slot);
    return -1;
}

int mkv_inspect_tp(const char *const *paths, int n, int32_t only_slot, int json,
                   const char *json_path, int64_t max_violations)
{
    tp_set_t t = {0};
    t.n = n;
    t.only_slot = only_slot;
    t.max = max_violations;
    t.ranks = calloc((size_t)n, sizeof *t.ranks);
    t.first_head = calloc((size_t)n, sizeof *t.first_head);
    int rc = t.ranks && t.first_head ? MKV_EXIT_OK : MKV_EXIT_USAGE;
    if (rc != MKV_EXIT_OK) mkv_cli_error(CMD, "out of memory");
    for (int r = 0; r < n && rc == MKV_EXIT_OK; r++) {
        rc = mkv_inspect_read(paths[r], only_slot, max_violations, &t.ranks[r]);
        if (rc != MKV_EXIT_OK) {
            mkv_cli_error(CMD, "rank %d of the tensor-parallel set cannot be read", r);
            break;
        }
        t.first_head[r] = t.n_heads;
        t.n_heads += t.ranks[r].d.config.n_kv_heads;
    }
    if (rc == MKV_EXIT_OK && check_slot_option(&t) != 0) rc = MKV_EXIT_USAGE;
    if (rc == MKV_EXIT_OK) {
        check_configs(&t);
        if (check_and_total_slots(&t) != 0 || t.oom) {
            mkv_cli_error(CMD, "out of memory");
            rc = MKV_EXIT_USAGE;
        }
        total_pool(&t);
    }
    if (rc == MKV_EXIT_OK) {
        if (!json || json_path) print_set(&t);
        if (json) {
            cJSON *root = set_json(&t);
            if (mkv_cli_write_json(CMD, root, json_path) != 0) rc = MKV_EXIT_USAGE;
            cJSON_Delete(root);
        }
    }
    if (rc == MKV_EXIT_OK) {
        for (int r = 0; r < n; r++) {
            const int64_t v = rank_violations(&t.ranks[r]);
            if (v > 0) {
                mkv_cli_error(CMD, "rank %d (%s): %" PRId64 " invariant violation%s", r, paths[r],
                              v, v == 1 ? "" : "s");
                rc = MKV_EXIT_FAIL;
            }
        }
        if (t.count > 0) {
            mkv_cli_error(CMD, "the ranks disagree: %" PRId64 " mismatch%s, first: %s", t.count,
                          t.count == 1 ? "" : "es", t.list ? t.list[0].message : "?");
            rc = MKV_EXIT_FAIL;
        }
    }
    for (int r = 0; t.ranks && r < n; r++) mkv_inspect_release(&t.ranks[r]);
    free(t.ranks);
    free(t.first_head);
    free(t.list);
    free(t.slots);
    free(t.slot_ids);
    return rc;
}
