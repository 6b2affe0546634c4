/*
 * checksum.c -- the host side of the offload checksum (checksum.h): what
 * the host backend computes for its "device" memory, the reference the GPU
 * kernel must agree with, and a hash for tests of stored bytes.
 */
#include <string.h>

#include "checksum.h"

uint64_t gp_checksum(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *c = data;
    uint64_t acc = 0, w;
    size_t i = 0;
    for (; i < n / 8; i++) {
        memcpy(&w, c + 8 * i, 8);
        acc += w * (((i ^ seed) << 1) | 1u);
    }
    if (n % 8) { /* (the device's pieces are whole words: no tail there) */
        w = 0;
        memcpy(&w, c + 8 * i, n % 8);
        acc += w * (((i ^ seed) << 1) | 1u);
    }
    return acc;
}
