/*
 * backend_host.h -- what tests can do to the host backend beyond backend.h:
 * observe its calls, change its capacity, fake stream progress and graph
 * captures, and inject failures.  Nothing in the pool or the module uses
 * these; they exist so that every path of the pool is reachable without a
 * GPU.
 */
#ifndef GP_BACKEND_HOST_H
#define GP_BACKEND_HOST_H

#include "backend.h"

/* Host backend fault injection and observation, for tests. */
typedef struct gp_host_counters {
    uint64_t n_map, n_unmap, n_reserve, n_unreserve;
    uint64_t n_stream_wait, n_sync;
    uint64_t n_map_capturing; /* map() calls while a fake capture was on */
    uint64_t n_event_record, n_event_query;
    uint64_t events_live;     /* recorded and not yet released */
    uint64_t mapped;         /* bytes mapped now */
    uint64_t n_host_alloc, host_bytes; /* host_alloc calls; bytes held now */
    uint64_t n_copy, copy_bytes;       /* copy calls and bytes copied      */
    uint64_t streams_live;             /* stream_create minus destroy      */
} gp_host_counters;

/* Make the n-th next map() fail with `status` (1 = the very next one);
 * 0 disarms. */
void gp_host_fail_map(gp_backend *be, uint64_t nth, gp_status status);
void gp_host_counters_get(gp_backend *be, gp_host_counters *out);
/* Change the capacity (bytes that may be mapped at once). */
void gp_host_set_capacity(gp_backend *be, uint64_t capacity);
/* Fake stream progress: events recorded on `stream` so far complete (all
 * events complete on synchronize()).  Until then event_query says "not done",
 * as for a stream that still runs a long kernel. */
void gp_host_stream_complete(gp_backend *be, gp_stream stream);
/* Mark `stream` as capturing a graph (on != 0) or not.  While any stream
 * captures, stream_wait() involving it fails, as on CUDA, and map() calls are
 * counted in n_map_capturing. */
void gp_host_set_capturing(gp_backend *be, gp_stream stream, int on);

#endif /* GP_BACKEND_HOST_H */
