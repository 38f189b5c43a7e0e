/*
 * check.c — the invariants of DESIGN.md section 4, checked over a view of the state.
 *
 * One checker serves both the live cache (mkv_cache_validate) and dumps read from files
 * (`mixkv inspect`), so a violation reads the same wherever it is found. Every page id must be
 * in exactly one place: the free region of the ring or one table row. Each row must list
 * ceil(n_hi / tpp_hi) high pages and ceil(n_lo / tpp_lo) low pages, together at most T, with
 * n_hi + n_lo <= N <= max_seq_len. Reservations must sum to their total and be covered by
 * the free pages. Violations are reported in a fixed order: counters, free list, slots, rows,
 * then pages that are nowhere.
 */
#include "memmgr/state.h"

#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_kind_names[MKV_VIOL_KIND_COUNT] = {
    [MKV_VIOL_COUNTERS] = "counters",
    [MKV_VIOL_FREE_LIST] = "free_list",
    [MKV_VIOL_PAGE_RANGE] = "page_out_of_range",
    [MKV_VIOL_PAGE_DUPLICATE] = "page_duplicated",
    [MKV_VIOL_PAGE_MISSING] = "page_missing",
    [MKV_VIOL_ROW_COUNT] = "row_page_count",
    [MKV_VIOL_ROW_OVERFLOW] = "row_overflow",
    [MKV_VIOL_ROW_LOCATION] = "row_location",
    [MKV_VIOL_TOKENS] = "token_counts",
    [MKV_VIOL_RESERVATION] = "reservation",
    [MKV_VIOL_STALE_ENTRY] = "stale_table_entry",
};

const char *mkv_violation_kind_name(mkv_violation_kind_t kind)
{
    if ((int)kind < 0 || kind >= MKV_VIOL_KIND_COUNT) return "unknown";
    return g_kind_names[kind];
}

/* Where a page was first seen. */
enum { OWNER_NONE = 0, OWNER_FREE = 1, OWNER_ROW = 2 };
typedef struct owner {
    int8_t kind;
    int8_t section; /* 0 hi, 1 lo */
    int32_t k;      /* index in the section, or offset from head in the free list */
    int64_t row;    /* index into view->rows */
} owner_t;

typedef struct checker {
    const mkv_state_view_t *v;
    mkv_violation_fn report;
    void *ctx;
    int64_t count;
} checker_t;

static void emit(checker_t *c, mkv_violation_kind_t kind, int32_t page, const mkv_row_view_t *row,
                 const mkv_row_view_t *other, int other_free, const char *fmt, ...)
    MKV_PRINTF(7, 8);

static void emit(checker_t *c, mkv_violation_kind_t kind, int32_t page, const mkv_row_view_t *row,
                 const mkv_row_view_t *other, int other_free, const char *fmt, ...)
{
    c->count++;
    if (!c->report) return;
    mkv_violation_t v;
    memset(&v, 0, sizeof v);
    v.kind = kind;
    v.page = page;
    v.slot = row ? row->slot : -1;
    v.layer = row ? row->layer : -1;
    v.head = row ? row->head : -1;
    v.other_slot = other ? other->slot : (other_free ? -2 : -1);
    v.other_layer = other ? other->layer : -1;
    v.other_head = other ? other->head : -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v.message, sizeof v.message, fmt, ap);
    va_end(ap);
    c->report(c->ctx, &v);
}

#define ROWF "row (slot %d, layer %d, head %d)"
#define ROWA(r) (r)->slot, (r)->layer, (r)->head

static const char *sec_name(int section) { return section ? "lo" : "hi"; }

/* Claims `page` for a place; reports range errors and duplicates. */
static void claim(checker_t *c, owner_t *own, int32_t page, int8_t kind, int section, int32_t k,
                  int64_t row_index)
{
    const mkv_state_view_t *v = c->v;
    const mkv_row_view_t *row = kind == OWNER_ROW ? &v->rows[row_index] : NULL;
    if (page < 0 || page >= v->g.pool_pages) {
        if (row)
            emit(c, MKV_VIOL_PAGE_RANGE, page, row, NULL, 0,
                 ROWF " %s[%d] holds page id %d outside [0, %lld)", ROWA(row), sec_name(section), k,
                 page, (long long)v->g.pool_pages);
        else
            emit(c, MKV_VIOL_PAGE_RANGE, page, NULL, NULL, 0,
                 "free list position head+%d holds page id %d outside [0, %lld)", k, page,
                 (long long)v->g.pool_pages);
        return;
    }
    owner_t *o = &own[page];
    if (o->kind == OWNER_NONE) {
        o->kind = kind;
        o->section = (int8_t)section;
        o->k = k;
        o->row = row_index;
        return;
    }
    char first[128], second[128];
    const mkv_row_view_t *orow = o->kind == OWNER_ROW ? &v->rows[o->row] : NULL;
    if (orow)
        snprintf(first, sizeof first, ROWF " %s[%d]", ROWA(orow), sec_name(o->section), o->k);
    else
        snprintf(first, sizeof first, "the free list at head+%d", o->k);
    if (row)
        snprintf(second, sizeof second, ROWF " %s[%d]", ROWA(row), sec_name(section), k);
    else
        snprintf(second, sizeof second, "the free list at head+%d", k);
    emit(c, MKV_VIOL_PAGE_DUPLICATE, page, row ? row : orow, row ? orow : NULL,
         row ? o->kind == OWNER_FREE : 0, "page %d is in two places: %s and %s", page, first, second);
}

int64_t mkv_state_check(const mkv_state_view_t *v, mkv_violation_fn report, void *ctx)
{
    checker_t c = {v, report, ctx, 0};
    const mkv_mm_geom_t *g = &v->g;
    const int64_t P = g->pool_pages;
    const int64_t regions = mkv_mm_regions(g);
    owner_t *own = calloc((size_t)(P > 0 ? P : 1), sizeof *own);
    int32_t *slot_len = malloc((size_t)g->max_seqs * sizeof *slot_len); /* -1: not active */
    uint8_t *region_seen = calloc((size_t)(regions > 0 ? regions : 1), 1);
    if (!own || !slot_len || !region_seen) {
        free(own);
        free(slot_len);
        free(region_seen);
        return -1;
    }
    for (int32_t s = 0; s < g->max_seqs; s++) slot_len[s] = -1;

    /* Counters and the free list. */
    const int64_t free_count = v->tail - v->head;
    if (v->head < 0 || free_count < 0 || free_count > P)
        emit(&c, MKV_VIOL_COUNTERS, -1, NULL, NULL, 0,
             "ring counters head %lld and tail %lld give %lld free pages, outside [0, %lld]",
             (long long)v->head, (long long)v->tail, (long long)free_count, (long long)P);
    if (v->n_free_ids != free_count)
        emit(&c, MKV_VIOL_FREE_LIST, -1, NULL, NULL, 0,
             "the free list holds %lld page ids but tail - head = %lld", (long long)v->n_free_ids,
             (long long)free_count);
    for (int64_t i = 0; i < v->n_free_ids; i++)
        claim(&c, own, v->free_ids[i], OWNER_FREE, 0, (int32_t)i, -1);

    /* Slots and reservations. */
    int64_t reserved_sum = 0;
    for (int32_t i = 0; i < v->n_slots; i++) {
        const mkv_slot_view_t *sv = &v->slots[i];
        if (sv->slot < 0 || sv->slot >= g->max_seqs) {
            emit(&c, MKV_VIOL_ROW_LOCATION, -1, NULL, NULL, 0,
                 "active slot %d is outside [0, %d)", sv->slot, g->max_seqs);
            continue;
        }
        if (slot_len[sv->slot] >= 0)
            emit(&c, MKV_VIOL_ROW_LOCATION, -1, NULL, NULL, 0, "slot %d is listed twice", sv->slot);
        if (sv->seq_len < 0 || sv->seq_len > g->max_seq_len)
            emit(&c, MKV_VIOL_TOKENS, -1, NULL, NULL, 0, "slot %d has N = %d outside [0, %d]",
                 sv->slot, sv->seq_len, g->max_seq_len);
        if (sv->reserved < 0)
            emit(&c, MKV_VIOL_RESERVATION, -1, NULL, NULL, 0, "slot %d reserves %lld pages (< 0)",
                 sv->slot, (long long)sv->reserved);
        slot_len[sv->slot] = sv->seq_len < 0 ? 0 : sv->seq_len;
        reserved_sum += sv->reserved;
    }
    if (reserved_sum != v->reserved_total)
        emit(&c, MKV_VIOL_RESERVATION, -1, NULL, NULL, 0,
             "slot reservations sum to %lld pages but the total says %lld", (long long)reserved_sum,
             (long long)v->reserved_total);
    if (v->reserved_total > free_count)
        emit(&c, MKV_VIOL_RESERVATION, -1, NULL, NULL, 0,
             "%lld pages are reserved but only %lld are free", (long long)v->reserved_total,
             (long long)free_count);

    /* Rows. */
    for (int64_t r = 0; r < v->n_rows; r++) {
        const mkv_row_view_t *row = &v->rows[r];
        const int located = row->slot >= 0 && row->slot < g->max_seqs && row->layer >= 0 &&
                            row->layer < g->n_layers && row->head >= 0 && row->head < g->n_kv_heads;
        if (!located) {
            emit(&c, MKV_VIOL_ROW_LOCATION, -1, row, NULL, 0,
                 ROWF " is outside the geometry (S %d, L %d, H %d)", ROWA(row), g->max_seqs,
                 g->n_layers, g->n_kv_heads);
        } else {
            const int64_t region = mkv_mm_region(g, row->slot, row->layer, row->head);
            if (region_seen[region])
                emit(&c, MKV_VIOL_ROW_LOCATION, -1, row, NULL, 0, ROWF " is listed twice", ROWA(row));
            region_seen[region] = 1;
            if (slot_len[row->slot] < 0)
                emit(&c, MKV_VIOL_ROW_LOCATION, -1, row, NULL, 0,
                     ROWF " holds %d+%d tokens and %d+%d pages but slot %d is not active", ROWA(row),
                     row->n_hi, row->n_lo, row->k_hi, row->k_lo, row->slot);
            else if (row->n_hi < 0 || row->n_lo < 0 ||
                     (int64_t)row->n_hi + row->n_lo > slot_len[row->slot])
                emit(&c, MKV_VIOL_TOKENS, -1, row, NULL, 0,
                     ROWF " has n_hi %d and n_lo %d: each must be >= 0 and their sum <= N = %d",
                     ROWA(row), row->n_hi, row->n_lo, slot_len[row->slot]);
        }
        if (row->n_hi >= 0 && row->k_hi != mkv_mm_pages_for(row->n_hi, g->tpp_hi))
            emit(&c, MKV_VIOL_ROW_COUNT, -1, row, NULL, 0,
                 ROWF " lists %d hi pages but n_hi %d needs ceil(%d / %d) = %d", ROWA(row), row->k_hi,
                 row->n_hi, row->n_hi, g->tpp_hi, mkv_mm_pages_for(row->n_hi, g->tpp_hi));
        if (row->n_lo >= 0 && row->k_lo != mkv_mm_pages_for(row->n_lo, g->tpp_lo))
            emit(&c, MKV_VIOL_ROW_COUNT, -1, row, NULL, 0,
                 ROWF " lists %d lo pages but n_lo %d needs ceil(%d / %d) = %d", ROWA(row), row->k_lo,
                 row->n_lo, row->n_lo, g->tpp_lo, mkv_mm_pages_for(row->n_lo, g->tpp_lo));
        if ((int64_t)row->k_hi + row->k_lo > g->row_entries)
            emit(&c, MKV_VIOL_ROW_OVERFLOW, -1, row, NULL, 0,
                 ROWF " lists %d hi + %d lo pages, more than its %d entries", ROWA(row), row->k_hi,
                 row->k_lo, g->row_entries);
        for (int32_t k = 0; k < row->k_hi; k++) claim(&c, own, row->hi[k], OWNER_ROW, 0, k, r);
        for (int32_t k = 0; k < row->k_lo; k++) claim(&c, own, row->lo[k], OWNER_ROW, 1, k, r);
    }

    /* Pages that are nowhere. */
    for (int64_t p = 0; p < P; p++)
        if (own[p].kind == OWNER_NONE)
            emit(&c, MKV_VIOL_PAGE_MISSING, (int32_t)p, NULL, NULL, 0,
                 "page %lld is neither in the free list nor in any row (leaked)", (long long)p);

    free(own);
    free(slot_len);
    free(region_seen);
    return c.count;
}

/* ---------------------------------------------------------------------------------------- */
/* Views of a live state                                                                    */
/* ---------------------------------------------------------------------------------------- */

static int32_t clamp_pages(int32_t n, int32_t tpp, int32_t limit)
{
    if (n <= 0) return 0;
    int32_t k = mkv_mm_pages_for(n, tpp);
    return k > limit ? limit : k;
}

mkv_status_t mkv_state_view_build(const mkv_mm_state_t *st, int only_nonempty,
                                  mkv_state_view_buf_t *buf)
{
    const mkv_mm_geom_t *g = &st->g;
    const int32_t T = g->row_entries;
    memset(buf, 0, sizeof *buf);
    mkv_state_view_t *v = &buf->view;
    v->g = *g;
    v->head = st->head;
    v->tail = st->tail;
    v->reserved_total = st->reserved_total;

    int64_t n_free = st->tail - st->head;
    if (n_free < 0) n_free = 0;
    if (n_free > g->pool_pages) n_free = g->pool_pages;
    int32_t n_active = 0;
    int64_t n_rows = 0, n_lo_ids = 0;
    for (int32_t s = 0; s < g->max_seqs; s++) {
        if (!st->active[s]) continue;
        n_active++;
        for (int64_t r = mkv_mm_region(g, s, 0, 0); r < mkv_mm_region(g, s + 1, 0, 0); r++) {
            if (only_nonempty && st->n_hi[r] == 0 && st->n_lo[r] == 0) continue;
            n_rows++;
            n_lo_ids += clamp_pages(st->n_lo[r], g->tpp_lo, T);
        }
    }
    buf->free_ids = malloc((size_t)(n_free > 0 ? n_free : 1) * sizeof *buf->free_ids);
    buf->slots = malloc((size_t)(n_active > 0 ? n_active : 1) * sizeof *buf->slots);
    buf->rows = malloc((size_t)(n_rows > 0 ? n_rows : 1) * sizeof *buf->rows);
    buf->lo_ids = malloc((size_t)(n_lo_ids > 0 ? n_lo_ids : 1) * sizeof *buf->lo_ids);
    if (!buf->free_ids || !buf->slots || !buf->rows || !buf->lo_ids) {
        mkv_state_view_release(buf);
        return MKV_STATUS_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < n_free; i++) buf->free_ids[i] = mkv_mm_ring_at(st, st->head + i);
    v->free_ids = buf->free_ids;
    v->n_free_ids = n_free;

    int32_t si = 0;
    int64_t ri = 0, li = 0;
    for (int32_t s = 0; s < g->max_seqs; s++) {
        if (!st->active[s]) continue;
        buf->slots[si++] = (mkv_slot_view_t){s, st->seq_len[s], st->reserved[s]};
        for (int32_t l = 0; l < g->n_layers; l++) {
            for (int32_t h = 0; h < g->n_kv_heads; h++) {
                const int64_t r = mkv_mm_region(g, s, l, h);
                if (only_nonempty && st->n_hi[r] == 0 && st->n_lo[r] == 0) continue;
                const int32_t *row = mkv_mm_row(st, r);
                mkv_row_view_t *rv = &buf->rows[ri++];
                rv->slot = s;
                rv->layer = l;
                rv->head = h;
                rv->n_hi = st->n_hi[r];
                rv->n_lo = st->n_lo[r];
                rv->k_hi = clamp_pages(st->n_hi[r], g->tpp_hi, T);
                rv->k_lo = clamp_pages(st->n_lo[r], g->tpp_lo, T);
                rv->hi = row;
                rv->lo = buf->lo_ids + li;
                for (int32_t k = 0; k < rv->k_lo; k++) buf->lo_ids[li++] = row[T - 1 - k];
            }
        }
    }
    v->slots = buf->slots;
    v->n_slots = n_active;
    v->rows = buf->rows;
    v->n_rows = n_rows;
    return MKV_STATUS_OK;
}

void mkv_state_view_release(mkv_state_view_buf_t *buf)
{
    free(buf->free_ids);
    free(buf->slots);
    free(buf->rows);
    free(buf->lo_ids);
    memset(buf, 0, sizeof *buf);
}

int64_t mkv_mm_state_check(const mkv_mm_state_t *st, mkv_violation_fn report, void *ctx)
{
    mkv_state_view_buf_t buf;
    if (mkv_state_view_build(st, 0, &buf) != MKV_STATUS_OK) return -1;
    int64_t n = mkv_state_check(&buf.view, report, ctx);
    mkv_state_view_release(&buf);
    if (n < 0) return n;

    /* Live-only checks: free slots hold nothing, unused entries are -1. */
    checker_t c = {NULL, report, ctx, 0};
    const mkv_mm_geom_t *g = &st->g;
    const int32_t T = g->row_entries;
    for (int32_t s = 0; s < g->max_seqs; s++) {
        if (!st->active[s] && (st->seq_len[s] != 0 || st->reserved[s] != 0))
            emit(&c, MKV_VIOL_TOKENS, -1, NULL, NULL, 0,
                 "free slot %d has N = %d and %lld reserved pages", s, st->seq_len[s],
                 (long long)st->reserved[s]);
        for (int32_t l = 0; l < g->n_layers; l++) {
            for (int32_t h = 0; h < g->n_kv_heads; h++) {
                const int64_t r = mkv_mm_region(g, s, l, h);
                const mkv_row_view_t rv = {s, l, h, st->n_hi[r], st->n_lo[r], 0, 0, NULL, NULL};
                if (!st->active[s] && (st->n_hi[r] != 0 || st->n_lo[r] != 0)) {
                    emit(&c, MKV_VIOL_TOKENS, -1, &rv, NULL, 0,
                         ROWF " of free slot %d has n_hi %d, n_lo %d", ROWA(&rv), s, rv.n_hi, rv.n_lo);
                    continue;
                }
                const int32_t k_hi = st->active[s] ? clamp_pages(st->n_hi[r], g->tpp_hi, T) : 0;
                const int32_t k_lo = st->active[s] ? clamp_pages(st->n_lo[r], g->tpp_lo, T) : 0;
                const int32_t *row = mkv_mm_row(st, r);
                for (int32_t e = k_hi; e < T - k_lo; e++) {
                    if (row[e] == -1) continue;
                    emit(&c, MKV_VIOL_STALE_ENTRY, row[e], &rv, NULL, 0,
                         ROWF " entry %d holds page %d beyond its %d hi and %d lo pages", ROWA(&rv),
                         e, row[e], k_hi, k_lo);
                    break; /* one report per row is enough */
                }
            }
        }
    }
    return n + c.count;
}

void mkv_keep_first_violation(void *ctx, const mkv_violation_t *v)
{
    mkv_first_violation_t *f = ctx;
    if (f->count++ == 0) memcpy(f->message, v->message, sizeof f->message);
}
