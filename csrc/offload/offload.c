/*
 * offload.c -- the offloader (offload.h): the records of what is offloaded,
 * the API over them, prefetches and background offloads on a thread of
 * their own, the registry of offloadable tags and the pool's pressure
 * callback.  The bytes move in offload_copy.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "offload_impl.h"

/* ----------------------------------------------------- the operation lock */

/* The offloader whose operation this thread runs: the operation may
 * allocate from the pool (its staging), whose pressure callback must then
 * not start another operation of the same offloader on the same thread. */
static _Thread_local gp_offloader *t_operating;

void gp_op_lock(gp_offloader *o)
{
    pthread_mutex_lock(&o->op);
    t_operating = o;
}

void gp_op_unlock(gp_offloader *o)
{
    t_operating = NULL;
    pthread_mutex_unlock(&o->op);
}

/* ------------------------------------------------------------- restores */

/* Restore record r, which this thread holds, and retire it (the op lock
 * is taken here); on failure the caller gives it back. */
static gp_status gp_restore_held(gp_offloader *o, gp_record *r, const gp_want *w, int accept_loss,
                                 gp_offload_result *res)
{
    gp_tagset keep;
    gp_keep_of(r, w, &keep);
    gp_op_lock(o);
    gp_status st = gp_restore_record_locked(o, r, &keep, accept_loss, res);
    if (st == GP_OK) gp_record_retire(o, r);
    gp_op_unlock(o);
    return st;
}

/* ------------------------------------------------------------- pressure */

/* When registered tag `g` will next be used, by the clock: a tag used in
 * a repeating pattern (the layers of a model, each used once a pass, or
 * forward and again backward in training) comes back the gap of two uses
 * ago after its last use (the one gap it has, after two uses) -- two,
 * so that a pass forward and back, whose gaps alternate, is read right
 * too.  A tag used less than twice, or
 * whose pattern said it would be back by now, is taken to stay away as
 * long again as it has been (so among those the least recently used goes
 * first, as before).  A cyclic pass over more layers than fit made every
 * restore displace the least recently used layer -- the one needed
 * soonest -- so that each layer was restored on every pass. */
static uint64_t gp_next_use(const gp_reg *g, uint64_t now)
{
    uint64_t gap = g->begun[2] ? g->begun[1] - g->begun[2] : g->begun[1] ? g->begun[0] - g->begun[1] : 0;
    if (gap && g->begun[0] + gap >= now) return g->begun[0] + gap;
    return now + (now - g->last_use);
}

/* Offload idle registered tags of priority below `below` (none of `keep`),
 * the lowest priority first, then the one whose next use is farthest
 * (gp_next_use), until `needed` bytes were released.  `op` is held. */
gp_status gp_reclaim_locked(gp_offloader *o, uint64_t needed, int below, const gp_tagset *keep,
                            uint64_t *released)
{
    *released = 0;
    /* With the pool's codec (GPUPOOL_CODEC) where it pays, and only where
     * the staging exists already: taken now, at critical priority, from a
     * pool short of memory, it displaced the room the request was waiting
     * for, and stayed.  Raw inside a restore too, whose lanes hold the
     * staging. */
    gp_config cfg;
    gp_pool_config(o->pool, &cfg);
    gp_codec_id codec = GP_CODEC_RAW;
    if (o->staging && gp_codec_parse(cfg.codec, &codec) != GP_OK) {
        gp_error_clear();
        codec = GP_CODEC_RAW;
    }
    uint8_t tried[GP_MAX_TAGS] = {0};
    while (*released < needed) {
        int best = -1;
        uint64_t best_next = 0;
        pthread_mutex_lock(&o->lock);
        unsigned nt = gp_tag_count();
        for (unsigned t = 0; t < nt; t++) {
            const gp_reg *g = &o->reg[t];
            if (g->prio < 0 || g->prio >= below || g->busy || tried[t] || (keep && gp_tagset_has(keep, (gp_tag)t)))
                continue;
            uint64_t next = gp_next_use(g, o->clock);
            if (best < 0 || g->prio < o->reg[best].prio ||
                (g->prio == o->reg[best].prio &&
                 (next > best_next || (next == best_next && g->last_use < o->reg[best].last_use)))) {
                best = (int)t;
                best_next = next;
            }
        }
        unsigned elem = 0;
        if (best >= 0) {
            o->reclaiming = best;
            elem = o->reg[best].elem_size;
        }
        pthread_mutex_unlock(&o->lock);
        if (best < 0) break;
        tried[best] = 1;
        gp_tag_stats ts;
        gp_pool_tag_stats(o->pool, (gp_tag)best, &ts);
        gp_offload_opts opts = {.keep = 1, .codec = (int)codec, .elem_size = elem};
        gp_offload_result res;
        gp_tag t = (gp_tag)best;
        gp_status st = ts.allocated ? gp_offload_locked(o, &t, 1, &opts, &res) : GP_ERR_INVALID;
        if (st != GP_OK && ts.allocated && codec != GP_CODEC_RAW) {
            /* The pool's codec may not run here (ans without nvCOMP): a
             * refused codec must not leave the request without room. */
            gp_error_clear();
            codec = GP_CODEC_RAW;
            opts.codec = (int)codec;
            st = gp_offload_locked(o, &t, 1, &opts, &res);
        }
        pthread_mutex_lock(&o->lock);
        o->reclaiming = -1;
        pthread_cond_broadcast(&o->cond);
        if (st == GP_OK) o->st.n_pressure++;
        pthread_mutex_unlock(&o->lock);
        if (st != GP_OK) {
            gp_error_clear(); /* (this one could not go: try the next) */
            continue;
        }
        *released += res.released;
    }
    return GP_OK;
}

uint64_t gp_offload_reclaim(gp_offloader *o, uint64_t needed, int below)
{
    uint64_t got = 0;
    if (t_operating == o) return 0; /* (an allocation of its own operation) */
    /* The background offloads give memory back: they go first (the op
     * lock below waits for one that runs, not for those queued). */
    pthread_mutex_lock(&o->lock);
    while (o->n_background) pthread_cond_wait(&o->cond, &o->lock);
    pthread_mutex_unlock(&o->lock);
    gp_op_lock(o);
    gp_reclaim_locked(o, needed, below, NULL, &got);
    gp_op_unlock(o);
    return got;
}

static uint64_t gp_pressure_cb(void *arg, gp_pool *pool, uint64_t needed, int priority)
{
    (void)pool;
    return gp_offload_reclaim(arg, needed, priority);
}

void gp_offload_figures(gp_offloader *o, uint64_t *offloadable, uint64_t *offloaded)
{
    uint8_t idle[GP_MAX_TAGS];
    pthread_mutex_lock(&o->lock);
    for (unsigned t = 0; t < GP_MAX_TAGS; t++) idle[t] = o->reg[t].prio >= 0 && !o->reg[t].busy;
    pthread_mutex_unlock(&o->lock);
    *offloadable = 0;
    unsigned nt = gp_tag_count();
    for (unsigned t = 0; t < nt; t++) {
        if (!idle[t]) continue;
        gp_tag_stats ts;
        gp_pool_tag_stats(o->pool, (gp_tag)t, &ts);
        *offloadable += ts.allocated;
    }
    gp_stats s;
    gp_pool_stats(o->pool, &s, 0);
    *offloaded = s.offloaded;
}

/* ---------------------------------------------------------------- API */

gp_status gp_offloader_create(gp_pool *pool, uint64_t host_limit, unsigned threads, const char *nvcomp,
                              gp_offloader **out)
{
    *out = NULL;
    gp_offloader *o = calloc(1, sizeof *o);
    if (!o) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the offloader");
    o->pool = pool;
    o->be = gp_pool_backend(pool);
    pthread_mutex_init(&o->op, NULL);
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->cond, NULL);
    for (unsigned t = 0; t < GP_MAX_TAGS; t++) o->reg[t].prio = -1;
    o->reclaiming = -1;
    if (nvcomp) snprintf(o->nvcomp, sizeof o->nvcomp, "%s", nvcomp);
    gp_batch_init(&o->prefetches);
    /* Pinning threads: one per core, up to GP_PIN_THREADS (each pins
     * slabs of its own; more than the cores only contend). */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned pin_threads = cores < 1 ? 1 : cores > GP_PIN_THREADS ? GP_PIN_THREADS : (unsigned)cores;
    gp_status st = gp_pinned_create(o->be, host_limit, GP_HOST_SLAB, pin_threads, &o->hs);
    gp_tag own;
    if (st == GP_OK) st = gp_tag_intern("gpupool", &own);
    /* The checksums' device array comes from the pool, once, before any
     * pressure could call on the offloader. */
    size_t sums = GP_SUMS_MAX * sizeof(uint64_t);
    if (st == GP_OK) o->sums_dev = gp_alloc(pool, sums, NULL, own, GP_PRIO_CRITICAL, &st);
    if (st == GP_OK && !(o->sums_host = malloc(sums)))
        st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the offloader");
    if (st == GP_OK) st = gp_workq_create("gpupool-unmap", threads, &o->q);
    if (st == GP_OK) st = gp_workq_create("gpupool-map", 1, &o->mq);
    if (st == GP_OK) st = gp_workq_create("gpupool-bg", 1, &o->pq);
    if (st != GP_OK) {
        gp_offloader_destroy(o);
        return st;
    }
    gp_pool_set_pressure(pool, gp_pressure_cb, o);
    *out = o;
    return GP_OK;
}

void gp_offloader_destroy(gp_offloader *o)
{
    if (!o) return;
    gp_pool_set_pressure(o->pool, NULL, NULL);
    gp_workq_destroy(o->pq); /* (runs the prefetches still queued) */
    gp_workq_destroy(o->q);
    gp_workq_destroy(o->mq);
    gp_record *lists[2] = {o->records, o->clean};
    for (int l = 0; l < 2; l++)
        while (lists[l]) {
            gp_record *r = lists[l];
            lists[l] = r->next;
            gp_record_free(o, r);
        }
    gp_offload_copy_free(o);
    for (int i = 0; i < o->n_streams; i++) o->be->stream_destroy(o->be, o->streams[i]);
    if (o->sums_dev) gp_free(o->pool, o->sums_dev);
    free(o->sums_host);
    gp_pinned_destroy(o->hs);
    gp_batch_destroy(&o->prefetches);
    pthread_cond_destroy(&o->cond);
    pthread_mutex_destroy(&o->lock);
    pthread_mutex_destroy(&o->op);
    free(o);
}

/* The tags are valid, and the offloader is this process's (a child of a
 * fork must not touch its locks or threads: they are the parent's). */
static gp_status gp_check_tags(gp_offloader *o, const gp_tag *tags, size_t n)
{
    gp_status st = gp_pool_in_process(o->pool);
    if (st != GP_OK) return st;
    if (!tags || !n) return gp_error_set(GP_ERR_INVALID, "gpupool: no tag given");
    for (size_t i = 0; i < n; i++)
        if (tags[i] >= gp_tag_count())
            return gp_error_set(GP_ERR_INVALID, "gpupool: tag id %u was never interned", (unsigned)tags[i]);
    return GP_OK;
}

static gp_status gp_check_offload(gp_offloader *o, const gp_tag *tags, size_t n_tags,
                                 const gp_offload_opts *opts)
{
    gp_status st = gp_check_tags(o, tags, n_tags);
    if (st != GP_OK) return st;
    if (opts->codec < 0 || opts->codec >= GP_CODEC_COUNT)
        return gp_error_set(GP_ERR_INVALID, "gpupool: codec %d is not one of the %d codecs", opts->codec,
                            GP_CODEC_COUNT);
    return GP_OK;
}

gp_status gp_offload_tags(gp_offloader *o, const gp_tag *tags, size_t n_tags, const gp_offload_opts *opts,
                          gp_offload_result *res)
{
    gp_status st = gp_check_offload(o, tags, n_tags, opts);
    if (st != GP_OK) return st;
    gp_op_lock(o);
    st = gp_offload_locked(o, tags, n_tags, opts, res);
    gp_op_unlock(o);
    if (st == GP_OK) gp_pinned_grow_ahead(o->hs, gp_clean_bytes(o));
    return st;
}

/* The failure of a background offload, if one finished with one since it
 * was last reported (the lock is held). */
static gp_status gp_bg_failure(gp_offloader *o)
{
    gp_status st = o->bg_status;
    if (st != GP_OK) gp_error_set(st, "%s", o->bg_error);
    o->bg_status = GP_OK;
    return st;
}

/* A job of the background thread finished with `st` (the lock is held);
 * `report`: a failure is the next restore's to report (a background
 * offload's: its caller has gone on; a prefetch's is not, as the record
 * stays offloaded and the restore that wants it tries it again). */
static void gp_bg_done(gp_offloader *o, gp_status st, int report)
{
    if (st != GP_OK && report) {
        o->bg_status = st;
        snprintf(o->bg_error, sizeof o->bg_error, "%s", gp_last_error());
    }
    pthread_cond_broadcast(&o->cond);
}

/* What a restore or prefetch of `tags` wants, returning with the lock held
 * once the background offloads queued have run (what one takes has no
 * record before it has). */
static gp_status gp_want_locked(gp_offloader *o, const gp_tag *tags, size_t n, gp_want *w)
{
    gp_status st = gp_check_tags(o, tags, n);
    if (st == GP_OK) st = gp_want_of(o, tags, n, w);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&o->lock);
    while (o->n_background || o->n_deferred) pthread_cond_wait(&o->cond, &o->lock);
    return GP_OK;
}

gp_status gp_restore_tags(gp_offloader *o, const gp_tag *tags, size_t n_tags, int accept_loss,
                          gp_offload_result *res)
{
    double t0 = gp_now();
    memset(res, 0, sizeof *res);
    gp_want w;
    gp_status st = gp_want_locked(o, tags, n_tags, &w);
    if (st != GP_OK) return st;
    st = gp_bg_failure(o); /* (a background offload's, reported here) */
    /* Then every record of the tags, each taken by this thread (one that a
     * prefetch or another restore holds is waited for: it comes back
     * restored, or offloaded again for this one to try). */
    while (st == GP_OK) {
        gp_record *r = NULL;
        int held = 0;
        for (gp_record *q = o->records; q && !r; q = q->next) {
            if (!gp_record_wanted(q, &w)) continue;
            if (q->state == GP_REC_OFFLOADED) r = q;
            else held = 1;
        }
        if (!r && !held) break;
        if (!r) {
            pthread_cond_wait(&o->cond, &o->lock);
            continue;
        }
        gp_record_move(o, r, GP_REC_OFFLOADED, GP_REC_RESTORING);
        pthread_mutex_unlock(&o->lock);
        st = gp_restore_held(o, r, &w, accept_loss, res);
        pthread_mutex_lock(&o->lock);
        if (st != GP_OK) gp_record_move(o, r, GP_REC_RESTORING, GP_REC_OFFLOADED);
    }
    if (st != GP_OK) {
        /* Reported once a prefetch (or another restore) of the tags under
         * way has finished too: nothing of them moves after the call
         * returns.  (A failure of one record left the prefetch of
         * another running: its blocks came back after the failed restore
         * had returned.) */
        char why[1024];
        snprintf(why, sizeof why, "%s", gp_last_error());
        for (int held = 1; held;) {
            held = 0;
            for (const gp_record *q = o->records; q && !held; q = q->next)
                held = q->state != GP_REC_OFFLOADED && gp_record_wanted(q, &w);
            if (held) pthread_cond_wait(&o->cond, &o->lock);
        }
        gp_error_set(st, "%s", why);
    }
    pthread_mutex_unlock(&o->lock);
    gp_want_free(&w);
    res->seconds = gp_now() - t0;
    return st;
}

typedef struct gp_prefetch {
    gp_offloader *o;
    gp_record *r;
    gp_want w; /* (its tags only: what restoring r may not displace) */
} gp_prefetch;

static gp_status gp_job_prefetch_record(void *arg)
{
    gp_prefetch *pf = arg;
    gp_offloader *o = pf->o;
    gp_record *r = pf->r;
    gp_offload_result res = {0};
    gp_status st = gp_restore_held(o, r, &pf->w, 0, &res);
    free(pf);
    pthread_mutex_lock(&o->lock);
    /* A failed one stays offloaded: a restore that wants it tries it again
     * and says why it fails, if it does (a prefetch's failure reported by
     * whatever restore came next failed one that would have worked). */
    if (st != GP_OK) gp_record_move(o, r, GP_REC_PREFETCHING, GP_REC_OFFLOADED);
    gp_bg_done(o, st, 0);
    pthread_mutex_unlock(&o->lock);
    return st;
}

/* Queue a prefetch job for each offloaded record w wants (the lock is
 * held). */
static gp_status gp_prefetch_locked(gp_offloader *o, const gp_want *w)
{
    gp_status st = GP_OK;
    for (gp_record *r = o->records; r && st == GP_OK; r = r->next) {
        /* (Not one whose offload lost bytes: a prefetch cannot accept the
         * loss, and its refusal, reported by whatever restore came next,
         * failed a restore that does accept it; the restore of its tags
         * refuses it or takes it back.) */
        if (r->state != GP_REC_OFFLOADED || r->lost || !gp_record_wanted(r, w)) continue;
        gp_prefetch *pf = malloc(sizeof *pf);
        if (!pf) {
            st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a prefetch");
            break;
        }
        *pf = (gp_prefetch){.o = o, .r = r, .w = {.tags = w->tags}};
        gp_record_move(o, r, GP_REC_OFFLOADED, GP_REC_PREFETCHING);
        if ((st = gp_workq_push(o->pq, &o->prefetches, gp_job_prefetch_record, pf)) != GP_OK) {
            gp_record_move(o, r, GP_REC_PREFETCHING, GP_REC_OFFLOADED);
            free(pf);
        }
    }
    return st;
}

typedef struct gp_deferred {
    gp_offloader *o;
    size_t n_tags;
    gp_tag tags[];
} gp_deferred;

/* A prefetch asked while background offloads were queued, run behind them
 * on their thread (one, in order: they have published their records). */
static gp_status gp_job_prefetch_deferred(void *arg)
{
    gp_deferred *d = arg;
    gp_offloader *o = d->o;
    gp_want w;
    gp_status st = gp_want_of(o, d->tags, d->n_tags, &w);
    free(d);
    pthread_mutex_lock(&o->lock);
    if (st == GP_OK) {
        st = gp_prefetch_locked(o, &w);
        gp_want_free(&w);
    }
    o->n_deferred--;
    /* (A failure is not reported, as a prefetch's is not: the records stay
     * offloaded and the restore that wants them brings them back.) */
    gp_bg_done(o, st, 0);
    pthread_mutex_unlock(&o->lock);
    return st;
}

gp_status gp_prefetch_tags(gp_offloader *o, const gp_tag *tags, size_t n_tags)
{
    gp_status st = gp_check_tags(o, tags, n_tags);
    if (st != GP_OK) return st;
    /* Behind background offloads still queued, the prefetch is queued too,
     * rather than waited for here: its caller is a gradient hook on the
     * thread that queues the backward pass, which would stop feeding the
     * device until the offload's copies had run. */
    pthread_mutex_lock(&o->lock);
    if (o->n_background) {
        gp_deferred *d = malloc(sizeof *d + n_tags * sizeof *tags);
        if (!d) {
            pthread_mutex_unlock(&o->lock);
            return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a prefetch");
        }
        *d = (gp_deferred){.o = o, .n_tags = n_tags};
        memcpy(d->tags, tags, n_tags * sizeof *tags);
        o->n_deferred++;
        if ((st = gp_workq_push(o->pq, &o->prefetches, gp_job_prefetch_deferred, d)) != GP_OK) {
            o->n_deferred--;
            free(d);
        }
        pthread_mutex_unlock(&o->lock);
        return st;
    }
    pthread_mutex_unlock(&o->lock);
    gp_want w;
    if ((st = gp_want_locked(o, tags, n_tags, &w)) != GP_OK) return st;
    st = gp_prefetch_locked(o, &w);
    pthread_mutex_unlock(&o->lock);
    gp_want_free(&w);
    return st;
}

typedef struct gp_bg_offload {
    gp_offloader *o;
    gp_offload_opts opts;
    uint64_t fence[GP_FENCE_MAX]; /* (taken by the caller: what the memory's users had queued) */
    size_t n_tags;
    gp_tag tags[];
} gp_bg_offload;

static gp_status gp_job_offload(void *arg)
{
    gp_bg_offload *job = arg;
    gp_offloader *o = job->o;
    gp_offload_result res;
    gp_status st = gp_offload_tags(o, job->tags, job->n_tags, &job->opts, &res);
    for (size_t i = 0; i < job->opts.n_fence; i++) o->be->event_release(o->be, job->fence[i]);
    free(job);
    pthread_mutex_lock(&o->lock);
    o->n_background--;
    gp_bg_done(o, st, 1);
    pthread_mutex_unlock(&o->lock);
    gp_pool_releasing(o->pool, -1);
    return st;
}

gp_status gp_offload_tags_background(gp_offloader *o, const gp_tag *tags, size_t n_tags,
                                     const gp_offload_opts *opts)
{
    gp_status st = gp_check_offload(o, tags, n_tags, opts);
    if (st != GP_OK) return st;
    gp_bg_offload *job = malloc(sizeof *job + n_tags * sizeof *tags);
    if (!job) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a background offload");
    *job = (gp_bg_offload){.o = o, .opts = *opts, .n_tags = n_tags};
    memcpy(job->tags, tags, n_tags * sizeof *tags);
    /* The fence now, in the caller's thread: the job waits for what the
     * memory's users had queued by the time the offload was asked (the
     * step), not for what the caller queues meanwhile (the next forward);
     * none: the job takes its own, as any offload. */
    if (gp_pool_fence(o->pool, job->fence, GP_FENCE_MAX, &job->opts.n_fence) == GP_OK) job->opts.fence = job->fence;
    else gp_error_clear();
    gp_pool_releasing(o->pool, 1);
    pthread_mutex_lock(&o->lock);
    o->n_background++;
    if ((st = gp_workq_push(o->pq, &o->prefetches, gp_job_offload, job)) != GP_OK) {
        o->n_background--;
        for (size_t i = 0; i < job->opts.n_fence; i++) o->be->event_release(o->be, job->fence[i]);
        free(job);
    }
    pthread_mutex_unlock(&o->lock);
    if (st != GP_OK) gp_pool_releasing(o->pool, -1);
    return st;
}

/* Host room for what may be offloaded next: the live bytes on the device
 * of every offloadable tag (their raw size: compressed they take less),
 * or the reserve asked for at start if larger, queued to be pinned in the
 * background, within the host limit. */
static void gp_prepare_host(gp_offloader *o)
{
    uint8_t reg[GP_MAX_TAGS];
    pthread_mutex_lock(&o->lock);
    for (unsigned t = 0; t < GP_MAX_TAGS; t++) reg[t] = o->reg[t].prio >= 0;
    uint64_t want = o->host_reserve;
    pthread_mutex_unlock(&o->lock);
    uint64_t live = 0;
    unsigned nt = gp_tag_count();
    for (unsigned t = 0; t < nt; t++) {
        if (!reg[t]) continue;
        gp_tag_stats ts;
        gp_pool_tag_stats(o->pool, (gp_tag)t, &ts);
        live += ts.allocated > ts.offloaded ? ts.allocated - ts.offloaded : 0;
    }
    gp_pinned_prepare(o->hs, live > want ? live : want, gp_clean_bytes(o));
}

gp_status gp_offload_register(gp_offloader *o, gp_tag tag, int priority, unsigned elem_size)
{
    if (tag >= gp_tag_count() || priority < -1 || priority > GP_PRIO_MAX)
        return gp_error_set(GP_ERR_INVALID, "gpupool: offloadable tag id %u with priority %d: the tag must be "
                            "interned and the priority 0..%d (or -1 to unregister)", (unsigned)tag, priority,
                            GP_PRIO_MAX);
    pthread_mutex_lock(&o->lock);
    o->reg[tag].prio = priority;
    o->reg[tag].elem_size = elem_size;
    o->reg[tag].last_use = ++o->clock;
    pthread_mutex_unlock(&o->lock);
    /* (No lock held: it asks the pool, and the store only queues.) */
    if (priority >= 0) gp_prepare_host(o);
    return GP_OK;
}

void gp_offload_reserve_host(gp_offloader *o, uint64_t bytes)
{
    pthread_mutex_lock(&o->lock);
    o->host_reserve = bytes;
    pthread_mutex_unlock(&o->lock);
    gp_prepare_host(o);
}

gp_status gp_offload_use(gp_offloader *o, gp_tag tag, int busy)
{
    if (tag >= gp_tag_count())
        return gp_error_set(GP_ERR_INVALID, "gpupool: tag id %u was never interned", (unsigned)tag);
    pthread_mutex_lock(&o->lock);
    gp_reg *g = &o->reg[tag];
    g->last_use = ++o->clock;
    if (busy && !g->busy) {
        g->begun[2] = g->begun[1];
        g->begun[1] = g->begun[0];
        g->begun[0] = g->last_use;
    }
    g->busy = busy != 0;
    /* A reclaim that chose it before it became busy finishes first (the
     * caller's restore then finds it offloaded, and brings it back). */
    while (busy && o->reclaiming == (int)tag) pthread_cond_wait(&o->cond, &o->lock);
    pthread_mutex_unlock(&o->lock);
    return GP_OK;
}

void gp_offload_stats_get(gp_offloader *o, gp_offload_stats *out)
{
    gp_pinned_stats hs;
    gp_pinned_stats_get(o->hs, &hs);
    pthread_mutex_lock(&o->lock);
    *out = o->st;
    pthread_mutex_unlock(&o->lock);
    out->host_slabs = hs.slabs;
    out->host_pinning = hs.pinning;
    out->host_limit = hs.limit;
    out->n_pin = hs.n_pin;
    out->n_pin_late = hs.n_pin_late;
}

int gp_offload_is_offloaded(gp_offloader *o, gp_tag tag)
{
    /* The pool knows where each block is now, whatever tag it had when it
     * went (a block retagged while offloaded). */
    gp_tag_stats ts;
    gp_pool_tag_stats(o->pool, tag, &ts);
    return ts.offloaded != 0;
}

gp_status gp_offload_corrupt_for_test(gp_offloader *o, gp_tag tag)
{
    gp_status st = gp_error_set(GP_ERR_INVALID, "gpupool: tag id %u has no stored bytes", (unsigned)tag);
    pthread_mutex_lock(&o->lock);
    gp_want w = {{{0}}};
    gp_tagset_add(&w.tags, tag);
    for (gp_record *r = o->records; r && st != GP_OK; r = r->next) {
        if (!gp_record_wanted(r, &w) || !r->n_pieces || !r->pieces[0].host.ptr) continue;
        const gp_piece *p = &r->pieces[0]; /* (its first extent: a split one holds less than `stored`) */
        ((unsigned char *)p->host.ptr)[(p->stored < p->host.size ? p->stored : p->host.size) / 2] ^= 0x40;
        gp_error_clear();
        st = GP_OK;
    }
    pthread_mutex_unlock(&o->lock);
    return st;
}
