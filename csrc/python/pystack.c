/*
 * pystack.c -- Python stacks for the pool's history, interned to ids.
 *
 * A stack is its frames' (code object, bytecode offset) pairs, innermost
 * first, at most GP_PYSTACK_DEPTH of them.  Lines and names are worked out
 * only when a snapshot asks (gp_pystack_frames), so capturing costs a walk
 * of the frames and a hash lookup.  The table keeps a reference to each code
 * object it holds, so a code pointer is never reused while the table names
 * it.  Everything here runs with the GIL held, which is also what
 * serialises the table.
 */
#include "pystack.h"

#include <stdlib.h>
#include <string.h>

typedef struct gp_pyframe {
    PyCodeObject *code;
    int pos; /* bytecode offset in bytes (3.11+), else the line */
} gp_pyframe;

typedef struct gp_pystack {
    uint64_t hash;
    unsigned n;
    gp_pyframe f[];
} gp_pystack;

#define GP_PYSTACK_SLOTS (2 * GP_PYSTACK_MAX) /* open addressing, at most half full */

static gp_pystack *g_stacks[GP_PYSTACK_MAX]; /* id - 1 -> stack */
static uint32_t g_slots[GP_PYSTACK_SLOTS];   /* hash -> id (0: empty) */
static unsigned g_count;

unsigned gp_pystack_count(void) { return g_count; }

static uint64_t gp_hash_frames(const gp_pyframe *f, unsigned n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the pairs */
    for (unsigned i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uintptr_t)f[i].code) * 1099511628211ull;
        h = (h ^ (uint64_t)(uint32_t)f[i].pos) * 1099511628211ull;
    }
    return h;
}

/* The frames of the current thread (it holds the GIL), with a reference to
 * each code object; returns how many. */
static unsigned gp_walk(gp_pyframe *out)
{
    unsigned n = 0;
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    while (f && n < GP_PYSTACK_DEPTH) {
        out[n].code = PyFrame_GetCode(f);
#if PY_VERSION_HEX >= 0x030B0000
        out[n].pos = PyFrame_GetLasti(f);
#else
        out[n].pos = PyFrame_GetLineNumber(f);
#endif
        n++;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    return n;
}

/* Intern the walked frames (their code references pass to the table, or
 * are dropped when the stack is known or the table is full). */
static uint32_t gp_intern(gp_pyframe *f, unsigned n)
{
    uint64_t h = gp_hash_frames(f, n);
    uint32_t slot = (uint32_t)(h % GP_PYSTACK_SLOTS), id;
    for (; (id = g_slots[slot]) != 0; slot = (slot + 1) % GP_PYSTACK_SLOTS) {
        const gp_pystack *s = g_stacks[id - 1];
        if (s->hash == h && s->n == n && !memcmp(s->f, f, n * sizeof *f)) break;
    }
    gp_pystack *s = NULL;
    if (!id && g_count < GP_PYSTACK_MAX && (s = malloc(sizeof *s + n * sizeof *f))) {
        s->hash = h;
        s->n = n;
        memcpy(s->f, f, n * sizeof *f);
        g_stacks[g_count++] = s;
        g_slots[slot] = id = g_count;
        return id;
    }
    for (unsigned i = 0; i < n; i++) Py_DECREF(f[i].code);
    return id; /* known, or 0 when the table is full */
}

static uint32_t gp_capture_locked(void)
{
    gp_pyframe f[GP_PYSTACK_DEPTH];
    unsigned n = gp_walk(f);
    return n ? gp_intern(f, n) : 0;
}

static int gp_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

uint32_t gp_pystack_capture(void)
{
    if (!Py_IsInitialized()) return 0;
    if (PyGILState_Check()) return gp_capture_locked();
    /* A thread that never ran Python has no thread state: nothing to walk,
     * and taking the GIL would only slow it down. */
    if (!PyGILState_GetThisThreadState() || gp_finalizing()) return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    uint32_t id = gp_capture_locked();
    PyGILState_Release(g);
    return id;
}

static PyObject *gp_frame_dict(const gp_pyframe *f)
{
#if PY_VERSION_HEX >= 0x030B0000
    int line = PyCode_Addr2Line(f->code, f->pos);
#else
    int line = f->pos;
#endif
    return Py_BuildValue("{s:O,s:i,s:O}", "filename", f->code->co_filename, "line", line, "name",
                         f->code->co_name);
}

PyObject *gp_pystack_frames(uint32_t id)
{
    if (id == 0 || id > g_count) return PyList_New(0);
    const gp_pystack *s = g_stacks[id - 1];
    PyObject *l = PyList_New((Py_ssize_t)s->n);
    if (!l) return NULL;
    for (unsigned i = 0; i < s->n; i++) {
        PyObject *d = gp_frame_dict(&s->f[i]);
        if (!d) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, d);
    }
    return l;
}
