/*
 * test_scheduler_tp.c — the scheduler driving several caches (tensor parallelism): one per
 * rank, each for its share of the KV heads, every decision shared. A model-free pass holds
 * every rank's cache and drives each of them (prefill and commit, append, decode and
 * compress) with pseudo-random q, k, v per layer, head, position and token, so the mixkv
 * policy really keeps, demotes and prunes tokens; its logits mix a hash of (token, position)
 * with the attention outputs of every rank, so the tokens depend on what the caches hold.
 * Checked: one cache through create_multi is create, bit for bit; a rank with fewer pages
 * bounds the batch and triggers the preemptions, while slots stay equal on every rank and
 * every page comes back; a request that can never fit one rank fails; bad arguments.
 */
#include "engine/scheduler.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

enum {
    TV = 97,      /* vocabulary */
    TD = 16,      /* head dimension */
    TG = 2,       /* query heads per KV head */
    TL = 2,       /* layers */
    TMAX = 64,    /* max_seq_len, and the pass's max_tokens */
    TSLOTS = 6,   /* max_seqs and max_batch */
    TMAXH = 2,    /* most KV heads of one rank */
    TRANKS = 2,
    TREQ = 12,
    TSTEPS = 2000,
};

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Element i of tensor kind (0 q, 1 k, 2 v, 3 a key's scale) of a global head at a layer, for
 * token tok at position pos: uniform in [-1, 1), the same on every call. */
static float elem(int kind, int32_t layer, int32_t head, int32_t pos, int32_t tok, int32_t i)
{
    uint64_t s = ((uint64_t)kind * 131 + (uint64_t)layer) * 131 + (uint64_t)head;
    s = ((s * 4099 + (uint64_t)pos) * 1031 + (uint64_t)tok) * 257 + (uint64_t)i;
    return (float)(rnd(&s) >> 40) * 0x1.0p-23f - 1.0f;
}

/* The pass: every rank's cache; rank c holds global KV heads head0[c] .. head0[c] + heads[c] - 1. */
typedef struct tp_pass {
    mkv_cache_t *caches[TRANKS];
    int32_t n_caches, heads[TRANKS], head0[TRANKS];
    float q[TMAX * TMAXH * TG * TD], k[TMAX * TMAXH * TD], v[TMAX * TMAXH * TD], out[TMAX * TMAXH * TG * TD];
    float feature[TSLOTS][TD]; /* per row: the last layer's outputs summed over every query head of every rank */
} tp_pass_t;

/* Rows [n] of rank c's q, k, v at a layer, row t for tokens[t] at positions[t]. Queries are
 * sharp (scaled by 3) and keys of varied length, so that attention, and the significance the
 * policy reads, is uneven. */
static void fill_rows(tp_pass_t *f, int32_t c, int32_t layer, int32_t n, const int32_t *tokens, const int32_t *pos)
{
    const int32_t H = f->heads[c];
    for (int32_t t = 0; t < n; t++)
        for (int32_t h = 0; h < H; h++) {
            const int32_t gh = f->head0[c] + h;
            const float ks = 1.0f + 0.75f * elem(3, layer, gh, pos[t], tokens[t], 0);
            for (int32_t i = 0; i < TD; i++) {
                f->k[((int64_t)t * H + h) * TD + i] = ks * elem(1, layer, gh, pos[t], tokens[t], i);
                f->v[((int64_t)t * H + h) * TD + i] = elem(2, layer, gh, pos[t], tokens[t], i);
                for (int32_t g = 0; g < TG; g++)
                    f->q[(((int64_t)t * H + h) * TG + g) * TD + i] =
                        3.0f * elem(0, layer, gh * TG + g, pos[t], tokens[t], i);
            }
        }
}

/* Adds rank c's output row src_row (of its last layer) into feature row dst_row. */
static void add_feature(tp_pass_t *f, int32_t c, int32_t src_row, int32_t dst_row)
{
    const int32_t HG = f->heads[c] * TG;
    for (int32_t h = 0; h < HG; h++)
        for (int32_t i = 0; i < TD; i++) f->feature[dst_row][i] += f->out[((int64_t)src_row * HG + h) * TD + i];
}

static void logits_of(const tp_pass_t *f, int32_t row, int32_t token, int32_t pos, float *lg)
{
    uint64_t s = (uint64_t)token * 1000003u + (uint64_t)pos;
    for (int32_t i = 0; i < TV; i++)
        lg[i] = (float)(rnd(&s) >> 40) * 0x1.0p-24f * 6.0f - 3.0f + 2.0f * f->feature[row][i % TD];
}

static mkv_status_t tp_prefill(void *ctx, mkv_cache_t *first, int32_t slot, const int32_t *tokens, int32_t n,
                               float *logits, float *last_logits)
{
    tp_pass_t *f = ctx;
    int32_t pos[TMAX];
    cr_assert_eq(first, f->caches[0], "the pass is handed the first cache");
    cr_assert_null(logits, "the scheduler asks for the last logits only");
    for (int32_t t = 0; t < n; t++) pos[t] = t;
    memset(f->feature[0], 0, sizeof f->feature[0]);
    for (int32_t c = 0; c < f->n_caches; c++) {
        mkv_cache_t *cache = f->caches[c];
        mkv_status_t st = MKV_STATUS_OK;
        for (int32_t l = 0; l < TL && st == MKV_STATUS_OK; l++) {
            fill_rows(f, c, l, n, tokens, pos);
            st = mkv_cache_prefill_layer(cache, slot, l, f->q, f->k, f->v, f->out, NULL);
        }
        if (st == MKV_STATUS_OK) st = mkv_cache_commit_prompt(cache, 1, &slot, NULL);
        if (st != MKV_STATUS_OK) return mkv_report_error(st, "rank %d: %s", c, mkv_cache_last_error(cache));
        add_feature(f, c, n - 1, 0);
    }
    logits_of(f, 0, tokens[n - 1], n - 1, last_logits);
    return MKV_STATUS_OK;
}

static mkv_status_t tp_decode(void *ctx, mkv_cache_t *first, int32_t n, const int32_t *slots, const int32_t *tokens,
                              float *logits)
{
    tp_pass_t *f = ctx;
    int32_t pos[TSLOTS];
    cr_assert_eq(first, f->caches[0], "the pass is handed the first cache");
    for (int32_t j = 0; j < n; j++) {
        for (int32_t c = 0; c < f->n_caches; c++) {
            mkv_slot_info_t si;
            cr_assert_eq(mkv_cache_slot_info(f->caches[c], slots[j], &si), MKV_STATUS_OK);
            cr_assert(si.active, "slot %d is not active on rank %d", slots[j], c);
            if (c == 0) pos[j] = si.seq_len;
            cr_assert_eq(si.seq_len, pos[j], "slot %d: rank %d is at %d tokens, rank 0 at %d", slots[j], c,
                         si.seq_len, pos[j]);
        }
        memset(f->feature[j], 0, sizeof f->feature[j]);
    }
    for (int32_t c = 0; c < f->n_caches; c++) {
        mkv_cache_t *cache = f->caches[c];
        mkv_status_t st = mkv_cache_append(cache, n, slots, NULL);
        for (int32_t l = 0; l < TL && st == MKV_STATUS_OK; l++) {
            fill_rows(f, c, l, n, tokens, pos);
            st = mkv_cache_decode_layer(cache, n, slots, l, f->q, f->k, f->v, f->out, NULL);
        }
        if (st == MKV_STATUS_OK) st = mkv_cache_compress(cache, n, slots, NULL);
        if (st != MKV_STATUS_OK) return mkv_report_error(st, "rank %d: %s", c, mkv_cache_last_error(cache));
        for (int32_t j = 0; j < n; j++) add_feature(f, c, j, j);
    }
    for (int32_t j = 0; j < n; j++) logits_of(f, j, tokens[j], pos[j], logits + (int64_t)j * TV);
    return MKV_STATUS_OK;
}

/* A mixkv cache (K8V4 / K4V2, default alphas, window 4, pages of 8 high tokens) of heads KV
 * heads with pool_pages pages; max_seqs slots of max_len tokens and layers layers. */
static mkv_cache_t *tp_cache_of(int32_t heads, int64_t pool_pages, int32_t max_seqs, int32_t max_len,
                                int32_t layers)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = layers, cfg.n_kv_heads = heads, cfg.group_size = TG, cfg.head_dim = TD;
    cfg.max_seqs = max_seqs, cfg.max_seq_len = max_len;
    cfg.window = 4;
    cr_assert_eq(mkv_page_bytes_for(cfg.hi_format, TD, 0, 0, 8, &cfg.page_bytes), MKV_STATUS_OK);
    cfg.pool_pages = pool_pages;
    mkv_cache_t *c = NULL;
    cr_assert_eq(mkv_cache_create(&cfg, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    return c;
}

static mkv_cache_t *tp_cache(int32_t heads, int64_t pool_pages)
{
    return tp_cache_of(heads, pool_pages, TSLOTS, TMAX, TL);
}

/* The pages that TSLOTS requests of TMAX tokens hold in high precision, with heads KV heads. */
static int64_t full_pool(int32_t heads) { return (int64_t)TSLOTS * TL * heads * (TMAX / 8 + 2); }

static mkv_forward_t tp_forward(tp_pass_t *f, mkv_cache_t *const *caches, int32_t n)
{
    memset(f, 0, sizeof *f);
    f->n_caches = n;
    for (int32_t c = 0; c < n; c++) {
        mkv_cache_info_t info;
        cr_assert_eq(mkv_cache_info(caches[c], &info), MKV_STATUS_OK);
        f->caches[c] = caches[c];
        f->heads[c] = info.config.n_kv_heads;
        f->head0[c] = c == 0 ? 0 : f->head0[c - 1] + f->heads[c - 1];
    }
    return (mkv_forward_t){.ctx = f, .vocab = TV, .max_positions = TMAX, .max_tokens = TMAX,
                           .prefill = tp_prefill, .decode = tp_decode};
}

typedef struct workload {
    int32_t prompt[TREQ][TMAX];
    mkv_request_t r[TREQ];
} workload_t;

/* TREQ greedy requests of 4 to 19 prompt tokens and 16 to 43 new ones (growth after the
 * admission is what makes a preemption); every third with a budget of 12 tokens per
 * head-region. No EOS: each makes exactly its max_new_tokens. */
static void make_workload(workload_t *w, uint64_t seed)
{
    memset(w, 0, sizeof *w);
    for (int i = 0; i < TREQ; i++) {
        mkv_request_t *r = &w->r[i];
        r->id = i;
        r->prompt = w->prompt[i];
        r->prompt_len = 4 + (int32_t)(rnd(&seed) % 16);
        r->max_new_tokens = 16 + (int32_t)(rnd(&seed) % 28);
        r->budget = i % 3 == 2 ? 12 : 0;
        for (int32_t t = 0; t < r->prompt_len; t++) w->prompt[i][t] = (int32_t)(rnd(&seed) % TV);
    }
}

static void free_workload(workload_t *w)
{
    for (int i = 0; i < TREQ; i++) free(w->r[i].out);
}

/* What one run did, step by step. */
typedef struct tp_run {
    mkv_sched_stats_t stats[TSTEPS];
    int32_t steps, peak_running, finishes;
    int64_t preempted, admitted, tokens_lo, tokens_pruned;
    int64_t min_available[TRANKS]; /* each cache's fewest available pages after a step */
} tp_run_t;

typedef struct hook_ctx {
    mkv_scheduler_t *s;
    tp_run_t *run;
} hook_ctx_t;

/* At a finish: the hook gets the first cache, reaches the others, and req->kv is the sum of
 * every cache's use (seq_len: the request's tokens but the last, not yet decoded); a budget
 * holds on every cache. */
static mkv_status_t check_finish(void *ctx, const mkv_request_t *req, mkv_cache_t *cache)
{
    hook_ctx_t *h = ctx;
    const int32_t n = mkv_scheduler_n_caches(h->s);
    cr_assert_eq(cache, mkv_scheduler_cache(h->s, 0));
    mkv_slot_info_t sum = {0};
    for (int32_t c = 0; c < n; c++) {
        mkv_slot_info_t si;
        mkv_cache_info_t info;
        cr_assert_eq(mkv_cache_slot_info(mkv_scheduler_cache(h->s, c), req->slot, &si), MKV_STATUS_OK);
        cr_assert_eq(mkv_cache_info(mkv_scheduler_cache(h->s, c), &info), MKV_STATUS_OK);
        cr_assert(si.active, "request %d: its slot is gone from cache %d before the hook", req->id, c);
        cr_assert_eq(si.seq_len, req->prompt_len + req->n_out - 1, "request %d, cache %d", req->id, c);
        if (req->budget > 0)
            cr_assert_leq(si.tokens_hi + si.tokens_lo, (int64_t)req->budget * TL * info.config.n_kv_heads,
                          "request %d: cache %d keeps more than its budget", req->id, c);
        sum.tokens_hi += si.tokens_hi, sum.tokens_lo += si.tokens_lo;
        sum.pages_hi += si.pages_hi, sum.pages_lo += si.pages_lo;
        sum.reserved_pages += si.reserved_pages;
    }
    cr_assert(req->kv.active);
    cr_assert_eq(req->kv.seq_len, req->prompt_len + req->n_out - 1);
    cr_assert_eq(req->kv.tokens_hi, sum.tokens_hi, "request %d", req->id);
    cr_assert_eq(req->kv.tokens_lo, sum.tokens_lo, "request %d", req->id);
    cr_assert_eq(req->kv.pages_hi, sum.pages_hi, "request %d", req->id);
    cr_assert_eq(req->kv.pages_lo, sum.pages_lo, "request %d", req->id);
    cr_assert_eq(req->kv.reserved_pages, sum.reserved_pages, "request %d", req->id);
    h->run->finishes++;
    return MKV_STATUS_OK;
}

/* After a step: every cache valid; every slot active on all caches or on none, at the same
 * length; every running request's slot active; the stats the sums of the caches'. */
static void check_step(mkv_scheduler_t *s, const workload_t *w, const mkv_sched_stats_t *st, tp_run_t *run)
{
    const int32_t n = mkv_scheduler_n_caches(s);
    mkv_sched_stats_t sum = {0};
    for (int32_t c = 0; c < n; c++) {
        mkv_cache_t *cache = mkv_scheduler_cache(s, c);
        mkv_cache_stats_t cs;
        cr_assert_eq(mkv_cache_validate(cache), MKV_STATUS_OK, "step %d, cache %d: %s", run->steps, c,
                     mkv_cache_last_error(cache));
        cr_assert_eq(mkv_cache_stats(cache, &cs), MKV_STATUS_OK);
        cr_assert_eq(cs.active_slots, st->running, "step %d, cache %d", run->steps, c);
        sum.free_pages += cs.free_pages, sum.available_pages += cs.available_pages;
        sum.tokens_hi += cs.tokens_hi, sum.tokens_lo += cs.tokens_lo, sum.tokens_pruned += cs.tokens_pruned;
        if (cs.available_pages < run->min_available[c]) run->min_available[c] = cs.available_pages;
        for (int32_t slot = 0; slot < TSLOTS; slot++) {
            mkv_slot_info_t a, b;
            cr_assert_eq(mkv_cache_slot_info(mkv_scheduler_cache(s, 0), slot, &a), MKV_STATUS_OK);
            cr_assert_eq(mkv_cache_slot_info(cache, slot, &b), MKV_STATUS_OK);
            cr_assert(b.active == a.active && b.seq_len == a.seq_len,
                      "step %d, slot %d: cache %d (active %d, %d tokens) disagrees with cache 0 (%d, %d)",
                      run->steps, slot, c, b.active, b.seq_len, a.active, a.seq_len);
        }
        for (int i = 0; i < TREQ; i++) {
            mkv_slot_info_t si;
            if (w->r[i].state != MKV_REQ_RUNNING) continue;
            cr_assert_eq(mkv_cache_slot_info(cache, w->r[i].slot, &si), MKV_STATUS_OK);
            cr_assert(si.active, "step %d: request %d's slot %d is not active on cache %d", run->steps, i,
                      w->r[i].slot, c);
        }
    }
    cr_assert_eq(st->free_pages, sum.free_pages, "step %d", run->steps);
    cr_assert_eq(st->available_pages, sum.available_pages, "step %d", run->steps);
    cr_assert_eq(st->tokens_hi, sum.tokens_hi, "step %d", run->steps);
    cr_assert_eq(st->tokens_lo, sum.tokens_lo, "step %d", run->steps);
    cr_assert_eq(st->tokens_pruned, sum.tokens_pruned, "step %d", run->steps);
}

/* Serves the workload to the end through s; every request must finish with all its tokens
 * and every cache get all its pages back. */
static void serve(mkv_scheduler_t *s, workload_t *w, tp_run_t *run)
{
    hook_ctx_t h = {s, run};
    memset(run, 0, sizeof *run);
    for (int32_t c = 0; c < TRANKS; c++) run->min_available[c] = INT64_MAX;
    mkv_scheduler_on_finish(s, check_finish, &h);
    for (int i = 0; i < TREQ; i++)
        cr_assert_eq(mkv_scheduler_add(s, &w->r[i]), MKV_STATUS_OK, "%s", mkv_last_error());
    while (!mkv_scheduler_idle(s)) {
        cr_assert_lt(run->steps, TSTEPS, "the scheduler does not finish");
        mkv_sched_stats_t *st = &run->stats[run->steps];
        cr_assert_eq(mkv_scheduler_step(s, st), MKV_STATUS_OK, "step %d: %s", run->steps, mkv_last_error());
        check_step(s, w, st, run);
        if (st->running > run->peak_running) run->peak_running = st->running;
        run->preempted += st->preempted;
        run->admitted += st->admitted;
        if (st->tokens_lo > run->tokens_lo) run->tokens_lo = st->tokens_lo;
        if (st->tokens_pruned > run->tokens_pruned) run->tokens_pruned = st->tokens_pruned;
        run->steps++;
    }
    cr_assert_eq(run->finishes, TREQ);
    for (int i = 0; i < TREQ; i++) {
        cr_assert_eq(w->r[i].state, MKV_REQ_FINISHED, "request %d", i);
        cr_assert_eq(w->r[i].n_out, w->r[i].max_new_tokens, "request %d", i);
    }
    for (int32_t c = 0; c < mkv_scheduler_n_caches(s); c++) {
        mkv_cache_t *cache = mkv_scheduler_cache(s, c);
        mkv_cache_stats_t cs;
        cr_assert_eq(mkv_cache_validate(cache), MKV_STATUS_OK, "cache %d: %s", c, mkv_cache_last_error(cache));
        cr_assert_eq(mkv_cache_stats(cache, &cs), MKV_STATUS_OK);
        cr_assert_eq(cs.free_pages, cs.total_pages, "cache %d: pages leaked", c);
        cr_assert_eq(cs.active_slots, 0, "cache %d", c);
    }
}

/* Runs the workload (seed) over caches with these heads and pools. */
static void serve_on(const int32_t *heads, const int64_t *pools, int32_t n, uint64_t seed, workload_t *w,
                     tp_run_t *run)
{
    static tp_pass_t f;
    mkv_cache_t *caches[TRANKS];
    for (int32_t c = 0; c < n; c++) caches[c] = tp_cache(heads[c], pools[c]);
    const mkv_forward_t fw = tp_forward(&f, caches, n);
    mkv_scheduler_t *s = NULL;
    cr_assert_eq(mkv_scheduler_create_multi(&fw, caches, n, -1, TSLOTS, &s), MKV_STATUS_OK, "%s", mkv_last_error());
    make_workload(w, seed);
    serve(s, w, run);
    mkv_scheduler_free(s);
    for (int32_t c = 0; c < n; c++) mkv_cache_destroy(caches[c]);
}

Test(scheduler, multi_with_one_cache_is_create)
{
    static tp_pass_t f;
    static workload_t a, b;
    static tp_run_t ra, rb;
    for (int multi = 0; multi < 2; multi++) {
        mkv_cache_t *c = tp_cache(2, full_pool(2) / 4); /* a quarter of the pages: preemptions */
        const mkv_forward_t fw = tp_forward(&f, &c, 1);
        mkv_scheduler_t *s = NULL;
        const mkv_status_t st = multi ? mkv_scheduler_create_multi(&fw, &c, 1, -1, TSLOTS, &s)
                                      : mkv_scheduler_create(&fw, c, -1, TSLOTS, &s);
        cr_assert_eq(st, MKV_STATUS_OK, "%s", mkv_last_error());
        cr_assert_eq(mkv_scheduler_n_caches(s), 1);
        cr_assert_eq(mkv_scheduler_cache(s, 0), c);
        cr_assert_null(mkv_scheduler_cache(s, 1));
        make_workload(multi ? &b : &a, 21);
        serve(s, multi ? &b : &a, multi ? &rb : &ra);
        mkv_scheduler_free(s);
        mkv_cache_destroy(c);
    }
    cr_assert_gt(ra.preempted, 0, "the small pool forced no preemption");
    cr_assert_gt(ra.tokens_lo, 0, "the policy demoted nothing");
    cr_assert_gt(ra.tokens_pruned, 0, "the policy pruned nothing");
    cr_assert_eq(rb.steps, ra.steps);
    for (int32_t i = 0; i < ra.steps; i++)
        cr_assert(memcmp(&ra.stats[i], &rb.stats[i], sizeof ra.stats[i]) == 0, "step %d: other stats", i);
    for (int i = 0; i < TREQ; i++) {
        cr_assert_eq(b.r[i].n_out, a.r[i].n_out, "request %d", i);
        cr_assert(memcmp(b.r[i].out, a.r[i].out, (size_t)a.r[i].n_out * sizeof(int32_t)) == 0, "request %d", i);
        cr_assert_eq(b.r[i].preemptions, a.r[i].preemptions, "request %d", i);
        cr_assert(memcmp(&b.r[i].kv, &a.r[i].kv, sizeof a.r[i].kv) == 0, "request %d: other kv", i);
    }
    free_workload(&a);
    free_workload(&b);
}

/* Two ranks of the same geometry; rank 1 has a quarter of rank 0's pages. Rank 1 bounds the
 * batch and causes every preemption (rank 0 alone never runs short); everything else holds. */
Test(scheduler, the_smaller_cache_bounds_the_batch)
{
    static workload_t w;
    static tp_run_t equal, small;
    const int32_t heads[TRANKS] = {2, 2};
    const int64_t big[TRANKS] = {full_pool(2), full_pool(2)}, uneven[TRANKS] = {full_pool(2), full_pool(2) / 4};
    serve_on(heads, big, TRANKS, 5, &w, &equal);
    free_workload(&w);
    serve_on(heads, uneven, TRANKS, 5, &w, &small);
    free_workload(&w);
    cr_assert_eq(equal.preempted, 0, "two full pools ran short");
    cr_assert_eq(equal.peak_running, TSLOTS);
    cr_assert_lt(small.peak_running, equal.peak_running, "the small cache did not bound the batch");
    cr_assert_gt(small.preempted, 0, "the small cache forced no preemption");
    cr_assert_gt(small.admitted, TREQ, "no request was admitted twice");
    cr_assert_gt(small.steps, equal.steps);
    /* Rank 0 could always have run the next step of a full batch by itself. */
    cr_assert_geq(small.min_available[0], 2 * TL * heads[0] * TSLOTS, "cache 0 ran short (%lld pages left)",
                  (long long)small.min_available[0]);
    cr_assert_lt(small.min_available[1], 2 * TL * heads[1] * TSLOTS);
    cr_assert_gt(small.tokens_lo, 0, "the policy demoted nothing");
    cr_assert_gt(small.tokens_pruned, 0, "the policy pruned nothing");
}

/* Three KV heads over two ranks (2 + 1): n_kv_heads may differ. */
Test(scheduler, ranks_with_different_heads)
{
    static workload_t w;
    static tp_run_t run;
    const int32_t heads[TRANKS] = {2, 1};
    const int64_t pools[TRANKS] = {full_pool(2) / 2, full_pool(1) / 2};
    serve_on(heads, pools, TRANKS, 8, &w, &run);
    cr_assert_gt(run.admitted, 0);
    free_workload(&w);
}

/* A request that fits rank 0 but could never fit rank 1 fails (the step says why), and the
 * next request is served; with rank 1 as large as rank 0 it would have run. */
Test(scheduler, a_request_that_never_fits_one_cache_fails)
{
    static tp_pass_t f;
    int32_t prompt[40];
    for (int32_t t = 0; t < 40; t++) prompt[t] = (t * 7) % TV;
    for (int tiny = 1; tiny >= 0; tiny--) {
        /* A 40-token prompt needs L * H * (5 + 1) = 24 pages and a first step of 8: 32. */
        mkv_cache_t *caches[TRANKS] = {tp_cache(2, full_pool(2)), tp_cache(2, tiny ? 30 : full_pool(2))};
        const mkv_forward_t fw = tp_forward(&f, caches, TRANKS);
        mkv_scheduler_t *s = NULL;
        cr_assert_eq(mkv_scheduler_create_multi(&fw, caches, TRANKS, -1, 2, &s), MKV_STATUS_OK, "%s",
                     mkv_last_error());
        mkv_request_t big = {.id = 7, .prompt = prompt, .prompt_len = 40, .max_new_tokens = 8};
        mkv_request_t small = {.id = 8, .prompt = prompt, .prompt_len = 8, .max_new_tokens = 8};
        cr_assert_eq(mkv_scheduler_add(s, &big), MKV_STATUS_OK);
        cr_assert_eq(mkv_scheduler_add(s, &small), MKV_STATUS_OK);
        const mkv_status_t first = mkv_scheduler_step(s, NULL);
        if (tiny) {
            cr_assert_eq(first, MKV_STATUS_OUT_OF_PAGES);
            cr_assert_eq(big.state, MKV_REQ_FAILED);
            cr_assert_eq(big.n_out, 0);
            cr_assert(strstr(mkv_last_error(), "request 7") && strstr(mkv_last_error(), "cache 1"), "message: %s",
                      mkv_last_error());
            cr_assert_eq(small.state, MKV_REQ_RUNNING, "the next request waits behind a failed one");
        } else {
            cr_assert_eq(first, MKV_STATUS_OK, "%s", mkv_last_error());
        }
        for (int step = 0; !mkv_scheduler_idle(s); step++) {
            cr_assert_eq(mkv_scheduler_step(s, NULL), MKV_STATUS_OK, "%s", mkv_last_error());
            cr_assert_lt(step, 100);
        }
        cr_assert_eq(small.state, MKV_REQ_FINISHED);
        cr_assert_eq(small.n_out, 8);
        if (!tiny) cr_assert_eq(big.state, MKV_REQ_FINISHED);
        for (int32_t c = 0; c < TRANKS; c++) {
            mkv_cache_stats_t cs;
            cr_assert_eq(mkv_cache_stats(caches[c], &cs), MKV_STATUS_OK);
            cr_assert_eq(cs.free_pages, cs.total_pages, "cache %d", c);
            mkv_cache_destroy(caches[c]);
        }
        free(big.out);
        free(small.out);
        mkv_scheduler_free(s);
    }
}

/* create_multi refuses, naming the field and the cache, and leaves *out NULL. */
static void expect_refused(const mkv_forward_t *fw, mkv_cache_t *const *caches, int32_t n, const char *words)
{
    int not_a_scheduler;
    mkv_scheduler_t *s = (mkv_scheduler_t *)(void *)&not_a_scheduler;
    cr_assert_eq(mkv_scheduler_create_multi(fw, caches, n, -1, 2, &s), MKV_STATUS_INVALID_ARGUMENT, "%s", words);
    cr_assert_null(s, "%s: *out was not cleared", words);
    cr_assert(strstr(mkv_last_error(), words), "expected '%s' in: %s", words, mkv_last_error());
}

Test(scheduler, multi_refuses_bad_caches)
{
    static tp_pass_t f;
    mkv_cache_t *base = tp_cache(2, 100);
    mkv_cache_t *len = tp_cache_of(2, 100, TSLOTS, TMAX - 8, TL);
    mkv_cache_t *layers = tp_cache_of(2, 100, TSLOTS, TMAX, TL + 1);
    mkv_cache_t *seqs = tp_cache_of(2, 100, TSLOTS - 1, TMAX, TL);
    mkv_cache_t *one_head = tp_cache(1, 50);
    const mkv_forward_t fw = tp_forward(&f, &base, 1);
    expect_refused(&fw, (mkv_cache_t *[]){base, len}, 2, "cache 1's max_seq_len");
    expect_refused(&fw, (mkv_cache_t *[]){base, layers}, 2, "cache 1's n_layers");
    expect_refused(&fw, (mkv_cache_t *[]){base, seqs}, 2, "cache 1's max_seqs");
    expect_refused(&fw, (mkv_cache_t *[]){base, one_head, seqs}, 3, "cache 2's max_seqs");
    expect_refused(&fw, (mkv_cache_t *[]){base, NULL}, 2, "cache 1 is null");
    expect_refused(&fw, (mkv_cache_t *[]){NULL}, 1, "cache 0 is null");
    expect_refused(&fw, (mkv_cache_t *[]){base, base}, 2, "cache 1 is cache 0 again");
    expect_refused(&fw, (mkv_cache_t *[]){base}, 0, "0 caches");
    expect_refused(&fw, (mkv_cache_t *[]){base}, -1, "-1 caches");
    expect_refused(&fw, (mkv_cache_t *[]){base}, MKV_SCHEDULER_MAX_CACHES + 1, "caches, must be in [1, 64]");
    expect_refused(&fw, NULL, 1, "null argument");
    /* n_kv_heads may differ; the accessors give back the caches in order */
    mkv_scheduler_t *s = NULL;
    mkv_cache_t *pair[TRANKS] = {base, one_head};
    cr_assert_eq(mkv_scheduler_create_multi(&fw, pair, TRANKS, -1, 2, &s), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(mkv_scheduler_n_caches(s), TRANKS);
    cr_assert_eq(mkv_scheduler_cache(s, 0), base);
    cr_assert_eq(mkv_scheduler_cache(s, 1), one_head);
    cr_assert_null(mkv_scheduler_cache(s, 2));
    cr_assert_null(mkv_scheduler_cache(s, -1));
    mkv_scheduler_free(s);
    mkv_cache_destroy(base);
    mkv_cache_destroy(len);
    mkv_cache_destroy(layers);
    mkv_cache_destroy(seqs);
    mkv_cache_destroy(one_head);
}
