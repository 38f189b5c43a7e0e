/*
 * forward.c — the forward pass of a Llama-family model on the CPU (docs/model.md), with the
 * attention delegated to the mixkv cache: the model computes Q, K, V per layer and consumes
 * the attention output; the cache stores K/V at its precisions and attends over them.
 *
 * Per layer, for a block of tokens (a prompt, or one decode token per slot):
 *   a = RMSNorm(x) * attn_norm;  q, k, v = Wq a, Wk a, Wv a;  RoPE(q, k, pos);
 *   o = cache attention(q, k, v);  x += Wo o;
 *   a = RMSNorm(x) * mlp_norm;   x += Wdown (silu(Wgate a) * Wup a);
 * then logits = lm_head (RMSNorm(x) * final_norm).
 *
 * Precision: activations and weights fp32; dot products accumulate in fp32 over 8 interleaved
 * partial sums (vectorisable without -ffast-math); RMSNorm's mean of squares and the RoPE
 * angles are computed in double, then used in fp32. Every error is written into
 * mkv_last_error() (a failing cache call's message is copied there) so that callers read one
 * place. Nothing here allocates after mkv_forward_ws_create.
 */
#include "runner/model.h"

#include "runner/error.h"
#include "runner/parallel.h"
#include "runner/weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef MKV_HAVE_OPENBLAS
#include <cblas.h>
void openblas_set_num_threads(int num_threads);
#endif

struct mkv_forward_ws {
    int32_t max_tokens; /* T */
    int32_t n_threads;
    mkv_pool_t *pool;   /* n_threads - 1 workers; NULL for one thread */
    mkv_weights_t *w;   /* the projections, packed (runner/weights.h) */
    const mkv_model_t *model; /* the model w was packed from */
    int32_t hidden, q_dim, kv_dim, inter, head_dim; /* the model it was sized for */
    float *x;           /* [T][hidden] residual stream */
    float *a;           /* [T][hidden] a block's normed input, then its output */
    float *q;           /* [T][H * hd] */
    float *k, *v;       /* [T][Hkv * hd] */
    float *att;         /* [T][H * hd] attention output */
    float *gate, *up;   /* [T][inter] */
    int32_t *pos;       /* [T] each token's position */
    double *inv_freq;   /* [hd / 2] theta^(-2i / hd) */
    float *rope_cs;     /* [T][hd / 2][2] cos, sin of each token's angles */
};

/* ---------------------------------------------------------------------------------------- */
/* Kernels                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, the mean in double. y may not alias x. */
static void rmsnorm(const float *x, const float *w, int32_t dim, int32_t n, float eps, float *y)
{
    for (int32_t t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * dim;
        float *yt = y + (int64_t)t * dim;
        double ss = 0.0;
        for (int32_t i = 0; i < dim; i++) ss += (double)xt[i] * xt[i];
        const float r = (float)(1.0 / sqrt(ss / dim + (double)eps));
        for (int32_t i = 0; i < dim; i++) yt[i] = xt[i] * r * w[i];
    }
}

/* Each token's cos and sin, once per call for every layer: the angle pos * theta^(-2i/hd) in
 * double, its cos and sin rounded to fp32. */
static void rope_table(const int32_t *pos, int32_t n, int32_t hd, const double *inv_freq,
                       float *cs)
{
    const int32_t half = hd / 2;
    for (int32_t t = 0; t < n; t++)
        for (int32_t i = 0; i < half; i++) {
            const double ang = (double)pos[t] * inv_freq[i];
            cs[((int64_t)t * half + i) * 2] = (float)cos(ang);
            cs[((int64_t)t * half + i) * 2 + 1] = (float)sin(ang);
        }
}

/* Hugging Face's rotate_half layout: in each head, element i pairs with i + hd/2 and turns by
 * pos * theta^(-2i/hd) (the angles from rope_table). */
static void rope(float *x, int32_t n_heads, int32_t hd, int32_t t0, int32_t t1, const float *cs)
{
    const int32_t half = hd / 2;
    for (int32_t t = t0; t < t1; t++) {
        for (int32_t i = 0; i < half; i++) {
            const float c = cs[((int64_t)t * half + i) * 2], s = cs[((int64_t)t * half + i) * 2 + 1];
            for (int32_t h = 0; h < n_heads; h++) {
                float *p = x + ((int64_t)t * n_heads + h) * hd;
                const float x1 = p[i], x2 = p[i + half];
                p[i] = x1 * c - x2 * s;
                p[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

static void add_into(float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* ---------------------------------------------------------------------------------------- */
/* Workspace                                                                                */
/* ---------------------------------------------------------------------------------------- */

void mkv_forward_ws_free(mkv_forward_ws_t *ws)
{
    if (!ws) return;
    free(ws->x);
    free(ws->a);
    free(ws->q);
    free(ws->k);
    free(ws->v);
    free(ws->att);
    free(ws->gate);
    free(ws->up);
    free(ws->pos);
    free(ws->inv_freq);
    free(ws->rope_cs);
    mkv_weights_free(ws->w);
    mkv_pool_destroy(ws->pool);
    free(ws);
}

mkv_status_t mkv_forward_ws_create(const mkv_model_t *m, int32_t max_tokens, mkv_forward_ws_t **out,
                                   char *err)
{
    char local[MKV_ERR_LEN];
    if (!err) err = local;
    err[0] = '\0';
    if (out) *out = NULL;
    mkv_status_t status = MKV_STATUS_OK;
    if (!m || !out || max_tokens < 1) {
        status = runner_fail(err, MKV_STATUS_INVALID_ARGUMENT,
                          "mkv_forward_ws_create: null model or out, or max_tokens %d < 1",
                          max_tokens);
        (void)mkv_report_error(MKV_STATUS_OK, "%s", err);
        return status;
    }
    const mkv_model_config_t *c = &m->cfg;
    mkv_forward_ws_t *ws = calloc(1, sizeof *ws);
    if (!ws) goto oom;
    const size_t T = (size_t)max_tokens;
    ws->max_tokens = max_tokens;
    ws->hidden = c->hidden;
    ws->q_dim = c->n_heads * c->head_dim;
    ws->kv_dim = c->n_kv_heads * c->head_dim;
    ws->inter = c->intermediate;
    ws->head_dim = c->head_dim;
    ws->x = malloc(T * (size_t)ws->hidden * sizeof(float));
    ws->a = malloc(T * (size_t)ws->hidden * sizeof(float));
    ws->q = malloc(T * (size_t)ws->q_dim * sizeof(float));
    ws->k = malloc(T * (size_t)ws->kv_dim * sizeof(float));
    ws->v = malloc(T * (size_t)ws->kv_dim * sizeof(float));
    ws->att = malloc(T * (size_t)ws->q_dim * sizeof(float));
    ws->gate = malloc(T * (size_t)ws->inter * sizeof(float));
    ws->up = malloc(T * (size_t)ws->inter * sizeof(float));
    ws->pos = malloc(T * sizeof(int32_t));
    ws->inv_freq = malloc((size_t)(c->head_dim / 2) * sizeof(double));
    ws->rope_cs = malloc(T * (size_t)c->head_dim * sizeof(float));
    if (!ws->x || !ws->a || !ws->q || !ws->k || !ws->v || !ws->att || !ws->gate || !ws->up ||
        !ws->pos || !ws->inv_freq || !ws->rope_cs)
        goto oom;
    for (int32_t i = 0; i < c->head_dim / 2; i++)
        ws->inv_freq[i] = pow((double)c->rope_theta, -2.0 * i / c->head_dim);
#ifdef MKV_HAVE_OPENBLAS
    openblas_set_num_threads(1); /* our pool runs it (head()) */
#endif
    ws->n_threads = mkv_cpu_count();
    if (ws->n_threads > 1 && !(ws->pool = mkv_pool_create(ws->n_threads))) ws->n_threads = 1;
    ws->model = m;
    if ((status = mkv_weights_prepare(m, ws->pool, &ws->w, err)) != MKV_STATUS_OK) {
        mkv_forward_ws_free(ws);
        (void)mkv_report_error(MKV_STATUS_OK, "%s", err);
        return status;
    }
    *out = ws;
    return MKV_STATUS_OK;
oom:
    mkv_forward_ws_free(ws);
    status = runner_fail(err, MKV_STATUS_OUT_OF_MEMORY,
                      "cannot allocate a forward workspace for %d tokens", max_tokens);
    (void)mkv_report_error(MKV_STATUS_OK, "%s", err);
    return status;
}

mkv_status_t mkv_forward_ws_set_threads(mkv_forward_ws_t *ws, int32_t n_threads)
{
    if (!ws || n_threads < 1 || n_threads > 256)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                               "mkv_forward_ws_set_threads: null workspace or %d threads", n_threads);
    if (n_threads == ws->n_threads) return MKV_STATUS_OK;
    mkv_pool_t *pool = NULL;
    if (n_threads > 1 && !(pool = mkv_pool_create(n_threads)))
        return mkv_report_error(MKV_STATUS_OUT_OF_MEMORY,
                               "mkv_forward_ws_set_threads: cannot start %d threads", n_threads);
    mkv_pool_destroy(ws->pool);
    ws->pool = pool;
    ws->n_threads = n_threads;
    return MKV_STATUS_OK;
}

int32_t mkv_forward_ws_threads(const mkv_forward_ws_t *ws) { return ws ? ws->n_threads : 0; }

/* ---------------------------------------------------------------------------------------- */
/* The forward pass                                                                         */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t cache_failed(const mkv_cache_t *cache, mkv_status_t status)
{
    (void)mkv_report_error(MKV_STATUS_OK, "%s", mkv_cache_last_error(cache));
    return status;
}

/* Arguments every call shares: the model, cache and workspace belong together. */
static mkv_status_t check_common(const char *fn, const mkv_model_t *m, const mkv_cache_t *cache,
                                 const mkv_forward_ws_t *ws, const int32_t *tokens, int32_t n)
{
    if (!m || !cache || !ws || !tokens)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "%s: null model, cache, workspace "
                               "or tokens", fn);
    const mkv_model_config_t *c = &m->cfg;
    if (ws->model != m ||
        ws->hidden != c->hidden || ws->q_dim != c->n_heads * c->head_dim ||
        ws->kv_dim != c->n_kv_heads * c->head_dim || ws->inter != c->intermediate)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                               "%s: the workspace was created for another model", fn);
    mkv_cache_info_t info;
    mkv_status_t st = mkv_cache_info(cache, &info);
    if (st != MKV_STATUS_OK) return st; /* its message is already in mkv_last_error() */
    const mkv_cache_config_t *k = &info.config;
    if (k->n_layers != c->n_layers || k->n_kv_heads != c->n_kv_heads ||
        k->group_size * k->n_kv_heads != c->n_heads || k->head_dim != c->head_dim)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                               "%s: the cache (L %d, H %d, G %d, d %d) does not fit the model "
                               "(L %d, KV heads %d, heads %d, head_dim %d)",
                               fn, k->n_layers, k->n_kv_heads, k->group_size, k->head_dim,
                               c->n_layers, c->n_kv_heads, c->n_heads, c->head_dim);
    if (n < 1 || n > ws->max_tokens)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                               "%s: %d tokens, the workspace holds 1 to %d", fn, n, ws->max_tokens);
    for (int32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                   "%s: token %d (at %d) is outside [0, %d)", fn, tokens[t], t,
                                   c->vocab);
    return MKV_STATUS_OK;
}

/* Every layer over n tokens whose embeddings are in ws->x; `attend` runs the cache. */
typedef mkv_status_t (*attend_fn)(mkv_cache_t *cache, int32_t layer, const mkv_forward_ws_t *ws,
                                  const void *arg);

/* Row-parallel elementwise steps (each row's arithmetic is the serial one). */
typedef struct rows_ctx {
    const mkv_forward_ws_t *ws;
    const mkv_model_t *m;
    const float *norm_w; /* rmsnorm's weight */
    int32_t kind;        /* 0: rmsnorm x -> a, 1: rope q and k, 2: silu(gate) * up */
} rows_ctx_t;

static void rows_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    (void)part;
    const rows_ctx_t *r = ctx;
    const mkv_forward_ws_t *ws = r->ws;
    const mkv_model_config_t *c = &r->m->cfg;
    const int32_t t0 = (int32_t)b, t1 = (int32_t)e;
    if (r->kind == 0) {
        rmsnorm(ws->x + (int64_t)t0 * ws->hidden, r->norm_w, ws->hidden, t1 - t0, c->rms_eps,
                ws->a + (int64_t)t0 * ws->hidden);
    } else if (r->kind == 1) {
        rope(ws->q, c->n_heads, c->head_dim, t0, t1, ws->rope_cs);
        rope(ws->k, c->n_kv_heads, c->head_dim, t0, t1, ws->rope_cs);
    } else {
        for (int64_t i = (int64_t)t0 * ws->inter; i < (int64_t)t1 * ws->inter; i++) {
            const float g = ws->gate[i];
            ws->gate[i] = g / (1.0f + expf(-g)) * ws->up[i];
        }
    }
}

static void rows_run(const mkv_model_t *m, mkv_forward_ws_t *ws, int32_t kind, const float *norm_w,
                     int32_t n)
{
    const rows_ctx_t r = {ws, m, norm_w, kind};
    mkv_pool_run(n > 1 ? ws->pool : NULL, rows_range, (void *)&r, n);
}

/* Every layer over n tokens whose embeddings are in ws->x; `attend` runs the cache. */
typedef mkv_status_t (*attend_fn)(mkv_cache_t *cache, int32_t layer, const mkv_forward_ws_t *ws,
                                  const void *arg);

/* The cache's attention runs on the workspace's pool (mkv_cache_set_parallel). */
static void run_on_pool(void *runner, mkv_task_fn fn, void *task, int64_t n)
{
    mkv_pool_run(runner, fn, task, n);
}

static mkv_status_t layers(const mkv_model_t *m, mkv_cache_t *cache, mkv_forward_ws_t *ws,
                           int32_t n, attend_fn attend, const void *arg);

/* Lends the cache the pool for the call's layers only: the cache must not keep a pointer to
 * a workspace that may be freed before it. */
static mkv_status_t run_layers(const mkv_model_t *m, mkv_cache_t *cache, mkv_forward_ws_t *ws,
                               int32_t n, attend_fn attend, const void *arg)
{
    mkv_status_t st;
    if (ws->pool && (st = mkv_cache_set_parallel(cache, run_on_pool, ws->pool, ws->n_threads)) != MKV_STATUS_OK)
        return cache_failed(cache, st);
    st = layers(m, cache, ws, n, attend, arg);
    if (ws->pool) (void)mkv_cache_set_parallel(cache, NULL, NULL, 1);
    return st;
}

static mkv_status_t layers(const mkv_model_t *m, mkv_cache_t *cache, mkv_forward_ws_t *ws,
                           int32_t n, attend_fn attend, const void *arg)
{
    const mkv_model_config_t *c = &m->cfg;
    const int32_t D = c->hidden, QD = ws->q_dim, KD = ws->kv_dim, FF = c->intermediate;
    rope_table(ws->pos, n, c->head_dim, ws->inv_freq, ws->rope_cs);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mkv_layer_weights_t *w = &m->layers[l];
        const mkv_wmat_t *pw = ws->w->mats + (int64_t)l * MKV_W_PER_LAYER;
        rows_run(m, ws, 0, w->attn_norm, n);
        const mkv_matmul_t qkv = {3, {&pw[MKV_W_Q], &pw[MKV_W_K], &pw[MKV_W_V]},
                                  {ws->q, ws->k, ws->v}, {QD, KD, KD}};
        mkv_matmul_run(ws->pool, &qkv, ws->a, D, n);
        rows_run(m, ws, 1, NULL, n);
        const mkv_status_t st = attend(cache, l, ws, arg);
        if (st != MKV_STATUS_OK) return cache_failed(cache, st);
        const mkv_matmul_t o = {1, {&pw[MKV_W_O]}, {ws->a}, {D}};
        mkv_matmul_run(ws->pool, &o, ws->att, QD, n);
        add_into(ws->x, ws->a, (int64_t)n * D);

        rows_run(m, ws, 0, w->mlp_norm, n);
        const mkv_matmul_t gu = {2, {&pw[MKV_W_GATE], &pw[MKV_W_UP]}, {ws->gate, ws->up}, {FF, FF}};
        mkv_matmul_run(ws->pool, &gu, ws->a, D, n);
        rows_run(m, ws, 2, NULL, n);
        const mkv_matmul_t down = {1, {&pw[MKV_W_DOWN]}, {ws->a}, {D}};
        mkv_matmul_run(ws->pool, &down, ws->gate, FF, n);
        add_into(ws->x, ws->a, (int64_t)n * D);
    }
    return MKV_STATUS_OK;
}

static void embed(const mkv_model_t *m, const int32_t *tokens, int32_t n, float *x)
{
    const int64_t D = m->cfg.hidden;
    for (int32_t t = 0; t < n; t++)
        memcpy(x + t * D, m->embed + (int64_t)tokens[t] * D, (size_t)D * sizeof(float));
}

#ifdef MKV_HAVE_OPENBLAS
/* The logits of every position: OpenBLAS sgemm on the fp32 lm_head, in fixed column chunks run
 * by our pool (OpenBLAS itself single-threaded: no second set of threads competes with ours,
 * and the split does not depend on the thread count). */
#define LOGIT_CHUNK 1024
typedef struct blas_ctx {
    const float *a, *w;
    float *logits;
    int32_t n, V, D;
} blas_ctx_t;

static void blas_range(void *ctx, int64_t b, int64_t e, int32_t part)
{
    (void)part;
    const blas_ctx_t *c = ctx;
    for (int64_t i = b; i < e; i++) {
        const int32_t c0 = (int32_t)(i * LOGIT_CHUNK);
        const int32_t nc = c->V - c0 < LOGIT_CHUNK ? c->V - c0 : LOGIT_CHUNK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->n, nc, c->D, 1.0f, c->a, c->D,
                    c->w + (int64_t)c0 * c->D, c->D, 0.0f, c->logits + c0, c->V);
    }
}
#endif

/* logits of tokens [first, first + count) of ws->x, after the final norm; blas: through
 * OpenBLAS (a prefill's every position), else the packed kernels, whose rows equal a decode's
 * bit for bit. */
static void head(const mkv_model_t *m, mkv_forward_ws_t *ws, int32_t first, int32_t count,
                 float *logits, int blas)
{
    const int64_t D = m->cfg.hidden;
    rmsnorm(ws->x + first * D, m->final_norm, (int32_t)D, count, m->cfg.rms_eps, ws->a);
#ifdef MKV_HAVE_OPENBLAS
    if (blas && count > 1) {
        const blas_ctx_t c = {ws->a, m->lm_head, logits, count, m->cfg.vocab, (int32_t)D};
        mkv_pool_run(ws->pool, blas_range, (void *)&c, (m->cfg.vocab + LOGIT_CHUNK - 1) / LOGIT_CHUNK);
        return;
    }
#else
    (void)blas;
#endif
    const mkv_matmul_t lm = {1, {&ws->w->lm_head}, {logits}, {m->cfg.vocab}};
    mkv_matmul_run(ws->pool, &lm, ws->a, D, count);
}

typedef struct prefill_arg {
    int32_t slot;
} prefill_arg_t;

static mkv_status_t attend_prefill(mkv_cache_t *cache, int32_t layer, const mkv_forward_ws_t *ws,
                                   const void *arg)
{
    const prefill_arg_t *p = arg;
    return mkv_cache_prefill_layer(cache, p->slot, layer, ws->q, ws->k, ws->v, ws->att, NULL);
}

mkv_status_t mkv_model_prefill(const mkv_model_t *m, mkv_cache_t *cache, int32_t slot,
                               const int32_t *tokens, int32_t n, float *logits, float *last_logits,
                               mkv_forward_ws_t *ws)
{
    (void)mkv_report_error(MKV_STATUS_OK, NULL);
    mkv_status_t st = check_common("mkv_model_prefill", m, cache, ws, tokens, n);
    if (st != MKV_STATUS_OK) return st;
    mkv_slot_info_t si;
    if ((st = mkv_cache_slot_info(cache, slot, &si)) != MKV_STATUS_OK) return cache_failed(cache, st);
    if (!si.active || si.seq_len != 0)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                               "mkv_model_prefill: slot %d is not an admitted, uncommitted slot",
                               slot);
    int32_t admitted;
    if ((st = mkv_cache_prompt_len(cache, slot, &admitted)) != MKV_STATUS_OK) return cache_failed(cache, st);
    if (n != admitted)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                               "mkv_model_prefill: %d tokens, but slot %d was admitted with a "
                               "prompt of %d",
                               n, slot, admitted);

    for (int32_t t = 0; t < n; t++) ws->pos[t] = t;
    embed(m, tokens, n, ws->x);
    const prefill_arg_t arg = {slot};
    if ((st = run_layers(m, cache, ws, n, attend_prefill, &arg)) != MKV_STATUS_OK) return st;
    if ((st = mkv_cache_commit_prompt(cache, 1, &slot, NULL)) != MKV_STATUS_OK)
        return cache_failed(cache, st);
    if (logits) {
        head(m, ws, 0, n, logits, 1);
        if (last_logits)
            memcpy(last_logits, logits + (int64_t)(n - 1) * m->cfg.vocab,
                   (size_t)m->cfg.vocab * sizeof(float));
    } else if (last_logits) {
        head(m, ws, n - 1, 1, last_logits, 0);
    }
    return MKV_STATUS_OK;
}

typedef struct decode_arg {
    int32_t n_slots;
    const int32_t *slots;
} decode_arg_t;

static mkv_status_t attend_decode(mkv_cache_t *cache, int32_t layer, const mkv_forward_ws_t *ws,
                                  const void *arg)
{
    const decode_arg_t *p = arg;
    return mkv_cache_decode_layer(cache, p->n_slots, p->slots, layer, ws->q, ws->k, ws->v, ws->att,
                                  NULL);
}

mkv_status_t mkv_model_decode(const mkv_model_t *m, mkv_cache_t *cache, int32_t n_slots,
                              const int32_t *slots, const int32_t *tokens, float *logits,
                              mkv_forward_ws_t *ws)
{
    (void)mkv_report_error(MKV_STATUS_OK, NULL);
    mkv_status_t st = check_common("mkv_model_decode", m, cache, ws, tokens, n_slots);
    if (st != MKV_STATUS_OK) return st;
    if (!slots || !logits)
        return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT, "mkv_model_decode: null slots or logits");
    /* The new token's position is the slot's N before the append. */
    if ((st = mkv_cache_seq_lens(cache, n_slots, slots, ws->pos)) != MKV_STATUS_OK)
        return cache_failed(cache, st);
    for (int32_t j = 0; j < n_slots; j++)
        if (ws->pos[j] == 0)
            return mkv_report_error(MKV_STATUS_INVALID_ARGUMENT,
                                   "mkv_model_decode: slot %d has no committed prompt", slots[j]);
    if ((st = mkv_cache_append(cache, n_slots, slots, NULL)) != MKV_STATUS_OK)
        return cache_failed(cache, st);
    embed(m, tokens, n_slots, ws->x);
    const decode_arg_t arg = {n_slots, slots};
    if ((st = run_layers(m, cache, ws, n_slots, attend_decode, &arg)) != MKV_STATUS_OK) return st;
    if ((st = mkv_cache_compress(cache, n_slots, slots, NULL)) != MKV_STATUS_OK)
        return cache_failed(cache, st);
    head(m, ws, 0, n_slots, logits, 0);
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* As mixkv.h's mkv_forward_t                                                               */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t forward_prefill(void *ctx, mkv_cache_t *cache, int32_t slot, const int32_t *tokens,
                                    int32_t n, float *logits, float *last_logits)
{
    mkv_forward_ws_t *ws = ctx;
    return mkv_model_prefill(ws->model, cache, slot, tokens, n, logits, last_logits, ws);
}

static mkv_status_t forward_decode(void *ctx, mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                   const int32_t *tokens, float *logits)
{
    mkv_forward_ws_t *ws = ctx;
    return mkv_model_decode(ws->model, cache, n_slots, slots, tokens, logits, ws);
}

mkv_forward_t mkv_model_forward(mkv_forward_ws_t *ws)
{
    mkv_forward_t f;
    memset(&f, 0, sizeof f);
    if (!ws) return f; /* no calls: mkv_scheduler_create refuses it */
    f.ctx = ws;
    f.vocab = ws->model->cfg.vocab;
    f.max_positions = ws->model->cfg.max_pos;
    f.max_tokens = ws->max_tokens;
    f.prefill = forward_prefill;
    f.decode = forward_decode;
    return f;
}
