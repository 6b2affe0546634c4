/*
 * test_stress.c -- 8 threads allocate, stamp, check and free at random on one
 * pool while a ninth trims, reads statistics and fails allocations, and a
 * tenth reads their OOM reports.  Built under ASan/UBSan and
 * once under ThreadSanitizer by the test suite: any race on the pool's state
 * or any overlap of two live blocks fails it.
 *
 * Usage: test_stress [ops_per_thread]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "pool_check.h"

enum { THREADS = 8, LIVE = 32 };

static gp_pool *pool;
static long ops_per_thread = 200000;
static atomic_long corrupt, failed, done_threads;

typedef struct slot {
    unsigned char *ptr;
    size_t size;
    unsigned char mark;
} slot;

static void *worker(void *arg)
{
    uint64_t x = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
    slot s[LIVE] = {{0}};
    gp_stream stream = (gp_stream)(uintptr_t)(0x100 * ((uintptr_t)arg % 3));
    gp_tag tag;
    gp_tag_intern((uintptr_t)arg % 2 ? "odd" : "even", &tag);
    for (long i = 0; i < ops_per_thread; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        slot *sl = &s[x % LIVE];
        if (sl->ptr) {
            /* The whole first and last 64 bytes still hold our mark. */
            size_t n = sl->size < 64 ? sl->size : 64;
            for (size_t k = 0; k < n; k++)
                if (sl->ptr[k] != sl->mark || sl->ptr[sl->size - 1 - k] != sl->mark) {
                    atomic_fetch_add(&corrupt, 1);
                    break;
                }
            if (gp_free(pool, sl->ptr) != GP_OK) atomic_fetch_add(&failed, 1);
            sl->ptr = NULL;
        } else {
            size_t size = (size_t)1 << ((x >> 8) % 21);
            size += (x >> 32) % size;
            sl->ptr = gp_alloc(pool, size, stream, tag, GP_PRIO_NORMAL, NULL);
            if (!sl->ptr) continue; /* OOM under contention is allowed */
            sl->size = size;
            sl->mark = (unsigned char)(x >> 40);
            size_t n = size < 64 ? size : 64;
            memset(sl->ptr, sl->mark, n);
            memset(sl->ptr + size - n, sl->mark, n);
        }
    }
    for (int i = 0; i < LIVE; i++)
        if (s[i].ptr && gp_free(pool, s[i].ptr) != GP_OK) atomic_fetch_add(&failed, 1);
    atomic_fetch_add(&done_threads, 1);
    return NULL;
}

static void *trimmer(void *arg)
{
    (void)arg;
    while (atomic_load(&done_threads) < THREADS) {
        gp_stats st;
        gp_pool_stats(pool, &st, 1);
        if (st.allocated > st.reserved) atomic_fetch_add(&corrupt, 1);
        gp_pool_trim(pool, 4 * MiB);
        if (gp_alloc(pool, 1024 * MiB, NULL, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL)) atomic_fetch_add(&corrupt, 1);
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Reads the last OOM report while the trimmer's failures write it: the
 * copy must be whole (the pool copies it out under its lock). */
static void *reporter(void *arg)
{
    (void)arg;
    while (atomic_load(&done_threads) < THREADS) {
        char r[GP_OOM_REPORT_MAX];
        gp_pool_last_oom(pool, r, sizeof r);
        if (r[0] && strncmp(r, "gpupool: out of memory", 22) != 0) atomic_fetch_add(&corrupt, 1);
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1) ops_per_thread = atol(argv[1]);
    gp_backend *be;
    pool = make_pool(512 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    pthread_t t[THREADS + 2];
    for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    pthread_create(&t[THREADS], NULL, trimmer, NULL);
    pthread_create(&t[THREADS + 1], NULL, reporter, NULL);
    for (int i = 0; i <= THREADS + 1; i++) pthread_join(t[i], NULL);
    CHECK(atomic_load(&corrupt) == 0);
    CHECK(atomic_load(&failed) == 0);
    gp_stats st;
    gp_pool_stats(pool, &st, 0);
    CHECK(st.active_blocks == 0 && st.allocated == 0 && st.requested == 0);
    CHECK(st.n_alloc == st.n_free);
    CHECK(pool_consistent(pool, be) == 0);
    printf("stress: %d threads x %ld ops, %llu allocs, %llu trims\n", THREADS, ops_per_thread,
           (unsigned long long)st.n_alloc, (unsigned long long)st.n_trim);
    done(pool);
    return check_done();
}
