/*
 * offload_test.h -- what the offload tests share: patterned bytes, a host
 * pool with small chunks (a few MiB span many), the offloader's integrity
 * check, a block's state, a host backend whose maps are slow (as the
 * driver's are) and recorded in order, and two filled blocks over it.
 */
#ifndef GP_OFFLOAD_TEST_H
#define GP_OFFLOAD_TEST_H

#include <pthread.h>
#include <time.h>

#include "backend_forward.h"
#include "offload.h"
#include "pool_check.h"

static inline void fill(void *ptr, size_t n, unsigned seed)
{
    unsigned char *c = ptr;
    for (size_t i = 0; i < n; i++) c[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 9));
}

static inline int same(const void *ptr, size_t n, unsigned seed)
{
    const unsigned char *c = ptr;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(seed * 131u + i * 7u + (i >> 9))) return 0;
    return 1;
}

/* The tests' pool over backend `be`: small chunks, so that a few MiB span many. */
static inline gp_pool *pool_over(gp_backend *be)
{
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = 256 * KiB;
    cfg.small_size = 64 * KiB;
    cfg.large_chunk = 1 * MiB;
    cfg.cache_slack = -1;
    gp_pool *p;
    CHECK(gp_pool_create(be, &cfg, &p) == GP_OK);
    return p;
}

/* Whether pool_with's backends defer their streams' work (backend_host.h):
 * a suite run again with it on finds reads not ordered after the work that
 * writes what they read. */
static int deferred_streams;

static inline gp_pool *pool_with(uint64_t capacity, gp_backend **be)
{
    CHECK(gp_backend_host_create(capacity, be) == GP_OK);
    if (deferred_streams) gp_host_set_deferred(*be, 1);
    return pool_over(*be);
}

/* The offloader's integrity check, its first finding printed. */
static inline int offload_ok(gp_offloader *o)
{
    char msg[512];
    size_t v = gp_offload_check(o, msg, sizeof msg);
    if (v) fprintf(stderr, "gp_offload_check: %zu problems, the first: %s\n", v, msg);
    return v == 0;
}

/* A host backend of `capacity` bytes, the tests' pool over it (in *p, *be)
 * and an offloader with two lanes. */
static inline gp_offloader *offloader_with(uint64_t capacity, gp_pool **p, gp_backend **be)
{
    *p = pool_with(capacity, be);
    gp_offloader *o;
    CHECK(gp_offloader_create(*p, 0, 2, NULL, &o) == GP_OK);
    return o;
}

/* The end of a test of an offloader: it and its pool consistent (the
 * backend maps what the pool reserves), then both go. */
static inline void offloader_done(gp_offloader *o, gp_pool *p, gp_backend *be)
{
    CHECK(offload_ok(o) && pool_consistent(p, be) == 0);
    gp_offloader_destroy(o);
    done(p);
}

static inline int state_of(gp_pool *p, void *ptr)
{
    gp_block_info b;
    return gp_pool_lookup(p, ptr, &b) == GP_OK ? b.state : -1;
}

/* A host backend whose maps take a while, as the driver's do, and are
 * recorded in the order they were made. */
typedef struct slow_maps {
    gp_backend_wrap w;
    pthread_mutex_t lock;
    uintptr_t addr[256];
    unsigned n;
    long delay_us;
} slow_maps;

static inline gp_status slow_map(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle)
{
    slow_maps *s = (slow_maps *)(void *)be;
    nanosleep(&(struct timespec){0, s->delay_us * 1000}, NULL);
    pthread_mutex_lock(&s->lock);
    if (s->n < sizeof s->addr / sizeof s->addr[0]) s->addr[s->n++] = addr;
    pthread_mutex_unlock(&s->lock);
    return GP_INNER(be)->map(GP_INNER(be), addr, size, handle);
}

/* A pool over a slow-map wrapper of a host backend of `capacity` bytes. */
static inline gp_pool *slow_pool(uint64_t capacity, long delay_us, slow_maps **out, gp_backend **inner)
{
    CHECK(gp_backend_host_create(capacity, inner) == GP_OK);
    slow_maps *s = calloc(1, sizeof *s);
    CHECK(s != NULL);
    gp_backend_forward(&s->w, *inner);
    pthread_mutex_init(&s->lock, NULL);
    s->w.be.map = slow_map;
    s->delay_us = delay_us;
    *out = s;
    return pool_over(&s->w.be);
}

/* Two filled blocks over a slow pool with an offloader of two threads:
 * `a` of 8 MiB under tag ta (filled with seed) and `b` of b_size under tb
 * (seed + 1); the tests of restores and prefetches racing each other. */
typedef struct slow_two {
    gp_backend *inner;
    slow_maps *s;
    gp_pool *p;
    gp_offloader *o;
    void *a, *b;
} slow_two;

static inline void slow_two_make(slow_two *x, uint64_t capacity, long delay_us, gp_tag ta, gp_tag tb,
                                 uint64_t b_size, unsigned seed)
{
    x->p = slow_pool(capacity, delay_us, &x->s, &x->inner);
    CHECK(gp_offloader_create(x->p, 0, 2, NULL, &x->o) == GP_OK);
    x->a = gp_alloc(x->p, 8 * MiB, NULL, ta, GP_PRIO_NORMAL, NULL);
    x->b = gp_alloc(x->p, b_size, NULL, tb, GP_PRIO_NORMAL, NULL);
    fill(x->a, 8 * MiB, seed);
    fill(x->b, b_size, seed + 1);
}

/* Its end once the test has freed its blocks: the offloader, the pool. */
static inline void slow_two_done(slow_two *x)
{
    CHECK(pool_consistent(x->p, x->inner) == 0 && offload_ok(x->o));
    gp_offloader_destroy(x->o);
    pthread_mutex_destroy(&x->s->lock);
    done(x->p);
}

#endif
