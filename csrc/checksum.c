/*
 * checksum.c -- gp_checksum (codec.h): the 64-bit hash that guards every
 * chunk of offloaded memory while it sits in host RAM.
 *
 * It must keep up with PCIe on a few CPU threads (tens of GB/s in all), so
 * it works on 64-byte stripes of eight 64-bit lanes that the compiler keeps
 * in vector registers: each word is added to its neighbour lane (so any
 * change of a single word changes the state) and the product of its two
 * 32-bit halves, mixed with a key that moves with the stripe's position (so
 * swapped stripes hash differently), is added to its own lane.  Every 16
 * stripes the lanes are scrambled by a bijection (shift-xor, multiply by an
 * odd constant), and the end folds the lanes with full 64x64->128-bit
 * products and the length.  Not cryptographic: it finds corruption, not
 * forgery.
 */
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "codec.h"

/* Two lanes: the width of SSE2 and NEON, so that every 64-bit target
 * gets vector code without flags and no vector crosses a call. */
typedef uint64_t gp_u64x2 __attribute__((vector_size(16)));

#define GP_CK_STRIPE 64
#define GP_CK_LANES 4 /* vectors per stripe */
#define GP_CK_ROUND 16 /* stripes between scrambles */

/* Odd constants with well-mixed bits (digits of pi). */
static const uint64_t gp_ck_seed[2 * GP_CK_LANES] = {
    0x243f6a8885a308d3ull, 0x13198a2e03707345ull, 0xa4093822299f31d1ull, 0x082efa98ec4e6c89ull,
    0x452821e638d01377ull, 0xbe5466cf34e90c6dull, 0xc0ac29b7c97c50ddull, 0x3f84d5b5b5470917ull};
static const uint64_t gp_ck_step = 0x9e3779b97f4a7c15ull; /* the golden ratio */
static const uint64_t gp_ck_mul = 0xff51afd7ed558ccdull;

/* The products of the low 32-bit halves of each lane.  GCC does not see
 * that the operands below are zero-extended and would emit a full 64-bit
 * product (three multiplies), hence the SSE2 instruction where there is one. */
static inline gp_u64x2 gp_ck_mul32(gp_u64x2 a, gp_u64x2 b)
{
#ifdef __SSE2__
    return (gp_u64x2)_mm_mul_epu32((__m128i)a, (__m128i)b);
#else
    return (a & 0xffffffffull) * (b & 0xffffffffull);
#endif
}

/* One vector of a stripe: word i also lands in its neighbour lane (i^1). */
static inline gp_u64x2 gp_ck_word2(gp_u64x2 acc, const unsigned char *p, gp_u64x2 key)
{
    gp_u64x2 d;
    memcpy(&d, p, sizeof d);
    gp_u64x2 k = d ^ key;
    gp_u64x2 swapped = {d[1], d[0]};
    return acc + swapped + gp_ck_mul32(k, k >> 32);
}

static inline gp_u64x2 gp_ck_scramble(gp_u64x2 acc, int i)
{
    gp_u64x2 seed = {gp_ck_seed[2 * i], gp_ck_seed[2 * i + 1]};
    return ((acc ^ (acc >> 47)) ^ seed) * gp_ck_mul;
}

/* The lanes live in named variables, which the compiler keeps in registers. */
#define GP_CK_STRIPE_AT(p)                                 \
    do {                                                   \
        a0 = gp_ck_word2(a0, (p), k0);                     \
        a1 = gp_ck_word2(a1, (p) + 16, k0 + gp_ck_off[1]); \
        a2 = gp_ck_word2(a2, (p) + 32, k0 + gp_ck_off[2]); \
        a3 = gp_ck_word2(a3, (p) + 48, k0 + gp_ck_off[3]); \
        k0 += gp_ck_step;                                  \
    } while (0)

static inline uint64_t gp_ck_fold(uint64_t a, uint64_t b)
{
    unsigned __int128 m = (unsigned __int128)a * b;
    return (uint64_t)m ^ (uint64_t)(m >> 64);
}

uint64_t gp_checksum(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *p = data;
    /* The keys of the four vectors differ by fixed offsets. */
    static const gp_u64x2 gp_ck_off[GP_CK_LANES] = {
        {0, 0}, {0x6a09e667f3bcc909ull, 0xbb67ae8584caa73bull},
        {0x3c6ef372fe94f82bull, 0xa54ff53a5f1d36f1ull}, {0x510e527fade682d1ull, 0x9b05688c2b3e6c1full}};
    gp_u64x2 a0 = {gp_ck_seed[0] ^ seed, gp_ck_seed[1] ^ seed}, a1 = {gp_ck_seed[2] ^ seed, gp_ck_seed[3] ^ seed},
             a2 = {gp_ck_seed[4] ^ seed, gp_ck_seed[5] ^ seed}, a3 = {gp_ck_seed[6] ^ seed, gp_ck_seed[7] ^ seed};
    gp_u64x2 k0 = a0 * gp_ck_mul;
    size_t stripes = n / GP_CK_STRIPE, s = 0;
    for (; s + GP_CK_ROUND <= stripes; s += GP_CK_ROUND) {
        for (int r = 0; r < GP_CK_ROUND; r++) GP_CK_STRIPE_AT(p + (s + r) * GP_CK_STRIPE);
        a0 = gp_ck_scramble(a0, 0), a1 = gp_ck_scramble(a1, 1);
        a2 = gp_ck_scramble(a2, 2), a3 = gp_ck_scramble(a3, 3);
    }
    for (; s < stripes; s++) GP_CK_STRIPE_AT(p + s * GP_CK_STRIPE);
    size_t rest = n % GP_CK_STRIPE;
    if (rest) {
        unsigned char last[GP_CK_STRIPE] = {0};
        memcpy(last, p + stripes * GP_CK_STRIPE, rest);
        GP_CK_STRIPE_AT(last);
    }
    const gp_u64x2 acc[GP_CK_LANES] = {a0, a1, a2, a3};
    uint64_t h = (uint64_t)n * gp_ck_step;
    for (int i = 0; i < GP_CK_LANES; i++)
        h += gp_ck_fold(acc[i][0] ^ gp_ck_seed[2 * i + 1], acc[i][1] ^ gp_ck_seed[2 * i]);
    h ^= h >> 33;
    h *= gp_ck_mul;
    h ^= h >> 29;
    return h;
}
