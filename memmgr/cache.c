/*
 * cache.c — the mkv_cache_t handle: creation, admission (check, then act), statistics and
 * validation. The batched page movements live in resize.c.
 */
#include "memmgr/cache.h"
#include "memmgr/cuda_mm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_CACHE(c)                                                                         \
    do {                                                                                       \
        if (!(c)) return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "%s: null cache", __func__); \
    } while (0)

static void work_free(mkv_mm_work_t *w)
{
    free(w->target);
    free(w->alloc);
    free(w->release);
    free(w->alloc_off);
    free(w->rel_off);
    free(w->slot_seen);
    free(w->new_len);
    free(w->flags);
    free(w->chunk_alloc);
    free(w->chunk_rel);
    free(w->chunk_bad);
    memset(w, 0, sizeof *w);
}

static mkv_status_t work_init(mkv_mm_work_t *w, const mkv_mm_geom_t *g, int32_t n_threads,
                              char *err)
{
    const size_t sections = (size_t)(2 * mkv_mm_regions(g));
    memset(w, 0, sizeof *w);
    w->target = malloc(sections * sizeof(int32_t));
    w->alloc = malloc(sections * sizeof(int32_t));
    w->release = malloc(sections * sizeof(int32_t));
    w->alloc_off = malloc(sections * sizeof(int32_t));
    w->rel_off = malloc(sections * sizeof(int32_t));
    w->slot_seen = calloc((size_t)g->max_seqs, sizeof(int32_t));
    w->new_len = malloc((size_t)g->max_seqs * sizeof(int32_t));
    w->flags = malloc((size_t)g->max_seqs);
    w->n_chunks = n_threads;
    w->chunk_alloc = malloc((size_t)n_threads * sizeof(int64_t));
    w->chunk_rel = malloc((size_t)n_threads * sizeof(int64_t));
    w->chunk_bad = malloc((size_t)n_threads * sizeof(int64_t));
    if (!w->target || !w->alloc || !w->release || !w->alloc_off || !w->rel_off || !w->slot_seen ||
        !w->new_len || !w->flags || !w->chunk_alloc || !w->chunk_rel || !w->chunk_bad) {
        work_free(w);
        return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the step workspace");
    }
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_create(const mkv_cache_config_t *config, mkv_cache_t **out_cache)
{
    char err[MKV_ERR_LEN] = "";
    mkv_status_t status = MKV_STATUS_OK;
    mkv_cache_t *c = NULL;
    mkv_clear_global_error();
    if (!out_cache) return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_create: null out_cache");
    *out_cache = NULL;
    if (!config) return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_create: null config");

    mkv_cache_config_t cfg;
    mkv_mm_geom_t geom;
    MKV_TRY(mkv_config_resolve(config, &cfg, &geom, err));
#ifndef MKV_HAVE_CUDA
    if (cfg.backend == MKV_BACKEND_CUDA) {
        status = mkv_fail(err, MKV_STATUS_UNSUPPORTED,
                          "this mixkv was built without CUDA (-DMIXKV_CUDA=OFF)");
        goto fail;
    }
#endif

    c = calloc(1, sizeof *c);
    if (!c) {
        status = mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the cache handle");
        goto fail;
    }
    c->cfg = cfg;
    c->mm = &mkv_mm_cpu_backend;
    c->parallel_min_regions = MKV_PARALLEL_MIN_REGIONS;
    c->par_parts = 1; /* the calling thread until mkv_cache_set_parallel */
    c->async = cfg.backend == MKV_BACKEND_CUDA && (cfg.flags & MKV_CACHE_ASYNC_STEPS);
    c->kept_fraction = 1.0;
    MKV_TRY(mkv_mm_state_init(&c->st, &geom, err));
    MKV_TRY(work_init(&c->work, &geom, cfg.n_threads, err));
    c->prompt_len = calloc((size_t)geom.max_seqs, sizeof *c->prompt_len);
    c->epoch = calloc((size_t)geom.max_seqs, sizeof *c->epoch);
    if (!c->prompt_len || !c->epoch) {
        status = mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the slot arrays");
        goto fail;
    }
#ifdef MKV_HAVE_CUDA
    if (cfg.backend == MKV_BACKEND_CUDA) {
        const int64_t pool = (cfg.flags & MKV_CACHE_METADATA_ONLY) ? 0 : cfg.pool_pages * cfg.page_bytes;
        MKV_TRY(mkv_cuda_mm_create(&geom, cfg.device_id, pool, &c->dev, err));
        c->mm = &mkv_mm_cuda_backend;
    } else
#endif
    if (!(cfg.flags & MKV_CACHE_METADATA_ONLY)) {
        /* calloc: untouched pages of a large pool cost no physical memory until written. */
        c->pool = calloc((size_t)cfg.pool_pages, (size_t)cfg.page_bytes);
        if (!c->pool) {
            status = mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY,
                              "cannot allocate the page pool: %lld pages of %lld bytes",
                              (long long)cfg.pool_pages, (long long)cfg.page_bytes);
            goto fail;
        }
    }
    if (cfg.n_threads > 1) {
        c->threads = mkv_threads_create(cfg.n_threads);
        if (!c->threads) {
            status = mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot start %d planning threads",
                              cfg.n_threads);
            goto fail;
        }
    }

    mkv_cache_info_t *info = &c->info;
    info->config = cfg;
    info->tokens_per_page_hi = geom.tpp_hi;
    info->tokens_per_page_lo = geom.tpp_lo;
    info->row_entries = geom.row_entries;
    info->region_count = mkv_mm_regions(&geom);
    info->table_bytes = info->region_count * geom.row_entries * (int64_t)sizeof(int32_t) +
                        info->region_count * 2 * (int64_t)sizeof(int32_t) +
                        geom.pool_pages * (int64_t)sizeof(int32_t) +
                        (int64_t)geom.max_seqs * (sizeof(int32_t) + sizeof(uint8_t) + sizeof(int64_t));
    info->pool_bytes = (cfg.flags & MKV_CACHE_METADATA_ONLY) ? 0 : cfg.pool_pages * cfg.page_bytes;
    *out_cache = c;
    return MKV_STATUS_OK;
fail:
    mkv_cache_destroy(c);
    return mkv_fail_global(status, "%s", err);
}

void mkv_cache_destroy(mkv_cache_t *cache)
{
    if (!cache) return;
    if (cache->kv && cache->kv_free) cache->kv_free(cache->kv);
#ifdef MKV_HAVE_CUDA
    mkv_cuda_mm_destroy(cache->dev);
#endif
    free(cache->prompt_len);
    free(cache->epoch);
    mkv_threads_destroy(cache->threads);
    mkv_mm_state_free(&cache->st);
    work_free(&cache->work);
    free(cache->pool);
    free(cache);
}

const char *mkv_cache_last_error(const mkv_cache_t *cache)
{
    return cache ? cache->err : "null cache";
}

mkv_status_t mkv_cache_collect(mkv_cache_t *c)
{
    if (!c->pending || !c->mm->collect) return MKV_STATUS_OK;
    return c->mm->collect(c);
}

mkv_status_t mkv_cache_settle(mkv_cache_t *c)
{
    const mkv_status_t st = mkv_cache_collect(c);
    if (st != MKV_STATUS_OK) return st;
    if (c->deferred != MKV_STATUS_OK) {
        const mkv_status_t d = c->deferred;
        c->deferred = MKV_STATUS_OK;
        return mkv_fail(c->err, d, "%s", c->deferred_msg);
    }
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_sync(mkv_cache_t *cache, void *stream)
{
    (void)stream; /* the device is waited for as a whole: calls may have used several streams */
    CHECK_CACHE(cache);
    cache->err[0] = '\0';
    /* Always read the device: graph replays move it without the host taking part. */
    if (cache->mm->collect) cache->pending = 1;
    return mkv_cache_settle(cache);
}

mkv_status_t mkv_cache_info(const mkv_cache_t *cache, mkv_cache_info_t *out_info)
{
    CHECK_CACHE(cache);
    if (!out_info) return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_info: null out_info");
    *out_info = cache->info;
    return MKV_STATUS_OK;
}

static mkv_status_t prompt_demand(const mkv_cache_t *c, int32_t prompt_len, int64_t *out, char *err)
{
    const mkv_mm_geom_t *g = &c->st.g;
    if (prompt_len < 1 || prompt_len > g->max_seq_len)
        return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "prompt_len %d must be in [1, %d]",
                        prompt_len, g->max_seq_len);
    *out = (int64_t)g->n_layers * g->n_kv_heads * (mkv_mm_pages_for(prompt_len, g->tpp_hi) + 1);
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_prompt_demand(const mkv_cache_t *cache, int32_t prompt_len,
                                     int64_t *out_pages)
{
    char err[MKV_ERR_LEN];
    CHECK_CACHE(cache);
    mkv_clear_global_error();
    if (!out_pages)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_prompt_demand: null out_pages");
    mkv_status_t st = prompt_demand(cache, prompt_len, out_pages, err);
    if (st != MKV_STATUS_OK) return mkv_fail_global(st, "%s", err);
    return MKV_STATUS_OK;
}

static int32_t lowest_free_slot(const mkv_cache_t *c)
{
    for (int32_t s = 0; s < c->st.g.max_seqs; s++)
        if (!c->st.active[s]) return s;
    return -1;
}

/* Why admission of prompt_len would fail now, or OK. */
static mkv_status_t admission(mkv_cache_t *c, int32_t prompt_len, int64_t *demand, int32_t *slot)
{
    mkv_status_t st = prompt_demand(c, prompt_len, demand, c->err);
    if (st != MKV_STATUS_OK) return st;
    *slot = lowest_free_slot(c);
    if (*slot < 0)
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_SLOTS, "all %d sequence slots are in use",
                        c->st.g.max_seqs);
    const int64_t available = mkv_mm_free_pages(&c->st) - c->st.reserved_total;
    if (*demand > available)
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_PAGES,
                        "a %d-token prompt needs %lld pages; %lld are available (%lld free, %lld "
                        "reserved)",
                        prompt_len, (long long)*demand, (long long)available,
                        (long long)mkv_mm_free_pages(&c->st), (long long)c->st.reserved_total);
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_can_admit(mkv_cache_t *cache, int32_t prompt_len, int *out_ok)
{
    CHECK_CACHE(cache);
    cache->err[0] = '\0';
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    if (!out_ok) return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "null out_ok");
    int64_t demand = 0;
    int32_t slot = -1;
    mkv_status_t st = admission(cache, prompt_len, &demand, &slot);
    if (st == MKV_STATUS_INVALID_ARGUMENT) return st;
    *out_ok = st == MKV_STATUS_OK;
    return MKV_STATUS_OK; /* the reason for a 0 stays in the last-error message */
}

mkv_status_t mkv_cache_admit(mkv_cache_t *cache, int32_t prompt_len, int32_t *out_slot)
{
    CHECK_CACHE(cache);
    cache->err[0] = '\0';
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    if (!out_slot) return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "null out_slot");
    int64_t demand = 0;
    int32_t slot = -1;
    mkv_status_t st = admission(cache, prompt_len, &demand, &slot);
    if (st != MKV_STATUS_OK) return st;
    mkv_mm_state_t *s = &cache->st;
    s->active[slot] = 1;
    s->seq_len[slot] = 0;
    s->reserved[slot] = demand;
    s->reserved_total += demand;
    cache->prompt_len[slot] = prompt_len;
    cache->epoch[slot]++;
    if ((st = cache->mm->admitted(cache, slot, demand)) != MKV_STATUS_OK) {
        s->active[slot] = 0;
        s->reserved[slot] = 0;
        s->reserved_total -= demand;
        return st;
    }
    *out_slot = slot;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_step_demand(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                   int64_t *out_pages)
{
    CHECK_CACHE(cache);
    cache->err[0] = '\0';
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    const mkv_mm_state_t *s = &cache->st;
    const mkv_mm_geom_t *g = &s->g;
    if (!out_pages || (n_slots > 0 && !slots) || n_slots < 0 || n_slots > g->max_seqs)
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                        "mkv_cache_step_demand: null pointer, or n_slots %d outside [0, %d]", n_slots,
                        g->max_seqs);
    for (int32_t j = 0; j < n_slots; j++)
        if (slots[j] < 0 || slots[j] >= g->max_seqs || !s->active[slots[j]])
            return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                            "slots[%d] = %d is not an active slot", j, slots[j]);
    return cache->mm->step_demand(cache, n_slots, slots, out_pages);
}

mkv_status_t mkv_cache_stats(const mkv_cache_t *cache, mkv_cache_stats_t *out)
{
    CHECK_CACHE(cache);
    if (!out) return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_stats: null out_stats");
    if (cache->pending) { /* waits, refreshes the mirror; a refusal stays for the next call */
        const mkv_status_t st = mkv_cache_collect((mkv_cache_t *)cache);
        if (st != MKV_STATUS_OK) return mkv_fail_global(st, "%s", cache->err);
    }
    const mkv_mm_state_t *s = &cache->st;
    const mkv_mm_geom_t *g = &s->g;
    memset(out, 0, sizeof *out);
    out->total_pages = g->pool_pages;
    out->free_pages = mkv_mm_free_pages(s);
    out->reserved_pages = s->reserved_total;
    out->available_pages = out->free_pages - out->reserved_pages;
    for (int32_t slot = 0; slot < g->max_seqs; slot++) {
        if (!s->active[slot]) continue;
        out->active_slots++;
        out->tokens_seen += (int64_t)s->seq_len[slot] * g->n_layers * g->n_kv_heads;
    }
    /* free slots hold nothing: sums over every head-region */
    int64_t sums[4];
    char err[MKV_ERR_LEN];
    const mkv_status_t st = cache->mm->sums(cache, -1, sums, err);
    if (st != MKV_STATUS_OK) return mkv_fail_global(st, "%s", err);
    out->tokens_hi = sums[0];
    out->tokens_lo = sums[1];
    out->pages_hi = sums[2];
    out->pages_lo = sums[3];
    out->tokens_pruned = out->tokens_seen - out->tokens_hi - out->tokens_lo;
    if (out->tokens_seen > 0) /* a hint only: the handle's const is about the cache's contents */
        ((mkv_cache_t *)cache)->kept_fraction = (double)(out->tokens_hi + out->tokens_lo) / (double)out->tokens_seen;
    out->bytes_in_use = (out->pages_hi + out->pages_lo) * cache->cfg.page_bytes;
    out->bytes_fp16 = out->tokens_seen * 2 * cache->cfg.head_dim * 2;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_prompt_len(mkv_cache_t *cache, int32_t slot, int32_t *out_len)
{
    CHECK_CACHE(cache);
    cache->err[0] = '\0';
    const mkv_mm_geom_t *g = &cache->st.g;
    if (!out_len) return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "null out_len");
    if (slot < 0 || slot >= g->max_seqs)
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "slot %d is outside [0, %d)", slot,
                        g->max_seqs);
    if (!cache->st.active[slot])
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "slot %d is not active", slot);
    *out_len = cache->prompt_len[slot];
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_seq_lens(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                int32_t *out_lens)
{
    CHECK_CACHE(cache);
    cache->err[0] = '\0';
    const mkv_mm_state_t *s = &cache->st;
    const mkv_mm_geom_t *g = &s->g;
    if (n_slots < 0 || (n_slots > 0 && (!slots || !out_lens)))
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                        "mkv_cache_seq_lens: n_slots %d, slots %p, out_lens %p", n_slots,
                        (const void *)slots, (void *)out_lens);
    for (int32_t j = 0; j < n_slots; j++)
        if (slots[j] < 0 || slots[j] >= g->max_seqs || !s->active[slots[j]])
            return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                            "slots[%d] = %d is not an active slot", j, slots[j]);
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    for (int32_t j = 0; j < n_slots; j++) out_lens[j] = s->seq_len[slots[j]];
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_slot_info(mkv_cache_t *cache, int32_t slot, mkv_slot_info_t *out)
{
    CHECK_CACHE(cache);
    cache->err[0] = '\0';
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    const mkv_mm_state_t *s = &cache->st;
    const mkv_mm_geom_t *g = &s->g;
    if (!out) return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "null out_info");
    if (slot < 0 || slot >= g->max_seqs)
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "slot %d is outside [0, %d)", slot,
                        g->max_seqs);
    memset(out, 0, sizeof *out);
    out->active = s->active[slot];
    out->seq_len = s->seq_len[slot];
    out->reserved_pages = s->reserved[slot];
    int64_t sums[4];
    const mkv_status_t st = cache->mm->sums(cache, slot, sums, cache->err);
    if (st != MKV_STATUS_OK) return st;
    out->tokens_hi = sums[0];
    out->tokens_lo = sums[1];
    out->pages_hi = sums[2];
    out->pages_lo = sums[3];
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_validate(mkv_cache_t *cache)
{
    CHECK_CACHE(cache);
    cache->err[0] = '\0';
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    int64_t device_violations = 0;
    const mkv_status_t st = cache->mm->mirror(cache, &device_violations);
    if (st != MKV_STATUS_OK) return st;
    mkv_first_violation_t first = {"", 0};
    int64_t n = mkv_mm_state_check(&cache->st, mkv_keep_first_violation, &first);
    if (n == 0 && device_violations > 0)
        return mkv_fail(cache->err, MKV_STATUS_CORRUPT,
                        "the device found %lld invariant violations the host mirror does not show",
                        (long long)device_violations);
    if (n < 0) return mkv_fail(cache->err, MKV_STATUS_OUT_OF_MEMORY, "validate: out of memory");
    if (n > 0)
        return mkv_fail(cache->err, MKV_STATUS_CORRUPT, "%lld invariant violation%s; first: %s",
                        (long long)n, n == 1 ? "" : "s", first.message);
    return MKV_STATUS_OK;
}
