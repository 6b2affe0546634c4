/*
 * checksum.c -- the host side of the offload checksum (checksum.h): what
 * the host backend computes for its "device" memory, and the reference the
 * GPU kernel must agree with.
 */
#include <string.h>

#include "checksum.h"

uint64_t gp_checksum_words(const void *p, size_t n, uint64_t seed)
{
    const unsigned char *c = p;
    uint64_t acc = 0;
    for (size_t i = 0; i < n / 8; i++) {
        uint64_t w;
        memcpy(&w, c + 8 * i, 8);
        acc += w * (((i ^ seed) << 1) | 1u);
    }
    return acc;
}
