/* py_buffer.c: fastloader._C.Buffer (a block of batch memory exported
 * through DLPack) and _C.stack (default collation of arrays and tensors,
 * copied without the GIL).
 *
 * Ownership: a Buffer owns its memory and frees it (through its free
 * function) in tp_dealloc.  Every DLPack capsule it exports holds a strong
 * reference to the Buffer in manager_ctx, so the memory lives until the
 * last consumer (torch tensor, numpy array) has called the deleter.
 */
#define NO_IMPORT_ARRAY
#include "binding.h"
#include "dlpack.h"
#include "pybuffer.h"

#include <structmember.h>

#include <stdlib.h>
#include <string.h>

#define FL_MAX_NDIM 16

typedef struct {
    PyObject_HEAD
    void *data;            /* owned: released by free_fn(free_ctx, data) */
    size_t nbytes;
    int ndim;
    int64_t shape[FL_MAX_NDIM];
    DLDataType dtype;
    DLDevice device;
    fl_buffer_free_fn free_fn;
    void *free_ctx;
    PyObject *weakreflist;
} fl_buffer;

/* ---- allocation helpers ------------------------------------------------ */

void
fl_aligned_free(void *ctx, void *data)
{
    (void)ctx;
    free(data);
}

void *
fl_aligned_alloc(size_t nbytes)
{
    void *p = NULL;
    /* 64-byte alignment for SIMD stores; malloc-family because buffers are
     * filled and may be freed by threads that do not hold the GIL. */
    if (posix_memalign(&p, 64, nbytes ? nbytes : 1) != 0)
        return NULL;
    return p;
}

static PyTypeObject *
buffer_type(PyObject *module)
{
    return fl_get_state(module)->BufferType;
}

PyObject *
fl_buffer_new(PyObject *module, void *data, size_t nbytes, int ndim, const int64_t *shape,
              DLDataType dtype, DLDevice device, fl_buffer_free_fn free_fn, void *free_ctx)
{
    if (ndim < 0 || ndim > FL_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "too many dimensions (%d)", ndim);
        return NULL;
    }
    PyTypeObject *tp = buffer_type(module);
    fl_buffer *b = (fl_buffer *)tp->tp_alloc(tp, 0);
    if (!b)
        return NULL;
    b->data = data;
    b->nbytes = nbytes;
    b->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        b->shape[i] = shape[i];
    b->dtype = dtype;
    b->device = device;
    b->free_fn = free_fn;
    b->free_ctx = free_ctx;
    return (PyObject *)b;
}

static void
buffer_dealloc(fl_buffer *b)
{
    PyTypeObject *tp = Py_TYPE(b);
    if (b->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)b);
    if (b->data && b->free_fn)
        b->free_fn(b->free_ctx, b->data);
    b->data = NULL;
    tp->tp_free((PyObject *)b);
    Py_DECREF(tp);
}

/* ---- DLPack export ------------------------------------------------------ */

/* Release of one export: drops the capsule's reference to the Buffer.  May
 * run on any thread, with or without the GIL: it takes it.  During
 * interpreter finalization it leaks the reference rather than touch a dying
 * interpreter. */
static void
buffer_export_release(void *ctx)
{
    if (Py_IsInitialized() && !FL_IS_FINALIZING()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_DECREF((PyObject *)ctx);
        PyGILState_Release(g);
    }
}

static PyObject *
buffer_dlpack(fl_buffer *self, PyObject *args, PyObject *kwargs)
{
    fl_dlpack_request req;
    /* host memory: the stream argument needs no synchronisation */
    if (fl_dlpack_parse(args, kwargs, self->device, "fastloader buffers are exported without copying",
                        &req) < 0)
        return NULL;
    if (self->data == NULL && self->nbytes) {
        PyErr_SetString(PyExc_BufferError, "buffer has been released");
        return NULL;
    }
    PyObject *cap = fl_dlpack_capsule(self->data, self->device, self->ndim, self->shape, self->dtype,
                                      req.versioned, buffer_export_release, self);
    if (cap)
        Py_INCREF(self); /* owned by the export until its release */
    return cap;
}

static PyObject *
buffer_dlpack_device(fl_buffer *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(ii)", self->device.device_type, self->device.device_id);
}

static PyObject *
buffer_get_shape(fl_buffer *self, void *Py_UNUSED(closure))
{
    return fl_shape_tuple(self->ndim, self->shape);
}

static PyObject *
buffer_get_nbytes(fl_buffer *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(self->nbytes);
}

static PyObject *
buffer_get_ptr(fl_buffer *self, void *Py_UNUSED(closure))
{
    return PyLong_FromVoidPtr(self->data);
}

static PyMethodDef buffer_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dlpack, METH_VARARGS | METH_KEYWORDS,
     "Export as a DLPack capsule (versioned when max_version >= (1, 0))."},
    {"__dlpack_device__", (PyCFunction)buffer_dlpack_device, METH_NOARGS,
     "Return (device_type, device_id) as DLPack defines them."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef buffer_getset[] = {
    {"shape", (getter)buffer_get_shape, NULL, "shape of the buffer", NULL},
    {"nbytes", (getter)buffer_get_nbytes, NULL, "size in bytes", NULL},
    {"ptr", (getter)buffer_get_ptr, NULL, "address of the first byte", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef buffer_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(fl_buffer, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot buffer_slots[] = {
    {Py_tp_dealloc, buffer_dealloc},
    {Py_tp_methods, buffer_methods},
    {Py_tp_getset, buffer_getset},
    {Py_tp_members, buffer_members},
    {Py_tp_doc, "A block of batch memory owned by fastloader, exported with DLPack."},
    {0, NULL},
};

static PyType_Spec buffer_spec = {
    .name = "fastloader._C.Buffer",
    .basicsize = sizeof(fl_buffer),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = buffer_slots,
};

/* ---- stack --------------------------------------------------------------- */

/* One input array: where its bytes are and what keeps them alive. */
typedef struct {
    const char *ptr;
    int ndim;
    int64_t shape[FL_MAX_NDIM];
    int64_t strides[FL_MAX_NDIM]; /* bytes */
    Py_buffer view;               /* valid when has_view */
    int has_view;
    PyObject *capsule;            /* DLPack capsule to release, or NULL */
} stack_item;

/* Map a struct-module format (numpy's buffer format) to DLPack. */
static int
format_to_dtype(const char *fmt, Py_ssize_t itemsize, DLDataType *dt)
{
    if (fmt == NULL)
        fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    else if (*fmt == '>' || *fmt == '!')
        return -1; /* big-endian data: let the generic path convert it */
    dt->lanes = 1;
    dt->bits = (uint8_t)(itemsize * 8);
    switch (fmt[0]) {
    case '?': dt->code = kDLBool; break;
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': dt->code = kDLInt; break;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': dt->code = kDLUInt; break;
    case 'e': case 'f': case 'd': dt->code = kDLFloat; break;
    case 'Z':
        if (fmt[1] != 'f' && fmt[1] != 'd')
            return -1;
        dt->code = kDLComplex;
        break;
    default: return -1;
    }
    return fmt[1] == '\0' || (fmt[0] == 'Z' && fmt[2] == '\0') ? 0 : -1;
}

static void
release_item(stack_item *it)
{
    if (it->has_view)
        PyBuffer_Release(&it->view);
    it->has_view = 0;
    Py_CLEAR(it->capsule);
}

/* Describe `obj` (an array with the buffer protocol or a CPU tensor with
 * __dlpack__).  Returns 1 on success, 0 when the object cannot take the
 * native path (the caller falls back), -1 with an exception set. */
static int
describe_item(PyObject *obj, stack_item *it, DLDataType *dt, Py_ssize_t *itemsize)
{
    memset(it, 0, sizeof *it);
    if (PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, &it->view, PyBUF_RECORDS_RO) < 0) {
            PyErr_Clear();
            return 0;
        }
        it->has_view = 1;
        if (it->view.ndim > FL_MAX_NDIM || format_to_dtype(it->view.format, it->view.itemsize, dt) < 0) {
            release_item(it);
            return 0;
        }
        it->ptr = it->view.buf;
        it->ndim = it->view.ndim;
        *itemsize = it->view.itemsize;
        for (int i = 0; i < it->ndim; i++) {
            it->shape[i] = it->view.shape[i];
            it->strides[i] = it->view.strides ? it->view.strides[i] : 0;
        }
        if (!it->view.strides) {
            int64_t s = *itemsize;
            for (int i = it->ndim - 1; i >= 0; i--) {
                it->strides[i] = s;
                s *= it->shape[i];
            }
        }
        return 1;
    }
    PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
    if (!meth) {
        PyErr_Clear();
        return 0;
    }
    PyObject *cap = PyObject_CallNoArgs(meth);
    Py_DECREF(meth);
    if (!cap) {
        /* e.g. a tensor that requires grad, or a sparse one */
        PyErr_Clear();
        return 0;
    }
    DLManagedTensor *m = PyCapsule_IsValid(cap, "dltensor") ? PyCapsule_GetPointer(cap, "dltensor") : NULL;
    if (!m || m->dl_tensor.device.device_type != kDLCPU || m->dl_tensor.ndim > FL_MAX_NDIM ||
        m->dl_tensor.dtype.lanes != 1) {
        PyErr_Clear();
        Py_DECREF(cap);
        return 0;
    }
    it->capsule = cap;
    const DLTensor *t = &m->dl_tensor;
    *dt = t->dtype;
    *itemsize = (t->dtype.bits + 7) / 8;
    it->ptr = (const char *)t->data + t->byte_offset;
    it->ndim = t->ndim;
    int64_t s = *itemsize;
    for (int i = it->ndim - 1; i >= 0; i--) {
        it->shape[i] = t->shape[i];
        it->strides[i] = t->strides ? t->strides[i] * *itemsize : s;
        s *= t->shape[i];
    }
    return 1;
}

/* Copy an N-d strided array into a compact destination.  No GIL needed. */
static void
copy_strided(char *dst, const char *src, int ndim, const int64_t *shape, const int64_t *strides,
             size_t itemsize)
{
    /* find the innermost compact run */
    int64_t run = (int64_t)itemsize;
    int d = ndim;
    while (d > 0 && strides[d - 1] == run) {
        run *= shape[d - 1];
        d--;
    }
    if (d == 0) {
        memcpy(dst, src, (size_t)run);
        return;
    }
    int64_t idx[FL_MAX_NDIM] = {0};
    for (;;) {
        const char *p = src;
        for (int i = 0; i < d; i++)
            p += idx[i] * strides[i];
        memcpy(dst, p, (size_t)run);
        dst += run;
        int i = d - 1;
        while (i >= 0 && ++idx[i] == shape[i]) {
            idx[i] = 0;
            i--;
        }
        if (i < 0)
            break;
    }
}

/* stack(items) -> Buffer | None
 * Collates a sequence of equally shaped arrays or CPU tensors of one dtype
 * into a new [len(items), *shape] Buffer.  Returns None when the inputs
 * need torch's own path (mixed dtypes or shapes, non-CPU tensors, tensors
 * requiring grad): the caller then calls torch's collate, which reports
 * size mismatches with torch's own message. */
static PyObject *
fl_stack(PyObject *module, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "stack() expects a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    stack_item *items = NULL;
    void *data = NULL;
    if (n == 0) {
        Py_DECREF(seq);
        Py_RETURN_NONE;
    }
    items = PyMem_Calloc((size_t)n, sizeof *items);
    if (!items) {
        PyErr_NoMemory();
        goto done;
    }
    DLDataType dt0 = {0, 0, 0};
    Py_ssize_t itemsize0 = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        DLDataType dt;
        Py_ssize_t isz;
        int r = describe_item(PySequence_Fast_GET_ITEM(seq, k), &items[k], &dt, &isz);
        if (r < 0)
            goto done;
        if (r == 0)
            goto fallback;
        if (k == 0) {
            dt0 = dt;
            itemsize0 = isz;
        } else {
            if (dt.code != dt0.code || dt.bits != dt0.bits || items[k].ndim != items[0].ndim)
                goto fallback;
            for (int i = 0; i < items[0].ndim; i++)
                if (items[k].shape[i] != items[0].shape[i])
                    goto fallback;
        }
    }
    size_t per = (size_t)itemsize0;
    for (int i = 0; i < items[0].ndim; i++)
        per *= (size_t)items[0].shape[i];
    size_t total = per * (size_t)n;
    Py_BEGIN_ALLOW_THREADS
    data = fl_aligned_alloc(total);
    if (data && per > 0) { /* an empty sample (a 0 in its shape) copies nothing */
        for (Py_ssize_t k = 0; k < n; k++)
            copy_strided((char *)data + per * (size_t)k, items[k].ptr, items[k].ndim, items[k].shape,
                         items[k].strides, (size_t)itemsize0);
    }
    Py_END_ALLOW_THREADS
    if (!data) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t shape[FL_MAX_NDIM + 1];
    shape[0] = n;
    for (int i = 0; i < items[0].ndim; i++)
        shape[i + 1] = items[0].shape[i];
    if (items[0].ndim + 1 > FL_MAX_NDIM)
        goto fallback;
    DLDevice cpu = {kDLCPU, 0};
    result = fl_buffer_new(module, data, total, items[0].ndim + 1, shape, dt0, cpu, fl_aligned_free, NULL);
    if (result)
        data = NULL; /* owned by the Buffer now */
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    free(data);
    /* entries never described are zeroed, so releasing all n is safe */
    for (Py_ssize_t k = 0; items && k < n; k++)
        release_item(&items[k]);
    PyMem_Free(items);
    Py_DECREF(seq);
    return result;
}

static PyObject *
fl_empty_buffer(PyObject *module, PyObject *args)
{
    /* empty_buffer(nbytes) -> 1-D uint8 Buffer, for tests of the export path */
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "n:empty_buffer", &nbytes))
        return NULL;
    if (nbytes < 0)
        return PyErr_Format(PyExc_ValueError, "nbytes must be >= 0");
    void *data = fl_aligned_alloc((size_t)nbytes);
    if (!data)
        return PyErr_NoMemory();
    memset(data, 0, (size_t)nbytes);
    int64_t shape[1] = {nbytes};
    DLDataType u8 = {kDLUInt, 8, 1};
    DLDevice cpu = {kDLCPU, 0};
    PyObject *b = fl_buffer_new(module, data, (size_t)nbytes, 1, shape, u8, cpu, fl_aligned_free, NULL);
    if (!b)
        free(data);
    return b;
}

static PyMethodDef buffer_functions[] = {
    {"stack", (PyCFunction)fl_stack, METH_O,
     "stack(items) -> Buffer | None: collate equally shaped arrays/CPU tensors, copying without the GIL."},
    {"empty_buffer", (PyCFunction)fl_empty_buffer, METH_VARARGS, "empty_buffer(nbytes) -> zeroed uint8 Buffer"},
    {NULL, NULL, 0, NULL},
};

int
fl_register_buffer(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    st->BufferType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &buffer_spec, NULL);
    if (!st->BufferType)
        return -1;
    if (PyModule_AddType(m, st->BufferType) < 0)
        return -1;
    return PyModule_AddFunctions(m, buffer_functions);
}
