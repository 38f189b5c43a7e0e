/*
 * tc_item.cuh — one warp's item in the tensor-core decode kernel (run_item): the walk over its
 * tokens 16 at a time (a subtile), staged in shared memory by cp.async two or three stages
 * ahead (the whole warp copies the subtile's page segments in 16-byte units; every sector is
 * read once), and the loop of named steps over them: q once (load_q_raw, form_q;
 * tc_query.cuh), then per subtile subtile_logits (tc_subtile.cuh), per softmax step
 * softmax_step (and store_compact_step in fused calls with compact logits; tc_softmax.cuh),
 * per subtile subtile_values, and write_partial (tc_softmax.cuh) at the end. PIECES (tc_args::piece_tokens):
 * the item is the warp's first piece, the producer moving on to the region's next pieces as it
 * claims them, the consumer following the stages' recorded token counts. Part of the kernel
 * template (tc_decode.cuh); the staging layout is tc_staging.cuh's.
 */
#ifndef MKV_ATTENTION_TC_ITEM_CUH
#define MKV_ATTENTION_TC_ITEM_CUH

#include "attention/decode_tc.h"
#include "attention/tc_ptx.cuh"
#include "attention/tc_staging.cuh"
#include "attention/tc_subtile.cuh"
#include "attention/tc_trace.cuh"

namespace mkv_tc {

/* One warp's item: the logits of its tokens (to the workspace), and its unnormalised partial
 * output, running max and sum (to its part slot, or fused to the warp's staging area for
 * block_merge). */
template <int KB, int VB, int D, int KG, int VG, bool FUSED, int WSTRIDE, bool HALVES, bool PIECES = false>
__device__ __forceinline__ void run_item(const tc_args &a, uint8_t *smem, const item_pos &ip,
                                         const piece_pos &pp = piece_pos{})
{
    using SL = stage_layout<KB, VB, D, KG, VG>;
    constexpr int NT = SL::NT, S = SL::STAGES;
    /* Subtiles per softmax step (step_subtiles), tokens per step of the compact logits. */
    constexpr int PAIR = step_subtiles<KB, VB, D, KG, VG>();
    /* Compact logits: the weights from the codes' y (p = y 2^(R - m)) where a step holds two or
     * more subtiles; with one (K16V16, K8V8) the second copy of the values' code that this needs
     * made K16V16 spill, and they keep p = 2^(l - m). */
    constexpr bool P_FROM_Y = PAIR >= 2;
    constexpr int MTILES = D / 16;
    constexpr bool KQ = SL::KQ, VQ = SL::VQ;

    const int32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tc = lane & 3;
    const int64_t rs = ip.rs, region = ip.region;
    const int32_t sec = ip.sec, ta = ip.ta, tb = ip.tb;
    const tc_section L = a.sec[sec];
    const int32_t *row = a.table + region * a.T;
    const int32_t stride = L.tpp * 16;
    const int G = a.G;
    const int32_t sec_n = ip.sec_n;

    static_assert(item_q<KB, D, KG, HALVES>::KQ == KQ, "one notion of quantized keys");

    softmax_state<MTILES> sm;
    sm.init();
    /* This thread's logits of the next subtile: token gr, heads 2tc and 2tc + 1 (token gr + 8 is
     * 8 G further on); lanes 2tc >= G store none. */
    const int64_t lin = rs * (a.sec_items + 1) * a.item_tokens + ip.lg_tok;
    const bool lg_lane = 2 * tc < G;
    /* Compact logits (tc_args): lg is then the lane's word of lg_a (token gr, pair tc),
     * advanced once per softmax step, after its stores. */
    const bool compact = FUSED && a.compact; /* the separate pass's kernel: never (decision 89) */
    /* fp32 logits stored by this lane (none without a score write-back) */
    const bool store_lg = lg_lane && !compact && a.keep_logits;
    float *lg = compact ? reinterpret_cast<float *>(a.lg_a + tc * a.lg_n + lin + gr) : a.logits + (lin + gr) * G + 2 * tc;

    /* The warp's staging area: [stage][subtile][BYTES_PER_SUBTILE], WSTRIDE bytes apart. */
    static_assert(WSTRIDE >= SL::WARP_BYTES, "a warp's staging area fits its stride");
    const uint32_t warp_smem = (uint32_t)__cvta_generic_to_shared(smem) + warp * WSTRIDE;
    const uint8_t *warp_gen = smem + warp * WSTRIDE;
    /* The copy: lane (tl, half) moves token tl's units of chunks 2k + half (keys, then values)
     * and, where the format has them, its key (half 0) or value (half 1) metadata. Offsets are
     * 32-bit: the tensor-core path takes pages under 2 GiB. */
    const int32_t tl = lane & 15, half = lane >> 4;
    const int32_t koff = (int32_t)L.off_key, voff = (int32_t)L.off_value;
    const int32_t moff = half ? (int32_t)L.off_value_meta : (int32_t)L.off_key_meta;
    const bool meta_lane = half ? VQ : KQ;
    const int32_t mstride = L.tpp * 4; /* a metadata segment's groups, [group][slot] */

    walker P = {ta, ta / L.tpp, ta % L.tpp}; /* producer: what to load next */
    int32_t ct = ta;                         /* consumer: the next token to compute */
    /* The producer's range: tokens [P.t, ptb) of section psec (the item's; PIECES: the
     * current piece's, both sections in one layout: tc_args::piece_tokens). */
    int32_t psec = sec, ptb = tb;
    /* Page ids 32 at a time: lane i holds the id of page win + i of the section (one load per
     * 32 pages, then a shuffle per token's page, instead of a dependent load per page). */
    int32_t sec_pages = (sec_n + L.tpp - 1) / L.tpp;
    int32_t win = INT32_MIN / 2, win_id = -1;
    /* PIECES: lane 0's last claim on the region's counter (the next piece, less
     * pp.first_dynamic; -1: none yet), taken a piece ahead of its use so that its round trip
     * overlaps the copies (the first once the first stages' copies are issued, or where the
     * first piece ends within them, then); and the tokens of each stage as produced, a byte
     * per stage (the consumer's subtile counts, since a stage's tokens need not continue the
     * previous stage's). */
    int32_t claim = -1;
    uint32_t stok = 0;
    auto take_claim = [&]() {
        if (lane == 0) {
            griddep_wait(); /* the counters' zeroing kernel */
            claim = atomicAdd(pp.counter, 1);
        }
    };
    /* PIECES: where the producer's range is done, the claimed piece becomes its range (if
     * the region has it) and the next one is claimed. Warp-uniform. */
    auto next_piece = [&]() {
        if (P.t < ptb) return;
        if (__shfl_sync(0xffffffffu, claim, 0) < 0) take_claim();
        const int32_t k = pp.first_dynamic + __shfl_sync(0xffffffffu, claim, 0);
        if (k >= pp.np) return;
        psec = k >= pp.ph;
        /* (the high section's counter pieces start after its static first pieces, pp.s0) */
        const int32_t t = psec ? (k - pp.ph) * a.piece_tokens : pp.s0 + k * a.piece_tokens;
        const int32_t sn = psec ? pp.n - pp.hi : pp.hi;
        ptb = min(t + a.piece_tokens, sn);
        sec_pages = (sn + L.tpp - 1) / L.tpp;
        P = walker{t, t / L.tpp, t % L.tpp};
        win = INT32_MIN / 2; /* another section's row, or other pages */
        take_claim();
    };

    /* The window over the pages of the producer's next n >= 1 tokens (at most 32 pages: n <=
     * 32), loaded afresh where it does not hold them all. Warp-uniform. */
    auto window = [&](int32_t n) {
        const int32_t last = P.pidx + page_step_of(P.slot + n - 1, L.tpp).q;
        if ((uint32_t)(P.pidx - win) >= 32u || (uint32_t)(last - win) >= 32u) {
            win = P.pidx;
            const int32_t e = win + lane;
            win_id = e < sec_pages ? __ldg(row + (psec ? a.T - 1 - e : e)) : 0;
        }
    };
    /* The page and slot of the producer's token off (0 <= off < 32) further on, for this lane
     * (every lane calls it: a shuffle from the window). */
    auto lane_at = [&](int32_t off, const uint8_t *&page, int32_t &slot) {
        const page_step p = page_step_of(P.slot + off, L.tpp);
        slot = p.slot;
        const int32_t pid = __shfl_sync(0xffffffffu, win_id, P.pidx + p.q - win);
        // NOTE: int32 page id, widen before the multiply (pools exceed 2 GiB).
        page = a.pool + (int64_t)pid * a.page_bytes;
    };

    /* Issues the cp.async of one stage (NT subtiles) and commits it (possibly empty). */
    auto produce = [&](int32_t stage) {
        if constexpr (PIECES) next_piece();
        const int32_t t0 = P.t;
        if constexpr (SL::WHOLE) {
            /* Runs: up to 32 tokens, of the item or of the stage's subtiles, whichever ends
             * first; a run of len tokens fills the next ceil(len / 16) subtiles. Lane i copies
             * run token i whole: its chunks and its key and value metadata, from its page (the
             * lanes' copies per subtile, two chunks each, had spent most of their instructions
             * on addresses). Each copy's address is formed inside its asm: computed up front,
             * the eight made K4V2's kernel spill. */
            int32_t u0 = 0; /* the run's first subtile */
#pragma unroll
            for (int run = 0; run < (NT + 1) / 2; run++) { /* a stage holds at most ceil(NT / 2) runs */
                if (u0 >= NT) break;
                const int32_t len = min(ptb - P.t, min(NT - u0, 2) * 16);
                if (len <= 0) break; /* warp-uniform: nothing left to load */
                window(len);
                /* Tokens past the run's end in its last subtile copy nothing (source size 0,
                 * zeros written) from an in-page address: the run's first token's. */
                const bool ok = lane < len;
                const uint8_t *page;
                int32_t slot;
                lane_at(ok ? lane : 0, page, slot);
                if (lane < ((len + 15) & ~15)) {
                    const uint8_t *tok = page + slot * 16;
                    const uint32_t dst = warp_smem + (stage * NT + u0 + (lane >> 4)) * SL::BYTES_PER_SUBTILE;
#pragma unroll
                    for (int c = 0; c < SL::KC; c++)
                        cp_async_page_at<16, FUSED>(dst + SL::key_at(c, tl), tok, koff + c * stride, ok);
#pragma unroll
                    for (int c = 0; c < SL::VC; c++)
                        cp_async_page_at<16, FUSED>(dst + SL::value_at(c, tl), tok, voff + c * stride, ok);
                    /* Metadata group g of the token at off_meta + (g tpp + slot) 4: one add a group. */
                    int32_t mo = (int32_t)L.off_key_meta + slot * 4;
#pragma unroll
                    for (int g = 0; g < KG; g++, mo += mstride)
                        cp_async_page_at<4, FUSED>(dst + SL::META + g * 64 + tl * 4, page, mo, ok);
                    mo = (int32_t)L.off_value_meta + slot * 4;
#pragma unroll
                    for (int g = 0; g < VG; g++, mo += mstride)
                        cp_async_page_at<4, FUSED>(dst + SL::VMETA + g * 64 + tl * 4, page, mo, ok);
                }
                P.advance(len, L.tpp);
                u0 += (len + 15) >> 4;
            }
        } else {
#pragma unroll
            for (int st = 0; st < NT; st++) {
                const int32_t cnt = subtile_count(P.t, ptb);
                if (cnt == 0) break; /* warp-uniform: nothing left to load */
                window(cnt);
                const uint32_t dst = warp_smem + (stage * NT + st) * SL::BYTES_PER_SUBTILE;
                /* Tokens past the subtile's end copy nothing (source size 0, zeros written) from an
                 * in-page address: the subtile's first token's. */
                const bool ok = tl < cnt;
                const uint8_t *page;
                int32_t slot;
                lane_at(ok ? tl : 0, page, slot);
                const uint8_t *tok = page + slot * 16;
#pragma unroll
                for (int k = 0; k < SL::ROUNDS; k++) {
                    const int32_t c = 2 * k + half;
                    if (2 * k + 1 < SL::KC || (2 * k < SL::KC && half == 0)) {
                        cp_async_page<16, FUSED>(dst + SL::key_at(c, tl), tok + (koff + c * stride), ok);
                    } else if (c - SL::KC < SL::VC) {
                        const int32_t cv = c - SL::KC;
                        cp_async_page<16, FUSED>(dst + SL::value_at(cv, tl), tok + (voff + cv * stride), ok);
                    }
                }
                if constexpr (KQ || VQ)
                    if (meta_lane) {
                        /* half 0: the key groups, half 1: the value groups */
                        const uint32_t mdst = dst + (half ? SL::VMETA : SL::META) + tl * 4;
                        int32_t mo = moff + slot * 4;
#pragma unroll
                        for (int g = 0; g < (KG > VG ? KG : VG); g++, mo += mstride)
                            if (g < (half ? VG : KG))
                                cp_async_page_at<4, FUSED>(mdst + g * 64, page, mo, ok);
                    }
                P.advance(cnt, L.tpp);
            }
        }
        if constexpr (PIECES) /* at most 16 NT < 256 tokens */
            stok = (stok & ~(0xffu << (8 * stage))) | ((uint32_t)(P.t - t0) << (8 * stage));
        cp_async_commit();
    };

    /* The loop: a stage refilled, the next one computed (its logits, PAIR subtiles a softmax
     * step, their values), until the item's tokens are done. */
    /* q's loads first, then the first stages' page ids and copies, then q formed: its loads,
     * the page ids' and its forming overlap instead of following each other (every item's
     * start). */
    float qv[D / 4];
    load_q_raw<KB, D, KG, HALVES>(a, rs, gr, tc, qv);
#pragma unroll
    for (int s = 0; s < S - 1; s++) produce(s);
    item_q<KB, D, KG, HALVES> Q;
    form_q(a, qv, gr, tc, Q);
    if constexpr (PIECES)
        if (lane == 0 && claim < 0) take_claim();

    int32_t ps = S - 1, cs = 0; /* the stages being filled and computed */
#ifdef MKV_TC_TRACE
    bool first = true;
#endif
    /* The consumer's range: tokens [ct, ctb) of the item; PIECES: the stage's own (from 0). */
    while (PIECES ? ((stok >> (8 * cs)) & 0xffu) != 0 : ct < tb) {
        int32_t ctb = tb;
        if constexpr (PIECES) ct = 0, ctb = (int32_t)((stok >> (8 * cs)) & 0xffu);
        /* Lanes read each other's copies: every lane is done with the stage refilled next
         * (read in the previous round) before any lane copies into it, and every lane's copies
         * of stage cs have landed before any lane reads them. */
        __syncwarp();
        produce(ps);
        ps = ps + 1 == S ? 0 : ps + 1;
        cp_async_wait<S - 1>(); /* this lane's copies of stage cs have landed */
        __syncwarp();
#ifdef MKV_TC_TRACE
        if (lane == 0 && first) trace_stamp(a, TR_FIRST, ta);
        first = false;
#endif
        const uint8_t *stage = warp_gen + cs * NT * SL::BYTES_PER_SUBTILE;
        cs = cs + 1 == S ? 0 : cs + 1;
#pragma unroll
        for (int st = 0; st < NT; st += PAIR) {
            /* Logits of PAIR subtiles (one softmax step for all of them). */
            int32_t cnt[PAIR];
            float l[PAIR][2][2];
            uint32_t vm[PAIR][2];
#pragma unroll
            for (int u = 0; u < PAIR; u++) {
                cnt[u] = subtile_count(ct, ctb);
                ct += cnt[u];
                if (u == 0 && cnt[0] == 0) break; /* warp-uniform: the item is done */
                if (cnt[u] == 0) { /* an empty second subtile: nothing staged to read */
                    l[u][0][0] = l[u][0][1] = l[u][1][0] = l[u][1][1] = -INFINITY;
                    vm[u][0] = vm[u][1] = 0u;
                    continue;
                }
                subtile_logits<SL, KB, D, KG, VG, HALVES, !FUSED>(stage + (st + u) * SL::BYTES_PER_SUBTILE, cnt[u], Q, gr, tc, l[u],
                                                  vm[u], lg, G, store_lg);
                if (!compact) lg += cnt[u] * G;
            }
            if (cnt[0] == 0) break;
            float mxr[2]; /* the step's maximum logit per head column */
            softmax_step<VQ, VG, PAIR>(sm, l, vm, mxr);
            if (compact) store_compact_step<PAIR, P_FROM_Y>(a, lg, l, cnt, mxr, sm, gr, tc, lg_lane);
            /* Compact logits with P_FROM_Y: l now holds the weights themselves. */
            if (P_FROM_Y && compact) {
#pragma unroll
                for (int u = 0; u < PAIR; u++) {
                    if (u > 0 && cnt[u] == 0) break;
                    subtile_values<SL, VB, D, VG, true>(sm, stage + (st + u) * SL::BYTES_PER_SUBTILE, l[u], vm[u],
                                                        gr, tc);
                }
            } else {
#pragma unroll
                for (int u = 0; u < PAIR; u++) {
                    if (u > 0 && cnt[u] == 0) break;
                    subtile_values<SL, VB, D, VG, false>(sm, stage + (st + u) * SL::BYTES_PER_SUBTILE, l[u], vm[u],
                                                         gr, tc);
                }
            }
        }
    }
    cp_async_wait<0>();

    write_partial<VB, D, VG, FUSED, SL::WARP_BYTES>(a, smem, ip, sm, gr, tc);
    if (lane == 0) trace_stamp(a, TR_ITEM, ta);
}

} // namespace mkv_tc

#endif /* MKV_ATTENTION_TC_ITEM_CUH */
