/*
 * error.c -- the thread-local error slot behind gp_last_error().  A failing
 * call writes what went wrong here, so a status code can travel up through
 * pool.c and module.c while the words that name the bad input survive.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

static _Thread_local char gp_err_msg[1024];

gp_status gp_error_set(gp_status s, const char *fmt, ...)
{
    /* Formatted apart first: callers wrap the message they got, passing
     * gp_last_error() itself as an argument. */
    char msg[sizeof gp_err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(gp_err_msg, msg, sizeof msg);
    return s;
}

void gp_error_clear(void) { gp_err_msg[0] = '\0'; }

const char *gp_last_error(void) { return gp_err_msg; }

const char *gp_status_str(gp_status s)
{
    switch (s) {
    case GP_OK: return "ok";
    case GP_ERR_OOM: return "out of memory";
    case GP_ERR_LIMIT: return "limit exceeded";
    case GP_ERR_INVALID: return "invalid argument";
    case GP_ERR_FOREIGN: return "pointer not owned by gpupool";
    case GP_ERR_DOUBLE_FREE: return "double free";
    case GP_ERR_BACKEND: return "device error";
    case GP_ERR_NOMEM: return "host out of memory";
    case GP_ERR_TOO_MANY: return "too many";
    }
    return "unknown status";
}
