/*
 * module.h -- the pieces of the CPython module gpupool._C:
 *   allocator.c  the device registry (one allocator stack per CUDA device,
 *                made on its first allocation), the thread's allocation
 *                context, and the two symbols PyTorch loads
 *                (gpupool_malloc, gpupool_free)
 *   pypool.c     the Python type Pool over any stack, and errors as Python
 *                exceptions
 *   pyoffload.c  offload's methods of Pool
 *   pytorch_methods.c  the methods of PyTorch's pluggable allocator that
 *                gpupool answers (cacheInfo, peer access between devices)
 *   module.c     the module's functions and its init
 * Only these see Python; they reach the allocator through its stacks
 * (stack.h) and gpupool.h.
 */
#ifndef GP_MODULE_H
#define GP_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "error.h"
#include "gpupool.h"
#include "stack.h"

#define GP_MAX_DEVICES 64

/* ------------------------------------------------ allocator.c: the registry */

/* The configuration of device pools made from now on.  -1 (nothing changed)
 * once a device pool exists. */
int gp_registry_configure(const gp_config *cfg);
/* Tests without a GPU: device pools made from now on run over the host
 * backend, `capacity` bytes each (0: the CUDA driver again).  -1 (nothing
 * changed) once a device pool exists. */
int gp_registry_use_host(uint64_t capacity);
/* The configuration in force (the defaults until configured). */
void gp_registry_config(gp_config *out);
/* The stack of `device`, or NULL when it has none (no error set). */
gp_stack *gp_registry_get(int device);
/* The stack of `device`, made on first use; NULL with the error set (and
 * kept for gp_registry_error) when it cannot be made. */
gp_stack *gp_registry_stack(int device);
/* The free memory of `device` as its driver sees it, without making a
 * pool (0 when it cannot be asked).  A slow path. */
uint64_t gp_registry_device_free(int device);
/* Let `peer` read and write device `device`'s memory: its stack's
 * mappings now and later (gp_stack_grant_peer), or, before it has one,
 * from when it is made.  GP_ERR_INVALID for a device out of range or the
 * same device. */
gp_status gp_registry_grant_peer(int device, int peer);
/* The devices granted access to device `device`'s memory, a bit each. */
uint64_t gp_registry_peers(int device);
/* Whether device pools run over the host backend (gp_registry_use_host). */
int gp_registry_on_host(void);
/* Why the last pool creation failed ("" if none did). */
const char *gp_registry_error(void);
/* Frees PyTorch made that gpupool rejected. */
unsigned long long gp_registry_free_errors(void);

/* ------------------------------------ allocator.c: the allocation context */

/* The tag and priority an allocation of this thread gets now, and whether
 * they are the thread's own (else the inherited context's). */
void gp_context(gp_tag *tag, int *prio, int *own);
/* Set this thread's context (tag -1: none of its own); the previous one in
 * *old_tag, *old_prio. */
void gp_context_set(int tag, int prio, int *old_tag, int *old_prio);
/* Set the inherited context (threads without their own); the previous in
 * *old_tag, *old_prio. */
void gp_context_set_inherited(int tag, int prio, int *old_tag, int *old_prio);

/* Blocks handed to this thread's next allocations: on `device`, those of
 * sizes[i] bytes, in order, get ptrs[i] (blocks allocated apart:
 * gp_pool_alloc_apart) until all n are taken (`next` counts them); a
 * request of another size or device is allocated as usual. */
typedef struct gp_handout {
    void **ptrs;
    uint64_t *sizes;
    size_t n, next;
    int device;
} gp_handout;
/* Set this thread's hand-out (all zero: none); returns the previous one,
 * whose arrays are the caller's again. */
gp_handout gp_set_handout(gp_handout h);

/* ------------------------------------------------- pypool.c: the Pool type */

typedef struct gp_pool_object {
    PyObject_HEAD
    gp_stack *stack;
    gp_pool *pool;      /* the stack's */
    int owned;          /* the stack is destroyed with the object (a HostPool) */
} gp_pool_object;

extern PyTypeObject gp_pool_type;
/* A Pool object over stack s; `owned`: destroyed with the object (HostPool). */
PyObject *gp_pool_wrap(gp_stack *s, int owned);
/* Raise the Python exception for st with gp_last_error()'s message; NULL. */
PyObject *gp_raise(gp_status st);
/* A config from the defaults, GPUPOOL_* (when use_env) and a dict of
 * options, checked with gp_config_validate against a device of
 * `device_total` bytes (0: not known yet); -1 with an exception set. */
int gp_config_from_py(PyObject *opts, int use_env, uint64_t device_total, gp_config *cfg);
/* An int argument in [lo, hi] into *out; -1 with ValueError (OverflowError
 * past 64 bits) naming `what`, the value and the range. */
#define GP_U64_MAX UINT64_MAX
int gp_u64_arg(PyObject *o, const char *what, uint64_t lo, uint64_t hi, uint64_t *out);
/* Add STATS_FIELDS and TAG_STATS_FIELDS (gpupool.h's lists as tuples of
 * (name, kind, PyTorch key or None)) to the module; -1 with an exception. */
int gp_stats_fields_add(PyObject *module);

/* ---------------------------------------- pyoffload.c: offload's methods */

PyObject *gp_py_offload(gp_pool_object *self, PyObject *args, PyObject *kw);
PyObject *gp_py_restore(gp_pool_object *self, PyObject *args);
PyObject *gp_py_host_fail(gp_pool_object *self, PyObject *args);
PyObject *gp_py_prefetch(gp_pool_object *self, PyObject *args);
PyObject *gp_py_offload_register(gp_pool_object *self, PyObject *args);
PyObject *gp_py_offload_use(gp_pool_object *self, PyObject *args);
PyObject *gp_py_offload_stats(gp_pool_object *self, PyObject *args);
PyObject *gp_py_offload_corrupt(gp_pool_object *self, PyObject *arg);
PyObject *gp_py_tag_mixed(gp_pool_object *self, PyObject *arg);
PyObject *gp_py_apart_begin(gp_pool_object *self, PyObject *args);
PyObject *gp_py_apart_end(gp_pool_object *self, PyObject *noargs);

/* Entries of the Pool type's method table. */
#define GP_OFFLOAD_METHODS                                                                           \
    {"offload", (PyCFunction)(void (*)(void))gp_py_offload, METH_VARARGS | METH_KEYWORDS,            \
     "offload(tag_ids, keep=True, codec=None, elem_size=0, wait=True) -> dict: move the tags' memory "   \
     "to the host; codec None: the pool's (GPUPOOL_CODEC); wait=False: on a background thread (-> None)"}, \
    {"restore", (PyCFunction)gp_py_restore, METH_VARARGS,                                            \
     "restore(tag_ids) -> dict: bring their memory back at the same addresses"},                    \
    {"prefetch", (PyCFunction)gp_py_prefetch, METH_VARARGS,                                          \
     "prefetch(tag_ids): start restoring them on a worker thread"},                                 \
    {"offload_register", (PyCFunction)gp_py_offload_register, METH_VARARGS,                          \
     "offload_register(tag_id, priority, elem_size=0): offloadable under pressure (-1: no longer)"},             \
    {"offload_use", (PyCFunction)gp_py_offload_use, METH_VARARGS,                                    \
     "offload_use(tag_id, busy): in use (never offloaded under pressure) or idle"},                 \
    {"offload_stats", (PyCFunction)gp_py_offload_stats, METH_VARARGS,                                \
     "offload_stats(create=False) -> dict or None (no offloader yet)"},                             \
    {"tag_mixed", (PyCFunction)gp_py_tag_mixed, METH_O,                                              \
     "tag_mixed(tag_id) -> ([addresses], graphs): the tag's live blocks sharing a chunk with anything " \
     "else, and how many CUDA graph pools live"},                                                   \
    {"apart_begin", (PyCFunction)gp_py_apart_begin, METH_VARARGS,                                    \
     "apart_begin(sizes, tag_id, priority, stream) -> [addresses]: blocks in chunks of their own, "  \
     "handed in order to this thread's next allocations of those sizes on the pool's device"},      \
    {"apart_end", (PyCFunction)gp_py_apart_end, METH_NOARGS,                                         \
     "apart_end() -> int: the hand-out ends; the blocks not taken are freed; returns how many were taken"}, \
    {"_offload_corrupt_for_test", (PyCFunction)gp_py_offload_corrupt, METH_O,                        \
     "flip one stored byte of tag_id's offloaded copy (tests: a restore must catch it)"},             \
    {"_host_fail_for_test", (PyCFunction)gp_py_host_fail, METH_VARARGS,                               \
     "_host_fail_for_test(fn, nth, from=False): the host backend's nth call of fn fails (0: disarm)"},

/* ------------------------------------------- pycodec.c: codecs, nvCOMP */

/* Add the codec functions (nvcomp_search_dir, nvcomp_load, codec_names,
 * checksum) to module m; -1 with an exception set. */
int gp_pycodec_register(PyObject *m);

/* ---------------------------------------------- pyarbiter.c: the tenants */

/* Add tenant_yield, tenant_read, tenant_registries, tenant_unlink and the
 * TENANT_SLOTS / RECLAIM_* constants to module m; -1 with an exception. */
int gp_pyarbiter_register(PyObject *m);

/* ------------------------- pytorch_methods.c: PyTorch's allocator methods */

/* Add set_cache_info, set_peer_access and device_peers to module m; -1
 * with an exception. */
int gp_pytorch_methods_register(PyObject *m);

#endif /* GP_MODULE_H */
