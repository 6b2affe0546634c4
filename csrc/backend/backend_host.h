/*
 * backend_host.h -- what tests can do to the host backend beyond backend.h:
 * observe its calls, change its capacity, fake stream progress and graph
 * captures, inject failures, and learn of calls a real device would refuse.
 * Nothing in the pool or the module uses
 * these; they exist so that every path of the pool is reachable without a
 * GPU.
 */
#ifndef GP_BACKEND_HOST_H
#define GP_BACKEND_HOST_H

#include "backend.h"

/* The backend functions that can fail, for fault injection: every
 * operation of GP_BACKEND_OPS that returns a status (unreserve,
 * event_release, host_free, host_unregister, stream_destroy and destroy
 * return nothing and cannot fail), in the list's order: GP_HOST_RESERVE, GP_HOST_MAP, ... */
typedef enum gp_host_fn {
#define GP_HOST_FN_ENUM(ret, name, NAME, params, args) GP_BACKEND_IF_STATUS_##ret(GP_HOST_##NAME,)
    GP_BACKEND_OPS(GP_HOST_FN_ENUM)
#undef GP_HOST_FN_ENUM
    GP_HOST_FN_COUNT
} gp_host_fn;

/* The function's name in gp_backend ("map"), or NULL out of range. */
const char *gp_host_fn_name(gp_host_fn fn);

typedef struct gp_host_counters {
    uint64_t n_map, n_unmap, n_reserve, n_unreserve;
    uint64_t n_stream_wait, n_sync;
    uint64_t n_map_capturing; /* map() calls while a fake capture was on */
    uint64_t n_event_record, n_event_query;
    uint64_t events_live;     /* recorded and not yet released */
    uint64_t mapped;         /* bytes mapped now */
    uint64_t n_host_alloc, host_bytes; /* host_alloc calls; bytes held now */
    uint64_t n_host_register, host_registered; /* host_register calls that
                                                  succeeded; bytes registered now */
    uint64_t n_registering, most_registering;  /* host_register calls under
                                                  way now; the most at once */
    uint64_t n_copy, copy_bytes;       /* copy calls and bytes copied      */
    uint64_t streams_live;             /* stream_create minus destroy      */
    /* Per function: every call, failing or not, and the failures injected. */
    uint64_t calls[GP_HOST_FN_COUNT], injected[GP_HOST_FN_COUNT];
} gp_host_counters;

/* Fault injection: make the nth call of `fn` from now fail with `status`
 * (1 = the very next call); with GP_HOST_FAIL_FROM that call and every later
 * one fail, until disarmed.  nth = 0 disarms `fn`.  Each function has its
 * own arming and countdown.  An injected failure changes nothing in the
 * backend, leaves the message "host <fn>: injected failure (<status>)" and
 * fills the call's outputs with GP_HOST_JUNK (as a driver may leave garbage
 * behind), so that a caller that uses an output of a failed call is caught. */
enum { GP_HOST_FAIL_ONCE = 0, GP_HOST_FAIL_FROM = 1 };
#define GP_HOST_JUNK 0x5a5a5a5a5a5a5a5aull
void gp_host_fail(gp_backend *be, gp_host_fn fn, uint64_t nth, gp_status status, int mode);
/* Disarm every function. */
void gp_host_fail_none(gp_backend *be);

/* Misuse of the backend by its caller, which a real device would answer
 * with corruption or a leak: unmapping or unreserving what was not mapped
 * or reserved as such, mapping over a mapping or outside a reservation,
 * naming an event that is not live, freeing pinned memory or a stream that
 * was not made, unreserving a range that still has mappings, and a destroy
 * that leaves mappings, reservations, events, pinned buffers or streams
 * behind.  Nothing aborts: the calls are refused (or ignored, for those
 * that return nothing) and counted, process-wide since a backend is gone
 * once destroyed.  Returns the count so far and writes the latest
 * description into msg (n bytes; msg may be NULL when n is 0). */
uint64_t gp_host_misuse(char *msg, size_t n);
void gp_host_counters_get(gp_backend *be, gp_host_counters *out);
/* Make each host_register last `ns` nanoseconds (0, the default: no
 * longer than its bookkeeping), as a driver's takes milliseconds: callers
 * that register at once are then seen doing so in most_registering. */
void gp_host_set_register_time(gp_backend *be, uint64_t ns);
/* Change the capacity (bytes that may be mapped at once). */
void gp_host_set_capacity(gp_backend *be, uint64_t capacity);
/* Deferred streams (host_queue.h): copies, checksums and gathers queued on
 * a stream run only when something orders the caller after them -- an
 * event_wait on an event recorded after them, synchronize, in_context (the
 * host codec's work), gp_host_stream_complete, the stream's destroy -- and
 * a stream_wait orders another stream's after them.  Memory unmapped or
 * freed while queued work uses it, and work that runs on device memory
 * unmapped since, are misuse.  Set it before the backend is used (off
 * again runs what is queued). */
void gp_host_set_deferred(gp_backend *be, int on);
/* Fake stream progress: events recorded on `stream` so far complete (all
 * events complete on synchronize()).  Until then event_query says "not done",
 * as for a stream that still runs a long kernel. */
void gp_host_stream_complete(gp_backend *be, gp_stream stream);
/* Mark `stream` as capturing a graph (on != 0) or not.  While any stream
 * captures, stream_wait() involving it fails, as on CUDA, and map() calls are
 * counted in n_map_capturing. */
void gp_host_set_capturing(gp_backend *be, gp_stream stream, int on);
/* Whether device `peer` may read and write all of [addr, addr+size): every
 * byte mapped, by mappings that grant_peer reached (made after the grant or
 * live at it).  0 for an empty range. */
int gp_host_peer_access(gp_backend *be, uintptr_t addr, uint64_t size, int peer);

#endif /* GP_BACKEND_HOST_H */
