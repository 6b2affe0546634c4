/*
 * module.c -- the module gpupool._C: configuration, tags and the thread's
 * context, the device registry's Python side, build information and the
 * PyTorch ABI hooks.  The Pool type is pypool.c; what PyTorch calls is
 * allocator.c.
 */
#include <stdint.h>

#include "module.h"
#include "pystack.h"
#include "torch_abi.h"

/* ------------------------------------------------------ module functions */

static PyObject *m_configure(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *opts = NULL;
    if (!PyArg_ParseTuple(args, "|O", &opts)) return NULL;
    if (opts && opts != Py_None && !PyDict_Check(opts)) {
        PyErr_SetString(PyExc_TypeError, "configure(options): options must be a dict or None");
        return NULL;
    }
    gp_config cfg;
    if (gp_config_from_py(opts, 1, 0, &cfg) < 0) return NULL;
    if (gp_registry_configure(&cfg) < 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "gpupool: configure() after a device pool was created; call gpupool.enable() "
                        "once, before the first CUDA allocation");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *m_config(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    gp_config cfg;
    gp_registry_config(&cfg);
    size_t n;
    const gp_option_info *o = gp_config_options(&n);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (size_t i = 0; i < n; i++) {
        char buf[128];
        gp_config_get(&cfg, o[i].key, buf, sizeof buf);
        PyObject *v = PyUnicode_FromString(buf);
        if (!v || PyDict_SetItemString(d, o[i].key, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *m_config_options(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    size_t n;
    const gp_option_info *o = gp_config_options(&n);
    PyObject *l = PyList_New((Py_ssize_t)n);
    if (!l) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(sssss)", o[i].env, o[i].key, o[i].def, o[i].accepted, o[i].help);
        if (!t) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    return l;
}

static PyObject *m_parse_size(PyObject *self, PyObject *args)
{
    (void)self;
    const char *text;
    int frac = 1;
    if (!PyArg_ParseTuple(args, "s|p", &text, &frac)) return NULL;
    gp_size_spec s;
    gp_status st = gp_parse_size(text, frac, &s);
    if (st != GP_OK) return gp_raise(st);
    return Py_BuildValue("(Kd)", (unsigned long long)s.bytes, s.fraction);
}

static PyObject *m_parse_priority(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *text = PyUnicode_AsUTF8(arg);
    if (!text) return NULL;
    int p;
    gp_status st = gp_parse_priority(text, &p);
    if (st != GP_OK) return gp_raise(st);
    return PyLong_FromLong(p);
}

static PyObject *m_tag_intern(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    gp_tag t;
    gp_status st = gp_tag_intern(name, &t);
    if (st != GP_OK) return gp_raise(st);
    return PyLong_FromLong(t);
}

static PyObject *m_tag_name(PyObject *self, PyObject *arg)
{
    (void)self;
    long t = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return NULL;
    const char *n = t >= 0 && t < GP_MAX_TAGS ? gp_tag_name((gp_tag)t) : NULL;
    if (!n) {
        PyErr_Format(PyExc_ValueError, "tag id %ld was never interned", t);
        return NULL;
    }
    return PyUnicode_FromString(n);
}

static PyObject *m_set_context(PyObject *self, PyObject *args)
{
    (void)self;
    int tag, prio, old_tag, old_prio;
    if (!PyArg_ParseTuple(args, "ii", &tag, &prio)) return NULL;
    if (tag < -1 || tag >= (int)gp_tag_count() || prio < GP_PRIO_DEFAULT || prio > GP_PRIO_MAX) {
        PyErr_Format(PyExc_ValueError, "bad context: tag %d, priority %d", tag, prio);
        return NULL;
    }
    gp_context_set(tag, prio, &old_tag, &old_prio);
    return Py_BuildValue("(ii)", old_tag, old_prio);
}

static PyObject *m_set_inherited(PyObject *self, PyObject *args)
{
    (void)self;
    int tag, prio, old_tag, old_prio;
    if (!PyArg_ParseTuple(args, "ii", &tag, &prio)) return NULL;
    if (tag < 0 || tag >= (int)gp_tag_count() || prio < GP_PRIO_DEFAULT || prio > GP_PRIO_MAX) {
        PyErr_Format(PyExc_ValueError, "bad inherited context: tag %d, priority %d", tag, prio);
        return NULL;
    }
    gp_context_set_inherited(tag, prio, &old_tag, &old_prio);
    return Py_BuildValue("(ii)", old_tag, old_prio);
}

static PyObject *m_tag_lifetime(PyObject *self, PyObject *args)
{
    (void)self;
    int tag, life = -1;
    if (!PyArg_ParseTuple(args, "i|i", &tag, &life)) return NULL;
    if (tag < 0 || tag >= GP_MAX_TAGS || !gp_tag_name((gp_tag)tag)) {
        PyErr_Format(PyExc_ValueError, "tag id %d was never interned", tag);
        return NULL;
    }
    int old = gp_tag_lifetime((gp_tag)tag);
    if (life >= 0) {
        gp_status st = gp_tag_set_lifetime((gp_tag)tag, life);
        if (st != GP_OK) return gp_raise(st);
    }
    return PyLong_FromLong(old);
}

static PyObject *m_get_context(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    gp_tag tag;
    int prio, own;
    gp_context(&tag, &prio, &own);
    return Py_BuildValue("(iii)", (int)tag, prio, own);
}

static PyObject *m_device_pool(PyObject *self, PyObject *args)
{
    (void)self;
    int device, create = 0;
    if (!PyArg_ParseTuple(args, "i|p", &device, &create)) return NULL;
    gp_stack *p = gp_registry_get(device);
    if (!p && create) {
        p = gp_registry_stack(device);
        if (!p) {
            PyErr_Format(PyExc_RuntimeError, "gpupool: cannot create the pool of device %d: %s",
                         device, gp_registry_error()[0] ? gp_registry_error() : gp_last_error());
            return NULL;
        }
    }
    if (!p) Py_RETURN_NONE;
    return gp_pool_wrap(p, 0);
}

static PyObject *m_devices(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    PyObject *l = PyList_New(0);
    for (int i = 0; l && i < GP_MAX_DEVICES; i++) {
        if (!gp_registry_get(i)) continue;
        PyObject *v = PyLong_FromLong(i);
        if (!v || PyList_Append(l, v) < 0) { Py_XDECREF(v); Py_DECREF(l); return NULL; }
        Py_DECREF(v);
    }
    return l;
}

static PyObject *m_free_errors(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromUnsignedLongLong(gp_registry_free_errors());
}

/* zstd: the host codec's libzstd, built in and loadable here (it is
 * loaded with dlopen, not linked: codec_zstd.c). */
int gp_codec_zstd_available(void);

/* The version is pyproject.toml's, which setup.py passes to the compiler:
 * one number for the package, the extension and gpupool.__version__. */
#ifndef GP_VERSION
#error "GP_VERSION is not defined: setup.py defines it from pyproject.toml's version"
#endif

static PyObject *m_build_info(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return Py_BuildValue("{s:s,s:O,s:s}", "version", GP_VERSION, "zstd", gp_codec_zstd_available() ? Py_True : Py_False,
                         "compiler", __VERSION__);
}

static PyObject *m_torch_throw_missing(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    const char *m = gp_torch_throw_missing();
    if (!m) Py_RETURN_NONE;
    return PyUnicode_FromString(m);
}

static PyObject *m_use_host_backend(PyObject *self, PyObject *arg)
{
    (void)self;
    uint64_t capacity;
    if (gp_u64_arg(arg, "use_host_backend: capacity", 0, GP_U64_MAX, &capacity) < 0) return NULL;
    if (gp_registry_use_host(capacity) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "gpupool: use_host_backend() after a device pool was created");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *m_stack_frames(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long id = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred()) return NULL;
    return gp_pystack_frames((uint32_t)id);
}

static PyMethodDef module_methods[] = {
    {"configure", m_configure, METH_VARARGS,
     "configure(options=None): defaults, then GPUPOOL_* variables, then options; before the first device pool"},
    {"config", m_config, METH_NOARGS, "config() -> {key: value as text} in force"},
    {"config_options", m_config_options, METH_NOARGS, "[(env, key, default, accepted, help)]"},
    {"parse_size", m_parse_size, METH_VARARGS, "parse_size(text, allow_fraction=True) -> (bytes, fraction)"},
    {"parse_priority", m_parse_priority, METH_O, "parse_priority(text) -> int"},
    {"tag_intern", m_tag_intern, METH_O, "tag_intern(name) -> id"},
    {"tag_name", m_tag_name, METH_O, "tag_name(id) -> name"},
    {"set_context", m_set_context, METH_VARARGS,
     "set_context(tag_id, priority) -> previous (tag_id, priority) of this thread; tag -1: none of "
     "its own (the inherited context applies), priority -1: the pool's default"},
    {"get_context", m_get_context, METH_NOARGS,
     "(tag_id, priority, own) this thread allocates under now; own: set on this thread, else inherited"},
    {"set_inherited", m_set_inherited, METH_VARARGS,
     "set_inherited(tag_id, priority) -> previous: the context of threads without one of their own"},
    {"tag_lifetime", m_tag_lifetime, METH_VARARGS,
     "tag_lifetime(tag_id, lifetime=-1) -> lifetime before (0 short, 1 long); sets it unless -1"},
    {"device_pool", m_device_pool, METH_VARARGS, "device_pool(device, create=False) -> Pool or None"},
    {"devices", m_devices, METH_NOARGS, "devices with a pool"},
    {"free_errors", m_free_errors, METH_NOARGS, "frees PyTorch made that gpupool rejected"},
    {"build_info", m_build_info, METH_NOARGS, "how the extension was built"},
    {"stack_frames", m_stack_frames, METH_O,
     "stack_frames(stack_id) -> [{filename, line, name}], innermost first, of a history stack"},
    {"torch_throw_missing", m_torch_throw_missing, METH_NOARGS,
     "None when allocation failures can raise through PyTorch (torch.OutOfMemoryError, "
     "RuntimeError), else the C++ symbol gpupool lacks"},
    {"use_host_backend", m_use_host_backend, METH_O,
     "use_host_backend(capacity): for tests without a GPU, device pools made from now on run over "
     "the host backend with capacity bytes each (0: CUDA again); before the first device pool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "gpupool._C",
    "gpupool's C core: pools, configuration, tags, and the allocator symbols for PyTorch.",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

/* PRIORITY_NAMES: the names of priorities 0 up ("low", ...). */
static int gp_priority_names_add(PyObject *m)
{
    PyObject *t = PyTuple_New(GP_PRIO_NAMED);
    if (!t) return -1;
    for (int i = 0; i < GP_PRIO_NAMED; i++) {
        PyObject *s = PyUnicode_FromString(gp_priority_name(i));
        if (!s) {
            Py_DECREF(t);
            return -1;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    if (PyModule_AddObject(m, "PRIORITY_NAMES", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__C(void)
{
    if (PyType_Ready(&gp_pool_type) < 0) return NULL;
    gp_stack_set_context_source(gp_pystack_capture); /* history stacks are Python's */
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    Py_INCREF(&gp_pool_type);
    if (PyModule_AddObject(m, "Pool", (PyObject *)&gp_pool_type) < 0 ||
        PyModule_AddIntConstant(m, "MAX_TAGS", GP_MAX_TAGS) < 0 ||
        PyModule_AddIntConstant(m, "PRIO_MAX", GP_PRIO_MAX) < 0 ||
        PyModule_AddIntConstant(m, "HISTORY_DEFAULT", GP_HISTORY_DEFAULT) < 0 ||
        gp_stats_fields_add(m) < 0 || gp_priority_names_add(m) < 0 || gp_pycodec_register(m) < 0 ||
        gp_pyarbiter_register(m) < 0 || gp_pytorch_methods_register(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
