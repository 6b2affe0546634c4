/*
 * stream.c -- streams and what orders memory between them: a stream slot
 * (bins per arena) per stream and lifetime, Tensor.record_stream's events,
 * and CUDA graph capture's private graph pools.  See gpupool.h for the
 * contract of gp_record_stream and gp_pool_capture_*.
 */
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "util.h"

/* ---------------------------------------------------------------- streams */

/* A new slot (bins in every arena) for stream s, or for a graph pool whose
 * blocks are reported on stream s; a graph pool reuses a spare slot first. */
static gp_status gp_slot_new(gp_pool *p, gp_stream s, int kind, unsigned *out)
{
    if (kind == GP_SLOT_GPOOL) {
        for (unsigned i = 0; i < p->n_streams; i++) {
            if (p->slot_kind[i] == GP_SLOT_SPARE) {
                p->slot_kind[i] = GP_SLOT_GPOOL;
                p->slot_life[i] = GP_LIFE_SHORT;
                p->streams[i] = s;
                *out = i;
                return GP_OK;
            }
        }
    }
    if (p->n_streams == GP_MAX_STREAMS)
        return gp_error_set(GP_ERR_TOO_MANY,
                            "gpupool: more than %d streams allocate from one device pool; "
                            "reuse streams (e.g. a fixed stream pool) instead of creating one per step",
                            GP_MAX_STREAMS);
    unsigned i = p->n_streams;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        p->arenas[k].bins[i] = calloc(1, sizeof(gp_bins));
        if (!p->arenas[k].bins[i]) {
            for (unsigned j = 0; j < k; j++) {
                free(p->arenas[j].bins[i]);
                p->arenas[j].bins[i] = NULL;
            }
            return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for stream bins");
        }
    }
    p->streams[i] = s;
    p->slot_kind[i] = (uint8_t)kind;
    p->slot_life[i] = GP_LIFE_SHORT;
    p->n_streams++;
    *out = i;
    return GP_OK;
}

/* The slot of stream s for blocks of lifetime `life`. */
gp_status gp_slot_of(gp_pool *p, gp_stream s, unsigned life, unsigned *out)
{
    /* last_sidx is only ever a stream's slot, never a graph pool's. */
    if (p->last_sidx < p->n_streams && p->streams[p->last_sidx] == s &&
        p->slot_kind[p->last_sidx] == GP_SLOT_STREAM && p->slot_life[p->last_sidx] == life) {
        *out = p->last_sidx;
        return GP_OK;
    }
    for (unsigned i = 0; i < p->n_streams; i++) {
        if (p->streams[i] == s && p->slot_kind[i] == GP_SLOT_STREAM && p->slot_life[i] == life) {
            *out = p->last_sidx = i;
            return GP_OK;
        }
    }
    gp_status st = gp_slot_new(p, s, GP_SLOT_STREAM, out);
    if (st == GP_OK) p->slot_life[*out] = (uint8_t)life;
    if (st == GP_OK) p->last_sidx = *out;
    return st;
}

gp_status gp_stream_index(gp_pool *p, gp_stream s, unsigned *out)
{
    return gp_slot_of(p, s, GP_LIFE_SHORT, out);
}
/* ----------------------------------------------------------- record_stream */

static gp_rec *gp_rec_of(gp_pool *p, const gp_block *b)
{
    for (unsigned i = 0; i < p->n_recs; i++)
        if (p->recs[i].b == b) return &p->recs[i];
    return NULL;
}

void gp_rec_forget(gp_pool *p, gp_block *b)
{
    for (unsigned i = 0; i < p->n_recs; i++) {
        if (p->recs[i].b == b) {
            p->recs[i] = p->recs[--p->n_recs];
            break;
        }
    }
    b->rec = 0;
}

/* The events of pending record i have completed: its block goes back to the
 * bins and the record is dropped (the last one takes its place). */
static void gp_rec_finish(gp_pool *p, unsigned i)
{
    gp_rec *r = &p->recs[i];
    gp_block *b = r->b;
    for (unsigned j = 0; j < r->n; j++)
        if (r->events[j]) p->be->event_release(p->be, r->events[j]);
    p->st.pending -= b->size;
    p->n_pending--;
    GP_TRACE(p, GP_EV_FREE_COMPLETED, b->addr, b->size, p->streams[b->sidx], b->tag, b->prio);
    b->rec = 0;
    b->state = GP_BLOCK_FREE;
    p->recs[i] = p->recs[--p->n_recs];
    gp_insert_free(p, &p->arenas[b->arena], b);
}

/* Give back the pending blocks whose streams finished the work queued at
 * free time: a query per event, never a host wait. */
void gp_poll_pending(gp_pool *p)
{
    for (unsigned i = 0; i < p->n_recs;) {
        gp_rec *r = &p->recs[i];
        int all = r->pending && !r->wait_sync;
        for (unsigned j = 0; all && j < r->n; j++) {
            int done = 0;
            if (!r->events[j]) continue;
            if (p->be->event_query(p->be, r->events[j], &done) != GP_OK) {
                gp_error_clear(); /* a failing query: keep the block out */
                done = 0;
            }
            if (done) {
                p->be->event_release(p->be, r->events[j]);
                r->events[j] = 0;
            } else {
                all = 0;
            }
        }
        if (all) gp_rec_finish(p, i);
        else i++;
    }
}

/* After a device synchronisation every pending block is safe. */
static void gp_release_pending(gp_pool *p)
{
    for (unsigned i = 0; i < p->n_recs;) {
        if (p->recs[i].pending) gp_rec_finish(p, i);
        else i++;
    }
}

gp_status gp_sync_locked(gp_pool *p)
{
    p->st.n_sync++;
    gp_status st = p->be->synchronize(p->be);
    if (st == GP_OK) {
        gp_idle_synced(p);
        gp_release_pending(p);
    }
    return st;
}

/* A pending block whose events could not all be recorded (a capture was
 * under way): only a device sync says its streams are done with it. */
static int gp_pending_needs_sync(const gp_pool *p)
{
    for (unsigned i = 0; i < p->n_recs; i++)
        if (p->recs[i].pending && p->recs[i].wait_sync) return 1;
    return 0;
}

int gp_fence_begin(gp_pool *p, uint64_t *events, size_t *n)
{
    *n = 0;
    if (!gp_pending_needs_sync(p) && gp_fence_locked(p, events, GP_FENCE_STREAMS, n) == GP_OK) return 1;
    gp_error_clear();
    return 0;
}

gp_status gp_fence_finish(gp_backend *be, uint64_t *events, size_t n, int fenced, int *synced)
{
    gp_status st = GP_OK;
    for (size_t i = 0; i < n; i++) {
        if (st == GP_OK) st = be->event_wait(be, events[i]);
        be->event_release(be, events[i]);
    }
    if (fenced && st == GP_OK) {
        *synced = 0;
        return GP_OK;
    }
    gp_error_clear();
    *synced = 1;
    return be->synchronize(be);
}

gp_status gp_quiesce_locked(gp_pool *p)
{
    uint64_t ev[GP_FENCE_STREAMS];
    size_t n;
    int synced, fenced = gp_fence_begin(p, ev, &n);
    gp_status st = gp_fence_finish(p->be, ev, n, fenced, &synced);
    if (synced) p->st.n_sync++;
    else p->st.n_sync_pool++;
    if (st == GP_OK) {
        gp_idle_synced(p);
        gp_release_pending(p);
    }
    return st;
}

int gp_pending_upto(const gp_pool *p, int max_prio)
{
    for (unsigned i = 0; i < p->n_recs; i++)
        if (p->recs[i].pending && p->recs[i].b->prio <= max_prio) return 1;
    return 0;
}

/* b, with extra streams, is freed: record an event on each and keep it out
 * of the bins until they completed.  Its bytes stay reserved as `pending`. */
void gp_free_recorded(gp_pool *p, gp_block *b)
{
    gp_rec *r = gp_rec_of(p, b);
    for (unsigned j = 0; j < r->n; j++) {
        if (p->be->event_record(p->be, r->streams[j], &r->events[j]) != GP_OK) {
            /* e.g. the stream is capturing a graph: fall back to the next
             * device synchronisation (trim). */
            gp_error_clear();
            r->events[j] = 0;
            r->wait_sync = 1;
        }
    }
    r->pending = 1;
    b->state = GP_BLOCK_PENDING;
    b->requested = 0;
    p->st.pending += b->size;
    p->n_pending++;
}

gp_status gp_record_stream(gp_pool *p, void *ptr, gp_stream s)
{
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&p->lock);
    gp_block *b = gp_hash_find(p, (uintptr_t)ptr);
    gp_rec *r = NULL;
    if (!b) {
        st = gp_bad_pointer(p, ptr, "record_stream");
        goto out;
    }
    if (s == p->streams[b->sidx]) goto out; /* its own stream orders it already */
    r = b->rec ? gp_rec_of(p, b) : NULL;
    if (r) {
        for (unsigned j = 0; j < r->n; j++)
            if (r->streams[j] == s) goto out;
        if (r->n == GP_REC_STREAMS) {
            st = gp_error_set(GP_ERR_TOO_MANY, "gpupool: record_stream of %p on more than %d streams",
                              ptr, GP_REC_STREAMS);
            goto out;
        }
    } else {
        gp_rec *nr = gp_array_room(p->recs, &p->cap_recs, p->n_recs, sizeof *nr, 16);
        if (!nr) {
            st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for record_stream");
            goto out;
        }
        p->recs = nr;
        r = &p->recs[p->n_recs++];
        memset(r, 0, sizeof *r);
        r->b = b;
        b->rec = 1;
    }
    r->streams[r->n++] = s;
out:
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* ------------------------------------------------------------ graph capture */

static gp_gpool *gp_gpool_find(gp_pool *p, uint64_t key)
{
    for (unsigned i = 0; i < GP_MAX_GPOOLS; i++)
        if (p->gpools[i].live && p->gpools[i].key == key) return &p->gpools[i];
    return NULL;
}

/* Which graph pool an allocation on stream s goes to (*slot, or -1: none).
 * Called only while a capture is underway. */
gp_status gp_capture_route(gp_pool *p, gp_stream s, int *slot)
{
    gp_gpool *only = NULL;
    unsigned n_active = 0;
    *slot = -1;
    for (unsigned i = 0; i < GP_MAX_GPOOLS; i++) {
        gp_gpool *g = &p->gpools[i];
        if (!g->live || !g->n_capturing) continue;
        n_active++;
        only = g;
        for (unsigned j = 0; j < g->n_capturing; j++) {
            if (g->capturing[j] == s) {
                *slot = (int)g->slot;
                return GP_OK;
            }
        }
    }
    /* A stream the capture forked to (it waited on an event of the
     * capturing stream) captures into the same graph: ask the device, which
     * costs a call only while a capture is underway. */
    int capturing = 0;
    gp_status st = p->be->is_capturing(p->be, s, &capturing);
    if (st != GP_OK || !capturing) return st;
    if (n_active != 1)
        return gp_error_set(GP_ERR_INVALID,
                            "gpupool: stream %p captures a CUDA graph while %u captures are underway "
                            "and was not named to gp_pool_capture_begin: cannot tell which graph's "
                            "memory it should use", s, n_active);
    *slot = (int)only->slot;
    return GP_OK;
}

/* A free block for an allocation during capture into the graph pool of
 * `slot`: one of the pool's own, else one of the capturing stream (free
 * since the device was idle at gp_pool_capture_prepare, or freed in this
 * stream's order), in the large arena too when the small one has none
 * (prepare maps ahead there).  Removed from its bins; *ap is its arena. */
gp_block *gp_capture_find(gp_pool *p, gp_arena **ap, unsigned slot, unsigned sidx, uint64_t size)
{
    for (unsigned k = (unsigned)(*ap - p->arenas); k < p->n_arenas; k++) {
        gp_arena *a = &p->arenas[k];
        gp_bins *order[2] = {a->bins[slot], a->bins[sidx]};
        for (int i = 0; i < 2; i++) {
            gp_block *b = gp_bins_find(order[i], size);
            if (b) {
                gp_bins_remove(order[i], b);
                *ap = a;
                return b;
            }
        }
    }
    return NULL;
}

gp_status gp_pool_capture_prepare(gp_pool *p, gp_stream stream)
{
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&p->lock);
    unsigned sidx;
    st = gp_stream_index(p, stream, &sidx);
    /* With another capture underway the device cannot be synchronised: the
     * new capture then draws on its stream's own blocks and new mappings. */
    if (st != GP_OK || p->n_capturing) goto out;
    if ((st = gp_sync_locked(p)) != GP_OK) goto out;
    /* The device is idle: every cached block is safe for the capturing
     * stream.  Hand them all to it, so that the capture finds them without
     * a cross-stream wait (which a capture cannot make): each to the
     * stream's slot of its own region, so that regions stay apart (a
     * capture draws on the short one). */
    uint64_t have = 0;
    unsigned to[2] = {sidx, 0};
    int have_long = 0;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        gp_arena *a = &p->arenas[k];
        gp_coalesce_idle(p, a);
        for (gp_block *b = a->first; b; b = b->next) {
            if (b->state != GP_BLOCK_FREE || p->slot_kind[b->sidx] != GP_SLOT_STREAM) continue;
            if (b->life == GP_LIFE_LONG && !have_long) {
                /* (Out of slots: the long region's blocks stay where they are.) */
                have_long = gp_slot_of(p, stream, GP_LIFE_LONG, &to[GP_LIFE_LONG]) == GP_OK ? 1 : -1;
                if (have_long < 0) gp_error_clear();
            }
            if (b->life == GP_LIFE_LONG && have_long < 0) continue;
            if (b->sidx != to[b->life]) {
                gp_bins_remove(a->bins[b->sidx], b);
                b->sidx = (uint8_t)to[b->life];
                b = gp_insert_free(p, a, b);
            }
            if (k == p->n_arenas - 1 && b->life == GP_LIFE_SHORT) have += b->size;
        }
    }
    /* Map ahead, before the capture starts, what the workload needed at its
     * peak beyond what is live (warm-up runs set that peak), so that the
     * capture itself makes no driver call.  Best effort: if the device or
     * the limit says no, the capture maps what it lacks. */
    uint64_t want = p->st.allocated_peak - p->st.allocated;
    if (!p->reserve_mode && want > have) {
        gp_arena *a = &p->arenas[p->n_arenas - 1];
        gp_status gs;
        gp_block *b = gp_grow(p, a, sidx, want - have, p->cfg.priority, &gs);
        if (b) gp_insert_free(p, a, b);
        else gp_error_clear();
    }
out:
    pthread_mutex_unlock(&p->lock);
    return st;
}

gp_status gp_pool_capture_begin(gp_pool *p, uint64_t key, gp_stream stream)
{
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&p->lock);
    gp_gpool *g = gp_gpool_find(p, key);
    if (!g) {
        unsigned i = 0, home, slot;
        while (i < GP_MAX_GPOOLS && p->gpools[i].live) i++;
        if (i == GP_MAX_GPOOLS) {
            st = gp_error_set(GP_ERR_TOO_MANY,
                              "gpupool: more than %d CUDA graph memory pools are alive on device %d; "
                              "share pools between graphs (pool=graph.pool()) or release graphs",
                              GP_MAX_GPOOLS, p->be->device);
            goto out;
        }
        if ((st = gp_stream_index(p, stream, &home)) != GP_OK) goto out;
        if ((st = gp_slot_new(p, stream, GP_SLOT_GPOOL, &slot)) != GP_OK) goto out;
        g = &p->gpools[i];
        *g = (gp_gpool){.key = key, .slot = slot, .home = home, .live = 1};
    }
    if (g->n_capturing == GP_GPOOL_STREAMS) {
        st = gp_error_set(GP_ERR_TOO_MANY, "gpupool: more than %d streams capture into one graph pool",
                          GP_GPOOL_STREAMS);
        goto out;
    }
    g->capturing[g->n_capturing++] = stream;
    g->refs++;
    p->n_capturing++;
out:
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* Give the memory of graph pool g back: its free blocks return to the bins
 * of the stream that captured, and its live blocks (outputs the caller still
 * holds) go there when freed.  The device is synchronised first, since a
 * replay may still be running. */
static gp_status gp_gpool_free(gp_pool *p, gp_gpool *g)
{
    p->st.n_sync++;
    gp_status st = p->be->synchronize(p->be);
    if (st != GP_OK) return st;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        gp_arena *a = &p->arenas[k];
        for (gp_block *b = a->first; b; b = b->next) {
            if (b->state == GP_BLOCK_FREE_UNMAPPED || b->sidx != g->slot) continue;
            if (b->state == GP_BLOCK_FREE) {
                gp_bins_remove(a->bins[g->slot], b);
                b->sidx = (uint8_t)g->home;
                b = gp_insert_free(p, a, b);
            } else {
                b->sidx = (uint8_t)g->home;
            }
        }
    }
    p->slot_kind[g->slot] = GP_SLOT_SPARE;
    g->live = 0;
    return GP_OK;
}

/* Free the graph pools nobody holds, once no capture is underway. */
static gp_status gp_gpools_collect(gp_pool *p)
{
    gp_status st = GP_OK;
    for (unsigned i = 0; i < GP_MAX_GPOOLS && !p->n_capturing; i++) {
        gp_gpool *g = &p->gpools[i];
        if (g->live && !g->refs && (st = gp_gpool_free(p, g)) != GP_OK) break;
    }
    return st;
}

gp_status gp_pool_capture_end(gp_pool *p, gp_stream stream)
{
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&p->lock);
    st = gp_error_set(GP_ERR_INVALID, "gpupool: capture_end on stream %p, which is not capturing "
                                "into a graph pool", stream);
    for (unsigned i = 0; i < GP_MAX_GPOOLS && st != GP_OK; i++) {
        gp_gpool *g = &p->gpools[i];
        for (unsigned j = 0; g->live && j < g->n_capturing; j++) {
            if (g->capturing[j] == stream) {
                g->capturing[j] = g->capturing[--g->n_capturing];
                p->n_capturing--;
                gp_error_clear();
                st = GP_OK;
                break;
            }
        }
    }
    if (st == GP_OK) st = gp_gpools_collect(p);
    pthread_mutex_unlock(&p->lock);
    return st;
}

gp_status gp_pool_capture_release(gp_pool *p, uint64_t key)
{
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&p->lock);
    gp_gpool *g = gp_gpool_find(p, key);
    /* A live pool that no graph holds, with no capture underway, is one
     * whose memory could not be given back (the device sync failed): a
     * release retries that, dropping no second reference. */
    if (!g || (!g->refs && p->n_capturing))
        st = gp_error_set(GP_ERR_INVALID, "gpupool: release of graph pool %llu, which holds no graph",
                          (unsigned long long)key);
    else if (!g->refs || --g->refs == 0)
        st = gp_gpools_collect(p);
    pthread_mutex_unlock(&p->lock);
    return st;
}

gp_status gp_pool_capture_away(gp_pool *p, uint64_t key, gp_tag *tags, size_t cap, size_t *n)
{
    *n = 0;
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&p->lock);
    gp_gpool *g = gp_gpool_find(p, key);
    if (!g)
        st = gp_error_set(GP_ERR_INVALID, "gpupool: graph pool %llu is not live", (unsigned long long)key);
    /* Its blocks, live or its scratch (free): an offload of its tags takes
     * both, and its tags may hold no live byte (outputs copied out).  Walked
     * only after an offload took some (a replay's cost is this call). */
    int away = 0;
    if (g && g->away) {
        for (unsigned k = 0; !away && k < p->n_arenas; k++)
            for (const gp_block *b = p->arenas[k].first; b && !away; b = b->next)
                away = b->sidx == g->slot && (b->state == GP_BLOCK_OFFLOADED || b->state == GP_BLOCK_FREE_OFFLOADED);
        g->away = away;
    }
    for (unsigned w = 0; g && w < GP_MAX_TAGS / 64; w++)
        for (uint64_t bits = g->tags[w]; bits; bits &= bits - 1) {
            unsigned t = w * 64 + (unsigned)__builtin_ctzll(bits);
            if (away || p->tags[t].offloaded) {
                if (*n < cap) tags[*n] = (gp_tag)t;
                ++*n;
            }
        }
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* Record e on stream s unless one of events[0..*n) is on s already. */
static gp_status gp_fence_add(gp_pool *p, gp_stream s, gp_stream *on, uint64_t *events, size_t cap, size_t *n)
{
    for (size_t i = 0; i < *n; i++)
        if (on[i] == s) return GP_OK;
    if (*n == cap) return gp_error_set(GP_ERR_TOO_MANY, "gpupool: more than %zu streams to fence", cap);
    gp_status st = p->be->event_record(p->be, s, &events[*n]);
    if (st == GP_OK) on[(*n)++] = s;
    return st;
}

gp_status gp_fence_locked(gp_pool *p, uint64_t *events, size_t cap, size_t *n)
{
    *n = 0;
    gp_stream on[GP_FENCE_STREAMS];
    if (cap > GP_FENCE_STREAMS) cap = GP_FENCE_STREAMS;
    gp_status st = GP_OK;
    /* (An event recorded on a capturing stream would join the capture.) */
    if (p->n_capturing)
        st = gp_error_set(GP_ERR_INVALID, "gpupool: no fence while a CUDA graph is being captured");
    for (unsigned i = 0; st == GP_OK && i < p->n_streams; i++)
        if (p->slot_kind[i] != GP_SLOT_SPARE) st = gp_fence_add(p, p->streams[i], on, events, cap, n);
    for (unsigned i = 0; st == GP_OK && i < p->n_recs; i++)
        for (unsigned k = 0; st == GP_OK && k < p->recs[i].n; k++)
            st = gp_fence_add(p, p->recs[i].streams[k], on, events, cap, n);
    if (st != GP_OK) {
        for (size_t i = 0; i < *n; i++) p->be->event_release(p->be, events[i]);
        *n = 0;
    }
    return st;
}
