/*
 * inspect_diff.c — `mixkv inspect --diff A B`: what changed from one cache dump to another.
 *
 * Compared: the config field by field, the ring counters and which pages left or joined the
 * free list, the reservation total, slots (admitted, released, N or reservation changed) and
 * rows keyed by (slot, layer, head) (added, removed, or changed counts and page ids per
 * section). Page ids are compared as multisets per section, with a separate note when only
 * their order changed. Like diff(1): exit 0 when identical, 1 when different, 2 on bad input.
 */
#include "common/error.h"
#include "memmgr/dump.h"
#include "tools/cli.h"
#include "tools/inspect.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define CMD          "inspect"
#define TEXT_IDS_MAX 32 /* page ids printed per list in text output; JSON lists all */

/* ---------------------------------------------------------------------------------------- */
/* Config fields (the members of a dump's "config", in its order)                           */
/* ---------------------------------------------------------------------------------------- */

/* A member's value as JSON, from the shared writer (so --diff prints what the dump holds). */
static cJSON *field_json(const mkv_cache_config_t *c, const mkv_config_field_t *f)
{
    cJSON *all = mkv_dump_config_json(c);
    cJSON *v = all ? cJSON_DetachItemFromObjectCaseSensitive(all, f->name) : NULL;
    cJSON_Delete(all);
    return v ? v : cJSON_CreateNull();
}

/* ---------------------------------------------------------------------------------------- */
/* Multiset differences of page-id lists                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct id_diff {
    int32_t *added;   /* in b, not in a */
    int32_t *removed; /* in a, not in b */
    int64_t n_added, n_removed;
    int reordered; /* same multiset, different order */
} id_diff_t;

static int cmp_i32(const void *x, const void *y)
{
    const int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

static int32_t *sorted_copy(const int32_t *ids, int64_t n)
{
    int32_t *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p) return NULL;
    if (n > 0) memcpy(p, ids, (size_t)n * sizeof *p);
    qsort(p, (size_t)n, sizeof *p, cmp_i32);
    return p;
}

/* Returns -1 when memory runs out. */
static int id_diff(const int32_t *a, int64_t na, const int32_t *b, int64_t nb, id_diff_t *out)
{
    memset(out, 0, sizeof *out);
    int32_t *sa = sorted_copy(a, na), *sb = sorted_copy(b, nb);
    out->added = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(int32_t));
    out->removed = malloc((size_t)(na > 0 ? na : 1) * sizeof(int32_t));
    if (!sa || !sb || !out->added || !out->removed) {
        free(sa);
        free(sb);
        free(out->added);
        free(out->removed);
        memset(out, 0, sizeof *out);
        return -1;
    }
    int64_t i = 0, j = 0;
    while (i < na || j < nb) {
        if (j == nb || (i < na && sa[i] < sb[j]))
            out->removed[out->n_removed++] = sa[i++];
        else if (i == na || sb[j] < sa[i])
            out->added[out->n_added++] = sb[j++];
        else
            i++, j++;
    }
    out->reordered = out->n_added == 0 && out->n_removed == 0 && na == nb && na > 0 &&
                     memcmp(a, b, (size_t)na * sizeof *a) != 0;
    free(sa);
    free(sb);
    return 0;
}

static void id_diff_free(id_diff_t *d)
{
    free(d->added);
    free(d->removed);
}

static int id_diff_any(const id_diff_t *d) { return d->n_added || d->n_removed || d->reordered; }

/* ---------------------------------------------------------------------------------------- */
/* Reporting differences                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct differ {
    const char *path_a, *path_b;
    int text;        /* print text lines on stdout */
    int64_t changes; /* differences found */
    cJSON *root;     /* the JSON result */
} differ_t;

static void change(differ_t *df, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* One difference: counted, and printed as a text line (after a diff(1)-style header). */
static void change(differ_t *df, const char *fmt, ...)
{
    if (df->changes++ == 0 && df->text) printf("--- %s\n+++ %s\n", df->path_a, df->path_b);
    if (!df->text) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

static void print_ids(const char *label, const int32_t *ids, int64_t n)
{
    printf("%s[", label);
    for (int64_t i = 0; i < n && i < TEXT_IDS_MAX; i++) printf(i ? ", %d" : "%d", ids[i]);
    if (n > TEXT_IDS_MAX) printf(", ... %" PRId64 " more", n - TEXT_IDS_MAX);
    putchar(']');
}

/* Prints "<sep>what a -> b (+d)" when a != b; sep becomes ", " after the first part. */
static void print_change(const char **sep, const char *what, int64_t a, int64_t b)
{
    if (a == b) return;
    printf("%s%s %" PRId64 " -> %" PRId64 " (%+" PRId64 ")", *sep, what, a, b, b - a);
    *sep = ", ";
}

static void print_section_diff(const char **sep, const char *name, const id_diff_t *d)
{
    if (d->n_added) {
        printf("%s%s pages added ", *sep, name);
        print_ids("", d->added, d->n_added);
        *sep = "; ";
    }
    if (d->n_removed) {
        printf("%s%s pages removed ", *sep, name);
        print_ids("", d->removed, d->n_removed);
        *sep = "; ";
    }
    if (d->reordered) {
        printf("%s%s pages reordered", *sep, name);
        *sep = "; ";
    }
}

/* {"a": a or null, "b": b or null, "delta": b - a or null} */
static cJSON *delta_json(int has_a, int64_t a, int has_b, int64_t b)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "a", has_a ? mkv_cli_json_i64(a) : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "b", has_b ? mkv_cli_json_i64(b) : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "delta",
                          has_a && has_b ? mkv_cli_json_i64(b - a) : cJSON_CreateNull());
    return o;
}

/* ---------------------------------------------------------------------------------------- */
/* The comparisons                                                                          */
/* ---------------------------------------------------------------------------------------- */

static void diff_config(differ_t *df, const mkv_dump_t *a, const mkv_dump_t *b)
{
    cJSON *list = cJSON_AddArrayToObject(df->root, "config");
    for (size_t i = 0; i < mkv_config_field_count; i++) {
        char ta[64], tb[64];
        mkv_dump_config_field_text(&a->config, &mkv_config_fields[i], ta, sizeof ta);
        mkv_dump_config_field_text(&b->config, &mkv_config_fields[i], tb, sizeof tb);
        if (strcmp(ta, tb) == 0) continue;
        change(df, "config.%s: %s -> %s\n", mkv_config_fields[i].name, ta, tb);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "field", mkv_config_fields[i].name);
        cJSON_AddItemToObject(o, "a", field_json(&a->config, &mkv_config_fields[i]));
        cJSON_AddItemToObject(o, "b", field_json(&b->config, &mkv_config_fields[i]));
        cJSON_AddItemToArray(list, o);
    }
}

static int diff_ring(differ_t *df, const mkv_dump_t *a, const mkv_dump_t *b)
{
    const int64_t fa = a->tail - a->head, fb = b->tail - b->head;
    cJSON *ring = cJSON_AddObjectToObject(df->root, "ring");
    cJSON_AddItemToObject(ring, "head", delta_json(1, a->head, 1, b->head));
    cJSON_AddItemToObject(ring, "tail", delta_json(1, a->tail, 1, b->tail));
    cJSON_AddItemToObject(ring, "free_pages", delta_json(1, fa, 1, fb));
    if (a->head != b->head || a->tail != b->tail) {
        change(df, "ring: ");
        if (df->text) {
            const char *sep = "";
            print_change(&sep, "head", a->head, b->head);
            print_change(&sep, "tail", a->tail, b->tail);
            print_change(&sep, "free", fa, fb);
            putchar('\n');
        }
    }
    id_diff_t d;
    if (id_diff(a->free_ids, a->n_free_ids, b->free_ids, b->n_free_ids, &d) != 0) return -1;
    /* removed from the list = allocated; added to it = recycled */
    cJSON_AddItemToObject(ring, "left_free_list", mkv_cli_json_ids(d.removed, d.n_removed));
    cJSON_AddItemToObject(ring, "joined_free_list", mkv_cli_json_ids(d.added, d.n_added));
    cJSON_AddBoolToObject(ring, "order_changed", d.reordered);
    if (d.n_removed || d.n_added) {
        change(df, "ring:");
        if (df->text) {
            if (d.n_removed) {
                printf(" %" PRId64 " page%s left the free list ", d.n_removed,
                       d.n_removed == 1 ? "" : "s");
                print_ids("", d.removed, d.n_removed);
            }
            if (d.n_added) {
                printf("%s %" PRId64 " page%s joined it ", d.n_removed ? ";" : "", d.n_added,
                       d.n_added == 1 ? "" : "s");
                print_ids("", d.added, d.n_added);
            }
            putchar('\n');
        }
    } else if (d.reordered) {
        change(df, "ring: the same free pages in a different order\n");
    }
    id_diff_free(&d);

    cJSON_AddItemToObject(df->root, "reserved_pages",
                          delta_json(1, a->reserved_total, 1, b->reserved_total));
    if (a->reserved_total != b->reserved_total)
        change(df, "reserved_pages: %" PRId64 " -> %" PRId64 " (%+" PRId64 ")\n", a->reserved_total,
               b->reserved_total, b->reserved_total - a->reserved_total);
    return 0;
}

static int cmp_slot(const void *x, const void *y)
{
    const mkv_slot_view_t *a = *(const mkv_slot_view_t *const *)x,
                          *b = *(const mkv_slot_view_t *const *)y;
    if (a->slot != b->slot) return (a->slot > b->slot) - (a->slot < b->slot);
    return (a > b) - (a < b);
}

static const mkv_slot_view_t **sorted_slots(const mkv_dump_t *d)
{
    const mkv_slot_view_t **p = malloc((size_t)(d->n_slots > 0 ? d->n_slots : 1) * sizeof *p);
    if (!p) return NULL;
    for (int32_t i = 0; i < d->n_slots; i++) p[i] = &d->slots[i];
    qsort(p, (size_t)d->n_slots, sizeof *p, cmp_slot);
    return p;
}

static int diff_slots(differ_t *df, const mkv_dump_t *a, const mkv_dump_t *b)
{
    const mkv_slot_view_t **sa = sorted_slots(a), **sb = sorted_slots(b);
    if (!sa || !sb) {
        free(sa);
        free(sb);
        return -1;
    }
    cJSON *list = cJSON_AddArrayToObject(df->root, "slots");
    int32_t i = 0, j = 0;
    while (i < a->n_slots || j < b->n_slots) {
        const mkv_slot_view_t *x = i < a->n_slots ? sa[i] : NULL,
                              *y = j < b->n_slots ? sb[j] : NULL;
        if (x && y && x->slot != y->slot) {
            if (x->slot < y->slot)
                y = NULL;
            else
                x = NULL;
        }
        i += x != NULL;
        j += y != NULL;
        const char *kind = !y ? "released" : !x ? "admitted" : "changed";
        if (x && y && x->seq_len == y->seq_len && x->reserved == y->reserved) continue;
        const int32_t slot = x ? x->slot : y->slot;
        if (!x)
            change(df, "slot %d: admitted (N %d, reserved %" PRId64 ")\n", slot, y->seq_len,
                   y->reserved);
        else if (!y)
            change(df, "slot %d: released (was N %d, reserved %" PRId64 ")\n", slot, x->seq_len,
                   x->reserved);
        else {
            change(df, "slot %d: ", slot);
            if (df->text) {
                const char *sep = "";
                print_change(&sep, "N", x->seq_len, y->seq_len);
                print_change(&sep, "reserved", x->reserved, y->reserved);
                putchar('\n');
            }
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "slot", slot);
        cJSON_AddStringToObject(o, "change", kind);
        cJSON_AddItemToObject(
            o, "seq_len", delta_json(x != NULL, x ? x->seq_len : 0, y != NULL, y ? y->seq_len : 0));
        cJSON_AddItemToObject(
            o, "reserved_pages",
            delta_json(x != NULL, x ? x->reserved : 0, y != NULL, y ? y->reserved : 0));
        cJSON_AddItemToArray(list, o);
    }
    free(sa);
    free(sb);
    return 0;
}

static int cmp_row_key(const mkv_row_view_t *a, const mkv_row_view_t *b)
{
    if (a->slot != b->slot) return (a->slot > b->slot) - (a->slot < b->slot);
    if (a->layer != b->layer) return (a->layer > b->layer) - (a->layer < b->layer);
    return (a->head > b->head) - (a->head < b->head);
}

static int cmp_row(const void *x, const void *y)
{
    const mkv_row_view_t *a = *(const mkv_row_view_t *const *)x,
                         *b = *(const mkv_row_view_t *const *)y;
    const int c = cmp_row_key(a, b);
    return c ? c : (a > b) - (a < b); /* file order among duplicates */
}

static const mkv_row_view_t **sorted_rows(const mkv_dump_t *d)
{
    const mkv_row_view_t **p = malloc((size_t)(d->n_rows > 0 ? d->n_rows : 1) * sizeof *p);
    if (!p) return NULL;
    for (int64_t i = 0; i < d->n_rows; i++) p[i] = &d->rows[i];
    qsort(p, (size_t)d->n_rows, sizeof *p, cmp_row);
    return p;
}

/* One row present in a, b or both (NULL where absent). Returns -1 when memory runs out. */
static int diff_row(differ_t *df, cJSON *list, const mkv_row_view_t *x, const mkv_row_view_t *y)
{
    static const int32_t none[1] = {0};
    id_diff_t dh, dl;
    if (id_diff(x ? x->hi : none, x ? x->k_hi : 0, y ? y->hi : none, y ? y->k_hi : 0, &dh) != 0)
        return -1;
    if (id_diff(x ? x->lo : none, x ? x->k_lo : 0, y ? y->lo : none, y ? y->k_lo : 0, &dl) != 0) {
        id_diff_free(&dh);
        return -1;
    }
    const int same = x && y && x->n_hi == y->n_hi && x->n_lo == y->n_lo && !id_diff_any(&dh) &&
                     !id_diff_any(&dl);
    if (!same) {
        const mkv_row_view_t *r = x ? x : y;
        const char *kind = !y ? "removed" : !x ? "added" : "changed";
        change(df, "row (slot %d, layer %d, head %d): ", r->slot, r->layer, r->head);
        if (df->text) {
            if (!x || !y) {
                printf("%s: n_hi %d, n_lo %d, hi ", kind, r->n_hi, r->n_lo);
                print_ids("", r->hi, r->k_hi);
                print_ids(", lo ", r->lo, r->k_lo);
            } else {
                const char *sep = "";
                print_change(&sep, "n_hi", x->n_hi, y->n_hi);
                print_change(&sep, "n_lo", x->n_lo, y->n_lo);
                if (*sep) sep = "; ";
                print_section_diff(&sep, "hi", &dh);
                print_section_diff(&sep, "lo", &dl);
            }
            putchar('\n');
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "slot", r->slot);
        cJSON_AddNumberToObject(o, "layer", r->layer);
        cJSON_AddNumberToObject(o, "head", r->head);
        cJSON_AddStringToObject(o, "change", kind);
        cJSON_AddItemToObject(o, "n_hi",
                              delta_json(x != NULL, x ? x->n_hi : 0, y != NULL, y ? y->n_hi : 0));
        cJSON_AddItemToObject(o, "n_lo",
                              delta_json(x != NULL, x ? x->n_lo : 0, y != NULL, y ? y->n_lo : 0));
        cJSON_AddItemToObject(o, "hi_added", mkv_cli_json_ids(dh.added, dh.n_added));
        cJSON_AddItemToObject(o, "hi_removed", mkv_cli_json_ids(dh.removed, dh.n_removed));
        cJSON_AddItemToObject(o, "lo_added", mkv_cli_json_ids(dl.added, dl.n_added));
        cJSON_AddItemToObject(o, "lo_removed", mkv_cli_json_ids(dl.removed, dl.n_removed));
        cJSON_AddBoolToObject(o, "hi_reordered", dh.reordered);
        cJSON_AddBoolToObject(o, "lo_reordered", dl.reordered);
        cJSON_AddItemToArray(list, o);
    }
    id_diff_free(&dh);
    id_diff_free(&dl);
    return 0;
}

static int diff_rows(differ_t *df, const mkv_dump_t *a, const mkv_dump_t *b)
{
    const mkv_row_view_t **ra = sorted_rows(a), **rb = sorted_rows(b);
    int rc = ra && rb ? 0 : -1;
    cJSON *list = cJSON_AddArrayToObject(df->root, "rows");
    int64_t i = 0, j = 0;
    while (rc == 0 && (i < a->n_rows || j < b->n_rows)) {
        const mkv_row_view_t *x = i < a->n_rows ? ra[i] : NULL, *y = j < b->n_rows ? rb[j] : NULL;
        if (x && y) {
            const int c = cmp_row_key(x, y);
            if (c < 0)
                y = NULL;
            else if (c > 0)
                x = NULL;
        }
        i += x != NULL;
        j += y != NULL;
        rc = diff_row(df, list, x, y);
    }
    free(ra);
    free(rb);
    return rc;
}

int mkv_inspect_diff(const char *path_a, const char *path_b, int json, const char *json_path)
{
    char err[MKV_ERR_LEN];
    mkv_dump_t a, b;
    memset(&b, 0, sizeof b);
    if (mkv_dump_read_file(path_a, &a, err) != MKV_STATUS_OK ||
        mkv_dump_read_file(path_b, &b, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        mkv_dump_free(&a);
        mkv_dump_free(&b);
        return MKV_EXIT_USAGE;
    }
    differ_t df = {path_a, path_b, !json || json_path != NULL, 0, cJSON_CreateObject()};
    cJSON_AddStringToObject(df.root, "a", path_a);
    cJSON_AddStringToObject(df.root, "b", path_b);
    diff_config(&df, &a, &b);
    int rc =
        diff_ring(&df, &a, &b) == 0 && diff_slots(&df, &a, &b) == 0 && diff_rows(&df, &a, &b) == 0
            ? (df.changes ? MKV_EXIT_FAIL : MKV_EXIT_OK)
            : MKV_EXIT_USAGE;
    if (rc == MKV_EXIT_USAGE)
        mkv_cli_error(CMD, "out of memory comparing %s and %s", path_a, path_b);
    if (rc != MKV_EXIT_USAGE && json) {
        cJSON_AddBoolToObject(df.root, "identical", df.changes == 0);
        mkv_cli_json_add_i64(df.root, "change_count", df.changes);
        if (mkv_cli_write_json(CMD, df.root, json_path) != 0) rc = MKV_EXIT_USAGE;
    }
    cJSON_Delete(df.root);
    mkv_dump_free(&a);
    mkv_dump_free(&b);
    return rc;
}
