/*
 * test_faults.c -- fault injection: every backend call the pool makes may
 * fail, and the pool must survive each failure.
 *
 * First the injection itself (gp_host_fail: the nth call, once or from then
 * on, junk outputs, nothing changed) and the backend's misuse checks.  Then
 * the walk: a seeded workload over the public C API (allocations of many
 * sizes, streams, tags and priorities, frees, record_stream, trims, pool and
 * tag limits, re-tagging, a pressure callback, a CUDA graph capture with a
 * forked stream, the history on, headroom), in three configurations
 * (expandable with and without placement, reserve mode), is run once to
 * count the calls of every backend function, then once for every function F,
 * every N up to F's count, and each way of failing (the Nth call only; every
 * call from the Nth on), with that call failing.  Each run checks:
 *   - before the fault fires, every operation returns what it returned in
 *     the run without a fault (injection perturbs nothing before it fires);
 *   - the operation that hit the fault either absorbed it (a failed event
 *     record falls back to a sync, a failed stream wait to another block, a
 *     failed map with OOM to a trim and retry) or failed with a status and
 *     a message that names the injected failure;
 *   - an operation hit by no fault fails only as it may in any state
 *     (allocations and re-tagging: OOM or a limit), always with a message;
 *   - gp_pool_check and the backend's mapped bytes agree after every
 *     operation, and the backend saw no misuse;
 *   - once faults stop (and the streams finished their work): every block
 *     frees, nothing stays pending or with a graph pool, the cache empties
 *     to nothing mapped (expandable; reserve mode keeps its reserve), no
 *     event is left, the workload's allocations succeed again, and the pool
 *     and the backend are destroyed clean.  LeakSanitizer checks host
 *     memory at exit.
 * The regression tests of what the walk found come first.
 *
 * Usage: test_faults [seed]   (GP_FAULT_REPORT_ALL=1 prints every failure,
 * not only the first 30)
 */
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>

#include "codec.h"
#include "offload.h"
#include "pool_check.h"
#include "rng.h"
#include "stamps.h"

/* ------------------------------------------------------------- reporting */

static int n_reported;

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void report(const char *fmt, ...)
{
    check_fail++;
    if (n_reported++ >= (getenv("GP_FAULT_REPORT_ALL") ? INT32_MAX : 30)) return; /* the first say enough */
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static uint64_t misuse_now(void) { return gp_host_misuse(NULL, 0); }

/* ------------------------------------------------ the injection mechanism */

static gp_backend *host(uint64_t capacity)
{
    gp_backend *be;
    if (gp_backend_host_create(capacity, &be) != GP_OK) {
        fprintf(stderr, "host backend: %s\n", gp_last_error());
        exit(2);
    }
    return be;
}

static gp_status never_called(void *arg)
{
    (void)arg;
    CHECK(!"in_context ran its function although the call failed");
    return GP_OK;
}

static void test_nth_call_once_and_from(void)
{
    gp_backend *be = host(1 * MiB);
    uintptr_t base;
    CHECK(be->reserve(be, 64 * KiB, 4096, &base) == GP_OK);
    uint64_t h[4];
    gp_host_fail(be, GP_HOST_MAP, 2, GP_ERR_OOM, GP_HOST_FAIL_ONCE);
    CHECK(be->map(be, base, 4096, &h[0]) == GP_OK);
    gp_error_clear();
    CHECK(be->map(be, base + 4096, 4096, &h[1]) == GP_ERR_OOM);
    CHECK(strcmp(gp_last_error(), "host map: injected failure (out of memory)") == 0);
    CHECK(h[1] == GP_HOST_JUNK); /* outputs of a failed call are junk */
    CHECK(be->map(be, base + 4096, 4096, &h[1]) == GP_OK); /* once: the next one works */
    gp_host_counters c;
    gp_host_counters_get(be, &c);
    CHECK(c.calls[GP_HOST_MAP] == 3 && c.injected[GP_HOST_MAP] == 1 && c.mapped == 2 * 4096);

    /* From the nth on, until disarmed; other functions are not affected. */
    gp_host_fail(be, GP_HOST_UNMAP, 1, GP_ERR_BACKEND, GP_HOST_FAIL_FROM);
    CHECK(be->unmap(be, base, 4096, h[0]) == GP_ERR_BACKEND);
    CHECK(be->unmap(be, base, 4096, h[0]) == GP_ERR_BACKEND);
    CHECK(be->map(be, base + 8192, 4096, &h[2]) == GP_OK);
    gp_host_counters_get(be, &c);
    CHECK(c.mapped == 3 * 4096 && c.injected[GP_HOST_UNMAP] == 2); /* failed unmaps changed nothing */
    gp_host_fail(be, GP_HOST_UNMAP, 0, GP_OK, GP_HOST_FAIL_ONCE);
    CHECK(be->unmap(be, base, 4096, h[0]) == GP_OK);
    CHECK(be->unmap(be, base + 4096, 4096, h[1]) == GP_OK);
    CHECK(be->unmap(be, base + 8192, 4096, h[2]) == GP_OK);

    /* Every other function that returns a status. */
    gp_stream s = (gp_stream)0x10;
    uint64_t ev, junk64 = 0;
    int flag = 0;
    void *pinned = NULL;
    gp_stream made = NULL;
    char buf[64];
    for (int fn = 0; fn < GP_HOST_FN_COUNT; fn++) gp_host_fail(be, (gp_host_fn)fn, 1, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    CHECK(be->reserve(be, 64 * KiB, 4096, &junk64) == GP_ERR_BACKEND && junk64 == GP_HOST_JUNK);
    CHECK(be->stream_wait(be, s, NULL) == GP_ERR_BACKEND);
    CHECK(be->event_record(be, s, &junk64) == GP_ERR_BACKEND && junk64 == GP_HOST_JUNK);
    CHECK(be->event_record(be, s, &ev) == GP_OK);
    CHECK(be->event_query(be, ev, &flag) == GP_ERR_BACKEND && flag != 0); /* junk says "done": a lie */
    CHECK(be->event_query(be, ev, &flag) == GP_OK && flag == 0);
    CHECK(be->is_capturing(be, s, &flag) == GP_ERR_BACKEND && flag != 0);
    CHECK(be->synchronize(be) == GP_ERR_BACKEND);
    CHECK(be->event_query(be, ev, &flag) == GP_OK && flag == 0); /* a failed sync waited for nothing */
    uint64_t fr, tot;
    CHECK(be->mem_info(be, &fr, &tot) == GP_ERR_BACKEND && fr == GP_HOST_JUNK && tot == GP_HOST_JUNK);
    CHECK(be->mem_info(be, &fr, &tot) == GP_OK && tot == 1 * MiB);
    CHECK(be->host_alloc(be, 4096, &pinned) == GP_ERR_BACKEND);
    CHECK(be->host_alloc(be, sizeof buf, &pinned) == GP_OK);
    void *own = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(own != MAP_FAILED);
    CHECK(be->host_populate(be, own, 8192) == GP_ERR_BACKEND);
    CHECK(be->host_populate(be, own, 8192) == GP_OK);
    CHECK(be->host_register(be, own, 8192) == GP_ERR_BACKEND);
    CHECK(be->host_register(be, own, 8192) == GP_OK);
    CHECK(be->stream_create(be, &made) == GP_ERR_BACKEND);
    CHECK(be->stream_create(be, &made) == GP_OK);
    CHECK(be->copy(be, buf, pinned, sizeof buf, GP_COPY_D2H, made) == GP_ERR_BACKEND);
    CHECK(be->event_wait(be, ev) == GP_ERR_BACKEND);
    CHECK(be->event_query(be, ev, &flag) == GP_OK && flag == 0);
    CHECK(be->event_wait(be, ev) == GP_OK);
    CHECK(be->event_query(be, ev, &flag) == GP_OK && flag == 1);
    CHECK(be->checksum(be, buf, 8, 0, buf, made) == GP_ERR_BACKEND);
    CHECK(be->gather(be, buf, NULL, NULL, 0, 16, 64, made) == GP_ERR_BACKEND);
    CHECK(be->in_context(be, never_called, NULL) == GP_ERR_BACKEND);
    CHECK(be->grant_peer(be, 1) == GP_ERR_BACKEND);
    gp_host_counters_get(be, &c);
    for (int fn = 0; fn < GP_HOST_FN_COUNT; fn++) {
        if (fn == GP_HOST_MAP || fn == GP_HOST_UNMAP) continue;
        if (c.injected[fn] != 1) fprintf(stderr, "%s: %llu injected\n", gp_host_fn_name((gp_host_fn)fn),
                                         (unsigned long long)c.injected[fn]);
        CHECK(c.injected[fn] == 1);
    }
    CHECK(c.n_host_alloc == 1 && c.streams_live == 1 && c.events_live == 1 && c.n_reserve == 1);
    be->event_release(be, ev);
    be->stream_destroy(be, made);
    be->host_free(be, pinned, sizeof buf);
    be->host_unregister(be, own, 8192);
    munmap(own, 8192);
    be->unreserve(be, base, 64 * KiB);
    CHECK(gp_host_fn_name(GP_HOST_EVENT_WAIT) && strcmp(gp_host_fn_name(GP_HOST_EVENT_WAIT), "event_wait") == 0);
    CHECK(gp_host_fn_name(GP_HOST_FN_COUNT) == NULL);
    uint64_t before = misuse_now();
    be->destroy(be);
    CHECK(misuse_now() == before); /* everything was given back */
}

static void test_misuse_is_counted(void)
{
    gp_backend *be = host(1 * MiB);
    uintptr_t base;
    uint64_t h, h2, ev;
    char msg[256];
    uint64_t m0 = misuse_now();
    CHECK(be->reserve(be, 64 * KiB, 4096, &base) == GP_OK);
    CHECK(be->map(be, base, 8192, &h) == GP_OK);
    CHECK(be->map(be, base + 4096, 4096, &h2) == GP_ERR_INVALID); /* over a mapping */
    CHECK(gp_host_misuse(msg, sizeof msg) == m0 + 1 && strstr(msg, "mapped already"));
    CHECK(be->map(be, base + 64 * KiB, 4096, &h2) == GP_ERR_INVALID); /* outside the reservation */
    CHECK(be->unmap(be, base, 4096, h) == GP_ERR_INVALID);           /* not as mapped */
    be->unreserve(be, base, 64 * KiB);                                /* still mapped */
    CHECK(be->event_record(be, NULL, &ev) == GP_OK);
    be->event_release(be, ev);
    be->event_release(be, ev); /* twice */
    int done_flag;
    CHECK(be->event_query(be, ev, &done_flag) == GP_ERR_INVALID);
    be->host_free(be, msg, 1);
    be->stream_destroy(be, (gp_stream)0x10);
    CHECK(misuse_now() == m0 + 8);
    be->destroy(be); /* leaves a mapping and a reservation */
    CHECK(gp_host_misuse(msg, sizeof msg) == m0 + 9 && strstr(msg, "1 mappings (8192 bytes), 1 reservations"));
}

/* A reserve that cannot be mapped: the error names the cause (it used to
 * come out garbled, read from the very buffer the message was written to). */
static void test_reserve_map_failure_is_named(void)
{
    gp_backend *be = host(64 * MiB);
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.mode = GP_MODE_RESERVE;
    cfg.chunk = 64 * KiB;
    cfg.reserve = (gp_size_spec){.bytes = 16 * MiB};
    gp_host_fail(be, GP_HOST_MAP, 3, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    gp_pool *p;
    uint64_t m0 = misuse_now();
    CHECK(gp_pool_create(be, &cfg, &p) == GP_ERR_BACKEND && p == NULL);
    const char *want = "gpupool: cannot map the reserve of 16777216 bytes on device 0: "
                       "host map: injected failure (device error)";
    if (strcmp(gp_last_error(), want) != 0) fprintf(stderr, "message: '%s'\n", gp_last_error());
    CHECK(strcmp(gp_last_error(), want) == 0);
    CHECK(misuse_now() == m0);
}

static int count_graph_blocks(void *arg, const gp_block_info *b)
{
    *(int *)arg += b->in_graph_pool;
    return 0;
}

/* A graph pool whose release could not synchronise the device keeps its
 * memory until a release is retried (it used to stay a graph pool's for
 * good: a second release was refused as one too many). */
static void test_graph_release_after_failed_sync(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    gp_stream s = (gp_stream)0x40;
    CHECK(gp_pool_capture_prepare(p, s) == GP_OK);
    CHECK(gp_pool_capture_begin(p, 5, s) == GP_OK);
    void *x = gp_alloc(p, 100 * KiB, s, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL);
    CHECK(x != NULL && gp_free(p, x) == GP_OK);
    CHECK(gp_pool_capture_end(p, s) == GP_OK);
    gp_host_fail(be, GP_HOST_SYNCHRONIZE, 1, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    CHECK(gp_pool_capture_release(p, 5) == GP_ERR_BACKEND && strstr(gp_last_error(), "injected"));
    int in_graph = 0;
    gp_pool_walk(p, count_graph_blocks, &in_graph);
    CHECK(in_graph == 1); /* still the graph's: the device may still replay it */
    CHECK(gp_pool_capture_release(p, 5) == GP_OK);
    in_graph = 0;
    gp_pool_walk(p, count_graph_blocks, &in_graph);
    CHECK(in_graph == 0);
    CHECK(gp_pool_capture_release(p, 5) == GP_ERR_INVALID); /* now it is one too many */
    gp_pool_empty_cache(p);
    gp_stats st;
    gp_pool_stats(p, &st, 0);
    CHECK(st.reserved == 0);
    /* While a capture is underway, a release of a pool no graph holds stays
     * a double release. */
    CHECK(gp_pool_capture_begin(p, 6, s) == GP_OK && gp_pool_capture_begin(p, 7, (gp_stream)0x50) == GP_OK);
    CHECK(gp_pool_capture_release(p, 6) == GP_OK);
    CHECK(gp_pool_capture_release(p, 6) == GP_ERR_INVALID);
    CHECK(gp_pool_capture_end(p, s) == GP_OK && gp_pool_capture_end(p, (gp_stream)0x50) == GP_OK);
    CHECK(gp_pool_capture_release(p, 7) == GP_OK);
    done(p);
}

/* An OOM report when the driver cannot say how much memory is free: no
 * figure made of what the failed call left behind. */
static void test_oom_report_without_mem_info(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(4 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    gp_host_fail(be, GP_HOST_MEM_INFO, 1, GP_ERR_BACKEND, GP_HOST_FAIL_FROM);
    gp_status st;
    CHECK(gp_alloc(p, 5 * MiB, NULL, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, &st) == NULL && st == GP_ERR_OOM);
    CHECK(strstr(gp_last_error(), "device free unknown") != NULL);
    CHECK(strstr(gp_last_error(), "TiB") == NULL); /* what junk comes out as */
    char buf[1024];
    gp_pool_oom_report(p, 1, buf, sizeof buf);
    CHECK(strstr(buf, "device free unknown") != NULL && strstr(buf, "TiB") == NULL);
    gp_host_fail_none(be);
    gp_pool_oom_report(p, 1, buf, sizeof buf);
    CHECK(strstr(buf, "device free 4.00 MiB of 4.00 MiB") != NULL);
    done(p);
}

/* ------------------------------------------------------------ the workload */

enum {
    OP_ALLOC, OP_FREE, OP_RECORD, OP_COMPLETE, OP_TRIM, OP_LIMIT, OP_TAG_LIMIT, OP_RETAG,
    OP_HEADROOM, OP_HISTORY, OP_PREPARE, OP_BEGIN, OP_END, OP_RELEASE, OP_OFFLOAD, OP_RESTORE, OP_KINDS
};
static const char *const op_names[OP_KINDS] = {
    "alloc", "free", "record_stream", "stream progress", "trim", "pool limit", "tag limit", "retag",
    "headroom", "history", "capture_prepare", "capture_begin", "capture_end", "capture_release", "offload",
    "restore"};

typedef struct op {
    uint8_t kind, slot, slot2, stream, tag, prio;
    uint64_t size;
} op;

#define SLOTS 40
#define MAX_OPS 200
#define NTAGS 4
/* Streams: the default, three others, the capturing one, and one the
 * capture forks to (it captures without being named to capture_begin). */
#define NSTREAMS 6
#define S_CAPTURE 4
#define S_FORKED 5
#define GRAPH_KEY 77
/* The tag the offload configuration offloads (by its ops, and under
 * pressure: it is registered, idle, at low priority). */
#define OFFLOADED 2
static const gp_stream streams[NSTREAMS] = {NULL, (gp_stream)0x10, (gp_stream)0x20, (gp_stream)0x30,
                                            (gp_stream)0x40, (gp_stream)0x50};
static gp_tag tags[NTAGS];

typedef struct config {
    const char *name;
    gp_mode mode;
    int placement;
    int offload; /* with an offloader (offload.h): its ops, its pressure callback */
    uint64_t seed;
} config;

typedef struct workload {
    config cfg;
    op ops[MAX_OPS];
    int n;
} workload;

#define CAPACITY (24 * MiB)
#define RESERVE (16 * MiB) /* reserve mode */

/* Log-uniform 1 B .. 2 MiB, now and then larger than any arena. */
static uint64_t rnd_size(void)
{
    if (rnd() % 40 == 0) return (1ull << 40) + rnd() % MiB;
    unsigned bits = (unsigned)(rnd() % 22);
    return (1ull << bits) + rnd() % (1ull << bits);
}

static void make_workload(workload *w, const config *c)
{
    rng_state = c->seed;
    w->cfg = *c;
    w->n = 0;
    int capture_at = 60 + (int)(rnd() % 20), release_at = 130 + (int)(rnd() % 20);
    /* Which slots the ops so far fill (if their allocation works), and which
     * of those have a recorded stream: frees, records and re-tags mostly go
     * to them, so that they do something. */
    int live[SLOTS] = {0}, recorded[SLOTS] = {0};
    while (w->n < 170) {
        op o = {.slot = (uint8_t)(rnd() % SLOTS), .slot2 = (uint8_t)(rnd() % SLOTS),
                .stream = (uint8_t)(rnd() % 4), .tag = (uint8_t)(rnd() % NTAGS), .prio = (uint8_t)(rnd() % 4)};
        for (int k = 0, want = (int)(rnd() % 3); k < SLOTS && rnd() % 8; k++) {
            int i = (o.slot + k) % SLOTS;
            if (live[i] && (want || recorded[i])) {
                o.slot = (uint8_t)i;
                break;
            }
        }
        if (w->n == capture_at) {
            /* A capture: prepare, begin, allocations on the capturing stream,
             * the forked one and an unrelated one, a free, end. */
            w->ops[w->n++] = (op){.kind = OP_PREPARE, .stream = S_CAPTURE};
            w->ops[w->n++] = (op){.kind = OP_BEGIN, .stream = S_CAPTURE};
            for (int i = 0; i < 6; i++)
                w->ops[w->n++] = (op){.kind = OP_ALLOC, .slot = (uint8_t)(SLOTS - 1 - i),
                                      .stream = (uint8_t)(i < 3 ? S_CAPTURE : i < 5 ? S_FORKED : 1),
                                      .size = rnd_size() % (2 * MiB) + 1, .prio = 1};
            w->ops[w->n++] = (op){.kind = OP_FREE, .slot = SLOTS - 2};
            w->ops[w->n++] = (op){.kind = OP_END, .stream = S_CAPTURE};
            continue;
        }
        if (w->n == release_at) {
            w->ops[w->n++] = (op){.kind = OP_RELEASE};
            continue;
        }
        if (w->n == 100) {
            /* Nearly the whole device, with memory live: the pool maps
             * chunk by chunk until the device says no, then rolls back. */
            w->ops[w->n++] = (op){.kind = OP_ALLOC, .slot = o.slot, .size = CAPACITY - 2 * MiB, .prio = 3};
            continue;
        }
        uint64_t r = rnd() % 100;
        if (c->offload && rnd() % 100 < 10) o.kind = rnd() % 2 ? OP_OFFLOAD : OP_RESTORE, o.tag = OFFLOADED;
        else if (r < 42) o.kind = OP_ALLOC, o.size = rnd_size();
        else if (r < 66) o.kind = OP_FREE;
        else if (r < 74) o.kind = OP_RECORD, o.stream = (uint8_t)(1 + rnd() % 3);
        else if (r < 79) o.kind = OP_COMPLETE;
        else if (r < 84) o.kind = OP_TRIM, o.size = rnd() % 3 == 0 ? UINT64_MAX : rnd() % (4 * MiB);
        else if (r < 87) o.kind = OP_LIMIT, o.size = rnd() % 2 ? 0 : 1 + rnd() % (8 * MiB);
        else if (r < 90) o.kind = OP_TAG_LIMIT, o.size = rnd() % 2 ? 0 : 1 + rnd() % (4 * MiB);
        else if (r < 94) o.kind = OP_RETAG;
        else if (r < 97) o.kind = OP_HEADROOM;
        else o.kind = OP_HISTORY, o.size = rnd() % 3 ? 64 + rnd() % 256 : 0;
        if (o.kind == OP_ALLOC) live[o.slot] = 1;
        if (o.kind == OP_FREE) live[o.slot] = recorded[o.slot] = 0;
        if (o.kind == OP_RECORD) recorded[o.slot] |= live[o.slot];
        w->ops[w->n++] = o;
    }
}

/* ------------------------------------------------------------- a run */

typedef struct slot {
    char *ptr;
    uint64_t size, stamp;
    int tag, prio;
    int lost; /* its contents may be lost, as a failed offload reported */
} slot;

/* What a fault does: function, which call, how, with what status. */
typedef struct fault {
    int on;
    gp_host_fn fn;
    uint64_t nth;
    int mode;
    gp_status status;
} fault;

typedef struct run_state {
    const workload *w;
    const fault *f;
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o; /* (offload configuration) */
    slot s[SLOTS];
    int n_live;
    unsigned n_offloads;
} run_state;

/* The offloader's own memory (its checksums), which the workload's figures
 * leave out. */
static gp_tag offloader_tag;

/* A live slot's block state: GP_BLOCK_OFFLOADED ones are not readable. */
static int state_of(run_state *r, int i)
{
    gp_block_info b;
    return gp_pool_lookup(r->p, r->s[i].ptr, &b) == GP_OK ? b.state : -1;
}

static int slot_ok(run_state *r, int i)
{
    return state_of(r, i) == GP_BLOCK_OFFLOADED || r->s[i].lost || stamp_ok(r->s[i].ptr, r->s[i].size, r->s[i].stamp);
}

static void forget(run_state *r, int i)
{
    r->s[i].ptr = NULL;
    r->n_live--;
}

static int free_slot(run_state *r, int i)
{
    int ok = slot_ok(r, i);
    gp_status st = gp_free(r->p, r->s[i].ptr);
    forget(r, i);
    return ok && st == GP_OK;
}

/* The pressure callback: gives up the lowest-priority live block below the
 * request's priority, as offload would. */
static uint64_t pressure(void *arg, gp_pool *p, uint64_t needed, int priority)
{
    run_state *r = arg;
    (void)needed;
    int best = -1;
    for (int i = 0; i < SLOTS; i++)
        if (r->s[i].ptr && r->s[i].prio < priority && (best < 0 || r->s[i].prio < r->s[best].prio)) best = i;
    if (best < 0) return 0;
    gp_block_info info;
    if (gp_pool_lookup(p, r->s[best].ptr, &info) != GP_OK) return 0;
    if (!free_slot(r, best)) report("pressure callback: the free of a live block failed: %s", gp_last_error());
    return info.size;
}

static gp_pool *new_pool(const config *c, gp_backend *be, gp_status *st)
{
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.mode = c->mode;
    cfg.placement = c->placement ? GP_PLACE_LIFETIME : GP_PLACE_NONE;
    cfg.chunk = 64 * KiB;
    cfg.large_chunk = 512 * KiB;
    cfg.small_size = 64 * KiB;
    cfg.reserve = (gp_size_spec){.bytes = RESERVE};
    cfg.trace = 1;
    gp_pool *p = NULL;
    *st = gp_pool_create(be, &cfg, &p);
    return p;
}

static void describe(const run_state *r, char *buf, size_t n);

/* Offload a tag: its resident blocks move, or (a failure) stay resident,
 * bytes and all -- unless the device refused to undo it too: then the
 * error says the tag stays offloaded and how many bytes were lost. */
static gp_status offload(run_state *r, int tag)
{
    char what[160];
    describe(r, what, sizeof what);
    int was[SLOTS];
    for (int i = 0; i < SLOTS; i++) was[i] = r->s[i].ptr && r->s[i].tag == tag ? state_of(r, i) : -1;
    /* Raw and compressed (zstd on the host backend) in turn; with and
     * without a refill of the cache the last restore gave back (its maps
     * fail too) in turn of two. */
    gp_offload_opts opts = {.keep = 1, .codec = r->n_offloads % 2 ? GP_CODEC_AUTO : GP_CODEC_RAW, .elem_size = 2,
                            .refill = r->n_offloads / 2 % 2};
    r->n_offloads++;
    gp_offload_result res;
    gp_status st = gp_offload_tags(r->o, &tags[tag], 1, &opts, &res);
    const char *gave_up = st != GP_OK ? strstr(gp_last_error(), "it stays offloaded and ") : NULL;
    unsigned long long lost = gave_up ? strtoull(gave_up + strlen("it stays offloaded and "), NULL, 10) : 0;
    for (int i = 0; gave_up && i < SLOTS; i++)
        if (was[i] == GP_BLOCK_USED && state_of(r, i) == GP_BLOCK_OFFLOADED) r->s[i].lost |= lost > 0;
    for (int i = 0; st != GP_OK && !gave_up && i < SLOTS; i++)
        if (was[i] == GP_BLOCK_USED && (state_of(r, i) != GP_BLOCK_USED || !slot_ok(r, i)))
            report("%s: a failed offload left the block at %p of tag %d %s", what, (void *)r->s[i].ptr,
                   tag, state_of(r, i) != GP_BLOCK_USED ? "offloaded" : "overwritten");
    return st;
}

/* gp_restore_tags without accept_loss, then, where it refused because an
 * offload lost bytes, with it; res->refused says whether it refused. */
typedef struct restored {
    gp_offload_result r;
    int refused;
} restored;

static gp_status restore_accepting(gp_offloader *o, int tag, restored *res)
{
    res->refused = 0;
    gp_status st = gp_restore_tags(o, &tags[tag], 1, 0, &res->r);
    if (st == GP_ERR_BACKEND && strstr(gp_last_error(), "were lost when an offload")) {
        res->refused = 1;
        st = gp_restore_tags(o, &tags[tag], 1, 1, &res->r);
    }
    return st;
}

/* Restore a tag: all of it comes back with its bytes, or (a failure) what
 * was offloaded stays so -- but for its offloads restored before the one
 * that failed, which are back whole.  Bytes a failed offload lost come
 * back uninitialised, and the restore says how many. */
static gp_status restore(run_state *r, int tag)
{
    char what[160];
    describe(r, what, sizeof what);
    int was[SLOTS];
    for (int i = 0; i < SLOTS; i++) was[i] = r->s[i].ptr && r->s[i].tag == tag ? state_of(r, i) : -1;
    restored res;
    /* Bytes known lost come back only when the caller accepts it. */
    int known_lost = 0;
    for (int i = 0; i < SLOTS; i++) known_lost |= was[i] == GP_BLOCK_OFFLOADED && r->s[i].lost;
    gp_status st = restore_accepting(r->o, tag, &res);
    if (known_lost && !res.refused)
        report("%s: a restore of tag %d, whose bytes an offload lost, went ahead without accept_loss", what, tag);
    for (int i = 0; i < SLOTS; i++) {
        if (was[i] < 0) continue;
        int now = state_of(r, i);
        if (st == GP_OK && r->s[i].lost) {
            if (!res.r.lost) report("%s: a restore brought back a block whose bytes were lost and said nothing", what);
            stamp_put(r->s[i].ptr, r->s[i].size, r->s[i].stamp);
            r->s[i].lost = 0;
        }
        if (st == GP_OK ? now != GP_BLOCK_USED || !slot_ok(r, i)
                        : was[i] == GP_BLOCK_OFFLOADED && !(now == was[i] || (now == GP_BLOCK_USED && slot_ok(r, i))))
            report("%s: a%s restore left the block at %p of tag %d in state %d (was %d)%s", what,
                   st == GP_OK ? "" : " failed", (void *)r->s[i].ptr, tag, now, was[i],
                   now == GP_BLOCK_USED && !slot_ok(r, i) ? ", its bytes changed" : "");
    }
    return st;
}

/* Run one operation; returns its status. */
static gp_status do_op(run_state *r, const op *o)
{
    gp_pool *p = r->p;
    slot *s = &r->s[o->slot];
    gp_status st = GP_OK;
    switch (o->kind) {
    case OP_ALLOC: {
        if (s->ptr) return GP_OK;
        char *q = gp_alloc(p, o->size, streams[o->stream], tags[o->tag], o->prio, &st);
        if (!q) return st;
        if ((uintptr_t)q % 512) report("%s: alloc of %llu gave %p, not aligned", r->w->cfg.name,
                                       (unsigned long long)o->size, (void *)q);
        /* (the pressure callback may have emptied this slot's neighbours,
         * never this one: it was empty) */
        *s = (slot){q, o->size, rnd(), o->tag, o->prio};
        stamp_put(s->ptr, s->size, s->stamp);
        r->n_live++;
        return GP_OK;
    }
    case OP_FREE:
        if (s->ptr && !free_slot(r, o->slot)) {
            report("%s: free of a live block failed or its stamps were overwritten: %s", r->w->cfg.name,
                   gp_last_error());
            return GP_ERR_INVALID;
        }
        return GP_OK;
    case OP_RECORD:
        return s->ptr ? gp_record_stream(p, s->ptr, streams[o->stream]) : GP_OK;
    case OP_COMPLETE:
        gp_host_stream_complete(r->be, streams[o->stream]);
        return GP_OK;
    case OP_TRIM: {
        gp_stats a, b;
        gp_pool_stats(p, &a, 0);
        uint64_t got = gp_pool_trim(p, o->size);
        gp_pool_stats(p, &b, 0);
        if (b.reserved != a.reserved - got)
            report("%s: trim says %llu bytes released, reserved went from %llu to %llu", r->w->cfg.name,
                   (unsigned long long)got, (unsigned long long)a.reserved, (unsigned long long)b.reserved);
        return GP_OK;
    }
    case OP_LIMIT: {
        gp_stats a;
        gp_pool_stats(p, &a, 0);
        gp_pool_set_limit(p, o->size ? a.reserved + o->size : 0);
        return GP_OK;
    }
    case OP_TAG_LIMIT: {
        gp_tag_stats ts;
        gp_pool_tag_stats(p, tags[o->tag], &ts);
        return gp_pool_set_tag_limit(p, tags[o->tag], o->size ? ts.allocated + o->size : 0);
    }
    case OP_RETAG: {
        void *v[2];
        int n = 0;
        if (s->ptr) v[n++] = s->ptr + s->size / 2; /* any address inside works */
        if (r->s[o->slot2].ptr) v[n++] = r->s[o->slot2].ptr;
        st = gp_pool_retag(p, v, (size_t)n, tags[o->tag], GP_PRIO_DEFAULT, NULL);
        if (st == GP_OK) {
            int idx[2] = {o->slot, o->slot2};
            for (int k = 0; k < 2; k++) {
                slot *x = &r->s[idx[k]];
                if (x->ptr) x->tag = o->tag;
            }
        }
        return st;
    }
    case OP_HEADROOM: {
        gp_stats a;
        gp_pool_stats(p, &a, 1);
        if (gp_pool_headroom(p) < a.largest_free)
            report("%s: headroom below the largest free block", r->w->cfg.name);
        return GP_OK;
    }
    case OP_HISTORY: {
        gp_event ev[8];
        st = gp_pool_history(p, o->size, 0);
        gp_pool_history_read(p, ev, 8);
        return st;
    }
    case OP_PREPARE:
        return gp_pool_capture_prepare(p, streams[o->stream]);
    case OP_BEGIN:
        st = gp_pool_capture_begin(p, GRAPH_KEY, streams[o->stream]);
        if (st == GP_OK) {
            gp_host_set_capturing(r->be, streams[S_CAPTURE], 1);
            gp_host_set_capturing(r->be, streams[S_FORKED], 1);
        }
        return st;
    case OP_END:
        gp_host_set_capturing(r->be, streams[S_CAPTURE], 0);
        gp_host_set_capturing(r->be, streams[S_FORKED], 0);
        return gp_pool_capture_end(p, streams[o->stream]);
    case OP_RELEASE:
        return gp_pool_capture_release(p, GRAPH_KEY);
    case OP_OFFLOAD:
        return offload(r, o->tag);
    case OP_RESTORE:
        return restore(r, o->tag);
    }
    return GP_OK;
}

/* gp_pool_check, the backend's mapped bytes, the workload's figures;
 * returns non-zero (after reporting) when something disagrees. */
static int consistent(run_state *r, const char *what, const char *when)
{
    char msg[512];
    size_t v = gp_pool_check(r->p, msg, sizeof msg);
    gp_stats s;
    gp_host_counters c;
    gp_pool_stats(r->p, &s, 0);
    gp_host_counters_get(r->be, &c);
    int bad = 0;
    if (v) bad = 1, report("%s: %s: gp_pool_check: %zu violations, the first: %s", what, when, v, msg);
    if (r->o && (v = gp_offload_check(r->o, msg, sizeof msg)) != 0)
        bad = 1, report("%s: %s: gp_offload_check: %zu violations, the first: %s", what, when, v, msg);
    if (c.mapped != s.reserved)
        bad = 1, report("%s: %s: the backend maps %llu bytes, reserved is %llu", what, when,
                        (unsigned long long)c.mapped, (unsigned long long)s.reserved);
    /* (offloaded blocks are live, but their bytes are not requested ones) */
    uint64_t req = 0, tag_req[NTAGS] = {0};
    for (int i = 0; i < SLOTS; i++)
        if (r->s[i].ptr && state_of(r, i) != GP_BLOCK_OFFLOADED) tag_req[r->s[i].tag] += r->s[i].size;
    for (int t = 0; t < NTAGS; t++) {
        gp_tag_stats ts;
        gp_pool_tag_stats(r->p, tags[t], &ts);
        req += tag_req[t];
        if (ts.requested != tag_req[t])
            bad = 1, report("%s: %s: tag %d holds %llu requested bytes, the workload %llu", what, when, t,
                            (unsigned long long)ts.requested, (unsigned long long)tag_req[t]);
    }
    gp_tag_stats own;
    gp_pool_tag_stats(r->p, offloader_tag, &own);
    s.requested -= own.requested;
    s.active_blocks -= own.active_blocks;
    if (s.requested != req || s.active_blocks != (uint64_t)r->n_live)
        bad = 1, report("%s: %s: the pool has %llu blocks of %llu requested bytes, the workload %d of %llu",
                        what, when, (unsigned long long)s.active_blocks, (unsigned long long)s.requested,
                        r->n_live, (unsigned long long)req);
    return bad;
}

static void describe(const run_state *r, char *buf, size_t n)
{
    const fault *f = r->f;
    if (!f->on) snprintf(buf, n, "%s, no fault", r->w->cfg.name);
    else
        snprintf(buf, n, "%s, %s call %llu%s fails with %s", r->w->cfg.name, gp_host_fn_name(f->fn),
                 (unsigned long long)f->nth, f->mode == GP_HOST_FAIL_FROM ? " and every later one" : "",
                 gp_status_str(f->status));
}

static void free_all(run_state *r, const char *what)
{
    for (int i = 0; i < SLOTS; i++)
        if (r->s[i].ptr && !free_slot(r, i)) report("%s: recovery: a free failed: %s", what, gp_last_error());
}

/* Once faults stop, everything must work again and come back clean. */
static void recover(run_state *r, const char *what)
{
    gp_host_fail_none(r->be);
    gp_host_set_capturing(r->be, streams[S_CAPTURE], 0);
    gp_host_set_capturing(r->be, streams[S_FORKED], 0);
    /* A capture whose end failed half-way, a graph whose release did: the
     * caller tries again (errors here say nothing is left to do). */
    gp_pool_capture_end(r->p, streams[S_CAPTURE]);
    gp_pool_capture_release(r->p, GRAPH_KEY);
    gp_pool_set_limit(r->p, 0);
    for (int t = 0; t < NTAGS; t++) gp_pool_set_tag_limit(r->p, tags[t], 0);
    /* Time passes: the streams finish their work. */
    for (int i = 0; i < NSTREAMS; i++) gp_host_stream_complete(r->be, streams[i]);
    if (r->o) {
        /* Everything offloaded comes back, bytes and all (once there is
         * room: the resident blocks go first if need be). */
        for (int t = 0; t < NTAGS; t++) {
            restored res;
            gp_status st = restore_accepting(r->o, t, &res);
            uint64_t lost = res.r.lost;
            if (st == GP_ERR_OOM || st == GP_ERR_LIMIT) {
                for (int i = 0; i < SLOTS; i++)
                    if (r->s[i].ptr && state_of(r, i) == GP_BLOCK_USED && !free_slot(r, i))
                        report("%s: recovery: a free failed: %s", what, gp_last_error());
                st = restore_accepting(r->o, t, &res);
                lost += res.r.lost;
            }
            if (st != GP_OK) report("%s: recovery: restore of tag %d: %s", what, t, gp_last_error());
            /* An offload by the pressure callback that failed and could not
             * be undone (the device refused every copy) lost bytes and had
             * no caller to tell: the restore says so, not which blocks. */
            for (int i = 0; lost && i < SLOTS; i++)
                if (r->s[i].ptr && r->s[i].tag == t) r->s[i].lost = 1;
        }
        for (int i = 0; i < SLOTS; i++)
            if (r->s[i].ptr && r->s[i].lost && state_of(r, i) == GP_BLOCK_USED) { /* (reported lost) */
                stamp_put(r->s[i].ptr, r->s[i].size, r->s[i].stamp);
                r->s[i].lost = 0;
            }
        for (int i = 0; i < SLOTS; i++)
            if (r->s[i].ptr && (state_of(r, i) != GP_BLOCK_USED || !slot_ok(r, i)))
                report("%s: recovery: the block at %p is %s after restoring everything", what, (void *)r->s[i].ptr,
                       state_of(r, i) != GP_BLOCK_USED ? "not resident" : "overwritten");
        gp_offloader_destroy(r->o);
        r->o = NULL;
    }
    free_all(r, what);
    gp_pool_empty_cache(r->p);
    /* An allocation looks at the pending blocks (and the next empty_cache
     * gives back what they held). */
    gp_free(r->p, gp_alloc(r->p, 1, NULL, tags[0], GP_PRIO_NORMAL, NULL));
    gp_pool_empty_cache(r->p);
    gp_stats s;
    gp_host_counters c;
    gp_pool_stats(r->p, &s, 1);
    gp_host_counters_get(r->be, &c);
    if (s.allocated || s.pending || c.events_live)
        report("%s: recovery: after freeing everything and emptying the cache, %llu bytes allocated, %llu "
               "pending, %llu events live", what, (unsigned long long)s.allocated, (unsigned long long)s.pending,
               (unsigned long long)c.events_live);
    uint64_t want = r->w->cfg.mode == GP_MODE_EXPANDABLE ? 0 : RESERVE; /* the reserve stays */
    if (s.reserved != want)
        report("%s: recovery: %llu bytes stay reserved, not %llu", what, (unsigned long long)s.reserved,
               (unsigned long long)want);
    int in_graph = 0;
    gp_pool_walk(r->p, count_graph_blocks, &in_graph);
    if (in_graph) report("%s: recovery: %d blocks still belong to a released graph pool", what, in_graph);
    consistent(r, what, "recovery, the cache emptied");
    /* The workload's allocations work again (as far as the device holds). */
    int made = 0;
    for (int k = 0; k < r->w->n && made < 12; k++) {
        const op *o = &r->w->ops[k];
        if (o->kind != OP_ALLOC || o->size > 2 * MiB || r->s[o->slot].ptr) continue;
        gp_status st;
        char *q = gp_alloc(r->p, o->size, streams[o->stream % 4], tags[o->tag], o->prio, &st);
        if (!q) {
            report("%s: recovery: alloc of %llu failed: %s", what, (unsigned long long)o->size, gp_last_error());
            break;
        }
        r->s[o->slot] = (slot){q, o->size, rnd(), o->tag, o->prio};
        stamp_put(r->s[o->slot].ptr, r->s[o->slot].size, r->s[o->slot].stamp);
        r->n_live++;
        made++;
    }
    consistent(r, what, "recovery, allocated again");
    free_all(r, what);
    gp_pool_trim(r->p, UINT64_MAX);
    consistent(r, what, "recovery, the end");
}

typedef struct outcome {
    gp_status st[MAX_OPS];
    uint64_t calls[GP_HOST_FN_COUNT];
} outcome;

/* Whether op o may end with status st when it hit fault f (hit) or none. */
static int acceptable(const op *o, gp_status st, const char *msg, const fault *f, int hit)
{
    /* Any state may leave an allocation without memory or over a limit. */
    int anyway = ((o->kind == OP_ALLOC || o->kind == OP_RESTORE) && (st == GP_ERR_OOM || st == GP_ERR_LIMIT)) ||
                 (o->kind == OP_RETAG && st == GP_ERR_LIMIT);
    if (st == GP_OK || !hit) return st == GP_OK || anyway;
    /* The failure is named, or the pool absorbed it and then found no memory
     * (what it absorbs: a failed stream wait, event, sync, query or unmap
     * leaves memory unusable for now; a failed map it must report as such,
     * unless the map said "out of memory" itself). */
    return strstr(msg, "injected") ||
           (anyway && ((f->fn != GP_HOST_MAP && f->fn != GP_HOST_RESERVE) || f->status == st));
}

static void check_misuse(const char *what, const char *when, uint64_t *seen)
{
    char m[256];
    uint64_t now = gp_host_misuse(m, sizeof m);
    if (now == *seen) return;
    *seen = now;
    report("%s: %s: backend misuse: %s", what, when, m);
}

/* One run of workload w with fault f (f->on 0: none).  `ref` is the run
 * without a fault (NULL while making it); `out` receives this run's. */
static void run(const workload *w, const fault *f, const outcome *ref, outcome *out)
{
    static run_state r;
    memset(&r, 0, sizeof r);
    r.w = w;
    r.f = f;
    char what[160], when[64];
    describe(&r, what, sizeof what);
    uint64_t misuse = misuse_now();
    r.be = host(CAPACITY);
    if (f->on) gp_host_fail(r.be, f->fn, f->nth, f->status, f->mode);
    rng_state = w->cfg.seed ^ 0x5eed;
    gp_status st;
    gp_error_clear();
    r.p = new_pool(&w->cfg, r.be, &st);
    if (!r.p) {
        /* Creation failed (the backend is gone with it): only a fault may
         * do that, and it must say so. */
        if (!f->on || !strstr(gp_last_error(), "injected"))
            report("%s: pool creation failed with %s: '%s'", what, gp_status_str(st), gp_last_error());
        check_misuse(what, "a failed creation", &misuse);
        return;
    }
    if (w->cfg.offload) {
        /* (it installs its own pressure callback, which offloads the idle
         * registered tag) */
        gp_error_clear();
        st = gp_offloader_create(r.p, 0, 1, NULL, &r.o);
        if (st != GP_OK) {
            if (!f->on || !strstr(gp_last_error(), "injected"))
                report("%s: the offloader's creation failed with %s: '%s'", what, gp_status_str(st),
                       gp_last_error());
            gp_pool_destroy(r.p);
            check_misuse(what, "a failed offloader creation", &misuse);
            return;
        }
        if (gp_offload_register(r.o, tags[OFFLOADED], GP_PRIO_LOW, 2) != GP_OK)
            report("%s: register: %s", what, gp_last_error());
    } else {
        gp_pool_set_pressure(r.p, pressure, &r);
    }
    int fired = 0;
    for (int k = 0; k < w->n; k++) {
        const op *o = &w->ops[k];
        gp_host_counters c0, c1;
        gp_host_counters_get(r.be, &c0);
        gp_error_clear();
        st = do_op(&r, o);
        const char *msg = gp_last_error();
        if (getenv("GP_FAULT_TRACE") && f->on)
            fprintf(stderr, "  op %d %s: %s %s\n", k, op_names[o->kind], gp_status_str(st), st ? msg : "");
        gp_host_counters_get(r.be, &c1);
        int hit = f->on && c1.injected[f->fn] > c0.injected[f->fn];
        if (out) out->st[k] = st;
        snprintf(when, sizeof when, "op %d (%s)", k, op_names[o->kind]);
        if (!fired && !hit && ref && st != ref->st[k])
            report("%s: %s returned %s before the fault fired, %s without a fault ('%s')", what, when,
                   gp_status_str(st), gp_status_str(ref->st[k]), msg);
        if (st != GP_OK && !*msg)
            report("%s: %s failed with %s and no message", what, when, gp_status_str(st));
        else if (!acceptable(o, st, msg, f, hit))
            report("%s: %s %s and failed with %s: '%s'", what, when, hit ? "hit the fault" : "hit no fault",
                   gp_status_str(st), msg);
        fired |= hit;
        consistent(&r, what, when);
        check_misuse(what, when, &misuse);
    }
    if (out) {
        gp_host_counters c;
        gp_host_counters_get(r.be, &c);
        memcpy(out->calls, c.calls, sizeof c.calls);
    }
    recover(&r, what);
    if (r.o) gp_offloader_destroy(r.o);
    gp_pool_destroy(r.p);
    check_misuse(what, "the pool's destruction", &misuse);
}

/* How each function is made to fail: a hard error, and for those whose
 * out-of-memory answer the pool handles differently, that too. */
static int fault_statuses(gp_host_fn fn, gp_status out[2])
{
    out[0] = GP_ERR_BACKEND;
    if (fn == GP_HOST_MAP || fn == GP_HOST_RESERVE) return out[1] = GP_ERR_OOM, 2;
    return 1;
}

static void walk(const config *c)
{
    static workload w;
    static outcome ref;
    make_workload(&w, c);
    fault none = {0};
    memset(&ref, 0, sizeof ref);
    run(&w, &none, NULL, &ref);
    uint64_t points = 0;
    printf("%s (%d ops): calls per function:", c->name, w.n);
    for (int fn = 0; fn < GP_HOST_FN_COUNT; fn++)
        printf(" %s %llu", gp_host_fn_name((gp_host_fn)fn), (unsigned long long)ref.calls[fn]);
    printf("\n");
    for (int fn = 0; fn < GP_HOST_FN_COUNT; fn++) {
        gp_status sts[2];
        int ns = fault_statuses((gp_host_fn)fn, sts);
        for (uint64_t nth = 1; nth <= ref.calls[fn]; nth++)
            for (int mode = GP_HOST_FAIL_ONCE; mode <= GP_HOST_FAIL_FROM; mode++)
                for (int k = 0; k < ns; k++) {
                    fault f = {1, (gp_host_fn)fn, nth, mode, sts[k]};
                    /* GP_FAULT_ONLY="copy,8": only that function's nth call (to debug one) */
                    const char *only = getenv("GP_FAULT_ONLY");
                    char want[64];
                    snprintf(want, sizeof want, "%s,%llu", gp_host_fn_name((gp_host_fn)fn), (unsigned long long)nth);
                    if (only && strcmp(only, want) != 0) continue;
                    run(&w, &f, &ref, NULL);
                    points++;
                }
    }
    printf("%s: %llu fault points walked\n", c->name, (unsigned long long)points);
    fflush(stdout);
}

/* A reservation that fails leaves the arena without one: the pool used to
 * keep what the failed call wrote as its base, and its destruction gave
 * that junk range back to the device. */
static void test_failed_reserve_leaves_no_address(void)
{
    for (uint64_t nth = 1; nth <= 2; nth++) {
        gp_backend *be = host(64 * MiB);
        gp_config cfg;
        gp_config_default(&cfg);
        gp_host_fail(be, GP_HOST_RESERVE, nth, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
        uint64_t m0 = misuse_now();
        gp_pool *p;
        CHECK(gp_pool_create(be, &cfg, &p) == GP_ERR_BACKEND && strstr(gp_last_error(), "injected"));
        char msg[256];
        if (gp_host_misuse(msg, sizeof msg) != m0) fprintf(stderr, "misuse: %s\n", msg);
        CHECK(misuse_now() == m0);
    }
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 20240611;
    const char *names[NTAGS] = {"weights", "activations", "kv_cache", "untagged"};
    for (int i = 0; i < NTAGS; i++) gp_tag_intern(names[i], &tags[i]);
    gp_tag_intern("gpupool", &offloader_tag);
    test_nth_call_once_and_from();
    test_misuse_is_counted();
    test_reserve_map_failure_is_named();
    test_graph_release_after_failed_sync();
    test_oom_report_without_mem_info();
    test_failed_reserve_leaves_no_address();
    const config configs[] = {
        {"expandable, placement", GP_MODE_EXPANDABLE, 1, 0, seed},
        {"expandable, no placement", GP_MODE_EXPANDABLE, 0, 0, seed + 1},
        {"reserve", GP_MODE_RESERVE, 0, 0, seed + 2},
        {"expandable, offload", GP_MODE_EXPANDABLE, 1, 1, seed + 3},
    };
    printf("fault walk, seed %llu\n", (unsigned long long)seed);
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) walk(&configs[i]);
    return check_done();
}
