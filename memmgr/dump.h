/*
 * dump.h — JSON dumps of the memory manager's state (docs/dump-format.md): writing from a
 * live cache, reading back into a plain struct that `mixkv inspect` checks, summarises and
 * diffs, and restoring a cache from it.
 */
#ifndef MKV_MEMMGR_DUMP_H
#define MKV_MEMMGR_DUMP_H

#include "memmgr/state.h"
#include "mixkv.h"

#include <stddef.h>

#define MKV_DUMP_FORMAT_NAME "mixkv-cache-dump"
#define MKV_DUMP_FORMAT_VERSION 2 /* 2: four per-side group sizes replace quant_groups */
#define MKV_DUMP_FORMAT_OLDEST 1  /* version 1 is read and converted (docs/dump-format.md) */

/* A dump as read from a file. Structurally sound (every field present with the right type,
 * integers integral and within their types) but not checked against the invariants: row
 * lists may disagree with their counts or exceed T, and mkv_state_check on mkv_dump_view()
 * reports that. */
typedef struct mkv_dump {
    mkv_cache_config_t config; /* as recorded (resolved) */
    mkv_mm_geom_t g;           /* derived from config; recorded derived values must agree */
    char mixkv_version[32];    /* the library that wrote it */
    int32_t version;           /* the dump format version read (1 is converted on reading) */
    int64_t head, tail;
    int32_t *free_ids;         /* [n_free_ids] free region in ring order from head */
    int64_t n_free_ids;
    mkv_slot_view_t *slots;    /* [n_slots] active slots, ascending */
    int32_t n_slots;
    int64_t reserved_total;
    mkv_row_view_t *rows;      /* [n_rows] in file order; hi / lo point into ids */
    int64_t n_rows;
    int32_t *ids;              /* storage behind rows' hi and lo */
} mkv_dump_t;

/* The members of a dump's "config", in file order: one table for writing, reading and
 * `mixkv inspect --diff`. */
typedef enum mkv_config_field_type {
    MKV_CF_I32, MKV_CF_I64, MKV_CF_U32, MKV_CF_F32, MKV_CF_FORMAT, MKV_CF_BACKEND
} mkv_config_field_type_t;

typedef struct mkv_config_field {
    const char *name;
    mkv_config_field_type_t type;
    size_t offset; /* in mkv_cache_config_t */
} mkv_config_field_t;

extern const mkv_config_field_t mkv_config_fields[];
extern const size_t mkv_config_field_count;

struct cJSON;

/* The config as a JSON object, members in table order (int64 members as exact integers);
 * NULL when memory runs out. */
struct cJSON *mkv_dump_config_json(const mkv_cache_config_t *c);

/* One member's value as text: "32", "K8V4", "0.0199999996" (floats with 9 digits, exact). */
void mkv_dump_config_field_text(const mkv_cache_config_t *c, const mkv_config_field_t *f,
                                char *buf, size_t n);

/* Read a dump. PARSE_ERROR (truncated, malformed, wrong format name or version, a field
 * missing or of the wrong type, with the JSON path of the offending field in err) or
 * IO_ERROR. On failure *out is left empty (safe to mkv_dump_free). */
mkv_status_t mkv_dump_read_file(const char *path, mkv_dump_t *out, char *err);
mkv_status_t mkv_dump_read_string(const char *json, size_t len, mkv_dump_t *out, char *err);
void mkv_dump_free(mkv_dump_t *d);

/* A view over the dump for mkv_state_check (valid while d lives). */
void mkv_dump_view(const mkv_dump_t *d, mkv_state_view_t *out);

#endif /* MKV_MEMMGR_DUMP_H */
