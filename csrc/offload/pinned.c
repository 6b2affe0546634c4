/*
 * pinned.c -- pinned host slabs and the extents in them (pinned.h).
 *
 * Each slab keeps its free space as an address-ordered array of holes;
 * alloc takes the first hole that fits (lowest slab first), free puts the
 * extent back and merges it with the holes beside it.  Offloads are few and
 * their extents large (MiBs), so the arrays stay short.
 *
 * A slab is added mapped but not pinned (hostmem.c), so that extents can
 * be handed out at once, and queued to the store's pinning threads; a
 * copy into an extent waits for its slab (gp_pinned_ready), and pins it
 * itself if no thread has started on it.  So an offload's slabs are
 * pinned on several threads while the first ones are already copied into,
 * and slabs asked for ahead (gp_pinned_prepare) are pinned with nobody
 * waiting.  No lock is held while pinning.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "hostmem.h"
#include "pinned.h"
#include "util.h"
#include "workq.h"

#define GP_EXTENT_ALIGN 16u

typedef struct gp_hole {
    uint64_t off, size;
} gp_hole;

/* A slab's pinning: queued to the pinning threads, pinned by one of them
 * or by a copy that needs it, ready; or not pinned (its job failed, could
 * not be queued, or was cancelled): the next copy into it pins it. */
typedef enum gp_slab_state {
    GP_SLAB_QUEUED,
    GP_SLAB_PINNING,
    GP_SLAB_READY,
    GP_SLAB_UNPINNED
} gp_slab_state;

typedef struct gp_slab {
    char *base;
    gp_hole *holes;
    size_t n_holes, cap_holes;
    uint64_t free;
    gp_slab_state state;
} gp_slab;

struct gp_pinned {
    pthread_mutex_t lock;
    pthread_cond_t cond;  /* a slab's pinning ended */
    gp_backend *be;
    uint64_t limit, slab_size;
    gp_slab *slabs;       /* (moves when it grows: threads name a slab by index) */
    size_t n_slabs, cap_slabs;
    uint64_t used, reserved;
    uint64_t n_pin, n_pin_late;
    double pin_seconds;
    unsigned threads;
    gp_workq *pinq;       /* the pinning threads                          */
    gp_batch pins;        /* their jobs (never waited for: destroy joins) */
    int stop;             /* destroy: queued jobs pin nothing             */
};

/* A pinning job: slab k of hs. */
typedef struct gp_pin_job {
    gp_pinned *hs;
    size_t k;
} gp_pin_job;

static uint64_t gp_align16(uint64_t x) { return (x + GP_EXTENT_ALIGN - 1) & ~(uint64_t)(GP_EXTENT_ALIGN - 1); }

gp_status gp_pinned_create(gp_backend *be, uint64_t limit, uint64_t slab, unsigned threads, gp_pinned **out)
{
    *out = NULL;
    if (slab < GP_HOSTMEM_ALIGN || slab % GP_HOSTMEM_ALIGN)
        return gp_error_set(GP_ERR_INVALID, "gpupool: host slab of %llu bytes: a multiple of 2 MiB (a huge page)",
                            (unsigned long long)slab);
    gp_pinned *hs = calloc(1, sizeof *hs);
    if (!hs) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the host store");
    pthread_mutex_init(&hs->lock, NULL);
    pthread_cond_init(&hs->cond, NULL);
    gp_batch_init(&hs->pins);
    hs->be = be;
    hs->limit = limit;
    hs->slab_size = slab;
    hs->threads = threads ? threads : 1;
    gp_status st = gp_workq_create("gpupool-pin", hs->threads, &hs->pinq);
    if (st != GP_OK) {
        gp_pinned_destroy(hs);
        return st;
    }
    *out = hs;
    return GP_OK;
}

void gp_pinned_destroy(gp_pinned *hs)
{
    if (!hs) return;
    /* Cancel: the jobs not started pin nothing; those pinning finish their
     * slab (a few ms), then the threads are joined. */
    pthread_mutex_lock(&hs->lock);
    hs->stop = 1;
    pthread_mutex_unlock(&hs->lock);
    gp_workq_destroy(hs->pinq);
    for (size_t i = 0; i < hs->n_slabs; i++) {
        if (hs->slabs[i].state == GP_SLAB_READY) gp_hostmem_unpin(hs->be, hs->slabs[i].base, hs->slab_size);
        gp_hostmem_unmap(hs->slabs[i].base, hs->slab_size);
        free(hs->slabs[i].holes);
    }
    free(hs->slabs);
    gp_batch_destroy(&hs->pins);
    pthread_cond_destroy(&hs->cond);
    pthread_mutex_destroy(&hs->lock);
    free(hs);
}

/* Pin slab k, whose state this thread set to PINNING (from QUEUED or
 * UNPINNED, under the lock: no other thread pins it then), with the lock
 * released (pinning takes milliseconds per slab), and say how it went. */
static gp_status gp_slab_pin(gp_pinned *hs, size_t k)
{
    char *base = hs->slabs[k].base;
    pthread_mutex_unlock(&hs->lock);
    double t0 = gp_now();
    gp_status st = gp_hostmem_pin(hs->be, base, hs->slab_size);
    double dt = gp_now() - t0;
    pthread_mutex_lock(&hs->lock);
    /* (Re-read after retaking the lock: the array may have moved.) */
    hs->slabs[k].state = st == GP_OK ? GP_SLAB_READY : GP_SLAB_UNPINNED;
    if (st == GP_OK) hs->n_pin++;
    hs->pin_seconds += dt;
    pthread_cond_broadcast(&hs->cond);
    return st;
}

/* The pinning threads yield the CPU to computing ones: pinning ahead runs
 * while this process or another trains, and their launch threads slowed
 * by it slow their GPU work (a copy that needs a slab pins it itself, at
 * its own priority).  Best effort: a refusal leaves the thread as it is. */
#define GP_PIN_NICE 10

static void gp_pin_thread_background(void)
{
    static _Thread_local int done;
    if (done) return;
    done = 1;
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), GP_PIN_NICE);
}

static gp_status gp_pin_job_run(void *arg)
{
    gp_pin_job *j = arg;
    gp_pin_thread_background();
    gp_pinned *hs = j->hs;
    size_t k = j->k;
    free(j);
    pthread_mutex_lock(&hs->lock);
    if (hs->slabs[k].state == GP_SLAB_QUEUED) {
        if (hs->stop) {
            hs->slabs[k].state = GP_SLAB_UNPINNED;
        } else {
            hs->slabs[k].state = GP_SLAB_PINNING;
            /* A failure leaves it unpinned: the copy that needs it pins it
             * and, if that fails too, fails with its own words. */
            if (gp_slab_pin(hs, k) != GP_OK) gp_error_clear();
        }
    }
    pthread_mutex_unlock(&hs->lock);
    return GP_OK;
}

/* Queue slab k to the pinning threads (the lock is held); where no job
 * can be queued it stays unpinned, for the first copy into it. */
static void gp_slab_queue(gp_pinned *hs, size_t k)
{
    gp_pin_job *j = malloc(sizeof *j);
    hs->slabs[k].state = GP_SLAB_UNPINNED;
    if (!j) return;
    *j = (gp_pin_job){hs, k};
    hs->slabs[k].state = GP_SLAB_QUEUED;
    if (gp_workq_push(hs->pinq, &hs->pins, gp_pin_job_run, j) != GP_OK) {
        gp_error_clear();
        hs->slabs[k].state = GP_SLAB_UNPINNED;
        free(j);
    }
}

gp_status gp_pinned_ready(gp_pinned *hs, const gp_extent *e)
{
    if (!e->ptr) return GP_OK;
    gp_status st = GP_OK;
    pthread_mutex_lock(&hs->lock);
    for (int tries = 0;;) {
        gp_slab_state s = hs->slabs[e->slab].state;
        if (s == GP_SLAB_READY) break;
        if (s == GP_SLAB_PINNING) {
            pthread_cond_wait(&hs->cond, &hs->lock);
            continue;
        }
        /* Queued and not started, or not pinned: this thread pins it
         * rather than wait (the job finds it taken); twice, as the
         * background thread it stands in for would have left a refusal
         * to the copy. */
        hs->slabs[e->slab].state = GP_SLAB_PINNING;
        if (!tries) hs->n_pin_late++;
        if ((st = gp_slab_pin(hs, e->slab)) != GP_OK && ++tries == 2) break;
        if (st != GP_OK) gp_error_clear();
    }
    pthread_mutex_unlock(&hs->lock);
    return st;
}

static uint64_t gp_free_locked(const gp_pinned *hs)
{
    uint64_t f = 0;
    for (size_t i = 0; i < hs->n_slabs; i++) f += hs->slabs[i].free;
    return f;
}

/* One more slab, mapped and queued to be pinned (the lock is held: the
 * mapping is quick, the pinning is the threads'). */
static gp_status gp_add_slab(gp_pinned *hs)
{
    if (hs->limit && (hs->n_slabs + 1) * hs->slab_size > hs->limit)
        return gp_error_set(GP_ERR_LIMIT, "gpupool: the host limit (GPUPOOL_HOST_LIMIT) of %llu bytes is reached: "
                            "%llu bytes of pinned slabs are held, %llu in use",
                            (unsigned long long)hs->limit, (unsigned long long)(hs->n_slabs * hs->slab_size),
                            (unsigned long long)hs->used);
    gp_slab *ns = gp_array_room(hs->slabs, &hs->cap_slabs, hs->n_slabs, sizeof *ns, 8);
    if (!ns) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the host store");
    hs->slabs = ns;
    gp_slab *s = &hs->slabs[hs->n_slabs];
    memset(s, 0, sizeof *s);
    if (!(s->holes = malloc(4 * sizeof *s->holes)))
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the host store");
    s->cap_holes = 4;
    gp_status st = gp_hostmem_map(hs->slab_size, (void **)&s->base);
    if (st != GP_OK) {
        free(s->holes);
        return st;
    }
    s->holes[0] = (gp_hole){0, hs->slab_size};
    s->n_holes = 1;
    s->free = hs->slab_size;
    gp_slab_queue(hs, hs->n_slabs++);
    return GP_OK;
}

/* Slabs until `free` bytes are free in them, within the limit (the lock
 * is held); what the limit refuses is not an error here. */
static void gp_add_slabs(gp_pinned *hs, uint64_t free)
{
    while (gp_free_locked(hs) < free)
        if (gp_add_slab(hs) != GP_OK) {
            gp_error_clear();
            break;
        }
}

gp_status gp_pinned_reserve(gp_pinned *hs, uint64_t bytes)
{
    pthread_mutex_lock(&hs->lock);
    gp_status st = GP_OK;
    uint64_t want = hs->reserved + bytes;
    if (hs->limit && hs->used + want > hs->limit)
        st = gp_error_set(GP_ERR_LIMIT, "gpupool: offloading %llu more bytes would pass the host limit "
                          "(GPUPOOL_HOST_LIMIT) of %llu bytes: %llu are held by offloaded memory",
                          (unsigned long long)bytes, (unsigned long long)hs->limit, (unsigned long long)hs->used);
    if (st == GP_OK) hs->reserved = want;
    pthread_mutex_unlock(&hs->lock);
    return st;
}

void gp_pinned_settle(gp_pinned *hs, uint64_t bytes)
{
    pthread_mutex_lock(&hs->lock);
    hs->reserved = bytes > hs->reserved ? 0 : hs->reserved - bytes;
    pthread_mutex_unlock(&hs->lock);
}

static void gp_hole_remove(gp_slab *s, size_t i)
{
    memmove(&s->holes[i], &s->holes[i + 1], (s->n_holes - i - 1) * sizeof *s->holes);
    s->n_holes--;
}

/* Give [off, off+size) of slab s back, merged with its neighbours. */
static gp_status gp_hole_insert(gp_slab *s, uint64_t off, uint64_t size)
{
    size_t i = 0;
    while (i < s->n_holes && s->holes[i].off < off) i++;
    int prev = i > 0 && s->holes[i - 1].off + s->holes[i - 1].size == off;
    int next = i < s->n_holes && off + size == s->holes[i].off;
    s->free += size;
    if (prev && next) {
        s->holes[i - 1].size += size + s->holes[i].size;
        gp_hole_remove(s, i);
    } else if (prev) {
        s->holes[i - 1].size += size;
    } else if (next) {
        s->holes[i].off = off;
        s->holes[i].size += size;
    } else {
        gp_hole *nh = gp_array_room(s->holes, &s->cap_holes, s->n_holes, sizeof *nh, 4);
        if (!nh) {
            s->free -= size; /* lost until the store goes: better than corrupt */
            return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the host store's holes");
        }
        s->holes = nh;
        memmove(&s->holes[i + 1], &s->holes[i], (s->n_holes - i) * sizeof *s->holes);
        s->holes[i] = (gp_hole){off, size};
        s->n_holes++;
    }
    return GP_OK;
}

gp_status gp_pinned_alloc_part(gp_pinned *hs, uint64_t size, uint64_t min, gp_extent *out)
{
    *out = (gp_extent){0};
    uint64_t need = gp_align16(size);
    if (size == 0 || need > hs->slab_size)
        return gp_error_set(GP_ERR_INVALID, "gpupool: host extent of %llu bytes (1 byte to the slab size, %llu)",
                            (unsigned long long)size, (unsigned long long)hs->slab_size);
    uint64_t least = min < size ? gp_align16(min) : need;
    pthread_mutex_lock(&hs->lock);
    gp_status st = GP_OK;
    if (need > hs->reserved) {
        st = gp_error_set(GP_ERR_LIMIT, "gpupool: host extent of %llu bytes beyond the %llu reserved",
                          (unsigned long long)need, (unsigned long long)hs->reserved);
        goto out;
    }
    for (;;) {
        for (size_t k = 0; k < hs->n_slabs; k++) {
            gp_slab *s = &hs->slabs[k];
            for (size_t i = 0; i < s->n_holes; i++) {
                if (s->holes[i].size < least) continue;
                uint64_t take = s->holes[i].size < need ? s->holes[i].size : need;
                *out = (gp_extent){.ptr = s->base + s->holes[i].off, .size = take, .slab = (uint32_t)k};
                s->holes[i].off += take;
                s->holes[i].size -= take;
                if (!s->holes[i].size) gp_hole_remove(s, i);
                s->free -= take;
                hs->used += take;
                hs->reserved -= take;
                goto out;
            }
        }
        /* Free room split into holes too small: one more slab (within the
         * limit) is the price of not compacting. */
        if ((st = gp_add_slab(hs)) != GP_OK) goto out;
        /* And one ahead while the reservation wants more than is free, so
         * that the next slab is pinned while this one is copied into. */
        if (hs->reserved > gp_free_locked(hs)) gp_add_slabs(hs, gp_free_locked(hs) + 1);
    }
out:
    pthread_mutex_unlock(&hs->lock);
    return st;
}

gp_status gp_pinned_alloc(gp_pinned *hs, uint64_t size, gp_extent *out)
{
    return gp_pinned_alloc_part(hs, size, size, out);
}

void gp_pinned_shrink(gp_pinned *hs, gp_extent *e, uint64_t size)
{
    uint64_t keep = gp_align16(size);
    if (!e->ptr || keep >= e->size) return;
    pthread_mutex_lock(&hs->lock);
    gp_slab *s = &hs->slabs[e->slab];
    if (gp_hole_insert(s, (uint64_t)((char *)e->ptr - s->base) + keep, e->size - keep) == GP_OK) {
        hs->used -= e->size - keep;
        hs->reserved += e->size - keep;
    }
    if (keep) e->size = keep;
    else *e = (gp_extent){0};
    pthread_mutex_unlock(&hs->lock);
}

void gp_pinned_free(gp_pinned *hs, gp_extent *e)
{
    if (!e->ptr) return;
    pthread_mutex_lock(&hs->lock);
    gp_slab *s = &hs->slabs[e->slab];
    if (gp_hole_insert(s, (uint64_t)((char *)e->ptr - s->base), e->size) == GP_OK) hs->used -= e->size;
    pthread_mutex_unlock(&hs->lock);
    *e = (gp_extent){0};
}

void gp_pinned_grow_ahead(gp_pinned *hs, uint64_t spare)
{
    pthread_mutex_lock(&hs->lock);
    if (gp_free_locked(hs) + spare < hs->reserved + hs->slab_size) gp_add_slabs(hs, gp_free_locked(hs) + 1);
    pthread_mutex_unlock(&hs->lock);
}

void gp_pinned_ahead(gp_pinned *hs, uint64_t bytes)
{
    pthread_mutex_lock(&hs->lock);
    uint64_t most = 2ull * hs->threads * hs->slab_size;
    if (bytes > most) bytes = most;
    gp_add_slabs(hs, bytes < hs->reserved ? bytes : hs->reserved);
    pthread_mutex_unlock(&hs->lock);
}

void gp_pinned_prepare(gp_pinned *hs, uint64_t bytes, uint64_t spare)
{
    pthread_mutex_lock(&hs->lock);
    gp_add_slabs(hs, hs->reserved + (bytes > spare ? bytes - spare : 0));
    pthread_mutex_unlock(&hs->lock);
}

uint64_t gp_pinned_room(gp_pinned *hs)
{
    pthread_mutex_lock(&hs->lock);
    uint64_t f = gp_free_locked(hs);
    f = f > hs->reserved ? f - hs->reserved : 0;
    pthread_mutex_unlock(&hs->lock);
    return f;
}

void gp_pinned_stats_get(gp_pinned *hs, gp_pinned_stats *out)
{
    pthread_mutex_lock(&hs->lock);
    uint64_t ready = 0, pinning = 0;
    for (size_t i = 0; i < hs->n_slabs; i++) {
        ready += hs->slabs[i].state == GP_SLAB_READY ? hs->slab_size : 0;
        pinning += hs->slabs[i].state == GP_SLAB_QUEUED || hs->slabs[i].state == GP_SLAB_PINNING ? hs->slab_size : 0;
    }
    *out = (gp_pinned_stats){.limit = hs->limit, .slabs = ready, .pinning = pinning,
                             .used = hs->used, .reserved = hs->reserved, .n_pin = hs->n_pin,
                             .n_pin_late = hs->n_pin_late, .pin_seconds = hs->pin_seconds};
    pthread_mutex_unlock(&hs->lock);
}

size_t gp_pinned_check(gp_pinned *hs, const gp_extent *ext, size_t n_ext, char *msg, size_t n)
{
    size_t found = 0;
#define GP_BAD(...)                                                            \
    do {                                                                       \
        if (!found++ && n) snprintf(msg, n, __VA_ARGS__);                      \
    } while (0)
    if (n) msg[0] = '\0';
    pthread_mutex_lock(&hs->lock);
    uint64_t in_ext = 0, holes = 0;
    for (size_t i = 0; i < n_ext; i++) {
        const gp_extent *e = &ext[i];
        const gp_slab *s = e->slab < hs->n_slabs ? &hs->slabs[e->slab] : NULL;
        in_ext += e->size;
        if (!s || (char *)e->ptr < s->base || (char *)e->ptr + e->size > s->base + hs->slab_size || !e->size ||
            (uintptr_t)e->ptr % GP_EXTENT_ALIGN) {
            GP_BAD("extent %p+%" PRIu64 " does not lie aligned in its slab %u", e->ptr, e->size, e->slab);
            continue;
        }
        if (i && (char *)ext[i - 1].ptr + ext[i - 1].size > (char *)e->ptr)
            GP_BAD("extents %p and %p overlap", ext[i - 1].ptr, e->ptr);
        uint64_t off = (uint64_t)((char *)e->ptr - s->base);
        for (size_t h = 0; h < s->n_holes; h++)
            if (s->holes[h].off < off + e->size && off < s->holes[h].off + s->holes[h].size)
                GP_BAD("extent %p+%" PRIu64 " overlaps a free hole of slab %u", e->ptr, e->size, e->slab);
    }
    for (size_t k = 0; k < hs->n_slabs; k++) {
        const gp_slab *s = &hs->slabs[k];
        uint64_t sum = 0;
        for (size_t h = 0; h < s->n_holes; h++) {
            const gp_hole *g = &s->holes[h];
            sum += g->size;
            if (!g->size || g->off + g->size > hs->slab_size ||
                (h && s->holes[h - 1].off + s->holes[h - 1].size >= g->off))
                GP_BAD("slab %zu: hole %zu (%" PRIu64 "+%" PRIu64 ") is empty, outside or not apart", k, h, g->off,
                       g->size);
        }
        if (sum != s->free) GP_BAD("slab %zu: its holes hold %" PRIu64 " bytes, it says %" PRIu64 " free", k, sum, s->free);
        holes += sum;
    }
    if (in_ext != hs->used) GP_BAD("the extents hold %" PRIu64 " bytes, used says %" PRIu64, in_ext, hs->used);
    if (in_ext + holes != hs->n_slabs * hs->slab_size)
        GP_BAD("extents (%" PRIu64 ") and holes (%" PRIu64 ") do not cover the %zu slabs", in_ext, holes, hs->n_slabs);
    if (hs->reserved) GP_BAD("%" PRIu64 " bytes are reserved between offloads", hs->reserved);
    if (hs->limit && hs->n_slabs * hs->slab_size > hs->limit)
        GP_BAD("%zu slabs pass the limit of %" PRIu64 " bytes", hs->n_slabs, hs->limit);
#undef GP_BAD
    pthread_mutex_unlock(&hs->lock);
    return found;
}
