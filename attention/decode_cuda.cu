/*
 * decode_cuda.cu — decode attention over mixed-precision pages on the GPU (contract in
 * decode_cuda.h; reference: mkv_attn_decode_region in decode_ref.c, which the GPU tests in
 * tests/gpu/test_decode_cuda.c compare against): the entry points, the checks of a call's
 * arguments, and the launch of the tensor-core kernels (planned in decode_plan.cu, kernels in
 * tc_decode.cuh, the separate pass's finalize in decode_tc_finalize.cu); calls they do not
 * cover take the generic fp32 kernels (decode_generic.cu).
 */
#include "attention/decode_cuda.h"

#include "attention/decode_generic.h"
#include "attention/decode_plan.h"
#include "attention/decode_tc.h"
#include "common/error.h"

#include <cuda_runtime.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                             */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t bad(char *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        char msg[MKV_ERR_LEN];
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        mkv_fail(err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cuda_decode: %s", msg);
    }
    return MKV_STATUS_INVALID_ARGUMENT;
}

/* The kernels trust the layout's arithmetic; check the fields they use against each other. */
static bool vec_ok(const mkv_vec_layout_t *v, int32_t d)
{
    const int32_t b = v->bits;
    if (b != 16 && b != 8 && b != 4 && b != 2) return false;
    if (v->vec_bytes != d * b / 8 || v->chunk_bytes != (v->vec_bytes < 16 ? v->vec_bytes : 16))
        return false;
    if (v->n_chunks * v->chunk_bytes != v->vec_bytes || v->chunk_elems != v->chunk_bytes * 8 / b)
        return false;
    /* groups: 1 for 16-bit; else d / group_elems with group_elems a power of two >= 16 (the
     * dequantizers find an element's group by a shift), so 1 .. 16 groups. */
    const int32_t ge = v->group_elems;
    if (ge < 16 || (ge & (ge - 1)) != 0 || (b == 16 && v->groups != 1)) return false;
    return ge * v->groups == d;
}

static bool layout_ok(const mkv_page_layout_t *l, int32_t d, int64_t page_bytes)
{
    if (l->tokens < 1 || l->head_dim != d || !vec_ok(&l->key, d) || !vec_ok(&l->value, d))
        return false;
    const int64_t n = l->tokens; /* segments as large as the accessors address */
    if (l->bytes[MKV_SEG_KEY] != n * l->key.vec_bytes ||
        l->bytes[MKV_SEG_VALUE] != n * l->value.vec_bytes ||
        l->bytes[MKV_SEG_KEY_META] != n * MKV_META_BYTES(l->key.groups, l->key.bits) ||
        l->bytes[MKV_SEG_VALUE_META] != n * MKV_META_BYTES(l->value.groups, l->value.bits) ||
        l->bytes[MKV_SEG_SCORE] != n * 4)
        return false;
    for (int s = 0; s < MKV_PAGE_SEGMENTS; s++)
        if (l->offset[s] < 0 || l->offset[s] % MKV_SEGMENT_ALIGN != 0 || l->bytes[s] < 0 ||
            l->offset[s] + l->bytes[s] > page_bytes)
            return false;
    return l->used_bytes <= page_bytes;
}


/* ---------------------------------------------------------------------------------------- */
/* The tensor-core path (decode_tc.h; planned in decode_plan.cu)                            */
/* ---------------------------------------------------------------------------------------- */

static tc_section section_of(const mkv_page_layout_t &l)
{
    tc_section s;
    s.tpp = l.tokens;
    s.off_key = l.offset[MKV_SEG_KEY], s.off_key_meta = l.offset[MKV_SEG_KEY_META];
    s.off_value = l.offset[MKV_SEG_VALUE], s.off_value_meta = l.offset[MKV_SEG_VALUE_META];
    s.off_score = l.offset[MKV_SEG_SCORE];
    return s;
}

static mkv_status_t launch_tc(const mkv_cuda_decode_t *a, cudaStream_t stream, char *err)
{
    using namespace mkv_tc_plan;
    const tc_kernel fh = tc_for(&a->lay_hi, a->head_dim);
    const tc_kernel fl = tc_for(&a->lay_lo, a->head_dim);
    const tc_kernel one = tc_one_launch(a);
    bool fused;
    int32_t blocks;
    const tc_plan w = plan_call(a, one, &fused, &blocks);
    uint8_t *ws = static_cast<uint8_t *>(a->workspace);
    tc_args f;
    f.pool = a->pool, f.page_bytes = a->page_bytes, f.table = a->table;
    f.n_hi = a->n_hi, f.n_lo = a->n_lo, f.T = a->row_entries, f.regions = a->regions;
    f.H = a->n_heads, f.G = a->group_size, f.max_tokens = a->max_tokens;
    f.item_tokens = w.item_tokens, f.sec_items = w.sec_items;
    f.sec[0] = section_of(a->lay_hi), f.sec[1] = section_of(a->lay_lo);
    f.q = a->q, f.out = a->out, f.softmax_scale = a->softmax_scale;
    f.out16 = a->out16, f.out_bf16 = a->out_bf16;
    f.logits = reinterpret_cast<float *>(ws + w.off_logits);
    f.part_o = reinterpret_cast<float *>(ws + w.off_part_o);
    f.part_ml = reinterpret_cast<float *>(ws + w.off_part_ml);
    f.blocks_per_sec = (w.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS;
    f.n_rs = a->n_seq * a->n_heads;
    f.counters = fused ? reinterpret_cast<int32_t *>(ws + w.off_counters) : nullptr;
    f.lse = fused ? reinterpret_cast<float *>(ws + w.off_lse) : nullptr;
    f.fused = 0, f.discard = 0;
    f.keep_logits = !a->no_scores;
    f.compact = 0, f.lg_n = 0, f.lg_a = nullptr, f.lg_b = nullptr, f.lg_r = nullptr;
    if (w.compact) { /* in place of the fp32 logits, fused or separate */
        const tc_compact_layout cl = mkv_tc_compact_layout((size_t)w.lg_n_tok, f.G);
        f.compact = 1;
        f.lg_n = w.lg_n_tok;
        f.lg_a = reinterpret_cast<uint32_t *>(f.logits);
        f.lg_b = reinterpret_cast<uint8_t *>(f.logits) + cl.off_b;
        f.lg_r = reinterpret_cast<float *>(reinterpret_cast<uint8_t *>(f.logits) + cl.off_r);
    }
    f.total_ids = (int32_t)w.total_ids;
    f.last_blocks_last = 0, f.tail_rs = f.n_rs, f.tail_gx = 1, f.head_rs = 0; /* (fused calls below) */
    f.piece_tokens = 0, f.wave_blocks = 0, f.piece_static = 0, f.merge_split = 1;
    f.trace = mkv_tc_trace_buffer;
    f.ready = nullptr;
    f.hi_item = 0, f.hi_cap = 0, f.hi_align = 0; /* (the separate pass's one launch below) */
    /* The separate and finalize passes' grids put the blocks' index last where grid z holds
     * them (tc_args::x_last): every region's first blocks start before any region's later,
     * often empty, ones. */
    const auto order = [&](unsigned blocks, bool x_last) {
        return x_last ? dim3((unsigned)a->n_heads, (unsigned)a->n_seq, blocks)
                      : dim3(blocks, (unsigned)a->n_heads, (unsigned)a->n_seq);
    };
    const bool x_last = w.sec_items + 1 <= 65535;
    f.x_last = x_last;
    /* the separate pass's blocks of one section (two launches) */
    const dim3 grid = order((unsigned)((w.sec_items + MKV_TC_SEP_WARPS - 1) / MKV_TC_SEP_WARPS), x_last);
    mkv_status_t st;
    if (one.launch != nullptr) { /* one launch covers both sections */
        f.sec_mask = 3;
        f.grid_x = f.blocks_per_sec + 1; /* a region's high and low blocks together */
        if (fused) {
            f.fused = 1;
            f.discard = (uintptr_t)f.logits % 128 == 0;
            /* Counters and score-job entries (if any: entries hold a decode id + 1, 0 until
             * published) zeroed by a kernel ahead of the decode kernel, which starts before it
             * ends (programmatic serialization; a memset would not let it); a persistent grid
             * of what the GPU holds. */
            f.piece_tokens = w.piece_tokens; /* its counters in place of the score jobs */
            f.piece_static = w.piece_static;
            f.merge_split = w.merge_split;
            const size_t words =
                (size_t)f.n_rs + 4 + (f.keep_logits ? (size_t)f.total_ids : f.piece_tokens > 0 ? (size_t)f.n_rs : 0);
            if ((st = mkv_decode_launched("decode counters' zeroing kernel", err,
                               mkv_tc_zero_counters(f.counters, words, stream))) != MKV_STATUS_OK)
                return st;
            const int64_t resident = (int64_t)blocks * device_attr(cudaDevAttrMultiProcessorCount, 1);
            f.last_blocks_last = w.last_blocks_last;
            f.wave_blocks = w.last_blocks_last ? w.wave_blocks : 0;
            if (w.tail_regions > 0 || w.head_regions > 0) { /* half-size items: the queue's last */
                f.tail_rs = f.n_rs - w.tail_regions;       /* regions and its first (decision 96) */
                f.head_rs = w.head_regions;
                f.tail_gx = (2 * w.sec_items + MKV_TC_WARPS - 1) / MKV_TC_WARPS + 1;
                f.total_ids = (f.tail_rs - f.head_rs) * f.grid_x + (f.n_rs - f.tail_rs + f.head_rs) * f.tail_gx;
            }
            const dim3 gp((unsigned)(resident > 0 && resident < f.total_ids ? resident : f.total_ids));
            if ((int64_t)gp.x < f.total_ids) f.merge_split = 1; /* its waits need every block resident */
            return mkv_decode_launched("tensor-core decode kernel (fused scores)", err, one.launch(f, gp, stream));
        }
        /* the separate pass packs a region's items, high then low, into full blocks */
        if (w.ready) f.ready = reinterpret_cast<int32_t *>(ws + w.off_ready);
        f.hi_item = w.hi_item, f.hi_cap = std::min(w.sep_slots, 2 * w.sec_items), f.hi_align = w.hi_align;
        const dim3 g2 = order((unsigned)(w.sep_slots / MKV_TC_SEP_WARPS), x_last);
        if ((st = mkv_decode_launched("tensor-core decode kernel", err, one.launch(f, g2, stream))) != MKV_STATUS_OK)
            return st;
    } else {
        f.sec_mask = 1, f.grid_x = f.blocks_per_sec;
        if ((st = mkv_decode_launched("tensor-core decode kernel (high)", err, fh.launch(f, grid, stream))) !=
            MKV_STATUS_OK)
            return st;
        f.sec_mask = 2;
        if ((st = mkv_decode_launched("tensor-core decode kernel (low)", err, fl.launch(f, grid, stream))) !=
            MKV_STATUS_OK)
            return st;
    }
    return mkv_decode_launched("finalize_kernel", err, mkv_tc_finalize(f, a->head_dim, a->n_seq, stream));
}

extern "C" size_t mkv_cuda_decode_workspace_size(int32_t n_seq, int32_t n_heads,
                                                 int32_t group_size, int32_t head_dim,
                                                 int32_t max_tokens, int32_t split_tokens)
{
    if (!mkv_tc_plan::sizes_ok(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens)) return 0;
    const size_t generic =
        mkv_decode_generic_workspace(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens);
    if (head_dim != 64 && head_dim != 128) return generic;
    const size_t tc = mkv_tc_plan::workspace_bytes(n_seq, n_heads, group_size, head_dim, max_tokens, split_tokens);
    return tc > generic ? tc : generic;
}

extern "C" size_t mkv_cuda_decode_workspace_bound(int32_t n_seq, int32_t n_heads, int32_t group_size,
                                                  int32_t head_dim, int32_t max_tokens)
{
    if (!mkv_tc_plan::sizes_ok(n_seq, n_heads, group_size, head_dim, max_tokens, 0)) return 0;
    size_t most = 0;
    for (int32_t m = 1; m <= max_tokens; m++) {
        const size_t b = mkv_cuda_decode_workspace_size(n_seq, n_heads, group_size, head_dim, m, 0);
        if (b > most) most = b;
    }
    return most;
}

extern "C" mkv_status_t mkv_cuda_decode(const mkv_cuda_decode_t *a, void *stream, char *err)
{
    if (!a) return bad(err, "null arguments");
    if (!a->pool || !a->table || !a->n_hi || !a->n_lo || !a->regions || !a->q ||
        (!a->out && !a->out16) || !a->workspace)
        return bad(err, "null pointer (pool %p, table %p, n_hi %p, n_lo %p, regions %p, q %p, "
                        "out %p, workspace %p)", (void *)a->pool, (const void *)a->table,
                   (const void *)a->n_hi, (const void *)a->n_lo, (const void *)a->regions,
                   (const void *)a->q, (void *)a->out, a->workspace);
    if (!mkv_tc_plan::sizes_ok(a->n_seq, a->n_heads, a->group_size, a->head_dim, a->max_tokens,
                  a->split_tokens))
        return bad(err, "n_seq %d (0 .. 65535), n_heads %d, group_size %d (1 .. 65535), "
                        "head_dim %d (16, 32, 64, 128 or 256), max_tokens %d or split_tokens "
                        "%d (>= 0) out of range", a->n_seq, a->n_heads, a->group_size,
                   a->head_dim, a->max_tokens, a->split_tokens);
    if (a->mean_tokens < 0) return bad(err, "mean_tokens %d must be >= 0", a->mean_tokens);
    if (a->page_bytes < MKV_SEGMENT_ALIGN || a->page_bytes % MKV_SEGMENT_ALIGN != 0 ||
        (uintptr_t)a->pool % MKV_SEGMENT_ALIGN != 0)
        return bad(err, "page_bytes %lld must be a positive multiple of 16 and the pool 16-byte "
                        "aligned", (long long)a->page_bytes);
    if (a->row_entries < 1) return bad(err, "row_entries %d must be >= 1", a->row_entries);
    if (!layout_ok(&a->lay_hi, a->head_dim, a->page_bytes) ||
        !layout_ok(&a->lay_lo, a->head_dim, a->page_bytes))
        return bad(err, "the page layouts (head_dim %d/%d) do not match head_dim %d and "
                        "page_bytes %lld", a->lay_hi.head_dim, a->lay_lo.head_dim, a->head_dim,
                   (long long)a->page_bytes);
    if (a->kernel < MKV_DECODE_KERNEL_AUTO || a->kernel > MKV_DECODE_KERNEL_TENSOR_PER_SECTION)
        return bad(err, "kernel %d (0 auto, 1 generic, 2 tensor, 3 tensor per section)", a->kernel);
    if (a->scores < MKV_DECODE_SCORES_AUTO || a->scores > MKV_DECODE_SCORES_FUSED)
        return bad(err, "scores %d (0 auto, 1 separate, 2 fused)", a->scores);
    if (a->logits < MKV_DECODE_LOGITS_AUTO || a->logits > MKV_DECODE_LOGITS_COMPACT)
        return bad(err, "logits %d (0 auto, 1 fp32, 2 compact)", a->logits);
    if (a->no_scores != 0 && a->no_scores != 1) return bad(err, "no_scores %d (0 or 1)", a->no_scores);
    const bool tensor = a->kernel != MKV_DECODE_KERNEL_GENERIC &&
                        mkv_cuda_decode_uses_tensor(&a->lay_hi, &a->lay_lo, a->group_size,
                                                    a->head_dim);
    if (a->kernel >= MKV_DECODE_KERNEL_TENSOR && !tensor) {
        if (err)
            mkv_fail(err, MKV_STATUS_UNSUPPORTED, "mkv_cuda_decode: no tensor-core kernel for "
                     "K%dV%d / K%dV%d, head_dim %d, group_size %d, quantization groups (key/value) "
                     "%d/%d, %d/%d (needs head_dim 64 or 128, group_size <= 8, instantiated "
                     "formats, one group a side or the default groups)", a->lay_hi.key.bits,
                     a->lay_hi.value.bits, a->lay_lo.key.bits, a->lay_lo.value.bits, a->head_dim,
                     a->group_size, a->lay_hi.key.groups, a->lay_hi.value.groups,
                     a->lay_lo.key.groups, a->lay_lo.value.groups);
        return MKV_STATUS_UNSUPPORTED;
    }
    if (a->n_seq == 0 || a->max_tokens == 0) return MKV_STATUS_OK;
    if (tensor) return launch_tc(a, static_cast<cudaStream_t>(stream), err);
    return mkv_decode_generic(a, static_cast<cudaStream_t>(stream), err);
}
