/*
 * stack.h -- one device's allocator stack, assembled once and owned in one
 * place:
 *
 *   backend -> [log adaptor] -> [tenant adaptor] -> pool -> [offloader]
 *
 * A stack is what every entry point allocates from and frees to: PyTorch's
 * hooks (allocator.c: one stack per CUDA device) and the Python Pool type
 * (pypool.c: a HostPool owns its stack).  It knows its parts, so nothing
 * has to find them again: the tenant of its pool (GPUPOOL_TENANT, else
 * none), the offloader (made on first use with the pool's configuration),
 * and what the tenant gives when asked (gp_tenant_reclaim, arbiter.h).  It
 * tells the tenant registry what it could offload and has offloaded
 * (shown by `python -m gpupool top`) after every offload it starts or
 * sees: a pressure offload of its pool, a reclaim, and the calls of the
 * bindings (gp_stack_publish).
 *
 * Layering: the bindings call the stack; the stack calls the pool, the
 * offloader and the tenant layer, which call the backend.  The stack calls
 * nothing of Python: the one thing it asks of the layer above, the context
 * history events carry (a Python stack id), comes through a function
 * pointer (gp_stack_set_context_source), called with no lock held.
 *
 * Threads: every function may be called from any thread.  gp_stack_alloc
 * and gp_stack_free add to gp_alloc and gp_free no lock, no syscall and no
 * allocation (two loads and a branch; the tenant's poll is one relaxed
 * atomic load).
 */
#ifndef GP_STACK_H
#define GP_STACK_H

#include "arbiter.h"
#include "offload.h"

typedef struct gp_stack gp_stack;

/* Assemble a stack over `be`, the device's own backend, for `cfg` (checked
 * with gp_config_validate against the device): the log adaptor with
 * GPUPOOL_LOG=all, the tenant adaptor with GPUPOOL_TENANT (group
 * cfg->tenant on device `device_id`, the device's name in the registry:
 * the same GPU in every process, "host" for the host backend; quota = the
 * pool limit, GPUPOOL_DEVICE_LIMIT, GPUPOOL_RECLAIM_TIMEOUT,
 * GPUPOOL_PRIORITY, GPUPOOL_TENANT_TURN, GPUPOOL_TENANT_SHARE), then the
 * pool.  Takes `be` in every case (destroyed on failure). */
gp_status gp_stack_create(gp_backend *be, const char *device_id, const gp_config *cfg, gp_stack **out);
/* Destroy the offloader (memory still offloaded is lost), the pool, the
 * adaptors and the backend, and leave the tenant group.  No call on the
 * stack may run meanwhile.  NULL is fine. */
void gp_stack_destroy(gp_stack *s);

/* The parts.  The pool and the tenant (NULL without a group) are fixed
 * for the stack's life. */
gp_pool *gp_stack_pool(const gp_stack *s);
gp_arbiter *gp_stack_arbiter(const gp_stack *s);
/* The offloader, made on first use (when `create`) with the pool's
 * configuration (GPUPOOL_HOST_LIMIT, GPUPOOL_OFFLOAD_THREADS,
 * GPUPOOL_NVCOMP); NULL when there is none yet (and `create` is 0) or it
 * cannot be made (the error set).  Making it installs the stack's pressure
 * callback on the pool (the offloader's reclaim, then a publish). */
gp_offloader *gp_stack_offloader(gp_stack *s, int create);

/* Where the context of history events comes from: called before an
 * allocation or free of a pool that records stacks (gp_pool_history_stacks),
 * with no lock held, from any thread; NULL (the default): none. */
typedef uint32_t (*gp_context_fn)(void);
void gp_stack_set_context_source(gp_context_fn fn);

/* Let CUDA device `peer` of the process read and write this stack's device
 * memory: every mapping of its backend, now and later (backend.h's
 * grant_peer), the offloader's restores and the tenant's swaps included,
 * which map through the same backend.  For copies and kernels between
 * devices (PyTorch's enablePeerAccess). */
gp_status gp_stack_grant_peer(gp_stack *s, int peer);

/* Allocate: gp_alloc, under the tenant when the stack has one
 * (gp_arbiter_alloc: answers asks first -- a swap of the whole tenant
 * among them -- and waits for the group's memory).  A tenant's allocation
 * passes a gate on the way in and out: while the tenant is swapped out
 * (by another of its threads), it waits until the memory is back, so that
 * no thread of the process gets memory to launch work on while the rest
 * is away.  Threads that launch work without allocating are not seen: see
 * docs/architecture.md, "Swaps". */
void *gp_stack_alloc(gp_stack *s, size_t size, gp_stream stream, gp_tag tag, int priority, gp_status *status);
/* Free: gp_free, then the tenant's poll (a free is an allocator call too:
 * an ask pending is answered here, which may trim or offload). */
gp_status gp_stack_free(gp_stack *s, void *ptr);

/* gp_restore_tags on the stack's offloader (nothing to do without one),
 * waiting in line as an allocation does when the tenant's group cannot
 * give the room now (gp_arbiter_with_room): it may ask others and swap
 * them out, and fails only when the timeout passed (GP_ERR_OOM, the
 * group's table in the message) or for a reason of the restore's own. */
gp_status gp_stack_restore(gp_stack *s, const gp_tag *tags, size_t n, int accept_loss, gp_offload_result *res);

/* Tell the tenant registry what the offloader could offload now and has
 * offloaded (nothing without a tenant or an offloader).  Takes the
 * offloader's lock, the pool's and the registry's in turn: not from a pool
 * callback other than the stack's own. */
void gp_stack_publish(gp_stack *s);

/* The integrity of the stack's pool (gp_pool_check) and of its offloader,
 * if it has one (gp_offload_check): the problems found (0: none), the
 * first described in msg (n bytes). */
size_t gp_stack_check(gp_stack *s, char *msg, size_t n);

/* A yield point of every tenant stack of this process (gpupool.yield_point):
 * each publishes, then gp_arbiter_yield(need).  No stack of them may be
 * destroyed meanwhile.  Returns the bytes given back. */
uint64_t gp_stack_yield_all(uint64_t need);

#endif /* GP_STACK_H */
