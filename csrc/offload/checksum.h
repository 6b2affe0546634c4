/*
 * checksum.h -- the checksum that guards offloaded memory: over the 64-bit
 * words w[i] of a range, the sum modulo 2^64 of mix(w[i] ^ (i ^ seed) * K),
 * where K is an odd constant and mix the MurmurHash3 64-bit finalizer (a
 * bijection in which each input bit flips about half the output bits).
 * A change of any one word changes the sum, and a change of several sums
 * differences as good as random, so any change escapes with odds of about
 * 2^-64 -- which lets an offload trust a host copy whose sum equals the
 * device's instead of copying again.  (A linear sum, w[i] times an odd
 * weight, was missed by any even number of flips of the words' top bits.)
 * It is computed where the bytes are -- on the GPU by a kernel of our own
 * (kernels.cu, loaded by the CUDA backend), in host memory by gp_checksum
 * -- before the bytes leave the device and after they come back, so a
 * restore checks the whole round trip (host memory, both copies) at device
 * bandwidth.
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
