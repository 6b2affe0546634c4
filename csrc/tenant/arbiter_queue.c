/*
 * arbiter_queue.c -- the reclaim protocol between the tenants of a group
 * (arbiter.h): what a tenant may map (accounting, under the registry's
 * lock), the asks to other tenants and their answers, and the waits in
 * line of an allocation or a lease.
 */
#include <stdio.h>
#include <string.h>

#include "arbiter_impl.h"
#include "error.h"

/* --------------------------------------------------------- accounting */

/* Whether the want of slot j comes before slot i's: a step stuck mid-way
 * first (it holds memory that others wait for; a step not begun holds
 * none), then, between equal priorities, one within its turn, then higher
 * priority, then the older want; a tenant that waits for nothing is
 * behind every want of its priority, so it cannot take what an equal
 * waits for.  (A tenant swapped out waits to come back as a step stuck
 * mid-way if it has yield points, its want made when it went.) */
int gp_arb_ahead(const gp_arb_shm *r, int j, int i)
{
    const gp_arb_slot *a = &r->slots[j], *b = &r->slots[i];
    if (j == i || !a->pid || !a->wanted) return 0;
    /* A lower step stuck mid-way goes ahead of a higher want only once it
     * has waited GP_ARB_STUCK_NS: until then it is swapped for the higher
     * one rather than taking its cache (the high one keeps its speed). */
    if (a->want_step != b->want_step) {
        const gp_arb_slot *stuck = a->want_step ? a : b, *other = a->want_step ? b : a;
        if (stuck->priority >= other->priority || gp_now_ns() - stuck->want_since >= GP_ARB_STUCK_NS)
            return a->want_step;
    }
    if (a->priority == b->priority && a->in_turn != b->in_turn) return a->in_turn;
    if (a->priority != b->priority) return a->priority > b->priority;
    /* Between equals, one swapped out comes back after those that hold
     * memory have been served: it was swapped for them, and one kept from
     * being swapped again (its keep, against thrashing) must not wait
     * behind it meanwhile. */
    if ((a->swapped != 0) != (b->swapped != 0)) return b->swapped != 0;
    if (!b->want_since) return 1;
    if (a->want_since != b->want_since) return a->want_since < b->want_since;
    return j < i;
}

uint64_t gp_arb_cap(const gp_arb_shm *r) { return r->limit ? r->limit : r->total; }

/* The room a step's lease still keeps. */
uint64_t gp_arb_leased(const gp_arb_slot *s) { return s->lease > s->held ? s->lease - s->held : 0; }

/* The room no lease keeps. */
uint64_t gp_arb_free_room(const gp_arb_shm *r)
{
    uint64_t used = 0;
    for (int j = 0; j < GP_ARB_SLOTS; j++)
        if (r->slots[j].pid) used += r->slots[j].held + gp_arb_leased(&r->slots[j]);
    return used >= gp_arb_cap(r) ? 0 : gp_arb_cap(r) - used;
}

/* What slot i may map now: its own lease's room, and of the room no lease
 * keeps, what the wants ahead of it leave (*ahead: the bytes leased to
 * others or wanted ahead).  A lease is a level of held, not a count spent
 * by maps: a step that unmaps and maps again (its pool trims to fit a
 * block) keeps its room. */
uint64_t gp_arb_avail(const gp_arb_shm *r, int i, uint64_t *ahead, uint64_t *held_all)
{
    uint64_t held = 0, leased = 0, w = 0;
    for (int j = 0; j < GP_ARB_SLOTS; j++) {
        const gp_arb_slot *s = &r->slots[j];
        if (!s->pid) continue;
        uint64_t l = gp_arb_leased(s);
        held += s->held;
        leased += l;
        if (gp_arb_ahead(r, j, i)) w += s->wanted > l ? s->wanted - l : 0; /* beyond its own lease */
    }
    uint64_t mine = gp_arb_leased(&r->slots[i]), free_b = gp_arb_free_room(r);
    if (ahead) *ahead = leased - mine + w;
    if (held_all) *held_all = held;
    return mine + (free_b > w ? free_b - w : 0);
}

gp_status gp_arbiter_take(gp_arbiter *a, uint64_t size, gp_backend *inner)
{
    gp_arb_shm *r = a->r;
    uint64_t unit = atomic_load_explicit(&a->unit, memory_order_relaxed);
    if (size > unit) atomic_store_explicit(&a->unit, size, memory_order_relaxed);
    gp_status st = gp_arb_lock(r);
    if (st != GP_OK) return st;
    gp_arb_slot *me = &r->slots[a->slot];
    uint64_t ahead, held, avail = gp_arb_avail(r, a->slot, &ahead, &held);
    uint64_t dev_free = UINT64_MAX, dev_total;
    /* Wants ahead must also fit the device as its driver sees it (memory
     * outside the group counts there). */
    if (ahead && size <= avail && inner->mem_info(inner, &dev_free, &dev_total) != GP_OK) dev_free = UINT64_MAX;
    if (size > avail || (dev_free != UINT64_MAX && dev_free < ahead + size)) {
        char b[4][32];
        st = gp_error_set(GP_ERR_OOM, "gpupool: tenant group '%s' on %s cannot give %s now: %s %s, %s held "
                          "by its tenants, %s leased to or wanted by tenants ahead of this one%s",
                          r->group, r->device, gp_fmt_bytes(size, b[0], sizeof b[0]),
                          r->limit ? "limit" : "device", gp_fmt_bytes(gp_arb_cap(r), b[1], sizeof b[1]),
                          gp_fmt_bytes(held, b[2], sizeof b[2]), gp_fmt_bytes(ahead, b[3], sizeof b[3]),
                          size <= avail ? " (the device itself is short)" : "");
    } else {
        /* (Its want stays whole until its wait ends: a map of part of it
         * may yet be rolled back.) */
        me->held += size;
        if (me->held > a->step_peak) a->step_peak = me->held;
        me->heartbeat = gp_now_ns();
        /* In a group, it may be swapped: its swap's host memory is
         * made ready as it grows (a large chunk at a time), not pinned in
         * the swap (17 GB/s at best from cold, against 55 warm). */
        if (me->held >= a->room_told + (64ull << 20) && gp_arb_may_be_swapped(r, a->slot))
            atomic_store(&a->swap_room, a->room_told = me->held);
    }
    gp_arb_unlock(r);
    return st;
}

void gp_arbiter_give(gp_arbiter *a, uint64_t size)
{
    gp_arb_shm *r = a->r;
    if (gp_arb_lock(r) != GP_OK) return; /* (the message stays for the caller) */
    gp_arb_slot *me = &r->slots[a->slot];
    me->held -= me->held < size ? me->held : size;
    me->heartbeat = gp_now_ns();
    gp_arb_unlock(r);
    gp_arb_changed(r);
}

void gp_arbiter_view(gp_arbiter *a, uint64_t *limit, uint64_t *avail)
{
    gp_arb_shm *r = a->r;
    *limit = r->limit;
    *avail = 0;
    if (gp_arb_lock(r) != GP_OK) return;
    *avail = gp_arb_avail(r, a->slot, NULL, NULL);
    gp_arb_unlock(r);
}

void gp_arbiter_set_reclaim(gp_arbiter *a, gp_reclaim_fn fn, void *arg)
{
    if (gp_arb_forked(a)) return; /* (its lock may have been held at the fork) */
    pthread_mutex_lock(&a->answering);
    a->reclaim = fn;
    a->reclaim_arg = arg;
    pthread_mutex_unlock(&a->answering);
}

void gp_arbiter_bind(gp_arbiter *a, gp_pool *pool) { atomic_store(&a->pool, pool); }

void gp_arbiter_publish(gp_arbiter *a, uint64_t offloadable, uint64_t offloaded)
{
    if (gp_arb_forked(a) || gp_arb_lock(a->r) != GP_OK) return;
    a->r->slots[a->slot].offloadable = offloadable;
    a->r->slots[a->slot].offloaded = offloaded;
    gp_arb_unlock(a->r);
}

/* ------------------------------------------------------------ answering */

static void gp_lat_add(gp_arb_slot *s, uint64_t ns)
{
    uint64_t us = ns / 1000;
    s->lat_us[s->n_lat % GP_ARB_LAT] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    s->n_lat++;
    if (ns > s->lat_max_ns) s->lat_max_ns = ns;
}

/* The asks pending for this tenant, answered: the callback runs with no
 * lock held; one thread of the process answers at a time (the others go on).
 * With a `gift` (a yield point behind waiting tenants: what they wait for)
 * it gives that much of its cache too, asked or not, and that gift answers
 * every ask made up to its end:
 * counted once, from `since` (when the first waiter ahead began) when no ask
 * was pending.  Answering an ask made during the gift again would count a
 * second reclaim of nothing.  A tenant with yield points leaves every ask
 * to its next yield point (`defer`): its step's lease counted the cache it
 * held then, and a step that gave that cache away mid-way outgrew its lease
 * and stalled half way, holding memory, beside others that took what it
 * gave (on the H100, three LoRA jobs stalled so until killed).  An equal
 * priority's ask waits there for the end of its turn.  Not while it waits
 * itself (GP_ANSWER_NOW): two steps could each wait for the other's cache;
 * but between steps within its turn, an equal priority's ask still waits
 * (GP_DEFER_EQUAL: else the wait for its next lease gave the turn away). */
uint64_t gp_arb_answer(gp_arbiter *a, uint64_t gift, int defer, uint64_t since)
{
    gp_arb_shm *r = a->r;
    if (pthread_mutex_trylock(&a->answering) != 0) return 0;
    if (gp_arb_lock(r) != GP_OK) {
        pthread_mutex_unlock(&a->answering);
        return 0;
    }
    gp_arb_slot *me = &r->slots[a->slot];
    uint32_t seq = atomic_load(&me->ask_seq);
    uint64_t bytes = me->ask_bytes, asked_at = me->ask_time;
    int level = me->ask_level;
    if (me->held > a->room_told && gp_arb_may_be_swapped(r, a->slot)) /* (a tenant joined) */
        atomic_store(&a->swap_room, a->room_told = me->held);
    gp_arb_unlock(r);
    /* Not in a free (GP_DEFER_ALL: not where a tenant parks): there it
     * gives what it can without swapping, and swaps at its next
     * allocation if asked again. */
    int swap = level == GP_RECLAIM_SWAP && a->swap_out && !atomic_load(&a->away) && defer != GP_DEFER_ALL;
    if (level == GP_RECLAIM_SWAP && !swap) level = GP_RECLAIM_OFFLOAD;
    if (!swap && defer && !gift && bytes && atomic_load(&a->turns) &&
        (defer == GP_DEFER_ALL || defer == GP_DEFER_BUT_SWAP || level == GP_RECLAIM_CACHE)) {
        atomic_store(&a->deferred, seq);
        pthread_mutex_unlock(&a->answering);
        return 0;
    }
    gp_pool *pool = atomic_load(&a->pool);
    uint64_t given = 0;
    int away = 0;
    if (swap) {
        if (gp_arb_swap_out(a, &given) != GP_OK) gp_error_clear(); /* (its figures keep the status) */
        away = atomic_load(&a->away);
        if (!away) level = GP_RECLAIM_OFFLOAD, given = 0; /* (the host limit: what it can) */
    }
    if (!away && bytes && a->reclaim) given = a->reclaim(a->reclaim_arg, bytes, level);
    else if (!away && bytes && pool) given = gp_pool_trim(pool, bytes);
    if (gift > given && pool) given += gp_pool_trim(pool, gift - given);
    uint64_t cached = 0;
    if (pool) {
        gp_stats s;
        gp_pool_stats(pool, &s, 0);
        cached = s.reserved - s.allocated;
    }
    if (gp_arb_lock(r) == GP_OK) {
        if (gift) seq = atomic_load(&me->ask_seq);
        me->answer_seq = seq;
        me->answer_bytes = given;
        me->cached = cached;
        me->heartbeat = gp_now_ns();
        if (bytes || given) {
            me->n_given++;
            me->bytes_given += given;
            gp_lat_add(me, me->heartbeat - (bytes ? asked_at : since));
        }
        if (atomic_load(&me->ask_seq) == seq) {
            me->ask_bytes = 0, me->ask_time = 0, me->ask_level = 0;
            atomic_store(&me->swap_asked, 0);
        }
        gp_arb_unlock(r);
        gp_arb_changed(r);
    }
    atomic_store(&a->answered, seq);
    pthread_mutex_unlock(&a->answering);
    /* Parked: back before the call that answered returns (a failure
     * leaves it away: the stack's next call tries again and reports it). */
    if (away && gp_arbiter_swap_in(a) != GP_OK) gp_error_clear();
    return given;
}

uint64_t gp_arb_poll(gp_arbiter *a, int defer)
{
    if (!a || gp_arb_forked(a)) return 0;
    const gp_arb_slot *me = &a->r->slots[a->slot];
    uint32_t seq = atomic_load_explicit(&me->ask_seq, memory_order_relaxed);
    if (seq == atomic_load_explicit(&a->answered, memory_order_relaxed) ||
        (defer && seq == atomic_load_explicit(&a->deferred, memory_order_relaxed) &&
         !(defer != GP_DEFER_ALL && atomic_load_explicit(&me->swap_asked, memory_order_relaxed))))
        return 0;
    return gp_arb_answer(a, 0, defer, 0);
}

uint64_t gp_arbiter_poll(gp_arbiter *a) { return gp_arb_poll(a, GP_DEFER_ALL); }

/* ------------------------------------------------------------- waiting */

/* Take in the answers to this wait's asks (under the lock). */
static void gp_collect(gp_arb_shm *r, gp_arb_slot *me, gp_asked *v, uint64_t now)
{
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        gp_arb_slot *s = &r->slots[i];
        if (!v[i].pending) continue;
        if (s->pid != v[i].pid) { v[i].pending = 0; continue; } /* gone */
        if ((int32_t)(s->answer_seq - v[i].seq) < 0) continue;
        v[i].pending = 0;
        me->n_received++;
        me->bytes_received += s->answer_bytes;
        v[i].not_before = now + (s->answer_bytes ? 0 : GP_ARB_BACKOFF_NS);
    }
}

/* Whether slot i goes before slot k among those asked: the lowest
 * priority first; between equals one that is parked (waits itself) before
 * one that computes, the youngest wait first; then the largest holder. */
static int gp_ask_before(const gp_arb_shm *r, int i, int k)
{
    const gp_arb_slot *s = &r->slots[i], *o = &r->slots[k];
    if (s->priority != o->priority) return s->priority < o->priority;
    if ((s->want_since != 0) != (o->want_since != 0)) return s->want_since != 0;
    if (s->want_since != o->want_since) return s->want_since > o->want_since;
    return s->held > o->held;
}

/* Ask others for `short_b` bytes (under the lock): lower priorities give
 * cache and idle offloadable memory, the lowest first; equal priorities
 * give their cache after them; higher priorities are never asked.  A
 * tenant whose answer left this one short, or whose cache and offloadable
 * memory could not cover the ask anyway, is asked to swap out whole, if
 * it may be swapped for this one (gp_arb_swappable).  What earlier asks of
 * this wait still owe counts. */
static void gp_ask(gp_arb_shm *r, int me_i, gp_asked *v, uint64_t short_b, uint64_t now)
{
    const gp_arb_slot *me = &r->slots[me_i];
    int order[GP_ARB_SLOTS], n = 0;
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        const gp_arb_slot *s = &r->slots[i];
        if (v[i].pending && s->pid == v[i].pid) {
            short_b -= short_b < v[i].bytes ? short_b : v[i].bytes;
            continue;
        }
        if (s->pid != v[i].pid) v[i] = (gp_asked){.pid = s->pid};
        int swap = gp_arb_swappable(r, i, me_i, now);
        if (i == me_i || !s->pid || !s->held || s->priority > me->priority || s->swapped) continue;
        if (now < v[i].not_before && !(swap && v[i].level < GP_RECLAIM_SWAP)) continue;
        int k = n++;
        for (; k > 0 && gp_ask_before(r, i, order[k - 1]); k--) order[k] = order[k - 1];
        order[k] = i;
    }
    for (int k = 0; k < n && short_b; k++) {
        int i = order[k];
        gp_arb_slot *s = &r->slots[i];
        uint64_t ask = short_b < s->held ? short_b : s->held;
        int level = s->priority < me->priority ? GP_RECLAIM_OFFLOAD : GP_RECLAIM_CACHE;
        uint64_t could = level == GP_RECLAIM_OFFLOAD ? s->cached + s->offloadable : s->cached;
        if (gp_arb_swappable(r, i, me_i, now) && ((v[i].seq && v[i].level >= level) || could < ask)) level = GP_RECLAIM_SWAP;
        if (s->ask_bytes < ask) s->ask_bytes = ask;
        if (s->ask_level < level) s->ask_level = level;
        if (level == GP_RECLAIM_SWAP) atomic_store(&s->swap_asked, 1);
        if (!s->ask_time) s->ask_time = now;
        s->ask_from = me_i;
        uint32_t seq = atomic_fetch_add_explicit(&s->ask_seq, 1, memory_order_release) + 1;
        v[i] = (gp_asked){.pid = s->pid, .pending = 1, .seq = seq, .bytes = ask, .level = level};
        short_b -= ask;
    }
}

/* Post the want of `want` bytes, or (lease) of the room to hold `lease`:
 * queued behind every earlier one of its kind and priority.  `step`: the
 * tenant is mid-way in a step. */
gp_status gp_arb_wait_begin(gp_arbiter *a, gp_wait *w, uint64_t want, uint64_t lease, int step,
                               int counted)
{
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    memset(w->v, 0, sizeof w->v);
    w->t0 = gp_now_ns();
    w->deadline = w->t0 + a->timeout_ns;
    w->lease = lease;
    w->counted = counted;
    w->defer = GP_ANSWER_NOW;
    gp_status st = gp_arb_lock(r);
    if (st != GP_OK) return st;
    if (lease) want = lease > me->held ? lease - me->held : 0;
    me->wanted = gp_arb_clamp(r, w->want = want); /* (gp_arb_check's bound) */
    me->want_step = w->step = step;
    if (!me->want_since) me->want_since = w->t0;
    me->n_waits += (uint64_t)counted;
    gp_arb_unlock(r);
    gp_arb_changed(r);
    return GP_OK;
}

/* One look: answer the asks to this tenant, reclaim dead ones, take in the
 * answers to this wait's asks and ask for what is still short.  *short_b:
 * the bytes neither the group nor the tenant's own cache (`have`, which
 * its pool keeps when it fails from the figures) can give now; *gen: to
 * sleep on. */
gp_status gp_arb_wait_look(gp_arbiter *a, gp_wait *w, uint64_t have, uint64_t *short_b, uint32_t *gen)
{
    gp_arb_shm *r = a->r;
    uint64_t p0 = atomic_load(&a->parked_ns);
    gp_arb_poll(a, w->defer); /* asked meanwhile (it may swap out and back) */
    /* Time swapped out holds nothing of the group's: no timeout counts it. */
    if (w->deadline != UINT64_MAX) w->deadline += atomic_load(&a->parked_ns) - p0;
    uint64_t now = gp_now_ns();
    gp_status st = gp_arb_lock(r);
    if (st != GP_OK) return st;
    if (now >= a->next_reap) {
        if (gp_arb_reap(r)) gp_arb_changed(r);
        a->next_reap = now + GP_ARB_REAP_NS;
    }
    *gen = atomic_load(&r->gen);
    gp_arb_slot *me = &r->slots[a->slot];
    if (w->lease) me->wanted = gp_arb_clamp(r, w->want = w->lease > me->held ? w->lease - me->held : 0);
    /* (A wait inside this one -- a swap out and back answered meanwhile --
     * ended its own want: this one's is posted again, behind the others.) */
    if (!me->wanted && w->want) me->wanted = gp_arb_clamp(r, w->want), me->want_since = now, me->want_step = w->step;
    uint64_t avail = gp_arb_avail(r, a->slot, NULL, NULL) + have;
    *short_b = w->want > avail ? w->want - avail : 0;
    gp_collect(r, me, w->v, now);
    if (*short_b) gp_ask(r, a->slot, w->v, *short_b, now);
    gp_arb_unlock(r);
    if (*short_b) gp_arb_changed(r); /* an asked tenant may sleep in its own wait */
    return GP_OK;
}

void gp_arb_wait_sleep(gp_arbiter *a, gp_wait *w, uint32_t gen, uint64_t until)
{
    uint64_t now = gp_now_ns();
    if (now + GP_ARB_NAP_NS < until) until = now + GP_ARB_NAP_NS;
    if (w->deadline < until) until = w->deadline;
    if (until > now) gp_arb_sleep(a->r, gen, until - now);
}

/* The wait is over; a lease's, if `ok`, begins the lease. */
void gp_arb_wait_end(gp_arbiter *a, gp_wait *w, int ok)
{
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    uint64_t dt = gp_now_ns() - w->t0;
    if (gp_arb_lock(r) != GP_OK) return;
    gp_collect(r, me, w->v, w->t0 + dt);
    if (ok && w->lease) me->lease = w->lease;
    if (ok && w->counted) gp_arb_keep(a, w->t0 + dt);
    me->wanted = 0, me->want_since = 0, me->want_step = 0;
    if (w->counted) {
        me->wait_ns += dt;
        if (dt > me->wait_max_ns) me->wait_max_ns = dt;
        if (!ok) me->n_wait_fail++;
    }
    gp_arb_unlock(r);
    gp_arb_changed(r);
}

/* The slow path of gp_arbiter_alloc: post the want, ask, wait, retry. */
static void *gp_wait_alloc(gp_arbiter *a, gp_pool *pool, size_t size, gp_stream stream, gp_tag tag,
                           int priority, gp_status *st)
{
    uint64_t unit = atomic_load(&a->unit);
    if (!unit) unit = 2 * 1024 * 1024;
    gp_wait w;
    /* With yield points, every allocation is in a step. */
    if ((*st = gp_arb_wait_begin(a, &w, (size + unit - 1) / unit * unit, 0, atomic_load(&a->turns), 1)) != GP_OK)
        return NULL;
    void *p = NULL;
    int was_short = 1, count_cache = 1;
    uint64_t next_try = w.t0;
    for (;;) {
        uint64_t short_b;
        uint32_t gen;
        gp_stats s;
        gp_pool_stats(pool, &s, 0);
        uint64_t have = count_cache ? s.reserved - s.allocated : 0;
        if ((*st = gp_arb_wait_look(a, &w, have, &short_b, &gen)) != GP_OK) break;
        uint64_t now = gp_now_ns();
        /* Retry as soon as the registry has room, else now and then (the
         * device, or this process's own frees, may have made some). */
        if (!short_b && was_short) next_try = now;
        was_short = short_b != 0;
        int last = now >= w.deadline;
        if (last || now >= next_try) {
            p = gp_alloc(pool, size, stream, tag, priority, st);
            if (p || *st != GP_ERR_OOM || last) break;
            /* Its cache was not enough (some of it is another priority's):
             * from now on ask for all of it. */
            if (!short_b) count_cache = 0;
            next_try = gp_now_ns() + GP_ARB_RETRY_NS;
            continue;
        }
        gp_arb_wait_sleep(a, &w, gen, next_try);
    }
    gp_arb_wait_end(a, &w, p != NULL);
    if (!p && *st == GP_ERR_OOM) {
        char report[2048], tenants[2048];
        gp_pool_last_oom(pool, report, sizeof report);
        gp_arbiter_report(a, tenants, sizeof tenants);
        gp_error_set(GP_ERR_OOM, "%s\n  the timeout passed: waited %.2f s in line for other tenants "
                     "(GPUPOOL_RECLAIM_TIMEOUT, time swapped out not counted); %s",
                     report, (double)(gp_now_ns() - w.t0) / 1e9, tenants);
    }
    return p;
}

void *gp_arbiter_alloc(gp_arbiter *a, gp_pool *pool, size_t size, gp_stream stream, gp_tag tag,
                       int priority, gp_status *status)
{
    gp_status dummy;
    if (!status) status = &dummy;
    gp_arb_poll(a, GP_DEFER_BUT_SWAP);
    if (a && atomic_load_explicit(&a->step_due, memory_order_relaxed)) gp_arb_step_mark(a);
    /* Without yield points, below a busy higher tenant: its compute share. */
    if (a && atomic_load_explicit(&a->r->busy_prio, memory_order_relaxed) > a->prio1 &&
        !atomic_load_explicit(&a->turns, memory_order_relaxed) && !gp_arb_forked(a))
        gp_arb_duty(a);
    void *p = gp_alloc(pool, size, stream, tag, priority, status);
    if (p || *status != GP_ERR_OOM || !a || gp_arb_forked(a)) return p;
    return gp_wait_alloc(a, pool, size, stream, tag, priority, status);
}
