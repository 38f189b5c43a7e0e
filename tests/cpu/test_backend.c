/*
 * test_backend.c — the KV backend (engine/kv_backend.c) end to end on the CPU: exact attention
 * without compression; token integrity under the DiffKV policy; compress against the pure
 * policy (engine/policy.h); prompt classes against a float64 significance computed here;
 * budgets; a long randomised run with admissions, preemptions and dumps; refused calls that
 * must change nothing. Small geometries with pages of 1 to 3 high tokens, so that page
 * boundaries are crossed all the time. Tokens are found through the cache's internals
 * (memmgr/cache.h: page table rows, pool), which the tests only read.
 */
#include "attention/attention.h"
#include "engine/policy.h"
#include "memmgr/cache.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { MAXS = 8, MAXLH = 9, MAXLEN = 96, MAXD = 64, NACT = MKV_ACT_PRUNE_CAND + 1 };
enum { M_NONE = 0, M_HI = 1, M_LO = 2 }; /* where a position is stored */
#define F16 MKV_FORMAT_K16V16
#define K8V4 MKV_FORMAT_K8V4
#define K4V2 MKV_FORMAT_K4V2

typedef struct geom {
    int32_t L, H, G, d, S, max_len, tpp; /* tpp: high tokens per page */
    int32_t ge; /* elements per group of the high keys; the other sides take ge / 2, ge / 2 and
                   ge / 4 (at least 16): mixed groups per side, end to end */
    mkv_format_t hi, lo;
    float ah, al;
    int32_t W, obs;
    int64_t pool_pages; /* 0: room for every slot at max_len, all high */
} geom_t;

typedef struct bk {
    geom_t g;
    mkv_cache_t *c;
    mkv_page_layout_t lay[2]; /* high, low */
    int32_t T, plen[MAXS];
    int64_t page_bytes;
    tu_rng_t rng;
    float *hk, *hv; /* [S][max_len][L][H][d] the original K/V of every position */
    uint8_t *page;  /* scratch page */
} bk_t;

/* One head-region as stored: positions and score sums per section, in section order. */
typedef struct reg {
    int32_t n[2], pos[2][MAXLEN];
    float sum[2][MAXLEN];
} reg_t;

static void fill(tu_rng_t *r, float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * (float)((double)(tu_rand(r) >> 11) * 0x1p-52 - 1.0);
}

/* Elements per group of side k (hi key, hi value, lo key, lo value). */
static int32_t side_group(const geom_t *g, int k)
{
    static const int32_t div[4] = {1, 2, 2, 4};
    const int32_t e = g->ge / div[k];
    return e < 16 ? 16 : e;
}

static mkv_cache_config_t make_config(const geom_t *g)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = g->L, cfg.n_kv_heads = g->H, cfg.group_size = g->G, cfg.head_dim = g->d;
    cfg.max_seqs = g->S, cfg.max_seq_len = g->max_len;
    cfg.hi_key_group = side_group(g, 0), cfg.hi_value_group = side_group(g, 1);
    cfg.lo_key_group = side_group(g, 2), cfg.lo_value_group = side_group(g, 3);
    TU_OK(mkv_page_bytes_for(g->hi, g->d, cfg.hi_key_group, cfg.hi_value_group, g->tpp,
                             &cfg.page_bytes));
    cfg.pool_pages = g->pool_pages ? g->pool_pages
                                   : (int64_t)g->S * g->L * g->H * (g->max_len / g->tpp + 2);
    cfg.hi_format = g->hi, cfg.lo_format = g->lo;
    cfg.alpha_h = g->ah, cfg.alpha_l = g->al, cfg.window = g->W, cfg.obs_window = g->obs;
    return cfg;
}

static void bk_init(bk_t *b, const geom_t *g, uint64_t seed)
{
    memset(b, 0, sizeof *b);
    cr_assert(g->S <= MAXS && g->L * g->H <= MAXLH && g->max_len <= MAXLEN && g->d <= MAXD);
    b->g = *g;
    const mkv_cache_config_t cfg = make_config(g);
    b->c = tu_create(&cfg);
    b->T = tu_info(b->c).row_entries;
    b->page_bytes = cfg.page_bytes;
    TU_OK(mkv_page_layout(g->hi, g->d, side_group(g, 0), side_group(g, 1), b->page_bytes,
                          &b->lay[0], NULL));
    TU_OK(mkv_page_layout(g->lo, g->d, side_group(g, 2), side_group(g, 3), b->page_bytes,
                          &b->lay[1], NULL));
    cr_assert_eq(b->lay[0].tokens, g->tpp);
    b->rng.s = seed;
    const size_t n = (size_t)g->S * g->max_len * g->L * g->H * g->d;
    b->hk = tu_xcalloc(n, sizeof(float));
    b->hv = tu_xcalloc(n, sizeof(float));
    b->page = tu_xcalloc((size_t)b->page_bytes, 1);
}

static void bk_free(bk_t *b)
{
    mkv_cache_destroy(b->c);
    free(b->hk), free(b->hv), free(b->page);
}

static int64_t hidx(const bk_t *b, int32_t s, int32_t p, int32_t l, int32_t h)
{
    return ((((int64_t)s * b->g.max_len + p) * b->g.L + l) * b->g.H + h) * b->g.d;
}

/* Keeps the K/V of position p of slot s, layer l, taken from k, v: [.][H][d] at row j. */
/* Keeps position p's K/V as the cache takes them in: its full precision is fp16 (sanitised,
 * then rounded), for prompt and generated tokens alike. */
static void keep_kv(bk_t *b, int32_t s, int32_t p, int32_t l, const float *k, const float *v,
                    int32_t j)
{
    const int64_t n = (int64_t)b->g.H * b->g.d;
    float *hk = b->hk + hidx(b, s, p, l, 0), *hv = b->hv + hidx(b, s, p, l, 0);
    for (int64_t e = 0; e < n; e++) {
        float x = k[j * n + e], y = v[j * n + e];
        mkv_quant_sanitize(&x);
        mkv_quant_sanitize(&y);
        hk[e] = mkv_f16_to_f32(mkv_f32_to_f16(x));
        hv[e] = mkv_f16_to_f32(mkv_f32_to_f16(y));
    }
}

/* Token k of section sec (0 high, 1 low) of region r: high tokens in page row[k / tpp_hi],
 * low tokens in page row[T - 1 - k / tpp_lo]. */
static const uint8_t *token_page(const bk_t *b, int64_t r, int sec, int32_t k, int32_t *slot)
{
    const int32_t *row = mkv_mm_row(&b->c->st, r), tpp = b->lay[sec].tokens;
    const int32_t page = sec ? row[b->T - 1 - k / tpp] : row[k / tpp];
    cr_assert(page >= 0 && page < b->c->st.g.pool_pages, "region %lld sec %d token %d: page %d",
              (long long)r, sec, k, page);
    *slot = k % tpp;
    return b->c->pool + (int64_t)page * b->page_bytes;
}

static void read_region(const bk_t *b, int64_t r, reg_t *out)
{
    out->n[0] = b->c->st.n_hi[r], out->n[1] = b->c->st.n_lo[r];
    for (int sec = 0; sec < 2; sec++)
        for (int32_t k = 0; k < out->n[sec]; k++) {
            int32_t slot;
            const uint8_t *pg = token_page(b, r, sec, k, &slot);
            out->pos[sec][k] = mkv_page_pos(pg, &b->lay[sec], slot);
            out->sum[sec][k] = mkv_page_score(pg, &b->lay[sec], slot);
        }
}

/* Marks of positions [0, N); fails on a position out of range or stored twice. */
static void marks_of(const reg_t *rg, int32_t N, uint8_t *mark)
{
    memset(mark, M_NONE, (size_t)N);
    for (int sec = 0; sec < 2; sec++)
        for (int32_t k = 0; k < rg->n[sec]; k++) {
            const int32_t p = rg->pos[sec][k];
            cr_assert(p >= 0 && p < N, "position %d outside [0, %d)", p, N);
            cr_assert_eq(mark[p], M_NONE, "position %d stored twice", p);
            mark[p] = (uint8_t)(sec ? M_LO : M_HI);
        }
}

/* float64 softmax attention of one query over n keys, scale 1 / sqrt(d); p[n]: probabilities */
static void ref_attn(int32_t n, int32_t d, const float *q, const double *K, const double *V,
                     double *out, double *p)
{
    double m = -INFINITY, s = 0.0;
    for (int32_t t = 0; t < n; t++) {
        double dot = 0.0;
        for (int32_t e = 0; e < d; e++) dot += (double)q[e] * K[t * d + e];
        p[t] = dot / sqrt((double)d);
        m = p[t] > m ? p[t] : m;
    }
    for (int32_t t = 0; t < n; t++) s += (p[t] = exp(p[t] - m));
    for (int32_t e = 0; e < d; e++) out[e] = 0.0;
    for (int32_t t = 0; t < n; t++) {
        p[t] /= s;
        for (int32_t e = 0; e < d; e++) out[e] += p[t] * V[t * d + e];
    }
}

static void expect_close(const float *got, const double *want, int32_t d, const char *what,
                         int32_t a, int32_t c)
{
    for (int32_t e = 0; e < d; e++)
        cr_assert(fabs((double)got[e] - want[e]) <= 1e-5 + 1e-4 * fabs(want[e]),
                  "%s (%d, %d) element %d: %.9g, float64 reference %.9g", what, a, c, e,
                  (double)got[e], want[e]);
}

/* K, V: [N][d] the kept K/V of positions 0 .. N - 1 of (s, l, h), fp16-rounded or not. */
static void gather_kv(const bk_t *b, int32_t s, int32_t l, int32_t h, int32_t N, int f16,
                      double *K, double *V)
{
    const int32_t d = b->g.d;
    for (int32_t i = 0; i < N * d; i++) {
        const int64_t at = hidx(b, s, i / d, l, h) + i % d;
        const float k = b->hk[at], v = b->hv[at];
        K[i] = f16 ? mkv_f16_to_f32(mkv_f32_to_f16(k)) : k;
        V[i] = f16 ? mkv_f16_to_f32(mkv_f32_to_f16(v)) : v;
    }
}

static int32_t bk_admit(bk_t *b, int32_t n, int32_t budget)
{
    int32_t s = -1;
    TU_COK(b->c, mkv_cache_admit(b->c, n, &s));
    if (budget > 0) TU_COK(b->c, mkv_cache_set_budget(b->c, s, budget));
    b->plen[s] = n;
    return s;
}

/* Prefills every layer of slot s with random q (spread 4: peaked and flat rows) and k, v.
 * check: every output against float64 causal attention over the K/V at the cache's full
 * precision, fp16 (prefill attends over the values a K16V16 page holds). sig (may be NULL): [L][H][n] the significance in float64: max over the group of
 * the probability, mean over the observing queries. */
static void bk_prefill(bk_t *b, int32_t s, int check, double *sig)
{
    const int32_t n = b->plen[s], H = b->g.H, G = b->g.G, d = b->g.d;
    const int64_t nq = (int64_t)n * H * G * d, nk = (int64_t)n * H * d;
    float *q = tu_xcalloc((size_t)(2 * nq + 2 * nk), sizeof(float)), *out = q + nq;
    float *k = out + nq, *v = k + nk;
    double *K = tu_xcalloc((size_t)(2 * n * d + 2 * n), sizeof(double)), *V = K + n * d;
    double *p = V + n * d, *pm = p + n, o[MAXD];
    const int32_t first = b->g.obs > 0 ? n - b->g.obs : 0;
    for (int32_t l = 0; l < b->g.L; l++) {
        fill(&b->rng, q, nq, 4.0f), fill(&b->rng, k, nk, 1.0f), fill(&b->rng, v, nk, 1.0f);
        for (int32_t i = 0; i < n; i++) keep_kv(b, s, i, l, k, v, i);
        TU_COK(b->c, mkv_cache_prefill_layer(b->c, s, l, q, k, v, out, NULL));
        for (int32_t h = 0; (check || sig) && h < H; h++) {
            gather_kv(b, s, l, h, n, 0, K, V);
            double *sg = sig ? sig + ((int64_t)l * H + h) * n : NULL;
            for (int32_t i = 0; sg && i < n; i++) sg[i] = 0.0;
            for (int32_t j = 0; j < n; j++) {
                memset(pm, 0, sizeof(double) * (size_t)n);
                for (int32_t g = 0; g < G; g++) {
                    const int64_t at = ((int64_t)j * H * G + h * G + g) * d;
                    ref_attn(j + 1, d, q + at, K, V, o, p);
                    if (check) expect_close(out + at, o, d, "prefill (query, head)", j, h * G + g);
                    for (int32_t i = 0; i <= j; i++) pm[i] = p[i] > pm[i] ? p[i] : pm[i];
                }
                for (int32_t i = 0; sg && j >= first && i <= j; i++) sg[i] += pm[i];
            }
            for (int32_t i = 0; sg && i < n; i++) sg[i] /= (double)(n - (i > first ? i : first));
        }
    }
    free(q), free(K);
}

/* One generation step: append, then every layer with random q/k/v (kept). check: every output
 * against float64 attention over all positions' fp16-rounded K/V (the uncompressed K16V16
 * pipeline). Returns append's status; nothing else runs unless it is OK. */
static mkv_status_t bk_step(bk_t *b, int32_t n, const int32_t *slots, int check)
{
    const mkv_status_t st = mkv_cache_append(b->c, n, slots, NULL);
    if (st != MKV_STATUS_OK) return st;
    const int32_t H = b->g.H, G = b->g.G, d = b->g.d;
    const int64_t nq = (int64_t)n * H * G * d, nk = (int64_t)n * H * d;
    float *q = tu_xcalloc((size_t)(2 * nq + 2 * nk), sizeof(float)), *out = q + nq;
    float *k = out + nq, *v = k + nk;
    double *K = tu_xcalloc((size_t)(2 * MAXLEN * d), sizeof(double)), *V = K + MAXLEN * d;
    double p[MAXLEN], o[MAXD];
    for (int32_t l = 0; l < b->g.L; l++) {
        fill(&b->rng, q, nq, 4.0f), fill(&b->rng, k, nk, 1.0f), fill(&b->rng, v, nk, 1.0f);
        for (int32_t j = 0; j < n; j++)
            keep_kv(b, slots[j], b->c->st.seq_len[slots[j]] - 1, l, k, v, j);
        TU_COK(b->c, mkv_cache_decode_layer(b->c, n, slots, l, q, k, v, out, NULL));
        for (int32_t j = 0; check && j < n; j++) {
            const int32_t s = slots[j], N = b->c->st.seq_len[s];
            for (int32_t h = 0; h < H; h++) {
                gather_kv(b, s, l, h, N, 1, K, V);
                for (int32_t g = 0; g < G; g++) {
                    const int64_t at = ((int64_t)j * H * G + h * G + g) * d;
                    ref_attn(N, d, q + at, K, V, o, p);
                    expect_close(out + at, o, d, "decode (slot, query head)", s, h * G + g);
                }
            }
        }
    }
    free(q), free(K);
    return MKV_STATUS_OK;
}

/* k, v quantized into a page of section sec's layout and read back into ko, vo. */
static void round_trip(bk_t *b, int sec, const float *k, const float *v, float *ko, float *vo)
{
    mkv_page_write_token(b->page, &b->lay[sec], 0, k, v, 0.0f, 0);
    mkv_page_read_token(b->page, &b->lay[sec], 0, ko, vo, NULL, NULL);
}

static int same(const float *k0, const float *v0, const float *k1, const float *v1, int32_t d)
{
    return !memcmp(k0, k1, sizeof(float) * (size_t)d) && !memcmp(v0, v1, sizeof(float) * (size_t)d);
}

/* Every stored token of slot s decodes exactly as its original quantized: a high token as the
 * high-quantized original; a low token as the low-quantized original (prompt-phase low) or as
 * the low-quantized high-decoded original (demoted; the only option for a generated token).
 * No position twice or out of range; the last W all high. Returns the low tokens seen. */
static int64_t check_integrity(bk_t *b, int32_t s)
{
    const int32_t N = b->c->st.seq_len[s], d = b->g.d;
    float ks[MAXD], vs[MAXD], kh[MAXD], vh[MAXD], ka[MAXD], va[MAXD], kb[MAXD], vb[MAXD];
    uint8_t mark[MAXLEN];
    reg_t rg;
    int64_t lows = 0;
    for (int32_t l = 0; l < b->g.L; l++)
        for (int32_t h = 0; h < b->g.H; h++) {
            const int64_t r = mkv_mm_region(&b->c->st.g, s, l, h);
            read_region(b, r, &rg);
            marks_of(&rg, N, mark);
            for (int32_t p = N > b->g.W ? N - b->g.W : 0; p < N; p++)
                cr_assert_eq(mark[p], M_HI, "slot %d (%d, %d): window position %d not high", s,
                             l, h, p);
            for (int sec = 0; sec < 2; sec++)
                for (int32_t k = 0; k < rg.n[sec]; k++) {
                    int32_t slot;
                    const uint8_t *pg = token_page(b, r, sec, k, &slot);
                    const int32_t p = rg.pos[sec][k];
                    mkv_page_read_token(pg, &b->lay[sec], slot, ks, vs, NULL, NULL);
                    const float *ok = b->hk + hidx(b, s, p, l, h);
                    const float *ov = b->hv + hidx(b, s, p, l, h);
                    round_trip(b, 0, ok, ov, kh, vh);
                    if (!sec) {
                        cr_assert(same(ks, vs, kh, vh, d), "slot %d (%d, %d): high token %d is "
                                  "not its original", s, l, h, p);
                        continue;
                    }
                    lows++;
                    round_trip(b, 1, ok, ov, ka, va);
                    round_trip(b, 1, kh, vh, kb, vb);
                    const int direct = same(ks, vs, ka, va, d) && p < b->plen[s];
                    cr_assert(same(ks, vs, kb, vb, d) || direct,
                              "slot %d (%d, %d): low token %d (prompt %d) is neither its original "
                              "nor its demoted original", s, l, h, p, b->plen[s]);
                }
        }
    return lows;
}

/* What compress must leave in a region stored as bef at length N, as engine/kv_backend.c
 * computes it: sig = score / observers in fp32, mkv_policy_decide, then the budget over what
 * remains (scores do not change). mark: in, the marks before; out, the expected marks. */
static mkv_policy_action_t expect_compress(const bk_t *b, const reg_t *bef, int32_t N,
                                           int32_t plen, int32_t budget, uint8_t *mark)
{
    mkv_policy_token_t tok[2][MAXLEN];
    float sig[MAXLEN];
    for (int sec = 0; sec < 2; sec++)
        for (int32_t k = 0; k < bef->n[sec]; k++) {
            const int32_t p = bef->pos[sec][k];
            sig[p] = bef->sum[sec][k] / (float)mkv_observers(p, plen, N, b->g.obs);
            tok[sec][k] = (mkv_policy_token_t){sig[p], p};
        }
    const mkv_policy_decision_t dd = mkv_policy_decide(tok[0], bef->n[0], tok[1], bef->n[1], N,
                                                       b->g.ah, b->g.al, b->g.W);
    cr_assert_neq(dd.cand, -2, "no high token at the window's edge before compress (N %d)", N);
    const int32_t cp = dd.cand >= 0 ? tok[0][dd.cand].pos : -1;
    switch (dd.action) {
    case MKV_ACT_DEMOTE_VICTIM: mark[tok[0][dd.victim].pos] = M_LO; break;
    case MKV_ACT_PRUNE_VICTIM: mark[tok[0][dd.victim].pos] = M_NONE; break;
    case MKV_ACT_DEMOTE_CAND: mark[cp] = M_LO; break;
    case MKV_ACT_DEMOTE_CAND_PRUNE_LOW:
        mark[cp] = M_LO, mark[tok[1][dd.victim].pos] = M_NONE;
        break;
    case MKV_ACT_PRUNE_CAND: mark[cp] = M_NONE; break;
    default: break;
    }
    if (budget > 0) {
        int32_t n[2] = {0, 0}, idx[2 * MAXLEN];
        uint8_t sec[2 * MAXLEN];
        for (int32_t p = 0; p < N; p++)
            if (mark[p] != M_NONE) {
                const int sc = mark[p] == M_LO;
                tok[sc][n[sc]++] = (mkv_policy_token_t){sig[p], p};
            }
        const int32_t np =
            mkv_policy_budget(tok[0], n[0], tok[1], n[1], N, b->g.W, budget, sec, idx);
        for (int32_t i = 0; i < np; i++) mark[tok[sec[i]][idx[i]].pos] = M_NONE;
    }
    return dd.action;
}

/* At most max(budget, tokens inside the window) stored (budget > 0); everything that
 * disappeared (in before, not in after) lay outside the window. */
static void check_budget(const bk_t *b, int32_t budget, int32_t N, const uint8_t *before,
                         const uint8_t *after, const reg_t *rg)
{
    const int32_t inside = N < b->g.W ? N : b->g.W, cap = budget > inside ? budget : inside;
    if (budget > 0)
        cr_assert_leq(rg->n[0] + rg->n[1], cap, "%d + %d tokens stored, budget %d, window %d",
                      rg->n[0], rg->n[1], budget, inside);
    for (int32_t p = 0; p < N; p++)
        if (before[p] != M_NONE && after[p] == M_NONE)
            cr_assert_lt(p, N - b->g.W, "position %d pruned inside the window (N %d)", p, N);
}

typedef struct drive_out {
    int64_t act[NACT];
    int64_t demoted, pruned, lows; /* generation-phase demotions and prunes; low tokens seen */
} drive_out_t;

/* Three sequences with prompts plens and budgets (may be NULL) committed together, then
 * `steps` generation steps over all of them. After the commit and every compress: validate,
 * integrity, budgets, and (diff) the exact sets that the pure policy predicts. */
static void drive(const geom_t *g, uint64_t seed, const int32_t *plens, const int32_t *budgets,
                  int32_t steps, int diff, drive_out_t *res)
{
    bk_t b;
    bk_init(&b, g, seed);
    memset(res, 0, sizeof *res);
    int32_t sl[3], bud[3] = {0, 0, 0}, LH = g->L * g->H;
    static uint8_t before[3][MAXLH][MAXLEN], want[3][MAXLH][MAXLEN], all[MAXLEN], after[MAXLEN];
    reg_t rg;
    for (int32_t i = 0; i < 3; i++) {
        bud[i] = budgets ? budgets[i] : 0;
        sl[i] = bk_admit(&b, plens[i], bud[i]);
        bk_prefill(&b, sl[i], 0, NULL);
    }
    TU_COK(b.c, mkv_cache_commit_prompt(b.c, 3, sl, NULL));
    tu_expect_valid(b.c, "commit");
    memset(all, M_HI, sizeof all);
    for (int32_t i = 0; i < 3; i++) {
        res->lows += check_integrity(&b, sl[i]);
        for (int32_t lh = 0; lh < LH; lh++) {
            read_region(&b, (int64_t)sl[i] * LH + lh, &rg);
            marks_of(&rg, plens[i], after);
            check_budget(&b, bud[i], plens[i], all, after, &rg);
        }
    }
    for (int32_t t = 0; t < steps; t++) {
        TU_COK(b.c, bk_step(&b, 3, sl, 0));
        for (int32_t i = 0; i < 3; i++)
            for (int32_t lh = 0; lh < LH; lh++) {
                const int32_t N = b.c->st.seq_len[sl[i]];
                read_region(&b, (int64_t)sl[i] * LH + lh, &rg);
                marks_of(&rg, N, before[i][lh]);
                memcpy(want[i][lh], before[i][lh], (size_t)N);
                res->act[expect_compress(&b, &rg, N, plens[i], bud[i], want[i][lh])]++;
            }
        TU_COK(b.c, mkv_cache_compress(b.c, 3, sl, NULL));
        tu_expect_valid(b.c, "compress");
        for (int32_t i = 0; i < 3; i++) {
            const int32_t N = b.c->st.seq_len[sl[i]];
            res->lows += check_integrity(&b, sl[i]);
            for (int32_t lh = 0; lh < LH; lh++) {
                read_region(&b, (int64_t)sl[i] * LH + lh, &rg);
                marks_of(&rg, N, after);
                check_budget(&b, bud[i], N, before[i][lh], after, &rg);
                for (int32_t p = 0; p < N; p++) {
                    res->demoted += before[i][lh][p] == M_HI && after[p] == M_LO;
                    res->pruned += before[i][lh][p] != M_NONE && after[p] == M_NONE;
                    cr_assert(!diff || after[p] == want[i][lh][p],
                              "step %d slot %d region %d position %d: stored as %d, the policy "
                              "says %d (N %d)", t, sl[i], lh, p, after[p], want[i][lh][p], N);
                }
            }
        }
    }
    bk_free(&b);
}

/* ---- 1. Exactness without compression ---- */

Test(backend, exact_without_compression)
{
    const geom_t gs[] = {
        {2, 2, 2, 32, 2, 40, 1, 256, F16, F16, 0, 0, 4, 0, 0},
        {1, 3, 1, 16, 2, 40, 3, 256, F16, F16, 0, 0, 2, 0, 0},
        {3, 1, 4, 64, 2, 40, 2, 32, F16, F16, 0, 0, 1, 3, 0},
    };
    for (int gi = 0; gi < 3; gi++) {
        bk_t b;
        bk_init(&b, &gs[gi], 11 + gi);
        int32_t sl[2] = {bk_admit(&b, 5 + gi, 0), bk_admit(&b, 9 - 3 * gi, 0)};
        for (int i = 0; i < 2; i++) bk_prefill(&b, sl[i], 1, NULL);
        TU_COK(b.c, mkv_cache_commit_prompt(b.c, 2, sl, NULL));
        for (int32_t t = 0; t <= 20; t++) {
            const mkv_cache_stats_t st = tu_stats(b.c);
            cr_assert(st.tokens_pruned == 0 && st.tokens_lo == 0 && st.tokens_hi == st.tokens_seen,
                      "step %d: %lld pruned, %lld low", t, (long long)st.tokens_pruned,
                      (long long)st.tokens_lo);
            tu_expect_valid(b.c, "step");
            if (t == 20) break;
            const int32_t n = t % 3 ? 2 : 1, *s = t % 3 ? sl : sl + 1; /* slot 1 runs ahead */
            TU_COK(b.c, bk_step(&b, n, s, 1));
            TU_COK(b.c, mkv_cache_compress(b.c, n, s, NULL));
        }
        bk_free(&b);
    }
}

/* ---- 2. Token integrity; 3. compress against the pure policy; 5. budgets ---- */

static const geom_t G_DIFF[] = {
    {2, 2, 2, 32, 3, 64, 1, 256, K8V4, K4V2, 1.5f, 0.5f, 4, 0, 0},
    {1, 3, 4, 16, 3, 64, 3, 16, K8V4, K4V2, 1.5f, 0.5f, 4, 0, 0},
    {3, 1, 1, 64, 3, 64, 2, 16, K8V4, K4V2, 1.0f, 0.3f, 3, 6, 0},
    {2, 3, 3, 16, 3, 64, 1, 256, MKV_FORMAT_K8V8, MKV_FORMAT_K2V4, 1.2f, 0.6f, 5, 0, 0},
};

Test(backend, token_integrity)
{
    const int32_t plens[3] = {12, 7, 20};
    int64_t demoted = 0, pruned = 0, lows = 0;
    for (int gi = 0; gi < 4; gi++) {
        drive_out_t res;
        drive(&G_DIFF[gi], 100 + gi, plens, NULL, 40, 0, &res);
        demoted += res.demoted, pruned += res.pruned, lows += res.lows;
    }
    cr_assert(demoted > 0 && pruned > 0 && lows > 0, "demoted %lld, pruned %lld, low %lld",
              (long long)demoted, (long long)pruned, (long long)lows);
}

Test(backend, compress_matches_policy)
{
    const int32_t plens[3] = {3, 16, 9};
    int64_t act[NACT] = {0};
    for (int gi = 0; gi < 4; gi++) {
        drive_out_t res;
        drive(&G_DIFF[gi], 200 + gi, plens, NULL, 44, 1, &res);
        for (int a = 0; a < NACT; a++) act[a] += res.act[a];
    }
    cr_assert_gt(act[MKV_ACT_DEMOTE_VICTIM] + act[MKV_ACT_DEMOTE_CAND], 0, "no demotion");
    cr_assert_gt(act[MKV_ACT_PRUNE_CAND] + act[MKV_ACT_PRUNE_VICTIM], 0, "no prune");
    cr_assert_gt(act[MKV_ACT_KEEP], 0, "no keep");
}

Test(backend, budgets)
{
    const int32_t plens[3] = {14, 5, 24}, budgets[][3] = {{6, 9, 2}, {1, 12, 30}, {4, 4, 8}};
    drive_out_t res;
    for (int gi = 0; gi < 4; gi++)
        drive(&G_DIFF[gi], 300 + gi, plens, budgets[gi % 3], 36, 1, &res);
    geom_t g0 = G_DIFF[0]; /* the budget alone: Algorithm 1 keeps everything */
    g0.ah = g0.al = 0.0f;
    drive(&g0, 399, plens, budgets[0], 30, 1, &res);
    cr_assert_gt(res.pruned, 0, "the budget pruned nothing with alpha 0");
}

/* ---- 4. Prompt classification ---- */

/* Commits one prompt of n tokens and compares every region's classes with
 * mkv_policy_classify_prompt on the float64 significance; disagreement is allowed only within
 * 1e-6 (relative) of a threshold. Counts classes into cnt[3], near-threshold tokens into *ties. */
static void prompt_case(const geom_t *g, uint64_t seed, int32_t n, int64_t cnt[3], int64_t *ties)
{
    bk_t b;
    bk_init(&b, g, seed);
    const int32_t s = bk_admit(&b, n, 0);
    double *sig = tu_xcalloc((size_t)g->L * g->H * n, sizeof(double));
    bk_prefill(&b, s, 0, sig);
    TU_COK(b.c, mkv_cache_commit_prompt(b.c, 1, &s, NULL));
    tu_expect_valid(b.c, "commit");
    const double th_h = (double)(g->ah / (float)n), th_l = (double)(g->al / (float)n);
    float sf[MAXLEN];
    uint8_t cls[MAXLEN], mark[MAXLEN];
    reg_t rg;
    for (int32_t lh = 0; lh < g->L * g->H; lh++) {
        for (int32_t i = 0; i < n; i++) sf[i] = (float)sig[lh * n + i];
        mkv_policy_classify_prompt(sf, n, g->ah, g->al, g->W, cls);
        read_region(&b, (int64_t)s * g->L * g->H + lh, &rg);
        marks_of(&rg, n, mark);
        for (int32_t i = 0; i < n; i++) {
            const int got = mark[i] == M_HI ? MKV_CLASS_HIGH
                            : mark[i] == M_LO ? MKV_CLASS_LOW : MKV_CLASS_PRUNE;
            const double x = sig[lh * n + i];
            const int near = i < n - g->W && (fabs(x - th_h) <= 1e-6 * th_h ||
                                              fabs(x - th_l) <= 1e-6 * th_l);
            *ties += near;
            cnt[got]++;
            cr_assert(i < n - g->W || got == MKV_CLASS_HIGH, "window position %d not high", i);
            cr_assert(got == cls[i] || near,
                      "n %d region %d position %d: class %d, expected %d (sig %.9g, thresholds "
                      "%.9g, %.9g)", n, lh, i, got, cls[i], x, th_l, th_h);
        }
    }
    free(sig);
    bk_free(&b);
}

Test(backend, prompt_classification)
{
    const geom_t gs[] = {
        {2, 2, 2, 32, 1, 64, 1, 256, K8V4, K4V2, 1.0f, 0.3f, 3, 0, 0},
        {1, 3, 4, 16, 1, 64, 3, 256, K8V4, K4V2, 1.5f, 0.5f, 4, 5, 0},
        {3, 1, 1, 64, 1, 64, 2, 32, K8V4, K4V2, 1.2f, 0.4f, 1, 0, 0},
    };
    const int32_t lens[] = {1, 2, 5, 8, 13, 21, 34, 50};
    int64_t cnt[3] = {0, 0, 0}, ties = 0;
    for (int gi = 0; gi < 3; gi++)
        for (int li = 0; li < 8; li++)
            prompt_case(&gs[gi], 500 + gi * 8 + li, lens[li], cnt, &ties);
    const int64_t total = cnt[0] + cnt[1] + cnt[2];
    cr_assert(cnt[MKV_CLASS_PRUNE] > 0 && cnt[MKV_CLASS_LOW] > 0 && cnt[MKV_CLASS_HIGH] > 0,
              "classes %lld %lld %lld", (long long)cnt[0], (long long)cnt[1], (long long)cnt[2]);
    cr_assert_leq(ties * 200, total, "%lld of %lld tokens near a threshold", (long long)ties,
                  (long long)total);

    /* alpha 0 keeps everything high; so does a window longer than the prompt (the control with
     * a short window and the same alphas prunes). */
    geom_t a0 = gs[0], wl = gs[1], ws = gs[1];
    a0.ah = a0.al = 0.0f;
    wl.W = 40, wl.ah = ws.ah = 50.0f, wl.al = ws.al = 20.0f, ws.W = 2;
    int64_t c2[3] = {0, 0, 0};
    prompt_case(&a0, 600, 30, c2, &ties);
    prompt_case(&wl, 601, 33, c2, &ties);
    cr_assert(!c2[MKV_CLASS_PRUNE] && !c2[MKV_CLASS_LOW] && c2[MKV_CLASS_HIGH] == 4 * 30 + 3 * 33);
    prompt_case(&ws, 602, 33, c2, &ties);
    cr_assert_gt(c2[MKV_CLASS_PRUNE], 0, "the control with a short window pruned nothing");
}

/* ---- 6. A long randomised run ---- */

/* bytes_in_use is what the pages listed in the dump's rows account for. */
static void check_dump_pages(const bk_t *b)
{
    char *js = NULL;
    TU_COK(b->c, mkv_cache_dump_json_string(b->c, &js));
    cJSON *root = cJSON_Parse(js), *row;
    cr_assert_not_null(root, "the dump does not parse");
    int64_t hi = 0, lo = 0;
    cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(root, "rows")) {
        hi += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(row, "hi"));
        lo += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(row, "lo"));
    }
    const mkv_cache_stats_t st = tu_stats(b->c);
    cr_assert(st.bytes_in_use == (hi + lo) * b->page_bytes && st.pages_hi == hi &&
                  st.pages_lo == lo,
              "bytes_in_use %lld (%lld + %lld pages); the dump lists %lld + %lld",
              (long long)st.bytes_in_use, (long long)st.pages_hi, (long long)st.pages_lo,
              (long long)hi, (long long)lo);
    cJSON_Delete(root);
    mkv_free(js);
}

static void drop(int32_t *run, int32_t *nrun, int32_t k)
{
    memmove(run + k, run + k + 1, sizeof(int32_t) * (size_t)(*nrun - k - 1));
    (*nrun)--;
}

Test(backend, random_long_run, .timeout = 60)
{
    const geom_t g = {2, 2, 2, 16, 8, 40, 2, 256, K8V4, K4V2, 1.0f, 0.3f, 4, 0, 110};
    bk_t b;
    bk_init(&b, &g, 4242);
    const size_t pool_bytes = (size_t)(g.pool_pages * b.page_bytes);
    uint8_t *pool = tu_xcalloc(pool_bytes, 1);
    int32_t run[MAXS], nrun = 0; /* running slots, oldest first */
    int64_t admits = 0, releases = 0, finished = 0, preempt[2] = {0, 0}, lows = 0;
    for (int32_t step = 0; step < 2000; step++) {
        const int32_t pick = tu_rand_range(&b.rng, 0, 99), plen = tu_rand_range(&b.rng, 1, 16);
        int ok = 0;
        if (pick < 30 && nrun < g.S) TU_COK(b.c, mkv_cache_can_admit(b.c, plen, &ok));
        if (ok) {
            const int32_t budget = tu_rand_range(&b.rng, 0, 2) ? 0 : tu_rand_range(&b.rng, 3, 14);
            const int32_t s = bk_admit(&b, plen, budget);
            tu_expect_valid(b.c, "admit");
            bk_prefill(&b, s, 0, NULL);
            TU_COK(b.c, mkv_cache_commit_prompt(b.c, 1, &s, NULL));
            tu_expect_valid(b.c, "commit");
            run[nrun++] = s, admits++;
        } else if (pick >= 30 && pick < 35 && nrun > 0) {
            const int32_t k = tu_rand_range(&b.rng, 0, nrun - 1);
            TU_COK(b.c, mkv_cache_release(b.c, run[k], NULL));
            drop(run, &nrun, k), releases++;
            tu_expect_valid(b.c, "release");
        }
        for (int32_t k = nrun - 1; k >= 0; k--) /* sequences at max_seq_len finish */
            if (b.c->st.seq_len[run[k]] >= g.max_len) {
                TU_COK(b.c, mkv_cache_release(b.c, run[k], NULL));
                drop(run, &nrun, k), finished++;
                tu_expect_valid(b.c, "finish");
            }
        /* append (phase 0), then compress (phase 1); OUT_OF_PAGES: nothing changed, preempt
         * the newest sequence and try again */
        for (int phase = 0; phase < 2; phase++)
            while (nrun > 0) {
                tu_snap_t s0, s1;
                tu_snap_take(b.c, &s0);
                memcpy(pool, b.c->pool, pool_bytes);
                const mkv_status_t st = phase ? mkv_cache_compress(b.c, nrun, run, NULL)
                                              : bk_step(&b, nrun, run, 0);
                tu_snap_take(b.c, &s1);
                if (st != MKV_STATUS_OK) {
                    cr_assert_eq(st, MKV_STATUS_OUT_OF_PAGES, "step %d phase %d: %s (%s)", step,
                                 phase, mkv_status_string(st), mkv_cache_last_error(b.c));
                    tu_snap_expect_equal(&s0, &s1, 1, phase ? "compress" : "append");
                    cr_assert(!memcmp(pool, b.c->pool, pool_bytes), "refused, pool changed");
                }
                tu_snap_free(&s0), tu_snap_free(&s1);
                tu_expect_valid(b.c, phase ? "compress" : "append");
                if (st == MKV_STATUS_OK) break;
                TU_COK(b.c, mkv_cache_release(b.c, run[--nrun], NULL));
                preempt[phase]++;
                tu_expect_valid(b.c, "preempt");
            }
        const mkv_cache_stats_t st = tu_stats(b.c);
        cr_assert_eq(st.pages_hi + st.pages_lo, st.total_pages - st.free_pages, "step %d", step);
        for (int32_t k = 0; step % 5 == 0 && k < nrun; k++) lows += check_integrity(&b, run[k]);
        if (step % 50 == 0) check_dump_pages(&b);
    }
    check_dump_pages(&b);
    char msg[200];
    snprintf(msg, sizeof msg, "admits %lld, releases %lld, finished %lld, preempted at append "
             "%lld, at compress %lld, low tokens checked %lld", (long long)admits,
             (long long)releases, (long long)finished, (long long)preempt[0],
             (long long)preempt[1], (long long)lows);
    cr_log_info("%s", msg);
    cr_assert(admits > 3 * g.S && finished && releases && preempt[0] + preempt[1] && lows, "%s",
              msg);
    free(pool);
    bk_free(&b);
}

/* ---- 7. Refused calls change nothing ---- */

/* Runs call, expects status `expected` with a message, and the same dump and pool bytes. */
#define EXPECT_REFUSED(c, expected, call)                                                        \
    do {                                                                                         \
        char *d0_ = NULL, *d1_ = NULL;                                                           \
        const size_t n_ = (c)->pool ? (size_t)((c)->cfg.pool_pages * (c)->cfg.page_bytes) : 0;  \
        uint8_t *p_ = tu_xcalloc(n_, 1);                                                            \
        if (n_) memcpy(p_, (c)->pool, n_);                                                       \
        TU_COK((c), mkv_cache_dump_json_string((c), &d0_));                                      \
        const mkv_status_t got_ = (call);                                                        \
        cr_assert_eq(got_, (expected), "%s: got '%s', expected '%s' (%s)", #call,                \
                     mkv_status_string(got_), mkv_status_string(expected),                       \
                     mkv_cache_last_error(c));                                                   \
        cr_assert_str_neq(mkv_cache_last_error(c), "", "%s: no message", #call);                 \
        TU_COK((c), mkv_cache_dump_json_string((c), &d1_));                                      \
        cr_assert_str_eq(d1_, d0_, "%s changed the dump", #call);                                \
        cr_assert(!n_ || !memcmp(p_, (c)->pool, n_), "%s changed the pool", #call);              \
        mkv_free(d0_), mkv_free(d1_), free(p_);                                                  \
        tu_expect_valid((c), #call);                                                             \
    } while (0)

static const geom_t G_ERR = {2, 1, 2, 16, 3, 32, 1, 256, K8V4, K4V2, 1.0f, 0.3f, 2, 0, 64};

Test(backend, errors_metadata_only)
{
    mkv_cache_config_t cfg = make_config(&G_ERR);
    cfg.flags = MKV_CACHE_METADATA_ONLY;
    mkv_cache_t *c = tu_create(&cfg);
    int32_t s, nh[2] = {4, 4}, nl[2] = {0, 0}, len = 4;
    static float x[4 * 2 * 16];
    TU_COK(c, mkv_cache_admit(c, 4, &s));
    EXPECT_REFUSED(c, MKV_STATUS_UNSUPPORTED, mkv_cache_prefill_layer(c, s, 0, x, x, x, x, NULL));
    EXPECT_REFUSED(c, MKV_STATUS_UNSUPPORTED, mkv_cache_commit_prompt(c, 1, &s, NULL));
    const mkv_resize_t rz = {1, &s, &len, nh, nl}; /* place the prompt the memory manager's way */
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    TU_COK(c, mkv_cache_append(c, 1, &s, NULL));
    EXPECT_REFUSED(c, MKV_STATUS_UNSUPPORTED,
                   mkv_cache_decode_layer(c, 1, &s, 0, x, x, x, x, NULL));
    EXPECT_REFUSED(c, MKV_STATUS_UNSUPPORTED, mkv_cache_compress(c, 1, &s, NULL));
    mkv_cache_destroy(c);
}

Test(backend, errors_prompt_and_decode)
{
    bk_t b;
    bk_init(&b, &G_ERR, 77);
    mkv_cache_t *c = b.c;
    static float q[8 * 2 * 16], k[8 * 16], v[8 * 16], o[8 * 2 * 16];
    const int32_t s0 = bk_admit(&b, 6, 0), s1 = bk_admit(&b, 5, 0), both[2] = {s0, s1};
    const mkv_status_t INV = MKV_STATUS_INVALID_ARGUMENT;
    EXPECT_REFUSED(c, INV, mkv_cache_prefill_layer(c, s0, -1, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_prefill_layer(c, s0, 2, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_prefill_layer(c, 2, 0, q, k, v, o, NULL)); /* free slot */
    EXPECT_REFUSED(c, INV, mkv_cache_prefill_layer(c, s0, 0, NULL, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_prefill_layer(c, s0, 0, q, NULL, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_prefill_layer(c, s0, 0, q, k, NULL, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_prefill_layer(c, s0, 0, q, k, v, NULL, NULL));
    cr_assert_eq(mkv_cache_prefill_layer(NULL, s0, 0, q, k, v, o, NULL), INV);
    EXPECT_REFUSED(c, INV, mkv_cache_commit_prompt(c, 1, &s0, NULL));
    TU_COK(c, mkv_cache_prefill_layer(c, s0, 0, q, k, v, o, NULL)); /* layer 1 still missing */
    EXPECT_REFUSED(c, INV, mkv_cache_commit_prompt(c, 1, &s0, NULL));
    bk_prefill(&b, s0, 0, NULL);
    /* s0 is ready, s1 is not: the pair is refused whole, and s0 can still be committed */
    EXPECT_REFUSED(c, INV, mkv_cache_commit_prompt(c, 2, both, NULL));
    TU_COK(c, mkv_cache_commit_prompt(c, 1, &s0, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_prefill_layer(c, s0, 0, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_commit_prompt(c, 1, &s0, NULL));
    bk_prefill(&b, s1, 0, NULL);
    TU_COK(c, mkv_cache_commit_prompt(c, 1, &s1, NULL));
    check_integrity(&b, s0), check_integrity(&b, s1);

    /* decode without append, or of a slot the append did not include; each layer once;
     * compress only after every layer */
    EXPECT_REFUSED(c, INV, mkv_cache_decode_layer(c, 1, &s0, 0, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_compress(c, 1, &s0, NULL));
    TU_COK(c, mkv_cache_append(c, 1, &s0, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_decode_layer(c, 2, both, 0, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_decode_layer(c, 1, &s0, 2, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_decode_layer(c, 1, &s0, -1, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_decode_layer(c, 1, &s0, 0, q, NULL, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_decode_layer(c, 1, &s0, 0, q, k, v, NULL, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_compress(c, 1, &s0, NULL));
    TU_COK(c, mkv_cache_decode_layer(c, 1, &s0, 0, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_decode_layer(c, 1, &s0, 0, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_compress(c, 1, &s0, NULL));
    TU_COK(c, mkv_cache_decode_layer(c, 1, &s0, 1, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_decode_layer(c, 1, &s0, 1, q, k, v, o, NULL));
    EXPECT_REFUSED(c, INV, mkv_cache_compress(c, 2, both, NULL));
    TU_COK(c, mkv_cache_compress(c, 1, &s0, NULL));
    tu_expect_valid(c, "compress");
    bk_free(&b);
}

/* A compress that needs a new low page while none is available (the rest is reserved) and no
 * high page empties is refused with nothing changed; with pages back it demotes. L = H = 1,
 * pages of 2 high tokens, W 3 (the high section, 3 -> 4 -> 3 tokens, keeps its 2 pages), the
 * low section full, alpha_h so high that the candidate is demoted (alpha_l 0). */
Test(backend, compress_out_of_pages)
{
    const geom_t g = {1, 1, 1, 16, 2, 32, 2, 256, K8V4, K4V2, 1000.0f, 0.0f, 3, 0, 16};
    bk_t b;
    bk_init(&b, &g, 5);
    const int32_t tpp_lo = b.lay[1].tokens, n0 = g.W + 2 * tpp_lo;
    const int32_t s0 = bk_admit(&b, n0, 0);
    bk_prefill(&b, s0, 0, NULL);
    TU_COK(b.c, mkv_cache_commit_prompt(b.c, 1, &s0, NULL));
    cr_assert(b.c->st.n_hi[0] == g.W && b.c->st.n_lo[0] == 2 * tpp_lo);
    const int64_t avail = tu_stats(b.c).available_pages; /* reserve all of it */
    int32_t s1, p1 = (int32_t)(avail - 1) * g.tpp;
    cr_assert(p1 >= 1 && p1 <= g.max_len, "avail %lld", (long long)avail);
    TU_COK(b.c, mkv_cache_admit(b.c, p1, &s1));
    TU_COK(b.c, bk_step(&b, 1, &s0, 0));
    cr_assert_eq(tu_stats(b.c).available_pages, 0);
    EXPECT_REFUSED(b.c, MKV_STATUS_OUT_OF_PAGES, mkv_cache_compress(b.c, 1, &s0, NULL));
    TU_COK(b.c, mkv_cache_release(b.c, s1, NULL));
    TU_COK(b.c, mkv_cache_compress(b.c, 1, &s0, NULL));
    tu_expect_valid(b.c, "compress");
    cr_assert(b.c->st.n_hi[0] == g.W && b.c->st.n_lo[0] == 2 * tpp_lo + 1);
    check_integrity(&b, s0);
    bk_free(&b);
}

/* A second compress in the same step (no append or decode since the first) has no new token
 * to act on: it must be refused like a second decode of a layer, not run Algorithm 1 again.
 * Here the first compress pruned the candidate (alphas so high that every token outside the
 * window goes), so the rerun finds no candidate. */
Test(backend, compress_twice_in_a_step)
{
    geom_t g = G_ERR;
    g.ah = g.al = 1000.0f;
    bk_t b;
    bk_init(&b, &g, 9);
    const int32_t s = bk_admit(&b, 6, 0);
    bk_prefill(&b, s, 0, NULL);
    TU_COK(b.c, mkv_cache_commit_prompt(b.c, 1, &s, NULL));
    TU_COK(b.c, bk_step(&b, 1, &s, 0));
    TU_COK(b.c, mkv_cache_compress(b.c, 1, &s, NULL));
    EXPECT_REFUSED(b.c, MKV_STATUS_INVALID_ARGUMENT, mkv_cache_compress(b.c, 1, &s, NULL));
    bk_free(&b);
}

/* A slot's next occupant starts afresh: what the previous sequence left (the length at which
 * it last decoded or compressed) must not refuse or skip the new one's steps. Every occupant
 * here compresses last at N = 6 and the next one first at N = 6. */
Test(backend, slot_reuse_starts_afresh)
{
    geom_t g = G_ERR;
    g.ah = 2.0f, g.al = 0.5f;
    bk_t b;
    bk_init(&b, &g, 13);
    const int32_t plen[4] = {5, 5, 4, 5}, steps[4] = {1, 1, 2, 3};
    for (int round = 0; round < 4; round++) {
        const int32_t s = bk_admit(&b, plen[round], 0);
        cr_assert_eq(s, 0);
        bk_prefill(&b, s, 0, NULL);
        TU_COK(b.c, mkv_cache_commit_prompt(b.c, 1, &s, NULL));
        for (int t = 0; t < steps[round]; t++) {
            TU_COK(b.c, bk_step(&b, 1, &s, 0));
            TU_COK(b.c, mkv_cache_compress(b.c, 1, &s, NULL));
            check_integrity(&b, s);
        }
        TU_COK(b.c, mkv_cache_release(b.c, s, NULL));
        tu_expect_valid(b.c, "release");
    }
    bk_free(&b);
}

/* Since 0.2: f16 and bf16 tensors, and the batched prefill. Two caches get the same values,
 * one as f32 through the one-slot calls, the other in dtype through the _ex calls (every slot
 * of the prompt in one call): outputs are the f32 results rounded to dtype, bit for bit, and
 * the two dumps (page tables, codes' scores and positions) are identical. */
static void dtype_case(mkv_dtype_t dt)
{
    const geom_t g = {2, 2, 3, 16, 3, 48, 2, 256, K8V4, K4V2, 1.0f, 0.3f, 3, 0, 0};
    const int32_t H = g.H, G = g.G, d = g.d, plens[2] = {7, 12};
    bk_t a, b;
    bk_init(&a, &g, 5);
    bk_init(&b, &g, 5);
    tu_rng_t rng = {123};
    const int64_t rows = plens[0] + plens[1], nq = rows * H * G * d, nkv = rows * H * d;
    float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nkv * 4), *v = malloc((size_t)nkv * 4);
    float *o = malloc((size_t)nq * 4);
    uint16_t *q16 = malloc((size_t)nq * 2), *k16 = malloc((size_t)nkv * 2), *v16 = malloc((size_t)nkv * 2);
    uint16_t *o16 = malloc((size_t)nq * 2);
    int32_t slots[2];
    for (int i = 0; i < 2; i++) {
        TU_COK(a.c, mkv_cache_admit(a.c, plens[i], &slots[i]));
        TU_COK(b.c, mkv_cache_admit(b.c, plens[i], &slots[i]));
    }
    /* values exactly representable in dt, so both caches see the same numbers */
    const int bf = dt == MKV_DTYPE_BF16;
    for (int32_t l = 0; l < g.L; l++) {
        float *xs[3] = {q, k, v};
        uint16_t *hs[3] = {q16, k16, v16};
        const int64_t ns[3] = {nq, nkv, nkv};
        for (int t = 0; t < 3; t++) {
            fill(&rng, xs[t], ns[t], 2.0f);
            for (int64_t i = 0; i < ns[t]; i++) {
                hs[t][i] = bf ? mkv_f32_to_bf16(xs[t][i]) : mkv_f32_to_f16(xs[t][i]);
                xs[t][i] = bf ? mkv_bf16_to_f32(hs[t][i]) : mkv_f16_to_f32(hs[t][i]);
            }
        }
        int64_t row = 0;
        for (int i = 0; i < 2; i++) {
            TU_COK(a.c, mkv_cache_prefill_layer(a.c, slots[i], l, q + row * H * G * d, k + row * H * d,
                                                v + row * H * d, o + row * H * G * d, NULL));
            row += plens[i];
        }
        TU_COK(b.c, mkv_cache_prefill_layer_ex(b.c, 2, slots, l, dt, q16, k16, v16, o16, NULL));
        for (int64_t i = 0; i < nq; i++)
            cr_assert_eq(o16[i], bf ? mkv_f32_to_bf16(o[i]) : mkv_f32_to_f16(o[i]),
                         "%s prefill out[%lld]", mkv_dtype_name(dt), (long long)i);
    }
    TU_COK(a.c, mkv_cache_commit_prompt(a.c, 2, slots, NULL));
    TU_COK(b.c, mkv_cache_commit_prompt(b.c, 2, slots, NULL));
    for (int step = 0; step < 6; step++) {
        TU_COK(a.c, mkv_cache_append(a.c, 2, slots, NULL));
        TU_COK(b.c, mkv_cache_append(b.c, 2, slots, NULL));
        for (int32_t l = 0; l < g.L; l++) {
            const int64_t dq = 2 * H * G * d, dkv = 2 * H * d;
            fill(&rng, q, dq, 2.0f), fill(&rng, k, dkv, 2.0f), fill(&rng, v, dkv, 2.0f);
            float *xs[3] = {q, k, v};
            uint16_t *hs[3] = {q16, k16, v16};
            const int64_t ns[3] = {dq, dkv, dkv};
            for (int t = 0; t < 3; t++)
                for (int64_t i = 0; i < ns[t]; i++) {
                    hs[t][i] = bf ? mkv_f32_to_bf16(xs[t][i]) : mkv_f32_to_f16(xs[t][i]);
                    xs[t][i] = bf ? mkv_bf16_to_f32(hs[t][i]) : mkv_f16_to_f32(hs[t][i]);
                }
            TU_COK(a.c, mkv_cache_decode_layer(a.c, 2, slots, l, q, k, v, o, NULL));
            TU_COK(b.c, mkv_cache_decode_layer_ex(b.c, 2, slots, l, dt, q16, k16, v16, o16, NULL));
            for (int64_t i = 0; i < dq; i++)
                cr_assert_eq(o16[i], bf ? mkv_f32_to_bf16(o[i]) : mkv_f32_to_f16(o[i]),
                             "%s decode step %d out[%lld]", mkv_dtype_name(dt), step, (long long)i);
        }
        TU_COK(a.c, mkv_cache_compress(a.c, 2, slots, NULL));
        TU_COK(b.c, mkv_cache_compress(b.c, 2, slots, NULL));
    }
    char *ja, *jb;
    TU_COK(a.c, mkv_cache_dump_json_string(a.c, &ja));
    TU_COK(b.c, mkv_cache_dump_json_string(b.c, &jb));
    cr_assert_str_eq(ja, jb, "%s: the two caches' dumps differ", mkv_dtype_name(dt));
    cr_assert_eq(memcmp(a.c->pool, b.c->pool, (size_t)(a.c->cfg.pool_pages * a.c->cfg.page_bytes)), 0,
                 "%s: the page pools differ", mkv_dtype_name(dt));
    mkv_free(ja), mkv_free(jb);
    /* bad element types are refused with nothing changed */
    EXPECT_REFUSED(b.c, MKV_STATUS_INVALID_ARGUMENT,
                   mkv_cache_decode_layer_ex(b.c, 2, slots, 0, MKV_DTYPE_COUNT, q16, k16, v16, o16, NULL));
    EXPECT_REFUSED(b.c, MKV_STATUS_INVALID_ARGUMENT,
                   mkv_cache_decode_layer_ex(b.c, 2, slots, 0, (mkv_dtype_t)-1, q16, k16, v16, o16, NULL));
    free(q), free(k), free(v), free(o), free(q16), free(k16), free(v16), free(o16);
    bk_free(&a), bk_free(&b);
}

Test(backend, dtypes_f16_bf16_batched_prefill)
{
    cr_assert_str_eq(mkv_dtype_name(MKV_DTYPE_BF16), "bf16");
    cr_assert_eq(mkv_dtype_size(MKV_DTYPE_F32), 4u);
    cr_assert_eq(mkv_dtype_size(MKV_DTYPE_COUNT), 0u);
    dtype_case(MKV_DTYPE_F16);
    dtype_case(MKV_DTYPE_BF16);
}

/* MKV_CACHE_ASYNC_STEPS is a CUDA-backend flag: the CPU backend accepts and ignores it, and
 * mkv_cache_sync has nothing to wait for there (OK, nothing changed); a refused step is still
 * refused at once. */
Test(backend, async_flag_and_sync_on_cpu)
{
    const geom_t g = {1, 1, 1, 16, 2, 32, 2, 256, K8V4, K4V2, 1000.0f, 0.0f, 3, 0, 16};
    mkv_cache_config_t cfg = make_config(&g);
    cfg.flags = MKV_CACHE_ASYNC_STEPS;
    mkv_cache_t *c = tu_create(&cfg);
    cr_assert_eq(mkv_cache_sync(NULL, NULL), MKV_STATUS_INVALID_ARGUMENT);
    int32_t s;
    TU_COK(c, mkv_cache_admit(c, 30, &s));
    tu_snap_t before, after;
    tu_snap_take(c, &before);
    TU_COK(c, mkv_cache_sync(c, NULL));
    tu_snap_take(c, &after);
    tu_snap_expect_equal(&before, &after, 1, "mkv_cache_sync");
    tu_snap_free(&before), tu_snap_free(&after);
    mkv_cache_destroy(c);
    cfg.flags = 0x80u; /* an unknown bit is still refused */
    mkv_cache_t *bad = NULL;
    cr_assert_eq(mkv_cache_create(&cfg, &bad), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_null(bad);
}

/* mkv_cache_set_parallel: the CPU backend's attention on an engine's own "threads" (here one
 * thread running the pieces last first, with their part numbers) gives the same bits as the
 * calling thread alone; the prompt length of a slot is readable through the API. */
typedef struct rev_runner {
    int32_t parts, calls, pieces, bad_part;
} rev_runner_t;

static void rev_run(void *runner, mkv_task_fn fn, void *task, int64_t n)
{
    rev_runner_t *r = runner;
    r->calls++;
    for (int32_t i = r->parts - 1; i >= 0; i--) {
        const int64_t b = n * i / r->parts, e = n * (i + 1) / r->parts;
        if (b >= e) continue;
        r->pieces++;
        if (i < 0 || i >= r->parts) r->bad_part = 1;
        fn(task, b, e, i);
    }
}

Test(backend, engine_threads_same_bits)
{
    const geom_t g = {2, 3, 2, 16, 3, 64, 2, 256, K8V4, K4V2, 1.0f, 0.3f, 3, 0, 0};
    const int32_t H = g.H, G = g.G, d = g.d, plen = 11;
    bk_t a, b;
    bk_init(&a, &g, 5);
    bk_init(&b, &g, 5);
    rev_runner_t rr = {3, 0, 0, 0};
    cr_assert_eq(mkv_cache_set_parallel(b.c, rev_run, &rr, 0), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_cache_set_parallel(NULL, rev_run, &rr, 3), MKV_STATUS_INVALID_ARGUMENT);
    TU_COK(b.c, mkv_cache_set_parallel(b.c, rev_run, &rr, rr.parts));
    cr_assert_eq(mkv_cache_set_capture_horizon(b.c, -1), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_cache_set_capture_horizon(NULL, 4), MKV_STATUS_INVALID_ARGUMENT);
    TU_COK(b.c, mkv_cache_set_capture_horizon(b.c, 4)); /* the CPU backend accepts and ignores it */
    int32_t slots[3], got;
    cr_assert_eq(mkv_cache_prompt_len(a.c, 0, &got), MKV_STATUS_INVALID_ARGUMENT, "an inactive slot");
    cr_assert_eq(mkv_cache_prompt_len(a.c, 99, &got), MKV_STATUS_INVALID_ARGUMENT, "out of range");
    for (int i = 0; i < 3; i++) {
        TU_COK(a.c, mkv_cache_admit(a.c, plen + i, &slots[i]));
        TU_COK(b.c, mkv_cache_admit(b.c, plen + i, &slots[i]));
        TU_COK(a.c, mkv_cache_prompt_len(a.c, slots[i], &got));
        cr_assert_eq(got, plen + i);
    }
    tu_rng_t rng = {77};
    const int64_t rows = 3 * plen + 3;
    float *q = malloc((size_t)(rows * H * G * d) * 4), *k = malloc((size_t)(rows * H * d) * 4);
    float *v = malloc((size_t)(rows * H * d) * 4), *oa = malloc((size_t)(rows * H * G * d) * 4);
    float *ob = malloc((size_t)(rows * H * G * d) * 4);
    for (int32_t l = 0; l < g.L; l++)
        for (int i = 0; i < 3; i++) {
            const int64_t n = plen + i;
            fill(&rng, q, n * H * G * d, 2.0f), fill(&rng, k, n * H * d, 2.0f), fill(&rng, v, n * H * d, 2.0f);
            TU_COK(a.c, mkv_cache_prefill_layer(a.c, slots[i], l, q, k, v, oa, NULL));
            TU_COK(b.c, mkv_cache_prefill_layer(b.c, slots[i], l, q, k, v, ob, NULL));
            cr_assert_eq(memcmp(oa, ob, (size_t)(n * H * G * d) * 4), 0, "prefill layer %d slot %d", l, i);
        }
    TU_COK(a.c, mkv_cache_commit_prompt(a.c, 3, slots, NULL));
    TU_COK(b.c, mkv_cache_commit_prompt(b.c, 3, slots, NULL));
    for (int step = 0; step < 8; step++) {
        TU_COK(a.c, mkv_cache_append(a.c, 3, slots, NULL));
        TU_COK(b.c, mkv_cache_append(b.c, 3, slots, NULL));
        for (int32_t l = 0; l < g.L; l++) {
            fill(&rng, q, 3 * H * G * d, 2.0f), fill(&rng, k, 3 * H * d, 2.0f), fill(&rng, v, 3 * H * d, 2.0f);
            TU_COK(a.c, mkv_cache_decode_layer(a.c, 3, slots, l, q, k, v, oa, NULL));
            TU_COK(b.c, mkv_cache_decode_layer(b.c, 3, slots, l, q, k, v, ob, NULL));
            cr_assert_eq(memcmp(oa, ob, (size_t)(3 * H * G * d) * 4), 0, "decode step %d layer %d", step, l);
        }
        TU_COK(a.c, mkv_cache_compress(a.c, 3, slots, NULL));
        TU_COK(b.c, mkv_cache_compress(b.c, 3, slots, NULL));
    }
    cr_assert_gt(rr.calls, 0, "the engine's parallel function was never used");
    cr_assert_gt(rr.pieces, rr.calls, "no call was split");
    cr_assert_eq(rr.bad_part, 0);
    char *ja, *jb;
    TU_COK(a.c, mkv_cache_dump_json_string(a.c, &ja));
    TU_COK(b.c, mkv_cache_dump_json_string(b.c, &jb));
    cr_assert_str_eq(ja, jb, "the two caches' dumps differ");
    /* back to the calling thread: no more calls */
    const int32_t calls = rr.calls;
    TU_COK(b.c, mkv_cache_set_parallel(b.c, NULL, NULL, 1));
    TU_COK(b.c, mkv_cache_append(b.c, 3, slots, NULL));
    for (int32_t l = 0; l < g.L; l++) TU_COK(b.c, mkv_cache_decode_layer(b.c, 3, slots, l, q, k, v, ob, NULL));
    cr_assert_eq(rr.calls, calls);
    mkv_free(ja), mkv_free(jb);
    free(q), free(k), free(v), free(oa), free(ob);
    bk_free(&a), bk_free(&b);
}

/* The fixed mix on the CPU backend: after the prompt and after every step, each head-region
 * holds exactly round(mix_high m) high tokens outside the window (m = N - W) and at most
 * round(mix_low m) low ones (and within one of it); the config's checks. */
Test(backend, fixed_mix_tracks_its_fractions)
{
    const geom_t g = {2, 3, 2, 16, 2, 200, 2, 256, K8V4, K4V2, 1.0f, 0.02f, 8, 0, 0};
    mkv_cache_config_t cfg = make_config(&g);
    cfg.mix_high = 0.2f, cfg.mix_low = 0.5f;
    mkv_cache_t *c = tu_create(&cfg);
    const int32_t H = g.H, G = g.G, d = g.d, W = g.W, LH = g.L * g.H, plen = 57;
    int32_t slots[2];
    for (int i = 0; i < 2; i++) TU_COK(c, mkv_cache_admit(c, plen, &slots[i]));
    tu_rng_t rng = {99};
    float *q = malloc((size_t)plen * H * G * d * 4), *k = malloc((size_t)plen * H * d * 4);
    float *v = malloc((size_t)plen * H * d * 4), *o = malloc((size_t)plen * H * G * d * 4);
    for (int32_t l = 0; l < g.L; l++)
        for (int i = 0; i < 2; i++) {
            fill(&rng, q, (int64_t)plen * H * G * d, 3.0f), fill(&rng, k, (int64_t)plen * H * d, 3.0f);
            fill(&rng, v, (int64_t)plen * H * d, 3.0f);
            TU_COK(c, mkv_cache_prefill_layer(c, slots[i], l, q, k, v, o, NULL));
        }
    TU_COK(c, mkv_cache_commit_prompt(c, 2, slots, NULL));
    for (int step = 0; step <= 40; step++) {
        if (step > 0) {
            TU_COK(c, mkv_cache_append(c, 2, slots, NULL));
            for (int32_t l = 0; l < g.L; l++) {
                fill(&rng, q, 2 * H * G * d, 3.0f), fill(&rng, k, 2 * H * d, 3.0f), fill(&rng, v, 2 * H * d, 3.0f);
                TU_COK(c, mkv_cache_decode_layer(c, 2, slots, l, q, k, v, o, NULL));
            }
            TU_COK(c, mkv_cache_compress(c, 2, slots, NULL));
        }
        for (int i = 0; i < 2; i++) {
            mkv_slot_info_t si;
            TU_COK(c, mkv_cache_slot_info(c, slots[i], &si));
            int32_t nh, nl;
            mkv_policy_mix_targets(si.seq_len - W, cfg.mix_high, cfg.mix_low, &nh, &nl);
            cr_assert_eq(si.tokens_hi, (int64_t)LH * (nh + W), "step %d slot %d: %lld high, want %d a region", step,
                         i, (long long)si.tokens_hi, nh + W);
            cr_assert_leq(si.tokens_lo, (int64_t)LH * nl, "step %d slot %d: %lld low", step, i, (long long)si.tokens_lo);
            cr_assert_geq(si.tokens_lo, (int64_t)LH * (nl - 1), "step %d slot %d: %lld low", step, i,
                          (long long)si.tokens_lo);
        }
        TU_COK(c, mkv_cache_validate(c));
    }
    free(q), free(k), free(v), free(o);
    mkv_cache_destroy(c);
    /* refusals: out of range, a sum above 1 */
    mkv_cache_t *bad = NULL;
    cfg.mix_high = 0.7f, cfg.mix_low = 0.5f;
    cr_assert_eq(mkv_cache_create(&cfg, &bad), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(mkv_last_error(), "mix_high"), "%s", mkv_last_error());
    cfg.mix_high = -0.1f, cfg.mix_low = 0.0f;
    cr_assert_eq(mkv_cache_create(&cfg, &bad), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_null(bad);
}
