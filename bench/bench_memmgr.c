/*
 * bench_memmgr.c — the CPU memory manager's cost per decode step, the baseline the GPU
 * memory manager (cuda_mm.h) is compared against (DiffKV, section 7: its GPU manager is three
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

#ifdef MKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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
    int cpu, cuda; /* backends to run */
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
    summary_t append_us, compact_us, prompt_us;
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

/* Backend-specific plumbing: targets live on the device for the CUDA backend, and its calls
 * are timed with CUDA events on the bench's stream. */
typedef struct timing {
    int cuda;
    void *stream;
#ifdef MKV_HAVE_CUDA
    cudaEvent_t ev0, ev1;
    int32_t *d_hi, *d_lo;
#endif
} timing_t;

static const int32_t *target_ptr(timing_t *t, const int32_t *host, int32_t *dev, int64_t n)
{
#ifdef MKV_HAVE_CUDA
    if (t->cuda) {
        if (cudaMemcpy(dev, host, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess)
            die("cudaMemcpy", MKV_STATUS_CUDA_ERROR, "targets");
        return dev;
    }
#endif
    (void)t;
    (void)dev;
    (void)n;
    return host;
}

static void timer_start(timing_t *t, double *t0)
{
#ifdef MKV_HAVE_CUDA
    if (t->cuda) cudaEventRecord(t->ev0, (cudaStream_t)t->stream);
#endif
    *t0 = now_us();
}

static double timer_stop(timing_t *t, double t0)
{
    const double wall = now_us() - t0;
#ifdef MKV_HAVE_CUDA
    if (t->cuda) {
        float ms = 0.0f;
        cudaEventRecord(t->ev1, (cudaStream_t)t->stream);
        cudaEventSynchronize(t->ev1);
        cudaEventElapsedTime(&ms, t->ev0, t->ev1);
        return 1e3 * (double)ms;
    }
#endif
    return wall;
}

static result_t run_one(const opts_t *o, int32_t batch, int32_t threads, int cuda, int dump)
{
    /* The workload depends on the batch only: every variant does the same work. */
    uint64_t rng = o->seed ^ ((uint64_t)batch << 20);
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = o->layers;
    cfg.n_kv_heads = o->kv_heads;
    cfg.head_dim = o->head_dim;
    cfg.max_seqs = batch;
    cfg.max_seq_len = o->prompt_max + o->reps + o->warmup + 1;
    cfg.flags = MKV_CACHE_METADATA_ONLY;
    cfg.n_threads = cuda ? 1 : threads;
    cfg.backend = cuda ? MKV_BACKEND_CUDA : MKV_BACKEND_CPU;
    /* The default page holds 32 high-precision tokens: room for every sequence at full
     * length in high precision, plus slack. */
    mkv_status_t st;
    const int64_t per_region = cfg.max_seq_len / 32 + 3;
    cfg.pool_pages = (int64_t)batch * o->layers * o->kv_heads * per_region;
    mkv_cache_t *c;
    if ((st = mkv_cache_create(&cfg, &c)) != MKV_STATUS_OK) die("create", st, mkv_last_error());

    timing_t tm;
    memset(&tm, 0, sizeof tm);
    tm.cuda = cuda;
    const int64_t per_slot = (int64_t)o->layers * o->kv_heads;
    const int64_t regions = per_slot * batch;
#ifdef MKV_HAVE_CUDA
    if (cuda) {
        if (cudaStreamCreateWithFlags((cudaStream_t *)&tm.stream, cudaStreamNonBlocking) != cudaSuccess ||
            cudaEventCreate(&tm.ev0) != cudaSuccess || cudaEventCreate(&tm.ev1) != cudaSuccess ||
            cudaMalloc((void **)&tm.d_hi, (size_t)regions * 4) != cudaSuccess ||
            cudaMalloc((void **)&tm.d_lo, (size_t)regions * 4) != cudaSuccess)
            die("cuda setup", MKV_STATUS_CUDA_ERROR, "stream, events or targets");
    }
#define DEV_HI tm.d_hi
#define DEV_LO tm.d_lo
#else
#define DEV_HI NULL
#define DEV_LO NULL
#endif
    int32_t *slots = malloc((size_t)batch * sizeof *slots);
    int32_t *seq = malloc((size_t)batch * sizeof *seq);
    int32_t *hi = malloc((size_t)regions * sizeof *hi), *lo = malloc((size_t)regions * sizeof *lo);
    int32_t *p_hi = malloc((size_t)regions * sizeof *hi), *p_lo = malloc((size_t)regions * sizeof *lo);
    int32_t *cur_hi = malloc((size_t)regions * sizeof *hi), *cur_lo = malloc((size_t)regions * sizeof *lo);
    double *t_append = malloc((size_t)o->reps * sizeof(double));
    double *t_compact = malloc((size_t)o->reps * sizeof(double));
    double *t_prompt = malloc((size_t)o->reps * sizeof(double));
    if (!slots || !seq || !hi || !lo || !p_hi || !p_lo || !cur_hi || !cur_lo || !t_append ||
        !t_compact || !t_prompt)
        die("malloc", MKV_STATUS_OUT_OF_MEMORY, "");

    /* Prompts: per head-region, a random share high / low / pruned. */
    int32_t *plen = malloc((size_t)batch * sizeof *plen);
    if (!plen) die("malloc", MKV_STATUS_OUT_OF_MEMORY, "");
    for (int32_t b = 0; b < batch; b++) {
        const int32_t len = rng_range(&rng, o->prompt_min, o->prompt_max);
        plen[b] = len;
        for (int64_t k = 0; k < per_slot; k++) {
            const int32_t keep_hi = cfg.window + (len - cfg.window) * rng_range(&rng, 15, 60) / 100;
            const int32_t keep_lo = (len - keep_hi) * rng_range(&rng, 20, 80) / 100;
            p_hi[b * per_slot + k] = len <= cfg.window ? len : keep_hi;
            p_lo[b * per_slot + k] = len <= cfg.window ? 0 : keep_lo;
        }
    }
    /* A prompt placement of the whole batch (one resize from empty), timed reps times, each on
     * freshly admitted slots; the last one stays for the decode steps. */
    for (int32_t rep = 0; rep < o->reps; rep++) {
        for (int32_t b = 0; b < batch; b++) {
            if (rep > 0 && (st = mkv_cache_release(c, slots[b], tm.stream)) != MKV_STATUS_OK)
                die("release", st, mkv_cache_last_error(c));
        }
        for (int32_t b = 0; b < batch; b++) {
            if ((st = mkv_cache_admit(c, plen[b], &slots[b])) != MKV_STATUS_OK)
                die("admit", st, mkv_cache_last_error(c));
            seq[b] = plen[b];
        }
        const mkv_resize_t place = {batch, slots, seq, target_ptr(&tm, p_hi, DEV_HI, regions),
                                    target_ptr(&tm, p_lo, DEV_LO, regions)};
        double t0;
        timer_start(&tm, &t0);
        if ((st = mkv_cache_resize(c, &place, tm.stream)) != MKV_STATUS_OK)
            die("prompt resize", st, mkv_cache_last_error(c));
        t_prompt[rep] = timer_stop(&tm, t0);
    }
    memcpy(cur_hi, p_hi, (size_t)regions * sizeof *hi);
    memcpy(cur_lo, p_lo, (size_t)regions * sizeof *lo);

    int64_t head0 = 0, tail0 = 0;
    for (int32_t step = 0; step < o->warmup + o->reps; step++) {
        if (step == o->warmup) {
            head0 = c->st.head;
            tail0 = c->st.tail;
        }
        double t0;
        timer_start(&tm, &t0);
        if ((st = mkv_cache_append(c, batch, slots, tm.stream)) != MKV_STATUS_OK)
            die("append", st, mkv_cache_last_error(c));
        const double ta = timer_stop(&tm, t0);
        for (int32_t b = 0; b < batch; b++) {
            seq[b] += 1;
            for (int64_t k = 0; k < per_slot; k++) {
                const int64_t r = b * per_slot + k;
                cur_hi[r] += 1;
                policy_targets(&rng, seq[b], cfg.window, cur_hi[r], cur_lo[r], &hi[r], &lo[r]);
            }
        }
        const mkv_resize_t rz = {batch, slots, NULL, target_ptr(&tm, hi, DEV_HI, regions),
                                 target_ptr(&tm, lo, DEV_LO, regions)};
        timer_start(&tm, &t0);
        if ((st = mkv_cache_resize(c, &rz, tm.stream)) != MKV_STATUS_OK)
            die("compact resize", st, mkv_cache_last_error(c));
        const double tc = timer_stop(&tm, t0);
        memcpy(cur_hi, hi, (size_t)regions * sizeof *hi);
        memcpy(cur_lo, lo, (size_t)regions * sizeof *lo);
        if (step >= o->warmup) {
            t_append[step - o->warmup] = ta;
            t_compact[step - o->warmup] = tc;
        }
    }
    if ((st = mkv_cache_validate(c)) != MKV_STATUS_OK) die("validate", st, mkv_cache_last_error(c));

    result_t r = {0};
    r.batch = batch;
    r.threads = cuda ? 0 : threads;
    r.regions = regions;
    r.pool_pages = cfg.pool_pages;
    r.append_us = summarise(t_append, o->reps);
    r.compact_us = summarise(t_compact, o->reps);
    r.prompt_us = summarise(t_prompt, o->reps);
    r.pages_alloc_per_step = (double)(c->st.head - head0) / o->reps;
    r.pages_recycled_per_step = (double)(c->st.tail - tail0) / o->reps;
    r.final_used_pages = cfg.pool_pages - (c->st.tail - c->st.head);
    if (dump && o->dump_path) {
        if ((st = mkv_cache_dump_json(c, o->dump_path)) != MKV_STATUS_OK)
            die("dump", st, mkv_cache_last_error(c));
    }
    mkv_cache_destroy(c);
#ifdef MKV_HAVE_CUDA
    if (cuda) {
        cudaFree(tm.d_hi);
        cudaFree(tm.d_lo);
        cudaEventDestroy(tm.ev0);
        cudaEventDestroy(tm.ev1);
        cudaStreamDestroy((cudaStream_t)tm.stream);
    }
#endif
#undef DEV_HI
#undef DEV_LO
    free(slots);
    free(seq);
    free(hi);
    free(lo);
    free(p_hi);
    free(p_lo);
    free(cur_hi);
    free(cur_lo);
    free(plen);
    free(t_append);
    free(t_compact);
    free(t_prompt);
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
            "Times the memory manager per decode step (append: planning + prefix-sum allocation;\n"
            "compact: a policy-shaped resize with recycling) and per prompt batch (placement of\n"
            "every sequence's prompt with one resize), on the CPU backend (serial and threaded)\n"
            "and on the CUDA backend (CUDA events), median of --reps.\n\n"
            "  --backend B       cpu, cuda or both (default: both when a CUDA device is present)\n"
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
    opts_t o = {{1, 16, 64, 256, 512}, 5, {1, 0}, 0, 32, 8, 128, 512, 1536, 50, 5, 1, NULL, NULL, 1, 0};
    int have_cuda = 0;
    mkv_backend_available(MKV_BACKEND_CUDA, &have_cuda);
    o.cuda = have_cuda;
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
        } else if (!strcmp(a, "--backend")) {
            o.cpu = !strcmp(v, "cpu") || !strcmp(v, "both");
            o.cuda = !strcmp(v, "cuda") || !strcmp(v, "both");
            bad = !o.cpu && !o.cuda;
            if (o.cuda && !have_cuda) {
                fprintf(stderr, "bench_memmgr: --backend %s: no CUDA device here\n", v);
                return 2;
            }
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

    const int per_batch = (o.cpu ? o.n_threads : 0) + (o.cuda ? 1 : 0);
    const int n_runs = o.n_batches * per_batch;
    result_t *res = calloc((size_t)(n_runs > 0 ? n_runs : 1), sizeof *res);
    if (!res) return 1;
    printf("memory manager: L=%d H=%d d=%d K8V4/K4V2, prompts %d..%d, median of %d (us; cuda: CUDA "
           "events around each call, which ends with one stream synchronisation)\n",
           o.layers, o.kv_heads, o.head_dim, o.prompt_min, o.prompt_max, o.reps);
    printf("%6s %8s %9s %11s %11s %11s %11s %11s %9s %9s\n", "batch", "backend", "regions",
           "append_med", "append_p90", "compact_med", "compact_p90", "prompt_med", "alloc/st",
           "recyc/st");
    const int progress = isatty(STDERR_FILENO); /* a progress line only on a terminal */
    int k = 0;
    for (int b = 0; b < o.n_batches; b++) {
        for (int t = 0; t < per_batch; t++, k++) {
            const int cuda = o.cuda && t == per_batch - 1;
            const int32_t threads = cuda ? 0 : o.threads[t];
            if (progress)
                fprintf(stderr, "[%d/%d] batch %d, %s...\r", k + 1, n_runs, o.batches[b],
                        cuda ? "cuda" : "cpu");
            res[k] = run_one(&o, o.batches[b], threads, cuda, k == 0);
            char label[16];
            if (cuda) snprintf(label, sizeof label, "cuda");
            else snprintf(label, sizeof label, "cpu x%d", threads);
            printf("%6d %8s %9lld %11.1f %11.1f %11.1f %11.1f %11.1f %9.1f %9.1f\n", res[k].batch,
                   label, (long long)res[k].regions, res[k].append_us.median, res[k].append_us.p90,
                   res[k].compact_us.median, res[k].compact_us.p90, res[k].prompt_us.median,
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
        fprintf(f, "{\n  \"schema\": \"mixkv-bench-memmgr\",\n  \"schema_version\": 2,\n");
        fprintf(f, "  \"mixkv_version\": \"%s\",\n  \"cpu_cores\": %ld,\n", mkv_version(), cores);
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
                    "    {\"batch\": %d, \"backend\": \"%s\", \"threads\": %d, \"head_regions\": %lld, "
                    "\"pool_pages\": %lld, \"append_us\": {\"median\": %.3f, \"min\": %.3f, \"p90\": %.3f}, "
                    "\"compact_us\": {\"median\": %.3f, \"min\": %.3f, \"p90\": %.3f}, "
                    "\"prompt_us\": {\"median\": %.3f, \"min\": %.3f, \"p90\": %.3f}, "
                    "\"pages_allocated_per_step\": %.2f, \"pages_recycled_per_step\": %.2f, "
                    "\"final_used_pages\": %lld}%s\n",
                    r->batch, r->threads ? "cpu" : "cuda", r->threads, (long long)r->regions,
                    (long long)r->pool_pages, r->append_us.median, r->append_us.min,
                    r->append_us.p90, r->compact_us.median, r->compact_us.min, r->compact_us.p90,
                    r->prompt_us.median, r->prompt_us.min, r->prompt_us.p90, r->pages_alloc_per_step,
                    r->pages_recycled_per_step, (long long)r->final_used_pages,
                    i + 1 < n_runs ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        if (f != stdout) fclose(f);
    }
    free(res);
    return 0;
}
