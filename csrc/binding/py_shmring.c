/* py_shmring.c: fastloader._C.ShmRing, the Python face of shmring.c (the
 * shared-memory batch slots of process workers; fastloader/_procworkers.py
 * drives it).
 *
 *   ShmRing(nslots, slot_bytes)                 the loader's ring (owner)
 *   ShmRing.attach(fd, nslots, slot_bytes)      a worker's ring (fd is dup'ed)
 *   fd, nslots, slot_bytes, owner, slots_in_use, slots_peak, used
 *   acquire() -> slot | -1      release(slot)          (owner)
 *   adopt(slot, worker) -> bool   reclaim(worker) -> int  (owner: workers' claims)
 *   claim(worker)  begin(slot)   alloc(nbytes) -> offset | -1   slot  (worker: the arena)
 *   claim_of(slot) -> int                               the shared claim table
 *   slot_address(slot) -> int
 *   buffer(slot, offset, nbytes) -> Buffer              a 1-D uint8 view
 *   pin(slot, nbytes, device)   pinned_bytes(slot) -> int
 *
 * _C.stack(items, pool=ring) stacks into the ring's arena (the ring is one of
 * stack's registered allocators, py_buffer.h), so default collation in a worker process
 * writes each sample once, straight into the slot the loader reads.
 *
 * Ownership: the object holds one reference to the core ring; every Buffer
 * it hands out holds another (and, on the owner's side, one reference to
 * its slot), so views outlive the object, the loader and the workers.  The
 * last reference may unregister page-locked memory, which synchronises the
 * device: that happens with the GIL released.  GIL: every method holds it;
 * none waits.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "binding/py_buffer.h"
#include "core/shmring.h"
#include "cuda/cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    fl_shmring *ring; /* owned reference */
} fl_py_shmring;

/* Drop one core reference; the last one frees the ring without the GIL
 * (called with it held). */
static void
ring_unref_gil(fl_shmring *r)
{
    if (fl_shmring_unref(r)) {
        Py_BEGIN_ALLOW_THREADS
        fl_shmring_destroy(r);
        Py_END_ALLOW_THREADS
    }
}

/* A Buffer's free function for memory in a ring (ctx: the core ring): the
 * slot's reference (owner) and the ring's.  GIL held (Buffer dealloc). */
static void
view_free(void *ctx, void *data)
{
    fl_shmring *r = ctx;
    fl_shmring_slot_unref(r, fl_shmring_slot_of(r, data));
    ring_unref_gil(r);
}

/* The ring's errors through the one translator (binding/py_errors.c), so an
 * FL_ERR_IO gets its errno's OSError subclass.  NULL with the exception set. */
static PyObject *
ring_error(PyTypeObject *type, const fl_err *err)
{
    return fl_py_raise(PyType_GetModule(type), err, NULL, NULL);
}

static PyObject *
wrap(PyTypeObject *type, fl_shmring *r)
{
    fl_py_shmring *self = (fl_py_shmring *)type->tp_alloc(type, 0);
    if (!self) {
        ring_unref_gil(r);
        return NULL;
    }
    self->ring = r;
    return (PyObject *)self;
}

static int
parse_sizes(int nslots, long long slot_bytes)
{
    if (nslots < 1 || nslots > FL_SHMRING_MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "nslots must be in 1..%d, got %d", FL_SHMRING_MAX_SLOTS, nslots);
        return -1;
    }
    if (slot_bytes < 1) {
        PyErr_Format(PyExc_ValueError, "slot_bytes must be > 0, got %lld", slot_bytes);
        return -1;
    }
    return 0;
}

static PyObject *
shmring_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"nslots", "slot_bytes", NULL};
    int nslots;
    long long slot_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iL:ShmRing", kwlist, &nslots, &slot_bytes))
        return NULL;
    if (parse_sizes(nslots, slot_bytes) < 0)
        return NULL;
    fl_err err = {0};
    fl_shmring *r = fl_shmring_create(nslots, (size_t)slot_bytes, &err);
    if (!r)
        return ring_error(type, &err);
    return wrap(type, r);
}

/* attach(fd, nslots, slot_bytes): a worker's view of the ring behind fd.
 * The descriptor is duplicated, so the caller still owns (and may close)
 * its own. */
static PyObject *
shmring_attach(PyObject *cls, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"fd", "nslots", "slot_bytes", NULL};
    int fd, nslots;
    long long slot_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiL:attach", kwlist, &fd, &nslots, &slot_bytes))
        return NULL;
    if (parse_sizes(nslots, slot_bytes) < 0)
        return NULL;
    fl_err err = {0};
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) {
        fl_err_set(&err, FL_ERR_IO, errno, "duplicating the shared-memory ring's descriptor %d", fd);
        return ring_error((PyTypeObject *)cls, &err);
    }
    fl_shmring *r = fl_shmring_attach(own, nslots, (size_t)slot_bytes, &err);
    if (!r) {
        close(own);
        return ring_error((PyTypeObject *)cls, &err);
    }
    return wrap((PyTypeObject *)cls, r);
}

static void
shmring_dealloc(fl_py_shmring *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    fl_shmring *r = self->ring;
    self->ring = NULL;
    if (r)
        ring_unref_gil(r);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* An int argument; -1 with an exception set (and *out untouched) on error. */
static int
as_int(PyObject *arg, int *out)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "slot out of range");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int
check_slot(fl_py_shmring *self, int slot)
{
    if (slot < 0 || slot >= fl_shmring_nslots(self->ring)) {
        PyErr_Format(PyExc_IndexError, "slot %d out of range (the ring has %d)", slot,
                     fl_shmring_nslots(self->ring));
        return -1;
    }
    return 0;
}

static PyObject *
shmring_acquire(fl_py_shmring *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(fl_shmring_acquire(self->ring));
}

static PyObject *
shmring_release(fl_py_shmring *self, PyObject *arg)
{
    int slot;
    if (as_int(arg, &slot) < 0)
        return NULL;
    if (check_slot(self, slot) < 0)
        return NULL;
    fl_shmring_slot_unref(self->ring, slot);
    Py_RETURN_NONE;
}

static PyObject *
shmring_begin(fl_py_shmring *self, PyObject *arg)
{
    int slot;
    if (as_int(arg, &slot) < 0)
        return NULL;
    if (check_slot(self, slot) < 0)
        return NULL;
    fl_shmring_arena_begin(self->ring, slot);
    Py_RETURN_NONE;
}

static PyObject *
shmring_claim(fl_py_shmring *self, PyObject *arg)
{
    int worker;
    if (as_int(arg, &worker) < 0)
        return NULL;
    if (worker < 0)
        return PyErr_Format(PyExc_ValueError, "worker must be >= 0, not %d", worker);
    fl_shmring_arena_claim(self->ring, worker);
    Py_RETURN_NONE;
}

static PyObject *
shmring_adopt(fl_py_shmring *self, PyObject *args)
{
    int slot, worker;
    if (!PyArg_ParseTuple(args, "ii:adopt", &slot, &worker))
        return NULL;
    if (check_slot(self, slot) < 0)
        return NULL;
    return PyBool_FromLong(fl_shmring_adopt(self->ring, slot, worker) == 0);
}

static PyObject *
shmring_reclaim(fl_py_shmring *self, PyObject *arg)
{
    int worker;
    if (as_int(arg, &worker) < 0)
        return NULL;
    return PyLong_FromLong(fl_shmring_reclaim(self->ring, worker));
}

static PyObject *
shmring_claim_of(fl_py_shmring *self, PyObject *arg)
{
    int slot;
    if (as_int(arg, &slot) < 0)
        return NULL;
    if (check_slot(self, slot) < 0)
        return NULL;
    return PyLong_FromLong(fl_shmring_claim_of(self->ring, slot));
}

static PyObject *
shmring_alloc(fl_py_shmring *self, PyObject *arg)
{
    Py_ssize_t nbytes = PyLong_AsSsize_t(arg);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    if (nbytes < 0)
        return PyErr_Format(PyExc_ValueError, "nbytes must be >= 0");
    size_t off = 0;
    if (!fl_shmring_arena_alloc(self->ring, (size_t)nbytes, &off))
        return PyLong_FromLong(-1);
    return PyLong_FromSize_t(off);
}

static PyObject *
shmring_slot_address(fl_py_shmring *self, PyObject *arg)
{
    int slot;
    if (as_int(arg, &slot) < 0)
        return NULL;
    if (check_slot(self, slot) < 0)
        return NULL;
    return PyLong_FromVoidPtr(fl_shmring_slot_base(self->ring, slot));
}

/* buffer(slot, offset, nbytes) -> Buffer: bytes [offset, offset + nbytes)
 * of the slot as a 1-D uint8 Buffer (pinned when that range is page-locked).
 * On the owner's side it holds a reference to the slot. */
static PyObject *
shmring_buffer(fl_py_shmring *self, PyObject *args)
{
    int slot;
    Py_ssize_t offset, nbytes;
    if (!PyArg_ParseTuple(args, "inn:buffer", &slot, &offset, &nbytes))
        return NULL;
    if (check_slot(self, slot) < 0)
        return NULL;
    size_t cap = fl_shmring_slot_bytes(self->ring);
    if (offset < 0 || nbytes < 0 || (size_t)offset > cap || (size_t)nbytes > cap - (size_t)offset)
        return PyErr_Format(PyExc_ValueError, "bytes [%zd, %zd) are outside the slot (%zu bytes)", offset,
                            offset + nbytes, cap);
    char *data = fl_shmring_slot_base(self->ring, slot) + offset;
    int64_t shape[1] = {nbytes};
    DLDataType u8 = {kDLUInt, 8, 1};
    DLDevice cpu = {kDLCPU, 0};
    fl_shmring_ref(self->ring);
    fl_shmring_slot_ref(self->ring, slot);
    PyObject *b = fl_buffer_new(PyType_GetModule(Py_TYPE(self)), data, (size_t)nbytes, 1, shape, u8, cpu,
                                view_free, self->ring);
    if (!b) {
        view_free(self->ring, data);
        return NULL;
    }
    size_t pinned = fl_shmring_pinned_bytes(self->ring, slot);
    fl_buffer_set_pinned(b, pinned && (size_t)(offset + nbytes) <= pinned);
    return b;
}

/* pin(slot, nbytes, device): page-lock the slot's first nbytes once
 * (shmring.h).  RuntimeError with CUDA's message when that fails. */
static PyObject *
shmring_pin(fl_py_shmring *self, PyObject *args)
{
    int slot, device;
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "ini:pin", &slot, &nbytes, &device))
        return NULL;
    if (check_slot(self, slot) < 0)
        return NULL;
    if (nbytes < 0 || device < 0)
        return PyErr_Format(PyExc_ValueError, "pin needs nbytes >= 0 and a CUDA device index");
    if (fl_py_cuda_require(PyType_GetModule(Py_TYPE(self)), device) < 0)
        return NULL;
    fl_err err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_shmring_pin(self->ring, slot, (size_t)nbytes, device, fl_cuda_pinner(), &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ring_error(Py_TYPE(self), &err);
    Py_RETURN_NONE;
}

static PyObject *
shmring_pinned_bytes(fl_py_shmring *self, PyObject *arg)
{
    int slot;
    if (as_int(arg, &slot) < 0)
        return NULL;
    if (check_slot(self, slot) < 0)
        return NULL;
    return PyLong_FromSize_t(fl_shmring_pinned_bytes(self->ring, slot));
}

static PyObject *
get_fd(fl_py_shmring *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(fl_shmring_fd(self->ring));
}

static PyObject *
get_nslots(fl_py_shmring *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(fl_shmring_nslots(self->ring));
}

static PyObject *
get_slot_bytes(fl_py_shmring *self, void *Py_UNUSED(c))
{
    return PyLong_FromSize_t(fl_shmring_slot_bytes(self->ring));
}

static PyObject *
get_owner(fl_py_shmring *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(fl_shmring_is_owner(self->ring));
}

static PyObject *
get_in_use(fl_py_shmring *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(fl_shmring_slots_in_use(self->ring));
}

static PyObject *
get_peak(fl_py_shmring *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(fl_shmring_slots_peak(self->ring));
}

static PyObject *
get_slot(fl_py_shmring *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(fl_shmring_arena_slot(self->ring));
}

static PyObject *
get_used(fl_py_shmring *self, void *Py_UNUSED(c))
{
    return PyLong_FromSize_t(fl_shmring_arena_used(self->ring));
}

/* ---- the ring as an allocator of _C.stack (py_buffer.h) -------------------------- */

/* nbytes of the slot the arena is filling, held (the ring and the slot) by
 * the Buffer until view_free; nothing when the slot is full (stack then
 * allocates a fresh buffer). */
static int
ring_lend(PyObject *owner, size_t nbytes, fl_py_lease *lease)
{
    memset(lease, 0, sizeof *lease);
    fl_shmring *r = ((fl_py_shmring *)owner)->ring;
    void *p = fl_shmring_arena_alloc(r, nbytes, NULL);
    if (p) {
        fl_shmring_ref(r);
        fl_shmring_slot_ref(r, fl_shmring_slot_of(r, p));
        lease->data = p;
        lease->free_fn = view_free;
        lease->free_ctx = r;
    }
    return 0;
}

static const fl_py_allocator ring_allocator = {ring_lend};

static PyMethodDef shmring_methods[] = {
    {"attach", (PyCFunction)(void (*)(void))shmring_attach, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "attach(fd, nslots, slot_bytes) -> ShmRing: map the ring behind fd (duplicated) in this process."},
    {"acquire", (PyCFunction)shmring_acquire, METH_NOARGS, "acquire() -> a free slot (now referenced), or -1"},
    {"release", (PyCFunction)shmring_release, METH_O, "release(slot): drop the job's reference to the slot"},
    {"begin", (PyCFunction)shmring_begin, METH_O, "begin(slot): lay the next batch out in this slot"},
    {"claim", (PyCFunction)shmring_claim, METH_O,
     "claim(worker): lay the next batch out in the lowest free slot, taken for `worker` at the first alloc"},
    {"adopt", (PyCFunction)shmring_adopt, METH_VARARGS,
     "adopt(slot, worker) -> True when worker held the slot (it is now the owner's, referenced once)"},
    {"reclaim", (PyCFunction)shmring_reclaim, METH_O,
     "reclaim(worker) -> how many slots the worker held and the owner never adopted were freed"},
    {"claim_of", (PyCFunction)shmring_claim_of, METH_O,
     "claim_of(slot) -> 0 free, -1 the owner's, w + 1 worker w's"},
    {"alloc", (PyCFunction)shmring_alloc, METH_O,
     "alloc(nbytes) -> offset in the current slot (64-byte aligned), or -1 when it does not fit"},
    {"slot_address", (PyCFunction)shmring_slot_address, METH_O, "slot_address(slot) -> address in this process"},
    {"buffer", (PyCFunction)shmring_buffer, METH_VARARGS,
     "buffer(slot, offset, nbytes) -> Buffer: a 1-D uint8 view of the slot's bytes (holds the slot)"},
    {"pin", (PyCFunction)shmring_pin, METH_VARARGS,
     "pin(slot, nbytes, device): page-lock the slot's first nbytes for CUDA device `device`, once"},
    {"pinned_bytes", (PyCFunction)shmring_pinned_bytes, METH_O, "pinned_bytes(slot) -> bytes page-locked"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef shmring_getset[] = {
    {"fd", (getter)get_fd, NULL, "the shared file's descriptor in this process", NULL},
    {"nslots", (getter)get_nslots, NULL, "number of slots", NULL},
    {"slot_bytes", (getter)get_slot_bytes, NULL, "bytes reserved per slot (address space, not memory)", NULL},
    {"owner", (getter)get_owner, NULL, "True for the loader's ring (it counts slot references)", NULL},
    {"slots_in_use", (getter)get_in_use, NULL, "slots referenced by a job or a view (owner)", NULL},
    {"slots_peak", (getter)get_peak, NULL, "the most slots ever in use at once (owner)", NULL},
    {"used", (getter)get_used, NULL, "bytes of the current slot laid out so far (arena)", NULL},
    {"slot", (getter)get_slot, NULL, "the slot the current batch is laid out in, or -1 (arena)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot shmring_slots[] = {
    {Py_tp_new, shmring_new},
    {Py_tp_dealloc, shmring_dealloc},
    {Py_tp_methods, shmring_methods},
    {Py_tp_getset, shmring_getset},
    {Py_tp_doc, "ShmRing(nslots, slot_bytes): shared-memory batch slots of process workers (an anonymous "
                "shared file, sparse, mapped in the loader and its workers)."},
    {0, NULL},
};

static PyType_Spec shmring_spec = {
    .name = "fastloader._C.ShmRing",
    .basicsize = sizeof(fl_py_shmring),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = shmring_slots,
};

int
fl_register_shmring(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    st->ShmRingType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &shmring_spec, NULL);
    if (!st->ShmRingType)
        return -1;
    if (PyModule_AddType(m, st->ShmRingType) < 0)
        return -1;
    return fl_py_register_allocator(m, st->ShmRingType, &ring_allocator);
}
