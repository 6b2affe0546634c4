/*
 * bench_hotpath.c -- the cost of gpupool's hot path on the host backend,
 * against glibc malloc/free on the very same trace, in the same run.
 *
 * Trace: a window of 64 live blocks; each step frees a random slot and
 * allocates a new block there (one alloc+free pair).  Sizes are log-uniform
 * in 256 B..64 MiB ("random"), or all 4 KiB ("fixed").  Each measurement is
 * the mean ns per pair over the whole trace; the figure printed is the median
 * of REPS repetitions with min..max.  After the first repetition (warm-up)
 * gpupool must make no backend call: the number is printed and checked.
 *
 * Build and run (from the repository root):
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icsrc -Icsrc/backend -Icsrc/backend/cuda -Icsrc/offload -Icsrc/offload/codec -Icsrc/pool -Icsrc/python -Icsrc/tenant \
 *      benchmarks/bench_hotpath.c \
 *      csrc/pool/pool.c csrc/pool/pool_offload.c csrc/pool/stream.c csrc/pool/stats.c csrc/pool/check.c csrc/pool/tag.c \
 *      csrc/error.c csrc/config.c csrc/backend/backend_host.c csrc/backend/host_pages.c csrc/backend/host_queue.c csrc/pool/trace.c csrc/pool/transit.c csrc/offload/checksum.c \
 *      -lpthread -lm -o /tmp/bench_hotpath && /tmp/bench_hotpath
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_host.h"

enum { WINDOW = 64, STEPS = 1000000, REPS = 7 };

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

typedef struct trace {
    uint32_t slot[STEPS];
    uint64_t size[STEPS];
} trace;

static void make_trace(trace *t, int random_sizes)
{
    for (int i = 0; i < STEPS; i++) {
        t->slot[i] = (uint32_t)(rnd() % WINDOW);
        if (random_sizes) {
            /* log-uniform over 2^8 .. 2^26 bytes */
            double e = 8.0 + 18.0 * (double)(rnd() >> 11) / 9007199254740992.0;
            t->size[i] = (uint64_t)__builtin_exp2(e);
        } else {
            t->size[i] = 4096;
        }
    }
}

static double run_gpupool(gp_pool *p, const trace *t)
{
    void *live[WINDOW] = {0};
    double t0 = now_ns();
    for (int i = 0; i < STEPS; i++) {
        uint32_t s = t->slot[i];
        if (live[s]) gp_free(p, live[s]);
        live[s] = gp_alloc(p, t->size[i], NULL, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL);
        if (!live[s]) {
            fprintf(stderr, "gpupool alloc failed: %s\n", gp_last_error());
            exit(1);
        }
    }
    double dt = now_ns() - t0;
    for (int s = 0; s < WINDOW; s++) gp_free(p, live[s]);
    return dt / STEPS;
}

static double run_malloc(const trace *t)
{
    void *live[WINDOW] = {0};
    double t0 = now_ns();
    for (int i = 0; i < STEPS; i++) {
        uint32_t s = t->slot[i];
        free(live[s]);
        live[s] = malloc(t->size[i]);
        if (!live[s]) exit(1);
    }
    double dt = now_ns() - t0;
    for (int s = 0; s < WINDOW; s++) free(live[s]);
    return dt / STEPS;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench(const char *name, int random_sizes, int *failures)
{
    static trace t;
    make_trace(&t, random_sizes);
    gp_config cfg;
    gp_config_default(&cfg);
    gp_backend *be;
    gp_pool *p;
    if (gp_backend_host_create(64ull << 30, &be) != GP_OK || gp_pool_create(be, &cfg, &p) != GP_OK) {
        fprintf(stderr, "%s\n", gp_last_error());
        exit(1);
    }
    double g[REPS], m[REPS];
    gp_stats warm, end;
    for (int r = 0; r < REPS; r++) {
        /* interleaved, so that drift of the machine hits both alike */
        g[r] = run_gpupool(p, &t);
        m[r] = run_malloc(&t);
        if (r == 0) gp_pool_stats(p, &warm, 0);
    }
    gp_pool_stats(p, &end, 0);
    uint64_t calls = (end.n_map - warm.n_map) + (end.n_unmap - warm.n_unmap);
    double g0 = g[0];
    qsort(g, REPS, sizeof g[0], cmp);
    qsort(m, REPS, sizeof m[0], cmp);
    printf("%-7s gpupool %7.1f ns/pair (%.1f..%.1f)   glibc %7.1f ns/pair (%.1f..%.1f)   ratio %.2f   "
           "backend calls after warm-up %llu (warm-up rep %.1f ns)\n",
           name, g[REPS / 2], g[0], g[REPS - 1], m[REPS / 2], m[0], m[REPS - 1], g[REPS / 2] / m[REPS / 2],
           (unsigned long long)calls, g0);
    if (calls) (*failures)++;
    gp_pool_destroy(p);
}

int main(void)
{
    int failures = 0;
    printf("hot path, host backend: %d alloc+free pairs, window %d, median of %d\n", STEPS, WINDOW, REPS);
    bench("random", 1, &failures);
    bench("fixed", 0, &failures);
    return failures ? 1 : 0;
}
