/*
 * resize.c — batched allocation and recycling (DiffKV's parallel KV compaction, on the CPU).
 *
 * Every call that moves pages (append, resize, release) runs the same four phases, written so
 * the CUDA backend can follow them kernel for kernel:
 *   1. plan       (parallel) each section's target token count and how many pages it gains
 *                 (alloc) or gives back (release); invalid targets are caught here;
 *   2. coordinate an exclusive prefix sum over alloc (offsets from head) and one over release
 *                 (offsets from tail); refuse, with nothing changed, when the pages allocated
 *                 exceed free + released - the reservations of other slots;
 *   3. recycle    (parallel) each shrinking section writes its last pages to the ring at
 *                 tail + offset, in section order; tail advances by the total;
 *   4. allocate   (parallel) each growing section reads its new pages from head + offset;
 *                 head advances by the total; counts are committed.
 * Sections are numbered 2 * i (high) and 2 * i + 1 (low) for the i-th head-region of the
 * call, i = (j * L + layer) * H + head for the j-th listed slot, so the result does not depend
 * on the number of threads.
 *
 * On the CPU the prefix sums are chunked: the head-regions are cut into one contiguous chunk
 * per thread, each chunk scans its own sections in phase 1 (mkv_exclusive_scan_i32, the
 * reference of the CUB scan), a short serial pass turns the chunk totals into chunk bases, and
 * phases 3 and 4 add the base. The offsets are those of one global exclusive scan.
 */
#include "memmgr/cache.h"
#include "memmgr/cuda_mm.h"
#include "memmgr/scan.h"

#include <string.h>

typedef enum op_kind { OP_RESIZE, OP_APPEND, OP_RELEASE } op_kind_t;

typedef struct mkv_mm_op {
    mkv_cache_t *c;
    op_kind_t kind;
    int32_t n_slots;
    const int32_t *slots;   /* [n_slots] */
    const int32_t *tgt_hi;  /* OP_RESIZE: [n_slots][L][H] */
    const int32_t *tgt_lo;
    const int32_t *new_len; /* OP_RESIZE: [n_slots] new N */
    int64_t n_regions;      /* n_slots * L * H */
    int32_t n_chunks;       /* 1, or one per thread for calls large enough to pay for waking them */
    int64_t head, tail;     /* counters before the call */
    int len_given;          /* OP_RESIZE: the caller set N (else N stays) */
    int async;              /* CUDA: enqueue without waiting (a refusal is collected later) */
    mkv_status_t (*between)(void *ctx, void *stream, char *err); /* CUDA: after the fit check */
    void *between_ctx;
} op_t;

/* Walks the call's head-regions i in [begin, end) with their table regions r, without a
 * division per region. */
typedef struct region_iter {
    int64_t i, end;
    int64_t per_slot; /* L * H */
    int32_t j;        /* index into slots of the next region */
    int64_t k;        /* region within the slot */
    int32_t cur_j;    /* index into slots of the region just returned */
} region_iter_t;

static inline region_iter_t iter_begin(const op_t *op, int64_t begin, int64_t end)
{
    const int64_t per_slot = (int64_t)op->c->st.g.n_layers * op->c->st.g.n_kv_heads;
    region_iter_t it = {begin, end, per_slot, (int32_t)(begin / per_slot), begin % per_slot, 0};
    return it;
}

static inline int iter_next(const op_t *op, region_iter_t *it, int64_t *i, int64_t *r)
{
    if (it->i >= it->end) return 0;
    *i = it->i++;
    it->cur_j = it->j;
    *r = (int64_t)op->slots[it->j] * it->per_slot + it->k;
    if (++it->k == it->per_slot) {
        it->k = 0;
        it->j++;
    }
    return 1;
}

/* Chunk c of n covers head-regions [n_regions * c / n, n_regions * (c + 1) / n). */
static inline void chunk_range(const op_t *op, int64_t c, int64_t *begin, int64_t *end)
{
    const int64_t n = op->n_chunks;
    *begin = op->n_regions * c / n;
    *end = op->n_regions * (c + 1) / n;
}

static void plan_chunks(void *ctx, int64_t c_begin, int64_t c_end)
{
    const op_t *op = ctx;
    const mkv_mm_state_t *s = &op->c->st;
    mkv_mm_work_t *w = &op->c->work;
    for (int64_t c = c_begin; c < c_end; c++) {
        int64_t begin, end, i, r;
        chunk_range(op, c, &begin, &end);
        w->chunk_bad[c] = -1;
        region_iter_t it = iter_begin(op, begin, end);
        while (iter_next(op, &it, &i, &r)) {
            int32_t hi, lo;
            switch (op->kind) {
            case OP_RESIZE: hi = op->tgt_hi[i]; lo = op->tgt_lo[i]; break;
            case OP_APPEND: hi = s->n_hi[r] + 1; lo = s->n_lo[r]; break;
            default: hi = 0; lo = 0; break;
            }
            if (op->kind == OP_RESIZE &&
                (hi < 0 || lo < 0 || (int64_t)hi + lo > op->new_len[it.cur_j])) {
                if (w->chunk_bad[c] < 0) w->chunk_bad[c] = i;
                hi = s->n_hi[r]; /* keep the plan harmless; the call will be refused */
                lo = s->n_lo[r];
            }
            const int32_t cur[2] = {s->n_hi[r], s->n_lo[r]};
            const int32_t tgt[2] = {hi, lo};
            const int32_t tpp[2] = {s->g.tpp_hi, s->g.tpp_lo};
            for (int sec = 0; sec < 2; sec++) {
                const int32_t k_old = mkv_mm_pages_for(cur[sec], tpp[sec]);
                const int32_t k_new = mkv_mm_pages_for(tgt[sec], tpp[sec]);
                w->target[2 * i + sec] = tgt[sec];
                w->alloc[2 * i + sec] = k_new > k_old ? k_new - k_old : 0;
                w->release[2 * i + sec] = k_old > k_new ? k_old - k_new : 0;
            }
        }
        w->chunk_alloc[c] = mkv_exclusive_scan_i32(w->alloc + 2 * begin, w->alloc_off + 2 * begin,
                                                   2 * (end - begin));
        w->chunk_rel[c] = mkv_exclusive_scan_i32(w->release + 2 * begin, w->rel_off + 2 * begin,
                                                 2 * (end - begin));
    }
}

/* Table entry of the k-th page of a section: hi from the left, lo from the right. */
static inline int32_t *entry(int32_t *row, int32_t T, int sec, int32_t k)
{
    return sec == 0 ? &row[k] : &row[T - 1 - k];
}

static void recycle_chunks(void *ctx, int64_t c_begin, int64_t c_end)
{
    const op_t *op = ctx;
    mkv_mm_state_t *s = &op->c->st;
    const mkv_mm_work_t *w = &op->c->work;
    const int32_t T = s->g.row_entries;
    const int64_t P = s->g.pool_pages;
    for (int64_t c = c_begin; c < c_end; c++) {
        int64_t begin, end, i, r;
        chunk_range(op, c, &begin, &end);
        const int64_t chunk_base = op->tail + w->chunk_rel[c];
        region_iter_t it = iter_begin(op, begin, end);
        while (iter_next(op, &it, &i, &r)) {
            if (w->release[2 * i] == 0 && w->release[2 * i + 1] == 0) continue;
            int32_t *row = mkv_mm_row(s, r);
            for (int sec = 0; sec < 2; sec++) {
                const int32_t n = w->release[2 * i + sec];
                if (n == 0) continue;
                const int32_t k_new =
                    mkv_mm_pages_for(w->target[2 * i + sec], sec ? s->g.tpp_lo : s->g.tpp_hi);
                const int64_t base = chunk_base + w->rel_off[2 * i + sec];
                for (int32_t k = 0; k < n; k++) {
                    int32_t *e = entry(row, T, sec, k_new + k);
                    s->ring[(base + k) % P] = *e;
                    *e = -1;
                }
            }
        }
    }
}

static void allocate_chunks(void *ctx, int64_t c_begin, int64_t c_end)
{
    const op_t *op = ctx;
    mkv_mm_state_t *s = &op->c->st;
    const mkv_mm_work_t *w = &op->c->work;
    const int32_t T = s->g.row_entries;
    const int64_t P = s->g.pool_pages;
    for (int64_t c = c_begin; c < c_end; c++) {
        int64_t begin, end, i, r;
        chunk_range(op, c, &begin, &end);
        const int64_t chunk_base = op->head + w->chunk_alloc[c];
        region_iter_t it = iter_begin(op, begin, end);
        while (iter_next(op, &it, &i, &r)) {
            int32_t *row = mkv_mm_row(s, r);
            for (int sec = 0; sec < 2; sec++) {
                const int32_t n = w->alloc[2 * i + sec];
                if (n == 0) continue;
                const int32_t cur = sec ? s->n_lo[r] : s->n_hi[r];
                const int32_t k_old = mkv_mm_pages_for(cur, sec ? s->g.tpp_lo : s->g.tpp_hi);
                const int64_t base = chunk_base + w->alloc_off[2 * i + sec];
                for (int32_t k = 0; k < n; k++) *entry(row, T, sec, k_old + k) = s->ring[(base + k) % P];
            }
            s->n_hi[r] = w->target[2 * i];
            s->n_lo[r] = w->target[2 * i + 1];
        }
    }
}

mkv_status_t mkv_cache_check_slots(mkv_cache_t *c, int32_t n_slots, const int32_t *slots)
{
    mkv_mm_work_t *w = &c->work;
    const mkv_mm_state_t *s = &c->st;
    if (n_slots < 0 || n_slots > s->g.max_seqs)
        return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "n_slots %d must be in [0, %d]",
                        n_slots, s->g.max_seqs);
    if (n_slots > 0 && !slots) return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "null slots");
    if (++w->stamp <= 0) { /* wrapped: restart the stamps */
        memset(w->slot_seen, 0, (size_t)s->g.max_seqs * sizeof *w->slot_seen);
        w->stamp = 1;
    }
    for (int32_t j = 0; j < n_slots; j++) {
        const int32_t slot = slots[j];
        if (slot < 0 || slot >= s->g.max_seqs)
            return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "slots[%d] = %d is outside [0, %d)",
                            j, slot, s->g.max_seqs);
        if (!s->active[slot])
            return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "slots[%d] = %d is not active", j, slot);
        if (w->slot_seen[slot] == w->stamp)
            return mkv_fail(c->err, MKV_STATUS_INVALID_ARGUMENT, "slots[%d] = %d is listed twice", j,
                            slot);
        w->slot_seen[slot] = w->stamp;
    }
    return MKV_STATUS_OK;
}

/* The message for the first head-region of a resize whose targets (hi, lo) are invalid. */
static mkv_status_t bad_targets(const op_t *op, int64_t i, int32_t hi, int32_t lo)
{
    const mkv_mm_geom_t *g = &op->c->st.g;
    const int64_t per_slot = (int64_t)g->n_layers * g->n_kv_heads;
    const int64_t j = i / per_slot, k = i % per_slot;
    return mkv_fail(op->c->err, MKV_STATUS_INVALID_ARGUMENT,
                    "slot %d layer %lld head %lld: n_hi %d and n_lo %d must be >= 0 with "
                    "n_hi + n_lo <= N = %d",
                    op->slots[j], (long long)(k / g->n_kv_heads), (long long)(k % g->n_kv_heads),
                    hi, lo, op->new_len[j]);
}

static mkv_status_t out_of_pages(mkv_cache_t *c, int64_t total_alloc, int64_t total_release,
                                 int64_t others_reserved)
{
    return mkv_fail(c->err, MKV_STATUS_OUT_OF_PAGES,
                    "the step needs %lld new pages; %lld are free, %lld would be released and "
                    "%lld are reserved for other slots",
                    (long long)total_alloc, (long long)mkv_mm_free_pages(&c->st),
                    (long long)total_release, (long long)others_reserved);
}

static int64_t others_reserved(const op_t *op)
{
    const mkv_mm_state_t *s = &op->c->st;
    int64_t own = 0;
    for (int32_t j = 0; j < op->n_slots; j++) own += s->reserved[op->slots[j]];
    return s->reserved_total - own;
}

/* After a successful call: the host's per-slot bookkeeping, the same for both backends. */
static void commit_slots(op_t *op)
{
    mkv_mm_state_t *s = &op->c->st;
    for (int32_t j = 0; j < op->n_slots; j++) {
        const int32_t slot = op->slots[j];
        s->reserved_total -= s->reserved[slot];
        s->reserved[slot] = 0;
        if (op->kind == OP_RELEASE) {
            s->active[slot] = 0;
            s->seq_len[slot] = 0;
        } else if (op->kind == OP_APPEND) {
            s->seq_len[slot] += 1;
        } else if (op->new_len) {
            s->seq_len[slot] = op->new_len[j];
        }
    }
}

#ifdef MKV_HAVE_CUDA
/* The same call on the CUDA backend: the phases run as kernels (memmgr/cuda_mm.cu). */
mkv_status_t mkv_mm_apply_cuda(op_t *op, int dry_run, void *stream)
{
    mkv_cache_t *c = op->c;
    mkv_cuda_op_t d;
    memset(&d, 0, sizeof d);
    d.kind = op->kind == OP_RESIZE ? MKV_CUDA_OP_RESIZE
             : op->kind == OP_APPEND ? MKV_CUDA_OP_APPEND
                                     : MKV_CUDA_OP_RELEASE;
    d.n_slots = op->n_slots;
    d.slots = op->slots;
    d.new_len = op->len_given ? op->new_len : NULL;
    d.cur_len = op->new_len;
    d.tgt_hi = op->tgt_hi;
    d.tgt_lo = op->tgt_lo;
    d.others_reserved = others_reserved(op);
    d.dry_run = dry_run;
    d.async = op->async;
    d.call_id = op->async ? ++c->call_id : 0;
    d.between = op->between;
    d.between_ctx = op->between_ctx;
    const mkv_status_t st = mkv_cuda_mm_apply(c->dev, &d, stream, c->err);
    if (st == MKV_STATUS_OK && d.deferred) { /* the host's view runs ahead; collected later */
        c->pending = 1;
        commit_slots(op);
        return MKV_STATUS_OK;
    }
    if (st == MKV_STATUS_INVALID_ARGUMENT) return bad_targets(op, d.bad_region, d.bad_hi, d.bad_lo);
    if (st == MKV_STATUS_OUT_OF_PAGES)
        return out_of_pages(c, d.total_alloc, d.total_release, d.others_reserved);
    if (st != MKV_STATUS_OK || dry_run) return st;
    c->st.head = d.head; /* the host's mirror of the device counters */
    c->st.tail = d.tail;
    commit_slots(op);
    return MKV_STATUS_OK;
}
#endif

/* Phases 1 to 4; for OP_RESIZE, op->new_len holds each slot's new N. With dry_run, stops
 * after the fit check: the answer of the call, with nothing changed. */
static mkv_status_t apply(op_t *op, int dry_run, void *stream)
{
    return op->c->mm->apply(op, dry_run, stream);
}

mkv_status_t mkv_mm_apply_cpu(op_t *op, int dry_run, void *stream)
{
    mkv_cache_t *c = op->c;
    (void)stream;
    mkv_mm_state_t *s = &c->st;
    mkv_mm_work_t *w = &c->work;
    op->n_regions = (int64_t)op->n_slots * s->g.n_layers * s->g.n_kv_heads;
    op->head = s->head;
    op->tail = s->tail;
    /* Waking the workers costs tens of microseconds: small calls run inline. The result does
     * not depend on the chunking. */
    const int parallel = c->threads && op->n_regions >= c->parallel_min_regions;
    mkv_threads_t *tp = parallel ? c->threads : NULL;
    op->n_chunks = parallel ? w->n_chunks : 1;

    /* 1. plan, with a scan inside each chunk */
    mkv_threads_run(tp, plan_chunks, op, op->n_chunks);

    /* 2. coordinate: chunk totals become chunk bases */
    int64_t total_alloc = 0, total_release = 0;
    for (int32_t k = 0; k < op->n_chunks; k++) {
        if (w->chunk_bad[k] >= 0)
            return bad_targets(op, w->chunk_bad[k], op->tgt_hi[w->chunk_bad[k]],
                               op->tgt_lo[w->chunk_bad[k]]);
        const int64_t a = w->chunk_alloc[k], r = w->chunk_rel[k];
        w->chunk_alloc[k] = total_alloc;
        w->chunk_rel[k] = total_release;
        total_alloc += a;
        total_release += r;
    }
    const int64_t others = others_reserved(op);
    if (total_alloc > mkv_mm_free_pages(s) + total_release - others)
        return out_of_pages(c, total_alloc, total_release, others);

    if (dry_run) return MKV_STATUS_OK;

    /* From here on nothing can fail. 3. recycle, 4. allocate and commit. */
    if (total_release > 0) mkv_threads_run(tp, recycle_chunks, op, op->n_chunks);
    s->tail += total_release;
    mkv_threads_run(tp, allocate_chunks, op, op->n_chunks);
    s->head += total_alloc;

    commit_slots(op);
    return MKV_STATUS_OK;
}


mkv_status_t mkv_cache_append(mkv_cache_t *cache, int32_t n_slots, const int32_t *slots,
                              void *stream)
{
    if (!cache) return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_append: null cache");
    cache->err[0] = '\0';
    if (!cache->async) { /* asynchronous steps run ahead of the device: nothing to wait for */
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    mkv_status_t st = mkv_cache_check_slots(cache, n_slots, slots);
    if (st != MKV_STATUS_OK) return st;
    for (int32_t j = 0; j < n_slots; j++)
        if (cache->st.seq_len[slots[j]] >= cache->st.g.max_seq_len)
            return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                            "slot %d already holds max_seq_len = %d tokens", slots[j],
                            cache->st.g.max_seq_len);
    op_t op = {cache, OP_APPEND, n_slots, slots, NULL, NULL, NULL, 0, 0, 0, 0, 0, cache->async, NULL, NULL};
    return apply(&op, 0, stream);
}

static mkv_status_t resize(mkv_cache_t *cache, const mkv_resize_t *rz, int dry_run, void *stream)
{
    if (!cache) return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_resize: null cache");
    cache->err[0] = '\0';
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    if (!rz) return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "null resize");
    mkv_status_t st = mkv_cache_check_slots(cache, rz->n_slots, rz->slots);
    if (st != MKV_STATUS_OK) return st;
    if (rz->n_slots > 0 && (!rz->n_hi || !rz->n_lo))
        return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT, "null n_hi or n_lo");
    const mkv_mm_state_t *s = &cache->st;
    int32_t *new_len = cache->work.new_len;
    for (int32_t j = 0; j < rz->n_slots; j++) {
        const int32_t slot = rz->slots[j];
        new_len[j] = rz->seq_len ? rz->seq_len[j] : s->seq_len[slot];
        if (new_len[j] < s->seq_len[slot] || new_len[j] > s->g.max_seq_len)
            return mkv_fail(cache->err, MKV_STATUS_INVALID_ARGUMENT,
                            "seq_len[%d] = %d for slot %d must be in [N = %d, max_seq_len = %d]", j,
                            new_len[j], slot, s->seq_len[slot], s->g.max_seq_len);
    }
    /* The targets themselves are checked in the plan phase, in parallel. */
    op_t op = {cache, OP_RESIZE, rz->n_slots, rz->slots, rz->n_hi, rz->n_lo, new_len, 0, 0, 0, 0,
               rz->seq_len != NULL, 0, NULL, NULL};
    return apply(&op, dry_run, stream);
}

mkv_status_t mkv_cache_resize(mkv_cache_t *cache, const mkv_resize_t *rz, void *stream)
{
    return resize(cache, rz, 0, stream);
}

mkv_status_t mkv_cache_resize_check(mkv_cache_t *cache, const mkv_resize_t *rz)
{
    return resize(cache, rz, 1, NULL);
}

mkv_status_t mkv_cache_release(mkv_cache_t *cache, int32_t slot, void *stream)
{
    if (!cache) return mkv_fail_global(MKV_STATUS_INVALID_ARGUMENT, "mkv_cache_release: null cache");
    cache->err[0] = '\0';
    {
        const mkv_status_t settled = mkv_cache_settle(cache);
        if (settled != MKV_STATUS_OK) return settled;
    }
    mkv_status_t st = mkv_cache_check_slots(cache, 1, &slot);
    if (st != MKV_STATUS_OK) return st;
    op_t op = {cache, OP_RELEASE, 1, &slot, NULL, NULL, NULL, 0, 0, 0, 0, 0, 0, NULL, NULL};
    return apply(&op, 0, stream);
}

mkv_status_t mkv_cache_resize_device(mkv_cache_t *c, int32_t n_slots, const int32_t *slots,
                                     const int32_t *tgt_hi, const int32_t *tgt_lo,
                                     mkv_status_t (*between)(void *ctx, void *stream, char *err),
                                     void *ctx, void *stream)
{
#ifdef MKV_HAVE_CUDA
    op_t op = {c, OP_RESIZE, n_slots, slots, tgt_hi, tgt_lo, c->work.new_len, 0, 0, 0, 0, 0, 1,
               between, ctx};
    for (int32_t j = 0; j < n_slots; j++) c->work.new_len[j] = c->st.seq_len[slots[j]];
    mkv_status_t st = apply(&op, 0, stream);
    if (st == MKV_STATUS_OK && !c->async) st = mkv_cache_settle(c);
    return st;
#else
    (void)n_slots, (void)slots, (void)tgt_hi, (void)tgt_lo, (void)between, (void)ctx, (void)stream;
    return mkv_fail(c->err, MKV_STATUS_UNSUPPORTED, "this build has no CUDA backend");
#endif
}
