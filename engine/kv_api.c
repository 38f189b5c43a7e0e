/*
 * kv_api.c — the public token-data calls (include/mixkv.h): each checks its arguments and the
 * step order once, here, then dispatches through the cache's backend table (engine/kv.h).
 * The backend is chosen once, when the layer's state is created on first use.
 */
#include "engine/kv.h"

#include <stdlib.h>
#include <string.h>

static void kv_free(struct mkv_kv *kv)
{
    if (!kv) return;
    if (kv->ops && kv->ops->destroy) kv->ops->destroy(kv);
    free(kv->prefill_epoch);
    free(kv->prefilled);
    free(kv->decoded);
    free(kv->compressed);
    free(kv->budget);
    free(kv->budget_epoch);
    free(kv);
}

static void kv_refresh(mkv_cache_t *c)
{
    mkv_kv_t *kv = c->kv;
    if (kv && kv->ops->refresh) kv->ops->refresh(c, kv);
}

/* The layer's state, created on first use with the backend the cache was made for. */
static mkv_status_t kv_get(mkv_cache_t *c, mkv_kv_t **out)
{
    if (c->kv) {
        *out = c->kv;
        return MKV_STATUS_OK;
    }
    const mkv_cache_config_t *cfg = &c->cfg;
    const mkv_kv_ops_t *ops = &mkv_kv_cpu_ops;
    if (cfg->backend == MKV_BACKEND_CUDA) {
#ifdef MKV_HAVE_CUDA
        ops = &mkv_kv_cuda_ops;
#else
        return mkv_fail(c->err, MKV_STATUS_UNSUPPORTED, "this build has no CUDA backend");
#endif
    }
    if (cfg->flags & MKV_CACHE_METADATA_ONLY)
        return mkv_fail(c->err, MKV_STATUS_UNSUPPORTED,
                        "this cache was created with MKV_CACHE_METADATA_ONLY: it holds no token data");
    const int64_t S = cfg->max_seqs, L = cfg->n_layers;
    mkv_kv_t *kv = calloc(1, sizeof *kv);
    if (!kv) return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the KV backend");
    kv->max_seqs = (int32_t)S;
    kv->n_layers = (int32_t)L;
    char why[MKV_ERR_LEN];
    mkv_page_layout(cfg->hi_format, cfg->head_dim, cfg->hi_key_group, cfg->hi_value_group,
                    cfg->page_bytes, &kv->lay_hi, why);
    mkv_page_layout(cfg->lo_format, cfg->head_dim, cfg->lo_key_group, cfg->lo_value_group,
                    cfg->page_bytes, &kv->lay_lo, why);
    kv->prefill_epoch = calloc((size_t)S, sizeof *kv->prefill_epoch);
    kv->prefilled = calloc((size_t)(S * L), 1);
    kv->decoded = calloc((size_t)(S * L), sizeof *kv->decoded);
    kv->compressed = calloc((size_t)S, sizeof *kv->compressed);
    kv->budget = calloc((size_t)S, sizeof *kv->budget);
    kv->budget_epoch = calloc((size_t)S, sizeof *kv->budget_epoch);
    if (!kv->prefill_epoch || !kv->prefilled || !kv->decoded || !kv->compressed || !kv->budget ||
        !kv->budget_epoch) {
        kv_free(kv);
        return mkv_fail(c->err, MKV_STATUS_OUT_OF_MEMORY, "cannot allocate the KV backend's buffers");
    }
    mkv_status_t st = ops->create(c, kv);
    if (st != MKV_STATUS_OK) {
        kv_free(kv);
        return st;
    }
    kv->ops = ops;
    c->kv = kv;
    c->kv_free = kv_free;
    c->kv_refresh = kv_refresh;
    *out = kv;
    return MKV_STATUS_OK;
}

#define HANDLE_CHECK(c)                                                                        \
    do {                                                                                       \
        if (!(c)) return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "%s: null cache", __func__); \
        (c)->err[0] = '\0';                                                                    \
    } while (0)

/* Calls that wait for the device report a refusal of earlier asynchronous steps first (and do
 * nothing else); step calls of an asynchronous cache run ahead without waiting. */
#define SETTLE(c, is_step)                                                                     \
    do {                                                                                       \
        if (!((is_step) && (c)->async)) {                                                      \
            const mkv_status_t settled_ = mkv_cache_settle(c);                                 \
            if (settled_ != MKV_STATUS_OK) return settled_;                                    \
        }                                                                                      \
    } while (0)

static mkv_status_t check_dtype(mkv_cache_t *c, mkv_dtype_t dtype)
{
    if ((int)dtype < 0 || dtype >= MKV_DTYPE_COUNT)
        return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "element type %d is not a valid mkv_dtype_t",
                        (int)dtype);
    return MKV_STATUS_OK;
}

static mkv_status_t check_layer(mkv_cache_t *c, int32_t layer)
{
    if (layer < 0 || layer >= c->cfg.n_layers)
        return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "layer %d is outside [0, %d)", layer,
                        c->cfg.n_layers);
    return MKV_STATUS_OK;
}

/* The prefilled[] flags of slot s belong to its current occupant. */
static uint8_t *prefilled_of(mkv_cache_t *c, mkv_kv_t *kv, int32_t s)
{
    uint8_t *p = kv->prefilled + (int64_t)s * kv->n_layers;
    if (kv->prefill_epoch[s] != c->epoch[s]) {
        memset(p, 0, (size_t)kv->n_layers);
        kv->prefill_epoch[s] = c->epoch[s];
    }
    return p;
}

mkv_status_t mkv_cache_set_budget(mkv_cache_t *cache, int32_t slot, int32_t max_tokens)
{
    HANDLE_CHECK(cache);
    SETTLE(cache, 0);
    mkv_status_t st = mkv_cache_check_slots(cache, 1, &slot);
    if (st != MKV_STATUS_OK) return st;
    if (max_tokens < 0)
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "budget %d must be >= 0", max_tokens);
    if (cache->cfg.flags & MKV_CACHE_NO_SCORES)
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                        "a budget needs scores: the cache was created with MKV_CACHE_NO_SCORES");
    mkv_kv_t *kv; /* the budget is the KV layer's: it prunes token data */
    if ((st = kv_get(cache, &kv)) != MKV_STATUS_OK) return st;
    kv->budget[slot] = max_tokens;
    kv->budget_epoch[slot] = cache->epoch[slot];
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Prefill                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* What prefill and decode check alike: the backend's state, the slots, the layer, the element
 * type, and (for a non-empty call) the four tensors. */
static mkv_status_t check_token_call(mkv_cache_t *c, int32_t n_slots, const int32_t *slots,
                                     int32_t layer, mkv_dtype_t dtype, const void *q,
                                     const void *k, const void *v, const void *out, mkv_kv_t **kv)
{
    mkv_status_t st = kv_get(c, kv);
    if (st != MKV_STATUS_OK) return st;
    if ((st = mkv_cache_check_slots(c, n_slots, slots)) != MKV_STATUS_OK) return st;
    if ((st = check_layer(c, layer)) != MKV_STATUS_OK) return st;
    if ((st = check_dtype(c, dtype)) != MKV_STATUS_OK) return st;
    if (n_slots > 0 && (!q || !k || !v || !out))
        return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "null q, k, v or out");
    return MKV_STATUS_OK;
}

static mkv_status_t prefill(mkv_cache_t *c, int32_t n_slots, const int32_t *slots, int32_t layer,
                            mkv_dtype_t dtype, const void *q, const void *k, const void *v,
                            void *out, void *stream)
{
    SETTLE(c, 0);
    mkv_kv_t *kv;
    mkv_status_t st = check_token_call(c, n_slots, slots, layer, dtype, q, k, v, out, &kv);
    if (st != MKV_STATUS_OK || n_slots == 0) return st;
    for (int32_t j = 0; j < n_slots; j++)
        if (c->st.seq_len[slots[j]] != 0)
            return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "slot %d: its prompt is already committed",
                            slots[j]);
    if ((st = kv->ops->prefill(c, kv, n_slots, slots, layer, dtype, q, k, v, out, stream)) !=
        MKV_STATUS_OK)
        return st;
    for (int32_t j = 0; j < n_slots; j++) prefilled_of(c, kv, slots[j])[layer] = 1;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_prefill_layer(mkv_cache_t *cache, int32_t slot, int32_t layer,
                                     const float *q, const float *k, const float *v, float *out,
                                     void *stream)
{
    HANDLE_CHECK(cache);
    return prefill(cache, 1, &slot, layer, MKV_DTYPE_F32, q, k, v, out, stream);
}

mkv_status_t mkv_cache_prefill_layer_ex(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                        int32_t layer, mkv_dtype_t dtype, const void *q,
                                        const void *k, const void *v, void *out, void *stream)
{
    HANDLE_CHECK(cache);
    return prefill(cache, n_slots, slots, layer, dtype, q, k, v, out, stream);
}

/* ---------------------------------------------------------------------------------------- */
/* Commit                                                                                   */
/* ---------------------------------------------------------------------------------------- */

mkv_status_t mkv_cache_commit_prompt(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                     void *stream)
{
    HANDLE_CHECK(cache);
    SETTLE(cache, 0);
    mkv_kv_t *kv;
    mkv_status_t st = kv_get(cache, &kv);
    if (st != MKV_STATUS_OK) return st;
    if ((st = mkv_cache_check_slots(cache, n_slots, slots)) != MKV_STATUS_OK) return st;
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j];
        if (cache->st.seq_len[s] != 0)
            return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                            "slot %d: its prompt is already committed", s);
        const uint8_t *done = prefilled_of(cache, kv, s);
        for (int32_t l = 0; l < kv->n_layers; l++)
            if (!done[l])
                return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                                "slot %d: layer %d has not been prefilled", s, l);
    }
    if (n_slots == 0) return MKV_STATUS_OK;
    if ((st = kv->ops->commit(cache, kv, n_slots, slots, stream)) != MKV_STATUS_OK) return st;
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j], n = cache->prompt_len[s];
        for (int32_t l = 0; l < kv->n_layers; l++) kv->decoded[(int64_t)s * kv->n_layers + l] = n;
        kv->compressed[s] = 0; /* a new occupant: its steps start afresh */
        memset(kv->prefilled + (int64_t)s * kv->n_layers, 0, (size_t)kv->n_layers);
    }
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Decode                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static mkv_status_t decode(mkv_cache_t *c, int32_t n_slots, const int32_t *slots, int32_t layer,
                           mkv_dtype_t dtype, const void *q, const void *k, const void *v,
                           void *out, void *stream)
{
    SETTLE(c, 1);
    mkv_kv_t *kv;
    mkv_status_t st = check_token_call(c, n_slots, slots, layer, dtype, q, k, v, out, &kv);
    if (st != MKV_STATUS_OK) return st;
    const int64_t L = kv->n_layers;
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j], N = c->st.seq_len[s];
        if (N <= c->prompt_len[s] || kv->decoded[s * L + layer] >= N)
            return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT,
                            "slot %d layer %d: no new token to decode (commit the prompt, then "
                            "mkv_cache_append once per step, then each layer once)",
                            s, layer);
    }
    if (n_slots == 0) return MKV_STATUS_OK;
    if ((st = kv->ops->decode(c, kv, n_slots, slots, layer, dtype, q, k, v, out, stream)) !=
        MKV_STATUS_OK)
        return st;
    for (int32_t j = 0; j < n_slots; j++) kv->decoded[slots[j] * L + layer] = c->st.seq_len[slots[j]];
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_decode_layer(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                    int32_t layer, const float *q, const float *k, const float *v,
                                    float *out, void *stream)
{
    HANDLE_CHECK(cache);
    return decode(cache, n_slots, slots, layer, MKV_DTYPE_F32, q, k, v, out, stream);
}

mkv_status_t mkv_cache_decode_layer_ex(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                       int32_t layer, mkv_dtype_t dtype, const void *q,
                                       const void *k, const void *v, void *out, void *stream)
{
    HANDLE_CHECK(cache);
    return decode(cache, n_slots, slots, layer, dtype, q, k, v, out, stream);
}

mkv_status_t mkv_cache_set_parallel(mkv_cache_t *cache, mkv_parallel_fn run, void *runner,
                                    int32_t parts)
{
    HANDLE_CHECK(cache);
    if (parts < 1)
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_set_parallel: %d parts (>= 1)",
                        parts);
    cache->par_run = parts > 1 ? run : NULL;
    cache->par_runner = parts > 1 ? runner : NULL;
    cache->par_parts = run && parts > 1 ? parts : 1;
    return MKV_STATUS_OK;
}

mkv_status_t mkv_cache_set_capture_horizon(mkv_cache_t *cache, int32_t steps)
{
    HANDLE_CHECK(cache);
    if (steps < 0)
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                        "mkv_cache_set_capture_horizon: %d steps (>= 0)", steps);
    cache->capture_horizon = steps;
    return MKV_STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Compress                                                                                 */
/* ---------------------------------------------------------------------------------------- */

mkv_status_t mkv_cache_compress(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                                void *stream)
{
    HANDLE_CHECK(cache);
    SETTLE(cache, 1);
    mkv_kv_t *kv;
    mkv_status_t st = kv_get(cache, &kv);
    if (st != MKV_STATUS_OK) return st;
    if ((st = mkv_cache_check_slots(cache, n_slots, slots)) != MKV_STATUS_OK) return st;
    const int64_t L = kv->n_layers;
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t s = slots[j], N = cache->st.seq_len[s];
        for (int64_t l = 0; l < L; l++)
            if (N <= cache->prompt_len[s] || kv->decoded[s * L + l] != N)
                return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                                "slot %d: decode every layer of the step before compressing "
                                "(layer %lld has not seen token %d)",
                                s, (long long)l, N - 1);
        if (kv->compressed[s] == N)
            return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                            "slot %d: already compressed at length %d (once per step)", s, N);
    }
    if (n_slots == 0) return MKV_STATUS_OK;
    if ((st = kv->ops->compress(cache, kv, n_slots, slots, stream)) != MKV_STATUS_OK) return st;
    for (int32_t j = 0; j < n_slots; j++) kv->compressed[slots[j]] = cache->st.seq_len[slots[j]];
    return MKV_STATUS_OK;
}
