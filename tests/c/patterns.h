/*
 * patterns.h -- contents a test can check every byte of without keeping a
 * copy: word i of a block filled with (seed, kind) is a function of them.
 * Kinds: random words (incompressible: codecs must go raw), bf16-like
 * small values (the high byte planes compress), sparse (mostly zeros).
 */
#ifndef GP_TEST_PATTERNS_H
#define GP_TEST_PATTERNS_H

#include <stdint.h>
#include <string.h>

enum { PAT_RANDOM, PAT_BF16, PAT_SPARSE, PAT_KINDS };

static inline uint64_t pat_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The 8 bytes at word i of a block filled with (seed, kind). */
static inline uint64_t pat_word(uint64_t seed, int kind, uint64_t i)
{
    uint64_t h = pat_mix(seed * 0x9e3779b97f4a7c15ull + i);
    switch (kind) {
    case PAT_BF16: { /* four bf16 of small magnitude: the high bytes compress */
        uint64_t w = 0;
        for (int k = 0; k < 4; k++) w |= (uint64_t)(0x3c00u | ((h >> (16 * k)) & 0x3ffu)) << (16 * k);
        return w;
    }
    case PAT_SPARSE:
        return i % 61 == 0 ? h : 0;
    default:
        return h;
    }
}

static inline void pat_fill(char *ptr, uint64_t n, uint64_t seed, int kind)
{
    uint64_t i = 0;
    for (; (i + 1) * 8 <= n; i++) {
        uint64_t w = pat_word(seed, kind, i);
        memcpy(ptr + i * 8, &w, 8);
    }
    if (i * 8 < n) {
        uint64_t w = pat_word(seed, kind, i);
        memcpy(ptr + i * 8, &w, n - i * 8);
    }
}

/* Bytes of [ptr, ptr+n) that differ from the pattern; every 512th word
 * only when `sample` (a quick look at blocks no operation touched). */
static inline uint64_t pat_diff(const char *ptr, uint64_t n, uint64_t seed, int kind, int sample)
{
    uint64_t bad = 0, words = n / 8, step = sample ? 512 : 1;
    for (uint64_t i = 0; i < words; i += step) {
        uint64_t w = pat_word(seed, kind, i), v;
        memcpy(&v, ptr + i * 8, 8);
        if (v != w)
            for (int b = 0; b < 8; b++) bad += ((v >> (8 * b)) & 0xff) != ((w >> (8 * b)) & 0xff);
    }
    if (words * 8 < n) { /* the tail, always */
        uint64_t w = pat_word(seed, kind, words), v = 0;
        memcpy(&v, ptr + words * 8, n - words * 8);
        for (uint64_t b = 0; b < n - words * 8; b++) bad += ((v >> (8 * b)) & 0xff) != ((w >> (8 * b)) & 0xff);
    }
    if (sample && words) { /* and the last word */
        uint64_t w = pat_word(seed, kind, words - 1), v;
        memcpy(&v, ptr + (words - 1) * 8, 8);
        bad += v != w;
    }
    return bad;
}

#endif
