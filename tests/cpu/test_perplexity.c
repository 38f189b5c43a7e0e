/*
 * test_perplexity.c — what compression does to a real model: perplexity of the bundled
 * TinyStories model on a slice of the shared validation text (16 windows of 255 tokens, 64 of
 * them through the prompt phase), FP16 baseline against mixkv with the default K8V4 / K4V2
 * policy (W 64). Bounds fixed from a measurement with a margin (docs/results.md): measured
 * 33.548 -> 33.621 (+0.22%) at 0.687 of the FP16 bytes, 96.6% greedy agreement. Also the
 * `mixkv perplexity` command on the same kind of run.
 */
#include "engine/perplexity.h"
#include "engine/tokenizer.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL_DIR MIXKV_SHARED_DIR "/models/tinystories-656k"
#define DATA_FILE MIXKV_SHARED_DIR "/data/tinystories/tinystories_val_dev.txt"

/* Bounds: 4.6x the measured perplexity increase, and the measured ratios with margin. */
#define PPL_INCREASE_MAX 0.01  /* measured 0.0022 */
#define MEMORY_RATIO_MAX 0.75  /* measured 0.687 of the plain FP16 bytes (d = 16: the score and
                                  position segments are 8 of K8V4's 40 bytes per token) */
#define AGREEMENT_MIN 0.93     /* measured 0.966 */

typedef struct fixture {
    mkv_model_t *m;
    int32_t *ids;
    int32_t n;
} fixture_t;

static void load(fixture_t *f)
{
    if (access(MODEL_DIR "/config.json", R_OK) != 0 || access(DATA_FILE, R_OK) != 0)
        cr_skip_test("model or data fixture absent under %s: perplexity tests skipped", MIXKV_SHARED_DIR);
    char err[512];
    cr_assert_eq(mkv_model_load(MODEL_DIR, &f->m, err), MKV_STATUS_OK, "%s", err);
    mkv_tokenizer_t *tok = NULL;
    cr_assert_eq(mkv_tokenizer_load(MODEL_DIR, &tok, err), MKV_STATUS_OK, "%s", err);
    FILE *fp = fopen(DATA_FILE, "rb");
    cr_assert_not_null(fp);
    static char text[1 << 16]; /* the first 64 KiB: more than 16 windows of 255 tokens */
    const size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = '\0';
    cr_assert_eq(mkv_tokenizer_encode(tok, text, len, 1, &f->ids, &f->n, err), MKV_STATUS_OK, "%s", err);
    mkv_tokenizer_free(tok);
}

static mkv_cache_t *cache(const mkv_model_t *m, mkv_format_t hi, mkv_format_t lo, float ah, float al)
{
    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cfg;
    base.hi_format = hi;
    base.lo_format = lo;
    base.alpha_h = ah;
    base.alpha_l = al;
    base.max_seqs = 1;
    base.max_seq_len = 255;
    mkv_model_cache_config(m, &base, &cfg);
    cfg.pool_pages = (int64_t)cfg.n_layers * cfg.n_kv_heads * (255 / 32 + 3);
    mkv_cache_t *c = NULL;
    cr_assert_eq(mkv_cache_create(&cfg, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    return c;
}

static double ppl(const mkv_ppl_mode_t *m) { return exp(m->nll / (double)m->predictions); }

Test(perplexity, mixkv_stays_within_bound_at_a_fraction_of_the_memory)
{
    fixture_t f;
    load(&f);
    mkv_cache_t *c[2] = {cache(f.m, MKV_FORMAT_K16V16, MKV_FORMAT_K16V16, 0.0f, 0.0f),
                         cache(f.m, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 1.0f, 0.02f)};
    mkv_ppl_result_t r;
    cr_assert_eq(mkv_perplexity(f.m, c, f.ids, f.n, 255, 64, 16, NULL, NULL, &r), MKV_STATUS_OK, "%s",
                 mkv_last_error());
    cr_assert_eq(r.windows, 16);
    cr_assert_eq(r.mode[0].predictions, 16 * 254);
    const double p16 = ppl(&r.mode[0]), pmix = ppl(&r.mode[1]);
    const double mem = r.mode[1].memory_ratio_sum / r.windows;
    const double agree = (double)r.agree / (double)r.mode[1].predictions;
    fprintf(stderr, "perplexity fp16 %.4f, mixkv %.4f (%+.3f%%); memory %.3f of FP16; agreement %.2f%%; "
            "low %lld, pruned %lld token-heads\n",
            p16, pmix, 100.0 * (pmix / p16 - 1.0), mem, 100.0 * agree, (long long)r.mode[1].tokens_lo,
            (long long)r.mode[1].tokens_pruned);
    /* The model is what its README says: in-domain perplexity in the 30s to 40s. */
    cr_assert(p16 > 25.0 && p16 < 50.0, "fp16 perplexity %.3f is implausible", p16);
    cr_assert_leq(pmix, p16 * (1.0 + PPL_INCREASE_MAX), "mixkv %.4f vs fp16 %.4f", pmix, p16);
    cr_assert_leq(mem, MEMORY_RATIO_MAX, "mixkv uses %.3f of the FP16 bytes", mem);
    cr_assert_geq(agree, AGREEMENT_MIN, "greedy agreement %.4f", agree);
    cr_assert_gt(r.mode[1].tokens_lo, 0, "the policy demoted nothing: the comparison is vacuous");
    /* Prompt positions go through full-precision (fp16) attention in both modes. */
    cr_assert_eq(r.mode[0].prompt_nll, r.mode[1].prompt_nll);
    mkv_cache_destroy(c[0]);
    mkv_cache_destroy(c[1]);
    free(f.ids);
    mkv_model_free(f.m);
}

Test(perplexity, k16v16_without_compression_equals_fp16_exactly)
{
    fixture_t f;
    load(&f);
    /* "mixkv mode" with K16V16 and thresholds 0 against the fp16 baseline: every prediction
     * equal, so the summed NLL is identical to the last bit. */
    mkv_cache_t *c[2] = {cache(f.m, MKV_FORMAT_K16V16, MKV_FORMAT_K16V16, 0.0f, 0.0f),
                         cache(f.m, MKV_FORMAT_K16V16, MKV_FORMAT_K16V16, 0.0f, 0.0f)};
    mkv_ppl_result_t r;
    cr_assert_eq(mkv_perplexity(f.m, c, f.ids, f.n, 200, 50, 3, NULL, NULL, &r), MKV_STATUS_OK, "%s",
                 mkv_last_error());
    cr_assert_eq(r.mode[0].nll, r.mode[1].nll);
    cr_assert_eq(r.agree, r.mode[1].predictions);
    mkv_cache_destroy(c[0]);
    mkv_cache_destroy(c[1]);
    free(f.ids);
    mkv_model_free(f.m);
}

/* The command: --window is the text window (not the policy's W, which is --recent-window). */
Test(perplexity, command_windows_and_json)
{
    if (access(MODEL_DIR "/config.json", R_OK) != 0 || access(DATA_FILE, R_OK) != 0)
        cr_skip_test("model or data fixture absent under %s: perplexity tests skipped", MIXKV_SHARED_DIR);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' perplexity --model '%s' --data '%s' --window 100 --prompt-len 20 "
             "--max-windows 2 --recent-window 16 --quiet --json - 2>/dev/null",
             MIXKV_CLI_PATH, MODEL_DIR, DATA_FILE);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char out[1 << 16];
    const size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    cr_assert_eq(pclose(p), 0, "exit status; output: %s", out);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_eq(cJSON_GetObjectItem(root, "window")->valueint, 100);
    cr_assert_eq(cJSON_GetObjectItem(root, "windows")->valueint, 2);
    const cJSON *modes = cJSON_GetObjectItem(root, "modes");
    cr_assert_eq(cJSON_GetArraySize(modes), 2);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(modes, 1), "predictions")->valueint, 198,
                 "2 windows x 99 predictions");
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "mixkv_policy"), "window")->valueint, 16,
                 "the policy's W comes from --recent-window");
    cJSON_Delete(root);
}
