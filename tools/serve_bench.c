/*
 * serve_bench.c — `mixkv serve-bench`: end-to-end serving throughput and latency of the
 * scheduler loop (engine/scheduler.h) over a model's forward pass, for the FP16 paged baseline
 * (K16V16, nothing compressed) and mixkv, each given the same KV memory: the same number of
 * pages of the same size. N requests with prompt and output lengths drawn (seeded) from fixed
 * values or uniform ranges arrive all at once (offline) or as a Poisson process at each given
 * rate (online: the loop admits a request once the wall clock passes its arrival); every
 * request is greedy and runs to its output length. Reports per engine and rate: requests/s,
 * output tokens/s, steps, peak and mean running batch, preemptions, KV bytes in use (mean,
 * peak), the mix of stored token-heads, and p50 / p99 of time to first token, time per output
 * token and request latency; mixkv's ratios to the baseline. A table, JSON
 * (`mixkv-serve-bench`, docs/results-schema.md) and, over several rates, an SVG plot.
 *
 * The model is a real one (--model, either backend) or stand-in weights at a model's shape on
 * the GPU (--dummy-weights llama-3-8b | CONFIG.json): throughput at real sizes without the
 * weights; the policy then sees a random model's attention (say so when comparing).
 */
#include "engine/scheduler.h"
#include "tools/cli.h"
#include "runner/forward_tp.h"
#include "tools/model_opts.h"
#include "tools/svg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CMD "serve-bench"

typedef struct range {
    int32_t lo, hi;
} range_t;

#define MAX_RATES 16

typedef struct sb_opts {
    const char *model, *dummy, *json_path, *plot_path, *lengths_path;
    int requests_given;
    double rates[MAX_RATES]; /* requests/s; 0: offline */
    int32_t n_rates;
    int32_t requests, max_batch, threads;
    int32_t tp; /* GPUs the model and each engine's KV memory are split over */
    range_t prompt, output;
    double kv_mib;
    int64_t seed;
    int run_fp16, run_mixkv, quiet, phases;
    int32_t graphs; /* CUDA graphs of decode steps, this horizon; 0: off; -1: the default */
    mkv_policy_opts_t policy;
    mkv_run_opts_t run;
} sb_opts_t;

void mkv_serve_bench_usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv serve-bench (--model PATH | --dummy-weights SHAPE) [OPTIONS]\n"
            "\n"
            "Serving throughput and latency: N requests through the scheduler loop, all at once or\n"
            "as Poisson arrivals, the FP16 paged baseline and mixkv each with the same KV memory.\n"
            "\n"
            "  --model PATH        a Hugging Face folder or GGUF file (either backend)\n"
            "  --dummy-weights S   stand-in weights at a shape on the GPU: llama-3-8b,\n"
            "                      llama-3-70b, or a config.json (implies --backend cuda)\n"
            "  --requests N        requests, all arriving at once [64]\n"
            "  --prompt-len A[:B]  prompt tokens, fixed or uniform in [A, B] [1024:2048]\n"
            "  --output-len A[:B]  output tokens per request (run to the end, greedy) [256:512]\n"
            "  --lengths FILE      (prompt, output) length pairs, one per line ('#' comments), in\n"
            "                      order, instead of the two ranges; --requests defaults to the lines\n"
            "  --kv-mib X          KV memory of each engine, MiB of pages [4096]\n"
            "  --max-batch N       most requests running at once (the caches' slots) [256]\n"
            "  --engines E         fp16, mixkv or fp16,mixkv [fp16,mixkv]\n"
            "  --seed N            lengths, prompt tokens and arrival times [1]\n"
            "  --rate R[,R...]     Poisson arrivals at R requests/s (0: all at once) [0]\n"
            "  --plot FILE.svg     output tokens/s and p50 latency against the rates\n"
            "  --phases            where the device time goes (CUDA: events at phase boundaries,\n"
            "                      a few percent of their own)\n"
            "  --graphs H          decode steps through CUDA graphs, captured again after H\n"
            "                      launches or when the batch changes; 0: launched one by one\n"
            "                      (CUDA on one GPU; steps carrying --phases' events stay\n"
            "                      eager) [64 on one GPU, else 0]\n"
            "  --tp N              tensor parallelism over GPUs 0..N-1 (CUDA; NCCL): the heads and\n"
            "                      FFN columns split N ways, one cache per GPU with --kv-mib / N [1]\n"
            MKV_POLICY_OPTS_HELP
            MKV_RUN_OPTS_HELP
            "  --threads N         forward-pass threads (CPU) [one per core]\n"
            "  --json FILE         results as JSON (schema mixkv-serve-bench; - for stdout)\n"
            "  --quiet             no progress lines\n"
            "  -h, --help          this help\n"
            "\n"
            "exit status: 0 success, 1 a run failed, 2 bad usage or input.\n");
}

static int parse_range(const char *what, const char *v, range_t *r)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    char *colon = strchr(buf, ':');
    if (colon) *colon = '\0';
    if (mkv_cli_parse_i32(CMD, what, buf, 1, 1 << 20, &r->lo) < 0) return -1;
    r->hi = r->lo;
    if (colon && mkv_cli_parse_i32(CMD, what, colon + 1, r->lo, 1 << 20, &r->hi) < 0) return -1;
    return 0;
}

static int parse(int argc, char **argv, sb_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        int m;
        if (mkv_cli_is_help(argv[i])) {
            mkv_serve_bench_usage(stdout);
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
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--dummy-weights", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->dummy = v;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--lengths", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->lengths_path = v;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--plot", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->plot_path = v;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--rate", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            char buf[512];
            snprintf(buf, sizeof buf, "%s", v);
            o->n_rates = 0;
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
                if (o->n_rates == MAX_RATES) {
                    mkv_cli_error(CMD, "--rate: at most %d rates", MAX_RATES);
                    return -1;
                }
                if (mkv_cli_parse_double(CMD, "--rate", t, 0.0, 1e6, &o->rates[o->n_rates++]) < 0) return -1;
            }
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--json", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->json_path = v;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--requests", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--requests", v, 1, 1 << 20, &o->requests) < 0) return -1;
            o->requests_given = 1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--max-batch", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--max-batch", v, 1, 4096, &o->max_batch) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--graphs", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--graphs", v, 0, 1 << 20, &o->graphs) < 0) return -1;
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
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--prompt-len", 1, 0, &v)) != 0) {
            if (m < 0 || parse_range("--prompt-len", v, &o->prompt) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--output-len", 1, 0, &v)) != 0) {
            if (m < 0 || parse_range("--output-len", v, &o->output) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--kv-mib", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_double(CMD, "--kv-mib", v, 0.001, 1 << 24, &o->kv_mib) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--seed", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i64(CMD, "--seed", v, 0, INT64_MAX, &o->seed) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--engines", 1, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->run_fp16 = !strcmp(v, "fp16") || !strcmp(v, "fp16,mixkv") || !strcmp(v, "mixkv,fp16");
            o->run_mixkv = !strcmp(v, "mixkv") || !strcmp(v, "fp16,mixkv") || !strcmp(v, "mixkv,fp16");
            if (!o->run_fp16 && !o->run_mixkv) {
                mkv_cli_error(CMD, "--engines: '%s' is not fp16, mixkv or fp16,mixkv", v);
                return -1;
            }
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--phases", 0, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->phases = 1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--quiet", 0, 0, &v)) != 0) {
            if (m < 0) return -1;
            o->quiet = 1;
            continue;
        }
        mkv_cli_error(CMD, "unknown argument '%s' (see 'mixkv %s --help')", argv[i], CMD);
        return -1;
    }
    if (!o->model == !o->dummy) {
        mkv_cli_error(CMD, "give exactly one of --model and --dummy-weights");
        return -1;
    }
    if (o->dummy) o->run.backend = MKV_BACKEND_CUDA;
    if (o->tp > 1 && o->run.backend != MKV_BACKEND_CUDA) {
        mkv_cli_error(CMD, "--tp %d: tensor parallelism runs on the CUDA backend (--backend cuda)", o->tp);
        return -1;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t draw(uint64_t *s, range_t r)
{
    return r.lo + (int32_t)(next_rand(s) % (uint64_t)(r.hi - r.lo + 1));
}

typedef struct engine_result {
    const char *name;
    double seconds;
    int64_t steps, output_tokens, preemptions, batch_sum, kv_bytes_sum, peak_kv_bytes;
    int32_t peak_batch, finished, failed;
    int64_t pages, page_bytes;
    double frac_hi, frac_lo, frac_pruned; /* of the token-heads seen by the steps, mean */
    double rate;                          /* requests/s arriving; 0: all at once */
    double ttft[2], tpot[2], latency[2];  /* p50, p99, seconds */
    int has_phases;                       /* --phases on the CUDA pass */
    int64_t graph_captures, graph_launches; /* --graphs */
    double phase_ms[MKV_CUDA_PHASES];     /* summed over the run (rank 0's with --tp) */
    /* --tp: each GPU's figures */
    int32_t tp;
    double rank_phase_ms[MKV_TP_MAX_RANKS][MKV_CUDA_PHASES];
    int64_t rank_pages[MKV_TP_MAX_RANKS], rank_kv_bytes_sum[MKV_TP_MAX_RANKS], rank_peak_kv_bytes[MKV_TP_MAX_RANKS];
} engine_result_t;

/* Per request: when it arrived, its first token, its last (seconds from the run's start). */
typedef struct req_times {
    double arrival, first, last;
    int32_t n;
} req_times_t;

typedef struct token_ctx {
    req_times_t *t;
    double t0;
} token_ctx_t;

static double now_s(void);

static void on_token(void *ctx, const mkv_request_t *req, int32_t token)
{
    (void)token;
    token_ctx_t *c = ctx;
    req_times_t *r = &c->t[req->id];
    const double t = now_s() - c->t0;
    if (r->n++ == 0) r->first = t;
    r->last = t;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-th percentile (nearest rank) of v[n], sorted in place. */
static double percentile(double *v, int32_t n, double p)
{
    if (n == 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int32_t k = (int32_t)(p / 100.0 * n + 0.999999) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* One engine over every request. */
static int run_engine(const sb_opts_t *o, const mkv_model_config_t *mc, const mkv_forward_t *fwd,
                      mkv_cuda_forward_t *cuda, mkv_tp_t *tp, int fp16,
                      int32_t max_len, const int32_t *plen, const int32_t *olen, const int32_t *tokens,
                      const double *arrival, double rate, engine_result_t *r)
{
    if (o->graphs > 0 && cuda && !tp && mkv_cuda_forward_set_graphs(cuda, 1, o->graphs) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "--graphs: %s", mkv_last_error());
        return -1;
    }
    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cfg;
    mkv_policy_apply(&o->policy, &base);
    if (fp16) { /* the baseline: nothing compressed */
        base.hi_format = base.lo_format = MKV_FORMAT_K16V16;
        base.alpha_h = base.alpha_l = base.mix_high = base.mix_low = 0.0f;
    }
    base.max_seqs = o->max_batch;
    base.max_seq_len = max_len;
    base.backend = o->run.backend;
    if (o->run.backend == MKV_BACKEND_CUDA) base.flags = MKV_CACHE_ASYNC_STEPS;
    /* The baseline computes no scores, as a plain paged engine does not. */
    if (fp16) base.flags |= MKV_CACHE_NO_SCORES;
    mkv_model_config_cache(mc, &base, &cfg);
    /* Each engine its own page: the baseline's holds 16 fp16 tokens (a paged engine's usual
     * page), mixkv's the library's default, 32 high tokens (which holds a whole number of
     * 16-token runs of both formats, decision 111, where 16 fp16 tokens' bytes would hold 35
     * K8V4 and 54 K4V2 tokens before it and 32 and 48 after). */
    if ((fp16 ? mkv_page_bytes_for(MKV_FORMAT_K16V16, cfg.head_dim, 0, 0, 16, &cfg.page_bytes)
              : mkv_page_bytes_for(cfg.hi_format, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group, 32,
                                   &cfg.page_bytes)) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        return -1;
    }
    const int32_t n_ranks = tp ? mkv_tp_ranks(tp) : 1;
    /* --tp: each GPU's cache holds its share of the KV heads in its share of the memory */
    cfg.n_kv_heads /= n_ranks;
    cfg.pool_pages = (int64_t)(o->kv_mib / n_ranks * 1048576.0 / (double)cfg.page_bytes);
    mkv_cache_t *caches[MKV_TP_MAX_RANKS] = {NULL};
    mkv_forward_t tp_fwd;
    mkv_scheduler_t *s = NULL;
    mkv_request_t *reqs = calloc((size_t)o->requests, sizeof *reqs);
    req_times_t *times = calloc((size_t)o->requests, sizeof *times);
    double *buf = malloc((size_t)o->requests * sizeof *buf);
    int rc = -1;
    if (!reqs || !times || !buf) {
        mkv_cli_error(CMD, "out of memory");
        return -1;
    }
    for (int32_t g = 0; g < n_ranks; g++) {
        cfg.device_id = tp ? g : 0;
        if (mkv_cache_create(&cfg, &caches[g]) != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "cannot create the %s cache%s: %s", fp16 ? "fp16" : "mixkv", tp ? " of a GPU" : "",
                          mkv_last_error());
            goto done;
        }
    }
    if (tp && mkv_tp_forward(tp, caches, &tp_fwd) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        goto done;
    }
    if (mkv_scheduler_create_multi(tp ? &tp_fwd : fwd, caches, n_ranks, -1, o->max_batch, &s) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", mkv_last_error());
        goto done;
    }
    int64_t offset = 0;
    for (int32_t i = 0; i < o->requests; i++) {
        mkv_request_t *q = &reqs[i];
        q->id = i;
        q->prompt = tokens + offset;
        q->prompt_len = plen[i];
        q->max_new_tokens = olen[i];
        offset += plen[i];
        times[i].arrival = arrival[i];
    }
    token_ctx_t tc = {times, 0.0};
    mkv_scheduler_on_token(s, on_token, &tc);
    memset(r, 0, sizeof *r);
    r->rate = rate;
    r->name = fp16 ? "fp16" : "mixkv";
    r->pages = cfg.pool_pages * n_ranks;
    r->page_bytes = cfg.page_bytes;
    r->tp = tp ? n_ranks : 0;
    double hi = 0, lo = 0, pruned = 0, last_progress = 0;
    if (o->phases && cuda) {
        double drop[MKV_CUDA_PHASES];
        for (int32_t g = 0; g < n_ranks; g++) {
            mkv_cuda_forward_t *pass = tp ? mkv_tp_rank(tp, g) : cuda;
            mkv_cuda_forward_phases(pass, drop, 1);
            mkv_cuda_forward_set_timing(pass, 1);
        }
    }
    const double t0 = now_s();
    tc.t0 = t0;
    int32_t added = 0;
    while (added < o->requests || !mkv_scheduler_idle(s)) {
        /* arrivals up to now; when nothing runs, wait for the next one */
        double t = now_s() - t0;
        if (added < o->requests && mkv_scheduler_idle(s) && arrival[added] > t) {
            const double wait = arrival[added] - t;
            struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
            nanosleep(&ts, NULL);
            t = now_s() - t0;
        }
        while (added < o->requests && arrival[added] <= t) {
            if (mkv_scheduler_add(s, &reqs[added]) != MKV_STATUS_OK) {
                mkv_cli_error(CMD, "request %d: %s", added, mkv_last_error());
                goto done;
            }
            added++;
        }
        if (mkv_scheduler_idle(s)) continue;
        mkv_sched_stats_t st;
        const mkv_status_t ss = mkv_scheduler_step(s, &st);
        if (ss != MKV_STATUS_OK && ss != MKV_STATUS_OUT_OF_PAGES) {
            mkv_cli_error(CMD, "%s engine, step %lld: %s", r->name, (long long)r->steps, mkv_last_error());
            goto done;
        }
        r->steps++;
        r->output_tokens += st.decoded + st.admitted; /* each admission emits its first token */
        r->preemptions += st.preempted;
        r->batch_sum += st.running;
        if (st.running > r->peak_batch) r->peak_batch = st.running;
        const int64_t used = (r->pages - st.free_pages) * cfg.page_bytes;
        for (int32_t g = 0; tp && g < n_ranks; g++) { /* each GPU's pages in use */
            mkv_cache_stats_t cs;
            if (mkv_cache_stats(caches[g], &cs) != MKV_STATUS_OK) {
                mkv_cli_error(CMD, "GPU %d: %s", g, mkv_cache_last_error(caches[g]));
                goto done;
            }
            const int64_t u = (cs.total_pages - cs.free_pages) * cfg.page_bytes;
            r->rank_pages[g] = cs.total_pages;
            r->rank_kv_bytes_sum[g] += u;
            if (u > r->rank_peak_kv_bytes[g]) r->rank_peak_kv_bytes[g] = u;
        }
        r->kv_bytes_sum += used;
        if (used > r->peak_kv_bytes) r->peak_kv_bytes = used;
        hi += (double)st.tokens_hi, lo += (double)st.tokens_lo, pruned += (double)st.tokens_pruned;
        r->finished = st.finished;
        t = now_s() - t0;
        if (!o->quiet && t - last_progress > 2.0) {
            fprintf(stderr, "%s: %s at %g/s: step %lld, %d running, %d waiting, %d finished, %.0f s\n", CMD,
                    r->name, rate, (long long)r->steps, st.running, st.waiting, st.finished, t);
            last_progress = t;
        }
    }
    r->seconds = now_s() - t0;
    if (o->graphs > 0 && cuda && !tp) {
        int64_t updates;
        mkv_cuda_forward_graph_stats(cuda, &r->graph_captures, &updates, &r->graph_launches);
        mkv_cuda_forward_set_graphs(cuda, 0, 0);
    }
    if (o->phases && cuda) {
        for (int32_t g = 0; g < n_ranks; g++) {
            mkv_cuda_forward_t *pass = tp ? mkv_tp_rank(tp, g) : cuda;
            mkv_cuda_forward_phases(pass, r->rank_phase_ms[g], 1);
            mkv_cuda_forward_set_timing(pass, 0);
        }
        memcpy(r->phase_ms, r->rank_phase_ms[0], sizeof r->phase_ms);
        r->has_phases = 1;
    }
    /* latencies: first token after arrival; per output token after the first; the whole request */
    int32_t k = 0;
    for (int32_t i = 0; i < o->requests; i++)
        if (times[i].n > 0) buf[k++] = times[i].first - times[i].arrival;
    r->ttft[0] = percentile(buf, k, 50), r->ttft[1] = percentile(buf, k, 99);
    k = 0;
    for (int32_t i = 0; i < o->requests; i++)
        if (times[i].n > 1) buf[k++] = (times[i].last - times[i].first) / (times[i].n - 1);
    r->tpot[0] = percentile(buf, k, 50), r->tpot[1] = percentile(buf, k, 99);
    k = 0;
    for (int32_t i = 0; i < o->requests; i++)
        if (times[i].n > 0) buf[k++] = times[i].last - times[i].arrival;
    r->latency[0] = percentile(buf, k, 50), r->latency[1] = percentile(buf, k, 99);
    for (int32_t i = 0; i < o->requests; i++) r->failed += reqs[i].state == MKV_REQ_FAILED;
    const double seen = hi + lo + pruned;
    r->frac_hi = seen > 0 ? hi / seen : 0, r->frac_lo = seen > 0 ? lo / seen : 0;
    r->frac_pruned = seen > 0 ? pruned / seen : 0;
    rc = 0;
done:
    for (int32_t i = 0; i < o->requests; i++) free(reqs[i].out);
    free(reqs);
    free(times);
    free(buf);
    mkv_scheduler_free(s);
    for (int32_t g = 0; g < n_ranks; g++) mkv_cache_destroy(caches[g]);
    return rc;
}

static void print_result(FILE *f, const engine_result_t *r, int32_t requests)
{
    fprintf(f, "%-6s %9.2f %10.3f %12.1f %7lld %6d %8.1f %7lld %10.1f %10.1f %6.1f%% %6.1f%% %6.1f%%\n", r->name,
            r->seconds, requests / r->seconds, r->output_tokens / r->seconds, (long long)r->steps, r->peak_batch,
            r->steps ? (double)r->batch_sum / r->steps : 0.0, (long long)r->preemptions,
            r->steps ? (double)r->kv_bytes_sum / r->steps / 1048576.0 : 0.0, r->peak_kv_bytes / 1048576.0,
            100 * r->frac_hi, 100 * r->frac_lo, 100 * r->frac_pruned);
}

static void print_phases(FILE *f, const engine_result_t *r)
{
    if (!r->has_phases) return;
    double dev = 0;
    for (int i = 0; i < MKV_CUDA_PHASES; i++) dev += r->phase_ms[i] * 1e-3;
    fprintf(f, "%-6s  time: GEMMs %.2f s, attention %.2f s, cache steps %.2f s, norms/RoPE/SiLU %.2f s, head %.2f s, "
               "%shost and gaps %.2f s\n",
            r->name, r->phase_ms[MKV_CUDA_PHASE_GEMM] * 1e-3, r->phase_ms[MKV_CUDA_PHASE_ATTENTION] * 1e-3,
            r->phase_ms[MKV_CUDA_PHASE_CACHE] * 1e-3, r->phase_ms[MKV_CUDA_PHASE_OTHER] * 1e-3,
            r->phase_ms[MKV_CUDA_PHASE_HEAD] * 1e-3, r->tp ? "all-reduce (below), " : "", r->seconds - dev);
    if (r->tp) fprintf(f, "%-6s  all-reduce %.2f s on GPU 0 (%.1f%% of the run)\n", r->name,
                       r->phase_ms[MKV_CUDA_PHASE_ALL_REDUCE] * 1e-3,
                       100.0 * r->phase_ms[MKV_CUDA_PHASE_ALL_REDUCE] * 1e-3 / r->seconds);
}

/* --tp: each GPU's KV memory and where its device time goes. */
static void print_ranks(FILE *f, const engine_result_t *r)
{
    for (int32_t g = 0; g < r->tp; g++) {
        const double *ph = r->rank_phase_ms[g];
        fprintf(f, "%-6s  GPU %d: %lld pages, KV MiB avg %.1f max %.1f", r->name, g, (long long)r->rank_pages[g],
                r->steps ? (double)r->rank_kv_bytes_sum[g] / r->steps / 1048576.0 : 0.0,
                r->rank_peak_kv_bytes[g] / 1048576.0);
        if (r->has_phases)
            fprintf(f, "; GEMMs %.2f s, attention %.2f s, cache %.2f s, all-reduce %.2f s",
                    ph[MKV_CUDA_PHASE_GEMM] * 1e-3, ph[MKV_CUDA_PHASE_ATTENTION] * 1e-3,
                    ph[MKV_CUDA_PHASE_CACHE] * 1e-3, ph[MKV_CUDA_PHASE_ALL_REDUCE] * 1e-3);
        fputc('\n', f);
    }
}

static const char *const phase_names[MKV_CUDA_PHASES] = {"gemm", "attention", "cache", "other", "head", "all_reduce"};

static void print_latency(FILE *f, const engine_result_t *r)
{
    fprintf(f, "%-6s  TTFT p50 %8.3f s  p99 %8.3f s   TPOT p50 %8.2f ms  p99 %8.2f ms   latency p50 %8.2f s  p99 %8.2f s\n",
            r->name, r->ttft[0], r->ttft[1], 1e3 * r->tpot[0], 1e3 * r->tpot[1], r->latency[0], r->latency[1]);
}

static cJSON *result_json(const engine_result_t *r, int32_t requests)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "engine", r->name);
    cJSON_AddNumberToObject(e, "seconds", r->seconds);
    cJSON_AddNumberToObject(e, "requests_per_second", requests / r->seconds);
    cJSON_AddNumberToObject(e, "output_tokens_per_second", r->output_tokens / r->seconds);
    mkv_cli_json_add_i64(e, "output_tokens", r->output_tokens);
    mkv_cli_json_add_i64(e, "steps", r->steps);
    cJSON_AddNumberToObject(e, "peak_batch", r->peak_batch);
    cJSON_AddNumberToObject(e, "mean_batch", r->steps ? (double)r->batch_sum / r->steps : 0.0);
    mkv_cli_json_add_i64(e, "preemptions", r->preemptions);
    cJSON_AddNumberToObject(e, "finished", r->finished);
    cJSON_AddNumberToObject(e, "failed", r->failed);
    mkv_cli_json_add_i64(e, "kv_pages", r->pages);
    mkv_cli_json_add_i64(e, "page_bytes", r->page_bytes);
    cJSON_AddNumberToObject(e, "kv_bytes_mean", r->steps ? (double)r->kv_bytes_sum / r->steps : 0.0);
    mkv_cli_json_add_i64(e, "kv_bytes_peak", r->peak_kv_bytes);
    cJSON_AddNumberToObject(e, "fraction_high", r->frac_hi);
    cJSON_AddNumberToObject(e, "fraction_low", r->frac_lo);
    cJSON_AddNumberToObject(e, "fraction_pruned", r->frac_pruned);
    if (r->graph_launches > 0 || r->graph_captures > 0) {
        mkv_cli_json_add_i64(e, "graph_captures", r->graph_captures);
        mkv_cli_json_add_i64(e, "graph_launches", r->graph_launches);
    }
    if (r->has_phases) {
        cJSON *p = cJSON_AddObjectToObject(e, "phases_s");
        double dev = 0;
        for (int i = 0; i < MKV_CUDA_PHASES; i++) {
            cJSON_AddNumberToObject(p, phase_names[i], r->phase_ms[i] * 1e-3);
            dev += r->phase_ms[i] * 1e-3;
        }
        cJSON_AddNumberToObject(p, "host_and_gaps", r->seconds - dev);
    }
    if (r->tp) {
        cJSON_AddNumberToObject(e, "tp", r->tp);
        cJSON *gpus = cJSON_AddArrayToObject(e, "gpus");
        for (int32_t g = 0; g < r->tp; g++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "gpu", g);
            mkv_cli_json_add_i64(x, "kv_pages", r->rank_pages[g]);
            cJSON_AddNumberToObject(x, "kv_bytes_mean", r->steps ? (double)r->rank_kv_bytes_sum[g] / r->steps : 0.0);
            mkv_cli_json_add_i64(x, "kv_bytes_peak", r->rank_peak_kv_bytes[g]);
            if (r->has_phases) {
                cJSON *p = cJSON_AddObjectToObject(x, "phases_s");
                for (int i = 0; i < MKV_CUDA_PHASES; i++)
                    cJSON_AddNumberToObject(p, phase_names[i], r->rank_phase_ms[g][i] * 1e-3);
            }
            cJSON_AddItemToArray(gpus, x);
        }
    }
    const char *names[3] = {"ttft_s", "tpot_s", "latency_s"};
    const double *vals[3] = {r->ttft, r->tpot, r->latency};
    for (int i = 0; i < 3; i++) {
        cJSON *q = cJSON_AddObjectToObject(e, names[i]);
        cJSON_AddNumberToObject(q, "p50", vals[i][0]);
        cJSON_AddNumberToObject(q, "p99", vals[i][1]);
    }
    return e;
}

/* An SVG of output tokens/s and p50 request latency against the arrival rate, a line per
 * engine (x: the rates in the order given, evenly spaced; an offline run shows as 0/s). */
static int write_plot(const char *path, const engine_result_t (*res)[2], int n_rates, int n_eng)
{
    mkv_svg_t svg;
    if (mkv_svg_open(&svg, CMD, path, 900, 360) < 0) return -1;
    const int left[2] = {70, 520};
    const char *colors[2] = {"#1f77b4", "#d62728"};
    double xs[MAX_RATES], ys[MAX_RATES];
    for (int panel = 0; panel < 2; panel++) {
        double ymax = 0;
        for (int r = 0; r < n_rates; r++)
            for (int e = 0; e < n_eng; e++) {
                const engine_result_t *x = &res[r][e];
                const double y = panel == 0 ? x->output_tokens / x->seconds : x->latency[0];
                if (y > ymax) ymax = y;
            }
        if (ymax <= 0) ymax = 1;
        /* One rate sits in the middle of the panel. */
        mkv_svg_panel(&svg, left[panel], 50, 360, 250, n_rates > 1 ? 0 : -1, n_rates > 1 ? n_rates - 1 : 1,
                      0, ymax, panel == 0 ? "output tokens/s" : "p50 request latency (s)");
        mkv_svg_yticks(&svg, 4);
        for (int r = 0; r < n_rates; r++) {
            char label[32];
            snprintf(label, sizeof label, "%g/s", res[r][0].rate);
            mkv_svg_xtick(&svg, r, label);
        }
        for (int e = 0; e < n_eng; e++) {
            int n = 0;
            for (int r = 0; r < n_rates && n < MAX_RATES; r++, n++) {
                const engine_result_t *x = &res[r][e];
                xs[n] = r;
                ys[n] = panel == 0 ? x->output_tokens / x->seconds : x->latency[0];
            }
            mkv_svg_polyline(&svg, xs, ys, n, colors[e], 2, 0);
        }
    }
    for (int e = 0; e < n_eng; e++) mkv_svg_text(&svg, left[0] + 90 * e, 348, "start", colors[e], 12, res[0][e].name);
    return mkv_svg_close(&svg, CMD);
}

/* The (prompt, output) pairs of a --lengths file into *pairs (2 per line); their count, or -1
 * with a message naming the line. */
static int32_t read_lengths(const char *path, int32_t **pairs)
{
    size_t len;
    char *text = mkv_cli_read_file(CMD, path, &len);
    if (!text) return -1;
    int32_t n = 0, cap = 0, line = 0;
    int32_t *p = NULL;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        line++;
        while (*l == ' ' || *l == '\t' || *l == '\r') l++;
        if (*l == '\0' || *l == '#') continue;
        long a, b;
        char extra;
        if (sscanf(l, "%ld %ld %c", &a, &b, &extra) != 2 || a < 1 || b < 1 || a > (1 << 20) || b > (1 << 20)) {
            mkv_cli_error(CMD, "--lengths %s: line %d: expected two lengths >= 1 (prompt output)", path, line);
            free(text), free(p);
            return -1;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            int32_t *q = realloc(p, (size_t)cap * 2 * sizeof *q);
            if (!q) {
                mkv_cli_error(CMD, "out of memory");
                free(text), free(p);
                return -1;
            }
            p = q;
        }
        p[2 * n] = (int32_t)a, p[2 * n + 1] = (int32_t)b;
        n++;
    }
    free(text);
    if (n == 0) {
        mkv_cli_error(CMD, "--lengths %s: no length pairs", path);
        free(p);
        return -1;
    }
    *pairs = p;
    return n;
}

int mkv_serve_bench_main(int argc, char **argv)
{
    sb_opts_t o;
    memset(&o, 0, sizeof o);
    o.requests = 64, o.max_batch = 256, o.kv_mib = 4096.0, o.seed = 1, o.tp = 1, o.graphs = -1;
    o.prompt = (range_t){1024, 2048}, o.output = (range_t){256, 512};
    o.run_fp16 = o.run_mixkv = 1;
    o.n_rates = 1; /* offline */
    mkv_policy_opts_default(&o.policy);
    mkv_run_opts_default(&o.run);
    o.run.dtype = MKV_DTYPE_F16;
    const int pr = parse(argc, argv, &o);
    if (pr != 0) return pr > 0 ? MKV_EXIT_OK : MKV_EXIT_USAGE;
    if (o.json_path && mkv_cli_check_writable(CMD, "--json", o.json_path) < 0) return MKV_EXIT_USAGE;
    if (o.plot_path && mkv_cli_check_writable(CMD, "--plot", o.plot_path) < 0) return MKV_EXIT_USAGE;
    int32_t *pairs = NULL, n_pairs = 0;
    if (o.lengths_path) { /* the ranges become the file's extremes */
        if ((n_pairs = read_lengths(o.lengths_path, &pairs)) < 0) return MKV_EXIT_USAGE;
        if (!o.requests_given) o.requests = n_pairs;
        o.prompt = (range_t){INT32_MAX, 0}, o.output = (range_t){INT32_MAX, 0};
        for (int32_t i = 0; i < n_pairs; i++) {
            if (pairs[2 * i] < o.prompt.lo) o.prompt.lo = pairs[2 * i];
            if (pairs[2 * i] > o.prompt.hi) o.prompt.hi = pairs[2 * i];
            if (pairs[2 * i + 1] < o.output.lo) o.output.lo = pairs[2 * i + 1];
            if (pairs[2 * i + 1] > o.output.hi) o.output.hi = pairs[2 * i + 1];
        }
    }

    char err[MKV_ERR_LEN];
    int rc = MKV_EXIT_FAIL;
    mkv_model_t *model = NULL;
    mkv_tools_forward_t fw;
    memset(&fw, 0, sizeof fw);
    mkv_tp_t *tp = NULL;
    mkv_model_config_t mc;
    int32_t *plen = NULL, *olen = NULL, *tokens = NULL;
    double *arrival = NULL;
    engine_result_t(*res)[2] = NULL;
    const int32_t max_len = o.prompt.hi + o.output.hi;
    const int32_t max_tokens = max_len > o.max_batch ? max_len : o.max_batch;
    if (o.model) {
        if (mkv_model_load(o.model, &model, err) != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "%s", err);
            rc = MKV_EXIT_USAGE;
            goto done;
        }
        mc = model->cfg;
        if (o.tp > 1) {
            if (mkv_tp_create(model, NULL, 0, o.tp, max_tokens, o.run.dtype, &tp, err) != MKV_STATUS_OK) {
                mkv_cli_error(CMD, "--tp %d: %s", o.tp, err);
                goto done;
            }
            fw.cuda = mkv_tp_rank(tp, 0);
        } else if (mkv_tools_forward_create(CMD, model, &o.run, max_tokens, o.threads, &fw) < 0) {
            goto done;
        }
    } else {
        const mkv_status_t cs = strchr(o.dummy, '/') || strstr(o.dummy, ".json")
                                    ? mkv_model_config_load(o.dummy, &mc, err)
                                    : mkv_model_config_builtin(o.dummy, &mc, err);
        if (cs != MKV_STATUS_OK) {
            mkv_cli_error(CMD, "--dummy-weights: %s", err);
            rc = MKV_EXIT_USAGE;
            goto done;
        }
        if (max_len > mc.max_pos) mc.max_pos = max_len; /* stand-ins: any length will do */
        if (o.tp > 1) {
            if (mkv_tp_create(NULL, &mc, (uint64_t)o.seed, o.tp, max_tokens, o.run.dtype, &tp, err) != MKV_STATUS_OK) {
                mkv_cli_error(CMD, "--tp %d: %s", o.tp, err);
                goto done;
            }
            fw.cuda = mkv_tp_rank(tp, 0);
        } else {
            if (mkv_cuda_forward_create_dummy(&mc, (uint64_t)o.seed, max_tokens, o.run.dtype, &fw.cuda, err) !=
                MKV_STATUS_OK) {
                mkv_cli_error(CMD, "--dummy-weights: %s", err);
                goto done;
            }
            fw.fwd = mkv_cuda_forward(fw.cuda);
        }
    }
    if (max_len > mc.max_pos) {
        mkv_cli_error(CMD, "prompt %d + output %d exceeds the model's %d positions", o.prompt.hi, o.output.hi,
                      mc.max_pos);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (o.phases && !fw.cuda) fprintf(stderr, "%s: --phases: only the CUDA pass has a breakdown\n", CMD);
    if (o.graphs > 0 && (!fw.cuda || tp)) {
        mkv_cli_error(CMD, "--graphs: only the CUDA pass on one GPU has graphs");
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (o.graphs < 0) o.graphs = fw.cuda && !tp && !o.phases ? 64 : 0; /* the default */
    if (o.graphs > 0 && o.phases)
        fprintf(stderr, "%s: --graphs with --phases: steps carrying the phases' events run without graphs\n", CMD);
    {
        int64_t page_bytes = 0;
        if (mkv_page_bytes_for(MKV_FORMAT_K16V16, mc.head_dim, 0, 0, 16, &page_bytes) != MKV_STATUS_OK ||
            o.kv_mib * 1048576.0 < (double)page_bytes * mc.n_layers * mc.n_kv_heads) {
            mkv_cli_error(CMD, "--kv-mib %g holds less than one page per head-region (%d x %lld bytes)", o.kv_mib,
                          mc.n_layers * mc.n_kv_heads, (long long)page_bytes);
            rc = MKV_EXIT_USAGE;
            goto done;
        }
    }
    /* the workload, the same for both engines */
    plen = malloc((size_t)o.requests * sizeof *plen);
    olen = malloc((size_t)o.requests * sizeof *olen);
    uint64_t rng = (uint64_t)o.seed;
    int64_t total_prompt = 0;
    if (!plen || !olen) goto oom;
    for (int32_t i = 0; i < o.requests; i++) {
        if (n_pairs) { /* the file's pairs in order, again from the top when requests outnumber them */
            plen[i] = pairs[2 * (i % n_pairs)];
            olen[i] = pairs[2 * (i % n_pairs) + 1];
        } else {
            plen[i] = draw(&rng, o.prompt);
            olen[i] = draw(&rng, o.output);
        }
        total_prompt += plen[i];
    }
    if (!(tokens = malloc((size_t)total_prompt * sizeof *tokens))) goto oom;
    for (int64_t t = 0; t < total_prompt; t++) tokens[t] = 3 + (int32_t)(next_rand(&rng) % (uint64_t)(mc.vocab - 3));
    /* Poisson arrivals: exponential gaps of mean 1/rate from one seeded stream, scaled per rate */
    if (!(arrival = malloc((size_t)o.requests * sizeof *arrival))) goto oom;
    if (!(res = calloc((size_t)o.n_rates, sizeof *res))) goto oom;
    const int n_eng = o.run_fp16 + o.run_mixkv;
    FILE *out = o.json_path && !strcmp(o.json_path, "-") ? stderr : stdout;
    fprintf(out,
            "serve-bench: %s%s on %s (%s), %d requests, prompts %d..%d, outputs %d..%d tokens, "
            "%.3g MiB of KV each%s, at most %d running\n",
            o.model ? o.model : o.dummy, o.model ? "" : " (stand-in weights)", mkv_backend_name(o.run.backend),
            o.run.backend == MKV_BACKEND_CUDA ? mkv_dtype_name(o.run.dtype) : "f32", o.requests, o.prompt.lo,
            o.prompt.hi, o.output.lo, o.output.hi, o.kv_mib, tp ? " over the GPUs" : "", o.max_batch);
    if (tp) fprintf(out, "tensor parallelism: %d GPUs, %d of %d KV heads and %.3g MiB of KV each\n", o.tp,
                    mc.n_kv_heads / o.tp, mc.n_kv_heads, o.kv_mib / o.tp);
    if (o.run_fp16) fprintf(out, "fp16: K16V16, nothing compressed, no scores (the FP16 paged baseline)\n");
    if (o.run_mixkv) {
        char pol[256];
        mkv_policy_opts_describe(&o.policy, pol, sizeof pol);
        fprintf(out, "mixkv: %s\n", pol);
    }
    for (int ri = 0; ri < o.n_rates; ri++) {
        const double rate = o.rates[ri];
        uint64_t arng = (uint64_t)o.seed ^ 0xa5a5a5a5ull;
        double t = 0.0;
        for (int32_t i = 0; i < o.requests; i++) {
            if (rate > 0) {
                const double u = ((double)(next_rand(&arng) >> 11) + 0.5) * 0x1p-53; /* (0, 1) */
                t += -log(u) / rate;
            }
            arrival[i] = t;
        }
        int n_res = 0;
        for (int k = 0; k < 2; k++) {
            if (k == 0 ? !o.run_fp16 : !o.run_mixkv) continue;
            if (run_engine(&o, &mc, &fw.fwd, fw.cuda, tp, k == 0, max_len, plen, olen, tokens, arrival, rate,
                           &res[ri][n_res]) < 0)
                goto done;
            n_res++;
        }
        if (rate > 0) fprintf(out, "arrivals: Poisson at %g requests/s\n", rate);
        else fprintf(out, "arrivals: all at once\n");
        fprintf(out, "%-6s %9s %10s %12s %7s %6s %8s %7s %10s %10s %7s %7s %7s\n", "engine", "seconds",
                "requests/s", "out tok/s", "steps", "peak", "mean", "preempt", "KV MiB avg", "KV MiB max", "high",
                "low", "pruned");
        for (int i = 0; i < n_res; i++) print_result(out, &res[ri][i], o.requests);
        for (int i = 0; i < n_res; i++) print_latency(out, &res[ri][i]);
        for (int i = 0; i < n_res; i++) print_phases(out, &res[ri][i]);
        for (int i = 0; i < n_res; i++) print_ranks(out, &res[ri][i]);
        if (n_res == 2) {
            const engine_result_t *a = &res[ri][0], *b = &res[ri][1];
            fprintf(out, "mixkv / fp16: %.2fx requests/s, %.2fx output tokens/s, %.2fx mean batch\n",
                    a->seconds / b->seconds, (b->output_tokens / b->seconds) / (a->output_tokens / a->seconds),
                    ((double)b->batch_sum / b->steps) / ((double)a->batch_sum / a->steps));
        }
    }
    if (o.plot_path && write_plot(o.plot_path, (const engine_result_t(*)[2])res, o.n_rates, n_eng) < 0) goto done;
    if (o.json_path) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "schema", "mixkv-serve-bench");
        cJSON_AddNumberToObject(root, "schema_version", 1);
        cJSON_AddStringToObject(root, "model", o.model ? o.model : o.dummy);
        cJSON_AddStringToObject(root, "weights", o.model ? "loaded" : "stand-ins");
        cJSON_AddStringToObject(root, "backend", mkv_backend_name(o.run.backend));
        if (o.run.backend == MKV_BACKEND_CUDA) {
            char dev[256];
            mkv_cuda_device_name(dev, (int)sizeof dev);
            cJSON_AddStringToObject(root, "device", dev);
        }
        cJSON_AddStringToObject(root, "dtype", o.run.backend == MKV_BACKEND_CUDA ? mkv_dtype_name(o.run.dtype) : "f32");
        cJSON_AddNumberToObject(root, "requests", o.requests);
        if (o.lengths_path) cJSON_AddStringToObject(root, "lengths_file", o.lengths_path);
        cJSON_AddNumberToObject(root, "prompt_len_min", o.prompt.lo);
        cJSON_AddNumberToObject(root, "prompt_len_max", o.prompt.hi);
        cJSON_AddNumberToObject(root, "output_len_min", o.output.lo);
        cJSON_AddNumberToObject(root, "output_len_max", o.output.hi);
        cJSON_AddNumberToObject(root, "kv_mib", o.kv_mib);
        cJSON_AddNumberToObject(root, "max_batch", o.max_batch);
        cJSON_AddNumberToObject(root, "tp", o.tp);
        cJSON_AddNumberToObject(root, "graph_horizon", o.graphs);
        mkv_cli_json_add_i64(root, "seed", o.seed);
        if (o.run_mixkv) cJSON_AddItemToObject(root, "mixkv_policy", mkv_policy_opts_json(&o.policy, NULL));
        cJSON *runs = cJSON_AddArrayToObject(root, "runs");
        for (int ri = 0; ri < o.n_rates; ri++) {
            cJSON *run = cJSON_CreateObject();
            cJSON_AddStringToObject(run, "arrivals", o.rates[ri] > 0 ? "poisson" : "offline");
            cJSON_AddNumberToObject(run, "rate", o.rates[ri]);
            cJSON *engines = cJSON_AddArrayToObject(run, "engines");
            for (int i = 0; i < n_eng; i++) cJSON_AddItemToArray(engines, result_json(&res[ri][i], o.requests));
            cJSON_AddItemToArray(runs, run);
        }
        const int bad = mkv_cli_write_json(CMD, root, o.json_path);
        cJSON_Delete(root);
        if (bad < 0) goto done;
    }
    rc = MKV_EXIT_OK;
    goto done;
oom:
    mkv_cli_error(CMD, "out of memory");
done:
    free(plen), free(olen), free(tokens), free(arrival), free(res), free(pairs);
    if (tp) fw.cuda = NULL; /* the group's rank 0 */
    mkv_tools_forward_free(&fw);
    mkv_tp_free(tp);
    mkv_model_free(model);
    return rc;
}
