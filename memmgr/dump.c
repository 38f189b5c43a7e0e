/*
 * dump.c — writing JSON dumps of the memory manager's state (docs/dump-format.md) and loading
 * a checked dump back into a cache. Reading lives in dump_read.c.
 *
 * Writing serialises the same view of the state that mkv_cache_validate checks
 * (mkv_state_view_build, non-empty rows only), so a dump says exactly what the checker saw.
 *
 * Determinism: members are written in a fixed order, integers as integers, and the two floats
 * (alpha_h, alpha_l) as floats widened to double with enough digits to read back exactly, so
 * dump -> load -> dump is byte-identical.
 */
#include "memmgr/dump.h"

#include "common/error.h"
#include "memmgr/cache.h"
#include "memmgr/cuda_mm.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---------------------------------------------------------------------------------------- */
/* The config members, in file order: one table for writing, reading and diffing            */
/* ---------------------------------------------------------------------------------------- */

#define CF(name, type) {#name, type, offsetof(mkv_cache_config_t, name)}
/* The cache's state and what determines it; not how it is executed (backend, device_id,
 * n_threads), so that the CPU and CUDA backends write identical dumps for the same calls. */
const mkv_config_field_t mkv_config_fields[] = {
    CF(n_layers, MKV_CF_I32),      CF(n_kv_heads, MKV_CF_I32),    CF(group_size, MKV_CF_I32),
    CF(head_dim, MKV_CF_I32),      CF(max_seqs, MKV_CF_I32),      CF(max_seq_len, MKV_CF_I32),
    CF(hi_key_group, MKV_CF_I32),  CF(hi_value_group, MKV_CF_I32), CF(lo_key_group, MKV_CF_I32),
    CF(lo_value_group, MKV_CF_I32), CF(page_bytes, MKV_CF_I64),   CF(pool_pages, MKV_CF_I64),
    CF(hi_format, MKV_CF_FORMAT),  CF(lo_format, MKV_CF_FORMAT),  CF(alpha_h, MKV_CF_F32),
    CF(alpha_l, MKV_CF_F32),       CF(window, MKV_CF_I32),        CF(obs_window, MKV_CF_I32),
    CF(softmax_scale, MKV_CF_F32), CF(flags, MKV_CF_U32),         CF(mix_high, MKV_CF_F32),
    CF(mix_low, MKV_CF_F32),
};
#undef CF
const size_t mkv_config_field_count = sizeof mkv_config_fields / sizeof mkv_config_fields[0];

void mkv_dump_config_field_text(const mkv_cache_config_t *c, const mkv_config_field_t *f,
                                char *buf, size_t n)
{
    const void *p = (const char *)c + f->offset;
    switch (f->type) {
    case MKV_CF_I32: snprintf(buf, n, "%d", *(const int32_t *)p); return;
    case MKV_CF_I64: snprintf(buf, n, "%" PRId64, *(const int64_t *)p); return;
    case MKV_CF_U32: snprintf(buf, n, "%u", (unsigned)*(const uint32_t *)p); return;
    case MKV_CF_F32: snprintf(buf, n, "%.9g", (double)*(const float *)p); return; /* exact */
    case MKV_CF_FORMAT: snprintf(buf, n, "%s", mkv_format_name(*(const mkv_format_t *)p)); return;
    case MKV_CF_BACKEND: snprintf(buf, n, "%s", mkv_backend_name(*(const mkv_backend_t *)p)); return;
    }
    snprintf(buf, n, "?");
}

/* ---------------------------------------------------------------------------------------- */
/* Writing                                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(sbuf_t *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_i64(sbuf_t *b, int64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%" PRId64, v);
    sb_put(b, tmp, (size_t)n);
}

/* Appends cJSON's compact text of item (consumed) to b. */
static void sb_json(sbuf_t *b, cJSON *item)
{
    char *text = item ? cJSON_PrintUnformatted(item) : NULL;
    if (!text)
        b->oom = 1;
    else
        sb_puts(b, text);
    cJSON_free(text);
    cJSON_Delete(item);
}

/* int64 members are written as raw text: cJSON would print them through a double. */
static int add_i64(cJSON *o, const char *key, int64_t v)
{
    char tmp[24];
    snprintf(tmp, sizeof tmp, "%" PRId64, v);
    return cJSON_AddRawToObject(o, key, tmp) != NULL;
}

static int add_num(cJSON *o, const char *key, double v)
{
    return cJSON_AddNumberToObject(o, key, v) != NULL;
}

cJSON *mkv_dump_config_json(const mkv_cache_config_t *c)
{
    cJSON *o = cJSON_CreateObject();
    int ok = o != NULL;
    for (size_t i = 0; ok && i < mkv_config_field_count; i++) {
        const mkv_config_field_t *f = &mkv_config_fields[i];
        const void *p = (const char *)c + f->offset;
        switch (f->type) {
        case MKV_CF_I32: ok = add_num(o, f->name, *(const int32_t *)p); break;
        case MKV_CF_I64: ok = add_i64(o, f->name, *(const int64_t *)p); break;
        case MKV_CF_U32: ok = add_num(o, f->name, *(const uint32_t *)p); break;
        case MKV_CF_F32: ok = add_num(o, f->name, (double)*(const float *)p); break;
        case MKV_CF_FORMAT:
            ok = cJSON_AddStringToObject(o, f->name, mkv_format_name(*(const mkv_format_t *)p)) !=
                 NULL;
            break;
        case MKV_CF_BACKEND:
            ok = cJSON_AddStringToObject(o, f->name, mkv_backend_name(*(const mkv_backend_t *)p)) !=
                 NULL;
            break;
        }
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *row_json(const mkv_row_view_t *r)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    /* cJSON_CreateIntArray refuses a NULL pointer: an empty section is a plain empty array. */
    cJSON *hi = r->k_hi > 0 ? cJSON_CreateIntArray(r->hi, r->k_hi) : cJSON_CreateArray();
    cJSON *lo = r->k_lo > 0 ? cJSON_CreateIntArray(r->lo, r->k_lo) : cJSON_CreateArray();
    int ok = hi && lo;
    ok = ok && add_num(o, "slot", r->slot) && add_num(o, "layer", r->layer) &&
         add_num(o, "head", r->head) && add_num(o, "n_hi", r->n_hi) && add_num(o, "n_lo", r->n_lo);
    if (ok && cJSON_AddItemToObject(o, "hi", hi))
        hi = NULL;
    else
        ok = 0;
    if (ok && cJSON_AddItemToObject(o, "lo", lo))
        lo = NULL;
    else
        ok = 0;
    cJSON_Delete(hi);
    cJSON_Delete(lo);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* One member per line; slots and rows one element per line; page-id arrays on one line. */
static void write_view(sbuf_t *b, const mkv_cache_config_t *cfg, const mkv_state_view_t *v)
{
    sb_puts(b, "{\n  \"format\": \"" MKV_DUMP_FORMAT_NAME "\",\n  \"version\": ");
    sb_i64(b, MKV_DUMP_FORMAT_VERSION);
    sb_puts(b, ",\n  \"mixkv_version\": ");
    sb_json(b, cJSON_CreateString(mkv_version()));
    sb_puts(b, ",\n  \"config\": ");
    sb_json(b, mkv_dump_config_json(cfg));

    cJSON *layout = cJSON_CreateObject();
    if (layout && !(add_num(layout, "tokens_per_page_hi", v->g.tpp_hi) &&
                    add_num(layout, "tokens_per_page_lo", v->g.tpp_lo) &&
                    add_num(layout, "row_entries", v->g.row_entries))) {
        cJSON_Delete(layout);
        layout = NULL;
    }
    sb_puts(b, ",\n  \"layout\": ");
    sb_json(b, layout);

    sb_puts(b, ",\n  \"ring\": {\"head\":");
    sb_i64(b, v->head);
    sb_puts(b, ",\"tail\":");
    sb_i64(b, v->tail);
    sb_puts(b, ",\"free_pages\":");
    sb_i64(b, v->tail - v->head);
    sb_puts(b, ",\"free\":[");
    for (int64_t i = 0; i < v->n_free_ids; i++) {
        if (i) sb_put(b, ",", 1);
        sb_i64(b, v->free_ids[i]);
    }
    sb_puts(b, "]},\n  \"reserved_pages\": ");
    sb_i64(b, v->reserved_total);

    sb_puts(b, ",\n  \"slots\": [");
    for (int32_t i = 0; i < v->n_slots; i++) {
        const mkv_slot_view_t *s = &v->slots[i];
        cJSON *o = cJSON_CreateObject();
        if (o && !(add_num(o, "slot", s->slot) && add_num(o, "seq_len", s->seq_len) &&
                   add_i64(o, "reserved_pages", s->reserved))) {
            cJSON_Delete(o);
            o = NULL;
        }
        sb_puts(b, i ? ",\n    " : "\n    ");
        sb_json(b, o);
    }
    sb_puts(b, v->n_slots ? "\n  ],\n  \"rows\": [" : "],\n  \"rows\": [");
    for (int64_t i = 0; i < v->n_rows; i++) {
        sb_puts(b, i ? ",\n    " : "\n    ");
        sb_json(b, row_json(&v->rows[i]));
    }
    sb_puts(b, v->n_rows ? "\n  ]\n}\n" : "]\n}\n");
}

static mkv_status_t dump_string(mkv_cache_t *cache, char **out, size_t *out_len)
{
    mkv_state_view_buf_t buf;
#ifdef MKV_HAVE_CUDA
    { /* the backend's state into the host mirror (a no-op on the CPU), then one writer */
        const mkv_status_t st = cache->mm->mirror(cache, NULL);
        if (st != MKV_STATUS_OK) return st;
    }
#endif
    if (mkv_state_view_build(&cache->st, 1, &buf) != MKV_STATUS_OK)
        return mkv_fail(cache->err, MKV_STATUS_OUT_OF_MEMORY, "dump: cannot build the state view");
    sbuf_t b = {NULL, 0, 0, 0};
    write_view(&b, &cache->cfg, &buf.view);
    mkv_state_view_release(&buf);
    if (b.oom) {
        free(b.p);
        return mkv_fail(cache->err, MKV_STATUS_OUT_OF_MEMORY, "dump: out of memory");
    }
    *out = b.p;
    *out_len = b.len;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_dump_json_string(mkv_cache_t *cache, char **out_json)
{
    if (!cache)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT,
                               "mkv_cache_dump_json_string: null cache");
    cache->err[0] = '\0';
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    if (!out_json)
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                        "mkv_cache_dump_json_string: null out_json");
    *out_json = NULL;
    size_t len;
    return dump_string(cache, out_json, &len);
}

mkv_status_t mkv_cache_dump_json(mkv_cache_t *cache, const char *path)
{
    if (!cache)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_dump_json: null cache");
    cache->err[0] = '\0';
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    if (!path)
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_dump_json: null path");
    char *text = NULL;
    size_t len = 0;
    mkv_status_t status = dump_string(cache, &text, &len);
    if (status != MKV_STATUS_OK) return status;
    const int to_stdout = strcmp(path, "-") == 0;
    FILE *f = to_stdout ? stdout : fopen(path, "wb");
    if (!f) {
        status = mkv_fail(cache->err, MKV_STATUS_IO_ERROR, "cannot open '%s' for writing: %s", path,
                          strerror(errno));
        free(text);
        return status;
    }
    int ok = fwrite(text, 1, len, f) == len;
    ok = (to_stdout ? fflush(f) : fclose(f)) == 0 && ok;
    free(text);
    if (!ok)
        return mkv_fail(cache->err, MKV_STATUS_IO_ERROR, "cannot write the dump to '%s': %s",
                        to_stdout ? "stdout" : path, strerror(errno));
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Loading into a cache                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* Writes a checked dump into a fresh cache of the same geometry. The checker has already
 * proven every index in range; the guards here only keep a checker bug from writing wild. */
static mkv_status_t restore(const mkv_dump_t *d, mkv_mm_state_t *st, char *err)
{
    const mkv_mm_geom_t *g = &st->g;
    const int64_t P = g->pool_pages;
    const int32_t T = g->row_entries;
    if (g->row_entries != d->g.row_entries || P != d->g.pool_pages ||
        g->max_seqs != d->g.max_seqs || g->n_layers != d->g.n_layers ||
        g->n_kv_heads != d->g.n_kv_heads || d->head < 0 || d->n_free_ids != d->tail - d->head ||
        d->n_free_ids > P)
        return mkv_fail(err, MKV_STATUS_INTERNAL, "load: the cache geometry or counters disagree");
    for (int64_t i = 0; i < d->n_free_ids; i++) st->ring[(d->head + i) % P] = d->free_ids[i];
    st->head = d->head;
    st->tail = d->tail;
    for (int32_t i = 0; i < d->n_slots; i++) {
        const mkv_slot_view_t *s = &d->slots[i];
        if (s->slot < 0 || s->slot >= g->max_seqs)
            return mkv_fail(err, MKV_STATUS_INTERNAL, "load: slot %d out of range", s->slot);
        st->active[s->slot] = 1;
        st->seq_len[s->slot] = s->seq_len;
        st->reserved[s->slot] = s->reserved;
    }
    st->reserved_total = d->reserved_total;
    for (int64_t i = 0; i < d->n_rows; i++) {
        const mkv_row_view_t *r = &d->rows[i];
        if (r->slot < 0 || r->slot >= g->max_seqs || r->layer < 0 || r->layer >= g->n_layers ||
            r->head < 0 || r->head >= g->n_kv_heads || r->k_hi < 0 || r->k_lo < 0 ||
            (int64_t)r->k_hi + r->k_lo > T)
            return mkv_fail(err, MKV_STATUS_INTERNAL, "load: row %lld out of range", (long long)i);
        const int64_t region = mkv_mm_region(g, r->slot, r->layer, r->head);
        int32_t *row = mkv_mm_row(st, region);
        for (int32_t k = 0; k < r->k_hi; k++) row[k] = r->hi[k];
        for (int32_t k = 0; k < r->k_lo; k++) row[T - 1 - k] = r->lo[k];
        st->n_hi[region] = r->n_hi;
        st->n_lo[region] = r->n_lo;
    }
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_load_json(const char *path, mkv_cache_t **out_cache)
{
    char err[MKV_ERR_LEN];
    mkv_status_t status;
    mkv_dump_t d;
    mkv_cache_t *cache = NULL;
    mkv_clear_global_error();
    if (!out_cache)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_load_json: null out_cache");
    *out_cache = NULL;
    if (!path)
        return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_load_json: null path");

    status = mkv_dump_read_file(path, &d, err);
    if (status != MKV_STATUS_OK) return mkv_fail_global(status, "%s", err);

    mkv_state_view_t view;
    mkv_dump_view(&d, &view);
    mkv_first_violation_t first = {"", 0};
    int64_t n = mkv_state_check(&view, mkv_keep_first_violation, &first);
    if (n != 0) {
        status =
            n < 0 ? mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "%s: out of memory checking it", path)
                  : mkv_fail(err, MKV_STATUS_CORRUPT,
                             "%s: the dump violates %lld invariant%s (see `mixkv inspect`); "
                             "first: %s",
                             path, (long long)n, n == 1 ? "" : "s", first.message);
        goto fail;
    }

    mkv_cache_config_t cfg = d.config;
    cfg.backend = MKV_BACKEND_CPU;
    status = mkv_cache_create(&cfg, &cache);
    if (status != MKV_STATUS_OK) {
        mkv_fail(err, status, "%s: %s", path, mkv_last_error());
        goto fail;
    }
    MKV_TRY(restore(&d, &cache->st, err));

    /* Safety net: the restored live state (stale entries included) must check clean too. */
    first = (mkv_first_violation_t){"", 0};
    n = mkv_mm_state_check(&cache->st, mkv_keep_first_violation, &first);
    if (n != 0) {
        status =
            n < 0 ? mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "%s: out of memory checking it", path)
                  : mkv_fail(err, MKV_STATUS_INTERNAL, "%s: the restored cache fails its check: %s",
                             path, first.message);
        goto fail;
    }
    mkv_dump_free(&d);
    *out_cache = cache;
    return MKV_STATUS_OK;
fail:
    mkv_dump_free(&d);
    mkv_cache_destroy(cache);
    return mkv_fail_global(status, "%s", err);
}
