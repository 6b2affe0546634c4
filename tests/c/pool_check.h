/*
 * pool_check.h -- helpers shared by the pool tests: a host pool with small
 * chunks, and the structural invariants of a pool checked by walking it.
 */
#ifndef GP_POOL_CHECK_H
#define GP_POOL_CHECK_H

#include <stdint.h>
#include <stdlib.h>

#include "backend.h"
#include "check.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024ull)

static inline gp_pool *make_pool(uint64_t capacity, uint64_t chunk, gp_mode mode,
                                 gp_backend **be_out)
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
    gp_backend *be;
    if (gp_backend_host_create(capacity, &be) != GP_OK) {
        fprintf(stderr, "host backend: %s\n", gp_last_error());
        exit(2);
    }
    gp_pool *p;
    if (gp_pool_create(be, &cfg, &p) != GP_OK) {
        fprintf(stderr, "pool: %s\n", gp_last_error());
        exit(2);
    }
    if (be_out) *be_out = be;
    return p;
}

typedef struct walk_state {
    uintptr_t end[GP_ARENA_COUNT]; /* where the previous block of the arena ended */
    int prev_state[GP_ARENA_COUNT];
    gp_stream prev_stream[GP_ARENA_COUNT];
    uint64_t prev_gpool[GP_ARENA_COUNT]; /* graph pool key + 1, 0: none */
    int prev_life[GP_ARENA_COUNT];
    uint64_t used, free_mapped, pending, n_used;
    uint64_t chunk;
    int errors;
} walk_state;

static int walk_fn(void *arg, const gp_block_info *b)
{
    walk_state *w = arg;
    int k = b->arena;
    if (w->end[k] && b->addr != w->end[k]) w->errors++;              /* gap or overlap */
    if (b->addr % 512 || b->size % 512 || b->size == 0) w->errors++; /* alignment */
    if (b->state == GP_BLOCK_FREE_UNMAPPED && (b->addr % w->chunk || b->size % w->chunk))
        w->errors++; /* unmapped runs sit on chunk boundaries */
    /* Maximality: two neighbours that could merge must have merged. */
    if (w->end[k] && b->state != GP_BLOCK_USED && b->state == w->prev_state[k] &&
        b->lifetime == w->prev_life[k] && (b->state == GP_BLOCK_FREE_UNMAPPED ||
         (b->stream == w->prev_stream[k] &&
          (b->in_graph_pool ? b->graph_pool + 1 : 0) == w->prev_gpool[k])))
        w->errors++;
    if (b->state == GP_BLOCK_USED) {
        w->used += b->size;
        w->n_used++;
        if (b->requested == 0 || b->requested > b->size) w->errors++;
    } else if (b->state == GP_BLOCK_FREE) {
        w->free_mapped += b->size;
    } else if (b->state == GP_BLOCK_PENDING) {
        w->pending += b->size;
    }
    w->end[k] = b->addr + b->size;
    w->prev_state[k] = b->state;
    w->prev_stream[k] = b->stream;
    w->prev_gpool[k] = b->in_graph_pool ? b->graph_pool + 1 : 0;
    w->prev_life[k] = b->lifetime;
    return 0;
}

/* Walk the pool and check every invariant that pool.c states; returns the
 * number of violations (0 when consistent). */
static inline int pool_consistent(gp_pool *p, gp_backend *be)
{
    gp_stats s;
    gp_pool_stats(p, &s, 1);
    walk_state w = {.chunk = s.chunk};
    gp_pool_walk(p, walk_fn, &w);
    int errors = w.errors;
    if (w.used != s.allocated) errors++;
    if (w.used + w.free_mapped + w.pending != s.reserved) errors++;
    if (w.pending != s.pending) errors++;
    if (w.n_used != s.active_blocks) errors++;
    if (s.allocated > s.reserved || s.requested > s.allocated) errors++;
    if (be) {
        gp_host_counters c;
        gp_host_counters_get(be, &c);
        if (c.mapped != s.reserved) errors++;
    }
    if (errors) fprintf(stderr, "pool inconsistent: %d violations (walk %d)\n", errors, w.errors);
    return errors;
}

#endif
