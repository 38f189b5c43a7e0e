/*
 * fuzz_safetensors.c — libFuzzer target: the input as model.safetensors beside the tiny
 * model's config.json, loaded with mkv_model_load (runner/model.c): the 8-byte header length,
 * the JSON header, every entry's dtype, shape and data_offsets against the file, and the
 * conversion of the tensors the config asks for. Seeds: fuzz/corpus/safetensors/.
 */
#include "common/error.h"
#include "runner/model.h"
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* Byte mutations of the header almost always break its length prefix or its JSON: half the
 * time the header is mutated as JSON (shapes, offsets, dtypes) and the prefix rewritten, the
 * tensor data kept. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    static const char *const dtypes[] = {"F32", "F16", "BF16", "I8", "F64", "", "F32 "};
    uint64_t hlen = 0;
    for (int i = 7; size >= 8 && i >= 0; i--) hlen = hlen << 8 | data[i];
    if ((seed & 1) && size >= 8 && hlen <= size - 8) {
        char *h = fuzz_mutate_json((const char *)data + 8, (size_t)hlen, seed >> 1, dtypes,
                                   (int)(sizeof dtypes / sizeof dtypes[0]));
        const size_t nh = h ? strlen(h) : 0, rest = size - 8 - (size_t)hlen;
        if (h && 8 + nh + rest <= max_size) {
            memmove(data + 8 + nh, data + 8 + hlen, rest);
            memcpy(data + 8, h, nh);
            for (int i = 0; i < 8; i++) data[i] = (uint8_t)((uint64_t)nh >> (8 * i));
            free(h);
            return 8 + nh + rest;
        }
        free(h);
    }
    return LLVMFuzzerMutate(data, size, max_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        fuzz_write("config.json", fuzz_tiny_config, strlen(fuzz_tiny_config));
        ready = 1;
    }
    fuzz_write("model.safetensors", data, size);
    char err[MKV_ERR_LEN] = "";
    mkv_model_t *m = NULL;
    const mkv_status_t st = mkv_model_load(fuzz_dir(), &m, err);
    if (fuzz_verbose()) fprintf(stderr, "fuzz_safetensors: %s %s\n", mkv_status_string(st), err);
    if (st == MKV_STATUS_OK) {
        /* Touch every weight the loader handed out: a pointer past the mapping shows here. */
        volatile float sink = m->embed[0] + m->lm_head[m->cfg.vocab * m->cfg.hidden - 1] +
                              m->final_norm[m->cfg.hidden - 1];
        const mkv_layer_weights_t *w = &m->layers[m->cfg.n_layers - 1];
        sink += w->w_down[m->cfg.hidden * m->cfg.intermediate - 1];
        (void)sink;
    }
    mkv_model_free(m);
    return 0;
}
