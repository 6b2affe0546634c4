/*
 * transit.c -- trims and refills whose driver calls run without the pool's
 * lock, for the threads that do not allocate: a restore's trim, which
 * makes room for the memory it maps again, and the refill of that cache as
 * an offload gives memory back.
 *
 * A trim made with the lock held stops every thread that allocates for
 * the length of its unmaps (0.1 ms or more per 64 MiB chunk) and of the
 * wait for the pool's streams it needs where idle cache is short (a
 * device sync when this was measured): a training loop whose
 * optimizer state comes back during the backward pass waited for the lock
 * 9 ms a step.  Here the chunks to unmap are taken out of the pool's
 * structures first, as a TRANSIT block nobody else touches (in no bin,
 * merging with nothing, never a candidate of a trim or an offload), the
 * lock is let go for the unmaps and the wait, and the block becomes
 * unmapped space (or, where the backend refused, cache again) once it is
 * taken again.  What was decided before is decided afresh after: these
 * calls return with the lock held and the pool possibly changed.
 */
#include "pool.h"

/* Detached blocks handled per round without the lock. */
#define GP_TRANSIT_BATCH 32

/* A restore's trim unmapped d's first d->done bytes: owed, where they
 * were (the smallest piece makes way where all places are taken). */
static void gp_owe(gp_pool *p, const gp_detached *d)
{
    unsigned k = p->owed.n, low = 0;
    for (unsigned i = 1; i < p->owed.n; i++)
        if (p->owed.piece[i].len < p->owed.piece[low].len) low = i;
    if (k == GP_OWED_PIECES) {
        if (p->owed.piece[low].len >= d->done) return;
        p->owed.bytes -= p->owed.piece[low].len;
        k = low;
    } else
        p->owed.n++;
    p->owed.piece[k] = (struct gp_owed_piece){.addr = d->b->addr, .len = d->done, .arena = (uint8_t)d->b->arena,
                                              .sidx = d->sidx, .prio = d->prio};
    p->owed.bytes += d->done;
}

/* Give back up to `want` bytes of cache of priority <= prio freed at
 * free_seq `upto` or before, unmapping without the lock (held on entry and
 * on return); what went is owed to the phase that follows where `owe`.
 * Returns the bytes released. */
static uint64_t gp_transit_trim(gp_pool *p, uint64_t want, int prio, uint64_t upto, int owe)
{
    gp_detached d[GP_TRANSIT_BATCH];
    uint64_t got = 0;
    while (got < want && !p->n_capturing && !p->reserve_mode) {
        gp_detach_list out = {.d = d, .cap = GP_TRANSIT_BATCH};
        gp_trim_cached(p, NULL, want - got, prio, upto, &out);
        if (!out.n) break;
        pthread_mutex_unlock(&p->lock);
        for (size_t i = 0; i < out.n; i++) gp_trim_unmap(p, &d[i]);
        pthread_mutex_lock(&p->lock);
        int refused = 0;
        for (size_t i = 0; i < out.n; i++) {
            refused |= d[i].done < d[i].b->size; /* (before the block settles: it may merge away) */
            if (owe && d[i].done) gp_owe(p, &d[i]);
            gp_trim_settle(p, &d[i]);
            got += d[i].done;
        }
        /* A full batch may have left more to take; a refused unmap would
         * be refused again. */
        if (refused || out.n < out.cap) break;
    }
    if (got) p->st.n_trim++;
    return got;
}

/* Wait for the pool's streams without the lock (held on entry and on
 * return; gp_quiesce_locked says why not a device sync): what came to the
 * bins before it is idle after it. */
static int gp_quiesce_unlocked(gp_pool *p)
{
    uint64_t seq = p->free_seq, ev[GP_FENCE_STREAMS];
    size_t n;
    int synced, fenced = gp_fence_begin(p, ev, &n);
    pthread_mutex_unlock(&p->lock);
    /* (A capture that begins meanwhile: the wait or sync is refused or
     * waits, and the callers trim nothing while it runs.) */
    gp_status st = gp_fence_finish(p->be, ev, n, fenced, &synced);
    pthread_mutex_lock(&p->lock);
    if (synced) p->st.n_sync++;
    else p->st.n_sync_pool++;
    if (st != GP_OK) {
        gp_error_clear();
        return 0;
    }
    if (seq > p->idle_seq) p->idle_seq = seq; /* (what came to the bins since may still be in use) */
    return 1;
}

static uint64_t gp_trim_unlocked_owing(gp_pool *p, uint64_t want, int prio, int owe)
{
    if (!want || p->n_capturing || p->reserve_mode) return 0;
    gp_idle_refresh(p);
    uint64_t got = gp_transit_trim(p, want, prio, p->idle_seq, owe);
    if (got) p->st.n_trim_idle++;
    /* The rest after a wait, if there is cache that may go. */
    if (got < want && gp_cache_level(p, NULL, 0, 1) <= prio && gp_quiesce_unlocked(p))
        got += gp_transit_trim(p, want - got, prio, p->idle_seq, owe);
    return got;
}

uint64_t gp_trim_unlocked(gp_pool *p, uint64_t want, int prio) { return gp_trim_unlocked_owing(p, want, prio, 0); }

void gp_trim_slack_unlocked(gp_pool *p, uint64_t need, uint64_t size, int prio, uint64_t floor, uint64_t most)
{
    pthread_mutex_lock(&p->lock);
    /* (A debt from an earlier restore that no offload paid is forgotten:
     * the phases since had what they needed.) */
    p->owed.bytes = p->owed.n = 0;
    gp_trim_unlocked_owing(p, gp_slack_over(p, need, size, floor, most), prio, 1);
    pthread_mutex_unlock(&p->lock);
}

uint64_t gp_refill_unlocked(gp_pool *p, uint64_t room)
{
    uint64_t got = 0;
    while (p->owed.n && p->owed.bytes && got < room && !p->n_asking && !p->n_capturing && !p->reserve_mode) {
        struct gp_owed_piece *o = &p->owed.piece[p->owed.n - 1];
        gp_arena *a = &p->arenas[o->arena];
        gp_block *u = gp_block_at(a, o->addr);
        uint64_t len = u ? u->addr + u->size - o->addr : 0;
        if (len > o->len) len = o->len;
        /* (Mapped since, by the phase itself, or gone with its slot: passed
         * over.) */
        if (!u || u->state != GP_BLOCK_FREE_UNMAPPED || p->slot_kind[o->sidx] != GP_SLOT_STREAM) {
            if (!len || len >= o->len) p->owed.n--;
            else o->addr += len, o->len -= len;
            continue;
        }
        uint64_t most = p->owed.bytes < room - got ? p->owed.bytes : room - got, limit = p->st.limit;
        if (limit) most = p->st.reserved >= limit ? 0 : most < limit - p->st.reserved ? most : limit - p->st.reserved;
        if (most > GP_TRANSIT_BATCH * a->chunk) most = GP_TRANSIT_BATCH * a->chunk;
        len = (len < most ? len : most) / a->chunk * a->chunk;
        gp_detached d;
        if (!len || !gp_fill_detach(p, a, u, o->addr, len, o->sidx, o->prio, &d)) break;
        uint64_t hs[GP_TRANSIT_BATCH];
        pthread_mutex_unlock(&p->lock);
        for (uintptr_t x = d.b->addr; x < d.b->addr + d.b->size; x += a->chunk) {
            d.tried++;
            if (p->be->map(p->be, x, a->chunk, &hs[d.done / a->chunk]) != GP_OK) break;
            d.done += a->chunk;
        }
        pthread_mutex_lock(&p->lock);
        int refused = d.done < d.b->size;
        gp_fill_settle(p, &d, hs);
        got += d.done;
        /* (Decided afresh from here: the pieces may have changed meanwhile,
         * a growth may have paid part of the debt.) */
        p->owed.bytes -= p->owed.bytes < d.done ? p->owed.bytes : d.done;
        if (refused) {
            /* A device short of memory: what is left is the phase's to map. */
            gp_error_clear();
            p->owed.bytes = p->owed.n = 0;
        }
    }
    return got;
}
