/* py_lmdb.c: the Python face of lmdb_source.h (translation only).
 *
 *   lmdb_source(path, count, *, lock=False, readahead=True) -> Source
 *       samples 0..count-1 of the LMDB at path (directory or single file)
 *   lmdb_get(path, keys, *, lock=False) -> list[bytes | None]
 *       copies of a few values (the reserved metadata keys), one transaction
 *   LMDBWriter(path, map_size=0)
 *       a new single-file LMDB: put(key, value) collects pairs and writes
 *       them in transactions of up to FL_PY_LMDB_BATCH_BYTES (or _ITEMS)
 *       without the GIL; flush(); close() writes the rest and syncs; as a
 *       context manager, an exception abandons the file's pending pairs
 *       (the caller deletes the file).  map_size grows as needed.
 *
 * Errors go through the one translator (py_errors.c) with the path named:
 * an OS failure as the OSError subclass of its errno (filename = path),
 * anything else as OSError("PATH: reason").
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "sources/lmdb_source.h"

#include <stdlib.h>
#include <string.h>

#define FL_PY_LMDB_BATCH_BYTES ((Py_ssize_t)64 << 20)
#define FL_PY_LMDB_BATCH_ITEMS 8192

static const char open_hint[] = " (opening an LMDB dataset; write one from an ImageFolder with: "
                                "python -m fastloader pack lmdb SRC_DIR OUT)";

/* Raise err for `path` (bytes, the file system form).  With an errno the
 * translator makes OSError(errno, strerror + where, filename=path); without
 * one the message starts with the path.  Always returns NULL.  GIL. */
static PyObject *
raise_for_path(PyObject *module, const fl_err *err, PyObject *path, const char *where)
{
    PyObject *name = PyUnicode_DecodeFSDefaultAndSize(PyBytes_AS_STRING(path), PyBytes_GET_SIZE(path));
    if (name == NULL)
        return NULL;
    if (err->errnum > 0) {
        fl_py_raise(module, err, name, where);
        Py_DECREF(name);
        return NULL;
    }
    PyObject *text = PyUnicode_FromFormat("%U: %s", name, err->msg);
    Py_DECREF(name);
    if (text == NULL)
        return NULL;
    PyObject *args = Py_BuildValue("(iiOOs)", err->code, 0, text, Py_None, where ? where : "");
    Py_DECREF(text);
    if (args == NULL)
        return NULL;
    PyObject *fn = PyObject_GetAttrString(module, "_error");
    PyObject *e = fn ? PyObject_Call(fn, args, NULL) : NULL;
    Py_XDECREF(fn);
    Py_DECREF(args);
    if (e != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

/* A key as bytes: bytes as they are, str as UTF-8.  New reference, or NULL
 * with TypeError. */
static PyObject *
key_bytes(PyObject *key)
{
    if (PyBytes_Check(key))
        return Py_NewRef(key);
    if (PyUnicode_Check(key))
        return PyUnicode_AsUTF8String(key);
    return PyErr_Format(PyExc_TypeError, "an LMDB key must be bytes or str, not %.100s", Py_TYPE(key)->tp_name);
}

/* ---- lmdb_source, lmdb_get ---------------------------------------------------- */

static PyObject *
lmdb_source_py(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "count", "lock", "readahead", NULL};
    PyObject *path = NULL;
    long long count;
    int lock = 0, readahead = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&L|$pp:lmdb_source", kwlist, PyUnicode_FSConverter, &path,
                                     &count, &lock, &readahead))
        return NULL;
    fl_lmdb_options opt = {lock, readahead};
    fl_err err = {0, "", 0};
    fl_source *src;
    Py_BEGIN_ALLOW_THREADS
    src = fl_source_lmdb_open(PyBytes_AS_STRING(path), (int64_t)count, &opt, &err);
    Py_END_ALLOW_THREADS
    if (src == NULL) {
        raise_for_path(module, &err, path, open_hint);
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    return fl_py_source_wrap(module, src);
}

static PyObject *
lmdb_get_py(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "keys", "lock", NULL};
    PyObject *path = NULL, *keys_obj, *seq = NULL, *out = NULL;
    int lock = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O|$p:lmdb_get", kwlist, PyUnicode_FSConverter, &path,
                                     &keys_obj, &lock))
        return NULL;
    Py_ssize_t n = 0;
    PyObject **kb = NULL;
    const char **keys = NULL;
    size_t *klens = NULL, *vlens = NULL;
    uint8_t **vals = NULL;
    seq = PySequence_Fast(keys_obj, "keys must be a sequence of bytes or str");
    if (seq == NULL)
        goto done;
    n = PySequence_Fast_GET_SIZE(seq);
    size_t cap = (size_t)(n ? n : 1);
    kb = PyMem_Calloc(cap, sizeof *kb);
    keys = PyMem_Calloc(cap, sizeof *keys);
    klens = PyMem_Calloc(cap, sizeof *klens);
    vlens = PyMem_Calloc(cap, sizeof *vlens);
    vals = PyMem_Calloc(cap, sizeof *vals);
    if (!kb || !keys || !klens || !vlens || !vals) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((kb[i] = key_bytes(PySequence_Fast_GET_ITEM(seq, i))) == NULL)
            goto done;
        keys[i] = PyBytes_AS_STRING(kb[i]);
        klens[i] = (size_t)PyBytes_GET_SIZE(kb[i]);
    }
    fl_lmdb_options opt = {lock, 1};
    fl_err err = {0, "", 0};
    int rc;
    /* the key bytes objects are ours and immutable: safe to read without the GIL */
    Py_BEGIN_ALLOW_THREADS
    rc = fl_lmdb_read_keys(PyBytes_AS_STRING(path), &opt, (size_t)n, keys, klens, vals, vlens, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        raise_for_path(module, &err, path, open_hint);
        goto done;
    }
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *v = vals[i] ? PyBytes_FromStringAndSize((const char *)vals[i], (Py_ssize_t)vlens[i])
                              : Py_NewRef(Py_None);
        if (v == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, v);
    }
done:
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kb)
            Py_XDECREF(kb[i]);
        if (vals)
            free(vals[i]);  /* malloc'd by the core */
    }
    PyMem_Free(kb);
    PyMem_Free(keys);
    PyMem_Free(klens);
    PyMem_Free(vlens);
    PyMem_Free(vals);
    Py_XDECREF(seq);
    Py_DECREF(path);
    return out;
}

/* ---- LMDBWriter ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    fl_lmdb_writer *w;        /* owned; NULL once closed or abandoned */
    PyObject *path;           /* bytes, the file system path (for messages) */
    PyObject *pending;        /* list of (key bytes, value bytes) not written yet */
    Py_ssize_t pending_bytes; /* their total size */
    int busy;                 /* 1 while a write runs without the GIL: other calls are refused */
} LMDBWriterObject;

static PyObject *
writer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "map_size", NULL};
    PyObject *path = NULL;
    unsigned long long map_size = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|K:LMDBWriter", kwlist, PyUnicode_FSConverter, &path,
                                     &map_size))
        return NULL;
    LMDBWriterObject *self = (LMDBWriterObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    self->path = path;  /* ownership moves to self */
    self->pending = PyList_New(0);
    if (self->pending == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    fl_err err = {0, "", 0};
    Py_BEGIN_ALLOW_THREADS
    self->w = fl_lmdb_writer_open(PyBytes_AS_STRING(path), (size_t)map_size, &err);
    Py_END_ALLOW_THREADS
    if (self->w == NULL) {
        raise_for_path(PyType_GetModule(type), &err, path, " (creating an LMDB)");
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
writer_dealloc(LMDBWriterObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    fl_lmdb_writer_abandon(self->w);
    Py_XDECREF(self->path);
    Py_XDECREF(self->pending);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* 0 when the writer can be used now, else -1 with an exception. */
static int
writer_usable(LMDBWriterObject *self)
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "LMDBWriter is in use by another thread");
        return -1;
    }
    if (self->w == NULL) {
        PyErr_SetString(PyExc_ValueError, "LMDBWriter is closed");
        return -1;
    }
    return 0;
}

/* Write the pending pairs in one transaction (GIL released around the
 * core call).  The pairs are dropped from `pending` either way.  0, or -1
 * with an exception. */
static int
writer_flush_pending(LMDBWriterObject *self)
{
    Py_ssize_t n = PyList_GET_SIZE(self->pending);
    if (n == 0)
        return 0;
    PyObject *items = self->pending;  /* keeps the bytes alive while the core reads them */
    self->pending = PyList_New(0);
    self->pending_bytes = 0;
    if (self->pending == NULL) {
        self->pending = items;
        return -1;
    }
    /* one block for the four arrays: read by the core without the GIL */
    char *block = PyMem_Malloc((size_t)n * (2 * sizeof(void *) + 2 * sizeof(size_t)));
    if (block == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return -1;
    }
    const void **keys = (const void **)block, **vals = keys + n;
    size_t *klens = (size_t *)(vals + n), *vlens = klens + n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(items, i);
        PyObject *k = PyTuple_GET_ITEM(pair, 0), *v = PyTuple_GET_ITEM(pair, 1);
        keys[i] = PyBytes_AS_STRING(k);
        klens[i] = (size_t)PyBytes_GET_SIZE(k);
        vals[i] = PyBytes_AS_STRING(v);
        vlens[i] = (size_t)PyBytes_GET_SIZE(v);
    }
    fl_err err = {0, "", 0};
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_lmdb_writer_put(self->w, (size_t)n, keys, klens, vals, vlens, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyMem_Free(block);
    Py_DECREF(items);
    if (rc < 0) {
        raise_for_path(PyType_GetModule(Py_TYPE(self)), &err, self->path, " (writing an LMDB)");
        return -1;
    }
    return 0;
}

static PyObject *
writer_put(LMDBWriterObject *self, PyObject *args)
{
    PyObject *key, *value;
    if (!PyArg_ParseTuple(args, "OO:put", &key, &value))
        return NULL;
    if (writer_usable(self) < 0)
        return NULL;
    PyObject *k = key_bytes(key);
    if (k == NULL)
        return NULL;
    /* bytes are kept as they are; any other buffer is copied now, so that
     * changing it before the write cannot change what is written */
    PyObject *v = PyBytes_Check(value) ? Py_NewRef(value) : PyBytes_FromObject(value);
    if (v == NULL) {
        Py_DECREF(k);
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(k) + PyBytes_GET_SIZE(v);
    PyObject *pair = PyTuple_Pack(2, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
    if (pair == NULL || PyList_Append(self->pending, pair) < 0) {
        Py_XDECREF(pair);
        return NULL;
    }
    Py_DECREF(pair);
    self->pending_bytes += size;
    if ((self->pending_bytes >= FL_PY_LMDB_BATCH_BYTES || PyList_GET_SIZE(self->pending) >= FL_PY_LMDB_BATCH_ITEMS) &&
        writer_flush_pending(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
writer_flush(LMDBWriterObject *self, PyObject *Py_UNUSED(ignored))
{
    if (writer_usable(self) < 0 || writer_flush_pending(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
writer_close(LMDBWriterObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->w == NULL && !self->busy)
        Py_RETURN_NONE;  /* closed already */
    if (writer_usable(self) < 0 || writer_flush_pending(self) < 0)
        return NULL;
    fl_lmdb_writer *w = self->w;
    self->w = NULL;  /* closed from here on, whatever the sync says */
    fl_err err = {0, "", 0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_lmdb_writer_close(w, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return raise_for_path(PyType_GetModule(Py_TYPE(self)), &err, self->path, " (writing an LMDB)");
    Py_RETURN_NONE;
}

/* abandon(): drop what is pending and close without syncing (the caller
 * deletes the file). */
static PyObject *
writer_abandon(LMDBWriterObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "LMDBWriter is in use by another thread");
        return NULL;
    }
    fl_lmdb_writer *w = self->w;
    self->w = NULL;
    if (PyList_SetSlice(self->pending, 0, PyList_GET_SIZE(self->pending), NULL) < 0)
        return NULL;
    self->pending_bytes = 0;
    Py_BEGIN_ALLOW_THREADS
    fl_lmdb_writer_abandon(w);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *
writer_enter(LMDBWriterObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef(self);
}

static PyObject *
writer_exit(LMDBWriterObject *self, PyObject *args)
{
    PyObject *type = Py_None, *value = Py_None, *tb = Py_None;
    if (!PyArg_UnpackTuple(args, "__exit__", 0, 3, &type, &value, &tb))
        return NULL;
    PyObject *r = type == Py_None ? writer_close(self, NULL) : writer_abandon(self, NULL);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *
writer_get_map_size(LMDBWriterObject *self, void *Py_UNUSED(c))
{
    if (self->w == NULL)
        Py_RETURN_NONE;
    return PyLong_FromSize_t(fl_lmdb_writer_map_size(self->w));
}

static PyObject *
writer_get_closed(LMDBWriterObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->w == NULL);
}

static PyMethodDef writer_methods[] = {
    {"put", (PyCFunction)writer_put, METH_VARARGS,
     "put(key, value): queue one pair (key bytes or str, value bytes-like); written in batches"},
    {"flush", (PyCFunction)writer_flush, METH_NOARGS, "flush(): write the queued pairs in one transaction"},
    {"close", (PyCFunction)writer_close, METH_NOARGS, "close(): write what is queued, sync to disk, close"},
    {"abandon", (PyCFunction)writer_abandon, METH_NOARGS,
     "abandon(): drop what is queued and close without syncing (delete the file afterwards)"},
    {"__enter__", (PyCFunction)writer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)writer_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef writer_getset[] = {
    {"map_size", (getter)writer_get_map_size, NULL, "the LMDB map size in bytes (None once closed)", NULL},
    {"closed", (getter)writer_get_closed, NULL, "True once closed or abandoned", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot writer_slots[] = {
    {Py_tp_new, writer_new},
    {Py_tp_dealloc, writer_dealloc},
    {Py_tp_methods, writer_methods},
    {Py_tp_getset, writer_getset},
    {Py_tp_doc, "LMDBWriter(path, map_size=0): write a new single-file LMDB (pack_lmdb's writer)"},
    {0, NULL},
};

static PyType_Spec writer_spec = {
    "fastloader._C.LMDBWriter", sizeof(LMDBWriterObject), 0, Py_TPFLAGS_DEFAULT, writer_slots,
};

static PyMethodDef module_methods[] = {
    {"lmdb_source", (PyCFunction)(void (*)(void))lmdb_source_py, METH_VARARGS | METH_KEYWORDS,
     "lmdb_source(path, count, *, lock=False, readahead=True) -> Source over samples 0..count-1 of an LMDB"},
    {"lmdb_get", (PyCFunction)(void (*)(void))lmdb_get_py, METH_VARARGS | METH_KEYWORDS,
     "lmdb_get(path, keys, *, lock=False) -> list of bytes or None: copies of a few values"},
    {NULL, NULL, 0, NULL},
};

int
fl_register_lmdb(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    st->LMDBWriterType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &writer_spec, NULL);
    if (st->LMDBWriterType == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "LMDBWriter", (PyObject *)st->LMDBWriterType) < 0)
        return -1;
    return PyModule_AddFunctions(m, module_methods);
}
