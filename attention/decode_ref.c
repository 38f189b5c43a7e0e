/*
 * decode_ref.c — reference decode attention over one head-region's mixed-precision pages (the
 * CPU backend; the fused CUDA decode kernel must match it). See attention.h for the contract.
 *
 * Two passes over the region's tokens, in section order (high section, then low):
 *   1. dequantize each key once and compute the logits of all G query heads into scratch;
 *      then a max-subtracted softmax per query head, in place;
 *   2. dequantize each value once, accumulate out[g] += p[g][t] * v, and add max over g of
 *      p[g][t] to the token's running score (DiffKV's GQA significance, DESIGN.md section 5).
 * Everything is fp32, as the kernel computes it; nothing is allocated.
 */
#include "attention/attention.h"

#include "quant/quant.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* The page and slot of token k (section order) of the region. High token k lives in row entry
 * k / tpp_hi; the low section grows from the right end of the row, so low token k lives in
 * entry T - 1 - k / tpp_lo. */
static uint8_t *token_page(const mkv_region_pages_t *r, int32_t k, const mkv_page_layout_t **lay,
                           int32_t *slot)
{
    int32_t entry;
    if (k < r->n_hi) {
        *lay = r->lay_hi;
        entry = k / r->lay_hi->tokens;
        *slot = k % r->lay_hi->tokens;
    } else {
        k -= r->n_hi;
        *lay = r->lay_lo;
        entry = r->row_entries - 1 - k / r->lay_lo->tokens;
        *slot = k % r->lay_lo->tokens;
    }
    assert(entry >= 0 && entry < r->row_entries);
    const int32_t page = r->row[entry];
    assert(page >= 0);
    // NOTE: int32 page id, widen before the multiply (pools exceed 2 GiB).
    return r->pool + (int64_t)page * r->page_bytes;
}

void mkv_attn_decode_region(const mkv_region_pages_t *r, int32_t G, int32_t d, const float *q,
                            float softmax_scale, float *out, float *scratch)
{
    const int32_t n = r->n_hi + r->n_lo;
    if (n <= 0) return;
    assert(G >= 1 && d >= 1);
    assert(r->n_hi == 0 || r->lay_hi->head_dim == d);
    assert(r->n_lo == 0 || r->lay_lo->head_dim == d);

    float *p = scratch;                     /* [G][n] logits, then probabilities */
    float *kbuf = scratch + (int64_t)G * n; /* [d] */
    float *vbuf = kbuf + d;                 /* [d] */

    for (int32_t t = 0; t < n; t++) {
        const mkv_page_layout_t *lay;
        int32_t slot;
        const uint8_t *page = token_page(r, t, &lay, &slot);
        mkv_quant_read_vector(page, lay, 0, slot, kbuf);
        for (int32_t g = 0; g < G; g++) {
            const float *qg = q + (int64_t)g * d;
            float dot = 0.0f;
            for (int32_t e = 0; e < d; e++) dot += qg[e] * kbuf[e];
            p[(int64_t)g * n + t] = softmax_scale * dot;
        }
    }

    for (int32_t g = 0; g < G; g++) {
        float *pg = p + (int64_t)g * n;
        float m = pg[0];
        for (int32_t t = 1; t < n; t++) m = pg[t] > m ? pg[t] : m;
        float sum = 0.0f;
        for (int32_t t = 0; t < n; t++) {
            pg[t] = expf(pg[t] - m);
            sum += pg[t];
        }
        for (int32_t t = 0; t < n; t++) pg[t] /= sum; /* sum >= 1: the max term is exp(0) */
    }

    memset(out, 0, sizeof(float) * (size_t)G * (size_t)d);
    for (int32_t t = 0; t < n; t++) {
        const mkv_page_layout_t *lay;
        int32_t slot;
        uint8_t *page = token_page(r, t, &lay, &slot);
        mkv_quant_read_vector(page, lay, 1, slot, vbuf);
        float pmax = 0.0f;
        for (int32_t g = 0; g < G; g++) {
            const float pt = p[(int64_t)g * n + t];
            float *og = out + (int64_t)g * d;
            for (int32_t e = 0; e < d; e++) og[e] += pt * vbuf[e];
            pmax = pt > pmax ? pt : pmax;
        }
        mkv_page_set_score(page, lay, slot, mkv_page_score(page, lay, slot) + pmax);
    }
}
