/*
 * test_faults.c -- fault injection: every backend call the pool makes may
 * fail, and the pool must survive each failure.  The injection itself
 * (gp_host_fail: the nth call, once or from then on, junk outputs, nothing
 * changed) and the backend's misuse checks.
 */
#include <string.h>

#include "pool_check.h"

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
    CHECK(be->stream_create(be, &made) == GP_ERR_BACKEND);
    CHECK(be->stream_create(be, &made) == GP_OK);
    CHECK(be->copy(be, buf, pinned, sizeof buf, GP_COPY_D2H, made) == GP_ERR_BACKEND);
    CHECK(be->event_wait(be, ev) == GP_ERR_BACKEND);
    CHECK(be->event_query(be, ev, &flag) == GP_OK && flag == 0);
    CHECK(be->event_wait(be, ev) == GP_OK);
    CHECK(be->event_query(be, ev, &flag) == GP_OK && flag == 1);
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

int main(void)
{
    test_nth_call_once_and_from();
    test_misuse_is_counted();
    test_reserve_map_failure_is_named();
    test_graph_release_after_failed_sync();
    test_oom_report_without_mem_info();
    return check_done();
}
