/*
 * bench_forward.c — speed of the CPU model runner (runner/forward.c): the prefill of a P-token
 * prompt and decode tokens/s over N tokens at that length, through the FP16 cache (K16V16,
 * nothing compressed) and through mixkv's defaults (K8V4 / K4V2, alpha 1 / 0.02, W 64).
 *
 * The model is SmolLM2-135M's shapes with random weights built in memory (rounded to bf16, as
 * the released checkpoint stores them), or a real one with --model DIR. Each repeat admits one
 * sequence, prefills it (last logits only, as generation does; --all-logits also times the
 * logits of every position, as perplexity needs), decodes N greedy tokens, and releases it.
 * The first repeat is a warm-up unless --repeats 1; figures are the median (and min) of the
 * rest. Results: a table, and JSON with --json (docs/results-schema.md, `mixkv-bench-forward`).
 */
#include "runner/model.h"
#include "mixkv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---------------------------------------------------------------------------------------- */
/* A random model of given shapes                                                           */
/* ---------------------------------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float uniform(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Rounded to bf16 (nearest even), as a bf16 checkpoint loaded into fp32 holds them. */
static float *rand_tensor(int64_t n, float scale, float offset)
{
    float *t = malloc((size_t)n * sizeof(float));
    if (!t) {
        fprintf(stderr, "bench_forward: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        float x = offset + scale * uniform();
        uint32_t u;
        memcpy(&u, &x, 4);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        memcpy(&t[i], &u, 4);
    }
    return t;
}

static mkv_model_t *random_model(const mkv_model_config_t *c)
{
    mkv_model_t *m = calloc(1, sizeof *m);
    m->cfg = *c;
    const int64_t D = c->hidden, QD = (int64_t)c->n_heads * c->head_dim,
                  KD = (int64_t)c->n_kv_heads * c->head_dim, I = c->intermediate;
    const float s_in = 1.0f / sqrtf((float)D) * 1.7f, s_inter = 1.0f / sqrtf((float)I) * 1.7f;
    m->embed = rand_tensor((int64_t)c->vocab * D, 1.0f, 0.0f);
    m->lm_head = m->embed; /* tied, as SmolLM2 */
    m->final_norm = rand_tensor(D, 0.1f, 1.0f);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    for (int32_t l = 0; l < c->n_layers; l++) {
        mkv_layer_weights_t *w = &m->layers[l];
        w->attn_norm = rand_tensor(D, 0.1f, 1.0f);
        w->mlp_norm = rand_tensor(D, 0.1f, 1.0f);
        w->wq = rand_tensor(QD * D, s_in * 2.0f, 0.0f);
        w->wk = rand_tensor(KD * D, s_in * 2.0f, 0.0f);
        w->wv = rand_tensor(KD * D, s_in, 0.0f);
        w->wo = rand_tensor(D * QD, 1.0f / sqrtf((float)QD), 0.0f);
        w->w_gate = rand_tensor(I * D, s_in, 0.0f);
        w->w_up = rand_tensor(I * D, s_in, 0.0f);
        w->w_down = rand_tensor(D * I, s_inter * 0.5f, 0.0f);
    }
    return m;
}

static void free_random_model(mkv_model_t *m)
{
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        mkv_layer_weights_t *w = &m->layers[l];
        free((void *)w->attn_norm), free((void *)w->mlp_norm), free((void *)w->wq);
        free((void *)w->wk), free((void *)w->wv), free((void *)w->wo);
        free((void *)w->w_gate), free((void *)w->w_up), free((void *)w->w_down);
    }
    free(m->layers);
    free((void *)m->embed);
    free((void *)m->final_norm);
    free(m);
}

/* ---------------------------------------------------------------------------------------- */
/* One mode                                                                                 */
/* ---------------------------------------------------------------------------------------- */

typedef struct mode_result {
    const char *name;
    double prefill_s, prefill_min_s;       /* last logits only */
    double prefill_all_s;                  /* logits of every position (0: not timed) */
    double decode_tps, decode_tps_max;     /* tokens/s over N decode steps */
    double step_ms_median;                 /* median decode step */
} mode_result_t;

static mkv_cache_t *make_cache(const mkv_model_t *m, int fp16, int32_t max_len)
{
    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cfg;
    if (fp16) {
        base.hi_format = base.lo_format = MKV_FORMAT_K16V16;
        base.alpha_h = base.alpha_l = 0.0f;
    }
    base.max_seqs = 1;
    base.max_seq_len = max_len;
    mkv_model_cache_config(m, &base, &cfg);
    int32_t tpp;
    int64_t page_bytes;
    if (mkv_page_bytes_for(cfg.hi_format, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group, 32,
                           &page_bytes) ||
        mkv_tokens_per_page(cfg.hi_format, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group,
                            page_bytes, &tpp))
        return NULL;
    cfg.pool_pages = (int64_t)cfg.n_layers * cfg.n_kv_heads * ((max_len + tpp - 1) / tpp + 4) + 1;
    mkv_cache_t *c = NULL;
    if (mkv_cache_create(&cfg, &c) != MKV_STATUS_OK) return NULL;
    return c;
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int run_mode(const mkv_model_t *m, mkv_forward_ws_t *ws, int fp16, int32_t P, int32_t N,
                    int repeats, int all_logits, mode_result_t *r)
{
    const int32_t V = m->cfg.vocab;
    mkv_cache_t *c = make_cache(m, fp16, P + N + 1);
    if (!c) {
        fprintf(stderr, "bench_forward: cache: %s\n", mkv_last_error());
        return -1;
    }
    int32_t *toks = malloc((size_t)P * sizeof *toks);
    float *last = malloc((size_t)V * sizeof(float));
    float *all = all_logits ? malloc((size_t)P * V * sizeof(float)) : NULL;
    double *pre = calloc((size_t)repeats, sizeof(double)), *pall = calloc((size_t)repeats, sizeof(double));
    double *tps = calloc((size_t)repeats, sizeof(double));
    double *steps = calloc((size_t)repeats * (size_t)N, sizeof(double));
    int nsteps = 0, rc = 0;
    for (int32_t t = 0; t < P; t++) toks[t] = (int32_t)(((uint64_t)t * 2654435761u + 17) % (uint64_t)V);
    const int warm = repeats > 1;
    for (int rep = 0; rep < repeats + warm && rc == 0; rep++) {
        const int k = rep - warm; /* < 0: warm-up */
        for (int pass = 0; pass < 1 + (all_logits && k >= 0); pass++) {
            int32_t slot;
            if (mkv_cache_admit(c, P, &slot) != MKV_STATUS_OK) goto fail;
            const double t0 = now_s();
            if (mkv_model_prefill(m, c, slot, toks, P, pass ? all : NULL, last, ws) != MKV_STATUS_OK)
                goto fail;
            const double t1 = now_s();
            if (pass) {
                pall[k] = t1 - t0;
                if (mkv_cache_release(c, slot, NULL) != MKV_STATUS_OK) goto fail;
                continue;
            }
            if (k >= 0) pre[k] = t1 - t0;
            int32_t tok = argmax(last, V);
            const double d0 = now_s();
            for (int32_t s = 0; s < N; s++) {
                const double s0 = now_s();
                if (mkv_model_decode(m, c, 1, &slot, &tok, last, ws) != MKV_STATUS_OK) goto fail;
                if (k >= 0) steps[nsteps++] = now_s() - s0;
                tok = argmax(last, V);
            }
            if (k >= 0) tps[k] = N / (now_s() - d0);
            if (mkv_cache_release(c, slot, NULL) != MKV_STATUS_OK) goto fail;
        }
        fprintf(stderr, "  %s repeat %d%s done\n", fp16 ? "fp16" : "mixkv", rep, k < 0 ? " (warm-up)" : "");
        continue;
    fail:
        fprintf(stderr, "bench_forward: %s\n", mkv_last_error()[0] ? mkv_last_error() : mkv_cache_last_error(c));
        rc = -1;
    }
    if (rc == 0) {
        r->name = fp16 ? "fp16" : "mixkv";
        r->prefill_s = median(pre, repeats);
        r->prefill_min_s = pre[0];
        r->prefill_all_s = all_logits ? median(pall, repeats) : 0.0;
        r->decode_tps = median(tps, repeats);
        r->decode_tps_max = tps[repeats - 1];
        r->step_ms_median = nsteps ? 1e3 * median(steps, nsteps) : 0.0;
    }
    free(toks), free(last), free(all), free(pre), free(pall), free(tps), free(steps);
    mkv_cache_destroy(c);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Main                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_forward [--model DIR] [--prompt P] [--decode N] [--repeats R]\n"
            "                     [--threads T] [--modes fp16,mixkv] [--all-logits] [--json FILE]\n"
            "Prefill of a P-token prompt (default 2048) and decode tokens/s over N tokens\n"
            "(default 64) at that length, through the FP16 cache and mixkv's defaults; the\n"
            "model is SmolLM2-135M's shapes with random bf16 weights unless --model.\n"
            "Median of R repeats (default 3) after one warm-up; T threads (default: all cores).\n");
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *json = NULL, *modes = "fp16,mixkv";
    int32_t P = 2048, N = 64, threads = 0;
    int repeats = 3, all_logits = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--all-logits")) all_logits = 1;
        else if (!v) { usage(); return 2; }
        else if (!strcmp(a, "--model")) model_dir = v, i++;
        else if (!strcmp(a, "--json")) json = v, i++;
        else if (!strcmp(a, "--modes")) modes = v, i++;
        else if (!strcmp(a, "--prompt")) P = atoi(v), i++;
        else if (!strcmp(a, "--decode")) N = atoi(v), i++;
        else if (!strcmp(a, "--repeats")) repeats = atoi(v), i++;
        else if (!strcmp(a, "--threads")) threads = atoi(v), i++;
        else { usage(); return 2; }
    }
    if (P < 1 || N < 1 || repeats < 1 || threads < 0) { usage(); return 2; }
    /* The JSON file is opened before the work, so an unwritable path costs nothing. */
    FILE *jf = NULL;
    if (json && !(jf = fopen(json, "w"))) {
        fprintf(stderr, "bench_forward: cannot write %s\n", json);
        return 2;
    }

    mkv_model_t *m = NULL;
    if (model_dir) {
        char err[512];
        if (mkv_model_load(model_dir, &m, err) != MKV_STATUS_OK) {
            fprintf(stderr, "bench_forward: %s\n", err);
            return 1;
        }
    } else {
        const mkv_model_config_t smol = {.hidden = 576, .n_layers = 30, .n_heads = 9, .n_kv_heads = 3,
                                         .head_dim = 64, .intermediate = 1536, .vocab = 49152,
                                         .max_pos = 8192, .rope_theta = 100000.0f, .rms_eps = 1e-5f,
                                         .tied = 1, .bos = 1, .eos = 2};
        m = random_model(&smol);
    }
    if (P + N + 1 > m->cfg.max_pos) {
        fprintf(stderr, "bench_forward: P + N exceeds the model's %d positions\n", m->cfg.max_pos);
        return 2;
    }
    mkv_forward_ws_t *ws = NULL;
    if (mkv_forward_ws_create(m, P, &ws, NULL) != MKV_STATUS_OK ||
        (threads > 0 && mkv_forward_ws_set_threads(ws, threads) != MKV_STATUS_OK)) {
        fprintf(stderr, "bench_forward: %s\n", mkv_last_error());
        return 1;
    }
    threads = mkv_forward_ws_threads(ws);
    const mkv_model_config_t *c = &m->cfg;
    printf("model: %s (hidden %d, %d layers, %d/%d heads, d %d, FFN %d, vocab %d); %d threads; "
           "P %d, N %d, median of %d%s\n",
           model_dir ? model_dir : "random SmolLM2-135M shapes, bf16 weights", c->hidden, c->n_layers,
           c->n_heads, c->n_kv_heads, c->head_dim, c->intermediate, c->vocab, threads, P, N, repeats,
           repeats > 1 ? " after a warm-up" : "");

    mode_result_t res[2];
    int n_res = 0;
    for (int fp16 = 1; fp16 >= 0; fp16--) {
        if (!strstr(modes, fp16 ? "fp16" : "mixkv")) continue;
        if (run_mode(m, ws, fp16, P, N, repeats, all_logits, &res[n_res]) != 0) return 1;
        n_res++;
    }
    printf("%-6s %12s %12s %14s %14s %12s\n", "mode", "prefill_s", "prefill_tps", "all_logits_s",
           "decode_tok/s", "step_ms");
    for (int k = 0; k < n_res; k++)
        printf("%-6s %12.3f %12.1f %14.3f %14.2f %12.2f\n", res[k].name, res[k].prefill_s,
               P / res[k].prefill_s, res[k].prefill_all_s, res[k].decode_tps, res[k].step_ms_median);
    if (jf) {
        FILE *f = jf;
        fprintf(f, "{\"schema\": \"mixkv-bench-forward\", \"schema_version\": 1, "
                   "\"model\": \"%s\", \"hidden\": %d, \"layers\": %d, \"heads\": %d, "
                   "\"kv_heads\": %d, \"head_dim\": %d, \"intermediate\": %d, \"vocab\": %d, "
                   "\"threads\": %d, \"prompt\": %d, \"decode\": %d, \"repeats\": %d, \"modes\": [",
                model_dir ? model_dir : "random-smollm2-135m", c->hidden, c->n_layers, c->n_heads,
                c->n_kv_heads, c->head_dim, c->intermediate, c->vocab, threads, P, N, repeats);
        for (int k = 0; k < n_res; k++)
            fprintf(f, "%s{\"mode\": \"%s\", \"prefill_seconds\": {\"median\": %.4f, \"min\": %.4f}, "
                       "\"prefill_tokens_per_second\": %.1f, \"prefill_all_logits_seconds\": %.4f, "
                       "\"decode_tokens_per_second\": {\"median\": %.2f, \"max\": %.2f}, "
                       "\"step_ms_median\": %.3f}",
                    k ? ", " : "", res[k].name, res[k].prefill_s, res[k].prefill_min_s,
                    P / res[k].prefill_s, res[k].prefill_all_s, res[k].decode_tps,
                    res[k].decode_tps_max, res[k].step_ms_median);
        fprintf(f, "]}\n");
        fclose(f);
    }
    mkv_forward_ws_free(ws);
    if (model_dir) mkv_model_free(m);
    else free_random_model(m);
    return 0;
}
