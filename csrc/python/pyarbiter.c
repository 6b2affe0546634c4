/*
 * pyarbiter.c -- the Python face of the tenant registry (arbiter.h), as
 * functions of gpupool._C (tenant_*): yield points, and reading the
 * registries of the machine for `python -m gpupool top`.
 */
#include <dirent.h>
#include <stddef.h>
#include <string.h>

#include "arbiter.h"
#include "module.h"

static PyObject *a_yield_point(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long need = 0;
    if (!PyArg_ParseTuple(args, "|K", &need)) return NULL;
    uint64_t given;
    Py_BEGIN_ALLOW_THREADS
    given = gp_stack_yield_all(need);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(given);
}

static int put(PyObject *d, const char *k, PyObject *v)
{
    int rc = v ? PyDict_SetItemString(d, k, v) : -1;
    Py_XDECREF(v);
    return rc;
}

static int put_u(PyObject *d, const char *k, uint64_t v) { return put(d, k, PyLong_FromUnsignedLongLong(v)); }

/* The figures of gp_tenant_info, from arbiter.h's list. */
static const struct {
    const char *key;
    size_t offset;
    int unit;
} tenant_figures[] = {
#define GP_TENANT_ROW(field, key, unit) {key, offsetof(gp_tenant_info, field), unit},
    GP_TENANT_FIGURES(GP_TENANT_ROW)
#undef GP_TENANT_ROW
};

static PyObject *tenant_dict(const gp_tenant_info *t)
{
    PyObject *d = PyDict_New(), *lat = PyList_New(t->n_lat);
    if (!d || !lat) goto fail;
    for (uint32_t i = 0; i < t->n_lat; i++) {
        PyObject *x = PyFloat_FromDouble(t->lat_us[i] / 1e6);
        if (!x) goto fail;
        PyList_SET_ITEM(lat, i, x);
    }
    if (put(d, "latencies_s", lat)) goto fail_d; /* (takes lat either way) */
    if (put(d, "pid", PyLong_FromLong(t->pid)) || put(d, "name", PyUnicode_DecodeUTF8(t->name, strlen(t->name), "replace")) ||
        put(d, "priority", PyLong_FromLong(t->priority)) || put(d, "self", PyBool_FromLong(t->self)))
        goto fail_d;
    for (size_t i = 0; i < sizeof tenant_figures / sizeof tenant_figures[0]; i++) {
        uint64_t v;
        memcpy(&v, (const char *)t + tenant_figures[i].offset, sizeof v);
        if (put(d, tenant_figures[i].key,
                tenant_figures[i].unit == GP_TENANT_NS ? PyFloat_FromDouble(v / 1e9) : PyLong_FromUnsignedLongLong(v)))
            goto fail_d;
    }
    return d;
fail:
    Py_XDECREF(lat);
fail_d:
    Py_XDECREF(d);
    return NULL;
}

static PyObject *a_read(PyObject *self, PyObject *args)
{
    (void)self;
    const char *group, *device;
    if (!PyArg_ParseTuple(args, "ss", &group, &device)) return NULL;
    gp_group_info g;
    gp_tenant_info t[GP_ARB_SLOTS];
    gp_status st;
    Py_BEGIN_ALLOW_THREADS
    st = gp_arbiter_read(group, device, &g, t, GP_ARB_SLOTS);
    Py_END_ALLOW_THREADS
    if (st == GP_ERR_FOREIGN) Py_RETURN_NONE;
    if (st != GP_OK) return gp_raise(st);
    PyObject *d = PyDict_New(), *list = PyList_New(0);
    if (!d || !list) goto fail;
    for (size_t i = 0; i < g.n_tenants && i < GP_ARB_SLOTS; i++) {
        PyObject *x = tenant_dict(&t[i]);
        if (!x || PyList_Append(list, x) < 0) {
            Py_XDECREF(x);
            goto fail;
        }
        Py_DECREF(x);
    }
    if (put(d, "group", PyUnicode_FromString(g.group)) || put(d, "device", PyUnicode_FromString(g.device)) ||
        put_u(d, "limit", g.limit) || put_u(d, "total", g.total) || put_u(d, "registered", g.n_registered) ||
        put_u(d, "reaped", g.n_reaped) || PyDict_SetItemString(d, "tenants", list) < 0)
        goto fail;
    Py_DECREF(list);
    return d;
fail:
    Py_XDECREF(list);
    Py_XDECREF(d);
    return NULL;
}

/* (group, device) of the registries in /dev/shm, where Linux keeps POSIX
 * shared memory: "gpupool.<device>.<group>" (a device id has no '.'). */
static PyObject *a_registries(PyObject *self, PyObject *noargs)
{
    (void)self, (void)noargs;
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    DIR *dir = opendir("/dev/shm");
    if (!dir) return list;
    for (struct dirent *e; (e = readdir(dir));) {
        const char *dot;
        if (strncmp(e->d_name, "gpupool.", 8) != 0 || !(dot = strchr(e->d_name + 8, '.'))) continue;
        PyObject *x = Py_BuildValue("(ss#)", dot + 1, e->d_name + 8, (Py_ssize_t)(dot - e->d_name - 8));
        if (!x || PyList_Append(list, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(list);
            closedir(dir);
            return NULL;
        }
        Py_DECREF(x);
    }
    closedir(dir);
    if (PyList_Sort(list) < 0) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

static PyObject *a_unlink(PyObject *self, PyObject *args)
{
    (void)self;
    const char *group, *device;
    if (!PyArg_ParseTuple(args, "ss", &group, &device)) return NULL;
    gp_status st = gp_arbiter_unlink(group, device);
    if (st == GP_ERR_FOREIGN) Py_RETURN_FALSE;
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_TRUE;
}

static PyMethodDef arbiter_methods[] = {
    {"tenant_yield", a_yield_point, METH_VARARGS,
     "yield_point(need=0) -> bytes given: a safe point between steps of this process's tenants "
     "(gp_arbiter_yield)"},
    {"tenant_read", a_read, METH_VARARGS,
     "read(group, device) -> {group, device, limit, total, registered, reaped, tenants: [...]} or None"},
    {"tenant_registries", a_registries, METH_NOARGS, "[(group, device)] of the registries on this machine"},
    {"tenant_unlink", a_unlink, METH_VARARGS, "tenant_unlink(group, device) -> whether a registry was removed"},
    {NULL, NULL, 0, NULL},
};

int gp_pyarbiter_register(PyObject *m)
{
    if (PyModule_AddFunctions(m, arbiter_methods) < 0 || PyModule_AddIntConstant(m, "TENANT_SLOTS", GP_ARB_SLOTS) < 0 ||
        PyModule_AddIntConstant(m, "RECLAIM_CACHE", GP_RECLAIM_CACHE) < 0 ||
        PyModule_AddIntConstant(m, "RECLAIM_OFFLOAD", GP_RECLAIM_OFFLOAD) < 0)
        return -1;
    return 0;
}
