/* py_native.c: the native image pipeline's dataset as a Python object.
 *
 *   NativeDataset(source, labels, spec, on_error="raise", dct_scaling=False, max_pixels=0)
 *       an immutable source of samples (a _C.Source, or a list of file
 *       paths) + labels + a compiled transform; can load
 *       a batch on the calling thread (GIL released) for num_workers=0.
 *
 * NativeEngine, the worker threads that load its batches, is in
 * py_native_engine.c; this file lends it what py_native.h declares.
 *
 * A finished batch comes back as (images, labels, events, failed): images
 * and labels are Buffers (DLPack) over the batch memory the workers wrote;
 * events lists skipped / replaced / failed samples and the slots that need a
 * Pillow fix-up (non-JPEG files), as (kind, index, by, message, code, errno)
 * tuples; code and errno feed _C._error, the one translator.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "cuda/cuda.h"
#include "native/native.h"
#include "binding/py_native.h"
#include "binding/py_transform.h"
#include "binding/py_buffer.h"

#include <structmember.h>
#include <numpy/arrayobject.h>
#include <stdlib.h>
#include <string.h>

/* Idle batch buffers kept for reuse: enough for a prefetch window of a few
 * workers; more would only hold memory the consumer no longer uses. */
#define FL_POOL_IDLE 8

typedef struct {
    PyObject_HEAD
    fl_native_ds ds;          /* source reference and labels owned */
    fl_pool *pool;            /* batch buffers for the current batch capacity; owned ref */
    int pool_batch;           /* samples per pool buffer */
    int pin_device;           /* >= 0: batch buffers page-locked for this CUDA device; -1: not */
    fl_native_worker *inline_worker; /* for loads on the calling thread; guarded by the GIL */
} NativeDatasetObject;

/* Drop a pool reference with the GIL released: the last one frees up to
 * FL_POOL_IDLE idle buffers, and cudaFreeHost of a pinned one synchronises
 * the device.  Call with the GIL held; NULL is ignored. */
static void
pool_unref_nogil(fl_pool *p)
{
    if (p == NULL)
        return;
    Py_BEGIN_ALLOW_THREADS
    fl_pool_unref(p);
    Py_END_ALLOW_THREADS
}

/* ---- conversions (GIL held) ----------------------------------------------- */

/* fl_native_batch_free with the GIL held: the images go back through
 * fl_py_pool_put (py_buffer.h), which releases the GIL only around freeing
 * page-locked memory. */
static void
batch_free_gil(fl_native_batch *b)
{
    if (b->images) {
        fl_py_pool_put(b->pool, b->images);
        b->images = NULL;
    }
    fl_native_batch_free(b);
}

static const char *event_names[] = {"error", "skipped", "replaced", "fixup"};

/* Turn a finished batch into (images, labels, events, failed); consumes b. */
PyObject *
fl_py_native_batch(PyObject *module, const fl_native_ds *ds, fl_native_batch *b)
{
    PyObject *images = NULL, *labels = NULL, *events = NULL, *out = NULL;
    if (b == NULL)
        return PyErr_NoMemory();
    if (b->events_lost) {
        batch_free_gil(b);
        return PyErr_Format(PyExc_MemoryError, "out of memory while recording what happened to a batch's samples");
    }
    events = PyList_New(0);
    if (!events)
        goto done;
    for (int i = 0; i < b->nevents; i++) {
        fl_native_event *e = &b->events[i];
        /* the reason may hold bytes of a file name (libjpeg's messages do
         * not, but strerror's locale might): decode it like one */
        PyObject *msg = PyUnicode_DecodeFSDefault(e->msg);
        PyObject *ev = msg ? Py_BuildValue("(sLLNii)", event_names[b->event_kind[i]], (long long)e->index,
                                           (long long)e->by, msg, e->code, e->errnum) : NULL;
        if (!ev || PyList_Append(events, ev) < 0) {
            Py_XDECREF(ev);
            goto done;
        }
        Py_DECREF(ev);
    }
    if (!b->failed && b->images) {
        int64_t shape[4];
        shape[0] = b->n;
        fl_native_sample_shape(&ds->spec, shape + 1);
        DLDevice cpu = {kDLCPU, 0};
        images = fl_buffer_new(module, b->images, ds->sample_bytes * (size_t)b->n, 4, shape,
                               fl_native_sample_dltype(&ds->spec), cpu, fl_py_pool_put, b->pool);
        if (!images)
            goto done;
        b->images = NULL; /* the Buffer returns it to the pool */
        DLDataType i64 = {kDLInt, 64, 1};
        labels = fl_buffer_new(module, b->labels, sizeof(int64_t) * (size_t)b->n, 1, shape, i64, cpu,
                               fl_aligned_free, NULL);
        if (!labels)
            goto done;
        b->labels = NULL;
    }
    out = Py_BuildValue("(OOOO)", images ? images : Py_None, labels ? labels : Py_None, events,
                        b->failed ? Py_True : Py_False);
done:
    Py_XDECREF(images);
    Py_XDECREF(labels);
    Py_XDECREF(events);
    batch_free_gil(b);
    return out;
}

/* A sequence of ints as int64 rows (py_native.h). */
int64_t *
fl_py_parse_row_indices(PyObject *obj, int64_t n, Py_ssize_t *count)
{
    PyObject *seq = PySequence_Fast(obj, "indices must be a sequence of ints");
    if (!seq)
        return NULL;
    /* Read a tuple: an item's __index__ may run any code, even empty the
     * list being read (which would leave us reading freed memory). */
    if (PyList_Check(seq)) {
        Py_SETREF(seq, PyList_AsTuple(seq));
        if (!seq)
            return NULL;
    }
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(k ? k : 1));
    if (!idx) {
        Py_DECREF(seq);
        return (int64_t *)PyErr_NoMemory();
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < k; i++) {
        long long v = PyLong_AsLongLong(items[i]);
        if (v == -1 && PyErr_Occurred()) {
            free(idx);
            Py_DECREF(seq);
            return NULL;
        }
        idx[i] = v < 0 && v >= -n ? v + n : v;
    }
    Py_DECREF(seq);
    *count = k;
    return idx;
}

/* fl_py_parse_row_indices with nothing wrapped (py_native.h). */
int64_t *
fl_py_parse_indices(PyObject *obj, int *count)
{
    Py_ssize_t k = 0;
    int64_t *idx = fl_py_parse_row_indices(obj, 0, &k);
    *count = (int)k;
    return idx;
}

/* Make sure the dataset's pool holds buffers for `count` samples.  Returns
 * the pool (borrowed), NULL with an exception on failure.  GIL held. */
static fl_pool *
ds_pool_for(NativeDatasetObject *self, int count)
{
    if (count < 1)
        count = 1;
    if (!self->pool || self->pool_batch < count) {
        fl_pool *p = fl_pool_new(self->ds.sample_bytes * (size_t)count, FL_POOL_IDLE);
        if (!p) {
            PyErr_NoMemory();
            return NULL;
        }
        if (self->pin_device >= 0)
            fl_pool_set_pinned(p, self->pin_device, fl_cuda_pinner());
        fl_pool *old = self->pool;
        self->pool = p;
        self->pool_batch = count;
        pool_unref_nogil(old);
    }
    return self->pool; /* borrowed: callers that keep it take fl_pool_ref */
}

/* The dataset's C description, borrowed (py_native.h). */
const fl_native_ds *
fl_py_native_ds(PyObject *dataset)
{
    return &((NativeDatasetObject *)dataset)->ds;
}

/* ds_pool_for for NativeEngine.submit (py_native.h). */
fl_pool *
fl_py_native_pool_for(PyObject *dataset, int count)
{
    return ds_pool_for((NativeDatasetObject *)dataset, count);
}

/* ---- NativeDataset ----------------------------------------------------------- */

static PyObject *
nds_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"source", "labels", "spec", "on_error", "dct_scaling", "max_pixels", NULL};
    PyObject *paths, *labels, *spec;
    const char *on_error = "raise";
    int dct = 0;
    unsigned long long max_pixels = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|spK:NativeDataset", kwlist, &paths, &labels, &spec,
                                     &on_error, &dct, &max_pixels))
        return NULL;
    NativeDatasetObject *self = (NativeDatasetObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    fl_native_ds *ds = &self->ds;
    self->pin_device = -1;
    if (fl_tspec_from_pydict(PyType_GetModule(type), spec, &ds->spec) < 0)
        goto error;
    if (ds->spec.out_w <= 0 || ds->spec.out_h <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        "native batches need a fixed output size: add RandomResizedCrop, Resize((h, w)) or "
                        "Resize + CenterCrop to the transform");
        goto error;
    }
    if (strcmp(on_error, "raise") == 0)
        ds->on_error = FL_ON_ERROR_RAISE;
    else if (strcmp(on_error, "skip") == 0)
        ds->on_error = FL_ON_ERROR_SKIP;
    else if (strcmp(on_error, "replace") == 0)
        ds->on_error = FL_ON_ERROR_REPLACE;
    else {
        PyErr_Format(PyExc_ValueError, "on_error must be 'raise', 'skip' or 'replace', got '%s'", on_error);
        goto error;
    }
    ds->dct_scaling = dct;
    ds->max_pixels = max_pixels;
    /* per-stage clocks are always on; FASTLOADER_STATS=0 exists only so
     * their cost can be measured (benchmarks/bench_stats_overhead.py) */
    const char *env = getenv("FASTLOADER_STATS");
    ds->timing = !(env && strcmp(env, "0") == 0);
    ds->sample_bytes = fl_tspec_sample_bytes(&ds->spec);
    /* the source: a _C.Source, or a list of paths (a files source) */
    PyObject *module = PyType_GetModule(type);
    fl_source *src = fl_py_source_get(module, paths);
    if (src) {
        ds->src = fl_source_ref(src);
    } else {
        PyObject *made = PyObject_CallMethod(module, "file_source", "O", paths);
        if (!made)
            goto error;
        ds->src = fl_source_ref(fl_py_source_get(module, made));
        Py_DECREF(made);
    }
    Py_ssize_t n = (Py_ssize_t)ds->src->n;
    ds->n = n;
    ds->labels = calloc((size_t)(n ? n : 1), sizeof(int64_t));
    if (!ds->labels) {
        PyErr_NoMemory();
        goto error;
    }
    if (labels != Py_None) {
        PyObject *lseq = PySequence_Fast(labels, "labels must be a sequence of ints");
        if (!lseq)
            goto error;
        if (PySequence_Fast_GET_SIZE(lseq) != n) {
            Py_DECREF(lseq);
            PyErr_Format(PyExc_ValueError, "got %zd labels for %zd samples", PySequence_Fast_GET_SIZE(lseq), n);
            goto error;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(lseq, i));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(lseq);
                goto error;
            }
            ds->labels[i] = v;
        }
        Py_DECREF(lseq);
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            ds->labels[i] = -1;
    }
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static void
nds_dealloc(NativeDatasetObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    fl_native_worker_free(self->inline_worker);
    pool_unref_nogil(self->pool);
    fl_native_ds_clear(&self->ds);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* load_batch(indices, epoch, seed) -> (images, labels, events, failed), on this thread */
static PyObject *
nds_load_batch(NativeDatasetObject *self, PyObject *args)
{
    PyObject *ind;
    unsigned long long epoch, seed;
    if (!PyArg_ParseTuple(args, "OKK:load_batch", &ind, &epoch, &seed))
        return NULL;
    int count;
    int64_t *idx = fl_py_parse_indices(ind, &count);
    if (!idx)
        return NULL;
    if (!self->inline_worker && !(self->inline_worker = fl_native_worker_new(&self->ds))) {
        free(idx);
        return PyErr_NoMemory();
    }
    fl_pool *pool = ds_pool_for(self, count);
    if (!pool) {
        free(idx);
        return NULL;
    }
    fl_native_batch *b;
    fl_native_worker *w = self->inline_worker;
    self->inline_worker = NULL; /* not re-entrant: other threads see none while we run */
    fl_pool_ref(pool);          /* another thread may replace the dataset's pool meanwhile */
    Py_BEGIN_ALLOW_THREADS
    b = fl_native_load_batch(w, &self->ds, pool, idx, count, seed, epoch, NULL);
    fl_pool_unref(pool);
    Py_END_ALLOW_THREADS
    if (self->inline_worker == NULL)
        self->inline_worker = w;
    else
        fl_native_worker_free(w);
    free(idx);
    return fl_py_native_batch(PyType_GetModule(Py_TYPE(self)), &self->ds, b);
}

/* render_array(image[H,W,C] uint8, index, epoch, seed) -> Buffer of one sample:
 * the same plan and render as a decoded JPEG, for images Pillow decoded. */
static PyObject *
nds_render_array(NativeDatasetObject *self, PyObject *args)
{
    PyObject *arr_obj;
    long long index;
    unsigned long long epoch, seed;
    if (!PyArg_ParseTuple(args, "OLKK:render_array", &arr_obj, &index, &epoch, &seed))
        return NULL;
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROMANY(arr_obj, NPY_UINT8, 3, 3, NPY_ARRAY_C_CONTIGUOUS);
    if (!arr)
        return NULL;
    int h = (int)PyArray_DIM(arr, 0), w = (int)PyArray_DIM(arr, 1), c = (int)PyArray_DIM(arr, 2);
    if (c != 1 && c != 3) {
        Py_DECREF(arr);
        return PyErr_Format(PyExc_ValueError, "image must have 1 or 3 channels, got %d", c);
    }
    fl_plan plan;
    fl_err e = {0};
    if (fl_plan_sample(&self->ds.spec, w, h, seed, epoch, (uint64_t)index, &plan, &e) < 0) {
        Py_DECREF(arr);
        return fl_py_raise(PyType_GetModule(Py_TYPE(self)), &e, NULL, NULL);
    }
    void *out = fl_aligned_alloc(self->ds.sample_bytes);
    if (!out) {
        Py_DECREF(arr);
        return PyErr_NoMemory();
    }
    fl_view view = {PyArray_DATA(arr), w, h, (size_t)w * (size_t)c, c, 0.0, 0.0, 1.0, 1.0};
    fl_scratch scratch = {NULL, 0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_render(&self->ds.spec, &plan, &view, out, &scratch, &e);
    fl_scratch_free(&scratch);
    Py_END_ALLOW_THREADS
    Py_DECREF(arr);
    if (rc < 0) {
        free(out);
        return fl_py_raise(PyType_GetModule(Py_TYPE(self)), &e, NULL, NULL);
    }
    int64_t shape[3];
    fl_native_sample_shape(&self->ds.spec, shape);
    DLDevice cpu = {kDLCPU, 0};
    PyObject *b = fl_buffer_new(PyType_GetModule(Py_TYPE(self)), out, self->ds.sample_bytes, 3, shape,
                                fl_native_sample_dltype(&self->ds.spec), cpu, fl_aligned_free, NULL);
    if (!b)
        free(out);
    return b;
}

/* replacement_candidates(index, epoch, seed) -> list of int: the samples
 * on_error="replace" tries for a bad sample, in order (native.h) */
static PyObject *
nds_replacement_candidates(NativeDatasetObject *self, PyObject *args)
{
    long long index;
    unsigned long long epoch, seed;
    int64_t alts[FL_NATIVE_REPLACE_TRIES];
    if (!PyArg_ParseTuple(args, "LKK:replacement_candidates", &index, &epoch, &seed))
        return NULL;
    int n = fl_native_replacements(&self->ds, index, seed, epoch, alts);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong((long long)alts[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

/* plan(index, width, height, epoch, seed) -> dict: the sample's decisions */
static PyObject *
nds_plan(NativeDatasetObject *self, PyObject *args)
{
    long long index;
    int w, h;
    unsigned long long epoch, seed;
    if (!PyArg_ParseTuple(args, "LiiKK:plan", &index, &w, &h, &epoch, &seed))
        return NULL;
    fl_plan p;
    fl_err e = {0};
    if (fl_plan_sample(&self->ds.spec, w, h, seed, epoch, (uint64_t)index, &p, &e) < 0)
        return fl_py_raise(PyType_GetModule(Py_TYPE(self)), &e, NULL, NULL);
    return fl_plan_to_dict(&p);
}

static PyObject *
nds_get_sample_shape(NativeDatasetObject *self, void *Py_UNUSED(c))
{
    int64_t s[3];
    fl_native_sample_shape(&self->ds.spec, s);
    return Py_BuildValue("(LLL)", (long long)s[0], (long long)s[1], (long long)s[2]);
}

static PyObject *
nds_get_len(NativeDatasetObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromLongLong(self->ds.n);
}

static PyObject *
nds_get_pool_bytes(NativeDatasetObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromSize_t(self->pool ? fl_pool_bytes_in_use(self->pool) : 0);
}

/* set_pinned(device): future batch buffers are page-locked for CUDA device
 * `device` (-1: ordinary memory).  The current pool is replaced. */
static PyObject *
nds_set_pinned(NativeDatasetObject *self, PyObject *arg)
{
    long dev = PyLong_AsLong(arg);
    if (dev == -1 && PyErr_Occurred())
        return NULL;
    if (dev != self->pin_device) {
        self->pin_device = (int)dev;
        fl_pool *old = self->pool;
        self->pool = NULL;
        self->pool_batch = 0;
        pool_unref_nogil(old); /* buffers out keep their pool alive */
    }
    Py_RETURN_NONE;
}

static PyObject *
nds_get_pin_error(NativeDatasetObject *self, void *Py_UNUSED(c))
{
    const char *e = self->pool ? fl_pool_pin_error(self->pool) : NULL;
    if (!e)
        Py_RETURN_NONE;
    return PyUnicode_FromString(e);
}

static PyObject *
nds_get_pool_bytes_out(NativeDatasetObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromSize_t(self->pool ? fl_pool_bytes_out(self->pool) : 0);
}

static PyMethodDef nds_methods[] = {
    {"load_batch", (PyCFunction)nds_load_batch, METH_VARARGS,
     "load_batch(indices, epoch, seed) -> (images, labels, events, failed) on the calling thread"},
    {"render_array", (PyCFunction)nds_render_array, METH_VARARGS,
     "render_array(image, index, epoch, seed) -> Buffer: transform an already decoded image"},
    {"plan", (PyCFunction)nds_plan, METH_VARARGS, "plan(index, width, height, epoch, seed) -> dict"},
    {"replacement_candidates", (PyCFunction)nds_replacement_candidates, METH_VARARGS,
     "replacement_candidates(index, epoch, seed) -> list: the substitutes on_error='replace' tries, in order"},
    {"set_pinned", (PyCFunction)nds_set_pinned, METH_O, "set_pinned(device): page-lock batch buffers for it (-1: off)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef nds_getset[] = {
    {"sample_shape", (getter)nds_get_sample_shape, NULL, "shape of one output sample", NULL},
    {"num_samples", (getter)nds_get_len, NULL, "number of files", NULL},
    {"pool_bytes", (getter)nds_get_pool_bytes, NULL, "bytes held by the batch buffer pool", NULL},
    {"pool_bytes_out", (getter)nds_get_pool_bytes_out, NULL, "bytes of batch buffers in use (not idle)", NULL},
    {"pin_error", (getter)nds_get_pin_error, NULL, "why pinned allocation failed, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot nds_slots[] = {
    {Py_tp_new, nds_new},
    {Py_tp_dealloc, nds_dealloc},
    {Py_tp_methods, nds_methods},
    {Py_tp_getset, nds_getset},
    {Py_tp_doc, "NativeDataset(source, labels, spec, on_error='raise', dct_scaling=False, max_pixels=0): "
                "source is a _C.Source or a list of file paths"},
    {0, NULL},
};

static PyType_Spec nds_spec = {
    .name = "fastloader._C.NativeDataset",
    .basicsize = sizeof(NativeDatasetObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = nds_slots,
};

int
fl_register_native(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    st->NativeDatasetType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &nds_spec, NULL);
    if (!st->NativeDatasetType || PyModule_AddType(m, st->NativeDatasetType) < 0)
        return -1;
    return 0;
}
