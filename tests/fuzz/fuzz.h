/*
 * fuzz.h -- what the fuzz targets share: a finding says what was wrong and
 * aborts, which libFuzzer reports and keeps the input of; inputs are read
 * byte by byte.
 */
#ifndef GP_FUZZ_H
#define GP_FUZZ_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void finding(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void finding(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", program_invocation_short_name);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) finding(__VA_ARGS__);                                     \
    } while (0)

/* An input read as it goes: a short one reads zeros past its end. */
typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static inline uint8_t u8(reader *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static inline uint16_t u16(reader *r) { return (uint16_t)(u8(r) | (unsigned)u8(r) << 8); }
static inline uint32_t u32(reader *r) { return u16(r) | (uint32_t)u16(r) << 16; }
static inline uint64_t u64(reader *r) { return u32(r) | (uint64_t)u32(r) << 32; }

#endif
