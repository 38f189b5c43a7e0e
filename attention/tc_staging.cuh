/*
 * tc_staging.cuh — the tensor-core decode kernel's shared memory and the warp's walk over its
 * item: where a staged subtile's key and value chunks and metadata sit (stage_layout, with the
 * stage count and size), the block's scalars after the staging areas (block_shared), how runs
 * are read back (load_run), and the token, page and slot a warp has reached (walker,
 * item_pos). The copies themselves are run_item's (tc_item.cuh).
 */
#ifndef MKV_ATTENTION_TC_STAGING_CUH
#define MKV_ATTENTION_TC_STAGING_CUH

#include "attention/decode_tc.h"

#include <stdint.h>

namespace mkv_tc {

/* A warp's staged subtile: the page segments of its (up to) 16 tokens as the page holds them,
 * copied by the whole warp in 16-byte units (every sector read whole, once). Key chunks, then
 * value chunks, each chunk a row of 16 tokens x 16 bytes, then the key metadata (KG groups) and
 * the value metadata (VG groups), each group 16 words, [group][token] as in the page. Inside a chunk row, token t sits at unit t ^ swizzle(chunk), so that the
 * fragment reads (thread (gr, tc): key run tc of tokens gr, gr + 8; value run gr of tokens 2tc,
 * 2tc + 1, 2tc + 8, 2tc + 9) hit distinct banks within each phase of a warp's load. */
template <int KB, int VB, int D, int KG, int VG>
struct stage_layout {
    static constexpr int KBYTES = D / 4 * KB / 8, VBYTES_RAW = D / 8 * VB / 8; /* runs */
    static constexpr int VBYTES = VBYTES_RAW < 4 ? 4 : VBYTES_RAW; /* 2-byte runs: a word */
    static constexpr int KW = KBYTES / 4, VW = VBYTES / 4;
    static constexpr bool KQ = KB < 16, VQ = VB < 16;
    static constexpr int KC = D * KB / 128, VC = D * VB / 128; /* 16-byte chunks per token */
    static constexpr int ROUNDS = (KC + VC + 1) / 2;            /* copy rounds (2 chunks each) */
    /* Quantized keys and values of up to 12 chunks (K8V4, K4V8 and K8V2 at d 128 since decision
     * 91): a lane copies whole tokens (run_item). */
    static constexpr bool WHOLE = KQ && VQ && KC + VC <= 12;
    static constexpr int META = (KC + VC) * 256;  /* key metadata, group g at META + 64 g */
    static constexpr int VMETA = META + 64 * KG;  /* value metadata, group g at VMETA + 64 g */
    static constexpr int BYTES_PER_SUBTILE = META + (KQ || VQ ? 64 * (KG + VG) : 0); /* per warp */
    /* Subtiles per stage: fewer, larger stages for small subtiles (one wait and one barrier per
     * stage); three stages, two where a stage is large, so that 12 warps fit an SM. The
     * thresholds are tuning (decode_tuning.h). */
    static constexpr int NT = BYTES_PER_SUBTILE <= mkv_decode_tuning::stage4_max_subtile_bytes ? 4
                              : BYTES_PER_SUBTILE <= mkv_decode_tuning::stage2_max_subtile_bytes ? 2 : 1;
    static constexpr int STAGES = NT * BYTES_PER_SUBTILE > mkv_decode_tuning::stage3_max_bytes ? 2 : 3;
    static constexpr int WARP_BYTES = STAGES * NT * BYTES_PER_SUBTILE;
    /* Byte offset of token t of key chunk c, of value chunk c. */
    __device__ static __forceinline__ int key_at(int c, int t)
    {
        const int x = KBYTES >= 16 ? (2 * (c / (KBYTES / 16))) & 7 : KBYTES == 8 ? 4 * c : 0;
        return (c * 16 + (t ^ x)) * 16;
    }
    __device__ static __forceinline__ int value_at(int c, int t)
    {
        const int y = (c / (VBYTES_RAW >= 16 ? VBYTES_RAW / 16 : 1)) & 1;
        return ((KC + c) * 16 + (t ^ y)) * 16;
    }
};

/* The block's scalars, after the staging areas (which start the dynamic shared memory, so that
 * their swizzle keeps its bank pattern). */
struct region_info {
    int64_t rs, region;
    int32_t hi, n, items_hi, n_items, arrivals;
    int32_t first_id; /* the decode id of its block x = 0 */
};

/* Where a block's items meet (block_merge): its part slot (the region's block x, high
 * blocks first), how many of its warps had an item, and the stride of their partial results
 * in shared memory (the section format's staging area per warp: each warp writes its result
 * into its own area). */
struct block_part {
    int32_t slot, n_work, stride;
};

struct block_shared {
    region_info reg; /* the fused kernel's current region (kept here, not in registers, across
                        the items) */
    block_part part; /* the block's current part (likewise) */
    int32_t cmd, arg, last;
    int32_t slice;           /* the fused kernel's: the block's arrival, counted from the last */
    int32_t nap;             /* thread 0's: its next pause (ns) while nothing is to be taken */
    int32_t owed, exhausted; /* thread 0's: the score job ticket it holds (-1: none); whether
                                every decode id has been taken */
    int32_t started;         /* thread 0's: whether the block took its first decode id (its own
                                block index, without the queue) */
    int32_t own_job;         /* thread 0's: the score job (a decode id) of the single-block
                                region the block just finished, run next by the block itself;
                                -1: none */
    int32_t zeroed;          /* thread 0's: whether it has waited for the counters' zeroing
                                kernel (launched ahead with programmatic serialization: the
                                first item runs meanwhile); here, not in a register, which
                                made ptxas spill in the fused one-group mix */
    float M[MKV_TC_MAX_G], S[MKV_TC_MAX_G], lse[MKV_TC_MAX_G];
    float wf[MKV_TC_WARPS][MKV_TC_MAX_G]; /* block_merge's weights of the warps' items */
};

/* Subtiles per softmax step: all of a stage's where it holds two or four (one max, rescale
 * test and value-scale reduction per 32 or 64 tokens instead of 16). Four need the 3-block
 * bound of decode_kernel's __launch_bounds__ to stay at 168 registers. */
template <int KB, int VB, int D, int KG, int VG>
__host__ __device__ constexpr int step_subtiles()
{
    return stage_layout<KB, VB, D, KG, VG>::NT >= 4 ? 4 : stage_layout<KB, VB, D, KG, VG>::NT >= 2 ? 2 : 1;
}

/* Run R (BYTES bytes: run R of a vector is its bytes [R * BYTES, (R + 1) * BYTES)) of staged
 * token t, where at(c, t) is the byte offset of token t's unit in chunk row c. 2-byte runs: the
 * word holding the run, shifted down for odd R. */
template <int BYTES, int W, typename At>
__device__ __forceinline__ void load_run(const uint8_t *sub, At at, int R, int t, uint32_t (&w)[W])
{
    if constexpr (BYTES >= 16) {
#pragma unroll
        for (int i = 0; i < BYTES / 16; i++) {
            const uint4 v = *reinterpret_cast<const uint4 *>(sub + at(R * (BYTES / 16) + i, t));
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if constexpr (BYTES == 8) {
        const uint2 v = *reinterpret_cast<const uint2 *>(sub + at(R / 2, t) + R % 2 * 8);
        w[0] = v.x, w[1] = v.y;
    } else if constexpr (BYTES == 4) {
        w[0] = *reinterpret_cast<const uint32_t *>(sub + at(R / 4, t) + R % 4 * 4);
    } else {
        static_assert(BYTES == 2, "runs of 2 to 16n bytes");
        w[0] = *reinterpret_cast<const uint32_t *>(sub + at(R / 8, t) + R % 8 / 2 * 4) >> (16 * (R & 1));
    }
}

/* x = q tpp + slot for a slot x < tpp + 32 past a page's start: a subtraction per page
 * crossed (none or one for pages of 32 tokens or more), where a division or a multiply by
 * 1 / tpp held a register more in every kernel's copy loop (K16V16's fused kernel spilled). */
struct page_step {
    int32_t q, slot;
};

__device__ __forceinline__ page_step page_step_of(int32_t x, int32_t tpp)
{
    int32_t q = 0;
    while (x >= tpp) x -= tpp, q++;
    return page_step{q, x};
}

/* The copy's walk over the warp's item: the next token to load (section token t, page index
 * pidx in the section's row, slot in that page). A subtile is 16 consecutive tokens of the
 * item, or what is left of it, whatever pages they lie in: pages of any size (unified pages
 * hold 35 K8V4 or 54 K4V2 tokens where they hold 16 fp16 ones) cost no partial subtiles, each
 * lane finding its own token's page (lane_at). Warp-uniform. */
struct walker {
    int32_t t, pidx, slot;
    /* n (<= 32) tokens on */
    __device__ __forceinline__ void advance(int32_t n, int32_t tpp)
    {
        t += n;
        const page_step p = page_step_of(slot + n, tpp);
        pidx += p.q, slot = p.slot;
    }
};

/* The tokens of the item's next subtile from section token t: 16, or what is left before tb. */
__device__ __forceinline__ int32_t subtile_count(int32_t t, int32_t tb) { return max(0, min(16, tb - t)); }

/* Where a warp's item sits: the section's tokens [ta, tb) of head-region rs, item slot slot_id
 * (the row of its partial result in the workspace) and its logits from row lg_tok of the
 * region's. */
struct item_pos {
    int64_t rs, region;
    int32_t sec, sec_n, ta, tb, slot_id; /* sec_n: the section's token count */
    int32_t lg_tok; /* its first token's logit row within the region's (sec_items + 1) x item_tokens */
};

/* The item tokens of the high section of a region of hi high tokens out of n in the separate
 * pass's one launch (tc_args::hi_item): hi_item where its items then fit hi_cap, else
 * item_tokens. */
__device__ __forceinline__ int32_t high_item_tokens(const tc_args &a, int32_t hi, int32_t n)
{
    const int32_t I = a.item_tokens, h = a.hi_item;
    if (h <= 0) return I;
    return (hi + h - 1) / h + (n - hi + I - 1) / I <= a.hi_cap ? h : I;
}

/* A warp's pieces (tc_args::piece_tokens): its first piece is the item ip above; then it takes
 * the region's next piece from the region's counter (counter) until the region's np pieces are
 * taken. A region's pieces: its high section's ph first, then its low section's, each section
 * cut into pieces of tc_args::piece_tokens from its start; pieces below first_dynamic are the
 * blocks' first ones (piece 4 x + w for warp w of block x), the rest handed out by the
 * counter. hi, n: the region's high section's tokens and all its tokens. */
struct piece_pos {
    int32_t *counter;
    int32_t np, ph, first_dynamic, hi, n;
    int32_t s0; /* the high tokens taken as static first pieces (tc_args::piece_static; 0: none):
                   the counter's high pieces start there */
};

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_STAGING_CUH */
