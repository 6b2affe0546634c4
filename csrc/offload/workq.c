/*
 * workq.c -- a fixed pool of threads and a FIFO of jobs (workq.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workq.h"

typedef struct gp_job {
    gp_job_fn fn;
    void *arg;
    gp_batch *batch;
} gp_job;

struct gp_workq {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    gp_job *jobs; /* a ring */
    size_t head, n, cap;
    int stop;
    unsigned n_threads;
    pthread_t threads[];
};

static void gp_batch_done(gp_batch *b, gp_status st)
{
    pthread_mutex_lock(&b->lock);
    if (st != GP_OK && b->status == GP_OK) {
        b->status = st;
        strncpy(b->error, gp_last_error(), sizeof b->error - 1);
    }
    if (--b->pending == 0) pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

static void *gp_worker(void *arg)
{
    gp_workq *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->n && !q->stop) pthread_cond_wait(&q->cond, &q->lock);
        if (!q->n) break; /* stopping, and nothing left */
        gp_job j = q->jobs[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
        pthread_mutex_unlock(&q->lock);
        gp_error_clear();
        gp_batch_done(j.batch, j.fn(j.arg));
        pthread_mutex_lock(&q->lock);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

gp_status gp_workq_create(const char *name, unsigned threads, gp_workq **out)
{
    *out = NULL;
    if (threads == 0 || threads > 64)
        return gp_error_set(GP_ERR_INVALID, "gpupool: %u worker threads (1..64)", threads);
    gp_workq *q = calloc(1, sizeof *q + threads * sizeof(pthread_t));
    if (!q) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for worker threads");
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    for (unsigned i = 0; i < threads; i++) {
        if (pthread_create(&q->threads[i], NULL, gp_worker, q) != 0) {
            q->n_threads = i;
            gp_workq_destroy(q);
            return gp_error_set(GP_ERR_NOMEM, "gpupool: cannot start worker thread %u of %u", i + 1, threads);
        }
        /* Named by the creator, not the thread, so that the name is there
         * on return (a name is at most 15 characters; a failure only
         * leaves the process's name). */
        char nm[16];
        snprintf(nm, sizeof nm, "%s", name);
        (void)pthread_setname_np(q->threads[i], nm);
    }
    q->n_threads = threads;
    *out = q;
    return GP_OK;
}

void gp_workq_destroy(gp_workq *q)
{
    if (!q) return;
    pthread_mutex_lock(&q->lock);
    q->stop = 1;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    for (unsigned i = 0; i < q->n_threads; i++) pthread_join(q->threads[i], NULL);
    free(q->jobs);
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
    free(q);
}

void gp_batch_init(gp_batch *b)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
}

void gp_batch_destroy(gp_batch *b)
{
    pthread_cond_destroy(&b->cond);
    pthread_mutex_destroy(&b->lock);
}

gp_status gp_workq_push(gp_workq *q, gp_batch *b, gp_job_fn fn, void *arg)
{
    pthread_mutex_lock(&q->lock);
    if (q->n == q->cap) {
        size_t nc = q->cap ? 2 * q->cap : 64;
        gp_job *nj = malloc(nc * sizeof *nj);
        if (!nj) {
            pthread_mutex_unlock(&q->lock);
            return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the work queue");
        }
        for (size_t i = 0; i < q->n; i++) nj[i] = q->jobs[(q->head + i) % q->cap];
        free(q->jobs);
        q->jobs = nj;
        q->head = 0;
        q->cap = nc;
    }
    pthread_mutex_lock(&b->lock);
    b->pending++;
    pthread_mutex_unlock(&b->lock);
    q->jobs[(q->head + q->n++) % q->cap] = (gp_job){fn, arg, b};
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
    return GP_OK;
}

gp_status gp_batch_wait(gp_batch *b)
{
    pthread_mutex_lock(&b->lock);
    while (b->pending) pthread_cond_wait(&b->cond, &b->lock);
    gp_status st = b->status;
    if (st != GP_OK) gp_error_set(st, "%s", b->error);
    pthread_mutex_unlock(&b->lock);
    return st;
}
