/*
 * pool_check.h -- helpers shared by the pool tests: a host pool with small
 * chunks, and its integrity checked (gp_pool_check) after every test.
 */
#ifndef GP_POOL_CHECK_H
#define GP_POOL_CHECK_H

#include <stdint.h>
#include <stdlib.h>

#include "backend_host.h"
#include "check.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024ull)

/* A pool on backend `be` with the tests' configuration: `chunk` (one mapping unit), 64 KiB small
 * blocks, every cached chunk kept, `mode`. */
static inline gp_pool *make_pool_on(gp_backend *be, uint64_t chunk, gp_mode mode)
{
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = chunk;
    cfg.small_size = 64 * KiB;
    /* One mapping unit, and every cached chunk kept, so that the tests'
     * counts of maps and bytes are exact; test_lean_growth sets its own. */
    cfg.large_chunk = chunk;
    cfg.cache_slack = -1;
    cfg.mode = mode;
    gp_pool *p;
    if (gp_pool_create(be, &cfg, &p) != GP_OK) {
        fprintf(stderr, "pool: %s\n", gp_last_error());
        exit(2);
    }
    return p;
}

static inline gp_pool *make_pool(uint64_t capacity, uint64_t chunk, gp_mode mode,
                                 gp_backend **be_out)
{
    gp_backend *be;
    if (gp_backend_host_create(capacity, &be) != GP_OK) {
        fprintf(stderr, "host backend: %s\n", gp_last_error());
        exit(2);
    }
    gp_pool *p = make_pool_on(be, chunk, mode);
    if (be_out) *be_out = be;
    return p;
}

/* The pool's integrity (gp_pool_check) and, on the host backend, the
 * backend's mapped bytes against reserved; returns the number of
 * violations (0 when consistent) and prints the first. */
static inline int pool_consistent(gp_pool *p, gp_backend *be)
{
    char msg[512];
    int errors = (int)gp_pool_check(p, msg, sizeof msg);
    if (errors) fprintf(stderr, "pool inconsistent: %d violations, the first: %s\n", errors, msg);
    if (be) {
        gp_stats s;
        gp_host_counters c;
        gp_pool_stats(p, &s, 0);
        gp_host_counters_get(be, &c);
        if (c.mapped != s.reserved) {
            fprintf(stderr, "pool inconsistent: the backend maps %llu bytes, reserved is %llu\n",
                    (unsigned long long)c.mapped, (unsigned long long)s.reserved);
            errors++;
        }
    }
    return errors;
}

/* The end of every test of a pool: it must be consistent, then it goes. */
#define done(p)                                                                \
    do {                                                                       \
        CHECK(pool_consistent((p), NULL) == 0);                               \
        gp_pool_destroy(p);                                                    \
    } while (0)

#endif
