/*
 * bench_prefill.cu — the GPU prefill (attention/prefill_cuda.h) at Llama-3-8B's heads (32 query,
 * 8 KV, d 128), fp16 out: one sequence each of 1K .. 32K tokens and a batch of 8 x 4K, with
 * obs_window 64 (the library's default: the column pass is cheap) and 0 (every query observes:
 * about one more Q K^T). Time: CUDA events around one call, median of --reps after two
 * warm-ups, L2 flushed (a 256 MiB memset) before every repetition. TFLOP/s count the causal
 * forward only, 4 * n^2 / 2 * d * Hq per sequence (as FlashAttention reports), so that they
 * compare directly with scripts/sdpa_prefill_reference.py on the same shapes; the significance
 * pass is extra work on top. JSON ("mixkv-bench-prefill", --json) and a table.
 *
 * Inputs are pseudo-random fp16 in [-1, 1); correctness is tests/gpu/test_prefill_cuda.c's.
 */
#include "attention/prefill_cuda.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "bench_prefill: %s: %s\n", #x, cudaGetErrorString(e_));             \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static __global__ void fill_kernel(uint16_t *x, int64_t n, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        const float f = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
        x[i] = __half_as_ushort(__float2half_rn(f));
    }
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct point {
    int batch, length;
};

int main(int argc, char **argv)
{
    const int H = 8, G = 4, d = 128;
    int reps = 10;
    const char *json_path = NULL;
    std::vector<point> points = {{1, 1024}, {1, 2048}, {1, 4096}, {1, 8192}, {1, 16384}, {1, 32768}, {8, 4096}};
    std::vector<int> windows = {64, 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--length") && i + 1 < argc) points = {{1, atoi(argv[++i])}};
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
            const int b = atoi(argv[++i]);
            for (point &p : points) p.batch = b;
        } else if (!strcmp(argv[i], "--obs-window") && i + 1 < argc) windows = {atoi(argv[++i])};
        else {
            fprintf(stderr, "usage: bench_prefill [--reps N] [--json FILE] [--length N] [--batch B] "
                            "[--obs-window W]\n");
            return strcmp(argv[i], "-h") && strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (reps < 1) reps = 1;
    FILE *jf = json_path ? (strcmp(json_path, "-") ? fopen(json_path, "w") : stdout) : NULL;
    if (json_path && !jf) {
        fprintf(stderr, "bench_prefill: cannot write %s\n", json_path);
        return 2;
    }

    int64_t max_total = 0;
    for (const point &p : points) max_total = std::max(max_total, (int64_t)p.batch * p.length);
    const int64_t nq = max_total * H * G * d, nk = max_total * H * d;
    uint16_t *q, *k, *v;
    void *out, *ws;
    float *sig;
    int32_t *starts;
    uint8_t *flush;
    const size_t ws_bytes = mkv_cuda_prefill_workspace_size((int32_t)max_total, H, G, d);
    CK(cudaMalloc((void **)&q, sizeof(uint16_t) * (size_t)nq));
    CK(cudaMalloc((void **)&k, sizeof(uint16_t) * (size_t)nk));
    CK(cudaMalloc((void **)&v, sizeof(uint16_t) * (size_t)nk));
    CK(cudaMalloc(&out, sizeof(uint16_t) * (size_t)nq));
    CK(cudaMalloc((void **)&sig, sizeof(float) * (size_t)(max_total * H)));
    CK(cudaMalloc(&ws, ws_bytes));
    CK(cudaMalloc((void **)&starts, sizeof(int32_t) * 65));
    CK(cudaMalloc((void **)&flush, (size_t)256 << 20));
    fill_kernel<<<1024, 256>>>(q, nq, 1u);
    fill_kernel<<<1024, 256>>>(k, nk, 2u);
    fill_kernel<<<1024, 256>>>(v, nk, 3u);
    CK(cudaGetLastError());
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cudaDeviceProp prop;
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));

    printf("%s: prefill, %d query heads, %d KV heads, d %d, fp16 in and out, median of %d\n", prop.name, H * G, H,
           d, reps);
    printf("%6s %7s %5s %10s %9s\n", "batch", "length", "obs", "time_ms", "TFLOP/s");
    if (jf)
        fprintf(jf, "{\n \"schema\": \"mixkv-bench-prefill\", \"schema_version\": 1, \"device\": \"%s\",\n"
                    " \"heads\": %d, \"group_size\": %d, \"head_dim\": %d, \"out_dtype\": \"f16\", \"reps\": %d,\n"
                    " \"flops\": \"4 * n^2 / 2 * d * Hq per sequence (causal forward)\",\n \"results\": [",
                prop.name, H, G, d, reps);
    int first = 1;
    for (const point &p : points) {
        if (p.batch > 64) {
            fprintf(stderr, "bench_prefill: batch %d (at most 64)\n", p.batch);
            return 2;
        }
        std::vector<int32_t> hs(p.batch + 1);
        for (int j = 0; j <= p.batch; j++) hs[j] = j * p.length;
        CK(cudaMemcpy(starts, hs.data(), sizeof(int32_t) * hs.size(), cudaMemcpyHostToDevice));
        for (int w : windows) {
            mkv_cuda_prefill_t a = {};
            a.n_seq = p.batch, a.seq_start = starts, a.total_tokens = p.batch * p.length, a.max_len = p.length;
            a.n_heads = H, a.group_size = G, a.head_dim = d, a.q = q, a.k = k, a.v = v, a.out = out;
            a.out_dtype = MKV_DTYPE_F16, a.softmax_scale = 0.08838834764831845f, a.obs_window = w;
            a.sig_sum = sig, a.workspace = ws;
            std::vector<double> times;
            for (int r = 0; r < reps + 2; r++) {
                CK(cudaMemsetAsync(flush, r, (size_t)256 << 20, stream));
                CK(cudaEventRecord(e0, stream));
                char err[512] = "";
                if (mkv_cuda_prefill(&a, stream, err) != MKV_STATUS_OK) {
                    fprintf(stderr, "bench_prefill: %s\n", err);
                    return 1;
                }
                CK(cudaEventRecord(e1, stream));
                CK(cudaEventSynchronize(e1));
                float ms = 0.0f;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 2) times.push_back(ms);
            }
            const double ms = median(times);
            const double flops = 4.0 * 0.5 * (double)p.length * p.length * d * (H * G) * p.batch;
            const double tflops = flops / (ms * 1e-3) / 1e12;
            printf("%6d %7d %5d %10.3f %9.1f\n", p.batch, p.length, w, ms, tflops);
            fflush(stdout);
            if (jf)
                fprintf(jf, "%s\n  {\"batch\": %d, \"length\": %d, \"obs_window\": %d, \"time_ms\": %.4f, "
                            "\"tflops\": %.2f}",
                        first ? "" : ",", p.batch, p.length, w, ms, tflops);
            first = 0;
        }
    }
    if (jf) {
        fprintf(jf, "\n ]\n}\n");
        if (jf != stdout) fclose(jf);
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(sig), cudaFree(ws), cudaFree(starts);
    cudaFree(flush);
    return 0;
}
