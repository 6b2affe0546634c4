/*
 * host_pages.h -- faulting in the pages of host memory ahead of pinning it,
 * the part of backend.h's host_populate that every backend shares.
 */
#ifndef GP_HOST_PAGES_H
#define GP_HOST_PAGES_H

#include <stdint.h>

#include "error.h"

/* Fault in [ptr, ptr+size) (page-aligned, anonymous, writable) on the
 * calling thread.  GP_ERR_NOMEM, naming the range and the host's reason,
 * when the host has no memory for it.  The same as
 * gp_host_pages_populate_in(ptr, size, gp_host_pages_room()). */
gp_status gp_host_pages_populate(void *ptr, uint64_t size);

/* Bytes the host can still give this process: MemAvailable, within the
 * room its memory cgroups leave it (gp_host_pages_cgroup_room of
 * /sys/fs/cgroup and /proc/self/cgroup).  0 where neither can be read. */
uint64_t gp_host_pages_room(void);

/* The room the memory cgroups of a process leave it, read under `root`
 * (where the cgroup filesystems are mounted) for a process whose
 * /proc/<pid>/cgroup reads `membership`: the least, over its group and
 * each group above it, of the limit less the usage.  cgroup v1's memory
 * controller where the process has one (memory.limit_in_bytes and
 * memory.usage_in_bytes under root/memory), else v2 (memory.max and
 * memory.current under root).  A group above root's view (a container
 * that sees only its own group) is not there to read and counts as
 * unlimited, and the container's own is read at root.  0 for a group whose
 * usage cannot be read; UINT64_MAX where no limit is set. */
uint64_t gp_host_pages_cgroup_room(const char *root, const char *membership);

/* The longest /proc/self/cgroup read, and the longest group path. */
#define GP_CGROUP_PATH 4096

/* Fault [ptr, ptr+size) in, knowing the host has `room` bytes left.  With
 * room to spare (size plus GP_HOST_PAGES_MARGIN) the pages are touched,
 * one write each: the faults then take only their own mapping's lock and
 * run beside other threads' cuMemHostRegister (4-5x the speed on 16
 * threads).  Short of it, madvise(MADV_POPULATE_WRITE), which holds the
 * process's mmap lock and is slow, but reports a host out of memory as
 * ENOMEM where a touched page would call the OOM killer. */
gp_status gp_host_pages_populate_in(void *ptr, uint64_t size, uint64_t room);

/* The room a touched population leaves the host: the other threads
 * populating at once (16 x 32 MiB slabs) and the rest of the process. */
#define GP_HOST_PAGES_MARGIN (1ull << 30)

#endif /* GP_HOST_PAGES_H */
