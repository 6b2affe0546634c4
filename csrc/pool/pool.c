/*
 * pool.c -- the core of the allocator: block headers, the pointer hash,
 * split and merge, mapping physical chunks into arenas and giving them back
 * (trim), growth, alloc and free under the priority rules, limits,
 * re-tagging, create and destroy.  pool.h describes the block states and
 * the files around this one.
 *
 * The hot path (gp_alloc hit, gp_free) is: lock, O(1) bin search, split or
 * merge, hash insert or remove, counters, unlock.  No backend call, no malloc
 * (block headers come from a free list refilled in slabs on the slow path).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pool.h"
#include "util.h"

/* The size a request occupies.  Small requests round to 512 B; large ones to
 * 1/256 of their power of two (at most 2 MiB), which bounds the waste at
 * 0.4% while keeping odd sizes from leaving unusable slivers. */
static uint64_t gp_block_size(const gp_pool *p, uint64_t size)
{
    if (size < p->small_size) return gp_round_up(size, GP_ALIGN);
    uint64_t g = (1ull << gp_log2(size)) >> 8;
    if (g < GP_ALIGN) g = GP_ALIGN;
    if (g > (2ull << 20)) g = 2ull << 20;
    return gp_round_up(size, g);
}
/* ----------------------------------------------------- block header slabs */

static gp_status gp_refill_spare(gp_pool *p)
{
    void **s = gp_array_room(p->slabs, &p->cap_slabs, p->n_slabs, sizeof *s, 16);
    if (!s) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for block headers");
    p->slabs = s;
    gp_block *slab = malloc(GP_SLAB_BLOCKS * sizeof *slab);
    if (!slab) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for block headers");
    p->slabs[p->n_slabs++] = slab;
    for (int i = 0; i < GP_SLAB_BLOCKS; i++) {
        slab[i].fnext = p->spare;
        p->spare = &slab[i];
    }
    return GP_OK;
}

/* A header from the spare list, refilled when empty; NULL (with the error
 * set) only when the host is out of memory. */
gp_block *gp_new_block(gp_pool *p)
{
    if (!p->spare && gp_refill_spare(p) != GP_OK) return NULL;
    gp_block *b = p->spare;
    p->spare = b->fnext;
    memset(b, 0, sizeof *b);
    return b;
}

gp_status gp_reserve_headers(gp_pool *p, int n)
{
    int have = 0;
    for (gp_block *b = p->spare; b && have < n; b = b->fnext) have++;
    return have >= n ? GP_OK : gp_refill_spare(p);
}

gp_status gp_spare_at_least(gp_pool *p, size_t n)
{
    size_t have = 0;
    for (gp_block *b = p->spare; b && have < n; b = b->fnext) have++;
    for (; have < n; have += GP_SLAB_BLOCKS) {
        gp_status st = gp_refill_spare(p);
        if (st != GP_OK) return st;
    }
    return GP_OK;
}

static void gp_drop_block(gp_pool *p, gp_block *b)
{
    b->fnext = p->spare;
    p->spare = b;
}

/* ------------------------------------------------------------ pointer hash */

static gp_status gp_hash_grow(gp_pool *p)
{
    uint64_t n = (p->hmask + 1) * 2;
    gp_block **nb = calloc(n, sizeof *nb);
    if (!nb) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the pointer table");
    uint64_t old = p->hmask + 1;
    gp_block **ob = p->buckets;
    p->buckets = nb;
    p->hmask = n - 1;
    for (uint64_t i = 0; i < old; i++) {
        for (gp_block *b = ob[i], *nx; b; b = nx) {
            nx = b->fnext;
            uint64_t h = gp_hash(p, b->addr);
            b->fnext = nb[h];
            nb[h] = b;
        }
    }
    free(ob);
    return GP_OK;
}

static void gp_hash_insert(gp_pool *p, gp_block *b)
{
    uint64_t h = gp_hash(p, b->addr);
    b->fnext = p->buckets[h];
    p->buckets[h] = b;
    p->hcount++;
}

static gp_block *gp_hash_remove(gp_pool *p, uintptr_t a)
{
    gp_block **pp = &p->buckets[gp_hash(p, a)];
    for (gp_block *b = *pp; b; pp = &b->fnext, b = b->fnext) {
        if (b->addr == a) {
            *pp = b->fnext;
            p->hcount--;
            return b;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ free blocks */

static int gp_mergeable(const gp_block *x, const gp_block *y)
{
    return x && y && x->state == y->state &&
           (x->state == GP_BLOCK_FREE || x->state == GP_BLOCK_FREE_UNMAPPED) && x->life == y->life &&
           (x->state == GP_BLOCK_FREE_UNMAPPED || x->sidx == y->sidx);
}

/* b (not in any bin) becomes free: merge it with its free neighbours of the
 * same kind and put the result in its bins.  Returns the merged block.
 * Merged cache takes the highest of the priorities: memory a high-priority
 * holder gave back must not become releasable by lower requests. */
gp_block *gp_insert_free(gp_pool *p, gp_arena *a, gp_block *b)
{
    gp_block *pv = b->prev, *nx = b->next;
    if (gp_mergeable(pv, b)) {
        gp_bins_remove(gp_bins_of(a, pv), pv);
        if (b->prio > pv->prio) pv->prio = b->prio;
        pv->size += b->size;
        pv->next = nx;
        if (nx) nx->prev = pv;
        gp_drop_block(p, b);
        b = pv;
    }
    if (gp_mergeable(b, nx)) {
        gp_bins_remove(gp_bins_of(a, nx), nx);
        if (nx->prio > b->prio) b->prio = nx->prio;
        b->size += nx->size;
        b->next = nx->next;
        if (nx->next) nx->next->prev = b;
        gp_drop_block(p, nx);
    }
    b->requested = 0;
    b->freed = ++p->free_seq;
    gp_bins_insert(gp_bins_of(a, b), b);
    return b;
}

/* Cut b (in no bin) after `size` bytes; the tail becomes a block of the same
 * state and stream, returned (not in any bin).  NULL, b unchanged, when no
 * header can be had (see gp_reserve_headers). */
gp_block *gp_split(gp_pool *p, gp_block *b, uint64_t size)
{
    gp_block *t = gp_new_block(p);
    if (!t) return NULL;
    t->addr = b->addr + size;
    t->size = b->size - size;
    t->state = b->state;
    t->sidx = b->sidx;
    t->arena = b->arena;
    t->life = b->life;
    t->prio = b->prio;
    t->freed = b->freed;
    t->prev = b;
    t->next = b->next;
    if (b->next) b->next->prev = t;
    b->next = t;
    b->size = size;
    return t;
}
/* ------------------------------------------------------------ map / unmap */

/* Map [addr, addr+len) chunk by chunk; on failure unmap what this call
 * mapped, from the end.  An unmap that fails there keeps its chunk mapped
 * in the backend, so the pool keeps it too: *kept is then the length of the
 * prefix of the range still mapped (and counted in reserved), which the
 * caller must turn into free memory.  Otherwise the range is either wholly
 * mapped or wholly not (*kept 0). */
gp_status gp_map_range(gp_pool *p, gp_arena *a, uintptr_t addr, uint64_t len, uint64_t *kept)
{
    uint64_t done = 0;
    gp_status st = GP_OK;
    *kept = 0;
    while (done < len) {
        /* The table gets the handle only from a map that worked: what a
         * failed call leaves in its output is not a handle. */
        uint64_t handle = 0;
        p->st.n_map++;
        st = p->be->map(p->be, addr + done, a->chunk, &handle);
        if (st != GP_OK) break;
        a->handles[gp_chunk_index(a, addr + done)] = handle;
        done += a->chunk;
    }
    if (st != GP_OK) {
        p->st.n_map_fail++;
        char why[1024];
        snprintf(why, sizeof why, "%s", gp_last_error());
        while (done > 0) {
            uint64_t ci = gp_chunk_index(a, addr + done - a->chunk);
            p->st.n_unmap++;
            if (p->be->unmap(p->be, addr + done - a->chunk, a->chunk, a->handles[ci]) != GP_OK) break;
            a->handles[ci] = 0;
            done -= a->chunk;
        }
        gp_error_set(st, "%s", why);
        if (!done) return st;
        *kept = len = done;
    }
    p->st.reserved += len;
    p->st.mapped_total += len;
    GP_TRACE(p, GP_EV_MAP, addr, len, NULL, GP_TAG_UNTAGGED, 0);
    if (p->n_capturing) p->st.n_capture_maps += len / a->chunk;
    if (p->st.reserved > p->st.reserved_peak) p->st.reserved_peak = p->st.reserved;
    return st;
}

/* The first `len` bytes of unmapped block u (in its bins) were mapped: they
 * become free memory of slot sidx and priority prio, merged and binned (the
 * rest of u stays unmapped); returns the free block they are part of.
 * Needs a spare header. */
static gp_block *gp_mapped_head(gp_pool *p, gp_arena *a, gp_block *u, uint64_t len, unsigned sidx, int prio)
{
    gp_bins_remove(gp_bins_of(a, u), u);
    gp_block *rest = u->size > len ? gp_split(p, u, len) : NULL;
    u->state = GP_BLOCK_FREE; /* before the rest goes back, or they would merge */
    u->sidx = (uint8_t)sidx;
    u->prio = (uint8_t)prio;
    if (rest) gp_insert_free(p, a, rest);
    return gp_insert_free(p, a, u);
}

/* Unmap chunks of [addr, addr+len) from the start; returns bytes unmapped
 * (less than len only if the backend failed). */
uint64_t gp_unmap_range(gp_pool *p, gp_arena *a, uintptr_t addr, uint64_t len)
{
    uint64_t done = 0;
    while (done < len) {
        uint64_t ci = gp_chunk_index(a, addr + done);
        p->st.n_unmap++;
        if (p->be->unmap(p->be, addr + done, a->chunk, a->handles[ci]) != GP_OK) break;
        a->handles[ci] = 0;
        done += a->chunk;
    }
    p->st.reserved -= done;
    p->st.unmapped_total += done;
    if (done) GP_TRACE(p, GP_EV_UNMAP, addr, done, NULL, GP_TAG_UNTAGGED, 0);
    return done;
}

/* ------------------------------------------------------------------- trim */

/* Cut [lo, lo+len) of block b (in its bins; whole chunks inside it) out as
 * a TRANSIT block d->b (its slot, priority and free_seq those of b), with
 * a spare header kept for the settle that may cut it in two; what lies
 * before and after goes back to the bins, freed when b was (a trim that
 * follows may take that cache without a new fence).  b is maximal (free,
 * or unmapped): the head merges with nothing, the tail at most with what
 * follows.  *after is the first block after the pieces.  Returns 0
 * (nothing cut) when headers are short. */
static int gp_detach_piece(gp_pool *p, gp_arena *a, gp_block *b, uintptr_t lo, uint64_t len, gp_detached *d,
                           gp_block **after)
{
    if (gp_reserve_headers(p, 3) != GP_OK) {
        gp_error_clear();
        return 0;
    }
    uint64_t when = b->freed;
    gp_bins_remove(gp_bins_of(a, b), b);
    gp_block *mid = lo > b->addr ? gp_split(p, b, lo - b->addr) : b;
    gp_block *tail = mid->size > len ? gp_split(p, mid, len) : NULL;
    mid->state = GP_BLOCK_TRANSIT; /* (before the rest goes back, or they would merge) */
    if (mid != b) gp_insert_free(p, a, b)->freed = when;
    if (tail) tail = gp_insert_free(p, a, tail);
    if (tail) tail->freed = when;
    *after = tail ? tail->next : mid->next;
    *d = (gp_detached){.b = mid, .spare = gp_new_block(p), .sidx = mid->sidx, .prio = mid->prio, .freed = when};
    p->held++;
    return 1;
}

/* Detach the whole chunks inside free block b (in its bins) to be unmapped
 * (gp_detach_piece): the last ones, no more than `want` bytes rounded up
 * to a chunk.  Only what was asked: a trim that made room for a restore by
 * taking a whole block of logits (gigabytes) left the next forward pass to
 * map back what it did not need.  The last chunks: a later growth past the
 * kept head extends it and maps only what it lacks (gp_grow).  Returns 0
 * (nothing taken) when b holds no whole chunk or headers are short;
 * *resume is where a walk of the arena goes on (b itself may be merged
 * away). */
static int gp_trim_detach(gp_pool *p, gp_arena *a, gp_block *b, uint64_t want, gp_detached *d, gp_block **resume)
{
    uintptr_t lo = gp_round_up(b->addr, a->chunk);
    uintptr_t hi = (b->addr + b->size) / a->chunk * a->chunk;
    uint64_t most = want > UINT64_MAX - a->chunk ? UINT64_MAX / a->chunk * a->chunk : gp_round_up(want, a->chunk);
    if (lo < hi && hi - lo > most) lo = hi - most;
    *resume = b->next;
    return lo < hi && gp_detach_piece(p, a, b, lo, hi - lo, d, resume);
}

/* Unmap the chunks of detached block d->b from its start, with or without
 * the lock (the block is the caller's); d->done is what went. */
void gp_trim_unmap(gp_pool *p, gp_detached *d)
{
    const gp_block *b = d->b;
    gp_arena *a = &p->arenas[b->arena];
    d->done = 0;
    for (uintptr_t x = b->addr; x < b->addr + b->size; x += a->chunk) {
        d->tried++;
        if (p->be->unmap(p->be, x, a->chunk, a->handles[gp_chunk_index(a, x)]) != GP_OK) break;
        d->done += a->chunk;
    }
}

/* With the lock: the unmapped part of d->b becomes unmapped space, what
 * would not go (a backend failure) free cache again as it was. */
void gp_trim_settle(gp_pool *p, gp_detached *d)
{
    gp_block *b = d->b;
    gp_arena *a = &p->arenas[b->arena];
    p->st.n_unmap += d->tried;
    for (uintptr_t x = b->addr; x < b->addr + d->done; x += a->chunk) a->handles[gp_chunk_index(a, x)] = 0;
    p->st.reserved -= d->done;
    p->st.unmapped_total += d->done;
    if (d->done) GP_TRACE(p, GP_EV_UNMAP, b->addr, d->done, NULL, GP_TAG_UNTAGGED, 0);
    gp_block *rest = NULL;
    gp_drop_block(p, d->spare); /* (back to the spare list: the cut below takes it) */
    p->held--;
    if (d->done && d->done < b->size) rest = gp_split(p, b, d->done);
    if (!d->done) rest = b;
    if (rest) {
        rest->state = GP_BLOCK_FREE;
        rest->sidx = d->sidx;
        rest->prio = d->prio;
        gp_insert_free(p, a, rest)->freed = d->freed;
    }
    if (d->done) {
        b->state = GP_BLOCK_FREE_UNMAPPED;
        gp_insert_free(p, a, b);
    }
}

/* Unmap what gp_trim_detach takes of free block b (in its bins), with the
 * lock.  Returns the bytes released; *resume as gp_trim_detach. */
static uint64_t gp_trim_block(gp_pool *p, gp_arena *a, gp_block *b, uint64_t want, gp_block **resume)
{
    gp_detached d;
    if (!gp_trim_detach(p, a, b, want, &d, resume)) return 0;
    gp_trim_unmap(p, &d);
    gp_trim_settle(p, &d);
    return d.done;
}

int gp_fill_detach(gp_pool *p, gp_arena *a, gp_block *u, uintptr_t addr, uint64_t len, unsigned sidx, int prio,
                   gp_detached *d)
{
    gp_block *after;
    if (!gp_detach_piece(p, a, u, addr, len, d, &after)) return 0;
    d->sidx = (uint8_t)sidx;
    d->prio = (uint8_t)prio;
    gp_peak(&p->st.reserved, &p->st.reserved_peak, len); /* (the peak too: a check meanwhile sees both) */
    p->mapping += len;
    return 1;
}

void gp_fill_settle(gp_pool *p, gp_detached *d, const uint64_t *handles)
{
    gp_block *b = d->b;
    gp_arena *a = &p->arenas[b->arena];
    p->st.reserved -= b->size;
    p->mapping -= b->size;
    p->st.n_map += d->tried;
    if (d->tried * a->chunk > d->done) p->st.n_map_fail++;
    for (uint64_t i = 0; i < d->done / a->chunk; i++) a->handles[gp_chunk_index(a, b->addr + i * a->chunk)] = handles[i];
    if (d->done) {
        gp_peak(&p->st.reserved, &p->st.reserved_peak, d->done);
        p->st.mapped_total += d->done;
        p->st.refilled_total += d->done;
        GP_TRACE(p, GP_EV_MAP, b->addr, d->done, NULL, GP_TAG_UNTAGGED, 0);
    }
    gp_drop_block(p, d->spare); /* (back to the spare list: the cut below takes it) */
    p->held--;
    gp_block *rest = !d->done ? b : d->done < b->size ? gp_split(p, b, d->done) : NULL;
    if (d->done) {
        b->state = GP_BLOCK_FREE;
        b->sidx = d->sidx;
        b->prio = d->prio;
        gp_insert_free(p, a, b);
    }
    if (rest) {
        rest->state = GP_BLOCK_FREE_UNMAPPED;
        gp_insert_free(p, a, rest);
    }
}

/* Once the device is idle no stream can still be reading a free block, so
 * free neighbours of different streams may become one block (of the first
 * one's stream): a chunk they share can then be released. */
void gp_coalesce_idle(gp_pool *p, gp_arena *a)
{
    for (gp_block *b = a->first; b; b = b->next) {
        if (b->state != GP_BLOCK_FREE || p->slot_kind[b->sidx] != GP_SLOT_STREAM) continue;
        while (b->next && b->next->state == GP_BLOCK_FREE && b->next->life == b->life &&
               p->slot_kind[b->next->sidx] == GP_SLOT_STREAM) {
            gp_block *nx = b->next;
            gp_bins_remove(a->bins[b->sidx], b);
            gp_bins_remove(a->bins[nx->sidx], nx);
            if (nx->prio > b->prio) b->prio = nx->prio;
            if (nx->freed > b->freed) b->freed = nx->freed;
            b->size += nx->size;
            b->next = nx->next;
            if (nx->next) nx->next->prev = b;
            gp_drop_block(p, nx);
            gp_bins_insert(a->bins[b->sidx], b);
        }
    }
}
int gp_cache_level(const gp_pool *p, const gp_arena *only, int min, int whole)
{
    int level = GP_PRIO_MAX + 1;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        const gp_arena *a = &p->arenas[k];
        if (only && a != only) continue;
        for (const gp_block *b = a->first; b; b = b->next)
            if (gp_cached(p, a, b, min, level - 1, whole)) level = b->prio;
    }
    return level;
}

/* Give back up to `want` bytes of the whole chunks of cache of priority
 * <= max_prio freed at free_seq `upto` or before, from arena `only` (NULL:
 * every arena), the lowest priority first (a pass over the arenas per
 * priority that holds cache; one pass when all is one priority).  With
 * `out`, the chunks are detached into it (at most out->cap blocks) for
 * the caller to unmap without the lock, and counted as if released. */
uint64_t gp_trim_cached(gp_pool *p, const gp_arena *only, uint64_t want, int max_prio, uint64_t upto,
                        gp_detach_list *out)
{
    uint64_t freed = 0;
    for (int level = gp_cache_level(p, only, 0, 1); level <= max_prio && freed < want;
         level = gp_cache_level(p, only, level + 1, 1)) {
        for (unsigned k = 0; k < p->n_arenas && freed < want; k++) {
            gp_arena *a = &p->arenas[k];
            if (only && a != only) continue;
            for (gp_block *b = a->first, *nx; b && freed < want; b = nx) {
                nx = b->next;
                if (b->freed > upto || !gp_cached(p, a, b, level, level, 1)) continue;
                if (p->growing_from && b->addr <= p->growing_from && p->growing_from < b->addr + b->size) continue;
                if (!out) {
                    freed += gp_trim_block(p, a, b, want - freed, &nx);
                } else if (out->n == out->cap) {
                    return freed; /* (the caller comes back for the rest) */
                } else if (gp_trim_detach(p, a, b, want - freed, &out->d[out->n], &nx)) {
                    freed += out->d[out->n++].b->size;
                }
            }
        }
    }
    if (freed && !out) p->st.n_trim++;
    return freed;
}

/* Give back at least `want` bytes of cached chunks (fewer if there are not
 * so many), from arena `only` or, when it is NULL, from every arena: only
 * cache of priority <= max_prio. */
uint64_t gp_trim_in(gp_pool *p, const gp_arena *only, uint64_t want, int max_prio)
{
    /* No synchronisation (illegal) nor unmapping while a graph captures. */
    if (p->n_capturing || p->st.reserved == p->st.allocated) return 0;
    /* Nothing this request may release: spare the wait.  Pending
     * blocks count (the wait frees them; reserve mode then keeps them as
     * cache, never unmapping). */
    int cache = !p->reserve_mode && gp_cache_level(p, only, 0, 0) <= max_prio;
    if (!cache && !gp_pending_upto(p, max_prio)) return 0;
    /* A stream may still read a block it freed: wait for the pool's
     * streams before giving any chunk back. */
    if (gp_quiesce_locked(p) != GP_OK) {
        gp_error_clear();
        return 0;
    }
    if (p->reserve_mode) return 0;
    for (unsigned k = 0; k < p->n_arenas; k++)
        if (!only || &p->arenas[k] == only) gp_coalesce_idle(p, &p->arenas[k]);
    return gp_trim_cached(p, only, want, max_prio, UINT64_MAX, NULL);
}

/* ------------------------------------------------- trims without a wait */

/* Whether every event of the idle fence has completed (a failed query:
 * not known to). */
static int gp_idle_fence_done(gp_pool *p)
{
    for (size_t i = 0; i < p->n_idle_ev; i++) {
        int done = 0;
        if (p->be->event_query(p->be, p->idle_ev[i], &done) != GP_OK) {
            gp_error_clear();
            return 0;
        }
        if (!done) return 0;
    }
    return 1;
}

static void gp_idle_fence_drop(gp_pool *p)
{
    for (size_t i = 0; i < p->n_idle_ev; i++) p->be->event_release(p->be, p->idle_ev[i]);
    p->n_idle_ev = 0;
}

/* Learn what cache is idle, without waiting: a fence that has completed
 * makes every block freed before it was recorded idle; a new one is
 * recorded when blocks came to the bins since (gp_fence_locked: a
 * block's last users are its slot's stream and those record_stream
 * named).  A training loop's trims, a few per step,
 * so find the cache of the previous ones idle.  None while a graph
 * captures: an event recorded then would join the capture. */
void gp_idle_refresh(gp_pool *p)
{
    if (p->n_idle_ev && gp_idle_fence_done(p)) {
        if (p->fence_seq > p->idle_seq) p->idle_seq = p->fence_seq;
        gp_idle_fence_drop(p);
    }
    if (p->n_idle_ev || p->idle_seq >= p->free_seq || p->n_capturing) return;
    if (gp_fence_locked(p, p->idle_ev, GP_FENCE_STREAMS, &p->n_idle_ev) != GP_OK) {
        gp_error_clear();
        return;
    }
    p->fence_seq = p->free_seq;
    if (gp_idle_fence_done(p)) { /* (an idle device: at once) */
        p->idle_seq = p->fence_seq;
        gp_idle_fence_drop(p);
    }
}

void gp_idle_synced(gp_pool *p)
{
    p->idle_seq = p->free_seq;
    gp_idle_fence_drop(p); /* (it has completed: no use to wait for) */
}

uint64_t gp_trim_idle(gp_pool *p, const gp_arena *only, uint64_t want, int max_prio)
{
    if (p->n_capturing || p->reserve_mode || p->st.reserved == p->st.allocated || !want) return 0;
    gp_idle_refresh(p);
    uint64_t got = gp_trim_cached(p, only, want, max_prio, p->idle_seq, NULL);
    if (got) p->st.n_trim_idle++;
    return got;
}

uint64_t gp_trim_first_idle(gp_pool *p, const gp_arena *only, uint64_t want, int max_prio)
{
    uint64_t got = gp_trim_idle(p, only, want, max_prio);
    return got < want ? got + gp_trim_in(p, only, want - got, max_prio) : got;
}

static uint64_t gp_trim_locked(gp_pool *p, uint64_t want) { return gp_trim_in(p, NULL, want, GP_PRIO_MAX); }

uint64_t gp_pool_trim(gp_pool *p, uint64_t bytes)
{
    if (gp_pool_usable(p) != GP_OK) return 0;
    pthread_mutex_lock(&p->lock);
    p->owed.bytes = 0; /* (the caller wants the memory back, not mapped again) */
    uint64_t f = gp_trim_locked(p, bytes);
    pthread_mutex_unlock(&p->lock);
    return f;
}

uint64_t gp_pool_empty_cache(gp_pool *p) { return gp_pool_trim(p, UINT64_MAX); }
/* ---------------------------------------------------------------- growing */

/* Bytes cached at priorities min..max (free blocks of stream slots). */
static uint64_t gp_cached_bytes(const gp_pool *p, int min, int max)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < p->n_arenas; k++)
        for (const gp_block *b = p->arenas[k].first; b; b = b->next)
            if (gp_cached(p, &p->arenas[k], b, min, max, 0)) n += b->size;
    return n;
}

/* At most what a trim for a request of `prio` could give back: its cache
 * (whole chunks or not) and the blocks pending record_stream events, which
 * the trim's wait frees; nothing while a graph captures. */
static uint64_t gp_releasable(const gp_pool *p, int prio)
{
    if (p->n_capturing) return 0;
    uint64_t n = gp_cached_bytes(p, 0, prio);
    for (unsigned i = 0; i < p->n_recs; i++)
        if (p->recs[i].pending && p->recs[i].b->prio <= prio) n += p->recs[i].b->size;
    return n;
}

/* Whether `need` more bytes fit on the device, asked of its figures (the
 * driver's free memory; yes when it has none to give, or while a graph
 * captures: a call the driver deems unsafe then would invalidate the
 * capture).  If not, *short_by is what is missing and *could what a trim
 * for `prio` might add. */
static int gp_device_fits(gp_pool *p, uint64_t need, int prio, uint64_t *short_by, uint64_t *could)
{
    uint64_t dev_free = 0, dev_total = 0;
    if (p->n_capturing) return 1;
    if (p->be->mem_info(p->be, &dev_free, &dev_total) != GP_OK) {
        gp_error_clear(); /* no figures: the mapping will tell */
        return 1;
    }
    if (need <= dev_free) return 1;
    *short_by = need - dev_free;
    *could = gp_releasable(p, prio);
    return 0;
}

static gp_block *gp_grow_in(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t size, int prio, gp_status *st,
                            int may_trim, uintptr_t *fresh);

/* The free block of slot sidx that a growth for `size` bytes extends
 * rather than starting a new run: one followed by unmapped space that
 * holds what it lacks (it then maps only that), the largest such (the
 * least to map); NULL if none.  The unmapped bins are few (the gaps between
 * mapped runs), so all of them are looked at. */
static gp_block *gp_extended(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t size)
{
    const gp_bins *ub = &a->unmapped[p->slot_life[sidx]];
    gp_block *best = NULL;
    for (uint64_t fm = ub->fl_map; fm; fm &= fm - 1) {
        unsigned fl = (unsigned)__builtin_ctzll(fm);
        for (unsigned sm = ub->sl_map[fl]; sm; sm &= sm - 1)
            for (gp_block *u = ub->heads[fl][__builtin_ctz(sm)]; u; u = u->fnext) {
                gp_block *pv = u->prev;
                if (pv && pv->state == GP_BLOCK_FREE && pv->sidx == sidx && pv->life == u->life && pv->size < size &&
                    u->size >= gp_round_up(size - pv->size, a->chunk) && (!best || pv->size > best->size))
                    best = pv;
            }
    }
    return best;
}

/* The bytes of cache gp_trim_slack gives back (the lock is held). */
uint64_t gp_slack_over(const gp_pool *p, uint64_t need, uint64_t size, uint64_t floor, uint64_t most)
{
    double slack = p->cfg.cache_slack;
    if (slack < 0 || p->n_capturing) return 0;
    uint64_t after = p->st.allocated + size, keep = (uint64_t)(slack * (double)after);
    uint64_t target = after + keep > floor ? after + keep : floor;
    uint64_t over = p->st.reserved + need > target ? p->st.reserved + need - target : 0;
    return over < most ? over : most;
}

/* Keep reserved near allocated.  The free memory a request cannot use
 * lies in holes between live blocks (on a LoRA step: two holes of 2.2 GiB
 * beside a 4.6 GiB request).  Rather than map new memory beside them, give
 * their chunks back first -- idle ones with no wait, the rest after the
 * pool's streams have run -- so that the physical memory moves to where it
 * is needed.  GPUPOOL_CACHE_SLACK is how much cache may stay; growing is
 * rare once a workload has seen its largest step, so the waits are too (not
 * so when an offload between steps gives memory back each step). */
uint64_t gp_trim_slack(gp_pool *p, const gp_arena *only, uint64_t need, uint64_t size, int prio, uint64_t floor,
                       uint64_t most, int sync)
{
    /* Idle cache first: a wait under the lock stops every thread that
     * allocates until the pool's streams have run what was queued (a
     * training loop's trims, a few per step, cost it its lead over the
     * device). */
    uint64_t over = gp_slack_over(p, need, size, floor, most);
    uint64_t got = sync ? gp_trim_first_idle(p, only, over, prio) : gp_trim_idle(p, only, over, prio);
    return got < over ? over - got : 0;
}

/* Map new memory so that a free block of at least `size` bytes exists on
 * stream slot sidx, in the slot's region, for a request of `prio` (which
 * may release cache of priorities up to its own to stay under the limit
 * or to make room on the device); return it (removed from its bins) or
 * NULL with the error set. */
gp_block *gp_grow(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t size, int prio, gp_status *st)
{
    return gp_grow_in(p, a, sidx, size, prio, st, 1, NULL);
}

/* `fresh` non-NULL: the growth extends no free block, and *fresh is where
 * its new mapping starts (the block returned may have merged with free
 * neighbours around it). */
static gp_block *gp_grow_in(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t size, int prio, gp_status *st,
                            int may_trim, uintptr_t *fresh)
{
    if (p->reserve_mode) {
        *st = gp_error_set(GP_ERR_OOM, "the reserved pool is exhausted (reserve mode never maps more)");
        return NULL;
    }
    uint64_t full = gp_round_up(size, a->chunk);
    /* What this growth maps, decided before anything is given back: where
     * it extends a free block, the trims keep that block whole. */
    gp_block *pv = fresh ? NULL : gp_extended(p, a, sidx, size);
    uint64_t need = pv ? gp_round_up(size - pv->size, a->chunk) : full;
    uint64_t limit = p->st.limit;
    p->growing_from = pv ? pv->addr : 0;
    if (limit && p->st.reserved + need > limit) gp_trim_first_idle(p, NULL, p->st.reserved + need - limit, prio);
    if (!limit || p->st.reserved + need <= limit) gp_trim_slack(p, a, need, size, prio, 0, UINT64_MAX, 1);
    p->growing_from = 0;
    /* The trims may have merged the block away or opened a gap beside
     * another: found again, and the limit asked again. */
    pv = fresh ? NULL : gp_extended(p, a, sidx, size);
    need = pv ? gp_round_up(size - pv->size, a->chunk) : full;
    if (limit && p->st.reserved + need > limit) {
        *st = gp_error_set(GP_ERR_LIMIT,
                           "the pool limit of %" PRIu64 " bytes would be exceeded "
                           "(reserved %" PRIu64 ", %" PRIu64 " more needed)",
                           limit, p->st.reserved, need);
        return NULL;
    }
    gp_block *u = pv ? pv->next : gp_bins_find(&a->unmapped[p->slot_life[sidx]], need);
    if (!u) {
        *st = gp_error_set(GP_ERR_OOM, "no unmapped address range of %" PRIu64 " bytes left in the arena", need);
        return NULL;
    }
    /* Whether the device has the memory, decided from its figures before
     * anything is mapped: a mapping that fails half-way has cost a map and
     * an unmap per chunk (0.47 s for 1 GiB in 64 KiB chunks).  What the
     * cache may add is released first, once; if even that is too little,
     * the request fails at once and the cache stays. */
    uint64_t short_by, could;
    if (!gp_device_fits(p, need, prio, &short_by, &could)) {
        /* (The trim may merge u away: grow afresh after it.) */
        if (may_trim && short_by <= could && gp_trim_in(p, NULL, short_by, prio))
            return gp_grow_in(p, a, sidx, size, prio, st, 0, fresh);
        *st = gp_error_set(GP_ERR_OOM,
                           "the device lacks %" PRIu64 " of the %" PRIu64 " bytes needed, and the cache this "
                           "request may release (priority <= %d) holds %" PRIu64 " bytes",
                           short_by, need, prio, could);
        return NULL;
    }
    if ((*st = gp_reserve_headers(p, 1)) != GP_OK) return NULL;
    uint64_t kept;
    if ((*st = gp_map_range(p, a, u->addr, need, &kept)) != GP_OK) {
        if (kept) gp_mapped_head(p, a, u, kept, sidx, prio);
        return NULL;
    }
    if (fresh) *fresh = u->addr;
    gp_block *b = gp_mapped_head(p, a, u, need, sidx, prio);
    gp_bins_remove(a->bins[sidx], b);
    p->owed.bytes -= p->owed.bytes < need ? p->owed.bytes : need;
    return b;
}

/* A free block of another stream, made safe for `sidx` by a device-side
 * wait on the stream that freed it. */
static gp_block *gp_steal(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t size)
{
    for (unsigned s = 0; s < p->n_streams; s++) {
        /* (Placement: a region's blocks serve only that region's slots.) */
        if (s == sidx || p->slot_kind[s] != GP_SLOT_STREAM || p->slot_life[s] != p->slot_life[sidx])
            continue;
        gp_block *b = gp_bins_find(a->bins[s], size);
        if (!b) continue;
        p->st.n_stream_waits++;
        if (p->be->stream_wait(p->be, p->streams[sidx], p->streams[s]) != GP_OK) continue;
        gp_bins_remove(a->bins[s], b);
        b->sidx = (uint8_t)sidx;
        return b;
    }
    return NULL;
}
/* ------------------------------------------------------------ alloc, free */

/* A cached block of at least `size` bytes for slot sidx, or for graph pool
 * slot gslot (>= 0) while capturing (*a may change then); removed from its
 * bins. */
static inline gp_block *gp_fit(gp_pool *p, gp_arena **a, int gslot, unsigned sidx, uint64_t size)
{
    if (gslot >= 0) return gp_capture_find(p, a, (unsigned)gslot, sidx, size);
    gp_block *b = gp_bins_find((*a)->bins[sidx], size);
    if (b) gp_bins_remove((*a)->bins[sidx], b);
    return b;
}

/* Whether live memory of a priority below `prio` exists (what the pressure
 * callback may give up). */
static int gp_lower_live(const gp_pool *p, int prio)
{
    for (int q = 0; q < prio; q++)
        if (p->prio_alloc[q]) return 1;
    return 0;
}

/* The limit or the device stands in the way of a request of `prio` that
 * found no cached block: take back the blocks pending record_stream events
 * (a wait for the pool's streams), then, if the device's figures say a
 * trim can make room, release cached chunks of priorities up to its own,
 * the lowest first, as many as it needs, then all of them (gp_grow has
 * done this already for the limit and for the device's figures), retrying
 * after each step.  Nothing of a higher priority is touched.  The pressure
 * callback, the next step, is gp_alloc's: it needs the lock dropped. */
static gp_block *gp_displace(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t bsize, int prio,
                             gp_status *st)
{
    gp_block *b = NULL;
    p->st.n_alloc_retries++;
    /* Blocks waiting for record_stream events (or for a sync, when an event
     * could not be recorded) come back once their streams have run: before
     * failing, wait for them (a capture cannot). */
    if (p->n_pending && !p->n_capturing) {
        gp_status ss = gp_quiesce_locked(p);
        if (ss != GP_OK) {
            *st = ss;
            return NULL;
        }
        if ((b = gp_fit(p, &a, -1, sidx, bsize)) || (b = gp_steal(p, a, sidx, bsize))) return b;
    }
    /* (gp_grow released what the device's figures asked for: this is for a
     * mapping that failed all the same, when a trim may still help.) */
    uint64_t need = gp_round_up(bsize, a->chunk), short_by = 0, could = 0;
    if (*st == GP_ERR_OOM && !p->reserve_mode &&
        (gp_device_fits(p, need, prio, &short_by, &could) || short_by <= could) &&
        gp_trim_in(p, NULL, need, prio) &&
        !(b = gp_grow(p, a, sidx, bsize, prio, st)) && *st == GP_ERR_OOM && gp_trim_in(p, NULL, UINT64_MAX, prio))
        b = gp_grow(p, a, sidx, bsize, prio, st);
    return b;
}

/* Ask the pressure callback (offload, the arbiter) to give up live memory
 * of priorities below `prio`, or to wait for the offloads under way.  It runs without the lock, so anything may
 * change meanwhile -- other threads and the callback itself allocate and
 * free -- and the caller must decide everything again afterwards.  Returns
 * whether it gave something up; the lock is held again on return, and the
 * error the request failed with is kept. */
static int gp_ask_pressure(gp_pool *p, uint64_t bsize, int prio, gp_status st)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", gp_last_error());
    gp_pressure_fn fn = p->pressure;
    void *arg = p->pressure_arg;
    /* (An offload under way has given its memory back once the callback,
     * which waits for it, returns: worth deciding again.) */
    int releasing = p->n_releasing != 0;
    p->n_asking++;
    p->owed.bytes = 0; /* (what is given back now is this request's) */
    pthread_mutex_unlock(&p->lock);
    uint64_t got = fn(arg, p, bsize, prio);
    pthread_mutex_lock(&p->lock);
    p->n_asking--;
    if (!got && !releasing) gp_error_set(st, "%s", why);
    return got != 0 || releasing;
}

/* The pool's lock for an allocation or a free: the time another thread made
 * it wait is counted (the hot path pays a trylock, no clock). */
static void gp_lock_counted(gp_pool *p)
{
    if (pthread_mutex_trylock(&p->lock) == 0) return;
    uint64_t t0 = gp_now_ns();
    pthread_mutex_lock(&p->lock);
    p->st.ns_lock_wait += gp_now_ns() - t0;
}

/* Used block b, of `size` requested bytes, goes to the caller: the pointer
 * table and the figures of the pool, its tag and its priority. */
static void gp_block_out(gp_pool *p, gp_block *b, uint64_t size, gp_stream stream, gp_tag tag, int priority)
{
    gp_tag_stats *ts = &p->tags[tag];
    b->requested = size;
    p->st.allocated_total += b->size;
    p->st.requested_total += size;
    b->tag = tag;
    b->prio = (uint8_t)priority;
    if (p->hcount >= p->hmask + 1 && gp_hash_grow(p) != GP_OK) {
        /* Keep going with longer chains: the table is only slower. */
        gp_error_clear();
    }
    gp_hash_insert(p, b);
    gp_allocated_grows(p, b->size);
    gp_peak(&p->st.requested, &p->st.requested_peak, size);
    gp_peak(&p->st.active_blocks, &p->st.active_blocks_peak, 1);
    p->st.n_alloc++;
    gp_peak(&ts->allocated, &ts->allocated_peak, b->size);
    ts->requested += size;
    ts->active_blocks++;
    ts->n_alloc++;
    gp_peak(&p->prio_alloc[priority], &p->prio_peak[priority], b->size);
    GP_TRACE(p, GP_EV_ALLOC, b->addr, b->size, stream, tag, priority);
}

/* The request's tag and priority, checked; the priority resolved. */
static gp_status gp_alloc_args(const gp_pool *p, gp_tag tag, int *priority)
{
    if (*priority == GP_PRIO_DEFAULT) *priority = p->cfg.priority;
    if (tag < gp_tag_count() && *priority >= 0 && *priority <= GP_PRIO_MAX) return GP_OK;
    return gp_error_set(GP_ERR_INVALID,
                        "gpupool: cannot allocate with tag id %u and priority %d: the tag must be "
                        "interned (gp_tag_intern; %u are) and the priority 0..%d",
                        (unsigned)tag, *priority, gp_tag_count(), GP_PRIO_MAX);
}

void *gp_alloc(gp_pool *p, size_t size, gp_stream stream, gp_tag tag, int priority, gp_status *status)
{
    gp_status st = GP_OK, dummy;
    uint64_t t_slow = 0; /* when the request went past the cache */
    if (!status) status = &dummy;
    if (size == 0) {
        *status = gp_error_set(GP_ERR_INVALID, "gpupool: cannot allocate 0 bytes: sizes from 1 byte are accepted");
        return NULL;
    }
    if ((*status = gp_alloc_args(p, tag, &priority)) != GP_OK) return NULL;
    if ((*status = gp_pool_usable(p)) != GP_OK) return NULL;
    gp_lock_counted(p);
    /* More than any device holds: out of memory, as PyTorch's allocator
     * says (a caller that shrinks its request on OOM may then retry). */
    if (size > GP_MAX_SIZE) {
        st = gp_error_set(GP_ERR_OOM, "gpupool: cannot allocate %zu bytes: more than any device holds (at most "
                          "256 TiB per allocation)", size);
        goto fail;
    }
    uint64_t bsize = gp_block_size(p, size);
    unsigned sidx;
    gp_tag_stats *ts = &p->tags[tag];
    gp_arena *a;
    gp_block *b = NULL;
    int gslot;        /* the graph pool this allocation goes to, if capturing */
    int asked = 0;    /* the pressure callback had its chance */
    for (;;) {
        /* Everything is decided here, and again after the pressure callback
         * (which runs without the lock). */
        a = &p->arenas[p->n_arenas == 1 || bsize >= p->small_size ? p->n_arenas - 1 : 0];
        /* Placement: long-lived tags use their stream's slot of the long
         * region (not while capturing: a capture draws on the capturing
         * stream's slot). */
        unsigned life = p->placement && !p->n_capturing ? (unsigned)gp_tag_lifetime(tag) : GP_LIFE_SHORT;
        if ((st = gp_slot_of(p, stream, life, &sidx)) != GP_OK) goto fail;
        gslot = -1;
        if (p->n_capturing && (st = gp_capture_route(p, stream, &gslot)) != GP_OK) goto fail;
        if (ts->limit && ts->allocated + bsize > ts->limit) {
            st = gp_error_set(GP_ERR_LIMIT,
                              "tag '%s' is limited to %" PRIu64 " bytes and holds %" PRIu64
                              "; %" PRIu64 " more were asked for",
                              gp_tag_name(tag), ts->limit, ts->allocated, (uint64_t)bsize);
            goto fail;
        }
        b = gp_fit(p, &a, gslot, sidx, bsize);
        /* Blocks whose record_stream events completed, asked of the driver
         * only on a miss: a hit makes no driver call. */
        if (!b && p->n_pending) {
            gp_poll_pending(p);
            b = gp_fit(p, &a, gslot, sidx, bsize);
        }
        if (b) {
            p->st.cache_hits++;
            break;
        }
        if (!t_slow) t_slow = gp_now_ns();
        /* (A capture cannot wait on another stream: it never steals.) */
        if (gslot < 0 && (b = gp_steal(p, a, sidx, bsize))) break;
        if ((b = gp_grow(p, a, sidx, bsize, priority, &st))) break;
        if (st != GP_ERR_OOM && st != GP_ERR_LIMIT) goto fail;
        if ((b = gp_displace(p, a, sidx, bsize, priority, &st))) break;
        /* Live memory of lower priorities, through the callback, once. */
        if ((st != GP_ERR_OOM && st != GP_ERR_LIMIT) || asked || !p->pressure ||
            !(gp_lower_live(p, priority) || p->n_releasing))
            goto fail;
        asked = 1;
        if (!gp_ask_pressure(p, bsize, priority, st)) goto fail;
    }
    b->state = GP_BLOCK_USED; /* before the tail goes back, or they would merge */
    if (b->size - bsize >= GP_ALIGN) {
        gp_block *tail = gp_split(p, b, bsize);
        if (!tail) { /* no header for the tail: the block goes back */
            st = GP_ERR_NOMEM;
            b->state = GP_BLOCK_FREE;
            gp_insert_free(p, a, b);
            goto fail;
        }
        tail->state = GP_BLOCK_FREE;
        gp_insert_free(p, a, tail);
    }
    /* Only the block handed out joins the graph pool; the tail stays with
     * the stream. */
    if (gslot >= 0) {
        b->sidx = (uint8_t)gslot;
        for (unsigned i = 0; i < GP_MAX_GPOOLS; i++)
            if (p->gpools[i].live && p->gpools[i].slot == (unsigned)gslot)
                p->gpools[i].tags[tag / 64] |= 1ull << (tag % 64);
    }
    gp_block_out(p, b, size, stream, tag, priority);
    gp_debug_tick(p);
    if (t_slow) p->st.ns_slow += gp_now_ns() - t_slow;
    pthread_mutex_unlock(&p->lock);
    *status = GP_OK;
    return (void *)b->addr;

fail:
    if (st == GP_ERR_OOM || st == GP_ERR_LIMIT) {
        char why[256];
        snprintf(why, sizeof why, "%s", gp_last_error());
        p->st.n_oom++;
        gp_oom_report_locked(p, size, p->last_oom, sizeof p->last_oom);
        size_t n = strlen(p->last_oom);
        n += (size_t)snprintf(p->last_oom + n, sizeof p->last_oom - n, "\n  cause: %s", why);
        uint64_t kept = gp_cached_bytes(p, priority + 1, GP_PRIO_MAX);
        if (kept && n < sizeof p->last_oom)
            snprintf(p->last_oom + n, sizeof p->last_oom - n,
                     "\n  %" PRIu64 " bytes cached at priorities above this request's (%d) stay theirs",
                     kept, priority);
        gp_error_set(st, "%s", p->last_oom);
        if (p->trace) {
            uint64_t dev_free = 0, dev_total = 0;
            if (p->be->mem_info(p->be, &dev_free, &dev_total) != GP_OK) dev_free = 0;
            gp_trace_add(p->trace, GP_EV_OOM, (uintptr_t)dev_free, size, stream, tag, priority);
            gp_error_set(st, "%s", p->last_oom); /* (mem_info may have left its own) */
        }
    }
    if (t_slow) p->st.ns_slow += gp_now_ns() - t_slow;
    pthread_mutex_unlock(&p->lock);
    *status = st;
    return NULL;
}

gp_status gp_pool_alloc_apart(gp_pool *p, const uint64_t *sizes, size_t n, gp_stream stream, gp_tag tag,
                               int priority, void **out)
{
    gp_status st = gp_alloc_args(p, tag, &priority);
    if (st != GP_OK) return st;
    if (n == 0 || n > GP_APART_MAX)
        return gp_error_set(GP_ERR_INVALID, "gpupool: an allocation apart takes 1..%d sizes, got %zu",
                            GP_APART_MAX, n);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] == 0 || sizes[i] > GP_MAX_SIZE)
            return gp_error_set(sizes[i] ? GP_ERR_OOM : GP_ERR_INVALID,
                                "gpupool: cannot allocate %" PRIu64 " bytes apart (size %zu of the group): "
                                "sizes from 1 byte to 256 TiB are accepted", sizes[i], i);
        /* (checked at each step: the sum stays below 2^49) */
        if ((total += gp_block_size(p, sizes[i])) > GP_MAX_SIZE)
            return gp_error_set(GP_ERR_OOM, "gpupool: cannot allocate %zu blocks apart, %" PRIu64 " bytes and more: "
                                "more than any device holds", n, total);
    }
    if ((st = gp_pool_usable(p)) != GP_OK) return st;
    gp_lock_counted(p);
    /* The arena that wastes least of the last chunk: the large one's chunks
     * map faster, where the group leaves little of one unused. */
    gp_arena *a = &p->arenas[p->n_arenas - 1];
    if (p->n_arenas > 1 && gp_round_up(total, a->chunk) - total > total / 8) a = &p->arenas[0];
    uint64_t need = gp_round_up(total, a->chunk);
    unsigned life = p->placement ? (unsigned)gp_tag_lifetime(tag) : GP_LIFE_SHORT, sidx;
    gp_tag_stats *ts = &p->tags[tag];
    uintptr_t at = 0;
    gp_block *b = NULL;
    if (p->n_capturing)
        st = gp_error_set(GP_ERR_INVALID, "gpupool: no allocation apart while a CUDA graph is being captured on "
                          "device %d (it maps memory)", p->be->device);
    else if ((st = gp_slot_of(p, stream, life, &sidx)) != GP_OK)
        ;
    else if (ts->limit && ts->allocated + need > ts->limit)
        st = gp_error_set(GP_ERR_LIMIT, "tag '%s' is limited to %" PRIu64 " bytes and holds %" PRIu64
                          "; %" PRIu64 " more were asked for apart", gp_tag_name(tag), ts->limit, ts->allocated,
                          need);
    else if (!(b = gp_grow_in(p, a, sidx, need, priority, &st, 1, &at)))
        ;
    else if ((st = gp_spare_at_least(p, n + 2)) != GP_OK) {
        gp_insert_free(p, a, b);
        b = NULL;
    }
    if (!b) {
        pthread_mutex_unlock(&p->lock);
        return st;
    }
    /* The new mapping alone: what it merged with goes back (marked used
     * first, or they would merge again). */
    b->state = GP_BLOCK_USED;
    if (b->addr < at) {
        gp_block *head = b;
        b = gp_split(p, head, at - head->addr);
        head->state = GP_BLOCK_FREE;
        gp_insert_free(p, a, head);
    }
    if (b->size > need) {
        gp_block *tail = gp_split(p, b, need);
        tail->state = GP_BLOCK_FREE;
        gp_insert_free(p, a, tail);
    }
    /* One block per size, the last to the end of the last chunk. */
    for (size_t i = 0; i < n; i++) {
        gp_block *next = i + 1 < n ? gp_split(p, b, gp_block_size(p, sizes[i])) : NULL;
        gp_block_out(p, b, sizes[i], stream, tag, priority);
        out[i] = (void *)b->addr;
        b = next;
    }
    gp_debug_tick(p);
    pthread_mutex_unlock(&p->lock);
    return GP_OK;
}

gp_arena *gp_arena_of(gp_pool *p, uintptr_t a)
{
    for (unsigned k = 0; k < p->n_arenas; k++)
        if (a >= p->arenas[k].base && a < p->arenas[k].base + p->arenas[k].size) return &p->arenas[k];
    return NULL;
}

/* The block containing address x of arena a (slow: error paths only). */
gp_block *gp_block_at(gp_arena *a, uintptr_t x)
{
    for (gp_block *b = a->first; b; b = b->next)
        if (x >= b->addr && x < b->addr + b->size) return b;
    return NULL;
}

/* Explain why x is not a live block start (error path). */
gp_status gp_bad_pointer(gp_pool *p, const void *ptr, const char *what)
{
    uintptr_t x = (uintptr_t)ptr;
    gp_arena *a = gp_arena_of(p, x);
    gp_block *b = a ? gp_block_at(a, x) : NULL;
    if (!b)
        return gp_error_set(GP_ERR_FOREIGN,
                            "gpupool: %s of %p, which gpupool did not allocate (device %d)",
                            what, ptr, p->be->device);
    if (b->state != GP_BLOCK_USED && b->state != GP_BLOCK_OFFLOADED)
        return gp_error_set(GP_ERR_DOUBLE_FREE,
                            "gpupool: %s of %p, which is not allocated: freed twice, or used after free",
                            what, ptr);
    return gp_error_set(GP_ERR_FOREIGN,
                        "gpupool: %s of %p, which points %" PRIu64 " bytes into the block at 0x%" PRIxPTR
                        " of %" PRIu64 " bytes, not at its start", what, ptr,
                        (uint64_t)(x - b->addr), b->addr, b->size);
}

gp_status gp_free(gp_pool *p, void *ptr)
{
    if (!ptr) return GP_OK;
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    gp_lock_counted(p);
    gp_block *b = gp_hash_remove(p, (uintptr_t)ptr);
    if (!b) {
        st = gp_bad_pointer(p, ptr, "free");
        pthread_mutex_unlock(&p->lock);
        return st;
    }
    if (b->state == GP_BLOCK_OFFLOADED) {
        gp_free_offloaded(p, b);
        gp_debug_tick(p);
        pthread_mutex_unlock(&p->lock);
        return GP_OK;
    }
    gp_tag_stats *ts = &p->tags[b->tag];
    p->st.allocated -= b->size;
    p->st.requested -= b->requested;
    p->st.active_blocks--;
    p->st.n_free++;
    ts->allocated -= b->size;
    ts->requested -= b->requested;
    ts->active_blocks--;
    p->prio_alloc[b->prio] -= b->size;
    if (p->trace) {
        gp_stream bs = p->streams[b->sidx];
        gp_trace_add(p->trace, GP_EV_FREE_REQUESTED, b->addr, b->size, bs, b->tag, b->prio);
        if (!b->rec) gp_trace_add(p->trace, GP_EV_FREE_COMPLETED, b->addr, b->size, bs, b->tag, b->prio);
    }
    if (b->rec) {
        gp_free_recorded(p, b);
    } else {
        b->state = GP_BLOCK_FREE;
        gp_insert_free(p, &p->arenas[b->arena], b);
    }
    gp_debug_tick(p);
    pthread_mutex_unlock(&p->lock);
    return GP_OK;
}
/* ------------------------------------------------------------------- fork */

/* fork() copies a pool's lock as it is: if another thread held it, the
 * child (which has only the forking thread) would wait for it forever.  So
 * the handlers take every pool's lock before the fork and release them in
 * both processes after; in the child the pools then refuse use, since their
 * device memory belongs to the parent (CUDA does not survive a fork). */
static pthread_mutex_t gp_all_lock = PTHREAD_MUTEX_INITIALIZER;
static gp_pool *gp_all;
static pthread_once_t gp_atfork_once = PTHREAD_ONCE_INIT;
atomic_uint gp_fork_generation;

static void gp_fork_prepare(void)
{
    pthread_mutex_lock(&gp_all_lock);
    for (gp_pool *p = gp_all; p; p = p->all_next) pthread_mutex_lock(&p->lock);
}

static void gp_fork_parent(void)
{
    for (gp_pool *p = gp_all; p; p = p->all_next) pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&gp_all_lock);
}

static void gp_fork_child(void)
{
    atomic_fetch_add_explicit(&gp_fork_generation, 1, memory_order_relaxed);
    gp_fork_parent();
}

static void gp_atfork_register(void) { pthread_atfork(gp_fork_prepare, gp_fork_parent, gp_fork_child); }

void gp_pool_atfork_install(void) { pthread_once(&gp_atfork_once, gp_atfork_register); }

gp_status gp_forked_error(const gp_pool *p)
{
    return gp_error_set(GP_ERR_INVALID,
                        "gpupool: this pool belongs to process %d; a forked child cannot use its parent's "
                        "CUDA memory; use the 'spawn' start method (multiprocessing.set_start_method('spawn'), "
                        "or DataLoader(..., multiprocessing_context='spawn')) or make a new pool in the child",
                        p->pid);
}

static void gp_all_insert(gp_pool *p)
{
    gp_pool_atfork_install();
    pthread_mutex_lock(&gp_all_lock);
    p->all_next = gp_all;
    if (gp_all) gp_all->all_prev = p;
    gp_all = p;
    pthread_mutex_unlock(&gp_all_lock);
}

static void gp_all_remove(gp_pool *p)
{
    pthread_mutex_lock(&gp_all_lock);
    if (p->all_prev) p->all_prev->all_next = p->all_next;
    else if (gp_all == p) gp_all = p->all_next;
    if (p->all_next) p->all_next->all_prev = p->all_prev;
    pthread_mutex_unlock(&gp_all_lock);
}

/* ---------------------------------------------------------- create, destroy */

/* Reserve arena k: `size` bytes, and a long-lived region of `long_size`
 * above them (0: none). */
static gp_status gp_arena_init(gp_pool *p, unsigned k, uint64_t size, uint64_t chunk, uint64_t long_size)
{
    gp_arena *a = &p->arenas[k];
    a->chunk = chunk;
    long_size = gp_round_up(long_size, chunk);
    a->size = gp_round_up(size, chunk) + long_size;
    a->handles = calloc(a->size / chunk, sizeof *a->handles);
    if (!a->handles) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the chunk table");
    /* (a failed call's output is no address: the arena keeps none) */
    uintptr_t base = 0;
    gp_status st = p->be->reserve(p->be, a->size, chunk, &base);
    if (st != GP_OK) return st;
    a->base = base;
    a->long_base = a->base + a->size - long_size;
    if ((st = gp_reserve_headers(p, 2)) != GP_OK) return st;
    gp_block *b = gp_new_block(p);
    b->addr = a->base;
    b->size = a->size - long_size;
    b->state = GP_BLOCK_FREE_UNMAPPED;
    b->arena = (uint8_t)k;
    a->first = b;
    gp_bins_insert(&a->unmapped[GP_LIFE_SHORT], b);
    if (long_size) {
        gp_block *l = gp_split(p, b, b->size);
        l->size = long_size;
        l->life = GP_LIFE_LONG;
        gp_bins_insert(&a->unmapped[GP_LIFE_LONG], l);
    }
    return GP_OK;
}

/* The reserve of reserve mode, mapped at once in large chunks (they are
 * never unmapped, and each mapping costs the same whatever its size). */
static gp_status gp_map_reserve(gp_pool *p, uint64_t bytes)
{
    gp_arena *a = &p->arenas[0];
    gp_block *u = a->first;
    uint64_t len = bytes / a->chunk * a->chunk;
    if (len == 0) len = a->chunk;
    uint64_t kept = 0;
    gp_status st = gp_reserve_headers(p, 1);
    if (st == GP_OK) st = gp_map_range(p, a, u->addr, len, &kept);
    if (st != GP_OK) {
        char why[512]; /* (the cause lies in the buffer the message is written to) */
        snprintf(why, sizeof why, "%s", gp_last_error());
        return gp_error_set(st, "gpupool: cannot map the reserve of %" PRIu64 " bytes on device %d: %s",
                            len, p->be->device, why);
    }
    gp_mapped_head(p, a, u, len, 0, 0);
    return GP_OK;
}

gp_status gp_pool_create(gp_backend *be, const gp_config *cfg, gp_pool **out)
{
    *out = NULL;
    if (be->total == 0 || be->total > GP_DEVICE_MAX) {
        uint64_t total = be->total;
        be->destroy(be);
        return gp_error_set(GP_ERR_INVALID, "gpupool: a device of %" PRIu64 " bytes: the pool takes devices of 1 "
                            "byte to %" PRIu64 " bytes (1 PiB)", total, (uint64_t)GP_DEVICE_MAX);
    }
    gp_pool *p = calloc(1, sizeof *p);
    if (!p) {
        be->destroy(be);
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the pool");
    }
    pthread_mutex_init(&p->lock, NULL);
    p->fork_gen = atomic_load_explicit(&gp_fork_generation, memory_order_relaxed);
    p->pid = (int)getpid();
    gp_all_insert(p);
    p->be = be;
    p->cfg = *cfg;
    p->small_size = cfg->small_size ? cfg->small_size : (1u << 20);
    p->st.device_total = be->total;
    p->st.limit = gp_size_resolve(cfg->limit, be->total);
    uint64_t chunk = cfg->chunk ? cfg->chunk : (2u << 20);
    if (chunk % be->granularity) chunk = gp_round_up(chunk, be->granularity);
    gp_status st = GP_OK;
    p->hmask = 1023;
    p->buckets = calloc(p->hmask + 1, sizeof *p->buckets);
    if (!p->buckets) st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the pointer table");
    /* GPUPOOL_TRACE: on from the start, so that a reserve's mapping is in it. */
    if (st == GP_OK && cfg->trace) st = gp_pool_history(p, GP_HISTORY_DEFAULT, 1);
    /* Stream index 0 is the default stream, so that the reserve has bins. */
    if (st == GP_OK) {
        p->reserve_mode = cfg->mode == GP_MODE_RESERVE;
        if (p->reserve_mode) {
            uint64_t r = gp_size_resolve(cfg->reserve, be->total);
            if (r == 0) r = (uint64_t)(0.8 * (double)be->total);
            if (p->st.limit && r > p->st.limit) r = p->st.limit;
            /* Few large chunks: about 64 of them, between `chunk` and 1 GiB. */
            uint64_t big = chunk;
            while (big < (1ull << 30) && big * 64 < r) big *= 2;
            p->n_arenas = 1;
            /* The reserve is whole chunks, at least one: never past the limit. */
            if (p->st.limit && p->st.limit < big)
                st = gp_error_set(GP_ERR_INVALID,
                                  "gpupool: reserve mode maps whole chunks of %" PRIu64 " bytes, and the limit of %"
                                  PRIu64 " bytes is below one: set a limit of at least %" PRIu64
                                  " bytes (or a smaller GPUPOOL_CHUNK)", big, p->st.limit, big);
            if (st == GP_OK) st = gp_arena_init(p, 0, r < big ? big : r, big, 0);
            p->st.arena_size[GP_ARENA_LARGE] = p->arenas[0].size;
            p->st.chunk = big;
            if (st == GP_OK) st = gp_stream_index(p, NULL, &(unsigned){0});
            if (st == GP_OK) st = gp_map_reserve(p, r < big ? big : r);
        } else {
            p->n_arenas = 2;
            /* Placement: a long-lived region of the device's size in each
             * arena, as the short one could use all of it too (virtual
             * space costs nothing). */
            p->placement = cfg->placement == GP_PLACE_LIFETIME;
            uint64_t long_size = p->placement ? be->total : 0;
            st = gp_arena_init(p, GP_ARENA_SMALL, be->total, chunk, long_size);
            /* Large blocks map in larger units: a driver call per unit is what
             * growing costs (77 us for 2 MiB, 98 us for 32 MiB on an H100),
             * and holes of large blocks are large.  At most 1/32 of the device,
             * so that a small device still grows in steps. */
            uint64_t lchunk = cfg->large_chunk > chunk ? cfg->large_chunk : chunk;
            while (lchunk > chunk && lchunk > be->total / 32) lchunk /= 2;
            if (lchunk % be->granularity) lchunk = gp_round_up(lchunk, be->granularity);
            if (st == GP_OK) st = gp_arena_init(p, GP_ARENA_LARGE, 2 * be->total, lchunk, long_size);
            p->st.arena_size[GP_ARENA_SMALL] = p->arenas[0].size;
            p->st.arena_size[GP_ARENA_LARGE] = p->arenas[1].size;
            p->st.chunk = chunk;
        }
    }
    if (st != GP_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", gp_last_error());
        gp_pool_destroy(p);
        return gp_error_set(st, "%s", msg);
    }
    *out = p;
    return GP_OK;
}

void gp_pool_destroy(gp_pool *p)
{
    if (!p) return;
    gp_all_remove(p);
    /* In a forked child the device is the parent's: host memory only. */
    int device = p->fork_gen == atomic_load_explicit(&gp_fork_generation, memory_order_relaxed);
    if (device && p->st.reserved) p->be->synchronize(p->be);
    if (device) gp_idle_fence_drop(p);
    for (unsigned i = 0; device && i < p->n_recs; i++)
        for (unsigned j = 0; j < p->recs[i].n; j++)
            if (p->recs[i].events[j]) p->be->event_release(p->be, p->recs[i].events[j]);
    free(p->recs);
    for (unsigned k = 0; k < GP_ARENA_COUNT; k++) {
        gp_arena *a = &p->arenas[k];
        /* (A failed creation may leave an arena with a chunk table and no
         * reservation.) */
        if (device && a->base) {
            /* The chunk table names every chunk the backend has mapped. */
            for (uint64_t i = 0; i < a->size / a->chunk; i++)
                if (a->handles[i]) p->be->unmap(p->be, a->base + i * a->chunk, a->chunk, a->handles[i]);
            p->be->unreserve(p->be, a->base, a->size);
        }
        free(a->handles);
        for (unsigned s = 0; s < GP_MAX_STREAMS; s++) free(a->bins[s]);
    }
    for (size_t i = 0; i < p->n_slabs; i++) free(p->slabs[i]);
    free(p->slabs);
    free(p->buckets);
    gp_trace_free(p->trace);
    if (device) p->be->destroy(p->be);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
void gp_pool_releasing(gp_pool *p, int delta)
{
    pthread_mutex_lock(&p->lock);
    p->n_releasing += (unsigned)delta;
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_set_pressure(gp_pool *p, gp_pressure_fn fn, void *arg)
{
    pthread_mutex_lock(&p->lock);
    p->pressure = fn;
    p->pressure_arg = arg;
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_set_limit(gp_pool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->lock);
    p->st.limit = bytes;
    p->cfg.limit = (gp_size_spec){.bytes = bytes};
    pthread_mutex_unlock(&p->lock);
}

gp_status gp_pool_set_tag_limit(gp_pool *p, gp_tag tag, uint64_t bytes)
{
    if (tag >= GP_MAX_TAGS || !gp_tag_name(tag))
        return gp_error_set(GP_ERR_INVALID, "gpupool: tag id %u was never interned", (unsigned)tag);
    pthread_mutex_lock(&p->lock);
    p->tags[tag].limit = bytes;
    pthread_mutex_unlock(&p->lock);
    return GP_OK;
}

static int gp_block_cmp(const void *x, const void *y)
{
    uintptr_t a = (*(gp_block *const *)x)->addr, b = (*(gp_block *const *)y)->addr;
    return a < b ? -1 : a > b;
}

gp_status gp_pool_retag(gp_pool *p, void *const *ptrs, size_t n, gp_tag tag, int priority, uint64_t *bytes)
{
    if (bytes) *bytes = 0;
    if (tag >= GP_MAX_TAGS || !gp_tag_name(tag) || priority < GP_PRIO_DEFAULT || priority > GP_PRIO_MAX)
        return gp_error_set(GP_ERR_INVALID,
                            "gpupool: cannot retag to tag id %u, priority %d: the tag must be interned "
                            "and the priority 0..%d (or %d to keep each block's)",
                            (unsigned)tag, priority, GP_PRIO_MAX, GP_PRIO_DEFAULT);
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK || n == 0) return st;
    gp_block **bl = malloc(n * sizeof *bl);
    if (!bl) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory to retag %zu blocks", n);
    pthread_mutex_lock(&p->lock);
    /* Resolve every address first, so that a bad one changes nothing. */
    for (size_t i = 0; i < n; i++) {
        uintptr_t x = (uintptr_t)ptrs[i];
        gp_block *b = gp_hash_find(p, x);
        if (!b) { /* an address inside a block (a view): the slow walk */
            gp_arena *a = gp_arena_of(p, x);
            b = a ? gp_block_at(a, x) : NULL;
            if (b && b->state != GP_BLOCK_USED && b->state != GP_BLOCK_OFFLOADED) b = NULL;
        }
        if (!b) {
            st = gp_error_set(GP_ERR_FOREIGN, "gpupool: retag of %p, which lies in no live block of "
                              "this pool (device %d)", ptrs[i], p->be->device);
            goto out;
        }
        bl[i] = b;
    }
    qsort(bl, n, sizeof *bl, gp_block_cmp);
    size_t m = 0;
    uint64_t add = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && bl[m - 1] == bl[i]) continue;
        bl[m++] = bl[i];
        if (bl[i]->tag != tag && bl[i]->state == GP_BLOCK_USED) add += bl[i]->size;
    }
    gp_tag_stats *ts = &p->tags[tag];
    /* (a tag already over a limit lowered since may still re-prioritise its
     * own blocks: that adds nothing to it) */
    if (ts->limit && add && ts->allocated + add > ts->limit) {
        st = gp_error_set(GP_ERR_LIMIT, "gpupool: retag to '%s' would exceed its limit of %" PRIu64
                          " bytes (it holds %" PRIu64 ", %" PRIu64 " more)", gp_tag_name(tag),
                          ts->limit, ts->allocated, add);
        goto out;
    }
    for (size_t i = 0; i < m; i++) {
        gp_block *b = bl[i];
        int np = priority == GP_PRIO_DEFAULT ? b->prio : priority;
        if (b->tag == tag && b->prio == np) continue;
        gp_tag_stats *os = &p->tags[b->tag];
        os->active_blocks--;
        ts->active_blocks++;
        if (b->state == GP_BLOCK_OFFLOADED) { /* its bytes are on the host: they move as such */
            os->offloaded -= b->size;
            ts->offloaded += b->size;
        } else {
            os->allocated -= b->size;
            os->requested -= b->requested;
            gp_peak(&ts->allocated, &ts->allocated_peak, b->size);
            ts->requested += b->requested;
            p->prio_alloc[b->prio] -= b->size;
            gp_peak(&p->prio_alloc[np], &p->prio_peak[np], b->size);
        }
        b->tag = tag;
        b->prio = (uint8_t)np;
        moved += b->size;
    }
    if (bytes) *bytes = moved;
out:
    pthread_mutex_unlock(&p->lock);
    free(bl);
    return st;
}
