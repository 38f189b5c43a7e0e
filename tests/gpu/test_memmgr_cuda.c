/*
 * test_memmgr_cuda.c — the CUDA memory manager (memmgr/cuda_mm.cu) against the CPU reference.
 * The same calls on a CPU cache and a CUDA cache of one config must return the same statuses
 * and messages, the same stats, slot infos and step demands, and byte-identical dumps; bad
 * input is refused alike and changes nothing; mkv_cache_validate sees corrupted state; the KV
 * data calls answer UNSUPPORTED on CUDA; a Llama-sized geometry (16k head-regions per call,
 * multi-block kernels, CUB scans of 32k sections) matches too. Every test skips without a GPU.
 */
#include "gpu_util.h"
#include "memmgr/cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK MKV_STATUS_OK

/* ---- A CPU cache and a CUDA cache of one config ------------------------------------------ */

typedef struct pair {
    mkv_cache_t *cpu, *gpu;
    int32_t L, H, S, M, LH;
    int64_t P;
    int32_t *d_hi, *d_lo; /* device resize targets, [(S + 2) * L * H] */
} pair_t;

static mkv_cache_config_t small_config(int32_t L, int32_t H, int32_t S, int32_t M, int32_t d,
                                       mkv_format_t hi, mkv_format_t lo, int32_t hi_tpp, int64_t P)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = L, cfg.n_kv_heads = H, cfg.max_seqs = S, cfg.max_seq_len = M, cfg.head_dim = d;
    cfg.hi_key_group = cfg.hi_value_group = cfg.lo_key_group = cfg.lo_value_group = 256;
    cfg.hi_format = hi, cfg.lo_format = lo, cfg.pool_pages = P, cfg.window = 8;
    cfg.flags = MKV_CACHE_METADATA_ONLY;
    cr_assert_eq(mkv_page_bytes_for(hi, d, 256, 256, hi_tpp, &cfg.page_bytes), OK, "%s", mkv_last_error());
    return cfg;
}

static void pair_create(pair_t *p, mkv_cache_config_t cfg, int32_t cpu_threads)
{
    memset(p, 0, sizeof *p);
    cfg.backend = MKV_BACKEND_CPU, cfg.n_threads = cpu_threads;
    mkv_status_t s = mkv_cache_create(&cfg, &p->cpu);
    cr_assert_eq(s, OK, "CPU cache: %s (%s)", mkv_status_string(s), mkv_last_error());
    cfg.backend = MKV_BACKEND_CUDA, cfg.device_id = 0, cfg.n_threads = 1;
    s = mkv_cache_create(&cfg, &p->gpu);
    cr_assert_eq(s, OK, "CUDA cache: %s (%s)", mkv_status_string(s), mkv_last_error());
    p->L = cfg.n_layers, p->H = cfg.n_kv_heads, p->S = cfg.max_seqs, p->M = cfg.max_seq_len;
    p->LH = p->L * p->H, p->P = cfg.pool_pages;
    const size_t n = (size_t)(p->S + 2) * p->LH;
    CUDA_CHECK(cudaMalloc((void **)&p->d_hi, n * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc((void **)&p->d_lo, n * sizeof(int32_t)));
    gpu_poison_i32(p->d_hi, n);
    gpu_poison_i32(p->d_lo, n);
}

static void pair_destroy(pair_t *p)
{
    mkv_cache_destroy(p->cpu), mkv_cache_destroy(p->gpu);
    cudaFree(p->d_hi), cudaFree(p->d_lo);
}

/* A resize (or resize_check) on one side: the CUDA side gets its targets in device memory. */
static mkv_status_t resize_on(pair_t *p, int gpu, const mkv_resize_t *rz, int dry)
{
    mkv_cache_t *c = gpu ? p->gpu : p->cpu;
    mkv_resize_t d;
    if (gpu && rz) {
        d = *rz;
        const int64_t n = rz->n_slots < 0 ? 0 : rz->n_slots > p->S + 2 ? p->S + 2 : rz->n_slots;
        const size_t bytes = (size_t)n * p->LH * sizeof(int32_t);
        if (rz->n_hi) {
            if (bytes) CUDA_CHECK(cudaMemcpy(p->d_hi, rz->n_hi, bytes, cudaMemcpyHostToDevice));
            d.n_hi = p->d_hi;
        }
        if (rz->n_lo) {
            if (bytes) CUDA_CHECK(cudaMemcpy(p->d_lo, rz->n_lo, bytes, cudaMemcpyHostToDevice));
            d.n_lo = p->d_lo;
        }
        rz = &d;
    }
    return dry ? mkv_cache_resize_check(c, rz) : mkv_cache_resize(c, rz, NULL);
}

/* Same status and same message on both sides. */
static void expect_same(const pair_t *p, const char *where, mkv_status_t sc, mkv_status_t sg)
{
    cr_assert_eq(sc, sg, "%s: CPU '%s' (%s), CUDA '%s' (%s)", where, mkv_status_string(sc),
                 mkv_cache_last_error(p->cpu), mkv_status_string(sg), mkv_cache_last_error(p->gpu));
    cr_assert_str_eq(mkv_cache_last_error(p->cpu), mkv_cache_last_error(p->gpu),
                     "%s: messages differ: CPU '%s', CUDA '%s'", where, mkv_cache_last_error(p->cpu),
                     mkv_cache_last_error(p->gpu));
}

static char *dump_of(mkv_cache_t *c, const char *where)
{
    char *s = NULL;
    const mkv_status_t st = mkv_cache_dump_json_string(c, &s);
    cr_assert_eq(st, OK, "%s: dump: %s (%s)", where, mkv_status_string(st), mkv_cache_last_error(c));
    return s;
}

/* Fails at the first differing line of two dumps, printing both. */
static void expect_same_text(const char *a, const char *b, const char *wa, const char *wb,
                             const char *where)
{
    if (strcmp(a, b) == 0) return;
    size_t i = 0, line = 1, start = 0;
    for (; a[i] && a[i] == b[i]; i++)
        if (a[i] == '\n') line++, start = i + 1;
    const int la = (int)strcspn(a + start, "\n"), lb = (int)strcspn(b + start, "\n");
    cr_assert_fail("%s: dumps differ at line %zu:\n  %s: %.*s\n  %s: %.*s", where, line, wa,
                   la > 400 ? 400 : la, a + start, wb, lb > 400 ? 400 : lb, b + start);
}

static void expect_same_dumps(pair_t *p, const char *where)
{
    char *a = dump_of(p->cpu, where), *b = dump_of(p->gpu, where);
    expect_same_text(a, b, "CPU ", "CUDA", where);
    mkv_free(a);
    mkv_free(b);
}

#define CMP_FIELD(a, b, f, what)                                                               \
    cr_assert_eq((a).f, (b).f, "%s: %s." #f ": CPU %lld, CUDA %lld", where, what,               \
                 (long long)(a).f, (long long)(b).f)

static void expect_same_stats(const pair_t *p, const char *where)
{
    mkv_cache_stats_t a, b;
    mkv_status_t sa = mkv_cache_stats(p->cpu, &a), sb = mkv_cache_stats(p->gpu, &b);
    cr_assert(sa == OK && sb == OK, "%s: stats: %d / %d (%s)", where, sa, sb, mkv_last_error());
    CMP_FIELD(a, b, total_pages, "stats"); CMP_FIELD(a, b, free_pages, "stats");
    CMP_FIELD(a, b, reserved_pages, "stats"); CMP_FIELD(a, b, available_pages, "stats");
    CMP_FIELD(a, b, pages_hi, "stats"); CMP_FIELD(a, b, pages_lo, "stats");
    CMP_FIELD(a, b, tokens_hi, "stats"); CMP_FIELD(a, b, tokens_lo, "stats");
    CMP_FIELD(a, b, tokens_seen, "stats"); CMP_FIELD(a, b, tokens_pruned, "stats");
    CMP_FIELD(a, b, active_slots, "stats"); CMP_FIELD(a, b, bytes_in_use, "stats");
    CMP_FIELD(a, b, bytes_fp16, "stats");
}

/* Slot infos of every slot and the step demand of every active slot, then validation. */
static void expect_same_details(pair_t *p, const char *where)
{
    int32_t active[256], n = 0;
    for (int32_t s = 0; s < p->S; s++) {
        mkv_slot_info_t a, b;
        expect_same(p, where, mkv_cache_slot_info(p->cpu, s, &a), mkv_cache_slot_info(p->gpu, s, &b));
        CMP_FIELD(a, b, active, "slot_info"); CMP_FIELD(a, b, seq_len, "slot_info");
        CMP_FIELD(a, b, reserved_pages, "slot_info"); CMP_FIELD(a, b, tokens_hi, "slot_info");
        CMP_FIELD(a, b, tokens_lo, "slot_info"); CMP_FIELD(a, b, pages_hi, "slot_info");
        CMP_FIELD(a, b, pages_lo, "slot_info");
        if (a.active && n < 256) active[n++] = s;
    }
    int64_t da = -1, db = -2;
    expect_same(p, where, mkv_cache_step_demand(p->cpu, n, active, &da),
                mkv_cache_step_demand(p->gpu, n, active, &db));
    cr_assert_eq(da, db, "%s: step demand of %d slots: CPU %lld, CUDA %lld", where, n,
                 (long long)da, (long long)db);
    cr_assert_eq(mkv_cache_validate(p->cpu), OK, "%s: CPU: %s", where, mkv_cache_last_error(p->cpu));
    cr_assert_eq(mkv_cache_validate(p->gpu), OK, "%s: CUDA: %s", where, mkv_cache_last_error(p->gpu));
}

/* Calls that must succeed on both. */
static int32_t both_admit(pair_t *p, int32_t len)
{
    int32_t a = -1, b = -2;
    expect_same(p, "admit", mkv_cache_admit(p->cpu, len, &a), mkv_cache_admit(p->gpu, len, &b));
    cr_assert_eq(mkv_cache_last_error(p->cpu)[0], '\0', "admit(%d): %s", len, mkv_cache_last_error(p->cpu));
    cr_assert_eq(a, b, "admit(%d): CPU slot %d, CUDA slot %d", len, a, b);
    return a;
}

static void both_resize(pair_t *p, const mkv_resize_t *rz, const char *where)
{
    const mkv_status_t sc = resize_on(p, 0, rz, 0), sg = resize_on(p, 1, rz, 0);
    expect_same(p, where, sc, sg);
    cr_assert_eq(sc, OK, "%s: %s", where, mkv_cache_last_error(p->cpu));
}

static void both_append(pair_t *p, int32_t n, const int32_t *slots, const char *where)
{
    const mkv_status_t sc = mkv_cache_append(p->cpu, n, slots, NULL);
    const mkv_status_t sg = mkv_cache_append(p->gpu, n, slots, NULL);
    expect_same(p, where, sc, sg);
    cr_assert_eq(sc, OK, "%s: %s", where, mkv_cache_last_error(p->cpu));
}

/* ---- 1. Random operation sequences on both backends -------------------------------------- */

#define MAX_S 8
#define MAX_LH 16

enum { K_ADMIT, K_APPEND, K_GROW, K_SHRINK, K_MIXED, K_PLACE, K_RELEASE, K_OVER, K_BAD, K_CHECK, K_COUNT };
static const char *const k_names[K_COUNT] = {"admit", "append", "grow", "shrink", "mixed",
                                             "place", "release", "over", "bad", "check"};
static const int k_weights[K_COUNT] = {13, 24, 10, 11, 12, 7, 9, 5, 5, 4};
enum { C_ADMIT, C_APPEND, C_RELEASE, C_RESIZE, C_CHECK };

typedef struct rop {
    int k, call, null_targets, use_seq_len;
    int32_t prompt_len, slot, n;
    int32_t slots[MAX_S + 2], seq_len[MAX_S + 2];
    int32_t hi[(MAX_S + 2) * MAX_LH], lo[(MAX_S + 2) * MAX_LH];
} rop_t;

static int32_t rnd(uint64_t *r, int32_t lo, int32_t hi) { return hi < lo ? lo : test_rand_range(r, lo, hi); }

/* Active slots (with room to append when `room`), shuffled; returns how many. */
static int32_t active_slots(uint64_t *r, const pair_t *p, int room, int32_t *out)
{
    const mkv_mm_state_t *s = &p->cpu->st;
    int32_t n = 0;
    for (int32_t i = 0; i < p->S; i++)
        if (s->active[i] && (!room || s->seq_len[i] < p->M)) out[n++] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        const int32_t k = rnd(r, 0, i), t = out[i];
        out[i] = out[k];
        out[k] = t;
    }
    return n;
}

/* A free slot, or one out of range. */
static int32_t bad_slot(uint64_t *r, const pair_t *p)
{
    for (int32_t i = 0; i < p->S; i++)
        if (!p->cpu->st.active[i] && rnd(r, 0, 1)) return i;
    return rnd(r, 0, 1) ? p->S : -1 - rnd(r, 0, 2);
}

/* Invalid input that is not a resize. */
static void draw_bad_simple(uint64_t *r, const pair_t *p, rop_t *op, int32_t avail)
{
    const mkv_mm_state_t *s = &p->cpu->st;
    switch (rnd(r, 0, 3)) {
    case 0: op->call = C_ADMIT; op->prompt_len = rnd(r, 0, 1) ? -rnd(r, 0, 2) : p->M + rnd(r, 1, 5); return;
    case 1: op->call = C_RELEASE; op->slot = bad_slot(r, p); return;
    case 2: /* append: a full, free, out-of-range or repeated slot */
        op->call = C_APPEND;
        op->n = avail > 0 ? rnd(r, 1, avail) : 1;
        if (avail == 0) op->slots[0] = bad_slot(r, p);
        else if (rnd(r, 0, 1)) op->slots[op->n++] = op->slots[0];
        else op->slots[op->n - 1] = bad_slot(r, p);
        for (int32_t i = 0; i < p->S; i++)
            if (s->active[i] && s->seq_len[i] == p->M) op->slots[0] = i; /* full: INVALID too */
        return;
    default: op->call = C_APPEND; op->n = rnd(r, 0, 1) ? -1 : p->S + 1; return;
    }
}

static void draw(uint64_t *r, const pair_t *p, rop_t *op)
{
    const mkv_mm_state_t *s = &p->cpu->st;
    const int32_t LH = p->LH, M = p->M;
    int pick = rnd(r, 0, 99), k = 0;
    while (pick >= k_weights[k]) pick -= k_weights[k++];
    memset(op, 0, sizeof *op);
    op->k = k;
    const int32_t avail = active_slots(r, p, k == K_APPEND, op->slots);
    if (k == K_BAD && (avail == 0 || rnd(r, 0, 3) == 0)) {
        draw_bad_simple(r, p, op, avail);
        return;
    }
    if (k == K_ADMIT || avail == 0) { /* also when no slot can take the drawn operation */
        op->k = K_ADMIT, op->call = C_ADMIT;
        op->prompt_len = rnd(r, 0, 2) ? rnd(r, 1, 8) : rnd(r, 1, M);
        return;
    }
    if (k == K_RELEASE) {
        op->call = C_RELEASE, op->slot = op->slots[0];
        return;
    }
    const int32_t n = op->n = rnd(r, 1, avail);
    if (k == K_APPEND) {
        op->call = C_APPEND, op->n = rnd(r, 0, 24) ? n : 0; /* sometimes a no-op */
        return;
    }
    op->call = k == K_CHECK ? C_CHECK : C_RESIZE;
    const int v = k == K_CHECK ? (rnd(r, 0, 5) == 0 ? K_OVER : rnd(r, K_GROW, K_PLACE))
                  : k == K_BAD ? rnd(r, K_GROW, K_MIXED) : k;
    op->use_seq_len = v != K_SHRINK || rnd(r, 0, 1);
    for (int32_t j = 0; j < n; j++) {
        int32_t N = s->seq_len[op->slots[j]];
        if (v == K_GROW) N += rnd(r, 0, 8);
        else if (v == K_MIXED || (v == K_SHRINK && op->use_seq_len)) N += rnd(r, 0, 3);
        else if (v == K_PLACE && N == 0) N = rnd(r, 1, M);
        else if (v == K_OVER) N = M;
        N = N > M ? M : N;
        op->seq_len[j] = N;
        for (int32_t i = 0; i < LH; i++) {
            const int64_t reg = (int64_t)op->slots[j] * LH + i;
            int32_t h = s->n_hi[reg], l = s->n_lo[reg];
            if (v == K_GROW) h += rnd(r, 0, N - h - l), l += rnd(r, 0, N - h - l);
            else if (v == K_SHRINK) h = rnd(r, 0, h), l = rnd(r, 0, l);
            else if (v == K_OVER) h = N, l = 0; /* all high: more pages than the pool */
            else h = rnd(r, 0, N), l = rnd(r, 0, N - h);
            op->hi[j * LH + i] = h;
            op->lo[j * LH + i] = l;
        }
    }
    if (k != K_BAD) return;
    const int32_t j = rnd(r, 0, n - 1), i = rnd(r, 0, LH - 1), e = j * LH + i;
    switch (rnd(r, 0, 6)) {
    case 0: /* a repeated slot */
        op->slots[n] = op->slots[j];
        op->seq_len[n] = op->seq_len[j];
        memcpy(op->hi + n * LH, op->hi + j * LH, (size_t)LH * sizeof(int32_t));
        memcpy(op->lo + n * LH, op->lo + j * LH, (size_t)LH * sizeof(int32_t));
        op->n = n + 1;
        break;
    case 1: op->slots[j] = bad_slot(r, p); break;
    case 2: /* n_hi + n_lo = N + 1, sometimes in two head-regions (the first is reported) */
        op->lo[e] = op->seq_len[j] + 1 - op->hi[e];
        if (e + 1 < n * LH && rnd(r, 0, 1)) op->hi[e + 1] = op->seq_len[j] + 1;
        break;
    case 3: /* negative targets */
        if (rnd(r, 0, 1)) op->hi[e] = -rnd(r, 1, 3);
        else op->lo[e] = -rnd(r, 1, 3);
        if (e > 0 && rnd(r, 0, 1)) op->lo[rnd(r, 0, e - 1)] = -1;
        break;
    case 4: op->use_seq_len = 1; op->seq_len[j] = s->seq_len[op->slots[j]] - 1; break;
    case 5: op->use_seq_len = 1; op->seq_len[j] = M + rnd(r, 1, 3); break;
    default: op->null_targets = 1; break;
    }
}

static mkv_status_t apply_op(pair_t *p, int gpu, const rop_t *op, int32_t *out_slot)
{
    mkv_cache_t *c = gpu ? p->gpu : p->cpu;
    switch (op->call) {
    case C_ADMIT: return mkv_cache_admit(c, op->prompt_len, out_slot);
    case C_APPEND: return mkv_cache_append(c, op->n, op->slots, NULL);
    case C_RELEASE: return mkv_cache_release(c, op->slot, NULL);
    default: {
        const mkv_resize_t rz = {op->n, op->slots, op->use_seq_len ? op->seq_len : NULL,
                                 op->null_targets ? NULL : op->hi, op->null_targets ? NULL : op->lo};
        return resize_on(p, gpu, &rz, op->call == C_CHECK);
    }
    }
}

typedef struct tally {
    int64_t ok[K_COUNT], refused[K_COUNT];
    int64_t out_of_pages, out_of_slots, invalid, over_refused, bad_refused, short_of_pages;
} tally_t;

typedef struct rcfg {
    uint64_t seed;
    int32_t L, H, S, M, d;
    mkv_format_t hi, lo;
    int32_t hi_tpp, pages_per_region, steps;
} rcfg_t;

static void run_random(const rcfg_t *rc, tally_t *t)
{
    cr_assert(rc->S <= MAX_S && rc->L * rc->H <= MAX_LH);
    pair_t p;
    pair_create(&p, small_config(rc->L, rc->H, rc->S, rc->M, rc->d, rc->hi, rc->lo, rc->hi_tpp,
                                 (int64_t)rc->L * rc->H * rc->pages_per_region), 1);
    uint64_t rng = rc->seed;
    rop_t op;
    char where[256];
    expect_same_dumps(&p, "initial state");
    for (int32_t step = 0; step < rc->steps; step++) {
        draw(&rng, &p, &op);
        snprintf(where, sizeof where, "seed %#llx op %d (%s: call %d, n %d, prompt %d, slot %d)",
                 (unsigned long long)rc->seed, step, k_names[op.k], op.call, op.n, op.prompt_len,
                 op.slot);
        if (op.call == C_ADMIT) {
            int ok_c = -1, ok_g = -2;
            int64_t dc = -1, dg = -2;
            const mkv_status_t ac = mkv_cache_can_admit(p.cpu, op.prompt_len, &ok_c);
            expect_same(&p, where, ac, mkv_cache_can_admit(p.gpu, op.prompt_len, &ok_g));
            cr_assert(ac != OK || ok_c == ok_g, "%s: can_admit CPU %d, CUDA %d", where, ok_c, ok_g);
            const mkv_status_t dsc = mkv_cache_prompt_demand(p.cpu, op.prompt_len, &dc);
            cr_assert_eq(dsc, mkv_cache_prompt_demand(p.gpu, op.prompt_len, &dg), "%s: prompt_demand", where);
            cr_assert(dsc != OK || dc == dg, "%s: prompt demand CPU %lld, CUDA %lld", where,
                      (long long)dc, (long long)dg);
        }
        int32_t cs = -1, gs = -2;
        const mkv_status_t sc = apply_op(&p, 0, &op, &cs), sg = apply_op(&p, 1, &op, &gs);
        expect_same(&p, where, sc, sg);
        if (sc == OK) {
            t->ok[op.k]++;
            if (op.call == C_ADMIT) cr_assert_eq(cs, gs, "%s: CPU slot %d, CUDA slot %d", where, cs, gs);
        } else {
            cr_assert_str_neq(mkv_cache_last_error(p.gpu), "", "%s: no message", where);
            t->refused[op.k]++;
            t->out_of_pages += sc == MKV_STATUS_OUT_OF_PAGES;
            t->out_of_slots += sc == MKV_STATUS_OUT_OF_SLOTS;
            t->invalid += sc == MKV_STATUS_INVALID_ARGUMENT;
            t->over_refused += op.k == K_OVER && sc == MKV_STATUS_OUT_OF_PAGES;
            t->bad_refused += op.k == K_BAD && sc == MKV_STATUS_INVALID_ARGUMENT;
            t->short_of_pages += op.k != K_OVER && op.k != K_CHECK && sc == MKV_STATUS_OUT_OF_PAGES;
            cr_assert(op.k != K_BAD || sc == MKV_STATUS_INVALID_ARGUMENT, "%s: bad input got '%s'",
                      where, mkv_status_string(sc));
        }
        cr_assert(op.k != K_OVER || sc == MKV_STATUS_OUT_OF_PAGES, "%s: over-demand got '%s'", where,
                  mkv_status_string(sc));
        expect_same_stats(&p, where);
        if (step < 300 || step % 10 == 9) expect_same_dumps(&p, where);
        if (step % 10 == 9) expect_same_details(&p, where);
    }
    snprintf(where, sizeof where, "seed %#llx: the end", (unsigned long long)rc->seed);
    expect_same_details(&p, where);
    expect_same_dumps(&p, where);
    cr_assert_gt(p.cpu->st.head, p.P, "%s: the ring never wrapped (head %lld, P %lld)", where,
                 (long long)p.cpu->st.head, (long long)p.P);
    cr_log_info("%s: head %lld = %.1f laps of the ring", where, (long long)p.cpu->st.head,
                (double)p.cpu->st.head / (double)p.P);
    pair_destroy(&p);
}

Test(gpu_memmgr, dual_backend_random, .timeout = 120)
{
    GPU_REQUIRE();
    const rcfg_t runs[] = {
        {0xc0da01, 2, 2, 6, 48, 128, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 4, 10, 1500},
        {0xc0da02, 3, 4, 8, 48, 64, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 3, 8, 1500},
        {0xc0da03, 2, 3, 7, 48, 128, MKV_FORMAT_K4V2, MKV_FORMAT_K8V8, 4, 9, 1500},
        {0xc0da04, 3, 2, 8, 40, 32, MKV_FORMAT_K8V4, MKV_FORMAT_K2V4, 4, 8, 1500},
    };
    tally_t t;
    memset(&t, 0, sizeof t);
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) run_random(&runs[i], &t);
    for (int k = 0; k < K_COUNT; k++)
        cr_log_info("%-8s ok %lld, refused %lld", k_names[k], (long long)t.ok[k], (long long)t.refused[k]);
    cr_log_info("out of pages %lld (deliberate %lld), out of slots %lld, invalid %lld (bad %lld)",
                (long long)t.out_of_pages, (long long)t.over_refused, (long long)t.out_of_slots,
                (long long)t.invalid, (long long)t.bad_refused);
    const int must_succeed[] = {K_ADMIT, K_APPEND, K_GROW, K_SHRINK, K_MIXED, K_PLACE, K_RELEASE, K_CHECK};
    for (size_t i = 0; i < sizeof must_succeed / sizeof must_succeed[0]; i++)
        cr_assert_gt(t.ok[must_succeed[i]], 0, "no '%s' ever succeeded", k_names[must_succeed[i]]);
    cr_assert_gt(t.over_refused, 0, "no deliberate over-demand was refused");
    cr_assert_gt(t.bad_refused, 0, "no invalid input was refused");
    cr_assert_gt(t.short_of_pages, 0, "the pool never ran short outside deliberate over-demand");
    cr_assert_gt(t.out_of_slots, 0, "every slot was never taken at once");
}

/* ---- 2. Bad input: the same status and message on both, nothing changed ------------------ */

/* The first letter is the status expected: I(nvalid argument), P(ages short), S(lots), O(k). */
static const char *const bad_names[] = {
    "Iappend: null slots", "Iappend: n_slots -1", "Iappend: n_slots S + 1", "Iappend: slot S",
    "Iappend: inactive slot", "Iappend: repeated slot", "Iappend: slot at max_seq_len",
    "Iresize: null resize", "Iresize: null n_hi", "Iresize: null slots", "Iresize: slot -1",
    "Iresize: inactive slot", "Iresize: repeated slot", "Iresize: N decreasing",
    "Iresize: N > max_seq_len", "Iresize: negative n_hi", "Iresize: negative n_lo in 2 regions",
    "Iresize: n_hi + n_lo > N", "Presize: over-demand", "Presize_check: over-demand",
    "Iresize_check: n_hi + n_lo > N", "Iadmit: prompt_len 0", "Iadmit: prompt_len > max_seq_len",
    "Iadmit: null out_slot", "Padmit: over-demand", "Irelease: free slot", "Irelease: slot -1",
    "Irelease: slot S", "Istep_demand: inactive slot", "Islot_info: slot S", "Ican_admit: prompt_len 0",
    /* on the full pool */
    "Pappend into a full pool", "Sadmit with every slot taken", "Ocan_admit says no",
};
enum { N_BAD_FIRST = 31, N_BAD = sizeof bad_names / sizeof bad_names[0] };

/* First fixture: slot 0 at N = M, slot 1 admitted (N 0, reserved), slot 2 with tokens, slot 3
 * free; LH = 4. Second fixture (cases N_BAD_FIRST on): one slot holding the whole pool. */
enum { B_FULL = 0, B_FRESH = 1, B_LIVE = 2, B_FREE = 3 };

static mkv_status_t bad_call(pair_t *p, int gpu, size_t which)
{
    mkv_cache_t *c = gpu ? p->gpu : p->cpu;
    const int32_t S = p->S, M = p->M, N2 = p->cpu->st.seq_len[B_LIVE % S];
    int32_t sl[4] = {B_LIVE, B_FULL, B_LIVE, B_FREE}, seq[4] = {N2, M, N2, N2}, slot = -1;
    int32_t hi[16], lo[16];
    for (int i = 0; i < 16; i++) hi[i] = lo[i] = 1;
    mkv_resize_t rz = {1, sl, seq, hi, lo};
    int64_t pages;
    mkv_slot_info_t info;
    int ok = -1;
    mkv_status_t st;
    switch (which) {
    case 0: return mkv_cache_append(c, 1, NULL, NULL);
    case 1: return mkv_cache_append(c, -1, sl, NULL);
    case 2: return mkv_cache_append(c, S + 1, sl, NULL);
    case 3: sl[0] = S; return mkv_cache_append(c, 1, sl, NULL);
    case 4: return mkv_cache_append(c, 1, sl + 3, NULL);
    case 5: sl[1] = B_FRESH; return mkv_cache_append(c, 3, sl, NULL);
    case 6: return mkv_cache_append(c, 1, sl + 1, NULL);
    case 7: return resize_on(p, gpu, NULL, 0);
    case 8: rz.n_hi = NULL; return resize_on(p, gpu, &rz, 0);
    case 9: rz.slots = NULL; return resize_on(p, gpu, &rz, 0);
    case 10: sl[0] = -1; return resize_on(p, gpu, &rz, 0);
    case 11: rz.slots = sl + 3; return resize_on(p, gpu, &rz, 0);
    case 12: rz.n_slots = 3; return resize_on(p, gpu, &rz, 0);
    case 13: seq[0] = N2 - 1; return resize_on(p, gpu, &rz, 0);
    case 14: seq[0] = M + 1; return resize_on(p, gpu, &rz, 0);
    case 15: hi[2] = -1; return resize_on(p, gpu, &rz, 0);
    case 16: rz.n_slots = 2; lo[6] = -2; lo[5] = -1; return resize_on(p, gpu, &rz, 0);
    case 17: hi[3] = N2; return resize_on(p, gpu, &rz, 0);
    case 18: case 19: /* every region of slots 2 and 0 all high at N = M */
        rz.n_slots = 2;
        seq[0] = M;
        for (int i = 0; i < 8; i++) hi[i] = M, lo[i] = 0;
        return resize_on(p, gpu, &rz, which == 19);
    case 20: lo[0] = N2; return resize_on(p, gpu, &rz, 1);
    case 21: return mkv_cache_admit(c, 0, &slot);
    case 22: return mkv_cache_admit(c, M + 1, &slot);
    case 23: return mkv_cache_admit(c, 4, NULL);
    case 24: return mkv_cache_admit(c, M, &slot);
    case 25: return mkv_cache_release(c, B_FREE, NULL);
    case 26: return mkv_cache_release(c, -1, NULL);
    case 27: return mkv_cache_release(c, S, NULL);
    case 28: return mkv_cache_step_demand(c, 2, sl + 2, &pages);
    case 29: return mkv_cache_slot_info(c, S, &info);
    case 30: return mkv_cache_can_admit(c, 0, &ok);
    case 31: sl[0] = 0; return mkv_cache_append(c, 1, sl, NULL);
    case 32: return mkv_cache_admit(c, 1, &slot);
    default: st = mkv_cache_can_admit(c, 1, &ok); return st == OK && ok != 0 ? MKV_STATUS_INTERNAL : st;
    }
}

/* Runs bad call `w` on both: the expected status, the same message, nothing changed. */
static void expect_refused_alike(pair_t *p, size_t w)
{
    const char e = bad_names[w][0];
    const mkv_status_t want = e == 'I' ? MKV_STATUS_INVALID_ARGUMENT : e == 'P' ? MKV_STATUS_OUT_OF_PAGES
                              : e == 'S' ? MKV_STATUS_OUT_OF_SLOTS : OK;
    char where[160];
    snprintf(where, sizeof where, "bad input %zu (%s)", w, bad_names[w] + 1);
    char *before_c = dump_of(p->cpu, where), *before_g = dump_of(p->gpu, where);
    expect_same_text(before_c, before_g, "CPU ", "CUDA", where);
    const mkv_status_t sc = bad_call(p, 0, w), sg = bad_call(p, 1, w);
    cr_assert_eq(sc, want, "%s: CPU got '%s', expected '%s' (%s)", where, mkv_status_string(sc),
                 mkv_status_string(want), mkv_cache_last_error(p->cpu));
    expect_same(p, where, sc, sg);
    cr_assert_str_neq(mkv_cache_last_error(p->gpu), "", "%s: no message on CUDA", where);
    char *after_c = dump_of(p->cpu, where), *after_g = dump_of(p->gpu, where);
    expect_same_text(before_c, after_c, "before", "after ", where);
    expect_same_text(before_g, after_g, "before", "after ", where);
    expect_same_stats(p, where);
    mkv_free(before_c), mkv_free(before_g), mkv_free(after_c), mkv_free(after_g);
}

Test(gpu_memmgr, bad_inputs_same_status, .timeout = 60)
{
    GPU_REQUIRE();
    pair_t p;
    pair_create(&p, small_config(2, 2, 4, 32, 128, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 4, 48), 1);
    const int32_t lens[3] = {4, 6, 3}, full = B_FULL, live = B_LIVE;
    int32_t sl[3], hi[12], lo[12];
    for (int j = 0; j < 3; j++) sl[j] = both_admit(&p, lens[j]);
    for (int i = 0; i < 12; i++) hi[i] = 1 + i % 2, lo[i] = (i / 2) % 2; /* <= 3 tokens */
    const mkv_resize_t place = {3, sl, lens, hi, lo}, to_m = {1, &full, &p.M, hi, lo};
    both_resize(&p, &place, "place three prompts");
    both_resize(&p, &to_m, "slot 0 to max_seq_len");
    expect_same(&p, "release 1", mkv_cache_release(p.cpu, 1, NULL), mkv_cache_release(p.gpu, 1, NULL));
    cr_assert_eq(both_admit(&p, 2), B_FRESH);
    for (int k = 0; k < 5; k++) both_append(&p, 1, &live, "append slot 2");
    expect_same_details(&p, "bad-input fixture");
    for (size_t w = 0; w < N_BAD_FIRST; w++) expect_refused_alike(&p, w);
    /* Calls reporting into the thread's buffer. */
    char msg[512];
    int64_t dc = 0, dg = 0;
    mkv_status_t sc = mkv_cache_stats(p.cpu, NULL);
    snprintf(msg, sizeof msg, "%s", mkv_last_error());
    cr_assert_eq(mkv_cache_stats(p.gpu, NULL), sc);
    cr_assert_str_eq(mkv_last_error(), msg);
    sc = mkv_cache_prompt_demand(p.cpu, p.M + 1, &dc);
    snprintf(msg, sizeof msg, "%s", mkv_last_error());
    cr_assert_eq(mkv_cache_prompt_demand(p.gpu, p.M + 1, &dg), sc);
    cr_assert_str_eq(mkv_last_error(), msg);
    expect_same_details(&p, "after the bad inputs");
    pair_destroy(&p);

    /* One slot, every page in use (LH = 2, 3 pages per region); then release makes room. */
    pair_create(&p, small_config(1, 2, 1, 16, 128, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 4, 6), 1);
    const int32_t s0 = both_admit(&p, 1), n12 = 12, hi2[2] = {12, 12}, lo2[2] = {0, 0};
    const mkv_resize_t fill = {1, &s0, &n12, hi2, lo2};
    both_resize(&p, &fill, "fill the pool");
    expect_same_details(&p, "full pool");
    for (size_t w = N_BAD_FIRST; w < N_BAD; w++) expect_refused_alike(&p, w);
    expect_same(&p, "release", mkv_cache_release(p.cpu, s0, NULL), mkv_cache_release(p.gpu, s0, NULL));
    cr_assert_eq(both_admit(&p, 8), 0);
    expect_same_details(&p, "after release");
    expect_same_dumps(&p, "after release");
    pair_destroy(&p);
}

/* Step demand of a long list repeating one slot (more entries than slots): the CPU backend
 * accepts it; the CUDA backend must give the same answer (its staging holds S slots). */
Test(gpu_memmgr, step_demand_long_repeated_list, .timeout = 30)
{
    GPU_REQUIRE();
    pair_t p;
    pair_create(&p, small_config(2, 2, 4, 32, 128, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 4, 48), 1);
    const int32_t s = both_admit(&p, 4), n = 4, hi[4] = {4, 4, 4, 4}, lo[4] = {0, 0, 0, 0};
    const mkv_resize_t rz = {1, &s, &n, hi, lo};
    both_resize(&p, &rz, "place");
    /* Longer than the slot count: refused on both backends (it would overrun the staging). */
    enum { LONG = 1000 };
    static int32_t list[LONG];
    for (int i = 0; i < LONG; i++) list[i] = s;
    int64_t dc = -1, dg = -2;
    const mkv_status_t lc = mkv_cache_step_demand(p.cpu, LONG, list, &dc);
    const mkv_status_t lg = mkv_cache_step_demand(p.gpu, LONG, list, &dg);
    expect_same(&p, "step_demand, too long", lc, lg);
    cr_assert_eq(lc, MKV_STATUS_INVALID_ARGUMENT);
    /* Within the slot count, repeats included: the same demand. */
    const int32_t rep[4] = {s, s, s, s};
    expect_same(&p, "step_demand, repeats", mkv_cache_step_demand(p.cpu, 4, rep, &dc),
                mkv_cache_step_demand(p.gpu, 4, rep, &dg));
    cr_assert_eq(dc, dg, "step demand of 4 repeats: CPU %lld, CUDA %lld", (long long)dc, (long long)dg);
    cr_assert_gt(dc, 0);
    expect_same_details(&p, "after the long list");
    pair_destroy(&p);
}

/* Stats, slot_info, step_demand and validate run reductions on the device between batched
 * calls; the next append, resize or release must not see their leftovers. */
Test(gpu_memmgr, reductions_between_calls, .timeout = 30)
{
    GPU_REQUIRE();
    pair_t p;
    pair_create(&p, small_config(2, 2, 4, 32, 128, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 4, 48), 1);
    const int32_t s = both_admit(&p, 4), n = 4, hi[4] = {4, 3, 2, 1}, lo[4] = {0, 1, 2, 3};
    const mkv_resize_t rz = {1, &s, &n, hi, lo};
    both_resize(&p, &rz, "place");
    static const char *const what[4] = {"after stats", "after slot_info", "after step_demand",
                                        "after validate"};
    for (int k = 0; k < 4; k++) {
        mkv_cache_stats_t stats;
        mkv_slot_info_t info;
        int64_t pages;
        const mkv_status_t sg = k == 0 ? mkv_cache_stats(p.gpu, &stats)
                                : k == 1 ? mkv_cache_slot_info(p.gpu, s, &info)
                                : k == 2 ? mkv_cache_step_demand(p.gpu, 1, &s, &pages)
                                         : mkv_cache_validate(p.gpu);
        cr_assert_eq(sg, OK, "%s: %s", what[k], mkv_cache_last_error(p.gpu));
        both_append(&p, 1, &s, what[k]);
        expect_same_dumps(&p, what[k]);
    }
    expect_same_details(&p, "the end");
    pair_destroy(&p);
}

/* ---- 3. Validation of corrupted state ---------------------------------------------------- */

/* Two slots, N 11: per head-region 9 high tokens (3 pages of 4) and 2 low (1 page); T = 9. */
static void corrupt_fixture(pair_t *p)
{
    pair_create(p, small_config(2, 2, 3, 32, 128, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 4, 48), 1);
    int32_t sl[2], seq[2] = {8, 8}, hi[8], lo[8];
    sl[0] = both_admit(p, 8);
    sl[1] = both_admit(p, 8);
    for (int i = 0; i < 8; i++) hi[i] = 6, lo[i] = 2;
    const mkv_resize_t rz = {2, sl, seq, hi, lo};
    both_resize(p, &rz, "place");
    for (int k = 0; k < 3; k++) both_append(p, 2, sl, "append");
    expect_same_details(p, "corruption fixture");
}

static void expect_corrupt(mkv_cache_t *c, const char *what)
{
    const mkv_status_t s = mkv_cache_validate(c);
    cr_assert_eq(s, MKV_STATUS_CORRUPT, "%s: validate says '%s' (%s)", what, mkv_status_string(s),
                 mkv_cache_last_error(c));
    cr_assert_str_neq(mkv_cache_last_error(c), "", "%s: no message", what);
    cr_log_info("%s: %s", what, mkv_cache_last_error(c));
}

static void expect_valid(mkv_cache_t *c, const char *what)
{
    const mkv_status_t s = mkv_cache_validate(c);
    cr_assert_eq(s, OK, "%s restored: validate says '%s' (%s)", what, mkv_status_string(s),
                 mkv_cache_last_error(c));
}

/* The host keeps the per-slot bookkeeping of a CUDA cache; validation must use it. */
Test(gpu_memmgr, validate_detects_host_side_corruption, .timeout = 30)
{
    GPU_REQUIRE();
    pair_t p;
    corrupt_fixture(&p);
    mkv_mm_state_t *st = &p.gpu->st;
    st->seq_len[0] = 5, expect_corrupt(p.gpu, "seq_len below n_hi + n_lo");
    st->seq_len[0] = 11, expect_valid(p.gpu, "seq_len");
    st->active[1] = 0, expect_corrupt(p.gpu, "a free slot holding pages");
    st->active[1] = 1, expect_valid(p.gpu, "active");
    st->reserved_total += 3, expect_corrupt(p.gpu, "reservations that do not sum");
    st->reserved_total -= 3, expect_valid(p.gpu, "reserved_total");
    expect_same_dumps(&p, "after the host-side corruptions");
    pair_destroy(&p);
}

/* The leading members of struct mkv_cuda_mm (private to memmgr/cuda_mm.cu), mirrored to reach
 * the device arrays; checked against the downloaded state before use (skips if it changed). */
typedef struct dev_prefix {
    mkv_mm_geom_t g;
    int32_t device;
    int32_t *ring, *table, *n_hi, *n_lo;
    unsigned long long *counters;
} dev_prefix_t;

static int is_device_ptr(const void *ptr)
{
    struct cudaPointerAttributes a;
    const cudaError_t e = cudaPointerGetAttributes(&a, ptr);
    (void)cudaGetLastError();
    return e == cudaSuccess && a.type == cudaMemoryTypeDevice;
}

/* Writes `bytes` of value at dptr, expects CORRUPT, restores, expects OK. */
static void corrupt_device(mkv_cache_t *c, void *dptr, const void *value, size_t bytes, const char *what)
{
    unsigned char old[8];
    CUDA_CHECK(cudaMemcpy(old, dptr, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(dptr, value, bytes, cudaMemcpyHostToDevice));
    expect_corrupt(c, what);
    CUDA_CHECK(cudaMemcpy(dptr, old, bytes, cudaMemcpyHostToDevice));
    expect_valid(c, what);
}

Test(gpu_memmgr, validate_detects_device_corruption, .timeout = 30)
{
    GPU_REQUIRE();
    pair_t p;
    corrupt_fixture(&p);
    mkv_cache_t *c = p.gpu;
    const mkv_mm_state_t *st = &c->st; /* validate downloaded the device state into it */
    dev_prefix_t d;
    memcpy(&d, c->dev, sizeof d);
    const int64_t P = st->g.pool_pages, T = st->g.row_entries, R = mkv_mm_regions(&st->g);
    int layout_ok = memcmp(&d.g, &st->g, sizeof d.g) == 0 && d.device == 0 && is_device_ptr(d.ring) &&
                    is_device_ptr(d.table) && is_device_ptr(d.n_hi) && is_device_ptr(d.n_lo) &&
                    is_device_ptr(d.counters);
    if (layout_ok) {
        int32_t *ring = malloc((size_t)P * 4), *table = malloc((size_t)(R * T) * 4);
        unsigned long long ctr[2];
        cr_assert(ring && table);
        CUDA_CHECK(cudaMemcpy(ring, d.ring, (size_t)P * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(table, d.table, (size_t)(R * T) * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(ctr, d.counters, sizeof ctr, cudaMemcpyDeviceToHost));
        layout_ok = memcmp(ring, st->ring, (size_t)P * 4) == 0 &&
                    memcmp(table, st->table, (size_t)(R * T) * 4) == 0 &&
                    (int64_t)ctr[0] == st->head && (int64_t)ctr[1] == st->tail;
        free(ring);
        free(table);
    }
    if (!layout_ok)
        cr_skip_test("struct mkv_cuda_mm no longer starts as dev_prefix_t says: update the mirror");

    const int32_t tpp = st->g.tpp_hi, r0 = 0, r1 = (int32_t)mkv_mm_region(&st->g, 1, 0, 0);
    const int32_t kh = mkv_mm_pages_for(st->n_hi[r0], tpp);
    cr_assert(kh == 3 && T == 9, "fixture: %d high pages, T %lld", kh, (long long)T);
    const int32_t free0 = mkv_mm_ring_at(st, st->head), free1 = mkv_mm_ring_at(st, st->head + 1);
    const int32_t other = st->table[r1 * T], minus1 = -1, beyond = (int32_t)P + 3;
    corrupt_device(c, d.table + r0 * T, &other, 4, "a page in two rows");
    corrupt_device(c, d.table + r0 * T + kh, &free0, 4, "an unused entry holding a free page");
    corrupt_device(c, d.table + r0 * T + T - 1, &free1, 4, "a low page that is also free");
    corrupt_device(c, d.table + r0 * T + kh - 1, &minus1, 4, "a leaked high page");
    corrupt_device(c, d.ring + (st->head + 2) % P, &beyond, 4, "a free page id out of range");
    corrupt_device(c, d.n_lo + r1, &minus1, 4, "a negative n_lo");
    const unsigned long long head1 = (unsigned long long)st->head + 1;
    corrupt_device(c, d.counters, &head1, 8, "head one too far (a leaked page)");

    /* n_hi one page larger: the stats read the device counts too. */
    mkv_cache_stats_t before, after;
    cr_assert_eq(mkv_cache_stats(c, &before), OK);
    const int32_t more = st->n_hi[r0] + tpp, orig = st->n_hi[r0];
    CUDA_CHECK(cudaMemcpy(d.n_hi + r0, &more, 4, cudaMemcpyHostToDevice));
    cr_assert_eq(mkv_cache_stats(c, &after), OK);
    cr_assert_eq(after.tokens_hi, before.tokens_hi + tpp, "stats do not see the device's n_hi");
    cr_assert_eq(after.pages_hi, before.pages_hi + 1, "stats do not see the device's n_hi");
    expect_corrupt(c, "n_hi one page more than the row holds");
    CUDA_CHECK(cudaMemcpy(d.n_hi + r0, &orig, 4, cudaMemcpyHostToDevice));
    expect_valid(c, "n_hi");
    expect_same_dumps(&p, "after the device corruptions");
    pair_destroy(&p);
}

/* ---- 4. The KV data calls on a CUDA cache with a pool ------------------------------------ */

Test(gpu_memmgr, cuda_data_calls_refuse_host_tensors, .timeout = 30)
{
    GPU_REQUIRE();
    mkv_cache_config_t cfg = small_config(2, 2, 2, 32, 64, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 4, 32);
    cfg.flags = 0; /* with page storage */
    pair_t p;
    pair_create(&p, cfg, 1);
    mkv_cache_info_t info;
    cr_assert_eq(mkv_cache_info(p.gpu, &info), OK);
    cr_assert_eq(info.pool_bytes, cfg.pool_pages * cfg.page_bytes);
    const int32_t n = 4, slot = both_admit(&p, n), G = cfg.group_size, H = cfg.n_kv_heads, d = cfg.head_dim;
    const size_t nq = (size_t)n * H * G * d, nkv = (size_t)n * H * d;
    float *q = malloc(nq * 4), *k = malloc(nkv * 4), *v = malloc(nkv * 4), *out = malloc(nq * 4);
    cr_assert(q && k && v && out);
    uint64_t rng = 0xda7a;
    for (size_t i = 0; i < nq; i++) q[i] = (float)test_rand_range(&rng, -100, 100) / 50.0f, out[i] = -7.0f;
    for (size_t i = 0; i < nkv; i++) k[i] = (float)test_rand_range(&rng, -100, 100) / 50.0f, v[i] = k[i] * 0.5f;
    for (int call = 0; call < 4; call++) {
        static const char *const names[4] = {"prefill_layer", "commit_prompt", "decode_layer", "compress"};
        char *before = dump_of(p.gpu, names[call]);
        mkv_status_t s;
        switch (call) {
        case 0: s = mkv_cache_prefill_layer(p.gpu, slot, 0, q, k, v, out, NULL); break;
        case 1: s = mkv_cache_commit_prompt(p.gpu, 1, &slot, NULL); break;
        case 2: s = mkv_cache_decode_layer(p.gpu, 1, &slot, 0, q, k, v, out, NULL); break;
        default: s = mkv_cache_compress(p.gpu, 1, &slot, NULL); break;
        }
        /* host tensors (prefill, decode) and calls out of step order (commit before every
         * layer was prefilled, compress before decode) are refused by the CUDA backend too */
        cr_assert_eq(s, MKV_STATUS_INVALID_ARGUMENT, "%s: got '%s' (%s)", names[call], mkv_status_string(s),
                     mkv_cache_last_error(p.gpu));
        cr_assert_str_neq(mkv_cache_last_error(p.gpu), "", "%s: no message", names[call]);
        for (size_t i = 0; i < nq; i++)
            cr_assert_eq(out[i], -7.0f, "%s wrote out[%zu]", names[call], i);
        char *after = dump_of(p.gpu, names[call]);
        expect_same_text(before, after, "before", "after ", names[call]);
        mkv_free(before), mkv_free(after);
        expect_valid(p.gpu, names[call]);
    }
    /* The memory-manager calls still work on a pooled CUDA cache, as on the CPU. */
    int32_t hi[4] = {3, 4, 2, 1}, lo[4] = {1, 0, 2, 2};
    const mkv_resize_t rz = {1, &slot, &n, hi, lo};
    both_resize(&p, &rz, "place on pooled caches");
    both_append(&p, 1, &slot, "append on pooled caches");
    expect_same_details(&p, "pooled caches");
    expect_same_stats(&p, "pooled caches");
    expect_same_dumps(&p, "pooled caches");
    free(q), free(k), free(v), free(out);
    pair_destroy(&p);
}

/* ---- 5. A Llama-sized geometry: 32 layers, 8 heads, 64 slots ----------------------------- */

Test(gpu_memmgr, large_geometry_smoke, .timeout = 120)
{
    GPU_REQUIRE();
    enum { L = 32, H = 8, S = 64, LH = L * H, STEPS = 200 };
    pair_t p;
    pair_create(&p, small_config(L, H, S, 512, 128, MKV_FORMAT_K8V4, MKV_FORMAT_K4V2, 16, 600000), 4);
    uint64_t rng = 0x11a3a;
    int32_t *slots = malloc(S * 4), *seq = malloc(S * 4), *hi = malloc((size_t)S * LH * 4),
            *lo = malloc((size_t)S * LH * 4);
    cr_assert(slots && seq && hi && lo);
    for (int32_t j = 0; j < S; j++) {
        seq[j] = test_rand_range(&rng, 32, 256);
        cr_assert_eq(both_admit(&p, seq[j]), j);
        slots[j] = j;
        for (int32_t i = 0; i < LH; i++) {
            hi[j * LH + i] = test_rand_range(&rng, seq[j] < 8 ? seq[j] : 8, seq[j]);
            lo[j * LH + i] = test_rand_range(&rng, 0, seq[j] - hi[j * LH + i]);
        }
    }
    const mkv_resize_t place = {S, slots, seq, hi, lo};
    both_resize(&p, &place, "place 64 prompts");
    expect_same_stats(&p, "after placement");
    expect_same_dumps(&p, "after placement");
    char where[96];
    for (int32_t step = 0; step < STEPS; step++) {
        snprintf(where, sizeof where, "step %d", step);
        for (int32_t i = S - 1; i > 0; i--) { /* a fresh slot order each step */
            const int32_t k = test_rand_range(&rng, 0, i), t = slots[i];
            slots[i] = slots[k];
            slots[k] = t;
        }
        both_append(&p, S, slots, where);
        expect_same_stats(&p, where);
        if (step % 50 != 49) continue;
        /* A policy-shaped resize of half the slots: demote some high tokens, prune some low. */
        const int32_t n = S / 2;
        const mkv_mm_state_t *st = &p.cpu->st;
        for (int32_t j = 0; j < n; j++)
            for (int32_t i = 0; i < LH; i++) {
                const int64_t r = (int64_t)slots[j] * LH + i;
                const int32_t h = st->n_hi[r], l = st->n_lo[r], dem = test_rand_range(&rng, 0, h / 2);
                hi[j * LH + i] = h - dem;
                lo[j * LH + i] = l + dem - test_rand_range(&rng, 0, (l + dem) / 3);
            }
        const mkv_resize_t rz = {n, slots, NULL, hi, lo};
        both_resize(&p, &rz, where);
        expect_same_stats(&p, where);
    }
    expect_same_details(&p, "the end");
    expect_same_dumps(&p, "the end");
    free(slots), free(seq), free(hi), free(lo);
    pair_destroy(&p);
}
