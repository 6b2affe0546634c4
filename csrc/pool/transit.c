/*
 * transit.c -- trims whose driver calls run without the pool's lock, for
 * the threads that do not allocate: a restore's, which makes room for the
 * memory it maps again.
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

/* Give back up to `want` bytes of cache of priority <= prio freed at
 * free_seq `upto` or before, unmapping without the lock (held on entry and
 * on return).  Returns the bytes released. */
static uint64_t gp_transit_trim(gp_pool *p, uint64_t want, int prio, uint64_t upto)
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

uint64_t gp_trim_unlocked(gp_pool *p, uint64_t want, int prio)
{
    if (!want || p->n_capturing || p->reserve_mode) return 0;
    gp_idle_refresh(p);
    uint64_t got = gp_transit_trim(p, want, prio, p->idle_seq);
    if (got) p->st.n_trim_idle++;
    /* The rest after a wait, if there is cache that may go. */
    if (got < want && gp_cache_level(p, NULL, 0, 1) <= prio && gp_quiesce_unlocked(p))
        got += gp_transit_trim(p, want - got, prio, p->idle_seq);
    return got;
}

void gp_trim_slack_unlocked(gp_pool *p, uint64_t need, uint64_t size, int prio, uint64_t floor, uint64_t most)
{
    pthread_mutex_lock(&p->lock);
    gp_trim_unlocked(p, gp_slack_over(p, need, size, floor, most), prio);
    pthread_mutex_unlock(&p->lock);
}
