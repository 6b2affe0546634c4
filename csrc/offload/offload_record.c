/*
 * offload_record.c -- a record's life (offload_impl.h): made by an offload,
 * published, held by one restore or prefetch at a time, retired when
 * restored, kept clean with its host copy until the next offload of its
 * tags takes it or frees it; which records a restore or prefetch wants;
 * and the offloader's integrity check over all of it (gp_offload_check).
 *
 * Only the holder of a record restores or frees it: a record is never
 * freed while another thread or a queued job can still reach it, and a
 * restore that finds a record of its tags held by someone else waits for
 * it instead of skipping it.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload_impl.h"

/* ----------------------------------------------------------- making one */

/* Pieces of the plan's ranges, cut at piece_max: a piece may lie across
 * chunks (cut at chunk boundaries, a block that straddles two 64 MiB chunks
 * made 1 MiB pieces, each a host round trip when compressing). */
static gp_status gp_pieces_of(const gp_offload_plan *pl, gp_record *r, uint64_t piece_max)
{
    size_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (size_t i = 0; i < pl->n_ranges; i++) {
            const gp_offload_range *g = &pl->ranges[i];
            for (uintptr_t x = g->addr; x < g->addr + g->size;) {
                uintptr_t e = g->addr + g->size - x > piece_max ? x + piece_max : g->addr + g->size;
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

gp_record *gp_record_new(const gp_tag *tags, size_t n_tags, const gp_offload_plan *pl, uint64_t piece_max)
{
    /* A tag named twice is stored once: at most GP_MAX_TAGS, however many
     * the caller passed. */
    gp_record *r = calloc(1, sizeof *r + (n_tags < GP_MAX_TAGS ? n_tags : GP_MAX_TAGS) * sizeof *tags);
    if (!r) return NULL;
    gp_tagset seen = {{0}};
    for (size_t i = 0; i < n_tags; i++)
        if (!gp_tagset_has(&seen, tags[i])) {
            gp_tagset_add(&seen, tags[i]);
            r->tags[r->n_tags++] = tags[i];
        }
    r->offloaded = pl->offloaded;
    r->released = pl->released;
    r->state = GP_REC_NEW;
    for (size_t i = 0; i < pl->n_ranges; i++)
        if (pl->ranges[i].priority > r->priority) r->priority = pl->ranges[i].priority;
    if (!(r->runs = malloc(pl->n_runs * sizeof *r->runs)) || gp_pieces_of(pl, r, piece_max) != GP_OK) {
        free(r->runs);
        free(r->pieces);
        free(r);
        return NULL;
    }
    memcpy(r->runs, pl->runs, pl->n_runs * sizeof *r->runs);
    r->n_runs = pl->n_runs;
    return r;
}

void gp_record_free(gp_offloader *o, gp_record *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_pieces; i++) {
        gp_piece_host_free(o, &r->pieces[i]);
        free(r->pieces[i].chunks);
    }
    free(r->runs);
    free(r->pieces);
    free(r);
}

/* ------------------------------------------------------------- its life */

static const char *const gp_state_names[GP_REC_STATES + 1] = {"new",       "offloaded", "prefetching",
                                                              "restoring", "clean",     "freed"};

/* A transition the life does not have: memory about to be lost, restored
 * twice or freed under someone; nothing can be trusted after it. */
static void gp_record_refuse(const gp_record *r, gp_record_state to)
{
    fprintf(stderr, "gpupool: internal error: offload record %p moved from %s to %s\n", (const void *)r,
            r->state < GP_REC_STATES ? gp_state_names[r->state] : "?", gp_state_names[to]);
    abort();
}

void gp_record_move(gp_offloader *o, gp_record *r, gp_record_state from, gp_record_state to)
{
    /* The life: NEW -> OFFLOADED <-> {PREFETCHING, RESTORING} -> CLEAN -> NEW. */
    int legal = from == GP_REC_NEW         ? to == GP_REC_OFFLOADED
                : from == GP_REC_OFFLOADED ? to == GP_REC_PREFETCHING || to == GP_REC_RESTORING
                : from == GP_REC_CLEAN     ? to == GP_REC_NEW
                                           : to == GP_REC_OFFLOADED || to == GP_REC_CLEAN;
    if (r->state != from || !legal) gp_record_refuse(r, to);
    r->state = to;
    pthread_cond_broadcast(&o->cond);
}

/* Add (sign 1) or take out (-1) r's figures (o->lock is held). */
static void gp_record_count(gp_offloader *o, const gp_record *r, int sign)
{
    uint64_t s = (uint64_t)(int64_t)sign;
    o->st.host_bytes += s * r->host_bytes;
    for (size_t i = 0; i < r->n_pieces; i++)
        o->st.tag_host_bytes[r->pieces[i].tag] += s * gp_piece_host_bytes(&r->pieces[i]);
}

void gp_record_publish(gp_offloader *o, gp_record *r, int copied_out)
{
    r->copied = r->host_bytes = 0;
    for (size_t i = 0; i < r->n_pieces; i++) {
        r->copied += r->pieces[i].host.ptr ? r->pieces[i].size : 0;
        r->host_bytes += gp_piece_host_bytes(&r->pieces[i]);
    }
    pthread_mutex_lock(&o->lock);
    gp_record_move(o, r, GP_REC_NEW, GP_REC_OFFLOADED);
    r->next = o->records;
    o->records = r;
    o->st.n_offload++;
    o->st.bytes_out += copied_out ? r->copied : 0;
    gp_record_count(o, r, 1);
    pthread_mutex_unlock(&o->lock);
}

/* Whether restored record r keeps its host copy (o->lock is held): every
 * piece has one (checked on the way back where its block is still live;
 * one freed meanwhile is for the next offload's sums to refuse), and its
 * first tag's copy was not found written in its last GP_CLEAN_SKIP
 * restores.  A swap's goes:
 * a whole process's memory, back for good. */
static int gp_record_cleanable(gp_offloader *o, const gp_record *r)
{
    if (r->dropped || r->lost || r->swap) return 0;
    for (size_t i = 0; i < r->n_pieces; i++)
        if (!r->pieces[i].host.ptr || !r->pieces[i].summed) return 0;
    gp_reg *g = &o->reg[r->tags[0]];
    if (!g->clean_skip) return 1;
    g->clean_skip--;
    return 0;
}

/* Take q out of the clean list (o->lock is held). */
static void gp_clean_unlink(gp_offloader *o, gp_record *q)
{
    if (q->state != GP_REC_CLEAN) gp_record_refuse(q, GP_REC_STATES);
    for (gp_record **pp = &o->clean; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    q->next = NULL;
    o->st.clean_bytes -= q->host_bytes;
}

/* Take the clean records that share a tag with tags[0..n) off the list
 * (o->lock is held) and return them: those tags' memory has a newer copy
 * or is about to get one, and a copy nothing can take again held its room
 * for ever. */
static gp_record *gp_clean_unlink_tags(gp_offloader *o, const gp_tag *tags, unsigned n)
{
    gp_tagset set = {{0}};
    for (unsigned k = 0; k < n; k++) gp_tagset_add(&set, tags[k]);
    gp_record *out = NULL, *next;
    for (gp_record *q = o->clean; q; q = next) {
        next = q->next;
        int shares = 0;
        for (unsigned i = 0; i < q->n_tags && !shares; i++) shares = gp_tagset_has(&set, q->tags[i]);
        if (!shares) continue;
        gp_clean_unlink(o, q);
        q->next = out;
        out = q;
    }
    return out;
}

static void gp_records_free(gp_offloader *o, gp_record *list)
{
    while (list) {
        gp_record *next = list->next;
        gp_record_free(o, list);
        list = next;
    }
}

void gp_record_retire(gp_offloader *o, gp_record *r)
{
    pthread_mutex_lock(&o->lock);
    if (r->state != GP_REC_RESTORING && r->state != GP_REC_PREFETCHING) gp_record_refuse(r, GP_REC_STATES);
    for (gp_record **pp = &o->records; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    o->st.n_restore++;
    o->st.bytes_in += r->copied;
    gp_record_count(o, r, -1);
    gp_record *stale = gp_clean_unlink_tags(o, r->tags, r->n_tags);
    int keep = gp_record_cleanable(o, r);
    if (keep) {
        gp_record_move(o, r, r->state, GP_REC_CLEAN);
        r->next = o->clean;
        o->clean = r;
        o->st.clean_bytes += r->host_bytes;
    }
    pthread_cond_broadcast(&o->cond);
    pthread_mutex_unlock(&o->lock);
    gp_records_free(o, stale);
    if (!keep) gp_record_free(o, r);
}

/* ------------------------------------------------------ clean host copies */

/* Whether a and b hold the same bytes: their pieces, with neighbours of one
 * tag joined (a raw piece may have been cut to fill a slab's tail), cover
 * the same ranges under the same tags. */
static int gp_same_bytes(const gp_record *a, const gp_record *b)
{
    size_t i = 0, j = 0;
    while (i < a->n_pieces && j < b->n_pieces) {
        const gp_piece *pa = &a->pieces[i++], *pb = &b->pieces[j++];
        uintptr_t ea = pa->addr + pa->size, eb = pb->addr + pb->size;
        while (i < a->n_pieces && a->pieces[i].addr == ea && a->pieces[i].tag == pa->tag) ea += a->pieces[i++].size;
        while (j < b->n_pieces && b->pieces[j].addr == eb && b->pieces[j].tag == pb->tag) eb += b->pieces[j++].size;
        if (pa->addr != pb->addr || ea != eb || pa->tag != pb->tag) return 0;
    }
    return i == a->n_pieces && j == b->n_pieces;
}

gp_record *gp_clean_find(gp_offloader *o, const gp_record *r)
{
    gp_record *found = NULL, *stale = NULL;
    pthread_mutex_lock(&o->lock);
    for (gp_record *q = o->clean; q && !found; q = q->next)
        if (q->n_tags == r->n_tags && !memcmp(q->tags, r->tags, r->n_tags * sizeof *r->tags) &&
            q->n_runs == r->n_runs && !memcmp(q->runs, r->runs, r->n_runs * sizeof *r->runs) && gp_same_bytes(q, r))
            found = q;
    if (!found) stale = gp_clean_unlink_tags(o, r->tags, r->n_tags);
    pthread_mutex_unlock(&o->lock);
    gp_records_free(o, stale);
    return found;
}

uint64_t gp_clean_bytes(gp_offloader *o)
{
    pthread_mutex_lock(&o->lock);
    uint64_t n = o->st.clean_bytes;
    pthread_mutex_unlock(&o->lock);
    return n;
}

void gp_clean_take(gp_offloader *o, gp_record *q)
{
    pthread_mutex_lock(&o->lock);
    gp_clean_unlink(o, q);
    gp_record_move(o, q, GP_REC_CLEAN, GP_REC_NEW);
    o->st.n_clean++;
    pthread_mutex_unlock(&o->lock);
}

void gp_clean_drop(gp_offloader *o, gp_record *q, int written)
{
    pthread_mutex_lock(&o->lock);
    gp_clean_unlink(o, q);
    if (written) o->reg[q->tags[0]].clean_skip = GP_CLEAN_SKIP;
    pthread_mutex_unlock(&o->lock);
    gp_record_free(o, q);
}

void gp_clean_room(gp_offloader *o, uint64_t room)
{
    for (;;) {
        gp_record *oldest = NULL;
        pthread_mutex_lock(&o->lock);
        for (gp_record *q = o->clean; q; q = q->next) oldest = q;
        pthread_mutex_unlock(&o->lock);
        if (!oldest || gp_pinned_room(o->hs) >= room) return;
        gp_clean_drop(o, oldest, 0);
    }
}

/* ---------------------------------------------------------- what is wanted */

gp_status gp_want_of(gp_offloader *o, const gp_tag *tags, size_t n, gp_want *w)
{
    memset(w, 0, sizeof *w);
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        gp_tagset_add(&w->tags, tags[i]);
        gp_tag_stats ts;
        gp_pool_tag_stats(o->pool, tags[i], &ts);
        any |= ts.offloaded != 0;
    }
    /* (Only when the pool has offloaded bytes of them: the walk is over
     * every block, and the hooks ask for a restore before each use.) */
    return any ? gp_pool_offloaded_blocks(o->pool, tags, n, &w->blocks, &w->n_blocks) : GP_OK;
}

void gp_want_free(gp_want *w)
{
    free(w->blocks);
    w->blocks = NULL;
}

int gp_record_wanted(const gp_record *r, const gp_want *w)
{
    for (unsigned i = 0; i < r->n_tags; i++)
        if (gp_tagset_has(&w->tags, r->tags[i])) return 1;
    for (size_t i = 0; i < r->n_runs; i++) {
        /* The first block ending after the run's start. */
        size_t lo = 0, hi = w->n_blocks;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (w->blocks[mid].addr + w->blocks[mid].size <= r->runs[i].addr) lo = mid + 1;
            else hi = mid;
        }
        if (lo < w->n_blocks && w->blocks[lo].addr < r->runs[i].addr + r->runs[i].size) return 1;
    }
    return 0;
}

void gp_keep_of(const gp_record *r, const gp_want *w, gp_tagset *keep)
{
    *keep = w ? w->tags : (gp_tagset){{0}};
    for (unsigned i = 0; i < r->n_tags; i++) gp_tagset_add(keep, r->tags[i]);
    for (size_t i = 0; i < r->n_pieces; i++) gp_tagset_add(keep, r->pieces[i].tag);
}

const char *gp_tags_text(const gp_record *r, char *buf, size_t len)
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

/* ------------------------------------------------------- integrity check */

typedef struct gp_ocheck {
    char *msg;
    size_t n, found;
} gp_ocheck;

static void gp_bad(gp_ocheck *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void gp_bad(gp_ocheck *c, const char *fmt, ...)
{
    if (!c->found++ && c->n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, c->n, fmt, ap);
        va_end(ap);
    }
}

static int gp_extent_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const gp_extent *)a)->ptr, y = (uintptr_t)((const gp_extent *)b)->ptr;
    return (x > y) - (x < y);
}

/* One record of the records (clean 0) or of the clean list (1) against
 * itself and the pool (a clean one's runs are the pool's again, its host
 * bytes no tag's); its extents go to ext[*n_ext..]. */
static void gp_check_record(gp_offloader *o, const gp_record *r, int clean, gp_ocheck *c, gp_extent *ext,
                            size_t *n_ext, uint64_t *tag_bytes)
{
    if (clean ? r->state != GP_REC_CLEAN
              : r->state != GP_REC_OFFLOADED && r->state != GP_REC_PREFETCHING && r->state != GP_REC_RESTORING)
        gp_bad(c, "record %p is on the %s list in state %d", (const void *)r, clean ? "clean" : "records'",
               (int)r->state);
    gp_tagset seen = {{0}};
    for (unsigned i = 0; i < r->n_tags; i++) {
        if (r->tags[i] >= GP_MAX_TAGS || gp_tagset_has(&seen, r->tags[i])) {
            gp_bad(c, "record %p: tag %u at %u is out of range or named twice", (const void *)r,
                   (unsigned)r->tags[i], i);
            break;
        }
        gp_tagset_add(&seen, r->tags[i]);
    }
    if (!r->n_tags) gp_bad(c, "record %p has no tag", (const void *)r);
    uint64_t released = 0, host = 0, copied = 0, lost = 0;
    for (size_t i = 0; i < r->n_runs; i++) {
        const gp_offload_run *run = &r->runs[i];
        released += run->size;
        if (i && run->addr < r->runs[i - 1].addr + r->runs[i - 1].size)
            gp_bad(c, "record %p: run %zu at 0x%" PRIxPTR " overlaps or precedes the one before", (const void *)r, i,
                   run->addr);
        if (!clean && gp_pool_run_check(o->pool, run) != GP_OK) {
            gp_bad(c, "record %p: %s", (const void *)r, gp_last_error());
            gp_error_clear();
        }
    }
    if (released != r->released)
        gp_bad(c, "record %p: its runs hold %" PRIu64 " bytes, it says %" PRIu64, (const void *)r, released,
               r->released);
    size_t run = 0;
    for (size_t i = 0; i < r->n_pieces; i++) {
        const gp_piece *p = &r->pieces[i];
        while (run < r->n_runs && r->runs[run].addr + r->runs[run].size <= p->addr) run++;
        if (!p->size || run == r->n_runs || p->addr < r->runs[run].addr ||
            p->addr + p->size > r->runs[run].addr + r->runs[run].size)
            gp_bad(c, "record %p: piece %zu (0x%" PRIxPTR "+%" PRIu64 ") lies in none of its runs", (const void *)r, i,
                   p->addr, p->size);
        if (i && p->addr < r->pieces[i - 1].addr + r->pieces[i - 1].size)
            gp_bad(c, "record %p: piece %zu overlaps the one before", (const void *)r, i);
        if (p->tag >= gp_tag_count()) gp_bad(c, "record %p: piece %zu has tag %u", (const void *)r, i, p->tag);
        else if (!clean) tag_bytes[p->tag] += gp_piece_host_bytes(p);
        if (r->dropped && (p->host.ptr || p->host2.ptr))
            gp_bad(c, "record %p dropped its contents, but piece %zu has host bytes", (const void *)r, i);
        if (!p->host.ptr && p->host2.ptr) gp_bad(c, "record %p: piece %zu has a second extent only", (const void *)r, i);
        if (p->host.ptr) {
            copied += p->size;
            if (!p->summed) gp_bad(c, "record %p: stored piece %zu has no checksum", (const void *)r, i);
            if (gp_piece_host_bytes(p) < p->stored || (!p->chunks && p->stored != p->size))
                gp_bad(c, "record %p: piece %zu stores %" PRIu64 " bytes of %" PRIu64 " in %" PRIu64,
                       (const void *)r, i, p->stored, p->size, gp_piece_host_bytes(p));
            if (!p->chunks != !r->codec || (p->chunks && p->n_chunks != gp_codec_chunks(r->codec, p->size)))
                gp_bad(c, "record %p: piece %zu's chunk table does not match the record's codec", (const void *)r, i);
        }
        if (!r->dropped && !p->host.ptr) lost += p->size;
        for (int k = 0; k < 2; k++) {
            const gp_extent *e = k ? &p->host2 : &p->host;
            if (e->ptr) ext[(*n_ext)++] = *e;
        }
        host += gp_piece_host_bytes(p);
    }
    if (lost != r->lost)
        gp_bad(c, "record %p: its pieces without a host copy hold %" PRIu64 " bytes, it lost %" PRIu64,
               (const void *)r, lost, r->lost);
    if (host != r->host_bytes || copied != r->copied)
        gp_bad(c, "record %p: its pieces hold %" PRIu64 " host bytes and copied %" PRIu64 ", it says %" PRIu64
               " and %" PRIu64, (const void *)r, host, copied, r->host_bytes, r->copied);
}

size_t gp_offload_check(gp_offloader *o, char *msg, size_t n)
{
    gp_ocheck c = {.msg = msg, .n = n};
    if (n) msg[0] = '\0';
    char saved[512];
    snprintf(saved, sizeof saved, "%s", gp_last_error());
    uint64_t *tag_bytes = calloc(GP_MAX_TAGS, sizeof *tag_bytes);
    pthread_mutex_lock(&o->op); /* (between operations: nothing reserved, no record half made) */
    pthread_mutex_lock(&o->lock);
    size_t n_ext = 0;
    for (int l = 0; l < 2; l++)
        for (const gp_record *r = l ? o->clean : o->records; r; r = r->next) n_ext += 2 * r->n_pieces;
    gp_extent *ext = malloc((n_ext ? n_ext : 1) * sizeof *ext);
    if (!tag_bytes || !ext) {
        gp_bad(&c, "out of host memory for the offloader's check");
        goto out;
    }
    n_ext = 0;
    uint64_t host = 0;
    for (const gp_record *r = o->records; r; r = r->next) {
        gp_check_record(o, r, 0, &c, ext, &n_ext, tag_bytes);
        host += r->host_bytes;
        for (const gp_record *q = o->records; q != r; q = q->next)
            for (size_t i = 0; i < r->n_runs && q->n_runs; i++)
                for (size_t j = 0; j < q->n_runs; j++)
                    if (r->runs[i].addr < q->runs[j].addr + q->runs[j].size &&
                        q->runs[j].addr < r->runs[i].addr + r->runs[i].size)
                        gp_bad(&c, "records %p and %p share memory at 0x%" PRIxPTR, (const void *)r, (const void *)q,
                               r->runs[i].addr);
    }
    if (host != o->st.host_bytes)
        gp_bad(&c, "the records hold %" PRIu64 " host bytes, the figures say %" PRIu64, host, o->st.host_bytes);
    uint64_t clean = 0;
    for (const gp_record *r = o->clean; r; r = r->next) {
        gp_check_record(o, r, 1, &c, ext, &n_ext, tag_bytes);
        clean += r->host_bytes;
    }
    if (clean != o->st.clean_bytes)
        gp_bad(&c, "the clean records hold %" PRIu64 " host bytes, the figures say %" PRIu64, clean,
               o->st.clean_bytes);
    for (unsigned t = 0; t < GP_MAX_TAGS; t++)
        if (tag_bytes[t] != o->st.tag_host_bytes[t])
            gp_bad(&c, "tag %u: the records hold %" PRIu64 " host bytes, the figures say %" PRIu64, t, tag_bytes[t],
                   o->st.tag_host_bytes[t]);
    /* Every offloaded block lies in a record's run: one outside any is
     * memory nobody can bring back. */
    gp_offload_range *blocks = NULL;
    size_t n_blocks = 0;
    if (gp_pool_offloaded_blocks(o->pool, NULL, 0, &blocks, &n_blocks) != GP_OK) {
        gp_bad(&c, "%s", gp_last_error());
    } else {
        for (size_t i = 0; i < n_blocks; i++) {
            int in = 0;
            for (const gp_record *r = o->records; r && !in; r = r->next)
                for (size_t k = 0; k < r->n_runs && !in; k++)
                    in = blocks[i].addr < r->runs[k].addr + r->runs[k].size &&
                         r->runs[k].addr < blocks[i].addr + blocks[i].size;
            if (!in)
                gp_bad(&c, "the offloaded block at 0x%" PRIxPTR " of %" PRIu64 " bytes is in no record", blocks[i].addr,
                       blocks[i].size);
        }
        free(blocks);
    }
    qsort(ext, n_ext, sizeof *ext, gp_extent_cmp);
    char sm[256];
    if (gp_pinned_check(o->hs, ext, n_ext, sm, sizeof sm)) gp_bad(&c, "host store: %s", sm);
out:
    pthread_mutex_unlock(&o->lock);
    pthread_mutex_unlock(&o->op);
    free(ext);
    free(tag_bytes);
    gp_error_set(GP_OK, "%s", saved); /* (the caller's message survives) */
    return c.found;
}
