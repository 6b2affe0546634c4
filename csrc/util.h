/*
 * util.h -- small helpers that several layers need, written once: the
 * clock, the host's memory, the byte formatter and array growth.
 */
#ifndef GP_UTIL_H
#define GP_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* The monotonic clock in nanoseconds.  CLOCK_MONOTONIC: a vDSO call (tens
 * of ns), system-wide (comparable across processes, as the tenant registry
 * needs), and the clock Python's time.monotonic_ns() reads, so that the
 * layer above can convert a trace's times to wall time. */
static inline uint64_t gp_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The same clock in seconds. */
static inline double gp_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The host's physical memory in bytes (0: unknown): what a host size given
 * as a fraction (GPUPOOL_HOST_LIMIT, GPUPOOL_HOST_RESERVE) is of. */
static inline uint64_t gp_host_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

/* `b` bytes for people: "1.50 GiB", "512 B" (what gpupool.format_bytes
 * writes too).  Returns buf. */
static inline const char *gp_fmt_bytes(uint64_t b, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, units[u]);
    return buf;
}

/* Room for one more element in an array that doubles as it fills: `v`
 * holds *cap elements of `elem` bytes, `n` of them used.  Returns `v` when
 * n < *cap; else the array grown to twice *cap (`first` when empty) with
 * *cap updated, or NULL (v and *cap untouched) when the host has no memory
 * for it -- the caller names what was growing in its error. */
static inline void *gp_array_room(void *v, size_t *cap, size_t n, size_t elem, size_t first)
{
    if (n < *cap) return v;
    size_t nc = *cap ? 2 * *cap : first;
    if (nc < *cap || nc > SIZE_MAX / elem) return NULL;
    void *nv = realloc(v, nc * elem);
    if (nv) *cap = nc;
    return nv;
}

#endif /* GP_UTIL_H */
