/*
 * host_queue.c -- the host backend's deferred streams (host_queue.h).
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "checksum.h"
#include "host_queue.h"
#include "util.h"

gp_status host_queue_push(host_queue *q, host_op op)
{
    host_op *v = gp_array_room(q->v, &q->cap, q->n, sizeof *v, 64);
    if (!v) return gp_error_set(GP_ERR_NOMEM, "host backend: out of host memory for a queued op");
    q->v = v;
    op.seq = ++q->seq;
    q->v[q->n++] = op;
    return GP_OK;
}

int host_queue_take(host_queue *q, int any, gp_stream stream, uint64_t upto, host_op *op)
{
    for (size_t i = 0; i < q->n && q->v[i].seq <= upto; i++)
        if (any || q->v[i].stream == stream) {
            *op = q->v[i];
            memmove(&q->v[i], &q->v[i + 1], (q->n - i - 1) * sizeof *q->v);
            q->n--;
            return 1;
        }
    return 0;
}

/* The length of the gather's range b (0 above max_len: nothing copied). */
static uint64_t host_gather_len(const host_op *op, uint32_t b) { return op->lens[b] > op->max_len ? 0 : op->lens[b]; }

int host_op_ranges(const host_op *op, int (*fn)(void *ctx, uintptr_t addr, uint64_t size, int device), void *ctx)
{
    switch (op->kind) {
    case HOST_OP_COPY:
        return fn(ctx, (uintptr_t)op->src, op->size, op->dir != GP_COPY_H2D) &&
               fn(ctx, (uintptr_t)op->dst, op->size, op->dir != GP_COPY_D2H);
    case HOST_OP_CHECKSUM:
        return fn(ctx, (uintptr_t)op->src, op->size, 1) && fn(ctx, (uintptr_t)op->dst, 8, 1);
    case HOST_OP_GATHER: {
        uint64_t off = 0;
        for (uint32_t b = 0; b < op->n; b++) {
            uint64_t len = host_gather_len(op, b);
            if (len && !(fn(ctx, (uintptr_t)op->srcs[b], len, 1) && fn(ctx, (uintptr_t)op->dst + off, len, 1)))
                return 0;
            off += (len + op->align - 1) & ~(op->align - 1);
        }
        return 1;
    }
    case HOST_OP_WAIT:
        return 1;
    }
    return 1;
}

typedef struct host_overlap {
    uintptr_t addr;
    uint64_t size;
} host_overlap;

static int host_apart(void *ctx, uintptr_t addr, uint64_t size, int device)
{
    const host_overlap *r = ctx;
    (void)device;
    return !size || addr + size <= r->addr || r->addr + r->size <= addr;
}

const host_op *host_queue_touching(const host_queue *q, uintptr_t addr, uint64_t size)
{
    host_overlap r = {addr, size};
    for (size_t i = 0; i < q->n; i++)
        if (!host_op_ranges(&q->v[i], host_apart, &r)) return &q->v[i];
    return NULL;
}

const char *host_op_name(host_op_kind kind)
{
    static const char *const names[] = {"copy", "checksum", "gather", "wait"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

void host_op_run(const host_op *op)
{
    switch (op->kind) {
    case HOST_OP_COPY:
        if (op->size) memmove(op->dst, op->src, op->size);
        break;
    case HOST_OP_CHECKSUM: {
        uint64_t sum = gp_checksum(op->src, op->size, op->seed);
        memcpy(op->dst, &sum, 8);
        break;
    }
    case HOST_OP_GATHER: {
        uint64_t off = 0;
        for (uint32_t b = 0; b < op->n; b++) {
            uint64_t len = host_gather_len(op, b);
            if (len) memmove((char *)op->dst + off, op->srcs[b], len);
            off += (len + op->align - 1) & ~(op->align - 1);
        }
        break;
    }
    case HOST_OP_WAIT:
        break;
    }
}

void host_queue_free(host_queue *q)
{
    free(q->v);
    memset(q, 0, sizeof *q);
}
