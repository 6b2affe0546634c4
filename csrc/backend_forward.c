/*
 * backend_forward.c -- the forwarders of backend_forward.h.
 */
#include <stdlib.h>

#include "backend_forward.h"

/* Every function of the table is forwarded: one added to backend.h must be
 * added here too, or an adaptor would call NULL. */
_Static_assert(sizeof(gp_backend) == 4 * sizeof(void *) + 21 * sizeof(gp_status (*)(void)),
               "backend.h changed: forward the new function in backend_forward.c");

#define GP_FORWARD(name, params, args) \
    static gp_status fwd_##name params { return GP_INNER(be)->name args; }
#define GP_FORWARD_VOID(name, params, args) \
    static void fwd_##name params { GP_INNER(be)->name args; }

GP_FORWARD(reserve, (gp_backend *be, uint64_t size, uint64_t align, uintptr_t *base),
           (GP_INNER(be), size, align, base))
GP_FORWARD_VOID(unreserve, (gp_backend *be, uintptr_t base, uint64_t size), (GP_INNER(be), base, size))
GP_FORWARD(map, (gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle),
           (GP_INNER(be), addr, size, handle))
GP_FORWARD(unmap, (gp_backend *be, uintptr_t addr, uint64_t size, uint64_t handle),
           (GP_INNER(be), addr, size, handle))
GP_FORWARD(stream_wait, (gp_backend *be, gp_stream waiter, gp_stream signaler),
           (GP_INNER(be), waiter, signaler))
GP_FORWARD(event_record, (gp_backend *be, gp_stream stream, uint64_t *event), (GP_INNER(be), stream, event))
GP_FORWARD(event_query, (gp_backend *be, uint64_t event, int *done), (GP_INNER(be), event, done))
GP_FORWARD_VOID(event_release, (gp_backend *be, uint64_t event), (GP_INNER(be), event))
GP_FORWARD(is_capturing, (gp_backend *be, gp_stream stream, int *capturing), (GP_INNER(be), stream, capturing))
GP_FORWARD(synchronize, (gp_backend *be), (GP_INNER(be)))
GP_FORWARD(mem_info, (gp_backend *be, uint64_t *free_b, uint64_t *total_b), (GP_INNER(be), free_b, total_b))
GP_FORWARD(host_alloc, (gp_backend *be, uint64_t size, void **ptr), (GP_INNER(be), size, ptr))
GP_FORWARD_VOID(host_free, (gp_backend *be, void *ptr, uint64_t size), (GP_INNER(be), ptr, size))
GP_FORWARD(stream_create, (gp_backend *be, gp_stream *out), (GP_INNER(be), out))
GP_FORWARD_VOID(stream_destroy, (gp_backend *be, gp_stream stream), (GP_INNER(be), stream))
GP_FORWARD(copy, (gp_backend *be, void *dst, const void *src, uint64_t size, int dir, gp_stream stream),
           (GP_INNER(be), dst, src, size, dir, stream))
GP_FORWARD(event_wait, (gp_backend *be, uint64_t event), (GP_INNER(be), event))
GP_FORWARD(checksum, (gp_backend *be, const void *ptr, uint64_t size, uint64_t seed, void *out, gp_stream stream),
           (GP_INNER(be), ptr, size, seed, out, stream))
GP_FORWARD(gather, (gp_backend *be, void *dst, const void *const *srcs, const size_t *lens, uint32_t n, uint64_t align,
                    uint64_t max_len, gp_stream stream), (GP_INNER(be), dst, srcs, lens, n, align, max_len, stream))
GP_FORWARD(in_context, (gp_backend *be, gp_status (*fn)(void *arg), void *arg), (GP_INNER(be), fn, arg))

static void fwd_destroy(gp_backend *be)
{
    GP_INNER(be)->destroy(GP_INNER(be));
    free(be);
}

void gp_backend_forward(gp_backend_wrap *w, gp_backend *inner)
{
    w->inner = inner;
    w->be = (gp_backend){
        .name = inner->name, .device = inner->device, .total = inner->total, .granularity = inner->granularity,
        .reserve = fwd_reserve, .unreserve = fwd_unreserve, .map = fwd_map, .unmap = fwd_unmap,
        .stream_wait = fwd_stream_wait, .event_record = fwd_event_record, .event_query = fwd_event_query,
        .event_release = fwd_event_release, .is_capturing = fwd_is_capturing, .synchronize = fwd_synchronize,
        .mem_info = fwd_mem_info, .host_alloc = fwd_host_alloc, .host_free = fwd_host_free,
        .stream_create = fwd_stream_create, .stream_destroy = fwd_stream_destroy, .copy = fwd_copy,
        .event_wait = fwd_event_wait, .checksum = fwd_checksum, .gather = fwd_gather,
        .in_context = fwd_in_context, .destroy = fwd_destroy,
    };
}
