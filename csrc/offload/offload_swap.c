/*
 * offload_swap.c -- a whole pool out to the host and back (offload.h): what
 * a tenant does when the group swaps it out while it is parked.
 *
 * A swap is one ordinary offload record of all its tags, marked with the
 * swap's id, so that everything an offload promises (checksums, undo, the
 * integrity check) holds for it, and so that a swap in restores what the
 * swap took and nothing the user offloaded before.
 */
#include <stdlib.h>
#include <string.h>

#include "offload_impl.h"

/* Whether a background offload or a prefetch of a record is queued or
 * running (o->lock is held; each job's end and each record's move
 * broadcast o->cond). */
static int gp_queued(const gp_offloader *o)
{
    if (o->n_background || o->n_deferred) return 1;
    for (const gp_record *r = o->records; r; r = r->next)
        if (r->state == GP_REC_PREFETCHING) return 1;
    return 0;
}

/* The tags of the pool with live memory on the device, but the offloader's
 * own (its checksums and staging serve the swap); returns how many.  In
 * *elem_size the dtype hint of most of those bytes (a registered tag's
 * element size, 0 for none): the swap's record compresses with it. */
static size_t gp_swap_tags(gp_offloader *o, gp_tag *tags, unsigned *elem_size)
{
    *elem_size = 0;
    gp_tag own;
    if (gp_tag_intern("gpupool", &own) != GP_OK) own = GP_MAX_TAGS;
    gp_figures *f = malloc(sizeof *f);
    if (!f) return 0;
    gp_pool_figures(o->pool, f, 0);
    /* Live bytes per hint, the first hints seen (a model has few dtypes). */
    enum { HINTS = 8 };
    unsigned hint[HINTS];
    uint64_t bytes[HINTS], most = 0;
    size_t n = 0, k = 0;
    pthread_mutex_lock(&o->lock);
    for (unsigned t = 0; t < f->n_tags; t++) {
        if (t == own || f->tags[t].allocated <= f->tags[t].offloaded) continue;
        tags[n++] = (gp_tag)t;
        size_t j = 0;
        while (j < k && hint[j] != o->reg[t].elem_size) j++;
        if (j == k && k < HINTS) {
            hint[k] = o->reg[t].elem_size;
            bytes[k++] = 0;
        }
        if (j == k) continue;
        bytes[j] += f->tags[t].allocated - f->tags[t].offloaded;
        if (bytes[j] > most) {
            most = bytes[j];
            *elem_size = hint[j];
        }
    }
    pthread_mutex_unlock(&o->lock);
    free(f);
    return n;
}

/* The device bytes of swap `id` that are offloaded (`op` is held). */
static uint64_t gp_swap_away(gp_offloader *o, uint32_t id)
{
    uint64_t away = 0;
    pthread_mutex_lock(&o->lock);
    for (const gp_record *r = o->records; r; r = r->next)
        if (r->swap == id && r->state == GP_REC_OFFLOADED) away += r->released;
    pthread_mutex_unlock(&o->lock);
    return away;
}

/* Restore the records of swap `id` that are offloaded (`op` is held). */
static gp_status gp_swap_back_locked(gp_offloader *o, uint32_t id, gp_offload_result *res)
{
    gp_tagset all;
    memset(&all, 0xff, sizeof all); /* the room was made for it: it displaces nothing */
    for (;;) {
        gp_record *r = NULL;
        pthread_mutex_lock(&o->lock);
        for (gp_record *q = o->records; q && !r; q = q->next)
            if (q->swap == id && q->state == GP_REC_OFFLOADED) r = q;
        if (r) gp_record_move(o, r, GP_REC_OFFLOADED, GP_REC_RESTORING);
        pthread_mutex_unlock(&o->lock);
        if (!r) return GP_OK;
        gp_status st = gp_restore_record_locked(o, r, &all, 0, res);
        if (st != GP_OK) {
            pthread_mutex_lock(&o->lock);
            gp_record_move(o, r, GP_REC_RESTORING, GP_REC_OFFLOADED);
            pthread_mutex_unlock(&o->lock);
            return st;
        }
        gp_record_retire(o, r);
    }
}

gp_status gp_offload_swap_out(gp_offloader *o, const char *codec, uint32_t *id, gp_offload_result *res)
{
    double t0 = gp_now();
    memset(res, 0, sizeof *res);
    *id = 0;
    gp_codec_id kind = GP_CODEC_AUTO;
    gp_status st = gp_pool_in_process(o->pool);
    if (st == GP_OK && codec) st = gp_codec_parse(codec, &kind);
    if (st != GP_OK) return st;
    gp_tag *tags = malloc(GP_MAX_TAGS * sizeof *tags);
    if (!tags) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a swap");
    /* Background offloads first (what they take is theirs to give back),
     * and every prefetch queued: one that ran after the swap out would map
     * memory the tenant gave up, and may displace idle tags to make its
     * room, which the swap in would not bring back.  They run under `op`:
     * waited for without it, and looked for again once it is taken. */
    for (;;) {
        pthread_mutex_lock(&o->lock);
        while (gp_queued(o)) pthread_cond_wait(&o->cond, &o->lock);
        pthread_mutex_unlock(&o->lock);
        /* Every kernel queued on the pool's memory, on any stream, is done
         * before its bytes are read (the tenant launches nothing meanwhile). */
        st = gp_pool_synchronize(o->pool);
        gp_op_lock(o);
        pthread_mutex_lock(&o->lock);
        int queued = gp_queued(o);
        pthread_mutex_unlock(&o->lock);
        if (!queued || st != GP_OK) break;
        gp_op_unlock(o);
    }
    uint32_t me = ++o->swaps ? o->swaps : ++o->swaps;
    gp_offload_opts opts = {.keep = 1, .codec = (int)kind};
    size_t n = st == GP_OK ? gp_swap_tags(o, tags, &opts.elem_size) : 0;
    if (n) {
        /* One record of every tag: blocks of different tags share chunks,
         * which only an offload of both gives back. */
        pthread_mutex_lock(&o->lock);
        const gp_record *before = o->records;
        pthread_mutex_unlock(&o->lock);
        st = gp_offload_locked(o, tags, n, &opts, res);
        if (st == GP_ERR_INVALID && !res->bytes) { /* (its blocks were all freed meanwhile) */
            gp_error_clear();
            st = GP_OK;
        }
        /* The newest record (published under `op`) is the swap's: none when
         * all its blocks were kept, or the offload was undone; one that
         * failed and could not be undone is brought back below (or says
         * what it lost). */
        pthread_mutex_lock(&o->lock);
        if (o->records != before) o->records->swap = me;
        pthread_mutex_unlock(&o->lock);
    }
    if (st != GP_OK) {
        /* Whole or not at all: what it took comes back. */
        char why[512];
        snprintf(why, sizeof why, "%s", gp_last_error());
        gp_offload_result back = {0};
        gp_status st2 = gp_swap_back_locked(o, me, &back);
        memset(res, 0, sizeof *res);
        if (st2 != GP_OK) {
            /* What stays away is the swap's all the same: the caller
             * treats the pool as swapped out (nothing of it may run
             * before gp_offload_swap_in brings it back). */
            *id = me;
            res->released = gp_swap_away(o, me);
        }
        gp_op_unlock(o);
        free(tags);
        if (st2 != GP_OK)
            return gp_error_set(st2, "gpupool: a swap out failed (%s) and restoring what it had taken failed "
                                     "too: %s", why, gp_last_error());
        return gp_error_set(st, "gpupool: the swap out failed and was undone: %s", why);
    }
    /* The codecs' staging too: a tenant swapped out holds next to nothing
     * (a restore takes it again, within the room its swap in waits for). */
    if (o->staging) {
        gp_tag_stats before, after;
        gp_tag own;
        gp_status ts = gp_tag_intern("gpupool", &own);
        if (ts == GP_OK) gp_pool_tag_stats(o->pool, own, &before);
        if (ts == GP_OK && gp_free(o->pool, o->staging) == GP_OK) {
            o->staging = NULL;
            gp_pool_tag_stats(o->pool, own, &after);
            res->released += before.allocated - after.allocated;
        }
    }
    gp_op_unlock(o);
    free(tags);
    *id = me;
    res->seconds = gp_now() - t0;
    return GP_OK;
}

gp_status gp_offload_swap_in(gp_offloader *o, uint32_t id, gp_offload_result *res)
{
    double t0 = gp_now();
    memset(res, 0, sizeof *res);
    gp_status st = gp_pool_in_process(o->pool);
    if (st != GP_OK) return st;
    if (!id) return gp_error_set(GP_ERR_INVALID, "gpupool: swap id 0 is no swap");
    gp_op_lock(o);
    st = gp_swap_back_locked(o, id, res);
    gp_op_unlock(o);
    res->seconds = gp_now() - t0;
    return st;
}

void gp_offload_prepare(gp_offloader *o, uint64_t bytes)
{
    gp_pinned_prepare(o->hs, bytes, gp_clean_bytes(o));
}
