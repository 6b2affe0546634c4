/*
 * host_queue.h -- the host backend's deferred streams (gp_host_set_deferred):
 * copies, checksums and gathers wait in a queue, in the order they were
 * queued, until something the caller may rely on makes them run: a wait for
 * an event recorded after them, a synchronize, a stream_wait that another
 * stream's run reaches, the codec's work (in_context), a fake progress
 * (gp_host_stream_complete).  Work a GPU would run later than its caller
 * assumes then runs later on the host too, and a read that is not ordered
 * after the work that writes what it reads sees the old bytes -- which a
 * host backend that runs everything at once can never show.
 *
 * The queue only holds and runs work; backend_host.c locks it, checks the
 * memory each op touches and decides when to run what.
 */
#ifndef GP_HOST_QUEUE_H
#define GP_HOST_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "gpupool.h"

typedef enum { HOST_OP_COPY, HOST_OP_CHECKSUM, HOST_OP_GATHER, HOST_OP_WAIT } host_op_kind;

typedef struct host_op {
    uint64_t seq;           /* queue order, from 1                          */
    gp_stream stream;
    host_op_kind kind;
    void *dst;              /* copy, gather: where to; checksum: the sum     */
    const void *src;        /* copy: from; checksum: the memory summed       */
    uint64_t size;          /* copy, checksum: bytes                         */
    uint64_t seed;          /* checksum                                      */
    int dir;                /* copy: GP_COPY_D2H, H2D or D2D                 */
    const void *const *srcs; /* gather: read when it runs, as on a GPU       */
    const size_t *lens;
    uint32_t n;
    uint64_t align, max_len;
    gp_stream signaler;     /* wait: run the signaler's ops up to `upto`     */
    uint64_t upto;
} host_op;

typedef struct host_queue {
    host_op *v;
    size_t n, cap;
    uint64_t seq; /* the last op's */
} host_queue;

/* Append op (its seq is set); GP_ERR_NOMEM when the host has no memory. */
gp_status host_queue_push(host_queue *q, host_op op);
/* Take out the oldest op of `stream` (of any stream when any != 0) whose
 * seq <= upto into *op; 0 when there is none. */
int host_queue_take(host_queue *q, int any, gp_stream stream, uint64_t upto, host_op *op);
/* The oldest queued op that reads or writes [addr, addr+size) (a gather's
 * ranges as its arrays say now), or NULL. */
const host_op *host_queue_touching(const host_queue *q, uintptr_t addr, uint64_t size);
/* Call fn(ctx, addr, size, device) for each range op reads or writes
 * (device: on the device side); 0 at the first fn that says 0, else 1. */
int host_op_ranges(const host_op *op, int (*fn)(void *ctx, uintptr_t addr, uint64_t size, int device), void *ctx);
const char *host_op_name(host_op_kind kind);
/* Do op's work (not a wait). */
void host_op_run(const host_op *op);
void host_queue_free(host_queue *q);

#endif /* GP_HOST_QUEUE_H */
