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
#include "backend_forward.h"
#include "error.h"

typedef struct arb_backend {
    gp_backend_wrap w; /* first: the pool sees only its backend */
    gp_arbiter *a;
} arb_backend;

#define ARB(be) ((arb_backend *)(be))
#define IN(be) GP_INNER(be)

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
    gp_backend_forward(&w->w, inner);
    w->a = a;
    /* The group's device: a 24 GB card on an 80 GB one. */
    if (limit && limit < inner->total) w->w.be.total = limit;
    w->w.be.map = arb_map;
    w->w.be.unmap = arb_unmap;
    w->w.be.mem_info = arb_mem_info;
    w->w.be.destroy = arb_destroy;
    *out = &w->w.be;
    return GP_OK;
}
