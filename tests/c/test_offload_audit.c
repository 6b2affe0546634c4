/*
 * test_offload_audit.c -- offload never lies: each test here is a way the
 * offload path once returned wrong bytes as success, touched freed memory,
 * hung, or said "restored" while memory was still away, on the host
 * backend.  Every test fails on the code before its fix.
 *
 *   fault walk        one failure at every call of every function an offload
 *                     makes (once, and from then on), raw and compressed,
 *                     kept and dropped: a failed offload is undone with the
 *                     bytes as before, or says how many it lost; a restore
 *                     of lost bytes needs the caller's consent, and then no
 *                     more bytes differ than it said
 *   fault pairs       two failures at once, on streams that run their work
 *                     late: an undo that fails too, or a drain that fails,
 *                     lets no memory go with work still queued on it
 *   swap walk         the same for a swap out and a swap in (one record of
 *                     tags with and without dtype hints, beside memory the
 *                     user offloaded): a swap out that fails is undone or
 *                     says what it left away, a swap in that fails is asked
 *                     again, and every byte comes back
 *   prefetch during   a prefetch issued while a restore runs: the restore
 *   a restore         returns only once every record of its tags is back,
 *                     and nobody restores a record another thread frees
 *   together or fail  tags that cannot be on the device together: restoring
 *                     them fails instead of displacing each other for ever
 *   equal             a restore makes room from an idle tag of its own
 *                     priority, never from a busy one
 *   failed give-back  a restore that fails and cannot give its chunks back
 *                     leaves memory a later restore brings back whole
 *   nested offload    a restore that makes room by offloading mid-way keeps
 *                     its own checksums (no false "corrupt")
 *   room made         a restore whose map-ahead jobs all failed while the
 *                     device was full maps them once room is made
 *   first error       a restore that fails says why, not an earlier map
 *                     failure it recovered from
 *   retag             a block retagged while offloaded comes back by its
 *                     new tag
 *   codec             a codec that cannot run is refused alike whether the
 *                     contents are kept or dropped
 *   status and words  a failed offload or restore says the words of the
 *                     failure whose status it returns: not those of a
 *                     later step (an unmap job, a recovered event, whose
 *                     device wait cleared them) nor of a map failure
 *                     recovered from
 *   lost, prefetched  a prefetch of a record that lost bytes leaves it to
 *                     the restore: one that accepts the loss brings it back
 *                     (the prefetch's refusal failed it)
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec.h"
#include "offload_test.h"
#include "testdata.h"

static gp_tag T_A, T_B, T_F;

/* Bytes of [a, a+n) that differ from [b, b+n). */
static uint64_t differing(const unsigned char *a, const unsigned char *b, uint64_t n)
{
    uint64_t d = 0;
    for (uint64_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

/* The bytes the error of a failed offload says it lost (0: none said). */
static uint64_t said_lost(void)
{
    const char *k = strstr(gp_last_error(), "it stays offloaded and ");
    return k ? strtoull(k + strlen("it stays offloaded and "), NULL, 10) : 0;
}

static int all_offloaded(gp_pool *p, void *const *b, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) k += state_of(p, b[i]) == GP_BLOCK_OFFLOADED;
    return k;
}

/* ------------------------------------------------------------ fault walk */

enum { WB = 5 };
static const uint64_t walk_sizes[WB] = {3 * MiB + 5, 1 * MiB, 5 * MiB + 4096, 700 * KiB, 2 * MiB + 333};

typedef struct walk_case {
    int codec, keep;
    int again;   /* offloaded and restored once first: the faulted offload
                    finds that host copy (clean) ...                      */
    int write;   /* ... after two words' top bits were flipped (then it
                    must copy, not take the stale copy)                    */
    int restore; /* the faults fall on a restore (of an offload that went) */
} walk_case;

typedef struct fault {
    gp_host_fn fn;
    uint64_t nth;
    int mode; /* GP_HOST_FAIL_ONCE or _FROM */
} fault;

/* What the walks fail: every backend function an offload, a restore or a
 * swap calls. */
static const gp_host_fn walk_fns[] = {GP_HOST_COPY,        GP_HOST_UNMAP,      GP_HOST_MAP,
                                      GP_HOST_EVENT_RECORD, GP_HOST_EVENT_WAIT, GP_HOST_CHECKSUM,
                                      GP_HOST_SYNCHRONIZE, GP_HOST_HOST_ALLOC, GP_HOST_GATHER,
                                      GP_HOST_HOST_POPULATE, GP_HOST_HOST_REGISTER};

/* "copy call 3 (once) + synchronize call 1 (from)", for the reports. */
static const char *faults_text(const fault *f, size_t nf, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < nf && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s call %llu (%s)", i ? " + " : "", gp_host_fn_name(f[i].fn),
                               (unsigned long long)f[i].nth, f[i].mode ? "from" : "once");
    return buf;
}

/* One offload (or restore) of T_A with the nf faults armed, then everything
 * brought back and checked.  calls (GP_HOST_FN_COUNT, or NULL) gets the
 * calls each function had in that step; *gave_up whether a failed offload
 * could not be undone either. */
static void walk_one(walk_case wc, const fault *f, size_t nf, uint64_t *calls, int *gave_up)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *b[WB];
    unsigned char *want[WB];
    for (int i = 0; i < WB; i++) {
        b[i] = gp_alloc(p, walk_sizes[i], NULL, T_A, GP_PRIO_NORMAL, NULL);
        want[i] = malloc(walk_sizes[i]);
        data_rng = 77 + (uint64_t)i;
        data_fill(want[i], walk_sizes[i], wc.codec == GP_CODEC_RAW ? DATA_RANDOM : DATA_BF16);
        memcpy(b[i], want[i], walk_sizes[i]);
    }
    gp_offload_opts opts = {.keep = wc.keep, .codec = wc.codec, .elem_size = 2};
    gp_offload_result r;
    if (wc.again) {
        gp_offload_opts first = {.keep = 1, .codec = wc.codec, .elem_size = 2};
        CHECK(gp_offload_tags(o, &T_A, 1, &first, &r) == GP_OK && gp_restore_tags(o, &T_A, 1, 0, &r) == GP_OK);
        for (int i = 0; wc.write && i < WB; i += 2) {
            want[i][7] ^= 0x80;
            want[i][walk_sizes[i] / 16 * 8 + 7] ^= 0x80;
            memcpy(b[i], want[i], walk_sizes[i]);
        }
    }
    if (wc.restore) CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
    gp_host_counters c0, c1;
    gp_host_counters_get(be, &c0);
    uint64_t misuse = gp_host_misuse(NULL, 0);
    for (size_t i = 0; i < nf; i++) gp_host_fail(be, f[i].fn, f[i].nth, GP_ERR_BACKEND, f[i].mode);
    gp_status st = wc.restore ? gp_restore_tags(o, &T_A, 1, 0, &r) : gp_offload_tags(o, &T_A, 1, &opts, &r);
    char msg[1024], what[256];
    snprintf(msg, sizeof msg, "%s", gp_last_error());
    faults_text(f, nf, what, sizeof what);
    gp_host_counters_get(be, &c1);
    gp_host_fail_none(be);
    uint64_t lost = st == GP_OK || wc.restore ? 0 : said_lost();
    *gave_up = st != GP_OK && strstr(msg, "it stays offloaded") != NULL;
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    if (st != GP_OK && !wc.restore && !*gave_up) {
        /* Undone: resident, and the bytes as before unless dropped (then
         * the message says how many lost their contents). */
        uint64_t diff = 0;
        for (int i = 0; i < WB; i++) {
            CHECK(state_of(p, b[i]) == GP_BLOCK_USED);
            diff += differing(b[i], want[i], walk_sizes[i]);
        }
        if (diff) {
            CHECK(!wc.keep && strstr(msg, "as before") == NULL && r.lost >= diff);
            if (wc.keep || strstr(msg, "as before") || r.lost < diff)
                fprintf(stderr, "  offload, %s: %llu bytes changed: %s\n", what, (unsigned long long)diff, msg);
        }
    } else {
        /* Offloaded (or given up with what was lost counted, or a restore
         * that failed): a restore without consent refuses lost bytes; with
         * it, no more bytes differ than were said lost. */
        gp_offload_result rr;
        gp_status rs = gp_restore_tags(o, &T_A, 1, 0, &rr);
        if (lost) {
            CHECK(rs == GP_ERR_BACKEND && strstr(gp_last_error(), "were lost") && all_offloaded(p, b, WB) > 0);
            rs = gp_restore_tags(o, &T_A, 1, 1, &rr);
            CHECK(rr.lost == lost);
        }
        if (rs != GP_OK) fprintf(stderr, "  %s, %s: the restore after: %s\n", wc.restore ? "restore" : "offload",
                                 what, gp_last_error());
        CHECK(rs == GP_OK && all_offloaded(p, b, WB) == 0);
        uint64_t diff = 0;
        for (int i = 0; i < WB; i++) diff += differing(b[i], want[i], walk_sizes[i]);
        if (wc.keep) CHECK(diff <= lost);
        if (wc.keep && diff > lost)
            fprintf(stderr, "  %s, %s: %llu bytes wrong, %llu said lost: %s\n", wc.restore ? "restore" : "offload",
                    what, (unsigned long long)diff, (unsigned long long)lost, msg);
    }
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    for (int i = 0; i < WB; i++) {
        CHECK(gp_free(p, b[i]) == GP_OK);
        free(want[i]);
    }
    gp_pool_empty_cache(p); /* (the memory given back while the offloader lives: nothing of it may be queued) */
    offloader_done(o, p, be);
    char why[256] = "";
    CHECK(gp_host_misuse(why, sizeof why) == misuse);
    if (gp_host_misuse(NULL, 0) != misuse)
        fprintf(stderr, "  %s, %s%s: misuse: %s\n", wc.restore ? "restore" : "offload", what,
                deferred_streams ? ", deferred" : "", why);
    for (int i = 0; calls && i < GP_HOST_FN_COUNT; i++) calls[i] = c1.calls[i] - c0.calls[i];
}

static void test_fault_walk(void)
{
    walk_case cases[] = {{GP_CODEC_RAW, 1}, {GP_CODEC_RAW, 0}, {GP_CODEC_RAW, 1, 1, 0}, {GP_CODEC_RAW, 1, 1, 1},
#ifdef GP_HAVE_ZSTD
                         {GP_CODEC_AUTO, 1}, {GP_CODEC_AUTO, 1, 1, 0},
#endif
    };
    /* Twice: the second time the backend's streams run their work as late
     * as a GPU's may, so a failure path that lets memory go (unmaps a
     * chunk, frees a buffer) before the work queued on it ran is misuse:
     * on a GPU, a fault that ends the context. */
    for (deferred_streams = 0; deferred_streams < 2; deferred_streams++) {
        unsigned points = 0, gave_up = 0;
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            uint64_t calls[GP_HOST_FN_COUNT];
            int g;
            walk_one(cases[k], NULL, 0, calls, &g);
            for (size_t f = 0; f < sizeof walk_fns / sizeof walk_fns[0]; f++)
                for (uint64_t nth = 1; nth <= calls[walk_fns[f]]; nth++)
                    for (int mode = 0; mode < 2; mode++) {
                        walk_one(cases[k], &(fault){walk_fns[f], nth, mode}, 1, NULL, &g);
                        points++;
                        gave_up += (unsigned)g;
                    }
        }
        printf("offload fault walk%s: %u points, %u gave up\n", deferred_streams ? " (deferred streams)" : "",
               points, gave_up);
        CHECK(points > 100 && gave_up > 0);
    }
    deferred_streams = 0;
}

/* Two failures at once, on deferred streams, reach what one cannot:
 *  - an offload that fails, then fails again while undoing: the undo's
 *    copies back that went before its failure are still queued when the
 *    offload gives up and lets its chunks go;
 *  - an offload or a restore that fails while even draining the streams
 *    fails (events refused, and the device sync after them): the work
 *    queued on its chunks never ran, so they must stay mapped. */
static void test_fault_pairs(void)
{
    const gp_host_fn firsts[] = {GP_HOST_UNMAP, GP_HOST_EVENT_WAIT, GP_HOST_CHECKSUM, GP_HOST_GATHER, GP_HOST_MAP};
    const gp_host_fn drains[] = {GP_HOST_EVENT_RECORD, GP_HOST_EVENT_WAIT};
    walk_case cases[] = {{GP_CODEC_RAW, 1}, {GP_CODEC_RAW, 0}, {.codec = GP_CODEC_RAW, .keep = 1, .restore = 1},
#ifdef GP_HAVE_ZSTD
                         {GP_CODEC_AUTO, 1}, {.codec = GP_CODEC_AUTO, .keep = 1, .restore = 1},
#endif
    };
    deferred_streams = 1;
    unsigned points = 0, gave_up = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint64_t calls[GP_HOST_FN_COUNT], then[GP_HOST_FN_COUNT];
        int g;
        walk_one(cases[k], NULL, 0, calls, &g);
        /* The copy that fails is one of the last three the first failure
         * left: those of its recovery. */
        for (size_t f = 0; !cases[k].restore && f < sizeof firsts / sizeof firsts[0]; f++)
            for (uint64_t nth = 1; nth <= calls[firsts[f]]; nth++) {
                fault two[2] = {{firsts[f], nth, GP_HOST_FAIL_ONCE}, {GP_HOST_COPY, 0, GP_HOST_FAIL_ONCE}};
                walk_one(cases[k], two, 1, then, &g);
                for (uint64_t j = 0; j < 3 && j < then[GP_HOST_COPY]; j++, points++) {
                    two[1].nth = then[GP_HOST_COPY] - j;
                    walk_one(cases[k], two, 2, NULL, &g);
                    gave_up += (unsigned)g;
                }
            }
        for (size_t f = 0; f < sizeof drains / sizeof drains[0]; f++)
            for (uint64_t nth = 1; nth <= calls[drains[f]]; nth++, points++) {
                fault two[2] = {{drains[f], nth, GP_HOST_FAIL_FROM}, {GP_HOST_SYNCHRONIZE, 1, GP_HOST_FAIL_FROM}};
                walk_one(cases[k], two, 2, NULL, &g);
                gave_up += (unsigned)g;
            }
    }
    printf("offload fault pairs (deferred streams): %u points, %u gave up\n", points, gave_up);
    CHECK(points > 100 && gave_up > 0);
    deferred_streams = 0;
}

/* ------------------------------------------------------------ swap walk */

enum { SWN = 5 };

/* A swap out and in of SWN tags (two with dtype hints, three without,
 * sharing chunks) next to a block of T_B the user offloaded before, with
 * the nf faults armed on the swap out, or on the swap in (`on_in`).  A
 * swap out that fails is undone: every block resident as before, or, when
 * the undo failed too, offloaded with what was lost said and the swap's
 * id to bring it back by (a loss needs the caller's consent); a swap in that
 * fails is asked again.  Every byte comes back, and the user's offload
 * stays the user's.  calls: as walk_one's. */
static void swap_one(const char *codec, int on_in, const fault *f, size_t nf, uint64_t *calls)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    gp_tag t[SWN + 1];
    void *b[SWN + 1];
    uint64_t size[SWN + 1];
    unsigned char *want[SWN + 1];
    for (int i = 0; i <= SWN; i++) {
        char name[32];
        snprintf(name, sizeof name, "audit_swap%d", i);
        if (i == SWN) t[i] = T_B;
        else CHECK(gp_tag_intern(name, &t[i]) == GP_OK);
        /* (Before the blocks: nothing live to pin ahead for.) */
        if (i < 2) CHECK(gp_offload_register(o, t[i], GP_PRIO_NORMAL, i ? 4 : 2) == GP_OK);
    }
    for (int i = 0; i <= SWN; i++) {
        size[i] = 300 * KiB + (uint64_t)i * 200 * KiB + (uint64_t)i;
        b[i] = gp_alloc(p, size[i], NULL, t[i], GP_PRIO_NORMAL, NULL);
        want[i] = malloc(size[i]);
        data_rng = 91 + (uint64_t)i;
        data_fill(want[i], size[i], i == 1 ? DATA_FP32SQ : DATA_BF16);
        memcpy(b[i], want[i], size[i]);
    }
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r, rr;
    CHECK(gp_offload_tags(o, &T_B, 1, &opts, &r) == GP_OK);
    uint32_t id = 0;
    if (on_in) CHECK(gp_offload_swap_out(o, codec, &id, &r) == GP_OK && id);
    gp_host_counters c0, c1;
    gp_host_counters_get(be, &c0);
    uint64_t misuse = gp_host_misuse(NULL, 0);
    for (size_t i = 0; i < nf; i++) gp_host_fail(be, f[i].fn, f[i].nth, GP_ERR_BACKEND, f[i].mode);
    gp_status st = on_in ? gp_offload_swap_in(o, id, &r) : gp_offload_swap_out(o, codec, &id, &r);
    char msg[1024], what[256];
    snprintf(msg, sizeof msg, "%s", gp_last_error());
    faults_text(f, nf, what, sizeof what);
    gp_host_counters_get(be, &c1);
    gp_host_fail_none(be);
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    CHECK(nf || st == GP_OK);
    if (st == GP_OK && !on_in)
        for (int i = 0; i <= SWN; i++) CHECK(state_of(p, b[i]) == GP_BLOCK_OFFLOADED);
    uint64_t lost = 0;
    if (st != GP_OK && !on_in) {
        /* Undone (no id), or said to be still away (an undo that failed
         * too): then the id names it, its swap in brings it back, and
         * where bytes were lost it refuses, naming the swap, until the
         * caller accepts the loss by a restore of the tags. */
        int away = all_offloaded(p, b, SWN) != 0;
        CHECK(strstr(msg, away ? "restoring what it had taken failed too" : "was undone") != NULL);
        if (!strstr(msg, away ? "restoring what it had taken failed too" : "was undone"))
            fprintf(stderr, "  swap out, %s: blocks away %d: %s\n", what, away, msg);
        CHECK((id != 0) == away && (r.released != 0) == away);
        if ((id != 0) != away || (r.released != 0) != away)
            fprintf(stderr, "  swap out, %s: away %d, id %u, released %llu: %s\n", what, away, id,
                    (unsigned long long)r.released, msg);
        gp_status rs = away ? gp_offload_swap_in(o, id, &rr) : gp_restore_tags(o, t, SWN, 0, &rr);
        if (rs != GP_OK && strstr(gp_last_error(), "were lost")) {
            CHECK(away && strstr(gp_last_error(), "a swap out of the process's memory") != NULL);
            rs = gp_restore_tags(o, t, SWN, 1, &rr);
            lost = rr.lost;
        }
        CHECK(rs == GP_OK && (!lost || away));
        if (rs != GP_OK) fprintf(stderr, "  swap out, %s: bringing it back: %s\n", what, gp_last_error());
    } else if (id) {
        gp_status si = gp_offload_swap_in(o, id, &rr);
        if (si != GP_OK) fprintf(stderr, "  swap %s, %s: the swap in after: %s\n", on_in ? "in" : "out", what,
                                 gp_last_error());
        CHECK(si == GP_OK);
    }
    /* The user's offload is still away, and comes back by its tag. */
    CHECK(state_of(p, b[SWN]) == GP_BLOCK_OFFLOADED && gp_restore_tags(o, &T_B, 1, 0, &rr) == GP_OK);
    uint64_t diff = 0;
    for (int i = 0; i <= SWN; i++) {
        CHECK(state_of(p, b[i]) == GP_BLOCK_USED);
        diff += differing(b[i], want[i], size[i]);
    }
    CHECK(diff <= lost);
    if (diff > lost)
        fprintf(stderr, "  swap %s, %s: %llu bytes wrong, %llu said lost: %s\n", on_in ? "in" : "out", what,
                (unsigned long long)diff, (unsigned long long)lost, msg);
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    for (int i = 0; i <= SWN; i++) {
        CHECK(gp_free(p, b[i]) == GP_OK);
        free(want[i]);
    }
    gp_pool_empty_cache(p);
    offloader_done(o, p, be);
    char why[256] = "";
    CHECK(gp_host_misuse(why, sizeof why) == misuse);
    if (gp_host_misuse(NULL, 0) != misuse)
        fprintf(stderr, "  swap %s, %s%s: misuse: %s\n", on_in ? "in" : "out", what,
                deferred_streams ? ", deferred" : "", why);
    for (int i = 0; calls && i < GP_HOST_FN_COUNT; i++) calls[i] = c1.calls[i] - c0.calls[i];
}

/* One failure at every call of every function a swap out or in makes. */
static void test_swap_walk(void)
{
    const char *codecs[] = {"raw",
#ifdef GP_HAVE_ZSTD
                            "zstd",
#endif
    };
    for (deferred_streams = 0; deferred_streams < 2; deferred_streams++) {
        unsigned points = 0;
        for (size_t k = 0; k < sizeof codecs / sizeof codecs[0]; k++)
            for (int on_in = 0; on_in < 2; on_in++) {
                uint64_t calls[GP_HOST_FN_COUNT];
                swap_one(codecs[k], on_in, NULL, 0, calls);
                for (size_t f = 0; f < sizeof walk_fns / sizeof walk_fns[0]; f++)
                    for (uint64_t nth = 1; nth <= calls[walk_fns[f]]; nth++)
                        for (int mode = 0; mode < 2; mode++, points++)
                            swap_one(codecs[k], on_in, &(fault){walk_fns[f], nth, mode}, 1, NULL);
            }
        printf("swap fault walk%s: %u points\n", deferred_streams ? " (deferred streams)" : "", points);
        CHECK(points > 100);
    }
    deferred_streams = 0;
}

/* ------------------------------------------------ prefetch during restore */

typedef struct late_prefetch {
    gp_offloader *o;
    gp_tag tag;
    long after_us;
    gp_status st;
} late_prefetch;

static void *prefetch_later(void *arg)
{
    late_prefetch *lp = arg;
    nanosleep(&(struct timespec){0, lp->after_us * 1000}, NULL);
    lp->st = gp_prefetch_tags(lp->o, &lp->tag, 1);
    return NULL;
}

static void test_prefetch_during_restore(void)
{
    for (int round = 0; round < 3; round++) {
        slow_two x;
        slow_two_make(&x, 256 * MiB, 2000, T_A, T_B, 4 * MiB, 1); /* (a restore of 8 MiB maps for 16 ms) */
        gp_pool *p = x.p;
        gp_offloader *o = x.o;
        void *a = x.a, *b = x.b;
        gp_tag ab[2] = {T_A, T_B};
        gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
        gp_offload_result r;
        CHECK(gp_offload_tags(o, ab, 2, &opts, &r) == GP_OK);
        void *a2 = gp_alloc(p, 8 * MiB, NULL, T_A, GP_PRIO_NORMAL, NULL);
        fill(a2, 8 * MiB, 3);
        CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
        /* Restoring T_A takes the newer record first; meanwhile another
         * thread prefetches the older one (it holds T_B too): the restore
         * returns once that is back as well. */
        late_prefetch lp = {.o = o, .tag = T_B, .after_us = 4000};
        pthread_t th;
        pthread_create(&th, NULL, prefetch_later, &lp);
        CHECK(gp_restore_tags(o, &T_A, 1, 0, &r) == GP_OK);
        CHECK(state_of(p, a) == GP_BLOCK_USED && state_of(p, a2) == GP_BLOCK_USED && !gp_offload_is_offloaded(o, T_A));
        pthread_join(th, NULL);
        CHECK(lp.st == GP_OK);
        CHECK(gp_restore_tags(o, &T_B, 1, 0, &r) == GP_OK && gp_restore_tags(o, &T_A, 1, 0, &r) == GP_OK);
        CHECK(same(a, 8 * MiB, 1) && same(b, 4 * MiB, 2) && same(a2, 8 * MiB, 3));
        /* A prefetch of the very record a restore is bringing back: the
         * prefetch finds it taken (its job would restore freed memory). */
        CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
        lp = (late_prefetch){.o = o, .tag = T_A, .after_us = 4000};
        pthread_create(&th, NULL, prefetch_later, &lp);
        CHECK(gp_restore_tags(o, &T_A, 1, 0, &r) == GP_OK && !gp_offload_is_offloaded(o, T_A));
        pthread_join(th, NULL);
        CHECK(gp_restore_tags(o, &T_A, 1, 0, &r) == GP_OK); /* (waits for the prefetch, if one was queued) */
        CHECK(same(a, 8 * MiB, 1) && same(a2, 8 * MiB, 3));
        gp_free(p, a);
        gp_free(p, b);
        gp_free(p, a2);
        slow_two_done(&x);
    }
}

/* ------------------------------------------------------- together or fail */

static void hang(int sig)
{
    (void)sig;
    static const char m[] = "test_offload_audit: hung (a restore displacing its own tags for ever?)\n";
    (void)!write(2, m, sizeof m - 1);
    _exit(3);
}

/* A device of 64 MiB whose free room holds one of A and B (each 24 MiB,
 * registered offloadable, idle) but not both. */
/* Tags A and B, 24 MiB each, allocated at `prio`, filled (seeds `seed`
 * and `seed` + 1) and offloadable at low priority. */
static void two_tags(gp_offloader *o, gp_pool *p, int prio, unsigned seed, void **a, void **b)
{
    *a = gp_alloc(p, 24 * MiB, NULL, T_A, prio, NULL);
    *b = gp_alloc(p, 24 * MiB, NULL, T_B, prio, NULL);
    CHECK(*a && *b);
    fill(*a, 24 * MiB, seed);
    fill(*b, 24 * MiB, seed + 1);
    CHECK(gp_offload_register(o, T_A, GP_PRIO_LOW, 2) == GP_OK && gp_offload_register(o, T_B, GP_PRIO_LOW, 2) == GP_OK);
}

static void test_together_or_fail(void)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *a, *b;
    two_tags(o, p, GP_PRIO_NORMAL, 4, &a, &b);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK && gp_offload_tags(o, &T_B, 1, &opts, &r) == GP_OK);
    void *f = gp_alloc(p, 20 * MiB, NULL, T_F, GP_PRIO_NORMAL, NULL);
    CHECK(f != NULL);
    gp_tag ab[2] = {T_A, T_B};
    signal(SIGALRM, hang);
    alarm(60);
    gp_status st = gp_restore_tags(o, ab, 2, 0, &r);
    alarm(0);
    CHECK(st == GP_ERR_OOM);
    /* One came back, the other stayed offloaded, its bytes safe. */
    CHECK((state_of(p, a) == GP_BLOCK_USED) + (state_of(p, b) == GP_BLOCK_USED) == 1);
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    gp_free(p, f);
    CHECK(gp_restore_tags(o, ab, 2, 0, &r) == GP_OK && state_of(p, a) == GP_BLOCK_USED &&
          state_of(p, b) == GP_BLOCK_USED && same(a, 24 * MiB, 4) && same(b, 24 * MiB, 5));
    CHECK(offload_ok(o));
    gp_free(p, a);
    gp_free(p, b);
    offloader_done(o, p, be);
}

/* A restore makes room from an idle tag of its own priority (layers of
 * one model streamed under a limit); one that is busy stays, and the
 * restore fails. */
static void test_restore_displaces_an_equal(void)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *a, *b;
    two_tags(o, p, GP_PRIO_LOW, 7, &a, &b);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
    void *f = gp_alloc(p, 20 * MiB, NULL, T_F, GP_PRIO_NORMAL, NULL); /* room for one of A and B */
    CHECK(f != NULL);
    CHECK(gp_offload_use(o, T_B, 1) == GP_OK);
    CHECK(gp_restore_tags(o, &T_A, 1, 0, &r) == GP_ERR_OOM && state_of(p, b) == GP_BLOCK_USED);
    CHECK(gp_offload_use(o, T_B, 0) == GP_OK);
    CHECK(gp_restore_tags(o, &T_A, 1, 0, &r) == GP_OK);
    CHECK(state_of(p, a) == GP_BLOCK_USED && state_of(p, b) == GP_BLOCK_OFFLOADED && same(a, 24 * MiB, 7));
    CHECK(gp_restore_tags(o, &T_B, 1, 0, &r) == GP_OK); /* (and back: A is idle) */
    CHECK(state_of(p, a) == GP_BLOCK_OFFLOADED && same(b, 24 * MiB, 8));
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    gp_free(p, f);
    CHECK(gp_restore_tags(o, &T_A, 1, 0, &r) == GP_OK && same(a, 24 * MiB, 7));
    gp_free(p, a);
    gp_free(p, b);
    offloader_done(o, p, be);
}

/* ----------------------------------------------------- failed give-back */

static void test_failed_giveback(void)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *a = gp_alloc(p, 12 * MiB, NULL, T_A, GP_PRIO_NORMAL, NULL);
    fill(a, 12 * MiB, 6);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
    /* The restore's second copy fails, and every unmap from then on. */
    gp_host_fail(be, GP_HOST_COPY, 2, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    gp_host_fail(be, GP_HOST_UNMAP, 1, GP_ERR_BACKEND, GP_HOST_FAIL_FROM);
    CHECK(gp_restore_tags(o, &T_A, 1, 0, &r) == GP_ERR_BACKEND && state_of(p, a) == GP_BLOCK_OFFLOADED);
    CHECK(strstr(gp_last_error(), "injected") != NULL);
    gp_host_fail_none(be);
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    gp_status st = gp_restore_tags(o, &T_A, 1, 0, &r);
    if (st != GP_OK) fprintf(stderr, "  restore after a failed give-back: %s\n", gp_last_error());
    CHECK(st == GP_OK && state_of(p, a) == GP_BLOCK_USED && same(a, 12 * MiB, 6));
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    gp_free(p, a);
    offloader_done(o, p, be);
}

/* ------------------------------------- restores that make room mid-way */

/* A pool of 64 MiB with B (20 MiB, one block: pieces of 16 and 4 MiB)
 * offloaded, A (30 MiB) registered offloadable at low priority and idle,
 * and low-priority filler (which the callback may not offload for) until
 * `room` bytes are left. */
typedef struct crowd {
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o;
    void *a, *b, *f[64];
    int nf;
} crowd;

static void crowd_make(crowd *c, uint64_t room, gp_backend *be)
{
    memset(c, 0, sizeof *c);
    c->be = be;
    c->p = pool_over(be);
    CHECK(gp_offloader_create(c->p, 0, 2, NULL, &c->o) == GP_OK);
    c->b = gp_alloc(c->p, 20 * MiB, NULL, T_B, GP_PRIO_NORMAL, NULL);
    fill(c->b, 20 * MiB, 7);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(c->o, &T_B, 1, &opts, &r) == GP_OK);
    c->a = gp_alloc(c->p, 30 * MiB, NULL, T_A, GP_PRIO_LOW, NULL);
    fill(c->a, 30 * MiB, 8);
    CHECK(gp_offload_register(c->o, T_A, GP_PRIO_LOW, 2) == GP_OK);
    gp_stats s;
    gp_pool_stats(c->p, &s, 0);
    while (s.reserved + room + 1 * MiB <= 64 * MiB && c->nf < 64) {
        c->f[c->nf++] = gp_alloc(c->p, 1 * MiB, NULL, T_F, GP_PRIO_LOW, NULL);
        gp_pool_stats(c->p, &s, 0);
    }
    CHECK(64 * MiB - s.reserved == room);
}

static void crowd_done(crowd *c)
{
    CHECK(state_of(c->p, c->b) == GP_BLOCK_USED && same(c->b, 20 * MiB, 7));
    gp_offload_result r;
    CHECK(gp_restore_tags(c->o, &T_A, 1, 0, &r) == GP_ERR_OOM); /* (room for A only once the filler goes) */
    for (int i = 0; i < c->nf; i++) gp_free(c->p, c->f[i]);
    CHECK(gp_restore_tags(c->o, &T_A, 1, 0, &r) == GP_OK && state_of(c->p, c->a) == GP_BLOCK_USED &&
          same(c->a, 30 * MiB, 8));
    CHECK(offload_ok(c->o) && pool_consistent(c->p, c->be) == 0);
    gp_free(c->p, c->a);
    gp_free(c->p, c->b);
    gp_offloader_destroy(c->o);
    done(c->p);
}

/* B's first piece fits, its last chunk not: A is offloaded mid-restore,
 * after B's first checksum was taken, into the same device array. */
static void test_nested_offload(void)
{
    gp_backend *be;
    CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK);
    crowd c;
    crowd_make(&c, 19 * MiB, be);
    gp_offload_result r;
    gp_status st = gp_restore_tags(c.o, &T_B, 1, 0, &r);
    if (st != GP_OK) fprintf(stderr, "  nested: %s\n", gp_last_error());
    CHECK(st == GP_OK && state_of(c.p, c.b) == GP_BLOCK_USED && state_of(c.p, c.a) == GP_BLOCK_OFFLOADED);
    crowd_done(&c);
}

/* Nothing of B fits: every map-ahead job fails; the first chunk's wait
 * makes room for all of them. */
static void test_room_made(void)
{
    gp_backend *be;
    CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK);
    crowd c;
    crowd_make(&c, 0, be);
    gp_offload_result r;
    gp_status st = gp_restore_tags(c.o, &T_B, 1, 0, &r);
    if (st != GP_OK) fprintf(stderr, "  room made: %s\n", gp_last_error());
    CHECK(st == GP_OK && state_of(c.p, c.b) == GP_BLOCK_USED);
    crowd_done(&c);
}

/* A host backend whose copies to the device fail while armed. */
typedef struct h2d_fails {
    gp_backend_wrap w;
    int armed;
} h2d_fails;

static gp_status h2d_copy(gp_backend *be, void *dst, const void *src, uint64_t n, int kind, gp_stream s)
{
    h2d_fails *h = (h2d_fails *)(void *)be;
    if (h->armed && kind == GP_COPY_H2D) return gp_error_set(GP_ERR_BACKEND, "h2d copy: the bus said no");
    return GP_INNER(be)->copy(GP_INNER(be), dst, src, n, kind, s);
}

/* The restore of test_room_made, whose copies back fail: the error names
 * the copy, not the map failures the restore recovered from. */
static void test_first_error(void)
{
    gp_backend *inner;
    CHECK(gp_backend_host_create(64 * MiB, &inner) == GP_OK);
    h2d_fails *h = calloc(1, sizeof *h);
    CHECK(h != NULL);
    gp_backend_forward(&h->w, inner);
    h->w.be.copy = h2d_copy;
    crowd c;
    crowd_make(&c, 0, &h->w.be);
    c.be = inner;
    h->armed = 1;
    gp_offload_result r;
    CHECK(gp_restore_tags(c.o, &T_B, 1, 0, &r) == GP_ERR_BACKEND);
    CHECK(strstr(gp_last_error(), "the bus said no") != NULL && strstr(gp_last_error(), "out of memory") == NULL);
    if (!strstr(gp_last_error(), "the bus said no")) fprintf(stderr, "  first error: %s\n", gp_last_error());
    h->armed = 0;
    CHECK(state_of(c.p, c.b) == GP_BLOCK_OFFLOADED && gp_restore_tags(c.o, &T_B, 1, 0, &r) == GP_OK);
    crowd_done(&c);
}

/* A prefetch that failed (its maps were refused) leaves the memory
 * offloaded; the restore after it, with the device willing again, brings it
 * back instead of reporting the prefetch's failure. */
static void test_prefetch_failed(void)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *a = gp_alloc(p, 6 * MiB, NULL, T_A, GP_PRIO_NORMAL, NULL);
    fill(a, 6 * MiB, 12);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
    gp_host_fail(be, GP_HOST_MAP, 1, GP_ERR_BACKEND, GP_HOST_FAIL_FROM);
    CHECK(gp_prefetch_tags(o, &T_A, 1) == GP_OK);
    /* A background offload of nothing queued behind it: once it ran (a
     * reclaim waits for it), so did the prefetch, on the same thread. */
    CHECK(gp_offload_tags_background(o, &T_F, 1, &opts) == GP_OK && gp_offload_reclaim(o, 0, 0) == 0);
    CHECK(state_of(p, a) == GP_BLOCK_OFFLOADED);
    gp_host_fail_none(be);
    gp_status st = gp_restore_tags(o, &T_A, 1, 0, &r);
    if (st != GP_OK) fprintf(stderr, "  after a failed prefetch: %s\n", gp_last_error());
    CHECK(st == GP_OK && state_of(p, a) == GP_BLOCK_USED && same(a, 6 * MiB, 12));
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    gp_free(p, a);
    offloader_done(o, p, be);
}

/* A block freed while offloaded: its bytes are nobody's, so a corrupt host
 * copy of them does not keep the rest of the offload away for ever. */
static void test_freed_corrupt(void)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *gone = gp_alloc(p, 6 * MiB, NULL, T_A, GP_PRIO_NORMAL, NULL);
    void *kept = gp_alloc(p, 3 * MiB, NULL, T_A, GP_PRIO_NORMAL, NULL);
    fill(gone, 6 * MiB, 13);
    fill(kept, 3 * MiB, 14);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
    CHECK(gp_free(p, gone) == GP_OK);
    CHECK(gp_offload_corrupt_for_test(o, T_A) == GP_OK); /* (its first piece: the freed block's) */
    gp_status st = gp_restore_tags(o, &T_A, 1, 0, &r);
    if (st != GP_OK) fprintf(stderr, "  restore with a freed block's copy corrupt: %s\n", gp_last_error());
    CHECK(st == GP_OK && state_of(p, kept) == GP_BLOCK_USED && same(kept, 3 * MiB, 14));
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    gp_free(p, kept);
    offloader_done(o, p, be);
}

/* ----------------------------------------------------- retag, codec */

static void test_retag_while_offloaded(void)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *x = gp_alloc(p, 6 * MiB, NULL, T_A, GP_PRIO_NORMAL, NULL);
    fill(x, 6 * MiB, 9);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
    CHECK(gp_pool_retag(p, &x, 1, T_B, GP_PRIO_NORMAL, NULL) == GP_OK);
    CHECK(gp_offload_is_offloaded(o, T_B) && !gp_offload_is_offloaded(o, T_A));
    CHECK(gp_restore_tags(o, &T_B, 1, 0, &r) == GP_OK && r.bytes == 6 * MiB);
    CHECK(state_of(p, x) == GP_BLOCK_USED && !gp_offload_is_offloaded(o, T_B));
    if (state_of(p, x) != GP_BLOCK_USED) return; /* (the rest would touch offloaded memory) */
    CHECK(same(x, 6 * MiB, 9));
    /* And by prefetch. */
    CHECK(gp_offload_tags(o, &T_B, 1, &opts, &r) == GP_OK);
    CHECK(gp_pool_retag(p, &x, 1, T_F, GP_PRIO_NORMAL, NULL) == GP_OK);
    CHECK(gp_prefetch_tags(o, &T_F, 1) == GP_OK && gp_restore_tags(o, &T_F, 1, 0, &r) == GP_OK);
    CHECK(state_of(p, x) == GP_BLOCK_USED && same(x, 6 * MiB, 9));
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    gp_free(p, x);
    offloader_done(o, p, be);
}

static void test_codec_refused_alike(void)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *x = gp_alloc(p, 2 * MiB, NULL, T_A, GP_PRIO_NORMAL, NULL);
    gp_offload_result r;
    gp_offload_opts kept = {.keep = 1, .codec = GP_CODEC_ANS, .elem_size = 2};
    gp_offload_opts dropped = {.keep = 0, .codec = GP_CODEC_ANS, .elem_size = 2};
    gp_status s1 = gp_offload_tags(o, &T_A, 1, &kept, &r);
    char m1[512];
    snprintf(m1, sizeof m1, "%s", gp_last_error());
    gp_status s0 = gp_offload_tags(o, &T_A, 1, &dropped, &r);
    CHECK(s1 != GP_OK && s0 == s1 && strcmp(m1, gp_last_error()) == 0 && state_of(p, x) == GP_BLOCK_USED);
    gp_free(p, x);
    offloader_done(o, p, be);
}

/* ------------------------------------------------ status and words agree */

/* The status text of the first injected failure the message names ("host
 * copy: injected failure (out of memory)"), or "" when it names none. */
static const char *named_status(const char *msg, char *buf, size_t n)
{
    const char *k = strstr(msg, "injected failure (");
    buf[0] = '\0';
    if (!k) return buf;
    k += strlen("injected failure (");
    size_t len = strcspn(k, ")");
    snprintf(buf, n, "%.*s", (int)(len < n ? len : n - 1), k);
    return buf;
}

/* One offload (restore_side 0) or restore (1) of T_A with `fn` failing at
 * its nth call (status fst) while `bg` fails from its first call on (status
 * bgst: unmaps that an offload's jobs report after its own failure, event
 * records whose failure a restore recovers from with a device wait, which
 * clears the message).  A failure must carry its own words: the message
 * names the injected failure whose status is returned.  Returns the calls
 * `fn` got; *bad counts mismatches. */
static uint64_t words_one(int codec, int restore_side, gp_host_fn fn, uint64_t nth, gp_host_fn bg, unsigned *bad)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *b[WB];
    unsigned char *want[WB];
    for (int i = 0; i < WB; i++) {
        b[i] = gp_alloc(p, walk_sizes[i], NULL, T_A, GP_PRIO_NORMAL, NULL);
        want[i] = malloc(walk_sizes[i]);
        data_rng = 91 + (uint64_t)i;
        data_fill(want[i], walk_sizes[i], codec == GP_CODEC_RAW ? DATA_RANDOM : DATA_BF16);
        memcpy(b[i], want[i], walk_sizes[i]);
    }
    gp_offload_opts opts = {.keep = 1, .codec = codec, .elem_size = 2};
    gp_offload_result r;
    if (restore_side) CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
    gp_status fst = restore_side ? GP_ERR_BACKEND : GP_ERR_OOM, bgst = restore_side ? GP_ERR_OOM : GP_ERR_BACKEND;
    gp_host_counters c0, c1;
    gp_host_counters_get(be, &c0);
    uint64_t misuse = gp_host_misuse(NULL, 0);
    if (nth) {
        gp_host_fail(be, fn, nth, fst, GP_HOST_FAIL_ONCE);
        gp_host_fail(be, bg, 1, bgst, GP_HOST_FAIL_FROM);
    }
    gp_status st = restore_side ? gp_restore_tags(o, &T_A, 1, 0, &r) : gp_offload_tags(o, &T_A, 1, &opts, &r);
    char msg[2048], named[64];
    snprintf(msg, sizeof msg, "%s", gp_last_error());
    gp_host_counters_get(be, &c1);
    gp_host_fail_none(be);
    if (st != GP_OK && strcmp(named_status(msg, named, sizeof named), gp_status_str(st)) != 0) {
        (*bad)++;
        fprintf(stderr, "  %s, %s call %llu failing (%s, %s failing from its first): returned %s with \"%s\"\n",
                restore_side ? "restore" : "offload", gp_host_fn_name(fn), (unsigned long long)nth,
                codec == GP_CODEC_RAW ? "raw" : "compressed", gp_host_fn_name(bg), gp_status_str(st), msg);
    }
    /* And the bytes: all of them back (a loss only with consent, and
     * counted). */
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    gp_offload_result rr;
    gp_status rs = gp_restore_tags(o, &T_A, 1, 0, &rr);
    uint64_t lost = 0;
    if (rs != GP_OK && strstr(gp_last_error(), "were lost")) {
        rs = gp_restore_tags(o, &T_A, 1, 1, &rr);
        lost = rr.lost;
    }
    CHECK(rs == GP_OK && all_offloaded(p, b, WB) == 0);
    uint64_t diff = 0;
    for (int i = 0; i < WB; i++) diff += differing(b[i], want[i], walk_sizes[i]);
    CHECK(diff <= lost);
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    for (int i = 0; i < WB; i++) {
        CHECK(gp_free(p, b[i]) == GP_OK);
        free(want[i]);
    }
    offloader_done(o, p, be);
    char why[256] = "";
    CHECK(gp_host_misuse(why, sizeof why) == misuse);
    if (gp_host_misuse(NULL, 0) != misuse)
        fprintf(stderr, "  %s, %s call %llu failing (%s failing from its first)%s: misuse: %s\n",
                restore_side ? "restore" : "offload", gp_host_fn_name(fn), (unsigned long long)nth,
                gp_host_fn_name(bg), deferred_streams ? ", deferred" : "", why);
    return c1.calls[fn] - c0.calls[fn];
}

static void test_status_and_words(void)
{
    static const struct {
        int restore_side;
        gp_host_fn fn, bg;
    } cases[] = {
        {0, GP_HOST_COPY, GP_HOST_UNMAP},     {0, GP_HOST_CHECKSUM, GP_HOST_UNMAP},
        {1, GP_HOST_COPY, GP_HOST_EVENT_RECORD}, {1, GP_HOST_CHECKSUM, GP_HOST_EVENT_RECORD},
        {1, GP_HOST_MAP, GP_HOST_EVENT_RECORD},
    };
    static const int codecs[] = {GP_CODEC_RAW,
#ifdef GP_HAVE_ZSTD
                                 GP_CODEC_AUTO,
#endif
    };
    /* (Deferred the second time, as the fault walk.) */
    for (deferred_streams = 0; deferred_streams < 2; deferred_streams++) {
        unsigned points = 0, bad = 0;
        for (size_t k = 0; k < sizeof codecs / sizeof codecs[0]; k++)
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                uint64_t calls = words_one(codecs[k], cases[i].restore_side, cases[i].fn, 0, cases[i].bg, &bad);
                for (uint64_t nth = 1; nth <= calls; nth++, points++)
                    words_one(codecs[k], cases[i].restore_side, cases[i].fn, nth, cases[i].bg, &bad);
            }
        printf("status and words%s: %u points, %u with another failure's words\n",
               deferred_streams ? " (deferred streams)" : "", points, bad);
        CHECK(points > 20 && bad == 0);
    }
    deferred_streams = 0;
}

/* ------------------------------------------------------ lost, prefetched */

/* The offload of test_lost_bytes_come_back_only_with_consent (test_offload.py):
 * the second block's copy out fails and the undo cannot map back. */
static void test_lost_then_prefetched(void)
{
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o = offloader_with(64 * MiB, &p, &be);
    void *b[3];
    for (int i = 0; i < 3; i++) {
        b[i] = gp_alloc(p, 4 * MiB, NULL, T_A, GP_PRIO_NORMAL, NULL);
        fill(b[i], 4 * MiB, 10 + (unsigned)i);
    }
    gp_host_fail(be, GP_HOST_COPY, 2, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    gp_host_fail(be, GP_HOST_MAP, 1, GP_ERR_BACKEND, GP_HOST_FAIL_FROM);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_ERR_BACKEND);
    gp_host_fail_none(be);
    uint64_t lost = said_lost();
    CHECK(lost > 0 && r.lost == lost && all_offloaded(p, b, 3) == 3);
    /* A prefetch cannot accept the loss: it leaves the record alone, and
     * the restore that accepts it brings it back (its refusal, reported by
     * the next restore, failed this one). */
    CHECK(gp_prefetch_tags(o, &T_A, 1) == GP_OK);
    gp_offload_result rr;
    gp_status st = gp_restore_tags(o, &T_A, 1, 1, &rr);
    if (st != GP_OK) fprintf(stderr, "  accepting restore after a prefetch: %s\n", gp_last_error());
    CHECK(st == GP_OK && rr.lost == lost && all_offloaded(p, b, 3) == 0);
    if (st != GP_OK) CHECK(gp_restore_tags(o, &T_A, 1, 1, &rr) == GP_OK); /* (the refusal was reported once) */
    CHECK(same(b[0], 4 * MiB, 10)); /* (its copy ran: whole) */
    /* (A record that lost nothing is prefetched as before.) */
    CHECK(gp_offload_tags(o, &T_A, 1, &opts, &r) == GP_OK);
    CHECK(gp_prefetch_tags(o, &T_A, 1) == GP_OK && gp_restore_tags(o, &T_A, 1, 0, &rr) == GP_OK);
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    for (int i = 0; i < 3; i++) gp_free(p, b[i]);
    offloader_done(o, p, be);
}

/* Each test alone when named (a crash in one then hides no other). */
int main(int argc, char **argv)
{
    CHECK(gp_tag_intern("audit_a", &T_A) == GP_OK);
    CHECK(gp_tag_intern("audit_b", &T_B) == GP_OK);
    CHECK(gp_tag_intern("audit_filler", &T_F) == GP_OK);
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"codec", test_codec_refused_alike}, {"retag", test_retag_while_offloaded},
        {"giveback", test_failed_giveback},   {"together", test_together_or_fail},
        {"nested", test_nested_offload},      {"room", test_room_made},
        {"first_error", test_first_error},    {"prefetch", test_prefetch_during_restore},
        {"refused_maps", test_prefetch_failed}, {"freed_corrupt", test_freed_corrupt}, {"walk", test_fault_walk},
        {"pairs", test_fault_pairs},           {"words", test_status_and_words},
        {"swaps", test_swap_walk},
        {"lost_prefetched", test_lost_then_prefetched}, {"equal", test_restore_displaces_an_equal},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (argc < 2 || strstr(argv[1], tests[i].name)) tests[i].fn();
    return check_done();
}
