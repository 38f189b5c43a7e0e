/*
 * test_model.c — the model loader (runner/model.c): the bundled TinyStories-656K folder
 * against its own safetensors header parsed here; crafted folders under /tmp for every refusal
 * (each status and the name in its message); F16 / BF16 / unaligned F32 conversions checked
 * against decoders written here; a sharded copy. The forward pass is test_forward.c's.
 * Tests that need the bundled model skip when the folder is absent.
 */
#include "common/error.h"
#include "runner/model.h"
#include "quant/half.h"

#include <cjson/cJSON.h>
#include "testutil.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MIXKV_SHARED_DIR
#error "define MIXKV_SHARED_DIR (the shared folder with models/)"
#endif
#define MODEL_DIR MIXKV_SHARED_DIR "/models/tinystories-656k"

#define REQUIRE_MODEL()                                                                        \
    do {                                                                                       \
        if (access(MODEL_DIR "/config.json", R_OK) != 0)                                       \
            cr_skip_test("bundled model not found at " MODEL_DIR);                             \
    } while (0)

static void expect_load_fails(const char *dir, mkv_status_t want, const char *needle)
{
    char err[MKV_ERR_LEN];
    mkv_model_t *m = (mkv_model_t *)1;
    mkv_status_t st = mkv_model_load(dir, &m, err);
    cr_expect_eq(st, want, "%s: got '%s' (%s), expected '%s'", dir, mkv_status_string(st), err,
                 mkv_status_string(want));
    cr_expect_null(m);
    cr_expect(strstr(err, needle) != NULL, "message '%s' does not name '%s'", err, needle);
    cr_expect_str_eq(mkv_last_error(), err);
}

/* ---------------------------------------------------------------------------------------- */
/* Writing safetensors folders                                                              */
/* ---------------------------------------------------------------------------------------- */

typedef struct wt {
    char name[96];
    char dtype[8];
    int32_t ndim;
    int64_t shape[2];
    void *data; /* owned */
    int64_t nbytes;
} wt_t;

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void write_st(const char *path, const wt_t *t, int n)
{
    cJSON *h = cJSON_CreateObject();
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(h, t[i].name);
        cJSON_AddStringToObject(e, "dtype", t[i].dtype);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int32_t k = 0; k < t[i].ndim; k++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[k]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + t[i].nbytes)));
        off += t[i].nbytes;
    }
    cJSON_AddItemToObject(h, "__metadata__", cJSON_Parse("{\"format\": \"pt\"}"));
    char *js = cJSON_PrintUnformatted(h);
    const size_t jl = strlen(js), hl = (jl + 7) / 8 * 8; /* padded with spaces, as HF does */
    uint8_t *buf = tu_xcalloc(8 + hl + (size_t)off, 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memset(buf + 8, ' ', hl);
    memcpy(buf + 8, js, jl);
    off = 0;
    for (int i = 0; i < n; i++) {
        memcpy(buf + 8 + hl + off, t[i].data, (size_t)t[i].nbytes);
        off += t[i].nbytes;
    }
    write_bytes(path, buf, 8 + hl + (size_t)off);
    free(buf);
    free(js);
    cJSON_Delete(h);
}

static void add_f32(wt_t *t, int *n, const char *name, int32_t ndim, int64_t a, int64_t b,
                    uint64_t *seed)
{
    wt_t *w = &t[(*n)++];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    strcpy(w->dtype, "F32");
    w->ndim = ndim, w->shape[0] = a, w->shape[1] = b;
    const int64_t cnt = ndim == 1 ? a : a * b;
    float *d = tu_xcalloc((size_t)cnt, sizeof(float));
    for (int64_t i = 0; i < cnt; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        d[i] = (float)((double)(*seed >> 40) / (double)(1 << 24) - 0.5);
    }
    w->data = d, w->nbytes = cnt * 4;
}

/* A tiny Llama: hidden 16, 2 layers, 2 heads of 8 over 1 KV head, FFN 24, vocab 10, untied. */
enum { TD = 16, TL = 2, TI = 24, TV = 10 };

static int tiny_tensors(wt_t *t)
{
    int n = 0;
    uint64_t seed = 7;
    char nm[96];
    add_f32(t, &n, "model.embed_tokens.weight", 2, TV, TD, &seed);
    add_f32(t, &n, "lm_head.weight", 2, TV, TD, &seed);
    add_f32(t, &n, "model.norm.weight", 1, TD, 0, &seed);
    static const char *const names[] = {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                                        "self_attn.v_proj", "self_attn.o_proj",
                                        "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                                        "mlp.down_proj"};
    static const int64_t shp[9][3] = {{1, TD, 0}, {2, 16, TD}, {2, 8, TD}, {2, 8, TD}, {2, TD, 16},
                                      {1, TD, 0}, {2, TI, TD}, {2, TI, TD}, {2, TD, TI}};
    for (int l = 0; l < TL; l++)
        for (int k = 0; k < 9; k++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, names[k]);
            add_f32(t, &n, nm, (int32_t)shp[k][0], shp[k][1], shp[k][2], &seed);
        }
    return n;
}

static wt_t *find_wt(wt_t *t, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return &t[i];
    cr_assert_fail("no tensor %s", name);
    return NULL;
}

static void free_wts(wt_t *t, int n)
{
    for (int i = 0; i < n; i++) free(t[i].data);
}

/* A fresh folder /tmp/mixkv_model_<tag> with config.json (arch and extra fields spliced in). */
static void tiny_folder(char *dir, size_t len, const char *tag, const char *arch,
                        const char *extra)
{
    char path[512], cfg[1024], cmd[600];
    snprintf(dir, len, "/tmp/mixkv_model_%d_%s", (int)getpid(), tag);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], %s \"hidden_size\": 16, \"num_hidden_layers\": 2, "
             "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"intermediate_size\": 24, "
             "\"vocab_size\": 10, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, "
             "\"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": [3, 2]}",
             arch, extra);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_bytes(path, cfg, strlen(cfg));
}

static void rm_folder(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

static void tiny_write(const char *dir, const wt_t *t, int n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, t, n);
}

/* ---------------------------------------------------------------------------------------- */
/* Loader tests                                                                             */
/* ---------------------------------------------------------------------------------------- */

Test(model_load, bundled_config_and_tensors)
{
    REQUIRE_MODEL();
    mkv_model_t *m = tu_model_load(MODEL_DIR);
    const mkv_model_config_t *c = &m->cfg;
    cr_expect_eq(c->hidden, 128);
    cr_expect_eq(c->n_layers, 2);
    cr_expect_eq(c->n_heads, 8);
    cr_expect_eq(c->n_kv_heads, 4);
    cr_expect_eq(c->head_dim, 16);
    cr_expect_eq(c->intermediate, 384);
    cr_expect_eq(c->vocab, 2048);
    cr_expect_eq(c->max_pos, 512);
    cr_expect_eq(c->rope_theta, 10000.0f);
    cr_expect_eq(c->rms_eps, 1e-6f);
    cr_expect_eq(c->tied, 1);
    cr_expect_eq(c->bos, 1);
    cr_expect_eq(c->eos, 2);
    cr_expect_eq(m->lm_head, m->embed, "tied: lm_head is the embedding");

    /* The file's own header, parsed here: every tensor, its shape and its bytes. */
    FILE *f = fopen(MODEL_DIR "/model.safetensors", "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = tu_xcalloc((size_t)size, 1);
    cr_assert_eq(fread(b, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    cJSON *h = cJSON_ParseWithLength((const char *)b + 8, hl);
    cr_assert_not_null(h);
    int count = 0;
    for (cJSON *e = h->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        count++;
        const cJSON *sh = cJSON_GetObjectItem(e, "shape"), *off = cJSON_GetObjectItem(e, "data_offsets");
        cr_expect_str_eq(cJSON_GetObjectItem(e, "dtype")->valuestring, "F32");
        const float *p = NULL;
        int64_t want0 = 128, want1 = 0;
        int layer;
        char what[64];
        if (strcmp(e->string, "lm_head.weight") == 0) p = m->lm_head, want0 = 2048, want1 = 128;
        else if (strcmp(e->string, "model.norm.weight") == 0) p = m->final_norm;
        else if (sscanf(e->string, "model.layers.%d.%63s", &layer, what) == 2 && layer >= 0 && layer < 2) {
            const mkv_layer_weights_t *w = &m->layers[layer];
            if (strcmp(what, "input_layernorm.weight") == 0) p = w->attn_norm;
            if (strcmp(what, "post_attention_layernorm.weight") == 0) p = w->mlp_norm;
            if (strcmp(what, "self_attn.q_proj.weight") == 0) p = w->wq, want1 = 128;
            if (strcmp(what, "self_attn.k_proj.weight") == 0) p = w->wk, want0 = 64, want1 = 128;
            if (strcmp(what, "self_attn.v_proj.weight") == 0) p = w->wv, want0 = 64, want1 = 128;
            if (strcmp(what, "self_attn.o_proj.weight") == 0) p = w->wo, want1 = 128;
            if (strcmp(what, "mlp.gate_proj.weight") == 0) p = w->w_gate, want0 = 384, want1 = 128;
            if (strcmp(what, "mlp.up_proj.weight") == 0) p = w->w_up, want0 = 384, want1 = 128;
            if (strcmp(what, "mlp.down_proj.weight") == 0) p = w->w_down, want1 = 384;
        }
        cr_assert_not_null(p, "tensor %s is not in the model", e->string);
        cr_expect_eq(cJSON_GetArraySize(sh), want1 ? 2 : 1, "%s", e->string);
        cr_expect_eq(cJSON_GetArrayItem(sh, 0)->valuedouble, (double)want0, "%s", e->string);
        if (want1) cr_expect_eq(cJSON_GetArrayItem(sh, 1)->valuedouble, (double)want1, "%s", e->string);
        const long begin = (long)cJSON_GetArrayItem(off, 0)->valuedouble;
        const long end = (long)cJSON_GetArrayItem(off, 1)->valuedouble;
        cr_expect_eq(end - begin, 4 * want0 * (want1 ? want1 : 1));
        cr_expect(memcmp(p, b + 8 + hl + begin, (size_t)(end - begin)) == 0, "%s data", e->string);
    }
    cr_expect_eq(count, 20, "the bundled file holds 20 tensors (lm_head only, tied)");
    cJSON_Delete(h);
    free(b);

    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cc;
    mkv_model_cache_config(m, &base, &cc);
    cr_expect(cc.n_layers == 2 && cc.n_kv_heads == 4 && cc.group_size == 2 && cc.head_dim == 16);
    cr_expect_eq(cc.max_seq_len, 512, "capped at max_position_embeddings");
    base.max_seq_len = 100;
    mkv_model_cache_config(m, &base, &cc);
    cr_expect_eq(cc.max_seq_len, 100);
    mkv_model_free(m);
}

Test(model_load, tiny_defaults)
{
    char dir[256];
    wt_t t[32];
    const int n = tiny_tensors(t);
    tiny_folder(dir, sizeof dir, "defaults", "MistralForCausalLM", "\"sliding_window\": 32,");
    tiny_write(dir, t, n);
    mkv_model_t *m = tu_model_load(dir);
    cr_expect_eq(m->cfg.head_dim, 8, "hidden / heads");
    cr_expect_eq(m->cfg.rope_theta, 10000.0f);
    cr_expect_eq(m->cfg.eos, 3, "first of a list");
    cr_expect_eq(m->cfg.tied, 0);
    cr_expect_eq(m->cfg.max_pos, 32, "Mistral: capped at sliding_window");
    cr_expect(memcmp(m->lm_head, find_wt(t, n, "lm_head.weight")->data, TV * TD * 4) == 0);
    cr_expect(memcmp(m->layers[1].w_down, find_wt(t, n, "model.layers.1.mlp.down_proj.weight")->data,
                     TD * TI * 4) == 0);
    mkv_model_free(m);
    free_wts(t, n);
    rm_folder(dir);
}

Test(model_load, refusals)
{
    char dir[256], path[600];
    wt_t t[32];
    int n = tiny_tensors(t);

    tiny_folder(dir, sizeof dir, "noconfig", "LlamaForCausalLM", "");
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    expect_load_fails(dir, MKV_STATUS_IO_ERROR, "config.json");

    tiny_folder(dir, sizeof dir, "arch", "GPTNeoXForCausalLM", "");
    expect_load_fails(dir, MKV_STATUS_UNSUPPORTED, "GPTNeoXForCausalLM");

    tiny_folder(dir, sizeof dir, "rope", "LlamaForCausalLM",
                "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0},");
    expect_load_fails(dir, MKV_STATUS_UNSUPPORTED, "rope_scaling (llama3)");

    tiny_folder(dir, sizeof dir, "badjson", "LlamaForCausalLM", "\"oops\",");
    expect_load_fails(dir, MKV_STATUS_PARSE_ERROR, "config.json");

    tiny_folder(dir, sizeof dir, "noweights", "LlamaForCausalLM", "");
    expect_load_fails(dir, MKV_STATUS_IO_ERROR, "model.safetensors");

    /* A missing tensor: the last one dropped. */
    tiny_folder(dir, sizeof dir, "missing", "LlamaForCausalLM", "");
    tiny_write(dir, t, n - 1);
    expect_load_fails(dir, MKV_STATUS_INVALID_ARGUMENT, "model.layers.1.mlp.down_proj.weight");

    /* A wrong shape: gate_proj [24][16] written as [16][24]. */
    wt_t *g = find_wt(t, n, "model.layers.0.mlp.gate_proj.weight");
    g->shape[0] = TD, g->shape[1] = TI;
    tiny_folder(dir, sizeof dir, "shape", "LlamaForCausalLM", "");
    tiny_write(dir, t, n);
    expect_load_fails(dir, MKV_STATUS_INVALID_ARGUMENT,
                      "model.layers.0.mlp.gate_proj.weight: expected shape [24, 16], found [16, 24]");
    g->shape[0] = TI, g->shape[1] = TD;

    /* An unsupported dtype: the final norm as I8 (16 bytes). */
    wt_t *nw = find_wt(t, n, "model.norm.weight");
    strcpy(nw->dtype, "I8");
    nw->nbytes = TD;
    tiny_folder(dir, sizeof dir, "dtype", "LlamaForCausalLM", "");
    tiny_write(dir, t, n);
    expect_load_fails(dir, MKV_STATUS_UNSUPPORTED, "tensor model.norm.weight has dtype I8");
    strcpy(nw->dtype, "F32");
    nw->nbytes = TD * 4;

    /* Qwen2 with its q/k/v biases. */
    tiny_folder(dir, sizeof dir, "bias", "Qwen2ForCausalLM", "");
    uint64_t seed = 3;
    add_f32(t, &n, "model.layers.0.self_attn.q_proj.bias", 1, 16, 0, &seed);
    tiny_write(dir, t, n);
    expect_load_fails(dir, MKV_STATUS_UNSUPPORTED, "model.layers.0.self_attn.q_proj.bias");
    free(t[--n].data);

    /* A truncated header, then data offsets past the end of the file. */
    tiny_folder(dir, sizeof dir, "trunc", "LlamaForCausalLM", "");
    tiny_write(dir, t, n);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(truncate(path, 40), 0);
    expect_load_fails(dir, MKV_STATUS_PARSE_ERROR, "model.safetensors: header of");
    tiny_write(dir, t, n);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fclose(f);
    cr_assert_eq(truncate(path, size - 4), 0);
    expect_load_fails(dir, MKV_STATUS_PARSE_ERROR,
                      "tensor model.layers.1.mlp.down_proj.weight: data_offsets");
    free_wts(t, n);
    static const char *const tags[] = {"noconfig", "arch", "rope", "badjson", "noweights",
                                       "missing", "shape", "dtype", "bias", "trunc"};
    for (int i = 0; i < 10; i++) {
        snprintf(dir, sizeof dir, "/tmp/mixkv_model_%d_%s", (int)getpid(), tags[i]);
        rm_folder(dir);
    }
}

/* Test-side decoders, in double. */
static double f16_value(uint16_t h)
{
    const int e = (h >> 10) & 31, mant = h & 1023;
    const double v = e ? ldexp(1.0 + mant / 1024.0, e - 15) : ldexp(mant, -24);
    return (h & 0x8000) ? -v : v;
}

Test(model_load, f16_bf16_unaligned_f32)
{
    char dir[256];
    wt_t t[40];
    int n = tiny_tensors(t);
    /* A 2-byte tensor first: every later tensor's data sits 2 bytes off 4-byte alignment. */
    memmove(t + 1, t, (size_t)n * sizeof *t);
    n++;
    memset(&t[0], 0, sizeof t[0]);
    strcpy(t[0].name, "extra.scale");
    strcpy(t[0].dtype, "F16");
    t[0].ndim = 1, t[0].shape[0] = 1, t[0].nbytes = 2;
    t[0].data = tu_xcalloc(1, 2);

    wt_t *up = find_wt(t, n, "model.layers.0.mlp.up_proj.weight");
    wt_t *gate = find_wt(t, n, "model.layers.1.mlp.gate_proj.weight");
    const int cnt = TI * TD;
    uint16_t *h16 = tu_xcalloc(cnt, 2), *hb = tu_xcalloc(cnt, 2);
    uint64_t s = 11;
    for (int i = 0; i < cnt; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h16[i] = (uint16_t)(s >> 48);
        if (((h16[i] >> 10) & 31) == 31) h16[i] &= 0xbfff; /* no inf / NaN */
        hb[i] = (uint16_t)(s >> 32);
        if (((hb[i] >> 7) & 255) == 255) hb[i] &= 0xbfff;
    }
    const uint16_t edge[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x3c00};
    memcpy(h16, edge, sizeof edge);
    hb[0] = 0x3f80, hb[1] = 0xc000, hb[2] = 0x0001;
    free(up->data), free(gate->data);
    up->data = h16, gate->data = hb;
    strcpy(up->dtype, "F16"), strcpy(gate->dtype, "BF16");
    up->nbytes = gate->nbytes = cnt * 2;
    tiny_folder(dir, sizeof dir, "conv", "LlamaForCausalLM", "");
    tiny_write(dir, t, n);

    mkv_model_t *m = tu_model_load(dir);
    for (int i = 0; i < cnt; i++) {
        cr_assert_eq((double)m->layers[0].w_up[i], f16_value(h16[i]), "F16 %d: 0x%04x", i, h16[i]);
        const uint32_t bits = (uint32_t)hb[i] << 16;
        float want;
        memcpy(&want, &bits, 4);
        cr_assert_eq(memcmp(&m->layers[1].w_gate[i], &want, 4), 0, "BF16 %d: 0x%04x", i, hb[i]);
    }
    cr_expect_eq(m->layers[1].w_gate[0], 1.0f);
    cr_expect_eq(m->layers[1].w_gate[1], -2.0f);
    const wt_t *q = find_wt(t, n, "model.layers.0.self_attn.q_proj.weight");
    cr_expect(memcmp(m->layers[0].wq, q->data, (size_t)q->nbytes) == 0, "unaligned F32 copied");
    cr_expect_eq((uintptr_t)m->layers[0].wq % 4, 0);
    mkv_model_free(m);
    free_wts(t, n);
    rm_folder(dir);
}

Test(model_load, sharded_equals_single)
{
    REQUIRE_MODEL();
    mkv_model_t *one = tu_model_load(MODEL_DIR);
    char dir[256], path[600];
    tiny_folder(dir, sizeof dir, "sharded", "LlamaForCausalLM", "");
    /* The same tensors, from the loaded model, alternately into two shards. */
    wt_t t[2][20];
    int n[2] = {0, 0};
    cJSON *idx = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(idx, "weight_map");
    static const char *const shard[2] = {"model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors"};
    int k = 0;
#define SHARD(nm, ptr, a, b)                                                                   \
    do {                                                                                       \
        wt_t *w_ = &t[k % 2][n[k % 2]++];                                                       \
        memset(w_, 0, sizeof *w_);                                                             \
        snprintf(w_->name, sizeof w_->name, "%s", nm);                                           \
        strcpy(w_->dtype, "F32");                                                               \
        w_->ndim = (b) ? 2 : 1, w_->shape[0] = a, w_->shape[1] = b;                               \
        w_->nbytes = 4 * (int64_t)(a) * ((b) ? (b) : 1);                                         \
        w_->data = tu_xcalloc((size_t)w_->nbytes, 1);                                               \
        memcpy(w_->data, ptr, (size_t)w_->nbytes);                                               \
        cJSON_AddStringToObject(wm, nm, shard[k % 2]);                                         \
        k++;                                                                                   \
    } while (0)
    SHARD("lm_head.weight", one->lm_head, 2048, 128);
    SHARD("model.norm.weight", one->final_norm, 128, 0);
    for (int l = 0; l < 2; l++) {
        const mkv_layer_weights_t *lw = &one->layers[l];
        char nm[96];
#define LT(suffix, ptr, a, b)                                                                  \
    snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, suffix);                           \
    SHARD(nm, ptr, a, b)
        LT("input_layernorm", lw->attn_norm, 128, 0);
        LT("self_attn.q_proj", lw->wq, 128, 128);
        LT("self_attn.k_proj", lw->wk, 64, 128);
        LT("self_attn.v_proj", lw->wv, 64, 128);
        LT("self_attn.o_proj", lw->wo, 128, 128);
        LT("post_attention_layernorm", lw->mlp_norm, 128, 0);
        LT("mlp.gate_proj", lw->w_gate, 384, 128);
        LT("mlp.up_proj", lw->w_up, 384, 128);
        LT("mlp.down_proj", lw->w_down, 128, 384);
#undef LT
    }
#undef SHARD
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/%s", dir, shard[s]);
        write_st(path, t[s], n[s]);
    }
    char *js = cJSON_Print(idx);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_bytes(path, js, strlen(js));
    free(js);
    /* The bundled config (tied, vocab 2048). */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s/config.json' '%s/config.json'", MODEL_DIR, dir);
    cr_assert_eq(system(cmd), 0);

    mkv_model_t *sh = tu_model_load(dir);
    cr_expect(memcmp(sh->embed, one->embed, 2048 * 128 * 4) == 0);
    cr_expect_eq(sh->lm_head, sh->embed);
    cr_expect(memcmp(sh->final_norm, one->final_norm, 128 * 4) == 0);
    for (int l = 0; l < 2; l++) {
        const mkv_layer_weights_t *a = &sh->layers[l], *b = &one->layers[l];
        cr_expect(memcmp(a->wq, b->wq, 128 * 128 * 4) == 0 && memcmp(a->wk, b->wk, 64 * 128 * 4) == 0 &&
                  memcmp(a->wv, b->wv, 64 * 128 * 4) == 0 && memcmp(a->wo, b->wo, 128 * 128 * 4) == 0 &&
                  memcmp(a->attn_norm, b->attn_norm, 128 * 4) == 0 &&
                  memcmp(a->mlp_norm, b->mlp_norm, 128 * 4) == 0 &&
                  memcmp(a->w_gate, b->w_gate, 384 * 128 * 4) == 0 &&
                  memcmp(a->w_up, b->w_up, 384 * 128 * 4) == 0 &&
                  memcmp(a->w_down, b->w_down, 128 * 384 * 4) == 0,
                  "layer %d differs", l);
    }
    mkv_model_free(sh);

    /* An index naming a shard that does not hold the tensor. */
    cJSON_ReplaceItemInObject(wm, "model.norm.weight", cJSON_CreateString(shard[0]));
    js = cJSON_Print(idx);
    write_bytes(path, js, strlen(js));
    free(js);
    expect_load_fails(dir, MKV_STATUS_PARSE_ERROR, "model.norm.weight");
    cJSON_Delete(idx);
    for (int s = 0; s < 2; s++) free_wts(t[s], n[s]);
    mkv_model_free(one);
    rm_folder(dir);
}

/* Every config.json field is type-checked: a string where a number or a boolean belongs is
 * refused (naming the field) instead of being read as a default. */
Test(model_load, config_type_checks)
{
    static const struct {
        const char *extra, *needle;
    } cases[] = {
        {"\"tie_word_embeddings\": \"yes\",", "tie_word_embeddings must be true or false"},
        {"\"tie_word_embeddings\": 1,", "tie_word_embeddings must be true or false"},
        {"\"attention_bias\": \"false\",", "attention_bias must be true or false"},
        {"\"hidden_size\": \"16\",", "hidden_size must be a positive integer"},
        {"\"hidden_size\": 16.5,", "hidden_size must be a positive integer"},
        {"\"head_dim\": \"8\",", "head_dim must be a positive integer"},
        {"\"rope_theta\": \"1e4\",", "rope_theta must be a positive number"},
        {"\"rope_theta\": 1e300,", "rope_theta must be a positive number in float's range"},
        {"\"rms_norm_eps\": 1e-300,", "rms_norm_eps must be a positive number in float's range"},
        {"\"rms_norm_eps\": [1e-5],", "rms_norm_eps must be a positive number"},
        {"\"model_type\": 7,", "model_type must be a string"},
        {"\"sliding_window\": \"4k\",", "sliding_window must be a non-negative integer"},
        {"\"rope_scaling\": \"linear\",", "rope_scaling must be an object or null"},
        {"\"hidden_act\": 1,", "hidden_act (not a string)"},
        {"\"bos_token_id\": 10,", "bos_token_id must be a token id below vocab_size 10"},
        {"\"bos_token_id\": -1,", "bos_token_id must be a token id"},
        {"\"eos_token_id\": [2, 99],", "eos_token_id must be a token id below vocab_size 10"},
        {"\"eos_token_id\": \"2\",", "eos_token_id must be a token id"},
    };
    char dir[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tiny_folder(dir, sizeof dir, "types", "LlamaForCausalLM", cases[i].extra);
        const mkv_status_t want = strstr(cases[i].needle, "hidden_act") ? MKV_STATUS_UNSUPPORTED
                                                                         : MKV_STATUS_PARSE_ERROR;
        expect_load_fails(dir, want, cases[i].needle);
    }
    rm_folder(dir);
}

/* A layer count the weights cannot hold is refused before the per-layer table is allocated
 * (2^31 - 1 layers would ask for 154 GB; fuzz/corpus/config/huge-num_hidden_layers.json). */
Test(model_load, layer_count_bounded_by_the_weights)
{
    char dir[256];
    wt_t t[32];
    const int n = tiny_tensors(t);
    tiny_folder(dir, sizeof dir, "layers", "LlamaForCausalLM", "\"num_hidden_layers\": 2147483647,");
    tiny_write(dir, t, n);
    expect_load_fails(dir, MKV_STATUS_PARSE_ERROR, "num_hidden_layers 2147483647, but the weights hold only");
    free_wts(t, n);
    rm_folder(dir);
}

/* A FIFO where a file is expected must not block the loader, and a folder named like a file
 * gets a message that says so. */
Test(model_load, fifo_and_folder_in_place_of_files, .timeout = 20)
{
    char dir[256], path[600];
    wt_t t[32];
    const int n = tiny_tensors(t);
    tiny_folder(dir, sizeof dir, "fifo", "LlamaForCausalLM", "");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    expect_load_fails(dir, MKV_STATUS_IO_ERROR, "model.safetensors is a FIFO, device or socket");
    unlink(path);
    cr_assert_eq(mkdir(path, 0700), 0);
    expect_load_fails(dir, MKV_STATUS_IO_ERROR, "model.safetensors is a directory");
    rmdir(path);
    tiny_write(dir, t, n);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    cr_assert_eq(mkfifo(path, 0600), 0);
    expect_load_fails(dir, MKV_STATUS_IO_ERROR, "config.json is a FIFO");
    /* The model path itself a FIFO: taken as a GGUF file, refused the same way. */
    expect_load_fails(path, MKV_STATUS_IO_ERROR, "a FIFO");
    free_wts(t, n);
    rm_folder(dir);
}

/* A shape without weights: the folder's config.json (or the file itself) reads as the loader
 * reads it; the built-in Llama-3-8B shape; refusals. */
Test(model_load, config_only_and_builtin_shape)
{
    REQUIRE_MODEL();
    mkv_model_t *m = tu_model_load(MODEL_DIR);
    mkv_model_config_t a, b, c;
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_model_config_load(MODEL_DIR, &a, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(mkv_model_config_load(MODEL_DIR "/config.json", &b, err), MKV_STATUS_OK, "%s", err);
    cr_assert_eq(memcmp(&a, &m->cfg, sizeof a), 0, "the folder's shape differs from the loaded model's");
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "the folder and its config.json differ");
    cr_assert_eq(mkv_model_config_builtin("llama-3-8b", &c, err), MKV_STATUS_OK, "%s", err);
    cr_assert(c.hidden == 4096 && c.n_layers == 32 && c.n_heads == 32 && c.n_kv_heads == 8 && c.head_dim == 128 &&
              c.intermediate == 14336 && c.vocab == 128256 && c.rope_theta == 500000.0f);
    cr_assert_eq(mkv_model_config_builtin("llama-3-70b", &c, err), MKV_STATUS_OK, "%s", err);
    cr_assert(c.hidden == 8192 && c.n_layers == 80 && c.n_heads == 64 && c.n_kv_heads == 8 && c.head_dim == 128 &&
              c.intermediate == 28672 && c.vocab == 128256 && !c.tied);
    cr_assert_eq(mkv_model_config_builtin("llama-9", &c, err), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err, "llama-3-8b"), "%s", err);
    cr_assert_eq(mkv_model_config_load("/nonexistent/dir", &c, err), MKV_STATUS_IO_ERROR);
    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, out;
    base.max_seq_len = 100000;
    mkv_model_config_cache(&a, &base, &out);
    cr_assert(out.n_layers == 2 && out.n_kv_heads == 4 && out.group_size == 2 && out.head_dim == 16 &&
              out.max_seq_len == a.max_pos);
    mkv_model_free(m);
}
