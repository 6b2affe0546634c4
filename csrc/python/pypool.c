/*
 * pypool.c -- the Python type gpupool._C.Pool over any allocator stack
 * (stack.h): a device's (not owned) or a HostPool's over the host backend
 * (owned), with the same methods, so that the whole Python API is tested
 * without a GPU.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "module.h"

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

PyObject *gp_pool_wrap(gp_stack *s, int owned)
{
    PoolObject *o = PyObject_New(PoolObject, &gp_pool_type);
    if (!o) {
        if (owned) gp_stack_destroy(s);
        return NULL;
    }
    o->stack = s;
    o->pool = gp_stack_pool(s);
    o->owned = owned;
    return (PyObject *)o;
}

static void pool_dealloc(PoolObject *self)
{
    if (self->owned) gp_stack_destroy(self->stack);
    PyObject_Free(self);
}

/* Objects over one stack are one pool (device_pool() wraps the device's
 * anew at each call): equal, with one hash, so that callers can group by
 * pool. */
static PyObject *pool_richcompare(PyObject *a, PyObject *b, int op)
{
    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, &gp_pool_type)) Py_RETURN_NOTIMPLEMENTED;
    int same = ((PoolObject *)a)->stack == ((PoolObject *)b)->stack;
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static Py_hash_t pool_hash(PyObject *o)
{
    Py_hash_t h = (Py_hash_t)((uintptr_t)((PoolObject *)o)->stack >> 4); /* (allocations are 16-aligned) */
    return h == -1 ? -2 : h;
}

/* o as an integer in [lo, hi] (at most 2**64-1), into *out; else -1 with
 * the exception naming `what`, the value and the range: "K" and
 * PyLong_AsUnsignedLongLong's masking variants silently cut 2**64 + 1 to 1. */
int gp_u64_arg(PyObject *o, const char *what, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.80s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    int fits = !(v == (unsigned long long)-1 && PyErr_Occurred());
    if (!fits) PyErr_Clear();
    if (fits && v >= lo && v <= hi) {
        *out = v;
        return 0;
    }
    PyErr_Format(fits ? PyExc_ValueError : PyExc_OverflowError, "%s %R is out of range: %llu..%llu",
                 what, o, (unsigned long long)lo, (unsigned long long)hi);
    return -1;
}

/* Build a config from defaults, GPUPOOL_* (when use_env) and a dict, and
 * check what single options cannot (gp_config_validate). */
int gp_config_from_py(PyObject *opts, int use_env, uint64_t device_total, gp_config *cfg)
{
    gp_config_default(cfg);
    if (use_env && gp_config_from_env(cfg) != GP_OK) {
        gp_raise(GP_ERR_INVALID);
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (opts && opts != Py_None && PyDict_Next(opts, &pos, &key, &value)) {
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
    if (gp_config_validate(cfg, device_total) != GP_OK) {
        gp_raise(GP_ERR_INVALID);
        return -1;
    }
    return 0;
}

static PyObject *host_pool_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)type;
    static char *kwlist[] = {"capacity", "options", NULL};
    PyObject *cap_o, *opts = NULL;
    uint64_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O!", kwlist, &cap_o, &PyDict_Type, &opts)) return NULL;
    if (gp_u64_arg(cap_o, "HostPool capacity", 1, GP_U64_MAX, &capacity) < 0) return NULL;
    gp_config cfg;
    if (gp_config_from_py(opts, 0, capacity, &cfg) < 0) return NULL;
    gp_backend *be;
    gp_stack *s;
    gp_status st = gp_backend_host_create(capacity, &be);
    /* (a tenant of group cfg.tenant on device "host" when one is set) */
    if (st == GP_OK) st = gp_stack_create(be, "host", &cfg, &s);
    if (st != GP_OK) return gp_raise(st);
    return gp_pool_wrap(s, 1);
}

static int parse_stream(PyObject *o, gp_stream *out)
{
    uint64_t v = 0;
    if (o && o != Py_None && gp_u64_arg(o, "stream", 0, UINTPTR_MAX, &v) < 0) return 0;
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
    if (tag >= GP_MAX_TAGS || tag < -1) {
        /* A cast to gp_tag would wrap 65536 + 5 to tag 5. */
        PyErr_Format(PyExc_ValueError, "alloc: tag id %d is out of range (-1 or 0..%d)", tag, GP_MAX_TAGS - 1);
        return NULL;
    }
    gp_tag ctag;
    int cprio;
    int own;
    gp_context(&ctag, &cprio, &own);
    gp_status st;
    void *r;
    gp_tag t = tag >= 0 ? (gp_tag)tag : ctag;
    int pr = prio >= 0 ? prio : cprio;
    Py_BEGIN_ALLOW_THREADS /* (a tenant may wait for memory) */
    r = gp_stack_alloc(self->stack, (size_t)size, s, t, pr, &st);
    Py_END_ALLOW_THREADS
    if (!r) return gp_raise(st);
    return PyLong_FromVoidPtr(r);
}

static PyObject *pool_free(PoolObject *self, PyObject *arg)
{
    void *ptr = PyLong_AsVoidPtr(arg);
    if (PyErr_Occurred()) return NULL;
    gp_status st;
    Py_BEGIN_ALLOW_THREADS /* (a tenant answers what others asked: it may trim, offload) */
    st = gp_stack_free(self->stack, ptr);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------ statistics */

/* The figures as rows (gpupool.h's lists): the dicts of stats() and the
 * tuples _C.STATS_FIELDS / _C.TAG_STATS_FIELDS are made from these. */
typedef struct gp_field {
    const char *name;
    int kind;          /* GP_STAT_* */
    const char *torch; /* torch.cuda.memory_stats() key, or NULL */
    size_t offset;
} gp_field;

#define GP_POOL_ROW(f, kind, key) {#f, kind, key, offsetof(gp_stats, f)},
#define GP_TAG_ROW(f, kind, key) {#f, kind, key, offsetof(gp_tag_stats, f)},
#define GP_PRIO_ROW(f, kind, key) {#f, kind, key, offsetof(gp_prio_stats, f)},
static const gp_field gp_pool_fields[] = {GP_STATS_FIELDS(GP_POOL_ROW)};
static const gp_field gp_tag_fields[] = {GP_TAG_STATS_FIELDS(GP_TAG_ROW)};
static const gp_field gp_prio_fields[] = {GP_PRIO_STATS_FIELDS(GP_PRIO_ROW)};
#undef GP_POOL_ROW
#undef GP_TAG_ROW
#undef GP_PRIO_ROW
#define GP_N_POOL_FIELDS (sizeof gp_pool_fields / sizeof gp_pool_fields[0])
#define GP_N_TAG_FIELDS (sizeof gp_tag_fields / sizeof gp_tag_fields[0])
#define GP_N_PRIO_FIELDS (sizeof gp_prio_fields / sizeof gp_prio_fields[0])

/* The dict keys, interned once: stats() is meant to be called every step,
 * and making the key strings anew for every tag was most of its cost. */
static PyObject *g_pool_keys[GP_N_POOL_FIELDS], *g_tag_keys[GP_N_TAG_FIELDS],
    *g_prio_keys[GP_N_PRIO_FIELDS];

/* {name: value} of the n rows of `fields` read from the struct at src. */
static PyObject *fields_dict(const gp_field *fields, size_t n, PyObject **keys, const void *src)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        if (!keys[i] && !(keys[i] = PyUnicode_InternFromString(fields[i].name))) break;
        uint64_t v;
        memcpy(&v, (const char *)src + fields[i].offset, sizeof v);
        PyObject *x = PyLong_FromUnsignedLongLong((unsigned long long)v);
        int rc = x ? PyDict_SetItem(d, keys[i], x) : -1;
        Py_XDECREF(x);
        if (rc < 0) Py_CLEAR(d);
    }
    if (d && PyErr_Occurred()) Py_CLEAR(d);
    return d;
}

/* ((name, kind, torch key or None), ...) */
static PyObject *fields_tuple(const gp_field *fields, size_t n)
{
    static const char *const kinds[] = {"current", "peak", "total"};
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; t && i < n; i++) {
        PyObject *row = Py_BuildValue("(ssz)", fields[i].name, kinds[fields[i].kind], fields[i].torch);
        if (!row) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, (Py_ssize_t)i, row);
    }
    return t;
}

/* PyModule_AddObject steals the reference only when it succeeds. */
static int add_fields(PyObject *module, const char *name, const gp_field *fields, size_t n)
{
    PyObject *t = fields_tuple(fields, n);
    if (t && PyModule_AddObject(module, name, t) == 0) return 0;
    Py_XDECREF(t);
    return -1;
}

int gp_stats_fields_add(PyObject *module)
{
    return add_fields(module, "STATS_FIELDS", gp_pool_fields, GP_N_POOL_FIELDS) < 0 ||
                   add_fields(module, "TAG_STATS_FIELDS", gp_tag_fields, GP_N_TAG_FIELDS) < 0 ||
                   add_fields(module, "PRIO_STATS_FIELDS", gp_prio_fields, GP_N_PRIO_FIELDS) < 0
               ? -1 : 0;
}

static PyObject *history_dict(size_t cap, size_t len, uint64_t recorded, int stacks)
{
    return Py_BuildValue("{s:n,s:n,s:K,s:O}", "max_entries", (Py_ssize_t)cap, "len", (Py_ssize_t)len,
                         "recorded", (unsigned long long)recorded, "stacks", stacks ? Py_True : Py_False);
}

/* Set d[key] = value and drop the reference to value; -1 on error. */
static int set_new(PyObject *d, PyObject *key, PyObject *value)
{
    int rc = key && value ? PyDict_SetItem(d, key, value) : -1;
    Py_XDECREF(value);
    return rc;
}

/* stats(): every figure from one copy (gp_pool_figures), so that they agree:
 * the pool's, then "tags" {name: {...}} for the tags ever used, "priorities"
 * {priority: {...}} for those ever used, "history". */
static PyObject *figures_dict(const gp_figures *f, int stacks)
{
    PyObject *d = fields_dict(gp_pool_fields, GP_N_POOL_FIELDS, g_pool_keys, &f->pool);
    PyObject *tags = PyDict_New(), *prios = PyDict_New();
    int rc = d && tags && prios ? 0 : -1;
    for (unsigned t = 0; rc == 0 && t < f->n_tags; t++) {
        const gp_tag_stats *ts = &f->tags[t];
        if (!ts->n_alloc && !ts->limit && !ts->allocated_peak) continue; /* (retagged blocks) */
        PyObject *name = PyUnicode_FromString(gp_tag_name((gp_tag)t));
        rc = set_new(tags, name, fields_dict(gp_tag_fields, GP_N_TAG_FIELDS, g_tag_keys, ts));
        Py_XDECREF(name);
    }
    for (int pr = 0; rc == 0 && pr <= GP_PRIO_MAX; pr++) {
        if (!f->prio[pr].allocated_peak) continue;
        PyObject *k = PyLong_FromLong(pr);
        rc = set_new(prios, k, fields_dict(gp_prio_fields, GP_N_PRIO_FIELDS, g_prio_keys, &f->prio[pr]));
        Py_XDECREF(k);
    }
    if (rc == 0) rc = PyDict_SetItemString(d, "tags", tags);
    if (rc == 0) rc = PyDict_SetItemString(d, "priorities", prios);
    if (rc == 0)
        rc = set_new(d, PyUnicode_FromString("history"),
                     history_dict(f->history_capacity, f->history_len, f->history_recorded, stacks));
    Py_XDECREF(tags);
    Py_XDECREF(prios);
    if (rc < 0) Py_CLEAR(d);
    return d;
}

static PyObject *pool_stats(PoolObject *self, PyObject *args)
{
    int full = 1;
    if (!PyArg_ParseTuple(args, "|p", &full)) return NULL;
    gp_figures *f = PyMem_RawMalloc(sizeof *f);
    if (!f) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    gp_pool_figures(self->pool, f, full);
    Py_END_ALLOW_THREADS
    PyObject *d = figures_dict(f, gp_pool_history_stacks(self->pool));
    PyMem_RawFree(f);
    return d;
}

static PyObject *block_tuple(const gp_block_info *b)
{
    return Py_BuildValue("(KKKKiiiii)", (unsigned long long)b->addr, (unsigned long long)b->size,
                         (unsigned long long)b->requested, (unsigned long long)(uintptr_t)b->stream,
                         (int)b->tag, (int)b->priority, (int)b->state, (int)b->arena, (int)b->lifetime);
}

/* The blocks are copied out under the pool's lock and the tuples built
 * after: building them may run the garbage collector, whose finalizers may
 * free pool memory (gp_free takes the lock). */
static PyObject *pool_blocks(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    size_t cap = 256, n;
    gp_block_info *info;
    for (;;) {
        if (!(info = PyMem_RawMalloc(cap * sizeof *info))) return PyErr_NoMemory();
        Py_BEGIN_ALLOW_THREADS
        n = gp_pool_blocks_read(self->pool, info, cap);
        Py_END_ALLOW_THREADS
        if (n <= cap) break;
        PyMem_RawFree(info);
        cap = n + n / 4; /* room for blocks made meanwhile */
    }
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *t = block_tuple(&info[i]);
        if (!t) Py_CLEAR(l);
        else PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    PyMem_RawFree(info);
    return l;
}

static PyObject *pool_trim(PoolObject *self, PyObject *args)
{
    PyObject *bytes_o = NULL;
    uint64_t bytes = UINT64_MAX;
    if (!PyArg_ParseTuple(args, "|O", &bytes_o)) return NULL;
    if (bytes_o && gp_u64_arg(bytes_o, "trim: bytes", 0, GP_U64_MAX, &bytes) < 0) return NULL;
    uint64_t r;
    Py_BEGIN_ALLOW_THREADS
    r = gp_pool_trim(self->pool, bytes);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(r);
}

static PyObject *pool_set_limit(PoolObject *self, PyObject *arg)
{
    uint64_t v;
    if (gp_u64_arg(arg, "limit", 0, GP_U64_MAX, &v) < 0) return NULL;
    gp_pool_set_limit(self->pool, v);
    Py_RETURN_NONE;
}

static PyObject *pool_set_tag_limit(PoolObject *self, PyObject *args)
{
    int tag;
    PyObject *bytes_o;
    uint64_t bytes;
    if (!PyArg_ParseTuple(args, "iO", &tag, &bytes_o)) return NULL;
    if (gp_u64_arg(bytes_o, "tag limit", 0, GP_U64_MAX, &bytes) < 0) return NULL;
    if (tag < 0 || tag >= GP_MAX_TAGS) tag = GP_MAX_TAGS; /* rejected, with its message, below */
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

static PyObject *pool_window_peak(PoolObject *self, PyObject *args)
{
    int reset = 0;
    if (!PyArg_ParseTuple(args, "|p", &reset)) return NULL;
    return PyLong_FromUnsignedLongLong(gp_pool_window_peak(self->pool, reset));
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
    return block_tuple(&b);
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
    PyObject *key_o, *stream_o;
    uint64_t key;
    if (!PyArg_ParseTuple(args, "OO", &key_o, &stream_o)) return NULL;
    if (gp_u64_arg(key_o, "graph pool key", 0, GP_U64_MAX, &key) < 0) return NULL;
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
    uint64_t key;
    if (gp_u64_arg(arg, "graph pool key", 0, GP_U64_MAX, &key) < 0) return NULL;
    gp_status st;
    Py_BEGIN_ALLOW_THREADS
    st = gp_pool_capture_release(self->pool, key);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

static PyObject *pool_capture_away(PoolObject *self, PyObject *arg)
{
    uint64_t key;
    if (gp_u64_arg(arg, "graph pool key", 0, GP_U64_MAX, &key) < 0) return NULL;
    gp_tag tags[GP_MAX_TAGS];
    size_t n;
    gp_status st = gp_pool_capture_away(self->pool, key, tags, GP_MAX_TAGS, &n);
    if (st != GP_OK) return gp_raise(st);
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *name = PyUnicode_FromString(gp_tag_name(tags[i]));
        if (!name || PyList_Append(out, name) < 0) Py_CLEAR(out);
        Py_XDECREF(name);
    }
    return out;
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
    return history_dict(cap, len, recorded, gp_pool_history_stacks(self->pool));
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
    PyObject *addr_o, *size_o;
    uint64_t addr, size;
    if (!PyArg_ParseTuple(args, "iOOii", &action, &addr_o, &size_o, &tag, &prio)) return NULL;
    if (gp_u64_arg(addr_o, "history note: address", 0, UINTPTR_MAX, &addr) < 0 ||
        gp_u64_arg(size_o, "history note: size", 0, GP_U64_MAX, &size) < 0)
        return NULL;
    if (tag < 0 || tag >= GP_MAX_TAGS) {
        PyErr_Format(PyExc_ValueError, "history note: tag id %d is out of range (0..%d)", tag, GP_MAX_TAGS - 1);
        return NULL;
    }
    gp_status st = gp_pool_history_note(self->pool, action, (uintptr_t)addr, size, (gp_tag)tag, prio);
    if (st != GP_OK) return gp_raise(st);
    Py_RETURN_NONE;
}

/* The stack's integrity check, without the GIL (it walks every block). */
static PyObject *pool_check(PoolObject *self, PyObject *noargs)
{
    (void)noargs;
    char msg[1024] = "";
    size_t n;
    Py_BEGIN_ALLOW_THREADS
    n = gp_stack_check(self->stack, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(ns)", (Py_ssize_t)n, msg);
}

static PyMethodDef pool_methods[] = {
    GP_OFFLOAD_METHODS
    {"alloc", (PyCFunction)(void (*)(void))pool_alloc, METH_VARARGS | METH_KEYWORDS,
     "alloc(size, stream=0, tag=-1, priority=-1) -> address; tag/priority -1: this thread's context"},
    {"free", (PyCFunction)pool_free, METH_O, "free(address)"},
    {"check", (PyCFunction)pool_check, METH_NOARGS,
     "check() -> (problems, the first described): the pool's integrity (gp_pool_check) and its "
     "offloader's, if it has one (gp_offload_check); (0, '') when consistent"},
    {"stats", (PyCFunction)pool_stats, METH_VARARGS,
     "stats(full=True) -> dict of every figure, at one instant: the pool's (STATS_FIELDS), 'tags' "
     "{name: TAG_STATS_FIELDS}, 'priorities' {int: PRIO_STATS_FIELDS}, 'history'; full: also "
     "segments, free_blocks, largest_free (a walk of the arenas)"},
    {"blocks", (PyCFunction)pool_blocks, METH_NOARGS,
     "blocks() -> [(addr, size, requested, stream, tag, priority, state, arena)] in address order"},
    {"trim", (PyCFunction)pool_trim, METH_VARARGS, "trim(bytes=all) -> bytes released"},
    {"set_limit", (PyCFunction)pool_set_limit, METH_O, "set_limit(bytes); 0 removes it"},
    {"set_tag_limit", (PyCFunction)pool_set_tag_limit, METH_VARARGS, "set_tag_limit(tag_id, bytes)"},
    {"retag", (PyCFunction)pool_retag, METH_VARARGS,
     "retag(addresses, tag_id, priority=-1) -> bytes moved; -1 keeps each block's priority"},
    {"reset_peaks", (PyCFunction)pool_reset_peaks, METH_NOARGS, "reset every peak to the current value"},
    {"window_peak", (PyCFunction)pool_window_peak, METH_VARARGS,
     "window_peak(reset=False): the highest allocated bytes since the last reset (then restarted)"},
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
    {"capture_away", (PyCFunction)pool_capture_away, METH_O,
     "capture_away(key) -> [tag names]: graph pool key's tags holding offloaded memory"},
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
    .tp_richcompare = pool_richcompare,
    .tp_hash = pool_hash,
    .tp_methods = pool_methods,
};
