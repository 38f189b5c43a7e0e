/*
 * model.c — loads a Hugging Face Llama-family folder (docs/model.md) into an mkv_model_t:
 * config.json through cJSON, then the weights from model.safetensors or from the shards that
 * model.safetensors.index.json names. A regular file instead of a folder is a GGUF file
 * (runner/model_gguf.c).
 *
 * Safetensors files are memory-mapped read-only. F32 tensors whose data is 4-byte aligned in
 * the mapping are used in place; unaligned F32, F16 and BF16 tensors are converted into owned
 * fp32 buffers. The mappings and buffers live in the model's `storage` until mkv_model_free.
 * NOTE: the file's bytes are read as little-endian, which is also how they are used in place,
 * so the loader assumes a little-endian host (every platform mixkv targets).
 */
#include "runner/model.h"

#include "runner/error.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <float.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DIMS 8

typedef struct st_tensor {
    char *name;
    char dtype[16];      /* as the header spells it: "F32", "BF16", ... */
    int32_t ndim;
    int64_t shape[MAX_DIMS];
    const uint8_t *data; /* into the file's mapping */
    int64_t nbytes;
    int32_t file;        /* index into storage.files */
} st_tensor_t;

typedef struct st_file {
    char *name;  /* file name inside the model folder */
    void *map;   /* [len] bytes, PROT_READ */
    size_t len;
} st_file_t;

/* What mkv_model_t.storage points to. */
typedef struct storage {
    st_file_t *files;      /* [n_files] mapped safetensors files */
    int32_t n_files, cap_files;
    st_tensor_t *tensors;  /* [n_tensors] the headers' entries; freed once loading ends */
    int32_t n_tensors, cap_tensors;
    void **owned;          /* [n_owned] converted tensors, GGUF weights and layers */
    int32_t n_owned, cap_owned;
    mkv_layer_weights_t *layers; /* [n_layers] */
} storage_t;

/* ---------------------------------------------------------------------------------------- */
/* Small helpers                                                                            */
/* ---------------------------------------------------------------------------------------- */

static int grow(void **arr, int32_t *cap, int32_t need, size_t elem)
{
    if (need <= *cap) return 1;
    int32_t c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *p = realloc(*arr, (size_t)c * elem);
    if (!p) return 0;
    *arr = p;
    *cap = c;
    return 1;
}

static void path_join(char *out, size_t len, const char *dir, const char *name)
{
    snprintf(out, len, "%s/%s", dir, name);
}

/* Opens path for reading, refusing anything but a regular file. O_NONBLOCK: opening a FIFO
 * would otherwise wait for a writer (it has no effect on a regular file's reads). */
static mkv_status_t open_regular(const char *path, int *fd_out, struct stat *sb, char *err)
{
    const int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, sb) != 0) {
        const int e = errno;
        close(fd);
        return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb->st_mode)) {
        const int isdir = S_ISDIR(sb->st_mode);
        close(fd);
        return runner_fail(err, MKV_STATUS_IO_ERROR, "%s is %s, not a regular file", path,
                        isdir ? "a directory" : "a FIFO, device or socket");
    }
    *fd_out = fd;
    return MKV_STATUS_OK;
}

/* Reads a whole text file (NUL-terminated, malloc'ed). */
static mkv_status_t read_text(const char *path, char **out, char *err)
{
    struct stat sb;
    int fd;
    mkv_status_t st = open_regular(path, &fd, &sb, err);
    if (st != MKV_STATUS_OK) return st;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(errno));
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot read %s: out of memory",
                                path);
            }
            buf = p;
        }
        const size_t got = fread(buf + len, 1, 4096, f);
        len += got;
        if (got < 4096) break;
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot read %s", path);
    }
    buf[len] = '\0';
    *out = buf;
    return MKV_STATUS_OK;
}

static mkv_status_t parse_json_file(const char *path, cJSON **out, char *err)
{
    char *text = NULL;
    mkv_status_t status = read_text(path, &text, err);
    if (status != MKV_STATUS_OK) return status;
    *out = cJSON_Parse(text);
    free(text);
    if (!*out) return runner_fail(err, MKV_STATUS_PARSE_ERROR, "%s: malformed JSON", path);
    return MKV_STATUS_OK;
}

/* A JSON number that is a non-negative integer up to 2^53. */
static int json_uint(const cJSON *j, int64_t *out)
{
    if (!cJSON_IsNumber(j)) return 0;
    const double v = j->valuedouble;
    if (!(v >= 0.0 && v <= 9007199254740992.0) || v != (double)(int64_t)v) return 0;
    *out = (int64_t)v;
    return 1;
}

static void shape_str(char *buf, size_t len, int32_t ndim, const int64_t *shape)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int32_t i = 0; i < ndim && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (at < len) snprintf(buf + at, len - at, "]");
}

/* ---------------------------------------------------------------------------------------- */
/* config.json                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* An int32 field: absent or null gives def (or PARSE_ERROR when def < 0, i.e. required). */
static mkv_status_t cfg_int(const cJSON *root, const char *key, int32_t def, int32_t *out,
                            char *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    int64_t v;
    if (!j || cJSON_IsNull(j)) {
        if (def < 0) return runner_fail(err, MKV_STATUS_PARSE_ERROR, "config.json: %s is missing", key);
        *out = def;
        return MKV_STATUS_OK;
    }
    if (!json_uint(j, &v) || v < 1 || v > INT32_MAX)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "config.json: %s must be a positive integer",
                        key);
    *out = (int32_t)v;
    return MKV_STATUS_OK;
}

static mkv_status_t cfg_float(const cJSON *root, const char *key, double def, float *out,
                              char *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) {
        *out = (float)def;
        return MKV_STATUS_OK;
    }
    /* Within float's normal range: 1e300 would load as inf, 1e-300 as 0. */
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= FLT_MIN && j->valuedouble <= FLT_MAX))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "config.json: %s must be a positive number in float's range (%g to %g)",
                        key, (double)FLT_MIN, (double)FLT_MAX);
    *out = (float)j->valuedouble;
    return MKV_STATUS_OK;
}

/* A token id below vocab: an integer, null or absent (-1), or a list of ids (its first). */
static mkv_status_t cfg_token(const cJSON *root, const char *key, int32_t vocab, int32_t *out,
                              char *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    int64_t v;
    *out = -1;
    if (!j || cJSON_IsNull(j)) return MKV_STATUS_OK;
    const cJSON *e = cJSON_IsArray(j) ? j->child : j;
    if (cJSON_IsArray(j) && !e) return MKV_STATUS_OK; /* an empty list: none */
    for (; e; e = cJSON_IsArray(j) ? e->next : NULL) {
        if (!json_uint(e, &v) || v >= vocab)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                            "config.json: %s must be a token id below vocab_size %d (or a list "
                            "of them)",
                            key, vocab);
        if (*out < 0) *out = (int32_t)v;
    }
    return MKV_STATUS_OK;
}

/* A boolean field: true, false, null or absent (false); anything else is refused, so that
 * "yes" or 1 is not silently read as one or the other. */
static mkv_status_t cfg_bool(const cJSON *root, const char *key, int32_t *out, char *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (j && !cJSON_IsNull(j) && !cJSON_IsBool(j))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "config.json: %s must be true or false", key);
    *out = cJSON_IsTrue(j);
    return MKV_STATUS_OK;
}

/* A field that must be a string when present (null counts as absent). */
static mkv_status_t cfg_string(const cJSON *root, const char *key, char *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (j && !cJSON_IsNull(j) && !cJSON_IsString(j))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "config.json: %s must be a string", key);
    return MKV_STATUS_OK;
}

static mkv_status_t parse_config(const char *dir, mkv_model_config_t *c, char *err)
{
    static const char *const archs[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                        "Qwen2ForCausalLM"};
    char path[4096];
    cJSON *root = NULL;
    mkv_status_t status;
    path_join(path, sizeof path, dir, "config.json");
    RUNNER_TRY(parse_json_file(path, &root, err));

    if (!cJSON_IsObject(root)) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR, "%s: not a JSON object", path);
        goto fail;
    }
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_GetArrayItem(a, 0);
    if (!cJSON_IsArray(a) || !cJSON_IsString(a0)) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                          "%s: architectures must be a list of strings (architectures[0] is "
                          "missing)",
                          path);
        goto fail;
    }
    RUNNER_TRY(cfg_string(root, "model_type", err));
    RUNNER_TRY(cfg_string(root, "torch_dtype", err));
    int arch = -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(a0->valuestring, archs[i]) == 0) arch = i;
    if (arch < 0) {
        status = runner_fail(err, MKV_STATUS_UNSUPPORTED,
                          "%s: architecture %s is not supported (LlamaForCausalLM, "
                          "MistralForCausalLM, Qwen2ForCausalLM)",
                          path, a0->valuestring);
        goto fail;
    }

    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rs && !cJSON_IsNull(rs) && !cJSON_IsObject(rs)) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR, "%s: rope_scaling must be an object or null",
                          path);
        goto fail;
    }
    if (rs && !cJSON_IsNull(rs)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
        status = runner_fail(err, MKV_STATUS_UNSUPPORTED, "%s: rope_scaling (%s) is not supported",
                          path, cJSON_IsString(t) ? t->valuestring : "set");
        goto fail;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
        status = runner_fail(err, MKV_STATUS_UNSUPPORTED,
                          "%s: hidden_act %s is not supported (silu only)", path,
                          cJSON_IsString(act) ? act->valuestring : "(not a string)");
        goto fail;
    }
    static const char *const flags[] = {"attention_bias", "mlp_bias", "use_sliding_window"};
    for (int i = 0; i < 3; i++) {
        int32_t on = 0;
        RUNNER_TRY(cfg_bool(root, flags[i], &on, err));
        if (on) {
            status = runner_fail(err, MKV_STATUS_UNSUPPORTED, "%s: %s is not supported", path,
                              flags[i]);
            goto fail;
        }
    }

    memset(c, 0, sizeof *c);
    RUNNER_TRY(cfg_int(root, "hidden_size", -1, &c->hidden, err));
    RUNNER_TRY(cfg_int(root, "num_hidden_layers", -1, &c->n_layers, err));
    RUNNER_TRY(cfg_int(root, "num_attention_heads", -1, &c->n_heads, err));
    RUNNER_TRY(cfg_int(root, "num_key_value_heads", c->n_heads, &c->n_kv_heads, err));
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (hd && !cJSON_IsNull(hd) && !cJSON_IsNumber(hd)) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR, "config.json: head_dim must be a positive integer");
        goto fail;
    }
    if (c->hidden % c->n_heads != 0 && (!hd || cJSON_IsNull(hd))) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                          "config.json: hidden_size %d is not a multiple of num_attention_heads %d",
                          c->hidden, c->n_heads);
        goto fail;
    }
    RUNNER_TRY(cfg_int(root, "head_dim", c->hidden / c->n_heads, &c->head_dim, err));
    RUNNER_TRY(cfg_int(root, "intermediate_size", -1, &c->intermediate, err));
    RUNNER_TRY(cfg_int(root, "vocab_size", -1, &c->vocab, err));
    RUNNER_TRY(cfg_int(root, "max_position_embeddings", -1, &c->max_pos, err));
    RUNNER_TRY(cfg_float(root, "rope_theta", 10000.0, &c->rope_theta, err));
    RUNNER_TRY(cfg_float(root, "rms_norm_eps", 1e-6, &c->rms_eps, err));
    RUNNER_TRY(cfg_bool(root, "tie_word_embeddings", &c->tied, err));
    RUNNER_TRY(cfg_token(root, "bos_token_id", c->vocab, &c->bos, err));
    RUNNER_TRY(cfg_token(root, "eos_token_id", c->vocab, &c->eos, err));
    if (c->n_heads % c->n_kv_heads != 0) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                          "config.json: num_attention_heads %d is not a multiple of "
                          "num_key_value_heads %d",
                          c->n_heads, c->n_kv_heads);
        goto fail;
    }
    if (c->head_dim % 2 != 0) {
        status = runner_fail(err, MKV_STATUS_UNSUPPORTED, "config.json: odd head_dim %d", c->head_dim);
        goto fail;
    }
    /* Mistral's sliding window: within it attention is plain causal attention, so the model
     * is exact up to that many positions; the cache has no windowed attention beyond. */
    const cJSON *swj = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    int64_t sw = 0; /* 0 or null: no window */
    if (swj && !cJSON_IsNull(swj) && (!json_uint(swj, &sw) || sw > INT32_MAX)) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                          "config.json: sliding_window must be a non-negative integer or null");
        goto fail;
    }
    if (arch == 1 && sw >= 1 && sw < c->max_pos) c->max_pos = (int32_t)sw;
    cJSON_Delete(root);
    return MKV_STATUS_OK;
fail:
    cJSON_Delete(root);
    return status;
}

/* ---------------------------------------------------------------------------------------- */
/* Safetensors                                                                              */
/* ---------------------------------------------------------------------------------------- */

static int64_t dtype_size(const char *dt)
{
    if (strcmp(dt, "F32") == 0) return 4;
    if (strcmp(dt, "F16") == 0 || strcmp(dt, "BF16") == 0) return 2;
    return 0; /* unsupported: only the offsets are checked */
}

static st_tensor_t *find_tensor(storage_t *s, const char *name)
{
    for (int32_t i = 0; i < s->n_tensors; i++)
        if (strcmp(s->tensors[i].name, name) == 0) return &s->tensors[i];
    return NULL;
}

/* One header entry: checks it and appends it to the tensor table. */
static mkv_status_t add_tensor(storage_t *s, int32_t file, const cJSON *e, const uint8_t *base,
                               uint64_t avail, char *err)
{
    const char *fname = s->files[file].name, *name = e->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    int64_t begin, end;
    if (!cJSON_IsString(dt) || strlen(dt->valuestring) >= 16 || !cJSON_IsArray(sh) ||
        cJSON_GetArraySize(sh) > MAX_DIMS || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        !json_uint(cJSON_GetArrayItem(off, 0), &begin) ||
        !json_uint(cJSON_GetArrayItem(off, 1), &end) || begin > end)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "%s: tensor %s: malformed entry (dtype, shape, data_offsets)", fname, name);
    if ((uint64_t)end > avail)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "%s: tensor %s: data_offsets [%lld, %lld] run past the end of the data "
                        "(%llu bytes)",
                        fname, name, (long long)begin, (long long)end, (unsigned long long)avail);
    if (find_tensor(s, name))
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "%s: tensor %s appears twice", fname, name);
    if (!grow((void **)&s->tensors, &s->cap_tensors, s->n_tensors + 1, sizeof(st_tensor_t)))
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "out of memory reading %s", fname);
    st_tensor_t *t = &s->tensors[s->n_tensors];
    memset(t, 0, sizeof *t);
    int64_t numel = 1;
    t->ndim = cJSON_GetArraySize(sh);
    for (int32_t i = 0; i < t->ndim; i++) {
        if (!json_uint(cJSON_GetArrayItem(sh, i), &t->shape[i]) || t->shape[i] > INT32_MAX)
            return runner_fail(err, MKV_STATUS_PARSE_ERROR, "%s: tensor %s: malformed shape", fname,
                            name);
        /* Saturate past the data's size: such a shape cannot match its offsets anyway. */
        numel = (double)numel * (double)t->shape[i] > (double)avail ? (int64_t)avail + 1
                                                                     : numel * t->shape[i];
    }
    strcpy(t->dtype, dt->valuestring);
    const int64_t es = dtype_size(t->dtype);
    if (es && numel * es != end - begin) {
        char sbuf[128];
        shape_str(sbuf, sizeof sbuf, t->ndim, t->shape);
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "%s: tensor %s: data_offsets span %lld bytes, shape %s of %s needs %lld",
                        fname, name, (long long)(end - begin), sbuf, t->dtype,
                        (long long)(numel * es));
    }
    t->name = strdup(name);
    if (!t->name) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "out of memory reading %s", fname);
    t->data = base + begin;
    t->nbytes = end - begin;
    t->file = file;
    s->n_tensors++;
    return MKV_STATUS_OK;
}

/* Maps dir/fname and adds its tensors to the table. */
static mkv_status_t open_safetensors(storage_t *s, const char *dir, const char *fname, char *err)
{
    char path[4096];
    path_join(path, sizeof path, dir, fname);
    struct stat sb;
    int fd;
    mkv_status_t st = open_regular(path, &fd, &sb, err);
    if (st != MKV_STATUS_OK) return st;
    if (sb.st_size < 8) {
        close(fd);
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "%s: too short for a safetensors header",
                        path);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot map %s: %s", path, strerror(errno));
    if (!grow((void **)&s->files, &s->cap_files, s->n_files + 1, sizeof(st_file_t))) {
        munmap(map, (size_t)sb.st_size);
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "out of memory reading %s", path);
    }
    const int32_t file = s->n_files;
    s->files[file] = (st_file_t){strdup(fname), map, (size_t)sb.st_size};
    s->n_files++;
    if (!s->files[file].name) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "out of memory");

    const uint8_t *b = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    const uint64_t size = (uint64_t)sb.st_size;
    if (hlen > size - 8)
        return runner_fail(err, MKV_STATUS_PARSE_ERROR,
                        "%s: header of %llu bytes runs past the end of the file (%llu bytes)",
                        path, (unsigned long long)hlen, (unsigned long long)size);
    cJSON *h = cJSON_ParseWithLength((const char *)b + 8, (size_t)hlen);
    if (!cJSON_IsObject(h)) {
        cJSON_Delete(h);
        return runner_fail(err, MKV_STATUS_PARSE_ERROR, "%s: malformed JSON header", path);
    }
    mkv_status_t status = MKV_STATUS_OK;
    for (const cJSON *e = h->child; e && status == MKV_STATUS_OK; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        status = add_tensor(s, file, e, b + 8 + hlen, size - 8 - hlen, err);
    }
    cJSON_Delete(h);
    return status;
}

/* model.safetensors.index.json: every shard its weight_map names, each tensor in its shard. */
static mkv_status_t open_sharded(storage_t *s, const char *dir, const char *index, char *err)
{
    cJSON *root = NULL;
    mkv_status_t status;
    RUNNER_TRY(parse_json_file(index, &root, err));
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR, "%s: no weight_map", index);
        goto fail;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
            status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                              "%s: weight_map[%s] must be a file name in the folder", index,
                              e->string);
            goto fail;
        }
        int32_t seen = 0;
        for (int32_t f = 0; f < s->n_files; f++) seen |= strcmp(s->files[f].name, e->valuestring) == 0;
        if (!seen) RUNNER_TRY(open_safetensors(s, dir, e->valuestring, err));
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        const st_tensor_t *t = find_tensor(s, e->string);
        if (!t || strcmp(s->files[t->file].name, e->valuestring) != 0) {
            status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                              "%s: weight_map puts %s in %s, which does not hold it", index,
                              e->string, e->valuestring);
            goto fail;
        }
    }
    cJSON_Delete(root);
    return MKV_STATUS_OK;
fail:
    cJSON_Delete(root);
    return status;
}

/* ---------------------------------------------------------------------------------------- */
/* Tensors to fp32                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* The fp32 data of tensor `name` of shape dims[ndim]. */
static mkv_status_t get_tensor(storage_t *s, const char *name, int32_t ndim, int64_t d0,
                               int64_t d1, const float **out, char *err)
{
    const int64_t want[2] = {d0, d1};
    char wbuf[64], fbuf[128];
    shape_str(wbuf, sizeof wbuf, ndim, want);
    const st_tensor_t *t = find_tensor(s, name);
    if (!t) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "missing tensor %s (shape %s)", name, wbuf);
    int same = t->ndim == ndim;
    for (int32_t i = 0; same && i < ndim; i++) same = t->shape[i] == want[i];
    if (!same) {
        shape_str(fbuf, sizeof fbuf, t->ndim, t->shape);
        return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                        "tensor %s: expected shape %s, found %s", name, wbuf, fbuf);
    }
    const int64_t n = ndim == 1 ? d0 : d0 * d1;
    const int is32 = strcmp(t->dtype, "F32") == 0, is16 = strcmp(t->dtype, "F16") == 0;
    const int isbf = strcmp(t->dtype, "BF16") == 0;
    if (!is32 && !is16 && !isbf)
        return runner_fail(err, MKV_STATUS_UNSUPPORTED,
                        "tensor %s has dtype %s (supported: F32, F16, BF16)", name, t->dtype);
    if (is32 && (uintptr_t)t->data % sizeof(float) == 0) {
        *out = (const float *)(const void *)t->data;
        return MKV_STATUS_OK;
    }
    if (!grow((void **)&s->owned, &s->cap_owned, s->n_owned + 1, sizeof(void *)))
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "out of memory converting %s", name);
    float *buf = malloc((size_t)n * sizeof(float));
    if (!buf) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "out of memory converting %s", name);
    s->owned[s->n_owned++] = buf;
    if (is32) memcpy(buf, t->data, (size_t)n * sizeof(float)); /* unaligned in the file */
    else /* the library's exact conversions (little-endian, as the file) */
        (void)mkv_convert(buf, MKV_DTYPE_F32, t->data, is16 ? MKV_DTYPE_F16 : MKV_DTYPE_BF16, n);
    *out = buf;
    return MKV_STATUS_OK;
}

static mkv_status_t load_weights(mkv_model_t *m, storage_t *s, char *err)
{
    const mkv_model_config_t *c = &m->cfg;
    const int64_t D = c->hidden, V = c->vocab, I = c->intermediate;
    const int64_t QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    mkv_status_t status;
    /* Qwen2's q/k/v biases (or any other) would silently change the model: refuse them. */
    for (int32_t i = 0; i < s->n_tensors; i++) {
        const char *nm = s->tensors[i].name;
        const size_t len = strlen(nm);
        if (len >= 5 && strcmp(nm + len - 5, ".bias") == 0)
            return runner_fail(err, MKV_STATUS_UNSUPPORTED, "tensor %s: biases are not supported", nm);
    }
    /* Tied checkpoints may hold either name once (torch's shared-tensor dedup keeps one: the
     * bundled TinyStories file has only lm_head.weight). */
    const char *emb = "model.embed_tokens.weight";
    if (c->tied && !find_tensor(s, emb) && find_tensor(s, "lm_head.weight")) emb = "lm_head.weight";
    RUNNER_TRY(get_tensor(s, emb, 2, V, D, &m->embed, err));
    if (c->tied) m->lm_head = m->embed;
    else RUNNER_TRY(get_tensor(s, "lm_head.weight", 2, V, D, &m->lm_head, err));
    RUNNER_TRY(get_tensor(s, "model.norm.weight", 1, D, 0, &m->final_norm, err));
    for (int32_t l = 0; l < c->n_layers; l++) {
        mkv_layer_weights_t *w = &s->layers[l];
        char nm[128];
#define LAYER_TENSOR(field, suffix, nd, a, b)                                                  \
    do {                                                                                       \
        snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, suffix);                       \
        RUNNER_TRY(get_tensor(s, nm, nd, a, b, &w->field, err));                                  \
    } while (0)
        LAYER_TENSOR(attn_norm, "input_layernorm", 1, D, 0);
        LAYER_TENSOR(wq, "self_attn.q_proj", 2, QD, D);
        LAYER_TENSOR(wk, "self_attn.k_proj", 2, KD, D);
        LAYER_TENSOR(wv, "self_attn.v_proj", 2, KD, D);
        LAYER_TENSOR(wo, "self_attn.o_proj", 2, D, QD);
        LAYER_TENSOR(mlp_norm, "post_attention_layernorm", 1, D, 0);
        LAYER_TENSOR(w_gate, "mlp.gate_proj", 2, I, D);
        LAYER_TENSOR(w_up, "mlp.up_proj", 2, I, D);
        LAYER_TENSOR(w_down, "mlp.down_proj", 2, D, I);
#undef LAYER_TENSOR
    }
    return MKV_STATUS_OK;
fail:
    return status;
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                             */
/* ---------------------------------------------------------------------------------------- */

static void free_tensor_table(storage_t *s)
{
    for (int32_t i = 0; i < s->n_tensors; i++) free(s->tensors[i].name);
    free(s->tensors);
    s->tensors = NULL;
    s->n_tensors = s->cap_tensors = 0;
}

void *mkv_model_own(mkv_model_t *m, size_t bytes, char *err)
{
    storage_t *s = m->storage;
    void *p = NULL;
    if (grow((void **)&s->owned, &s->cap_owned, s->n_owned + 1, sizeof(void *)))
        p = malloc(bytes ? bytes : 1);
    if (!p) {
        runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "out of memory (%zu bytes)", bytes);
        return NULL;
    }
    s->owned[s->n_owned++] = p;
    return p;
}

void mkv_model_free(mkv_model_t *m)
{
    if (!m) return;
    storage_t *s = m->storage;
    if (s) {
        free_tensor_table(s);
        for (int32_t i = 0; i < s->n_owned; i++) free(s->owned[i]);
        free(s->owned);
        for (int32_t i = 0; i < s->n_files; i++) {
            munmap(s->files[i].map, s->files[i].len);
            free(s->files[i].name);
        }
        free(s->files);
        free(s->layers);
        free(s);
    }
    free(m);
}

/* dir: a model folder, or a GGUF file. */
mkv_status_t mkv_model_load(const char *dir, mkv_model_t **out, char *err)
{
    char local[MKV_ERR_LEN], path[4096];
    mkv_status_t status;
    mkv_model_t *m = NULL;
    storage_t *s = NULL;
    struct stat sb;
    if (!err) err = local;
    err[0] = '\0';
    if (out) *out = NULL;
    if (!dir || !out) {
        status = runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_model_load: null dir or out");
        goto fail;
    }
    m = calloc(1, sizeof *m);
    s = m ? calloc(1, sizeof *s) : NULL;
    if (!s) {
        status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the model");
        goto fail;
    }
    m->storage = s;
    if (stat(dir, &sb) != 0) {
        status = runner_fail(err, MKV_STATUS_IO_ERROR, "cannot open %s: %s", dir, strerror(errno));
        goto fail;
    }
    if (!S_ISDIR(sb.st_mode)) { /* a GGUF file; anything but a regular file is refused there */
        RUNNER_TRY(mkv_model_load_gguf(dir, m, err));
        *out = m;
        return MKV_STATUS_OK;
    }
    RUNNER_TRY(parse_config(dir, &m->cfg, err));

    path_join(path, sizeof path, dir, "model.safetensors");
    if (stat(path, &sb) == 0) {
        RUNNER_TRY(open_safetensors(s, dir, "model.safetensors", err));
    } else {
        path_join(path, sizeof path, dir, "model.safetensors.index.json");
        if (stat(path, &sb) != 0) {
            status = runner_fail(err, MKV_STATUS_IO_ERROR,
                              "%s: neither model.safetensors nor model.safetensors.index.json",
                              dir);
            goto fail;
        }
        RUNNER_TRY(open_sharded(s, dir, path, err));
    }
    /* Nine tensors per layer: bounds num_hidden_layers by the files before allocating. */
    if ((int64_t)m->cfg.n_layers * 9 > s->n_tensors) {
        status = runner_fail(err, MKV_STATUS_PARSE_ERROR,
                          "config.json: num_hidden_layers %d, but the weights hold only %d tensors",
                          m->cfg.n_layers, s->n_tensors);
        goto fail;
    }
    s->layers = calloc((size_t)m->cfg.n_layers, sizeof *s->layers);
    if (!s->layers) {
        status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate %d layers",
                          m->cfg.n_layers);
        goto fail;
    }
    m->layers = s->layers;
    RUNNER_TRY(load_weights(m, s, err));
    free_tensor_table(s);
    *out = m;
    return MKV_STATUS_OK;
fail:
    mkv_model_free(m);
    (void)mkv_report_error(MKV_STATUS_OK, "%s", err);
    return status;
}

void mkv_model_cache_config(const mkv_model_t *m, const mkv_cache_config_t *base,
                            mkv_cache_config_t *out)
{
    mkv_model_config_cache(&m->cfg, base, out);
}

void mkv_model_config_cache(const mkv_model_config_t *c, const mkv_cache_config_t *base,
                            mkv_cache_config_t *out)
{
    *out = *base;
    out->n_layers = c->n_layers;
    out->n_kv_heads = c->n_kv_heads;
    out->group_size = c->n_heads / c->n_kv_heads;
    out->head_dim = c->head_dim;
    /* Never beyond the trained positions; base's limit when it is smaller. */
    if (base->max_seq_len <= 0 || base->max_seq_len > c->max_pos)
        out->max_seq_len = c->max_pos;
}

mkv_status_t mkv_model_config_load(const char *path, mkv_model_config_t *out, char *err)
{
    char local[MKV_ERR_LEN], dir[4096];
    if (!err) err = local;
    if (!path || !out) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_model_config_load: null argument");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return runner_fail(err, MKV_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(errno));
    snprintf(dir, sizeof dir, "%s", path);
    if (!S_ISDIR(sb.st_mode)) { /* a config.json: its folder */
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
    }
    mkv_model_config_t c;
    memset(&c, 0, sizeof c);
    const mkv_status_t st = parse_config(dir, &c, err);
    if (st == MKV_STATUS_OK) *out = c;
    return st;
}

mkv_status_t mkv_model_config_builtin(const char *name, mkv_model_config_t *out, char *err)
{
    char local[MKV_ERR_LEN];
    if (!err) err = local;
    if (!name || !out) return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_model_config_builtin: null argument");
    /* The config.json of Meta-Llama-3-8B and of Meta-Llama-3-70B (tensor parallelism's shape). */
    static const struct {
        const char *name;
        mkv_model_config_t c;
    } shapes[] = {
        {"llama-3-8b", {.hidden = 4096, .n_layers = 32, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
                        .intermediate = 14336, .vocab = 128256, .max_pos = 8192, .rope_theta = 500000.0f,
                        .rms_eps = 1e-5f, .tied = 0, .bos = 128000, .eos = 128001}},
        {"llama-3-70b", {.hidden = 8192, .n_layers = 80, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128,
                         .intermediate = 28672, .vocab = 128256, .max_pos = 8192, .rope_theta = 500000.0f,
                         .rms_eps = 1e-5f, .tied = 0, .bos = 128000, .eos = 128001}},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (!strcmp(name, shapes[i].name)) {
            *out = shapes[i].c;
            return MKV_STATUS_OK;
        }
    return runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                       "no built-in model shape '%s' (known: llama-3-8b, llama-3-70b)", name);
}
