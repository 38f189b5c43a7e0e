/*
 * backend.c — the memory manager's two backends side by side, behind mkv_mm_backend_t
 * (memmgr/cache.h): the CPU one reads and writes the host state directly; the CUDA one runs
 * memmgr/cuda_mm.cu's kernels on the device state, which the host state mirrors. The public
 * calls (cache.c, resize.c, dump.c) check their arguments once and dispatch through the table
 * chosen at create.
 */
#include "memmgr/cache.h"
#include "memmgr/cuda_mm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* CPU                                                                                      */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t cpu_sums(const mkv_cache_t *c, int32_t slot, int64_t out[4], char *err)
{
    (void)err;
    const mkv_mm_state_t *s = &c->st;
    const mkv_mm_geom_t *g = &s->g;
    const int64_t r0 = slot >= 0 ? mkv_mm_region(g, slot, 0, 0) : 0;
    const int64_t r1 = slot >= 0 ? mkv_mm_region(g, slot + 1, 0, 0) : mkv_mm_regions(g);
    memset(out, 0, 4 * sizeof out[0]);
    for (int64_t r = r0; r < r1; r++) {
        out[0] += s->n_hi[r];
        out[1] += s->n_lo[r];
        out[2] += mkv_mm_pages_for(s->n_hi[r], g->tpp_hi);
        out[3] += mkv_mm_pages_for(s->n_lo[r], g->tpp_lo);
    }
    return MKV_STATUS_OK;
}

static mkv_status_t cpu_step_demand(mkv_cache_t *c, int32_t n_slots, const int32_t *slots, int64_t *out)
{
    const mkv_mm_state_t *s = &c->st;
    const mkv_mm_geom_t *g = &s->g;
    int64_t pages = 0;
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t slot = slots[j];
        const int lo_can_grow = s->seq_len[slot] >= g->window;
        for (int64_t r = mkv_mm_region(g, slot, 0, 0); r < mkv_mm_region(g, slot + 1, 0, 0); r++) {
            pages += s->n_hi[r] % g->tpp_hi == 0;
            pages += lo_can_grow && s->n_lo[r] % g->tpp_lo == 0;
        }
    }
    *out = pages;
    return MKV_STATUS_OK;
}

static mkv_status_t cpu_admitted(mkv_cache_t *c, int32_t slot, int64_t reserved)
{
    (void)c, (void)slot, (void)reserved;
    return MKV_STATUS_OK; /* the host state is the state */
}

static mkv_status_t cpu_mirror(mkv_cache_t *c, int64_t *violations)
{
    (void)c;
    if (violations) *violations = 0;
    return MKV_STATUS_OK;
}

const mkv_mm_backend_t mkv_mm_cpu_backend = {"cpu", mkv_mm_apply_cpu, cpu_sums, cpu_step_demand,
                                             cpu_admitted, cpu_mirror, NULL};

/* ---------------------------------------------------------------------------------------- */
/* CUDA                                                                                     */
/* ---------------------------------------------------------------------------------------- */

#ifdef MKV_HAVE_CUDA
static mkv_status_t cuda_sums(const mkv_cache_t *c, int32_t slot, int64_t out[4], char *err)
{
    return mkv_cuda_mm_sums(c->dev, slot, out, err);
}

static mkv_status_t cuda_step_demand(mkv_cache_t *c, int32_t n_slots, const int32_t *slots, int64_t *out)
{
    uint8_t *grow = c->work.flags;
    for (int32_t j = 0; j < n_slots; j++) grow[j] = c->st.seq_len[slots[j]] >= c->st.g.window;
    return mkv_cuda_mm_step_demand(c->dev, n_slots, slots, grow, out, c->err);
}

static mkv_status_t cuda_admitted(mkv_cache_t *c, int32_t slot, int64_t reserved)
{
    return mkv_cuda_mm_set_slot(c->dev, slot, 0, reserved, c->err);
}

/* The device checks its own state; the host then checks the downloaded mirror, which adds the
 * per-slot bookkeeping and names the first violation precisely. */
static mkv_status_t cuda_mirror(mkv_cache_t *c, int64_t *violations)
{
    if (violations) {
        const mkv_status_t st =
            mkv_cuda_mm_validate(c->dev, c->st.active, c->st.seq_len, violations, c->err);
        if (st != MKV_STATUS_OK) return st;
    }
    return mkv_cuda_mm_download(c->dev, &c->st, c->err);
}

/* The step call a failure record names. */
static const char *failed_call(int32_t kind)
{
    return kind == MKV_CUDA_OP_APPEND ? "mkv_cache_append" : "mkv_cache_compress";
}

static mkv_status_t cuda_collect(mkv_cache_t *c)
{
    mkv_mm_state_t *s = &c->st;
    const int32_t S = s->g.max_seqs;
    int64_t counters[2];
    mkv_cuda_fail_t f;
    int32_t *len = c->work.new_len; /* [S] scratch */
    int64_t *tmp = malloc((size_t)S * sizeof(int64_t));
    if (!tmp) return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate %d reservations", S);
    char err[MKV_ERR_LEN];
    mkv_status_t st = mkv_cuda_mm_collect(c->dev, &f, len, tmp, counters, err);
    if (st == MKV_STATUS_OK) {
        c->pending = 0;
        s->head = counters[0];
        s->tail = counters[1];
        s->reserved_total = 0;
        for (int32_t slot = 0; slot < S; slot++) {
            if (!s->active[slot]) continue;
            s->seq_len[slot] = len[slot];
            s->reserved[slot] = tmp[slot];
            s->reserved_total += tmp[slot];
        }
        if (c->kv_refresh) c->kv_refresh(c);
        if (f.code != 0 && c->deferred == MKV_STATUS_OK) {
            c->deferred = (mkv_status_t)f.code;
            if (f.code == MKV_STATUS_OUT_OF_PAGES)
                snprintf(c->deferred_msg, sizeof c->deferred_msg,
                         "%s%s was refused on the device: out of pages: %lld needed, %lld free, "
                         "%lld released, %lld reserved by other slots%s",
                         failed_call(f.kind), c->async ? " (asynchronous)" : "", f.total_alloc,
                         f.free_pages, f.total_release, f.others_reserved,
                         c->async ? "; it and every later step call changed nothing" : "");
            else
                snprintf(c->deferred_msg, sizeof c->deferred_msg, "%s%s failed on the device: %s%s",
                         failed_call(f.kind), c->async ? " (asynchronous)" : "",
                         f.code == MKV_STATUS_INTERNAL ? "a head-region has no high token at the "
                                                         "window's edge (internal error)"
                                                       : mkv_status_string((mkv_status_t)f.code),
                         c->async ? "; it and every later step call changed nothing" : "");
        }
    } else {
        snprintf(c->err, sizeof c->err, "%s", err);
    }
    free(tmp);
    return st;
}

const mkv_mm_backend_t mkv_mm_cuda_backend = {"cuda", mkv_mm_apply_cuda, cuda_sums, cuda_step_demand,
                                              cuda_admitted, cuda_mirror, cuda_collect};
#endif
