/*
 * bench_attention.cu — decode attention on the GPU (attention/decode_cuda.h) over batch x length
 * grids at Llama-3-8B's heads (32 query, 8 KV, d 128) for K16V16, K8V8, K8V4, K4V2 and a
 * 20/50/30 high / low / pruned mix of K8V4 / K4V2: time (CUDA events, median of --reps after a
 * warm-up, L2 flushed before every repetition), the bytes that must be read, the achieved
 * bandwidth as a fraction of the device-to-device copy rate measured in the same run, and the
 * speedup over K16V16. JSON (docs/results-schema.md, "mixkv-bench-attention") and a table.
 *
 * Pools are filled on the device with valid codes and metadata (the 32k x 256 grids hold tens of
 * GiB, far too much to quantize on the host); timing does not depend on the values. Correctness
 * is the GPU tests' business (tests/gpu/test_decode_cuda.c).
 */
#include "attention/decode_cuda.h"
#ifdef MKV_TC_TRACE
#include "attention/decode_tc.h"
#endif
#include "quant/format.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "bench_attention: %s: %s\n", #x, cudaGetErrorString(e_));           \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* A hash of the element index: pseudo-random fill without a generator state. */
static __device__ uint32_t mix32(int64_t i, uint32_t seed)
{
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    return x ^ (x >> 13);
}

static __global__ void fill_kernel(uint8_t *pool, int64_t bytes, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < bytes / 4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t x = mix32(i, seed);
        /* fp16 pairs in [0.0, 0.5): valid codes, and valid scales and zeros where metadata sits */
        ((uint32_t *)pool)[i] = x & 0x37ff37ffu;
    }
}

/* The floors' kernel: an empty one. */
static __global__ void empty_kernel(void) {}

/* Reads bytes of buf (a multiple of 16) and writes nothing unless the impossible happens:
 * evicts the L2 without leaving dirty lines behind (the read flush; a memset leaves the L2 full
 * of dirty lines, which the timed call then writes back to DRAM as it reads). */
static __global__ void read_flush_kernel(const uint4 *buf, int64_t n16, uint32_t *sink)
{
    uint32_t x = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(buf + i);
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == 0x9e3779b9u) *sink = x;
}

/* q in [-1, 1): logits that vary, so the running maxima move as in real use. */
static __global__ void q_kernel(float *q, int64_t n, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t x = mix32(i, seed);
        q[i] = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
}

/* Rows for n_seq x H regions of n_hi + n_lo tokens: distinct pages, high from the left, low
 * from the right (row_entries T). */
static __global__ void rows_kernel(int32_t *table, int64_t regions, int32_t T, int32_t k_hi, int32_t k_lo)
{
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= regions) return;
    int32_t *row = table + r * T;
    const int32_t base = (int32_t)(r * (k_hi + k_lo));
    for (int32_t e = 0; e < T; e++) row[e] = -1;
    for (int32_t k = 0; k < k_hi; k++) row[k] = base + k;
    for (int32_t k = 0; k < k_lo; k++) row[T - 1 - k] = base + k_hi + k;
}

struct variant {
    const char *name;
    mkv_format_t hi, lo;
    double frac_hi, frac_lo; /* of the sequence length */
};

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/* One (variant, batch, length) point: its page layouts and the sizes of its buffers. */
struct shape {
    mkv_page_layout_t lh, ll;
    int64_t page_bytes, regions, pages;
    int32_t n_hi, n_lo, k_hi, k_lo, T;
    size_t ws; /* the decode workspace */
};

/* The shape of variant v at batch x len (exits with the reason if its layout fails). */
static shape shape_of(const variant &v, int batch, int len, int H, int G, int d, int split, int group,
                      int page_tokens)
{
    shape s;
    char err[512] = "bench_attention: no page size for this format";
    /* Each variant's page: page_tokens (default 32) tokens of its high format, with group
     * elements per quantization group on every side (0: the library's defaults per side). */
    s.page_bytes = 0;
    if (mkv_page_bytes_for(v.hi, d, group, group, page_tokens, &s.page_bytes) != MKV_STATUS_OK ||
        mkv_page_layout(v.hi, d, group, group, s.page_bytes, &s.lh, err) != MKV_STATUS_OK ||
        mkv_page_layout(v.lo, d, group, group, s.page_bytes, &s.ll, err) != MKV_STATUS_OK) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    s.n_hi = (int32_t)(v.frac_hi * len), s.n_lo = (int32_t)(v.frac_lo * len);
    s.k_hi = (s.n_hi + s.lh.tokens - 1) / s.lh.tokens, s.k_lo = (s.n_lo + s.ll.tokens - 1) / s.ll.tokens;
    s.regions = (int64_t)batch * H, s.pages = s.regions * (s.k_hi + s.k_lo);
    s.T = s.k_hi + s.k_lo + 1;
    s.ws = mkv_cuda_decode_workspace_size(batch, H, G, d, s.n_hi + s.n_lo, split);
    return s;
}

/* Option names, indexed by mkv_cuda_decode_kernel_t, _scores_t and _logits_t. */
/* A knob's argument: auto (0), off (-1) or lo to hi; false (knob untouched) otherwise. */
static bool knob_arg(const char *x, int lo, int hi, int32_t *knob)
{
    const int n = atoi(x);
    if (!strcmp(x, "off")) *knob = -1;
    else if (!strcmp(x, "auto")) *knob = 0;
    else if (n >= lo && n <= hi) *knob = n;
    else return false;
    return true;
}

static const char *const k_kernel_names[] = {"auto", "generic", "tensor", "tensor-per-section"};
static const char *const k_scores_names[] = {"auto", "separate", "fused"};
static const char *const k_logits_names[] = {"auto", "fp32", "compact"};
static_assert(MKV_DECODE_LOGITS_FP32 == 1 && MKV_DECODE_LOGITS_COMPACT == 2, "logits names");
static_assert(MKV_DECODE_KERNEL_GENERIC == 1 && MKV_DECODE_KERNEL_TENSOR == 2 &&
                  MKV_DECODE_KERNEL_TENSOR_PER_SECTION == 3, "kernel names");
static_assert(MKV_DECODE_SCORES_SEPARATE == 1 && MKV_DECODE_SCORES_FUSED == 2, "score names");

/* The index of s in names[0 .. n), or -1. */
static int name_index(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

/* A comma-separated list of positive integers ("1,16,64") into out; false if malformed. */
static bool int_list(const char *s, std::vector<int> &out)
{
    std::vector<int> v;
    while (*s) {
        char *end;
        const long x = strtol(s, &end, 10);
        if (end == s || x < 1 || x > (1L << 30) || (*end && *end != ',')) return false;
        v.push_back((int)x);
        s = *end ? end + 1 : end;
    }
    if (v.empty()) return false;
    out = v;
    return true;
}

int main(int argc, char **argv)
{
    std::vector<int> batches = {1, 16, 64, 256}, lengths = {1024, 4096, 16384, 32768};
    int reps = 10, H = 8, G = 4, d = 128;
    const char *json_path = NULL;
    double max_gib = 0.0;
    int kernel = MKV_DECODE_KERNEL_AUTO, scores = MKV_DECODE_SCORES_AUTO, split = 0, group = 0;
    int logits = MKV_DECODE_LOGITS_AUTO;
    bool write_flush = false; /* --flush write: the L2 flushed by a memset (figures before 2026-11-26) */
    bool no_scores = false;   /* --no-scores: no score write-back (the full-precision baseline's call) */
    double spread = 0.0;      /* --spread: sequences' lengths spread below the length */
    bool hint = false;        /* --hint: the mean region as mean_tokens */
    int page_tokens = 32;     /* --page-tokens: a page's tokens of the variant's high format */
    const char *only = NULL;
    const char *trace_path = NULL; /* --trace: MKV_TC_TRACE builds, timeline stamps of one more call */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-gib") && i + 1 < argc) max_gib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--kernel") && i + 1 < argc) {
            if ((kernel = name_index(argv[++i], k_kernel_names, 4)) < 0) {
                fprintf(stderr, "bench_attention: --kernel auto, generic, tensor or tensor-per-section\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--logits") && i + 1 < argc) {
            if ((logits = name_index(argv[++i], k_logits_names, 3)) < 0) {
                fprintf(stderr, "bench_attention: --logits auto, fp32 or compact\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--scores") && i + 1 < argc) {
            if ((scores = name_index(argv[++i], k_scores_names, 3)) < 0) {
                fprintf(stderr, "bench_attention: --scores auto, separate or fused\n");
                return 2;
            }
        } else if ((!strcmp(argv[i], "--batch") || !strcmp(argv[i], "--length")) && i + 1 < argc) {
            std::vector<int> &l = argv[i][2] == 'b' ? batches : lengths;
            if (!int_list(argv[i + 1], l)) {
                fprintf(stderr, "bench_attention: %s takes positive integers, comma-separated\n", argv[i]);
                return 2;
            }
            i++;
        }
        else if (!strcmp(argv[i], "--format") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--split") && i + 1 < argc) split = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--piece-static") && i + 1 < argc) {
            if (!knob_arg(argv[++i], 1, 1000, &mkv_tc_piece_static_override)) {
                fprintf(stderr, "bench_attention: --piece-static takes auto, off or 1 to 1000\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--head") && i + 1 < argc) {
            if (!knob_arg(argv[++i], 1, 1000, &mkv_tc_head_override)) {
                fprintf(stderr, "bench_attention: --head takes auto, off or 1 to 1000\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--merge-blocks") && i + 1 < argc) {
            const char *x = argv[++i];
            const int n = atoi(x);
            if (!strcmp(x, "auto")) mkv_tc_merge_blocks_override = 0;
            else if (n >= 1 && n <= 8) mkv_tc_merge_blocks_override = n;
            else {
                fprintf(stderr, "bench_attention: --merge-blocks takes auto or 1 to 8\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--wave-blocks") && i + 1 < argc) {
            if (!knob_arg(argv[++i], 1, 4096, &mkv_tc_wave_blocks_override)) {
                fprintf(stderr, "bench_attention: --wave-blocks takes auto or 1 to 4096\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--merge-split") && i + 1 < argc) {
            if (!knob_arg(argv[++i], 1, 32, &mkv_tc_merge_split_override)) {
                fprintf(stderr, "bench_attention: --merge-split takes auto, off or 1 to 32\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--hi-item") && i + 1 < argc) {
            if (!knob_arg(argv[++i], 16, 4096, &mkv_tc_hi_item_override)) {
                fprintf(stderr, "bench_attention: --hi-item takes auto, off or 16 to 4096\n");
                return 2;
            }
        }
        else if ((!strcmp(argv[i], "--pieces") || !strcmp(argv[i], "--wave-spares")) && i + 1 < argc) {
            const bool pieces = argv[i][2] == 'p';
            const int lo = pieces ? 16 : 1, hi = pieces ? 4096 : 64;
            if (!knob_arg(argv[i + 1], lo, hi, pieces ? &mkv_tc_piece_tokens_override : &mkv_tc_wave_spares_override)) {
                fprintf(stderr, "bench_attention: %s takes auto, off or %d to %d\n", argv[i], lo, hi);
                return 2;
            }
            i++;
        }
        else if ((!strcmp(argv[i], "--ready") || !strcmp(argv[i], "--hi-align")) && i + 1 < argc) {
            const bool ready = argv[i][2] == 'r';
            const char *x = argv[++i];
            if (!strcmp(x, "auto") || !strcmp(x, "off") || !strcmp(x, "on")) {
                *(ready ? &mkv_tc_ready_override : &mkv_tc_hi_align_override) = x[1] == 'u' ? 0 : x[1] == 'f' ? -1 : 1;
            } else {
                fprintf(stderr, "bench_attention: %s takes auto, off or on\n", ready ? "--ready" : "--hi-align");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--group-size") && i + 1 < argc) group = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--flush") && i + 1 < argc && (!strcmp(argv[i + 1], "read") || !strcmp(argv[i + 1], "write")))
            write_flush = !strcmp(argv[++i], "write");
        else if (!strcmp(argv[i], "--no-scores")) no_scores = true;
        else if (!strcmp(argv[i], "--spread") && i + 1 < argc) {
            spread = atof(argv[++i]);
            if (!(spread >= 0.0 && spread < 1.0)) {
                fprintf(stderr, "bench_attention: --spread takes a fraction in [0, 1)\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--hint")) hint = true;
        else if (!strcmp(argv[i], "--page-tokens") && i + 1 < argc) {
            page_tokens = atoi(argv[++i]);
            if (page_tokens < 1 || page_tokens > 4096) {
                fprintf(stderr, "bench_attention: --page-tokens takes 1 to 4096\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) trace_path = argv[++i];
        else if (!strcmp(argv[i], "--quick")) {
            batches = {1, 64};
            lengths = {1024, 8192};
        } else {
            fprintf(stderr,
                    "usage: bench_attention [--reps N] [--json FILE] [--max-gib X] [--quick]\n"
                    "                       [--kernel auto|generic|tensor|tensor-per-section] [--batch B,..] [--length N,..]\n"
                    "                       [--format NAME] [--scores auto|separate|fused]\n"
                    "                       [--split N] [--logits auto|fp32|compact] [--group-size N]\n"
                    "                       [--flush read|write] [--no-scores] [--spread F] [--hint]\n"
                    "                       [--page-tokens N] [--trace FILE] [--pieces auto|off|N]\n"
                    "                       [--wave-spares auto|off|N] [--ready auto|off|on]\n"
                    "                       [--hi-item auto|off|N] [--hi-align auto|off|on]\n"
                    "                       [--head auto|off|N]\n"
                    "                       [--merge-blocks auto|1-8] [--piece-static auto|off|N]\n"
                    "                       [--merge-split auto|off|N] [--wave-blocks auto|N]\n"
                    "Decode attention time over batch x length grids (32 query / 8 KV heads, d 128)\n"
                    "for K16V16, K8V8, K8V4, K4V2 and a 20/50/30 high/low/pruned mix, against the\n"
                    "device copy rate. --scores: the score write-back as its own pass (separate),\n"
                    "inside the decode kernel (fused), or as the library chooses (auto, the\n"
                    "default). --split N: tokens per item (per block on the generic kernels),\n"
                    "0 (the default) to let the library choose. --logits: how a fused score\n"
                    "write-back keeps the logits (mkv_cuda_decode_logits_t; auto, the default, by\n"
                    "GPU; the separate pass keeps fp32 logits).\n"
                    "--group-size N: elements per quantization group on every side (16 to 256;\n"
                    "256: one group a vector), 0 (the default) for the library's defaults.\n"
                    "--flush: how the L2 is emptied before each timed call: by reading 256 MiB\n"
                    "(read, the default: the L2 then holds clean lines, as after a layer's GEMMs)\n"
                    "or by a 256 MiB memset (write: dirty lines the call writes back as it reads).\n"
                    "--no-scores: calls without the score write-back (mkv_cuda_decode_t::no_scores,\n"
                    "what an engine that never compresses runs); the bytes then exclude the scores.\n"
                    "--spread F: sequence j holds 1 - F u_j of the length's tokens (u_j uniform in\n"
                    "[0, 1), fixed seed), as a server's batch of requests at different lengths, while\n"
                    "max_tokens stays the length; the bytes are the tokens held. --hint: pass the\n"
                    "mean region (mkv_cuda_decode_t::mean_tokens), as the CUDA KV backend does.\n"
                    "--page-tokens N: pages of N tokens of each variant's high format (default 32;\n"
                    "serve-bench's pages hold 16 fp16 tokens).\n"
                    "--trace FILE: after each point's timed calls, one more call with the tensor-core\n"
                    "kernels' timeline stamps, written to FILE (builds with -DMKV_TC_TRACE only;\n"
                    "scripts/trace_summary.py reads it).\n"
                    "--pieces: the tokens a warp takes at a time in fused calls without scores where\n"
                    "the kernel has pieces (K16V16): auto (the default), off, or N (a multiple of 16).\n"
                    "--wave-spares: such calls of few regions run one wave of blocks a region and\n"
                    "N more a region queued after them, joining regions still running: auto (the\n"
                    "library's rule, the default), off (no such wave), or N.\n"
                    "--ready: whether separate calls of one launch have the finalize pass wait on\n"
                    "each region's items instead of the decode kernel's end: auto (the library's\n"
                    "rule, the default), off or on.\n"
                    "--hi-item: the tokens of the high section's items in two-format separate calls\n"
                    "of one launch (AUTO: longer than the low ones' for one sequence where that fills\n"
                    "a block a multiprocessor):\n"
                    "auto (the library's rule, the default), off (one item size), or N (rounded\n"
                    "up to a multiple of 16; shorter or longer than the item size).\n"
                    "--hi-align: in those calls, the low items start at a block of their own (no\n"
                    "block runs both formats): auto (the library's rule, the default: calls of at most\n"
                    "a block a multiprocessor without ready flags or high items of their own), off\n"
                    "or on.\n"
                    "--head: fused K16V16 calls without scores of more than a wave start with\n"
                    "regions of half-size items, so that the first wave's blocks do not all end\n"
                    "together: auto (the library's rule, the default: half the resident blocks),\n"
                    "off, or N (that many per mille of the resident blocks).\n"
                    "--merge-blocks: the blocks the separate finalize pass cuts each region's\n"
                    "merge among: auto (the library's rule, the default: in calls of at most a block\n"
                    "a multiprocessor, while each thread keeps 5 of a region's items; up to 4, in\n"
                    "calls of half that, while it would load them in two batches of 8, 3 where that\n"
                    "loads them in one), or N (1 to 8).\n"
                    "--piece-static: fused K16V16 calls without scores of 6 or more blocks a region\n"
                    "in a wave: each warp first takes that per mille of its share of its region, then\n"
                    "pieces: auto (the library's rule, the default: 900 where pieces do not pay\n"
                    "otherwise), off, or N with --pieces (a wave of every call).\n"
                    "--merge-split: the blocks a fused call merges each region among, a slice of its\n"
                    "outputs each, where its grid holds every block at once: auto (the library's rule,\n"
                    "the default: 8 where a region has 24 blocks or more), off (its last block), or N.\n"
                    "--wave-blocks: the blocks each region takes in a wave in pieces (--wave-spares,\n"
                    "--piece-static): auto (the resident blocks over the regions) or N.\n");
            return strcmp(argv[i], "-h") && strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
#ifndef MKV_TC_TRACE
    if (trace_path) {
        fprintf(stderr, "bench_attention: --trace needs a build with -DMKV_TC_TRACE in CMAKE_CUDA_FLAGS "
                        "(docs/decode-kernel.md, \"Timeline stamps\")\n");
        return 2;
    }
#endif
    const variant variants[] = {
        {"K16V16", MKV_FORMAT_K16V16, MKV_FORMAT_K16V16, 1.0, 0.0},
        {"K8V8", MKV_FORMAT_K8V8, MKV_FORMAT_K8V8, 1.0, 0.0},
        {"K8V4", MKV_FORMAT_K8V4, MKV_FORMAT_K8V4, 1.0, 0.0},
        {"K4V2", MKV_FORMAT_K4V2, MKV_FORMAT_K4V2, 1.0, 0.0},
        {"mix20/50/30", MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 0.2, 0.5},
    };
    if (only) {
        bool known = false;
        for (const variant &v : variants) known = known || !strcmp(only, v.name);
        if (!known) {
            fprintf(stderr, "bench_attention: --format K16V16, K8V8, K8V4, K4V2 or mix20/50/30\n");
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    size_t free_b, total_b;
    CK(cudaMemGetInfo(&free_b, &total_b));
    /* Default: pools up to 3/4 of the free memory less the two 2 GiB copy buffers (all of it is
     * allocated at once, with the largest workspace). */
    if (max_gib <= 0) max_gib = std::max(0.0, 0.75 * (double)free_b / (1 << 30) - 4.0);
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* Every buffer is allocated once, for the largest shape of the grid, before anything is
     * timed: after a large cudaFree and cudaMalloc the driver keeps working on the memory in the
     * background (presumably clearing it) for about 100 ms, taking DRAM bandwidth from kernels
     * timed in that window (docs/decisions.md, 33). This sizing pass and the timing pass below
     * take the same points: --format's variant and K16V16, where their pages fit in max_gib. */
    const auto listed = [&](const variant &v) {
        return !only || !strcmp(only, v.name) || !strcmp(v.name, "K16V16");
    };
    const auto pool_gib = [](const shape &sh) { return (double)sh.pages * sh.page_bytes / (1 << 30); };
    size_t max_pool = 0, max_table = 0, max_regions = 0, max_ws = 1;
    for (int batch : batches)
        for (int len : lengths)
            for (const variant &v : variants) {
                if (!listed(v)) continue;
                const shape sh = shape_of(v, batch, len, H, G, d, split, group, page_tokens);
                if (pool_gib(sh) > max_gib) continue;
                max_pool = std::max(max_pool, (size_t)(sh.pages * sh.page_bytes));
                max_table = std::max(max_table, (size_t)(sh.regions * sh.T));
                max_regions = std::max(max_regions, (size_t)sh.regions);
                max_ws = std::max(max_ws, sh.ws);
            }
    uint8_t *pool = NULL;
    int32_t *table = NULL, *nh = NULL, *nl = NULL;
    int64_t *reg = NULL;
    float *q = NULL, *out = NULL;
    void *workspace = NULL;
    const size_t max_q = max_regions * (size_t)(G * d);
    if (max_pool > 0) {
        CK(cudaMalloc((void **)&pool, max_pool));
        CK(cudaMalloc((void **)&table, max_table * 4));
        CK(cudaMalloc((void **)&nh, max_regions * 4));
        CK(cudaMalloc((void **)&nl, max_regions * 4));
        CK(cudaMalloc((void **)&reg, max_regions * 8));
        CK(cudaMalloc((void **)&q, max_q * 4));
        CK(cudaMalloc((void **)&out, max_q * 4));
        CK(cudaMalloc(&workspace, max_ws));
    }

    /* The device-to-device copy rate (read + write bytes per second) of a 2 GiB buffer. */
    const size_t copy_bytes = (size_t)2 << 30;
    void *ca, *cb;
    CK(cudaMalloc(&ca, copy_bytes));
    CK(cudaMalloc(&cb, copy_bytes));
    /* Copies for half a second first: the driver's background work on the new allocations
     * (above) would otherwise slow the copies timed here and inflate every fraction of it. */
    const auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (std::chrono::steady_clock::now() < settle) {
        CK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice, stream));
        CK(cudaStreamSynchronize(stream));
    }
    std::vector<double> ct;
    for (int r = 0; r < 12; r++) {
        CK(cudaEventRecord(e0, stream));
        CK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice, stream));
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 2) ct.push_back(ms * 1e-3);
    }
    const double copy_rate = 2.0 * (double)copy_bytes / median(ct);
    /* ca (2 GiB) is reused to flush the 50 MB L2 before every timed repetition: 256 MiB of it
     * read (clean lines left), or written (--flush write). */
    int n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    const auto flush_l2 = [&](int r) {
        if (write_flush) {
            CK(cudaMemsetAsync(ca, r, (size_t)256 << 20, stream));
        } else {
            read_flush_kernel<<<4 * n_sm, 512, 0, stream>>>((const uint4 *)ca, ((int64_t)256 << 20) / 16, (uint32_t *)cb);
            CK(cudaGetLastError());
        }
    };
    const double bpc = mkv_cuda_dram_bytes_per_sm_cycle();
    printf("%s: device copy rate %.0f GB/s (read + write); peak DRAM %.1f bytes per SM cycle\n",
           prop.name, copy_rate / 1e9, bpc);
    /* The floors a call's event time stands on, timed as the calls are (after the flush): an
     * empty kernel of a block per multiprocessor, and a 4 KB memset before it (as the fused
     * calls' counters). With the DRAM's peak rate (its clock and bus width), they bound each
     * point: no call can take less than the empty kernel plus its bytes at that rate. */
    double fl[2];
    for (int m = 0; m < 2; m++) {
        std::vector<double> t;
        for (int r = 0; r < reps + 2; r++) {
            flush_l2(r);
            CK(cudaEventRecord(e0, stream));
            if (m) CK(cudaMemsetAsync(cb, 0, 4096, stream));
            empty_kernel<<<n_sm, 128, 0, stream>>>();
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 2) t.push_back(ms * 1e-3);
        }
        fl[m] = median(t);
    }
    int mem_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        mem_khz = bus_bits = 0;
    }
    const double peak_rate = 2.0 * mem_khz * 1e3 * bus_bits / 8.0; /* bytes a second; 0 unknown */
    printf("floors: an empty kernel %.2f us, a 4 KB memset and an empty kernel %.2f us; peak DRAM %.0f GB/s\n",
           fl[0] * 1e6, fl[1] * 1e6, peak_rate / 1e9);

    FILE *jf = json_path ? (strcmp(json_path, "-") ? fopen(json_path, "w") : stdout) : NULL;
    if (jf)
        fprintf(jf, "{\"schema\": \"mixkv-bench-attention\", \"schema_version\": 1, \"device\": \"%s\", "
                    "\"copy_rate_gbs\": %.1f, \"heads\": %d, \"group_size\": %d, \"head_dim\": %d, "
                    "\"kernel\": \"%s\", \"scores\": \"%s\", \"logits\": \"%s\", \"quant_group_elems\": %d, "
                    "\"dram_bytes_per_sm_cycle\": %.2f, \"flush\": \"%s\", \"no_scores\": %s, \"spread\": %.3f, \"hint\": %s, "
                    "\"page_tokens\": %d, \"floor_empty_us\": %.3f, \"floor_memset_empty_us\": %.3f, "
                    "\"peak_dram_gbs\": %.1f, \"results\": [",
                prop.name, copy_rate / 1e9, H, G, d,
                k_kernel_names[kernel], k_scores_names[scores], k_logits_names[logits], group, bpc,
                write_flush ? "write" : "read", no_scores ? "true" : "false", spread, hint ? "true" : "false",
                page_tokens, fl[0] * 1e6, fl[1] * 1e6, peak_rate / 1e9);
    printf("quantization groups: %s; L2 flushed by %s 256 MiB; %s\n",
           group ? "elements per group as given" : "library defaults", write_flush ? "writing" : "reading",
           no_scores ? "no score write-back" : "scores written back");
    printf("%-12s %6s %7s %10s %12s %9s %10s %9s\n", "format", "batch", "length", "time_us",
           "bytes_read", "GB/s", "of_copy", "vs_fp16");
#ifdef MKV_TC_TRACE
    /* Timeline stamps: the buffer, and the floors a call's event time stands on (an empty
     * kernel; a small memset and an empty kernel), timed as the calls are. */
    unsigned long long *trace_buf = NULL;
    FILE *tf = NULL;
    if (trace_path) {
        CK(cudaMalloc((void **)&trace_buf, (4 + 4 * (size_t)MKV_TC_TRACE_CAP) * 8));
        if (!(tf = fopen(trace_path, "w"))) {
            fprintf(stderr, "bench_attention: cannot write %s\n", trace_path);
            return 1;
        }
        fprintf(tf, "# floors empty_us %.3f memset_empty_us %.3f\n", fl[0] * 1e6, fl[1] * 1e6);
    }
#endif
    int first = 1;
    for (int batch : batches) {
        for (int len : lengths) {
            double fp16_time = 0.0;
            for (const variant &v : variants) {
                if (!listed(v)) continue;
                char err[512];
                const shape sh = shape_of(v, batch, len, H, G, d, split, group, page_tokens);
                const mkv_page_layout_t &lh = sh.lh, &ll = sh.ll;
                const int32_t n_hi = sh.n_hi, n_lo = sh.n_lo, T = sh.T;
                const int64_t regions = sh.regions, pages = sh.pages, page_bytes = sh.page_bytes;
                const double gib = pool_gib(sh);
                if (gib > max_gib) {
                    printf("%-12s %6d %7d   skipped: %.1f GiB of pages\n", v.name, batch, len, gib);
                    continue;
                }
                fill_kernel<<<4096, 256, 0, stream>>>(pool, pages * page_bytes, 12345u);
                rows_kernel<<<(int)((regions + 255) / 256), 256, 0, stream>>>(table, regions, T, sh.k_hi, sh.k_lo);
                q_kernel<<<64, 256, 0, stream>>>(q, (int64_t)batch * H * G * d, 777u);
                /* --spread: sequence j (all its KV heads) holds a fraction 1 - spread u_j of the
                 * point's tokens, u_j uniform in [0, 1) from a fixed seed, as a server's batch
                 * of requests at different lengths; max_tokens stays the longest possible. */
                std::vector<int32_t> hv(regions, n_hi), lv(regions, n_lo);
                double stored = 0.0;
                uint64_t lcg = 0x9e3779b97f4a7c15ull;
                for (int64_t r = 0; r < regions; r++) {
                    if (r % H == 0) lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
                    const double f = 1.0 - spread * (double)(lcg >> 11) / 9007199254740992.0;
                    hv[r] = (int32_t)(n_hi * f), lv[r] = (int32_t)(n_lo * f);
                    stored += hv[r] + lv[r];
                }
                std::vector<int64_t> rv(regions);
                for (int64_t r = 0; r < regions; r++) rv[r] = r;
                CK(cudaMemcpy(nh, hv.data(), (size_t)regions * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(nl, lv.data(), (size_t)regions * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(reg, rv.data(), (size_t)regions * 8, cudaMemcpyHostToDevice));
                mkv_cuda_decode_t a;
                memset(&a, 0, sizeof a);
                a.pool = pool;
                a.page_bytes = page_bytes;
                a.lay_hi = lh;
                a.lay_lo = ll;
                a.table = table;
                a.n_hi = nh;
                a.n_lo = nl;
                a.row_entries = T;
                a.regions = reg;
                a.n_seq = batch;
                a.n_heads = H;
                a.group_size = G;
                a.head_dim = d;
                a.max_tokens = n_hi + n_lo;
                a.mean_tokens = hint ? (int32_t)(stored / (double)regions) : 0;
                a.q = q;
                a.out = out;
                a.softmax_scale = 0.088388f;
                a.kernel = kernel;
                a.scores = scores;
                a.logits = logits;
                a.split_tokens = split;
                a.no_scores = no_scores;
                a.workspace = workspace;
                std::vector<double> t;
                for (int r = 0; r < reps + 2; r++) {
                    flush_l2(r);
                    CK(cudaEventRecord(e0, stream));
                    if (mkv_cuda_decode(&a, stream, err) != MKV_STATUS_OK) {
                        fprintf(stderr, "bench_attention: %s\n", err);
                        return 1;
                    }
                    CK(cudaEventRecord(e1, stream));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 2) t.push_back(ms * 1e-3);
                }
#ifdef MKV_TC_TRACE
                if (tf) { /* one more call, stamped */
                    CK(cudaMemsetAsync(trace_buf, 0, (4 + 4 * (size_t)MKV_TC_TRACE_CAP) * 8, stream));
                    flush_l2(0);
                    mkv_tc_trace_buffer = trace_buf;
                    CK(cudaEventRecord(e0, stream));
                    const mkv_status_t st = mkv_cuda_decode(&a, stream, err);
                    CK(cudaEventRecord(e1, stream));
                    mkv_tc_trace_buffer = NULL;
                    if (st != MKV_STATUS_OK) {
                        fprintf(stderr, "bench_attention: %s\n", err);
                        return 1;
                    }
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    unsigned long long cnt = 0;
                    CK(cudaMemcpy(&cnt, trace_buf, 8, cudaMemcpyDeviceToHost));
                    cnt = std::min(cnt, (unsigned long long)MKV_TC_TRACE_CAP);
                    std::vector<unsigned long long> rec(4 * cnt);
                    CK(cudaMemcpy(rec.data(), trace_buf + 4, rec.size() * 8, cudaMemcpyDeviceToHost));
                    fprintf(tf, "# call %s %d %d event_us %.3f median_us %.3f records %llu\n", v.name, batch, len,
                            ms * 1e3, median(t) * 1e6, cnt);
                    for (unsigned long long k = 0; k < cnt; k++) {
                        const unsigned long long *r = &rec[4 * k];
                        if ((r[2] & 255) == 0) continue; /* a chunk's unused record (tc_trace.cuh) */
                        fprintf(tf, "%llu %llu %llu %llu %llu %llu %d\n", r[0], r[1], r[2] & 255, (r[2] >> 8) & 255,
                                (r[2] >> 16) & 255, r[3] & 0xffffffffull, (int)(int32_t)(r[3] >> 32));
                    }
                    fflush(tf);
                }
#endif
                /* Bytes that must be read: codes and metadata of every stored token, plus the
                 * score (read and written) where it is written back. */
                const double sb = no_scores ? 0.0 : 8.0;
                const double per_hi = (double)(lh.bytes[0] + lh.bytes[1] + lh.bytes[2] + lh.bytes[3]) / lh.tokens;
                const double per_lo = (double)(ll.bytes[0] + ll.bytes[1] + ll.bytes[2] + ll.bytes[3]) / ll.tokens;
                double bytes = 0.0;
                for (int64_t r = 0; r < regions; r++) bytes += hv[r] * (per_hi + sb) + lv[r] * (per_lo + sb);
                const double sec = median(t), rate = bytes / sec;
                if (!strcmp(v.name, "K16V16")) fp16_time = sec;
                printf("%-12s %6d %7d %10.1f %12.3e %9.0f %9.1f%% %8.2fx\n", v.name, batch, len, sec * 1e6,
                       bytes, rate / 1e9, 100.0 * rate / copy_rate, fp16_time > 0 ? fp16_time / sec : 0.0);
                fflush(stdout);
                if (jf) {
                    fprintf(jf, "%s\n  {\"format\": \"%s\", \"batch\": %d, \"length\": %d, \"tokens_hi\": %d, "
                                "\"tokens_lo\": %d, \"time_us\": %.2f, \"time_min_us\": %.2f, "
                                "\"time_max_us\": %.2f, \"bytes\": %.0f, \"gbs\": %.1f, "
                                "\"fraction_of_copy\": %.4f, \"speedup_vs_k16v16\": %.3f, "
                                "\"fused_scores\": %s, \"compact_logits\": %s, \"tensor\": %s, "
                                "\"piece_tokens\": %d, \"piece_static\": %d, \"item_tokens\": %d, \"wave_blocks\": %d, "
                                "\"ready_flags\": %s, \"hi_item_tokens\": %d, \"hi_align\": %s, \"head_regions\": %d, "
                                "\"merge_blocks\": %d, \"merge_split\": %d, \"bound_us\": %.2f, \"groups\": [%d, %d, %d, %d]}",
                            first ? "" : ",", v.name, batch, len, n_hi, n_lo, sec * 1e6,
                            *std::min_element(t.begin(), t.end()) * 1e6,
                            *std::max_element(t.begin(), t.end()) * 1e6, bytes, rate / 1e9,
                            rate / copy_rate, fp16_time > 0 ? fp16_time / sec : 0.0,
                            mkv_cuda_decode_fuses_scores(&a) ? "true" : "false",
                            mkv_cuda_decode_compact_logits(&a) ? "true" : "false",
                            kernel != MKV_DECODE_KERNEL_GENERIC && mkv_cuda_decode_uses_tensor(&lh, &ll, G, d)
                                ? "true" : "false",
                            (int)mkv_cuda_decode_piece_tokens(&a), (int)mkv_cuda_decode_piece_static(&a),
                            (int)mkv_cuda_decode_item_tokens(&a),
                            (int)mkv_cuda_decode_wave_blocks(&a), mkv_cuda_decode_ready_flags(&a) ? "true" : "false",
                            (int)mkv_cuda_decode_hi_item_tokens(&a), mkv_cuda_decode_hi_align(&a) ? "true" : "false",
                            (int)mkv_cuda_decode_head_regions(&a),
                            (int)mkv_cuda_decode_merge_blocks(&a), (int)mkv_cuda_decode_merge_split(&a),
                            peak_rate > 0 ? (fl[0] + bytes / peak_rate) * 1e6 : 0.0, lh.key.groups, lh.value.groups, ll.key.groups,
                            ll.value.groups);
                    first = 0;
                }
            }
        }
    }
#ifdef MKV_TC_TRACE
    if (tf) fclose(tf);
    cudaFree(trace_buf);
#endif
    if (jf) {
        fprintf(jf, "\n]}\n");
        if (jf != stdout) fclose(jf);
    }
    cudaFree(ca);
    cudaFree(cb);
    cudaFree(pool);
    cudaFree(table);
    cudaFree(nh);
    cudaFree(nl);
    cudaFree(reg);
    cudaFree(q);
    cudaFree(out);
    cudaFree(workspace);
    return 0;
}
