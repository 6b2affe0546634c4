/*
 * hostmem.c -- one pinned slab, made fast (hostmem.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "hostmem.h"

gp_status gp_hostmem_map(uint64_t size, void **out)
{
    *out = NULL;
    if (!size || size % GP_HOSTMEM_ALIGN)
        return gp_error_set(GP_ERR_INVALID, "gpupool: a host slab of %llu bytes: a multiple of %llu is needed",
                            (unsigned long long)size, (unsigned long long)GP_HOSTMEM_ALIGN);
    /* One alignment more, then the ends cut off: mmap only promises pages,
     * and a huge page needs a 2 MiB-aligned virtual range. */
    uint64_t span = size + GP_HOSTMEM_ALIGN;
    char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return gp_error_set(GP_ERR_NOMEM, "gpupool: mapping %llu bytes of host memory for a pinned slab: %s",
                            (unsigned long long)size, strerror(errno));
    char *p = (char *)(((uintptr_t)m + GP_HOSTMEM_ALIGN - 1) & ~(uintptr_t)(GP_HOSTMEM_ALIGN - 1));
    if (p > m) munmap(m, (size_t)(p - m));
    if (m + span > p + size) munmap(p + size, (size_t)(m + span - (p + size)));
#ifdef MADV_HUGEPAGE
    /* (Refused where transparent huge pages are off: then 4 KiB pages,
     * slower, not wrong.) */
    (void)madvise(p, size, MADV_HUGEPAGE);
#endif
    *out = p;
    return GP_OK;
}

void gp_hostmem_unmap(void *p, uint64_t size)
{
    if (p) munmap(p, size);
}

/* One registration at a time, process-wide.  The driver registers one
 * range at a time anyway (on the H200 machine one thread registered
 * populated memory at 47-54 GB/s, 2 to 8 threads no faster); 16 threads
 * waiting inside it queued every other driver call of the process behind
 * them, the copies into the slabs already pinned among them (0.3-1 GiB of
 * 8 queued in the first 100 ms of a cold offload against 1.8-2.3 GiB, the
 * call 22.7 against 27.6 GB/s).  Waiting here, they leave the driver's
 * lock to those calls. */
static pthread_mutex_t gp_register_lock = PTHREAD_MUTEX_INITIALIZER;

/* fork(): held across it (a registration lasts milliseconds, and no lock
 * is taken under it but the backend's own), so that a child never finds
 * it held by a thread it does not have. */
static void gp_register_prepare(void) { pthread_mutex_lock(&gp_register_lock); }
static void gp_register_parent(void) { pthread_mutex_unlock(&gp_register_lock); }
static void gp_register_child(void) { pthread_mutex_init(&gp_register_lock, NULL); }
static void gp_register_atfork(void) { pthread_atfork(gp_register_prepare, gp_register_parent, gp_register_child); }

gp_status gp_hostmem_pin(gp_backend *be, void *p, uint64_t size)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, gp_register_atfork);
    /* Populated first: registering unpopulated memory makes the driver
     * fault it in on this one thread, page by page. */
    gp_status st = be->host_populate(be, p, size);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&gp_register_lock);
    st = be->host_register(be, p, size);
    pthread_mutex_unlock(&gp_register_lock);
    return st;
}

void gp_hostmem_unpin(gp_backend *be, void *p, uint64_t size)
{
    be->host_unregister(be, p, size);
}
