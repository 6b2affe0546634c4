/*
 * trace.h -- the history of a pool (internal to the pool layer): a bounded
 * ring of gp_event records, written by pool.c under the pool's lock where
 * the events happen, read by gp_pool_history_read.  See gpupool.h for the
 * public side (gp_pool_history, gp_event).
 */
#ifndef GP_TRACE_H
#define GP_TRACE_H

#include "gpupool.h"

typedef struct gp_trace gp_trace;

/* A ring of `cap` (> 0) events; NULL when host memory is short. */
gp_trace *gp_trace_new(size_t cap);
void gp_trace_free(gp_trace *t);

/* A ring of `cap` events holding the newest events of `old` (which is left
 * as it was); NULL when host memory is short. */
gp_trace *gp_trace_resized(const gp_trace *old, size_t cap);

/* Append one event, stamped with the time and this thread's context
 * (gp_set_context); the oldest is overwritten when the ring is full.
 * The caller serialises (the pool's lock). */
void gp_trace_add(gp_trace *t, int action, uintptr_t addr, uint64_t size,
                  gp_stream stream, gp_tag tag, int priority);

/* Capacity, events held, events ever recorded. */
void gp_trace_info(const gp_trace *t, size_t *cap, size_t *len,
                   uint64_t *recorded);

/* Copy the newest min(len, max) events to `out`, oldest first; returns
 * how many. */
size_t gp_trace_copy(const gp_trace *t, gp_event *out, size_t max);

#endif /* GP_TRACE_H */
