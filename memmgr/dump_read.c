/*
 * dump_read.c — reading JSON dumps back (docs/dump-format.md). Strict about structure, lenient
 * about invariants: a dump whose page lists contradict each other still reads, so that
 * `mixkv inspect` can report every violation; only what cannot be represented at all (a wrong
 * type, a non-integral or out-of-range number, an invalid config) is a parse error, with the
 * JSON path of the offending member in the message.
 */
#include "memmgr/dump.h"

#include "common/error.h"
#include "memmgr/cache.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Integers beyond 2^53 do not survive cJSON's double; no real counter gets near it. */
#define MKV_DUMP_INT_MAX ((int64_t)1 << 53)
#define PATH_LEN 128

/* ---------------------------------------------------------------------------------------- */
/* Reading                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t perr(char *err, const char *path, const char *fmt, ...) MKV_PRINTF(3, 4);
static mkv_status_t perr(char *err, const char *path, const char *fmt, ...)
{
    char msg[MKV_ERR_LEN - PATH_LEN - 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (path && path[0])
        return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "%.*s: %s", PATH_LEN, path, msg);
    return mkv_fail(err, MKV_STATUS_PARSE_ERROR, "%s", msg);
}

static const char *type_name(const cJSON *it)
{
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsArray(it)) return "an array";
    if (cJSON_IsObject(it)) return "an object";
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsNull(it)) return "null";
    return "something else";
}

static void join(char *path, const char *base, const char *key)
{
    snprintf(path, PATH_LEN, "%.80s%s%.40s", base, base[0] ? "." : "", key);
}

/* 0 with *out set, or -1 with the reason in why. */
static int to_int(const cJSON *it, int64_t lo, int64_t hi, int64_t *out, char *why, size_t why_len)
{
    if (!cJSON_IsNumber(it)) {
        snprintf(why, why_len, "expected an integer, found %s", type_name(it));
        return -1;
    }
    const double v = it->valuedouble;
    if (!isfinite(v) || v != floor(v)) {
        snprintf(why, why_len, "expected an integer, found %.17g", v);
        return -1;
    }
    if (lo < -MKV_DUMP_INT_MAX) lo = -MKV_DUMP_INT_MAX;
    if (hi > MKV_DUMP_INT_MAX) hi = MKV_DUMP_INT_MAX;
    if (v < (double)lo || v > (double)hi) {
        snprintf(why, why_len, "%.17g is out of range [%" PRId64 ", %" PRId64 "]", v, lo, hi);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static mkv_status_t get_item(const cJSON *obj, const char *base, const char *key,
                             cJSON_bool (*is)(const cJSON *const), const char *what,
                             const cJSON **out, char *err)
{
    char path[PATH_LEN];
    join(path, base, key);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) return perr(err, path, "missing");
    if (!is(it)) return perr(err, path, "expected %s, found %s", what, type_name(it));
    *out = it;
    return MKV_STATUS_OK;
}

static mkv_status_t get_int(const cJSON *obj, const char *base, const char *key, int64_t lo,
                            int64_t hi, int64_t *out, char *err)
{
    char path[PATH_LEN], why[160];
    join(path, base, key);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) return perr(err, path, "missing");
    if (to_int(it, lo, hi, out, why, sizeof why) != 0) return perr(err, path, "%s", why);
    return MKV_STATUS_OK;
}

static mkv_status_t get_i32(const cJSON *obj, const char *base, const char *key, int32_t *out,
                            char *err)
{
    int64_t v;
    mkv_status_t st = get_int(obj, base, key, INT32_MIN, INT32_MAX, &v, err);
    if (st == MKV_STATUS_OK) *out = (int32_t)v;
    return st;
}

/* Page ids of array arr (already type-checked) into dst. */
static mkv_status_t get_ids(const cJSON *arr, const char *path, int32_t *dst, char *err)
{
    char why[160];
    int64_t k = 0, v;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        if (to_int(e, INT32_MIN, INT32_MAX, &v, why, sizeof why) != 0)
            return perr(err, NULL, "%s[%" PRId64 "]: %s", path, k, why);
        dst[k++] = (int32_t)v;
    }
    return MKV_STATUS_OK;
}

static int is_group_field(const char *name)
{
    return strcmp(name, "hi_key_group") == 0 || strcmp(name, "hi_value_group") == 0 ||
           strcmp(name, "lo_key_group") == 0 || strcmp(name, "lo_value_group") == 0;
}

/* A version-1 config has one "quant_groups" (1, 2 or 4 groups per vector, every side) where
 * version 2 has four group sizes in elements: d / quant_groups for each side. */
static mkv_status_t convert_v1_groups(const cJSON *obj, mkv_cache_config_t *c, char *err)
{
    int64_t qg;
    mkv_status_t st = get_int(obj, "config", "quant_groups", 1, 4, &qg, err);
    if (st != MKV_STATUS_OK) return st;
    if (qg == 3) return perr(err, "config.quant_groups", "3 is not 1, 2 or 4");
    const int64_t e = c->head_dim > 0 ? c->head_dim / qg : 0;
    if (e < 16)
        return perr(err, "config.quant_groups",
                    "%" PRId64 " groups at head_dim %d are %" PRId64 " elements each, below the "
                    "16 this version supports", qg, c->head_dim, e);
    c->hi_key_group = c->hi_value_group = c->lo_key_group = c->lo_value_group = (int32_t)e;
    return MKV_STATUS_OK;
}

static mkv_status_t read_config(const cJSON *root, int version, mkv_dump_t *d, char *err)
{
    mkv_status_t status;
    const cJSON *obj = NULL, *it = NULL;
    char path[PATH_LEN], why[MKV_ERR_LEN];
    MKV_TRY(get_item(root, "", "config", cJSON_IsObject, "an object", &obj, err));
    mkv_cache_config_t c = MKV_CACHE_CONFIG_INIT;
    for (size_t i = 0; i < mkv_config_field_count; i++) {
        const mkv_config_field_t *f = &mkv_config_fields[i];
        void *p = (char *)&c + f->offset;
        int64_t v;
        if (version == 1 && is_group_field(f->name)) continue; /* convert_v1_groups */
        /* the fixed mix came after the format: a dump without it has none (0) */
        if (!strncmp(f->name, "mix_", 4) && !cJSON_GetObjectItem(obj, f->name)) continue;
        join(path, "config", f->name);
        switch (f->type) {
        case MKV_CF_I32:
            MKV_TRY(get_int(obj, "config", f->name, INT32_MIN, INT32_MAX, &v, err));
            *(int32_t *)p = (int32_t)v;
            break;
        case MKV_CF_I64:
            MKV_TRY(get_int(obj, "config", f->name, 1, INT64_MAX, &v, err));
            *(int64_t *)p = v;
            break;
        case MKV_CF_U32:
            MKV_TRY(get_int(obj, "config", f->name, 0, UINT32_MAX, &v, err));
            *(uint32_t *)p = (uint32_t)v;
            break;
        case MKV_CF_F32:
            MKV_TRY(get_item(obj, "config", f->name, cJSON_IsNumber, "a number", &it, err));
            if (!isfinite(it->valuedouble) || fabs(it->valuedouble) > FLT_MAX)
                return perr(err, path, "%.17g is not a finite float", it->valuedouble);
            *(float *)p = (float)it->valuedouble;
            break;
        case MKV_CF_FORMAT:
        case MKV_CF_BACKEND: {
            MKV_TRY(get_item(obj, "config", f->name, cJSON_IsString, "a string", &it, err));
            const int n = f->type == MKV_CF_FORMAT ? MKV_FORMAT_COUNT : MKV_BACKEND_CUDA + 1;
            int found = -1;
            for (int k = 0; k < n && found < 0; k++) {
                const char *name = f->type == MKV_CF_FORMAT ? mkv_format_name((mkv_format_t)k)
                                                       : mkv_backend_name((mkv_backend_t)k);
                if (strcmp(name, it->valuestring) == 0) found = k;
            }
            if (found < 0)
                return perr(err, path, "unknown %s '%.64s'",
                            f->type == MKV_CF_FORMAT ? "format" : "backend", it->valuestring);
            if (f->type == MKV_CF_FORMAT)
                *(mkv_format_t *)p = (mkv_format_t)found;
            else
                *(mkv_backend_t *)p = (mkv_backend_t)found;
            break;
        }
        }
    }
    if (version == 1) MKV_TRY(convert_v1_groups(obj, &c, err));
    /* Validate as a CPU config: a dump of a CUDA cache must be inspectable anywhere. */
    mkv_cache_config_t in = c, res;
    in.backend = MKV_BACKEND_CPU;
    in.pool_bytes = 0;
    if (mkv_config_resolve(&in, &res, &d->g, why) != MKV_STATUS_OK)
        return perr(err, NULL, "invalid config: %s", why);
    res.backend = c.backend;
    d->config = res;

    const int32_t derived[3] = {d->g.tpp_hi, d->g.tpp_lo, d->g.row_entries};
    static const char *const names[3] = {"tokens_per_page_hi", "tokens_per_page_lo", "row_entries"};
    MKV_TRY(get_item(root, "", "layout", cJSON_IsObject, "an object", &obj, err));
    for (int i = 0; i < 3; i++) {
        int32_t v;
        MKV_TRY(get_i32(obj, "layout", names[i], &v, err));
        if (v != derived[i]) {
            join(path, "layout", names[i]);
            return perr(err, path, "recorded %d but the config gives %d", v, derived[i]);
        }
    }
    return MKV_STATUS_OK;
fail:
    return status;
}

static mkv_status_t read_ring(const cJSON *root, mkv_dump_t *d, char *err)
{
    mkv_status_t status;
    const cJSON *ring, *arr;
    int64_t free_pages;
    MKV_TRY(get_item(root, "", "ring", cJSON_IsObject, "an object", &ring, err));
    MKV_TRY(get_int(ring, "ring", "head", INT64_MIN, INT64_MAX, &d->head, err));
    MKV_TRY(get_int(ring, "ring", "tail", INT64_MIN, INT64_MAX, &d->tail, err));
    MKV_TRY(get_int(ring, "ring", "free_pages", INT64_MIN, INT64_MAX, &free_pages, err));
    if (free_pages != d->tail - d->head)
        return perr(err, "ring.free_pages", "%" PRId64 " disagrees with tail - head = %" PRId64,
                    free_pages, d->tail - d->head);
    MKV_TRY(get_item(ring, "ring", "free", cJSON_IsArray, "an array", &arr, err));
    d->n_free_ids = cJSON_GetArraySize(arr);
    d->free_ids = malloc((size_t)(d->n_free_ids > 0 ? d->n_free_ids : 1) * sizeof *d->free_ids);
    if (!d->free_ids) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "dump: out of memory");
    MKV_TRY(get_ids(arr, "ring.free", d->free_ids, err));
    MKV_TRY(get_int(root, "", "reserved_pages", INT64_MIN, INT64_MAX, &d->reserved_total, err));
    return MKV_STATUS_OK;
fail:
    return status;
}

static mkv_status_t read_slots(const cJSON *root, mkv_dump_t *d, char *err)
{
    mkv_status_t status;
    const cJSON *arr, *e;
    char base[PATH_LEN];
    MKV_TRY(get_item(root, "", "slots", cJSON_IsArray, "an array", &arr, err));
    d->n_slots = cJSON_GetArraySize(arr);
    d->slots = calloc((size_t)(d->n_slots > 0 ? d->n_slots : 1), sizeof *d->slots);
    if (!d->slots) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "dump: out of memory");
    int32_t i = 0;
    cJSON_ArrayForEach(e, arr)
    {
        snprintf(base, sizeof base, "slots[%d]", i);
        if (!cJSON_IsObject(e))
            return perr(err, base, "expected an object, found %s", type_name(e));
        mkv_slot_view_t *s = &d->slots[i++];
        MKV_TRY(get_i32(e, base, "slot", &s->slot, err));
        MKV_TRY(get_i32(e, base, "seq_len", &s->seq_len, err));
        MKV_TRY(get_int(e, base, "reserved_pages", INT64_MIN, INT64_MAX, &s->reserved, err));
    }
    return MKV_STATUS_OK;
fail:
    return status;
}

static mkv_status_t read_rows(const cJSON *root, mkv_dump_t *d, char *err)
{
    mkv_status_t status;
    const cJSON *arr = NULL, *e = NULL, *hi = NULL, *lo = NULL;
    char base[PATH_LEN], path[PATH_LEN];
    MKV_TRY(get_item(root, "", "rows", cJSON_IsArray, "an array", &arr, err));

    /* Pass 1: shapes, so that one allocation holds every page id. */
    int64_t n_rows = 0, n_ids = 0;
    cJSON_ArrayForEach(e, arr)
    {
        snprintf(base, sizeof base, "rows[%" PRId64 "]", n_rows++);
        if (!cJSON_IsObject(e))
            return perr(err, base, "expected an object, found %s", type_name(e));
        MKV_TRY(get_item(e, base, "hi", cJSON_IsArray, "an array", &hi, err));
        MKV_TRY(get_item(e, base, "lo", cJSON_IsArray, "an array", &lo, err));
        n_ids += cJSON_GetArraySize(hi) + (int64_t)cJSON_GetArraySize(lo);
    }
    d->rows = calloc((size_t)(n_rows > 0 ? n_rows : 1), sizeof *d->rows);
    d->ids = malloc((size_t)(n_ids > 0 ? n_ids : 1) * sizeof *d->ids);
    if (!d->rows || !d->ids) return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "dump: out of memory");

    /* Pass 2: values. */
    int64_t r = 0, used = 0;
    cJSON_ArrayForEach(e, arr)
    {
        mkv_row_view_t *row = &d->rows[r];
        snprintf(base, sizeof base, "rows[%" PRId64 "]", r++);
        MKV_TRY(get_i32(e, base, "slot", &row->slot, err));
        MKV_TRY(get_i32(e, base, "layer", &row->layer, err));
        MKV_TRY(get_i32(e, base, "head", &row->head, err));
        MKV_TRY(get_i32(e, base, "n_hi", &row->n_hi, err));
        MKV_TRY(get_i32(e, base, "n_lo", &row->n_lo, err));
        hi = cJSON_GetObjectItemCaseSensitive(e, "hi");
        lo = cJSON_GetObjectItemCaseSensitive(e, "lo");
        row->k_hi = cJSON_GetArraySize(hi);
        row->k_lo = cJSON_GetArraySize(lo);
        row->hi = d->ids + used;
        join(path, base, "hi");
        MKV_TRY(get_ids(hi, path, d->ids + used, err));
        used += row->k_hi;
        row->lo = d->ids + used;
        join(path, base, "lo");
        MKV_TRY(get_ids(lo, path, d->ids + used, err));
        used += row->k_lo;
    }
    d->n_rows = n_rows;
    return MKV_STATUS_OK;
fail:
    return status;
}

/* A consistent dump lists every page of its pool once (free list or a row), and the checker
 * walks the whole pool with a record per page. Up to this many pages may be missing (each is
 * reported as leaked); beyond, the pool is not backed by the file: 2^31 pages claimed by a
 * 1 KB file would have `mixkv inspect` allocate 32 GB and walk them all. */
#define MKV_DUMP_MISSING_PAGES_MAX ((int64_t)1 << 20)

static mkv_status_t check_pool_listed(const mkv_dump_t *d, char *err)
{
    int64_t listed = d->n_free_ids;
    for (int64_t r = 0; r < d->n_rows; r++) listed += (int64_t)d->rows[r].k_hi + d->rows[r].k_lo;
    if (d->g.pool_pages - listed > MKV_DUMP_MISSING_PAGES_MAX)
        return perr(err, "config.pool_pages",
                    "%" PRId64 " pages but the dump lists only %" PRId64 " page ids (more than %"
                    PRId64 " pages missing: not a dump of a cache)",
                    d->g.pool_pages, listed, MKV_DUMP_MISSING_PAGES_MAX);
    return MKV_STATUS_OK;
}

/* Line and column (1-based) of byte offset pos. */
static void locate(const char *text, size_t pos, long *line, long *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

mkv_status_t mkv_dump_read_string(const char *json, size_t len, mkv_dump_t *out, char *err)
{
    mkv_status_t status = MKV_STATUS_OK;
    char local_err[MKV_ERR_LEN];
    if (!err) err = local_err;
    if (!out) return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_dump_read_string: null out");
    memset(out, 0, sizeof *out);
    if (!json) return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_dump_read_string: null json");

    size_t first = 0;
    while (first < len && is_space(json[first])) first++;
    if (first == len) return perr(err, NULL, "empty input: not a mixkv cache dump");

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t pos = end && end >= json && (size_t)(end - json) <= len ? (size_t)(end - json) : len;
        long line, col;
        locate(json, pos, &line, &col);
        return perr(err, NULL, "invalid JSON at line %ld, column %ld (byte %zu of %zu)%s", line,
                    col, pos, len,
                    pos + 1 >= len ? ": the input ends before the document is complete (truncated?)"
                                   : "");
    }
    size_t pos = (size_t)(end - json);
    while (pos < len && is_space(json[pos])) pos++;
    if (pos < len) {
        long line, col;
        locate(json, pos, &line, &col);
        status = perr(err, NULL, "unexpected data after the JSON document at line %ld, column %ld",
                      line, col);
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        status = perr(err, NULL, "not a mixkv cache dump: the top level is %s, not an object",
                      type_name(root));
        goto fail;
    }

    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(it)) {
        status =
            perr(err, NULL,
                 "not a mixkv cache dump (no \"format\": \"" MKV_DUMP_FORMAT_NAME "\" member)");
        goto fail;
    }
    if (strcmp(it->valuestring, MKV_DUMP_FORMAT_NAME) != 0) {
        status = perr(err, NULL, "not a mixkv cache dump (format is '%.64s', expected '%s')",
                      it->valuestring, MKV_DUMP_FORMAT_NAME);
        goto fail;
    }
    it = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (!cJSON_IsNumber(it)) {
        status = perr(err, "version", "missing or not a number");
        goto fail;
    }
    if (it->valuedouble != MKV_DUMP_FORMAT_VERSION && it->valuedouble != MKV_DUMP_FORMAT_OLDEST) {
        status = perr(err, NULL, "unsupported dump version %.17g (this mixkv reads versions %d "
                                 "to %d)", it->valuedouble, MKV_DUMP_FORMAT_OLDEST,
                      MKV_DUMP_FORMAT_VERSION);
        goto fail;
    }
    const int version = (int)it->valuedouble;
    MKV_TRY(get_item(root, "", "mixkv_version", cJSON_IsString, "a string", &it, err));
    snprintf(out->mixkv_version, sizeof out->mixkv_version, "%s", it->valuestring);

    out->version = version;
    MKV_TRY(read_config(root, version, out, err));
    MKV_TRY(read_ring(root, out, err));
    MKV_TRY(read_slots(root, out, err));
    MKV_TRY(read_rows(root, out, err));
    MKV_TRY(check_pool_listed(out, err));
    cJSON_Delete(root);
    return MKV_STATUS_OK;
fail:
    cJSON_Delete(root);
    mkv_dump_free(out);
    return status;
}

mkv_status_t mkv_dump_read_file(const char *path, mkv_dump_t *out, char *err)
{
    char local_err[MKV_ERR_LEN], why[MKV_ERR_LEN];
    if (!err) err = local_err;
    if (!out) return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_dump_read_file: null out");
    memset(out, 0, sizeof *out);
    if (!path) return mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_dump_read_file: null path");

    const int from_stdin = strcmp(path, "-") == 0;
    FILE *f = from_stdin ? stdin : fopen(path, "rb");
    if (!f) return mkv_fail(err, MKV_STATUS_IO_ERROR, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (!from_stdin) fclose(f);
        return mkv_fail(err, MKV_STATUS_IO_ERROR, "%s: is a directory", path);
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    int read_error = 0, oom = 0;
    for (;;) {
        if (len + 1 >= cap) {
            size_t ncap = cap ? cap * 2 : 1 << 16;
            char *p = realloc(text, ncap);
            if (!p) {
                oom = 1;
                break;
            }
            text = p;
            cap = ncap;
        }
        size_t n = fread(text + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) {
            read_error = ferror(f);
            break;
        }
    }
    const int saved_errno = errno;
    if (!from_stdin) fclose(f);
    if (oom || read_error) {
        free(text);
        if (oom)
            return mkv_fail(err, MKV_STATUS_OUT_OF_MEMORY, "%s: out of memory reading it", path);
        return mkv_fail(err, MKV_STATUS_IO_ERROR, "%s: read error: %s", path,
                        strerror(saved_errno));
    }
    text[len] = '\0';
    mkv_status_t status = mkv_dump_read_string(text, len, out, why);
    free(text);
    if (status != MKV_STATUS_OK) return mkv_fail(err, status, "%s: %s", path, why);
    return MKV_STATUS_OK;
}

void mkv_dump_free(mkv_dump_t *d)
{
    if (!d) return;
    free(d->free_ids);
    free(d->slots);
    free(d->rows);
    free(d->ids);
    memset(d, 0, sizeof *d);
}

void mkv_dump_view(const mkv_dump_t *d, mkv_state_view_t *out)
{
    memset(out, 0, sizeof *out);
    out->g = d->g;
    out->head = d->head;
    out->tail = d->tail;
    out->free_ids = d->free_ids;
    out->n_free_ids = d->n_free_ids;
    out->slots = d->slots;
    out->n_slots = d->n_slots;
    out->reserved_total = d->reserved_total;
    out->rows = d->rows;
    out->n_rows = d->n_rows;
}

