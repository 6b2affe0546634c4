/*
 * arbiter_swap.c -- a tenant swapped out whole while it is parked, and the
 * waits for room that keep what they waited for (arbiter.h:
 * gp_arbiter_set_swap, gp_arbiter_swap_in, gp_arbiter_with_room).
 *
 * Why a swap: a tenant parked in an allocation, a restore or a yield point
 * launches no work from that thread until the call returns, so its memory
 * can go to the host and come back at the same addresses before it does.
 * Caps are each at most the group's limit, so with every tenant behind the
 * first waiter swapped out that waiter fits: no two steps wait for each
 * other until the timeout.
 */
#include <stdio.h>
#include <unistd.h>

#include "arbiter_impl.h"
#include "error.h"

void gp_arbiter_set_swap(gp_arbiter *a, gp_swap_out_fn out, gp_swap_in_fn in, void *arg)
{
    if (gp_arb_forked(a)) return;
    pthread_mutex_lock(&a->answering);
    a->swap_out = out;
    a->swap_in = in;
    a->swap_arg = arg;
    pthread_mutex_unlock(&a->answering);
    if (gp_arb_lock(a->r) != GP_OK) return;
    a->r->slots[a->slot].can_swap = out && in;
    gp_arb_unlock(a->r);
}

uint64_t gp_arbiter_swap_room(gp_arbiter *a)
{
    if (!atomic_load_explicit(&a->swap_room, memory_order_relaxed)) return 0;
    return atomic_exchange(&a->swap_room, 0);
}

/* Whether slot i may be swapped for slot me: lower priorities always (a
 * higher one never waits for a lower one's turn), an equal one only once
 * behind me in line and past the room it keeps (its turn, or a swap in
 * not long ago: against thrashing). */
int gp_arb_swappable(const gp_arb_shm *r, int i, int me, uint64_t now)
{
    const gp_arb_slot *s = &r->slots[i], *m = &r->slots[me];
    if (i == me || !s->pid || !s->can_swap || s->swapped || s->priority > m->priority) return 0;
    if (s->priority < m->priority) return 1;
    return !gp_arb_ahead(r, i, me) && !s->in_turn && now >= s->keep_until;
}

/* Whether slot i's swap's host memory should be pinned ahead: unless every
 * other tenant in the group is below it (the highest one's would be pinned
 * for nobody, taking the CPU while it computes).  Alone it is pinned: the
 * tenant that joins next asks at once, and a swap that pins its own host
 * memory runs at pinning speed (0.8 s against 0.23 s for 11 GiB). */
int gp_arb_may_be_swapped(const gp_arb_shm *r, int i)
{
    const gp_arb_slot *s = &r->slots[i];
    if (!s->can_swap) return 0;
    int lower = 0;
    for (int j = 0; j < GP_ARB_SLOTS; j++) {
        if (j == i || !r->slots[j].pid) continue;
        if (r->slots[j].priority >= s->priority) return 1;
        lower = 1;
    }
    return !lower;
}

gp_status gp_arb_swap_out(gp_arbiter *a, uint64_t *released)
{
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    uint64_t t0 = gp_now_ns(), back = 0;
    *released = 0;
    /* Away from before its first byte goes until what went is counted:
     * a thread of the process at the gate meanwhile waits for `swapping`
     * and then finds it away, or back. */
    pthread_mutex_lock(&a->swapping);
    atomic_store(&a->away, 1);
    gp_status st = a->swap_out(a->swap_arg, released, &back);
    uint64_t t1 = gp_now_ns();
    /* A failed swap whose undo failed too left `back` away: the tenant is
     * swapped out all the same (its swap in brings it back, or fails
     * naming why), not running on with its memory gone. */
    if (back) {
        a->away_since = t1;
        a->away_lease = 0;
    } else {
        atomic_store(&a->away, 0);
    }
    if (gp_arb_lock(r) == GP_OK) { /* (else its figures stay as they were; it comes back all the same) */
        if (st != GP_OK) me->swap_status = (int32_t)st;
        if (back) { /* (a pool with nothing live gave its cache only) */
            /* Its lease would keep the room it gave: it goes, and comes
             * back with the tenant. */
            a->away_lease = me->lease;
            me->lease = 0;
            me->swapped = back;
            if (st == GP_OK) me->swap_status = 0;
            me->n_swap_out++;
            me->swap_ns += t1 - t0;
            if (t1 - t0 > me->swap_max_ns) me->swap_max_ns = t1 - t0;
            me->swap_cost_ns = t1 - t0;
            /* Behind the one it went for: its wait to come back, and the
             * wait it was in, are newer than that one's. */
            me->want_since = 0;
        }
        gp_arb_unlock(r);
    }
    pthread_mutex_unlock(&a->swapping);
    return st;
}

void gp_arb_keep(gp_arbiter *a, uint64_t now)
{
    /* Against thrashing: a tenant that got its room (a wait that ended,
     * a swap in) keeps it against equals for a turn, and at least a few
     * times what the group's swaps cost: it runs at least that long
     * between two swaps. */
    uint64_t cost = 0;
    for (int j = 0; j < GP_ARB_SLOTS; j++)
        if (a->r->slots[j].pid && a->r->slots[j].swap_cost_ns > cost) cost = a->r->slots[j].swap_cost_ns;
    uint64_t keep = GP_ARB_KEEP_COST * cost;
    if (keep > GP_ARB_KEEP_MAX_NS) keep = GP_ARB_KEEP_MAX_NS;
    a->r->slots[a->slot].keep_until = now + (keep > a->turn_ns ? keep : a->turn_ns);
}

/* ---------------------------------------------------------------- room */

/* Wait in line until the group can give `bytes` more than this tenant
 * holds, up to w->deadline (UINT64_MAX: for ever); then keep that room as
 * a lease (*saved: the lease it had).  The wait is ended either way. */
static gp_status gp_room(gp_arbiter *a, gp_wait *w, uint64_t bytes, uint64_t deadline, uint64_t *saved)
{
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    gp_status st = gp_arb_wait_begin(a, w, bytes, 0, atomic_load(&a->turns), 1);
    if (st != GP_OK) return st;
    w->deadline = deadline;
    int ok = 0;
    for (;;) {
        uint64_t short_b;
        uint32_t gen;
        if ((st = gp_arb_wait_look(a, w, 0, &short_b, &gen)) != GP_OK) break;
        if (!short_b && gp_arb_lock(r) == GP_OK) {
            *saved = me->lease;
            uint64_t want = me->held + bytes;
            me->lease = want > me->lease ? want : me->lease;
            gp_arb_unlock(r);
            ok = 1;
            break;
        }
        if (gp_now_ns() >= w->deadline) {
            st = GP_ERR_OOM;
            break;
        }
        gp_arb_wait_sleep(a, w, gen, w->deadline);
    }
    gp_arb_wait_end(a, w, ok);
    return ok ? GP_OK : st;
}

static void gp_room_end(gp_arbiter *a, uint64_t saved)
{
    if (gp_arb_lock(a->r) != GP_OK) return;
    a->r->slots[a->slot].lease = saved;
    gp_arb_unlock(a->r);
    gp_arb_changed(a->r);
}

gp_status gp_arbiter_with_room(gp_arbiter *a, uint64_t bytes, gp_status (*fn)(void *), void *arg)
{
    if (!a || gp_arb_forked(a)) return fn(arg);
    gp_status st = gp_arbiter_swap_in(a);
    if (st != GP_OK) return st;
    uint64_t t0 = gp_now_ns(), deadline = t0 + a->timeout_ns;
    for (;;) {
        gp_wait w;
        uint64_t saved = 0, p0 = atomic_load(&a->parked_ns);
        st = gp_room(a, &w, bytes, deadline, &saved);
        deadline += atomic_load(&a->parked_ns) - p0; /* (as the wait's own deadline) */
        if (st == GP_OK) {
            st = fn(arg);
            gp_room_end(a, saved);
            if (st != GP_ERR_OOM) return st;
        } else if (st != GP_ERR_OOM) {
            return st;
        }
        if (gp_now_ns() >= deadline) break;
        gp_arb_nap(GP_ARB_RETRY_NS);
    }
    char why[1024], tenants[2048];
    snprintf(why, sizeof why, "%s", gp_last_error());
    gp_arbiter_report(a, tenants, sizeof tenants);
    return gp_error_set(GP_ERR_OOM, "%s\n  the timeout passed: waited %.2f s in line for %.2f MiB "
                        "(GPUPOOL_RECLAIM_TIMEOUT); %s", why, (double)(gp_now_ns() - t0) / 1e9,
                        (double)bytes / (1 << 20), tenants);
}

/* --------------------------------------------------------------- swap in */

gp_status gp_arbiter_swap_in(gp_arbiter *a)
{
    if (!a || !atomic_load_explicit(&a->away, memory_order_acquire)) return GP_OK;
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    pthread_mutex_lock(&a->swapping);
    if (!atomic_load(&a->away)) { /* (another thread brought it back) */
        pthread_mutex_unlock(&a->swapping);
        return GP_OK;
    }
    /* The want of the call it interrupted waits on once it is back. */
    gp_status st = gp_arb_lock(r);
    if (st != GP_OK) {
        pthread_mutex_unlock(&a->swapping);
        return st;
    }
    uint64_t wanted = me->wanted, bytes = me->swapped;
    int32_t step = me->want_step;
    gp_arb_unlock(r);
    uint64_t t_in = 0;
    for (int tries = 0; tries < 3; tries++) {
        gp_wait w;
        uint64_t saved = 0;
        if ((st = gp_room(a, &w, bytes, UINT64_MAX, &saved)) != GP_OK) break;
        uint64_t t0 = gp_now_ns();
        st = a->swap_in(a->swap_arg);
        t_in = gp_now_ns() - t0;
        gp_room_end(a, saved);
        if (st == GP_OK) break;
        gp_arb_nap(GP_ARB_RETRY_NS);
    }
    uint64_t now = gp_now_ns();
    if (gp_arb_lock(r) == GP_OK) {
        me->wanted = wanted, me->want_since = wanted ? now : 0, me->want_step = step;
        if (st == GP_OK) {
            me->lease = a->away_lease;
            me->swapped = 0;
            me->n_swap_in++;
            me->park_ns += now - a->away_since;
            me->swap_ns += t_in;
            if (t_in > me->swap_max_ns) me->swap_max_ns = t_in;
            me->swap_cost_ns += t_in;
            gp_arb_keep(a, now);
        }
        gp_arb_unlock(r);
        gp_arb_changed(r);
    }
    if (st == GP_OK) {
        atomic_fetch_add(&a->parked_ns, now - a->away_since);
        atomic_store_explicit(&a->away, 0, memory_order_release);
    }
    pthread_mutex_unlock(&a->swapping);
    return st;
}
