/*
 * state.c — allocation and initial contents of the memory manager's arrays (see state.h).
 */
#include "memmgr/state.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

mkv_status_t mkv_mm_state_init(mkv_mm_state_t *st, const mkv_mm_geom_t *g, char *err)
{
    memset(st, 0, sizeof *st);
    st->g = *g;
    const int64_t regions = mkv_mm_regions(g);
    const int64_t entries = regions * g->row_entries;
    st->ring = malloc((size_t)g->pool_pages * sizeof *st->ring);
    st->table = malloc((size_t)entries * sizeof *st->table);
    st->n_hi = calloc((size_t)regions, sizeof *st->n_hi);
    st->n_lo = calloc((size_t)regions, sizeof *st->n_lo);
    st->seq_len = calloc((size_t)g->max_seqs, sizeof *st->seq_len);
    st->active = calloc((size_t)g->max_seqs, sizeof *st->active);
    st->reserved = calloc((size_t)g->max_seqs, sizeof *st->reserved);
    if (!st->ring || !st->table || !st->n_hi || !st->n_lo || !st->seq_len || !st->active ||
        !st->reserved) {
        mkv_mm_state_free(st);
        return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY,
                        "cannot allocate the page tables (%lld entries) and free list (%lld pages)",
                        (long long)entries, (long long)g->pool_pages);
    }
    for (int64_t i = 0; i < g->pool_pages; i++) st->ring[i] = (int32_t)i;
    for (int64_t i = 0; i < entries; i++) st->table[i] = -1;
    st->head = 0;
    st->tail = g->pool_pages;
    return MKV_STATUS_OK;
}

void mkv_mm_state_free(mkv_mm_state_t *st)
{
    free(st->ring);
    free(st->table);
    free(st->n_hi);
    free(st->n_lo);
    free(st->seq_len);
    free(st->active);
    free(st->reserved);
    memset(st, 0, sizeof *st);
}
