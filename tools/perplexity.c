/*
 * perplexity.c — `mixkv perplexity`: teacher-forced perplexity of a model over windows of a
 * text, for the FP16 baseline and for mixkv in one run (engine/perplexity.h), with the memory
 * ratio and the agreement of their greedy next-token predictions. Table and JSON.
 */
#include "engine/perplexity.h"
#include "engine/tokenizer.h"
#include "tools/cli.h"
#include "tools/model_opts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CMD "perplexity"

typedef struct ppl_opts {
    const char *model, *data, *json_path;
    int32_t window, prompt_len, max_windows;
    int quiet;
    mkv_policy_opts_t policy;
} ppl_opts_t;

void mkv_perplexity_usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv perplexity --model DIR --data FILE [OPTIONS]\n"
            "\n"
            "Teacher-forced perplexity of a Llama-family model over consecutive windows of a text\n"
            "file, through the FP16 paged baseline and through mixkv in one run. In each window\n"
            "the first P tokens go through the prompt phase (prefill, prompt-phase compression)\n"
            "and the rest one token at a time through the generation phase (decode, Algorithm 1),\n"
            "so both phases' compression is exercised. Reports perplexity (overall, prompt and\n"
            "generation positions), memory ratio, tokens kept high / low / pruned, and how often\n"
            "both modes' greedy next-token predictions agree.\n"
            "\n"
            "options (defaults in brackets):\n"
            "  --model DIR         the model folder (required)\n"
            "  --data FILE         UTF-8 text, encoded with the model's tokenizer (BOS first)\n"
            "  --window N          tokens per window [min(512, the model's positions) - 1]\n"
            "  --prompt-len P      prompt-phase tokens per window [window / 4]\n"
            "  --max-windows N     at most N windows, 0: all [0]\n"
            MKV_POLICY_OPTS_HELP
            "  --json FILE         write the results as JSON ('-': stdout)\n"
            "  --quiet             no progress line\n"
            "  -h, --help          this help\n"
            "\n"
            "exit status: 0 success, 1 a run failed, 2 bad usage or input.\n");
}

static int parse(int argc, char **argv, ppl_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        int m;
        if (mkv_cli_is_help(argv[i])) {
            mkv_perplexity_usage(stdout);
            return 1;
        }
        if ((m = mkv_policy_opts_parse(CMD, argc, argv, &i, &o->policy)) != 0) {
            if (m < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--model", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->model = v;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--data", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->data = v;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--json", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->json_path = v;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--window", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--window", v, 2, 1 << 20, &o->window) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--prompt-len", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--prompt-len", v, 1, 1 << 20, &o->prompt_len) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--max-windows", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--max-windows", v, 0, 1 << 30, &o->max_windows) < 0) return -1;
            continue;
        }
        if (!strcmp(argv[i], "--quiet")) {
            o->quiet = 1;
            continue;
        }
        mkv_cli_error(CMD, "unknown argument '%s' (see 'mixkv perplexity --help')", argv[i]);
        return -1;
    }
    if (!o->model || !o->data) {
        mkv_cli_error(CMD, "--model DIR and --data FILE are required");
        return -1;
    }
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        mkv_cli_error(CMD, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        const size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        char *g = realloc(buf, (cap *= 2) + 1);
        if (!g) {
            free(buf);
            buf = NULL;
        } else {
            buf = g;
        }
    }
    const int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        mkv_cli_error(CMD, "cannot read '%s'", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static double ppl(double nll, int64_t n) { return n > 0 ? exp(nll / (double)n) : 0.0; }

static void progress(void *ctx, int32_t w, int32_t n, const mkv_ppl_result_t *r)
{
    (void)ctx;
    const int tty = isatty(STDERR_FILENO);
    if (!tty && w != n && w % (n / 10 > 0 ? n / 10 : 1) != 0) return;
    fprintf(stderr, "%swindow %d/%d: perplexity fp16 %.3f, mixkv %.3f%s", tty ? "\r" : "", w, n,
            ppl(r->mode[0].nll, r->mode[0].predictions), ppl(r->mode[1].nll, r->mode[1].predictions),
            tty ? "   " : "\n");
    if (tty && w == n) fputc('\n', stderr);
}

static cJSON *mode_json(const char *name, const mkv_ppl_mode_t *m, int32_t windows)
{
    const double seen = (double)(m->tokens_hi + m->tokens_lo + m->tokens_pruned);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mode", name);
    cJSON_AddNumberToObject(o, "perplexity", ppl(m->nll, m->predictions));
    cJSON_AddNumberToObject(o, "perplexity_prompt", ppl(m->prompt_nll, m->prompt_predictions));
    cJSON_AddNumberToObject(o, "perplexity_generation",
                            ppl(m->nll - m->prompt_nll, m->predictions - m->prompt_predictions));
    mkv_cli_json_add_i64(o, "predictions", m->predictions);
    cJSON_AddNumberToObject(o, "memory_ratio_to_fp16", m->memory_ratio_sum / windows);
    cJSON_AddNumberToObject(o, "fraction_high", (double)m->tokens_hi / seen);
    cJSON_AddNumberToObject(o, "fraction_low", (double)m->tokens_lo / seen);
    cJSON_AddNumberToObject(o, "fraction_pruned", (double)m->tokens_pruned / seen);
    cJSON_AddNumberToObject(o, "seconds", m->seconds);
    return o;
}

int mkv_perplexity_main(int argc, char **argv)
{
    ppl_opts_t o = {0};
    mkv_policy_opts_default(&o.policy);
    const int p = parse(argc, argv, &o);
    if (p != 0) return p > 0 ? MKV_EXIT_OK : MKV_EXIT_USAGE;

    int rc = MKV_EXIT_FAIL;
    char err[512];
    mkv_model_t *model = NULL;
    mkv_tokenizer_t *tok = NULL;
    mkv_cache_t *caches[2] = {NULL, NULL};
    char *text = NULL;
    int32_t *ids = NULL, n_ids = 0;
    size_t len = 0;
    if (mkv_model_load(o.model, &model, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        return MKV_EXIT_USAGE;
    }
    if (mkv_tokenizer_load(o.model, &tok, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (o.window == 0) o.window = (model->cfg.max_pos < 512 ? model->cfg.max_pos : 512) - 1;
    if (o.prompt_len == 0) o.prompt_len = o.window / 4 > 0 ? o.window / 4 : 1;
    if (o.prompt_len >= o.window || o.window > model->cfg.max_pos) {
        mkv_cli_error(CMD, "need --prompt-len %d < --window %d <= the model's %d positions",
                      o.prompt_len, o.window, model->cfg.max_pos);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (!(text = read_file(o.data, &len))) {
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (mkv_tokenizer_encode(tok, text, len, 1, &ids, &n_ids, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    for (int k = 0; k < 2; k++)
        if (!(caches[k] = mkv_tools_make_cache(CMD, model, k == 0, &o.policy, 1, o.window, 1.0)))
            goto done;
    if (!o.quiet)
        fprintf(stderr, "%s: %d tokens, windows of %d (%d prompt tokens each)\n", o.data, n_ids,
                o.window, o.prompt_len);
    mkv_ppl_result_t r;
    if (mkv_perplexity(model, caches, ids, n_ids, o.window, o.prompt_len, o.max_windows,
                       o.quiet ? NULL : progress, NULL, &r) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        goto done;
    }

    const char *names[2] = {"fp16", "mixkv"};
    FILE *tf = o.json_path && !strcmp(o.json_path, "-") ? stderr : stdout;
    fprintf(tf, "\nperplexity: %d windows of %d tokens (%d prompt), %lld predictions per mode\n\n",
            r.windows, o.window, o.prompt_len, (long long)r.mode[0].predictions);
    fprintf(tf, "%-26s%14s%14s\n", "", names[0], names[1]);
#define ROW(label, fmt, expr)                                                                  \
    fprintf(tf, "%-26s", label);                                                               \
    for (int k = 0; k < 2; k++) {                                                              \
        const mkv_ppl_mode_t *m = &r.mode[k];                                                  \
        fprintf(tf, fmt, (expr));                                                              \
    }                                                                                          \
    fputc('\n', tf);
    ROW("perplexity", "%14.4f", ppl(m->nll, m->predictions))
    ROW("  prompt positions", "%14.4f", ppl(m->prompt_nll, m->prompt_predictions))
    ROW("  generation positions", "%14.4f",
        ppl(m->nll - m->prompt_nll, m->predictions - m->prompt_predictions))
    ROW("memory ratio to FP16", "%14.3f", m->memory_ratio_sum / r.windows)
    ROW("tokens high", "%13.1f%%", 100.0 * m->tokens_hi / (double)(m->tokens_hi + m->tokens_lo + m->tokens_pruned))
    ROW("tokens low", "%13.1f%%", 100.0 * m->tokens_lo / (double)(m->tokens_hi + m->tokens_lo + m->tokens_pruned))
    ROW("tokens pruned", "%13.1f%%", 100.0 * m->tokens_pruned / (double)(m->tokens_hi + m->tokens_lo + m->tokens_pruned))
    ROW("seconds", "%14.2f", m->seconds)
#undef ROW
    fprintf(tf, "\ngreedy predictions agree: %.2f%% (%lld of %lld)\n",
            100.0 * (double)r.agree / (double)r.mode[1].predictions, (long long)r.agree,
            (long long)r.mode[1].predictions);
    if (o.json_path) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "schema", "mixkv-perplexity");
        cJSON_AddNumberToObject(root, "schema_version", 1);
        cJSON_AddStringToObject(root, "model", o.model);
        cJSON_AddStringToObject(root, "data", o.data);
        cJSON_AddNumberToObject(root, "tokens", n_ids);
        cJSON_AddNumberToObject(root, "window", o.window);
        cJSON_AddNumberToObject(root, "prompt_len", o.prompt_len);
        cJSON_AddNumberToObject(root, "windows", r.windows);
        cJSON *pol = cJSON_AddObjectToObject(root, "mixkv_policy");
        cJSON_AddStringToObject(pol, "hi_format", mkv_format_name(o.policy.hi));
        cJSON_AddStringToObject(pol, "lo_format", mkv_format_name(o.policy.lo));
        cJSON_AddNumberToObject(pol, "alpha_h", o.policy.alpha_h);
        cJSON_AddNumberToObject(pol, "alpha_l", o.policy.alpha_l);
        cJSON_AddNumberToObject(pol, "window", o.policy.window);
        cJSON *modes = cJSON_AddArrayToObject(root, "modes");
        for (int k = 0; k < 2; k++) cJSON_AddItemToArray(modes, mode_json(names[k], &r.mode[k], r.windows));
        cJSON_AddNumberToObject(root, "greedy_agreement", (double)r.agree / (double)r.mode[1].predictions);
        const int w = mkv_cli_write_json(CMD, root, o.json_path);
        cJSON_Delete(root);
        if (w < 0) goto done;
    }
    rc = MKV_EXIT_OK;
done:
    free(text);
    free(ids);
    for (int k = 0; k < 2; k++) mkv_cache_destroy(caches[k]);
    mkv_tokenizer_free(tok);
    mkv_model_free(model);
    return rc;
}
