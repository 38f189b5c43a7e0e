/*
 * testutil.c — configs, snapshots and the reference model of the CPU tests (see testutil.h).
 * The model uses only the public header's documented semantics, never the library's internals.
 */
#include "testutil.h"

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Configs and caches                                                                       */
/* ---------------------------------------------------------------------------------------- */

mkv_cache_config_t tu_config(int32_t L, int32_t H, int32_t S, int32_t max_seq_len, int32_t hi_tpp,
                             int64_t pool_pages)
{
    mkv_cache_config_t cfg = MKV_CACHE_CONFIG_INIT;
    cfg.n_layers = L;
    cfg.n_kv_heads = H;
    cfg.max_seqs = S;
    cfg.max_seq_len = max_seq_len;
    cfg.head_dim = 128;
    cfg.hi_key_group = cfg.hi_value_group = cfg.lo_key_group = cfg.lo_value_group = 256;
    int64_t bytes = 0;
    TU_OK(mkv_page_bytes_for(cfg.hi_format, cfg.head_dim, cfg.hi_key_group, cfg.hi_value_group,
                             hi_tpp, &bytes));
    cfg.page_bytes = bytes;
    cfg.pool_pages = pool_pages;
    cfg.window = 8;
    cfg.flags = MKV_CACHE_METADATA_ONLY;
    return cfg;
}

mkv_cache_t *tu_create(const mkv_cache_config_t *cfg)
{
    mkv_cache_t *c = NULL;
    mkv_status_t s = mkv_cache_create(cfg, &c);
    cr_assert_eq(s, MKV_STATUS_OK, "mkv_cache_create: %s (%s)", mkv_status_string(s),
                 mkv_last_error());
    cr_assert_not_null(c);
    return c;
}

mkv_cache_info_t tu_info(const mkv_cache_t *c)
{
    mkv_cache_info_t info;
    memset(&info, 0, sizeof info);
    TU_COK(c, mkv_cache_info(c, &info));
    return info;
}

mkv_cache_stats_t tu_stats(const mkv_cache_t *c)
{
    mkv_cache_stats_t s;
    memset(&s, 0, sizeof s);
    TU_COK(c, mkv_cache_stats(c, &s));
    return s;
}

void tu_expect_valid(mkv_cache_t *c, const char *where)
{
    mkv_status_t s = mkv_cache_validate(c);
    cr_assert_eq(s, MKV_STATUS_OK, "%s: validate: %s (%s)", where, mkv_status_string(s),
                 mkv_cache_last_error(c));
}

/* ---------------------------------------------------------------------------------------- */
/* Snapshots                                                                                */
/* ---------------------------------------------------------------------------------------- */

static void *dup_bytes(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    cr_assert_not_null(q);
    if (n) memcpy(q, p, n);
    return q;
}

void tu_snap_take(const mkv_cache_t *c, tu_snap_t *s)
{
    const mkv_mm_state_t *st = &c->st;
    int64_t R = (int64_t)st->g.max_seqs * st->g.n_layers * st->g.n_kv_heads;
    int64_t S = st->g.max_seqs, P = st->g.pool_pages;
    memset(s, 0, sizeof *s);
    s->g = st->g;
    s->head = st->head;
    s->tail = st->tail;
    s->reserved_total = st->reserved_total;
    s->ring = dup_bytes(st->ring, (size_t)P * sizeof(int32_t));
    s->n_free = st->tail - st->head;
    cr_assert(s->n_free >= 0 && s->n_free <= P, "free count %lld out of [0, %lld]",
              (long long)s->n_free, (long long)P);
    s->free_ids = malloc((size_t)(s->n_free ? s->n_free : 1) * sizeof(int32_t));
    cr_assert_not_null(s->free_ids);
    for (int64_t i = 0; i < s->n_free; i++) s->free_ids[i] = st->ring[(st->head + i) % P];
    s->table = dup_bytes(st->table, (size_t)(R * st->g.row_entries) * sizeof(int32_t));
    s->n_hi = dup_bytes(st->n_hi, (size_t)R * sizeof(int32_t));
    s->n_lo = dup_bytes(st->n_lo, (size_t)R * sizeof(int32_t));
    s->seq_len = dup_bytes(st->seq_len, (size_t)S * sizeof(int32_t));
    s->active = dup_bytes(st->active, (size_t)S);
    s->reserved = dup_bytes(st->reserved, (size_t)S * sizeof(int64_t));
    s->stats = tu_stats(c);
}

void tu_snap_free(tu_snap_t *s)
{
    free(s->ring);
    free(s->free_ids);
    free(s->table);
    free(s->n_hi);
    free(s->n_lo);
    free(s->seq_len);
    free(s->active);
    free(s->reserved);
    memset(s, 0, sizeof *s);
}

void tu_stats_expect_equal(const mkv_cache_stats_t *a, const mkv_cache_stats_t *b,
                           const char *what)
{
#define TU_SF(f)                                                                               \
    cr_assert_eq(a->f, b->f, "%s: stats." #f " %lld vs %lld", what, (long long)a->f,           \
                 (long long)b->f)
    TU_SF(total_pages);
    TU_SF(free_pages);
    TU_SF(reserved_pages);
    TU_SF(available_pages);
    TU_SF(pages_hi);
    TU_SF(pages_lo);
    TU_SF(tokens_hi);
    TU_SF(tokens_lo);
    TU_SF(tokens_seen);
    TU_SF(tokens_pruned);
    TU_SF(active_slots);
    TU_SF(bytes_in_use);
    TU_SF(bytes_fp16);
#undef TU_SF
}

void tu_snap_expect_equal(const tu_snap_t *a, const tu_snap_t *b, int whole_ring,
                          const char *what)
{
    int64_t R = (int64_t)a->g.max_seqs * a->g.n_layers * a->g.n_kv_heads;
    int32_t T = a->g.row_entries;
    cr_assert_eq(a->head, b->head, "%s: head %lld vs %lld", what, (long long)a->head,
                 (long long)b->head);
    cr_assert_eq(a->tail, b->tail, "%s: tail %lld vs %lld", what, (long long)a->tail,
                 (long long)b->tail);
    cr_assert_eq(a->reserved_total, b->reserved_total, "%s: reserved_total %lld vs %lld", what,
                 (long long)a->reserved_total, (long long)b->reserved_total);
    for (int64_t i = 0; i < a->n_free; i++)
        cr_assert_eq(a->free_ids[i], b->free_ids[i], "%s: free region position %lld: %d vs %d",
                     what, (long long)i, a->free_ids[i], b->free_ids[i]);
    if (whole_ring)
        for (int64_t i = 0; i < a->g.pool_pages; i++)
            cr_assert_eq(a->ring[i], b->ring[i], "%s: ring[%lld] %d vs %d", what, (long long)i,
                         a->ring[i], b->ring[i]);
    for (int64_t r = 0; r < R; r++) {
        cr_assert_eq(a->n_hi[r], b->n_hi[r], "%s: n_hi[%lld] %d vs %d", what, (long long)r,
                     a->n_hi[r], b->n_hi[r]);
        cr_assert_eq(a->n_lo[r], b->n_lo[r], "%s: n_lo[%lld] %d vs %d", what, (long long)r,
                     a->n_lo[r], b->n_lo[r]);
        for (int32_t e = 0; e < T; e++)
            cr_assert_eq(a->table[r * T + e], b->table[r * T + e],
                         "%s: region %lld entry %d: page %d vs %d", what, (long long)r, e,
                         a->table[r * T + e], b->table[r * T + e]);
    }
    for (int32_t s = 0; s < a->g.max_seqs; s++) {
        cr_assert_eq(a->seq_len[s], b->seq_len[s], "%s: seq_len[%d] %d vs %d", what, s,
                     a->seq_len[s], b->seq_len[s]);
        cr_assert_eq(a->active[s], b->active[s], "%s: active[%d] %d vs %d", what, s,
                     a->active[s], b->active[s]);
        cr_assert_eq(a->reserved[s], b->reserved[s], "%s: reserved[%d] %lld vs %lld", what, s,
                     (long long)a->reserved[s], (long long)b->reserved[s]);
    }
    tu_stats_expect_equal(&a->stats, &b->stats, what);
}

/* ---------------------------------------------------------------------------------------- */
/* Random numbers                                                                           */
/* ---------------------------------------------------------------------------------------- */

uint64_t tu_rand(tu_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int32_t tu_rand_range(tu_rng_t *r, int32_t lo, int32_t hi)
{
    if (hi <= lo) return lo;
    return lo + (int32_t)(tu_rand(r) % (uint64_t)((int64_t)hi - lo + 1));
}

/* ---------------------------------------------------------------------------------------- */
/* The reference model                                                                      */
/* ---------------------------------------------------------------------------------------- */

static int32_t pages_for(int32_t tokens, int32_t tpp) { return (tokens + tpp - 1) / tpp; }

static void *zalloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    cr_assert_not_null(p);
    return p;
}

void tu_model_init(tu_model_t *m, const mkv_cache_t *c)
{
    mkv_cache_info_t info = tu_info(c);
    memset(m, 0, sizeof *m);
    m->L = info.config.n_layers;
    m->H = info.config.n_kv_heads;
    m->S = info.config.max_seqs;
    m->max_seq_len = info.config.max_seq_len;
    m->W = info.config.window;
    m->d = info.config.head_dim;
    m->P = info.config.pool_pages;
    m->page_bytes = info.config.page_bytes;
    m->tpp_hi = info.tokens_per_page_hi;
    m->tpp_lo = info.tokens_per_page_lo;
    int32_t tmin = m->tpp_hi < m->tpp_lo ? m->tpp_hi : m->tpp_lo;
    m->T = pages_for(m->max_seq_len, tmin) + 1;
    cr_assert_eq(info.row_entries, m->T, "row_entries %d, expected %d", info.row_entries, m->T);
    int64_t R = (int64_t)m->S * m->L * m->H;
    m->fifo = zalloc((size_t)m->P * sizeof(int32_t));
    for (int64_t i = 0; i < m->P; i++) m->fifo[i] = (int32_t)i;
    m->fifo_first = 0;
    m->fifo_len = m->P;
    m->head = 0;
    m->tail = m->P;
    m->hi = zalloc((size_t)(R * m->T) * sizeof(int32_t));
    m->lo = zalloc((size_t)(R * m->T) * sizeof(int32_t));
    m->n_hi = zalloc((size_t)R * sizeof(int32_t));
    m->n_lo = zalloc((size_t)R * sizeof(int32_t));
    m->N = zalloc((size_t)m->S * sizeof(int32_t));
    m->active = zalloc((size_t)m->S);
    m->res = zalloc((size_t)m->S * sizeof(int64_t));
}

void tu_model_free(tu_model_t *m)
{
    free(m->fifo);
    free(m->hi);
    free(m->lo);
    free(m->n_hi);
    free(m->n_lo);
    free(m->N);
    free(m->active);
    free(m->res);
    memset(m, 0, sizeof *m);
}

int64_t tu_model_region(const tu_model_t *m, int32_t slot, int32_t layer, int32_t head)
{
    return ((int64_t)slot * m->L + layer) * m->H + head;
}

int64_t tu_model_reserved_total(const tu_model_t *m)
{
    int64_t t = 0;
    for (int32_t s = 0; s < m->S; s++) t += m->res[s];
    return t;
}

int64_t tu_model_prompt_demand(const tu_model_t *m, int32_t prompt_len)
{
    return (int64_t)m->L * m->H * (pages_for(prompt_len, m->tpp_hi) + 1);
}

static void fifo_push(tu_model_t *m, int32_t id)
{
    cr_assert(m->fifo_len < m->P, "model: free queue overflow");
    m->fifo[(m->fifo_first + m->fifo_len) % m->P] = id;
    m->fifo_len++;
    m->tail++;
}

static int32_t fifo_pop(tu_model_t *m)
{
    cr_assert(m->fifo_len > 0, "model: free queue underflow");
    int32_t id = m->fifo[m->fifo_first];
    m->fifo_first = (m->fifo_first + 1) % m->P;
    m->fifo_len--;
    m->head++;
    return id;
}

mkv_status_t tu_model_admit(tu_model_t *m, int32_t prompt_len, int32_t *out_slot, int *also_short)
{
    if (also_short) *also_short = 0;
    if (prompt_len < 1 || prompt_len > m->max_seq_len) return MKV_STATUS_INVALID_ARGUMENT;
    int64_t demand = tu_model_prompt_demand(m, prompt_len);
    int short_of_pages = m->fifo_len - tu_model_reserved_total(m) < demand;
    int32_t slot = -1;
    for (int32_t s = 0; s < m->S && slot < 0; s++)
        if (!m->active[s]) slot = s;
    if (slot < 0) {
        if (also_short) *also_short = short_of_pages;
        return MKV_STATUS_OUT_OF_SLOTS;
    }
    if (short_of_pages) return MKV_STATUS_OUT_OF_PAGES;
    m->active[slot] = 1;
    m->N[slot] = 0;
    m->res[slot] = demand;
    if (out_slot) *out_slot = slot;
    return MKV_STATUS_OK;
}

static int bad_slot_list(const tu_model_t *m, int32_t n, const int32_t *slots)
{
    if (n < 1) return 1;
    for (int32_t j = 0; j < n; j++) {
        if (slots[j] < 0 || slots[j] >= m->S || !m->active[slots[j]]) return 1;
        for (int32_t k = 0; k < j; k++)
            if (slots[k] == slots[j]) return 1;
    }
    return 0;
}

mkv_status_t tu_model_resize(tu_model_t *m, int32_t n, const int32_t *slots,
                             const int32_t *seq_len, const int32_t *n_hi, const int32_t *n_lo)
{
    int32_t LH = m->L * m->H;
    if (bad_slot_list(m, n, slots)) return MKV_STATUS_INVALID_ARGUMENT;
    for (int32_t j = 0; j < n; j++) {
        int32_t newN = seq_len ? seq_len[j] : m->N[slots[j]];
        if (newN < m->N[slots[j]] || newN > m->max_seq_len) return MKV_STATUS_INVALID_ARGUMENT;
        for (int32_t i = 0; i < LH; i++) {
            int32_t h = n_hi[j * LH + i], l = n_lo[j * LH + i];
            if (h < 0 || l < 0 || (int64_t)h + l > newN) return MKV_STATUS_INVALID_ARGUMENT;
        }
    }
    /* Demand against the pages not reserved for slots outside the call. */
    int64_t alloc = 0, rel = 0, res_ops = 0;
    for (int32_t j = 0; j < n; j++) {
        res_ops += m->res[slots[j]];
        for (int32_t i = 0; i < LH; i++) {
            int64_t r = (int64_t)slots[j] * LH + i;
            int32_t dh = pages_for(n_hi[j * LH + i], m->tpp_hi) - pages_for(m->n_hi[r], m->tpp_hi);
            int32_t dl = pages_for(n_lo[j * LH + i], m->tpp_lo) - pages_for(m->n_lo[r], m->tpp_lo);
            alloc += (dh > 0 ? dh : 0) + (dl > 0 ? dl : 0);
            rel += (dh < 0 ? -dh : 0) + (dl < 0 ? -dl : 0);
        }
    }
    if (alloc > m->fifo_len + rel - (tu_model_reserved_total(m) - res_ops))
        return MKV_STATUS_OUT_OF_PAGES;
    /* Phase 1: recycle, sections in call order, each section's lost entries ascending. */
    for (int32_t j = 0; j < n; j++)
        for (int32_t i = 0; i < LH; i++) {
            int64_t r = (int64_t)slots[j] * LH + i;
            int32_t kh = pages_for(n_hi[j * LH + i], m->tpp_hi);
            int32_t kl = pages_for(n_lo[j * LH + i], m->tpp_lo);
            for (int32_t k = kh; k < pages_for(m->n_hi[r], m->tpp_hi); k++)
                fifo_push(m, m->hi[r * m->T + k]);
            for (int32_t k = kl; k < pages_for(m->n_lo[r], m->tpp_lo); k++)
                fifo_push(m, m->lo[r * m->T + k]);
        }
    /* Phase 2: allocate from the queue's front, same order. */
    for (int32_t j = 0; j < n; j++)
        for (int32_t i = 0; i < LH; i++) {
            int64_t r = (int64_t)slots[j] * LH + i;
            int32_t kh = pages_for(n_hi[j * LH + i], m->tpp_hi);
            int32_t kl = pages_for(n_lo[j * LH + i], m->tpp_lo);
            for (int32_t k = pages_for(m->n_hi[r], m->tpp_hi); k < kh; k++)
                m->hi[r * m->T + k] = fifo_pop(m);
            for (int32_t k = pages_for(m->n_lo[r], m->tpp_lo); k < kl; k++)
                m->lo[r * m->T + k] = fifo_pop(m);
        }
    for (int32_t j = 0; j < n; j++) {
        for (int32_t i = 0; i < LH; i++) {
            int64_t r = (int64_t)slots[j] * LH + i;
            m->n_hi[r] = n_hi[j * LH + i];
            m->n_lo[r] = n_lo[j * LH + i];
        }
        if (seq_len) m->N[slots[j]] = seq_len[j];
        m->res[slots[j]] = 0;
    }
    return MKV_STATUS_OK;
}

mkv_status_t tu_model_append(tu_model_t *m, int32_t n, const int32_t *slots)
{
    int32_t LH = m->L * m->H;
    if (bad_slot_list(m, n, slots)) return MKV_STATUS_INVALID_ARGUMENT;
    for (int32_t j = 0; j < n; j++)
        if (m->N[slots[j]] >= m->max_seq_len) return MKV_STATUS_INVALID_ARGUMENT;
    /* An append is the resize N + 1, n_hi + 1. */
    int32_t *N = zalloc((size_t)n * sizeof(int32_t));
    int32_t *h = zalloc((size_t)n * LH * sizeof(int32_t));
    int32_t *l = zalloc((size_t)n * LH * sizeof(int32_t));
    for (int32_t j = 0; j < n; j++) {
        N[j] = m->N[slots[j]] + 1;
        for (int32_t i = 0; i < LH; i++) {
            h[j * LH + i] = m->n_hi[(int64_t)slots[j] * LH + i] + 1;
            l[j * LH + i] = m->n_lo[(int64_t)slots[j] * LH + i];
        }
    }
    mkv_status_t s = tu_model_resize(m, n, slots, N, h, l);
    free(N);
    free(h);
    free(l);
    return s;
}

mkv_status_t tu_model_release(tu_model_t *m, int32_t slot)
{
    if (slot < 0 || slot >= m->S || !m->active[slot]) return MKV_STATUS_INVALID_ARGUMENT;
    for (int32_t i = 0; i < m->L * m->H; i++) {
        int64_t r = (int64_t)slot * m->L * m->H + i;
        for (int32_t k = 0; k < pages_for(m->n_hi[r], m->tpp_hi); k++) fifo_push(m, m->hi[r * m->T + k]);
        for (int32_t k = 0; k < pages_for(m->n_lo[r], m->tpp_lo); k++) fifo_push(m, m->lo[r * m->T + k]);
        m->n_hi[r] = m->n_lo[r] = 0;
    }
    m->active[slot] = 0;
    m->N[slot] = 0;
    m->res[slot] = 0;
    return MKV_STATUS_OK;
}

int64_t tu_model_step_demand(const tu_model_t *m, int32_t n, const int32_t *slots)
{
    int64_t d = 0;
    for (int32_t j = 0; j < n; j++)
        for (int32_t i = 0; i < m->L * m->H; i++) {
            int64_t r = (int64_t)slots[j] * m->L * m->H + i;
            d += m->n_hi[r] % m->tpp_hi == 0;
            d += m->N[slots[j]] >= m->W && m->n_lo[r] % m->tpp_lo == 0;
        }
    return d;
}

void tu_model_expect_matches(const tu_model_t *m, mkv_cache_t *c, const char *where)
{
    const mkv_mm_state_t *st = &c->st;
    int32_t T = m->T, LH = m->L * m->H;
    cr_assert_eq(st->head, m->head, "%s: head %lld, model %lld", where, (long long)st->head,
                 (long long)m->head);
    cr_assert_eq(st->tail, m->tail, "%s: tail %lld, model %lld", where, (long long)st->tail,
                 (long long)m->tail);
    for (int64_t i = 0; i < m->fifo_len; i++) {
        int32_t got = st->ring[(st->head + i) % m->P], want = m->fifo[(m->fifo_first + i) % m->P];
        cr_assert_eq(got, want, "%s: free position %lld: page %d, model %d", where, (long long)i,
                     got, want);
    }
    mkv_cache_stats_t want;
    memset(&want, 0, sizeof want);
    want.total_pages = m->P;
    want.free_pages = m->fifo_len;
    want.reserved_pages = tu_model_reserved_total(m);
    want.available_pages = want.free_pages - want.reserved_pages;
    cr_assert_eq(st->reserved_total, want.reserved_pages, "%s: reserved_total %lld, model %lld",
                 where, (long long)st->reserved_total, (long long)want.reserved_pages);
    for (int32_t s = 0; s < m->S; s++) {
        mkv_slot_info_t si, ws;
        memset(&ws, 0, sizeof ws);
        ws.active = m->active[s];
        ws.seq_len = m->N[s];
        ws.reserved_pages = m->res[s];
        cr_assert_eq(st->active[s], m->active[s], "%s: slot %d active %d, model %d", where, s,
                     st->active[s], m->active[s]);
        cr_assert_eq(st->seq_len[s], m->N[s], "%s: slot %d N %d, model %d", where, s,
                     st->seq_len[s], m->N[s]);
        cr_assert_eq(st->reserved[s], m->res[s], "%s: slot %d reserved %lld, model %lld", where,
                     s, (long long)st->reserved[s], (long long)m->res[s]);
        for (int32_t i = 0; i < LH; i++) {
            int64_t r = (int64_t)s * LH + i;
            int32_t kh = pages_for(m->n_hi[r], m->tpp_hi), kl = pages_for(m->n_lo[r], m->tpp_lo);
            cr_assert_eq(st->n_hi[r], m->n_hi[r], "%s: region %lld n_hi %d, model %d", where,
                         (long long)r, st->n_hi[r], m->n_hi[r]);
            cr_assert_eq(st->n_lo[r], m->n_lo[r], "%s: region %lld n_lo %d, model %d", where,
                         (long long)r, st->n_lo[r], m->n_lo[r]);
            for (int32_t e = 0; e < T; e++) {
                int32_t w = e < kh ? m->hi[r * T + e]
                          : T - 1 - e < kl ? m->lo[r * T + (T - 1 - e)] : -1;
                int32_t got = st->table[r * T + e];
                cr_assert_eq(got, w, "%s: region %lld (slot %d) entry %d: page %d, model %d",
                             where, (long long)r, s, e, got, w);
            }
            ws.tokens_hi += m->n_hi[r];
            ws.tokens_lo += m->n_lo[r];
            ws.pages_hi += kh;
            ws.pages_lo += kl;
        }
        TU_COK(c, mkv_cache_slot_info(c, s, &si));
        cr_assert(si.active == ws.active && si.seq_len == ws.seq_len &&
                  si.reserved_pages == ws.reserved_pages && si.tokens_hi == ws.tokens_hi &&
                  si.tokens_lo == ws.tokens_lo && si.pages_hi == ws.pages_hi &&
                  si.pages_lo == ws.pages_lo,
                  "%s: slot_info(%d) = {active %d, N %d, res %lld, tok %lld/%lld, pages "
                  "%lld/%lld}, model {%d, %d, %lld, %lld/%lld, %lld/%lld}",
                  where, s, si.active, si.seq_len, (long long)si.reserved_pages,
                  (long long)si.tokens_hi, (long long)si.tokens_lo, (long long)si.pages_hi,
                  (long long)si.pages_lo, ws.active, ws.seq_len, (long long)ws.reserved_pages,
                  (long long)ws.tokens_hi, (long long)ws.tokens_lo, (long long)ws.pages_hi,
                  (long long)ws.pages_lo);
        want.pages_hi += ws.pages_hi;
        want.pages_lo += ws.pages_lo;
        want.tokens_hi += ws.tokens_hi;
        want.tokens_lo += ws.tokens_lo;
        if (m->active[s]) {
            want.tokens_seen += (int64_t)m->N[s] * LH;
            want.active_slots++;
            int64_t demand = 0;
            TU_COK(c, mkv_cache_step_demand(c, 1, &s, &demand));
            cr_assert_eq(demand, tu_model_step_demand(m, 1, &s), "%s: step_demand(%d) %lld, "
                         "model %lld", where, s, (long long)demand,
                         (long long)tu_model_step_demand(m, 1, &s));
        }
    }
    want.tokens_pruned = want.tokens_seen - want.tokens_hi - want.tokens_lo;
    want.bytes_in_use = (want.pages_hi + want.pages_lo) * m->page_bytes;
    want.bytes_fp16 = want.tokens_seen * 2 * m->d * 2;
    mkv_cache_stats_t got = tu_stats(c);
    tu_stats_expect_equal(&got, &want, where);
    tu_expect_valid(c, where);
}

/* ---------------------------------------------------------------------------------------- */
/* Random operations                                                                        */
/* ---------------------------------------------------------------------------------------- */

void tu_op_init(tu_op_t *op, const tu_model_t *m)
{
    memset(op, 0, sizeof *op);
    op->slots = zalloc((size_t)(m->S + 1) * sizeof(int32_t));
    op->seq_len = zalloc((size_t)(m->S + 1) * sizeof(int32_t));
    op->n_hi = zalloc((size_t)(m->S + 1) * m->L * m->H * sizeof(int32_t));
    op->n_lo = zalloc((size_t)(m->S + 1) * m->L * m->H * sizeof(int32_t));
}

void tu_op_free(tu_op_t *op)
{
    free(op->slots);
    free(op->seq_len);
    free(op->n_hi);
    free(op->n_lo);
    memset(op, 0, sizeof *op);
}

/* A random non-empty subset of the active slots (those with N < max_seq_len when room is set)
 * in random order; returns its size (0 when there is none). */
static int32_t pick_slots(tu_rng_t *r, const tu_model_t *m, int room, int32_t *out)
{
    int32_t n = 0;
    for (int32_t s = 0; s < m->S; s++)
        if (m->active[s] && (!room || m->N[s] < m->max_seq_len)) out[n++] = s;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t k = tu_rand_range(r, 0, i), t = out[i];
        out[i] = out[k];
        out[k] = t;
    }
    return n ? tu_rand_range(r, 1, n) : 0;
}

void tu_op_random(tu_rng_t *r, const tu_model_t *m, tu_op_t *op)
{
    static const char *const labels[] = {"admit", "append", "grow", "shrink", "mixed",
                                         "place", "release", "over", "bad"};
    static const int weights[] = {14, 26, 10, 12, 14, 8, 9, 4, 3};
    int32_t LH = m->L * m->H, pick = tu_rand_range(r, 0, 99), k = 0;
    while (pick >= weights[k]) pick -= weights[k++];
    op->label = labels[k];
    op->use_seq_len = 0;
    int32_t n = pick_slots(r, m, k == 1, op->slots);
    if (k == 0 || n == 0) { /* admit; also when no slot can take the drawn operation */
        op->kind = TU_OP_ADMIT;
        op->label = "admit";
        op->prompt_len = tu_rand_range(r, 0, 1) ? tu_rand_range(r, 1, 8)
                                                 : tu_rand_range(r, 1, m->max_seq_len);
        return;
    }
    if (k == 6) {
        op->kind = TU_OP_RELEASE;
        op->slot = op->slots[0];
        return;
    }
    op->n = n;
    if (k == 1) {
        op->kind = TU_OP_APPEND;
        return;
    }
    op->kind = TU_OP_RESIZE;
    op->use_seq_len = k != 3 || tu_rand_range(r, 0, 1);
    for (int32_t j = 0; j < n; j++) {
        int32_t s = op->slots[j], N = m->N[s], M = m->max_seq_len;
        if (k == 2) N += tu_rand_range(r, 0, 8);
        else if (k == 4) N += tu_rand_range(r, 0, 3);
        else if (k == 5 && N == 0) N = tu_rand_range(r, 1, M);
        else if (k == 7) N = M;
        N = N > M ? M : N;
        op->seq_len[j] = N;
        for (int32_t i = 0; i < LH; i++) {
            int64_t reg = (int64_t)s * LH + i;
            int32_t h = m->n_hi[reg], l = m->n_lo[reg];
            if (k == 2) { /* grow: both sections may gain */
                h += tu_rand_range(r, 0, N - h - l);
                l += tu_rand_range(r, 0, N - h - l);
            } else if (k == 3) { /* shrink */
                h = tu_rand_range(r, 0, h);
                l = tu_rand_range(r, 0, l);
            } else if (k == 7) { /* everything high: usually more than the pool */
                h = N;
                l = 0;
            } else { /* mixed, place: any split of N */
                h = tu_rand_range(r, 0, N);
                l = tu_rand_range(r, 0, N - h);
            }
            op->n_hi[j * LH + i] = h;
            op->n_lo[j * LH + i] = l;
        }
    }
    if (k == 8) { /* one kind of invalid input */
        int32_t kind = tu_rand_range(r, 0, 3);
        if (kind == 0) { /* a duplicate slot */
            op->slots[n] = op->slots[0];
            op->seq_len[n] = op->seq_len[0];
            memcpy(op->n_hi + n * LH, op->n_hi, (size_t)LH * sizeof(int32_t));
            memcpy(op->n_lo + n * LH, op->n_lo, (size_t)LH * sizeof(int32_t));
            op->n = n + 1;
        } else if (kind == 1) { /* a free or out-of-range slot */
            int32_t bad = -1;
            for (int32_t s = 0; s < m->S && bad < 0; s++)
                if (!m->active[s]) bad = s;
            op->slots[n - 1] = bad >= 0 && tu_rand_range(r, 0, 1) ? bad : m->S;
        } else if (kind == 2) { /* more tokens than N */
            op->n_lo[(n - 1) * LH + LH - 1] = op->seq_len[n - 1] + 1;
        } else { /* N decreasing (or, from 0, negative counts) */
            op->use_seq_len = 1;
            op->seq_len[n - 1] = m->N[op->slots[n - 1]] - 1;
            if (op->seq_len[n - 1] < 0) op->n_hi[(n - 1) * LH] = -1;
        }
    }
}

mkv_status_t tu_op_apply_cache(mkv_cache_t *c, const tu_op_t *op, int32_t *out_slot)
{
    switch (op->kind) {
    case TU_OP_ADMIT: return mkv_cache_admit(c, op->prompt_len, out_slot);
    case TU_OP_APPEND: return mkv_cache_append(c, op->n, op->slots, NULL);
    case TU_OP_RELEASE: return mkv_cache_release(c, op->slot, NULL);
    case TU_OP_RESIZE: {
        mkv_resize_t rz = {op->n, op->slots, op->use_seq_len ? op->seq_len : NULL, op->n_hi,
                           op->n_lo};
        return mkv_cache_resize(c, &rz, NULL);
    }
    }
    return MKV_STATUS_INTERNAL;
}

mkv_status_t tu_op_apply_model(tu_model_t *m, const tu_op_t *op, int32_t *out_slot,
                               int *also_short)
{
    if (also_short) *also_short = 0;
    switch (op->kind) {
    case TU_OP_ADMIT: return tu_model_admit(m, op->prompt_len, out_slot, also_short);
    case TU_OP_APPEND: return tu_model_append(m, op->n, op->slots);
    case TU_OP_RELEASE: return tu_model_release(m, op->slot);
    case TU_OP_RESIZE:
        return tu_model_resize(m, op->n, op->slots, op->use_seq_len ? op->seq_len : NULL,
                               op->n_hi, op->n_lo);
    }
    return MKV_STATUS_INTERNAL;
}

void *tu_xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    cr_assert_not_null(p);
    return p;
}

mkv_model_t *tu_model_load(const char *dir)
{
    char err[MKV_ERR_LEN];
    mkv_model_t *m = NULL;
    mkv_status_t st = mkv_model_load(dir, &m, err);
    cr_assert_eq(st, MKV_STATUS_OK, "load %s: %s (%s)", dir, mkv_status_string(st), err);
    return m;
}
