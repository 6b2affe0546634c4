/*
 * host_pages.c -- faulting in host pages (host_pages.h).
 *
 * madvise(MADV_POPULATE_WRITE) (Linux 5.14) faults a range in with one
 * call and reports a host out of memory as ENOMEM instead of a SIGBUS or
 * the OOM killer on a touched page; older kernels answer EINVAL, and then
 * one write per page does it.  A write of 0 into fresh anonymous memory
 * changes no byte the caller could see.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "host_pages.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* (libc headers older than the kernel) */
#endif

gp_status gp_host_pages_populate(void *ptr, uint64_t size)
{
    if (!size) return GP_OK;
    if (madvise(ptr, size, MADV_POPULATE_WRITE) == 0) return GP_OK;
    if (errno != EINVAL)
        return gp_error_set(GP_ERR_NOMEM, "gpupool: populating %llu bytes of host memory at %p: %s",
                            (unsigned long long)size, ptr, strerror(errno));
    long page = sysconf(_SC_PAGESIZE);
    uint64_t step = page > 0 ? (uint64_t)page : 4096;
    for (uint64_t off = 0; off < size; off += step) ((volatile char *)ptr)[off] = 0;
    return GP_OK;
}
