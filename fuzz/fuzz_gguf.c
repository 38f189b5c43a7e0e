/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader and the GGUF model loader.
 *
 * The input bytes become a temporary file (the reader maps files, it takes no buffers); the
 * reader must refuse it cleanly or open it, and then every metadata value, array element and
 * tensor info is read back through the public accessors, and the first bytes of every tensor's
 * data are touched, so that anything out of bounds trips AddressSanitizer. Then the same file
 * goes through mkv_model_load, which dequantizes whatever a llama file holds.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I include -I . fuzz/fuzz_gguf.c \
 *     common/status.c runner/gguf.c runner/gguf_dequant.c runner/model.c runner/model_gguf.c \
 *     -lcjson -lm -lpthread -o fuzz_gguf && ./fuzz_gguf fuzz/corpus/gguf
 */
#include "runner/gguf.h"
#include "runner/model.h"

#include "common/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile uint64_t sink;

static void walk(const mkv_gguf_t *g)
{
    char err[MKV_ERR_LEN];
    for (int64_t i = 0; i < mkv_gguf_n_kv(g); i++) {
        const mkv_gguf_kv_t *kv = mkv_gguf_kv_at(g, i);
        sink += strlen(kv->key) + kv->type;
        if (mkv_gguf_find(g, kv->key) != kv) abort(); /* keys are unique */
        uint32_t u;
        int32_t s;
        float f;
        int b;
        mkv_gguf_str_t str;
        sink += mkv_gguf_get_u32(g, kv->key, &u, err) + mkv_gguf_get_i32(g, kv->key, &s, err) +
                mkv_gguf_get_f32(g, kv->key, &f, err) + mkv_gguf_get_bool(g, kv->key, &b, err);
        if (mkv_gguf_get_str(g, kv->key, &str, err) == MKV_STATUS_OK && str.len)
            sink += (uint8_t)str.ptr[0] + (uint8_t)str.ptr[str.len - 1];
        if (kv->type != MKV_GGUF_ARRAY) continue;
        for (uint64_t e = 0; e < kv->arr_count; e++) {
            int64_t v;
            double d;
            if (kv->arr_type == MKV_GGUF_STRING) {
                const mkv_gguf_str_t es = mkv_gguf_arr_str(g, kv, e);
                if (es.len) sink += (uint8_t)es.ptr[0] + (uint8_t)es.ptr[es.len - 1];
            } else if (mkv_gguf_arr_int(kv, e, &v)) {
                sink += (uint64_t)v;
            } else if (mkv_gguf_arr_float(kv, e, &d)) {
                sink += d > 0;
            }
        }
    }
    for (int64_t i = 0; i < mkv_gguf_n_tensors(g); i++) {
        const mkv_gguf_tensor_t *t = mkv_gguf_tensor_at(g, i);
        if (mkv_gguf_find_tensor(g, t->name) != t) abort(); /* names are unique */
        const uint8_t *d = t->data;
        if (t->nbytes) sink += d[0] + d[t->nbytes - 1];
        int64_t be, bb;
        if (!mkv_ggml_block(t->type, &be, &bb) || t->n_elements / be * bb != (int64_t)t->nbytes)
            abort(); /* the reader checked the size */
        /* Dequantize a small tensor (bounded so that the fuzzer stays fast). */
        if (mkv_ggml_can_dequantize(t->type) && t->n_elements <= 4096) {
            float *out = malloc((size_t)(t->n_elements ? t->n_elements : 1) * sizeof(float));
            if (out && mkv_ggml_dequantize(t->type, t->data, out, t->n_elements, err) != MKV_STATUS_OK)
                abort();
            free(out);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[] = "/tmp/mixkv_fuzz_gguf_XXXXXX", err[MKV_ERR_LEN];
    const int fd = mkstemp(path);
    if (fd < 0) return 0;
    const int ok = write(fd, data, size) == (ssize_t)size;
    close(fd);
    if (ok) {
        mkv_gguf_t *g = NULL;
        if (mkv_gguf_open(path, &g, err) == MKV_STATUS_OK) {
            walk(g);
            mkv_gguf_close(g);
        } else if (g || !err[0]) {
            abort(); /* a refusal leaves no handle and says why */
        }
        mkv_model_t *m = NULL;
        if (mkv_model_load(path, &m, err) == MKV_STATUS_OK) {
            sink += (uint64_t)m->cfg.vocab;
            mkv_model_free(m);
        } else if (m || !err[0]) {
            abort();
        }
    }
    unlink(path);
    return 0;
}
