/*
 * check.h -- the few lines every C test needs: CHECK records a failure with
 * its place and goes on, so one run reports every broken expectation, and
 * check_done() prints the closing "N passed, M failed" line and the exit code.
 */
#ifndef GP_CHECK_H
#define GP_CHECK_H

#include <stdio.h>

static int check_pass, check_fail;

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (cond) check_pass++;                                               \
        else {                                                                \
            check_fail++;                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                     \
    } while (0)

static inline int check_done(void)
{
    printf("%d passed, %d failed\n", check_pass, check_fail);
    return check_fail ? 1 : 0;
}

#endif
