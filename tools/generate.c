/*
 * generate.c — `mixkv generate`: a prompt through a real model with the mixkv cache (or the
 * FP16 baseline), the text streamed as it is generated, then a summary of speed and KV memory.
 */
#include "common/error.h"
#include "runner/chat.h"
#include "engine/scheduler.h"
#include "runner/forward_tp.h"
#include "runner/tokenizer.h"
#include "tools/cli.h"
#include "tools/model_opts.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CMD "generate"

typedef struct gen_opts {
    const char *model, *prompt, *chat, *tokens, *json_path, *dump_path;
    int fp16, no_bos, ignore_eos, quiet;
    int32_t max_tokens, budget, threads;
    int32_t tp; /* GPUs (tensor parallelism) */
    double temperature, top_p;
    int64_t seed;
    mkv_policy_opts_t policy;
    mkv_run_opts_t run;
} gen_opts_t;

void mkv_generate_usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv generate --model PATH (--prompt TEXT | --chat TEXT | --tokens ID,...) [OPTIONS]\n"
            "\n"
            "Generates text with a Llama-family model (a Hugging Face folder: config.json,\n"
            "*.safetensors, tokenizer.json; or a GGUF file) on the CPU, its KV cache managed by\n"
            "mixkv, and prints the text as it\n"
            "is generated, then tokens/s, KV bytes used versus FP16 and the fractions of tokens\n"
            "kept high, low and pruned.\n"
            "\n"
            "options (defaults in brackets):\n"
            "  --model PATH        a model folder or a GGUF file (required)\n"
            "  --prompt TEXT       the prompt, encoded with the model's tokenizer\n"
            "  --chat TEXT         a user message wrapped in the model's chat template (ChatML or\n"
            "                      Llama 3, recognised from its special tokens); generation also\n"
            "                      stops at the end of the assistant's turn\n"
            "  --tokens LIST       the prompt as token ids (works without a tokenizer)\n"
            "  --mode M            fp16 (the FP16 paged baseline) or mixkv [mixkv]\n"
            "  --max-tokens N      tokens to generate at most [128]\n"
            "  --temperature T     0: greedy [0]\n"
            "  --top-p P           nucleus sampling mass, (0, 1] [1]\n"
            "  --seed N            sampling seed [1]\n"
            "  --no-bos            do not prepend the BOS token\n"
            "  --ignore-eos        keep generating after EOS\n"
            "  --budget N          mixkv: tokens kept per head-region, 0: none [0] (the FP16\n"
            "                      baseline compresses nothing, so not with --mode fp16)\n"
            MKV_POLICY_OPTS_HELP
            MKV_RUN_OPTS_HELP
            "  --threads N         forward-pass threads (CPU) [one per core]\n"
            "  --tp N              tensor parallelism over GPUs 0..N-1 (CUDA; NCCL), one cache\n"
            "                      per GPU for its share of the KV heads [1]\n"
            "  --dump FILE         write the cache when the request finishes, before its pages\n"
            "                      are released (for 'mixkv inspect'); with --tp, one file per\n"
            "                      GPU: FILE's stem with .rank0.json, .rank1.json, ...\n"
            "  --json FILE         write the result as JSON ('-': stdout, then no streaming)\n"
            "  --quiet             print only the summary\n"
            "  -h, --help          this help\n"
            "\n"
            "exit status: 0 success, 1 a run failed, 2 bad usage or input.\n");
}

static int parse(int argc, char **argv, gen_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        int m;
        if (mkv_cli_is_help(argv[i])) {
            mkv_generate_usage(stdout);
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
#define STR_OPT(name, field)                                                                   \
    if ((m = mkv_cli_option(CMD, argc, argv, &i, name, 1, 0, &v)) != 0) {                      \
        if (m < 0) return -1;                                                                  \
        o->field = v;                                                                          \
        continue;                                                                              \
    }
        STR_OPT("--model", model)
        STR_OPT("--prompt", prompt)
        STR_OPT("--chat", chat)
        STR_OPT("--tokens", tokens)
        STR_OPT("--json", json_path)
        STR_OPT("--dump", dump_path)
#undef STR_OPT
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--mode", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            if (strcmp(v, "fp16") && strcmp(v, "mixkv")) {
                mkv_cli_error(CMD, "--mode: '%s' is not fp16 or mixkv", v);
                return -1;
            }
            o->fp16 = !strcmp(v, "fp16");
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--max-tokens", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--max-tokens", v, 1, 1 << 20, &o->max_tokens) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--budget", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--budget", v, 0, 1 << 30, &o->budget) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--temperature", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_double(CMD, "--temperature", v, 0.0, 100.0, &o->temperature) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--top-p", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_double(CMD, "--top-p", v, 1e-6, 1.0, &o->top_p) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--tp", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--tp", v, 1, MKV_TP_MAX_RANKS, &o->tp) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--threads", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--threads", v, 1, 256, &o->threads) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--seed", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i64(CMD, "--seed", v, 0, INT64_MAX, &o->seed) < 0) return -1;
            continue;
        }
        if (!strcmp(argv[i], "--no-bos")) { o->no_bos = 1; continue; }
        if (!strcmp(argv[i], "--ignore-eos")) { o->ignore_eos = 1; continue; }
        if (!strcmp(argv[i], "--quiet")) { o->quiet = 1; continue; }
        mkv_cli_error(CMD, "unknown argument '%s' (see 'mixkv generate --help')", argv[i]);
        return -1;
    }
    if (!o->model) {
        mkv_cli_error(CMD, "--model DIR is required");
        return -1;
    }
    if (!!o->prompt + !!o->chat + !!o->tokens != 1) {
        mkv_cli_error(CMD, "give exactly one of --prompt TEXT, --chat TEXT and --tokens LIST");
        return -1;
    }
    if (o->fp16 && o->budget > 0) {
        mkv_cli_error(CMD, "--budget with --mode fp16: the FP16 baseline compresses nothing");
        return -1;
    }
    if (mkv_cli_check_writable(CMD, "--json", o->json_path) < 0 ||
        mkv_cli_check_writable(CMD, "--dump", o->dump_path) < 0)
        return -1;
    if (o->tp > 1 && o->run.backend != MKV_BACKEND_CUDA) {
        mkv_cli_error(CMD, "--tp %d: tensor parallelism runs on the CUDA backend (--backend cuda)", o->tp);
        return -1;
    }
    return 0;
}

/* "1,2,3" -> ids. */
static int parse_ids(const char *text, int32_t vocab, int32_t **out, int32_t *n)
{
    int32_t cap = 16, k = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = text;
    while (ids && *p) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= vocab) {
            mkv_cli_error(CMD, "--tokens: '%s' is not a list of ids in [0, %d)", text, vocab);
            free(ids);
            return -1;
        }
        if (k == cap) {
            int32_t *g = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!g) break;
            ids = g;
        }
        ids[k++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            mkv_cli_error(CMD, "--tokens: unexpected '%c' in '%s'", *end, text);
            free(ids);
            return -1;
        }
    }
    if (!ids || k == 0) {
        mkv_cli_error(CMD, "--tokens: no ids");
        free(ids);
        return -1;
    }
    *out = ids;
    *n = k;
    return 0;
}

typedef struct stream {
    const mkv_tokenizer_t *tok;
    int32_t prev;
    int on;
    int32_t seen;        /* tokens received */
    double t_first;      /* when the first token arrived (right after the prefill) */
} stream_t;

static double now_s(void);

static void on_token(void *ctx, const mkv_request_t *r, int32_t t)
{
    stream_t *s = ctx;
    (void)r;
    if (s->seen++ == 0) s->t_first = now_s();
    if (!s->on) return;
    if (s->tok) {
        char buf[512];
        fputs(mkv_tokenizer_piece(s->tok, s->prev, t, buf, sizeof buf), stdout);
    } else {
        printf(" %d", t);
    }
    s->prev = t;
    fflush(stdout);
}

typedef struct dump_ctx {
    const char *path;
    mkv_scheduler_t *sched;
} dump_ctx_t;

/* --dump: the cache when the request finishes, before its slot is released; with several
 * GPUs, each one's cache to PATH's stem (PATH without .json) with .rankN.json, the names
 * `mixkv inspect --tp PATH` reads. */
static mkv_status_t dump_at_finish(void *ctx, const mkv_request_t *r, mkv_cache_t *cache)
{
    (void)r, (void)cache;
    const dump_ctx_t *d = ctx;
    const int32_t n = mkv_scheduler_n_caches(d->sched);
    for (int32_t g = 0; g < n; g++) {
        mkv_cache_t *c = mkv_scheduler_cache(d->sched, g);
        char path[4096];
        const size_t len = strlen(d->path);
        const int json = len >= 5 && !strcmp(d->path + len - 5, ".json");
        if (n == 1) snprintf(path, sizeof path, "%s", d->path);
        else snprintf(path, sizeof path, "%.*s.rank%d.json", (int)(json ? len - 5 : len), d->path, g);
        const mkv_status_t st = mkv_cache_dump_json(c, path);
        if (st != MKV_STATUS_OK) return mkv_fail_global(st, "--dump %s: %s", path, mkv_cache_last_error(c));
    }
    return MKV_STATUS_OK;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int mkv_generate_main(int argc, char **argv)
{
    gen_opts_t o = {0};
    o.max_tokens = 128;
    o.tp = 1;
    o.top_p = 1.0;
    o.seed = 1;
    mkv_policy_opts_default(&o.policy);
    mkv_run_opts_default(&o.run);
    const int p = parse(argc, argv, &o);
    if (p != 0) return p > 0 ? MKV_EXIT_OK : MKV_EXIT_USAGE;

    int rc = MKV_EXIT_FAIL;
    char err[512];
    mkv_model_t *model = NULL;
    mkv_tokenizer_t *tok = NULL;
    mkv_cache_t *caches[MKV_TP_MAX_RANKS] = {NULL};
    mkv_cache_t *cache = NULL; /* caches[0] */
    mkv_scheduler_t *sched = NULL;
    mkv_tools_forward_t fw;
    memset(&fw, 0, sizeof fw);
    mkv_tp_t *tp = NULL;
    int32_t *ids = NULL, n_ids = 0;
    mkv_request_t req;
    memset(&req, 0, sizeof req);

    if (mkv_model_load(o.model, &model, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        return MKV_EXIT_USAGE;
    }
    if (mkv_tokenizer_load(o.model, &tok, err) != MKV_STATUS_OK) {
        if (!o.tokens) {
            mkv_cli_error(CMD, "%s (give token ids with --tokens instead)", err);
            rc = MKV_EXIT_USAGE;
            goto done;
        }
        tok = NULL; /* ids in, ids out */
    }
    int32_t eos = model->cfg.eos;
    if (o.chat) {
        const mkv_chat_template_t t = mkv_chat_detect(tok);
        if (mkv_chat_encode(tok, t, o.chat, &ids, &n_ids, err) != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "--chat: %s", err);
            rc = MKV_EXIT_USAGE;
            goto done;
        }
        const int32_t end = mkv_chat_end_token(tok, t);
        if (end >= 0) eos = end;
    } else if (o.prompt) {
        if (mkv_tokenizer_encode(tok, o.prompt, strlen(o.prompt), !o.no_bos && mkv_tools_add_bos(tok), &ids, &n_ids, err) !=
            MKV_STATUS_OK) {
            mkv_cli_error(CMD, "%s", err);
            rc = MKV_EXIT_USAGE;
            goto done;
        }
    } else if (parse_ids(o.tokens, model->cfg.vocab, &ids, &n_ids) < 0) {
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    const int32_t max_len = n_ids + o.max_tokens;
    if (max_len > model->cfg.max_pos) {
        mkv_cli_error(CMD, "prompt %d + --max-tokens %d exceeds the model's %d positions", n_ids,
                      o.max_tokens, model->cfg.max_pos);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (o.tp > 1) {
        if (mkv_tp_create(model, NULL, 0, o.tp, max_len, o.run.dtype, &tp, err) != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "--tp %d: %s", o.tp, err);
            goto done;
        }
    } else if (mkv_tools_forward_create(CMD, model, &o.run, max_len, o.threads, &fw) < 0) {
        goto done;
    }
    for (int32_t g = 0; g < o.tp; g++)
        if (mkv_policy_make_cache_rank(model, o.run.backend, o.fp16, &o.policy, 1, max_len, 1.0, g, o.tp,
                                       &caches[g]) != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "cannot create the %s cache: %s", o.fp16 ? "fp16" : "mixkv", mkv_last_error());
            goto done;
        }
    cache = caches[0];
    if (tp && mkv_tp_forward(tp, caches, &fw.fwd) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        goto done;
    }
    if (mkv_scheduler_create_multi(&fw.fwd, caches, o.tp, eos, 1, &sched) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        goto done;
    }
    dump_ctx_t dctx = {o.dump_path, sched};
    if (o.dump_path) mkv_scheduler_on_finish(sched, dump_at_finish, &dctx);
    const int stream_on = !o.quiet && !(o.json_path && !strcmp(o.json_path, "-"));
    stream_t stream = {tok, -1, stream_on, 0, 0.0};
    mkv_scheduler_on_token(sched, on_token, &stream);
    req.id = 0;
    req.prompt = ids;
    req.prompt_len = n_ids;
    req.max_new_tokens = o.max_tokens;
    req.budget = o.budget;
    req.stop_at_eos = !o.ignore_eos;
    req.sampler.temperature = (float)o.temperature;
    req.sampler.top_p = (float)o.top_p;
    mkv_sampler_seed(&req.sampler, (uint64_t)o.seed);
    if (mkv_scheduler_add(sched, &req) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (stream_on) {
        if (tok) {
            char *text = NULL;
            if (mkv_tokenizer_decode(tok, ids, n_ids, 1, &text, err) == MKV_STATUS_OK) fputs(text, stdout);
            free(text);
            stream.prev = ids[n_ids - 1];
        } else {
            for (int32_t i = 0; i < n_ids; i++) printf("%s%d", i ? " " : "", ids[i]);
        }
        fflush(stdout);
    }
    const double t0 = now_s();
    while (!mkv_scheduler_idle(sched)) {
        if (mkv_scheduler_step(sched, NULL) != MKV_STATUS_OK) {
            if (stream_on) putchar('\n');
            mkv_cli_error(CMD, "%s", mkv_last_error());
            goto done;
        }
    }
    const double t1 = now_s();
    if (req.state != MKV_REQ_FINISHED) {
        mkv_cli_error(CMD, "the request did not finish: %s", mkv_last_error());
        goto done;
    }
    if (stream_on) putchar('\n');

    mkv_cache_info_t info;
    mkv_cache_info(cache, &info);
    const mkv_cache_config_t *cc = &info.config;
    const double seen = (double)req.kv.seq_len * cc->n_layers * cc->n_kv_heads * o.tp; /* every GPU's */
    const double bytes = (double)(req.kv.pages_hi + req.kv.pages_lo) * (double)cc->page_bytes;
    const double fp16 = seen * 2.0 * cc->head_dim * 2.0;
    const double t_first = stream.t_first; /* prompt in, first token out */
    const double gen_s = t1 - t_first;
    const double tps = req.n_out > 1 && gen_s > 0 ? (req.n_out - 1) / gen_s : 0.0;
    fprintf(o.json_path && !strcmp(o.json_path, "-") ? stderr : stdout,
            "\n[%s] %d prompt + %d generated tokens in %.2f s (prefill %.3f s, %.1f tokens/s); "
            "KV %.0f bytes vs %.0f FP16 (ratio %.3f); tokens high %.1f%%, low %.1f%%, pruned "
            "%.1f%%\n",
            o.fp16 ? "fp16" : "mixkv", n_ids, req.n_out, t1 - t0, t_first - t0, tps, bytes, fp16,
            bytes / fp16, 100.0 * (double)req.kv.tokens_hi / seen,
            100.0 * (double)req.kv.tokens_lo / seen,
            100.0 * (seen - (double)req.kv.tokens_hi - (double)req.kv.tokens_lo) / seen);
    if (o.json_path) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "schema", "mixkv-generate");
        cJSON_AddNumberToObject(root, "schema_version", 1);
        cJSON_AddStringToObject(root, "mode", o.fp16 ? "fp16" : "mixkv");
        cJSON_AddStringToObject(root, "backend", mkv_backend_name(o.run.backend));
        cJSON_AddStringToObject(root, "dtype", o.run.backend == MKV_BACKEND_CUDA ? mkv_dtype_name(o.run.dtype) : "f32");
        cJSON_AddItemToObject(root, "prompt_tokens", mkv_cli_json_ids(ids, n_ids));
        cJSON_AddItemToObject(root, "tokens", mkv_cli_json_ids(req.out, req.n_out));
        if (tok) {
            char *text = NULL;
            if (mkv_tokenizer_decode(tok, req.out, req.n_out, 1, &text, err) == MKV_STATUS_OK)
                cJSON_AddStringToObject(root, "text", text);
            free(text);
        }
        cJSON_AddNumberToObject(root, "seconds", t1 - t0);
        cJSON_AddNumberToObject(root, "prefill_seconds", t_first - t0);
        cJSON_AddNumberToObject(root, "tokens_per_second", tps);
        cJSON_AddNumberToObject(root, "kv_bytes", bytes);
        cJSON_AddNumberToObject(root, "kv_bytes_fp16", fp16);
        cJSON_AddNumberToObject(root, "memory_ratio_to_fp16", bytes / fp16);
        cJSON_AddNumberToObject(root, "fraction_high", (double)req.kv.tokens_hi / seen);
        cJSON_AddNumberToObject(root, "fraction_low", (double)req.kv.tokens_lo / seen);
        cJSON_AddNumberToObject(root, "fraction_pruned",
                                (seen - (double)req.kv.tokens_hi - (double)req.kv.tokens_lo) / seen);
        const int w = mkv_cli_write_json(CMD, root, o.json_path);
        cJSON_Delete(root);
        if (w < 0) goto done;
    }
    rc = MKV_EXIT_OK;
done:
    free(req.out);
    free(ids);
    mkv_scheduler_free(sched);
    mkv_tools_forward_free(&fw);
    mkv_tp_free(tp);
    for (int32_t g = 0; g < o.tp; g++) mkv_cache_destroy(caches[g]);
    mkv_tokenizer_free(tok);
    mkv_model_free(model);
    return rc;
}
