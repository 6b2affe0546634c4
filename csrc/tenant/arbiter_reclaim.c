/*
 * arbiter_reclaim.c -- what a tenant gives when the registry asks it for
 * memory, and what it tells the registry it could give (arbiter.h): the
 * policy of a tenant whose pool may have an offloader.
 */
#include "arbiter.h"
#include "offload.h"

uint64_t gp_tenant_reclaim(gp_pool *pool, gp_offloader *o, uint64_t bytes, int level)
{
    uint64_t got = gp_pool_trim(pool, bytes);
    if (o && level == GP_RECLAIM_OFFLOAD && got < bytes) got += gp_offload_reclaim(o, bytes - got, GP_PRIO_MAX + 1);
    return got;
}

void gp_tenant_publish(gp_arbiter *a, gp_offloader *o)
{
    uint64_t offloadable, offloaded;
    gp_offload_figures(o, &offloadable, &offloaded);
    gp_arbiter_publish(a, offloadable, offloaded);
}
