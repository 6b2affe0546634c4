/*
 * arbiter_turns.c -- yield points (gp_arbiter_yield, arbiter.h): the step
 * between two of them, the turns of equal priorities, the compute share of
 * lower ones while a higher one is busy, and the lease a step takes.
 */
#include "arbiter_impl.h"

/* Whether a tenant above `me` is in a step: it allocated since its last
 * yield point (a server between requests does not) and has not come back,
 * for less than twice its last step and a second (longer: it went idle
 * without a yield point). */
static int gp_busy_above(const gp_arb_shm *r, const gp_arb_slot *me, uint64_t now)
{
    for (int j = 0; j < GP_ARB_SLOTS; j++) {
        const gp_arb_slot *s = &r->slots[j];
        if (s == me || !s->pid || s->priority <= me->priority) continue;
        /* Between two of its steps (its yield point) it is still busy: else
         * every yield point of it woke the paused ones into a run. */
        if (!s->step_start && s->step_end && now - s->step_end < GP_ARB_GAP_NS) return 1;
        if (s->step_start && now - s->step_start < 2 * s->step_ns + GP_ARB_BUSY_NS) return 1;
    }
    return 0;
}

/* While a higher priority computes, the tenants below it compute at most
 * GPUPOOL_TENANT_SHARE of the time, together: each step they end adds
 * its length times (1/share - 1) to the group's quiet time, and none of
 * them starts a step before it is over.  Memory arbitration cannot do
 * this: the GPU time-slices between processes, so a low step running
 * beside a high one slows it whatever memory each holds.  Asks are
 * answered meanwhile as `defer` says (the lease is taken after the
 * pause); the pause ends as soon as no higher one is busy. */
static void gp_pause(gp_arbiter *a, int defer)
{
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    if (a->share >= 1 || gp_arb_lock(r) != GP_OK) return;
    uint64_t now = gp_now_ns(), t0 = now;
    if (gp_busy_above(r, me, now)) {
        uint64_t owe = (uint64_t)((double)me->step_ns * (1 / a->share - 1));
        r->quiet_until = (r->quiet_until > now ? r->quiet_until : now) +
                         (owe < GP_ARB_PAUSE_MAX_NS ? owe : GP_ARB_PAUSE_MAX_NS);
    }
    while (now < r->quiet_until && gp_busy_above(r, me, now)) {
        uint64_t nap = r->quiet_until - now < GP_ARB_NAP_NS ? r->quiet_until - now : GP_ARB_NAP_NS;
        uint32_t gen = atomic_load(&r->gen);
        gp_arb_unlock(r);
        gp_arb_poll(a, defer); /* between steps: its lease is not taken yet */
        gp_arb_sleep(r, gen, nap);
        if (gp_arb_lock(r) != GP_OK) return;
        now = gp_now_ns();
    }
    me->pause_ns += now - t0;
    gp_arb_unlock(r);
}

/* A yield point passed: the turn begins if it was over, and the step with
 * the next allocation (gp_arb_step_mark). */
static void gp_step_due(gp_arbiter *a)
{
    if (gp_arb_lock(a->r) != GP_OK) return;
    if (!a->turn_start) a->turn_start = gp_now_ns();
    gp_arb_unlock(a->r);
    atomic_store(&a->step_due, 1);
}

void gp_arb_step_mark(gp_arbiter *a)
{
    if (gp_arb_forked(a) || !atomic_exchange(&a->step_due, 0) || gp_arb_lock(a->r) != GP_OK) return;
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    uint64_t now = gp_now_ns(), until = now + 2 * me->step_ns + GP_ARB_BUSY_NS;
    me->step_start = now;
    /* (Told to the tenants without yield points below it, on their hot path.) */
    int32_t busy = atomic_load(&r->busy_prio);
    if (atomic_load(&r->busy_until) < now) busy = 0;
    if (a->prio1 >= busy) {
        atomic_store(&r->busy_prio, a->prio1);
        if (until > atomic_load(&r->busy_until) || a->prio1 > busy) atomic_store(&r->busy_until, until);
    }
    gp_arb_unlock(r);
}

void gp_arb_duty(gp_arbiter *a)
{
    gp_arb_shm *r = a->r;
    uint64_t now = gp_now_ns(), since = atomic_load(&a->run_since);
    if (now >= atomic_load(&r->busy_until)) { /* (it went idle, or left) */
        atomic_store(&a->run_since, 0);
        return;
    }
    if (!since) atomic_store(&a->run_since, since = now);
    if (now - since < GP_ARB_SLICE_NS || gp_arb_lock(r) != GP_OK) return;
    r->slots[a->slot].step_ns = now - since; /* what this run owes the group's quiet */
    gp_arb_unlock(r);
    gp_pause(a, GP_ANSWER_NOW); /* (asks answered meanwhile: a swap among them) */
    atomic_store(&a->run_since, gp_now_ns());
}

uint64_t gp_arbiter_yield(gp_arbiter *a, uint64_t need)
{
    if (!a || gp_arb_forked(a)) return 0;
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    atomic_store(&a->turns, 1);
    atomic_store(&a->step_due, 0);
    if (gp_arb_lock(r) != GP_OK) return 0;
    /* The last step's lease ends here, and the step. */
    uint64_t now = gp_now_ns();
    me->wanted = 0, me->want_since = 0, me->want_step = 0, me->lease = 0;
    if (me->step_start) me->step_ns = now - me->step_start, me->step_end = now;
    me->step_start = 0;
    me->heartbeat = now;
    /* Within its turn, tenants of its own priority wait on (gp_arb_ahead). */
    me->in_turn = a->turn_start && now - a->turn_start < a->turn_ns;
    uint64_t peak = a->step_peak, since = UINT64_MAX, gift = 0;
    for (int j = 0; j < GP_ARB_SLOTS; j++) {
        const gp_arb_slot *s = &r->slots[j];
        if (!gp_arb_ahead(r, j, a->slot)) continue;
        uint64_t t = s->want_since ? s->want_since : now, l = gp_arb_leased(s);
        if (t < since) since = t;
        gift += s->wanted > l ? s->wanted - l : 0;
    }
    /* What they wait for and the room no lease keeps does not cover: not
     * all its cache (a step stuck mid-way may want 128 MiB). */
    uint64_t room = gp_arb_free_room(r);
    gift = gift > room ? gift - room : 0;
    if (gift) a->turn_start = 0, me->in_turn = 0; /* it gives: its turn is over */
    int defer = me->in_turn ? GP_DEFER_EQUAL : GP_ANSWER_NOW;
    gp_arb_unlock(r);
    gp_arb_changed(r);
    /* Someone waits ahead of this tenant: its cache goes to them now, at
     * a point where it holds no step's memory. */
    uint64_t given = gift ? gp_arb_answer(a, gift, GP_DEFER_ALL, since) : gp_arb_poll(a, GP_DEFER_BUT_SWAP);
    gp_pause(a, defer);
    if (gp_arb_lock(r) != GP_OK) return given;
    uint64_t lease = need > peak ? need : peak;
    a->step_peak = me->held;
    int enough = lease <= me->held;
    if (enough) me->lease = lease; /* its own, if its pool unmaps some mid-step */
    gp_arb_unlock(r);
    /* Wait for the step's memory, in line, before the step takes any. */
    gp_wait w;
    if (!enough && gp_arb_wait_begin(a, &w, 0, lease, 0, 0) == GP_OK) {
        int granted = 0;
        w.defer = defer;
        for (;;) {
            uint64_t short_b;
            uint32_t gen;
            if (gp_arb_wait_look(a, &w, 0, &short_b, &gen) != GP_OK) break;
            if (!short_b) {
                granted = 1;
                break;
            }
            if (!w.counted && gp_arb_lock(r) == GP_OK) { /* it does wait: a wait */
                me->n_waits++;
                w.counted = 1;
                gp_arb_unlock(r);
            }
            if (gp_now_ns() >= w.deadline) break;
            gp_arb_wait_sleep(a, &w, gen, w.deadline);
        }
        gp_arb_wait_end(a, &w, granted);
    }
    gp_step_due(a);
    return given;
}
