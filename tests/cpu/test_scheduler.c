/*
 * test_scheduler.c — the host scheduler loop with the bundled model: many requests of random
 * lengths through a small pool force admissions, preemptions and releases. In fp16 mode every
 * request must finish with exactly the tokens it produces alone (greedy), because recompute
 * reproduces a preempted request's state bit for bit; in mixkv mode requests that were never
 * preempted must match their solo run too (batching changes nothing per request), while
 * preempted ones may differ (the recomputed tokens are classified by the prompt-phase policy):
 * the test measures how many do. The cache validates after every step. Also sampling.
 */
#include "engine/scheduler.h"
#include "runner/model.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL_DIR MIXKV_SHARED_DIR "/models/tinystories-656k"
#define N_REQ 14

static mkv_model_t *load_or_skip(void)
{
    if (access(MODEL_DIR "/config.json", R_OK) != 0)
        cr_skip_test("model fixture absent (%s): scheduler tests skipped", MODEL_DIR);
    mkv_model_t *m = NULL;
    char err[512];
    cr_assert_eq(mkv_model_load(MODEL_DIR, &m, err), MKV_STATUS_OK, "%s", err);
    return m;
}

/* A cache for the model: fp16 (K16V16, thresholds 0) or mixkv (K8V4 / K4V2, defaults, with a
 * short window so the policy acts on these short requests); pool_scale of the pages that
 * max_seqs sequences of max_len tokens need in high precision. */
static mkv_cache_t *make_cache(const mkv_model_t *m, int fp16, int32_t max_seqs, int32_t max_len,
                               double pool_scale)
{
    mkv_cache_config_t base = MKV_CACHE_CONFIG_INIT, cfg;
    if (fp16) {
        base.hi_format = base.lo_format = MKV_FORMAT_K16V16;
        base.alpha_h = base.alpha_l = 0.0f;
    }
    base.window = 8;
    base.max_seqs = max_seqs;
    base.max_seq_len = max_len;
    mkv_model_cache_config(m, &base, &cfg);
    /* Pages of 8 high tokens: page boundaries, and so pressure, come often. */
    cr_assert_eq(mkv_page_bytes_for(cfg.hi_format, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group, 8,
                                    &cfg.page_bytes),
                 MKV_STATUS_OK);
    const int64_t full = (int64_t)max_seqs * cfg.n_layers * cfg.n_kv_heads * (max_len / 8 + 2);
    cfg.pool_pages = (int64_t)((double)full * pool_scale) + 1;
    mkv_cache_t *c = NULL;
    cr_assert_eq(mkv_cache_create(&cfg, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    return c;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct workload {
    int32_t prompt[N_REQ][64];
    int32_t prompt_len[N_REQ];
    int32_t max_new[N_REQ];
} workload_t;

/* BOS then random ordinary tokens: the model's output is deterministic, whatever the text. */
static void make_workload(workload_t *w, const mkv_model_t *m, uint64_t seed)
{
    for (int i = 0; i < N_REQ; i++) {
        w->prompt_len[i] = 4 + (int32_t)(rnd(&seed) % 56);
        w->max_new[i] = 8 + (int32_t)(rnd(&seed) % 56);
        w->prompt[i][0] = m->cfg.bos;
        for (int32_t t = 1; t < w->prompt_len[i]; t++)
            w->prompt[i][t] = 3 + (int32_t)(rnd(&seed) % (uint64_t)(m->cfg.vocab - 3));
    }
}

static void init_request(mkv_request_t *r, const workload_t *w, int i)
{
    memset(r, 0, sizeof *r);
    r->id = i;
    r->prompt = w->prompt[i];
    r->prompt_len = w->prompt_len[i];
    r->max_new_tokens = w->max_new[i];
    r->stop_at_eos = 1;
    r->sampler.temperature = 0.0f; /* greedy */
}

typedef struct run_stats {
    int64_t steps, admitted, preempted;
} run_stats_t;

/* Runs requests ids[n] through one cache of max_batch slots and pool_scale of the pool that
 * holds them all at full length; reqs get their outputs. */
static void run(const mkv_model_t *m, int fp16, const workload_t *w, mkv_request_t *reqs,
                const int *ids, int n, int32_t max_batch, double pool_scale, run_stats_t *rs)
{
    mkv_cache_t *c = make_cache(m, fp16, max_batch, 128, pool_scale);
    mkv_scheduler_t *s = NULL;
    mkv_forward_ws_t *ws = NULL;
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_forward_ws_create(m, 128, &ws, err), MKV_STATUS_OK, "%s", err);
    const mkv_forward_t fwd = mkv_model_forward(ws);
    cr_assert_eq(mkv_scheduler_create(&fwd, c, m->cfg.eos, max_batch, &s), MKV_STATUS_OK, "%s",
                 mkv_last_error());
    for (int k = 0; k < n; k++) {
        init_request(&reqs[ids[k]], w, ids[k]);
        cr_assert_eq(mkv_scheduler_add(s, &reqs[ids[k]]), MKV_STATUS_OK, "%s", mkv_last_error());
    }
    memset(rs, 0, sizeof *rs);
    while (!mkv_scheduler_idle(s)) {
        mkv_sched_stats_t st;
        cr_assert_eq(mkv_scheduler_step(s, &st), MKV_STATUS_OK, "step %lld: %s",
                     (long long)rs->steps, mkv_last_error());
        cr_assert_eq(mkv_cache_validate(c), MKV_STATUS_OK, "step %lld: %s", (long long)rs->steps,
                     mkv_cache_last_error(c));
        cr_assert_leq(st.running, max_batch);
        rs->admitted += st.admitted;
        rs->preempted += st.preempted;
        cr_assert_lt(++rs->steps, 100000, "the scheduler does not finish");
    }
    for (int k = 0; k < n; k++) cr_assert_eq(reqs[ids[k]].state, MKV_REQ_FINISHED, "request %d", ids[k]);
    mkv_cache_stats_t cs;
    mkv_cache_stats(c, &cs);
    cr_assert_eq(cs.free_pages, cs.total_pages, "pages leaked after every request finished");
    mkv_scheduler_free(s);
    mkv_forward_ws_free(ws);
    mkv_cache_destroy(c);
}

static int same_output(const mkv_request_t *a, const mkv_request_t *b)
{
    return a->n_out == b->n_out && memcmp(a->out, b->out, (size_t)a->n_out * sizeof(int32_t)) == 0;
}

static void free_outputs(mkv_request_t *r, int n)
{
    for (int i = 0; i < n; i++) free(r[i].out);
}

/* Solo runs of every request, then all together under pressure. */
static void compare(int fp16, int *differ_preempted, int *preempted_requests, run_stats_t *together)
{
    mkv_model_t *m = load_or_skip();
    workload_t w;
    make_workload(&w, m, fp16 ? 11 : 12);
    mkv_request_t alone[N_REQ], all[N_REQ];
    int ids[N_REQ];
    for (int i = 0; i < N_REQ; i++) ids[i] = i;
    run_stats_t rs;
    for (int i = 0; i < N_REQ; i++) run(m, fp16, &w, alone, &ids[i], 1, 1, 1.0, &rs);
    /* 6 slots, a pool of 25% of what 6 full-length requests would need: preemption is forced. */
    run(m, fp16, &w, all, ids, N_REQ, 6, 0.25, together);
    cr_assert_gt(together->preempted, 0, "the small pool forced no preemption");
    cr_assert_gt(together->admitted, N_REQ, "no request was admitted twice");
    *differ_preempted = *preempted_requests = 0;
    for (int i = 0; i < N_REQ; i++) {
        if (all[i].preemptions > 0) {
            (*preempted_requests)++;
            *differ_preempted += !same_output(&all[i], &alone[i]);
        } else {
            cr_assert(same_output(&all[i], &alone[i]),
                      "request %d, never preempted, differs from its solo run (%d vs %d tokens)", i,
                      all[i].n_out, alone[i].n_out);
        }
    }
    free_outputs(alone, N_REQ);
    free_outputs(all, N_REQ);
    mkv_model_free(m);
}

Test(scheduler, fp16_preemption_reproduces_solo_outputs)
{
    int differ, preempted;
    run_stats_t rs;
    compare(1, &differ, &preempted, &rs);
    cr_assert_gt(preempted, 0);
    cr_assert_eq(differ, 0, "%d of %d preempted requests changed their output in fp16 mode", differ,
                 preempted);
}

Test(scheduler, mixkv_batching_changes_nothing_and_preemption_is_measured)
{
    int differ, preempted;
    run_stats_t rs;
    compare(0, &differ, &preempted, &rs);
    cr_assert_gt(preempted, 0);
    /* Recorded in docs/model.md: how many preempted mixkv requests changed their output. */
    fprintf(stderr, "mixkv: %d of %d preempted requests produced a different output "
            "(%lld steps, %lld admissions, %lld preemptions)\n",
            differ, preempted, (long long)rs.steps, (long long)rs.admitted, (long long)rs.preempted);
}

Test(scheduler, rejects_requests_that_cannot_fit)
{
    mkv_model_t *m = load_or_skip();
    mkv_cache_t *c = make_cache(m, 1, 2, 64, 1.0);
    mkv_scheduler_t *s = NULL;
    mkv_forward_ws_t *ws = NULL, *small = NULL;
    char err[MKV_ERR_LEN];
    cr_assert_eq(mkv_forward_ws_create(m, 64, &ws, err), MKV_STATUS_OK, "%s", err);
    const mkv_forward_t fwd = mkv_model_forward(ws);
    cr_assert_eq(mkv_scheduler_create(&fwd, c, m->cfg.eos, 2, &s), MKV_STATUS_OK);
    /* a forward pass that cannot take a whole sequence (a preempted request's recompute) */
    cr_assert_eq(mkv_forward_ws_create(m, 32, &small, err), MKV_STATUS_OK, "%s", err);
    const mkv_forward_t fs = mkv_model_forward(small);
    mkv_scheduler_t *s2 = NULL;
    cr_assert_eq(mkv_scheduler_create(&fs, c, m->cfg.eos, 2, &s2), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_null(s2);
    mkv_forward_t broken = fwd;
    broken.decode = NULL;
    cr_assert_eq(mkv_scheduler_create(&broken, c, m->cfg.eos, 2, &s2), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_null(s2);
    mkv_forward_ws_free(small);
    int32_t prompt[80] = {1};
    mkv_request_t r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.prompt_len = 60;
    r.max_new_tokens = 10; /* 70 > max_seq_len 64 */
    cr_assert_eq(mkv_scheduler_add(s, &r), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_neq(mkv_last_error()[0], '\0');
    r.prompt_len = 10;
    r.max_new_tokens = 5;
    prompt[3] = m->cfg.vocab; /* out of the vocabulary */
    cr_assert_eq(mkv_scheduler_add(s, &r), MKV_STATUS_INVALID_ARGUMENT);
    mkv_scheduler_t *s3 = NULL;
    cr_assert_eq(mkv_scheduler_create(&fwd, c, m->cfg.eos, 3, &s3), MKV_STATUS_INVALID_ARGUMENT,
                 "max_batch above the cache's slots");
    cr_assert_null(s3);
    free(r.out);
    mkv_scheduler_free(s);
    mkv_forward_ws_free(ws);
    mkv_cache_destroy(c);
    mkv_model_free(m);
}

Test(sampling, greedy_temperature_top_p)
{
    float logits[6] = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f, 0.0f};
    float scratch[12];
    mkv_sampler_t g = {0.0f, 1.0f, 0};
    cr_assert_eq(mkv_sample(&g, logits, 6, scratch), 1, "greedy: the first of two maxima");
    /* top_p tiny: only the most probable token (ties to the lower id) can be drawn. */
    mkv_sampler_t s = {1.0f, 1e-6f, 0};
    mkv_sampler_seed(&s, 7);
    for (int i = 0; i < 100; i++) cr_assert_eq(mkv_sample(&s, logits, 6, scratch), 1);
    /* Temperature 1, top_p 1: frequencies follow the softmax (6 tokens, 60000 draws). */
    mkv_sampler_t t = {1.0f, 1.0f, 0};
    mkv_sampler_seed(&t, 42);
    int count[6] = {0};
    for (int i = 0; i < 60000; i++) count[mkv_sample(&t, logits, 6, scratch)]++;
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(logits[i]);
    for (int i = 0; i < 6; i++) {
        const double want = 60000.0 * exp(logits[i]) / z;
        cr_assert(fabs(count[i] - want) < 5.0 * sqrt(want) + 5, "token %d: %d draws, expected %.0f", i,
                  count[i], want);
    }
    /* The same seed gives the same sequence. */
    mkv_sampler_t a = {0.8f, 0.9f, 0}, b = {0.8f, 0.9f, 0};
    mkv_sampler_seed(&a, 5);
    mkv_sampler_seed(&b, 5);
    for (int i = 0; i < 200; i++)
        cr_assert_eq(mkv_sample(&a, logits, 6, scratch), mkv_sample(&b, logits, 6, scratch));
}

/* Recompute is exact in fp16 mode: the logits after decoding k tokens equal, bit for bit, the
 * last logits of one prefill over the prompt and those k tokens (what a preempted request is
 * recomputed from). */
Test(scheduler, recompute_is_bitwise_exact_in_fp16)
{
    mkv_model_t *m = load_or_skip();
    const int32_t V = m->cfg.vocab, P = 23, K = 17;
    uint64_t seed = 99;
    int32_t toks[64];
    toks[0] = m->cfg.bos;
    for (int32_t t = 1; t < P + K; t++) toks[t] = 3 + (int32_t)(rnd(&seed) % (uint64_t)(V - 3));
    float *dec = malloc((size_t)V * sizeof(float)), *pre = malloc((size_t)V * sizeof(float));
    char err[512];
    mkv_forward_ws_t *ws = NULL;
    cr_assert_eq(mkv_forward_ws_create(m, 64, &ws, err), MKV_STATUS_OK, "%s", err);
    mkv_cache_t *a = make_cache(m, 1, 1, 64, 1.0), *b = make_cache(m, 1, 1, 64, 1.0);
    int32_t sa, sb;
    cr_assert_eq(mkv_cache_admit(a, P, &sa), MKV_STATUS_OK);
    cr_assert_eq(mkv_model_prefill(m, a, sa, toks, P, NULL, dec, ws), MKV_STATUS_OK, "%s", mkv_last_error());
    for (int32_t t = P; t < P + K; t++)
        cr_assert_eq(mkv_model_decode(m, a, 1, &sa, &toks[t], dec, ws), MKV_STATUS_OK, "%s",
                     mkv_last_error());
    cr_assert_eq(mkv_cache_admit(b, P + K, &sb), MKV_STATUS_OK);
    cr_assert_eq(mkv_model_prefill(m, b, sb, toks, P + K, NULL, pre, ws), MKV_STATUS_OK, "%s",
                 mkv_last_error());
    int32_t diff = 0;
    for (int32_t i = 0; i < V; i++) diff += memcmp(&dec[i], &pre[i], sizeof(float)) != 0;
    cr_assert_eq(diff, 0, "%d of %d logits differ between decode and recompute (first: %.9g vs %.9g)",
                 diff, V, (double)dec[0], (double)pre[0]);
    mkv_cache_destroy(a);
    mkv_cache_destroy(b);
    mkv_forward_ws_free(ws);
    free(dec);
    free(pre);
    mkv_model_free(m);
}
