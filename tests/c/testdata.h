/*
 * testdata.h -- data for the codec tests and benchmarks: a xorshift PRNG,
 * normals made of twelve uniforms (no libm), and buffers of random bytes,
 * zeros, bf16 N(0, 0.02) (weights) or fp32 squares of N(0, 1e-3) (like
 * AdamW's exp_avg_sq); and a monotonic clock.
 */
#ifndef GP_TESTDATA_H
#define GP_TESTDATA_H

#include <stdint.h>
#include <string.h>
#include <time.h>

enum { DATA_RANDOM, DATA_ZEROS, DATA_BF16, DATA_FP32SQ, DATA_KINDS };
static const char *const data_names[DATA_KINDS] = {"random", "zeros", "bf16", "fp32sq"};

static uint64_t data_rng = 0x9e3779b97f4a7c15ull;

static inline uint64_t data_rnd(void)
{
    data_rng ^= data_rng << 13;
    data_rng ^= data_rng >> 7;
    data_rng ^= data_rng << 17;
    return data_rng;
}

static inline double data_normal(void)
{
    double s = -6.0;
    for (int i = 0; i < 12; i++) s += (double)(data_rnd() >> 11) / 9007199254740992.0;
    return s;
}

/* The kind named `name`, or -1. */
static inline int data_kind(const char *name)
{
    for (int k = 0; k < DATA_KINDS; k++)
        if (strcmp(name, data_names[k]) == 0) return k;
    return -1;
}

/* n bytes of `kind`; a tail shorter than an element gets its first bytes. */
static inline void data_fill(unsigned char *b, uint64_t n, int kind)
{
    for (uint64_t i = 0; i < n;) {
        unsigned char e[8];
        unsigned w = 8;
        if (kind == DATA_ZEROS) {
            memset(e, 0, w);
        } else if (kind == DATA_BF16 || kind == DATA_FP32SQ) {
            double g = kind == DATA_BF16 ? 0.02 * data_normal() : 1e-3 * data_normal();
            float f = (float)(kind == DATA_BF16 ? g : g * g);
            uint32_t u;
            memcpy(&u, &f, 4);
            w = 4;
            if (kind == DATA_BF16) { /* the float's high half, rounded to nearest even */
                u += 0x7fff + ((u >> 16) & 1);
                uint16_t h = (uint16_t)(u >> 16);
                memcpy(e, &h, 2);
                w = 2;
            } else {
                memcpy(e, &u, 4);
            }
        } else {
            uint64_t r = data_rnd();
            memcpy(e, &r, 8);
        }
        if (w > n - i) w = (unsigned)(n - i);
        memcpy(b + i, e, w);
        i += w;
    }
}

static inline double data_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#endif
