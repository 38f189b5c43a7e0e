/*
 * test_memmgr_ops.c — hand-checked memory-manager scenarios with exact page ids: appends across
 * page boundaries, shrink and FIFO reuse, ring wrap-around, full and tiny pools, reservations,
 * slots, and every bad-input path (status, message, nothing changed).
 *
 * Geometry of most tests: tu_config(..., hi_tpp = 4) gives K8V4 pages of 832 bytes at d 128,
 * which hold 4 high tokens and 7 low (K4V2) tokens.
 */
#include "testutil.h"

#include <criterion/criterion.h>

#include <stdlib.h>

static int32_t entry_at(const mkv_cache_t *c, int32_t slot, int32_t layer, int32_t head, int32_t e)
{
    const mkv_mm_state_t *st = &c->st;
    int64_t r = ((int64_t)slot * st->g.n_layers + layer) * st->g.n_kv_heads + head;
    return st->table[r * st->g.row_entries + e];
}

/* The region's row is exactly hi[0..k_hi) from the left, lo[0..k_lo) from the right (lo[k] at
 * entry T - 1 - k), -1 elsewhere. */
static void expect_row(const mkv_cache_t *c, int32_t slot, int32_t layer, int32_t head,
                       const int32_t *hi, int32_t k_hi, const int32_t *lo, int32_t k_lo)
{
    int32_t T = c->st.g.row_entries;
    for (int32_t e = 0; e < T; e++) {
        int32_t want = -1;
        if (e < k_hi) want = hi[e];
        else if (T - 1 - e < k_lo) want = lo[T - 1 - e];
        int32_t got = entry_at(c, slot, layer, head, e);
        cr_assert_eq(got, want, "row (slot %d, layer %d, head %d) entry %d: page %d, expected %d",
                     slot, layer, head, e, got, want);
    }
}

/* The free region of the ring, from head, is exactly ids[0..n). */
static void expect_free(const mkv_cache_t *c, const int32_t *ids, int64_t n)
{
    const mkv_mm_state_t *st = &c->st;
    cr_assert_eq(st->tail - st->head, n, "free pages %lld (head %lld, tail %lld), expected %lld",
                 (long long)(st->tail - st->head), (long long)st->head, (long long)st->tail,
                 (long long)n);
    for (int64_t i = 0; i < n; i++) {
        int32_t got = st->ring[(st->head + i) % st->g.pool_pages];
        cr_assert_eq(got, ids[i], "free region position %lld (ring pos %lld): page %d, expected %d",
                     (long long)i, (long long)(st->head + i), got, ids[i]);
    }
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__})
#define NIDS(...) ((int32_t)(sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)))
/* Expected rows (high pages only, or empty) and free regions, as literal id lists. */
#define ROW_HI(c, s, l, h, ...) expect_row(c, s, l, h, IDS(__VA_ARGS__), NIDS(__VA_ARGS__), NULL, 0)
#define ROW_EMPTY(c, s, l, h) expect_row(c, s, l, h, NULL, 0, NULL, 0)
#define FREE_IS(c, ...) expect_free(c, IDS(__VA_ARGS__), NIDS(__VA_ARGS__))
#define FREE_NONE(c) expect_free(c, NULL, 0)

/* The free region is from, from + 1, ..., to, then extra[0..n_extra). */
static void expect_free_run(const mkv_cache_t *c, int32_t from, int32_t to, const int32_t *extra,
                            int32_t n_extra)
{
    int32_t n = to - from + 1 + n_extra, *ids = malloc((size_t)n * sizeof(int32_t));
    cr_assert_not_null(ids);
    for (int32_t i = from; i <= to; i++) ids[i - from] = i;
    for (int32_t i = 0; i < n_extra; i++) ids[to - from + 1 + i] = extra[i];
    expect_free(c, ids, n);
    free(ids);
}

static mkv_cache_t *make(int32_t L, int32_t H, int32_t S, int32_t max_len, int64_t P)
{
    mkv_cache_config_t cfg = tu_config(L, H, S, max_len, 4, P);
    mkv_cache_t *c = tu_create(&cfg);
    mkv_cache_info_t info = tu_info(c);
    cr_assert_eq(info.tokens_per_page_hi, 4);
    cr_assert_eq(info.tokens_per_page_lo, 7);
    cr_assert_eq(info.row_entries, (max_len + 3) / 4 + 1);
    return c;
}

static int32_t admit(mkv_cache_t *c, int32_t prompt_len, int32_t want_slot)
{
    int32_t slot = -1;
    TU_COK(c, mkv_cache_admit(c, prompt_len, &slot));
    cr_assert_eq(slot, want_slot, "admitted into slot %d, expected %d", slot, want_slot);
    cr_assert_str_eq(mkv_cache_last_error(c), "", "a success left a message");
    return slot;
}

static void append(mkv_cache_t *c, int32_t n, const int32_t *slots)
{
    TU_COK(c, mkv_cache_append(c, n, slots, NULL));
    tu_expect_valid(c, "append");
}

/* Resize of one slot with L * H = 2 regions. seq_len < 0: NULL. */
static mkv_status_t resize1(mkv_cache_t *c, int32_t slot, int32_t seq_len, int32_t h0, int32_t h1,
                            int32_t l0, int32_t l1)
{
    int32_t hi[2] = {h0, h1}, lo[2] = {l0, l1};
    mkv_resize_t rz = {1, &slot, seq_len >= 0 ? &seq_len : NULL, hi, lo};
    return mkv_cache_resize(c, &rz, NULL);
}

static void expect_counters(const mkv_cache_t *c, int64_t head, int64_t tail, int64_t reserved)
{
    cr_assert_eq(c->st.head, head, "head %lld, expected %lld", (long long)c->st.head,
                 (long long)head);
    cr_assert_eq(c->st.tail, tail, "tail %lld, expected %lld", (long long)c->st.tail,
                 (long long)tail);
    mkv_cache_stats_t s = tu_stats(c);
    cr_assert_eq(s.reserved_pages, reserved, "reserved %lld, expected %lld",
                 (long long)s.reserved_pages, (long long)reserved);
    cr_assert_eq(s.free_pages, tail - head);
    cr_assert_eq(s.available_pages, tail - head - reserved);
}

static int64_t step_demand(mkv_cache_t *c, int32_t n, const int32_t *slots)
{
    int64_t d = -1;
    TU_COK(c, mkv_cache_step_demand(c, n, slots, &d));
    return d;
}

static int can_admit(mkv_cache_t *c, int32_t prompt_len)
{
    int ok = -1;
    TU_COK(c, mkv_cache_can_admit(c, prompt_len, &ok));
    cr_assert(ok == 0 || ok == 1);
    return ok;
}

Test(ops, admit_append_page_ids)
{
    mkv_cache_t *c = make(1, 2, 2, 32, 20);
    int32_t s0 = 0, both[2] = {1, 0};
    cr_assert_eq(can_admit(c, 3), 1);
    admit(c, 3, 0);
    expect_counters(c, 0, 20, 4); /* 1 * 2 * (ceil(3 / 4) + 1) */
    cr_assert_eq(step_demand(c, 1, &s0), 2);
    append(c, 1, &s0);
    ROW_HI(c, 0, 0, 0, 0);
    ROW_HI(c, 0, 0, 1, 1);
    expect_counters(c, 2, 20, 0); /* the first append ends the reservation */
    expect_free_run(c, 2, 19, NULL, 0);
    for (int i = 0; i < 3; i++) append(c, 1, &s0);
    expect_counters(c, 2, 20, 0); /* n_hi 4: still one page per region */
    cr_assert_eq(step_demand(c, 1, &s0), 2);
    append(c, 1, &s0);
    ROW_HI(c, 0, 0, 0, 0, 2);
    ROW_HI(c, 0, 0, 1, 1, 3);
    for (int i = 0; i < 3; i++) append(c, 1, &s0);
    /* N = 8 >= W = 8 with full sections: one high and one low page per region. */
    cr_assert_eq(step_demand(c, 1, &s0), 4);
    admit(c, 1, 1);
    cr_assert_eq(step_demand(c, 2, both), 6);
    /* Pages go in call order (slot 1 first), not slot order. */
    append(c, 2, both);
    ROW_HI(c, 1, 0, 0, 4);
    ROW_HI(c, 1, 0, 1, 5);
    ROW_HI(c, 0, 0, 0, 0, 2, 6);
    ROW_HI(c, 0, 0, 1, 1, 3, 7);
    expect_free_run(c, 8, 19, NULL, 0);
    expect_counters(c, 8, 20, 0);

    mkv_cache_stats_t st = tu_stats(c);
    cr_assert_eq(st.pages_hi, 8);
    cr_assert_eq(st.pages_lo, 0);
    cr_assert_eq(st.tokens_hi, 2 * 9 + 2 * 1);
    cr_assert_eq(st.tokens_seen, (9 + 1) * 2);
    cr_assert_eq(st.tokens_pruned, 0);
    cr_assert_eq(st.active_slots, 2);
    cr_assert_eq(st.bytes_in_use, 8 * 832);
    cr_assert_eq(st.bytes_fp16, 20 * 2 * 128 * 2);
    mkv_slot_info_t si;
    TU_COK(c, mkv_cache_slot_info(c, 0, &si));
    cr_assert(si.active == 1 && si.seq_len == 9 && si.reserved_pages == 0 && si.tokens_hi == 18 &&
              si.tokens_lo == 0 && si.pages_hi == 6 && si.pages_lo == 0);
    mkv_cache_destroy(c);
}

Test(ops, shrink_recycles_tail_then_fifo_reuse)
{
    mkv_cache_t *c = make(1, 2, 1, 32, 8);
    admit(c, 12, 0);
    expect_counters(c, 0, 8, 8); /* 2 * (3 + 1): the whole pool */
    cr_assert_eq(can_admit(c, 1), 0);
    TU_COK(c, resize1(c, 0, 12, 12, 12, 0, 0));
    ROW_HI(c, 0, 0, 0, 0, 1, 2);
    ROW_HI(c, 0, 0, 1, 3, 4, 5);
    FREE_IS(c, 6, 7);
    expect_counters(c, 6, 8, 0);
    /* Shrink: the sections' last pages go to the ring's tail in section order. */
    TU_COK(c, resize1(c, 0, -1, 4, 8, 0, 0));
    ROW_HI(c, 0, 0, 0, 0);
    ROW_HI(c, 0, 0, 1, 3, 4);
    FREE_IS(c, 6, 7, 1, 2, 5);
    expect_counters(c, 6, 11, 0);
    cr_assert_eq(c->st.ring[0], 1); /* ring positions 8, 9, 10 wrap to 0, 1, 2 */
    cr_assert_eq(c->st.ring[1], 2);
    cr_assert_eq(c->st.ring[2], 5);
    /* Low pages fill the row from the right. */
    TU_COK(c, resize1(c, 0, -1, 4, 8, 8, 0));
    expect_row(c, 0, 0, 0, IDS(0), 1, IDS(6, 7), 2);
    FREE_IS(c, 1, 2, 5);
    /* Mixed: recycle first (r0 lo gives 6, 7; r1 hi gives 4), then allocate from the head
     * in section order (r0 hi takes 1, 2; r1 lo takes 5). */
    TU_COK(c, resize1(c, 0, -1, 12, 4, 0, 7));
    ROW_HI(c, 0, 0, 0, 0, 1, 2);
    expect_row(c, 0, 0, 1, IDS(3), 1, IDS(5), 1);
    FREE_IS(c, 6, 7, 4);
    expect_counters(c, 11, 14, 0);
    /* Pages released in the call serve the call: alloc 4 > free 3, but 4 come back first. */
    TU_COK(c, resize1(c, 0, -1, 0, 12, 12, 0));
    expect_row(c, 0, 0, 0, NULL, 0, IDS(6, 7), 2);
    ROW_HI(c, 0, 0, 1, 3, 4, 0);
    FREE_IS(c, 1, 2, 5);
    expect_counters(c, 15, 18, 0);
    tu_expect_valid(c, "end");
    mkv_cache_destroy(c);
}

Test(ops, ring_wraps_many_times)
{
    mkv_cache_config_t cfg = tu_config(1, 1, 1, 20, 4, 5);
    mkv_cache_t *c = tu_create(&cfg);
    int32_t slot = 0, zero = 0, twelve = 12, N = 20;
    admit(c, 1, 0);
    mkv_resize_t rz = {1, &slot, &N, &zero, &zero};
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    rz.seq_len = NULL;
    for (int32_t i = 0; i < 10; i++) {
        rz.n_hi = &twelve; /* three pages */
        TU_COK(c, mkv_cache_resize(c, &rz, NULL));
        ROW_HI(c, 0, 0, 0, (3 * i) % 5, (3 * i + 1) % 5, (3 * i + 2) % 5);
        FREE_IS(c, (3 * i + 3) % 5, (3 * i + 4) % 5);
        expect_counters(c, 3 * i + 3, 5 + 3 * i, 0);
        rz.n_hi = &zero;
        TU_COK(c, mkv_cache_resize(c, &rz, NULL));
        ROW_EMPTY(c, 0, 0, 0);
        FREE_IS(c, (3 * i + 3) % 5, (3 * i + 4) % 5, (3 * i + 5) % 5, (3 * i + 6) % 5,
                (3 * i + 7) % 5);
        expect_counters(c, 3 * i + 3, 8 + 3 * i, 0);
        tu_expect_valid(c, "wrap");
    }
    cr_assert_eq(c->st.head, 30); /* head and tail passed P six times */
    mkv_cache_destroy(c);
}

Test(ops, full_pool)
{
    mkv_cache_t *c = make(1, 2, 2, 32, 6);
    int32_t s0 = 0;
    admit(c, 8, 0);
    expect_counters(c, 0, 6, 6);
    cr_assert_eq(can_admit(c, 1), 0);
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, mkv_cache_admit(c, 1, &s0));
    TU_COK(c, resize1(c, 0, 8, 8, 8, 0, 0));
    TU_COK(c, resize1(c, 0, 12, 12, 12, 0, 0));
    ROW_HI(c, 0, 0, 0, 0, 1, 4);
    ROW_HI(c, 0, 0, 1, 2, 3, 5);
    expect_counters(c, 6, 6, 0);
    cr_assert_eq(tu_stats(c).available_pages, 0);
    cr_assert_eq(step_demand(c, 1, &s0), 4);
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, mkv_cache_append(c, 1, &s0, NULL));
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, mkv_cache_admit(c, 1, &s0));
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, resize1(c, 0, 13, 13, 12, 0, 0));
    /* One region gives a page back, the other takes it in the same call. */
    TU_COK(c, resize1(c, 0, 16, 8, 16, 0, 0));
    ROW_HI(c, 0, 0, 0, 0, 1);
    ROW_HI(c, 0, 0, 1, 2, 3, 5, 4);
    TU_COK(c, resize1(c, 0, -1, 4, 16, 0, 0));
    FREE_IS(c, 1);
    /* Releases 1, would allocate 3 (15 low tokens): 1 free + 1 released do not cover it. */
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, resize1(c, 0, -1, 0, 16, 15, 0));
    TU_COK(c, resize1(c, 0, -1, 0, 16, 14, 0));
    expect_row(c, 0, 0, 0, NULL, 0, IDS(1, 0), 2);
    FREE_NONE(c);
    /* Release: region order, high section before low, each in section order. */
    TU_COK(c, mkv_cache_release(c, 0, NULL));
    FREE_IS(c, 1, 0, 2, 3, 5, 4);
    ROW_EMPTY(c, 0, 0, 0);
    ROW_EMPTY(c, 0, 0, 1);
    mkv_cache_stats_t st = tu_stats(c);
    cr_assert(st.active_slots == 0 && st.pages_hi == 0 && st.pages_lo == 0 && st.tokens_seen == 0);
    admit(c, 8, 0);
    tu_expect_valid(c, "end");
    mkv_cache_destroy(c);
}

Test(ops, one_page_pool)
{
    mkv_cache_config_t cfg = tu_config(1, 1, 2, 8, 4, 1);
    mkv_cache_t *c = tu_create(&cfg);
    int32_t slot = -1;
    cr_assert_eq(tu_info(c).config.pool_pages, 1);
    /* The prompt demand is at least 2 pages per region: nothing is ever admitted. */
    cr_assert_eq(can_admit(c, 1), 0);
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, mkv_cache_admit(c, 1, &slot));
    cr_assert_eq(tu_stats(c).free_pages, 1);
    mkv_cache_destroy(c);
}

Test(ops, two_page_pool)
{
    mkv_cache_config_t cfg = tu_config(1, 1, 2, 8, 4, 2);
    mkv_cache_t *c = tu_create(&cfg);
    int32_t s = 0, one = 1, zero = 0, seven = 7, four = 4;
    admit(c, 4, 0);
    for (int i = 0; i < 4; i++) append(c, 1, &s);
    ROW_HI(c, 0, 0, 0, 0);
    FREE_IS(c, 1);
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, mkv_cache_admit(c, 1, &s));
    for (int i = 0; i < 4; i++) append(c, 1, &s);
    ROW_HI(c, 0, 0, 0, 0, 1);
    FREE_NONE(c);
    TU_EXPECT_REFUSED(c, MKV_STATUS_INVALID_ARGUMENT, mkv_cache_append(c, 1, &s, NULL));
    mkv_resize_t rz = {1, &s, NULL, &zero, &zero};
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    FREE_IS(c, 0, 1);
    rz.n_lo = &seven;
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    rz.n_hi = &one;
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    expect_row(c, 0, 0, 0, IDS(1), 1, IDS(0), 1);
    rz.n_hi = &zero;
    rz.n_lo = &zero;
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    FREE_IS(c, 1, 0);
    int32_t next = 1, other = 0;
    for (int i = 0; i < 6; i++) { /* the two ids alternate */
        rz.n_hi = &four;
        TU_COK(c, mkv_cache_resize(c, &rz, NULL));
        ROW_HI(c, 0, 0, 0, next);
        rz.n_hi = &zero;
        TU_COK(c, mkv_cache_resize(c, &rz, NULL));
        FREE_IS(c, other, next);
        int32_t t = next;
        next = other;
        other = t;
    }
    tu_expect_valid(c, "end");
    mkv_cache_destroy(c);
}

Test(ops, reservations)
{
    mkv_cache_t *c = make(1, 2, 3, 32, 12);
    int32_t s = -1, s1 = 1, s2 = 2;
    admit(c, 4, 0);
    admit(c, 8, 1);
    expect_counters(c, 0, 12, 10);
    mkv_slot_info_t si;
    TU_COK(c, mkv_cache_slot_info(c, 1, &si));
    cr_assert(si.active == 1 && si.seq_len == 0 && si.reserved_pages == 6);
    cr_assert_eq(can_admit(c, 1), 0);
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, mkv_cache_admit(c, 1, &s));
    /* Slot 1's own reservation covers its placement; it ends there. */
    TU_COK(c, resize1(c, 1, 8, 8, 8, 0, 0));
    ROW_HI(c, 1, 0, 0, 0, 1);
    ROW_HI(c, 1, 0, 1, 2, 3);
    expect_counters(c, 4, 12, 4);
    TU_COK(c, mkv_cache_slot_info(c, 1, &si));
    cr_assert_eq(si.reserved_pages, 0);
    cr_assert_eq(can_admit(c, 1), 1);
    admit(c, 1, 2);
    expect_counters(c, 4, 12, 8);
    /* Slot 1 needs 2 pages; the 8 free ones are all reserved for slots 0 and 2. */
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, mkv_cache_append(c, 1, &s1, NULL));
    TU_COK(c, resize1(c, 1, 12, 4, 12, 0, 0)); /* releases one, takes one */
    ROW_HI(c, 1, 0, 0, 0);
    ROW_HI(c, 1, 0, 1, 2, 3, 4);
    expect_free_run(c, 5, 11, IDS(1), 1);
    TU_COK(c, mkv_cache_release(c, 0, NULL)); /* no pages; drops its reservation */
    expect_counters(c, 5, 13, 4);
    TU_COK(c, mkv_cache_slot_info(c, 0, &si));
    cr_assert(si.active == 0 && si.reserved_pages == 0 && si.seq_len == 0);
    append(c, 1, &s1);
    ROW_HI(c, 1, 0, 0, 0, 5);
    ROW_HI(c, 1, 0, 1, 2, 3, 4, 6);
    expect_counters(c, 7, 13, 4);
    append(c, 1, &s2); /* uses (and ends) its own reservation */
    ROW_HI(c, 2, 0, 0, 7);
    ROW_HI(c, 2, 0, 1, 8);
    expect_counters(c, 9, 13, 0);
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_PAGES, mkv_cache_admit(c, 5, &s));
    admit(c, 4, 0);
    TU_COK(c, mkv_cache_release(c, 2, NULL));
    expect_free_run(c, 9, 11, IDS(1, 7, 8), 3);
    expect_counters(c, 9, 15, 4);
    mkv_cache_destroy(c);
}

Test(ops, out_of_slots)
{
    mkv_cache_t *c = make(1, 1, 2, 16, 40);
    int32_t s = -1;
    admit(c, 3, 0);
    admit(c, 3, 1);
    cr_assert_eq(can_admit(c, 1), 0);
    TU_EXPECT_REFUSED(c, MKV_STATUS_OUT_OF_SLOTS, mkv_cache_admit(c, 1, &s));
    TU_COK(c, mkv_cache_release(c, 0, NULL));
    cr_assert_eq(can_admit(c, 1), 1);
    admit(c, 16, 0);
    TU_COK(c, mkv_cache_release(c, 1, NULL));
    admit(c, 1, 1);
    mkv_cache_destroy(c);
}

Test(ops, bad_inputs_change_nothing)
{
    const mkv_status_t E = MKV_STATUS_INVALID_ARGUMENT;
    mkv_cache_t *c = make(1, 2, 3, 16, 40);
    admit(c, 4, 0);
    admit(c, 4, 1);
    TU_COK(c, resize1(c, 0, 10, 6, 3, 2, 7));
    TU_COK(c, resize1(c, 1, 16, 16, 0, 0, 16));
    mkv_cache_stats_t st = tu_stats(c);
    cr_assert(st.pages_hi == 7 && st.pages_lo == 5 && st.tokens_hi == 25 && st.tokens_lo == 25 &&
              st.tokens_seen == 52 && st.tokens_pruned == 2 && st.bytes_in_use == 12 * 832 &&
              st.bytes_fp16 == 52 * 512 && st.free_pages == 28 && st.reserved_pages == 0);
    mkv_slot_info_t si;
    int64_t d;
    TU_COK(c, mkv_cache_slot_info(c, 0, &si));
    cr_assert(si.active == 1 && si.seq_len == 10 && si.tokens_hi == 9 && si.tokens_lo == 9 &&
              si.pages_hi == 3 && si.pages_lo == 2);
    int32_t s;
    TU_EXPECT_REFUSED(c, E, mkv_cache_admit(c, 0, &s));
    TU_EXPECT_REFUSED(c, E, mkv_cache_admit(c, -1, &s));
    TU_EXPECT_REFUSED(c, E, mkv_cache_admit(c, 17, &s));
    /* A const handle cannot hold a message: it goes to mkv_last_error(). */
    cr_assert_eq(mkv_cache_prompt_demand(c, 0, &d), E);
    cr_assert_str_neq(mkv_last_error(), "");
    cr_assert_eq(mkv_cache_prompt_demand(c, 17, &d), E);
    TU_EXPECT_REFUSED(c, E, mkv_cache_append(c, 1, IDS(-1), NULL));
    TU_EXPECT_REFUSED(c, E, mkv_cache_append(c, 1, IDS(3), NULL));
    TU_EXPECT_REFUSED(c, E, mkv_cache_append(c, 1, IDS(2), NULL));     /* inactive */
    TU_EXPECT_REFUSED(c, E, mkv_cache_append(c, 2, IDS(0, 0), NULL));  /* duplicate */
    TU_EXPECT_REFUSED(c, E, mkv_cache_append(c, 1, IDS(1), NULL));     /* N = max_seq_len */
    TU_EXPECT_REFUSED(c, E, mkv_cache_append(c, 2, IDS(0, 1), NULL));  /* all or nothing */
    TU_EXPECT_REFUSED(c, E, mkv_cache_append(c, 2, IDS(0, 2), NULL));
    TU_EXPECT_REFUSED(c, E, mkv_cache_append(c, -1, IDS(0), NULL));
    TU_EXPECT_REFUSED(c, E, mkv_cache_step_demand(c, 1, IDS(3), &d));
    TU_EXPECT_REFUSED(c, E, mkv_cache_step_demand(c, 1, IDS(-1), &d));

    int32_t hi[4] = {6, 3, 0, 0}, lo[4] = {2, 7, 0, 16}, N2[2] = {12, 16};
    mkv_resize_t rz = {1, IDS(3), NULL, hi, lo};
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.slots = IDS(-1);
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.slots = IDS(2);
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.slots = IDS(0, 0);
    rz.n_slots = 2;
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.n_slots = -1;
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.n_slots = 1;
    rz.slots = IDS(0);
    rz.seq_len = IDS(9); /* N decreasing */
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.seq_len = IDS(17); /* above max_seq_len */
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.seq_len = NULL;
    rz.n_hi = IDS(-1, 3);
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.n_hi = IDS(6, 3);
    rz.n_lo = IDS(2, -7);
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.n_lo = IDS(5, 7); /* 11 tokens in N = 10 */
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    rz.seq_len = IDS(11); /* the same counts are fine with N = 11 */
    TU_COK(c, mkv_cache_resize(c, &rz, NULL));
    cr_assert_eq(c->st.seq_len[0], 11);
    /* Two slots: the first would grow, the second is invalid; nothing happens. */
    hi[0] = 10;
    lo[3] = 17;
    rz = (mkv_resize_t){2, IDS(0, 1), N2, hi, lo};
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));
    lo[3] = 16;
    N2[1] = 15;
    TU_EXPECT_REFUSED(c, E, mkv_cache_resize(c, &rz, NULL));

    TU_EXPECT_REFUSED(c, E, mkv_cache_release(c, -1, NULL));
    TU_EXPECT_REFUSED(c, E, mkv_cache_release(c, 3, NULL));
    TU_EXPECT_REFUSED(c, E, mkv_cache_release(c, 2, NULL)); /* free slot */
    TU_EXPECT_REFUSED(c, E, mkv_cache_slot_info(c, -1, &si));
    TU_EXPECT_REFUSED(c, E, mkv_cache_slot_info(c, 3, &si));
    int ok = 1;
    mkv_status_t cs = mkv_cache_can_admit(c, 0, &ok);
    cr_assert(cs == E || (cs == MKV_STATUS_OK && ok == 0), "can_admit(0) says yes");
    TU_COK(c, mkv_cache_slot_info(c, 2, &si));
    cr_assert_str_eq(mkv_cache_last_error(c), "", "a success left the last message");
    cr_assert(si.active == 0 && si.seq_len == 0 && si.pages_hi == 0 && si.reserved_pages == 0);
    mkv_cache_destroy(c);
}

/* mkv_cache_seq_lens: each slot's N as mkv_cache_slot_info has it, in the order asked; bad
 * arguments refused with the output untouched. */
Test(ops, seq_lens_match_slot_info)
{
    mkv_cache_t *c = make(1, 2, 3, 32, 40);
    admit(c, 3, 0);
    admit(c, 1, 1);
    int32_t s0 = 0, s1 = 1, order[2] = {1, 0}, got[3] = {-7, -7, -7};
    for (int i = 0; i < 5; i++) append(c, 1, &s0);
    append(c, 1, &s1);
    TU_COK(c, mkv_cache_seq_lens(c, 2, order, got));
    for (int j = 0; j < 2; j++) {
        mkv_slot_info_t si;
        TU_COK(c, mkv_cache_slot_info(c, order[j], &si));
        cr_assert_eq(got[j], si.seq_len, "slot %d: %d, slot_info %d", order[j], got[j], si.seq_len);
    }
    cr_assert_eq(got[1] - got[0], 4, "slot 0 took four more appends than slot 1");
    cr_assert_eq(got[2], -7, "written past n_slots");
    TU_COK(c, mkv_cache_seq_lens(c, 0, NULL, NULL));
    const int32_t bad[][2] = {{0, 2}, {0, 3}, {-1, 0}};
    for (int b = 0; b < 3; b++) {
        int32_t out[2] = {-7, -7};
        cr_assert_eq(mkv_cache_seq_lens(c, 2, bad[b], out), MKV_STATUS_INVALID_ARGUMENT, "case %d", b);
        cr_assert(strstr(mkv_cache_last_error(c), "not an active slot"), "case %d: %s", b,
                  mkv_cache_last_error(c));
        cr_assert(out[0] == -7 && out[1] == -7, "case %d wrote its output", b);
    }
    cr_assert_eq(mkv_cache_seq_lens(c, 1, &s0, NULL), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_cache_seq_lens(c, -1, &s0, got), MKV_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(mkv_cache_seq_lens(NULL, 1, &s0, got), MKV_STATUS_INVALID_ARGUMENT);
    tu_expect_valid(c, "after refused calls");
    mkv_cache_destroy(c);
}
