/*
 * pinned.c -- pinned host slabs and the extents in them (pinned.h).
 *
 * Each slab keeps its free space as an address-ordered array of holes;
 * alloc takes the first hole that fits (lowest slab first), free puts the
 * extent back and merges it with the holes beside it.  Offloads are few and
 * their extents large (MiBs), so the arrays stay short.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

#include "pinned.h"
#include "util.h"

#define GP_EXTENT_ALIGN 16u

typedef struct gp_hole {
    uint64_t off, size;
} gp_hole;

typedef struct gp_slab {
    char *base;
    gp_hole *holes;
    size_t n_holes, cap_holes;
    uint64_t free;
} gp_slab;

struct gp_pinned {
    pthread_mutex_t lock;
    gp_backend *be;
    uint64_t limit, slab_size;
    gp_slab *slabs;
    size_t n_slabs, cap_slabs;
    uint64_t used, reserved;
    uint64_t n_pin;
    double pin_seconds;
};

static uint64_t gp_align16(uint64_t x) { return (x + GP_EXTENT_ALIGN - 1) & ~(uint64_t)(GP_EXTENT_ALIGN - 1); }

gp_status gp_pinned_create(gp_backend *be, uint64_t limit, uint64_t slab, gp_pinned **out)
{
    *out = NULL;
    if (slab < (1u << 20) || slab % GP_EXTENT_ALIGN)
        return gp_error_set(GP_ERR_INVALID, "gpupool: host slab of %llu bytes: at least 1 MiB, a multiple of 16",
                            (unsigned long long)slab);
    gp_pinned *hs = calloc(1, sizeof *hs);
    if (!hs) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the host store");
    pthread_mutex_init(&hs->lock, NULL);
    hs->be = be;
    hs->limit = limit;
    hs->slab_size = slab;
    *out = hs;
    return GP_OK;
}

void gp_pinned_destroy(gp_pinned *hs)
{
    if (!hs) return;
    for (size_t i = 0; i < hs->n_slabs; i++) {
        hs->be->host_free(hs->be, hs->slabs[i].base, hs->slab_size);
        free(hs->slabs[i].holes);
    }
    free(hs->slabs);
    pthread_mutex_destroy(&hs->lock);
    free(hs);
}

static uint64_t gp_free_locked(const gp_pinned *hs)
{
    uint64_t f = 0;
    for (size_t i = 0; i < hs->n_slabs; i++) f += hs->slabs[i].free;
    return f;
}

/* Pin one more slab (the lock is held; pinning takes long, but the store
 * is only used by offloads, which are serialised anyway). */
static gp_status gp_add_slab(gp_pinned *hs)
{
    if (hs->limit && (hs->n_slabs + 1) * hs->slab_size > hs->limit)
        return gp_error_set(GP_ERR_LIMIT, "gpupool: the host limit (GPUPOOL_HOST_LIMIT) of %llu bytes is reached: "
                            "%llu bytes of pinned slabs are held, %llu in use",
                            (unsigned long long)hs->limit, (unsigned long long)(hs->n_slabs * hs->slab_size),
                            (unsigned long long)hs->used);
    if (hs->n_slabs == hs->cap_slabs) {
        size_t nc = hs->cap_slabs ? 2 * hs->cap_slabs : 8;
        gp_slab *ns = realloc(hs->slabs, nc * sizeof *ns);
        if (!ns) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the host store");
        hs->slabs = ns;
        hs->cap_slabs = nc;
    }
    gp_slab *s = &hs->slabs[hs->n_slabs];
    memset(s, 0, sizeof *s);
    if (!(s->holes = malloc(4 * sizeof *s->holes)))
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the host store");
    s->cap_holes = 4;
    double t0 = gp_now();
    gp_status st = hs->be->host_alloc(hs->be, hs->slab_size, (void **)&s->base);
    hs->pin_seconds += gp_now() - t0;
    if (st != GP_OK) {
        free(s->holes);
        return st;
    }
    hs->n_pin++;
    s->holes[0] = (gp_hole){0, hs->slab_size};
    s->n_holes = 1;
    s->free = hs->slab_size;
    hs->n_slabs++;
    return GP_OK;
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
        if (s->n_holes == s->cap_holes) {
            gp_hole *nh = realloc(s->holes, 2 * s->cap_holes * sizeof *nh);
            if (!nh) {
                s->free -= size; /* lost until the store goes: better than corrupt */
                return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the host store's holes");
            }
            s->holes = nh;
            s->cap_holes *= 2;
        }
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

void gp_pinned_grow_ahead(gp_pinned *hs)
{
    pthread_mutex_lock(&hs->lock);
    if (gp_free_locked(hs) < hs->reserved + hs->slab_size && gp_add_slab(hs) != GP_OK) gp_error_clear();
    pthread_mutex_unlock(&hs->lock);
}

void gp_pinned_stats_get(gp_pinned *hs, gp_pinned_stats *out)
{
    pthread_mutex_lock(&hs->lock);
    *out = (gp_pinned_stats){.limit = hs->limit, .slabs = hs->n_slabs * hs->slab_size, .used = hs->used,
                                 .reserved = hs->reserved, .n_pin = hs->n_pin, .pin_seconds = hs->pin_seconds};
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
