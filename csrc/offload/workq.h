/*
 * workq.h -- a small pool of threads running jobs from a queue, for the
 * work offload does beside its copies: unmapping behind them, mapping ahead
 * of restores, checksums of host data, prefetches.  A job is a function and
 * an argument; a gp_batch counts jobs so that one can wait for a group of
 * them (a slice, a whole offload) and collect their first error.
 */
#ifndef GP_WORKQ_H
#define GP_WORKQ_H

#include <pthread.h>

#include "error.h"

typedef struct gp_workq gp_workq;

/* A group of jobs to wait for together; its first failure is kept. */
typedef struct gp_batch {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned pending;
    gp_status status;   /* the first job's failure, GP_OK if none */
    char error[512];    /* its message */
} gp_batch;

/* A job returns a status; on failure it has set the thread's error slot. */
typedef gp_status (*gp_job_fn)(void *arg);

/* `name` (at most 15 characters) names its threads, as `top -H` and
 * debuggers show them. */
gp_status gp_workq_create(const char *name, unsigned threads, gp_workq **out);
/* Runs every queued job, then stops and joins the threads. */
void gp_workq_destroy(gp_workq *q);

void gp_batch_init(gp_batch *b);
void gp_batch_destroy(gp_batch *b);
/* Queue fn(arg) as part of batch b.  GP_ERR_NOMEM when the queue cannot
 * grow (the job was not queued and b does not count it). */
gp_status gp_workq_push(gp_workq *q, gp_batch *b, gp_job_fn fn, void *arg);
/* Wait until every job of b has run; returns b's first failure (and sets
 * this thread's error slot to its message). */
gp_status gp_batch_wait(gp_batch *b);

#endif /* GP_WORKQ_H */
