/*
 * test_perplexity.c — what compression does to a real model: perplexity of the bundled
 * TinyStories model on a slice of the shared validation text (16 windows of 255 tokens, 64 of
 * them through the prompt phase), FP16 baseline against mixkv with the default K8V4 / K4V2
 * policy (W 64). Bounds fixed from a measurement with a margin (docs/results.md): measured
 * 33.548 -> 33.621 (+0.22%) at 0.687 of the FP16 bytes, 96.6% greedy agreement. Also the
 * `mixkv perplexity` command on the same kind of run.
 */
#include "runner/perplexity.h"
#include "runner/tokenizer.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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
    const mkv_ppl_doc_t doc = {f.ids, f.n};
    const mkv_ppl_opts_t o = {.window = 255, .prompt_len = 64, .max_windows = 16};
    cr_assert_eq(mkv_perplexity(f.m, c, 2, &doc, 1, &o, &r), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(r.windows, 16);
    cr_assert_eq(r.mode[0].predictions, 16 * 254);
    const double p16 = ppl(&r.mode[0]), pmix = ppl(&r.mode[1]);
    const double mem = r.mode[1].memory_ratio_sum / r.windows;
    const double agree = (double)r.mode[1].agree / (double)r.mode[1].predictions;
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
    const mkv_ppl_doc_t doc = {f.ids, f.n};
    const mkv_ppl_opts_t o = {.window = 200, .prompt_len = 50, .max_windows = 3};
    cr_assert_eq(mkv_perplexity(f.m, c, 2, &doc, 1, &o, &r), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(r.mode[0].nll, r.mode[1].nll);
    cr_assert_eq(r.mode[1].agree, r.mode[1].predictions);
    cr_assert_eq(r.mode[0].agree, r.mode[0].predictions, "mode 0 agrees with itself");
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

/* Several documents: windows are cut inside each (a document's tail and a document shorter
 * than a window are not used), --windows-per-doc caps each, and the per-bucket sums add up to
 * the totals. */
Test(perplexity, documents_windows_and_buckets)
{
    fixture_t f;
    load(&f);
    mkv_cache_t *c[2] = {cache(f.m, MKV_FORMAT_K16V16, MKV_FORMAT_K16V16, 0.0f, 0.0f),
                         cache(f.m, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 1.0f, 0.02f)};
    cr_assert_geq(f.n, 1000);
    /* Three documents from the stream: 450 tokens (2 windows of 200), 150 (none), 400 (2). */
    const mkv_ppl_doc_t docs[3] = {{f.ids, 450}, {f.ids + 450, 150}, {f.ids + 600, 400}};
    mkv_ppl_opts_t o = {.window = 200, .prompt_len = 40};
    cr_assert_eq(mkv_perplexity_windows(docs, 3, &o), 4);
    o.windows_per_doc = 1;
    cr_assert_eq(mkv_perplexity_windows(docs, 3, &o), 2);
    mkv_ppl_result_t r;
    cr_assert_eq(mkv_perplexity(f.m, c, 2, docs, 3, &o, &r), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(r.windows, 2);
    cr_assert_eq(r.docs_used, 2);
    cr_assert_eq(r.docs_short, 1);
    for (int k = 0; k < 2; k++) {
        int64_t n = 0, agree = 0;
        double nll = 0.0;
        for (int b = 0; b < MKV_PPL_BUCKETS; b++) {
            n += r.mode[k].bucket[b].predictions;
            nll += r.mode[k].bucket[b].nll;
            agree += r.mode[k].bucket[b].agree;
        }
        cr_assert_eq(n, 2 * 199);
        cr_assert_eq(agree, r.mode[k].agree);
        cr_assert_float_eq(nll, r.mode[k].nll, 1e-9 * fabs(nll));
    }
    /* Positions 0-127 and 128-198 of each window. */
    cr_assert_eq(r.mode[0].bucket[0].predictions, 2 * 128);
    cr_assert_eq(r.mode[0].bucket[1].predictions, 2 * 71);
    cr_assert_eq(mkv_ppl_bucket_of(127), 0);
    cr_assert_eq(mkv_ppl_bucket_of(128), 1);
    cr_assert_eq(mkv_ppl_bucket_of(8191), 6);
    cr_assert_eq(mkv_ppl_bucket_of(1 << 20), MKV_PPL_BUCKETS - 1);
    cr_assert_eq(mkv_ppl_bucket_start(mkv_ppl_bucket_of(300)), 256);
    /* No document holds a window: refused, nothing run. */
    o.window = 500;
    o.prompt_len = 100;
    cr_assert_eq(mkv_perplexity(f.m, c, 2, docs, 3, &o, &r), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(mkv_last_error(), "no document holds a window"), "%s", mkv_last_error());
    mkv_cache_destroy(c[0]);
    mkv_cache_destroy(c[1]);
    free(f.ids);
    mkv_model_free(f.m);
}

/* Runs a command line; returns its exit status, output into out. */
static int run_cli(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    const size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* --data - reads standard input; a directory is a set of documents; --dump writes the cache;
 * a text shorter than one window and an unwritable --json exit 2 before any work. */
Test(perplexity, command_stdin_directory_dump_and_usage_errors)
{
    if (access(MODEL_DIR "/config.json", R_OK) != 0 || access(DATA_FILE, R_OK) != 0)
        cr_skip_test("model or data fixture absent under %s: perplexity tests skipped", MIXKV_SHARED_DIR);
    static char out[1 << 16];
    char cmd[2048], dir[] = "/tmp/mixkv_ppl_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    /* Two documents: the first 3000 and the next 3000 bytes of the text. */
    snprintf(cmd, sizeof cmd,
             "head -c 3000 '%s' > %s/a.txt && head -c 6000 '%s' | tail -c 3000 > %s/b.txt && "
             "mkdir %s/sub && touch %s/.hidden",
             DATA_FILE, dir, DATA_FILE, dir, dir, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "'%s' perplexity --model '%s' --data %s --window 100 --prompt-len 20 "
             "--windows-per-doc 1 --quiet --dump %s/dump.json --json - 2>/dev/null",
             MIXKV_CLI_PATH, MODEL_DIR, dir, dir);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_eq(cJSON_GetObjectItem(root, "documents")->valueint, 2);
    cr_assert_eq(cJSON_GetObjectItem(root, "windows")->valueint, 2);
    const cJSON *mx = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "modes"), 1);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(mx, "buckets")), 1, "positions 0-98 only");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "modes"), 0),
                                               "greedy_agreement")),
              "the reference mode has no agreement figure");
    cJSON_Delete(root);
    snprintf(cmd, sizeof cmd, "'%s' inspect %s/dump.json >/dev/null 2>&1", MIXKV_CLI_PATH, dir);
    cr_assert_eq(system(cmd), 0, "the dump of the last window is a valid cache state");

    /* Standard input. */
    snprintf(cmd, sizeof cmd,
             "head -c 3000 '%s' | '%s' perplexity --model '%s' --data - --window 100 "
             "--prompt-len 20 --max-windows 1 --quiet --json - 2>/dev/null",
             DATA_FILE, MIXKV_CLI_PATH, MODEL_DIR);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_eq(cJSON_GetObjectItem(root, "windows")->valueint, 1);
    cJSON_Delete(root);

    /* --also: one more mode per policy, in the table and the JSON. */
    snprintf(cmd, sizeof cmd,
             "head -c 3000 '%s' | '%s' perplexity --model '%s' --data - --window 100 "
             "--prompt-len 20 --max-windows 1 --also '--hi-format K8V8  --alpha-l 0.1' --quiet "
             "--json - 2>/dev/null",
             DATA_FILE, MIXKV_CLI_PATH, MODEL_DIR);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s", out);
    const cJSON *m2 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "modes"), 2);
    cr_assert_not_null(m2);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(m2, "policy"), "hi_format")->valuestring, "K8V8");
    cr_assert_float_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(m2, "policy"), "alpha_l")->valuedouble, 0.1, 1e-6);
    cr_assert_eq(cJSON_GetObjectItem(m2, "predictions")->valueint, 99);
    cJSON_Delete(root);
    snprintf(cmd, sizeof cmd, "'%s' perplexity --model x --data - --also '--window 3' 2>&1 </dev/null",
             MIXKV_CLI_PATH);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "'--window' is not a policy option"), "%s", out);

    /* Shorter than one window: bad input, exit 2, with a message. */
    snprintf(cmd, sizeof cmd,
             "echo 'Once upon a time.' | '%s' perplexity --model '%s' --data - --window 100 2>&1",
             MIXKV_CLI_PATH, MODEL_DIR);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "no document holds a window of 100 tokens"), "%s", out);
    /* An unwritable --json is refused before the model is even loaded. */
    snprintf(cmd, sizeof cmd,
             "'%s' perplexity --model /nonexistent --data - --json /nonexistent/dir/x.json 2>&1 </dev/null",
             MIXKV_CLI_PATH);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--json: cannot open '/nonexistent/dir/x.json'"), "%s", out);

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
