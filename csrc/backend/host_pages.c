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

/* Limit less usage of the group in directory `dir`, from its files
 * `limit` and `usage`: UINT64_MAX where it has no limit ("max", no file),
 * 0 where the usage cannot be read. */
static uint64_t gp_group_room(const char *dir, const char *limit, const char *usage)
{
    char path[2 * GP_CGROUP_PATH + 32], buf[64];
    snprintf(path, sizeof path, "%s/%s", dir, limit);
    uint64_t max = gp_read_small(path, buf, sizeof buf) > 0 ? gp_count_at(buf, UINT64_MAX) : UINT64_MAX;
    if (max == UINT64_MAX) return UINT64_MAX;
    snprintf(path, sizeof path, "%s/%s", dir, usage);
    uint64_t cur = gp_read_small(path, buf, sizeof buf) > 0 ? gp_count_at(buf, max) : max;
    return cur < max ? max - cur : 0;
}

/* Whether the comma-separated list [ctl, end) names controller `want`. */
static int gp_has_controller(const char *ctl, const char *end, const char *want)
{
    size_t wlen = strlen(want);
    while (ctl < end) {
        const char *comma = memchr(ctl, ',', (size_t)(end - ctl));
        const char *stop = comma ? comma : end;
        if ((size_t)(stop - ctl) == wlen && !memcmp(ctl, want, wlen)) return 1;
        ctl = stop + 1;
    }
    return 0;
}

/* The path of the group in `membership` (lines "id:controllers:path")
 * whose controllers name `want`, or, for want "", whose controllers field
 * is empty (v2's line); copied into out (n bytes).  0 where none has it. */
static int gp_group_path(const char *membership, const char *want, char *out, size_t n)
{
    for (const char *line = membership; *line;) {
        const char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        const char *ctl = memchr(line, ':', (size_t)(end - line));
        const char *path = ctl ? memchr(ctl + 1, ':', (size_t)(end - ctl - 1)) : NULL;
        if (path && (*want ? gp_has_controller(ctl + 1, path, want) : path == ctl + 1)) {
            size_t len = (size_t)(end - path - 1);
            if (len >= n) return 0;
            memcpy(out, path + 1, len);
            out[len] = '\0';
            return 1;
        }
        line = *end ? end + 1 : end;
    }
    return 0;
}

uint64_t gp_host_pages_cgroup_room(const char *root, const char *membership)
{
    /* v1's memory controller where the process has one (also on a hybrid
     * host, whose v2 hierarchy holds no memory controller), else v2. */
    char group[GP_CGROUP_PATH], dir[2 * GP_CGROUP_PATH];
    const char *limit = "memory.limit_in_bytes", *usage = "memory.usage_in_bytes", *mount = "/memory";
    if (!gp_group_path(membership, "memory", group, sizeof group)) {
        if (!gp_group_path(membership, "", group, sizeof group)) return UINT64_MAX;
        limit = "memory.max", usage = "memory.current", mount = "";
    }
    /* Every group up to the root limits the process: the least room wins.
     * A container that sees only its own group finds none of the groups
     * above it under root and reads its own at the root. */
    uint64_t room = UINT64_MAX;
    for (;;) {
        int len = snprintf(dir, sizeof dir, "%s%s%s", root, mount, strcmp(group, "/") ? group : "");
        if (len < 0 || (size_t)len >= sizeof dir) return room;
        uint64_t r = gp_group_room(dir, limit, usage);
        if (r < room) room = r;
        char *slash = strrchr(group, '/');
        if (!slash || !strcmp(group, "/")) return room;
        slash[slash == group] = '\0'; /* ("/a" goes to "/", the root) */
    }
}

/* /proc/self/cgroup, read once: which groups this process is in. */
static char gp_membership[GP_CGROUP_PATH];
static pthread_once_t gp_membership_once = PTHREAD_ONCE_INIT;

static void gp_membership_read(void)
{
    if (gp_read_small("/proc/self/cgroup", gp_membership, sizeof gp_membership) <= 0) gp_membership[0] = '\0';
}

uint64_t gp_host_pages_room(void)
{
    char buf[4096];
    const char *at;
    uint64_t avail = 0;
    if (gp_read_small("/proc/meminfo", buf, sizeof buf) > 0 && (at = strstr(buf, "MemAvailable:")))
        avail = gp_count_at(at + strlen("MemAvailable:"), 0) << 10; /* (kB) */
    pthread_once(&gp_membership_once, gp_membership_read);
    uint64_t cg = gp_host_pages_cgroup_room("/sys/fs/cgroup", gp_membership);
    return cg < avail ? cg : avail;
}
