/*
 * bench_memmgr.c — the CPU memory manager's cost per decode step, the baseline the GPU
 * memory manager (issue 5) is compared against (DiffKV, section 7: its GPU manager is three
 * orders of magnitude faster than a multi-threaded CPU one).
 *
 * For each batch size and thread count: a metadata-only cache with Llama-3-8B's KV geometry
 * (32 layers, 8 KV heads, d 128, K8V4 / K4V2), `batch` sequences admitted with prompts of
 * random length placed with a random high / low / pruned split per head-region, then a run of
 * decode steps, each timed in two parts:
 *   append   mkv_cache_append: every head-region gains one high token (plan, one prefix
 *            sum, allocation where a section crosses a page boundary);
 *   compact  mkv_cache_resize: the policy's memory effect (the token at the window's edge is
 *            kept, demoted or pruned, a victim may be demoted or pruned), so sections shrink
 *            and grow and pages are recycled and allocated in one call.
 * The targets of each compact step are drawn before its timer starts. Median, min and p90
 * over --reps steps after --warmup; JSON out (docs/results-schema.md).
 */
#include "memmgr/cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
    int32_t batches[16];
    int n_batches;
    int32_t threads[8];
    int n_threads;
    int32_t layers, kv_heads, head_dim;
    int32_t prompt_min, prompt_max;
    int32_t reps, warmup;
    uint64_t seed;
    const char *json_path;
    const char *dump_path;
} opts_t;

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t rng_range(uint64_t *s, int32_t lo, int32_t hi)
{
    return lo + (int32_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct summary {
    double median, min, p90;
} summary_t;

static summary_t summarise(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    summary_t s = {v[n / 2], v[0], v[(int)((n - 1) * 0.9)]};
    if (n % 2 == 0) s.median = 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return s;
}

static void die(const char *what, mkv_status_t st, const char *msg)
{
    fprintf(stderr, "bench_memmgr: %s: %s: %s\n", what, mkv_status_string(st), msg);
    exit(1);
}

typedef struct result {
    int32_t batch, threads;
    int64_t regions, pool_pages;
    summary_t append_us, compact_us;
    double pages_alloc_per_step, pages_recycled_per_step;
    int64_t final_used_pages;
} result_t;

/* The policy's memory effect on one head-region (Algorithm 1, counts only). */
static void policy_targets(uint64_t *rng, int32_t n, int32_t window, int32_t hi, int32_t lo,
                           int32_t *out_hi, int32_t *out_lo)
{
    *out_hi = hi;
    *out_lo = lo;
    if (n <= window || hi <= window) return;
    switch (rng_range(rng, 0, 5)) {
    case 0: *out_hi = hi - 1; break;                 /* candidate pruned */
    case 1: *out_hi = hi - 1; *out_lo = lo + 1; break; /* candidate demoted */
    case 2: /* candidate demoted, lowest low token pruned */
        *out_hi = hi - 1;
        break;
    case 3: *out_hi = hi - 1; *out_lo = lo + 1; break; /* candidate kept, victim demoted */
    case 4: *out_hi = hi - 1; break;                 /* candidate kept, victim pruned */
    default: break;                                  /* candidate and victim kept */
    }
}

static result_t run_one(const opts_t *o, int32_t batch, int32_t threads, int dump)
{
    /* The workload depends on the batch, not the thread count: every variant does the same work. */
    uint64_t rng = o->seed ^ ((uint64_t)batch << 20);
    (void)threads;
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = o->layers;
    cfg.n_kv_heads = o->kv_heads;
    cfg.head_dim = o->head_dim;
    cfg.max_seqs = batch;
    cfg.max_seq_len = o->prompt_max + o->reps + o->warmup + 1;
    cfg.flags = MKV_CACHE_METADATA_ONLY;
    cfg.n_threads = threads;
    /* The default page holds 32 high-precision tokens: room for every sequence at full
     * length in high precision, plus slack. */
    mkv_status_t st;
    const int64_t per_region = cfg.max_seq_len / 32 + 3;
    cfg.pool_pages = (int64_t)batch * o->layers * o->kv_heads * per_region;
    mkv_cache_t *c;
    if ((st = mkv_cache_create(&cfg, &c)) != MKV_STATUS_OK) die("create", st, mkv_last_error());

    const int64_t per_slot = (int64_t)o->layers * o->kv_heads;
    const int64_t regions = per_slot * batch;
    int32_t *slots = malloc((size_t)batch * sizeof *slots);
    int32_t *seq = malloc((size_t)batch * sizeof *seq);
    int32_t *hi = malloc((size_t)regions * sizeof *hi);
    int32_t *lo = malloc((size_t)regions * sizeof *lo);
    double *t_append = malloc((size_t)o->reps * sizeof(double));
    double *t_compact = malloc((size_t)o->reps * sizeof(double));
    if (!slots || !seq || !hi || !lo || !t_append || !t_compact) die("malloc", MKV_STATUS_OUT_OF_MEMORY, "");

    /* Admit and place prompts: per head-region, a random share high / low / pruned. */
    for (int32_t b = 0; b < batch; b++) {
        const int32_t len = rng_range(&rng, o->prompt_min, o->prompt_max);
        if ((st = mkv_cache_admit(c, len, &slots[b])) != MKV_STATUS_OK)
            die("admit", st, mkv_cache_last_error(c));
        seq[b] = len;
        for (int64_t k = 0; k < per_slot; k++) {
            const int32_t keep_hi = cfg.window + (len - cfg.window) * rng_range(&rng, 15, 60) / 100;
            const int32_t keep_lo = (len - keep_hi) * rng_range(&rng, 20, 80) / 100;
            hi[b * per_slot + k] = len <= cfg.window ? len : keep_hi;
            lo[b * per_slot + k] = len <= cfg.window ? 0 : keep_lo;
        }
    }
    mkv_resize_t rz = {batch, slots, seq, hi, lo};
    if ((st = mkv_cache_resize(c, &rz, NULL)) != MKV_STATUS_OK) die("prompt resize", st, mkv_cache_last_error(c));

    int64_t head0 = 0, tail0 = 0;
    for (int32_t step = 0; step < o->warmup + o->reps; step++) {
        if (step == o->warmup) {
            head0 = c->st.head;
            tail0 = c->st.tail;
        }
        double t0 = now_us();
        if ((st = mkv_cache_append(c, batch, slots, NULL)) != MKV_STATUS_OK)
            die("append", st, mkv_cache_last_error(c));
        double t1 = now_us();
        for (int32_t b = 0; b < batch; b++) {
            seq[b] = c->st.seq_len[b];
            for (int64_t k = 0; k < per_slot; k++) {
                const int64_t r = b * per_slot + k;
                policy_targets(&rng, seq[b], cfg.window, c->st.n_hi[r], c->st.n_lo[r], &hi[r], &lo[r]);
            }
        }
        double t2 = now_us();
        if ((st = mkv_cache_resize(c, &rz, NULL)) != MKV_STATUS_OK)
            die("compact resize", st, mkv_cache_last_error(c));
        double t3 = now_us();
        if (step >= o->warmup) {
            t_append[step - o->warmup] = t1 - t0;
            t_compact[step - o->warmup] = t3 - t2;
        }
    }
    if ((st = mkv_cache_validate(c)) != MKV_STATUS_OK) die("validate", st, mkv_cache_last_error(c));

    result_t r = {0};
    r.batch = batch;
    r.threads = threads;
    r.regions = regions;
    r.pool_pages = cfg.pool_pages;
    r.append_us = summarise(t_append, o->reps);
    r.compact_us = summarise(t_compact, o->reps);
    r.pages_alloc_per_step = (double)(c->st.head - head0) / o->reps;
    r.pages_recycled_per_step = (double)(c->st.tail - tail0) / o->reps;
    r.final_used_pages = cfg.pool_pages - (c->st.tail - c->st.head);
    if (dump && o->dump_path) {
        if ((st = mkv_cache_dump_json(c, o->dump_path)) != MKV_STATUS_OK)
            die("dump", st, mkv_cache_last_error(c));
    }
    mkv_cache_destroy(c);
    free(slots);
    free(seq);
    free(hi);
    free(lo);
    free(t_append);
    free(t_compact);
    return r;
}

static int parse_list(const char *s, int32_t *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 1 || v > 1 << 20) return -1;
        out[n++] = (int32_t)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return *s ? -1 : n;
}

static int parse_i32(const char *s, int32_t lo, int32_t hi, int32_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = (int32_t)v;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_memmgr [options]\n"
            "Times one decode step's memory management (planning + prefix-sum allocation, and a\n"
            "policy-shaped resize with recycling) on the CPU backend.\n\n"
            "  --batch LIST      batch sizes (default 1,16,64,256,512)\n"
            "  --threads LIST    thread counts; 1 is the serial baseline (default 1,<cores>)\n"
            "  --layers N        layers (default 32)\n"
            "  --kv-heads N      KV heads per layer (default 8)\n"
            "  --prompt MIN:MAX  prompt lengths, uniform (default 512:1536, mean 1024)\n"
            "  --reps N          timed steps per configuration (default 50)\n"
            "  --warmup N        untimed steps first (default 5)\n"
            "  --seed N          random seed (default 1)\n"
            "  --json FILE       write results as JSON (docs/results-schema.md)\n"
            "  --dump FILE       write the first configuration's final state as a dump (mixkv inspect)\n"
            "  -h, --help        this text\n");
}

int main(int argc, char **argv)
{
    opts_t o = {{1, 16, 64, 256, 512}, 5, {1, 0}, 0, 32, 8, 128, 512, 1536, 50, 5, 1, NULL, NULL};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    o.threads[0] = 1;
    o.n_threads = 1;
    if (cores > 1) o.threads[o.n_threads++] = (int32_t)(cores > 64 ? 64 : cores);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!v) {
            bad = 1;
        } else if (!strcmp(a, "--batch")) {
            bad = (o.n_batches = parse_list(v, o.batches, 16)) <= 0;
        } else if (!strcmp(a, "--threads")) {
            bad = (o.n_threads = parse_list(v, o.threads, 8)) <= 0;
        } else if (!strcmp(a, "--layers")) {
            bad = parse_i32(v, 1, 1024, &o.layers);
        } else if (!strcmp(a, "--kv-heads")) {
            bad = parse_i32(v, 1, 1024, &o.kv_heads);
        } else if (!strcmp(a, "--prompt")) {
            bad = sscanf(v, "%d:%d", &o.prompt_min, &o.prompt_max) != 2 || o.prompt_min < 1 ||
                  o.prompt_max < o.prompt_min || o.prompt_max > 1 << 20;
        } else if (!strcmp(a, "--reps")) {
            bad = parse_i32(v, 1, 1 << 20, &o.reps);
        } else if (!strcmp(a, "--warmup")) {
            bad = parse_i32(v, 0, 1 << 20, &o.warmup);
        } else if (!strcmp(a, "--seed")) {
            int32_t s;
            bad = parse_i32(v, 0, INT32_MAX, &s);
            o.seed = (uint64_t)s;
        } else if (!strcmp(a, "--json")) {
            o.json_path = v;
        } else if (!strcmp(a, "--dump")) {
            o.dump_path = v;
        } else {
            fprintf(stderr, "bench_memmgr: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "bench_memmgr: bad or missing value for %s\n", a);
            return 2;
        }
        i++;
    }

    const int n_runs = o.n_batches * o.n_threads;
    result_t *res = calloc((size_t)n_runs, sizeof *res);
    if (!res) return 1;
    printf("memory manager per decode step, CPU backend: L=%d H=%d d=%d K8V4/K4V2, prompts %d..%d, "
           "median of %d steps\n",
           o.layers, o.kv_heads, o.head_dim, o.prompt_min, o.prompt_max, o.reps);
    printf("%6s %7s %9s %12s %12s %12s %12s %10s %10s\n", "batch", "threads", "regions",
           "append_med", "append_p90", "compact_med", "compact_p90", "alloc/st", "recyc/st");
    const int progress = isatty(STDERR_FILENO); /* a progress line only on a terminal */
    int k = 0;
    for (int b = 0; b < o.n_batches; b++) {
        for (int t = 0; t < o.n_threads; t++, k++) {
            if (progress)
                fprintf(stderr, "[%d/%d] batch %d, %d thread(s)...\r", k + 1, n_runs, o.batches[b],
                        o.threads[t]);
            res[k] = run_one(&o, o.batches[b], o.threads[t], k == 0);
            printf("%6d %7d %9lld %10.1fus %10.1fus %10.1fus %10.1fus %10.1f %10.1f\n", res[k].batch,
                   res[k].threads, (long long)res[k].regions, res[k].append_us.median,
                   res[k].append_us.p90, res[k].compact_us.median, res[k].compact_us.p90,
                   res[k].pages_alloc_per_step, res[k].pages_recycled_per_step);
            fflush(stdout);
        }
    }
    if (progress) fprintf(stderr, "%40s\r", "");

    if (o.json_path) {
        FILE *f = strcmp(o.json_path, "-") ? fopen(o.json_path, "w") : stdout;
        if (!f) {
            fprintf(stderr, "bench_memmgr: cannot write %s: %s\n", o.json_path, strerror(errno));
            return 2;
        }
        fprintf(f, "{\n  \"schema\": \"mixkv-bench-memmgr\",\n  \"schema_version\": 1,\n");
        fprintf(f, "  \"mixkv_version\": \"%s\",\n  \"backend\": \"cpu\",\n  \"cpu_cores\": %ld,\n",
                mkv_version(), cores);
        fprintf(f,
                "  \"config\": {\"layers\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"hi_format\": "
                "\"K8V4\", \"lo_format\": \"K4V2\", \"prompt_min\": %d, \"prompt_max\": %d, "
                "\"reps\": %d, \"warmup\": %d, \"seed\": %llu},\n",
                o.layers, o.kv_heads, o.head_dim, o.prompt_min, o.prompt_max, o.reps, o.warmup,
                (unsigned long long)o.seed);
        fprintf(f, "  \"results\": [\n");
        for (int i = 0; i < n_runs; i++) {
            const result_t *r = &res[i];
            fprintf(f,
                    "    {\"batch\": %d, \"threads\": %d, \"head_regions\": %lld, \"pool_pages\": "
                    "%lld, \"append_us\": {\"median\": %.3f, \"min\": %.3f, \"p90\": %.3f}, "
                    "\"compact_us\": {\"median\": %.3f, \"min\": %.3f, \"p90\": %.3f}, "
                    "\"pages_allocated_per_step\": %.2f, \"pages_recycled_per_step\": %.2f, "
                    "\"final_used_pages\": %lld}%s\n",
                    r->batch, r->threads, (long long)r->regions, (long long)r->pool_pages,
                    r->append_us.median, r->append_us.min, r->append_us.p90, r->compact_us.median,
                    r->compact_us.min, r->compact_us.p90, r->pages_alloc_per_step,
                    r->pages_recycled_per_step, (long long)r->final_used_pages,
                    i + 1 < n_runs ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        if (f != stdout) fclose(f);
    }
    free(res);
    return 0;
}
