/*
 * pystack.h -- Python stacks for the history (module.c's side): the stack of
 * the calling Python thread, interned to a small id that the pool's events
 * carry (gp_set_context), and turned back into frames for snapshots.
 */
#ifndef GP_PYSTACK_H
#define GP_PYSTACK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* The calling thread's Python stack as an id (0: none).  A thread that holds
 * the GIL is walked at once; a Python thread that released it (PyTorch's
 * operators do, around every kernel launch and allocation) takes it for the
 * walk, as PyTorch's own history does; a thread that never ran Python
 * (autograd's device threads) gets 0 at no cost.  Never called with the
 * pool's lock held: walking frames may run the garbage collector, which may
 * free tensors. */
uint32_t gp_pystack_capture(void);

/* The frames of stack `id`, innermost first, as a list of dicts
 * {"filename", "line", "name"} (PyTorch's snapshot format); an empty list
 * for 0 or an unknown id.  Needs the GIL. */
PyObject *gp_pystack_frames(uint32_t id);

/* Stacks interned so far (at most GP_PYSTACK_MAX; past it new stacks get
 * id 0). */
#define GP_PYSTACK_MAX (1u << 16)
#define GP_PYSTACK_DEPTH 48
unsigned gp_pystack_count(void);

#endif /* GP_PYSTACK_H */
