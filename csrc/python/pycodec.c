/*
 * pycodec.c -- the codec layer's Python side: where to find nvCOMP (the
 * package registers the wheel's folder, gpupool/_nvcomp.py), whether it
 * loads, the codec names, and the checksum, for tests and diagnostics.
 * module.c adds these functions to gpupool._C with gp_pycodec_register.
 */
#include "checksum.h"
#include "codec.h"
#include "module.h"

static PyObject *m_nvcomp_search_dir(PyObject *self, PyObject *args)
{
    (void)self;
    const char *dir;
    if (!PyArg_ParseTuple(args, "s", &dir)) return NULL;
    gp_status st = gp_nvcomp_search_dir(dir);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *m_nvcomp_load(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path = NULL;
    if (!PyArg_ParseTuple(args, "|z", &path)) return NULL;
    gp_status st;
    Py_BEGIN_ALLOW_THREADS /* dlopen of a 25 MB library */
    st = gp_nvcomp_load(path);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) return gp_raise(st);
    unsigned version = 0;
    const char *from = gp_nvcomp_loaded(&version);
    return Py_BuildValue("(sI)", from, version);
}

static PyObject *m_codec_names(PyObject *self, PyObject *noargs)
{
    (void)self, (void)noargs;
    PyObject *t = PyTuple_New(GP_CODEC_COUNT);
    for (int i = 0; t && i < GP_CODEC_COUNT; i++) {
        PyObject *s = PyUnicode_FromString(gp_codec_id_name((gp_codec_id)i));
        if (!s) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static PyObject *m_checksum(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer buf;
    unsigned long long seed = 0;
    if (!PyArg_ParseTuple(args, "y*|K", &buf, &seed)) return NULL;
    uint64_t h;
    Py_BEGIN_ALLOW_THREADS
    h = gp_checksum(buf.buf, (size_t)buf.len, seed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef pycodec_methods[] = {
    {"nvcomp_search_dir", m_nvcomp_search_dir, METH_VARARGS,
     "nvcomp_search_dir(folder): look for libnvcomp.so.6 there too (after GPUPOOL_NVCOMP, before the system)"},
    {"nvcomp_load", m_nvcomp_load, METH_VARARGS,
     "nvcomp_load(path=None) -> (file, version): load nvCOMP 6 once per process; RuntimeError saying where "
     "it looked and how to install it"},
    {"codec_names", m_codec_names, METH_NOARGS, "the codec names GPUPOOL_CODEC and offload() accept"},
    {"checksum", m_checksum, METH_VARARGS,
     "checksum(buffer, seed=0) -> int: the 64-bit hash offload keeps per stored chunk"},
    {NULL, NULL, 0, NULL},
};

int gp_pycodec_register(PyObject *module) { return PyModule_AddFunctions(module, pycodec_methods); }
