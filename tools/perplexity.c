/*
 * perplexity.c — `mixkv perplexity`: teacher-forced perplexity of a model over windows of a
 * text or of a directory of documents, for the FP16 baseline and for mixkv in one run
 * (runner/perplexity.h), with the memory ratio, the compression mix, the agreement of their
 * greedy next-token predictions, and perplexity per bucket of position. Table and JSON.
 */
#include "runner/perplexity.h"
#include "runner/tokenizer.h"
#include "tools/cli.h"
#include "tools/docs.h"
#include "tools/model_opts.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CMD "perplexity"

typedef struct ppl_opts {
    const char *model, *data, *json_path, *dump_path;
    int32_t window, prompt_len, max_windows, windows_per_doc, threads;
    int quiet;
    mkv_policy_opts_t policy;
    mkv_run_opts_t run;
    /* --also: more mixkv policies, each in a mode of its own */
    mkv_policy_opts_t also[MKV_PPL_MAX_MODES - 2];
    const char *also_text[MKV_PPL_MAX_MODES - 2];
    int32_t n_also;
} ppl_opts_t;

void mkv_perplexity_usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv perplexity --model PATH --data FILE|DIR|- [OPTIONS]\n"
            "\n"
            "Teacher-forced perplexity of a Llama-family model over consecutive windows of a text\n"
            "(or of each document of a directory), through the FP16 paged baseline and through\n"
            "mixkv in one run. In each window\n"
            "the first P tokens go through the prompt phase (prefill, prompt-phase compression)\n"
            "and the rest one token at a time through the generation phase (decode, Algorithm 1),\n"
            "so both phases' compression is exercised. Reports perplexity (overall, prompt and\n"
            "generation positions), memory ratio, tokens kept high / low / pruned, and how often\n"
            "both modes' greedy next-token predictions agree, overall and per bucket of position\n"
            "in the window (how quality changes with distance).\n"
            "\n"
            "options (defaults in brackets):\n"
            "  --model PATH        a model folder or a GGUF file (required)\n"
            "  --data FILE|DIR|-   UTF-8 text ('-': standard input), or a directory whose regular\n"
            "                      files are documents (in name order; windows inside each),\n"
            "                      encoded with the model's tokenizer (BOS first where the\n"
            "                      tokenizer adds one)\n"
            "  --window N          tokens per window, up to the model's positions\n"
            "                      [min(512, the model's positions) - 1]\n"
            "  --prompt-len P      prompt-phase tokens per window [window / 4]\n"
            "  --max-windows N     at most N windows in all, 0: all [0]\n"
            "  --windows-per-doc N at most N windows of each document, 0: all [0]\n"
            MKV_POLICY_OPTS_HELP
            MKV_RUN_OPTS_HELP
            "  --also 'OPTIONS'    one more mixkv mode with these policy options (from the\n"
            "                      defaults, e.g. --also '--alpha-l 0.05'); up to %d times\n"
            "  --dump FILE         write mixkv's cache at the end of the last window (for\n"
            "                      'mixkv inspect')\n"
            "  --threads N         forward-pass threads [one per core]\n"
            "  --json FILE         write the results as JSON ('-': stdout)\n"
            "  --quiet             no progress line\n"
            "  -h, --help          this help\n"
            "\n"
            "exit status: 0 success, 1 a run failed, 2 bad usage or input.\n",
            MKV_PPL_MAX_MODES - 2);
}

/* --also 'OPTIONS': the policy options of one more mode, split at spaces. */
static int parse_also(const char *text, mkv_policy_opts_t *p)
{
    char buf[1024], *argv[64];
    int argc = 1;
    snprintf(buf, sizeof buf, "%s", text);
    argv[0] = (char *)"--also";
    for (char *save = NULL, *t = strtok_r(buf, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (argc == 63) {
            mkv_cli_error(CMD, "--also '%s': too many words", text);
            return -1;
        }
        argv[argc++] = t;
    }
    mkv_policy_opts_default(p);
    for (int i = 1; i < argc; i++) {
        const int m = mkv_policy_opts_parse(CMD, argc, argv, &i, p);
        if (m < 0) return -1;
        if (m == 0) {
            mkv_cli_error(CMD, "--also '%s': '%s' is not a policy option", text, argv[i]);
            return -1;
        }
    }
    return 0;
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
        if ((m = mkv_run_opts_parse(CMD, argc, argv, &i, &o->run)) != 0) {
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
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--also", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            if (o->n_also == MKV_PPL_MAX_MODES - 2) {
                mkv_cli_error(CMD, "--also: at most %d times", MKV_PPL_MAX_MODES - 2);
                return -1;
            }
            if (parse_also(v, &o->also[o->n_also]) < 0) return -1;
            o->also_text[o->n_also++] = v;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--dump", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->dump_path = v;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--threads", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--threads", v, 1, 256, &o->threads) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--windows-per-doc", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--windows-per-doc", v, 0, 1 << 30, &o->windows_per_doc) < 0) return -1;
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
        mkv_cli_error(CMD, "--model PATH and --data FILE|DIR|- are required");
        return -1;
    }
    if (mkv_cli_check_writable(CMD, "--json", o->json_path) < 0 ||
        mkv_cli_check_writable(CMD, "--dump", o->dump_path) < 0)
        return -1;
    return 0;
}

static const char *const mode_names[MKV_PPL_MAX_MODES] = {"fp16",   "mixkv",  "mixkv2", "mixkv3",
                                                           "mixkv4", "mixkv5", "mixkv6", "mixkv7"};

/* The policy of mode k >= 1. */
static const mkv_policy_opts_t *mode_policy(const ppl_opts_t *o, int k)
{
    return k <= 1 ? &o->policy : &o->also[k - 2];
}

/* Perplexity of a sum of NLLs over n predictions; NAN (printed "n/a", JSON null) when n is 0. */
static double ppl(double nll, int64_t n) { return n > 0 ? exp(nll / (double)n) : NAN; }
static double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

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

/* A table cell: the value, or n/a for a figure without data. */
static void cell(FILE *f, const char *fmt, double v)
{
    if (isnan(v)) fprintf(f, "%14s", "n/a");
    else fprintf(f, fmt, v);
}

static void add_num(cJSON *o, const char *key, double v)
{
    if (isnan(v)) cJSON_AddNullToObject(o, key);
    else cJSON_AddNumberToObject(o, key, v);
}

static cJSON *mode_json(const char *name, const mkv_ppl_mode_t *m, int32_t windows, int reference)
{
    const double seen = (double)(m->tokens_hi + m->tokens_lo + m->tokens_pruned);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mode", name);
    add_num(o, "perplexity", ppl(m->nll, m->predictions));
    add_num(o, "perplexity_prompt", ppl(m->prompt_nll, m->prompt_predictions));
    add_num(o, "perplexity_generation",
            ppl(m->nll - m->prompt_nll, m->predictions - m->prompt_predictions));
    mkv_cli_json_add_i64(o, "predictions", m->predictions);
    add_num(o, "greedy_agreement", reference ? NAN : ratio((double)m->agree, (double)m->predictions));
    add_num(o, "memory_ratio_to_fp16", ratio(m->memory_ratio_sum, windows));
    add_num(o, "fraction_high", ratio((double)m->tokens_hi, seen));
    add_num(o, "fraction_low", ratio((double)m->tokens_lo, seen));
    add_num(o, "fraction_pruned", ratio((double)m->tokens_pruned, seen));
    cJSON_AddNumberToObject(o, "seconds", m->seconds);
    cJSON *bs = cJSON_AddArrayToObject(o, "buckets");
    for (int b = 0; b < MKV_PPL_BUCKETS; b++) {
        const mkv_ppl_bucket_t *k = &m->bucket[b];
        if (k->predictions == 0) continue;
        cJSON *j = cJSON_CreateObject();
        mkv_cli_json_add_i64(j, "first_position", mkv_ppl_bucket_start(b));
        if (b + 1 < MKV_PPL_BUCKETS) mkv_cli_json_add_i64(j, "end_position", mkv_ppl_bucket_start(b + 1));
        else cJSON_AddNullToObject(j, "end_position");
        mkv_cli_json_add_i64(j, "predictions", k->predictions);
        add_num(j, "perplexity", ppl(k->nll, k->predictions));
        add_num(j, "greedy_agreement", reference ? NAN : ratio((double)k->agree, (double)k->predictions));
        cJSON_AddItemToArray(bs, j);
    }
    return o;
}

static void print_table(FILE *tf, const ppl_opts_t *o, const mkv_ppl_result_t *r)
{
    const int n = r->n_modes;
    fprintf(tf, "\nperplexity: %d windows of %d tokens (%d prompt) from %d document%s, %lld "
            "predictions per mode\n",
            r->windows, o->window, o->prompt_len, r->docs_used, r->docs_used == 1 ? "" : "s",
            (long long)r->mode[0].predictions);
    for (int k = 2; k < n; k++) fprintf(tf, "%s: --also '%s'\n", mode_names[k], o->also_text[k - 2]);
    fprintf(tf, "\n%-26s", "");
    for (int k = 0; k < n; k++) fprintf(tf, "%14s", mode_names[k]);
    fputc('\n', tf);
/* skip_ref: the figure compares with mode 0, which has none of its own (n/a). */
#define ROW(label, fmt, expr, skip_ref)                                                        \
    fprintf(tf, "%-26s", label);                                                               \
    for (int k = 0; k < n; k++) {                                                              \
        const mkv_ppl_mode_t *m = &r->mode[k];                                                 \
        const double seen = (double)(m->tokens_hi + m->tokens_lo + m->tokens_pruned);          \
        (void)seen;                                                                            \
        cell(tf, fmt, k == 0 && (skip_ref) ? NAN : (expr));                                    \
    }                                                                                          \
    fputc('\n', tf);
    ROW("perplexity", "%14.4f", ppl(m->nll, m->predictions), 0)
    ROW("  prompt positions", "%14.4f", ppl(m->prompt_nll, m->prompt_predictions), 0)
    ROW("  generation positions", "%14.4f",
        ppl(m->nll - m->prompt_nll, m->predictions - m->prompt_predictions), 0)
    ROW("change vs fp16", "%+13.2f%%",
        100.0 * (ppl(m->nll, m->predictions) / ppl(r->mode[0].nll, r->mode[0].predictions) - 1.0), 1)
    ROW("greedy agreement", "%13.2f%%", 100.0 * ratio((double)m->agree, (double)m->predictions), 1)
    ROW("memory ratio to FP16", "%14.3f", ratio(m->memory_ratio_sum, r->windows), 0)
    ROW("tokens high", "%13.1f%%", 100.0 * ratio((double)m->tokens_hi, seen), 0)
    ROW("tokens low", "%13.1f%%", 100.0 * ratio((double)m->tokens_lo, seen), 0)
    ROW("tokens pruned", "%13.1f%%", 100.0 * ratio((double)m->tokens_pruned, seen), 0)
    ROW("seconds", "%14.2f", m->seconds, 0)
#undef ROW
    fprintf(tf, "\nperplexity by position in the window (greedy agreement with fp16):\n%-14s%12s",
            "positions", "predictions");
    for (int k = 0; k < n; k++) fprintf(tf, k ? "%22s" : "%12s", mode_names[k]);
    fputc('\n', tf);
    for (int b = 0; b < MKV_PPL_BUCKETS; b++) {
        const mkv_ppl_bucket_t *f = &r->mode[0].bucket[b];
        if (f->predictions == 0) continue;
        char label[40];
        if (b + 1 < MKV_PPL_BUCKETS)
            snprintf(label, sizeof label, "%lld-%lld", (long long)mkv_ppl_bucket_start(b),
                     (long long)mkv_ppl_bucket_start(b + 1) - 1);
        else
            snprintf(label, sizeof label, "%lld+", (long long)mkv_ppl_bucket_start(b));
        fprintf(tf, "%-14s%12lld%12.4f", label, (long long)f->predictions, ppl(f->nll, f->predictions));
        for (int k = 1; k < n; k++) {
            const mkv_ppl_bucket_t *x = &r->mode[k].bucket[b];
            fprintf(tf, "%12.4f (%5.1f%%)", ppl(x->nll, x->predictions),
                    100.0 * (double)x->agree / (double)x->predictions);
        }
        fputc('\n', tf);
    }
}

int mkv_perplexity_main(int argc, char **argv)
{
    ppl_opts_t o = {0};
    mkv_policy_opts_default(&o.policy);
    mkv_run_opts_default(&o.run);
    const int p = parse(argc, argv, &o);
    if (p != 0) return p > 0 ? MKV_EXIT_OK : MKV_EXIT_USAGE;

    int rc = MKV_EXIT_FAIL;
    char err[512];
    mkv_model_t *model = NULL;
    mkv_tokenizer_t *tok = NULL;
    mkv_cache_t *caches[MKV_PPL_MAX_MODES] = {NULL};
    mkv_tools_forward_t fw;
    memset(&fw, 0, sizeof fw);
    const int32_t n_modes = 2 + o.n_also;
    mkv_docs_t docs = {0};
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
    if (mkv_docs_load(CMD, &docs, tok, o.data) < 0) {
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    mkv_ppl_opts_t po = {o.window, o.prompt_len, o.max_windows, o.windows_per_doc, o.dump_path,
                         o.quiet ? NULL : progress, NULL, o.threads, NULL};
    const int64_t windows = mkv_perplexity_windows(docs.doc, docs.n, &po);
    if (windows < 1) {
        int64_t longest = 0;
        for (int32_t i = 0; i < docs.n; i++) longest = docs.doc[i].n > longest ? docs.doc[i].n : longest;
        mkv_cli_error(CMD, "%s: no document holds a window of %d tokens (the longest has %lld); "
                      "give a smaller --window", o.data, o.window, (long long)longest);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (o.run.backend == MKV_BACKEND_CUDA) { /* the CPU pass is mkv_perplexity's own */
        if (mkv_tools_forward_create(CMD, model, &o.run, o.prompt_len, o.threads, &fw) < 0) goto done;
        po.fwd = &fw.fwd;
    }
    for (int k = 0; k < n_modes; k++)
        if (!(caches[k] = mkv_tools_make_cache(CMD, model, o.run.backend, k == 0, mode_policy(&o, k), 1,
                                               o.window, 1.0)))
            goto done;
    if (!o.quiet) {
        int64_t total = 0;
        for (int32_t i = 0; i < docs.n; i++) total += docs.doc[i].n;
        fprintf(stderr, "%s: %d document%s, %lld tokens; %lld windows of %d (%d prompt tokens each)\n",
                o.data, docs.n, docs.n == 1 ? "" : "s", (long long)total, (long long)windows,
                o.window, o.prompt_len);
    }
    mkv_ppl_result_t r;
    if (mkv_perplexity(model, caches, n_modes, docs.doc, docs.n, &po, &r) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        goto done;
    }

    print_table(o.json_path && !strcmp(o.json_path, "-") ? stderr : stdout, &o, &r);
    if (o.json_path) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "schema", "mixkv-perplexity");
        cJSON_AddNumberToObject(root, "schema_version", 2);
        cJSON_AddStringToObject(root, "model", o.model);
        cJSON_AddStringToObject(root, "backend", mkv_backend_name(o.run.backend));
        cJSON_AddStringToObject(root, "dtype", o.run.backend == MKV_BACKEND_CUDA ? mkv_dtype_name(o.run.dtype) : "f32");
        cJSON_AddStringToObject(root, "data", o.data);
        cJSON_AddNumberToObject(root, "documents", docs.n);
        cJSON_AddNumberToObject(root, "documents_used", r.docs_used);
        cJSON_AddNumberToObject(root, "documents_shorter_than_a_window", r.docs_short);
        int64_t total = 0;
        for (int32_t i = 0; i < docs.n; i++) total += docs.doc[i].n;
        mkv_cli_json_add_i64(root, "tokens", total);
        cJSON_AddNumberToObject(root, "window", o.window);
        cJSON_AddNumberToObject(root, "prompt_len", o.prompt_len);
        cJSON_AddNumberToObject(root, "windows", r.windows);
        cJSON_AddItemToObject(root, "mixkv_policy", mkv_policy_opts_json(&o.policy, caches[1]));
        cJSON *modes = cJSON_AddArrayToObject(root, "modes");
        for (int k = 0; k < n_modes; k++) {
            cJSON *mj = mode_json(mode_names[k], &r.mode[k], r.windows, k == 0);
            if (k > 0) cJSON_AddItemToObject(mj, "policy", mkv_policy_opts_json(mode_policy(&o, k), caches[k]));
            cJSON_AddItemToArray(modes, mj);
        }
        add_num(root, "greedy_agreement", ratio((double)r.mode[1].agree, (double)r.mode[1].predictions));
        const int w = mkv_cli_write_json(CMD, root, o.json_path);
        cJSON_Delete(root);
        if (w < 0) goto done;
    }
    rc = MKV_EXIT_OK;
done:
    mkv_docs_free(&docs);
    for (int k = 0; k < MKV_PPL_MAX_MODES; k++) mkv_cache_destroy(caches[k]);
    mkv_tools_forward_free(&fw);
    mkv_tokenizer_free(tok);
    mkv_model_free(model);
    return rc;
}
