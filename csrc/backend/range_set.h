/*
 * range_set.h -- the live mappings of a backend by address, for what must
 * reach every one of them later (a peer device granted access to all the
 * memory mapped so far, backend.h's grant_peer).  A hash on the start
 * address: O(1) add and remove, whatever the number of mappings (a large
 * device holds tens of thousands), and a walk over all.  Not locked: its
 * owner serialises the calls.
 */
#ifndef GP_RANGE_SET_H
#define GP_RANGE_SET_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct gp_range {
    uintptr_t addr; /* 0: an empty slot */
    uint64_t size;
} gp_range;

typedef struct gp_range_set {
    gp_range *slot;
    size_t cap, n; /* cap: 0 or a power of two */
} gp_range_set;

/* Add [addr, addr+size), addr != 0 and not in the set.  GP_ERR_NOMEM when
 * the table cannot grow (the set is then as it was). */
gp_status gp_range_set_add(gp_range_set *s, uintptr_t addr, uint64_t size);
/* Remove the range that starts at addr; 0 when there is none. */
int gp_range_set_remove(gp_range_set *s, uintptr_t addr);
/* fn(range, arg) on every range, in no order, until one returns other
 * than GP_OK: that status (GP_OK when all did).  fn must not change the
 * set. */
gp_status gp_range_set_each(const gp_range_set *s, gp_status (*fn)(const gp_range *r, void *arg), void *arg);
/* Free the table; the set is empty and usable again. */
void gp_range_set_clear(gp_range_set *s);

#endif /* GP_RANGE_SET_H */
