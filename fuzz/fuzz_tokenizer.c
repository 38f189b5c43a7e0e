/*
 * fuzz_tokenizer.c — libFuzzer target: the input as tokenizer.json (runner/tokenizer_load.c),
 * and when it loads, a few fixed texts through mkv_tokenizer_encode (normalizers, added
 * tokens, BPE merges, unknowns), the ids back through mkv_tokenizer_decode (decoders, byte
 * fallback) and mkv_tokenizer_piece, and ids the tokenizer never produced (every id of a
 * small vocabulary, and out-of-range ones, which must be refused, not read).
 * Seeds: fuzz/corpus/tokenizer/.
 */
#include "common/error.h"
#include "runner/tokenizer.h"
#include "fuzz_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const texts[] = {
    "Once upon a time, there was a little girl.",
    "",
    " ",
    "  two  spaces\tand\ttabs\nand a newline",
    "<|start_story|>Tim<|end_story|><unk>",
    "h\xc3\xa9llo w\xc3\xb6rld \xe2\x96\x81 \xf0\x9f\x99\x82",
    "invalid \xff\xfe\xc3 utf-8 \xe2\x82",
};

static void roundtrip(const mkv_tokenizer_t *tok, const char *text, size_t len)
{
    char err[MKV_ERR_LEN] = "", buf[256];
    int32_t *ids = NULL, n = 0;
    for (int bos = 0; bos < 2; bos++) {
        if (mkv_tokenizer_encode(tok, text, len, bos, &ids, &n, err) != MKV_STATUS_OK) {
            if (fuzz_verbose()) fprintf(stderr, "fuzz_tokenizer: encode: %s\n", err);
            continue;
        }
        for (int skip = 0; skip < 2; skip++) {
            char *out = NULL;
            if (mkv_tokenizer_decode(tok, ids, n, skip, &out, err) == MKV_STATUS_OK) free(out);
        }
        int32_t prev = -1;
        for (int32_t i = 0; i < n && i < 64; i++) {
            mkv_tokenizer_piece(tok, prev, ids[i], buf, sizeof buf);
            prev = ids[i];
        }
        free(ids);
        ids = NULL;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write("tokenizer.json", data, size);
    char err[MKV_ERR_LEN] = "", buf[256];
    mkv_tokenizer_t *tok = NULL;
    const mkv_status_t st = mkv_tokenizer_load(fuzz_dir(), &tok, err);
    if (fuzz_verbose()) fprintf(stderr, "fuzz_tokenizer: load: %s %s\n", mkv_status_string(st), err);
    if (st != MKV_STATUS_OK) return 0;

    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) roundtrip(tok, texts[i], strlen(texts[i]));

    /* Ids the encoder did not produce: all of a small vocabulary, then out of range. */
    const int32_t v = mkv_tokenizer_vocab_size(tok);
    int32_t ids[72];
    int32_t n = 0;
    for (int32_t i = 0; i < v && n < 64; i++) ids[n++] = i;
    char *out = NULL;
    if (mkv_tokenizer_decode(tok, ids, n, 0, &out, err) == MKV_STATUS_OK) free(out);
    const int32_t bad[] = {-1, v, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = NULL;
        if (mkv_tokenizer_decode(tok, &bad[i], 1, 1, &out, err) == MKV_STATUS_OK) free(out);
        mkv_tokenizer_piece(tok, -1, bad[i], buf, sizeof buf);
        mkv_tokenizer_piece(tok, bad[i], 0, buf, sizeof buf);
    }
    (void)mkv_tokenizer_bos(tok);
    (void)mkv_tokenizer_eos(tok);
    (void)mkv_tokenizer_unk(tok);
    mkv_tokenizer_free(tok);
    return 0;
}
