/*
 * kv_backend.c — the KV backend on the CPU: token data in pages, prompt placement, decode
 * attention with significance, and the compression policy, on top of the memory manager.
 *
 * Prompt: mkv_cache_prefill_layer keeps each layer's K/V in full-precision working memory and
 * accumulates significance (attention/prefill_ref.c); mkv_cache_commit_prompt classifies every
 * head-region (engine/policy.c), allocates exactly the pages needed with one resize and
 * quantizes the tokens into them in position order.
 * Decode: mkv_cache_append gives every head-region one more high slot; mkv_cache_decode_layer
 * quantizes the new token into it and attends (attention/decode_ref.c); mkv_cache_compress
 * runs Algorithm 1 per head-region.
 *
 * Compress never leaves a half-applied step (check, then act): it decides every head-region
 * first, reading only, and asks the memory manager whether the resulting section sizes fit
 * (mkv_cache_resize_check; refused with nothing changed). Only then does it move token data:
 * the high token that leaves is dequantized into a staging buffer and swap-removed; one resize
 * recycles emptied pages and allocates new low pages; the staged tokens are quantized afresh
 * into their low slots (demotion). A budget, when set, prunes in a second pass that only
 * recycles.
 */
#include "attention/attention.h"
#include "engine/kv.h"
#include "engine/policy.h"
#include "memmgr/cache.h"
#include "quant/half.h"
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

/* Full-precision working memory of one slot's prompt. */
typedef struct prompt_ws {
    uint32_t epoch; /* the occupant it belongs to; 0: empty */
    int32_t n;      /* prompt length */
    float *k, *v;   /* [L][n][H][d] */
    float *sig;     /* [L][H][n] significance sums */
    uint8_t *cls;   /* [L][H][n] classes, filled by commit */
    uint8_t *done;  /* [L] layers prefilled */
} prompt_ws_t;

typedef struct cpu_kv {
    int32_t max_seqs;
    mkv_page_layout_t lay_hi, lay_lo;
    prompt_ws_t *ws;             /* [S] */
    float *scratch;              /* attention scratch, (G + 2) * max_seq_len + 4 * d floats */
    float *tok;                  /* [2 * d] the new token's K and V, rounded to fp16 */
    mkv_policy_token_t *hi_tok;  /* [max_seq_len] one section's tokens */
    mkv_policy_token_t *lo_tok;  /* [max_seq_len] */
    uint8_t *prune_sec;          /* [2 * max_seq_len] */
    int32_t *prune_idx;          /* [2 * max_seq_len] */
    int32_t *tgt_hi, *tgt_lo;    /* [S * L * H] resize targets in call order */
    int32_t *seq;                /* [S] */
    mkv_policy_decision_t *dec;  /* [S * L * H] */
    float *stage;                /* [S * L * H][2 * d] K and V of each region's demoted token */
    float *stage_score;          /* [S * L * H] */
    int32_t *stage_pos;          /* [S * L * H] */
    float *par_scratch;          /* per-thread attention scratch (grown on demand) */
    int64_t par_floats;          /* its size in floats */
    mkv_region_pages_t *dec_regions; /* [S * H] the head-regions of a decode call */
    float *conv;                 /* f16 / bf16 tensors converted to f32 (grown on demand) */
    int64_t conv_floats;
} cpu_kv_t;

static void ws_free(prompt_ws_t *ws)
{
    free(ws->k);
    free(ws->v);
    free(ws->sig);
    free(ws->cls);
    free(ws->done);
    memset(ws, 0, sizeof *ws);
}

static void cpu_destroy(mkv_kv_t *base)
{
    cpu_kv_t *kv = base->impl;
    if (!kv) return;
    if (kv->ws)
        for (int32_t s = 0; s < kv->max_seqs; s++) ws_free(&kv->ws[s]);
    free(kv->ws);
    free(kv->scratch);
    free(kv->tok);
    free(kv->hi_tok);
    free(kv->lo_tok);
    free(kv->prune_sec);
    free(kv->prune_idx);
    free(kv->tgt_hi);
    free(kv->tgt_lo);
    free(kv->seq);
    free(kv->dec);
    free(kv->stage);
    free(kv->stage_score);
    free(kv->stage_pos);
    free(kv->par_scratch);
    free(kv->dec_regions);
    free(kv->conv);
    free(kv);
    base->impl = NULL;
}

static mkv_status_t cpu_create(mkv_cache_t *c, mkv_kv_t *base)
{
    const mkv_cache_config_t *cfg = &c->cfg;
    const mkv_mm_geom_t *g = &c->st.g;
    const int64_t regions = mkv_mm_regions(g);
    const int64_t n = cfg->max_seq_len;
    cpu_kv_t *kv = calloc(1, sizeof *kv);
    if (!kv) return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the KV backend");
    base->impl = kv;
    kv->max_seqs = g->max_seqs;
    kv->lay_hi = base->lay_hi;
    kv->lay_lo = base->lay_lo;
    kv->ws = calloc((size_t)g->max_seqs, sizeof *kv->ws);
    kv->scratch = malloc((size_t)((cfg->group_size + 2) * n + 4 * cfg->head_dim) * sizeof(float));
    kv->tok = malloc((size_t)(2 * cfg->head_dim) * sizeof(float));
    kv->hi_tok = malloc((size_t)n * sizeof *kv->hi_tok);
    kv->lo_tok = malloc((size_t)n * sizeof *kv->lo_tok);
    kv->prune_sec = malloc((size_t)(2 * n));
    kv->prune_idx = malloc((size_t)(2 * n) * sizeof *kv->prune_idx);
    kv->tgt_hi = malloc((size_t)regions * sizeof *kv->tgt_hi);
    kv->tgt_lo = malloc((size_t)regions * sizeof *kv->tgt_lo);
    kv->seq = malloc((size_t)g->max_seqs * sizeof *kv->seq);
    kv->dec = malloc((size_t)regions * sizeof *kv->dec);
    kv->stage = malloc((size_t)(regions * 2 * cfg->head_dim) * sizeof(float));
    kv->stage_score = malloc((size_t)regions * sizeof(float));
    kv->stage_pos = malloc((size_t)regions * sizeof(int32_t));
    kv->dec_regions = malloc((size_t)g->max_seqs * cfg->n_kv_heads * sizeof *kv->dec_regions);
    if (!kv->ws || !kv->scratch || !kv->tok || !kv->hi_tok || !kv->lo_tok || !kv->prune_sec ||
        !kv->prune_idx || !kv->tgt_hi || !kv->tgt_lo || !kv->seq || !kv->dec || !kv->stage ||
        !kv->stage_score || !kv->stage_pos || !kv->dec_regions) {
        cpu_destroy(base);
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the KV backend's buffers");
    }
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Token addressing                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* The page and slot of token k of a section (0 high, 1 low) of head-region r. */
static uint8_t *token_at(const mkv_cache_t *c, const cpu_kv_t *kv, int64_t r, int sec,
                         int32_t k, int32_t *slot)
{
    const int32_t tpp = sec ? kv->lay_lo.tokens : kv->lay_hi.tokens;
    const int32_t *row = mkv_mm_row(&c->st, r);
    const int32_t page = sec ? row[c->st.g.row_entries - 1 - k / tpp] : row[k / tpp];
    *slot = k % tpp;
    return c->pool + (int64_t)page * c->cfg.page_bytes; /* NOTE: widen before the multiply */
}

static const mkv_page_layout_t *lay_of(const cpu_kv_t *kv, int sec)
{
    return sec ? &kv->lay_lo : &kv->lay_hi;
}

/* Swap-remove token k of a section holding n tokens: the last token moves into the hole. */
static void section_remove(const mkv_cache_t *c, const cpu_kv_t *kv, int64_t r, int sec,
                           int32_t k, int32_t n)
{
    if (k == n - 1) return;
    int32_t ds, ss;
    uint8_t *dst = token_at(c, kv, r, sec, k, &ds);
    const uint8_t *src = token_at(c, kv, r, sec, n - 1, &ss);
    mkv_page_copy_token(dst, ds, src, ss, lay_of(kv, sec));
}

/* Dequantizes high token k of region r into staging entry i. */
static void stage_token(const mkv_cache_t *c, cpu_kv_t *kv, int64_t r, int32_t k, int64_t i)
{
    int32_t slot;
    const int64_t d = c->cfg.head_dim;
    const uint8_t *page = token_at(c, kv, r, 0, k, &slot);
    mkv_page_read_token(page, &kv->lay_hi, slot, kv->stage + i * 2 * d, kv->stage + i * 2 * d + d,
                        &kv->stage_score[i], &kv->stage_pos[i]);
}

/* Quantizes staging entry i afresh into low slot lo_k of region r: the demotion. */
static void unstage_token(const mkv_cache_t *c, cpu_kv_t *kv, int64_t r, int32_t lo_k, int64_t i)
{
    int32_t slot;
    const int64_t d = c->cfg.head_dim;
    uint8_t *page = token_at(c, kv, r, 1, lo_k, &slot);
    mkv_page_write_token(page, &kv->lay_lo, slot, kv->stage + i * 2 * d, kv->stage + i * 2 * d + d,
                         kv->stage_score[i], kv->stage_pos[i]);
}

/* Fills hi_tok / lo_tok with the region's tokens and their significance at length N. */
static void gather(const mkv_cache_t *c, cpu_kv_t *kv, int64_t r, int32_t N, int32_t plen)
{
    const int32_t n[2] = {c->st.n_hi[r], c->st.n_lo[r]};
    mkv_policy_token_t *out[2] = {kv->hi_tok, kv->lo_tok};
    for (int sec = 0; sec < 2; sec++) {
        for (int32_t k = 0; k < n[sec]; k++) {
            int32_t slot;
            const uint8_t *page = token_at(c, kv, r, sec, k, &slot);
            const int32_t pos = mkv_page_pos(page, lay_of(kv, sec), slot);
            const float sum = mkv_page_score(page, lay_of(kv, sec), slot);
            out[sec][k].pos = pos;
            out[sec][k].sig = sum / (float)mkv_observers(pos, plen, N, c->cfg.obs_window);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Prompt                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* A value as a K16V16 page stores it: sanitised (quant.h), then rounded to fp16. */
static float round_f16(float x)
{
    mkv_quant_sanitize(&x);
    return mkv_f16_to_f32(mkv_f32_to_f16(x));
}

static mkv_status_t ws_for(mkv_cache_t *c, cpu_kv_t *kv, int32_t slot, prompt_ws_t **out)
{
    prompt_ws_t *ws = &kv->ws[slot];
    if (ws->epoch == c->epoch[slot]) {
        *out = ws;
        return MKV_STATUS_OK;
    }
    ws_free(ws); /* a previous occupant's leftovers */
    const int64_t L = c->cfg.n_layers, H = c->cfg.n_kv_heads, d = c->cfg.head_dim;
    const int64_t n = c->prompt_len[slot];
    ws->k = malloc((size_t)(L * n * H * d) * sizeof(float));
    ws->v = malloc((size_t)(L * n * H * d) * sizeof(float));
    ws->sig = malloc((size_t)(L * H * n) * sizeof(float));
    ws->cls = malloc((size_t)(L * H * n));
    ws->done = calloc((size_t)L, 1);
    if (!ws->k || !ws->v || !ws->sig || !ws->cls || !ws->done) {
        ws_free(ws);
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY,
                        "cannot allocate %lld bytes of prompt working memory",
                        (long long)(2 * L * n * H * d * 4));
    }
    ws->n = (int32_t)n;
    ws->epoch = c->epoch[slot];
    *out = ws;
    return MKV_STATUS_OK;
}

/* Per-thread scratch of at least `floats` floats in total; grown once, never shrunk. */
static mkv_status_t par_scratch(mkv_cache_t *c, cpu_kv_t *kv, int64_t floats)
{
    if (kv->par_floats >= floats) return MKV_STATUS_OK;
    float *p = malloc((size_t)floats * sizeof(float));
    if (!p)
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate %lld bytes of attention scratch",
                        (long long)floats * 4);
    free(kv->par_scratch);
    kv->par_scratch = p;
    kv->par_floats = floats;
    return MKV_STATUS_OK;
}

/* f16 / bf16 elements as f32 (exact); f32 is used in place. */
static const float *as_f32(cpu_kv_t *kv, mkv_dtype_t dtype, const void *src, int64_t n, int64_t at)
{
    if (dtype == MKV_DTYPE_F32) return src;
    float *dst = kv->conv + at;
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = dtype == MKV_DTYPE_F16 ? mkv_f16_to_f32(h[i]) : mkv_bf16_to_f32(h[i]);
    return dst;
}

static void store_out(mkv_dtype_t dtype, const float *src, void *out, int64_t n)
{
    uint16_t *h = out;
    for (int64_t i = 0; i < n; i++)
        h[i] = dtype == MKV_DTYPE_F16 ? mkv_f32_to_f16(src[i]) : mkv_f32_to_bf16(src[i]);
}

/* Room in kv->conv for q, k, v and out of `rows` rows when dtype is not f32. */
static mkv_status_t conv_room(mkv_cache_t *c, cpu_kv_t *kv, mkv_dtype_t dtype, int64_t rows)
{
    if (dtype == MKV_DTYPE_F32) return MKV_STATUS_OK;
    const int64_t H = c->cfg.n_kv_heads, G = c->cfg.group_size, d = c->cfg.head_dim;
    const int64_t floats = rows * (2 * H * G * d + 2 * H * d);
    if (kv->conv_floats >= floats) return MKV_STATUS_OK;
    float *p = malloc((size_t)floats * sizeof(float));
    if (!p)
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate %lld bytes to convert %s tensors",
                        (long long)floats * 4, mkv_dtype_name(dtype));
    free(kv->conv);
    kv->conv = p;
    kv->conv_floats = floats;
    return MKV_STATUS_OK;
}

static mkv_status_t prefill_one(mkv_cache_t *cache, cpu_kv_t *kv, int32_t slot, int32_t layer,
                                const float *q, const float *k, const float *v, float *out)
{
    prompt_ws_t *ws = NULL;
    mkv_status_t st;
    const mkv_cache_config_t *cfg = &cache->cfg;
    if ((st = ws_for(cache, kv, slot, &ws)) != MKV_STATUS_OK) return st;
    const int64_t n = ws->n, H = cfg->n_kv_heads, d = cfg->head_dim;
    /* The cache's full precision is fp16 (K16V16): the prompt attends over the values a
     * K16V16 page would hold, so prefill and decode see the same keys and values. */
    float *kw = ws->k + layer * n * H * d, *vw = ws->v + layer * n * H * d;
    for (int64_t i = 0; i < n * H * d; i++) {
        kw[i] = round_f16(k[i]);
        vw[i] = round_f16(v[i]);
    }
    const int32_t parts = cache->par_parts;
    if ((st = par_scratch(cache, kv, mkv_attn_prefill_blocked_scratch(ws->n, cfg->n_kv_heads,
                                                                       cfg->group_size,
                                                                       cfg->head_dim, parts))) !=
        MKV_STATUS_OK)
        return st;
    mkv_attn_prefill_blocked(ws->n, cfg->n_kv_heads, cfg->group_size, cfg->head_dim, q, kw, vw,
                             cfg->softmax_scale, cfg->obs_window, out, ws->sig + layer * H * n,
                             kv->par_scratch, parts, cache->par_run, cache->par_runner);
    ws->done[layer] = 1;
    return MKV_STATUS_OK;
}

/* Each slot's prompt_len rows follow the previous slot's. */
static mkv_status_t cpu_prefill(mkv_cache_t *cache, mkv_kv_t *base, int32_t n_slots,
                                const int32_t *slots, int32_t layer, mkv_dtype_t dtype,
                                const void *q, const void *k, const void *v, void *out,
                                void *stream)
{
    (void)stream;
    cpu_kv_t *kv = base->impl;
    const mkv_cache_config_t *cfg = &cache->cfg;
    const int64_t H = cfg->n_kv_heads, G = cfg->group_size, d = cfg->head_dim;
    const size_t es = mkv_dtype_size(dtype);
    int64_t row = 0;
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j];
        const int64_t n = cache->prompt_len[s];
        mkv_status_t st = conv_room(cache, kv, dtype, n);
        if (st != MKV_STATUS_OK) return st;
        const int64_t nq = n * H * G * d, nkv = n * H * d;
        const float *qf = as_f32(kv, dtype, (const char *)q + row * H * G * d * es, nq, 0);
        const float *kf = as_f32(kv, dtype, (const char *)k + row * H * d * es, nkv, nq);
        const float *vf = as_f32(kv, dtype, (const char *)v + row * H * d * es, nkv, nq + nkv);
        char *o = (char *)out + row * H * G * d * es;
        float *of = dtype == MKV_DTYPE_F32 ? (float *)o : kv->conv + nq + 2 * nkv;
        if ((st = prefill_one(cache, kv, s, layer, qf, kf, vf, of)) != MKV_STATUS_OK) return st;
        if (dtype != MKV_DTYPE_F32) store_out(dtype, of, o, nq);
        row += n;
    }
    return MKV_STATUS_OK;
}

/* Classes of one head-region's prompt tokens: DiffKV's rule, then the budget. */
static void classify_region(mkv_cache_t *c, cpu_kv_t *kv, const prompt_ws_t *ws, int32_t slot,
                            int64_t lh, int32_t *n_hi, int32_t *n_lo)
{
    const int32_t n = ws->n;
    const mkv_cache_config_t *cfg = &c->cfg;
    const float *sum = ws->sig + lh * n;
    uint8_t *cls = ws->cls + lh * n;
    float *sig = kv->scratch;
    for (int32_t i = 0; i < n; i++) sig[i] = sum[i] / (float)mkv_observers(i, n, n, cfg->obs_window);
    if (cfg->mix_high > 0.0f || cfg->mix_low > 0.0f) /* hi_tok: scratch until filled below */
        mkv_policy_classify_prompt_mix(sig, n, cfg->mix_high, cfg->mix_low, cfg->window, cls, kv->hi_tok);
    else
        mkv_policy_classify_prompt(sig, n, cfg->alpha_h, cfg->alpha_l, cfg->window, cls);
    int32_t nh = 0, nl = 0;
    for (int32_t i = 0; i < n; i++) {
        if (cls[i] == MKV_CLASS_HIGH) kv->hi_tok[nh++] = (mkv_policy_token_t){sig[i], i};
        else if (cls[i] == MKV_CLASS_LOW) kv->lo_tok[nl++] = (mkv_policy_token_t){sig[i], i};
    }
    const int32_t budget = mkv_kv_budget(c, c->kv, slot);
    if (budget > 0 && nh + nl > budget) {
        const int32_t np = mkv_policy_budget(kv->hi_tok, nh, kv->lo_tok, nl, n, cfg->window,
                                             budget, kv->prune_sec, kv->prune_idx);
        for (int32_t p = 0; p < np; p++) {
            const mkv_policy_token_t *t = kv->prune_sec[p] ? &kv->lo_tok[kv->prune_idx[p]]
                                                           : &kv->hi_tok[kv->prune_idx[p]];
            cls[t->pos] = MKV_CLASS_PRUNE;
            if (kv->prune_sec[p]) nl--;
            else nh--;
        }
    }
    *n_hi = nh;
    *n_lo = nl;
}

static mkv_status_t cpu_commit(mkv_cache_t *cache, mkv_kv_t *base, int32_t n_slots,
                               const int32_t *slots, void *stream)
{
    cpu_kv_t *kv = base->impl;
    mkv_status_t st;
    const mkv_cache_config_t *cfg = &cache->cfg;
    const int64_t L = cfg->n_layers, H = cfg->n_kv_heads, d = cfg->head_dim;
    /* Classify (reading only), then one resize for every slot, layer and head. */
    for (int32_t j = 0; j < n_slots; j++) {
        const prompt_ws_t *ws = &kv->ws[slots[j]];
        kv->seq[j] = ws->n;
        for (int64_t lh = 0; lh < L * H; lh++)
            classify_region(cache, kv, ws, slots[j], lh, &kv->tgt_hi[j * L * H + lh],
                            &kv->tgt_lo[j * L * H + lh]);
    }
    const mkv_resize_t rz = {n_slots, slots, kv->seq, kv->tgt_hi, kv->tgt_lo};
    if ((st = mkv_cache_resize(cache, &rz, stream)) != MKV_STATUS_OK) return st;

    /* Quantize each kept token into its section, in position order. */
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j];
        prompt_ws_t *ws = &kv->ws[s];
        const int64_t n = ws->n;
        for (int64_t l = 0; l < L; l++) {
            for (int64_t h = 0; h < H; h++) {
                const int64_t r = mkv_mm_region(&cache->st.g, s, (int32_t)l, (int32_t)h);
                const uint8_t *cls = ws->cls + (l * H + h) * n;
                const float *sum = ws->sig + (l * H + h) * n;
                int32_t next[2] = {0, 0};
                for (int64_t i = 0; i < n; i++) {
                    if (cls[i] == MKV_CLASS_PRUNE) continue;
                    const int sec = cls[i] == MKV_CLASS_LOW;
                    int32_t slot_in_page;
                    uint8_t *page = token_at(cache, kv, r, sec, next[sec]++, &slot_in_page);
                    const float *kp = ws->k + ((l * n + i) * H + h) * d;
                    const float *vp = ws->v + ((l * n + i) * H + h) * d;
                    mkv_page_write_token(page, lay_of(kv, sec), slot_in_page, kp, vp, sum[i],
                                         (int32_t)i);
                }
            }
        }
        ws_free(ws);
    }
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Decode                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t cpu_decode(mkv_cache_t *cache, mkv_kv_t *base, int32_t n_slots,
                               const int32_t *slots, int32_t layer, mkv_dtype_t dtype,
                               const void *q_in, const void *k_in, const void *v_in, void *out_in,
                               void *stream)
{
    (void)stream;
    cpu_kv_t *kv = base->impl;
    const mkv_cache_config_t *cfg = &cache->cfg;
    const int64_t H = cfg->n_kv_heads, G = cfg->group_size, d = cfg->head_dim;
    mkv_status_t st = conv_room(cache, kv, dtype, n_slots);
    if (st != MKV_STATUS_OK) return st;
    const int64_t nq = n_slots * H * G * d, nkv = n_slots * H * d;
    const float *q = as_f32(kv, dtype, q_in, nq, 0);
    const float *k = as_f32(kv, dtype, k_in, nkv, nq);
    const float *v = as_f32(kv, dtype, v_in, nkv, nq + nkv);
    float *out = dtype == MKV_DTYPE_F32 ? out_in : kv->conv + nq + 2 * nkv;
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j], N = cache->st.seq_len[s];
        for (int64_t h = 0; h < H; h++) {
            const int64_t r = mkv_mm_region(&cache->st.g, s, layer, (int32_t)h);
            int32_t slot_in_page;
            uint8_t *page = token_at(cache, kv, r, 0, cache->st.n_hi[r] - 1, &slot_in_page);
            for (int64_t e = 0; e < d; e++) {
                kv->tok[e] = round_f16(k[(j * H + h) * d + e]);
                kv->tok[d + e] = round_f16(v[(j * H + h) * d + e]);
            }
            mkv_page_write_token(page, &kv->lay_hi, slot_in_page, kv->tok, kv->tok + d, 0.0f, N - 1);
        }
    }
    /* Then attention over every head-region at once, split across the engine's threads. */
    mkv_region_pages_t *rp = kv->dec_regions;
    for (int32_t j = 0; j < n_slots; j++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t r = mkv_mm_region(&cache->st.g, slots[j], layer, (int32_t)h);
            rp[j * H + h] = (mkv_region_pages_t){cache->pool, cfg->page_bytes, &kv->lay_hi,
                                                 &kv->lay_lo, mkv_mm_row(&cache->st, r),
                                                 cache->st.g.row_entries, cache->st.n_hi[r],
                                                 cache->st.n_lo[r]};
        }
    const int32_t R = (int32_t)(n_slots * H), parts = cache->par_parts;
    if ((st = par_scratch(cache, kv, mkv_attn_decode_batch_scratch(rp, R, (int32_t)G, (int32_t)d,
                                                                   parts))) != MKV_STATUS_OK)
        return st;
    mkv_attn_decode_batch(rp, R, (int32_t)G, (int32_t)d, q, cfg->softmax_scale, out,
                          kv->par_scratch, parts, cache->par_run, cache->par_runner);
    if (dtype != MKV_DTYPE_F32) store_out(dtype, out, out_in, nq);
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Compress                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static int grows_low(mkv_policy_action_t a)
{
    return a == MKV_ACT_DEMOTE_VICTIM || a == MKV_ACT_DEMOTE_CAND;
}

/* The index of the high token that leaves the high section, or -1. */
static int32_t leaving_high(const mkv_policy_decision_t *d)
{
    switch (d->action) {
    case MKV_ACT_DEMOTE_VICTIM:
    case MKV_ACT_PRUNE_VICTIM: return d->victim;
    case MKV_ACT_DEMOTE_CAND:
    case MKV_ACT_DEMOTE_CAND_PRUNE_LOW:
    case MKV_ACT_PRUNE_CAND: return d->cand;
    default: return -1;
    }
}

/* Targets n_hi + 0 and n_lo + (grows ? 1 : 0), or the current counts, for every region. */
static mkv_status_t resize_to_targets(mkv_cache_t *c, cpu_kv_t *kv, int32_t n_slots,
                                      const int32_t *slots, void *stream)
{
    const mkv_resize_t rz = {n_slots, slots, NULL, kv->tgt_hi, kv->tgt_lo};
    return mkv_cache_resize(c, &rz, stream);
}

/* The budget pass: prunes the lowest-significance tokens outside the window of every
 * head-region above its slot's budget, then shrinks. Only recycles: cannot run out. */
static mkv_status_t apply_budgets(mkv_cache_t *c, cpu_kv_t *kv, int32_t n_slots,
                                  const int32_t *slots, void *stream)
{
    const mkv_cache_config_t *cfg = &c->cfg;
    const int64_t LH = (int64_t)cfg->n_layers * cfg->n_kv_heads;
    int any = 0;
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j], N = c->st.seq_len[s];
        for (int64_t lh = 0; lh < LH; lh++) {
            const int64_t r = (int64_t)s * LH + lh, i = j * LH + lh;
            int32_t nh = c->st.n_hi[r], nl = c->st.n_lo[r];
            kv->tgt_hi[i] = nh;
            kv->tgt_lo[i] = nl;
            const int32_t budget = mkv_kv_budget(c, c->kv, s);
            if (budget <= 0 || nh + nl <= budget) continue;
            gather(c, kv, r, N, c->prompt_len[s]);
            int32_t np = mkv_policy_budget(kv->hi_tok, nh, kv->lo_tok, nl, N, cfg->window,
                                           budget, kv->prune_sec, kv->prune_idx);
            /* Remove in descending index order per section: each swap-remove then moves a
             * token that is not itself marked. */
            for (int sec = 0; sec < 2; sec++) {
                for (;;) {
                    int32_t best = -1, at = -1;
                    for (int32_t p = 0; p < np; p++)
                        if (kv->prune_sec[p] == sec && kv->prune_idx[p] > best) {
                            best = kv->prune_idx[p];
                            at = p;
                        }
                    if (at < 0) break;
                    kv->prune_idx[at] = -1;
                    section_remove(c, kv, r, sec, best, sec ? nl : nh);
                    if (sec) nl--;
                    else nh--;
                }
            }
            kv->tgt_hi[i] = nh;
            kv->tgt_lo[i] = nl;
            any = 1;
        }
    }
    return any ? resize_to_targets(c, kv, n_slots, slots, stream) : MKV_STATUS_OK;
}

static mkv_status_t cpu_compress(mkv_cache_t *cache, mkv_kv_t *base, int32_t n_slots,
                                 const int32_t *slots, void *stream)
{
    cpu_kv_t *kv = base->impl;
    mkv_status_t st;
    const mkv_cache_config_t *cfg = &cache->cfg;
    const int64_t L = cfg->n_layers, LH = L * cfg->n_kv_heads;
    int budgets = 0;
    for (int32_t j = 0; j < n_slots; j++) budgets |= mkv_kv_budget(cache, base, slots[j]) > 0;
    /* With both thresholds 0 every significance passes: Algorithm 1 keeps everything. */
    const int mix = cfg->mix_high > 0.0f || cfg->mix_low > 0.0f;
    if (!mix && cfg->alpha_h == 0.0f && cfg->alpha_l == 0.0f && !budgets) return MKV_STATUS_OK;

    /* 1. Decide every head-region, reading only; the final section sizes. */
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j], N = cache->st.seq_len[s];
        for (int64_t lh = 0; lh < LH; lh++) {
            const int64_t r = (int64_t)s * LH + lh, i = j * LH + lh;
            gather(cache, kv, r, N, cache->prompt_len[s]);
            const mkv_policy_decision_t dd =
                mix ? mkv_policy_decide_mix(kv->hi_tok, cache->st.n_hi[r], kv->lo_tok, cache->st.n_lo[r], N,
                                            cfg->mix_high, cfg->mix_low, cfg->window)
                    : mkv_policy_decide(kv->hi_tok, cache->st.n_hi[r], kv->lo_tok, cache->st.n_lo[r], N,
                                        cfg->alpha_h, cfg->alpha_l, cfg->window);
            if (dd.cand == -2)
                return mkv_fail(cache->err, MKV_STATUS_INTERNAL,
                                "slot %d: no high token at the window's edge (position %d)", s,
                                N - 1 - cfg->window);
            kv->dec[i] = dd;
            kv->tgt_hi[i] = cache->st.n_hi[r] - (leaving_high(&dd) >= 0);
            kv->tgt_lo[i] = cache->st.n_lo[r] + grows_low(dd.action);
        }
    }
    /* 2. Check: the page movement must fit before any token moves. */
    const mkv_resize_t rz = {n_slots, slots, NULL, kv->tgt_hi, kv->tgt_lo};
    if ((st = mkv_cache_resize_check(cache, &rz)) != MKV_STATUS_OK) return st;

    /* 3. Act: stage and swap-remove the leaving high tokens (their pages are all still held). */
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j];
        for (int64_t lh = 0; lh < LH; lh++) {
            const int64_t r = (int64_t)s * LH + lh, i = j * LH + lh;
            const mkv_policy_decision_t *dd = &kv->dec[i];
            const int32_t leaving = leaving_high(dd);
            if (leaving < 0) continue;
            if (dd->action != MKV_ACT_PRUNE_VICTIM && dd->action != MKV_ACT_PRUNE_CAND)
                stage_token(cache, kv, r, leaving, i);
            section_remove(cache, kv, r, 0, leaving, cache->st.n_hi[r]);
            /* The pruned low victim's slot takes the demoted candidate: no low growth. */
            if (dd->action == MKV_ACT_DEMOTE_CAND_PRUNE_LOW) unstage_token(cache, kv, r, dd->victim, i);
        }
    }
    /* 4. One resize: emptied high pages recycled, new low pages allocated. */
    if ((st = mkv_cache_resize(cache, &rz, stream)) != MKV_STATUS_OK) {
        char why[MKV_ERR_LEN];
        memcpy(why, cache->err, sizeof why);
        return mkv_fail(cache->err, MKV_STATUS_INTERNAL, "resize after its check failed: %s", why);
    }
    /* 5. The demoted tokens, quantized afresh into their new low slots. */
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j];
        for (int64_t lh = 0; lh < LH; lh++) {
            const int64_t r = (int64_t)s * LH + lh, i = j * LH + lh;
            if (grows_low(kv->dec[i].action)) unstage_token(cache, kv, r, cache->st.n_lo[r] - 1, i);
        }
    }
    if (budgets && (st = apply_budgets(cache, kv, n_slots, slots, stream)) != MKV_STATUS_OK) return st;
    return MKV_STATUS_OK;
}

const mkv_kv_ops_t mkv_kv_cpu_ops = {"cpu", cpu_create, cpu_destroy, cpu_prefill, cpu_commit,
                                     cpu_decode, cpu_compress, NULL};
