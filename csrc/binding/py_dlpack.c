/* py_dlpack.c: DLPack export shared by Buffer (host memory) and
 * DeviceTensor (CUDA memory): argument parsing for __dlpack__ and capsule
 * construction (see py_buffer.h for the contracts).
 *
 * One allocation per export holds the managed tensor (legacy or versioned),
 * the shape, and the producer's release callback with its context; the
 * managed tensor's manager_ctx points at that block, so one deleter per
 * struct flavour serves every producer.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "core/dlpack.h"
#include "binding/py_buffer.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    fl_dlpack_release_fn release;
    void *ctx;
    union {
        DLManagedTensor legacy;
        DLManagedTensorVersioned versioned;
    } m;
    int64_t shape[]; /* ndim entries (at least 1 allocated) */
} export_block;

static void
finish(export_block *b)
{
    b->release(b->ctx);
    free(b);
}

static void
legacy_deleter(DLManagedTensor *m)
{
    if (m)
        finish(m->manager_ctx);
}

static void
versioned_deleter(DLManagedTensorVersioned *m)
{
    if (m)
        finish(m->manager_ctx);
}

/* Capsule destructors: the deleter runs only when nobody consumed the
 * capsule (a consumer renames it to used_dltensor[_versioned]).  A
 * destructor may run while an exception is being raised: keep it intact
 * (PyCapsule_IsValid sets none; the deleter may run Python code). */
static void
legacy_destructor(PyObject *cap)
{
    if (!PyCapsule_IsValid(cap, "dltensor"))
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter)
        m->deleter(m);
    PyErr_Restore(type, value, tb);
}

static void
versioned_destructor(PyObject *cap)
{
    if (!PyCapsule_IsValid(cap, "dltensor_versioned"))
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
    if (m && m->deleter)
        m->deleter(m);
    PyErr_Restore(type, value, tb);
}

int
fl_dlpack_parse(PyObject *args, PyObject *kwargs, DLDevice where, const char *no_copy_msg,
                fl_dlpack_request *req)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    req->stream = Py_None;
    req->versioned = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &req->stream,
                                     &max_version, &dl_device, &copy))
        return -1;
    if (dl_device != Py_None) {
        int dt, di;
        if (!PyArg_ParseTuple(dl_device, "ii", &dt, &di))
            return -1;
        if (dt != where.device_type || di != where.device_id) {
            PyErr_Format(PyExc_BufferError, "cannot export to device (%d, %d): data lives on (%d, %d)",
                         dt, di, where.device_type, where.device_id);
            return -1;
        }
    }
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, no_copy_msg);
        return -1;
    }
    if (max_version != Py_None) {
        if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1) {
            PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple");
            return -1;
        }
        long major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
        if (major == -1 && PyErr_Occurred())
            return -1;
        req->versioned = major >= 1;
    }
    return 0;
}

PyObject *
fl_dlpack_capsule(void *data, DLDevice device, int ndim, const int64_t *shape, DLDataType dtype,
                  int versioned, fl_dlpack_release_fn release, void *ctx)
{
    export_block *b = calloc(1, sizeof *b + sizeof(int64_t) * (size_t)(ndim > 0 ? ndim : 1));
    if (!b)
        return PyErr_NoMemory();
    b->release = release;
    b->ctx = ctx;
    DLTensor *t;
    void *managed;
    if (versioned) {
        DLManagedTensorVersioned *m = &b->m.versioned;
        m->version.major = FL_DLPACK_MAJOR;
        m->version.minor = FL_DLPACK_MINOR;
        m->manager_ctx = b;
        m->deleter = versioned_deleter;
        t = &m->dl_tensor;
        managed = m;
    } else {
        DLManagedTensor *m = &b->m.legacy;
        m->manager_ctx = b;
        m->deleter = legacy_deleter;
        t = &m->dl_tensor;
        managed = m;
    }
    t->data = data;
    t->device = device;
    t->ndim = ndim;
    t->dtype = dtype;
    t->shape = b->shape;
    for (int i = 0; i < ndim; i++)
        b->shape[i] = shape[i];
    t->strides = NULL; /* compact row-major */
    t->byte_offset = 0;
    PyObject *cap = versioned ? PyCapsule_New(managed, "dltensor_versioned", versioned_destructor)
                              : PyCapsule_New(managed, "dltensor", legacy_destructor);
    if (!cap)
        free(b); /* the caller still owns its reference */
    return cap;
}

PyObject *
fl_shape_tuple(int ndim, const int64_t *shape)
{
    PyObject *t = PyTuple_New(ndim);
    if (!t)
        return NULL;
    for (int i = 0; i < ndim; i++) {
        PyObject *v = PyLong_FromLongLong(shape[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}
