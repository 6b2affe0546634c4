/*
 * rng.h -- the tests' random numbers: xorshift64*, fast, and the seed in
 * rng_state makes a failure reproducible.
 */
#ifndef GP_TEST_RNG_H
#define GP_TEST_RNG_H

#include <stdint.h>

static uint64_t rng_state;

static inline uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

#endif
