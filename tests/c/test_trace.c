/*
 * test_trace.c -- the pool's history (trace.c and its hooks in pool.c), on
 * the host backend: events replayed from an empty pool give back the pool's
 * own figures, the ring keeps the newest events, frees through
 * record_stream complete later, OOMs, notes, contexts, GPUPOOL_TRACE.  Run
 * under ASan and UBSan by the test suite.
 */
#include <string.h>

#include "pool_check.h"

#define S1 ((gp_stream)(uintptr_t)0x100)
#define S2 ((gp_stream)(uintptr_t)0x200)

static gp_event *read_all(gp_pool *p, size_t *n)
{
    size_t cap, len;
    uint64_t rec;
    gp_pool_history_info(p, &cap, &len, &rec);
    gp_event *ev = calloc(cap ? cap : 1, sizeof *ev);
    *n = gp_pool_history_read(p, ev, cap);
    return ev;
}

/* Replay a complete history (recorded from the pool's creation): mapped
 * bytes and live blocks must come out as the pool's own figures, and every
 * free must name a live block. */
static void test_replay(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    CHECK(gp_pool_history(p, 100000, 0) == GP_OK);
    void *live[64] = {0};
    unsigned seed = 12345;
    for (int i = 0; i < 4000; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 8) % 64;
        if (live[k]) {
            if ((seed >> 20) % 7 == 0) CHECK(gp_record_stream(p, live[k], S2) == GP_OK);
            CHECK(gp_free(p, live[k]) == GP_OK);
            live[k] = NULL;
        } else {
            uint64_t size = 512 + (seed >> 12) % (3 * MiB);
            live[k] = gp_alloc(p, size, (seed >> 30) & 1 ? S1 : NULL, (gp_tag)((seed >> 4) % 3), 1, NULL);
            CHECK(live[k] != NULL);
        }
        if (i % 500 == 0) gp_host_stream_complete(be, S2);
        if (i % 1000 == 999) gp_pool_trim(p, UINT64_MAX);
    }
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    size_t n;
    gp_event *ev = read_all(p, &n);
    uint64_t mapped = 0, allocated = 0, n_alloc = 0, n_req = 0, n_done = 0, pending = 0;
    int bad_free = 0, bad_time = 0;
    /* Live blocks by address: a small open-addressing set is enough here. */
    enum { SLOTS = 1 << 12 };
    static uintptr_t addr_of[SLOTS];
    static uint64_t size_of[SLOTS];
    static uint8_t freed[SLOTS];
    memset(addr_of, 0, sizeof addr_of);
    for (size_t i = 0; i < n; i++) {
        const gp_event *e = &ev[i];
        if (i && e->time_ns < ev[i - 1].time_ns) bad_time++;
        unsigned h = (unsigned)((e->addr >> 9) * 2654435761u) % SLOTS;
        switch (e->action) {
        case GP_EV_MAP: mapped += e->size; break;
        case GP_EV_UNMAP: mapped -= e->size; break;
        case GP_EV_ALLOC:
            n_alloc++;
            allocated += e->size;
            while (addr_of[h] && addr_of[h] != e->addr) h = (h + 1) % SLOTS;
            if (addr_of[h] == e->addr) bad_free++; /* handed out twice */
            addr_of[h] = e->addr;
            size_of[h] = e->size;
            freed[h] = 0;
            break;
        case GP_EV_FREE_REQUESTED:
        case GP_EV_FREE_COMPLETED:
            while (addr_of[h] && addr_of[h] != e->addr) h = (h + 1) % SLOTS;
            if (addr_of[h] != e->addr || size_of[h] != e->size) { bad_free++; break; }
            if (e->action == GP_EV_FREE_REQUESTED) {
                if (freed[h]) bad_free++;
                freed[h] = 1;
                n_req++;
                allocated -= e->size;
                pending += e->size;
            } else {
                if (!freed[h]) bad_free++;
                n_done++;
                pending -= e->size;
                /* Remove with backward-shift deletion, to keep probing valid. */
                addr_of[h] = 0;
                for (unsigned j = (h + 1) % SLOTS; addr_of[j]; j = (j + 1) % SLOTS) {
                    uintptr_t a = addr_of[j];
                    uint64_t sz = size_of[j];
                    uint8_t f = freed[j];
                    addr_of[j] = 0;
                    unsigned t = (unsigned)((a >> 9) * 2654435761u) % SLOTS;
                    while (addr_of[t]) t = (t + 1) % SLOTS;
                    addr_of[t] = a;
                    size_of[t] = sz;
                    freed[t] = f;
                }
            }
            break;
        default: bad_free++; break;
        }
    }
    CHECK(n > 4000);
    CHECK(bad_free == 0);
    CHECK(bad_time == 0);
    CHECK(mapped == s.reserved);
    CHECK(allocated == s.allocated);
    CHECK(pending == s.pending);
    CHECK(n_alloc == s.n_alloc);
    CHECK(n_req == s.n_free);
    CHECK(n_done > 0 && n_done <= n_req);
    CHECK(s.n_unmap > 0); /* the trims unmapped: UNMAP events were replayed */
    free(ev);
    done(p);
}

/* The ring keeps the newest events, oldest first; a resize keeps the newest
 * that fit; off drops it. */
static void test_ring(void)
{
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, NULL);
    size_t cap, len;
    uint64_t rec;
    gp_pool_history_info(p, &cap, &len, &rec);
    CHECK(cap == 0 && len == 0 && rec == 0);
    CHECK(gp_pool_history_stacks(p) == 0);
    CHECK(gp_pool_history(p, 16, 1) == GP_OK);
    CHECK(gp_pool_history_stacks(p) == 1);
    uintptr_t last = 0;
    for (uint64_t i = 1; i <= 50; i++) {
        void *x = gp_alloc(p, i * 1024, NULL, 0, 1, NULL);
        last = (uintptr_t)x;
        if (i < 50) gp_free(p, x);
    }
    gp_pool_history_info(p, &cap, &len, &rec);
    CHECK(cap == 16 && len == 16);
    CHECK(rec == 1 + 50 + 2 * 49); /* one map, 50 allocs, 49 x (requested, completed) */
    gp_event ev[16];
    CHECK(gp_pool_history_read(p, ev, 16) == 16);
    CHECK(ev[15].action == GP_EV_ALLOC && ev[15].addr == last && ev[15].size == 50 * 1024);
    CHECK(ev[14].action == GP_EV_FREE_COMPLETED && ev[13].action == GP_EV_FREE_REQUESTED);
    CHECK(ev[13].size == 49 * 1024);
    /* A short read gives the newest. */
    gp_event two[2];
    CHECK(gp_pool_history_read(p, two, 2) == 2);
    CHECK(two[1].addr == last && two[0].action == GP_EV_FREE_COMPLETED);
    /* Resize down keeps the newest 4; up keeps all of those. */
    CHECK(gp_pool_history(p, 4, 0) == GP_OK);
    CHECK(gp_pool_history_stacks(p) == 0);
    gp_pool_history_info(p, &cap, &len, &rec);
    CHECK(cap == 4 && len == 4 && rec == 149);
    CHECK(gp_pool_history_read(p, ev, 16) == 4);
    CHECK(ev[3].addr == last && ev[0].action == GP_EV_ALLOC && ev[0].size == 49 * 1024);
    CHECK(gp_pool_history(p, 100, 0) == GP_OK);
    gp_free(p, (void *)last);
    gp_pool_history_info(p, &cap, &len, &rec);
    CHECK(cap == 100 && len == 6 && rec == 151);
    CHECK(gp_pool_history_read(p, ev, 16) == 6);
    CHECK(ev[3].addr == last && ev[5].action == GP_EV_FREE_COMPLETED && ev[5].addr == last);
    CHECK(gp_pool_history(p, 0, 1) == GP_OK);
    gp_pool_history_info(p, &cap, &len, &rec);
    CHECK(cap == 0 && len == 0 && gp_pool_history_stacks(p) == 0);
    CHECK(gp_pool_history_read(p, ev, 16) == 0);
    gp_alloc(p, 4096, NULL, 0, 1, NULL); /* off: nothing recorded, nothing breaks */
    gp_pool_history_info(p, &cap, &len, &rec);
    CHECK(len == 0);
    done(p);
}

/* record_stream: the completion comes when the other stream's work did. */
static void test_pending_free(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    CHECK(gp_pool_history(p, 64, 0) == GP_OK);
    void *x = gp_alloc(p, 8192, S1, 3, 2, NULL);
    CHECK(gp_record_stream(p, x, S2) == GP_OK);
    CHECK(gp_free(p, x) == GP_OK);
    size_t n;
    gp_event *ev = read_all(p, &n);
    CHECK(n == 3 && ev[2].action == GP_EV_FREE_REQUESTED && ev[2].stream == S1 && ev[2].tag == 3 &&
          ev[2].priority == 2);
    free(ev);
    gp_host_stream_complete(be, S2);
    gp_free(p, gp_alloc(p, 512, NULL, 0, 1, NULL)); /* polls the pending block */
    ev = read_all(p, &n);
    CHECK(n == 7);
    CHECK(n == 7 && ev[3].action == GP_EV_FREE_COMPLETED && ev[3].addr == (uintptr_t)x && ev[3].size == 8192);
    free(ev);
    done(p);
}

/* OOM, notes and contexts. */
static void test_oom_note_context(void)
{
    gp_pool *p = make_pool(4 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, NULL);
    CHECK(gp_pool_history(p, 64, 1) == GP_OK);
    gp_set_context(7);
    gp_status st;
    CHECK(gp_alloc(p, 8 * MiB, S1, 2, 3, &st) == NULL && st == GP_ERR_OOM);
    gp_set_context(0);
    CHECK(strstr(gp_last_error(), "out of memory") || strstr(gp_last_error(), "8388608"));
    CHECK(gp_pool_history_note(p, GP_EV_OFFLOAD, 0x1000, 4096, 2, 1) == GP_OK);
    CHECK(gp_pool_history_note(p, GP_EV_COUNT, 0x1000, 4096, 2, 1) == GP_ERR_INVALID);
    CHECK(gp_pool_history_note(p, GP_EV_RESTORE, 0x1000, 4096, 2, 300) == GP_ERR_INVALID);
    size_t n;
    gp_event *ev = read_all(p, &n);
    CHECK(n == 2);
    CHECK(n == 2 && ev[0].action == GP_EV_OOM && ev[0].size == 8 * MiB && ev[0].stream == S1 &&
          ev[0].tag == 2 && ev[0].priority == 3 && ev[0].context == 7);
    CHECK(n == 2 && ev[0].addr <= 4 * MiB); /* the device's free bytes */
    CHECK(n == 2 && ev[1].action == GP_EV_OFFLOAD && ev[1].size == 4096 && ev[1].context == 0);
    free(ev);
    done(p);
}

/* GPUPOOL_TRACE: on from creation, with stacks; a reserve's mapping is in it. */
static void test_config_trace(void)
{
    gp_config cfg;
    gp_config_default(&cfg);
    CHECK(gp_config_set(&cfg, "GPUPOOL_TRACE", "1") == GP_OK);
    CHECK(gp_config_set(&cfg, "mode", "reserve") == GP_OK);
    CHECK(gp_config_set(&cfg, "reserve", "8MiB") == GP_OK);
    gp_backend *be;
    gp_pool *p;
    CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK);
    CHECK(gp_pool_create(be, &cfg, &p) == GP_OK);
    size_t cap, len;
    uint64_t rec;
    gp_pool_history_info(p, &cap, &len, &rec);
    CHECK(cap == GP_HISTORY_DEFAULT && gp_pool_history_stacks(p) == 1);
    size_t n;
    gp_event *ev = read_all(p, &n);
    uint64_t mapped = 0;
    for (size_t i = 0; i < n; i++) mapped += ev[i].action == GP_EV_MAP ? ev[i].size : 0;
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    CHECK(n >= 1 && mapped == s.reserved && s.reserved >= 8 * MiB);
    free(ev);
    done(p);
}

int main(void)
{
    /* The tests use tag ids 1..3: make them exist. */
    gp_tag t;
    CHECK(gp_tag_intern("t1", &t) == GP_OK && t == 1);
    CHECK(gp_tag_intern("t2", &t) == GP_OK && t == 2);
    CHECK(gp_tag_intern("t3", &t) == GP_OK && t == 3);
    test_replay();
    test_ring();
    test_pending_free();
    test_oom_note_context();
    test_config_trace();
    return check_done();
}
