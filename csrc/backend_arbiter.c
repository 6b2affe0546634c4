/*
 * backend_arbiter.c -- a backend adaptor that puts a device's mappings under
 * its tenant group's registry (arbiter.h): map() takes the bytes from the
 * registry before the device maps them, unmap() gives them back, mem_info()
 * answers as the group sees the device.  One concern per adaptor, as RMM
 * stacks its resource adaptors: the pool above needs no change, since a map
 * the registry refuses is the GP_ERR_OOM of a full device.
 */
#include <stdlib.h>

#include "arbiter.h"
#include "error.h"

typedef struct arb_backend {
    gp_backend be; /* first: the pool sees only this */
    gp_backend *inner;
    gp_arbiter *a;
} arb_backend;

#define ARB(be) ((arb_backend *)(be))
#define IN(be) (ARB(be)->inner)

static gp_status arb_map(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle)
{
    gp_status st = gp_arbiter_take(ARB(be)->a, size, IN(be));
    if (st != GP_OK) return st;
    if ((st = IN(be)->map(IN(be), addr, size, handle)) != GP_OK) gp_arbiter_give(ARB(be)->a, size);
    return st;
}

static gp_status arb_unmap(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t handle)
{
    gp_status st = IN(be)->unmap(IN(be), addr, size, handle);
    if (st == GP_OK) gp_arbiter_give(ARB(be)->a, size);
    return st;
}

static gp_status arb_mem_info(gp_backend *be, uint64_t *free_b, uint64_t *total_b)
{
    uint64_t f, t, limit, avail;
    gp_status st = IN(be)->mem_info(IN(be), &f, &t);
    if (st != GP_OK) return st;
    gp_arbiter_view(ARB(be)->a, &limit, &avail);
    *free_b = f < avail ? f : avail;
    *total_b = be->total;
    return GP_OK;
}

static void arb_destroy(gp_backend *be)
{
    gp_arbiter_close(ARB(be)->a);
    IN(be)->destroy(IN(be));
    free(be);
}

/* Everything else is the device's own. */
static gp_status arb_reserve(gp_backend *be, uint64_t size, uint64_t align, uintptr_t *base)
{
    return IN(be)->reserve(IN(be), size, align, base);
}
static void arb_unreserve(gp_backend *be, uintptr_t base, uint64_t size)
{
    IN(be)->unreserve(IN(be), base, size);
}
static gp_status arb_stream_wait(gp_backend *be, gp_stream waiter, gp_stream signaler)
{
    return IN(be)->stream_wait(IN(be), waiter, signaler);
}
static gp_status arb_event_record(gp_backend *be, gp_stream stream, uint64_t *event)
{
    return IN(be)->event_record(IN(be), stream, event);
}
static gp_status arb_event_query(gp_backend *be, uint64_t event, int *done)
{
    return IN(be)->event_query(IN(be), event, done);
}
static void arb_event_release(gp_backend *be, uint64_t event) { IN(be)->event_release(IN(be), event); }
static gp_status arb_is_capturing(gp_backend *be, gp_stream stream, int *capturing)
{
    return IN(be)->is_capturing(IN(be), stream, capturing);
}
static gp_status arb_synchronize(gp_backend *be) { return IN(be)->synchronize(IN(be)); }
static gp_status arb_host_alloc(gp_backend *be, uint64_t size, void **ptr)
{
    return IN(be)->host_alloc(IN(be), size, ptr);
}
static void arb_host_free(gp_backend *be, void *ptr, uint64_t size) { IN(be)->host_free(IN(be), ptr, size); }
static gp_status arb_stream_create(gp_backend *be, gp_stream *out)
{
    return IN(be)->stream_create(IN(be), out);
}
static void arb_stream_destroy(gp_backend *be, gp_stream s) { IN(be)->stream_destroy(IN(be), s); }
static gp_status arb_copy(gp_backend *be, void *dst, const void *src, uint64_t size, int dir, gp_stream s)
{
    return IN(be)->copy(IN(be), dst, src, size, dir, s);
}
static gp_status arb_event_wait(gp_backend *be, uint64_t event) { return IN(be)->event_wait(IN(be), event); }

gp_status gp_backend_arbiter_wrap(gp_backend *inner, gp_arbiter *a, gp_backend **out)
{
    *out = NULL;
    arb_backend *w = calloc(1, sizeof *w);
    if (!w) {
        gp_arbiter_close(a);
        inner->destroy(inner);
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the arbiter backend");
    }
    uint64_t limit, avail;
    gp_arbiter_view(a, &limit, &avail);
    w->inner = inner;
    w->a = a;
    w->be = (gp_backend){
        .name = inner->name,
        .device = inner->device,
        /* The group's device: a 24 GB card on an 80 GB one. */
        .total = limit && limit < inner->total ? limit : inner->total,
        .granularity = inner->granularity,
        .reserve = arb_reserve,
        .unreserve = arb_unreserve,
        .map = arb_map,
        .unmap = arb_unmap,
        .stream_wait = arb_stream_wait,
        .event_record = arb_event_record,
        .event_query = arb_event_query,
        .event_release = arb_event_release,
        .is_capturing = arb_is_capturing,
        .synchronize = arb_synchronize,
        .mem_info = arb_mem_info,
        .host_alloc = arb_host_alloc,
        .host_free = arb_host_free,
        .stream_create = arb_stream_create,
        .stream_destroy = arb_stream_destroy,
        .copy = arb_copy,
        .event_wait = arb_event_wait,
        .destroy = arb_destroy,
    };
    *out = &w->be;
    return GP_OK;
}
