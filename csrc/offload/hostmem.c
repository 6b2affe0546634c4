/*
 * hostmem.c -- one pinned slab, made fast (hostmem.h).
 */
#include <errno.h>
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

gp_status gp_hostmem_pin(gp_backend *be, void *p, uint64_t size)
{
    /* Populated first: registering unpopulated memory makes the driver
     * fault it in on this one thread, page by page. */
    gp_status st = be->host_populate(be, p, size);
    return st == GP_OK ? be->host_register(be, p, size) : st;
}

void gp_hostmem_unpin(gp_backend *be, void *p, uint64_t size)
{
    be->host_unregister(be, p, size);
}
