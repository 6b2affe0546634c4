/*
 * pyoffload.c -- offload's methods on the Python type Pool (offload.h),
 * over the offloader of the pool's stack (stack.h: made on first use with
 * the pool's own configuration, GPUPOOL_HOST_LIMIT and
 * GPUPOOL_OFFLOAD_THREADS).  Every call that copies or waits runs without
 * the GIL; those that move memory tell the tenant registry after
 * (gp_stack_publish).
 */
#include "codec.h"
#include "module.h"
#include "backend_host.h"

/* A list of tag ids from Python; -1 with an exception set. */
static int gp_tags_from(PyObject *seq_o, gp_tag *tags, size_t max, size_t *n)
{
    PyObject *seq = PySequence_Fast(seq_o, "tag ids must be a sequence of ints");
    if (!seq) return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (k <= 0 || (size_t)k > max) {
        PyErr_Format(PyExc_ValueError, "%zd tags given: 1 to %zu are accepted", k, max);
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (v < 0 || v >= (long)gp_tag_count()) {
            PyErr_Format(PyExc_ValueError, "tag id %ld was never interned", v);
            Py_DECREF(seq);
            return -1;
        }
        tags[i] = (gp_tag)v;
    }
    *n = (size_t)k;
    Py_DECREF(seq);
    return 0;
}

static PyObject *gp_result(const gp_offload_result *r)
{
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:d,s:s,s:K}", "bytes", (unsigned long long)r->bytes, "copied",
                         (unsigned long long)r->copied, "host_bytes", (unsigned long long)r->host_bytes,
                         "released", (unsigned long long)r->released, "kept", (unsigned long long)r->kept,
                         "seconds", r->seconds, "codec", gp_codec_id_name((gp_codec_id)r->codec), "lost",
                         (unsigned long long)r->lost);
}

static gp_offloader *gp_off_of(gp_pool_object *self)
{
    gp_offloader *o = gp_stack_offloader(self->stack, 1);
    if (!o) gp_raise(GP_ERR_NOMEM);
    return o;
}

PyObject *gp_py_offload(gp_pool_object *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"tags", "keep", "codec", "elem_size", "wait", "most", "refill", NULL};
    PyObject *tags_o;
    int keep = 1, wait = 1, refill = 0;
    const char *codec = NULL;
    unsigned elem = 0;
    unsigned long long most = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|pzIpKp", kwlist, &tags_o, &keep, &codec, &elem, &wait, &most,
                                     &refill))
        return NULL;
    gp_tag tags[GP_MAX_TAGS];
    size_t n;
    if (gp_tags_from(tags_o, tags, GP_MAX_TAGS, &n) < 0) return NULL;
    gp_config cfg;
    gp_pool_config(self->pool, &cfg);
    gp_codec_id id;
    if (gp_codec_parse(codec ? codec : cfg.codec, &id) != GP_OK) return gp_raise(GP_ERR_INVALID);
    gp_offloader *o = gp_off_of(self);
    if (!o) return NULL;
    gp_offload_opts opts = {.keep = keep, .codec = id, .elem_size = elem, .most = most, .refill = refill};
    gp_offload_result r;
    gp_status st;
    Py_BEGIN_ALLOW_THREADS
    st = wait ? gp_offload_tags(o, tags, n, &opts, &r) : gp_offload_tags_background(o, tags, n, &opts);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) return gp_raise(st);
    if (!wait) Py_RETURN_NONE; /* (the tenant figures follow at the next call) */
    gp_stack_publish(self->stack);
    return gp_result(&r);
}

/* restore's and prefetch's argument (a tag or a list of them), and the
 * pool's offloader (NULL: nothing was ever offloaded). */
static int gp_tags_arg(gp_pool_object *self, PyObject *args, gp_tag tags[GP_MAX_TAGS], size_t *n, gp_offloader **o)
{
    PyObject *tags_o;
    if (!PyArg_ParseTuple(args, "O", &tags_o) || gp_tags_from(tags_o, tags, GP_MAX_TAGS, n) < 0) return -1;
    *o = gp_stack_offloader(self->stack, 0);
    return 0;
}

PyObject *gp_py_restore(gp_pool_object *self, PyObject *args)
{
    gp_tag tags[GP_MAX_TAGS];
    size_t n;
    PyObject *tags_o;
    int accept_loss = 0;
    if (!PyArg_ParseTuple(args, "O|p", &tags_o, &accept_loss) || gp_tags_from(tags_o, tags, GP_MAX_TAGS, &n) < 0)
        return NULL;
    gp_offload_result r = {0};
    gp_status st;
    Py_BEGIN_ALLOW_THREADS /* (a tenant's restore may wait in line) */
    st = gp_stack_restore(self->stack, tags, n, accept_loss, &r);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) return gp_raise(st);
    gp_stack_publish(self->stack);
    return gp_result(&r);
}

PyObject *gp_py_prefetch(gp_pool_object *self, PyObject *args)
{
    gp_tag tags[GP_MAX_TAGS];
    size_t n;
    gp_offloader *o;
    if (gp_tags_arg(self, args, tags, &n, &o) < 0) return NULL;
    if (!o) Py_RETURN_NONE;
    gp_status st;
    Py_BEGIN_ALLOW_THREADS /* (it waits for the background offloads) */
    st = gp_prefetch_tags(o, tags, n);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

PyObject *gp_py_offload_register(gp_pool_object *self, PyObject *args)
{
    int tag, prio;
    unsigned elem = 0;
    if (!PyArg_ParseTuple(args, "ii|I", &tag, &prio, &elem)) return NULL;
    if (tag < 0 || tag >= (int)gp_tag_count()) {
        PyErr_Format(PyExc_ValueError, "tag id %d was never interned", tag);
        return NULL;
    }
    gp_offloader *o = gp_off_of(self);
    if (!o) return NULL;
    gp_status st = gp_offload_register(o, (gp_tag)tag, prio, elem);
    if (st != GP_OK) return gp_raise(st);
    gp_stack_publish(self->stack);
    Py_RETURN_NONE;
}

PyObject *gp_py_offload_use(gp_pool_object *self, PyObject *args)
{
    int tag, busy;
    if (!PyArg_ParseTuple(args, "ip", &tag, &busy)) return NULL;
    if (tag < 0 || tag >= (int)gp_tag_count()) {
        PyErr_Format(PyExc_ValueError, "tag id %d was never interned", tag);
        return NULL;
    }
    gp_offloader *o = gp_stack_offloader(self->stack, 0);
    if (!o) Py_RETURN_NONE; /* nothing registered: nothing to mark */
    gp_status st = gp_offload_use(o, (gp_tag)tag, busy);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

PyObject *gp_py_offload_stats(gp_pool_object *self, PyObject *args)
{
    int create = 0;
    if (!PyArg_ParseTuple(args, "|p", &create)) return NULL;
    gp_offloader *o = gp_stack_offloader(self->stack, create);
    if (!o) {
        if (create) return gp_raise(GP_ERR_NOMEM);
        Py_RETURN_NONE;
    }
    static _Thread_local gp_offload_stats s; /* 8 KiB: off the stack */
    gp_offload_stats_get(o, &s);
    PyObject *tags = PyDict_New();
    unsigned nt = gp_tag_count();
    for (unsigned t = 0; tags && t < nt; t++) {
        if (!s.tag_host_bytes[t] && !gp_offload_is_offloaded(o, (gp_tag)t)) continue;
        PyObject *v = Py_BuildValue("{s:K,s:O}", "host_bytes", (unsigned long long)s.tag_host_bytes[t], "offloaded",
                                    gp_offload_is_offloaded(o, (gp_tag)t) ? Py_True : Py_False);
        if (!v || PyDict_SetItemString(tags, gp_tag_name((gp_tag)t), v) < 0) Py_CLEAR(tags);
        Py_XDECREF(v);
    }
    if (!tags) return NULL;
    PyObject *d = PyDict_New(), *v; /* offload.h's figures, then "tags" */
#define GP_OFFLOAD_STAT_PUT(field)                                                        \
    v = d ? PyLong_FromUnsignedLongLong(s.field) : NULL;                                  \
    if (d && (!v || PyDict_SetItemString(d, #field, v) < 0)) Py_CLEAR(d);                 \
    Py_XDECREF(v);
    GP_OFFLOAD_STATS_FIELDS(GP_OFFLOAD_STAT_PUT)
#undef GP_OFFLOAD_STAT_PUT
    if (d && PyDict_SetItemString(d, "tags", tags) < 0) Py_CLEAR(d);
    Py_DECREF(tags);
    return d;
}

PyObject *gp_py_offload_corrupt(gp_pool_object *self, PyObject *arg)
{
    long tag = PyLong_AsLong(arg);
    if (tag == -1 && PyErr_Occurred()) return NULL;
    gp_offloader *o = gp_stack_offloader(self->stack, 0);
    if (!o || tag < 0 || tag >= (long)gp_tag_count()) {
        PyErr_Format(PyExc_ValueError, "tag id %ld has nothing offloaded", tag);
        return NULL;
    }
    gp_status st = gp_offload_corrupt_for_test(o, (gp_tag)tag);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

PyObject *gp_py_tag_mixed(gp_pool_object *self, PyObject *arg)
{
    long tag = PyLong_AsLong(arg);
    if (tag == -1 && PyErr_Occurred()) return NULL;
    if (tag < 0 || tag >= GP_MAX_TAGS) tag = GP_MAX_TAGS; /* rejected, with its message, below */
    size_t cap = 256, n = 0;
    unsigned graphs = 0;
    uintptr_t *addrs = NULL;
    gp_status st;
    for (;;) {
        uintptr_t *more = PyMem_RawRealloc(addrs, cap * sizeof *addrs);
        if (!more) {
            PyMem_RawFree(addrs);
            return PyErr_NoMemory();
        }
        addrs = more;
        Py_BEGIN_ALLOW_THREADS
        st = gp_pool_tag_mixed(self->pool, (gp_tag)tag, addrs, cap, &n, &graphs);
        Py_END_ALLOW_THREADS
        if (st != GP_OK || n <= cap) break;
        cap = n + n / 4; /* (blocks came meanwhile: room for some more) */
    }
    PyObject *list = st == GP_OK ? PyList_New((Py_ssize_t)n) : NULL;
    for (size_t i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(addrs[i]);
        if (!v) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    PyMem_RawFree(addrs);
    if (st != GP_OK) return gp_raise(st);
    if (!list) return NULL;
    return Py_BuildValue("(NI)", list, graphs);
}

/* The pool whose blocks this thread hands out (gp_set_handout). */
static _Thread_local gp_pool_object *t_apart;

PyObject *gp_py_apart_begin(gp_pool_object *self, PyObject *args)
{
    PyObject *sizes_o, *stream_o;
    int tag, prio;
    if (!PyArg_ParseTuple(args, "OiiO", &sizes_o, &tag, &prio, &stream_o)) return NULL;
    if (t_apart) {
        PyErr_SetString(PyExc_RuntimeError, "apart_begin: this thread hands out blocks already (apart_end first)");
        return NULL;
    }
    uint64_t stream;
    if (gp_u64_arg(stream_o, "stream", 0, UINTPTR_MAX, &stream) < 0) return NULL;
    PyObject *seq = PySequence_Fast(sizes_o, "apart_begin(sizes, ...): sizes must be a sequence of ints");
    if (!seq) return NULL;
    size_t n = (size_t)PySequence_Fast_GET_SIZE(seq);
    uint64_t *sizes = PyMem_RawMalloc((n ? n : 1) * sizeof *sizes);
    void **ptrs = PyMem_RawMalloc((n ? n : 1) * sizeof *ptrs);
    int ok = sizes && ptrs;
    if (!ok) PyErr_NoMemory();
    for (size_t i = 0; ok && i < n; i++)
        ok = gp_u64_arg(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i), "size", 1, GP_U64_MAX, &sizes[i]) == 0;
    Py_DECREF(seq);
    if (tag < 0 || tag >= GP_MAX_TAGS) tag = GP_MAX_TAGS; /* rejected, with its message, below */
    gp_status st = GP_OK;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        st = gp_pool_alloc_apart(self->pool, sizes, n, (gp_stream)(uintptr_t)stream, (gp_tag)tag,
                                 prio, ptrs);
        Py_END_ALLOW_THREADS
    }
    PyObject *list = ok && st == GP_OK ? PyList_New((Py_ssize_t)n) : NULL;
    for (size_t i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromVoidPtr(ptrs[i]);
        if (!v) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    if (!list) {
        for (size_t i = 0; ok && st == GP_OK && i < n; i++) gp_free(self->pool, ptrs[i]);
        PyMem_RawFree(sizes);
        PyMem_RawFree(ptrs);
        return ok && st != GP_OK ? gp_raise(st) : NULL;
    }
    Py_INCREF(self);
    t_apart = self;
    gp_set_handout((gp_handout){.ptrs = ptrs, .sizes = sizes, .n = n, .device = gp_pool_backend(self->pool)->device});
    return list;
}

PyObject *gp_py_apart_end(gp_pool_object *self, PyObject *noargs)
{
    (void)noargs;
    if (t_apart != self) {
        PyErr_SetString(PyExc_RuntimeError, "apart_end: this thread hands out no blocks of this pool");
        return NULL;
    }
    gp_handout h = gp_set_handout((gp_handout){0});
    for (size_t i = h.next; i < h.n; i++) gp_free(self->pool, h.ptrs[i]);
    PyMem_RawFree(h.ptrs);
    PyMem_RawFree(h.sizes);
    t_apart = NULL;
    Py_DECREF(self);
    return PyLong_FromSize_t(h.next);
}

PyObject *gp_py_host_fail(gp_pool_object *self, PyObject *args)
{
    const char *fn;
    unsigned long long nth;
    int from = 0;
    if (!PyArg_ParseTuple(args, "sK|p", &fn, &nth, &from)) return NULL;
    gp_backend *be = gp_pool_backend(self->pool);
    if (strcmp(be->name, "host") != 0) {
        PyErr_SetString(PyExc_ValueError, "fault injection needs a HostPool (the host backend)");
        return NULL;
    }
    for (int k = 0; k < GP_HOST_FN_COUNT; k++)
        if (strcmp(fn, gp_host_fn_name((gp_host_fn)k)) == 0) {
            gp_host_fail(be, (gp_host_fn)k, nth, GP_ERR_BACKEND, from ? GP_HOST_FAIL_FROM : GP_HOST_FAIL_ONCE);
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "no backend function '%s' to fail (copy, map, unmap, event_wait, ...)", fn);
    return NULL;
}
