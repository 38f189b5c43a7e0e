/*
 * fuzz_util.c — the shared temp folder and the tiny model of the fuzz targets (fuzz_util.h).
 */
#include "fuzz_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* mkdtemp is POSIX 2008 but glibc declares it only with _XOPEN_SOURCE >= 700 or _DEFAULT_SOURCE. */
char *mkdtemp(char *template_);

static char dir_path[64];

static void remove_dir(void)
{
    DIR *d = opendir(dir_path);
    if (d) {
        char path[512];
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir_path);
}

const char *fuzz_dir(void)
{
    if (!dir_path[0]) {
        snprintf(dir_path, sizeof dir_path, "/tmp/mkv_fuzz_XXXXXX");
        if (!mkdtemp(dir_path)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(remove_dir);
    }
    return dir_path;
}

void fuzz_path(char *out, size_t len, const char *name)
{
    if ((size_t)snprintf(out, len, "%s/%s", fuzz_dir(), name) >= len) abort();
}

const char *fuzz_write(const char *name, const void *data, size_t n)
{
    static char path[512];
    fuzz_path(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        abort();
    }
    return path;
}

int fuzz_verbose(void)
{
    static int v = -1;
    if (v < 0) v = getenv("MKV_FUZZ_VERBOSE") != NULL;
    return v;
}

/* ---------------------------------------------------------------------------------------- */
/* JSON-aware mutation                                                                      */
/* ---------------------------------------------------------------------------------------- */

#define MAX_NODES 4096

static void collect_nodes(cJSON *n, cJSON **nodes, int *count)
{
    for (; n && *count < MAX_NODES; n = n->next) {
        nodes[(*count)++] = n;
        collect_nodes(n->child, nodes, count);
    }
}

char *fuzz_mutate_json(const char *in, size_t n, unsigned int seed, const char *const *strings,
                       int n_strings)
{
    static const double edges[] = {0, 1, -1, 2, 3, 4, 7, 8, 16, 255, 256, 65535, 65536,
                                   2147483647.0, -2147483648.0, 2147483648.0, 4294967295.0,
                                   9007199254740992.0, -9007199254740992.0, 1e300, 0.5};
    static cJSON *nodes[MAX_NODES];
    cJSON *root = cJSON_ParseWithLength(in, n);
    if (!root) return NULL;
    int count = 0;
    collect_nodes(root, nodes, &count);
    cJSON *node = nodes[seed % (unsigned)count];
    const unsigned r = (seed / MAX_NODES) % 4, pick = seed >> 16;
    if (cJSON_IsNumber(node)) {
        const double v = r == 0   ? node->valuedouble + 1
                         : r == 1 ? node->valuedouble - 1
                                  : edges[pick % (sizeof edges / sizeof edges[0])];
        cJSON_SetNumberValue(node, v);
    } else if (cJSON_IsArray(node) && node->child) {
        const int k = (int)(pick % (unsigned)cJSON_GetArraySize(node));
        if (r < 2)
            cJSON_AddItemToArray(node, cJSON_Duplicate(cJSON_GetArrayItem(node, k), 1));
        else
            cJSON_DeleteItemFromArray(node, k);
    } else if (cJSON_IsString(node) && n_strings > 0) {
        cJSON_SetValuestring(node, strings[pick % (unsigned)n_strings]);
    }
    char *printed = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    char *out = printed ? strdup(printed) : NULL; /* malloc'ed, as promised */
    cJSON_free(printed);
    return out;
}

/* ---------------------------------------------------------------------------------------- */
/* The tiny model                                                                           */
/* ---------------------------------------------------------------------------------------- */

const char fuzz_tiny_config[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 8, \"num_hidden_layers\": 1,\n"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"intermediate_size\": 8,\n"
    " \"vocab_size\": 16, \"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-06,\n"
    " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\",\n"
    " \"bos_token_id\": 1, \"eos_token_id\": 2, \"rope_scaling\": null}\n";

typedef struct tiny_tensor {
    const char *name, *dtype;
    int ndim;
    int64_t shape[2];
} tiny_tensor_t;

/* Every dtype the loader converts, on both the in-place and the converted paths. */
static const tiny_tensor_t tiny_tensors[] = {
    {"model.embed_tokens.weight", "F16", 2, {16, 8}},
    {"lm_head.weight", "BF16", 2, {16, 8}},
    {"model.norm.weight", "F32", 1, {8, 0}},
    {"model.layers.0.input_layernorm.weight", "F32", 1, {8, 0}},
    {"model.layers.0.self_attn.q_proj.weight", "F32", 2, {8, 8}},
    {"model.layers.0.self_attn.k_proj.weight", "F16", 2, {4, 8}},
    {"model.layers.0.self_attn.v_proj.weight", "BF16", 2, {4, 8}},
    {"model.layers.0.self_attn.o_proj.weight", "F32", 2, {8, 8}},
    {"model.layers.0.post_attention_layernorm.weight", "F32", 1, {8, 0}},
    {"model.layers.0.mlp.gate_proj.weight", "F32", 2, {8, 8}},
    {"model.layers.0.mlp.up_proj.weight", "BF16", 2, {8, 8}},
    {"model.layers.0.mlp.down_proj.weight", "F16", 2, {8, 8}},
};
#define N_TINY (sizeof tiny_tensors / sizeof tiny_tensors[0])

void fuzz_tiny_safetensors(uint8_t **out, size_t *len)
{
    char header[4096];
    size_t at = 0;
    int64_t off = 0, nbytes[N_TINY];
    at += (size_t)snprintf(header + at, sizeof header - at, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < N_TINY; i++) {
        const tiny_tensor_t *t = &tiny_tensors[i];
        const int64_t es = strcmp(t->dtype, "F32") == 0 ? 4 : 2;
        nbytes[i] = es * t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
        char shape[48];
        if (t->ndim == 2)
            snprintf(shape, sizeof shape, "%lld,%lld", (long long)t->shape[0], (long long)t->shape[1]);
        else
            snprintf(shape, sizeof shape, "%lld", (long long)t->shape[0]);
        at += (size_t)snprintf(header + at, sizeof header - at,
                               ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%lld,%lld]}",
                               t->name, t->dtype, shape, (long long)off, (long long)(off + nbytes[i]));
        off += nbytes[i];
    }
    at += (size_t)snprintf(header + at, sizeof header - at, "}");
    while (at % 8) header[at++] = ' '; /* the format pads the header to 8 bytes */
    if (at >= sizeof header) abort();

    *len = 8 + at + (size_t)off;
    uint8_t *b = malloc(*len);
    if (!b) abort();
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)at >> (8 * i));
    memcpy(b + 8, header, at);
    uint8_t *p = b + 8 + at;
    for (size_t i = 0; i < N_TINY; i++) {
        const int f32 = strcmp(tiny_tensors[i].dtype, "F32") == 0;
        const int bf16 = strcmp(tiny_tensors[i].dtype, "BF16") == 0;
        for (int64_t k = 0; k < nbytes[i]; k += f32 ? 4 : 2) {
            /* Little-endian 0.125 + k/1024-ish bit patterns: small, finite, varied. */
            if (f32) {
                const uint32_t bits = 0x3E000000u + (uint32_t)k * 0x1000u;
                for (int j = 0; j < 4; j++) p[k + j] = (uint8_t)(bits >> (8 * j));
            } else {
                const uint16_t bits = (uint16_t)((bf16 ? 0x3E00u : 0x3000u) + (uint32_t)k);
                p[k] = (uint8_t)bits;
                p[k + 1] = (uint8_t)(bits >> 8);
            }
        }
        p += nbytes[i];
    }
    *out = b;
}
