/*
 * trace.c -- a pool's history: a ring buffer of alloc/free/map/unmap/OOM
 * events (gp_event), for snapshots and plots.  pool.c appends under its lock
 * where each event happens, and only when the history is on (one branch on
 * a NULL pointer otherwise), so a pool without history pays nothing.  The
 * ring is allocated when the history is switched on, never on the hot path.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace.h"
#include "util.h"

struct gp_trace {
    gp_event *ev;
    size_t cap, head, len; /* head: where the next event goes */
    uint64_t recorded;
};

/* The context the calling thread's next events carry (a Python stack id
 * from the layer above); one word per thread, read only while recording. */
static _Thread_local uint32_t t_context;

void gp_set_context(uint32_t context) { t_context = context; }

gp_trace *gp_trace_new(size_t cap)
{
    if (cap == 0 || cap > SIZE_MAX / sizeof(gp_event)) return NULL;
    gp_trace *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->ev = malloc(cap * sizeof *t->ev);
    if (!t->ev) {
        free(t);
        return NULL;
    }
    t->cap = cap;
    return t;
}

void gp_trace_free(gp_trace *t)
{
    if (!t) return;
    free(t->ev);
    free(t);
}

gp_trace *gp_trace_resized(const gp_trace *old, size_t cap)
{
    gp_trace *t = gp_trace_new(cap);
    if (!t) return NULL;
    t->len = gp_trace_copy(old, t->ev, cap);
    t->head = t->len == cap ? 0 : t->len;
    t->recorded = old->recorded;
    return t;
}

void gp_trace_add(gp_trace *t, int action, uintptr_t addr, uint64_t size, gp_stream stream, gp_tag tag,
                  int priority)
{
    gp_event *e = &t->ev[t->head];
    e->time_ns = gp_now_ns(); /* (util.h: the clock Python's time.monotonic_ns() reads) */
    e->addr = addr;
    e->size = size;
    e->stream = stream;
    e->context = t_context;
    e->tag = tag;
    e->priority = (uint8_t)priority;
    e->action = (uint8_t)action;
    if (++t->head == t->cap) t->head = 0;
    if (t->len < t->cap) t->len++;
    t->recorded++;
}

void gp_trace_info(const gp_trace *t, size_t *cap, size_t *len, uint64_t *recorded)
{
    *cap = t->cap;
    *len = t->len;
    *recorded = t->recorded;
}

size_t gp_trace_copy(const gp_trace *t, gp_event *out, size_t max)
{
    size_t n = t->len < max ? t->len : max;
    if (n == 0) return 0; /* (out may be NULL then) */
    /* The newest n events end just before head. */
    size_t start = (t->head + t->cap - n) % t->cap;
    size_t first = t->cap - start < n ? t->cap - start : n;
    memcpy(out, t->ev + start, first * sizeof *out);
    memcpy(out + first, t->ev, (n - first) * sizeof *out);
    return n;
}
