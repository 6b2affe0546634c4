/*
 * backend_forward.c -- the forwarders of backend_forward.h, one per
 * operation of backend.h's GP_BACKEND_OPS: an operation added there is
 * forwarded by every adaptor without a line here.
 */
#include <stdlib.h>

#include "backend_forward.h"

/* Each forwarder calls the same operation of the wrapped backend with the
 * same arguments, `be` now naming the wrapped one. */
#define GP_FORWARD(ret, name, NAME, params, args) \
    static ret fwd_##name params                   \
    {                                              \
        be = GP_INNER(be);                         \
        GP_FORWARD_RETURN_##ret be->name args;     \
    }
#define GP_FORWARD_RETURN_gp_status return
#define GP_FORWARD_RETURN_void
GP_BACKEND_OPS(GP_FORWARD)
#undef GP_FORWARD

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
        .destroy = fwd_destroy,
    };
#define GP_FORWARD_SET(ret, name, NAME, params, args) w->be.name = fwd_##name;
    GP_BACKEND_OPS(GP_FORWARD_SET)
#undef GP_FORWARD_SET
}
