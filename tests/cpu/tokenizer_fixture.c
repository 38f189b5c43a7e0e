/*
 * tokenizer_fixture.c — see tokenizer_fixture.h.
 */
#include "tokenizer_fixture.h"

int32_t *tf_encode(const mkv_tokenizer_t *tok, const char *s, size_t len, int add_bos, int32_t *n)
{
    char err[MKV_ERR_LEN] = "";
    int32_t *ids = NULL;
    mkv_status_t st = mkv_tokenizer_encode(tok, s, len, add_bos, &ids, n, err);
    cr_assert_eq(st, MKV_STATUS_OK, "encode: %s (%s)", mkv_status_string(st), err);
    cr_assert(ids != NULL || *n == 0);
    return ids;
}

char *tf_decode(const mkv_tokenizer_t *tok, const int32_t *ids, int32_t n, int skip)
{
    char err[MKV_ERR_LEN] = "";
    char *s = NULL;
    mkv_status_t st = mkv_tokenizer_decode(tok, ids, n, skip, &s, err);
    cr_assert_eq(st, MKV_STATUS_OK, "decode: %s (%s)", mkv_status_string(st), err);
    return s;
}

char *tf_pieces(const mkv_tokenizer_t *tok, const int32_t *ids, int32_t n)
{
    size_t cap = 256 * (size_t)n + 1, len = 0;
    char *out = malloc(cap), buf[256];
    cr_assert(out != NULL);
    out[0] = '\0';
    for (int32_t i = 0; i < n; i++) {
        const char *p = mkv_tokenizer_piece(tok, i ? ids[i - 1] : -1, ids[i], buf, sizeof buf);
        memcpy(out + len, p, strlen(p) + 1);
        len += strlen(p);
    }
    return out;
}

void tf_expect_ids(const int32_t *got, int32_t n_got, const int32_t *want, int32_t n_want,
                   const char *what, const char *text)
{
    for (int32_t i = 0; i < n_got && i < n_want; i++)
        if (got[i] != want[i]) {
            cr_expect_eq(got[i], want[i], "%s: id %d is %d, want %d (text '%s')", what, i,
                         got[i], want[i], text);
            return;
        }
    cr_expect_eq(n_got, n_want, "%s: %d ids, want %d (text '%s')", what, n_got, n_want, text);
}

cJSON *tf_read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f != NULL, "cannot open %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert(s != NULL);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    s[n] = '\0';
    cJSON *root = cJSON_Parse(s);
    free(s);
    cr_assert(root != NULL, "%s: malformed JSON", path);
    return root;
}

int32_t *tf_ids(const cJSON *arr, int32_t *n)
{
    const cJSON *it;
    int32_t *ids = malloc(((size_t)cJSON_GetArraySize(arr) + 1) * sizeof *ids);
    cr_assert(ids != NULL);
    *n = 0;
    cJSON_ArrayForEach(it, arr) ids[(*n)++] = it->valueint;
    return ids;
}

/* ---------------------------------------------------------------------------------------- */
/* GGUF metadata (format v2/v3: little-endian, u64 lengths)                                 */
/* ---------------------------------------------------------------------------------------- */

enum { G_U8, G_I8, G_U16, G_I16, G_U32, G_I32, G_F32, G_BOOL, G_STR, G_ARR, G_U64, G_I64, G_F64 };

static uint64_t rd(FILE *f, int bytes)
{
    uint8_t b[8] = {0};
    cr_assert_eq(fread(b, 1, (size_t)bytes, f), (size_t)bytes, "GGUF: truncated");
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static char *rd_str(FILE *f, int32_t *len)
{
    uint64_t n = rd(f, 8);
    cr_assert(n < (1u << 20), "GGUF: string of %llu bytes", (unsigned long long)n);
    char *s = malloc(n + 1);
    cr_assert(s != NULL);
    cr_assert_eq(fread(s, 1, n, f), n, "GGUF: truncated");
    s[n] = '\0';
    if (len) *len = (int32_t)n;
    return s;
}

static void skip(FILE *f, uint32_t type)
{
    static const int size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    cr_assert(type <= G_F64, "GGUF: value type %u", type);
    if (type == G_STR) {
        free(rd_str(f, NULL));
    } else if (type == G_ARR) {
        uint32_t et = (uint32_t)rd(f, 4);
        uint64_t n = rd(f, 8);
        for (uint64_t i = 0; i < n; i++) skip(f, et);
    } else {
        cr_assert_eq(fseek(f, size[type], SEEK_CUR), 0);
    }
}

static char **rd_str_array(FILE *f, uint32_t type, int32_t *n, int32_t **lens)
{
    cr_assert(type == G_ARR && rd(f, 4) == G_STR, "GGUF: not a string array");
    *n = (int32_t)rd(f, 8);
    char **v = calloc((size_t)*n + 1, sizeof *v);
    *lens = calloc((size_t)*n + 1, sizeof **lens);
    cr_assert(v && *lens);
    for (int32_t i = 0; i < *n; i++) v[i] = rd_str(f, &(*lens)[i]);
    return v;
}

int tf_gguf_read(const char *path, tf_gguf_t *g)
{
    FILE *f = fopen(path, "rb");
    memset(g, 0, sizeof *g);
    g->bos = g->eos = g->unk = g->pad = -1;
    if (!f) return 0;
    cr_assert_eq(rd(f, 4), 0x46554747u, "%s: not GGUF", path); /* "GGUF" */
    cr_assert_geq(rd(f, 4), 2);
    rd(f, 8); /* tensor count */
    uint64_t n_kv = rd(f, 8);
    for (uint64_t k = 0; k < n_kv; k++) {
        char *key = rd_str(f, NULL);
        uint32_t type = (uint32_t)rd(f, 4);
        int32_t *id = strcmp(key, "tokenizer.ggml.bos_token_id") == 0 ? &g->bos
                      : strcmp(key, "tokenizer.ggml.eos_token_id") == 0 ? &g->eos
                      : strcmp(key, "tokenizer.ggml.unknown_token_id") == 0 ? &g->unk
                      : strcmp(key, "tokenizer.ggml.padding_token_id") == 0 ? &g->pad : NULL;
        if (id && type == G_U32) {
            *id = (int32_t)rd(f, 4);
        } else if (strcmp(key, "tokenizer.ggml.tokens") == 0) {
            g->tokens = rd_str_array(f, type, &g->n_tokens, &g->token_lens);
        } else if (strcmp(key, "tokenizer.ggml.merges") == 0) {
            g->merges = rd_str_array(f, type, &g->n_merges, &g->merge_lens);
        } else if (strcmp(key, "tokenizer.ggml.token_type") == 0) {
            cr_assert(type == G_ARR && rd(f, 4) == G_I32);
            int32_t n = (int32_t)rd(f, 8);
            g->token_types = malloc(((size_t)n + 1) * sizeof *g->token_types);
            cr_assert(g->token_types != NULL);
            for (int32_t i = 0; i < n; i++) g->token_types[i] = (int32_t)rd(f, 4);
        } else if (strcmp(key, "tokenizer.ggml.model") == 0 && type == G_STR) {
            g->model = rd_str(f, NULL);
        } else if (strcmp(key, "tokenizer.ggml.pre") == 0 && type == G_STR) {
            g->pre = rd_str(f, NULL);
        } else if (strcmp(key, "tokenizer.ggml.add_bos_token") == 0 && type == G_BOOL) {
            g->add_bos = (int)rd(f, 1);
        } else {
            skip(f, type);
        }
        free(key);
    }
    fclose(f);
    cr_assert(g->tokens && g->model, "%s: no tokenizer.ggml.tokens / model", path);
    return 1;
}

void tf_gguf_free(tf_gguf_t *g)
{
    for (int32_t i = 0; i < g->n_tokens; i++) free(g->tokens[i]);
    for (int32_t i = 0; i < g->n_merges; i++) free(g->merges[i]);
    free(g->tokens);
    free(g->merges);
    free(g->token_lens);
    free(g->merge_lens);
    free(g->token_types);
    free(g->model);
    free(g->pre);
}
