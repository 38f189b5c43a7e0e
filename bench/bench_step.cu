/*
 * bench_step.cu — one decode step's cache work on the CUDA backend at Llama-3-8B's geometry
 * (32 layers, 8 KV heads, G 4, d 128, K8V4 / K4V2, default groups, pages of 32 high tokens),
 * through the public API with MKV_CACHE_ASYNC_STEPS, for batches x contexts:
 *   append     mkv_cache_append (the memory manager's batched allocation)
 *   decode     32 x mkv_cache_decode_layer_ex (conversion, plan, quantize-and-append, attention)
 *   attention  32 x the attention kernel alone (attention/decode_cuda.h) on the same regions
 *   compress   mkv_cache_compress (Algorithm 1, moves, resize, demotions)
 * and the overhead: (append + decode - attention + compress) / attention. Times are CUDA
 * events around each part (no host synchronisation inside a step), median of --reps steps
 * after a warm-up step. Each head-region holds a mix: the most recent half of its positions
 * high, the oldest 30% low, the rest pruned, with significances around the thresholds (so
 * Algorithm 1 keeps, demotes and prunes). Pools are filled on the device; values do not
 * change the timing. JSON ("mixkv-bench-step", docs/results-schema.md) and a table.
 */
#include "attention/decode_cuda.h"
#include "memmgr/cache.h"
#include "memmgr/cuda_mm.h"
#include "quant/format.h"
#include "mixkv.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "bench_step: %s: %s\n", #x, cudaGetErrorString(e_));                \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#define MK(c, x)                                                                               \
    do {                                                                                       \
        mkv_status_t s_ = (x);                                                                 \
        if (s_ != MKV_STATUS_OK) {                                                             \
            fprintf(stderr, "bench_step: %s: %s: %s\n", #x, mkv_status_string(s_),             \
                    (c) ? mkv_cache_last_error(c) : mkv_last_error());                         \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

enum { L = 32, H = 8, G = 4, D = 128 };

static __device__ uint32_t mix32(int64_t i, uint32_t seed)
{
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    return x ^ (x >> 13);
}

static __global__ void fill_bytes(uint8_t *pool, int64_t bytes, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < bytes / 4;
         i += (int64_t)gridDim.x * blockDim.x)
        ((uint32_t *)pool)[i] = mix32(i, seed) & 0x37ff37ffu; /* fp16 pairs in [0, 0.5) */
}

static __global__ void f16_to_f32(const uint16_t *x, int64_t n, float *y)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __half2float(__ushort_as_half(x[i]));
}

static __global__ void fill_f16(uint16_t *x, int64_t n, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = (uint16_t)(mix32(i, seed) & 0x3bffu); /* [0, 1) */
}

/* Positions and significances of every stored token: high tokens hold the most recent
 * positions (the window included), low tokens the oldest; significance alpha / N times a
 * factor in [0.25, 4), around both thresholds. */
struct token_fill {
    uint8_t *pool;
    int64_t page_bytes;
    const int32_t *table, *n_hi, *n_lo;
    int32_t T, N;
    int64_t regions;
    mkv_page_layout_t lay[2];
    float alpha_h;
};

static __global__ void fill_tokens(const __grid_constant__ token_fill f)
{
    for (int64_t r = blockIdx.x; r < f.regions; r += gridDim.x) {
        const int32_t n[2] = {f.n_hi[r], f.n_lo[r]};
        for (int sec = 0; sec < 2; sec++) {
            const mkv_page_layout_t *lay = &f.lay[sec];
            for (int32_t k = threadIdx.x; k < n[sec]; k += blockDim.x) {
                const int32_t page = sec ? f.table[r * f.T + f.T - 1 - k / lay->tokens] : f.table[r * f.T + k / lay->tokens];
                const int32_t slot = k % lay->tokens;
                uint8_t *p = f.pool + (int64_t)page * f.page_bytes;
                const int32_t pos = sec ? k : f.N - n[0] + k;
                const float factor = 0.25f + 3.75f * (float)(mix32(r * 65536 + k * 2 + sec, 7u) >> 8) / 16777216.0f;
                const float score = (float)(f.N - pos) * f.alpha_h / (float)f.N * factor;
                memcpy(p + mkv_pos_offset(lay, slot), &pos, 4);
                memcpy(p + mkv_score_offset(lay, slot), &score, 4);
            }
        }
    }
}

static __global__ void empty_kernel() {}

struct row {
    int32_t batch, context;
    double append_us, decode_us, attention_us, compress_us, overhead_pct, decode_host_us;
    int64_t pool_bytes;
    /* the floor below which work outside attention cannot go (docs/results.md): */
    int64_t attention_bytes, policy_bytes; /* what attention reads; score + position of every high token */
    double launches_us;                    /* 32 empty launches, one per layer's token write */
    double floor_pct;                      /* (launches + policy bytes at the copy rate) / attention */
    double attention_copy_fraction;        /* attention bytes / time / copy rate */
};

/* Bytes the attention reads per token of a layout: codes, metadata and the score word. */
static int64_t token_read_bytes(const mkv_page_layout_t *lay)
{
    int64_t b = 4;
    const mkv_vec_layout_t *sides[2] = {&lay->key, &lay->value};
    for (const mkv_vec_layout_t *v : sides) b += v->vec_bytes + (v->bits == 16 ? 0 : 4 * (int64_t)v->groups);
    return b;
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

static bool run(int32_t B, int32_t ctx, int reps, double max_gib, double copy_rate, row *out)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = L, cfg.n_kv_heads = H, cfg.group_size = G, cfg.head_dim = D;
    cfg.max_seqs = B;
    cfg.max_seq_len = ctx + reps + 8;
    cfg.backend = MKV_BACKEND_CUDA;
    cfg.flags = MKV_CACHE_ASYNC_STEPS;
    int32_t tpp_hi, tpp_lo;
    int64_t page_bytes;
    MK(NULL, mkv_page_bytes_for(cfg.hi_format, D, 0, 0, 32, &page_bytes));
    MK(NULL, mkv_tokens_per_page(cfg.hi_format, D, 0, 0, page_bytes, &tpp_hi));
    MK(NULL, mkv_tokens_per_page(cfg.lo_format, D, 0, 0, page_bytes, &tpp_lo));
    const int32_t n_hi = ctx / 2, n_lo = ctx * 3 / 10;
    /* room for the mix, the steps' growth and one spare page per section */
    const int64_t per_region = (n_hi + reps + 8) / tpp_hi + 2 + (n_lo + reps + 8) / tpp_lo + 2;
    cfg.page_bytes = page_bytes;
    cfg.pool_pages = (int64_t)B * L * H * per_region;
    const double gib = (double)cfg.pool_pages * page_bytes / (1u << 30);
    if (gib > max_gib) return false;
    mkv_cache_t *c = NULL;
    MK(c, mkv_cache_create(&cfg, &c));
    std::vector<int32_t> slots(B), lens(B, ctx), th((size_t)B * L * H, n_hi), tl((size_t)B * L * H, n_lo);
    for (int32_t j = 0; j < B; j++) MK(c, mkv_cache_admit(c, 1, &slots[j]));
    int32_t *d_th, *d_tl;
    CK(cudaMalloc(&d_th, th.size() * 4));
    CK(cudaMalloc(&d_tl, tl.size() * 4));
    CK(cudaMemcpy(d_th, th.data(), th.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tl, tl.data(), tl.size() * 4, cudaMemcpyHostToDevice));
    const mkv_resize_t rz = {B, slots.data(), lens.data(), d_th, d_tl};
    MK(c, mkv_cache_resize(c, &rz, NULL));
    mkv_cuda_mm_view_t v;
    mkv_cuda_mm_get_view(c->dev, &v);
    fill_bytes<<<4096, 256>>>(v.pool, cfg.pool_pages * page_bytes, 1u);
    token_fill f;
    f.pool = v.pool, f.page_bytes = page_bytes, f.table = v.table, f.n_hi = v.n_hi, f.n_lo = v.n_lo;
    f.T = c->st.g.row_entries, f.N = ctx, f.regions = (int64_t)B * L * H, f.alpha_h = cfg.alpha_h;
    MK(c, mkv_page_layout(cfg.hi_format, D, 0, 0, page_bytes, &f.lay[0], NULL));
    MK(c, mkv_page_layout(cfg.lo_format, D, 0, 0, page_bytes, &f.lay[1], NULL));
    fill_tokens<<<4096, 256>>>(f);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());

    /* inputs and the attention-only call's own buffers */
    const int64_t nq = (int64_t)B * H * G * D, nkv = (int64_t)B * H * D;
    uint16_t *q, *k, *vv, *o;
    float *q32, *o32;
    int64_t *regions;
    CK(cudaMalloc(&q, nq * 2));
    CK(cudaMalloc(&k, nkv * 2));
    CK(cudaMalloc(&vv, nkv * 2));
    CK(cudaMalloc(&o, nq * 2));
    CK(cudaMalloc(&q32, nq * 4));
    CK(cudaMalloc(&o32, nq * 4));
    CK(cudaMalloc(&regions, (size_t)L * B * H * 8));
    fill_f16<<<1024, 256>>>(q, nq, 3u);
    fill_f16<<<1024, 256>>>(k, nkv, 4u);
    fill_f16<<<1024, 256>>>(vv, nkv, 5u);
    f16_to_f32<<<1024, 256>>>(q, nq, q32); /* the same queries as the decode calls' */
    std::vector<int64_t> hreg((size_t)L * B * H);
    for (int32_t l = 0; l < L; l++)
        for (int32_t j = 0; j < B; j++)
            for (int32_t h = 0; h < H; h++)
                hreg[((size_t)l * B + j) * H + h] = ((int64_t)slots[j] * L + l) * H + h;
    CK(cudaMemcpy(regions, hreg.data(), hreg.size() * 8, cudaMemcpyHostToDevice));
    mkv_cuda_decode_t da;
    memset(&da, 0, sizeof da);
    da.pool = v.pool, da.page_bytes = page_bytes, da.lay_hi = f.lay[0], da.lay_lo = f.lay[1];
    da.table = v.table, da.n_hi = v.n_hi, da.n_lo = v.n_lo, da.row_entries = f.T;
    da.n_seq = B, da.n_heads = H, da.group_size = G, da.head_dim = D;
    da.max_tokens = cfg.max_seq_len;
    da.q = q32, da.out = o32, da.softmax_scale = 1.0f / sqrtf((float)D);
    const size_t wsb = mkv_cuda_decode_workspace_size(B, H, G, D, da.max_tokens, 0);
    CK(cudaMalloc(&da.workspace, wsb));

    cudaEvent_t ev[6];
    for (int i = 0; i < 6; i++) CK(cudaEventCreate(&ev[i]));
    std::vector<double> ta, td, tat, tc, thost, tlaunch;
    char err[MKV_ERR_LEN];
    for (int rep = 0; rep <= reps; rep++) {
        CK(cudaEventRecord(ev[0]));
        MK(c, mkv_cache_append(c, B, slots.data(), NULL));
        CK(cudaEventRecord(ev[1]));
        const auto h0 = std::chrono::steady_clock::now();
        for (int32_t l = 0; l < L; l++)
            MK(c, mkv_cache_decode_layer_ex(c, B, slots.data(), l, MKV_DTYPE_F16, q, k, vv, o, NULL));
        const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count();
        CK(cudaEventRecord(ev[2]));
        MK(c, mkv_cache_compress(c, B, slots.data(), NULL));
        CK(cudaEventRecord(ev[3]));
        for (int32_t l = 0; l < L; l++) {
            da.regions = regions + (size_t)l * B * H;
            if (mkv_cuda_decode(&da, NULL, err) != MKV_STATUS_OK) {
                fprintf(stderr, "bench_step: attention: %s\n", err);
                exit(1);
            }
        }
        CK(cudaEventRecord(ev[4]));
        /* the launch floor: as many empty kernels as layers, with the token write's grid */
        const unsigned blocks = (unsigned)((2 * B * H + 3) / 4);
        for (int32_t l = 0; l < L; l++) empty_kernel<<<blocks, 128>>>();
        CK(cudaEventRecord(ev[5]));
        MK(c, mkv_cache_sync(c, NULL));
        float ms[5];
        for (int i = 0; i < 5; i++) CK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
        if (rep == 0) continue; /* warm-up */
        ta.push_back(ms[0] * 1e3), td.push_back(ms[1] * 1e3), tc.push_back(ms[2] * 1e3);
        tat.push_back(ms[3] * 1e3);
        thost.push_back(host_us);
        tlaunch.push_back(ms[4] * 1e3);
    }
    out->batch = B, out->context = ctx;
    out->append_us = median(ta), out->decode_us = median(td), out->compress_us = median(tc);
    out->attention_us = median(tat);
    out->decode_host_us = median(thost);
    out->overhead_pct = 100.0 * (out->append_us + out->decode_us - out->attention_us + out->compress_us) /
                        out->attention_us;
    out->pool_bytes = cfg.pool_pages * page_bytes;
    const int64_t n_regions = (int64_t)B * L * H;
    out->attention_bytes = n_regions * ((int64_t)n_hi * token_read_bytes(&f.lay[0]) +
                                      (int64_t)n_lo * token_read_bytes(&f.lay[1]));
    out->policy_bytes = n_regions * (int64_t)n_hi * 8;
    out->launches_us = median(tlaunch);
    out->floor_pct = 100.0 * (out->launches_us + out->policy_bytes / copy_rate * 1e6) / out->attention_us;
    out->attention_copy_fraction = out->attention_bytes / (out->attention_us * 1e-6) / copy_rate;
    for (int i = 0; i < 6; i++) cudaEventDestroy(ev[i]);
    cudaFree(q), cudaFree(k), cudaFree(vv), cudaFree(o), cudaFree(q32), cudaFree(o32);
    cudaFree(regions), cudaFree(da.workspace), cudaFree(d_th), cudaFree(d_tl);
    mkv_cache_destroy(c);
    return true;
}

static std::vector<int32_t> parse_list(const char *s)
{
    std::vector<int32_t> v;
    while (*s) {
        v.push_back((int32_t)strtol(s, (char **)&s, 10));
        if (*s == ',') s++;
        else if (*s) break;
    }
    return v;
}

int main(int argc, char **argv)
{
    std::vector<int32_t> batches = {1, 8, 64, 256}, contexts = {1024, 4096, 16384, 32768};
    int reps = 7;
    double max_gib = 56.0;
    const char *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batches") && i + 1 < argc) batches = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--contexts") && i + 1 < argc) contexts = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-gib") && i + 1 < argc) max_gib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else {
            fprintf(stderr, "usage: bench_step [--batches 1,8,64,256] [--contexts 1024,4096,16384,32768]\n"
                            "                  [--reps N] [--max-gib X] [--json FILE]\n"
                            "One decode step's cache work at Llama-3-8B geometry on the CUDA backend.\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (reps < 1) reps = 1;
    FILE *jf = NULL;
    if (json_path && !(jf = fopen(json_path, "w"))) {
        fprintf(stderr, "bench_step: cannot write %s\n", json_path);
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    /* The device-to-device copy rate (read + write bytes per second) of a 1 GiB buffer. */
    double copy_rate;
    {
        const size_t bytes = (size_t)1 << 30;
        void *a, *b;
        CK(cudaMalloc(&a, bytes));
        CK(cudaMalloc(&b, bytes));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<double> t;
        for (int i = 0; i < 6; i++) {
            CK(cudaEventRecord(e0));
            CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (i > 0) t.push_back(ms * 1e-3);
        }
        copy_rate = 2.0 * (double)bytes / median(t);
        cudaEventDestroy(e0), cudaEventDestroy(e1), cudaFree(a), cudaFree(b);
    }
    printf("bench_step on %s: Llama-3-8B geometry (L 32, H 8, G 4, d 128), K8V4/K4V2, 50%% high / 30%% low / "
           "20%% pruned, median of %d steps (us)\n",
           prop.name, reps);
    printf("copy rate %.0f GB/s; floor%%: 32 empty launches + every high token's score and position read at the "
           "copy rate, over attention; attn/copy: attention's bytes per second over the copy rate\n",
           copy_rate * 1e-9);
    printf("%6s %7s %9s %11s %11s %9s %10s %12s %7s %9s\n", "batch", "context", "append", "decode-attn", "attention",
           "compress", "overhead%", "decode-host", "floor%", "attn/copy");
    std::vector<row> rows;
    for (int32_t B : batches)
        for (int32_t ctx : contexts) {
            row r;
            if (!run(B, ctx, reps, max_gib, copy_rate, &r)) {
                printf("%6d %7d   (skipped: the pool would exceed %.0f GiB)\n", B, ctx, max_gib);
                continue;
            }
            printf("%6d %7d %9.1f %11.1f %11.1f %9.1f %10.2f %12.1f %7.2f %9.2f\n", B, ctx, r.append_us,
                   r.decode_us - r.attention_us, r.attention_us, r.compress_us, r.overhead_pct, r.decode_host_us,
                   r.floor_pct, r.attention_copy_fraction);
            fflush(stdout);
            rows.push_back(r);
        }
    if (jf) {
        fprintf(jf, "{\n  \"format\": \"mixkv-bench-step\",\n  \"version\": 2,\n  \"device\": \"%s\",\n"
                    "  \"copy_gbps\": %.1f,\n", prop.name, copy_rate * 1e-9);
        fprintf(jf, "  \"geometry\": {\"layers\": %d, \"kv_heads\": %d, \"group\": %d, \"head_dim\": %d, "
                    "\"formats\": \"K8V4/K4V2\", \"mix\": \"50/30/20\"},\n  \"reps\": %d,\n  \"rows\": [\n",
                L, H, G, D, reps);
        for (size_t i = 0; i < rows.size(); i++) {
            const row &r = rows[i];
            fprintf(jf, "    {\"batch\": %d, \"context\": %d, \"append_us\": %.2f, \"decode_us\": %.2f, "
                        "\"attention_us\": %.2f, \"compress_us\": %.2f, \"overhead_pct\": %.3f, "
                        "\"decode_host_us\": %.2f, \"pool_bytes\": %lld, \"attention_bytes\": %lld, "
                        "\"policy_bytes\": %lld, \"launches_us\": %.2f, \"floor_pct\": %.3f, "
                        "\"attention_copy_fraction\": %.4f}%s\n",
                    r.batch, r.context, r.append_us, r.decode_us, r.attention_us, r.compress_us,
                    r.overhead_pct, r.decode_host_us, (long long)r.pool_bytes, (long long)r.attention_bytes,
                    (long long)r.policy_bytes, r.launches_us, r.floor_pct, r.attention_copy_fraction,
                    i + 1 < rows.size() ? "," : "");
        }
        fprintf(jf, "  ]\n}\n");
        fclose(jf);
    }
    return 0;
}
