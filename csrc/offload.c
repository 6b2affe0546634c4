/*
 * offload.c -- the data path of offload (offload.h): plans from the pool
 * (gp_pool_offload_*), bytes through pinned host slabs (host_store.c), the
 * VMM calls on worker threads (workq.c), checksums on the device
 * (checksum.h, the backend's checksum).
 *
 * Offload: the pool marks the tags' blocks and names the chunk runs to
 * release; the device is synchronised (the streams that used the memory,
 * record_stream events included, have finished); for each chunk, each live
 * piece (at most GP_PIECE_MAX) is checksummed and copied out on one of two
 * copy streams, alternating by chunk, and an event follows.  A worker waits
 * for that event and unmaps the chunk -- device memory is given back while
 * later chunks are still being copied.
 *
 * Restore: the pool checks the runs are still wholly offloaded; workers map
 * each chunk ahead of the copies; each chunk's pieces are copied back as
 * soon as it is mapped and checksummed again on the device; only when every
 * sum matches does the pool make the blocks live again.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

#include "checksum.h"
#include "host_store.h"
#include "offload.h"
#include "workq.h"

/* Largest copy: big enough that a copy's fixed cost (a few us) is lost in
 * its transfer time at PCIe speed, small enough to pipeline. */
#define GP_PIECE_MAX (16ull << 20)
/* Slab of pinned host memory: a few per GiB (pinning cost is per byte),
 * small enough that the store holds little more than it must. */
#define GP_HOST_SLAB (32ull << 20)
/* Checksums one offload or restore may compute (a device array of this
 * many words, taken from the pool once): 2 TiB in GP_PIECE_MAX pieces,
 * 256 GiB of 2 MiB chunks. */
#define GP_SUMS_MAX (128u << 10)
#define GP_RECORD_TAGS 16

typedef struct gp_piece {
    uintptr_t addr;     /* device bytes [addr, addr+size)              */
    uint64_t size;
    gp_extent host;     /* where they are (ptr NULL: contents dropped) */
    uint64_t stored;    /* bytes stored in host                        */
    uint64_t sum;       /* checksum of its device bytes (checksum.h)   */
    gp_tag tag;
    int copied;         /* its copy out was queued                     */
} gp_piece;

/* One offload: what it released and where its bytes are. */
typedef struct gp_record {
    struct gp_record *next;
    gp_tag tags[GP_RECORD_TAGS];
    unsigned n_tags;
    gp_offload_run *runs;
    size_t n_runs;
    gp_piece *pieces;
    size_t n_pieces;
    uint64_t offloaded, copied, host_bytes, released;
    int priority;       /* the highest of its blocks': what restoring may displace */
    int codec;
    int prefetching;    /* a prefetch is restoring it                 */
} gp_record;

typedef struct gp_reg {
    int prio;           /* -1: not offloadable under pressure         */
    int busy;
    uint64_t last_use;
} gp_reg;

struct gp_offloader {
    gp_pool *pool;
    gp_backend *be;
    pthread_mutex_t op;    /* one offload or restore at a time          */
    pthread_mutex_t lock;  /* records, registry, figures                */
    pthread_cond_t cond;   /* a prefetch finished                        */
    gp_workq *q;           /* unmaps, maps, checksums                   */
    gp_workq *pq;          /* prefetches (one thread: they take `op`)   */
    gp_host_store *hs;
    gp_stream streams[2];
    int n_streams;
    gp_record *records;
    gp_reg reg[GP_MAX_TAGS];
    uint64_t clock;
    gp_batch prefetches;   /* (waited for through the records' flags) */
    uint64_t *sums_dev;    /* GP_SUMS_MAX checksums, device memory       */
    uint64_t *sums_host;   /* where they are read back                   */
    gp_status prefetch_status; /* the last prefetch's failure, reported by the next restore */
    char prefetch_error[512];
    gp_offload_stats st;
};

static double gp_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --------------------------------------------------------------- records */

static int gp_record_has(const gp_record *r, const gp_tag *tags, size_t n)
{
    for (unsigned i = 0; i < r->n_tags; i++)
        for (size_t j = 0; j < n; j++)
            if (r->tags[i] == tags[j]) return 1;
    return 0;
}

static void gp_record_free(gp_offloader *o, gp_record *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_pieces; i++) gp_host_store_free(o->hs, &r->pieces[i].host);
    free(r->runs);
    free(r->pieces);
    free(r);
}

/* The chunks of a record's runs with the pieces in each (pieces never
 * cross a chunk boundary and are in address order). */
typedef struct gp_chunk {
    uintptr_t addr;
    uint64_t size;
    size_t p0, np;
    uint64_t event;     /* offload: completes when its copies have     */
    gp_batch done;      /* restore: mapped and verified                */
    gp_offloader *o;
    gp_offload_plan *plan;
    gp_record *rec;
    int mapped;         /* restore: mapped by its job                  */
    int unmapped;       /* offload: given back by its job              */
} gp_chunk;

static gp_chunk *gp_chunks_of(const gp_record *r, size_t *n_out)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_runs; i++) n += r->runs[i].size / r->runs[i].chunk;
    gp_chunk *c = calloc(n ? n : 1, sizeof *c);
    if (!c) return NULL;
    size_t k = 0, p = 0;
    for (size_t i = 0; i < r->n_runs; i++) {
        const gp_offload_run *run = &r->runs[i];
        for (uintptr_t x = run->addr; x < run->addr + run->size; x += run->chunk, k++) {
            c[k].addr = x;
            c[k].size = run->chunk;
            while (p < r->n_pieces && r->pieces[p].addr < x) p++;
            c[k].p0 = p;
            while (p < r->n_pieces && r->pieces[p].addr < x + run->chunk) p++;
            c[k].np = p - c[k].p0;
        }
    }
    *n_out = n;
    return c;
}

/* Pieces of the plan's ranges: cut at chunk boundaries and GP_PIECE_MAX. */
static gp_status gp_pieces_of(const gp_offload_plan *pl, gp_record *r)
{
    size_t n = 0, ri = 0;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        ri = 0;
        for (size_t i = 0; i < pl->n_ranges; i++) {
            const gp_offload_range *g = &pl->ranges[i];
            while (g->addr >= pl->runs[ri].addr + pl->runs[ri].size) ri++;
            uint64_t chunk = pl->runs[ri].chunk;
            for (uintptr_t x = g->addr; x < g->addr + g->size;) {
                uintptr_t cend = pl->runs[ri].addr + (x - pl->runs[ri].addr) / chunk * chunk + chunk;
                uintptr_t e = g->addr + g->size < cend ? g->addr + g->size : cend;
                if (e - x > GP_PIECE_MAX) e = x + GP_PIECE_MAX;
                if (pass) r->pieces[n] = (gp_piece){.addr = x, .size = e - x, .tag = g->tag};
                n++;
                x = e;
            }
        }
        if (!pass && n && !(r->pieces = calloc(n, sizeof *r->pieces)))
            return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for an offload record");
    }
    r->n_pieces = n;
    return GP_OK;
}

/* ---------------------------------------------------------------- jobs */

/* Offload: the chunk's checksums and copies have been queued; once they
 * ran, give the chunk back. */
static gp_status gp_job_unmap(void *arg)
{
    gp_chunk *c = arg;
    gp_backend *be = c->o->be;
    gp_status st = GP_OK;
    if (c->event) {
        st = be->event_wait(be, c->event);
        be->event_release(be, c->event);
        c->event = 0;
        if (st != GP_OK) return st;
    }
    if ((st = gp_pool_plan_unmap(c->o->pool, c->plan, c->addr, c->size)) != GP_OK) return st;
    c->unmapped = 1;
    return GP_OK;
}

static const char *gp_tags_text(const gp_record *r, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < r->n_tags && at < len; i++) {
        const char *name = gp_tag_name(r->tags[i]);
        int k = snprintf(buf + at, len - at, "%s'%s'", i ? ", " : "", name ? name : "?");
        if (k > 0) at += (size_t)k;
    }
    return buf;
}

/* Restore: map the chunk (ahead of the copies into it). */
static gp_status gp_job_map(void *arg)
{
    gp_chunk *c = arg;
    /* Any cached (free) memory may go to make room: what comes back was
     * live when it was displaced, and a cache is nobody's data. */
    gp_status st = gp_pool_plan_map(c->o->pool, c->plan, c->addr, c->size, GP_PRIO_MAX);
    if (st == GP_OK) c->mapped = 1;
    return st;
}

/* ----------------------------------------------------------- the streams */

static gp_status gp_streams(gp_offloader *o)
{
    while (o->n_streams < 2) {
        gp_status st = o->be->stream_create(o->be, &o->streams[o->n_streams]);
        if (st != GP_OK) return st;
        o->n_streams++;
    }
    return GP_OK;
}

/* Block until everything queued on both copy streams has run. */
static gp_status gp_streams_drain(gp_offloader *o)
{
    gp_status st = GP_OK;
    for (int i = 0; i < o->n_streams; i++) {
        uint64_t ev = 0;
        gp_status s = o->be->event_record(o->be, o->streams[i], &ev);
        if (s == GP_OK) {
            s = o->be->event_wait(o->be, ev);
            o->be->event_release(o->be, ev);
        }
        if (s != GP_OK && st == GP_OK) st = s;
    }
    return st;
}

/* Read the first n checksums back (the work that wrote them has run). */
static gp_status gp_sums_read(gp_offloader *o, size_t n)
{
    if (!n) return GP_OK;
    gp_status st = o->be->copy(o->be, o->sums_host, o->sums_dev, n * sizeof *o->sums_dev, GP_COPY_D2H, o->streams[0]);
    return st == GP_OK ? gp_streams_drain(o) : st;
}

/* -------------------------------------------------------------- offload */

static gp_status gp_reclaim_locked(gp_offloader *o, uint64_t needed, int below, const gp_record *keep,
                                   uint64_t *released);

/* Undo a failed offload: map back the chunks that were given up and copy
 * their pieces back (their copies had run before each unmap). */
static gp_status gp_undo_offload(gp_offloader *o, gp_offload_plan *pl, gp_record *r, gp_chunk *c, size_t n)
{
    gp_status st = GP_OK;
    for (size_t k = 0; k < n && st == GP_OK; k++) {
        if (!c[k].unmapped) continue;
        st = gp_pool_plan_map(o->pool, pl, c[k].addr, c[k].size, GP_PRIO_MAX);
        for (size_t i = 0; i < c[k].np && st == GP_OK; i++) {
            gp_piece *p = &r->pieces[c[k].p0 + i];
            if (p->host.ptr) st = o->be->copy(o->be, (void *)p->addr, p->host.ptr, p->size, GP_COPY_H2D, o->streams[0]);
        }
    }
    if (st == GP_OK) st = gp_streams_drain(o);
    return st;
}

/* Add record r to the offloaded ones. */
static void gp_record_keep(gp_offloader *o, gp_record *r)
{
    for (size_t i = 0; i < r->n_pieces; i++) {
        r->copied += r->pieces[i].host.ptr ? r->pieces[i].size : 0;
        r->host_bytes += r->pieces[i].host.size;
    }
    pthread_mutex_lock(&o->lock);
    r->next = o->records;
    o->records = r;
    o->st.n_offload++;
    o->st.bytes_out += r->copied;
    o->st.host_bytes += r->host_bytes;
    for (size_t i = 0; i < r->n_pieces; i++) o->st.tag_host_bytes[r->pieces[i].tag] += r->pieces[i].host.size;
    pthread_mutex_unlock(&o->lock);
}

static gp_record *gp_record_new(const gp_tag *tags, size_t n_tags, const gp_offload_plan *pl)
{
    gp_record *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    memcpy(r->tags, tags, n_tags * sizeof *tags);
    r->n_tags = (unsigned)n_tags;
    r->codec = GP_CODEC_RAW;
    r->offloaded = pl->offloaded;
    r->released = pl->released;
    for (size_t i = 0; i < pl->n_ranges; i++)
        if (pl->ranges[i].priority > r->priority) r->priority = pl->ranges[i].priority;
    if (!(r->runs = malloc(pl->n_runs * sizeof *r->runs)) || gp_pieces_of(pl, r) != GP_OK) {
        free(r->runs);
        free(r->pieces);
        free(r);
        return NULL;
    }
    memcpy(r->runs, pl->runs, pl->n_runs * sizeof *r->runs);
    r->n_runs = pl->n_runs;
    return r;
}

static gp_status gp_offload_locked(gp_offloader *o, const gp_tag *tags, size_t n_tags, const gp_offload_opts *opts,
                                   gp_offload_result *res)
{
    double t0 = gp_now();
    memset(res, 0, sizeof *res);
    res->codec = GP_CODEC_RAW;
    if (n_tags > GP_RECORD_TAGS)
        return gp_error_set(GP_ERR_INVALID, "gpupool: offload of %zu tags at once (at most %d)", n_tags,
                            GP_RECORD_TAGS);
    gp_status st = gp_streams(o);
    if (st != GP_OK) return st;
    gp_offload_plan *pl;
    if ((st = gp_pool_offload_begin(o->pool, tags, n_tags, &pl)) != GP_OK) return st;
    res->kept = pl->kept;
    if (!pl->n_runs) {
        res->seconds = gp_now() - t0;
        return gp_pool_plan_end(o->pool, pl, 1);
    }
    /* Before anything moves: the record, and host room for every piece, so
     * that the copies cannot fail for want of host memory. */
    size_t n = 0;
    gp_record *r = gp_record_new(tags, n_tags, pl);
    gp_chunk *c = r ? gp_chunks_of(r, &n) : NULL;
    if (!c) st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for an offload record");
    else if (r->n_pieces > GP_SUMS_MAX)
        st = gp_error_set(GP_ERR_INVALID, "gpupool: offload of %zu pieces at once (at most %u: offload fewer "
                          "tags at a time)", r->n_pieces, GP_SUMS_MAX);
    if (st == GP_OK && opts->keep && (st = gp_host_store_reserve(o->hs, pl->bytes + 16 * r->n_pieces)) == GP_OK) {
        for (size_t i = 0; i < r->n_pieces && st == GP_OK; i++) {
            st = gp_host_store_alloc(o->hs, r->pieces[i].size, &r->pieces[i].host);
            r->pieces[i].stored = r->pieces[i].size;
        }
        gp_host_store_settle(o->hs, UINT64_MAX);
    }
    /* The streams that used the memory (record_stream ones too) finish. */
    if (st == GP_OK) st = gp_pool_synchronize(o->pool);
    if (st != GP_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", gp_last_error());
        if (gp_pool_plan_end(o->pool, pl, 1) != GP_OK) gp_error_clear();
        gp_record_free(o, r);
        free(c);
        return gp_error_set(st, "%s", why);
    }
    /* Checksums and copies out, chunk by chunk on alternating streams; a
     * worker gives each chunk back behind them. */
    gp_batch unmaps;
    gp_batch_init(&unmaps);
    for (size_t k = 0; k < n && st == GP_OK; k++) {
        gp_stream s = o->streams[k & 1];
        c[k].o = o;
        c[k].plan = pl;
        c[k].rec = r;
        for (size_t i = 0; i < c[k].np && st == GP_OK && opts->keep; i++) {
            size_t j = c[k].p0 + i;
            gp_piece *p = &r->pieces[j];
            st = o->be->checksum(o->be, (const void *)p->addr, p->size, p->addr, &o->sums_dev[j], s);
            if (st == GP_OK &&
                (st = o->be->copy(o->be, p->host.ptr, (const void *)p->addr, p->size, GP_COPY_D2H, s)) == GP_OK)
                p->copied = 1;
        }
        if (st == GP_OK && c[k].np && opts->keep) st = o->be->event_record(o->be, s, &c[k].event);
        if (st == GP_OK) st = gp_workq_push(o->q, &unmaps, gp_job_unmap, &c[k]);
    }
    gp_status jst = gp_batch_wait(&unmaps);
    gp_batch_destroy(&unmaps);
    if (st == GP_OK) st = jst;
    /* The checksums ran before the copies, which have run: read them. */
    if (st == GP_OK && opts->keep) st = gp_sums_read(o, r->n_pieces);
    for (size_t i = 0; st == GP_OK && i < r->n_pieces; i++) r->pieces[i].sum = o->sums_host[i];
    if (st == GP_OK && (st = gp_pool_plan_end(o->pool, pl, 0)) == GP_OK) {
        gp_record_keep(o, r);
        *res = (gp_offload_result){.bytes = r->offloaded, .copied = r->copied, .host_bytes = r->host_bytes,
                                   .released = r->released, .kept = res->kept, .codec = r->codec,
                                   .seconds = gp_now() - t0};
        free(c);
        return GP_OK;
    }
    /* Failed half way: what was given up is on the host; bring it back. */
    char why[1024];
    snprintf(why, sizeof why, "%s", gp_last_error());
    for (size_t k = 0; k < n; k++)
        if (c[k].event) o->be->event_release(o->be, c[k].event);
    gp_error_clear();
    gp_status dst = gp_streams_drain(o);
    if (dst == GP_OK && gp_undo_offload(o, pl, r, c, n) == GP_OK && gp_pool_plan_end(o->pool, pl, 1) == GP_OK) {
        gp_record_free(o, r);
        free(c);
        return gp_error_set(st, "%s (the offload was undone: the memory is on the device as before)", why);
    }
    /* The device refuses even that: give the rest up too and keep what the
     * host has, so that the pool stays whole and a restore brings back
     * every address; pieces whose copy never ran are lost. */
    uint64_t lost = 0;
    for (size_t k = 0; k < n; k++) gp_pool_plan_unmap(o->pool, pl, c[k].addr, c[k].size);
    for (size_t i = 0; i < r->n_pieces; i++)
        if (!r->pieces[i].copied || dst != GP_OK) {
            lost += r->pieces[i].size;
            gp_host_store_free(o->hs, &r->pieces[i].host);
        }
    char tags_txt[256], undo_why[512];
    gp_tags_text(r, tags_txt, sizeof tags_txt);
    snprintf(undo_why, sizeof undo_why, "%s", gp_last_error());
    gp_status est = gp_pool_plan_end(o->pool, pl, 0);
    free(c);
    if (est == GP_OK) gp_record_keep(o, r);
    else gp_record_free(o, r);
    return gp_error_set(st, "%s; undoing the offload of tag %s failed too (%s): it stays offloaded and %" PRIu64
                        " bytes of its contents are lost", why, tags_txt, undo_why, lost);
}

/* -------------------------------------------------------------- restore */

static gp_status gp_restore_record_locked(gp_offloader *o, gp_record *r, gp_offload_result *res)
{
    gp_status st = gp_streams(o);
    if (st != GP_OK) return st;
    gp_offload_plan *pl;
    if ((st = gp_pool_restore_begin(o->pool, r->runs, r->n_runs, &pl)) != GP_OK) return st;
    size_t n = 0;
    gp_chunk *c = gp_chunks_of(r, &n);
    if (!c) {
        gp_pool_plan_end(o->pool, pl, 0);
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a restore");
    }
    size_t queued = 0;
    for (; queued < n; queued++) {
        gp_chunk *k = &c[queued];
        k->o = o;
        k->plan = pl;
        k->rec = r;
        gp_batch_init(&k->done);
        if ((st = gp_workq_push(o->q, &k->done, gp_job_map, k)) != GP_OK) {
            gp_batch_destroy(&k->done);
            break;
        }
    }
    /* Copy each chunk back as soon as it is mapped, and checksum what came
     * back.  A chunk the device had no room for: make room (lower-priority
     * idle tags), then map it here. */
    for (size_t k = 0; k < queued && st == GP_OK; k++) {
        if ((st = gp_batch_wait(&c[k].done)) != GP_OK && !c[k].mapped && (st == GP_ERR_OOM || st == GP_ERR_LIMIT)) {
            uint64_t got = 0;
            gp_status rst = gp_reclaim_locked(o, c[k].size, r->priority, r, &got);
            if (rst == GP_OK && got) {
                gp_error_clear();
                st = gp_job_map(&c[k]);
            }
        }
        gp_stream s = o->streams[k & 1];
        for (size_t i = 0; i < c[k].np && st == GP_OK; i++) {
            size_t j = c[k].p0 + i;
            gp_piece *p = &r->pieces[j];
            if (!p->host.ptr) continue;
            st = o->be->copy(o->be, (void *)p->addr, p->host.ptr, p->size, GP_COPY_H2D, s);
            if (st == GP_OK) st = o->be->checksum(o->be, (const void *)p->addr, p->size, p->addr, &o->sums_dev[j], s);
        }
    }
    /* The blocks stay OFFLOADED (untouchable) until every piece came back
     * whole; a mismatch gives the chunks back below. */
    for (size_t k = 0; k < queued; k++) gp_batch_wait(&c[k].done);
    if (st == GP_OK) st = gp_streams_drain(o);
    if (st == GP_OK) st = gp_sums_read(o, r->n_pieces);
    for (size_t i = 0; st == GP_OK && i < r->n_pieces; i++) {
        const gp_piece *p = &r->pieces[i];
        if (p->host.ptr && o->sums_host[i] != p->sum) {
            char tags[256];
            st = gp_error_set(GP_ERR_BACKEND, "gpupool: the host copy of tag %s is corrupt: checksum mismatch in "
                              "the %" PRIu64 " bytes of 0x%" PRIxPTR, gp_tags_text(r, tags, sizeof tags), p->size,
                              p->addr);
        }
    }
    char why[1024] = "";
    if (st != GP_OK) snprintf(why, sizeof why, "%s", gp_last_error());
    for (size_t k = 0; k < queued; k++) gp_batch_destroy(&c[k].done);
    gp_error_clear();
    gp_status dst = gp_streams_drain(o);
    if (st == GP_OK) st = dst;
    if (st != GP_OK) {
        if (!why[0]) snprintf(why, sizeof why, "%s", gp_last_error());
        /* Give back what was mapped: the tags stay offloaded, their bytes
         * on the host. */
        for (size_t k = 0; k < n; k++) gp_pool_plan_unmap(o->pool, pl, c[k].addr, c[k].size);
        gp_status est = gp_pool_plan_end(o->pool, pl, 0);
        free(c);
        if (est != GP_OK) return est;
        char tags[256];
        return gp_error_set(st, "gpupool: restoring tag %s failed, the memory stays offloaded: %s",
                            gp_tags_text(r, tags, sizeof tags), why);
    }
    uint64_t offloaded = pl->offloaded;
    if ((st = gp_pool_plan_end(o->pool, pl, 1)) != GP_OK) {
        free(c);
        return st;
    }
    free(c);
    pthread_mutex_lock(&o->lock);
    for (gp_record **pp = &o->records; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    o->st.n_restore++;
    o->st.bytes_in += r->copied;
    o->st.host_bytes -= r->host_bytes;
    for (size_t i = 0; i < r->n_pieces; i++) o->st.tag_host_bytes[r->pieces[i].tag] -= r->pieces[i].host.size;
    pthread_cond_broadcast(&o->cond);
    pthread_mutex_unlock(&o->lock);
    res->bytes += offloaded;
    res->copied += r->copied;
    res->host_bytes += r->host_bytes;
    res->released += r->released;
    res->codec = r->codec;
    gp_record_free(o, r);
    return GP_OK;
}

/* The next record holding one of `tags` that no prefetch has (the lock is
 * held); *busy says whether one is being prefetched. */
static gp_record *gp_find(gp_offloader *o, const gp_tag *tags, size_t n, int *busy)
{
    *busy = 0;
    for (gp_record *r = o->records; r; r = r->next) {
        if (!gp_record_has(r, tags, n)) continue;
        if (r->prefetching) *busy = 1;
        else return r;
    }
    return NULL;
}

static gp_status gp_restore_locked(gp_offloader *o, const gp_tag *tags, size_t n, gp_offload_result *res)
{
    gp_status st = GP_OK;
    for (;;) {
        int busy;
        pthread_mutex_lock(&o->lock);
        gp_record *r = gp_find(o, tags, n, &busy);
        pthread_mutex_unlock(&o->lock);
        if (!r) break;
        if ((st = gp_restore_record_locked(o, r, res)) != GP_OK) break;
    }
    return st;
}

/* ------------------------------------------------------------- pressure */

/* Offload idle registered tags of priority below `below` (not those of
 * record `keep`), the lowest priority first, then the least recently used,
 * until `needed` bytes were released.  `op` is held. */
static gp_status gp_reclaim_locked(gp_offloader *o, uint64_t needed, int below, const gp_record *keep,
                                   uint64_t *released)
{
    *released = 0;
    uint8_t tried[GP_MAX_TAGS] = {0};
    while (*released < needed) {
        int best = -1;
        pthread_mutex_lock(&o->lock);
        unsigned nt = gp_tag_count();
        for (unsigned t = 0; t < nt; t++) {
            const gp_reg *g = &o->reg[t];
            gp_tag tt = (gp_tag)t;
            if (g->prio < 0 || g->prio >= below || g->busy || tried[t] || (keep && gp_record_has(keep, &tt, 1)))
                continue;
            if (best < 0 || g->prio < o->reg[best].prio ||
                (g->prio == o->reg[best].prio && g->last_use < o->reg[best].last_use))
                best = (int)t;
        }
        pthread_mutex_unlock(&o->lock);
        if (best < 0) break;
        tried[best] = 1;
        gp_tag_stats ts;
        gp_pool_tag_stats(o->pool, (gp_tag)best, &ts);
        if (!ts.allocated) continue;
        gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
        gp_offload_result res;
        gp_tag t = (gp_tag)best;
        if (gp_offload_locked(o, &t, 1, &opts, &res) != GP_OK) {
            gp_error_clear(); /* (this one could not go: try the next) */
            continue;
        }
        *released += res.released;
        pthread_mutex_lock(&o->lock);
        o->st.n_pressure++;
        pthread_mutex_unlock(&o->lock);
    }
    return GP_OK;
}

static uint64_t gp_pressure_cb(void *arg, gp_pool *pool, uint64_t needed, int priority)
{
    (void)pool;
    gp_offloader *o = arg;
    uint64_t got = 0;
    pthread_mutex_lock(&o->op);
    gp_reclaim_locked(o, needed, priority, NULL, &got);
    pthread_mutex_unlock(&o->op);
    return got;
}

/* ---------------------------------------------------------------- API */

gp_status gp_offloader_create(gp_pool *pool, uint64_t host_limit, unsigned threads, gp_offloader **out)
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
    gp_batch_init(&o->prefetches);
    gp_status st = gp_host_store_create(o->be, host_limit, GP_HOST_SLAB, &o->hs);
    gp_tag own;
    if (st == GP_OK) st = gp_tag_intern("gpupool", &own);
    /* The checksums' device array comes from the pool, once, before any
     * pressure could call on the offloader. */
    if (st == GP_OK) o->sums_dev = gp_alloc(pool, GP_SUMS_MAX * sizeof(uint64_t), NULL, own, GP_PRIO_CRITICAL, &st);
    if (st == GP_OK && !(o->sums_host = malloc(GP_SUMS_MAX * sizeof(uint64_t))))
        st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the offloader");
    if (st == GP_OK) st = gp_workq_create(threads, &o->q);
    if (st == GP_OK) st = gp_workq_create(1, &o->pq);
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
    while (o->records) {
        gp_record *r = o->records;
        o->records = r->next;
        gp_record_free(o, r);
    }
    for (int i = 0; i < o->n_streams; i++) o->be->stream_destroy(o->be, o->streams[i]);
    if (o->sums_dev) gp_free(o->pool, o->sums_dev);
    free(o->sums_host);
    gp_host_store_destroy(o->hs);
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

gp_status gp_offload_tags(gp_offloader *o, const gp_tag *tags, size_t n_tags, const gp_offload_opts *opts,
                          gp_offload_result *res)
{
    gp_status st = gp_check_tags(o, tags, n_tags);
    if (st != GP_OK) return st;
    if (opts->codec != GP_CODEC_RAW)
        return gp_error_set(GP_ERR_INVALID, "gpupool: codec %d is not available", opts->codec);
    pthread_mutex_lock(&o->op);
    st = gp_offload_locked(o, tags, n_tags, opts, res);
    pthread_mutex_unlock(&o->op);
    if (st == GP_OK) gp_host_store_grow_ahead(o->hs);
    return st;
}

/* The failure of a prefetch, if one finished with one since it was last
 * reported (the lock is held). */
static gp_status gp_prefetch_failure(gp_offloader *o)
{
    gp_status st = o->prefetch_status;
    if (st != GP_OK) gp_error_set(st, "%s", o->prefetch_error);
    o->prefetch_status = GP_OK;
    return st;
}

gp_status gp_restore_tags(gp_offloader *o, const gp_tag *tags, size_t n_tags, gp_offload_result *res)
{
    double t0 = gp_now();
    memset(res, 0, sizeof *res);
    gp_status st = gp_check_tags(o, tags, n_tags);
    if (st != GP_OK) return st;
    /* A prefetch of them first finishes. */
    pthread_mutex_lock(&o->lock);
    int busy;
    while (gp_find(o, tags, n_tags, &busy), busy) pthread_cond_wait(&o->cond, &o->lock);
    st = gp_prefetch_failure(o);
    pthread_mutex_unlock(&o->lock);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&o->op);
    st = gp_restore_locked(o, tags, n_tags, res);
    pthread_mutex_unlock(&o->op);
    res->seconds = gp_now() - t0;
    return st;
}

typedef struct gp_prefetch {
    gp_offloader *o;
    gp_record *r;
} gp_prefetch;

static gp_status gp_job_prefetch_record(void *arg)
{
    gp_prefetch *pf = arg;
    gp_offloader *o = pf->o;
    gp_record *r = pf->r;
    free(pf);
    gp_offload_result res = {0};
    pthread_mutex_lock(&o->op);
    gp_status st = gp_restore_record_locked(o, r, &res);
    pthread_mutex_unlock(&o->op);
    pthread_mutex_lock(&o->lock);
    if (st != GP_OK) {
        /* The record stays (offloaded); the next restore reports why. */
        r->prefetching = 0;
        o->prefetch_status = st;
        snprintf(o->prefetch_error, sizeof o->prefetch_error, "%s", gp_last_error());
    }
    pthread_cond_broadcast(&o->cond);
    pthread_mutex_unlock(&o->lock);
    return st;
}

gp_status gp_prefetch_tags(gp_offloader *o, const gp_tag *tags, size_t n_tags)
{
    gp_status st = gp_check_tags(o, tags, n_tags);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&o->lock);
    for (gp_record *r = o->records; r && st == GP_OK; r = r->next) {
        if (r->prefetching || !gp_record_has(r, tags, n_tags)) continue;
        gp_prefetch *pf = malloc(sizeof *pf);
        if (!pf) {
            st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a prefetch");
            break;
        }
        *pf = (gp_prefetch){o, r};
        r->prefetching = 1;
        if ((st = gp_workq_push(o->pq, &o->prefetches, gp_job_prefetch_record, pf)) != GP_OK) {
            r->prefetching = 0;
            free(pf);
        }
    }
    pthread_mutex_unlock(&o->lock);
    return st;
}

gp_status gp_offload_register(gp_offloader *o, gp_tag tag, int priority)
{
    if (tag >= gp_tag_count() || priority < -1 || priority > GP_PRIO_MAX)
        return gp_error_set(GP_ERR_INVALID, "gpupool: offloadable tag id %u with priority %d: the tag must be "
                            "interned and the priority 0..%d (or -1 to unregister)", (unsigned)tag, priority,
                            GP_PRIO_MAX);
    pthread_mutex_lock(&o->lock);
    o->reg[tag].prio = priority;
    o->reg[tag].last_use = ++o->clock;
    pthread_mutex_unlock(&o->lock);
    return GP_OK;
}

gp_status gp_offload_use(gp_offloader *o, gp_tag tag, int busy)
{
    if (tag >= gp_tag_count())
        return gp_error_set(GP_ERR_INVALID, "gpupool: tag id %u was never interned", (unsigned)tag);
    pthread_mutex_lock(&o->lock);
    o->reg[tag].busy = busy != 0;
    o->reg[tag].last_use = ++o->clock;
    pthread_mutex_unlock(&o->lock);
    return GP_OK;
}

void gp_offload_stats_get(gp_offloader *o, gp_offload_stats *out)
{
    gp_host_store_stats hs;
    gp_host_store_stats_get(o->hs, &hs);
    pthread_mutex_lock(&o->lock);
    *out = o->st;
    pthread_mutex_unlock(&o->lock);
    out->host_slabs = hs.slabs;
    out->host_limit = hs.limit;
    out->n_pin = hs.n_pin;
}

int gp_offload_is_offloaded(gp_offloader *o, gp_tag tag)
{
    pthread_mutex_lock(&o->lock);
    int found = 0;
    for (gp_record *r = o->records; r && !found; r = r->next) found = gp_record_has(r, &tag, 1);
    pthread_mutex_unlock(&o->lock);
    return found;
}

gp_status gp_offload_corrupt_for_test(gp_offloader *o, gp_tag tag)
{
    gp_status st = gp_error_set(GP_ERR_INVALID, "gpupool: tag id %u has no stored bytes", (unsigned)tag);
    pthread_mutex_lock(&o->lock);
    for (gp_record *r = o->records; r && st != GP_OK; r = r->next) {
        if (!gp_record_has(r, &tag, 1) || !r->n_pieces || !r->pieces[0].host.ptr) continue;
        ((unsigned char *)r->pieces[0].host.ptr)[r->pieces[0].stored / 2] ^= 0x40;
        gp_error_clear();
        st = GP_OK;
    }
    pthread_mutex_unlock(&o->lock);
    return st;
}
