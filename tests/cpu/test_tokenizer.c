/*
 * test_tokenizer.c — the tokenizer.json BPE tokenizer (runner/tokenizer.h) on the TinyStories-656K
 * tokenizer in ../shared: ids derived by hand from tokenizer.json; a fixture produced offline by
 * Hugging Face `tokenizers`; paragraph round trips over the validation text; the whole text
 * encoded at once (guards the O(n log n) merge loop); streaming pieces; a byte-fallback
 * tokenizer written here; refused files. Tests that need ../shared skip without it.
 */
#include "runner/tokenizer.h"

#include "common/error.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef MIXKV_SHARED_DIR
#define MIXKV_SHARED_DIR "../shared"
#endif
#define MODEL_DIR MIXKV_SHARED_DIR "/models/tinystories-656k"
#define VAL_TXT MIXKV_SHARED_DIR "/data/tinystories/tinystories_val_dev.txt"

#define ARRAY_LEN(a) ((int32_t)(sizeof(a) / sizeof((a)[0])))

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static mkv_tokenizer_t *load_dir(const char *dir)
{
    char err[MKV_ERR_LEN] = "";
    mkv_tokenizer_t *tok = NULL;
    mkv_status_t st = mkv_tokenizer_load(dir, &tok, err);
    cr_assert_eq(st, MKV_STATUS_OK, "load %s: %s (%s)", dir, mkv_status_string(st), err);
    return tok;
}

static mkv_tokenizer_t *load_tinystories(void)
{
    if (access(MODEL_DIR "/tokenizer.json", R_OK) != 0)
        cr_skip_test("%s/tokenizer.json is absent (no ../shared checkout): skipped", MODEL_DIR);
    return load_dir(MODEL_DIR);
}

static int32_t *enc(const mkv_tokenizer_t *tok, const char *s, size_t len, int add_bos,
                    int32_t *n)
{
    char err[MKV_ERR_LEN] = "";
    int32_t *ids = NULL;
    mkv_status_t st = mkv_tokenizer_encode(tok, s, len, add_bos, &ids, n, err);
    cr_assert_eq(st, MKV_STATUS_OK, "encode: %s (%s)", mkv_status_string(st), err);
    cr_assert(ids != NULL);
    return ids;
}

static char *dec(const mkv_tokenizer_t *tok, const int32_t *ids, int32_t n, int skip)
{
    char err[MKV_ERR_LEN] = "";
    char *s = NULL;
    mkv_status_t st = mkv_tokenizer_decode(tok, ids, n, skip, &s, err);
    cr_assert_eq(st, MKV_STATUS_OK, "decode: %s (%s)", mkv_status_string(st), err);
    return s;
}

static void expect_ids(const int32_t *got, int32_t n_got, const int32_t *want, int32_t n_want,
                       const char *what)
{
    for (int32_t i = 0; i < n_got && i < n_want; i++)
        cr_assert_eq(got[i], want[i], "%s: id %d is %d, want %d", what, i, got[i], want[i]);
    cr_assert_eq(n_got, n_want, "%s: %d ids, want %d", what, n_got, n_want);
}

/* Concatenation of mkv_tokenizer_piece over ids, as a streaming printer would do. */
static char *pieces(const mkv_tokenizer_t *tok, const int32_t *ids, int32_t n)
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

static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) cr_skip_test("%s is absent (no ../shared checkout): skipped", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert(s != NULL);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    s[n] = '\0';
    *len = (size_t)n;
    return s;
}

/* ---------------------------------------------------------------------------------------- */
/* Ids read off tokenizer.json by hand                                                      */
/* ---------------------------------------------------------------------------------------- */

Test(tokenizer, metadata)
{
    mkv_tokenizer_t *tok = load_tinystories();
    /* model.vocab holds ids 0..2047; bos/eos come from tokenizer_config.json, unk from
     * model.unk_token. */
    cr_expect_eq(mkv_tokenizer_vocab_size(tok), 2048);
    cr_expect_eq(mkv_tokenizer_bos(tok), 1);
    cr_expect_eq(mkv_tokenizer_eos(tok), 2);
    cr_expect_eq(mkv_tokenizer_unk(tok), 0);
    mkv_tokenizer_free(tok);
}

typedef struct hand_case {
    const char *text;
    int32_t ids[4];
    int32_t n;
} hand_case_t;

Test(tokenizer, hand_derived_ids)
{
    /* The normalizer turns text into "▁" + text with spaces as "▁" (U+2581). Merge ranks are
     * positions in model.merges; ids come from model.vocab. */
    static const hand_case_t cases[] = {
        /* added_tokens[1] has normalized=true: HF matches its normalized content
         * "▁<|start_story|>" in the normalized text "▁<|start_story|>". */
        {"<|start_story|>", {1}, 1},
        {"<|end_story|>", {2}, 1},
        /* "▁a": merge 4 is "▁ a"; vocab "▁a" = 85. */
        {"a", {85}, 1},
        /* "▁the▁": pairs (▁,t) none, (t,h) 2, (h,e) 28, (e,▁) 0 -> "e ▁" first; then (t,h) 2
         * beats (h,e▁) 16; then "th e▁" 12; then "▁ the▁" 27: vocab "▁the▁" = 108. */
        {"the ", {108}, 1},
        /* "▁\n": no merge "▁ \n"; vocab "▁" = 80, "\n" = 3. */
        {"\n", {80, 3}, 2},
        /* "▁▁": no merge "▁ ▁". */
        {" ", {80, 80}, 2},
        /* "é" is not in vocab and there are no <0xXX> tokens: unk_token "<unk>" = 0; fuse_unk
         * makes a run of unknowns one <unk>. */
        {"\xC3\xA9", {80, 0}, 2},
        {"\xC3\xA9\xC3\xA9\xE2\x82\xAC", {80, 0}, 2},
        /* "▁a▁<|end_story|>": the special is matched as "▁<|end_story|>", leaving "▁a". */
        {"a <|end_story|>", {85, 2}, 2},
    };
    mkv_tokenizer_t *tok = load_tinystories();
    for (int32_t c = 0; c < ARRAY_LEN(cases); c++) {
        int32_t n;
        int32_t *ids = enc(tok, cases[c].text, strlen(cases[c].text), 0, &n);
        expect_ids(ids, n, cases[c].ids, cases[c].n, cases[c].text);
        free(ids);
    }
    mkv_tokenizer_free(tok);
}

/* ---------------------------------------------------------------------------------------- */
/* Fixture from Hugging Face tokenizers                                                     */
/* ---------------------------------------------------------------------------------------- */

typedef struct hf_case {
    const char *text;
    int32_t ids[32];
    int32_t n;
    const char *decoded, *decoded_skip; /* decode(ids, skip_special_tokens=False / True) */
} hf_case_t;

/* Produced offline with HF tokenizers 0.22.2 (Tokenizer.from_file(tokenizer.json),
 * encode(text, add_special_tokens=False).ids, decode(ids, skip_special_tokens=...)); encodings
 * are identical in 0.21.1 and 0.23.3. NOTE: 0.23.x decodes normalized added tokens with their
 * normalized text ("▁<unk>") and no longer skips them; mixkv follows 0.21/0.22. */
static const hf_case_t hf_cases[] = {
    {"Once upon a time, there was a little girl named Lily.",
     {80, 147, 201, 282, 215, 286, 598, 629, 10}, 9,
     "Once upon a time, there was a little girl named Lily.",
     "Once upon a time, there was a little girl named Lily."},
    {"Hello world", {80, 1288, 139, 410, 555}, 5, "Hello world", "Hello world"},
    {"  leading and trailing  ", {80, 80, 80, 656, 56, 734, 925, 129, 149, 80}, 10,
     "  leading and trailing  ", "  leading and trailing  "},
    {"multiple   spaces", {80, 439, 64, 548, 785, 80, 80, 415, 53, 1499}, 10,
     "multiple   spaces", "multiple   spaces"},
    {"line one\nline two\n\nline three\n",
     {80, 64, 1780, 719, 3, 64, 1780, 865, 67, 3, 3, 64, 1780, 1161, 57, 3}, 16,
     "line one\nline two\n\nline three\n", "line one\nline two\n\nline three\n"},
    {"caf\303\251", {80, 295, 58, 0}, 4, "caf<unk>", "caf"},
    {"price: 5\342\202\254", {80, 635, 682, 1608, 16, 0}, 6, "price: 5<unk>", "price: 5"},
    {"emoji \360\237\230\200\360\237\230\200 here", {80, 57, 605, 62, 2024, 0, 962, 57}, 8,
     "emoji <unk> here", "emoji  here"},
    {"\303\251\303\251\303\251\342\202\254x", {80, 0, 76}, 3, "<unk>x", "x"},
    {"\303\242\342\202\254\305\223Yes,\303\242\342\202\254\302\235 she said.",
     {80, 0, 50, 233, 8, 0, 80, 242, 174, 10}, 10, "<unk>Yes,<unk> she said.", "Yes, she said."},
    {"<|start_story|>Once upon a time", {1, 147, 201, 282, 57}, 5,
     "<|start_story|>Once upon a time", "Once upon a time"},
    {"The end. <|end_story|> <|start_story|>Next", {80, 247, 183, 10, 2, 1, 39, 375, 72}, 9,
     "The end.<|end_story|><|start_story|>Next", "The end.Next"},
    {"mid<|end_story|>dle", {80, 65, 121, 208, 183, 209, 210, 56, 161}, 9,
     "mid<|end_story|>dle", "mid<|end_story|>dle"},
    {"<unk> and x<unk>", {0, 100, 76, 23, 148, 63, 24}, 7, "<unk> and x<unk>", "and x<unk>"},
    {"", {0}, 0, "", ""},
    {" ", {80, 80}, 2, " ", " "},
    {"\n", {80, 3}, 2, "\n", "\n"},
    {"\"Yes!\" she said. 'No?' he asked; 1, 2, 3...",
     {80, 5, 50, 233, 300, 242, 174, 84, 7, 39, 67, 25, 7, 80, 97, 571, 192, 22, 80, 12, 94, 13,
      94, 14, 10, 10, 10}, 27,
     "\"Yes!\" she said. 'No?' he asked; 1, 2, 3...",
     "\"Yes!\" she said. 'No?' he asked; 1, 2, 3..."},
    {"A_B|C<D>E$F", {80, 26, 52, 27, 79, 28, 23, 29, 24, 30, 6, 31}, 12, "A_B|C<D>E$F",
     "A_B|C<D>E$F"},
    {"The quick brown fox jumps over the lazy dog.",
     {80, 247, 1746, 312, 1216, 983, 480, 1841, 691, 89, 1194, 108, 291, 78, 87, 604, 10}, 17,
     "The quick brown fox jumps over the lazy dog.",
     "The quick brown fox jumps over the lazy dog."},
    {"\ttab", {80, 0, 292, 54}, 4, "<unk>tab", "tab"},
    {"<|start_story|><|start_story|>", {1, 208, 212, 210}, 4, "<|start_story|><|start_story|>",
     "<|start_story|>"},
    {"Spot. Spot saw the shiny car and said, \"Wow, Kitty, your car is so bright and clean!\"",
     {80, 1030, 1063, 677, 1169, 237, 624, 1681, 1005, 490, 545, 826, 124, 253, 1135, 186, 702,
      1104, 4, 5}, 20,
     "Spot. Spot saw the shiny car and said, \"Wow, Kitty, your car is so bright and clean!\"",
     "Spot. Spot saw the shiny car and said, \"Wow, Kitty, your car is so bright and clean!\""},
};

/* The whole validation text in one encode call, same oracle: id count and FNV-1a 64 over the
 * ids (h = (h ^ id) * 1099511628211, from 1469598103934665603). */
enum { VAL_N_IDS = 150615 };
#define VAL_IDS_FNV 0x00921e01816c97a2ull

static void check_hf_cases(const mkv_tokenizer_t *tok, const hf_case_t *cases, int32_t n_cases)
{
    for (int32_t c = 0; c < n_cases; c++) {
        const hf_case_t *k = &cases[c];
        int32_t n;
        int32_t *ids = enc(tok, k->text, strlen(k->text), 0, &n);
        expect_ids(ids, n, k->ids, k->n, k->text);
        char *d = dec(tok, ids, n, 0), *ds = dec(tok, ids, n, 1);
        cr_expect_str_eq(d, k->decoded, "decode of '%s'", k->text);
        cr_expect_str_eq(ds, k->decoded_skip, "decode(skip_special) of '%s'", k->text);
        free(d);
        free(ds);
        free(ids);
    }
}

Test(tokenizer, hf_fixture)
{
    mkv_tokenizer_t *tok = load_tinystories();
    check_hf_cases(tok, hf_cases, ARRAY_LEN(hf_cases));
    mkv_tokenizer_free(tok);
}

Test(tokenizer, add_bos)
{
    mkv_tokenizer_t *tok = load_tinystories();
    static const int32_t a[] = {1, 85}, bos_only[] = {1}, story[] = {1, 147, 201, 282, 57},
                         twice[] = {1, 208, 212, 210};
    static const char *texts[] = {"a", "", "<|start_story|>Once upon a time",
                                  "<|start_story|><|start_story|>"};
    const int32_t *want[] = {a, bos_only, story, twice};
    const int32_t n_want[] = {2, 1, 5, 4};
    /* BOS prepended unless the text's first token already is BOS (never doubled). */
    for (int32_t c = 0; c < ARRAY_LEN(texts); c++) {
        int32_t n;
        int32_t *ids = enc(tok, texts[c], strlen(texts[c]), 1, &n);
        expect_ids(ids, n, want[c], n_want[c], texts[c]);
        free(ids);
    }
    int32_t n = -1;
    int32_t *ids = enc(tok, NULL, 0, 0, &n);
    cr_expect_eq(n, 0);
    free(ids);
    mkv_tokenizer_free(tok);
}

/* ---------------------------------------------------------------------------------------- */
/* The validation text                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* Whether a code point (UTF-8 at s, cl bytes) maps to <unk>: encode it alone. Cached. */
static int is_unknown(const mkv_tokenizer_t *tok, const char *s, size_t cl)
{
    static char seen[256][4];
    static int verdict[256], n_seen;
    for (int i = 0; i < n_seen; i++)
        if (memcmp(seen[i], s, cl) == 0 && (cl == 4 || seen[i][cl] == '\0')) return verdict[i];
    int32_t n, unk = 0;
    int32_t *ids = enc(tok, s, cl, 0, &n);
    for (int32_t i = 0; i < n; i++) unk |= ids[i] == mkv_tokenizer_unk(tok);
    free(ids);
    cr_assert_lt(n_seen, 256, "too many distinct characters");
    memset(seen[n_seen], 0, 4);
    memcpy(seen[n_seen], s, cl);
    verdict[n_seen++] = unk;
    return unk;
}

/* What decoding gives back for text: each run of unknown characters as "<unk>" (fused), or
 * dropped (skip_special: <unk> is special). Counts the unknown characters. */
static char *expected_text(const mkv_tokenizer_t *tok, const char *s, size_t n, int skip,
                           int64_t *n_unknown)
{
    char *out = malloc(5 * n + 1);
    size_t len = 0;
    int in_run = 0;
    cr_assert(out != NULL);
    for (size_t i = 0, cl; i < n; i += cl) {
        unsigned char c = (unsigned char)s[i];
        cl = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (is_unknown(tok, s + i, cl)) {
            if (!in_run && !skip) {
                memcpy(out + len, "<unk>", 5);
                len += 5;
            }
            in_run = 1;
            *n_unknown += 1;
        } else {
            memcpy(out + len, s + i, cl);
            len += cl;
            in_run = 0;
        }
    }
    out[len] = '\0';
    return out;
}

Test(tokenizer, paragraph_round_trip)
{
    mkv_tokenizer_t *tok = load_tinystories();
    size_t len;
    char *text = read_text(VAL_TXT, &len);
    int64_t n_par = 0, n_chars = 0, n_unknown = 0, n_unk_tokens = 0;
    for (char *p = text, *end; p < text + len; p = end + (*end ? 2 : 0)) {
        end = strstr(p, "\n\n");
        if (!end) end = text + len;
        size_t plen = (size_t)(end - p);
        char *par = strndup(p, plen);
        int32_t n;
        int32_t *ids = enc(tok, par, plen, 1, &n);
        cr_assert(n >= 1 && ids[0] == 1, "paragraph %ld: no BOS", (long)n_par);
        for (int32_t i = 0; i < n; i++) n_unk_tokens += ids[i] == 0;
        int64_t unknown = 0, unused = 0;
        char *want = expected_text(tok, par, plen, 0, &unknown);
        char *want_skip = expected_text(tok, par, plen, 1, &unused);
        char *got = dec(tok, ids + 1, n - 1, 0), *got_skip = dec(tok, ids, n, 1);
        char *streamed = pieces(tok, ids, n);
        cr_assert_str_eq(got, want, "paragraph %ld: decode(encode(p)) differs", (long)n_par);
        cr_assert_str_eq(got_skip, want_skip, "paragraph %ld: skip_special", (long)n_par);
        cr_assert_str_eq(streamed, got_skip, "paragraph %ld: pieces differ from decode",
                         (long)n_par);
        n_unknown += unknown;
        n_chars += (int64_t)plen;
        n_par++;
        free(par);
        free(ids);
        free(want);
        free(want_skip);
        free(got);
        free(got_skip);
        free(streamed);
    }
    cr_log_info("tokenizer round trip: %ld paragraphs, %ld bytes, %ld characters to <unk> in "
                "%ld <unk> tokens", (long)n_par, (long)n_chars, (long)n_unknown,
                (long)n_unk_tokens);
    cr_expect_gt(n_par, 1000);
    /* The file's few unknowns are mojibake of curly quotes ("â€œ"); each run fuses. */
    cr_expect_lt(n_unknown, n_chars / 500, "%ld unknown characters", (long)n_unknown);
    cr_expect_leq(n_unk_tokens, n_unknown);
    free(text);
    mkv_tokenizer_free(tok);
}

Test(tokenizer, whole_file_at_once)
{
    mkv_tokenizer_t *tok = load_tinystories();
    size_t len;
    char *text = read_text(VAL_TXT, &len);
    struct timespec t0, t1;
    int32_t n;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int32_t *ids = enc(tok, text, len, 0, &n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 1099511628211ull;
    cr_log_info("tokenizer: %zu bytes as one piece -> %d ids in %.3f s", len, n, s);
    cr_expect_eq(n, VAL_N_IDS);
    cr_expect_eq(h, VAL_IDS_FNV, "ids differ from HF tokenizers (hash %016llx)",
                 (unsigned long long)h);
    /* NOTE: the one timing assertion of the suite, deliberately loose: a quadratic merge loop
     * takes minutes on this 600 KB single piece, the heap well under a second. */
    cr_expect_lt(s, 5.0, "encoding took %.1f s: is the merge loop quadratic?", s);
    free(ids);
    free(text);
    mkv_tokenizer_free(tok);
}

Test(tokenizer, pieces)
{
    mkv_tokenizer_t *tok = load_tinystories();
    char buf[256];
    static const int32_t story[] = {1, 80, 147, 201, 282, 57, 2}; /* BOS "Once upon a time" EOS */
    char *s = pieces(tok, story, ARRAY_LEN(story));
    cr_expect_str_eq(s, "Once upon a time");
    free(s);
    cr_expect_str_eq(mkv_tokenizer_piece(tok, -1, 85, buf, sizeof buf), "a");
    cr_expect_str_eq(mkv_tokenizer_piece(tok, 1, 85, buf, sizeof buf), "a");
    cr_expect_str_eq(mkv_tokenizer_piece(tok, 85, 85, buf, sizeof buf), " a");
    cr_expect_str_eq(mkv_tokenizer_piece(tok, 0, 85, buf, sizeof buf), " a"); /* after <unk> */
    cr_expect_str_eq(mkv_tokenizer_piece(tok, 85, 2, buf, sizeof buf), "");
    cr_expect_str_eq(mkv_tokenizer_piece(tok, 85, 2048, buf, sizeof buf), "");
    mkv_tokenizer_free(tok);
}

/* ---------------------------------------------------------------------------------------- */
/* Tokenizers written here                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef struct tmp_dir {
    char path[64];
} tmp_dir_t;

static void write_file(const tmp_dir_t *d, const char *name, const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", d->path, name);
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static tmp_dir_t make_dir(const char *tokenizer_json, const char *config_json)
{
    tmp_dir_t d;
    snprintf(d.path, sizeof d.path, "/tmp/mkv_tok_XXXXXX");
    cr_assert(mkdtemp(d.path) != NULL);
    if (tokenizer_json) write_file(&d, "tokenizer.json", tokenizer_json);
    if (config_json) write_file(&d, "tokenizer_config.json", config_json);
    return d;
}

static void remove_dir(const tmp_dir_t *d)
{
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", d->path);
    remove(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", d->path);
    remove(path);
    rmdir(d->path);
}

/* Byte fallback with some <0xXX> tokens: é (C3 A9) and € (E2 82 AC) become bytes, 😀 has no
 * byte tokens and becomes <unk>. <s> and </s> are not normalized (split from the raw text, each
 * other piece normalized on its own); <X> is a normalized, non-special added token. */
static const char bf_json[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
    "{\"id\":0,\"content\":\"<unk>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":2,\"content\":\"</s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":15,\"content\":\"<X>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":true,\"special\":false}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
    "\"\342\226\201\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":"
    "\"\342\226\201\"}]},\"pre_tokenizer\":null,\"post_processor\":null,"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
    "{\"String\":\"\342\226\201\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":"
    "\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\","
    "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":true,"
    "\"byte_fallback\":true,\"ignore_merges\":false,\"vocab\":{\"<unk>\":0,\"<s>\":1,"
    "\"</s>\":2,\"\342\226\201\":3,\"a\":4,\"b\":5,\"c\":6,\"ab\":7,\"\342\226\201a\":8,"
    "\"abc\":9,\"<0xC3>\":10,\"<0xA9>\":11,\"<0xE2>\":12,\"<0x82>\":13,\"<0xAC>\":14,"
    "\"<X>\":15},\"merges\":[\"a b\",\"\342\226\201 a\",\"ab c\"]}}";

/* Same oracle (HF tokenizers 0.22.2) on bf_json. */
static const hf_case_t bf_cases[] = {
    {"abc \303\251\342\202\254\360\237\230\200 ab", {3, 9, 3, 10, 11, 12, 13, 14, 0, 3, 7}, 11,
     "abc \303\251\342\202\254<unk> ab", "abc \303\251\342\202\254 ab"},
    {"ab<s>a </s>", {3, 7, 1, 8, 3, 2}, 6, "ab<s> a </s>", "ab a "},
    {"<X>x<X> <X>", {15, 0, 15}, 3, "<X><unk><X>", "<X><X>"},
    {"ca\303\251b", {3, 6, 4, 10, 11, 5}, 6, "ca\303\251b", "ca\303\251b"},
    {"\303\251", {3, 10, 11}, 3, "\303\251", "\303\251"},
    /* HF does not flush a pending <unk> before byte tokens: the unknown 😀 comes out last. */
    {"\360\237\230\200\303\251", {3, 10, 11, 0}, 4, "\303\251<unk>", "\303\251"},
    {" ", {3, 3}, 2, " ", " "},
};

Test(tokenizer, byte_fallback)
{
    tmp_dir_t d = make_dir(bf_json, NULL);
    mkv_tokenizer_t *tok = load_dir(d.path);
    remove_dir(&d);
    cr_expect_eq(mkv_tokenizer_bos(tok), -1); /* no post-processor, no tokenizer_config.json */
    cr_expect_eq(mkv_tokenizer_eos(tok), -1);
    cr_expect_eq(mkv_tokenizer_vocab_size(tok), 16);
    check_hf_cases(tok, bf_cases, ARRAY_LEN(bf_cases));
    /* Streaming: byte tokens give raw bytes, which concatenate back into UTF-8. */
    char *s = pieces(tok, bf_cases[3].ids, bf_cases[3].n);
    cr_expect_str_eq(s, "ca\303\251b");
    free(s);
    /* A lone continuation byte is not UTF-8: U+FFFD per byte, as HF's ByteFallback. */
    static const int32_t lone[] = {4, 11, 11, 5};
    char *t = dec(tok, lone, 4, 0);
    cr_expect_str_eq(t, "a\357\277\275\357\277\275b");
    free(t);
    mkv_tokenizer_free(tok);
}

/* A minimal tokenizer; the %s are normalizer, pre_tokenizer, decoder and model type. */
static const char min_fmt[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":null,\"decoder\":%s,"
    "\"model\":{\"type\":\"%s\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
    "\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"ab\":3},\"merges\":[\"a b\"]}}";

static mkv_status_t load_min(const char *norm, const char *pre, const char *decoder,
                             const char *type, const char *config, char *err)
{
    char json[2048];
    mkv_tokenizer_t *tok = NULL;
    snprintf(json, sizeof json, min_fmt, norm, pre, decoder, type);
    tmp_dir_t d = make_dir(json, config);
    mkv_status_t st = mkv_tokenizer_load(d.path, &tok, err);
    remove_dir(&d);
    cr_expect_eq(tok == NULL, st != MKV_STATUS_OK);
    mkv_tokenizer_free(tok);
    return st;
}

static void expect_refused(mkv_status_t st, const char *err, mkv_status_t want, const char *name)
{
    cr_expect_eq(st, want, "%s: got '%s', want '%s' (%s)", name, mkv_status_string(st),
                 mkv_status_string(want), err);
    cr_expect(strstr(err, name) != NULL, "message '%s' does not name '%s'", err, name);
}

Test(tokenizer, minimal_without_decoder)
{
    char json[2048];
    snprintf(json, sizeof json, min_fmt, "null", "null", "null", "BPE");
    tmp_dir_t d = make_dir(json, NULL);
    mkv_tokenizer_t *tok = load_dir(d.path);
    remove_dir(&d);
    /* HF: [3, 3], [3, 0, 1]; without a decoder the tokens are joined with spaces. */
    static const int32_t abab[] = {3, 3}, mixed[] = {3, 0, 1};
    int32_t n;
    int32_t *ids = enc(tok, "abab", 4, 1, &n);
    expect_ids(ids, n, abab, 2, "abab");
    free(ids);
    ids = enc(tok, "ab xa", 5, 0, &n);
    expect_ids(ids, n, mixed, 3, "ab xa");
    char *s = dec(tok, ids, n, 0), *ss = dec(tok, ids, n, 1);
    cr_expect_str_eq(s, "ab <unk> a");
    cr_expect_str_eq(ss, "ab a");
    free(s);
    free(ss);
    free(ids);
    mkv_tokenizer_free(tok);
}

Test(tokenizer, refused_files)
{
    char err[MKV_ERR_LEN] = "";
    mkv_tokenizer_t *tok = NULL;
    mkv_status_t st = mkv_tokenizer_load("/nonexistent/mkv_tok", &tok, err);
    expect_refused(st, err, MKV_STATUS_IO_ERROR, "/nonexistent/mkv_tok/tokenizer.json");
    cr_expect(tok == NULL);

    tmp_dir_t d = make_dir("{\"model\": {\"type\": \"BPE\",", NULL);
    st = mkv_tokenizer_load(d.path, &tok, err);
    remove_dir(&d);
    expect_refused(st, err, MKV_STATUS_PARSE_ERROR, "tokenizer.json");

    st = load_min("null", "null", "null", "WordPiece", NULL, err);
    expect_refused(st, err, MKV_STATUS_UNSUPPORTED, "WordPiece");
    st = load_min("{\"type\":\"NFKC\"}", "null", "null", "BPE", NULL, err);
    expect_refused(st, err, MKV_STATUS_UNSUPPORTED, "NFKC");
    st = load_min("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","
                  "\"prepend\":\"_\"},{\"type\":\"Lowercase\"}]}",
                  "null", "null", "BPE", NULL, err);
    expect_refused(st, err, MKV_STATUS_UNSUPPORTED, "Lowercase");
    st = load_min("{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" +\"},\"content\":\"_\"}",
                  "null", "null", "BPE", NULL, err);
    expect_refused(st, err, MKV_STATUS_UNSUPPORTED, "Regex");
    st = load_min("null", "{\"type\":\"Metaspace\",\"replacement\":\"_\"}", "null", "BPE", NULL,
                  err);
    expect_refused(st, err, MKV_STATUS_UNSUPPORTED, "Metaspace");
    st = load_min("null", "null", "{\"type\":\"CTC\"}", "BPE", NULL, err);
    expect_refused(st, err, MKV_STATUS_UNSUPPORTED, "CTC");
    st = load_min("null", "null", "null", "BPE", "{\"bos_token\": ", err);
    expect_refused(st, err, MKV_STATUS_PARSE_ERROR, "tokenizer_config.json");
    st = load_min("null", "null", "null", "BPE", "{\"eos_token\": \"</s>\"}", err);
    expect_refused(st, err, MKV_STATUS_PARSE_ERROR, "</s>");
    st = load_min("null", "null", "null", "BPE", "{\"bos_token\": {\"content\": \"a\"}}", err);
    cr_expect_eq(st, MKV_STATUS_OK, "%s", err);
}

Test(tokenizer, refused_calls)
{
    char json[2048], err[MKV_ERR_LEN] = "";
    snprintf(json, sizeof json, min_fmt, "null", "null", "null", "BPE");
    tmp_dir_t d = make_dir(json, NULL);
    mkv_tokenizer_t *tok = load_dir(d.path);
    remove_dir(&d);
    int32_t *ids = NULL, n = 0;
    mkv_status_t st = mkv_tokenizer_encode(tok, "a\xC3(", 3, 0, &ids, &n, err);
    expect_refused(st, err, MKV_STATUS_INVALID_ARGUMENT, "UTF-8");
    cr_expect(ids == NULL);
    static const int32_t bad[] = {1, 4};
    char *s = NULL;
    st = mkv_tokenizer_decode(tok, bad, 2, 0, &s, err);
    expect_refused(st, err, MKV_STATUS_INVALID_ARGUMENT, "id 4");
    cr_expect(s == NULL);
    mkv_tokenizer_free(tok);
}
