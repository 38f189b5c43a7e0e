/*
 * test_cli_model.c — the model commands' behaviour at the command line (`generate`, `needle`):
 * chat templates, dumps of real runs, the FP16 baseline compressing nothing, bad usage exiting
 * 2 before any work, and the needle grid's JSON. On the bundled TinyStories model.
 */
#include "mixkv.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MODEL_DIR MIXKV_SHARED_DIR "/models/tinystories-656k"
#define DATA_FILE MIXKV_SHARED_DIR "/data/tinystories/tinystories_val_dev.txt"

static void need_fixture(void)
{
    if (access(MODEL_DIR "/config.json", R_OK) != 0 || access(DATA_FILE, R_OK) != 0)
        cr_skip_test("model or data fixture absent under %s: command tests skipped", MIXKV_SHARED_DIR);
}

/* Runs a shell command; its exit status, stdout (and whatever it redirects) into out. */
static int run(char *out, size_t cap, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    const size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char g_out[1 << 17];

Test(cli_generate, chat_without_a_known_template_is_bad_input)
{
    need_fixture();
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' generate --model '%s' --chat 'Hello' 2>&1",
                     MIXKV_CLI_PATH, MODEL_DIR), 2, "%s", g_out);
    cr_assert(strstr(g_out, "no known chat template"), "%s", g_out);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' generate --model '%s' --chat a --prompt b 2>&1",
                     MIXKV_CLI_PATH, MODEL_DIR), 2, "%s", g_out);
    cr_assert(strstr(g_out, "exactly one of"), "%s", g_out);
}

Test(cli_generate, fp16_baseline_refuses_a_budget)
{
    need_fixture();
    cr_assert_eq(run(g_out, sizeof g_out,
                     "'%s' generate --model '%s' --prompt hi --mode fp16 --budget 8 2>&1",
                     MIXKV_CLI_PATH, MODEL_DIR), 2, "%s", g_out);
    cr_assert(strstr(g_out, "compresses nothing"), "%s", g_out);
}

Test(cli_generate, unwritable_outputs_are_refused_before_the_work)
{
    /* The model path does not exist either: the output is checked first. */
    cr_assert_eq(run(g_out, sizeof g_out,
                     "'%s' generate --model /nonexistent --prompt hi --dump /nonexistent/d/x.json 2>&1",
                     MIXKV_CLI_PATH), 2, "%s", g_out);
    cr_assert(strstr(g_out, "--dump: cannot open"), "%s", g_out);
    cr_assert_eq(run(g_out, sizeof g_out,
                     "'%s' generate --model /nonexistent --prompt hi --json /nonexistent/d/x.json 2>&1",
                     MIXKV_CLI_PATH), 2, "%s", g_out);
    cr_assert(strstr(g_out, "--json: cannot open"), "%s", g_out);
}

/* --dump writes the cache while the finished request still holds its pages: the dump has the
 * request's tokens (prompt + generated - 1 appended, per layer and head) and passes inspect. */
Test(cli_generate, dump_holds_the_finished_request)
{
    need_fixture();
    char path[] = "/tmp/mixkv_gen_dump_XXXXXX";
    const int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(run(g_out, sizeof g_out,
                     "'%s' generate --model '%s' --tokens 1,34,56,78 --max-tokens 30 --ignore-eos "
                     "--quiet --dump %s 2>&1", MIXKV_CLI_PATH, MODEL_DIR, path), 0, "%s", g_out);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' inspect --json %s 2>&1", MIXKV_CLI_PATH, path), 0,
                 "%s", g_out);
    cJSON *root = cJSON_Parse(g_out);
    cr_assert_not_null(root, "not JSON: %s", g_out);
    const cJSON *tot = cJSON_GetObjectItem(root, "summary");
    cr_assert_not_null(tot, "%s", g_out);
    const cJSON *seen = cJSON_GetObjectItem(tot, "tokens_seen");
    cr_assert_not_null(seen, "%s", g_out);
    /* 2 layers x 4 KV heads x (4 prompt + 29 appended) tokens. */
    cr_assert_eq((int)seen->valuedouble, 2 * 4 * 33, "%s", g_out);
    cJSON_Delete(root);
    unlink(path);
}

Test(cli_needle, grid_json_and_bad_usage)
{
    need_fixture();
    cr_assert_eq(run(g_out, sizeof g_out,
                     "'%s' needle --model '%s' --haystack '%s' --lengths 96,160 --depths 0,1 "
                     "--trials 1 --max-new 4 --quiet --json - 2>/dev/null",
                     MIXKV_CLI_PATH, MODEL_DIR, DATA_FILE), 0, "%s", g_out);
    cJSON *root = cJSON_Parse(g_out);
    cr_assert_not_null(root, "not JSON: %s", g_out);
    const cJSON *cells = cJSON_GetObjectItem(root, "cells");
    cr_assert_eq(cJSON_GetArraySize(cells), 4);
    for (int i = 0; i < 4; i++) {
        const cJSON *c = cJSON_GetArrayItem(cells, i);
        const double len = cJSON_GetObjectItem(c, "length")->valuedouble;
        const double got = cJSON_GetObjectItem(c, "mean_prompt_tokens")->valuedouble;
        cr_assert(got <= len && got >= len - 24, "prompt of %g tokens for length %g", got, len);
        const double mem = cJSON_GetObjectItem(c, "mixkv_memory_ratio_to_fp16")->valuedouble;
        cr_assert(mem > 0.0 && mem < 1.0, "mixkv memory ratio %g", mem);
    }
    cr_assert_str_eq(cJSON_GetObjectItem(root, "chat_template")->valuestring, "none");
    cJSON_Delete(root);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' needle --model '%s' --haystack '%s' --depths 0,1.5 2>&1",
                     MIXKV_CLI_PATH, MODEL_DIR, DATA_FILE), 2, "%s", g_out);
    cr_assert(strstr(g_out, "--depths"), "%s", g_out);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' needle --model '%s' --haystack '%s' --lengths 600 2>&1",
                     MIXKV_CLI_PATH, MODEL_DIR, DATA_FILE), 2, "%s", g_out);
    cr_assert(strstr(g_out, "positions"), "%s", g_out);
}

/* A tokenizer mixkv cannot load: generate names the reason and the --tokens way out once. */
Test(cli_generate, tokenizer_message_and_hint_once)
{
    need_fixture();
    char dir[] = "/tmp/mixkv_tok_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(run(g_out, sizeof g_out,
                     "cp '%s'/config.json '%s'/model.safetensors %s/ && sed 's/\"BPE\"/\"WordPiece\"/' "
                     "'%s'/tokenizer.json > %s/tokenizer.json 2>&1",
                     MODEL_DIR, MODEL_DIR, dir, MODEL_DIR, dir), 0, "%s", g_out);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' generate --model %s --prompt hi 2>&1", MIXKV_CLI_PATH, dir),
                 2, "%s", g_out);
    cr_assert(strstr(g_out, "WordPiece"), "%s", g_out);
    const char *hint = strstr(g_out, "--tokens");
    cr_assert_not_null(hint, "%s", g_out);
    cr_assert_null(strstr(hint + 1, "--tokens"), "the hint is printed once: %s", g_out);
    /* With ids the model still runs. */
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' generate --model %s --tokens 1,2,3 --max-tokens 2 --quiet 2>&1",
                     MIXKV_CLI_PATH, dir), 0, "%s", g_out);
    run(g_out, sizeof g_out, "rm -rf %s", dir);
}

/* --backend and --dtype: bad values are bad usage; a CUDA run where no GPU can run it fails
 * with the reason (and without one of these, the run on the GPU is GPU-tested:
 * tests/gpu/test_forward_cuda.c). */
Test(cli_generate, backend_options)
{
    need_fixture();
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' generate --model '%s' --prompt hi --backend gpu 2>&1",
                     MIXKV_CLI_PATH, MODEL_DIR), 2, "%s", g_out);
    cr_assert(strstr(g_out, "is not cpu or cuda"), "%s", g_out);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' perplexity --model '%s' --data '%s' --dtype f8 2>&1",
                     MIXKV_CLI_PATH, MODEL_DIR, DATA_FILE), 2, "%s", g_out);
    cr_assert(strstr(g_out, "is not f32, f16 or bf16"), "%s", g_out);
    int cuda = 0;
    cr_assert_eq(mkv_backend_available(MKV_BACKEND_CUDA, &cuda), MKV_STATUS_OK);
    if (cuda) return; /* a machine that can run it */
    cr_assert_eq(run(g_out, sizeof g_out,
                     "'%s' generate --model '%s' --prompt hi --max-tokens 2 --backend cuda 2>&1",
                     MIXKV_CLI_PATH, MODEL_DIR), 1, "%s", g_out);
    cr_assert(strstr(g_out, "--backend cuda:"), "%s", g_out);
}

/* serve-bench on TinyStories under page pressure: both engines finish every request with the
 * same output tokens in all, on the same pages; mixkv's smaller tokens let more requests run
 * at once; bad usage exits 2. */
Test(cli_serve_bench, both_engines_same_memory)
{
    need_fixture();
    char json[256];
    snprintf(json, sizeof json, "/tmp/mixkv_sb_%d.json", (int)getpid());
    cr_assert_eq(run(g_out, sizeof g_out,
                     "'%s' serve-bench --model '%s' --requests 16 --prompt-len 60:120 --output-len 40:90 "
                     "--kv-mib 0.2 --max-batch 12 --threads 2 --quiet --rate 0,400 --plot '%s.svg' --json '%s' 2>&1",
                     MIXKV_CLI_PATH, MODEL_DIR, json, json), 0, "%s", g_out);
    char svg[300];
    snprintf(svg, sizeof svg, "%s.svg", json);
    FILE *sf = fopen(svg, "r");
    cr_assert_not_null(sf, "no plot written");
    char head[8] = {0};
    cr_assert_eq(fread(head, 1, 4, sf), 4u);
    fclose(sf);
    unlink(svg);
    cr_assert_str_eq(head, "<svg");
    FILE *f = fopen(json, "r");
    cr_assert_not_null(f);
    char buf[1 << 14];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(json);
    cJSON *root = cJSON_Parse(buf);
    cr_assert_not_null(root, "%s", buf);
    cr_assert_str_eq(cJSON_GetObjectItem(root, "schema")->valuestring, "mixkv-serve-bench");
    /* which policy mixkv ran, in the table's header and in the JSON */
    cr_assert(strstr(g_out, "mixkv: thresholds alpha_h 1 / alpha_l 0.02, window 64, K8V4 / K4V2"), "%s", g_out);
    cr_assert(strstr(g_out, "fp16: K16V16, nothing compressed"), "%s", g_out);
    const cJSON *pol = cJSON_GetObjectItem(root, "mixkv_policy");
    cr_assert_not_null(pol, "%s", buf);
    cr_assert_str_eq(cJSON_GetObjectItem(pol, "mode")->valuestring, "thresholds");
    cr_assert_null(cJSON_GetObjectItem(pol, "mix_high"));
    const cJSON *runs = cJSON_GetObjectItem(root, "runs");
    cr_assert_eq(cJSON_GetArraySize(runs), 2);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(runs, 1), "arrivals")->valuestring, "poisson");
    /* every request waits for its first token, and its latency covers it */
    const cJSON *pe = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(runs, 1), "engines"), 0);
    const double ttft = cJSON_GetObjectItem(cJSON_GetObjectItem(pe, "ttft_s"), "p50")->valuedouble;
    const double lat = cJSON_GetObjectItem(cJSON_GetObjectItem(pe, "latency_s"), "p50")->valuedouble;
    cr_assert(ttft > 0 && lat > ttft, "ttft %g, latency %g", ttft, lat);
    const cJSON *e = cJSON_GetObjectItem(cJSON_GetArrayItem(runs, 0), "engines");
    cr_assert_eq(cJSON_GetArraySize(e), 2);
    const cJSON *a = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
    cr_assert_str_eq(cJSON_GetObjectItem(a, "engine")->valuestring, "fp16");
    cr_assert_str_eq(cJSON_GetObjectItem(b, "engine")->valuestring, "mixkv");
    const char *same[] = {"finished", "output_tokens"};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(cJSON_GetObjectItem(a, same[i])->valuedouble, cJSON_GetObjectItem(b, same[i])->valuedouble,
                     "%s differs", same[i]);
    /* each engine has its own page (decision 111), both fill the same budget to within one page */
    const double budget = 0.2 * 1048576.0;
    for (int i = 0; i < 2; i++) {
        const cJSON *x = i ? b : a;
        const double pb = cJSON_GetObjectItem(x, "page_bytes")->valuedouble;
        const double pool = cJSON_GetObjectItem(x, "kv_pages")->valuedouble * pb;
        cr_assert(pool <= budget && pool > budget - pb, "%s: %g bytes of pool for a budget of %g",
                  cJSON_GetObjectItem(x, "engine")->valuestring, pool, budget);
    }
    cr_assert_eq(cJSON_GetObjectItem(a, "finished")->valueint, 16);
    cr_assert_gt(cJSON_GetObjectItem(a, "preemptions")->valuedouble, 0, "no page pressure on the baseline");
    cr_assert_gt(cJSON_GetObjectItem(b, "mean_batch")->valuedouble, cJSON_GetObjectItem(a, "mean_batch")->valuedouble,
                 "mixkv ran no more requests at once than the baseline");
    cr_assert_leq(cJSON_GetObjectItem(a, "kv_bytes_peak")->valuedouble,
                  cJSON_GetObjectItem(a, "kv_pages")->valuedouble * cJSON_GetObjectItem(a, "page_bytes")->valuedouble);
    cJSON_Delete(root);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' serve-bench --model '%s' --engines both 2>&1", MIXKV_CLI_PATH,
                     MODEL_DIR), 2, "%s", g_out);
    /* a length-pairs file: its pairs in order (with a comment and a blank line), a bad line refused */
    char lens[256];
    snprintf(lens, sizeof lens, "/tmp/mixkv_sb_lens_%d.txt", (int)getpid());
    FILE *lf = fopen(lens, "w");
    cr_assert_not_null(lf);
    fputs("# prompt output\n30 20\n\n50 10\n", lf);
    fclose(lf);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' serve-bench --model '%s' --lengths '%s' --engines fp16 --quiet "
                     "--json - 2>/dev/null", MIXKV_CLI_PATH, MODEL_DIR, lens), 0, "%s", g_out);
    cJSON *lj = cJSON_Parse(g_out);
    cr_assert_not_null(lj, "%s", g_out);
    cr_assert_eq(cJSON_GetObjectItem(lj, "requests")->valueint, 2);
    cr_assert_null(cJSON_GetObjectItem(lj, "mixkv_policy"), "the baseline alone has no policy");
    const cJSON *le = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(lj, "runs"), 0),
                                                             "engines"), 0);
    cr_assert_eq(cJSON_GetObjectItem(le, "output_tokens")->valueint, 30, "20 + 10 tokens");
    cJSON_Delete(lj);
    lf = fopen(lens, "w");
    fputs("30 20\n40\n", lf);
    fclose(lf);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' serve-bench --model '%s' --lengths '%s' 2>&1", MIXKV_CLI_PATH,
                     MODEL_DIR, lens), 2, "%s", g_out);
    cr_assert(strstr(g_out, "line 2"), "%s", g_out);
    /* the fixed mix says so, with its fractions */
    lf = fopen(lens, "w");
    fputs("30 20\n", lf);
    fclose(lf);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' serve-bench --model '%s' --lengths '%s' --engines mixkv --mix 0.25,0.5 "
                     "--quiet --json - 2>&1", MIXKV_CLI_PATH, MODEL_DIR, lens), 0, "%s", g_out);
    cr_assert(strstr(g_out, "mixkv: fixed mix 25% high / 50% low / 25% pruned by significance rank"), "%s", g_out);
    cJSON *mj = cJSON_Parse(strchr(g_out, '{'));
    cr_assert_not_null(mj, "%s", g_out);
    const cJSON *mp = cJSON_GetObjectItem(mj, "mixkv_policy");
    cr_assert_not_null(mp, "%s", g_out);
    cr_assert_str_eq(cJSON_GetObjectItem(mp, "mode")->valuestring, "fixed_mix");
    cr_assert_float_eq(cJSON_GetObjectItem(mp, "mix_high")->valuedouble, 0.25, 1e-6);
    cr_assert_float_eq(cJSON_GetObjectItem(mp, "mix_low")->valuedouble, 0.5, 1e-6);
    cJSON_Delete(mj);
    unlink(lens);
    cr_assert_eq(run(g_out, sizeof g_out, "'%s' serve-bench --output-len 5:2 --model x 2>&1", MIXKV_CLI_PATH), 2,
                 "%s", g_out);
}
