/*
 * checksum.h -- the checksum that guards offloaded memory: over the 64-bit
 * words w[i] of a range, the sum of w[i] * (((i ^ seed) << 1) | 1) modulo
 * 2^64.  Every weight is odd, so a change of any one word changes the sum,
 * and words that trade places do too.  It is computed where the bytes are
 * -- on the GPU by a kernel of our own (kernels.cu, loaded as PTX
 * by the CUDA backend), in host memory by gp_checksum -- before the
 * bytes leave the device and after they come back, so a restore checks the
 * whole round trip (host memory, both copies) at device bandwidth.
 */
#ifndef GP_CHECKSUM_H
#define GP_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* The checksum of the n bytes at `data` (a last partial word counts as
 * if padded with zeros).  `seed` (a piece's device address) makes the right
 * bytes in the wrong place sum differently. */
uint64_t gp_checksum(const void *data, size_t n, uint64_t seed);

#endif /* GP_CHECKSUM_H */
