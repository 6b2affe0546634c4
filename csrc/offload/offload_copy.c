/*
 * offload_copy.c -- the data path of offload: plans from the pool
 * (gp_pool_offload_*), bytes through pinned host slabs (pinned.c),
 * compression (codec.h), checksums on the device (checksum.h), the VMM
 * calls on worker threads (workq.c).
 *
 * A record's bytes are pieces: a live block, or a part of one of at most
 * GP_PIECE_MAX (less when the codec's jobs take less), which may lie across
 * chunks.  The pieces go to two lanes in turn; a lane is a copy
 * stream of the backend's own and, when compressing, a codec job with half
 * of the staging.
 *
 * Offload: the pool marks the tags' blocks and names the runs of chunks to
 * release; the device is synchronised (the streams that used the memory,
 * record_stream events included, have finished).  Each piece is summed on
 * the device, then copied out raw, or compressed into the lane's staging
 * and its compressed chunks copied out -- each lane's next piece is
 * compressed while the other lane's copies run.  When a chunk's copies are
 * queued an event follows them, and a worker waits for it and unmaps the
 * chunk: device memory is given back while later chunks are still copied.
 *
 * An offload whose tags' last restore kept its host copy (a clean record,
 * offload_record.c) sums the device's bytes first, and where every sum is
 * as it was takes that record whole and only unmaps the chunks.
 *
 * Restore: the pool checks the runs are still offloaded; a worker maps the
 * chunks ahead of the copies, in their order; each piece is copied back
 * (and decompressed) as soon as the chunks under it are mapped, and summed
 * on the device again; only when every sum matches the one taken before
 * the offload does the pool make the blocks live -- the round trip through
 * host memory, both copies and the codec are checked.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "offload_impl.h"

/* ------------------------------------------------------- pieces, chunks */

/* The chunks of a record's runs with the pieces over each (pieces are in
 * address order; one may lie across chunks). */
typedef struct gp_chunk {
    uintptr_t addr;
    uint64_t size;
    size_t p0, np;      /* the pieces that overlap it                  */
    uint64_t event[2];  /* offload: complete when its copies have, on
                           each lane                                   */
    gp_batch done;      /* restore: mapped                             */
    gp_offloader *o;
    gp_offload_plan *plan;
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
            /* The pieces that overlap it (its first may be the previous
             * chunk's last). */
            while (p < r->n_pieces && r->pieces[p].addr + r->pieces[p].size <= x) p++;
            size_t e = p;
            while (e < r->n_pieces && r->pieces[e].addr < x + run->chunk) e++;
            c[k].p0 = p;
            c[k].np = e - p;
        }
    }
    *n_out = n;
    return c;
}

/* Point compressed piece p's chunks at their host copies. */
static void gp_chunks_at_host(gp_piece *p)
{
    uint64_t off = 0;
    for (uint64_t q = 0; q < p->n_chunks; q++) {
        if (q == p->split) off = 0;
        p->chunks[q].data = (char *)(q < p->split ? p->host.ptr : p->host2.ptr) + off;
        off += gp_codec_pad(p->chunks[q].stored);
    }
}

void gp_piece_host_free(gp_offloader *o, gp_piece *p)
{
    gp_pinned_free(o->hs, &p->host);
    gp_pinned_free(o->hs, &p->host2);
}

/* ---------------------------------------------------------------- jobs */

/* An event the device would not record or wait for: wait for the whole
 * device instead (as the pool does), which orders everything. */
static gp_status gp_device_wait(gp_backend *be)
{
    gp_error_clear();
    return be->synchronize(be);
}


/* Offload: the chunk's sums and copies have been queued; once they ran,
 * give the chunk back. */
static gp_status gp_job_unmap(void *arg)
{
    gp_chunk *c = arg;
    gp_backend *be = c->o->be;
    gp_status st = GP_OK;
    for (int i = 0; i < 2; i++)
        if (c->event[i]) {
            gp_status w = be->event_wait(be, c->event[i]);
            be->event_release(be, c->event[i]);
            c->event[i] = 0;
            if (st == GP_OK) st = w;
        }
    if (st != GP_OK && (st = gp_device_wait(be)) != GP_OK) return st;
    if ((st = gp_pool_plan_unmap(c->o->pool, c->plan, c->addr, c->size)) != GP_OK) return st;
    c->unmapped = 1;
    return GP_OK;
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

/* The first failure's message, before later steps overwrite it. */
static void gp_note(gp_status st, char *why, size_t n)
{
    if (st != GP_OK && !why[0]) snprintf(why, n, "%s", gp_last_error()[0] ? gp_last_error() : gp_status_str(st));
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

/* Block until everything queued on stream s has run. */
static gp_status gp_stream_wait(gp_offloader *o, gp_stream s)
{
    uint64_t ev = 0;
    gp_status st = o->be->event_record(o->be, s, &ev);
    if (st == GP_OK) {
        st = o->be->event_wait(o->be, ev);
        o->be->event_release(o->be, ev);
    }
    return st == GP_OK ? GP_OK : gp_device_wait(o->be);
}

static gp_status gp_streams_drain(gp_offloader *o)
{
    gp_status st = GP_OK;
    for (int i = 0; i < o->n_streams; i++) {
        gp_status s = gp_stream_wait(o, o->streams[i]);
        if (s != GP_OK && st == GP_OK) st = s;
    }
    return st;
}

/* The streams drained after st, which is kept with its words: a call that
 * failed leaves the work queued before it running, and it must have run
 * before the caller lets the memory it reads go (a checksum of a chunk
 * unmapped under it faults the device). */
static gp_status gp_drain_after(gp_offloader *o, gp_status st)
{
    if (st == GP_OK) return gp_streams_drain(o);
    char why[512];
    snprintf(why, sizeof why, "%s", gp_last_error());
    if (gp_streams_drain(o) != GP_OK) gp_error_clear();
    return gp_error_set(st, "%s", why);
}

/* Read the operation's first n checksums back (the work that wrote them
 * has run, or is queued on streams[0], which the read follows). */
static gp_status gp_sums_read(gp_offloader *o, size_t n)
{
    if (!n) return GP_OK;
    return gp_drain_after(o, o->be->copy(o->be, gp_sums_host(o), gp_sums_dev(o), n * sizeof(uint64_t),
                                         GP_COPY_D2H, o->streams[0]));
}

/* --------------------------------------------------------------- codecs */

/* The codec for an offload (an open one is kept: records point at it). */
static gp_status gp_codec_for(gp_offloader *o, int id, unsigned elem_size, gp_codec **out)
{
    *out = NULL;
    for (unsigned i = 0; i < o->n_codecs; i++)
        if (o->codecs[i].id == id && o->codecs[i].elem_size == elem_size) {
            *out = o->codecs[i].c;
            return GP_OK;
        }
    if (o->n_codecs == GP_CODECS_OPEN)
        return gp_error_set(GP_ERR_TOO_MANY, "gpupool: more than %d codec settings in one process", GP_CODECS_OPEN);
    gp_codec_params prm = {.name = gp_codec_id_name((gp_codec_id)id), .elem_size = elem_size,
                           .nvcomp = o->nvcomp[0] ? o->nvcomp : NULL};
    gp_codec *c;
    gp_status st = gp_codec_open(o->be, &prm, &c);
    if (st != GP_OK) return st;
    o->codecs[o->n_codecs].id = id;
    o->codecs[o->n_codecs].elem_size = elem_size;
    o->codecs[o->n_codecs++].c = c;
    *out = c;
    return GP_OK;
}

/* A lane: one of the two copy streams, with a codec job when compressing.
 * The pieces go to the lanes in turn, so that one lane's copies run while
 * the other's piece is summed and compressed (and a wait for a lane's
 * compression finds it done).  Its job holds one piece at a time
 * (`piece`); the chunk whose last piece that is (`chunk`) is closed -- its
 * events queued, its unmap job pushed -- once the piece's copies are
 * queued. */
typedef struct gp_lane {
    gp_stream s;
    gp_codec_job *job;
    long piece;
    size_t close_lo, close_hi; /* chunks its piece is the last of */
} gp_lane;

/* Each lane's half of the staging. */
static uint64_t gp_staging_half(const gp_offloader *o)
{
    uint64_t half = o->be->total / GP_STAGING_SHARE / 4096 * 4096;
    return half < GP_STAGING_HALF ? half : GP_STAGING_HALF;
}

/* Two codec jobs over the staging (taken from the pool on first use) and
 * the scratch; *ok = 0 (no error) when the pool has no room for the
 * staging or it is too small for the codec's chunks: then raw. */
static gp_status gp_lanes_open(gp_offloader *o, gp_codec *c, gp_lane *lane, int *ok)
{
    *ok = 0;
    uint32_t m;
    uint64_t dev, host, half = gp_staging_half(o);
    gp_status st = gp_codec_job_fit(c, half, &m);
    if (st == GP_ERR_INVALID) {
        gp_error_clear();
        return GP_OK;
    }
    if (st == GP_OK) st = gp_codec_job_need(c, m, &dev, &host);
    if (st != GP_OK) return st;
    if (!o->staging) {
        gp_tag own;
        if ((st = gp_tag_intern("gpupool", &own)) != GP_OK) return st;
        o->staging = gp_alloc(o->pool, 2 * half, NULL, own, GP_PRIO_CRITICAL, &st);
        if (!o->staging) {
            gp_error_clear(); /* no room now: raw is the answer */
            return GP_OK;
        }
    }
    for (int i = 0; i < 2; i++) {
        if (host > o->scratch_bytes[i]) {
            if (o->scratch[i]) o->be->host_free(o->be, o->scratch[i], o->scratch_bytes[i]);
            o->scratch[i] = NULL;
            o->scratch_bytes[i] = 0;
            void *got = NULL; /* (a failed call may leave junk in its output) */
            if (host && (st = o->be->host_alloc(o->be, host, &got)) != GP_OK) return st;
            o->scratch[i] = got;
            o->scratch_bytes[i] = host;
        }
        st = gp_codec_job_create(c, m, (char *)o->staging + i * half, dev, o->scratch[i], host,
                                 &lane[i].job);
        if (st != GP_OK) {
            if (i) gp_codec_job_destroy(lane[0].job);
            lane[0].job = NULL;
            return st;
        }
    }
    *ok = 1;
    return GP_OK;
}

static void gp_lanes_close(gp_lane *lane)
{
    for (int i = 0; i < 2; i++) {
        if (lane[i].job) gp_codec_job_destroy(lane[i].job);
        lane[i].job = NULL;
    }
}

void gp_offload_copy_free(gp_offloader *o)
{
    for (unsigned i = 0; i < o->n_codecs; i++) gp_codec_close(o->codecs[i].c);
    for (int i = 0; i < 2; i++)
        if (o->scratch[i]) o->be->host_free(o->be, o->scratch[i], o->scratch_bytes[i]);
    if (o->staging) gp_free(o->pool, o->staging);
}

/* -------------------------------------------------------------- offload */

/* Undo a failed offload: map back the chunks that were given up and copy
 * their pieces back (their copies had run before each unmap).  The
 * streams have been drained; a lane's compression under way is dropped
 * (the job then decompresses).  A piece of a given-up chunk without a
 * host copy (keep = 0) cannot come back: *lost counts its bytes. */
static gp_status gp_undo_offload(gp_offloader *o, gp_offload_plan *pl, gp_record *r, gp_chunk *c, size_t n,
                                 gp_lane *lane, uint64_t *lost)
{
    *lost = 0;
    for (int i = 0; i < 2; i++)
        if (lane[i].job) gp_codec_job_abandon(lane[i].job);
    gp_status st = GP_OK;
    for (size_t k = 0; k < n && st == GP_OK; k++)
        if (c[k].unmapped) st = gp_pool_plan_map(o->pool, pl, c[k].addr, c[k].size, GP_PRIO_MAX);
    /* Then the pieces over them (a piece may lie on two chunks), once. */
    size_t next = 0;
    for (size_t k = 0; k < n && st == GP_OK; k++) {
        if (!c[k].unmapped) continue;
        for (size_t i = next > c[k].p0 ? next : c[k].p0; i < c[k].p0 + c[k].np && st == GP_OK; i++) {
            gp_piece *p = &r->pieces[i];
            next = i + 1;
            if (r->dropped) {
                *lost += p->size;
                continue;
            }
            if (!p->copied) /* (a chunk goes only once its pieces are out: never) */
                st = gp_error_set(GP_ERR_BACKEND, "gpupool: a piece of a given-up chunk was never copied out");
            else if (!p->chunks)
                st = o->be->copy(o->be, (void *)p->addr, p->host.ptr, p->size, GP_COPY_H2D, o->streams[0]);
            else {
                /* A clean record taken whole opened no jobs: they are
                 * opened now -- but not inside a restore, whose own jobs
                 * hold the staging (then the offload gives up, its host
                 * copy whole, for a restore to bring back). */
                int ok = 1;
                if (!lane[0].job && o->depth > 1)
                    st = gp_error_set(GP_ERR_BACKEND, "gpupool: cannot decompress inside a restore");
                else if (!lane[0].job && (st = gp_lanes_open(o, r->codec, lane, &ok)) == GP_OK && !ok)
                    st = gp_error_set(GP_ERR_OOM, "gpupool: no room on the device for the staging that "
                                      "decompressing needs");
                if (st != GP_OK) break;
                gp_chunks_at_host(p);
                st = gp_codec_decompress(lane[0].job, o->streams[0], (void *)p->addr, p->size, p->chunks,
                                         p->n_chunks);
                if (st == GP_OK) st = gp_stream_wait(o, o->streams[0]);
                if (st == GP_OK) st = gp_codec_decompress_check(lane[0].job);
            }
        }
    }
    if (st == GP_OK) st = gp_streams_drain(o);
    return st;
}

/* Host room for compressed piece p's stored chunks.  Where a slab's tail
 * is shorter, the chunks that fit go there and the rest to a second extent
 * (`host2`, from chunk `split`): stored whole, pieces left the tails of the
 * slabs empty, and pinned memory grew by up to a third more than the host
 * bytes. */
static gp_status gp_piece_room(gp_offloader *o, gp_piece *p)
{
    p->split = p->n_chunks;
    gp_status st = gp_pinned_alloc_part(o->hs, p->stored, GP_PART_MIN, &p->host);
    if (st != GP_OK || p->host.size >= p->stored) return st;
    uint64_t fit = 0, m = 0;
    while (m < p->n_chunks && fit + gp_codec_pad(p->chunks[m].stored) <= p->host.size)
        fit += gp_codec_pad(p->chunks[m++].stored);
    gp_pinned_shrink(o->hs, &p->host, fit);
    if (!m) return gp_pinned_alloc(o->hs, p->stored, &p->host); /* (not even one chunk fit: whole, elsewhere) */
    p->split = m;
    return gp_pinned_alloc(o->hs, p->stored - fit, &p->host2);
}

/* The compressed piece a lane holds: wait for its compression, store its
 * chunks on the host (each padded to GP_CODEC_ALIGN) and queue their
 * copies out. */
static gp_status gp_lane_store(gp_offloader *o, gp_record *r, gp_lane *l)
{
    gp_piece *p = &r->pieces[l->piece];
    l->piece = -1;
    gp_status st = gp_stream_wait(o, l->s);
    uint64_t n = gp_codec_chunks(r->codec, p->size), stored = 0;
    if (st == GP_OK && !(p->chunks = calloc(n, sizeof *p->chunks)))
        st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a chunk table");
    if (st == GP_OK) st = gp_codec_compress_result(l->job, p->chunks, n, &stored);
    p->n_chunks = n;
    p->stored = stored;
    if (st == GP_OK) st = gp_piece_room(o, p);
    /* (Slabs are pinned in the background: each copy waits for its own.) */
    if (st == GP_OK) st = gp_pinned_ready(o->hs, &p->host);
    if (st == GP_OK) st = gp_pinned_ready(o->hs, &p->host2);
    /* Chunks that lie back to back in the staging and on the host (the
     * gathered ones, runs of raw ones) go in one copy. */
    uint64_t off = 0;
    for (uint64_t j = 0; j < n && st == GP_OK;) {
        if (j == p->split) off = 0;
        char *to = (char *)(j < p->split ? p->host.ptr : p->host2.ptr) + off;
        const char *from = p->chunks[j].data;
        uint64_t len = p->chunks[j].stored, e = j + 1;
        while (e < n && e != p->split && (const char *)p->chunks[e].data == from + gp_codec_pad(len))
            len = gp_codec_pad(len) + p->chunks[e++].stored;
        st = o->be->copy(o->be, to, from, len, GP_COPY_D2H, l->s);
        for (; j < e; j++) p->chunks[j].data = NULL; /* (staging: restore points them at the host copy) */
        off += gp_codec_pad(len);
    }
    if (st == GP_OK) p->copied = 1;
    return st;
}

/* Close chunk k, whose pieces' copies are all queued (on either lane): an
 * event behind them on each lane, and the worker that unmaps it. */
static gp_status gp_chunk_close(gp_offloader *o, gp_record *r, gp_chunk *k, const gp_lane *lane, gp_batch *unmaps)
{
    gp_status st = GP_OK;
    for (int i = 0; i < 2 && st == GP_OK && k->np && r->pieces[k->p0].host.ptr; i++) {
        uint64_t ev = 0;
        if (o->be->event_record(o->be, lane[i].s, &ev) == GP_OK) k->event[i] = ev;
        else st = gp_device_wait(o->be); /* (then the chunk's copies have run) */
    }
    return st == GP_OK ? gp_workq_push(o->q, unmaps, gp_job_unmap, k) : st;
}

/* Finish what lane l holds: its piece's copies, then the chunks they close.
 * The lanes are finished in their pieces' order, so that every earlier
 * piece of that chunk is queued on the other lane already. */
static gp_status gp_lane_finish(gp_offloader *o, gp_record *r, gp_chunk *c, gp_lane *lane, gp_lane *l,
                                gp_batch *unmaps)
{
    size_t k = l->close_lo, hi = l->close_hi;
    l->close_lo = l->close_hi = 0;
    gp_status st = l->piece >= 0 ? gp_lane_store(o, r, l) : GP_OK;
    for (; k < hi && st == GP_OK; k++) st = gp_chunk_close(o, r, &c[k], lane, unmaps);
    return st;
}

/* Host room for raw piece i.  Where a slab's tail is shorter than the
 * piece, the piece is cut to fill it and the rest becomes piece i+1: raw
 * pieces that do not divide a slab (12 MiB blocks in 32 MiB slabs) left
 * each slab's tail empty, a quarter more pinned memory than bytes.  (A
 * record with as many pieces as it may sum stores the rest whole.) */
static gp_status gp_piece_host(gp_offloader *o, gp_record *r, size_t i)
{
    gp_piece *p = &r->pieces[i];
    uint64_t min = r->n_pieces < gp_sums_room(o) ? GP_PART_MIN : p->size;
    gp_status st = gp_pinned_alloc_part(o->hs, p->size, min, &p->host);
    if (st == GP_OK && p->host.size < p->size) {
        gp_piece *np = realloc(r->pieces, (r->n_pieces + 1) * sizeof *np);
        if (!np) {
            gp_pinned_free(o->hs, &p->host);
            return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for an offload record");
        }
        r->pieces = np;
        p = &np[i];
        memmove(&np[i + 2], &np[i + 1], (r->n_pieces - i - 1) * sizeof *np);
        np[i + 1] = (gp_piece){.addr = p->addr + p->host.size, .size = p->size - p->host.size, .tag = p->tag};
        p->size = p->host.size;
        r->n_pieces++;
    }
    p->stored = p->size;
    return st;
}

/* The codec an offload may use (*out NULL: raw), the one asked for, and
 * the largest piece its jobs take (*slice); nothing is opened yet, so a
 * refused offload leaves the pool as it was. */
static gp_status gp_codec_offered(gp_offloader *o, const gp_offload_opts *opts, gp_codec **out, uint64_t *slice)
{
    *out = NULL;
    *slice = GP_PIECE_MAX;
    if (opts->codec == GP_CODEC_RAW) return GP_OK;
    gp_codec *c;
    uint32_t m;
    /* (A codec that cannot run here is refused whether or not the contents
     * are kept; nothing is compressed when they are not, nor in an offload
     * inside a restore, whose lanes hold the staging.) */
    gp_status st = gp_codec_for(o, opts->codec, opts->elem_size, &c);
    if (st != GP_OK || gp_codec_kind(c) == GP_CODEC_RAW || !opts->keep || o->depth > 1) return st;
    if ((st = gp_codec_job_fit(c, gp_staging_half(o), &m)) == GP_ERR_INVALID) {
        gp_error_clear(); /* a staging too small for the codec's chunks: raw */
        return GP_OK;
    }
    if (st != GP_OK) return st;
    uint64_t max = (uint64_t)m * gp_codec_chunk_size(c);
    if (max < *slice) *slice = max;
    *out = c;
    return GP_OK;
}

/* Compress when the pool has room for the staging (the lanes' jobs are
 * then open) and compressing the largest piece pays (a trial of its first
 * chunk).  The first piece decided before: a small block of other data in
 * front (a buffer, an index) sent a model's weights raw. */
static gp_status gp_choose_codec(gp_offloader *o, gp_record *r, gp_codec *c, gp_lane *lane)
{
    int ok;
    if (!c || !r->n_pieces) return GP_OK;
    gp_status st = gp_lanes_open(o, c, lane, &ok);
    if (st != GP_OK || !ok) return st;
    double ratio;
    int worth = 0;
    const gp_piece *big = &r->pieces[0];
    for (size_t i = 1; i < r->n_pieces; i++)
        if (r->pieces[i].size > big->size) big = &r->pieces[i];
    st = gp_codec_trial(lane[0].job, lane[0].s, (const void *)big->addr, big->size, &ratio, &worth);
    if (st == GP_OK && worth) r->codec = c;
    else gp_lanes_close(lane);
    return st;
}

/* One offload under way: what its steps share. */
typedef struct gp_out {
    gp_offloader *o;
    const gp_offload_opts *opts;
    gp_offload_plan *pl;
    gp_record *r;
    gp_chunk *c;         /* the chunks of its runs                         */
    size_t n;
    gp_lane lane[2];
    int reserved;        /* host room was reserved                         */
    int waited;          /* the memory's users are done (gp_users_done)    */
    int reused;          /* the record is a clean one, taken whole: nothing
                            is copied                                      */
    gp_batch unmaps;     /* the chunks' unmap jobs                         */
    char why[1024];      /* the first failure's words                      */
} gp_out;

/* The streams that used the memory (record_stream ones too) have run what
 * they had queued when the offload was asked: its fence's events (taken
 * now where the caller brought none).  Not a device sync: that waited for
 * the work queued since as well -- behind an optimizer's step, the next
 * forward pass, which the copies are meant to run beside -- and for the
 * prefetches' copies on the other lanes.  A device sync where no fence can
 * be had (a graph capture, a failed event), and where the plan takes a CUDA
 * graph's memory: a graph replays on whatever stream its caller names,
 * which the pool may never have seen (it allocates nothing there). */
static gp_status gp_users_done(gp_offloader *o, const gp_offload_opts *opts, const gp_offload_plan *pl)
{
    if (pl->graphs) return gp_pool_synchronize(o->pool);
    uint64_t own[GP_FENCE_MAX];
    const uint64_t *ev = opts->fence;
    size_t n = opts->n_fence;
    if (!ev && gp_pool_fence(o->pool, own, GP_FENCE_MAX, &n) == GP_OK) ev = own;
    gp_status st = ev ? GP_OK : GP_ERR_INVALID;
    for (size_t i = 0; i < n && ev && st == GP_OK; i++) st = o->be->event_wait(o->be, ev[i]);
    if (ev == own)
        for (size_t i = 0; i < n; i++) o->be->event_release(o->be, own[i]);
    if (st == GP_OK) return GP_OK;
    gp_error_clear();
    return gp_pool_synchronize(o->pool);
}

/* The tags' last restore kept a host copy of these bytes (a clean record):
 * the device's sums of its pieces now decide.  All as they were: the copy
 * is current and becomes this offload's record, whole -- nothing is
 * copied out, the chunks are only given back (frozen weights, a model
 * switched out again).  Any changed: it is freed, and its tag keeps no
 * copy for its next GP_CLEAN_SKIP restores.  The sums run after the
 * memory's users, as the offload's own do. */
static gp_status gp_out_reuse(gp_out *x)
{
    gp_offloader *o = x->o;
    gp_record *q = gp_clean_find(o, x->r);
    if (!q) return GP_OK;
    /* A compressed copy only where the caller left the codec to us or named
     * that one: raw asked means restores without codec kernels (under
     * compute, say).  A raw copy is what every codec falls back to. */
    int other = q->codec && x->opts->codec != GP_CODEC_AUTO && x->opts->codec != (int)gp_codec_kind(q->codec);
    if (other || q->n_pieces > gp_sums_room(o)) {
        gp_clean_drop(o, q, 0);
        return GP_OK;
    }
    gp_status st = gp_users_done(o, x->opts, x->pl);
    x->waited = st == GP_OK;
    /* On the stream the sums are read back on, so that the read follows
     * every one of them: behind sums on the other stream, it read some
     * before they were written -- the restore's, which equal the copy's
     * whatever the device holds now. */
    for (size_t j = 0; st == GP_OK && j < q->n_pieces; j++) {
        const gp_piece *p = &q->pieces[j];
        st = o->be->checksum(o->be, (const void *)p->addr, p->size, p->addr, &gp_sums_dev(o)[j], o->streams[0]);
    }
    st = st == GP_OK ? gp_sums_read(o, q->n_pieces) : gp_drain_after(o, st);
    int same = st == GP_OK;
    for (size_t j = 0; same && j < q->n_pieces; j++) same = gp_sums_host(o)[j] == q->pieces[j].sum;
    gp_chunk *c = NULL;
    size_t n = 0;
    if (same && !(c = gp_chunks_of(q, &n)))
        st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for an offload record");
    if (!c) {
        gp_clean_drop(o, q, st == GP_OK);
        return st;
    }
    gp_clean_take(o, q);
    q->offloaded = x->r->offloaded;
    q->released = x->r->released;
    q->priority = x->r->priority;
    gp_record_free(o, x->r);
    free(x->c);
    x->r = q;
    x->c = c;
    x->n = n;
    x->reused = 1;
    return GP_OK;
}

/* Before anything moves: the record (its pieces fit in the codec's jobs),
 * a clean host copy taken where it is current, else host room for every
 * piece (raw size: compressed pieces take less; clean copies give theirs
 * up first), the streams that used the memory finished, the codec, raw
 * pieces cut to fill the slabs. */
static gp_status gp_out_prepare(gp_out *x, const gp_tag *tags, size_t n_tags)
{
    gp_offloader *o = x->o;
    gp_codec *offered = NULL;
    uint64_t slice;
    gp_status st = gp_codec_offered(o, x->opts, &offered, &slice);
    if (st != GP_OK) return st;
    if (!(x->r = gp_record_new(tags, n_tags, x->pl, slice)) || !(x->c = gp_chunks_of(x->r, &x->n)))
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for an offload record");
    gp_record *r = x->r;
    r->dropped = !x->opts->keep;
    if (r->n_pieces > gp_sums_room(o))
        return gp_error_set(GP_ERR_INVALID, "gpupool: offload of %zu pieces at once (at most %zu%s: offload fewer "
                            "tags at a time)", r->n_pieces, gp_sums_room(o), o->depth > 1 ? " inside a restore" : "");
    if (x->opts->keep) {
        if ((st = gp_out_reuse(x)) != GP_OK || x->reused) return st;
        /* Each piece in an extent of its own (16-byte aligned); compressed,
         * each chunk may be padded too. Raw needs no more: an offload of
         * exactly the host limit fits. */
        uint64_t room = 0;
        for (size_t i = 0; i < r->n_pieces; i++) room += gp_codec_pad(r->pieces[i].size);
        if (offered) room += 2 * GP_CODEC_ALIGN * (x->pl->bytes / 4096 + r->n_pieces);
        gp_clean_room(o, room);
        if ((st = gp_pinned_reserve(o->hs, room)) != GP_OK) return st;
        x->reserved = 1;
    }
    if ((!x->waited && (st = gp_users_done(o, x->opts, x->pl)) != GP_OK) ||
        (st = gp_choose_codec(o, r, offered, x->lane)) != GP_OK)
        return st;
    size_t n_cut = r->n_pieces;
    for (size_t i = 0; st == GP_OK && x->opts->keep && !r->codec && i < r->n_pieces; i++) st = gp_piece_host(o, r, i);
    if (st != GP_OK || r->n_pieces == n_cut) return st;
    free(x->c);
    if (!(x->c = gp_chunks_of(r, &x->n)))
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for an offload record");
    return GP_OK;
}

/* Piece by piece, the lanes in turn: sums, then copies out (raw) or
 * compression (the lane's previous piece is stored first).  A chunk
 * closes once the last piece that overlaps it is queued; then the last two
 * pieces, in order, and the chunks no piece is in; then the unmap jobs. */
static gp_status gp_out_copy(gp_out *x)
{
    gp_offloader *o = x->o;
    gp_record *r = x->r;
    gp_chunk *c = x->c;
    gp_lane *lane = x->lane;
    gp_status st = GP_OK;
    for (size_t k = 0; k < x->n; k++) {
        c[k].o = o;
        c[k].plan = x->pl;
    }
    size_t closed = 0; /* chunks [0, closed) are closed, or will be with a lane's piece */
    size_t n_keep = x->opts->keep && !x->reused ? r->n_pieces : 0;
    /* Compressed, the host room of each piece is taken once it is
     * compressed: the slabs for the pieces left are pinned ahead at the
     * ratio of those stored (raw pieces took all theirs in gp_out_prepare). */
    uint64_t left = 0, raw = 0, stored = 0;
    for (size_t j = 0; j < n_keep; j++) left += r->pieces[j].size;
    for (size_t j = 0; j < n_keep && st == GP_OK; j++) {
        gp_piece *p = &r->pieces[j];
        gp_lane *l = &lane[j & 1];
        long done = l->piece;
        if ((st = gp_lane_finish(o, r, c, lane, l, &x->unmaps)) != GP_OK) break;
        if (done >= 0) {
            left -= r->pieces[done].size;
            raw += r->pieces[done].size;
            stored += r->pieces[done].stored;
            gp_pinned_ahead(o->hs, (uint64_t)((double)left * (double)stored / (double)raw));
        }
        st = o->be->checksum(o->be, (const void *)p->addr, p->size, p->addr, &gp_sums_dev(o)[j], l->s);
        if (st != GP_OK) break;
        size_t due = closed;
        while (due < x->n && (!c[due].np || c[due].p0 + c[due].np <= j + 1)) due++;
        if (r->codec) {
            if ((st = gp_codec_compress(l->job, l->s, (const void *)p->addr, p->size, 0)) != GP_OK) break;
            l->piece = (long)j;
            l->close_lo = closed;
            l->close_hi = due;
        } else if ((st = gp_pinned_ready(o->hs, &p->host)) == GP_OK &&
                   (st = o->be->copy(o->be, p->host.ptr, (const void *)p->addr, p->size, GP_COPY_D2H, l->s)) ==
                       GP_OK) {
            p->copied = 1;
            for (size_t k = closed; k < due && st == GP_OK; k++) st = gp_chunk_close(o, r, &c[k], lane, &x->unmaps);
        }
        closed = due;
    }
    int first = lane[1].piece >= 0 && (lane[0].piece < 0 || lane[1].piece < lane[0].piece);
    for (int i = 0; i < 2 && st == GP_OK; i++) st = gp_lane_finish(o, r, c, lane, &lane[i ^ first], &x->unmaps);
    for (; closed < x->n && st == GP_OK; closed++) st = gp_chunk_close(o, r, &c[closed], lane, &x->unmaps);
    /* Noted before the unmap jobs are waited for: a failed one puts its
     * own words in the slot. */
    gp_note(st, x->why, sizeof x->why);
    gp_status jst = gp_batch_wait(&x->unmaps);
    return st == GP_OK ? jst : st;
}

/* Everything went: the sums (they ran before the copies, which have run)
 * read, the plan ended offloaded, the record published.  A clean record
 * taken whole has its sums. */
static gp_status gp_out_finish(gp_out *x)
{
    gp_offloader *o = x->o;
    gp_record *r = x->r;
    gp_status st = x->opts->keep && !x->reused ? gp_sums_read(o, r->n_pieces) : GP_OK;
    for (size_t i = 0; st == GP_OK && !x->reused && i < r->n_pieces; i++) {
        r->pieces[i].sum = gp_sums_host(o)[i];
        r->pieces[i].summed = 1;
    }
    if (st == GP_OK && (st = gp_pool_plan_end(o->pool, x->pl, 0)) == GP_OK) {
        gp_lanes_close(x->lane);
        gp_record_publish(o, r, !x->reused);
    }
    return st;
}

/* The device refuses even the undo: give the rest up too and keep what the
 * host has, so that the pool stays whole and a restore brings back every
 * address.  Every piece whose copy out is not known to have run whole is
 * lost (and counted: a restore of it needs the caller's consent); those
 * whose sums come back are checked on restore.  A chunk that will not go
 * stays mapped inside the run.  `drained`: the streams ran to the end. */
static uint64_t gp_out_give_up(gp_out *x, int drained)
{
    gp_offloader *o = x->o;
    gp_record *r = x->r;
    /* The undo's copies back may still be queued: they run before the
     * chunks go (a copy into an unmapped chunk faults the device, and the
     * context with it) and before the jobs close.  Where even a device sync
     * fails, the chunks stay. */
    int idle = gp_streams_drain(o) == GP_OK;
    if (!idle) gp_error_clear();
    gp_lanes_close(x->lane);
    for (size_t k = 0; k < x->n && idle; k++)
        if (gp_pool_plan_unmap(o->pool, x->pl, x->c[k].addr, x->c[k].size) != GP_OK) gp_error_clear();
    int summed = drained && gp_sums_read(o, r->n_pieces) == GP_OK;
    uint64_t lost = 0; /* (what the undo counted of a dropped record is not lost: it was dropped) */
    for (size_t i = 0; i < r->n_pieces && !r->dropped; i++) {
        gp_piece *p = &r->pieces[i];
        if (!p->copied || !summed) {
            lost += p->size;
            gp_piece_host_free(o, p);
            free(p->chunks);
            p->chunks = NULL;
            p->stored = 0;
        } else {
            p->sum = gp_sums_host(o)[i];
            p->summed = 1;
        }
    }
    r->lost = lost;
    gp_pool_plan_end(o->pool, x->pl, 0); /* (ending offloaded cannot fail) */
    gp_record_publish(o, r, !x->reused);
    return lost;
}

/* Failed half way (st): what was given up is on the host; bring it back,
 * or give up the rest. */
static gp_status gp_out_failed(gp_out *x, gp_status st, gp_offload_result *res)
{
    gp_offloader *o = x->o;
    gp_note(st, x->why, sizeof x->why);
    for (size_t k = 0; k < x->n; k++)
        for (int i = 0; i < 2; i++)
            if (x->c[k].event[i]) o->be->event_release(o->be, x->c[k].event[i]);
    gp_error_clear();
    gp_status dst = gp_streams_drain(o);
    uint64_t lost = 0;
    gp_status ust = dst;
    if (ust == GP_OK) ust = gp_undo_offload(o, x->pl, x->r, x->c, x->n, x->lane, &lost);
    if (ust == GP_OK) ust = gp_pool_plan_end(o->pool, x->pl, 1);
    if (ust == GP_OK) {
        gp_lanes_close(x->lane);
        gp_record_free(o, x->r);
        res->lost = lost;
        if (lost)
            return gp_error_set(st, "%s (the offload was undone: the blocks are on the device again, but the %" PRIu64
                                " bytes of them it had given back lost their contents, which keep=False drops)",
                                x->why, lost);
        return gp_error_set(st, "%s (the offload was undone: the memory is on the device as before)", x->why);
    }
    char undo_why[512] = ""; /* (why the undo failed: before the steps below overwrite it) */
    gp_note(ust, undo_why, sizeof undo_why);
    char tags_txt[256];
    gp_tags_text(x->r, tags_txt, sizeof tags_txt);
    res->lost = gp_out_give_up(x, dst == GP_OK);
    return gp_error_set(st, "%s; undoing the offload of tag %s failed too (%s): it stays offloaded and %" PRIu64
                        " bytes of its contents are lost", x->why, tags_txt, undo_why, res->lost);
}

static gp_status gp_offload_steps(gp_offloader *o, const gp_tag *tags, size_t n_tags, const gp_offload_opts *opts,
                                  gp_offload_result *res)
{
    double t0 = gp_now();
    memset(res, 0, sizeof *res);
    gp_status st = gp_streams(o);
    gp_out x = {.o = o, .opts = opts, .lane = {{.s = o->streams[0], .piece = -1}, {.s = o->streams[1], .piece = -1}}};
    if (st != GP_OK || (st = gp_pool_offload_begin_upto(o->pool, tags, n_tags, opts->most, &x.pl)) != GP_OK) return st;
    x.pl->refill = opts->refill;
    res->kept = x.pl->kept;
    if (!x.pl->n_runs) {
        res->seconds = gp_now() - t0;
        return gp_pool_plan_end(o->pool, x.pl, 1);
    }
    if ((st = gp_out_prepare(&x, tags, n_tags)) != GP_OK) {
        /* Nothing moved: as it was. */
        char why[1024];
        snprintf(why, sizeof why, "%s", gp_last_error());
        gp_lanes_close(x.lane);
        if (x.reserved) gp_pinned_settle(o->hs, UINT64_MAX);
        if (gp_pool_plan_end(o->pool, x.pl, 1) != GP_OK) gp_error_clear();
        gp_record_free(o, x.r);
        free(x.c);
        return gp_error_set(st, "%s", why);
    }
    gp_batch_init(&x.unmaps);
    st = gp_out_copy(&x);
    gp_batch_destroy(&x.unmaps);
    gp_note(st, x.why, sizeof x.why);
    if (x.reserved) gp_pinned_settle(o->hs, UINT64_MAX);
    if (st == GP_OK && (st = gp_out_finish(&x)) == GP_OK) {
        const gp_record *r = x.r;
        *res = (gp_offload_result){.bytes = r->offloaded, .copied = x.reused ? 0 : r->copied,
                                   .host_bytes = r->host_bytes,
                                   .released = r->released, .kept = res->kept,
                                   .codec = r->codec ? gp_codec_kind(r->codec) : GP_CODEC_RAW,
                                   .seconds = gp_now() - t0};
    } else {
        st = gp_out_failed(&x, st, res);
    }
    free(x.c);
    return st;
}

/* An operation one level deeper than the one running (if any): its own
 * checksums, and no codec where it is nested. */
gp_status gp_offload_locked(gp_offloader *o, const gp_tag *tags, size_t n_tags, const gp_offload_opts *opts,
                            gp_offload_result *res)
{
    if (o->depth == GP_OP_DEPTH)
        return gp_error_set(GP_ERR_INVALID, "gpupool: an offload nested %d deep", GP_OP_DEPTH + 1);
    size_t at = o->sums_at;
    o->sums_at = o->depth++ ? o->sums_free : 0;
    gp_status st = gp_offload_steps(o, tags, n_tags, opts, res);
    o->depth--;
    o->sums_at = at;
    return st;
}

/* -------------------------------------------------------------- restore */

/* The piece a lane's job holds has been decompressed: check it. */
static gp_status gp_lane_check(gp_offloader *o, gp_lane *l)
{
    if (l->piece < 0) return GP_OK;
    l->piece = -1;
    gp_status st = gp_stream_wait(o, l->s);
    return st == GP_OK ? gp_codec_decompress_check(l->job) : st;
}

/* Chunk c[k] is mapped (its job has run).  One the device had no room
 * for is mapped here: at once where room came since (the jobs of the
 * chunks after it may have failed too while the device was full), else
 * after making room for it and every later chunk whose job failed: idle
 * tags of the record's priority or lower, the lowest and then the one
 * needed farthest ahead first (gp_reclaim_locked), none of `keep`.  Equal
 * priorities count: layers of one model, each offloadable, restore in
 * turn under a limit that holds a few of them. */
static gp_status gp_chunk_ready(gp_offloader *o, const gp_record *r, const gp_tagset *keep, gp_chunk *c, size_t k,
                                size_t queued)
{
    gp_status st = gp_batch_wait(&c[k].done);
    if (st == GP_OK || c[k].mapped || (st != GP_ERR_OOM && st != GP_ERR_LIMIT)) return st;
    gp_error_clear();
    if ((st = gp_job_map(&c[k])) != GP_ERR_OOM && st != GP_ERR_LIMIT) return st;
    char why[1024];
    snprintf(why, sizeof why, "%s", gp_last_error());
    uint64_t need = c[k].size, got = 0;
    for (size_t i = k + 1; i < queued; i++)
        if (gp_batch_wait(&c[i].done) != GP_OK && !c[i].mapped) need += c[i].size;
    gp_error_clear();
    if (gp_reclaim_locked(o, need, r->priority + 1, keep, &got) == GP_OK && got) {
        gp_error_clear();
        return gp_job_map(&c[k]);
    }
    return gp_error_set(st, "%s", why);
}

/* One restore under way: what its steps share. */
typedef struct gp_in {
    gp_offloader *o;
    gp_record *r;
    const gp_tagset *keep; /* what making room may not displace      */
    int accept_loss;
    uint64_t lost;         /* bytes of live blocks its offload lost    */
    gp_offload_plan *pl;
    gp_chunk *c;
    size_t n, queued;      /* chunks, and those whose map job was queued */
    uint8_t *live;         /* per piece: its block is still live (one freed
                              while offloaded is neither copied nor checked:
                              a corrupt copy of freed memory kept the run
                              offloaded for ever)                       */
    gp_lane lane[2];
    char why[1024];        /* the first failure's words               */
} gp_in;

/* Which of r's pieces lie in the live blocks the plan lists (both in
 * address order; a piece is a part of one block). */
static gp_status gp_in_live(gp_in *x)
{
    const gp_record *r = x->r;
    if (!(x->live = calloc(r->n_pieces ? r->n_pieces : 1, 1)))
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a restore");
    size_t g = 0;
    for (size_t j = 0; j < r->n_pieces; j++) {
        const gp_piece *p = &r->pieces[j];
        while (g < x->pl->n_ranges && x->pl->ranges[g].addr + x->pl->ranges[g].size <= p->addr) g++;
        x->live[j] = g < x->pl->n_ranges && x->pl->ranges[g].addr <= p->addr &&
                     p->addr + p->size <= x->pl->ranges[g].addr + x->pl->ranges[g].size;
        if (x->live[j] && !p->host.ptr && !r->dropped) x->lost += p->size;
    }
    /* Bytes lost in blocks freed since are nobody's: only live ones need
     * the caller's consent. */
    char tags[256];
    if (x->lost && !x->accept_loss)
        return gp_error_set(GP_ERR_BACKEND, "gpupool: %" PRIu64 " bytes of tag %s were lost when %s failed and "
                            "could not be undone; restoring it would bring them back uninitialised, so it stays "
                            "offloaded: restore with accept_loss to take it back so (or free its memory)",
                            x->lost, gp_tags_text(r, tags, sizeof tags),
                            r->swap ? "a swap out of the process's memory" : "an offload of it");
    return GP_OK;
}

/* The plan, what the record may displace (its blocks' priority now: a
 * retag may have moved them since the offload), the lanes, the chunks;
 * then each chunk's map job, in address order. */
static gp_status gp_in_prepare(gp_in *x)
{
    gp_offloader *o = x->o;
    gp_record *r = x->r;
    gp_status st = gp_streams(o);
    if (st != GP_OK || (st = gp_pool_restore_begin(o->pool, r->runs, r->n_runs, &x->pl)) != GP_OK) return st;
    r->priority = 0;
    for (size_t i = 0; i < x->pl->n_ranges; i++)
        if (x->pl->ranges[i].priority > r->priority) r->priority = x->pl->ranges[i].priority;
    int ok = 1;
    if (r->codec && (st = gp_lanes_open(o, r->codec, x->lane, &ok)) == GP_OK && !ok)
        st = gp_error_set(GP_ERR_OOM, "gpupool: no room on the device for the %llu bytes of staging that "
                          "decompressing needs", (unsigned long long)(2 * gp_staging_half(o)));
    if (st == GP_OK && !(x->c = gp_chunks_of(r, &x->n)))
        st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a restore");
    if (st == GP_OK) st = gp_in_live(x);
    while (st == GP_OK && x->queued < x->n) {
        gp_chunk *k = &x->c[x->queued];
        k->o = o;
        k->plan = x->pl;
        gp_batch_init(&k->done);
        if ((st = gp_workq_push(o->mq, &k->done, gp_job_map, k)) != GP_OK) gp_batch_destroy(&k->done);
        else x->queued++;
    }
    return st;
}

/* Copy each piece back as soon as the chunks under it are mapped (a piece
 * whose bytes were lost stays as mapped), and sum what came back. */
static gp_status gp_in_copy(gp_in *x)
{
    gp_offloader *o = x->o;
    gp_record *r = x->r;
    gp_status st = GP_OK;
    size_t ready = 0; /* chunks [0, ready) are mapped */
    for (size_t j = 0; j < r->n_pieces && st == GP_OK; j++) {
        gp_piece *p = &r->pieces[j];
        gp_lane *l = &x->lane[j & 1];
        while (st == GP_OK && ready < x->queued && x->c[ready].addr < p->addr + p->size)
            st = gp_chunk_ready(o, r, x->keep, x->c, ready++, x->queued);
        if (st != GP_OK || !p->host.ptr || !x->live[j]) continue;
        if (p->chunks) {
            if ((st = gp_lane_check(o, l)) != GP_OK) break;
            gp_chunks_at_host(p);
            st = gp_codec_decompress(l->job, l->s, (void *)p->addr, p->size, p->chunks, p->n_chunks);
            if (st == GP_OK) l->piece = (long)j;
        } else {
            st = o->be->copy(o->be, (void *)p->addr, p->host.ptr, p->size, GP_COPY_H2D, l->s);
        }
        if (st == GP_OK) st = o->be->checksum(o->be, (const void *)p->addr, p->size, p->addr, &gp_sums_dev(o)[j], l->s);
    }
    while (st == GP_OK && ready < x->queued) st = gp_chunk_ready(o, r, x->keep, x->c, ready++, x->queued);
    return st;
}

/* Everything queued has run (lanes, map jobs, streams) and every piece
 * summed as it was before the offload.  Each failure's words are noted at
 * once: the steps after it (a lane's wait that falls back on a device
 * wait, which clears the slot; the map jobs' batches, which put back a
 * map failure recovered from) leave other words there. */
static gp_status gp_in_check(gp_in *x, gp_status st)
{
    gp_offloader *o = x->o;
    const gp_record *r = x->r;
    gp_note(st, x->why, sizeof x->why);
    for (int i = 0; i < 2; i++) {
        gp_status cst = gp_lane_check(o, &x->lane[i]);
        if (st == GP_OK) st = cst;
        gp_note(st, x->why, sizeof x->why);
    }
    for (size_t k = 0; k < x->queued; k++) gp_batch_wait(&x->c[k].done);
    if (st == GP_OK) gp_error_clear(); /* (those were recovered from) */
    if (st == GP_OK) st = gp_streams_drain(o);
    if (st == GP_OK) st = gp_sums_read(o, r->n_pieces);
    for (size_t i = 0; st == GP_OK && i < r->n_pieces; i++) {
        const gp_piece *p = &r->pieces[i];
        if (p->host.ptr && p->summed && x->live[i] && gp_sums_host(o)[i] != p->sum) {
            char tags[256];
            st = gp_error_set(GP_ERR_BACKEND, "gpupool: the host copy of tag %s is corrupt: checksum mismatch in "
                              "the %" PRIu64 " bytes of 0x%" PRIxPTR, gp_tags_text(r, tags, sizeof tags), p->size,
                              p->addr);
        }
    }
    gp_note(st, x->why, sizeof x->why);
    return st;
}

/* The blocks stay OFFLOADED (untouchable) until every piece came back
 * whole; on a failure what was mapped is given back: the tags stay
 * offloaded, their bytes on the host (a chunk that will not go stays
 * mapped in the run, and the next restore maps only the others). */
static gp_status gp_restore_steps(gp_offloader *o, gp_record *r, const gp_tagset *keep, int accept_loss,
                                  gp_offload_result *res)
{
    gp_in x = {.o = o, .r = r, .keep = keep, .accept_loss = accept_loss,
               .lane = {{.s = o->streams[0], .piece = -1}, {.s = o->streams[1], .piece = -1}}};
    gp_status st = gp_in_prepare(&x);
    if (!x.pl) return st;
    if (st == GP_OK) st = gp_in_copy(&x);
    st = gp_in_check(&x, st);
    for (size_t k = 0; k < x.queued; k++) gp_batch_destroy(&x.c[k].done);
    gp_error_clear();
    /* Before the jobs close and before a failure gives the chunks back:
     * copies still queued into an unmapped chunk fault the device.  Where
     * even a device sync fails, the chunks stay mapped. */
    gp_status dst = gp_streams_drain(o);
    gp_lanes_close(x.lane);
    if (st == GP_OK) st = dst;
    gp_note(st, x.why, sizeof x.why);
    uint64_t offloaded = x.pl->offloaded;
    if (st == GP_OK) {
        st = gp_pool_plan_end(o->pool, x.pl, 1);
    } else {
        for (size_t k = 0; k < x.n && dst == GP_OK; k++)
            if (gp_pool_plan_unmap(o->pool, x.pl, x.c[k].addr, x.c[k].size) != GP_OK) gp_error_clear();
        gp_pool_plan_end(o->pool, x.pl, 0); /* (ending offloaded cannot fail) */
        char tags[256];
        st = gp_error_set(st, "gpupool: restoring tag %s failed, the memory stays offloaded: %s",
                          gp_tags_text(r, tags, sizeof tags), x.why);
        offloaded = 0;
    }
    free(x.c);
    free(x.live);
    if (st != GP_OK) return st;
    res->bytes += offloaded;
    res->copied += r->copied;
    res->host_bytes += r->host_bytes;
    res->released += r->released;
    res->codec = r->codec ? gp_codec_kind(r->codec) : GP_CODEC_RAW;
    res->lost += x.lost;
    return GP_OK;
}

gp_status gp_restore_record_locked(gp_offloader *o, gp_record *r, const gp_tagset *keep, int accept_loss,
                                   gp_offload_result *res)
{
    if (o->depth)
        return gp_error_set(GP_ERR_INVALID, "gpupool: a restore inside another offload or restore");
    o->depth++;
    o->sums_at = 0;
    o->sums_free = r->n_pieces;
    gp_status st = gp_restore_steps(o, r, keep, accept_loss, res);
    o->depth--;
    return st;
}
