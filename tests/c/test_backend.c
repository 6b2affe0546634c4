/*
 * test_backend.c -- one suite over the contract of backend.h, run on every
 * backend and adaptor (as RMM runs one suite over every memory resource):
 * the description, reserve/map/unmap/unreserve (alignment, granularity,
 * reuse, GP_ERR_OOM past the device, a failed map that takes nothing),
 * mem_info, streams, events (record, query, wait, release, synchronize),
 * capture queries, copies in every direction (the kernel's too), pinned
 * host memory, the checksum, the gather and in_context.  Only what
 * backend.h promises is checked, so that the same checks hold on a GPU.
 *
 * Variants (the arguments; none: host deferred log tenant):
 *   host    the host backend (backend_host.c)
 *   deferred  the host backend with deferred streams (host_queue.h): its
 *           work runs as late as a GPU's may (test_deferred checks how)
 *   log     the logging adaptor over it (backend_log.c)
 *   tenant  the tenant adaptor over it (backend_arbiter.c), in a group of
 *           its own with a device limit below the host's capacity
 *   cuda    the CUDA backend on device 0 (built with -DGP_TEST_CUDA and
 *           backend_cuda.c: tests/test_gpu_backend.py)
 * Over the host backend, the suite also checks that every operation
 * reached it through the adaptor (a forwarder that is missing was a NULL
 * call once) and that nothing was misused or left behind.
 *
 * Run under ASan and UBSan by tests/test_c.py.
 */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arbiter.h"
#include "backend_host.h"
#include "check.h"
#include "checksum.h"
#include "host_pages.h"

#define MiB (1024ull * 1024ull)
#define HOST_CAPACITY (64 * MiB)
#define TENANT_LIMIT (48 * MiB)

typedef struct variant {
    const char *name;
    gp_backend *be;
    gp_backend *host; /* the host backend underneath, or NULL */
} variant;

static int ok(gp_status st, const char *what)
{
    if (st != GP_OK) fprintf(stderr, "  %s: %s (%s)\n", what, gp_last_error(), gp_status_str(st));
    return st == GP_OK;
}

#define MUST(call)                          \
    do {                                    \
        if (!ok((call), #call)) return;     \
    } while (0)

static uint64_t round_up(uint64_t x, uint64_t g) { return (x + g - 1) / g * g; }

/* Wait on the host for what `s` has queued so far. */
static int drain(gp_backend *be, gp_stream s)
{
    uint64_t ev = 0;
    if (!ok(be->event_record(be, s, &ev), "event_record") || !ok(be->event_wait(be, ev), "event_wait")) return 0;
    be->event_release(be, ev);
    return 1;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 9));
}

/* A device range of `size` bytes (rounded up to the granularity), reserved
 * and mapped, and given back. */
typedef struct dev_range {
    uintptr_t base;
    uint64_t size, handle;
} dev_range;

static int dev_get(gp_backend *be, uint64_t size, dev_range *r)
{
    r->size = round_up(size, be->granularity);
    if (!ok(be->reserve(be, r->size, be->granularity, &r->base), "reserve")) return 0;
    if (ok(be->map(be, r->base, r->size, &r->handle), "map")) return 1;
    be->unreserve(be, r->base, r->size);
    return 0;
}

static void dev_put(gp_backend *be, dev_range *r)
{
    CHECK(ok(be->unmap(be, r->base, r->size, r->handle), "unmap"));
    be->unreserve(be, r->base, r->size);
}

/* ------------------------------------------------------------ the suite */

static void test_description(const variant *v)
{
    gp_backend *be = v->be;
    CHECK(be->name && *be->name);
    CHECK(be->device >= 0);
    CHECK(be->total > 0);
    CHECK(be->granularity > 0 && (be->granularity & (be->granularity - 1)) == 0);
    uint64_t free_b = 0, total_b = 0;
    CHECK(ok(be->mem_info(be, &free_b, &total_b), "mem_info"));
    CHECK(total_b > 0 && free_b <= total_b);
}

static void test_address_space(const variant *v)
{
    gp_backend *be = v->be;
    const uint64_t g = be->granularity;
    uintptr_t base = 0;
    uint64_t h1 = 0, h2 = 0, h3 = 0, free0 = 0, free1 = 0, total = 0;

    /* Reserve: aligned as asked, nothing backed. */
    MUST(be->reserve(be, 8 * g, 4 * g, &base));
    CHECK(base != 0 && base % (4 * g) == 0);
    MUST(be->mem_info(be, &free0, &total));

    /* Map: two ranges inside the reservation; free memory falls by them. */
    CHECK(ok(be->map(be, base, g, &h1), "map 1"));
    CHECK(ok(be->map(be, base + 4 * g, 2 * g, &h2), "map 2"));
    CHECK(ok(be->mem_info(be, &free1, &total), "mem_info"));
    if (v->host) CHECK(free0 - free1 == 3 * g);
    else CHECK(free1 < free0);

    /* Addresses and sizes off the granularity are refused. */
    if (g > 1) {
        gp_error_clear();
        CHECK(be->map(be, base + 2 * g, g / 2, &h3) == GP_ERR_INVALID && *gp_last_error());
        CHECK(be->map(be, base + 2 * g + g / 2, g, &h3) == GP_ERR_INVALID);
    }

    /* Unmap gives the memory back; the address maps again. */
    CHECK(ok(be->unmap(be, base, g, h1), "unmap 1"));
    CHECK(ok(be->map(be, base, g, &h3), "map again"));
    CHECK(ok(be->unmap(be, base, g, h3), "unmap again"));
    CHECK(ok(be->unmap(be, base + 4 * g, 2 * g, h2), "unmap 2"));
    CHECK(ok(be->mem_info(be, &free1, &total), "mem_info"));
    if (v->host) CHECK(free1 == free0);
    be->unreserve(be, base, 8 * g);

    /* Past the device: GP_ERR_OOM, and the failed map takes nothing. */
    uint64_t big = round_up(be->total, g) + g;
    MUST(be->reserve(be, big, g, &base));
    MUST(be->mem_info(be, &free0, &total));
    gp_error_clear();
    CHECK(be->map(be, base, big, &h1) == GP_ERR_OOM && *gp_last_error());
    CHECK(ok(be->mem_info(be, &free1, &total), "mem_info"));
    if (v->host) CHECK(free1 == free0);
    CHECK(ok(be->map(be, base, g, &h1), "map after an OOM"));
    CHECK(ok(be->unmap(be, base, g, h1), "unmap after an OOM"));
    be->unreserve(be, base, big);

    /* Over the host backend: a map the device fails (injected) leaves the
     * adaptors' accounts as they were. */
    if (v->host) {
        MUST(be->reserve(be, g, g, &base));
        MUST(be->mem_info(be, &free0, &total));
        gp_host_fail(v->host, GP_HOST_MAP, 1, GP_ERR_OOM, GP_HOST_FAIL_ONCE);
        CHECK(be->map(be, base, g, &h1) == GP_ERR_OOM);
        CHECK(ok(be->mem_info(be, &free1, &total), "mem_info") && free1 == free0);
        CHECK(ok(be->map(be, base, g, &h1), "map after an injected failure"));
        CHECK(ok(be->unmap(be, base, g, h1), "unmap"));
        be->unreserve(be, base, g);
    }
}

static void test_streams_and_events(const variant *v)
{
    gp_backend *be = v->be;
    gp_stream s1 = NULL, s2 = NULL;
    uint64_t e1 = 0, e2 = 0, e3 = 0;
    int done = -1, capturing = -1;

    MUST(be->stream_create(be, &s1));
    MUST(be->stream_create(be, &s2));
    CHECK(s1 != s2 && s1 != NULL && s2 != NULL);
    CHECK(ok(be->stream_wait(be, s1, s2), "stream_wait"));
    CHECK(ok(be->stream_wait(be, s2, s1), "stream_wait back"));
    CHECK(ok(be->stream_wait(be, s1, s1), "stream_wait on itself"));
    CHECK(ok(be->stream_wait(be, s1, NULL), "stream_wait on the default stream"));

    /* Nothing captures a graph here. */
    CHECK(ok(be->is_capturing(be, s1, &capturing), "is_capturing") && capturing == 0);
    capturing = -1;
    CHECK(ok(be->is_capturing(be, NULL, &capturing), "is_capturing NULL") && capturing == 0);

    /* An event: never 0; a query answers 0 or 1; after a wait it is done. */
    MUST(be->event_record(be, s1, &e1));
    CHECK(e1 != 0);
    CHECK(ok(be->event_query(be, e1, &done), "event_query") && (done == 0 || done == 1));
    CHECK(ok(be->event_wait(be, e1), "event_wait"));
    done = -1;
    CHECK(ok(be->event_query(be, e1, &done), "event_query after wait") && done == 1);

    /* After synchronize every event recorded before is done. */
    MUST(be->event_record(be, s2, &e2));
    MUST(be->event_record(be, NULL, &e3));
    CHECK(e2 != 0 && e3 != 0 && e2 != e1 && e3 != e2);
    CHECK(ok(be->synchronize(be), "synchronize"));
    done = -1;
    CHECK(ok(be->event_query(be, e2, &done), "event_query after synchronize") && done == 1);
    done = -1;
    CHECK(ok(be->event_query(be, e3, &done), "event_query after synchronize") && done == 1);
    be->event_release(be, e1);
    be->event_release(be, e2);
    be->event_release(be, e3);

    /* Released events are reused or not: a new one is still never 0. */
    for (int i = 0; i < 40; i++) {
        uint64_t e = 0;
        if (!ok(be->event_record(be, i % 2 ? s1 : s2, &e), "event_record")) break;
        CHECK(e != 0);
        be->event_release(be, e);
    }
    CHECK(drain(be, s1) && drain(be, s2));
    be->stream_destroy(be, s1);
    be->stream_destroy(be, s2);
}

static void test_host_memory(const variant *v)
{
    gp_backend *be = v->be;
    static const uint64_t sizes[] = {1, 4096, 3 * MiB + 5};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = NULL;
        if (!ok(be->host_alloc(be, sizes[i], &p), "host_alloc")) continue;
        CHECK(p != NULL);
        memset(p, 0xa5, sizes[i]); /* the host's to write */
        CHECK(((unsigned char *)p)[sizes[i] - 1] == 0xa5);
        be->host_free(be, p, sizes[i]);
    }
    /* Memory of our own, populated (from two threads' worth of parts, as
     * pinned.c's threads do) and registered, keeps its bytes, and the
     * device copies into and out of it. */
    enum { R = 4 * MiB };
    char *m = mmap(NULL, R, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    if (m == MAP_FAILED) return;
    if (ok(be->host_populate(be, m, R / 2), "host_populate") && ok(be->host_populate(be, m + R / 2, R / 2), "host_populate")) {
        CHECK(m[0] == 0 && m[R - 1] == 0); /* (populating writes nothing the caller sees) */
        memset(m, 0x3c, R);
        if (ok(be->host_register(be, m, R), "host_register")) {
            CHECK(m[R / 3] == 0x3c);
            be->host_unregister(be, m, R);
        }
    }
    munmap(m, R);
}

static void test_copies(const variant *v)
{
    gp_backend *be = v->be;
    enum { N = 256 * 1024 };
    static const uint64_t small[] = {8, 1000, 4096, 12345};
    gp_stream s = NULL;
    dev_range a, b;
    unsigned char *h = NULL, *want = malloc(N);
    MUST(be->stream_create(be, &s));
    if (!want || !ok(be->host_alloc(be, 2 * N, (void **)&h), "host_alloc")) goto out_stream;
    if (!dev_get(be, N, &a)) goto out_host;
    if (!dev_get(be, N, &b)) goto out_a;
    void *da = (void *)a.base, *db = (void *)b.base;

    /* H2D, D2D, D2H: the bytes come back. */
    fill(h, N, 1);
    memcpy(want, h, N);
    CHECK(ok(be->copy(be, da, h, N, GP_COPY_H2D, s), "copy H2D"));
    CHECK(ok(be->copy(be, db, da, N, GP_COPY_D2D, s), "copy D2D"));
    CHECK(ok(be->copy(be, h + N, db, N, GP_COPY_D2H, s), "copy D2H"));
    CHECK(drain(be, s));
    CHECK(memcmp(h + N, want, N) == 0);

    /* In stream order: a later copy on the same stream sees the earlier. */
    fill(h, N, 2);
    memcpy(want, h, N);
    memset(h + N, 0, N);
    CHECK(ok(be->copy(be, da, h, N, GP_COPY_H2D, s), "copy H2D"));
    CHECK(ok(be->copy(be, (char *)db + 8, da, N - 8, GP_COPY_D2D, s), "copy D2D at an offset"));
    CHECK(ok(be->copy(be, h + N, (char *)db + 8, N - 8, GP_COPY_D2H, s), "copy D2H"));
    CHECK(drain(be, s));
    CHECK(memcmp(h + N, want, N - 8) == 0);

    /* By the device's threads (host_alloc memory on the host side), small
     * and odd sizes, and 0 bytes. */
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        uint64_t n = small[i];
        fill(h, n, 3 + (unsigned)i);
        memset(h + N, 0, n);
        CHECK(ok(be->copy(be, da, h, n, GP_COPY_H2D | GP_COPY_BY_KERNEL, s), "copy H2D by kernel"));
        CHECK(ok(be->copy(be, h + N, da, n, GP_COPY_D2H | GP_COPY_BY_KERNEL, s), "copy D2H by kernel"));
        CHECK(drain(be, s));
        CHECK(memcmp(h + N, h, n) == 0);
    }
    CHECK(ok(be->copy(be, da, h, 0, GP_COPY_H2D, s), "copy of 0 bytes"));
    CHECK(ok(be->copy(be, h, da, 0, GP_COPY_D2H | GP_COPY_BY_KERNEL, s), "copy of 0 bytes by kernel"));

    /* A direction that is none is refused. */
    gp_error_clear();
    CHECK(be->copy(be, db, da, 8, 3, s) == GP_ERR_INVALID && *gp_last_error());
    CHECK(drain(be, s));

    dev_put(be, &b);
out_a:
    dev_put(be, &a);
out_host:
    if (h) be->host_free(be, h, 2 * N);
out_stream:
    free(want);
    be->stream_destroy(be, s);
}

static void test_checksum(const variant *v)
{
    gp_backend *be = v->be;
    enum { N = 1 << 20 };
    static const uint64_t sizes[] = {8, 4096 + 8, 65536 + 24, N - 8};
    gp_stream s = NULL;
    dev_range d;
    unsigned char *h = NULL;
    MUST(be->stream_create(be, &s));
    if (!ok(be->host_alloc(be, N + 64, (void **)&h), "host_alloc")) goto out_stream;
    if (!dev_get(be, N + 64, &d)) goto out_host;
    void *data = (void *)d.base, *out = (char *)data + N; /* out: 8 device bytes */
    fill(h, N, 9);
    CHECK(ok(be->copy(be, data, h, N, GP_COPY_H2D, s), "copy H2D"));
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t seed = 0x1234567890abcdefull * (i + 1), got = 0;
        CHECK(ok(be->checksum(be, data, sizes[i], seed, out, s), "checksum"));
        CHECK(ok(be->copy(be, h + N, out, 8, GP_COPY_D2H, s), "copy D2H"));
        CHECK(drain(be, s));
        memcpy(&got, h + N, 8);
        CHECK(got == gp_checksum(h, sizes[i], seed));
    }
    /* A size that is not a multiple of 8 is refused. */
    gp_error_clear();
    CHECK(be->checksum(be, data, 12, 0, out, s) == GP_ERR_INVALID && *gp_last_error());
    CHECK(drain(be, s));
    dev_put(be, &d);
out_host:
    be->host_free(be, h, N + 64);
out_stream:
    be->stream_destroy(be, s);
}

static void test_gather(const variant *v)
{
    gp_backend *be = v->be;
    /* Around the kernel's 16-byte steps, one of 0 and one above max_len
     * (counts as 0), sources at odd offsets. */
    static const size_t lens[] = {1, 5, 7, 8, 15, 16, 17, 0, 33, 1000, 200000, 65539, 3};
    enum { NB = sizeof lens / sizeof lens[0], SRC = 1 << 20, ALIGN = 64, MAX = 100000 };
    gp_stream s = NULL;
    dev_range src, dst, arr;
    unsigned char *h = NULL, *want = calloc(1, SRC);
    uint64_t offs[NB], at = 0, srcat = 0;
    MUST(be->stream_create(be, &s));
    if (!want || !ok(be->host_alloc(be, 2 * SRC, (void **)&h), "host_alloc")) goto out_stream;
    if (!dev_get(be, SRC, &src)) goto out_host;
    if (!dev_get(be, SRC, &dst)) goto out_src;
    if (!dev_get(be, NB * (sizeof(void *) + sizeof(size_t)), &arr)) goto out_dst;

    /* Sources: ranges of one device buffer; srcs and lens: device arrays,
     * written by a copy in stream order. */
    fill(h, SRC, 5);
    CHECK(ok(be->copy(be, (void *)src.base, h, SRC, GP_COPY_H2D, s), "copy sources"));
    const void **srcs = (const void **)(void *)(h + SRC);
    size_t *hl = (size_t *)(void *)(h + SRC + NB * sizeof(void *));
    for (int b = 0; b < NB; b++) {
        srcat += 3;
        srcs[b] = (const void *)(src.base + srcat);
        hl[b] = lens[b];
        offs[b] = at;
        uint64_t len = lens[b] > MAX ? 0 : lens[b];
        memcpy(want + at, h + srcat, len);
        at += (len + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
        srcat += lens[b] > MAX ? 0 : lens[b];
    }
    CHECK(at <= SRC && srcat <= SRC);
    CHECK(ok(be->copy(be, (void *)arr.base, h + SRC, NB * (sizeof(void *) + sizeof(size_t)), GP_COPY_H2D, s),
             "copy arrays"));
    CHECK(ok(be->gather(be, (void *)dst.base, (const void *const *)arr.base,
                        (const size_t *)(arr.base + NB * sizeof(void *)), NB, ALIGN, MAX, s), "gather"));
    CHECK(ok(be->copy(be, h, (void *)dst.base, at, GP_COPY_D2H, s), "copy D2H"));
    CHECK(drain(be, s));
    /* Each range where it belongs (what lies between them is not said). */
    for (int b = 0; b < NB; b++) {
        uint64_t len = lens[b] > MAX ? 0 : lens[b];
        if (memcmp(h + offs[b], want + offs[b], len) != 0) {
            fprintf(stderr, "  gather: range %d (%zu bytes at %llu) differs\n", b, lens[b],
                    (unsigned long long)offs[b]);
            CHECK(0);
        }
    }
    /* No ranges: nothing to do. */
    CHECK(ok(be->gather(be, (void *)dst.base, (const void *const *)arr.base,
                        (const size_t *)(arr.base + NB * sizeof(void *)), 0, ALIGN, MAX, s), "gather of none"));
    CHECK(drain(be, s));
    dev_put(be, &arr);
out_dst:
    dev_put(be, &dst);
out_src:
    dev_put(be, &src);
out_host:
    be->host_free(be, h, 2 * SRC);
out_stream:
    free(want);
    be->stream_destroy(be, s);
}

typedef struct ctx_arg {
    int calls;
    gp_status give;
} ctx_arg;

static gp_status in_ctx(void *arg)
{
    ctx_arg *c = arg;
    c->calls++;
    return c->give;
}

static void test_in_context(const variant *v)
{
    gp_backend *be = v->be;
    ctx_arg c = {0, GP_OK};
    CHECK(ok(be->in_context(be, in_ctx, &c), "in_context") && c.calls == 1);
    c.give = GP_ERR_LIMIT;
    CHECK(be->in_context(be, in_ctx, &c) == GP_ERR_LIMIT && c.calls == 2);
}

/* grant_peer: never this device or one that is not there; another one
 * reaches every mapping, those made before the grant and those after.  On
 * the host backend, which has any device 0..63, access is observed; on
 * CUDA with a second device, that device's copy reads what the grant let it
 * (a copy engine of device 1 on device 0's memory); with one device, there
 * is no peer to grant. */
static void test_grant_peer(const variant *v)
{
    gp_backend *be = v->be;
    CHECK(be->grant_peer(be, be->device) == GP_ERR_INVALID && strstr(gp_last_error(), "another device"));
    CHECK(be->grant_peer(be, -1) == GP_ERR_INVALID);
    CHECK(be->grant_peer(be, 4096) == GP_ERR_INVALID);
    int peer = be->device == 1 ? 0 : 1;
    dev_range before, after;
    if (!dev_get(be, 3 * be->granularity, &before)) return;
    gp_status st = be->grant_peer(be, peer);
    if (v->host) {
        CHECK(ok(st, "grant_peer"));
        CHECK(gp_host_peer_access(v->host, before.base, before.size, peer));
        CHECK(!gp_host_peer_access(v->host, before.base, before.size, peer + 1));
    }
    if (dev_get(be, be->granularity, &after)) {
        if (v->host) CHECK(gp_host_peer_access(v->host, after.base, after.size, peer));
#ifdef GP_TEST_CUDA
        gp_backend *other = NULL;
        if (!v->host && st == GP_OK && ok(gp_backend_cuda_create(peer, &other), "the peer's backend")) {
            unsigned char src[4096], back[4096];
            fill(src, sizeof src, 7);
            gp_stream s = NULL, so = NULL;
            void *pin = NULL;
            dev_range mine;
            if (ok(be->stream_create(be, &s), "stream") && ok(other->stream_create(other, &so), "peer stream") &&
                ok(be->host_alloc(be, sizeof src, &pin), "host_alloc") && dev_get(other, 4096, &mine)) {
                memcpy(pin, src, sizeof src);
                CHECK(ok(be->copy(be, (void *)after.base, pin, sizeof src, GP_COPY_H2D, s), "H2D") && drain(be, s));
                /* Device `peer`'s stream copies from this device's memory. */
                CHECK(ok(other->copy(other, (void *)mine.base, (void *)after.base, sizeof src, GP_COPY_D2D, so),
                         "the peer's copy") && drain(other, so));
                memset(pin, 0, sizeof src);
                CHECK(ok(other->copy(other, pin, (void *)mine.base, sizeof src, GP_COPY_D2H, so), "D2H") &&
                      drain(other, so));
                memcpy(back, pin, sizeof back);
                CHECK(memcmp(back, src, sizeof src) == 0);
                dev_put(other, &mine);
            }
            if (pin) be->host_free(be, pin, sizeof src);
            if (so) other->stream_destroy(other, so);
            if (s) be->stream_destroy(be, s);
            other->destroy(other);
        } else if (!v->host) {
            CHECK(st == GP_ERR_INVALID); /* one device: no peer */
        }
#endif
        dev_put(be, &after);
    }
    /* Idempotent; a failure is reported and a call again retries. */
    if (v->host) {
        CHECK(ok(be->grant_peer(be, peer), "grant_peer again"));
        gp_host_fail(v->host, GP_HOST_GRANT_PEER, 1, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
        CHECK(be->grant_peer(be, peer + 2) == GP_ERR_BACKEND);
        CHECK(!gp_host_peer_access(v->host, before.base, before.size, peer + 2));
        CHECK(ok(be->grant_peer(be, peer + 2), "grant_peer after a failure"));
        CHECK(gp_host_peer_access(v->host, before.base, before.size, peer + 2));
    }
    dev_put(be, &before);
}

/* ------------------------------------------------------------- variants */

static char g_group[64];

static int make(const char *name, variant *v)
{
    *v = (variant){.name = name};
    int host_based = strcmp(name, "host") == 0 || strcmp(name, "deferred") == 0 || strcmp(name, "log") == 0 ||
                     strcmp(name, "tenant") == 0;
    if (host_based && !ok(gp_backend_host_create(HOST_CAPACITY, &v->host), "host backend")) return 0;
    if (strcmp(name, "host") == 0) {
        v->be = v->host;
    } else if (strcmp(name, "deferred") == 0) {
        gp_host_set_deferred(v->host, 1);
        v->be = v->host;
    } else if (strcmp(name, "log") == 0) {
        if (!ok(gp_backend_logged(v->host, &v->be), "logging adaptor")) return 0;
    } else if (strcmp(name, "tenant") == 0) {
        snprintf(g_group, sizeof g_group, "test-backend-%d", (int)getpid());
        gp_arbiter_params pr = {.group = g_group, .device = "host", .name = "test_backend",
                                .priority = GP_PRIO_NORMAL, .limit = TENANT_LIMIT, .total = HOST_CAPACITY,
                                .share = 1};
        gp_arbiter *a;
        if (!ok(gp_arbiter_open(&pr, &a), "arbiter")) {
            v->host->destroy(v->host);
            return 0;
        }
        if (!ok(gp_backend_arbiter_wrap(v->host, a, &v->be), "tenant adaptor")) return 0;
        CHECK(v->be->total == TENANT_LIMIT);
#ifdef GP_TEST_CUDA
    } else if (strcmp(name, "cuda") == 0) {
        if (!ok(gp_backend_cuda_create(0, &v->be), "cuda backend")) return 0;
#endif
    } else {
        fprintf(stderr, "unknown variant '%s': host, deferred, log, tenant"
#ifdef GP_TEST_CUDA
                        ", cuda"
#endif
                        "\n", name);
        return 0;
    }
    return 1;
}

/* Pages a fresh mapping of n pages has resident (mincore). */
static size_t resident(void *m, size_t n)
{
    unsigned char v[64];
    size_t in = 0;
    if (n > sizeof v || mincore(m, n * (size_t)sysconf(_SC_PAGESIZE), v) != 0) return 0;
    for (size_t i = 0; i < n; i++) in += v[i] & 1;
    return in;
}

/* host_pages.h, shared by the backends: both ways of populating fault
 * every page in (touched with room to spare, madvise near the edge) and
 * read as zeros; the room is known on Linux. */
static void test_host_pages(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 64;
    CHECK(gp_host_pages_room() > 0);
    static const uint64_t rooms[] = {0, GP_HOST_PAGES_MARGIN, UINT64_MAX};
    for (size_t i = 0; i < sizeof rooms / sizeof rooms[0]; i++) {
        char *m = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(m != MAP_FAILED);
        if (m == MAP_FAILED) return;
        CHECK(resident(m, n) == 0);
        CHECK(ok(gp_host_pages_populate_in(m, n * page, rooms[i]), "populate"));
        CHECK(resident(m, n) == n);
        CHECK(m[0] == 0 && m[n * page - 1] == 0);
        munmap(m, n * page);
    }
    printf("host_pages: %s\n", check_fail ? "FAILS" : "conforms");
}

/* Write `text` to root/rel, making its directories. */
static void put(const char *root, const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *slash = strchr(path + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        mkdir(path, 0700);
        *slash = '/';
    }
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* The cgroup limits on a tree of our own: v2 and v1 (a hybrid host's
 * membership names both; v1's memory controller holds the limit), every
 * group up to the root counted, a container that sees only its own group
 * at the root, and the membership lines that name no memory group. */
static void test_cgroup_room(void)
{
    char root[] = "/tmp/gp_cgroup_XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    /* v2: the parent's room is the smaller. */
    put(root, "v2/a/b/memory.max", "1000\n");
    put(root, "v2/a/b/memory.current", "300\n");
    put(root, "v2/a/memory.max", "500\n");
    put(root, "v2/a/memory.current", "450\n");
    put(root, "v2/memory.max", "max\n"); /* (a root without a limit) */
    char v2[1100];
    snprintf(v2, sizeof v2, "%s/v2", root);
    CHECK(gp_host_pages_cgroup_room(v2, "0::/a/b\n") == 50);
    CHECK(gp_host_pages_cgroup_room(v2, "0::/a\n") == 50);
    put(root, "v2/a/memory.max", "max\n");
    CHECK(gp_host_pages_cgroup_room(v2, "0::/a/b\n") == 700);
    CHECK(gp_host_pages_cgroup_room(v2, "0::/a\n") == UINT64_MAX);
    /* Usage at or past the limit, or unreadable: no room. */
    put(root, "v2/a/b/memory.current", "1200\n");
    CHECK(gp_host_pages_cgroup_room(v2, "0::/a/b") == 0);
    put(root, "v2/a/b/memory.current", "");
    CHECK(gp_host_pages_cgroup_room(v2, "0::/a/b") == 0);
    /* A container's view: its group is the root, the path names groups
     * it cannot see. */
    put(root, "v2/memory.max", "2000\n");
    put(root, "v2/memory.current", "500\n");
    CHECK(gp_host_pages_cgroup_room(v2, "0::/docker/abc\n") == 1500);
    CHECK(gp_host_pages_cgroup_room(v2, "0::/\n") == 1500);
    /* v1, the memory controller among others, beside a v2 line whose
     * group would say otherwise: v1 holds the limit. */
    put(root, "v2/x/memory.max", "10\n");
    put(root, "v2/x/memory.current", "0\n");
    put(root, "v2/memory/x/memory.limit_in_bytes", "4096\n");
    put(root, "v2/memory/x/memory.usage_in_bytes", "1024\n");
    put(root, "v2/memory/memory.limit_in_bytes", "9223372036854771712\n"); /* (v1's "unlimited") */
    put(root, "v2/memory/memory.usage_in_bytes", "100000\n");
    const char *hybrid = "12:cpu,cpuacct:/x\n4:hugetlb,memory:/x\n1:name=systemd:/x\n0::/x\n";
    CHECK(gp_host_pages_cgroup_room(v2, hybrid) == 3072);
    /* No memory controller in the v1 lines ("memoryx" is another): v2. */
    CHECK(gp_host_pages_cgroup_room(v2, "4:memoryx:/x\n1:name=memory:/x\n0::/x") == 10);
    /* Nothing to read: no limit. */
    CHECK(gp_host_pages_cgroup_room(v2, "") == UINT64_MAX);
    CHECK(gp_host_pages_cgroup_room(v2, "garbage") == UINT64_MAX);
    CHECK(gp_host_pages_cgroup_room("/nonexistent", "0::/a\n") == UINT64_MAX);
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    printf("cgroup_room: %s\n", check_fail ? "FAILS" : "conforms");
}

/* The host backend's deferred streams: work runs when something orders the
 * caller after it, not before; another stream waited for runs first; and
 * memory unmapped under queued work is misuse. */
static void test_deferred(void)
{
    gp_backend *be;
    MUST(gp_backend_host_create(HOST_CAPACITY, &be));
    gp_host_set_deferred(be, 1);
    enum { N = 64 * 1024 };
    gp_stream s1 = NULL, s2 = NULL;
    unsigned char *h = NULL;
    dev_range a, b;
    CHECK(ok(be->stream_create(be, &s1), "stream_create") && ok(be->stream_create(be, &s2), "stream_create"));
    CHECK(ok(be->host_alloc(be, 2 * N, (void **)&h), "host_alloc"));
    CHECK(dev_get(be, N, &a) && dev_get(be, N, &b));
    fill(h, N, 5);
    memset(h + N, 0, N);
    /* Queued, not run: the D2H copy has not brought a's bytes yet. */
    CHECK(ok(be->copy(be, (void *)a.base, h, N, GP_COPY_H2D, s1), "copy H2D"));
    CHECK(ok(be->copy(be, h + N, (void *)a.base, N, GP_COPY_D2H, s1), "copy D2H"));
    CHECK(h[N] == 0 && h[N + N - 1] == 0);
    CHECK(drain(be, s1) && memcmp(h, h + N, N) == 0);
    /* s2 waits for s1: s2's copy out of b runs after s1's copy into b. */
    fill(h, N, 6);
    memset(h + N, 0, N);
    CHECK(ok(be->copy(be, (void *)b.base, h, N, GP_COPY_H2D, s1), "copy H2D"));
    CHECK(ok(be->stream_wait(be, s2, s1), "stream_wait"));
    CHECK(ok(be->copy(be, h + N, (void *)b.base, N, GP_COPY_D2H, s2), "copy D2H"));
    CHECK(drain(be, s2) && memcmp(h, h + N, N) == 0);
    /* A wait for s1 alone runs nothing of s2. */
    uint64_t sum = 0;
    CHECK(ok(be->checksum(be, (void *)a.base, N, 0, (void *)(b.base + 8), s2), "checksum"));
    CHECK(drain(be, s1));
    memcpy(&sum, (void *)(b.base + 8), 8);
    CHECK(sum != gp_checksum((void *)a.base, N, 0));
    CHECK(ok(be->synchronize(be), "synchronize"));
    memcpy(&sum, (void *)(b.base + 8), 8);
    CHECK(sum == gp_checksum((void *)a.base, N, 0));
    /* Unmapped while a copy out of it waits: misuse, and the copy, when its
     * stream runs, does nothing (a GPU would fault). */
    uint64_t misuse = gp_host_misuse(NULL, 0);
    CHECK(ok(be->copy(be, h, (void *)a.base, N, GP_COPY_D2H, s1), "copy D2H"));
    dev_put(be, &a);
    CHECK(gp_host_misuse(NULL, 0) == misuse + 1);
    CHECK(drain(be, s1) && gp_host_misuse(NULL, 0) == misuse + 2);
    dev_put(be, &b);
    be->host_free(be, h, 2 * N);
    be->stream_destroy(be, s1);
    be->stream_destroy(be, s2);
    be->destroy(be);
    printf("deferred streams: %s\n", check_fail ? "FAIL" : "as a GPU's");
}

static void run(const char *name)
{
    variant v;
    int before = check_fail;
    uint64_t misuse = gp_host_misuse(NULL, 0);
    if (!make(name, &v)) {
        CHECK(0);
        return;
    }
    test_description(&v);
    test_address_space(&v);
    test_streams_and_events(&v);
    test_host_memory(&v);
    test_copies(&v);
    test_checksum(&v);
    test_gather(&v);
    test_in_context(&v);
    test_grant_peer(&v);
    if (v.host) {
        /* Every operation reached the host backend, through the adaptor if
         * any, and nothing is left. */
        gp_host_counters c;
        gp_host_counters_get(v.host, &c);
        for (int fn = 0; fn < GP_HOST_FN_COUNT; fn++) {
            if (c.calls[fn]) continue;
            fprintf(stderr, "  %s: %s never reached the host backend\n", name, gp_host_fn_name((gp_host_fn)fn));
            CHECK(0);
        }
        CHECK(c.n_unreserve > 0 && c.n_event_record > 0 && c.n_host_alloc > 0);
        CHECK(c.mapped == 0 && c.events_live == 0 && c.host_bytes == 0 && c.streams_live == 0);
        CHECK(c.n_host_register > 0 && c.host_registered == 0);
    }
    v.be->destroy(v.be);
    if (v.host) {
        char msg[256];
        CHECK(gp_host_misuse(msg, sizeof msg) == misuse);
        if (gp_host_misuse(NULL, 0) != misuse) fprintf(stderr, "  %s: misuse: %s\n", name, msg);
    }
    if (strcmp(name, "tenant") == 0) {
        /* Its destroy closed the arbiter: the group's registry is gone. */
        gp_group_info g;
        CHECK(gp_arbiter_read(g_group, "host", &g, NULL, 0) == GP_ERR_FOREIGN);
    }
    printf("%s: %s\n", name, check_fail == before ? "conforms" : "FAILS");
}

int main(int argc, char **argv)
{
    static const char *const all[] = {"host", "deferred", "log", "tenant"};
    test_host_pages();
    test_cgroup_room();
    test_deferred();
    if (argc > 1)
        for (int i = 1; i < argc; i++) run(argv[i]);
    else
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) run(all[i]);
    return check_done();
}
