/*
 * backend_log.c -- GPUPOOL_LOG=all: a backend that forwards every call to
 * another and prints, on stderr, each call that changes or waits on the
 * device's memory: map (the pool grows), unmap (it gives memory back: trims,
 * lean growth) and synchronize (a device sync), with its size and how long
 * it took.  These are the pool's slow paths by construction (the hot path
 * never calls the backend), so logging costs nothing where it matters.
 *
 * A decorator rather than prints inside the pool: pool.c stays free of
 * output, and every map, unmap and sync the pool or the layers above make
 * is seen, whichever path makes it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend.h"

typedef struct log_backend {
    gp_backend be; /* first: the pool sees only this */
    gp_backend *inner;
} log_backend;

#define INNER(be) (((log_backend *)(be))->inner)

/* Every function of the table is forwarded: a function added to backend.h
 * must be forwarded here too, or a logged pool would call NULL. */
_Static_assert(sizeof(gp_backend) == 4 * sizeof(void *) + 20 * sizeof(gp_status (*)(void)),
               "backend.h changed: forward the new function in backend_log.c");

static double gp_now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void gp_log_line(gp_backend *be, const char *what, uintptr_t addr, uint64_t size, double t0,
                        gp_status st)
{
    double us = gp_now_us() - t0;
    if (size)
        fprintf(stderr, "gpupool: device %d: %s %.2f MiB at 0x%" PRIxPTR " (%.0f us)%s%s\n", be->device,
                what, (double)size / (1 << 20), addr, us, st == GP_OK ? "" : ": failed, ",
                st == GP_OK ? "" : gp_status_str(st));
    else
        fprintf(stderr, "gpupool: device %d: %s (%.0f us)%s%s\n", be->device, what, us,
                st == GP_OK ? "" : ": failed, ", st == GP_OK ? "" : gp_status_str(st));
}

/* ------------------------------------------------------- the logged calls */

static gp_status log_map(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle)
{
    double t0 = gp_now_us();
    gp_status st = INNER(be)->map(INNER(be), addr, size, handle);
    gp_log_line(be, "map", addr, size, t0, st);
    return st;
}

static gp_status log_unmap(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t handle)
{
    double t0 = gp_now_us();
    gp_status st = INNER(be)->unmap(INNER(be), addr, size, handle);
    gp_log_line(be, "unmap", addr, size, t0, st);
    return st;
}

static gp_status log_synchronize(gp_backend *be)
{
    double t0 = gp_now_us();
    gp_status st = INNER(be)->synchronize(INNER(be));
    gp_log_line(be, "device synchronize", 0, 0, t0, st);
    return st;
}

static void log_destroy(gp_backend *be)
{
    INNER(be)->destroy(INNER(be));
    free(be);
}

/* ------------------------------------------------------- the others, as is */

#define GP_FORWARD(name, params, args) \
    static gp_status log_##name params { return INNER(be)->name args; }
#define GP_FORWARD_VOID(name, params, args) \
    static void log_##name params { INNER(be)->name args; }

GP_FORWARD(reserve, (gp_backend *be, uint64_t size, uint64_t align, uintptr_t *base),
           (INNER(be), size, align, base))
GP_FORWARD_VOID(unreserve, (gp_backend *be, uintptr_t base, uint64_t size), (INNER(be), base, size))
GP_FORWARD(stream_wait, (gp_backend *be, gp_stream waiter, gp_stream signaler),
           (INNER(be), waiter, signaler))
GP_FORWARD(event_record, (gp_backend *be, gp_stream stream, uint64_t *event), (INNER(be), stream, event))
GP_FORWARD(event_query, (gp_backend *be, uint64_t event, int *done), (INNER(be), event, done))
GP_FORWARD_VOID(event_release, (gp_backend *be, uint64_t event), (INNER(be), event))
GP_FORWARD(is_capturing, (gp_backend *be, gp_stream stream, int *capturing), (INNER(be), stream, capturing))
GP_FORWARD(mem_info, (gp_backend *be, uint64_t *free_b, uint64_t *total_b), (INNER(be), free_b, total_b))
GP_FORWARD(host_alloc, (gp_backend *be, uint64_t size, void **ptr), (INNER(be), size, ptr))
GP_FORWARD_VOID(host_free, (gp_backend *be, void *ptr, uint64_t size), (INNER(be), ptr, size))
GP_FORWARD(stream_create, (gp_backend *be, gp_stream *out), (INNER(be), out))
GP_FORWARD_VOID(stream_destroy, (gp_backend *be, gp_stream stream), (INNER(be), stream))
GP_FORWARD(copy, (gp_backend *be, void *dst, const void *src, uint64_t size, int dir, gp_stream stream),
           (INNER(be), dst, src, size, dir, stream))
GP_FORWARD(event_wait, (gp_backend *be, uint64_t event), (INNER(be), event))
GP_FORWARD(checksum, (gp_backend *be, const void *ptr, uint64_t size, uint64_t seed, void *out, gp_stream stream),
           (INNER(be), ptr, size, seed, out, stream))
GP_FORWARD(in_context, (gp_backend *be, gp_status (*fn)(void *arg), void *arg), (INNER(be), fn, arg))

gp_status gp_backend_logged(gp_backend *inner, gp_backend **out)
{
    log_backend *l = calloc(1, sizeof *l);
    if (!l) {
        inner->destroy(inner);
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the logging backend");
    }
    l->inner = inner;
    l->be = (gp_backend){
        .name = inner->name, .device = inner->device, .total = inner->total,
        .granularity = inner->granularity,
        .reserve = log_reserve, .unreserve = log_unreserve, .map = log_map, .unmap = log_unmap,
        .stream_wait = log_stream_wait, .event_record = log_event_record,
        .event_query = log_event_query, .event_release = log_event_release,
        .is_capturing = log_is_capturing, .synchronize = log_synchronize, .mem_info = log_mem_info,
        .host_alloc = log_host_alloc, .host_free = log_host_free, .stream_create = log_stream_create,
        .stream_destroy = log_stream_destroy, .copy = log_copy, .event_wait = log_event_wait,
        .checksum = log_checksum, .in_context = log_in_context, .destroy = log_destroy,
    };
    *out = &l->be;
    return GP_OK;
}
