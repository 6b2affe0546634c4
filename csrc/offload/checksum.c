/*
 * checksum.c -- the host side of the offload checksum (checksum.h): what
 * the host backend computes for its "device" memory, the reference the GPU
 * kernel must agree with, and a hash for tests of stored bytes.
 */
#include <string.h>

#include "checksum.h"

/* One word's term (checksum.h); kernels.cu computes the same. */
static uint64_t gp_checksum_term(uint64_t w, uint64_t i, uint64_t seed)
{
    uint64_t x = w ^ (i ^ seed) * 0x9e3779b97f4a7c15u;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdu;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53u;
    return x ^ x >> 33;
}

uint64_t gp_checksum(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *c = data;
    uint64_t acc = 0, w;
    size_t i = 0;
    for (; i < n / 8; i++) {
        memcpy(&w, c + 8 * i, 8);
        acc += gp_checksum_term(w, i, seed);
    }
    if (n % 8) { /* (the device's pieces are whole words: no tail there) */
        w = 0;
        memcpy(&w, c + 8 * i, n % 8);
        acc += gp_checksum_term(w, i, seed);
    }
    return acc;
}
