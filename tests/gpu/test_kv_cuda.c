/*
 * test_kv_cuda.c — the CUDA KV backend against the CPU backend, call for call: two caches of
 * one config (only the backend differs) receive the same admissions, prompts, decode steps,
 * compressions, budgets, preemptions and releases, with the same f16 (or bf16, f32) tensors.
 *
 * What must match, after every call:
 *  - exactly: every head-region's section sizes, the positions in each section in order, each
 *    stored token's codes and quantization metadata, the stats; page ids and the ring too, as
 *    long as no near-tie has made the two runs part (see below); both caches validate;
 *  - within tolerance: each token's score sum (relative 1e-3 + 1e-6 absolute), decode outputs
 *    (absolute 2e-3; the same dequantized values, fp32 in another order), prefill outputs
 *    (absolute 1e-2: fp16 tensor cores against fp32, outputs rounded to the element type).
 * Near-ties: the backends' significances differ by rounding, so a token whose significance is
 * within 1e-3 (relative) of a threshold, or of the token it competes with for a pick, may be
 * classified differently. Before every commit and compress the test finds such near-ties on
 * the CPU side; when the two caches then disagree on a slot that had one, the divergence is
 * counted and the slot released on both sides (it would be recomputed by a scheduler); a
 * disagreement without a near-tie fails the test. The counts are printed.
 */
#include "gpu_util.h"

#include "attention/attention.h"
#include "engine/kv.h"
#include "memmgr/cache.h"
#include "memmgr/cuda_mm.h"
#include "quant/format.h"
#include "quant/half.h"
#include "mixkv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kgeom {
    int32_t L, H, G, d, S, max_len, tpp;
    mkv_format_t hi, lo;
    float ah, al;
    int32_t W, obs;
    int64_t pool_pages;
    float mix_high, mix_low; /* the fixed mix (0, 0: the thresholds) */
} kgeom_t;

typedef struct pair {
    kgeom_t g;
    mkv_cache_t *cpu, *gpu;
    mkv_page_layout_t lay[2];
    mkv_dtype_t dt;
    uint64_t rng;
    int32_t committed[64]; /* per slot: prompt committed */
    int32_t target[64];    /* length at which the slot finishes */
    uint8_t *gpool;        /* host copy of the device pool */
    /* host and device tensors, big enough for the largest call */
    size_t cap;
    void *hq, *hk, *hv, *ho_cpu, *ho_gpu;
    void *dq, *dk, *dv, *dout;
    /* counts */
    int64_t steps, commits, compresses, near_ties, divergences, tokens_compared;
    double max_prefill_err, max_decode_err, max_score_rel;
    int no_scores; /* the GPU cache has MKV_CACHE_NO_SCORES: its scores are not compared */
} pair_t;

static mkv_cache_config_t kconfig(const kgeom_t *g, mkv_backend_t be)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = g->L, cfg.n_kv_heads = g->H, cfg.group_size = g->G, cfg.head_dim = g->d;
    cfg.max_seqs = g->S, cfg.max_seq_len = g->max_len;
    cr_assert_eq(mkv_page_bytes_for(g->hi, g->d, 0, 0, g->tpp, &cfg.page_bytes), MKV_STATUS_OK);
    cfg.pool_pages = g->pool_pages;
    cfg.hi_format = g->hi, cfg.lo_format = g->lo;
    cfg.alpha_h = g->ah, cfg.alpha_l = g->al, cfg.window = g->W, cfg.obs_window = g->obs;
    cfg.mix_high = g->mix_high, cfg.mix_low = g->mix_low;
    cfg.backend = be;
    return cfg;
}

static size_t esize(const pair_t *p) { return mkv_dtype_size(p->dt); }

static void pair_init_flags(pair_t *p, const kgeom_t *g, mkv_dtype_t dt, uint64_t seed, uint32_t gpu_flags)
{
    memset(p, 0, sizeof *p);
    p->g = *g;
    p->dt = dt;
    p->rng = seed;
    p->no_scores = (gpu_flags & MKV_CACHE_NO_SCORES) != 0;
    mkv_cache_config_t cfg = kconfig(g, MKV_BACKEND_CPU);
    cr_assert_eq(mkv_cache_create(&cfg, &p->cpu), MKV_STATUS_OK, "%s", mkv_last_error());
    cfg = kconfig(g, MKV_BACKEND_CUDA);
    cfg.flags |= gpu_flags;
    cr_assert_eq(mkv_cache_create(&cfg, &p->gpu), MKV_STATUS_OK, "%s", mkv_last_error());
    const mkv_cache_config_t *rc = &p->cpu->cfg;
    cr_assert_eq(mkv_page_layout(rc->hi_format, g->d, rc->hi_key_group, rc->hi_value_group,
                                 rc->page_bytes, &p->lay[0], NULL), MKV_STATUS_OK);
    cr_assert_eq(mkv_page_layout(rc->lo_format, g->d, rc->lo_key_group, rc->lo_value_group,
                                 rc->page_bytes, &p->lay[1], NULL), MKV_STATUS_OK);
    p->gpool = malloc((size_t)(rc->pool_pages * rc->page_bytes));
    /* the largest call: every slot's prompt at max_len, in one prefill */
    p->cap = (size_t)g->S * g->max_len * g->H * g->G * g->d * 4;
    p->hq = malloc(p->cap), p->hk = malloc(p->cap), p->hv = malloc(p->cap);
    p->ho_cpu = malloc(p->cap), p->ho_gpu = malloc(p->cap);
    cr_assert(p->gpool && p->hq && p->hk && p->hv && p->ho_cpu && p->ho_gpu);
    CUDA_CHECK(cudaMalloc(&p->dq, p->cap));
    CUDA_CHECK(cudaMalloc(&p->dk, p->cap));
    CUDA_CHECK(cudaMalloc(&p->dv, p->cap));
    CUDA_CHECK(cudaMalloc(&p->dout, p->cap));
}

static void pair_init(pair_t *p, const kgeom_t *g, mkv_dtype_t dt, uint64_t seed)
{
    pair_init_flags(p, g, dt, seed, 0);
}

static void pair_free(pair_t *p)
{
    mkv_cache_destroy(p->cpu);
    mkv_cache_destroy(p->gpu);
    free(p->gpool), free(p->hq), free(p->hk), free(p->hv), free(p->ho_cpu), free(p->ho_gpu);
    cudaFree(p->dq), cudaFree(p->dk), cudaFree(p->dv), cudaFree(p->dout);
}

static float urand(pair_t *p) { return (float)((double)(test_rand_next(&p->rng) >> 11) * 0x1p-53 * 2.0 - 1.0); }

/* n random elements of the pair's type into host buffer x (values exact in that type). */
static void rand_tensor(pair_t *p, void *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) {
        const float f = scale * urand(p);
        if (p->dt == MKV_DTYPE_F32) ((float *)x)[i] = f;
        else if (p->dt == MKV_DTYPE_F16) ((uint16_t *)x)[i] = mkv_f32_to_f16(f);
        else ((uint16_t *)x)[i] = mkv_f32_to_bf16(f);
    }
}

static float elem(const pair_t *p, const void *x, int64_t i)
{
    if (p->dt == MKV_DTYPE_F32) return ((const float *)x)[i];
    const uint16_t h = ((const uint16_t *)x)[i];
    return p->dt == MKV_DTYPE_F16 ? mkv_f16_to_f32(h) : mkv_bf16_to_f32(h);
}

static void upload(pair_t *p, int64_t nq, int64_t nkv)
{
    CUDA_CHECK(cudaMemcpy(p->dq, p->hq, (size_t)nq * esize(p), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(p->dk, p->hk, (size_t)nkv * esize(p), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(p->dv, p->hv, (size_t)nkv * esize(p), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(p->dout, 0xff, (size_t)nq * esize(p))); /* poison: NaN in every type */
}

static double compare_out(pair_t *p, int64_t n, double tol, const char *what)
{
    CUDA_CHECK(cudaMemcpy(p->ho_gpu, p->dout, (size_t)n * esize(p), cudaMemcpyDeviceToHost));
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double a = elem(p, p->ho_cpu, i), b = elem(p, p->ho_gpu, i);
        cr_assert(isfinite(b), "%s: GPU out[%lld] is not finite (unwritten?)", what, (long long)i);
        const double e = fabs(a - b);
        if (e > worst) worst = e;
        cr_assert(e <= tol, "%s: out[%lld] CPU %.6g GPU %.6g (tolerance %g)", what, (long long)i, a, b, tol);
    }
    return worst;
}

/* ---------------------------------------------------------------------------------------- */
/* State comparison                                                                         */
/* ---------------------------------------------------------------------------------------- */

static const uint8_t *tok_page(const mkv_cache_t *c, const uint8_t *pool, int64_t r, int sec,
                               int32_t k, int32_t tpp, int32_t *slot)
{
    const int32_t *row = mkv_mm_row(&c->st, r);
    const int32_t T = c->st.g.row_entries;
    const int32_t page = sec ? row[T - 1 - k / tpp] : row[k / tpp];
    *slot = k % tpp;
    return pool + (int64_t)page * c->cfg.page_bytes;
}

static int same_bytes(const uint8_t *a, const uint8_t *b, int64_t n) { return memcmp(a, b, (size_t)n) == 0; }

/* 1 when slot s holds the same tokens on both sides (codes exact, scores within tolerance);
 * 0 with *why filled otherwise. */
static int slot_matches(pair_t *p, int32_t s, char *why, size_t why_len)
{
    const mkv_cache_t *a = p->cpu, *b = p->gpu;
    if (a->st.seq_len[s] != b->st.seq_len[s]) {
        snprintf(why, why_len, "slot %d: N %d vs %d", s, a->st.seq_len[s], b->st.seq_len[s]);
        return 0;
    }
    const int64_t LH = (int64_t)p->g.L * p->g.H;
    for (int64_t lh = 0; lh < LH; lh++) {
        const int64_t r = (int64_t)s * LH + lh;
        const int32_t na[2] = {a->st.n_hi[r], a->st.n_lo[r]}, nb[2] = {b->st.n_hi[r], b->st.n_lo[r]};
        for (int sec = 0; sec < 2; sec++) {
            if (na[sec] != nb[sec]) {
                snprintf(why, why_len, "slot %d region %lld section %d: %d vs %d tokens", s, (long long)lh,
                         sec, na[sec], nb[sec]);
                return 0;
            }
            const mkv_page_layout_t *lay = &p->lay[sec];
            for (int32_t k = 0; k < na[sec]; k++) {
                int32_t sa, sb;
                const uint8_t *pa = tok_page(a, a->pool, r, sec, k, lay->tokens, &sa);
                const uint8_t *pb = tok_page(b, p->gpool, r, sec, k, lay->tokens, &sb);
                int32_t posa, posb;
                memcpy(&posa, pa + mkv_pos_offset(lay, sa), 4);
                memcpy(&posb, pb + mkv_pos_offset(lay, sb), 4);
                if (posa != posb) {
                    snprintf(why, why_len, "slot %d region %lld section %d token %d: position %d vs %d", s,
                             (long long)lh, sec, k, posa, posb);
                    return 0;
                }
                for (int which = 0; which < 2; which++) {
                    const mkv_vec_layout_t *v = which ? &lay->value : &lay->key;
                    for (int32_t ch = 0; ch < v->n_chunks; ch++)
                        cr_assert(same_bytes(pa + mkv_code_offset(lay, which, sa, ch),
                                             pb + mkv_code_offset(lay, which, sb, ch), v->chunk_bytes),
                                  "slot %d region %lld sec %d pos %d: %s codes differ", s, (long long)lh,
                                  sec, posa, which ? "value" : "key");
                    if (v->bits != 16)
                        for (int32_t gr = 0; gr < v->groups; gr++)
                            cr_assert(same_bytes(pa + mkv_meta_offset(lay, which, sa, gr),
                                                 pb + mkv_meta_offset(lay, which, sb, gr), 4),
                                      "slot %d region %lld sec %d pos %d: %s metadata differ", s,
                                      (long long)lh, sec, posa, which ? "value" : "key");
                }
                p->tokens_compared++;
                if (p->no_scores) continue;
                float sca, scb;
                memcpy(&sca, pa + mkv_score_offset(lay, sa), 4);
                memcpy(&scb, pb + mkv_score_offset(lay, sb), 4);
                const double diff = fabs((double)sca - scb), mag = fmax(fabs(sca), fabs(scb));
                cr_assert(diff <= 1e-3 * mag + 1e-6, "slot %d region %lld pos %d: score %.9g vs %.9g", s,
                          (long long)lh, posa, sca, scb);
                if (mag > 1e-4 && diff / mag > p->max_score_rel) p->max_score_rel = diff / mag;
            }
        }
    }
    return 1;
}

static void download(pair_t *p)
{
    mkv_cache_t *g = p->gpu;
    cr_assert_eq(mkv_cuda_mm_download(g->dev, &g->st, g->err), MKV_STATUS_OK, "%s", g->err);
    CUDA_CHECK(cudaMemcpy(p->gpool, mkv_cuda_mm_pool(g->dev),
                          (size_t)(g->cfg.pool_pages * g->cfg.page_bytes), cudaMemcpyDeviceToHost));
}

static void release_both(pair_t *p, int32_t s)
{
    cr_assert_eq(mkv_cache_release(p->cpu, s, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p->cpu));
    cr_assert_eq(mkv_cache_release(p->gpu, s, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p->gpu));
    p->committed[s] = 0;
}

/* Compares every committed slot; a slot that differs after a call in which it had a near-tie
 * is released on both sides and counted; any other difference fails. */
static void compare_all(pair_t *p, const uint8_t *had_near_tie, const char *when)
{
    cr_assert_eq(mkv_cache_validate(p->cpu), MKV_STATUS_OK, "%s: CPU: %s", when, mkv_cache_last_error(p->cpu));
    cr_assert_eq(mkv_cache_validate(p->gpu), MKV_STATUS_OK, "%s: GPU: %s", when, mkv_cache_last_error(p->gpu));
    download(p);
    for (int32_t s = 0; s < p->g.S; s++) {
        if (!p->committed[s]) continue;
        char why[256];
        if (slot_matches(p, s, why, sizeof why)) continue;
        cr_assert(had_near_tie && had_near_tie[s], "%s: the backends disagree without a near-tie: %s", when, why);
        p->divergences++;
        release_both(p, s);
    }
    /* With no divergence so far the two page worlds are the same, page id for page id. */
    if (p->divergences == 0) {
        const mkv_mm_state_t *a = &p->cpu->st, *b = &p->gpu->st;
        cr_assert_eq(a->head, b->head, "%s: ring head", when);
        cr_assert_eq(a->tail, b->tail, "%s: ring tail", when);
        const int64_t rows = mkv_mm_regions(&a->g) * a->g.row_entries;
        cr_assert(memcmp(a->table, b->table, (size_t)rows * 4) == 0, "%s: page tables differ", when);
    }
    mkv_cache_stats_t sa, sb;
    cr_assert_eq(mkv_cache_stats(p->cpu, &sa), MKV_STATUS_OK);
    cr_assert_eq(mkv_cache_stats(p->gpu, &sb), MKV_STATUS_OK);
    cr_assert_eq(sa.free_pages, sb.free_pages, "%s: free pages %lld vs %lld", when, (long long)sa.free_pages,
                 (long long)sb.free_pages);
    cr_assert_eq(sa.tokens_hi, sb.tokens_hi, "%s: tokens_hi", when);
    cr_assert_eq(sa.tokens_lo, sb.tokens_lo, "%s: tokens_lo", when);
    cr_assert_eq(sa.active_slots, sb.active_slots, "%s: active slots", when);
}

/* ---------------------------------------------------------------------------------------- */
/* Near-ties, judged on the CPU side                                                        */
/* ---------------------------------------------------------------------------------------- */

/* Relative distance under which two significances may compare differently on the two sides:
 * f16 and bf16 inputs reach both backends as the same values (scores measured within 3e-6 of
 * each other); f32 queries are rounded to fp16 for the GPU's tensor-core prefill (8e-4). */
static double g_near = 2e-5;

static int near(double a, double b) { return fabs(a - b) <= g_near * fmax(fabs(a), fabs(b)) + 1e-9; }

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The two smallest of n values (inf when missing). */
static void two_smallest(const double *x, int32_t n, double *m1, double *m2)
{
    *m1 = *m2 = INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (x[i] < *m1) *m2 = *m1, *m1 = x[i];
        else if (x[i] < *m2) *m2 = x[i];
    }
}

static int near_distinct(double a, double b) { return a != b && isfinite(a) && isfinite(b) && near(a, b); }

/* Before a compress: whether one of the comparisons Algorithm 1 (engine/policy.c) and the
 * budget make on a head-region of slot s is within rounding, judged on the CPU side: t_c's
 * significance against both thresholds; when t_c stays, the weakest high token outside the
 * window against the next weakest and against the thresholds; when t_c is demoted, the weakest
 * low token against the next, against t_c and against alpha_l / N; with a budget, the tokens
 * on either side of its cut. Exactly equal values are not near-ties: both backends then break
 * the tie by position. */
static int slot_near_tie(pair_t *p, int32_t s)
{
    const mkv_cache_t *c = p->cpu;
    const int32_t N = c->st.seq_len[s], plen = c->prompt_len[s], W = p->g.W;
    const double th_h = (float)(p->g.ah / (float)N), th_l = (float)(p->g.al / (float)N);
    const int64_t LH = (int64_t)p->g.L * p->g.H;
    static double hi_out[4096], lo[4096], outside[8192];
    for (int64_t lh = 0; lh < LH; lh++) {
        const int64_t r = (int64_t)s * LH + lh;
        int32_t nh = 0, nl = 0, no = 0;
        double sc = NAN;
        for (int sec = 0; sec < 2; sec++) {
            const int32_t n = sec ? c->st.n_lo[r] : c->st.n_hi[r];
            for (int32_t k = 0; k < n && k < 4096; k++) {
                int32_t slot, pos;
                float sum;
                const uint8_t *pg = tok_page(c, c->pool, r, sec, k, p->lay[sec].tokens, &slot);
                memcpy(&pos, pg + mkv_pos_offset(&p->lay[sec], slot), 4);
                memcpy(&sum, pg + mkv_score_offset(&p->lay[sec], slot), 4);
                const double sig = (float)(sum / (float)mkv_observers(pos, plen, N, p->g.obs));
                if (sec) lo[nl++] = sig;
                else if (pos < N - W) hi_out[nh++] = sig;
                if (!sec && pos == N - 1 - W) sc = sig;
                if (pos < N - W) outside[no++] = sig;
            }
        }
        if (N > W && !isnan(sc) && (p->g.mix_high > 0.0f || p->g.mix_low > 0.0f)) {
            /* the fixed mix compares ranks: the weakest high outside the window (t_c among
             * them) with the next, and t_c with the weakest low */
            double m1, m2;
            two_smallest(hi_out, nh, &m1, &m2);
            if (near_distinct(m1, m2)) return 1;
            two_smallest(lo, nl, &m1, &m2);
            if (near_distinct(m1, sc)) return 1;
        } else if (N > W && !isnan(sc)) {
            if (near(sc, th_h) || near(sc, th_l)) return 1;
            double m1, m2;
            if (sc >= th_h) {
                two_smallest(hi_out, nh, &m1, &m2);
                if (near_distinct(m1, m2) || near(m1, th_h) || near(m1, th_l)) return 1;
            } else if (sc >= th_l) {
                two_smallest(lo, nl, &m1, &m2);
                if (near_distinct(m1, m2) || near_distinct(m1, sc) || near(m1, th_l)) return 1;
            }
        }
        const int32_t budget = mkv_kv_budget(c, c->kv, s);
        const int32_t total = c->st.n_hi[r] + c->st.n_lo[r];
        if (budget > 0 && total + 1 > budget && no > 1) {
            qsort(outside, (size_t)no, sizeof outside[0], cmp_double);
            const int32_t k = total - budget; /* the cut, give or take this step's change */
            for (int32_t i = k - 2; i <= k + 1; i++)
                if (i >= 0 && i + 1 < no && near_distinct(outside[i], outside[i + 1])) return 1;
        }
    }
    return 0;
}

/* After a commit whose two placements differ for slot s: explained when every position kept
 * on one side only, or in different sections, has a significance (from the side that kept it)
 * near a threshold, or, with a budget, near another kept token's (the budget's cut). */
static int commit_explained(pair_t *p, int32_t s)
{
    const int32_t n = p->cpu->prompt_len[s];
    const double th[2] = {(float)(p->g.ah / (float)n), (float)(p->g.al / (float)n)};
    const int64_t LH = (int64_t)p->g.L * p->g.H;
    int8_t *cls[2];
    double *sg[2];
    for (int b = 0; b < 2; b++) {
        cls[b] = malloc((size_t)n);
        sg[b] = malloc((size_t)n * sizeof(double));
    }
    int ok = 1;
    for (int64_t lh = 0; lh < LH && ok; lh++) {
        const int64_t r = (int64_t)s * LH + lh;
        for (int b = 0; b < 2; b++) {
            const mkv_cache_t *c = b ? p->gpu : p->cpu;
            const uint8_t *pool = b ? p->gpool : c->pool;
            memset(cls[b], 0, (size_t)n);
            for (int sec = 0; sec < 2; sec++) {
                const int32_t cnt = sec ? c->st.n_lo[r] : c->st.n_hi[r];
                for (int32_t k = 0; k < cnt; k++) {
                    int32_t slot, pos;
                    float sum;
                    const uint8_t *pg = tok_page(c, pool, r, sec, k, p->lay[sec].tokens, &slot);
                    memcpy(&pos, pg + mkv_pos_offset(&p->lay[sec], slot), 4);
                    memcpy(&sum, pg + mkv_score_offset(&p->lay[sec], slot), 4);
                    cr_assert(pos >= 0 && pos < n, "stored position %d outside the prompt", pos);
                    cls[b][pos] = (int8_t)(sec ? 1 : 2);
                    sg[b][pos] = sum / (double)mkv_observers(pos, n, n, p->g.obs);
                }
            }
        }
        for (int32_t i = 0; i < n && ok; i++) {
            if (cls[0][i] == cls[1][i]) continue;
            const double x = cls[0][i] ? sg[0][i] : sg[1][i];
            int explained = near(x, th[0]) || near(x, th[1]);
            const int mix = p->g.mix_high > 0.0f || p->g.mix_low > 0.0f; /* a rank cut, like a budget's */
            if (!explained && (mix || mkv_kv_budget(p->cpu, p->cpu->kv, s) > 0))
                for (int32_t j = 0; j < n && !explained; j++)
                    explained = j != i && cls[0][j] && near(x, sg[0][j]);
            ok = explained;
        }
    }
    for (int b = 0; b < 2; b++) free(cls[b]), free(sg[b]);
    return ok;
}

/* ---------------------------------------------------------------------------------------- */
/* The run                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Admits up to `want` prompts, prefills every layer of all of them with one call per layer,
 * and commits them together. */
static void admit_batch(pair_t *p, int32_t want)
{
    const kgeom_t *g = &p->g;
    int32_t slots[8], n = 0, lens[8];
    for (int32_t i = 0; i < want && n < 8; i++) {
        const int32_t len = test_rand_range(&p->rng, 1, g->max_len / 2);
        int ok_a = 0, ok_b = 0;
        cr_assert_eq(mkv_cache_can_admit(p->cpu, len, &ok_a), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_can_admit(p->gpu, len, &ok_b), MKV_STATUS_OK);
        cr_assert_eq(ok_a, ok_b, "can_admit(%d) differs", len);
        if (!ok_a) break;
        int32_t sa, sb;
        cr_assert_eq(mkv_cache_admit(p->cpu, len, &sa), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_admit(p->gpu, len, &sb), MKV_STATUS_OK);
        cr_assert_eq(sa, sb);
        if (test_rand_range(&p->rng, 0, 3) == 0 && !p->no_scores) { /* (a budget needs scores) */
            const int32_t budget = test_rand_range(&p->rng, g->W + 1, g->max_len / 2);
            cr_assert_eq(mkv_cache_set_budget(p->cpu, sa, budget), MKV_STATUS_OK);
            cr_assert_eq(mkv_cache_set_budget(p->gpu, sa, budget), MKV_STATUS_OK);
        }
        slots[n] = sa;
        lens[n++] = len;
        p->target[sa] = len + test_rand_range(&p->rng, 1, g->max_len - len);
    }
    if (n == 0) return;
    int64_t rows = 0;
    for (int32_t j = 0; j < n; j++) rows += lens[j];
    const int64_t nq = rows * g->H * g->G * g->d, nkv = rows * g->H * g->d;
    for (int32_t l = 0; l < g->L; l++) {
        rand_tensor(p, p->hq, nq, 2.0f);
        rand_tensor(p, p->hk, nkv, 2.0f);
        rand_tensor(p, p->hv, nkv, 1.0f);
        upload(p, nq, nkv);
        cr_assert_eq(mkv_cache_prefill_layer_ex(p->cpu, n, slots, l, p->dt, p->hq, p->hk, p->hv, p->ho_cpu, NULL),
                     MKV_STATUS_OK, "%s", mkv_cache_last_error(p->cpu));
        cr_assert_eq(mkv_cache_prefill_layer_ex(p->gpu, n, slots, l, p->dt, p->dq, p->dk, p->dv, p->dout, NULL),
                     MKV_STATUS_OK, "%s", mkv_cache_last_error(p->gpu));
        const double e = compare_out(p, nq, 1e-2, "prefill");
        if (e > p->max_prefill_err) p->max_prefill_err = e;
    }
    cr_assert_eq(mkv_cache_commit_prompt(p->cpu, n, slots, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p->cpu));
    cr_assert_eq(mkv_cache_commit_prompt(p->gpu, n, slots, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p->gpu));
    p->commits++;
    /* Near-ties are judged afterwards here (pruned tokens leave no trace before): a slot whose
     * placements differ is explained token by token (commit_explained). */
    cr_assert_eq(mkv_cache_validate(p->gpu), MKV_STATUS_OK, "commit: GPU: %s", mkv_cache_last_error(p->gpu));
    download(p);
    uint8_t mark[64] = {0};
    for (int32_t j = 0; j < n; j++) {
        char why[256];
        p->committed[slots[j]] = 1;
        if (!slot_matches(p, slots[j], why, sizeof why)) {
            cr_assert(commit_explained(p, slots[j]), "commit: the backends disagree without a near-tie: %s", why);
            mark[slots[j]] = 1;
            p->near_ties++;
        }
    }
    compare_all(p, mark, "commit");
}

static void step(pair_t *p)
{
    const kgeom_t *g = &p->g;
    int32_t slots[64], n = 0;
    for (int32_t s = 0; s < g->S; s++)
        if (p->committed[s]) slots[n++] = s;
    if (n == 0) return;
    /* preempt the newest-admitted (highest slot here) while the step could run out of pages */
    for (;;) {
        int64_t demand;
        mkv_cache_stats_t st;
        cr_assert_eq(mkv_cache_step_demand(p->cpu, n, slots, &demand), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_stats(p->cpu, &st), MKV_STATUS_OK);
        if (demand <= st.available_pages || n == 0) break;
        release_both(p, slots[--n]);
    }
    if (n == 0) return;
    cr_assert_eq(mkv_cache_append(p->cpu, n, slots, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p->cpu));
    cr_assert_eq(mkv_cache_append(p->gpu, n, slots, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p->gpu));
    const int64_t nq = (int64_t)n * g->H * g->G * g->d, nkv = (int64_t)n * g->H * g->d;
    for (int32_t l = 0; l < g->L; l++) {
        rand_tensor(p, p->hq, nq, 2.0f);
        rand_tensor(p, p->hk, nkv, 2.0f);
        rand_tensor(p, p->hv, nkv, 1.0f);
        upload(p, nq, nkv);
        cr_assert_eq(mkv_cache_decode_layer_ex(p->cpu, n, slots, l, p->dt, p->hq, p->hk, p->hv, p->ho_cpu, NULL),
                     MKV_STATUS_OK, "%s", mkv_cache_last_error(p->cpu));
        cr_assert_eq(mkv_cache_decode_layer_ex(p->gpu, n, slots, l, p->dt, p->dq, p->dk, p->dv, p->dout, NULL),
                     MKV_STATUS_OK, "%s", mkv_cache_last_error(p->gpu));
        const double tol = p->dt == MKV_DTYPE_F32 ? 2e-3 : p->dt == MKV_DTYPE_F16 ? 3e-3 : 1.6e-2;
        const double e = compare_out(p, nq, tol, "decode");
        if (e > p->max_decode_err) p->max_decode_err = e;
    }
    uint8_t tie[64] = {0};
    for (int32_t j = 0; j < n; j++) {
        tie[slots[j]] = (uint8_t)slot_near_tie(p, slots[j]);
        p->near_ties += tie[slots[j]];
    }
    cr_assert_eq(mkv_cache_compress(p->cpu, n, slots, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p->cpu));
    cr_assert_eq(mkv_cache_compress(p->gpu, n, slots, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p->gpu));
    p->compresses++;
    p->steps++;
    compare_all(p, tie, "compress");
    for (int32_t j = 0; j < n; j++) {
        const int32_t s = slots[j];
        if (p->committed[s] && p->cpu->st.seq_len[s] >= p->target[s]) release_both(p, s);
    }
}

static void run_flags(const kgeom_t *g, mkv_dtype_t dt, uint64_t seed, int32_t steps, uint32_t flags)
{
    pair_t p;
    pair_init_flags(&p, g, dt, seed, flags);
    g_near = dt == MKV_DTYPE_F32 ? 2e-3 : 2e-5;
    for (int32_t t = 0; t < steps; t++) {
        int32_t active = 0;
        for (int32_t s = 0; s < g->S; s++) active += p.committed[s];
        if (active < g->S && test_rand_range(&p.rng, 0, active == 0 ? 0 : 6) == 0)
            admit_batch(&p, test_rand_range(&p.rng, 1, 3));
        step(&p);
    }
    cr_log_info("kv_cuda%s %s L%d H%d G%d d%d: %lld steps, %lld commits, %lld tokens compared; "
                "max |err| prefill %.3g decode %.3g, max score rel %.3g; near-ties %lld, divergences %lld",
                flags & MKV_CACHE_NO_SCORES ? " no-scores" : flags ? " async" : "", mkv_dtype_name(dt), g->L, g->H, g->G, g->d, (long long)p.steps, (long long)p.commits,
                (long long)p.tokens_compared, p.max_prefill_err, p.max_decode_err, p.max_score_rel,
                (long long)p.near_ties, (long long)p.divergences);
    printf("kv_cuda%s %s L%d H%d G%d d%d: %lld steps, %lld commits, %lld tokens compared; max |err| "
           "prefill %.3g decode %.3g, max score rel %.3g; near-ties %lld, divergences %lld\n",
           flags & MKV_CACHE_NO_SCORES ? " no-scores" : flags ? " async" : "", mkv_dtype_name(dt), g->L, g->H, g->G, g->d, (long long)p.steps,
           (long long)p.commits, (long long)p.tokens_compared, p.max_prefill_err, p.max_decode_err,
           p.max_score_rel, (long long)p.near_ties, (long long)p.divergences);
    cr_assert_gt(p.steps, steps / 2, "the run did too few decode steps to mean anything");
    cr_assert_gt(p.compresses, 0);
    pair_free(&p);
}

static void run(const kgeom_t *g, mkv_dtype_t dt, uint64_t seed, int32_t steps)
{
    run_flags(g, dt, seed, steps, 0);
}

/* Pages of 5 high tokens (sections cross page boundaries all the time), a pool small enough
 * that admissions wait and steps preempt, thresholds that demote and prune. */
static const kgeom_t G_SMALL = {2, 2, 3, 64, 6, 160, 5, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 1.0f, 0.3f, 8, 0, 700, 0.0f, 0.0f};
static const kgeom_t G_TINY = {3, 1, 1, 16, 5, 120, 3, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 1.0f, 0.2f, 4, 16, 500, 0.0f, 0.0f};
static const kgeom_t G_LLAMA = {1, 2, 4, 128, 4, 300, 32, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 1.0f, 0.02f, 16, 0, 200, 0.0f, 0.0f};

Test(kv_cuda, differential_f16, .timeout = 900)
{
    GPU_REQUIRE();
    run(&G_SMALL, MKV_DTYPE_F16, 1, 1500);
    run(&G_TINY, MKV_DTYPE_F16, 2, 1500);
}

/* The fixed mix (decision 47): the sections by rank, prompt and steps, on both backends. */
Test(kv_cuda, differential_fixed_mix, .timeout = 900)
{
    GPU_REQUIRE();
    kgeom_t g = G_SMALL;
    g.mix_high = 0.2f, g.mix_low = 0.5f;
    run(&g, MKV_DTYPE_F16, 5, 1000);
    kgeom_t t = G_TINY;
    t.mix_high = 0.35f, t.mix_low = 0.25f;
    run(&t, MKV_DTYPE_F16, 6, 800);
}

/* A cache that never compresses, with MKV_CACHE_NO_SCORES on the GPU side (the full-precision
 * baseline's cache): the same outputs, placements and codes as the CPU backend's, call for call
 * (scores are not kept, so not compared). */
Test(kv_cuda, differential_no_scores, .timeout = 900)
{
    GPU_REQUIRE();
    kgeom_t k16 = G_LLAMA;
    k16.hi = k16.lo = MKV_FORMAT_K16V16, k16.ah = k16.al = 0.0f;
    run_flags(&k16, MKV_DTYPE_F16, 7, 400, MKV_CACHE_NO_SCORES);
    kgeom_t q = G_SMALL;
    q.ah = q.al = 0.0f;
    run_flags(&q, MKV_DTYPE_BF16, 8, 600, MKV_CACHE_NO_SCORES | MKV_CACHE_ASYNC_STEPS);
}

Test(kv_cuda, differential_llama_heads_bf16_f32, .timeout = 900)
{
    GPU_REQUIRE();
    run(&G_LLAMA, MKV_DTYPE_BF16, 3, 600);
    run(&G_SMALL, MKV_DTYPE_F32, 4, 600);
}

/* The same bad calls get the same statuses and messages on both backends, with nothing
 * changed (the checks live in one place, engine/kv_api.c). */
Test(kv_cuda, bad_arguments_as_cpu)
{
    GPU_REQUIRE();
    pair_t p;
    pair_init(&p, &G_SMALL, MKV_DTYPE_F16, 9);
    mkv_cache_t *cs[2] = {p.cpu, p.gpu};
    char msg[2][8][MKV_ERR_LEN];
    mkv_status_t got[2][8];
    for (int b = 0; b < 2; b++) {
        mkv_cache_t *c = cs[b];
        void *q = b ? p.dq : p.hq, *k = b ? p.dk : p.hk, *v = b ? p.dv : p.hv, *o = b ? p.dout : p.ho_cpu;
        int32_t s;
        cr_assert_eq(mkv_cache_admit(c, 7, &s), MKV_STATUS_OK);
        int i = 0;
#define CALL(x)                                                                                \
    do {                                                                                       \
        got[b][i] = (x);                                                                       \
        snprintf(msg[b][i], MKV_ERR_LEN, "%s", mkv_cache_last_error(c));                      \
        i++;                                                                                   \
    } while (0)
        CALL(mkv_cache_prefill_layer_ex(c, 1, &s, 5, MKV_DTYPE_F16, q, k, v, o, NULL));
        CALL(mkv_cache_prefill_layer_ex(c, 1, &s, 0, MKV_DTYPE_COUNT, q, k, v, o, NULL));
        CALL(mkv_cache_prefill_layer_ex(c, 1, &s, 0, MKV_DTYPE_F16, q, NULL, v, o, NULL));
        CALL(mkv_cache_commit_prompt(c, 1, &s, NULL));
        CALL(mkv_cache_decode_layer_ex(c, 1, &s, 0, MKV_DTYPE_F16, q, k, v, o, NULL));
        CALL(mkv_cache_compress(c, 1, &s, NULL));
        const int32_t bad = 5;
        CALL(mkv_cache_prefill_layer_ex(c, 1, &bad, 0, MKV_DTYPE_F16, q, k, v, o, NULL));
        CALL(mkv_cache_set_budget(c, s, -1));
#undef CALL
    }
    for (int i = 0; i < 8; i++) {
        cr_assert_neq(got[0][i], MKV_STATUS_OK, "call %d succeeded", i);
        cr_assert_eq(got[0][i], got[1][i], "call %d: CPU %s, GPU %s", i, mkv_status_string(got[0][i]),
                     mkv_status_string(got[1][i]));
        cr_assert_str_eq(msg[0][i], msg[1][i], "call %d: messages differ", i);
    }
    pair_free(&p);
}

/* The same differential run with MKV_CACHE_ASYNC_STEPS on the GPU side: steps never wait; the
 * comparisons after each call (validate, dumps, stats) collect. */
Test(kv_cuda, differential_async_steps, .timeout = 900)
{
    GPU_REQUIRE();
    run_flags(&G_SMALL, MKV_DTYPE_F16, 11, 1000, MKV_CACHE_ASYNC_STEPS);
}

/* Fills the pool until a step cannot fit: the CPU refuses the append at once; the asynchronous
 * GPU cache accepts append, decode and compress, and mkv_cache_sync then reports OUT_OF_PAGES
 * with nothing changed (dump identical to before the step, N as before); after a preemption the
 * retried step succeeds on both, and the two caches agree again. */
Test(kv_cuda, deferred_refusal_changes_nothing, .timeout = 300)
{
    GPU_REQUIRE();
    const kgeom_t g = {1, 2, 2, 64, 6, 200, 4, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 0.0f, 0.0f, 8, 0, 60, 0.0f, 0.0f};
    pair_t p;
    pair_init_flags(&p, &g, MKV_DTYPE_F16, 21, MKV_CACHE_ASYNC_STEPS);
    while (1) { /* admit 40-token prompts while they fit */
        int ok;
        cr_assert_eq(mkv_cache_can_admit(p.cpu, 40, &ok), MKV_STATUS_OK);
        if (!ok) break;
        int32_t n0;
        for (n0 = 0; n0 < g.S && p.committed[n0]; n0++) {}
        if (n0 == g.S) break;
        int32_t slot;
        cr_assert_eq(mkv_cache_admit(p.cpu, 40, &slot), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_admit(p.gpu, 40, &slot), MKV_STATUS_OK, "%s", mkv_cache_last_error(p.gpu));
        const int64_t nq = 40 * g.H * g.G * g.d, nkv = 40 * g.H * g.d;
        rand_tensor(&p, p.hq, nq, 2.0f), rand_tensor(&p, p.hk, nkv, 2.0f), rand_tensor(&p, p.hv, nkv, 1.0f);
        upload(&p, nq, nkv);
        cr_assert_eq(mkv_cache_prefill_layer_ex(p.cpu, 1, &slot, 0, p.dt, p.hq, p.hk, p.hv, p.ho_cpu, NULL), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_prefill_layer_ex(p.gpu, 1, &slot, 0, p.dt, p.dq, p.dk, p.dv, p.dout, NULL), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_commit_prompt(p.cpu, 1, &slot, NULL), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_commit_prompt(p.gpu, 1, &slot, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p.gpu));
        p.committed[slot] = 1;
        p.target[slot] = g.max_len;
    }
    int32_t slots[8], n = 0;
    for (int32_t s = 0; s < g.S; s++)
        if (p.committed[s]) slots[n++] = s;
    cr_assert_geq(n, 2, "the pool should hold at least two prompts");
    int refused = 0;
    for (int step = 0; step < 200 && !refused; step++) {
        const mkv_status_t a = mkv_cache_append(p.cpu, n, slots, NULL);
        if (a == MKV_STATUS_OUT_OF_PAGES) {
            char *before, *after;
            cr_assert_eq(mkv_cache_dump_json_string(p.gpu, &before), MKV_STATUS_OK);
            int32_t n_before[8];
            for (int32_t j = 0; j < n; j++) n_before[j] = p.gpu->st.seq_len[slots[j]];
            /* the asynchronous step is accepted... */
            cr_assert_eq(mkv_cache_append(p.gpu, n, slots, NULL), MKV_STATUS_OK);
            const int64_t nq = (int64_t)n * g.H * g.G * g.d, nkv = (int64_t)n * g.H * g.d;
            upload(&p, nq, nkv);
            cr_assert_eq(mkv_cache_decode_layer_ex(p.gpu, n, slots, 0, p.dt, p.dq, p.dk, p.dv, p.dout, NULL),
                         MKV_STATUS_OK, "%s", mkv_cache_last_error(p.gpu));
            cr_assert_eq(mkv_cache_compress(p.gpu, n, slots, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p.gpu));
            /* ...and refused when collected, with nothing changed */
            const mkv_status_t got = mkv_cache_sync(p.gpu, NULL);
            cr_assert_eq(got, MKV_STATUS_OUT_OF_PAGES, "sync: %s (%s)", mkv_status_string(got),
                         mkv_cache_last_error(p.gpu));
            cr_assert(strstr(mkv_cache_last_error(p.gpu), "mkv_cache_append") != NULL, "%s",
                      mkv_cache_last_error(p.gpu));
            cr_assert_eq(mkv_cache_sync(p.gpu, NULL), MKV_STATUS_OK, "reported once");
            for (int32_t j = 0; j < n; j++) cr_assert_eq(p.gpu->st.seq_len[slots[j]], n_before[j]);
            cr_assert_eq(mkv_cache_dump_json_string(p.gpu, &after), MKV_STATUS_OK);
            cr_assert_str_eq(before, after, "a refused asynchronous step changed the cache");
            mkv_free(before), mkv_free(after);
            refused = 1;
            /* preempt the last slot, then the retried step succeeds on both */
            release_both(&p, slots[--n]);
            cr_assert_eq(mkv_cache_append(p.cpu, n, slots, NULL), MKV_STATUS_OK);
            cr_assert_eq(mkv_cache_append(p.gpu, n, slots, NULL), MKV_STATUS_OK);
        } else {
            cr_assert_eq(a, MKV_STATUS_OK);
            cr_assert_eq(mkv_cache_append(p.gpu, n, slots, NULL), MKV_STATUS_OK);
        }
        const int64_t nq = (int64_t)n * g.H * g.G * g.d, nkv = (int64_t)n * g.H * g.d;
        rand_tensor(&p, p.hq, nq, 2.0f), rand_tensor(&p, p.hk, nkv, 2.0f), rand_tensor(&p, p.hv, nkv, 1.0f);
        upload(&p, nq, nkv);
        cr_assert_eq(mkv_cache_decode_layer_ex(p.cpu, n, slots, 0, p.dt, p.hq, p.hk, p.hv, p.ho_cpu, NULL), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_decode_layer_ex(p.gpu, n, slots, 0, p.dt, p.dq, p.dk, p.dv, p.dout, NULL), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_compress(p.cpu, n, slots, NULL), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_compress(p.gpu, n, slots, NULL), MKV_STATUS_OK);
        compare_out(&p, nq, 3e-3, "decode");
        compare_all(&p, NULL, "step");
    }
    cr_assert(refused, "the pool never ran out: the test did not reach a refusal");
    pair_free(&p);
}

/* A whole decode step (append, every layer's decode, compress) captured once in a CUDA graph
 * and replayed `replays` times: each replay equals a step of the CPU backend on the same
 * inputs, and after mkv_cache_sync the host's view and the state match the CPU cache. With
 * horizon > 0 the capture plans for that many launches (mkv_cache_set_capture_horizon). */
static void graph_replays(const kgeom_t *gp, int32_t horizon, int replays)
{
    const kgeom_t g = *gp;
    pair_t p;
    pair_init_flags(&p, &g, MKV_DTYPE_F16, 31, MKV_CACHE_ASYNC_STEPS);
    cr_assert_eq(mkv_cache_set_capture_horizon(p.gpu, horizon), MKV_STATUS_OK);
    admit_batch(&p, 3);
    int32_t slots[8], n = 0;
    for (int32_t s = 0; s < g.S; s++)
        if (p.committed[s]) slots[n++] = s;
    cr_assert_geq(n, 1);
    for (int32_t j = 0; j < n; j++) p.target[slots[j]] = g.max_len; /* no release in this test */
    step(&p); /* a plain step first: sizes the decode workspace */
    n = 0;
    for (int32_t s = 0; s < g.S; s++)
        if (p.committed[s]) slots[n++] = s;
    const int64_t nq = (int64_t)n * g.H * g.G * g.d, nkv = (int64_t)n * g.H * g.d;
    void *dq[4], *dk[4], *dv[4], *dout[4];
    for (int32_t l = 0; l < g.L; l++) {
        CUDA_CHECK(cudaMalloc(&dq[l], (size_t)nq * 2));
        CUDA_CHECK(cudaMalloc(&dk[l], (size_t)nkv * 2));
        CUDA_CHECK(cudaMalloc(&dv[l], (size_t)nkv * 2));
        CUDA_CHECK(cudaMalloc(&dout[l], (size_t)nq * 2));
    }
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    mkv_status_t st = mkv_cache_append(p.gpu, n, slots, stream);
    for (int32_t l = 0; l < g.L && st == MKV_STATUS_OK; l++)
        st = mkv_cache_decode_layer_ex(p.gpu, n, slots, l, MKV_DTYPE_F16, dq[l], dk[l], dv[l], dout[l], stream);
    if (st == MKV_STATUS_OK) st = mkv_cache_compress(p.gpu, n, slots, stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cr_assert_eq(st, MKV_STATUS_OK, "capture: %s", mkv_cache_last_error(p.gpu));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    /* capturing ran nothing: the host's view goes back to the device's */
    cr_assert_eq(mkv_cache_sync(p.gpu, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p.gpu));
    for (int32_t j = 0; j < n; j++)
        cr_assert_eq(p.gpu->st.seq_len[slots[j]], p.cpu->st.seq_len[slots[j]]);
    uint16_t *outs = malloc((size_t)nq * 2);
    for (int r = 0; r < replays; r++) {
        cr_assert_eq(mkv_cache_append(p.cpu, n, slots, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p.cpu));
        for (int32_t l = 0; l < g.L; l++) {
            rand_tensor(&p, p.hq, nq, 2.0f), rand_tensor(&p, p.hk, nkv, 2.0f), rand_tensor(&p, p.hv, nkv, 1.0f);
            CUDA_CHECK(cudaMemcpy(dq[l], p.hq, (size_t)nq * 2, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(dk[l], p.hk, (size_t)nkv * 2, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(dv[l], p.hv, (size_t)nkv * 2, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemset(dout[l], 0xff, (size_t)nq * 2));
            cr_assert_eq(mkv_cache_decode_layer_ex(p.cpu, n, slots, l, p.dt, p.hq, p.hk, p.hv,
                                                   (char *)p.ho_cpu + (size_t)l * nq * 2, NULL),
                         MKV_STATUS_OK);
        }
        cr_assert_eq(mkv_cache_compress(p.cpu, n, slots, NULL), MKV_STATUS_OK, "%s", mkv_cache_last_error(p.cpu));
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int32_t l = 0; l < g.L; l++) {
            CUDA_CHECK(cudaMemcpy(outs, dout[l], (size_t)nq * 2, cudaMemcpyDeviceToHost));
            const uint16_t *want = (const uint16_t *)((char *)p.ho_cpu + (size_t)l * nq * 2);
            for (int64_t i = 0; i < nq; i++) {
                const double e = fabs((double)mkv_f16_to_f32(outs[i]) - mkv_f16_to_f32(want[i]));
                cr_assert(e <= 3e-3, "replay %d layer %d out[%lld]: CPU %g GPU %g", r, l, (long long)i,
                          mkv_f16_to_f32(want[i]), mkv_f16_to_f32(outs[i]));
            }
        }
        if (r % 8 == 7 || r == replays - 1) { /* the host catches up with the replays */
            cr_assert_eq(mkv_cache_sync(p.gpu, stream), MKV_STATUS_OK, "%s", mkv_cache_last_error(p.gpu));
            compare_all(&p, NULL, "graph replay");
        }
    }
    for (int32_t j = 0; j < n; j++)
        cr_assert_eq(p.gpu->st.seq_len[slots[j]], p.cpu->st.seq_len[slots[j]]);
    printf("kv_cuda graph: %d replays of a %d-layer step over %d slots (horizon %d) matched the CPU backend\n",
           replays, g.L, n, horizon);
    free(outs);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    for (int32_t l = 0; l < g.L; l++) cudaFree(dq[l]), cudaFree(dk[l]), cudaFree(dv[l]), cudaFree(dout[l]);
    pair_free(&p);
}

Test(kv_cuda, graph_capture_replay, .timeout = 300)
{
    GPU_REQUIRE();
    const kgeom_t g = {2, 2, 3, 64, 4, 256, 8, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 1.0f, 0.3f, 8, 0, 400, 0.0f, 0.0f};
    graph_replays(&g, 0, 40);
}

/* Captured for 7 launches (attention planned for the capture's longest N plus 6), launched 7
 * times; with thresholds 0 nothing is pruned, so the regions hold N tokens and the plan's
 * bound is exact: the seventh launch reads a region of exactly the planned length. */
Test(kv_cuda, graph_capture_horizon, .timeout = 300)
{
    GPU_REQUIRE();
    const kgeom_t g = {2, 2, 3, 64, 4, 256, 8, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 0.0f, 0.0f, 8, 0, 400, 0.0f, 0.0f};
    graph_replays(&g, 7, 7);
}
