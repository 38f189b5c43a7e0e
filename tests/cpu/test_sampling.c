/*
 * test_sampling.c — the host sampler (engine/sampling.h): the pure choice for a given uniform
 * (mkv_sample_with_u, the reference of the CUDA sampler) and its properties, the same tokens as
 * before it was factored out of mkv_sample, and the scheduler's decode_sample path (a uniform
 * drawn per sampled request on the host, the choice made by the forward pass) against its host
 * sampling, over a model-free stand-in pass, so that it runs without a model or a GPU.
 */
#include "engine/sampling.h"
#include "engine/scheduler.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Tokens mkv_sample drew before the choice was factored out (commit 0f56c3e's sampling.c): 1000
 * logits uniform in [-4, 4) with every seventh a copy of the one before (ties), five settings,
 * each seeded 2024 + its index: the first 12 tokens, then a hash of the next 2000. */
Test(sampling, same_tokens_as_before_the_refactor)
{
    enum { V = 1000 };
    static float lg[V], scratch[2 * V];
    uint64_t r = 31337;
    for (int i = 0; i < V; i++) lg[i] = i % 7 == 6 ? lg[i - 1] : (float)(rnd(&r) >> 40) * 0x1.0p-24f * 8.0f - 4.0f;
    const float T[5] = {0.7f, 1.0f, 1.3f, 0.8f, 1.0f}, P[5] = {0.5f, 1.0f, 0.9f, 0.9f, 0.05f};
    static const int32_t first[5][12] = {
        {954, 270, 9, 297, 785, 447, 668, 163, 275, 361, 651, 803},
        {14, 995, 445, 170, 630, 690, 654, 861, 723, 921, 982, 983},
        {303, 88, 989, 861, 133, 417, 536, 601, 706, 22, 706, 515},
        {397, 870, 267, 149, 208, 292, 170, 481, 27, 517, 199, 293},
        {288, 630, 270, 288, 297, 630, 297, 288, 270, 668, 270, 629},
    };
    static const uint64_t hash[5] = {0x36de07dab6f78618ull, 0x801567e3597637ccull, 0x5c6348368e4b4f57ull,
                                     0x4608e46c2b1bda5cull, 0xe658c62cb9eded2cull};
    for (int c = 0; c < 5; c++) {
        mkv_sampler_t s = {T[c], P[c], 0};
        mkv_sampler_seed(&s, 2024 + (uint64_t)c);
        for (int k = 0; k < 12; k++)
            cr_assert_eq(mkv_sample(&s, lg, V, scratch), first[c][k], "setting %d, token %d", c, k);
        uint64_t h = 0;
        for (int k = 0; k < 2000; k++) h = h * 1000003u + (uint64_t)mkv_sample(&s, lg, V, scratch);
        cr_assert_eq(h, hash[c], "setting %d: the 2000 tokens after the first 12 differ", c);
    }
}

/* mkv_sample is mkv_sample_with_u on the generator's next uniform, drawn only when due. */
Test(sampling, sample_is_the_choice_for_the_drawn_uniform)
{
    enum { V = 300 };
    float lg[V], scratch[2 * V];
    uint64_t r = 4;
    for (int i = 0; i < V; i++) lg[i] = (float)(rnd(&r) >> 40) * 0x1.0p-24f * 10.0f - 5.0f;
    const float T[4] = {0.0f, 0.5f, 1.0f, 2.0f}, P[4] = {0.3f, 0.9f, 1.0f, 0.0f};
    for (int c = 0; c < 16; c++) {
        mkv_sampler_t a = {T[c / 4], P[c % 4], 0}, b = a;
        mkv_sampler_seed(&a, 99 + (uint64_t)c);
        mkv_sampler_seed(&b, 99 + (uint64_t)c);
        for (int k = 0; k < 50; k++) {
            const uint64_t before = b.state;
            const int draws = mkv_sampler_draws(&b, V);
            cr_assert_eq(draws, T[c / 4] > 0.0f);
            const double u = draws ? mkv_sampler_uniform(&b) : 0.0;
            cr_assert(u >= 0.0 && u < 1.0);
            cr_assert_eq(mkv_sample(&a, lg, V, scratch), mkv_sample_with_u(lg, V, b.temperature, b.top_p, u, scratch));
            cr_assert_eq(a.state, b.state);
            if (!draws) cr_assert_eq(b.state, before, "a greedy pick draws nothing");
        }
    }
    mkv_sampler_t one = {1.0f, 1.0f, 5};
    cr_assert_eq(mkv_sampler_draws(&one, 1), 0, "one token: nothing to draw");
    cr_assert_eq(mkv_sample(&one, lg, 1, scratch), 0);
    cr_assert_eq(one.state, 5u);
}

Test(sampling, low_temperature_and_tiny_top_p_are_the_argmax)
{
    enum { V = 500 };
    float lg[V], scratch[2 * V];
    uint64_t r = 8;
    for (int i = 0; i < V; i++) lg[i] = (float)(rnd(&r) >> 40) * 0x1.0p-24f * 6.0f - 3.0f;
    lg[123] = 3.5f; /* the maximum, 0.5 above every other logit */
    const double us[6] = {0.0, 0x1.0p-53, 0.25, 0.5, 0.999999, 1.0 - 0x1.0p-53};
    for (int k = 0; k < 6; k++) {
        /* 0.5 / 0.001 = 500: every other token's p underflows to 0, no u reaches it */
        cr_assert_eq(mkv_sample_with_u(lg, V, 0.001f, 1.0f, us[k], scratch), 123, "u %.17g", us[k]);
        cr_assert_eq(mkv_sample_with_u(lg, V, 0.001f, 0.9f, us[k], scratch), 123);
        /* top_p tiny: only the most probable token is kept */
        cr_assert_eq(mkv_sample_with_u(lg, V, 1.0f, 1e-6f, us[k], scratch), 123);
        cr_assert_eq(mkv_sample_with_u(lg, V, 3.0f, 1e-6f, us[k], scratch), 123);
        /* temperature <= 0: the argmax whatever u */
        cr_assert_eq(mkv_sample_with_u(lg, V, 0.0f, 0.5f, us[k], scratch), 123);
        cr_assert_eq(mkv_sample_with_u(lg, V, -1.0f, 1.0f, us[k], scratch), 123);
    }
    float one = -2.0f;
    cr_assert_eq(mkv_sample_with_u(&one, 1, 1.0f, 0.5f, 0.7, scratch), 0);
}

Test(sampling, uniform_edges_and_ties_to_the_lower_id)
{
    float scratch[64];
    /* Four equal logits: p = 1 each. Without top-p, id order: u in [k/4, (k+1)/4) picks k. */
    const float eq[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    cr_assert_eq(mkv_sample_with_u(eq, 4, 1.0f, 1.0f, 0.0, scratch), 0);
    cr_assert_eq(mkv_sample_with_u(eq, 4, 1.0f, 1.0f, 0.2499999, scratch), 0);
    cr_assert_eq(mkv_sample_with_u(eq, 4, 1.0f, 1.0f, 0.25, scratch), 1);
    cr_assert_eq(mkv_sample_with_u(eq, 4, 1.0f, 1.0f, 0.75, scratch), 3);
    cr_assert_eq(mkv_sample_with_u(eq, 4, 1.0f, 1.0f, 1.0 - 0x1.0p-53, scratch), 3);
    /* top_p 0.5 of four ties: the two lowest ids, then u in halves. */
    cr_assert_eq(mkv_sample_with_u(eq, 4, 1.0f, 0.5f, 0.0, scratch), 0);
    cr_assert_eq(mkv_sample_with_u(eq, 4, 1.0f, 0.5f, 0.4999999, scratch), 0);
    cr_assert_eq(mkv_sample_with_u(eq, 4, 1.0f, 0.5f, 0.5, scratch), 1);
    cr_assert_eq(mkv_sample_with_u(eq, 4, 1.0f, 0.5f, 1.0 - 0x1.0p-53, scratch), 1);
    /* Sorted order for top-p: descending p, ties by id. 2 and 5 share the largest logit. */
    const float lg[6] = {0.0f, -1.0f, 2.0f, 1.0f, -3.0f, 2.0f};
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 0.99f, 0.0, scratch), 2, "u 0: the first in sorted order");
    const double p3 = (double)(float)exp(-1.0); /* p of 3; 2 and 5 have 1 */
    /* top_p tiny: the first of the tied maxima (the lower id) */
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 1e-6f, 0.999, scratch), 2);
    /* top_p 0.3: 2 alone has 1/z (about 0.42): kept alone */
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 0.3f, 0.999, scratch), 2);
    /* top_p 0.6: 2 and 5 (2/z, about 0.84): u below one half picks 2, above picks 5 */
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 0.6f, 0.49, scratch), 2);
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 0.6f, 0.51, scratch), 5);
    /* top_p 0.9: 2, 5, 3; u at the last of it picks 3 */
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 0.9f, (2.0 + 0.5 * p3) / (2.0 + p3), scratch), 3);
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 0.9f, 1.5 / (2.0 + p3), scratch), 5);
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 0.9f, 1.0 - 0x1.0p-53, scratch), 3);
    /* Without top-p, u 0 picks id 0 and the top of [0, 1) the last id. */
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 1.0f, 0.0, scratch), 0);
    cr_assert_eq(mkv_sample_with_u(lg, 6, 1.0f, 1.0f, 1.0 - 0x1.0p-53, scratch), 5);
    cr_assert_eq(argmax(lg, 6), 2);
}

/* ---------------------------------------------------------------------------------------- */
/* The scheduler: decode_sample against host sampling                                        */
/* ---------------------------------------------------------------------------------------- */

enum { FV = 97, FD = 16, FMAX = 64, FSLOTS = 3 };

/* A model-free pass: the cache sees every call of a real one (one layer, one KV head, d 16,
 * constant tensors), the logits are a hash of (token, position). decode_sample decodes and
 * picks with mkv_sample_with_u, as a device would; it fails on its fail_at-th call. */
typedef struct stand_in {
    float q[FMAX * FD], k[FMAX * FD], v[FMAX * FD], out[FMAX * FD];
    float logits[FSLOTS * FV], scratch[2 * FV];
    int32_t sample_calls, fail_at;
    int32_t batch_calls, batch_most_slots, batch_most_tokens; /* prefill_batch's calls */
} stand_in_t;

static void stand_in_logits(int32_t token, int32_t pos, float *lg)
{
    uint64_t s = (uint64_t)token * 1000003u + (uint64_t)pos;
    for (int i = 0; i < FV; i++) lg[i] = (float)(rnd(&s) >> 40) * 0x1.0p-24f * 6.0f - 3.0f;
}

static mkv_status_t stand_in_prefill(void *ctx, mkv_cache_t *c, int32_t slot, const int32_t *tokens, int32_t n,
                                     float *logits, float *last_logits)
{
    stand_in_t *f = ctx;
    mkv_status_t st = mkv_cache_prefill_layer(c, slot, 0, f->q, f->k, f->v, f->out, NULL);
    if (st == MKV_STATUS_OK) st = mkv_cache_commit_prompt(c, 1, &slot, NULL);
    if (st != MKV_STATUS_OK) return mkv_report_error(st, "%s", mkv_cache_last_error(c));
    for (int32_t t = 0; logits && t < n; t++) stand_in_logits(tokens[t], t, logits + (int64_t)t * FV);
    if (last_logits) stand_in_logits(tokens[n - 1], n - 1, last_logits);
    return MKV_STATUS_OK;
}

/* prefill_batch as a pass offers it: every slot's layer, then one commit of all of them. */
static mkv_status_t stand_in_prefill_batch(void *ctx, mkv_cache_t *c, int32_t n_slots, const int32_t *slots,
                                           const int32_t *tokens, const int32_t *lens, float *last_logits)
{
    stand_in_t *f = ctx;
    int32_t total = 0;
    mkv_status_t st = MKV_STATUS_OK;
    for (int32_t j = 0; j < n_slots && st == MKV_STATUS_OK; j++) {
        int32_t admitted = -1;
        cr_assert_eq(mkv_cache_prompt_len(c, slots[j], &admitted), MKV_STATUS_OK);
        cr_assert_eq(admitted, lens[j], "slot %d: %d tokens for a prompt of %d", slots[j], lens[j], admitted);
        st = mkv_cache_prefill_layer(c, slots[j], 0, f->q, f->k, f->v, f->out, NULL);
        total += lens[j];
        stand_in_logits(tokens[total - 1], lens[j] - 1, last_logits + (int64_t)j * FV);
    }
    if (st == MKV_STATUS_OK) st = mkv_cache_commit_prompt(c, n_slots, slots, NULL);
    if (st != MKV_STATUS_OK) return mkv_report_error(st, "%s", mkv_cache_last_error(c));
    f->batch_calls++;
    if (n_slots > f->batch_most_slots) f->batch_most_slots = n_slots;
    if (total > f->batch_most_tokens) f->batch_most_tokens = total;
    return MKV_STATUS_OK;
}

static mkv_status_t stand_in_decode(void *ctx, mkv_cache_t *c, int32_t n, const int32_t *slots,
                                    const int32_t *tokens, float *logits)
{
    stand_in_t *f = ctx;
    int32_t pos[FSLOTS];
    for (int32_t j = 0; j < n; j++) {
        mkv_slot_info_t si;
        if (mkv_cache_slot_info(c, slots[j], &si) != MKV_STATUS_OK) return MKV_STATUS_INVALID_ARGUMENT;
        pos[j] = si.seq_len;
    }
    mkv_status_t st = mkv_cache_append(c, n, slots, NULL);
    if (st == MKV_STATUS_OK) st = mkv_cache_decode_layer(c, n, slots, 0, f->q, f->k, f->v, f->out, NULL);
    if (st == MKV_STATUS_OK) st = mkv_cache_compress(c, n, slots, NULL);
    if (st != MKV_STATUS_OK) return mkv_report_error(st, "%s", mkv_cache_last_error(c));
    for (int32_t j = 0; j < n; j++) stand_in_logits(tokens[j], pos[j], logits + (int64_t)j * FV);
    return MKV_STATUS_OK;
}

static mkv_status_t stand_in_decode_sample(void *ctx, mkv_cache_t *c, int32_t n, const int32_t *slots,
                                           const int32_t *tokens, const float *temperature, const float *top_p,
                                           const double *u, int32_t *next)
{
    stand_in_t *f = ctx;
    if (++f->sample_calls == f->fail_at) return mkv_report_error(MKV_STATUS_INTERNAL, "stand-in: failing on purpose");
    const mkv_status_t st = stand_in_decode(ctx, c, n, slots, tokens, f->logits);
    if (st != MKV_STATUS_OK) return st;
    for (int32_t j = 0; j < n; j++) {
        if (temperature[j] > 0.0f) cr_assert(u[j] >= 0.0 && u[j] < 1.0, "u[%d] = %g", j, u[j]);
        next[j] = mkv_sample_with_u(f->logits + (int64_t)j * FV, FV, temperature[j], top_p[j], u[j], f->scratch);
    }
    return MKV_STATUS_OK;
}

static mkv_cache_t *stand_in_cache(void)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = 1, cfg.n_kv_heads = 1, cfg.group_size = 1, cfg.head_dim = FD;
    cfg.max_seqs = FSLOTS, cfg.max_seq_len = FMAX;
    cfg.hi_format = cfg.lo_format = MKV_FORMAT_K16V16;
    cfg.alpha_h = cfg.alpha_l = 0.0f;
    cfg.window = 8;
    cr_assert_eq(mkv_page_bytes_for(cfg.hi_format, FD, 0, 0, 8, &cfg.page_bytes), MKV_STATUS_OK);
    cfg.pool_pages = (int64_t)FSLOTS * (FMAX / 8 + 2);
    mkv_cache_t *c = NULL;
    cr_assert_eq(mkv_cache_create(&cfg, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    return c;
}

enum { NREQ = 7, NEW = 20 };

/* NREQ requests of mixed settings (greedy among them), FSLOTS at a time; the outputs into out,
 * the generators' final states into state. fail_at > 0: that decode_sample call fails, the
 * step must leave every generator as it was, and the run stops there. */
static void serve(stand_in_t *f, int with_sample, int with_batch, int32_t fail_at, int32_t out[NREQ][NEW],
                  uint64_t state[NREQ])
{
    static const float T[NREQ] = {0.8f, 0.0f, 1.0f, 1.3f, 0.8f, 0.7f, 0.0f};
    static const float P[NREQ] = {0.9f, 1.0f, 1.0f, 0.5f, 0.9f, 0.05f, 0.9f};
    memset(f, 0, sizeof *f);
    for (int i = 0; i < FMAX * FD; i++) f->q[i] = f->k[i] = f->v[i] = 0.01f * (float)(i % 7);
    f->fail_at = fail_at;
    const mkv_forward_t fw = {.ctx = f, .vocab = FV, .max_positions = FMAX, .max_tokens = FMAX,
                              .prefill = stand_in_prefill, .decode = stand_in_decode,
                              .decode_sample = with_sample ? stand_in_decode_sample : NULL,
                              .prefill_batch = with_batch ? stand_in_prefill_batch : NULL};
    mkv_cache_t *c = stand_in_cache();
    mkv_scheduler_t *s = NULL;
    cr_assert_eq(mkv_scheduler_create(&fw, c, -1, FSLOTS, &s), MKV_STATUS_OK, "%s", mkv_last_error());
    mkv_request_t r[NREQ];
    int32_t prompts[NREQ][16];
    uint64_t rng = 3;
    memset(r, 0, sizeof r);
    for (int i = 0; i < NREQ; i++) {
        for (int t = 0; t < 16; t++) prompts[i][t] = (int32_t)(rnd(&rng) % FV);
        r[i].id = i;
        r[i].prompt = prompts[i];
        r[i].prompt_len = 3 + 2 * i;
        r[i].max_new_tokens = NEW - (i % 3);
        r[i].sampler.temperature = T[i];
        r[i].sampler.top_p = P[i];
        mkv_sampler_seed(&r[i].sampler, 1000 + (uint64_t)i);
        cr_assert_eq(mkv_scheduler_add(s, &r[i]), MKV_STATUS_OK, "%s", mkv_last_error());
    }
    for (int step = 0; !mkv_scheduler_idle(s); step++) {
        uint64_t before[NREQ];
        int was_running[NREQ];
        for (int i = 0; i < NREQ; i++) before[i] = r[i].sampler.state, was_running[i] = r[i].state == MKV_REQ_RUNNING;
        const mkv_status_t st = mkv_scheduler_step(s, NULL);
        if (fail_at > 0 && f->sample_calls == fail_at) {
            cr_assert_eq(st, MKV_STATUS_INTERNAL, "the failing decode_sample's status");
            for (int i = 0; i < NREQ; i++) /* (an admission in the step draws its first token) */
                if (was_running[i])
                    cr_assert_eq(r[i].sampler.state, before[i], "request %d: a failed step advanced its generator", i);
            break;
        }
        cr_assert_eq(st, MKV_STATUS_OK, "%s", mkv_last_error());
        cr_assert_lt(step, 1000);
    }
    for (int i = 0; i < NREQ; i++) {
        if (!fail_at) {
            cr_assert_eq(r[i].state, MKV_REQ_FINISHED);
            for (int t = 0; t < NEW; t++) out[i][t] = t < r[i].n_out ? r[i].out[t] : -1;
            state[i] = r[i].sampler.state;
        }
        free(r[i].out);
    }
    mkv_scheduler_free(s);
    mkv_cache_destroy(c);
}

Test(sampling, scheduler_decode_sample_equals_host_sampling)
{
    static stand_in_t f;
    int32_t host[NREQ][NEW], dev[NREQ][NEW];
    uint64_t hs[NREQ], ds[NREQ];
    serve(&f, 0, 0, 0, host, hs);
    cr_assert_eq(f.sample_calls, 0);
    serve(&f, 1, 0, 0, dev, ds);
    cr_assert_gt(f.sample_calls, 0, "the scheduler never used decode_sample");
    for (int i = 0; i < NREQ; i++) {
        for (int t = 0; t < NEW; t++) cr_assert_eq(dev[i][t], host[i][t], "request %d token %d", i, t);
        cr_assert_eq(ds[i], hs[i], "request %d: another number of draws", i);
    }
    /* a failing decode_sample (its third call) leaves the generators as they were */
    serve(&f, 1, 0, 3, dev, ds);
}

/* The scheduler with prefill_batch: the requests admitted in a step prefilled in one call
 * (FSLOTS at first, their prompts within the pass's max_tokens), and every request's tokens
 * and draws as with prefill slot by slot. */
Test(sampling, scheduler_batched_prefill_equals_one_by_one)
{
    static stand_in_t f;
    int32_t one[NREQ][NEW], batched[NREQ][NEW];
    uint64_t s1[NREQ], sb[NREQ];
    serve(&f, 1, 0, 0, one, s1);
    cr_assert_eq(f.batch_calls, 0);
    serve(&f, 1, 1, 0, batched, sb);
    cr_assert_gt(f.batch_calls, 0, "the scheduler never used prefill_batch");
    cr_assert_eq(f.batch_most_slots, FSLOTS, "the first step's admissions in one call");
    cr_assert_leq(f.batch_most_tokens, FMAX, "a call beyond the pass's max_tokens");
    for (int i = 0; i < NREQ; i++) {
        for (int t = 0; t < NEW; t++) cr_assert_eq(batched[i][t], one[i][t], "request %d token %d", i, t);
        cr_assert_eq(sb[i], s1[i], "request %d: another number of draws", i);
    }
}
