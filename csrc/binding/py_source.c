/* py_source.c: fastloader._C.Source, a dataset's bytes as a Python object.
 *
 *   file_source(paths) -> Source     n files on disk
 *   Source.read(index) -> bytes      one sample's bytes (GIL released)
 *   len(Source), Source.kind
 *
 * A Source owns one reference to a core fl_source (source.h);
 * NativeDataset(source, ...) takes another, so the source lives as long as
 * any dataset or worker using it.  Other binding files make Sources of
 * their kinds with fl_py_source_wrap (LMDB, arrays).
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "sources/shards.h"
#include "sources/source.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    fl_source *src;   /* one reference, owned */
} SourceObject;

PyObject *
fl_py_source_wrap(PyObject *module, fl_source *src)
{
    if (src == NULL)
        return PyErr_NoMemory();
    fl_module_state *st = fl_get_state(module);
    SourceObject *self = PyObject_New(SourceObject, st->SourceType);
    if (self == NULL) {
        fl_source_unref(src);
        return NULL;
    }
    self->src = src;
    return (PyObject *)self;
}

fl_source *
fl_py_source_get(PyObject *module, PyObject *obj)
{
    fl_module_state *st = fl_get_state(module);
    if (!PyObject_TypeCheck(obj, st->SourceType))
        return NULL;
    return ((SourceObject *)obj)->src;
}

static void
source_dealloc(SourceObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    fl_source_unref(self->src);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static Py_ssize_t
source_len(SourceObject *self)
{
    return (Py_ssize_t)self->src->n;
}

/* read(index) -> bytes: the sample's bytes, through a fresh per-thread state
 * (so any thread may call it).  IndexError out of range; the core's error
 * otherwise, through the one translator.  Pixel sources give their raw
 * pixel bytes. */
static PyObject *
source_read(SourceObject *self, PyObject *arg)
{
    long long index = PyLong_AsLongLong(arg);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    fl_source *s = self->src;
    if (index < 0 || index >= s->n)
        return PyErr_Format(PyExc_IndexError, "sample index %lld out of range for a source of %lld", index,
                            (long long)s->n);
    fl_err err = {0, "", 0};
    fl_bytes buf = {0};
    fl_sample_bytes out;
    PyObject *res = NULL;
    int rc = 0;
    void *tls = NULL;
    int opened = 0;
    if (fl_shards_is(s)) {   /* a stream keeps only the non-JPEG images its batches hand to Pillow */
        long long len;
        Py_BEGIN_ALLOW_THREADS
        len = fl_shards_read_kept(s, index, &buf, &err);
        Py_END_ALLOW_THREADS
        if (len >= 0)
            res = PyBytes_FromStringAndSize((const char *)buf.data, (Py_ssize_t)len);
        else
            fl_py_raise(PyType_GetModule(Py_TYPE(self)), &err, NULL, NULL);
        fl_bytes_free(&buf);
        return res;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = s->ops->thread_open ? s->ops->thread_open(s, &tls, &err) : 0;
    opened = rc == 0;
    if (rc == 0)
        rc = s->ops->get(s, tls, index, 0, &buf, FL_SOURCE_MAX_FILE_BYTES, &out, &err);
    Py_END_ALLOW_THREADS
    if (rc == 0)
        res = PyBytes_FromStringAndSize((const char *)out.data, (Py_ssize_t)out.len);
    else
        fl_py_raise(PyType_GetModule(Py_TYPE(self)), &err, NULL, NULL);
    if (s->ops->thread_close && opened) {
        Py_BEGIN_ALLOW_THREADS
        s->ops->thread_close(s, tls);
        Py_END_ALLOW_THREADS
    }
    fl_bytes_free(&buf);
    return res;
}

static PyObject *
source_get_kind(SourceObject *self, void *Py_UNUSED(c))
{
    return PyUnicode_FromString(self->src->ops->kind);
}

static PyMethodDef source_methods[] = {
    {"read", (PyCFunction)source_read, METH_O, "read(index) -> bytes: one sample's bytes (GIL released)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef source_getset[] = {
    {"kind", (getter)source_get_kind, NULL, "the kind of storage: 'files', 'lmdb', ...", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot source_slots[] = {
    {Py_tp_dealloc, source_dealloc},
    {Py_tp_methods, source_methods},
    {Py_tp_getset, source_getset},
    {Py_sq_length, source_len},
    {Py_tp_doc, "Where a dataset's samples' bytes live; made by file_source() and the other *_source functions"},
    {0, NULL},
};

static PyType_Spec source_spec = {
    "fastloader._C.Source", sizeof(SourceObject), 0, Py_TPFLAGS_DEFAULT, source_slots,
};

/* file_source(paths) -> Source over the files (str or os.PathLike). */
static PyObject *
file_source(PyObject *module, PyObject *paths)
{
    PyObject *seq = PySequence_Fast(paths, "paths must be a sequence of str");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    char **p = calloc((size_t)(n ? n : 1), sizeof(char *));
    if (!p) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *fs = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &fs))
            goto error;
        p[i] = strdup(PyBytes_AS_STRING(fs));
        Py_DECREF(fs);
        if (!p[i]) {
            PyErr_NoMemory();
            goto error;
        }
    }
    Py_DECREF(seq);
    return fl_py_source_wrap(module, fl_source_files_new(p, (int64_t)n));
error:
    for (Py_ssize_t i = 0; i < n; i++)
        free(p[i]);
    free(p);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"file_source", (PyCFunction)file_source, METH_O, "file_source(paths) -> Source over files on disk"},
    {NULL, NULL, 0, NULL},
};

int
fl_register_source(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    st->SourceType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &source_spec, NULL);
    if (st->SourceType == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "Source", (PyObject *)st->SourceType) < 0)
        return -1;
    return PyModule_AddFunctions(m, module_methods);
}
