/* py_buffer.c: fastloader._C.Buffer (a block of batch memory exported
 * through DLPack), _C.BatchPool (pools of batch buffers by size, page-locked
 * when pinning) and _C.stack (default collation of arrays and tensors,
 * copied without the GIL, into a pooled buffer when given a BatchPool).
 *
 * Why the three share one file (~750 lines): stack fills a BatchPool's
 * buffers and marks Buffers pinned, through both types' private structs;
 * split, those structs would become a header every binding file could
 * reach into.
 *
 * Ownership: a Buffer owns its memory and frees it (through its free
 * function) in tp_dealloc.  Every DLPack capsule it exports holds a strong
 * reference to the Buffer in manager_ctx, so the memory lives until the
 * last consumer (torch tensor, numpy array) has called the deleter.  A
 * pooled Buffer's free function gives the memory back to its fl_pool, and
 * the buffer holds a reference to that fl_pool (pool.h), not to the
 * BatchPool: batches outlive the BatchPool and the loader that made them.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "core/dlpack.h"
#include "core/copy.h"
#include "core/pool.h"
#include "cuda/cuda.h"
#include "binding/py_buffer.h"

#include <structmember.h>

#include <stdlib.h>
#include <string.h>

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
    int pinned;            /* page-locked memory (known for stack's pooled buffers; 0 elsewhere) */
    PyObject *weakreflist;
} fl_buffer;

/* ---- pool helper ------------------------------------------------------- */

void
fl_py_pool_put(void *pool, void *data)
{
    unsigned todo = fl_pool_put_begin(pool, data);
    if (!(todo & FL_POOL_BLOCKS)) {
        if (todo)
            fl_pool_put_end(pool, data, todo);
        return;
    }
    /* cudaFreeHost synchronises the device: not with the GIL held */
    Py_BEGIN_ALLOW_THREADS
    fl_pool_put_end(pool, data, todo);
    Py_END_ALLOW_THREADS
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

static PyObject *
buffer_get_pinned(fl_buffer *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->pinned);
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
    {"pinned", (getter)buffer_get_pinned, NULL,
     "page-locked memory from a pinned BatchPool (stack's buffers; False where not known)", NULL},
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

/* ---- BatchPool ----------------------------------------------------------- */

/* Python datasets collate into pooled buffers as the native path does, but
 * a batch holds several arrays of different sizes (images, labels, ...) and
 * the sizes are only known once collated.  So a BatchPool is a small table
 * of size classes, each an fl_pool of equally sized buffers.  The table is
 * bounded (max_sizes): sizes seen after it is full are allocated outside the
 * pool, so a dataset whose batch sizes never repeat keeps no idle memory
 * beyond max_sizes x max_idle buffers. */

typedef struct {
    size_t nbytes;
    fl_pool *pool;          /* owned reference; buffers out hold their own */
} batchpool_class;

typedef struct {
    PyObject_HEAD
    int pin_device;           /* >= 0: buffers page-locked for this CUDA device; -1: ordinary memory */
    int max_sizes;            /* size classes at most */
    int max_idle;             /* idle buffers kept per class (fl_pool's max_free) */
    int nclasses;
    batchpool_class *classes; /* max_sizes entries (PyMem).  Every field is
                               * guarded by the GIL; classes are dropped only
                               * in dealloc, so a pool found here stays valid
                               * while the caller holds the BatchPool. */
    unsigned long long pooled; /* stack calls served by a size class */
    unsigned long long fresh;  /* stack calls allocated outside (the table was full) */
} fl_batchpool;

#define FL_BATCHPOOL_MAX_SIZES 64

static PyObject *
batchpool_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"pin_device", "max_sizes", "max_idle", NULL};
    int pin_device = -1, max_sizes = 8, max_idle = 8;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|iii:BatchPool", kwlist, &pin_device, &max_sizes, &max_idle))
        return NULL;
    if (pin_device < -1)
        return PyErr_Format(PyExc_ValueError, "pin_device must be a CUDA device index or -1, got %d", pin_device);
    if (max_sizes < 0 || max_sizes > FL_BATCHPOOL_MAX_SIZES)
        return PyErr_Format(PyExc_ValueError, "max_sizes must be in [0, %d], got %d", FL_BATCHPOOL_MAX_SIZES,
                            max_sizes);
    if (max_idle < 0 || max_idle > 1024)
        return PyErr_Format(PyExc_ValueError, "max_idle must be in [0, 1024], got %d", max_idle);
    /* load the CUDA runtime (dlopen, once) and check the device: later
     * cudaHostAlloc calls need it; RuntimeError says what is missing */
    if (pin_device >= 0 && fl_py_cuda_require(PyType_GetModule(type), pin_device) < 0)
        return NULL;
    fl_batchpool *self = (fl_batchpool *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->classes = PyMem_Calloc((size_t)(max_sizes ? max_sizes : 1), sizeof *self->classes);
    if (!self->classes) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->pin_device = pin_device;
    self->max_sizes = max_sizes;
    self->max_idle = max_idle;
    return (PyObject *)self;
}

static void
batchpool_dealloc(fl_batchpool *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    batchpool_class *cls = self->classes;
    int n = self->nclasses;
    self->classes = NULL;
    self->nclasses = 0;
    if (n > 0) {
        /* The last reference to a class frees its idle buffers, and
         * cudaFreeHost synchronises the device: not with the GIL held.
         * Buffers still out keep their class's pool alive. */
        Py_BEGIN_ALLOW_THREADS
        for (int i = 0; i < n; i++)
            fl_pool_unref(cls[i].pool);
        Py_END_ALLOW_THREADS
    }
    PyMem_Free(cls);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* The pool for buffers of `nbytes`, with a new class for a new size while
 * the table has room.  0 with *out set (borrowed; NULL when the table is
 * full: allocate outside the pool), or -1 with MemoryError.  GIL held. */
static int
batchpool_class_for(fl_batchpool *bp, size_t nbytes, fl_pool **out)
{
    *out = NULL;
    for (int i = 0; i < bp->nclasses; i++) {
        if (bp->classes[i].nbytes == nbytes) {
            *out = bp->classes[i].pool;
            return 0;
        }
    }
    if (bp->nclasses >= bp->max_sizes)
        return 0;
    fl_pool *p = fl_pool_new(nbytes, bp->max_idle);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    if (bp->pin_device >= 0)
        fl_pool_set_pinned(p, bp->pin_device, fl_cuda_pinner());
    bp->classes[bp->nclasses].nbytes = nbytes;
    bp->classes[bp->nclasses].pool = p; /* owned by the table now */
    bp->nclasses++;
    *out = p;
    return 0;
}

int
fl_py_batchpool_for(PyObject *module, PyObject *pool, size_t nbytes, fl_pool **out)
{
    *out = NULL;
    if (!PyObject_TypeCheck(pool, fl_get_state(module)->BatchPoolType)) {
        PyErr_Format(PyExc_TypeError, "pool must be a BatchPool or None, not %.100s", Py_TYPE(pool)->tp_name);
        return -1;
    }
    fl_batchpool *bp = (fl_batchpool *)pool;
    if (batchpool_class_for(bp, nbytes, out) < 0)
        return -1;
    if (*out)
        bp->pooled++;
    else
        bp->fresh++;
    return 0;
}

void
fl_buffer_set_pinned(PyObject *buffer, int pinned)
{
    ((fl_buffer *)buffer)->pinned = pinned;
}

static PyObject *
batchpool_get_pin_device(fl_batchpool *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(self->pin_device);
}

/* The sum of count(pool) over the size classes, as an int (NULL with
 * MemoryError).  GIL held: the classes change only under it. */
static PyObject *
batchpool_sum(fl_batchpool *self, size_t (*count)(fl_pool *))
{
    size_t n = 0;
    for (int i = 0; i < self->nclasses; i++)
        n += count(self->classes[i].pool);
    return PyLong_FromSize_t(n);
}

static PyObject *
batchpool_get_bytes(fl_batchpool *self, void *Py_UNUSED(c))
{
    return batchpool_sum(self, fl_pool_bytes_in_use);
}

static PyObject *
batchpool_get_bytes_out(fl_batchpool *self, void *Py_UNUSED(c))
{
    return batchpool_sum(self, fl_pool_bytes_out);
}

static PyObject *
batchpool_get_pin_error(fl_batchpool *self, void *Py_UNUSED(c))
{
    for (int i = 0; i < self->nclasses; i++) {
        const char *e = fl_pool_pin_error(self->classes[i].pool);
        if (e)
            return PyUnicode_FromString(e);
    }
    Py_RETURN_NONE;
}

/* stats() -> dict: pooled / fresh stack calls, bytes allocated and out, and
 * per size class (nbytes, buffers alive, buffers out), in the order the
 * sizes were first seen. */
static PyObject *
batchpool_stats(fl_batchpool *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *classes = PyList_New(self->nclasses);
    if (!classes)
        return NULL;
    size_t bytes = 0, out = 0;
    for (int i = 0; i < self->nclasses; i++) {
        const batchpool_class *c = &self->classes[i];
        size_t in_use = fl_pool_bytes_in_use(c->pool), bytes_out = fl_pool_bytes_out(c->pool);
        size_t unit = fl_pool_nbytes(c->pool);
        bytes += in_use;
        out += bytes_out;
        PyObject *t = Py_BuildValue("{s:n,s:n,s:n}", "nbytes", (Py_ssize_t)c->nbytes, "buffers",
                                    (Py_ssize_t)(in_use / unit), "buffers_out", (Py_ssize_t)(bytes_out / unit));
        if (!t) {
            Py_DECREF(classes);
            return NULL;
        }
        PyList_SET_ITEM(classes, i, t);
    }
    return Py_BuildValue("{s:K,s:K,s:n,s:n,s:N}", "pooled", self->pooled, "fresh", self->fresh, "bytes",
                         (Py_ssize_t)bytes, "bytes_out", (Py_ssize_t)out, "classes", classes);
}

static PyMethodDef batchpool_methods[] = {
    {"stats", (PyCFunction)batchpool_stats, METH_NOARGS,
     "stats() -> dict(pooled, fresh, bytes, bytes_out, classes=[dict(nbytes, buffers, buffers_out)])"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef batchpool_getset[] = {
    {"pin_device", (getter)batchpool_get_pin_device, NULL, "CUDA device the buffers are page-locked for (-1: none)",
     NULL},
    {"bytes", (getter)batchpool_get_bytes, NULL, "bytes allocated by the pool (idle + out)", NULL},
    {"bytes_out", (getter)batchpool_get_bytes_out, NULL, "bytes of buffers in use (not idle)", NULL},
    {"pin_error", (getter)batchpool_get_pin_error, NULL,
     "why page-locking failed (buffers then use ordinary memory), or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot batchpool_slots[] = {
    {Py_tp_new, batchpool_new},
    {Py_tp_dealloc, batchpool_dealloc},
    {Py_tp_methods, batchpool_methods},
    {Py_tp_getset, batchpool_getset},
    {Py_tp_doc, "BatchPool(pin_device=-1, max_sizes=8, max_idle=8): batch buffers for stack(items, pool=...), "
                "one pool per buffer size (at most max_sizes sizes, max_idle idle buffers each), page-locked "
                "for CUDA device pin_device when >= 0 (RuntimeError when CUDA cannot be loaded for it)."},
    {0, NULL},
};

static PyType_Spec batchpool_spec = {
    .name = "fastloader._C.BatchPool",
    .basicsize = sizeof(fl_batchpool),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = batchpool_slots,
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

/* Map a struct-module format (numpy's buffer format) to DLPack.  Plain C,
 * but its input is the Python buffer protocol's vocabulary, so it stays with
 * the binding that reads Py_buffer. */
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

/* Parse stack(items, pool=None) or batch_buffer(nbytes, pool=None) (`fname`
 * names it in errors).  0 with *items the first argument, borrowed from the call, and
 * *alloc the allocator registered for pool's type (NULL: no pool), or -1
 * with TypeError. */
static int
stack_args(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *fname,
           PyObject **items, PyObject **pool_out, const fl_py_allocator **alloc)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs < 1 || nargs + nkw > 2) {
        PyErr_Format(PyExc_TypeError, "%s takes one positional argument and an optional pool (a BatchPool or a "
                     "ShmRing)", fname);
        return -1;
    }
    if (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "pool") != 0) {
        PyErr_Format(PyExc_TypeError, "%s got an unexpected keyword argument %R", fname, PyTuple_GET_ITEM(kwnames, 0));
        return -1;
    }
    *items = args[0];
    PyObject *pool = nargs + nkw == 2 ? args[1] : Py_None;
    *pool_out = NULL;
    *alloc = NULL;
    if (pool == Py_None)
        return 0;
    fl_module_state *st = fl_get_state(module);
    for (int i = 0; i < st->nallocators; i++) {
        if (PyObject_TypeCheck(pool, st->allocators[i].type)) {
            *pool_out = pool;
            *alloc = st->allocators[i].ops;
            return 0;
        }
    }
    PyErr_Format(PyExc_TypeError, "%s: pool must be a BatchPool, a ShmRing or None, not %.100s", fname,
                 Py_TYPE(pool)->tp_name);
    return -1;
}

int
fl_py_register_allocator(PyObject *module, PyTypeObject *type, const fl_py_allocator *ops)
{
    fl_module_state *st = fl_get_state(module);
    int cap = (int)(sizeof st->allocators / sizeof st->allocators[0]);
    if (st->nallocators >= cap) {
        PyErr_SetString(PyExc_RuntimeError, "too many batch allocators registered (this is a bug)");
        return -1;
    }
    st->allocators[st->nallocators].type = type;
    st->allocators[st->nallocators].ops = ops;
    st->nallocators++;
    return 0;
}

/* BatchPool as an allocator: the pool of the batch's size class (counted as
 * pooled), or nothing when the table is full (counted as fresh). */
static void *
pool_take(void *ctx, int *pinned)
{
    void *data = fl_pool_get(ctx);
    *pinned = data ? fl_pool_is_pinned(data) : 0;
    return data;
}

static int
batchpool_lend(PyObject *owner, size_t nbytes, fl_py_lease *lease)
{
    fl_batchpool *bp = (fl_batchpool *)owner;
    fl_pool *pool;
    memset(lease, 0, sizeof *lease);
    if (nbytes == 0)
        return 0;
    if (batchpool_class_for(bp, nbytes, &pool) < 0)
        return -1;
    if (!pool) {
        bp->fresh++;
        return 0;
    }
    bp->pooled++;
    /* the caller's reference to bp keeps `pool` alive until the Buffer owns
     * the memory; the Buffer then holds the pool itself (fl_py_pool_put) */
    lease->take = pool_take;
    lease->take_ctx = pool;
    lease->free_fn = fl_py_pool_put;
    lease->free_ctx = pool;
    return 0;
}

static const fl_py_allocator batchpool_allocator = {batchpool_lend};

/* The memory of a lease (fl_py_allocator.lend's): lent at once, or taken
 * from the pool now (take: possibly cudaHostAlloc, so call it without the
 * GIL; *pinned set), or, when nothing was lent, a fresh 64-byte-aligned
 * allocation of nbytes (freed with fl_aligned_free).  NULL when out of
 * memory.  Runs without the GIL. */
static void *
lease_take(fl_py_lease *lease, size_t nbytes, int *pinned)
{
    if (lease->data)
        return lease->data;
    if (lease->take)
        return lease->take(lease->take_ctx, pinned);
    return fl_aligned_alloc(nbytes);
}

/* stack(items, pool=None) -> Buffer | None
 * Collates a sequence of equally shaped arrays or CPU tensors of one dtype
 * into a [len(items), *shape] Buffer.  With a BatchPool the Buffer is one of
 * its buffers for that size (page-locked when the pool pins; Buffer.pinned
 * says whether it is), given back to the pool when the last consumer drops
 * it; without one, or when the pool's size table is full, a new allocation.
 * With a ShmRing (a process worker's) the Buffer is the next bytes of the
 * slot it is filling, or a new allocation when the slot is full.
 * The allocation (possibly cudaHostAlloc) and the copy run without the GIL.
 * Returns None when the inputs need torch's own path (mixed dtypes or
 * shapes, non-CPU tensors, tensors requiring grad): the caller then calls
 * torch's collate, which reports size mismatches with torch's own message. */
static PyObject *
fl_stack(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *arg, *owner;
    const fl_py_allocator *alloc;
    if (stack_args(module, args, nargs, kwnames, "stack()", &arg, &owner, &alloc) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(arg, "stack() expects a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    stack_item *items = NULL;
    void *data = NULL;
    fl_py_lease lease = {NULL, NULL, NULL, NULL, NULL}; /* free_fn NULL: data is fl_aligned_alloc's */
    int pinned = 0;
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
    if (items[0].ndim + 1 > FL_MAX_NDIM)
        goto fallback;
    size_t per = (size_t)itemsize0;
    for (int i = 0; i < items[0].ndim; i++)
        per *= (size_t)items[0].shape[i];
    size_t total = per * (size_t)n;
    /* the pool's lease: a BatchPool's buffer, a process worker's slot; with
     * nothing lent, a fresh buffer */
    if (alloc && total > 0 && alloc->lend(owner, total, &lease) < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    data = lease_take(&lease, total, &pinned);
    if (data && per > 0) { /* an empty sample (a 0 in its shape) copies nothing */
        for (Py_ssize_t k = 0; k < n; k++)
            fl_copy_strided((char *)data + per * (size_t)k, items[k].ptr, items[k].ndim, items[k].shape,
                         items[k].strides, (size_t)itemsize0);
    }
    Py_END_ALLOW_THREADS
    if (!data) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t shape[FL_MAX_NDIM];
    shape[0] = n;
    for (int i = 0; i < items[0].ndim; i++)
        shape[i + 1] = items[0].shape[i];
    DLDevice cpu = {kDLCPU, 0};
    result = fl_buffer_new(module, data, total, items[0].ndim + 1, shape, dt0, cpu,
                           lease.free_fn ? lease.free_fn : fl_aligned_free, lease.free_ctx);
    if (result) {
        ((fl_buffer *)result)->pinned = pinned;
        data = NULL; /* owned by the Buffer now */
    }
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    if (data) {
        if (lease.free_fn)
            lease.free_fn(lease.free_ctx, data);
        else
            fl_aligned_free(NULL, data);
    }
    /* entries never described are zeroed, so releasing all n is safe */
    for (Py_ssize_t k = 0; items && k < n; k++)
        release_item(&items[k]);
    PyMem_Free(items);
    Py_DECREF(seq);
    return result;
}

/* batch_buffer(nbytes, pool=None) -> Buffer
 * `nbytes` of batch memory, not initialised, as a 1-D uint8 Buffer: from
 * `pool` as _C.stack takes it (a BatchPool's buffer of that size, given
 * back when the last consumer drops it; the next bytes of a ShmRing's
 * slot), or a fresh allocation when the pool lends nothing.  For
 * collation that writes a batch a sample at a time (collate.RowWriter).
 * GIL held on entry; the allocation (possibly cudaHostAlloc) runs without
 * it.  NULL with ValueError (nbytes < 0), TypeError (pool) or MemoryError. */
static PyObject *
fl_batch_buffer(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *arg, *owner;
    const fl_py_allocator *alloc;
    if (stack_args(module, args, nargs, kwnames, "batch_buffer()", &arg, &owner, &alloc) < 0)
        return NULL;
    Py_ssize_t nbytes = PyLong_AsSsize_t(arg);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    if (nbytes < 0)
        return PyErr_Format(PyExc_ValueError, "batch_buffer(): nbytes must be >= 0, not %zd", nbytes);
    fl_py_lease lease = {NULL, NULL, NULL, NULL, NULL};
    int pinned = 0;
    if (alloc && nbytes > 0 && alloc->lend(owner, (size_t)nbytes, &lease) < 0)
        return NULL;
    void *data;
    Py_BEGIN_ALLOW_THREADS
    data = lease_take(&lease, (size_t)nbytes, &pinned);
    Py_END_ALLOW_THREADS
    if (!data)
        return PyErr_NoMemory();
    int64_t shape[1] = {nbytes};
    DLDataType u8 = {kDLUInt, 8, 1};
    DLDevice cpu = {kDLCPU, 0};
    PyObject *b = fl_buffer_new(module, data, (size_t)nbytes, 1, shape, u8, cpu,
                                lease.free_fn ? lease.free_fn : fl_aligned_free, lease.free_ctx);
    if (!b) {
        if (lease.free_fn)
            lease.free_fn(lease.free_ctx, data);
        else
            fl_aligned_free(NULL, data);
        return NULL;
    }
    ((fl_buffer *)b)->pinned = pinned;
    return b;
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
    {"stack", (PyCFunction)(void (*)(void))fl_stack, METH_FASTCALL | METH_KEYWORDS,
     "stack(items, pool=None) -> Buffer | None: collate equally shaped arrays/CPU tensors, copying without the "
     "GIL, into a buffer of `pool` (a BatchPool) when given, or into the slot a ShmRing is filling."},
    {"empty_buffer", (PyCFunction)fl_empty_buffer, METH_VARARGS, "empty_buffer(nbytes) -> zeroed uint8 Buffer"},
    {"batch_buffer", (PyCFunction)(void (*)(void))fl_batch_buffer, METH_FASTCALL | METH_KEYWORDS,
     "batch_buffer(nbytes, pool=None) -> Buffer: nbytes of batch memory, not initialised, from `pool` (a BatchPool "
     "or a ShmRing) as stack() takes it, or a fresh allocation."},
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
    st->BatchPoolType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &batchpool_spec, NULL);
    if (!st->BatchPoolType)
        return -1;
    if (PyModule_AddType(m, st->BatchPoolType) < 0)
        return -1;
    if (fl_py_register_allocator(m, st->BatchPoolType, &batchpool_allocator) < 0)
        return -1;
    return PyModule_AddFunctions(m, buffer_functions);
}
