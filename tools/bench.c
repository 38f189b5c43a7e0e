/*
 * bench.c — `mixkv bench`: the main job. Runs a synthetic workload (engine/synthetic.h)
 * through the KV backend twice, as the FP16 paged baseline (K16V16, nothing compressed) and as
 * mixkv (K8V4 / K4V2 with the DiffKV policy), and compares memory, quality and speed:
 * bytes per token and ratio to FP16, fractions of tokens high / low / pruned, the relative
 * error of every decode attention output against exact float64 attention over the full,
 * unquantized K/V, how many sequences fit in a fixed pool, and decode steps per second.
 * Table on stdout, JSON with --json (docs/results-schema.md, schema "mixkv-bench").
 */
#include "engine/synthetic.h"
#include "mixkv.h"
#include "tools/cli.h"
#include "tools/model_opts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CMD "bench"

typedef struct bench_opts {
    int32_t layers, kv_heads, group, head_dim, batch, prompt_min, prompt_max, gen;
    mkv_policy_t policy; /* mixkv's (tools/model_opts.h: the shared options) */
    int64_t pool_mib;
    uint64_t seed;
    const char *json_path;
    int quiet;
} bench_opts_t;

typedef struct mode_result {
    const char *name;
    int baseline;            /* the FP16 baseline: nothing compressed (no fixed mix either) */
    mkv_format_t hi, lo;
    float alpha_h, alpha_l;
    int64_t page_bytes;
    int32_t tpp_hi, tpp_lo;
    mkv_cache_stats_t end;   /* stats after the last step */
    int64_t peak_pages;      /* most pages in use at once */
    int64_t seq_tokens;      /* sum of N over sequences at the end */
    double err_mean, err_p50, err_p99, err_max; /* relative L2 error of decode outputs */
    int64_t n_outputs;
    double prefill_s, decode_s;                 /* backend time only */
    double step_ms_median;
    int64_t fits;                               /* sequences that fit in the fixed pool */
} mode_result_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Exact attention in float64 of query q[d] over keys / values [n][stride][d] (head h). */
static void exact_attention(const float *q, const float *k, const float *v, int64_t n, int64_t stride,
                            int64_t d, double scale, double *logits, double *out)
{
    double mx = -INFINITY, z = 0.0;
    for (int64_t t = 0; t < n; t++) {
        double s = 0.0;
        for (int64_t e = 0; e < d; e++) s += (double)q[e] * (double)k[t * stride * d + e];
        logits[t] = s * scale;
        if (logits[t] > mx) mx = logits[t];
    }
    for (int64_t e = 0; e < d; e++) out[e] = 0.0;
    for (int64_t t = 0; t < n; t++) {
        const double p = exp(logits[t] - mx);
        z += p;
        for (int64_t e = 0; e < d; e++) out[e] += p * (double)v[t * stride * d + e];
    }
    for (int64_t e = 0; e < d; e++) out[e] /= z;
}

/* The nearest-rank percentile of sorted x[n] (n >= 1): the smallest value with at least pct
 * percent of the samples at or below it, x[ceil(pct / 100 * n) - 1]. For n < 100 the 99th is
 * the maximum; it is never below the median. Integer arithmetic: no rounding surprises. */
static double percentile(const double *x, int64_t n, int pct)
{
    int64_t rank = (pct * n + 99) / 100; /* ceil(pct * n / 100) */
    if (rank < 1) rank = 1;
    return x[rank - 1];
}

#define TRY_MKV(call, c)                                                                       \
    do {                                                                                       \
        mkv_status_t st_ = (call);                                                             \
        if (st_ != MKV_STATUS_OK) {                                                            \
            mkv_cli_error(CMD, "%s: %s: %s", #call, mkv_status_string(st_),                    \
                          (c) ? mkv_cache_last_error(c) : mkv_last_error());                   \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

static int run_mode(const bench_opts_t *o, mode_result_t *res)
{
    const int64_t L = o->layers, H = o->kv_heads, G = o->group, Hq = H * G, d = o->head_dim;
    const int64_t B = o->batch, max_len = o->prompt_max + o->gen;
    const mkv_synth_t w = {o->layers, o->kv_heads, o->group, o->head_dim, o->seed};
    int rc = -1;
    mkv_cache_t *c = NULL;
    float *kall = NULL, *vall = NULL, *q = NULL, *out = NULL, *kstep = NULL, *vstep = NULL;
    double *logits = NULL, *ref = NULL, *errs = NULL, *step_ms = NULL;
    int32_t *slots = NULL, *len = NULL;
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = o->layers;
    cfg.n_kv_heads = o->kv_heads;
    cfg.group_size = o->group;
    cfg.head_dim = o->head_dim;
    mkv_policy_apply(&o->policy, &cfg); /* then this mode's formats and thresholds */
    cfg.max_seqs = o->batch;
    cfg.max_seq_len = (int32_t)max_len;
    cfg.hi_format = res->hi;
    cfg.lo_format = res->lo;
    cfg.alpha_h = res->alpha_h;
    cfg.alpha_l = res->alpha_l;
    if (res->baseline) { /* nothing compressed, so no scores (a plain paged engine's cache) */
        cfg.mix_high = cfg.mix_low = 0.0f;
        cfg.flags |= MKV_CACHE_NO_SCORES;
    }
    /* Room for every sequence at full length in whichever format takes more pages (a low
     * format may be wider than the high one), plus the admission slack and a partial page per
     * section. */
    int32_t tpp, tpp_lo;
    int64_t page_bytes;
    TRY_MKV(mkv_page_bytes_for(res->hi, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group, 32,
                               &page_bytes), c);
    TRY_MKV(mkv_tokens_per_page(res->hi, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group,
                                page_bytes, &tpp), c);
    TRY_MKV(mkv_tokens_per_page(res->lo, cfg.head_dim, cfg.lo_key_group, cfg.lo_value_group,
                                page_bytes, &tpp_lo), c);
    if (tpp_lo < tpp) tpp = tpp_lo;
    cfg.pool_pages = B * L * H * ((max_len + tpp - 1) / tpp + 3);
    TRY_MKV(mkv_cache_create(&cfg, &c), c);
    mkv_cache_info_t info;
    TRY_MKV(mkv_cache_info(c, &info), c);
    res->page_bytes = info.config.page_bytes;
    res->tpp_hi = info.tokens_per_page_hi;
    res->tpp_lo = info.tokens_per_page_lo;

    /* Full-precision K/V of every position, for the exact reference: [B][L][max_len][H][d]. */
    const int64_t per_req = L * max_len * H * d;
    const int64_t n_out = (int64_t)o->gen * B * L * Hq;
    const int64_t q_rows = o->prompt_max > B ? o->prompt_max : B; /* prompt rows or one per seq */
    kall = malloc((size_t)(B * per_req) * sizeof(float));
    vall = malloc((size_t)(B * per_req) * sizeof(float));
    q = malloc((size_t)(q_rows * Hq * d) * sizeof(float));
    out = malloc((size_t)(q_rows * Hq * d) * sizeof(float));
    kstep = malloc((size_t)(B * H * d) * sizeof(float));
    vstep = malloc((size_t)(B * H * d) * sizeof(float));
    logits = malloc((size_t)max_len * sizeof(double));
    ref = malloc((size_t)d * sizeof(double));
    errs = malloc((size_t)(n_out > 0 ? n_out : 1) * sizeof(double));
    step_ms = malloc((size_t)(o->gen > 0 ? o->gen : 1) * sizeof(double));
    slots = malloc((size_t)B * sizeof(int32_t));
    len = malloc((size_t)B * sizeof(int32_t));
    if (!kall || !vall || !q || !out || !kstep || !vstep || !logits || !ref || !errs || !step_ms ||
        !slots || !len) {
        mkv_cli_error(CMD, "out of memory for the workload");
        goto fail;
    }
    mkv_cache_stats_t st;

    /* Prompts: requests of different lengths, prefilled layer by layer, then committed. */
    uint64_t lr = o->seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t b = 0; b < B; b++) {
        lr = lr * 6364136223846793005ull + 1442695040888963407ull;
        len[b] = o->prompt_min + (int32_t)((lr >> 33) % (uint64_t)(o->prompt_max - o->prompt_min + 1));
        TRY_MKV(mkv_cache_admit(c, len[b], &slots[b]), c);
        for (int64_t l = 0; l < L; l++) {
            float *kl = kall + b * per_req + l * max_len * H * d, *vl = vall + b * per_req + l * max_len * H * d;
            mkv_synth_layer(&w, (int32_t)b, (int32_t)l, 0, len[b], q, kl, vl);
            const double t0 = now_s();
            TRY_MKV(mkv_cache_prefill_layer(c, slots[b], (int32_t)l, q, kl, vl, out, NULL), c);
            res->prefill_s += now_s() - t0;
        }
        const double t0 = now_s();
        TRY_MKV(mkv_cache_commit_prompt(c, 1, &slots[b], NULL), c);
        res->prefill_s += now_s() - t0;
    }
    TRY_MKV(mkv_cache_stats(c, &st), c);
    res->peak_pages = st.pages_hi + st.pages_lo;

    /* Decode steps over the whole batch. */
    int64_t ne = 0;
    for (int32_t step = 0; step < o->gen; step++) {
        double t_step = 0.0, t0 = now_s();
        TRY_MKV(mkv_cache_append(c, (int32_t)B, slots, NULL), c);
        t_step += now_s() - t0;
        for (int64_t l = 0; l < L; l++) {
            for (int64_t b = 0; b < B; b++) {
                const int32_t pos = len[b] + step;
                float *kl = kall + b * per_req + l * max_len * H * d, *vl = vall + b * per_req + l * max_len * H * d;
                mkv_synth_layer(&w, (int32_t)b, (int32_t)l, pos, 1, q + b * Hq * d, kl + pos * H * d,
                                vl + pos * H * d);
                memcpy(kstep + b * H * d, kl + pos * H * d, (size_t)(H * d) * sizeof(float));
                memcpy(vstep + b * H * d, vl + pos * H * d, (size_t)(H * d) * sizeof(float));
            }
            t0 = now_s();
            TRY_MKV(mkv_cache_decode_layer(c, (int32_t)B, slots, (int32_t)l, q, kstep, vstep, out, NULL), c);
            t_step += now_s() - t0;
            for (int64_t b = 0; b < B; b++) {
                const int64_t n = len[b] + step + 1;
                const float *kl = kall + b * per_req + l * max_len * H * d, *vl = vall + b * per_req + l * max_len * H * d;
                for (int64_t qh = 0; qh < Hq; qh++) {
                    const int64_t h = qh / G;
                    exact_attention(q + (b * Hq + qh) * d, kl + h * d, vl + h * d, n, H, d,
                                    1.0 / sqrt((double)d), logits, ref);
                    double num = 0.0, den = 0.0;
                    for (int64_t e = 0; e < d; e++) {
                        const double diff = (double)out[(b * Hq + qh) * d + e] - ref[e];
                        num += diff * diff;
                        den += ref[e] * ref[e];
                    }
                    errs[ne++] = sqrt(num / (den > 0.0 ? den : 1e-300));
                }
            }
        }
        t0 = now_s();
        TRY_MKV(mkv_cache_compress(c, (int32_t)B, slots, NULL), c);
        t_step += now_s() - t0;
        step_ms[step] = 1e3 * t_step;
        res->decode_s += t_step;
        TRY_MKV(mkv_cache_stats(c, &st), c);
        if (st.pages_hi + st.pages_lo > res->peak_pages) res->peak_pages = st.pages_hi + st.pages_lo;
        if (!o->quiet && isatty(STDERR_FILENO))
            fprintf(stderr, "  %s: step %d/%d\r", res->name, step + 1, o->gen);
    }
    TRY_MKV(mkv_cache_validate(c), c);
    TRY_MKV(mkv_cache_stats(c, &res->end), c);
    for (int64_t b = 0; b < B; b++) res->seq_tokens += len[b] + o->gen;
    if (ne > 0) {
        double sum = 0.0;
        for (int64_t i = 0; i < ne; i++) sum += errs[i];
        qsort(errs, (size_t)ne, sizeof *errs, cmp_double);
        res->err_mean = sum / (double)ne;
        res->err_p50 = percentile(errs, ne, 50);
        res->err_p99 = percentile(errs, ne, 99);
        res->err_max = errs[ne - 1];
    }
    res->n_outputs = ne;
    if (o->gen > 0) {
        qsort(step_ms, (size_t)o->gen, sizeof *step_ms, cmp_double);
        res->step_ms_median = step_ms[o->gen / 2];
    }
    const double seq_bytes = (double)res->peak_pages * (double)res->page_bytes / (double)B;
    res->fits = (int64_t)((double)o->pool_mib * 1048576.0 / seq_bytes);
    rc = 0;
fail:
    mkv_cache_destroy(c);
    free(kall);
    free(vall);
    free(q);
    free(out);
    free(kstep);
    free(vstep);
    free(logits);
    free(ref);
    free(errs);
    free(step_ms);
    free(slots);
    free(len);
    return rc;
}

void mkv_bench_usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv bench [OPTIONS]\n"
            "\n"
            "Runs a synthetic attention workload (docs/synthetic-workload.md) through the KV\n"
            "backend as the FP16 paged baseline (K16V16, nothing compressed) and as mixkv\n"
            "(K8V4 / K4V2 with DiffKV's policy), and compares bytes per token, memory ratio to\n"
            "FP16, tokens kept high / low / pruned, the relative error of decode attention\n"
            "outputs against exact float64 attention, sequences that fit in a fixed pool, and\n"
            "decode steps per second. Runs on the CPU backend (the CUDA backend arrives later).\n"
            "\n"
            "options (defaults in brackets):\n"
            "  --layers N          layers [4]\n"
            "  --kv-heads N        KV heads per layer [4]\n"
            "  --group N           query heads per KV head [4]\n"
            "  --head-dim N        16, 32, 64, 128 or 256 [128]\n"
            "  --batch N           sequences decoded together [8]\n"
            "  --prompt MIN:MAX    prompt lengths, one per sequence [192:320]\n"
            "  --gen N             decode steps [64]\n"
            MKV_POLICY_OPTS_HELP
            "  --window N          an older spelling of --recent-window (bench only)\n"
            "  --pool-mib N        the fixed pool for 'sequences that fit' [1024]\n"
            "  --seed N            workload seed [1]\n"
            "  --json FILE         write the results as JSON ('-': stdout)\n"
            "  --quiet             no progress lines\n"
            "  -h, --help          this help\n"
            "\n"
            "exit status: 0 success, 1 a run failed, 2 bad usage.\n");
}

static int parse_opts(int argc, char **argv, bench_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int m;
        if (mkv_cli_is_help(argv[i])) {
            mkv_bench_usage(stdout);
            return 1;
        }
#define OPT_I32(name, field, lo, hi)                                                           \
    if ((m = mkv_cli_option(CMD, argc, argv, &i, name, 1, 0, &v)) != 0) {                      \
        if (m < 0 || mkv_cli_parse_i32(CMD, name, v, lo, hi, &o->field) < 0) return -1;        \
        continue;                                                                              \
    }
        OPT_I32("--layers", layers, 1, 1024)
        OPT_I32("--kv-heads", kv_heads, 1, 1024)
        OPT_I32("--group", group, 1, 64)
        OPT_I32("--head-dim", head_dim, 16, 256)
        OPT_I32("--batch", batch, 1, 4096)
        OPT_I32("--gen", gen, 0, 1 << 20)
#undef OPT_I32
        /* The policy: the shared options, with bench's older --window for --recent-window. */
        if ((m = mkv_policy_opts_parse_ex(CMD, argc, argv, &i, &o->policy, MKV_POLICY_OPTS_ALIASES)) != 0) {
            if (m < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--prompt", 1, 0, &v)) != 0) {
            int a, b, n = 0;
            if (m < 0) return -1;
            if (sscanf(v, "%d:%d%n", &a, &b, &n) != 2 || v[n] != '\0' || a < 1 || b < a ||
                b > (1 << 20)) {
                mkv_cli_error(CMD, "--prompt: '%s' is not MIN:MAX with 1 <= MIN <= MAX", v);
                return -1;
            }
            o->prompt_min = a;
            o->prompt_max = b;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--pool-mib", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i64(CMD, "--pool-mib", v, 1, 1 << 30, &o->pool_mib) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--seed", 1, 0, &v)) != 0) {
            int64_t s;
            if (m < 0 || mkv_cli_parse_i64(CMD, "--seed", v, 0, INT64_MAX, &s) < 0) return -1;
            o->seed = (uint64_t)s;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--json", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->json_path = v;
            continue;
        }
        if (strcmp(argv[i], "--quiet") == 0) {
            o->quiet = 1;
            continue;
        }
        mkv_cli_error(CMD, "unknown argument '%s' (see 'mixkv bench --help')", argv[i]);
        return -1;
    }
    if (o->head_dim != 16 && o->head_dim != 32 && o->head_dim != 64 && o->head_dim != 128 &&
        o->head_dim != 256) {
        mkv_cli_error(CMD, "--head-dim %d: use 16, 32, 64, 128 or 256", o->head_dim);
        return -1;
    }
    return 0;
}

/* A figure, or null when there is no data for it (no decode outputs, no timed step). */
static void add_figure(cJSON *obj, const char *key, int have, double v)
{
    if (have)
        cJSON_AddNumberToObject(obj, key, v);
    else
        cJSON_AddNullToObject(obj, key);
}

/* A table cell: the figure in fmt, or "n/a" right-aligned in width columns. */
static void print_cell(const char *fmt, int width, int have, double v)
{
    if (have)
        printf(fmt, v);
    else
        printf("%*s", width, "n/a");
}

static cJSON *mode_json(const mode_result_t *r, const bench_opts_t *o)
{
    const mkv_cache_stats_t *s = &r->end;
    const double seen = (double)s->tokens_seen;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "mode", r->name);
    cJSON_AddStringToObject(m, "hi_format", mkv_format_name(r->hi));
    cJSON_AddStringToObject(m, "lo_format", mkv_format_name(r->lo));
    cJSON_AddNumberToObject(m, "alpha_h", r->alpha_h);
    cJSON_AddNumberToObject(m, "alpha_l", r->alpha_l);
    mkv_cli_json_add_i64(m, "page_bytes", r->page_bytes);
    cJSON_AddNumberToObject(m, "tokens_per_page_hi", r->tpp_hi);
    cJSON_AddNumberToObject(m, "tokens_per_page_lo", r->tpp_lo);
    mkv_cli_json_add_i64(m, "bytes_in_use", s->bytes_in_use);
    mkv_cli_json_add_i64(m, "bytes_fp16", s->bytes_fp16);
    cJSON_AddNumberToObject(m, "bytes_per_token", (double)s->bytes_in_use / (double)r->seq_tokens);
    cJSON_AddNumberToObject(m, "memory_ratio_to_fp16", (double)s->bytes_in_use / (double)s->bytes_fp16);
    cJSON_AddNumberToObject(m, "fraction_high", (double)s->tokens_hi / seen);
    cJSON_AddNumberToObject(m, "fraction_low", (double)s->tokens_lo / seen);
    cJSON_AddNumberToObject(m, "fraction_pruned", (double)s->tokens_pruned / seen);
    cJSON *e = cJSON_AddObjectToObject(m, "relative_error");
    add_figure(e, "mean", r->n_outputs > 0, r->err_mean);
    add_figure(e, "p50", r->n_outputs > 0, r->err_p50);
    add_figure(e, "p99", r->n_outputs > 0, r->err_p99);
    add_figure(e, "max", r->n_outputs > 0, r->err_max);
    mkv_cli_json_add_i64(e, "outputs", r->n_outputs);
    mkv_cli_json_add_i64(m, "peak_pages", r->peak_pages);
    mkv_cli_json_add_i64(m, "sequences_fit", r->fits);
    cJSON_AddNumberToObject(m, "prefill_seconds", r->prefill_s);
    cJSON_AddNumberToObject(m, "decode_seconds", r->decode_s);
    const int timed = r->step_ms_median > 0; /* no decode step (--gen 0), or too fast to time */
    add_figure(m, "step_ms_median", timed, r->step_ms_median);
    add_figure(m, "steps_per_second", timed, timed ? 1e3 / r->step_ms_median : 0);
    add_figure(m, "tokens_per_second", timed, timed ? 1e3 * o->batch / r->step_ms_median : 0);
    return m;
}

static void print_table(const bench_opts_t *o, const mode_result_t *r, int n)
{
    printf("\nmixkv bench: L=%d H=%d G=%d d=%d, batch %d, prompts %d..%d, %d decode steps, "
           "W=%d, seed %llu, backend cpu\n\n",
           o->layers, o->kv_heads, o->group, o->head_dim, o->batch, o->prompt_min, o->prompt_max,
           o->gen, o->policy.window, (unsigned long long)o->seed);
    printf("%-28s", "");
    for (int i = 0; i < n; i++) printf("%18s", r[i].name);
    printf("\n%-28s", "formats");
    for (int i = 0; i < n; i++) {
        char f[40];
        snprintf(f, sizeof f, "%s/%s", mkv_format_name(r[i].hi), mkv_format_name(r[i].lo));
        printf("%18s", f);
    }
#define ROW(label, fmt, expr)                                                                  \
    printf("\n%-28s", label);                                                                  \
    for (int i = 0; i < n; i++) printf(fmt, (expr));
    ROW("bytes per token", "%18.1f", (double)r[i].end.bytes_in_use / (double)r[i].seq_tokens)
    ROW("memory ratio to FP16", "%18.3f", (double)r[i].end.bytes_in_use / (double)r[i].end.bytes_fp16)
    ROW("tokens high", "%17.1f%%", 100.0 * (double)r[i].end.tokens_hi / (double)r[i].end.tokens_seen)
    ROW("tokens low", "%17.1f%%", 100.0 * (double)r[i].end.tokens_lo / (double)r[i].end.tokens_seen)
    ROW("tokens pruned", "%17.1f%%", 100.0 * (double)r[i].end.tokens_pruned / (double)r[i].end.tokens_seen)
#define CELL(label, fmt, have, expr)                                                           \
    printf("\n%-28s", label);                                                                  \
    for (int i = 0; i < n; i++) print_cell(fmt, 18, (have), (have) ? (expr) : 0.0);
    CELL("rel. error mean", "%18.2e", r[i].n_outputs > 0, r[i].err_mean)
    CELL("rel. error p99", "%18.2e", r[i].n_outputs > 0, r[i].err_p99)
    CELL("rel. error max", "%18.2e", r[i].n_outputs > 0, r[i].err_max)
    ROW("peak KiB per sequence", "%18.1f",
        (double)r[i].peak_pages * (double)r[i].page_bytes / 1024.0 / (double)o->batch)
    ROW("sequences fit", "%18lld", (long long)r[i].fits)
    CELL("decode steps/s", "%18.1f", r[i].step_ms_median > 0, 1e3 / r[i].step_ms_median)
    CELL("decode tokens/s", "%18.1f", r[i].step_ms_median > 0,
         1e3 * o->batch / r[i].step_ms_median)
    ROW("prefill seconds", "%18.2f", r[i].prefill_s)
#undef ROW
#undef CELL
    printf("\n\n(sequences fit: in a %lld MiB pool at the measured peak pages per sequence; "
           "relative error: L2, per decode output, against exact float64 attention over the "
           "full-precision K/V)\n",
           (long long)o->pool_mib);
    if (n == 2) {
        printf("mixkv vs FP16: %.2fx less KV memory, ",
               (double)r[0].end.bytes_in_use / (double)r[1].end.bytes_in_use);
        if (r[0].fits > 0)
            printf("%.2fx the sequences, ", (double)r[1].fits / (double)r[0].fits);
        else
            printf("n/a the sequences (none fits at FP16), ");
        if (r[0].step_ms_median > 0 && r[1].step_ms_median > 0)
            printf("%.2fx the decode speed\n", r[0].step_ms_median / r[1].step_ms_median);
        else
            printf("n/a the decode speed (no timed decode step)\n");
    }
}

int mkv_bench_main(int argc, char **argv)
{
    bench_opts_t o = {.layers = 4, .kv_heads = 4, .group = 4, .head_dim = 128, .batch = 8,
                      .prompt_min = 192, .prompt_max = 320, .gen = 64, .pool_mib = 1024,
                      .seed = 1, .json_path = NULL, .quiet = 0};
    mkv_policy_default(&o.policy);
    const int p = parse_opts(argc, argv, &o);
    if (p != 0) return p > 0 ? MKV_EXIT_OK : MKV_EXIT_USAGE;
    /* Check the JSON destination before the work, not after it: an unwritable path must not
     * cost a whole run. (Opened for writing now; written in full at the end.) */
    if (o.json_path && strcmp(o.json_path, "-") != 0) {
        FILE *f = fopen(o.json_path, "w");
        if (!f) {
            mkv_cli_error(CMD, "--json: cannot open '%s' for writing: %s", o.json_path,
                          strerror(errno));
            return MKV_EXIT_USAGE;
        }
        fclose(f);
    }

    mode_result_t r[2] = {
        {.name = "fp16", .baseline = 1, .hi = MKV_FORMAT_K16V16, .lo = MKV_FORMAT_K16V16, .alpha_h = 0, .alpha_l = 0},
        {.name = "mixkv", .hi = o.policy.hi, .lo = o.policy.lo, .alpha_h = o.policy.alpha_h,
         .alpha_l = o.policy.alpha_l},
    };
    for (int i = 0; i < 2; i++) {
        if (!o.quiet) fprintf(stderr, "mixkv bench: running %s...\n", r[i].name);
        if (run_mode(&o, &r[i]) != 0) return MKV_EXIT_FAIL;
    }
    if (!o.quiet && isatty(STDERR_FILENO)) fprintf(stderr, "%40s\r", "");
    print_table(&o, r, 2);

    if (o.json_path) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "schema", "mixkv-bench");
        cJSON_AddNumberToObject(root, "schema_version", 1);
        cJSON_AddStringToObject(root, "mixkv_version", mkv_version());
        cJSON_AddStringToObject(root, "backend", "cpu");
        cJSON *cfg = cJSON_AddObjectToObject(root, "workload");
        cJSON_AddStringToObject(cfg, "kind", "synthetic");
        cJSON_AddNumberToObject(cfg, "layers", o.layers);
        cJSON_AddNumberToObject(cfg, "kv_heads", o.kv_heads);
        cJSON_AddNumberToObject(cfg, "group_size", o.group);
        cJSON_AddNumberToObject(cfg, "head_dim", o.head_dim);
        cJSON *gr = cJSON_AddObjectToObject(cfg, "group_elems"); /* as given; 0: default */
        cJSON_AddNumberToObject(gr, "hi_key", o.policy.hi_key_group);
        cJSON_AddNumberToObject(gr, "hi_value", o.policy.hi_value_group);
        cJSON_AddNumberToObject(gr, "lo_key", o.policy.lo_key_group);
        cJSON_AddNumberToObject(gr, "lo_value", o.policy.lo_value_group);
        cJSON_AddNumberToObject(cfg, "batch", o.batch);
        cJSON_AddNumberToObject(cfg, "prompt_min", o.prompt_min);
        cJSON_AddNumberToObject(cfg, "prompt_max", o.prompt_max);
        cJSON_AddNumberToObject(cfg, "gen", o.gen);
        cJSON_AddNumberToObject(cfg, "window", o.policy.window);
        cJSON_AddNumberToObject(cfg, "obs_window", o.policy.obs_window);
        mkv_cli_json_add_i64(cfg, "pool_mib", o.pool_mib);
        mkv_cli_json_add_i64(cfg, "seed", (int64_t)o.seed);
        cJSON *modes = cJSON_AddArrayToObject(root, "modes");
        for (int i = 0; i < 2; i++) cJSON_AddItemToArray(modes, mode_json(&r[i], &o));
        cJSON *cmp = cJSON_AddObjectToObject(root, "mixkv_vs_fp16");
        cJSON_AddNumberToObject(cmp, "memory_saving", (double)r[0].end.bytes_in_use / (double)r[1].end.bytes_in_use);
        add_figure(cmp, "sequences_fit_ratio", r[0].fits > 0,
                   r[0].fits > 0 ? (double)r[1].fits / (double)r[0].fits : 0.0);
        const int both_timed = r[0].step_ms_median > 0 && r[1].step_ms_median > 0;
        add_figure(cmp, "decode_speed_ratio", both_timed,
                   both_timed ? r[0].step_ms_median / r[1].step_ms_median : 0.0);
        const int w = mkv_cli_write_json(CMD, root, o.json_path);
        cJSON_Delete(root);
        if (w < 0) return MKV_EXIT_USAGE;
    }
    return MKV_EXIT_OK;
}
