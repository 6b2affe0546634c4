/*
 * test_model.c -- a randomized model test: millions of random allocs and
 * frees of random sizes, streams and tags, with random trims and injected
 * map failures, checked against a plain reference of what is live.
 *
 * After every operation: the pointer is aligned, the counters match the
 * reference (blocks, requested bytes, per tag), reserved equals what the
 * host backend has mapped.  Every block carries a stamp at both ends that
 * is checked at free, so any overlap of two live blocks is caught.  Every
 * 20000 operations the whole pool is walked (pool_consistent).
 *
 * Usage: test_model [ops] [seed]
 */
#include <string.h>

#include "pool_check.h"
#include "rng.h"
#include "stamps.h"

typedef struct live {
    char *ptr;
    size_t size;
    uint64_t stamp;
    gp_tag tag;
} live;

/* Log-uniform 1 B .. 4 MiB, with a bias to the small arena. */
static size_t rnd_size(void)
{
    unsigned bits = (unsigned)(rnd() % 23);
    size_t base = (size_t)1 << bits;
    return base + (size_t)(rnd() % base);
}

int main(int argc, char **argv)
{
    long ops = argc > 1 ? atol(argv[1]) : 2000000;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 10) : 0x9E3779B97F4A7C15ull;
    printf("model test: %ld ops, seed %llu\n", ops, (unsigned long long)rng_state);

    gp_backend *be;
    gp_pool *p = make_pool(96 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    enum { MAXLIVE = 512, NTAGS = 4 };
    gp_tag tags[NTAGS];
    const char *names[NTAGS] = {"weights", "activations", "kv_cache", "untagged"};
    for (int i = 0; i < NTAGS; i++) gp_tag_intern(names[i], &tags[i]);
    gp_stream streams[3] = {NULL, (gp_stream)0x10, (gp_stream)0x20};
    live L[MAXLIVE];
    int n = 0;
    uint64_t req_sum = 0, tag_req[NTAGS] = {0};
    long n_oom = 0, n_inject = 0, n_trim = 0, bad = 0;

    for (long op = 0; op < ops && bad < 10; op++) {
        uint64_t r = rnd() % 1000;
        if (r < 2) {
            gp_pool_trim(p, (rnd() % 8) * MiB);
            n_trim++;
        } else if (r < 4) {
            gp_host_fail(be, GP_HOST_MAP, 1 + rnd() % 4, rnd() & 1 ? GP_ERR_OOM : GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
            n_inject++;
        } else if (n > 0 && (n == MAXLIVE || r < 480)) {
            int i = (int)(rnd() % (uint64_t)n);
            if (!stamp_ok(L[i].ptr, L[i].size, L[i].stamp)) {
                fprintf(stderr, "op %ld: block %p of %zu bytes was overwritten\n", op, (void *)L[i].ptr, L[i].size);
                bad++;
            }
            if (gp_free(p, L[i].ptr) != GP_OK) {
                fprintf(stderr, "op %ld: free failed: %s\n", op, gp_last_error());
                bad++;
            }
            req_sum -= L[i].size;
            tag_req[L[i].tag] -= L[i].size;
            L[i] = L[--n];
        } else {
            size_t sz = rnd_size();
            int t = (int)(rnd() % NTAGS);
            gp_status st;
            char *q = gp_alloc(p, sz, streams[rnd() % 3], tags[t], (int)(rnd() % 4), &st);
            if (!q) {
                if (st != GP_ERR_OOM && st != GP_ERR_BACKEND) {
                    fprintf(stderr, "op %ld: alloc of %zu failed with %s: %s\n", op, sz, gp_status_str(st), gp_last_error());
                    bad++;
                }
                n_oom++;
            } else {
                if ((uintptr_t)q % 512) {
                    fprintf(stderr, "op %ld: %p not aligned\n", op, (void *)q);
                    bad++;
                }
                L[n] = (live){q, sz, rnd(), (gp_tag)t};
                stamp_put(L[n].ptr, L[n].size, L[n].stamp);
                n++;
                req_sum += sz;
                tag_req[t] += sz;
            }
        }
        gp_stats s;
        gp_pool_stats(p, &s, 0);
        gp_host_counters c;
        gp_host_counters_get(be, &c);
        if (s.active_blocks != (uint64_t)n || s.requested != req_sum || c.mapped != s.reserved ||
            s.allocated < s.requested || s.reserved < s.allocated) {
            fprintf(stderr, "op %ld: accounting broken: blocks %llu/%d requested %llu/%llu mapped %llu reserved %llu\n",
                    op, (unsigned long long)s.active_blocks, n, (unsigned long long)s.requested,
                    (unsigned long long)req_sum, (unsigned long long)c.mapped, (unsigned long long)s.reserved);
            bad++;
        }
        if (op % 20000 == 0) {
            for (int t = 0; t < NTAGS; t++) {
                gp_tag_stats ts;
                gp_pool_tag_stats(p, tags[t], &ts);
                if (ts.requested != tag_req[t]) bad++;
            }
            if (pool_consistent(p, be)) bad++;
        }
    }
    gp_host_fail_none(be);
    for (int i = 0; i < n; i++) {
        CHECK(stamp_ok(L[i].ptr, L[i].size, L[i].stamp));
        CHECK(gp_free(p, L[i].ptr) == GP_OK);
    }
    CHECK(pool_consistent(p, be) == 0);
    gp_pool_empty_cache(p);
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    CHECK(s.reserved == 0 && s.allocated == 0);
    CHECK(bad == 0);
    printf("model test: %ld failed allocations (oom or injected), %ld injections, %ld trims, "
           "%llu cache hits of %llu allocs\n", n_oom, n_inject, n_trim,
           (unsigned long long)s.cache_hits, (unsigned long long)s.n_alloc);
    done(p);
    return check_done();
}
