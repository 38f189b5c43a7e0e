/*
 * test_tokenizer_bpe.c — byte-level BPE (runner/tokenizer.h) against Hugging Face `tokenizers`:
 * fixtures written by scripts/gen_tokenizer_fixtures.py (tests/fixtures/tokenizer_*: small
 * vocabularies trained with the pre-tokenizers of Llama 3, Qwen2, GPT-2 and a chain of every
 * Split behaviour, each with texts, HF's ids and HF's decodings), loaded from tokenizer.json and,
 * for Llama 3 and Qwen2, rebuilt through the GGUF constructor from the same vocab and merges;
 * SmolLM2-135M through the GGUF constructor from the model's GGUF (read here by a minimal
 * metadata reader; skipped without the file).
 */
#include "tokenizer_fixture.h"

#include <cjson/cJSON.h>
#include <criterion/logging.h>

#include <glob.h>
#include <time.h>

#ifndef MIXKV_SOURCE_DIR
#define MIXKV_SOURCE_DIR "."
#endif
#ifndef MIXKV_SHARED_DIR
#define MIXKV_SHARED_DIR "../shared"
#endif
#define FIXTURES MIXKV_SOURCE_DIR "/tests/fixtures"
#define SMOLLM2_GGUF MIXKV_SOURCE_DIR "/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"

/* Checks every case of dir/cases.json: ids (and ids with BOS), both decodings, and the
 * streamed pieces against the decoding without specials. */
static void check_cases(const mkv_tokenizer_t *tok, const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/cases.json", dir);
    cJSON *root = tf_read_json(path);
    const cJSON *c, *cases = cJSON_GetObjectItem(root, "cases");
    cr_assert(cJSON_GetArraySize(cases) > 100, "%s: too few cases", path);
    int k = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        char what[96];
        snprintf(what, sizeof what, "%s case %d", dir, k++);
        int32_t n, *want, n_want;
        int32_t *ids = tf_encode(tok, text, strlen(text), 0, &n);
        want = tf_ids(cJSON_GetObjectItem(c, "ids"), &n_want);
        tf_expect_ids(ids, n, want, n_want, what, text);
        free(want);
        if (cJSON_GetObjectItem(c, "ids_bos")) {
            int32_t nb, *b = tf_encode(tok, text, strlen(text), 1, &nb);
            want = tf_ids(cJSON_GetObjectItem(c, "ids_bos"), &n_want);
            tf_expect_ids(b, nb, want, n_want, what, text);
            free(want);
            free(b);
        }
        char *d = tf_decode(tok, ids, n, 0), *ds = tf_decode(tok, ids, n, 1);
        char *p = tf_pieces(tok, ids, n);
        cr_expect_str_eq(d, cJSON_GetObjectItem(c, "decoded")->valuestring, "%s: decode", what);
        cr_expect_str_eq(ds, cJSON_GetObjectItem(c, "decoded_skip")->valuestring,
                         "%s: decode(skip_special)", what);
        cr_expect_str_eq(p, ds, "%s: streamed pieces", what);
        free(d);
        free(ds);
        free(p);
        free(ids);
    }
    cJSON_Delete(root);
}

static mkv_tokenizer_t *load_fixture(const char *name)
{
    char dir[512], err[MKV_ERR_LEN] = "";
    mkv_tokenizer_t *tok = NULL;
    snprintf(dir, sizeof dir, FIXTURES "/%s", name);
    mkv_status_t st = mkv_tokenizer_load(dir, &tok, err);
    cr_assert_eq(st, MKV_STATUS_OK, "load %s: %s (%s)", dir, mkv_status_string(st), err);
    return tok;
}

Test(tokenizer_bpe, llama3_json)
{
    mkv_tokenizer_t *tok = load_fixture("tokenizer_llama3");
    cr_expect_eq(mkv_tokenizer_bos(tok), 0); /* TemplateProcessing's <|begin_of_text|> */
    cr_expect_eq(mkv_tokenizer_token_id(tok, "<|eot_id|>"), 4);
    cr_expect_eq(mkv_tokenizer_token_id(tok, "<|eot_id|"), -1);
    check_cases(tok, FIXTURES "/tokenizer_llama3");
    mkv_tokenizer_free(tok);
}

Test(tokenizer_bpe, qwen2_json) /* NFC, Qwen2's Split */
{
    mkv_tokenizer_t *tok = load_fixture("tokenizer_qwen2");
    cr_expect_eq(mkv_tokenizer_bos(tok), -1);
    check_cases(tok, FIXTURES "/tokenizer_qwen2");
    mkv_tokenizer_free(tok);
}

Test(tokenizer_bpe, gpt2_json) /* ByteLevel(add_prefix_space, use_regex) alone */
{
    mkv_tokenizer_t *tok = load_fixture("tokenizer_gpt2");
    check_cases(tok, FIXTURES "/tokenizer_gpt2");
    mkv_tokenizer_free(tok);
}

Test(tokenizer_bpe, split_behaviours_json)
{
    mkv_tokenizer_t *tok = load_fixture("tokenizer_splits");
    check_cases(tok, FIXTURES "/tokenizer_splits");
    mkv_tokenizer_free(tok);
}

/* ---------------------------------------------------------------------------------------- */
/* Through the GGUF constructor                                                             */
/* ---------------------------------------------------------------------------------------- */

/* The spec GGUF would give for a fixture's tokenizer.json: its vocab in id order, merges as
 * "a b", added special tokens as control tokens. */
static mkv_tokenizer_t *spec_from_json(const char *name, const char *pre, int32_t bos)
{
    char path[512], err[MKV_ERR_LEN] = "";
    snprintf(path, sizeof path, FIXTURES "/%s/tokenizer.json", name);
    cJSON *root = tf_read_json(path);
    const cJSON *model = cJSON_GetObjectItem(root, "model"), *it;
    const cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
    int32_t nv = cJSON_GetArraySize(vocab), nm = cJSON_GetArraySize(cJSON_GetObjectItem(model, "merges"));
    const char **toks = calloc((size_t)nv, sizeof *toks);
    int32_t *types = calloc((size_t)nv, sizeof *types);
    char **merges = calloc((size_t)nm + 1, sizeof *merges);
    cr_assert(toks && types && merges);
    cJSON_ArrayForEach(it, vocab) {
        cr_assert(it->valueint >= 0 && it->valueint < nv);
        toks[it->valueint] = it->string;
        types[it->valueint] = 1;
    }
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(root, "added_tokens"))
        types[cJSON_GetObjectItem(it, "id")->valueint] = 3;
    int32_t r = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(model, "merges")) {
        const char *a = cJSON_GetArrayItem(it, 0)->valuestring, *b = cJSON_GetArrayItem(it, 1)->valuestring;
        merges[r] = malloc(strlen(a) + strlen(b) + 2);
        sprintf(merges[r++], "%s %s", a, b);
    }
    mkv_bpe_spec_t sp = {.n_vocab = nv, .tokens = toks, .token_types = types, .n_merges = nm,
                         .merges = (const char *const *)merges, .model = "gpt2", .pre = pre,
                         .bos = bos, .eos = -1, .unk = -1, .pad = -1, .add_bos = bos >= 0};
    mkv_tokenizer_t *tok = NULL;
    mkv_status_t st = mkv_tokenizer_create_bpe(&sp, &tok, err);
    cr_assert_eq(st, MKV_STATUS_OK, "create_bpe(%s): %s (%s)", name, mkv_status_string(st), err);
    for (int32_t i = 0; i < nm; i++) free(merges[i]);
    free(merges);
    free(types);
    free(toks);
    cJSON_Delete(root);
    return tok;
}

Test(tokenizer_bpe, llama3_gguf)
{
    mkv_tokenizer_t *tok = spec_from_json("tokenizer_llama3", "llama-bpe", 0);
    cr_expect_eq(mkv_tokenizer_add_bos(tok), 1);
    check_cases(tok, FIXTURES "/tokenizer_llama3");
    mkv_tokenizer_free(tok);
}

Test(tokenizer_bpe, qwen2_gguf)
{
    mkv_tokenizer_t *tok = spec_from_json("tokenizer_qwen2", "qwen2", -1);
    check_cases(tok, FIXTURES "/tokenizer_qwen2");
    mkv_tokenizer_free(tok);
}

Test(tokenizer_bpe, smollm2_gguf)
{
    tf_gguf_t g;
    if (!tf_gguf_read(SMOLLM2_GGUF, &g))
        cr_skip_test("%s is absent (scripts/fetch-smollm2.sh): skipped", SMOLLM2_GGUF);
    cr_assert_str_eq(g.model, "gpt2");
    cr_assert_str_eq(g.pre, "smollm");
    mkv_bpe_spec_t sp = {.n_vocab = g.n_tokens, .tokens = (const char *const *)g.tokens,
                         .token_lens = g.token_lens, .token_types = g.token_types,
                         .n_merges = g.n_merges, .merges = (const char *const *)g.merges,
                         .merge_lens = g.merge_lens, .model = g.model, .pre = g.pre, .bos = g.bos,
                         .eos = g.eos, .unk = g.unk, .pad = g.pad, .add_bos = g.add_bos};
    char err[MKV_ERR_LEN] = "";
    mkv_tokenizer_t *tok = NULL;
    mkv_status_t st = mkv_tokenizer_create_bpe(&sp, &tok, err);
    tf_gguf_free(&g);
    cr_assert_eq(st, MKV_STATUS_OK, "create_bpe: %s (%s)", mkv_status_string(st), err);
    cr_expect_eq(mkv_tokenizer_vocab_size(tok), 49152);
    cr_expect_eq(mkv_tokenizer_bos(tok), 1);
    cr_expect_eq(mkv_tokenizer_eos(tok), 2);
    cr_expect_eq(mkv_tokenizer_add_bos(tok), 0);
    cr_expect_eq(mkv_tokenizer_token_id(tok, "<|im_start|>"), 1);
    cr_expect_eq(mkv_tokenizer_token_id(tok, "\xC4\xA0the"), 260); /* "Ġthe" */
    /* README's check. */
    static const char chat[] = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                               "<|im_start|>assistant\n";
    static const int32_t want[] = {1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198,
                                   1, 520, 9531, 198};
    int32_t n, *ids = tf_encode(tok, chat, strlen(chat), 0, &n);
    tf_expect_ids(ids, n, want, 16, "README chat", chat);
    free(ids);
    check_cases(tok, FIXTURES "/tokenizer_smollm2");
    mkv_tokenizer_free(tok);
}

/* Every essay encoded in one call and decoded back to itself (no normalizer, no prefix
 * space): guards the pre-tokenizer and the merge loop on megabytes of real text. */
Test(tokenizer_bpe, essays_round_trip)
{
    static const char *const names[] = {"tokenizer_llama3", "tokenizer_gpt2"};
    glob_t g;
    size_t cap = 1 << 22, len = 0;
    char *text = malloc(cap + 1);
    cr_assert(text != NULL);
    if (glob(MIXKV_SHARED_DIR "/data/essays/*.txt", 0, NULL, &g) != 0) g.gl_pathc = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        FILE *f = fopen(g.gl_pathv[i], "rb");
        cr_assert(f != NULL, "%s", g.gl_pathv[i]);
        len += fread(text + len, 1, cap - len, f);
        fclose(f);
    }
    if (g.gl_pathc) globfree(&g);
    text[len] = '\0';
    if (len == 0) cr_skip_test("../shared/data/essays is absent: skipped");
    for (int t = 0; t < 2; t++) {
        mkv_tokenizer_t *tok = load_fixture(names[t]);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int32_t n, *ids = tf_encode(tok, text, len, 0, &n);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        char *d = tf_decode(tok, ids, n, 0);
        /* GPT-2's fixture adds a prefix space to the text's first piece only. */
        cr_expect_str_eq(d + (t == 1 && text[0] != ' '), text, "%s: round trip", names[t]);
        cr_log_info("%s: %zu bytes -> %d ids in %.3f s", names[t], len, n,
                    (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        free(d);
        free(ids);
        mkv_tokenizer_free(tok);
    }
    free(text);
}
