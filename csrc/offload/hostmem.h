/*
 * hostmem.h -- making one pinned slab fast (pinned.c keeps the slabs).
 *
 * The backend's host_alloc (cuMemHostAlloc) pins at 1.6-2.7 GB/s: one
 * thread faults every 4 KiB page in, then the driver locks them.  A slab
 * made here is anonymous memory of our own, mapped 2 MiB-aligned and
 * advised to use huge pages (a fault per 2 MiB instead of per 4 KiB; the
 * driver locks fewer pages), populated by the backend's host_populate and
 * then registered (host_register).  Several slabs are made at once on
 * several threads (pinned.c), which is where the speed comes from: on the
 * H100 machine 16 threads with huge pages populated at 40.8 GB/s and
 * registered at 41.9, against 1.8 GB/s for the whole on one thread.  The
 * registrations take turns (the driver makes one at a time anyway).
 */
#ifndef GP_HOSTMEM_H
#define GP_HOSTMEM_H

#include "backend.h"

/* The alignment (and size unit) of a slab: a huge page on x86-64 and arm64. */
#define GP_HOSTMEM_ALIGN (2ull << 20)

/* Map `size` bytes (a multiple of GP_HOSTMEM_ALIGN) of anonymous memory,
 * aligned to it and advised to use huge pages; nothing is populated yet,
 * so this is quick.  GP_ERR_NOMEM when the address space is refused. */
gp_status gp_hostmem_map(uint64_t size, void **out);
void gp_hostmem_unmap(void *p, uint64_t size);

/* Populate and register mapped memory [p, p+size) on the calling thread,
 * the registration in turn with every other thread's of the process; on
 * failure nothing is registered (the pages stay mapped). */
gp_status gp_hostmem_pin(gp_backend *be, void *p, uint64_t size);
void gp_hostmem_unpin(gp_backend *be, void *p, uint64_t size);

#endif /* GP_HOSTMEM_H */
