/*
 * backend_log.c -- GPUPOOL_LOG=all: a backend that forwards every call to
 * another and prints, on stderr, each call that changes or waits on the
 * device's memory: map (the pool grows), unmap (it gives memory back: trims,
 * lean growth), synchronize (a device sync) and event_wait (a host wait for
 * a stream: a trim's for the pool's streams, an offload's for its copies),
 * with its size and how long it took.  These are the pool's slow paths by
 * construction (the hot path never calls the backend), so logging costs
 * nothing where it matters.
 *
 * A decorator rather than prints inside the pool: pool.c stays free of
 * output, and every map, unmap, sync and wait the pool or the layers above
 * make is seen, whichever path makes it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "backend_forward.h"
#include "util.h"

static void gp_log_line(gp_backend *be, const char *what, uintptr_t addr, uint64_t size, uint64_t t0,
                        gp_status st)
{
    double us = (double)(gp_now_ns() - t0) / 1e3;
    /* The thread says whose time it was: the one that allocates (a
     * training loop's) or a background offload's. */
    long tid = (long)syscall(SYS_gettid);
    if (size)
        fprintf(stderr, "gpupool: device %d: %s %.2f MiB at 0x%" PRIxPTR " (%.0f us, thread %ld)%s%s\n",
                be->device, what, (double)size / (1 << 20), addr, us, tid, st == GP_OK ? "" : ": failed, ",
                st == GP_OK ? "" : gp_status_str(st));
    else
        fprintf(stderr, "gpupool: device %d: %s (%.0f us, thread %ld)%s%s\n", be->device, what, us, tid,
                st == GP_OK ? "" : ": failed, ", st == GP_OK ? "" : gp_status_str(st));
}

/* ------------------------------------------------------- the logged calls */

static gp_status log_map(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle)
{
    uint64_t t0 = gp_now_ns();
    gp_status st = GP_INNER(be)->map(GP_INNER(be), addr, size, handle);
    gp_log_line(be, "map", addr, size, t0, st);
    return st;
}

static gp_status log_unmap(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t handle)
{
    uint64_t t0 = gp_now_ns();
    gp_status st = GP_INNER(be)->unmap(GP_INNER(be), addr, size, handle);
    gp_log_line(be, "unmap", addr, size, t0, st);
    return st;
}

static gp_status log_synchronize(gp_backend *be)
{
    uint64_t t0 = gp_now_ns();
    gp_status st = GP_INNER(be)->synchronize(GP_INNER(be));
    gp_log_line(be, "device synchronize", 0, 0, t0, st);
    return st;
}

/* A host wait for one stream's work, not the device's: a trim's for the
 * pool's streams, an offload's for its copies. */
static gp_status log_event_wait(gp_backend *be, uint64_t event)
{
    uint64_t t0 = gp_now_ns();
    gp_status st = GP_INNER(be)->event_wait(GP_INNER(be), event);
    gp_log_line(be, "event wait", 0, 0, t0, st);
    return st;
}

gp_status gp_backend_logged(gp_backend *inner, gp_backend **out)
{
    gp_backend_wrap *l = calloc(1, sizeof *l);
    if (!l) {
        inner->destroy(inner);
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the logging backend");
    }
    gp_backend_forward(l, inner);
    l->be.map = log_map;
    l->be.unmap = log_unmap;
    l->be.synchronize = log_synchronize;
    l->be.event_wait = log_event_wait;
    *out = &l->be;
    return GP_OK;
}
