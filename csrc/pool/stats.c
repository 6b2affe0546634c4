/*
 * stats.c -- what the pool tells about itself: block walks and lookups,
 * statistics by pool, tag and priority, the out-of-memory report, and the
 * history's API (the ring itself is trace.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "util.h"

/* ---------------------------------------------------------------- queries */

void gp_info_of(const gp_pool *p, const gp_block *b, gp_block_info *o)
{
    const gp_gpool *g = NULL;
    if (b->state != GP_BLOCK_FREE_UNMAPPED && p->slot_kind[b->sidx] == GP_SLOT_GPOOL)
        for (unsigned i = 0; i < GP_MAX_GPOOLS && !g; i++)
            if (p->gpools[i].live && p->gpools[i].slot == b->sidx) g = &p->gpools[i];
    *o = (gp_block_info){
        .in_graph_pool = g != NULL, .graph_pool = g ? g->key : 0,
        .addr = b->addr, .size = b->size, .requested = b->requested,
        .stream = b->state == GP_BLOCK_FREE_UNMAPPED ? NULL : p->streams[b->sidx],
        .tag = b->tag, .priority = b->prio, .state = b->state,
        .arena = p->n_arenas == 1 ? GP_ARENA_LARGE : b->arena, .lifetime = b->life,
    };
}

gp_status gp_pool_lookup(gp_pool *p, const void *ptr, gp_block_info *out)
{
    pthread_mutex_lock(&p->lock);
    gp_block *b = gp_hash_find(p, (uintptr_t)ptr);
    if (!b) {
        gp_arena *a = gp_arena_of(p, (uintptr_t)ptr);
        b = a ? gp_block_at(a, (uintptr_t)ptr) : NULL;
        if (b && b->state != GP_BLOCK_USED && b->state != GP_BLOCK_OFFLOADED) b = NULL;
    }
    gp_status st = GP_OK;
    if (b) gp_info_of(p, b, out);
    else st = gp_bad_pointer(p, ptr, "lookup");
    pthread_mutex_unlock(&p->lock);
    return st;
}

void gp_pool_walk(gp_pool *p, gp_block_fn fn, void *arg)
{
    pthread_mutex_lock(&p->lock);
    for (unsigned k = 0; k < p->n_arenas; k++) {
        for (gp_block *b = p->arenas[k].first; b; b = b->next) {
            gp_block_info info;
            gp_info_of(p, b, &info);
            if (fn(arg, &info)) goto out;
        }
    }
out:
    pthread_mutex_unlock(&p->lock);
}

size_t gp_pool_blocks_read(gp_pool *p, gp_block_info *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&p->lock);
    for (unsigned k = 0; k < p->n_arenas; k++)
        for (gp_block *b = p->arenas[k].first; b; b = b->next, n++)
            if (n < max) gp_info_of(p, b, &out[n]);
    pthread_mutex_unlock(&p->lock);
    return n;
}

void gp_scan_locked(gp_pool *p, gp_stats *o)
{
    for (unsigned k = 0; k < p->n_arenas; k++) {
        int in_run = 0;
        for (gp_block *b = p->arenas[k].first; b; b = b->next) {
            int mapped = b->state != GP_BLOCK_FREE_UNMAPPED && b->state != GP_BLOCK_OFFLOADED &&
                         b->state != GP_BLOCK_FREE_OFFLOADED;
            if (mapped && !in_run) o->segments++;
            in_run = mapped;
            if (b->state == GP_BLOCK_FREE) {
                o->free_blocks++;
                if (b->size > o->largest_free) o->largest_free = b->size;
            }
        }
    }
}

uint64_t gp_pool_headroom(gp_pool *p)
{
    if (gp_pool_usable(p) != GP_OK) return 0;
    gp_stats s;
    gp_pool_stats(p, &s, 1);
    uint64_t best = s.largest_free, dev_free = 0, dev_total = 0;
    if (!p->reserve_mode && p->be->mem_info(p->be, &dev_free, &dev_total) == GP_OK) {
        if (s.limit) {
            uint64_t room = s.limit > s.reserved ? s.limit - s.reserved : 0;
            if (room < dev_free) dev_free = room;
        }
        if (dev_free > best) best = dev_free;
    }
    return best;
}

static void gp_stats_locked(gp_pool *p, gp_stats *out, int full)
{
    *out = p->st;
    out->free_bytes = p->st.reserved - p->st.allocated;
    if (full) gp_scan_locked(p, out);
}

void gp_pool_stats(gp_pool *p, gp_stats *out, int full)
{
    pthread_mutex_lock(&p->lock);
    gp_stats_locked(p, out, full);
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_figures(gp_pool *p, gp_figures *out, int full)
{
    pthread_mutex_lock(&p->lock);
    gp_stats_locked(p, &out->pool, full);
    for (unsigned i = 0; i <= GP_PRIO_MAX; i++)
        out->prio[i] = (gp_prio_stats){.allocated = p->prio_alloc[i], .allocated_peak = p->prio_peak[i]};
    out->history_capacity = out->history_len = 0;
    out->history_recorded = 0;
    if (p->trace) gp_trace_info(p->trace, &out->history_capacity, &out->history_len, &out->history_recorded);
    out->n_tags = gp_tag_count();
    memcpy(out->tags, p->tags, out->n_tags * sizeof out->tags[0]);
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_tag_stats(gp_pool *p, gp_tag tag, gp_tag_stats *out)
{
    if (tag >= GP_MAX_TAGS) { memset(out, 0, sizeof *out); return; }
    pthread_mutex_lock(&p->lock);
    *out = p->tags[tag];
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_prio_stats(gp_pool *p, int prio, uint64_t *allocated, uint64_t *peak)
{
    *allocated = *peak = 0;
    if (prio < 0 || prio > GP_PRIO_MAX) return;
    pthread_mutex_lock(&p->lock);
    *allocated = p->prio_alloc[prio];
    *peak = p->prio_peak[prio];
    pthread_mutex_unlock(&p->lock);
}

uint64_t gp_pool_window_peak(gp_pool *p, int reset)
{
    pthread_mutex_lock(&p->lock);
    uint64_t peak = p->window_peak > p->st.allocated ? p->window_peak : p->st.allocated;
    if (reset) p->window_peak = p->st.allocated;
    pthread_mutex_unlock(&p->lock);
    return peak;
}

void gp_pool_reset_peaks(gp_pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->st.allocated_peak = p->st.allocated;
    p->st.requested_peak = p->st.requested;
    p->st.reserved_peak = p->st.reserved;
    p->st.active_blocks_peak = p->st.active_blocks;
    for (unsigned t = 0; t < GP_MAX_TAGS; t++) p->tags[t].allocated_peak = p->tags[t].allocated;
    for (unsigned i = 0; i <= GP_PRIO_MAX; i++) p->prio_peak[i] = p->prio_alloc[i];
    pthread_mutex_unlock(&p->lock);
}
/* ------------------------------------------------------------- OOM report */

void gp_oom_report_locked(gp_pool *p, uint64_t requested, char *buf, size_t len)
{
    gp_stats s = p->st;
    s.largest_free = 0;
    gp_scan_locked(p, &s);
    uint64_t dfree = 0, dtotal = 0;
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32], dev[96];
    /* (a failed call's outputs are not figures) */
    if (p->be->mem_info(p->be, &dfree, &dtotal) == GP_OK)
        snprintf(dev, sizeof dev, "device free %s of %s", gp_fmt_bytes(dfree, b6, sizeof b6),
                 gp_fmt_bytes(dtotal, b7, sizeof b7));
    else
        snprintf(dev, sizeof dev, "device free unknown (its driver did not say)");
    size_t n = (size_t)snprintf(buf, len,
        "gpupool: out of memory on device %d allocating %s (%" PRIu64 " bytes)\n"
        "  allocated %s, reserved %s, largest free block %s, limit %s, %s",
        p->be->device, gp_fmt_bytes(requested, b1, sizeof b1), requested,
        gp_fmt_bytes(s.allocated, b2, sizeof b2), gp_fmt_bytes(s.reserved, b3, sizeof b3),
        gp_fmt_bytes(s.largest_free, b4, sizeof b4),
        s.limit ? gp_fmt_bytes(s.limit, b5, sizeof b5) : "none", dev);
    /* The three biggest tags: where to look first. */
    unsigned top[3] = {GP_MAX_TAGS, GP_MAX_TAGS, GP_MAX_TAGS};
    unsigned nt = gp_tag_count();
    for (unsigned t = 0; t < nt; t++) {
        uint64_t v = p->tags[t].allocated;
        if (!v) continue;
        for (int i = 0; i < 3; i++) {
            if (top[i] == GP_MAX_TAGS || v > p->tags[top[i]].allocated) {
                memmove(&top[i + 1], &top[i], (size_t)(2 - i) * sizeof top[0]);
                top[i] = t;
                break;
            }
        }
    }
    for (int i = 0; i < 3 && top[i] != GP_MAX_TAGS && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s %s", i ? ", " : "\n  top tags: ",
                              gp_tag_name((gp_tag)top[i]),
                              gp_fmt_bytes(p->tags[top[i]].allocated, b1, sizeof b1));
}

size_t gp_pool_oom_report(gp_pool *p, uint64_t requested, char *buf, size_t len)
{
    char tmp[1024];
    pthread_mutex_lock(&p->lock);
    gp_oom_report_locked(p, requested, tmp, sizeof tmp);
    pthread_mutex_unlock(&p->lock);
    if (len) snprintf(buf, len, "%s", tmp);
    return strlen(tmp);
}

size_t gp_pool_last_oom(gp_pool *p, char *buf, size_t len)
{
    pthread_mutex_lock(&p->lock);
    size_t n = strlen(p->last_oom);
    if (len) snprintf(buf, len, "%s", p->last_oom);
    pthread_mutex_unlock(&p->lock);
    return n;
}

/* ---------------------------------------------------------------- history */

gp_status gp_pool_history(gp_pool *p, size_t max_entries, int stacks)
{
    gp_trace *fresh = NULL, *old;
    /* Under the lock: a resize copies the newest events of the old ring.
     * Not a hot path (a malloc and a copy of at most the ring). */
    pthread_mutex_lock(&p->lock);
    if (max_entries) {
        fresh = p->trace ? gp_trace_resized(p->trace, max_entries) : gp_trace_new(max_entries);
        if (!fresh) {
            pthread_mutex_unlock(&p->lock);
            return gp_error_set(GP_ERR_NOMEM,
                                "gpupool: out of host memory for a history of %zu events (%zu bytes each)",
                                max_entries, sizeof(gp_event));
        }
    }
    old = p->trace;
    p->trace = fresh;
    atomic_store_explicit(&p->history_stacks, fresh && stacks, memory_order_relaxed);
    pthread_mutex_unlock(&p->lock);
    gp_trace_free(old);
    return GP_OK;
}

int gp_pool_history_stacks(const gp_pool *p)
{
    return atomic_load_explicit(&p->history_stacks, memory_order_relaxed);
}

void gp_pool_history_info(gp_pool *p, size_t *capacity, size_t *len, uint64_t *recorded)
{
    *capacity = *len = 0;
    *recorded = 0;
    pthread_mutex_lock(&p->lock);
    if (p->trace) gp_trace_info(p->trace, capacity, len, recorded);
    pthread_mutex_unlock(&p->lock);
}

size_t gp_pool_history_read(gp_pool *p, gp_event *out, size_t max)
{
    pthread_mutex_lock(&p->lock);
    size_t n = p->trace ? gp_trace_copy(p->trace, out, max) : 0;
    pthread_mutex_unlock(&p->lock);
    return n;
}

gp_status gp_pool_history_note(gp_pool *p, int action, uintptr_t addr, uint64_t size, gp_tag tag,
                               int priority)
{
    if (action < 0 || action >= GP_EV_COUNT || tag >= GP_MAX_TAGS || priority < 0 || priority > GP_PRIO_MAX)
        return gp_error_set(GP_ERR_INVALID, "gpupool: history note with bad action %d, tag %u or priority %d",
                            action, (unsigned)tag, priority);
    pthread_mutex_lock(&p->lock);
    GP_TRACE(p, action, addr, size, NULL, tag, priority);
    pthread_mutex_unlock(&p->lock);
    return GP_OK;
}
