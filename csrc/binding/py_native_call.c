/* py_native_call.c: the native call for custom datasets, as a Python type.
 *
 *   NativeCall(spec, dct_scaling=False, max_pixels=0)
 *   call(src, index, epoch, seed) -> Buffer, or None
 *
 * One sample from what a custom __getitem__ holds: src is a path (str or
 * os.PathLike: the file is read here), encoded bytes (bytes, bytearray,
 * memoryview, a 1-D array: any C-contiguous buffer) or a decoded image (a
 * numpy uint8 array, H x W or H x W x C with C 1 or 3).  The sample goes
 * through exactly what NativeDataset does for sample `index` of an epoch
 * (native.h: fl_native_render_encoded / _decoded): the plan keyed by
 * (seed, epoch, index), the region decode, the fused render.  The GIL is
 * released once, for the whole read + decode + render; only the argument
 * checks before it and the Buffer made after it hold the GIL.
 *
 * Returns a Buffer (DLPack) over one sample of the spec's shape and dtype,
 * or None when src's bytes are not a JPEG, PNG or still WebP but look like
 * another image format (GIF, BMP, ...): fastloader/transforms.py then decodes them with
 * Pillow, as ImageFolder does, and calls again with the pixels.  Errors go
 * through the one translator (py_errors.c) with the path (or "<bytes>")
 * in front of the reason: DecodeError for bytes that are not a valid
 * image, OSError subclasses with .filename for the read.
 *
 * Calls run on any number of threads at once.  Each takes a worker state
 * (a JPEG decoder and its buffers, native.h) from the object's idle list
 * and gives it back after, both with the GIL held (the GIL guards the
 * list), so a steady state allocates nothing but the output.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "native/native.h"
#include "binding/py_transform.h"
#include "binding/py_buffer.h"

#include <numpy/arrayobject.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Idle worker states kept for reuse: more than the threads that call at
 * once on this machine's scale; an extra one is freed when given back. */
#define FL_CALL_IDLE 16

typedef struct {
    PyObject_HEAD
    fl_native_ds ds;                        /* spec and limits; src NULL and no labels (bytes come
                                             * from the caller) */
    fl_native_worker *idle[FL_CALL_IDLE];   /* worker states not in use (owned); guarded by the GIL */
    int nidle;
} NativeCallObject;

enum { IN_PATH = 0, IN_BYTES = 1, IN_PIXELS = 2 };

/* What one call reads from.  Everything the no-GIL part touches is here,
 * owned by the call until fl_input_release. */
typedef struct {
    int kind;               /* IN_* */
    PyObject *name;         /* str for messages: the path, "<bytes>" or "<array>" (owned) */
    PyObject *path;         /* IN_PATH: the file system encoding of the path, bytes (owned) */
    Py_buffer view;         /* IN_BYTES: held for the call (have_view) */
    int have_view;
    PyArrayObject *arr;     /* IN_PIXELS: a C-contiguous uint8 array (owned) */
    int h, w, c;
} fl_input;

static void
fl_input_release(fl_input *in)
{
    if (in->have_view)
        PyBuffer_Release(&in->view);
    in->have_view = 0;
    Py_CLEAR(in->name);
    Py_CLEAR(in->path);
    Py_CLEAR(in->arr);
}

/* Classify src and hold what the call reads.  0, or -1 with TypeError /
 * ValueError (and *in released).  GIL held. */
static int
fl_input_load(PyObject *src, fl_input *in)
{
    memset(in, 0, sizeof *in);
    if (PyArray_Check(src) && PyArray_NDIM((PyArrayObject *)src) >= 2) {
        PyArrayObject *a = (PyArrayObject *)src;
        int nd = PyArray_NDIM(a);
        if (PyArray_TYPE(a) != NPY_UINT8) {
            PyErr_Format(PyExc_TypeError, "an image array must be uint8 (H x W or H x W x C), not %S",
                         (PyObject *)PyArray_DESCR(a));
            return -1;
        }
        if (nd > 3 || (nd == 3 && PyArray_DIM(a, 2) != 1 && PyArray_DIM(a, 2) != 3)) {
            PyErr_Format(PyExc_ValueError, "an image array must be H x W or H x W x C with C 1 or 3, got %d "
                         "dimensions%s", nd, nd == 3 ? " and C not 1 or 3" : "");
            return -1;
        }
        if (PyArray_DIM(a, 0) < 1 || PyArray_DIM(a, 1) < 1 || PyArray_DIM(a, 0) > INT_MAX ||
            PyArray_DIM(a, 1) > INT_MAX) {
            PyErr_SetString(PyExc_ValueError, "an image array must have between 1 and INT_MAX rows and columns");
            return -1;
        }
        in->kind = IN_PIXELS;
        in->arr = PyArray_GETCONTIGUOUS(a);
        if (in->arr == NULL)
            return -1;
        in->h = (int)PyArray_DIM(a, 0);
        in->w = (int)PyArray_DIM(a, 1);
        in->c = nd == 3 ? (int)PyArray_DIM(a, 2) : 1;
        in->name = PyUnicode_FromString("<array>");
    } else if (PyObject_CheckBuffer(src)) {
        in->kind = IN_BYTES;
        if (PyObject_GetBuffer(src, &in->view, PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        in->have_view = 1;
        in->name = PyUnicode_FromString("<bytes>");
    } else if (PyUnicode_Check(src) || PyObject_HasAttrString(src, "__fspath__")) {
        PyObject *fs = PyOS_FSPath(src);
        if (fs == NULL)
            return -1;
        in->kind = IN_PATH;
        in->name = PyUnicode_Check(fs) ? Py_NewRef(fs)
                                       : PyUnicode_DecodeFSDefaultAndSize(PyBytes_AS_STRING(fs), PyBytes_GET_SIZE(fs));
        int ok = in->name != NULL && PyUnicode_FSConverter(fs, &in->path);
        Py_DECREF(fs);
        if (!ok) {
            fl_input_release(in);
            return -1;
        }
    } else {
        PyErr_Format(PyExc_TypeError,
                     "src must be a path (str or os.PathLike), encoded bytes (bytes, bytearray, memoryview) "
                     "or a uint8 image array (numpy, H x W x C), not %.100s", Py_TYPE(src)->tp_name);
        return -1;
    }
    if (in->name == NULL) {
        fl_input_release(in);
        return -1;
    }
    return 0;
}

/* Raise err for input `in`: the reason after the path (or "<bytes>"), an
 * OSError's filename set to the path.  Always NULL.  GIL held. */
static PyObject *
fl_call_raise(PyObject *module, const fl_input *in, const fl_err *err)
{
    /* backslashreplace: a non-UTF-8 file name still gives a message */
    PyObject *utf8 = PyUnicode_AsEncodedString(in->name, "utf-8", "backslashreplace");
    if (utf8 == NULL)
        return NULL;
    char msg[1400];
    snprintf(msg, sizeof msg, "%.1000s: %s", PyBytes_AS_STRING(utf8), err->msg);
    Py_DECREF(utf8);
    PyObject *e = fl_py_error_new(module, err->code, err->errnum, msg, in->kind == IN_PATH ? in->name : NULL, NULL);
    if (e != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

/* ---- NativeCall ------------------------------------------------------------ */

static PyObject *
nc_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"spec", "dct_scaling", "max_pixels", NULL};
    PyObject *spec;
    int dct = 0;
    unsigned long long max_pixels = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|pK:NativeCall", kwlist, &spec, &dct, &max_pixels))
        return NULL;
    NativeCallObject *self = (NativeCallObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    if (fl_tspec_from_pydict(PyType_GetModule(type), spec, &self->ds.spec) < 0)
        goto error;
    if (self->ds.spec.out_w <= 0 || self->ds.spec.out_h <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        "the native call needs a fixed output size, as a native dataset does: add "
                        "RandomResizedCrop, Resize((h, w)) or Resize + CenterCrop to the transform");
        goto error;
    }
    self->ds.dct_scaling = dct;
    self->ds.max_pixels = max_pixels;
    self->ds.sample_bytes = fl_tspec_sample_bytes(&self->ds.spec);
    self->ds.timing = 0;   /* no stats() reads this object's stage clocks */
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static void
nc_dealloc(NativeCallObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    for (int i = 0; i < self->nidle; i++)
        fl_native_worker_free(self->idle[i]);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* call(src, index, epoch, seed) -> Buffer, or None for another image format */
static PyObject *
nc_call(NativeCallObject *self, PyObject *args)
{
    PyObject *src;
    long long index;
    unsigned long long epoch, seed;
    if (!PyArg_ParseTuple(args, "OLKK:call", &src, &index, &epoch, &seed))
        return NULL;
    fl_input in;
    if (fl_input_load(src, &in) < 0)
        return NULL;
    const fl_native_ds *ds = &self->ds;
    /* ownership: w moves from the idle list to this call, and back below */
    fl_native_worker *w = self->nidle > 0 ? self->idle[--self->nidle] : NULL;
    void *out = NULL;
    int rc;
    fl_err err = {0, "", 0};
    const char *path = in.path ? PyBytes_AS_STRING(in.path) : NULL;
    const uint8_t *pix = in.arr ? (const uint8_t *)PyArray_DATA(in.arr) : NULL;
    Py_BEGIN_ALLOW_THREADS
    /* malloc, not PyMem_Malloc: no GIL here */
    if (w == NULL)
        w = fl_native_worker_new(ds);
    out = w ? fl_aligned_alloc(ds->sample_bytes) : NULL;
    if (out == NULL) {
        err.code = FL_ERR_NOMEM;
        snprintf(err.msg, sizeof err.msg, "out of memory for a %zu-byte sample", ds->sample_bytes);
        rc = -1;
    } else if (in.kind == IN_PATH) {
        long long n = fl_source_read_file(path, &w->file, FL_SOURCE_MAX_FILE_BYTES, &err);
        rc = n < 0 ? -1 : fl_native_render_encoded(w, ds, w->file.data, (size_t)n, index, seed, epoch, out, &err);
    } else if (in.kind == IN_BYTES) {
        rc = fl_native_render_encoded(w, ds, in.view.buf, (size_t)in.view.len, index, seed, epoch, out, &err);
    } else {
        rc = fl_native_render_decoded(w, ds, pix, in.w, in.h, in.c, index, seed, epoch, out, &err);
    }
    Py_END_ALLOW_THREADS
    if (w != NULL) {
        if (self->nidle < FL_CALL_IDLE)
            self->idle[self->nidle++] = w;
        else
            fl_native_worker_free(w);
    }
    PyObject *module = PyType_GetModule(Py_TYPE(self));
    PyObject *res = NULL;
    if (rc < 0) {
        fl_call_raise(module, &in, &err);
    } else if (rc == 1) {
        res = Py_NewRef(Py_None);
    } else {
        int64_t shape[3];
        fl_native_sample_shape(&ds->spec, shape);
        DLDevice cpu = {kDLCPU, 0};
        res = fl_buffer_new(module, out, ds->sample_bytes, 3, shape, fl_native_sample_dltype(&ds->spec), cpu,
                            fl_aligned_free, NULL);
        if (res != NULL)
            out = NULL;   /* the Buffer frees it */
    }
    free(out);
    fl_input_release(&in);
    return res;
}

static PyObject *
nc_get_sample_shape(NativeCallObject *self, void *Py_UNUSED(c))
{
    int64_t s[3];
    fl_native_sample_shape(&self->ds.spec, s);
    return Py_BuildValue("(LLL)", (long long)s[0], (long long)s[1], (long long)s[2]);
}

static PyObject *
nc_get_idle(NativeCallObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(self->nidle);
}

static PyMethodDef nc_methods[] = {
    {"call", (PyCFunction)nc_call, METH_VARARGS,
     "call(src, index, epoch, seed) -> Buffer or None: read (a path), decode and transform one sample with "
     "the GIL released; None when src is not a JPEG, PNG or still WebP but may be another image format"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef nc_getset[] = {
    {"sample_shape", (getter)nc_get_sample_shape, NULL, "shape of one output sample", NULL},
    {"idle_workers", (getter)nc_get_idle, NULL, "decoder states kept for the next calls", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot nc_slots[] = {
    {Py_tp_new, nc_new},
    {Py_tp_dealloc, nc_dealloc},
    {Py_tp_methods, nc_methods},
    {Py_tp_getset, nc_getset},
    {Py_tp_doc, "NativeCall(spec, dct_scaling=False, max_pixels=0): one sample at a time from a path, "
                "bytes or a uint8 array, through the native pipeline (fastloader.transforms.NativeTransform)"},
    {0, NULL},
};

static PyType_Spec nc_spec = {
    .name = "fastloader._C.NativeCall",
    .basicsize = sizeof(NativeCallObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = nc_slots,
};

int
fl_register_native_call(PyObject *m)
{
    PyTypeObject *t = (PyTypeObject *)PyType_FromModuleAndSpec(m, &nc_spec, NULL);
    if (t == NULL)
        return -1;
    int rc = PyModule_AddType(m, t);
    Py_DECREF(t);   /* the module's dict keeps the type */
    return rc;
}
