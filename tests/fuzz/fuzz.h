/*
 * fuzz.h -- what the fuzz targets share: a finding says what was wrong and
 * aborts, which libFuzzer reports and keeps the input of.
 */
#ifndef GP_FUZZ_H
#define GP_FUZZ_H

#include <errno.h>
#include <stdarg.h>
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

#endif
