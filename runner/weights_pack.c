/*
 * weights_pack.c — the packed panels of weights.h, built from a model: fp32 or bf16 panels
 * from the fp32 weights, quantized panels from a GGUF tensor's Q4_0 / Q4_1 / Q8_0 blocks.
 * The products over them are in weights.c.
 *
 * A quantized panel keeps each block's integer codes as they are and its fp16 scale (and min)
 * as fp32, converted by the same function as the GGUF dequantizer (exact), so that the kernels
 * rebuild every weight with the dequantizer's own two roundings (see gguf_dequant.c).
 */
#include "runner/weights.h"

#include "runner/error.h"
#include "runner/gguf.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static int bf16_exact(const float *w, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &w[i], 4);
        if (u & 0xffffu) return 0;
    }
    return 1;
}

static uint16_t to_bf16(float x) /* round to nearest even; exact for bf16 values */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void mkv_wmat_free(mkv_wmat_t *w)
{
    if (!w) return;
    free(w->data);
    w->data = NULL;
}

mkv_status_t mkv_wmat_pack(const float *w, int32_t out, int32_t in, int allow_lossy,
                           mkv_wmat_t *dst)
{
    memset(dst, 0, sizeof *dst);
    dst->out = out;
    dst->in = in;
    dst->panels = (out + MKV_PANEL - 1) / MKV_PANEL;
    const int bf16 = allow_lossy || bf16_exact(w, (int64_t)out * in);
    dst->fmt = bf16 ? MKV_WFMT_BF16 : MKV_WFMT_F32;
    const size_t in_pad = (size_t)in + (size_t)(in % 2); /* bf16 panels hold k in pairs */
    dst->panel_bytes = bf16 ? (int64_t)in_pad * MKV_PANEL * 2 : (int64_t)in * MKV_PANEL * 4;
    dst->data = calloc((size_t)dst->panels, (size_t)dst->panel_bytes);
    if (!dst->data) return MKV_STATUS_OUT_OF_MEMORY;
    for (int32_t p = 0; p < dst->panels; p++)
        for (int32_t j = 0; j < MKV_PANEL && p * MKV_PANEL + j < out; j++) {
            const float *row = w + (int64_t)(p * MKV_PANEL + j) * in;
            const size_t base = (size_t)p * in * MKV_PANEL + (size_t)j;
            if (bf16) {
                /* k pairs: lane j's 32-bit word holds k (low half) and k + 1 (high half). */
                uint16_t *d = (uint16_t *)dst->data + (size_t)p * in_pad * MKV_PANEL;
                for (int32_t k = 0; k < in; k++)
                    d[((size_t)(k / 2) * MKV_PANEL + (size_t)j) * 2 + (size_t)(k % 2)] = to_bf16(row[k]);
            } else {
                float *d = (float *)dst->data + base;
                for (int32_t k = 0; k < in; k++) d[(size_t)k * MKV_PANEL] = row[k];
            }
        }
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Quantized panels                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* The ggml block of each supported type: bytes, and where its codes start. */
static int quant_fmt(uint32_t type, int32_t *fmt, int32_t *block_bytes, int32_t *codes_at)
{
    switch (type) {
    case MKV_GGML_Q4_0: *fmt = MKV_WFMT_Q4_0, *block_bytes = 18, *codes_at = 2; return 1;
    case MKV_GGML_Q4_1: *fmt = MKV_WFMT_Q4_1, *block_bytes = 20, *codes_at = 4; return 1;
    case MKV_GGML_Q8_0: *fmt = MKV_WFMT_Q8_0, *block_bytes = 34, *codes_at = 2; return 1;
    default: return 0;
    }
}

int mkv_wmat_quant_supported(uint32_t type)
{
    int32_t f, b, c;
    return quant_fmt(type, &f, &b, &c);
}

static float f16_at(const uint8_t *p)
{
    float f;
    (void)mkv_convert(&f, MKV_DTYPE_F32, p, MKV_DTYPE_F16, 1); /* little-endian, as the file */
    return f;
}

/* One ggml block of row j into lane j of its group (weights.h's layout). */
static void pack_block(int32_t fmt, const uint8_t *blk, int32_t codes_at, int32_t j, uint8_t *grp)
{
    float d = f16_at(blk), m = fmt == MKV_WFMT_Q4_1 ? f16_at(blk + 2) : 0.0f;
    memcpy(grp + 4 * j, &d, 4);
    if (fmt == MKV_WFMT_Q4_1) memcpy(grp + 64 + 4 * j, &m, 4);
    const uint8_t *q = blk + codes_at;
    uint8_t *codes = grp + (fmt == MKV_WFMT_Q4_1 ? 128 : 64);
    const int per_word = fmt == MKV_WFMT_Q8_0 ? 4 : 8, bits = 32 / per_word;
    for (int s = 0; s < MKV_QBLOCK / per_word; s++) {
        uint32_t word = 0;
        for (int n = 0; n < per_word; n++) {
            const int k = s * per_word + n;
            /* ggml's Q4: byte i holds k = i (low nibble) and k = i + 16 (high nibble). */
            const uint32_t c = fmt == MKV_WFMT_Q8_0 ? q[k] : k < 16 ? q[k] & 0x0fu : q[k - 16] >> 4u;
            word |= c << (bits * n);
        }
        memcpy(codes + ((size_t)s * MKV_PANEL + (size_t)j) * 4, &word, 4);
    }
}

mkv_status_t mkv_wmat_pack_quant(uint32_t type, const void *blocks, int32_t out, int32_t in,
                                 mkv_wmat_t *dst)
{
    memset(dst, 0, sizeof *dst);
    int32_t fmt, block_bytes, codes_at;
    if (!quant_fmt(type, &fmt, &block_bytes, &codes_at) || in % MKV_QBLOCK != 0)
        return MKV_STATUS_UNSUPPORTED;
    const int32_t groups = in / MKV_QBLOCK, gbytes = MKV_WFMT_GROUP_BYTES(fmt);
    dst->out = out;
    dst->in = in;
    dst->panels = (out + MKV_PANEL - 1) / MKV_PANEL;
    dst->fmt = fmt;
    dst->panel_bytes = (int64_t)groups * gbytes;
    /* 64-byte aligned: every group is a whole number of cache lines. */
    const size_t bytes = (size_t)dst->panels * (size_t)dst->panel_bytes;
    dst->data = aligned_alloc(64, bytes ? bytes : 64);
    if (!dst->data) return MKV_STATUS_OUT_OF_MEMORY;
    memset(dst->data, 0, bytes);
    const uint8_t *src = blocks;
    for (int32_t o = 0; o < out; o++) {
        uint8_t *panel = (uint8_t *)dst->data + (size_t)(o / MKV_PANEL) * (size_t)dst->panel_bytes;
        for (int32_t g = 0; g < groups; g++)
            pack_block(fmt, src + ((size_t)o * groups + (size_t)g) * (size_t)block_bytes, codes_at,
                       o % MKV_PANEL, panel + (size_t)g * (size_t)gbytes);
    }
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* A model's matrices                                                                       */
/* ---------------------------------------------------------------------------------------- */

void mkv_weights_free(mkv_weights_t *w)
{
    if (!w) return;
    if (w->mats)
        for (int64_t i = 0; i < (int64_t)w->n_layers * MKV_W_PER_LAYER; i++) mkv_wmat_free(&w->mats[i]);
    free(w->mats);
    mkv_wmat_free(&w->lm_head);
    free(w);
}

typedef struct pack_job {
    int32_t out[MKV_W_PER_LAYER], in[MKV_W_PER_LAYER];
    const mkv_model_t *m;
    mkv_weights_t *w;
    atomic_int failed;
} pack_job_t;

/* The quantized panels when the model kept blocks of a supported type, else fp32 / bf16. */
static mkv_status_t pack_one(const float *w, const mkv_qblocks_t *q, int32_t out, int32_t in,
                             mkv_wmat_t *dst)
{
    if (q->blocks && mkv_wmat_quant_supported(q->type) && in % MKV_QBLOCK == 0)
        return mkv_wmat_pack_quant(q->type, q->blocks, out, in, dst);
    return mkv_wmat_pack(w, out, in, 0, dst);
}

/* Items: every layer's matrices, then the lm_head. */
static void pack_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    (void)part;
    pack_job_t *j = ctx;
    const mkv_model_config_t *c = &j->m->cfg;
    for (int64_t i = b; i < e; i++) {
        mkv_status_t st;
        if (i == (int64_t)c->n_layers * MKV_W_PER_LAYER) {
            st = pack_one(j->m->lm_head, &j->m->qlm_head, c->vocab, c->hidden, &j->w->lm_head);
        } else {
            const mkv_layer_weights_t *L = &j->m->layers[i / MKV_W_PER_LAYER];
            const float *src[MKV_W_PER_LAYER] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
            const mkv_qblocks_t *q[MKV_W_PER_LAYER] = {&L->qwq, &L->qwk, &L->qwv, &L->qwo,
                                                       &L->qw_gate, &L->qw_up, &L->qw_down};
            const int32_t k = (int32_t)(i % MKV_W_PER_LAYER);
            st = pack_one(src[k], q[k], j->out[k], j->in[k], &j->w->mats[i]);
        }
        if (st != MKV_STATUS_OK) atomic_store(&j->failed, 1);
    }
}

mkv_status_t mkv_weights_prepare(const mkv_model_t *m, mkv_pool_t *pool, mkv_weights_t **out,
                                 char *err)
{
    *out = NULL;
    const mkv_model_config_t *c = &m->cfg;
    mkv_weights_t *w = calloc(1, sizeof *w);
    if (!w) return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate packed weights");
    w->n_layers = c->n_layers;
    w->mats = calloc((size_t)c->n_layers * MKV_W_PER_LAYER, sizeof *w->mats);
    if (!w->mats) {
        free(w);
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate packed weights");
    }
    const int32_t D = c->hidden, QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim,
                  I = c->intermediate;
    pack_job_t j = {.out = {QD, KD, KD, D, I, I, D}, .in = {D, D, D, QD, D, D, I}, .m = m, .w = w};
    atomic_init(&j.failed, 0);
    mkv_pool_run(pool, pack_range, &j, (int64_t)c->n_layers * MKV_W_PER_LAYER + 1);
    if (atomic_load(&j.failed)) {
        mkv_weights_free(w);
        return runner_fail(err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate packed weights");
    }
    for (int64_t i = 0; i < (int64_t)c->n_layers * MKV_W_PER_LAYER; i++)
        w->bytes += (int64_t)w->mats[i].panels * w->mats[i].panel_bytes;
    w->bytes += (int64_t)w->lm_head.panels * w->lm_head.panel_bytes;
    *out = w;
    return MKV_STATUS_OK;
}
