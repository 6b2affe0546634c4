/*
 * util.h -- small helpers that several layers need, written once: the
 * clock and the byte formatter.
 */
#ifndef GP_UTIL_H
#define GP_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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

/* `b` bytes for people: "1.50 GiB", "512 B" (what gpupool.format_bytes
 * writes too).  Returns buf. */
/* The host's physical memory in bytes (0: unknown): what a host size given
 * as a fraction (GPUPOOL_HOST_LIMIT, GPUPOOL_HOST_RESERVE) is of. */
static inline uint64_t gp_host_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

static inline const char *gp_fmt_bytes(uint64_t b, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, units[u]);
    return buf;
}

#endif /* GP_UTIL_H */
