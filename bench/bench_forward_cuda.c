/*
 * bench_forward_cuda.c — the model runner's CUDA forward pass at a real model's shape with
 * stand-in weights (runner/forward_cuda.h, mkv_cuda_forward_create_dummy): `batch` prompts of
 * `context` tokens prefilled one at a time, then `steps` decode steps of the whole batch,
 * through an fp16 cache (K16V16, no compression: the FP16 paged baseline) or a mixkv cache.
 *
 * Reported beside the times, from the same run: the device copy rate (read plus write bytes
 * per second of a 1 GiB copy) and a large square cuBLAS GEMM's TFLOP/s in the same element
 * type; the decode step's roofline (the weights read once plus the stored KV read once, at
 * the copy rate) and the step's ratio to it; the prefill's matmul TFLOP/s (2 x matmul
 * parameters x tokens over the whole prefill's time: attention and the rest count against
 * it) as a fraction of the square GEMM's. And the device sampler alone on `batch` rows of
 * the vocabulary (runner/sampling_cuda.h: top-p, no top-p, greedy). JSON
 * ("mixkv-bench-forward-cuda") and a table.
 */
#include "runner/forward_cuda.h"
#include "runner/model.h"
#include "runner/sampling_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "bench_forward_cuda: %s: %s\n", #x, cudaGetErrorString(e_));       \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* Read plus write bytes per second of a 1 GiB device copy (median of 5). */
static double copy_rate(void)
{
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    double t[5];
    for (int i = 0; i < 6; i++) {
        CK(cudaDeviceSynchronize());
        const double t0 = now_s();
        CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaDeviceSynchronize());
        if (i > 0) t[i - 1] = now_s() - t0;
    }
    cudaFree(a), cudaFree(b);
    return 2.0 * (double)bytes / median(t, 5);
}

/* TFLOP/s of an 8192^3 GEMM in dtype with fp32 accumulation (median of 5). */
static double square_gemm_tflops(mkv_dtype_t dtype)
{
    const int n = 8192;
    const cudaDataType_t t = dtype == MKV_DTYPE_F32 ? CUDA_R_32F : dtype == MKV_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
    const size_t es = mkv_dtype_size(dtype);
    void *a, *b, *c;
    CK(cudaMalloc(&a, (size_t)n * n * es));
    CK(cudaMalloc(&b, (size_t)n * n * es));
    CK(cudaMalloc(&c, (size_t)n * n * es));
    CK(cudaMemset(a, 0, (size_t)n * n * es));
    CK(cudaMemset(b, 0, (size_t)n * n * es));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0.0;
    const float one = 1.0f, zero = 0.0f;
    double ts[5];
    for (int i = 0; i < 6; i++) {
        CK(cudaDeviceSynchronize());
        const double t0 = now_s();
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, t, n, b, t, n, &zero, c, t, n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        CK(cudaDeviceSynchronize());
        if (i > 0) ts[i - 1] = now_s() - t0;
    }
    cublasDestroy(h);
    cudaFree(a), cudaFree(b), cudaFree(c);
    return 2.0 * n * (double)n * n / median(ts, 5) * 1e-12;
}

/* The device sampler alone on batch rows of vocab logits uniform in [-8, 8), temperature and
 * top_p for every row: milliseconds, CUDA events around each call, median of 21 after a
 * warm-up. The sampler overwrites the logits: they are restored from a pristine copy before
 * each call (untimed), so they sit in L2 as after the lm_head GEMM. */
static double sample_ms(int32_t batch, int32_t vocab, float temperature, float top_p, uint64_t seed)
{
    const size_t n = (size_t)batch * vocab;
    float *h = malloc(n * sizeof(float));
    mkv_sample_row_t *rows = malloc((size_t)batch * sizeof *rows);
    if (!h || !rows) {
        fprintf(stderr, "bench_forward_cuda: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)(seed >> 40) * 0x1.0p-24f * 16.0f - 8.0f;
    }
    float *src, *lg;
    mkv_sample_row_t *d_rows;
    int32_t *next;
    CK(cudaMalloc((void **)&src, n * sizeof(float)));
    CK(cudaMalloc((void **)&lg, n * sizeof(float)));
    CK(cudaMalloc((void **)&d_rows, (size_t)batch * sizeof *rows));
    CK(cudaMalloc((void **)&next, (size_t)batch * sizeof(int32_t)));
    CK(cudaMemcpy(src, h, n * sizeof(float), cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    char err[MKV_ERR_LEN];
    double t[21];
    for (int i = 0; i < 22; i++) {
        for (int32_t j = 0; j < batch; j++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            rows[j].u = (double)(seed >> 11) * 0x1.0p-53;
            rows[j].temperature = temperature;
            rows[j].top_p = top_p;
        }
        CK(cudaMemcpy(d_rows, rows, (size_t)batch * sizeof *rows, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(lg, src, n * sizeof(float), cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e0, NULL));
        if (mkv_cuda_sample(lg, batch, vocab, d_rows, next, NULL, err) != MKV_STATUS_OK) {
            fprintf(stderr, "bench_forward_cuda: %s\n", err);
            exit(1);
        }
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i > 0) t[i - 1] = ms;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(src), cudaFree(lg), cudaFree(d_rows), cudaFree(next);
    free(h), free(rows);
    return median(t, 21);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_forward_cuda [--shape llama-3-8b | --config PATH] [--dtype f16|bf16|f32]\n"
               "                          [--batch N] [--context N] [--steps N] [--cache fp16|mixkv]\n"
               "                          [--seed N] [--graphs HORIZON] [--json FILE]\n"
               "The CUDA forward pass at a model's shape with stand-in weights: prefill, decode steps,\n"
               "against the copy rate and a square GEMM measured in the same run.\n");
}

int main(int argc, char **argv)
{
    const char *shape = "llama-3-8b", *config = NULL, *json = NULL, *cache_mode = "fp16";
    int graphs = 0; /* > 0: greedy steps through CUDA graphs too, this horizon */
    mkv_dtype_t dtype = MKV_DTYPE_F16;
    int32_t batch = 64, context = 4096, steps = 8;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const int more = i + 1 < argc;
        if (!strcmp(argv[i], "--shape") && more) shape = argv[++i];
        else if (!strcmp(argv[i], "--config") && more) config = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && more) {
            const char *d = argv[++i];
            dtype = !strcmp(d, "f32") ? MKV_DTYPE_F32 : !strcmp(d, "bf16") ? MKV_DTYPE_BF16 : MKV_DTYPE_F16;
            if (strcmp(d, "f32") && strcmp(d, "bf16") && strcmp(d, "f16")) {
                fprintf(stderr, "bench_forward_cuda: --dtype %s (f16, bf16 or f32)\n", d);
                return 2;
            }
        } else if (!strcmp(argv[i], "--batch") && more) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--context") && more) context = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && more) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cache") && more) cache_mode = argv[++i];
        else if (!strcmp(argv[i], "--seed") && more) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--graphs") && more) graphs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && more) json = argv[++i];
        else {
            usage(strcmp(argv[i], "--help") ? stderr : stdout);
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (batch < 1 || context < 2 || steps < 1 || (strcmp(cache_mode, "fp16") && strcmp(cache_mode, "mixkv"))) {
        fprintf(stderr, "bench_forward_cuda: --batch >= 1, --context >= 2, --steps >= 1, --cache fp16|mixkv\n");
        return 2;
    }
    char err[MKV_ERR_LEN];
    mkv_model_config_t mc;
    const mkv_status_t cs = config ? mkv_model_config_load(config, &mc, err) : mkv_model_config_builtin(shape, &mc, err);
    if (cs != MKV_STATUS_OK) {
        fprintf(stderr, "bench_forward_cuda: %s\n", err);
        return 2;
    }
    const int32_t max_len = context + 5 * steps + 8; /* five kinds of decode step, and warm-ups */
    if (max_len > mc.max_pos) mc.max_pos = max_len; /* stand-in weights: any length will do */
    const double copy = copy_rate(), gemm = square_gemm_tflops(dtype);
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    mkv_cuda_forward_t *f = NULL;
    const int32_t max_tokens = context > batch ? context : batch;
    if (mkv_cuda_forward_create_dummy(&mc, seed, max_tokens, dtype, &f, err) != MKV_STATUS_OK) {
        fprintf(stderr, "bench_forward_cuda: %s\n", err);
        return 1;
    }
    const mkv_forward_t fw = mkv_cuda_forward(f);
    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cfg;
    const int fp16 = !strcmp(cache_mode, "fp16");
    if (fp16) {
        base.hi_format = base.lo_format = MKV_FORMAT_K16V16;
        base.alpha_h = base.alpha_l = 0.0f;
    }
    base.max_seqs = batch;
    base.max_seq_len = max_len;
    base.backend = MKV_BACKEND_CUDA;
    /* the baseline keeps no scores, as a plain paged engine (decision 60) */
    base.flags = MKV_CACHE_ASYNC_STEPS | (fp16 ? MKV_CACHE_NO_SCORES : 0u);
    mkv_model_config_cache(&mc, &base, &cfg);
    int32_t tpp;
    if (mkv_page_bytes_for(cfg.hi_format, cfg.head_dim, 0, 0, 16, &cfg.page_bytes) != MKV_STATUS_OK ||
        mkv_tokens_per_page(cfg.hi_format, cfg.head_dim, 0, 0, cfg.page_bytes, &tpp) != MKV_STATUS_OK) {
        fprintf(stderr, "bench_forward_cuda: %s\n", mkv_last_error());
        return 1;
    }
    cfg.pool_pages = (int64_t)batch * cfg.n_layers * cfg.n_kv_heads * (max_len / tpp + 2);
    mkv_cache_t *cache = NULL;
    if (mkv_cache_create(&cfg, &cache) != MKV_STATUS_OK) {
        fprintf(stderr, "bench_forward_cuda: %s\n", mkv_last_error());
        return 1;
    }
    printf("bench_forward_cuda on %s: %s shape (L %d, D %d, heads %d/%d, d %d, I %d, V %d), %s weights "
           "(stand-ins), %s cache; copy %.0f GB/s, square %s GEMM %.0f TFLOP/s\n",
           prop.name, config ? config : shape, mc.n_layers, mc.hidden, mc.n_heads, mc.n_kv_heads, mc.head_dim,
           mc.intermediate, mc.vocab, mkv_dtype_name(dtype), cache_mode, copy * 1e-9, mkv_dtype_name(dtype), gemm);
    fflush(stdout);

    /* prefill, one prompt at a time */
    int32_t *prompt = malloc((size_t)context * sizeof(int32_t)), *slots = malloc((size_t)batch * sizeof(int32_t));
    int32_t *next = malloc((size_t)batch * sizeof(int32_t));
    float *last = malloc((size_t)mc.vocab * sizeof(float));
    uint64_t rng = seed;
    mkv_cuda_forward_set_timing(f, 1); /* the prefill's GEMM time, apart */
    const double p0 = now_s();
    for (int32_t j = 0; j < batch; j++) {
        for (int32_t t = 0; t < context; t++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            prompt[t] = (int32_t)((rng >> 33) % (uint64_t)mc.vocab);
        }
        if (mkv_cache_admit(cache, context, &slots[j]) != MKV_STATUS_OK ||
            fw.prefill(fw.ctx, cache, slots[j], prompt, context, NULL, last) != MKV_STATUS_OK) {
            fprintf(stderr, "bench_forward_cuda: prefill %d: %s\n", j, mkv_last_error());
            return 1;
        }
        next[j] = (int32_t)(j % mc.vocab);
    }
    const double prefill_s = now_s() - p0;
    double pph[MKV_CUDA_PHASES];
    mkv_cuda_forward_phases(f, pph, 1);
    mkv_cuda_forward_set_timing(f, 0);
    const double D = mc.hidden, I = mc.intermediate, QD = (double)mc.n_heads * mc.head_dim;
    const double KD = (double)mc.n_kv_heads * mc.head_dim;
    const double matmul_params = mc.n_layers * (D * QD * 2 + D * KD * 2 + 3 * D * I);
    const double prefill_tflops = 2.0 * matmul_params * (double)batch * context / prefill_s * 1e-12;
    /* the projections' GEMMs alone (the events' GEMM phase; lm_head's one row is in the head) */
    const double prefill_gemm_tflops = 2.0 * matmul_params * (double)batch * context /
                                       (pph[MKV_CUDA_PHASE_GEMM] * 1e-3) * 1e-12;

    /* decode steps, in turn: logits left on the device, copied to the host, greedy picks only,
     * and logits left on the device with the phase events on (the breakdown: the events cost
     * time of their own, so these steps are not the ones timed) */
    double *t_host = malloc((size_t)steps * sizeof(double)), *t_dev = malloc((size_t)steps * sizeof(double));
    double *t_greedy = malloc((size_t)steps * sizeof(double)), *t_events = malloc((size_t)steps * sizeof(double));
    float *logits = malloc((size_t)batch * mc.vocab * sizeof(float));
    for (int32_t s = 0; s < 4 * steps + 1; s++) {
        CK(cudaDeviceSynchronize());
        const double t0 = now_s();
        const int kind = s == 0 ? 0 : (s - 1) % 4;
        mkv_cuda_forward_set_timing(f, s > 0 && kind == 3);
        const mkv_status_t ds = kind == 2 ? fw.decode_greedy(fw.ctx, cache, batch, slots, next, next)
                                          : fw.decode(fw.ctx, cache, batch, slots, next, kind == 1 ? logits : NULL);
        if (ds != MKV_STATUS_OK) {
            fprintf(stderr, "bench_forward_cuda: decode step %d: %s\n", s, mkv_last_error());
            return 1;
        }
        CK(cudaDeviceSynchronize());
        const double dt = now_s() - t0;
        if (s == 0) continue; /* warm-up */
        (kind == 0 ? t_dev : kind == 1 ? t_host : kind == 2 ? t_greedy : t_events)[(s - 1) / 4] = dt;
    }
    /* greedy steps again, through CUDA graphs (the first captures) */
    double *t_graph = malloc((size_t)steps * sizeof(double)), step_graph = 0.0;
    int64_t g_captures = 0, g_updates = 0, g_launches = 0;
    mkv_cuda_forward_set_timing(f, 0); /* the last timed step left the events on */
    if (graphs > 0) {
        if (mkv_cuda_forward_set_graphs(f, 1, graphs) != MKV_STATUS_OK) {
            fprintf(stderr, "bench_forward_cuda: %s\n", mkv_last_error());
            return 1;
        }
        for (int32_t s = 0; s < steps + 1; s++) {
            CK(cudaDeviceSynchronize());
            const double t0 = now_s();
            if (fw.decode_greedy(fw.ctx, cache, batch, slots, next, next) != MKV_STATUS_OK) {
                fprintf(stderr, "bench_forward_cuda: graph step %d: %s\n", s, mkv_last_error());
                return 1;
            }
            CK(cudaDeviceSynchronize());
            if (s > 0) t_graph[s - 1] = now_s() - t0;
        }
        step_graph = median(t_graph, steps);
        mkv_cuda_forward_graph_stats(f, &g_captures, &g_updates, &g_launches);
        mkv_cuda_forward_set_graphs(f, 0, 0);
    }
    if (mkv_cache_sync(cache, NULL) != MKV_STATUS_OK) {
        fprintf(stderr, "bench_forward_cuda: %s\n", mkv_cache_last_error(cache));
        return 1;
    }
    const double step_dev = median(t_dev, steps), step_host = median(t_host, steps);
    const double step_greedy = median(t_greedy, steps), step_events = median(t_events, steps);
    const double samp_top_p = sample_ms(batch, mc.vocab, 0.8f, 0.9f, seed);
    const double samp_full = sample_ms(batch, mc.vocab, 0.8f, 1.0f, seed);
    const double samp_greedy = sample_ms(batch, mc.vocab, 0.0f, 1.0f, seed);
    double ph[MKV_CUDA_PHASES];
    mkv_cuda_forward_phases(f, ph, 1);
    for (int i = 0; i < MKV_CUDA_PHASES; i++) ph[i] /= steps; /* per step */
    mkv_cache_stats_t st;
    mkv_cache_stats(cache, &st);
    /* the KV a step reads: every stored token's key and value, fp16 */
    const double kv_bytes = fp16 ? (double)batch * (context + 2.0 * steps) * mc.n_layers * KD * 2 * 2 : 0.0;
    const double weight_bytes = (double)mkv_cuda_forward_weight_bytes(f);
    const double roof = (weight_bytes + kv_bytes) / copy;
    printf("%6s %8s %12s %12s %14s %14s %14s %12s %10s\n", "batch", "context", "prefill s", "prefill TF/s",
           "step ms (dev)", "step ms (host)", "step (greedy)", "roofline ms", "step/roof");
    printf("%6d %8d %12.2f %12.1f %14.3f %14.3f %14.3f %12.3f %10.2f\n", batch, context, prefill_s,
           prefill_tflops, step_dev * 1e3, step_host * 1e3, step_greedy * 1e3, fp16 ? roof * 1e3 : 0.0,
           fp16 ? step_dev / roof : 0.0);
    if (graphs > 0)
        printf("greedy steps through CUDA graphs (horizon %d): %.3f ms (eager %.3f); %lld captures (%lld updated "
               "in place), %lld launches\n",
               graphs, step_graph * 1e3, step_greedy * 1e3, (long long)g_captures, (long long)g_updates,
               (long long)g_launches);
    printf("a step with the phase events on, %.3f ms (mean, ms): GEMMs %.3f, attention (cache layer calls) %.3f, cache steps %.3f, "
           "norms/RoPE/SiLU %.3f, head %.3f\n",
           step_events * 1e3, ph[MKV_CUDA_PHASE_GEMM], ph[MKV_CUDA_PHASE_ATTENTION], ph[MKV_CUDA_PHASE_CACHE],
           ph[MKV_CUDA_PHASE_OTHER], ph[MKV_CUDA_PHASE_HEAD]);
    printf("prefill: GEMMs %.0f TFLOP/s (%.0f%% of the square GEMM; %.2f of %.2f s), attention %.2f s, "
           "the rest %.2f s\n",
           prefill_gemm_tflops, 100.0 * prefill_gemm_tflops / gemm, pph[MKV_CUDA_PHASE_GEMM] * 1e-3, prefill_s,
           pph[MKV_CUDA_PHASE_ATTENTION] * 1e-3,
           (pph[MKV_CUDA_PHASE_CACHE] + pph[MKV_CUDA_PHASE_OTHER] + pph[MKV_CUDA_PHASE_HEAD]) * 1e-3);
    printf("prefill matmuls over the whole pass at %.0f%% of the square GEMM; output tokens/s %.0f (greedy on the device); "
           "cache: %lld pages in use of %lld\n",
           100.0 * prefill_tflops / gemm, batch / step_greedy, (long long)(st.total_pages - st.free_pages),
           (long long)st.total_pages);
    printf("sampling on the device (%d rows of %d logits, uniform in [-8, 8), T 0.8): top-p 0.9 %.3f ms, "
           "no top-p %.3f ms, greedy %.3f ms\n",
           batch, mc.vocab, samp_top_p, samp_full, samp_greedy);
    if (json) {
        FILE *jf = fopen(json, "w");
        if (!jf) {
            fprintf(stderr, "bench_forward_cuda: cannot write %s\n", json);
            return 2;
        }
        fprintf(jf,
                "{\"format\": \"mixkv-bench-forward-cuda\", \"version\": 1, \"device\": \"%s\", \"shape\": \"%s\", "
                "\"dtype\": \"%s\", \"cache\": \"%s\", \"weights\": \"stand-ins\", \"copy_gbps\": %.1f, "
                "\"square_gemm_tflops\": %.1f, \"batch\": %d, \"context\": %d, \"steps\": %d, "
                "\"prefill_s\": %.4f, \"prefill_matmul_tflops\": %.2f, \"prefill_gemm_fraction\": %.4f, "
                "\"prefill_gemm_only_tflops\": %.2f, \"prefill_gemm_only_fraction\": %.4f, "
                "\"prefill_phases_s\": {\"gemm\": %.4f, \"attention\": %.4f, \"cache\": %.4f, \"other\": %.4f, "
                "\"head\": %.4f}, "
                "\"step_ms_device\": %.4f, \"step_ms_with_logits\": %.4f, \"step_ms_greedy\": %.4f, "
                "\"step_ms_with_events\": %.4f, \"graph_horizon\": %d, \"step_ms_greedy_graph\": %.4f, "
                "\"graph_captures\": %lld, \"graph_launches\": %lld, "
                "\"weight_bytes\": %.0f, "
                "\"kv_bytes\": %.0f, \"roofline_ms\": %.4f, \"step_over_roofline\": %.4f, "
                "\"output_tokens_per_s\": %.1f, \"step_phases_ms\": {\"gemm\": %.4f, \"attention\": %.4f, "
                "\"cache\": %.4f, \"other\": %.4f, \"head\": %.4f}, "
                "\"sample_ms\": {\"top_p\": %.4f, \"no_top_p\": %.4f, \"greedy\": %.4f}}\n",
                prop.name, config ? config : shape, mkv_dtype_name(dtype), cache_mode, copy * 1e-9, gemm, batch,
                context, steps, prefill_s, prefill_tflops, prefill_tflops / gemm, prefill_gemm_tflops,
                prefill_gemm_tflops / gemm, pph[MKV_CUDA_PHASE_GEMM] * 1e-3, pph[MKV_CUDA_PHASE_ATTENTION] * 1e-3,
                pph[MKV_CUDA_PHASE_CACHE] * 1e-3, pph[MKV_CUDA_PHASE_OTHER] * 1e-3, pph[MKV_CUDA_PHASE_HEAD] * 1e-3,
                step_dev * 1e3,
                step_host * 1e3, step_greedy * 1e3, step_events * 1e3, graphs, step_graph * 1e3,
                (long long)g_captures, (long long)g_launches, weight_bytes, kv_bytes, fp16 ? roof * 1e3 : 0.0,
                fp16 ? step_dev / roof : 0.0, batch / step_greedy, ph[MKV_CUDA_PHASE_GEMM],
                ph[MKV_CUDA_PHASE_ATTENTION], ph[MKV_CUDA_PHASE_CACHE], ph[MKV_CUDA_PHASE_OTHER],
                ph[MKV_CUDA_PHASE_HEAD], samp_top_p, samp_full, samp_greedy);
        fclose(jf);
    }
    free(prompt), free(slots), free(next), free(last), free(t_host), free(t_dev), free(t_greedy), free(t_events), free(t_graph), free(logits);
    mkv_cache_destroy(cache);
    mkv_cuda_forward_free(f);
    return 0;
}
