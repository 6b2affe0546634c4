/*
 * backend_forward.h -- what backend adaptors (backend_log.c,
 * backend_arbiter.c) share: a backend that wraps another and forwards every
 * call to it, but for the few the adaptor is about.  One table of
 * forwarders, so that a function added to backend.h reaches every adaptor
 * (a forgotten one was a NULL call) and no adaptor repeats the others'.
 */
#ifndef GP_BACKEND_FORWARD_H
#define GP_BACKEND_FORWARD_H

#include "backend.h"

/* How an adaptor starts: the backend the pool sees, then the one it wraps. */
typedef struct gp_backend_wrap {
    gp_backend be;
    gp_backend *inner;
} gp_backend_wrap;

#define GP_INNER(b) (((gp_backend_wrap *)(void *)(b))->inner)

/* w->be becomes inner's description (name, device, total, granularity)
 * with every function forwarding to inner, destroy included (it destroys
 * inner and frees w: an adaptor with state of its own replaces it). */
void gp_backend_forward(gp_backend_wrap *w, gp_backend *inner);

#endif /* GP_BACKEND_FORWARD_H */
