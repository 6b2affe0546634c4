/*
 * pypool.c -- the Python type gpupool._C.Pool over any gp_pool: a device
 * pool (not owned) or a HostPool over the host backend (owned), with the
 * same methods, so that the whole Python API is tested without a GPU.
 */
#include <stdint.h>

#include "module.h"
#include "pystack.h"

/* ------------------------------------------------------------ error helper */

static PyObject *gp_err_type(gp_status st)
{
    switch (st) {
    case GP_ERR_OOM:
    case GP_ERR_LIMIT: return PyExc_MemoryError;
    case GP_ERR_INVALID:
    case GP_ERR_FOREIGN:
    case GP_ERR_DOUBLE_FREE: return PyExc_ValueError;
    case GP_ERR_NOMEM: return PyExc_MemoryError;
    default: return PyExc_RuntimeError;
    }
}

PyObject *gp_raise(gp_status st)
{
    PyErr_SetString(gp_err_type(st), gp_last_error()[0] ? gp_last_error() : gp_status_str(st));
    return NULL;
}

/* ------------------------------------------------------------- Pool type */

typedef gp_pool_object PoolObject;

PyObject *gp_pool_wrap(gp_pool *p, int owned)
{
    PoolObject *o = PyObject_New(PoolObject, &gp_pool_type);
    if (!o) return NULL;
    o->pool = p;
    o->owned = owned;
    return (PyObject *)o;
}

static void pool_dealloc(PoolObject *self)
{
    if (self->owned && self->pool) {
        gp_offloader_forget(self->pool);
        gp_pool_destroy(self->pool);
    }
    PyObject_Free(self);
}

/* Build a config from defaults, GPUPOOL_* (when use_env) and a dict. */
int gp_config_from_py(PyObject *opts, int use_env, gp_config *cfg)
{
    gp_config_default(cfg);
    if (use_env && gp_config_from_env(cfg) != GP_OK) {
        gp_raise(GP_ERR_INVALID);
        return -1;
    }
    if (!opts || opts == Py_None) return 0;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(opts, &pos, &key, &value)) {
        if (value == Py_None) continue;
        PyObject *text;
        if (PyBool_Check(value)) text = PyUnicode_FromString(value == Py_True ? "1" : "0");
        else text = PyObject_Str(value);
        if (!text) return -1;
        const char *k = PyUnicode_AsUTF8(key), *v = PyUnicode_AsUTF8(text);
        gp_status st = k && v ? gp_config_set(cfg, k, v) : GP_ERR_INVALID;
        Py_DECREF(text);
        if (!k || !v) return -1;
        if (st != GP_OK) {
            gp_raise(st);
            return -1;
        }
    }
    return 0;
}

static PyObject *host_pool_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)type;
    static char *kwlist[] = {"capacity", "options", NULL};
    unsigned long long capacity;
    PyObject *opts = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|O!", kwlist, &capacity, &PyDict_Type, &opts)) return NULL;
    gp_config cfg;
    if (gp_config_from_py(opts, 0, &cfg) < 0) return NULL;
    gp_backend *be;
    gp_status st = gp_backend_host_create(capacity, &be);
    if (st != GP_OK) return gp_raise(st);
    gp_pool *p;
    if ((st = gp_pool_create(be, &cfg, &p)) != GP_OK) return gp_raise(st);
    return gp_pool_wrap(p, 1);
}

static int parse_stream(PyObject *o, gp_stream *out)
{
    if (!o || o == Py_None) { *out = NULL; return 1; }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (PyErr_Occurred()) return 0;
    *out = (gp_stream)(uintptr_t)v;
    return 1;
}

static PyObject *pool_alloc(PoolObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"size", "stream", "tag", "priority", NULL};
    long long size;
    PyObject *stream_o = NULL;
    int tag = -1, prio = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "L|Oii", kwlist, &size, &stream_o, &tag, &prio)) return NULL;
    gp_stream s;
    if (!parse_stream(stream_o, &s)) return NULL;
    if (size <= 0) {
        PyErr_Format(PyExc_ValueError, "alloc size must be > 0 bytes, got %lld", size);
        return NULL;
    }
    gp_tag ctag;
    int cprio;
    int own;
    gp_context(&ctag, &cprio, &own);
    gp_status st;
    void *r;
    int stacks = gp_pool_history_stacks(self->pool);
    if (stacks) gp_set_context(gp_pystack_capture());
    Py_BEGIN_ALLOW_THREADS
    r = gp_alloc(self->pool, (size_t)size, s, tag >= 0 ? (gp_tag)tag : ctag, prio >= 0 ? prio : cprio, &st);
    Py_END_ALLOW_THREADS
    if (stacks) gp_set_context(0);
    if (!r) return gp_raise(st);
    return PyLong_FromVoidPtr(r);
}

static PyObject *pool_free(PoolObject *self, PyObject *arg)
{
    void *ptr = PyLong_AsVoidPtr(arg);
    if (PyErr_Occurred()) return NULL;
    int stacks = gp_pool_history_stacks(self->pool);
    if (stacks) gp_set_context(gp_pystack_capture());
    gp_status st = gp_free(self->pool, ptr);
    if (stacks) gp_set_context(0);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

#define SET(d, k, v)                                                       \
    do {                                                                   \
        PyObject *_v = PyLong_FromUnsignedLongLong((unsigned long long)(v)); \
        if (!_v || PyDict_SetItemString(d, k, _v) < 0) {                   \
            Py_XDECREF(_v);                                                \
            Py_DECREF(d);                                                  \
            return NULL;                                                   \
        }                                                                  \
        Py_DECREF(_v);                                                     \
    } while (0)

static PyObject *stats_dict(gp_pool *p, int full)
{
    gp_stats s;
    gp_pool_stats(p, &s, full);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    SET(d, "allocated", s.allocated);
    SET(d, "allocated_peak", s.allocated_peak);
    SET(d, "requested", s.requested);
    SET(d, "requested_peak", s.requested_peak);
    SET(d, "reserved", s.reserved);
    SET(d, "reserved_peak", s.reserved_peak);
    SET(d, "active_blocks", s.active_blocks);
    SET(d, "active_blocks_peak", s.active_blocks_peak);
    SET(d, "n_alloc", s.n_alloc);
    SET(d, "n_free", s.n_free);
    SET(d, "cache_hits", s.cache_hits);
    SET(d, "n_map", s.n_map);
    SET(d, "n_unmap", s.n_unmap);
    SET(d, "n_map_fail", s.n_map_fail);
    SET(d, "n_stream_waits", s.n_stream_waits);
    SET(d, "n_sync", s.n_sync);
    SET(d, "n_trim", s.n_trim);
    SET(d, "n_oom", s.n_oom);
    SET(d, "n_alloc_retries", s.n_alloc_retries);
    SET(d, "segments", s.segments);
    SET(d, "free_blocks", s.free_blocks);
    SET(d, "free_bytes", s.free_bytes);
    SET(d, "largest_free", s.largest_free);
    SET(d, "limit", s.limit);
    SET(d, "device_total", s.device_total);
    SET(d, "chunk", s.chunk);
    SET(d, "offloaded", s.offloaded);
    SET(d, "allocated_total", s.allocated_total);
    SET(d, "requested_total", s.requested_total);
    SET(d, "mapped_total", s.mapped_total);
    SET(d, "unmapped_total", s.unmapped_total);
    SET(d, "pending", s.pending);
    SET(d, "n_capture_maps", s.n_capture_maps);
    return d;
}

static PyObject *pool_stats(PoolObject *self, PyObject *args)
{
    int full = 1;
    if (!PyArg_ParseTuple(args, "|p", &full)) return NULL;
    return stats_dict(self->pool, full);
}

/* The keys of the per-tag dicts, made once: stats() is meant to be called
 * every step, and making these strings anew for every tag was most of it. */
#define GP_TAG_KEYS 7
static PyObject *g_tag_keys[GP_TAG_KEYS];

static PyObject *pool_tag_stats(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    static const char *const names[GP_TAG_KEYS] = {"allocated", "allocated_peak", "requested",
                                                   "active_blocks", "n_alloc", "limit", "offloaded"};
    for (int i = 0; i < GP_TAG_KEYS; i++)
        if (!g_tag_keys[i] && !(g_tag_keys[i] = PyUnicode_InternFromString(names[i]))) return NULL;
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    unsigned n = gp_tag_count();
    for (unsigned t = 0; t < n; t++) {
        gp_tag_stats ts;
        gp_pool_tag_stats(self->pool, (gp_tag)t, &ts);
        if (!ts.n_alloc && !ts.limit && !ts.allocated_peak) continue; /* (retagged blocks) */
        const uint64_t v[GP_TAG_KEYS] = {ts.allocated, ts.allocated_peak, ts.requested,
                                         ts.active_blocks, ts.n_alloc, ts.limit, ts.offloaded};
        PyObject *d = PyDict_New();
        int rc = d ? 0 : -1;
        for (int i = 0; rc == 0 && i < GP_TAG_KEYS; i++) {
            PyObject *x = PyLong_FromUnsignedLongLong((unsigned long long)v[i]);
            rc = x ? PyDict_SetItem(d, g_tag_keys[i], x) : -1;
            Py_XDECREF(x);
        }
        if (rc == 0) rc = PyDict_SetItemString(out, gp_tag_name((gp_tag)t), d);
        Py_XDECREF(d);
        if (rc < 0) { Py_DECREF(out); return NULL; }
    }
    return out;
}

static PyObject *pool_prio_stats(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    for (int pr = 0; pr <= GP_PRIO_MAX; pr++) {
        uint64_t cur, peak;
        gp_pool_prio_stats(self->pool, pr, &cur, &peak);
        if (!peak) continue;
        PyObject *v = Py_BuildValue("(KK)", (unsigned long long)cur, (unsigned long long)peak);
        PyObject *k = PyLong_FromLong(pr);
        int rc = v && k ? PyDict_SetItem(out, k, v) : -1;
        Py_XDECREF(v);
        Py_XDECREF(k);
        if (rc < 0) { Py_DECREF(out); return NULL; }
    }
    return out;
}

static int walk_to_list(void *arg, const gp_block_info *b)
{
    PyObject *t = Py_BuildValue("(KKKKiiiii)", (unsigned long long)b->addr, (unsigned long long)b->size,
                                (unsigned long long)b->requested, (unsigned long long)(uintptr_t)b->stream,
                                (int)b->tag, (int)b->priority, (int)b->state, (int)b->arena,
                                (int)b->lifetime);
    if (!t) return 1;
    int rc = PyList_Append((PyObject *)arg, t);
    Py_DECREF(t);
    return rc < 0;
}

static PyObject *pool_blocks(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    PyObject *l = PyList_New(0);
    if (!l) return NULL;
    gp_pool_walk(self->pool, walk_to_list, l);
    if (PyErr_Occurred()) { Py_DECREF(l); return NULL; }
    return l;
}

static PyObject *pool_trim(PoolObject *self, PyObject *args)
{
    unsigned long long bytes = UINT64_MAX;
    if (!PyArg_ParseTuple(args, "|K", &bytes)) return NULL;
    uint64_t r;
    Py_BEGIN_ALLOW_THREADS
    r = gp_pool_trim(self->pool, bytes);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(r);
}

static PyObject *pool_set_limit(PoolObject *self, PyObject *arg)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    gp_pool_set_limit(self->pool, v);
    Py_RETURN_NONE;
}

static PyObject *pool_set_tag_limit(PoolObject *self, PyObject *args)
{
    int tag;
    unsigned long long bytes;
    if (!PyArg_ParseTuple(args, "iK", &tag, &bytes)) return NULL;
    gp_status st = gp_pool_set_tag_limit(self->pool, (gp_tag)tag, bytes);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *pool_retag(PoolObject *self, PyObject *args)
{
    PyObject *addrs;
    int tag, prio = GP_PRIO_DEFAULT;
    if (!PyArg_ParseTuple(args, "Oi|i", &addrs, &tag, &prio)) return NULL;
    PyObject *seq = PySequence_Fast(addrs, "retag(addresses, tag_id, priority): addresses must be a sequence of ints");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    void **ptrs = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *ptrs);
    if (!ptrs) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        ptrs[i] = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(seq, i));
        if (PyErr_Occurred()) {
            PyMem_Free(ptrs);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    if (tag < 0 || tag >= GP_MAX_TAGS) tag = GP_MAX_TAGS; /* rejected, with its message, below */
    uint64_t moved = 0;
    gp_status st;
    Py_BEGIN_ALLOW_THREADS
    st = gp_pool_retag(self->pool, ptrs, (size_t)n, (gp_tag)tag, prio, &moved);
    Py_END_ALLOW_THREADS
    PyMem_Free(ptrs);
    if (st != GP_OK) return gp_raise(st);
    return PyLong_FromUnsignedLongLong(moved);
}

static PyObject *pool_reset_peaks(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    gp_pool_reset_peaks(self->pool);
    Py_RETURN_NONE;
}

static PyObject *pool_last_oom(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    char buf[GP_OOM_REPORT_MAX];
    gp_pool_last_oom(self->pool, buf, sizeof buf);
    return PyUnicode_FromString(buf);
}

static PyObject *pool_lookup(PoolObject *self, PyObject *arg)
{
    void *ptr = PyLong_AsVoidPtr(arg);
    if (PyErr_Occurred()) return NULL;
    gp_block_info b;
    gp_status st = gp_pool_lookup(self->pool, ptr, &b);
    if (st != GP_OK) return gp_raise(st);
    PyObject *l = PyList_New(0);
    if (!l) return NULL;
    if (walk_to_list(l, &b)) { Py_DECREF(l); return NULL; }
    PyObject *t = PyList_GetItem(l, 0);
    Py_INCREF(t);
    Py_DECREF(l);
    return t;
}

static PyObject *pool_mem_info(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    gp_stats s;
    gp_pool_stats(self->pool, &s, 0);
    return Py_BuildValue("(KK)", (unsigned long long)s.device_total, (unsigned long long)s.reserved);
}

static PyObject *pool_record_stream(PoolObject *self, PyObject *args)
{
    PyObject *ptr_o, *stream_o;
    if (!PyArg_ParseTuple(args, "OO", &ptr_o, &stream_o)) return NULL;
    void *ptr = PyLong_AsVoidPtr(ptr_o);
    gp_stream s;
    if (PyErr_Occurred() || !parse_stream(stream_o, &s)) return NULL;
    gp_status st = gp_record_stream(self->pool, ptr, s);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

/* The capture calls may synchronise the device: without the GIL. */
static PyObject *pool_capture_prepare(PoolObject *self, PyObject *arg)
{
    gp_stream s;
    if (!parse_stream(arg, &s)) return NULL;
    gp_status st;
    Py_BEGIN_ALLOW_THREADS
    st = gp_pool_capture_prepare(self->pool, s);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *pool_capture_begin(PoolObject *self, PyObject *args)
{
    unsigned long long key;
    PyObject *stream_o;
    if (!PyArg_ParseTuple(args, "KO", &key, &stream_o)) return NULL;
    gp_stream s;
    if (!parse_stream(stream_o, &s)) return NULL;
    gp_status st = gp_pool_capture_begin(self->pool, key, s);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *pool_capture_end(PoolObject *self, PyObject *arg)
{
    gp_stream s;
    if (!parse_stream(arg, &s)) return NULL;
    gp_status st;
    Py_BEGIN_ALLOW_THREADS
    st = gp_pool_capture_end(self->pool, s);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *pool_capture_release(PoolObject *self, PyObject *arg)
{
    unsigned long long key = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    gp_status st;
    Py_BEGIN_ALLOW_THREADS
    st = gp_pool_capture_release(self->pool, key);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *pool_set_history(PoolObject *self, PyObject *args)
{
    long long max_entries;
    int stacks = 1;
    if (!PyArg_ParseTuple(args, "L|p", &max_entries, &stacks)) return NULL;
    if (max_entries < 0) {
        PyErr_Format(PyExc_ValueError, "history max_entries must be >= 0 (0 turns it off), got %lld",
                     max_entries);
        return NULL;
    }
    gp_status st = gp_pool_history(self->pool, (size_t)max_entries, stacks);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *pool_history_info(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    size_t cap, len;
    uint64_t recorded;
    gp_pool_history_info(self->pool, &cap, &len, &recorded);
    return Py_BuildValue("{s:n,s:n,s:K,s:O}", "max_entries", (Py_ssize_t)cap, "len", (Py_ssize_t)len,
                         "recorded", (unsigned long long)recorded, "stacks",
                         gp_pool_history_stacks(self->pool) ? Py_True : Py_False);
}

static PyObject *pool_history(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    size_t cap, len;
    uint64_t recorded;
    gp_pool_history_info(self->pool, &cap, &len, &recorded);
    if (!cap) return PyList_New(0);
    /* The ring may have been resized since: read at most what was allocated. */
    gp_event *ev = PyMem_RawMalloc(cap * sizeof *ev);
    if (!ev) return PyErr_NoMemory();
    size_t n;
    Py_BEGIN_ALLOW_THREADS
    n = gp_pool_history_read(self->pool, ev, cap);
    Py_END_ALLOW_THREADS
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        const gp_event *e = &ev[i];
        PyObject *t = Py_BuildValue("(KiKKKiiI)", (unsigned long long)e->time_ns, (int)e->action,
                                    (unsigned long long)e->addr, (unsigned long long)e->size,
                                    (unsigned long long)(uintptr_t)e->stream, (int)e->tag,
                                    (int)e->priority, (unsigned)e->context);
        if (!t) Py_CLEAR(l);
        else PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    PyMem_RawFree(ev);
    return l;
}

static PyObject *pool_history_note(PoolObject *self, PyObject *args)
{
    int action, tag, prio;
    unsigned long long addr, size;
    if (!PyArg_ParseTuple(args, "iKKii", &action, &addr, &size, &tag, &prio)) return NULL;
    if (tag < 0 || tag >= GP_MAX_TAGS) {
        PyErr_Format(PyExc_ValueError, "history note: tag id %d is out of range (0..%d)", tag, GP_MAX_TAGS - 1);
        return NULL;
    }
    gp_status st = gp_pool_history_note(self->pool, action, (uintptr_t)addr, size, (gp_tag)tag, prio);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

static PyMethodDef pool_methods[] = {
    GP_OFFLOAD_METHODS
    {"alloc", (PyCFunction)(void (*)(void))pool_alloc, METH_VARARGS | METH_KEYWORDS,
     "alloc(size, stream=0, tag=-1, priority=-1) -> address; tag/priority -1: this thread's context"},
    {"free", (PyCFunction)pool_free, METH_O, "free(address)"},
    {"stats", (PyCFunction)pool_stats, METH_VARARGS, "stats(full=True) -> dict of the pool's figures"},
    {"tag_stats", (PyCFunction)pool_tag_stats, METH_NOARGS, "tag_stats() -> {tag: dict}"},
    {"prio_stats", (PyCFunction)pool_prio_stats, METH_NOARGS, "prio_stats() -> {priority: (allocated, peak)}"},
    {"blocks", (PyCFunction)pool_blocks, METH_NOARGS,
     "blocks() -> [(addr, size, requested, stream, tag, priority, state, arena)] in address order"},
    {"trim", (PyCFunction)pool_trim, METH_VARARGS, "trim(bytes=all) -> bytes released"},
    {"set_limit", (PyCFunction)pool_set_limit, METH_O, "set_limit(bytes); 0 removes it"},
    {"set_tag_limit", (PyCFunction)pool_set_tag_limit, METH_VARARGS, "set_tag_limit(tag_id, bytes)"},
    {"retag", (PyCFunction)pool_retag, METH_VARARGS,
     "retag(addresses, tag_id, priority=-1) -> bytes moved; -1 keeps each block's priority"},
    {"reset_peaks", (PyCFunction)pool_reset_peaks, METH_NOARGS, "reset every peak to the current value"},
    {"last_oom", (PyCFunction)pool_last_oom, METH_NOARGS, "the last out-of-memory report"},
    {"lookup", (PyCFunction)pool_lookup, METH_O, "lookup(address) -> block tuple of the live block there"},
    {"mem_info", (PyCFunction)pool_mem_info, METH_NOARGS, "(device total, reserved)"},
    {"record_stream", (PyCFunction)pool_record_stream, METH_VARARGS,
     "record_stream(address, stream): the live block is also used on stream (Tensor.record_stream)"},
    {"capture_prepare", (PyCFunction)pool_capture_prepare, METH_O,
     "capture_prepare(stream): before a CUDA graph capture on stream (syncs, maps ahead)"},
    {"capture_begin", (PyCFunction)pool_capture_begin, METH_VARARGS,
     "capture_begin(key, stream): allocations on stream now go to graph pool key"},
    {"capture_end", (PyCFunction)pool_capture_end, METH_O, "capture_end(stream): the capture ended"},
    {"capture_release", (PyCFunction)pool_capture_release, METH_O,
     "capture_release(key): a graph holding graph pool key was released"},
    {"set_history", (PyCFunction)pool_set_history, METH_VARARGS,
     "set_history(max_entries, stacks=True): record the newest max_entries events (0: off)"},
    {"history_info", (PyCFunction)pool_history_info, METH_NOARGS,
     "{max_entries, len, recorded, stacks} of the history"},
    {"history", (PyCFunction)pool_history, METH_NOARGS,
     "history() -> [(time_ns, action, addr, size, stream, tag_id, priority, stack_id)], oldest first"},
    {"history_note", (PyCFunction)pool_history_note, METH_VARARGS,
     "history_note(action, addr, size, tag_id, priority): record an event made outside the pool"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject gp_pool_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpupool._C.Pool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A gpupool pool. Pool(capacity, options=None) makes one over the host backend.",
    .tp_new = host_pool_new,
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_methods = pool_methods,
};
