/*
 * test_tokenizer_hard.c — what the byte-level tokenizer refuses, and input it must survive:
 * an unk_token outside the vocabulary, an id given twice or a token listed twice, bos / eos
 * ids past the vocabulary, merges naming unknown tokens, unsupported models, pre-tokenizers
 * and options (each message must name the culprit), a normalizer that would blow a short
 * prompt up to megabytes, and ill-formed UTF-8 (every byte maps; pieces give the bytes back).
 */
#include "tokenizer_fixture.h"

#include <unistd.h>

#ifndef MIXKV_SOURCE_DIR
#define MIXKV_SOURCE_DIR "."
#endif
#define FIXTURES MIXKV_SOURCE_DIR "/tests/fixtures"

/* A byte-level tokenizer.json; the %s are normalizer, pre_tokenizer, post_processor,
 * unk_token, vocab and merges. Ids 0..5: <s>, a, b, ab, Ġ, x. */
static const char fmt[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":%s,"
    "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"unk_token\":%s,"
    "\"vocab\":%s,\"merges\":%s}}";
#define VOCAB "{\"<s>\":0,\"a\":1,\"b\":2,\"ab\":3,\"\\u0120\":4,\"x\":5}"
#define BL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"

static mkv_status_t load_json(const char *norm, const char *pre, const char *post,
                              const char *unk, const char *vocab, const char *merges,
                              mkv_tokenizer_t **tok, char *err)
{
    char dir[64] = "/tmp/mkv_tokh_XXXXXX", path[128];
    static char json[1 << 16];
    snprintf(json, sizeof json, fmt, norm, pre, post, unk, vocab, merges);
    cr_assert(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL);
    fputs(json, f);
    fclose(f);
    *tok = NULL;
    mkv_status_t st = mkv_tokenizer_load(dir, tok, err);
    remove(path);
    rmdir(dir);
    cr_expect_eq(*tok == NULL, st != MKV_STATUS_OK);
    return st;
}

static void refused(mkv_status_t st, const char *err, mkv_status_t want, const char *name)
{
    cr_expect_eq(st, want, "%s: got '%s', want '%s' (%s)", name, mkv_status_string(st),
                 mkv_status_string(want), err);
    cr_expect(strstr(err, name) != NULL, "message '%s' does not name '%s'", err, name);
}

static mkv_status_t json_refusal(const char *norm, const char *pre, const char *post,
                                 const char *unk, const char *vocab, const char *merges, char *err)
{
    mkv_tokenizer_t *tok = NULL;
    mkv_status_t st = load_json(norm, pre, post, unk, vocab, merges, &tok, err);
    mkv_tokenizer_free(tok);
    return st;
}

Test(tokenizer_hard, json_refusals)
{
    char err[MKV_ERR_LEN] = "";
    mkv_tokenizer_t *tok = NULL;
    cr_assert_eq(load_json("null", BL, "null", "\"<s>\"", VOCAB, "[\"a b\"]", &tok, err),
                 MKV_STATUS_OK, "%s", err); /* the baseline loads */
    mkv_tokenizer_free(tok);
    mkv_status_t st = json_refusal("null", BL, "null", "\"<nope>\"", VOCAB, "[]", err);
    refused(st, err, MKV_STATUS_PARSE_ERROR, "<nope>");
    st = json_refusal("null", BL, "null", "null", "{\"<s>\":0,\"a\":1,\"b\":1}", "[]", err);
    refused(st, err, MKV_STATUS_PARSE_ERROR, "id 1");
    st = json_refusal("null", BL, "null", "null", "{\"<s>\":0,\"a\":1,\"a\":2}", "[]", err);
    refused(st, err, MKV_STATUS_PARSE_ERROR, "twice");
    st = json_refusal("null", BL, "null", "null", VOCAB, "[\"a q\"]", err);
    refused(st, err, MKV_STATUS_PARSE_ERROR, "'q'");
    st = json_refusal("null", BL, "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
                      "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                      "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[99],\"tokens\":[\"<s>\"]}}}",
                      "null", VOCAB, "[]", err);
    refused(st, err, MKV_STATUS_PARSE_ERROR, "bos id 99");
    st = json_refusal("null", "{\"type\":\"Whitespace\"}", "null", "null", VOCAB, "[]", err);
    refused(st, err, MKV_STATUS_UNSUPPORTED, "Whitespace");
    st = json_refusal("null", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":"
                      "\"Sideways\",\"invert\":false}", "null", "null", VOCAB, "[]", err);
    refused(st, err, MKV_STATUS_UNSUPPORTED, "Sideways");
    st = json_refusal("null", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":"
                      "\"Isolated\",\"invert\":false}", "null", "null", VOCAB, "[]", err);
    refused(st, err, MKV_STATUS_PARSE_ERROR, "(a");
    st = json_refusal("null", "{\"type\":\"Sequence\",\"pretokenizers\":[" BL ",{\"type\":"
                      "\"Digits\",\"individual_digits\":true}]}", "null", "null", VOCAB, "[]", err);
    refused(st, err, MKV_STATUS_UNSUPPORTED, "Digits");
    st = json_refusal("{\"type\":\"NFKC\"}", BL, "null", "null", VOCAB, "[]", err);
    refused(st, err, MKV_STATUS_UNSUPPORTED, "NFKC");
    st = json_refusal("null", BL, "{\"type\":\"RobertaProcessing\"}", "null", VOCAB, "[]", err);
    refused(st, err, MKV_STATUS_UNSUPPORTED, "RobertaProcessing");
}

/* Fuzz findings (fuzz/corpus/tokenizer/): ids far beyond the vocabulary would size the id
 * tables (id 999999999: 8 GB); normalizer strings that are not UTF-8 made invalid text that the
 * BPE loop never advanced over; ten chained growing Replace steps hit the growth limit. */
Test(tokenizer_hard, fuzz_findings, .timeout = 20)
{
    char err[MKV_ERR_LEN] = "";
    mkv_status_t st = json_refusal("null", BL, "null", "null", "{\"<s>\":0,\"a\":999999999}",
                                   "[]", err);
    refused(st, err, MKV_STATUS_PARSE_ERROR, "not dense");
    st = json_refusal("{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xff\"}",
                      BL, "null", "null", VOCAB, "[]", err);
    refused(st, err, MKV_STATUS_PARSE_ERROR, "not valid UTF-8");
    st = json_refusal("{\"type\":\"Prepend\",\"prepend\":\"\x96\"}", BL, "null", "null", VOCAB,
                      "[]", err);
    refused(st, err, MKV_STATUS_PARSE_ERROR, "not valid UTF-8");
    /* Ten chained Replace steps, each turning "s" into "ssss". */
    char norm[2048] = "{\"type\":\"Sequence\",\"normalizers\":[";
    for (int i = 0; i < 10; i++)
        strcat(norm, i ? ",{\"type\":\"Replace\",\"pattern\":{\"String\":\"s\"},\"content\":\"ssss\"}"
                       : "{\"type\":\"Replace\",\"pattern\":{\"String\":\"s\"},\"content\":\"ssss\"}");
    strcat(norm, "]}");
    mkv_tokenizer_t *tok = NULL;
    st = load_json(norm, BL, "null", "null", VOCAB, "[]", &tok, err);
    /* <s> is special and not normalized in this fixture: the load succeeds, and a text of
     * s's hits the per-text limit instead of running for ever. */
    cr_assert_eq(st, MKV_STATUS_OK, "%s", err);
    int32_t n = 0, *ids = NULL;
    st = mkv_tokenizer_encode(tok, "sss", 3, 0, &ids, &n, err);
    refused(st, err, MKV_STATUS_INVALID_ARGUMENT, "normalizer");
    free(ids);
    mkv_tokenizer_free(tok);
}

/* A Replace normalizer that turns each "a" into 1,000 "x": a 10,000-byte prompt would become
 * 10 MB (and as many tokens); it is refused at the limit, before the memory is taken. */
Test(tokenizer_hard, normalizer_growth_is_capped)
{
    char norm[1200], err[MKV_ERR_LEN] = "";
    int len = snprintf(norm, sizeof norm, "{\"type\":\"Replace\",\"pattern\":{\"String\":\"a\"},"
                       "\"content\":\"");
    for (int i = 0; i < 1000; i++) norm[len++] = 'x';
    strcpy(norm + len, "\"}");
    mkv_tokenizer_t *tok = NULL;
    cr_assert_eq(load_json(norm, BL, "null", "null", VOCAB, "[]", &tok, err), MKV_STATUS_OK,
                 "%s", err);
    int32_t n, *ids = tf_encode(tok, "ab", 2, 0, &n); /* 1,001 bytes: under 16 x 2 + 4 KiB */
    cr_expect_eq(n, 1001);
    free(ids);
    char *text = malloc(10001);
    cr_assert(text != NULL);
    memset(text, 'a', 10000);
    text[10000] = '\0';
    ids = NULL;
    mkv_status_t st = mkv_tokenizer_encode(tok, text, 10000, 0, &ids, &n, err);
    refused(st, err, MKV_STATUS_INVALID_ARGUMENT, "normalizer");
    cr_expect(ids == NULL);
    free(text);
    mkv_tokenizer_free(tok);
}

/* ---------------------------------------------------------------------------------------- */
/* The GGUF constructor                                                                     */
/* ---------------------------------------------------------------------------------------- */

static const char *const toks[] = {"<s>", "a", "b", "ab", "\xC4\xA0", "x"};
static const int32_t types[] = {3, 1, 1, 1, 1, 4};
static const char *const merges[] = {"a b"};

static mkv_bpe_spec_t base_spec(void)
{
    return (mkv_bpe_spec_t){.n_vocab = 6, .tokens = toks, .token_types = types, .n_merges = 1,
                            .merges = merges, .model = "gpt2", .pre = "gpt2", .bos = 0,
                            .eos = 0, .unk = -1, .pad = -1, .add_bos = 1};
}

static mkv_status_t create(const mkv_bpe_spec_t *sp, char *err)
{
    mkv_tokenizer_t *tok = NULL;
    mkv_status_t st = mkv_tokenizer_create_bpe(sp, &tok, err);
    cr_expect_eq(tok == NULL, st != MKV_STATUS_OK);
    mkv_tokenizer_free(tok);
    return st;
}

Test(tokenizer_hard, gguf_refusals)
{
    char err[MKV_ERR_LEN] = "";
    mkv_bpe_spec_t sp = base_spec();
    cr_assert_eq(create(&sp, err), MKV_STATUS_OK, "%s", err);
    sp.bos = 6;
    refused(create(&sp, err), err, MKV_STATUS_PARSE_ERROR, "bos id 6");
    sp = base_spec();
    sp.eos = -2;
    refused(create(&sp, err), err, MKV_STATUS_PARSE_ERROR, "eos id -2");
    sp = base_spec();
    sp.pad = 100;
    refused(create(&sp, err), err, MKV_STATUS_PARSE_ERROR, "pad id 100");
    sp = base_spec();
    static const char *const dup[] = {"<s>", "a", "b", "ab", "a", "x"};
    sp.tokens = dup;
    refused(create(&sp, err), err, MKV_STATUS_PARSE_ERROR, "twice");
    sp = base_spec();
    static const char *const bad_merge[] = {"a q"};
    sp.merges = bad_merge;
    refused(create(&sp, err), err, MKV_STATUS_PARSE_ERROR, "'q'");
    static const char *const no_space[] = {"ab"};
    sp.merges = no_space;
    refused(create(&sp, err), err, MKV_STATUS_PARSE_ERROR, "merge 0");
    sp = base_spec();
    sp.model = "llama";
    refused(create(&sp, err), err, MKV_STATUS_UNSUPPORTED, "'llama'");
    sp = base_spec();
    sp.pre = "falcon";
    refused(create(&sp, err), err, MKV_STATUS_UNSUPPORTED, "'falcon'");
    sp = base_spec();
    static const int32_t lens[] = {3, 1, 1, 2, 2, 0};
    sp.token_lens = lens;
    refused(create(&sp, err), err, MKV_STATUS_PARSE_ERROR, "token 5");
}

Test(tokenizer_hard, gguf_tokens)
{
    char err[MKV_ERR_LEN] = "";
    mkv_bpe_spec_t sp = base_spec();
    mkv_tokenizer_t *tok = NULL;
    cr_assert_eq(mkv_tokenizer_create_bpe(&sp, &tok, err), MKV_STATUS_OK, "%s", err);
    /* "<s>" (control) and "x" (user-defined) are matched whole in the raw text; with skip,
     * only the control token is dropped. */
    static const int32_t want[] = {0, 3, 4, 5, 1, 0};
    int32_t n, *ids = tf_encode(tok, "<s>ab xa<s>", 11, 0, &n);
    tf_expect_ids(ids, n, want, 6, "specials", "<s>ab xa<s>");
    char *d = tf_decode(tok, ids, n, 0), *ds = tf_decode(tok, ids, n, 1);
    cr_expect_str_eq(d, "<s>ab xa<s>");
    cr_expect_str_eq(ds, "ab xa");
    free(d);
    free(ds);
    free(ids);
    cr_expect_eq(mkv_tokenizer_token_id(tok, "x"), 5);
    cr_expect_eq(mkv_tokenizer_token_id(tok, " "), -1); /* stored as "Ġ" */
    cr_expect_eq(mkv_tokenizer_token_id(tok, "\xC4\xA0"), 4);
    mkv_tokenizer_free(tok);
}

/* ---------------------------------------------------------------------------------------- */
/* Ill-formed UTF-8                                                                         */
/* ---------------------------------------------------------------------------------------- */

static int valid_utf8(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t l = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        if (c >= 0x80 && (c < 0xC2 || c > 0xF4)) return 0;
        if (i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

static mkv_tokenizer_t *load_fixture(const char *name)
{
    char dir[512], err[MKV_ERR_LEN] = "";
    mkv_tokenizer_t *tok = NULL;
    snprintf(dir, sizeof dir, FIXTURES "/%s", name);
    cr_assert_eq(mkv_tokenizer_load(dir, &tok, err), MKV_STATUS_OK, "%s: %s", dir, err);
    return tok;
}

Test(tokenizer_hard, ill_formed_utf8)
{
    static const char *const names[] = {"tokenizer_llama3", "tokenizer_qwen2", "tokenizer_gpt2",
                                        "tokenizer_splits"};
    /* Decoding follows Rust's from_utf8_lossy: one U+FFFD per maximal ill-formed subpart. */
    static const struct { const char *in, *out; } lossy[] = {
        {"a\xED\xA0\x80" "b", "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b"}, /* a surrogate */
        {"\xF0\x9F\x98x", "\xEF\xBF\xBDx"},                                /* cut emoji */
        {"\xC0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},                          /* overlong */
        {"\xE2\x82", "\xEF\xBF\xBD"},
        {"\xFF\xFE", "\xEF\xBF\xBD\xEF\xBF\xBD"},
    };
    mkv_tokenizer_t *tok = load_fixture(names[0]);
    for (int i = 0; i < 5; i++) {
        int32_t n, *ids = tf_encode(tok, lossy[i].in, strlen(lossy[i].in), 0, &n);
        char *d = tf_decode(tok, ids, n, 0), *p = tf_pieces(tok, ids, n);
        cr_expect_str_eq(d, lossy[i].out, "lossy case %d", i);
        cr_expect_str_eq(p, lossy[i].in, "pieces of lossy case %d", i); /* raw bytes back */
        free(d);
        free(p);
        free(ids);
    }
    mkv_tokenizer_free(tok);
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (int t = 0; t < 4; t++) {
        tok = load_fixture(names[t]);
        int32_t nv = mkv_tokenizer_vocab_size(tok);
        for (int c = 0; c < 300; c++) {
            char s[97];
            size_t len = (size_t)(c % 97);
            for (size_t i = 0; i < len; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                s[i] = (char)(r >> 56);
                if (s[i] == '\0') s[i] = (char)0x80; /* the C strings below stop at NUL */
            }
            s[len] = '\0';
            int32_t n, *ids = tf_encode(tok, s, len, 0, &n);
            for (int32_t i = 0; i < n; i++) cr_assert(ids[i] >= 0 && ids[i] < nv);
            char *d = tf_decode(tok, ids, n, 0);
            cr_expect(valid_utf8(d), "%s: decode of random bytes %d is not UTF-8", names[t], c);
            if (t == 0) { /* no normalizer, no prefix space: the pieces are the bytes */
                char *p = tf_pieces(tok, ids, n);
                cr_expect_str_eq(p, s, "%s: pieces of random bytes %d", names[t], c);
                free(p);
            }
            free(d);
            free(ids);
        }
        mkv_tokenizer_free(tok);
    }
}
