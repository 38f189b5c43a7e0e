/*
 * decode_cpu.c — decode attention over a batch of head-regions for the CPU backend's threads:
 * mkv_attn_decode_region's results (outputs and score updates) bit for bit, split into
 * independent items so that two cores share even a single sequence's three head-regions.
 *
 * The reference's operation order leaves room for vectors and threads without changing one
 * rounding:
 *   - each logit is its own sequential dot product over e: 16 tokens run side by side, one per
 *     vector lane (keys dequantized into a transposed [d][16] tile), items of 256 tokens;
 *   - the maximum is exact whatever the grouping (the first of equal values is kept, as the
 *     reference's scan does), and each exp is independent: items of 256 tokens again;
 *   - the normalising sum runs over t in order, one item per head-region (cheap: G chains);
 *   - each output element is a sequential sum over t: 16 elements side by side, one item per
 *     (head-region, 16-element slice of d); the score of a token (max over g of its
 *     probability, added to the stored score) is independent: items of 256 tokens.
 * Dequantization gives mkv_quant_read_vector's values (code * scale + zero: an exact product,
 * one rounding; fp16 converted exactly), 16 elements at a time: head_dim is a multiple of 16
 * and so is every group, so a 16-element slice lies in one quantization group.
 */
#include "attention/attention.h"

#include "quant/half.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "decode_cpu.c reads packed codes as little-endian words"
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__clang__)
#define MKV_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define MKV_CLONES
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint8_t v16b __attribute__((vector_size(16)));
typedef uint16_t v16h __attribute__((vector_size(32)));

#define LANES 16
#define BLOCK 256 /* tokens per logits, exp and score item */
#define G_TILE 8  /* query heads accumulated together in a value slice */
#define MAX_D 256 /* quant/format.c accepts d up to 256 */

/* ---- Reading 16 elements of a stored vector --------------------------------------------- */

/* (Vectors go through pointers: passing them by value outside the AVX-512 clone would change
 * the calling convention, which GCC warns about.) */
static inline void f16x16_to_f32(const v16u *hp, v16f *out)
{
    const v16u h = *hp;
    const v16u sign = (h & 0x8000u) << 16;
    const v16u em = h & 0x7fffu;
    /* Normal and subnormal halves: the bits shifted into a float's place are the value times
     * 2^-112, exactly (a subnormal half becomes a float subnormal of the same digits). */
    const v16f mag = (v16f)(em << 13) * 0x1p112f;
    const v16u special = (v16u)(em >= 0x7c00u); /* inf, NaN: all ones where true */
    const v16u bits = ((v16u)mag & ~special) | ((0x7f800000u | ((em & 0x3ffu) << 13)) & special);
    *out = (v16f)(bits | sign);
}

static inline uint32_t le32(const uint8_t *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

/* Elements [e0, e0 + 16) of the key (which = 0) or value (which = 1) in slot of page. */
static inline void read16(const uint8_t *page, const mkv_page_layout_t *lay, int which,
                          int32_t slot, int32_t e0, v16f *out)
{
    const mkv_vec_layout_t *v = which ? &lay->value : &lay->key;
    if (v->bits == 16) { /* two 8-element chunks */
        v16h h;
        memcpy(&h, page + mkv_code_offset(lay, which, slot, e0 / 8), 16);
        memcpy((uint8_t *)&h + 16, page + mkv_code_offset(lay, which, slot, e0 / 8 + 1), 16);
        const v16u w = __builtin_convertvector(h, v16u);
        f16x16_to_f32(&w, out);
        return;
    }
    const uint8_t *c = page + mkv_code_offset(lay, which, slot, e0 / v->chunk_elems) +
                       (e0 % v->chunk_elems) * v->bits / 8;
    v16u q;
    if (v->bits == 8) {
        v16b b;
        memcpy(&b, c, sizeof b);
        q = __builtin_convertvector(b, v16u);
    } else if (v->bits == 4) {
        const uint32_t lo = le32(c), hi = le32(c + 4);
        const v16u w = {lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi};
        const v16u sh = {0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28};
        q = (w >> sh) & 0xfu;
    } else {
        const uint32_t x = le32(c);
        const v16u w = {x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
        const v16u sh = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
        q = (w >> sh) & 0x3u;
    }
    const uint8_t *m = page + mkv_meta_offset(lay, which, slot, e0 / v->group_elems);
    const float scale = mkv_f16_to_f32((uint16_t)(m[0] | m[1] << 8));
    const float zero = mkv_f16_to_f32((uint16_t)(m[2] | m[3] << 8));
    *out = __builtin_convertvector(q, v16f) * scale + zero;
}

/* In-place transpose of a 16 x 16 tile of floats: four rounds of interleaving rows i and
 * i + 8 (the perfect shuffle) turn row i into column i. */
static inline void transpose16(v16f *r)
{
    v16f o[LANES];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 8; i++) {
            o[2 * i] = __builtin_shufflevector(r[i], r[i + 8], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20,
                                               5, 21, 6, 22, 7, 23);
            o[2 * i + 1] = __builtin_shufflevector(r[i], r[i + 8], 8, 24, 9, 25, 10, 26, 11, 27,
                                                   12, 28, 13, 29, 14, 30, 15, 31);
        }
        memcpy(r, o, sizeof o);
    }
}

/* ---- Walking a region's tokens page by page --------------------------------------------- */

/* The run of tokens from section-order index t that share t's page and section, capped at
 * `end`: page, layout, first slot and length. */
typedef struct run {
    const uint8_t *page;
    const mkv_page_layout_t *lay;
    int32_t slot, len;
} run_t;

static run_t run_at(const mkv_region_pages_t *r, int32_t t, int32_t end)
{
    run_t u;
    int32_t entry, left;
    if (t < r->n_hi) {
        u.lay = r->lay_hi;
        entry = t / u.lay->tokens;
        u.slot = t % u.lay->tokens;
        left = r->n_hi - t;
    } else {
        u.lay = r->lay_lo;
        entry = r->row_entries - 1 - (t - r->n_hi) / u.lay->tokens;
        u.slot = (t - r->n_hi) % u.lay->tokens;
        left = r->n_hi + r->n_lo - t;
    }
    assert(entry >= 0 && entry < r->row_entries && r->row[entry] >= 0);
    u.page = r->pool + (int64_t)r->row[entry] * r->page_bytes;
    u.len = u.lay->tokens - u.slot;
    if (u.len > left) u.len = left;
    if (u.len > end - t) u.len = end - t;
    return u;
}

/* ---- The batch ---------------------------------------------------------------------------- */

typedef struct dc_ctx {
    const mkv_region_pages_t *r;
    int32_t R, G, d;
    const float *q;
    float scale;
    float *out;
    const int64_t *p_at;   /* [R] offset of region i's probabilities [G][n_i] */
    const int64_t *blocks; /* [R + 1] prefix counts of 256-token blocks */
    const int64_t *items;  /* [R + 1] prefix counts of value-and-score items */
    float *p, *bmax;       /* bmax: [blocks][G], each block's maxima */
} dc_ctx_t;

static int32_t n_of(const mkv_region_pages_t *r) { return r->n_hi + r->n_lo; }

/* The region an item belongs to, given prefix counts (binary search). */
static int32_t region_of(const int64_t *prefix, int32_t R, int64_t it)
{
    int32_t lo = 0, hi = R - 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (prefix[mid] <= it) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Logits of block b of region i: p[g][t] = scale * (q[g] . k_t), and the block's maxima. */
MKV_CLONES static void logits_block(const dc_ctx_t *c, int32_t i, int32_t b)
{
    v16f k[MAX_D]; /* k[e]: element e of 16 tokens, one per lane */
    const mkv_region_pages_t *r = &c->r[i];
    const int32_t n = n_of(r), G = c->G, d = c->d;
    const int32_t t0 = b * BLOCK, t1 = t0 + BLOCK < n ? t0 + BLOCK : n;
    const float *q = c->q + (int64_t)i * G * d;
    float *p = c->p + c->p_at[i];
    float *bm = c->bmax + (c->blocks[i] + b) * G;
    for (int32_t t = t0; t < t1;) {
        const run_t u = run_at(r, t, t1);
        for (int32_t s0 = 0; s0 < u.len; s0 += LANES) {
            const int32_t m = u.len - s0 < LANES ? u.len - s0 : LANES;
            for (int32_t e0 = 0; e0 < d; e0 += LANES) {
                v16f *tile = k + e0;
                for (int32_t l = 0; l < m; l++) read16(u.page, u.lay, 0, u.slot + s0 + l, e0, &tile[l]);
                for (int32_t l = m; l < LANES; l++) tile[l] = (v16f){0};
                transpose16(tile);
            }
            for (int32_t g0 = 0; g0 < G; g0 += G_TILE) {
                const int32_t gn = G - g0 < G_TILE ? G - g0 : G_TILE;
                v16f acc[G_TILE];
                for (int32_t g = 0; g < G_TILE; g++) acc[g] = (v16f){0};
                for (int32_t e = 0; e < d; e++)
                    for (int32_t g = 0; g < gn; g++) acc[g] += q[(int64_t)(g0 + g) * d + e] * k[e];
                for (int32_t g = g0; g < g0 + gn; g++) {
                    const v16f lg = c->scale * acc[g - g0];
                    float *pg = p + (int64_t)g * n + t + s0;
                    for (int32_t l = 0; l < m; l++) {
                        pg[l] = lg[l];
                        if (t + s0 + l == t0 || lg[l] > bm[g]) bm[g] = lg[l];
                    }
                }
            }
        }
        t += u.len;
    }
}

static void logits_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    const dc_ctx_t *c = ctx;
    (void)part;
    for (int64_t it = b; it < e; it++) {
        const int32_t i = region_of(c->blocks, c->R, it);
        logits_block(c, i, (int32_t)(it - c->blocks[i]));
    }
}

/* Block b of region i: p = exp(p - max), the maximum over all of the region's blocks. */
static void exp_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    (void)part;
    const dc_ctx_t *c = ctx;
    for (int64_t it = b; it < e; it++) {
        const int32_t i = region_of(c->blocks, c->R, it), blk = (int32_t)(it - c->blocks[i]);
        const int32_t n = n_of(&c->r[i]), t0 = blk * BLOCK, t1 = t0 + BLOCK < n ? t0 + BLOCK : n;
        const int64_t nb = c->blocks[i + 1] - c->blocks[i];
        const float *bm = c->bmax + c->blocks[i] * c->G;
        for (int32_t g = 0; g < c->G; g++) {
            float m = bm[g];
            for (int64_t k = 1; k < nb; k++) m = bm[k * c->G + g] > m ? bm[k * c->G + g] : m;
            float *pg = c->p + c->p_at[i] + (int64_t)g * n;
            for (int32_t t = t0; t < t1; t++) pg[t] = expf(pg[t] - m);
        }
    }
}

/* Region i: the sum over t in order, then p /= sum. */
static void norm_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    (void)part;
    const dc_ctx_t *c = ctx;
    for (int64_t i = b; i < e; i++) {
        const int32_t n = n_of(&c->r[i]);
        for (int32_t g = 0; g < c->G; g++) {
            float *pg = c->p + c->p_at[i] + (int64_t)g * n;
            float sum = 0.0f;
            for (int32_t t = 0; t < n; t++) sum += pg[t];
            for (int32_t t = 0; t < n; t++) pg[t] /= sum; /* sum >= 1: the max term is exp(0) */
        }
    }
}

/* Elements [e0, e0 + 16) of region i's outputs: out[g] = sum over t of p[g][t] * v_t. */
MKV_CLONES static void values_slice(const dc_ctx_t *c, int32_t i, int32_t e0)
{
    const mkv_region_pages_t *r = &c->r[i];
    const int32_t n = n_of(r), G = c->G, d = c->d;
    const float *p = c->p + c->p_at[i];
    for (int32_t g0 = 0; g0 < G; g0 += G_TILE) {
        const int32_t gn = G - g0 < G_TILE ? G - g0 : G_TILE;
        v16f acc[G_TILE];
        for (int32_t g = 0; g < G_TILE; g++) acc[g] = (v16f){0};
        for (int32_t t = 0; t < n;) {
            const run_t u = run_at(r, t, n);
            for (int32_t s = 0; s < u.len; s++) {
                v16f x;
                read16(u.page, u.lay, 1, u.slot + s, e0, &x);
                for (int32_t g = 0; g < gn; g++) acc[g] += p[(int64_t)(g0 + g) * n + t + s] * x;
            }
            t += u.len;
        }
        for (int32_t g = 0; g < gn; g++)
            memcpy(c->out + ((int64_t)i * G + g0 + g) * d + e0, &acc[g], sizeof(v16f));
    }
}

/* Block b of region i: each token's score += max over g of its probability. */
static void scores_block(const dc_ctx_t *c, int32_t i, int32_t b)
{
    const mkv_region_pages_t *r = &c->r[i];
    const int32_t n = n_of(r), t0 = b * BLOCK, t1 = t0 + BLOCK < n ? t0 + BLOCK : n;
    const float *p = c->p + c->p_at[i];
    for (int32_t t = t0; t < t1;) {
        const run_t u = run_at(r, t, t1);
        uint8_t *page = (uint8_t *)u.page;
        for (int32_t s = 0; s < u.len; s++) {
            float pmax = 0.0f;
            for (int32_t g = 0; g < c->G; g++) {
                const float pt = p[(int64_t)g * n + t + s];
                pmax = pt > pmax ? pt : pmax;
            }
            float sc;
            memcpy(&sc, page + mkv_score_offset(u.lay, u.slot + s), sizeof sc);
            sc += pmax;
            memcpy(page + mkv_score_offset(u.lay, u.slot + s), &sc, sizeof sc);
        }
        t += u.len;
    }
}

/* Items of region i: its d / 16 value slices, then its score blocks. */
static void values_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    (void)part;
    const dc_ctx_t *c = ctx;
    const int64_t slices = c->d / LANES;
    for (int64_t it = b; it < e; it++) {
        const int32_t i = region_of(c->items, c->R, it);
        const int64_t k = it - c->items[i];
        if (k < slices) values_slice(c, i, (int32_t)k * LANES);
        else scores_block(c, i, (int32_t)(k - slices));
    }
}

static int64_t blocks_of(int32_t n) { return (n + BLOCK - 1) / BLOCK; }

int64_t mkv_attn_decode_batch_scratch(const mkv_region_pages_t *r, int32_t R, int32_t G,
                                      int32_t d, int32_t parts)
{
    int64_t p = 0, blocks = 0;
    for (int32_t i = 0; i < R; i++) {
        p += (int64_t)G * n_of(&r[i]);
        blocks += blocks_of(n_of(&r[i]));
    }
    const int64_t index = 2 * (3 * (int64_t)R + 2); /* three int64 arrays, in floats */
    (void)parts; /* no per-thread scratch: the key tile lives on the stack */
    return index + p + blocks * G;
}

void mkv_attn_decode_batch(const mkv_region_pages_t *r, int32_t R, int32_t G, int32_t d,
                           const float *q, float softmax_scale, float *out, float *scratch,
                           int32_t parts, mkv_attn_run_fn run, void *runner)
{
    assert(R >= 0 && G >= 1 && d >= LANES && d % LANES == 0 && d <= MAX_D);
    if (R <= 0) return;
    if (parts < 1 || !run) parts = 1;
    /* Index arrays first (int64, 8-byte aligned as scratch is), then the floats. */
    int64_t *p_at = (int64_t *)(void *)scratch, *blocks = p_at + R, *items = blocks + R + 1;
    int64_t pf = 0;
    blocks[0] = items[0] = 0;
    for (int32_t i = 0; i < R; i++) {
        const int32_t n = n_of(&r[i]);
        p_at[i] = pf;
        pf += (int64_t)G * n;
        blocks[i + 1] = blocks[i] + blocks_of(n);
        /* An empty region gets no items: the reference leaves its out untouched. */
        items[i + 1] = items[i] + (n > 0 ? d / LANES + blocks_of(n) : 0);
    }
    float *fl = scratch + 2 * (3 * (int64_t)R + 2);
    dc_ctx_t c = {.r = r, .R = R, .G = G, .d = d, .q = q, .scale = softmax_scale, .out = out,
                  .p_at = p_at, .blocks = blocks, .items = items, .p = fl};
    c.bmax = c.p + pf;
    if (run) {
        run(runner, logits_range, &c, blocks[R]);
        run(runner, exp_range, &c, blocks[R]);
        run(runner, norm_range, &c, R);
        run(runner, values_range, &c, items[R]);
    } else {
        logits_range(&c, 0, blocks[R], 0);
        exp_range(&c, 0, blocks[R], 0);
        norm_range(&c, 0, R, 0);
        values_range(&c, 0, items[R], 0);
    }
}
