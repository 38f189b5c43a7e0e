/*
 * mixkv.h — the public C API of mixkv, a mixed-precision KV cache for LLM inference.
 *
 * This is the only header an embedding engine includes. Conventions (DESIGN.md section 7):
 *  - every call returns mkv_status_t; MKV_STATUS_OK is 0 and the enum only grows;
 *  - a call that fails changes nothing (no half-applied allocation, no partial release) and
 *    leaves a message in the handle (mkv_cache_last_error) or, for calls without a handle,
 *    in the calling thread's mkv_last_error();
 *  - a handle is used by one host thread at a time; distinct handles are independent;
 *  - calls that run on a device take an explicit stream as `void *` (a cudaStream_t; NULL is
 *    the legacy default stream); the CPU backend ignores it;
 *  - the library never calls exit() or abort().
 *
 * Vocabulary (DESIGN.md section 2): L layers, H KV heads per layer, G query heads per KV head,
 * d head dimension, S sequence slots, N a sequence's length (tokens seen, pruned included).
 * A head-region is one (slot, layer, KV head), the unit of memory management. Each
 * head-region has a high-precision section (n_hi tokens) and a low-precision section (n_lo
 * tokens); the N - n_hi - n_lo other tokens were pruned.
 */
#ifndef MIXKV_H
#define MIXKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MKV_VERSION_MAJOR 0
#define MKV_VERSION_MINOR 4 /* 0.2: element types (mkv_dtype_t) and the batched _ex calls;
                              0.3: mkv_cache_set_parallel, mkv_report_error,
                              mkv_forward_t.decode_sample;
                              0.4: MKV_CACHE_NO_SCORES, mkv_cache_seq_lens,
                              mkv_cache_set_capture_horizon */
#define MKV_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------- */
/* Status                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Values are stable: new codes are only ever appended. */
typedef enum mkv_status {
    MKV_STATUS_OK = 0,
    MKV_STATUS_INVALID_ARGUMENT = 1, /* a null pointer, a value out of range, a bad slot */
    MKV_STATUS_UNSUPPORTED = 2,      /* valid request this build or backend cannot serve */
    MKV_STATUS_OUT_OF_PAGES = 3,     /* the free page list cannot cover the demand */
    MKV_STATUS_OUT_OF_MEMORY = 4,    /* a host or device allocation failed */
    MKV_STATUS_CUDA_ERROR = 5,       /* the CUDA runtime reported an error */
    MKV_STATUS_IO_ERROR = 6,         /* a file could not be opened, read or written */
    MKV_STATUS_PARSE_ERROR = 7,      /* a file is malformed, truncated or of another version */
    MKV_STATUS_INTERNAL = 8,         /* a bug in mixkv: please report it */
    MKV_STATUS_OUT_OF_SLOTS = 9,     /* every sequence slot is in use */
    MKV_STATUS_CORRUPT = 10,         /* the cache state violates an invariant */
} mkv_status_t;

/* A static English description of a status ("out of pages"); never NULL. */
const char *mkv_status_string(mkv_status_t status);

/* "MAJOR.MINOR.PATCH" of the library that is linked (may differ from the header's macros). */
const char *mkv_version(void);

/* The message of the last failed call made by this thread that had no handle to report into
 * (mkv_cache_create, mkv_cache_load_json, mkv_tokens_per_page, ...). "" when there is none.
 * Valid until this thread's next mixkv call. */
const char *mkv_last_error(void);

/* The size of every error message buffer (the last-error texts, the `err` arguments of the
 * project's engine functions), terminator included. */
#define MKV_ERR_LEN 512

/* Frees memory that mixkv returned to the caller (e.g. by mkv_cache_dump_json_string). */
void mkv_free(void *ptr);

/* ---------------------------------------------------------------------------------------- */
/* KV formats                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* KxVy: keys stored with x bits per element, values with y (16 = fp16, stored raw). Values are
 * stable. K16V16 is the full-precision baseline; K8V4 and K4V2 are DiffKV's defaults. */
typedef enum mkv_format {
    MKV_FORMAT_K16V16 = 0,
    MKV_FORMAT_K8V8 = 1,
    MKV_FORMAT_K8V4 = 2,
    MKV_FORMAT_K4V4 = 3,
    MKV_FORMAT_K8V2 = 4,
    MKV_FORMAT_K4V2 = 5,
    MKV_FORMAT_K4V8 = 6,
    MKV_FORMAT_K2V4 = 7,
    MKV_FORMAT_COUNT
} mkv_format_t;

/* "K8V4" and so on; "?" for a value out of range. */
const char *mkv_format_name(mkv_format_t format);

/* Parses a format name (case-insensitive, "K8V4"). */
mkv_status_t mkv_format_from_name(const char *name, mkv_format_t *out_format);

/* How many tokens of one head-region a page of page_bytes holds in this format, with head
 * dimension d (16, 32, 64, 128 or 256) and key_group / value_group elements per quantization
 * group of a key / value vector (16, 32, 64, 128 or 256; a size >= d means one group for the
 * whole vector; 0 means the library's default for that side's bit width; ignored for 16-bit
 * sides, which have no metadata). The page's six segments each start on a 16-byte boundary;
 * where 16 tokens or more fit, the page holds a multiple of 16 (MKV_PAGE_TOKEN_ALIGN: every
 * 16-token run of a segment then starts on a 64-byte boundary, docs/page-layout.md). Fails
 * with INVALID_ARGUMENT when not even one token fits. */
mkv_status_t mkv_tokens_per_page(mkv_format_t format, int32_t head_dim, int32_t key_group,
                                 int32_t value_group, int64_t page_bytes, int32_t *out_tokens);

/* The smallest page size (a multiple of 16 bytes) into which `tokens` tokens of this format
 * fit, groups as for mkv_tokens_per_page. Such a page holds exactly `tokens` where tokens is
 * below 16 or a multiple of 16 (else the multiple of 16 below it), unless no multiple of 16
 * bytes does (a few formats at d = 16, e.g. one-group K4V4: one token needs 84 bytes, and 96
 * hold two). */
mkv_status_t mkv_page_bytes_for(mkv_format_t format, int32_t head_dim, int32_t key_group,
                                int32_t value_group, int32_t tokens, int64_t *out_bytes);

/* The library's default elements per quantization group for one side of a format: bits 8, 4
 * or 2, is_value 0 for keys, 1 for values (what a 0 in a config's *_group field means). 256
 * (the largest head dimension) stands for the whole vector; 16-bit sides return 256 too (they
 * have no metadata). */
int32_t mkv_default_group_elems(int32_t bits, int is_value);

/* ---------------------------------------------------------------------------------------- */
/* Element types of the token tensors an engine passes (q, k, v, out)                       */
/* ---------------------------------------------------------------------------------------- */

/* Values are stable. Since 0.2. */
typedef enum mkv_dtype {
    MKV_DTYPE_F32 = 0,  /* IEEE binary32 */
    MKV_DTYPE_F16 = 1,  /* IEEE binary16, as uint16_t bits */
    MKV_DTYPE_BF16 = 2, /* bfloat16, as uint16_t bits */
    MKV_DTYPE_COUNT
} mkv_dtype_t;

/* "f32", "f16" or "bf16"; "?" for a value out of range. */
const char *mkv_dtype_name(mkv_dtype_t dtype);

/* Bytes per element (4 or 2); 0 for a value out of range. */
size_t mkv_dtype_size(mkv_dtype_t dtype);

/* Converts n elements of src (type from) into dst (type to), in host memory, little-endian
 * (since 0.3): to f16 or bf16 by rounding to nearest even (overflow to infinity, NaN stays
 * NaN), to f32 exactly, the same type by copying: the conversions the CPU backend applies.
 * src and dst need no alignment and must not overlap. INVALID_ARGUMENT for a null pointer
 * with n > 0, n < 0 or a type out of range (nothing written). */
mkv_status_t mkv_convert(void *dst, mkv_dtype_t to, const void *src, mkv_dtype_t from, int64_t n);

/* For engines built on mixkv (since 0.3): formats a message into this thread's buffer behind
 * mkv_last_error(), as the library's own handle-less calls do, and returns status; a null fmt
 * clears the message. */
mkv_status_t mkv_report_error(mkv_status_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---------------------------------------------------------------------------------------- */
/* Backends                                                                                 */
/* ---------------------------------------------------------------------------------------- */

typedef enum mkv_backend {
    MKV_BACKEND_CPU = 0,  /* plain C, host memory: the complete reference backend */
    MKV_BACKEND_CUDA = 1, /* device-resident state and token data; one CUDA device chosen by
                             device_id; tensors in device memory */
} mkv_backend_t;

/* "cpu" or "cuda"; "?" for a value out of range. */
const char *mkv_backend_name(mkv_backend_t backend);

/* *out_available = 1 when the backend can run here: CPU always; CUDA when the library was
 * built with CUDA and the runtime sees at least one device. Never fails for a valid backend. */
mkv_status_t mkv_backend_available(mkv_backend_t backend, int *out_available);

/* ---------------------------------------------------------------------------------------- */
/* Cache configuration                                                                      */
/* ---------------------------------------------------------------------------------------- */

#define MKV_CACHE_CONFIG_VERSION 3 /* 2: per-side group sizes replace quant_groups;
                                      3: the fixed mix (mix_high, mix_low) */

/* flags */
#define MKV_CACHE_METADATA_ONLY 0x1u /* manage pages but allocate no page storage: for
                                        schedulers, simulators and memory-manager benchmarks */
#define MKV_CACHE_ASYNC_STEPS 0x2u   /* CUDA backend (since 0.2): mkv_cache_append,
                                        mkv_cache_decode_layer(_ex) and mkv_cache_compress
                                        enqueue their work and return without waiting for the
                                        device; a refusal found there (OUT_OF_PAGES) is
                                        reported by mkv_cache_sync or by the next call that
                                        waits (see mkv_cache_sync). Ignored by the CPU backend */
#define MKV_CACHE_NO_SCORES 0x4u     /* (since 0.4) a cache that never compresses: alpha_h and
                                        alpha_l 0, no fixed mix, no budget. Decode attention then
                                        writes no score back (the CUDA backend's calls skip the
                                        write-back: a plain paged decode, the full-precision
                                        baseline's); the scores' values are unspecified.
                                        mkv_cache_set_budget is refused */

/* Initialise with MKV_CACHE_CONFIG_INIT, then set fields. `version` and `struct_size` let a
 * newer library accept an older caller's struct; do not change them. Zero in page_bytes or
 * pool_pages asks for the documented default or derivation. */
typedef struct mkv_cache_config {
    uint32_t version;     /* MKV_CACHE_CONFIG_VERSION */
    uint32_t struct_size; /* sizeof(mkv_cache_config_t) */

    int32_t n_layers;     /* L >= 1 */
    int32_t n_kv_heads;   /* H >= 1 */
    int32_t group_size;   /* G >= 1: query heads per KV head */
    int32_t head_dim;     /* d: 16, 32, 64, 128 or 256 */
    int32_t max_seqs;     /* S >= 1: sequence slots */
    int32_t max_seq_len;  /* most tokens a sequence may see (pruned ones included) */

    /* Elements per quantization group (one fp16 scale and zero each), per side of each
     * format: 16, 32, 64, 128 or 256; a size >= head_dim means one group for the whole
     * vector; 0 asks for mkv_default_group_elems(bits, side). Ignored for 16-bit sides. The
     * resolved config (mkv_cache_info, dumps) holds min(size, head_dim), head_dim for 16-bit
     * sides. */
    int32_t hi_key_group;
    int32_t hi_value_group;
    int32_t lo_key_group;
    int32_t lo_value_group;

    int64_t page_bytes; /* bytes per page; 0: the page that holds 32 tokens of hi_format with
                           its (resolved) hi groups */
    int64_t pool_pages; /* P, pages in the pool; 0: pool_bytes / page_bytes */
    int64_t pool_bytes; /* used only when pool_pages is 0 */

    mkv_format_t hi_format; /* important tokens (default K8V4) */
    mkv_format_t lo_format; /* moderately important tokens (default K4V2) */
    float alpha_h;          /* keep high when score >= alpha_h / N (default 1.0) */
    float alpha_l;          /* keep low when score >= alpha_l / N, else prune (default 0.02) */
    int32_t window;         /* W: the most recent W tokens stay high (default 64) */
    int32_t obs_window;     /* prompt significance from the last obs_window queries only;
                               0: from every later query (default) */
    float softmax_scale;    /* attention logit scale; 0: 1 / sqrt(head_dim) (default) */

    mkv_backend_t backend;
    int32_t device_id; /* CUDA device ordinal; ignored by the CPU backend */
    int32_t n_threads; /* CPU backend: threads for the planning and copy phases (1 = serial) */
    uint32_t flags;    /* MKV_CACHE_* flags */

    /* The fixed mix (since 0.3; CPU backend): when either is > 0, the policy keeps these
     * fractions of the tokens outside the window high and low, chosen by significance rank
     * (the strongest high, the next low, the rest pruned), instead of comparing with
     * alpha_h / N and alpha_l / N; in [0, 1], their sum at most 1 (engine/policy.h). Runs at
     * real sizes on random weights use it to store the mixes measured on a real model. */
    float mix_high;
    float mix_low;
} mkv_cache_config_t;

/* Llama-3-8B's KV geometry (32 layers, 8 KV heads, G 4, d 128), 64 slots of up to 4096 tokens,
 * default group sizes, K8V4 / K4V2 with DiffKV's Llama-3 alphas, W 64, CPU backend. The pool
 * size must be set. */
#define MKV_CACHE_CONFIG_INIT                                                                   \
    {                                                                                          \
        MKV_CACHE_CONFIG_VERSION, (uint32_t)sizeof(mkv_cache_config_t), 32, 8, 4, 128, 64, 4096, \
            0, 0, 0, 0, 0, 0, 0, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 1.0f, 0.02f, 64, 0, 0.0f,   \
            MKV_BACKEND_CPU, 0, 1, 0u, 0.0f, 0.0f                                              \
    }

/* ---------------------------------------------------------------------------------------- */
/* Cache lifetime and introspection                                                         */
/* ---------------------------------------------------------------------------------------- */

typedef struct mkv_cache mkv_cache_t; /* opaque */

/* Creates a cache: validates the config (every field; a clear message names the bad one),
 * allocates the pool, the free page list holding every page, and empty page tables.
 * On failure *out_cache is NULL and mkv_last_error() says why. */
mkv_status_t mkv_cache_create(const mkv_cache_config_t *config, mkv_cache_t **out_cache);

/* Frees everything. NULL is accepted. */
void mkv_cache_destroy(mkv_cache_t *cache);

/* The message of the last failed call on this handle; "" after a success. Calls that take a
 * const handle (mkv_cache_info, mkv_cache_prompt_demand, mkv_cache_stats) report into
 * mkv_last_error() instead. mkv_cache_last_error(NULL) returns "null cache". */
const char *mkv_cache_last_error(const mkv_cache_t *cache);

/* Derived layout of a cache. */
typedef struct mkv_cache_info {
    mkv_cache_config_t config; /* resolved: page_bytes and pool_pages filled in */
    int32_t tokens_per_page_hi;
    int32_t tokens_per_page_lo;
    int32_t row_entries;     /* T: page-table entries per head-region */
    int64_t region_count;    /* S * L * H */
    int64_t table_bytes;     /* page tables and counters (metadata) */
    int64_t pool_bytes;      /* P * page_bytes (0 with MKV_CACHE_METADATA_ONLY) */
} mkv_cache_info_t;

mkv_status_t mkv_cache_info(const mkv_cache_t *cache, mkv_cache_info_t *out_info);

/* ---------------------------------------------------------------------------------------- */
/* Sequences: admission, growth, shrink, release                                            */
/* ---------------------------------------------------------------------------------------- */

/* Conservative prompt demand (DESIGN.md section 6): L * H * (ceil(prompt_len / tpp_hi) + 1)
 * pages, enough for any split of the prompt into high and low sections. */
mkv_status_t mkv_cache_prompt_demand(const mkv_cache_t *cache, int32_t prompt_len,
                                     int64_t *out_pages);

/* Check: *out_ok = 1 when mkv_cache_admit(prompt_len) would succeed now (a slot is free and
 * the available pages, free minus reserved, cover the prompt demand). */
mkv_status_t mkv_cache_can_admit(mkv_cache_t *cache, int32_t prompt_len, int *out_ok);

/* Act: takes the lowest free slot for a new sequence (N = 0, empty sections) and reserves its
 * prompt demand. A full slot table is reported (OUT_OF_SLOTS) before a lack of pages.
 * Reserved pages stay in the free list but are not available to other slots;
 * the reservation ends with the first mkv_cache_resize or mkv_cache_append that includes the
 * slot, or with its release. OUT_OF_SLOTS or OUT_OF_PAGES leave everything unchanged. */
mkv_status_t mkv_cache_admit(mkv_cache_t *cache, int32_t prompt_len, int32_t *out_slot);

/* Worst-case pages the next generation step of these slots can allocate: per head-region one
 * high page when the high section is full (n_hi a multiple of tpp_hi) and one low page when
 * the low section is full and a token reaches the window's edge (N >= W). A scheduler keeps
 * this <= stats.available_pages, preempting otherwise. */
mkv_status_t mkv_cache_step_demand(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                   int64_t *out_pages);

/* One generation step's allocation: for every listed slot N += 1 and, in each of its
 * head-regions, n_hi += 1 (the new token enters the high section), allocating a page where a
 * section crosses a page boundary. One prefix sum serves all slots, layers and heads.
 * slots: [n_slots] distinct active slots, host memory (n_slots 0 is a no-op). A slot already
 * at max_seq_len is INVALID_ARGUMENT, checked before any page. Refused whole (OUT_OF_PAGES) when the
 * available pages do not cover the demand. */
mkv_status_t mkv_cache_append(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                              void *stream);

/* A batched change of section sizes, the memory-manager side of the compression policy.
 * slots and seq_len are host arrays on both backends; n_hi and n_lo are host arrays for the
 * CPU backend and device arrays for the CUDA backend (where the policy produces them). */
typedef struct mkv_resize {
    int32_t n_slots;
    const int32_t *slots;   /* [n_slots] distinct active slots */
    const int32_t *seq_len; /* [n_slots] new N (>= current N, <= max_seq_len); NULL: unchanged */
    const int32_t *n_hi;    /* [n_slots][L][H] new high-precision token counts */
    const int32_t *n_lo;    /* [n_slots][L][H] new low-precision token counts, n_hi + n_lo <= N */
} mkv_resize_t;

/* Sets every listed head-region's section sizes. Sections stay dense: a section that shrinks
 * loses its last pages (recycled to the free list first, with one prefix sum), a section that
 * grows gains pages at its end (allocated after, with another), so pages freed by one
 * head-region can serve another in the same call. Token data movement (swap-remove) is the
 * caller's, done before the call. Refused whole (OUT_OF_PAGES) when the available pages plus
 * those released do not cover the demand. */
mkv_status_t mkv_cache_resize(mkv_cache_t *cache, const mkv_resize_t *resize, void *stream);

/* Check for mkv_cache_resize: the status it would return now (OK, OUT_OF_PAGES or
 * INVALID_ARGUMENT, with the same message), changing nothing. Lets a caller move token data
 * only once the page movement is known to succeed. */
mkv_status_t mkv_cache_resize_check(mkv_cache_t *cache, const mkv_resize_t *resize);

/* A finished or preempted sequence returns all its pages and its reservation; the slot
 * becomes free. */
mkv_status_t mkv_cache_release(mkv_cache_t *cache, int32_t slot, void *stream);

/* ---------------------------------------------------------------------------------------- */
/* The KV backend: token data, attention and the compression policy                        */
/* ---------------------------------------------------------------------------------------- */
/*
 * One engine step with this backend (docs/api.md has a worked example):
 *   prompt:  mkv_cache_admit(prompt_len) -> for every layer mkv_cache_prefill_layer ->
 *            mkv_cache_commit_prompt (classify, place in pages, recycle);
 *   decode:  mkv_cache_append(slots) -> for every layer mkv_cache_decode_layer ->
 *            mkv_cache_compress(slots) (Algorithm 1, budgets, recycling);
 *   finish:  mkv_cache_release(slot).
 * Tensors are fp32, row-major, in host memory for the CPU backend (device memory for CUDA).
 * Query head i uses KV head i / G (Hugging Face's GQA order). A cache created with
 * MKV_CACHE_METADATA_ONLY answers these calls with UNSUPPORTED.
 */

/* Caps the tokens a slot keeps per head-region (0: no cap, the default at admission). When
 * a head-region holds more after the policy, the lowest-significance tokens outside the
 * window are pruned (Zipage's N_max, KV-Compress's per-sequence budget). */
mkv_status_t mkv_cache_set_budget(mkv_cache_t *cache, int32_t slot, int32_t max_tokens);

/* Prompt attention for one layer of an admitted slot whose prompt is not yet committed:
 * causal attention in full precision over the prompt_len tokens given at admission, and the
 * significance of every prompt token per KV head (DESIGN.md section 5). The K/V stay in
 * working memory until mkv_cache_commit_prompt.
 * q: [prompt_len][H * G][d]; k, v: [prompt_len][H][d]; out: [prompt_len][H * G][d]. */
mkv_status_t mkv_cache_prefill_layer(mkv_cache_t *cache, int32_t slot, int32_t layer,
                                     const float *q, const float *k, const float *v, float *out,
                                     void *stream);

/* After every layer of these slots went through mkv_cache_prefill_layer: classifies each
 * prompt token per head-region (the last W high; others high, low or pruned by alpha_h / N and
 * alpha_l / N; then the budget), allocates exactly the pages needed with one batched call (the
 * admission's reservation guarantees it fits), quantizes the tokens into them and frees the
 * working memory. Afterwards N = prompt_len. */
mkv_status_t mkv_cache_commit_prompt(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                     void *stream);

/* mkv_cache_prefill_layer for several admitted slots at once (since 0.2), with tensors of
 * element type dtype: slot j's prompt_len rows follow slot j - 1's in q, k, v and out (the
 * varlen packing of FlashAttention). The CUDA backend runs every slot in one launch sequence;
 * f16 and bf16 keys and values are stored as fp16 either way (K16V16 is the full precision). */
mkv_status_t mkv_cache_prefill_layer_ex(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                        int32_t layer, mkv_dtype_t dtype, const void *q,
                                        const void *k, const void *v, void *out, void *stream);

/* One decode step of one layer, after mkv_cache_append(slots) made room: quantizes the new
 * token's K/V (position N - 1) into each head-region's high section, then attends over the
 * stored tokens (high pages, then low) and adds each token's attention probability (max over
 * the group) to its score. q: [n_slots][H * G][d]; k, v: [n_slots][H][d]; out: [n_slots][H * G][d].
 * Call once per layer per step. */
mkv_status_t mkv_cache_decode_layer(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                    int32_t layer, const float *q, const float *k, const float *v,
                                    float *out, void *stream);

/* mkv_cache_decode_layer with tensors of element type dtype (since 0.2). */
mkv_status_t mkv_cache_decode_layer_ex(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                       int32_t layer, mkv_dtype_t dtype, const void *q,
                                       const void *k, const void *v, void *out, void *stream);

/* The generation-phase policy after every layer of the step: per head-region, Algorithm 1 on
 * the token reaching the window's edge (keep, demote to low, or prune; a victim demoted or
 * pruned), then the slot's budget; sections stay dense (swap-remove) and emptied pages go back
 * to the free list in the same call. Needs at most mkv_cache_step_demand pages. */
mkv_status_t mkv_cache_compress(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                void *stream);

/* Waits for the cache's work on the device and reports what happened to its asynchronous
 * calls (since 0.2). With MKV_CACHE_ASYNC_STEPS a decode step (append, every layer's decode,
 * compress) issues no host synchronisation and can be captured in a CUDA graph; a step call
 * that the device refuses changes nothing, and neither does any step call after it until the
 * refusal is reported: here, or by the next call that waits for the device (admission,
 * release, resize, stats, validate, dumps, prefill, commit), which then returns that status
 * and message instead of doing its own work. The host's view of every slot (N, reservations,
 * which layers were decoded) is brought back to the device's, so a refused step is retried
 * from where it stood (after preempting, for OUT_OF_PAGES). A captured step (a CUDA graph
 * of append, the decodes and compress) may be replayed any number of times; call this before
 * any other call afterwards, so that the host's view catches up with the device (capturing
 * itself runs nothing: sync after it too). The CPU backend has nothing to wait for: OK. */
mkv_status_t mkv_cache_sync(mkv_cache_t *cache, void *stream);

/* An engine's own threads for the CPU backend's attention (since 0.3). A task function
 * processes items [begin, end); part (0 <= part < parts) names the thread that runs it, for
 * per-thread scratch. A parallel function runs fn over [0, n) in at most `parts` contiguous
 * pieces, each with its own part, and returns when every piece is done. */
typedef void (*mkv_task_fn)(void *task, int64_t begin, int64_t end, int32_t part);
typedef void (*mkv_parallel_fn)(void *runner, mkv_task_fn fn, void *task, int64_t n);

/* From now on the CPU backend's prefill and decode attention split their head-regions with
 * run(runner, ...) into at most `parts` pieces; run NULL (or parts 1) goes back to the calling
 * thread. The results are the same bits for any split. The CUDA backend ignores it.
 * INVALID_ARGUMENT for parts < 1. */
mkv_status_t mkv_cache_set_parallel(mkv_cache_t *cache, mkv_parallel_fn run, void *runner,
                                    int32_t parts);

/* How often an engine launches a captured step (since 0.4; CUDA backend, asynchronous steps).
 * A decode layer call made while its stream is being captured into a CUDA graph has to plan
 * its attention for lengths its replays will reach: with steps 0 (the default) that is
 * max_seq_len, which any number of launches fits but which costs the attention idle blocks
 * when the regions are much shorter. With steps > 0 it plans for the longest N among the
 * call's slots as the capture sees it, plus steps - 1: the graph may then be launched at most
 * `steps` times (the first launch included) before the step is captured again. The contract
 * is the engine's: a later launch reads only the planned tokens of a longer region, so its
 * attention is wrong (nothing else is touched). The CPU backend ignores it. INVALID_ARGUMENT
 * for steps < 0. */
mkv_status_t mkv_cache_set_capture_horizon(mkv_cache_t *cache, int32_t steps);

/* A forward pass as a driver of the cache sees it (since 0.3): the model runner's CPU pass
 * implements it today (runner/model.h, mkv_model_forward), and the project's scheduler loop
 * (engine/scheduler.h) drives any implementation unchanged. Messages go to mkv_last_error(). */
typedef struct mkv_forward {
    void *ctx;             /* the implementation's state, passed back to every call */
    int32_t vocab;         /* logits per token */
    int32_t max_positions; /* positions a sequence may reach */
    int32_t max_tokens;    /* most tokens one call takes (a prompt, or a decode batch) */
    /* The admitted, uncommitted slot's prompt (n tokens, as admitted) through every layer,
     * then committed; the logits of every position into logits [n][vocab] and the last
     * one's into last_logits [vocab], each when not NULL. */
    mkv_status_t (*prefill)(void *ctx, mkv_cache_t *cache, int32_t slot, const int32_t *tokens,
                            int32_t n, float *logits, float *last_logits);
    /* One decode step of n_slots committed slots, tokens [n_slots] their inputs: append,
     * every layer, compress; logits [n_slots][vocab]. */
    mkv_status_t (*decode)(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                           const int32_t *tokens, float *logits);
    /* Optional (NULL: not offered): decode's step, then each slot's greedy next token (the
     * lowest id among its largest logits, as mkv_sample with temperature 0) into
     * next [n_slots], the logits never leaving the implementation (a GPU's copy saved). */
    mkv_status_t (*decode_greedy)(void *ctx, mkv_cache_t *cache, int32_t n_slots,
                                  const int32_t *slots, const int32_t *tokens, int32_t *next);
    /* Optional (NULL: not offered; since 0.3): decode's step, then each slot's next token
     * sampled by the implementation into next [n_slots], the logits never leaving it. Row j
     * is greedy (as decode_greedy; u[j] unused) when temperature[j] <= 0 or the vocabulary
     * has one token; otherwise p_i = exp((logit_i - max) / temperature[j]), the difference
     * and quotient in float, exp in double rounded to float; the kept tokens are, for top_p[j]
     * in (0, 1), the shortest prefix of the tokens in descending p (ties to the lower id)
     * whose sum reaches top_p[j] times the sum of every p, else every token in id order; and
     * next[j] is the first kept token, in that order, whose running sum exceeds u[j] times the
     * kept sum (the last kept token when u[j] rounds up to it). u[j] in [0, 1) is a uniform
     * drawn by the caller (the scheduler draws it from the request's own generator, as its
     * host sampling would, so the random stream does not depend on where the choice is made).
     * Sums are in double, in an order of the implementation's: the token equals the host's
     * (engine/sampling.h, mkv_sample_with_u) except when u[j] falls within rounding of a
     * boundary between two tokens. All arrays are host memory of n_slots entries; the
     * implementation may overwrite its copy of the logits. */
    mkv_status_t (*decode_sample)(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                  const int32_t *tokens, const float *temperature, const float *top_p,
                                  const double *u, int32_t *next);
    /* Optional (NULL: not offered): prefill for n_slots admitted, uncommitted slots in one
     * pass, their prompts packed (slot j's lens[j] tokens, as admitted, follow slot j - 1's;
     * their sum at most max_tokens): every layer, then committed, and slot j's last
     * position's logits into last_logits [n_slots][vocab]. What prefill slot by slot gives,
     * up to the rounding of GEMMs of another shape. */
    mkv_status_t (*prefill_batch)(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                  const int32_t *tokens, const int32_t *lens, float *last_logits);
} mkv_forward_t;

/* ---------------------------------------------------------------------------------------- */
/* Statistics, validation, dumps                                                            */
/* ---------------------------------------------------------------------------------------- */

typedef struct mkv_cache_stats {
    int64_t total_pages;     /* P */
    int64_t free_pages;      /* tail - head */
    int64_t reserved_pages;  /* held for admitted prompts, still in the free list */
    int64_t available_pages; /* free - reserved */
    int64_t pages_hi;        /* pages in high-precision sections */
    int64_t pages_lo;        /* pages in low-precision sections */
    int64_t tokens_hi;       /* sum of n_hi over head-regions */
    int64_t tokens_lo;       /* sum of n_lo */
    int64_t tokens_seen;     /* sum of N over active slots, times L * H */
    int64_t tokens_pruned;   /* tokens_seen - tokens_hi - tokens_lo */
    int32_t active_slots;
    int64_t bytes_in_use;    /* (pages_hi + pages_lo) * page_bytes */
    int64_t bytes_fp16;      /* what an FP16 cache would hold: tokens_seen * 2 * d * 2 bytes */
} mkv_cache_stats_t;

mkv_status_t mkv_cache_stats(const mkv_cache_t *cache, mkv_cache_stats_t *out_stats);

typedef struct mkv_slot_info {
    int32_t active;
    int32_t seq_len;         /* N */
    int64_t reserved_pages;
    int64_t tokens_hi, tokens_lo; /* over the slot's L * H head-regions */
    int64_t pages_hi, pages_lo;
} mkv_slot_info_t;

mkv_status_t mkv_cache_slot_info(mkv_cache_t *cache, int32_t slot, mkv_slot_info_t *out_info);

/* The prompt length an active slot was admitted with: the rows its prefill calls take (since
 * 0.3). INVALID_ARGUMENT for a slot out of range or not active. */
mkv_status_t mkv_cache_prompt_len(mkv_cache_t *cache, int32_t slot, int32_t *out_len);

/* N of each of n_slots active slots into out_lens [n_slots] (since 0.4): what a forward pass
 * needs every step (the new token's position), without mkv_cache_slot_info's per-slot sums,
 * which on the CUDA backend cost a reduction and a wait each. Waits for the device only where
 * an asynchronous step is pending, once for all slots. INVALID_ARGUMENT (out_lens untouched)
 * for a null pointer, n_slots < 0, or a slot out of range or not active. */
mkv_status_t mkv_cache_seq_lens(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                int32_t *out_lens);

/* Checks every invariant of DESIGN.md section 4: each page id in exactly one place (the free
 * region of the ring or one table row), each row holding ceil(n_hi / tpp_hi) left entries
 * and ceil(n_lo / tpp_lo) right entries, counts within N, reservations covered by free pages.
 * Returns CORRUPT with the first violation in the last-error message. */
mkv_status_t mkv_cache_validate(mkv_cache_t *cache);

/* Writes the whole state as JSON (docs/dump-format.md) to path ("-" for stdout). */
mkv_status_t mkv_cache_dump_json(mkv_cache_t *cache, const char *path);

/* The same dump as a NUL-terminated string; free it with mkv_free(). */
mkv_status_t mkv_cache_dump_json_string(mkv_cache_t *cache, char **out_json);

/* Creates a CPU-backend cache holding the state of a dump. A dump that does not parse, has
 * another format version, or violates an invariant is refused (PARSE_ERROR or CORRUPT). */
mkv_status_t mkv_cache_load_json(const char *path, mkv_cache_t **out_cache);

#ifdef __cplusplus
}
#endif

#endif /* MIXKV_H */
