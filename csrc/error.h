/*
 * error.h -- how a failure carries its words: every gp_* call that fails
 * leaves a message in a thread-local slot (read with gp_last_error(), in
 * gpupool.h) and returns a gp_status, so that a status can travel up through
 * the backend, the pool and the module while the message that names the bad
 * input survives.
 */
#ifndef GP_ERROR_H
#define GP_ERROR_H

#include "gpupool.h"

/* Leave a message for gp_last_error() (printf format); returns `s` so that
 * callers can write `return gp_error_set(GP_ERR_OOM, "...")`. */
gp_status gp_error_set(gp_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void gp_error_clear(void);

#endif /* GP_ERROR_H */
