/*
 * range_set.c -- the live mappings by start address (range_set.h): open
 * addressing with linear probing, at most half full, and deletion by
 * shifting the probe chain back, so that no tombstones accumulate over a
 * long run of maps and unmaps.
 */
#include <stdlib.h>

#include "range_set.h"

/* Fibonacci hashing of the address without its page offset (mappings start
 * on a granularity of 2 MiB or 4 KiB pages: the low bits are zero). */
static size_t gp_range_home(const gp_range_set *s, uintptr_t addr)
{
    return (size_t)(((uint64_t)(addr >> 12) * 0x9E3779B97F4A7C15ull) >> 32) & (s->cap - 1);
}

static void gp_range_put(gp_range_set *s, gp_range r)
{
    size_t i = gp_range_home(s, r.addr);
    while (s->slot[i].addr) i = (i + 1) & (s->cap - 1);
    s->slot[i] = r;
}

gp_status gp_range_set_add(gp_range_set *s, uintptr_t addr, uint64_t size)
{
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        gp_range *slot = calloc(cap, sizeof *slot);
        if (!slot) return gp_error_set(GP_ERR_NOMEM, "out of host memory for the table of %zu mappings", s->n + 1);
        gp_range_set grown = {slot, cap, s->n};
        for (size_t i = 0; i < s->cap; i++)
            if (s->slot[i].addr) gp_range_put(&grown, s->slot[i]);
        free(s->slot);
        *s = grown;
    }
    gp_range_put(s, (gp_range){addr, size});
    s->n++;
    return GP_OK;
}

int gp_range_set_remove(gp_range_set *s, uintptr_t addr)
{
    if (!s->n) return 0;
    size_t mask = s->cap - 1, i = gp_range_home(s, addr);
    while (s->slot[i].addr != addr) {
        if (!s->slot[i].addr) return 0;
        i = (i + 1) & mask;
    }
    /* Move back each later entry of the chain whose home lies at or before
     * the hole (cyclically), so that every probe still finds it. */
    for (size_t j = (i + 1) & mask; s->slot[j].addr; j = (j + 1) & mask) {
        size_t home = gp_range_home(s, s->slot[j].addr);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            s->slot[i] = s->slot[j];
            i = j;
        }
    }
    s->slot[i] = (gp_range){0, 0};
    s->n--;
    return 1;
}

gp_status gp_range_set_each(const gp_range_set *s, gp_status (*fn)(const gp_range *r, void *arg), void *arg)
{
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->slot[i].addr) continue;
        gp_status st = fn(&s->slot[i], arg);
        if (st != GP_OK) return st;
    }
    return GP_OK;
}

void gp_range_set_clear(gp_range_set *s)
{
    free(s->slot);
    *s = (gp_range_set){0};
}
