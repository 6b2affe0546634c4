/*
 * host_pages.c -- faulting in host pages (host_pages.h).
 *
 * Two ways, measured on a 16-core H100 machine (Linux 6.18, THP madvise)
 * pinning 8 GiB as 32 MiB slabs on 16 threads, each populating then
 * registering its slab: touching each page, 24-27 GB/s;
 * madvise(MADV_POPULATE_WRITE), 4.9-19.5 GB/s.  The madvise holds the
 * process's mmap lock for reading over the whole range, and the driver's
 * registrations queue behind it and it behind them; a touch fault takes
 * only its own mapping's lock.  But a touched page the host cannot give
 * calls the OOM killer, where the madvise reports ENOMEM: so touch only
 * with room to spare, and madvise near the edge.  (Kernels before 5.14
 * answer the madvise with EINVAL: then touch.)  A write of 0 into fresh
 * anonymous memory changes no byte the caller could see.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "host_pages.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* (libc headers older than the kernel) */
#endif

static void gp_touch(void *ptr, uint64_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    uint64_t step = page > 0 ? (uint64_t)page : 4096;
    for (uint64_t off = 0; off < size; off += step) ((volatile char *)ptr)[off] = 0;
}

gp_status gp_host_pages_populate_in(void *ptr, uint64_t size, uint64_t room)
{
    if (!size) return GP_OK;
    if (room >= size && room - size >= GP_HOST_PAGES_MARGIN) {
        gp_touch(ptr, size);
        return GP_OK;
    }
    if (madvise(ptr, size, MADV_POPULATE_WRITE) == 0) return GP_OK;
    if (errno != EINVAL)
        return gp_error_set(GP_ERR_NOMEM, "gpupool: populating %llu bytes of host memory at %p: %s",
                            (unsigned long long)size, ptr, strerror(errno));
    gp_touch(ptr, size);
    return GP_OK;
}

gp_status gp_host_pages_populate(void *ptr, uint64_t size)
{
    return gp_host_pages_populate_in(ptr, size, size ? gp_host_pages_room() : 0);
}

/* The first n-1 bytes of file `path` in buf, NUL-terminated: its length,
 * or -1. */
static ssize_t gp_read_small(const char *path, char *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t got = read(fd, buf, n - 1);
    close(fd);
    if (got < 0) return -1;
    buf[got] = '\0';
    return got;
}

/* A decimal count at s (after blanks), or `none` where there is none
 * ("max", a missing file). */
static uint64_t gp_count_at(const char *s, uint64_t none)
{
    while (*s == ' ' || *s == '\t') s++;
    if (*s < '0' || *s > '9') return none;
    return strtoull(s, NULL, 10);
}

/* The directory of this process's cgroup (v2), found once: "" where
 * there is none to read. */
static char gp_cgroup_dir[1040]; /* ("/sys/fs/cgroup" and a line of /proc/self/cgroup) */
static pthread_once_t gp_cgroup_once = PTHREAD_ONCE_INIT;

static void gp_cgroup_find(void)
{
    char buf[1024];
    if (gp_read_small("/proc/self/cgroup", buf, sizeof buf) <= 0) return;
    char *line = strstr(buf, "0::"); /* (the v2 line; v1 controllers have their own) */
    if (line != buf && (!line || line[-1] != '\n')) return;
    line += 3;
    line[strcspn(line, "\n")] = '\0';
    snprintf(gp_cgroup_dir, sizeof gp_cgroup_dir, "/sys/fs/cgroup%s", strcmp(line, "/") ? line : "");
}

static uint64_t gp_cgroup_room(void)
{
    pthread_once(&gp_cgroup_once, gp_cgroup_find);
    if (!gp_cgroup_dir[0]) return UINT64_MAX;
    char path[1064], buf[64];
    snprintf(path, sizeof path, "%s/memory.max", gp_cgroup_dir);
    uint64_t max = gp_read_small(path, buf, sizeof buf) > 0 ? gp_count_at(buf, UINT64_MAX) : UINT64_MAX;
    if (max == UINT64_MAX) return UINT64_MAX;
    snprintf(path, sizeof path, "%s/memory.current", gp_cgroup_dir);
    uint64_t cur = gp_read_small(path, buf, sizeof buf) > 0 ? gp_count_at(buf, max) : max;
    return cur < max ? max - cur : 0;
}

uint64_t gp_host_pages_room(void)
{
    char buf[4096];
    const char *at;
    uint64_t avail = 0;
    if (gp_read_small("/proc/meminfo", buf, sizeof buf) > 0 && (at = strstr(buf, "MemAvailable:")))
        avail = gp_count_at(at + strlen("MemAvailable:"), 0) << 10; /* (kB) */
    uint64_t cg = gp_cgroup_room();
    return cg < avail ? cg : avail;
}
