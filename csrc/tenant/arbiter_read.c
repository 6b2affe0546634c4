/*
 * arbiter_read.c -- reading a registry without joining it (`python -m
 * gpupool top`), and a tenant's view of its group for OOM messages.
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arbiter_impl.h"
#include "error.h"

size_t gp_arbiter_report(gp_arbiter *a, char *buf, size_t len)
{
    gp_arb_shm *r = a->r;
    size_t at = 0;
    if (len) buf[0] = '\0';
    if (gp_arb_lock(r) != GP_OK) return 0;
    char b[5][32];
    uint64_t held;
    gp_arb_avail(r, a->slot, NULL, &held);
    at += (size_t)snprintf(buf + at, at < len ? len - at : 0,
                           "tenant group '%s' on %s: %s %s, %s held:", r->group, r->device,
                           r->limit ? "limit" : "device", gp_fmt_bytes(gp_arb_cap(r), b[0], sizeof b[0]),
                           gp_fmt_bytes(held, b[1], sizeof b[1]));
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        const gp_arb_slot *s = &r->slots[i];
        if (!s->pid) continue;
        at += (size_t)snprintf(buf + at, at < len ? len - at : 0,
                               "\n    pid %d%s '%s' priority %d: held %s, cached %s, offloadable %s, "
                               "wants %s", (int)s->pid, i == a->slot ? " (this one)" : "", s->name,
                               (int)s->priority, gp_fmt_bytes(s->held, b[1], sizeof b[1]),
                               gp_fmt_bytes(s->cached, b[2], sizeof b[2]), gp_fmt_bytes(s->offloadable, b[3], sizeof b[3]),
                               gp_fmt_bytes(s->wanted, b[4], sizeof b[4]));
        if (s->swapped)
            at += (size_t)snprintf(buf + at, at < len ? len - at : 0, ", swapped out %s",
                                   gp_fmt_bytes(s->swapped, b[1], sizeof b[1]));
        if (!s->can_swap)
            at += (size_t)snprintf(buf + at, at < len ? len - at : 0, ", cannot be swapped");
        else if (s->swap_status)
            at += (size_t)snprintf(buf + at, at < len ? len - at : 0, ", its last swap out failed: %s",
                                   s->swap_status == GP_ERR_LIMIT ? "its host limit (GPUPOOL_HOST_LIMIT) is full"
                                                                  : gp_status_str((gp_status)s->swap_status));
    }
    gp_arb_unlock(r);
    return at;
}

/* -------------------------------------------------------------- reading */

gp_status gp_arbiter_read(const char *group, const char *device, gp_group_info *g, gp_tenant_info *t,
                          size_t max)
{
    char name[160];
    gp_status st = gp_arbiter_shm_name(group, device, name, sizeof name);
    if (st != GP_OK) return st;
    gp_arb_shm *r = NULL;
    if ((st = gp_arb_attach(name, 0, 1, &r)) != GP_OK) return st; /* a reader does not wait long */
    if (gp_arb_reap(r)) gp_arb_changed(r);
    int live = 0;
    for (int i = 0; i < GP_ARB_SLOTS; i++) live += r->slots[i].pid != 0;
    if (!live) {
        /* Its tenants all died: nobody else would remove it. */
        r->dead = 1;
        shm_unlink(name);
        gp_arb_unlock(r);
        munmap(r, sizeof *r);
        return gp_error_set(GP_ERR_FOREIGN, "gpupool: no tenant registry %s (its tenants had died)", name);
    }
    uint64_t now = gp_now_ns();
    memset(g, 0, sizeof *g);
    snprintf(g->group, sizeof g->group, "%s", r->group);
    snprintf(g->device, sizeof g->device, "%s", r->device);
    g->limit = r->limit;
    g->total = r->total;
    g->n_registered = r->n_registered;
    g->n_reaped = r->n_reaped;
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        const gp_arb_slot *s = &r->slots[i];
        if (!s->pid) continue;
        if (g->n_tenants < max) {
            gp_tenant_info *o = &t[g->n_tenants];
            memset(o, 0, sizeof *o);
            o->pid = s->pid;
            o->priority = s->priority;
            o->slot = i;
            o->self = s->pid == (int32_t)getpid();
            memcpy(o->name, s->name, sizeof o->name);
            o->quota = s->quota, o->held = s->held, o->cached = s->cached;
            o->offloadable = s->offloadable, o->offloaded = s->offloaded, o->wanted = s->wanted;
            o->lease = s->lease;
            o->waiting_ns = s->want_since ? now - s->want_since : 0;
            o->seen_ns = now > s->heartbeat ? now - s->heartbeat : 0;
            o->asked = s->answer_seq != atomic_load(&s->ask_seq) ? s->ask_bytes : 0;
            o->n_waits = s->n_waits, o->n_wait_fail = s->n_wait_fail;
            o->wait_ns = s->wait_ns, o->wait_max_ns = s->wait_max_ns;
            o->pause_ns = s->pause_ns, o->step_ns = s->step_ns;
            o->n_given = s->n_given, o->bytes_given = s->bytes_given;
            o->n_received = s->n_received, o->bytes_received = s->bytes_received;
            o->lat_max_ns = s->lat_max_ns;
            o->swapped = s->swapped, o->n_swap_out = s->n_swap_out, o->n_swap_in = s->n_swap_in;
            o->park_ns = s->park_ns, o->swap_ns = s->swap_ns, o->swap_max_ns = s->swap_max_ns;
            o->n_lat = s->n_lat < GP_ARB_LAT ? s->n_lat : GP_ARB_LAT;
            uint32_t sorted[GP_ARB_LAT];
            for (uint32_t k = 0; k < o->n_lat; k++) {
                /* oldest first */
                o->lat_us[k] = s->lat_us[(s->n_lat - o->n_lat + k) % GP_ARB_LAT];
                uint32_t x = o->lat_us[k], j = k;
                for (; j > 0 && sorted[j - 1] > x; j--) sorted[j] = sorted[j - 1];
                sorted[j] = x;
            }
            if (o->n_lat) o->lat_median_ns = (uint64_t)sorted[o->n_lat / 2] * 1000;
        }
        g->n_tenants++;
    }
    gp_arb_unlock(r);
    munmap(r, sizeof *r);
    return GP_OK;
}
