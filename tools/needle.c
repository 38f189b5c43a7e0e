/*
 * needle.c — `mixkv needle`: needle-in-a-haystack retrieval, FP16 baseline against mixkv. A
 * short fact (a secret number) is inserted at chosen depths of long text (essays), a question
 * about it is asked at the end, and the model answers greedily; the answer is right when the
 * first number in it is the secret one. The whole haystack goes through the prompt phase, so
 * what is tested is whether the prompt-phase policy keeps the tokens that matter far back.
 *
 * The trials (prompts, answers, the judge) are calib/needle.h's; this file adds the options,
 * the two caches and the report. Lengths are prompt lengths in tokens (the haystack is cut to
 * fit; the actual length is reported).
 */
#include "calib/needle.h"
#include "tools/cli.h"
#include "tools/docs.h"
#include "tools/model_opts.h"

#include <stdlib.h>
#include <string.h>

#define CMD "needle"
#define N_MODES 2

typedef struct needle_opts {
    const char *model, *haystack, *json_path;
    mkv_needle_opts_t trials; /* lengths, depths, trials, answer tokens, seed, plain */
    int32_t threads;
    int quiet;
    mkv_policy_opts_t policy;
} needle_opts_t;

void mkv_needle_usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv needle --model PATH --haystack DIR|FILE [OPTIONS]\n"
            "\n"
            "Needle-in-a-haystack retrieval through the FP16 paged baseline and through mixkv:\n"
            "a sentence with a secret number is inserted at each depth of essay text cut to each\n"
            "length, a question about it ends the prompt, and the model answers greedily. An\n"
            "answer is right when its first number is the secret one. Reports the fraction\n"
            "right per length and depth for both modes, and mixkv's memory ratio.\n"
            "\n"
            "options (defaults in brackets):\n"
            "  --model PATH        a model folder or a GGUF file (required)\n"
            "  --haystack DIR|FILE text to hide the needle in: a file, or a directory whose\n"
            "                      regular files are joined in name order (required)\n"
            "  --lengths L,L,...   prompt lengths in tokens [1024,2048,4096]\n"
            "  --depths D,D,...    needle depths as fractions of the haystack [0,0.25,0.5,0.75,1]\n"
            "  --trials N          needles per length and depth (different numbers and text) [2]\n"
            "  --max-new N         answer tokens at most [24]\n"
            "  --plain             no chat template, even where the model has one\n"
            "  --seed N            seed of the secret numbers [1]\n"
            MKV_POLICY_OPTS_HELP
            "  --threads N         forward-pass threads [one per core]\n"
            "  --json FILE         write the results as JSON ('-': stdout)\n"
            "  --quiet             no progress line\n"
            "  -h, --help          this help\n"
            "\n"
            "exit status: 0 success, 1 a run failed, 2 bad usage or input.\n");
}

static int parse(int argc, char **argv, needle_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        int m;
        double tmp[MKV_NEEDLE_MAX_GRID];
        mkv_needle_opts_t *t = &o->trials;
        if (mkv_cli_is_help(argv[i])) {
            mkv_needle_usage(stdout);
            return 1;
        }
        if ((m = mkv_policy_opts_parse(CMD, argc, argv, &i, &o->policy)) != 0) {
            if (m < 0) return -1;
            continue;
        }
#define STR_OPT(name, field)                                                                   \
    if ((m = mkv_cli_option(CMD, argc, argv, &i, name, 1, 0, &v)) != 0) {                      \
        if (m < 0) return -1;                                                                  \
        o->field = v;                                                                          \
        continue;                                                                              \
    }
        STR_OPT("--model", model)
        STR_OPT("--haystack", haystack)
        STR_OPT("--json", json_path)
#undef STR_OPT
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--lengths", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_list(CMD, "--lengths", v, 16, 1 << 20, 1, MKV_NEEDLE_MAX_GRID, tmp,
                                            &t->n_lengths) < 0)
                return -1;
            for (int32_t k = 0; k < t->n_lengths; k++) t->lengths[k] = (int32_t)tmp[k];
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--depths", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_list(CMD, "--depths", v, 0.0, 1.0, 0, MKV_NEEDLE_MAX_GRID, t->depths,
                                            &t->n_depths) < 0)
                return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--trials", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--trials", v, 1, 1000, &t->trials) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--max-new", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--max-new", v, 1, MKV_NEEDLE_MAX_NEW, &t->max_new) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--threads", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--threads", v, 1, 256, &o->threads) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--seed", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i64(CMD, "--seed", v, 0, INT64_MAX, &t->seed) < 0) return -1;
            continue;
        }
        if (!strcmp(argv[i], "--plain")) { t->plain = 1; continue; }
        if (!strcmp(argv[i], "--quiet")) { o->quiet = 1; continue; }
        mkv_cli_error(CMD, "unknown argument '%s' (see 'mixkv needle --help')", argv[i]);
        return -1;
    }
    if (!o->model || !o->haystack) {
        mkv_cli_error(CMD, "--model PATH and --haystack DIR|FILE are required");
        return -1;
    }
    return mkv_cli_check_writable(CMD, "--json", o->json_path);
}

typedef struct cell {
    int32_t right[N_MODES];
    int32_t trials;
    int64_t prompt_tokens;      /* summed over trials */
    double memory_ratio_sum;    /* mixkv's bytes in use / FP16 bytes at the answer's end */
    int32_t answers_equal;      /* trials where both modes gave the same answer tokens */
} cell_t;

int mkv_needle_main(int argc, char **argv)
{
    needle_opts_t o = {0};
    o.trials = (mkv_needle_opts_t)MKV_NEEDLE_OPTS_INIT;
    mkv_policy_opts_default(&o.policy);
    const int p = parse(argc, argv, &o);
    if (p != 0) return p > 0 ? MKV_EXIT_OK : MKV_EXIT_USAGE;
    const mkv_needle_opts_t *to = &o.trials;

    int rc = MKV_EXIT_FAIL;
    char err[MKV_ERR_LEN];
    mkv_model_t *model = NULL;
    mkv_tokenizer_t *tok = NULL;
    char *hay_text = NULL;
    int32_t *hay = NULL, n_hay = 0;
    mkv_needle_t *nd = NULL;
    mkv_cache_t *cache[N_MODES] = {NULL, NULL};
    mkv_forward_ws_t *ws = NULL;
    mkv_forward_t fw;
    float *logits = NULL;
    mkv_needle_result_t res[N_MODES];
    cell_t *cells = NULL;
    if (mkv_model_load(o.model, &model, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        return MKV_EXIT_USAGE;
    }
    if (mkv_tokenizer_load(o.model, &tok, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    int32_t longest = 0;
    for (int32_t i = 0; i < to->n_lengths; i++) longest = to->lengths[i] > longest ? to->lengths[i] : longest;
    if (longest + to->max_new > model->cfg.max_pos) {
        mkv_cli_error(CMD, "--lengths up to %d plus --max-new %d exceed the model's %d positions",
                      longest, to->max_new, model->cfg.max_pos);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    size_t hay_len = 0;
    if (!(hay_text = mkv_docs_read_text(CMD, o.haystack, &hay_len))) {
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (mkv_tokenizer_encode(tok, hay_text, hay_len, 0, &hay, &n_hay, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s: %s", o.haystack, err);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (n_hay < longest) {
        mkv_cli_error(CMD, "the haystack has %d tokens, fewer than --lengths' %d", n_hay, longest);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    for (int k = 0; k < N_MODES; k++)
        if (!(cache[k] = mkv_tools_make_cache(CMD, model, MKV_BACKEND_CPU, k == 0, &o.policy, 1,
                                              longest + to->max_new, 1.0)))
            goto done;
    if (mkv_forward_ws_create(model, longest, &ws, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        goto done;
    }
    if (o.threads > 0 && mkv_forward_ws_set_threads(ws, o.threads) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "cannot use %d threads", o.threads);
        goto done;
    }
    fw = mkv_model_forward(ws);
    logits = malloc((size_t)model->cfg.vocab * sizeof(float));
    cells = calloc((size_t)to->n_lengths * to->n_depths, sizeof *cells);
    if (!logits || !cells) {
        mkv_cli_error(CMD, "out of memory");
        goto done;
    }
    const mkv_chat_template_t chat = mkv_needle_chat(tok, to->plain);
    if (!o.quiet)
        fprintf(stderr, "%s: haystack of %d tokens; %d lengths x %d depths x %d trials; template %s\n",
                o.haystack, n_hay, to->n_lengths, to->n_depths, to->trials, mkv_chat_template_name(chat));
    if (mkv_needle_create(tok, hay, n_hay, to, &nd) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    const int32_t runs = mkv_needle_count(nd);
    for (int32_t run = 0; run < runs; run++) {
        const mkv_needle_trial_t *tr = mkv_needle_trial(nd, run);
        cell_t *c = &cells[run / to->trials];
        char shown[N_MODES][64] = {"", ""};
        for (int k = 0; k < N_MODES; k++) {
            char *text = NULL;
            if (mkv_needle_run(nd, run, &fw, model->cfg.eos, cache[k], logits, &res[k], &text) != MKV_STATUS_OK) {
                mkv_cli_error(CMD, "%s", mkv_last_error());
                goto done;
            }
            c->right[k] += res[k].right;
            /* The answer on one line, for the progress line. */
            snprintf(shown[k], sizeof shown[k], "%s", text);
            for (char *q = shown[k]; *q; q++) *q = *q == '\n' || *q == '\r' ? ' ' : *q;
            free(text);
            if (k == 1) c->memory_ratio_sum += res[k].memory_ratio;
        }
        c->answers_equal += mkv_needle_same_answer(&res[0], &res[1]);
        c->trials++;
        c->prompt_tokens += tr->n_prompt;
        if (!o.quiet)
            fprintf(stderr, "[%d/%d] length %d depth %.2f: secret %ld, fp16 \"%s\", mixkv \"%s\"\n",
                    run + 1, runs, tr->n_prompt, tr->depth, tr->secret, shown[0], shown[1]);
    }

    FILE *tf = o.json_path && !strcmp(o.json_path, "-") ? stderr : stdout;
    fprintf(tf, "\nneedle retrieval, right answers of %d trials (fp16 / mixkv):\n\n%-10s", to->trials,
            "length");
    for (int32_t di = 0; di < to->n_depths; di++) fprintf(tf, "   depth %4.2f", to->depths[di]);
    fprintf(tf, "   mixkv memory\n");
    int32_t total[N_MODES] = {0, 0}, all = 0;
    for (int32_t li = 0; li < to->n_lengths; li++) {
        fprintf(tf, "%-10d", to->lengths[li]);
        double mem = 0.0;
        for (int32_t di = 0; di < to->n_depths; di++) {
            const cell_t *c = &cells[li * to->n_depths + di];
            fprintf(tf, "%8d / %-3d", c->right[0], c->right[1]);
            for (int k = 0; k < N_MODES; k++) total[k] += c->right[k];
            all += c->trials;
            mem += c->memory_ratio_sum;
        }
        fprintf(tf, "%13.3f\n", mem / (to->n_depths * to->trials));
    }
    fprintf(tf, "\nright: fp16 %d of %d (%.1f%%), mixkv %d of %d (%.1f%%)\n", total[0], all,
            100.0 * total[0] / all, total[1], all, 100.0 * total[1] / all);
    if (o.json_path) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "schema", "mixkv-needle");
        cJSON_AddNumberToObject(root, "schema_version", 1);
        cJSON_AddStringToObject(root, "model", o.model);
        cJSON_AddStringToObject(root, "haystack", o.haystack);
        cJSON_AddStringToObject(root, "chat_template", mkv_chat_template_name(chat));
        cJSON_AddNumberToObject(root, "trials", to->trials);
        cJSON *pol = cJSON_AddObjectToObject(root, "mixkv_policy");
        cJSON_AddStringToObject(pol, "hi_format", mkv_format_name(o.policy.hi));
        cJSON_AddStringToObject(pol, "lo_format", mkv_format_name(o.policy.lo));
        cJSON_AddNumberToObject(pol, "alpha_h", o.policy.alpha_h);
        cJSON_AddNumberToObject(pol, "alpha_l", o.policy.alpha_l);
        cJSON_AddNumberToObject(pol, "window", o.policy.window);
        mkv_cache_info_t info;
        if (mkv_cache_info(cache[1], &info) == MKV_STATUS_OK) {
            cJSON_AddNumberToObject(pol, "hi_key_group", info.config.hi_key_group);
            cJSON_AddNumberToObject(pol, "hi_value_group", info.config.hi_value_group);
            cJSON_AddNumberToObject(pol, "lo_key_group", info.config.lo_key_group);
            cJSON_AddNumberToObject(pol, "lo_value_group", info.config.lo_value_group);
        }
        cJSON *arr = cJSON_AddArrayToObject(root, "cells");
        for (int32_t li = 0; li < to->n_lengths; li++)
            for (int32_t di = 0; di < to->n_depths; di++) {
                const cell_t *c = &cells[li * to->n_depths + di];
                cJSON *j = cJSON_CreateObject();
                cJSON_AddNumberToObject(j, "length", to->lengths[li]);
                cJSON_AddNumberToObject(j, "depth", to->depths[di]);
                cJSON_AddNumberToObject(j, "mean_prompt_tokens", (double)c->prompt_tokens / c->trials);
                cJSON_AddNumberToObject(j, "fp16_right", c->right[0]);
                cJSON_AddNumberToObject(j, "mixkv_right", c->right[1]);
                cJSON_AddNumberToObject(j, "answers_equal", c->answers_equal);
                cJSON_AddNumberToObject(j, "mixkv_memory_ratio_to_fp16", c->memory_ratio_sum / c->trials);
                cJSON_AddItemToArray(arr, j);
            }
        cJSON_AddNumberToObject(root, "fp16_accuracy", (double)total[0] / all);
        cJSON_AddNumberToObject(root, "mixkv_accuracy", (double)total[1] / all);
        const int w = mkv_cli_write_json(CMD, root, o.json_path);
        cJSON_Delete(root);
        if (w < 0) goto done;
    }
    rc = MKV_EXIT_OK;
done:
    free(cells);
    for (int k = 0; k < N_MODES; k++) mkv_cache_destroy(cache[k]);
    free(logits);
    mkv_forward_ws_free(ws);
    mkv_needle_free(nd);
    free(hay);
    free(hay_text);
    mkv_tokenizer_free(tok);
    mkv_model_free(model);
    return rc;
}
