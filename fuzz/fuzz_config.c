/*
 * fuzz_config.c — libFuzzer target: the input as config.json beside the tiny model's
 * model.safetensors, loaded with mkv_model_load (runner/model.c): architecture, flags,
 * dimensions and their consistency, token ids, then the tensor shapes the config implies.
 * Seeds: fuzz/corpus/config/.
 */
#include "common/error.h"
#include "runner/model.h"
#include "fuzz_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        uint8_t *st;
        size_t len;
        fuzz_tiny_safetensors(&st, &len);
        fuzz_write("model.safetensors", st, len);
        free(st);
        ready = 1;
    }
    fuzz_write("config.json", data, size);
    char err[MKV_ERR_LEN] = "";
    mkv_model_t *m = NULL;
    const mkv_status_t st = mkv_model_load(fuzz_dir(), &m, err);
    if (fuzz_verbose()) fprintf(stderr, "fuzz_config: %s %s\n", mkv_status_string(st), err);
    if (st == MKV_STATUS_OK) {
        mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cfg;
        mkv_model_cache_config(m, &base, &cfg);
    }
    mkv_model_free(m);
    return 0;
}
