/*
 * gguf.c — the GGUF reader of gguf.h: maps the file read-only, walks the header, the metadata
 * and the tensor infos with a bounds-checked cursor, then checks the tensors against the data
 * section. Nothing is read through a count, length or offset from the file before it has been
 * compared with the bytes that remain, and every product of such numbers is checked for
 * overflow first, so a hostile file costs at most memory proportional to its own size.
 *
 * Keys and tensor names are sorted once (qsort of indices) so that duplicates are found and
 * lookups are binary searches even for files with millions of entries.
 * NOTE: multi-byte fields are assembled byte by byte (little-endian), so neither the host's
 * byte order nor the alignment of the mapping matters while parsing.
 */
#include "runner/gguf.h"

#include "runner/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define HEADER_BYTES 24u /* magic, version, n_tensors, n_kv */
/* The least bytes a kv pair and a tensor info can take: bounds the counts before allocating. */
#define MIN_KV_BYTES 14u     /* key length, a 1-byte key, type, a 1-byte value */
#define MIN_TENSOR_BYTES 33u /* name length, a 1-byte name, n_dims, one dim, type, offset */

struct mkv_gguf {
    const uint8_t *map;          /* [size] PROT_READ */
    uint64_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_start;         /* offset of the data section in the file */
    int64_t n_kv, n_tensors;
    mkv_gguf_kv_t *kv;           /* [n_kv] file order */
    mkv_gguf_tensor_t *tensors;  /* [n_tensors] file order */
    int64_t *kv_sorted;          /* [n_kv] indices by key */
    int64_t *t_sorted;           /* [n_tensors] indices by name */
};

/* ---------------------------------------------------------------------------------------- */
/* Cursor                                                                                   */
/* ---------------------------------------------------------------------------------------- */

typedef struct cursor {
    const uint8_t *p;
    uint64_t size, pos;
} cursor_t;

static uint64_t left(const cursor_t *c) { return c->size - c->pos; }

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int rd(cursor_t *c, int n, uint64_t *v)
{
    if (left(c) < (uint64_t)n) return 0;
    *v = le(c->p + c->pos, n);
    c->pos += (uint64_t)n;
    return 1;
}

/* A string: its length field, then that many bytes (checked against what remains). */
static int rd_str(cursor_t *c, mkv_gguf_str_t *s)
{
    uint64_t len;
    if (!rd(c, 8, &len) || len > left(c)) return 0;
    s->ptr = (const char *)c->p + c->pos;
    s->len = len;
    c->pos += len;
    return 1;
}

static int type_size(uint32_t t)
{
    switch (t) {
    case MKV_GGUF_U8: case MKV_GGUF_I8: case MKV_GGUF_BOOL: return 1;
    case MKV_GGUF_U16: case MKV_GGUF_I16: return 2;
    case MKV_GGUF_U32: case MKV_GGUF_I32: case MKV_GGUF_F32: return 4;
    case MKV_GGUF_U64: case MKV_GGUF_I64: case MKV_GGUF_F64: return 8;
    default: return 0; /* STRING, ARRAY, unknown */
    }
}

static int is_signed(uint32_t t)
{
    return t == MKV_GGUF_I8 || t == MKV_GGUF_I16 || t == MKV_GGUF_I32 || t == MKV_GGUF_I64;
}

static double bits_f64(uint64_t u, int n)
{
    if (n == 4) {
        const uint32_t w = (uint32_t)u;
        float f;
        memcpy(&f, &w, 4);
        return f;
    }
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static int64_t sign_extend(uint64_t u, int n)
{
    if (n == 8) return (int64_t)u;
    const uint64_t m = 1ull << (8 * n - 1);
    return (int64_t)((u ^ m) - m);
}

static const char *const type_names[MKV_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};

static const char *tname(uint32_t t) { return t < MKV_GGUF_TYPE_COUNT ? type_names[t] : "?"; }

/* ---------------------------------------------------------------------------------------- */
/* Parsing                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* The value of kv[i] (its type already read and known). */
static mkv_status_t read_value(cursor_t *c, int64_t i, mkv_gguf_kv_t *kv,
                               char *err)
{
    const char *k = kv->key;
    const uint64_t at = c->pos;
    if (kv->type == MKV_GGUF_STRING) {
        if (!rd_str(c, &kv->str))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "kv[%lld] '%s': string at byte %llu runs past the end of the file",
                            (long long)i, k, (unsigned long long)at);
        return MKV_STATUS_OK;
    }
    if (kv->type != MKV_GGUF_ARRAY) {
        const int n = type_size(kv->type);
        uint64_t u;
        if (!rd(c, n, &u))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "kv[%lld] '%s': %s value at byte %llu runs past the end of the file",
                            (long long)i, k, tname(kv->type), (unsigned long long)at);
        if (kv->type == MKV_GGUF_F32 || kv->type == MKV_GGUF_F64) kv->num.f64 = bits_f64(u, n);
        else if (is_signed(kv->type)) kv->num.i64 = sign_extend(u, n);
        else kv->num.u64 = u;
        if (kv->type == MKV_GGUF_BOOL && u > 1)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "kv[%lld] '%s': bool value %llu",
                            (long long)i, k, (unsigned long long)u);
        return MKV_STATUS_OK;
    }
    uint64_t et, count;
    if (!rd(c, 4, &et) || !rd(c, 8, &count))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "kv[%lld] '%s': array header at byte %llu runs past the end of the file",
                        (long long)i, k, (unsigned long long)at);
    if (et >= MKV_GGUF_TYPE_COUNT)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "kv[%lld] '%s': unknown array element type %llu", (long long)i, k,
                        (unsigned long long)et);
    if (et == MKV_GGUF_ARRAY)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "kv[%lld] '%s': nested arrays",
                        (long long)i, k);
    kv->arr_type = (mkv_gguf_type_t)et;
    kv->arr_count = count;
    if (et != MKV_GGUF_STRING) {
        const uint64_t es = (uint64_t)type_size((uint32_t)et);
        if (count > left(c) / es) /* count * es would run past the end (or overflow) */
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "kv[%lld] '%s': array of %llu %s runs past the end of the file",
                            (long long)i, k, (unsigned long long)count, tname((uint32_t)et));
        kv->arr_data = c->p + c->pos;
        c->pos += count * es;
        return MKV_STATUS_OK;
    }
    if (count > left(c) / 8)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "kv[%lld] '%s': array of %llu strings runs past the end of the file",
                        (long long)i, k, (unsigned long long)count);
    kv->arr_str_off = malloc((size_t)(count ? count : 1) * sizeof(uint64_t));
    if (!kv->arr_str_off)
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "kv[%lld] '%s': out of memory",
                        (long long)i, k);
    for (uint64_t e = 0; e < count; e++) {
        mkv_gguf_str_t s;
        kv->arr_str_off[e] = c->pos;
        if (!rd_str(c, &s))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "kv[%lld] '%s': string %llu of %llu runs past the end of the file",
                            (long long)i, k, (unsigned long long)e, (unsigned long long)count);
    }
    return MKV_STATUS_OK;
}

static mkv_status_t read_kvs(mkv_gguf_t *g, cursor_t *c, char *err)
{
    for (int64_t i = 0; i < g->n_kv; i++) {
        mkv_gguf_kv_t *kv = &g->kv[i];
        mkv_gguf_str_t key;
        uint64_t t;
        const uint64_t at = c->pos;
        if (!rd_str(c, &key))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "kv[%lld]: key at byte %llu runs past the end of the file",
                            (long long)i, (unsigned long long)at);
        if (key.len == 0 || memchr(key.ptr, 0, (size_t)key.len))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "kv[%lld]: %s key", (long long)i,
                            key.len ? "NUL byte in the" : "empty");
        char *copy = malloc((size_t)key.len + 1);
        if (!copy) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "kv[%lld]: out of memory", (long long)i);
        memcpy(copy, key.ptr, (size_t)key.len);
        copy[key.len] = '\0';
        kv->key = copy;
        if (!rd(c, 4, &t))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "kv[%lld] '%s': type runs past the end of the file", (long long)i, copy);
        if (t >= MKV_GGUF_TYPE_COUNT)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "kv[%lld] '%s': unknown value type %llu",
                            (long long)i, copy, (unsigned long long)t);
        kv->type = (mkv_gguf_type_t)t;
        mkv_status_t st = read_value(c, i, kv, err);
        if (st != MKV_STATUS_OK) return st;
    }
    return MKV_STATUS_OK;
}

static mkv_status_t read_tensor_infos(mkv_gguf_t *g, cursor_t *c, char *err)
{
    for (int64_t i = 0; i < g->n_tensors; i++) {
        mkv_gguf_tensor_t *t = &g->tensors[i];
        mkv_gguf_str_t name;
        uint64_t v;
        const uint64_t at = c->pos;
        if (!rd_str(c, &name))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "tensor info %lld: name at byte %llu runs past the end of the file",
                            (long long)i, (unsigned long long)at);
        if (name.len == 0 || name.len > MKV_GGUF_MAX_NAME || memchr(name.ptr, 0, (size_t)name.len))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "tensor info %lld: name of %llu bytes (1 to %d, no NUL byte)",
                            (long long)i, (unsigned long long)name.len, MKV_GGUF_MAX_NAME);
        memcpy(t->name, name.ptr, (size_t)name.len);
        t->name[name.len] = '\0';
        if (!rd(c, 4, &v))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tensor %s: n_dims past the end of the file",
                            t->name);
        if (v < 1 || v > MKV_GGUF_MAX_DIMS)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tensor %s: n_dims %llu (1 to %d)",
                            t->name, (unsigned long long)v, MKV_GGUF_MAX_DIMS);
        t->n_dims = (int32_t)v;
        int64_t n = 1;
        for (int d = 0; d < MKV_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (int d = 0; d < t->n_dims; d++) {
            if (!rd(c, 8, &v))
                return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                                "tensor %s: ne[%d] past the end of the file", t->name, d);
            if (v > (uint64_t)INT64_MAX || (v && (uint64_t)n > (uint64_t)INT64_MAX / v))
                return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                                "tensor %s: ne[%d] = %llu: the element count overflows", t->name,
                                d, (unsigned long long)v);
            t->ne[d] = (int64_t)v;
            n *= (int64_t)v;
        }
        t->n_elements = n;
        if (!rd(c, 4, &v))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tensor %s: type past the end of the file",
                            t->name);
        int64_t be, bb;
        if (!mkv_ggml_block((uint32_t)v, &be, &bb))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tensor %s: unknown ggml type %llu",
                            t->name, (unsigned long long)v);
        t->type = (uint32_t)v;
        if (t->ne[0] % be != 0)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "tensor %s: ne0 = %lld is not a multiple of the %s block (%lld)",
                            t->name, (long long)t->ne[0], mkv_ggml_type_name(t->type),
                            (long long)be);
        /* n / be blocks of bb bytes; compared with the file's size before multiplying. */
        const uint64_t blocks = (uint64_t)(n / be);
        if (blocks > g->size / (uint64_t)bb)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "tensor %s: %lld elements of %s are larger than the file", t->name,
                            (long long)n, mkv_ggml_type_name(t->type));
        t->nbytes = blocks * (uint64_t)bb;
        if (!rd(c, 8, &t->offset))
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "tensor %s: offset past the end of the file",
                            t->name);
    }
    return MKV_STATUS_OK;
}

/* general.alignment: a u32 power of two (absent: 32). */
static mkv_status_t read_alignment(mkv_gguf_t *g, char *err)
{
    g->alignment = MKV_GGUF_DEFAULT_ALIGNMENT;
    const mkv_gguf_kv_t *a = mkv_gguf_find(g, "general.alignment");
    if (!a) return MKV_STATUS_OK;
    if (a->type != MKV_GGUF_U32 || a->num.u64 == 0 || (a->num.u64 & (a->num.u64 - 1)) != 0)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "general.alignment must be a u32 power of two (found %s %llu)",
                        tname(a->type), (unsigned long long)a->num.u64);
    g->alignment = a->num.u64;
    return MKV_STATUS_OK;
}

/* qsort has no context argument: the entries carry their names (or offsets) with them. */
typedef struct name_ref {
    const char *name;
    int64_t index;
} name_ref_t;

static int cmp_name(const void *a, const void *b)
{
    const name_ref_t *x = a, *y = b;
    const int r = strcmp(x->name, y->name);
    return r ? r : (x->index > y->index) - (x->index < y->index);
}

typedef struct off_ref {
    uint64_t offset;
    int64_t index;
} off_ref_t;

static int cmp_off(const void *a, const void *b)
{
    const off_ref_t *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Sorts names[n] into sorted[n] (indices); the first duplicate's index in *dup, else -1. */
static void sort_names(name_ref_t *refs, int64_t n, int64_t *sorted, int64_t *dup)
{
    qsort(refs, (size_t)n, sizeof *refs, cmp_name);
    *dup = -1;
    for (int64_t i = 0; i < n; i++) {
        sorted[i] = refs[i].index;
        if (i && *dup < 0 && strcmp(refs[i].name, refs[i - 1].name) == 0) *dup = refs[i].index;
    }
}

static mkv_status_t index_and_check(mkv_gguf_t *g, char *err)
{
    const int64_t most = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    name_ref_t *refs = malloc((size_t)(most ? most : 1) * sizeof *refs);
    off_ref_t *offs = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *offs);
    mkv_status_t status = MKV_STATUS_OK;
    int64_t dup;
    if (!refs || !offs) {
        status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "out of memory indexing the file");
        goto done;
    }
    for (int64_t i = 0; i < g->n_kv; i++) refs[i] = (name_ref_t){g->kv[i].key, i};
    sort_names(refs, g->n_kv, g->kv_sorted, &dup);
    if (dup >= 0) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR, "kv[%lld]: key '%s' appears twice",
                          (long long)dup, g->kv[dup].key);
        goto done;
    }
    for (int64_t i = 0; i < g->n_tensors; i++) refs[i] = (name_ref_t){g->tensors[i].name, i};
    sort_names(refs, g->n_tensors, g->t_sorted, &dup);
    if (dup >= 0) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR, "tensor %s appears twice",
                          g->tensors[dup].name);
        goto done;
    }
    status = read_alignment(g, err); /* needs the sorted keys */
    if (status != MKV_STATUS_OK) goto done;
    /* The data section starts at the first aligned offset after the infos. */
    g->data_start = (g->data_start + g->alignment - 1) / g->alignment * g->alignment;
    const uint64_t avail = g->data_start <= g->size ? g->size - g->data_start : 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        mkv_gguf_tensor_t *t = &g->tensors[i];
        if (t->offset % g->alignment != 0) {
            status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                              "tensor %s: offset %llu is not a multiple of the alignment %llu",
                              t->name, (unsigned long long)t->offset,
                              (unsigned long long)g->alignment);
            goto done;
        }
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                              "tensor %s: data [%llu, +%llu) runs past the end of the data "
                              "section (%llu bytes)",
                              t->name, (unsigned long long)t->offset,
                              (unsigned long long)t->nbytes, (unsigned long long)avail);
            goto done;
        }
        t->data = g->map + g->data_start + t->offset;
        offs[i] = (off_ref_t){t->offset, i};
    }
    qsort(offs, (size_t)g->n_tensors, sizeof *offs, cmp_off);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const mkv_gguf_tensor_t *a = &g->tensors[offs[i - 1].index], *b = &g->tensors[offs[i].index];
        if (a->offset + a->nbytes > b->offset) { /* no overflow: both within the file */
            status = runner_fail(err, MKV_STATUS_PARSE_ERROR, "tensors %s and %s overlap", a->name,
                              b->name);
            goto done;
        }
    }
done:
    free(refs);
    free(offs);
    return status;
}

/* ---------------------------------------------------------------------------------------- */
/* Open and close                                                                           */
/* ---------------------------------------------------------------------------------------- */

void mkv_gguf_close(mkv_gguf_t *g)
{
    if (!g) return;
    for (int64_t i = 0; g->kv && i < g->n_kv; i++) {
        free((char *)g->kv[i].key);
        free(g->kv[i].arr_str_off);
    }
    free(g->kv);
    free(g->tensors);
    free(g->kv_sorted);
    free(g->t_sorted);
    if (g->map) munmap((void *)g->map, (size_t)g->size);
    free(g);
}

/* Maps path (a regular file, at least HEADER_BYTES long). */
static mkv_status_t map_file(const char *path, mkv_gguf_t *g, char *err)
{
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. */
    const int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        const int e = errno;
        close(fd);
        return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return runner_fail(err, MKV_STATUS_IO_ERROR, "%s is %s, not a regular file", path,
                        S_ISDIR(sb.st_mode) ? "a directory" : S_ISFIFO(sb.st_mode) ? "a FIFO"
                                                                                  : "a special file");
    }
    if ((uint64_t)sb.st_size < HEADER_BYTES) {
        close(fd);
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "%s: %lld bytes, too short for a GGUF header (%u)", path,
                        (long long)sb.st_size, HEADER_BYTES);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    close(fd);
    if (map == MAP_FAILED) return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot map %s: %s", path, strerror(e));
    g->map = map;
    g->size = (uint64_t)sb.st_size;
    return MKV_STATUS_OK;
}

static mkv_status_t parse(mkv_gguf_t *g, char *err)
{
    cursor_t c = {g->map, g->size, 0};
    uint64_t version = 0, nt = 0, nkv = 0;
    if (memcmp(g->map, GGUF_MAGIC, 4) != 0)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "bad magic %02x %02x %02x %02x (a GGUF file starts with \"GGUF\")",
                        g->map[0], g->map[1], g->map[2], g->map[3]);
    c.pos = 4;
    rd(&c, 4, &version); /* the header's length is checked by map_file */
    if (version == 1)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED, "GGUF version 1 is not supported (2 and 3)");
    if (version != 2 && version != 3)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "GGUF version %llu is not supported (2 and 3%s)", (unsigned long long)version,
                        (version & 0xffff) == 0 ? "; a big-endian file?" : "");
    g->version = (uint32_t)version;
    rd(&c, 8, &nt);
    rd(&c, 8, &nkv);
    if (nkv > left(&c) / MIN_KV_BYTES)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "n_kv = %llu: more pairs than the file's %llu bytes can hold",
                        (unsigned long long)nkv, (unsigned long long)g->size);
    if (nt > left(&c) / MIN_TENSOR_BYTES)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "n_tensors = %llu: more tensor infos than the file's %llu bytes can hold",
                        (unsigned long long)nt, (unsigned long long)g->size);
    g->n_kv = (int64_t)nkv;
    g->n_tensors = (int64_t)nt;
    g->kv = calloc((size_t)(nkv ? nkv : 1), sizeof *g->kv);
    g->kv_sorted = calloc((size_t)(nkv ? nkv : 1), sizeof *g->kv_sorted);
    g->tensors = calloc((size_t)(nt ? nt : 1), sizeof *g->tensors);
    g->t_sorted = calloc((size_t)(nt ? nt : 1), sizeof *g->t_sorted);
    if (!g->kv || !g->kv_sorted || !g->tensors || !g->t_sorted)
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "out of memory for %llu pairs, %llu tensors",
                        (unsigned long long)nkv, (unsigned long long)nt);
    mkv_status_t st = read_kvs(g, &c, err);
    if (st == MKV_STATUS_OK) st = read_tensor_infos(g, &c, err);
    if (st != MKV_STATUS_OK) return st;
    g->data_start = c.pos; /* aligned once the alignment is known */
    return index_and_check(g, err);
}

mkv_status_t mkv_gguf_open(const char *path, mkv_gguf_t **out, char *err)
{
    char local[MKV_ERR_LEN], msg[MKV_ERR_LEN];
    if (!err) err = local;
    err[0] = '\0';
    if (out) *out = NULL;
    if (!path || !out) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_gguf_open: null path or out");
    mkv_gguf_t *g = calloc(1, sizeof *g);
    if (!g) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the GGUF reader");
    mkv_status_t st = map_file(path, g, err);
    if (st == MKV_STATUS_OK) {
        st = parse(g, msg);
        if (st != MKV_STATUS_OK) runner_fail(err, st, "%s: %s", path, msg);
    }
    if (st != MKV_STATUS_OK) {
        mkv_gguf_close(g);
        return st;
    }
    *out = g;
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Accessors                                                                                */
/* ---------------------------------------------------------------------------------------- */

uint32_t mkv_gguf_version(const mkv_gguf_t *g) { return g->version; }
uint64_t mkv_gguf_alignment(const mkv_gguf_t *g) { return g->alignment; }
int64_t mkv_gguf_n_kv(const mkv_gguf_t *g) { return g->n_kv; }
int64_t mkv_gguf_n_tensors(const mkv_gguf_t *g) { return g->n_tensors; }

const mkv_gguf_kv_t *mkv_gguf_kv_at(const mkv_gguf_t *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const mkv_gguf_tensor_t *mkv_gguf_tensor_at(const mkv_gguf_t *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const mkv_gguf_kv_t *mkv_gguf_find(const mkv_gguf_t *g, const char *key)
{
    int64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        const int r = strcmp(g->kv[g->kv_sorted[mid]].key, key);
        if (r == 0) return &g->kv[g->kv_sorted[mid]];
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const mkv_gguf_tensor_t *mkv_gguf_find_tensor(const mkv_gguf_t *g, const char *name)
{
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        const int r = strcmp(g->tensors[g->t_sorted[mid]].name, name);
        if (r == 0) return &g->tensors[g->t_sorted[mid]];
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static mkv_status_t need(const mkv_gguf_t *g, const char *key, const mkv_gguf_kv_t **kv, char *err)
{
    *kv = mkv_gguf_find(g, key);
    if (!*kv) return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF key %s is missing", key);
    return MKV_STATUS_OK;
}

static mkv_status_t wrong(const char *key, const mkv_gguf_kv_t *kv, const char *want, char *err)
{
    return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF key %s: %s value where %s is expected",
                    key, tname(kv->type), want);
}

/* An integer kv within [lo, hi]. */
static mkv_status_t get_int(const mkv_gguf_t *g, const char *key, int64_t lo, int64_t hi,
                            const char *want, int64_t *out, char *err)
{
    const mkv_gguf_kv_t *kv;
    mkv_status_t st = need(g, key, &kv, err);
    if (st != MKV_STATUS_OK) return st;
    if (!type_size(kv->type) || kv->type == MKV_GGUF_BOOL || kv->type == MKV_GGUF_F32 ||
        kv->type == MKV_GGUF_F64)
        return wrong(key, kv, want, err);
    const int sg = is_signed(kv->type);
    if (sg ? kv->num.i64 < lo || kv->num.i64 > hi : kv->num.u64 > (uint64_t)hi) {
        if (sg)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF key %s: %lld does not fit %s", key,
                            (long long)kv->num.i64, want);
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "GGUF key %s: %llu does not fit %s", key,
                        (unsigned long long)kv->num.u64, want);
    }
    *out = sg ? kv->num.i64 : (int64_t)kv->num.u64;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_gguf_get_u32(const mkv_gguf_t *g, const char *key, uint32_t *out, char *err)
{
    int64_t v;
    mkv_status_t st = get_int(g, key, 0, UINT32_MAX, "a u32", &v, err);
    if (st == MKV_STATUS_OK) *out = (uint32_t)v;
    return st;
}

mkv_status_t mkv_gguf_get_i32(const mkv_gguf_t *g, const char *key, int32_t *out, char *err)
{
    int64_t v;
    mkv_status_t st = get_int(g, key, INT32_MIN, INT32_MAX, "an i32", &v, err);
    if (st == MKV_STATUS_OK) *out = (int32_t)v;
    return st;
}

mkv_status_t mkv_gguf_get_f32(const mkv_gguf_t *g, const char *key, float *out, char *err)
{
    const mkv_gguf_kv_t *kv;
    mkv_status_t st = need(g, key, &kv, err);
    if (st != MKV_STATUS_OK) return st;
    if (kv->type != MKV_GGUF_F32 && kv->type != MKV_GGUF_F64) return wrong(key, kv, "a float", err);
    *out = (float)kv->num.f64;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_gguf_get_bool(const mkv_gguf_t *g, const char *key, int *out, char *err)
{
    const mkv_gguf_kv_t *kv;
    mkv_status_t st = need(g, key, &kv, err);
    if (st != MKV_STATUS_OK) return st;
    if (kv->type != MKV_GGUF_BOOL) return wrong(key, kv, "a bool", err);
    *out = kv->num.u64 != 0;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_gguf_get_str(const mkv_gguf_t *g, const char *key, mkv_gguf_str_t *out,
                              char *err)
{
    const mkv_gguf_kv_t *kv;
    mkv_status_t st = need(g, key, &kv, err);
    if (st != MKV_STATUS_OK) return st;
    if (kv->type != MKV_GGUF_STRING) return wrong(key, kv, "a string", err);
    *out = kv->str;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_gguf_get_arr(const mkv_gguf_t *g, const char *key, mkv_gguf_type_t *elem,
                              uint64_t *count, char *err)
{
    const mkv_gguf_kv_t *kv;
    mkv_status_t st = need(g, key, &kv, err);
    if (st != MKV_STATUS_OK) return st;
    if (kv->type != MKV_GGUF_ARRAY) return wrong(key, kv, "an array", err);
    *elem = kv->arr_type;
    *count = kv->arr_count;
    return MKV_STATUS_OK;
}

mkv_gguf_str_t mkv_gguf_arr_str(const mkv_gguf_t *g, const mkv_gguf_kv_t *kv, uint64_t i)
{
    mkv_gguf_str_t s = {"", 0};
    if (!kv || kv->type != MKV_GGUF_ARRAY || kv->arr_type != MKV_GGUF_STRING || i >= kv->arr_count)
        return s;
    const uint64_t at = kv->arr_str_off[i]; /* checked while parsing */
    s.len = le(g->map + at, 8);
    s.ptr = (const char *)g->map + at + 8;
    return s;
}

int mkv_gguf_arr_int(const mkv_gguf_kv_t *kv, uint64_t i, int64_t *out)
{
    if (!kv || kv->type != MKV_GGUF_ARRAY || i >= kv->arr_count) return 0;
    const uint32_t t = kv->arr_type;
    const int n = type_size(t);
    if (!n || t == MKV_GGUF_F32 || t == MKV_GGUF_F64) return 0;
    const uint64_t u = le(kv->arr_data + i * (uint64_t)n, n);
    if (is_signed(t)) *out = sign_extend(u, n);
    else *out = u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u;
    return 1;
}

int mkv_gguf_arr_float(const mkv_gguf_kv_t *kv, uint64_t i, double *out)
{
    if (!kv || kv->type != MKV_GGUF_ARRAY || i >= kv->arr_count) return 0;
    const uint32_t t = kv->arr_type;
    if (t != MKV_GGUF_F32 && t != MKV_GGUF_F64) return 0;
    const int n = type_size(t);
    *out = bits_f64(le(kv->arr_data + i * (uint64_t)n, n), n);
    return 1;
}
