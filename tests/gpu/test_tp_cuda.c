/*
 * test_tp_cuda.c — tensor parallelism (runner/forward_tp.h): one rank is the single-GPU pass
 * exactly (logits bit for bit, the same cache dump); several ranks, where the machine has the
 * GPUs, give the single GPU's greedy tokens on TinyStories and on stand-in weights, and their
 * caches together hold what the single GPU's cache holds (every head-region's high and low
 * counts, rank r's KV head h being the model's r Hkv/n + h); the scheduler over the ranks'
 * caches gives the single GPU's tokens. And what a group refuses.
 *
 * The tests with several ranks skip on a machine with one GPU, saying so.
 */
#include "gpu_util.h"

#include "engine/scheduler.h"
#include "runner/forward_cuda.h"
#include "runner/forward_tp.h"
#include "runner/model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef MIXKV_SHARED_DIR
#define MIXKV_SHARED_DIR "../shared"
#endif

static mkv_model_t *load_or_skip(void) { return test_load_tinystories(MIXKV_SHARED_DIR); }

static int devices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    return n;
}

#define REQUIRE_GPUS(n)                                                                        \
    do {                                                                                       \
        if (devices() < (n)) cr_skip_test("%d GPUs needed, %d present: test skipped", (n), devices()); \
    } while (0)

/* Rank `rank` of n's cache for model shape c: mixkv's policy (window 8, so that tokens are
 * demoted and pruned within short runs), Hkv / n KV heads on device `rank`. */
static mkv_cache_t *rank_cache(const mkv_model_config_t *c, int32_t rank, int32_t n, int32_t max_seqs,
                               int32_t max_len)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = c->n_layers;
    cfg.n_kv_heads = c->n_kv_heads / n;
    cfg.group_size = c->n_heads / c->n_kv_heads;
    cfg.head_dim = c->head_dim;
    cfg.window = 8;
    cfg.max_seqs = max_seqs;
    cfg.max_seq_len = max_len;
    cfg.backend = MKV_BACKEND_CUDA;
    cfg.device_id = rank;
    cr_assert_eq(mkv_page_bytes_for(cfg.hi_format, cfg.head_dim, 0, 0, 16, &cfg.page_bytes), MKV_STATUS_OK);
    cfg.pool_pages = (int64_t)max_seqs * cfg.n_layers * cfg.n_kv_heads * (2 * max_len / 16 + 4);
    mkv_cache_t *k = NULL;
    cr_assert_eq(mkv_cache_create(&cfg, &k), MKV_STATUS_OK, "%s", mkv_last_error());
    return k;
}

/* A group of n ranks over model m (or stand-ins of shape c) with a cache per rank. */
typedef struct group {
    mkv_tp_t *tp;
    mkv_cache_t *caches[MKV_TP_MAX_RANKS];
    mkv_forward_t fw;
    int32_t n;
} group_t;

static void group_make(group_t *g, const mkv_model_t *m, const mkv_model_config_t *c, int32_t n, int32_t max_seqs,
                       int32_t max_len)
{
    char err[MKV_ERR_LEN];
    memset(g, 0, sizeof *g);
    g->n = n;
    cr_assert_eq(mkv_tp_create(m, c, 7, n, max_len, MKV_DTYPE_F32, &g->tp, err), MKV_STATUS_OK, "%s", err);
    for (int32_t r = 0; r < n; r++) g->caches[r] = rank_cache(m ? &m->cfg : c, r, n, max_seqs, max_len);
    cr_assert_eq(mkv_tp_forward(g->tp, g->caches, &g->fw), MKV_STATUS_OK, "%s", mkv_last_error());
}

static void group_free(group_t *g)
{
    mkv_tp_free(g->tp);
    for (int32_t r = 0; r < g->n; r++) mkv_cache_destroy(g->caches[r]);
}

static void admit_all(group_t *g, int32_t len, int32_t *slot)
{
    for (int32_t r = 0; r < g->n; r++) {
        int32_t s;
        cr_assert_eq(mkv_cache_admit(g->caches[r], len, &s), MKV_STATUS_OK, "%s", mkv_cache_last_error(g->caches[r]));
        if (r == 0) *slot = s;
        cr_assert_eq(s, *slot, "rank %d admitted into slot %d, rank 0 into %d", r, s, *slot);
    }
}

/* n_hi, n_lo of every (slot, layer, KV head) in a cache's dump, into hl [slots][L][H][2]
 * (zeros for regions the dump leaves out), the KV head offset by head0. */
static void region_counts(mkv_cache_t *c, int32_t L, int32_t H, int32_t head0, int32_t *hl)
{
    char *json = NULL;
    cr_assert_eq(mkv_cache_dump_json_string(c, &json), MKV_STATUS_OK, "%s", mkv_cache_last_error(c));
    cJSON *root = cJSON_Parse(json);
    cr_assert_not_null(root);
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "rows"), *row;
    cJSON_ArrayForEach(row, rows)
    {
        const int32_t s = cJSON_GetObjectItemCaseSensitive(row, "slot")->valueint;
        const int32_t l = cJSON_GetObjectItemCaseSensitive(row, "layer")->valueint;
        const int32_t h = head0 + cJSON_GetObjectItemCaseSensitive(row, "head")->valueint;
        int32_t *x = hl + (((int64_t)s * L + l) * H + h) * 2;
        x[0] = cJSON_GetObjectItemCaseSensitive(row, "n_hi")->valueint;
        x[1] = cJSON_GetObjectItemCaseSensitive(row, "n_lo")->valueint;
    }
    cJSON_Delete(root);
    mkv_free(json);
}

enum { SLOTS = 3, MAX_LEN = 160, STEPS = 40 };

/* Three prompts through a single-GPU pass (cache `one`) and through group g, then STEPS greedy
 * steps on each (its own tokens): the tokens must be equal. Returns the worst relative
 * difference of the prompts' last logits; bitwise: the logits must be equal bit for bit. */
static double run_both(const mkv_forward_t *single, mkv_cache_t *one, group_t *g, int32_t V, int bitwise)
{
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    const int32_t lens[SLOTS] = {7, 29, 64};
    int32_t slots[SLOTS], ta[SLOTS], tb[SLOTS];
    uint64_t rng = 20261126;
    double worst = 0.0;
    for (int j = 0; j < SLOTS; j++) {
        int32_t prompt[64];
        for (int32_t t = 0; t < lens[j]; t++) prompt[t] = test_rand_range(&rng, 3, V - 1);
        int32_t s1, s2 = -1;
        cr_assert_eq(mkv_cache_admit(one, lens[j], &s1), MKV_STATUS_OK);
        admit_all(g, lens[j], &s2);
        cr_assert_eq(s1, s2);
        slots[j] = s1;
        memset(lb, 0xff, (size_t)V * sizeof(float)); /* NaN: written by rank 0 or caught */
        cr_assert_eq(single->prefill(single->ctx, one, s1, prompt, lens[j], NULL, la), MKV_STATUS_OK, "%s",
                     mkv_last_error());
        cr_assert_eq(g->fw.prefill(g->fw.ctx, g->caches[0], s2, prompt, lens[j], NULL, lb), MKV_STATUS_OK, "%s",
                     mkv_last_error());
        if (bitwise) cr_assert_eq(memcmp(la, lb, (size_t)V * sizeof(float)), 0, "prompt %d: the logits differ", j);
        worst = fmax(worst, test_rel_diff(la, lb, V));
        ta[j] = test_argmax(la, V);
        tb[j] = test_argmax(lb, V);
        cr_assert_eq(ta[j], tb[j], "prompt %d: first token %d on one GPU, %d on %d", j, ta[j], tb[j], g->n);
    }
    for (int32_t s = 0; s < STEPS; s++) {
        int32_t in_a[SLOTS], in_b[SLOTS];
        memcpy(in_a, ta, sizeof in_a);
        memcpy(in_b, tb, sizeof in_b);
        cr_assert_eq(single->decode_greedy(single->ctx, one, SLOTS, slots, in_a, ta), MKV_STATUS_OK, "%s",
                     mkv_last_error());
        cr_assert_eq(g->fw.decode_greedy(g->fw.ctx, g->caches[0], SLOTS, slots, in_b, tb), MKV_STATUS_OK, "%s",
                     mkv_last_error());
        for (int j = 0; j < SLOTS; j++)
            cr_assert_eq(ta[j], tb[j], "step %d, slot %d: token %d on one GPU, %d on %d", s, j, ta[j], tb[j], g->n);
    }
    free(la), free(lb);
    return worst;
}

/* The caches of g together hold what `one` holds: every head-region's counts. */
static void check_union(mkv_cache_t *one, const group_t *g, int32_t L, int32_t H)
{
    const size_t n = (size_t)SLOTS * L * H * 2;
    int32_t *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b);
    region_counts(one, L, H, 0, a);
    for (int32_t r = 0; r < g->n; r++) region_counts(g->caches[r], L, H, r * (H / g->n), b);
    int64_t hi = 0, lo = 0;
    for (size_t i = 0; i < n; i += 2) {
        cr_assert_eq(a[i], b[i], "region %zu: %d high tokens on one GPU, %d over %d", i / 2, a[i], b[i], g->n);
        cr_assert_eq(a[i + 1], b[i + 1], "region %zu: %d low tokens on one GPU, %d over %d", i / 2, a[i + 1],
                     b[i + 1], g->n);
        hi += a[i], lo += a[i + 1];
    }
    cr_assert_gt(lo, 0, "the policy demoted nothing: the comparison would not see the low sections");
    cr_log_info("tp %d: %lld high and %lld low tokens, the same per head-region", g->n, (long long)hi, (long long)lo);
    for (int32_t r = 0; r < g->n; r++)
        cr_assert_eq(mkv_cache_validate(g->caches[r]), MKV_STATUS_OK, "%s", mkv_cache_last_error(g->caches[r]));
    free(a), free(b);
}

Test(tp_cuda, one_rank_is_the_single_gpu_pass)
{
    GPU_REQUIRE();
    mkv_model_t *m = load_or_skip();
    char err[MKV_ERR_LEN];
    mkv_cuda_forward_t *cf = NULL;
    cr_assert_eq(mkv_cuda_forward_create(m, MAX_LEN, MKV_DTYPE_F32, &cf, err), MKV_STATUS_OK, "%s", err);
    const mkv_forward_t single = mkv_cuda_forward(cf);
    mkv_cache_t *one = rank_cache(&m->cfg, 0, 1, SLOTS, MAX_LEN);
    group_t g;
    group_make(&g, m, NULL, 1, SLOTS, MAX_LEN);
    run_both(&single, one, &g, m->cfg.vocab, 1);
    char *a = NULL, *b = NULL;
    cr_assert_eq(mkv_cache_dump_json_string(one, &a), MKV_STATUS_OK);
    cr_assert_eq(mkv_cache_dump_json_string(g.caches[0], &b), MKV_STATUS_OK);
    cr_assert_str_eq(a, b, "one rank's cache differs from the single GPU's");
    check_union(one, &g, m->cfg.n_layers, m->cfg.n_kv_heads);
    mkv_free(a), mkv_free(b);
    group_free(&g);
    mkv_cache_destroy(one);
    mkv_cuda_forward_free(cf);
    mkv_model_free(m);
}

static void ranks_match(int32_t n)
{
    GPU_REQUIRE();
    REQUIRE_GPUS(n);
    mkv_model_t *m = load_or_skip();
    char err[MKV_ERR_LEN];
    mkv_cuda_forward_t *cf = NULL;
    cr_assert_eq(mkv_cuda_forward_create(m, MAX_LEN, MKV_DTYPE_F32, &cf, err), MKV_STATUS_OK, "%s", err);
    const mkv_forward_t single = mkv_cuda_forward(cf);
    mkv_cache_t *one = rank_cache(&m->cfg, 0, 1, SLOTS, MAX_LEN);
    group_t g;
    group_make(&g, m, NULL, n, SLOTS, MAX_LEN);
    /* timed, as serve-bench --phases times it (each rank's events on its own device) */
    cr_assert_eq(mkv_tp_set_timing(g.tp, 1), MKV_STATUS_OK, "%s", mkv_last_error());
    const double worst = run_both(&single, one, &g, m->cfg.vocab, 0);
    for (int32_t r = 0; r < n; r++) {
        double ph[MKV_CUDA_PHASES];
        mkv_cuda_forward_phases(mkv_tp_rank(g.tp, r), ph, 1);
        cr_assert_gt(ph[MKV_CUDA_PHASE_ALL_REDUCE], 0.0, "rank %d: no all-reduce time recorded", r);
        cr_assert_gt(ph[MKV_CUDA_PHASE_GEMM], 0.0, "rank %d: no GEMM time recorded", r);
    }
    cr_log_info("tp %d on TinyStories: prompts' last logits within %.3g of one GPU's", n, worst);
    cr_assert_lt(worst, 1e-4, "tp %d: logits %.3g from one GPU's", n, worst);
    check_union(one, &g, m->cfg.n_layers, m->cfg.n_kv_heads);
    group_free(&g);
    mkv_cache_destroy(one);
    mkv_cuda_forward_free(cf);
    mkv_model_free(m);
}

Test(tp_cuda, two_ranks_match_one_gpu) { ranks_match(2); }
Test(tp_cuda, four_ranks_match_one_gpu) { ranks_match(4); }

/* Stand-in weights: rank r's rows and columns are the whole model's, so two ranks run the
 * model one GPU runs (head_dim 64: the tensor-core decode kernels). */
Test(tp_cuda, dummy_shards_are_the_model)
{
    GPU_REQUIRE();
    REQUIRE_GPUS(2);
    const mkv_model_config_t c = {.hidden = 512, .n_layers = 3, .n_heads = 8, .n_kv_heads = 4, .head_dim = 64,
                                  .intermediate = 1024, .vocab = 1000, .max_pos = 4096, .rope_theta = 10000.0f,
                                  .rms_eps = 1e-5f, .tied = 0, .bos = 1, .eos = 2};
    char err[MKV_ERR_LEN];
    mkv_cuda_forward_t *cf = NULL;
    cr_assert_eq(mkv_cuda_forward_create_dummy(&c, 7, MAX_LEN, MKV_DTYPE_F32, &cf, err), MKV_STATUS_OK, "%s", err);
    const mkv_forward_t single = mkv_cuda_forward(cf);
    mkv_cache_t *one = rank_cache(&c, 0, 1, SLOTS, MAX_LEN);
    group_t g;
    group_make(&g, NULL, &c, 2, SLOTS, MAX_LEN);
    const double worst = run_both(&single, one, &g, c.vocab, 0);
    cr_log_info("tp 2 on stand-ins: prompts' last logits within %.3g of one GPU's", worst);
    cr_assert_lt(worst, 1e-4);
    check_union(one, &g, c.n_layers, c.n_kv_heads);
    group_free(&g);
    mkv_cache_destroy(one);
    mkv_cuda_forward_free(cf);
}

/* The scheduler over the ranks' caches (engine/scheduler.h, create_multi): four requests, two
 * at a time, give the single GPU's tokens. */
Test(tp_cuda, scheduler_over_two_ranks)
{
    GPU_REQUIRE();
    REQUIRE_GPUS(2);
    mkv_model_t *m = load_or_skip();
    enum { REQS = 4, NEW = 24 };
    char err[MKV_ERR_LEN];
    mkv_cuda_forward_t *cf = NULL;
    cr_assert_eq(mkv_cuda_forward_create(m, MAX_LEN, MKV_DTYPE_F32, &cf, err), MKV_STATUS_OK, "%s", err);
    const mkv_forward_t single = mkv_cuda_forward(cf);
    mkv_cache_t *one = rank_cache(&m->cfg, 0, 1, 2, MAX_LEN);
    group_t g;
    group_make(&g, m, NULL, 2, 2, MAX_LEN);
    int32_t prompts[REQS][40], out[2][REQS][NEW];
    uint64_t rng = 99;
    for (int i = 0; i < REQS; i++)
        for (int t = 0; t < 40; t++) prompts[i][t] = test_rand_range(&rng, 3, m->cfg.vocab - 1);
    for (int e = 0; e < 2; e++) {
        mkv_scheduler_t *s = NULL;
        cr_assert_eq(e == 0 ? mkv_scheduler_create(&single, one, -1, 2, &s)
                            : mkv_scheduler_create_multi(&g.fw, g.caches, 2, -1, 2, &s),
                     MKV_STATUS_OK, "%s", mkv_last_error());
        mkv_request_t r[REQS];
        memset(r, 0, sizeof r);
        for (int i = 0; i < REQS; i++) {
            r[i].id = i;
            r[i].prompt = prompts[i];
            r[i].prompt_len = 10 + 9 * i;
            r[i].max_new_tokens = NEW;
            cr_assert_eq(mkv_scheduler_add(s, &r[i]), MKV_STATUS_OK, "%s", mkv_last_error());
        }
        while (!mkv_scheduler_idle(s)) cr_assert_eq(mkv_scheduler_step(s, NULL), MKV_STATUS_OK, "%s", mkv_last_error());
        for (int i = 0; i < REQS; i++) {
            cr_assert_eq(r[i].n_out, NEW);
            memcpy(out[e][i], r[i].out, sizeof out[e][i]);
            free(r[i].out);
        }
        mkv_scheduler_free(s);
    }
    for (int i = 0; i < REQS; i++)
        for (int t = 0; t < NEW; t++)
            cr_assert_eq(out[0][i][t], out[1][i][t], "request %d token %d: %d on one GPU, %d on two", i, t,
                         out[0][i][t], out[1][i][t]);
    for (int32_t r = 0; r < 2; r++) {
        mkv_cache_stats_t st;
        cr_assert_eq(mkv_cache_stats(g.caches[r], &st), MKV_STATUS_OK);
        cr_assert_eq(st.free_pages, st.total_pages, "rank %d: pages still held after every request finished", r);
    }
    group_free(&g);
    mkv_cache_destroy(one);
    mkv_cuda_forward_free(cf);
    mkv_model_free(m);
}

/* What a group refuses: ranks that do not divide the heads, more ranks than GPUs, a cache of
 * the wrong geometry or device, a call handed another cache than rank 0's. */
Test(tp_cuda, refusals)
{
    GPU_REQUIRE();
    mkv_model_t *m = load_or_skip(); /* 8 heads, 4 KV heads, FFN 384 */
    char err[MKV_ERR_LEN];
    mkv_tp_t *tp = NULL;
    cr_assert_eq(mkv_tp_create(m, NULL, 0, 3, 64, MKV_DTYPE_F32, &tp, err), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_null(tp);
    cr_assert(strstr(err, "do not divide"), "%s", err);
    cr_assert_eq(mkv_tp_create(m, NULL, 0, 0, 64, MKV_DTYPE_F32, &tp, err), MKV_STATUS_INVALID_ARGUMENT);
    const int n = devices();
    if (n < 4) {
        cr_assert_eq(mkv_tp_create(m, NULL, 0, 4, 64, MKV_DTYPE_F32, &tp, err), MKV_STATUS_UNSUPPORTED);
        cr_assert(strstr(err, "the runtime sees"), "%s", err);
    }
    cr_assert_eq(mkv_tp_create(m, NULL, 0, 1, 64, MKV_DTYPE_F32, &tp, err), MKV_STATUS_OK, "%s", err);
    mkv_cache_t *wrong = rank_cache(&m->cfg, 0, 2, 1, 64); /* half the KV heads */
    mkv_cache_t *right = rank_cache(&m->cfg, 0, 1, 1, 64);
    mkv_forward_t fw;
    cr_assert_eq(mkv_tp_forward(tp, &wrong, &fw), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_tp_forward(tp, &right, &fw), MKV_STATUS_OK, "%s", mkv_last_error());
    int32_t slot, tok[4] = {5, 6, 7, 8};
    cr_assert_eq(mkv_cache_admit(wrong, 4, &slot), MKV_STATUS_OK);
    cr_assert_eq(fw.prefill(fw.ctx, wrong, slot, tok, 4, NULL, NULL), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(mkv_last_error(), "rank 0"), "%s", mkv_last_error());
    mkv_tp_free(tp);
    mkv_cache_destroy(wrong);
    mkv_cache_destroy(right);
    mkv_model_free(m);
}
