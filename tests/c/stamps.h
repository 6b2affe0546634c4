/*
 * stamps.h -- a stamp at both ends of a live block, checked before it is
 * freed, so that two live blocks that overlap, or a write by the pool into
 * a live block, show.
 */
#ifndef GP_TEST_STAMPS_H
#define GP_TEST_STAMPS_H

#include <stdint.h>
#include <string.h>

/* (the two stamps of a small block must not overlap) */
static inline size_t stamp_len(size_t size) { return size / 2 < 8 ? size / 2 : 8; }

static inline void stamp_put(char *ptr, size_t size, uint64_t stamp)
{
    memcpy(ptr, &stamp, stamp_len(size));
    memcpy(ptr + size - stamp_len(size), &stamp, stamp_len(size));
}

static inline int stamp_ok(const char *ptr, size_t size, uint64_t stamp)
{
    return memcmp(ptr, &stamp, stamp_len(size)) == 0 &&
           memcmp(ptr + size - stamp_len(size), &stamp, stamp_len(size)) == 0;
}

#endif
