/* py_devcopy.c: fastloader._C.DeviceCopier and DeviceTensor, the Python
 * face of devpool.c (batches copied to a GPU on the loader's own stream and
 * handed out through DLPack).
 *
 *   c = DeviceCopier(device, max_buffers=4)
 *   d = c.copy(host)        # host: anything with __dlpack__ on the CPU (a
 *                           # torch tensor, a fastloader Buffer), compact
 *   torch.from_dlpack(d)    # torch passes its current stream: that stream
 *                           # waits on the copy's event, nothing else does
 *   d.copy_done()           # True once the copy finished; the host memory
 *                           # is released then (or by d.wait(), or when d dies)
 *
 * Ownership.  A DeviceTensor holds one fl_devbuf reference and, until its
 * copy is known to be finished, the consumed host DLPack tensor (so the
 * host batch cannot be reused while the GPU still reads it).  Every capsule
 * it exports holds its own fl_devbuf reference in manager_ctx; the capsule
 * deleter only drops that reference, needs no GIL and may run on any thread
 * (torch frees tensors wherever the last reference goes).  The buffer goes
 * back to the pool after the last of them, ordered after the importing
 * streams' work (devpool.h).
 *
 * GIL: copies and blocking waits run with it released; everything else
 * holds it.  The waits a user makes (DeviceTensor.wait,
 * DeviceCopier.synchronize) poll in slices of 50 ms and run
 * PyErr_CheckSignals between them, as fl_py_wait does for batches, so
 * Ctrl-C interrupts them; only the wait in DeviceTensor's dealloc (the host
 * memory must outlive the copy reading it) cannot be interrupted.
 *
 * Errors: the core's fl_err records (CUDA errors from devpool.c; a closed
 * copier is one too) become exceptions through the one translator,
 * fl_py_raise (py_errors.c): FL_ERR_RUNTIME, RuntimeError with the core's
 * message.  Argument checks raise TypeError/ValueError directly, and the
 * DLPack protocol's refusals (fl_devbuf_export's -2 too) BufferError.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "cuda/devpool.h"
#include "core/dlpack.h"
#include "binding/py_buffer.h"

#include <structmember.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FL_DEV_MAX_NDIM 16
#define FL_DEV_SLICE_MS 50 /* longest wait without a signal check */

typedef struct {
    PyObject_HEAD
    fl_devpool *pool; /* owned reference; NULL after close() */
    int device;
} fl_copier;

typedef struct {
    PyObject_HEAD
    fl_devbuf *buf;   /* owned reference */
    int device;
    int ndim;
    int64_t shape[FL_DEV_MAX_NDIM];
    DLDataType dtype;
    void *host;       /* consumed host DLManagedTensor[Versioned], or NULL once released */
    int host_versioned;
    PyObject *weakreflist;
} fl_devtensor;

/* ---- errors and waits ---------------------------------------------------- */

/* Raise the core's record `err` through the one translator.  `obj` is any
 * object of this module's types.  Always returns NULL. */
static PyObject *
raise_err(PyObject *obj, const fl_err *err)
{
    return fl_py_raise(PyType_GetModule(Py_TYPE(obj)), err, NULL, NULL);
}

/* "DeviceCopier is closed", a RuntimeError like the core's failures. */
static PyObject *
raise_closed(PyObject *obj)
{
    fl_err e;
    fl_err_set(&e, FL_ERR_RUNTIME, 0, "DeviceCopier is closed");
    return raise_err(obj, &e);
}

/* One slice of a wait: at most ms milliseconds; 0 when done,
 * FL_CUDA_ERR_NOT_READY when not yet (*err untouched), another code with
 * *err filled on failure.  Runs without the GIL (ms == 0: a single query,
 * which never blocks and may run with it). */
typedef int (*wait_slice_fn)(void *ctx, int ms, fl_err *err);

/* Wait until `slice` says done: one query with the GIL held first (a copy
 * that already finished costs no GIL switch), then slices of FL_DEV_SLICE_MS
 * with it released and PyErr_CheckSignals between them, so Ctrl-C
 * interrupts the wait.  Returns 0, or -1 with an exception set (the signal
 * handler's, or the CUDA failure as RuntimeError).  `obj` names the module
 * for the translator; whatever ctx points to must stay valid without the
 * GIL (the caller holds references). */
static int
wait_interruptibly(PyObject *obj, wait_slice_fn slice, void *ctx)
{
    fl_err err = {0};
    int rc = slice(ctx, 0, &err);
    while (rc == FL_CUDA_ERR_NOT_READY) {
        if (PyErr_CheckSignals() < 0)
            return -1;
        Py_BEGIN_ALLOW_THREADS
        rc = slice(ctx, FL_DEV_SLICE_MS, &err);
        Py_END_ALLOW_THREADS
    }
    if (rc != FL_CUDA_OK) {
        raise_err(obj, &err);
        return -1;
    }
    return 0;
}

static int
copy_slice(void *buf, int ms, fl_err *err)
{
    return fl_devbuf_copy_wait_ms(buf, ms, err);
}

typedef struct {
    fl_devpool *pool;
    fl_cudaEvent_t mark;
} mark_wait;

static int
mark_slice(void *ctx, int ms, fl_err *err)
{
    mark_wait *w = ctx;
    return fl_devpool_mark_wait(w->pool, w->mark, ms, err);
}

/* ---- the consumed host tensor ------------------------------------------- */

/* Call a consumed host DLPack tensor's deleter, if it has one (GIL held:
 * producers may need it). */
static void
release_managed(void *managed, int versioned)
{
    if (versioned) {
        DLManagedTensorVersioned *m = managed;
        if (m->deleter)
            m->deleter(m);
    } else {
        DLManagedTensor *m = managed;
        if (m->deleter)
            m->deleter(m);
    }
}

/* Let go of d's host tensor (a no-op once done). */
static void
release_host(fl_devtensor *d)
{
    void *h = d->host;
    d->host = NULL;
    if (h)
        release_managed(h, d->host_versioned);
}

/* Take the DLPack tensor out of `obj` (consuming the capsule as the
 * protocol says: renamed to used_*).  Returns the DLTensor and sets
 * *managed / *versioned, or NULL with an exception. */
static DLTensor *
take_host_tensor(PyObject *obj, void **managed, int *versioned)
{
    PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
    if (!cap)
        return NULL;
    DLTensor *t = NULL;
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        if (m && PyCapsule_SetName(cap, "used_dltensor") == 0) {
            *managed = m;
            *versioned = 0;
            t = &m->dl_tensor;
        }
    } else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m && PyCapsule_SetName(cap, "used_dltensor_versioned") == 0) {
            *managed = m;
            *versioned = 1;
            t = &m->dl_tensor;
        }
    } else {
        PyErr_Format(PyExc_TypeError, "DeviceCopier.copy: %.100s.__dlpack__() did not return a DLPack capsule",
                     Py_TYPE(obj)->tp_name);
    }
    Py_DECREF(cap);
    return t;
}

/* ---- DeviceTensor --------------------------------------------------------- */

/* Release of one export: drops the capsule's buffer reference.  No GIL
 * needed; torch calls it wherever the last tensor reference goes. */
static void
dev_export_release(void *ctx)
{
    fl_devbuf_unref(ctx);
}

/* DLPack's `stream` argument for CUDA (array API standard): None and 1 mean
 * the legacy default stream, 2 the per-thread default stream, any other
 * positive integer a cudaStream_t, and 0 is ambiguous and refused.  -1 means
 * "do not synchronise": the consumer orders its use after the copy itself
 * (e.g. DeviceTensor.wait()) and must also have finished with the memory
 * when it drops the tensor; we can only order the release after the legacy
 * default stream, which does not cover non-blocking streams. */
static int
parse_stream(PyObject *obj, fl_cudaStream_t *stream, int *no_wait)
{
    *no_wait = 0;
    *stream = FL_CUDA_STREAM_LEGACY;
    if (obj == Py_None)
        return 0;
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "__dlpack__: stream must be None or an int, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow > 0) { /* a pointer above LLONG_MAX */
        *stream = PyLong_AsVoidPtr(obj);
        return *stream || !PyErr_Occurred() ? 0 : -1;
    }
    if (overflow < 0 || v < -1) {
        PyErr_Format(PyExc_ValueError, "__dlpack__: invalid CUDA stream %R", obj);
        return -1;
    }
    if (v == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "__dlpack__: stream=0 is ambiguous for CUDA; pass 1 (legacy default stream), "
                        "2 (per-thread default stream) or a stream handle");
        return -1;
    }
    if (v == -1)
        *no_wait = 1;
    else
        *stream = (fl_cudaStream_t)(uintptr_t)v;
    return 0;
}

static PyObject *
devtensor_dlpack(fl_devtensor *self, PyObject *args, PyObject *kwargs)
{
    DLDevice where = {kDLCUDA, self->device};
    fl_dlpack_request req;
    if (fl_dlpack_parse(args, kwargs, where, "fastloader device batches are exported without copying",
                        &req) < 0)
        return NULL;
    fl_cudaStream_t stream;
    int no_wait;
    if (parse_stream(req.stream, &stream, &no_wait) < 0)
        return NULL;
    fl_err err = {0};
    /* takes the export's buffer reference and queues the stream wait */
    int rc = fl_devbuf_export(self->buf, stream, no_wait, &err);
    if (rc != FL_CUDA_OK) /* -2: too many streams, FL_ERR_EXPORT (BufferError) */
        return raise_err((PyObject *)self, &err);
    PyObject *cap = fl_dlpack_capsule(fl_devbuf_ptr(self->buf), where, self->ndim, self->shape,
                                      self->dtype, req.versioned, dev_export_release, self->buf);
    if (!cap)
        fl_devbuf_unref(self->buf);
    return cap;
}

static PyObject *
devtensor_dlpack_device(fl_devtensor *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(ii)", (int)kDLCUDA, self->device);
}

static PyObject *
devtensor_copy_done(fl_devtensor *self, PyObject *Py_UNUSED(ignored))
{
    fl_err err = {0};
    int rc = fl_devbuf_copy_query(self->buf, &err);
    if (rc == FL_CUDA_ERR_NOT_READY)
        Py_RETURN_FALSE;
    if (rc != FL_CUDA_OK)
        return raise_err((PyObject *)self, &err);
    release_host(self);
    Py_RETURN_TRUE;
}

static PyObject *
devtensor_wait(fl_devtensor *self, PyObject *Py_UNUSED(ignored))
{
    /* self->buf stays put while we wait: only dealloc clears it */
    if (wait_interruptibly((PyObject *)self, copy_slice, self->buf) < 0)
        return NULL;
    release_host(self);
    Py_RETURN_NONE;
}

static PyObject *
devtensor_copy_ms(fl_devtensor *self, PyObject *Py_UNUSED(ignored))
{
    fl_err err = {0};
    int rc = fl_devbuf_copy_query(self->buf, &err);
    if (rc == FL_CUDA_ERR_NOT_READY)
        Py_RETURN_NONE;
    float ms = 0.0f;
    if (rc == FL_CUDA_OK)
        rc = fl_devbuf_copy_ms(self->buf, &ms, &err);
    if (rc != FL_CUDA_OK)
        return raise_err((PyObject *)self, &err);
    return PyFloat_FromDouble(ms);
}

static PyObject *
devtensor_get_shape(fl_devtensor *self, void *Py_UNUSED(closure))
{
    return fl_shape_tuple(self->ndim, self->shape);
}

static PyObject *
devtensor_get_nbytes(fl_devtensor *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(fl_devbuf_bytes(self->buf));
}

static PyObject *
devtensor_get_ptr(fl_devtensor *self, void *Py_UNUSED(closure))
{
    return PyLong_FromVoidPtr(fl_devbuf_ptr(self->buf));
}

static PyObject *
devtensor_get_device(fl_devtensor *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->device);
}

static PyObject *
devtensor_get_holds_host(fl_devtensor *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->host != NULL);
}

static void
devtensor_dealloc(fl_devtensor *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->host && self->buf && fl_devbuf_copy_query(self->buf, NULL) != FL_CUDA_OK) {
        /* The host memory may still be read by the copy: wait for it before
         * giving the memory back (the loader avoids this wait by keeping a
         * DeviceTensor until copy_done()).  Errors cannot be reported from
         * here; the wait fails only when the device is lost, and then nothing
         * reads. */
        Py_BEGIN_ALLOW_THREADS
        fl_devbuf_copy_wait(self->buf, NULL);
        Py_END_ALLOW_THREADS
    }
    release_host(self);
    fl_devbuf_unref(self->buf);
    self->buf = NULL;
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMethodDef devtensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))devtensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "Export as a DLPack capsule on CUDA.  stream (array API rules: None/1 legacy default, 2 "
     "per-thread default, a handle, -1 no synchronisation) waits for the copy on the GPU."},
    {"__dlpack_device__", (PyCFunction)devtensor_dlpack_device, METH_NOARGS,
     "(kDLCUDA, device index)."},
    {"copy_done", (PyCFunction)devtensor_copy_done, METH_NOARGS,
     "True once the host-to-device copy has finished (then the host batch is released)."},
    {"wait", (PyCFunction)devtensor_wait, METH_NOARGS,
     "Block until the copy has finished (GIL released; Ctrl-C interrupts it) and release the host "
     "batch."},
    {"copy_ms", (PyCFunction)devtensor_copy_ms, METH_NOARGS,
     "Milliseconds the copy took on the device, or None while it runs."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef devtensor_getset[] = {
    {"shape", (getter)devtensor_get_shape, NULL, "shape", NULL},
    {"nbytes", (getter)devtensor_get_nbytes, NULL, "size in bytes", NULL},
    {"ptr", (getter)devtensor_get_ptr, NULL, "device address", NULL},
    {"device", (getter)devtensor_get_device, NULL, "CUDA device index", NULL},
    {"holds_host", (getter)devtensor_get_holds_host, NULL,
     "whether the host batch is still kept (its copy not yet seen finished)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef devtensor_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(fl_devtensor, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot devtensor_slots[] = {
    {Py_tp_dealloc, devtensor_dealloc},
    {Py_tp_methods, devtensor_methods},
    {Py_tp_getset, devtensor_getset},
    {Py_tp_members, devtensor_members},
    {Py_tp_doc, "A batch tensor in a fastloader device buffer, exported with DLPack."},
    {0, NULL},
};

static PyType_Spec devtensor_spec = {
    .name = "fastloader._C.DeviceTensor",
    .basicsize = sizeof(fl_devtensor),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = devtensor_slots,
};

/* ---- DeviceCopier ----------------------------------------------------------- */

static PyObject *
copier_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"device", "max_buffers", NULL};
    int device, max_buffers = 4;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|i:DeviceCopier", kwlist, &device, &max_buffers))
        return NULL;
    if (max_buffers < 1)
        return PyErr_Format(PyExc_ValueError, "max_buffers must be >= 1, got %d", max_buffers);
    if (fl_py_cuda_require(PyType_GetModule(type), device) < 0)
        return NULL;
    fl_err err = {0};
    fl_devpool *pool;
    Py_BEGIN_ALLOW_THREADS
    pool = fl_devpool_new(device, max_buffers, &err);
    Py_END_ALLOW_THREADS
    if (!pool)
        return fl_py_raise(PyType_GetModule(type), &err, NULL, NULL);
    fl_copier *self = (fl_copier *)type->tp_alloc(type, 0);
    if (!self) {
        fl_devpool_unref(pool);
        return NULL;
    }
    self->pool = pool;
    self->device = device;
    return (PyObject *)self;
}

static int
copier_check(fl_copier *self)
{
    if (self->pool)
        return 0;
    raise_closed((PyObject *)self);
    return -1;
}

static PyObject *
copier_copy(fl_copier *self, PyObject *obj)
{
    if (copier_check(self) < 0)
        return NULL;
    void *managed = NULL;
    int versioned = 0;
    DLTensor *t = take_host_tensor(obj, &managed, &versioned);
    if (!t)
        return NULL;
    fl_devtensor *d = NULL;
    const char *why = NULL;
    size_t elem = ((size_t)t->dtype.bits * t->dtype.lanes + 7) / 8, count = 1;
    if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
        why = "the tensor is not in host memory";
    else if (t->ndim < 0 || t->ndim > FL_DEV_MAX_NDIM)
        why = "the tensor has too many dimensions";
    else if (t->dtype.bits % 8 != 0)
        why = "sub-byte dtypes are not supported";
    if (!why) {
        int64_t expect = 1;
        for (int i = t->ndim - 1; i >= 0; i--) {
            if (t->strides && t->shape[i] > 1 && t->strides[i] != expect)
                why = "the tensor is not contiguous (call .contiguous() first)";
            expect *= t->shape[i];
            count *= (size_t)t->shape[i];
        }
    }
    if (why) {
        PyErr_Format(PyExc_ValueError, "DeviceCopier.copy: %s", why);
        goto fail;
    }
    PyTypeObject *tp = fl_get_state(PyType_GetModule(Py_TYPE(self)))->DeviceTensorType;
    d = (fl_devtensor *)tp->tp_alloc(tp, 0);
    if (!d)
        goto fail;
    d->device = self->device;
    d->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        d->shape[i] = t->shape[i];
    d->dtype = t->dtype;
    const void *src = (const char *)t->data + t->byte_offset;
    size_t bytes = count * elem;
    fl_err err = {0};
    fl_devbuf *buf = NULL;
    int rc;
    /* __dlpack__ and tp_alloc above may have run Python code that closed
     * us: check again, and take the reference with no Python code between */
    fl_devpool *pool = self->pool;
    if (!pool) {
        raise_closed((PyObject *)self);
        goto fail;
    }
    fl_devpool_ref(pool); /* close() on another thread must not free it under us */
    Py_BEGIN_ALLOW_THREADS
    rc = fl_devpool_copy(pool, src, bytes, &buf, &err);
    fl_devpool_unref(pool);
    Py_END_ALLOW_THREADS
    if (rc != FL_CUDA_OK) {
        raise_err((PyObject *)self, &err);
        goto fail;
    }
    d->buf = buf;
    d->host = managed; /* kept until the copy is seen finished */
    d->host_versioned = versioned;
    return (PyObject *)d;
fail:
    Py_XDECREF(d); /* holds neither the host tensor nor a buffer yet */
    release_managed(managed, versioned);
    return NULL;
}

/* Record a mark after every queued copy, then wait for it interruptibly
 * (a stream synchronisation could not be interrupted). */
static PyObject *
copier_synchronize(fl_copier *self, PyObject *Py_UNUSED(ignored))
{
    if (copier_check(self) < 0)
        return NULL;
    fl_err err = {0};
    int rc, ok = 0;
    mark_wait w = {self->pool, NULL};
    fl_devpool_ref(w.pool); /* close() (another thread, a signal handler) must not free it under us */
    Py_BEGIN_ALLOW_THREADS
    rc = fl_devpool_mark(w.pool, &w.mark, &err);
    Py_END_ALLOW_THREADS
    if (rc != FL_CUDA_OK)
        raise_err((PyObject *)self, &err);
    else
        ok = wait_interruptibly((PyObject *)self, mark_slice, &w) == 0;
    fl_devpool_mark_free(w.pool, w.mark);
    /* ours may be the last reference (closed meanwhile): its end synchronises */
    Py_BEGIN_ALLOW_THREADS
    fl_devpool_unref(w.pool);
    Py_END_ALLOW_THREADS
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
copier_stats(fl_copier *self, PyObject *Py_UNUSED(ignored))
{
    if (copier_check(self) < 0)
        return NULL;
    fl_devpool_stats s;
    fl_devpool_get_stats(self->pool, &s);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:i,s:i,s:n}", "copies",
                         (unsigned long long)s.copies, "bytes_copied",
                         (unsigned long long)s.bytes_copied, "allocations",
                         (unsigned long long)s.allocations, "reused_ready",
                         (unsigned long long)s.reused_ready, "reused_waiting",
                         (unsigned long long)s.reused_waiting, "over_cap",
                         (unsigned long long)s.over_cap, "freed", (unsigned long long)s.freed,
                         "buffers", s.buffers, "idle", s.idle, "device_bytes",
                         (Py_ssize_t)s.device_bytes);
}

/* Drop the copier's pool reference, if it still has one (close and
 * dealloc).  GIL held on entry; released around the unref, because the last
 * reference synchronises the stream and frees idle buffers.  self->pool is
 * NULL before the GIL is released, so no other thread sees it half gone.
 * Device tensors still alive keep the pool through their buffers. */
static void
copier_drop_pool(fl_copier *self)
{
    fl_devpool *pool = self->pool;
    self->pool = NULL;
    if (pool) {
        Py_BEGIN_ALLOW_THREADS
        fl_devpool_unref(pool);
        Py_END_ALLOW_THREADS
    }
}

static PyObject *
copier_close(fl_copier *self, PyObject *Py_UNUSED(ignored))
{
    copier_drop_pool(self);
    Py_RETURN_NONE;
}

static PyObject *
copier_get_stream(fl_copier *self, void *Py_UNUSED(closure))
{
    if (copier_check(self) < 0)
        return NULL;
    return PyLong_FromVoidPtr(fl_devpool_stream(self->pool));
}

static PyObject *
copier_get_device(fl_copier *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->device);
}

static void
copier_dealloc(fl_copier *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    copier_drop_pool(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMethodDef copier_methods[] = {
    {"copy", (PyCFunction)copier_copy, METH_O,
     "copy(host) -> DeviceTensor: queue host -> device on the loader's stream (no host wait)."},
    {"synchronize", (PyCFunction)copier_synchronize, METH_NOARGS,
     "Block until every queued copy has finished (GIL released; Ctrl-C interrupts it)."},
    {"stats", (PyCFunction)copier_stats, METH_NOARGS, "Pool counters as a dict."},
    {"close", (PyCFunction)copier_close, METH_NOARGS,
     "Drop the pool; device tensors still alive keep their buffers."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef copier_getset[] = {
    {"stream", (getter)copier_get_stream, NULL, "the copy stream (cudaStream_t as int)", NULL},
    {"device", (getter)copier_get_device, NULL, "CUDA device index", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot copier_slots[] = {
    {Py_tp_new, copier_new},
    {Py_tp_dealloc, copier_dealloc},
    {Py_tp_methods, copier_methods},
    {Py_tp_getset, copier_getset},
    {Py_tp_doc, "DeviceCopier(device, max_buffers=4): host batches to one CUDA device on a stream "
                "of its own, into pooled device buffers."},
    {0, NULL},
};

static PyType_Spec copier_spec = {
    .name = "fastloader._C.DeviceCopier",
    .basicsize = sizeof(fl_copier),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = copier_slots,
};

int
fl_register_devcopy(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    st->DeviceTensorType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &devtensor_spec, NULL);
    if (!st->DeviceTensorType || PyModule_AddType(m, st->DeviceTensorType) < 0)
        return -1;
    st->DeviceCopierType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &copier_spec, NULL);
    if (!st->DeviceCopierType || PyModule_AddType(m, st->DeviceCopierType) < 0)
        return -1;
    return 0;
}
